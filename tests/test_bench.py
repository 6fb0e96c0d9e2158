"""The benchmark suite (`jax_scan_rnn.bench`): a tiny smoke run writes consistent results.

No timing is asserted (timings depend on the machine and its load); what is checked is the shape of
the results: every method has one row per cell, measured rows carry consistent figures, skipped rows
say why, ratios are computed against the right rows, and the JSON, Markdown and PNG files exist.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jax_scan_rnn as jsr
from jax_scan_rnn import bench

# Tiny sizes: one run serves the whole module, ~15-40 s on 2 CPU cores (mostly XLA compiles).
TINY = dict(
    seq_lens=(6, 12),
    batch_sizes=(1,),
    sweep_seq_lens=(3,),
    vae_batch_sizes=(2,),
    vae_seq_lens=(4,),
    vae_hidden=16,
    vae_latent=4,
    methods=("torch-loop", "torch-cell", "torch-cuda-graph", "torch-lstm-seq", "jax-scan-u1", "jax-scan-u4",
             "jax-eager", "jax-jit-loop", "vae-ss-jax", "vae-greedy-jax"),
    train_methods=("torch-loop", "jax-scan-u1", bench.AUTO_KEY, *bench.LIMIT_KEYS),
    repeats=2,
    min_repeats=1,
    case_budget_s=0.01,
    min_sample_s=0.001,
    probe_t=2,
    torch_threads=1,  # no thread calibration
    budget_s=600.0,  # the quick preset's 75 s is for its own sizes: on a loaded machine no tiny cell may be skipped
    label="tiny",
)
ROOT = Path(__file__).resolve().parents[1]
AGREE_TOL = 1e-4  # float32 positions after <= 12 feedback steps: every method agrees to ~1e-7


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = bench.BenchConfig.quick(**TINY)
    messages: list[str] = []
    results = bench.run_suite(cfg, progress=messages.append)
    out = tmp_path_factory.mktemp("bench")
    paths = bench.write_results(results, out)
    return cfg, results, paths, messages


def test_files_are_written(tiny):
    _, results, paths, _ = tiny
    stem = bench.results_stem(results)
    assert stem == f"{bench.host_kind()}-tiny"
    assert set(paths) == {"json", "md", "png_forward", "png_train", "png_compile"}
    for kind, path in paths.items():
        assert path.exists() and path.stat().st_size > 0, kind
        assert path.name.startswith(stem)
        if kind.startswith("png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", kind
    loaded = json.loads(paths["json"].read_text())
    assert loaded["schema"] == bench.SCHEMA_VERSION
    assert loaded["host"]["host_kind"] == bench.host_kind()
    assert loaded["host"]["xla_small_loop_setting"] == jsr.xla_flags.status()  # it changes batch-1 times
    assert len(loaded["rows"]) == len(results["rows"])


def test_the_results_file_is_strict_json(tiny, tmp_path):
    # A time that is not a number (a NaN from a failed measurement) is null, as other JSON readers need: json.dumps
    # would write NaN, which only Python reads back. NumPy scalars are numbers.
    _, results, _, _ = tiny
    rows = [dict(row) for row in results["rows"]]
    rows[0]["per_step_us"], rows[1]["per_step_us"] = float("nan"), np.float32(2.5)
    paths = bench.write_results({**results, "rows": rows}, tmp_path, plots=False)

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    loaded = json.loads(paths["json"].read_text(), parse_constant=refuse)
    assert loaded["rows"][0]["per_step_us"] is None and loaded["rows"][1]["per_step_us"] == 2.5


def test_one_row_per_method_and_cell(tiny):
    cfg, results, _, _ = tiny
    rows = results["rows"]
    cells: dict[tuple, list[str]] = {}
    for r in rows:
        cells.setdefault((r["model"], r["section"], r["mode"], r["B"], r["T"]), []).append(r["method"])
    grid = {(m, b, t) for m in cfg.modes for b in cfg.batch_sizes for t in cfg.seq_lens}
    assert {(m, b, t) for model, s, m, b, t in cells if s == "grid" and model == "traveller"} == grid
    assert {(m, b, t) for model, s, m, b, t in cells if s == "sweep"} == {("forward", cfg.sweep_batch, 3)}
    vae = {(model, m, b, t) for model, s, m, b, t in cells if model != "traveller"}
    assert vae == {(model, m, 2, 4) for model in ("vae-ss", "vae-greedy") for m in cfg.modes}
    for key, methods in cells.items():
        assert len(methods) == len(set(methods)), key
        if key[0] == "traveller" and key[1] == "grid":
            assert bench.SEED_KEY in methods and set(bench.LIMIT_KEYS) <= set(methods), key
        else:
            assert bench.SEEDS[key[0]] in methods, key
    # the suite was asked for these methods (plus the seeds, the limits and the auto row, which always run)
    asked = set(TINY["methods"]) | set(bench.SEEDS.values()) | set(bench.LIMIT_KEYS) | {bench.AUTO_KEY}
    measured = {r["method"] for r in rows}
    assert measured <= asked and bench.AUTO_KEY in measured
    assert set(results["methods"]) >= measured


def test_measured_rows_are_consistent(tiny):
    cfg, results, _, _ = tiny
    ok = [r for r in results["rows"] if r["status"] == "ok"]
    assert ok
    for r in ok:
        assert r["per_step_us"] > 0 and math.isfinite(r["per_step_us"])
        assert r["per_step_us"] == pytest.approx(r["call_s"] / r["T"] * 1e6)
        assert r["call_s_min"] <= r["call_s"]
        assert cfg.min_repeats <= len(r["samples"]) <= cfg.repeats
        assert r["first_call_s"] is not None and r["first_call_s"] > 0
        assert r["reason"] is None or r["role"] == "derived"
        if r["method"].startswith(("jax-scan", "vae-ss-jax", "limit-xla")):  # compiled ahead of time
            assert r["compile_rounds_s"] == [r["compile_s"]] and r["compile_s"] > 0
    not_ok = [r for r in results["rows"] if r["status"] != "ok"]
    for r in not_ok:
        assert r["status"] in ("skipped", "n/a", "error")
        assert r["reason"], r
        assert r["per_step_us"] is None
    assert not [r for r in results["rows"] if r["status"] == "error"], "a method failed on tiny sizes"


def test_compile_rounds_time_each_compiled_case_again_and_keep_the_median():
    # The peers preset's rule (its compile_rounds, here 3), on stand-in cases: the build's compile, then the rounds.
    from jax_scan_rnn.bench.context import Case
    from jax_scan_rnn.bench.engine import _Engine

    again = iter([0.5, 0.2, 0.9, 0.4])
    rows = [{"compile_s": 0.3}, {"compile_s": 0.1}, {"compile_s": None}, {"compile_s": None}]
    cases = [Case(call=lambda: None, compile_again=lambda: next(again)) for _ in range(2)]
    cases += [Case(call=lambda: None), Case(call=lambda: None)]  # a torch row; a row that failed to compile
    _Engine(bench.BenchConfig.peers(compile_rounds=3), ctx=None, progress=None).compile_rounds(list(zip(rows, cases)))
    assert rows[0]["compile_rounds_s"] == [0.3, 0.5, 0.9] and rows[0]["compile_s"] == 0.5  # rounds interleaved
    assert rows[1]["compile_rounds_s"] == [0.1, 0.2, 0.4] and rows[1]["compile_s"] == 0.2
    assert "compile_rounds_s" not in rows[2] and rows[2]["compile_s"] is None


def test_a_jsr_train_row_is_the_update_fit_takes():
    """A jsr train row runs `TrainStep` (what `fit` runs) at the rows' Adam: after three calls its carry holds
    the parameters of three of TrainStep's own updates, bit for bit; the shared model is left as it was; and
    its compilation can be timed again after its carry was donated (the peers preset's compile rounds)."""
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from jax_scan_rnn.bench.jax_methods import LEARNING_RATE, library_case
    from jax_scan_rnn.train import TrainStep

    ctx = SimpleNamespace(on_gpu=False, cfg=SimpleNamespace(memory_fraction=0.5))
    model = jsr.Traveller(3, 8, 1, rngs=nnx.Rngs(0))
    before = [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 3)), jnp.float32)

    def loss(m, x):
        return (m(x)[0] ** 2).mean()

    case = library_case(ctx, "train", loss, model, x)
    for _ in range(3):
        carry = case.call()
    step = TrainStep(model, lambda m, batch: (loss(m, *batch), {}), optax.adam(LEARNING_RATE), (x,))
    expected = step.init()
    for _ in range(3):
        expected = step(expected, (x,))
    assert int(carry["window"]["count"]) == 3
    for ours, theirs in zip(carry["state"], expected["state"]):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    for ours, untouched in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), before):
        np.testing.assert_array_equal(np.asarray(ours), untouched)
    assert case.compile_again() > 0


