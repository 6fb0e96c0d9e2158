"""The Traveller on your own data: files in, the time split, N assets, positions out with the state carried
over, and weights in and out of the seed's own PyTorch class."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import warnings

import numpy as np
import pytest
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn import checkpoint
from jax_scan_rnn.cli import main
from jax_scan_rnn.data import trading
from jax_scan_rnn.tasks import traveller as task_lib
from jax_scan_rnn.train import TrainConfig

# float32 positions through two frameworks (the parity suite's bound for T = 1000; these runs are shorter).
POSITION_ATOL = 1e-5
STEPS = 400  # rows of the test files: 280 train, 60 validation, 60 test with the default fractions
TINY = ["--hidden-size", "8", "--num-layers", "1", "--batch-size", "8", "--seq-len", "32", "--log-every", "10",
        "--eval-every", "0", "--checkpoint-every", "0"]


def market_rows(num_assets: int = 2, steps: int = STEPS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One simulated path: features [T, 2A] (the signals) and returns [T, A] (r_{t+1}, as market_data wants)."""
    m = trading.simulate(trading.MarketConfig(num_assets=num_assets), 1, steps, seed=seed)
    # Returns on a daily scale (~1%), features on their own (standardisation must undo it): what files hold.
    return 3.0 + 2.0 * m.features[0], 0.01 * m.returns[0]


