"""The generic training engine shared by every model: optimiser, jitted steps, and :func:`fit`.

Contract with models (``loss_fn``) and data (``batch_fn``)::

    loss_fn(model, batch) -> (loss, metrics)   # loss: scalar; metrics: dict[str, scalar]
    batch_fn(step) -> batch                     # pytree of arrays; a PURE function of the step index

``batch_fn(i)`` feeds update number ``i + 1``: rows and checkpoints labelled ``step = k`` are taken after
``k`` updates, and a run resumed from checkpoint ``k`` continues with ``batch_fn(k)``. Because the data
is a function of the step and the whole training state (parameters, optimiser state, the model's rng
streams such as ``nnx.Dropout``'s, the metric window accumulators) is checkpointed, a resumed run is
bit-for-bit identical to an uninterrupted one (on the same machine and backend).

How the step is compiled (measured; the choice was made on these numbers): the model and its
``nnx.Optimizer`` are split ONCE (``nnx.split``) into a graph definition and a flat list of plain arrays
(typed PRNG keys as ``key_data``); the step is one ``jax.jit`` of a pure ``carry -> carry`` function
(graphdef closed over, carry donated), compiled once and reused by later ``fit`` calls with the same
model structure, loss and optimiser settings. Per update, tiny MLP, 2 shared CPU cores (best of 3):

    nnx.jit(train_step)(model, optimizer, batch)        ~810 us  (Python graph traversal each call)
    jax.jit over nnx.split/merge State                  ~170 us  (Python pytree flattening of State)
    fit's step: flat arrays, guarded, donated           ~100 us  (fit loop steady state: ~95 us)
    the same + reading the loss on the host each step   ~200 us  (blocks asynchronous dispatch)

Non-finite detection (choice and cost): the step itself checks ``isfinite(loss) & isfinite(grad_norm)``
on the device. The first bad update is recorded in the carry (its step, loss and gradient norm) and the
carry is frozen from then on (``jnp.where`` selects the old state), so no NaN ever reaches the
parameters or the optimiser state. The host reads this flag only when it syncs anyway (logging,
evaluation, checkpointing, the end), so there is no per-step host sync and dispatch stays asynchronous;
at most ``log_every`` no-op steps run after the bad one (reading the loss every step instead would double
the per-step time of small models, see above). Then :class:`NonFiniteLossError` reports the
first bad step exactly, the model holds the parameters from just before it, and no checkpoint is written
(the last good one stays).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_scan_rnn import checkpoint as ckpt
from jax_scan_rnn.lock import run_lock
from jax_scan_rnn.optional import available
from jax_scan_rnn.schedules import LR_SCHEDULES, make_lr_schedule

__all__ = [
    "TrainConfig",
    "History",
    "NonFiniteLossError",
    "make_lr_schedule_for",
    "make_optimizer",
    "make_train_step",
    "TrainStep",
    "make_eval_step",
    "EvalStep",
    "make_eval_fn",
    "fit",
    "METRICS_FILE",
    "CURVES_FILE",
    "CHECKPOINT_DIR",
]

Array = jax.Array
Batch = Any  # a pytree of arrays
LossFn = Callable[[nnx.Module, Batch], tuple[Array, Mapping[str, Array]]]

METRICS_FILE = "metrics.jsonl"  # one JSON row per log / eval, under out_dir
CURVES_FILE = "curves.png"  # loss / lr / metric curves, written at the end of fit
CHECKPOINT_DIR = "checkpoints"  # checkpoint root under out_dir


# ------------------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of :func:`fit`; validated on construction (``ValueError`` naming the field)."""

    steps: int = 1000  # total optimiser updates
    learning_rate: float = 1e-3  # peak learning rate (after warmup)
    warmup_steps: int = 0  # updates of linear warmup, lr = peak * (t + 1) / (warmup_steps + 1)
    lr_schedule: str = "cosine"  # after warmup: "constant" | "cosine" | "linear" decay to final_lr_fraction
    final_lr_fraction: float = 0.0  # end lr of the cosine/linear decay, as a fraction of learning_rate
    clip_norm: float | None = 1.0  # global-norm gradient clipping threshold; None disables clipping
    weight_decay: float = 0.0  # decoupled (AdamW) weight decay on all params; 0.0 gives plain Adam
    log_every: int = 50  # write a train row (means over the last log_every updates) every this many
    eval_every: int = 500  # call eval_fn every this many updates, and at the end; 0: only at the end
    checkpoint_every: int = 1000  # checkpoint every this many updates, and at the end; 0: only at the end
    keep_checkpoints: int = 3  # newest checkpoints kept on disk (older ones are deleted)
    seed: int = 0  # seed for the caller's model/data construction; recorded in checkpoints, unused by fit

    def __post_init__(self) -> None:
        def check_int(name: str, lo: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"TrainConfig.{name}: expected an int >= {lo}, got {v!r}")

        def check_real(name: str, lo: float, lo_open: bool) -> None:
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or (v <= lo if lo_open else v < lo):
                bound = f"> {lo}" if lo_open else f">= {lo}"
                raise ValueError(f"TrainConfig.{name}: expected a finite number {bound}, got {v!r}")

        check_int("steps", 1)
        check_real("learning_rate", 0.0, True)
        check_int("warmup_steps", 0)
        if self.warmup_steps > self.steps:
            raise ValueError(
                f"TrainConfig.warmup_steps: expected at most steps={self.steps}, got {self.warmup_steps}"
            )
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"TrainConfig.lr_schedule: expected one of {LR_SCHEDULES}, got {self.lr_schedule!r}"
            )
        check_real("final_lr_fraction", 0.0, False)
        if self.final_lr_fraction > 1.0:
            raise ValueError(
                f"TrainConfig.final_lr_fraction: expected a value in [0, 1], got {self.final_lr_fraction!r}"
            )
        if self.clip_norm is not None:
            check_real("clip_norm", 0.0, True)
        check_real("weight_decay", 0.0, False)
        check_int("log_every", 1)
        check_int("eval_every", 0)
        check_int("checkpoint_every", 0)
        check_int("keep_checkpoints", 1)
        check_int("seed", 0)


