"""The one scan driver for feedback recurrences: each step's input includes what the previous step produced.

A feedback recurrence cannot run layer by layer over the whole sequence (as `torch.nn.LSTM` or
`layers.RNNBase.__call__` do), because step t+1's input is only known once step t's output is. It can
still run as ONE compiled loop: `jax.lax.scan` over time, with the whole stack of layers, the readout
and the feedback rule inside the loop body. No Python runs per step, so nothing starves the device.

Per step t, with `carries` the per-layer recurrent state and `fb` the fed-back value:

    xp0        = inject(fb, x_t)              # layer 0's projected input [B, G*H]
    carries, h = core.step(carries, xp0)      # all layers, inter-layer dropout masks m_t
    y_t        = readout(h, x_t)              # e.g. tanh(Linear(h)) positions, or vocabulary logits
    fb         = feed(y_t, x_t)               # what step t+1 reads

Three rules for `feed` cover every use in this project:
  - continuous feedback (the Traveller): `fb = y_t`;
  - teacher forcing: `fb = ground truth token t+1` (no feedback at all: a plain `RNN` call computes the same,
    one scan per layer; the SeqVAE runs it here, one scan for all layers measured faster on CPU at L = 3);
  - scheduled sampling / free running: `fb = where(coin_t, model's token from y_t, ground truth)`, with the
    per-token coins and any sampling noise passed in `x_t`, so another framework can be fed the same draws.

Whatever does not depend on the feedback can be projected by `prepare` for many steps at once (one big
matmul before the loop), `inject` then adding only the fed-back part inside the loop; or `inject` can
project everything each step. The models choose with their `hoist_inputs` (`scan.auto_hoist`: inside
the loop on CPU, where it measured faster).

Your own model (a forecaster feeding its prediction back; examples/05_own_feedback_model.py runs it):

    state, fb, ys = feedback_scan(gru, gru.initial_state(B), jnp.zeros((B, 1)), u,   # u [T, B, 1], ys [T, B, 1]
        inject=lambda fb, u_t: gru.layers[0].input_projection(jnp.concatenate([fb, u_t], -1)),
        readout=lambda h, u_t: head(h), feed=lambda y, u_t: y)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from jax_scan_rnn import validate
from jax_scan_rnn.cells import check_carry
from jax_scan_rnn.layers import RNNBase
from jax_scan_rnn.scan import ScanUnroll, time_scan, warns_when_called_eagerly

Array = jax.Array
PyTree = Any


@warns_when_called_eagerly("Call it inside a jax.jit-compiled function of your own: compiled once per input shape.")
def feedback_scan(
    core: RNNBase,
    carries: list,
    feedback: PyTree,
    xs: PyTree,
    *,
    inject: Callable[[PyTree, PyTree], Array],
    readout: Callable[[Array, PyTree], PyTree],
    feed: Callable[[PyTree, PyTree], PyTree],
    dropout_masks: Array | None = None,
    dropout_key: Array | Literal["core"] | None = "core",
    prepare: Callable[[PyTree], PyTree] | None = None,
    unroll: ScanUnroll = 1,
    remat_chunk: int | None = None,
) -> tuple[list, PyTree, PyTree]:
    """Run a feedback recurrence over T steps as one `lax.scan`.

    Args:
      core: the recurrent stack (`jsr.LSTM` / `jsr.GRU`); its `step` runs all layers for one time step.
      carries: the initial state: as the layers take and return it (`core.initial_state(B)`: `h [L, B, H]`,
        an LSTM's `(h, c)`), or per layer (a list, `core.unstack_state(state)`, as the models pass it).
      feedback: the value read at step 0 (e.g. zero positions, or the `<sos>` token), a pytree.
      xs: per-step inputs, a pytree whose leaves are time-major `[T, ...]`.
      inject: `(fb, x_t) -> xp0 [B, G*H]`, layer 0's projected input.
      readout: `(h [B, R], x_t) -> y_t`, the step's output (any pytree); R = H, or P for an LSTM with `proj_size`.
      feed: `(y_t, x_t) -> fb`, what the next step reads.
      dropout_masks: `[T, L-1, B, R]` scaled inter-layer keep-masks (B may be 1, shared by the batch), or None.
      dropout_key: instead of `dropout_masks`, a key from which each step draws its own masks
        (`core.step_dropout_masks(key, t, ...)`), so no `[T, ...]` mask array exists and remat keeps
        training memory ~sqrt(T) with dropout on. The default, "core", is the core's own dropout stream
        (`core.dropout_key()`: in training mode, None when its dropout is inactive), as the core's call over
        a whole sequence applies its dropout; None: no dropout. Given masks are the only source.
      prepare: optional `xs -> xs'` for the work that does not depend on the feedback, done for many
        steps at once before the loop (e.g. the features' input projection); see `scan.time_scan`.
      unroll: time steps per compiled loop iteration (`lax.scan`'s `unroll`), or `(when not differentiated,
        when differentiated)` (`scan.time_scan`).
      remat_chunk: None, or rematerialise in chunks of this many steps when differentiating
        (training memory ~T/c + c instead of ~T; `scan.time_scan`).
    Returns:
      `(final_carries, final_feedback, ys)` with `ys` the stacked `y_t`, time-major `[T, ...]`, and the final state
      in the form `carries` was given.
    """
    # Shapes are static: wrong ones are refused here, naming the argument, rather than by lax.scan or an op inside.
    if not all(hasattr(core, name) for name in ("step", "unstack_state", "stack_carries", "num_layers")):
        # a cell has no `step` over layers (jsr.GRU(...) wraps one); a user's module with these methods is a core
        raise TypeError(f"core: expected a stack of layers (jsr.LSTM, jsr.GRU, jsr.RNN), got {type(core).__name__}")
    stacked = not isinstance(carries, list)
    if stacked:
        carries = core.unstack_state(_check_stacked(core, carries) if isinstance(core, RNNBase) else carries)
    if len(carries) != core.num_layers and not core.bidirectional:  # bidirectional: `core.step` says why not
        raise ValueError(f"carries: expected one per layer ({core.num_layers}), got {len(carries)}")
    steps = _steps(xs)
    h_0 = jax.tree.leaves(carries[0])[0]  # [B, R]: the inter-layer masks' shape and dtype

    if isinstance(dropout_key, str):
        validate.choice("dropout_key", dropout_key, ("core",))
        dropout_key = core.dropout_key() if dropout_masks is None else None
    elif dropout_masks is not None and dropout_key is not None:
        raise ValueError("dropout_key: expected None when dropout_masks are given (one source of masks)")
    if dropout_masks is not None:  # B may be 1: masks shared by the batch broadcast over it
        batch = 1 if jnp.ndim(dropout_masks) == 4 and jnp.shape(dropout_masks)[2] == 1 else h_0.shape[0]
        width = "P" if getattr(core, "proj_size", 0) else "H"  # an LSTM's projection: layers read P features
        validate.shape("dropout_masks", dropout_masks, (steps, core.num_layers - 1, batch, h_0.shape[1]),
                       f"[T, L-1, B, {width}]")
    per_step = dropout_masks if dropout_key is None else jnp.arange(steps)  # masks, or step indices to draw from

    def body(state, step_in):
        carries, fb = state
        x_t, masks_t = step_in
        if dropout_key is not None:
            masks_t = core.step_dropout_masks(dropout_key, masks_t, h_0.shape, h_0.dtype)
        xp0 = inject(fb, x_t)
        _check_batch(xp0, h_0)
        carries, h = core.step(carries, xp0, masks_t)
        y = readout(h, x_t)
        fed = feed(y, x_t)
        _check_fed(fed, fb)
        return (carries, fed), y

    prepare_xs = None if prepare is None else (lambda pair: (prepare(pair[0]), pair[1]))
    (carries, feedback), ys = time_scan(
        body, (carries, feedback), (xs, per_step), prepare=prepare_xs, unroll=unroll, remat_chunk=remat_chunk
    )
    return (core.stack_carries(carries) if stacked else carries), feedback, ys


def _check_stacked(core: RNNBase, carries: PyTree) -> PyTree:
    """`carries` in the layers' own layout (`core.initial_state(B)`: `h [L*D, B, R]`, an LSTM's `(h, c)`), checked
    whole, as the layers' call checks its `initial_state`: unstacking reads entries 0 .. L*D-1 and JAX clamps an
    index past the end, so a state of fewer layers ran silently (layer 0's state fed to the layers above it too)."""
    leaves = jax.tree.leaves(carries)
    batch = jnp.shape(leaves[0])[1] if leaves and jnp.ndim(leaves[0]) == 3 else None  # None: not [L*D, B, R]
    dtype = jnp.result_type(leaves[0]) if leaves else jnp.float32
    expected = core.initial_state(1 if batch is None else batch, dtype)  # (a symbolic batch has no truth value)
    return check_carry("carries", carries, expected, core._state_desc("B" if batch is None else batch))


def _steps(xs: PyTree) -> int:
    """T, the leading size every leaf of `xs` shares."""
    sizes = [jnp.shape(x)[0] if jnp.ndim(x) else None for x in jax.tree.leaves(xs)]
    if not sizes:  # lax.scan needs a length; a [T, 0] array is per-step inputs of nothing
        raise ValueError(f"xs: expected per-step inputs with time-major [T, ...] leaves (e.g. jnp.zeros((T, 0)) "
                         f"for none), got {xs!r}")
    if None in sizes or len(set(sizes)) > 1:
        got = ", ".join(str(list(jnp.shape(x))) for x in jax.tree.leaves(xs))
        raise ValueError(f"xs: expected time-major [T, ...] leaves with one T, got shapes {got}")
    return sizes[0]


def _check_batch(xp0: Array, h: Array) -> None:
    """`carries`' batch against that of the step's input `xp0` (made by `inject` from `feedback` and `xs`): a
    mismatch otherwise surfaces as a wrong `xp0`. Other shapes of `xp0` are `core.step`'s to refuse."""
    if jnp.ndim(xp0) == 2 and jnp.ndim(h) == 2 and jnp.shape(xp0)[0] != h.shape[0]:
        raise ValueError(f"carries: expected batch {jnp.shape(xp0)[0]}, that of the step's input (inject's xp0 "
                         f"{list(jnp.shape(xp0))}, from feedback and xs), got batch {h.shape[0]} "
                         f"(layer 0's {list(h.shape)})")


def _check_fed(fed: PyTree, feedback: PyTree) -> None:
    """What `feed` returns is the next step's `feedback`, so it must have the given `feedback`'s structure, shapes
    and dtypes; otherwise lax.scan's carry-type error (several lines, naming neither) would say it."""
    given = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), feedback)
    got = jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), fed)
    if jax.tree.structure(given) != jax.tree.structure(got) or jax.tree.leaves(given) != jax.tree.leaves(got):
        def spelled(tree):
            return jax.tree.map(lambda x: f"{jnp.result_type(x).name}{list(jnp.shape(x))}", tree)
        raise ValueError(f"feedback: expected what `feed` returns each step, {spelled(fed)}, got {spelled(feedback)}: "
                         "give feedback in feed's shape and dtype")
