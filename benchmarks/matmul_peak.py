"""What this machine's float32 matmuls reach: the ceiling the VAE speed figures are compared with.

    python benchmarks/matmul_peak.py
    python benchmarks/matmul_peak.py --out benchmarks/results/matmul-peak-cpu-2core.json   # appends the run

Times one jitted `a @ b` for the VAE's GRU product at its training batch ([128,256]x[256,768]), at a
10,000-molecule generation batch, and a large square one; prints GFLOP/s (2*M*K*N per call, the best of
5 rounds). A recurrent step that also runs gates, a backward pass and an optimiser cannot beat these.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax_scan_rnn  # noqa: F401  (first: its XLA setting applies to every figure of this project)
import jax

from call_overhead import machine  # this folder's scripts: the script's own directory is on sys.path
from timed_run import append_run, results_file

SHAPES = ((128, 256, 768), (10_000, 256, 768), (2048, 2048, 2048))


def gflops(m: int, k: int, n: int, rounds: int = 5) -> float:
    a = jax.random.normal(jax.random.key(0), (m, k))
    b = jax.random.normal(jax.random.key(1), (k, n))
    matmul = jax.jit(lambda a, b: a @ b)
    matmul(a, b).block_until_ready()
    reps = max(3, int(2e9 / (2 * m * k * n)))  # ~2 GFLOP per round
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            out = matmul(a, b)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / reps)
    return 2 * m * k * n / best / 1e9


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=results_file, help="append the run to this JSON file (created if missing)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    print(f"JAX {jax.__version__} on {jax.devices()[0].device_kind}")
    rows = []
    for m, k, n in SHAPES:
        rows.append({"shape": [m, k, n], "gflops": gflops(m, k, n)})
        print(f"[{m},{k}]x[{k},{n}]: {rows[-1]['gflops']:.0f} GFLOP/s")
    if args.out:  # appended: a later run never replaces an earlier one
        words = argv if argv is not None else sys.argv[1:]
        info = machine()
        append_run(args.out, {"command": " ".join(["python benchmarks/matmul_peak.py", *words]), "machine": info,
                              "rows": rows, "load_average": {"start": round(load_before, 2),
                                                             "end": round(os.getloadavg()[0], 2)}}, info)


if __name__ == "__main__":
    main()
