"""The training engine: optimiser, jitted steps, fit's logs/checkpoints, exact resume, NaN handling."""

import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn import checkpoint as ckpt
from jax_scan_rnn.train import (
    CHECKPOINT_DIR,
    CURVES_FILE,
    METRICS_FILE,
    RESERVED_METADATA,
    History,
    NonFiniteLossError,
    TrainConfig,
    TrainingStopped,
    TrainStep,
    clip_by_global_norm,
    environment,
    fit,
    global_norm,
    make_eval_fn,
    make_lr_schedule_for,
    make_optimizer,
    restore_model,
)

W_TRUE = jnp.array([[1.0], [-2.0], [0.5], [3.0]])


class DropMLP(nnx.Module):
    """Tiny model whose forward pass consumes rng (dropout), to test rng continuation."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(4, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(jnp.tanh(self.lin(x))))


def loss_fn(model, batch):
    x, y = batch
    err = model(x) - y
    mse = jnp.mean(err**2)
    return mse, {"mae": jnp.mean(jnp.abs(err)), "max_err": jnp.max(jnp.abs(err))}


def batch_fn(i):
    x = jax.random.normal(jax.random.key(i), (32, 4))
    return x, x @ W_TRUE + 0.1


def linear_batch_fn(i):
    x = jax.random.normal(jax.random.key(1000 + i), (64, 4))
    return x, x @ W_TRUE + 0.5


def mse_fn(model, batch):
    x, y = batch
    return jnp.mean((model(x) - y) ** 2), {}


def param_leaves(model):
    state = nnx.state(model)
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        out[jax.tree_util.keystr(path)] = np.asarray(x)
    return out


def assert_same_params(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"state leaf {k} differs")


def strip_times(rows):
    return [{k: v for k, v in r.items() if k not in ("wall_time", "elapsed_s", "steps_per_s")} for r in rows]


class Interrupt(Exception):
    pass


def interrupt_at(step):
    def cb(event):
        if event["event"] == "log" and event["step"] >= step:
            raise Interrupt(step)

    return cb


# ------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", 0),
        ("learning_rate", 0.0),
        ("warmup_steps", 5000),
        ("lr_schedule", "step"),
        ("clip_norm", -1.0),
        ("weight_decay", -0.1),
        ("log_every", 0),
        ("eval_every", -1),
        ("checkpoint_every", 1.5),
        ("keep_checkpoints", 0),
        ("final_lr_fraction", 2.0),
    ],
)
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^TrainConfig\.{field}:"):
        TrainConfig(**{field: value})


def test_config_numbers_from_numpy_are_kept_as_python_ones_which_checkpoints_save():
    # TrainConfig(learning_rate=np.float32(...)) (a sweep over np.logspace(...).astype("float32")) was accepted and
    # kept as is: fit trained until its first checkpoint, whose JSON metadata (the config) then failed with
    # "metadata: expected a JSON-serialisable dict" though the caller had passed no metadata.
    cfg = TrainConfig(steps=np.int64(10), learning_rate=np.float32(0.5), clip_norm=np.float64(2.0), log_every=np.int32(5))
    assert [type(getattr(cfg, f)) for f in ("steps", "learning_rate", "clip_norm", "log_every")] == [int, float, float, int]
    assert (cfg.steps, cfg.learning_rate, cfg.clip_norm, cfg.log_every) == (10, 0.5, 2.0, 5)
    json.dumps(asdict(cfg), allow_nan=False)  # what every checkpoint saves


def test_make_optimizer_follows_the_schedule_and_weight_decay():
    params = {"w": jnp.full((3,), 2.0)}
    grads = {"w": jnp.array([1.0, -4.0, 0.5])}
    cfg = TrainConfig(steps=100, learning_rate=0.1, warmup_steps=4, clip_norm=1.0)
    tx = make_optimizer(cfg)
    upd, _ = tx.update(grads, tx.init(params), params)
    # Adam's first update is -lr * sign(g) (up to eps); lr(0) = peak / (warmup + 1).
    np.testing.assert_allclose(upd["w"], -0.02 * np.sign(grads["w"]), rtol=1e-5)
    txw = make_optimizer(replace(cfg, weight_decay=0.5))
    updw, _ = txw.update(grads, txw.init(params), params)
    np.testing.assert_allclose(updw["w"] - upd["w"], -0.02 * 0.5 * params["w"], rtol=1e-5)


# ---------------------------------------------------------------------------------- step building


def test_train_step_by_hand_is_fits_step_bit_for_bit():
    """fit is a loop around TrainStep: the same step called by hand gives the same losses and state, exactly."""
    cfg = TrainConfig(steps=6, learning_rate=1e-2, warmup_steps=2, log_every=1, eval_every=0)
    a = DropMLP(nnx.Rngs(0))
    hist = fit(a, loss_fn, batch_fn, cfg)
    b = DropMLP(nnx.Rngs(0))
    step = TrainStep(b, loss_fn, make_optimizer(cfg), batch_fn(0), make_lr_schedule_for(cfg))
    assert step.metric_names == ["mae", "max_err"]
    carry = step.init()
    losses, lrs = [], []
    for i in range(cfg.steps):
        carry = step(carry, batch_fn(i))
        window = step.read(carry)["window"]
        assert int(window["count"]) == 1
        losses.append(float(window["loss"]))
        lrs.append(float(window["lr"]))
        carry = step.reset(carry)
    assert losses == [r["loss"] for r in hist.train]
    assert lrs == [r["lr"] for r in hist.train]
    schedule = make_lr_schedule_for(cfg)  # row k's lr is the one update k used, optax's count k - 1
    assert lrs == pytest.approx([float(schedule(i)) for i in range(cfg.steps)], rel=1e-6)  # (float32 in the step)
    step.write(carry)
    assert_same_params(param_leaves(a), param_leaves(b))
    assert int(step.optimizer.step[...]) == cfg.steps and int(b.drop.rngs.count[...]) == cfg.steps


def test_train_step_donates_the_carry_and_leaves_the_model_until_written():
    m = DropMLP(nnx.Rngs(0))
    before = param_leaves(m)
    step = TrainStep(m, loss_fn, optax.adam(1e-2), batch_fn(0))
    carry = step.init()
    old = carry["state"]
    carry = step(carry, batch_fn(0))
    assert all(x.is_deleted() for x in old)  # donated: the step updates in place on the device
    assert_same_params(before, param_leaves(m))  # the model keeps its own arrays until write
    step.write(carry)
    assert param_leaves(m).keys() == before.keys()
    assert not np.array_equal(param_leaves(m)["['lin']['kernel'].value"], before["['lin']['kernel'].value"])


def test_train_step_keeps_shared_variables_shared():
    class Tied(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(4, 4, rngs=rngs)
            self.b = self.a  # the same layer twice: tied weights
            self.head = nnx.Linear(4, 1, rngs=rngs)

        def __call__(self, x):
            return self.head(self.b(jnp.tanh(self.a(x))))

    m = Tied(nnx.Rngs(0))
    batch = batch_fn(0)
    step = TrainStep(m, mse_fn, optax.adam(5e-2), batch)
    before = float(mse_fn(m, batch)[0])
    kernel = m.a.kernel
    carry = step.init()
    # One parameter array for the two uses: nnx.split stores a shared Variable once.
    assert len(carry["state"]) == len(jax.tree.leaves(nnx.state(step.objs)))
    for _ in range(40):
        carry = step(carry, batch)
    step.write(carry)
    assert m.a is m.b and m.b.kernel is kernel  # still one Variable, updated in place
    assert float(mse_fn(m, batch)[0]) < 0.5 * before


# The step's gradient norm is one dot product of the concatenated leaves, optax's a sum of per-leaf sums:
# the same float32 squares added in another order.
GRAD_NORM_RTOL = 1e-6


@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # clipped, and left as it is
def test_clip_by_global_norm_is_optaxs(max_norm):
    """The library's clip (over `global_norm`, shared with TrainStep's record) gives optax's updates."""
    grads = {"a": jax.random.normal(jax.random.key(0), (64, 3)), "b": [jnp.arange(5.0) / 7, jnp.float32(-0.25)]}
    assert float(global_norm(grads)) == pytest.approx(float(optax.tree.norm(grads)), rel=GRAD_NORM_RTOL)
    assert float(global_norm({})) == 0.0
    got, _ = clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    want, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    for path, g, w in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=GRAD_NORM_RTOL, err_msg=jax.tree_util.keystr(path[0]))
    with pytest.raises(ValueError, match="^max_norm: "):
        clip_by_global_norm(-max_norm)
    cfg = TrainConfig(clip_norm=max_norm, learning_rate=0.1, lr_schedule="constant")  # fit's optimiser
    ours, theirs = make_optimizer(cfg), optax.chain(optax.clip_by_global_norm(max_norm), optax.adam(0.1))
    got, want = ours.update(grads, ours.init(grads))[0], theirs.update(grads, theirs.init(grads))[0]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=GRAD_NORM_RTOL)


def test_train_step_records_optaxs_global_norm_and_drops_an_update_that_overflows():
    """The window's gradient norm is `optax.tree.norm` of the step's gradients; an update that overflows the
    parameters (a finite loss and gradient, lr 1e38) is recorded as the first bad step and not applied."""
    m = DropMLP(nnx.Rngs(0))
    twin = nnx.clone(m)  # the same weights and rng counts: the same dropout masks as the step's
    batch = batch_fn(0)
    grads = nnx.grad(lambda model: loss_fn(model, batch)[0])(twin)
    step = TrainStep(m, loss_fn, optax.adam(1e-2), batch)
    read = step.read(step(step.init(), batch))
    want = float(optax.tree.norm(grads))
    assert read["bad"]["step"] == -1 and int(read["window"]["count"]) == 1
    assert float(read["window"]["grad_norm"]) == pytest.approx(want, rel=GRAD_NORM_RTOL)

    before = param_leaves(m)
    step = TrainStep(m, loss_fn, optax.sgd(1e38), batch)  # finite lr, gradient ~1: the parameters overflow
    carry = step(step.init(), batch)
    read = step.read(carry)
    assert int(read["bad"]["step"]) == 1 and math.isfinite(float(read["bad"]["loss"]))
    assert math.isfinite(float(read["bad"]["grad_norm"])) and int(read["window"]["count"]) == 0
    step.write(step(carry, batch))  # frozen: later steps change nothing either
    assert_same_params(param_leaves(m), before)


def test_train_step_builds_the_optimizer_state_tx_init_builds():
    """TrainStep compiles `tx.init` (one program instead of an eager op per leaf): the same state, leaf for leaf,
    and the caller's `tx` keeps its class and `update`."""
    m = DropMLP(nnx.Rngs(0))
    tx = make_optimizer(TrainConfig(steps=10, weight_decay=0.1))
    step = TrainStep(m, loss_fn, tx, batch_fn(0))
    got = jax.tree.leaves(step.optimizer.opt_state)
    want = jax.tree.leaves(tx.init(nnx.state(m, nnx.Param)))
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert type(step.optimizer.tx) is type(tx) and step.optimizer.tx.update is tx.update


