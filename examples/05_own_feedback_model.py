"""Your own feedback model: a forecaster that reads its own last prediction, as one compiled scan.

What it teaches:
  1. The seeds' pattern is general. Any model whose step t reads what step t-1 produced (here a GRU
     forecaster rolled out closed-loop: its prediction of y_t is its input at t+1) is one
     `jsr.feedback_scan`: a recurrent core (`jsr.GRU`) and three small functions, what layer 0 reads
     (`inject`), what a step outputs (`readout`) and what the next step reads (`feed`).
  2. Your PyTorch weights load unchanged: `jsr.load_torch_state_dict` walks your module's attributes, so
     a module whose attribute names are your torch module's (`gru`, `head`) takes its state_dict.
  3. Same numbers as your torch loop, and the time per step of each; trained weights go back to your torch class.
  4. Teacher forcing and free running are one scan with another `feed`; `jax.grad` differentiates through
     either (backpropagation through time). Each rule wins at what it trains for: one-step-ahead error
     with the truth fed back, the error of a whole rollout with the model's own predictions fed back.

Run:   python examples/05_own_feedback_model.py           (about 10-20 s on a 2-core CPU)
       python examples/05_own_feedback_model.py --quick   (a smoke test, ~10 s)
Output: a parity line, a timing table, a training table, and forecasts.png in
examples/out/05_own_feedback_model (or --out).
"""
# %% Config
import argparse
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.train import TrainStep

# --out's default is beside this file, wherever it runs from (a notebook kernel, which has no __file__,
# runs in the notebook's folder)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test (the test suite's)")
parser.add_argument("--out", default=HERE / "out" / "05_own_feedback_model", type=Path,
                    help="where the PNG goes (default: %(default)s, beside this file)")
args, unknown = parser.parse_known_args()
if unknown and "ipykernel" not in sys.modules:  # a notebook kernel passes its own (-f kernel.json)
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")

HIDDEN = 32
STEPS = 150 if args.quick else 600  # optimiser steps per training rule
BATCH, TRAIN_LEN = 32, 64  # paths per step, steps per training path
TRAIN_PATHS, TEST_PATHS, TEST_LEN = (256, 64, 100) if args.quick else (1024, 256, 200)
TIMED_B, TIMED_T = 16, 200  # the timing's batch and steps
OUT: Path = args.out
# As in example 01: B=16, H=32 ops are too small to split; more threads only add synchronisation (a lot, on a
# busy CPU: with torch's default of 2 threads on a loaded 2-core machine its loop measured 20-150x slower)
TORCH_THREADS = 1
torch.set_num_threads(TORCH_THREADS)
torch.manual_seed(0)


