"""Behaviour of jsr.LSTM/GRU outside parity: bad input, dropout modes, initial states, jit."""
from __future__ import annotations

import re
import warnings

import flax.errors
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_scan_rnn as jsr

KINDS = (jsr.LSTM, jsr.GRU)


@pytest.mark.parametrize("cls", KINDS)
def test_output_and_state_shapes(cls):
    """torch's default layout is time-major: [T, B, I] -> [T, B, H]; batch_first=True reads [B, T, I]."""
    model = cls(3, 5, num_layers=2, rngs=nnx.Rngs(0))
    out, state = model(jnp.ones((6, 4, 3)))
    assert out.shape == (6, 4, 5)
    for leaf in jax.tree.leaves(state):
        assert leaf.shape == (2, 4, 5)
    assert isinstance(state, tuple) == (cls is jsr.LSTM)
    out, state = cls(3, 5, 2, batch_first=True, rngs=nnx.Rngs(0))(jnp.ones((4, 6, 3)))
    assert out.shape == (4, 6, 5) and all(leaf.shape == (2, 4, 5) for leaf in jax.tree.leaves(state))


@pytest.mark.parametrize("cls", KINDS)
def test_wrong_rank_is_a_value_error(cls):
    model = cls(3, 5, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"x: expected shape \[T, B, 3\] \(batch_first=False\) or unbatched \[T, 3\], with T, B >= 1, got \(6,\)"):
        model(jnp.ones((6,)))


@pytest.mark.parametrize("cls", KINDS)
def test_wrong_feature_size_is_a_value_error(cls):
    model = cls(3, 5, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"x: expected shape \[T, B, 3\] .* got \(2, 6, 4\)"):
        model(jnp.ones((2, 6, 4)))
    with pytest.raises(ValueError, match=r"x: expected shape \[B, T, 3\] or unbatched .* got \(2, 0, 3\)"):
        cls(3, 5, batch_first=True, rngs=nnx.Rngs(0))(jnp.ones((2, 0, 3)))


@pytest.mark.parametrize("cls", KINDS)
def test_no_array_is_named(cls):
    """None or a string for `x`, eager or through `jsr.jit`: one line naming `x`, not JAX's own error ("None is not a
    valid value for jnp.array", "Value 'abc' with dtype <U3 is not a valid JAX array type")."""
    model = cls(3, 5, rngs=nnx.Rngs(0))
    for call in (model, jsr.jit(model)):
        with pytest.raises(TypeError, match="^x: expected a floating array, got NoneType"):
            call(None)
        with pytest.raises(TypeError, match="^x: expected a floating array, got str"):
            call("abc")


@pytest.mark.parametrize("cls", KINDS)
def test_integer_input_is_a_type_error(cls):
    model = cls(3, 5, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="x: expected a floating dtype, got int"):
        model(jnp.ones((2, 6, 3), dtype=jnp.int32))


def test_mismatched_initial_state_shape_is_a_value_error():
    model = jsr.LSTM(3, 5, num_layers=2, rngs=nnx.Rngs(0))
    bad = (jnp.zeros((1, 2, 5)), jnp.zeros((1, 2, 5)))
    with pytest.raises(ValueError, match=r"initial_state: expected a tuple \(h, c\) of \[2, 2, 5\] arrays, got shape"):
        model(jnp.ones((6, 2, 3)), bad)


def test_lstm_initial_state_must_be_a_pair():
    model = jsr.LSTM(3, 5, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"initial_state: expected a tuple \(h, c\) of \[1, 2, 5\] arrays, got one "
                                         r"array of shape \(1, 2, 5\)$"):
        model(jnp.ones((6, 2, 3)), jnp.zeros((1, 2, 5)))
    with pytest.raises(ValueError, match=r"got a tuple of 3 \(\(1, 2, 5\), \(1, 2, 5\), NoneType\)$"):
        model(jnp.ones((6, 2, 3)), (jnp.zeros((1, 2, 5)), jnp.zeros((1, 2, 5)), None))
    out, _ = model(jnp.ones((6, 2, 3)), [jnp.zeros((1, 2, 5)), jnp.zeros((1, 2, 5))])  # torch's LSTM takes a list
    np.testing.assert_array_equal(out, model(jnp.ones((6, 2, 3)))[0])
    with pytest.raises(ValueError, match=r"initial_state: expected a \[1, 2, 5\] array, got a list of 2"):
        jsr.GRU(3, 5, rngs=nnx.Rngs(0))(jnp.ones((6, 2, 3)), [jnp.zeros((1, 2, 5))] * 2)


def test_torchs_hx_keyword_is_the_initial_state():
    """torch code calls `lstm(x, hx=(h0, c0))`: the same state as given positionally, its errors naming hx."""
    model = jsr.LSTM(3, 5, num_layers=2, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(6).standard_normal((6, 2, 3)), jnp.float32)
    state = (jnp.full((2, 2, 5), 0.3), jnp.full((2, 2, 5), -0.2))
    for got, want in zip(jax.tree.leaves(model(x, hx=state)), jax.tree.leaves(model(x, state))):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"^hx: expected a tuple \(h, c\) of \[2, 2, 5\] arrays, got shape"):
        model(x, hx=(jnp.zeros((1, 2, 5)), jnp.zeros((1, 2, 5))))
    with pytest.raises(ValueError, match=r"^hx: expected hx or initial_state \(torch's name and this library's for "
                                         r"the same state\), got both$"):
        model(x, state, hx=state)


