"""`Traveller`: the position-feedback LSTM of seed 000, corrected, as the project's PyTorch reference.

The model (originally a quant's `DeepStatefulMVO`) is a multi-layer LSTM whose input at step t is the
position it produced at step t-1, concatenated in front of the features of step t. Because of that
feedback the sequence cannot be handed to `nn.LSTM` in one call: something has to loop over time.
`Traveller.forward(..., method=...)` offers four ways to run that loop, all on the ONE set of weights
held by `lstm_layers` and `output_layer`:

- ``"loop"``   the seed's eager Python loop, calling `self.lstm_layers` on one step at a time;
- ``"cell"``   an eager Python loop over time that steps each layer with LSTM-cell math;
- ``"script"`` the same loop function compiled with `torch.jit.script` (TorchScript; deprecated);
- ``"scan"``   the prototype `torch._higher_order_ops.scan` (see `scan_available`).

Equations (gates stacked i, f, g, o as in `torch.nn.LSTM`; the zero state is p_{-1} = 0,
h^k_{-1} = c^k_{-1} = 0, or the state passed in, see below)::

    z^0_t = [p_{t-1}; x_t]                                          # [B, A + F], positions FIRST
    i, f, g, o = split4(W_ih^k z^k_t + b_ih^k + W_hh^k h^k_{t-1} + b_hh^k)
    c^k_t = sigmoid(f) * c^k_{t-1} + sigmoid(i) * tanh(g)
    h^k_t = sigmoid(o) * tanh(c^k_t)
    z^{k+1}_t = m^k_t * h^k_t                                       # inter-layer dropout mask
    p_t = tanh(W_out h^{L-1}_t + b_out)                             # [B, A], one per asset

State (`TravellerState`, everything one step hands to the next; after step t)::

    h          [L, B, H]   h^k_t for k = 0 .. L-1 (as `nn.LSTM`'s h_n)
    c          [L, B, H]   c^k_t
    positions  [B, A]      p_t, read back by step t + 1

Stateful use. The model is an online optimiser: in live trading it takes one step per new market bar,
continuing from where it stopped. So every call takes a state (None: the zero state) and returns the
state after its last step::

    positions, state = trav(inputs, state)      # [B, T, F] -> [B, T, A], from `state` (None: zeros)
    positions, state = trav(more_inputs, state) # continues the same sequences
    p_t, state = trav.step(state, x_t)          # one step: x_t [B, F] -> p_t [B, A] (one new bar)

Running T steps in one call, in chunks (passing the state along) or one `step` at a time gives the same
positions and the same final state: bit-identical on CPU within one method, as each call runs the same
operations on the same values. `step` runs the single-step function of "cell", "script" and "scan"
(`_traveller_step`), so it is bit-identical to them too; "loop" runs `nn.LSTM`, whose float32 CPU
kernel rounds differently, so it agrees with `step` to rounding only (float64 matched bit for bit in
torch 2.13, which is not promised). Layout "seed" ([T, 1, F]) carries a state with B = 1. In training
mode the dropout masks of a chunked run are drawn per call, so they differ from a one-call run unless
passed in (`dropout_masks`). For truncated backpropagation through time, detach the state between calls.

Weight layout (the `state_dict()` keys of the seed's own class, so its checkpoints load unchanged)::

    lstm_layers.weight_ih_l{k}  [4H, A + F] for k = 0 (columns 0:A see p_{t-1}, A: see x_t),
                                [4H, H] for k > 0; rows are the i, f, g, o blocks of H each
    lstm_layers.weight_hh_l{k}  [4H, H]
    lstm_layers.bias_ih_l{k}    [4H]
    lstm_layers.bias_hh_l{k}    [4H]
    output_layer.weight         [A, H]
    output_layer.bias           [A]

A = `num_assets`, 2 for the seed's class (whose checkpoints therefore load into the default).
"""
import functools
import warnings
from numbers import Integral
from collections.abc import Callable
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torch_ref.vae import _check_number

