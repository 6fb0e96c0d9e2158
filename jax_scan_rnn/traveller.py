"""The Traveller: a position-feedback LSTM (seed 000), as one `lax.scan` over time.

At each step t the LSTM reads its own previous positions next to the step's features, and a linear
readout squashed by `tanh` gives the new positions in [-1, 1]^2:

    z_t = [x_{t-1}, u_t]                     x_{-1} = 0, zero LSTM state; u_t the features [F]
    h_t = LSTM(z_t, state_{t-1})             `num_layers` layers, inter-layer dropout in training only
    x_t = tanh(W_o h_t + b_o)                positions [2]

Attribute names are the seed's (`lstm_layers`, `output_layer`) so PyTorch checkpoints of the seed's
class (and `torch_ref.Traveller`) convert with `jsr.load_torch_state_dict` unchanged.

Why it is fast: the whole recurrence, feedback included, is one compiled loop. Layer 0's input
projection has a part that does not depend on the feedback, the features' `u_t @ W_u + b_ih`; with
`hoist_inputs=True` it is computed for all T steps as one matmul before the loop, and only the 2-wide
fed-back part `x_{t-1} @ W_x` stays inside. That is the usual win on a GPU. On a CPU it was measured
slower at every batch size (`scan.auto_hoist`), so there the default computes `[x_{t-1}, u_t] @ W_ih` inside
each step, as torch does.
"""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jax_scan_rnn.cells import matmul
from jax_scan_rnn.feedback import feedback_scan
from jax_scan_rnn.layers import LSTM, Linear
from jax_scan_rnn.scan import Unroll, resolve_hoist

Array = jax.Array
NUM_POSITIONS = 2