def test_train_step_refuses_a_bad_loss_fn_and_model():
    m = DropMLP(nnx.Rngs(0))
    with pytest.raises(TypeError, match="^model: expected Module, got dict"):
        TrainStep({}, loss_fn, optax.adam(1e-2), batch_fn(0))
    with pytest.raises(TypeError, match="^loss_fn: expected a callable, got int"):
        TrainStep(m, 3, optax.adam(1e-2), batch_fn(0))
    with pytest.raises(TypeError, match="^tx: expected GradientTransformation, got function"):
        TrainStep(m, loss_fn, optax.adam, batch_fn(0))
    with pytest.raises(ValueError, match="^loss_fn: expected metrics as dict"):
        TrainStep(m, lambda model, b: (mse_fn(model, b)[0], {"v": model(b[0])}), optax.adam(1e-2), batch_fn(0))
    with pytest.raises(ValueError, match=r"^loss_fn: expected metrics as dict\[str, scalar\], got key 'parts' with a "
                                         r"dict(\n|$)"):  # (it passed the check, then failed inside the step)
        TrainStep(m, lambda model, b: (mse_fn(model, b)[0], {"parts": {"a": 1.0}}), optax.adam(1e-2), batch_fn(0))


class SowingMLP(nnx.Module):
    """Records its hidden layer with `sow` (NNX's way to capture intermediates): a Variable made during the call."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(4, 16, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        h = jnp.tanh(self.lin(x))
        self.sow(nnx.Intermediate, "hidden", h)
        return self.out(h)


@pytest.mark.filterwarnings("ignore:Using 'Module.sow\\(\\)' outside of 'nnx.capture\\(\\)' is deprecated")
def test_a_step_that_adds_state_names_the_new_leaves_and_capturing_them_trains():
    # The message printed both state treedefs whole: ~2,000 characters for this two-layer MLP, tens of thousands
    # for an LSTM, with the one new leaf somewhere inside.
    step = TrainStep(SowingMLP(nnx.Rngs(0)), mse_fn, optax.adam(1e-2), batch_fn(0))
    with pytest.raises(ValueError, match=r"^loss_fn: expected the model's state structure to stay the same during a "
                                         r"step, got new leaves 'model/hidden/0' \(create every Variable in __init__; "
                                         r"take what a call sows in loss_fn with nnx.pop\(model, "
                                         r"nnx.Intermediate\) after the call\)(\n|$)"):
        step(step.init(), batch_fn(0))

    def capturing_loss_fn(model, batch):  # what the message says to do (nnx.pop: in every flax the package takes;
        x, y = batch                      # nnx.capture is newer than its floor, flax 0.12.5)
        prediction = model(x)
        sown = jax.tree.leaves(nnx.pop(model, nnx.Intermediate))
        return jnp.mean((prediction - y) ** 2), {"hidden_mean": jnp.mean(sown[0])}

    step = TrainStep(SowingMLP(nnx.Rngs(0)), capturing_loss_fn, optax.adam(1e-2), batch_fn(0))
    window = step.read(step(step.init(), batch_fn(0)))["window"]
    assert int(window["count"]) == 1 and np.isfinite(window["metrics"]["hidden_mean"])



def test_a_step_that_changes_a_variables_type_says_so_when_no_leaf_is_new_or_gone():
    # The same leaf names, another Variable type (a BatchStat set as a Cache): the treedefs differ, and the message
    # says what changed rather than naming no change at all ("got  (create every ...").
    class Counting(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
            self.count = nnx.BatchStat(jnp.zeros(()))

    def retyping_loss_fn(model, batch):
        model.count = nnx.Cache(model.count[...] + 1)
        return mse_fn(model.lin, batch)

    step = TrainStep(Counting(), retyping_loss_fn, optax.sgd(0.1), batch_fn(0))
    with pytest.raises(ValueError, match=r"^loss_fn: expected the model's state structure to stay the same during a "
                                         r"step, got the same leaves in other Variable types \(create every Variable"):
        step(step.init(), batch_fn(0))

def test_a_metric_named_loss_is_refused_since_evaluation_reports_the_loss_under_that_name():
    # make_eval_fn returns {"loss": loss, **metrics}: a metric "loss" (a reconstruction term of a loss with more
    # in it) replaced the loss in every eval row, and the curves' loss panel drew train loss against that term.
    def loss_fn_with_loss_metric(model, batch):
        recon, _ = mse_fn(model, batch)
        return recon + 1.0, {"loss": recon}

    with pytest.raises(ValueError, match=r"^loss_fn: expected metrics without a 'loss' key \(the loss is the first "
                                         r"value returned, and evaluation reports it as 'loss'\), got one"):
        TrainStep(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), loss_fn_with_loss_metric, optax.adam(1e-2), batch_fn(0))
    with pytest.raises(ValueError, match=r"^loss_fn: expected metrics without a 'loss' key"):
        make_eval_fn(loss_fn_with_loss_metric, [batch_fn(0)])(nnx.Linear(4, 1, rngs=nnx.Rngs(0)))


def test_the_loss_itself_logged_as_a_metric_named_loss_still_trains_and_evaluates():
    # The refusal above is for another value under "loss"; `return loss, {"loss": loss}` (the loss logged among the
    # metrics, code that trained before the refusal) gives evaluation the same number and was refused with it.
    def loss_fn_logging_its_loss(model, batch):
        loss, _ = mse_fn(model, batch)
        return loss, {"loss": loss}

    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    assert make_eval_fn(loss_fn_logging_its_loss, [batch_fn(1)])(model) == make_eval_fn(mse_fn, [batch_fn(1)])(model)
    step = TrainStep(model, loss_fn_logging_its_loss, optax.sgd(0.1), batch_fn(0))
    window = step.read(step(step.init(), batch_fn(0)))["window"]
    assert window["metrics"]["loss"] == window["loss"] == np.float32(mse_fn(model, batch_fn(0))[0])


def test_eval_fn_leaves_the_model_untouched():
    m = DropMLP(nnx.Rngs(0))
    before = param_leaves(m)
    ev = make_eval_fn(loss_fn, [batch_fn(i) for i in range(3)])(m)
    assert set(ev) == {"loss", "mae", "max_err"} and all(isinstance(v, float) for v in ev.values())
    first = make_eval_fn(loss_fn, [batch_fn(0)])(m)
    assert_same_params(before, param_leaves(m))  # rng count not advanced either
    assert first["loss"] == pytest.approx(float(loss_fn(m, batch_fn(0))[0]), rel=1e-6)  # the same draw, eagerly
    with pytest.raises(ValueError, match="^batches: expected at least one"):
        make_eval_fn(loss_fn, [])


# --------------------------------------------------------------------------------------------- fit


def test_fit_converges_and_writes_logs_plots_checkpoints(tmp_path):
    cfg = TrainConfig(
        steps=150, learning_rate=5e-2, lr_schedule="constant", log_every=25, eval_every=50,
        checkpoint_every=75,
    )
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    events = []
    ev_batches = [linear_batch_fn(10_000 + i) for i in range(2)]
    hist = fit(
        model, mse_fn, linear_batch_fn, cfg, out_dir=tmp_path, callback=events.append,
        eval_fn=make_eval_fn(mse_fn, ev_batches), metadata={"model": {"in": 4, "out": 1}},
    )
    assert isinstance(hist, History) and hist.step == 150 and hist.resumed_from is None
    assert [r["step"] for r in hist.train] == [25, 50, 75, 100, 125, 150]
    assert [r["step"] for r in hist.eval] == [50, 100, 150]
    assert hist.train[-1]["loss"] < 1e-3 * hist.train[0]["loss"]
    assert hist.eval[-1]["loss"] < 1e-4
    np.testing.assert_allclose(np.asarray(model.kernel[...]), np.asarray(W_TRUE), atol=1e-2)

    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert rows == hist_rows_in_order(hist)
    for r in rows:
        assert {"step", "split", "loss", "metrics", "lr", "wall_time", "elapsed_s"} <= r.keys()
    assert all(r["lr"] == pytest.approx(5e-2) for r in rows)
    assert (tmp_path / CURVES_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [75, 150]
    assert ckpt.steps(tmp_path / CHECKPOINT_DIR) == [75, 150]
    meta = ckpt.read_metadata(tmp_path / CHECKPOINT_DIR)
    assert meta["model"] == {"in": 4, "out": 1} and meta["train_config"]["steps"] == 150
    # restore_model: the newest checkpoint's weights, as JAX arrays (NumPy ones fail where eager code indexes
    # them with a traced value, as the SeqVAE's decoder does with its token ids).
    fresh = nnx.Linear(4, 1, rngs=nnx.Rngs(1))
    assert restore_model(tmp_path, fresh).step == 150
    for got, want in zip(jax.tree.leaves(nnx.state(fresh)), jax.tree.leaves(nnx.state(model))):
        assert isinstance(got, jax.Array), type(got)
        np.testing.assert_array_equal(got, want)

    # ...strictly, as torch's load_state_dict: leaves the model lacks, or of another dtype, are refused.
    half = nnx.Linear(4, 1, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
    with pytest.raises(ckpt.CheckpointError, match=r"leaf 'bias' has shape \(1,\) dtype float32, the model expects "
                                                   r"\(1,\) dtype bfloat16$"):
        restore_model(tmp_path, half)
    with pytest.raises(ckpt.CheckpointError, match=r"model leaves \['bias'\] that the model lacks"):
        restore_model(tmp_path, nnx.Linear(4, 1, use_bias=False, rngs=nnx.Rngs(1)))

    # Resuming with another TrainConfig and no callback to say it to: a warning names the change.
    with pytest.warns(UserWarning, match=r"^fit: resuming the run in .* with another TrainConfig: learning_rate "
                                         r"0.05 -> 0.1$"):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, replace(cfg, learning_rate=0.1),
            out_dir=tmp_path, resume=True)

    # Refuses to mix a new run into a directory that holds checkpoints...
    with pytest.raises(ValueError, match=r"^out_dir: expected no earlier run when resume=False, got checkpoints at "
                                         r"steps \[75, 150\];.*resume=True"):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path)


def test_fit_takes_torch_batches_as_numpy_ones():
    """A torch user's batches (a DataLoader's tensors, one that requires grad too) train as the same NumPy ones do;
    JAX alone refuses a torch tensor as a jit argument."""
    torch = pytest.importorskip("torch")
    cfg = TrainConfig(steps=6, learning_rate=5e-2, lr_schedule="constant", log_every=2)

    def as_torch(i):
        x, y = (np.array(a) for a in linear_batch_fn(i))
        return torch.from_numpy(x).requires_grad_(), torch.from_numpy(y)

    losses = []
    for batch_fn in (lambda i: tuple(np.asarray(a) for a in linear_batch_fn(i)), as_torch):
        model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
        hist = fit(model, mse_fn, batch_fn, cfg, eval_fn=make_eval_fn(mse_fn, [batch_fn(99)]))
        losses.append([r["loss"] for r in hist.train + hist.eval])
    assert losses[1] == losses[0]


def test_fit_keeps_the_log_of_a_run_stopped_before_its_first_checkpoint(tmp_path):
    """...or the log of one that stopped before its first checkpoint: it is another run's data. resume=True
    starts again from step 0 there."""
    cfg = TrainConfig(steps=20, learning_rate=5e-2, lr_schedule="constant", log_every=5, checkpoint_every=0)

    def stop(event):
        if event["event"] == "log" and event["step"] == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path, callback=stop)
    log = (tmp_path / METRICS_FILE).read_text()
    assert [json.loads(line)["step"] for line in log.splitlines()] == [5, 10]
    with pytest.raises(ValueError, match=r"^out_dir: expected no earlier run when resume=False, got the log of a run "
                                         r"that left no checkpoint \(.*metrics.jsonl, to step 10\)"):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path)
    assert (tmp_path / METRICS_FILE).read_text() == log
    hist = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path, resume=True)
    assert hist.resumed_from is None and [r["step"] for r in hist.train] == [5, 10, 15, 20]
    assert [json.loads(line)["step"] for line in (tmp_path / METRICS_FILE).read_text().splitlines()] == [5, 10, 15, 20]


def hist_rows_in_order(hist):
    return sorted(hist.train + hist.eval, key=lambda r: (r["step"], r["split"] != "train"))


def test_eval_fn_sees_eval_mode_and_copies_it_may_keep():
    """fit calls eval_fn as torch code evaluates, after model.eval() (no dropout), the modes put back after; the
    model's arrays are copies of the donated carry, so a clone kept as the best weights stays readable."""
    seen, kept = [], []

    def eval_fn(model):
        seen.append(model.drop.deterministic)
        kept.append(nnx.clone(model))
        return {"loss": 0.0}

    model = DropMLP(nnx.Rngs(0))
    fit(model, loss_fn, batch_fn, TrainConfig(steps=4, log_every=1, eval_every=1, checkpoint_every=0),
        eval_fn=eval_fn)
    assert seen == [True] * 4 and model.drop.deterministic is False
    x = batch_fn(0)[0]
    outputs = [np.asarray(jsr_eval(clone, x)) for clone in kept]  # each readable after later steps donated
    assert not np.array_equal(outputs[0], outputs[-1])


