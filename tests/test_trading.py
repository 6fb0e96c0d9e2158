"""Tests for the Garleanu-Pedersen trading task (jax_scan_rnn/data/trading.py)."""
import numpy as np
import pytest

from jax_scan_rnn.data.trading import (
    Market,
    MarketConfig,
    Objective,
    aim_portfolio,
    buy_and_hold_policy,
    markowitz_policy,
    net_utility,
    no_trade_policy,
    optimal_policy,
    partial_trading,
    performance,
    performance_terms,
    rolling_markowitz_policy,
    simulate,
    supervised_mse,
    trade_rate,
    utility_table,
)

CFG = MarketConfig()
OTHER = MarketConfig(phi_fast=0.5, phi_slow=0.1, b_fast=0.3, b_slow=0.8, return_corr=-0.5, gamma=1.0, lam=5.0)
ONE = MarketConfig(num_assets=1)
FIVE = MarketConfig(num_assets=5, return_corr=-0.2, lam=8.0)


@pytest.fixture(scope="module")
def market() -> Market:
    # Out of sample: nothing below is fitted, and this seed is used nowhere else.
    return simulate(CFG, num_paths=512, num_steps=500, seed=2013)


def mean_utility(positions, market, cfg=CFG) -> float:
    return float(net_utility(positions, market.returns, cfg).mean())


def linear_policy(signals, keep, gain):
    """x_t = keep @ x_{t-1} + gain @ f_t, the general form of the optimum."""
    positions = np.empty(signals.shape[:2] + (2,))
    x = np.zeros((signals.shape[0], 2))
    for t in range(signals.shape[1]):
        x = x @ keep.T + signals[:, t] @ gain.T
        positions[:, t] = x
    return positions


def closed_form_gains(cfg):
    """(keep, gain) of the optimal policy, read off by feeding unit inputs through the module's code."""
    rate, a = trade_rate(cfg), cfg.num_assets
    aim_matrix = aim_portfolio(cfg, np.eye(cfg.num_signals)[None]).reshape(cfg.num_signals, a).T
    return (1.0 - rate) * np.eye(a), rate * aim_matrix


def riccati_gains(cfg, iterations=20_000):
    """Optimal linear feedback on the state s = (x_{t-1}, f_t), by value iteration on V(s) = s'Ps/2 + c.

    One step: Q(s, x) = reward(s, x) + E V(x, (I - Phi) f + eps); noise only shifts the constant c,
    so the quadratic part obeys  W = R + G'PG,  x* = -W_xx^{-1} W_xs s,  P <- W_ss - W_sx W_xx^{-1} W_xs.
    """
    k, a = cfg.num_signals, cfg.num_assets
    n = a + k  # state size; z = (x_prev, f, x) has n + a entries
    sigma, lam_mat = cfg.Sigma, cfg.lam * cfg.Sigma
    xp, f, x = slice(0, a), slice(a, n), slice(n, n + a)
    reward = np.zeros((n + a, n + a))  # reward(z) = z' reward z / 2
    reward[x, x] = -(cfg.gamma * sigma + lam_mat)
    reward[xp, xp] = -lam_mat
    reward[xp, x] = reward[x, xp] = lam_mat
    reward[x, f] = cfg.B
    reward[f, x] = cfg.B.T
    step = np.zeros((n, n + a))  # next state (x, (I - Phi) f) = step @ z
    step[0:a, x] = np.eye(a)
    step[a:, f] = np.eye(k) - cfg.Phi
    p = np.zeros((n, n))
    for _ in range(iterations):
        w = reward + step.T @ p @ step
        feedback = -np.linalg.solve(w[x, x], w[x, :n])
        p_new = w[:n, :n] + w[:n, x] @ feedback
        if np.abs(p_new - p).max() < 1e-13:
            break
        p = p_new
    else:
        raise AssertionError("value iteration did not converge")
    return feedback[:, xp], feedback[:, f]


