"""The training engine shared by every model: the optimiser, one pure jitted train step, and `fit`.

Contract with models (`loss_fn`) and data (`batch_fn`)::

    loss_fn(model, batch) -> (loss, metrics)   # loss: scalar; metrics: dict[str, scalar]
    batch_fn(step) -> batch                     # pytree of arrays; a PURE function of the step index

`batch_fn(i)` feeds update number `i + 1`: rows and checkpoints labelled `step = k` are taken after `k`
updates, and a run resumed from checkpoint `k` continues with `batch_fn(k)`. Because the data is a function
of the step and the whole training state (parameters, optimiser state, the model's rng streams such as
`nnx.Dropout`'s, the metric window) is checkpointed, a resumed run is bit-for-bit identical to an
uninterrupted one (on the same machine and backend: each checkpoint records `environment()`, and a resume
under another says so).

`TrainStep` is that update: `carry = step(carry, batch)`, one `jax.jit` of a pure function over plain arrays
(the model and its `nnx.Optimizer` split once; the carry donated). Passing a flat list of arrays keeps jit's
argument handling on its C++ fast path; `nnx.jit` or an `nnx.State` argument walks the graph in Python on
every call, which costs more than a small model's update (measurements: docs/measurements.md#train-step).

Non-finite updates: the step checks the loss, the gradient norm and every updated floating state leaf on the
device. The first bad update is recorded in the carry and the carry is frozen from then on (a `lax.cond`
keeps the old state), so no NaN reaches the parameters, the optimiser or a checkpoint. The host reads the
flag only when it syncs anyway (logging, evaluation, checkpointing), so dispatch stays asynchronous; then
`NonFiniteLossError` names the first bad step, and the model holds the state from just before it.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import _signal
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_scan_rnn import checkpoint as ckpt
from jax_scan_rnn import validate, xla_flags
from jax_scan_rnn.compiled import mode_flags
# Defined in configs/train.py, which imports no JAX (the CLI builds its flags from it first); `fit`'s users keep
# reading them here
from jax_scan_rnn.configs.train import COMMAND_DEFAULTS, TrainConfig, command_config, default_warmup
from jax_scan_rnn.distributed import put_batch, replicated_over
from jax_scan_rnn.lock import run_lock
from jax_scan_rnn.optional import available
from jax_scan_rnn.runlog import CHECKPOINT_DIR, CURVES_FILE, METRICS_FILE, History, RunLog, plot_curves, read_rows
from jax_scan_rnn.schedules import make_lr_schedule

__all__ = ["TrainConfig", "COMMAND_DEFAULTS", "command_config", "default_warmup", "History", "NonFiniteLossError",
           "TrainingStopped", "make_optimizer", "make_lr_schedule_for", "MANY_BATCH_SHAPES", "global_norm",
           "clip_by_global_norm", "TrainStep", "make_eval_fn", "fit", "earlier_run", "restore_model", "METRICS_FILE",
           "CURVES_FILE", "CHECKPOINT_DIR"]

Array = jax.Array
Batch = Any  # a pytree of arrays
LossFn = Callable[[nnx.Module, Batch], tuple[Array, Mapping[str, Array]]]

# Distinct batch shapes (and dtypes) a `TrainStep` compiles for before it warns: jax.jit compiles the step once per
# shape, ~1 s each for a small LSTM on a CPU, so batches of a new shape every step train at compile speed. The
# VAE task's length buckets (multiples of 8) give 8 shapes at its default max_length and 32 only past 250.
MANY_BATCH_SHAPES = 32


def environment() -> dict[str, Any]:
    """What a run's last bits depend on beyond its settings, data and state: this package's, JAX's and jaxlib's
    versions, the backend, the device kind and count, and 64-bit mode (`JAX_ENABLE_X64`: optax's schedule and
    Adam's bias correction then compute in float64). `fit` saves it with every checkpoint; a resume under another
    continues (it is the same run, trained on) but not bit for bit as the uninterrupted run, and says so."""
    import jaxlib

    from jax_scan_rnn import __version__

    return {"jax_scan_rnn": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
            "devices": jax.device_count(), "jax_enable_x64": bool(jax.config.jax_enable_x64)}


# The metadata keys `fit` adds to every checkpoint (a caller's own metadata may not use them).
RESERVED_METADATA = ("train_config", "logged_metrics", "environment")

# The TrainConfig fields that only make_optimizer reads: fit(optimizer=...) refuses a changed one.
OPTIMIZER_FIELDS = ("learning_rate", "warmup_steps", "lr_schedule", "final_lr_fraction", "clip_norm", "weight_decay")


class NonFiniteLossError(RuntimeError):
    """Training produced a non-finite loss, gradient norm or updated state at `step` (1-based update number)."""

    def __init__(self, step: int, loss: float, grad_norm: float, last_checkpoint: int | None, why: str = ""):
        self.step = step  # the first bad update (computed from batch_fn(step - 1))
        self.loss = loss
        self.grad_norm = grad_norm
        self.last_checkpoint = last_checkpoint  # newest checkpoint step on disk (kept untouched), or None
        # A finite loss and gradient can still give a non-finite update (an overflowing learning rate).
        what = ("loss" if not math.isfinite(loss) else "gradient norm" if not math.isfinite(grad_norm)
                else "parameters or optimizer state after the update")
        kept = (f"the last good checkpoint (step {last_checkpoint}) is kept" if last_checkpoint is not None
                else "no checkpoint was written")
        super().__init__(
            f"non-finite {what} at step {step} (the update computed from batch_fn({step - 1})): loss={loss!r}, "
            f"grad_norm={grad_norm!r}; training stopped, the model holds the parameters after step {step - 1}, "
            f"and {kept}{why}")


# Adam(W)'s state takes the parameters' dtype: in float16 a squared gradient below ~2.4e-4 is 0, and so is its
# eps=1e-8, so the first update divides 0 by 0 (a finite loss and gradient, a NaN parameter).
FLOAT16_ADAM = ("; the parameters are float16, where Adam's squared gradients and its eps (1e-8) round to 0 (0/0): "
                "train float32 parameters with compute_dtype=jnp.float16, or bfloat16 ones")


class TrainingStopped(Exception):
    """`fit` stopped before `cfg.steps` because its `stop()` said so (the CLI's: a SIGTERM, which a cluster's
    scheduler sends before it preempts a job), after writing a checkpoint of the update it had reached."""

    def __init__(self, step: int, checkpoint: Path | None):
        self.step = step  # the last update done
        self.checkpoint = checkpoint  # its checkpoint, or None without an out_dir
        super().__init__(f"stopped as asked at step {step}; " + (
            f"its checkpoint {checkpoint} is written: resuming continues from it" if checkpoint is not None
            else "nothing was written (no out_dir)"))


def _stop_now(stop: Callable[[], bool] | None, k: int, cfg: TrainConfig) -> bool:
    """Whether `fit` stops after update `k`. Several processes must stop (and checkpoint) at one step, or the
    others wait at the checkpoint's barriers: they agree at log steps (`cfg.log_every`) with one collective there,
    any process's request stopping all; one process asks every update (reading a flag)."""
    if stop is None:
        return False
    if jax.process_count() == 1:
        return bool(stop())
    if k % cfg.log_every:
        return False
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray(bool(stop())))))