def jsr_eval(model, x):
    model.eval()
    return model(x)


def test_a_thread_cannot_write_into_a_run_another_thread_holds(tmp_path):
    """The lock is re-entrant per thread: another thread of the same process is refused as another process is."""
    import threading

    from jax_scan_rnn import lock

    refused = []
    with lock.run_lock(tmp_path / "run"):
        def other():
            try:
                with lock.run_lock(tmp_path / "run"):
                    pass
            except lock.RunDirectoryLocked as err:
                refused.append(str(err))

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        with lock.run_lock(tmp_path / "run"):  # this thread again: re-entrant
            pass
    assert len(refused) == 1 and "another thread of this process" in refused[0], refused


_EVAL = {}


def eval_fn_dropout(model):
    if "fn" not in _EVAL:  # built once: one compilation for all tests
        _EVAL["fn"] = make_eval_fn(loss_fn, [batch_fn(99)])
    return _EVAL["fn"](model)


# One optimiser setting shared by the resume tests, so the compiled step is reused between them.
RESUME_CFG = TrainConfig(
    steps=20, learning_rate=2e-2, warmup_steps=3, lr_schedule="cosine", log_every=1, eval_every=4,
    checkpoint_every=10, keep_checkpoints=1,
)


@pytest.mark.parametrize("log_every", [1, 3], ids=["log_every_1", "log_every_3_windows_span_checkpoints"])
def test_resume_is_bit_exact(tmp_path, log_every):
    cfg = replace(RESUME_CFG, log_every=log_every)
    straight = DropMLP(nnx.Rngs(0))
    h_straight = fit(straight, loss_fn, batch_fn, cfg, out_dir=tmp_path / "a", eval_fn=eval_fn_dropout)

    # Crash after the step-12 log row was written (last checkpoint: step 10).
    first = DropMLP(nnx.Rngs(0))
    with pytest.raises(Interrupt):
        fit(first, loss_fn, batch_fn, cfg, out_dir=tmp_path / "b", eval_fn=eval_fn_dropout,
            callback=interrupt_at(12))
    assert ckpt.latest_step(tmp_path / "b" / CHECKPOINT_DIR) == 10
    rows = (tmp_path / "b" / METRICS_FILE).read_text().splitlines()
    assert json.loads(rows[-1])["step"] == 12  # rows after the checkpoint exist before resuming
    # A fresh model, initialised differently (other params AND other rng key): all comes from disk.
    resumed = DropMLP(nnx.Rngs(1234))
    events = []
    h_resumed = fit(resumed, loss_fn, batch_fn, cfg, out_dir=tmp_path / "b", eval_fn=eval_fn_dropout,
                    resume=True, callback=events.append)
    assert h_resumed.resumed_from == 10 and events[0]["event"] == "start" and events[0]["step"] == 10

    assert [r["loss"] for r in h_resumed.train] == [r["loss"] for r in h_straight.train]
    assert strip_times(h_resumed.train) == strip_times(h_straight.train)
    assert strip_times(h_resumed.eval) == strip_times(h_straight.eval)
    assert_same_params(param_leaves(resumed), param_leaves(straight))
    assert int(resumed.drop.rngs.count[...]) == 20  # eval never advances the training rng
    rows_a = [json.loads(x) for x in (tmp_path / "a" / METRICS_FILE).read_text().splitlines()]
    rows_b = [json.loads(x) for x in (tmp_path / "b" / METRICS_FILE).read_text().splitlines()]
    assert strip_times(rows_b) == strip_times(rows_a)  # truncated on resume: reads as one run
    assert ckpt.steps(tmp_path / "b" / CHECKPOINT_DIR) == [20]  # keep_checkpoints=1


def test_a_stop_request_checkpoints_the_update_reached_and_resume_is_bit_exact(tmp_path):
    """`stop()` (the CLI's SIGTERM, a cluster's preemption) after update 13, between checkpoints (10, 20) and inside a
    log window (3): that update is checkpointed, TrainingStopped says where, and resuming gives the straight run."""
    import itertools

    from jax_scan_rnn.train import TrainingStopped

    cfg = replace(RESUME_CFG, log_every=3)
    straight = DropMLP(nnx.Rngs(0))
    h_straight = fit(straight, loss_fn, batch_fn, cfg, out_dir=tmp_path / "a", eval_fn=eval_fn_dropout)
    asked = itertools.count(1)  # asked once after each update
    with pytest.raises(TrainingStopped) as stopped:
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, cfg, out_dir=tmp_path / "b", eval_fn=eval_fn_dropout,
            stop=lambda: next(asked) >= 13)
    assert stopped.value.step == 13 and stopped.value.checkpoint == ckpt.step_path(tmp_path / "b" / CHECKPOINT_DIR, 13)
    assert f"stopped as asked at step 13; its checkpoint {stopped.value.checkpoint} is written" in str(stopped.value)
    assert ckpt.steps(tmp_path / "b" / CHECKPOINT_DIR) == [13]  # keep_checkpoints=1: step 10 pruned
    resumed = DropMLP(nnx.Rngs(1234))
    h_resumed = fit(resumed, loss_fn, batch_fn, cfg, out_dir=tmp_path / "b", eval_fn=eval_fn_dropout, resume=True,
                    stop=lambda: False)
    assert h_resumed.resumed_from == 13
    assert strip_times(h_resumed.train) == strip_times(h_straight.train)
    assert strip_times(h_resumed.eval) == strip_times(h_straight.eval)
    assert_same_params(param_leaves(resumed), param_leaves(straight))
    with pytest.raises(TrainingStopped, match="at step 1; nothing was written"):  # no out_dir: stopped all the same
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(cfg, steps=3), stop=lambda: True)
    calls = []
    fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(cfg, steps=3), stop=lambda: calls.append(1) or len(calls) >= 3)
    assert len(calls) == 2  # asked after updates 1 and 2, not after the last: a finished run is done, not stopped


def test_resume_falls_back_past_a_corrupt_checkpoint(tmp_path):
    cfg = replace(RESUME_CFG, keep_checkpoints=2)
    straight = DropMLP(nnx.Rngs(0))
    fit(straight, loss_fn, batch_fn, cfg, out_dir=tmp_path)
    ckdir = tmp_path / CHECKPOINT_DIR
    assert ckpt.steps(ckdir) == [10, 20]
    (ckpt.step_path(ckdir, 20) / "MANIFEST.json").unlink()  # the newest one is now invalid

    events = []
    resumed = DropMLP(nnx.Rngs(5))
    h = fit(resumed, loss_fn, batch_fn, cfg, out_dir=tmp_path, resume=True, callback=events.append)
    assert h.resumed_from == 10 and [s for s, _ in h.checkpoints_skipped] == [20]
    skipped = [e for e in events if e["event"] == "checkpoint_skipped"]
    assert skipped and "MANIFEST.json is missing" in skipped[0]["reason"]
    assert_same_params(param_leaves(resumed), param_leaves(straight))
    ckpt.verify(ckdir, 20)  # recomputed and rewritten, valid again


def test_resume_with_fewer_steps_than_the_checkpoints_is_refused_and_changes_nothing(tmp_path):
    fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, RESUME_CFG, out_dir=tmp_path)
    log = (tmp_path / METRICS_FILE).read_bytes()
    with pytest.raises(ValueError, match=r"^cfg.steps: expected at least the checkpoint's step 20, got 10$"):
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(RESUME_CFG, steps=10, warmup_steps=0), out_dir=tmp_path,
            resume=True)
    assert ckpt.steps(tmp_path / CHECKPOINT_DIR) == [20] and (tmp_path / METRICS_FILE).read_bytes() == log


def test_resume_refuses_a_newest_checkpoint_of_another_format_and_moves_nothing(tmp_path):
    # A run whose newest step another jax-scan-rnn wrote (format 3 here) is not corrupt: falling back past it
    # would resume from behind that version's progress, and move its checkpoint aside. Refused with that step's
    # reason once (not once per step); every step left where it was.
    cfg = replace(RESUME_CFG, keep_checkpoints=2)
    fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, cfg, out_dir=tmp_path)
    ckdir = tmp_path / CHECKPOINT_DIR
    manifest = ckpt.step_path(ckdir, 20) / "MANIFEST.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 3}))
    with pytest.raises(ckpt.CheckpointFormatError) as err:
        fit(DropMLP(nnx.Rngs(5)), loss_fn, batch_fn, cfg, out_dir=tmp_path, resume=True)
    assert str(err.value).startswith(f"checkpoint {ckpt.step_path(ckdir, 20)}: format 3 in MANIFEST.json")
    assert str(err.value).count("format") == 2, err.value  # "format 3 in ...; this version reads format 2 only"
    assert ckpt.steps(ckdir) == [10, 20] and sorted(p.name for p in ckdir.iterdir()) == [
        ckpt.step_path(ckdir, 10).name, ckpt.step_path(ckdir, 20).name]
    with pytest.raises(ckpt.CheckpointFormatError):
        ckpt.newest_valid_step(ckdir)  # evaluate/export's reader alike


