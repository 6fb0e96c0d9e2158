"""jsr.Traveller behaviour: layouts, bounds, errors, dropout, jit and unroll."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_scan_rnn as jsr


def model(**kwargs):
    args = dict(num_inputs=3, hidden_size=8, num_layers=2, dropout=0.0) | kwargs
    return jsr.Traveller(**args, param_dtype=jnp.float64, rngs=nnx.Rngs(0))


def test_batched_and_seed_layouts():
    trav = model()
    x = np.random.default_rng(0).standard_normal((4, 20, 3))
    batched = trav(x)
    assert batched.shape == (4, 20, 2)
    assert np.all(np.abs(batched) <= 1.0)
    seed = trav(x[1][:, None, :])  # the seed's [T, 1, F] -> [T, 2]
    assert seed.shape == (20, 2)
    np.testing.assert_allclose(seed, batched[1], atol=1e-14)


def test_layout_can_be_forced_for_single_step_batches():
    trav = model()
    x = np.random.default_rng(1).standard_normal((5, 1, 3))
    assert trav(x).shape == (5, 2)  # auto: the seed's layout, one path of 5 steps
    assert trav(x, layout="batch").shape == (5, 1, 2)  # five paths of one step
    with pytest.raises(ValueError, match=r"inputs: the seed layout is \[T, 1, 3\], got \(5, 2, 3\)"):
        trav(np.zeros((5, 2, 3)), layout="seed")
    with pytest.raises(ValueError, match="layout: expected 'auto', 'batch' or 'seed', got 'time'"):
        trav(x, layout="time")


def test_positions_feed_back():
    """Changing the features at step 0 changes later positions only through the fed-back positions."""
    trav = model(num_layers=1)
    x = np.zeros((1, 10, 3))
    y = np.array(x)
    y[0, 0] = 5.0
    a, b = trav(x), trav(y)
    assert not np.allclose(a[0, 5:], b[0, 5:])


@pytest.mark.parametrize(
    "x, error, message",
    [
        (np.zeros((4, 3)), ValueError, r"inputs: expected shape \[B, T, 3\] or the seed's \[T, 1, 3\], got \(4, 3\)"),
        (np.zeros((2, 4, 5)), ValueError, r"inputs: expected shape \[B, T, 3\] .* got \(2, 4, 5\)"),
        (np.zeros((2, 4, 3), np.int32), TypeError, "inputs: expected a floating dtype, got int32"),
    ],
)
def test_bad_inputs(x, error, message):
    with pytest.raises(error, match=message):
        model()(x)


def test_dropout_masks_shape_is_checked():
    trav = model(num_layers=3, dropout=0.5)
    with pytest.raises(ValueError, match=r"dropout_masks: expected shape \[2, 6, 1, 8\], got \(1, 6, 1, 8\)"):
        trav(np.zeros((1, 6, 3)), dropout_masks=np.ones((1, 6, 1, 8)))


def test_dropout_in_training_only_and_ones_masks_equal_eval():
    trav = model(num_layers=3, dropout=0.5)
    x = np.random.default_rng(2).standard_normal((2, 12, 3))
    assert not np.allclose(trav(x), trav(x))
    ones = trav(x, dropout_masks=np.ones((2, 12, 2, 8)))
    trav.eval()
    np.testing.assert_allclose(trav(x), trav(x))
    np.testing.assert_allclose(trav(x), ones, atol=1e-14)


def test_jit_and_unroll_agree():
    trav = model()
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 37, 3)))
    base = trav(x)
    for unroll in (3, 8):
        out = nnx.jit(lambda m, x, u=unroll: m(x, unroll=u))(trav, x)
        np.testing.assert_allclose(out, base, atol=1e-13)


def test_bfloat16_inputs_keep_their_dtype():
    """The fed-back positions are part of the scan carry: the float32 readout must not change its dtype."""
    trav = jsr.Traveller(3, 8, 2, 0.0, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 10, 3)), jnp.bfloat16)
    out = trav(x)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), trav(x.astype(jnp.float32)), atol=5e-2)
