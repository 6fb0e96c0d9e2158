"""The command line: version, info, the parity self-check, and one-line errors with exit code 2."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from jax_scan_rnn import __version__
from jax_scan_rnn.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jax-scan-rnn {__version__}"


def test_info_lists_devices_and_versions(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("jax ", "flax", "devices", "torch", "xla small-loop setting"):
        assert key in out


def test_check_passes_for_every_model_with_jaxs_float32_matmuls_at_full_precision(capsys, monkeypatch):
    pytest.importorskip("torch")  # check compares against torch.nn (without it: one line, tests/test_optional.py)
    import jax

    import jax_scan_rnn as jsr

    precisions, jit = [], jsr.jit

    def recording_jit(model):  # what the JAX side computes under (a GPU's default, TF32, is not torch's float32)
        precisions.append(jax.config.jax_default_matmul_precision)
        return jit(model)

    monkeypatch.setattr(jsr, "jit", recording_jit)
    assert main(["check", "--steps", "50"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out
    for row in ("LSTM 1", "LSTM 2", "GRU 1", "GRU 2", "RNN 1", "RNN 2", "Traveller 2", "SeqVAE 2"):
        assert f"\n{row} " in out, row
    assert len(precisions) >= 6 and set(precisions) == {"highest"}, precisions


def test_unknown_command_or_option_exits_2_with_one_line():
    for argv, says in ((["frobnicate"], "invalid choice"), (["train", "traveller", "--bogus"], "--bogus")):
        result = subprocess.run([sys.executable, "-m", "jax_scan_rnn.cli", *argv], capture_output=True, text=True)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and lines[0].endswith("(see jax-scan-rnn --help)"), lines


def test_python_dash_m_runs_the_command():
    # `python -m jax_scan_rnn`, where pip put the console script off PATH (a --user install): "No module named
    # jax_scan_rnn.__main__; 'jax_scan_rnn' is a package and cannot be directly executed"
    result = subprocess.run([sys.executable, "-m", "jax_scan_rnn", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("jax-scan-rnn "), result
    result = subprocess.run([sys.executable, "-m", "jax_scan_rnn", "train", "traveller", "--steps", "0"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("jax-scan-rnn train traveller: error: argument --steps"), result


# `--version`, `--help` and a train command's bad options import neither JAX nor torch (measured:
# docs/measurements.md#the-clis-start-up); the bound is generous for a loaded machine, far below a JAX import's cost
# there.
STARTUP_BUDGET_S = 1.0


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["train", "--help"], ["train", "traveller", "--help"],
                                  ["train", "vae", "--help"], ["train", "vae", "--preset", "moses", "--help"],
                                  ["train", "traveller", "--steps", "abc"], ["train", "vae", "--batch-size", "0"],
                                  ["train", "traveller", "--num-layers", "1", "--dropout", "0.2"],
                                  ["train", "vae", "--ss-max", "0.3"], ["train", "traveller", "--override"],
                                  # a --checkpoint that is no directory: every command that reads a run
                                  ["sample", "vae", "--checkpoint", "nowhere"],
                                  ["encode", "vae", "--checkpoint", "nowhere", "--input", "pyproject.toml"],
                                  ["evaluate", "vae", "--checkpoint", "nowhere"],
                                  ["export", "vae", "--checkpoint", "nowhere", "--format", "torch", "--output", "x.pt"],
                                  ["evaluate", "traveller", "--checkpoint", "nowhere"],
                                  ["run", "traveller", "--checkpoint", "nowhere", "--data", "x.npz", "--output",
                                   "x.csv"],
                                  ["export", "traveller", "--checkpoint", "nowhere", "--format", "torch", "--output",
                                   "x.pt"]])
def test_version_and_help_start_at_once_without_importing_jax(argv):
    """Help, a flag's bad value, options that contradict each other and a mistyped --checkpoint come from the
    options' dataclasses (`jax_scan_rnn.configs`) and the commands' checks, before JAX is imported."""
    code = ("import sys, time; t = time.perf_counter()\n"
            "from jax_scan_rnn.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(time.perf_counter() - t, 'jax' in sys.modules, 'torch' in sys.modules, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    seconds, jax_loaded, torch_loaded = result.stderr.splitlines()[-1].split()  # after a bad value's one line
    assert (jax_loaded, torch_loaded) == ("False", "False")
    assert float(seconds) < STARTUP_BUDGET_S


@pytest.mark.parametrize("command", [["train", "traveller"], ["train", "vae"], ["bench"], ["sample", "vae"],
                                     ["encode", "vae"], ["evaluate", "vae"], ["evaluate", "traveller"]])
def test_every_command_help_renders(command, capsys):
    """argparse formats help texts with %: a field's help with a literal % once crashed `train vae --help`."""
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: jax-scan-rnn" in text
    # Each option's help says its default once (a field's own "(default: ...)" beside the generated one read twice).
    for option in re.split(r" (?=--?[a-z])", " ".join(text.split()))[1:]:
        assert option.count("(default") <= 1, option


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
@pytest.mark.parametrize("argv, flag", [(["sample", "vae", "--checkpoint", "nowhere", "--temperature"], "--temperature"),
                                         (["train", "traveller", "--lr"], "--lr")])
def test_non_positive_or_non_finite_floats_are_refused_before_any_work(argv, flag, value, capsys):
    """One line naming the flag, exit code 2: nothing is loaded or trained with such a value."""
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: expected a finite number > 0, got {value}" in capsys.readouterr().err


TINY_TRAVELLER = ["train", "traveller", "--steps", "2", "--hidden-size", "4", "--num-layers", "1", "--batch-size", "4",
                  "--seq-len", "8", "--eval-every", "0"]


@pytest.mark.parametrize("argv, message", [
    (["check", "--steps", "0"], "argument --steps: expected an int >= 1, got 0"),
    (["train", "traveller", "--steps", "10", "--warmup-steps", "50"], "--warmup-steps: expected at most --steps 10, got 50"),
    (["train", "traveller", "--seq-len", "10000000"],
     "the simulated training market (--train-paths x --seq-len, --num-assets): needs about"),
    (["train", "traveller", "--eval-paths", "1000000000"],
     "the simulated held-out market (--eval-paths x --eval-steps, --num-assets): needs about"),
    (["train", "vae", "--data", "rdkit", "--eval-samples", "100000000000"],
     "the final evaluation's samples (--eval-samples): needs about"),
    (["train", "traveller", "--batch-size", "100000"], "--batch-size: expected at most --train-paths 8192, got 100000"),
    (["train", "traveller", "--override"], "--override: expected only with --resume"),
    (["train", "traveller", "--seed", "-1"], "argument --seed: expected an int in [0, 4294967295], got -1"),
    # Seeds past int64 crashed inside JAX (OverflowError); the range is every seed option's, and the other commands'
    (["train", "vae", "--data-seed", str(2**64)], f"argument --data-seed: expected an int in [0, 4294967295], got {2**64}"),
    (["check", "--seed", "-1"], "argument --seed: expected an int in [0, 4294967295], got -1"),
    (["sample", "vae", "--checkpoint", "nowhere", "--seed", str(2**64)],
     f"argument --seed: expected an int in [0, 4294967295], got {2**64}"),
    # A flag that the run would not read is refused, not silently without effect.
    (["train", "traveller", "--valid-fraction", "0.3"],
     "--valid-fraction: expected only together with --data FILE (the simulated market does not read it), got 0.3"),
    (["train", "traveller", "--periods-per-year", "12"], "--periods-per-year: expected only together with --data FILE"),
    (["train", "traveller", "--data", "prices.csv", "--eval-paths", "4"],
     "--eval-paths: expected only on the simulated market (--data "),
    (["train", "vae", "--ss-max", "0.3"],
     "--ss-max: expected only with --decoding scheduled (teacher forcing does not read it), got 0.3"),
    (["train", "vae", "--kl-schedule", "constant", "--kl-warmup", "10"],
     "--kl-warmup: expected only with --kl-schedule linear or sigmoid (constant has no warm-up), got 10"),
    (["train", "traveller", "--lr-schedule", "constant", "--final-lr-fraction", "0.1"],
     "--final-lr-fraction: expected only with --lr-schedule cosine or linear (constant has no decay), got 0.1"),
    (["train", "vae", "--preset", "moses", "--final-lr-fraction", "0.1"],  # the preset's schedule is constant
     "--final-lr-fraction: expected only with --lr-schedule cosine or linear (constant has no decay), got 0.1"),
    (["train", "traveller", "--devices", "999"], "--devices: expected at most the "),
    (["train", "traveller", "--num-layers", "1", "--dropout", "0.3"],
     "--dropout: expected 0 with --num-layers 1 (dropout acts between stacked layers), got 0.3"),
    (["sample", "vae", "--checkpoint", "nowhere", "--greedy", "--temperature", "0.5"],
     "--temperature: expected only without --greedy (greedy decoding takes each step's most likely token), got 0.5"),
    (["train", "vae", "--data", "moses:tset"], "--data: expected 'moses' or 'moses:<split>' with split in"),
    (["train", "vae", "--data", "no-such.smi"], "--data no-such.smi: expected 'rdkit', 'moses', 'moses:<split>' or "
                                                "an existing file, got 'no-such.smi'"),
])
def test_bad_values_are_one_line_naming_the_flag_and_touch_nothing(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*argv, "--out", str(out)] if argv[0] == "train" else argv
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse's own errors
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1], err
    assert not out.exists(), "a refused run must not create its output directory"