def test_resume_after_a_crash_in_the_first_save_starts_again_and_a_corrupt_only_checkpoint_is_refused(tmp_path):
    """Killed between orbax's commit and the manifest of the run's first save: the only step lacks its manifest, no
    checkpoint ever completed, so resume starts from step 0 (the step moved aside, not deleted) and gives the straight
    run, instead of refusing the run forever. A lone checkpoint that has its manifest but fails it is refused."""
    cfg = replace(RESUME_CFG, keep_checkpoints=2)
    straight = DropMLP(nnx.Rngs(0))
    fit(straight, loss_fn, batch_fn, cfg, out_dir=tmp_path / "a")
    fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(cfg, steps=10), out_dir=tmp_path / "b")
    ckdir = tmp_path / "b" / CHECKPOINT_DIR
    (ckpt.step_path(ckdir, 10) / "MANIFEST.json").unlink()
    events = []
    resumed = DropMLP(nnx.Rngs(0))  # from step 0: the model given (the CLI builds it from the run's seed)
    h = fit(resumed, loss_fn, batch_fn, cfg, out_dir=tmp_path / "b", resume=True, callback=events.append)
    assert h.resumed_from is None and [s for s, _ in h.checkpoints_skipped] == [10]
    assert "MANIFEST.json is missing" in h.checkpoints_skipped[0][1]
    assert h.checkpoints_moved_aside == ((10, ckdir / "step_00000010.invalid-1"),)
    assert (ckdir / "step_00000010.invalid-1" / "arrays").is_dir()  # kept
    assert [e["step"] for e in events if e["event"] == "checkpoint_skipped"] == [10]
    assert_same_params(param_leaves(resumed), param_leaves(straight))
    assert [r["step"] for r in h.train] == list(range(1, 21))  # the log of the crashed run is rewritten

    fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(cfg, steps=10), out_dir=tmp_path / "c")
    (ckpt.step_path(tmp_path / "c" / CHECKPOINT_DIR, 10) / "metadata" / "metadata").write_text("{}")
    with pytest.raises(ckpt.CheckpointError, match="no valid checkpoint.*metadata/metadata has 2 bytes"):
        fit(DropMLP(nnx.Rngs(5)), loss_fn, batch_fn, cfg, out_dir=tmp_path / "c", resume=True)
    assert ckpt.steps(tmp_path / "c" / CHECKPOINT_DIR) == [10]  # left where it was


def test_resume_where_a_checkpoint_with_its_manifest_fails_is_refused_though_a_newer_lacks_one(tmp_path):
    """Starting again from step 0 is for a run that never completed a save (no step has its manifest). A newer step
    cut short in its save beside an older one that has its manifest but fails it is corruption: refused, nothing
    moved, as a lone corrupt checkpoint is."""
    cfg = replace(RESUME_CFG, keep_checkpoints=2)
    fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, cfg, out_dir=tmp_path)
    ckdir = tmp_path / CHECKPOINT_DIR
    (ckpt.step_path(ckdir, 10) / "metadata" / "metadata").write_text("{}")
    (ckpt.step_path(ckdir, 20) / "MANIFEST.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match="no valid checkpoint"):
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(cfg, steps=30), out_dir=tmp_path, resume=True)
    assert ckpt.steps(ckdir) == [10, 20]  # left where they were

def test_resume_with_another_model_or_optimiser_names_resume_not_restores_target(tmp_path):
    """A resumed run whose model has other sizes, or whose optimiser state has another layout (weight decay turned
    on adds a transformation): ValueError naming `resume` (fit's argument; the CLI's --resume), not `target`, an
    argument of checkpoint.restore that fit's caller never gave (the CLI said "--target: ...")."""
    cfg = replace(RESUME_CFG, steps=10, eval_every=0)
    fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path)
    wider = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"^resume: expected the model and optimiser of the run in .*, got others: "
                                         r"leaf 'train_state/model/bias' expected shape \(1,\)"):
        fit(wider, mse_fn, linear_batch_fn, replace(cfg, steps=20), out_dir=tmp_path, resume=True)
    with pytest.raises(ValueError, match=r"^resume: .*got others: expected the leaves of checkpoint .*lacks"):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, replace(cfg, steps=20, weight_decay=0.1),
            out_dir=tmp_path, resume=True)
    assert ckpt.steps(tmp_path / CHECKPOINT_DIR) == [10]  # nothing moved or written


def test_resume_falls_back_past_a_byte_flipped_checkpoint_and_keeps_it(tmp_path):
    cfg = replace(RESUME_CFG, keep_checkpoints=2)
    straight = DropMLP(nnx.Rngs(0))
    fit(straight, loss_fn, batch_fn, cfg, out_dir=tmp_path)
    ckdir = tmp_path / CHECKPOINT_DIR
    bad = ckpt.step_path(ckdir, 20)
    victim = max((p for p in (bad / "arrays").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    victim.write_bytes(bytes(raw))
    flipped = {p.relative_to(bad): p.read_bytes() for p in bad.rglob("*") if p.is_file()}

    events = []
    resumed = DropMLP(nnx.Rngs(5))
    h = fit(resumed, loss_fn, batch_fn, cfg, out_dir=tmp_path, resume=True, callback=events.append)
    assert h.resumed_from == 10 and [s for s, _ in h.checkpoints_skipped] == [20]
    assert "corrupted (sha256 mismatch)" in h.checkpoints_skipped[0][1]
    aside = ckdir / "step_00000020.invalid-1"
    assert h.checkpoints_moved_aside == ((20, aside),)
    skipped = [e for e in events if e["event"] == "checkpoint_skipped"]
    assert [(e["step"], e["moved_to"]) for e in skipped] == [(20, str(aside))]
    # Not deleted: the bad checkpoint is on disk byte for byte, under its moved-aside name.
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == flipped
    assert_same_params(param_leaves(resumed), param_leaves(straight))
    ckpt.verify(ckdir, 20)  # recomputed and rewritten, valid again
    assert ckpt.steps(ckdir) == [10, 20]  # keep_checkpoints=2 counts neither the moved-aside one...
    assert sorted(os.listdir(ckdir)) == ["step_00000010", "step_00000020", "step_00000020.invalid-1"]
    # ...nor does a later resume re-skip or prune it.
    h2 = fit(DropMLP(nnx.Rngs(6)), loss_fn, batch_fn, cfg, out_dir=tmp_path, resume=True)
    assert h2.resumed_from == 20 and h2.checkpoints_skipped == () and h2.checkpoints_moved_aside == ()
    assert aside.is_dir()


def test_resume_uses_a_checkpoint_with_stray_files_and_reports_them(tmp_path):
    cfg = replace(RESUME_CFG, keep_checkpoints=2)
    straight = DropMLP(nnx.Rngs(0))
    fit(straight, loss_fn, batch_fn, cfg, out_dir=tmp_path / "a")
    with pytest.raises(Interrupt):
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, cfg, out_dir=tmp_path / "b", callback=interrupt_at(12))
    ckdir = tmp_path / "b" / CHECKPOINT_DIR
    newest = ckpt.step_path(ckdir, 10)
    assert ckpt.steps(ckdir) == [10]
    (newest / "notes.txt").write_text("try a lower lr next")
    (newest / ".DS_Store").write_bytes(b"\0Bud1")
    (newest / "arrays" / ".DS_Store").write_bytes(b"\0Bud1")
    stray = (".DS_Store", "arrays/.DS_Store", "notes.txt")

    events = []
    on_disk_at_start = []

    def callback(e):
        events.append(e)
        if e["event"] == "start":  # resume has finished: nothing of the checkpoint may be gone
            on_disk_at_start.extend(sorted(os.listdir(ckdir)))

    resumed = DropMLP(nnx.Rngs(5))
    h = fit(resumed, loss_fn, batch_fn, cfg, out_dir=tmp_path / "b", resume=True, callback=callback)
    assert h.resumed_from == 10  # the newest checkpoint was used, not skipped
    assert h.checkpoints_skipped == () and h.checkpoints_moved_aside == ()
    assert h.checkpoint_stray_files == stray
    reported = [e for e in events if e["event"] == "checkpoint_stray_files"]
    assert reported == [
        {"event": "checkpoint_stray_files", "step": 10, "path": str(newest.absolute()), "files": list(stray)}
    ]
    assert not [e for e in events if e["event"] == "checkpoint_skipped"]
    assert on_disk_at_start == ["step_00000010"]
    assert_same_params(param_leaves(resumed), param_leaves(straight))
    assert (newest / "notes.txt").read_text() == "try a lower lr next"  # left alone
    assert ckpt.verify(ckdir, 10) == stray and ckpt.steps(ckdir) == [10, 20]


RESUME_SCRIPT = """
import sys, numpy as np
import jax
jax.config.update("jax_enable_x64", {x64!r})  # same numerics as the parent (conftest may enable x64)
sys.path.insert(0, {tests!r})
from flax import nnx
from jax_scan_rnn.train import TrainConfig, fit
from test_train import DropMLP, loss_fn, batch_fn, param_leaves
cfg = TrainConfig(**{cfg!r})
m = DropMLP(nnx.Rngs(77))
h = fit(m, loss_fn, batch_fn, cfg, out_dir={out!r}, resume=True)
np.savez({npz!r}, losses=np.array([r["loss"] for r in h.train]), **param_leaves(m))
"""


@pytest.mark.slow  # a second Python process importing jax/flax/orbax: ~5-10 s
def test_resume_in_a_fresh_process_is_bit_exact(tmp_path):
    cfg = TrainConfig(steps=12, learning_rate=2e-2, log_every=1, eval_every=0, checkpoint_every=4)
    straight = DropMLP(nnx.Rngs(0))
    h = fit(straight, loss_fn, batch_fn, cfg)
    with pytest.raises(Interrupt):
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, cfg, out_dir=tmp_path, callback=interrupt_at(6))
    script = RESUME_SCRIPT.format(
        x64=bool(jax.config.jax_enable_x64), tests=str(Path(__file__).parent), cfg=cfg.__dict__,
        out=str(tmp_path), npz=str(tmp_path / "r.npz"),
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "r.npz")
    assert got["losses"].tolist() == [r["loss"] for r in h.train]
    assert_same_params({k: got[k] for k in got.files if k != "losses"}, param_leaves(straight))


def nan_at(bad_step):
    def fn(i):
        x, y = batch_fn(i)
        return x, (y * jnp.nan if i == bad_step - 1 else y)

    return fn


