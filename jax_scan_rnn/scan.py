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

from jax_scan_rnn import validate

PyTree = Any
Unroll = int | Literal["auto"]

# unroll="auto": on CPU, unroll 2 helped the train step at batch 1 (the Traveller, and jsr.LSTM/GRU layers
# without feedback), for a longer compile; from batch 8 on, no unroll > 1 was faster at every size measured,
# and 16 trained slowest everywhere (the unrolled body's larger backward keeps more of each step live). GPU: 1 until measured. Measured: docs/measurements.md#unroll.
AUTO_UNROLL_CPU_BATCH1 = 2


def auto_unroll(batch: int, backend: str | None = None) -> int:
    """The measured best `unroll` for a scan over a batch of `batch` sequences on `backend` (default:
    JAX's default backend). See `AUTO_UNROLL_CPU_BATCH1` for the rule."""
    backend = backend or jax.default_backend()
    return AUTO_UNROLL_CPU_BATCH1 if backend == "cpu" and batch == 1 else 1


# Hoisting an input projection out of the loop (`prepare`: one [T*B, I] x [I, G*H] matmul before the scan,
# the loop then reads a [T, B, G*H] array) against computing it inside each step. On CPU, inside the loop
# was faster at every measured size, for the Traveller, `jsr.LSTM`/`jsr.GRU` and the SeqVAE: the hoisted
# matmul has a small K, so it is bound by writing its [T, B, G*H] result out of cache, which the loop then
# streams back, while inside the loop the same product is one more small matmul on data in cache.
# GPU: not measured yet; hoisting is the usual win there (one large matmul instead of T small launches).
# Measured: docs/measurements.md#hoisting-input-projections.
def auto_hoist(backend: str | None = None) -> bool:
    """Whether to hoist input projections out of the time loop on `backend` (default: JAX's default
    backend): False on CPU, True elsewhere (see the rule above)."""
    return (backend or jax.default_backend()) != "cpu"


def resolve_hoist(hoist: bool | Literal["auto"]) -> bool:
    """`hoist` as a bool: "auto" -> `auto_hoist()`; True/False kept; anything else is an error."""
    hoist = validate.choice("hoist_inputs", hoist, (True, False, "auto"))
    return auto_hoist() if hoist == "auto" else hoist


def resolve_unroll(unroll: Unroll, batch: int) -> int:
    """`unroll` as an int: "auto" -> `auto_unroll(batch)`; a positive int is kept; anything else is an error."""
    unroll = validate.integer("unroll", unroll, lo=1, also=("auto",))
    return auto_unroll(batch) if unroll == "auto" else unroll


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
    validate.integer("unroll", unroll, lo=1)  # "auto" is the caller's to resolve (resolve_unroll)
    prepare = (lambda xs: xs) if prepare is None else prepare
    if validate.integer("remat_chunk", remat_chunk, lo=1, none=True) is None:
        return jax.lax.scan(step, carry, prepare(xs), unroll=unroll)
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