class NonFiniteLossError(RuntimeError):
    """Training produced a non-finite loss, gradient norm or updated state at ``step`` (1-based update number)."""

    def __init__(self, step: int, loss: float, grad_norm: float, last_checkpoint: int | None):
        self.step = step  # the first bad update (computed from batch_fn(step - 1))
        self.loss = loss  # its loss value
        self.grad_norm = grad_norm  # its global gradient norm
        self.last_checkpoint = last_checkpoint  # newest checkpoint step on disk (kept untouched), or None
        # A finite loss and gradient can still give a non-finite update (an overflowing learning rate).
        what = ("loss" if not math.isfinite(loss) else "gradient norm" if not math.isfinite(grad_norm)
                else "parameters or optimizer state after the update")
        kept = (
            f"the last good checkpoint (step {last_checkpoint}) is kept"
            if last_checkpoint is not None
            else "no checkpoint was written"
        )
        super().__init__(
            f"non-finite {what} at step {step} (the update computed from batch_fn({step - 1})): "
            f"loss={loss!r}, grad_norm={grad_norm!r}; training stopped, the model holds the parameters "
            f"after step {step - 1}, and {kept}"
        )


@dataclass(frozen=True)
class History:
    """What :func:`fit` returns: the rows of ``metrics.jsonl`` (also when ``out_dir`` is None)."""

    train: list[dict]  # train rows: step, split, loss, metrics, grad_norm, lr, wall_time, elapsed_s, ...
    eval: list[dict]  # eval rows: step, split, loss (if eval_fn returned one), metrics, lr, wall_time, ...
    step: int  # updates completed
    resumed_from: int | None = None  # checkpoint step the run resumed from, if it did
    out_dir: Path | None = None  # where metrics, curves and checkpoints were written
    checkpoints_skipped: tuple[tuple[int, str], ...] = field(default=())  # invalid ones on resume
    checkpoints_moved_aside: tuple[tuple[int, Path], ...] = field(default=())  # (step, where): kept, unused
    checkpoint_stray_files: tuple[str, ...] = field(default=())  # unlisted files in the resumed checkpoint

    def series(self, key: str = "loss", split: str = "train") -> tuple[list[int], list[float]]:
        """(steps, values) of ``key`` (a row field such as ``loss``/``lr``, or a metric name)."""
        rows = self.train if split == "train" else self.eval
        xs, ys = [], []
        for r in rows:
            v = r[key] if key in r else r.get("metrics", {}).get(key)
            if isinstance(v, (int, float)):
                xs.append(r["step"])
                ys.append(v)
        return xs, ys


# --------------------------------------------------------------------------------------- optimiser


def _optimizer_key(cfg: TrainConfig) -> tuple:
    return (
        cfg.lr_schedule, cfg.learning_rate, cfg.steps, cfg.warmup_steps, cfg.final_lr_fraction,
        cfg.clip_norm, cfg.weight_decay,
    )


@functools.lru_cache(maxsize=32)
def _optimizer_for(key: tuple) -> tuple[optax.GradientTransformation, optax.Schedule]:
    # Cached so that equal configs give the SAME transformation object: nnx.Optimizer keeps ``tx`` in
    # its graph definition, and equal graph definitions let fit reuse an already compiled step.
    kind, peak, steps, warmup, final, clip, wd = key
    schedule = make_lr_schedule(kind, peak=peak, steps=steps, warmup_steps=warmup, final_fraction=final)
    opt = optax.adamw(schedule, weight_decay=wd) if wd > 0 else optax.adam(schedule)
    if clip is not None:
        opt = optax.chain(optax.clip_by_global_norm(clip), opt)
    return opt, schedule


