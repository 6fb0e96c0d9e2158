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

import importlib.util
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import fields
from datetime import datetime
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "scan_vs_loop.md", ROOT / "docs" / "tuning_cpu.md",
             ROOT / "docs" / "vae_experiments.md", ROOT / "docs" / "measurements.md",
             ROOT / "docs" / "cli.md", ROOT / "docs" / "library.md"]
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


def runs_count(n: int) -> str:
    return f"{n} run{'s' if n > 1 else ''}"


def span(values: list[float], unit: str = "", digits: int = 1) -> str:
    """Their range to `digits` decimals (one figure when both ends round alike), with `unit` after it if given."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    text = low if low == high else f"{low}-{high}"
    return f"{text} {unit}" if unit else text


def ratio_span(ratios: list[float]) -> str:
    """A range of ratios, "0.95-1.17x" (`span` to 2 decimals)."""
    return f"{span(ratios, digits=2)}x"


def seconds_range(walls: list[float]) -> str:
    low, high = min(walls), max(walls)
    text = f"{low:.0f} s" if round(low) == round(high) else f"{low:.0f}-{high:.0f} s"
    return f"{text} ({runs_count(len(walls))})"


def percent_range(fractions: list[float]) -> str:
    return f"{span([100 * f for f in fractions])}%"


def minutes_range(walls: list[float]) -> str:
    def mmss(s: float) -> str:
        return f"{int(s // 60)} min {round(s % 60):02d} s"

    low, high = min(walls), max(walls)
    text = mmss(low) if round(low) == round(high) else f"{mmss(low)} to {mmss(high)}"
    return f"{text} ({runs_count(len(walls))})"


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


PEERS = "cpu-2core-peers.json"


def _peer_grids() -> list[tuple[dict, list[dict]]]:
    """(method entry, its grid rows at its longest T) of every peer measured in the peers' run, in table order."""
    rows = [r for r in load(PEERS)["rows"]
            if r["role"] == "peer" and r["status"] == "ok" and r.get("vs_jsr") and r["section"] == "grid"]
    out = []
    for method, meta in load(PEERS)["methods"].items():
        mine = [r for r in rows if r["method"] == method]
        if meta.get("role") == "peer" and mine:
            steps = max(r["T"] for r in mine)
            out.append((meta, [r for r in mine if r["T"] == steps]))
    return out


@figure("bench.peers")
def _bench_peers() -> str:
    """Each peer's time over jsr's in one run (> 1: jsr is faster), T=1000 (torchax: the longest T it ran)."""
    cells = [("forward", 1), ("forward", 64), ("train", 1), ("train", 64)]
    lines = ["| peer (jitted, the same weights) | jsr row | " + " | ".join(f"{m} B={b}" for m, b in cells)
             + " | first call B=1 (forward / train) |", "|---|---|" + "---:|" * (len(cells) + 1)]
    for meta, mine in _peer_grids():

        def ratio(mode, batch, what="call"):
            hit = [r for r in mine if (r["mode"], r["B"]) == (mode, batch)]
            return f"{1 / hit[0]['vs_jsr'][what]:.2f}x" if hit and hit[0]["vs_jsr"][what] else "n/a"

        label = meta["label"].removeprefix("peer: ")
        lines.append(f"| {label} (T={mine[0]['T']}) | `{mine[0]['vs_jsr']['vs']}` | "
                     + " | ".join(ratio(m, b) for m, b in cells)
                     + f" | {ratio('forward', 1, 'compile')} / {ratio('train', 1, 'compile')} |")
    return "\n".join(lines)


def _peer_ratios(of_medians: bool = False) -> list[tuple[str, str, float]]:
    """(peer label, cell, peer time over jsr's) of every ratio in the peers' table (> 1: jsr is faster); with
    `of_medians`, the ratios of the two rows' medians instead of the medians of their round-by-round ratios."""
    out = []
    for meta, mine in _peer_grids():
        for r in mine:
            for what in ("call", "compile"):
                key = f"{what}_of_medians" if of_medians else what
                if r["vs_jsr"].get(key) and (what == "call" or r["B"] == 1):
                    cell = f"{r['mode']} B={r['B']}" + (" first call" if what == "compile" else "")
                    out.append((meta["label"].removeprefix("peer: "), cell, 1 / r["vs_jsr"][key]))
    return out


@figure("bench.peers_compiles")
def _bench_peers_compiles() -> str:
    """How each ratio of the peers' table is taken (its preset's `repeats` and `compile_rounds`)."""
    cfg = load(PEERS)["config"]
    return (f"each the median over the cell's interleaved rounds of the two rows' ratio: up to {cfg['repeats']} "
            f"timed samples of the warm call, {cfg['compile_rounds']} compiles for the first call")


def _below(ratios: list[tuple[str, str, float]]) -> str:
    parts = []
    for kind, pick in (("warm", lambda c: "first call" not in c), ("first-call", lambda c: "first call" in c)):
        mine = [r for r in ratios if pick(r[1])]
        below = [r for r in mine if r[2] < 1]
        text = f"{len(below)} of the {len(mine)} {kind} cells below 1"
        if below:
            label, cell, worst = min(below, key=lambda r: r[2])
            text += f" (lowest {worst:.2f}x: {label}, {cell.removesuffix(' first call')})"
        parts.append(text)
    return " and ".join(parts)


@figure("bench.peers_below")
def _bench_peers_below() -> str:
    """How many warm and first-call cells of the table are below 1 (the peer faster), and the lowest of each."""
    return "this run has " + _below(_peer_ratios())


@figure("bench.peers_of_medians")
def _bench_peers_of_medians() -> str:
    """The same count with the ratio of the two rows' medians, the table's estimator until 2026-12-04."""
    return "the ratio of the two rows' medians would give " + _below(_peer_ratios(of_medians=True))


@figure("bench.peers_first_forward")
def _bench_peers_first_forward() -> str:
    """The lowest first-call forward ratio of the table."""
    label, _, worst = min((r for r in _peer_ratios() if r[1] == "forward B=1 first call"), key=lambda r: r[2])
    return f"{worst:.2f}x ({label})"


@figure("bench.peers_train_b64")
def _bench_peers_train_b64() -> str:
    """The table's warm train cells at B=64: the range of each peer's time over jsr's."""
    ratios = [r[2] for r in _peer_ratios() if r[1] == "train B=64"]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x jsr's time ({len(ratios)} peers)"


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


@figure("vae.torch_threads")
def _vae_torch_threads() -> str:
    return str(load(VAE_TRAIN)["host"]["torch_threads_vae"]["128"]["chosen"])


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


MATMUL_PEAK = "matmul-peak-cpu-2core.json"


@figure("vae.matmul_peak")
def _vae_matmul_peak() -> str:
    """The range over every committed run of `benchmarks/matmul_peak.py` (best of 5 rounds each)."""
    all_runs = runs(MATMUL_PEAK)

    def at(m: int) -> list[float]:
        return [row["gflops"] for run in all_runs for row in run["rows"] if row["shape"][0] == m]

    return (f"{span(at(128), digits=0)} GFLOP/s at [128,256]x[256,768] and {span(at(10_000), digits=0)} at "
            f"[10000,256]x[256,768], best of 5 rounds in each of {runs_count(len(all_runs))}")


@figure("vae.b1")
def _vae_b1() -> str:
    ss = bench_row(MAIN, "vae-ss-jax", "train", 1, 100)["speedup_vs_seed"]
    greedy = bench_row(MAIN, "vae-greedy-jax", "forward", 1, 100)["speedup_vs_seed"]
    return f"a scheduled-sampling train step is {ss:.1f}x faster in JAX and greedy generation {greedy:.1f}x"


# ------------------------------------------------------------------------------ timed user commands


def runs(file: str) -> list[dict]:
    return load(file)["runs"]


TRAVELLER = "train-traveller-cpu-2core.json"


def _default_runs() -> list[dict]:
    """The runs of `train vae` as it is today: no option but `--seed 1`, started after the defaults last changed (a
    run of the same options before then ran older code)."""
    since = datetime.fromisoformat(OLD_DEFAULTS[-1][0])
    return [r for r in runs(VAE_RUNS) if set(_vae_options(r)) <= {("--seed", "1")}
            and datetime.fromisoformat(r["started"]) >= since]


@figure("vae.default_wall")
def _vae_default_wall() -> str:
    walls = [r["wall_s"] for r in _default_runs()]
    loads = [r["load_average"]["start"] for r in _default_runs()]
    return f"{minutes_range(walls)}, load average {span(loads)} at the start"


@figure("vae.default_valid")
def _vae_default_valid() -> str:
    valid = [r["report"]["samples"]["validity"] for r in _default_runs()]
    return f"{percent_range(valid)} of its prior samples (temperature 1) are valid SMILES"


# The runs quoted as the suite's time: those that record what they ran (timed_run.py's `commit` and `last_line`,
# from 2026-12-06). The suite grew from ~940 tests (2026-12-04) to ~1,570, and the earlier runs' wall times,
# quoted apart, are a smaller suite's.
PYTEST_NOW = "2026-12-06T20:00:00+00:00"


def _passed(run: dict) -> int:
    """The tests a run passed, from pytest's last line ("1567 passed, 2 skipped ... in 917.40s")."""
    found = re.search(r"(\d+) passed", run["last_line"])
    if not found:
        raise SystemExit(f"pytest.run: the run started {run['started']} has no pytest summary as its last line: "
                         f"{run['last_line']!r}")
    return int(found.group(1))


@figure("pytest.run")
def _pytest_run() -> str:
    """The runs recorded since PYTEST_NOW (wall, tests, load, memory) as ranges, and the earlier runs' wall."""
    sampled = [r for r in runs("pytest-cpu-2core.json") if "peak_total_rss_mib" in r]  # two workers, process tree
    now = datetime.fromisoformat(PYTEST_NOW)
    recent = [r for r in sampled if datetime.fromisoformat(r["started"]) >= now]
    if not recent:
        raise SystemExit(f"pytest.run: no run in pytest-cpu-2core.json started since PYTEST_NOW={PYTEST_NOW}; "
                         "append one recorded by .ci/run (CI_PYTEST_RESULTS) first")
    before = [r for r in sampled if datetime.fromisoformat(r["started"]) < now]
    walls = [r["wall_s"] / 60 for r in recent]
    loads = [r["load_average"]["start"] for r in recent]
    tests = span([_passed(r) for r in recent], digits=0)
    # Memory from what the processes take from the machine (their PSS summed); the sum of their resident sets
    # counts the libraries they share once per process.
    memory = span([r["peak_total_pss_mib"] / 1024 for r in recent], "GiB")
    rss = span([r["peak_total_rss_mib"] / 1024 for r in recent], "GiB")
    first, last = (datetime.fromisoformat(r["started"]).date().isoformat() for r in (before[0], before[-1]))
    return (f"{span(walls, 'min')} wall ({runs_count(len(recent))} of {tests} tests, load average {span(loads)} at "
            f"the start; {span([r['wall_s'] / 60 for r in before], 'min')} in the {len(before)} runs of the earlier "
            f"suites of {first} to {last}), {memory} peak memory taken from the machine (its processes' "
            f"proportional set sizes summed; {rss} summing their resident sets, which counts the libraries they "
            "share once per process)")


