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

import jax
import jax.numpy as jnp
import optax

from jax_scan_rnn import validate
# The accepted `kind`s of make_lr_schedule and make_teacher_forcing_schedule: defined with the options that choose
# them (JAX-free modules, for the command line)
from jax_scan_rnn.configs.train import LR_SCHEDULES
from jax_scan_rnn.configs.vae import TEACHER_FORCING_SCHEDULES

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



def _step(step: Step) -> Array:
    """The step as float32; a concrete number must be >= 0 (arrays, perhaps traced, are not checked)."""
    return jnp.asarray(validate.real_or_array("step", step, lo=0), dtype=jnp.float32)


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
    validate.choice("kind", kind, LR_SCHEDULES)
    peak = validate.real("peak", peak, lo=0, lo_open=True)
    steps = validate.integer("steps", steps, lo=1)
    warmup_steps = validate.integer("warmup_steps", warmup_steps, lo=0, hi=steps)
    final_fraction = validate.real("final_fraction", final_fraction, lo=0, hi=1)
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
    k = validate.real("k", k)
    c = validate.real("c", c, lo=0)
    eps = validate.real("eps", eps, lo=0, hi=1, hi_open=True)
    i = _step(step)
    return jnp.clip(k - c * i, eps, 1.0).astype(jnp.float32)


def exponential_decay(step: Step, *, k: float) -> Array:
    """Exponential decay of the teacher-forcing probability (Bengio et al., 2015):

    ``epsilon_i = k ** i`` with ``0 < k < 1`` (``k = 1`` keeps full teacher forcing).
    """
    k = validate.real("k", k, lo=0, hi=1, lo_open=True)
    i = _step(step)
    return jnp.exp(i * jnp.float32(math.log(k))).astype(jnp.float32)


def inverse_sigmoid_decay(step: Step, *, k: float) -> Array:
    """Inverse sigmoid decay of the teacher-forcing probability (Bengio et al., 2015):

    ``epsilon_i = k / (k + exp(i / k))`` with ``k >= 1`` (larger ``k`` decays later). Computed as
    ``sigmoid(log(k) - i / k)``, which is the same and does not overflow. Note ``epsilon_0 = k / (k+1)``.
    """
    k = validate.real("k", k, lo=1)
    i = _step(step)
    return jax.nn.sigmoid(jnp.float32(math.log(k)) - i / jnp.float32(k)).astype(jnp.float32)


def replacement_probability(teacher_forcing_probability: float | Array) -> Array:
    """``1 - epsilon_i``: the probability of feeding the model's OWN prediction instead of the truth."""
    p = validate.real_or_array("teacher_forcing_probability", teacher_forcing_probability, lo=0, hi=1)
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
    f = funcs[validate.choice("kind", kind, TEACHER_FORCING_SCHEDULES)]
    try:
        f(0, **params)  # validates the hyper-parameters eagerly
    except TypeError as e:
        raise ValueError(f"params: wrong keyword arguments for the {kind!r} schedule ({e})") from None
    return lambda step: f(step, **params)


# ----------------------------------------------------------------------------------- KL annealing


def kl_linear(step: Step, *, warmup: int, max_beta: float = 1.0) -> Array:
    """Linear KL annealing: ``beta_i = max_beta * min(1, i / warmup)`` (``warmup = 0``: ``max_beta``)."""
    warmup = validate.integer("warmup", warmup, lo=0)
    max_beta = validate.real("max_beta", max_beta, lo=0)
    i = _step(step)
    if warmup == 0:
        return jnp.full_like(i, max_beta)
    return (max_beta * jnp.minimum(1.0, i / jnp.float32(warmup))).astype(jnp.float32)


def kl_sigmoid(step: Step, *, midpoint: float, steepness: float, max_beta: float = 1.0) -> Array:
    """Logistic KL annealing (Bowman et al., 2016):

    ``beta_i = max_beta / (1 + exp(-steepness * (i - midpoint)))``; ``beta = max_beta / 2`` at the
    midpoint, ``steepness > 0``.
    """
    midpoint = validate.real("midpoint", midpoint)
    steepness = validate.real("steepness", steepness, lo=0, lo_open=True)
    max_beta = validate.real("max_beta", max_beta, lo=0)
    i = _step(step)
    return (max_beta * jax.nn.sigmoid(steepness * (i - midpoint))).astype(jnp.float32)
