"""Per-call wall time of five ways to call an NNX model (eager, nnx.jit, nnx.cached_partial, bare jax.jit, jsr.jit),
next to the seed's eager PyTorch loop on the same weights, and the time of one live tick (`step`) in each.

    python benchmarks/call_overhead.py                       # T = 4 and 1000, ~1 minute on a 2-core CPU
    python benchmarks/call_overhead.py --seq-lens 4 --rounds 5
    python benchmarks/call_overhead.py --out benchmarks/results/call-overhead-cpu-2core.txt  # + the run appended to .json

The model is `jsr.Traveller(8, 64, 2, rngs=nnx.Rngs(0))` in eval mode, called as `model(x)` on
x [1, T, 8] float32; its output is treated as any pytree. The arms:

    eager          model(x): every lax.scan traced and compiled again on each call
    nnx.jit        nnx.jit(lambda m, x: m(x))(model, x): the module graph split and merged on each call
    cached_partial nnx.cached_partial(that, model)(x): the graph traversal cached, the Variables still synced
    bare jax.jit   jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, x), state = nnx.split(model)[1]
    jsr.jit        jsr.jit(model)(x)
    torch seed loop torch_ref.Traveller(...)(x, method="loop") on the same weights, 1 thread (the question's
                   code: one nn.LSTM call per step; B=1 ops are too small to split over threads)

The live arms time one tick of live use, the next bar u_t [1, 8] -> positions [1, 2] with the returned state
fed to the next call, 200 ticks per round, interleaved as the others:

    jsr.jit step   fast.step(state, u_t), fast = jsr.jit(model)
    torch step     torch_ref.Traveller.step(state, u_t) on the same weights, 1 thread, no_grad

Each figure is the median over all calls of the wall time of `jax.block_until_ready(arm())`, after two
warm-up calls; the arms take turns in `--rounds` rounds (A B C D E A B C D E ...), so that a drift in the
machine's speed hits them alike, and the table also gives the range of the per-round medians. Each round
makes `--calls` calls of each compiled arm and one eager call (eager costs a compile per call). "x bare"
is an arm's median over the bare jax.jit median at the same T, the overhead `jsr.jit` is held to. Around each
timed eager call the process's resident size is read (after `gc.collect()`): what it grew by, per call, is what
JAX's caches keep of the programs eager calls compile (the other arms' programs are compiled in the warm-up).
Results back the figures quoted in the README and docs/scan_vs_loop.md ("Calling the compiled loop").
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
import warnings

from timed_run import append_run, results_file, tree_rss_mib  # this folder's script: the script's own directory is on sys.path

from jax_scan_rnn.cli import POSITIVE_INT, positive_int_list  # the CLI's option checks (no JAX import)

ARMS = ("eager", "nnx.jit", "cached_partial", "bare jax.jit", "jsr.jit", "torch seed loop")


def _models():
    """The arms' models on the same weights: (jsr.Traveller(8, 64, 2) in eval mode, jsr.jit of it, the
    torch_ref.Traveller, with torch on 1 thread)."""
    import torch
    from flax import nnx

    import jax_scan_rnn as jsr
    import torch_ref

    model = jsr.Traveller(8, 64, 2, rngs=nnx.Rngs(0))
    model.eval()
    torch.set_num_threads(1)
    seed_model = torch_ref.Traveller(8, 64, 2, 0.0).eval()
    seed_model.load_state_dict({k: torch.from_numpy(v) for k, v in jsr.torch_state_dict(model).items()})
    return model, jsr.jit(model), seed_model


def _arms(steps: int) -> dict:
    """{arm name: zero-argument call} for one T, all on the same model and input."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx

    import jax_scan_rnn as jsr

    model, fast, seed_model = _models()
    x = jax.random.normal(jax.random.key(1), (1, steps, 8), jnp.float32)

    with nnx.set_graph_mode(True), nnx.set_graph_updates(True):
        graph_jit = nnx.jit(lambda m, x: m(x), graph=True, graph_updates=True)
        cached = nnx.cached_partial(graph_jit, model)
    graphdef, state = nnx.split(model)
    bare = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    x_torch = torch.from_numpy(np.array(x))  # a writable copy: torch warns on a read-only view

    def seed_loop():
        with torch.no_grad():
            return seed_model(x_torch, method="loop")[0].numpy()

    def eager():
        with warnings.catch_warnings():  # timed on purpose: the arm jsr.EagerCallWarning warns of
            warnings.simplefilter("ignore", jsr.EagerCallWarning)
            return model(x)

    return {
        "eager": eager,
        "nnx.jit": lambda: graph_jit(model, x),
        "cached_partial": lambda: cached(x),
        "bare jax.jit": lambda: bare(state, x),
        "jsr.jit": lambda: fast(x),
        "torch seed loop": seed_loop,
    }


