"""jsr.Traveller behaviour: layouts, bounds, errors, state across calls, dropout, jit and unroll."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_scan_rnn as jsr


def model(**kwargs):
    args = dict(num_inputs=3, hidden_size=8, num_layers=2, dropout=0.0) | kwargs
    dtype = args.pop("param_dtype", jnp.float64)
    return jsr.Traveller(**args, param_dtype=dtype, rngs=nnx.Rngs(0))


def test_batched_and_seed_layouts():
    trav = model()
    x = np.random.default_rng(0).standard_normal((4, 20, 3))
    batched, state = trav(x)
    assert batched.shape == (4, 20, 2)
    assert np.all(np.abs(batched) <= 1.0)
    assert state.h.shape == state.c.shape == (2, 4, 8) and state.positions.shape == (4, 2)
    np.testing.assert_array_equal(state.positions, batched[:, -1])
    seed, seed_state = trav(x[1][:, None, :], layout="seed")  # the seed's [T, 1, F] -> [T, 2]
    assert seed.shape == (20, 2) and seed_state.positions.shape == (1, 2)
    np.testing.assert_allclose(seed, batched[1], atol=1e-14)


def test_layout_is_never_guessed():
    """A [5, 1, F] input is five one-step paths unless the seed layout is asked for."""
    trav = model()
    x = np.random.default_rng(1).standard_normal((5, 1, 3))
    assert trav(x)[0].shape == (5, 1, 2)
    assert trav(x, layout="seed")[0].shape == (5, 2)
    with pytest.raises(ValueError, match=r"inputs: expected shape the seed's \[T, 1, 3\] \(layout='seed'\) with T >= 1, got \(5, 2, 3\)"):
        trav(np.zeros((5, 2, 3)), layout="seed")
    with pytest.raises(ValueError, match=r"layout: expected one of 'batch', 'seed', got 'auto'"):
        trav(x, layout="auto")


def test_bad_sizes_are_named():
    for num_inputs in (0, True):  # a bool is not a size
        with pytest.raises(ValueError, match=rf"^num_inputs: expected an int >= 1, got {num_inputs}$"):
            model(num_inputs=num_inputs)
    with pytest.raises(ValueError, match=r"^dropout: expected a finite number in \[0, 1\), got 1.0$"):
        model(dropout=1.0)


def test_positions_feed_back():
    """Changing the features at step 0 changes later positions only through the fed-back positions."""
    trav = model(num_layers=1)
    x = np.zeros((1, 10, 3))
    y = np.array(x)
    y[0, 0] = 5.0
    a, b = trav(x)[0], trav(y)[0]
    assert not np.allclose(a[0, 5:], b[0, 5:])


@pytest.mark.parametrize(
    "x, error, message",
    [
        (np.zeros((4, 3)), ValueError, r"inputs: expected shape \[B, T, 3\] \(layout='batch'\) with B, T >= 1, got \(4, 3\)"),
        (np.zeros((2, 4, 5)), ValueError, r"inputs: expected shape \[B, T, 3\] .* got \(2, 4, 5\)"),
        (np.zeros((2, 0, 3)), ValueError, r"inputs: expected shape \[B, T, 3\] .* got \(2, 0, 3\)"),
        # an empty batch: the message must name B, not only T (which is 4 here)
        (np.zeros((0, 4, 3)), ValueError, r"^inputs: expected shape \[B, T, 3\] \(layout='batch'\) with B, T >= 1, "
                                          r"got \(0, 4, 3\)$"),
        (np.zeros((2, 4, 3), np.int32), TypeError, "inputs: expected a floating dtype, got int32"),
    ],
)
def test_bad_inputs(x, error, message):
    with pytest.raises(error, match=message):
        model()(x)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("hoist", [True, False])
def test_one_call_chunks_and_steps_are_bit_identical(dtype, hoist):
    """Live use: T steps in one call, in chunks carrying the state, or one `step` per bar, compiled or
    eager, give the same positions and final state, bit for bit (CPU)."""
    trav = model(param_dtype=dtype, hoist_inputs=hoist)
    x = jnp.asarray(np.random.default_rng(5).standard_normal((3, 12, 3)), dtype)
    fast = jsr.jit(trav)
    whole, final = fast(x)
    state, chunks = None, []
    for a, b in ((0, 1), (1, 5), (5, 12)):
        p, state = fast(x[:, a:b], state)
        chunks.append(p)
    step_state, steps = None, []
    for t in range(12):
        p, step_state = fast.step(step_state, x[:, t])
        steps.append(p)
    for name, got, got_final in (("chunks", jnp.concatenate(chunks, 1), state), ("steps", jnp.stack(steps, 1), step_state)):
        np.testing.assert_array_equal(got, whole, err_msg=f"{name}: positions")
        for field, a, b in zip(jsr.TravellerState._fields, got_final, final):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: final state.{field}")
    # An eager call runs the hoisted projection as an op of its own, which XLA rounds differently from
    # the same product fused into the compiled call: equal to a few ulps, not bit for bit.
    np.testing.assert_allclose(trav(x)[0], whole, rtol=EAGER_RTOL[dtype], atol=EAGER_RTOL[dtype])


EAGER_RTOL = {jnp.float32: 1e-6, jnp.float64: 1e-14}


def test_bad_state_is_named():
    trav = model()
    x = np.zeros((2, 4, 3))
    _, state = trav(x)
    with pytest.raises(ValueError, match=r"state.h: expected shape \[2, 3, 8\], got \[2, 2, 8\]"):
        trav(np.zeros((3, 4, 3)), state)
    with pytest.raises(ValueError, match=r"state: expected a TravellerState \(h, c, positions\) or None, got ndarray"):
        trav(x, np.zeros((2, 2)))
    with pytest.raises(TypeError, match="state.positions: expected a floating dtype, got int32"):
        trav(x, state._replace(positions=np.zeros((2, 2), np.int32)))
    with pytest.raises(ValueError, match=r"inputs_t: expected shape \[B, 3\] with B >= 1, got \(2, 4, 3\)"):
        trav.step(state, x)


def test_dropout_masks_shape_is_checked():
    trav = model(num_layers=3, dropout=0.5)
    with pytest.raises(ValueError, match=r"^dropout_masks: expected shape \[num_layers-1, T, B, H\] = \[2, 6, 1, 8\], "
                                         r"got \[1, 6, 1, 8\]$"):
        trav(np.zeros((1, 6, 3)), dropout_masks=np.ones((1, 6, 1, 8)))


def test_step_errors_name_its_own_arguments_and_shapes():
    """`step` is called with [B, F] features and [L-1, B, H] masks: its errors say so, not what `__call__` (which
    it runs on a T = 1 sequence) would say of `inputs` [B, T, F] and masks [L-1, T, B, H] the user never passed."""
    trav = model(num_layers=3, dropout=0.5)
    with pytest.raises(ValueError, match=r"^inputs_t: expected shape \[B, 3\] with B >= 1, got \(2, 4\)$"):
        trav.step(None, np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"^inputs_t: expected shape \[B, 3\] with B >= 1, got \(0, 3\)$"):  # no sequence
        trav.step(None, np.zeros((0, 3)))
    with pytest.raises(TypeError, match=r"^inputs_t: expected a floating dtype, got int"):
        trav.step(None, np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match=r"^dropout_masks: expected shape \[num_layers-1, B, H\] = \[2, 2, 8\], "
                                         r"got \[2, 1, 7\]$"):
        trav.step(None, np.zeros((2, 3)), dropout_masks=np.ones((2, 1, 7)))


def test_what_is_no_array_is_named_not_left_to_jax():
    """`step(inputs_t, state)`, the arguments swapped (torch_ref's twin names them too), or None for the inputs: one
    line naming the argument and what was given, not JAX's "Cannot concatenate arrays with different numbers of
    dimensions" or "None is not a valid value for jnp.array"."""
    trav = model()
    state = trav.initial_state(2)
    with pytest.raises(TypeError, match=r"^inputs_t: expected a floating array, got TravellerState$"):
        trav.step(np.zeros((2, 3)), state)
    with pytest.raises(TypeError, match=r"^inputs: expected a floating array, got NoneType$"):
        trav(None)


def test_dropout_in_training_only_and_ones_masks_equal_eval():
    trav = model(num_layers=3, dropout=0.5)
    x = np.random.default_rng(2).standard_normal((2, 12, 3))
    assert not np.allclose(trav(x)[0], trav(x)[0])
    ones = trav(x, dropout_masks=np.ones((2, 12, 2, 8)))[0]
    trav.eval()
    np.testing.assert_allclose(trav(x)[0], trav(x)[0])
    np.testing.assert_allclose(trav(x)[0], ones, atol=1e-14)


def test_step_with_given_masks_is_the_whole_call_with_them_on_three_layers():
    """`step`'s masks [L-1, B, H] are `__call__`'s [L-1, T, B, H] at step t (with two layers the two readings of
    a [1, B, H] mask coincide; three tell them apart)."""
    trav = model(num_layers=3, dropout=0.3)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 5, 3)))
    masks = jnp.asarray((rng.random((2, 5, 2, 8)) > 0.3) / 0.7)
    whole, _ = trav(x, dropout_masks=masks)
    state, steps = None, []
    for t in range(5):
        p, state = trav.step(state, x[:, t], dropout_masks=masks[:, t])
        steps.append(p)
    np.testing.assert_allclose(jnp.stack(steps, 1), whole, atol=1e-12)


