"""A toy market whose optimal trading policy is known: Garleanu & Pedersen (2013), no discounting.

Two assets, K = 4 signals (a fast and a slow one per asset), one step t = 0 .. T-1 per row:

    signals    f_{t+1} = (I - Phi) f_t + eps_{t+1},   eps ~ N(0, Omega),  f_0 ~ stationary N(0, I)
    returns    r_{t+1} = B f_t + u_{t+1},             u   ~ N(0, Sigma)
    position   x_t, chosen at t after seeing f_t;      x_{-1} = 0,  trade dx_t = x_t - x_{t-1}
    utility    U = sum_t [ x_t . r_{t+1}  -  gamma/2 x_t' Sigma x_t  -  1/2 dx_t' Lambda dx_t ],
               Lambda = lam * Sigma

Signal order is [fast_0, fast_1, slow_0, slow_1]: B = [b_fast I, b_slow I], Phi = diag(phi), and
Omega = diag(1 - (1 - phi)^2) so that every signal has unit stationary variance.

Without costs (lam = 0) the best position is Markowitz's, x_t = (gamma Sigma)^{-1} B f_t: it only
needs today's signals. With costs that policy churns (the fast signals flip sign every few steps)
and loses more in costs than it earns. The optimum (GP's closed form for Lambda = lam Sigma, with
rho = 0) trades part of the way towards an "aim" portfolio that discounts fast signals more:

    a     = (-gamma + sqrt(gamma^2 + 4 gamma lam)) / 2
    aim_t = (gamma Sigma)^{-1} B (I + a Phi / gamma)^{-1} f_t
    x_t   = x_{t-1} + (a / lam) (aim_t - x_{t-1})

So the best x_t depends on where you already are, x_{t-1}: it is an exponentially weighted average
of all past aims, which no function of today's features alone can reproduce. A policy that reads
its own previous position back in (the "Traveller" LSTM) can represent it.
(The tests check this closed form against a Riccati iteration on the state (x_{t-1}, f_t).)

Defaults, mean utility per step on 1024 paths x 500 steps (seed 0): optimal 0.213, Markowitz
-1.070 (it pays 1.53 per step in costs), no trade 0; the exact stationary values are 0.211 and
-1.068. The optimal positions have std 0.24 and |x| > 0.95 in ~0.005 % of (path, step, asset)
entries (at most 0.011 % over 20 seeds of 512 x 500), so a tanh output barely bends. On 256 x 500
paths the optimum's mean is known to ~1.2 %, and a learned policy's ratio to it on the same paths
to ~0.1 %.

`net_utility` and `supervised_mse` use only operators and array methods, so they run unchanged
on numpy and jax arrays (and differentiate under `jax.grad`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_scan_rnn import validate


@dataclass(frozen=True)
class MarketConfig:
    """Model parameters; the matrices of the module docstring are built by the properties below."""

    num_assets: int = 2  # number of assets; fixed at 2
    phi_fast: float = 0.3  # mean-reversion speed of the fast signals (half-life ~2 steps)
    phi_slow: float = 0.05  # mean-reversion speed of the slow signals (half-life ~14 steps)
    b_fast: float = 1.0  # expected next return of an asset per unit of its fast signal
    b_slow: float = 0.5  # expected next return of an asset per unit of its slow signal
    return_vol: float = 1.0  # std of the unpredictable return noise u, per asset and step
    return_corr: float = 0.3  # correlation of the two assets' return noise
    gamma: float = 3.0  # risk aversion
    lam: float = 20.0  # transaction-cost scale: Lambda = lam * Sigma

    def __post_init__(self):
        validate.choice("num_assets", self.num_assets, (2,))
        validate.real("phi_fast", self.phi_fast, lo=0, hi=1, lo_open=True)
        validate.real("phi_slow", self.phi_slow, lo=0, hi=1, lo_open=True)
        validate.real("b_fast", self.b_fast)
        validate.real("b_slow", self.b_slow)
        validate.real("return_vol", self.return_vol, lo=0, lo_open=True)
        validate.real("return_corr", self.return_corr, lo=-1, hi=1, lo_open=True, hi_open=True)
        validate.real("gamma", self.gamma, lo=0, lo_open=True)
        validate.real("lam", self.lam, lo=0)

    @property
    def num_signals(self) -> int:
        """K = 4: [fast_0, fast_1, slow_0, slow_1]."""
        return 2 * self.num_assets

    @property
    def phi(self) -> np.ndarray:
        """[K] mean-reversion speeds, the diagonal of Phi."""
        return np.array([self.phi_fast] * 2 + [self.phi_slow] * 2)

    @property
    def Phi(self) -> np.ndarray:
        """[K, K] mean-reversion matrix."""
        return np.diag(self.phi)

    @property
    def Omega(self) -> np.ndarray:
        """[K, K] signal shock covariance, chosen so that each signal has unit stationary variance."""
        return np.diag(1.0 - (1.0 - self.phi) ** 2)

    @property
    def B(self) -> np.ndarray:
        """[2, K] return loadings: E[r_{t+1} | f_t] = B f_t."""
        eye = np.eye(self.num_assets)
        return np.concatenate([self.b_fast * eye, self.b_slow * eye], axis=1)

    @property
    def Sigma(self) -> np.ndarray:
        """[2, 2] covariance of the return noise u."""
        c = self.return_corr
        return self.return_vol**2 * np.array([[1.0, c], [c, 1.0]])


@dataclass(frozen=True)
class Market:
    """One simulated batch of B paths of T steps (numpy float64)."""

    signals: np.ndarray  # [B, T, K]  f_t
    returns: np.ndarray  # [B, T, 2]  r_{t+1}: the return earned by the position x_t chosen at step t
    features: np.ndarray  # [B, T, F]  what the model reads at t: the signals scaled to unit variance (F == K)


def simulate(cfg: MarketConfig, num_paths: int, num_steps: int, seed: int) -> Market:
    """Draw `num_paths` independent stationary paths of `num_steps` steps; same seed, same market."""
    num_paths = validate.integer("num_paths", num_paths, lo=1)
    num_steps = validate.integer("num_steps", num_steps, lo=1)
    validate.integer("seed", seed)
    rng = np.random.default_rng(seed)
    k = cfg.num_signals
    decay = 1.0 - cfg.phi  # [K]
    shock_std = np.sqrt(1.0 - decay**2)  # [K], sqrt of diag(Omega)
    f0 = rng.standard_normal((num_paths, k))  # the stationary law is N(0, I)
    eps = rng.standard_normal((num_paths, num_steps, k)) * shock_std
    noise = rng.standard_normal((num_paths, num_steps, cfg.num_assets))

    signals = np.empty((num_paths, num_steps, k))
    signals[:, 0] = f0
    for t in range(1, num_steps):
        signals[:, t] = decay * signals[:, t - 1] + eps[:, t]
    returns = signals @ cfg.B.T + noise @ np.linalg.cholesky(cfg.Sigma).T
    features = signals.copy()  # the signals already have unit stationary variance
    return Market(signals=signals, returns=returns, features=features)


def _check_signals(cfg: MarketConfig, signals) -> np.ndarray:
    signals = np.asarray(signals)
    if signals.ndim != 3 or signals.shape[-1] != cfg.num_signals:
        raise ValueError(f"signals: expected shape [B, T, {cfg.num_signals}], got {signals.shape}")
    return signals


def trade_rate(cfg: MarketConfig) -> float:
    """a / lam, the fraction of the gap to the aim portfolio traded each step (1 when lam = 0)."""
    g, lam = cfg.gamma, cfg.lam
    # == (-g + sqrt(g^2 + 4 g lam)) / (2 lam), written so that lam = 0 gives 1.
    return 2.0 * g / (g + np.sqrt(g * g + 4.0 * g * lam))


def aim_portfolio(cfg: MarketConfig, signals) -> np.ndarray:
    """[B, T, K] signals -> [B, T, 2] aim_t = (gamma Sigma)^{-1} B (I + a Phi / gamma)^{-1} f_t."""
    signals = _check_signals(cfg, signals)
    a = cfg.lam * trade_rate(cfg)
    k = cfg.num_signals
    discount = np.linalg.inv(np.eye(k) + cfg.Phi * a / cfg.gamma)
    aim_matrix = np.linalg.solve(cfg.gamma * cfg.Sigma, cfg.B @ discount)
    return signals @ aim_matrix.T


def partial_trading(aim, rate: float) -> np.ndarray:
    """[B, T, 2] aims -> [B, T, 2] positions x_t = x_{t-1} + rate (aim_t - x_{t-1}), x_{-1} = 0."""
    aim = np.asarray(aim)
    if aim.ndim != 3 or aim.shape[-1] != 2:
        raise ValueError(f"aim: expected shape [B, T, 2], got {aim.shape}")
    positions = np.empty_like(aim)
    x = np.zeros_like(aim[:, 0])
    for t in range(aim.shape[1]):
        x = x + rate * (aim[:, t] - x)
        positions[:, t] = x
    return positions


def optimal_policy(cfg: MarketConfig, signals) -> np.ndarray:
    """[B, T, K] signals -> [B, T, 2] GP positions: trade a/lam of the way to the aim each step."""
    return partial_trading(aim_portfolio(cfg, signals), trade_rate(cfg))


def markowitz_policy(cfg: MarketConfig, signals) -> np.ndarray:
    """[B, T, K] signals -> [B, T, 2] myopic positions x_t = (gamma Sigma)^{-1} B f_t (ignores costs)."""
    signals = _check_signals(cfg, signals)
    return signals @ np.linalg.solve(cfg.gamma * cfg.Sigma, cfg.B).T


def no_trade_policy(cfg: MarketConfig, signals) -> np.ndarray:
    """[B, T, K] signals -> [B, T, 2] zeros."""
    signals = _check_signals(cfg, signals)
    return np.zeros(signals.shape[:2] + (cfg.num_assets,))


def _check_pair(name_a: str, a, name_b: str, b, last: int | None = None) -> None:
    # Uses only .ndim / .shape, so jax arrays and tracers pass through untouched.
    for name, x in ((name_a, a), (name_b, b)):
        if not hasattr(x, "shape"):
            raise ValueError(f"{name}: expected a numpy or jax array, got {type(x).__name__}")
    if a.ndim != 3 or (last is not None and a.shape[-1] != last):
        raise ValueError(f"{name_a}: expected shape [B, T, {last if last else 'N'}], got {tuple(a.shape)}")
    if tuple(b.shape) != tuple(a.shape):
        expected = f"{tuple(a.shape)} (that of {name_a})"
        raise ValueError(f"{name_b}: expected shape {expected}, got {tuple(b.shape)}")


def net_utility(positions, returns, cfg: MarketConfig, *, per_step: bool = True):
    """[B] utility of each path (divided by T if `per_step`); numpy, jax or torch in, same kind out.

    positions [B, T, 2] holds x_t, returns [B, T, 2] holds r_{t+1} (as `Market.returns`):
        U = sum_t [ x_t . r_{t+1} - gamma/2 x_t' Sigma x_t - lam/2 dx_t' Sigma dx_t ],  x_{-1} = 0.
    """
    _check_pair("positions", positions, "returns", returns, last=cfg.num_assets)
    # Sigma in the positions' own kind and dtype: float32 stays float32, and torch tensors work too
    # (the parity tests train torch_ref on this same function).
    sigma = positions.new_tensor(cfg.Sigma) if hasattr(positions, "new_tensor") else cfg.Sigma.astype(positions.dtype)
    gain = (positions * returns).sum(axis=(1, 2))
    risk = ((positions @ sigma) * positions).sum(axis=(1, 2))
    trades = positions[:, 1:] - positions[:, :-1]  # dx_1 .. dx_{T-1}; dx_0 = x_0
    first = positions[:, 0]
    cost = ((trades @ sigma) * trades).sum(axis=(1, 2)) + ((first @ sigma) * first).sum(axis=1)
    utility = gain - 0.5 * cfg.gamma * risk - 0.5 * cfg.lam * cost
    return utility / positions.shape[1] if per_step else utility


def supervised_mse(positions, targets):
    """Scalar mean squared error between [B, T, N] positions and targets; numpy or jax."""
    _check_pair("positions", positions, "targets", targets)
    return ((positions - targets) ** 2).mean()


def utility_table(cfg: MarketConfig, market: Market, learned_positions=None) -> dict[str, float]:
    """Mean per-step utility of each policy on `market`, plus "learned_over_optimal" if learned is given."""
    table = {}
    policies = {"optimal": optimal_policy, "markowitz": markowitz_policy, "no_trade": no_trade_policy}
    for name, policy in policies.items():
        table[name] = float(net_utility(policy(cfg, market.signals), market.returns, cfg).mean())
    if learned_positions is not None:
        learned = np.asarray(learned_positions, dtype=np.float64)
        if learned.shape != market.returns.shape:
            expected = f"{market.returns.shape} (that of market.returns)"
            raise ValueError(f"learned_positions: expected shape {expected}, got {learned.shape}")
        table["learned"] = float(net_utility(learned, market.returns, cfg).mean())
        table["learned_over_optimal"] = table["learned"] / table["optimal"]
    return table
