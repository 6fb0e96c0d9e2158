"""Train and evaluate the Traveller on the Garleanu-Pedersen market (`data/trading.py`).

    task = TravellerTask()                                   # defaults: a few minutes on a 2-core CPU
    model, history = train(task, TrainConfig(steps=1000, learning_rate=3e-3), out_dir="runs/traveller")
    evaluate(model, task)    # {"optimal": .., "markowitz": .., "no_trade": .., "learned": .., "learned_over_optimal": ..}

Objective "utility" maximises the market's net utility directly (no labels: the model discovers
partial trading toward the aim portfolio because the cost term punishes turnover); objective "mse"
regresses onto given target paths (here the optimal policy's), for users with labelled positions.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn.compiled import jit
from jax_scan_rnn.options import check, option
from jax_scan_rnn.optional import require
from jax_scan_rnn.data import trading
from jax_scan_rnn.train import TrainConfig, fit, restore_model
from jax_scan_rnn.traveller import Traveller

OBJECTIVES = ("utility", "mse")


@dataclass(frozen=True)
class TravellerTask:
    """Model size, data and objective of a Traveller training run (every field but `market` is a flag)."""

    hidden_size: int = option(32, "H of every LSTM layer", lo=1)
    num_layers: int = option(2, "stacked LSTM layers", lo=1)
    dropout: float = option(0.0, "inter-layer dropout (training only)", lo=0, hi=1, hi_open=True)
    batch_size: int = option(64, "paths per optimiser step", lo=1)
    seq_len: int = option(128, "steps per training path", lo=1)
    objective: str = option("utility", "utility: maximise net utility; mse: fit the optimal policy's positions",
                            choices=OBJECTIVES)
    train_paths: int = option(8192, "simulated training paths, resampled every step", lo=1)
    eval_paths: int = option(256, "held-out paths for evaluation", lo=1)
    eval_steps: int = option(500, "steps per held-out path (longer than training: the policy must stay stable)",
                             lo=1)
    data_seed: int = option(1, "seed of the training market", lo=0)
    eval_seed: int = option(999, "seed of the held-out market (never seen in training)", lo=0)
    market: trading.MarketConfig = option(factory=trading.MarketConfig, help="the market's parameters", cli=False)

    def __post_init__(self):
        check(self)
        if self.batch_size > self.train_paths:
            raise ValueError(f"batch_size: expected at most train_paths={self.train_paths}, got {self.batch_size}")

    def data_bytes(self) -> int:
        """Bytes the simulated training market takes while it is built (float64 signals, shocks and returns,
        then the float32 features, returns and targets kept): a bound to check before simulating."""
        per_step = self.market.num_signals * 3 + 2 * self.market.num_assets + (self.market.num_signals + 4) // 2
        return self.train_paths * self.seq_len * per_step * 8

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TravellerTask:
        return cls(**{**data, "market": trading.MarketConfig(**data["market"])})


def build_model(task: TravellerTask, seed: int = 0) -> Traveller:
    return Traveller(task.market.num_signals, task.hidden_size, task.num_layers, task.dropout, rngs=nnx.Rngs(seed))


def make_batch_fn(task: TravellerTask, seed: int = 0):
    """`step -> batch`: a pure function of the step (what makes resumed runs exact). The training market is
    `task.data_seed`'s; the batch order is seeded by `task.data_seed + seed` (the run's seed)."""
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


def make_loss_fn(task: TravellerTask):
    """`(model, batch) -> (loss, metrics)`: minus the mean per-step net utility, or the MSE to targets."""

    def loss_fn(model: Traveller, batch: dict):
        positions, _ = model(batch["features"])
        utility = trading.net_utility(positions, batch["returns"], task.market).mean()
        if task.objective == "utility":
            return -utility, {"utility": utility}
        return trading.supervised_mse(positions, batch["targets"]), {"utility": utility}

    return loss_fn


def held_out_market(task: TravellerTask) -> trading.Market:
    return trading.simulate(task.market, task.eval_paths, task.eval_steps, seed=task.eval_seed)


def _positions(model: Traveller, features: jax.Array) -> jax.Array:
    """Positions `[B, T, 2]` for `features [B, T, F]`, through the one compiled call (`jsr.jit`, which keeps
    its compiled functions per model, so the evaluations during training compile once)."""
    return jit(model)(features)[0]


def evaluate(model: Traveller, task: TravellerTask, market: trading.Market | None = None) -> dict[str, float]:
    """Out-of-sample mean per-step net utility of the model and of the optimal/Markowitz/no-trade policies."""
    market = held_out_market(task) if market is None else market
    model.eval()
    positions = _positions(model, jnp.asarray(market.features, jnp.float32))
    return trading.utility_table(task.market, market, np.asarray(positions))


def train(
    task: TravellerTask,
    cfg: TrainConfig,
    out_dir: str | Path | None = None,
    *,
    resume: bool = False,
    callback=None,
    **fit_kwargs,
):
    """Train a fresh Traveller (or resume `out_dir`); returns `(model, history)`.

    `cfg.seed` is the run's one seed: the initialisation, the dropout stream and the batch order."""
    seed = cfg.seed
    model = build_model(task, seed)
    market = held_out_market(task)

    def eval_fn(m: Traveller) -> dict[str, float]:
        table = evaluate(m, task, market)
        return {"utility": table["learned"], "over_optimal": table["learned_over_optimal"]}

    history = fit(
        model,
        make_loss_fn(task),
        make_batch_fn(task, seed),
        cfg,
        out_dir=out_dir,
        eval_fn=eval_fn,
        resume=resume,
        callback=callback,
        metadata={"model": "traveller", "task": task.to_json(), "seed": seed},
        **fit_kwargs,
    )
    return model, history


