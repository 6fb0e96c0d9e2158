"""The bookkeeping of example 04 (`04_traveller_real_data.py`): its ranking, its Markdown table, its plot of the
test periods and its JSON record. Nothing here trains or chooses anything; the example's walk-forward does.

Units: utility, return and cost per day in return units (shown x 1e4, basis points); turnover sum |dx| per
day; Sharpe annualised with sqrt(252) from the daily net return.
"""
import json
import os
import platform
import shutil
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np

from jax_scan_rnn.tasks.traveller import MARKOWITZ_WINDOW

POLICIES = {"learned": "Traveller (learned)", "buy_and_hold": "buy and hold (1/2 each)",
            "rolling_markowitz": f"rolling Markowitz ({MARKOWITZ_WINDOW} d)", "no_trade": "no trading"}
VERSIONS = ("jax-scan-rnn", "jax", "jaxlib", "flax", "optax", "numpy", "pandas", "arch", "matplotlib")


def sharpe_text(value):  # None: a constant net return (no trading), whose Sharpe ratio is undefined
    return "n/a" if value is None else f"{value:.2f}"


def markdown(policies: dict) -> str:
    lines = ["| policy | net utility (bp/day) | gross return (bp/day) | cost (bp/day) | net return (%/yr) "
             "| turnover (/day) | Sharpe (ann.) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in policies.items():
        lines.append(f"| {POLICIES[name]} | {row['utility'] * 1e4:+.3f} | {row['return'] * 1e4:+.3f} | "
                     f"{row['cost'] * 1e4:.4f} | {(row['return'] - row['cost']) * 252 * 100:+.2f} | "
                     f"{row['turnover']:.4f} | {sharpe_text(row['sharpe'])} |")
    return "\n".join(lines)


def summary(overall: dict, folds: list[dict]) -> list[str]:
    """The run's claims, from its own numbers: the policies ranked over all test periods, and the folds won."""
    ranked = sorted(overall, key=lambda name: overall[name]["utility"], reverse=True)
    by_sharpe = sorted(overall, key=lambda name: -np.inf if overall[name]["sharpe"] is None
                       else overall[name]["sharpe"], reverse=True)
    beats = sum(f["policies"]["learned"]["utility"] > f["policies"]["buy_and_hold"]["utility"] for f in folds)
    won = overall["learned"]["utility"] > overall["buy_and_hold"]["utility"]
    test_days = sum(f["test_days"] for f in folds)
    return [f"Over all test periods ({folds[0]['test'][0]} to {folds[-1]['test'][1]}, {test_days} days), ranked "
            "by net utility: " + ", ".join(f"{i + 1}. {POLICIES[name]}" for i, name in enumerate(ranked)) + ".",
            f"The Traveller {'beat' if won else 'did not beat'} buy and hold over all test periods, and beat it in "
            f"{beats} of {len(folds)} folds (by net utility).",
            "Ranked by Sharpe ratio over all test periods: " + ", ".join(
                f"{i + 1}. {POLICIES[name]}" for i, name in enumerate(by_sharpe)) + "."]


def report(command: str, config: dict, claims: list[str], overall: dict, folds: list[dict]) -> str:
    """The Markdown report: how it was made, the claims, the all-folds table, then each fold's."""
    choices = config["seeds"] * (config["steps"] // config["eval_every"])
    sections = ["# The Traveller on S&P 500 and NASDAQ daily prices, walk-forward\n",
                f"Made by `{command}`; gamma = {config['task']['risk_aversion']:g}, lam = "
                f"{config['task']['cost_scale']:g}, {config['steps']} updates per run, {config['seeds']} seed(s) per "
                f"fold; the (seed, update) with the best utility on the validation year is the one traded, so its "
                f"validation number is the best of {choices} and optimistic: the test periods are the honest "
                f"numbers. Utility = x.r - gamma/2 x'Sigma x - lam/2 dx'Sigma dx per day, Sigma from each fold's "
                f"training days; net return = gross - lam/2 dx'Sigma dx. \"All folds\" concatenates the test "
                f"periods' daily terms (each scored with its own fold's Sigma).\n",
                "\n".join(claims) + "\n",
                f"## All folds: {folds[0]['test'][0]} to {folds[-1]['test'][1]}\n", markdown(overall) + "\n"]
    for f in folds:
        train, valid = f["traveller_train"], f["traveller_valid"]
        sections += [f"## Fold {f['fold']}: train {f['train'][0]} to {f['train'][1]} ({f['train_days']} days), "
                     f"validate {f['valid'][0]} to {f['valid'][1]}, test {f['test'][0]} to {f['test'][1]} "
                     f"({f['test_days']} days)\n", markdown(f["policies"]) + "\n",
                     f"Traveller chosen: seed {f['chosen']['seed']}, update {f['chosen']['update']} (best "
                     f"validation utility, {f['valid'][0]} to {f['valid'][1]}). Its net utility on the training days "
                     f"{train['utility'] * 1e4:+.3f} bp/day (Sharpe {sharpe_text(train['sharpe'])}), validation "
                     f"{valid['utility'] * 1e4:+.3f} bp/day (Sharpe {sharpe_text(valid['sharpe'])}).\n"]
    return "\n".join(sections)


def plot(path: Path, dates, series: dict, positions: dict, asset_names, folds: list[dict], config: dict) -> None:
    """Cumulative net return of every policy and the two assets' positions over the concatenated test periods
    (`dates` their days; `series[name]`, `positions[name]`: one entry per fold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True, height_ratios=[2, 1, 1])
    colors = {"learned": "tab:red", "buy_and_hold": "tab:blue", "rolling_markowitz": "0.55", "no_trade": "k"}
    for name, parts in series.items():
        net = np.concatenate([t["net"] for t in parts])
        axes[0].plot(dates, np.cumsum(net), color=colors[name], lw=1.2, label=POLICIES[name])
    axes[0].set_ylabel("cumulative net return\n(sum of daily gross - cost)")
    axes[0].legend(loc="upper left", fontsize=8)
    for asset, ax in enumerate(axes[1:]):
        for name, parts in positions.items():
            ax.plot(dates, np.concatenate(parts)[:, asset], color=colors[name], lw=0.9, label=POLICIES[name])
        ax.axhline(0.5, color=colors["buy_and_hold"], lw=0.8, ls=":", label=POLICIES["buy_and_hold"])
        ax.set_ylabel(f"position, {asset_names[asset].removeprefix('next_ret_')}")
        ax.set_ylim(-1.05, 1.05)
    axes[1].legend(loc="lower left", fontsize=8)
    for ax in axes:
        for f in folds[1:]:
            ax.axvline(np.datetime64(f["test"][0]), color="0.8", lw=0.8, ls="--")  # a fresh model each fold
    fig.suptitle(f"Walk-forward test periods, each traded by a fresh model trained on the days before it\n"
                 f"(dashed: a new fold; gamma {config['task']['risk_aversion']:g}, lam "
                 f"{config['task']['cost_scale']:g}, costs lam/2 dx'Sigma dx)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record(command: str, wall_seconds: float, dates, data, config: dict, claims: list[str], overall: dict,
           folds: list[dict]) -> dict:
    """Every number of the report, and how it was made (command, machine, package versions, the data's days
    (`dates`) and columns (`data`, the whole file's `MarketData`))."""
    about_data = {"assets": {"spx": "S&P 500 (arch.data.sp500, Adj Close)",
                             "ndx": "NASDAQ composite (arch.data.nasdaq, Adj Close)"},
                  "first_day": f"{dates[0]:%Y-%m-%d}", "last_day": f"{dates[-1]:%Y-%m-%d}", "days": len(dates),
                  "features": list(data.feature_names), "returns": list(data.asset_names)}
    versions: dict[str, str | None] = {}
    for package in VERSIONS:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"command": command, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpu_count": os.cpu_count()},
            "wall_seconds": round(wall_seconds, 1), "versions": versions, "data": about_data, "config": config,
            "units": "utility, return, cost: per day, in return units (x1e4 for basis points); turnover: sum |dx| "
                     "per day; sharpe: annualised (sqrt 252) mean / std of the daily net return",
            "summary": claims, "all_folds": {"test": [folds[0]["test"][0], folds[-1]["test"][1]],
                                             "aggregation": "per-step terms concatenated", "policies": overall},
            "folds": folds}


def write(out: Path, text: str, rec: dict, results: str | None = None) -> None:
    """`traveller_real_data.json` and `.md` (the report, then the run's wall time, machine and versions) in
    `out`, which holds the plot too; with `results`, the three copied there as well (the committed files)."""
    (out / "traveller_real_data.json").write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
    (out / "traveller_real_data.md").write_text(
        text + f"\nWall time {rec['wall_seconds']:.0f} s on {rec['machine']['platform']} "
        f"({rec['machine']['cpu_count']} CPUs), " + ", ".join(f"{p} {v}" for p, v in rec["versions"].items() if v)
        + ".\n", encoding="utf-8")
    if results:
        Path(results).mkdir(parents=True, exist_ok=True)
        for name in ("traveller_real_data.json", "traveller_real_data.md", "traveller_real_data.png"):
            shutil.copyfile(out / name, Path(results) / name)
        print(f"results written to {results}")