def make_lr_schedule_for(cfg: TrainConfig) -> optax.Schedule:
    """The learning-rate schedule of ``cfg`` (a function of the optax update count, 0-based)."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg: expected a TrainConfig, got {type(cfg).__name__}")
    return _optimizer_for(_optimizer_key(cfg))[1]


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm(clip_norm)`` (if set) then Adam, or AdamW (decoupled weight decay on all
    parameters) when ``weight_decay > 0``, with the learning-rate schedule of ``cfg``.

    Equal optimiser settings return the same (stateless) transformation object.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg: expected a TrainConfig, got {type(cfg).__name__}")
    return _optimizer_for(_optimizer_key(cfg))[0]


# ------------------------------------------------------------------------------------ step pieces


def _check_loss_output(out: Any) -> tuple[Array, dict[str, Array]]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"loss_fn: expected to return (loss, metrics: dict[str, scalar]), got {type(out).__name__}"
        )
    loss, metrics = out
    if jnp.shape(loss) != () or not jnp.issubdtype(jnp.result_type(loss), jnp.floating):
        raise ValueError(
            f"loss_fn: expected a scalar floating loss, got shape {jnp.shape(loss)} "
            f"dtype {jnp.result_type(loss)}"
        )
    if metrics is None:
        metrics = {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"loss_fn: expected metrics as a dict[str, scalar], got {type(metrics).__name__}")
    for k, v in metrics.items():
        if not isinstance(k, str) or jnp.shape(v) != ():
            raise ValueError(
                f"loss_fn: expected metrics as dict[str, scalar], got key {k!r} with shape {jnp.shape(v)}"
            )
    return loss, dict(metrics)


def _loss_and_update(loss_fn: LossFn, model, optimizer, batch):
    """Differentiate ``loss_fn`` w.r.t. the model's ``nnx.Param`` and apply one optimiser update."""

    def objective(m):
        return _check_loss_output(loss_fn(m, batch))

    (loss, metrics), grads = nnx.value_and_grad(objective, has_aux=True)(model)
    grad_norm = optax.tree.norm(grads)
    optimizer.update(model, grads)
    return loss, metrics, grad_norm


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _key_impl(x: Any) -> str | None:
    dtype = getattr(x, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(x))
    return None


class _FlatState:
    """A state as a flat list of plain arrays, typed PRNG keys stored as their ``key_data``.

    Plain arrays keep ``jax.jit``'s argument handling on its C++ fast path (typed key arrays and
    ``nnx.State``/``Variable`` pytrees are flattened in Python, which costs more than the step).
    """

    def __init__(self, treedef: Any, leaves: Sequence[Any]):
        self.treedef = treedef
        self.impls = [_key_impl(x) for x in leaves]

    def raw(self, leaves: Sequence[Any]) -> list:
        return [jax.random.key_data(x) if k else x for x, k in zip(leaves, self.impls)]

    def leaves(self, raw: Sequence[Any]) -> list:
        return [jax.random.wrap_key_data(x, impl=k) if k else x for x, k in zip(raw, self.impls)]

    def tree(self, raw: Sequence[Any]) -> Any:
        return jax.tree.unflatten(self.treedef, self.leaves(raw))


class TrainStep:
    """``step(model, optimizer, batch) -> (loss, metrics)``: one jitted update, in place.

    ``optimizer`` is an ``nnx.Optimizer(model, tx, wrt=nnx.Param)``. One compiled function is cached per
    structure of (model, optimizer). Fast path: the ``nnx.Variable`` objects are collected with
    ``jax.tree`` (NNX modules are pytrees), their raw arrays passed as a flat list (donated when
    ``donate``) and the new arrays written back into the same Variables. Models that share a Variable
    between two places (tied weights) take the slower graph path (``nnx.split``/``nnx.update``), which
    preserves the sharing. Returns device arrays; reading them (``float(loss)``) waits for the step.
    """

    def __init__(self, loss_fn: LossFn, *, donate: bool = True):
        if not callable(loss_fn):
            raise TypeError(f"loss_fn: expected a callable, got {type(loss_fn).__name__}")
        self.loss_fn = loss_fn
        self.donate = donate
        self._cache: dict[Any, tuple[Callable, _FlatState | None]] = {}

    def _jit(self, pure: Callable) -> Callable:
        return jax.jit(pure, donate_argnums=(0,) if self.donate else ())

    def __call__(self, model: nnx.Module, optimizer: nnx.Optimizer, batch: Batch):
        if not isinstance(model, nnx.Module):
            raise TypeError(f"model: expected an nnx.Module, got {type(model).__name__}")
        if not isinstance(optimizer, nnx.Optimizer):
            raise TypeError(f"optimizer: expected an nnx.Optimizer, got {type(optimizer).__name__}")
        objs = (model, optimizer)
        variables, vdef = jax.tree.flatten(objs, is_leaf=_is_variable)
        if len({id(v) for v in variables}) != len(variables) or not all(map(_is_variable, variables)):
            return self._graph_call(objs, batch)
        values = [v.get_raw_value() for v in variables]
        entry = self._cache.get(vdef)
        if entry is None:
            full_leaves, full_def = jax.tree.flatten(objs)
            if len(full_leaves) != len(values):  # a Variable holding a non-array pytree
                return self._graph_call(objs, batch)
            flat = _FlatState(full_def, full_leaves)
            loss_fn = self.loss_fn

            def pure(raw, batch):
                m, o = flat.tree(raw)
                loss, metrics, _ = _loss_and_update(loss_fn, m, o, batch)
                return flat.raw(jax.tree.leaves((m, o))), loss, metrics

            entry = self._cache[vdef] = (self._jit(pure), flat)
        fn, flat = entry
        new_raw, loss, metrics = fn(flat.raw(values), batch)
        for v, x in zip(variables, flat.leaves(new_raw)):
            v.set_raw_value(x)
        return loss, metrics

    def _graph_call(self, objs: tuple, batch: Batch):
        graphdef, state = nnx.split(objs)
        leaves, treedef = jax.tree.flatten(state)
        key = ("graph", graphdef, treedef)
        entry = self._cache.get(key)
        if entry is None:
            flat = _FlatState(treedef, leaves)
            loss_fn = self.loss_fn

            def pure(raw, batch):
                m, o = nnx.merge(graphdef, flat.tree(raw))
                loss, metrics, _ = _loss_and_update(loss_fn, m, o, batch)
                return flat.raw(jax.tree.leaves(nnx.state((m, o)))), loss, metrics

            entry = self._cache[key] = (self._jit(pure), flat)
        fn, flat = entry
        new_raw, loss, metrics = fn(flat.raw(leaves), batch)
        nnx.update(objs, flat.tree(new_raw))
        return loss, metrics