# .ci/run's steps, as its last line records them (benchmarks/timed_run.py --steps), in the README's words
CI_STEPS = {"install": "installs", "pytest": "the default run", "slow_processes_and_examples":
            "the multi-process tests and example 03", "slow_others": "the other slow tests",
            "floors_install": "the floors' install", "floors_tests": "the floors' tests"}


@figure("ci.run")
def _ci_run() -> str:
    """The whole `.ci/run` over its recorded runs, and the newest run's time per step."""
    ci = runs("ci-cpu-2core.json")
    steps = ci[-1]["steps"]
    unknown = set(steps) - set(CI_STEPS)
    if unknown:
        raise SystemExit(f"ci.run: steps {sorted(unknown)} of the newest run have no words in CI_STEPS")
    parts = ", ".join(f"{CI_STEPS[name]} {seconds / 60:.1f}" for name, seconds in steps.items())
    return f"{span([r['wall_s'] / 60 for r in ci], 'min')} ({runs_count(len(ci))}; the newest: {parts} min)"


# .ci/run with CI_PYTHON=python3.12 / python3.13, run by hand: pip gives those Pythons newer jax, flax and numpy than
# 3.11's CI gets.
NEWER_PYTHONS = ("3.12", "3.13")


@figure("ci.newer_pythons")
def _ci_newer_pythons() -> str:
    """The newest `.ci/run` on each of NEWER_PYTHONS (recorded only where every step passed): what it ran with, its
    time, its default run's memory."""
    said = []
    for python in NEWER_PYTHONS:
        ci_file, tests_file = f"ci-python{python}-cpu-2core.json", f"pytest-python{python}-cpu-2core.json"
        ci, tests = runs(ci_file)[-1], runs(tests_file)[-1]
        if ci["commit"] != tests["commit"]:
            raise SystemExit(f"ci.newer_pythons: the newest runs of {ci_file} and {tests_file} ran other commits")
        versions = ", ".join(f"{name} {tests['packages'][name]}" for name in ("jax", "flax", "numpy", "torch"))
        said.append(f"Python {tests['python']} ({versions}): the whole `.ci/run` passed in {ci['wall_s'] / 60:.1f} "
                    f"min, {_passed(tests)} tests in its default run, "
                    f"{tests['peak_total_pss_mib'] / 1024:.1f} GiB peak memory (summed proportional set sizes)")
    return "; ".join(said)


@figure("cli.cache")
def _cli_cache() -> str:
    """The newest run: each command's median wall time with an empty cache and with the one it filled."""
    commands = load("cli-cache-cpu-2core.json")["runs"][-1]["commands"]
    return ", ".join(f"`{name}` {statistics.median(r['empty_s']):.1f} -> {statistics.median(r['filled_s']):.1f} s"
                     for name, r in commands.items()) + f" (median of {len(next(iter(commands.values()))['empty_s'])})"


@figure("cli.startup")
def _cli_startup() -> str:
    """Each command's median wall time in a new process, before any work: the file's last two runs, measured back to
    back (the package before `configs/` at a worktree, then the newest)."""
    runs = load("cli-startup-cpu-2core.json")["runs"]
    before, after = runs[-2], runs[-1]
    said = [f"`{name}` {statistics.median(before['seconds'][name]):.2f} -> {statistics.median(t):.2f} s"
            for name, t in after["seconds"].items()]
    return (f"{', '.join(said)} (jax-scan-rnn {before['package_commit']} -> {after['package_commit']}, median of "
            f"{len(next(iter(after['seconds'].values())))} each)")


@figure("train.optimizer_init")
def _optimizer_init() -> str:
    """The newest run: each model's median time to build its optimiser state, eager and compiled."""
    run = load("optimizer-init-cpu-2core.json")["runs"][-1]
    names = {"traveller": "the default Traveller (H=32, 2 layers; Adam with clipping)",
             "vae": "the default VAE (H=256, 2 decoder layers; AdamW, weight decay 0.1)"}
    parts = [f"{names[m]} {statistics.median(t['eager']):.3f} -> {statistics.median(t['compiled']):.3f} s"
             for m, t in run["seconds"].items()]
    return ", ".join(parts) + f" (median of {len(run['seconds']['traveller']['eager'])} fresh processes each)"


@figure("cells.model_init")
def _model_init() -> str:
    """The newest run: each model's median time to build, parameters drawn per shape and cut from longer draws."""
    run = load("model-init-cpu-2core.json")["runs"][-1]
    names = {"lstm": "`jsr.LSTM(8, 64, 2)`", "traveller": "the default Traveller (H=32, 2 layers)",
             "vae": "the default VAE (H=256, 2 decoder layers)"}
    parts = [f"{names[m]} {statistics.median(t['per-shape']):.2f} -> {statistics.median(t['cut']):.2f} s"
             for m, t in run["seconds"].items()]
    return ", ".join(parts) + f" (median of {len(run['seconds']['lstm']['cut'])} fresh processes each)"


@figure("cells.hand_vjp")
def _cells_hand_vjp() -> str:
    """The newest run of benchmarks/cell_vjp.py: per model and batch, the warm train call with the cells'
    hand-written gate derivatives over JAX's own (median over rounds of the round's ratio), and both compiles."""
    run = load("cell-vjp-cpu-2core.json")["runs"][-1]
    names = {"traveller": "`jsr.Traveller`", "lstm": "`jsr.LSTM`", "gru": "`jsr.GRU`"}
    parts = []
    for key, case in run["cases"].items():
        model, batch = key.split(" ")
        compile_s = {v: statistics.median(t) for v, t in case["compile_s"].items()}
        parts.append(f"{names[model]} {batch}: {case['hand_over_jax']:.2f}x (compile {compile_s['hand']:.2f} s "
                     f"against {compile_s['jax']:.2f} s)")
    rounds = len(next(iter(run["cases"].values()))["us_per_step"]["hand"])
    return "; ".join(parts) + f" (T={run['steps']}, median of {rounds} rounds)"


@figure("cells.hand_vjp_short")
def _cells_hand_vjp_short() -> str:
    """The newest run of benchmarks/cell_vjp.py as two ranges: hand-written over JAX's own, B=64 and B=1."""
    run = load("cell-vjp-cpu-2core.json")["runs"][-1]
    by_batch = {b: [c["hand_over_jax"] for k, c in run["cases"].items() if k.endswith(f"B={b}")] for b in (64, 1)}
    return (f"{span(by_batch[64], digits=2)}x the time with JAX's derivative at B=64, {span(by_batch[1], digits=2)}x "
            f"at B=1, for the Traveller, `jsr.LSTM` and `jsr.GRU`, T={run['steps']}")


@figure("bench.train_compile_parts")
def _train_compile_parts() -> str:
    """The newest run of benchmarks/train_compile.py: per cell, the median compile of jsr's TrainStep, of the
    same jsr model under the peers' plain Adam step, and of the peer."""
    run = load("train-compile-cpu-2core.json")["runs"][-1]
    names = {"jax-gru-seq": "`jsr.GRU` against Flax's `nnx.RNN(GRUCell)`",
             "jax-lstm-seq": "`jsr.LSTM` against `nnx.RNN(OptimizedLSTMCell)`",
             "jax-scan-auto": "`jsr.Traveller` against Flax's feedback cell (OptimizedLSTMCell)"}
    parts, over_peer, at_1_over_peer = [], [], []
    for key, cell in run["cells"].items():
        t = {name: statistics.median(v) for name, v in cell["seconds"].items()}
        over_peer.append(t["jsr (TrainStep)"] / t["peer"])
        unroll_1 = ""
        if "jsr unroll 1 (TrainStep)" in t:
            unroll_1 = f", `TrainStep` at unroll 1 {t['jsr unroll 1 (TrainStep)']:.2f} s"
            at_1_over_peer.append(t["jsr unroll 1 (TrainStep)"] / t["peer"])
        parts.append(f"{names[key]}: `TrainStep` {t['jsr (TrainStep)']:.2f} s, the same model under plain Adam "
                     f"{t['jsr (plain Adam)']:.2f} s, the peer {t['peer']:.2f} s{unroll_1}")
    rounds = len(next(iter(run["cells"].values()))["seconds"]["peer"])
    ratios = f"`TrainStep` over the peer {ratio_span(over_peer)}"
    if len(at_1_over_peer) == len(over_peer):
        ratios += f", at unroll 1 {ratio_span(at_1_over_peer)}"
    return ("; ".join(parts) + f" (B={run['batch']}, T={run['steps']:,}, median of {rounds} rotating compiles; "
            f"{ratios})")


NORM_CHECK_CHANGE = "2026-12-03"  # train-compile runs from this day on have c11757b's gradient norm and state check


@figure("train.guard_margin")
def _train_guard_margin() -> str:
    """What `TrainStep` adds to the compile of the same model's plain Adam step (median minus median, per cell),
    in the train-compile runs before and after the gradient norm and state check became one dot and one sum."""
    def margins(run):
        return [statistics.median(c["seconds"]["jsr (TrainStep)"]) - statistics.median(c["seconds"]["jsr (plain Adam)"])
                for c in run["cells"].values()]

    every = load("train-compile-cpu-2core.json")["runs"]
    before = [margins(r) for r in every if r["started"] < NORM_CHECK_CHANGE]
    after = [margins(r) for r in every if r["started"] >= NORM_CHECK_CHANGE]
    return (f"{span([m for ms in before for m in ms], 's', 2)} over the three cells in {runs_count(len(before))} "
            f"before, {span([m for ms in after for m in ms], 's', 2)} in {runs_count(len(after))} after")


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


VAE_RUNS = "vae-experiments-cpu-2core.json"


