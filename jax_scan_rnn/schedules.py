"""Schedules: pure functions of the training step, usable inside ``jax.jit``.

* Learning rate: :func:`make_lr_schedule` (linear warmup, then constant / cosine / linear decay), built
  from optax schedules and used by :func:`jax_scan_rnn.train.make_optimizer`.
* Scheduled sampling (Bengio et al., 2015, "Scheduled Sampling for Sequence Prediction with Recurrent
  Neural Networks"): at training step ``i`` the decoder is fed the GROUND TRUTH previous token with
  probability ``epsilon_i`` and its own prediction with probability ``1 - epsilon_i``.
  :func:`linear_decay`, :func:`exponential_decay`, :func:`inverse_sigmoid_decay` return ``epsilon_i``;
  :func:`replacement_probability` turns it into ``1 - epsilon_i``.
* KL annealing for VAEs (Bowman et al., 2016): :func:`kl_linear`, :func:`kl_sigmoid` return the weight
  ``beta`` of the KL term.

The step may be a Python int or a (traced) integer/float array; the result is a float32 ``jax.Array``.
Hyper-parameters (``k``, ``c``, ``warmup``, ...) must be concrete Python numbers: they are validated
eagerly and raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = [
    "LR_SCHEDULES",
    "TEACHER_FORCING_SCHEDULES",
    "make_lr_schedule",
    "linear_decay",
    "exponential_decay",
    "inverse_sigmoid_decay",
    "replacement_probability",
    "make_teacher_forcing_schedule",
    "kl_linear",
    "kl_sigmoid",
]

Array = jax.Array
Step = int | float | Array

LR_SCHEDULES = ("constant", "cosine", "linear")  # accepted ``kind`` of make_lr_schedule
TEACHER_FORCING_SCHEDULES = ("linear", "exponential", "inverse_sigmoid")  # make_teacher_forcing_schedule


# ------------------------------------------------------------------------------------- validation


def _real(name: str, value, *, lo=None, hi=None, lo_open=False, hi_open=False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name}: expected a finite real number, got {value!r}")
    v = float(value)
    bad_lo = lo is not None and (v <= lo if lo_open else v < lo)
    bad_hi = hi is not None and (v >= hi if hi_open else v > hi)
    if bad_lo or bad_hi:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ValueError(f"{name}: expected a value in {left}{lo_s}, {hi_s}{right}, got {value!r}")
    return v


def _int(name: str, value, *, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {value!r}")
    return int(value)


def _step(step: Step) -> Array:
    """The step as float32; concrete negative steps are rejected."""
    if isinstance(step, bool):
        raise ValueError(f"step: expected a non-negative number or array, got {step!r}")
    if isinstance(step, (Real, np.integer, np.floating)) and step < 0:
        raise ValueError(f"step: expected a non-negative number, got {step!r}")
    return jnp.asarray(step, dtype=jnp.float32)


# ---------------------------------------------------------------------------------- learning rate


def make_lr_schedule(
    kind: str,
    *,
    peak: float,
    steps: int,
    warmup_steps: int = 0,
    final_fraction: float = 0.0,
) -> optax.Schedule:
    """Learning rate as a function of the optax update count ``t`` (0 for the first update).

    Warmup (``W = warmup_steps > 0``): ``lr(t) = peak * (t + 1) / (W + 1)`` for ``t < W`` (so the first
    update already moves the parameters), reaching ``peak`` at ``t = W``. Then, with ``D = steps - W``
    and ``s = t - W``:

    * ``constant``: ``lr = peak``
    * ``cosine``: ``lr = peak * (f + (1 - f) * 0.5 * (1 + cos(pi * min(s, D) / D)))``
    * ``linear``: ``lr = peak * (1 - (1 - f) * min(s, D) / D)``

    where ``f = final_fraction`` (the end value as a fraction of ``peak``).

    Args:
      kind: one of :data:`LR_SCHEDULES`.
      peak: peak learning rate, > 0.
      steps: total number of updates, >= 1.
      warmup_steps: 0 <= warmup_steps <= steps.
      final_fraction: 0 <= f <= 1.
    """
    if kind not in LR_SCHEDULES:
        raise ValueError(f"kind: expected one of {LR_SCHEDULES}, got {kind!r}")
    peak = _real("peak", peak, lo=0.0, lo_open=True)
    steps = _int("steps", steps, lo=1)
    warmup_steps = _int("warmup_steps", warmup_steps, lo=0)
    if warmup_steps > steps:
        raise ValueError(f"warmup_steps: expected at most steps={steps}, got {warmup_steps}")
    final_fraction = _real("final_fraction", final_fraction, lo=0.0, hi=1.0)
    decay_steps = max(1, steps - warmup_steps)
    if kind == "constant":
        main = optax.constant_schedule(peak)
    elif kind == "cosine":
        main = optax.cosine_decay_schedule(peak, decay_steps, alpha=final_fraction)
    else:
        main = optax.linear_schedule(peak, peak * final_fraction, decay_steps)
    if warmup_steps == 0:
        return main
    # init = peak / (W + 1) makes linear_schedule equal peak * (t + 1) / (W + 1).
    warm = optax.linear_schedule(peak / (warmup_steps + 1), peak, warmup_steps)
    return optax.join_schedules([warm, main], [warmup_steps])


# ---------------------------------------------------------------------- scheduled sampling (2015)


def linear_decay(step: Step, *, k: float = 1.0, c: float, eps: float = 0.0) -> Array:
    """Linear decay of the teacher-forcing probability (Bengio et al., 2015):

    ``epsilon_i = max(eps, k - c * i)``, clipped to at most 1,

    where ``0 <= eps < 1`` is the minimum amount of ground truth still given to the model, ``k`` the
    offset and ``c >= 0`` the slope. Returns the probability of feeding the ground truth.
    """
    k = _real("k", k)
    c = _real("c", c, lo=0.0)
    eps = _real("eps", eps, lo=0.0, hi=1.0, hi_open=True)
    i = _step(step)
    return jnp.clip(k - c * i, eps, 1.0).astype(jnp.float32)


def exponential_decay(step: Step, *, k: float) -> Array:
    """Exponential decay of the teacher-forcing probability (Bengio et al., 2015):

    ``epsilon_i = k ** i`` with ``0 < k < 1`` (``k = 1`` keeps full teacher forcing).
    """
    k = _real("k", k, lo=0.0, hi=1.0, lo_open=True)
    i = _step(step)
    return jnp.exp(i * jnp.float32(math.log(k))).astype(jnp.float32)


def inverse_sigmoid_decay(step: Step, *, k: float) -> Array:
    """Inverse sigmoid decay of the teacher-forcing probability (Bengio et al., 2015):

    ``epsilon_i = k / (k + exp(i / k))`` with ``k >= 1`` (larger ``k`` decays later). Computed as
    ``sigmoid(log(k) - i / k)``, which is the same and does not overflow. Note ``epsilon_0 = k / (k+1)``.
    """
    k = _real("k", k, lo=1.0)
    i = _step(step)
    return jax.nn.sigmoid(jnp.float32(math.log(k)) - i / jnp.float32(k)).astype(jnp.float32)


def replacement_probability(teacher_forcing_probability: float | Array) -> Array:
    """``1 - epsilon_i``: the probability of feeding the model's OWN prediction instead of the truth."""
    p = teacher_forcing_probability
    if isinstance(p, Real) and not isinstance(p, bool) and not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"teacher_forcing_probability: expected a value in [0, 1], got {p!r}")
    return (1.0 - jnp.asarray(p, dtype=jnp.float32)).astype(jnp.float32)


