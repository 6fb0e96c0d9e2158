"""The one scan driver for feedback recurrences: each step's input includes what the previous step produced.

A feedback recurrence cannot run layer by layer over the whole sequence (as `torch.nn.LSTM` or
`layers.RNN.__call__` do), because step t+1's input is only known once step t's output is. It can
still run as ONE compiled loop: `jax.lax.scan` over time, with the whole stack of layers, the readout
and the feedback rule inside the loop body. No Python runs per step, so nothing starves the device.

Per step t, with `carries` the per-layer recurrent state and `fb` the fed-back value:

    xp0        = inject(fb, x_t)              # layer 0's projected input [B, G*H]
    carries, h = core.step(carries, xp0)      # all layers, inter-layer dropout masks m_t
    y_t        = readout(h, x_t)              # e.g. tanh(Linear(h)) positions, or vocabulary logits
    fb         = feed(y_t, x_t)               # what step t+1 reads

Three rules for `feed` cover every use in this project:
  - continuous feedback (the Traveller): `fb = y_t`;
  - teacher forcing: `fb = ground truth token t+1` (no feedback at all; a plain `RNN` call is faster);
  - scheduled sampling / free running: `fb = where(coin_t, model's token from y_t, ground truth)`, with the
    per-token coins and any sampling noise passed in `x_t`, so another framework can be fed the same draws.

Whatever does not depend on the feedback belongs in `x_t` already projected: `inject` then adds only the
fed-back part, so the big input matmul for all steps happens once, before the scan.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jax_scan_rnn.layers import RNN

Array = jax.Array
PyTree = Any


def feedback_scan(
    core: RNN,
    carries: list,
    feedback: PyTree,
    xs: PyTree,
    *,
    inject: Callable[[PyTree, PyTree], Array],
    readout: Callable[[Array, PyTree], PyTree],
    feed: Callable[[PyTree, PyTree], PyTree],
    dropout_masks: Array | None = None,
    unroll: int = 1,
) -> tuple[list, PyTree, PyTree]:
    """Run a feedback recurrence over T steps as one `lax.scan`.

    Args:
      core: the recurrent stack (`jsr.LSTM` / `jsr.GRU`); its `step` runs all layers for one time step.
      carries: per-layer initial carries (`core.unstack_state(state)`).
      feedback: the value read at step 0 (e.g. zero positions, or the `<sos>` token), a pytree.
      xs: per-step inputs, a pytree whose leaves are time-major `[T, ...]`.
      inject: `(fb, x_t) -> xp0 [B, G*H]`, layer 0's projected input.
      readout: `(h [B, H], x_t) -> y_t`, the step's output (any pytree).
      feed: `(y_t, x_t) -> fb`, what the next step reads.
      dropout_masks: `[T, L-1, B, H]` scaled inter-layer keep-masks, or None (no dropout).
      unroll: time steps per compiled loop iteration (`lax.scan`'s `unroll`).
    Returns:
      `(final_carries, final_feedback, ys)` with `ys` the stacked `y_t`, time-major `[T, ...]`.
    """

    def body(state, step_in):
        carries, fb = state
        x_t, masks_t = step_in
        carries, h = core.step(carries, inject(fb, x_t), masks_t)
        y = readout(h, x_t)
        return (carries, feed(y, x_t)), y

    (carries, feedback), ys = jax.lax.scan(body, (carries, feedback), (xs, dropout_masks), unroll=unroll)
    return carries, feedback, ys
