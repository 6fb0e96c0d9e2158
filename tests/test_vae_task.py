"""The VAE training recipe and its CLI on a tiny corpus: schedules, exact batches, train/sample/evaluate."""
from __future__ import annotations

import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_scan_rnn import metrics
from jax_scan_rnn.cli import main
from jax_scan_rnn.data import smiles
from jax_scan_rnn.tasks import vae as task_lib

SMILES = ["C" * n + tail for n in range(1, 11) for tail in ("O", "N", "Cl", "Br", "S", "F", "C(=O)O", "c1ccccc1",
                                                         "N(C)C", "OC")]  # 100 distinct molecules


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "mols.smi"
    # An empty line, a too-long one and two that are not SMILES (an open ring, a non-element): skipped.
    path.write_text("\n".join(SMILES) + "\n\n" + "C" * 200 + "\nC1CC\nXyz\n")
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
    assert task_lib.VAETask(kl_schedule="sigmoid", kl_warmup=100, max_beta=1.0).beta(50) == pytest.approx(0.5)


def test_the_batch_of_step_s_carries_beta_s_and_the_digest_covers_every_split(corpus):
    task = tiny(corpus, kl_schedule="linear", kl_warmup=20, max_beta=1.0)
    dataset = task_lib.load_dataset(task)
    batch_fn = task_lib.make_batch_fn(task, dataset)
    for step in (0, 10, 30):  # step 0 of a linear warm-up: 0
        assert float(batch_fn(step)["beta"][0]) == np.float32(task.beta(step)), step
    # --resume refuses a run whose data changed: any split's molecules, not only the training ones.
    for changed in ({"valid": dataset.valid[1:]}, {"test": dataset.test[1:]}, {"train": dataset.train[1:]}):
        other = task_lib.Dataset(**{"vocab": dataset.vocab, "train": dataset.train, "valid": dataset.valid,
                                    "test": dataset.test, "skipped": {}, **changed})
        assert other.digest != dataset.digest, list(changed)


def test_batches_are_a_pure_function_of_the_step(corpus):
    task = tiny(corpus)
    batch_fn = task_lib.make_batch_fn(task, task_lib.load_dataset(task))
    a, b = batch_fn(7), batch_fn(7)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert a["tokens"].shape[0] == 8 and a["keys"].shape == (8, 2)
    # Random batches (--bucket-pool 0) are all as wide as the longest training sequence with its <eos>.
    random = tiny(corpus, bucket_pool=0, kekule=False)  # aromatic: the longest is 18 characters, under max_length
    dataset = task_lib.load_dataset(random)
    longest = max(len(s) for s in dataset.train) + 1
    widths = {task_lib.make_batch_fn(random, dataset)(s)["tokens"].shape for s in range(5)}
    assert longest < 21 and widths == {(8, longest)}


def test_bucketed_batches_are_cut_to_their_longest_with_the_same_loss(corpus):
    """--bucket-pool (default 100): a batch holds molecules of similar lengths and is cut to its longest row
    rounded up to 8 columns (at most max_length + 1); the loss is the one of the same rows padded to full width."""
    from dataclasses import replace

    task = tiny(corpus, kl_schedule="constant", max_beta=0.3, bucket_pool=100)
    dataset = task_lib.load_dataset(task)
    batch_fn = task_lib.make_batch_fn(task, dataset)
    widths = {batch_fn(step)["tokens"].shape[1] for step in range(40)}
    assert widths <= {8, 16, 21} and len(widths) > 1, widths
    assert task_lib.smiles.PAD == 0  # the padding added back below
    model, loss_fn = task_lib.build_model(task, dataset.vocab.size), task_lib.make_loss_fn(task)
    for step in [s for s in range(40) if batch_fn(s)["tokens"].shape[1] < 21][:2]:  # batches that were cut
        batch = batch_fn(step)
        w = batch["tokens"].shape[1]
        assert int(batch["lengths"].max()) <= w and (w == 21 or w % 8 == 0)
        padded = np.pad(batch["tokens"], ((0, 0), (0, 21 - w)))  # <pad> is id 0
        cut, full = loss_fn(model, batch)[1], loss_fn(model, {**batch, "tokens": padded})[1]
        for name in ("recon", "kl"):
            assert float(cut[name]) == pytest.approx(float(full[name]), rel=1e-5), (step, name)
    spread = np.mean([np.ptp(batch_fn(s)["lengths"]) for s in range(11)])  # 100 molecules, 11 batches an epoch
    plain = task_lib.make_batch_fn(replace(task, bucket_pool=0), dataset)
    assert spread < 0.5 * np.mean([np.ptp(plain(s)["lengths"]) for s in range(11)])


def test_latents_in_chunks_are_one_calls_and_skipped_molecules_are_counted(corpus, monkeypatch):
    task = tiny(corpus)
    vocab = smiles.Vocabulary.build(SMILES)
    model = task_lib.build_model(task, vocab.size)
    given = [SMILES[0], "C" * 21, "Xyz", SMILES[1], "[Na+]", SMILES[2]]
    whole = task_lib.latents(model, vocab, task, given)
    assert whole["skipped"] == {"too_long": 1, "unparsable": 1, "unseen_character": 1}
    assert list(whole["index"]) == [0, 3, 5] and whole["mu"].shape == whole["logvar"].shape == (3, task.latent_size)
    monkeypatch.setattr(task_lib, "ENCODE_CHUNK", 2)  # two calls, the second of one molecule
    chunked = task_lib.latents(model, vocab, task, given)
    for key in ("mu", "logvar"):
        np.testing.assert_allclose(chunked[key], whole[key], atol=1e-6, err_msg=key)  # other batch sizes' kernels
    from_a_generator = task_lib.latents(model, vocab, task, (s for s in given))  # any iterable, read once
    np.testing.assert_array_equal(from_a_generator["mu"], chunked["mu"])
    none = task_lib.latents(model, vocab, task, ["Xyz"])
    assert none["mu"].shape == (0, task.latent_size) and none["skipped"] == {"unparsable": 1}
    # One SMILES alone is refused: iterated, it would be encoded as one molecule per character.
    with pytest.raises(TypeError, match=r"^sequences: expected a list of strings, got a single str 'CCO' \(one "
                                        r"molecule is a list of one: \['CCO'\]\)$"):
        task_lib.latents(model, vocab, task, "CCO")


def test_bad_task_arguments():
    with pytest.raises(ValueError, match=r"^decoding: expected one of 'teacher', 'scheduled', got 'free'$"):
        task_lib.VAETask(decoding="free")
    with pytest.raises(ValueError, match=r"^ss_max: expected a finite number in \[0, 1\], got 1.5$"):
        task_lib.VAETask(ss_max=1.5)


# 27-35 s, and the default run's largest worker (+0.6 GiB within this one test): CI runs it in its slow step. The
# default run keeps the VAE CLI's option and file checks (tests/test_cli.py) and the task's training, which the
# CLI calls (`task_lib.train`, the saved-run test below).
@pytest.mark.slow
def test_cli_train_sample_evaluate(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.chdir(corpus.parent)  # --data as a relative path: saved absolute, evaluate reads it from elsewhere
    args = ["train", "vae", "--data", corpus.name, "--hidden-size", "16", "--latent-size", "4", "--batch-size", "8",
            "--decoding", "scheduled", "--ss-midpoint", "5", "--steps", "12", "--log-every", "4", "--eval-every", "0",
            "--checkpoint-every", "6", "--eval-samples", "20", "--decoder-hidden-size", "12", "--decoder-layers", "2",
            "--recon-reduction", "token", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "skipped: empty 1, unparsable 2, too_long 1" in printed
    assert "prior samples, sampled, T=1 (n=20)" in printed and "prior samples, greedy (n=20)" in printed
    assert printed.count("  unterminated ") == 2  # the samples cut at max_len, beside validity
    assert "free-running (greedy)" in printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train_rows] == [4, 8, 12]
    assert train_rows[-1]["metrics"]["p_replace"] > 0  # --decoding scheduled took effect
    report = json.loads((out / "evaluation.json").read_text())
    assert 0.0 <= report["samples"]["validity"] <= 1.0
    assert 0.0 <= report["samples_greedy"]["validity"] <= 1.0 and report["samples_greedy"]["n"] == 20

    model, _, saved = task_lib.load(out)  # the saved task rebuilds the model: the decoder's own size included
    assert (saved.decoder_hidden_size, saved.decoder_layers, saved.recon_reduction) == (12, 2, "token")
    assert (model.hidden_size, model.decoder_hidden_size, model.decoder_layers) == (16, 12, 2)
    assert saved.data == str(corpus)
    assert main(["sample", "vae", "--checkpoint", str(out), "-n", "7", "--output", str(tmp_path / "s.txt")]) == 0
    assert len((tmp_path / "s.txt").read_text().splitlines()) == 7
    check_encode_and_decode_given_latents(out, model, tmp_path, capsys)
    capsys.readouterr()
    before = corpus.read_bytes()
    for command in ("sample", "evaluate"):  # the samples or the report over the run's own molecules: refused
        assert main([command, "vae", "--checkpoint", str(out), "-n", "3", "--output", str(corpus)]) == 2
        assert capsys.readouterr().err.strip().endswith(f"--output: expected another file than the run's --data file, "
                                                        f"got {corpus} for both")
    assert corpus.read_bytes() == before
    monkeypatch.chdir(out)
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "10"]) == 0
    assert "prior samples, greedy (n=10)" in capsys.readouterr().out
    for command in ("sample", "evaluate"):  # more samples than memory holds: one line before the work, no crash
        assert main([command, "vae", "--checkpoint", str(out), "-n", "100000000000"]) == 2
        err = capsys.readouterr().err.strip()
        assert "the samples (-n): needs about" in err and len(err.splitlines()) == 1, err
    corpus.rename(tmp_path / "moved.smi")  # the run's data file gone: one line naming it, not a --data it never had
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "10"]) == 2
    assert f"--checkpoint: the run's data file {corpus} is gone" in capsys.readouterr().err
    (tmp_path / "moved.smi").rename(corpus)
    check_export_loads_into_torch_ref(out, model, tmp_path, capsys)
    # --metrics moses: MOSES's table, our row beside the published ones, saying what it compared against.
    pytest.importorskip("fcd_torch")
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "10", "--metrics", "moses", "--output",
                 str(tmp_path / "report.json")]) == 0
    printed = capsys.readouterr().out
    assert "MOSES VAE (published)" in printed and "MOSES CharRNN (published)" in printed
    assert "this run (T=1)" in printed and "Test metrics against" in printed
    row = json.loads((tmp_path / "report.json").read_text())["moses"]
    assert row["n_generated"] == 10 and 0.0 <= row["valid"] <= 1.0
    from importlib.util import find_spec

    if find_spec("moses") is not None:  # molsets installed (CI installs it): its test set, the default reference
        assert row["reference"].startswith("MOSES test set"), row["reference"]
    # --reference held-out: the run's own test split, whatever is installed (before, it was the reference only
    # when molsets was missing: the same command gave other numbers on another machine)
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "10", "--metrics", "moses", "--reference",
                 "held-out", "--output", str(tmp_path / "report.json")]) == 0
    row = json.loads((tmp_path / "report.json").read_text())["moses"]
    assert row["reference"].startswith("held-out split, n="), row["reference"]
    from jax_scan_rnn import metrics

    def no_molsets():
        raise ImportError("MOSES's data needs molsets, which is not installed")

    monkeypatch.setattr(metrics, "_moses_test_reference", no_molsets)  # the default reference without molsets:
    capsys.readouterr()  # one line before any sample is drawn, not the held-out split in its place
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "10", "--metrics", "moses"]) == 2
    printed = capsys.readouterr()
    assert printed.err == "jax-scan-rnn evaluate vae: error: MOSES's data needs molsets, which is not installed\n"
    assert "prior samples" not in printed.out
    assert main(["evaluate", "vae", "--checkpoint", str(out), "--reference", "held-out"]) == 2
    assert capsys.readouterr().err == ("jax-scan-rnn evaluate vae: error: --reference: expected only with --metrics "
                                       "moses (it picks the set MOSES's Test metrics compare with), got --metrics "
                                       "basic\n")