def write_csv(path, features, returns, *, extra: dict | None = None) -> None:
    names = [f"f{i}" for i in range(features.shape[1])] + [f"r_{a}" for a in "abcdefgh"[: returns.shape[1]]]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", *names, *(extra or {})])
        for t in range(len(features)):
            writer.writerow([f"day{t}", *features[t], *returns[t], *(v[t] for v in (extra or {}).values())])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One short training run on a CSV file, shared by the tests that read it."""
    folder = tmp_path_factory.mktemp("data_run")
    features, returns = market_rows()
    write_csv(folder / "prices.csv", features, returns)
    out = folder / "run"
    code = main(["train", "traveller", "--data", str(folder / "prices.csv"), "--feature-cols", "f*",
                 "--return-cols", "r_*", "--steps", "40", "--lr", "0.01", *TINY, "--out", str(out)])
    assert code == 0
    return folder, out, features, returns


def test_training_on_a_csv_reports_the_test_period_and_saves_training_statistics(run):
    folder, out, features, returns = run
    table = json.loads((out / "evaluation.json").read_text())
    assert table["period"] == "test" and table["steps"] == [340, 400] and table["paths"] == 1
    assert set(table["policies"]) == {"learned", "buy_and_hold", "rolling_markowitz", "no_trade"}
    assert table["policies"]["no_trade"]["utility"] == 0.0
    stats = task_lib.DataStats.from_json(checkpoint.read_metadata(out / "checkpoints")["data_stats"])
    assert (stats.train_end, stats.valid_end, stats.num_steps) == (280, 340, 400)
    # Standardisation and Sigma come from the training period alone: nothing later leaks in.
    np.testing.assert_allclose(stats.standardiser.mean, features[:280].mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.standardiser.std, features[:280].std(0), rtol=1e-12)
    np.testing.assert_allclose(stats.objective.Sigma, np.cov(returns[:280].T), rtol=1e-10)
    assert stats.asset_names == ("r_a", "r_b") and stats.standardiser.names == ("f0", "f1", "f2", "f3")
    assert (out / "positions.png").stat().st_size > 0


def test_training_windows_never_reach_past_the_training_period(tmp_path):
    features, returns = market_rows()
    returns[280:] = 1e6  # validation and test: any window that reached them would show it
    write_csv(tmp_path / "p.csv", features, returns)
    task = task_lib.TravellerTask(data=str(tmp_path / "p.csv"), feature_cols="f*", return_cols="r_*", seq_len=50,
                                  batch_size=64)
    data = task_lib.read_data(task)
    stats = task_lib.fit_stats(task, data)
    batch_fn = task_lib.make_batch_fn(task, 0, data, stats)
    starts = set()
    for step in range(50):
        batch = batch_fn(step)
        assert batch["features"].shape == (64, 50, 4) and batch["returns"].shape == (64, 50, 2)
        assert np.abs(batch["returns"]).max() < 1.0
        starts.update(np.flatnonzero(np.isin(returns[:, 0].astype(np.float32), batch["returns"][:, 0, 0])).tolist())
    assert max(starts) == 280 - 50  # 3,200 windows drawn: the last one ends at the training period's last step
    np.testing.assert_array_equal(batch_fn(7)["features"], batch_fn(7)["features"])  # a pure function of the step
    # A window as long as the whole training period is allowed (one start); one step longer is refused.
    whole = task_lib.TravellerTask(**{**task.to_json(), "seq_len": 280})
    assert task_lib.fit_stats(whole, data).train_end == 280
    with pytest.raises(ValueError, match="^seq_len: expected at most the training period's 280 steps, got 281$"):
        task_lib.fit_stats(task_lib.TravellerTask(**{**task.to_json(), "seq_len": 281}), data)


def test_evaluate_a_period_or_another_file(run, capsys):
    folder, out, features, returns = run
    capsys.readouterr()
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--period", "valid"]) == 0
    printed = capsys.readouterr().out
    assert "valid period: steps 280-339 of 1 path(s)" in printed and "rolling Markowitz" in printed
    step = checkpoint.latest_step(out / "checkpoints")
    assert f"positions plot: {out / f'positions-step{step}-valid.png'}" in printed  # the run's positions.png stays
    write_csv(folder / "later.csv", *market_rows(seed=5, steps=120))
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--data", str(folder / "later.csv"),
                 "--plot", str(folder / "later.png")]) == 0
    assert "all period: steps 0-119 of 1 path(s)" in capsys.readouterr().out
    assert main(["evaluate", "traveller", "--checkpoint", str(out), "--paths", "4"]) == 2
    assert "--paths: expected only for a run on the simulated market" in capsys.readouterr().err


def read_positions(path) -> np.ndarray:
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["path", "step", "r_a", "r_b"]
    return np.array([[float(v) for v in row[2:]] for row in rows[1:]])


def test_run_writes_positions_and_two_halves_with_the_state_carried_equal_the_whole(run, capsys):
    folder, out, features, returns = run
    write_csv(folder / "first.csv", features[:150], returns[:150])
    # The second half has no return columns: new bars, whose future is not known yet.
    with open(folder / "second.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", *(f"f{i}" for i in range(4))])
        writer.writerows([f"day{t}", *features[t]] for t in range(150, STEPS))
    whole, first, second = folder / "whole.csv", folder / "first_pos.csv", folder / "second_pos.csv"
    base = ["run", "traveller", "--checkpoint", str(out)]
    assert main([*base, "--data", str(folder / "prices.csv"), "--output", str(whole)]) == 0
    assert main([*base, "--data", str(folder / "first.csv"), "--output", str(first), "--final-state",
                 str(folder / "state.npz")]) == 0
    assert main([*base, "--data", str(folder / "second.csv"), "--output", str(second), "--initial-state",
                 str(folder / "state.npz")]) == 0
    w = read_positions(whole)
    assert w.shape == (STEPS, 2) and np.abs(w).max() <= 1.0
    halves = np.concatenate([read_positions(first), read_positions(second)])
    np.testing.assert_allclose(halves, w, rtol=0, atol=1e-6)  # the CSV's 8 significant digits
    # The library's call: equal to rounding of the same float32 program run in two pieces.
    model, task, stats = task_lib.load(out)
    x = stats.standardiser(features[None])
    p_whole, s_whole = task_lib.positions(model, x)
    p_a, s_a = task_lib.positions(model, x[:, :150])
    p_b, s_b = task_lib.positions(model, x[:, 150:], s_a)
    np.testing.assert_allclose(np.concatenate([p_a, p_b], axis=1), p_whole, rtol=0, atol=1e-6)
    for name, a, b in zip(s_whole._fields, s_whole, s_b):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-6, err_msg=f"state.{name}")
    # Live use in Python, as docs/cli.md gives it: one raw bar [B, F] at a time, standardised by the run's stats,
    # from the state file the first half's `run traveller` saved, gives what it wrote for the second file.
    with np.load(folder / "state.npz") as f:
        saved = jsr.TravellerState(*(f[k] for k in jsr.TravellerState._fields))
    for name, a, b in zip(saved._fields, saved, s_a):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6, err_msg=f"saved state.{name}")
    fast, state, written = jsr.jit(model), saved, read_positions(second)
    for t in range(150, STEPS):
        p_t, state = fast.step(state, stats.standardiser(features[None, t]))
        np.testing.assert_allclose(np.asarray(p_t)[0], written[t - 150], rtol=0, atol=1e-6,
                                   err_msg=f"live tick {t}")


def test_run_refuses_a_state_of_another_model_and_a_file_with_other_features(run, capsys, tmp_path):
    folder, out, features, returns = run
    np.savez(tmp_path / "bad.npz", h=np.zeros((1, 1, 5)), c=np.zeros((1, 1, 5)), positions=np.zeros((1, 2)))
    target = tmp_path / "p.csv"
    base = ["run", "traveller", "--checkpoint", str(out), "--output", str(target)]
    assert main([*base, "--data", str(folder / "prices.csv"), "--initial-state", str(tmp_path / "bad.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--initial-state: state.h: expected shape [1, 1, 8]" in err, err
    assert not target.exists()  # nothing written half
    # A state of the same shapes from other weights (another run, another seed) would give wrong positions silently:
    # the state file names the weights that produced it.
    from jax_scan_rnn.cli import weights_digest

    state = tmp_path / "state.npz"
    assert main([*base, "--data", str(folder / "prices.csv"), "--final-state", str(state)]) == 0
    model, _, _ = task_lib.load(out)
    saved = dict(np.load(state))
    assert str(saved["weights_sha256"]) == weights_digest(model) == weights_digest(task_lib.load(out)[0])
    assert str(saved["checkpoint"]) == f"{out.absolute()} --step 40"  # the step used
    other = jsr.Traveller(num_inputs=model.num_inputs, hidden_size=8, num_layers=1, rngs=nnx.Rngs(1))
    assert weights_digest(other) != weights_digest(model)
    np.savez(state, **{**saved, "weights_sha256": weights_digest(other), "checkpoint": "/elsewhere/run"})
    capsys.readouterr()
    target.unlink()
    assert main([*base, "--data", str(folder / "prices.csv"), "--initial-state", str(state)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"jax-scan-rnn run traveller: error: --initial-state: {state} is the state of other weights (saved with "
        "--checkpoint /elsewhere/run; this --checkpoint's weights differ): a state continues only the model that "
        "produced it; leave --initial-state out to start from the zero state")
    assert not target.exists()
    np.savez(state, **{k: v for k, v in saved.items() if k in ("h", "c", "positions")})  # a file from before: read
    assert main([*base, "--data", str(folder / "prices.csv"), "--initial-state", str(state)]) == 0
    target.unlink()
    # One file for the positions and a state would lose one of them; a state carried forward in place is fine.
    capsys.readouterr()
    for flag in ("--final-state", "--initial-state"):
        assert main([*base, "--data", str(folder / "prices.csv"), flag, str(target)]) == 2
        assert capsys.readouterr().err.strip().endswith(f"--output: expected another file than {flag}, got {target} "
                                                        "for both")
    # Nor may an output replace the data: this --data file, or the one the run trained on.
    prices = folder / "prices.csv"
    before = prices.read_bytes()
    for data, flag, what in ((prices, "--output", "--data"), (prices, "--final-state", "--data"),
                             (folder / "later.csv", "--output", "the run's --data file")):
        argv = ["run", "traveller", "--checkpoint", str(out), "--data", str(data), "--output", str(target), flag,
                str(prices)]
        assert main(argv) == 2
        assert capsys.readouterr().err.strip().endswith(f"{flag}: expected another file than {what}, got {prices} "
                                                        "for both")
    assert prices.read_bytes() == before and not target.exists()
    before = state.read_bytes()
    assert main([*base, "--data", str(folder / "prices.csv"), "--initial-state", str(state), "--final-state",
                 str(state)]) == 0
    assert state.read_bytes() != before and not (tmp_path / f".{state.name}.tmp").exists()
    target.unlink()
    write_csv(tmp_path / "three.csv", features[:, :3], returns)
    assert main([*base, "--data", str(tmp_path / "three.csv")]) == 2
    assert "--data: " in capsys.readouterr().err and not target.exists()


def test_new_data_with_a_gap_takes_a_fill_policy_of_its_own(run, capsys, tmp_path):
    """A live file with a missing bar: the run's own policy (error, as trained) names --fill, which `run` and
    `evaluate --data` now take; without --data, evaluate reads the run's file as it was trained."""
    folder, out, features, returns = run
    gappy = features[:30].copy()
    gappy[7, 1] = np.nan
    write_csv(tmp_path / "gap.csv", gappy, returns[:30])
    target = tmp_path / "p.csv"
    base = ["run", "traveller", "--checkpoint", str(out), "--data", str(tmp_path / "gap.csv"), "--output", str(target)]
    assert main(base) == 2
    assert "column 'f1', row 8 (line 9): missing value (1 missing in total) (or choose a --fill policy: ffill, zero, " \
        "drop)" in capsys.readouterr().err and not target.exists()
    assert main([*base, "--fill", "ffill"]) == 0
    filled = gappy.copy()
    filled[7, 1] = filled[6, 1]
    write_csv(tmp_path / "filled.csv", filled, returns[:30])
    assert main([*base[:5], str(tmp_path / "filled.csv"), "--output", str(tmp_path / "q.csv")]) == 0
    assert read_positions(target).tolist() == read_positions(tmp_path / "q.csv").tolist()
    # --fill drop: the bar is skipped, and every other row keeps its step, so positions line up with the file.
    assert main([*base[:-1], str(tmp_path / "d.csv"), "--fill", "drop"]) == 0
    with open(tmp_path / "d.csv", newline="") as f:
        written = list(csv.reader(f))[1:]
    assert [(int(p), int(t)) for p, t, *_ in written] == [(0, t) for t in range(30) if t != 7]
    evaluate = ["evaluate", "traveller", "--checkpoint", str(out), "--plot", str(tmp_path / "p.png")]
    assert main([*evaluate, "--data", str(tmp_path / "gap.csv"), "--fill", "zero"]) == 0
    capsys.readouterr()
    assert main([*evaluate, "--fill", "zero"]) == 2
    assert "--fill: expected only with --data" in capsys.readouterr().err


