"""examples/01-03 and 05 run with --quick and still print what they claim (example 04: tests/test_example_04.py).

Each runs in a subprocess with cwd and --out in a temporary folder, so nothing is written into the
repository (checked: the example's default output folder is untouched); example 05 runs as a copy in a
temporary examples/ folder without --out, from another cwd: its default output folder is beside the file. The tests parse the printed
lines, not whole strings, and check the numbers in them: agreement within the tolerance the example
asserts, orderings only where they hold by a wide margin at quick sizes, fractions in [0, 1].
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TOLERANCE = 1e-4  # the examples' own `assert diff < 1e-4`: float32 rounding between frameworks and loops
NUMBER = r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)"


def snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.is_dir() else {}


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def assert_ran_compiled(done: subprocess.CompletedProcess, script: str) -> None:
    """The examples teach compiled calls: one that warns it ran eagerly (example 05's evaluation did) contradicts
    its own lesson, in front of every reader."""
    assert "EagerCallWarning" not in done.stderr, f"{script} called a model eagerly twice:\n{done.stderr[-3000:]}"


def run_example(script: str, tmp_path: Path) -> str:
    """Run examples/`script` --quick --out tmp_path/out from tmp_path; return its stdout."""
    default_out = EXAMPLES / "out" / Path(script).stem  # where a run without --out writes
    before = snapshot(default_out)
    done = subprocess.run([sys.executable, str(EXAMPLES / script), "--quick", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_ran_compiled(done, script)
    assert snapshot(default_out) == before, f"{script} --out wrote into {default_out}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the example wrote outside --out"
    return done.stdout


def run_copy_without_out(script: str, tmp_path: Path) -> tuple[str, Path]:
    """Run a copy of examples/`script`, as tmp_path/examples/`script`, with --quick and no --out from another folder
    (tmp_path/elsewhere); return its stdout and the output folder beside the copy it wrote (checked: it wrote
    nowhere else)."""
    copy = tmp_path / "examples" / script
    copy.parent.mkdir()
    copy.write_bytes((EXAMPLES / script).read_bytes())
    (tmp_path / "elsewhere").mkdir()
    done = subprocess.run([sys.executable, str(copy), "--quick"], cwd=tmp_path / "elsewhere", env=environment(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_ran_compiled(done, script)
    out = tmp_path / "examples" / "out" / copy.stem
    assert not any((tmp_path / "elsewhere").iterdir()), "the example wrote into its cwd"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "examples"]
    assert sorted(p.name for p in copy.parent.iterdir()) == [script, "out"]
    assert sorted(p.name for p in out.parent.iterdir()) == [copy.stem]
    return done.stdout, out


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("0*.py")))
def test_the_default_out_is_beside_the_example_not_in_the_cwd(script, tmp_path):
    """--help (which exits before any work) of a copy of the example run from another folder names, as --out's
    default, the out/ folder beside the copy: where a run without --out writes (test_05 runs one)."""
    copy = tmp_path / "examples" / script
    copy.parent.mkdir()
    copy.write_bytes((EXAMPLES / script).read_bytes())
    (tmp_path / "elsewhere").mkdir()
    env = {**environment(), "COLUMNS": "1000"}  # argparse wraps the help at the terminal's width, paths included
    done = subprocess.run([sys.executable, str(copy), "--help"], cwd=tmp_path / "elsewhere", env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    default = one(r"^\s+--out OUT\s+.*\(default: (.+), beside this file\)$", done.stdout)[1]
    assert Path(default) == (tmp_path / "examples" / "out" / copy.stem).resolve(), done.stdout
    assert not any((tmp_path / "elsewhere").iterdir())


def matches(pattern: str, text: str) -> list[re.Match]:
    return list(re.finditer(pattern, text, flags=re.MULTILINE))


def one(pattern: str, text: str) -> re.Match:
    found = matches(pattern, text)
    assert len(found) == 1, f"expected one line matching {pattern!r}, got {len(found)} in:\n{text}"
    return found[0]


def test_01_every_loop_gives_the_same_positions_and_lax_scan_beats_the_seed_loop(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = run_example("01_scan_vs_loop.py", tmp_path)

    assert one(r"^the seed answer's @torch\.jit\.script_method on an nn\.Module", out)
    assert one(r"^public torch\.scan exists: (True|False); prototype available: (True|False)$", out)
    # Agreement: every method's positions against the seed loop's, same weights and inputs.
    diffs = {m[1].strip(): float(m[2]) for m in matches(rf"^(.+?)\s+max \|positions - seed loop\| = ({NUMBER})$", out)}
    assert len(diffs) == 5, diffs
    assert diffs["torch: seed loop"] == 0.0
    assert all(0.0 <= d < TOLERANCE for d in diffs.values()), diffs

    # Timing table: one row per method, the same methods, positive times.
    assert one(r"^B=1, T=50, H=64, 2 layers, torch threads \d+:$", out)
    rows = {m[1]: (float(m[2]), float(m[3]), float(m[4]))
            for m in matches(rf"^\| ([^|]+?) \| ({NUMBER}) \| ({NUMBER}) \| ({NUMBER})x \|$", out)}
    assert set(rows) == set(diffs), (rows, diffs)
    assert all(first >= 0 and per_step > 0 and speedup > 0 for first, per_step, speedup in rows.values()), rows
    scan = next(name for name in rows if name.startswith("jax: lax.scan"))
    # The example's headline: lax.scan is faster per step than the seed loop. At T=50 it measured ~20x
    # (10 vs 230 us per step, medians of 3 calls) on a loaded 2-core machine, a margin no scheduling hiccup
    # closes; the other methods' order varies with load and is not asserted.
    assert rows[scan][1] < rows["torch: seed loop"][1], rows
    assert rows["torch: seed loop"][2] == 1.0

    files = tmp_path / "out"
    assert one(r"^Outputs in (.+)$", out)[1] == str(files.resolve())
    assert "| jax: lax.scan" in (files / "times.md").read_text()
    assert (files / "times.png").stat().st_size > 1000


def test_02_prints_the_utility_table_and_the_torch_and_live_positions_agree(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = run_example("02_train_traveller.py", tmp_path)

    reference = {m[1]: float(m[2]) for m in matches(rf"^  (optimal|markowitz|no_trade)\s+({NUMBER})$", out)}
    assert set(reference) == {"optimal", "markowitz", "no_trade"}, out
    # The known optimum beats the reference policies on the held-out paths (fixed seeds: 0.21 vs -1.05 and 0).
    assert reference["no_trade"] == 0.0
    assert reference["optimal"] > max(reference["markowitz"], reference["no_trade"]), reference

    progress = [int(m[1]) for m in matches(rf"^step\s+(\d+)\s+training utility per step ({NUMBER})$", out)]
    assert progress == [20, 40, 60], out
    learned = one(rf"^learned policy: ({NUMBER}) per step = ({NUMBER})% of the optimum$", out)
    utility, share = float(learned[1]), float(learned[2])
    assert share == pytest.approx(100 * utility / reference["optimal"], abs=0.2)  # both printed rounded
    # Even 60 updates learn to trade profitably (measured: ~94 % of the optimum); the share itself is
    # only quoted from the default run, which the quick run says.
    assert utility > reference["no_trade"], utility
    assert one(r"^quick run: 60 updates", out)

    torch_gap = one(rf"^PyTorch seed loop vs JAX scan, same weights, 4 paths x (\d+) steps: max \|diff\| = ({NUMBER})$",
                    out)
    assert int(torch_gap[1]) == 100 and 0.0 <= float(torch_gap[2]) < TOLERANCE
    live_gap = one(rf"^10 live steps from the saved state vs one call over all (\d+) steps: max \|diff\| = ({NUMBER})$",
                   out)
    assert int(live_gap[1]) == 100 and 0.0 <= float(live_gap[2]) < TOLERANCE

    assert one(r"^plots written to (.+)$", out)[1] == str(tmp_path / "out")
    for name in ("training_curve.png", "positions.png"):
        assert (tmp_path / "out" / name).stat().st_size > 1000, name


# ~30 s of CPU, almost all of it XLA compiling two VAE train steps (~10 s each) and their evaluations:
# 45-60 s of wall time on a loaded 2-core machine, over the default run's per-test budget.
@pytest.mark.slow
def test_03_prints_the_report_with_fractions_in_0_1(tmp_path):
    pytest.importorskip("rdkit")
    pytest.importorskip("matplotlib")
    out = run_example("03_smiles_vae.py", tmp_path)

    molecules = int(one(r"^(\d+) training molecules, vocabulary of \d+ characters$", out)[1])
    assert 0 < molecules <= 600
    labels = ["TF token acc", "free-run token acc", "free-run sequence acc", "prior validity (T=1)",
              "prior validity (greedy)", "prior uniqueness", "prior novelty"]
    table = {m[1].strip(): (float(m[2]), float(m[3])) for m in matches(rf"^(.+?)\s+({NUMBER})\s+({NUMBER})$", out)}
    assert list(table) == labels, out
    for column in (0, 1):  # teacher forcing, scheduled sampling
        for label in labels:
            value = table[label][column]
            if math.isnan(value):  # uniqueness and novelty are undefined with no valid sample
                assert label in ("prior uniqueness", "prior novelty") and table["prior validity (T=1)"][column] == 0
            else:
                assert 0.0 <= value <= 1.0, (label, column, value)
    assert one(r"^quick run: 12 steps on 600 molecules", out)

    # The printed table is results.json's numbers.
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results) == {"teacher", "scheduled"}
    for decoding, column in (("teacher", 0), ("scheduled", 1)):
        assert table["TF token acc"][column] == pytest.approx(results[decoding]["reconstruction"]["tf_token_acc"],
                                                              abs=5e-4)
        assert table["prior validity (T=1)"][column] == pytest.approx(results[decoding]["samples"]["validity"],
                                                                      abs=5e-4)
    assert one(r"^results written to (.+)$", out)[1] == str(tmp_path / "out")
    assert (tmp_path / "out" / "recon_curves.png").stat().st_size > 1000
    # The curves have several points at --quick too (a row every 3 of its 12 steps): metrics.jsonl holds them.
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for decoding in ("teacher", "scheduled"):
        curve = [r for r in rows if r["decoding"] == decoding and r["split"] == "train"]
        assert [r["step"] for r in curve] == [3, 6, 9, 12], rows
        assert all(math.isfinite(r["metrics"]["recon"]) and r["metrics"]["recon"] > 0 for r in curve), curve


def test_05_own_feedback_model_matches_torch_is_faster_and_each_rule_wins_at_what_it_trains_for(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out, files = run_copy_without_out("05_own_feedback_model.py", tmp_path)

    parity = one(rf"^max \|JAX forecast - torch loop\| = ({NUMBER}) over 200 steps$", out)
    assert 0.0 <= float(parity[1]) < TOLERANCE

    times = {m[1]: (float(m[2]), float(m[3])) for m in matches(rf"^\| (torch loop|jsr\.feedback_scan, jitted) \| "
                                                              rf"({NUMBER}) \| ({NUMBER})x \|$", out)}
    assert set(times) == {"torch loop", "jsr.feedback_scan, jitted"}, out
    # Timed as example 01 times torch: on 1 thread (its default of 2 made the loop 20-150x slower per step on a
    # loaded 2-core machine, the threads waiting for each other, and the printed speed-up that much too large).
    assert one(r"^B=16, T=200, H=32, torch threads (\d+) ", out)[1] == "1"
    assert times["torch loop"][1] == 1.0
    # Measured ~21x (3.4 vs 72 us per step, B=16, T=200) on a loaded 2-core machine: a margin no scheduling
    # hiccup closes; the ratio itself is not asserted.
    assert times["jsr.feedback_scan, jitted"][0] < times["torch loop"][0], times

    rmse = {m[1]: (float(m[2]), float(m[3]))
            for m in matches(rf"^\| (teacher forcing|free running) \| ({NUMBER}) \| ({NUMBER}) \|$", out)}
    assert set(rmse) == {"teacher forcing", "free running"}, out
    assert all(0.0 < v < 1.0 for pair in rmse.values() for v in pair), rmse  # y's std is ~0.72
    # The example's claim, from fixed seeds (measured at --quick: one step 0.180 vs 0.243, rollout 0.331 vs 0.302;
    # with 3 other seeds for the weights and batches the same order, the rollout by 6-12%).
    assert rmse["teacher forcing"][0] < rmse["free running"][0], rmse
    assert rmse["free running"][1] < rmse["teacher forcing"][1], rmse
    assert one(r"^quick run: 150 updates", out)
    back = one(rf"^trained weights back in torch: max \|torch rollout - JAX rollout\| = ({NUMBER}) over 100 steps$", out)
    assert 0.0 <= float(back[1]) < TOLERANCE

    assert one(r"^Outputs in (.+)$", out)[1] == str(files.resolve())
    assert (files / "forecasts.png").stat().st_size > 1000