def make_train_step(loss_fn: LossFn, *, donate: bool = True) -> TrainStep:
    """A jitted in-place update ``step(model, optimizer, batch) -> (loss, metrics)``; see :class:`TrainStep`.

    :func:`fit` uses the same math with a fused on-device finiteness guard and metric accumulation.
    """
    return TrainStep(loss_fn, donate=donate)


class EvalStep:
    """``eval_step(model, batch) -> (loss, metrics)``: jitted, side-effect free (state changes made by
    ``loss_fn``, e.g. advanced rng counts, are discarded, so evaluating never perturbs training).

    The model is passed to ``jax.jit`` as a pytree (NNX modules are pytrees); one compilation per
    model structure.
    """

    def __init__(self, loss_fn: LossFn):
        if not callable(loss_fn):
            raise TypeError(f"loss_fn: expected a callable, got {type(loss_fn).__name__}")
        self.loss_fn = loss_fn
        self._fn = jax.jit(lambda model, batch: _check_loss_output(loss_fn(model, batch)))

    def __call__(self, model: nnx.Module, batch: Batch):
        if not isinstance(model, nnx.Module):
            raise TypeError(f"model: expected an nnx.Module, got {type(model).__name__}")
        return self._fn(model, batch)


def make_eval_step(loss_fn: LossFn) -> EvalStep:
    """A jitted ``eval_step(model, batch) -> (loss, metrics)`` that leaves the model untouched."""
    return EvalStep(loss_fn)


def make_eval_fn(loss_fn: LossFn, batches: Sequence[Batch]) -> Callable[[nnx.Module], dict[str, float]]:
    """An ``eval_fn`` for :func:`fit`: the mean of ``loss`` and of every metric over ``batches``
    (equal weight per batch), as ``{"loss": ..., **metrics}`` Python floats."""
    batches = list(batches)
    if not batches:
        raise ValueError("batches: expected at least one evaluation batch, got none")
    step = EvalStep(loss_fn)

    def eval_fn(model: nnx.Module) -> dict[str, float]:
        sums: dict[str, Array] = {}
        for b in batches:
            loss, metrics = step(model, b)
            for k, v in {"loss": loss, **metrics}.items():
                sums[k] = sums.get(k, 0.0) + jnp.asarray(v, jnp.float32)
        host = jax.device_get(sums)
        return {k: float(v) / len(batches) for k, v in host.items()}

    return eval_fn


# --------------------------------------------------------------------------------------------- fit


def _scalar(value, dtype) -> Array:
    # device_put of a NumPy scalar: no XLA compilation (jnp.zeros would compile a tiny program).
    return jax.device_put(np.asarray(value, dtype))


def _zeros_loop(metric_names: Sequence[str]) -> dict:
    """On-device accumulators of the current log window (checkpointed with the state)."""
    return {
        "count": _scalar(0, np.int32),  # updates in the window
        "loss_sum": _scalar(0, np.float32),
        "grad_norm_sum": _scalar(0, np.float32),
        "metric_sums": {k: _scalar(0, np.float32) for k in metric_names},
        "lr": _scalar(0, np.float32),  # learning rate of the latest update (as optax computed it)
    }


def _no_bad() -> dict:
    """The first non-finite update: step -1 while there was none."""
    return {
        "step": _scalar(-1, np.int32),
        "loss": _scalar(0, np.float32),
        "grad_norm": _scalar(0, np.float32),
    }


_FIT_STEPS: OrderedDict = OrderedDict()  # compiled fit steps, reused by later fit calls
_FIT_STEPS_MAX = 8


