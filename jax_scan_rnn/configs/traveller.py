"""`TravellerTask`: the model size, market and objective of a Traveller run, every field a `train traveller` flag
(the recipe that trains it: `jax_scan_rnn.tasks.traveller`, which re-exports these names).

JAX-free, as every module of `configs`: the command line is built from these fields before JAX is imported.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from jax_scan_rnn import validate
from jax_scan_rnn.data import market_data, trading
from jax_scan_rnn.options import check, option

TRAIN_DEFAULTS = {"steps": 1000, "learning_rate": 3e-3}  # `train traveller`'s, over TrainConfig's (`command_config`)
OBJECTIVES = ("utility", "mse")
_DATA_ONLY = ("feature_cols", "return_cols", "path_col", "covariance")
# Options that one market does not read, with defaults (unlike _DATA_ONLY's, so a value given cannot be told from
# the default here): the CLI refuses them when typed for the other market (cli.refuse_unread).
DATA_SETTINGS = ("fill", "valid_fraction", "test_fraction", "periods_per_year")  # read with --data only
SIMULATED_ONLY = ("train_paths", "eval_paths", "eval_steps", "eval_seed")  # read on the simulated market only


@dataclass(frozen=True)
class TravellerTask:
    """Model size, market and objective of a Traveller training run (every field is a flag)."""

    hidden_size: int = option(32, "H of every LSTM layer", lo=1)
    num_layers: int = option(2, "stacked LSTM layers", lo=1)
    dropout: float = option(0.0, "inter-layer dropout (training only)", lo=0, hi=1, hi_open=True)
    batch_size: int = option(64, "paths (windows, with --data) per optimiser step", lo=1)
    seq_len: int = option(128, "steps per training path (window, with --data)", lo=1)
    objective: str = option("utility", "utility: maximise net utility; mse: fit the optimal policy's positions "
                            "(simulated market only)", choices=OBJECTIVES)
    risk_aversion: float = option(3.0, "gamma of the utility x.r - gamma/2 x'Sigma x - lam/2 dx'Sigma dx", lo=0,
                                  lo_open=True)
    cost_scale: float = option(20.0, "lam of that utility: trading dx costs lam/2 dx'Sigma dx", lo=0)
    num_assets: int | None = option(None, "assets of the simulated market; with --data the file's return columns, "
                                    "checked if given", lo=1, none="2, the seed's; with --data the file's")
    data: str | None = option(None, "your own market: a .npz, .csv or .parquet file (format in "
                              "jax_scan_rnn/data/market_data.py)", none="the simulated market", metavar="FILE")
    feature_cols: str | None = option(None, "with a .csv/.parquet --data: feature columns, comma-separated names or "
                                      "patterns such as 'vol_*' (a pattern skips the date and index columns)",
                                      none="none; required for a table")
    return_cols: str | None = option(None, "with a .csv/.parquet --data: return columns, one per asset: the return "
                                     "earned by the position chosen at that row", none="none; required for a table")
    path_col: str | None = option(None, "with a .csv/.parquet --data: the column naming each row's path (several "
                                  "paths of equal length)", none="the whole file is one path")
    fill: str = option("error", "missing values in --data: error, or ffill, zero, drop (rows)",
                       choices=market_data.FILLS)
    valid_fraction: float = option(0.15, "with --data: the share of each path's steps, after the training period, "
                                   "for validation", lo=0, hi=1, hi_open=True)
    test_fraction: float = option(0.15, "with --data: the last share of each path's steps, held out for the test",
                                  lo=0, hi=1, lo_open=True, hi_open=True)
    covariance: str | None = option(None, "with --data: the return covariance Sigma [A, A] as .npy/.csv",
                                    none="estimated from the training period", metavar="FILE")
    periods_per_year: float = option(252.0, "with --data: bars per year, to annualise the Sharpe ratio (252: daily)",
                                     lo=0, lo_open=True)
    train_paths: int = option(8192, "simulated training paths, resampled every step", lo=1)
    eval_paths: int = option(256, "simulated held-out paths for evaluation", lo=1)
    eval_steps: int = option(500, "steps per simulated held-out path (longer than training: the policy must stay "
                             "stable)", lo=1)
    data_seed: int = option(1, "seed of the simulated training market, and (added to --seed) of the batch order, "
                                  "on it or on --data", lo=0, hi=validate.SEED_MAX)
    eval_seed: int = option(999, "seed of the simulated held-out market (never seen in training)", lo=0,
                            hi=validate.SEED_MAX)

    def __post_init__(self):
        check(self)
        if self.dropout and self.num_layers == 1:
            raise ValueError(f"dropout: expected 0 with num_layers=1 (dropout acts between stacked layers), got "
                             f"{self.dropout}")
        if self.data is None:
            given = [name for name in _DATA_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given[0]}: expected only together with data=FILE (your own market), got "
                                 f"{getattr(self, given[0])!r} without it")
            if self.batch_size > self.train_paths:
                raise ValueError(f"batch_size: expected at most train_paths={self.train_paths}, got {self.batch_size}")
        elif self.objective == "mse":
            raise ValueError("objective: expected 'utility' with data=FILE ('mse' fits the optimal policy, which "
                             "only the simulated market knows), got 'mse'")

    @property
    def market(self) -> trading.MarketConfig:
        """The simulated market (its other parameters are `MarketConfig`'s documented defaults)."""
        return trading.MarketConfig(num_assets=self.num_assets or 2, gamma=self.risk_aversion, lam=self.cost_scale)

    def market_bytes(self, paths: int, steps: int) -> int:
        """Bytes a simulated market of `paths` x `steps` takes while it is built (float64 signals, shocks and
        returns, then the float32 features, returns and targets kept): a bound to check before simulating
        (0 for a run on your data, which simulates none)."""
        if self.data is not None:
            return 0
        per_step = self.market.num_signals * 3 + 2 * self.market.num_assets + (self.market.num_signals + 4) // 2
        return paths * steps * per_step * 8

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TravellerTask:
        data = dict(data)
        market = data.pop("market", None)  # runs saved before the objective was a set of flags
        if market is not None:
            # Its other parameters (set in Python then) have no field now: a run with other values is refused
            # rather than evaluated or resumed on the default market
            default = asdict(trading.MarketConfig())
            other = {k: v for k, v in market.items() if k not in ("num_assets", "gamma", "lam") and v != default.get(k)}
            if other:
                raise ValueError(f"market: the run's market has {other}, which this version cannot simulate (only "
                                 "num_assets, gamma and lam are options now); load it with the version that trained it")
            data.update(num_assets=market["num_assets"], risk_aversion=market["gamma"], cost_scale=market["lam"])
        validate.saved_names("task", data, (f.name for f in fields(cls)))
        return cls(**data)