# The same model compiled with the library's options (LLVM -O1, 512-bit vectors) against its eager call: float32
# rounding in the last bits only, over a few steps of tanh-bounded positions.
COMPILED_VS_EAGER_ATOL = 1e-6


def test_a_jsr_forward_row_passes_its_parameters_as_jsr_jit_does(monkeypatch):
    """A jsr forward row calls its compiled program with the parameters as a flat list of arrays, as `jsr.jit`
    does (an `nnx.State` argument is flattened in Python at every call: ~20 us on this CPU, which at T=10 was
    the whole gap to torchax's row), and computes the model's own output."""
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jax_scan_rnn.bench import jax_methods

    given = []
    compiled_case = jax_methods.compiled_case
    monkeypatch.setattr(jax_methods, "compiled_case", lambda ctx, mode, fn, params, *args, **kw: (
        given.append(params), compiled_case(ctx, mode, fn, params, *args, **kw))[1])
    ctx = SimpleNamespace(on_gpu=False, cfg=SimpleNamespace(memory_fraction=0.5))
    model = jsr.Traveller(3, 8, 1, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 3)), jnp.float32)
    case = jax_methods.library_case(ctx, "forward", lambda m, x: m(x)[0], model, x)
    assert type(given[0]) is list and all(isinstance(p, jax.Array) for p in given[0])
    np.testing.assert_allclose(case.output(case.call()), np.asarray(model(x)[0]), rtol=0,
                               atol=COMPILED_VS_EAGER_ATOL)


