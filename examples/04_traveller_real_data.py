"""The Traveller on real daily index prices (S&P 500 and NASDAQ composite, 1999-2018), walk-forward.

What it teaches:
  1. How to turn a price file into the library's data convention without look-ahead: row t holds
     features known at the close of day t and the return EARNED BY THE POSITION CHOSEN AT t, i.e. the
     return from close t to close t+1 (`jax_scan_rnn/data/market_data.py`).
  2. Walk-forward evaluation: each fold trains fresh Travellers (`tasks.traveller.train`) on the days
     before its test years, standardises features and estimates Sigma on the training days alone, picks
     one (seed, update) by its utility on the validation year just before the test, reloads it from its
     checkpoint (`tasks.traveller.load`) and is scored only on the test years that follow. Nothing about
     a test period is seen before it is traded.
  3. An honest comparison against buy-and-hold, a rolling (252-day) Markowitz and no trading, per fold
     and over all test periods together, by the training objective (net utility) and by what a trader
     reads besides it (Sharpe ratio, turnover, costs).
  4. What overfitting looks like here: each fold's table also shows the chosen model on its training
     days and its validation year. A ~2k-parameter LSTM fits a few thousand noisy days far better than
     it trades the next ones, so compare the test rows, never the training ones.

It makes no claim that the Traveller wins: the printed summary ranks the policies by the numbers the run
produced, and `examples/results/traveller_real_data.md` holds the committed run's table. Two daily
index series are a hard, low signal-to-noise market, and a few seeds per fold are a small sample: read
the per-fold rows before the total.

Run:   pip install arch          (ships the S&P 500 and NASDAQ daily prices inside its wheel: no download)
       python examples/04_traveller_real_data.py                 (1-2 minutes on a 2-core CPU)
       python examples/04_traveller_real_data.py --quick         (2 folds, 20 updates: ~10 s, a smoke test)
       python examples/04_traveller_real_data.py --results examples/results   (also the committed files)
Output: examples/out/04_traveller_real_data/ (or --out): the data CSV, the table (.md, .json) and a PNG of
the equity curves and positions over the concatenated test periods.
"""
# %% Config
import argparse
import json
import os
import platform
import shutil
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np