# `torch._higher_order_ops.scan` is a private prototype (there is no public `torch.scan`, whatever the
# seed's answer says). Its import path and signature have changed between releases, so it is guarded:
# where it is missing, `scan_available()` is False and `method="scan"` raises a clear RuntimeError.
# In torch 2.13 the signature is `scan(combine_fn, init, xs, *, dim=0, reverse=False)`.
try:
    from torch._higher_order_ops.scan import scan as _torch_scan
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed torch
    _torch_scan = None
else:
    # Dynamo (which scan runs through, even in eager mode) imports `torch.utils.mkldnn` on first use, and
    # that module applies the deprecated `@torch.jit.script_method` at import time, so torch itself would
    # emit a DeprecationWarning on the first scan call (an error under `-W error`). Import it here, quietly.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method`", category=DeprecationWarning)
        import torch.utils.mkldnn  # noqa: F401

METHODS = ("loop", "cell", "script", "scan")
# "batch": [B, T, F] -> [B, T, A] (the default); "seed": the seed's [T, 1, F] -> [T, A]. There is no
# "auto": [B, 1, F] (B one-step sequences) and [T, 1, F] (one sequence) look alike, so the caller says.
LAYOUTS = ("batch", "seed")


class TravellerState(NamedTuple):
    """The state after a call's last step (see the module docstring); pass it to the next call."""

    h: Tensor  # [L, B, H] LSTM hidden state per layer (nn.LSTM's h_n)
    c: Tensor  # [L, B, H] LSTM cell state per layer (nn.LSTM's c_n)
    positions: Tensor  # [B, A] the last positions produced (what the next step reads back)


def scan_available() -> bool:
    """Whether this torch has the prototype `torch._higher_order_ops.scan` that `method="scan"` uses."""
    return _torch_scan is not None


# The single-step math, written once. `_traveller_step` and `traveller_loop` stay inside the TorchScript
# subset (typing.List, typing.Optional, no closures) because `method="script"` compiles `traveller_loop`;
# "cell" runs the very same functions eagerly and "scan" calls `_traveller_step` as its combine function,
# so the three methods cannot drift apart.


def _traveller_step(
    x_t: Tensor,
    prev_position: Tensor,
    h: List[Tensor],
    c: List[Tensor],
    weights: List[Tensor],
    masks_t: Optional[Tensor],
) -> Tuple[Tensor, List[Tensor], List[Tensor]]:
    """One time step of the whole model, with `torch.nn.LSTMCell`'s math in every layer.

    x_t [B, F]; prev_position [B, A]; h, c: one [B, H] tensor per layer; `weights` as
    `Traveller.flat_weights()` returns them; masks_t [L-1, B, H] (already scaled) or None (no dropout).
    Returns (position [B, A], new h list, new c list).
    """
    layer_input = torch.cat([prev_position, x_t], dim=1)  # [B, A + F]: positions first, as the seed
    new_h: List[Tensor] = []
    new_c: List[Tensor] = []
    for k in range(len(h)):
        if k > 0 and masks_t is not None:
            # Dropout sits between layers only, as in nn.LSTM: never on the input nor on the top output.
            layer_input = layer_input * masks_t[k - 1]
        w_ih, w_hh, b_ih, b_hh = weights[4 * k], weights[4 * k + 1], weights[4 * k + 2], weights[4 * k + 3]
        gates = F.linear(layer_input, w_ih, b_ih) + F.linear(h[k], w_hh, b_hh)  # [B, 4H]
        i, f, g, o = gates.chunk(4, 1)
        c_k = torch.sigmoid(f) * c[k] + torch.sigmoid(i) * torch.tanh(g)
        h_k = torch.sigmoid(o) * torch.tanh(c_k)
        new_h.append(h_k)
        new_c.append(c_k)
        layer_input = h_k
    position = torch.tanh(F.linear(layer_input, weights[-2], weights[-1]))  # [B, A]
    return position, new_h, new_c


