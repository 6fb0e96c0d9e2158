"""Scan vs loop: one feedback LSTM, one set of weights, four ways to run its time loop.

What it teaches
    The seed's model (the "Traveller") feeds each step's output back into the next step's input, so
    its time loop cannot be handed to `nn.LSTM` in one call. This script runs that loop four ways on
    ONE set of weights, checks that they compute the same positions, and times them:
      1. the seed's eager Python loop, one `nn.LSTM` call per step (the question's code);
      2. its corrected TorchScript version: `torch.jit.script` of the loop *function* (the seed's
         answer put `@torch.jit.script_method` on a plain `nn.Module`, which compiles nothing: shown);
      3. the PyTorch scan prototype `torch._higher_order_ops.scan` (there is no public `torch.scan`),
         eager and under `torch.compile`;
      4. `jax.lax.scan`, compiled: `jsr.jit(jsr.Traveller(...))`.
    Why the numbers come out as they do: docs/scan_vs_loop.md. The full benchmark: `jax-scan-rnn bench`.

How to run
    python examples/01_scan_vs_loop.py            # about 25 s on a 2-core CPU (imports included)
    python examples/01_scan_vs_loop.py --quick    # T=50, 3 repeats: ~15 s, a smoke test (noisier timings)
    The `# %%` markers make it a notebook in VS Code or Jupyter.

Outputs: `times.md` (the table) and `times.png` (the chart) in examples/out/01_scan_vs_loop (or --out),
the folder printed on the last line.
"""
# %% Config
import argparse
import sys
from pathlib import Path
from typing import Literal

# --out's default is beside this file, wherever it runs from (a notebook kernel, which has no __file__,
# runs in the notebook's folder)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
parser.add_argument("--quick", action="store_true", help="T=50 and 3 repeats: a smoke test (the test suite's)")
parser.add_argument("--out", default=HERE / "out" / "01_scan_vs_loop", type=Path,
                    help="where times.md and times.png go (default: %(default)s, beside this file)")
args, unknown = parser.parse_known_args()
if unknown and "ipykernel" not in sys.modules:  # a notebook kernel passes its own (-f kernel.json)
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")

SEQ_LEN = 50 if args.quick else 1000  # T: time steps
BATCH = 1  # B: paths (the seed has one)
HIDDEN = 64  # H of each LSTM layer
LAYERS = 2  # stacked LSTM layers
FEATURES = 8  # F: features per step
# lax.scan steps per compiled loop iteration: "auto", the library's measured rule, or an int
UNROLL: int | Literal["auto"] = "auto"
REPEATS = 3 if args.quick else 5  # timed calls per method, after one warm-up call
TORCH_THREADS = 1  # B=1 ops are too small to split; more threads only add synchronisation (a lot, on a busy CPU)
SEED = 0
OUT_DIR: Path = args.out

# %% Imports, and one set of weights in both frameworks
import statistics
import time
import warnings

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from flax import nnx

import jax_scan_rnn as jsr
import torch_ref
from torch_ref.traveller import compiled_loop, scan_available

torch.set_num_threads(TORCH_THREADS)
torch.manual_seed(SEED)
torch_model = torch_ref.Traveller(FEATURES, HIDDEN, LAYERS, dropout=0.0).eval()
jax_model = jsr.Traveller(FEATURES, HIDDEN, LAYERS, 0.0, rngs=nnx.Rngs(SEED))
jsr.load_torch_state_dict(jax_model, torch_model.state_dict())  # the same numbers, PyTorch's key names
jax_model.eval()

x = np.random.default_rng(SEED).standard_normal((BATCH, SEQ_LEN, FEATURES), dtype=np.float32)
x_torch, x_jax = torch.from_numpy(x), jax.numpy.asarray(x)

# %% 1. The seed's loop: a Python loop that calls nn.LSTM once per step
# What `method="loop"` runs (torch_ref/traveller.py, `_seed_loop`):
#     for t in range(T):
#         input_data = torch.cat([prev_position, x[:, t:t+1]], dim=2)      # [B, 1, 2 + F]
#         lstm_out, hidden = self.lstm_layers(input_data, hidden)          # one nn.LSTM call
#         prev_position = self.activation(self.output_layer(lstm_out))     # fed back next step
# Every step pays Python, the nn.LSTM call machinery and a dozen small kernels.
methods = {}


def seed_loop():
    with torch.no_grad():
        return torch_model(x_torch, method="loop", layout="batch")[0]  # (positions, final state)


methods["torch: seed loop"] = seed_loop

# %% What the seed's answer tried, and why it does nothing useful
# `@torch.jit.script_method` belongs to `torch.jit.ScriptModule`. On a plain nn.Module it compiles
# nothing; in torch 2.13 it even replaces `forward` with a stub that cannot be called.
script_method = torch.jit.script_method  # type: ignore[attr-defined]  # not in torch's stubs (torch's parser
# reads the decorated method's source, comments included, so the decorator's line carries no comment)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)

    class SeedAnswer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

        @script_method
        def forward(self, x):
            return self.linear(x)

