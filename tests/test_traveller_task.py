"""The Traveller training recipe and its CLI: learning, resume, evaluation, one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

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
    model, history = task_lib.train(TINY, TrainConfig(steps=60, learning_rate=1e-2, log_every=10, eval_every=60,
                                                      checkpoint_every=60), tmp_path)
    before = task_lib.evaluate(task_lib.build_model(TINY), TINY)["learned"]
    after = task_lib.evaluate(model, TINY)
    assert after["learned"] > before + 0.05, (before, after)
    loaded, task = task_lib.load(tmp_path)
    assert task == TINY
    assert task_lib.evaluate(loaded, task)["learned"] == pytest.approx(after["learned"], abs=1e-6)


def test_mse_objective_fits_the_optimal_policy():
    task = task_lib.TravellerTask(**{**TINY.__dict__, "objective": "mse"})
    model, history = task_lib.train(task, TrainConfig(steps=60, learning_rate=1e-2, log_every=10, eval_every=0,
                                                      checkpoint_every=0))
    _, losses = history.series("loss", "train")
    assert losses[-1] < 0.5 * losses[0]


def test_bad_task_arguments():
    with pytest.raises(ValueError, match="objective: expected one of \\('utility', 'mse'\\), got 'profit'"):
        task_lib.TravellerTask(objective="profit")
    with pytest.raises(ValueError, match="batch_size: expected at most train_paths=10, got 64"):
        task_lib.TravellerTask(train_paths=10)


def test_cli_train_resume_and_evaluate(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "traveller", "--hidden-size", "8", "--num-layers", "1", "--batch-size", "16", "--seq-len", "32",
            "--log-every", "5", "--eval-every", "0", "--checkpoint-every", "10", "--out", str(out)]
    assert main([*args, "--steps", "10"]) == 0
    assert main([*args, "--steps", "20", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "Traveller (learned)" in printed and "optimal (closed form)" in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [5, 10, 15, 20]
    assert (out / "positions.png").stat().st_size > 0
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--paths", "8", "--horizon", "50"]) == 0
    assert "8 held-out paths x 50 steps" in capsys.readouterr().out


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
    assert "out_dir: expected no checkpoints when resume=False" in capsys.readouterr().err
