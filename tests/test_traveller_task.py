"""The Traveller training recipe and its CLI: learning, resume, evaluation, one-line errors."""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest

import jax_scan_rnn as jsr
from jax_scan_rnn.cli import main
from jax_scan_rnn.tasks import traveller as task_lib
from jax_scan_rnn.train import TrainConfig

TINY = task_lib.TravellerTask(hidden_size=8, num_layers=1, batch_size=16, seq_len=32, train_paths=256,
                              eval_paths=32, eval_steps=64)


def test_batches_are_a_pure_function_of_the_step():
    batch_fn = task_lib.make_batch_fn(TINY)
    a, b, c = batch_fn(3), batch_fn(3), batch_fn(4)
    np.testing.assert_array_equal(a["features"], b["features"])
    assert not np.array_equal(a["features"], c["features"])
    assert a["features"].shape == (16, 32, 4) and a["returns"].shape == (16, 32, 2)


def test_short_training_improves_utility_and_reloads(tmp_path):
    model, history, _ = task_lib.train(TINY, TrainConfig(steps=60, learning_rate=1e-2, log_every=10, eval_every=60,
                                                      checkpoint_every=60), tmp_path)
    before = task_lib.evaluate(task_lib.build_model(TINY), TINY)["learned"]
    after = task_lib.evaluate(model, TINY)
    assert after["learned"] > before + 0.05, (before, after)
    loaded, task, stats = task_lib.load(tmp_path)
    assert stats is None  # the simulated market: nothing learned from data
    assert task == TINY
    assert task_lib.evaluate(loaded, task)["learned"] == pytest.approx(after["learned"], abs=1e-6)


def test_mse_objective_fits_the_optimal_policy():
    task = task_lib.TravellerTask(**{**TINY.__dict__, "objective": "mse"})
    model, history, _ = task_lib.train(task, TrainConfig(steps=60, learning_rate=1e-2, log_every=10, eval_every=0,
                                                      checkpoint_every=0))
    _, losses = history.series("loss", "train")
    assert losses[-1] < 0.5 * losses[0]


def test_bad_task_arguments():
    with pytest.raises(ValueError, match="^objective: expected one of 'utility', 'mse', got 'profit'$"):
        task_lib.TravellerTask(objective="profit")
    with pytest.raises(ValueError, match="batch_size: expected at most train_paths=10, got 64"):
        task_lib.TravellerTask(train_paths=10)
    with pytest.raises(ValueError, match=r"^dropout: expected a finite number in \[0, 1\), got 1.0$"):
        task_lib.TravellerTask(dropout=1.0)
    with pytest.raises(ValueError, match="^hidden_size: expected an int >= 1, got True$"):  # a bool is not a size
        task_lib.TravellerTask(hidden_size=True)