# ---------------------------------------------------------------- simulation


def test_shapes_and_determinism():
    m = simulate(CFG, num_paths=3, num_steps=7, seed=0)
    assert m.signals.shape == (3, 7, 4)
    assert m.returns.shape == (3, 7, 2)
    assert m.features.shape == (3, 7, 4)
    again = simulate(CFG, num_paths=3, num_steps=7, seed=0)
    other = simulate(CFG, num_paths=3, num_steps=7, seed=1)
    for name in ("signals", "returns", "features"):
        np.testing.assert_array_equal(getattr(m, name), getattr(again, name))
        assert not np.allclose(getattr(m, name), getattr(other, name))
    for policy in (optimal_policy, markowitz_policy, no_trade_policy):
        assert policy(CFG, m.signals).shape == (3, 7, 2)
    assert not no_trade_policy(CFG, m.signals).any()


def test_signals_are_stationary_with_the_configured_dynamics():
    m = simulate(CFG, num_paths=4000, num_steps=60, seed=3)
    f = m.signals
    for t in (0, 59):  # unit variance, zero mean at the start and at the end
        np.testing.assert_allclose(f[:, t].var(axis=0), 1.0, atol=0.08)
        np.testing.assert_allclose(f[:, t].mean(axis=0), 0.0, atol=0.06)
    lag1 = (f[:, 1:] * f[:, :-1]).mean(axis=(0, 1)) / (f**2).mean(axis=(0, 1))
    np.testing.assert_allclose(lag1, 1.0 - CFG.phi, atol=0.02)
    np.testing.assert_allclose(m.features.std(axis=(0, 1)), 1.0, atol=0.05)


def test_returns_follow_the_model():
    m = simulate(OTHER, num_paths=200, num_steps=200, seed=4)
    f = m.signals.reshape(-1, 4)
    r = m.returns.reshape(-1, 2)
    b_hat = np.linalg.lstsq(f, r, rcond=None)[0].T
    np.testing.assert_allclose(b_hat, OTHER.B, atol=0.02)
    resid = r - f @ OTHER.B.T
    np.testing.assert_allclose(np.cov(resid.T), OTHER.Sigma, atol=0.02)


# ---------------------------------------------------------------- optimality


@pytest.mark.parametrize("cfg", [CFG, OTHER, ONE, FIVE], ids=["defaults", "other", "one_asset", "five_assets"])
def test_closed_form_matches_riccati_solution(cfg):
    keep, gain = closed_form_gains(cfg)
    keep_r, gain_r = riccati_gains(cfg)
    np.testing.assert_allclose(keep, keep_r, atol=1e-9)
    np.testing.assert_allclose(gain, gain_r, atol=1e-9)


def test_without_costs_the_optimum_is_markowitz():
    cfg = MarketConfig(lam=0.0)
    assert trade_rate(cfg) == 1.0
    m = simulate(cfg, num_paths=2, num_steps=5, seed=0)
    np.testing.assert_allclose(optimal_policy(cfg, m.signals), markowitz_policy(cfg, m.signals), atol=1e-12)


def test_optimal_beats_markowitz_and_no_trade(market):
    table = utility_table(CFG, market)
    assert table["no_trade"] == 0.0
    assert table["optimal"] > 0.15  # the stationary expectation is 0.211
    assert table["markowitz"] < -0.5  # costs eat more than Markowitz earns


@pytest.mark.parametrize("rate_factor", [0.5, 0.8, 1.25, 2.0])
def test_optimal_beats_other_trading_rates(market, rate_factor):
    best = mean_utility(optimal_policy(CFG, market.signals), market)
    aim = aim_portfolio(CFG, market.signals)
    other = mean_utility(partial_trading(aim, rate_factor * trade_rate(CFG)), market)
    assert other < best - 0.002