def test_ratios_are_against_seed_and_limit_of_the_same_cell(tiny):
    _, results, _, _ = tiny
    for r in results["rows"]:
        if r["status"] != "ok" or r["section"] != "grid":
            continue
        cell = [x for x in results["rows"] if (x["model"], x["section"], x["mode"], x["B"], x["T"]) ==
                (r["model"], r["section"], r["mode"], r["B"], r["T"]) and x["status"] == "ok"]
        seed = next(x for x in cell if x["method"] == bench.SEEDS[r["model"]])
        assert r["speedup_vs_seed"] == pytest.approx(seed["call_s"] / r["call_s"])
        if r["method"] == seed["method"]:
            assert r["speedup_vs_seed"] == pytest.approx(1.0)
        if r["model"] != "traveller":
            assert r["x_limit"] is None  # no limit row for the VAE
            continue
        limit = min((x for x in cell if x["method"] in bench.LIMIT_KEYS), key=lambda x: x["call_s"])
        assert r["x_limit"] == pytest.approx(r["call_s"] / limit["call_s"])
        if r is limit:
            assert r["x_limit"] == pytest.approx(1.0)


def test_auto_row_runs_the_library_choice(tiny):
    _, results, _, _ = tiny
    auto = [r for r in results["rows"] if r["method"] == bench.AUTO_KEY and r["section"] == "grid"]
    assert auto and all(r["status"] == "ok" for r in auto)
    from jax_scan_rnn.scan import auto_unroll

    for r in auto:  # the train step is differentiated, the forward pass is not
        assert r["unroll"] == f"auto ({auto_unroll(r['B'], differentiated=r['mode'] == 'train')})", r


