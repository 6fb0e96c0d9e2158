"""How this project loops over time: `jax.lax.scan`, with unrolling and optional chunked rematerialisation.

    carry, ys = time_scan(step, carry, xs, unroll=4, remat_chunk=100)

`unroll` puts that many time steps in each iteration of the compiled while loop: fewer loop
iterations (less per-iteration overhead, more room for XLA to fuse across steps) for a bigger program.
It can differ with the use: `unroll=(1, 2)` runs a scan that is not differentiated at 1 and, when JAX
differentiates it (a train step), at 2 both forward and backward. `auto_unroll` picks it from
measurements (the layers' default, `unroll="auto"`).

`remat_chunk` trades compute for memory when training on long sequences. Backpropagation through a
plain scan keeps every step's intermediates: memory grows like T. With chunks of c steps, the outer scan
keeps only the carry at each chunk boundary (T/c of them) and the backward pass recomputes one chunk at
a time (`jax.checkpoint`), so memory grows like T/c + c, smallest near c = sqrt(T); the price is one
extra forward pass. The results are the same up to float rounding (the weights' gradient is summed chunk
by chunk, in another order); only what is stored differs.

`prepare` is the work hoisted out of the loop (typically the input projection `x @ W_ih + b_ih` of all
steps, one big matmul). Without remat it runs once over all T steps; with remat it runs once per
chunk, inside the rematerialised region, so the projected `[T, B, G*H]` inputs are never stored whole
(they would otherwise be the largest O(T) buffer left, with their gradient).
"""
from __future__ import annotations

import contextvars
import functools
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Literal, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jax_scan_rnn import validate
from jax_scan_rnn.cells import explain_forward_mode

try:  # whether a call happens inside a JAX transformation (jax.jit, vmap, grad): JAX has no public test
    from jax._src.core import trace_state_clean
except ImportError:  # pragma: no cover - moved in a later jax: every call is taken as a nested one
    def trace_state_clean() -> bool:
        return False

PyTree = Any
P = ParamSpec("P")
R = TypeVar("R")
Unroll = int | Literal["auto"]
ScanUnroll = int | tuple[int, int]  # one unroll, or (when not differentiated, when differentiated)

# unroll="auto": on CPU at batch 1, a differentiated scan runs at unroll 2 (the Traveller's and the jsr.LSTM/GRU
# layers' train step was fastest there, for a longer compile) and a scan that is not at 1 (the forward pass ran faster
# at 2 in only one of the cases measured, and compiles sooner at 1); from batch 8 on, no unroll > 1 was faster at every
# size measured, and 16 trained slowest everywhere (the unrolled body's larger backward keeps more of each step live).
# On a GPU (an H200) unroll 4 ran faster than 1 at batch 1 and 1024, forward and train step, and compiled as soon;
# 8 and 16 gained little more for longer compiles. Other backends (TPU): 1, not measured.
# Measured: docs/measurements.md#unroll.
AUTO_UNROLL_CPU_BATCH1 = 2
AUTO_UNROLL_GPU = 4


def auto_unroll(batch: int, backend: str | None = None, *, differentiated: bool = True) -> int:
    """The measured best `unroll` for a scan over a batch of `batch` sequences on `backend` (default: JAX's
    default backend), when JAX differentiates the scan or not. See `AUTO_UNROLL_CPU_BATCH1` for the rule."""
    backend = backend or jax.default_backend()
    if backend in ("gpu", "cuda"):
        return AUTO_UNROLL_GPU
    return AUTO_UNROLL_CPU_BATCH1 if backend == "cpu" and batch == 1 and differentiated else 1


# Hoisting an input projection out of the loop (`prepare`: one [T*B, I] x [I, G*H] matmul before the scan,
# the loop then reads a [T, B, G*H] array) against computing it inside each step. On CPU, inside the loop
# was faster at every measured size, for the Traveller, `jsr.LSTM`/`jsr.GRU` and the SeqVAE: the hoisted
# matmul has a small K, so it is bound by writing its [T, B, G*H] result out of cache, which the loop then
# streams back, while inside the loop the same product is one more small matmul on data in cache.
# On a GPU (an H200, the Traveller) hoisting ran the forward pass faster at batch 1 and 1024 and the train step
# as fast at batch 1, ~10% slower at 1024 (T=100): hoisted, one rule per backend (the VAE and layers: not measured).
# Measured: docs/measurements.md#hoisting-input-projections.
def auto_hoist(backend: str | None = None) -> bool:
    """Whether to hoist input projections out of the time loop on `backend` (default: JAX's default
    backend): False on CPU, True elsewhere (see the rule above)."""
    return (backend or jax.default_backend()) != "cpu"


