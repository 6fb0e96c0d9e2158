"""The Traveller: a position-feedback LSTM (seed 000), as one `lax.scan` over time, with its state.

At each step t the LSTM reads its own previous positions next to the step's features, and a linear
readout squashed by `tanh` gives the new positions in [-1, 1]^A, one per asset (A = `num_assets`, 2 in
the seed):

    z_t = [x_{t-1}, u_t]                     [A + F]; x_{-1} = 0, zero LSTM state; u_t the features [F]
    h_t = LSTM(z_t, state_{t-1})             `num_layers` layers, inter-layer dropout in training only
    x_t = tanh(W_o h_t + b_o)                positions [A]

It is stateful, as the seed's `DeepStatefulMVO`: a call returns the state after its last step
(`TravellerState`: the LSTM's `h`, `c` and the last positions `x_t`), and the next call given it continues
from it (the module keeps none itself: a call without a state starts from zeros). So a live user takes one
step per new market bar (`step`), and running T steps in one call, in chunks, or one at a time gives the
same positions (bit for bit on CPU, tested) in eval mode or with the same `dropout_masks`: training mode draws
each call's own masks.

    fast = jsr.jit(trav)
    positions, state = fast(history)            # [B, T, F] -> [B, T, A]; state after the last step
    p_t, state = fast.step(state, u_t)          # the next bar: u_t [B, F] -> p_t [B, A]

Attribute names are the seed's (`lstm_layers`, `output_layer`) so PyTorch checkpoints of the seed's
class (and `torch_ref.Traveller`) convert with `jsr.load_torch_state_dict` unchanged.

Why it is fast: the whole recurrence, feedback included, is one compiled loop. Layer 0's input
projection has a part that does not depend on the feedback, the features' `u_t @ W_u + b_ih`; with
`hoist_inputs=True` it is computed for all T steps as one matmul before the loop, and only the A-wide
fed-back part `x_{t-1} @ W_x` stays inside. That is the usual win on a GPU. On a CPU it was measured
slower at every batch size (`scan.auto_hoist`), so there the default computes `[x_{t-1}, u_t] @ W_ih` inside
each step, as torch does.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jax_scan_rnn import validate
from jax_scan_rnn.cells import matmul
from jax_scan_rnn.feedback import feedback_scan
from jax_scan_rnn.layers import LSTM, Linear
from jax_scan_rnn.scan import Unroll, resolve_hoist, warns_when_called_eagerly

Array = jax.Array
LAYOUTS = ("batch", "seed")


class TravellerState(NamedTuple):
    """The Traveller's state between steps (a pytree; `torch_ref.TravellerState` has the same fields)."""

    h: Array  # [L, B, H] LSTM hidden state per layer
    c: Array  # [L, B, H] LSTM cell state per layer
    positions: Array  # [B, A] the last positions, which the next step reads back


# A serialized `jax.export` of a stateful call (`trav(x, state)`, `trav.step`) names its state type.
jax.export.register_namedtuple_serialization(TravellerState, serialized_name="jax_scan_rnn.TravellerState")


