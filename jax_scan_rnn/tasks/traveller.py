"""Train and evaluate the Traveller: on the simulated Garleanu-Pedersen market (`data/trading.py`, the
default), or on your own market data (`data/market_data.py`: .npz, .csv or .parquet).

    task = TravellerTask()                                   # defaults: a few minutes on a 2-core CPU
    cfg = command_config(TRAIN_DEFAULTS)                     # `train traveller`'s TrainConfig (jax_scan_rnn.train)
    model, history, _ = train(task, cfg, out_dir="runs/traveller")
    evaluate(model, task)    # {"optimal": .., "markowitz": .., "no_trade": .., "learned": .., "learned_over_optimal": ..}

    task = TravellerTask(data="prices.csv", feature_cols="ret_*,vol_*", return_cols="next_ret_*")
    model, history, stats = train(task, cfg, out_dir="runs/mine")
    data_table(model, read_data(task), stats)   # the test period: against buy-and-hold, Markowitz, no trade

Objective "utility" maximises the net utility directly (no labels: the model discovers partial trading
toward the aim portfolio because the cost term punishes turnover); objective "mse" regresses onto given
target paths (here the optimal policy's, so only on the simulated market).

On your own data the file is split by time into training, validation and test periods (never
shuffled across time). Features are standardised with the training period's mean and std, and the
return covariance Sigma of the objective is estimated from the training period unless given; both are
saved with the checkpoint (`DataStats`), so evaluation and `run` read new data exactly as training did.
Training draws random windows of `seq_len` steps from the training period, each from the zero state;
evaluation runs every path once from its first step, so the state carries through the whole history,
and scores only the period asked for.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from types import EllipsisType

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn import validate
from jax_scan_rnn.compiled import jit
# The task's options, JAX-free (the CLI builds `train traveller`'s flags from them before importing JAX); their names
# stay readable from here too, where the recipe's users find them (`X as X`: a re-export to strict checkers).
from jax_scan_rnn.configs.traveller import (
    DATA_SETTINGS as DATA_SETTINGS, OBJECTIVES as OBJECTIVES, SIMULATED_ONLY as SIMULATED_ONLY,
    TRAIN_DEFAULTS as TRAIN_DEFAULTS, TravellerTask as TravellerTask)
from jax_scan_rnn.optional import require
from jax_scan_rnn.runlog import save_figure, strict_json, write_atomically
from jax_scan_rnn.data import market_data, trading
from jax_scan_rnn.train import TrainConfig, fit, restore_model

from jax_scan_rnn.traveller import Traveller, TravellerState

# A rolling Markowitz baseline's look-back on real data: one year of daily bars.
MARKOWITZ_WINDOW = 252
# periods_per_year against the bars a year the data's dates hold (MarketData.bars_per_year): a ratio above it draws a
# warning. Trading days (~252) against calendar days (365) is 1.45; a month of holidays or gaps in a year, ~1.1.
RATE_MISMATCH = 1.4


@dataclass(frozen=True)
class DataStats:
    """What training learned from your data's training period, saved with the checkpoint: the features'
    standardisation, the objective (with its Sigma), the names, and the split of the training file."""

    standardiser: market_data.Standardiser
    objective: trading.Objective
    asset_names: tuple[str, ...]
    train_end: int  # the training period is steps [0, train_end), validation [train_end, valid_end)
    valid_end: int  # and the test [valid_end, num_steps)
    num_steps: int  # steps per path of the training file
    data_sha256: str | None = None  # `data_digest` of the data trained on (None: a run that predates it)

    def to_json(self) -> dict:
        return {"standardiser": self.standardiser.to_json(), "objective": self.objective.to_json(),
                "asset_names": list(self.asset_names), "train_end": self.train_end, "valid_end": self.valid_end,
                "num_steps": self.num_steps, **({"data_sha256": self.data_sha256} if self.data_sha256 else {})}

    @classmethod
    def from_json(cls, data: dict) -> DataStats:
        validate.saved_names("data_stats", data, (f.name for f in fields(cls)))
        return cls(market_data.Standardiser.from_json(data["standardiser"]),
                   trading.Objective.from_json(data["objective"]), tuple(data["asset_names"]),
                   data["train_end"], data["valid_end"], data["num_steps"], data.get("data_sha256"))


def data_digest(data: market_data.MarketData) -> str:
    """sha256 of the data as the model reads it: names, shapes, and each path's values in float32 (a file re-saved
    with more digits reads the same), the paths in their labels' order (a file listing its paths in another order
    holds the same data). Saved with a run (`DataStats`), so that a file revised since (a value changed that the
    training period's statistics do not show, a validation row) or data given to `train` that is not the file's is
    named by `--resume` and `evaluate` instead of scored silently."""
    digest = hashlib.sha256(json.dumps([data.feature_names, data.asset_names, data.features.shape,
                                        data.returns.shape]).encode())
    for i in sorted(range(data.num_paths), key=lambda i: str(data.path_labels[i])):
        digest.update(str(data.path_labels[i]).encode())
        for values in (data.features[i], data.returns[i]):
            digest.update(np.ascontiguousarray(values, np.float32).tobytes())
    return digest.hexdigest()


def data_digest_matches(data: market_data.MarketData, saved: str | None) -> bool:
    """Whether `saved` (a run's `DataStats.data_sha256`) is the digest of `data`: `data_digest`'s, or the one runs
    saved from 2026-12-05 23:27 to 2026-12-06 01:02 UTC (the values in float64, the paths in the file's order), so
    that such a run's unchanged file is not taken for a revised one."""
    if saved == data_digest(data):
        return True
    digest = hashlib.sha256(json.dumps([data.feature_names, data.asset_names, data.features.shape,
                                        data.returns.shape]).encode())
    for values in (data.features, data.returns):
        digest.update(np.ascontiguousarray(values, np.float64).tobytes())
    return saved == digest.hexdigest()


def _columns(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def read_data(task: TravellerTask, path: str | None = None, *, returns: bool = True) -> market_data.MarketData:
    """The task's data file (or `path`, read with the task's columns); `returns=False` for features only
    (new data to trade on, whose future returns are not known yet)."""
    try:
        data = market_data.read(path or task.data, feature_cols=_columns(task.feature_cols),
                                return_cols=_columns(task.return_cols) if returns else None,
                                path_col=task.path_col, fill=task.fill, returns=returns)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"data: {err}") from None
    if returns and task.num_assets is not None and data.num_assets != task.num_assets:
        raise ValueError(f"num_assets: expected the data's {data.num_assets} return columns "
                         f"({', '.join(data.asset_names)}), got {task.num_assets}")
    rate = data.bars_per_year
    if returns and rate and max(rate / task.periods_per_year, task.periods_per_year / rate) > RATE_MISMATCH:
        warnings.warn(f"periods_per_year: {task.periods_per_year:g} annualises the Sharpe ratio, but the dates of "
                      f"{Path(path or task.data).name} hold about {rate:,.0f} rows a year: give the data's bars a year "
                      f"(252 daily, 365 for a market open every day, 52 weekly, 12 monthly, ~1,640 hourly on an "
                      f"exchange) or every Sharpe ratio is off by the square root of their ratio", UserWarning,
                      stacklevel=validate.user_stacklevel())
    return data


def fit_stats(task: TravellerTask, data: market_data.MarketData) -> DataStats:
    """Standardisation and Sigma from the training period alone (nothing later leaks into training)."""
    train_end, valid_end = market_data.time_split(data.num_steps, task.valid_fraction, task.test_fraction)
    market_data.check_split(data, train_end, valid_end)
    if task.seq_len > train_end:
        raise ValueError(f"seq_len: expected at most the training period's {train_end} steps, got {task.seq_len}")
    train = data.time_slice(0, train_end)
    if task.covariance is None:
        sigma = market_data.estimate_covariance(train.returns)
    else:
        try:
            sigma = market_data.read_covariance(task.covariance, data.num_assets)
        except (FileNotFoundError, ValueError) as err:  # named as the option, as the other read errors are
            raise type(err)(f"covariance: {err}") from None
    return DataStats(market_data.Standardiser.fit(train.features, data.feature_names),
                     trading.Objective(task.risk_aversion, task.cost_scale, sigma), data.asset_names,
                     train_end, valid_end, data.num_steps, data_digest(data))


def build_model(task: TravellerTask, seed: int = 0, stats: DataStats | None = None) -> Traveller:
    if stats is None:
        inputs, assets = task.market.num_signals, task.market.num_assets
    else:
        inputs, assets = len(stats.standardiser.mean), stats.objective.num_assets
    return Traveller(inputs, task.hidden_size, task.num_layers, task.dropout, num_assets=assets,
                     rngs=nnx.Rngs(seed))


def make_batch_fn(task: TravellerTask, seed: int = 0, data: market_data.MarketData | None = None,
                  stats: DataStats | None = None):
    """`step -> batch`: a pure function of the step (what makes resumed runs exact). The batch order is seeded
    by `task.data_seed + seed` (the run's seed). Simulated market: `task.data_seed`'s pool of paths. Your data:
    random windows of `seq_len` steps of the training period, features standardised."""
    if task.data is not None:
        features = stats.standardiser(data.features[:, : stats.train_end])
        returns = data.returns[:, : stats.train_end].astype(np.float32)
        windows = stats.train_end - task.seq_len + 1  # start steps per path

        def window_fn(step: int) -> dict:
            rng = np.random.default_rng((task.data_seed + seed, step))
            path = rng.integers(data.num_paths, size=task.batch_size)[:, None]
            steps = rng.integers(windows, size=task.batch_size)[:, None] + np.arange(task.seq_len)
            return {"features": features[path, steps], "returns": returns[path, steps]}

        return window_fn
    pool = trading.simulate(task.market, task.train_paths, task.seq_len, seed=task.data_seed)
    features = pool.features.astype(np.float32)
    returns = pool.returns.astype(np.float32)
    targets = trading.optimal_policy(task.market, pool.signals).astype(np.float32)

    def batch_fn(step: int) -> dict:
        rng = np.random.default_rng((task.data_seed + seed, step))
        idx = rng.choice(task.train_paths, task.batch_size, replace=False)
        batch = {"features": features[idx], "returns": returns[idx]}
        if task.objective == "mse":
            batch["targets"] = targets[idx]
        return batch

    return batch_fn


def make_loss_fn(task: TravellerTask, objective: trading.Objective | None = None):
    """`(model, batch) -> (loss, metrics)`: minus the mean per-step net utility, or the MSE to targets.
    `objective`: your data's (`DataStats.objective`); default the simulated market's."""
    objective = task.market.objective if objective is None else objective

    def loss_fn(model: Traveller, batch: dict):
        positions, _ = model(batch["features"])
        utility = trading.net_utility(positions, batch["returns"], objective).mean()
        if task.objective == "utility":
            return -utility, {"utility": utility}
        return trading.supervised_mse(positions, batch["targets"]), {"utility": utility}

    return loss_fn


def held_out_market(task: TravellerTask) -> trading.Market:
    return trading.simulate(task.market, task.eval_paths, task.eval_steps, seed=task.eval_seed)


def positions(model: Traveller, features, state: TravellerState | None = None) -> tuple[np.ndarray, TravellerState]:
    """`(positions [N, T, A], state after the last step)` for model-ready `features [N, T, F]`, from `state`
    (None: the zero state), through the one compiled call (`jsr.jit`, which keeps its compiled functions per
    model, so the evaluations during training compile once)."""
    model.eval()
    out, state = jit(model)(jnp.asarray(features, jnp.float32), state)
    return np.asarray(out), state


def _period(stats: DataStats, num_steps: int, period: str) -> tuple[int, int]:
    bounds = {"train": (0, stats.train_end), "valid": (stats.train_end, stats.valid_end),
              "test": (stats.valid_end, num_steps), "all": (0, num_steps)}
    if period not in bounds:
        raise ValueError(f"period: expected one of {', '.join(bounds)}, got {period!r}")
    start, stop = bounds[period]
    if stop <= start:
        raise ValueError(f"period: the {period} period is empty (steps {start} to {stop})")
    return start, stop


def score_period(x: np.ndarray, data: market_data.MarketData, stats: DataStats, start: int, stop: int,
                 periods_per_year: float = 252) -> dict[str, float | None]:
    """`trading.performance` of positions `x [N, T, A]` (a whole run over `data`) on steps [start, stop),
    from the position held just before them."""
    return trading.performance(x[:, start:stop], data.returns[:, start:stop], stats.objective,
                               previous=x[:, start - 1] if start else None, periods_per_year=periods_per_year)


def data_table(model: Traveller, data: market_data.MarketData, stats: DataStats, period: str = "test",
               periods_per_year: float = 252) -> dict:
    """Every policy on one period of your data: the Traveller (run over each whole path from its first step,
    its state carried through) against buy-and-hold, a rolling Markowitz and no trading, each scored by
    `score_period`: `{"period", "steps": [start, stop), "paths", "periods_per_year" (what each "sharpe" is
    annualised with), "policies": {name: its scores}}`."""
    start, stop = _period(stats, data.num_steps, period)
    learned, _ = positions(model, stats.standardiser(data.features))
    runs = {"learned": learned, "buy_and_hold": trading.buy_and_hold_policy(data.returns),
            "rolling_markowitz": trading.rolling_markowitz_policy(data.returns, stats.objective, MARKOWITZ_WINDOW),
            "no_trade": np.zeros_like(data.returns)}
    scores = {name: score_period(x, data, stats, start, stop, periods_per_year) for name, x in runs.items()}
    # periods_per_year in the report itself: two runs' Sharpe ratios compare only at one annualisation (daily, hourly)
    return {"period": period, "steps": [start, stop], "paths": data.num_paths, "periods_per_year": periods_per_year,
            "policies": scores}


def evaluate(model: Traveller, task: TravellerTask, market: trading.Market | None = None) -> dict[str, float]:
    """Simulated market: out-of-sample mean per-step net utility of the model and of the optimal, Markowitz
    and no-trade policies (`data_table` is the table for your own data)."""
    market = held_out_market(task) if market is None else market
    learned, _ = positions(model, market.features)
    return trading.utility_table(task.market, market, learned)


def train(task: TravellerTask, cfg: TrainConfig, out_dir: str | Path | None = None, *, resume: bool = False,
          callback=None, init_from: str | Path | None = None, data: market_data.MarketData | None = None,
          **fit_kwargs):
    """Train a fresh Traveller (or resume `out_dir`); returns `(model, history, stats)`, `stats` the
    `DataStats` of your data (None on the simulated market).

    `cfg.seed` is the run's one seed: the initialisation, the dropout stream and the batch order.
    `init_from`: a PyTorch state_dict file (`.pt`, `.pth`, `.safetensors`) of `torch_ref.Traveller` or the
    seed's own class to start from instead of a random initialisation (a resumed run starts from its
    checkpoint). `data`: `read_data(task)` when already read (else it is read here)."""
    seed = cfg.seed
    metadata = {"model": "traveller", "task": task.to_json(), "seed": seed}
    if task.data is None:
        data = stats = None
        model = build_model(task, seed)
        market = held_out_market(task)

        def eval_fn(m: Traveller) -> dict[str, float]:
            table = evaluate(m, task, market)
            return {"utility": table["learned"], "over_optimal": table["learned_over_optimal"]}
    else:
        data = read_data(task) if data is None else data
        stats = fit_stats(task, data)
        metadata["data_stats"] = stats.to_json()
        model = build_model(task, seed, stats)
        start, stop = _period(stats, data.num_steps, "valid" if stats.valid_end > stats.train_end else "train")
        features = stats.standardiser(data.features)  # once: only the Traveller changes between evaluations

        def eval_fn(m: Traveller) -> dict[str, float]:
            learned = score_period(positions(m, features)[0], data, stats, start, stop, task.periods_per_year)
            # an undefined Sharpe ratio (a constant net return) is NaN, null in metrics.jsonl: 0.0 reads as measured
            return {"utility": learned["utility"], "sharpe": np.nan if learned["sharpe"] is None else learned["sharpe"]}
    if init_from is not None:
        metadata["init_from"] = load_init(model, init_from, stats)
    history = fit(model, make_loss_fn(task, None if stats is None else stats.objective),
                  make_batch_fn(task, seed, data, stats), cfg, out_dir=out_dir,
                  eval_fn=eval_fn, resume=resume, callback=callback, metadata=metadata, **fit_kwargs)
    return model, history, stats


def export_side(model: Traveller, task: TravellerTask, stats: DataStats | None) -> dict:
    """What `export traveller` writes beside the weights (FILE.json) and `load_init` reads back:
    `torch_ref.Traveller`'s arguments and, for a run on your data, its `DataStats` (the standardisation the
    weights expect, the order of their features and assets)."""
    lstm = model.lstm_layers
    side = {"model": "torch_ref.Traveller",
            "arguments": {"num_inputs": model.num_inputs, "hidden_size": lstm.hidden_size,
                          "num_layers": lstm.num_layers, "dropout": task.dropout, "num_assets": model.num_assets}}
    return side | ({"data_stats": stats.to_json()} if stats is not None else {})


def _side_of(path: Path) -> tuple[dict, DataStats | None] | None:
    """(`torch_ref.Traveller`'s arguments, the `DataStats` or None for a model of the simulated market) from `path`'s
    side file; None without one (a state_dict of the seed's class, written by hand). An older export's side file is
    the DataStats itself, without arguments."""
    from jax_scan_rnn.convert import side_file

    side = side_file(path)
    if not side.is_file():
        return None
    try:
        data = json.loads(side.read_text(encoding="utf-8-sig"))
        if data.get("model", "torch_ref.Traveller") != "torch_ref.Traveller":
            raise ValueError(f"it describes a {data['model']}")
        saved = data.get("data_stats", data if "standardiser" in data else None)
        return dict(data.get("arguments", {})), None if saved is None else DataStats.from_json(saved)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"init_from: {side} is not the side file `export traveller` writes "
                         f"({type(err).__name__}: {err})") from None


def load_init(model: Traveller, path: str | Path, stats: DataStats | None | EllipsisType = ...) -> dict:
    """Load a PyTorch state_dict file into `model`; returns {path, sha256} for the run's metadata.

    Given the run's `stats` (your data's `DataStats`, None for the simulated market) and a file with `export
    traveller`'s side file (FILE.json), the file's model is compared with the run's first: other sizes are a
    ValueError naming each (`hidden_size=32`); the weights are matched to inputs by position, so the same feature or
    asset names in another order are a ValueError (each weight would read another column), and other names, or a
    model of the other market, a warning (a fine-tune on new data may rename its columns). Without `stats`, nothing
    is compared."""
    from jax_scan_rnn.convert import load_state_dict_file, read_state_dict_file, side_file

    path = Path(path)
    state_dict = read_state_dict_file(path, "init_from")
    side = None if stats is ... else _side_of(path)
    if side is not None:
        arguments, trained = side
        lstm = model.lstm_layers
        ours = {"hidden_size": lstm.hidden_size, "num_layers": lstm.num_layers}
        differ = [k for k in ours if k in arguments and arguments[k] != ours[k]]
        if differ:
            raise ValueError(f"init_from: {path} holds a model with " + ", ".join(f"{k}={arguments[k]}" for k in differ)
                             + f" ({side_file(path)}); this run's has " + ", ".join(f"{k}={ours[k]}" for k in differ)
                             + ": set them to the file's")
        if (trained is None) != (stats is None):
            where = {True: "the simulated market", False: "your data"}
            warnings.warn(f"init_from: {path}'s model was trained on {where[trained is None]} ({side_file(path)}), "
                          f"this run trains on {where[stats is None]}: its inputs are matched by position",
                          stacklevel=2)
        elif trained is not None:
            for kind, theirs, mine in (("features", trained.standardiser.names, stats.standardiser.names),
                                       ("assets", trained.asset_names, stats.asset_names)):
                if theirs == mine:
                    continue
                if sorted(theirs) == sorted(mine):  # columns are read in the data file's order
                    raise ValueError(f"init_from: {path}'s model reads its {kind} in the order {list(theirs)} "
                                     f"({side_file(path)}), this run's data file holds them in the order "
                                     f"{list(mine)}: write its columns in the model's order")
                warnings.warn(f"init_from: {path}'s model was trained on the {kind} {list(theirs)} "
                              f"({side_file(path)}), this run's are {list(mine)}: they are matched by position",
                              stacklevel=2)
    return load_state_dict_file(model, state_dict, path, "init_from",
                                "hidden_size, num_layers and the data's features and assets (an LSTM's input is "
                                "the positions, then the features)")


def load(out_dir: str | Path, step: int | None = None) -> tuple[Traveller, TravellerTask, DataStats | None]:
    """Rebuild the model of a training run from its checkpoint's metadata and load its weights; also the
    task and, for a run on your data, its `DataStats`."""
    from jax_scan_rnn import checkpoint

    meta = checkpoint.read_metadata(Path(out_dir) / "checkpoints", step)
    if meta.get("model") != "traveller":
        raise ValueError(f"out_dir: expected a Traveller run, got model {meta.get('model')!r} in {out_dir}")
    task = TravellerTask.from_json(meta["task"])
    stats = DataStats.from_json(meta["data_stats"]) if "data_stats" in meta else None
    model = build_model(task, meta.get("seed", 0), stats)
    restore_model(out_dir, model, step)
    return model, task, stats


def plot_positions(model: Traveller, task: TravellerTask, path: str | Path, *, steps: int = 200) -> Path:
    """PNG of one held-out path: the learned positions against the optimal and Markowitz policies."""
    require("matplotlib", "the positions plot").use("Agg")
    import matplotlib.pyplot as plt

    market = trading.simulate(task.market, 1, steps, seed=task.eval_seed)
    learned = positions(model, market.features)[0][0]
    optimal = trading.optimal_policy(task.market, market.signals)[0]
    markowitz = trading.markowitz_policy(task.market, market.signals)[0]
    shown = min(task.market.num_assets, 4)
    fig, axes = plt.subplots(shown, 1, figsize=(10, 1.2 + 2.4 * shown), sharex=True, squeeze=False)
    for asset, ax in enumerate(axes[:, 0]):
        ax.plot(markowitz[:, asset], color="0.75", lw=0.8, label="Markowitz (ignores costs)")
        ax.plot(optimal[:, asset], color="k", lw=1.5, label="optimal (Garleanu-Pedersen)")
        ax.plot(learned[:, asset], color="tab:red", lw=1.2, ls="--", label="Traveller (learned)")
        ax.set(ylabel=f"position, asset {asset}", ylim=(-1.05, 1.05))
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("step")
    title = "Held-out path: learned positions vs the optimal policy"
    fig.suptitle(title + (f" (first {shown} of {task.market.num_assets} assets)" if shown < task.market.num_assets else ""))
    return _save(fig, path)


def plot_data(model: Traveller, data: market_data.MarketData, stats: DataStats, path: str | Path,
              period: str = "test") -> Path:
    """PNG of one period of your data (first path): each policy's cumulative net return (gross return minus
    trading costs) and the Traveller's positions against the rolling Markowitz's."""
    require("matplotlib", "the positions plot").use("Agg")
    import matplotlib.pyplot as plt

    start, stop = _period(stats, data.num_steps, period)
    r = data.returns[:1]
    runs = {"Traveller (learned)": positions(model, stats.standardiser(data.features[:1]))[0],
            "buy and hold": trading.buy_and_hold_policy(r),
            f"rolling Markowitz ({MARKOWITZ_WINDOW})": trading.rolling_markowitz_policy(r, stats.objective, MARKOWITZ_WINDOW),
            "no trading": np.zeros_like(r)}
    shown = min(len(stats.asset_names), 3)
    fig, axes = plt.subplots(1 + shown, 1, figsize=(10, 3.2 + 2.2 * shown), sharex=True, squeeze=False)
    axes = axes[:, 0]
    steps = np.arange(start, stop)
    for (name, x), color in zip(runs.items(), ("tab:red", "tab:blue", "0.6", "k")):
        net = trading.performance_terms(x, r, stats.objective)["net"][0]
        axes[0].plot(steps, np.cumsum(net[start:stop]), color=color, lw=1.2, label=name)
        if name.startswith(("Traveller", "rolling")):
            for asset in range(shown):
                axes[1 + asset].plot(steps, x[0, start:stop, asset], color=color, lw=1.0, label=name)
    axes[0].set_ylabel("cumulative net return")
    axes[0].legend(loc="upper left", fontsize=8)
    for asset in range(shown):
        axes[1 + asset].set(ylabel=f"position, {stats.asset_names[asset]}", ylim=(-1.05, 1.05))
    axes[-1].set_xlabel(f"step ({period} period of path 0)")
    fig.suptitle(f"{period} period: net of the cost model lam/2 dx'Sigma dx, lam = {stats.objective.lam:g}")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def format_table(table: dict) -> str:
    """The simulated market's table (utility against the known optimum) or your data's (`data_table`)."""
    if "policies" in table:
        names = {"learned": "Traveller (learned)", "buy_and_hold": "buy and hold",
                 "rolling_markowitz": f"rolling Markowitz ({MARKOWITZ_WINDOW})", "no_trade": "no trading"}
        lines = [f"{'policy':<24} {'utility/step':>12} {'return/step':>12} {'cost/step':>10} {'turnover':>9} "
                 f"{'Sharpe':>7}"]
        for key, row in table["policies"].items():
            sharpe = "n/a" if row["sharpe"] is None else f"{row['sharpe']:.2f}"
            lines.append(f"{names[key]:<24} {row['utility']:>12.3e} {row['return']:>12.3e} {row['cost']:>10.2e} "
                         f"{row['turnover']:>9.4f} {sharpe:>7}")
        return "\n".join(lines)
    rows = [("optimal (closed form)", table["optimal"]), ("Markowitz (myopic)", table["markowitz"]),
            ("no trading", table["no_trade"])]
    if "learned" in table:
        rows.insert(0, ("Traveller (learned)", table["learned"]))
    lines = [f"{'policy':<24} {'net utility / step':>18} {'vs optimal':>11}"]
    for name, value in rows:
        lines.append(f"{name:<24} {value:>18.4f} {value / table['optimal']:>10.1%}")
    return "\n".join(lines)


def save_table(table: dict, path: str | Path) -> None:
    write_atomically(path, lambda f: f.write(strict_json(table, indent=2) + "\n"))
