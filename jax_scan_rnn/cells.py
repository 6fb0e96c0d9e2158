"""One-step LSTM, GRU and Elman RNN cells whose math and parameters are PyTorch's.

Flax's own cells differ from `torch.nn` (carry order `(c, h)`, one bias, and `nnx.GRUCell` has no
`b_hn`), so weights trained in PyTorch would not mean the same thing there. These cells reproduce
`torch.nn.LSTMCell` / `torch.nn.GRUCell` exactly, their call too (as Equinox's cells do):

    h = gru_cell(x, h)              # x [B, I] (or [I]), h [B, H]; hx None: zeros
    h, c = lstm_cell(x, (h, c))     # not Flax's (carry, x) -> (carry, y), which would read x as the state

Parameter layout (per cell), with G gates (LSTM: 4, GRU: 3, the Elman RNN: 1) stacked along the last axis:

    w_ih  [I, G*H]   = torch `weight_ih`.T     (Flax's `x @ kernel` convention)
    w_hh  [R, G*H]   = torch `weight_hh`.T     (R = H, or P for an LSTM with a projection)
    b_ih  [G*H]      = torch `bias_ih`         (absent, None, with `bias=False`)
    b_hh  [G*H]      = torch `bias_hh`         (absent, None, with `bias=False`)
    w_hr  [H, P]     = torch `weight_hr`.T     (LSTM with `proj_size=P > 0` only)

Both biases are kept, as in PyTorch, so that a torch -> jax -> torch round trip is bit-exact and
the GRU's `b_hn` (which sits inside `r * (...)`) keeps its meaning.

A step is split in two so that loops can hoist work out of `lax.scan`:
`input_projection(x) = x @ w_ih + b_ih` depends only on the input, so a whole sequence's projections
are one matmul before the scan; `step(carry, xp)` does the recurrent part. The gate arithmetic after the
matmuls (`lstm_gates`, `gru_gates`) has a hand-written derivative (`HAND_WRITTEN_VJP`, at the end).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn import validate

Array = jax.Array


# The smallest draw `uniform` makes: every parameter of up to this many numbers shares one program.
MIN_DRAW = 256


def uniform(key: Array, shape: tuple[int, ...], dtype, minval: float = 0.0, maxval: float = 1.0, *,
            scale: float | None = None, offset: float = 0.0) -> Array:
    """`jax.random.uniform(key, shape, dtype, minval, maxval)`, bit for bit, without a program per shape.

    With `scale`: that draw `* scale - offset`, each rounded in `dtype` (as `nnx.initializers.uniform(scale)`
    and a subtraction after it would give).

    `jax.random.uniform` compiles one program per shape, so building a model compiled one per parameter shape
    (docs/measurements.md#parameter-draws).
    With JAX's default, partitionable threefry key, number i of a draw depends only on the key and i, so the
    first n numbers of a longer draw are the same numbers: this draws the next power of two (at least
    `MIN_DRAW`) and cuts. One program serves every size up to it. Other key implementations draw the shape.
    Inside a transformation (`jax.jit`, `nnx.eval_shape`) the cut is part of the traced program.
    """
    n = math.prod(shape)
    prefix_stable = jax.config.jax_threefry_partitionable and str(jax.random.key_impl(key)) == "threefry2x32"
    size = max(MIN_DRAW, 1 << max(n - 1, 0).bit_length()) if prefix_stable else None
    flat = jax.random.uniform(key, shape if size is None else (size,), dtype, minval, maxval)
    traced = isinstance(flat, jax.core.Tracer)
    xp = jnp if traced else np  # NumPy cuts a concrete draw: JAX would compile a slice and a reshape per shape
    out = flat if traced else jax.device_get(flat)  # an explicit transfer, which jax.transfer_guard allows
    if size:
        out = out[:n].reshape(shape)
    if scale is not None:
        out = out * xp.asarray(scale, out.dtype) - xp.asarray(offset, out.dtype)
    return out if traced else jax.device_put(out)  # not jnp.asarray, which compiles an identity per shape


def _torch_uniform(key: Array, shape: tuple[int, ...], bound: float, dtype) -> Array:
    # torch.nn.RNNBase.reset_parameters: every weight and bias ~ U(-1/sqrt(H), 1/sqrt(H)).
    return uniform(key, shape, dtype, -bound, bound)


# A contraction this thin (the Traveller's 2 fed-back positions in, its 2 positions out) is cheaper as
# broadcast-multiply-add, which XLA fuses into the neighbouring gate arithmetic, than as a matmul call of
# its own. Measured: docs/measurements.md#thin-matmuls-as-fused-arithmetic.
THIN_MATMUL_DIM = 4
# A thin N with a wide K (the readout h [B, H] @ [H, A]) only for a single row: with more rows its gradient
# becomes a batch reduction in every backward step, slower than a dot. Same measurement page.
THIN_OUTPUT_MAX_ROWS = 1


def matmul(x: Array, w: Array, compute_dtype=None) -> Array:
    """`x @ w` (`[..., K] x [K, N] -> [..., N]`) with operands in `compute_dtype` (if set) and the result
    and accumulation in `x`'s dtype.

    With `compute_dtype=jnp.bfloat16` the matmuls read bf16 operands (half the memory traffic, the fast
    tensor-core path on GPUs) while the state, the gates and every sum stay in float32. When K is at most
    `THIN_MATMUL_DIM`, or N is and `x` has at most `THIN_OUTPUT_MAX_ROWS` rows, the product is written as
    a sum of K broadcast products (same value, summed in another order), which XLA fuses with its neighbours.
    """
    dtype = compute_dtype or x.dtype
    a, b = x.astype(dtype), w.astype(dtype)
    k, n = w.shape
    rows = x.shape[:-1]  # symbolic under jax.export's shape polymorphism ("b"): any size, so not a single row
    single = all(isinstance(r, int) for r in rows) and math.prod(rows) <= THIN_OUTPUT_MAX_ROWS
    if k <= THIN_MATMUL_DIM or (n <= THIN_MATMUL_DIM and single):
        return jnp.sum(a[..., :, None].astype(x.dtype) * b.astype(x.dtype), axis=-2)
    return jnp.matmul(a, b, preferred_element_type=x.dtype)


class RNNCellBase(nnx.Module):
    """A recurrent cell with PyTorch's parameter layout (`torch.nn.RNNCellBase`); subclasses define `num_gates`
    and `step`."""

    num_gates: int = 0

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        *,
        param_dtype=jnp.float32,
        compute_dtype=None,
        rngs: nnx.Rngs,
    ):
        if not isinstance(rngs, nnx.Rngs):  # (an int would fail deep inside as "'int' has no attribute 'params'")
            raise TypeError(f"rngs: expected an nnx.Rngs, e.g. rngs=nnx.Rngs(0), got {type(rngs).__name__}")
        input_size = validate.integer("input_size", input_size, lo=1)  # a plain int from here on
        hidden_size = validate.integer("hidden_size", hidden_size, lo=1)
        bias = validate.boolean("bias", bias)
        compute_dtype = validate.model_dtype("compute_dtype", compute_dtype, none=True)
        param_dtype = validate.model_dtype("param_dtype", param_dtype)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.compute_dtype = compute_dtype
        # The mode NNX's `.train()` / `.eval()` set (False / True), as on nnx.Dropout. No number here depends on it
        # (a cell has no dropout): it is the mode a torch twin is given (`convert.to_torch_module`), as a layer's.
        self.deterministic = False
        gh = self.num_gates * hidden_size
        bound = 1.0 / math.sqrt(hidden_size)
        self.w_ih = nnx.Param(_torch_uniform(rngs.params(), (input_size, gh), bound, param_dtype))
        self.w_hh = nnx.Param(_torch_uniform(rngs.params(), (self.state_size, gh), bound, param_dtype))
        self.b_ih = nnx.Param(_torch_uniform(rngs.params(), (gh,), bound, param_dtype)) if bias else None
        self.b_hh = nnx.Param(_torch_uniform(rngs.params(), (gh,), bound, param_dtype)) if bias else None

    @property
    def state_size(self) -> int:
        """R, the size of the recurrent output `h` (H; P for an LSTM with a projection)."""
        return self.hidden_size

    @property
    def bias(self) -> bool:
        return self.b_ih is not None

    def matmul(self, x: Array, w: Array) -> Array:
        """`matmul(x, w, self.compute_dtype)`: see the module-level `matmul`."""
        return matmul(x, w, self.compute_dtype)

    def input_projection(self, x: Array) -> Array:
        """`x @ w_ih + b_ih`: `[..., I] -> [..., G*H]`. Independent of the state, so hoistable."""
        return _add_bias(self.matmul(x, self.w_ih[...]), self.b_ih)

    def initial_state(self, batch_size: int, dtype=jnp.float32):
        """The zero state for `batch_size` sequences: `h [B, R]` (an LSTM's carries its `c [B, H]` too)."""
        # Only what is surely no size is refused: a symbolic size (jax.export) and a 0-d integer array are sizes.
        if isinstance(batch_size, (bool, float, str, type(None))) or (
                isinstance(batch_size, (int, np.integer)) and batch_size < 1):
            raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        return jnp.zeros((batch_size, self.state_size), dtype)

    def step(self, carry, xp: Array):
        """One recurrent step from a projected input `xp [B, G*H]`; returns `(new_carry, h [B, R])`."""
        raise NotImplementedError

    def __call__(self, input: validate.ArrayInput, hx=None):
        """torch's call, one step: `input [B, I]` (or unbatched `[I]`) and the state `hx` (zeros when None) give
        `torch.nn.GRUCell`'s `h' [B, H]`, `torch.nn.LSTMCell`'s `(h', c')` (`h' [B, R]`, `c' [B, H]`); unbatched
        `[H]` leaves for an unbatched input. This library's loops call `step(carry, input_projection(x))` instead,
        so a whole sequence's projections can be hoisted out of the loop."""
        x = validate.floating_array("input", input, like=self.w_ih.dtype)
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size or 0 in x.shape:
            raise ValueError(f"input: expected shape [B, {self.input_size}] or unbatched [{self.input_size}], "
                             f"got {tuple(x.shape)}")
        batch = None if x.ndim == 1 else x.shape[0]
        expected = self.initial_state(batch or 1, x.dtype)
        shape = "[{}]" if batch is None else f"[{batch}, {{}}]"
        desc = state_description(shape.format(self.state_size),
                                 shape.format(self.hidden_size) if isinstance(expected, tuple) else None)
        unbatched_axis = 0 if batch is None else None
        carry = expected if hx is None else check_carry("hx", hx, expected, desc, batch_axis=unbatched_axis)
        carry, _ = self.step(carry, self.input_projection(x if batch else x[None]))
        return carry if batch else jax.tree.map(lambda a: a[0], carry)

    def _hidden_projection(self, h: Array) -> Array:
        return _add_bias(self.matmul(h, self.w_hh[...]), self.b_hh)


def check_carry(name: str, given, expected, desc: str, batch_axis: int | None = None):
    """A user's state `given` against the zero state `expected`: the same structure (torch's list `[h, c]` read as
    the tuple), each leaf of `expected`'s shape, less `batch_axis` when one is given (the state of an unbatched
    input), and floating. Returns it cast to `expected`'s dtype, the batch axis put back. Errors name `name` and
    say `desc`, what was expected."""
    given = validate.from_torch(given)
    if type(given) is list and isinstance(expected, tuple):  # torch's LSTM takes [h, c] too
        given = tuple(given)
    if jax.tree.structure(expected) != jax.tree.structure(given):
        raise ValueError(f"{name}: expected {desc}, got {_described(given)}")
    for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(given)):
        want = e.shape if batch_axis is None else e.shape[:batch_axis] + e.shape[batch_axis + 1:]
        if tuple(jnp.shape(g)) != want:
            raise ValueError(f"{name}: expected {desc}, got shape {tuple(jnp.shape(g))}")
        if not jnp.issubdtype(jnp.result_type(g), jnp.floating):
            raise TypeError(f"{name}: expected a floating dtype, got {jnp.result_type(g)}")
    return jax.tree.map(lambda g, e: jnp.asarray(g, e.dtype).reshape(e.shape), given, expected)


def state_description(h: str, c: str | None = None) -> str:
    """What a state must be, in words, from its shapes (`c` an LSTM's): "a [2, 4, 8] array", "a tuple (h, c) of
    [2, 4, 8] arrays", "a tuple (h [4, 2], c [4, 5])" (an LSTM with a projection)."""
    if c is None:
        return f"a {h} array"
    return f"a tuple (h, c) of {h} arrays" if h == c else f"a tuple (h {h}, c {c})"


def _described(value) -> str:
    """A wrong state in words: "one array of shape (2, 3, 16)", "a tuple of 3 ((2, 3, 16), ...)"."""
    if isinstance(value, (tuple, list)):
        parts = ", ".join(str(tuple(jnp.shape(v))) if hasattr(v, "shape") else type(v).__name__ for v in value)
        return f"a {type(value).__name__} of {len(value)} ({parts})"
    if hasattr(value, "shape"):
        return f"one array of shape {tuple(jnp.shape(value))}"
    return f"a {type(value).__name__}"


def _add_bias(y: Array, b: nnx.Param | None) -> Array:
    return y if b is None else y + b[...].astype(y.dtype)


class LSTMCell(RNNCellBase):
    """`torch.nn.LSTMCell`, and one layer of `torch.nn.LSTM(proj_size=P)`. Carry `(h [B, R], c [B, H])`
    (PyTorch's order, not Flax's `(c, h)`), R = H, or P with a projection.

        i = sigmoid(W_ii x + b_ii + W_hi h + b_hi)
        f = sigmoid(W_if x + b_if + W_hf h + b_hf)
        g = tanh   (W_ig x + b_ig + W_hg h + b_hg)
        o = sigmoid(W_io x + b_io + W_ho h + b_ho)
        c' = f * c + i * g
        h' = o * tanh(c')                   (proj_size = 0)
        h' = W_hr (o * tanh(c'))            (proj_size = P > 0: h' is [B, P], c' stays [B, H])

    Gates are stacked i, f, g, o along the `4*H` axis of `w_ih [I, 4H]`, `w_hh [R, 4H]`, `b_ih`, `b_hh`;
    `w_hr [H, P]` is torch's `weight_hr.T`.
    """

    num_gates = 4

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *, proj_size: int = 0, **kwargs):
        validate.integer("hidden_size", hidden_size, lo=1)
        proj_size = validate.integer("proj_size", proj_size, lo=0, hi=hidden_size - 1)  # as torch: 0 or P < H
        self.proj_size = proj_size
        # checked once here: the base class then gets the dtype JAX holds (one warning for float64 without x64)
        param_dtype = kwargs["param_dtype"] = validate.model_dtype("param_dtype", kwargs.get("param_dtype", jnp.float32))
        super().__init__(input_size, hidden_size, bias, **kwargs)
        rngs = kwargs["rngs"]
        bound = 1.0 / math.sqrt(hidden_size)
        self.w_hr = nnx.Param(_torch_uniform(rngs.params(), (hidden_size, proj_size), bound, param_dtype)) if proj_size else None

    @property
    def state_size(self) -> int:
        return self.proj_size or self.hidden_size

    def initial_state(self, batch_size: int, dtype=jnp.float32) -> tuple[Array, Array]:
        h = super().initial_state(batch_size, dtype)
        return h, jnp.zeros((h.shape[0], self.hidden_size), dtype)

    def step(self, carry: tuple[Array, Array], xp: Array) -> tuple[tuple[Array, Array], Array]:
        h, c = carry
        h, c = lstm_gates(xp + self._hidden_projection(h), c)
        if self.w_hr is not None:
            h = self.matmul(h, self.w_hr[...])
        return (h, c), h