# `train vae`'s defaults as they changed: on 2026-12-01 until 12:35 UTC one decoder layer (the encoder's count) and
# KL weight 0.05; until 20:48 UTC uniformly random batches (no length bucketing); on 2026-12-02 until 11:15 UTC
# rdkit's data, all of it, as written, in length-bucketed batches, 1,200 updates without weight decay (then MOSES's
# first 300,000 molecules in Kekulé form, random batches, 1,800 updates, weight decay 0.1). A run started before a
# change shows the flags that repeat it today; a flag equal to today's default is not shown.
OLD_DEFAULTS = (("2026-12-01T12:35:00+00:00", (("--decoder-layers", "1"), ("--max-beta", "0.05"))),
                ("2026-12-01T20:48:09+00:00", (("--bucket-pool", "0"),)),
                ("2026-12-02T11:15:00+00:00", (("--data", "rdkit"), ("--limit", "none"), ("--no-kekule", None),
                                               ("--bucket-pool", "100"), ("--steps", "1200"),
                                               ("--weight-decay", "0.0"))))
# The runs the figures below name by their options are named as the defaults before 2026-12-02 11:15 UTC named them.
NAMED_AS_OF = "2026-12-02T11:14:00+00:00"


def _option_pairs(words: list[str]) -> list[tuple[str, str | None]]:
    """Command-line words as (flag, its value or None for a switch) pairs."""
    pairs = []
    while words:
        value = words[1] if len(words) > 1 and not words[1].startswith("--") else None
        pairs.append((words[0], value))
        words = words[2 if value is not None else 1:]
    return pairs


def _family(flag: str) -> str:
    """A switch and its negation are one option: --kekule / --no-kekule -> --kekule."""
    return flag.replace("--no-", "--", 1)


def _older(pairs: list[tuple[str, str | None]], when: datetime) -> list[tuple[str, str | None]]:
    """`pairs` with the old default of every option they do not set and that changed after `when`."""
    given = {_family(f) for f, _ in pairs}
    added = []
    for until, old in OLD_DEFAULTS:  # the earliest change after `when` holds the value in force then
        if when < datetime.fromisoformat(until):
            added += [(f, v) for f, v in old if _family(f) not in given]
            given |= {_family(f) for f, _ in old}
    return pairs + added


@cache
def _defaults(as_of: str | None) -> frozenset[tuple[str, str | None]]:
    """`train vae`'s defaults as (flag, value) pairs, today's or those in force at `as_of`."""
    from jax_scan_rnn.options import flag
    from jax_scan_rnn.tasks.vae import TRAIN_DEFAULTS, VAETask

    task, today = VAETask(), []
    for f in fields(VAETask):
        value = getattr(task, f.name)
        if f.name == "kekule":  # None: Kekulé for SMILES, which every run's data is
            value = task.writes_kekule
        name = flag(VAETask, f.name)
        if isinstance(value, bool):
            today.append((name if value else name.replace("--", "--no-", 1), None))
        else:
            today.append((name, "none" if value is None else str(value)))
    today += [("--steps", str(TRAIN_DEFAULTS["steps"])), ("--weight-decay", str(TRAIN_DEFAULTS["weight_decay"]))]
    if as_of is None:
        return frozenset(today)
    changed = _older([], datetime.fromisoformat(as_of))
    return frozenset(changed) | {(f, v) for f, v in today if _family(f) not in {_family(g) for g, _ in changed}}


def _vae_options(run: dict, as_of: str | None = None) -> list[tuple[str, str | None]]:
    """The options that make a run differ from today's defaults (or those at `as_of`), from its recorded command
    and start."""
    words = run["command"].split()
    # Where it wrote, and the evaluation size every run shares, are not options of the run.
    pairs = [(f, v) for f, v in _option_pairs(words[words.index("vae") + 1:]) if f not in ("--out", "--eval-samples")]
    defaults = _defaults(as_of)
    return [p for p in _older(pairs, datetime.fromisoformat(run["started"])) if p not in defaults]


def vae_run_options(run: dict) -> dict[str, str | None]:
    """Every option a recorded `train vae` run ran with that differs from today's defaults, as {flag: value}
    (None for a switch): what benchmarks/vae_frontier.py reads a run's data and form from."""
    return dict(_vae_options(run))


def _vae_flags(run: dict) -> str:
    """`_vae_options` as the command line writes them, or "(defaults)"."""
    return " ".join(f if v is None else f"{f} {v}" for f, v in _vae_options(run)) or "(defaults)"


def _sample_row(run: dict) -> str:
    s = run["report"]["samples"]
    return f"{s['validity']:.3f} valid, {s['uniqueness']:.3f} unique, {s['novelty']:.3f} novel"


@figure("vae.charrnn_curve")
def _vae_charrnn_curve() -> str:
    """The decoder alone (CharRNN) by number of updates: validity rises slowly, then it memorises."""
    def options(run: dict) -> str:  # the run's options but its number of updates
        return re.sub(r"--steps \d+ ?", "", _vae_flags(run)).strip()

    first = next(r for r in runs(VAE_RUNS)
                 if "--decoder-only" in r["command"].split() and "--steps" not in r["command"].split())
    by_steps = {}
    for run in runs(VAE_RUNS):
        if options(run) == options(first):
            words = run["command"].split()
            steps = int(words[words.index("--steps") + 1]) if "--steps" in words else 1200
            by_steps[steps] = run
    ordered = sorted(by_steps)
    valid = ", ".join(f"{by_steps[n]['report']['samples']['validity']:.3f}" for n in ordered)
    last = by_steps[ordered[-1]]["report"]["samples"]
    return (f"{valid} valid at {', '.join(f'{n:,}' for n in ordered)} updates; at {ordered[-1]:,}, uniqueness "
            f"{last['uniqueness']:.3f} and novelty {last['novelty']:.3f}")


def _aromatic_runs() -> list[dict]:
    """The runs that wrote molecules as their data writes them (aromatic), not in Kekulé form."""
    return [r for r in runs(VAE_RUNS) if ("--no-kekule", None) in _vae_options(r)]


def _best_compliant_run() -> dict:
    """The most valid aromatic run that keeps issue 15's line: uniqueness >= 0.99, novelty >= 0.9, in 10 minutes
    (the Kekulé form's runs have figures of their own)."""
    ok = [r for r in _aromatic_runs() if r["report"]["samples"]["uniqueness"] >= 0.99
          and r["report"]["samples"]["novelty"] >= 0.9 and r["wall_s"] <= 600]
    return max(ok, key=lambda r: r["report"]["samples"]["validity"])


def _most_valid_run() -> dict:
    """The most valid aromatic run within issue 15's 10 minutes, whatever its uniqueness and novelty."""
    return max((r for r in _aromatic_runs() if r["wall_s"] <= 600), key=lambda r: r["report"]["samples"]["validity"])


@figure("vae.best_compliant")
def _vae_best_compliant() -> str:
    return _with_other_seed(_best_compliant_run())


def _run_line(run: dict) -> str:
    """A run's options (or "the default run"), sample metrics, wall time and load at its start."""
    flags = _vae_flags(run)
    name = "the default run" if flags == "(defaults)" else f"`{flags}`"
    return f"{name}: {_sample_row(run)}, {run['wall_s'] / 60:.1f} min at load {run['load_average']['start']:.1f}"


@figure("vae.most_valid")
def _vae_most_valid() -> str:
    return _with_other_seed(_most_valid_run())


def _with_other_seed(best: dict) -> str:
    """`_run_line` of a run, and its other seed's sample metrics when recorded."""
    text = _run_line(best)
    # Its other seed, when recorded: a difference smaller than the seeds' is not a finding.
    twin = _other_seed(best)
    if twin is not None:
        text += (f"; with {'seed 0' if ('--seed', '1') in _vae_options(best) else '`--seed 1`'}: "
                 f"{_sample_row(twin)}, {twin['wall_s'] / 60:.1f} min")
    return text


def _vae_run(flags: str, as_of: str | None = NAMED_AS_OF) -> dict:
    """The first run whose options (`_vae_options` as of `as_of`) are `flags`, in any order ("(defaults)": none)."""
    wanted = set(_option_pairs(flags.split())) if flags != "(defaults)" else set()
    return next(r for r in runs(VAE_RUNS) if set(_vae_options(r, as_of)) == wanted)


# The same options with seeds 0 and 1, bucketed (today's default) and with random batches: rdkit's data, MOSES's.
SEED_PAIRS = (("(defaults)", "--seed 1"), ("--bucket-pool 0", "--bucket-pool 0 --seed 1"))
MOSES_SEED_PAIRS = (("--data moses --limit 300000", "--data moses --limit 300000 --seed 1"),
                    ("--data moses --limit 300000 --bucket-pool 0", "--data moses --limit 300000 --bucket-pool 0 --seed 1"))


@figure("vae.seed_spread")
def _vae_seed_spread() -> str:
    """The largest validity difference between two seeds of the same options, in points."""
    valid = [[_vae_run(f)["report"]["samples"]["validity"] for f in pair] for pair in SEED_PAIRS + MOSES_SEED_PAIRS]
    return f"{max(abs(a - b) for a, b in valid) * 100:.1f} points"


def _seed_pair(flags: tuple[str, str]) -> str:
    got = [_vae_run(f) for f in flags]
    return (" and ".join(f"{r['report']['samples']['validity']:.3f}" for r in got) + " in "
            + " and ".join(f"{r['wall_s'] / 60:.1f}" for r in got) + " min")


@figure("vae.bucketing")
def _vae_bucketing() -> str:
    """Validity and wall time of the seed pairs on rdkit's data, bucketed against random batches."""
    return f"bucketed, {_seed_pair(SEED_PAIRS[0])} (seeds 0 and 1); random batches, {_seed_pair(SEED_PAIRS[1])}"


@figure("vae.bucketing_moses")
def _vae_bucketing_moses() -> str:
    """The same on MOSES's data (`--data moses --limit 300000`)."""
    bucketed, random = MOSES_SEED_PAIRS
    return f"bucketed, {_seed_pair(bucketed)} (seeds 0 and 1); random batches, {_seed_pair(random)}"


@figure("vae.experiments")
def _vae_experiments() -> str:
    return _vae_table(runs(VAE_RUNS))


@figure("vae.key_runs")
def _vae_key_runs() -> str:
    """The README's rows: today's default runs, the same options without the Kekulé form, the CharRNN on MOSES's
    data, and of the aromatic runs the best within the uniqueness and novelty line and the most valid within 10
    minutes (each chosen from the results, not named by hand; a run is shown once, and of the default runs with
    the same options only the latest)."""
    latest = {tuple(_vae_options(r)): r for r in _default_runs()}  # in run order: the last of each options wins
    chosen = [*latest.values(), _vae_run(AROMATIC_DEFAULT), _vae_run("--data moses --limit 300000 --decoder-only"),
              _best_compliant_run(), _most_valid_run()]
    return _vae_table([r for i, r in enumerate(chosen) if all(r is not c for c in chosen[:i])])


