"""What the cells' hand-written gate derivatives (`cells.HAND_WRITTEN_VJP`) change in a train step: the value and
gradient of the trading loss through `jsr.LSTM`, `jsr.GRU` (whole sequence) and `jsr.Traveller` (H=64, 2 layers,
F=8, as the benchmark's rows), with the hand-written derivative and with JAX's own of the same expressions.

    python benchmarks/cell_vjp.py --out benchmarks/results/cell-vjp-cpu-2core.json  # appends the run

Per case, each variant is compiled `--compiles` times, alternating (a fresh `jax.jit` with the library's compiler
options after `jax.clear_caches()`; trace, lower and XLA compile timed), then warm calls of the two alternate for `--rounds` rounds of `--calls` calls; the
ratio is the median over rounds of the round's hand / JAX time. About 4 minutes on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import append_run, measurement_end, measurement_start, results_file  # noqa: E402

import jax_scan_rnn as jsr  # noqa: E402
from jax_scan_rnn import cells, xla_flags  # noqa: E402
from jax_scan_rnn.cli import POSITIVE_INT  # noqa: E402  the CLI's option check

MODELS = {
    "traveller": lambda: jsr.Traveller(8, 64, 2, rngs=nnx.Rngs(0)),
    "lstm": lambda: jsr.LSTM(8, 64, 2, batch_first=True, rngs=nnx.Rngs(0)),
    "gru": lambda: jsr.GRU(8, 64, 2, batch_first=True, rngs=nnx.Rngs(0)),
}
VARIANTS = {"hand": True, "jax": False}  # cells.HAND_WRITTEN_VJP while tracing


def in_turn(r: int) -> list[str]:
    """The variants in round `r`'s order: each goes first in every other round."""
    names = list(VARIANTS)
    return names[r % len(names):] + names[:r % len(names)]


def case(name: str, batch: int, steps: int) -> tuple:
    """A `params -> (loss, grads)` of the model `name` on fixed data, and its parameters."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(batch, steps, 8)).astype(np.float32))
    r = jnp.asarray(rng.normal(size=(batch, steps, 2)).astype(np.float32))
    graphdef, params, rest = nnx.split(MODELS[name](), nnx.Param, ...)

    def loss(params):  # -mean(utility) of positions y against returns r, as the benchmark's train rows
        y = nnx.merge(graphdef, params, rest)(x)[0][..., :2]
        return -jnp.mean(jnp.sum(y * r, -1) - 0.5 * jnp.sum(y**2, -1))

    return jax.value_and_grad(loss), params


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=7)
    parser.add_argument("--calls", type=POSITIVE_INT, default=5)
    parser.add_argument("--compiles", type=POSITIVE_INT, default=3)
    parser.add_argument("--steps", type=POSITIVE_INT, default=1000)
    parser.add_argument("--out", default=None, type=results_file, help="append the run to this JSON file (default: print only)")
    args = parser.parse_args()
    run = measurement_start("cell_vjp.py")
    options = xla_flags.compiler_options()
    results = {}
    for name in MODELS:
        for batch in (1, 64):
            fn, params = case(name, batch, args.steps)
            compiled, compile_s = {}, {variant: [] for variant in VARIANTS}
            for r in range(args.compiles):
                for variant in in_turn(r):
                    cells.HAND_WRITTEN_VJP = VARIANTS[variant]  # read when the cells are traced, in lower()
                    jax.clear_caches()
                    t0 = time.perf_counter()
                    compiled[variant] = jax.jit(lambda p: fn(p), compiler_options=options).lower(params).compile()
                    compile_s[variant].append(round(time.perf_counter() - t0, 4))
            cells.HAND_WRITTEN_VJP = True
            us = {variant: [] for variant in VARIANTS}
            for r in range(args.rounds):
                for variant in in_turn(r):
                    jax.block_until_ready(compiled[variant](params))
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        out = compiled[variant](params)
                    jax.block_until_ready(out)
                    us[variant].append(round((time.perf_counter() - t0) / args.calls / args.steps * 1e6, 3))
            ratio = statistics.median(h / j for h, j in zip(us["hand"], us["jax"]))
            key = f"{name} B={batch}"
            results[key] = {"us_per_step": us, "compile_s": compile_s, "hand_over_jax": round(ratio, 4)}
            print(key, {v: round(statistics.median(t), 2) for v, t in us.items()}, "hand/jax", round(ratio, 3),
                  "compile", {v: round(statistics.median(t), 3) for v, t in compile_s.items()}, flush=True)
    if args.out:
        append_run(args.out, measurement_end(run, steps=args.steps, jax=jax.__version__, cases=results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
