"""What bounds a batch-1 scan: every step reads all of the model's weights once (a matrix-vector product per
layer), so its time per step follows the weights' bytes, not the number of operations dispatched.

    python benchmarks/weight_bandwidth.py --out benchmarks/results/weight-bandwidth-cpu-2core.json  # appends the run

For H in --hidden-sizes: `jsr.Traveller(8, H, 2)` in eval mode, `fast = jsr.jit(model)`, `fast(x)` on x [1, T, 8]
float32 (T = --steps); us per step = median over --rounds rounds of --calls calls each, after a warm-up call.
The weights' bytes over that time is the rate at which the step streams them: if it stays about the same
while H (and so the bytes, ~H^2) grows, the step is bound by reading the weights, at the rate the code that
reads them reaches (XLA's matrix-vector settings, docs/measurements.md#matrix-vector-code).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.cli import POSITIVE_INT, positive_int_list
from call_overhead import machine  # this folder's scripts: the script's own directory is on sys.path
from timed_run import append_run, results_file


def measure(hidden: int, steps: int, rounds: int, calls: int) -> dict:
    model = jsr.Traveller(8, hidden, 2, rngs=nnx.Rngs(0))
    model.eval()
    fast = jsr.jit(model)
    x = jax.numpy.asarray(np.random.default_rng(0).standard_normal((1, steps, 8)), np.float32)
    jax.block_until_ready(fast(x))
    per_step = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = fast(x)
        jax.block_until_ready(out)
        per_step.append((time.perf_counter() - start) / calls / steps * 1e6)
    weights = sum(p.size * p.dtype.itemsize for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    us = float(np.median(per_step))
    return {"H": hidden, "us_per_step": us, "round_range_us": [min(per_step), max(per_step)],
            "weight_bytes": int(weights), "gb_per_s": weights / us / 1e3}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-sizes", type=positive_int_list, default="32,64,128,256", help="comma-separated H values")
    parser.add_argument("--steps", type=POSITIVE_INT, default=1000, help="T of each call")
    parser.add_argument("--rounds", type=POSITIVE_INT, default=7)
    parser.add_argument("--calls", type=POSITIVE_INT, default=20, help="calls per round")
    parser.add_argument("--out", type=results_file, help="append the run to this JSON file (created if missing)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = [measure(h, args.steps, args.rounds, args.calls) for h in args.hidden_sizes]
    for r in rows:
        print(f"H={r['H']:4d}  {r['us_per_step']:7.2f} us/step  weights {r['weight_bytes'] / 1024:7.0f} KiB  "
              f"{r['gb_per_s']:5.0f} GB/s")
    if args.out:  # appended: a later run never replaces an earlier one
        words = argv if argv is not None else sys.argv[1:]
        info = machine()
        append_run(args.out, {"command": " ".join(["python benchmarks/weight_bandwidth.py", *words]),
                              "machine": info, "steps": args.steps, "rows": rows,
                              "load_average": {"start": round(load_before, 2),
                                               "end": round(os.getloadavg()[0], 2)}}, info)


if __name__ == "__main__":
    main()