def test_run_a_model_trained_on_the_simulated_market_on_an_npz(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "traveller", *TINY, "--steps", "2", "--train-paths", "64", "--eval-paths", "4",
                 "--eval-steps", "16", "--out", str(out)]) == 0
    m = trading.simulate(trading.MarketConfig(), 3, 20, seed=4)
    np.savez(tmp_path / "signals.npz", features=m.features)
    target = tmp_path / "positions.csv"
    assert main(["run", "traveller", "--checkpoint", str(out), "--data", str(tmp_path / "signals.npz"), "--output",
                 str(target)]) == 0
    rows = list(csv.reader(target.open()))
    assert rows[0] == ["path", "step", "asset_0", "asset_1"] and len(rows) == 1 + 3 * 20
    assert [(int(r[0]), int(r[1])) for r in rows[1:]] == [(p, t) for p in range(3) for t in range(20)]  # from 0
    model, _, _ = task_lib.load(out)
    want, _ = task_lib.positions(model, m.features)
    # every position read back exactly (8 significant digits left ~0.7% of float32 positions 1 ulp off)
    np.testing.assert_array_equal(np.array([r[2:] for r in rows[1:]]).astype(want.dtype), want.reshape(-1, 2))
    np.savez(tmp_path / "wide.npz", features=np.zeros((1, 5, 6)))
    capsys.readouterr()
    assert main(["run", "traveller", "--checkpoint", str(out), "--data", str(tmp_path / "wide.npz"), "--output",
                 str(target)]) == 2
    err = capsys.readouterr().err
    assert "--data: " in err and "has 6 features per step, the model reads 4" in err, err


def seed_class():
    """torch, and seed 000's own class as the seed writes it (tests/test_torch_traveller.py: `SeedTraveller`)."""
    torch = pytest.importorskip("torch")
    from tests.test_torch_traveller import SeedTraveller

    return torch, SeedTraveller


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_export_loads_into_the_seeds_class_and_gives_the_same_positions(run, fmt, tmp_path, capsys):
    torch, Seed = seed_class()
    folder, out, features, returns = run
    target = tmp_path / ("model.pt" if fmt == "torch" else "model.safetensors")
    assert main(["export", "traveller", "--checkpoint", str(out), "--format", fmt, "--output", str(target)]) == 0
    if fmt == "torch":
        state_dict = torch.load(target, weights_only=True)
    else:
        from safetensors.torch import load_file

        state_dict = load_file(target)
    seed = Seed(4, 8, 1, 0.0)
    seed.load_state_dict(state_dict)  # strict: every key of the seed's class, nothing else
    side = json.loads(target.with_name(target.name + ".json").read_text())
    assert side["model"] == "torch_ref.Traveller" and side["arguments"] == {
        "num_inputs": 4, "hidden_size": 8, "num_layers": 1, "dropout": 0.0, "num_assets": 2}
    assert side["data_stats"]["standardiser"]["names"] == ["f0", "f1", "f2", "f3"]
    # which run and step: two exports told apart by their files alone
    assert side["source"] == {"checkpoint": os.path.abspath(out), "step": checkpoint.latest_step(out / "checkpoints")}
    import torch_ref

    torch_ref.Traveller(**side["arguments"]).load_state_dict(state_dict)  # strict: the arguments are the model's
    # The seed's own forward (its loop over nn.LSTM, the seed's [T, 1, F] -> [T, 2]) against the JAX model.
    model, _, stats = task_lib.load(out)
    x = stats.standardiser(features[None])
    with torch.no_grad():
        want = seed(torch.from_numpy(x[0][:, None]))
    got, _ = task_lib.positions(model, x)
    np.testing.assert_allclose(got[0], want.numpy(), rtol=0, atol=POSITION_ATOL)