def load(out_dir: str | Path, step: int | None = None) -> tuple[Traveller, TravellerTask]:
    """Rebuild the model of a training run from its checkpoint's metadata and load its weights."""
    from jax_scan_rnn import checkpoint

    meta = checkpoint.read_metadata(Path(out_dir) / "checkpoints", step)
    if meta.get("model") != "traveller":
        raise ValueError(f"checkpoint: expected a Traveller run, got model {meta.get('model')!r} in {out_dir}")
    task = TravellerTask.from_json(meta["task"])
    model = build_model(task, meta.get("seed", 0))
    restore_model(out_dir, model, step)
    return model, task


def plot_positions(model: Traveller, task: TravellerTask, path: str | Path, *, steps: int = 200) -> Path:
    """PNG of one held-out path: the learned positions against the optimal and Markowitz policies."""
    require("matplotlib", "the positions plot").use("Agg")
    import matplotlib.pyplot as plt

    market = trading.simulate(task.market, 1, steps, seed=task.eval_seed)
    model.eval()
    learned = np.asarray(_positions(model, jnp.asarray(market.features, jnp.float32)))[0]
    optimal = trading.optimal_policy(task.market, market.signals)[0]
    markowitz = trading.markowitz_policy(task.market, market.signals)[0]
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for asset, ax in enumerate(axes):
        ax.plot(markowitz[:, asset], color="0.75", lw=0.8, label="Markowitz (ignores costs)")
        ax.plot(optimal[:, asset], color="k", lw=1.5, label="optimal (Garleanu-Pedersen)")
        ax.plot(learned[:, asset], color="tab:red", lw=1.2, ls="--", label="Traveller (learned)")
        ax.set_ylabel(f"position, asset {asset}")
        ax.set_ylim(-1.05, 1.05)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("step")
    fig.suptitle("Held-out path: learned positions vs the optimal policy")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_table(table: dict[str, float]) -> str:
    rows = [("optimal (closed form)", table["optimal"]), ("Markowitz (myopic)", table["markowitz"]),
            ("no trading", table["no_trade"])]
    if "learned" in table:
        rows.insert(0, ("Traveller (learned)", table["learned"]))
    lines = [f"{'policy':<24} {'net utility / step':>18} {'vs optimal':>11}"]
    for name, value in rows:
        lines.append(f"{name:<24} {value:>18.4f} {value / table['optimal']:>10.1%}")
    return "\n".join(lines)


def save_table(table: dict[str, float], path: str | Path) -> None:
    Path(path).write_text(json.dumps(table, indent=2) + "\n")
