"""The Traveller on real daily index prices (S&P 500 and NASDAQ composite, 1999-2018), walk-forward.

What it teaches:
  1. A price file in the library's data convention without look-ahead: row t holds features known at the
     close of day t and the return EARNED BY THE POSITION CHOSEN AT t, from close t to close t+1
     (`jax_scan_rnn/data/market_data.py`).
  2. Walk-forward evaluation: each fold trains fresh Travellers on the days before its test years
     (standardisation and Sigma from those days alone), picks one (seed, update) by its utility on the
     validation year just before the test, reloads it from its checkpoint and scores it on the test years
     only. Nothing about a test period is seen before it is traded.
  3. An honest comparison against buy-and-hold, a rolling (252-day) Markowitz and no trading, per fold and
     over all test periods, by net utility (the training objective), Sharpe ratio, turnover and costs.
  4. Overfitting: each fold also shows the chosen model on its training days; a ~2k-parameter LSTM fits a
     few thousand noisy days far better than it trades the next ones. Compare test rows only.
It claims no win: the summary ranks the policies by the run's own numbers (the committed run:
`examples/results/traveller_real_data.md`); two index series and a few seeds per fold are a small sample.

Run:   pip install arch          (ships the S&P 500 and NASDAQ daily prices inside its wheel: no download)
       python examples/04_traveller_real_data.py                 (1-2 minutes on a 2-core CPU)
       python examples/04_traveller_real_data.py --quick         (2 folds, 20 updates: ~10 s, a smoke test)
       python examples/04_traveller_real_data.py --results examples/results   (also the committed files)
Output: examples/out/04_traveller_real_data/ (or --out): the data CSV, the report (.md, .json) and a PNG of
the equity curves and positions over the test periods (`real_data_report.py` writes them).
"""# %% Config
import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

STARTED = time.perf_counter()
# --out's default is beside this file, wherever it runs from (a notebook kernel, which has no __file__,
# runs in the notebook's folder)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
parser.add_argument("--quick", action="store_true", help="2 folds and a few updates (the test's smoke run)")
parser.add_argument("--out", default=HERE / "out" / "04_traveller_real_data", type=Path,
                    help="the run folder (default: %(default)s, beside this file)")
parser.add_argument("--results", default=None, help="also write traveller_real_data.{json,md,png} here")
args, unknown = parser.parse_known_args()
if unknown and "ipykernel" not in sys.modules:  # a notebook kernel passes its own (-f kernel.json)
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")

try:
    from arch.data import nasdaq, sp500
except ImportError:
    sys.exit("this example needs the `arch` package for its price data: pip install arch")

import real_data_report as report  # noqa: E402  (this folder: the table, plot and record)

from jax_scan_rnn.data import trading  # noqa: E402
from jax_scan_rnn.tasks import traveller as task_lib  # noqa: E402
from jax_scan_rnn.train import TrainConfig  # noqa: E402

OUT: Path = args.out
ASSETS = {"spx": sp500, "ndx": nasdaq}
MOMENTUM_DAYS = (1, 5, 21, 63)  # past log returns: a day, a week, a month, a quarter
VOL_DAYS = (5, 21, 63)  # realised volatility (std of daily log returns) over the same horizons
# Each fold's test period: whole calendar years, traded after training on the earlier days (the last of those
# years held out for validation). The folds tile 2011-2018, so their test periods make one 8-year record.
FOLDS = [(2011, 2012), (2013, 2014), (2015, 2016), (2017, 2018)]
if args.quick:
    FOLDS = FOLDS[-2:]