def test_a_run_saving_the_first_data_digest_is_evaluated_and_resumed_on_its_unchanged_file(run, tmp_path, capsys,
                                                                                             monkeypatch):
    """Runs saved 2026-12-05 23:27 to 2026-12-06 01:02 UTC recorded their data's sha256 over its float64 values in
    the file's path order (the digest since reads float32 values in the paths' label order): their unchanged file
    is the data they trained on, not one revised since (evaluate refused it, --resume named it as changed)."""
    import hashlib
    import shutil

    folder, out, _, _ = run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)  # --resume writes into the run: the module's run stays as it is
    meta = checkpoint.read_metadata(copy / "checkpoints")
    data = task_lib.read_data(task_lib.TravellerTask.from_json(meta["task"]))
    first = hashlib.sha256(json.dumps([data.feature_names, data.asset_names, data.features.shape,
                                       data.returns.shape]).encode())
    for values in (data.features, data.returns):  # the digest as c451e79 wrote it
        first.update(np.ascontiguousarray(values, np.float64).tobytes())
    assert first.hexdigest() != meta["data_stats"]["data_sha256"]
    read = checkpoint.read_metadata
    monkeypatch.setattr(checkpoint, "read_metadata", lambda *a, **k: {
        **read(*a, **k), "data_stats": {**read(*a, **k)["data_stats"], "data_sha256": first.hexdigest()}})
    capsys.readouterr()
    assert main(["evaluate", "traveller", "--checkpoint", str(copy), "--plot", str(tmp_path / "p.png")]) == 0
    assert main(["train", "traveller", "--out", str(copy), "--resume"]) == 0, capsys.readouterr().err
    assert "the data in --data" not in capsys.readouterr().err