class Traveller(nnx.Module):
    """Position-feedback LSTM: `[B, T, F] -> [B, T, 2]`, or the seed's `[T, 1, F] -> [T, 2]`.

    Args:
      num_inputs: F, features per step.
      hidden_size: H of every LSTM layer.
      num_layers: stacked LSTM layers.
      dropout: inter-layer dropout probability (training mode only, as in `torch.nn.LSTM`).
      param_dtype: parameter dtype; computation runs in the inputs' dtype.
      compute_dtype: None, or the LSTM matmuls' operand dtype (`jnp.bfloat16`); state stays float32.
      unroll: default `lax.scan` unroll factor, or "auto" (measured per batch size: `scan.auto_unroll`).
      remat_chunk: None, or rematerialise the time loop in chunks of this many steps when training
        (memory ~T/c + c instead of ~T; see `scan.time_scan`).
      hoist_inputs: project the features for all steps before the loop (True), inside each step
        (False), or "auto": measured per backend (`scan.auto_hoist`: inside on CPU). Same numbers either
        way up to float rounding.
      rngs: `nnx.Rngs` (streams `params`, and `dropout` if `dropout > 0`).
    """

    def __init__(
        self,
        num_inputs: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        *,
        param_dtype=jnp.float32,
        compute_dtype=None,
        unroll: Unroll = "auto",
        remat_chunk: int | None = None,
        hoist_inputs: bool | Literal["auto"] = "auto",
        rngs: nnx.Rngs,
    ):
        self.num_inputs = num_inputs
        self.lstm_layers = LSTM(
            num_inputs + NUM_POSITIONS,
            hidden_size,
            num_layers,
            dropout=dropout,
            batch_first=True,  # as the seed's nn.LSTM (only its steps run here; the flag keeps the twin's meaning)
            param_dtype=param_dtype,
            compute_dtype=compute_dtype,
            unroll=unroll,
            remat_chunk=remat_chunk,
            hoist_inputs=hoist_inputs,  # kept (and validated) by the stack, like unroll and remat_chunk
            rngs=rngs,
        )
        self.output_layer = Linear(hidden_size, NUM_POSITIONS, param_dtype=param_dtype, rngs=rngs)

    def __call__(
        self,
        inputs: Array,
        *,
        layout: Literal["auto", "batch", "seed"] = "auto",
        dropout_masks: Array | None = None,
        unroll: Unroll | None = None,
    ) -> Array:
        """Positions for every step.

        Args:
          inputs: `[B, T, F]` ("batch" layout) or the seed's `[T, 1, F]` ("seed" layout: one path).
          layout: "auto" reads a rank-3 input whose second axis is 1 as the seed's layout (so a batch of
            single-step paths must say `layout="batch"`); "batch" or "seed" force one.
          dropout_masks: `[L-1, T, B, H]` scaled keep-masks used instead of the module's own draws (so
            another framework can be fed the same masks); given masks apply in any mode.
          unroll: `lax.scan` unroll factor; defaults to the LSTM's.
        Returns:
          positions `[B, T, 2]` in [-1, 1], or `[T, 2]` for the seed layout.
        """
        x = jnp.asarray(inputs)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"inputs: expected a floating dtype, got {x.dtype}")
        seed_layout = self._is_seed_layout(x, layout)
        if seed_layout:
            x = jnp.swapaxes(x, 0, 1)  # [T, 1, F] -> one path [1, T, F]
        positions = self.positions(x, dropout_masks=dropout_masks, unroll=unroll)
        return positions[0] if seed_layout else positions

    def _is_seed_layout(self, x: Array, layout: str) -> bool:
        if layout not in ("auto", "batch", "seed"):
            raise ValueError(f"layout: expected 'auto', 'batch' or 'seed', got {layout!r}")
        if x.ndim != 3 or x.shape[-1] != self.num_inputs:
            raise ValueError(
                f"inputs: expected shape [B, T, {self.num_inputs}] or the seed's [T, 1, {self.num_inputs}], "
                f"got {tuple(x.shape)}"
            )
        if layout == "seed" and x.shape[1] != 1:
            raise ValueError(f"inputs: the seed layout is [T, 1, {self.num_inputs}], got {tuple(x.shape)}")
        return layout == "seed" or (layout == "auto" and x.shape[1] == 1)

    def positions(self, x: Array, *, dropout_masks: Array | None = None, unroll: Unroll | None = None) -> Array:
        """The feedback recurrence on validated `[B, T, F]` inputs -> `[B, T, 2]`."""
        lstm = self.lstm_layers
        batch, steps, _ = x.shape
        first = lstm.layers[0]
        if dropout_masks is None:
            dropout_masks = lstm.dropout_masks((steps, batch, lstm.hidden_size), x.dtype)
            if dropout_masks is not None:
                dropout_masks = jnp.swapaxes(dropout_masks, 0, 1)  # [T, L-1, B, H] for the scan
        else:
            expected = (lstm.num_layers - 1, steps, batch, lstm.hidden_size)
            if tuple(dropout_masks.shape) != expected:
                raise ValueError(f"dropout_masks: expected shape {list(expected)}, got {tuple(dropout_masks.shape)}")
            dropout_masks = jnp.swapaxes(jnp.asarray(dropout_masks, x.dtype), 0, 1)
        out = self.output_layer

        def readout(h):  # out(h), as a thin matmul ([H, 2]: fused with the gates, see cells.matmul)
            return matmul(h, out.kernel[...]) + out.bias[...].astype(h.dtype)

        # Layer 0 reads [positions, features], as torch's concat: w_ih [2 + F, 4H], rows 0-1 the positions.
        if resolve_hoist(lstm.hoist_inputs):
            # The features' share of layer 0's input for all steps at once, [T, B, 4H]; the loop adds the rest.
            w_ih, b_ih = first.w_ih[...], first.b_ih[...].astype(x.dtype)
            w_fb, w_u = w_ih[:NUM_POSITIONS], w_ih[NUM_POSITIONS:]
            projection = dict(prepare=lambda u: first.matmul(u, w_u) + b_ih,
                              inject=lambda fb, up_t: up_t + first.matmul(fb, w_fb))
        else:  # layer 0's whole input projection in each step, as the seed's loop computes it
            projection = dict(inject=lambda fb, u_t: first.input_projection(jnp.concatenate([fb, u_t], -1)))
        carries = lstm.unstack_state(lstm.initial_state(batch, x.dtype))
        _, _, ys = feedback_scan(
            lstm,
            carries,
            jnp.zeros((batch, NUM_POSITIONS), x.dtype),
            jnp.swapaxes(x, 0, 1),  # time-major [T, B, F]
            **projection,
            readout=lambda h, _: jnp.tanh(readout(h)).astype(x.dtype),  # the carry keeps its dtype
            feed=lambda y, _: y,
            dropout_masks=dropout_masks,
            unroll=lstm.scan_unroll(unroll, batch),
            remat_chunk=lstm.remat_chunk,
        )
        return jnp.swapaxes(ys, 0, 1)
