"""jsr.Traveller against torch_ref.Traveller: feedback forward over T=1000, utility gradients, 50 Adam steps.

The feedback makes every step depend on all earlier ones, so a mapping or math difference anywhere
compounds along the path; agreement at step 1000 is a strong check.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.data import trading
from parity_tests.compare import assert_close, assert_grads_close, assert_steps_close, grad_rtol_for
from torch_ref.traveller import Traveller as TorchTraveller, scan_available

DTYPES = {"float32": (jnp.float32, torch.float32), "float64": (jnp.float64, torch.float64)}
# Positions over T=1000 steps of feedback (issue 3): float32 within 1e-5, float64 within 1e-10.
POSITION_ATOL = {"float32": 1e-5, "float64": 1e-10}
# 50 Adam steps in float32: Adam divides by sqrt(v), which amplifies rounding differences in early
# steps where v is tiny; 1e-4 on parameters of size ~0.1 still catches any wrong update rule.
TRAJECTORY_ATOL = 1e-4
MARKET = trading.MarketConfig()


# Both ways of computing layer 0's input projection (`hoist_inputs`): before the loop (the GPU default)
# and inside each step (the CPU default), so the parity suite covers the path another backend takes.
HOIST = [True, False]


def make_pair(dtype: str, num_inputs=4, hidden=32, layers=2, seed=0, hoist_inputs="auto", num_assets=2):
    torch.manual_seed(seed)
    jdt, tdt = DTYPES[dtype]
    ref = TorchTraveller(num_inputs, hidden, layers, 0.0, num_assets=num_assets).to(tdt)
    ours = jsr.Traveller(num_inputs, hidden, layers, 0.0, num_assets=num_assets, param_dtype=jdt,
                         hoist_inputs=hoist_inputs, rngs=nnx.Rngs(seed))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("dtype", DTYPES)
def test_seed_layout_forward_over_1000_steps(dtype):
    ref, ours = make_pair(dtype)
    x = np.random.default_rng(0).standard_normal((1000, 1, 4))
    with torch.no_grad():
        want, _ = ref(torch.from_numpy(x).to(DTYPES[dtype][1]), layout="seed")
    got, _ = ours(jnp.asarray(x, DTYPES[dtype][0]), layout="seed")
    assert got.shape == (1000, 2)
    assert_steps_close("positions (seed layout)", got, want, POSITION_ATOL[dtype], time_axis=0)


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_forward_over_1000_steps(dtype, hoist):
    ref, ours = make_pair(dtype, layers=3, hoist_inputs=hoist)
    market = trading.simulate(MARKET, 5, 1000, seed=1)
    with torch.no_grad():
        want, _ = ref(torch.from_numpy(market.features).to(DTYPES[dtype][1]))
    got, _ = ours(jnp.asarray(market.features, DTYPES[dtype][0]))
    assert got.shape == (5, 1000, 2)
    assert_steps_close(f"positions (batched, hoist_inputs={hoist})", got, want, POSITION_ATOL[dtype])


METHODS = ["loop", "cell", "script"] + (["scan"] if scan_available() else [])


@pytest.mark.parametrize("method", METHODS)
def test_every_torch_loop_variant_matches_jax(method):
    ref, ours = make_pair("float64", layers=2)
    x = np.random.default_rng(2).standard_normal((3, 200, 4))
    with torch.no_grad():
        want, _ = ref(torch.from_numpy(x), method=method)
    assert_steps_close(f"positions (torch method={method})", ours(jnp.asarray(x))[0], want, POSITION_ATOL["float64"])


def test_shared_dropout_masks_give_the_same_positions():
    torch.manual_seed(3)
    ref = TorchTraveller(4, 16, 3, 0.3).double().train()
    ours = jsr.Traveller(4, 16, 3, 0.3, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 50, 4))
    masks = (rng.random((2, 50, 2, 16)) > 0.3) / 0.7  # [L-1, T, B, H], scaled keep-masks
    with torch.no_grad():
        want, _ = ref(torch.from_numpy(x), method="cell", dropout_masks=torch.from_numpy(masks))
    got, _ = ours(jnp.asarray(x), dropout_masks=jnp.asarray(masks))
    assert_steps_close("positions with shared dropout masks", got, want, POSITION_ATOL["float64"])


def utility_loss(positions, returns):
    return -trading.net_utility(positions, returns, MARKET).mean()


def jax_loss_and_grads(model, features, returns, loss_fn=utility_loss):
    loss, grads = nnx.jit(nnx.value_and_grad(lambda m: loss_fn(m(features)[0], returns)))(model)
    holder = nnx.clone(model)
    nnx.update(holder, grads)
    return loss, jsr.torch_state_dict(holder)


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
def test_utility_gradients_match_torch(dtype, hoist):
    jdt, tdt = DTYPES[dtype]
    ref, ours = make_pair(dtype, hoist_inputs=hoist)
    market = trading.simulate(MARKET, 8, 300, seed=4)
    t_loss = utility_loss(ref(torch.from_numpy(market.features).to(tdt))[0], torch.from_numpy(market.returns).to(tdt))
    t_loss.backward()
    j_loss, j_grads = jax_loss_and_grads(ours, jnp.asarray(market.features, jdt), jnp.asarray(market.returns, jdt))
    assert_close("utility loss", j_loss, t_loss, POSITION_ATOL[dtype])
    want = {k: p.grad for k, p in ref.named_parameters()}
    assert_grads_close(j_grads, want, grad_rtol_for(jdt), context=f"utility {dtype}, hoist_inputs={hoist}: ")


def test_fifty_adam_steps_end_in_the_same_parameters():
    ref, ours = make_pair("float32", hidden=16)
    lr, steps = 1e-2, 50
    t_opt = torch.optim.Adam(ref.parameters(), lr=lr)
    optimizer = nnx.Optimizer(ours, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def jax_step(model, optimizer, features, returns):
        loss, grads = nnx.value_and_grad(lambda m: utility_loss(m(features)[0], returns))(model)
        optimizer.update(model, grads)
        return loss

    for step in range(steps):
        market = trading.simulate(MARKET, 16, 64, seed=100 + step)
        features, returns = market.features.astype(np.float32), market.returns.astype(np.float32)
        t_opt.zero_grad()
        t_loss = utility_loss(ref(torch.from_numpy(features))[0], torch.from_numpy(returns))
        t_loss.backward()
        t_opt.step()
        j_loss = jax_step(ours, optimizer, jnp.asarray(features), jnp.asarray(returns))
        assert abs(float(j_loss) - t_loss.item()) <= TRAJECTORY_ATOL, (
            f"Adam step {step}: loss {float(j_loss):.6f} (jax) vs {t_loss.item():.6f} (torch)"
        )
    ours_sd = jsr.torch_state_dict(ours)
    for key, value in ref.state_dict().items():
        assert_close(f"parameter {key} after {steps} Adam steps", ours_sd[key], value, TRAJECTORY_ATOL)


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
def test_stateful_live_use_matches_torch(dtype, hoist):
    """The live path in both frameworks: a history in one call, then one `step` per new bar from the
    returned state, and a chunk from a state; every position and the final state agree."""
    jdt, tdt = DTYPES[dtype]
    ref, ours = make_pair(dtype, layers=2, hoist_inputs=hoist)
    fast = jsr.jit(ours)
    market = trading.simulate(MARKET, 3, 300, seed=5)
    x = market.features
    t_x = torch.from_numpy(x).to(tdt)
    with torch.no_grad():
        t_hist, t_state = ref(t_x[:, :200])
        t_steps = []
        for t in range(200, 250):
            p, t_state = ref.step(t_state, t_x[:, t])
            t_steps.append(p)
        t_tail, t_state = ref(t_x[:, 250:], t_state)
    j_hist, j_state = fast(jnp.asarray(x[:, :200], jdt))
    j_steps = []
    for t in range(200, 250):
        p, j_state = fast.step(j_state, jnp.asarray(x[:, t], jdt))
        j_steps.append(p)
    j_tail, j_state = fast(jnp.asarray(x[:, 250:], jdt), j_state)
    label = f"stateful {dtype} hoist_inputs={hoist}"
    got = jnp.concatenate([j_hist, jnp.stack(j_steps, 1), j_tail], 1)
    want = torch.cat([t_hist, torch.stack(t_steps, 1), t_tail], 1)
    assert_steps_close(f"{label}: positions (history, 50 steps, a chunk)", got, want, POSITION_ATOL[dtype])
    for field, j, t in zip(jsr.TravellerState._fields, j_state, t_state):
        assert_close(f"{label}: final state.{field}", j, t, POSITION_ATOL[dtype])


# ---------------------------------------------------------------------------------------------------
# Any number of assets A (`num_assets`): every test above runs the seed's A = 2
# ---------------------------------------------------------------------------------------------------

ASSETS = [1, 5]
# float64 gradients for A assets, relative to each gradient's largest entry: measured ~3e-15 at T=300
# (rounding summed over the steps), so 1e-12 keeps ~300x margin yet catches any mis-mapped weight column.
ASSETS_GRAD_RTOL = 1e-12


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_assets", ASSETS)
def test_forward_over_1000_steps_for_any_number_of_assets(num_assets, dtype, hoist):
    jdt, tdt = DTYPES[dtype]
    ref, ours = make_pair(dtype, hidden=16, num_assets=num_assets, hoist_inputs=hoist)
    x = np.random.default_rng(6).standard_normal((3, 1000, 4))
    with torch.no_grad():
        want, want_state = ref(torch.from_numpy(x).to(tdt))
    got, state = ours(jnp.asarray(x, jdt))
    assert got.shape == (3, 1000, num_assets)
    label = f"A={num_assets} {dtype} hoist_inputs={hoist}"
    assert_steps_close(f"{label}: positions", got, want, POSITION_ATOL[dtype])
    for field, j, t in zip(jsr.TravellerState._fields, state, want_state):
        assert_close(f"{label}: final state.{field}", j, t, POSITION_ATOL[dtype])


@pytest.mark.parametrize("num_assets", ASSETS)
def test_weights_convert_both_ways_for_any_number_of_assets(num_assets):
    ours = jsr.Traveller(4, 8, 2, 0.0, num_assets=num_assets, param_dtype=jnp.float64, rngs=nnx.Rngs(1))
    twin = TorchTraveller(4, 8, 2, 0.0, num_assets=num_assets).double()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in jsr.torch_state_dict(ours).items()}, strict=True)
    x = np.random.default_rng(7).standard_normal((2, 50, 4))
    with torch.no_grad():
        want, _ = twin(torch.from_numpy(x))
    assert_steps_close(f"A={num_assets}: positions after jax -> torch", ours(jnp.asarray(x))[0], want,
                       POSITION_ATOL["float64"])
    torch.manual_seed(8)
    other = TorchTraveller(4, 8, 2, 0.0, num_assets=num_assets).double()  # fresh weights, to load the other way
    jsr.load_torch_state_dict(ours, other.state_dict())
    loaded = jsr.torch_state_dict(ours)
    assert list(loaded) == list(other.state_dict())
    for key, value in other.state_dict().items():
        np.testing.assert_array_equal(loaded[key], value.numpy(), err_msg=f"A={num_assets}: {key} after torch -> jax")


@pytest.mark.parametrize(
    "twin_inputs, key, expected, given",
    [
        (4, "lstm_layers.weight_ih_l0", (32, 9), (32, 6)),  # same features: layer 0 reads A + F = 9 vs 6
        (7, "output_layer.weight", (5, 8), (2, 8)),  # A + F = 9 either way: only the readout tells
    ],
)
def test_state_dict_of_another_number_of_assets_is_refused_naming_the_key(twin_inputs, key, expected, given):
    ours = jsr.Traveller(4, 8, 1, 0.0, num_assets=5, rngs=nnx.Rngs(0))
    two_assets = TorchTraveller(twin_inputs, 8, 1, 0.0)
    message = rf"state_dict\['{key}'\]: expected shape \({expected[0]}, {expected[1]}\), got \({given[0]}, {given[1]}\)"
    with pytest.raises(ValueError, match=message):
        jsr.load_torch_state_dict(ours, two_assets.state_dict())
    with pytest.raises(RuntimeError, match=rf"size mismatch for {key}"):
        two_assets.load_state_dict({k: torch.from_numpy(v) for k, v in jsr.torch_state_dict(ours).items()})


def weighted_positions(positions, returns):
    """A loss every position of every asset and step feeds: sum of positions times fixed returns."""
    return (positions * returns).sum()


@pytest.mark.parametrize("hoist", HOIST)
def test_gradients_match_torch_for_five_assets(hoist):
    ref, ours = make_pair("float64", hidden=16, num_assets=5, hoist_inputs=hoist)
    rng = np.random.default_rng(9)
    features, returns = rng.standard_normal((4, 300, 4)), 0.1 * rng.standard_normal((4, 300, 5))
    t_loss = weighted_positions(ref(torch.from_numpy(features))[0], torch.from_numpy(returns))
    t_loss.backward()
    j_loss, j_grads = jax_loss_and_grads(ours, jnp.asarray(features), jnp.asarray(returns), weighted_positions)
    assert_close("weighted positions loss, A=5", j_loss, t_loss, POSITION_ATOL["float64"])
    want = {k: p.grad for k, p in ref.named_parameters()}
    assert_grads_close(j_grads, want, ASSETS_GRAD_RTOL, context=f"A=5, hoist_inputs={hoist}: ")