def test_resume_on_a_data_file_that_changed_is_refused_unless_overridden(run, capsys):
    """Rows appended or a value revised since the run started: training would go on with another split and
    standardisation, so --resume names it as a changed setting (exit 2, one line, the run untouched)."""
    folder, out, features, returns = run
    path = folder / "prices.csv"
    original = path.read_bytes()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    args = ["train", "traveller", "--data", str(path), "--feature-cols", "f*", "--return-cols", "r_*", "--steps", "40",
            "--lr", "0.01", *TINY, "--out", str(out), "--resume"]
    capsys.readouterr()
    try:
        write_csv(path, *market_rows(steps=STEPS + 50))  # 50 more rows
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "the run in" in err, err
        assert f"(the data in --data {path} (steps per path {STEPS} -> {STEPS + 50}))" in err, err
        revised = features.copy()
        revised[3, 0] += 1.0  # one value of the training period
        write_csv(path, revised, returns)
        assert main(args) == 2
        assert f"(the data in --data {path} (its training period's mean, std or covariance))" in capsys.readouterr().err
        # A value the training period's statistics do not show (a validation row): named too, and evaluate, which
        # would score the run's periods on it, refuses it (another file, --data, is scored as a whole).
        revised = features.copy()
        revised[300, 0] += 1.0
        write_csv(path, revised, returns)
        assert main(args) == 2
        assert (f"(the data in --data {path} (its values (sha256), though not the training period's mean, std or "
                "covariance))") in capsys.readouterr().err
        assert main(["evaluate", "traveller", "--checkpoint", str(out)]) == 2
        assert capsys.readouterr().err.strip().endswith(
            f"--checkpoint: the run's data file {path} is not the data the model was trained on (its values changed "
            "since, or the run was given other data in Python): its periods would be scored on other values; pass "
            "--data FILE to evaluate on a file as a whole")
        # A return alone revised (the features as trained): named too.
        returned = returns.copy()
        returned[300, 0] += 0.01
        write_csv(path, features, returned)
        assert main(["evaluate", "traveller", "--checkpoint", str(out)]) == 2
        assert "is not the data the model was trained on" in capsys.readouterr().err
    finally:
        path.write_bytes(original)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_an_export_whose_side_file_is_a_runs_own_file_is_refused(run, capsys):
    """`--output RUN/evaluation`: the export itself is no file of the run, but its side file (FILE.json) would
    replace the run's evaluation.json; refused in one line, before anything is written."""
    _, out, _, _ = run
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["export", "traveller", "--checkpoint", str(out), "--format", "torch", "--output",
                 str(out / "evaluation")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--output (its side file): {out / 'evaluation.json'} belongs to" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_init_from_a_torch_state_dict_starts_there(tmp_path, capsys):
    torch, Seed = seed_class()
    write_csv(tmp_path / "p.csv", *market_rows())
    seed = Seed(4, 8, 1, 0.0)
    torch.save(seed.state_dict(), tmp_path / "seed.pt")
    out = tmp_path / "run"
    data = ["--data", str(tmp_path / "p.csv"), "--feature-cols", "f*", "--return-cols", "r_*"]
    # One update at a learning rate of 1e-12: the weights are the file's, to float32 rounding.
    assert main(["train", "traveller", *data, *TINY, "--steps", "1", "--lr", "1e-12", "--init-from",
                 str(tmp_path / "seed.pt"), "--out", str(out)]) == 0
    model, _, _ = task_lib.load(out)
    for key, value in jsr.torch_state_dict(model).items():
        np.testing.assert_allclose(value, seed.state_dict()[key].numpy(), rtol=0, atol=1e-9, err_msg=key)
    meta = checkpoint.read_metadata(out / "checkpoints")
    assert meta["init_from"]["path"] == str(tmp_path / "seed.pt") and len(meta["init_from"]["sha256"]) == 64
    capsys.readouterr()
    wrong = Seed(4, 16, 1, 0.0)
    torch.save(wrong.state_dict(), tmp_path / "wrong.pt")
    assert main(["train", "traveller", *data, *TINY, "--steps", "1", "--init-from", str(tmp_path / "wrong.pt"),
                 "--out", str(tmp_path / "run2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("jax-scan-rnn train traveller: error: --init-from: "), err
    assert "state_dict['lstm_layers.weight_ih_l0']: expected shape (32, 6), got (64, 6)" in err, err
    assert "its 'lstm_layers' is a torch.nn.LSTM(6, 16), this model's a LSTM(6, 8)" in err, err
    assert not (tmp_path / "run2").exists()  # refused before the run's directory is made


def test_init_from_an_export_checks_its_features_and_assets_by_name(run, tmp_path, capsys):
    """The weights read their inputs by position: an export's side file names them, so the same columns in
    another order are refused (one line, before --out is made), and other names or the other market are said."""
    folder, out, features, returns = run
    target = tmp_path / "model.pt"
    assert main(["export", "traveller", "--checkpoint", str(out), "--format", "torch", "--output", str(target)]) == 0
    capsys.readouterr()
    # A file whose columns come in another order: each weight would read another column.
    for kind, f_order, r_order in (("features", [1, 0, 2, 3], [0, 1]), ("assets", [0, 1, 2, 3], [1, 0])):
        swapped = tmp_path / f"swapped_{kind}.csv"
        write_csv(swapped, features[:, f_order], returns[:, r_order])
        names = {"features": [f"f{i}" for i in f_order], "assets": [f"r_{'ab'[i]}" for i in r_order]}[kind]
        text = swapped.read_text().splitlines()
        header = ["date", *(f"f{i}" for i in f_order), *(f"r_{'ab'[i]}" for i in r_order)]
        swapped.write_text("\n".join([",".join(header), *text[1:]]) + "\n")
        assert main(["train", "traveller", "--data", str(swapped), "--feature-cols", "f*", "--return-cols", "r_*",
                     *TINY, "--steps", "1", "--init-from", str(target), "--out", str(tmp_path / "swapped")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("jax-scan-rnn train traveller: error: --init-from: "), err
        assert f"reads its {kind} in the order" in err and f"holds them in the order {names}: write its columns in " \
            "the model's order" in err, err
        assert not (tmp_path / "swapped").exists()
    # Other sizes: the side file's arguments named as flags, with the run's (not the state_dict's shapes).
    assert main(["train", "traveller", "--data", str(folder / "prices.csv"), "--feature-cols", "f*", "--return-cols",
                 "r_*", *TINY, "--hidden-size", "16", "--num-layers", "2", "--steps", "1", "--init-from",
                 str(target), "--out", str(tmp_path / "sizes")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"jax-scan-rnn train traveller: error: --init-from: {target} holds a model with --hidden-size 8, "
                   f"--num-layers 1 ({target}.json); this run's has --hidden-size 16, --num-layers 2: set them to "
                   "the file's"), err
    # Other names (a fine-tune on a new file): trained, with one warning line naming --init-from.
    renamed = tmp_path / "renamed.csv"
    renamed.write_text(folder.joinpath("prices.csv").read_text().replace("f0,", "g0,", 1))
    assert main(["train", "traveller", "--data", str(renamed), "--feature-cols", "f*,g0", "--return-cols", "r_*",
                 *TINY, "--steps", "1", "--init-from", str(target), "--out", str(tmp_path / "renamed")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if ": warning: " in line]
    assert warned == [f"jax-scan-rnn train traveller: warning: --init-from: {target}'s model was trained on the "
                      f"features ['f0', 'f1', 'f2', 'f3'] ({target}.json), this run's are ['g0', 'f1', 'f2', 'f3']: "
                      "they are matched by position"], warned
    # A model of the simulated market (its export's side file has no data_stats) into a run on your data.
    sim = tmp_path / "sim"
    assert main(["train", "traveller", *TINY, "--steps", "1", "--train-paths", "64", "--eval-paths", "4",
                 "--eval-steps", "16", "--out", str(sim)]) == 0
    assert main(["export", "traveller", "--checkpoint", str(sim), "--format", "torch", "--output",
                 str(tmp_path / "sim.pt")]) == 0
    assert "data_stats" not in json.loads((tmp_path / "sim.pt.json").read_text())
    capsys.readouterr()
    with pytest.warns(UserWarning, match=r"^init_from: .*sim.pt's model was trained on the simulated market "):
        task_lib.load_init(task_lib.load(out)[0], tmp_path / "sim.pt", task_lib.load(out)[2])
    # An older export's side file (the DataStats itself) is read as it was; another model's is refused.
    side = json.loads((tmp_path / "model.pt.json").read_text())
    (tmp_path / "model.pt.json").write_text(json.dumps(side["data_stats"]))
    model, _, stats = task_lib.load(out)
    with warnings.catch_warnings():  # without the run's stats (the Python API's two-argument call): not compared
        warnings.simplefilter("error")
        task_lib.load_init(model, tmp_path / "sim.pt")
    swapped = dataclasses.replace(stats, asset_names=("r_b", "r_a"))
    with pytest.raises(ValueError, match=r"^init_from: .*model.pt's model reads its assets in the order \['r_a', "):
        task_lib.load_init(model, target, swapped)
    (tmp_path / "model.pt.json").write_text(json.dumps({"model": "torch_ref.SeqVAE"}))
    with pytest.raises(ValueError, match=r"^init_from: .*model.pt.json is not the side file `export traveller` "
                                         r"writes \(ValueError: it describes a torch_ref.SeqVAE\)"):
        task_lib.load_init(model, target, stats)


def test_init_from_without_a_side_file_or_from_the_other_market(run, tmp_path, capsys):
    """A state_dict without a side file (written by hand for the seed's class) is loaded without a word on either
    market; a model of your data into a run on the simulated market is said, naming both; a side file that is not
    a JSON object is refused in one line; the simulated market's export is its arguments alone, and loads into a
    run on the simulated market."""
    import shutil
    import warnings

    folder, out, features, returns = run
    target = tmp_path / "model.pt"
    assert main(["export", "traveller", "--checkpoint", str(out), "--format", "torch", "--output", str(target)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "its arguments and the standardisation of the features it reads (the training period's mean and std): "
        f"{target}.json")
    model, _, stats = task_lib.load(out)
    bare = tmp_path / "bare.pt"
    shutil.copy(target, bare)  # no bare.pt.json
    for market in (stats, None):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            task_lib.load_init(model, bare, market)
    with pytest.warns(UserWarning, match=r"^init_from: .*model.pt's model was trained on your data \(.*model.pt.json\), "
                                         r"this run trains on the simulated market: its inputs are matched by position$"):
        task_lib.load_init(model, target, None)
    target.with_name("model.pt.json").write_text("[]")
    with pytest.raises(ValueError, match=r"^init_from: .*model.pt.json is not the side file `export traveller` "
                                         r"writes \(AttributeError: "):
        task_lib.load_init(model, target, stats)
    sim = tmp_path / "sim"
    assert main(["train", "traveller", *TINY, "--steps", "1", "--train-paths", "64", "--eval-paths", "4",
                 "--eval-steps", "16", "--out", str(sim)]) == 0
    assert main(["export", "traveller", "--checkpoint", str(sim), "--format", "torch", "--output",
                 str(tmp_path / "sim.pt")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"its arguments: {tmp_path / 'sim.pt'}.json"
    assert main(["train", "traveller", *TINY, "--steps", "1", "--train-paths", "64", "--eval-paths", "4",
                 "--eval-steps", "16", "--init-from", str(tmp_path / "sim.pt"), "--out", str(tmp_path / "again")]) == 0


def test_export_side_holds_the_torch_twins_arguments():
    # torch_ref.Traveller's dropout is the task's (it acts between layers, so with num_layers=2), and the
    # simulated market has no DataStats to write.
    torch = pytest.importorskip("torch")
    import torch_ref

    task = task_lib.TravellerTask(hidden_size=8, num_layers=2, dropout=0.25, num_assets=2)
    model = task_lib.build_model(task, 0, None)
    side = task_lib.export_side(model, task, None)
    assert side == {"model": "torch_ref.Traveller", "arguments": {"num_inputs": 4, "hidden_size": 8, "num_layers": 2,
                                                                  "dropout": 0.25, "num_assets": 2}}
    twin = torch_ref.Traveller(**side["arguments"])
    # strict: the arguments are the model's
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in jsr.torch_state_dict(model).items()})
    assert twin.lstm_layers.dropout == 0.25

@pytest.mark.parametrize("num_assets", [1, 5])
def test_n_assets_from_an_npz_file_and_on_the_simulated_market(num_assets, tmp_path):
    features, returns = market_rows(num_assets)
    np.savez(tmp_path / "m.npz", features=features[None], returns=returns[None])
    cfg = TrainConfig(steps=3, log_every=1, eval_every=0, checkpoint_every=0)
    task = task_lib.TravellerTask(hidden_size=8, num_layers=1, batch_size=4, seq_len=16, data=str(tmp_path / "m.npz"))
    model, _, stats = task_lib.train(task, cfg)
    assert model.num_assets == num_assets and stats.objective.num_assets == num_assets
    table = task_lib.data_table(model, task_lib.read_data(task), stats)
    assert table["policies"]["learned"]["turnover"] > 0
    sim = task_lib.TravellerTask(hidden_size=8, num_layers=1, batch_size=4, seq_len=16, train_paths=16, eval_paths=4,
                                 eval_steps=20, num_assets=num_assets)
    model, _, _ = task_lib.train(sim, cfg)
    assert model.num_assets == num_assets and model.num_inputs == 2 * num_assets
    assert task_lib.evaluate(model, sim)["optimal"] > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--feature-cols", "g*"], "--feature-cols: "),
        (["--return-cols", "f0"], "--return-cols: "),
        (["--objective", "mse"], "--objective: expected 'utility' with --data FILE"),
        (["--num-assets", "3"], "--num-assets: expected the data's 2 return columns"),
        (["--seq-len", "400"], "--seq-len: expected at most the training period's 280 steps, got 400"),
        (["--test-fraction", "0.999"], "--test-fraction: "),
    ],
)
def test_bad_data_options_are_one_line_and_write_nothing(extra, message, tmp_path, capsys):
    write_csv(tmp_path / "p.csv", *market_rows())
    out = tmp_path / "run"
    argv = ["train", "traveller", "--data", str(tmp_path / "p.csv"), "--feature-cols", "f*", "--return-cols", "r_*",
            *TINY, "--steps", "2", *extra, "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert not out.exists()


def test_missing_values_need_a_fill_policy(tmp_path, capsys):
    features, returns = market_rows()
    features[100, 2] = np.nan
    write_csv(tmp_path / "p.csv", features, returns)
    argv = ["train", "traveller", "--data", str(tmp_path / "p.csv"), "--feature-cols", "f*", "--return-cols", "r_*",
            *TINY, "--steps", "2", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'f2'" in err and "--fill" in err, err
    assert main([*argv, "--fill", "ffill"]) == 0


def test_missing_files_name_their_flag(tmp_path, capsys):
    write_csv(tmp_path / "p.csv", *market_rows())
    cols = ["--feature-cols", "f*", "--return-cols", "r_*", *TINY, "--steps", "2", "--out", str(tmp_path / "run")]
    assert main(["train", "traveller", "--data", str(tmp_path / "nope.csv"), *cols]) == 2
    assert f"--data: {tmp_path / 'nope.csv'}: no such file" in capsys.readouterr().err
    assert main(["train", "traveller", "--data", str(tmp_path / "p.csv"), "--covariance", str(tmp_path / "c.npy"),
                 *cols]) == 2
    assert f"--covariance: {tmp_path / 'c.npy'}: no such file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_data_options_without_data_are_refused(capsys):
    assert main(["train", "traveller", "--feature-cols", "f*", "--steps", "1"]) == 2
    assert "--feature-cols: expected only together with --data FILE" in capsys.readouterr().err


def test_train_on_data_batches_by_the_runs_seed_and_chooses_on_the_validation_period(tmp_path, monkeypatch):
    """The evaluation during training (what picks a checkpoint) scores the validation period, never the training
    one; the run's seed orders the windows."""
    features, returns = market_rows()
    write_csv(tmp_path / "p.csv", features, returns)
    task = task_lib.TravellerTask(data=str(tmp_path / "p.csv"), feature_cols="f*", return_cols="r_*", seq_len=32,
                                  hidden_size=8, num_layers=1, batch_size=8)
    seen = {}
    monkeypatch.setattr(task_lib, "fit", lambda model, loss_fn, batch_fn, cfg, **kw: seen.update(
        model=model, batch_fn=batch_fn, **kw))
    _, _, stats = task_lib.train(task, TrainConfig(steps=1, seed=7))
    data = task_lib.read_data(task)
    first = seen["batch_fn"](0)["features"]
    np.testing.assert_array_equal(first, task_lib.make_batch_fn(task, 7, data, stats)(0)["features"])
    assert not np.array_equal(first, task_lib.make_batch_fn(task, 0, data, stats)(0)["features"])
    tables = {period: task_lib.data_table(seen["model"], data, stats, period)["policies"]["learned"]["utility"]
              for period in ("train", "valid")}
    assert tables["train"] != pytest.approx(tables["valid"])
    assert seen["eval_fn"](seen["model"])["utility"] == pytest.approx(tables["valid"], rel=1e-6)


def tiny_market_task(valid_fraction: float):
    """Two paths of 40 steps in memory (3 features, 2 assets) and a tiny Traveller task over them."""
    from jax_scan_rnn.data.market_data import MarketData
    from jax_scan_rnn.tasks import traveller as tv

    rng = np.random.default_rng(0)
    data = MarketData(rng.standard_normal((2, 40, 3)), 0.01 * rng.standard_normal((2, 40, 2)), ("f0", "f1", "f2"),
                      ("a", "b"))
    return data, tv.TravellerTask(data="mem.npz", seq_len=5, batch_size=4, hidden_size=4,
                                  valid_fraction=valid_fraction, test_fraction=0.15)


def test_without_a_validation_period_training_evaluates_on_the_training_period():
    """valid_fraction=0: the eval rows during training score the training period, never the test period."""
    from jax_scan_rnn.tasks import traveller as tv
    from jax_scan_rnn.train import TrainConfig

    data, task = tiny_market_task(valid_fraction=0.0)
    model, history, stats = tv.train(task, TrainConfig(steps=2, log_every=1, eval_every=0, checkpoint_every=0),
                                     data=data)
    x = tv.positions(model, stats.standardiser(data.features))[0]
    train, test = (tv.score_period(x, data, stats, a, b, task.periods_per_year)["utility"]
                   for a, b in ((0, stats.train_end), (stats.valid_end, data.num_steps)))
    got = history.eval[-1]["metrics"]["utility"]
    assert got == pytest.approx(train, rel=1e-6, abs=1e-9) and got != pytest.approx(test, rel=1e-6, abs=1e-9)


def test_an_undefined_sharpe_ratio_is_logged_as_nan_not_zero(monkeypatch):
    """A validation period whose net return is constant (here: no cost and no return) has no Sharpe ratio; the eval
    rows said 0.0, a measured figure, where the reports say n/a. It is NaN now (null in metrics.jsonl)."""
    from jax_scan_rnn.data.market_data import MarketData
    from jax_scan_rnn.tasks import traveller as tv

    data, task = tiny_market_task(valid_fraction=0.15)
    task = dataclasses.replace(task, cost_scale=0.0)
    stats = tv.fit_stats(task, data)
    returns = data.returns.copy()
    returns[:, stats.train_end:stats.valid_end] = 0.0  # a market closed over the validation period
    data = MarketData(data.features, returns, data.feature_names, data.asset_names)
    seen = {}
    monkeypatch.setattr(tv, "fit", lambda model, loss_fn, batch_fn, cfg, **kw: seen.update(model=model, **kw))
    tv.train(task, TrainConfig(steps=1), data=data)
    start, stop = stats.train_end, stats.valid_end
    x = tv.positions(seen["model"], stats.standardiser(data.features))[0]
    assert tv.score_period(x, data, stats, start, stop)["sharpe"] is None
    logged = seen["eval_fn"](seen["model"])
    assert math.isnan(logged["sharpe"])


def test_the_data_table_says_how_its_sharpe_ratios_are_annualised():
    """evaluation.json's Sharpe ratios are annualised with the run's --periods-per-year, which the file did not hold:
    a daily run's and an hourly run's reports compared by script differ by sqrt(8760 / 252) in every ratio, unsaid."""
    from jax_scan_rnn.tasks import traveller as tv

    data, task = tiny_market_task(valid_fraction=0.15)
    stats = tv.fit_stats(task, data)
    model = tv.build_model(task, 0, stats)
    daily, monthly = (tv.data_table(model, data, stats, "test", rate) for rate in (252, 12))
    assert daily["periods_per_year"] == 252 and monthly["periods_per_year"] == 12
    ratio = monthly["policies"]["learned"]["sharpe"] / daily["policies"]["learned"]["sharpe"]
    assert ratio == pytest.approx(math.sqrt(12 / 252), rel=1e-12)


def test_a_later_period_is_scored_from_the_position_held_before_it():
    """Buy-and-hold holds one position throughout: scored from the position held just before the test period,
    it trades nothing there (no cost, no turnover)."""
    from jax_scan_rnn.tasks import traveller as tv

    data, task = tiny_market_task(valid_fraction=0.15)
    stats = tv.fit_stats(task, data)
    row = tv.data_table(tv.build_model(task, 0, stats), data, stats, "test")["policies"]["buy_and_hold"]
    assert row["cost"] == 0 and row["turnover"] == 0


def test_without_a_validation_period_the_cli_says_what_the_eval_figures_score(run, tmp_path, capsys):
    folder, _, _, _ = run
    assert main(["train", "traveller", "--data", str(folder / "prices.csv"), "--feature-cols", "f*", "--return-cols",
                 "r_*", "--valid-fraction", "0", "--steps", "2", *TINY, "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    assert ("train steps 0-339, no validation period (the bar's eval figures score the training period), test "
            "340-399") in printed, printed


def test_the_data_digest_ignores_path_order_and_digits_beyond_float32():
    # A file re-saved by a spreadsheet (15 significant digits) or listing its paths in another order holds the data
    # the model was trained on: evaluate must not refuse it; a changed value, a renamed path, are other data.
    from jax_scan_rnn.data.market_data import MarketData
    from jax_scan_rnn.tasks.traveller import data_digest

    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((2, 30, 3)), 0.01 * rng.standard_normal((2, 30, 2))
    names = (("f0", "f1", "f2"), ("a", "b"))
    base = data_digest(MarketData(x, r, *names, path_labels=("A", "B")))
    assert data_digest(MarketData(x[::-1], r[::-1], *names, path_labels=("B", "A"))) == base
    assert data_digest(MarketData(x * (1 + 1e-15), r, *names, path_labels=("A", "B"))) == base
    revised = r.copy()
    revised[1, 20, 0] += 1e-4
    assert data_digest(MarketData(x, revised, *names, path_labels=("A", "B"))) != base
    assert data_digest(MarketData(x, r, *names, path_labels=("A", "C"))) != base


@pytest.mark.parametrize("days, rate", [(7, 52), (1, 365), (1 / 24, 8766)])  # weekly; every day; every hour
def test_a_periods_per_year_that_the_dates_contradict_draws_a_warning(tmp_path, days, rate):
    """The Sharpe ratio is annualised with periods_per_year (252, daily bars, by default): weekly bars scored with it
    reported a Sharpe ratio sqrt(252 / 52) = 2.2 times too large, hourly ones one 5.9 times too small, without a word
    (the table's heading names the 252, not the file's rate). The date column says how many rows a year the file
    holds: a periods_per_year more than RATE_MISMATCH away from it draws one warning naming both; the data's own rate,
    252 for business days (261 a year, holidays not taken out), and features read without returns (run), none."""
    import datetime

    features, returns = market_rows(steps=60)
    path = tmp_path / "bars.csv"

    def write(step):
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["date", "f0", "f1", "f2", "f3", "r_a", "r_b"])
            for t in range(60):
                stamp = datetime.datetime(2020, 1, 6) + datetime.timedelta(days=t * step)
                writer.writerow([stamp.isoformat(), *features[t], *returns[t]])

    task = task_lib.TravellerTask(data=str(path), feature_cols="f*", return_cols="r_*")
    write(days)
    with pytest.warns(UserWarning) as caught:
        data = task_lib.read_data(task)
    assert data.bars_per_year == pytest.approx(rate, rel=0.01)
    assert [str(w.message) for w in caught] == [
        f"periods_per_year: 252 annualises the Sharpe ratio, but the dates of bars.csv hold about {rate:,} rows a "
        "year: give the data's bars a year (252 daily, 365 for a market open every day, 52 weekly, 12 monthly, "
        "~1,640 hourly on an exchange) or every Sharpe ratio is off by the square root of their ratio"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task_lib.read_data(task, returns=False)  # features to trade on (run): no Sharpe ratio is annualised
        task_lib.read_data(dataclasses.replace(task, periods_per_year=rate))
        write(7 / 5)  # business days, on average
        assert task_lib.read_data(task).bars_per_year == pytest.approx(261, rel=0.01)


def test_a_week_of_an_exchanges_hourly_bars_is_not_taken_for_another_rate(tmp_path):
    """An exchange's hourly bars, 7 a day from Monday to Friday, over one week: their span (4.3 days) holds no weekend,
    so the dates read as 2,922 rows a year, 1.66 times the 7 x 252 = 1,764 the file's own periods_per_year rightly
    says, and drew the warning that it is wrong. Bars that pause (nights) over less than RATE_SPAN_DAYS give no rate;
    two weeks, which hold a weekend, read within RATE_MISMATCH of it."""
    import datetime

    def write(weeks):
        features, returns = market_rows(steps=35 * weeks)
        days = [datetime.datetime(2024, 1, 8) + datetime.timedelta(days=d) for d in range(7 * weeks) if d % 7 < 5]
        stamps = [day + datetime.timedelta(hours=9.5 + h) for day in days for h in range(7)]
        with open(tmp_path / "hourly.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["date", "f0", "f1", "f2", "f3", "r_a", "r_b"])
            writer.writerows([stamp.isoformat(), *x, *r] for stamp, x, r in zip(stamps, features, returns))

    task = task_lib.TravellerTask(data=str(tmp_path / "hourly.csv"), feature_cols="f*", return_cols="r_*",
                                  periods_per_year=7 * 252)
    for weeks, rate in ((1, None), (2, pytest.approx(2240, rel=0.01))):
        write(weeks)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert task_lib.read_data(task).bars_per_year == rate


def test_monthly_dates_that_read_two_ways_are_not_taken_for_another_rate(tmp_path):
    """Monthly bars dated on the 1st, day first (01/02/2020 is 1 February), read in time order month first too (as 2
    January): the rate the dates give is then unknown (12 a year, or 17 read as Januaries), so periods_per_year=12
    draws no warning; no reading is preferred."""
    features, returns = market_rows(steps=36)
    path = tmp_path / "monthly.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", "f0", "f1", "f2", "f3", "r_a", "r_b"])
        for t in range(36):
            writer.writerow([f"01/{t % 12 + 1:02d}/{2020 + t // 12}", *features[t], *returns[t]])
    task = task_lib.TravellerTask(data=str(path), feature_cols="f*", return_cols="r_*", periods_per_year=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert task_lib.read_data(task).bars_per_year is None


def test_paths_of_other_dates_are_refused_as_one_would_train_on_anothers_test_days(tmp_path):
    """The periods cut every path at the same step: two tickers of 60 rows each, one a year behind the other, put
    the later one's training days (2021) after the earlier one's test days (2020): the model trained on the days it
    was then scored on. That was documented but not checked; by the date column it is now refused in one line naming
    both paths and dates. The same tickers on the same dates train, and so does a path one row behind the other
    (fill='drop' dropping one row of one path: at the boundary the two meet on one day)."""
    import datetime

    features, returns = market_rows(num_assets=1, steps=120)
    path = tmp_path / "long.csv"

    def write(offsets):
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["date", "ticker", "f0", "f1", "r_a"])
            for n, (ticker, offset) in enumerate(zip("AB", offsets)):
                for t in range(60):
                    day = datetime.date(2020, 1, 1) + datetime.timedelta(days=offset + t)
                    writer.writerow([day.isoformat(), ticker, *features[60 * n + t], *returns[60 * n + t]])

    task = task_lib.TravellerTask(data=str(path), feature_cols="f*", return_cols="r_*", path_col="ticker",
                                  seq_len=8, periods_per_year=365)
    write([0, 366])
    with pytest.raises(ValueError, match=r"^path_col: the training period of path 'B' runs to 2021-02-11, after the "
                                         r"validation period of path 'A' begins \(2020-02-12\): the periods cut every "
                                         r"path at the same step, so the paths must cover the same dates row for row$"):
        task_lib.fit_stats(task, task_lib.read_data(task))
    for offsets in ([0, 0], [0, 1]):
        write(offsets)
        stats = task_lib.fit_stats(task, task_lib.read_data(task))
        assert (stats.train_end, stats.valid_end) == (42, 51)