def make_teacher_forcing_schedule(kind: str, **params: float) -> Callable[[Step], Array]:
    """``step -> epsilon_i`` for a schedule named in a config: ``kind`` is one of
    :data:`TEACHER_FORCING_SCHEDULES` and ``params`` the keyword arguments of that function
    (validated now, not at the first call)."""
    funcs = {
        "linear": linear_decay,
        "exponential": exponential_decay,
        "inverse_sigmoid": inverse_sigmoid_decay,
    }
    if kind not in funcs:
        raise ValueError(f"kind: expected one of {TEACHER_FORCING_SCHEDULES}, got {kind!r}")
    f = funcs[kind]
    try:
        f(0, **params)  # validates the hyper-parameters eagerly
    except TypeError as e:
        raise ValueError(f"params: wrong keyword arguments for the {kind!r} schedule ({e})") from None
    return lambda step: f(step, **params)


# ----------------------------------------------------------------------------------- KL annealing


def kl_linear(step: Step, *, warmup: int, max_beta: float = 1.0) -> Array:
    """Linear KL annealing: ``beta_i = max_beta * min(1, i / warmup)`` (``warmup = 0``: ``max_beta``)."""
    warmup = _int("warmup", warmup, lo=0)
    max_beta = _real("max_beta", max_beta, lo=0.0)
    i = _step(step)
    if warmup == 0:
        return jnp.full_like(i, max_beta)
    return (max_beta * jnp.minimum(1.0, i / jnp.float32(warmup))).astype(jnp.float32)


def kl_sigmoid(step: Step, *, midpoint: float, steepness: float, max_beta: float = 1.0) -> Array:
    """Logistic KL annealing (Bowman et al., 2016):

    ``beta_i = max_beta / (1 + exp(-steepness * (i - midpoint)))``; ``beta = max_beta / 2`` at the
    midpoint, ``steepness > 0``.
    """
    midpoint = _real("midpoint", midpoint)
    steepness = _real("steepness", steepness, lo=0.0, lo_open=True)
    max_beta = _real("max_beta", max_beta, lo=0.0)
    i = _step(step)
    return (max_beta * jax.nn.sigmoid(steepness * (i - midpoint))).astype(jnp.float32)