def test_rngs_must_be_an_rngs():
    with pytest.raises(TypeError, match=r"^rngs: expected an nnx.Rngs, e.g. rngs=nnx.Rngs\(0\), got int$"):
        jsr.GRU(3, 4, rngs=0)


def test_rngs_without_a_dropout_stream_is_named():
    # Flax's own KeyError("No RngStream named 'dropout'") came from inside, for a 1-layer GRU at dropout=0 too.
    with pytest.raises(ValueError, match=r"^rngs: expected an nnx.Rngs with a 'dropout' stream, held even at "
                                         r"dropout=0 .* got one with streams \['params'\]$"):
        jsr.GRU(3, 4, rngs=nnx.Rngs(params=0))
    jsr.GRU(3, 4, rngs=nnx.Rngs(params=0, dropout=1))
    with pytest.raises(ValueError, match=r"^rngs: expected an nnx.Rngs with a 'dropout' stream"):
        jsr.Traveller(3, 4, rngs=nnx.Rngs(params=0))


def test_dropout_masks_are_drawn_from_the_dropout_stream_given():
    # The same weights (params=0) and input in training mode: the dropout stream's seed alone decides the masks.
    x = jax.random.normal(jax.random.key(0), (5, 2, 3))

    def out(seed):
        return jsr.GRU(3, 4, num_layers=2, dropout=0.5, rngs=nnx.Rngs(params=0, dropout=seed))(x)[0]

    np.testing.assert_array_equal(out(1), out(1))
    assert not np.array_equal(out(1), out(2))


@pytest.mark.parametrize("make", [lambda: jsr.GRU(3, 5, rngs=nnx.Rngs(0)), lambda: jsr.LSTMCell(3, 5, rngs=nnx.Rngs(0)),
                                  lambda: jsr.RNNCell(3, 5, rngs=nnx.Rngs(0)),
                                  lambda: jsr.Traveller(3, 5, rngs=nnx.Rngs(0))])
@pytest.mark.parametrize("size", [True, 0, -2, 1.5, np.int64(0), "2", None])
def test_initial_state_batch_size_is_checked(make, size):
    # A bool was batch 1 (False: 0) without a word; -2, 1.5, "2" and None failed inside jnp.zeros without naming it.
    with pytest.raises(ValueError, match=rf"^batch_size: expected an int >= 1, got {re.escape(repr(size))}$"):
        make().initial_state(size)
    # A 0-d integer array is a size, as a symbolic one is (jax.export: tests/test_jax_export.py)
    for size in (np.int64(3), np.array(3), jnp.int32(3)):
        assert jax.tree.leaves(make().initial_state(size))[0].shape[-2] == 3


def test_lstm_cells_initial_state_holds_h_of_the_projection_and_c_of_the_hidden_size():
    h, c = jsr.LSTM(3, 5, proj_size=2, num_layers=2, rngs=nnx.Rngs(0)).initial_state(4, jnp.float64)
    assert (h.shape, c.shape, h.dtype, c.dtype) == ((2, 4, 2), (2, 4, 5), jnp.float64, jnp.float64)
    assert jsr.GRUCell(3, 5, rngs=nnx.Rngs(0)).initial_state(4).shape == (4, 5)


def test_a_list_of_lengths_traced_entry_by_entry_is_one_traced_array():
    # nnx.jit/jax.jit trace a list's entries one by one: "lengths: expected an integer array, got list" before.
    model = jsr.GRU(3, 4, batch_first=True, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 6, 3))
    got = nnx.jit(lambda m, x, lengths: m(x, lengths=lengths)[0])(model, x, [5, 3])
    np.testing.assert_array_equal(got, nnx.jit(lambda m, x, lengths: m(x, lengths=lengths)[0])(model, x,
                                                                                                jnp.array([5, 3])))
    # One entry traced beside a Python int ([n, 3] inside a jitted function of n): one traced array too.
    mixed = nnx.jit(lambda m, x, n: m(x, lengths=[n, 3])[0])(model, x, 5)
    np.testing.assert_array_equal(mixed, got)


def test_gru_initial_state_shape():
    model = jsr.GRU(3, 5, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"initial_state: expected a \[1, 2, 5\] array, got shape \(1, 3, 5\)"):
        model(jnp.ones((6, 2, 3)), jnp.zeros((1, 3, 5)))