def _fit_step_for(loss_fn: LossFn, graphdef, flat: _FlatState, schedule, metric_names) -> Callable:
    """The jitted fit step, reused across fit calls with the same loss_fn, graph and state layout
    (e.g. a resumed run in the same process) so it compiles once."""
    key = (loss_fn, graphdef, flat.treedef, tuple(flat.impls), schedule, tuple(metric_names))
    try:
        fn = _FIT_STEPS.pop(key)
    except (KeyError, TypeError):  # TypeError: an unhashable loss_fn
        fn = jax.jit(_make_fit_step(loss_fn, graphdef, flat, schedule), donate_argnums=(0,))
    try:
        _FIT_STEPS[key] = fn
        while len(_FIT_STEPS) > _FIT_STEPS_MAX:
            _FIT_STEPS.popitem(last=False)
    except TypeError:
        pass
    return fn


def _make_fit_step(
    loss_fn: LossFn, graphdef, flat: _FlatState, schedule: optax.Schedule
) -> Callable:
    """The pure, guarded step used by :func:`fit`: ``carry -> carry`` (see the module docstring)."""

    def step(carry, batch):
        old = carry["state"]
        objs = nnx.merge(graphdef, flat.tree(old))
        optimizer = objs["optimizer"]
        done = optimizer.step[...]  # updates applied before this one
        loss, metrics, grad_norm = _loss_and_update(loss_fn, objs["model"], optimizer, batch)
        with_path, new_treedef = jax.tree_util.tree_flatten_with_path(nnx.state(objs))
        if new_treedef != flat.treedef:  # trace-time checks: a step must not change the state's layout
            raise ValueError(
                "loss_fn: expected the model's state structure to stay the same during a step, "
                f"got {new_treedef} instead of {flat.treedef}"
            )
        new = flat.raw([x for _, x in with_path])
        for (path, _), a, b in zip(with_path, new, old):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(
                    f"loss_fn/optimizer: expected state leaf {jax.tree_util.keystr(path)} to keep shape "
                    f"{b.shape} dtype {b.dtype} across a step, got shape {a.shape} dtype {a.dtype}"
                )
        loss32 = jnp.asarray(loss, jnp.float32)
        grad_norm32 = jnp.asarray(grad_norm, jnp.float32)
        loop = carry["loop"]
        new_loop = {
            "count": loop["count"] + 1,
            "loss_sum": loop["loss_sum"] + loss32,
            "grad_norm_sum": loop["grad_norm_sum"] + grad_norm32,
            "metric_sums": {
                k: loop["metric_sums"][k] + jnp.asarray(metrics[k], jnp.float32)
                for k in loop["metric_sums"]
            },
            "lr": jnp.asarray(schedule(done), jnp.float32),
        }
        bad = carry["bad"]
        live = bad["step"] < 0
        # The updated state too: a finite loss and gradient can still overflow in the update (lr 1e300),
        # and no such state may be kept, let alone checkpointed.
        ok = jnp.isfinite(loss32) & jnp.isfinite(grad_norm32)
        for leaf in new:
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                ok = ok & jnp.all(jnp.isfinite(leaf))
        commit = live & ok
        first_bad = live & ~ok

        def keep_if(a, b):
            return jnp.where(commit, a, b)

        return {
            "state": jax.tree.map(keep_if, new, old),
            "loop": jax.tree.map(keep_if, new_loop, loop),
            "bad": {
                "step": jnp.where(first_bad, (done + 1).astype(jnp.int32), bad["step"]),
                "loss": jnp.where(first_bad, loss32, bad["loss"]),
                "grad_norm": jnp.where(first_bad, grad_norm32, bad["grad_norm"]),
            },
        }

    return step