def test_only_the_options_typed_count_as_given_not_defaults_or_a_presets():
    """`refuse_unread` refuses a flag the run would not read only when the user typed it: a preset's values and
    the defaults never are (the moses preset sets --kl-warmup, which --decoder-only does not read)."""
    from jax_scan_rnn.cli import given_options

    assert given_options(["train", "vae", "--preset", "moses", "--decoder-only"]) == {
        "command", "model", "preset", "decoder_only"}
    # argparse's abbreviations and --flag=value are the flags they stand for
    assert given_options(["train", "vae", "--ss-ma", "0.3", "--kl-schedule=constant", "--no-kekule"]) == {
        "command", "model", "ss_max", "kl_schedule", "kekule"}


def test_decoder_only_says_which_typed_vae_flags_have_no_effect(tmp_path, capsys):
    """A CharRNN baseline (--decoder-only) shares its VAE's flags, so the KL's and the encoder's are said in a
    note, not refused; the run goes on."""
    argv = ["train", "vae", "--decoder-only", "--max-beta", "0.05", "--data", "rdkit", "--limit", "300", "--steps", "1",
            "--hidden-size", "8", "--latent-size", "2", "--batch-size", "8", "--eval-every", "0", "--eval-samples", "8",
            "--eval-sequences", "4", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    assert ("note: --max-beta 0.05 has no effect with --decoder-only (the decoder alone has no encoder and no KL)"
            in capsys.readouterr().err)
    # After one update few samples, if any, are valid: the report is strict JSON all the same (no NaN, which jq
    # and JavaScript refuse), an undefined metric null.
    json.loads((tmp_path / "run" / "evaluation.json").read_text(),
               parse_constant=lambda name: pytest.fail(f"evaluation.json holds {name}"))


def test_outputs_are_replaced_whole_or_not_at_all(tmp_path):
    """runlog.write_atomically, behind every report, export, benchmark result and the log cut back on resume: a
    write that fails (or is interrupted) leaves the older file as it was and no temporary file; one that succeeds
    has the permissions a plain open gives (a temporary file's 0600 would have hidden a report from its group)."""
    from jax_scan_rnn.runlog import write_atomically

    target = tmp_path / "report.json"
    target.write_text("older\n")

    def fails(f):
        f.write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, fails)
    assert target.read_text() == "older\n" and [p.name for p in tmp_path.iterdir()] == ["report.json"]
    (tmp_path / "plain").write_text("")
    write_atomically(target, lambda f: f.write("newer\n"))
    assert target.read_text() == "newer\n" and target.stat().st_mode == (tmp_path / "plain").stat().st_mode
    write_atomically(tmp_path / "b.bin", lambda f: f.write(b"\x00\x01"), binary=True)
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX: a FIFO and a symbolic link")
def test_a_device_a_fifo_or_a_link_is_written_through_not_replaced(tmp_path):
    """A rename over `--output /dev/stdout` (or, as root, /dev/null) replaced the node itself with a regular file;
    such a path, and a link, are written in place. A write the disk refuses names the output, not a temporary file."""
    import errno
    import stat
    import threading

    from jax_scan_rnn.runlog import write_atomically

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_atomically(fifo, lambda f: f.write("through\n"))
    reader.join(timeout=30)
    assert got == ["through\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    real, link = tmp_path / "real.csv", tmp_path / "link.csv"
    real.write_text("older\n")
    link.symlink_to(real)
    write_atomically(link, lambda f: f.write("newer\n"))
    assert link.is_symlink() and real.read_text() == "newer\n"
    if os.path.exists("/dev/full"):  # Linux: every write fails with ENOSPC
        with pytest.raises(OSError) as error:
            write_atomically("/dev/full", lambda f: f.write("x" * 100_000))
        assert (error.value.errno, error.value.filename) == (errno.ENOSPC, "/dev/full")
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
        # The training log on a full disk: its own name, not hidden by closing the file (which fails again).
        from jax_scan_rnn.runlog import RunLog

        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "metrics.jsonl").symlink_to("/dev/full")
        with pytest.raises(OSError) as error, RunLog(tmp_path / "run") as log:
            log.add({"step": 1, "split": "train", "loss": 0.5})
        assert (error.value.errno, error.value.filename) == (errno.ENOSPC, str(tmp_path / "run" / "metrics.jsonl"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.csv", "real.csv"] + (
        ["run"] if os.path.exists("/dev/full") else [])


def test_a_full_disk_is_one_line_naming_the_file_and_what_the_run_keeps(tmp_path, monkeypatch, capsys):
    """tensorstore reports a full disk as a ValueError "RESOURCE_EXHAUSTED: ... [os_error_code='28']": it was read as
    out of memory, or its words turned into flags ("--RESOURCE-EXHAUSTED"). Now OSError(ENOSPC) naming the
    checkpoint, and the CLI says so in one line (exit 1) with what the run keeps."""
    import errno

    import orbax.checkpoint as ocp

    from jax_scan_rnn import checkpoint

    def full(self, step, *args, **kwargs):
        # as orbax's own save, first wait for the manager's clean-up of temporary folders, begun in the background
        # when it was made: it deleted this fake's half-written step as it was written (ENOENT: seen once in CI)
        getattr(self, "_maybe_await_cleanup_tmp_directory", lambda: None)()
        half = checkpoint.step_path(self.directory, step).with_name(f"step_{step:08d}.orbax-checkpoint-tmp")
        (half / "arrays").mkdir(parents=True)
        (half / "arrays" / "written").write_bytes(b"0" * 4096)  # what orbax wrote before the disk filled
        raise ValueError('RESOURCE_EXHAUSTED: Error writing "loop/count/0" in OCDBT database: Failed to write 303337 '
                         "bytes to file 19: No space left on device [os_error_code='28']")

    monkeypatch.setattr(ocp.CheckpointManager, "save", full)
    with pytest.raises(OSError) as error:
        checkpoint.save(tmp_path / "ck", 3, {"w": np.zeros(2)})
    assert (error.value.errno, error.value.filename) == (errno.ENOSPC, str(tmp_path / "ck" / "step_00000003"))
    assert os.listdir(tmp_path / "ck") == []  # the half-written step gives its space back at once
    out = tmp_path / "run"
    assert main([*TINY_TRAVELLER, "--log-every", "1", "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"jax-scan-rnn train traveller: error: No space left on device ({out / 'checkpoints'}/"
        "step_00000002); no checkpoint was written yet (--checkpoint-every 250): nothing to resume; its log is kept "
        "(metrics.jsonl: --resume there starts again from step 0)")


def test_a_disk_too_full_for_the_checkpoint_is_refused_before_orbax_writes(tmp_path, monkeypatch):
    """orbax failing half-way prints pages of tracebacks from its threads: a disk that cannot hold the checkpoint (the
    newest one's size; for a first save, half the arrays' bytes) is refused before, naming the step and the sizes."""
    import errno
    import shutil

    from jax_scan_rnn import checkpoint

    checkpoint.save(tmp_path, 1, {"w": np.zeros(1000, np.float32)})
    size = sum(f.stat().st_size for f in checkpoint.step_path(tmp_path, 1).rglob("*") if f.is_file())
    disk = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: disk._replace(free=size - 1))
    with pytest.raises(OSError) as error:
        checkpoint.save(tmp_path, 2, {"w": np.ones(1000, np.float32)})
    assert (error.value.errno, error.value.filename) == (errno.ENOSPC, str(checkpoint.step_path(tmp_path, 2)))
    assert f"the checkpoint needs about {size} bytes, {size - 1} are free" in error.value.strerror
    assert os.listdir(tmp_path) == ["step_00000001"]
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: disk._replace(free=1999))
    with pytest.raises(OSError, match="needs about 2000 bytes, 1999 are free"):  # a first save: half its 4000 bytes
        checkpoint.save(tmp_path / "fresh" / "ck", 1, {"w": np.zeros(1000, np.float32)})
    assert not (tmp_path / "fresh").exists()
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: disk._replace(free=size))
    checkpoint.save(tmp_path, 2, {"w": np.ones(1000, np.float32)})  # it fits: saved
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: disk._replace(free=0))
    checkpoint.save(tmp_path, 2, {"w": np.ones(1000, np.float32)})  # saved again: the old one's space is reused
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: disk._replace(free=40))
    checkpoint.save(tmp_path, 3, {"w": np.ones(10, np.float32)})  # another, smaller tree: held to its 40 bytes