def test_non_finite_loss_stops_at_the_first_bad_step_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = TrainConfig(
        steps=40, learning_rate=1e-2, lr_schedule="constant", log_every=100, eval_every=0,
        checkpoint_every=5,
    )
    model = DropMLP(nnx.Rngs(0))
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 7 \(.*batch_fn\(6\)") as ei:
        fit(model, loss_fn, nan_at(7), cfg, out_dir=tmp_path)
    err = ei.value
    assert err.step == 7 and math.isnan(err.loss) and err.last_checkpoint == 5
    ckdir = tmp_path / CHECKPOINT_DIR
    assert ckpt.steps(ckdir) == [5]
    ckpt.verify(ckdir, 5)
    # The model holds the state after step 6, exactly: compare with a clean run stopped after step 6.
    ref = DropMLP(nnx.Rngs(0))
    with pytest.raises(Interrupt):
        fit(ref, loss_fn, batch_fn, replace(cfg, log_every=6), callback=interrupt_at(6))
    assert_same_params(param_leaves(model), param_leaves(ref))


def test_non_finite_gradient_with_finite_loss_is_caught():
    def sqrt_loss(model, batch):
        mse, metrics = loss_fn(model, batch)
        return mse + 0.0 * jnp.sqrt(jnp.sum(jnp.abs(model.out.bias[...]))), metrics  # d/dx sqrt(0) = inf

    model = DropMLP(nnx.Rngs(0))
    before = param_leaves(model)
    with pytest.raises(NonFiniteLossError, match="non-finite gradient norm at step 1") as ei:
        fit(model, sqrt_loss, batch_fn, TrainConfig(steps=5, log_every=5))
    assert math.isfinite(ei.value.loss) and not math.isfinite(ei.value.grad_norm)
    assert_same_params(param_leaves(model), before)


def test_float16_parameters_under_adam_say_why_their_update_is_not_finite():
    # Adam's state in float16: squared gradients and eps round to 0, so a finite loss and gradient give a NaN
    # update. It said only "non-finite parameters or optimizer state after the update".
    model = jsr.Traveller(3, 4, 1, 0.0, param_dtype=jnp.float16, rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)
    with pytest.raises(NonFiniteLossError, match=r"non-finite parameters or optimizer state after the update at step "
                                                 r"1 .*; the parameters are float16, where Adam's squared gradients "
                                                 r"and its eps \(1e-8\) round to 0 \(0/0\): train float32 parameters "
                                                 r"with compute_dtype=jnp.float16, or bfloat16 ones$") as ei:
        fit(model, lambda m, b: ((m(b)[0] ** 2).mean(), {}), lambda i: x, TrainConfig(steps=2, log_every=1))
    assert math.isfinite(ei.value.loss) and math.isfinite(ei.value.grad_norm)
    # what it advises trains
    model = jsr.Traveller(3, 4, 1, 0.0, compute_dtype=jnp.float16, rngs=nnx.Rngs(0))
    fit(model, lambda m, b: ((m(b)[0] ** 2).mean(), {}), lambda i: x, TrainConfig(steps=2, log_every=1))



class HalfAmongFull(nnx.Module):
    """A float32 layer and one float16 parameter, which the losses below read at its zero gradient."""

    def __init__(self, rngs: nnx.Rngs):
        self.full = nnx.Linear(4, 1, rngs=rngs)
        self.half = nnx.Param(jnp.zeros((3,), jnp.float16))

    def __call__(self, x):
        return self.full(x)


def half_loss(model, batch):
    x, y = batch
    return jnp.mean((model(x) - y) ** 2) + jnp.sum(model.half[...].astype(jnp.float32) ** 2), {}


def test_the_float16_adam_hint_is_given_where_it_is_the_cause_and_only_there():
    cfg = TrainConfig(steps=2, log_every=1)
    # One float16 parameter is enough: its zero gradient's Adam update is 0/0 beside float32 ones.
    with pytest.raises(NonFiniteLossError, match=r"after the update at step 1 .*; the parameters are float16, where "
                                                 r"Adam's .*, or bfloat16 ones$"):
        fit(HalfAmongFull(nnx.Rngs(0)), half_loss, batch_fn, cfg)
    # The same update under an optimizer of the caller's own: fit does not know it is Adam, so no hint.
    with pytest.raises(NonFiniteLossError, match=r"after the update at step 1 ") as ei:
        fit(HalfAmongFull(nnx.Rngs(0)), half_loss, batch_fn, cfg, optimizer=optax.adam(1e-3))
    assert "float16" not in str(ei.value)
    # A non-finite loss or gradient has a cause of its own, float16 parameters or not.
    def nan_loss(model, batch):
        return half_loss(model, batch)[0] * jnp.nan, {}

    def nan_gradient(model, batch):  # d/dx sqrt(x) at 0 is inf: 0 * inf
        return half_loss(model, batch)[0] + 0.0 * jnp.sqrt(jnp.abs(model.half[...].astype(jnp.float32)).sum()), {}

    for loss, what in ((nan_loss, "loss"), (nan_gradient, "gradient norm")):
        with pytest.raises(NonFiniteLossError, match=rf"^non-finite {what} at step 1 ") as ei:
            fit(HalfAmongFull(nnx.Rngs(0)), loss, batch_fn, cfg)
        assert "float16" not in str(ei.value), what
    # float16 state that is no parameter (Adam does not update it) beside float32 parameters stepped to inf
    model = HalfAmongFull(nnx.Rngs(0))
    model.half = nnx.BatchStat(jnp.zeros((3,), jnp.float16))
    with pytest.raises(NonFiniteLossError, match=r"after the update at step 1 ") as ei:
        fit(model, half_loss, batch_fn, replace(cfg, learning_rate=1e39))  # inf in float32
    assert "float16" not in str(ei.value)

def test_fit_argument_errors(tmp_path):
    cfg = TrainConfig(steps=2)
    m = DropMLP(nnx.Rngs(0))
    with pytest.raises(TypeError, match="^loss_fn: expected to return"):
        fit(m, lambda model, b: jnp.mean(model(b[0])), batch_fn, cfg)
    with pytest.raises(ValueError, match="^loss_fn: expected a scalar"):
        fit(m, lambda model, b: (model(b[0]), {}), batch_fn, cfg)
    with pytest.raises(ValueError, match="^out_dir:"):
        fit(m, loss_fn, batch_fn, cfg, resume=True)
    with pytest.raises(ValueError, match="^metadata:"):
        fit(m, loss_fn, batch_fn, cfg, metadata={"train_config": 1})
    (tmp_path / CHECKPOINT_DIR).write_text("a file where the checkpoints go")
    with pytest.raises(ValueError, match=f"^out_dir: expected {tmp_path / CHECKPOINT_DIR} to be the run's checkpoint "
                                         "directory, got a file"):
        fit(m, loss_fn, batch_fn, cfg, out_dir=tmp_path, resume=True)
    assert not (tmp_path / METRICS_FILE).exists()  # refused before anything is written
    with pytest.raises(TypeError, match="^cfg:"):
        fit(m, loss_fn, batch_fn, {"steps": 2})
    # The caller's model is intact after a failed call (fit works on its own copies).
    assert np.all(np.isfinite(param_leaves(m)["['lin']['kernel'].value"]))


def test_metadata_that_is_not_json_is_refused_before_the_first_update(tmp_path):
    # It was refused by the first checkpoint's save, checkpoint_every updates (1000 by default) into the run, which
    # then died with no checkpoint.
    events = []
    with pytest.raises(TypeError, match=r"^metadata: expected a JSON-serialisable dict, got one that is not \(Object "
                                        r"of type float32 is not JSON serializable\)$"):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, batch_fn, TrainConfig(steps=2, log_every=1), out_dir=tmp_path,
            metadata={"scale": np.float32(0.5)}, callback=events.append)
    assert events == [] and not (tmp_path / METRICS_FILE).exists()
    with pytest.raises(TypeError, match=r"^metadata: expected a dict of JSON values or None, got str$"):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, batch_fn, TrainConfig(steps=2), metadata="run 7")


def test_a_loss_fn_that_calls_a_model_from_its_enclosing_scope_is_told_nothing_trains():
    # That model is a constant to the traced step: the gradient was exactly 0, the model never changed, and fit
    # logged its rows (grad_norm 0.0) in silence.
    outer = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    kernel = np.asarray(outer.kernel[...])
    with pytest.warns(UserWarning, match=r"^fit: the gradient of the loss with respect to the model's nnx.Param was 0 "
                                         r"in updates 1-2, the loss did not train them: does loss_fn call the model "
                                         r"it is given \(its first argument\)"):
        fit(outer, lambda model, batch: mse_fn(outer, batch), batch_fn, TrainConfig(steps=2, log_every=2))
    np.testing.assert_array_equal(outer.kernel[...], kernel)  # what the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the same model and loss, its argument called: trains, unwarned
        fit(outer, mse_fn, batch_fn, TrainConfig(steps=2, log_every=2))
    assert not np.array_equal(outer.kernel[...], kernel)


def test_a_loss_without_gradient_is_warned_about_once_per_run_not_at_every_row():
    outer = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    with pytest.warns(UserWarning) as record:
        history = fit(outer, lambda model, batch: mse_fn(outer, batch), batch_fn, TrainConfig(steps=6, log_every=2))
    assert len(history.train) == 3  # three rows, each with grad_norm 0
    # said for the first row's updates, not again for each row after (the same cause, nothing new)
    assert [str(w.message).split(", ")[0] for w in record] == [
        "fit: the gradient of the loss with respect to the model's nnx.Param was 0 in updates 1-2"]


def test_data_parallel_on_one_device_trains_without_the_replicated_batch_warning():
    # On one device dp.data splits the batch into one block, which JAX calls fully replicated: the warning about a
    # batch given whole to each of several devices is not for it (the CLI's usual run on one CPU or GPU).
    from jax_scan_rnn.distributed import DataParallel

    dp = DataParallel.create(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        history = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, batch_fn, TrainConfig(steps=2, log_every=2),
                      data_sharding=dp.data)
    assert history.step == 2


def test_a_state_sharding_that_splits_an_axis_the_scalars_lack_names_the_argument_and_leaves():
    # fit(state_sharding=dp.data) (.data given for .replicated) failed in JAX's device_put: "only valid for values
    # of rank at least 1", naming neither fit's argument nor a leaf. Any 1-device mesh shows it, in this process.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    split = NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), PartitionSpec("data"))
    with pytest.raises(ValueError, match=r"^state_sharding: expected a sharding every state array can take \(the whole "
                                         r"state on each device: DataParallel.replicated\), got P\('data',\), which "
                                         r"needs 1 or more axes, and leaves with fewer: 'optimizer/opt_state/1/0/count', "
                                         r"'optimizer/opt_state/1/1/count', 'optimizer/step'$"):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, batch_fn, TrainConfig(steps=1), state_sharding=split)


def test_step_overhead_is_small():
    """Steady-state wall time per update of fit on a tiny model (measured ~60-110 us on 2 CPU cores,
    shared machine); a loose bound so that a regression to per-step graph traversal (~1 ms) fails."""
    x, y = batch_fn(0)
    marks = {}

    def cb(e):
        if e["event"] == "log":
            marks[e["step"]] = time.perf_counter()

    cfg = TrainConfig(steps=3000, log_every=1000, eval_every=0, checkpoint_every=0)
    fit(DropMLP(nnx.Rngs(0)), loss_fn, lambda i: (x, y), cfg, callback=cb)
    per_step = (marks[3000] - marks[1000]) / 2000
    assert per_step < 600e-6, f"{per_step * 1e6:.0f} us per step"


def test_curves_draw_what_changes_and_name_what_does_not():
    from jax_scan_rnn.runlog import curve_panels

    rows = [{"step": i, "split": "train", "loss": 1 / i, "lr": 0.1, "grad_norm": float(i),
             "metrics": {"p_replace": 0.0, "acc": i / 10}} for i in range(1, 6)]
    evals = [{"step": 5, "split": "eval", "loss": 0.3, "metrics": {"loss": 0.3, "acc": 0.2}}]
    panels, constant = curve_panels(History(train=rows, eval=evals, step=5))
    assert list(panels) == ["loss", "grad_norm", "acc"]
    assert constant == {"lr": 0.1, "p_replace": 0.0}  # named in the figure's title instead of a flat panel
    assert panels["acc"]["eval"] == [(5, 0.2)] and len(panels["acc"]["train"]) == 5


def test_curves_draw_a_series_logged_once():
    """A run shorter than two log windows (the CLI's `--steps 20`, logging every 25) has one train row: its loss and a
    cosine learning rate were drawn nowhere and named "constant" in the title, which they were not. One point is a
    panel; two or more equal points are a constant."""
    from jax_scan_rnn.runlog import curve_panels

    rows = [{"step": 6, "split": "train", "loss": -0.5, "lr": 2e-4, "grad_norm": 0.2, "metrics": {"utility": 0.5}}]
    evals = [{"step": 6, "split": "eval", "loss": None, "metrics": {"utility": 0.7, "over_optimal": 0.04}}]
    panels, constant = curve_panels(History(train=rows, eval=evals, step=6))
    assert constant == {}
    assert list(panels) == ["loss", "lr", "grad_norm", "utility", "over_optimal"]
    assert panels["lr"] == {"train": [(6, 2e-4)]} and panels["over_optimal"]["eval"] == [(6, 0.04)]
    # the same value logged twice is a constant, across the splits too
    twice = [{**evals[0], "step": step, "metrics": {"over_optimal": 0.04}} for step in (6, 7)]
    panels, constant = curve_panels(History(train=rows, eval=twice, step=7))
    assert constant == {"over_optimal": 0.04} and "loss" in panels


