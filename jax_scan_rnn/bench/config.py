"""What the suite measures and how long it tries: `BenchConfig`, its three presets, and the row keys
that the rest of the suite (and its results) refer to.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from jax_scan_rnn.validate import choice, integer, real

SCHEMA_VERSION = 1
SEED_KEY = "torch-loop"  # the reference row of every "x faster than the seed" ratio (Traveller)
SEEDS = {"traveller": SEED_KEY, "vae-ss": "vae-ss-torch", "vae-greedy": "vae-greedy-torch"}  # per model
LIMIT_CHUNK_ROWS = 4096  # rows (batch x steps) per chunk of the XLA limit row
QUICK_METHODS = (  # the rows of the quick preset
    "torch-loop", "torch-cell", "torch-script", "torch-compile-scan", "torch-compile-loop", "torch-cuda-graph",
    "torch-lstm-seq", "jax-scan-u1", "jax-scan-u4", "jax-user-call", "jax-jit-loop", "jax-eager", "limit-xla",
    "limit-torch",
    "vae-ss-torch", "vae-ss-jax", "vae-greedy-torch", "vae-greedy-jax",
)
PEER_METHODS = (  # the rows of the peers preset: what a JAX user would write, and the jsr rows they compare with
    "peer-flax-lstm-seq", "peer-flax-optlstm-seq", "peer-flax-gru-seq", "peer-flax-fb", "peer-flax-fb-opt",
    "peer-eqx-lstm", "peer-eqx-gru-seq", "peer-torchax-loop", "jax-lstm-seq", "jax-gru-seq",
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
    """What to measure and how long to try. `default()`, `quick()` and `peers()` are the presets."""

    seq_lens: tuple[int, ...] = (100, 1000, 10000)  # T of the main grid
    batch_sizes: tuple[int, ...] = (1, 64, 1024)  # B of the main grid
    hidden_size: int = 64  # H of both LSTM layers
    num_layers: int = 2  # stacked LSTM layers
    num_inputs: int = 8  # F, features per step
    modes: tuple[str, ...] = MODES  # "forward" and/or "train"
    methods: tuple[str, ...] | None = None  # keys of METHODS to run (None: all but the peers); the seed and
    # limits always run
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
    compile_rounds: int = 1  # compiles timed per JAX case (median; the rounds after the first interleaved)
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
    def peers(cls, **overrides) -> BenchConfig:
        """The peers against the jsr rows (PEER_METHODS), T in {100, 1000}, B in {1, 64}, and T=10 for torchax's
        unrolled loop: 7 interleaved samples of every row and 5 compiles (one compile varies by +-30% here, and
        with 3 samples of a 0.6 s call two runs of the same code put one train cell at 1.02x and 1.21x):
        9-11 minutes on a 2-core CPU. Apart from the default so that neither cuts the other's
        rows at its time budget."""
        peers = cls(methods=PEER_METHODS, seq_lens=(100, 1000), batch_sizes=(1, 64), sweep_seq_lens=(10,),
                    repeats=7, min_repeats=7, compile_rounds=5, budget_s=1200.0, label="peers")
        return dataclasses.replace(peers, **overrides)

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
        """Raise ValueError naming the first field out of range (the method keys: `methods.check_method_keys`)."""
        # Empty sweep or VAE sizes mean no such rows; train_batch_sizes None means every B.
        lists = {"seq_lens": True, "batch_sizes": True, "sweep_seq_lens": bool(self.sweep_seq_lens),
                 "train_batch_sizes": self.train_batch_sizes is not None,
                 "vae_batch_sizes": bool(self.vae_batch_sizes), "vae_seq_lens": bool(self.vae_batch_sizes)}
        for name in (name for name, checked in lists.items() if checked):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name}: expected a non-empty list of positive ints, got {values!r}")
            for value in values:
                integer(name, value, lo=1)
        for name in ("hidden_size", "num_layers", "num_inputs", "sweep_batch", "repeats", "min_repeats", "probe_t",
                     "compile_rounds"):
            integer(name, getattr(self, name), lo=1)
        if self.min_repeats > self.repeats:
            raise ValueError(f"min_repeats: expected at most repeats ({self.repeats}), got {self.min_repeats}")
        integer("torch_threads", self.torch_threads, lo=1, none=True)
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"modes: expected a non-empty subset of {MODES}, got {self.modes!r}")
        choice("dtype", self.dtype, ("float32", "bfloat16"))
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.label):  # it names files
            raise ValueError(f"label: expected letters, digits, '_', '.' or '-' (a file name part), got {self.label!r}")
        for name in ("case_budget_s", "min_sample_s", "max_call_s", "budget_s", "memory_fraction"):
            real(name, getattr(self, name), lo=0, lo_open=True)