class GRUCell(RNNCellBase):
    """`torch.nn.GRUCell`. Carry `h [B, H]`.

        r  = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z  = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n  = tanh   (W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h

    Gates are stacked r, z, n along the `3*H` axis of `w_ih [I, 3H]`, `w_hh [H, 3H]`, `b_ih`, `b_hh`.
    `b_hn` sits inside `r * (...)`, which is why the two biases cannot be folded into one.
    """

    num_gates = 3

    def step(self, carry: Array, xp: Array) -> tuple[Array, Array]:
        h = gru_gates(xp, self._hidden_projection(carry), carry)
        return h, h


NONLINEARITIES = ("tanh", "relu")  # torch.nn.RNN's


class RNNCell(RNNCellBase):
    """`torch.nn.RNNCell`, the Elman cell. Carry `h [B, H]`.

        h' = tanh(W_ih x + b_ih + W_hh h + b_hh)        (nonlinearity="tanh", torch's default)
        h' = relu(W_ih x + b_ih + W_hh h + b_hh)        (nonlinearity="relu")

    `w_ih [I, H]`, `w_hh [H, H]`, `b_ih`, `b_hh` (one gate). No gates to fuse, so JAX's own derivative.
    """

    num_gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", **kwargs):
        self.nonlinearity = validate.choice("nonlinearity", nonlinearity, NONLINEARITIES)
        super().__init__(input_size, hidden_size, bias, **kwargs)

    def step(self, carry: Array, xp: Array) -> tuple[Array, Array]:
        pre = xp + self._hidden_projection(carry)
        h = jnp.tanh(pre) if self.nonlinearity == "tanh" else jax.nn.relu(pre)
        return h, h