# Utilities are of order 1e-4 per day (a day's mean return ~2-3e-4, variance ~1.5-2.5e-4): the tables show
# basis points (x 1e4); Adam does not care about the loss's scale. RISK_AVERSION = 2: the best constant multiple
# of the 50/50 portfolio, mu / (gamma var), is then ~0.7 over 1999-2018, so buy-and-hold is close to what a
# mean-variance investor would choose: a strong baseline (hindsight that favours it, not the model).
RISK_AVERSION = 2.0
# COST_SCALE = 10: costs lam/2 dx' Sigma dx (Garleanu-Pedersen); with a daily sigma^2 ~ 1.5e-4, switching one
# whole asset in a day costs ~7 bp of capital, a 10% rebalance ~0.07 bp: an index trader's spread and impact.
COST_SCALE = 10.0
# A small model: ~2500-4000 training days of two correlated series is little data (a larger LSTM memorises).
TASK: dict[str, Any] = dict(hidden_size=16, num_layers=1, batch_size=32, seq_len=126, risk_aversion=RISK_AVERSION,
                            cost_scale=COST_SCALE, periods_per_year=252)
# Model selection uses the validation year alone (never trained on): every EVAL_EVERY updates the model is
# scored there, and the best (seed, update) is the one traded. The test years play no part in any choice.
STEPS = 20 if args.quick else 600  # optimiser updates per run
EVAL_EVERY = 10 if args.quick else 50
SEEDS = 1 if args.quick else 3  # runs per fold, from different initialisations and batch orders
LOG_EVERY = EVAL_EVERY * max(1, STEPS // EVAL_EVERY // 3)  # a progress line about every third of a run
LEARNING_RATE = 3e-3
SEED = 0  # fold k, run s trains with seed SEED + 100 k + s


# %% The data set: features known at the close of day t, and the return from close t to close t+1
def build_dataset():
    import pandas as pd

    closes = pd.concat({name: mod.load()["Adj Close"] for name, mod in ASSETS.items()}, axis=1, join="inner")
    closes = closes.sort_index()
    log_close = closes.transform(np.log)
    daily = log_close.diff()  # row t: log(close_t / close_{t-1}), known at the close of t
    table = pd.DataFrame(index=closes.index)
    table.index.name = "date"
    for name in ASSETS:
        table[f"{name}_close"] = closes[name]  # kept for checking, never a feature (feature_cols below)
    for name in ASSETS:
        for h in MOMENTUM_DAYS:
            # log(close_t / close_{t-h}): only closes up to t.
            table[f"{name}_mom_{h}"] = log_close[name] - log_close[name].shift(h)
        for h in VOL_DAYS:
            # The rolling window ENDS at t (pandas' default, not centred): daily returns t-h+1 .. t.
            table[f"{name}_vol_{h}"] = daily[name].rolling(h).std()
    for name in ASSETS:
        # THE look-ahead guard: the position chosen at the close of t earns close_{t+1} / close_t - 1, so
        # the return column is the price file's own return shifted UP one row (shift(-1)). Unshifted,
        # the model would be paid on day t a return it has already seen in its day-t features.
        table[f"next_ret_{name}"] = (closes[name].shift(-1) / closes[name] - 1.0)
    # The first max(h) rows lack a full look-back; the last row has no next return.
    return table.dropna()


OUT.mkdir(parents=True, exist_ok=True)
table = build_dataset()
CSV = OUT / "index_daily.csv"
table.to_csv(CSV)
dates = table.index
print(f"data: {len(table)} days, {dates[0]:%Y-%m-%d} to {dates[-1]:%Y-%m-%d}, 2 assets, written to {CSV}")

task = task_lib.TravellerTask(data=str(CSV), feature_cols="*_mom_*,*_vol_*", return_cols="next_ret_*", **TASK)
data = task_lib.read_data(task)  # the whole file; each fold reads a prefix of it (its data and split: below)
print(f"features ({data.num_features}): {', '.join(data.feature_names)}; returns: {', '.join(data.asset_names)}")


# %% Walk-forward: per fold, train on the days before the test years, choose on the year just before them,
# score only the test years
def row_index(year):  # the first row of `year` (len(dates) when past the end)
    return int(dates.searchsorted(f"{year}-01-01"))


RUNS = OUT / "runs"  # one training run (checkpoints, metrics.jsonl) per fold and seed
shutil.rmtree(RUNS, ignore_errors=True)  # `train` refuses a folder holding an older run's checkpoints
RUNS.mkdir(parents=True)
folds: list[dict] = []
series: dict[str, list[dict]] = {name: [] for name in report.POLICIES}  # per-step terms of each fold's test period
positions_shown: dict[str, list[np.ndarray]] = {name: [] for name in ("learned", "rolling_markowitz")}
for k, (first_year, last_year) in enumerate(FOLDS):
    valid_start, test_start, end = row_index(first_year - 1), row_index(first_year), row_index(last_year + 1)
    # The fold's own file, the rows up to its test period's end: nothing later exists for this fold, and
    # each run's saved task names the file it was split from (so `jax-scan-rnn evaluate` on it agrees).
    fold_csv = RUNS / f"fold{k + 1}.csv"
    table.iloc[:end].to_csv(fold_csv)
    fold_task = task_lib.TravellerTask(**{**task.to_json(), "data": str(fold_csv),
                                          "valid_fraction": (test_start - valid_start) / end,
                                          "test_fraction": (end - test_start) / end})
    fold_data = task_lib.read_data(fold_task)
    assert np.array_equal(fold_data.returns, data.returns[:, :end])
    label = f"fold {k + 1}/{len(FOLDS)} (test {first_year}-{last_year})"
    print(f"{label}: train {dates[0]:%Y-%m-%d} to {dates[valid_start - 1]:%Y-%m-%d}, validate {first_year - 1}; "
          f"{SEEDS} run(s) of {STEPS} updates", flush=True)
    fold_started = time.perf_counter()
    candidates = []  # (validation utility, seed, update, run folder): every checkpoint of every run

    for seed in range(SEEDS):
        last: dict[str, float] = {}

        def progress(event, seed=seed, last=last):
            # `fit` emits an update's train row before its eval row: print once both are in.
            if event["event"] == "log":
                last["train"] = -event["loss"]
            elif event["event"] == "eval" and (event["step"] % LOG_EVERY == 0 or event["step"] == STEPS):
                print(f"  {label} seed {seed} update {event['step']:4d}/{STEPS}: utility per day, training "
                      f"{last['train'] * 1e4:+.3f} bp (mean since the last row), validation "
                      f"{event['metrics']['utility'] * 1e4:+.3f} bp", flush=True)

        run_dir = RUNS / f"fold{k + 1}_seed{seed}"
        # An evaluation on the validation year and a checkpoint at the same updates, so any evaluated
        # update can be reloaded (`task_lib.load`); `keep_checkpoints` keeps them all.
        cfg = TrainConfig(steps=STEPS, learning_rate=LEARNING_RATE, log_every=LOG_EVERY,
                          eval_every=EVAL_EVERY, checkpoint_every=EVAL_EVERY, keep_checkpoints=STEPS // EVAL_EVERY + 1,
                          seed=SEED + 100 * k + seed)
        _, history, run_stats = task_lib.train(fold_task, cfg, out_dir=run_dir, data=fold_data, callback=progress)
        # The library cut the split from fractions: check it cut exactly at the validation and test years'
        # first days, so the standardiser and Sigma saw training days only.
        assert run_stats is not None and (run_stats.train_end, run_stats.valid_end) == (valid_start, test_start)
        candidates += [(row["metrics"]["utility"], seed, row["step"], run_dir) for row in history.eval]
    valid_utility, seed, step, run_dir = max(candidates, key=lambda c: c[0])
    model, _, stats = task_lib.load(run_dir, step)  # the chosen weights, and the run's own DataStats
    assert stats is not None  # a run on data keeps its DataStats (a simulated run's are None)
    fold_table = task_lib.data_table(model, fold_data, stats, "test", 252)
    in_sample = task_lib.data_table(model, fold_data, stats, "train", 252)["policies"]["learned"]
    validation = task_lib.data_table(model, fold_data, stats, "valid", 252)["policies"]["learned"]
    assert np.isclose(validation["utility"], valid_utility, rtol=1e-5, atol=1e-9)  # the reload is that update

    # The same runs as `data_table`, kept per step so the folds' test periods concatenate.
    runs = {"learned": task_lib.positions(model, stats.standardiser(fold_data.features))[0],
            "buy_and_hold": trading.buy_and_hold_policy(fold_data.returns),
            "rolling_markowitz": trading.rolling_markowitz_policy(fold_data.returns, stats.objective,
                                                                  task_lib.MARKOWITZ_WINDOW),
            "no_trade": np.zeros_like(fold_data.returns)}
    r = fold_data.returns[:, test_start:end]
    for name, x in runs.items():
        # Per step, so that the folds concatenate; one path: [1, T] -> [T].
        terms = {k: v[0] for k, v in trading.performance_terms(x[:, test_start:end], r, stats.objective,
                                                                x[:, test_start - 1]).items()}
        mine, library = trading.summarise(terms), fold_table["policies"][name]
        for key in ("utility", "return", "cost", "turnover"):  # never None (only the Sharpe ratio can be)
            value = mine[key]
            assert value is not None and np.isclose(value, library[key], rtol=1e-6, atol=1e-12), (name, key)
        series[name].append(terms)
        if name in positions_shown:
            positions_shown[name].append(x[0, test_start:end])
    folds.append({"fold": k + 1, "train": [f"{dates[0]:%Y-%m-%d}", f"{dates[valid_start - 1]:%Y-%m-%d}"],
                  "valid": [f"{dates[valid_start]:%Y-%m-%d}", f"{dates[test_start - 1]:%Y-%m-%d}"],
                  "test": [f"{dates[test_start]:%Y-%m-%d}", f"{dates[end - 1]:%Y-%m-%d}"],
                  "train_days": valid_start, "valid_days": test_start - valid_start, "test_days": end - test_start,
                  "chosen": {"seed": seed, "update": step}, "sigma": stats.objective.Sigma.tolist(),
                  "seconds": round(time.perf_counter() - fold_started, 1),
                  "traveller_train": in_sample, "traveller_valid": validation, "policies": fold_table["policies"]})
    learned, bh = fold_table["policies"]["learned"], fold_table["policies"]["buy_and_hold"]
    print(f"  {label}: {folds[-1]['seconds']:.0f} s; chose seed {seed} update {step} (validation "
          f"{validation['utility'] * 1e4:+.3f} bp/day); test: Traveller {learned['utility'] * 1e4:+.3f}, buy and hold "
          f"{bh['utility'] * 1e4:+.3f} bp/day", flush=True)

# All folds together: each policy's per-step terms concatenated in time (each step scored with its own
# fold's Sigma), then averaged; not an average of the per-fold averages.
overall = {name: trading.summarise({key: np.concatenate([t[key] for t in parts]) for key in parts[0]})
           for name, parts in series.items()}

# %% The report: the claims, the tables, a plot of the test periods and the JSON record (`real_data_report.py`)
command = "python " + " ".join([sys.argv[0], *sys.argv[1:]])
config = {"task": TASK, "steps": STEPS, "learning_rate": LEARNING_RATE, "seed": SEED, "seeds": SEEDS,
          "eval_every": EVAL_EVERY, "markowitz_window": task_lib.MARKOWITZ_WINDOW, "folds": FOLDS}
claims = report.summary(overall, folds)
text = report.report(command, config, claims, overall, folds)
print("\n" + text)
test_rows = np.concatenate([np.arange(row_index(a), row_index(b + 1)) for a, b in FOLDS])
report.plot(OUT / "traveller_real_data.png", dates[test_rows].to_numpy(), series, positions_shown, data.asset_names,
            folds, config)
record = report.record(command, time.perf_counter() - STARTED, dates, data, config, claims, overall, folds)
report.write(OUT, text, record, results=args.results)
print(f"run folder: {OUT} (data CSV, table .md/.json, plots); wall time {record['wall_seconds']:.0f} s")
