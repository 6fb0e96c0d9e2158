"""Scan vs loop, measured: the same Traveller, the same weights, every way of running its feedback loop.

    jax-scan-rnn bench [--quick] [--out DIR]          # the CLI (wired through `add_arguments` / `run`)
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

For each (batch B, length T, forward or train step) case: the first call (compile/trace/capture
included) is timed on its own; then the cases of one (B, T, mode) cell are timed round-robin, each
sample averaging enough calls to last `min_sample_s`, until `repeats` samples (or `min_repeats` once
`case_budget_s` is spent). A figure is the median sample divided by T ("time per step"); ratios are
between medians of the same cell of the same run. The train step is value + grad + Adam update of
`-mean(net_utility(positions, returns))` (the trading task's loss) in both frameworks.

Slow cases are skipped, and the reason recorded, when their predicted call time exceeds
`max_call_s` (eager methods are probed on a short sequence first; compiled ones are predicted from
the same method's previous cell), when their compiled memory would not fit, or when the suite's
`budget_s` is spent. Library code: nothing here prints; `run` (the CLI) does.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import inspect
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BenchConfig",
    "Skip",
    "run_suite",
    "write_results",
    "host_kind",
    "add_arguments",
    "run",
    "METHODS",
]

SCHEMA_VERSION = 1
SEED_KEY = "torch-loop"  # the reference row of every "x faster than the seed" ratio (Traveller)
SEEDS = {"traveller": SEED_KEY, "vae-ss": "vae-ss-torch", "vae-greedy": "vae-greedy-torch"}  # per model
LIMIT_CHUNK_ROWS = 4096  # rows (batch x steps) per chunk of the XLA limit row
QUICK_METHODS = (  # the rows of the quick preset
    "torch-loop", "torch-cell", "torch-script", "torch-compile-scan", "torch-compile-loop", "torch-cuda-graph",
    "torch-lstm-seq", "jax-scan-u1", "jax-scan-u4", "jax-jit-loop", "jax-eager", "limit-xla", "limit-torch",
    "vae-ss-torch", "vae-ss-jax", "vae-greedy-torch", "vae-greedy-jax",
)
LIMIT_KEYS = ("limit-xla", "limit-torch")  # the "limit" of a cell is the faster of these two
SCAN_UNROLLS = (1, 4, 16)
AUTO_KEY = "jax-scan-auto"  # the library's own choice: the headline row
MODES = ("forward", "train")


# ----------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """What to measure and how long to try. `quick()` and `default()` are the two presets."""

    seq_lens: tuple[int, ...] = (100, 1000, 10000)  # T of the main grid
    batch_sizes: tuple[int, ...] = (1, 64, 1024)  # B of the main grid
    hidden_size: int = 64  # H of both LSTM layers
    num_layers: int = 2  # stacked LSTM layers
    num_inputs: int = 8  # F, features per step
    modes: tuple[str, ...] = MODES  # "forward" and/or "train"
    methods: tuple[str, ...] | None = None  # keys of METHODS to run (None: all); the seed and limits always run
    train_methods: tuple[str, ...] | None = None  # of those, the ones with a train-step row (None: all)
    train_batch_sizes: tuple[int, ...] | None = None  # B with train-step rows (None: all of batch_sizes)
    sweep_seq_lens: tuple[int, ...] = (10, 25, 50)  # short T at which the compile-bound loops are measured
    sweep_batch: int = 1  # B of that short-T sweep
    short_max_t: int = 100  # eager op-by-op JAX runs in the grid only up to this T
    vae_batch_sizes: tuple[int, ...] = (1, 64)  # B of the VAE decoder rows (empty: no VAE rows)
    vae_seq_lens: tuple[int, ...] = (100,)  # T of the VAE decoder rows (SMILES-length sequences)
    vae_vocab: int = 40  # V, tokens including <pad>, <sos>, <eos> (a SMILES vocabulary is ~40)
    vae_hidden: int = 256  # H of the VAE's GRUs (the VAE task's default)
    vae_latent: int = 64  # Z
    vae_layers: int = 1  # GRU layers
    repeats: int = 5  # timed samples per case (at most)
    min_repeats: int = 3  # timed samples per case (at least, unless the case is skipped)
    case_budget_s: float = 1.0  # stop sampling a case at min_repeats once its samples took this long
    min_sample_s: float = 0.02  # one sample averages enough calls to last this long
    max_call_s: float = 2.0  # skip a case whose predicted single call is longer
    # (B, T) cells whose ratios matter most (the issues' targets, and the seed's whole curve at B=1): there the
    # seed and limit rows, which every ratio needs, may take headline_cap_factor times max_call_s per call.
    headline_cells: tuple[tuple[int, int], ...] = ((1, 100), (1, 1000), (1, 10000), (64, 1000))
    headline_cap_factor: float = 5.0
    probe_t: int = 8  # T of the short probe that predicts an eager method's call time
    budget_s: float = 780.0  # start no new case after this many seconds (a safety net, not a target)
    memory_fraction: float = 0.5  # skip a JAX case whose compiled buffers exceed this share of free RAM
    dtype: str = "float32"  # "float32" or "bfloat16" (compute dtype of inputs; bf16 is for GPUs)
    matmul_precision: str = "highest"  # float32 on GPU: JAX matmul precision, and TF32 off in torch
    torch_threads: int | None = None  # torch intra-op threads on CPU; None: the faster of 1 and torch's default
    seed: int = 0  # weights and data
    label: str = "default"  # preset name, recorded in the results

    @classmethod
    def default(cls, **overrides) -> BenchConfig:
        """The full suite: T in {100, 1000, 10000}, B in {1, 64, 1024}; ~15 minutes on a 2-core CPU."""
        return dataclasses.replace(cls(), **overrides)

    @classmethod
    def quick(cls, **overrides) -> BenchConfig:
        """A short run (under 2 minutes on a 2-core CPU): T=1000, B in {1, 64} (train: B=1), fewer rows
        (QUICK_METHODS: no eager torch scan, no unroll=16, no whole-sequence JAX LSTM, no teacher forcing),
        fewer samples."""
        quick = cls(
            methods=QUICK_METHODS,
            seq_lens=(1000,),
            batch_sizes=(1, 64),
            train_batch_sizes=(1,),
            vae_batch_sizes=(64,),
            sweep_seq_lens=(5, 10),
            train_methods=(SEED_KEY, "torch-cell", "torch-script", "jax-scan-u1", "jax-scan-u4", AUTO_KEY, *LIMIT_KEYS),
            repeats=5,
            min_repeats=2,
            case_budget_s=0.3,
            max_call_s=1.5,
            headline_cap_factor=3.0,
            budget_s=75.0,
            label="quick",
        )
        return dataclasses.replace(quick, **overrides)

    def validate(self) -> None:
        def positive_ints(name: str, values) -> None:
            if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
                raise ValueError(f"{name}: expected a non-empty list of positive ints, got {values!r}")

        positive_ints("seq_lens", self.seq_lens)
        positive_ints("batch_sizes", self.batch_sizes)
        if self.sweep_seq_lens:
            positive_ints("sweep_seq_lens", self.sweep_seq_lens)
        if self.train_batch_sizes is not None:
            positive_ints("train_batch_sizes", self.train_batch_sizes)
        if self.vae_batch_sizes:
            positive_ints("vae_batch_sizes", self.vae_batch_sizes)
            positive_ints("vae_seq_lens", self.vae_seq_lens)
        for name in ("hidden_size", "num_layers", "num_inputs", "sweep_batch", "repeats", "min_repeats", "probe_t"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.min_repeats > self.repeats:
            raise ValueError(f"min_repeats: expected at most repeats ({self.repeats}), got {self.min_repeats}")
        bad_modes = [m for m in self.modes if m not in MODES]
        if not self.modes or bad_modes:
            raise ValueError(f"modes: expected a non-empty subset of {MODES}, got {self.modes!r}")
        for name in ("methods", "train_methods"):
            keys = getattr(self, name)
            unknown = [m for m in keys if m not in METHODS] if keys is not None else []
            if unknown:
                raise ValueError(f"{name}: unknown {unknown}; expected keys of {sorted(METHODS)}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype: expected 'float32' or 'bfloat16', got {self.dtype!r}")
        for name in ("case_budget_s", "min_sample_s", "max_call_s", "budget_s", "memory_fraction"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name}: expected a positive number, got {value!r}")
        if self.torch_threads is not None and (not isinstance(self.torch_threads, int) or self.torch_threads < 1):
            raise ValueError(f"torch_threads: expected a positive int or None, got {self.torch_threads!r}")


class Skip(Exception):
    """Raised by a case builder: this method does not apply here (the message says why)."""


def _accepts(fn: Callable, name: str) -> bool:
    """Whether `fn` (a function, or a class's constructor) takes a parameter called `name`."""
    try:
        # A class's own signature can be its metaclass's `__call__` (NNX modules): ask `__init__`.
        return name in inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------------
# The machine
# ----------------------------------------------------------------------------------------------------


def _gpu_name() -> str | None:
    import jax

    for dev in jax.devices():
        if dev.platform in ("gpu", "cuda", "rocm"):
            return dev.device_kind
    return None


def host_kind() -> str:
    """A short name for this machine's kind: `gpu-h200` from the first GPU JAX sees, else `cpu-<N>core`."""
    gpu = _gpu_name()
    if gpu:
        tokens = re.findall(r"[a-z]+\d+[a-z]*", gpu.lower())
        model = tokens[0] if tokens else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        return f"gpu-{model}"
    return f"cpu-{os.cpu_count() or 1}core"


def _available_memory() -> int | None:
    """Bytes of RAM available now (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


# ----------------------------------------------------------------------------------------------------
# The shared context: one set of weights in both frameworks, and the data of the current cell
# ----------------------------------------------------------------------------------------------------


class _Context:
    """Both models on the same weights, devices, dtypes and per-(B, T) data."""

    def __init__(self, cfg: BenchConfig):
        import jax
        import jax.numpy as jnp
        import torch
        from flax import nnx

        import jax_scan_rnn as jsr
        import torch_ref
        from jax_scan_rnn.data.trading import MarketConfig

        self.cfg = cfg
        self.torch = torch
        self.jax = jax
        self.jnp = jnp
        self.market = MarketConfig()
        self.torch_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.on_gpu = self.torch_device.type == "cuda"
        self.jax_device = jax.devices()[0]
        self.torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
        # bf16 in JAX: the library's own option where it has one (bf16 matmul operands, float32 state and
        # inputs: `Traveller(compute_dtype=bf16)`), else bf16 inputs (everything computed in bf16).
        self.jax_bf16 = None
        if cfg.dtype == "bfloat16":
            self.jax_bf16 = "compute_dtype" if _accepts(jsr.Traveller, "compute_dtype") else "inputs"
        self.jax_dtype = jnp.bfloat16 if self.jax_bf16 == "inputs" else jnp.float32

        torch.manual_seed(cfg.seed)
        model = torch_ref.Traveller(cfg.num_inputs, cfg.hidden_size, cfg.num_layers, 0.0)
        self.torch_model = model.to(self.torch_device, self.torch_dtype).eval()
        # Torch-layout numpy weights: the JAX twins load them, and the limit rows are written against them.
        self.np_weights = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        # The JAX twin keeps float32 parameters.
        self.graphdef, self.params, self.rest = self.jax_traveller()
        self.vae = None  # built on first use by the VAE rows
        self._data: dict[tuple, dict] = {}  # (B, T) -> arrays; the two most recent sizes are kept

    def jax_traveller(self, **options):
        """`nnx.split(jsr.Traveller(..., **options), nnx.Param, ...)` on the shared weights (eval mode)."""
        import jax_scan_rnn as jsr
        from flax import nnx

        cfg = self.cfg
        if self.jax_bf16 == "compute_dtype":
            options.setdefault("compute_dtype", self.jnp.bfloat16)
        model = jsr.Traveller(cfg.num_inputs, cfg.hidden_size, cfg.num_layers, 0.0, rngs=nnx.Rngs(cfg.seed),
                              **options)
        jsr.load_torch_state_dict(model, self.np_weights)
        model.eval()
        return nnx.split(model, nnx.Param, ...)

    # -- data ------------------------------------------------------------------------------------
    def data(self, batch: int, steps: int) -> dict:
        """Standard-normal features [B, T, F], returns [B, T, 2] and stand-in states (numpy float32).

        Timings do not depend on the values; the same arrays feed both frameworks. One (B, T) is kept.
        """
        key = (batch, steps)
        if key not in self._data:
            while len(self._data) >= 2:
                self._data.pop(next(iter(self._data)))
            rng = np.random.default_rng([self.cfg.seed, batch, steps])
            self._data[key] = {
                "x": rng.standard_normal((batch, steps, self.cfg.num_inputs), dtype=np.float32),
                "r": rng.standard_normal((batch, steps, 2), dtype=np.float32),
            }
        return self._data[key]

    def limit_inputs(self, batch: int, steps: int) -> dict:
        """Inputs of the limit rows: fed-back positions, previous h and c given, not computed [B, T, .]."""
        d = self.data(batch, steps)
        if "h_prev" not in d:
            rng = np.random.default_rng([self.cfg.seed, batch, steps, 1])
            d["fb"] = np.tanh(d["r"])
            d["h_prev"] = np.tanh(rng.standard_normal((batch, steps, self.cfg.hidden_size), dtype=np.float32))
            d["c_prev"] = rng.standard_normal((batch, steps, self.cfg.hidden_size), dtype=np.float32)
        return d

    def t(self, array: np.ndarray):
        """numpy -> torch tensor on the torch device, in the compute dtype."""
        return self.torch.from_numpy(array).to(self.torch_device, self.torch_dtype)

    def j(self, array: np.ndarray):
        """numpy -> jax array on the default device, in the compute dtype."""
        return self.jax.device_put(self.jnp.asarray(array, self.jax_dtype), self.jax_device)

    # -- synchronisation -------------------------------------------------------------------------
    def torch_sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def torch_loss(self, positions, returns):
        from jax_scan_rnn.data.trading import net_utility

        return -net_utility(positions.float(), returns.float(), self.market).mean()

    def jax_loss(self, positions, returns):
        from jax_scan_rnn.data.trading import net_utility

        return -net_utility(positions.astype(self.jnp.float32), returns.astype(self.jnp.float32), self.market).mean()


@dataclass
class _Case:
    """One (method, B, T, mode): `call()` runs once and waits for the result."""

    call: Callable[[], Any]
    output: Callable[[Any], np.ndarray] | None = None  # first call's result -> numpy [B, T, 2]
    compile_s: float | None = None  # ahead-of-time compile (JAX) or capture (CUDA graph), if measured apart
    memory: dict | None = None  # static memory figures known once built
    info: dict = field(default_factory=dict)  # extra fields for the row (e.g. the unroll used)
    memory_probe: Callable[[], dict | None] | None = None  # after the first call (e.g. torch CUDA peak)


# ----------------------------------------------------------------------------------------------------
# torch builders
# ----------------------------------------------------------------------------------------------------


def _torch_case(ctx: _Context, batch: int, steps: int, mode: str, forward: Callable) -> _Case:
    """A case from `forward(model, x) -> positions [B, T, 2]`: no-grad forward, or one Adam step."""
    torch = ctx.torch
    d = ctx.data(batch, steps)
    x, r = ctx.t(d["x"]), ctx.t(d["r"])
    if mode == "forward":
        model = ctx.torch_model

        def call():
            with torch.no_grad():
                out = forward(model, x)
            ctx.torch_sync()
            return out

        return _Case(call, output=lambda out: out.float().cpu().numpy())
    model = copy.deepcopy(ctx.torch_model).train()  # training must not move the shared weights
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = ctx.torch_loss(forward(model, x), r)
        loss.backward()
        opt.step()
        ctx.torch_sync()

    return _Case(step)


def _quiet(fn: Callable) -> Callable:
    """`fn` with torch's deprecation/non-leaf `.grad` warnings silenced (they are torch's noise here)."""

    def wrapped(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=r".*\.grad attribute of a Tensor that is not a leaf.*")
            return fn(*args, **kwargs)

    return wrapped


def _build_torch_method(method: str) -> Callable:
    def build(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
        import torch_ref

        if method == "scan" and not torch_ref.traveller.scan_available():
            raise Skip(f"torch {ctx.torch.__version__} has no torch._higher_order_ops.scan")
        return _torch_case(ctx, batch, steps, mode, _quiet(lambda m, x: m(x, method=method, layout="batch")))

    return build


def _build_torch_compiled(method: str) -> Callable:
    def build(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
        import torch_ref
        from torch_ref.traveller import compiled_loop

        if method == "scan" and not torch_ref.traveller.scan_available():
            raise Skip(f"torch {ctx.torch.__version__} has no torch._higher_order_ops.scan")
        runs: dict[int, Callable] = {}

        def forward(model, x):
            # One compiled wrapper per model object (the train case trains a copy).
            run = runs.get(id(model))
            if run is None:
                run = runs[id(model)] = compiled_loop(model, method=method)
            return run(x, layout="batch")

        return _torch_case(ctx, batch, steps, mode, _quiet(forward))

    return build


def _build_torch_lstm_seq(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    """nn.LSTM over the whole sequence: the fed-back positions replaced by given values (no feedback)."""
    torch = ctx.torch
    fb = ctx.t(ctx.limit_inputs(batch, steps)["fb"])

    def forward(model, x):
        out, _ = model.lstm_layers(torch.cat([fb, x], dim=2))
        return model.activation(model.output_layer(out))

    return _torch_case(ctx, batch, steps, mode, forward)


def _build_cuda_graph(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    """The cell loop captured once in a CUDA graph, replayed per call (forward), or graphed fwd+bwd (train)."""
    torch = ctx.torch
    if not ctx.on_gpu:
        raise Skip("needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
    from torch_ref.traveller import _traveller_loop

    hidden = ctx.cfg.hidden_size
    d = ctx.data(batch, steps)
    xs = ctx.t(d["x"]).transpose(0, 1).contiguous()  # [T, B, F], the graph's static input
    t0 = time.perf_counter()
    if mode == "forward":
        weights = [w.detach() for w in ctx.torch_model.flat_weights()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            _traveller_loop(xs, weights, hidden, None)  # warm-up outside the capture, as CUDA graphs need
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = _traveller_loop(xs, weights, hidden, None)
        torch.cuda.synchronize()
        capture_s = time.perf_counter() - t0

        def call():
            graph.replay()
            torch.cuda.synchronize()
            return static_out

        return _Case(call, output=lambda out: out.transpose(0, 1).float().cpu().numpy(), compile_s=capture_s)

    model = copy.deepcopy(ctx.torch_model).train()
    params = model.flat_weights()
    r = ctx.t(d["r"])

    def loop(x, *weights):
        return _traveller_loop(x, list(weights), hidden, None)

    graphed = torch.cuda.make_graphed_callables(loop, (xs, *params))
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        positions = graphed(xs, *params).transpose(0, 1)
        ctx.torch_loss(positions, r).backward()
        opt.step()
        torch.cuda.synchronize()

    return _Case(step, compile_s=capture_s)


def _torch_limit_forward(torch, w: dict, num_layers: int, x, fb, h_prev, c_prev):
    """The Traveller's FLOPs for all steps at once, with given fed-back positions and previous states."""
    import torch.nn.functional as F

    z = torch.cat([fb, x], dim=2)  # [B, T, 2 + F]
    for k in range(num_layers):
        gates = F.linear(z, w[f"lstm_layers.weight_ih_l{k}"], w[f"lstm_layers.bias_ih_l{k}"]) + F.linear(
            h_prev, w[f"lstm_layers.weight_hh_l{k}"], w[f"lstm_layers.bias_hh_l{k}"]
        )
        i, f, g, o = gates.chunk(4, dim=2)
        c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
        z = torch.sigmoid(o) * torch.tanh(c)
    return torch.tanh(F.linear(z, w["output_layer.weight"], w["output_layer.bias"]))