def test_bfloat16_matmuls_hoisted_or_in_the_loop_give_the_same_positions():
    """compute_dtype reaches the hoisted feature projection too: it reads bf16 operands as the in-loop one does."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 20, 3)), jnp.float32)
    hoisted, inside = (model(param_dtype=jnp.float32, hidden_size=16, compute_dtype=jnp.bfloat16,
                             hoist_inputs=hoist)(x)[0] for hoist in (True, False))
    np.testing.assert_allclose(hoisted, inside, atol=1e-5)  # 3.7e-4 apart with float32 operands hoisted


def test_dropout_drawn_per_step_is_a_scaled_keep_mask_at_the_rate():
    """Training mode draws each step's masks inside the loop from one key (no [T, ...] mask array):
    the masks are 0 or 1/(1-p) with P(0) = p, fresh per step and per call."""
    lstm = model(num_layers=3, dropout=0.25).lstm_layers
    key = lstm.dropout_key()
    masks = jnp.stack([lstm.step_dropout_masks(key, t, (64, 8), jnp.float32) for t in range(50)])
    assert masks.shape == (50, 2, 64, 8)
    np.testing.assert_allclose(np.unique(np.asarray(masks)), [0.0, 1 / 0.75], rtol=1e-6)
    assert abs(float((masks == 0).mean()) - 0.25) < 0.02
    assert not np.array_equal(masks[0], masks[1])
    assert not np.array_equal(key, lstm.dropout_key())
    lstm.eval()
    assert lstm.dropout_key() is None


def test_remat_with_dropout_keeps_no_mask_array():
    """With dropout on and remat_chunk, the compiled training step holds no [L-1, T, B, H] masks: its
    temporary memory grows like sqrt(T): 4x the steps (chunks of sqrt(T)) costs ~2x the memory, where
    anything O(T) would cost ~4x. (A [1, T, 8, 32] float32 mask array alone is 1.6 MB at T=1600.)"""

    def temp_bytes(steps):
        trav = model(num_layers=2, dropout=0.3, hidden_size=32, remat_chunk=int(steps**0.5), param_dtype=jnp.float32)
        graphdef, state = nnx.split(trav)

        def grads(state, x):
            return nnx.grad(lambda m: jnp.sum(m(x)[0] ** 2))(nnx.merge(graphdef, state))

        x = jnp.zeros((8, steps, 3), jnp.float32)
        compiled = jax.jit(grads).lower(state, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temp_bytes(400), temp_bytes(1600)
    assert large < 2.5 * small, f"temp bytes {small} at T=400 -> {large} at T=1600"


def test_jit_and_unroll_agree():
    trav = model()
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 37, 3)))
    base = trav(x)[0]
    for unroll in (3, 8):
        out = nnx.jit(lambda m, x, u=unroll: m(x, unroll=u)[0])(trav, x)
        np.testing.assert_allclose(out, base, atol=1e-13)


def test_bfloat16_weights_and_inputs_keep_their_dtype_and_float32_weights_promote():
    """The fed-back positions are part of the scan carry: with bfloat16 weights and paths, the readout must not
    change its dtype. A bfloat16 path to float32 weights runs in float32 (`jnp.promote_types`), the numbers of the
    path cast up."""
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 10, 3)), jnp.bfloat16)
    half = jsr.Traveller(3, 8, 2, 0.0, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    out, state = half(x)
    assert out.dtype == jnp.bfloat16 and state.positions.dtype == jnp.bfloat16
    trav = jsr.Traveller(3, 8, 2, 0.0, rngs=nnx.Rngs(0))
    nnx.update(trav, jax.tree.map(lambda w: w.astype(jnp.float32), nnx.state(half, nnx.Param)))
    np.testing.assert_allclose(np.asarray(out, np.float32), trav(x.astype(jnp.float32))[0], atol=5e-2)
    promoted, state = trav(x)
    assert promoted.dtype == jnp.float32 and state.positions.dtype == jnp.float32
    np.testing.assert_array_equal(promoted, trav(x.astype(jnp.float32))[0])


# ---------------------------------------------------------------------------------------------------
# Any number of assets A (`num_assets`; 2, the seed's, by default)
# ---------------------------------------------------------------------------------------------------

ASSETS = [1, 2, 5]


def test_default_is_the_seeds_two_assets():
    trav = model()
    assert trav.num_assets == 2
    assert trav.lstm_layers.layers[0].w_ih.shape == (2 + 3, 4 * 8)  # [A + F, 4H]: positions first
    assert trav.output_layer.kernel.shape == (8, 2)


@pytest.mark.parametrize("num_assets", ASSETS)
def test_num_assets_sets_the_output_state_and_weight_shapes(num_assets):
    trav = model(num_assets=num_assets)
    assert trav.num_assets == num_assets
    assert trav.lstm_layers.layers[0].w_ih.shape == (num_assets + 3, 4 * 8)
    assert trav.output_layer.kernel.shape == (8, num_assets)
    x = np.random.default_rng(6).standard_normal((4, 20, 3)) * 3  # large features push tanh to its bounds
    positions, state = trav(x)
    assert positions.shape == (4, 20, num_assets)
    assert np.all(np.abs(positions) <= 1.0)
    assert state.h.shape == state.c.shape == (2, 4, 8) and state.positions.shape == (4, num_assets)
    np.testing.assert_array_equal(state.positions, positions[:, -1])
    assert [s.shape for s in trav.initial_state(4)] == [(2, 4, 8), (2, 4, 8), (4, num_assets)]
    seed, seed_state = trav(x[1][:, None, :], layout="seed")
    assert seed.shape == (20, num_assets) and seed_state.positions.shape == (1, num_assets)
    p_t, _ = trav.step(None, x[:, 0])
    assert p_t.shape == (4, num_assets)


@pytest.mark.parametrize("num_assets", ASSETS)
def test_any_number_of_assets_one_call_chunks_and_steps_are_bit_identical(num_assets):
    """As `test_one_call_chunks_and_steps_are_bit_identical`, for A assets: the state carries [B, A]
    positions across calls and steps, and both ways of projecting layer 0's input agree."""
    results = {}
    for hoist in (True, False):
        fast = jsr.jit(model(num_assets=num_assets, hoist_inputs=hoist))
        x = jnp.asarray(np.random.default_rng(7).standard_normal((3, 10, 3)))
        whole, final = fast(x)
        head, state = fast(x[:, :4])
        tail, state = fast(x[:, 4:], state)
        step_state, steps = None, []
        for t in range(10):
            p, step_state = fast.step(step_state, x[:, t])
            steps.append(p)
        for name, got, got_final in (("chunks", jnp.concatenate([head, tail], 1), state),
                                     ("steps", jnp.stack(steps, 1), step_state)):
            np.testing.assert_array_equal(got, whole, err_msg=f"A={num_assets}, hoist={hoist}, {name}: positions")
            for field, a, b in zip(jsr.TravellerState._fields, got_final, final):
                np.testing.assert_array_equal(a, b, err_msg=f"A={num_assets}, hoist={hoist}, {name}: state.{field}")
        results[hoist] = whole
    # The hoisted split w_ih[:A] / w_ih[A:] against the unsplit [x, u] @ w_ih: the same sums grouped differently.
    np.testing.assert_allclose(results[True], results[False], rtol=HOIST_RTOL_F64, atol=HOIST_RTOL_F64)


# float64 rounding of one product split in two (~1e-16 per op) over 10 steps; a mis-split column is O(0.1).
HOIST_RTOL_F64 = 1e-14


@pytest.mark.parametrize("num_assets", [0, True, 2.5])  # none, a bool (not a count), not an int
def test_bad_num_assets_is_named(num_assets):
    with pytest.raises(ValueError, match=rf"^num_assets: expected an int >= 1, got {num_assets!r}$"):
        model(num_assets=num_assets)


def test_state_of_another_number_of_assets_is_refused():
    five = model(num_assets=5)
    _, state = model()(np.zeros((2, 4, 3)))  # two assets' state: positions [2, 2]
    with pytest.raises(ValueError, match=r"^state.positions: expected shape \[2, 5\], got \[2, 2\]$"):
        five(np.zeros((2, 4, 3)), state)