def test_integer_initial_state_is_a_type_error():
    model = jsr.GRU(3, 5, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="initial_state: expected a floating dtype"):
        model(jnp.ones((6, 2, 3)), jnp.zeros((1, 2, 5), dtype=jnp.int32))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_layers=0), "num_layers: expected an int >= 1, got 0"),
        (dict(num_layers=True), "num_layers: expected an int >= 1, got True"),
        (dict(dropout=1.0), r"dropout: expected a finite number in \[0, 1\), got 1.0"),
        (dict(dropout=True), r"dropout: expected a finite number in \[0, 1\), got True"),
        (dict(unroll=0), "unroll: expected 'auto' or an int >= 1, got 0"),
        (dict(hidden_size=-1), "hidden_size: expected an int >= 1, got -1"),
        (dict(hidden_size=True), "hidden_size: expected an int >= 1, got True"),
        (dict(proj_size=5), r"proj_size: expected an int in \[0, 4\], got 5"),
        (dict(proj_size=-1), r"proj_size: expected an int in \[0, 4\], got -1"),
        (dict(remat_chunk=0), "remat_chunk: expected None or an int >= 1, got 0"),
    ],
)
def test_bad_constructor_arguments(kwargs, message):
    args = dict(input_size=3, hidden_size=5) | kwargs
    with pytest.raises(ValueError, match=message):
        jsr.LSTM(**args, rngs=nnx.Rngs(0))


def test_bad_flags_and_gru_projection():
    with pytest.raises(TypeError, match="batch_first: expected True or False, got 1"):
        jsr.GRU(3, 5, 1, True, 1, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="bias: expected True or False, got 'no'"):
        jsr.LSTM(3, 5, bias="no", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="proj_size: supported by LSTM only"):
        jsr.GRU(3, 5, proj_size=2, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("cls", KINDS)
def test_concrete_lengths_are_checked(cls):
    model = cls(3, 4, bidirectional=True, batch_first=True, rngs=nnx.Rngs(0))
    x = jnp.ones((3, 5, 3))
    for bad, where in (([5, 6, 1], r"lengths\[1\]=6$"), ([0, 2, 3], r"lengths\[0\]=0$"),
                       ([2, -4, 9], r"lengths\[1\]=-4 \(2 lengths out of range\)$")):
        with pytest.raises(ValueError, match=r"lengths: expected values in \[1, T=5\], got " + where):
            model(x, lengths=jnp.asarray(bad))
    with pytest.raises(TypeError, match="lengths: expected an integer array, got dtype float32"):
        model(x, lengths=jnp.asarray([1.0, 2.0, 3.0], jnp.float32))
    with pytest.raises(ValueError, match=r"lengths: expected shape \[B\] = \[3\], got \[2\]"):
        model(x, lengths=jnp.asarray([1, 2]))
    with pytest.raises(ValueError, match="lengths: expected None for unbatched"):
        model(x[0], lengths=jnp.asarray([2]))


@pytest.mark.parametrize("cls", KINDS)
def test_traced_lengths_out_of_range_never_give_nan(cls):
    """Under jit lengths cannot be checked: they are clipped to 0..T, so a bad one gives finite numbers
    (> T reads as T; <= 0 as an empty sequence: zero outputs, the initial state)."""
    model = cls(3, 4, 2, batch_first=True, bidirectional=True, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 5, 3)), jnp.float32)
    run = nnx.jit(lambda m, x, n: m(x, lengths=n))
    out, state = run(model, x, jnp.asarray([9, 5, 0, -4]))
    assert np.isfinite(np.asarray(out)).all() and all(np.isfinite(np.asarray(s)).all() for s in jax.tree.leaves(state))
    want, _ = model(x, lengths=jnp.asarray([5, 5, 1, 1]))
    np.testing.assert_array_equal(out[:2], want[:2])
    np.testing.assert_array_equal(out[2:], 0.0)