def _build_torch_limit(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    torch = ctx.torch
    d = ctx.limit_inputs(batch, steps)
    fb, hp, cp = ctx.t(d["fb"]), ctx.t(d["h_prev"]), ctx.t(d["c_prev"])
    layers = ctx.cfg.num_layers

    def forward(model, x):
        w = dict(model.named_parameters())
        return _torch_limit_forward(torch, w, layers, x, fb, hp, cp)

    return _torch_case(ctx, batch, steps, mode, forward)


# ----------------------------------------------------------------------------------------------------
# JAX builders
# ----------------------------------------------------------------------------------------------------


def _jax_compiled_case(ctx: _Context, fn: Callable, args: tuple, *, train: bool, output: bool,
                       as_float: bool = True) -> _Case:
    """AOT-compile `fn(*args)` (timed apart), check its memory fits, and call the executable.

    For train, `fn(params, opt_state, *rest) -> (params, opt_state, loss)` and the state is threaded.
    """
    jax = ctx.jax
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    memory = _xla_memory(compiled)
    need = (memory or {}).get("temp_bytes", 0) + (memory or {}).get("argument_bytes", 0)
    avail = _available_memory()
    if not ctx.on_gpu and avail is not None and need > ctx.cfg.memory_fraction * avail:
        raise Skip(
            f"compiled buffers need {need / 2**30:.1f} GiB > {ctx.cfg.memory_fraction:.0%} of the "
            f"{avail / 2**30:.1f} GiB available"
        )
    if train:
        state = list(args[:2])
        rest = args[2:]

        def call():
            out = compiled(state[0], state[1], *rest)
            jax.block_until_ready(out)
            state[0], state[1] = out[0], out[1]

        return _Case(call, compile_s=compile_s, memory=memory)

    def call():
        return jax.block_until_ready(compiled(*args))

    def to_numpy(out):
        return np.asarray(out, dtype=np.float32) if as_float else np.asarray(out)

    return _Case(call, output=to_numpy if output else None, compile_s=compile_s, memory=memory)


def _xla_memory(compiled) -> dict | None:
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if stats is None:
        return None
    return {
        "kind": "xla-compiled",
        "temp_bytes": int(stats.temp_size_in_bytes),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
    }


def _jax_train_fn(ctx: _Context, positions_fn: Callable) -> tuple[Callable, Any]:
    """`step(params, opt_state, x, r)` = value_and_grad of the trading loss + one Adam update."""
    import optax

    jax = ctx.jax
    tx = optax.adam(1e-4)

    def step(params, opt_state, x, r, *extra):
        def loss(p):
            return ctx.jax_loss(positions_fn(p, x, *extra), r)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step, tx


def _scan_positions(ctx: _Context, unroll) -> Callable:
    from flax import nnx

    graphdef, rest = ctx.graphdef, ctx.rest

    def positions(params, x):
        return nnx.merge(graphdef, params, rest).positions(x, unroll=unroll)

    return positions


def _jax_case_from_positions(ctx: _Context, batch: int, steps: int, mode: str, positions: Callable,
                             params=None, extra: tuple = ()) -> _Case:
    d = ctx.data(batch, steps)
    x = ctx.j(d["x"])
    params = ctx.params if params is None else params
    if mode == "forward":
        return _jax_compiled_case(ctx, positions, (params, x, *extra), train=False, output=True)
    step, tx = _jax_train_fn(ctx, positions)
    return _jax_compiled_case(ctx, step, (params, tx.init(params), x, ctx.j(d["r"]), *extra), train=True,
                              output=False)


def _build_jax_scan(unroll) -> Callable:
    def build(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
        case = _jax_case_from_positions(ctx, batch, steps, mode, _scan_positions(ctx, unroll))
        if unroll == "auto":  # record what it chose
            from jax_scan_rnn.scan import auto_unroll

            case.info["unroll"] = f"auto ({auto_unroll(batch)})"
        else:
            case.info["unroll"] = unroll
        return case

    return build


def _jax_loop_positions(ctx: _Context) -> Callable:
    """The seed's loop in JAX: a Python `for` over T steps (per-step input projection, as the seed)."""
    from flax import nnx

    jnp = ctx.jnp
    graphdef, rest = ctx.graphdef, ctx.rest

    def positions(params, x):
        model = nnx.merge(graphdef, params, rest)
        lstm = model.lstm_layers
        batch, steps, _ = x.shape
        first = lstm.layers[0]
        w_ih = first.w_ih[...].astype(x.dtype)
        w_fb, w_u = w_ih[:2], w_ih[2:]
        b_ih = first.b_ih[...].astype(x.dtype)
        carries = lstm.unstack_state(lstm.initial_state(batch, x.dtype))
        fb = jnp.zeros((batch, 2), x.dtype)
        ys = []
        for t in range(steps):
            carries, h = lstm.step(carries, x[:, t] @ w_u + b_ih + fb @ w_fb)
            fb = jnp.tanh(model.output_layer(h))
            ys.append(fb)
        return jnp.stack(ys, axis=1)

    return positions


def _build_jax_jit_loop(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    return _jax_case_from_positions(ctx, batch, steps, mode, _jax_loop_positions(ctx))


def _build_jax_eager(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    """The same Python loop, not jitted: every op is dispatched from Python, one at a time."""
    jax = ctx.jax
    positions = _jax_loop_positions(ctx)
    d = ctx.data(batch, steps)
    x = ctx.j(d["x"])
    if mode == "forward":
        return _Case(lambda: jax.block_until_ready(positions(ctx.params, x)),
                     output=lambda out: np.asarray(out, dtype=np.float32))
    step, tx = _jax_train_fn(ctx, positions)
    state = [ctx.params, tx.init(ctx.params)]
    r = ctx.j(d["r"])

    def call():
        out = step(state[0], state[1], x, r)
        jax.block_until_ready(out)
        state[0], state[1] = out[0], out[1]

    return _Case(call)


def _build_jax_lstm_seq(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    """jsr.LSTM over the whole sequence (one lax.scan per layer), fed-back positions given: no feedback."""
    from flax import nnx

    jnp = ctx.jnp
    graphdef, rest = ctx.graphdef, ctx.rest

    def positions(params, x, fb):
        model = nnx.merge(graphdef, params, rest)
        out, _ = model.lstm_layers(jnp.concatenate([fb, x], axis=2))
        return jnp.tanh(model.output_layer(out))

    fb = ctx.j(ctx.limit_inputs(batch, steps)["fb"])
    return _jax_case_from_positions(ctx, batch, steps, mode, positions, extra=(fb,))


def _limit_chunk(batch: int, steps: int, rows: int = LIMIT_CHUNK_ROWS) -> int:
    """Steps per chunk of the XLA limit: the largest divisor of T with batch * chunk <= rows (at least 1)."""
    target = max(1, rows // batch)
    return max(d for d in range(1, min(steps, target) + 1) if steps % d == 0)


def _build_jax_limit(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    """The limit in XLA: per chunk of steps, every step's matmuls and gates at once; chunks independent.

    One matmul over all B*T rows is what "no time dependency" means, but on a CPU its [B*T, 4H]
    operands spill out of cache and the memory traffic, not the FLOPs, sets the time; chunks of
    ~LIMIT_CHUNK_ROWS rows (a `lax.map`, i.e. a loop with no dependency between iterations) keep the
    operands in cache. The previous states are given in chunk-major layout, so no transpose is timed.
    """
    jax, jnp = ctx.jax, ctx.jnp
    layers = ctx.cfg.num_layers
    params = {k: jnp.asarray(v) for k, v in ctx.np_weights.items()}
    d = ctx.limit_inputs(batch, steps)
    chunk = _limit_chunk(batch, steps)
    n = steps // chunk
    sigmoid = jax.nn.sigmoid
    # bf16 as the library does it (compute_dtype): bf16 matmul operands, float32 accumulation and state.
    operands = jnp.bfloat16 if ctx.jax_bf16 == "compute_dtype" else None

    def block(w, z, h_prev, c_prev):  # z [..., 2 + F], h_prev, c_prev [..., H] -> positions [..., 2]
        for k in range(layers):
            def lin(a, name, k=k):
                weight = w[f"lstm_layers.weight_{name}_l{k}"].T
                if operands is not None:
                    product = jnp.matmul(a.astype(operands), weight.astype(operands), preferred_element_type=a.dtype)
                else:
                    product = a @ weight.astype(a.dtype)
                return product + w[f"lstm_layers.bias_{name}_l{k}"].astype(a.dtype)

            i, f, g, o = jnp.split(lin(z, "ih") + lin(h_prev, "hh"), 4, axis=-1)
            c = sigmoid(f) * c_prev + sigmoid(i) * jnp.tanh(g)
            z = sigmoid(o) * jnp.tanh(c)
        return jnp.tanh(z @ w["output_layer.weight"].T.astype(z.dtype) + w["output_layer.bias"].astype(z.dtype))

    def to_chunks(a):  # [B, T, k] -> [T/c, B, c, k]
        return a.reshape(a.shape[0], n, chunk, a.shape[-1]).swapaxes(0, 1)

    def positions(w, x, fb, h_prev, c_prev):  # h_prev, c_prev already [T/c, B, c, H]
        z = to_chunks(jnp.concatenate([fb, x], axis=2))
        out = jax.lax.map(lambda args: block(w, *args), (z, h_prev, c_prev))  # [T/c, B, c, 2]
        return out.swapaxes(0, 1).reshape(batch, steps, 2)

    def chunk_major(a):
        return np.ascontiguousarray(a.reshape(batch, n, chunk, a.shape[-1]).swapaxes(0, 1))

    extra = (ctx.j(d["fb"]), ctx.j(chunk_major(d["h_prev"])), ctx.j(chunk_major(d["c_prev"])))
    case = _jax_case_from_positions(ctx, batch, steps, mode, positions, params=params, extra=extra)
    case.info["limit_chunk_steps"] = chunk
    return case


def _build_jax_remat(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
    """lax.scan with chunked rematerialisation (the library's `remat_chunk`), chunk ~ sqrt(T), unroll 1."""
    import jax_scan_rnn as jsr
    from flax import nnx

    if not _accepts(jsr.Traveller, "remat_chunk"):
        raise Skip("this jsr.Traveller has no remat_chunk option")
    chunk = max(1, round(math.sqrt(steps)))
    graphdef, params, rest = ctx.jax_traveller(remat_chunk=chunk)

    def positions(p, x):
        return nnx.merge(graphdef, p, rest).positions(x, unroll=1)

    case = _jax_case_from_positions(ctx, batch, steps, mode, positions, params=params)
    case.info.update(unroll=1, remat_chunk=chunk)
    return case


# ----------------------------------------------------------------------------------------------------
# VAE decoder builders: scheduled sampling (feedback of the argmax token, per-token coins), teacher
# forcing (no feedback: the bound), greedy generation (free running)
# ----------------------------------------------------------------------------------------------------


class _VAEContext:
    """torch_ref.SeqVAE and jsr.SeqVAE on the same weights, and per-(B, T) token data."""

    def __init__(self, ctx: _Context):
        import jax_scan_rnn as jsr
        import torch_ref
        from flax import nnx

        cfg = ctx.cfg
        if not hasattr(jsr, "SeqVAE") or not hasattr(torch_ref, "SeqVAE"):
            raise Skip("needs jsr.SeqVAE and torch_ref.SeqVAE")
        if cfg.dtype != "float32":
            raise Skip("float32 only")
        sizes = (cfg.vae_vocab, cfg.vae_hidden, cfg.vae_latent, cfg.vae_layers)
        ctx.torch.manual_seed(cfg.seed)
        model = torch_ref.SeqVAE(*sizes)
        self.torch_model = model.to(ctx.torch_device).eval()
        jmodel = jsr.SeqVAE(*sizes, rngs=nnx.Rngs(cfg.seed))
        jsr.load_torch_state_dict(jmodel, {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
        jmodel.eval()
        self.graphdef, self.params, self.rest = nnx.split(jmodel, nnx.Param, ...)
        self.cfg = cfg
        self._data: dict[tuple, dict] = {}

    def data(self, batch: int, steps: int) -> dict:
        """Full-length sequences (random tokens, then <eos>), one coin per token (p = 0.5), z and eps."""
        key = (batch, steps)
        if key not in self._data:
            rng = np.random.default_rng([self.cfg.seed, batch, steps, 2])
            tokens = rng.integers(3, self.cfg.vae_vocab, (batch, steps))
            tokens[:, -1] = 2  # <eos>
            self._data = {key: {
                "tokens": tokens,
                "lengths": np.full((batch,), steps),
                "mask": rng.random((batch, steps)) < 0.5,
                "z": rng.standard_normal((batch, self.cfg.vae_latent), dtype=np.float32),
                "eps": rng.standard_normal((batch, self.cfg.vae_latent), dtype=np.float32),
            }}
        return self._data[key]


def _build_vae(task: str, framework: str) -> Callable:
    """Builder of a VAE row: task "ss" (scheduled sampling), "tf" (teacher forcing) or "greedy"."""

    def build(ctx: _Context, batch: int, steps: int, mode: str) -> _Case:
        if ctx.vae is None:
            ctx.vae = _VAEContext(ctx)
        vae = ctx.vae
        d = vae.data(batch, steps)
        return (_vae_torch if framework == "torch" else _vae_jax)(ctx, vae, d, task, mode)

    return build


def _vae_torch(ctx: _Context, vae: _VAEContext, d: dict, task: str, mode: str) -> _Case:
    torch = ctx.torch
    dev = ctx.torch_device
    tokens, lengths = torch.from_numpy(d["tokens"]).to(dev), torch.from_numpy(d["lengths"]).to(dev)
    mask = torch.from_numpy(d["mask"]).to(dev) if task == "ss" else None
    z, eps = torch.from_numpy(d["z"]).to(dev), torch.from_numpy(d["eps"]).to(dev)
    if mode == "forward":
        model = vae.torch_model

        def call():
            with torch.no_grad():
                if task == "greedy":
                    out = model.generate(z, tokens.shape[1])
                else:
                    out = model.decode(z, tokens, replace_mask=mask)
            ctx.torch_sync()
            return out

        return _Case(call, output=lambda out: out.cpu().numpy())
    model = copy.deepcopy(vae.torch_model).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        model.loss(tokens, lengths, eps=eps, replace_mask=mask)["total"].backward()
        opt.step()
        ctx.torch_sync()

    return _Case(step)


def _vae_jax(ctx: _Context, vae: _VAEContext, d: dict, task: str, mode: str) -> _Case:
    import optax
    from flax import nnx

    jax, jnp = ctx.jax, ctx.jnp
    graphdef, rest = vae.graphdef, vae.rest
    tokens, lengths = jnp.asarray(d["tokens"], jnp.int32), jnp.asarray(d["lengths"], jnp.int32)
    mask = jnp.asarray(d["mask"]) if task == "ss" else None
    z, eps = jnp.asarray(d["z"]), jnp.asarray(d["eps"])
    steps = d["tokens"].shape[1]
    if mode == "forward":
        if task == "greedy":
            def fn(p, z):
                return nnx.merge(graphdef, p, rest).generate(z, steps)

            args = (vae.params, z)
        else:
            def fn(p, z, tokens, mask):
                return nnx.merge(graphdef, p, rest).decode(z, tokens, replace_mask=mask)

            args = (vae.params, z, tokens, mask)
        return _jax_compiled_case(ctx, fn, args, train=False, output=True, as_float=False)
    tx = optax.adam(1e-4)

    def step(p, opt_state, tokens, lengths, eps, mask):
        def loss(p):
            return nnx.merge(graphdef, p, rest).loss(tokens, lengths, eps=eps, replace_mask=mask)["total"]

        value, grads = jax.value_and_grad(loss)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, value

    return _jax_compiled_case(ctx, step, (vae.params, tx.init(vae.params), tokens, lengths, eps, mask),
                              train=True, output=False)


# ----------------------------------------------------------------------------------------------------
# The method table
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """One way of running the Traveller. `kind`: "eager" (probed on a short T first) or "compiled"."""

    key: str
    label: str
    framework: str  # "torch" | "jax" | "both"
    kind: str  # "eager" | "compiled"
    build: Callable[[_Context, int, int, str], _Case]
    role: str = "method"  # "seed", "limit", "bound" (no feedback: a lower bound), or "method"
    where: str = "grid"  # "grid": the main grid; "sweep": only the short-T sweep; "both"
    max_t: int | None = None  # grid cells with larger T are skipped ("short T only")
    modes: tuple[str, ...] = MODES  # the modes it has rows for
    modes_note: str = ""  # why a mode is missing
    gpu_only: bool = False
    model: str = "traveller"  # "traveller", "vae-ss" (scheduled-sampling decoder), "vae-greedy" (generation)
    note: str = ""  # one line for the README / table: what the row means


def _methods() -> dict[str, Method]:
    rows = [
        Method(SEED_KEY, "torch: seed loop (nn.LSTM per step)", "torch", "eager", _build_torch_method("loop"),
               role="seed", where="both",
               note="the seed's code: a Python loop calling nn.LSTM on one step, torch.cat, Linear, tanh"),
        Method("torch-cell", "torch: LSTM-cell loop", "torch", "eager", _build_torch_method("cell"),
               note="the same Python loop over per-step cell math (F.linear + gates): no nn.LSTM call per step"),
        Method("torch-script", "torch: jit.script(loop)", "torch", "eager", _build_torch_method("script"),
               note="TorchScript of that loop function, the working form of the seed answer's script_method"),
        Method("torch-scan", "torch: _higher_order_ops.scan, eager", "torch", "eager", _build_torch_method("scan"),
               note="the private scan prototype without compile: still a Python loop (through Dynamo)"),
        Method("torch-compile-scan", "torch: compile(scan)", "torch", "compiled", _build_torch_compiled("scan"),
               note="torch.compile (inductor) of the scan: one graph node for the loop; compiled per cell"),
        Method("torch-compile-loop", "torch: compile(loop), short T", "torch", "compiled",
               _build_torch_compiled("cell"), where="sweep", modes=("forward",),
               modes_note="forward only (its compile of the unrolled backward grows with T as well)",
               note="torch.compile of the Python loop: Dynamo unrolls T steps, so compile time grows with T"),
        Method("torch-cuda-graph", "torch: CUDA graph of the loop", "torch", "compiled", _build_cuda_graph,
               gpu_only=True, note="the cell loop captured once as a CUDA graph and replayed (GPU only)"),
        Method("torch-lstm-seq", "torch: nn.LSTM whole sequence, no feedback", "torch", "eager",
               _build_torch_lstm_seq, role="bound",
               note="lower bound: one nn.LSTM call over all T (cuDNN on GPU), positions given, not fed back"),
    ]
    for u in SCAN_UNROLLS:
        rows.append(Method(f"jax-scan-u{u}", f"jax: lax.scan, unroll={u}", "jax", "compiled", _build_jax_scan(u),
                           where="both" if u == 1 else "grid",
                           note=f"jsr.Traveller: one jitted lax.scan over T, {u} step(s) per loop iteration"))
    rows += [
        Method(AUTO_KEY, "jax: lax.scan, unroll=auto", "jax", "compiled", _build_jax_scan("auto"),
               note="the library's default: unroll chosen from measurements (jax_scan_rnn.scan.auto_unroll)"),
        Method("jax-jit-loop", "jax: jit(Python loop), short T", "jax", "compiled", lambda *a: _build_jax_jit_loop(*a),
               where="sweep", modes=("forward",),
               modes_note="forward only (its compile of the unrolled backward grows with T as well)",
               note="a Python for-loop traced by jax.jit: unrolled into T copies, so compile time grows with T"),
        Method("jax-eager", "jax: eager op-by-op, short T", "jax", "eager", lambda *a: _build_jax_eager(*a),
               where="both", max_t=100, modes=("forward",),
               modes_note="forward only: an eager value_and_grad of the loop costs ~0.2 s per step on a CPU",
               note="the same loop without jit: every op dispatched from Python"),
        Method("jax-scan-remat", "jax: lax.scan, remat chunks of ~sqrt(T)", "jax", "compiled",
               lambda *a: _build_jax_remat(*a), modes=("train",),
               modes_note="train only: rematerialisation changes what the backward pass stores",
               note="jsr.Traveller(remat_chunk=round(sqrt(T))), unroll=1: training memory ~sqrt(T) instead of ~T"),
        Method("jax-lstm-seq", "jax: jsr.LSTM whole sequence, no feedback", "jax", "compiled",
               lambda *a: _build_jax_lstm_seq(*a), role="bound",
               note="jsr.LSTM over all T (a lax.scan per layer), positions given, not fed back"),
        Method("limit-xla", "limit: batched matmuls (XLA)", "jax", "compiled", lambda *a: _build_jax_limit(*a),
               role="limit", note="the same FLOPs with the time dependency removed, jitted JAX, in chunks of "
                                  f"~{LIMIT_CHUNK_ROWS} rows (B x steps) so that the operands stay in cache"),
        Method("limit-torch", "limit: batched matmuls (torch)", "torch", "eager", lambda *a: _build_torch_limit(*a),
               role="limit", note="the same FLOPs with the time dependency removed, torch, all B x T rows at once"),
    ]
    rows += [
        Method("vae-ss-torch", "torch: decoder loop, scheduled sampling", "torch", "eager", _build_vae("ss", "torch"),
               role="seed", model="vae-ss",
               note="torch_ref.SeqVAE.decode(z, tokens, replace_mask): a Python loop over nn.GRU steps; train: "
                    "its loss (encoder + decoder + KL)"),
        Method("vae-ss-jax", "jax: decoder scan, scheduled sampling", "jax", "compiled", _build_vae("ss", "jax"),
               model="vae-ss", note="jsr.SeqVAE.decode with the same replace_mask: one jitted lax.scan"),
        Method("vae-tf-torch", "torch: teacher forcing, no feedback", "torch", "eager", _build_vae("tf", "torch"),
               role="bound", model="vae-ss", note="decode(z, tokens) without replace_mask: one nn.GRU call"),
        Method("vae-tf-jax", "jax: teacher forcing, no feedback", "jax", "compiled", _build_vae("tf", "jax"),
               role="bound", model="vae-ss", note="jsr.SeqVAE.decode without replace_mask"),
        Method("vae-greedy-torch", "torch: greedy generation loop", "torch", "eager", _build_vae("greedy", "torch"),
               role="seed", model="vae-greedy", modes=("forward",), modes_note="generation has no gradient",
               note="torch_ref.SeqVAE.generate(z, T): argmax fed back as a one-hot, a Python loop"),
        Method("vae-greedy-jax", "jax: greedy generation scan", "jax", "compiled", _build_vae("greedy", "jax"),
               model="vae-greedy", modes=("forward",), modes_note="generation has no gradient",
               note="jsr.SeqVAE.generate(z, T), jitted: one lax.scan"),
    ]
    return {m.key: m for m in rows}


METHODS: dict[str, Method] = _methods()


# ----------------------------------------------------------------------------------------------------
# The measuring engine
# ----------------------------------------------------------------------------------------------------


def _calibrate_torch_threads(ctx: _Context) -> dict:
    """On CPU, time the seed loop (B=1) and the cell loop (B=64) with 1 thread and with torch's default.

    On a busy machine, torch's OpenMP threads wait for each other and the per-step loops get several
    times slower with 2 threads than with 1; the benchmark gives torch the faster setting, and says so.
    """
    torch = ctx.torch
    default = torch.get_num_threads()
    if ctx.cfg.torch_threads is not None:
        torch.set_num_threads(ctx.cfg.torch_threads)
        return {"chosen": ctx.cfg.torch_threads, "default": default, "how": "given"}
    if ctx.on_gpu or default == 1:
        return {"chosen": default, "default": default, "how": "torch default"}
    timings = {}
    for threads in sorted({1, default}):
        torch.set_num_threads(threads)
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            for method, batch in (("loop", 1), ("cell", 64)):
                x = ctx.t(ctx.data(batch, 20)["x"])
                with torch.no_grad():
                    ctx.torch_model(x, method=method, layout="batch")
            samples.append(time.perf_counter() - t0)
        timings[threads] = statistics.median(samples)
    chosen = min(timings, key=timings.get)
    torch.set_num_threads(chosen)
    return {"chosen": chosen, "default": default, "how": "calibrated",
            "calibration_s": {str(k): round(v, 5) for k, v in timings.items()}}


def _base_row(method: Method, model: str, mode: str, batch: int, steps: int, section: str) -> dict:
    return {
        "model": model, "method": method.key, "label": method.label, "framework": method.framework,
        "role": method.role, "mode": mode, "B": batch, "T": steps, "section": section,
        "status": "pending", "reason": None, "per_step_us": None, "call_s": None, "call_s_min": None,
        "samples": [], "calls_per_sample": None, "first_call_s": None, "compile_s": None, "memory": None,
        "max_abs_diff": None, "speedup_vs_seed": None, "x_limit": None,
    }


class _Engine:
    def __init__(self, cfg: BenchConfig, ctx: _Context, progress: Callable[[str], None] | None):
        self.cfg = cfg
        self.ctx = ctx
        self.progress = progress or (lambda message: None)
        self.start = time.perf_counter()
        self.history: dict[tuple, float] = {}  # (method, mode, B, T) -> seconds per step

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def cap(self, method: Method, batch: int, steps: int) -> float:
        """Longest predicted call allowed; the seed and limit rows get longer in the headline cells."""
        headline = (batch, steps) in self.cfg.headline_cells and method.role in ("seed", "limit")
        factor = self.cfg.headline_cap_factor if headline else 1.0
        return self.cfg.max_call_s * factor

    def predict(self, key: str, mode: str, batch: int, steps: int) -> float | None:
        """Predicted seconds per call from this method's earlier cells (None: no earlier cell).

        From the same B: the smallest time per step seen at a shorter T, times T (the smallest, so that
        one disturbed measurement does not skip everything after it). Else from a smaller B at this T,
        scaled up linearly in B beyond 32 rows.
        """
        same_b = [s for (k, m, b, t), s in self.history.items() if (k, m, b) == (key, mode, batch) and t < steps]
        if same_b:
            return min(same_b) * steps
        smaller_b = [(b, s) for (k, m, b, t), s in self.history.items() if (k, m, t) == (key, mode, steps) and b < batch]
        if smaller_b:
            b, s = max(smaller_b)
            return s * steps * max(1.0, batch / max(b, 32))
        return None

    def cell(self, methods: Sequence[Method], model: str, batch: int, steps: int, mode: str, section: str) -> list[dict]:
        """Measure every method on one (B, T, mode): build and warm up each, then sample round-robin."""
        rows, live = [], []
        # Forget every graph Dynamo compiled so far: each cell's first calls compile from scratch (the
        # compile times are comparable across cells) and no cache limit is reached over the suite.
        self.ctx.torch._dynamo.reset()
        for method in methods:
            row = _base_row(method, model, mode, batch, steps, section)
            rows.append(row)
            reason = self.static_skip(method, batch, steps, mode, section)
            if reason:
                row["status"], row["reason"] = reason
                row["mode_na"] = mode not in method.modes  # tables leave such rows out
                continue
            if self.elapsed() > self.cfg.budget_s:
                row["status"], row["reason"] = "skipped", f"suite budget of {self.cfg.budget_s:.0f} s spent"
                continue
            cap = self.cap(method, batch, steps)
            predicted = self.predict(method.key, mode, batch, steps)
            # Eager methods are probed at this B below (which also sees fixed per-call costs that a
            # per-step extrapolation misses); the history only skips them when clearly hopeless.
            hopeless = cap * (10 if method.kind == "eager" else 1)
            if predicted is not None and predicted > hopeless:
                row["status"] = "skipped"
                row["reason"] = f"predicted {_fmt_s(predicted)} per call > {_fmt_s(cap)} cap"
                continue
            self.progress(f"[{self.elapsed():6.0f} s] {mode:<7} B={batch:<5} T={steps:<6} {method.label}")
            try:
                case = self.build_and_warm(method, row, batch, steps, mode, cap)
            except Skip as why:
                row["status"] = "skipped" if str(why).startswith(("predicted", "compiled buffers")) else "n/a"
                row["reason"] = str(why)
            except Exception as err:  # noqa: BLE001 - one failing method must not stop the suite
                row["status"], row["reason"] = "error", _one_line(err)
            else:
                live.append((row, case))
            gc.collect()
        self.agreement(rows)
        self.sample(live)
        for row, _ in live:
            self.finish(row)
        live.clear()
        gc.collect()
        return rows

    def static_skip(self, method: Method, batch: int, steps: int, mode: str, section: str) -> tuple[str, str] | None:
        if method.gpu_only and not self.ctx.on_gpu:
            return "n/a", "GPU only: no CUDA device on this machine"
        if mode not in method.modes:
            return "n/a", method.modes_note or f"no {mode} row"
        if mode == "train" and self.cfg.train_batch_sizes is not None and batch not in self.cfg.train_batch_sizes:
            return "n/a", f"no train rows at B={batch} in the {self.cfg.label} preset"
        if mode == "train" and self.cfg.train_methods is not None and method.key not in self.cfg.train_methods:
            return "n/a", f"no train row in the {self.cfg.label} preset"
        if section == "grid" and method.where == "sweep":
            return "n/a", f"short T only: see the compile sweep (T in {list(self.cfg.sweep_seq_lens)})"
        if section == "grid" and method.max_t is not None and steps > min(method.max_t, self.cfg.short_max_t):
            return "n/a", f"short T only (T <= {min(method.max_t, self.cfg.short_max_t)})"
        return None

    def build_and_warm(self, method: Method, row: dict, batch: int, steps: int, mode: str, cap: float) -> _Case:
        ctx = self.ctx
        short, long = self.cfg.probe_t, 4 * self.cfg.probe_t
        if method.kind == "eager" and steps > long:
            # Two short calls fit call time = a + b * T (a: per-call costs, b: per step), each after a
            # warm-up call of its length that pays the first-use costs (allocations, oneDNN primitives,
            # TorchScript profiling, the eager scan's tracing).
            times = []
            for probe_steps in (short, long):  # each length warmed up first (e.g. the eager scan re-traces)
                probe = method.build(ctx, batch, probe_steps, mode)
                probe.call()
                t0 = time.perf_counter()
                probe.call()
                times.append(time.perf_counter() - t0)
                del probe
            b = max((times[1] - times[0]) / (long - short), times[1] / long / 4)
            a = max(times[0] - b * short, 0.0)
            if a + b * steps > cap:
                raise Skip(f"predicted {_fmt_s(a + b * steps)} per call > {_fmt_s(cap)} cap "
                           f"(probes at T={short}, {long})")
        mem_before = self.torch_mem_reset()
        t0 = time.perf_counter()
        case = method.build(ctx, batch, steps, mode)
        out = case.call()
        row["first_call_s"] = time.perf_counter() - t0
        row["compile_s"] = case.compile_s
        row["memory"] = self.memory(method, case, mem_before)
        row.update(case.info)
        if case.output is not None and out is not None:
            row["_output"] = case.output(out)
        return case

    def torch_mem_reset(self) -> int | None:
        if not self.ctx.on_gpu:
            return None
        torch = self.ctx.torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def memory(self, method: Method, case: _Case, mem_before: int | None) -> dict | None:
        memory = dict(case.memory) if case.memory else None
        if self.ctx.on_gpu and method.framework == "torch":
            torch = self.ctx.torch
            peak = torch.cuda.max_memory_allocated() - (mem_before or 0)
            memory = {"kind": "torch-cuda-peak", "peak_bytes": int(peak)}
        elif self.ctx.on_gpu and method.framework == "jax":
            stats = self.ctx.jax_device.memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                memory = dict(memory or {"kind": "jax-device"})
                memory["process_peak_bytes"] = int(stats["peak_bytes_in_use"])
        return memory

    def agreement(self, rows: list[dict]) -> None:
        """Max |positions - reference| per forward row; reference: the seed loop, else lax.scan unroll=1."""
        outputs = {r["method"]: r.pop("_output") for r in rows if "_output" in r}
        model = rows[0]["model"] if rows else "traveller"
        seed = SEEDS.get(model, SEED_KEY)
        ref_key = seed if seed in outputs else ("jax-scan-u1" if "jax-scan-u1" in outputs else None)
        if ref_key is None:
            return
        ref = outputs[ref_key]
        for row in rows:
            out = outputs.get(row["method"])
            if out is None or row["role"] in ("limit", "bound"):
                continue
            if out.shape != ref.shape:
                row["max_abs_diff"] = {"vs": ref_key, "value": None, "note": f"shape {out.shape} != {ref.shape}"}
            elif np.issubdtype(out.dtype, np.integer):  # generated tokens: the share that differ
                row["max_abs_diff"] = {"vs": ref_key, "value": float(np.mean(out != ref)), "metric": "tokens differing"}
            else:
                row["max_abs_diff"] = {"vs": ref_key, "value": float(np.max(np.abs(out.astype(np.float64) - ref)))}

    def sample(self, live: list[tuple[dict, _Case]]) -> None:
        """Round-robin: each pass takes one sample of every unfinished case, so load drifts hit all alike."""
        cfg = self.cfg
        calls: dict[int, int] = {}
        for row, case in live:  # calls per sample from one more warm call (itself a sample if slow enough)
            t0 = time.perf_counter()
            case.call()
            one = max(time.perf_counter() - t0, 1e-7)
            calls[id(row)] = max(1, min(10_000, math.ceil(cfg.min_sample_s / one)))
            row["calls_per_sample"] = calls[id(row)]
            if calls[id(row)] == 1:
                row["samples"].append(one)
        active = list(live)
        while active:
            for item in list(active):
                row, case = item
                n = calls[id(row)]
                if self.done(row, n):
                    active.remove(item)
                    continue
                t0 = time.perf_counter()
                for _ in range(n):
                    case.call()
                row["samples"].append((time.perf_counter() - t0) / n)
                if self.done(row, n):
                    active.remove(item)

    def done(self, row: dict, calls: int) -> bool:
        samples, cfg = row["samples"], self.cfg
        return len(samples) >= cfg.repeats or (len(samples) >= cfg.min_repeats and sum(samples) * calls >= cfg.case_budget_s)

    def finish(self, row: dict) -> None:
        samples = row["samples"]
        row["status"] = "ok"
        row["call_s"] = statistics.median(samples)
        row["call_s_min"] = min(samples)
        row["per_step_us"] = row["call_s"] / row["T"] * 1e6
        self.history[(row["method"], row["mode"], row["B"], row["T"])] = row["call_s"] / row["T"]


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def _derive(rows: list[dict]) -> list[dict]:
    """The ratios of every row (vs its cell's seed loop and limit)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["section"], row["mode"], row["B"], row["T"]), []).append(row)
    for (model, *_), group in groups.items():
        seed = next((r for r in group if r["method"] == SEEDS.get(model) and r["status"] == "ok"), None)
        limits = [r for r in group if r["method"] in LIMIT_KEYS and r["status"] == "ok"]
        limit = min(limits, key=lambda r: r["call_s"]) if limits else None
        for row in group:
            if row["status"] != "ok":
                continue
            if seed is not None:
                row["speedup_vs_seed"] = seed["call_s"] / row["call_s"]
            if limit is not None:
                row["x_limit"] = row["call_s"] / limit["call_s"]
                row["limit_method"] = limit["method"]
    return [row for group in groups.values() for row in group]  # cells in measuring order


def _versions(ctx: _Context, threads: dict) -> dict:
    import flax
    import jax

    torch = ctx.torch
    info = {
        "host_kind": host_kind(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "torch": torch.__version__,
        "jax_devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
        "torch_device": str(ctx.torch_device) + (f" ({torch.cuda.get_device_name()})" if ctx.on_gpu else ""),
        "torch_threads": threads,
        "memory_available_gib": round((_available_memory() or 0) / 2**30, 1),
    }
    return info


def run_suite(cfg: BenchConfig | None = None, *, progress: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark; returns the results as a JSON-ready dict (see `write_results`). Prints nothing."""
    cfg = cfg or BenchConfig.default()
    cfg.validate()
    import jax

    started = time.time()
    load_start = _loadavg()
    precision = None
    if cfg.dtype == "float32" and cfg.matmul_precision:
        precision = jax.default_matmul_precision(cfg.matmul_precision)
        precision.__enter__()
    try:
        ctx = _Context(cfg)
        torch = ctx.torch
        tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        if ctx.on_gpu and cfg.dtype == "float32":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        dynamo = torch._dynamo.config
        limit_name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
        old_limit = getattr(dynamo, limit_name)
        setattr(dynamo, limit_name, max(old_limit, 64))
        # torch.compile keeps compiled graphs on disk between processes (FX graph and AOT-autograd caches):
        # a second run would time cache hits, not compiles. Those are off here; the C++/Triton kernel cache
        # stays on, as on any machine that has compiled before (a first-ever run takes longer).
        switches = [(torch._inductor.config, "fx_graph_cache"), (torch._functorch.config, "enable_autograd_cache")]
        saved = [(mod, name, getattr(mod, name)) for mod, name in switches if hasattr(mod, name)]
        for mod, name, _ in saved:
            setattr(mod, name, False)
        try:
            results = _run(cfg, ctx, progress, started, load_start)
        finally:
            setattr(dynamo, limit_name, old_limit)
            for mod, name, value in saved:
                setattr(mod, name, value)
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    finally:
        if precision is not None:
            precision.__exit__(None, None, None)
    return results


def _warm_up_compilers(ctx: _Context) -> None:
    """Pay each compiler's one-time start-up (imports, toolchain, worker pools) before any row is timed."""
    torch, jax, jnp = ctx.torch, ctx.jax, ctx.jnp
    x = torch.ones(4, device=ctx.torch_device)
    torch.compile(lambda v: torch.tanh(v) * 2 + 1, fullgraph=True)(x)
    jax.block_until_ready(jax.jit(lambda v: jnp.tanh(v) * 2 + 1)(jnp.ones(4)))
    torch._dynamo.reset()


def _run(cfg: BenchConfig, ctx: _Context, progress, started: float, load_start) -> dict:
    threads = _calibrate_torch_threads(ctx)
    _warm_up_compilers(ctx)
    engine = _Engine(cfg, ctx, progress)
    table = dict(METHODS)
    if cfg.methods is None:
        wanted = set(table)
    else:
        # The seed loop, the limits and the library's own choice (the headline row) always run.
        wanted = set(cfg.methods) | {SEED_KEY, AUTO_KEY, *LIMIT_KEYS}
        asked_models = {table[k].model for k in wanted if k in table}
        wanted |= {SEEDS[model] for model in asked_models}  # each model's ratios need its torch loop
    methods = [m for k, m in table.items() if k in wanted]
    grid_methods = [m for m in methods if m.where in ("grid", "both") and m.model == "traveller"]
    sweep_methods = [m for m in methods if m.where in ("sweep", "both") and m.model == "traveller"]
    vae_methods = {model: [m for m in methods if m.model == model] for model in ("vae-ss", "vae-greedy")}

    # Order: the short-T sweep, the Traveller grid up to the VAE's batch sizes, the VAE rows, then the
    # larger batches (on a CPU mostly skipped as too slow: the first to go when the budget runs out).
    plan = [(sweep_methods, "traveller", cfg.sweep_batch, steps, "forward", "sweep")
            for steps in sorted(cfg.sweep_seq_lens) if "forward" in cfg.modes]
    vae_max_b = max(cfg.vae_batch_sizes, default=0)
    grid = [(grid_methods, "traveller", batch, steps, mode, "grid") for batch in sorted(cfg.batch_sizes)
            for steps in sorted(cfg.seq_lens) for mode in cfg.modes]
    plan += [p for p in grid if p[2] <= vae_max_b]
    plan += [(vae_methods[model], model, batch, steps, mode, "grid") for model in ("vae-ss", "vae-greedy")
             for batch in sorted(cfg.vae_batch_sizes) for steps in sorted(cfg.vae_seq_lens) for mode in cfg.modes
             if vae_methods[model]]
    plan += [p for p in grid if p[2] > vae_max_b]
    rows: list[dict] = []
    interrupted = None
    for methods_, model, batch, steps, mode, section in plan:
        try:
            rows += engine.cell(methods_, model, batch, steps, mode, section)
        except KeyboardInterrupt:  # e.g. a hard time limit (gpu.sh): keep what was measured
            interrupted = f"interrupted during {mode} B={batch} T={steps} ({section}) after {engine.elapsed():.0f} s"
            break
    rows = _derive(rows)
    for row in rows:
        row["samples"] = [round(s, 9) for s in row["samples"]]
    used = {r["method"] for r in rows}
    described = {m.key: {"label": m.label, "framework": m.framework, "role": m.role, "model": m.model,
                         "kind": m.kind, "note": m.note}
                 for m in methods if m.key in used}
    return {
        "schema": SCHEMA_VERSION,
        "kind": "jax-scan-rnn benchmark",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": round(engine.elapsed(), 1),
        "host": _versions(ctx, threads),
        "load_average": {"start": load_start, "end": _loadavg()},
        "config": dataclasses.asdict(cfg),
        "jax_bf16": ctx.jax_bf16,
        "interrupted": interrupted,
        "methods": described,
        "rows": rows,
    }


# ----------------------------------------------------------------------------------------------------
# Writing: JSON, Markdown, plots
# ----------------------------------------------------------------------------------------------------


def results_stem(results: dict) -> str:
    """`<host-kind>` plus `-bf16` / `-<preset>` where those differ from the defaults."""
    stem = results["host"]["host_kind"]
    if results["config"]["dtype"] == "bfloat16":
        stem += "-bf16"
    if results["config"]["label"] != "default":
        stem += f"-{results['config']['label']}"
    return stem


def write_results(results: dict, out_dir: str | os.PathLike, *, plots: bool = True) -> dict[str, Path]:
    """Write `<stem>.json`, `<stem>.md` and the PNG plots under `out_dir`; returns their paths by kind."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = results_stem(results)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md"}
    if plots:
        paths.update(_plot(results, out, stem))
    paths["json"].write_text(json.dumps(results, indent=1, default=_json_default) + "\n")
    paths["md"].write_text(markdown(results, {k: p.name for k, p in paths.items() if k.startswith("png")}))
    return paths


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _us(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1e5:
        return f"{value / 1e3:,.0f} ms"
    if value >= 999.5:
        return f"{value / 1e3:.3g} ms"
    return f"{value:.3g} µs"


def _ratio(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}×" if value >= 100 else f"{value:.3g}×"


def _bytes(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _find(rows: list[dict], **match) -> dict | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def headline(results: dict, batch: int = 1, steps: int = 1000, mode: str = "forward") -> dict:
    """The key comparison of one grid cell: seed loop, best JAX scan, limit; their ratios."""
    rows = [r for r in results["rows"] if r["section"] == "grid" and r["model"] == "traveller"
            and r["B"] == batch and r["T"] == steps and r["mode"] == mode]
    seed = _find(rows, method=SEED_KEY, status="ok")
    scans = [r for r in rows if r["method"] == AUTO_KEY and r["status"] == "ok"]
    scan = scans[0] if scans else None
    limits = [r for r in rows if r["method"] in LIMIT_KEYS and r["status"] == "ok"]
    limit = min(limits, key=lambda r: r["call_s"]) if limits else None
    return {
        "B": batch, "T": steps, "mode": mode,
        "seed_us": seed and seed["per_step_us"],
        "scan_us": scan and scan["per_step_us"], "scan_method": scan and scan["method"],
        "scan_unroll": scan and scan.get("unroll"),
        "limit_us": limit and limit["per_step_us"], "limit_method": limit and limit["method"],
        "scan_speedup_vs_seed": scan and scan["speedup_vs_seed"],
        "scan_x_limit": scan and scan["x_limit"],
    }


def criteria(results: dict) -> list[dict]:
    """The issues' speed targets, evaluated on these results (None where the rows are missing)."""
    fwd1 = headline(results, 1, 1000, "forward")
    train1 = headline(results, 1, 1000, "train")
    fwd64 = headline(results, 64, 1000, "forward")

    def check(name, value, ok):
        return {"criterion": name, "value": value, "met": None if value is None else bool(ok(value))}

    remat_ratio = None
    rows = {r["method"]: r for r in results["rows"] if r["model"] == "traveller" and r["section"] == "grid"
            and r["mode"] == "train" and r["B"] == 1 and r["T"] == 10000 and r["status"] == "ok" and r["memory"]}
    if "jax-scan-remat" in rows and "jax-scan-u1" in rows:
        remat_ratio = rows["jax-scan-remat"]["memory"]["temp_bytes"] / rows["jax-scan-u1"]["memory"]["temp_bytes"]
    return [
        check("forward B=1 T=1000: lax.scan >= 30x the seed loop (issues 3, 5)", fwd1["scan_speedup_vs_seed"],
              lambda v: v >= 30),
        check("train step B=1 T=1000: jitted >= 10x the eager torch step (issue 3)", train1["scan_speedup_vs_seed"],
              lambda v: v >= 10),
        check("forward B=1 T=1000: <= 3 µs per step (issue 6)", fwd1["scan_us"], lambda v: v <= 3),
        check("forward B=1 T=1000: >= 80x the seed loop (issue 6)", fwd1["scan_speedup_vs_seed"], lambda v: v >= 80),
        check("forward B=64 T=1000: within 2x of the limit row (issue 6)", fwd64["scan_x_limit"], lambda v: v <= 2),
        check("train B=1 T=10000: temp memory with remat <= 1/3 of without (issue 6)", remat_ratio,
              lambda v: v <= 1 / 3),
    ]


def markdown(results: dict, plots: dict[str, str] | None = None) -> str:
    """The results as Markdown: headline, criteria, per-step tables, compile sweep, memory, agreement."""
    host, cfg, rows = results["host"], results["config"], results["rows"]
    threads = host["torch_threads"]
    lines = [
        f"# Scan vs loop: `{host['host_kind']}` ({cfg['dtype']}, preset `{cfg['label']}`)",
        "",
        f"Machine: {host['cpu']} ({host['cpu_count']} cores), torch device `{host['torch_device']}`, "
        f"JAX devices {', '.join(host['jax_devices'])}. torch {host['torch']} "
        f"({threads['chosen']} intra-op thread(s), {threads['how']}), jax {host['jax']}, flax {host['flax']}, "
        f"Python {host['python']}."
        + (f" JAX bf16 via `{results['jax_bf16']}`." if results.get("jax_bf16") else "")
        + f" Load average at start / end: {results['load_average']['start']} / "
        f"{results['load_average']['end']}. Started {results['started']}, wall time {results['wall_s']:.0f} s.",
        "",
        f"Traveller: H={cfg['hidden_size']}, {cfg['num_layers']} layers, F={cfg['num_inputs']}, the same weights "
        "in every row. Each figure is the median of up to "
        f"{cfg['repeats']} timed samples (at least {cfg['min_repeats']}) after a warm-up call, divided by T; "
        "every ratio compares two medians of the same cell of this run. `vs seed`: how many times faster "
        "than the seed's loop (higher is better). `vs limit`: how many times slower than the limit row, the "
        "same FLOPs with the time dependency removed (1× is the floor). Train step: value + grad + Adam "
        "update of the trading loss.",
        "",
    ]
    if results.get("interrupted"):
        lines += [f"**Incomplete:** {results['interrupted']}; later cells are missing.", ""]
    for mode in ("forward", "train"):
        h = headline(results, 1, 1000, mode)
        if h["scan_us"] is None and h["seed_us"] is None:
            continue
        lines += [
            f"**Headline, {mode}, B=1, T=1000:** seed loop {_us(h['seed_us'])}/step, "
            f"lax.scan ({h['scan_method']}, unroll={h['scan_unroll']}) {_us(h['scan_us'])}/step = "
            f"**{_ratio(h['scan_speedup_vs_seed'])} faster** than the seed loop; limit ({h['limit_method']}) "
            f"{_us(h['limit_us'])}/step, so the scan is {_ratio(h['scan_x_limit'])} the limit.",
            "",
        ]
    lines += ["## Targets from the issues", "", "| criterion | measured | met |", "|---|---|---|"]
    for c in criteria(results):
        v = c["value"]
        shown = "—" if v is None else (f"{v:.3g} µs" if "µs" in c["criterion"] else
                                       f"{v:.1%} of it" if "memory" in c["criterion"] else _ratio(v))
        lines.append(f"| {c['criterion']} | {shown} | {'—' if c['met'] is None else ('yes' if c['met'] else 'no')} |")
    lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{k}]({name})" for k, name in sorted(plots.items())] + [""]

    methods = results["methods"]
    seq_lens, batch_sizes = sorted(cfg["seq_lens"]), sorted(cfg["batch_sizes"])
    trav = [r for r in rows if r["model"] == "traveller" and not r.get("mode_na")]
    for mode in cfg["modes"]:
        for batch in batch_sizes:
            cell_rows = [r for r in trav if r["section"] == "grid" and r["mode"] == mode and r["B"] == batch]
            if not cell_rows:
                continue
            lines += [f"## {mode.capitalize()}, B={batch}: time per step", ""]
            header = "| method |" + "".join(f" T={t} | vs seed | vs limit |" for t in seq_lens)
            lines += [header, "|---|" + "---:|---:|---:|" * len(seq_lens)]
            notes: list[str] = []
            for key in _ordered_keys(cell_rows):
                cells = []
                for steps in seq_lens:
                    r = _find(cell_rows, method=key, T=steps)
                    if r is None:
                        cells.append("| | |")
                    elif r["status"] == "ok":
                        cells.append(f"{_us(r['per_step_us'])} | {_ratio(r['speedup_vs_seed'])} | "
                                     f"{_ratio(r['x_limit'])}")
                    else:
                        tag = _note_tag(notes, r["status"], r["reason"])
                        cells.append(f"{r['status']} {tag} | | ")
                lines.append(f"| {_label(methods, key)} | " + " | ".join(cells) + " |")
            lines.append("")
            lines += [f"{tag} {text}  " for tag, text in _notes(notes)] + [""]

    vae = [r for r in rows if r["model"] != "traveller" and not r.get("mode_na")]
    if vae:
        lines += ["## VAE decoder: scheduled sampling and greedy generation", "",
                  f"GRU decoder, V={cfg['vae_vocab']}, H={cfg['vae_hidden']}, Z={cfg['vae_latent']}, "
                  f"{cfg['vae_layers']} layer(s). Scheduled sampling: one coin per token (p = 0.5) chooses between "
                  "the model's argmax and the true token; its train step is the whole VAE loss (encoder, "
                  "decoder, KL) + Adam. `vs torch loop`: how many times faster than torch_ref's eager loop of "
                  "the same task. Teacher forcing feeds nothing back: the bound for scheduled sampling.", "",
                  "| task | method | mode | B | T | per step | vs torch loop | agreement |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        notes = []
        for r in vae:
            agree = r.get("max_abs_diff") or {}
            shown = "—" if agree.get("value") is None or r["method"] == agree.get("vs") else (
                f"{agree['value']:.1%} tokens differ" if agree.get("metric") == "tokens differing"
                else f"max abs diff {agree['value']:.1e}")
            if r["status"] == "ok":
                lines.append(f"| {r['model']} | {_label(methods, r['method'])} | {r['mode']} | {r['B']} | {r['T']} | "
                             f"{_us(r['per_step_us'])} | {_ratio(r['speedup_vs_seed'])} | {shown} |")
            else:
                tag = _note_tag(notes, r["status"], r["reason"])
                lines.append(f"| {r['model']} | {_label(methods, r['method'])} | {r['mode']} | {r['B']} | {r['T']} | "
                             f"{r['status']} {tag} | | |")
        lines += [""] + [f"{tag} {text}  " for tag, text in _notes(notes)] + [""]

    sweep = [r for r in rows if r["section"] == "sweep"]
    if sweep:
        lens = sorted({r["T"] for r in sweep})
        lines += [f"## Short-T sweep (forward, B={cfg['sweep_batch']}): first call (compile) and time per step", "",
                  "| method |" + "".join(f" T={t} first call | T={t} per step |" for t in lens),
                  "|---|" + "---:|---:|" * len(lens)]
        for key in _ordered_keys(sweep):
            cells = []
            for steps in lens:
                r = _find(sweep, method=key, T=steps)
                if r is None or r["status"] != "ok":
                    cells.append(f"{r['status'] if r else ''} | ")
                else:
                    cells.append(f"{r['first_call_s']:.3g} s | {_us(r['per_step_us'])}")
            lines.append(f"| {_label(methods, key)} | " + " | ".join(cells) + " |")
        lines.append("")

    b0 = batch_sizes[0]
    compiled = [r for r in trav if r["section"] == "grid" and r["status"] == "ok" and r["B"] == b0
                and (r["compile_s"] is not None or r["method"].startswith("torch-compile"))]
    if compiled:
        lines += [f"## First call (compile included), B={b0}", "",
                  "| method | mode |" + "".join(f" T={t} |" for t in seq_lens), "|---|---|" + "---:|" * len(seq_lens)]
        for key in _ordered_keys(compiled):
            for mode in cfg["modes"]:
                cells = []
                for steps in seq_lens:
                    r = _find(compiled, method=key, T=steps, mode=mode)
                    cells.append("—" if r is None else f"{r['first_call_s']:.3g} s")
                if any(c != "—" for c in cells):
                    lines.append(f"| {_label(methods, key)} | {mode} | " + " | ".join(cells) + " |")
        lines.append("")

    mem = [r for r in trav if r["section"] == "grid" and r["status"] == "ok" and r["memory"]]
    if mem:
        lines += ["## Memory", "",
                  "JAX rows: temporary buffers of the compiled program (`compiled.memory_analysis()`); "
                  "torch rows on a GPU: `torch.cuda.max_memory_allocated()` during the first call, above what "
                  "was allocated before it; torch rows on a CPU: not measured.", ""]
        for mode in cfg["modes"]:
            mode_rows = [r for r in mem if r["mode"] == mode]
            if not mode_rows:
                continue
            cells = sorted({(r["B"], r["T"]) for r in mode_rows})
            lines += [f"{mode.capitalize()}:", "",
                      "| method |" + "".join(f" B={b}, T={t} |" for b, t in cells), "|---|" + "---:|" * len(cells)]
            for key in _ordered_keys(mode_rows):
                row_cells = []
                for b, t in cells:
                    r = _find(mode_rows, method=key, B=b, T=t)
                    m = r["memory"] if r else {}
                    row_cells.append(_bytes(m.get("temp_bytes", m.get("peak_bytes"))) if m else "—")
                lines.append(f"| {_label(methods, key)} | " + " | ".join(row_cells) + " |")
            lines.append("")

    agree = [r for r in trav if r.get("max_abs_diff") and r["max_abs_diff"].get("value") is not None
             and r["method"] != r["max_abs_diff"]["vs"]]
    if agree:
        worst: dict[str, dict] = {}
        for r in agree:
            if r["method"] not in worst or r["max_abs_diff"]["value"] > worst[r["method"]]["max_abs_diff"]["value"]:
                worst[r["method"]] = r
        lines += ["## Agreement (same weights, same inputs)", "",
                  "Largest |positions - reference| over every forward cell measured (reference: the seed loop, "
                  "or lax.scan unroll=1 where the seed loop was skipped).", "",
                  "| method | vs | max abs diff | at B, T |", "|---|---|---:|---|"]
        for key, r in worst.items():
            d = r["max_abs_diff"]
            lines.append(f"| {_label(methods, key)} | {d['vs']} | {d['value']:.2e} | {r['B']}, {r['T']} |")
        lines.append("")
    lines += ["## Rows", "", "| key | method | what it is |", "|---|---|---|"]
    for key, m in methods.items():
        lines.append(f"| `{key}` | {m['label']} | {m['note']} |")
    return "\n".join(lines) + "\n"


def _label(methods: dict, key: str) -> str:
    return methods.get(key, {}).get("label", key)


def _ordered_keys(rows: list[dict]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if r["method"] not in seen:
            seen.append(r["method"])
    return seen


def _note_tag(notes: list[str], status: str, reason: str | None) -> str:
    text = f"{status}: {reason or 'no reason given'}"
    if text not in notes:
        notes.append(text)
    return f"({_letter(notes.index(text))})"


def _letter(i: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[i] if i < 26 else f"n{i}"


def _notes(notes: list[str]) -> list[tuple[str, str]]:
    return [(f"({_letter(i)})", text) for i, text in enumerate(notes)]


def _plot(results: dict, out: Path, stem: str) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cfg = [r for r in results["rows"] if r["model"] == "traveller"], results["config"]
    methods = {k: m for k, m in results["methods"].items() if any(r["method"] == k for r in rows)}
    paths = {}
    batches = sorted(cfg["batch_sizes"])
    styles = _styles(list(methods))
    for mode in cfg["modes"]:
        fig, axes = plt.subplots(1, len(batches), figsize=(5.2 * len(batches), 4.6), squeeze=False)
        for ax, batch in zip(axes[0], batches):
            for key in methods:
                pts = sorted((r["T"], r["per_step_us"]) for r in rows if r["method"] == key and r["mode"] == mode
                             and r["status"] == "ok" and (r["B"] == batch))
                if not pts:
                    continue
                ax.plot(*zip(*pts), label=methods[key]["label"], **styles[key])
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="time per step (µs)",
                   title=f"{mode}, B={batch}")
            ax.grid(True, which="both", alpha=0.3)
        handles, labels = axes[0][0].get_legend_handles_labels()
        for ax in axes[0][1:]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.suptitle(f"Traveller {mode}: time per step vs T ({results['host']['host_kind']}, {cfg['dtype']})")
        fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(labels) / 3), 1, 1))
        path = out / f"{stem}-{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths[f"png_{mode}"] = path

    fig, ax = plt.subplots(figsize=(7.5, 5))
    b0 = cfg["sweep_batch"]
    compiling = [k for k in methods if methods[k].get("kind") == "compiled"
                 and methods[k]["role"] not in ("limit", "bound")]
    for key in compiling:  # the one-off cost of the first call: first call minus a warm call
        pts = sorted((r["T"], max(r["first_call_s"] - r["call_s"], 1e-4)) for r in rows if r["method"] == key
                     and r["mode"] == "forward" and r["status"] == "ok" and r["B"] == b0)
        if pts:
            ax.plot(*zip(*pts), label=methods[key]["label"], **styles[key])
    ax.set(xscale="log", yscale="log", xlabel="sequence length T",
           ylabel="first call minus a warm call (s)",
           title=f"Compile / trace / capture cost vs T, forward, B={b0} ({results['host']['host_kind']})")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a run of VAE rows only has no compile curve
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{stem}-compile.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths["png_compile"] = path
    return paths


def _styles(keys: list[str]) -> dict[str, dict]:
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20").colors
    styles = {}
    for i, key in enumerate(keys):
        style = {"color": colors[i % len(colors)], "marker": "os^vD<>ph*"[i % 10], "markersize": 4, "linewidth": 1.3}
        if key.startswith("limit"):
            style.update(color="black", linestyle="--", marker="x")
        elif key == SEED_KEY:
            style.update(color="tab:red", linewidth=2.2)
        elif key == AUTO_KEY:
            style.update(color="tab:blue", linewidth=2.2)
        elif key.endswith("lstm-seq"):
            style.update(linestyle=":")
        styles[key] = style
    return styles


# ----------------------------------------------------------------------------------------------------
# CLI hook: `jax-scan-rnn bench` = add_arguments(sub.add_parser("bench")) + run(args)
# ----------------------------------------------------------------------------------------------------


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `jax-scan-rnn bench`."""
    parser.add_argument("--quick", action="store_true",
                        help="short run (< 2 min on a 2-core CPU): T=1000, B in {1,64} (train: B=1), fewer samples")
    parser.add_argument("--out", default="benchmarks/results", metavar="DIR",
                        help="where to write <host-kind>.json/.md and the PNG plots (default: benchmarks/results)")
    parser.add_argument("--seq-lens", type=_int_list, metavar="T,T,...", help="sequence lengths of the grid")
    parser.add_argument("--batch-sizes", type=_int_list, metavar="B,B,...", help="batch sizes of the grid")
    parser.add_argument("--sweep-seq-lens", type=_int_list, metavar="T,T,...",
                        help="short sequence lengths for the compile-bound loops")
    parser.add_argument("--vae-batch-sizes", type=_int_list, metavar="B,B,...",
                        help="batch sizes of the VAE decoder rows (the VAE issue's point: 128)")
    parser.add_argument("--vae-seq-lens", type=_int_list, metavar="T,T,...", help="sequence lengths of the VAE rows")
    parser.add_argument("--methods", metavar="KEY,KEY,...",
                        help=f"only these rows (the seed loop and limits always run); keys: {', '.join(METHODS)}")
    parser.add_argument("--modes", default=None, metavar="MODE,...", help="forward,train (default: both)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="compute dtype (bfloat16 is meant for GPUs; default: float32)")
    parser.add_argument("--max-call-s", type=float, metavar="S", help="skip cases predicted to take longer per call")
    parser.add_argument("--budget-s", type=float, metavar="S", help="start no new case after S seconds")
    parser.add_argument("--repeats", type=int, metavar="N", help="timed samples per case (at most)")
    parser.add_argument("--torch-threads", type=int, metavar="N",
                        help="torch intra-op threads on CPU (default: the faster of 1 and torch's default)")
    parser.add_argument("--label", metavar="NAME", help="preset name used in the output file names")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig an argparse namespace (from `add_arguments`) asks for."""
    overrides: dict[str, Any] = {"dtype": args.dtype}
    for name in ("seq_lens", "batch_sizes", "sweep_seq_lens", "vae_batch_sizes", "vae_seq_lens", "max_call_s",
                 "budget_s", "repeats", "torch_threads", "label"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "repeats", None) is not None:
        overrides["min_repeats"] = min(args.repeats, 3 if not args.quick else 2)
    if args.methods:
        overrides["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if args.modes:
        overrides["modes"] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    cfg = (BenchConfig.quick if args.quick else BenchConfig.default)(**overrides)
    cfg.validate()
    return cfg


def run(args: argparse.Namespace) -> int:
    """`jax-scan-rnn bench`: run the suite, print progress and the headline tables, write the results."""
    cfg = config_from_args(args)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    print(f"jax-scan-rnn bench: preset {cfg.label}, {cfg.dtype}, host {host_kind()}; progress on stderr",
          flush=True)
    results = run_suite(cfg, progress=progress)
    paths = write_results(results, args.out, plots=not args.no_plots)
    print()
    for mode in cfg.modes:
        for batch in sorted(cfg.batch_sizes):
            for steps in sorted(cfg.seq_lens):
                h = headline(results, batch, steps, mode)
                if h["scan_us"] is None:
                    continue
                print(f"{mode:<7} B={batch:<5} T={steps:<6} seed loop {_us(h['seed_us']):>10}/step   "
                      f"lax.scan {_us(h['scan_us']):>10}/step ({_ratio(h['scan_speedup_vs_seed'])} vs seed)   "
                      f"limit {_us(h['limit_us']):>10}/step (scan = {_ratio(h['scan_x_limit'])} limit)")
    print()
    for c in criteria(results):
        met = "—" if c["met"] is None else ("met" if c["met"] else "NOT met")
        print(f"{met:>8}  {c['criterion']}")
    print(f"\nwall time {results['wall_s']:.0f} s; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m jax_scan_rnn.bench [options]`: the same as `jax-scan-rnn bench` (for scripts like gpu.sh)."""
    parser = argparse.ArgumentParser(prog="python -m jax_scan_rnn.bench", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, TypeError) as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