def test_only_snake_case_fields_become_flags():
    from jax_scan_rnn.cli import flag_names

    for message, shown in (("batch_size: expected at most steps=3", "--batch-size: expected at most --steps 3"),
                           ("init_from: x (LSTM(6, 8, num_layers=2))", "--init-from: x (LSTM(6, 8, num_layers=2))"),
                           # a list of sizes: each one a flag (the second was left as latent_size=8)
                           ("init_from: holds hidden_size=32, latent_size=8, decoder_hidden_size=32; f(a, k=1) b=2",
                            "--init-from: holds --hidden-size 32, --latent-size 8, --decoder-hidden-size 32; "
                            "f(a, k=1) --b 2"),
                           ("batch_size: got 1) steps=3", "--batch-size: got 1) --steps 3"),  # a stray ")" too
                           ("RESOURCE_EXHAUSTED: os_error_code='28'", "RESOURCE_EXHAUSTED: os_error_code='28'"),
                           ("cfg.steps: expected at least the checkpoint's step 2, got 1",  # fit's, on --resume
                            "--steps: expected at least the checkpoint's step 2, got 1")):
        with pytest.raises(ValueError) as error, flag_names():
            raise ValueError(message)
        assert str(error.value) == shown


def test_undefined_metrics_are_null_in_reports_and_n_a_on_screen():
    """The uniqueness and novelty of samples none of which is valid are undefined (metrics return nan)."""
    from jax_scan_rnn.cli import fraction
    from jax_scan_rnn.runlog import strict_json

    report = {"samples": {"validity": 0.0, "uniqueness": float("nan"), "novelty": float("inf"), "n": 3}, "path": [1.5]}
    assert json.loads(strict_json(report)) == {"samples": {"validity": 0.0, "uniqueness": None, "novelty": None, "n": 3},
                                               "path": [1.5]}
    assert [fraction(v) for v in (0.25, float("nan"), None)] == ["0.250", "n/a", "n/a"]


def test_vae_default_data_missing_names_data_and_the_install(monkeypatch, tmp_path, capsys):
    """`train vae` reads MOSES's data by default; without molsets, one line naming --data and how to install it."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "moses" else real(name, *a))
    assert main(["train", "vae", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "jax-scan-rnn train vae: error: --data moses: the MOSES data file moses/dataset/data/train.csv.gz was not "
        "found; install it with `pip install --no-deps molsets` (--no-deps: only its data files are read, and its "
        "pinned dependencies do not build), or use the 'rdkit' source, which ships with rdkit")


@pytest.mark.parametrize("command", [["evaluate", "traveller"], ["sample", "vae"]])
def test_checkpoint_that_holds_no_run_is_one_line_naming_the_flag(command, tmp_path, capsys):
    assert main([*command, "--checkpoint", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--checkpoint: expected a training output directory (train's "
                                                    f"--out), got {tmp_path}, which holds no checkpoints/ folder")
    (tmp_path / "checkpoints").mkdir()  # a run stopped before its first save
    assert main([*command, "--checkpoint", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--checkpoint {tmp_path}: holds no committed checkpoint "
                                                    "(training stopped before its first save?)")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished TINY_TRAVELLER run's directory (metrics, report, plots, checkpoints)."""
    out = tmp_path_factory.mktemp("tiny") / "run"
    assert main([*TINY_TRAVELLER, "--out", str(out)]) == 0
    return out


def test_a_link_to_a_runs_own_file_is_refused_as_the_file_is(tiny_run, tmp_path, capsys):
    """Outputs that are links are written through (write_atomically): a link into a run must not reach its log."""
    link = tmp_path / "positions.csv"
    link.symlink_to(tiny_run / "metrics.jsonl")
    before = (tiny_run / "metrics.jsonl").read_bytes()
    assert main(["run", "traveller", "--checkpoint", str(tiny_run), "--data", "x.npz", "--output", str(link)]) == 2
    assert f"--output: {link} belongs to the training run in {tiny_run} (its own metrics.jsonl)" in \
        capsys.readouterr().err
    assert (tiny_run / "metrics.jsonl").read_bytes() == before


