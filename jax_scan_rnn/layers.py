"""Multi-layer `LSTM`, `GRU` and `RNN` (Elman) over whole sequences: `torch.nn.LSTM`/`GRU`/`RNN`'s constructor and
meaning.

    lstm = LSTM(input_size, hidden_size, num_layers=2, dropout=0.1, rngs=nnx.Rngs(0))
    out, (h, c) = lstm(x)           # x [T, B, I] (torch's default, batch_first=False) -> out [T, B, H]
    gru = GRU(input_size, hidden_size, batch_first=True, rngs=nnx.Rngs(0))
    out, h = gru(x, h0)             # x [B, T, I] -> out [B, T, H]; h0, h [num_layers, B, H]
    out, h = gru(x[0])              # unbatched [T, I] -> out [T, H], h [num_layers, H], as torch

The constructor takes torch's arguments by the same names, positions and defaults (`input_size,
hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0, bidirectional=False`, and
`proj_size=0` for the LSTM), so code copied from PyTorch means the same thing here; the options torch
lacks (`unroll`, `remat_chunk`, `hoist_inputs`, dtypes, `rngs`) are keyword-only.

The time loop is `jax.lax.scan`, one per layer (and direction). Because nothing is fed back, each layer's
input projection `x_t @ w_ih + b_ih` can be computed for all T steps as one `[T*B, I] x [I, G*H]` matmul
before its scan (`hoist_inputs=True`), leaving only `h @ w_hh` inside the loop; or inside each step
(`False`). "auto" (the default) chooses per backend from measurements (`scan.auto_hoist`): inside on CPU,
where the hoisted product's `[T, B, G*H]` result is written out and streamed back from memory.
Dropout (rate `dropout`) is applied to the outputs of every layer but the last, in training mode only
(`module.train()` / `module.eval()`, NNX's switches), exactly where `torch.nn.LSTM` applies it.

`step` runs one time step through all layers; the feedback driver (`feedback.py`) uses it when the
next input depends on the current output, so a whole-sequence scan per layer is impossible.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import flax.errors
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn import validate
from jax_scan_rnn.cells import (
    NONLINEARITIES, GRUCell, LSTMCell, RNNCell, RNNCellBase, check_carry, state_description, uniform,
)
from jax_scan_rnn.scan import Unroll, resolve_hoist, resolve_unroll, time_scan, warns_when_called_eagerly

Array = jax.Array
State = Any  # a layer stack's state: h `[L*D, B, H]` (GRU, RNN), or (h, c) (LSTM)


class RNNBase(nnx.Module):
    """A stack of `num_layers` cells of type `cell_type` (`torch.nn.RNNBase`); `LSTM`, `GRU` and `RNN` only choose
    the cell.

    Args (torch's, same positions and defaults):
      input_size: I, features per step of the input.
      hidden_size: H, features of the state and of each output step.
      num_layers: L, stacked layers; layer k > 0 reads layer k-1's outputs.
      bias: whether the cells have the biases `b_ih`, `b_hh`.
      batch_first: False (torch's default): `x` is time-major `[T, B, I]` and so is the output; True:
        `[B, T, I]`. The states are `[L*D, B, H]` either way, as in torch. Unbatched `[T, I]` input is
        read as one sequence whatever this says.
      dropout: inter-layer dropout probability (training mode only), as in `torch.nn.LSTM`.
      bidirectional: also run each layer backward in time: outputs `[..., 2H]` (forward, backward),
        states `[2L, B, H]` ordered layer 0 fwd, layer 0 bwd, ...
      proj_size: (LSTM only) P > 0 projects each layer's `h` to P features (`h = W_hr (o * tanh(c))`):
        outputs `[..., D*P]`, h `[L*D, B, P]`, c `[L*D, B, H]`.
    Keyword-only (not in torch):
      param_dtype: dtype of the parameters; computation runs in the dtype that holds both the input's and
        the parameters' (`jnp.promote_types`, as Flax's layers: a bfloat16 input to float32 weights runs in
        float32; torch refuses the mismatch). float64 needs `jax_enable_x64` (without it: float32, and a warning).
      compute_dtype: None, or the matmul operand dtype (e.g. `jnp.bfloat16` on GPU): states, gates
        and accumulation stay in the computation's dtype.
      unroll: default `lax.scan` unroll factor (time steps per loop iteration), or "auto": the measured
        best for the batch size, the backend and whether JAX differentiates the call (`scan.auto_unroll`);
        overridable per call.
      remat_chunk: None, or rematerialise the time loop in chunks of this many steps when
        differentiating (training memory ~T/c + c instead of ~T; see `scan.time_scan`).
      hoist_inputs: compute each layer's input projection for all steps before its loop (True), inside
        each step (False), or "auto": per backend (`scan.auto_hoist`). Same numbers either way (float
        rounding aside).
      rngs: `nnx.Rngs` with a `params` and a `dropout` stream (`nnx.Rngs(0)` has every stream; the dropout
        stream is held, and saved in checkpoints, even at `dropout=0`).
    """

    cell_type: type[RNNCellBase] = RNNCellBase

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        *,
        param_dtype=jnp.float32,
        compute_dtype=None,
        unroll: Unroll = "auto",
        remat_chunk: int | None = None,
        hoist_inputs: bool | Literal["auto"] = "auto",
        rngs: nnx.Rngs,
    ):
        num_layers = validate.integer("num_layers", num_layers, lo=1)
        # plain ints from here on: kept as attributes, which to_torch_module passes to torch (it refuses np.int64)
        input_size = validate.integer("input_size", input_size, lo=1)
        hidden_size = validate.integer("hidden_size", hidden_size, lo=1)
        if proj_size and self.cell_type is not LSTMCell:  # torch.nn.GRU refuses it too
            raise ValueError(f"proj_size: supported by LSTM only (as in torch), got {proj_size!r}")
        proj_size = validate.integer("proj_size", proj_size, lo=0, hi=hidden_size - 1)  # as torch: 0 or P < H
        batch_first = validate.boolean("batch_first", batch_first)
        bidirectional = validate.boolean("bidirectional", bidirectional)  # `bias` is the cells' to check
        validate.real("dropout", dropout, lo=0, hi=1, hi_open=True)
        if dropout and num_layers == 1:  # torch.nn.LSTM/GRU warn alike: nothing lies between layers to drop
            warnings.warn(f"dropout={dropout} does nothing with num_layers=1: it acts between stacked layers only "
                          "(as torch.nn.LSTM/GRU's)", UserWarning, stacklevel=validate.user_stacklevel())
        remat_chunk = validate.integer("remat_chunk", remat_chunk, lo=1, none=True)
        param_dtype = validate.model_dtype("param_dtype", param_dtype)  # here, not once per cell
        compute_dtype = validate.model_dtype("compute_dtype", compute_dtype, none=True)
        resolve_unroll(unroll, 1)  # validates
        resolve_hoist(hoist_inputs)  # validates
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.batch_first = batch_first
        self.proj_size = proj_size
        self.unroll = unroll
        self.remat_chunk = remat_chunk
        self.hoist_inputs = hoist_inputs
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1

        def cells():
            layers = []
            for k in range(num_layers):
                size = input_size if k == 0 else self.num_directions * layers[-1].state_size
                layers.append(self.cell_type(size, hidden_size, bias, param_dtype=param_dtype,
                                             compute_dtype=compute_dtype, rngs=rngs, **self.cell_arguments()))
            return nnx.List(layers)

        self.layers = cells()  # forward direction, layer k
        self.reverse_layers = cells() if bidirectional else nnx.List([])  # backward direction, layer k
        if not hasattr(rngs, "dropout"):  # (the cells took their params above; Flax's KeyError from inside otherwise)
            raise ValueError("rngs: expected an nnx.Rngs with a 'dropout' stream, held even at dropout=0 (e.g. "
                             "nnx.Rngs(0), or nnx.Rngs(params=0, dropout=1)), got one with streams "
                             f"{sorted(k for k, v in vars(rngs).items() if isinstance(v, nnx.RngStream))}")
        self.dropout = nnx.Dropout(float(dropout), rngs=rngs)

    def cell_arguments(self) -> dict:
        """What each cell is built with beyond its sizes and `bias` (an LSTM's `proj_size`, an RNN's
        `nonlinearity`)."""
        return {}

    @property
    def output_size(self) -> int:
        """Features per output step: D * H (D * P for an LSTM with a projection)."""
        return self.num_directions * self.layers[0].state_size

    def initial_state(self, batch_size: int, dtype=jnp.float32):
        """Zero state in the public layout: LSTM `(h [L*D, B, R], c [L*D, B, H])`, GRU and RNN `h [L*D, B, H]` (D
        directions; R = H, or P with a projection)."""
        # torch's state order: layer 0 (forward, backward if bidirectional), layer 1, ...
        layers = zip(self.layers, self.reverse_layers) if self.bidirectional else zip(self.layers)
        return self.stack_carries([cell.initial_state(batch_size, dtype) for pair in layers for cell in pair])

    @staticmethod
    def stack_carries(carries: list) -> State:
        """Per-layer carries (each `[B, H]` or a tuple of them) -> the public `[L, B, H]` layout."""
        return jax.tree.map(lambda *xs: jnp.stack(xs), *carries)

    def unstack_state(self, state) -> list:
        """The public `[L, B, H]` layout -> a list of per-layer carries."""
        return [jax.tree.map(lambda s, k=k: s[k], state) for k in range(self.num_layers * self.num_directions)]

    def check_state(self, state, batch_size: int, dtype, unbatched: bool = False,
                    name: str = "initial_state") -> State:
        """Validate a user-supplied `initial_state` (errors name it `name`) and cast it to `dtype`; returns the
        `[L*D, B, H]` layout.

        `unbatched`: the state of one unbatched sequence, `[L*D, H]` leaves (torch's `hx` for `[T, I]` input).
        """
        expected = self.initial_state(batch_size, dtype)
        desc = self._state_desc(None if unbatched else batch_size)
        return check_carry(name, state, expected, desc, batch_axis=1 if unbatched else None)

    def _state_desc(self, batch_size: int | str | None) -> str:
        """The state's layout in words for an error: "a [2, 4, 8] array", "a tuple (h, c) of [2, B, 8] arrays" (a
        batch size not known: "B"), without the batch axis for None (an unbatched sequence's)."""
        batch = "" if batch_size is None else f"{batch_size}, "
        shape = f"[{self.num_layers * self.num_directions}, {batch}{{}}]"
        return state_description(shape.format(self.layers[0].state_size),
                                 shape.format(self.hidden_size) if self.cell_type is LSTMCell else None)

    def check_input(self, x: Array, name: str = "x") -> Array:
        """`x` must be a float array of the layout the module was built for; returns it as a jax array."""
        self._refuse_packed(x, name)
        x = validate.floating_array(name, x, like=self.layers[0].w_ih.dtype)
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size or 0 in x.shape:
            layout = "[B, T, {0}]" if self.batch_first else "[T, B, {0}] (batch_first=False)"
            raise ValueError(
                f"{name}: expected shape {layout.format(self.input_size)} or unbatched [T, {self.input_size}], "
                f"with T, B >= 1, got {tuple(x.shape)}"
            )
        return x

    def _refuse_packed(self, x, name: str = "x") -> None:
        validate.not_packed(name, x, "pass the padded batch and its lengths: x, lengths = "
                            f"torch.nn.utils.rnn.pad_packed_sequence(packed, batch_first={self.batch_first}), then "
                            "model(x, lengths=lengths) (outputs padded with zeros to x's T steps, as "
                            "pad_packed_sequence gives torch's with total_length=T)")

    def check_arguments(self, method: str, args: tuple, kwargs: dict) -> None:
        """What `jsr.jit` checks before a call, which the traced call cannot: host `lengths` (NumPy, a list, a
        torch tensor) in 1..T, with an eager call's error. A `jax.Array` is left to the call (clipped to 0..T,
        as under `jax.jit`): reading it back would wait for the device. A torch PackedSequence for `x` is refused
        as an eager call refuses it (traced, it would fail inside torch's constructor)."""
        if method != "__call__":
            return
        x = args[0] if args else kwargs.get("x")
        self._refuse_packed(x)
        lengths = kwargs.get("lengths")
        if lengths is None or isinstance(lengths, jax.Array):
            return
        shape = np.shape(x)
        if len(shape) == 3:  # other shapes: the call raises its own error
            steps, batch = (shape[1], shape[0]) if self.batch_first else shape[:2]
            check_host_lengths(lengths, batch, steps)

    def scan_unroll(self, unroll: Unroll | None, batch_size: int) -> tuple[int, int]:
        """The unrolls of a scan over `batch_size` sequences, `(when not differentiated, when differentiated)`:
        `unroll`, else the module's; "auto" resolved (`scan.resolve_unroll`)."""
        return resolve_unroll(self.unroll if unroll is None else unroll, batch_size)

    @property
    def dropout_active(self) -> bool:
        """Whether inter-layer dropout applies now (rate > 0, more than one layer, training mode)."""
        return self.num_layers > 1 and self.dropout.rate > 0.0 and not self.dropout.deterministic

    def dropout_masks(self, shape: tuple[int, ...], dtype) -> Array | None:
        """Scaled keep-masks `[L-1, *shape]` for the inter-layer dropout, or None when it is inactive.

        Drawn from the module's own dropout stream; a caller who needs the same draws in another
        framework passes masks of its own to `step` instead.
        """
        if not self.dropout_active:
            return None
        return self._draw(lambda: self.dropout(jnp.ones((self.num_layers - 1, *shape), dtype)))

    def _draw(self, draw: Callable[[], Array]) -> Array:
        return own_stream_draw(f"dropout={self.dropout.rate} (the masks of training mode)", draw,
                               "call .eval() for inference")

    def dropout_key(self) -> Array | None:
        """One key from the module's dropout stream for a whole call, or None when dropout is inactive.

        A feedback loop draws each step's masks from it (`step_dropout_masks`) inside the loop instead of
        materialising `[L-1, T, B, H]` masks before it, so rematerialised training keeps memory ~sqrt(T).
        """
        if not self.dropout_active:
            return None
        rngs = self.dropout.rngs
        return self._draw(lambda: rngs[self.dropout.rng_collection]() if isinstance(rngs, nnx.Rngs) else rngs())

    def step_dropout_masks(self, key: Array, t: Array, shape: tuple[int, ...], dtype) -> Array:
        """Step `t`'s scaled keep-masks `[L-1, *shape]`: `bernoulli(fold_in(key, t), 1 - rate) / (1 - rate)`."""
        keep = 1.0 - self.dropout.rate
        draw = jax.random.bernoulli(jax.random.fold_in(key, t), keep, (self.num_layers - 1, *shape))
        return jnp.where(draw, jnp.asarray(1.0 / keep, dtype), jnp.zeros((), dtype))

    def step(self, carries: list, xp0: Array, dropout_masks: Array | None = None) -> tuple[list, Array]:
        """One time step through every layer.

        Args:
          carries: per-layer carries (see `unstack_state`).
          xp0: layer 0's projected input `[B, G*H]` (`layers[0].input_projection(x_t)`), so callers can
            hoist or assemble it (e.g. a precomputed part plus a fed-back part).
          dropout_masks: `[L-1, B, R]` scaled keep-masks for this step, or None (R = H, or P with a projection).
        Returns:
          `(new_carries, h)` with `h [B, R]` the last layer's output.
        """
        if self.bidirectional:
            raise ValueError("step: a bidirectional RNN cannot run one step at a time (it needs the future)")
        first = self.layers[0]
        expected = (jax.tree.leaves(carries[0])[0].shape[0], first.w_hh.shape[1])
        if tuple(jnp.shape(xp0)) != expected:  # a raw [B, I] input would broadcast over the gates, silently
            raise ValueError(f"xp0 (feedback_scan's inject): expected layer 0's projected input [B, G*H] = "
                             f"{list(expected)} (layers[0].input_projection of the step's input), got shape "
                             f"{list(jnp.shape(xp0))}")
        new_carries = []
        carry, h = first.step(carries[0], xp0)
        new_carries.append(carry)
        for k in range(1, self.num_layers):
            if dropout_masks is not None:
                h = h * dropout_masks[k - 1]
            carry, h = self.layers[k].step(carries[k], self.layers[k].input_projection(h))
            new_carries.append(carry)
        return new_carries, h

    @warns_when_called_eagerly()
    def __call__(
        self, x: validate.ArrayInput, initial_state=None, *, hx=None,
        lengths: validate.ArrayInput | Sequence[int] | None = None, unroll: Unroll | None = None,
    ) -> tuple[Array, State]:
        """Run the stack over a whole sequence, as `torch.nn.LSTM/GRU.forward`.

        Args:
          x: floating input, `[T, B, I]` (batch_first=False, torch's default), `[B, T, I]`
            (batch_first=True), or one unbatched sequence `[T, I]`.
          initial_state: None (zeros) or the public state layout (LSTM `(h, c)`, GRU `h`; `[L*D, B, H]`,
            `[L*D, H]` for unbatched input), torch's `hx`. Cast to the dtype the call computes in, as Flax's
            modules cast their inputs (torch raises on a dtype mismatch instead): a float64 state under
            `jax_enable_x64` into a float32 call is rounded, as the float32 computation would round it.
          hx: torch's keyword for `initial_state` (`lstm(x, hx=(h0, c0))`, as torch code calls it); give one.
          lengths: optional `[B]` int (an array or a list; through `jsr.jit` a tuple is static, one compile per
            value), the valid steps of each sequence, as torch's
            `pack_padded_sequence`: steps `t >= lengths[b]` neither change the state nor produce output
            (their outputs are 0), nor are their inputs read (NaN padding reaches no output or gradient), and the
            backward direction starts at step `lengths[b] - 1`. Checked
            to lie in 1..T when concrete, and by `jsr.jit` when on the host (`check_arguments`); traced
            (under `jax.jit`, or a `jax.Array` through `jsr.jit`) they cannot be checked, and are clipped
            to 0..T instead (0: no valid step, zero outputs and the initial state), so an out-of-range
            length never produces NaN.
          unroll: `lax.scan` unroll factor; defaults to the module's `unroll`.
        Returns:
          `(out, final_state)`: `out` in the input's layout with `D*H` features (`D*P` with a
          projection), the final state in the public layout.
        """
        x = self.check_input(x)
        state_name = "initial_state"
        if hx is not None:
            if initial_state is not None:
                raise ValueError("hx: expected hx or initial_state (torch's name and this library's for the same "
                                 "state), got both")
            initial_state, state_name = hx, "hx"
        unbatched = x.ndim == 2
        if unbatched and lengths is not None:
            raise ValueError("lengths: expected None for unbatched [T, I] input (one sequence), got an array")
        # time-major [T, B, I] (unbatched: [T, 1, I]): lax.scan slices the leading axis
        seq = x[:, None] if unbatched else jnp.swapaxes(x, 0, 1) if self.batch_first else x
        steps, batch, _ = seq.shape
        state = self.initial_state(batch, seq.dtype) if initial_state is None else self.check_state(
            initial_state, batch, seq.dtype, unbatched, state_name
        )
        unroll = self.scan_unroll(unroll, batch)
        hoist = resolve_hoist(self.hoist_inputs)
        valid, reverse_index = None, None
        if lengths is not None:
            lengths = check_lengths(lengths, batch, steps)
            valid = jnp.arange(steps)[:, None] < lengths[None, :]  # [T, B]
            # Padding is never read, as in a packed sequence: its steps are computed and then discarded, and a NaN
            # or inf there (missing values) would reach every gradient through the discarded branch (0 * NaN).
            seq = jnp.where(valid[:, :, None], seq, jnp.zeros((), seq.dtype))
        if self.bidirectional:
            # Backward order of each sequence within its own length; padding stays where it is. The
            # permutation is its own inverse, so the same gather puts the outputs back in time order.
            t = jnp.arange(steps)[:, None]
            reverse_index = jnp.broadcast_to(steps - 1 - t, (steps, batch)) if lengths is None else jnp.where(
                valid, lengths[None, :] - 1 - t, t
            )

        def scan_layer(cell: RNNCell, carry, seq: Array):
            """One layer, one direction over time-major `seq [T, B, I]`; `valid [T, B]` freezes padding.
            With `hoist`, the input projection of many steps is one matmul (`prepare`) before the loop."""

            def step(carry, inputs):
                x_t, valid_t = inputs
                new_carry, h = cell.step(carry, x_t if hoist else cell.input_projection(x_t))
                if valid_t is None:
                    return new_carry, h
                keep = valid_t[:, None]
                carry = jax.tree.map(lambda new, old: jnp.where(keep, new, old), new_carry, carry)
                return carry, jnp.where(keep, h, jnp.zeros_like(h))

            prepare = (lambda xs: (cell.input_projection(xs[0]), xs[1])) if hoist else None
            return time_scan(step, carry, (seq, valid), prepare=prepare, unroll=unroll, remat_chunk=self.remat_chunk)

        def reverse(seq: Array) -> Array:
            return jnp.take_along_axis(seq, reverse_index[:, :, None], axis=0)

        carries = iter(self.unstack_state(state))
        finals = []
        for k in range(self.num_layers):
            if k > 0:
                seq = self._draw(functools.partial(self.dropout, seq))
            carry, out = scan_layer(self.layers[k], next(carries), seq)
            finals.append(carry)
            if self.bidirectional:
                carry, out_b = scan_layer(self.reverse_layers[k], next(carries), reverse(seq))
                finals.append(carry)
                out = jnp.concatenate([out, reverse(out_b)], -1)
            seq = out
        final = self.stack_carries(finals)
        if unbatched:
            return seq[:, 0], jax.tree.map(lambda s: s[:, 0], final)
        return (jnp.swapaxes(seq, 0, 1) if self.batch_first else seq), final


def own_stream_draw(what: str, draw: Callable[[], Array], instead: str) -> Array:
    """`draw()` from a module's own `nnx.Rngs`, with Flax's error under a plain JAX transform reworded.

    Flax says "Cannot mutate RngCount from a different trace level", which names neither the cause (the
    stream's counter is module state that `jax.jit`/`vmap`/`grad` cannot carry out) nor the ways out.
    """
    try:
        return draw()
    except flax.errors.TraceContextError as error:
        raise flax.errors.TraceContextError(
            f"{what}: drawn from the module's own nnx.Rngs, whose counter a plain JAX transform (jax.jit, "
            "jax.vmap, jax.grad, lax.scan) cannot advance; use the nnx transform (nnx.jit, nnx.vmap, nnx.grad, "
            f"...) or jsr.jit, or {instead}") from error


def check_lengths(lengths, batch_size: int, steps: int) -> Array:
    """`lengths`, the valid steps of each of `batch_size` sequences of `steps`, as an int `[B]` array.

    Dtype and shape are always checked. Values must lie in 1..T when concrete (ValueError naming the first
    bad entry); traced ones (under `jit`) cannot be checked and are clipped to 0..T instead, so a bad length
    never yields NaN. Shared by `RNNBase` (`lengths=`) and the SeqVAE's encoder.
    """
    if isinstance(lengths, (list, tuple)) and any(isinstance(v, jax.core.Tracer) for v in lengths):
        lengths = jnp.asarray(lengths)  # a list traced entry by entry (through nnx.jit or jax.jit): one array
    if isinstance(lengths, jax.core.Tracer):
        _check_length_layout(lengths, batch_size)
        return jnp.clip(lengths, 0, steps)
    # Concrete: checked on the host (a NumPy array never makes a trip to the device and back).
    check_host_lengths(lengths, batch_size, steps)
    return jnp.asarray(lengths)


def check_host_lengths(lengths, batch_size: int, steps: int) -> None:
    """`check_lengths` of concrete `lengths` (NumPy, a list, a torch tensor, a jax.Array), on the host."""
    try:
        values = validate.host_array(lengths)
    except (TypeError, ValueError):  # e.g. ragged nesting: name the argument, not NumPy's internals
        raise TypeError(f"lengths: expected an integer array, got {type(lengths).__name__}") from None
    _check_length_layout(values, batch_size)
    bad = (values < 1) | (values > steps)
    if bad.any():
        got = validate.first_bad("lengths", values, bad, "lengths")
        raise ValueError(f"lengths: expected values in [1, T={steps}], got {got}")


def _check_length_layout(values, batch_size: int) -> None:
    if not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"lengths: expected an integer array, got dtype {values.dtype}")
    if tuple(values.shape) != (batch_size,):
        raise ValueError(f"lengths: expected shape [B] = [{batch_size}], got {list(values.shape)}")


class LSTM(RNNBase):
    """`torch.nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0)`; see `RNNBase` for the arguments.

    Returns `(out [T, B, D*R], (h [L*D, B, R], c [L*D, B, H]))` (`out [B, T, D*R]` with batch_first),
    D = 2 if bidirectional else 1, R = proj_size or H. Cell equations: `cells.LSTMCell`.
    """

    cell_type = LSTMCell

    def cell_arguments(self) -> dict:
        return {"proj_size": self.proj_size}


class GRU(RNNBase):
    """`torch.nn.GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False)`; see `RNNBase` for the arguments.

    Returns `(out [T, B, D*H], h [L*D, B, H])` (`out [B, T, D*H]` with batch_first). Cell equations:
    `cells.GRUCell`.
    """

    cell_type = GRUCell


class RNN(RNNBase):
    """`torch.nn.RNN(input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
    dropout=0.0, bidirectional=False)`, the Elman network, with torch's positions (`nonlinearity` before `bias`, as
    in torch); see `RNNBase` for the other arguments.

    Returns `(out [T, B, D*H], h [L*D, B, H])` (`out [B, T, D*H]` with batch_first). Cell equations:
    `cells.RNNCell`.
    """

    cell_type = RNNCell

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 **kwargs):
        self.nonlinearity = validate.choice("nonlinearity", nonlinearity, NONLINEARITIES)  # before the cells are built
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, **kwargs)

    def cell_arguments(self) -> dict:
        return {"nonlinearity": self.nonlinearity}


def Linear(in_features: int, out_features: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs) -> nnx.Linear:
    """`nnx.Linear` initialised like `torch.nn.Linear`: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).

    (torch's kaiming_uniform with a=sqrt(5) reduces to that bound.) The layout is Flax's:
    `kernel [in, out]` is torch's `weight.T`.
    """
    param_dtype = validate.model_dtype("param_dtype", param_dtype)
    bound = 1.0 / in_features**0.5

    def shifted(key, shape, dtype=param_dtype):  # U(0, 1) * 2b - b: U(-b, b)
        return uniform(key, shape, dtype, scale=2 * bound, offset=bound)

    return nnx.Linear(
        in_features, out_features, kernel_init=shifted, bias_init=shifted, param_dtype=param_dtype, rngs=rngs
    )
