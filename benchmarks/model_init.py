"""What building a model costs in a fresh process: the parameters drawn by `jax.random.uniform` per shape (one
compiled program per parameter shape) against `jax_scan_rnn.cells.uniform` (one per power of two, cut to
shape), the library's way (docs/measurements.md, "Parameter draws").

    python benchmarks/model_init.py --out benchmarks/results/model-init-cpu-2core.json  # appends the run

Per round, model and way: a new Python process, with JAX's compilation cache off, makes a first key (its
programs are every model's), then times building the model until its arrays are ready. The two ways
alternate, and must give the same parameters, bit for bit (checked: a digest of every parameter's bytes).
About 1 minute on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import alternating_processes, append_run, measurement_end, measurement_start, results_file  # noqa: E402
from jax_scan_rnn.cli import POSITIVE_INT  # noqa: E402  the CLI's option check

WAYS = ("per-shape", "cut")
MODELS = ("lstm", "traveller", "vae")

CHILD = """
import hashlib, sys, time
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
import jax_scan_rnn as jsr
from jax_scan_rnn import cells, layers
from jax_scan_rnn.tasks import traveller, vae

way, which = sys.argv[1], sys.argv[2]
if way == "per-shape":  # the draw before cells.uniform: jax.random.uniform at each parameter's shape
    def per_shape(key, shape, dtype, minval=0.0, maxval=1.0, *, scale=None, offset=0.0):
        out = jax.random.uniform(key, shape, dtype, minval, maxval)
        return out if scale is None else out * jnp.asarray(scale, dtype) - jnp.asarray(offset, dtype)
    cells.uniform = layers.uniform = per_shape
build = {"lstm": lambda: jsr.LSTM(8, 64, 2, rngs=nnx.Rngs(0)),
         "traveller": lambda: traveller.build_model(traveller.TravellerTask()),
         "vae": lambda: vae.build_model(vae.VAETask(), 40)}[which]
jax.random.key(0).block_until_ready()
start = time.perf_counter()
model = build()
jax.block_until_ready(jax.tree.leaves(nnx.state(model, nnx.Param)))
seconds = time.perf_counter() - start
digest = hashlib.sha256(b"".join(np.asarray(p).tobytes() for p in jax.tree.leaves(nnx.state(model, nnx.Param))))
print(seconds, digest.hexdigest())
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=5)
    parser.add_argument("--out", default=None, type=results_file, help="append the run to this JSON file (default: print only)")
    args = parser.parse_args()
    run = measurement_start("model_init.py")
    words = alternating_processes(CHILD, MODELS, WAYS, args.rounds, env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"})
    for model, ways in words.items():
        if len({r[-1] for runs in ways.values() for r in runs}) != 1:
            print(f"model_init: {model}: the two ways drew different parameters", file=sys.stderr)
            return 1
    times = {m: {w: [round(float(r[0]), 4) for r in runs] for w, runs in ways.items()} for m, ways in words.items()}
    if args.out:
        append_run(args.out, measurement_end(run, seconds=times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
