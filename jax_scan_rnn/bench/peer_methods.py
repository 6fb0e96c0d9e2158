"""The peer rows: what a JAX user would write without jax-scan-rnn, on the jsr rows' weights.

  Flax NNX   `nnx.RNN` over `nnx.LSTMCell`, `nnx.OptimizedLSTMCell` or `nnx.GRUCell`, one `nnx.RNN` per
             layer over the whole sequence, positions given (no feedback: against `jsr.LSTM` /
             `jsr.GRU` over the sequence); and the Traveller written as the Flax docs suggest, a custom
             NNX cell whose carry holds the last positions, run by `nnx.RNN` (against jsr.Traveller).
  Equinox    the Traveller with `eqx.nn.LSTMCell`s in a `jax.lax.scan` over one sequence, `jax.vmap`ped
             over the batch (Equinox's idiom: cells take one example); `eqx.nn.GRUCell` layers over the
             whole sequence (no feedback).
  torchax    the seed's own PyTorch model and loop (`torch_ref.Traveller`, method "loop": the `torch-loop`
             row) turned into a JAX function by `torchax.extract_jax` and run under `jax.jit`.

Every peer is compiled as a user compiles their own code (`jax_methods.compiled_case`: `jax.jit` of a
function of the parameters with `jax.jit`'s default options, lowered and compiled ahead of time with the
compile timed apart), and its train step is value + grad + one Adam update of the trading loss. The jsr
rows run as the library runs them (`jax_methods.library_case`): `jsr.jit`'s compiler options, and the train
step `fit` runs (`TrainStep`: the same update, plus its NaN guard and metric sums).

Weights: the Traveller's (`Context.np_weights`) copied into each peer's own parameter layout, so every
feedback peer computes the jsr Traveller's positions up to float rounding; the GRU rows share one
`jsr.GRU`'s weights with its `b_hn` set to 0, because `nnx.GRUCell` has no `b_hn` (torch's bias inside
`r * (W_hn h + b_hn)`).

`jsr_gru_seq` is jsr's own reference row for the GRU peers (the Traveller has no GRU). Equinox and
torchax are optional (the `bench` extra): where one is not installed its rows are "n/a" with the
install hint (`missing`), as GPU-only rows are on a CPU. The peers run float32 only.

Each builder has the signature `build(ctx, B, T, mode) -> Case`.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.bench.context import Case, Context, Skip
from jax_scan_rnn.bench.jax_methods import traveller_case

PEER_EXTRA = "bench"  # the extra of jax-scan-rnn that installs the peer packages
# torch 2.13 removed the named-dimension ("Dimname") overloads of aten ops; torchax 0.0.13 still names
# some (`aten.prod.dim_Dimname`, `aten.std.names_dim`, ...) in its op tables. Overload names containing
# one of these are the removed ones (`import_torchax`).
NAMED_DIM_OVERLOADS = ("dimname", "names")
# torchax's train step differentiates the unrolled loop: its first call (compile) took 4.2 s at T=10 and
# 196 s at T=100 (B=1, 2-core CPU, load ~3), and its warm step at T=100 was 14x jsr's; train rows up to here.
TORCHAX_TRAIN_MAX_T = 10


def missing(package: str) -> str | None:
    """The n/a reason of a row whose peer `package` is not installed (None when it is); nothing is imported."""
    if importlib.util.find_spec(package) is not None:
        return None
    return f"{package} not installed: pip install jax-scan-rnn[{PEER_EXTRA}]"


def _require(package: str) -> ModuleType:
    reason = missing(package)
    if reason:
        raise Skip(reason)
    return importlib.import_module(package)


def _float32_only(ctx: Context) -> None:
    if ctx.cfg.dtype != "float32":
        raise Skip(f"peers run float32 only (the jsr rows' bf16 is the library's compute_dtype), got {ctx.cfg.dtype}")


def _case(ctx: Context, batch: int, steps: int, mode: str, positions: Callable, params, extra: tuple = (),
          library: bool = False) -> Case:
    """`jax_methods.traveller_case` (forward, or the jsr rows' train step on `-mean(net_utility(positions, r))`)
    of `positions(params, x [B, T, F], *extra) -> [B, T, A]`. `library`: jsr's own row (`params` is the jsr
    model, run as the library runs it); peers get `jax.jit`'s defaults and a plain Adam step, as their users
    would write them."""
    # A new function per build: jax.jit caches traces and executables by function identity, so a
    # module-level `positions` (the Equinox rows') would be compiled once per process and shape, and a
    # later build's compile time would read ~0. Every row's compile is timed from scratch, as the jsr rows'.
    return traveller_case(ctx, batch, steps, mode, _fresh(positions), params, extra, library=library)


def _fresh(function: Callable) -> Callable:
    def fresh(*args):
        return function(*args)

    return fresh


def _given_feedback(ctx: Context, batch: int, steps: int) -> tuple:
    """The no-feedback rows' extra input: the positions `fb [B, T, A]` given instead of fed back."""
    return (jnp.asarray(ctx.limit_inputs(batch, steps)["fb"]),)


