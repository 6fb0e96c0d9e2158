"""How this project loops over time: `jax.lax.scan`, with unrolling and optional chunked rematerialisation.

    carry, ys = time_scan(step, carry, xs, unroll=4, remat_chunk=100)

`unroll` puts that many time steps in each iteration of the compiled while loop: fewer loop
iterations (less per-iteration overhead, more room for XLA to fuse across steps) for a bigger program.
`auto_unroll` picks it from measurements (the layers' default, `unroll="auto"`).

`remat_chunk` trades compute for memory when training on long sequences. Backpropagation through a
plain scan keeps every step's intermediates: memory grows like T. With chunks of c steps, the outer scan
keeps only the carry at each chunk boundary (T/c of them) and the backward pass recomputes one chunk at
a time (`jax.checkpoint`), so memory grows like T/c + c, smallest near c = sqrt(T); the price is one
extra forward pass. The results are the same; only what is stored differs.

`prepare` is the work hoisted out of the loop (typically the input projection `x @ W_ih + b_ih` of all
steps, one big matmul). Without remat it runs once over all T steps; with remat it runs once per
chunk, inside the rematerialised region, so the projected `[T, B, G*H]` inputs are never stored whole
(they would otherwise be the largest O(T) buffer left, with their gradient).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

PyTree = Any
Unroll = int | Literal["auto"]

# unroll="auto", from `python benchmarks/tune_scan.py unroll` (Traveller, 2 LSTM layers, T=1000; the log is
# benchmarks/results/unroll-cpu-2core.txt). On CPU, with the small-loop setting of xla_flags.py:
# at B=1, unroll 2 cut the train step 8.6 -> 7.6 us/step (H=64) and 140 -> 126 (H=256), forward equal
# within noise; from B=8 on, every unroll > 1 was slower, training most (B=64: 623 us/step at 1, 905 at 4,
# 2327 at 16; B=512, T=100: 4.1 ms at 1, 5.4 at 4, 16.6 at 16), because the unrolled body's larger
# backward keeps more of each step live.
# GPU: not measured yet (benchmarks/gpu.sh runs this sweep into its log); 1 until it is.
AUTO_UNROLL_CPU_BATCH1 = 2


def auto_unroll(batch: int, backend: str | None = None) -> int:
    """The measured best `unroll` for a scan over a batch of `batch` sequences on `backend` (default:
    JAX's default backend). See `AUTO_UNROLL_CPU_BATCH1` for the measurements."""
    backend = backend or jax.default_backend()
    return AUTO_UNROLL_CPU_BATCH1 if backend == "cpu" and batch == 1 else 1


# Hoisting an input projection out of the loop (`prepare`: one [T*B, I] x [I, G*H] matmul before the scan,
# the loop then reads a [T, B, G*H] array) against computing it inside each step. On CPU, measured on the
# Traveller (H=64, 2 layers, F=8; `python benchmarks/tune_scan.py hoist`, the log is
# benchmarks/results/hoist-cpu-2core.txt), inside the loop was faster at every measured size, forward
# (us/step, hoisted -> inside): B=1 3.14 -> 2.92, B=8 20.2 -> 12.7, B=64 156 -> 90, B=1024 (T=100) 1419 -> 737,
# H=256: B=1 47.5 -> 41.5, B=64 816 -> 607; train steps faster or equal (B=64: 662 -> 556). The hoisted
# matmul has a small K, so it is bound by writing its [T, B, G*H] result (65 MB at B=64, T=1000: out of
# cache), and the loop then streams it back; inside the loop the same product is one more small matmul on
# data in cache. The same held for `jsr.LSTM`/`jsr.GRU` over whole sequences and the SeqVAE
# (`python benchmarks/tune_scan.py hoist-layers`, log benchmarks/results/hoist-layers-cpu-2core.txt), forward:
# GRU I=40 (one-hot) H=256 B=128 T=60 with lengths, as the VAE's encoder, 998 -> 636 us/step; GRU I=256 H=256
# L=2 B=128 1908 -> 1118; LSTM I=64 H=64 B=64 130 -> 61, B=1024 2412 -> 1167; the VAE's teacher-forced
# decoder 572 -> 330; gradients faster or equal (GRU L=3: 7594 -> 6400).
# GPU: not measured yet; hoisting is the usual win there (one large matmul instead of T small launches).
def auto_hoist(backend: str | None = None) -> bool:
    """Whether to hoist input projections out of the time loop on `backend` (default: JAX's default
    backend): False on CPU, True elsewhere (see the measurements above)."""
    return (backend or jax.default_backend()) != "cpu"


def resolve_hoist(hoist: bool | Literal["auto"]) -> bool:
    """`hoist` as a bool: "auto" -> `auto_hoist()`; True/False kept; anything else is an error."""
    if hoist == "auto":
        return auto_hoist()
    if not isinstance(hoist, bool):
        raise ValueError(f"hoist_inputs: expected True, False or 'auto', got {hoist!r}")
    return hoist


def resolve_unroll(unroll: Unroll, batch: int) -> int:
    """`unroll` as an int: "auto" -> `auto_unroll(batch)`; a positive int is kept; anything else is an error."""
    if unroll == "auto":
        return auto_unroll(batch)
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"unroll: expected a positive int or 'auto', got {unroll!r}")
    return unroll


def time_scan(
    step: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
    carry: PyTree,
    xs: PyTree,
    *,
    prepare: Callable[[PyTree], PyTree] | None = None,
    unroll: int = 1,
    remat_chunk: int | None = None,
) -> tuple[PyTree, PyTree]:
    """`jax.lax.scan(step, carry, xs)` over the leading (time) axis of `xs`, optionally chunk-rematerialised.

    Args:
      step: `(carry, x_t) -> (carry, y_t)`.
      carry: the initial carry.
      xs: per-step inputs, time-major `[T, ...]` leaves (None leaves allowed).
      prepare: optional `xs -> step inputs`, applied to many steps at once (all, or one chunk).
      unroll: time steps per compiled loop iteration (callers resolve "auto" with `resolve_unroll`,
        since only they know the batch size).
      remat_chunk: None for a plain scan; else the chunk length c of the rematerialised scan.
    Returns:
      `(final carry, ys)` with `ys` time-major `[T, ...]`, exactly as `lax.scan`.
    """
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"unroll: expected a positive int (resolve 'auto' with resolve_unroll), got {unroll!r}")
    prepare = (lambda xs: xs) if prepare is None else prepare
    if remat_chunk is None:
        return jax.lax.scan(step, carry, prepare(xs), unroll=unroll)
    if not isinstance(remat_chunk, int) or remat_chunk < 1:
        raise ValueError(f"remat_chunk: expected None or a positive int, got {remat_chunk!r}")
    leaves = jax.tree.leaves(xs)
    if not leaves:
        raise ValueError("xs: expected at least one per-step array to scan over, got none")
    steps = leaves[0].shape[0]
    chunks, rest = divmod(steps, remat_chunk)

    @jax.checkpoint
    def chunk(carry, xs_chunk):
        return jax.lax.scan(step, carry, prepare(xs_chunk), unroll=unroll)

    head = jax.tree.map(lambda x: x[: chunks * remat_chunk].reshape(chunks, remat_chunk, *x.shape[1:]), xs)
    carry, ys = jax.lax.scan(chunk, carry, head)
    ys = jax.tree.map(lambda y: y.reshape(chunks * remat_chunk, *y.shape[2:]), ys)
    if rest:
        carry, ys_tail = chunk(carry, jax.tree.map(lambda x: x[chunks * remat_chunk :], xs))
        ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ys, ys_tail)
    return carry, ys
