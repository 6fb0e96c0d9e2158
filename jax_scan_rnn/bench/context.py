"""What every row of the suite shares: `Context` (the Traveller in torch and in JAX on one set of
weights, and the data of each (B, T)), `Case` (one built row) and `Skip` (a row that does not apply).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.bench.config import BenchConfig
from jax_scan_rnn.data.trading import MarketConfig
from jax_scan_rnn.optional import require


class Skip(Exception):
    """Raised by a case builder: this method does not apply here (the message says why); row status "n/a"."""

    status = "n/a"


class TooCostly(Skip):
    """It applies, but would cost more time or memory than the suite allows; row status "skipped"."""

    status = "skipped"


@dataclass
class Case:
    """One (method, B, T, mode): `call()` runs once and waits for the result."""

    call: Callable[[], Any]
    output: Callable[[Any], np.ndarray] | None = None  # first call's result -> numpy [B, T, 2] (or tokens)
    compile_s: float | None = None  # ahead-of-time compile (JAX) or capture (CUDA graph), if measured apart
    compile_again: Callable[[], float] | None = None  # JAX: one more compile from scratch, its seconds
    memory: dict | None = None  # static memory figures known once built
    info: dict = field(default_factory=dict)  # extra fields for the row (e.g. the unroll used)


class Context:
    """`torch_ref.Traveller` and `jsr.Traveller` on the same weights, devices and dtype, and the per-(B, T) data.

    bf16: torch runs the model in bf16; JAX uses the library's own option, `compute_dtype=bf16` (bf16
    matmul operands, float32 state and inputs).
    """

    def __init__(self, cfg: BenchConfig):
        torch = require("torch", "the benchmark (its PyTorch rows and shared weights)")
        import torch_ref

        self.cfg = cfg
        self.torch = torch
        self.market = MarketConfig()  # the trading task's loss, the train step of every Traveller row
        self.torch_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.on_gpu = self.torch_device.type == "cuda"
        self.torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
        self.compute_dtype = jnp.bfloat16 if cfg.dtype == "bfloat16" else None

        torch.manual_seed(cfg.seed)
        model = torch_ref.Traveller(cfg.num_inputs, cfg.hidden_size, cfg.num_layers, 0.0)
        self.torch_model = model.to(self.torch_device, self.torch_dtype).eval()
        # Torch-layout numpy weights (read after the cast: bf16 rows share bf16-rounded weights): the JAX
        # twins load them, and the limit rows are written against them.
        self.np_weights = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        self.graphdef, self.params, self.rest = self.jax_traveller()
        self.vae = None  # the VAE rows' own context (`vae_methods.VAEContext`), built on first use
        self._data: dict[tuple, dict] = {}  # (B, T) -> arrays; the two most recent sizes are kept

    def jax_traveller(self, **options):
        """`nnx.split(jsr.Traveller(..., **options), nnx.Param, ...)` on the shared weights, in eval mode.

        The parameters stay float32.
        """
        cfg = self.cfg
        model = jsr.Traveller(cfg.num_inputs, cfg.hidden_size, cfg.num_layers, 0.0,
                              compute_dtype=self.compute_dtype, rngs=nnx.Rngs(cfg.seed), **options)
        jsr.load_torch_state_dict(model, self.np_weights)
        model.eval()
        return nnx.split(model, nnx.Param, ...)

    def data(self, batch: int, steps: int) -> dict:
        """Standard-normal features x [B, T, F] and returns r [B, T, 2] (numpy float32).

        Timings do not depend on the values; the same arrays feed both frameworks.
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
        """`data` plus what the rows without feedback are given instead of computing it: the fed-back
        positions fb [B, T, 2] and the previous states h_prev, c_prev [B, T, H]."""
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

    def torch_sync(self) -> None:
        """Wait for torch's queued GPU work (a no-op on the CPU, where torch calls return when done)."""
        if self.on_gpu:
            self.torch.cuda.synchronize()
