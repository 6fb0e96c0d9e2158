"""`TrainConfig`: the hyper-parameters of `fit` (`jax_scan_rnn.train`) and the `training` flags of every
`jax-scan-rnn train` command, with the values that command gives them.

    from jax_scan_rnn.configs import traveller
    cfg = command_config(traveller.TRAIN_DEFAULTS, steps=200)  # as `train traveller --steps 200` builds it
    cfg = TrainConfig(steps=200, learning_rate=3e-3)           # fit's own defaults for the rest

JAX-free, as every module of `configs`: the command line is built from these fields before JAX is imported.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jax_scan_rnn import validate
from jax_scan_rnn.options import check, option

LR_SCHEDULES = ("constant", "cosine", "linear")  # the `kind`s of schedules.make_lr_schedule


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of `fit`; checked on construction (ValueError naming the field)."""

    steps: int = option(1000, "optimiser updates", lo=1)
    learning_rate: float = option(1e-3, "peak learning rate (after warmup)", lo=0, lo_open=True, flag="--lr")
    warmup_steps: int = option(0, "updates of linear warmup: lr = peak * (t + 1) / (warmup_steps + 1)", lo=0)
    lr_schedule: str = option("cosine", "decay after warmup, to final_lr_fraction", choices=LR_SCHEDULES)
    final_lr_fraction: float = option(0.0, "end learning rate of the decay, as a fraction of the peak", lo=0, hi=1)
    clip_norm: float | None = option(1.0, "global gradient-norm clipping threshold; none: off", lo=0, lo_open=True)
    weight_decay: float = option(0.0, "decoupled (AdamW) weight decay on all parameters; 0: plain Adam", lo=0)
    log_every: int = option(50, "updates between train rows (means over the window)", lo=1)
    eval_every: int = option(500, "updates between evaluations (and at the end); 0: only at the end", lo=0)
    checkpoint_every: int = option(1000, "updates between checkpoints (and at the end); 0: only at the end", lo=0)
    keep_checkpoints: int = option(3, "newest checkpoints kept on disk", lo=1)
    # Read by the tasks, which build the model and its batches from it; `fit`, given a model built already and a
    # batch_fn, does not (seed your model's nnx.Rngs and your batches).
    seed: int = option(0, "the run's seed: initialisation, dropout, batch order and the tasks' noise", lo=0,
                       hi=validate.SEED_MAX)

    def __post_init__(self) -> None:
        check(self, "TrainConfig.")
        if self.warmup_steps > self.steps:
            raise ValueError(f"TrainConfig.warmup_steps: expected at most steps={self.steps}, got {self.warmup_steps}")


# What `jax-scan-rnn train` gives a TrainConfig beyond the class's defaults (each task adds its TRAIN_DEFAULTS)
COMMAND_DEFAULTS = {"log_every": 25, "eval_every": 250, "checkpoint_every": 250}


def default_warmup(steps: int) -> int:
    """`jax-scan-rnn train`'s warm-up when not given: a tenth of the updates, at most 100."""
    return min(100, steps // 10)


def command_config(task_defaults: Mapping[str, Any], **fields) -> TrainConfig:
    """The TrainConfig `jax-scan-rnn train` builds: `COMMAND_DEFAULTS`, then the task's `TRAIN_DEFAULTS`, then
    `fields`, with a warm-up of `default_warmup(steps)` unless given. A run in Python with it trains as the command
    with the same flags does (`TrainConfig()` alone has no warm-up and other intervals).

        cfg = command_config(traveller.TRAIN_DEFAULTS, steps=200)   # `train traveller --steps 200`'s
    """
    values = {**COMMAND_DEFAULTS, **task_defaults, **fields}
    steps = values.get("steps", TrainConfig.__dataclass_fields__["steps"].default)
    values.setdefault("warmup_steps", default_warmup(steps))
    return TrainConfig(**values)
