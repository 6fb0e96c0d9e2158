"""Scan vs loop, measured: the same Traveller, the same weights, every way of running its feedback loop.

    jax-scan-rnn bench [--quick | --peers] [--out DIR]  # the CLI (wired through `add_arguments` / `run`)
    results = run_suite(BenchConfig.quick())          # the library: returns data, prints nothing
    paths = write_results(results, "benchmarks/results")

One process times, side by side, on one set of weights (a `torch_ref.Traveller` copied into a
`jsr.Traveller` with `jsr.load_torch_state_dict`):

  torch   the seed's eager loop over `nn.LSTM` ("seed"), an LSTM-cell loop, `torch.jit.script` of that
          loop, `torch._higher_order_ops.scan` eager and under `torch.compile`, `torch.compile` of the
          Python loop (short T only: Dynamo unrolls it), a CUDA-graph capture of the loop (GPU only), and
          `nn.LSTM` over the whole sequence with the feedback removed (a lower bound for torch).
  jax     `lax.scan` at unroll 1, 4, 16 and "auto" (the library's measured choice, `scan.auto_unroll`),
          `nn.LSTM`'s JAX twin over the whole sequence (no feedback), a Python
          loop under `jax.jit` (unrolled: short T only), and eager op-by-op JAX (short T only).
  limit   the same FLOPs with the time dependency removed: every step's matmuls and gate math as a few
          batched ops over [B*T] rows, in XLA and in torch; the faster one is the "limit".
  peer    what a JAX user would write without this library, jitted, on the same weights: Flax NNX's
          `nnx.RNN` over its LSTM/GRU cells (whole sequence, no feedback) and the Traveller as a custom NNX
          cell carrying its last positions; Equinox cells in `lax.scan`; torchax running the seed's torch
          loop under `jax.jit` (short T only). Each against its jsr row (`vs_jsr`); equinox and torchax
          come with the `bench` extra, and a missing one makes its rows "n/a" with the install hint. The
          peers run in a preset of their own (`--peers`, `BenchConfig.peers`), not in the default one.

For each (batch B, length T, forward or train step) case: the first call (compile/trace/capture
included) is timed on its own; then the cases of one (B, T, mode) cell are timed round-robin, each
sample averaging enough calls to last `min_sample_s`, until `repeats` samples (or `min_repeats` once
`case_budget_s` is spent). A figure is the median sample divided by T ("time per step"); ratios are
between medians of the same cell of the same run. The train step is value + grad + Adam update of
`-mean(net_utility(positions, returns))` (the trading task's loss) in both frameworks; the jsr rows take it
through `TrainStep`, as `fit` does (`jax_methods.library_case`).

Slow cases are skipped, and the reason recorded, when their predicted call time exceeds
`max_call_s` (eager methods are probed on a short sequence first; compiled ones are predicted from
the same method's previous cell), when their compiled memory would not fit, or when the suite's
`budget_s` is spent. Library code: nothing here prints; `run` (the CLI) does.

The package, one idea per module, each importing only those listed before it: `config` (BenchConfig,
its presets, the row keys), `machine` (what the results record of this machine), `context` (what every
row shares: the weights in both frameworks, the data, `Case`, `Skip`), the rows by subject:
`torch_methods`, `jax_methods` (each including its limit row), `vae_methods` and `peer_methods`; `methods` (the METHODS
table of every row), `engine` (warm-up, round-robin sampling, ratios: `run_suite`), `report` (headline,
criteria, Markdown, plots, JSON: `write_results`) and `cli` (`jax-scan-rnn bench`; `python -m
jax_scan_rnn.bench` runs its `main`).
"""
from jax_scan_rnn.bench.cli import add_arguments, config_from_args, main, run
from jax_scan_rnn.bench.config import (
    AUTO_KEY,
    LIMIT_CHUNK_ROWS,
    LIMIT_KEYS,
    MODES,
    PEER_METHODS,
    QUICK_METHODS,
    SCAN_UNROLLS,
    SCHEMA_VERSION,
    SEED_KEY,
    SEEDS,
    BenchConfig,
)
from jax_scan_rnn.bench.engine import run_suite, selected_methods
from jax_scan_rnn.bench.machine import host_kind
from jax_scan_rnn.bench.context import Skip
from jax_scan_rnn.bench.methods import METHODS, Method
from jax_scan_rnn.bench.report import criteria, headline, markdown, peer_groups, results_stem, write_results

__all__ = [
    # running and writing
    "BenchConfig", "run_suite", "selected_methods", "write_results", "results_stem", "host_kind",
    # reading results
    "headline", "criteria", "markdown", "peer_groups",
    # the rows
    "METHODS", "Method", "Skip", "AUTO_KEY", "SEED_KEY", "SEEDS", "LIMIT_KEYS", "LIMIT_CHUNK_ROWS",
    "QUICK_METHODS", "PEER_METHODS", "SCAN_UNROLLS", "MODES", "SCHEMA_VERSION",
    # the CLI
    "add_arguments", "config_from_args", "run", "main",
]