def _metric_pairs(got: list[dict]) -> str:
    """Valid, unique and novel of one run or of its two seeds ("a and b"), and the wall times."""
    def both(key: str) -> str:
        return " and ".join(f"{r['report']['samples'][key]:.3f}" for r in got)

    return (f"{both('validity')} valid, {both('uniqueness')} unique, {both('novelty')} novel in "
            + " and ".join(f"{r['wall_s'] / 60:.1f}" for r in got) + " min")


@figure("vae.kekule")
def _vae_kekule() -> str:
    """The Kekulé runs against the same options with molecules as written (seeds 0 and 1 where recorded)."""
    parts = []
    for data, kekule, aromatic in (("MOSES's data, the best run's options", AROMATIC_DEFAULT + " --kekule",
                                    AROMATIC_DEFAULT),
                                   ("rdkit's data, the defaults before", "--kekule", "(defaults)")):
        got, base = _seeds(kekule), _seeds(aromatic)
        seeds = " (seeds 0 and 1)" if len(got) > 1 else ""
        parts.append(f"on {data}, in Kekulé form {_metric_pairs(got)}{seeds}; as written {_metric_pairs(base)}")
    return "; ".join(parts)


@figure("vae.default_runs")
def _vae_default_runs() -> str:
    """Every run of today's `train vae` (seed 0, or `--seed 1`) in the order they ran."""
    return "; ".join(f"{'`--seed 1`' if ('--seed', '1') in _vae_options(r) else 'seed 0'}: {_metric_pairs([r])} "
                     f"at load {r['load_average']['start']:.1f}, peak memory {r['peak_total_rss_mib'] / 1024:.1f} GiB "
                     f"(all processes)" for r in _default_runs())


# Today's defaults but molecules as MOSES writes them (aromatic), as the defaults before 2026-12-02 named them.
AROMATIC_DEFAULT = "--data moses --limit 300000 --bucket-pool 0 --steps 1800 --weight-decay 0.1"


