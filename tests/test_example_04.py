"""examples/04_traveller_real_data.py runs (--quick), reports every policy with finite numbers, and its
data set uses no future: each feature at row t is recomputed from the closes up to t alone, and the
return column at row t is the change from close t to close t+1."""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "04_traveller_real_data.py"
POLICIES = {"learned", "buy_and_hold", "rolling_markowitz", "no_trade"}
ASSETS = ("spx", "ndx")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("arch")
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("example_04")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # cwd in tmp and both folders given: nothing is written into the repository.
    done = subprocess.run([sys.executable, str(EXAMPLE), "--quick", "--out", str(tmp / "out"), "--results",
                           str(tmp / "results")], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "EagerCallWarning" not in done.stderr, done.stderr[-3000:]  # an example teaches compiled calls
    return tmp


def closes():
    """The two indices' adjusted closes on their common days, straight from arch (not from the example)."""
    from arch.data import nasdaq, sp500

    frames = {"spx": sp500.load()["Adj Close"], "ndx": nasdaq.load()["Adj Close"]}
    days = sorted(set(frames["spx"].index) & set(frames["ndx"].index))
    return [d.strftime("%Y-%m-%d") for d in days], {k: v.loc[days].to_numpy(np.float64) for k, v in frames.items()}


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [r["date"] for r in rows], {c: np.array([float(r[c]) for r in rows]) for c in rows[0] if c != "date"}


def finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def test_the_table_has_every_policy_with_finite_numbers(run):
    record = json.loads((run / "results" / "traveller_real_data.json").read_text())
    tables = [record["all_folds"]["policies"]] + [fold["policies"] for fold in record["folds"]]
    assert len(record["folds"]) == 2  # --quick
    for table in tables:
        assert set(table) == POLICIES
        for name, row in table.items():
            for key in ("utility", "return", "cost", "turnover"):
                assert finite(row[key]), (name, key, row[key])
            # Only a constant net return (no trading at all) has no Sharpe ratio.
            assert finite(row["sharpe"]) or (name == "no_trade" and row["sharpe"] is None), (name, row)
    for key in ("command", "date", "machine", "wall_seconds", "versions"):
        assert record[key], key
    assert "--quick" in record["command"]
    markdown = (run / "results" / "traveller_real_data.md").read_text()
    assert "Traveller (learned)" in markdown and "buy and hold" in markdown and "--quick" in markdown
    assert (run / "results" / "traveller_real_data.png").stat().st_size > 10_000
    assert (run / "out" / "traveller_real_data.json").is_file()


def test_each_fold_is_trained_and_validated_before_its_test_period(run):
    folds = json.loads((run / "results" / "traveller_real_data.json").read_text())["folds"]
    for fold in folds:
        assert fold["train"][1] < fold["valid"][0] <= fold["valid"][1] < fold["test"][0] <= fold["test"][1]
    for before, after in zip(folds, folds[1:]):
        assert before["test"][1] < after["test"][0]  # the test periods concatenate without overlap


def test_features_use_only_closes_up_to_their_row(run):
    days, close = closes()
    rows, table = read_csv(run / "out" / "index_daily.csv")
    where = np.searchsorted(days, rows)  # each CSV row's position among the price days
    assert [days[i] for i in where] == rows
    for asset in ASSETS:
        np.testing.assert_allclose(table[f"{asset}_close"], close[asset][where], rtol=1e-12)
    for i, t in list(enumerate(where))[::97] + [(len(where) - 1, where[-1])]:
        for asset in ASSETS:
            known = np.log(close[asset][: t + 1])  # the closes up to day t, nothing after
            daily = np.diff(known)
            for h in (1, 5, 21, 63):
                assert table[f"{asset}_mom_{h}"][i] == pytest.approx(known[-1] - known[-1 - h], rel=1e-9, abs=1e-15)
            for h in (5, 21, 63):
                assert table[f"{asset}_vol_{h}"][i] == pytest.approx(np.std(daily[-h:], ddof=1), rel=1e-9)


def test_the_return_at_row_t_is_the_change_from_close_t_to_close_t_plus_1(run):
    days, close = closes()
    rows, table = read_csv(run / "out" / "index_daily.csv")
    where = np.searchsorted(days, rows)
    assert where[-1] == len(days) - 2  # the last price day has no next return, so it is not a row
    for asset in ASSETS:
        expected = close[asset][where + 1] / close[asset][where] - 1.0
        np.testing.assert_allclose(table[f"next_ret_{asset}"], expected, rtol=1e-9, atol=1e-15)
        # and not the return up to t (the unshifted column, which would pay a position for the past)
        past = close[asset][where] / close[asset][where - 1] - 1.0
        assert np.abs(table[f"next_ret_{asset}"] - past).max() > 1e-3