# The gate arithmetic of one step (everything after the matmuls), with its derivative written out: JAX's own
# reverse mode of the same expressions gives the same gradients from a slower backward loop, and a custom_jvp
# of this rule did not speed it up (docs/measurements.md#the-cells-derivatives). A custom_vjp has no forward
# mode: for `jax.jvp` or `jax.jacfwd` through a cell, set `HAND_WRITTEN_VJP = False` (read when the cell is
# traced: before the first call of a jitted function). Forward over reverse (`jax.hessian`, Hessian-vector
# products) differentiates the backward rule itself and works (tests/test_layers.py).
HAND_WRITTEN_VJP = True
# What JAX says when forward mode meets a custom_vjp, and what the library adds to it.
_FORWARD_MODE_ERROR = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"
FORWARD_MODE_HINT = ("jax_scan_rnn's LSTM and GRU cells differentiate their gates with a hand-written reverse-mode "
                     "rule: for jax.jvp or jax.jacfwd through them, set jax_scan_rnn.cells.HAND_WRITTEN_VJP = False "
                     "before tracing (jax.hessian, forward over reverse, works with the rule)")


def explain_forward_mode(fn: Callable) -> Callable:
    """`fn`, whose error for forward-mode autodiff through the cells' rule also says how to turn the rule off.
    Around the gates (a cell called alone) and `scan.time_scan` (a scan's derivative traces its body again,
    outside the cell's own call)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as err:
            text = str(err)
            if _FORWARD_MODE_ERROR not in text or FORWARD_MODE_HINT in text or not HAND_WRITTEN_VJP:
                raise
            raise TypeError(f"{text}: {FORWARD_MODE_HINT}") from None

    return wrapper


def _lstm_gates_forward(gates: Array, c: Array):
    """`((h, c'), residuals)`; the derivatives below use sigmoid' = s (1 - s) and tanh' = 1 - tanh^2."""
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    c_new = f * c + i * g
    tanh_c = jnp.tanh(c_new)
    return (o * tanh_c, c_new), (i, f, g, o, c, tanh_c)


def _lstm_gates_backward(res, ct):
    i, f, g, o, c, tanh_c = res
    dh, dc_new = ct
    dc = dh * o * (1 - tanh_c * tanh_c) + dc_new
    d_gates = jnp.concatenate([dc * g * i * (1 - i), dc * c * f * (1 - f), dc * i * (1 - g * g),
                               dh * tanh_c * o * (1 - o)], axis=-1)
    return d_gates, dc * f


def _lstm_gates(gates: Array, c: Array) -> tuple[Array, Array]:
    return _lstm_gates_forward(gates, c)[0]


_lstm_gates_vjp = jax.custom_vjp(_lstm_gates)
_lstm_gates_vjp.defvjp(_lstm_gates_forward, _lstm_gates_backward)


@explain_forward_mode
def lstm_gates(gates: Array, c: Array) -> tuple[Array, Array]:
    """`(h, c')` from the pre-activations `gates [B, 4H]` (i, f, g, o) and `c [B, H]`: `LSTMCell`'s equations."""
    return (_lstm_gates_vjp if HAND_WRITTEN_VJP else _lstm_gates)(gates, c)


