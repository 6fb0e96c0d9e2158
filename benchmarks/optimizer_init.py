"""What building the optimiser's state costs in a fresh process: optax's eager `tx.init` (each op compiles a
small program of its own on first use) against the one compiled `tx.init` that `jax_scan_rnn.train.TrainStep`
uses (docs/measurements.md, "Train step").

    python benchmarks/optimizer_init.py --out benchmarks/results/optimizer-init-cpu-2core.json  # appends the run

Per round, model and way: a new Python process builds the task's default model and `fit`'s optimiser for it
(`make_optimizer` with the task's defaults), then times `nnx.Optimizer(model, tx)` until its arrays are ready.
The two ways alternate. About 1 minute on a 2-core CPU.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import alternating_benchmark  # noqa: E402

WAYS = ("eager", "compiled")
MODELS = ("traveller", "vae")

CHILD = """
import sys, time
import jax
from flax import nnx
from jax_scan_rnn import xla_flags
from jax_scan_rnn.train import TrainConfig, make_optimizer
from jax_scan_rnn.tasks import traveller, vae

way, which = sys.argv[1], sys.argv[2]
if which == "traveller":
    model, cfg = traveller.build_model(traveller.TravellerTask()), TrainConfig()
else:
    model, cfg = vae.build_model(vae.VAETask(), 40), TrainConfig(**vae.TRAIN_DEFAULTS)
tx = make_optimizer(cfg)
if way == "compiled":  # as TrainStep builds it
    tx = tx._replace(init=jax.jit(tx.init, compiler_options=xla_flags.compiler_options()))
start = time.perf_counter()
optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
jax.block_until_ready(jax.tree.leaves(optimizer.opt_state))
print(time.perf_counter() - start)
"""


def main() -> int:
    return alternating_benchmark("optimizer_init.py", __doc__, CHILD, MODELS, WAYS)


if __name__ == "__main__":
    sys.exit(main())