def test_cli_train_resume_and_evaluate(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "traveller", "--hidden-size", "8", "--num-layers", "1", "--batch-size", "16", "--seq-len", "32",
            "--log-every", "5", "--eval-every", "0", "--checkpoint-every", "10", "--out", str(out)]
    assert main([*args, "--steps", "10"]) == 0
    assert main([*args, "--steps", "20", "--resume", "--override"]) == 0  # more steps: a changed option
    printed = capsys.readouterr().out
    assert "Traveller (learned)" in printed and "optimal (closed form)" in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [5, 10, 15, 20]
    trained_plot = (out / "positions.png").read_bytes()
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--paths", "8", "--horizon", "50"]) == 0
    printed = capsys.readouterr().out
    assert "8 held-out paths x 50 steps" in printed and f"positions plot: {out / 'positions-step20.png'}" in printed
    # An evaluation of an earlier step writes its own plot: the one the run left is never replaced.
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--step", "10"]) == 0
    assert f"positions plot: {out / 'positions-step10.png'}" in capsys.readouterr().out
    assert (out / "positions.png").read_bytes() == trained_plot
    assert (out / "positions-step10.png").read_bytes() != (out / "positions-step20.png").read_bytes()
    # The usual slip, a step folder for --checkpoint: one line that says what to pass instead.
    step_folder = out / "checkpoints" / "step_00000010"
    assert step_folder.is_dir()
    assert main(["evaluate", "traveller", "--checkpoint", str(step_folder)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"pass --checkpoint {out} --step 10")


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    assert main(["evaluate", "traveller", "--checkpoint", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--checkpoint: expected a training output directory" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "traveller", "--steps", "0"])
    assert exit_info.value.code == 2
    out = tmp_path / "run"
    assert main(["train", "traveller", "--steps", "2", "--batch-size", "16", "--seq-len", "8", "--hidden-size", "4",
                 "--eval-every", "0", "--out", str(out)]) == 0
    capsys.readouterr()
    # A second run into the same directory without --resume must not silently mix runs.
    assert main(["train", "traveller", "--steps", "2", "--batch-size", "16", "--seq-len", "8", "--hidden-size", "4",
                 "--out", str(out)]) == 2
    assert f"--out: {out} already holds a run (checkpoints at steps [2]); pass --resume" in capsys.readouterr().err


def test_seed_reaches_the_run(tmp_path):
    """--seed is the run's one seed: the same seed gives the same weights, another seed other weights, and
    the checkpoint records the seed that was used."""
    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.cli import main

    def run(seed: int, name: str) -> dict:
        out = tmp_path / name
        argv = ["train", "traveller", "--steps", "3", "--hidden-size", "4", "--num-layers", "1", "--batch-size", "4",
                "--seq-len", "8", "--eval-every", "0", "--out", str(out), "--seed", str(seed)]
        assert main(argv) == 0
        model, _, _ = task_lib.load(out)
        assert checkpoint.read_metadata(out / "checkpoints")["seed"] == seed
        return jsr.torch_state_dict(model)

    a, b, c = run(7, "a"), run(7, "b"), run(0, "c")
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert any(not np.array_equal(a[key], c[key]) for key in a), "seeds 7 and 0 trained the same weights"


def test_an_update_that_overflows_is_never_kept_or_saved(tmp_path, capsys):
    """lr 1e300: step 1's loss and gradient are finite, its update is not. The guard stops at step 1, the
    model keeps its initial weights and no checkpoint holds a non-finite value."""
    from jax_scan_rnn import checkpoint

    out = tmp_path / "run"
    argv = ["train", "traveller", "--steps", "3", "--hidden-size", "4", "--num-layers", "1", "--batch-size", "4",
            "--seq-len", "8", "--eval-every", "0", "--checkpoint-every", "1", "--lr", "1e300", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "non-finite parameters or optimizer state after the update at step 1" in err
    assert "no checkpoint was written" in err
    assert checkpoint.steps(out / "checkpoints") == []


TINY_RUN = ["--steps", "2", "--hidden-size", "4", "--num-layers", "1", "--batch-size", "4", "--seq-len", "8",
            "--eval-every", "0"]


def test_a_second_process_on_the_same_out_is_refused_naming_the_holder(tmp_path):
    """Two real processes: while one holds --out, `train` there exits 2 with one line naming its PID and
    writes nothing; once the holder is gone (killed: the kernel drops its lock), training there works."""
    import subprocess
    import sys

    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("99999999999\n")  # left by an earlier holder whose PID had more digits
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom jax_scan_rnn.lock import run_lock\n"
         f"with run_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        cli = [sys.executable, "-m", "jax_scan_rnn.cli", "train", "traveller", *TINY_RUN, "--out", str(out)]
        second = subprocess.run(cli, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"another run (PID {holder.pid}) is writing to this directory" in lines[0], lines
        assert (out / ".lock").read_text() == f"{holder.pid}\n"  # the holder's PID alone: an older, longer one is gone
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    third = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    assert (out / "evaluation.json").exists()


def test_sigterm_checkpoints_the_step_reached_and_resume_continues(tmp_path):
    """A cluster preempts a job with SIGTERM: the run checkpoints the update it reached, says so in one line and exits
    143; the same command with --resume continues from there. (Before: killed at once, every update since the last
    checkpoint lost.)"""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cli = [sys.executable, "-m", "jax_scan_rnn.cli", "train", "traveller", "--steps", "100000", "--hidden-size", "4",
           "--num-layers", "1", "--batch-size", "4", "--seq-len", "8", "--eval-every", "0", "--log-every", "1",
           "--checkpoint-every", "0", "--out", str(out)]
    job = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().count("\n") >= 3):
            assert job.poll() is None and time.time() < deadline, "training did not start"
            time.sleep(0.2)
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 143, err
    line = err.strip().splitlines()[-1]
    step = int(re.search(r"stopped by SIGTERM at step (\d+);", line)[1])
    assert line == (f"jax-scan-rnn train traveller: stopped by SIGTERM at step {step}; checkpoint "
                    f"{out / 'checkpoints' / f'step_{step:08d}'} written: the same command with --resume continues "
                    "from it"), line
    assert (out / "checkpoints" / f"step_{step:08d}" / "MANIFEST.json").is_file()
    resumed = subprocess.run([*cli[:5], "--out", str(out), "--resume", "--steps", str(step + 2), "--override"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == step + 2


def test_a_file_system_without_locks_runs_unlocked(tmp_path, monkeypatch):
    """NFS without its lock daemon refuses flock (ENOLCK): the run goes ahead as where fcntl is missing, not a
    traceback; the same for the checkpoints' reader lock."""
    import errno

    from jax_scan_rnn import checkpoint, lock

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)  # the one fcntl module: checkpoint's too
    # Said, not silent: the README's "one run writes to a directory at a time" does not hold there. Once per
    # directory (the CLI holds it, then fit does).
    unlocked = f"{(tmp_path / 'run').resolve()}: not locked (its file system refuses locks " \
               f"({os.strerror(errno.ENOLCK)}))"
    with pytest.warns(lock.RunDirectoryUnlocked, match=re.escape(unlocked)) as said:
        with lock.run_lock(tmp_path / "run") as held, lock.run_lock(tmp_path / "run"):
            assert held == (tmp_path / "run").resolve() and lock._held == {}
            checkpoint.save(tmp_path / "run", 1, {"w": np.ones(2)})
            checkpoint.save(tmp_path / "run", 2, {"w": np.ones(2)}, keep=1)  # pruning: the exclusive reader lock
            assert checkpoint.restore(tmp_path / "run").step == 2
    assert len([w for w in said if w.category is lock.RunDirectoryUnlocked]) == 1


def test_a_finished_run_is_never_overwritten_and_bad_out_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "traveller", *TINY_RUN, "--out", str(out)]) == 0
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", "traveller", *TINY_RUN, "--out", str(out), "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert f"--out: {out} already holds a run (checkpoints at steps [2]); pass --resume" in err, err
    assert (out / "metrics.jsonl").read_text() == before
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["train", "traveller", *TINY_RUN, "--out", str(a_file)]) == 2
    assert f"--out: expected a directory, got the file {a_file}" in capsys.readouterr().err


def test_a_run_stopped_before_its_first_checkpoint_keeps_its_log(tmp_path, monkeypatch, capsys):
    """A Ctrl-C before the first checkpoint leaves the run's log: the next run into that --out is refused (the
    log is another run's data) unless --resume, which starts again from step 0 and says what it replaces."""
    out = tmp_path / "run"
    train = task_lib.train

    def stopped_after_a_log_row(*args, callback, **kwargs):
        def stop(event):
            callback(event)
            if event["event"] == "log":
                raise KeyboardInterrupt
        return train(*args, callback=stop, **kwargs)

    cmd = ["train", "traveller", *TINY_RUN, "--steps", "4", "--log-every", "1", "--out", str(out)]
    monkeypatch.setattr(task_lib, "train", stopped_after_a_log_row)
    assert main(cmd) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "jax-scan-rnn train traveller: interrupted; no checkpoint was written yet (--checkpoint-every 250): nothing "
        "to resume; its log is kept (metrics.jsonl: --resume there starts again from step 0)")
    monkeypatch.setattr(task_lib, "train", train)
    log = (out / "metrics.jsonl").read_text()
    assert json.loads(log.splitlines()[0])["step"] == 1
    assert main(cmd) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"jax-scan-rnn train traveller: error: --out: {out} already holds a run (the log of a run that "
                   f"left no checkpoint ({out / 'metrics.jsonl'}, to step 1)); pass --resume to continue "
                   "it, or choose another --out"), err
    assert (out / "metrics.jsonl").read_text() == log
    assert main([*cmd, "--resume"]) == 0
    assert (f"--resume: {out} holds no checkpoint yet: training from step 0 (replacing the log of a run that left "
            f"no checkpoint ({out / 'metrics.jsonl'}, to step 1))") in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4]