def _read_rows(path: Path) -> list[dict]:
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def _rewrite_rows(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _config_diff(saved: Mapping[str, Any], cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    now = asdict(cfg)
    return {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}


def _holding_out_dir(fit_fn: Callable) -> Callable:
    """Run `fit_fn` with its `out_dir` held (`lock.run_lock`) by the first process: one writer per run directory."""

    @functools.wraps(fit_fn)
    def wrapper(*args, **kwargs):
        out_dir = kwargs.get("out_dir")
        if out_dir is None or jax.process_index() != 0:
            return fit_fn(*args, **kwargs)
        with run_lock(out_dir):
            return fit_fn(*args, **kwargs)

    return wrapper


@_holding_out_dir
def fit(
    model: nnx.Module,
    loss_fn: LossFn,
    batch_fn: Callable[[int], Batch],
    cfg: TrainConfig,
    *,
    out_dir: str | os.PathLike | None = None,
    eval_fn: Callable[[nnx.Module], Mapping[str, float]] | None = None,
    resume: bool = False,
    callback: Callable[[dict], None] | None = None,
    metadata: Mapping[str, Any] | None = None,
    data_sharding: jax.sharding.Sharding | None = None,
    state_sharding: jax.sharding.Sharding | None = None,
) -> History:
    """Train ``model`` in place for ``cfg.steps`` updates of Adam(W) on ``loss_fn``.

    Args:
      model: the NNX module; its ``nnx.Param`` are trained, every other state (rng streams, batch
        stats) is carried and checkpointed. On return (or on any exception) it holds the latest state
        (for :class:`NonFiniteLossError`: the state before the bad update).
      loss_fn: ``loss_fn(model, batch) -> (loss, metrics: dict[str, scalar])``, traced once.
      batch_fn: ``batch_fn(i) -> batch`` for update ``i + 1``; must be a pure function of ``i``.
      cfg: the :class:`TrainConfig`.
      out_dir: where ``metrics.jsonl``, ``curves.png`` and ``checkpoints/`` go; ``None`` writes nothing
        (no checkpoints either).
      eval_fn: ``eval_fn(model) -> dict[str, float]``, called every ``cfg.eval_every`` updates and at the
        end with the model holding the current state. State changes it makes are discarded (the
        training state is the source of truth), so evaluation never changes the training trajectory.
      resume: continue from the newest VALID checkpoint under ``out_dir``. Resuming never deletes a
        checkpoint: invalid newer ones (corrupt, truncated, missing files, bad manifest) are reported
        in ``History.checkpoints_skipped`` and a ``checkpoint_skipped`` event, then moved aside to
        ``checkpoints/step_<n>.invalid-<k>`` (``checkpoint.set_aside``; listed in
        ``History.checkpoints_moved_aside``), where no later run reads, counts or prunes them. Files in
        the resumed checkpoint that its manifest does not list (a ``notes.txt``, a ``.DS_Store``) do
        not make it invalid: they are left alone and reported in ``History.checkpoint_stray_files``
        and a ``checkpoint_stray_files`` event. Rows of ``metrics.jsonl`` after the restored step are
        dropped so the log reads as one run. With no checkpoint at all, training starts from scratch.
        Without ``resume``, an ``out_dir`` that already holds checkpoints is refused (``ValueError``),
        so runs never mix.
      callback: ``callback(event: dict)`` for progress (the library never prints). Events, each with
        an ``"event"`` key: ``start`` (step, steps, resumed_from), ``checkpoint_skipped`` (step,
        reason, moved_to), ``checkpoint_stray_files`` (step, path, files: relative to path),
        ``config_changed`` (fields: {name: [saved, now]}), ``log`` (a train row), ``eval`` (an
        eval row), ``checkpoint`` (step, path), ``end`` (step, elapsed_s). A progress bar advances to
        ``event["step"]`` on ``log`` events (every ``cfg.log_every`` updates). During a callback the
        model holds the current state (between callbacks its arrays are donated to the next step, so
        keep no references to them). An exception raised by the callback stops training.
      metadata: JSON-serialisable dict stored in every checkpoint (e.g. the model config, so another
        process can rebuild the model); ``train_config`` is added (and reserved).
      data_sharding: if given, every batch is ``jax.device_put`` with it (e.g. a batch-sharded
        ``NamedSharding`` for data parallelism).
      state_sharding: if given, the training state is placed with it (e.g. replicated) before the loop.

    Returns:
      The :class:`History` of train and eval rows (including the earlier run's rows when resuming).

    While it runs, ``fit`` holds ``out_dir`` (``lock.run_lock``, on the first process of a multi-process
    run): a second process writing there is refused with ``RunDirectoryLocked`` naming the holder's PID.

    Raises:
      NonFiniteLossError: at the first update whose loss, gradient norm or updated state is not finite.
      lock.RunDirectoryLocked: another process holds ``out_dir``.
      checkpoint.CheckpointError: ``resume`` found checkpoints, but none valid.
    """
    t_start = time.time()
    if not isinstance(model, nnx.Module):
        raise TypeError(f"model: expected an nnx.Module, got {type(model).__name__}")
    for name, f in (("loss_fn", loss_fn), ("batch_fn", batch_fn)):
        if not callable(f):
            raise TypeError(f"{name}: expected a callable, got {type(f).__name__}")
    if eval_fn is not None and not callable(eval_fn):
        raise TypeError(f"eval_fn: expected None or a callable, got {type(eval_fn).__name__}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback: expected None or a callable, got {type(callback).__name__}")
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg: expected a TrainConfig, got {type(cfg).__name__}")
    metadata = dict(metadata or {})
    if "train_config" in metadata:
        raise ValueError("metadata: expected no 'train_config' key (fit adds it), got one")
    out = Path(out_dir) if out_dir is not None else None
    if resume and out is None:
        raise ValueError("out_dir: expected a directory when resume=True, got None")
    ckdir = out / CHECKPOINT_DIR if out is not None else None
    if out is not None and not resume and ckpt.steps(ckdir):
        raise ValueError(
            f"out_dir: expected no checkpoints when resume=False, got steps {ckpt.steps(ckdir)} in "
            f"{ckdir}; pass resume=True to continue that run or choose another out_dir"
        )

    def emit(event: dict) -> None:
        if callback is not None:
            callback(event)

    schedule = make_lr_schedule_for(cfg)
    optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)
    objs = {"model": model, "optimizer": optimizer}
    graphdef, state = nnx.split(objs)
    leaves, treedef = jax.tree.flatten(state)
    flat = _FlatState(treedef, leaves)
    # Own copies (the step donates its inputs; the caller's arrays must stay valid), as plain arrays.
    leaves = [jax.device_put(x, may_alias=False) for x in flat.raw(leaves)]
    if state_sharding is not None:
        leaves = jax.device_put(leaves, state_sharding)

    def put(batch):
        if data_sharding is None:
            return batch
        if jax.process_count() > 1:  # several hosts: each contributes its own devices' rows
            from jax_scan_rnn.distributed import DataParallel

            return DataParallel(data_sharding.mesh).put(batch)
        return jax.device_put(batch, data_sharding)

    # Trace loss_fn once abstractly to learn its metric names (structure of the accumulators).
    first_batch = batch_fn(0)

    def probe(raw, batch):
        m = nnx.merge(graphdef, flat.tree(raw))["model"]
        return _check_loss_output(loss_fn(m, batch))

    _, metric_shapes = jax.eval_shape(probe, leaves, put(first_batch))
    metric_names = sorted(metric_shapes)
    carry = {"state": leaves, "loop": _zeros_loop(metric_names), "bad": _no_bad()}

    def saved_tree(c) -> dict:
        return {"train_state": flat.tree(c["state"]), "loop": c["loop"]}

    # ---- resume
    start = 0
    resumed_from: int | None = None
    skipped: tuple[tuple[int, str], ...] = ()
    moved_aside: tuple[tuple[int, Path], ...] = ()
    stray: tuple[str, ...] = ()
    rows: list[dict] = []
    if resume and ckpt.steps(ckdir):
        restored = ckpt.restore(ckdir, target=saved_tree(carry), fallback=True)
        skipped = restored.skipped
        # The skipped ones are every step newer than the restored one (fallback walks newest first).
        # The resumed run recomputes those steps, so they must leave the step namespace; they are
        # renamed, not deleted, because a failed verify does not prove the data worthless (a transient
        # read error, a file someone is still copying) and resume must never destroy data.
        moved_aside = tuple((s, ckpt.set_aside(ckdir, s)) for s, _ in skipped)
        for (s, reason), (_, where) in zip(skipped, moved_aside):
            emit({"event": "checkpoint_skipped", "step": s, "reason": reason, "moved_to": str(where)})
        stray = restored.stray_files
        if stray:
            emit({"event": "checkpoint_stray_files", "step": restored.step, "path": str(restored.path),
                  "files": list(stray)})
        new_leaves = flat.raw(jax.tree.leaves(restored.state["train_state"]))
        opt_step = int(restored.state["train_state"]["optimizer"]["step"][...])
        if opt_step != restored.step:
            raise ckpt.CheckpointError(
                f"checkpoint {restored.path}: optimiser step {opt_step} differs from the directory's "
                f"step {restored.step}"
            )
        if restored.step > cfg.steps:
            raise ValueError(
                f"cfg.steps: expected at least the checkpoint's step {restored.step}, got {cfg.steps}"
            )
        if state_sharding is not None:
            new_leaves = jax.device_put(new_leaves, state_sharding)
        carry = {"state": new_leaves, "loop": restored.state["loop"], "bad": _no_bad()}
        start = resumed_from = restored.step
        diff = _config_diff(restored.metadata.get("train_config", asdict(cfg)), cfg)
        if diff:
            emit({"event": "config_changed", "fields": {k: list(v) for k, v in diff.items()}})
        rows = [r for r in _read_rows(out / METRICS_FILE) if r["step"] <= start]
        _rewrite_rows(out / METRICS_FILE, rows)

    history_train = [r for r in rows if r.get("split") == "train"]
    history_eval = [r for r in rows if r.get("split") == "eval"]
    metrics_file = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        metrics_file = open(out / METRICS_FILE, "a" if resumed_from is not None else "w")

    def writeback() -> None:
        """Point the model/optimizer Variables at the carry's current arrays."""
        if any(getattr(x, "is_deleted", lambda: False)() for x in carry["state"]):
            return
        nnx.update(objs, flat.tree(carry["state"]))

    def write_row(row: dict) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps(row) + "\n")
            metrics_file.flush()

    def host_sync() -> dict:
        """Fetch the small loop/bad scalars; raise NonFiniteLossError if an update went bad."""
        host = jax.device_get({"loop": carry["loop"], "bad": carry["bad"]})
        bad_step = int(host["bad"]["step"])
        if bad_step >= 0:
            writeback()
            raise NonFiniteLossError(
                bad_step,
                float(host["bad"]["loss"]),
                float(host["bad"]["grad_norm"]),
                ckpt.latest_step(ckdir) if ckdir is not None else None,
            )
        return host["loop"]

    step_fn = _fit_step_for(loss_fn, graphdef, flat, schedule, metric_names)
    emit({"event": "start", "step": start, "steps": cfg.steps, "resumed_from": resumed_from})

    k = start
    last_log_time = time.time()
    try:
        for i in range(start, cfg.steps):
            batch = first_batch if i == 0 else batch_fn(i)
            carry = step_fn(carry, put(batch))
            k = i + 1
            final = k == cfg.steps
            do_log = k % cfg.log_every == 0 or final
            do_eval = eval_fn is not None and (
                (cfg.eval_every and k % cfg.eval_every == 0) or final
            )
            do_ckpt = ckdir is not None and (
                (cfg.checkpoint_every and k % cfg.checkpoint_every == 0) or final
            )
            if not (do_log or do_eval or do_ckpt):
                continue
            loop = host_sync()
            if callback is not None or do_eval:
                writeback()  # callbacks and eval_fn see the model holding the current state
            now = time.time()
            lr = float(loop["lr"])
            if do_log:
                n = max(int(loop["count"]), 1)
                row = {
                    "step": k,
                    "split": "train",
                    "loss": float(loop["loss_sum"]) / n,
                    "metrics": {m: float(v) / n for m, v in loop["metric_sums"].items()},
                    "grad_norm": float(loop["grad_norm_sum"]) / n,
                    "lr": lr,
                    "wall_time": now,
                    "elapsed_s": now - t_start,
                    "steps_per_s": n / max(now - last_log_time, 1e-9),
                }
                last_log_time = now
                carry["loop"] = _zeros_loop(metric_names)
                history_train.append(row)
                write_row(row)
                emit({"event": "log", **row})
            if do_eval:
                result = dict(eval_fn(model))
                try:
                    values = {m: float(v) for m, v in result.items()}
                except (TypeError, ValueError) as e:
                    raise TypeError(
                        f"eval_fn: expected to return dict[str, float], got {result!r}"
                    ) from e
                now = time.time()
                row = {
                    "step": k,
                    "split": "eval",
                    "loss": values.get("loss"),
                    "metrics": values,
                    "lr": lr,
                    "wall_time": now,
                    "elapsed_s": now - t_start,
                }
                history_eval.append(row)
                write_row(row)
                emit({"event": "eval", **row})
            if do_ckpt:
                meta = {**metadata, "train_config": asdict(cfg)}
                path = ckpt.save(ckdir, k, saved_tree(carry), meta, keep=cfg.keep_checkpoints)
                emit({"event": "checkpoint", "step": k, "path": str(path)})
    finally:
        writeback()
        if metrics_file is not None:
            metrics_file.close()

    history = History(
        train=history_train,
        eval=history_eval,
        step=k,
        resumed_from=resumed_from,
        out_dir=out,
        checkpoints_skipped=skipped,
        checkpoints_moved_aside=moved_aside,
        checkpoint_stray_files=stray,
    )
    if out is not None:
        if available("matplotlib"):
            _plot_curves(history, out / CURVES_FILE)
        else:  # the run's results are complete without it; say so rather than fail after training
            emit({"event": "plot_skipped", "path": str(out / CURVES_FILE),
                  "reason": "matplotlib is not installed: pip install 'jax-scan-rnn[plot]'"})
    emit({"event": "end", "step": k, "elapsed_s": time.time() - t_start})
    return history