class Traveller(nnx.Module):
    """Position-feedback LSTM over A assets: `[B, T, F] -> [B, T, A]`, or the seed's `[T, 1, F] -> [T, A]`.

    Args:
      num_inputs: F, features per step.
      hidden_size: H of every LSTM layer.
      num_layers: stacked LSTM layers.
      dropout: inter-layer dropout probability (training mode only, as in `torch.nn.LSTM`).
      num_assets: A, positions per step (the readout's width, and the fed-back part of layer 0's input,
        which reads `[A + F]`, positions first). The default 2 is the seed's model, so its checkpoints load.
      param_dtype: parameter dtype; computation runs in the dtype holding both the inputs' and the
        parameters' (`jnp.promote_types`: a bfloat16 path to float32 weights runs in float32).
      compute_dtype: None, or the LSTM matmuls' operand dtype (`jnp.bfloat16`); the state stays in the dtype
        computation runs in (float32 with float32 weights, float64 with float64 ones).
      unroll: default `lax.scan` unroll factor, or "auto" (measured per batch size, and for training or not:
        `scan.auto_unroll`).
      remat_chunk: None, or rematerialise the time loop in chunks of this many steps when training
        (memory ~T/c + c instead of ~T; see `scan.time_scan`).
      hoist_inputs: project the features for all steps before the loop (True), inside each step
        (False), or "auto": measured per backend (`scan.auto_hoist`: inside on CPU). Same numbers either
        way up to float rounding.
      rngs: `nnx.Rngs` with `params` and `dropout` streams (`nnx.Rngs(0)` has every stream; the dropout
        stream is held even at `dropout=0`).
    """

    def __init__(
        self,
        num_inputs: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        *,
        num_assets: int = 2,
        param_dtype=jnp.float32,
        compute_dtype=None,
        unroll: Unroll = "auto",
        remat_chunk: int | None = None,
        hoist_inputs: bool | Literal["auto"] = "auto",
        rngs: nnx.Rngs,
    ):
        self.num_inputs = validate.integer("num_inputs", num_inputs, lo=1)
        self.num_assets = validate.integer("num_assets", num_assets, lo=1)
        param_dtype = validate.model_dtype("param_dtype", param_dtype)  # read by the output layer too
        compute_dtype = validate.model_dtype("compute_dtype", compute_dtype, none=True)  # here, not per layer
        self.lstm_layers = LSTM(
            self.num_assets + num_inputs,
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
        self.output_layer = Linear(hidden_size, self.num_assets, param_dtype=param_dtype, rngs=rngs)

    def initial_state(self, batch_size: int, dtype=jnp.float32) -> TravellerState:
        """The state before the first step: zero LSTM state `h, c [L, B, H]`, zero positions `[B, A]`."""
        h, c = self.lstm_layers.initial_state(batch_size, dtype)
        return TravellerState(h, c, jnp.zeros((batch_size, self.num_assets), dtype))

    @warns_when_called_eagerly()
    def __call__(
        self,
        inputs: validate.ArrayInput,
        state: TravellerState | None = None,
        *,
        layout: Literal["batch", "seed"] = "batch",
        dropout_masks: Array | None = None,
        unroll: Unroll | None = None,
    ) -> tuple[Array, TravellerState]:
        """Positions for every step, and the state after the last one.

        Args:
          inputs: `[B, T, F]` (layout "batch") or the seed's `[T, 1, F]` (layout "seed": one path).
          state: None (the initial state: zeros) or the state a previous call returned, to continue from.
          layout: "batch" or "seed"; never guessed from the shape.
          dropout_masks: `[L-1, T, B, H]` scaled keep-masks used instead of the module's own draws (so
            another framework can be fed the same masks); given masks apply in any mode. Without them,
            training mode draws each step's masks inside the loop from one key of the module's dropout
            stream (no `[T, ...]` mask array, so `remat_chunk` keeps memory ~sqrt(T)).
          unroll: `lax.scan` unroll factor; defaults to the LSTM's.
        Returns:
          `(positions, state)`: positions `[B, T, A]` in [-1, 1] (`[T, A]` for the seed layout) and the
          `TravellerState` after the last step (batch 1 for the seed layout).
        """
        x = self._check_inputs(inputs, layout)
        if layout == "seed":
            x = jnp.swapaxes(x, 0, 1)  # [T, 1, F] -> one path [1, T, F]
        batch, steps, _ = x.shape
        state = self._check_state(state, batch, x.dtype)
        if dropout_masks is not None:
            lstm = self.lstm_layers
            expected = (lstm.num_layers - 1, steps, batch, lstm.hidden_size)
            validate.shape("dropout_masks", dropout_masks, expected, "[num_layers-1, T, B, H]")  # torch_ref's wording
            masks = jnp.asarray(validate.from_torch(dropout_masks), x.dtype)
            dropout_masks = jnp.swapaxes(masks, 0, 1)  # [T, L-1, B, H] for the scan
        positions, state = self._run(x, state, dropout_masks, unroll)
        return (positions[0], state) if layout == "seed" else (positions, state)

    @warns_when_called_eagerly()
    def step(
        self, state: TravellerState | None, inputs_t: validate.ArrayInput, *, dropout_masks: Array | None = None
    ) -> tuple[Array, TravellerState]:
        """One step, for live use (one call per new bar): features `[B, F]` -> `(positions [B, A], state)`.

        The same computation as one step of `__call__`, so stepping through a sequence equals one call over it:
        bit for bit through `jsr.jit` (one compiled program each); called eagerly, to float rounding (~1e-7:
        XLA fuses the step's ops differently on its own than inside the scan). `state` None starts from the
        initial state; `dropout_masks` `[L-1, B, H]`, as `__call__`'s (in training mode without them each call
        draws its own masks, so the steps equal one call only given the call's masks, `masks[:, t]`).
        """
        # Checked here, not by `__call__`, whose errors would name `inputs` and speak of the added T = 1 axis.
        x = validate.floating_array("inputs_t", inputs_t)
        if x.ndim != 2 or x.shape[1] != self.num_inputs or 0 in x.shape:
            raise ValueError(f"inputs_t: expected shape [B, {self.num_inputs}] with B >= 1, got {tuple(x.shape)}")
        masks = None
        if dropout_masks is not None:
            lstm = self.lstm_layers
            validate.shape("dropout_masks", dropout_masks, (lstm.num_layers - 1, x.shape[0], lstm.hidden_size),
                           "[num_layers-1, B, H]")  # torch_ref's wording
            masks = jnp.asarray(validate.from_torch(dropout_masks))[:, None]
        positions, state = self(x[:, None], state, dropout_masks=masks, unroll=1)
        return positions[:, 0], state

    def _check_inputs(self, inputs: Array, layout: str) -> Array:
        validate.choice("layout", layout, LAYOUTS)
        validate.not_packed("inputs", inputs, "the Traveller takes equal-length paths [B, T, F] (each step's positions "
                            "feed the next: pad a batch only with steps whose positions you discard)")
        x = validate.floating_array("inputs", inputs, like=self.lstm_layers.layers[0].w_ih.dtype)
        f = self.num_inputs
        expected = f"[B, T, {f}]" if layout == "batch" else f"the seed's [T, 1, {f}]"
        if x.ndim != 3 or x.shape[-1] != f or (layout == "seed" and x.shape[1] != 1) or 0 in x.shape:
            sizes = "B, T >= 1" if layout == "batch" else "T >= 1"  # the seed's B is the 1 in its shape
            raise ValueError(f"inputs: expected shape {expected} (layout={layout!r}) with {sizes}, got {tuple(x.shape)}")
        return x

    def _check_state(self, state: TravellerState | None, batch: int, dtype) -> TravellerState:
        expected = self.initial_state(batch, dtype)
        if state is None:
            return expected
        state = validate.from_torch(state)
        if not isinstance(state, tuple) or len(state) != len(expected):
            raise ValueError(f"state: expected a TravellerState (h, c, positions) or None, got {type(state).__name__}")
        checked = []
        for name, want, got in zip(TravellerState._fields, expected, state):
            got_shape = tuple(jnp.shape(got))
            if got_shape != want.shape:
                raise ValueError(f"state.{name}: expected shape {list(want.shape)}, got {list(got_shape)}")
            if not jnp.issubdtype(jnp.result_type(got), jnp.floating):
                raise TypeError(f"state.{name}: expected a floating dtype, got {jnp.result_type(got)}")
            checked.append(jnp.asarray(got, dtype))
        return TravellerState(*checked)

    def _run(
        self, x: Array, state: TravellerState, dropout_masks: Array | None, unroll: Unroll | None
    ) -> tuple[Array, TravellerState]:
        """The feedback recurrence on validated `[B, T, F]` inputs -> (`[B, T, A]`, final state)."""
        lstm = self.lstm_layers
        batch = x.shape[0]
        first = lstm.layers[0]
        out = self.output_layer

        def readout(h):  # out(h), as a thin matmul ([H, A]: fused with the gates, see cells.matmul)
            return matmul(h, out.kernel[...]) + out.bias[...].astype(h.dtype)

        # Layer 0 reads [positions, features], as torch's concat: w_ih [A + F, 4H], rows 0:A the positions.
        if resolve_hoist(lstm.hoist_inputs):
            # The features' share of layer 0's input for all steps at once, [T, B, 4H]; the loop adds the rest.
            w_ih, b_ih = first.w_ih[...], first.b_ih[...].astype(x.dtype)
            w_fb, w_u = w_ih[: self.num_assets], w_ih[self.num_assets :]
            projection = dict(prepare=lambda u: first.matmul(u, w_u) + b_ih,
                              inject=lambda fb, up_t: up_t + first.matmul(fb, w_fb))
        else:  # layer 0's whole input projection in each step, as the seed's loop computes it
            projection = dict(inject=lambda fb, u_t: first.input_projection(jnp.concatenate([fb, u_t], -1)))
        carries, last, ys = feedback_scan(
            lstm,
            lstm.unstack_state((state.h, state.c)),
            state.positions,
            jnp.swapaxes(x, 0, 1),  # time-major [T, B, F]
            **projection,
            readout=lambda h, _: jnp.tanh(readout(h)).astype(x.dtype),  # the carry keeps its dtype
            feed=lambda y, _: y,
            dropout_masks=dropout_masks,
            dropout_key=lstm.dropout_key() if dropout_masks is None else None,
            unroll=lstm.scan_unroll(unroll, batch),
            remat_chunk=lstm.remat_chunk,
        )
        h, c = lstm.stack_carries(carries)
        return jnp.swapaxes(ys, 0, 1), TravellerState(h, c, last)