@pytest.mark.parametrize("aim_scale", [0.7, 1.4])
def test_optimal_beats_scaled_aims(market, aim_scale):
    best = mean_utility(optimal_policy(CFG, market.signals), market)
    aim = aim_scale * aim_portfolio(CFG, market.signals)
    assert mean_utility(partial_trading(aim, trade_rate(CFG)), market) < best - 0.002


def test_optimal_beats_aiming_at_markowitz(market):
    best = mean_utility(optimal_policy(CFG, market.signals), market)
    smoothed = partial_trading(markowitz_policy(CFG, market.signals), trade_rate(CFG))
    assert mean_utility(smoothed, market) < best - 0.002


def test_random_linear_perturbations_never_beat_the_optimum(market):
    rng = np.random.default_rng(0)
    keep, gain = closed_form_gains(CFG)
    signals = market.signals[:256]
    sub = Market(signals, market.returns[:256], market.features[:256])
    best = mean_utility(linear_policy(signals, keep, gain), sub)
    for _ in range(10):
        keep_p = keep + 0.1 * rng.standard_normal(keep.shape)
        gain_p = gain * (1.0 + 0.3 * rng.standard_normal(gain.shape))
        assert mean_utility(linear_policy(signals, keep_p, gain_p), sub) < best


def test_default_positions_stay_in_bounds(market):
    x = optimal_policy(CFG, market.signals)
    assert (np.abs(x) > 0.95).mean() < 1e-3  # measured 0.0045 %
    assert 0.15 < x.std() < 0.35  # the range of tanh is used, but not its flat ends


# ---------------------------------------------------------------- utility functions


def test_net_utility_matches_a_step_by_step_loop():
    rng = np.random.default_rng(5)
    x, r = rng.standard_normal((2, 3, 6, 2))
    expected = np.zeros(3)
    prev = np.zeros((3, 2))
    for t in range(6):
        dx = x[:, t] - prev
        expected += (
            (x[:, t] * r[:, t]).sum(-1)
            - OTHER.gamma / 2 * np.einsum("bi,ij,bj->b", x[:, t], OTHER.Sigma, x[:, t])
            - OTHER.lam / 2 * np.einsum("bi,ij,bj->b", dx, OTHER.Sigma, dx)
        )
        prev = x[:, t]
    np.testing.assert_allclose(net_utility(x, r, OTHER, per_step=False), expected, rtol=1e-12)
    np.testing.assert_allclose(net_utility(x, r, OTHER), expected / 6, rtol=1e-12)


def test_net_utility_and_mse_on_jax_match_numpy_and_differentiate():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    m = simulate(CFG, num_paths=4, num_steps=30, seed=6)
    x = optimal_policy(CFG, m.signals) + 0.1 * np.random.default_rng(7).standard_normal((4, 30, 2))
    x32, r32 = x.astype(np.float32), m.returns.astype(np.float32)

    u_jax = jax.jit(lambda p, r: net_utility(p, r, CFG))(jnp.asarray(x32), jnp.asarray(r32))
    assert isinstance(u_jax, jax.Array) and u_jax.shape == (4,)
    np.testing.assert_allclose(np.asarray(u_jax), net_utility(x32, r32, CFG), rtol=1e-5, atol=1e-6)

    grad = jax.grad(lambda p: net_utility(p, jnp.asarray(r32), CFG, per_step=False).sum())(jnp.asarray(x32))
    # dU/dx_t = r_{t+1} - gamma Sigma x_t - Lambda dx_t + Lambda dx_{t+1}  (no dx_T)
    dx = np.diff(x, axis=1, prepend=0.0)
    dx_next = np.concatenate([dx[:, 1:], np.zeros_like(dx[:, :1])], axis=1)
    lam_mat = CFG.lam * CFG.Sigma
    expected = m.returns - CFG.gamma * x @ CFG.Sigma - dx @ lam_mat + dx_next @ lam_mat
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-4, atol=1e-4)

    mse_jax = supervised_mse(jnp.asarray(x32), jnp.zeros_like(jnp.asarray(x32)))
    np.testing.assert_allclose(float(mse_jax), supervised_mse(x32, np.zeros_like(x32)), rtol=1e-6)
    g = jax.grad(lambda p: supervised_mse(p, jnp.asarray(r32)))(jnp.asarray(x32))
    np.testing.assert_allclose(np.asarray(g), 2 * (x32 - r32) / x32.size, rtol=1e-5, atol=1e-8)