def _live_arms() -> dict:
    """{arm: zero-argument call} of one live tick: the next bar u_t [1, 8] -> positions [1, 2], the returned state
    fed to the next call, as a live user runs the model (`fast.step`, torch_ref's `step`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    model, fast, seed_model = _models()
    u = jax.random.normal(jax.random.key(1), (1, 8), jnp.float32)
    u_torch = torch.from_numpy(np.array(u))
    state = {"jsr.jit step": model.initial_state(1), "torch step": None}

    def jsr_tick():
        positions, state["jsr.jit step"] = fast.step(state["jsr.jit step"], u)
        return positions

    def torch_tick():
        with torch.no_grad():
            positions, state["torch step"] = seed_model.step(state["torch step"], u_torch)
        return positions.numpy()

    return {"jsr.jit step": jsr_tick, "torch step": torch_tick}


def live(rounds: int, calls: int) -> list[dict]:
    """One row per live arm: median us per tick over all ticks (arms interleaved in rounds), the round medians'
    range, the first call, and the positions' largest difference after the same ticks (they run in lockstep)."""
    import jax
    import numpy as np

    arms = _live_arms()
    first, outputs, samples = {}, {}, {name: [] for name in arms}
    for name, fn in arms.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        first[name] = time.perf_counter() - start
    for _ in range(rounds):
        for name, fn in arms.items():
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                outputs[name] = np.asarray(jax.block_until_ready(fn()))
                times.append(time.perf_counter() - start)
            samples[name].append(times)
    diff = float(np.max(np.abs(outputs["jsr.jit step"] - outputs["torch step"])))
    return [{"arm": name, "median_us": float(np.median([t for r in samples[name] for t in r])) * 1e6,
             "round_median_min_us": min(float(np.median(r)) * 1e6 for r in samples[name]),
             "round_median_max_us": max(float(np.median(r)) * 1e6 for r in samples[name]),
             "calls": rounds * calls, "first_call_s": first[name], "max_abs_diff_jsr_vs_torch": diff}
            for name in arms]