def resolve_hoist(hoist: bool | Literal["auto"]) -> bool:
    """`hoist` as a bool: "auto" -> `auto_hoist()`; True/False kept; anything else is an error."""
    hoist = validate.choice("hoist_inputs", hoist, (True, False, "auto"))
    return auto_hoist() if hoist == "auto" else hoist


def resolve_unroll(unroll: Unroll, batch: int) -> tuple[int, int]:
    """`unroll` as `(unroll when not differentiated, when differentiated)`: "auto" -> `auto_unroll`'s two; a
    positive int n -> (n, n); anything else is an error."""
    unroll = validate.integer("unroll", unroll, lo=1, also=("auto",))
    if unroll == "auto":
        return auto_unroll(batch, differentiated=False), auto_unroll(batch)
    return unroll, unroll


@explain_forward_mode
def time_scan(
    step: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
    carry: PyTree,
    xs: PyTree,
    *,
    prepare: Callable[[PyTree], PyTree] | None = None,
    unroll: ScanUnroll = 1,
    remat_chunk: int | None = None,
) -> tuple[PyTree, PyTree]:
    """`jax.lax.scan(step, carry, xs)` over the leading (time) axis of `xs`, optionally chunk-rematerialised.

    Args:
      step: `(carry, x_t) -> (carry, y_t)`.
      carry: the initial carry.
      xs: per-step inputs, time-major `[T, ...]` leaves (None leaves allowed).
      prepare: optional `xs -> step inputs`, applied to many steps at once (all, or one chunk).
      unroll: time steps per compiled loop iteration, or `(when not differentiated, when differentiated)`
        (callers resolve "auto" with `resolve_unroll`, since only they know the batch size).
      remat_chunk: None for a plain scan; else the chunk length c of the rematerialised scan.
    Returns:
      `(final carry, ys)` with `ys` time-major `[T, ...]`, exactly as `lax.scan`.
    """
    prepare = (lambda xs: xs) if prepare is None else prepare
    carry = _varying_like(step, carry, xs, prepare)
    # "auto" is the caller's to resolve (resolve_unroll)
    plain, differentiated = unroll if isinstance(unroll, tuple) and len(unroll) == 2 else (unroll, unroll)
    validate.integer("unroll", plain, lo=1)
    validate.integer("unroll", differentiated, lo=1)

    def scan(carry, xs):
        if plain == differentiated:
            return jax.lax.scan(step, carry, xs, unroll=plain)
        return _scan_by_use(step, carry, xs, plain, differentiated)

    if validate.integer("remat_chunk", remat_chunk, lo=1, none=True) is None:
        return scan(carry, prepare(xs))
    leaves = jax.tree.leaves(xs)
    if not leaves:
        raise ValueError("xs: expected at least one per-step array to scan over, got none")
    steps = leaves[0].shape[0]
    chunks, rest = divmod(steps, remat_chunk)

    @jax.checkpoint
    def chunk(carry, xs_chunk):
        return scan(carry, prepare(xs_chunk))

    head = jax.tree.map(lambda x: x[: chunks * remat_chunk].reshape(chunks, remat_chunk, *x.shape[1:]), xs)
    carry, ys = jax.lax.scan(chunk, carry, head)
    ys = jax.tree.map(lambda y: y.reshape(chunks * remat_chunk, *y.shape[2:]), ys)
    if rest:
        carry, ys_tail = chunk(carry, jax.tree.map(lambda x: x[chunks * remat_chunk :], xs))
        ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ys, ys_tail)
    return carry, ys