def test_curves_leave_out_points_that_are_not_finite():
    from jax_scan_rnn.runlog import curve_panels

    rows = [{"step": s, "split": "train", "loss": loss} for s, loss in ((1, 1.0), (2, float("nan")), (3, 0.5),
                                                                         (4, float("inf")))]
    panels, _ = curve_panels(History(train=rows, eval=[], step=4))
    assert panels["loss"]["train"] == [(1, 1.0), (3, 0.5)]


def test_the_log_reader_skips_lines_that_are_not_rows(tmp_path):
    # A note added by hand (or by another tool) between rows: the run's rows are read, and resuming keeps them.
    from jax_scan_rnn.runlog import RunLog, read_rows

    (tmp_path / METRICS_FILE).write_text('{"step": 1, "split": "train"}\n{"note": "by hand"}\n[1, 2]\n'
                                         '{"step": 5, "split": "train"}\n{"step": 6, "spl')
    assert [r["step"] for r in read_rows(tmp_path / METRICS_FILE)] == [1, 5]
    log = RunLog(tmp_path)
    log.resume_at(2)
    assert [r["step"] for r in log.rows] == [1]
    assert read_rows(tmp_path / METRICS_FILE) == [{"step": 1, "split": "train"}]


def test_the_log_reader_skips_bytes_that_are_not_text_and_resume_goes_on(tmp_path):
    """A line of binary garbage in metrics.jsonl (a bad disk block, a tool's mistake) made every reader raise
    UnicodeDecodeError, a message naming no file, and refused resuming a run whose checkpoints were intact."""
    from jax_scan_rnn.runlog import read_rows

    cfg = replace(RESUME_CFG, steps=10, eval_every=0, log_every=5)
    fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path)
    log = tmp_path / METRICS_FILE
    rows = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(rows[0] + b"\xd3\xff\x00garbage\n" + b"".join(rows[1:]))
    assert [r["step"] for r in read_rows(log)] == [5, 10]
    h = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, replace(cfg, steps=15), out_dir=tmp_path,
            resume=True, callback=lambda event: None)  # (heard: steps changed on purpose, no warning)
    assert h.resumed_from == 10 and [r["step"] for r in read_rows(log)] == [5, 10, 15]


# ----------------------------------------------------------------------------- mutation round 7's survivors


def test_a_non_finite_update_names_the_newest_checkpoint_kept():
    """With several checkpoints kept (2, 4, 6 before a NaN at update 7), the error points at the newest."""
    def bad_at_7(i):
        x, y = linear_batch_fn(i)
        return x, y * (jnp.nan if i == 6 else 1.0)

    with tempfile.TemporaryDirectory() as out, pytest.raises(NonFiniteLossError) as caught:
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, bad_at_7,
            TrainConfig(steps=20, log_every=100, eval_every=0, checkpoint_every=2, keep_checkpoints=3), out_dir=out)
    assert caught.value.step == 7 and caught.value.last_checkpoint == 6 and "step 6) is kept" in str(caught.value)


def test_a_short_last_window_is_the_mean_of_its_own_updates():
    """steps=10, log_every=4: the last row averages updates 9 and 10 (its window's count), as rows of one update
    each show."""
    def run(every):
        return fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), loss_fn_linear_mae, linear_batch_fn,
                   TrainConfig(steps=10, log_every=every, eval_every=0, checkpoint_every=0)).train

    each, last = run(1), run(4)[-1]
    assert last["step"] == 10
    assert last["loss"] == pytest.approx(np.mean([r["loss"] for r in each[8:10]]), rel=1e-5)
    assert last["metrics"]["mae"] == pytest.approx(np.mean([r["metrics"]["mae"] for r in each[8:10]]), rel=1e-5)


def loss_fn_linear_mae(model, batch):
    x, y = batch
    err = model(x) - y
    return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}


def test_a_run_stopped_at_an_eval_step_evaluates_there(tmp_path):
    """stop() at update 8 with eval_every=4: update 8 is evaluated before the stop, so the resumed run's eval rows
    are the straight run's."""
    from jax_scan_rnn.train import TrainingStopped

    def weights(model):
        return {"w": float(jnp.sum(model.kernel[...]))}

    cfg = TrainConfig(steps=12, log_every=2, eval_every=4, checkpoint_every=100)
    straight = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path / "a",
                   eval_fn=weights)
    asked = itertools.count(1)
    with pytest.raises(TrainingStopped):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path / "b",
            eval_fn=weights, stop=lambda: next(asked) >= 8)
    resumed = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path / "b",
                  eval_fn=weights, resume=True)
    assert [r["step"] for r in resumed.eval] == [r["step"] for r in straight.eval] == [4, 8, 12]


def test_the_log_is_strict_json_and_a_resume_reads_nan_back(tmp_path):
    # A metric undefined for the run (NaN) is written as null, which strict JSON parsers (jq, JavaScript) take where a
    # bare NaN is refused; the rows a resume reads back hold NaN again, as the uninterrupted run's History did.
    from jax_scan_rnn.runlog import read_rows

    cfg = TrainConfig(steps=4, log_every=2, eval_every=2, checkpoint_every=2, clip_norm=None)

    def eval_fn(model):
        return {"undefined": float("nan")}  # no "loss": the eval rows' loss is None

    first = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path, eval_fn=eval_fn)

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    lines = [json.loads(line, parse_constant=refuse) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["metrics"]["undefined"] for r in lines if r["split"] == "eval"] == [None, None]
    again = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path, eval_fn=eval_fn,
                resume=True)
    assert again.resumed_from == 4 and len(again.eval) == len(first.eval) == 2
    for row in again.eval:
        assert math.isnan(row["metrics"]["undefined"]) and row["loss"] is None
    assert again.train == first.train
    # An eval loss that was NaN comes back as NaN, a train row's too.
    (tmp_path / "b.jsonl").write_text('{"step": 1, "split": "eval", "loss": null, "metrics": {"loss": null}}\n'
                                      '{"step": 1, "split": "train", "loss": null, "grad_norm": null, "metrics": {}}\n')
    evaluated, trained = read_rows(tmp_path / "b.jsonl")
    assert math.isnan(evaluated["loss"]) and math.isnan(trained["loss"]) and math.isnan(trained["grad_norm"])


def test_a_resume_with_other_metrics_restarts_the_log_window(tmp_path):
    # A metric added to loss_fn between runs: the checkpoint's log window sums other metrics, so the run resumes
    # with a fresh window (and says so) instead of failing on the checkpoint's tree; the trajectory is unchanged.
    cfg = TrainConfig(steps=4, log_every=3, checkpoint_every=1, clip_norm=None)
    with pytest.raises(TrainingStopped):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, cfg, out_dir=tmp_path / "a",
            stop=lambda: True)
    with pytest.warns(UserWarning, match=r"metrics \['mae', 'max_err'\] are not the saved run's \[\]"):
        resumed = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), loss_fn, linear_batch_fn, cfg, out_dir=tmp_path / "a",
                      resume=True)
    every = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), loss_fn, linear_batch_fn, replace(cfg, log_every=1))
    per_update = {r["step"]: r for r in every.train}
    first = resumed.train[0]
    assert first["step"] == 3  # updates 2 and 3: the window restarted after update 1
    for key in ("loss", "grad_norm"):
        assert first[key] == pytest.approx((per_update[2][key] + per_update[3][key]) / 2, rel=1e-6)
    assert first["metrics"]["mae"] == pytest.approx((per_update[2]["metrics"]["mae"]
                                                     + per_update[3]["metrics"]["mae"]) / 2, rel=1e-6)
    assert resumed.train[1]["loss"] == per_update[4]["loss"]  # the same update: a one-update window
    # ...and back: the metric removed again, with a callback listening instead of a warning.
    events = []
    fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, replace(cfg, steps=5), out_dir=tmp_path / "a",
        resume=True, callback=events.append)
    changed = [e for e in events if e["event"] == "metrics_changed"]
    assert changed == [{"event": "metrics_changed", "path": str(tmp_path / "a"), "saved": ["mae", "max_err"],
                        "now": []}]


def float32_batch_fn(i):
    """linear_batch_fn's data built in float32 alone: the same in 64-bit mode and out of it (W_TRUE is float64)."""
    x = jax.random.normal(jax.random.key(1000 + i), (64, 4), jnp.float32)
    return x, x @ jnp.asarray(W_TRUE, jnp.float32) + 0.5


def test_a_resume_under_another_environment_says_so_and_goes_on(tmp_path):
    # Each checkpoint records environment() (jax, jaxlib, backend, device kind and count, 64-bit mode): a resume
    # under another goes on, as the same run, but says it is no longer bit for bit the uninterrupted run's. Here the
    # run is saved in 64-bit mode (the tests' own) and resumed without it, as from a shell without JAX_ENABLE_X64.
    cfg = TrainConfig(steps=4, log_every=1, checkpoint_every=1, clip_norm=None)
    with jax.enable_x64(True), pytest.raises(TrainingStopped):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, float32_batch_fn, cfg, out_dir=tmp_path / "a",
            stop=lambda: True)
    saved = ckpt.read_metadata(tmp_path / "a" / CHECKPOINT_DIR)["environment"]
    assert saved == {**environment(), "jax_enable_x64": True} and saved["jax"] == jax.__version__
    events = []
    with jax.enable_x64(False):
        resumed = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, float32_batch_fn, cfg, out_dir=tmp_path / "a",
                      resume=True, callback=events.append)
        last = ckpt.read_metadata(tmp_path / "a" / CHECKPOINT_DIR)["environment"]
        assert last["jax_enable_x64"] is False  # what ran last
    assert resumed.resumed_from == 1 and resumed.step == 4
    assert [e for e in events if e["event"] == "environment_changed"] == [
        {"event": "environment_changed", "path": str(tmp_path / "a"), "fields": {"jax_enable_x64": [True, False]}}]
    # Without a callback, a warning that names the difference (beside the one for the changed steps); the same
    # environment again, nothing.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, float32_batch_fn, replace(cfg, steps=5),
            out_dir=tmp_path / "a", resume=True)
    said = [str(w.message) for w in caught if "environment" in str(w.message)]
    assert said == [f"fit: the run in {tmp_path / 'a'} was saved under another environment (jax_enable_x64 False -> "
                    "True): it goes on, but not bit for bit as the uninterrupted run would have"], said
    events = []
    fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, float32_batch_fn, replace(cfg, steps=6), out_dir=tmp_path / "a",
        resume=True, callback=events.append)
    assert not [e for e in events if e["event"] == "environment_changed"]


def test_a_checkpoint_from_before_the_environment_was_recorded_resumes_without_a_note(tmp_path, monkeypatch):
    # Runs saved before 2026-12-07 hold no environment: nothing to compare, nothing said.
    save = ckpt.save

    def save_without(directory, step, state, metadata, **kwargs):
        return save(directory, step, state, {k: v for k, v in metadata.items() if k != "environment"}, **kwargs)

    cfg = TrainConfig(steps=3, log_every=1, checkpoint_every=1, clip_norm=None)
    monkeypatch.setattr(ckpt, "save", save_without)
    with pytest.raises(TrainingStopped):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, float32_batch_fn, cfg, out_dir=tmp_path / "a",
            stop=lambda: True)
    monkeypatch.undo()
    assert "environment" not in ckpt.read_metadata(tmp_path / "a" / CHECKPOINT_DIR)
    events = []
    with jax.enable_x64(not jax.config.jax_enable_x64):
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, float32_batch_fn, cfg, out_dir=tmp_path / "a", resume=True,
            callback=events.append)
    assert not [e for e in events if e["event"] == "environment_changed"]