@pytest.mark.parametrize("hoist", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cls", [jsr.LSTM, jsr.GRU, jsr.RNN])
def test_padding_past_lengths_never_reaches_outputs_or_gradients(cls, bidirectional, hoist):
    """As in a packed sequence, steps past `lengths` are never read: NaN or inf there (missing values padded as NaN)
    gives the outputs, final state and gradients (parameters and input) of zero padding, bit for bit. Before, the
    forward pass was right but the discarded steps' NaN reached every gradient through the masked branch (0 * NaN)."""
    model = cls(3, 4, 2, batch_first=True, bidirectional=bidirectional, hoist_inputs=hoist, rngs=nnx.Rngs(0))
    lengths = jnp.asarray([5, 2, 3])
    x = np.random.default_rng(0).standard_normal((3, 5, 3)).astype(np.float32)
    x[1, 2:], x[2, 3:] = 0.0, 0.0
    padded = x.copy()
    padded[1, 2:], padded[2, 3:] = np.nan, np.inf

    def run(x):
        def loss(m, x):
            out, state = m(x, lengths=lengths)
            return jnp.sum(out**2) + sum(jnp.sum(s) for s in jax.tree.leaves(state)), (out, state)

        (_, forward), grads = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(model, jnp.asarray(x))
        return jax.tree.leaves((forward, grads))

    for got, want in zip(run(padded), run(x), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cls", KINDS)
def test_dropout_only_in_training_mode(cls):
    model = cls(3, 16, num_layers=2, dropout=0.5, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 10, 3)), jnp.float32)
    train_a, _ = model(x)
    train_b, _ = model(x)
    assert not np.allclose(train_a, train_b), "dropout masks must be fresh on each call in training mode"
    model.eval()
    eval_a, _ = model(x)
    eval_b, _ = model(x)
    np.testing.assert_array_equal(eval_a, eval_b)
    no_dropout = cls(3, 16, num_layers=2, dropout=0.0, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(no_dropout(x)[0], eval_a)  # same init stream -> same weights


@pytest.mark.parametrize("cls", KINDS)
def test_dropout_with_one_layer_warns_as_torch_does(cls, recwarn):
    """Inter-layer dropout has nothing to act on in a one-layer stack: torch.nn.LSTM/GRU warn, and so does jsr."""
    with pytest.warns(UserWarning, match=r"dropout=0.5 does nothing with num_layers=1") as caught:
        cls(3, 8, num_layers=1, dropout=0.5, rngs=nnx.Rngs(0))
    assert [w.filename for w in caught] == [__file__]  # the user's line, not Flax's constructor's (its metaclass)
    recwarn.clear()
    cls(3, 8, num_layers=2, dropout=0.5, rngs=nnx.Rngs(0))
    cls(3, 8, num_layers=1, dropout=0.0, rngs=nnx.Rngs(0))
    assert not [w for w in recwarn if "does nothing" in str(w.message)]


def test_dropout_masks_are_scaled_keep_masks():
    model = jsr.LSTM(3, 8, num_layers=3, dropout=0.25, rngs=nnx.Rngs(0))
    masks = model.dropout_masks((100, 4, 8), jnp.float32)
    assert masks.shape == (2, 100, 4, 8)
    np.testing.assert_allclose(np.unique(np.asarray(masks)), [0.0, 1 / 0.75], rtol=1e-6)
    assert abs(float((masks == 0).mean()) - 0.25) < 0.02
    model.eval()
    assert model.dropout_masks((100, 4, 8), jnp.float32) is None


@pytest.mark.parametrize("cls", KINDS)
def test_step_by_step_equals_whole_sequence(cls):
    """`step` (used by the feedback driver) is the same recurrence as the whole-sequence scan."""
    model = cls(3, 6, num_layers=3, batch_first=True, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 9, 3)))
    want, want_state = model(x)
    carries = model.unstack_state(model.initial_state(2, x.dtype))
    outs = []
    for t in range(9):
        carries, h = model.step(carries, model.layers[0].input_projection(x[:, t]))
        outs.append(h)
    np.testing.assert_allclose(jnp.stack(outs, 1), want, atol=1e-14)
    for got, ref in zip(jax.tree.leaves(model.stack_carries(carries)), jax.tree.leaves(want_state)):
        np.testing.assert_allclose(got, ref, atol=1e-14)