def _same_outputs(arms: dict) -> float:
    """Largest difference between any JAX arm's output and the bare jax.jit's (a sanity check of the setup; the
    torch loop rounds differently, ~1e-7, and is checked by the parity tests instead)."""
    import jax
    import numpy as np

    ref = jax.tree.leaves(arms["bare jax.jit"]())
    worst = 0.0
    for name, fn in arms.items():
        if name.startswith("torch"):
            continue
        for a, b in zip(jax.tree.leaves(fn()), ref):
            worst = max(worst, float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
    return worst


def measure(steps: int, rounds: int, calls: int) -> list[dict]:
    """One row per arm at this T: median us per call over all calls, the round medians' range, the first call."""
    import jax
    import numpy as np

    arms = _arms(steps)
    first = {}
    for name, fn in arms.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        first[name] = time.perf_counter() - start
        jax.block_until_ready(fn())  # second warm-up: caches filled on every path
    max_diff = _same_outputs(arms)
    samples: dict[str, list[list[float]]] = {name: [] for name in arms}
    eager_growth = 0.0  # MiB the process's resident size grew across the eager calls below (the others' are warm)
    for _ in range(rounds):
        for name, fn in arms.items():
            times = []
            for _ in range(1 if name == "eager" else max(1, calls // 20) if name.startswith("torch") else calls):
                before = tree_rss_mib(os.getpid())[0] if name == "eager" else 0.0
                start = time.perf_counter()
                jax.block_until_ready(fn())
                times.append(time.perf_counter() - start)
                if name == "eager":
                    gc.collect()  # what stays is what JAX's caches keep, not garbage not yet collected
                    eager_growth += tree_rss_mib(os.getpid())[0] - before
            samples[name].append(times)
    rows = []
    for name in arms:
        flat = [t for r in samples[name] for t in r]
        per_round = [float(np.median(r)) * 1e6 for r in samples[name]]
        rows.append({"T": steps, "arm": name, "median_us": float(np.median(flat)) * 1e6,
                     "round_median_min_us": min(per_round), "round_median_max_us": max(per_round),
                     "calls": len(flat), "first_call_s": first[name], "max_abs_diff_vs_bare": max_diff,
                     "resident_growth_mib_per_call": eager_growth / len(flat) if name == "eager" else None})
    bare = next(r["median_us"] for r in rows if r["arm"] == "bare jax.jit")
    for row in rows:
        row["x_bare"] = row["median_us"] / bare
    return rows


def pieces(number: int = 20000) -> dict:
    """us per call of two pieces of the arms' Python work: flattening the `nnx.split` State that bare jax.jit is
    given (its leaves are Variables, pytree nodes flattened in Python), and jsr.jit's read of the Variables'
    current values (a flat list)."""
    import timeit

    import jax
    from flax import nnx

    import jax_scan_rnn as jsr

    model = jsr.Traveller(8, 64, 2, rngs=nnx.Rngs(0))
    _, state = nnx.split(model)
    variables = nnx.graph.flatten(model, with_paths=True, graph=True)[1].leaves
    return {
        "flatten_split_state_us": min(timeit.repeat(lambda: jax.tree_util.tree_flatten(state), number=number,
                                                    repeat=5)) / number * 1e6,
        "read_variable_values_us": min(timeit.repeat(lambda: [v.get_raw_value() for v in variables], number=number,
                                                     repeat=5)) / number * 1e6,
        "variables": len(variables),
    }


def machine() -> dict:
    import flax
    import jax
    import jaxlib
    import numpy as np

    import jax_scan_rnn as jsr
    from jax_scan_rnn.bench.machine import cpu_model

    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "python": platform.python_version(),
            "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__, "numpy": np.__version__,
            "xla_small_loop_setting": jsr.xla_flags.status(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "library_compiler_options": jsr.xla_flags.compiler_options(), "date": datetime.date.today().isoformat()}


def table(rows: list[dict], info: dict, command: str, parts: dict, live_rows: list[dict]) -> str:
    lines = [
        f"# {command}",
        f"# {info['cpu']}, {info['cpus']} CPUs, backend {info['backend']}; python {info['python']}, jax {info['jax']} "
        f"(jaxlib {info['jaxlib']}), flax {info['flax']}, numpy {info['numpy']}; XLA small-loop setting "
        f"{info['xla_small_loop_setting']}; {info['date']}",
        "# jsr.Traveller(8, 64, 2) in eval mode, model(x) on x [1, T, 8] float32. us per call: median over all calls",
        "# (arms interleaved in rounds), [range of the per-round medians]; x bare: median / bare jax.jit's median;",
        "# 1st call: compile included (cached_partial wraps the nnx.jit function already compiled by the row above).",
        f"{'T':>5s}  {'arm':15s} {'us/call':>12s} {'round medians':>23s} {'x bare':>9s} {'calls':>6s} "
        f"{'1st call s':>10s}",
    ]
    for row in rows:
        lines.append(
            f"{row['T']:5d}  {row['arm']:15s} {row['median_us']:12.1f} "
            f"[{row['round_median_min_us']:9.1f}, {row['round_median_max_us']:9.1f}] {row['x_bare']:9.2f} "
            f"{row['calls']:6d} {row['first_call_s']:10.3f}"
        )
    for steps in sorted({r["T"] for r in rows}):
        by = {r["arm"]: r for r in rows if r["T"] == steps}
        lines.append(f"# T={steps}: jsr.jit / bare jax.jit = {by['jsr.jit']['x_bare']:.2f}; outputs of all JAX arms "
                     f"agree with bare jax.jit's to {by['jsr.jit']['max_abs_diff_vs_bare']:.1e}; jsr.jit is "
                     f"{by['torch seed loop']['median_us'] / by['jsr.jit']['median_us']:.1f}x faster than the torch seed "
                     f"loop ({by['jsr.jit']['median_us'] / steps:.2f} vs {by['torch seed loop']['median_us'] / steps:.1f} "
                     "us per step)")
        eager = by["eager"]
        if eager.get("resident_growth_mib_per_call") is not None:
            lines.append(f"# T={steps}: each eager call left the process {eager['resident_growth_mib_per_call']:.2f} MiB "
                         f"larger (resident size after gc, over its {eager['calls']} timed calls): JAX keeps each "
                         "program it compiled")
    for row in live_rows:
        lines.append(f"# live tick, {row['arm']}: {row['median_us']:.1f} us per call [{row['round_median_min_us']:.1f}, "
                     f"{row['round_median_max_us']:.1f}], first call {row['first_call_s']:.3f} s ({row['calls']} ticks; "
                     f"positions agree to {row['max_abs_diff_jsr_vs_torch']:.1e})")
    lines.append(f"# Python work per call ({parts['variables']} Variables; min of 5 x timeit): flattening the "
                 f"nnx.split State (bare jax.jit's argument) {parts['flatten_split_state_us']:.1f} us; reading the "
                 f"Variables' values into a flat list (jsr.jit) {parts['read_variable_values_us']:.1f} us")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=positive_int_list, default="4,1000", help="comma-separated T values")
    parser.add_argument("--rounds", type=POSITIVE_INT, default=20,
                        help="rounds of interleaved calls (each: one eager call)")
    parser.add_argument("--calls", type=int, default=0,
                        help="calls of each compiled arm per round (0: 200 for T <= 100, else 40)")
    parser.add_argument("--out", type=results_file, help="write the table here, and append the run to the JSON next to it (.json)")
    args = parser.parse_args(argv)
    if args.calls < 0:
        parser.error(f"argument --calls: expected an int >= 0, got {args.calls}")
    load_before = os.getloadavg()[0]
    rows = []
    for steps in args.seq_lens:
        calls = args.calls or (200 if steps <= 100 else 40)
        rows += measure(steps, args.rounds, calls)
        print(f"T={steps} done", flush=True)
    live_rows = live(args.rounds, 200)
    print("live ticks done", flush=True)
    info = machine()
    parts = pieces()
    command = "python benchmarks/call_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = table(rows, info, command.strip(), parts, live_rows)
    print(text, end="")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        # Appended, not replaced: the torch loop's time moves with the machine's state far more than jsr's,
        # so one run's ratio is not the figure (docs/figures.py quotes the runs' range).
        append_run(os.path.splitext(args.out)[0] + ".json", {
            "machine": info, "command": command.strip(), "rows": rows, "live": live_rows, "pieces": parts,
            "load_average": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)}}, info)


if __name__ == "__main__":
    main()