def test_every_method_agrees_with_the_seed_loop(tiny):
    _, results, _, _ = tiny
    checked = [r for r in results["rows"] if r.get("max_abs_diff") and r["max_abs_diff"]["value"] is not None]
    assert {r["method"] for r in checked} >= {"torch-cell", "jax-scan-u1", "jax-scan-u4", "jax-eager", "vae-ss-jax",
                                              "vae-greedy-jax"}
    for r in checked:
        if r["max_abs_diff"].get("metric") == "tokens differing":
            assert r["max_abs_diff"]["value"] == 0.0, r  # greedy generation: the same tokens
        else:
            assert r["max_abs_diff"]["value"] < AGREE_TOL, r


def test_skips_say_why(tiny):
    _, results, _, _ = tiny
    rows = results["rows"]
    graph = [r for r in rows if r["method"] == "torch-cuda-graph"]
    if not results["host"]["torch_device"].startswith("cuda"):
        assert graph and all(r["status"] == "n/a" and "GPU" in r["reason"] for r in graph)
    jit_loop = [r for r in rows if r["method"] == "jax-jit-loop"]
    assert all(r["status"] == "n/a" and "short T" in r["reason"] for r in jit_loop if r["section"] == "grid")
    assert any(r["status"] == "ok" for r in jit_loop if r["section"] == "sweep")
    vae_train = [r for r in rows if r["mode"] == "train" and r["model"] != "traveller"]
    assert vae_train and all(r["status"] == "n/a" for r in vae_train)
    remat = [r for r in rows if r["method"] == "jax-scan-remat"]
    assert not remat  # not asked for


def test_markdown_names_rows_ratios_and_plots(tiny):
    _, results, paths, _ = tiny
    md = paths["md"].read_text()
    assert md.startswith(f"# Scan vs loop: `{bench.host_kind()}`")
    assert "**Headline, forward, B=1" not in md  # no T=1000 in the tiny run
    for name in ("png_forward", "png_train", "png_compile"):
        assert f"]({paths[name].name})" in md
    for key in results["methods"]:
        assert results["methods"][key]["label"] in md
    assert "| method | T=6 | vs seed | vs limit | T=12 | vs seed | vs limit |" in md
    assert "## VAE decoder" in md and "tokens differ" in md
    assert "GPU only" in md or results["host"]["torch_device"].startswith("cuda")


def test_headline_and_criteria_handle_missing_cells(tiny):
    _, results, _, _ = tiny
    h = bench.headline(results, 1, 1000, "forward")
    assert h["scan_us"] is None and h["seed_us"] is None
    h = bench.headline(results, 1, 12, "forward")
    assert h["scan_us"] > 0 and h["scan_speedup_vs_seed"] > 0 and h["scan_x_limit"] > 0
    for c in bench.criteria(results):
        assert c["value"] is None and c["met"] is None


def test_progress_is_reported_not_printed(tiny, capsys):
    _, _, _, messages = tiny
    assert messages and all(isinstance(m, str) for m in messages)
    assert capsys.readouterr().out == ""