@pytest.mark.parametrize("cls", KINDS)
def test_step_applies_each_layers_own_mask_to_its_input(cls):
    """`step`'s masks `[L-1, B, H]`: mask k scales layer k's output on its way into layer k+1, written out by hand
    for three layers (the same mask for every layer, or none on the last, is a bug only L >= 3 shows)."""
    model = cls(3, 6, num_layers=3, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(2)
    x_t = jnp.asarray(rng.standard_normal((4, 3)))
    masks = jnp.asarray(rng.integers(0, 2, (2, 4, 6)) * 2.0)  # scaled keep-masks at rate 0.5, distinct per layer
    carries = model.unstack_state(jax.tree.map(lambda s: s + 0.1, model.initial_state(4, jnp.float64)))
    new, h = model.step(carries, model.layers[0].input_projection(x_t), masks)
    by_hand, inputs = [], x_t
    for k, layer in enumerate(model.layers):
        carry, out = layer.step(carries[k], layer.input_projection(inputs))
        by_hand.append(carry)
        inputs = out * masks[k] if k < 2 else out
    np.testing.assert_array_equal(h, out)
    for got, want in zip(jax.tree.leaves(new), jax.tree.leaves(by_hand)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cls", KINDS)
def test_training_dropout_never_touches_the_last_layers_output(cls, bidirectional):
    """torch.nn.LSTM/GRU drop each layer's output but the last one's: at rate 0.9 a dropped last layer would leave
    ~90% exact zeros, where an LSTM's or GRU's h is never exactly zero."""
    model = cls(3, 16, num_layers=3, dropout=0.9, bidirectional=bidirectional, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((20, 4, 3)), jnp.float32)
    out, _ = model(x)
    assert int((out == 0).sum()) == 0
    model.eval()
    assert not np.allclose(model(x)[0], out)  # the inner layers' dropout did act


@pytest.mark.parametrize("bidirectional", [False, True])
def test_training_dropout_never_touches_the_first_layers_input(bidirectional):
    """Dropout acts between layers only: layer 0's final state is the same in training and in eval mode (both its
    directions), the next layer's is not."""
    model = jsr.LSTM(5, 8, num_layers=2, dropout=0.5, bidirectional=bidirectional, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((7, 3, 5)), jnp.float32)
    _, trained = model(x)
    model.eval()
    _, evaluated = model(x)
    first = 2 if bidirectional else 1  # [L*D, B, H]: layer 0's directions come first
    for got, want in zip(trained, evaluated):
        np.testing.assert_array_equal(got[:first], want[:first])
        assert not np.array_equal(got[first:], want[first:])


def test_every_weight_is_initialised_as_torchs_reset_parameters():
    """torch draws every weight of an LSTM, the projection's included, from U(-1/sqrt(H), 1/sqrt(H))."""
    model = jsr.LSTM(4, 64, num_layers=2, proj_size=16, rngs=nnx.Rngs(0))
    bound = 1 / np.sqrt(64)
    for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        largest = float(np.abs(np.asarray(value[...])).max())
        assert 0.9 * bound < largest <= bound, f"{path}: max |w| {largest:.4f}, expected just below {bound:.4f}"


def test_float32_params_with_float32_input_stay_float32():
    model = jsr.GRU(3, 4, rngs=nnx.Rngs(0))
    out, h = model(np.ones((1, 2, 3), np.float32))
    assert out.dtype == jnp.float32 and h.dtype == jnp.float32


@pytest.mark.parametrize("low", [jnp.float16, jnp.bfloat16])
def test_a_lower_precision_input_runs_in_the_weights_dtype(low):
    """A half-precision input to float32 weights computes in float32 (`jnp.promote_types`, Flax's rule): the very
    numbers of the input cast up, states included (torch refuses the mismatch; it once ran in half precision,
    5.7e-3 off for bfloat16). Weights of the low dtype with such an input keep it; float64 weights promote."""
    x = jnp.asarray(np.random.default_rng(5).standard_normal((6, 2, 3)), low)
    for model in (jsr.LSTM(3, 4, 2, rngs=nnx.Rngs(0)), jsr.GRU(3, 4, bidirectional=True, rngs=nnx.Rngs(0))):
        out, state = model(x)
        want, want_state = model(x.astype(jnp.float32))
        assert out.dtype == jnp.float32 and {s.dtype for s in jax.tree.leaves(state)} == {jnp.dtype(jnp.float32)}
        np.testing.assert_array_equal(out, want)
        for got, ref in zip(jax.tree.leaves(state), jax.tree.leaves(want_state)):
            np.testing.assert_array_equal(got, ref)
    cell = jsr.LSTMCell(3, 4, rngs=nnx.Rngs(0))
    for got, ref in zip(cell(x[0]), cell(x[0].astype(jnp.float32))):
        assert got.dtype == jnp.float32
        np.testing.assert_array_equal(got, ref)
    assert jsr.GRU(3, 4, param_dtype=low, rngs=nnx.Rngs(0))(x)[0].dtype == low
    if jax.config.jax_enable_x64:  # (conftest enables it)
        wide = jsr.GRU(3, 4, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
        assert wide(x.astype(jnp.float32))[0].dtype == jnp.float64


@pytest.mark.parametrize("cls", KINDS)
def test_bf16_compute_keeps_float32_state_and_stays_close(cls):
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 40, 3)), jnp.float32)
    full = cls(3, 16, 2, rngs=nnx.Rngs(0))
    half = cls(3, 16, 2, compute_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    want, _ = full(x)
    got, state = half(x)
    assert got.dtype == jnp.float32 and all(s.dtype == jnp.float32 for s in jax.tree.leaves(state))
    # bf16 operands carry 8 mantissa bits (~4e-3 relative); states are bounded by 1.
    np.testing.assert_allclose(got, want, atol=3e-2)
    assert not np.array_equal(got, want)


def test_bad_compute_dtype():
    with pytest.raises(TypeError, match="compute_dtype: expected None or a floating dtype"):
        jsr.GRU(3, 4, compute_dtype=jnp.int8, rngs=nnx.Rngs(0))
    # Flax's "dtype argument to uniform must be a float dtype" before, not naming it
    with pytest.raises(TypeError, match="^param_dtype: expected a floating dtype"):
        jsr.GRU(3, 4, param_dtype=jnp.int32, rngs=nnx.Rngs(0))


DTYPE_BUILDS = pytest.mark.parametrize("build", [
    lambda **kw: jsr.GRU(3, 4, **kw, rngs=nnx.Rngs(0)),
    lambda **kw: jsr.LSTM(3, 4, proj_size=2, **kw, rngs=nnx.Rngs(0)),
    lambda **kw: jsr.Traveller(3, 4, 1, 0.0, **kw, rngs=nnx.Rngs(0)),
    lambda **kw: jsr.SeqVAE(5, 4, 2, 1, **kw, rngs=nnx.Rngs(0)),
], ids=["GRU", "LSTM-projected", "Traveller", "SeqVAE"])


@DTYPE_BUILDS
def test_dtypes_are_named_when_not_understood_and_torch_dtypes_mean_their_name(build):
    # NumPy's own words before ("data type 'bf16' not understood", "Cannot interpret 'torch.float64' as a data
    # type"), naming no argument; a torch dtype, as in code copied from PyTorch, now means the dtype of its name.
    torch = pytest.importorskip("torch")
    for name in ("param_dtype", "compute_dtype"):
        with pytest.raises(TypeError, match=rf"^{name}: expected (None or )?a floating dtype .*, got 'bf16'$"):
            build(**{name: "bf16"})
    model = build(param_dtype=torch.float16, compute_dtype=torch.bfloat16)
    assert {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.float16)}
    assert build(param_dtype="float16", compute_dtype="bfloat16") is not None