def _lstm_layers(ctx: Context) -> list[tuple[np.ndarray, ...]]:
    """The Traveller's LSTM weights in torch's layout, per layer: `(w_ih [4H, I], w_hh [4H, H], b_ih, b_hh [4H])`."""
    w = ctx.np_weights
    return [tuple(w[f"lstm_layers.{name}_l{k}"] for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            for k in range(ctx.cfg.num_layers)]


def _readout(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """The Traveller's output layer in torch's layout: `(weight [A, H], bias [A])`."""
    return ctx.np_weights["output_layer.weight"], ctx.np_weights["output_layer.bias"]


def _gru_layers(ctx: Context) -> list[tuple[np.ndarray, ...]]:
    """The GRU rows' weights (`_jsr_gru`'s), torch's layout per layer: `(w_ih [3H, I], w_hh [3H, H], b_ih,
    b_hh [3H])` (jsr keeps the transposed matrices, `x @ w` as Flax)."""
    return [(np.asarray(cell.w_ih[...]).T, np.asarray(cell.w_hh[...]).T, np.asarray(cell.b_ih[...]),
             np.asarray(cell.b_hh[...])) for cell in _jsr_gru(ctx).layers]


# ----------------------------------------------------------------------------------------------------
# jsr's reference for the GRU peers
# ----------------------------------------------------------------------------------------------------


class GRUReadout(nnx.Module):
    """`jsr.GRU` (batch first) over `[fb, x]` and the Traveller's readout: `[B, T, F]`, fb `[B, T, A]` ->
    positions `[B, T, A]`; the GRU rows' model (no feedback)."""

    def __init__(self, gru: nnx.Module, kernel: np.ndarray, bias: np.ndarray):
        self.gru = gru
        self.kernel = nnx.Param(jnp.asarray(kernel))  # [H, A]
        self.bias = nnx.Param(jnp.asarray(bias))  # [A]

    def __call__(self, x: jax.Array, fb: jax.Array) -> jax.Array:
        out, _ = self.gru(jnp.concatenate([fb, x], axis=2))
        return jnp.tanh(out @ self.kernel[...] + self.bias[...])


def _jsr_gru(ctx: Context) -> nnx.Module:
    """`jsr.GRU(A + F, H, L)` drawn from the suite's seed, with every layer's `b_hn` set to 0 (nnx.GRUCell
    has none, so the Flax row could not share the weights otherwise)."""
    cfg = ctx.cfg
    hidden = cfg.hidden_size
    assets = _readout(ctx)[0].shape[0]  # A: the GRU reads [positions, features] as the Traveller's layer 0
    gru = jsr.GRU(assets + cfg.num_inputs, hidden, cfg.num_layers, batch_first=True,
                  compute_dtype=ctx.compute_dtype, rngs=nnx.Rngs(cfg.seed))
    for cell in gru.layers:
        cell.b_hh[...] = cell.b_hh[...].at[2 * hidden:].set(0.0)
    return gru


def jsr_gru_seq(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """jsr.GRU over the whole sequence (a lax.scan per layer) and the Traveller's readout, positions given."""
    weight, bias = _readout(ctx)
    model = GRUReadout(_jsr_gru(ctx), weight.T, bias)
    model.eval()
    return _case(ctx, batch, steps, mode, lambda m, x, fb: m(x, fb), model, _given_feedback(ctx, batch, steps),
                 library=True)


# ----------------------------------------------------------------------------------------------------
# Flax NNX
# ----------------------------------------------------------------------------------------------------


def _set(variable: nnx.Variable, value: np.ndarray) -> None:
    """Overwrite a parameter in place, refusing a shape change (a copying mistake would otherwise pass)."""
    if tuple(variable[...].shape) != tuple(value.shape):
        raise ValueError(f"value: expected shape {tuple(variable[...].shape)}, got {tuple(value.shape)}")
    variable[...] = jnp.asarray(value, variable[...].dtype)


def flax_lstm_cell(cell_type: type, w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray, b_hh: np.ndarray) -> nnx.Module:
    """An `nnx.LSTMCell` or `nnx.OptimizedLSTMCell` computing torch's LSTM layer `(w_ih [4H, I], w_hh [4H, H],
    b_ih, b_hh [4H])`. Flax has one bias per gate (on the hidden side): `b_ih + b_hh`; gates i, f, g, o as torch."""
    hidden = w_hh.shape[1]
    cell = cell_type(w_ih.shape[1], hidden, rngs=nnx.Rngs(0))
    if cell_type is nnx.OptimizedLSTMCell:  # fused: dense_i [I, 4H] (no bias), dense_h [H, 4H] + bias
        _set(cell.dense_i.kernel, w_ih.T)
        _set(cell.dense_h.kernel, w_hh.T)
        _set(cell.dense_h.bias, b_ih + b_hh)
        return cell
    for g, (name_i, name_h) in enumerate((("ii", "hi"), ("if_", "hf"), ("ig", "hg"), ("io", "ho"))):
        rows = slice(g * hidden, (g + 1) * hidden)  # one nnx.Linear per gate and side
        _set(getattr(cell, name_i).kernel, w_ih[rows].T)
        _set(getattr(cell, name_h).kernel, w_hh[rows].T)
        _set(getattr(cell, name_h).bias, b_ih[rows] + b_hh[rows])
    return cell


def flax_gru_cell(w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray, b_hh: np.ndarray) -> nnx.Module:
    """An `nnx.GRUCell` computing torch's GRU layer (`w_ih [3H, I]`, `w_hh [3H, H]`, `b_ih`, `b_hh [3H]`)
    whose `b_hn = b_hh[2H:]` is 0 (nnx.GRUCell's `dense_h` has no bias; refused otherwise)."""
    hidden = w_hh.shape[1]
    if np.any(b_hh[2 * hidden:] != 0):
        raise ValueError("b_hh: expected b_hn = b_hh[2H:] all 0 (nnx.GRUCell has no b_hn)")
    cell = nnx.GRUCell(w_ih.shape[1], hidden, rngs=nnx.Rngs(0))
    _set(cell.dense_i.kernel, w_ih.T)
    _set(cell.dense_i.bias, b_ih + b_hh)  # b_hr, b_hz join the input side's biases; b_hn is 0
    _set(cell.dense_h.kernel, w_hh.T)
    return cell


def flax_readout(weight: np.ndarray, bias: np.ndarray) -> nnx.Linear:
    """`nnx.Linear(H, A)` computing torch's `nn.Linear` (weight [A, H], bias [A])."""
    linear = nnx.Linear(weight.shape[1], weight.shape[0], rngs=nnx.Rngs(0))
    _set(linear.kernel, weight.T)
    _set(linear.bias, bias)
    return linear


class FlaxStack(nnx.Module):
    """One `nnx.RNN(cell)` per layer over the whole sequence, then `tanh(readout)`: `[B, T, I]` -> `[B, T, A]`."""

    def __init__(self, cells: list[nnx.Module], readout: nnx.Linear):
        self.layers = nnx.List([nnx.RNN(cell, rngs=False) for cell in cells])
        self.readout = readout

    def __call__(self, z: jax.Array) -> jax.Array:
        for layer in self.layers:
            z = layer(z, rngs=carry_rngs())
        return jnp.tanh(self.readout(z))


def carry_rngs() -> nnx.Rngs:
    """The rng stream `nnx.RNN` hands to `initialize_carry`, made inside the traced call. The cells draw
    from it even for their zero carry, and a stream the module held (nnx.RNN's default) cannot be advanced
    once merged inside `jax.jit` (flax raises TraceContextError); under `nnx.jit` it could."""
    return nnx.Rngs(0)


class FlaxFeedbackCell(nnx.RNNCellBase):
    """The Traveller's step as an NNX cell, for `nnx.RNN`: the carry holds each layer's `(c, h)` and the
    last positions `[..., A]`, which the next step reads in front of its features `u_t [..., F]`."""

    def __init__(self, cells: list[nnx.Module], readout: nnx.Linear):
        self.cells = nnx.List(cells)
        self.readout = readout
        self.num_assets = readout.out_features

    def __call__(self, carry, u_t: jax.Array):
        states, y = carry
        z = jnp.concatenate([y, u_t], axis=-1)
        new_states = []
        for cell, state in zip(self.cells, states):
            state, z = cell(state, z)
            new_states.append(state)
        y = jnp.tanh(self.readout(z))
        return (tuple(new_states), y), y

    def initialize_carry(self, input_shape: tuple[int, ...], rngs=None):
        batch = input_shape[:-1]
        states = tuple(cell.initialize_carry(batch + (cell.in_features,), rngs) for cell in self.cells)
        return states, jnp.zeros(batch + (self.num_assets,), jnp.float32)

    @property
    def num_feature_axes(self) -> int:
        return 1


def flax_seq(cell: str) -> Callable[[Context, int, int, str], Case]:
    """Flax's `nnx.RNN(cell)` per layer over the whole sequence, positions given (no feedback). `cell`:
    "lstm" (`nnx.LSTMCell`), "optimized-lstm" (`nnx.OptimizedLSTMCell`) or "gru" (`nnx.GRUCell`)."""

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        _float32_only(ctx)
        if cell == "gru":
            cells = [flax_gru_cell(*layer) for layer in _gru_layers(ctx)]
        else:
            cell_type = nnx.OptimizedLSTMCell if cell == "optimized-lstm" else nnx.LSTMCell
            cells = [flax_lstm_cell(cell_type, *layer) for layer in _lstm_layers(ctx)]
        model = FlaxStack(cells, flax_readout(*_readout(ctx)))
        fb = _given_feedback(ctx, batch, steps)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def positions(params, x, fb):
            return nnx.merge(graphdef, params, rest)(jnp.concatenate([fb, x], axis=2))

        return _case(ctx, batch, steps, mode, positions, params, fb)

    return build


def flax_feedback(cell: str) -> Callable[[Context, int, int, str], Case]:
    """The Traveller as the Flax docs suggest: `nnx.RNN(FlaxFeedbackCell(...))` over `[B, T, F]`, with
    `nnx.LSTMCell`s (`cell` "lstm") or `nnx.OptimizedLSTMCell`s ("optimized-lstm") inside."""
    cell_type = nnx.OptimizedLSTMCell if cell == "optimized-lstm" else nnx.LSTMCell

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        _float32_only(ctx)
        cells = [flax_lstm_cell(cell_type, *layer) for layer in _lstm_layers(ctx)]
        model = nnx.RNN(FlaxFeedbackCell(cells, flax_readout(*_readout(ctx))), rngs=False)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def positions(params, x):
            return nnx.merge(graphdef, params, rest)(x, rngs=carry_rngs())

        return _case(ctx, batch, steps, mode, positions, params)

    return build


# ----------------------------------------------------------------------------------------------------
# Equinox
# ----------------------------------------------------------------------------------------------------


def eqx_lstm_cell(eqx: ModuleType, w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray, b_hh: np.ndarray):
    """An `eqx.nn.LSTMCell` computing torch's LSTM layer: torch's weight layout, one bias `b_ih + b_hh`."""
    cell = eqx.nn.LSTMCell(w_ih.shape[1], w_hh.shape[1], key=jax.random.PRNGKey(0))
    return eqx.tree_at(lambda c: (c.weight_ih, c.weight_hh, c.bias), cell,
                       (jnp.asarray(w_ih), jnp.asarray(w_hh), jnp.asarray(b_ih + b_hh)))


def eqx_gru_cell(eqx: ModuleType, w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray, b_hh: np.ndarray):
    """An `eqx.nn.GRUCell` computing torch's GRU layer: `bias = b_ih + [b_hr, b_hz, 0]`, `bias_n = b_hn`."""
    hidden = w_hh.shape[1]
    cell = eqx.nn.GRUCell(w_ih.shape[1], hidden, key=jax.random.PRNGKey(0))
    bias = b_ih + np.concatenate([b_hh[: 2 * hidden], np.zeros(hidden, b_hh.dtype)])
    return eqx.tree_at(lambda c: (c.weight_ih, c.weight_hh, c.bias, c.bias_n), cell,
                       (jnp.asarray(w_ih), jnp.asarray(w_hh), jnp.asarray(bias), jnp.asarray(b_hh[2 * hidden:])))


def eqx_readout(eqx: ModuleType, weight: np.ndarray, bias: np.ndarray):
    """An `eqx.nn.Linear(H, A)` with torch's `nn.Linear` weights."""
    linear = eqx.nn.Linear(weight.shape[1], weight.shape[0], key=jax.random.PRNGKey(0))
    return eqx.tree_at(lambda m: (m.weight, m.bias), linear, (jnp.asarray(weight), jnp.asarray(bias)))


def eqx_traveller_positions(params: dict, x: jax.Array) -> jax.Array:
    """The Traveller with Equinox cells: `params` {"cells": LSTMCells, "readout": Linear}, x `[B, T, F]` ->
    positions `[B, T, A]`. One sequence is a `lax.scan` of the feedback step; `jax.vmap` adds the batch."""
    cells, readout = params["cells"], params["readout"]

    def one(u: jax.Array) -> jax.Array:  # [T, F] -> [T, A]
        def step(carry, u_t):
            states, y = carry
            z = jnp.concatenate([y, u_t])
            new_states = []
            for cell, state in zip(cells, states):
                z, c = cell(z, state)  # (h, c): torch's order
                new_states.append((z, c))
            y = jnp.tanh(readout(z))
            return (tuple(new_states), y), y

        zero = jnp.zeros(cells[0].hidden_size, u.dtype)
        init = (tuple((zero, zero) for _ in cells), jnp.zeros(readout.out_features, u.dtype))
        return jax.lax.scan(step, init, u)[1]

    return jax.vmap(one)(x)


def eqx_gru_positions(params: dict, x: jax.Array, fb: jax.Array) -> jax.Array:
    """Equinox GRU layers over the whole sequence, positions given: `[B, T, F]`, fb `[B, T, A]` -> `[B, T, A]`.
    One sequence is a `lax.scan` per layer; `jax.vmap` adds the batch."""
    cells, readout = params["cells"], params["readout"]

    def one(seq: jax.Array) -> jax.Array:  # [T, A + F] -> [T, A]
        for cell in cells:
            zero = jnp.zeros(cell.hidden_size, seq.dtype)
            seq = jax.lax.scan(lambda h, s, cell=cell: (cell(s, h),) * 2, zero, seq)[1]
        return jnp.tanh(jax.vmap(readout)(seq))

    return jax.vmap(one)(jnp.concatenate([fb, x], axis=2))


def eqx_traveller(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The Traveller with `eqx.nn.LSTMCell`s in a `lax.scan`, vmapped over the batch (`eqx_traveller_positions`)."""
    _float32_only(ctx)
    eqx = _require("equinox")
    params = {"cells": tuple(eqx_lstm_cell(eqx, *layer) for layer in _lstm_layers(ctx)),
              "readout": eqx_readout(eqx, *_readout(ctx))}
    return _case(ctx, batch, steps, mode, eqx_traveller_positions, params)


def eqx_gru_seq(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """`eqx.nn.GRUCell` layers over the whole sequence (`eqx_gru_positions`), positions given (no feedback)."""
    _float32_only(ctx)
    eqx = _require("equinox")
    params = {"cells": tuple(eqx_gru_cell(eqx, *layer) for layer in _gru_layers(ctx)),
              "readout": eqx_readout(eqx, *_readout(ctx))}
    return _case(ctx, batch, steps, mode, eqx_gru_positions, params, _given_feedback(ctx, batch, steps))


# ----------------------------------------------------------------------------------------------------
# torchax
# ----------------------------------------------------------------------------------------------------


def import_torchax() -> ModuleType:
    """Import torchax and build its default environment (which imports its op tables); returns the module,
    or raises Skip (n/a) when torchax is not installed. Two adjustments, so that it loads and leaves the
    rest of the suite working:

    - torchax 0.0.13 names, in those tables, aten overloads that torch 2.13 removed (the named-dimension
      ones, `NAMED_DIM_OVERLOADS`), and `torch.ops.aten.<op>.<overload>` raises AttributeError for them.
      While importing, such a lookup returns a placeholder object instead (restored after): it only ever
      serves as a table key or a list entry that matches no op (named tensors are never used here). Any
      other missing overload still raises.
    - torchax registers itself as torch's PrivateUse1 device "jax", which makes it torch's accelerator, and
      its device module says it is available. torch.compile then asks that accelerator for its current
      stream and fails ("PyTorch is not linked with support for jax devices"), so every torch.compile row
      measured after this one would fail. Its `is_available` is made to answer False, as torch's did before
      the import: JAX, not torch, runs torchax tensors, and nothing here asks torch about that device.
    """
    reason = missing("torchax")
    if reason:
        raise Skip(reason)
    if "torchax" in sys.modules:  # imported before (by this function, or by the user's own code)
        torchax = sys.modules["torchax"]
    else:
        from torch import _ops

        packet = _ops.OpOverloadPacket
        original = packet.__getattr__

        def lenient(self, name: str):
            try:
                return original(self, name)
            except AttributeError:
                if any(part in name.lower() for part in NAMED_DIM_OVERLOADS):
                    return _RemovedOverload(f"{self._qualified_op_name}.{name}")
                raise

        packet.__getattr__ = lenient
        try:
            torchax = importlib.import_module("torchax")  # its amp table names such overloads at import,
            torchax.default_env()  # and its environment loads the op and decomposition tables
        finally:
            packet.__getattr__ = original
    torchax.device_module.is_available = lambda: False  # torch.accelerator.is_available() stays False
    return torchax


class _RemovedOverload:
    """Stands for an aten overload this torch no longer has (see `import_torchax`)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<removed overload {self.name}>"


def torchax_loop(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The `torch-loop` row's model and code (`torch_ref.Traveller(x, method="loop")`: a Python loop calling
    `nn.LSTM` on one step at a time) as a JAX function (`torchax.extract_jax`) under `jax.jit`. Tracing
    runs the Python loop, so the compiled program holds T copies of the step."""
    _float32_only(ctx)
    if mode == "train" and steps > TORCHAX_TRAIN_MAX_T:
        raise Skip(f"train at T <= {TORCHAX_TRAIN_MAX_T} only: torchax differentiates the unrolled loop, whose "
                   "compile took 196 s at T=100 (B=1, 2-core CPU)")
    torchax = import_torchax()
    # extract_jax copies the weights into JAX arrays: the train step updates those, not the shared model.
    states, function = torchax.extract_jax(ctx.torch_model)

    def positions(states, x):
        return function(states, (x,), {"method": "loop"})[0]  # (positions, state): the positions

    return _case(ctx, batch, steps, mode, positions, states)