def _vae_table(chosen: list[dict]) -> str:
    lines = ["| options (`jax-scan-rnn train vae ...`) | wall | load | valid (T=1) | valid (greedy) | unique | novel | "
             "TF token acc | free-running token acc | free-running seq acc | KL (nats) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in chosen:
        rep = run["report"]
        sampled, greedy = rep["samples"], rep["samples_greedy"]
        rec, latent = rep.get("reconstruction"), rep.get("latent")
        cells = [f"`{_vae_flags(run)}`", f"{run['wall_s'] / 60:.1f} min",
                 f"{run['load_average']['start']:.1f}", f"{sampled['validity']:.3f}", f"{greedy['validity']:.3f}",
                 f"{sampled['uniqueness']:.3f}", f"{sampled['novelty']:.3f}",
                 *((f"{rec[k]:.3f}" if rec else "n/a") for k in ("tf_token_acc", "free_token_acc", "free_sequence_acc")),
                 f"{latent['kl']:.1f}" if latent else "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# Narrower GRUs buy more updates in the same minutes (MOSES's data, random batches): wide and few, narrow and many.
WIDTH_RUNS = ("--data moses --limit 300000 --bucket-pool 0 --steps 1800",
              "--data moses --limit 300000 --bucket-pool 0 --hidden-size 192 --steps 2400",
              "--data moses --limit 300000 --bucket-pool 0 --hidden-size 128 --steps 3600",
              "--data moses --limit 300000 --bucket-pool 0 --hidden-size 128 --steps 4200")


@figure("vae.width")
def _vae_width() -> str:
    """Each width's run: its hidden size and updates, sample metrics and wall time."""
    parts = []
    for flags in WIDTH_RUNS:
        run, options = _vae_run(flags), dict(_option_pairs(flags.split()))
        hidden = options.get("--hidden-size", "256")
        parts.append(f"H={hidden}, {int(options['--steps']):,} updates: {_sample_row(run)}, {run['wall_s'] / 60:.1f} min")
    return "; ".join(parts)


@figure("vae.moses_novelty")
def _vae_moses_novelty() -> str:
    """MOSES's published SMILES models: valid, but under the novelty line."""
    from jax_scan_rnn.metrics import MOSES_PUBLISHED

    return "; ".join(f"{name}: {MOSES_PUBLISHED[name]['valid']:.3f} valid, novelty {MOSES_PUBLISHED[name]['Novelty']:.3f}"
                     for name in ("MOSES CharRNN", "MOSES VAE"))


# Learning-rate schedules and weight decay at MOSES's 1,800 updates in random batches (the cosine is the default).
SCHEDULE_BASE = "--data moses --limit 300000 --bucket-pool 0 --steps 1800"
SCHEDULE_RUNS = (("cosine decay (the default)", ""), ("linear decay", " --lr-schedule linear"),
                 ("no decay", " --lr-schedule constant"), ("cosine with weight decay 0.1", " --weight-decay 0.1"),
                 ("linear with weight decay 0.1", " --weight-decay 0.1 --lr-schedule linear"))


def _other_seed(run: dict) -> dict | None:
    """The recorded run of the same options with the other seed (0 <-> 1), or None."""
    others = set(_vae_options(run)) ^ {("--seed", "1")}
    return next((r for r in runs(VAE_RUNS) if set(_vae_options(r)) == others), None)


def _seeds(flags: str) -> list[dict]:
    """The run of `flags` (seed 0) and, when recorded, its seed 1."""
    first = _vae_run(flags)
    return [r for r in (first, _other_seed(first)) if r is not None]


@figure("vae.schedules")
def _vae_schedules() -> str:
    parts = []
    for name, extra in SCHEDULE_RUNS:
        got = _seeds(SCHEDULE_BASE + extra)
        if got:
            parts.append(f"{name}, " + " and ".join(f"{r['report']['samples']['validity']:.3f} valid at novelty "
                                                    f"{r['report']['samples']['novelty']:.3f}" for r in got))
    return "; ".join(parts) + " (seeds 0 and 1 where two are given)"


@figure("vae.steps1800")
def _vae_steps1800() -> str:
    return _with_other_seed(_vae_run("--data moses --limit 300000 --bucket-pool 0 --steps 1800"))


@figure("vae.narrow_regularised")
def _vae_narrow_regularised() -> str:
    return _run_line(_vae_run("--data moses --limit 300000 --bucket-pool 0 --hidden-size 128 --steps 4200 "
                              "--weight-decay 0.1 --lr-schedule linear"))


@figure("vae.moses_random")
def _vae_moses_random() -> str:
    return _run_line(_vae_run("--bucket-pool 0 --data moses --limit 300000"))


VAE_INVALID = "vae-invalid-cpu-2core.json"


@figure("vae.mask_gain")
def _vae_mask_gain() -> str:
    """Validity points the syntax mask adds, over the recorded runs (each the same model and seed, both samplers)."""
    gains = [(r["masked"]["validity"] - r["plain"]["validity"]) * 100 for r in runs(VAE_INVALID)]
    return f"{span(gains, 'points')} ({runs_count(len(gains))}: {len({r['run'] for r in runs(VAE_INVALID)})} models)"


@figure("vae.invalid")
def _vae_invalid() -> str:
    """What rdkit rejects in trained runs' prior samples, with and without the syntax mask (benchmarks/vae_invalid.py)."""
    recorded = runs(VAE_INVALID)
    classes = list(recorded[0]["plain"]["invalid"])  # the script's classes, in its order
    lines = [f"{recorded[0]['samples']:,} prior samples per row (temperature 1):", "",
             "| run (`train vae ...`), sampling seed | sampler | valid | " + " | ".join(classes) + " | at the length limit |",
             "|---|---|" + "---:|" * (len(classes) + 2)]
    for run in recorded:
        for key, name in (("plain", "the model's own"), ("masked", "with the syntax mask")):
            row = run[key]
            lines.append(f"| `{_vae_run_flags(run['run'])}`, {run['seed']} | {name} | {row['validity']:.3f} | "
                         + " | ".join(f"{row['invalid'][c]:.3f}" for c in classes) + f" | {row['at_max_length']:.3f} |")
    return "\n".join(lines)


VAE_MOSES = "vae-moses-cpu-2core.json"
MOSES_SHOWN = ("valid", "unique@10k", "FCD/Test", "SNN/Test", "Frag/Test", "Scaf/Test", "IntDiv", "Filters", "Novelty")


def _vae_run_flags(out_dir: str) -> str:
    """The options of the training run that wrote `out_dir` (from the experiments' results file)."""
    for run in runs(VAE_RUNS):
        words = run["command"].split()
        if "--out" in words and words[words.index("--out") + 1] == out_dir:
            return _vae_flags(run)
    raise KeyError(f"{VAE_RUNS}: no training run wrote {out_dir}")


@figure("vae.moses")
def _vae_moses() -> str:
    from jax_scan_rnn.metrics import MOSES_PUBLISHED  # the published rows, as the library prints them

    lines = ["| model | " + " | ".join(MOSES_SHOWN) + " |", "|---|" + "---:|" * len(MOSES_SHOWN)]
    def flags(run: dict) -> str:  # the options of the training run it evaluated
        words = run["command"].split()
        return _vae_run_flags(words[words.index("--checkpoint") + 1])

    for run in sorted(runs(VAE_MOSES), key=lambda run: flags(run) != "(defaults)"):  # today's default first
        row = run["report"]["moses"]
        name = f"`train vae {flags(run)}`".replace(" (defaults)`", "` (default)")
        lines.append(f"| {name}, {row['n_generated']:,} samples | "
                     + " | ".join(f"{row[c]:.3f}" for c in MOSES_SHOWN) + " |")
    for name in ("MOSES VAE", "MOSES CharRNN"):
        lines.append(f"| {name} (published, 30,000 samples) | "
                     + " | ".join(f"{MOSES_PUBLISHED[name][c]:.3f}" for c in MOSES_SHOWN) + " |")
    reference = {run["report"]["moses"]["reference"] for run in runs(VAE_MOSES)}
    return "\n".join(lines + ["", f"Test metrics against {', '.join(sorted(reference))}; Novelty against each run's "
                                   "training molecules."])


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


# ------------------------------------------------------------ docs/scan_vs_loop.md and its appendix, docs/tuning_cpu.md

# The rows of the page's table, B=1, T=1000, in the order the page explains them.
LOOP_ROWS = (
    ("torch-loop", "seed loop: `nn.LSTM` called once per step"),
    ("torch-cell", "the same loop, cell math written out (`F.linear` + gates)"),
    ("torch-script", "that loop under `torch.jit.script` (TorchScript)"),
    ("torch-scan", "`torch._higher_order_ops.scan`, eager"),
    ("torch-compile-scan", "`torch.compile` of that scan"),
    ("jax-scan-auto", "**`jax.lax.scan`, jitted** (`jsr.Traveller`, its defaults)"),
    ("jax-user-call", "the same through `fast(x)`, `fast = jsr.jit(model)`: the user's call"),
    ("torch-lstm-seq", "`nn.LSTM` over the whole sequence, feedback removed (a bound, not this model)"),
    ("limit-xla", "the limit: same FLOPs, time dependency removed"),
)


def any_row(file: str, method: str, mode: str, batch: int, steps: int) -> dict | None:
    """The row of a cell whatever its status (skipped and n/a rows say why), or None if the run has none."""
    for row in load(file)["rows"]:
        if (row["method"], row["mode"], row["B"], row["T"]) == (method, mode, batch, steps):
            return row
    return None


def times(value: float) -> str:
    return f"{value:.3g}×"


@figure("loop.seed_step")
def _loop_seed_step() -> str:
    return f"{us(bench_row(MAIN, 'torch-loop', 'forward', 1, 1000)['per_step_us'])} per step"


@figure("loop.table")
def _loop_table() -> str:
    lines = ["| B=1, T=1000 (CPU, 2 cores) | forward, per step | vs seed loop | vs limit | train step, per step "
             "| vs seed loop |", "|---|---:|---:|---:|---:|---:|"]
    notes = []
    for method, label in LOOP_ROWS:
        fwd = bench_row(MAIN, method, "forward", 1, 1000)
        bold = "**" if method == "jax-scan-auto" else ""  # the headline row's forward figures
        forward = (us(fwd["per_step_us"]), times(fwd["speedup_vs_seed"]), times(fwd["x_limit"]))
        cells = [f"{bold}{c}{bold}" for c in forward]
        train = any_row(MAIN, method, "train", 1, 1000)
        if train is not None and train["status"] == "ok":
            cells += [us(train["per_step_us"]), times(train["speedup_vs_seed"])]
        else:
            why = "not measured" if train is None else train["reason"] if train["status"] == "n/a" else \
                f"{train['status']}: {train['reason']}"
            notes.append(f"({len(notes) + 1}) {why}")
            cells += [f"— ({len(notes)})", ""]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines + [""] + [note + ("  " if i < len(notes) - 1 else "") for i, note in enumerate(notes)])


@figure("loop.agreement")
def _loop_agreement() -> str:
    diffs = [row["max_abs_diff"]["value"] for row in load(MAIN)["rows"]
             if row["method"] in ("jax-scan-auto", "jax-user-call") and row["status"] == "ok"
             and row.get("max_abs_diff") and row["max_abs_diff"]["vs"] == "torch-loop"]
    return f"{max(diffs):.1e}"


@figure("loop.b64_lstm")
def _loop_b64_lstm() -> str:
    """nn.LSTM over the whole sequence (no feedback) against the scan at B=64, and which of the two was faster."""
    seq, scan = (bench_row(MAIN, m, "forward", 64, 1000) for m in ("torch-lstm-seq", "jax-scan-auto"))
    verdict = ("the scan still leads" if scan["per_step_us"] < seq["per_step_us"]
               else "the fused library LSTM, with no feedback to wait for, wins")
    return (f"{verdict}: `nn.LSTM` {us(seq['per_step_us'])} per step ({seq['x_limit']:.2f}× the limit row) "
            f"against the scan's {us(scan['per_step_us'])}")


@figure("loop.eager_jax")
def _loop_eager_jax() -> str:
    row = bench_row(MAIN, "jax-eager", "forward", 1, 100)
    return f"{us(row['per_step_us'])} per step at T=100, {1 / row['speedup_vs_seed']:.1f}× slower than the seed's loop"


@figure("loop.torch_scan_train")
def _loop_torch_scan_train() -> str:
    row = bench_row(MAIN, "torch-scan", "train", 1, 100)
    return (f"{row['per_step_us'] * row['T'] / 1e6:.2f} s per call at T=100, "
            f"{1 / row['speedup_vs_seed']:.1f}× slower than the seed loop")


CALLS = "call-overhead-cpu-2core.json"


def call_runs() -> list[dict]:
    """Each run of benchmarks/call_overhead.py as {(arm, T): row}, oldest first."""
    return [{(r["arm"], r["T"]): r for r in run["rows"]} for run in runs(CALLS)]


@figure("calls.readme")
def _calls_readme() -> str:
    every = call_runs()

    def at(arm: str, steps: int) -> list[float]:
        return [run[(arm, steps)]["median_us"] for run in every]

    jsr = [t / 1000 for t in at("jsr.jit", 1000)]
    seed = [t / 1000 for t in at("torch seed loop", 1000)]
    ratios = [s / j for s, j in zip(seed, jsr)]
    eager = [t / 1e6 for t in at("eager", 4)]
    return (f"{span(eager, 's', 2)} per call for a T=4 Traveller on a 2-core CPU, where `jsr.jit` takes "
            f"{span(at('jsr.jit', 4), 'µs', 0)}. The idiomatic `nnx.jit(lambda m, x: m(x))` walks the module graph on "
            f"every call ({span(at('nnx.jit', 4), 'µs', 0)}), a bare `jax.jit` over `nnx.split` state takes "
            f"{span(at('bare jax.jit', 4), 'µs', 0)}; `jsr.jit` flattens the model once and reads the current weights each "
            f"call ({span([j / b for j, b in zip(at('jsr.jit', 4), at('bare jax.jit', 4))], digits=2)}x the bare call's "
            f"time; ranges over {runs_count(len(every))}, the host's speed moving them together). Over T=1000 steps it "
            f"runs at {span(jsr, 'µs', 2)} per step, {span(ratios, digits=0)}x the seed's eager PyTorch loop "
            f"({span(seed, 'µs', 0)} per step)")


@figure("calls.eager_memory")
def _calls_eager_memory() -> str:
    measured = [run for run in call_runs() if run[("eager", 4)].get("resident_growth_mib_per_call") is not None]
    growth = {steps: [run[("eager", steps)]["resident_growth_mib_per_call"] for run in measured] for steps in (4, 1000)}
    return (f"each eager call of the Traveller left the process {span(growth[4], 'MiB', 1)} larger at T=4 and "
            f"{span(growth[1000], 'MiB', 1)} at T=1000 (resident size after `gc.collect()`, "
            f"{runs_count(len(measured))} of `benchmarks/call_overhead.py`)")


@figure("calls.live")
def _calls_live() -> str:
    with_live = [run for run in runs(CALLS) if run.get("live")]
    ticks = [{r["arm"]: r for r in run["live"]} for run in with_live]
    jsr, torch = ([t[arm]["median_us"] for t in ticks] for arm in ("jsr.jit step", "torch step"))
    ratios = [b / a for a, b in zip(jsr, torch)]
    return (f"{us(jsr[-1])} per tick against {us(torch[-1])} for `torch_ref.Traveller.step` on the same weights "
            f"(the newest of {runs_count(len(ticks))}; torch's over jsr's: {span(ratios, digits=1)}x), positions "
            f"equal to {max(t['jsr.jit step']['max_abs_diff_jsr_vs_torch'] for t in ticks):.0e}")


@figure("calls.state_argument")
def _calls_state_argument() -> str:
    parts = [run["pieces"] for run in runs(CALLS)]
    flatten = [p["flatten_split_state_us"] for p in parts]
    read = [p["read_variable_values_us"] for p in parts]
    return (f"{span(flatten, 'µs', 1)} to flatten the Traveller's `nnx.split` State, against {span(read, 'µs', 1)} "
            f"for `jsr.jit`'s read of the same arrays into a flat list (min of 5 timeit runs each, over "
            f"{runs_count(len(parts))} of `benchmarks/call_overhead.py`)")


@figure("loop.calls")
def _loop_calls() -> str:
    rows = call_runs()[-1]
    steps = sorted({t for _, t in rows})

    def per_call(value: float) -> str:
        return f"{value / 1e3:.3g} ms" if value >= 1e3 else us(value)

    lines = ["| per call, Traveller B=1 | " + " | ".join(f"T={t}" for t in steps) + " | first call, T=4 |",
             "|---|" + "---:|" * (len(steps) + 1)]
    for arm, label in (("eager", "eager `model(x)`: traced and compiled on every call"),
                       ("bare jax.jit", "a bare `jax.jit` over `nnx.split` state"),
                       ("jsr.jit", "`fast(x)`, `fast = jsr.jit(model)` made once"),
                       ("torch seed loop", "for scale: the torch seed loop")):
        cells = [per_call(rows[arm, t]["median_us"]) for t in steps]
        first = "no compile" if arm.startswith("torch") else f"{rows[arm, steps[0]]['first_call_s']:.2f} s"
        lines.append(f"| {label} | {' | '.join(cells)} | {first} |")
    return "\n".join(lines)


@figure("loop.shapes")
def _loop_shapes() -> str:
    scan = [bench_row(MAIN, "jax-scan-auto", "forward", 1, t)["first_call_s"] for t in (100, 1000, 10000)]
    loop = [bench_row(MAIN, "jax-jit-loop", "forward", 1, t)["first_call_s"] for t in (10, 25, 50)]
    return (f"the jitted scan's first call, compile included, takes {min(scan):.2f}-{max(scan):.2f} s at "
            f"T = 100, 1,000 and 10,000; a Python `for` loop under `jax.jit` takes {loop[0]:.2f} s at T=10, "
            f"{loop[1]:.2f} s at T=25 and {loop[2]:.2f} s at T=50")


HISTORY = "bench-history-cpu-2core.json"


@figure("bench.headline_history")
def _bench_headline_history() -> str:
    history = runs(HISTORY)
    seed, scan = [r["seed_us"] for r in history], [r["scan_us"] for r in history]
    ratios = [a / b for a, b in zip(seed, scan)]
    by_commit: dict = {}
    for r in history:
        by_commit.setdefault(r["commit"], []).append(r["scan_us"])
    same = "; ".join(f"{c}: {' and '.join(us(t) for t in ts)}" for c, ts in by_commit.items() if len(ts) > 1)
    return (f"over the {len(history)} committed runs of the default and `--peers` presets "
            f"({history[0]['started'][:10]} to {history[-1]['started'][:10]}, the library changing between some) "
            f"the seed loop took {min(seed):.0f}-{max(seed):.0f} µs per "
            f"step and the scan {us(min(scan))} to {us(max(scan))}: {min(ratios):.1f}x to {max(ratios):.1f}x, "
            f"median {statistics.median(ratios):.1f}x. Runs committed together (the same code): {same}")


BANDWIDTH = "weight-bandwidth-cpu-2core.json"
L2_BYTES = 2**20  # this machine's L2 cache per core (`lscpu`), the size docs/tuning_cpu.md names


@figure("tuning.bandwidth")
def _tuning_bandwidth() -> str:
    rows = runs(BANDWIDTH)[-1]["rows"]
    return "; ".join(f"H={r['H']}: {us(r['us_per_step'])} per step for {r['weight_bytes'] / 1024:,.0f} KiB of "
                     f"weights, {r['gb_per_s']:.0f} GB/s" for r in rows)


BANDWIDTH_XLA_DEFAULTS_RUN = 0  # the file's first run: before xla_flags.py set the GEMV tiling and vector width


@figure("tuning.bandwidth_before")
def _tuning_bandwidth_before() -> str:
    rows = [r for r in runs(BANDWIDTH)[BANDWIDTH_XLA_DEFAULTS_RUN]["rows"] if r["weight_bytes"] < L2_BYTES]  # in L2
    return (f"{span([r['gb_per_s'] for r in rows], 'GB/s', 0)} for H = {rows[0]['H']} to {rows[-1]['H']}, while "
            f"the bytes grow {rows[-1]['weight_bytes'] / rows[0]['weight_bytes']:.0f}-fold")


@figure("tuning.bandwidth_h64")
def _tuning_bandwidth_h64() -> str:
    now, before = ({r["H"]: r for r in runs(BANDWIDTH)[i]["rows"]}[64] for i in (-1, BANDWIDTH_XLA_DEFAULTS_RUN))
    return (f"{us(now['us_per_step'])} per step, {now['gb_per_s']:.0f} GB/s ({before['gb_per_s']:.0f} GB/s with "
            f"XLA's own matrix-vector settings)")


def _arms_line(arm: str, reference: str) -> str:
    """A line of `tune_scan.py`'s `run_compile_arms` (opt-level, compile-options): its `arm` and the name of the arm
    its outputs are compared with."""
    return (r"(?P<config>\w+\s+B=\s*\d+\s+T=\s*\d+\s+\w+)\s+" + arm + r"\s+compile\s+(?P<compile>[\d. ]+?) s\s+"
            r"warm\s+(?P<warm>[\d.]+) us/step\s+max \|out - " + reference + r"'s\| (?P<diff>\S+)")


def rounds_median(text: str) -> float:
    """The median of a log's per-round figures ("0.84  0.74  0.75")."""
    return statistics.median(float(v) for v in text.split())


TUNING_LOGS = {
    "flag": ("xla-flag-cpu-2core.txt",
             r"(?P<config>\S+)\s+(?:True|False)\s+(?P<fwd0>[\d.]+) ->\s+(?P<fwd1>[\d.]+) us\s+"
             r"(?P<train0>[\d.]+) ->\s+(?P<train1>[\d.]+) us"),
    "unroll": ("unroll-cpu-2core.txt",
               r"(?P<config>\S+)\s+T=\s*\d+ unroll=\s*(?P<unroll>\d+)\s+forward\s+(?P<fwd>[\d.]+) us/step\s+"
               r"train\s+(?P<train>[\d.]+) us/step\s+(?:first call|forward compile)\s+(?P<first>[\d.]+) s"),
    "unroll-layers": ("unroll-layers-cpu-2core.txt",
                      r"(?P<config>\w+ I=\d+ H=\d+ L=\d+ B=\d+)\s+T=\s*(?P<T>\d+) unroll=(?P<unroll>\d+)\s+"
                      r"forward\s+(?P<fwd>[\d.]+) us/step\s+train\s+(?P<train>[\d.]+) us/step\s+"
                      r"compile forward\s+(?P<cfwd>[\d.]+) s\s+train\s+(?P<ctrain>[\d.]+) s"),
    "hoist": ("hoist-cpu-2core.txt",
              r"(?P<config>\S+)\s+T=\s*\d+\s+forward\s+(?P<fwd0>[\d.]+) ->\s+(?P<fwd1>[\d.]+) us/step\s+"
              r"train\s+(?P<train0>[\d.]+) ->\s+(?P<train1>[\d.]+)"),
    "opt-level": ("opt-level-cpu-2core.txt", _arms_line(r"-O(?P<level>\d)", "O3")),
    "compile-options": ("compile-options-cpu-2core.txt", _arms_line(r"(?P<arm>[\w-]+)", "library")),
    "gemv": ("gemv-cpu-2core.txt",
             r"(?P<config>[\w-]+ B=\d+ T=\d+ \w+)\s+tiling (?P<tiling>\d+) width (?P<width>\d+)\s+"
             r"compile\s+(?P<compile>[\d. ]+?) s\s+warm\s+(?P<warm>[\d.]+) us/step \(rounds (?P<rounds>[^)]*)\)\s+"
             r"max \|out - default's\| (?P<diff>\S+)"),
    "hoist-layers": ("hoist-layers-cpu-2core.txt",
                     r"(?P<config>.+?)\s+T=\s*\d+.*?forward\s+(?P<fwd0>[\d.]+) ->\s+(?P<fwd1>[\d.]+) us/step"),
}


def tuning_log(kind: str) -> list[dict]:
    """The measured lines of a `benchmarks/tune_scan.py` log (comment lines skipped), as dicts of strings."""
    file, pattern = TUNING_LOGS[kind]
    rows = [re.match(pattern, line) for line in (RESULTS / file).read_text().splitlines() if not line.startswith("#")]
    return [{**m.groupdict(), "config": " ".join(m["config"].split())} for m in rows if m]


def log_us(value: str) -> str:
    return us(float(value)).replace(" µs", "")


@figure("tuning.flag")
def _tuning_flag() -> str:
    b1 = {r["config"]: r for r in tuning_log("flag")}["1x64"]
    return (f"forward {log_us(b1['fwd0'])} -> {log_us(b1['fwd1'])} µs per step, train step "
            f"{log_us(b1['train0'])} -> {log_us(b1['train1'])} µs")


@figure("tuning.unroll")
def _tuning_unroll() -> str:
    # The log's latest sweep wins: a later section repeats every (config, unroll) of an earlier one.
    rows = {(r["config"], int(r["unroll"])): r for r in tuning_log("unroll")}

    def train(config: str, unrolls: tuple) -> str:
        return ", ".join(f"{log_us(rows[config, u]['train'])} at {u}" for u in unrolls)

    b1 = [float(rows["1x64", u]["fwd"]) for u in (1, 2, 4, 8)]
    return (f"at B=1 the forward pass is the same at unroll 1 to 8 ({min(b1):.3g}-{max(b1):.3g} µs per step) and "
            f"the train step is fastest at 2 ({train('1x64', (1, 2, 4))} µs per step); at B=64 the train step is "
            f"fastest at 1 ({train('64x64', (1, 2, 4, 16))}); and unroll 16 takes {rows['1x64', 16]['first']} s "
            f"to compile at B=1 instead of {rows['1x64', 1]['first']} s")


@figure("tuning.unroll_others")
def _tuning_unroll_others() -> str:
    rows = {(r["config"], int(r["unroll"])): r for r in tuning_log("unroll")}

    def cell(config: str, mode: str) -> str:
        return ", ".join(f"{log_us(rows[config, u][mode])} at {u}" for u in (1, 2, 4, 8))

    return (f"B=1, H=256 (a loop too large for one kernel): train {cell('1x256', 'train')} µs per step; "
            f"B=8: train {cell('8x64', 'train')}; B=64, H=256: train {cell('64x256', 'train')}; B=512, T=100: "
            f"forward {cell('512x64', 'fwd')}, train {cell('512x64', 'train')}")


@figure("tuning.unroll_layers")
def _tuning_unroll_layers() -> str:
    rows = {(r["config"], int(r["T"]), int(r["unroll"])): r for r in tuning_log("unroll-layers")}
    cases = sorted({(c, t) for c, t, _ in rows})
    train = [float(rows[c, t, 1]["train"]) / float(rows[c, t, 2]["train"]) for c, t in cases]
    forward = [float(rows[c, t, 1]["fwd"]) / float(rows[c, t, 2]["fwd"]) for c, t in cases]
    def compiles(key: str) -> str:
        return ratio_span([float(rows[c, t, 2][key]) / float(rows[c, t, 1][key]) for c, t in cases])

    return (f"over {len(cases)} cases (jsr.LSTM and jsr.GRU at H=64 with 2 layers, T=100 and 1,000, and at H=256 "
            f"with one layer), unroll 2 trains {ratio_span(train)} as fast as unroll 1, its train step taking "
            f"{compiles('ctrain')} as long to compile, and runs forward {ratio_span(forward)} as fast, its forward pass "
            f"taking {compiles('cfwd')} as long to compile")


@figure("tuning.hoist")
def _tuning_hoist() -> str:
    rows = {r["config"]: r for r in tuning_log("hoist")}
    return ", ".join(f"{label} {log_us(rows[c]['fwd0'])} -> {log_us(rows[c]['fwd1'])}"
                     for c, label in (("1x64", "B=1"), ("64x64", "B=64"), ("1024x64", "B=1024 (T=100)")))


@figure("tuning.hoist_gain")
def _tuning_hoist_gain() -> str:
    """Inside the step against hoisted, forward, over every shape of both hoisting logs."""
    ratios = [float(r["fwd0"]) / float(r["fwd1"]) for kind in ("hoist", "hoist-layers") for r in tuning_log(kind)]
    return f"{ratio_span(ratios)} as fast forward over the {len(ratios)} shapes measured"


@figure("tuning.hoist_layers")
def _tuning_hoist_layers() -> str:
    rows = {r["config"]: r for r in tuning_log("hoist-layers")}
    return "; ".join(f"{label} {log_us(rows[c]['fwd0'])} -> {log_us(rows[c]['fwd1'])}" for c, label in (
        ("GRU I=40 H=256 L=1 B=128", "the VAE's encoder (GRU, one-hot inputs, B=128, T=60)"),
        ("LSTM I=64 H=64 L=1 B=64", "an LSTM at B=64"),
        ("GRU I=256 H=256 L=2 B=128", "a 2-layer GRU with 256 inputs per row, where the hoisted matmul does "
                                      "real arithmetic")))


SLOWER = 1.2  # a warm-time ratio above this is a real slowdown, not this host's noise (the arms' spread: ~5%)


@figure("tuning.compile_options")
def _tuning_compile_options() -> str:
    rows = {(r["config"], r["arm"]): r for r in tuning_log("compile-options")}
    configs = sorted({c for c, _ in rows})

    def ratios(arm: str, key: str) -> list[float]:
        if key == "compile":
            return [rounds_median(rows[c, arm][key]) / rounds_median(rows[c, "library"][key]) for c in configs]
        return [float(rows[c, arm][key]) / float(rows[c, "library"][key]) for c in configs]

    def label(config: str) -> str:  # "traveller B= 64 T= 1000 forward" -> "Traveller B=64 T=1000 forward"
        return config.replace("= ", "=").replace("traveller", "Traveller").replace("vae", "VAE")

    fe = dict(zip(configs, ratios("no-fusion-emitters", "warm")))
    slow = [c for c in configs if fe[c] > SLOWER]
    named = ", ".join(f"{label(c)} {fe[c]:.1f}x" for c in slow)
    rest = [fe[c] for c in configs if c not in slow]
    return (f"without the fusion emitters the {len(configs)} cases compile in {ratio_span(ratios('no-fusion-emitters', 'compile'))} "
            f"the library's time (median of 3) and {len(rest)} of them run in {ratio_span(rest)} its time, but {named}; "
            f"LLVM's expensive passes off: compile "
            f"{ratio_span(ratios('no-expensive-passes', 'compile'))}, run {ratio_span(ratios('no-expensive-passes', 'warm'))}; "
            f"codegen in one part: compile {ratio_span(ratios('codegen-split-1', 'compile'))}, run "
            f"{ratio_span(ratios('codegen-split-1', 'warm'))}")


@figure("tuning.opt_level")
def _tuning_opt_level() -> str:
    rows = {(r["config"], int(r["level"])): r for r in tuning_log("opt-level")}

    def compile_s(config: str, level: int) -> float:
        return rounds_median(rows[config, level]["compile"])

    def pair(config: str, label: str) -> str:
        return f"{label} {compile_s(config, 3):.2f} -> {compile_s(config, 1):.2f} s"

    warm = [float(rows[c, 1]["warm"]) / float(rows[c, 3]["warm"]) for c, level in rows if level == 3]
    slow = [float(rows[c, 0]["warm"]) / float(rows[c, 3]["warm"]) for c, level in rows if level == 3]
    diff = max(float(rows[c, 1]["diff"]) for c, level in rows if level == 1)
    return (f"compile (median of 3) {pair('traveller B= 1 T= 1000 forward', 'Traveller B=1 forward')}, "
            f"{pair('traveller B= 1 T= 1000 train', 'train step')}, "
            f"{pair('traveller B= 64 T= 1000 train', 'B=64 train step')}, "
            f"{pair('vae B= 128 T= 60 train', 'VAE train step')}; the warm calls at -O1 take {min(warm):.2f}-"
            f"{max(warm):.2f}x -O3's time over the log's {len(warm)} cases, with outputs within {diff:.0e} of -O3's "
            f"(float rounding); -O0 would run {min(slow):.1f}-{max(slow):.1f}x slower")


@cache
def library_gemv() -> tuple[int, int]:
    """The library's (tiling, vector width) from jax_scan_rnn/xla_flags.py, loaded as a file (no JAX import)."""
    spec = importlib.util.spec_from_file_location("xla_flags_file", ROOT / "jax_scan_rnn" / "xla_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GEMV_TILING, module.CPU_COMPILER_OPTIONS["xla_cpu_prefer_vector_width"]


def gemv_rows() -> dict:
    """The gemv log's lines by (case, tiling, width)."""
    return {(r["config"], int(r["tiling"]), int(r["width"])): r for r in tuning_log("gemv")}


@figure("tuning.gemv")
def _tuning_gemv() -> str:
    """XLA's defaults (tiling 8, width 256) -> the library's (`xla_flags.GEMV_TILING`, `CPU_COMPILER_OPTIONS`)."""
    rows = gemv_rows()

    def pair(config: str, label: str) -> str:
        return f"{label} {log_us(rows[config, 8, 256]['warm'])} -> {log_us(rows[(config, *library_gemv())]['warm'])}"

    b1 = "traveller B=1 T=1000 forward"
    vae_rounds = [float(v) for key in rows if key[0] == "vae B=128 T=60 train" for v in rows[key]["rounds"].split()]
    tiling_diff = max(float(r["diff"]) for (c, t, w), r in rows.items() if w == 256)
    width_diff = max(float(r["diff"]) for r in rows.values())
    tiling, width = library_gemv()
    return (f"{pair(b1, 'Traveller B=1 T=1000 forward')} µs per step (the tiling alone "
            f"{log_us(rows[b1, tiling, 256]['warm'])}, the width alone {log_us(rows[b1, 8, width]['warm'])}), "
            f"{pair('traveller B=1 T=1000 train', 'train step')}; "
            f"{pair('traveller-h128 B=1 T=1000 forward', 'at H=128')}, but "
            f"{pair('traveller-h32 B=1 T=1000 forward', 'at H=32')} (tiles of 2: "
            f"{log_us(rows['traveller-h32 B=1 T=1000 forward', 2, 512]['warm'])}); "
            f"{pair('traveller B=64 T=1000 forward', 'B=64 forward')}, "
            f"{pair('traveller B=64 T=1000 train', 'train step')}; "
            f"{pair('vae B=128 T=60 greedy', 'VAE greedy generation')}, "
            f"{pair('vae B=128 T=60 train', 'train step')} (its rounds spread over {min(vae_rounds):,.0f}-"
            f"{max(vae_rounds):,.0f}); the tiling leaves every output "
            f"{'bit for bit as it was' if tiling_diff == 0 else f'within {tiling_diff:.0e}'}, the width moves "
            f"them by float rounding (at most {width_diff:.1e})")


@figure("tuning.gemv_short")
def _tuning_gemv_short() -> str:
    rows = gemv_rows()
    return " and ".join(f"{label} {log_us(rows[c, 8, 256]['warm'])} -> {log_us(rows[(c, *library_gemv())]['warm'])} µs per step"
                        for c, label in (("traveller B=1 T=1000 forward", "forward"),
                                         ("traveller B=1 T=1000 train", "train step")))


@figure("remat.dropout")
def _remat_dropout() -> str:
    text = (RESULTS / "remat-dropout-cpu-2core.txt").read_text()
    pattern = r"T=\s*16000 .*?no remat\s+([\d.]+),\s+remat, masks per step\s+([\d.]+),\s+remat, \[T\] mask array\s+([\d.]+)"
    plain, per_step, array = (float(v) for v in re.search(pattern, text).groups())
    return (f"T=16,000, B=64, 3 layers: {per_step:,.0f} MiB, against {array:,.0f} MiB with a `[T]` mask array and "
            f"{plain:,.0f} MiB without remat")


@figure("tuning.remat_time")
def _tuning_remat_time() -> str:
    remat, plain = (bench_row(MAIN, m, "train", 1, 10000)["per_step_us"] for m in ("jax-scan-remat", "jax-scan-u1"))
    return f"{us(remat)} per train step against {us(plain)} without (both at unroll 1)"


@figure("tuning.compile_loop")
def _tuning_compile_loop() -> str:
    loop = [bench_row(MAIN, "torch-compile-loop", "forward", 1, t) for t in (10, 25, 50)]
    scan = [bench_row(MAIN, "torch-compile-scan", "forward", 1, t)["first_call_s"] for t in (100, 1000, 10000)]
    return (f"its first call takes {loop[0]['first_call_s']:.1f} s at T=10, {loop[1]['first_call_s']:.1f} s at T=25 "
            f"and {loop[2]['first_call_s']:.1f} s at T=50 (then {us(loop[2]['per_step_us'])} per step), where "
            f"`torch.compile` of the scan takes {min(scan):.1f}-{max(scan):.1f} s at T = 100 to 10,000")


@figure("tuning.run")
def _tuning_run() -> str:
    data = load(MAIN)
    threads = data["host"]["torch_threads"]
    calib = ", ".join(f"{float(s) * 1e3:.1f} ms on {n}" for n, s in threads["calibration_s"].items())
    return (f"{data['wall_s']:.0f} s wall, load average {data['load_average']['start']} at the start and "
            f"{data['load_average']['end']} at the end; torch ran on {threads['chosen']} thread(s) "
            f"(calibration: {calib})")


# ------------------------------------------------------------------------------ one NVIDIA H200 (benchmarks/gpu.sh)

# benchmarks/gpu.sh on the lent H200, two sessions of 15 minutes. Session 1: run 1 measured B=1, the user commands
# and the sweeps at B=1; run 2 (parity pinned to float32 matmuls) B=64, the VAE rows, parity and the sweeps at
# B=1024. Session 2 (today's code: unroll 4 on GPUs): run 3 the grid at B=64 and 1024, generation at B=10,000 and
# `jax-scan-rnn check`; run 4 parity and the two user commands; run 5 the VAE rows again, with a budget they fit.
GPU_B1, GPU_GRID = "gpu-h200-b1.json", "gpu-h200-b64-b1024.json"
GPU_VAE, GPU_GEN = "gpu-h200-vae.json", "gpu-h200-gen10k.json"
GPU_LOG1, GPU_LOG2, GPU_LOG3, GPU_LOG4 = (f"gpu-h200-run{n}.log" for n in (1, 2, 3, 4))


def gpu_log(name: str, pattern: str) -> re.Match:
    """The first line of a committed device log that matches `pattern` (what a step printed, not a JSON)."""
    match = re.search(pattern, (RESULTS / name).read_text(), re.M)
    if match is None:
        raise KeyError(f"{name}: no line matches {pattern!r}")
    return match


@figure("gpu.machine")
def _gpu_machine() -> str:
    hosts = {(h["jax"], h["torch"], h["python"]) for h in (load(f)["host"] for f in (GPU_B1, GPU_GRID, GPU_VAE, GPU_GEN))}
    assert len(hosts) == 1, hosts  # one software stack in every file quoted
    host = load(GPU_B1)["host"]
    return f"one NVIDIA H200, jax {host['jax']} (CUDA), torch {host['torch']}, Python {host['python']}"


def _vs(row: dict, other: dict) -> str:
    return f"{other['per_step_us'] / row['per_step_us']:.1f}x"


def _measured(file: str, method: str, mode: str, batch: int, steps: int) -> dict | None:
    """`bench_row`, or None where the run has the row but could not measure it (`_gpu_missing` says why)."""
    try:
        return bench_row(file, method, mode, batch, steps)
    except KeyError:
        return None


GPU_TRAVELLER_CELLS = ((GPU_B1, 1), (GPU_GRID, 64), (GPU_GRID, 1024))  # (file, batch), each forward and train
GPU_TRAVELLER_METHODS = ("torch-loop", "torch-cuda-graph", "jax-scan-u1", "jax-scan-u4", "limit-xla", "limit-torch")


@figure("gpu.traveller")
def _gpu_traveller() -> str:
    lines = ["| T=1000, µs per step | seed loop | torch loop as a CUDA graph | jsr `lax.scan`, unroll 1 | "
             "jsr, unroll 4 (today's \"auto\") | limit (no time dependency) |", "|---|---:|---:|---:|---:|---:|"]
    for file, batch in GPU_TRAVELLER_CELLS:
        for mode in ("forward", "train"):
            seed, graph, u1, u4, *limits = (_measured(file, m, mode, batch, 1000) for m in GPU_TRAVELLER_METHODS)
            limit = min(filter(None, limits), key=lambda r: r["per_step_us"])
            versus = [f"**{_vs(u4, graph)}** the graph"] if graph else []
            versus += [f"{_vs(u4, seed)} the seed"] if seed else []
            cell = lambda row: us(row["per_step_us"]) if row else "n/a"
            lines.append(f"| {mode}, B={batch} | {cell(seed)} | {cell(graph)} | {cell(u1)} | {cell(u4)}"
                         + (f" ({', '.join(versus)})" if versus else "")
                         + f" | {cell(limit)} ({limit['method']}; jsr "
                         f"{u4['per_step_us'] / limit['per_step_us']:.3g}x it) |")
    return "\n".join(lines)


@figure("gpu.missing")
def _gpu_missing() -> str:
    gaps = [(r, load(file)["methods"][r["method"]]["label"]) for file, batch in GPU_TRAVELLER_CELLS
            for r in load(file)["rows"]
            if (r["B"], r["T"]) == (batch, 1000) and r["method"] in GPU_TRAVELLER_METHODS and r["status"] != "ok"]
    return "; ".join(f"{r['mode']} B={r['B']}, {label}: {r['reason']}" for r, label in gaps)


@figure("gpu.vae")
def _gpu_vae() -> str:
    def row(method: str, mode: str) -> dict:
        return bench_row(GPU_VAE, method, mode, 128, 60)

    ss = {k: row(f"vae-ss-{k}", "train") for k in ("jax", "torch-graph", "torch")}
    fw = {k: row(f"vae-ss-{k}", "forward") for k in ("jax", "torch-graph", "torch")}
    tf = {k: row(f"vae-tf-{k}", "train") for k in ("jax", "torch")}
    return (f"a scheduled-sampling train step (whole ELBO + Adam) {us(ss['jax']['per_step_us'])} per time step in JAX "
            f"against {us(ss['torch-graph']['per_step_us'])} for torch_ref's loop as a CUDA graph "
            f"(**{_vs(ss['jax'], ss['torch-graph'])}**) and {us(ss['torch']['per_step_us'])} eager "
            f"({_vs(ss['jax'], ss['torch'])}); its decoder alone {us(fw['jax']['per_step_us'])} against "
            f"{us(fw['torch-graph']['per_step_us'])} graphed ({_vs(fw['jax'], fw['torch-graph'])}) and "
            f"{us(fw['torch']['per_step_us'])} eager ({_vs(fw['jax'], fw['torch'])}); teacher forcing (the bound, "
            f"no feedback) {us(tf['jax']['per_step_us'])} in JAX, {us(tf['torch']['per_step_us'])} with torch's fused "
            f"`nn.GRU`")


@figure("gpu.generation")
def _gpu_generation() -> str:
    gen = {k: bench_row(GPU_GEN, f"vae-greedy-{k}", "forward", 10000, 60) for k in ("jax", "torch-graph", "torch")}
    return (f"greedy generation of 10,000 sequences at once (B=10,000, T=60): {us(gen['jax']['per_step_us'])} per time "
            f"step in JAX, {gen['jax']['per_step_us'] * 60 / 1e3:.1f} ms for all 10,000 once compiled, against "
            f"{us(gen['torch-graph']['per_step_us'])} for torch_ref's generation loop as a CUDA graph "
            f"(**{_vs(gen['jax'], gen['torch-graph'])}**) and {us(gen['torch']['per_step_us'])} eager "
            f"({_vs(gen['jax'], gen['torch'])})")


@figure("gpu.compile")
def _gpu_compile() -> str:
    fwd, train = (bench_row(GPU_B1, "jax-scan-u4", m, 1, 1000)["compile_s"] for m in ("forward", "train"))
    graph = bench_row(GPU_B1, "torch-cuda-graph", "train", 1, 1000)["compile_s"]
    big = bench_row(GPU_GRID, "jax-scan-u4", "train", 1024, 1000)["compile_s"]
    vae = bench_row(GPU_VAE, "vae-ss-jax", "train", 128, 60)["compile_s"]
    gen = bench_row(GPU_GEN, "vae-greedy-jax", "forward", 10000, 60)["compile_s"]
    return (f"the Traveller's forward pass {fwd:.2f} s and train step {train:.2f} s at B=1, T=1000 (unroll 4; torch's "
            f"graphed train step: {graph:.1f} s to capture), its train step at B=1024 {big:.1f} s; the VAE's "
            f"scheduled-sampling train step {vae:.1f} s, its generation at B=10,000 {gen:.1f} s")


@figure("gpu.compile_vs_cpu")
def _gpu_compile_vs_cpu() -> str:
    """jsr's compile seconds on the H200 against the 2-core CPU's, where both measured the same row."""
    pairs = (("the VAE's scheduled-sampling train step (B=128, T=60)", GPU_VAE, VAE_TRAIN, "vae-ss-jax", "train", 128, 60),
             ("its greedy generation at B=10,000", GPU_GEN, VAE_GEN, "vae-greedy-jax", "forward", 10000, 60))
    cells = [f"{what} {bench_row(gpu, m, mode, b, t)['compile_s']:.1f} s on the H200 against "
             f"{bench_row(cpu, m, mode, b, t)['compile_s']:.2f} s on the CPU" for what, gpu, cpu, m, mode, b, t in pairs]
    trav = [f"{bench_row(file, 'jax-scan-u4', 'train', batch, 1000)['compile_s']:.1f} s at B={batch}"
            for file, batch in GPU_TRAVELLER_CELLS]
    return "; ".join(cells) + "; the Traveller's train step (T=1000) " + ", ".join(trav) + " on the GPU"


@figure("gpu.commands")
def _gpu_commands() -> str:
    trav, vae = (runs(f"train-{k}-gpu-h200.json")[-1] for k in ("traveller", "vae"))
    cpu_trav = runs(TRAVELLER)[-1]
    greedy = gpu_log(GPU_LOG4, r"greedy generation: (\d+) samples in ([\d.]+) s")
    quality = gpu_log(GPU_LOG4, r"greedy generation: validity ([\d.]+), uniqueness ([\d.]+)")
    samples = vae["report"]["samples"]
    return (f"`jax-scan-rnn train traveller` {trav['wall_s']:.1f} s ({cpu_trav['wall_s']:.1f} s on the 2-core CPU), "
            f"{trav['report']['learned_over_optimal']:.1%} of the optimal policy; `jax-scan-rnn train vae` "
            f"{vae['wall_s']:.1f} s for its 1,800 updates, {samples['validity']:.1%} of its prior samples valid, "
            f"{samples['uniqueness']:.1%} unique; `sample vae --greedy -n {int(greedy.group(1))}` "
            f"{float(greedy.group(2)):.1f} s "
            f"(start-up and compilation included), {float(quality.group(1)):.1%} valid but {float(quality.group(2)):.1%} "
            f"unique: greedy decoding from this short run's prior collapses onto a few molecules")


@figure("gpu.parity")
def _gpu_parity() -> str:
    passed = gpu_log(GPU_LOG2, r"^(\d+) passed.* in ([\d.]+)s")
    later = gpu_log(GPU_LOG4, r"^(\d+) passed.* in ([\d.]+)s")
    failed = gpu_log(GPU_LOG1, r"^(\d+) failed, (\d+) passed")
    check = gpu_log(GPU_LOG3, r"^parity self-check: (\w+)")
    diffs = [float(d) for d in re.findall(r"^\w+ \d+ +\d+ +([\d.e+-]+) ", (RESULTS / GPU_LOG3).read_text(), re.M)]
    return (f"{passed.group(1)} of the 192 parity tests passed in float32 and float64, none failed (the last "
            f"{192 - int(passed.group(1))} were still running at the step's limit; in a later run {later.group(1)} "
            f"passed before it, none failed); before every parity test pinned float32 matmuls, {failed.group(1)} "
            f"failed: JAX's default float32 matmul on this GPU is TF32. `jax-scan-rnn check` on the GPU: "
            f"{check.group(1)}, {len(diffs)} models' outputs within {max(diffs):.1e} of torch's")


GPU_SWEEP_CONFIGS = (("1x64", "B=1, T=1000"), ("1024x64", "B=1024, T=100"))  # gpu.sh's SWEEP_CONFIGS, as run


def _sweep(file: str, key: str, arms: tuple, cell: Callable[[dict, str, str], str],
           extra: Callable[[dict, str], str] = lambda rows, config: "") -> str:
    """Each GPU sweep configuration's line, "B=1, T=1000: forward <cell>, train <cell> µs per step<extra>", joined:
    `cell(rows, config, mode)` renders a mode's arms, `rows` keyed by (config, arm)."""
    rows = {(r["config"], r[key]): r for r in load(file) if r[key] in arms}
    return "; ".join(f"{label}: forward {cell(rows, config, 'forward')}, train {cell(rows, config, 'train')} µs per "
                     f"step{extra(rows, config)}" for config, label in GPU_SWEEP_CONFIGS)


@figure("gpu.unroll")
def _gpu_unroll() -> str:
    shown = (1, 4, 16)
    return _sweep("unroll-gpu-h200.json", "unroll", shown,
                  lambda rows, config, mode: ", ".join(f"{rows[config, u][mode + '_us']:.3g} at {u}" for u in shown),
                  lambda rows, config: ", forward compile " + ", ".join(
                      f"{rows[config, u]['compile_s']:.2f} s at {u}" for u in shown))


@figure("gpu.unroll_rows")
def _gpu_unroll_rows() -> str:
    """jax-scan-u1 against -u4 in the benchmark's T=1000 rows, where both were measured."""
    cells = []
    for file, batch in GPU_TRAVELLER_CELLS:
        for mode in ("forward", "train"):
            u1, u4 = (_measured(file, f"jax-scan-u{u}", mode, batch, 1000) for u in (1, 4))
            if u1 and u4:
                cells.append(f"{mode} B={batch} {u1['per_step_us']:.3g} at 1, {u4['per_step_us']:.3g} at 4")
    return "; ".join(cells) + " µs per step"


@figure("gpu.hoist")
def _gpu_hoist() -> str:
    return _sweep("hoist-gpu-h200.json", "hoist_inputs", (True, False),
                  lambda rows, config, mode: f"{rows[config, True][mode + '_us']:.3g} hoisted, "
                                             f"{rows[config, False][mode + '_us']:.3g} inside")


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