def test_cli_hook_runs_and_prints(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path), "--seq-lens", "4", "--batch-sizes", "1", "--sweep-seq-lens",
                              "3", "--methods", "jax-scan-u1", "--modes", "forward", "--repeats", "1",
                              "--no-plots", "--label", "cli"])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert "B=1     T=4" in out and "lax.scan" in out
    # wall_s times the cases only: the last line said "wall time 1 s" of a command that ran 13 s
    assert re.search(r"\nmeasured in \d+ s; wrote ", out) and "wall time" not in out
    stem = f"{bench.host_kind()}-cli"
    assert (tmp_path / f"{stem}.json").exists() and (tmp_path / f"{stem}.md").exists()
    assert not list(tmp_path.glob("*.png"))
    # The same command again: refused before the suite runs, the first run's files untouched; --replace writes.
    first = (tmp_path / f"{stem}.json").read_bytes()
    with pytest.raises(ValueError, match=rf"^--out {tmp_path}: already holds {stem}.json from an earlier run; pass "
                                         "--replace to write over it, or another --out or --label$"):
        bench.run(args)
    assert (tmp_path / f"{stem}.json").read_bytes() == first and "lax.scan" not in capsys.readouterr().out
    with pytest.raises(FileExistsError, match=f"already holds {stem}.json"):
        bench.write_results(json.loads(first), tmp_path, plots=False)
    (tmp_path / f"{stem}.json").write_text("{}")  # so that the replacement shows
    args.replace = True
    assert bench.run(args) == 0
    assert json.loads((tmp_path / f"{stem}.json").read_text())["schema"] == bench.SCHEMA_VERSION


def test_cli_refuses_an_out_it_cannot_hold_before_the_suite_runs(tmp_path, capsys):
    """An --out that cannot be written, or that another bench (another process) is writing to, is refused in
    one line naming --out before any case is measured; the holder's files are left alone."""
    import subprocess
    import sys

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = parser.parse_args(["--out", str(blocker / "sub"), "--quick", "--no-plots"])
    with pytest.raises(ValueError, match=r"^--out: .*a-file/sub: cannot write the run directory \("):
        bench.run(args)
    assert "lax.scan" not in capsys.readouterr().out

    out = tmp_path / "held"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom jax_scan_rnn.lock import run_lock\n"
         f"with run_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        args = parser.parse_args(["--out", str(out), "--quick", "--no-plots"])
        with pytest.raises(ValueError, match=rf"^--out: .*: another run \(PID {holder.pid}\) is writing to this directory"):
            bench.run(args)
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()


def test_config_from_args_presets_and_errors():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    quick = bench.config_from_args(parser.parse_args(["--quick"]))
    assert quick == bench.BenchConfig.quick()
    default = bench.config_from_args(parser.parse_args([]))
    assert default == bench.BenchConfig.default()
    assert default.seq_lens == (100, 1000, 10000) and default.batch_sizes == (1, 64, 1024)
    # The peers have a run of their own: in the default one they made it spend its time budget, cutting rows.
    assert not [m.key for m in bench.selected_methods(default) if m.role == "peer"]
    peers = bench.config_from_args(parser.parse_args(["--peers", "--no-plots"]))
    assert peers == bench.BenchConfig.peers() and peers.label == "peers"
    chosen = {m.key for m in bench.selected_methods(peers)}
    assert {m.key for m in bench.METHODS.values() if m.role == "peer"} <= chosen
    assert {bench.SEED_KEY, bench.AUTO_KEY, "jax-lstm-seq", "jax-gru-seq"} <= chosen
    with pytest.raises(SystemExit):
        parser.parse_args(["--quick", "--peers"])  # one preset at a time
    # Errors name the flag the user typed, not the config's field.
    with pytest.raises(ValueError, match="^--methods: unknown"):
        bench.config_from_args(parser.parse_args(["--methods", "torch-nope"]))
    with pytest.raises(ValueError, match="^--modes: expected a non-empty subset"):
        bench.config_from_args(parser.parse_args(["--modes", "backward"]))
    with pytest.raises(ValueError, match=r"^--budget-s: expected a finite number > 0, got -1.0$"):
        bench.config_from_args(parser.parse_args(["--budget-s", "-1"]))
    for label in ("", "../x", "a b"):  # it names the results' files
        with pytest.raises(ValueError, match=r"^--label: expected letters, digits"):
            bench.config_from_args(parser.parse_args(["--label", label]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--torch-threads", "0"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--seq-lens", "0,10"])