def test_resume_with_changed_settings_is_refused_unless_overridden(tmp_path, capsys):
    """--resume compares the saved options with the new ones: a change is named and refused (exit 2, the
    run untouched) unless --override, which prints the changes and continues."""
    out = tmp_path / "run"
    base = ["train", "traveller", "--steps", "2", "--hidden-size", "4", "--num-layers", "1", "--batch-size", "4",
            "--seq-len", "8", "--eval-every", "0", "--checkpoint-every", "1", "--out", str(out)]
    assert main([*base, "--resume"]) == 0  # nothing to resume yet: a fresh start, said (a requeued job's command)
    assert f"--resume: {out} holds no checkpoint yet: training from step 0" in capsys.readouterr().out
    shutil.rmtree(out)
    assert main(base) == 0
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    changed = [*base, "--resume", "--lr", "0.01", "--seq-len", "16", "--steps", "3"]
    assert main(changed) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    for change in ("--seq-len 8 -> 16", "--lr 0.003 -> 0.01", "--steps 2 -> 3"):
        assert change in err, err
    assert "--resume: the run in" in err and "add --override" in err, err
    assert (out / "metrics.jsonl").read_text() == before
    assert main([*changed, "--override"]) == 0
    assert "resuming with changed settings (--override): " in capsys.readouterr().out
    assert main([*base, "--resume"]) == 2  # step 3's checkpoint holds the overridden settings
    # Options not given are the run's own: `--out DIR --resume` alone continues the run as it was started.
    capsys.readouterr()
    assert main(["train", "traveller", "--out", str(out), "--resume", "--steps", "4", "--override"]) == 0
    said = capsys.readouterr().out
    assert ("--resume: the run's own settings where not given: --hidden-size 4, --num-layers 1, --batch-size 4, "
            "--seq-len 16, --lr 0.01, --eval-every 0, --checkpoint-every 1\n") in said, said
    assert "resuming with changed settings (--override): --steps 3 -> 4\n" in said, said  # the one option given
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 4 and (out / "checkpoints" / "step_00000004" / "MANIFEST.json").is_file()
    # A requeued job's --init-from: read when it started, not when it resumes (the checkpoint replaces it), said.
    weights = tmp_path / "w.safetensors"
    assert main(["export", "traveller", "--checkpoint", str(out), "--format", "safetensors", "--output", str(weights)]) == 0
    capsys.readouterr()
    assert main(["train", "traveller", "--out", str(out), "--resume", "--init-from", str(weights)]) == 0
    assert (f"jax-scan-rnn train traveller: note: --init-from {weights} is not read: --resume continues from the run's "
            f"checkpoint in {out}") in capsys.readouterr().err


