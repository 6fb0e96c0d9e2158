"""Every measured figure the README quotes, rendered from the committed results file that measured it.

In the Markdown a figure sits between markers, `<!--fig:NAME-->2.34 µs<!--/fig-->` (invisible once
rendered), and NAME is a function below that reads the results file and returns the text.

    python docs/figures.py            # rewrite every marked figure from its results file
    python docs/figures.py --check    # list the figures whose text differs (tests/test_readme.py runs it)

So a new results file changes the README by running this script, never by hand, and a figure typed
by hand into a marker fails the test. Each function names its source; the command that made that
file is inside it (`command` or `config`), and the README prints it next to the figure.
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCUMENTS = [ROOT / "README.md"]
MARKER = re.compile(r"<!--fig:([\w.-]+)-->(.*?)<!--/fig-->", re.S)
FIGURES: dict[str, Callable[[], str]] = {}


def figure(name: str):
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        FIGURES[name] = fn
        return fn

    return register


@cache
def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def us(value: float) -> str:
    """Microseconds, three significant digits (the benchmark's own precision between runs is ~5%)."""
    return f"{value:.3g} µs" if value < 1000 else f"{value:,.0f} µs"


def seconds_range(walls: list[float]) -> str:
    low, high = min(walls), max(walls)
    span = f"{low:.0f} s" if round(low) == round(high) else f"{low:.0f}-{high:.0f} s"
    return f"{span} ({len(walls)} run{'s' if len(walls) > 1 else ''})"


def minutes_range(walls: list[float]) -> str:
    def mmss(s: float) -> str:
        return f"{int(s // 60)} min {round(s % 60):02d} s"

    low, high = min(walls), max(walls)
    span = mmss(low) if round(low) == round(high) else f"{mmss(low)} to {mmss(high)}"
    return f"{span} ({len(walls)} run{'s' if len(walls) > 1 else ''})"


# ------------------------------------------------------------------------------ jax-scan-rnn bench


def bench_row(file: str, method: str, mode: str, batch: int, steps: int) -> dict:
    for row in load(file)["rows"]:
        if (row["method"], row["mode"], row["B"], row["T"]) == (method, mode, batch, steps) and row["status"] == "ok":
            return row
    raise KeyError(f"{file}: no measured row {method} {mode} B={batch} T={steps}")


MAIN = "cpu-2core.json"


@figure("bench.wall")
def _bench_wall() -> str:
    return f"{load(MAIN)['wall_s']:.0f} s wall"


@figure("bench.headline")
def _bench_headline() -> str:
    lines = ["| | seed loop (`nn.LSTM` per step) | `lax.scan` (jit, `unroll=\"auto\"`) | limit (no time dependency) |",
             "|---|---:|---:|---:|"]
    for mode, label in (("forward", "forward"), ("train", "train step (value, grad, Adam)")):
        seed, scan, limit = (bench_row(MAIN, m, mode, 1, 1000) for m in ("torch-loop", "jax-scan-auto", "limit-xla"))
        lines.append(f"| {label} | {us(seed['per_step_us'])} | {us(scan['per_step_us'])} "
                     f"(**{scan['speedup_vs_seed']:.1f}x** the seed loop) | {us(limit['per_step_us'])} |")
    return "\n".join(lines)


@figure("bench.user_call")
def _bench_user_call() -> str:
    row = bench_row(MAIN, "jax-user-call", "forward", 1, 1000)
    return f"{us(row['per_step_us'])} per step ({row['speedup_vs_seed']:.1f}x)"


@figure("bench.b64")
def _bench_b64() -> str:
    scan, limit = bench_row(MAIN, "jax-scan-auto", "forward", 64, 1000), bench_row(MAIN, "limit-xla", "forward", 64, 1000)
    return (f"{scan['x_limit']:.2f}x the limit row ({scan['per_step_us']:.1f} vs {limit['per_step_us']:.1f} µs per step) "
            f"and {scan['speedup_vs_seed']:.1f}x the seed loop")


@figure("bench.b1024")
def _bench_b1024() -> str:
    scan = bench_row(MAIN, "jax-scan-auto", "forward", 1024, 1000)
    return f"{scan['x_limit']:.2f}x the limit row ({us(scan['per_step_us'])} per step)"


@figure("bench.remat")
def _bench_remat() -> str:
    remat = bench_row(MAIN, "jax-scan-remat", "train", 1, 10000)["memory"]["temp_bytes"]
    plain = bench_row(MAIN, "jax-scan-auto", "train", 1, 10000)["memory"]["temp_bytes"]
    return f"{remat / 2**20:.2f} MiB with chunks of ~sqrt(T), {remat / plain:.1%} of the {plain / 2**20:.1f} MiB without"


VAE_TRAIN, VAE_GEN = "cpu-2core-vae-b128.json", "cpu-2core-vae-gen10k.json"
# FLOPs per time step of the VAE at B=128, H=256 (two [128,256]x[256,768] GRU products forward and twice
# backward, plus the input and output projections) and of greedy generation at B=10,000: counted by hand
# from the shapes (docs/measurements.md), so the GFLOP/s below are the measured times against them.
VAE_TRAIN_FLOP, VAE_GEN_FLOP = 334e6, 4.1e9


@figure("vae.speed")
def _vae_speed() -> str:
    ss = [bench_row(VAE_TRAIN, f"vae-ss-{f}", "train", 128, 60)["per_step_us"] / 1e3 for f in ("jax", "torch")]
    tf = [bench_row(VAE_TRAIN, f"vae-tf-{f}", "train", 128, 60)["per_step_us"] / 1e3 for f in ("jax", "torch")]
    gen = [bench_row(VAE_GEN, f"vae-greedy-{f}", "forward", 10000, 60)["per_step_us"] / 1e3 for f in ("jax", "torch")]
    return (f"a scheduled-sampling train step (whole ELBO + Adam) {ss[0]:.2f} ms in JAX vs {ss[1]:.2f} ms for torch_ref's "
            f"loop (**{ss[1] / ss[0]:.1f}x**); teacher forcing {tf[0]:.2f} ms in JAX vs {tf[1]:.2f} ms with torch's fused "
            f"`nn.GRU` ({tf[1] / tf[0]:.1f}x); greedy generation of 10,000 SMILES {gen[0]:.1f} vs {gen[1]:.1f} ms per step "
            f"({gen[1] / gen[0]:.1f}x)")


@figure("vae.flops")
def _vae_flops() -> str:
    ss_jax, ss_torch = (bench_row(VAE_TRAIN, f"vae-ss-{f}", "train", 128, 60)["per_step_us"] / 1e6 for f in ("jax", "torch"))
    gen_jax, gen_torch = (bench_row(VAE_GEN, f"vae-greedy-{f}", "forward", 10000, 60)["per_step_us"] / 1e6
                          for f in ("jax", "torch"))
    return (f"JAX's {ss_jax * 1e3:.2f} ms is {VAE_TRAIN_FLOP / ss_jax / 1e9:.0f} GFLOP/s, and 5x torch "
            f"({ss_torch / 5 * 1e3:.2f} ms) would need {VAE_TRAIN_FLOP / (ss_torch / 5) / 1e9:.0f} GFLOP/s for the whole "
            f"step; generation is ~{VAE_GEN_FLOP / 1e9:.1f} GFLOP per step: JAX's {gen_jax * 1e3:.1f} ms is "
            f"{VAE_GEN_FLOP / gen_jax / 1e9:.0f} GFLOP/s, and 5x torch ({gen_torch / 5 * 1e3:.1f} ms) would need "
            f"~{VAE_GEN_FLOP / (gen_torch / 5) / 1e9:.0f}")


@figure("vae.b1")
def _vae_b1() -> str:
    ss = bench_row(MAIN, "vae-ss-jax", "train", 1, 100)["speedup_vs_seed"]
    greedy = bench_row(MAIN, "vae-greedy-jax", "forward", 1, 100)["speedup_vs_seed"]
    return f"a scheduled-sampling train step is {ss:.1f}x faster in JAX and greedy generation {greedy:.1f}x"


# ------------------------------------------------------------------------------ timed user commands


def runs(file: str) -> list[dict]:
    return load(file)["runs"]


TRAVELLER = "train-traveller-cpu-2core.json"


@figure("traveller.wall")
def _traveller_wall() -> str:
    return seconds_range([r["wall_s"] for r in runs(TRAVELLER)])


@figure("traveller.table")
def _traveller_table() -> str:
    table = runs(TRAVELLER)[-1]["report"]
    lines = ["| policy | net utility / step | vs optimal |", "|---|---:|---:|"]
    for key, label in (("learned", "Traveller (learned)"), ("optimal", "optimal (closed form)"),
                       ("markowitz", "Markowitz (myopic)"), ("no_trade", "no trading")):
        lines.append(f"| {label} | {table[key]:.4f} | {table[key] / table['optimal']:.1%} |")
    return "\n".join(lines)


REAL = ROOT / "examples" / "results" / "traveller_real_data.json"
POLICY_NAMES = {"learned": "Traveller (learned)", "buy_and_hold": "buy and hold (1/2 each)",
                "rolling_markowitz": "rolling Markowitz (252 days)", "no_trade": "no trading"}


@figure("traveller.real_data")
def _traveller_real_data() -> str:
    data = json.loads(REAL.read_text())
    start, stop = data["all_folds"]["test"]
    lines = [f"Test periods {start} to {stop}, {len(data['folds'])} folds, "
             f"{data['wall_seconds'] / 60:.1f} min on {data['machine'].get('cpu_count', '?')} cores:", "",
             "| policy | net utility (bp/day) | gross return (bp/day) | cost (bp/day) | turnover (/day) | Sharpe (ann.) |",
             "|---|---:|---:|---:|---:|---:|"]
    for key, row in data["all_folds"]["policies"].items():
        sharpe = "n/a" if row["sharpe"] is None else f"{row['sharpe']:.2f}"
        lines.append(f"| {POLICY_NAMES[key]} | {row['utility'] * 1e4:+.2f} | {row['return'] * 1e4:+.2f} | "
                     f"{row['cost'] * 1e4:.2f} | {row['turnover']:.3f} | {sharpe} |")
    return "\n".join(lines + ["", " ".join(data["summary"])])


# ------------------------------------------------------------------------------ render / check


def render(text: str) -> tuple[str, list[str]]:
    """`text` with every marked figure rewritten, and the names of those that changed."""
    changed = []

    def replace(match: re.Match) -> str:
        name, old = match.group(1), match.group(2)
        if name not in FIGURES:
            raise KeyError(f"unknown figure {name!r} (figures: {', '.join(FIGURES)})")
        new = FIGURES[name]()
        new = f"\n{new}\n" if "\n" in new else new  # a table stands on its own lines, between the markers
        if new != old:
            changed.append(name)
        return f"<!--fig:{name}-->{new}<!--/fig-->"

    return MARKER.sub(replace, text), changed


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        new, changed = render(text)
        stale += [f"{doc.relative_to(ROOT)}: {name}" for name in changed]
        if changed and not check:
            doc.write_text(new)
    if check and stale:
        print("figures that disagree with their results files (run python docs/figures.py):\n  " + "\n  ".join(stale))
        return 1
    print(f"{'checked' if check else 'rendered'} {sum(len(MARKER.findall(d.read_text())) for d in DOCUMENTS)} figures"
          + ("" if check else f", {len(stale)} changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