@pytest.mark.parametrize("text, why", [("1,,64", "comma-separated integers"), ("64,", "comma-separated integers"),
                                       ("1,64,1", "each value once")])
def test_a_grid_with_an_empty_or_repeated_value_is_refused(text, why, capsys):
    """'1,,64' (a value left out) ran the grid at 1 and 64 without a word; '1,64,1' timed B=1 twice."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--batch-sizes", text])
    assert f"argument --batch-sizes: expected {why}, got {text!r}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="min_repeats"):
        bench.BenchConfig(repeats=2, min_repeats=3).validate()


def test_host_kind_names_the_machine():
    kind = bench.host_kind()
    assert kind.startswith(("cpu-", "gpu-")) and " " not in kind
    if kind.startswith("cpu-"):
        assert kind.endswith("core")


def test_module_does_not_import_torch():
    code = "import sys, jax_scan_rnn, jax_scan_rnn.bench; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_default_output_is_not_the_committed_results():
    """A user's `jax-scan-rnn bench` must not overwrite the project's committed benchmarks/results."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args([]).out == "runs/bench"


def test_modules_import_only_earlier_ones_by_public_names():
    """No import cycle in bench/: each module imports only modules listed before it here (the package
    docstring's order), and only their public names."""
    order = ["config", "machine", "context", "torch_methods", "jax_methods", "vae_methods", "peer_methods", "methods",
             "engine", "report", "cli"]
    root = Path(bench.__file__).parent
    assert {p.stem for p in root.glob("*.py")} == {*order, "__init__", "__main__"}
    for i, name in enumerate(order):
        for node in ast.walk(ast.parse((root / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax_scan_rnn.bench"):
                imported = node.module.split(".")[2:] or [alias.name for alias in node.names]
                assert all(order.index(m) < i for m in imported), (name, node.module)
                assert not any(alias.name.startswith("_") for alias in node.names), (name, node.module)


def test_the_method_table_refuses_two_rows_with_one_key():
    from jax_scan_rnn.bench.methods import _by_key

    row = next(iter(bench.METHODS.values()))
    assert _by_key([row]) == {row.key: row}
    with pytest.raises(ValueError, match="^METHODS: expected distinct keys"):
        _by_key([row, row])


def test_a_peer_ratio_is_the_median_of_the_rounds_ratios():
    """The cell's rows are sampled round by round, so the ratio is taken round by round: a spell that slowed
    only jsr's call in one round must not decide it, as the ratio of the two medians lets it (3 / 1.1)."""
    from jax_scan_rnn.bench.engine import _vs_jsr

    # Every round jsr takes 1/1.1 of the peer's time, but for round 4, where only jsr's call was slowed.
    jsr = {"method": "jax-scan-auto", "status": "ok", "samples": [1.0, 3.0, 3.0, 1.0, 3.0], "call_s": 3.0,
           "compile_rounds_s": [2.0, 2.0, 2.0], "compile_s": 2.0, "first_call_s": 2.5}
    peer = {"method": "peer-x", "status": "ok", "versus": ["jax-scan-auto"], "samples": [1.1, 3.3, 3.3, 1.1, 1.1],
            "call_s": 1.1, "compile_rounds_s": [4.0, 1.0, 4.0], "compile_s": 4.0, "first_call_s": 5.0}
    vs = _vs_jsr(peer, [jsr, peer])
    assert vs["vs"] == "jax-scan-auto"
    assert vs["call"] == pytest.approx(1 / 1.1) and vs["call_of_medians"] == pytest.approx(3 / 1.1)
    assert vs["compile"] == pytest.approx(0.5) and vs["compile_of_medians"] == pytest.approx(0.5)
    assert vs["first_call"] == pytest.approx(0.5)


def test_graphed_vae_decoder_is_decode_without_its_checks():
    """The CUDA-graph rows' decoder (run here without a graph) gives decode's logits, and a model whose
    decode goes through it gives the same loss and gradients: what the GPU rows capture is the same math."""
    torch = pytest.importorskip("torch")
    import torch_ref
    from jax_scan_rnn.bench.vae_methods import graph_decoder, scheduled_decoder

    torch.manual_seed(0)
    model = torch_ref.SeqVAE(12, 8, 3, 1)
    tokens = torch.randint(3, 12, (4, 7))
    lengths = torch.tensor([7, 5, 3, 7])
    mask, z, eps = torch.rand(4, 7) < 0.5, torch.randn(4, 3), torch.randn(4, 3)
    want = model.decode(z, tokens, replace_mask=mask)
    torch.testing.assert_close(scheduled_decoder(torch, model, tokens, mask)(z), want, rtol=0, atol=0)

    def grads(m):
        m.zero_grad(set_to_none=True)
        loss = m.loss(tokens, lengths, eps=eps, replace_mask=mask)["total"]
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    loss_want, grads_want = grads(model)
    graphed = torch_ref.SeqVAE(12, 8, 3, 1)
    graphed.load_state_dict(model.state_dict())
    graph_decoder(torch, graphed, tokens, mask, z, make_graphed=lambda module, args, **_: module)
    loss_got, grads_got = grads(graphed)
    torch.testing.assert_close(loss_got, loss_want, rtol=0, atol=0)
    assert grads_got.keys() == grads_want.keys()
    for name in grads_want:
        torch.testing.assert_close(grads_got[name], grads_want[name], rtol=0, atol=0, msg=name)


def test_a_torch_train_row_trains_a_copy_whose_rnn_weights_are_flattened_again(monkeypatch):
    """A deep copy gives each nn.GRU/nn.LSTM weight a storage of its own, which cuDNN would pack into one buffer at
    every call of a timed step: `train_copy` flattens every RNN module of the copy (on a CPU a no-op, so the call
    itself is what is checked) and leaves the shared model's weights where they were."""
    torch = pytest.importorskip("torch")
    import torch_ref
    from jax_scan_rnn.bench.torch_methods import train_copy

    model = torch_ref.SeqVAE(12, 8, 3, 1).eval()
    flattened = []
    monkeypatch.setattr(torch.nn.RNNBase, "flatten_parameters", lambda self: flattened.append(self))
    copy = train_copy(argparse.Namespace(torch=torch), model)
    rnns = [m for m in copy.modules() if isinstance(m, torch.nn.RNNBase)]
    assert rnns and [id(m) for m in flattened] == [id(m) for m in rnns]
    assert copy.training and not model.training
    for (name, mine), (_, shared) in zip(copy.named_parameters(), model.named_parameters()):
        assert mine.data_ptr() != shared.data_ptr(), name
        torch.testing.assert_close(mine, shared, rtol=0, atol=0, msg=name)


def test_a_cuda_error_skips_what_can_no_longer_run():
    """A CUDA-graph row whose capture fails leaves the process's GPU unusable (seen on an H200): the engine
    builds such rows last in a cell, and marks the rest of the cell and every later cell skipped, saying why,
    instead of reporting each row's unrelated-looking error."""
    from types import SimpleNamespace

    from jax_scan_rnn.bench.config import BenchConfig
    from jax_scan_rnn.bench.context import Case
    from jax_scan_rnn.bench.engine import _Engine
    from jax_scan_rnn.bench.methods import Method

    built = []

    def ok(key):
        def build(ctx, batch, steps, mode):
            built.append(key)
            return Case(lambda: None)
        return build

    def capture_fails(ctx, batch, steps, mode):
        built.append("graph")
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    methods = [Method("a", "a", "jax", "compiled", ok("a")),
               Method("graph", "graph", "torch", "compiled", capture_fails, gpu_only=True),
               Method("b", "b", "jax", "compiled", ok("b"))]
    cuda = SimpleNamespace(synchronize=lambda: None, reset_peak_memory_stats=lambda: None,
                           memory_allocated=lambda: 0, max_memory_allocated=lambda: 0)
    ctx = SimpleNamespace(on_gpu=True, torch=SimpleNamespace(cuda=cuda, _dynamo=SimpleNamespace(reset=lambda: None)))
    engine = _Engine(BenchConfig(), ctx, None)
    rows = engine.cell(methods, "traveller", 1, 10, "forward", "grid")
    assert built == ["a", "b", "graph"]  # the graph row last
    assert [r["method"] for r in rows] == ["a", "graph", "b"]  # the table's order kept
    by_key = {r["method"]: r for r in rows}
    assert by_key["graph"]["status"] == "error" and "CUDA error" in by_key["graph"]["reason"]
    for key in ("a", "b"):
        assert by_key[key]["status"] == "skipped"
        assert by_key[key]["reason"] == "the GPU is unusable after graph's error (forward, B=1, T=10)"
    later = engine.cell(methods, "traveller", 64, 10, "forward", "grid")
    assert built == ["a", "b", "graph"] and {r["status"] for r in later} == {"skipped"}


def test_render_bench_writes_a_device_runs_tables_under_a_label(tiny, tmp_path, capsys):
    """benchmarks/render_bench.py (a --no-plots run's JSON, from a device machine): the same Markdown as the run
    wrote, under --label if given (the run's own label kept), and never over an earlier run's files."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import render_bench
    finally:
        sys.path.pop(0)
    _, results, paths, _ = tiny
    assert render_bench.main([str(paths["json"]), "--out", str(tmp_path)]) == 0
    assert (tmp_path / paths["md"].name).read_text() == paths["md"].read_text()
    assert (tmp_path / paths["png_forward"].name).exists()
    assert render_bench.main([str(paths["json"]), "--out", str(tmp_path), "--no-plots", "--label", "b64"]) == 0
    relabelled = json.loads((tmp_path / f"{bench.host_kind()}-b64.json").read_text())
    assert relabelled["config"]["label"] == "b64" and relabelled["config"]["label_run"] == "tiny"
    assert render_bench.main([str(paths["json"]), "--out", str(tmp_path), "--no-plots"]) == 2
    assert "already holds" in capsys.readouterr().err


def test_every_benchmark_script_starts():
    """Each script in benchmarks/ answers --help: they import the package's pieces (the CLI's option types), and a
    renamed one broke a script that no other test runs (benchmarks/vae_invalid.py, by positive_int)."""
    from concurrent.futures import ThreadPoolExecutor

    scripts = sorted((Path(__file__).parents[1] / "benchmarks").glob("*.py"))
    assert len(scripts) >= 10

    def start(script: Path) -> tuple[str, int, str]:
        done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
        return script.name, done.returncode, done.stderr[-500:]

    with ThreadPoolExecutor(4) as pool:
        failed = [row for row in pool.map(start, scripts) if row[1] != 0]
    assert not failed, failed


def test_the_tables_legend_does_not_call_the_limit_a_floor_that_rows_go_below():
    """The committed CPU run has rows below 1× the limit (the scan at B=1024): the legend of its tables, and the
    benchmark's README, once called 1× "the floor"."""
    results = json.loads((ROOT / "benchmarks" / "results" / "cpu-2core.json").read_text())
    assert any(r["status"] == "ok" and r.get("x_limit") is not None and r["x_limit"] < 1 for r in results["rows"])
    md = bench.markdown(results)
    assert "`vs limit`" in md and "floor" not in md
    assert "1x is the floor" not in (ROOT / "benchmarks" / "README.md").read_text()