@DTYPE_BUILDS
def test_pythons_float_as_a_dtype_is_jaxs_default_float_without_a_warning(build):
    # Normalised to NumPy's float64 it warned "Explicitly requested dtype float64 is not available" on every
    # parameter (x64 off), where `float` means JAX's default float and built float32 parameters silently.
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("error")
        model = build(param_dtype=float, compute_dtype=float)
    assert {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.float32)}


@DTYPE_BUILDS
def test_param_dtype_none_is_jaxs_default_float_as_before(build):
    # NumPy reads None as float64, so the old issubdtype check let it through and jax.random took it as its
    # default dtype; validate.float_dtype refused it ("expected a floating dtype, got None").
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("error")
        model = build(param_dtype=None)
    assert {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.float32)}


@DTYPE_BUILDS
def test_float64_without_x64_is_one_warning_at_the_callers_line_naming_the_argument_and_the_switch(build):
    # JAX's own "Explicitly requested dtype float64 is not available" came from a line inside the cells'
    # initialiser (shown once a session by Python's default filter, naming no argument), once per weight drawn.
    for name in ("param_dtype", "compute_dtype"):
        with jax.enable_x64(False), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = build(**{name: jnp.float64})
        assert [str(w.message) for w in caught] == [
            f"{name}: float64 is float32 while JAX's 64-bit mode is off (jax.config.update('jax_enable_x64', True) "
            "before building the model keeps float64)"]
        assert caught[0].filename == __file__
        assert {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.float32)}
    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("error")
        model = build(param_dtype=jnp.float64, compute_dtype=jnp.float64)
    assert {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.float64)}


# Summation order differs between the thin (broadcast-multiply-sum) form and a matmul call, so results
# agree to a few ulps of the magnitudes summed, |x| @ |w| (a dot product's rounding bound), not of the result.
THIN_MATMUL_RTOL = {jnp.float32: 1e-6, jnp.float64: 1e-14}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(2, 256), (64, 2), (4, 8), (8, 4), (5, 9)], ids=str)
def test_cells_matmul_equals_matmul_for_thin_and_wide_weights(dtype, shape):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 7, shape[0])), dtype)
    w = jnp.asarray(rng.standard_normal(shape), dtype)
    got = jsr.cells.matmul(x, w)
    assert got.shape == (3, 7, shape[1]) and got.dtype == dtype
    xs, ws = np.asarray(x, np.float64), np.asarray(w, np.float64)
    err = np.abs(np.asarray(got, np.float64) - xs @ ws)
    assert np.all(err <= THIN_MATMUL_RTOL[dtype] * (np.abs(xs) @ np.abs(ws))), f"max error {err.max():.2e}"


@pytest.mark.parametrize("shape", [(2, 256), (64, 2), (16, 32)], ids=str)
def test_cells_matmul_reads_bf16_operands_and_accumulates_in_float32(shape):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((5, shape[0])), jnp.float32)
    w = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    got = jsr.cells.matmul(x, w, jnp.bfloat16)
    rounded = np.asarray(x.astype(jnp.bfloat16), np.float32) @ np.asarray(w.astype(jnp.bfloat16), np.float32)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, rounded, rtol=1e-5, atol=1e-5)


# `cells.lstm_gates` / `gru_gates` carry a hand-written derivative (faster backward loops); JAX's own
# derivative of the same expressions must agree. float64: the same function in another order of operations
# differs by rounding (~1e-16 per op), a wrong term by O(0.1).
HAND_VJP_RTOL = 1e-12


@pytest.mark.parametrize("cls, kwargs", [(jsr.LSTM, {}), (jsr.LSTM, {"proj_size": 3}), (jsr.GRU, {})],
                         ids=["LSTM", "LSTM-proj", "GRU"])
def test_hand_written_gate_derivatives_are_jaxs_own(cls, kwargs, monkeypatch):
    from jax_scan_rnn import cells

    model = cls(4, 6, 2, batch_first=True, param_dtype=jnp.float64, rngs=nnx.Rngs(0), **kwargs)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 7, 4)))

    def loss(params, x):  # sin: every output weighted differently
        return jnp.sum(jnp.sin(nnx.merge(graphdef, params, rest)(x)[0]))

    grads = {}
    for hand in (True, False):
        monkeypatch.setattr(cells, "HAND_WRITTEN_VJP", hand)
        grads[hand] = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads[True]), jax.tree.leaves(grads[False])):
        err = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
        assert err < HAND_VJP_RTOL, f"d loss / d {jax.tree_util.keystr(path)}: relative error {err:.2e}"
    # Second order, forward over reverse (jax.hessian), differentiates the rule's own backward pass: the same
    # Hessian as JAX's derivative gives.
    x_small = x[:1, :3]
    hessians = {}
    for hand in (True, False):
        monkeypatch.setattr(cells, "HAND_WRITTEN_VJP", hand)
        # jitted: the same Hessian program, compiled whole rather than op by op (eagerly each op compiles alone)
        hessians[hand] = jax.jit(jax.hessian(lambda x: loss(params, x)))(x_small)
    err = float(jnp.max(jnp.abs(hessians[True] - hessians[False])) / jnp.max(jnp.abs(hessians[False])))
    assert err < HAND_VJP_RTOL, f"d2 loss / dx2: relative error {err:.2e}"
    # Forward mode straight through the rule needs JAX's derivative (a custom_vjp has none): the error says
    # which switch to turn, for a layer and for a cell alone; with the switch off it works.
    tangent = jnp.ones_like(x)
    monkeypatch.setattr(cells, "HAND_WRITTEN_VJP", True)
    with pytest.raises(TypeError, match="custom_vjp.*HAND_WRITTEN_VJP = False"):
        jax.jvp(lambda x: loss(params, x), (x,), (tangent,))
    cell = model.layers[0]
    with pytest.raises(TypeError, match="custom_vjp.*HAND_WRITTEN_VJP = False"):
        jax.jvp(lambda x: jax.tree.leaves(cell(x))[0], (x[:, 0],), (tangent[:, 0],))  # h' from torch's call
    monkeypatch.setattr(cells, "HAND_WRITTEN_VJP", False)
    _, forward = jax.jvp(lambda x: loss(params, x), (x,), (tangent,))
    assert np.isclose(float(forward), float(jnp.vdot(grads[False][1], tangent)), rtol=HAND_VJP_RTOL)