def fit_arguments(monkeypatch) -> dict:
    """What `task_lib.train` hands to `fit` (the model, batch_fn, eval_fn, ...), with `fit` itself not run."""
    seen = {}

    def fake_fit(model, loss_fn, batch_fn, cfg, **kwargs):
        seen.update(model=model, batch_fn=batch_fn, cfg=cfg, **kwargs)

    monkeypatch.setattr(task_lib, "fit", fake_fit)
    return seen


def test_train_batches_by_the_runs_seed_and_scores_the_held_out_market(monkeypatch):
    """The wiring the weights alone do not show: the run's seed orders the batches (not only the initialisation),
    and evaluation scores the market drawn with eval_seed, never the training pool's data_seed."""
    from jax_scan_rnn.data import trading

    seen = fit_arguments(monkeypatch)
    task_lib.train(TINY, TrainConfig(steps=1, seed=7))
    first = seen["batch_fn"](0)["features"]
    np.testing.assert_array_equal(first, task_lib.make_batch_fn(TINY, 7)(0)["features"])
    assert not np.array_equal(first, task_lib.make_batch_fn(TINY, 0)(0)["features"])
    assert TINY.eval_seed != TINY.data_seed
    held_out = trading.simulate(TINY.market, TINY.eval_paths, TINY.eval_steps, seed=TINY.eval_seed)
    learned, _ = task_lib.positions(seen["model"], held_out.features)
    expected = trading.utility_table(TINY.market, held_out, learned)["learned"]
    assert seen["eval_fn"](seen["model"])["utility"] == pytest.approx(expected, rel=1e-6)