def check_encode_and_decode_given_latents(out, model, tmp_path, capsys):
    """`encode vae`: each readable line's posterior, as the model's own encoder gives it, with its line number;
    `sample vae --latents`: one sequence per row, the greedy one being the model's own greedy decoding of it."""
    molecules = tmp_path / "mine.smi"
    molecules.write_text(f"{SMILES[0]} first\n\nXyz\n{'C' * 500}\n{SMILES[1]}\n[Na+]\n")
    latents = tmp_path / "latents.npz"
    capsys.readouterr()
    assert main(["encode", "vae", "--checkpoint", str(out), "--input", str(molecules), "--output", str(latents)]) == 0
    assert "encoded 2 of 6 records (skipped: empty 1, unparsable 1, too_long 1, unseen_character 1)" in \
        capsys.readouterr().out
    with np.load(latents) as saved:
        assert list(saved["row"]) == [1, 5]
        _, _, task = task_lib.load(out)
        written = [smiles.kekule_forms([s])[0][0] for s in SMILES[:2]]  # as the run's molecules were written
        assert list(saved["smiles"]) == written
        mu, logvar = model.encode(*task_lib.encode(model_vocab(out), written, task.max_length))
        np.testing.assert_allclose(saved["mu"], mu, atol=1e-6)  # one jitted call against the eager one
        np.testing.assert_allclose(saved["logvar"], logvar, atol=1e-6)
        greedy = model_vocab(out).decode(np.asarray(model.generate(jnp.asarray(saved["mu"]), task.max_length + 1,
                                                                   mode="greedy")))
    decoded = tmp_path / "decoded.txt"
    assert main(["sample", "vae", "--checkpoint", str(out), "--latents", str(latents), "--greedy", "--output",
                 str(decoded)]) == 0
    assert decoded.read_text().splitlines() == greedy
    np.save(tmp_path / "z.npy", np.zeros((3, 4), np.float32))
    assert main(["sample", "vae", "--checkpoint", str(out), "--latents", str(tmp_path / "z.npy")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    # -n beside --latents: that many draws of each row, row 0's first, each row's the sampler's own from that latent.
    z = np.stack([np.zeros(4, np.float32), np.full(4, 3.0, np.float32)])
    np.save(tmp_path / "two.npy", z)
    assert main(["sample", "vae", "--checkpoint", str(out), "--latents", str(tmp_path / "two.npy"), "-n", "5",
                 "--seed", "3"]) == 0
    drawn = capsys.readouterr().out.splitlines()
    assert len(drawn) == 10
    assert drawn == task_lib.sample(model, model_vocab(out), 5, max_len=task.max_length + 1, seed=3, z=z)
    assert drawn == task_lib.sample(model, model_vocab(out), 1, max_len=task.max_length + 1, seed=3,
                                    z=np.repeat(z, 5, axis=0))  # row 0 five times, then row 1
    # From the prior: docs/cli.md's Python call (max_len counts the <eos>) gives `sample vae -n`'s molecules.
    assert main(["sample", "vae", "--checkpoint", str(out), "-n", "4", "--seed", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == task_lib.sample(model, model_vocab(out), 4,
                                                                   max_len=task.max_length + 1, seed=2,
                                                                   decoder_only=task.decoder_only)
    with pytest.raises(ValueError, match=r"^n: expected 1 with greedy decoding of given latents"):
        task_lib.sample(model, model_vocab(out), 2, max_len=8, greedy=True, z=z)
    np.save(tmp_path / "wide.npy", np.zeros((3, 5), np.float32))
    for argv, message in (
        (["--latents", str(latents), "-n", "3", "--greedy"], "-n: expected 1 with --latents and --greedy (greedy "
                                                             "decoding gives each latent one sequence), got 3"),
        (["--latents", str(tmp_path / "wide.npy")], "--latents: expected floating latents [N, 4] with N >= 1 (this "
                                                    "model's latent size), got float32 of shape (3, 5)"),
        (["--latents", str(molecules)], f"--latents: expected an .npz or .npy file of latents [N, 4], got {molecules}"),
        (["--latents", str(tmp_path / "none.npz")], f"--latents: no file at {tmp_path / 'none.npz'}"),
    ):
        assert main(["sample", "vae", "--checkpoint", str(out), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    # Latents of other weights (another step of the same run) decode into other molecules: refused, naming them.
    earlier = tmp_path / "step6.npz"
    assert main(["encode", "vae", "--checkpoint", str(out), "--step", "6", "--input", str(molecules), "--output",
                 str(earlier)]) == 0
    capsys.readouterr()
    assert main(["sample", "vae", "--checkpoint", str(out), "--latents", str(earlier)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--latents: {earlier} holds the latents of other weights (saved with " \
        f"--checkpoint {out.absolute()} --step 6; this --checkpoint's weights differ)" in err, err
    assert main(["sample", "vae", "--checkpoint", str(out), "--step", "6", "--latents", str(earlier), "--greedy"]) == 0
    (tmp_path / "bad.smi").write_text("Xyz\n")
    assert main(["encode", "vae", "--checkpoint", str(out), "--input", str(tmp_path / "bad.smi"), "--output",
                 str(tmp_path / "none.npz")]) == 2
    assert "--input: none of the 1 records of" in capsys.readouterr().err
    assert not (tmp_path / "none.npz").exists()
    # A table, as train vae's --data reads one: its smiles column, each row numbered among the data rows.
    (tmp_path / "mine.csv").write_text(f"name,SMILES,logP\na,{SMILES[2]},1.5\nb,,0\nc,{SMILES[3]},2\n")
    assert main(["encode", "vae", "--checkpoint", str(out), "--input", str(tmp_path / "mine.csv"), "--output",
                 str(latents)]) == 0
    assert "encoded 2 of 3 records (skipped: empty 1)" in capsys.readouterr().out
    with np.load(latents) as saved:
        assert list(saved["row"]) == [1, 3]
    (tmp_path / "plain.csv").write_text(f"name,logP\na,{SMILES[2]}\n")
    assert main(["encode", "vae", "--checkpoint", str(out), "--input", str(tmp_path / "plain.csv"), "--output",
                 str(latents)]) == 2
    assert "--input: expected a column named 'smiles' (in any case) in the header of" in capsys.readouterr().err


def model_vocab(out):
    return task_lib.load(out)[1]


# The export against the model it came from, float32 in both frameworks: the same sums in another order
# (parity_tests/test_vae_parity.py's float32 loss tolerance).
EXPORT_LOSS_RTOL = 1e-5


def check_export_loads_into_torch_ref(out, model, tmp_path, capsys):
    """`export vae`: torch_ref.SeqVAE built from FILE.json's arguments loads the state_dict (strict), and on molecules
    encoded with FILE.json's vocabulary gives the JAX model's loss; the side file never replaces a run's own."""
    torch = pytest.importorskip("torch")
    import torch_ref

    import jax_scan_rnn as jsr
    from jax_scan_rnn.data.smiles import Vocabulary

    target = tmp_path / "vae.pt"
    capsys.readouterr()
    assert main(["export", "vae", "--checkpoint", str(out), "--format", "torch", "--output", str(target)]) == 0
    assert "state_dict of torch_ref.SeqVAE(vocab_size=" in capsys.readouterr().out
    side = json.loads((tmp_path / "vae.pt.json").read_text())
    assert side["arguments"]["decoder_hidden_size"] == 12 and side["arguments"]["decoder_layers"] == 2
    twin = torch_ref.SeqVAE(**side["arguments"])
    twin.load_state_dict(torch.load(target, weights_only=True))  # strict: every key, nothing else
    vocab = Vocabulary.from_json(json.dumps(side["vocabulary"]))
    tokens, lengths = vocab.encode(SMILES[:6], side["max_length"])
    eps = np.zeros((6, side["arguments"]["latent_size"]), np.float32)
    with torch.no_grad():
        want = twin.loss(torch.from_numpy(tokens), torch.from_numpy(lengths), eps=torch.from_numpy(eps))
    got = model.loss(tokens, lengths, eps=eps)
    for key in ("recon", "kl"):
        w, g = float(want[key]), float(got[key])
        assert abs(g - w) <= EXPORT_LOSS_RTOL * max(1.0, abs(w)), f"loss[{key!r}]: {g!r} (jax) vs {w!r} (torch)"
    # And back (train vae --init-from): the same weights, bit for bit, under the same vocabulary.
    init = task_lib.InitFrom.read(target)
    _, _, task = task_lib.load(out)
    init.check(task)
    back = task_lib.build_model(task, init.vocab.size, seed=1)
    init.load_into(back)
    want = jsr.torch_state_dict(model)
    for key, value in jsr.torch_state_dict(back).items():
        np.testing.assert_array_equal(value, want[key], err_msg=key)
    before = (out / "evaluation.json").read_bytes()
    assert main(["export", "vae", "--checkpoint", str(out), "--format", "safetensors", "--output",
                 str(out / "evaluation")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--output (its side file): " in err and "belongs to the training run" in err and len(err.splitlines()) == 1
    assert (out / "evaluation.json").read_bytes() == before and not (out / "evaluation").exists()


def torch_twin_files(tmp_path, task, vocab):
    """A torch_ref.SeqVAE of `task`'s sizes saved as `export vae` saves one: FILE (the state_dict) and FILE.json."""
    torch = pytest.importorskip("torch")
    import torch_ref

    arguments = task_lib.model_arguments(task, vocab.size)
    torch.manual_seed(0)
    twin = torch_ref.SeqVAE(**arguments)
    path = tmp_path / "twin.pt"
    torch.save(twin.state_dict(), path)
    side = {"model": "torch_ref.SeqVAE", "arguments": arguments, "vocabulary": json.loads(vocab.to_json()),
            "kekule": task.writes_kekule}
    (tmp_path / "twin.pt.json").write_text(json.dumps(side))
    return twin, path


def test_init_from_a_torch_ref_vae_starts_there_and_reads_the_data_with_its_vocabulary(corpus, tmp_path, monkeypatch):
    from dataclasses import replace

    import jax_scan_rnn as jsr
    from jax_scan_rnn.data.smiles import Vocabulary
    from jax_scan_rnn.train import TrainConfig

    task = tiny(corpus)
    tokens = task_lib.load_dataset(task).vocab.tokens
    no_sulphur = Vocabulary(tuple(t for t in tokens if t != "S"))  # a model that never wrote an S
    twin, path = torch_twin_files(tmp_path, task, no_sulphur)
    started = {}
    monkeypatch.setattr(task_lib, "fit", lambda model, *args, metadata, **kwargs: started.update(model=model,
                                                                                               metadata=metadata))
    _, dataset, _ = task_lib.train(task, TrainConfig(steps=1), init_from=task_lib.InitFrom.read(path))
    assert dataset.vocab == no_sulphur
    assert not any("S" in s for s in dataset.train + dataset.valid + dataset.test)
    assert dataset.skipped["unseen_character"] == sum("S" in s for s in SMILES)  # 10: from train, valid and test
    got = jsr.torch_state_dict(started["model"])
    for key, value in twin.state_dict().items():
        np.testing.assert_array_equal(got[key], value.numpy(), err_msg=key)
    assert started["metadata"]["init_from"]["path"] == str(path)
    assert started["metadata"]["vocab"] == no_sulphur.to_json()
    # Another size, no side file, a broken side file: one error each, naming the file and what differs.
    with pytest.raises(ValueError, match=r"^init_from: .*twin.pt holds a model with hidden_size=16, latent_size=4; "
                                         r"this run's has hidden_size=32, latent_size=3: set them"):
        task_lib.train(replace(task, hidden_size=32, latent_size=3, decoder_hidden_size=16), TrainConfig(steps=1),
                       init_from=task_lib.InitFrom.read(path))
    side = json.loads((tmp_path / "twin.pt.json").read_text())
    (tmp_path / "twin.pt.json").write_text(json.dumps({**side, "kekule": not task.writes_kekule}))
    with pytest.raises(ValueError, match=r"^init_from: .*twin.pt holds a model that learnt molecules as written "
                                         r"\(aromatic\); this run writes them in Kekulé form: pass --no-kekule"):
        task_lib.InitFrom.read(path).check(task)
    (tmp_path / "twin.pt.json").write_text(json.dumps(side))
    torch = pytest.importorskip("torch")
    import torch_ref

    torch.save(torch_ref.SeqVAE(**{**side["arguments"], "hidden_size": 8}).state_dict(), path)  # not what it says
    with pytest.raises(ValueError, match=r"^init_from: .*twin.pt does not fit this model \(.*\); its sizes must "
                                         r"match the arguments in its side file"):
        task_lib.train(task, TrainConfig(steps=1), init_from=task_lib.InitFrom.read(path))
    (tmp_path / "twin.pt.json").rename(tmp_path / "elsewhere.json")
    with pytest.raises(FileNotFoundError, match=r"^init_from: no .*twin.pt.json beside .*twin.pt: the model's "
                                                r"arguments and vocabulary"):
        task_lib.InitFrom.read(path)
    (tmp_path / "twin.pt.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^init_from: .*twin.pt.json is not the side file `export vae` writes"):
        task_lib.InitFrom.read(path)


def test_cli_init_from_another_size_exits_2_naming_the_flags_before_the_data(corpus, tmp_path, monkeypatch, capsys):
    from jax_scan_rnn.data.smiles import Vocabulary

    _, path = torch_twin_files(tmp_path, tiny(corpus), Vocabulary(("<pad>", "<sos>", "<eos>", "C")))
    monkeypatch.setattr(task_lib, "load_dataset", lambda *a: pytest.fail("read the data of a refused run"))
    out = tmp_path / "run"
    assert main(["train", "vae", "--data", str(corpus), "--hidden-size", "16", "--latent-size", "8", "--init-from",
                 str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--init-from: " + str(path) + " holds a model with --latent-size 4; this run's has "
                        "--latent-size 8: set them to the file's"), err
    assert not out.exists()


@pytest.mark.slow  # exact resume is covered by tests/test_train.py; this checks the VAE's CLI wiring of it
def test_cli_resume_continues_the_run(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    args = ["train", "vae", "--data", str(corpus), "--hidden-size", "8", "--latent-size", "2", "--batch-size", "8",
            "--log-every", "2", "--eval-every", "0", "--checkpoint-every", "4", "--eval-samples", "5", "--out", str(out)]
    assert main([*args, "--steps", "4"]) == 0
    with monkeypatch.context() as patched:  # a second run there is refused before its data is loaded
        patched.setattr(task_lib, "load_dataset", lambda task: pytest.fail("loaded the data of a refused run"))
        assert main([*args, "--steps", "4"]) == 2
    assert f"--out: {out} already holds a run (checkpoints at steps [4]); pass --resume" in capsys.readouterr().err
    assert main([*args, "--steps", "8", "--resume", "--override"]) == 0  # more steps: a changed option
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [2, 4, 6, 8]
    # Options not given are the run's own (its --data file, sizes, batch; not MOSES's data and defaults).
    capsys.readouterr()
    assert main(["train", "vae", "--out", str(out), "--resume", "--steps", "10", "--override"]) == 0
    said = capsys.readouterr().out
    assert f"--resume: the run's own settings where not given: --data {corpus}, --hidden-size 8, " in said, said
    # --warmup-steps not given follows the given --steps, as in a fresh run: a tenth of 10
    assert "resuming with changed settings (--override): --steps 8 -> 10; --warmup-steps 0 -> 1\n" in said, said
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [2, 4, 6, 8, 10]
    # The file revised since: other molecules in the split, named as a changed setting, the run untouched.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    corpus.write_text(corpus.read_text() + "CCCCCCCCCCCO\nCCCCCCCCCCCN\n")
    capsys.readouterr()
    assert main([*args, "--steps", "10", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"other settings (the data in --data {corpus} (its molecules: the file changed since, or the "
                        "run predates this version's SMILES reader (2026-12-06))); give the same options, or add "
                        "--override to continue with the new ones") and len(err.splitlines()) == 1, err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert main(["train", "traveller", "--out", str(out), "--resume"]) == 2  # the other model's command: named
    assert f"--out: {out} holds a run of the vae model, not of the traveller" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_word_dropout_and_per_token_reconstruction_in_the_training_loss(corpus):
    """--word-dropout p feeds no token where a per-token coin < p (the scheduled-sampling coin stream, free under
    teacher decoding; eps unchanged); --recon-reduction token is MOSES's loss: recon / (scored tokens per sequence)
    + beta * kl, with the logged recon still per sequence."""
    from dataclasses import replace

    from jax_scan_rnn.data.smiles import PAD

    task = tiny(corpus, kl_schedule="constant", max_beta=0.3)
    dataset = task_lib.load_dataset(task)
    batch = task_lib.make_batch_fn(task, dataset)(0)
    model = task_lib.build_model(task, dataset.vocab.size)
    _, plain = task_lib.make_loss_fn(task)(model, batch)
    total, dropped = task_lib.make_loss_fn(replace(task, word_dropout=0.5, recon_reduction="token"))(model, batch)
    assert float(dropped["kl"]) == float(plain["kl"])  # the same eps
    assert abs(float(dropped["recon"]) - float(plain["recon"])) > 1e-3  # inputs were dropped
    scored = (batch["tokens"] != PAD).sum() / len(batch["tokens"])
    assert float(total) == pytest.approx(float(dropped["recon"]) / scored + 0.3 * float(dropped["kl"]), rel=1e-6)
    with pytest.raises(ValueError, match=r"^word_dropout, decoding: expected word_dropout=0 with "
                                         r"decoding='scheduled' \(word dropout is for teacher forcing\), got "
                                         r"word_dropout=0.1$"):
        task_lib.VAETask(word_dropout=0.1, decoding="scheduled")


def test_the_logged_kl_is_the_kl_itself_with_free_bits(corpus):
    """--free-bits f penalises max(kl_per_dim, f) per dimension, but the train rows' `kl` is the KL itself, the figure
    the eval rows and the report give: logged clamped, a collapsed latent read as Z * f nats in use."""
    from dataclasses import replace

    task = tiny(corpus, kl_schedule="constant", max_beta=0.3)
    dataset = task_lib.load_dataset(task)
    batch = task_lib.make_batch_fn(task, dataset)(0)
    model = task_lib.build_model(task, dataset.vocab.size)
    _, plain = task_lib.make_loss_fn(task)(model, batch)
    free_bits = 10.0  # far above a fresh model's per-dimension KL: every dimension is clamped
    total, logged = task_lib.make_loss_fn(replace(task, free_bits=free_bits))(model, batch)
    assert float(plain["kl"]) < free_bits
    assert float(logged["kl"]) == float(plain["kl"])  # the same eps: the same KL
    # the loss still penalises the clamped KL
    assert float(total) == pytest.approx(float(logged["recon"]) + 0.3 * free_bits * task.latent_size, rel=1e-6)


def test_preset_moses_is_its_values_and_explicit_flags_win(capsys):
    """`train vae --preset moses` parses to the preset's VAETask and TrainConfig exactly (`Preset.configs`), with
    MOSES's numbers (moses/vae/config.py); a flag given explicitly, before or after --preset, overrides it."""
    from jax_scan_rnn import options
    from jax_scan_rnn.cli import build_parser, train_config

    def parsed(*flags):
        argv = ["train", "vae", *flags]
        args = build_parser(argv).parse_args(argv)
        return options.from_args(task_lib.VAETask, args), train_config(args)

    preset = task_lib.PRESETS["moses"]
    task, cfg = parsed("--preset", "moses")
    assert (task, cfg) == preset.configs()
    assert (task.data, task.hidden_size, task.num_layers, task.bidirectional, task.latent_size) == ("moses", 256, 1,
                                                                                                   False, 128)
    assert (task.decoder_hidden_size, task.decoder_layers, task.concat_z, task.batch_size) == (512, 3, True, 512)
    assert task.bucket_pool == 0  # MOSES's shuffled DataLoader: uniformly random batches
    assert (task.limit, task.kekule) == (None, False)  # all of MOSES's molecules, as MOSES writes them
    assert (task.decoding, task.recon_reduction, task.kl_schedule, task.max_beta) == ("teacher", "token", "linear",
                                                                                      0.05)
    assert task.kl_warmup == cfg.steps == 100 * 3096  # MOSES's 100 epochs of ceil(1,584,663 / 512) batches
    assert (cfg.learning_rate, cfg.lr_schedule, cfg.warmup_steps, cfg.clip_norm) == (3e-4, "constant", 0, 50.0)

    explicit = parsed("--hidden-size", "8", "--preset=moses", "--steps", "10", "--warmup-steps", "2", "--lr", "1e-3")
    assert explicit == preset.configs(hidden_size=8, steps=10, warmup_steps=2, learning_rate=1e-3)
    task, cfg = parsed()  # no preset: the command's own defaults
    assert task == task_lib.VAETask() and (cfg.steps, cfg.learning_rate, cfg.weight_decay) == (1800, 1e-2, 0.1)
    assert (task.data, task.limit, task.writes_kekule, task.bucket_pool) == ("moses", 300_000, True, 0)
    with pytest.raises(SystemExit):
        parsed("--preset", "chembl")
    assert "argument --preset: invalid choice: 'chembl'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^overrides: expected VAETask or TrainConfig fields, got \['hidden'\]$"):
        preset.configs(hidden=8)


def test_sample_missing_checkpoint_exits_2(tmp_path, capsys):
    assert main(["sample", "vae", "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "--checkpoint: expected a training output directory" in capsys.readouterr().err


@pytest.mark.slow  # 14 s; the Traveller's test_seed_reaches_the_run covers fit's seeding in the default run
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


# ----------------------------------------------------------------------------------------------------
# Data that cannot make a run is refused before training, naming --data; file lines are parsed as SMILES
# ----------------------------------------------------------------------------------------------------


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_file_lines_are_parsed_as_smiles_unless_not_chemistry(corpus):
    dataset = task_lib.load_dataset(tiny(corpus, kekule=False))  # (--kekule then rewrites them: its own test)
    kept = dataset.train + dataset.valid + dataset.test
    assert dataset.skipped == {"empty": 1, "too_long": 1, "unparsable": 2}
    assert "C1CC" not in kept and "Xyz" not in kept
    assert sorted(kept) == sorted(SMILES)  # kept as written, not canonicalised
    text = task_lib.load_dataset(tiny(corpus, smiles_check=False))
    assert text.skipped == {"empty": 1, "too_long": 1}  # only the length (and empty-line) checks
    assert sorted(text.train + text.valid + text.test) == sorted([*SMILES, "C1CC", "Xyz"])
    with pytest.raises(ValueError, match=r"smiles_check: expected True for the built-in source 'rdkit' .*got False"):
        task_lib.VAETask(data="rdkit", smiles_check=False)


def test_sequences_that_are_not_smiles_are_scored_as_strings(tmp_path, monkeypatch):
    # --no-smiles-check: the final evaluation called rdkit's validity on every sample (0 valid, unique and novel
    # n/a, whatever the model wrote), and without rdkit installed the run ended in an error after its training.
    # Now: no validity; unique and novel over the strings as written (a whole run, and MOSES's metrics refused in
    # one line: the slow test below).
    dataset = task_lib.Dataset(vocab=smiles.Vocabulary.build(["ABC", "ABD"]), train=["ABC", "ABD"], valid=[], test=[],
                               skipped={})
    for name in ("validity", "uniqueness", "novelty", "valid_canonical"):  # rdkit is never asked
        monkeypatch.setattr(metrics, name, lambda *a, **k: pytest.fail("a SMILES metric of non-SMILES sequences"))
    task = task_lib.VAETask(data=str(tmp_path / "words.txt"), smiles_check=False)
    scores = task_lib.sample_scores(["ABC", "ABC", "DDA", "", "BB"], dataset, task)
    # "" is no sequence (4 of 5 are well-formed, the count the report shows in validity's place); ABC is training's
    assert scores == {"validity": None, "well_formed": 4 / 5, "uniqueness": 3 / 4, "novelty": 2 / 3}
    assert task_lib.sample_scores(iter(["ABC", "ABC", "DDA", "", "BB"]), dataset, task) == scores  # read once
    assert task_lib.sample_scores(["", ""], dataset, task)["well_formed"] == 0
    assert np.isnan(task_lib.sample_scores(["", ""], dataset, task)["uniqueness"])
    # no sequence at all: novelty is undefined too (NaN, as uniqueness), not "none novel"
    assert np.isnan(task_lib.sample_scores(["", ""], dataset, task)["novelty"])


def test_a_sample_with_a_pad_or_sos_is_no_sequence_of_the_data(tmp_path, monkeypatch):
    # --no-smiles-check: a sample in which the model chose <pad> or <sos> before its <eos> decodes with the token's
    # name ("A<pad>B"), which rdkit rejects for a SMILES run, but was scored unique and novel among the strings of a
    # run on other text (an untrained model's samples: "unique 1.000 novel 1.000"). It is no sequence of the data.
    vocab = smiles.Vocabulary.build(["ABC", "ABD"])
    dataset = task_lib.Dataset(vocab=vocab, train=["ABC", "ABD"], valid=[], test=[], skipped={})
    a, b, c, d = (vocab.tokens.index(ch) for ch in "ABCD")
    pad, sos, eos = smiles.PAD, smiles.SOS, smiles.EOS
    tokens = np.array([[a, b, c, eos, pad],  # ABC: a training sequence
                       [d, d, a, eos, pad],  # DDA: novel
                       [a, pad, b, eos, pad],  # A<pad>B: no sequence
                       [sos, a, eos, pad, pad],  # <sos>A: no sequence
                       [d, d, a, eos, pad]])  # DDA again
    monkeypatch.setattr(task_lib, "sample_tokens", lambda *args, **kwargs: tokens)
    task = task_lib.VAETask(data=str(tmp_path / "words.txt"), smiles_check=False, decoder_only=True, eval_samples=5)
    report = task_lib.evaluate(nnx.Dict(), dataset, task)  # decoder-only: the model only samples (patched above)
    assert report["samples"]["examples"][2:4] == ["A<pad>B", "<sos>A"]  # written out, as the model chose them
    for name in ("samples", "samples_greedy"):
        scores = {k: report[name][k] for k in ("validity", "well_formed", "uniqueness", "novelty")}
        assert scores == {"validity": None, "well_formed": 3 / 5, "uniqueness": 2 / 3, "novelty": 1 / 2}, scores


@pytest.mark.slow  # a whole run: its final evaluation compiles sampling and interpolation (~15 s)
def test_a_run_on_sequences_that_are_not_smiles_reports_no_validity(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(0)
    words = write_lines(tmp_path / "words.txt", sorted({"".join(rng.choice(list("ABCD"), 6)) for _ in range(100)}))
    out = tmp_path / "run"
    assert main(["train", "vae", "--data", str(words), "--no-smiles-check", "--steps", "2", "--hidden-size", "8",
                 "--latent-size", "2", "--batch-size", "8", "--eval-samples", "20", "--eval-every", "0",
                 "--out", str(out)]) == 0
    report = json.loads((out / "evaluation.json").read_text())
    assert report["samples"]["validity"] is None and 0 < report["samples"]["uniqueness"] <= 1
    printed = capsys.readouterr().out
    # the count scored in validity's place, and no "molecules" of sequences that are not SMILES
    assert f"valid n/a  well-formed {report['samples']['well_formed']:.3f}" in printed
    assert "reconstruction of 5 test sequences" in printed and "molecules" not in printed, printed
    assert main(["evaluate", "vae", "--checkpoint", str(out), "--metrics", "moses", "--reference", "held-out"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"--metrics moses: expected a run on SMILES, got one trained with --no-smiles-check on {words} (MOSES's "
        "metrics parse every sample as a molecule)")
    # A run that predates its data digest: whole lines are read as they were (only the SMILES reader changed), so
    # its evaluation has nothing to warn of, unlike a SMILES run's
    from jax_scan_rnn import checkpoint

    read = checkpoint.read_metadata
    monkeypatch.setattr(checkpoint, "read_metadata",
                        lambda *a, **k: {key: v for key, v in read(*a, **k).items() if key != "data_sha256"})
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "5"]) == 0
    assert "warning" not in capsys.readouterr().err
    monkeypatch.undo()
    # The file revised since: refused as changed, naming sequences and no SMILES reader (which never read them)
    words.write_text(words.read_text() + "ABCDAB\n")
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "(its sequences as read now differ: the file changed since): its test split would hold other sequences" in err
    assert "SMILES" not in err and "molecules" not in err, err
    assert main(["train", "vae", "--data", str(words), "--no-smiles-check", "--steps", "4", "--hidden-size", "8",
                 "--latent-size", "2", "--batch-size", "8", "--eval-samples", "20", "--eval-every", "0",
                 "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"the data in --data {words} (its sequences: the file changed since));" in err, err


def test_moses_metrics_of_a_run_that_is_not_smiles_are_refused_before_molsets_is_asked_for(tmp_path, monkeypatch,
                                                                                          capsys):
    # evaluate vae --metrics moses on a --no-smiles-check run without molsets: it said to install molsets (checked
    # first), and once installed, that the run is no SMILES run. The run's own refusal comes first now.
    from jax_scan_rnn import cli

    def no_molsets(reference):
        raise FileNotFoundError("MOSES's test set: not found; install it with `pip install --no-deps molsets`")

    words = tmp_path / "words.txt"
    task = task_lib.VAETask(data=str(words), smiles_check=False)
    monkeypatch.setattr(cli, "load_run", lambda args, model: (None, None, task, 2))
    monkeypatch.setattr(metrics, "reference_set", no_molsets)
    assert main(["evaluate", "vae", "--checkpoint", str(tmp_path / "run"), "--metrics", "moses"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"--metrics moses: expected a run on SMILES, got one trained with --no-smiles-check on {words} (MOSES's "
        "metrics parse every sample as a molecule)")


def test_a_limit_that_stops_reading_is_reported(corpus):
    """--limit N keeps the first N usable sequences; the dataset says when reading stopped there (the CLI's data
    line then says so), since the data may hold more."""
    limited = task_lib.load_dataset(tiny(corpus, limit=50, kekule=False))
    assert limited.limit_reached and len(limited.train + limited.valid + limited.test) == 50
    assert not task_lib.load_dataset(tiny(corpus, limit=500, kekule=False)).limit_reached  # 100 usable: all read
    assert not task_lib.load_dataset(tiny(corpus, limit=None, kekule=False)).limit_reached


def test_a_limit_equal_to_the_data_is_not_reported_as_reached(tmp_path):
    """A file of exactly N molecules read with --limit N was read whole: not reported as cut, nor named as the cause
    of too few sequences; N + 1 molecules with --limit N are."""
    for kekule in (False, True):
        exact = task_lib.load_dataset(tiny(write_lines(tmp_path / "exact.smi", SMILES[:60]), limit=60, kekule=kekule))
        assert not exact.limit_reached, kekule
        more = task_lib.load_dataset(tiny(write_lines(tmp_path / "more.smi", SMILES[:61]), limit=60, kekule=kekule))
        assert more.limit_reached, kekule
    write_lines(tmp_path / "few.smi", SMILES[:12])  # fewer than min_sequences(8): refused, the limit not blamed
    with pytest.raises(ValueError, match=r"holds 12 usable sequences, needs at least"):  # no "(--limit 12)"
        task_lib.load_dataset(tiny(tmp_path / "few.smi", limit=12))


def test_minimum_is_derived_from_the_split_and_the_batch_size(tmp_path):
    from jax_scan_rnn.data import smiles

    needed = task_lib.min_sequences(8)
    for n in range(needed, needed + 200):  # every size from the minimum up gives every part enough
        train, valid, test = smiles.split_sizes(n, task_lib.SPLIT_FRACTIONS)
        assert train >= 8 and valid >= task_lib.MIN_VALID and test >= task_lib.MIN_TEST, n
    assert smiles.split_sizes(needed - 1, task_lib.SPLIT_FRACTIONS) == (27, 2, 1)  # one fewer: 1 test sequence
    assert task_lib.min_sequences(128) == 142  # the default batch: round(0.9 * 142) = 128 training sequences

    path = tmp_path / "few.smi"
    write_lines(path, SMILES[:needed])
    assert len(task_lib.load_dataset(tiny(path)).train) >= 8
    write_lines(path, [*SMILES[: needed - 1], "C1CC"])
    message = (rf"--data {path}: holds {needed - 1} usable sequences, needs at least {needed}: the 90/5/5 % "
               r"train/valid/test split must leave one training batch \(--batch-size 8\), 1 validation and 2 test "
               r"sequences \(skipped: unparsable 1; if the file is not SMILES, pass --no-smiles-check\)$")
    with pytest.raises(ValueError, match=message):
        task_lib.load_dataset(tiny(path))
    with pytest.raises(ValueError, match=r"holds 12 usable sequences \(--limit 12\), needs at least"):
        task_lib.load_dataset(tiny(path, limit=12))


def test_cli_refuses_too_few_sequences_before_training(tmp_path, capsys):
    path = write_lines(tmp_path / "few.smi", SMILES[:20])
    out = tmp_path / "run"
    code = main(["train", "vae", "--data", str(path), "--batch-size", "8", "--hidden-size", "8", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (f"jax-scan-rnn train vae: error: --data {path}: holds 20 usable sequences, needs at least "
            f"{task_lib.min_sequences(8)}: ") in err
    assert not out.exists()  # refused before anything was trained or written


def test_cli_refuses_a_file_with_no_usable_sequence(tmp_path, capsys):
    path = write_lines(tmp_path / "bad.smi", ["", "C1CC", "   ", "Xyz", ""])
    assert main(["train", "vae", "--data", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == (f"jax-scan-rnn train vae: error: --data {path}: holds no usable sequence (skipped: empty 3, "
                   "unparsable 2; if the file is not SMILES, pass --no-smiles-check)\n")
    assert main(["train", "vae", "--data", str(path), "--no-smiles-check", "--batch-size", "1"]) == 2
    assert "holds 2 usable sequences, needs at least 31" in capsys.readouterr().err  # now "C1CC" and "Xyz" count
    assert main(["train", "vae", "--data", "rdkit", "--no-smiles-check"]) == 2
    assert capsys.readouterr().err == (
        "jax-scan-rnn train vae: error: --no-smiles-check: expected only with a --data file that is not chemistry, "
        "got --data rdkit, a built-in source (always SMILES)\n"
    )


def test_validation_and_test_parts_emptied_by_unseen_characters_are_refused(tmp_path):
    # Every line a character of its own: no validation or test sequence can be encoded with the training
    # vocabulary.
    path = write_lines(tmp_path / "chars.txt", [chr(ord("a") + i) for i in range(26)] + [chr(ord("A") + i)
                                                                                       for i in range(26)])
    with pytest.raises(ValueError, match=rf"--data {path}: of its 52 usable sequences, 0 validation and 0 test "
                                         r"sequences remain once those with characters absent from the training part"
                                         r" are dropped \(unseen_character 5\); needs at least 1 validation and 2 test "
                                         r"sequences \(skipped: none\)$"):
        task_lib.load_dataset(tiny(path, smiles_check=False))


def test_batches_are_checked_before_they_reach_the_jitted_step(corpus, monkeypatch):
    from jax_scan_rnn.data import smiles

    task = tiny(corpus)
    dataset = task_lib.load_dataset(task)
    encode = smiles.Vocabulary.encode

    def corrupt(self, sequences, max_len=None):  # an encoder bug: one id past the vocabulary
        tokens, lengths = encode(self, sequences, max_len)
        tokens[3, 1] = self.size + 5
        return tokens, lengths

    monkeypatch.setattr(smiles.Vocabulary, "encode", corrupt)
    bad = dataset.vocab.size + 5
    with pytest.raises(ValueError, match=rf"tokens: expected ids in \[0, vocab_size={dataset.vocab.size}\), got "
                                         rf"tokens\[3, 1\]={bad}"):
        task_lib.make_batch_fn(task, dataset)


@pytest.mark.slow  # 25-30 s (two CLI trainings); CI runs it in its slow step
def test_decoder_only_is_a_charrnn_baseline_from_the_same_code(corpus, tmp_path, capsys):
    """--decoder-only trains the decoder alone from z = 0 (no encoder, no KL): the CharRNN row of MOSES's
    table, like for like. Its encoder gets no gradient, its report has samples but no reconstruction."""
    from jax_scan_rnn.train import TrainConfig

    task = tiny(corpus, decoder_only=True)
    model, dataset, history = task_lib.train(task, TrainConfig(steps=30, learning_rate=1e-2, log_every=10,
                                                               eval_every=0, checkpoint_every=0))
    _, kl = history.series("kl", "train")
    _, recon = history.series("recon", "train")
    assert max(kl) == 0.0 and recon[-1] < recon[0]
    untouched = task_lib.build_model(task, dataset.vocab.size)
    params = lambda m: jax.tree.leaves(nnx.state(m.gru_encoder, nnx.Param))  # noqa: E731
    for ours, init in zip(params(model), params(untouched)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(init))  # the encoder is never used
    report = task_lib.evaluate(model, dataset, task)
    assert set(report) == {"samples", "samples_greedy"} and report["samples"]["n"] == task.eval_samples
    out = tmp_path / "run"
    argv = ["train", "vae", "--data", str(corpus), "--hidden-size", "16", "--latent-size", "4", "--batch-size", "8",
            "--decoder-only", "--steps", "4", "--eval-every", "0", "--eval-samples", "8", "--eval-sequences", "2",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "prior samples, sampled" in printed and "reconstruction" not in printed.split("the final report")[-1]
    assert main(["sample", "vae", "--checkpoint", str(out), "-n", "3"]) == 0
    sampled = capsys.readouterr().out.splitlines()
    # From Python as docs/cli.md gives it: decoder_only=task.decoder_only decodes from z = 0, as the run trained
    loaded, vocab, saved = task_lib.load(out)
    assert saved.decoder_only and sampled == task_lib.sample(loaded, vocab, 3, max_len=saved.max_length + 1, seed=0,
                                                             decoder_only=saved.decoder_only)
    (tmp_path / "z.npy").write_bytes(b"")  # refused before it is read: the decoder reads no latent
    for argv in (["encode", "vae", "--input", str(corpus), "--output", str(tmp_path / "z.npz")],
                 ["sample", "vae", "--latents", str(tmp_path / "z.npy")]):
        assert main([*argv, "--checkpoint", str(out)]) == 2
        assert "expected a run with an encoder, got a --decoder-only run" in capsys.readouterr().err


def test_augment_writes_each_training_molecule_several_ways(corpus):
    """--augment K: each training molecule also has up to K randomized SMILES (the same molecule); a batch
    draws one way per molecule, as a pure function of the step; validation and test stay canonical."""
    from jax_scan_rnn.data.smiles import canonical_smiles

    task = tiny(corpus, augment=5)
    dataset = task_lib.load_dataset(task)
    assert dataset.valid == task_lib.load_dataset(tiny(corpus)).valid  # the split does not move
    for variants in dataset.train_variants:
        assert variants[0] in dataset.train and len(set(variants)) == len(variants) <= 6
        assert {canonical_smiles(v) for v in variants} == {canonical_smiles(variants[0])}
        assert all(len(v) <= task.max_length for v in variants)
    assert sum(len(v) > 1 for v in dataset.train_variants) > len(dataset.train) // 2
    batch_fn = task_lib.make_batch_fn(task, dataset)
    np.testing.assert_array_equal(batch_fn(3)["tokens"], batch_fn(3)["tokens"])
    writings: dict[str, set[str]] = {}
    for step in range(60):  # ~6 epochs of the 81 training molecules: each drawn several times
        for written in dataset.vocab.decode(batch_fn(step)["tokens"]):
            writings.setdefault(canonical_smiles(written), set()).add(written)
    assert max(len(w) for w in writings.values()) >= 3  # the same molecule, written different ways
    plain = task_lib.make_batch_fn(tiny(corpus), task_lib.load_dataset(tiny(corpus)))
    assert plain(0)["tokens"].shape == batch_fn(0)["tokens"].shape
    with pytest.raises(ValueError, match="^augment: expected 0 with smiles_check=False"):
        tiny(corpus, augment=2, smiles_check=False)


def test_kekule_writes_every_part_in_kekule_form(corpus):
    """--kekule: the same molecules, each written in Kekulé form (no aromatic atom) in training, validation and
    test, and in every randomized way of --augment; a molecule that grows past --max-length in that form is
    skipped and counted (here C10 + benzene: 18 characters aromatic, 21 in Kekulé form)."""
    from jax_scan_rnn.data.smiles import canonical_smiles

    aromatic = set("cnops")  # rdkit's aromatic atoms of MOSES's elements; "Cl" and "Br" end in other letters
    plain = task_lib.load_dataset(tiny(corpus, kekule=False))
    assert tiny(corpus).writes_kekule and not tiny(corpus, smiles_check=False).writes_kekule  # SMILES data: on
    task = tiny(corpus, kekule=True, augment=3)
    dataset = task_lib.load_dataset(task)
    assert dataset.skipped["too_long"] == 2  # C10 + benzene and the 200 carbons, each once
    parts = dataset.train + dataset.valid + dataset.test
    assert {canonical_smiles(s) for s in parts} == {canonical_smiles(s) for s in plain.train + plain.valid
                                                    + plain.test} - {canonical_smiles("C" * 10 + "c1ccccc1")}
    assert all(s == canonical_smiles(s, kekule=True) for s in parts)
    assert not aromatic & set(dataset.vocab.tokens) and "c" in plain.vocab.tokens
    for variants in dataset.train_variants:
        assert {canonical_smiles(v) for v in variants} == {canonical_smiles(variants[0])}
        assert not any(aromatic & set(v) for v in variants)
    with pytest.raises(ValueError, match="^kekule: expected False with smiles_check=False"):
        tiny(corpus, kekule=True, smiles_check=False)


def test_a_run_saved_by_a_newer_version_is_refused_naming_the_settings_it_does_not_know():
    # (the Traveller's test goes through the CLI): an option this version has no field for is one ValueError naming
    # it, not Python's "unexpected keyword argument"; a field the run predates still takes its old value.
    saved = task_lib.VAETask().to_json()
    with pytest.raises(ValueError, match=r"^task: the run's saved settings hold 'attention', 'heads', which this "
                                         r"version does not know: it was written by another jax-scan-rnn than this one "
                                         r"\(.*\); read it with that one"):
        task_lib.VAETask.from_json({**saved, "heads": 4, "attention": True})
    assert task_lib.VAETask.from_json(saved) == task_lib.VAETask()


def test_a_run_saved_before_decoder_layers_existed_keeps_one_decoder_layer(corpus, tmp_path, monkeypatch, capsys):
    """`train vae` now defaults to two decoder layers; a run saved before `decoder_layers` existed had the
    encoder's layer count. Loading it rebuilds that decoder, --resume continues it so, and compares a given
    --decoder-layers against what it ran with (continuing a run after the check is tests/test_vae_task.py::test_cli_resume_continues_the_run's)."""
    from jax_scan_rnn import checkpoint

    from jax_scan_rnn.train import TrainConfig

    assert task_lib.VAETask().decoder_layers == 2
    out = tmp_path / "old"
    old = task_lib.VAETask(data=str(corpus), hidden_size=8, latent_size=2, batch_size=8, decoder_layers=None)
    task_lib.train(old, TrainConfig(steps=1, log_every=1, eval_every=0, checkpoint_every=1), out)  # 1 layer
    read = checkpoint.read_metadata

    def as_saved_before(*args, **kwargs):  # the metadata an old run wrote: no decoder_layers in its task
        meta = read(*args, **kwargs)
        return {**meta, "task": {k: v for k, v in meta["task"].items() if k != "decoder_layers"}}

    monkeypatch.setattr(checkpoint, "read_metadata", as_saved_before)
    model, _, task = task_lib.load(out)
    assert task.decoder_layers is None and model.decoder_layers == 1
    capsys.readouterr()
    argv = ["train", "vae", "--data", str(corpus), "--hidden-size", "8", "--latent-size", "2", "--batch-size", "8",
            "--steps", "1", "--log-every", "1", "--eval-every", "0", "--checkpoint-every", "1", "--out", str(out)]
    assert main([*argv, "--resume", "--decoder-layers", "2"]) == 2  # today's default, given: not what the run had
    assert "--decoder-layers None -> 2" in capsys.readouterr().err  # naming the flag
    assert main([*argv, "--resume"]) == 0  # not given: the run's own (the encoder's layer count), said
    assert "--resume: the run's own settings where not given: --decoder-layers None" in capsys.readouterr().out


@pytest.mark.parametrize("data, given, expected", [
    ("rdkit", "C1=CC=CC=C1", "c1ccccc1"),  # the rdkit source's molecules are rdkit's canonical SMILES
    ("FILE", "C1=CC=CC=C1", "C1=CC=CC=C1"),  # a file's, as written
])
def test_latents_write_each_molecule_as_the_runs_were(corpus, data, given, expected):
    task = task_lib.VAETask(data=str(corpus) if data == "FILE" else data, kekule=False, hidden_size=8, latent_size=2,
                            batch_size=8)
    vocab = smiles.Vocabulary.build(["C1=CC=CC=C1", "c1ccccc1", "Xyz"])
    found = task_lib.latents(task_lib.build_model(task, vocab.size), vocab, task, [given, "C1CC"])
    assert found["sequences"] == [expected] and found["skipped"] == {"unparsable": 1}


def test_train_batches_by_the_runs_seed(corpus, monkeypatch):
    """`train` hands fit the batches of the run's seed (the weights alone would differ by initialisation)."""
    from jax_scan_rnn.train import TrainConfig

    task = tiny(corpus)
    dataset = task_lib.load_dataset(task)
    seen = {}
    monkeypatch.setattr(task_lib, "fit", lambda model, loss_fn, batch_fn, cfg, **kw: seen.update(batch_fn=batch_fn))
    task_lib.train(task, TrainConfig(steps=1, seed=7), dataset=dataset)
    first = seen["batch_fn"](0)["tokens"]
    np.testing.assert_array_equal(first, task_lib.make_batch_fn(task, dataset, 7)(0)["tokens"])
    assert not np.array_equal(first, task_lib.make_batch_fn(task, dataset, 0)(0)["tokens"])


def test_evaluate_reconstructs_test_molecules_and_judges_novelty_against_training(corpus, monkeypatch):
    """The final report's reconstruction, latent and interpolation read the held-out test molecules (never the
    training or validation ones), and novelty compares the samples with the training set."""
    task = tiny(corpus)
    dataset = task_lib.load_dataset(task)
    assert not set(dataset.test) & (set(dataset.train) | set(dataset.valid))
    read, novelty_against = [], []
    reconstruction, novelty = task_lib.reconstruction, metrics.novelty
    monkeypatch.setattr(task_lib, "reconstruction", lambda m, vocab, seqs, n: read.append(list(seqs)) or
                        reconstruction(m, vocab, seqs, n))
    monkeypatch.setattr(metrics, "novelty", lambda generated, train, **kw: novelty_against.append(train) or
                        novelty(generated, train, **kw))
    report = task_lib.evaluate(task_lib.build_model(task, dataset.vocab.size, 0), dataset, task)
    assert read == [list(dataset.test[: task.eval_sequences])]
    assert report["reconstruction"]["n"] == min(len(dataset.test), task.eval_sequences)
    assert (report["interpolation"]["from"], report["interpolation"]["to"]) == tuple(dataset.test[:2])
    assert len(novelty_against) == 2 and all(train is dataset.canonical_train for train in novelty_against)


def test_sample_draws_n_per_given_latent_row_by_row(corpus):
    """`sample(n, z=)`: row 0's n draws, then row 1's, each the sampler's own from that latent (the CLI's
    `--latents -n` in the default run; the CLI round trip is in the slow test above)."""
    task = tiny(corpus)
    vocab = task_lib.load_dataset(task).vocab
    model = task_lib.build_model(task, vocab.size, 0)
    model.eval()
    z = np.stack([np.zeros(4, np.float32), np.full(4, 5.0, np.float32)])
    drawn = task_lib.sample(model, vocab, 3, max_len=12, seed=1, z=z)
    assert len(drawn) == 6
    assert drawn == task_lib.sample(model, vocab, 1, max_len=12, seed=1, z=np.repeat(z, 3, axis=0))
    assert drawn != task_lib.sample(model, vocab, 1, max_len=12, seed=1, z=np.tile(z, (3, 1)))
    with pytest.raises(ValueError, match=r"^n: expected 1 with greedy decoding of given latents"):
        task_lib.sample(model, vocab, 2, max_len=12, greedy=True, z=z)
    z[1, 2] = np.nan  # decoded, a row holding NaN was <pad>s only: no molecule, and no word why
    with pytest.raises(ValueError, match=r"^z: expected finite latents, got 1 NaN or inf values"):
        task_lib.sample(model, vocab, 1, max_len=12, greedy=True, z=z)


def test_sample_tokens_names_its_own_n_and_takes_a_numpy_max_len():
    """n was left to JAX (n=-1: an MLIRError; n=0 named z, which was not given), and a NumPy max_len reached the
    jitted generate as a traced value, refused there as no static int."""
    from jax_scan_rnn import SeqVAE

    model = SeqVAE(6, 8, 4, 1, rngs=nnx.Rngs(0))
    for n in (0, -1, 2.0):
        with pytest.raises(ValueError, match=rf"^n: expected an int >= 1, got {n}$"):
            task_lib.sample_tokens(model, n, max_len=5)
    with pytest.raises(ValueError, match=r"^max_len: expected an int >= 1, got 0$"):
        task_lib.sample_tokens(model, 2, max_len=0)
    np.testing.assert_array_equal(task_lib.sample_tokens(model, np.int64(2), max_len=np.int64(5)),
                                  task_lib.sample_tokens(model, 2, max_len=5))


def test_sample_and_evaluate_read_their_options_and_export_records_the_kekule_form(corpus, tmp_path, capsys):
    from jax_scan_rnn.cli import fraction

    out = tmp_path / "run"
    assert main(["train", "vae", "--data", str(corpus), "--max-length", "20", "--hidden-size", "8", "--latent-size",
                 "2", "--batch-size", "8", "--steps", "1", "--eval-samples", "2", "--eval-sequences", "2",
                 "--out", str(out)]) == 0
    drawn = {}
    capsys.readouterr()
    for temperature in ("1", "5"):  # the same seed: only the temperature differs
        target = tmp_path / f"t{temperature}.txt"
        assert main(["sample", "vae", "--checkpoint", str(out), "-n", "20", "--temperature", temperature,
                     "--output", str(target)]) == 0
        drawn[temperature] = target.read_text()
        # A run on your own SMILES file is told its samples' validity, as a run on a built-in set is.
        generated = drawn[temperature].splitlines()
        said = capsys.readouterr().err
        assert said.startswith(f"valid {fraction(metrics.validity(generated))}  unterminated ") and \
            said.endswith(f"  unique {fraction(metrics.uniqueness(generated))}\n"), said
    assert drawn["1"] != drawn["5"]
    np.save(tmp_path / "z.npy", np.zeros((3, 2), np.float32))  # given latents, no -n: one sample per row
    assert main(["sample", "vae", "--checkpoint", str(out), "--latents", str(tmp_path / "z.npy"), "--output",
                 str(tmp_path / "z.txt")]) == 0
    assert len((tmp_path / "z.txt").read_text().splitlines()) == 3
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "7", "--output", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["samples"]["n"] == report["samples_greedy"]["n"] == 7  # -n prior samples, each way
    # The side file says how the molecules were written: an --init-from of it checks the new run's form against it.
    target = tmp_path / "vae.safetensors"
    assert main(["export", "vae", "--checkpoint", str(out), "--format", "safetensors", "--output", str(target)]) == 0
    side = json.loads(target.with_name(target.name + ".json").read_text())
    assert side["kekule"] is True  # SMILES data: Kekulé form by default
    # encode vae counts every record it read, each skipped one under its reason.
    molecules = tmp_path / "mine.smi"
    molecules.write_text(f"{SMILES[0]}\n\nXyz\n{'C' * 500}\n{SMILES[1]}\n[Na+]\n")
    capsys.readouterr()
    assert main(["encode", "vae", "--checkpoint", str(out), "--input", str(molecules), "--output",
                 str(tmp_path / "z.npz")]) == 0
    said = capsys.readouterr().out
    assert "encoded 2 of 6 records (skipped: empty 1, unparsable 1, too_long 1, unseen_character 1)" in said, said
    # Resuming over a data file revised since: refused, naming the data; the run untouched.
    original, before = corpus.read_text(), {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    corpus.write_text(original + "CCCCCCCCCCCO\n")
    assert main(["train", "vae", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"(the data in --data {corpus} (its molecules: the file changed since, or the run predates " in err, err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    corpus.write_text(original)
    # A --warmup-steps not given follows a given --steps, as in a fresh run: a tenth of 10, where the run had none.
    assert main(["train", "vae", "--out", str(out), "--resume", "--steps", "10", "--override"]) == 0
    said = capsys.readouterr().out
    assert "resuming with changed settings (--override): --steps 1 -> 10; --warmup-steps 0 -> 1\n" in said, said


def test_evaluate_draws_the_runs_samples_with_the_runs_seed(corpus, tmp_path, monkeypatch):
    """`evaluate vae -n N` of a run trained with --seed 1 and --eval-samples N scores the very samples of the run's
    own evaluation.json (the same numbers, not another draw), and --metrics moses's row is of those samples too."""
    out = tmp_path / "run"
    assert main(["train", "vae", "--data", str(corpus), "--max-length", "20", "--hidden-size", "8", "--latent-size",
                 "2", "--batch-size", "8", "--steps", "1", "--eval-samples", "6", "--eval-sequences", "2",
                 "--seed", "1", "--out", str(out)]) == 0
    scored = []  # what --metrics moses scores, without MOSES's data or ChemNet
    monkeypatch.setattr(metrics, "moses_metrics", lambda generated, *a, **k: scored.append(generated) or {})
    monkeypatch.setattr(metrics, "format_moses_table", lambda *a, **k: "")
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "6", "--metrics", "moses", "--output",
                 str(tmp_path / "r.json")]) == 0
    trained, evaluated = (json.loads(p.read_text()) for p in (out / "evaluation.json", tmp_path / "r.json"))
    for key in ("samples", "samples_greedy"):
        assert evaluated[key] == trained[key], key
    assert scored[0] == trained["samples"]["examples"]  # all 6 (examples keeps the first 10)


def test_the_written_form_of_each_molecule_is_drawn_with_the_runs_seed():
    """--augment: which of a molecule's written forms a batch holds is the run's seed's draw (one molecule of four
    forms, batch 1: two seeds give two sequences of forms)."""
    forms = ["CCO", "OCC", "C(C)O", "C(O)C"]
    dataset = task_lib.Dataset(smiles.Vocabulary.build(forms), ["CCO"], ["CCO"], ["CCO", "CCO"], {},
                               train_variants=[forms])
    task = task_lib.VAETask(data="x.txt", batch_size=1)

    def drawn(seed):
        return [task_lib.make_batch_fn(task, dataset, seed)(s)["tokens"].tolist() for s in range(20)]

    assert drawn(0) != drawn(1) and drawn(0) == drawn(0)


def test_evaluation_during_training_scores_the_validation_split(corpus):
    """The periodic eval rows' reconstruction is the model's on the validation molecules (eps = 0), never the test
    split's, which evaluation after training keeps apart."""
    from jax_scan_rnn.compiled import jit
    from jax_scan_rnn.train import TrainConfig

    task = tiny(corpus)
    model, dataset, history = task_lib.train(task, TrainConfig(steps=2, log_every=1, eval_every=0,
                                                               checkpoint_every=0))

    def recon(split):
        tokens, lengths = task_lib.encode(dataset.vocab, split, task.max_length)
        eps = jnp.zeros((len(tokens), model.latent_size), model.dtype)
        return float(jit(model).loss(tokens, lengths, eps=eps)["recon"])

    got = history.eval[-1]["metrics"]["recon"]
    assert got == pytest.approx(recon(dataset.valid), rel=1e-5) and got != pytest.approx(recon(dataset.test), rel=1e-5)


def test_evaluate_reads_the_runs_vocabulary_and_refuses_data_changed_since(corpus, tmp_path, capsys, monkeypatch):
    # A run started --init-from a model that never wrote an S has that model's vocabulary, not the one its data
    # builds: evaluate reads the data with the run's own (as --resume does). A data file changed since the run
    # (its lines reordered: other test molecules, some the model trained on) is refused, as --resume refuses it.
    from jax_scan_rnn.data.smiles import Vocabulary

    task = tiny(corpus)
    no_sulphur = Vocabulary(tuple(t for t in task_lib.load_dataset(task).vocab.tokens if t != "S"))
    _, path = torch_twin_files(tmp_path, task, no_sulphur)
    out = tmp_path / "run"
    assert main(["train", "vae", "--data", str(corpus), "--hidden-size", "16", "--latent-size", "4", "--batch-size",
                 "8", "--max-length", "20", "--steps", "2", "--eval-samples", "5", "--init-from", str(path),
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "5"]) == 0
    printed = capsys.readouterr().out
    assert "prior samples, greedy (n=5): valid " in printed and printed.count("  unterminated ") == 2
    lines = corpus.read_text().splitlines()
    corpus.write_text("\n".join(reversed(lines)) + "\n")
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--checkpoint: the run's data file {corpus} is not the data it was trained on (its molecules "
                        "as read now differ: the file changed since, or the run predates this version's SMILES reader "
                        "(2026-12-06)): its test split would hold other molecules, maybe ones the model trained on; "
                        "restore the file or evaluate with the version that trained the run, or score other molecules "
                        "with sample vae and your own metrics"), err
    # A run saved before runs recorded their data's digest: nothing to compare, evaluated as before, but said in
    # one line (the reader has changed since: its split may not be the run's)
    from jax_scan_rnn import checkpoint

    read = checkpoint.read_metadata
    monkeypatch.setattr(checkpoint, "read_metadata",
                        lambda *a, **k: {key: v for key, v in read(*a, **k).items() if key != "data_sha256"})
    assert main(["evaluate", "vae", "--checkpoint", str(out), "-n", "5"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == ("jax-scan-rnn evaluate vae: warning: --checkpoint: the run predates the record of the molecules it "
                   "trained on (2026-12-04), and SMILES files have been read into other molecules since (2026-12-06): "
                   f"its split could not be checked; its test molecules as this version reads --data {corpus} may "
                   "include ones it trained on"), err


def test_resuming_a_run_that_predates_its_data_record_says_its_split_is_unchecked(corpus, tmp_path):
    # A VAE run saved before 2026-12-04 recorded no digest of its molecules, and the SMILES reader has changed since
    # (a run's file read into other molecules, another split): --resume goes on, but says so in one line.
    import argparse

    from jax_scan_rnn.cli import check_resume
    from jax_scan_rnn.train import TrainConfig

    task, cfg = tiny(corpus), TrainConfig(steps=4)
    saved = {"model": "vae", "task": task.to_json(), "train_config": dataclasses.asdict(cfg)}
    args = argparse.Namespace(resume=True, override=False)
    with pytest.warns(UserWarning) as record:
        check_resume(tmp_path, args, task, cfg, {"data_sha256": "ab"}, saved)
    assert [str(w.message) for w in record] == [
        "--resume: the run predates the record of the molecules it trained on (2026-12-04), and SMILES files have "
        "been read into other molecules since (2026-12-06): its split could not be checked; training goes on with "
        f"the molecules of --data {corpus} as this version reads them, and the final report's test molecules may "
        "include ones the run trained on"]
    with warnings.catch_warnings():  # a run with its record: compared, nothing to say when it matches
        warnings.simplefilter("error")
        check_resume(tmp_path, args, task, cfg, {"data_sha256": "ab"}, {**saved, "data_sha256": "ab"})
        lines = dataclasses.replace(task, smiles_check=False)  # whole lines, read as they were: nothing to say
        check_resume(tmp_path, args, lines, cfg, {"data_sha256": "ab"}, {**saved, "task": lines.to_json()})


# ----------------------------------------------------------------------------------------------------
# Review findings: the length limit's form, duplicates written two ways, unterminated samples, sigmoid warm-up 0,
# the module's example, the schedules' help, name-first files
# ----------------------------------------------------------------------------------------------------


def test_max_length_applies_to_the_kekule_form_the_model_learns(tmp_path):
    """Explicit-hydrogen SMILES (other tools write them) are several times longer than the Kekulé forms the model
    learns: the limit is the learnt form's, and a molecule too long in it is counted once, as too_long."""
    from rdkit import Chem

    explicit = [Chem.MolToSmiles(Chem.AddHs(Chem.MolFromSmiles(s)), allHsExplicit=True) for s in SMILES]
    assert sum(len(e) > 20 for e in explicit) > 90  # as written, most are longer than max_length
    path = write_lines(tmp_path / "explicit_h.smi", [*explicit, "C" * 200])
    dataset = task_lib.load_dataset(tiny(path))
    kept = dataset.train + dataset.valid + dataset.test
    assert len(kept) == 99 and max(map(len, kept)) <= 20  # all but C10 + benzene (21 characters in Kekulé form)
    assert dataset.skipped == {"too_long": 2}  # it and the 200 carbons


def test_a_molecule_written_two_ways_is_one_molecule_without_kekule(tmp_path):
    """--no-kekule keeps each molecule as its file writes it, once: written again another way it is a duplicate,
    not a second molecule that could be in training and in test."""
    from rdkit import Chem

    again = [Chem.MolToSmiles(Chem.MolFromSmiles(s), doRandom=True, canonical=False) for s in SMILES]
    path = write_lines(tmp_path / "two_ways.smi", SMILES + again)
    dataset = task_lib.load_dataset(tiny(path, kekule=False))
    assert sorted(dataset.train + dataset.valid + dataset.test) == sorted(SMILES)  # the first way, as written
    assert dataset.skipped == {"duplicate": 100}
    assert not {smiles.canonical_smiles(s) for s in dataset.test} & dataset.canonical_train
    text = task_lib.load_dataset(tiny(path, smiles_check=False))  # not chemistry: strings are the only key
    assert len(text.train + text.valid + text.test) == 100 + sum(a != s for a, s in zip(again, SMILES))


def test_samples_that_never_end_are_counted_as_unterminated(corpus):
    """A sample with no <eos> within max_len is scored as cut (MOSES's validity); the report says how many."""
    assert task_lib.unterminated(np.array([[3, 2, 0], [3, 3, 3], [2, 0, 0], [0, 3, 4]])) == 0.5
    task = tiny(corpus, decoder_only=True)
    dataset = task_lib.load_dataset(task)
    model = task_lib.build_model(task, dataset.vocab.size, 0)
    for eos_bias, expected in ((-1e4, 1.0), (1e4, 0.0)):  # <eos> never / always first
        model.h2o.bias[...] = model.h2o.bias[...].at[smiles.EOS].set(eos_bias)
        report = task_lib.evaluate(model, dataset, task)
        for name in ("samples", "samples_greedy"):
            assert report[name]["unterminated"] == expected, (name, eos_bias)
    assert list(report["samples"])[:3] == ["n", "validity", "unterminated"]


def test_a_sigmoid_kl_schedule_without_warm_up_is_max_beta_from_step_0():
    """kl_warmup=0 means no warm-up, for the sigmoid schedule as for the linear one (not a division by zero)."""
    for schedule in ("linear", "sigmoid"):
        task = task_lib.VAETask(kl_schedule=schedule, kl_warmup=0, max_beta=0.3)
        assert [task.beta(step) for step in (0, 1, 1000)] == pytest.approx([0.3] * 3), schedule


def test_the_module_example_matches_train_and_evaluate():
    """`train` returns (model, dataset, history) and `evaluate` reads the dataset, as the module's example says."""
    import inspect

    assert "model, dataset, history = train(" in task_lib.__doc__
    assert "evaluate(model, dataset, task)" in task_lib.__doc__
    assert list(inspect.signature(task_lib.evaluate).parameters)[:3] == ["model", "dataset", "task"]
    assert "model, vocab, history" not in task_lib.__doc__


def test_schedule_help_names_the_update_index_the_log_shows_one_later(corpus):
    """The log's step k is the k-th update, computed from batch k - 1: the help says which the midpoints are."""
    import dataclasses

    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(task_lib.VAETask)}
    for name in ("ss_midpoint", "kl_warmup"):  # the CLI's metavar is N
        assert "0-based update index N" in helps[name] and "the log's step N + 1" in helps[name], name
    task = tiny(corpus, decoding="scheduled", ss_midpoint=10, ss_max=1.0, kl_warmup=10, max_beta=1.0)
    batch = task_lib.make_batch_fn(task, task_lib.load_dataset(task))(10)  # the batch of the log's step 11
    assert float(batch["p_replace"][0]) == pytest.approx(0.5, abs=1e-3) and float(batch["beta"][0]) == 1.0


def test_a_name_first_file_is_told_to_put_the_smiles_first(tmp_path):
    """`mol1 CCO` lines: --no-smiles-check would train on whole lines; the error says SMILES come first."""
    path = write_lines(tmp_path / "names_first.smi", [f"mol{i} {s}" for i, s in enumerate(SMILES)])
    with pytest.raises(ValueError, match=r"unparsable 100; most unparsable lines have a SMILES second: the SMILES "
                                         r"must be each line's first field \(SMILES, then an optional name\)\)$"):
        task_lib.load_dataset(tiny(path))


def test_train_where_checkpoints_is_a_file_names_out(corpus, tmp_path, capsys):
    """fit's refusal of a file where out_dir/checkpoints belongs names the command's flag, --out, as train traveller's
    does (test_cli), not fit's out_dir; nothing is written but the run directory's lock."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("not a folder")
    assert main(["train", "vae", "--data", str(corpus), "--max-length", "20", "--hidden-size", "8", "--latent-size",
                 "2", "--batch-size", "8", "--steps", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"error: --out: expected {out / 'checkpoints'} to be the run's checkpoint directory, got a file; move it away "
        "or choose another directory")
    assert sorted(p.name for p in out.iterdir()) == [".lock", "checkpoints"]  # the run directory's lock (lock.py)

def test_a_comma_separated_file_not_named_csv_is_told_to_be_named_csv(tmp_path):
    """`CCO,mol1` lines in a .smi or .txt: every line unparsable, and --no-smiles-check would train on whole lines,
    names too; the error says a comma-separated table is read as one when named .csv (and it then is)."""
    lines = ["SMILES,name", *(f"{s},mol{i}" for i, s in enumerate(SMILES))]
    for name in ("mols.smi", "mols.txt"):
        path = write_lines(tmp_path / name, lines)
        with pytest.raises(ValueError, match=r"unparsable 101; most lines hold commas, as a table does: a "
                                             r"comma-separated table is read by its header's 'smiles' column when its "
                                             r"name ends in .csv\)$"):
            task_lib.load_dataset(tiny(path))
    assert len(task_lib.load_dataset(tiny(write_lines(tmp_path / "mols.csv", lines))).train) > 80


def test_a_hand_written_side_file_is_read_as_torch_ref_reads_its_arguments(corpus, tmp_path):
    # docs/cli.md invites a side file for one's own torch_ref.SeqVAE: one that leaves out an argument with a default,
    # or gives the decoder's size as None (torch_ref's own default: the encoder's), describes the same model.
    from dataclasses import replace

    task = tiny(corpus)
    _, path = torch_twin_files(tmp_path, task, task_lib.load_dataset(task).vocab)
    side = json.loads((tmp_path / "twin.pt.json").read_text())
    by_hand = {k: side["arguments"][k] for k in ("vocab_size", "hidden_size", "latent_size", "num_layers",
                                                 "decoder_layers")}
    (tmp_path / "twin.pt.json").write_text(json.dumps({**side, "arguments": {**by_hand, "decoder_hidden_size": None}}))
    task_lib.InitFrom.read(path).check(task)
    with pytest.raises(ValueError, match=r"holds a model with bidirectional=False; this run's has bidirectional=True"):
        task_lib.InitFrom.read(path).check(replace(task, bidirectional=True))


def test_the_limit_counts_distinct_molecules_under_the_kekule_rewrite(tmp_path):
    """With the Kekulé rewrite (the default), --limit N keeps the first N distinct molecules: a file writing each
    molecule twice (as given, then with explicit hydrogens) still yields N, the repeats counted as duplicates, and
    the dataset says reading stopped at the limit; a molecule whose Kekulé form is too long is then dropped."""
    from rdkit import Chem

    lines = [w for s in SMILES for w in (s, Chem.MolToSmiles(Chem.MolFromSmiles(s), allHsExplicit=True))]
    assert all(a != b for a, b in zip(lines[::2], lines[1::2]))  # two ways of writing each, never the same string
    path = write_lines(tmp_path / "twice.smi", lines)
    dataset = task_lib.load_dataset(tiny(path, limit=80))
    kept = dataset.train + dataset.valid + dataset.test
    assert sorted(kept) == sorted(smiles.canonical_smiles(s, kekule=True) for s in SMILES[:80])
    assert dataset.skipped == {"duplicate": 79}  # the second writing of the first 79 (reading stops at the 80th)
    assert dataset.limit_reached  # the file may hold more molecules
    whole = task_lib.load_dataset(tiny(path, limit=300))
    assert len(whole.train + whole.valid + whole.test) == 99  # all but C10 + benzene (21 characters in Kekulé form)
    assert whole.skipped == {"too_long": 1, "duplicate": 100} and not whole.limit_reached  # 200 lines, all read


def test_moses_strings_rdkit_cannot_parse_are_unparsable_not_too_long(tmp_path, monkeypatch):
    """MOSES's strings are read unparsed (curated); the Kekulé rewrite then parses them: one rdkit cannot parse is
    counted as unparsable, and only a molecule whose Kekulé form is longer than max_length as too_long."""
    import gzip
    import importlib.machinery
    import importlib.util

    folder = tmp_path / "moses"
    (folder / "dataset" / "data").mkdir(parents=True)
    with gzip.open(folder / "dataset" / "data" / "train.csv.gz", "wt") as f:
        f.write("SMILES,SPLIT\n" + "".join(f"{s},train\n" for s in [*SMILES, "C1CC", "Xyz", "C" * 30]))
    find_spec = importlib.util.find_spec
    fake = importlib.machinery.ModuleSpec("moses", None, is_package=True)
    fake.submodule_search_locations = [str(folder)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: fake if name == "moses" else find_spec(name, *a))
    task = tiny("moses")
    assert task.writes_kekule
    dataset = task_lib.load_dataset(task)
    assert sorted(dataset.train + dataset.valid + dataset.test) == sorted(
        smiles.canonical_smiles(s, kekule=True) for s in SMILES if len(smiles.canonical_smiles(s, kekule=True)) <= 20)
    assert dataset.skipped == {"unparsable": 2, "too_long": 2}  # C1CC, Xyz; C * 30 and C10 + benzene (21)
