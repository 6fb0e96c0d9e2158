"""How this project loops over time: `jax.lax.scan`, with unrolling and optional chunked rematerialisation.

    carry, ys = time_scan(step, carry, xs, unroll=4, remat_chunk=100)

`unroll` puts that many time steps in each iteration of the compiled while loop: fewer loop
iterations (less per-iteration overhead, more room for XLA to fuse across steps) for a bigger program.

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
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


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
      unroll: time steps per compiled loop iteration.
      remat_chunk: None for a plain scan; else the chunk length c of the rematerialised scan.
    Returns:
      `(final carry, ys)` with `ys` time-major `[T, ...]`, exactly as `lax.scan`.
    """
    if not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"unroll: expected a positive int, got {unroll!r}")
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