def test_a_run_saved_with_the_old_market_field_reads_its_risk_aversion_and_cost_scale():
    saved = task_lib.TravellerTask().to_json()
    for key in ("num_assets", "risk_aversion", "cost_scale"):
        saved.pop(key)
    task = task_lib.TravellerTask.from_json({**saved, "market": {"num_assets": 3, "gamma": 5.0, "lam": 7.0}})
    assert (task.num_assets, task.risk_aversion, task.cost_scale) == (3, 5.0, 7.0)


def test_a_run_saved_with_an_old_market_of_other_parameters_is_refused():
    # Runs of 2026-12-01 04:08-06:27 UTC saved the whole MarketConfig; its signal and noise parameters, which a
    # Python user could set, are no fields now: such a run is refused, not read as the default market's.
    import dataclasses

    from jax_scan_rnn.data import trading

    saved = task_lib.TravellerTask().to_json()
    market = {**dataclasses.asdict(trading.MarketConfig()), "phi_fast": 0.1}
    with pytest.raises(ValueError, match=r"^market: the run's market has \{'phi_fast': 0.1\}, which this version cannot "
                                         r"simulate \(only num_assets, gamma and lam are options now\); load it with"):
        task_lib.TravellerTask.from_json({**saved, "market": market})
    market["phi_fast"] = trading.MarketConfig().phi_fast  # the default market: read as before
    assert task_lib.TravellerTask.from_json({**saved, "market": market}).market == trading.MarketConfig()


def test_a_run_saved_by_a_newer_version_is_refused_naming_the_settings_it_does_not_know(tmp_path, monkeypatch,
                                                                                           capsys):
    # A newer jax-scan-rnn saves an option this one has no field for: reading past it would resume or evaluate
    # without a setting the run was trained with, and Python's own error ("unexpected keyword argument") does not
    # say why. One line naming the setting and the cure; the same for the data's statistics.
    saved = task_lib.TravellerTask().to_json()
    with pytest.raises(ValueError, match=r"^task: the run's saved settings hold 'signal_decay', which this version "
                                         r"does not know: it was written by another jax-scan-rnn than this one "
                                         rf"\({re.escape(jsr.__version__)}\); read it with that one \(pip install -U "
                                         r"jax-scan-rnn\)$"):
        task_lib.TravellerTask.from_json({**saved, "signal_decay": 0.5})
    stats = {"standardiser": {"mean": [0.0], "std": [1.0], "names": ["a"]},
             "objective": {"gamma": 1.0, "lam": 1.0, "Sigma": [[1.0]]}, "asset_names": ["a"], "train_end": 5,
             "valid_end": 6, "num_steps": 8}
    assert task_lib.DataStats.from_json(stats).train_end == 5
    with pytest.raises(ValueError, match=r"^data_stats: the run's saved settings hold 'winsorise'"):
        task_lib.DataStats.from_json({**stats, "winsorise": 3.0})
    # Through the CLI: a run whose checkpoint holds such a setting, evaluated and resumed by this version.
    out = tmp_path / "run"
    to_json = task_lib.TravellerTask.to_json
    monkeypatch.setattr(task_lib.TravellerTask, "to_json", lambda self: {**to_json(self), "signal_decay": 0.5})
    assert main(["train", "traveller", "--steps", "2", "--batch-size", "16", "--seq-len", "8", "--hidden-size", "4",
                 "--eval-every", "0", "--out", str(out)]) == 0
    monkeypatch.undo()
    capsys.readouterr()
    for argv in (["evaluate", "traveller", "--checkpoint", str(out)],
                 ["train", "traveller", "--steps", "4", "--out", str(out), "--resume"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the run's saved settings hold 'signal_decay'" in err, err