def _varying_like(step: Callable, carry: PyTree, xs: PyTree, prepare: Callable) -> PyTree:
    """`carry` with each leaf marked as varying over the mesh axes that `step` makes it vary over.

    Inside `shard_map` (`jax.shard_map`, `nnx.shard_map`) each array's type says over which mesh axes its value
    differs between devices. A zero initial state made in the model varies over none, while the step mixes it
    with the per-device inputs (a batch split over "data"), so the new carry varies over "data": `lax.scan` would
    refuse the mismatch in a several-line type error. Only such leaves are marked (found by tracing one step
    abstractly until no leaf gains an axis): a leaf the step keeps invariant (a step counter) stays so, and may
    leave `shard_map` unsplit. Outside `shard_map` nothing varies and `carry` is returned as it is, untraced."""
    if not any(_varying_axes(x) for x in jax.tree.leaves((carry, xs)) if isinstance(x, jax.Array)):
        return carry

    def one_step(x):  # a step's input: x's type without the time axis (zeros, as x[0] fails on 0 steps)
        axes = tuple(sorted(_varying_axes(x)))
        zeros = jnp.zeros(x.shape[1:], x.dtype)
        return jax.lax.pcast(zeros, axes, to="varying") if axes else zeros

    def first_step(carry):
        return step(carry, jax.tree.map(one_step, prepare(xs)))[0]

    leaves, treedef = jax.tree.flatten(carry)
    while True:
        after, after_treedef = jax.tree.flatten(jax.eval_shape(first_step, jax.tree.unflatten(treedef, leaves)))
        missing = [tuple(sorted(_varying_axes(b) - _varying_axes(a))) for a, b in zip(leaves, after)]
        if after_treedef != treedef or not any(missing):  # another structure: lax.scan's own error says so
            return jax.tree.unflatten(treedef, leaves)
        leaves = [jax.lax.pcast(a, m, to="varying") if m else a for a, m in zip(leaves, missing)]


def _varying_axes(x: jax.Array) -> frozenset:
    """The mesh axes over which `x` (an array, its type or a `jax.ShapeDtypeStruct`) varies inside `shard_map`
    (none outside it): its type's `vma` (JAX <= 0.8's name), `manual_axis_type.varying` (JAX 0.10's)."""
    aval = x if isinstance(x, (jax.core.ShapedArray, jax.ShapeDtypeStruct)) else jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return frozenset(vma)


def _scan_by_use(step, carry, xs, plain: int, differentiated: int) -> tuple[PyTree, PyTree]:
    """`lax.scan(step, carry, xs)` at unroll `plain`, and at `differentiated` when JAX differentiates it, with the
    same numbers either way. The derivative rule is JAX's own derivative of the other scan, given to JAX as:

    - a `custom_vjp` (forward pass and backward pass of the unroll-`differentiated` scan, `jax.vjp`) when `step`
      holds a `custom_vjp` itself (the cells' hand-written gate derivatives): forward mode cannot go through such a
      step anyway, and reverse mode then composes with `vmap` either way round (grad of vmap included);
    - else a `custom_jvp` (`jax.jvp` of the other scan): forward mode and reverse mode, under `vmap` too.

    Why not one `custom_jvp` for both: under `vmap` inside `grad`, JAX batches a `custom_jvp`'s rule, and the rule's
    `jax.jvp` of a scan over a `custom_vjp` makes a scan holding that `custom_vjp`'s linearisation (`custom_lin`),
    which JAX cannot batch ("can't apply forward-mode autodiff (jvp) to a custom_vjp function")."""
    # A custom rule differentiates only its arguments: the arrays `step` reads from outside (the weights) become
    # arguments, and `step_of(carry, x_t, *weights)` evaluates `step`'s traced program.
    x_0 = jax.tree.map(lambda x: x[0], xs)
    step_of, weights = jax.closure_convert(step, carry, x_0)

    def scan_at(unroll: int) -> Callable:
        return lambda weights, carry, xs: jax.lax.scan(lambda c, x: step_of(c, x, *weights), carry, xs, unroll=unroll)

    step_jaxpr = jax.make_jaxpr(step_of)(carry, x_0, *weights).jaxpr
    if any(eqn.primitive.name.startswith("custom_vjp") for eqn in _equations(step_jaxpr)):
        return _vjp_by_use(scan_at(plain), scan_at(differentiated), weights, carry, xs)
    run = jax.custom_jvp(scan_at(plain))
    run.defjvp(lambda primals, tangents: jax.jvp(scan_at(differentiated), primals, tangents))
    return run(weights, carry, xs)


def _vjp_by_use(plain: Callable, differentiated: Callable, *args) -> PyTree:
    """`plain(*args)`, whose reverse-mode derivative is `jax.vjp(differentiated, ...)` with respect to the arguments
    JAX differentiates only (`symbolic_zeros`), as JAX's own derivative of `differentiated` is: the same compiled
    train step, where a `jax.vjp` in all arguments would also compute the input sequence's cotangent for nothing."""
    leaves, tree = jax.tree.flatten(args)

    def call(fn: Callable) -> Callable:
        return lambda *leaves: fn(*jax.tree.unflatten(tree, leaves))

    def forward(*primals: jax.custom_derivatives.CustomVJPPrimal):
        moving = tuple(i for i, p in enumerate(primals) if p.perturbed)

        def of_moving(*moved):
            values = [p.value for p in primals]
            for i, value in zip(moving, moved):
                values[i] = value
            return call(differentiated)(*values)

        out, vjp = jax.vjp(of_moving, *[primals[i].value for i in moving])
        return out, jax.tree_util.Partial(functools.partial(_cotangents, moving, len(primals)), vjp)

    run = jax.custom_vjp(call(plain))
    run.defvjp(forward, lambda backward, cotangent: backward(cotangent), symbolic_zeros=True)
    return run(*leaves)