def test_resume_of_a_run_another_version_wrote_is_refused_before_anything_is_printed(tiny_run, tmp_path, capsys):
    """The refusal came from fit, after the banner ("training the Traveller ... -> DIR") had said training began."""
    out = tmp_path / "run"
    shutil.copytree(tiny_run, out)
    steps = sorted((out / "checkpoints").glob("step_*"))
    manifest = steps[-1] / "MANIFEST.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 3}))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert main([*TINY_TRAVELLER, "--out", str(out), "--resume"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.fullmatch(rf"jax-scan-rnn train traveller: error: checkpoint {re.escape(str(steps[-1]))}: format 3 in "
                        r"MANIFEST\.json.*\n", captured.err), captured.err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_where_checkpoints_is_a_file_is_refused_before_the_log_is_replaced(tmp_path, capsys):
    """A file where the run's checkpoints/ folder belongs: fit found it only at its first save, after replacing the
    run's log, and crashed with a NotADirectoryError traceback. Now one line naming --out, nothing written."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("not a folder")
    (out / "metrics.jsonl").write_text('{"step": 5, "split": "train", "loss": 1.0}\n')
    before = (out / "metrics.jsonl").read_bytes()
    assert main([*TINY_TRAVELLER, "--out", str(out), "--resume"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"error: --out: expected {out / 'checkpoints'} to be the run's checkpoint directory, got a file; move it away "
        "or choose another directory")
    assert (out / "metrics.jsonl").read_bytes() == before


def test_a_runs_checkpoints_folder_given_for_the_run_names_the_run(tiny_run, capsys):
    assert main(["evaluate", "traveller", "--checkpoint", str(tiny_run / "checkpoints")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"which holds no checkpoints/ folder; pass --checkpoint {tiny_run}")


@pytest.mark.parametrize("command, flag, name", [
    (["run", "traveller", "--data", "x.npz"], "--output", "checkpoints/positions.csv"),
    (["export", "traveller", "--format", "torch"], "--output", "metrics.jsonl"),
    (["evaluate", "traveller"], "--plot", "positions.png"),
    (["sample", "vae"], "--output", "evaluation.json"),
    (["encode", "vae", "--input", "x.smi"], "--output", "checkpoints/latents.npz"),
    (["evaluate", "vae"], "--output", "curves.png"),
])
def test_an_output_that_is_a_training_runs_own_file_is_refused(tiny_run, capsys, command, flag, name):
    """Another command's output never replaces what a training run keeps in its directory."""
    before = {p: p.read_bytes() for p in tiny_run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*command, "--checkpoint", str(tiny_run), flag, str(tiny_run / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{flag}: {tiny_run / name} belongs to the training run in" in err
    assert {p: p.read_bytes() for p in tiny_run.rglob("*") if p.is_file()} == before


def test_a_run_inside_another_runs_checkpoints_is_refused(tiny_run, capsys):
    inner = tiny_run / "checkpoints" / "inner"
    assert main([*TINY_TRAVELLER, "--out", str(inner)]) == 2
    assert f"--out: {inner} belongs to the training run in {tiny_run} (its own checkpoints)" in capsys.readouterr().err
    assert not inner.exists()


def test_resuming_another_models_run_is_one_line_before_any_work(tiny_run, monkeypatch, capsys):
    """train vae --resume into a Traveller run's --out: named, before the molecules are read, the run untouched."""
    from jax_scan_rnn.tasks import vae as task_lib

    before = {p: p.read_bytes() for p in tiny_run.rglob("*") if p.is_file()}
    monkeypatch.setattr(task_lib, "load_dataset", lambda *a: pytest.fail("read the data of a refused run"))
    capsys.readouterr()
    assert main(["train", "vae", "--out", str(tiny_run), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--out: {tiny_run} holds a run of the traveller model, not of the vae; resume it with train "
                        "traveller, or choose another --out") and len(err.splitlines()) == 1, err
    assert {p: p.read_bytes() for p in tiny_run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("command", [["evaluate", "vae"], ["export", "vae", "--format", "torch", "--output", "m.pt"],
                                     ["sample", "vae"]])
@pytest.mark.parametrize("step", [[], ["--step", "2"]])
def test_another_models_run_given_to_checkpoint_names_the_flag(tiny_run, capsys, command, step):
    """A Traveller run given to a VAE command: one line naming --checkpoint (the Python API's load names out_dir)."""
    from jax_scan_rnn.tasks import vae as task_lib

    assert main([*command, "--checkpoint", str(tiny_run), *step]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--checkpoint: expected a VAE run, got model 'traveller' in {tiny_run}"), err
    assert len(err.splitlines()) == 1, err
    with pytest.raises(ValueError, match="^out_dir: expected a VAE run, got model 'traveller'"):
        task_lib.load(tiny_run)


@pytest.mark.parametrize("command", [["evaluate", "traveller"], ["export", "traveller", "--format", "torch",
                                                                       "--output", "m.pt"]])
def test_another_models_run_given_to_a_traveller_command_names_the_flag(tiny_run, capsys, monkeypatch, command):
    """A run whose checkpoint says another model (here its metadata read as a VAE's) given to a Traveller command:
    one line naming --checkpoint, as the VAE commands do (the Python API's load names out_dir)."""
    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.tasks import traveller as task_lib

    read = checkpoint.read_metadata
    monkeypatch.setattr(checkpoint, "read_metadata", lambda *a, **k: {**read(*a, **k), "model": "vae"})
    assert main([*command, "--checkpoint", str(tiny_run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--checkpoint: expected a Traveller run, got model 'vae' in {tiny_run}"), err
    assert len(err.splitlines()) == 1, err
    with pytest.raises(ValueError, match="^out_dir: expected a Traveller run, got model 'vae'"):
        task_lib.load(tiny_run)

def test_a_folder_of_ones_own_called_checkpoints_is_not_a_run(tiny_run, tmp_path, capsys):
    mine = tmp_path / "checkpoints"
    mine.mkdir()
    assert main(["export", "traveller", "--checkpoint", str(tiny_run), "--format", "safetensors", "--output",
                 str(mine / "m.safetensors")]) == 0
    assert (mine / "m.safetensors").stat().st_size > 0


@pytest.mark.parametrize("command", [["evaluate", "traveller"], ["export", "traveller", "--format", "torch",
                                                                       "--output", "m.pt"]])
def test_a_step_the_run_has_no_checkpoint_of_is_named_with_the_steps_it_has(tiny_run, capsys, command):
    assert main([*command, "--checkpoint", str(tiny_run), "--step", "7"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--step: expected one of the checkpoint steps of {tiny_run}, [2], got 7"), err


def test_run_on_a_missing_features_file_names_the_flag(tiny_run, tmp_path, capsys):
    missing = tmp_path / "missing.npz"
    assert main(["run", "traveller", "--checkpoint", str(tiny_run), "--data", str(missing), "--output",
                 str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--data: {missing}: no such file")


def test_output_that_is_a_directory_is_refused_before_any_work(tmp_path, capsys):
    assert main(["sample", "vae", "--checkpoint", str(tmp_path), "--output", str(tmp_path)]) == 2
    assert f"--output: expected a file path, got the directory {tmp_path}" in capsys.readouterr().err


def test_evaluate_on_a_read_only_run_prints_its_table_then_one_line(tmp_path, capsys):
    import os
    import stat

    out = tmp_path / "run"
    assert main([*TINY_TRAVELLER, "--out", str(out)]) == 0
    out.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(out, os.W_OK):
            pytest.skip("running as a user who can write to read-only directories (root)")
        capsys.readouterr()
        assert main(["evaluate", "traveller", "--checkpoint", str(out)]) == 2
        captured = capsys.readouterr()
        assert "Traveller (learned)" in captured.out
        assert f"--plot: cannot write {out / 'positions-step2.png'} (Permission denied)" in captured.err
    finally:
        out.chmod(stat.S_IRWXU)


def test_evaluate_whose_plot_cannot_be_written_prints_its_table_then_one_line(tmp_path, capsys):
    """The same path as a read-only run folder, reachable as root too: a file stands where a folder should."""
    out = tmp_path / "run"
    assert main([*TINY_TRAVELLER, "--out", str(out)]) == 0
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    capsys.readouterr()
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--plot", str(blocker / "p.png")]) == 2
    captured = capsys.readouterr()
    assert "Traveller (learned)" in captured.out
    assert f"--plot: cannot write {blocker / 'p.png'} (" in captured.err.strip().splitlines()[-1]
    # The format is the suffix's: one matplotlib draws, or a line naming --plot before any work.
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--plot", str(tmp_path / "p.svg")]) == 0
    assert (tmp_path / "p.svg").read_text().startswith("<?xml")
    capsys.readouterr()
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--plot", str(tmp_path / "p.xyz")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("jax-scan-rnn evaluate traveller: error: --plot: expected a "
                                                          "file ending in one of ")


def test_a_run_still_saving_is_read_at_its_newest_complete_checkpoint(tmp_path, capsys):
    """A training still running has, for a moment, a newest step without its manifest (written last): evaluate, export
    and run read the newest complete one, name the step they skipped, and say the step they used."""
    out = tmp_path / "run"
    assert main([*TINY_TRAVELLER, "--checkpoint-every", "1", "--out", str(out)]) == 0
    (out / "checkpoints" / "step_00000002" / "MANIFEST.json").unlink()  # as between orbax's commit and the manifest
    capsys.readouterr()
    assert main(["evaluate", "traveller", "--checkpoint", str(out)]) == 0
    captured = capsys.readouterr()
    skipped = "--checkpoint: step 2 skipped, loading step 1: checkpoint "
    assert skipped in captured.err and "MANIFEST.json is missing (a save still being written" in captured.err
    assert f"positions plot: {out / 'positions-step1.png'}" in captured.out
    assert main(["export", "traveller", "--checkpoint", str(out), "--format", "safetensors", "--output",
                 str(tmp_path / "w.safetensors")]) == 0
    captured = capsys.readouterr()
    assert skipped in captured.err and f"), step 1 of {out} -> " in captured.out
    np.savez(tmp_path / "f.npz", features=np.zeros((1, 3, 4), np.float32))
    assert main(["run", "traveller", "--checkpoint", str(out), "--data", str(tmp_path / "f.npz"), "--output",
                 str(tmp_path / "p.csv"), "--final-state", str(tmp_path / "s.npz")]) == 0
    with np.load(tmp_path / "s.npz") as state:
        assert str(state["checkpoint"]) == f"{out.absolute()} --step 1"  # the step used, not "the newest" then


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, tmp_path, capsys, tiny_run):
    from jax_scan_rnn.tasks import traveller as task_lib

    def interrupted(*args, callback, **kwargs):  # with the progress bar drawn: the line comes after it, last
        callback({"event": "start", "step": 0, "steps": 10, "resumed_from": None})
        callback({"event": "log", "step": 3, "loss": 0.5})
        raise KeyboardInterrupt

    monkeypatch.setattr(task_lib, "train", interrupted)
    assert main([*TINY_TRAVELLER, "--out", str(tmp_path / "run")]) == 130
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "3/10" in lines[-2] and lines[-1] == ("jax-scan-rnn train traveller: interrupted; no checkpoint was "
                                                 "written yet (--checkpoint-every 250): nothing to resume"), lines
    assert main([*TINY_TRAVELLER, "--out", str(tiny_run), "--resume"]) == 130  # a run with checkpoints: the last named
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("jax-scan-rnn train traveller: interrupted; every "
                                                                "completed checkpoint is kept, the last at step 2 "
                                                                "(continue with --resume)")
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(task_lib, "load", stopped)  # another command: nothing to resume, nothing said of it
    assert main(["evaluate", "traveller", "--checkpoint", str(tiny_run)]) == 130
    assert capsys.readouterr().err.strip() == "jax-scan-rnn evaluate traveller: interrupted"


@pytest.mark.parametrize("error", [MemoryError("Unable to allocate 41.4 GiB for an array"),
                                   RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 640000000000 bytes.")])
def test_out_of_memory_is_one_line_and_exit_1(monkeypatch, tmp_path, capsys, error):
    """NumPy's MemoryError and XLA's RESOURCE_EXHAUSTED (a size the checks before the work could not bound)."""
    from jax_scan_rnn.tasks import traveller as task_lib

    def too_large(*args, **kwargs):
        raise error

    monkeypatch.setattr(task_lib, "train", too_large)
    assert main([*TINY_TRAVELLER, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"jax-scan-rnn train traveller: error: out of memory ({error}); choose smaller sizes "
                   "(--help lists them)")


def test_evaluate_on_a_held_out_market_too_large_for_memory_is_refused(tiny_run, capsys):
    assert main(["evaluate", "traveller", "--checkpoint", str(tiny_run), "--paths", "100000000", "--horizon",
                 "100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the simulated held-out market (--paths x --horizon): needs about" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, message", [
    (["train", "traveller", "--dropout", "nan"], "argument --dropout: expected a finite number in [0, 1), got nan"),
    (["train", "traveller", "--clip-norm", "nan"], "argument --clip-norm: expected none or a finite number > 0, got nan"),
    (["train", "vae", "--limit", "-3"], "argument --limit: expected none or an int >= 1, got -3"),
    (["train", "vae", "--limit", "many"], "argument --limit: expected none or an int >= 1, got many"),
    (["train", "vae", "--max-beta", "nan"], "argument --max-beta: expected a finite number >= 0, got nan"),
    (["train", "vae", "--free-bits", "-1"], "argument --free-bits: expected a finite number >= 0, got -1"),
    (["train", "vae", "--decoding", "scheduled", "--ss-max", "inf"],
     "argument --ss-max: expected a finite number in [0, 1], got inf"),
    (["train", "vae", "--decoding", "free"], "argument --decoding: expected one of 'teacher', 'scheduled', got free"),
    (["train", "vae", "--ss-midpoint", "2"], "argument --ss-midpoint: expected an int >= 3, got 2"),
    (["train", "traveller", "--keep-checkpoints", "0"], "argument --keep-checkpoints: expected an int >= 1, got 0"),
])
def test_float_options_are_checked_before_any_work(argv, message, tmp_path, capsys):
    """The checks the task and TrainConfig dataclasses run, applied by argparse (options.py): exit 2, one line."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(out)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]
    assert not out.exists()


def test_probes_through_the_installed_cli_as_a_user_runs_it(tmp_path):
    """Issue 17's CLI findings, each in a real process: exit code, one line naming the flag or file, and
    nothing written where nothing should be."""
    small = tmp_path / "small.smi"
    small.write_text("CCO\nc1ccccc1\nnot-a-molecule\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me\n")
    probes = [  # (argv, exit code, text in the one line[, JAX_PLATFORMS])
        (["train", "traveller", "--lr", "1e300", *TINY_TRAVELLER[2:], "--out", str(tmp_path / "lr")], 1,
         "non-finite parameters or optimizer state after the update at step 1"),
        # JAX's own errors, a traceback without the CLI's line: a RuntimeError for an unknown platform, and for
        # cuda without JAX's CUDA build an AssertionError (jax 0.10)
        (["train", "traveller", *TINY_TRAVELLER[2:], "--out", str(tmp_path / "cpux")], 2,
         "JAX_PLATFORMS='cpux': JAX could not start it (Unable to initialize backend 'cpux'", "cpux"),
        *[(argv, 2, "JAX_PLATFORMS='cuda': JAX could not start it", "cuda")
          for argv in (["info"], ["check", "--steps", "2"])
          if not any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))],
        # started by an array operation (not a device query): JAX raises it again from its dispatch, its
        # xla_bridge frames cut
        (["check", "--steps", "2"], 2, "JAX_PLATFORMS='cpux': JAX could not start it (Unable to initialize", "cpux"),
        (["sample", "vae", "--checkpoint", str(tmp_path), "--temperature", "0"], 2,
         "argument --temperature: expected a finite number > 0, got 0"),
        (["train", "vae", "--data", str(small), "--out", str(tmp_path / "vae")], 2, f"--data {small}: holds 2 usable"),
        (["train", "traveller", *TINY_TRAVELLER[2:], "--out", str(a_file)], 2,
         f"--out: expected a directory, got the file {a_file}"),
    ]
    for argv, code, text, *platforms in probes:
        env = {**os.environ, "JAX_PLATFORMS": platforms[0]} if platforms else None
        result = subprocess.run([sys.executable, "-m", "jax_scan_rnn.cli", *argv], capture_output=True, text=True,
                                timeout=300, env=env)
        lines = [line for line in result.stderr.splitlines() if line.strip() and "%|" not in line]
        assert result.returncode == code, (argv, result.stderr[-2000:])
        assert text in lines[-1], (argv, lines)
    assert a_file.read_text() == "keep me\n"
    assert not (tmp_path / "vae").exists() and not (tmp_path / "cpux").exists()
    assert not list((tmp_path / "lr" / "checkpoints").glob("step_*"))


def test_every_command_shows_a_line_at_once_on_a_terminal():
    """At a terminal the first line comes before JAX is imported (seconds on a loaded 2-core machine); piped
    output stays clean (an error is still one line)."""
    import os
    import pty
    import time

    leader, follower = pty.openpty()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jax_scan_rnn.cli", "info"], stdout=subprocess.DEVNULL,
                            stderr=follower)
    os.close(follower)
    try:
        first = os.read(leader, 200).decode()
        seconds = time.perf_counter() - start
    finally:
        proc.wait(timeout=120)
        os.close(leader)
    assert first.startswith("jax-scan-rnn info: starting"), first
    assert seconds < STARTUP_BUDGET_S + 1.0  # interpreter start + argparse; JAX not yet imported


def stderr_at_a_terminal(argv: list[str]) -> str:
    """What `python -m jax_scan_rnn ARGV` writes to a stderr that is a terminal (a pseudo-terminal)."""
    import pty

    leader, follower = pty.openpty()
    subprocess.run([sys.executable, "-m", "jax_scan_rnn", *argv], stderr=follower, stdout=subprocess.DEVNULL,
                   timeout=120)
    os.close(follower)
    chunks = []
    with contextlib.suppress(OSError):  # Linux: EIO once the follower is closed and all is read
        while chunk := os.read(leader, 4096):
            chunks.append(chunk)
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_at_a_terminal_the_jax_notice_comes_only_when_jax_loads(tmp_path):
    """The notice "starting (loading JAX)..." tells a person that the seconds of JAX's import are work; a command
    refused before any work (a mistyped --checkpoint) printed it all the same, above its one line."""
    nowhere = stderr_at_a_terminal(["sample", "vae", "--checkpoint", str(tmp_path / "nowhere")])
    assert nowhere.splitlines() == [f"jax-scan-rnn sample vae: error: --checkpoint: expected a training output "
                                    f"directory (train's --out), got {tmp_path / 'nowhere'}"]
    (tmp_path / "checkpoints").mkdir()  # a run stopped before its first save: found by reading it, with JAX
    empty = stderr_at_a_terminal(["sample", "vae", "--checkpoint", str(tmp_path)])
    assert empty.splitlines() == ["jax-scan-rnn sample vae: starting (loading JAX)...",
                                  f"jax-scan-rnn sample vae: error: --checkpoint {tmp_path}: holds no committed "
                                  "checkpoint (training stopped before its first save?)"]


def test_the_cli_cache_folders_and_how_to_turn_them_off():
    from jax_scan_rnn.xla_flags import CACHE_ENV, DATA_CACHE_ENV, cli_compilation_cache, cli_data_cache

    assert cli_compilation_cache({"XDG_CACHE_HOME": "/c"}) == "/c/jax-scan-rnn/xla"
    assert cli_compilation_cache({CACHE_ENV: "/mine", "XDG_CACHE_HOME": "/c"}) == "/mine"
    for off in ("0", "off", "false"):
        assert cli_compilation_cache({CACHE_ENV: off}) is None
    assert cli_compilation_cache({"JAX_COMPILATION_CACHE_DIR": "/theirs"}) is None  # JAX uses the user's own
    assert cli_data_cache({"XDG_CACHE_HOME": "/c"}) == "/c/jax-scan-rnn/data"
    assert cli_data_cache({DATA_CACHE_ENV: "/mine", CACHE_ENV: "0"}) == "/mine"  # each turned off on its own
    for off in ("0", "off", "false"):
        assert cli_data_cache({DATA_CACHE_ENV: off, CACHE_ENV: "/programs"}) is None
    assert cli_data_cache({"JAX_COMPILATION_CACHE_DIR": "/theirs", "XDG_CACHE_HOME": "/c"}) == "/c/jax-scan-rnn/data"


@pytest.mark.parametrize("command", ["train", "evaluate", "encode"])
def test_the_vae_commands_read_their_data_through_the_cli_data_cache(command, monkeypatch, tmp_path):
    """`train vae`, `evaluate vae` (`load_dataset`) and `encode vae` (`latents`) get the CLI's data cache, where the
    Kekulé forms of their molecules are kept (MOSES's 300,000: ~50 s to convert on 2 cores, under a second to read
    back)."""
    from jax_scan_rnn import cli
    from jax_scan_rnn.data.smiles import Vocabulary
    from jax_scan_rnn.tasks import vae as task_lib

    given = []

    def read(*args, cache=None):
        given.append(cache)
        raise ValueError("--data: read no further")

    monkeypatch.setattr(task_lib, "load_dataset", read)
    monkeypatch.setattr(task_lib, "latents", read)
    monkeypatch.setenv("JAX_SCAN_RNN_DATA_CACHE", str(tmp_path / "forms"))
    # a run to read, without training one: the model of a default task, step 3
    task, vocab = task_lib.VAETask(data="rdkit"), Vocabulary.build(["CCO"])
    model = types.SimpleNamespace(eval=lambda: None)  # what the commands call before reading
    monkeypatch.setattr(cli, "load_run", lambda args, name: (model, vocab, task, 3))
    monkeypatch.setattr(cli, "vae_data_file", lambda task: None)
    (tmp_path / "mols.smi").write_text("CCO\n")
    argv = {"train": ["train", "vae", "--data", "rdkit", "--out", str(tmp_path / "run")],
            "evaluate": ["evaluate", "vae", "--checkpoint", str(tmp_path / "run")],
            "encode": ["encode", "vae", "--checkpoint", str(tmp_path / "run"), "--input", str(tmp_path / "mols.smi"),
                       "--output", str(tmp_path / "latents.npz")]}[command]
    assert main(argv) == 2
    assert given == [str(tmp_path / "forms")]


def test_a_data_cache_folder_that_cannot_be_made_is_one_note_and_the_molecules_are_converted(monkeypatch, tmp_path,
                                                                                            capsys):
    from jax_scan_rnn.tasks import vae as task_lib

    given = []

    def load_dataset(task, vocab=None, *, cache=None):
        given.append(cache)
        raise ValueError("--data: read no further")

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(task_lib, "load_dataset", load_dataset)
    monkeypatch.setenv("JAX_SCAN_RNN_DATA_CACHE", str(blocker / "forms"))
    assert main(["train", "vae", "--data", "rdkit", "--out", str(tmp_path / "run")]) == 2
    assert given == [None]
    notes = [line for line in capsys.readouterr().err.splitlines() if "data cache" in line]
    assert notes == [f"jax-scan-rnn train vae: note: data cache off: cannot create {blocker}/forms (Not a directory); "
                     "JAX_SCAN_RNN_DATA_CACHE=DIR moves it, =0 turns it off"], notes


def test_every_command_but_bench_uses_the_compilation_cache(monkeypatch):
    from jax_scan_rnn import cli, xla_flags

    used = []
    monkeypatch.setattr(xla_flags, "use_cli_compilation_cache", lambda: used.append(True))
    for name in ("bench", "info"):
        monkeypatch.setitem(cli.COMMANDS, name, lambda args: 0)
        used.clear()
        assert main([name]) == 0
        assert used == ([] if name == "bench" else [True]), name  # the benchmark times compiles


def test_a_cache_folder_that_cannot_be_made_is_one_note_and_the_command_runs(monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)  # pytest's own cache (conftest.py)
    monkeypatch.delenv("JAX_SCAN_RNN_COMPILATION_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the folder would be inside a file
    assert main(["info"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"jax-scan-rnn info: note: compilation cache off: cannot create "
                                               f"{blocker}/jax-scan-rnn/xla"), err


CACHED_RUNS = """
import os, sys
from jax_scan_rnn.cli import main

folder, out = sys.argv[1], sys.argv[2]
argv = ["train", "traveller", "--steps", "2", "--hidden-size", "4", "--num-layers", "1", "--batch-size", "4",
        "--seq-len", "8", "--eval-every", "0"]
# JAX not imported yet, as in a fresh `jax-scan-rnn` process: the cache's settings go through the environment
assert "jax" not in sys.modules
assert main([*argv, "--out", out + "/a"]) == 0
kept = len([f for f in os.listdir(folder) if f.endswith("-cache")])
import jax

hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None)
jax.clear_caches()  # as a new process starts: nothing compiled in memory
assert main([*argv, "--out", out + "/b"]) == 0  # (JAX imported: through jax.config)
print("CACHE", kept, len(hits))
"""


def test_a_second_run_loads_its_programs_from_the_cli_cache(tmp_path):
    """The CLI's default cache (no JAX_COMPILATION_CACHE_DIR, as pytest sets for itself): a second training
    of the same model loads every program the first one kept (those that took over CLI_CACHE_MIN_COMPILE_S
    to compile: the train step, the evaluation) instead of compiling it again."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env.pop("JAX_SCAN_RNN_COMPILATION_CACHE", None)
    folder = tmp_path / "xdg" / "jax-scan-rnn" / "xla"
    result = subprocess.run([sys.executable, "-c", CACHED_RUNS, str(folder), str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    kept, hits = map(int, result.stdout.split("CACHE")[1].split())
    assert kept >= 2 and hits >= kept, result.stdout[-500:]


def test_an_output_is_refused_when_it_is_an_input_however_the_paths_are_written(tmp_path, monkeypatch):
    # One file spelled two ways (relative and absolute, with '..', through a symlink) is still one file.
    from jax_scan_rnn.cli import refuse_an_input

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "prices.csv").write_text("x\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "prices.csv")
    for output, data in (("prices.csv", str(tmp_path / "prices.csv")), (str(tmp_path / "prices.csv"), "prices.csv"),
                         ("sub/../prices.csv", "./prices.csv"), ("link.csv", "prices.csv")):
        with pytest.raises(ValueError, match=f"^--output: expected another file than --data, got {output} for both$"):
            refuse_an_input(output, "--output", {"--data": data, "--initial-state": None})
    refuse_an_input("sub/prices.csv", "--output", {"--data": "prices.csv"})  # another file: allowed
    refuse_an_input(None, "--output", {"--data": "prices.csv"})


@pytest.mark.parametrize("text", ["none", "None", "NONE"])
def test_none_is_read_in_any_case_where_an_option_takes_it(text):
    from jax_scan_rnn.cli import build_parser

    argv = ["train", "vae", "--limit", text, "--clip-norm", text]
    args = build_parser(argv).parse_args(argv)
    assert (args.limit, args.clip_norm) == (None, None)


def test_ctrl_c_while_the_parser_imports_jax_is_one_line(monkeypatch, capsys):
    """`train traveller`'s options come from its task, whose module imports JAX: seconds before any command runs,
    where a Ctrl-C gave a page of import traceback."""
    from jax_scan_rnn import cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    try:
        code = cli.main(["train", "traveller"])
    except KeyboardInterrupt:  # a failure of this test, not an interrupt of the whole session
        pytest.fail("main let the KeyboardInterrupt out")
    assert code == 130
    assert capsys.readouterr().err == "\njax-scan-rnn: interrupted\n"


def test_what_an_interrupted_training_keeps_names_its_newest_checkpoint(tmp_path):
    import argparse

    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.cli import kept

    for step in (1, 2, 3):
        checkpoint.save(tmp_path / "run" / "checkpoints", step, {"w": np.ones(2)})
    said = kept(argparse.Namespace(command="train", out=str(tmp_path / "run"), checkpoint_every=1))
    assert said == "every completed checkpoint is kept, the last at step 3 (continue with --resume)"
    # Ctrl-C in the save of step 4, after orbax's commit, before the manifest: step 4 is not one resume can use.
    checkpoint.save(tmp_path / "run" / "checkpoints", 4, {"w": np.ones(2)})
    (checkpoint.step_path(tmp_path / "run" / "checkpoints", 4) / checkpoint.MANIFEST).unlink()
    said = kept(argparse.Namespace(command="train", out=str(tmp_path / "run"), checkpoint_every=1))
    assert said == "every completed checkpoint is kept, the last at step 3 (continue with --resume)"


def test_a_resumed_runs_data_change_is_named_by_what_moved():
    from jax_scan_rnn.cli import data_change

    saved = {"num_steps": 400, "train_end": 280, "valid_end": 340, "asset_names": ["a"], "mean": [0.0]}
    assert data_change(saved, dict(saved)) is None
    assert data_change(saved, {**saved, "num_steps": 420}) == "steps per path 400 -> 420"
    assert data_change(saved, {**saved, "train_end": 260}) == "training steps 280 -> 260"
    assert data_change(saved, {**saved, "asset_names": ["b"]}) == "assets ['a'] -> ['b']"
    assert data_change(saved, {**saved, "mean": [0.5]}) == "its training period's mean, std or covariance"
    # A run saved before the data's digest: compared on its statistics alone, not changed for lacking one.
    assert data_change(saved, {**saved, "data_sha256": "ab"}) is None
    digested = {**saved, "data_sha256": "ab"}
    assert data_change(digested, {**saved, "data_sha256": "cd"}) == ("its values (sha256), though not the training "
                                                                    "period's mean, std or covariance")


def test_the_progress_bar_says_when_a_resumed_runs_metrics_changed(capsys):
    # fit resumes a run whose checkpoint logged other metrics (a newer version of a task) with a fresh log window:
    # the CLI says so on stderr.
    from jax_scan_rnn.cli import ProgressBar

    with ProgressBar() as bar:
        bar({"event": "metrics_changed", "path": "/runs/a", "saved": ["acc"], "now": ["acc", "kl"]})
    assert "the run in /runs/a logged the metrics ['acc'], this version ['acc', 'kl']" in capsys.readouterr().err


def test_the_progress_bars_notes_start_a_line_of_their_own(capsys):
    # A note during training (a plot not drawn, a checkpoint skipped) goes through tqdm while the bar is up: a plain
    # print went onto the bar's own line ("83%|####  | 25/30 [...]run/curves.png not drawn: ...").
    from jax_scan_rnn.cli import ProgressBar

    with ProgressBar() as bar:
        bar({"event": "start", "steps": 30, "step": 0, "resumed_from": None})
        bar({"event": "log", "step": 25, "loss": 0.5})
        bar({"event": "plot_skipped", "path": "run/curves.png", "reason": "matplotlib is not installed"})
    before, found, _ = capsys.readouterr().err.partition("run/curves.png not drawn: matplotlib is not installed\n")
    assert found and before.endswith(("\r", "\n")), repr(before[-80:])



@pytest.mark.parametrize("event, line", [
    ({"event": "checkpoint_skipped", "step": 20, "reason": "a file is missing", "moved_to": "run/ckpt/bad_20"},
     "skipped invalid checkpoint 20: a file is missing; kept as run/ckpt/bad_20\n"),
    ({"event": "metrics_changed", "path": "run", "saved": ["acc"], "now": ["acc", "kl"]},
     "the run in run logged the metrics ['acc'], this version ['acc', 'kl']: the first train row after the resume "
     "covers the updates after it only\n"),
    ({"event": "environment_changed", "path": "run",
      "fields": {"jax": ["0.9.0", "0.10.2"], "jax_enable_x64": [False, True]}},
     "the run in run was saved under another environment (jax '0.9.0' -> '0.10.2'; jax_enable_x64 False -> True): it "
     "goes on, but not bit for bit as the uninterrupted run would have\n"),
    ({"event": "checkpoint_stray_files", "step": 20, "files": ["x.tmp"], "path": "run/ckpt/step_20"},
     "checkpoint 20 holds files it did not write (left alone, not read): x.tmp in run/ckpt/step_20\n"),
])
def test_every_note_of_the_progress_bar_starts_a_line_of_its_own(capsys, event, line):
    # as the plot's note above: each of the bar's notes goes through tqdm, none onto the bar's line
    from jax_scan_rnn.cli import ProgressBar

    with ProgressBar() as bar:
        bar({"event": "start", "steps": 30, "step": 0, "resumed_from": None})
        bar({"event": "log", "step": 25, "loss": 0.5})
        bar(event)
    before, found, _ = capsys.readouterr().err.partition(line)
    assert found and before.endswith(("\r", "\n")), repr(before[-80:])

def test_a_library_warning_is_one_line_naming_the_command(monkeypatch, capsys):
    # (a price column given as returns): not Python's two lines naming a source line of the package; the caller's
    # warning display is put back after.
    import warnings

    import jax_scan_rnn.cli as cli

    def warns(args):
        warnings.warn("prices.csv: column 'p' looks like prices, not returns", UserWarning)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "info", warns)
    before = warnings.showwarning
    assert cli.main(["info"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == ("jax-scan-rnn info: warning: prices.csv: column 'p' looks like "
                                                        "prices, not returns")
    assert warnings.showwarning is before

    # One that names an option's field names its flag; a field the command has no option for stays as written.
    def names(args):
        warnings.warn("init_from: model.pt's model was trained on the simulated market", UserWarning)
        warnings.warn("state_dict: values cast to the module's parameter dtype", UserWarning)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "train traveller", names)
    assert cli.main(["train", "traveller"]) == 0
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "jax-scan-rnn train traveller: warning: --init-from: model.pt's model was trained on the simulated market",
        "jax-scan-rnn train traveller: warning: state_dict: values cast to the module's parameter dtype"]


def test_a_message_is_flagged_with_only_when_every_field_it_names_is_an_option():
    # "a, b: ..." names two: with `only` (the command's options) it becomes "--a, --b: ..." when both are options,
    # and stays as written when one is not (state_dict is load_torch_state_dict's argument, no flag).
    from jax_scan_rnn.cli import flagged

    assert flagged("init_from, seed: do not match", only={"init_from", "seed"}) == "--init-from, --seed: do not match"
    assert flagged("init_from, state_dict: do not match", only={"init_from", "seed"}) == (
        "init_from, state_dict: do not match")

def test_flag_names_keeps_an_error_whose_constructor_takes_more():
    # UnicodeDecodeError is a ValueError that cannot be built from a message: it stays a ValueError with its own
    # message (a one-line error), not "function takes exactly 5 arguments (1 given)".
    from jax_scan_rnn.cli import flag_names

    with pytest.raises(ValueError, match=r"^'utf-8' codec can't decode byte 0xe9 in position 0"):
        with flag_names():
            b"\xe9".decode("utf-8")


@pytest.mark.parametrize("argv, fields", [([], {}), (["--steps", "200", "--lr", "0.01"], {"steps": 200,
                                                                                         "learning_rate": 0.01}),
                                          (["--warmup-steps", "3"], {"warmup_steps": 3})])
def test_command_config_is_the_clis_train_config(argv, fields):
    # A run in Python that takes train traveller's TrainConfig trains as the command does (TrainConfig() alone
    # has no warm-up and other intervals: the same run gave other numbers).
    from jax_scan_rnn.cli import build_parser, train_config
    from jax_scan_rnn.tasks.traveller import TRAIN_DEFAULTS
    from jax_scan_rnn.train import TrainConfig, command_config

    words = ["train", "traveller", *argv]
    assert train_config(build_parser(words).parse_args(words)) == command_config(TRAIN_DEFAULTS, **fields)
    assert command_config(TRAIN_DEFAULTS) != TrainConfig(**TRAIN_DEFAULTS)
    # The warm-up when not given: a tenth of the updates, at most 100.
    assert [command_config({}, steps=n).warmup_steps for n in (5, 200, 1000, 5000)] == [0, 20, 100, 100]


def test_an_export_named_for_the_other_format_is_refused(tiny_run, tmp_path, capsys):
    # --init-from and every reader take the format from the suffix: a safetensors file named .pt could not be read
    # back by the command's own --init-from (torch's 6-line unpickling error).
    for fmt, name, wanted in (("safetensors", "w.pt", ".safetensors"), ("torch", "w", ".pt or .pth"),
                              ("torch", "w.safetensors", ".pt or .pth")):
        assert main(["export", "traveller", "--checkpoint", str(tiny_run), "--format", fmt, "--output",
                     str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"--output: expected a {wanted} file for --format {fmt}, got {tmp_path / name}"), err
    assert not list(tmp_path.iterdir())
    assert main(["export", "traveller", "--checkpoint", str(tiny_run), "--format", "torch", "--output",
                 str(tmp_path / "W.PT")]) == 0


def test_a_state_dict_file_is_read_as_what_it_holds(tmp_path):
    # A safetensors file named .pt (written before exports checked the suffix, or by hand) is read as one; a whole
    # pickled module is named as such, in one line, not torch's advice to pass weights_only=False.
    torch = pytest.importorskip("torch")
    from jax_scan_rnn.convert import read_state_dict_file, save_safetensors

    save_safetensors({"w": np.arange(3, dtype=np.float32)}, tmp_path / "w.safetensors")
    (tmp_path / "w.safetensors").rename(tmp_path / "w.pt")
    assert read_state_dict_file(tmp_path / "w.pt")["w"].tolist() == [0.0, 1.0, 2.0]
    (tmp_path / "w.pt").rename(tmp_path / "W.SAFETENSORS")  # a suffix in capitals (a Windows user's) is the same
    assert read_state_dict_file(tmp_path / "W.SAFETENSORS")["w"].tolist() == [0.0, 1.0, 2.0]
    torch.save({"w": torch.ones(2)}, tmp_path / "t.safetensors")  # torch's file named .safetensors: read as torch's
    assert read_state_dict_file(tmp_path / "t.safetensors")["w"].tolist() == [1.0, 1.0]
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    with pytest.raises(ValueError) as err:
        read_state_dict_file(tmp_path / "module.pt", "init_from")
    assert str(err.value) == (f"init_from: {tmp_path / 'module.pt'} holds pickled Python objects (a whole module saved "
                              "with torch.save(model)?), not a state_dict of tensors: save model.state_dict() instead")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file at all")
    with pytest.raises(ValueError, match=r"^init_from: .*junk.pt is not a readable torch state_dict \([A-Za-z]+Error: "
                                         r"[^\n]*\)$"):
        read_state_dict_file(tmp_path / "junk.pt", "init_from")


def test_sigterm_stops_puts_back_a_handler_python_did_not_install(monkeypatch):
    # signal.signal returns None for a handler installed outside Python; giving None back raised TypeError at the
    # end of every training command, hiding its result.
    import signal

    from jax_scan_rnn.cli import sigterm_stops

    installed = []
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.append(handler))  # returns None
    with sigterm_stops() as asked:
        assert not asked()
    assert installed[-1] is signal.SIG_DFL