try:
    SeedAnswer()(torch.zeros(1, 2))
    print("the seed answer's @torch.jit.script_method on an nn.Module: callable here, but nothing is compiled")
except TypeError as err:  # the expected outcome in torch 2.13: shown as a result, not a crash
    print(f"the seed answer's @torch.jit.script_method on an nn.Module fails, as expected (TypeError: {err}); "
          "torch.jit.script without it is the working form (of the module, or, used below, of the loop function)")
print(f"public torch.scan exists: {hasattr(torch, 'scan')}; prototype available: "
      f"{scan_available()}")

# %% 2. TorchScript done right: script the loop function, which takes the weights as a list
# `method="script"` runs `torch.jit.script(traveller_loop)`: the loop runs in TorchScript's
# interpreter (no Python per step), but each step still launches its small kernels one by one.


def scripted():
    with torch.no_grad():
        return torch_model(x_torch, method="script", layout="batch")[0]


methods["torch: jit.script(loop)"] = scripted

# %% 3. The scan prototype: eager (a Python loop in disguise), then under torch.compile
compiled_scan = compiled_loop(torch_model, method="scan")


def scan_eager():
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch_model(x_torch, method="scan", layout="batch")[0]


def scan_compiled():
    with torch.no_grad():
        return compiled_scan(x_torch, layout="batch")[0]


methods["torch: scan prototype, eager"] = scan_eager
methods["torch: compile(scan)"] = scan_compiled

# %% 4. lax.scan: the whole loop (both layers, readout, feedback) is one compiled XLA while-loop
# `jsr.jit` compiles the model's call once per input shape (an eager `jax_model(x)` would trace and
# compile the loop again on every call). A call returns (positions, state); JAX runs it asynchronously,
# so the timing waits for the result with `block_until_ready`.
fast = jsr.jit(jax_model)
methods[f"jax: lax.scan (unroll={UNROLL})"] = lambda: fast(x_jax, unroll=UNROLL)[0].block_until_ready()

# %% Do they agree? Same weights, same inputs: the same positions up to float32 rounding
first_call, outputs = {}, {}
for name, fn in methods.items():
    t0 = time.perf_counter()
    outputs[name] = np.asarray(fn())  # [B, T, 2]; the first call includes any compile
    first_call[name] = time.perf_counter() - t0
reference = outputs["torch: seed loop"]
for name, out in outputs.items():
    diff = float(np.abs(out - reference).max())
    print(f"{name:<32} max |positions - seed loop| = {diff:.1e}")
    assert diff < 1e-4, f"{name} disagrees with the seed loop: {diff}"

# %% Time them: median of REPEATS calls, after the warm-up call above
per_step_us = {}
for name, fn in methods.items():
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    per_step_us[name] = statistics.median(samples) / SEQ_LEN * 1e6

seed_us = per_step_us["torch: seed loop"]
rows = ["| method | first call (s) | per step (µs) | speed-up vs seed loop |", "|---|---:|---:|---:|"]
for name, us in per_step_us.items():
    rows.append(f"| {name} | {first_call[name]:.2f} | {us:.3g} | {seed_us / us:.1f}x |")
table = "\n".join(rows)
print(f"\nB={BATCH}, T={SEQ_LEN}, H={HIDDEN}, {LAYERS} layers, torch threads {torch.get_num_threads()}:\n{table}")
OUT_DIR.mkdir(parents=True, exist_ok=True)
(OUT_DIR / "times.md").write_text(f"B={BATCH}, T={SEQ_LEN}, H={HIDDEN}, {LAYERS} layers\n\n{table}\n", encoding="utf-8")

# %% Plot: time per step, log scale (each bar is one way to run the same loop)
fig, ax = plt.subplots(figsize=(8, 3.8))
names = list(per_step_us)
ax.barh(names, [per_step_us[n] for n in names], color=["tab:red"] + ["tab:gray"] * (len(names) - 2) + ["tab:blue"])
ax.set_xscale("log")
ax.set_xlim(min(per_step_us.values()) / 2, seed_us * 8)  # room for the labels
ax.set_xlabel("time per step (µs, log scale)")
ax.invert_yaxis()
for i, n in enumerate(names):
    ax.text(per_step_us[n], i, f"  {per_step_us[n]:.3g} µs ({seed_us / per_step_us[n]:.0f}x)", va="center", fontsize=8)
ax.set_title(f"Traveller forward, B={BATCH}, T={SEQ_LEN}: same weights, four loops")
fig.tight_layout()
fig.savefig(OUT_DIR / "times.png", dpi=110)
print(f"Outputs in {OUT_DIR.resolve()}")
