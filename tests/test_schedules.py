"""Schedules: values at known points, monotonicity, bounds, jit/vmap compatibility, argument errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_scan_rnn import schedules as S

STEPS = np.arange(0, 2000, 7)


def close(a, b, tol=1e-6):
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


# ------------------------------------------------------------------------------ learning rate


def test_lr_warmup_starts_above_zero_and_reaches_peak():
    lr = S.make_lr_schedule("cosine", peak=1e-2, steps=100, warmup_steps=4)
    assert close(lr(0), 1e-2 * 1 / 5)  # first update already moves the parameters
    assert close(lr(3), 1e-2 * 4 / 5)
    assert close(lr(4), 1e-2)  # peak right after warmup


def test_lr_cosine_decays_to_final_fraction():
    lr = S.make_lr_schedule("cosine", peak=1.0, steps=110, warmup_steps=10, final_fraction=0.1)
    assert close(lr(10), 1.0)
    assert close(lr(60), 0.1 + 0.9 * 0.5)  # half-way through the decay
    assert close(lr(110), 0.1)
    assert close(lr(10_000), 0.1)
    vals = np.array([float(lr(t)) for t in range(10, 111)])
    assert np.all(np.diff(vals) <= 1e-7)


def test_lr_constant_and_linear():
    const = S.make_lr_schedule("constant", peak=3e-4, steps=50)
    assert all(close(const(t), 3e-4) for t in (0, 10, 49, 500))
    lin = S.make_lr_schedule("linear", peak=1.0, steps=20, warmup_steps=0, final_fraction=0.0)
    assert close(lin(0), 1.0) and close(lin(10), 0.5) and close(lin(20), 0.0, tol=1e-6)


def test_lr_warmup_equal_to_steps_is_allowed():
    lr = S.make_lr_schedule("cosine", peak=1.0, steps=5, warmup_steps=5)
    assert close(lr(4), 5 / 6)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(kind="step"), "kind"),
        (dict(peak=0.0), "peak"),
        (dict(steps=0), "steps"),
        (dict(warmup_steps=101), "warmup_steps"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(final_fraction=1.5), "final_fraction"),
    ],
)
def test_lr_argument_errors_name_the_argument(kwargs, name):
    args = dict(kind="cosine", peak=1e-3, steps=100, warmup_steps=0, final_fraction=0.0) | kwargs
    kind = args.pop("kind")
    with pytest.raises(ValueError, match=name):
        S.make_lr_schedule(kind, **args)


# ------------------------------------------------------------------------- scheduled sampling


def test_linear_decay_known_points_and_floor():
    f = lambda i: S.linear_decay(i, k=1.0, c=0.01, eps=0.2)  # noqa: E731
    assert close(f(0), 1.0)
    assert close(f(50), 0.5)
    assert close(f(80), 0.2)
    assert close(f(10_000), 0.2)
    assert close(S.linear_decay(0, k=1.5, c=0.01), 1.0)  # clipped to a probability


def test_exponential_decay_known_points():
    assert close(S.exponential_decay(0, k=0.99), 1.0)
    assert close(S.exponential_decay(10, k=0.9), 0.9**10, tol=1e-5)
    assert close(S.exponential_decay(5, k=1.0), 1.0)


def test_inverse_sigmoid_decay_known_points_and_no_overflow():
    k = 10.0
    assert close(S.inverse_sigmoid_decay(0, k=k), k / (k + 1.0))
    assert close(S.inverse_sigmoid_decay(100, k=k), k / (k + math.exp(10.0)), tol=1e-5)
    assert close(S.inverse_sigmoid_decay(k * math.log(k), k=k), 0.5, tol=1e-5)  # crossover point
    far = S.inverse_sigmoid_decay(1e7, k=k)
    assert np.isfinite(far) and float(far) == 0.0


@pytest.mark.parametrize(
    "fn",
    [
        lambda i: S.linear_decay(i, k=1.0, c=1e-3, eps=0.05),
        lambda i: S.exponential_decay(i, k=0.995),
        lambda i: S.inverse_sigmoid_decay(i, k=50.0),
    ],
    ids=["linear", "exponential", "inverse_sigmoid"],
)
def test_teacher_forcing_is_a_nonincreasing_probability(fn):
    vals = np.asarray(fn(jnp.asarray(STEPS)))
    assert vals.dtype == np.float32
    assert np.all((vals >= 0.0) & (vals <= 1.0))
    assert np.all(np.diff(vals) <= 0.0)
    assert vals[0] > vals[-1]


def test_replacement_probability_is_one_minus_epsilon():
    eps = S.inverse_sigmoid_decay(jnp.arange(100), k=5.0)
    np.testing.assert_array_equal(S.replacement_probability(eps), 1.0 - eps)
    assert close(S.replacement_probability(0.25), 0.75)
    with pytest.raises(ValueError, match="teacher_forcing_probability"):
        S.replacement_probability(1.5)


def test_make_teacher_forcing_schedule_validates_eagerly():
    f = S.make_teacher_forcing_schedule("exponential", k=0.9)
    assert close(f(2), 0.81, tol=1e-5)
    with pytest.raises(ValueError, match="kind"):
        S.make_teacher_forcing_schedule("cosine", k=0.9)
    with pytest.raises(ValueError, match="k"):
        S.make_teacher_forcing_schedule("inverse_sigmoid", k=0.5)
    with pytest.raises(ValueError, match="params"):
        S.make_teacher_forcing_schedule("linear", slope=0.1)


# ---------------------------------------------------------------------------------- KL annealing


def test_kl_linear_known_points():
    assert close(S.kl_linear(0, warmup=100), 0.0)
    assert close(S.kl_linear(50, warmup=100, max_beta=0.5), 0.25)
    assert close(S.kl_linear(100, warmup=100), 1.0)
    assert close(S.kl_linear(10_000, warmup=100), 1.0)
    assert close(S.kl_linear(0, warmup=0, max_beta=0.7), 0.7)


def test_kl_sigmoid_known_points_monotone_and_bounded():
    assert close(S.kl_sigmoid(500, midpoint=500, steepness=0.01, max_beta=2.0), 1.0)
    vals = np.asarray(S.kl_sigmoid(jnp.asarray(STEPS), midpoint=1000, steepness=0.01))
    assert np.all(np.diff(vals) >= 0.0)
    assert np.all((vals >= 0.0) & (vals <= 1.0))
    assert vals[0] < 1e-4 and vals[-1] > 0.9999


# ------------------------------------------------------------------------------------ jit / vmap


def test_every_schedule_runs_inside_jit_and_vmap():
    lr = S.make_lr_schedule("cosine", peak=1e-3, steps=1000, warmup_steps=100)
    fns = {
        "lr": lr,
        "linear": lambda i: S.linear_decay(i, k=1.0, c=1e-3, eps=0.1),
        "exponential": lambda i: S.exponential_decay(i, k=0.999),
        "inverse_sigmoid": lambda i: S.inverse_sigmoid_decay(i, k=100.0),
        "kl_linear": lambda i: S.kl_linear(i, warmup=300),
        "kl_sigmoid": lambda i: S.kl_sigmoid(i, midpoint=400, steepness=0.02),
    }
    steps = jnp.arange(0, 1200, 13, dtype=jnp.int32)
    for name, f in fns.items():
        eager = np.array([float(f(int(s))) for s in steps[:5]])
        jitted = np.asarray(jax.vmap(jax.jit(f))(steps))[:5]
        np.testing.assert_allclose(jitted, eager, rtol=1e-5, err_msg=name)  # float32 in jit


# --------------------------------------------------------------------------------- arg validation


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: S.linear_decay(0, k=1.0, c=-0.1), "c"),
        (lambda: S.linear_decay(0, k=1.0, c=0.1, eps=1.0), "eps"),
        (lambda: S.exponential_decay(0, k=0.0), "k"),
        (lambda: S.exponential_decay(0, k=1.1), "k"),
        (lambda: S.inverse_sigmoid_decay(0, k=0.9), "k"),
        (lambda: S.inverse_sigmoid_decay(-1, k=2.0), "step"),
        (lambda: S.kl_linear(0, warmup=-1), "warmup"),
        (lambda: S.kl_linear(0, warmup=10, max_beta=-1.0), "max_beta"),
        (lambda: S.kl_sigmoid(0, midpoint=10, steepness=0.0), "steepness"),
        (lambda: S.kl_sigmoid(0, midpoint=float("nan"), steepness=1.0), "midpoint"),
    ],
)
def test_argument_errors_name_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        call()


@pytest.mark.parametrize("step", ["5", None])
def test_a_step_that_is_no_number_nor_array_is_named(step):
    # "5" was read by JAX as 5.0 (a schedule of a string, silently), None failed with "None is not a valid value for
    # jnp.array", naming no argument
    with pytest.raises(ValueError, match=rf"^step: expected a finite number >= 0, got {step!r}$"):
        S.linear_decay(step, c=0.1)


def test_a_schedule_takes_a_list_or_range_of_steps_as_an_array():
    """Evaluating a schedule at several steps (to plot it) by a list or range worked as with an array; refusing
    None and strings ("step: expected a finite number") refused these too. They are arrays of steps again."""
    steps = [0, 10, 20]
    expected = np.asarray(S.linear_decay(jnp.asarray(steps), c=0.01))
    np.testing.assert_array_equal(np.asarray(S.linear_decay(steps, c=0.01)), expected)
    np.testing.assert_array_equal(np.asarray(S.linear_decay(range(0, 30, 10), c=0.01)), expected)
    np.testing.assert_array_equal(np.asarray(S.kl_linear((0, 5), warmup=10)), [0.0, 0.5])
    with pytest.raises(ValueError, match="step: expected a finite number >= 0, got None"):
        S.linear_decay(None, c=0.01)