def test_fit_refuses_metadata_that_uses_its_own_keys():
    for key in RESERVED_METADATA:
        with pytest.raises(ValueError, match=f"metadata: expected no '{key}' key \\(fit adds it\\), got one"):
            fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, TrainConfig(steps=1),
                metadata={key: 1})


def test_fit_trains_with_an_optax_transformation_of_ones_own(tmp_path):
    # fit(optimizer=tx) is the loop around TrainStep(..., tx): the same updates bit for bit, resumable; cfg's
    # optimiser fields, which it then does not read, are refused when set.
    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.05, momentum=0.9))
    cfg = TrainConfig(steps=6, log_every=1, checkpoint_every=3)
    a = DropMLP(nnx.Rngs(0))
    with pytest.raises(TrainingStopped):  # stopped after update 3, then resumed: the straight run's updates
        fit(a, loss_fn, batch_fn, cfg, out_dir=tmp_path, optimizer=tx, stop=iter([False, False, True]).__next__)
    hist = fit(DropMLP(nnx.Rngs(9)), loss_fn, batch_fn, cfg, out_dir=tmp_path, optimizer=tx, resume=True)
    assert hist.resumed_from == 3
    b = DropMLP(nnx.Rngs(0))
    step = TrainStep(b, loss_fn, tx, batch_fn(0))
    carry = step.init()
    losses = []
    for i in range(cfg.steps):
        carry = step(carry, batch_fn(i))
        losses.append(float(step.read(carry)["window"]["loss"]))
        carry = step.reset(carry)
    logged = [r["loss"] for r in fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, cfg, optimizer=tx).train]
    assert logged == losses
    assert [r["loss"] for r in hist.train] == losses  # rows 1-3 read back from the interrupted run's log
    assert all(math.isnan(r["lr"]) for r in hist.train)  # not known: no schedule of fit's
    # A default written out (another float object of the same value) is no change.
    fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(cfg, steps=1, learning_rate=float("0.001")), optimizer=tx)
    for field, value in (("learning_rate", 1e-2), ("clip_norm", None), ("weight_decay", 0.1), ("warmup_steps", 1),
                         ("lr_schedule", "constant"), ("final_lr_fraction", 0.5)):
        with pytest.raises(ValueError, match=rf"^cfg\.{field}: not read with optimizer="):
            fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, replace(cfg, **{field: value}), optimizer=tx)
    with pytest.raises(TypeError, match="optimizer"):
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, cfg, optimizer=optax.sgd)


class ScalarStateMLP(nnx.Module):
    """A model whose Variables hold Python scalars, as `nnx.Variable(0)` does: a call counter and a fixed scale."""

    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(4, 1, rngs=rngs)
        self.calls = nnx.Variable(0)
        self.scale = nnx.Variable(0.5)

    def __call__(self, x):
        self.calls.set_value(self.calls.get_value() + 1)
        return self.lin(x) * self.scale.get_value()


def test_fit_trains_and_restores_a_model_whose_variables_hold_python_scalars(tmp_path):
    # jit takes a Python scalar leaf as an array; TrainStep read every state leaf's .dtype and failed with
    # "AttributeError: 'int' object has no attribute 'dtype'" before the first update (restore_model the same).
    model = ScalarStateMLP(nnx.Rngs(0))
    fit(model, mse_fn, batch_fn, TrainConfig(steps=3, log_every=1), out_dir=tmp_path)
    assert int(model.calls.get_value()) == 3  # carried: one forward pass per update
    restored = ScalarStateMLP(nnx.Rngs(1))
    assert restore_model(tmp_path, restored).step == 3
    assert int(restored.calls.get_value()) == 3 and float(restored.scale.get_value()) == 0.5
    np.testing.assert_array_equal(restored.lin.kernel[...], model.lin.kernel[...])


def test_a_model_whose_variables_hold_python_scalars_restores_without_x64(tmp_path):
    # The tests run with x64 (conftest), where a Python int's array is int64 in NumPy and JAX alike; a user's default
    # is without it: jit saves the counter as int32 and the scale as float32, JAX's dtypes for Python scalars, which
    # restore_model must expect (NumPy's int64 and float64 would refuse the run's own checkpoint).
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)  # (batch_fn's W_TRUE is float64)
    with jax.enable_x64(False):
        fit(ScalarStateMLP(nnx.Rngs(0)), mse_fn, lambda i: (x, x[:, :1]), TrainConfig(steps=2, log_every=1),
            out_dir=tmp_path)
        restored = ScalarStateMLP(nnx.Rngs(1))
        assert restore_model(tmp_path, restored).step == 2
    assert int(restored.calls.get_value()) == 2 and float(restored.scale.get_value()) == 0.5


def test_a_batch_fn_whose_iterator_runs_out_is_named_and_stops_no_loop_around_fit():
    # batch_fn's StopIteration left fit as a bare StopIteration: it ended the loop of any iterator fit ran in,
    # so list(map(train, seeds)) returned fewer runs than seeds, silently.
    def train(seed):
        batches = iter([batch_fn(0), batch_fn(1)])
        return fit(nnx.Linear(4, 1, rngs=nnx.Rngs(seed)), mse_fn, lambda i: next(batches), TrainConfig(steps=4))

    with pytest.raises(ValueError, match=r"^batch_fn\(2\): expected the batch of update 3 of 4, got StopIteration"):
        list(map(train, [0, 1]))


def test_a_batch_fn_whose_iterator_is_empty_is_named_at_the_first_batch():
    # fit reads batch_fn(0) before the loop (to build the step): an iterator with no batch at all is named there too
    empty = iter([])
    with pytest.raises(ValueError, match=r"^batch_fn\(0\): expected the batch of update 1 of 3, got StopIteration"):
        list(map(lambda seed: fit(nnx.Linear(4, 1, rngs=nnx.Rngs(seed)), mse_fn, lambda i: next(empty),
                                  TrainConfig(steps=3)), [0]))

# optax.MultiSteps averages the gradients as it goes (acc += (g - acc) / k), in float32, another order of operations
# than (g0 + g1) / 2: a few ulps of the kernel's O(1) entries
MEAN_GRADIENT_ROUNDING = {"rtol": 1e-6, "atol": 1e-7}


def test_optax_multisteps_accumulates_gradients_in_train_step_and_fit():
    # optax's gradient accumulation is an object holding a transformation (optax's own examples pass it as the
    # optimizer), not a GradientTransformation: fit and TrainStep refused it ("expected GradientTransformation").
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    kernel = np.asarray(model.kernel[...])
    grads = [nnx.grad(lambda m: mse_fn(m, batch_fn(i))[0])(model)["kernel"][...] for i in range(2)]
    step = TrainStep(model, mse_fn, optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2), batch_fn(0))
    carry = step(step.init(), batch_fn(0))
    step.write(carry)
    np.testing.assert_array_equal(model.kernel[...], kernel)  # the first batch's gradient only accumulated
    step.write(step(carry, batch_fn(1)))
    # one SGD update with the mean of the two gradients
    np.testing.assert_allclose(model.kernel[...], kernel - 0.1 * (grads[0] + grads[1]) / 2, **MEAN_GRADIENT_ROUNDING)
    fit(model, mse_fn, batch_fn, TrainConfig(steps=2), optimizer=optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2))
    assert not np.allclose(model.kernel[...], kernel - 0.1 * (grads[0] + grads[1]) / 2)  # fit took it and trained


def test_fit_warns_of_batches_multisteps_accumulated_but_never_applied():
    """steps=5 with k=2: the fifth batch's gradient was accumulated and dropped, without a word."""
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    with pytest.warns(UserWarning, match=r"^optimizer: the last 1 of cfg.steps=5 batches were accumulated by "
                                         r"optax.MultiSteps but never applied; make cfg.steps a multiple of its k$"):
        fit(model, mse_fn, batch_fn, TrainConfig(steps=5), optimizer=optax.MultiSteps(optax.sgd(0.1), 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(model, mse_fn, batch_fn, TrainConfig(steps=4), optimizer=optax.MultiSteps(optax.sgd(0.1), 2))


# float32 least squares in 4 unknowns solved by L-BFGS: a few ulps of W_TRUE's O(1) entries left
LBFGS_SOLUTION_ATOL = 1e-5


def test_transformations_with_extra_arguments_get_the_loss_gradient_and_loss_function():
    # optax.contrib.reduce_on_plateau (torch's ReduceLROnPlateau) and optax.lbfgs read the loss (`value`) and, for
    # L-BFGS's line search, `grad` and `value_fn` in update(): fit called update without them, and the run died in
    # optax ("update_fn() missing 1 required keyword-only argument: 'value'").
    def update(updates, state, params, *, value, grad, value_fn, **extra):  # what it was given, kept in its state
        zeros = jax.tree.map(jnp.zeros_like, params)
        return updates, {"value": jnp.float32(value), "again": jnp.float32(value_fn(params)),
                         "moved": jnp.float32(value_fn(zeros)),
                         "grad": grad["lin"]["kernel"], "updates": updates["lin"]["kernel"]}

    def init(params):
        return {**{k: jnp.float32(0) for k in ("value", "again", "moved")},
                "grad": jnp.zeros((4, 16), jnp.float32), "updates": jnp.zeros((4, 16), jnp.float32)}

    model = DropMLP(nnx.Rngs(0))  # dropout: value_fn draws the step's own masks and leaves the model's rng as it was
    step = TrainStep(model, loss_fn, optax.GradientTransformationExtraArgs(init, update), batch_fn(0))
    carry = step(step.init(), batch_fn(0))
    loss = float(step.read(carry)["window"]["loss"])
    step.write(carry)
    seen = {k: np.asarray(v[...]) for k, v in step.optimizer.opt_state.items()}
    assert float(seen["value"]) == loss  # this batch's loss, as logged
    assert float(seen["again"]) == loss  # value_fn at the parameters: the same loss, dropout masks and all
    assert float(seen["moved"]) == pytest.approx(float(jnp.mean((batch_fn(0)[1]) ** 2)))  # zero parameters: 0 out
    np.testing.assert_array_equal(seen["grad"], seen["updates"])  # `grad`: the gradient the update is given
    # and the models train: L-BFGS solves least squares; reduce_on_plateau runs (a plain GradientTransformation's
    # update, sgd's, is still called without them)
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))
    fit(model, mse_fn, lambda i: linear_batch_fn(0), TrainConfig(steps=12), optimizer=optax.lbfgs())
    np.testing.assert_allclose(model.kernel[...], W_TRUE, atol=LBFGS_SOLUTION_ATOL)
    np.testing.assert_allclose(model.bias[...], [0.5], atol=LBFGS_SOLUTION_ATOL)
    plateau = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau(patience=1))
    assert fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, TrainConfig(steps=3), optimizer=plateau)
    assert fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, linear_batch_fn, TrainConfig(steps=3),
               optimizer=optax.GradientTransformation(optax.sgd(0.1).init, optax.sgd(0.1).update))