# The cells' call is torch.nn.LSTMCell/GRUCell's, cell(input, hx=None) (parity_tests compare the numbers); what a
# wrong call gets. The old Flax-style order, cell(carry, x), is the likeliest: with I != H it is refused naming
# `input`, and with I == H it is torch's own call.
@pytest.mark.parametrize("bad, error, message", [
    (lambda cell, x, h: cell(x.astype(jnp.int32)), TypeError, "input: expected a floating dtype, got int32"),
    (lambda cell, x, h: cell(x[:, :2]), ValueError, r"input: expected shape \[B, 3\] or unbatched \[3\], got \(4, 2\)"),
    (lambda cell, x, h: cell(x[None]), ValueError, r"input: expected shape \[B, 3\] or unbatched \[3\], got \(1, 4, 3\)"),
    (lambda cell, x, h: cell(h, x), ValueError, r"input: expected shape \[B, 3\] or unbatched \[3\], got \(4, 5\)"),
    (lambda cell, x, h: cell(x, h[:3]), ValueError, r"hx: expected a \[4, 5\] array, got shape \(3, 5\)"),
    (lambda cell, x, h: cell(x[0], h), ValueError, r"hx: expected a \[5\] array, got shape \(4, 5\)"),
    (lambda cell, x, h: cell(x, (h, h)), ValueError, r"hx: expected a \[4, 5\] array, got a tuple of 2"),
    (lambda cell, x, h: cell(x, h.astype(jnp.int32)), TypeError, "hx: expected a floating dtype, got int32"),
    (lambda cell, x, h: cell(None), TypeError, "^input: expected a floating array, got NoneType$"),
])
def test_a_wrong_cell_call_names_the_argument(bad, error, message):
    cell = jsr.GRUCell(3, 5, rngs=nnx.Rngs(0))
    x, h = jnp.ones((4, 3)), jnp.zeros((4, 5))
    with pytest.raises(error, match=message):
        bad(cell, x, h)


def test_an_lstm_cell_takes_torchs_hx_forms_and_names_a_wrong_one():
    torch = pytest.importorskip("torch")
    cell = jsr.LSTMCell(3, 5, proj_size=2, rngs=nnx.Rngs(0))
    x, h, c = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32), np.ones((4, 5), np.float32)
    h1, c1 = cell(x, (h, c))
    assert (h1.shape, c1.shape) == ((4, 2), (4, 5))
    for same in (cell(x, [h, c]), cell(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(c)))):
        np.testing.assert_array_equal(np.asarray(same[0]), np.asarray(h1))
        np.testing.assert_array_equal(np.asarray(same[1]), np.asarray(c1))
    with pytest.raises(ValueError, match=r"hx: expected a tuple \(h \[4, 2\], c \[4, 5\]\), got one array of shape"):
        cell(x, c)
    with pytest.raises(ValueError, match=r"hx: expected a tuple \(h \[4, 2\], c \[4, 5\]\), got shape \(4, 5\)"):
        cell(x, (c, c))


def test_the_elman_rnn_takes_torchs_arguments_and_names_a_wrong_one():
    """jsr.RNN is torch.nn.RNN (parity_tests compare the numbers), nonlinearity before bias as in torch."""
    rnn = jsr.RNN(3, 5, 2, "relu", False, True, rngs=nnx.Rngs(0))
    assert (rnn.nonlinearity, rnn.layers[1].nonlinearity, rnn.layers[0].bias, rnn.batch_first) == ("relu", "relu",
                                                                                                   False, True)
    out, h = rnn(jnp.ones((4, 7, 3)))
    assert out.shape == (4, 7, 5) and h.shape == (2, 4, 5)
    with pytest.raises(ValueError, match="nonlinearity: expected one of 'tanh', 'relu', got 'sigmoid'"):
        jsr.RNN(3, 5, 1, "sigmoid", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="nonlinearity: expected one of 'tanh', 'relu', got 'gelu'"):
        jsr.RNNCell(3, 5, nonlinearity="gelu", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"proj_size: supported by LSTM only \(as in torch\), got 2"):
        jsr.RNN(3, 5, proj_size=2, rngs=nnx.Rngs(0))
    torch = pytest.importorskip("torch")
    with pytest.raises(KeyError, match=r"the state_dict comes from torch.nn.RNN\(4, 16, num_layers=2\), this model is "
                                       r"jsr.RNN\(4, 8\)"):
        jsr.load_torch_state_dict(jsr.RNN(4, 8, rngs=nnx.Rngs(0)), torch.nn.RNN(4, 16, 2).state_dict())


