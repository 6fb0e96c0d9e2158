"""What building the optimiser's state costs in a fresh process: optax's eager `tx.init` (each op compiles a
small program of its own on first use) against the one compiled `tx.init` that `jax_scan_rnn.train.TrainStep`
uses (docs/measurements.md, "Train step").

    python benchmarks/optimizer_init.py --out benchmarks/results/optimizer-init-cpu-2core.json  # appends the run

Per round, model and way: a new Python process builds the task's default model and `fit`'s optimiser for it
(`make_optimizer` with the task's defaults), then times `nnx.Optimizer(model, tx)` until its arrays are ready.
The two ways alternate. About 1 minute on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import alternating_processes, append_run, measurement_end, measurement_start, results_file  # noqa: E402
from jax_scan_rnn.cli import POSITIVE_INT  # noqa: E402  the CLI's option check

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=5)
    parser.add_argument("--out", default=None, type=results_file, help="append the run to this JSON file (default: print only)")
    args = parser.parse_args()
    run = measurement_start("optimizer_init.py")
    words = alternating_processes(CHILD, MODELS, WAYS, args.rounds)
    times = {m: {w: [round(float(r[0]), 4) for r in runs] for w, runs in ways.items()} for m, ways in words.items()}
    if args.out:
        append_run(args.out, measurement_end(run, seconds=times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