def test_steps_per_s_is_the_rate_since_the_last_row(monkeypatch):
    # A clock that moves only when batch_fn is called: one second per update after the first (whose batch fit
    # fetched before the loop), so each row's window is timed from the row before, not from the run's start.
    import types

    import jax_scan_rnn.train as train_module

    clock = [1000.0]
    monkeypatch.setattr(train_module, "time", types.SimpleNamespace(time=lambda: clock[0]))

    def timed_batches(i):
        clock[0] += 1.0 if i else 0.0
        return linear_batch_fn(i)

    hist = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), mse_fn, timed_batches, TrainConfig(steps=6, log_every=2))
    assert [r["steps_per_s"] for r in hist.train] == [2.0, 1.0, 1.0]  # updates 1-2 in 1 s, then 2 per 2 s
    assert [r["elapsed_s"] for r in hist.train] == [1.0, 3.0, 5.0]


def test_a_checkpoint_from_before_logged_metrics_resumes_its_window(tmp_path, monkeypatch):
    # Checkpoints written before runs recorded loss_fn's metric names: the same metrics are assumed, the log window
    # restored (no metrics_changed), and the resumed rows are the uninterrupted run's.
    import jax_scan_rnn.train as train_module

    save = train_module.ckpt.save

    def save_as_before(directory, step, state, metadata, **kwargs):
        return save(directory, step, state, {k: v for k, v in metadata.items() if k != "logged_metrics"}, **kwargs)

    cfg = TrainConfig(steps=4, log_every=3, checkpoint_every=1, clip_norm=None)
    monkeypatch.setattr(train_module.ckpt, "save", save_as_before)
    with pytest.raises(TrainingStopped):  # after update 2, inside the first log window
        fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), loss_fn, linear_batch_fn, cfg, out_dir=tmp_path,
            stop=iter([False, True]).__next__)
    monkeypatch.setattr(train_module.ckpt, "save", save)
    events = []
    resumed = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), loss_fn, linear_batch_fn, cfg, out_dir=tmp_path, resume=True,
                  callback=events.append)
    assert resumed.resumed_from == 2 and not [e for e in events if e["event"] == "metrics_changed"]
    straight = fit(nnx.Linear(4, 1, rngs=nnx.Rngs(0)), loss_fn, linear_batch_fn, cfg)
    assert [(r["step"], r["loss"], r["metrics"]) for r in resumed.train] == [
        (r["step"], r["loss"], r["metrics"]) for r in straight.train]


def test_strict_json_writes_null_for_a_nan_in_a_tuple_too():
    from jax_scan_rnn.runlog import strict_json

    assert strict_json({"a": (1.0, float("nan")), "b": [float("inf")]}) == '{"a": [1.0, null], "b": [null]}'
    # NumPy scalars (the benchmark's results hold them) are numbers, and a non-finite one is null too
    assert strict_json([np.float32(1.5), np.float32("nan"), np.float64("-inf"), np.int64(3), True]) == \
        '[1.5, null, null, 3, true]'


def test_batches_of_ever_new_shapes_warn_once_that_each_compiles_the_step_again(monkeypatch):
    """A batch_fn whose shapes change every step recompiles the train step at every update (jax.jit's rule): past
    MANY_BATCH_SHAPES distinct shapes fit warns once, naming the count and the remedy; fewer shapes say nothing."""
    monkeypatch.setattr(jsr.train, "MANY_BATCH_SHAPES", 3)  # four compiles instead of 33 keep the test quick

    def growing(i):  # batch size 2, 3, 4, ...: a new shape at every update
        x = jax.random.normal(jax.random.key(i), (2 + i, 4))
        return x, x @ W_TRUE

    cfg = TrainConfig(steps=6, log_every=6, eval_every=0, checkpoint_every=0)
    with pytest.warns(UserWarning, match=r"^batch: expected a few fixed shapes, got 4 different ones \(this one's "
                      r"arrays: \[\[5, 4\], \[5, 1\]\]\); each compiles the train step again") as record:
        fit(DropMLP(nnx.Rngs(0)), mse_fn, growing, cfg)
    shape_warnings = [w for w in record if "fixed shapes" in str(w.message)]
    assert len(shape_warnings) == 1, [str(w.message) for w in shape_warnings]
    assert shape_warnings[0].filename == __file__  # the user's line that called fit, not the library's

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # three shapes (a few buckets) are fine
        fit(DropMLP(nnx.Rngs(0)), mse_fn, lambda i: growing(i % 3), cfg)


def test_history_series_refuses_a_key_or_split_the_run_has_not():
    """A misspelt metric or split gave an empty series (an empty plot, no error); "val" read the eval rows."""
    rows = [{"step": i, "split": "train", "loss": 1 / i, "lr": 0.1, "metrics": {"acc": i / 10}} for i in (1, 2)]
    history = History(train=rows, eval=[{"step": 2, "split": "eval", "loss": 0.3, "metrics": {"f1": 0.5}}], step=2)
    assert history.series("acc") == ([1, 2], [0.1, 0.2])
    assert history.series("f1", "eval") == ([2], [0.5])
    assert history.series("f1") == ([], [])  # a metric of the other split only: empty, as before
    with pytest.raises(ValueError, match=r"key: expected a row field or metric of this run, one of .*acc.*; "
                                         r"got 'accuracy'"):
        history.series("accuracy")
    with pytest.raises(ValueError, match="split: expected 'train' or 'eval', got 'val'"):
        history.series("loss", "val")
    assert History(train=[], eval=[], step=0).series("loss") == ([], [])  # no rows: nothing to tell a key by


def test_ctrl_c_during_an_update_leaves_the_model_at_the_state_after_it(monkeypatch):
    """A KeyboardInterrupt raised as the (donating) step call returns lost the old carry and the new one: the model
    kept the state of its last log row, here its initial weights, not the 3 updates done. SIGINT is now held until
    the step's carry is stored, then raised: the model holds the state after update 3, as `stop` after 3 leaves it."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed in the main thread")
    cfg = TrainConfig(steps=10, log_every=10, eval_every=0, checkpoint_every=0)
    asked = itertools.count(1)
    stopped = DropMLP(nnx.Rngs(0))
    with pytest.raises(TrainingStopped):
        fit(stopped, loss_fn, batch_fn, cfg, stop=lambda: next(asked) == 3)  # asked after each update
    call = TrainStep.__call__
    calls = itertools.count(1)

    def sigint_as_the_third_update_returns(self, carry, batch):
        carry = call(self, carry, batch)
        if next(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Python raises it at the next bytecode, before `return`
        return carry

    monkeypatch.setattr(TrainStep, "__call__", sigint_as_the_third_update_returns)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python and Jupyter install it
    try:
        model = DropMLP(nnx.Rngs(0))
        with pytest.raises(KeyboardInterrupt):
            fit(model, loss_fn, batch_fn, cfg)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getsignal(signal.SIGINT) is previous
    assert_same_params(param_leaves(model), param_leaves(stopped))


def test_fit_installs_the_ctrl_c_hold_once_not_at_every_logged_step(monkeypatch):
    # Two signal calls around a step cost up to a quarter of the smallest one (docs/measurements.md): fit's writes
    # inside its loop (a log row at every update here) keep the holding handler; its end puts Python's back.
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed in the main thread")
    calls = []
    real = signal.signal
    monkeypatch.setattr(signal, "signal", lambda *a: calls.append(a[1]) or real(*a))
    previous = real(signal.SIGINT, signal.default_int_handler)
    try:
        fit(DropMLP(nnx.Rngs(0)), loss_fn, batch_fn, TrainConfig(steps=6, log_every=1, eval_every=0,
                                                                 checkpoint_every=0))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        real(signal.SIGINT, previous)
    assert len(calls) == 2 and calls[1] is signal.default_int_handler, calls  # installed once, put back once


def _sigint_inside_update(k: int):
    """`(straight, model, step)`: a model after k updates in a loop of one's own (the reference), and a fresh model
    whose TrainStep sends the process a SIGINT inside its k-th call, after the carry was donated (Python runs the
    handler at its next bytecode, still in the call)."""
    import signal

    straight = DropMLP(nnx.Rngs(0))
    step = TrainStep(straight, loss_fn, optax.adam(1e-2), batch_fn(0))
    carry = step.init()
    for i in range(k):
        carry = step(carry, batch_fn(i))
    step.write(carry)
    model = DropMLP(nnx.Rngs(0))
    step = TrainStep(model, loss_fn, optax.adam(1e-2), batch_fn(0))
    compiled, calls = step._step, itertools.count(1)

    def sigint_inside_the_kth_update(carry, batch):
        new = compiled(carry, batch)
        if next(calls) == k:
            os.kill(os.getpid(), signal.SIGINT)
        return new

    step._step = sigint_inside_the_kth_update
    return straight, model, step


def test_ctrl_c_during_a_step_in_a_loop_of_ones_own_keeps_the_update_as_step_latest():
    """In a loop of one's own (example 02's), a Ctrl-C lands inside `carry = step(carry, batch)` nearly every time
    (40 of 40, measured): the call had donated the old carry, the new one was never assigned, and `write(carry)`
    silently did nothing, so the model kept its initial weights. SIGINT is now held until the update is kept as
    `step.latest`, then raised; the donated carry is refused by `write`, naming `step.latest`. The holding handler
    is installed by the loop's first step and Python's is put back by `write`, the loop's end."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed in the main thread")
    straight, model, step = _sigint_inside_update(3)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python and Jupyter install it
    try:
        carry = step.init()
        with pytest.raises(KeyboardInterrupt):
            for i in range(10):
                carry = step(carry, batch_fn(i))
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # the loop's: until write
        assert i == 2 and all(x.is_deleted() for x in carry["state"])  # the third call was interrupted: carry stale
        with pytest.raises(ValueError, match=r"^carry: expected a carry whose arrays are live, got one donated to a "
                                             r"later call of this step \(each call takes its carry's buffers\): "
                                             r"step.latest is the newest carry"):
            step.write(carry)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # write: the loop's end
        step.write(step.latest)  # the state after the third update, as the straight loop's
        assert_same_params(param_leaves(model), param_leaves(straight))
        # Outside a step the handler raises at once, as Python's: a Ctrl-C between two steps of a new loop.
        carry = step(step.latest, batch_fn(3))
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # (Python runs the handler within a few bytecodes)
                time.sleep(0)
        step.write(carry)  # the carry assigned before the Ctrl-C: live
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_ctrl_c_hold_returns_after_a_host_puts_pythons_handler_back_between_loops():
    """Jupyter's kernel sets Python's own SIGINT handler before each cell and puts its own back after it, so a cell
    that goes on with a loop an earlier cell started (no `write` between) found Python's handler in place: the hold
    was not reinstalled, and a Ctrl-C there lost the update again. Each step now looks (one `getsignal`)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed in the main thread")
    straight, model, step = _sigint_inside_update(4)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        carry = step.init()
        for i in range(2):  # the first cell
            carry = step(carry, batch_fn(i))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel's own, between cells
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next cell: Python's again
        with pytest.raises(KeyboardInterrupt):
            for i in range(2, 10):
                carry = step(carry, batch_fn(i))
        assert i == 3 and not step.latest["state"][0].is_deleted()
        step.write(step.latest)  # the state after the fourth update
        assert_same_params(param_leaves(model), param_leaves(straight))
    finally:
        signal.signal(signal.SIGINT, previous)