# ------------------------------------------------------------------------------------------- plots


def _plot_curves(history: History, path: Path) -> None:
    """Loss (train and eval), learning rate and every metric against the step, as one PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is slow to import
    from matplotlib.figure import Figure

    names: list[str] = []
    for r in history.train + history.eval:
        for m in r.get("metrics", {}):
            if m != "loss" and m not in names:
                names.append(m)
    panels = ["loss", "lr", "grad_norm", *names]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.5 * ncols, 3.2 * nrows))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.1, top=0.92, wspace=0.25, hspace=0.45)
    FigureCanvasAgg(fig)
    for idx, key in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, idx + 1)
        for split in ("train", "eval"):
            xs, ys = history.series(key, split)
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
            if pts and not (split == "eval" and key in ("lr",)):
                ax.plot(*zip(*pts), label=split, marker="." if len(pts) < 30 else None)
        if key == "loss":
            vals = [y for s in ("train", "eval") for y in history.series(key, s)[1] if y is not None]
            if vals and min(vals) > 0:
                ax.set_yscale("log")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines and key != "lr":
            ax.legend(fontsize="small")
    fig.savefig(path, dpi=90)


def restore_model(out_dir: str | os.PathLike, model: nnx.Module, step: int | None = None) -> ckpt.Restored:
    """Load the model part of a `fit` checkpoint under `out_dir` into `model` (in place).

    The model must have the structure it was trained with (rebuild it from the checkpoint's metadata
    first). The optimiser state is not needed and not loaded. Returns the `Restored` record (step,
    metadata, path).
    """
    restored = ckpt.restore(Path(out_dir) / CHECKPOINT_DIR, step)
    names, leaves, treedef = ckpt.named_leaves(nnx.state(model), "model")
    values = []
    for name, leaf in zip(names, leaves):
        key = f"train_state/model/{name}"
        if key not in restored.state:
            raise ckpt.CheckpointError(f"checkpoint {restored.path}: no model leaf {name!r} (a different model?)")
        value = restored.state[key]
        if tuple(np.shape(value)) != tuple(np.shape(leaf)):
            raise ckpt.CheckpointError(
                f"checkpoint {restored.path}: leaf {name!r} has shape {tuple(np.shape(value))}, "
                f"the model expects {tuple(np.shape(leaf))}"
            )
        values.append(value)
    nnx.update(model, jax.tree.unflatten(treedef, values))
    return restored