# %% The system: y_t depends nonlinearly on y_{t-1}, y_{t-2} and a known input u_t, plus noise
def simulate(paths: int, steps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs u [N, T, 1] and outputs y [N, T, 1]; y[:, t] is observed after u[:, t]."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((paths, steps, 1)).astype(np.float32)
    y = np.zeros((paths, steps + 2), np.float32)  # two zeros of history before t = 0
    for t in range(steps):
        y[:, t + 2] = (1.2 * np.tanh(1.5 * y[:, t + 1]) - 0.6 * y[:, t] + 0.4 * u[:, t, 0]
                       + 0.1 * rng.standard_normal(paths))
    return u, y[:, 2:, None]


# %% Your PyTorch model: its loop feeds each prediction back as the next step's input
class TorchForecaster(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.gru = torch.nn.GRU(2, hidden, batch_first=True)  # reads [previous y, u_t]
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, u: torch.Tensor) -> torch.Tensor:  # u [B, T, 1] -> predictions [B, T, 1]
        y_prev, hidden, predictions = torch.zeros(u.shape[0], 1), None, []
        for t in range(u.shape[1]):  # Python runs every step: the loop the seeds ask about
            out, hidden = self.gru(torch.cat([y_prev, u[:, t]], -1)[:, None], hidden)
            y_prev = self.head(out[:, 0])  # fed back at t+1
            predictions.append(y_prev)
        return torch.stack(predictions, 1)


# %% The same model in JAX: the loop is one lax.scan, the feedback inside it
class Forecaster(nnx.Module):
    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.gru = jsr.GRU(2, hidden, batch_first=True, rngs=rngs)  # the torch model's attribute names
        self.head = nnx.Linear(hidden, 1, rngs=rngs)

    def __call__(self, u: jnp.ndarray | np.ndarray, y: jnp.ndarray | np.ndarray | None = None) -> jnp.ndarray:
        """u [B, T, 1] -> predictions [B, T, 1]. Free running feeds each prediction back; with the true
        y [B, T, 1] given, teacher forcing feeds y_t back instead."""
        batch = u.shape[0]
        u = jnp.swapaxes(u, 0, 1)  # time-major [T, B, 1], as lax.scan slices it
        xs = (u, u if y is None else jnp.swapaxes(y, 0, 1))  # (u_t, what teacher forcing feeds back)
        layer0 = self.gru.layers[0]
        _, _, predictions = jsr.feedback_scan(
            self.gru,
            self.gru.initial_state(batch),  # zeros [layers, B, H], as jsr.GRU takes a state
            jnp.zeros((batch, 1)),  # what step 0 reads as the previous y
            xs,
            inject=lambda y_prev, x_t: layer0.input_projection(jnp.concatenate([y_prev, x_t[0]], -1)),
            readout=lambda h, x_t: self.head(h),
            feed=(lambda pred, x_t: pred) if y is None else (lambda pred, x_t: x_t[1]),
        )
        return jnp.swapaxes(predictions, 0, 1)


# %% Same weights, same numbers
torch_model = TorchForecaster(HIDDEN)
model = Forecaster(HIDDEN, rngs=nnx.Rngs(0))
jsr.load_torch_state_dict(model, torch_model.state_dict())
fast = jsr.jit(model)  # once: the compiled call, seeing later weight updates
u_timed, _ = simulate(TIMED_B, TIMED_T, seed=0)
with torch.no_grad():
    expected = torch_model(torch.from_numpy(u_timed)).numpy()
diff = float(np.abs(np.asarray(fast(u_timed)) - expected).max())
print(f"max |JAX forecast - torch loop| = {diff:.3g} over {TIMED_T} steps")
assert diff < 1e-4, diff  # float32 rounding, compounded through the feedback


# %% Time per step: the torch loop (on TORCH_THREADS threads) against the compiled scan (medians of 5 calls)
def median_seconds(call, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


with torch.no_grad():
    torch_s = median_seconds(lambda: torch_model(torch.from_numpy(u_timed)))
jax_s = median_seconds(lambda: fast(u_timed).block_until_ready())  # JAX returns before computing: wait
print(f"\nB={TIMED_B}, T={TIMED_T}, H={HIDDEN}, torch threads {torch.get_num_threads()} "
      "(as in example 01: ops this small only wait for each other on more threads):")
print("| loop | us per step | speed-up |\n|---|---:|---:|")
print(f"| torch loop | {torch_s / TIMED_T * 1e6:.1f} | 1.0x |")
print(f"| jsr.feedback_scan, jitted | {jax_s / TIMED_T * 1e6:.1f} | {torch_s / jax_s:.1f}x |")

# %% Training: the same scan with either rule, differentiated through by JAX (backpropagation through time)
u_train, y_train = simulate(TRAIN_PATHS, TRAIN_LEN, seed=1)
u_test, y_test = simulate(TEST_PATHS, TEST_LEN, seed=2)  # held out, longer paths


def batch_at(step: int) -> tuple[np.ndarray, np.ndarray]:  # a pure function of the step: the same run every time
    rows = np.random.default_rng(step).integers(0, TRAIN_PATHS, BATCH)
    return u_train[rows], y_train[rows]


def train(teacher_forcing: bool) -> Forecaster:
    trained = Forecaster(HIDDEN, rngs=nnx.Rngs(1))

    def loss_fn(model, batch):  # (loss, metrics): mean squared error of every step's prediction
        u, y = batch
        return jnp.mean((model(u, y if teacher_forcing else None) - y) ** 2), {}

    # The library's one compiled update (forward scan, backward scan, Adam), as `jax-scan-rnn train` runs it;
    # `jax_scan_rnn.train.fit(model, loss_fn, batch_at, TrainConfig(...), out_dir=...)` adds logs, checkpoints, resume.
    train_step = TrainStep(trained, loss_fn, optax.adam(3e-3), batch_at(0))
    carry = train_step.init()
    for step in range(STEPS):
        carry = train_step(carry, batch_at(step))
    train_step.write(carry)  # the model now holds the trained weights
    return trained


def rmse(prediction, truth) -> float:
    return float(np.sqrt(np.mean((np.asarray(prediction) - truth) ** 2)))


print(f"\nheld-out RMSE ({TEST_PATHS} paths; y's std {y_test.std():.3f}), {STEPS} updates each:")
print("| trained with | one step ahead (truth fed back) | whole rollout (own predictions) |\n|---|---:|---:|")
rollouts = {}
for name, teacher_forcing in (("teacher forcing", True), ("free running", False)):
    trained = train(teacher_forcing)
    fast_trained = jsr.jit(trained)  # compiled: an eager call would trace and compile the whole loop again
    rollouts[name] = np.asarray(fast_trained(u_test))
    print(f"| {name} | {rmse(fast_trained(u_test, y_test), y_test):.4f} | {rmse(rollouts[name], y_test):.4f} |")
if args.quick:
    print(f"quick run: {STEPS} updates on {TRAIN_PATHS} paths; the default run trains longer on more")

# %% The trained weights back in your torch class (the last model trained: free running)
torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in jsr.torch_state_dict(trained).items()})
with torch.no_grad():
    torch_rollout = torch_model(torch.from_numpy(u_test)).numpy()
diff = float(np.abs(torch_rollout - rollouts["free running"]).max())
print(f"trained weights back in torch: max |torch rollout - JAX rollout| = {diff:.3g} over {TEST_LEN} steps")
assert diff < 1e-4, diff

# %% Plot one held-out path's forecasts
import matplotlib  # noqa: E402  (only the plot needs it)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT.mkdir(parents=True, exist_ok=True)
fig, ax = plt.subplots(figsize=(9, 3.5))
ax.plot(y_test[0, :, 0], color="black", lw=1.5, label="y (truth)")
for name, prediction in rollouts.items():
    ax.plot(prediction[0, :, 0], lw=1, label=f"rollout, trained with {name}")
ax.set(xlabel="step t", ylabel="y", title="Closed-loop forecasts of a held-out path (only u is given)")
ax.legend(loc="upper right", fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "forecasts.png", dpi=120)
print(f"\nOutputs in {OUT.resolve()}")