def test_supervised_mse():
    x = np.arange(12.0).reshape(1, 6, 2)
    assert supervised_mse(x, x) == 0.0
    assert supervised_mse(x, x + 2.0) == pytest.approx(4.0)


def test_utility_table_with_learned_positions(market):
    sub = Market(market.signals[:16], market.returns[:16], market.features[:16])
    table = utility_table(CFG, sub, learned_positions=optimal_policy(CFG, sub.signals))
    assert set(table) == {"optimal", "markowitz", "no_trade", "learned", "learned_over_optimal"}
    assert table["learned"] == pytest.approx(table["optimal"])
    assert table["learned_over_optimal"] == pytest.approx(1.0)
    assert all(isinstance(v, float) for v in table.values())


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_assets=0), r"num_assets: expected an int >= 1, got 0"),
        (dict(num_assets=True), r"num_assets: expected an int >= 1, got True"),
        (dict(num_assets=3, return_corr=-0.5), r"return_corr: expected > -1/\(num_assets - 1\) = -0.5 for 3 assets"),
        (dict(phi_fast=0.0), r"phi_fast: expected a finite number in \(0, 1\], got 0.0"),
        (dict(phi_slow=1.5), r"phi_slow: expected a finite number in \(0, 1\], got 1.5"),
        (dict(phi_slow=True), r"phi_slow: expected a finite number in \(0, 1\], got True"),
        (dict(b_fast=float("nan")), r"b_fast: expected a finite number, got nan"),
        (dict(return_corr=1.0), r"return_corr: expected a finite number in \(-1, 1\), got 1.0"),
        (dict(gamma=0.0), r"gamma: expected a finite number > 0, got 0.0"),
        (dict(return_vol=-1.0), r"return_vol: expected a finite number > 0, got -1.0"),
        (dict(lam=-1.0), r"lam: expected a finite number >= 0, got -1.0"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MarketConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_paths=0), r"num_paths: expected an int >= 1, got 0"),
        (dict(num_steps=2.5), r"num_steps: expected an int >= 1, got 2.5"),
        (dict(seed="a"), r"^seed: expected an int >= 0, got 'a'$"),
        (dict(seed=True), r"^seed: expected an int >= 0, got True$"),
        # NumPy's own refusal ("expected non-negative integer") named no argument
        (dict(seed=-1), r"^seed: expected an int >= 0, got -1$"),
    ],
)
def test_simulate_errors(kwargs, match):
    args = dict(num_paths=2, num_steps=3, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        simulate(CFG, **args)


def test_shape_errors():
    x = np.zeros((2, 3, 2))
    with pytest.raises(ValueError, match=r"signals: expected shape \[B, T, 4\], got \(2, 3, 2\)"):
        optimal_policy(CFG, x)
    with pytest.raises(ValueError, match=r"signals: expected shape \[B, T, 4\], got \(3, 4\)"):
        markowitz_policy(CFG, np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"positions: expected shape \[B, T, 2\], got \(2, 3, 3\)"):
        net_utility(np.zeros((2, 3, 3)), np.zeros((2, 3, 3)), CFG)
    that_of = r"expected shape \(2, 3, 2\) \(that of positions\)"
    with pytest.raises(ValueError, match=rf"returns: {that_of}, got \(2, 4, 2\)"):
        net_utility(x, np.zeros((2, 4, 2)), CFG)
    with pytest.raises(ValueError, match=rf"targets: {that_of}, got \(2, 3\)"):
        supervised_mse(x, np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"positions: expected a numpy or jax array, got list"):
        net_utility([[[0.0, 0.0]]], x, CFG)
    m = simulate(CFG, num_paths=2, num_steps=3, seed=0)
    with pytest.raises(ValueError, match=r"learned_positions: expected shape \(2, 3, 2\).*got \(2, 2, 2\)"):
        utility_table(CFG, m, learned_positions=np.zeros((2, 2, 2)))


# ---------------------------------------------------------------- N assets


@pytest.mark.parametrize("cfg", [ONE, FIVE], ids=["one_asset", "five_assets"])
def test_n_asset_market_shapes_and_the_optimum_wins(cfg):
    a = cfg.num_assets
    m = simulate(cfg, num_paths=256, num_steps=300, seed=5)
    assert m.signals.shape == (256, 300, 2 * a) and m.returns.shape == (256, 300, a)
    assert cfg.B.shape == (a, 2 * a) and cfg.Sigma.shape == (a, a)
    best = mean_utility(optimal_policy(cfg, m.signals), m, cfg)
    assert best > mean_utility(markowitz_policy(cfg, m.signals), m, cfg)
    assert best > mean_utility(no_trade_policy(cfg, m.signals), m, cfg) == 0.0
    assert np.linalg.eigvalsh(cfg.Sigma).min() > 0


def test_sigma_is_equicorrelated():
    sigma = MarketConfig(num_assets=4, return_vol=2.0, return_corr=0.25).Sigma
    np.testing.assert_allclose(np.diag(sigma), 4.0)
    np.testing.assert_allclose(sigma[~np.eye(4, dtype=bool)], 1.0)


# ---------------------------------------------------------------- the objective on real data


def test_objective_of_a_market_is_its_own():
    obj = FIVE.objective
    assert (obj.gamma, obj.lam, obj.num_assets) == (FIVE.gamma, FIVE.lam, 5)
    np.testing.assert_array_equal(obj.Sigma, FIVE.Sigma)
    m = simulate(FIVE, num_paths=3, num_steps=9, seed=0)
    x = optimal_policy(FIVE, m.signals)
    np.testing.assert_array_equal(net_utility(x, m.returns, obj), net_utility(x, m.returns, FIVE))
    again = Objective.from_json(obj.to_json())
    np.testing.assert_array_equal(again.Sigma, obj.Sigma)
    assert (again.gamma, again.lam) == (obj.gamma, obj.lam)


@pytest.mark.parametrize(
    ("sigma", "match"),
    [
        (np.eye(2)[:1], r"Sigma: expected a square \[A, A\] matrix, got shape \(1, 2\)"),
        (np.array([[1.0, 0.5], [0.4, 1.0]]), r"Sigma: expected a symmetric matrix"),
        (np.array([[1.0, 2.0], [2.0, 1.0]]), r"Sigma: expected a positive definite matrix, got smallest eigenvalue -1"),
        (np.array([[np.nan]]), r"Sigma: expected finite values"),
        ("abc", r"Sigma: expected a square \[A, A\] matrix of numbers, got str"),
    ],
)
def test_objective_errors(sigma, match):
    with pytest.raises(ValueError, match=match):
        Objective(3.0, 20.0, sigma)


def test_objective_refuses_bad_gamma_and_lam():
    with pytest.raises(ValueError, match=r"gamma: expected a finite number > 0, got 0"):
        Objective(0, 1.0, np.eye(1))
    with pytest.raises(ValueError, match=r"lam: expected a finite number >= 0, got -1"):
        Objective(1.0, -1, np.eye(1))


def test_utility_terms_sum_to_net_utility_and_previous_prices_the_first_trade(market):
    x, r = optimal_policy(CFG, market.signals[:8]), market.returns[:8]

    def utility_terms(*args, **kwargs):
        return performance_terms(*args, **kwargs)["utility"]

    terms = utility_terms(x, r, CFG)
    assert terms.shape == (8, 500)
    np.testing.assert_allclose(terms.mean(axis=1), net_utility(x, r, CFG), rtol=1e-12)
    # Scoring the second half of a run with the position held before it equals the run's own terms.
    np.testing.assert_allclose(utility_terms(x[:, 250:], r[:, 250:], CFG, previous=x[:, 249]), terms[:, 250:],
                               rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"previous: expected shape \(8, 2\) \(\[B, A\]\), got \(8, 3\)"):
        utility_terms(x, r, CFG, previous=np.zeros((8, 3)))


def test_performance_by_hand():
    obj = Objective(2.0, 10.0, np.array([[0.04]]))
    x = np.array([[[0.5], [0.5], [1.0]]])
    r = np.array([[[0.1], [-0.2], [0.3]]])
    report = performance(x, r, obj, periods_per_year=4)
    gross = np.array([0.05, -0.1, 0.3])
    cost = 0.5 * 10.0 * 0.04 * np.array([0.25, 0.0, 0.25])
    risk = 0.5 * 2.0 * 0.04 * np.array([0.25, 0.25, 1.0])
    net = gross - cost
    assert report["utility"] == pytest.approx((gross - risk - cost).mean())
    assert report["return"] == pytest.approx(gross.mean())
    assert report["cost"] == pytest.approx(cost.mean())
    assert report["turnover"] == pytest.approx(1.0 / 3)
    assert report["sharpe"] == pytest.approx(net.mean() / net.std() * 2.0)
    assert performance(np.zeros_like(x), r, obj)["sharpe"] is None  # no trading: no risk to scale by


@pytest.mark.parametrize("periods", [0, -252, None])
def test_performance_names_a_periods_per_year_that_annualises_nothing(periods):
    # 0 gave a Sharpe ratio of exactly 0, a negative number NaN (with NumPy's RuntimeWarning), None NumPy's TypeError
    obj = Objective(2.0, 10.0, np.array([[0.04]]))
    x, r = np.array([[[0.5], [0.5], [1.0]]]), np.array([[[0.1], [-0.2], [0.3]]])
    with pytest.raises(ValueError, match=rf"^periods_per_year: expected a finite number > 0, got {periods}$"):
        performance(x, r, obj, periods_per_year=periods)


def test_buy_and_hold_and_rolling_markowitz_use_only_the_past():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((2, 60, 3)) * 0.1 + 0.02
    np.testing.assert_array_equal(buy_and_hold_policy(r), np.full((2, 60, 3), 1 / 3))
    obj = Objective(3.0, 1.0, np.diag([0.01, 0.02, 0.03]))
    x = rolling_markowitz_policy(r, obj, window=10, min_history=5)
    assert not x[:, :5].any()  # fewer than 5 known returns: no position
    assert x[:, 5].all()  # at step 5, returns 0-4 are known: min_history of them, a position
    t = 30
    expected = np.clip(r[:, t - 10:t].mean(axis=1) / (3.0 * np.diag(obj.Sigma)), -1, 1)
    np.testing.assert_allclose(x[:, t], expected, rtol=1e-12)
    changed = r.copy()
    changed[:, t:] += 5.0  # the future must not move today's position
    np.testing.assert_allclose(rolling_markowitz_policy(changed, obj, window=10, min_history=5)[:, : t + 1], x[:, : t + 1])


def test_holding_the_previous_position_trades_nothing():
    """`previous`: the position before the first step; holding it costs nothing and turns nothing over."""
    rng = np.random.default_rng(0)
    obj = Objective(3.0, 20.0, np.array([[1.0, 0.3], [0.3, 1.0]]) * 1e-4)
    x0 = np.clip(rng.standard_normal((3, 2)), -1, 1)
    terms = performance_terms(np.repeat(x0[:, None], 10, axis=1), 0.01 * rng.standard_normal((3, 10, 2)), obj,
                              previous=x0)
    assert (terms["turnover"] == 0).all() and (terms["cost"] == 0).all()
