"""Train the seed's position-feedback LSTM ("Traveller") on a market whose optimal policy is known.

What it teaches:
  1. A model whose input at step t is its own output at t-1 still trains as ONE compiled loop:
     `jsr.Traveller` runs the whole feedback recurrence inside `jax.lax.scan`, and `jax.grad`
     differentiates straight through it (backpropagation through time, no Python loop per step).
  2. With no labels, maximising net utility discovers the known optimum: trade part of the way toward
     an "aim" portfolio (Garleanu & Pedersen 2013), which needs the previous position, i.e. feedback.
  3. The same weights in PyTorch (`torch_ref.Traveller`, the seed's own loop) give the same positions.

Run:   python examples/02_train_traveller.py           (about 25 s on a 2-core CPU)
       python examples/02_train_traveller.py --quick   (60 updates on small data: ~10 s, a smoke test)
Output: a utility table on held-out paths, and PNGs of the training curve and of the positions in
examples/out/02_train_traveller (or --out).
"""
# %% Config
import argparse
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx

import jax_scan_rnn as jsr
import torch_ref
from jax_scan_rnn.data import trading
from jax_scan_rnn.train import TrainStep

# --out's default is beside this file, wherever it runs from (a notebook kernel, which has no __file__,
# runs in the notebook's folder)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
parser.add_argument("--quick", action="store_true", help="60 updates on small data: a smoke test (the test suite's)")
parser.add_argument("--out", default=HERE / "out" / "02_train_traveller", type=Path,
                    help="where the PNGs go (default: %(default)s, beside this file)")
args, unknown = parser.parse_known_args()
if unknown and "ipykernel" not in sys.modules:  # a notebook kernel passes its own (-f kernel.json)
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")

STEPS = 60 if args.quick else 600  # optimiser steps
PRINT_EVERY = 20 if args.quick else 100  # steps between progress lines (a multiple of 10)
BATCH, SEQ_LEN = (16, 32) if args.quick else (64, 128)  # paths per step, steps per training path
TRAIN_PATHS, TEST_PATHS, TEST_LEN = (256, 32, 100) if args.quick else (4096, 256, 500)  # simulated paths
HIDDEN, LAYERS = 32, 2
LEARNING_RATE = 3e-3
OUT: Path = args.out
market_cfg = trading.MarketConfig()

# %% The market: signals predict returns; trading costs make the best position depend on the last one
train_market = trading.simulate(market_cfg, TRAIN_PATHS, SEQ_LEN, seed=1)
test_market = trading.simulate(market_cfg, TEST_PATHS, TEST_LEN, seed=999)  # held out, longer paths
print("held-out utility per step of the reference policies:")
for name, value in trading.utility_table(market_cfg, test_market).items():
    print(f"  {name:<10} {value:+.4f}")

# %% The model: positions_t = tanh(Linear(LSTM([positions_{t-1}, features_t])))
model = jsr.Traveller(market_cfg.num_signals, HIDDEN, LAYERS, 0.0, rngs=nnx.Rngs(0))
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(optax.cosine_decay_schedule(LEARNING_RATE, STEPS)))


def loss_fn(model, batch):
    # The loss is minus the net utility: gains minus risk minus quadratic trading costs.
    features, returns = batch
    positions, _ = model(features)  # [B, T, 2], and the state after the last step (unused here)
    return -trading.net_utility(positions, returns, market_cfg).mean(), {}


def batch_at(step):  # a pure function of the step: the same batches on every run
    idx = np.random.default_rng(step).choice(len(train_market.features), BATCH, replace=False)
    return jnp.asarray(train_market.features[idx], jnp.float32), jnp.asarray(train_market.returns[idx], jnp.float32)


# One compiled program per update: forward scan, backward scan, Adam. `fit` (what `jax-scan-rnn train`
# runs) is this same step plus logging, evaluation and checkpoints.
train_step = TrainStep(model, loss_fn, tx, batch_at(0))

# %% Train
carry = train_step.init()
losses = []  # mean training loss over each window of 10 updates
for step in range(STEPS):
    carry = train_step(carry, batch_at(step))
    if (step + 1) % 10 == 0:
        window = train_step.read(carry)["window"]  # sums since the last reset: the only host sync
        losses.append(float(window["loss"] / window["count"]))
        carry = train_step.reset(carry)
    if (step + 1) % PRINT_EVERY == 0:
        print(f"step {step + 1:4d}  training utility per step {-losses[-1]:+.4f}")
train_step.write(carry)  # the model now holds the trained weights (after a Ctrl-C: train_step.latest)

# %% Evaluate out of sample, through the one compiled call (it reads the trained weights at each call)
model.eval()
fast = jsr.jit(model)
test_features = jnp.asarray(test_market.features, jnp.float32)
positions = np.asarray(fast(test_features)[0])  # [B, T, 2], on the host (the state is not needed)
table = trading.utility_table(market_cfg, test_market, positions)
print(f"\nlearned policy: {table['learned']:+.4f} per step = {table['learned_over_optimal']:.1%} of the optimum")
if args.quick:
    print(f"quick run: {STEPS} updates on {TRAIN_PATHS} short paths, a smoke test: quote the default run's share")

# %% The same weights in PyTorch: the seed's own per-step loop gives the same positions
reference = torch_ref.Traveller(market_cfg.num_signals, HIDDEN, LAYERS, 0.0).eval()
reference.load_state_dict({k: torch.from_numpy(v) for k, v in jsr.torch_state_dict(model).items()})
with torch.no_grad():
    torch_positions, _ = reference(torch.from_numpy(test_market.features[:4].astype(np.float32)), method="loop")
gap = np.abs(torch_positions.numpy() - positions[:4]).max()
print(f"PyTorch seed loop vs JAX scan, same weights, 4 paths x {TEST_LEN} steps: max |diff| = {gap:.1e}")
assert gap < 1e-4, f"PyTorch and JAX disagree: {gap}"  # float32 rounding only

# %% Live use: the model is stateful. Run the history in one call, then one step per new bar from the
# returned state: the same positions as one call over everything.
history, state = fast(test_features[:, :TEST_LEN - 10])
live = []
for t in range(TEST_LEN - 10, TEST_LEN):  # ten "new bars"
    p_t, state = fast.step(state, test_features[:, t])
    live.append(np.asarray(p_t))
gap = np.abs(np.stack(live, 1) - positions[:, TEST_LEN - 10:]).max()
print(f"10 live steps from the saved state vs one call over all {TEST_LEN} steps: max |diff| = {gap:.1e}")
assert gap < 1e-4, f"the live steps disagree with the one call: {gap}"

# %% Plots
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT.mkdir(parents=True, exist_ok=True)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(np.arange(10, STEPS + 1, 10), -np.array(losses), lw=0.8, label="training utility per step")
ax.axhline(table["optimal"], color="k", ls="--", label="optimal policy (held out)")
ax.set_xlabel("optimiser step")
ax.set_ylabel("net utility per step")
ax.set_ylim(-0.1, 0.3)
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "training_curve.png", dpi=110)

optimal = trading.optimal_policy(market_cfg, test_market.signals)
fig, ax = plt.subplots(figsize=(9, 3.5))
ax.plot(optimal[0, :200, 0], "k", lw=1.5, label="optimal")
ax.plot(positions[0, :200, 0], "r--", lw=1.2, label="Traveller")
ax.set_xlabel("step")
ax.set_ylabel("position in asset 0")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "positions.png", dpi=110)
print(f"plots written to {OUT}")