def _cotangents(moving: tuple[int, ...], count: int, vjp: Callable, cotangent: PyTree) -> tuple:
    """The cotangents of all `count` inputs: `vjp(cotangent)`'s for the inputs at `moving`, None (zero) for the
    others; symbolic zeros in `cotangent` (outputs nothing reads) made arrays for `vjp`."""
    symbolic = jax.custom_derivatives.SymbolicZero
    cotangent = jax.tree.map(lambda c: _zeros(c.aval) if isinstance(c, symbolic) else c, cotangent,
                             is_leaf=lambda c: isinstance(c, symbolic))
    cotangents = [None] * count
    for i, c in zip(moving, vjp(cotangent)):
        cotangents[i] = c
    return tuple(cotangents)


def _zeros(aval) -> jax.Array | np.ndarray:
    """Zeros of `aval`'s shape and dtype that vary over its mesh axes (inside `shard_map`, `vjp` checks them)."""
    zeros = np.zeros(aval.shape, aval.dtype)
    axes = tuple(sorted(_varying_axes(aval)))
    return jax.lax.pcast(zeros, axes, to="varying") if axes else zeros


def _equations(jaxpr) -> Iterator:
    """Every equation of `jaxpr` (a `jax.make_jaxpr(...).jaxpr`), those of nested jaxprs (in jit, scan, cond, remat,
    custom rules) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    yield from _equations(sub)


class EagerCallWarning(UserWarning):
    """A model's time loop called eagerly (outside `jax.jit` and `jsr.jit`) a second time from one line of code."""


# The first eager call from a line is a one-off (a notebook cell, a look at the shapes); a second one from the same
# line is a loop or a rerun, where every call compiles the whole loop again: a scan body defined inside the call is a
# new function each time, and JAX caches traces and programs by function. JAX also keeps each of those programs, so
# a loop of eager calls grows the process too. Measured: docs/scan_vs_loop.md, section 4.
EAGER_CALLS_BEFORE_WARNING = 2
_eager_calls: dict[tuple[str, int, str], int] = {}  # (file, line, function) of the caller -> eager calls from there
_in_eager_call = contextvars.ContextVar("jax_scan_rnn_in_eager_call", default=False)


def warns_when_called_eagerly(instead: str | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorates a public method (or, with `instead`, a function) that runs a time loop: its second eager call from
    one line warns once (`EagerCallWarning`, at the user's line) that each such call compiles the loop again, and
    says what to call instead (a method: through `jsr.jit(model)`). Calls inside a JAX transformation, under
    `jax.disable_jit()` (nothing compiles there), and the library's own calls nested in an eager one are not
    counted. It costs about a microsecond per eager call, and nothing in a compiled one."""
    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        owner = function.__qualname__.rpartition(".")[0]
        method = bool(owner) and not owner.endswith("<locals>")  # defined in a class (Class.f), not a function

        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if _in_eager_call.get() or jax.config.jax_disable_jit or not trace_state_clean():
                return function(*args, **kwargs)
            caller = sys._getframe(1)
            where = (caller.f_code.co_filename, caller.f_lineno, function.__qualname__)
            calls = _eager_calls[where] = _eager_calls.get(where, 0) + 1
            if calls == EAGER_CALLS_BEFORE_WARNING:
                warnings.warn(_eager_message(function, type(args[0]).__name__ if method else None, instead),
                              EagerCallWarning, stacklevel=validate.user_stacklevel())
            token = _in_eager_call.set(True)
            try:
                return function(*args, **kwargs)
            finally:
                _in_eager_call.reset(token)
        return call
    return decorate


def _eager_message(function: Callable, owner: str | None, instead: str | None) -> str:
    name = function.__name__
    if owner is not None:
        what = owner if name == "__call__" else f"{owner}.{name}"
        call = "fast(...)" if name == "__call__" else f"fast.{name}(...)"
        instead = instead or f"Make fast = jsr.jit(model) once and call {call}: compiled once per input shape."
    else:
        what = name
    return (f"{what} ran eagerly again from this line: outside jax.jit, every call traces and compiles its whole "
            f"time loop anew, and JAX keeps each program it compiled. {instead} (docs/scan_vs_loop.md, section 4)")