def make_lr_schedule_for(cfg: TrainConfig) -> optax.Schedule:
    """The learning-rate schedule of `cfg` (a function of the optax update count, 0-based)."""
    validate.instance("cfg", cfg, TrainConfig)
    return make_lr_schedule(cfg.lr_schedule, peak=cfg.learning_rate, steps=cfg.steps,
                            warmup_steps=cfg.warmup_steps, final_fraction=cfg.final_lr_fraction)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """`clip_by_global_norm(clip_norm)` (if set) then Adam, or AdamW (decoupled weight decay on all
    parameters) when `weight_decay > 0`, with the learning-rate schedule of `cfg`."""
    schedule = make_lr_schedule_for(cfg)
    opt = optax.adamw(schedule, weight_decay=cfg.weight_decay) if cfg.weight_decay > 0 else optax.adam(schedule)
    return opt if cfg.clip_norm is None else optax.chain(clip_by_global_norm(cfg.clip_norm), opt)


def global_norm(tree: Any) -> Array:
    """sqrt(sum of squares) of every element of `tree`, in float32: one dot product of the leaves concatenated.

    `optax.tree.norm` reduces each leaf apart, and XLA:CPU compiles every reduction as kernels of its own, so
    this form compiles sooner (measured: docs/measurements.md, "Train step"). The same float32 squares, added in
    another order."""
    leaves = [jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(tree)]
    if not leaves:
        return jnp.float32(0)
    flat = jnp.concatenate(leaves)
    return jnp.sqrt(jnp.vdot(flat, flat))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm(max_norm)` (the same rule: unchanged below `max_norm`, else scaled to it) over
    `global_norm`, the norm `TrainStep` records: XLA then computes it once for both. Written here only for that:
    optax's own norm is a reduction per leaf, which XLA does not share with `global_norm`'s."""
    max_norm = validate.real("max_norm", max_norm, lo=0, lo_open=True)

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        return jax.tree.map(lambda g: jax.lax.select(norm < max_norm, g, g / norm.astype(g.dtype) * max_norm),
                            updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def _check_loss_output(out: Any) -> tuple[Array, dict[str, Array]]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"loss_fn: expected to return (loss, metrics: dict[str, scalar]), got {type(out).__name__}")
    loss, metrics = out
    if jnp.shape(loss) != () or not jnp.issubdtype(jnp.result_type(loss), jnp.floating):
        raise ValueError(f"loss_fn: expected a scalar floating loss, got shape {jnp.shape(loss)} "
                         f"dtype {jnp.result_type(loss)}")
    metrics = {} if metrics is None else metrics
    if not isinstance(metrics, Mapping):
        raise TypeError(f"loss_fn: expected metrics as a dict[str, scalar], got {type(metrics).__name__}")
    # make_eval_fn's {"loss": loss, **metrics}: another value under 'loss' would stand in for the loss in eval rows.
    # The loss itself given again (`return loss, {"loss": loss}`) is the same number: accepted, as before.
    if "loss" in metrics and metrics["loss"] is not loss:
        raise ValueError("loss_fn: expected metrics without a 'loss' key (the loss is the first value returned, and "
                         "evaluation reports it as 'loss'), got one; name that metric otherwise")
    for k, v in metrics.items():
        if isinstance(v, (Mapping, list, tuple)):  # jnp.shape reads a list or a dict of scalars as an array
            raise ValueError(f"loss_fn: expected metrics as dict[str, scalar], got key {k!r} with a "
                             f"{type(v).__name__}")
        if not isinstance(k, str) or jnp.shape(v) != ():
            raise ValueError(f"loss_fn: expected metrics as dict[str, scalar], got key {k!r} with shape {jnp.shape(v)}")
    return loss, dict(metrics)


def _key_impl(x: Any) -> str | None:
    dtype = getattr(x, "dtype", None)  # None: a Python scalar in an nnx.Variable (jit takes it as an array)
    if dtype is None or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    return str(jax.random.key_impl(x))


class TrainStep:
    """One optimiser update of `model` on `loss_fn`, as a pure jitted function: `carry = step(carry, batch)`.

        step = TrainStep(model, loss_fn, make_optimizer(cfg), batch_fn(0))
        carry = step.init()
        for i in range(n):
            carry = step(carry, batch_fn(i))
        print(step.read(carry)["window"])   # sums over the updates since init / the last reset
        carry = step.reset(carry)
        step.write(carry)            # the model (and step.optimizer) now hold the trained state

    `carry` is a dict of plain arrays: `state` (the model's and optimiser's state leaves, typed PRNG keys as
    their key data), `window` (on-device sums since init or the last `reset`: count, loss, gradient norm, every metric,
    and the latest learning rate) and `bad` (the first non-finite update: step -1 while there was none). The
    carry is donated: use only the returned one. A Ctrl-C (SIGINT) during a call is held until the update is done
    and its carry kept as `step.latest` (the newest carry `init`, a call or `reset` made), then raised: the
    assignment `carry = step(...)` never happens, so after a KeyboardInterrupt continue from, or write,
    `step.latest` (`write` refuses a donated carry, naming it). A call installs the handler that holds it wherever
    Python's own is in place, and `write` puts Python's back (docs/measurements.md#ctrl-c-during-a-train-step).
    Variables shared inside the model (tied weights) stay shared (`nnx.split` stores them once). `batch` is an
    example batch, traced once to learn the metric names.

    Each new batch shape or dtype compiles the step again (as `jax.jit` does); past `MANY_BATCH_SHAPES` of them a
    call warns once: pad or bucket batches to a few fixed shapes.
    """

    def __init__(self, model: nnx.Module, loss_fn: LossFn, tx: optax.GradientTransformation | optax.MultiSteps,
                 batch: Batch, schedule: optax.Schedule | None = None):
        validate.instance("model", model, nnx.Module)
        self.loss_fn = validate.function("loss_fn", loss_fn)
        if isinstance(tx, optax.MultiSteps):  # optax's gradient accumulation: an object holding the transformation
            tx = tx.gradient_transformation()
        validate.instance("tx", tx, optax.GradientTransformation)
        self.extra_args = isinstance(tx, optax.GradientTransformationExtraArgs)
        self.schedule = schedule
        # The optimiser's state built by one compiled `tx.init` instead of eager ops, each of which compiles a
        # program of its own on first use: quicker in a fresh process (docs/measurements.md, "Train step").
        options = xla_flags.compiler_options()
        init = jax.jit(tx.init, compiler_options=options)
        self.optimizer = nnx.Optimizer(model, tx._replace(init=init), wrt=nnx.Param)  # same class, same update
        self.objs = {"model": model, "optimizer": self.optimizer}
        self.graphdef, state = nnx.split(self.objs)
        leaves, self.treedef = jax.tree.flatten(state)
        self.key_impls = [_key_impl(x) for x in leaves]

        def probe(raw, batch):
            return _check_loss_output(loss_fn(self._merge(raw)["model"], batch))

        self.metric_names = sorted(jax.eval_shape(probe, self._raw(leaves), batch)[1])
        self.batch_shapes: set = set()  # the batch signatures the step was traced for (a trace-time record)
        self._shapes_warning: str | None = None  # set by the trace that passes MANY_BATCH_SHAPES; warned once
        self.latest: dict | None = None  # the newest carry init, a call or reset made
        self._step = jax.jit(self._update, donate_argnums=0, compiler_options=options)
        # One program for `write`'s copies: it runs on every process, where the arrays span them all (an eager
        # device_put of a global array is refused).
        self._copy = jax.jit(lambda leaves: [jnp.copy(x) for x in leaves])

    def _value_fn(self, model: nnx.Module, batch: Batch) -> Callable[[Any], jax.Array]:
        """The loss on `batch` as a function of the parameters (the pure arrays `tx.update` is given), the model's
        other state as it is now: `value_fn(params)` draws the step's own dropout masks, so it gives the step's loss
        at the step's parameters, and leaves the model as it was. Unused, it compiles to nothing."""
        graphdef, _, rest = nnx.split(nnx.clone(model), nnx.Param, ...)  # a copy: the step's call advances the rng

        def value_fn(params):
            return _check_loss_output(self.loss_fn(nnx.merge(graphdef, params, rest, copy=True), batch))[0]

        return value_fn

    def _raw(self, leaves) -> list:
        return [jax.random.key_data(x) if k else x for x, k in zip(leaves, self.key_impls)]

    def tree(self, raw) -> nnx.State:
        """The `nnx.State` of {"model", "optimizer"} held by the carry's `state` list."""
        leaves = [jax.random.wrap_key_data(x, impl=k) if k else x for x, k in zip(raw, self.key_impls)]
        return jax.tree.unflatten(self.treedef, leaves)

    def _merge(self, raw) -> dict:
        return nnx.merge(self.graphdef, self.tree(raw))

    def raw_state(self) -> list:
        """The model's and optimiser's current state as the carry's `state` list (keys as their data)."""
        return self._raw(jax.tree.leaves(nnx.state(self.objs)))

    def init(self, sharding: jax.sharding.Sharding | None = None, state_sharding: Any = None) -> dict:
        """A carry holding copies of the model's and optimiser's current state, every array placed with
        `sharding` (e.g. replicated over a data-parallel mesh; on several processes it must span them all), the
        state with `state_sharding` instead when given (one sharding per `raw_state` leaf)."""
        raw = [jax.device_put(x, may_alias=False) for x in self.raw_state()]
        zero = np.float32(0)  # host NumPy values: placing them compiles nothing, unlike jnp.zeros
        window = {"count": np.int32(0), "loss": zero, "grad_norm": zero, "lr": zero,
                  "metrics": {k: zero for k in self.metric_names}}
        bad = {"step": np.int32(-1), "loss": zero, "grad_norm": zero}
        window = jax.device_put(window, sharding)
        # Zeros that depend on no input get no sharding of their own on several processes: pin the given one
        # (pinning an unplaced window's would change the step's input signature: one more compilation).
        # Compiled here, so that no compilation lands inside the first logged window's timing.
        pinned = None if sharding is None else jax.tree.map(lambda x: x.sharding, window)
        self._zero = jax.jit(lambda tree: jax.tree.map(jnp.zeros_like, tree), out_shardings=pinned).lower(window).compile()
        state_sharding = sharding if state_sharding is None else state_sharding
        self.latest = {"state": raw if state_sharding is None else jax.device_put(raw, state_sharding),
                       "window": window, "bad": jax.device_put(bad, sharding)}
        return self.latest

    def read(self, carry: dict) -> dict:
        """The window's sums and the NaN record as host values (this waits for the steps dispatched so far)."""
        return jax.device_get({"window": carry["window"], "bad": carry["bad"]})

    def reset(self, carry: dict) -> dict:
        """The carry with its window zeroed on the device: same placement, no host-to-device transfer (which
        on several processes would be a collective)."""
        self.latest = {**carry, "window": self._zero(carry["window"])}
        return self.latest

    def __call__(self, carry: dict, batch: Batch) -> dict:
        # The carry is donated: a Ctrl-C raised as the call returns would lose both. Held until the new one is kept.
        held = threading.get_ident() == _SIGINT_THREAD and _SIGINT.hold()
        if not held:  # another thread's step (no signal reaches it), or another handler than Python's
            self.latest = carry = self._step(carry, batch)
        else:
            _SIGINT.in_step = True
            try:
                self.latest = carry = self._step(carry, batch)
            except BaseException:
                _SIGINT.pending = False  # the step's own error, not a Ctrl-C held during it
                raise
            finally:
                _SIGINT.in_step = False
            if _SIGINT.pending:
                _SIGINT.pending = False
                raise KeyboardInterrupt
        if self._shapes_warning:  # one attribute test per call: the record is made when jit traces
            warnings.warn(self._shapes_warning, UserWarning, stacklevel=validate.user_stacklevel())
            self._shapes_warning = ""  # "" (not None): warned, never again
        return carry

    def lower(self, carry: dict, batch: Batch) -> jax.stages.Lowered:
        """The step traced and lowered for this carry's and batch's shapes (arrays or `jax.ShapeDtypeStruct`s):
        `.compile()` gives `carry = compiled(carry, batch)`, the same update compiled ahead of time (the
        benchmark times its compilation apart from its steps)."""
        return self._step.lower(carry, batch)

    def write(self, carry: dict) -> None:
        """Set the model's and optimiser's Variables to copies of the carry's arrays: the carry is donated to the
        next step, and a model pointing at its buffers (or a clone of it, kept as the best weights so far) would
        then hold deleted arrays. A carry already donated is a ValueError (writing it did nothing, silently). Also
        a loop's end: Python's own Ctrl-C handler is put back (the loop's next call installs the holding one again)."""
        _SIGINT.uninstall()
        self._keep(carry)

    def _keep(self, carry: dict) -> None:
        """`write` without putting Python's Ctrl-C handler back: `fit`'s writes inside its loop."""
        if not _live(carry):
            newer = _live(self.latest)
            raise ValueError("carry: expected a carry whose arrays are live, got one donated to a later call of this "
                             "step" + (" (each call takes its carry's buffers): step.latest is the newest carry, e.g. "
                                       "after a Ctrl-C stopped `carry = step(carry, batch)` before the assignment"
                                       if newer else ", which failed: the model keeps the state last written"))
        nnx.update(self.objs, self.tree(self._copy(carry["state"])))

    def _update(self, carry: dict, batch: Batch) -> dict:
        leaves, treedef = jax.tree.flatten(batch)
        self.batch_shapes.add((treedef, tuple((x.shape, str(x.dtype)) for x in leaves)))
        if len(self.batch_shapes) > MANY_BATCH_SHAPES and self._shapes_warning is None:
            shapes = [list(x.shape) for x in leaves]
            self._shapes_warning = (
                f"batch: expected a few fixed shapes, got {len(self.batch_shapes)} different ones (this one's "
                f"arrays: {shapes[:4]}{' ...' if len(shapes) > 4 else ''}); each compiles the train step again, as "
                "jax.jit does: pad or bucket the batches (fit's batch_fn) to a few fixed shapes")
        old = carry["state"]
        objs = self._merge(old)
        done = objs["optimizer"].step[...]  # updates applied before this one

        def objective(model):
            return _check_loss_output(self.loss_fn(model, batch))

        value_fn = self._value_fn(objs["model"], batch) if self.extra_args else None  # before the call (its rng)
        (loss, metrics), grads = nnx.value_and_grad(objective, has_aux=True)(objs["model"])
        # What a transformation with extra arguments reads, as optax's own loops pass them: the batch's loss
        # (`value`: optax.contrib.reduce_on_plateau, polyak_sgd), its gradient, and `value_fn` (optax.lbfgs's line
        # search). A plain GradientTransformation's update takes none.
        extra = {} if value_fn is None else {"value": loss, "grad": grads, "value_fn": value_fn}
        objs["optimizer"].update(objs["model"], grads, **extra)
        with_path, treedef = jax.tree_util.tree_flatten_with_path(nnx.state(objs))
        if treedef != self.treedef:  # trace-time checks: a step must not change the state's layout
            # named by leaf: the two treedefs printed whole ran to thousands of characters for a small MLP
            before = ckpt.named_leaves(self.tree(old), "state")[0]
            after = ckpt.named_leaves(nnx.state(objs), "state")[0]
            added, removed = [n for n in after if n not in before], [n for n in before if n not in after]
            change = "; ".join([*([f"new leaves {validate.listed(added, 4)}"] if added else []),
                                *([f"leaves gone {validate.listed(removed, 4)}"] if removed else [])])
            change = change or "the same leaves in other Variable types"
            raise ValueError(f"loss_fn: expected the model's state structure to stay the same during a step, got "
                             f"{change} (create every Variable in __init__; take what a call sows in loss_fn with "
                             "nnx.pop(model, nnx.Intermediate) after the call)")
        new = self._raw([x for _, x in with_path])
        for (path, _), a, b in zip(with_path, new, old):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(f"loss_fn/optimizer: expected state leaf {jax.tree_util.keystr(path)} to keep "
                                 f"shape {b.shape} dtype {b.dtype} across a step, got {a.shape} {a.dtype}")
        loss, grad_norm = jnp.float32(loss), global_norm(grads)
        w = carry["window"]
        window = {"count": w["count"] + 1, "loss": w["loss"] + loss, "grad_norm": w["grad_norm"] + grad_norm,
                  "lr": jnp.float32(self.schedule(done) if self.schedule is not None else jnp.nan),
                  "metrics": {k: w["metrics"][k] + jnp.float32(metrics[k]) for k in self.metric_names}}
        # The updated state too: a finite loss and gradient can still overflow in the update (lr 1e300).
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        # One check per dtype over all its leaves, not one per leaf, and a sum (one reduction) rather than
        # all(isfinite) (a tree of them): XLA:CPU compiles each reduction as kernels of its own
        # (docs/measurements.md, "Train step"). x * 0 is nan exactly where x is inf or nan.
        flat: dict = {}
        for leaf in new:
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                flat.setdefault(leaf.dtype, []).append(leaf.ravel())
        for leaves in flat.values():
            ok &= jnp.isfinite(jnp.sum(jnp.concatenate(leaves) * 0))
        bad = carry["bad"]
        live = bad["step"] < 0
        first_bad = live & ~ok
        # One branch on one predicate, not a jnp.where per leaf: XLA copied the whole finite check into each
        # leaf's select: a larger program, slower to compile (docs/measurements.md, "Train step").
        state, window = jax.lax.cond(live & ok, lambda: (new, window), lambda: (old, w))
        return {"state": state, "window": window,
                "bad": {"step": jnp.where(first_bad, (done + 1).astype(jnp.int32), bad["step"]),
                        "loss": jnp.where(first_bad, loss, bad["loss"]),
                        "grad_norm": jnp.where(first_bad, grad_norm, bad["grad_norm"])}}


def make_eval_fn(loss_fn: LossFn, batches: list[Batch]) -> Callable[[nnx.Module], dict[str, float]]:
    """An `eval_fn` for `fit`: the mean of `loss` and of every metric over `batches` (equal weight per batch),
    as `{"loss": ..., **metrics}` Python floats. Jitted; the model is left untouched (rng counts included)."""
    batches = [validate.from_torch(b) for b in batches]  # torch tensors: copied to the host once, here
    if not batches:
        raise ValueError("batches: expected at least one evaluation batch, got none")
    validate.function("loss_fn", loss_fn)

    @functools.partial(jax.jit, compiler_options=xla_flags.compiler_options())
    def one(model, batch):  # the model is an argument (a pytree): state changes made inside are dropped
        loss, metrics = _check_loss_output(loss_fn(model, batch))
        return {"loss": loss, **metrics}

    def eval_fn(model: nnx.Module) -> dict[str, float]:
        validate.instance("model", model, nnx.Module)
        sums = functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), (one(model, b) for b in batches))
        return {k: float(v) / len(batches) for k, v in jax.device_get(sums).items()}

    return eval_fn


def _holding_out_dir(fit_fn: Callable) -> Callable:
    """Run `fit_fn` with its `out_dir` held (`lock.run_lock`) by the first process: one writer per run directory."""

    @functools.wraps(fit_fn)
    def wrapper(*args, **kwargs):
        out_dir = kwargs.get("out_dir")
        with run_lock(out_dir) if out_dir is not None and jax.process_index() == 0 else contextlib.nullcontext():
            return fit_fn(*args, **kwargs)

    return wrapper


@_holding_out_dir
def fit(model: nnx.Module, loss_fn: LossFn, batch_fn: Callable[[int], Batch], cfg: TrainConfig, *,
        out_dir: str | os.PathLike | None = None, eval_fn: Callable[[nnx.Module], Mapping[str, float]] | None = None,
        resume: bool = False, callback: Callable[[dict], None] | None = None,
        metadata: Mapping[str, Any] | None = None, data_sharding: jax.sharding.Sharding | None = None,
        state_sharding: jax.sharding.Sharding | None = None, stop: Callable[[], bool] | None = None,
        optimizer: optax.GradientTransformation | optax.MultiSteps | None = None) -> History:
    """Train `model` in place for `cfg.steps` updates of Adam(W) on `loss_fn` (or of `optimizer`), with `TrainStep`.

    Args:
      model: the NNX module; its `nnx.Param` are trained, every other state (rng streams, batch stats) is
        carried and checkpointed. It trains in the mode it is in, as a torch module does: a module is built in
        training mode, and one set to `model.eval()` trains without dropout and with BatchNorm's statistics
        frozen (call `model.train()` first, unless that is what you want). On return (or on any exception) it holds the latest state (for
        `NonFiniteLossError`: the state before the bad update; for a Ctrl-C, the state after the update in flight).
      loss_fn: `loss_fn(model, batch) -> (loss, metrics: dict[str, scalar])`, traced once.
      batch_fn: `batch_fn(i) -> batch` for update `i + 1`; must be a pure function of `i`. A batch is a pytree
        of NumPy, JAX or torch arrays (torch tensors are copied to the host, as `jsr.jit` takes them).
      cfg: the `TrainConfig`.
      out_dir: where `metrics.jsonl`, `curves.png` and `checkpoints/` go; None writes nothing.
      eval_fn: `eval_fn(model) -> dict[str, float]`, called every `cfg.eval_every` updates and at the end with
        the model holding the current state, in eval mode (`model.eval()`: no dropout, BatchNorm's running
        averages; as torch code calls `model.eval()` before evaluating), its modes restored after. State
        changes it makes are discarded (the carry is the source of truth), so evaluation never changes the
        training trajectory. The model's arrays are copies: a clone kept (the best weights so far) stays valid.
      resume: continue from the newest VALID checkpoint under `out_dir`. Resuming never deletes a checkpoint:
        invalid newer ones (corrupt, truncated, missing files, bad manifest) are reported in
        `History.checkpoints_skipped` and a `checkpoint_skipped` event, then moved aside
        (`checkpoint.set_aside`; `History.checkpoints_moved_aside`), where no later run reads, counts or prunes
        them. Files in the resumed checkpoint that its manifest does not list are left alone and reported
        (`History.checkpoint_stray_files`, a `checkpoint_stray_files` event). Rows of `metrics.jsonl` after
        the restored step are dropped so the log reads as one run. With no checkpoint, training starts from
        scratch (a log there is rewritten); so it does where no checkpoint has its manifest (the run was killed
        in its first save, before the manifest was written), those moved aside and reported as above. Without
        `resume`, an `out_dir` that holds an earlier run (`earlier_run`: checkpoints, or the log of a run that left
        none) is refused (ValueError): runs never mix, and no run's log is replaced unasked.
      callback: `callback(event: dict)` for progress (the library never prints). Events, each with an "event"
        key: start (step, steps, resumed_from), checkpoint_skipped (step, reason, moved_to),
        checkpoint_stray_files (step, path, files), config_changed (path, fields: {name: [saved, now]};
        without a callback, a warning), environment_changed (path, fields: {name: [saved, now]} of `environment()`:
        the resumed run goes on, but not bit for bit as the uninterrupted one; without a callback, a warning),
        metrics_changed (path, saved, now: `loss_fn`'s metric names; the log
        window restarts at the resume; without a callback, a warning), log (a
        train row), eval (an eval row), checkpoint (step, path), plot_skipped (path, reason), end (step,
        elapsed_s). During a callback the model holds the current state (between callbacks its arrays are
        donated to the next step: keep no references). An exception raised by the callback stops training.
      metadata: JSON-serialisable dict (string keys) stored in every checkpoint (e.g. the model config, so another
        process can rebuild the model); `train_config`, `logged_metrics` (the metric names of `loss_fn`) and
        `environment` (`environment()`) are added (and reserved).
      data_sharding: if given, every batch is placed with it (e.g. batch-sharded for data parallelism; on
        several processes each contributes the rows of its own devices, `distributed.put_batch`).
      state_sharding: if given, the training state is placed with it (e.g. replicated) before the loop. Default:
        none with no `data_sharding`, else replicated over `data_sharding`'s devices (`distributed.replicated_over`),
        but for arrays already placed over exactly those devices (a model sharded over a "model" axis): kept so.
      stop: `stop() -> bool`, asked after every update (with several processes: at log steps, all stopping when
        one asks); when it says True before the last update, `fit` writes a checkpoint of that update (with an
        `out_dir`) and raises `TrainingStopped`, so a preempted job loses no update: `resume=True` continues
        there, exactly as the uninterrupted run would have gone on.
      optimizer: an optax transformation of your own (SGD, a Lion, a chain with your clipping; one reading the loss,
        as `optax.contrib.reduce_on_plateau` and `optax.lbfgs` do, gets `value`, `grad` and `value_fn`; `optax.MultiSteps`
        to accumulate gradients, `cfg.steps` then counting batches, k per update of the parameters: make it a
        multiple of k, as batches after the last multiple are accumulated but never applied, which warns) instead of the
        Adam(W) `make_optimizer(cfg)` builds. `cfg`'s optimiser fields (`OPTIMIZER_FIELDS`: learning rate,
        warmup, schedule, clipping, weight decay) are then not read and must keep their defaults (ValueError
        naming one that does not), and the rows' `lr` is NaN (not known; null in `metrics.jsonl`). Resuming
        needs the same transformation: its state is in the checkpoint.

    While it runs, `fit` holds `out_dir` (`lock.run_lock`, on the first process of a multi-process run).

    Raises:
      NonFiniteLossError: at the first update whose loss, gradient norm or updated state is not finite.
      lock.RunDirectoryLocked: another process holds `out_dir`.
      checkpoint.CheckpointError: `resume` found checkpoints, but none valid (and one with its manifest).
      TrainingStopped: `stop()` said so; its checkpoint is written.
      ValueError: `resume` found a checkpoint whose state another model or optimiser saved (leaf names, shapes and
        dtypes must match), naming the first difference; or `batch_fn` raised StopIteration (its data ran out).
    """
    t_start = time.time()
    validate.instance("cfg", cfg, TrainConfig)
    validate.function("batch_fn", batch_fn)
    validate.function("eval_fn", eval_fn, none=True)
    validate.function("stop", stop, none=True)
    emit = validate.function("callback", callback, none=True) or _unheard
    if optimizer is not None:
        validate.instance("optimizer", optimizer, (optax.GradientTransformation, optax.MultiSteps))
        for field in TrainConfig.__dataclass_fields__.values():
            if field.name in OPTIMIZER_FIELDS and getattr(cfg, field.name) != field.default:
                raise ValueError(f"cfg.{field.name}: not read with optimizer= (set it in your optax transformation); "
                                 f"expected the default {field.default!r}, got {getattr(cfg, field.name)!r}")
    metadata = ckpt.check_metadata(metadata)  # now, not at the first checkpoint, checkpoint_every updates in
    for key in RESERVED_METADATA:
        if key in metadata:
            raise ValueError(f"metadata: expected no {key!r} key (fit adds it), got one")
    run_environment = environment()
    out, ckdir = _run_directories(out_dir, resume)

    def put(batch):
        batch = validate.from_torch(batch)  # a torch DataLoader's tensors: data, as jsr.jit takes them
        return batch if data_sharding is None else put_batch(batch, data_sharding)

    first_batch = _batch(batch_fn, 0, cfg.steps)
    own = optimizer is not None
    step = TrainStep(model, loss_fn, optimizer if own else make_optimizer(cfg), put(first_batch),
                     None if own else make_lr_schedule_for(cfg))
    state_sharding, placement = _state_placement(step, state_sharding, data_sharding)
    carry = step.init(state_sharding, placement)
    _warn_if_every_device_does_the_same(data_sharding, carry)
    writer = jax.process_index() == 0  # one process writes the log and the plot; every process checkpoints
    log = RunLog(out, write=writer)
    resumed: dict[str, Any] = {}
    if resume and ckpt.steps(ckdir):
        carry, resumed = _resume(step, carry, ckdir, cfg, emit, placement, run_environment)
        step.latest = carry  # what the finally below writes, should nothing follow
        log.resume_at(resumed["resumed_from"] or 0)
    start = resumed.get("resumed_from") or 0
    emit({"event": "start", "step": start, "steps": cfg.steps, "resumed_from": resumed.get("resumed_from")})
    k, last_log, last_k = start, time.time(), start
    said_no_gradient = False
    try:
        with log:
            for k in range(start + 1, cfg.steps + 1):
                batch = put(first_batch if k == 1 else _batch(batch_fn, k - 1, cfg.steps))
                carry = step(carry, batch)  # a Ctrl-C during it is raised once it is step.latest
                final = k == cfg.steps
                stopping = not final and _stop_now(stop, k, cfg)
                do_log = k % cfg.log_every == 0 or final
                do_eval = eval_fn is not None and ((cfg.eval_every and k % cfg.eval_every == 0) or final)
                do_ckpt = ckdir is not None and ((cfg.checkpoint_every and k % cfg.checkpoint_every == 0) or final
                                                 or stopping)
                if not (do_log or do_eval or do_ckpt or stopping):
                    continue
                host = step.read(carry)
                if host["bad"]["step"] >= 0:
                    raise _non_finite(host["bad"], model, own, ckdir)
                step._keep(carry)  # callbacks and eval_fn see the model holding the current state
                now, window = time.time(), host["window"]
                times = {"lr": float(window["lr"]), "wall_time": now, "elapsed_s": now - t_start}
                if do_log:
                    n = max(int(window["count"]), 1)
                    if float(window["grad_norm"]) == 0 and window["count"] > 0 and not said_no_gradient:
                        said_no_gradient = _warn_no_gradient(k, int(window["count"]))
                    emit({"event": "log", **log.add({
                        "step": k, "split": "train", "loss": float(window["loss"]) / n,
                        "metrics": {m: float(v) / n for m, v in window["metrics"].items()},
                        "grad_norm": float(window["grad_norm"]) / n, **times,
                        # the steps of this process since the last row: after a resume, the restored window's
                        # count includes updates made before the interruption
                        "steps_per_s": (k - last_k) / max(now - last_log, 1e-9)})})
                    carry, last_log, last_k = step.reset(carry), now, k
                if do_eval:
                    with _eval_mode(model):
                        values = _eval_values(eval_fn(model))
                    now = time.time()
                    emit({"event": "eval", **log.add({"step": k, "split": "eval", "loss": values.get("loss"),
                                                      "metrics": values, "lr": times["lr"], "wall_time": now,
                                                      "elapsed_s": now - t_start})})
                if do_ckpt:
                    path = ckpt.save(ckdir, k, {"train_state": step.tree(carry["state"]), "loop": carry["window"]},
                                     {**metadata, "train_config": asdict(cfg), "logged_metrics": step.metric_names,
                                      "environment": run_environment},
                                     keep=cfg.keep_checkpoints)
                    emit({"event": "checkpoint", "step": k, "path": str(path)})
                if stopping:
                    raise TrainingStopped(k, None if ckdir is None else ckpt.step_path(ckdir, k))
    finally:  # step.latest: the carry, or the one a step interrupted by a Ctrl-C made
        _SIGINT.uninstall()
        if _live(step.latest):  # (not after a step that failed once it took the carry: the model keeps its state)
            step._keep(step.latest)
    _warn_unapplied(step.optimizer.opt_state, cfg.steps)
    history = log.history(step=k, out_dir=out, **resumed)
    if log.write and available("matplotlib"):
        plot_curves(history, out / CURVES_FILE)
    elif log.write:  # the run's results are complete without it; say so rather than fail after training
        emit({"event": "plot_skipped", "path": str(out / CURVES_FILE),
              "reason": "matplotlib is not installed: pip install 'jax-scan-rnn[plot]'"})
    emit({"event": "end", "step": k, "elapsed_s": time.time() - t_start})
    return history


def _run_directories(out_dir: str | os.PathLike | None, resume: bool) -> tuple[Path | None, Path | None]:
    """`(out, its checkpoint directory)` for `fit`'s `out_dir` (both None without one), checked before any work."""
    out = Path(out_dir) if out_dir is not None else None
    if resume and out is None:
        raise ValueError("out_dir: expected a directory when resume=True, got None")
    ckdir = out / CHECKPOINT_DIR if out is not None else None
    if ckdir is not None and ckdir.exists() and not ckdir.is_dir():  # found at the first save, the log already replaced
        raise ValueError(f"out_dir: expected {ckdir} to be the run's checkpoint directory, got a file; move it away or "
                         "choose another directory")
    if out is not None and not resume and earlier_run(out):
        raise ValueError(f"out_dir: expected no earlier run when resume=False, got {earlier_run(out)}; pass "
                         "resume=True to continue that run or choose another out_dir")
    return out, ckdir


def _state_placement(step: TrainStep, state_sharding: Any, data_sharding: Any) -> tuple[Any, Any]:
    """`(state_sharding, placement)` for `TrainStep.init`: `fit`'s `state_sharding`, checked against the state's
    arrays, or with only a `data_sharding` the state replicated over its devices (placement: one sharding per
    state leaf)."""
    placement = state_sharding
    spec = getattr(state_sharding, "spec", None)  # a NamedSharding's: it places each array's leading len(spec) axes
    if spec is not None:  # JAX's error (a rank, for a scalar) names no state leaf nor fit's argument
        names, leaves, _ = ckpt.named_leaves(nnx.state(step.objs), "state")
        short = [name for name, x in zip(names, leaves) if np.ndim(x) < len(spec)]
        if short:
            raise ValueError(f"state_sharding: expected a sharding every state array can take (the whole state on "
                             f"each device: DataParallel.replicated), got {spec}, which needs {len(spec)} or more "
                             f"axes, and leaves with fewer: {validate.listed(short, 3)}")
    if data_sharding is not None and state_sharding is None:
        # Left unplaced, a fresh state is replicated by the first step's jit, but a resumed one is restored onto
        # this process's first device, where the step refuses it beside a batch on several: place both alike,
        # replicated over the batch's devices, but for a leaf already spread over them (a model sharded over
        # another axis of the batch's mesh), which keeps its placement (replicated, it may no longer fit).
        state_sharding = replicated_over(data_sharding)
        placement = [x.sharding if _spread_over(x, data_sharding) else state_sharding for x in step.raw_state()]
    return state_sharding, placement


def _warn_if_every_device_does_the_same(data_sharding: Any, carry: dict) -> None:
    """A batch and a state both whole on every device (DataParallel's .replicated given for .data): no error, the
    same numbers, and every device doing the one device's work."""
    if (data_sharding is not None and len(data_sharding.device_set) > 1 and data_sharding.is_fully_replicated
            and all(x.sharding.is_fully_replicated for x in carry["state"])):
        warnings.warn(f"data_sharding: expected a sharding that splits the batch, got one that gives each of its "
                      f"{len(data_sharding.device_set)} devices the whole batch, beside the whole state: every device "
                      "computes the same update (DataParallel.data splits the batch axis)", UserWarning,
                      stacklevel=validate.user_stacklevel())


def _non_finite(bad: dict, model: nnx.Module, own_optimizer: bool, ckdir: Path | None) -> NonFiniteLossError:
    """The error for the first update the step found not finite (`bad`: its step, loss and gradient norm)."""
    loss, grad_norm = float(bad["loss"]), float(bad["grad_norm"])
    float16 = any(p.dtype == jnp.float16 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    why = FLOAT16_ADAM if float16 and not own_optimizer and math.isfinite(loss + grad_norm) else ""
    return NonFiniteLossError(int(bad["step"]), loss, grad_norm, ckpt.latest_step(ckdir) if ckdir else None, why)


def _warn_no_gradient(k: int, count: int) -> bool:
    """Nothing trains, and nothing else says so: a loss_fn calling a model from its enclosing scope (a constant to
    jit) instead of its argument, or weights that are not nnx.Param. Returns True: said (once per run)."""
    warnings.warn(f"fit: the gradient of the loss with respect to the model's nnx.Param was 0 in updates "
                  f"{k - count + 1}-{k}, the loss did not train them: does loss_fn call the model it is given (its "
                  "first argument), not one from the enclosing scope, and are the weights nnx.Param?", UserWarning,
                  stacklevel=validate.user_stacklevel())
    return True


class _SigintHold:
    """Ctrl-C (SIGINT) held while a train step is in flight, and raised once its new carry is kept (`TrainStep.latest`).

    The step donates its input carry, and Python raises a KeyboardInterrupt as the step's call returns, before
    `carry = step(carry, batch)` assigns: the old carry and the new one were lost alike. In a loop of one's own
    nearly every Ctrl-C landed there, and the model kept its initial weights; `fit` found deleted arrays and kept
    the state of its last log row, eval or checkpoint.

    A step installs the holding handler in place of Python's own (only there: another's is left alone), and each
    step looks again (one `getsignal`): a host may put Python's back between two steps of one loop, as
    Jupyter's kernel does before each cell. Outside a step it raises at once, as Python's does. `TrainStep.write`
    (a loop's end) and the end of `fit` put Python's back. Not installed per call: two signal calls a step cost up
    to a quarter of the smallest step (docs/measurements.md#ctrl-c-during-a-train-step). One per process
    (`_SIGINT`), used from the main thread only (signals reach it alone)."""

    def __init__(self) -> None:
        self.handler = self._handler  # one bound method: what `signal.getsignal` gives back while it is installed
        self.previous: Any = None  # Python's handler, while this one is installed
        self.in_step = False  # the main thread is inside a step's call: hold the interrupt
        self.pending = False

    def hold(self) -> bool:
        """Whether a SIGINT during the step about to run is held: this handler installed, or installed now in place
        of Python's own."""
        # The C function `signal.getsignal` wraps: 13 ns a call here, against ~2 us for its enum conversion.
        current = _signal.getsignal(signal.SIGINT)
        if current is self.handler:
            return True
        if current is not signal.default_int_handler:
            return False
        self.previous = signal.signal(signal.SIGINT, self.handler)
        return True

    def uninstall(self) -> None:
        if threading.get_ident() != _SIGINT_THREAD:  # only the main thread installs it, and can put one back
            return
        if self.previous is not None and _signal.getsignal(signal.SIGINT) is self.handler:  # (not one set since)
            signal.signal(signal.SIGINT, self.previous)
        self.previous, self.pending = None, False

    def _handler(self, signum: int, frame: Any) -> None:
        if not self.in_step:
            raise KeyboardInterrupt
        self.pending = True


_SIGINT = _SigintHold()
_SIGINT_THREAD = threading.main_thread().ident  # the thread Python runs signal handlers in


def _live(carry: dict | None) -> bool:
    """Whether `carry`'s arrays still hold data (not donated to a later step)."""
    return carry is not None and not any(x.is_deleted() for x in carry["state"])


def _warn_unapplied(opt_state: Any, steps: int) -> None:
    """optax.MultiSteps applies the mean gradient of every k batches: batches past the last multiple of k are
    accumulated and never applied, which the loss curve does not show."""
    if not isinstance(opt_state, optax.MultiStepsState):
        return
    left = int(opt_state.mini_step[...].addressable_data(0))  # replicated: on several processes, this one's copy
    if left:
        warnings.warn(f"optimizer: the last {left} of cfg.steps={steps} batches were accumulated by optax.MultiSteps "
                      f"but never applied; make cfg.steps a multiple of its k", UserWarning,
                      stacklevel=validate.user_stacklevel())


def _batch(batch_fn: Callable[[int], Batch], i: int, steps: int) -> Batch:
    """`batch_fn(i)`; a StopIteration it raises (an iterator run out) as a ValueError: left alone, it ends
    the loop of any iterator that `fit` runs inside (`map(train, seeds)` silently yields fewer runs)."""
    try:
        return batch_fn(i)
    except StopIteration as err:
        raise ValueError(f"batch_fn({i}): expected the batch of update {i + 1} of {steps}, got StopIteration (an "
                         "iterator that ran out?); batch_fn(i) must give a batch for every i < cfg.steps, a "
                         "function of the step, e.g. batches[i % len(batches)]") from err


def earlier_run(out_dir: str | os.PathLike) -> str | None:
    """What an earlier run left in `out_dir` that a fresh start would mix with or replace, in words: its
    checkpoints, or the log of a run that left none (stopped before its first); None for neither. `fit` refuses such a
    directory unless `resume=True` (which continues the run, or starts again from step 0 where it has no
    checkpoint, its log then rewritten)."""
    out = Path(out_dir)
    done = ckpt.steps(out / CHECKPOINT_DIR)
    if done:
        return f"checkpoints at steps {done}"
    rows = read_rows(out / METRICS_FILE)
    if rows:
        return (f"the log of a run that left no checkpoint ({out / METRICS_FILE}, to step "
                f"{rows[-1]['step']})")
    return None


@contextlib.contextmanager
def _eval_mode(model: nnx.Module) -> Iterator[None]:
    """`model.eval()` inside, each mode flag (`compiled.mode_flags`) put back as it was after."""
    flags = [(node, name, getattr(node, name)) for node, name in mode_flags(model)]
    model.eval()
    try:
        yield
    finally:
        for node, name, value in flags:
            setattr(node, name, value)


def _unheard(event: dict) -> None:
    """`fit`'s events without a callback: all unsaid but a resume with another TrainConfig or other metrics, which
    gets a warning (the CLI listens, says it, and asks for --override)."""
    if event["event"] == "config_changed":
        warnings.warn(f"fit: resuming the run in {event['path']} with another TrainConfig: {_changes(event)}",
                      UserWarning, stacklevel=validate.user_stacklevel())
    elif event["event"] == "environment_changed":
        warnings.warn(f"fit: {environment_note(event)}", UserWarning, stacklevel=validate.user_stacklevel())
    elif event["event"] == "metrics_changed":
        warnings.warn(f"fit: resuming the run in {event['path']} with a loss_fn whose metrics {event['now']} are not "
                      f"the saved run's {event['saved']}: the first train row covers the updates after the resume "
                      "only", UserWarning, stacklevel=validate.user_stacklevel())


def environment_note(event: dict) -> str:
    """The line that says an `environment_changed` event: what differs, and what it means for the run."""
    return (f"the run in {event['path']} was saved under another environment ({_changes(event)}): it goes on, but "
            "not bit for bit as the uninterrupted run would have")


def _changes(event: dict) -> str:
    """A `*_changed` event's fields as "name saved -> now; ..."."""
    return "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in event["fields"].items())


def _eval_values(result: Mapping[str, Any]) -> dict[str, float]:
    try:
        return {m: float(v) for m, v in dict(result).items()}
    except (TypeError, ValueError) as e:
        raise TypeError(f"eval_fn: expected to return dict[str, float], got {result!r}") from e


def _spread_over(x, sharding: jax.sharding.Sharding) -> bool:
    """Whether array `x` is already placed over exactly `sharding`'s devices, several of them."""
    devices = getattr(getattr(x, "sharding", None), "device_set", set())
    return len(devices) > 1 and devices == sharding.device_set


def _resume(step: TrainStep, carry: dict, ckdir: Path, cfg: TrainConfig, emit: Callable,
            sharding: Any, run_environment: dict) -> tuple[dict, dict]:
    """The carry from the newest valid checkpoint, and the History fields that describe the resume; its state
    placed with `sharding` (None: as restored; one sharding, or one per state leaf)."""
    def target(metadata: dict) -> dict:  # the log window as saved: it sums the metrics the saved run's loss_fn gave
        names = metadata.get("logged_metrics", step.metric_names)
        window = {**carry["window"], "metrics": {m: carry["window"]["metrics"].get(m, np.float32(0)) for m in names}}
        return {"train_state": step.tree(carry["state"]), "loop": window}

    try:
        restored = ckpt.restore(ckdir, target=target, fallback=True)
    except ValueError as e:  # the target's: restore's own argument, which fit's caller never named
        raise ValueError(f"resume: expected the model and optimiser of the run in {ckdir.parent} (the same sizes; the "
                         "same optimiser, gradient clipping and weight decay on or off alike), got others: "
                         f"{str(e).removeprefix('target: ')}") from None
    except ckpt.CheckpointError:
        # A save that was killed after orbax's commit and before its manifest leaves a step without one; saves
        # prune only after the manifest, so every step lacking it means the run died in its first save: no
        # checkpoint ever completed, and it starts from step 0 as a run that left none (a requeued job stuck
        # otherwise). A checkpoint that has its manifest but fails it is corruption, refused.
        if ckpt.steps(ckdir, manifested=True):
            raise
        skipped = []
        for s in reversed(ckpt.steps(ckdir)):
            try:
                ckpt.verify(ckdir, s)
            except ckpt.CheckpointError as e:
                skipped.append((s, str(e)))
        return carry, {"resumed_from": None, **_set_aside(ckdir, skipped, emit)}
    aside = _set_aside(ckdir, restored.skipped, emit)
    if restored.stray_files:
        emit({"event": "checkpoint_stray_files", "step": restored.step, "path": str(restored.path),
              "files": list(restored.stray_files)})
    opt_step = int(restored.state["train_state"]["optimizer"]["step"][...])
    if opt_step != restored.step:
        raise ckpt.CheckpointError(f"checkpoint {restored.path}: optimiser step {opt_step} differs from the "
                                   f"directory's step {restored.step}")
    if restored.step > cfg.steps:
        raise ValueError(f"cfg.steps: expected at least the checkpoint's step {restored.step}, got {cfg.steps}")
    saved_cfg = restored.metadata.get("train_config", asdict(cfg))
    # The run's settings, then what its last bits depend on (not recorded before 2026-12-07: nothing to compare)
    for event, saved, now in (("config_changed", saved_cfg, asdict(cfg)),
                              ("environment_changed", restored.metadata.get("environment", run_environment),
                               run_environment)):
        fields = {k: [saved.get(k), v] for k, v in now.items() if saved.get(k) != v}
        if fields:
            emit({"event": event, "path": str(ckdir.parent), "fields": fields})
    saved_metrics = restored.metadata.get("logged_metrics", step.metric_names)
    if saved_metrics != step.metric_names:  # the first train row then covers the updates after the resume only
        emit({"event": "metrics_changed", "path": str(ckdir.parent), "saved": saved_metrics, "now": step.metric_names})
    state = step._raw(jax.tree.leaves(restored.state["train_state"]))
    carry = {**carry, "state": state if sharding is None else jax.device_put(state, sharding),
             "window": restored.state["loop"] if saved_metrics == step.metric_names else carry["window"]}
    return carry, {"resumed_from": restored.step, **aside, "checkpoint_stray_files": restored.stray_files}


def _set_aside(ckdir: Path, skipped: list | tuple, emit: Callable) -> dict:
    """Move each `(step, reason)` of `skipped` aside (`checkpoint.set_aside`), a `checkpoint_skipped` event each; the
    History fields that say so. Every skipped step is newer than the one resumed from and will be recomputed, so it
    must leave the step namespace; renamed, not deleted: a failed verify does not prove the data worthless (a
    transient read error, a copy in progress), and resume must never destroy data."""
    moved = tuple((s, ckpt.set_aside(ckdir, s)) for s, _ in skipped)
    for (s, reason), (_, where) in zip(skipped, moved):
        emit({"event": "checkpoint_skipped", "step": s, "reason": reason, "moved_to": str(where)})
    return {"checkpoints_skipped": tuple(skipped), "checkpoints_moved_aside": moved}


def restore_model(out_dir: str | os.PathLike, model: nnx.Module, step: int | None = None) -> ckpt.Restored:
    """Load the model part of a `fit` checkpoint under `out_dir` into `model` (in place).

    The model must have the structure it was trained with (rebuild it from the checkpoint's metadata first).
    The optimiser state is not loaded. Returns the `Restored` record (step, metadata, path). The model then
    holds JAX arrays placed as its own were: the checkpoint's NumPy arrays would work under `jax.jit` but not
    eagerly (a NumPy weight indexed by a traced token id inside a scan fails).
    """
    restored = ckpt.restore(Path(out_dir) / CHECKPOINT_DIR, step)
    names, leaves, treedef = ckpt.named_leaves(nnx.state(model), "model")
    prefix = "train_state/model/"
    extra = sorted({k.removeprefix(prefix) for k in restored.state if k.startswith(prefix)} - set(names))
    if extra:  # as torch's load_state_dict(strict=True): a model of fewer layers would load the rest silently
        raise ckpt.CheckpointError(f"checkpoint {restored.path}: model leaves {extra} that the model lacks (a "
                                   "different model?)")
    values = []
    for name, leaf in zip(names, leaves):
        value = restored.state.get(f"{prefix}{name}")
        if value is None:
            raise ckpt.CheckpointError(f"checkpoint {restored.path}: no model leaf {name!r} (a different model?)")
        # a Python scalar in an nnx.Variable was trained (and saved) as the array jit made of it
        dtype = leaf.dtype if hasattr(leaf, "dtype") else jnp.result_type(leaf)
        if tuple(np.shape(value)) != tuple(np.shape(leaf)) or value.dtype != dtype:  # (typed rng keys too)
            raise ckpt.CheckpointError(f"checkpoint {restored.path}: leaf {name!r} has shape "
                                       f"{tuple(np.shape(value))} dtype {value.dtype}, the model expects "
                                       f"{tuple(np.shape(leaf))} dtype {dtype}")
        values.append(jax.device_put(value, leaf.sharding if isinstance(leaf, jax.Array) else None))
    nnx.update(model, jax.tree.unflatten(treedef, values))
    return restored
