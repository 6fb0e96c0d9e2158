"""Where the peers' table's train-step compile cells come from: for one cell, the jsr row as the benchmark runs it
(`TrainStep`, the step `fit` runs: NaN guard and metric sums), the same jsr model under the benchmark's plain Adam
step (what a peer row runs), the peer row itself, and the same `TrainStep` at unroll 1 (at B=1 the jsr row's
`unroll="auto"` unrolls 2 steps per loop iteration of a differentiated scan, as the peers do not; this arm resolves
"auto" to 1) (docs/tuning_cpu.md, "The peers' rows, explained").

    python benchmarks/train_compile.py --out benchmarks/results/train-compile-cpu-2core.json  # appends the run

Each case is built as `jax-scan-rnn bench --peers` builds it (the same weights, loss and compiler options), then
its compile (trace, lower and XLA compile after `jax.clear_caches()`) is timed round-robin with the other cases
of its cell. About 2 minutes on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import jax
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import append_run, measurement_end, measurement_start, results_file  # noqa: E402
from jax_scan_rnn.cli import POSITIVE_INT  # noqa: E402  the CLI's option check

from jax_scan_rnn import scan  # noqa: E402
from jax_scan_rnn.bench import jax_methods  # noqa: E402
from jax_scan_rnn.bench.config import BenchConfig  # noqa: E402
from jax_scan_rnn.bench.context import Context  # noqa: E402
from jax_scan_rnn.bench.methods import METHODS  # noqa: E402

CELLS = {  # jsr row -> the peer row it is compared with
    "jax-gru-seq": "peer-flax-gru-seq",
    "jax-lstm-seq": "peer-flax-optlstm-seq",
    "jax-scan-auto": "peer-flax-fb-opt",
}


def plain_adam_library_case(ctx: Context, mode: str, fn, model: nnx.Module, *args):
    """`jax_methods.library_case` with the benchmark's plain Adam step (`compiled_case`) instead of `TrainStep`."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return jax_methods.compiled_case(ctx, mode, lambda p, *a: fn(nnx.merge(graphdef, p, rest), *a), params, *args,
                                     library=True)


def cases(ctx: Context, jsr_key: str, batch: int, steps: int) -> dict:
    build = METHODS[jsr_key].build
    out = {"jsr (TrainStep)": build(ctx, batch, steps, "train")}
    library_case = jax_methods.library_case
    jax_methods.library_case = plain_adam_library_case  # looked up at call time by traveller_case
    try:
        out["jsr (plain Adam)"] = build(ctx, batch, steps, "train")
    finally:
        jax_methods.library_case = library_case
    out["peer"] = METHODS[CELLS[jsr_key]].build(ctx, batch, steps, "train")
    with unroll_1():  # built (and compiled) at unroll 1; every later compile of it traces again: at unroll 1 too
        at_1 = build(ctx, batch, steps, "train")
    again = at_1.compile_again

    def compile_again_at_1() -> float:
        with unroll_1():
            return again()

    at_1.compile_again = compile_again_at_1
    out["jsr unroll 1 (TrainStep)"] = at_1
    return out


@contextlib.contextmanager
def unroll_1():
    """`unroll="auto"` resolved to 1 while tracing (`scan.resolve_unroll` reads `scan.auto_unroll` then)."""
    auto_unroll = scan.auto_unroll
    scan.auto_unroll = lambda *args, **kwargs: 1
    try:
        yield
    finally:
        scan.auto_unroll = auto_unroll


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=7)
    parser.add_argument("--batch", type=POSITIVE_INT, default=1)
    parser.add_argument("--steps", type=POSITIVE_INT, default=1000)
    parser.add_argument("--out", default=None, type=results_file, help="append the run to this JSON file (default: print only)")
    args = parser.parse_args()
    ctx = Context(BenchConfig.peers())
    run = measurement_start("train_compile.py")
    results = {}
    for jsr_key, peer_key in CELLS.items():
        built = cases(ctx, jsr_key, args.batch, args.steps)
        names = list(built)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                jax.clear_caches()
                seconds[name].append(round(built[name].compile_again(), 4))
        results[jsr_key] = {"peer": peer_key, "seconds": seconds}
        print(jsr_key, {name: round(statistics.median(v), 3) for name, v in seconds.items()}, flush=True)
    if args.out:
        append_run(args.out, measurement_end(run, batch=args.batch, steps=args.steps, cells=results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