def _gru_gates_forward(xp: Array, hp: Array, h: Array):
    x_r, x_z, x_n = jnp.split(xp, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(hp, 3, axis=-1)
    r = jax.nn.sigmoid(x_r + h_r)
    z = jax.nn.sigmoid(x_z + h_z)
    n = jnp.tanh(x_n + r * h_n)
    return (1.0 - z) * n + z * h, (r, z, n, h_n, h)


def _gru_gates_backward(res, dh_new):
    r, z, n, h_n, h = res
    d_n = dh_new * (1.0 - z) * (1 - n * n)  # through tanh: the n gate's pre-activation
    d_r = d_n * h_n * r * (1 - r)
    d_z = dh_new * (h - n) * z * (1 - z)
    return jnp.concatenate([d_r, d_z, d_n], axis=-1), jnp.concatenate([d_r, d_z, d_n * r], axis=-1), dh_new * z


def _gru_gates(xp: Array, hp: Array, h: Array) -> Array:
    return _gru_gates_forward(xp, hp, h)[0]


_gru_gates_vjp = jax.custom_vjp(_gru_gates)
_gru_gates_vjp.defvjp(_gru_gates_forward, _gru_gates_backward)


@explain_forward_mode
def gru_gates(xp: Array, hp: Array, h: Array) -> Array:
    """`h'` from the input and hidden projections `xp`, `hp [B, 3H]` (r, z, n) and `h [B, H]`: `GRUCell`'s
    equations."""
    return (_gru_gates_vjp if HAND_WRITTEN_VJP else _gru_gates)(xp, hp, h)
