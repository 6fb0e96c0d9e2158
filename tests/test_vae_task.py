"""The VAE training recipe and its CLI on a tiny corpus: schedules, exact batches, train/sample/evaluate."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from jax_scan_rnn.cli import main
from jax_scan_rnn.tasks import vae as task_lib

SMILES = ["C" * n + tail for n in range(1, 11) for tail in ("O", "N", "Cl", "Br", "S", "F", "C(=O)O", "c1ccccc1",
                                                         "N(C)C", "OC")]  # 100 distinct molecules


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "mols.smi"
    path.write_text("\n".join(SMILES) + "\n\n" + "C" * 200 + "\n")  # an empty and a too-long line: skipped
    return path


def tiny(corpus, **kw):
    return task_lib.VAETask(data=str(corpus), max_length=20, hidden_size=16, latent_size=4, batch_size=8,
                            eval_samples=20, eval_sequences=5, **kw)


def test_schedules_reach_their_midpoint_and_cap():
    for schedule in ("linear", "exponential", "inverse_sigmoid"):
        task = task_lib.VAETask(decoding="scheduled", ss_schedule=schedule, ss_midpoint=400, ss_max=1.0)
        assert task.replacement_probability(400) == pytest.approx(0.5, abs=1e-3), schedule
        assert task.replacement_probability(0) < 0.02  # inverse sigmoid starts at 1/(k+1)
    assert task_lib.VAETask(decoding="scheduled", ss_max=0.3).replacement_probability(10_000) == pytest.approx(0.3)
    assert task_lib.VAETask().replacement_probability(10_000) == 0.0  # teacher forcing is the default
    assert task_lib.VAETask(kl_warmup=100, max_beta=1.0).beta(50) == pytest.approx(0.5)


def test_batches_are_a_pure_function_of_the_step(corpus):
    task = tiny(corpus)
    batch_fn = task_lib.make_batch_fn(task, task_lib.load_dataset(task))
    a, b = batch_fn(7), batch_fn(7)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert a["tokens"].shape == (8, 21) and a["keys"].shape == (8, 2)


def test_bad_task_arguments():
    with pytest.raises(ValueError, match=r"decoding: expected one of \('teacher', 'scheduled'\), got 'free'"):
        task_lib.VAETask(decoding="free")
    with pytest.raises(ValueError, match="ss_max: expected a probability in"):
        task_lib.VAETask(ss_max=1.5)


def test_cli_train_sample_evaluate(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "vae", "--data", str(corpus), "--hidden-size", "16", "--latent-size", "4", "--batch-size", "8",
            "--decoding", "scheduled", "--ss-midpoint", "5", "--steps", "12", "--log-every", "4", "--eval-every", "0",
            "--checkpoint-every", "6", "--eval-samples", "20", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "skipped: empty 1, too_long 1" in printed
    assert "prior samples, sampled, T=1 (n=20)" in printed and "prior samples, greedy (n=20)" in printed
    assert "free-running (greedy)" in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train_rows] == [4, 8, 12]
    assert train_rows[-1]["metrics"]["p_replace"] > 0  # --decoding scheduled took effect
    report = json.loads((out / "evaluation.json").read_text())
    assert 0.0 <= report["samples"]["validity"] <= 1.0
    assert 0.0 <= report["samples_greedy"]["validity"] <= 1.0 and report["samples_greedy"]["n"] == 20

    assert main(["sample", "vae", "--checkpoint", str(out), "-n", "7", "--output", str(tmp_path / "s.txt")]) == 0
    assert len((tmp_path / "s.txt").read_text().splitlines()) == 7
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "10"]) == 0
    assert "prior samples, greedy (n=10)" in capsys.readouterr().out


@pytest.mark.slow  # exact resume is covered by tests/test_train.py; this checks the VAE's CLI wiring of it
def test_cli_resume_continues_the_run(corpus, tmp_path):
    out = tmp_path / "run"
    args = ["train", "vae", "--data", str(corpus), "--hidden-size", "8", "--latent-size", "2", "--batch-size", "8",
            "--log-every", "2", "--eval-every", "0", "--checkpoint-every", "4", "--eval-samples", "5", "--out", str(out)]
    assert main([*args, "--steps", "4"]) == 0
    assert main([*args, "--steps", "8", "--resume", "--override"]) == 0  # more steps: a changed option
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [2, 4, 6, 8]


def test_sample_missing_checkpoint_exits_2(tmp_path, capsys):
    assert main(["sample", "vae", "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "--checkpoint: expected a training output directory" in capsys.readouterr().err


def test_seed_reaches_initialisation_batch_order_and_noise(corpus):
    """The run's seed (`TrainConfig.seed`, the CLI's --seed) changes the initial weights and the batches;
    the same seed gives the same run."""
    from jax_scan_rnn.train import TrainConfig

    task = tiny(corpus, decoding="scheduled", ss_mode="gumbel_softmax")
    dataset = task_lib.load_dataset(task)
    a, b = task_lib.make_batch_fn(task, dataset, 0)(3), task_lib.make_batch_fn(task, dataset, 7)(3)
    assert not np.array_equal(a["keys"], b["keys"]) and not np.array_equal(a["tokens"], b["tokens"])

    def weights(seed):
        model, _, _ = task_lib.train(task, TrainConfig(steps=2, seed=seed, eval_every=0, log_every=1),
                                     dataset=dataset)
        return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))]

    same, other = weights(7), weights(0)
    np.testing.assert_array_equal(np.concatenate([w.ravel() for w in same]),
                                  np.concatenate([w.ravel() for w in weights(7)]))
    assert any(not np.array_equal(x, y) for x, y in zip(same, other))