PLAIN_TRANSFORMS = {
    "jit": lambda f, x: jax.jit(f)(x[0]),
    "vmap": lambda f, x: jax.vmap(f)(x),
    "grad": lambda f, x: jax.grad(lambda x: f(x).sum())(x[0]),
}


@pytest.mark.parametrize("transform", PLAIN_TRANSFORMS)
@pytest.mark.parametrize("build", ["lstm", "traveller"])
def test_training_dropout_under_a_plain_jax_transform_names_the_way_out(build, transform):
    # Flax's own "Cannot mutate RngCount from a different trace level" names neither cause nor way out.
    x = jnp.ones((2, 5, 3, 4))
    cls = jsr.LSTM if build == "lstm" else jsr.Traveller  # a whole-sequence draw; a per-call key for the loop
    model = cls(4, 6, num_layers=2, dropout=0.2, rngs=nnx.Rngs(0))
    f = lambda x: model(x)[0]  # noqa: E731
    with pytest.raises(flax.errors.TraceContextError, match=r"dropout=0\.2 \(the masks of training mode\): .*nnx\.jit, nnx\.vmap.* or call \.eval\(\)"):
        PLAIN_TRANSFORMS[transform](f, x)
    model.eval()
    PLAIN_TRANSFORMS[transform](f, x)  # inference has no draw, so the plain transform is fine


def test_dropout_masks_for_step_under_a_plain_jax_transform_name_the_way_out():
    model = jsr.LSTM(4, 6, num_layers=3, dropout=0.2, rngs=nnx.Rngs(0))
    with pytest.raises(flax.errors.TraceContextError, match=r"^dropout=0\.2 \(the masks of training mode\): drawn from "
                                                           r".*nnx\.jit.* or call \.eval\(\)") as ei:
        jax.jit(lambda: model.dropout_masks((5, 6), jnp.float32))()
    assert isinstance(ei.value.__cause__, flax.errors.TraceContextError)  # Flax's own, as the direct cause


# Below MIN_DRAW, one past a power of two, exactly one, and empty.
DRAW_SHAPES = [(7, 5), (257,), (8, 128), (0, 4)]


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.uint8).reshape(-1) if x.size else x


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16])
def test_parameter_draws_are_jaxs_uniform_bit_for_bit(dtype):
    """cells.uniform cuts a longer draw (one program per power of two, not per shape): the numbers must be
    `jax.random.uniform`'s own, eagerly and traced, for typed, raw and other-implementation keys, and the
    Linear layers' `U(0, 1) * 2b - b` must be `nnx.initializers.uniform(2b)` then `- b`, rounding for rounding."""
    from jax_scan_rnn.cells import uniform

    b = 0.17407766
    cases = [(shape, "key", jax.random.key(0), "eager") for shape in DRAW_SHAPES] + [((33, 5), "key", jax.random.key(2), "jit")]
    if dtype == jnp.float32:
        cases += [((7, 5), "PRNGKey", jax.random.PRNGKey(3), "eager"), ((7, 5), "rbg", jax.random.key(1, impl="rbg"), "eager")]
    for shape, name, key, mode in cases:
        wrap = jax.jit if mode == "jit" else (lambda f: f)
        pairs = {
            "U(-b, b)": (lambda k: uniform(k, shape, dtype, -b, b), lambda k: jax.random.uniform(k, shape, dtype, -b, b)),
            "U(0, 1) * 2b - b": (lambda k: uniform(k, shape, dtype, scale=2 * b, offset=b),
                                 lambda k: nnx.initializers.uniform(2 * b)(k, shape, dtype) - jnp.asarray(b, dtype)),
        }
        for form, (new, old) in pairs.items():
            got, want = wrap(new)(key), wrap(old)(key)
            where = f"{form}, {jnp.dtype(dtype).name} {shape}, {name} key, {mode}"
            assert got.shape == want.shape and got.dtype == want.dtype, where
            assert np.array_equal(_bits(got), _bits(want)), where


def test_a_model_of_another_size_compiles_nothing_to_draw_its_parameters():
    """LSTM(8, 32) draws 1,024 + 4,096 + 128 + 128 numbers; LSTM(7, 30) 840 + 3,600 + 120 + 120: the same
    powers of two, so the second is built from programs already compiled (each shape compiled its own before:
    docs/measurements.md#parameter-draws)."""
    jsr.LSTM(8, 32, rngs=nnx.Rngs(0))
    lowered = []

    def listen(event, duration, **kwargs):
        if event.endswith("jaxpr_to_mlir_module_duration"):
            lowered.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        model = jsr.LSTM(7, 30, rngs=nnx.Rngs(1))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert lowered == []
    assert model.layers[0].w_hh[...].shape == (30, 120)
