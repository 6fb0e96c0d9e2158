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

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import alternating_benchmark  # noqa: E402

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
    return alternating_benchmark("model_init.py", __doc__, CHILD, MODELS, WAYS, same_last_word=True,
                                 env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"})


if __name__ == "__main__":
    sys.exit(main())