def traveller_loop(
    xs: Tensor, position: Tensor, h: Tensor, c: Tensor, weights: List[Tensor], masks: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Python loop over time of `method="cell"`; `method="script"` is this function scripted.

    xs [T, B, F] (time-major); the state before the first step: position [B, A], h, c [L, B, H];
    `weights` as `Traveller.flat_weights()` returns them; masks [L-1, T, B, H] (scaled) or None.
    Returns (positions [T, B, A], and the state after the last step: position [B, A], h [L, B, H],
    c [L, B, H]). Plain tensors in and out, no module, so it can also be captured in a CUDA graph or
    compiled on its own (`jax-scan-rnn bench`'s CUDA-graph row does).
    """
    h_list = h.unbind(0)
    c_list = c.unbind(0)
    positions: List[Tensor] = []
    for t in range(xs.shape[0]):
        masks_t: Optional[Tensor] = None
        if masks is not None:
            masks_t = masks[:, t]
        position, h_list, c_list = _traveller_step(xs[t], position, h_list, c_list, weights, masks_t)
        positions.append(position)
    return torch.stack(positions), position, torch.stack(h_list), torch.stack(c_list)


@functools.cache
def _scripted_loop() -> Callable[..., Tensor]:
    """`torch.jit.script(traveller_loop)`, compiled once per process and cached.

    TorchScript is deprecated in current PyTorch (`torch.compile`/`torch.export` replace it) and
    `torch.jit.script` emits a DeprecationWarning saying so. The warning is silenced here, locally, because
    "script" is kept on purpose: it is the working form of what the seed's answer attempted with
    `@torch.jit.script_method` on a plain nn.Module (which compiles nothing: in torch 2.13 it even
    replaces `forward` by a non-callable stub). Scripting a free function that takes the weights as a
    list avoids scripting the module itself, so the weights stay the module's own Parameters.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`torch\.jit\.script` is (deprecated|not supported)", category=DeprecationWarning
        )
        try:
            return torch.jit.script(traveller_loop)
        except Exception as err:  # TorchScript may be removed or broken in a future torch
            raise RuntimeError(
                f'method="script" needs TorchScript, which failed to compile the loop in torch '
                f"{torch.__version__} (TorchScript is deprecated; use method='scan' or torch.compile)"
            ) from err


def _scan_loop(
    xs: Tensor, position: Tensor, h: Tensor, c: Tensor, weights: List[Tensor], masks: Optional[Tensor]
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The loop as `torch._higher_order_ops.scan`, with `traveller_loop`'s arguments and results.

    In eager mode this is no faster than "cell": eager scan is a Python loop over T. Worse, torch 2.13
    runs even eager scan through Dynamo, which traces on the first call for each new structure (layers,
    dtype, masks or not) and, with autograd, re-partitions the backward on every call
    (docs/measurements.md#compiling-the-torch-travellers-loop). It pays off only under
    `torch.compile`, where the loop is one graph node instead of T unrolled steps, so compile time and
    graph size do not grow with T.
    """
    # The carry is (position [B, A], h [L, B, H], c [L, B, H]): whole tensors, not per-layer lists. With
    # lists, torch 2.13's compiled backward fails ("scan might be aliasing the input or the output!") as
    # soon as the final carry is returned, which the state needs. The initial carry is cloned: the state
    # passed in may be a previous call's output or a user's tensor, and scan must not alias its inputs.
    init = (position.clone(), h.clone(), c.clone())
    # The weights are closed over, not passed as xs: Dynamo lifts them into scan's `additional_inputs`,
    # so gradients reach the module's Parameters. Masks are per step, so they are scanned like xs.
    per_step = (xs,) if masks is None else (xs, masks.movedim(1, 0))  # masks -> [T, L-1, B, H]

    def combine(carry: Tuple[Tensor, Tensor, Tensor], step: Tuple[Tensor, ...]):
        position, h, c = carry
        masks_t = step[1] if len(step) > 1 else None
        position, h_list, c_list = _traveller_step(
            step[0], position, list(h.unbind(0)), list(c.unbind(0)), weights, masks_t
        )
        # scan forbids outputs that alias each other or an input, hence the clones of the position (it
        # is both carried and emitted); stacking makes new h and c tensors. Inductor removes the copies.
        carry = (position.clone(), torch.stack(h_list), torch.stack(c_list))
        return carry, position.clone()

    (position, h, c), positions = _torch_scan(combine, init, per_step)
    return positions, position, h, c


def _check_count(name: str, value) -> int:
    """A size argument as a Python int: TypeError unless an integer (NumPy's included, not a bool), ValueError
    if negative."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {value}")
    return int(value)


def _loop_function(method: str) -> Callable[..., Tuple[Tensor, Tensor, Tensor, Tensor]]:
    """The loop function behind `method` ("cell", "script" or "scan", already checked to be one)."""
    if method == "script":
        return _scripted_loop()
    if method == "scan" and _torch_scan is None:
        raise RuntimeError(
            f"method='scan' needs torch._higher_order_ops.scan, which torch {torch.__version__} does not "
            "provide; use method='cell', 'script' or 'loop'"
        )
    return _scan_loop if method == "scan" else traveller_loop


def _call_quietly(loop: Callable[..., Tuple[Tensor, ...]], *args) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """`loop(*args)` without torch's "`.grad` of a non-leaf Tensor" UserWarning.

    Dynamo (behind scan, eager or compiled) reads `.grad` of every tensor it wraps, which warns for a
    non-leaf input such as our transposed `xs`: torch's noise, not the user's, and an error under
    `-W error`. Not silenced while Dynamo traces this very code (torch.compile of the whole model), as
    it cannot trace `warnings.catch_warnings`.
    """
    if torch.compiler.is_compiling():
        return loop(*args)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"The \.grad attribute of a Tensor that is not a leaf")
        return loop(*args)


class Traveller(nn.Module):
    """Position-feedback LSTM over A assets: inputs [B, T, F] -> positions [B, T, A] (the seed's [T, 1, F] -> [T, A]).

    Args:
        num_inputs: F, the number of features per step.
        hidden_size: H of every LSTM layer.
        num_layers: L, stacked LSTM layers.
        dropout: probability of zeroing a unit between LSTM layers in training mode (as `nn.LSTM`; it has
            no effect, and `nn.LSTM` warns, when num_layers == 1).
        num_assets: A, positions per step: the width of the output and of the fed-back part of the LSTM's
            input. The default 2 is the seed's model.

    Attributes (the seed's names, so a `state_dict()` of the seed's class loads unchanged):
        lstm_layers: `nn.LSTM(num_assets + num_inputs, hidden_size, num_layers, dropout=dropout, batch_first=True)`.
        output_layer: `nn.Linear(hidden_size, num_assets)`.
        activation: `nn.Tanh()`.

    See the module docstring for the equations, the stateful use and the weight layout.
    """

    def __init__(self, num_inputs: int, hidden_size: int, num_layers: int, dropout: float, num_assets: int = 2):
        super().__init__()
        # Checked here, not left to nn.LSTM: it would name its own arguments (num_inputs + num_assets is its
        # input_size) and accepts num_inputs <= 0 (a model whose num_inputs reads back negative) and a bool.
        num_inputs = _check_number("num_inputs", num_inputs, 1, integer=True)
        hidden_size = _check_number("hidden_size", hidden_size, 1, integer=True)
        num_layers = _check_number("num_layers", num_layers, 1, integer=True)
        dropout = _check_number("dropout", dropout, 0, 1)
        num_assets = _check_number("num_assets", num_assets, 1, integer=True)
        # Sizes and the dropout rate are read back from `output_layer` (num_assets) and `lstm_layers`
        # (input_size - num_assets, hidden_size, num_layers, dropout) rather than stored twice.
        self.lstm_layers = nn.LSTM(num_assets + num_inputs, hidden_size, num_layers, dropout=dropout, batch_first=True)
        self.output_layer = nn.Linear(hidden_size, num_assets)
        self.activation = nn.Tanh()

    @property
    def num_assets(self) -> int:
        """A, positions per step (the width of `output_layer`)."""
        return self.output_layer.out_features

    @property
    def num_inputs(self) -> int:
        """F, features per step: what `lstm_layers` reads besides the fed-back positions."""
        return self.lstm_layers.input_size - self.num_assets

    def flat_weights(self) -> list[Tensor]:
        """The model's own Parameters (not copies), in the order the step functions read them.

        `[weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ..., weight_ih_l{L-1}, ..., bias_hh_l{L-1},
        output_layer.weight, output_layer.bias]`. Fetched on every call, so `load_state_dict`, `.to()` and
        optimiser steps are always seen.
        """
        per_layer = self.lstm_layers.all_weights  # [[weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}], ...]
        return [w for layer in per_layer for w in layer] + [self.output_layer.weight, self.output_layer.bias]

    def initial_state(self, batch_size: int) -> TravellerState:
        """The zero state for `batch_size` sequences: h, c [L, B, H] and positions [B, A], all zeros, in the
        model's dtype and on its device. It is what `state=None` means."""
        batch_size = _check_count("batch_size", batch_size)
        lstm = self.lstm_layers
        zeros, hc = lstm.weight_hh_l0.new_zeros, (lstm.num_layers, batch_size, lstm.hidden_size)
        return TravellerState(h=zeros(hc), c=zeros(hc), positions=zeros(batch_size, self.num_assets))

    def sample_dropout_masks(
        self, seq_len: int, batch_size: int, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Inter-layer dropout masks [L-1, T, B, H], already scaled by 1/(1-p), as `forward` draws them.

        Each entry is 0 with probability `dropout`, else 1/(1-dropout) (all zeros when dropout == 1), drawn
        independently per layer gap, step, sequence and unit, like `nn.LSTM`'s dropout. Pass the result
        as `forward(..., dropout_masks=...)` (or to another framework) to reproduce one draw exactly;
        `masks[:, t]` is what `step(..., dropout_masks=...)` takes for step t.
        """
        seq_len = _check_count("seq_len", seq_len)
        batch_size = _check_count("batch_size", batch_size)
        lstm = self.lstm_layers
        shape = (lstm.num_layers - 1, seq_len, batch_size, lstm.hidden_size)
        keep = 1.0 - float(lstm.dropout)
        if keep <= 0.0:
            return lstm.weight_hh_l0.new_zeros(shape)
        return lstm.weight_hh_l0.new_empty(shape).bernoulli_(keep, generator=generator) / keep

    def forward(
        self,
        inputs: Tensor,
        state: TravellerState | None = None,
        *,
        method: str = "loop",
        layout: str = "batch",
        dropout_masks: Tensor | None = None,
    ) -> tuple[Tensor, TravellerState]:
        """Run the feedback loop over time, from `state`, and return the positions and the final state.

        Args:
            inputs: float tensor, [B, T, F] (layout "batch") or the seed's [T, 1, F] (layout "seed").
            state: the state before the first step (`TravellerState` with h, c [L, B, H] and positions
                [B, A], B = 1 in the seed layout), e.g. the state a previous call returned; None (default)
                is the zero state, `initial_state(B)`.
            method: "loop" (the seed's loop over `lstm_layers`), "cell" (eager loop of LSTM-cell math),
                "script" (that loop under TorchScript) or "scan" (`torch._higher_order_ops.scan`). All read
                the same Parameters and agree to rounding.
            layout: "batch" (default): [B, T, F] -> [B, T, A]. "seed": [T, 1, F] -> [T, A], the seed's own
                shapes (one sequence). Nothing is guessed from the shape: the seed layout must be asked for.
            dropout_masks: optional explicit inter-layer dropout masks [L-1, T, B, H] (B = 1 in the seed
                layout), already scaled by 1/(1-p), e.g. from `sample_dropout_masks`. When given they are
                applied whatever the mode (explicit wins over `self.training`), so another framework can
                be fed the same draws. Supported by "cell", "script" and "scan"; "loop" runs `nn.LSTM`,
                which cannot take masks, and raises ValueError. When None, dropout is drawn internally in
                training mode if dropout > 0 and num_layers > 1, and never in eval mode.

        Returns:
            (positions, state): positions in [-1, 1] (a saturated tanh rounds to exactly -1 or 1), [B, T, A]
            for layout "batch", [T, A] for layout "seed"; state, the `TravellerState` after the last step (its
            `positions` is the last row of positions), to pass to the next call.

        Raises:
            ValueError: unknown method/layout; inputs not 3-D, with the wrong F, with no time step, or
                not [T, 1, F] under layout "seed"; a state field of the wrong shape or device;
                dropout_masks of the wrong shape or given to "loop".
            TypeError: inputs, a state field or dropout_masks not a floating-point tensor of the model's
                dtype; state not a TravellerState.
            RuntimeError: method "scan" where `scan_available()` is False.
        """
        return self._run(inputs, state, method, layout, dropout_masks, None)

    def step(
        self, state: TravellerState | None, x_t: Tensor, *, dropout_masks: Tensor | None = None
    ) -> tuple[Tensor, TravellerState]:
        """One time step, as a live user calls it per new bar: x_t [B, F] -> (positions_t [B, A], new state).

        Runs method "cell" over this one step, so a sequence stepped through one `step` at a time gives
        exactly what "cell", "script" and "scan" give in one call.

        Args:
            state: the state before this step (`TravellerState`, h, c [L, B, H], positions [B, A]); None is
                the zero state.
            x_t: float tensor [B, F], this step's features.
            dropout_masks: optional inter-layer masks [L-1, B, H] for this step (scaled, e.g.
                `sample_dropout_masks(T, B)[:, t]`), applied whatever the mode. When None, drawn as
                `forward` draws them: in training mode if dropout > 0 and num_layers > 1.

        Returns:
            (positions_t [B, A], state after the step; its `positions` is positions_t).
        """
        self._check_float_tensor("x_t", x_t)
        if x_t.ndim != 2 or x_t.shape[1] != self.num_inputs:
            raise ValueError(f"x_t: expected shape [B, {self.num_inputs}], got {list(x_t.shape)}")
        self._check_masks(dropout_masks, (x_t.shape[0],), "step")  # here, so its errors speak of [L-1, B, H]
        masks = None if dropout_masks is None else dropout_masks.unsqueeze(1)  # [L-1, T=1, B, H]
        positions, state = self._run(x_t.unsqueeze(1), state, "cell", "batch", masks, None)
        return positions[:, 0], state

    def _run(
        self,
        inputs: Tensor,
        state: TravellerState | None,
        method: str,
        layout: str,
        dropout_masks: Tensor | None,
        loop: Callable[..., Tuple[Tensor, ...]] | None,
    ) -> tuple[Tensor, TravellerState]:
        """`forward`'s body; `compiled_loop` passes its compiled `loop` in place of the method's own."""
        seed_layout = self._check_inputs(inputs, method, layout)
        # Everything below is time-major [T, B, F]: the seed's [T, 1, F] already is (B = 1).
        xs = inputs if seed_layout else inputs.transpose(0, 1)
        state = self._check_state(state, xs.shape[1])
        if dropout_masks is not None and method == "loop":
            raise ValueError(
                "dropout_masks: not supported by method='loop' (nn.LSTM draws its own dropout); "
                "use method='cell', 'script' or 'scan'"
            )
        masks = self._check_masks(dropout_masks, (xs.shape[0], xs.shape[1]), "forward")

        if method == "loop":
            positions, state = self._seed_loop(xs.transpose(0, 1), state)
            positions = positions.transpose(0, 1)  # [T, B, A]
        else:
            lstm = self.lstm_layers
            if masks is None and self.training and lstm.dropout > 0 and lstm.num_layers > 1:
                # Drawn up front rather than inside the loop, so that every method consumes randomness
                # the same way and scan's combine function stays free of random ops.
                masks = self.sample_dropout_masks(xs.shape[0], xs.shape[1])
            weights = self.flat_weights()
            if method == "script" and not torch.is_grad_enabled():
                # TorchScript's executor, once it has run the loop with autograd, keeps choosing its
                # differentiable plan for weights that require grad, and that plan saves tensors for
                # backward: under torch.inference_mode that raises "Inference tensors cannot be saved for
                # backward". Detached weights (no gradient is wanted here) select the plan without autograd.
                weights = [w.detach() for w in weights]
            positions, position, h, c = _call_quietly(
                loop or _loop_function(method), xs, state.positions, state.h, state.c, weights, masks
            )
            state = TravellerState(h, c, position)
        return (positions[:, 0] if seed_layout else positions.transpose(0, 1)), state

    def _seed_loop(self, x: Tensor, state: TravellerState) -> tuple[Tensor, TravellerState]:
        """The seed's loop, batched and stateful: x [B, T, F] -> (positions [B, T, A], final state).

        `nn.LSTM` is called on a [B, 1, A + F] one-step sequence with the (h, c) it returned last time
        (first: the state's), so its inter-layer dropout applies in training mode exactly as in the seed.
        """
        hidden_state = (state.h, state.c)  # [L, B, H] each, nn.LSTM's (h_0, c_0) even with batch_first
        prev_position = state.positions.unsqueeze(1)  # [B, 1, A]
        positions = []
        for t in range(x.shape[1]):
            input_data = torch.cat([prev_position, x[:, t : t + 1]], dim=2)  # [B, 1, A + F]
            lstm_out, hidden_state = self.lstm_layers(input_data, hidden_state)  # [B, 1, H]
            prev_position = self.activation(self.output_layer(lstm_out))  # [B, 1, A]
            positions.append(prev_position)
        return torch.cat(positions, dim=1), TravellerState(hidden_state[0], hidden_state[1], prev_position[:, 0])

    def _check_float_tensor(self, name: str, value) -> None:
        """`value` must be a floating-point tensor of the model's dtype (TypeError naming `name` if not)."""
        if not isinstance(value, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got dtype {value.dtype}")
        param_dtype = self.lstm_layers.weight_hh_l0.dtype
        if value.dtype != param_dtype:
            raise TypeError(
                f"{name}: expected dtype {param_dtype} (the model's parameters), got {value.dtype}; "
                "convert it or the model (.to(dtype))"
            )

    def _check_inputs(self, inputs: Tensor, method: str, layout: str) -> bool:
        """Validate the arguments of `forward`; return True for the seed layout [T, 1, F]."""
        if method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
        if layout not in LAYOUTS:
            raise ValueError(
                f"layout: expected one of {LAYOUTS} ('batch' for [B, T, F], 'seed' for the seed's [T, 1, F]; "
                f"nothing is guessed from the shape), got {layout!r}"
            )
        self._check_float_tensor("inputs", inputs)
        num_inputs = self.num_inputs
        seed_layout = layout == "seed"
        expected = f"[T, 1, {num_inputs}] (layout 'seed')" if seed_layout else f"[B, T, {num_inputs}] (layout 'batch')"
        if inputs.ndim != 3:
            raise ValueError(f"inputs: expected shape {expected}, got {list(inputs.shape)} (rank {inputs.ndim})")
        if inputs.shape[2] != num_inputs or (seed_layout and inputs.shape[1] != 1):
            raise ValueError(f"inputs: expected shape {expected}, got {list(inputs.shape)}")
        if inputs.shape[0 if seed_layout else 1] == 0:
            raise ValueError(f"inputs: expected shape {expected} with T >= 1, got {list(inputs.shape)}")
        return seed_layout

    def _check_state(self, state: TravellerState | None, batch_size: int) -> TravellerState:
        """Validate `state` for `batch_size` sequences; None -> the zero state."""
        if state is None:
            return self.initial_state(batch_size)
        if not isinstance(state, TravellerState):
            got = type(state).__name__
            if got == TravellerState.__name__:  # another package's class of that name (jax_scan_rnn's): say whose
                got = (f"{type(state).__module__}.{got}; build a torch_ref.traveller.TravellerState of torch tensors "
                       "from its fields")
            raise TypeError(f"state: expected a TravellerState(h, c, positions) or None, got {got}")
        lstm = self.lstm_layers
        device = lstm.weight_hh_l0.device
        hc = ("[L, B, H]", (lstm.num_layers, batch_size, lstm.hidden_size))
        expected = {"h": hc, "c": hc, "positions": ("[B, A]", (batch_size, self.num_assets))}
        for field, (names, shape) in expected.items():
            value = getattr(state, field)
            self._check_float_tensor(f"state.{field}", value)
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"state.{field}: expected shape {names} = {list(shape)} (B = {batch_size}, the batch size "
                    f"of the inputs), got {list(value.shape)}"
                )
            if value.device != device:
                raise ValueError(f"state.{field}: expected device {device} (the model's), got {value.device}")
        return state

    def _check_masks(self, masks: Tensor | None, steps_and_batch: tuple[int, ...], where: str) -> Tensor | None:
        """Validate `dropout_masks` [L-1, *steps_and_batch, H] ((T, B) for forward, (B,) for step)."""
        if masks is None:
            return None
        self._check_float_tensor("dropout_masks", masks)
        lstm = self.lstm_layers
        expected = (lstm.num_layers - 1, *steps_and_batch, lstm.hidden_size)
        names = "[num_layers-1, T, B, H]" if where == "forward" else "[num_layers-1, B, H]"
        if tuple(masks.shape) != expected:
            raise ValueError(f"dropout_masks: expected shape {names} = {list(expected)}, got {list(masks.shape)}")
        # With one layer there is no gap between layers: nothing to apply.
        return masks if lstm.num_layers > 1 else None


def compiled_loop(
    model: Traveller, *, method: str = "scan", **compile_kwargs
) -> Callable[..., tuple[Tensor, TravellerState]]:
    """`torch.compile` of the model's loop: `run(inputs, state=None, *, layout="batch", dropout_masks=None)`.

    `run` has `model.forward`'s contract (shapes, layouts, state in and out, errors, dropout in training
    mode) and reads the model's Parameters on every call, so training the model is seen. Only the loop
    function (`method` "scan" or "cell") is compiled, with `fullgraph=True` unless `compile_kwargs` says
    otherwise; argument checks and the gathering of weights stay eager. That keeps `nn.LSTM` out of the graph:
    Dynamo refuses to trace an `nn.LSTM` module, even to read its weights ("Attempted to wrap RNN, GRU,
    or LSTM"), while the loop functions only see tensors. (`torch.compile(model, fullgraph=True)` of
    the whole model also works, for every method, under the experimental
    `torch._dynamo.config.patch(allow_rnn=True)`. Without `fullgraph=True`, i.e. `compiled_loop(...,
    fullgraph=False)` or a plain `torch.compile(model)` (which breaks the graph at `nn.LSTM`), method
    "scan" fails in torch 2.13's Inductor: its lowering of scan to a while loop calls `.item()`, raising
    "DataDependentOutputException: aten._local_scalar_dense", unless
    `torch._dynamo.config.capture_scalar_outputs = True`; a plain `torch.compile(model)` runs "loop", "cell"
    and "script".)

    - "scan": the loop is one `scan` node, so compile time does not grow with T and a new T does not
      recompile beyond a one-off dynamic-shape recompile. Backward works (see the clones in
      `_scan_loop` for the torch 2.13 aliasing workaround that makes it compile).
    - "cell": Dynamo unrolls the Python loop over T, so compile time grows with T and every new T compiles
      again (docs/measurements.md#compiling-the-torch-travellers-loop); shown for comparison,
      not recommended.

    The first call compiles (seconds to minutes); later calls with the same shapes reuse the code.
    """
    if method not in ("scan", "cell"):
        raise ValueError(f"method: expected 'scan' or 'cell' for compiled_loop, got {method!r}")
    compile_kwargs.setdefault("fullgraph", True)
    loop = torch.compile(_loop_function(method), **compile_kwargs)

    def run(
        inputs: Tensor,
        state: TravellerState | None = None,
        *,
        layout: str = "batch",
        dropout_masks: Tensor | None = None,
    ) -> tuple[Tensor, TravellerState]:
        return model._run(inputs, state, method, layout, dropout_masks, loop)

    return run
