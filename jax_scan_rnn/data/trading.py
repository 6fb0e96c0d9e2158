"""A toy market whose optimal trading policy is known (Garleanu & Pedersen 2013, no discounting), and the
trader's objective, which also scores positions on a user's own data (`Objective`, `performance`).

A assets (2 by default, the seed's), K = 2A signals (a fast and a slow one per asset), one step
t = 0 .. T-1 per row:

    signals    f_{t+1} = (I - Phi) f_t + eps_{t+1},   eps ~ N(0, Omega),  f_0 ~ stationary N(0, I)
    returns    r_{t+1} = B f_t + u_{t+1},             u   ~ N(0, Sigma)
    position   x_t, chosen at t after seeing f_t;      x_{-1} = 0,  trade dx_t = x_t - x_{t-1}
    utility    U = sum_t [ x_t . r_{t+1}  -  gamma/2 x_t' Sigma x_t  -  1/2 dx_t' Lambda dx_t ],
               Lambda = lam * Sigma

Signal order is [fast_0 .. fast_{A-1}, slow_0 .. slow_{A-1}]: B = [b_fast I, b_slow I], Phi = diag(phi),
Omega = diag(1 - (1 - phi)^2) so that every signal has unit stationary variance, and the return noise
has Sigma = return_vol^2 ((1 - c) I + c 11') (equal correlation c between every pair of assets).

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

Defaults (A = 2), mean utility per step on 1024 paths x 500 steps (seed 0): optimal 0.213, Markowitz
-1.070 (it pays 1.53 per step in costs), no trade 0; the exact stationary values are 0.211 and
-1.068. The optimal positions have std 0.24 and |x| > 0.95 in ~0.005 % of (path, step, asset)
entries (at most 0.011 % over 20 seeds of 512 x 500), so a tanh output barely bends. On 256 x 500
paths the optimum's mean is known to ~1.2 %, and a learned policy's ratio to it on the same paths
to ~0.1 %.

`net_utility` and `supervised_mse` use only operators and array methods, so they run unchanged
on numpy, jax and torch arrays (and differentiate under `jax.grad`).

On real data there is no known optimum. `Objective` holds the utility's gamma, lam and a return
covariance Sigma (the CLI estimates it from the training period); `performance_terms` and `performance`
score positions on a period of a longer run, and `buy_and_hold_policy` and `rolling_markowitz_policy` are
the baselines.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_scan_rnn import validate


@dataclass(frozen=True)
class MarketConfig:
    """Model parameters; the matrices of the module docstring are built by the properties below."""

    num_assets: int = 2  # A, the number of assets (2 is the seed's model)
    phi_fast: float = 0.3  # mean-reversion speed of the fast signals (half-life ~2 steps)
    phi_slow: float = 0.05  # mean-reversion speed of the slow signals (half-life ~14 steps)
    b_fast: float = 1.0  # expected next return of an asset per unit of its fast signal
    b_slow: float = 0.5  # expected next return of an asset per unit of its slow signal
    return_vol: float = 1.0  # std of the unpredictable return noise u, per asset and step
    return_corr: float = 0.3  # correlation of every pair of assets' return noise
    gamma: float = 3.0  # risk aversion
    lam: float = 20.0  # transaction-cost scale: Lambda = lam * Sigma

    def __post_init__(self):
        validate.integer("num_assets", self.num_assets, lo=1)
        validate.real("phi_fast", self.phi_fast, lo=0, hi=1, lo_open=True)
        validate.real("phi_slow", self.phi_slow, lo=0, hi=1, lo_open=True)
        validate.real("b_fast", self.b_fast)
        validate.real("b_slow", self.b_slow)
        validate.real("return_vol", self.return_vol, lo=0, lo_open=True)
        validate.real("return_corr", self.return_corr, lo=-1, hi=1, lo_open=True, hi_open=True)
        if self.num_assets > 2 and self.return_corr <= -1 / (self.num_assets - 1):
            # Sigma's smallest eigenvalue is vol^2 (1 + (A - 1) c): positive only above -1/(A - 1).
            raise ValueError(f"return_corr: expected > -1/(num_assets - 1) = {-1 / (self.num_assets - 1):.4g} "
                             f"for {self.num_assets} assets (else Sigma is not positive definite), got {self.return_corr}")
        validate.real("gamma", self.gamma, lo=0, lo_open=True)
        validate.real("lam", self.lam, lo=0)

    @property
    def num_signals(self) -> int:
        """K = 2A: [fast_0 .. fast_{A-1}, slow_0 .. slow_{A-1}]."""
        return 2 * self.num_assets

    @property
    def phi(self) -> np.ndarray:
        """[K] mean-reversion speeds, the diagonal of Phi."""
        return np.array([self.phi_fast] * self.num_assets + [self.phi_slow] * self.num_assets)

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
        """[A, K] return loadings: E[r_{t+1} | f_t] = B f_t."""
        eye = np.eye(self.num_assets)
        return np.concatenate([self.b_fast * eye, self.b_slow * eye], axis=1)

    @property
    def Sigma(self) -> np.ndarray:
        """[A, A] covariance of the return noise u: vol^2 on the diagonal, vol^2 c off it."""
        c, eye = self.return_corr, np.eye(self.num_assets)
        return self.return_vol**2 * ((1.0 - c) * eye + c * np.ones_like(eye))

    @property
    def objective(self) -> Objective:
        """The utility this market is traded for: its gamma, lam and Sigma."""
        return Objective(self.gamma, self.lam, self.Sigma)


@dataclass(frozen=True, eq=False)
class Objective:
    """The trader's net utility per step, `x_t . r_{t+1} - gamma/2 x_t' Sigma x_t - lam/2 dx_t' Sigma dx_t`.

    gamma: risk aversion (> 0). lam: the cost scale (>= 0): trading dx costs lam/2 dx' Sigma dx, as in
    Garleanu-Pedersen, where costs are proportional to risk. Sigma: [A, A] return covariance, symmetric
    positive definite (on real data: given, or estimated from the training period).
    """

    gamma: float
    lam: float
    Sigma: np.ndarray

    def __post_init__(self):
        validate.real("gamma", self.gamma, lo=0, lo_open=True)
        validate.real("lam", self.lam, lo=0)
        try:
            sigma = np.array(self.Sigma, dtype=np.float64)  # a copy: the caller's array may change later
        except (TypeError, ValueError):
            raise ValueError(f"Sigma: expected a square [A, A] matrix of numbers, got {type(self.Sigma).__name__}") from None
        if sigma.ndim != 2 or sigma.shape[0] != sigma.shape[1] or sigma.size == 0:
            raise ValueError(f"Sigma: expected a square [A, A] matrix, got shape {sigma.shape}")
        if not np.isfinite(sigma).all():
            raise ValueError("Sigma: expected finite values, got NaN or inf")
        if not np.allclose(sigma, sigma.T, rtol=1e-8, atol=0):
            raise ValueError("Sigma: expected a symmetric matrix, got one that is not")
        smallest = float(np.linalg.eigvalsh(sigma).min())
        if smallest <= 0:
            raise ValueError(f"Sigma: expected a positive definite matrix, got smallest eigenvalue {smallest:.3g}")
        sigma.flags.writeable = False
        object.__setattr__(self, "Sigma", sigma)
        object.__setattr__(self, "gamma", float(self.gamma))
        object.__setattr__(self, "lam", float(self.lam))

    @property
    def num_assets(self) -> int:
        return self.Sigma.shape[0]

    def to_json(self) -> dict:
        return {"gamma": self.gamma, "lam": self.lam, "Sigma": self.Sigma.tolist()}

    @classmethod
    def from_json(cls, data: dict) -> Objective:
        return cls(data["gamma"], data["lam"], np.asarray(data["Sigma"]))


@dataclass(frozen=True)
class Market:
    """One simulated batch of B paths of T steps (numpy float64)."""

    signals: np.ndarray  # [B, T, K]  f_t
    returns: np.ndarray  # [B, T, A]  r_{t+1}: the return earned by the position x_t chosen at step t
    features: np.ndarray  # [B, T, F]  what the model reads at t: the signals scaled to unit variance (F == K)


def simulate(cfg: MarketConfig, num_paths: int, num_steps: int, seed: int) -> Market:
    """Draw `num_paths` independent stationary paths of `num_steps` steps; same seed, same market."""
    num_paths = validate.integer("num_paths", num_paths, lo=1)
    num_steps = validate.integer("num_steps", num_steps, lo=1)
    validate.integer("seed", seed, lo=0)  # NumPy's own refusal of a negative one names no argument
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
    """[B, T, K] signals -> [B, T, A] aim_t = (gamma Sigma)^{-1} B (I + a Phi / gamma)^{-1} f_t."""
    signals = _check_signals(cfg, signals)
    a = cfg.lam * trade_rate(cfg)
    discount = np.linalg.inv(np.eye(cfg.num_signals) + cfg.Phi * a / cfg.gamma)
    aim_matrix = np.linalg.solve(cfg.gamma * cfg.Sigma, cfg.B @ discount)
    return signals @ aim_matrix.T


def partial_trading(aim, rate: float) -> np.ndarray:
    """[B, T, A] aims -> [B, T, A] positions x_t = x_{t-1} + rate (aim_t - x_{t-1}), x_{-1} = 0."""
    aim = np.asarray(aim)
    if aim.ndim != 3:
        raise ValueError(f"aim: expected shape [B, T, A], got {aim.shape}")
    positions = np.empty_like(aim)
    x = np.zeros_like(aim[:, 0])
    for t in range(aim.shape[1]):
        x = x + rate * (aim[:, t] - x)
        positions[:, t] = x
    return positions


def optimal_policy(cfg: MarketConfig, signals) -> np.ndarray:
    """[B, T, K] signals -> [B, T, A] GP positions: trade a/lam of the way to the aim each step."""
    return partial_trading(aim_portfolio(cfg, signals), trade_rate(cfg))


def markowitz_policy(cfg: MarketConfig, signals) -> np.ndarray:
    """[B, T, K] signals -> [B, T, A] myopic positions x_t = (gamma Sigma)^{-1} B f_t (ignores costs)."""
    signals = _check_signals(cfg, signals)
    return signals @ np.linalg.solve(cfg.gamma * cfg.Sigma, cfg.B).T


def no_trade_policy(cfg: MarketConfig, signals) -> np.ndarray:
    """[B, T, K] signals -> [B, T, A] zeros."""
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
        raise ValueError(f"{name_b}: expected shape {tuple(a.shape)} (that of {name_a}), got {tuple(b.shape)}")


def net_utility(positions, returns, objective: Objective | MarketConfig, *, per_step: bool = True):
    """[B] utility of each path (divided by T if `per_step`); numpy, jax or torch in, same kind out.

    positions [B, T, A] holds x_t, returns [B, T, A] holds r_{t+1} (as `Market.returns`):
        U = sum_t [ x_t . r_{t+1} - gamma/2 x_t' Sigma x_t - lam/2 dx_t' Sigma dx_t ],  x_{-1} = 0.
    `objective`: an `Objective`, or a `MarketConfig` (the objective it is traded for).
    """
    objective = _objective(objective)
    _check_pair("positions", positions, "returns", returns, last=objective.num_assets)
    # Sigma in the positions' own kind and dtype: float32 stays float32, and torch tensors work too
    # (the parity tests train torch_ref on this same function).
    cov = objective.Sigma
    sigma = positions.new_tensor(cov) if hasattr(positions, "new_tensor") else cov.astype(positions.dtype)
    gain = (positions * returns).sum(axis=(1, 2))
    risk = ((positions @ sigma) * positions).sum(axis=(1, 2))
    trades = positions[:, 1:] - positions[:, :-1]  # dx_1 .. dx_{T-1}; dx_0 = x_0
    first = positions[:, 0]
    cost = ((trades @ sigma) * trades).sum(axis=(1, 2)) + ((first @ sigma) * first).sum(axis=1)
    utility = gain - 0.5 * objective.gamma * risk - 0.5 * objective.lam * cost
    return utility / positions.shape[1] if per_step else utility


def _objective(objective: Objective | MarketConfig) -> Objective:
    if isinstance(objective, MarketConfig):
        return objective.objective
    return validate.instance("objective", objective, Objective)


def supervised_mse(positions, targets):
    """Scalar mean squared error between [B, T, N] positions and targets; numpy or jax."""
    _check_pair("positions", positions, "targets", targets)
    return ((positions - targets) ** 2).mean()


def utility_table(cfg: MarketConfig, market: Market, learned_positions=None) -> dict[str, float]:
    """Mean per-step utility of each policy on `market`, plus "learned_over_optimal" if learned is given."""
    policies = {"optimal": optimal_policy, "markowitz": markowitz_policy, "no_trade": no_trade_policy}
    table = {name: float(net_utility(policy(cfg, market.signals), market.returns, cfg).mean())
             for name, policy in policies.items()}
    if learned_positions is not None:
        learned = np.asarray(learned_positions, dtype=np.float64)
        if learned.shape != market.returns.shape:
            raise ValueError(f"learned_positions: expected shape {market.returns.shape} (that of market.returns), "
                             f"got {learned.shape}")
        table["learned"] = float(net_utility(learned, market.returns, cfg).mean())
        table["learned_over_optimal"] = table["learned"] / table["optimal"]
    return table


# ---------------------------------------------------------------- real data: scores and baselines


def performance_terms(positions, returns, objective: Objective | MarketConfig, previous=None) -> dict[str, np.ndarray]:
    """[B, T] per step, numpy: what a policy earned, paid and risked at each step.

        return    x_t . r_{t+1}                          (gross)
        cost      lam/2 dx_t' Sigma dx_t                 (in return units)
        net       return - cost
        utility   net - gamma/2 x_t' Sigma x_t           (the objective; `net_utility` is its mean over t)
        turnover  sum_a |dx_t,a|

    `previous` [B, A] is x_{-1}, the position held before the first step (default 0): to score a period
    in the middle of a run, pass the position at the end of the period before it, so its first trade
    costs what it cost in the run.
    """
    objective = _objective(objective)
    x, r = np.asarray(positions, np.float64), np.asarray(returns, np.float64)
    _check_pair("positions", x, "returns", r, last=objective.num_assets)
    before = np.zeros_like(x[:, 0]) if previous is None else np.asarray(previous, np.float64)
    if before.shape != x[:, 0].shape:
        raise ValueError(f"previous: expected shape {x[:, 0].shape} ([B, A]), got {before.shape}")
    trades = np.diff(x, axis=1, prepend=before[:, None])
    quad = lambda v: np.einsum("bti,ij,btj->bt", v, objective.Sigma, v)  # noqa: E731
    gross = (x * r).sum(-1)
    cost = 0.5 * objective.lam * quad(trades)
    return {"return": gross, "cost": cost, "net": gross - cost, "utility": gross - cost - 0.5 * objective.gamma * quad(x),
            "turnover": np.abs(trades).sum(-1)}


def summarise(terms: dict[str, np.ndarray], periods_per_year: float = 252) -> dict[str, float | None]:
    """Means of `performance_terms` over every step, and the Sharpe ratio: mean over std of the net return per
    step, times sqrt(periods_per_year); None when the net return is constant (no trading at all). With several paths
    [B, T] both are over all B T steps pooled (a typical path's Sharpe ratio, not that of a portfolio of the paths);
    the std is the population one (ddof 0) and there is no risk-free rate: excess returns in, excess Sharpe out."""
    # 0 gave a Sharpe ratio of 0 and a negative one NaN, silently
    periods_per_year = validate.real("periods_per_year", periods_per_year, lo=0, lo_open=True)
    net = terms["net"]
    std = float(net.std())
    sharpe = float(net.mean() / std * np.sqrt(periods_per_year)) if std > 1e-12 * (1 + abs(net.mean())) else None
    return {key: float(terms[key].mean()) for key in ("utility", "return", "cost", "turnover")} | {"sharpe": sharpe}


def performance(positions, returns, objective: Objective | MarketConfig, *, previous=None,
                periods_per_year: float = 252) -> dict[str, float | None]:
    """How a policy did over [B, T] steps: `summarise(performance_terms(...))`."""
    return summarise(performance_terms(positions, returns, objective, previous), periods_per_year)


def buy_and_hold_policy(returns) -> np.ndarray:
    """[B, T, A] returns -> [B, T, A] positions 1/A in every asset at every step (fully invested, no trades)."""
    r = np.asarray(returns)
    return np.full(r.shape, 1.0 / r.shape[-1])


def rolling_markowitz_policy(returns, objective: Objective | MarketConfig, window: int = 252,
                             min_history: int = 20) -> np.ndarray:
    """[B, T, A] returns -> [B, T, A] positions `clip((gamma Sigma)^{-1} mu_t, -1, 1)`, ignoring costs.

    mu_t is the mean of the last `window` returns known at step t, `returns[:, t - window:t]` (returns[t]
    is earned after t: using it would look ahead); 0 until `min_history` of them are known. Sigma is the
    objective's. Clipped to the Traveller's range, [-1, 1] per asset.
    """
    objective = _objective(objective)
    window = validate.integer("window", window, lo=1)
    min_history = validate.integer("min_history", min_history, lo=1)
    r = np.asarray(returns, np.float64)
    sums = np.concatenate([np.zeros_like(r[:, :1]), np.cumsum(r, axis=1)], axis=1)  # sums[:, t] = r[:, :t].sum
    t = np.arange(r.shape[1])
    start = np.maximum(t - window, 0)
    count = (t - start)[None, :, None]
    mean = (sums[:, t] - sums[:, start]) / np.maximum(count, 1)
    positions = mean @ np.linalg.solve(objective.gamma * objective.Sigma, np.eye(objective.num_assets))
    return np.where(count >= min_history, np.clip(positions, -1.0, 1.0), 0.0)