STARTED = time.perf_counter()
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--quick", action="store_true", help="2 folds and a few updates (the test's smoke run)")
parser.add_argument("--out", default="examples/out/04_traveller_real_data", help="the run folder")
parser.add_argument("--results", default=None, help="also write traveller_real_data.{json,md,png} here")
args, _ = parser.parse_known_args()  # known args only: the cells also run in a notebook kernel

try:
    from arch.data import nasdaq, sp500
except ImportError:
    sys.exit("this example needs the `arch` package for its price data: pip install arch")

from jax_scan_rnn.data import trading  # noqa: E402
from jax_scan_rnn.tasks import traveller as task_lib  # noqa: E402
from jax_scan_rnn.train import TrainConfig  # noqa: E402

OUT = Path(args.out)
ASSETS = {"spx": sp500, "ndx": nasdaq}
MOMENTUM_DAYS = (1, 5, 21, 63)  # past log returns: a day, a week, a month, a quarter
VOL_DAYS = (5, 21, 63)  # realised volatility (std of daily log returns) over the same horizons
# Each fold's test period: whole calendar years, traded after training on the earlier days (the last
# of those years held out for validation).
# The folds tile 2011-2018 without overlap, so their test periods concatenate into one 8-year record.
FOLDS = [(2011, 2012), (2013, 2014), (2015, 2016), (2017, 2018)]
if args.quick:
    FOLDS = FOLDS[-2:]

# Daily returns make the utility's units tiny: a day's mean return is ~2-3e-4 and its variance ~1.5-2.5e-4,
# so utilities are of order 1e-4 per day; the tables show them in basis points per day (x 1e4). (Adam does
# not care about the loss's scale, so training needs no rescaling.)
# RISK_AVERSION = 2: the best constant multiple of the 50/50 portfolio, mu / (gamma var), is then ~0.7 over
# 1999-2018, so holding the indices (buy-and-hold) is close to what a mean-variance investor would choose:
# a strong baseline, not a straw man; to beat it the Traveller has to time or size its positions. Choosing
# gamma from full-sample moments is hindsight, but hindsight that favours the baseline, not the model.
RISK_AVERSION = 2.0
# COST_SCALE = 10: the library's costs are lam/2 dx' Sigma dx, proportional to risk (Garleanu-Pedersen).
# With a daily sigma^2 ~ 1.5e-4, switching one whole asset in a day (dx = 1) costs ~7 bp of capital and
# a 10% rebalance ~0.07 bp: the order of an index trader's spread and impact; small adjustments are cheap.
COST_SCALE = 10.0
# A small model: ~2500-4000 training days of two correlated series is little data, and a larger LSTM
# mostly memorises the training years.
TASK = dict(hidden_size=16, num_layers=1, batch_size=32, seq_len=126, risk_aversion=RISK_AVERSION,
            cost_scale=COST_SCALE, periods_per_year=252)
# Model selection uses the validation year alone (the year before each test period, never trained on):
# every EVAL_EVERY updates the fold's model is scored there, and the best (seed, update) is the one traded.
# The test years play no part in any choice.
STEPS = 20 if args.quick else 600  # optimiser updates per run
EVAL_EVERY = 10 if args.quick else 50
SEEDS = 1 if args.quick else 3  # runs per fold, from different initialisations and batch orders
LOG_EVERY = EVAL_EVERY * max(1, STEPS // EVAL_EVERY // 3)  # a progress line about every third of a run
LEARNING_RATE = 3e-3
SEED = 0  # fold k, run s trains with seed SEED + 100 k + s
POLICIES = {"learned": "Traveller (learned)", "buy_and_hold": "buy and hold (1/2 each)",
            "rolling_markowitz": f"rolling Markowitz ({task_lib.MARKOWITZ_WINDOW} d)", "no_trade": "no trading"}


# %% The data set: features known at the close of day t, and the return from close t to close t+1
def build_dataset():
    import pandas as pd

    closes = pd.concat({name: mod.load()["Adj Close"] for name, mod in ASSETS.items()}, axis=1, join="inner")
    closes = closes.sort_index()
    log_close = np.log(closes)
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
    return int(np.searchsorted(dates.year, year))


RUNS = OUT / "runs"  # one training run (checkpoints, metrics.jsonl) per fold and seed
shutil.rmtree(RUNS, ignore_errors=True)  # `train` refuses a folder holding an older run's checkpoints
RUNS.mkdir(parents=True)
folds, series = [], {name: [] for name in POLICIES}  # series: per-step terms of each fold's test period
positions_shown = {name: [] for name in ("learned", "rolling_markowitz")}
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
        last = {}

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
        _, history, stats = task_lib.train(fold_task, cfg, out_dir=run_dir, data=fold_data, callback=progress)
        candidates += [(row["metrics"]["utility"], seed, row["step"], run_dir) for row in history.eval]
    # The library cut the split from fractions: check it cut exactly at the validation and test years'
    # first days, so the standardiser and Sigma saw training days only.
    assert (stats.train_end, stats.valid_end) == (valid_start, test_start), (stats.train_end, stats.valid_end)
    valid_utility, seed, step, run_dir = max(candidates, key=lambda c: c[0])
    model, _, stats = task_lib.load(run_dir, step)  # the chosen weights, and the run's own DataStats
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
        assert all(np.isclose(mine[key], library[key], rtol=1e-6, atol=1e-12) for key in ("utility", "return",
                                                                                            "cost", "turnover"))
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


# %% The table
def sharpe_text(value):  # None: a constant net return (no trading), whose Sharpe ratio is undefined
    return "n/a" if value is None else f"{value:.2f}"


def markdown(policies):
    lines = ["| policy | net utility (bp/day) | gross return (bp/day) | cost (bp/day) | net return (%/yr) "
             "| turnover (/day) | Sharpe (ann.) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in policies.items():
        lines.append(f"| {POLICIES[name]} | {row['utility'] * 1e4:+.3f} | {row['return'] * 1e4:+.3f} | "
                     f"{row['cost'] * 1e4:.4f} | {(row['return'] - row['cost']) * 252 * 100:+.2f} | "
                     f"{row['turnover']:.4f} | {sharpe_text(row['sharpe'])} |")
    return "\n".join(lines)


ranked = sorted(overall, key=lambda name: overall[name]["utility"], reverse=True)
by_sharpe = sorted(overall, key=lambda name: -np.inf if overall[name]["sharpe"] is None else overall[name]["sharpe"],
                   reverse=True)
beats = sum(f["policies"]["learned"]["utility"] > f["policies"]["buy_and_hold"]["utility"] for f in folds)
won = overall["learned"]["utility"] > overall["buy_and_hold"]["utility"]
test_span = f"{folds[0]['test'][0]} to {folds[-1]['test'][1]}"
summary = [f"Over all test periods ({test_span}, {sum(f['test_days'] for f in folds)} days), ranked by net "
           f"utility: " + ", ".join(f"{i + 1}. {POLICIES[name]}" for i, name in enumerate(ranked)) + ".",
           f"The Traveller {'beat' if won else 'did not beat'} buy and hold over all test periods, and beat it in "
           f"{beats} of {len(folds)} folds (by net utility).",
           "Ranked by Sharpe ratio over all test periods: " + ", ".join(
               f"{i + 1}. {POLICIES[name]}" for i, name in enumerate(by_sharpe)) + "."]
command = "python " + " ".join([sys.argv[0], *sys.argv[1:]])
sections = ["# The Traveller on S&P 500 and NASDAQ daily prices, walk-forward\n",
            f"Made by `{command}`; gamma = {RISK_AVERSION:g}, lam = {COST_SCALE:g}, {STEPS} updates per run, "
            f"{SEEDS} seed(s) per fold; the (seed, update) with the best utility on the validation year is the "
            f"one traded, so its validation number is the best of {SEEDS * (STEPS // EVAL_EVERY)} and optimistic: "
            f"the test periods are the honest numbers. Utility = x.r - gamma/2 x'Sigma x - lam/2 dx'Sigma dx per "
            f"day, Sigma from each fold's training days; net return = gross - lam/2 dx'Sigma dx. \"All folds\" "
            f"concatenates the test periods' daily terms (each scored with its own fold's Sigma).\n",
            "\n".join(summary) + "\n",
            f"## All folds: {test_span}\n", markdown(overall) + "\n"]
for f in folds:
    sections += [f"## Fold {f['fold']}: train {f['train'][0]} to {f['train'][1]} ({f['train_days']} days), "
                 f"validate {f['valid'][0]} to {f['valid'][1]}, test {f['test'][0]} to {f['test'][1]} "
                 f"({f['test_days']} days)\n", markdown(f["policies"]) + "\n",
                 f"Traveller chosen: seed {f['chosen']['seed']}, update {f['chosen']['update']} (best validation "
                 f"utility, {f['valid'][0]} to {f['valid'][1]}). Its net utility on the training days "
                 f"{f['traveller_train']['utility'] * 1e4:+.3f} bp/day (Sharpe "
                 f"{sharpe_text(f['traveller_train']['sharpe'])}), "
                 f"validation {f['traveller_valid']['utility'] * 1e4:+.3f} bp/day (Sharpe "
                 f"{sharpe_text(f['traveller_valid']['sharpe'])}).\n"]
report = "\n".join(sections)
print("\n" + report)

# %% Plots: equity curves and positions over the concatenated test periods
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

test_rows = np.concatenate([np.arange(row_index(a), row_index(b + 1)) for a, b in FOLDS])
test_dates = dates[test_rows].to_numpy()
fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True, height_ratios=[2, 1, 1])
colors = {"learned": "tab:red", "buy_and_hold": "tab:blue", "rolling_markowitz": "0.55", "no_trade": "k"}
for name, parts in series.items():
    net = np.concatenate([t["net"] for t in parts])
    axes[0].plot(test_dates, np.cumsum(net), color=colors[name], lw=1.2, label=POLICIES[name])
axes[0].set_ylabel("cumulative net return\n(sum of daily gross - cost)")
axes[0].legend(loc="upper left", fontsize=8)
for asset, ax in enumerate(axes[1:]):
    for name, parts in positions_shown.items():
        ax.plot(test_dates, np.concatenate(parts)[:, asset], color=colors[name], lw=0.9, label=POLICIES[name])
    ax.axhline(0.5, color=colors["buy_and_hold"], lw=0.8, ls=":", label=POLICIES["buy_and_hold"])
    ax.set_ylabel(f"position, {data.asset_names[asset].removeprefix('next_ret_')}")
    ax.set_ylim(-1.05, 1.05)
axes[1].legend(loc="lower left", fontsize=8)
for ax in axes:
    for f in folds[1:]:
        ax.axvline(np.datetime64(f["test"][0]), color="0.8", lw=0.8, ls="--")  # a fresh model each fold
fig.suptitle(f"Walk-forward test periods, each traded by a fresh model trained on the days before it\n"
             f"(dashed: a new fold; gamma {RISK_AVERSION:g}, lam {COST_SCALE:g}, costs lam/2 dx'Sigma dx)")
fig.tight_layout()
PNG = OUT / "traveller_real_data.png"
fig.savefig(PNG, dpi=110)
plt.close(fig)

# %% The record: every number of the table, and how it was made
versions = {}
for package in ("jax-scan-rnn", "jax", "jaxlib", "flax", "optax", "numpy", "pandas", "arch", "matplotlib"):
    try:
        versions[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
        versions[package] = None
record = {"command": command, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
          "machine": {"platform": platform.platform(), "python": platform.python_version(),
                      "cpu_count": os.cpu_count()},
          "wall_seconds": round(time.perf_counter() - STARTED, 1), "versions": versions,
          "data": {"assets": {"spx": "S&P 500 (arch.data.sp500, Adj Close)", "ndx": "NASDAQ composite "
                              "(arch.data.nasdaq, Adj Close)"}, "first_day": f"{dates[0]:%Y-%m-%d}",
                   "last_day": f"{dates[-1]:%Y-%m-%d}", "days": len(dates), "features": list(data.feature_names),
                   "returns": list(data.asset_names)},
          "config": {"task": TASK, "steps": STEPS, "learning_rate": LEARNING_RATE, "seed": SEED, "seeds": SEEDS,
                     "eval_every": EVAL_EVERY, "markowitz_window": task_lib.MARKOWITZ_WINDOW, "folds": FOLDS},
          "units": "utility, return, cost: per day, in return units (x1e4 for basis points); turnover: sum |dx| "
                   "per day; sharpe: annualised (sqrt 252) mean / std of the daily net return",
          "summary": summary, "all_folds": {"test": [folds[0]["test"][0], folds[-1]["test"][1]],
                                            "aggregation": "per-step terms concatenated", "policies": overall},
          "folds": folds}
(OUT / "traveller_real_data.json").write_text(json.dumps(record, indent=2) + "\n")
(OUT / "traveller_real_data.md").write_text(
    report + f"\nWall time {record['wall_seconds']:.0f} s on {record['machine']['platform']} "
    f"({record['machine']['cpu_count']} CPUs), " + ", ".join(f"{p} {v}" for p, v in versions.items() if v) + ".\n")
if args.results:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for name in ("traveller_real_data.json", "traveller_real_data.md", "traveller_real_data.png"):
        shutil.copyfile(OUT / name, results / name)
    print(f"results written to {results}")
print(f"run folder: {OUT} (data CSV, table .md/.json, plots); wall time {record['wall_seconds']:.0f} s")
