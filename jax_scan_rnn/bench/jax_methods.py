"""The JAX rows of the Traveller: `lax.scan` at a fixed unroll and at the library's choice, the user's
`jsr.jit(model)` call, chunked rematerialisation, the seed's Python loop jitted and eager, `jsr.LSTM`
over the whole sequence (the bound) and the limit in XLA. `compiled_case` (a user's own code) and
`library_case` (jsr's calls and train step) also serve the VAE and peer rows.

Each builder has the signature `build(ctx, B, T, mode) -> Case`.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn import cells, xla_flags
from jax_scan_rnn.bench.config import LIMIT_CHUNK_ROWS
from jax_scan_rnn.bench.context import Case, Context, TooCostly
from jax_scan_rnn.bench.machine import available_memory
from jax_scan_rnn.data.trading import net_utility
from jax_scan_rnn.scan import auto_unroll
from jax_scan_rnn.train import TrainStep


def to_numpy(out) -> np.ndarray:
    """A forward result as numpy: floats as float32, integers (generated tokens) as they are."""
    out = np.asarray(out)
    return out if np.issubdtype(out.dtype, np.integer) else out.astype(np.float32)


LEARNING_RATE = 1e-4  # every train row's Adam, torch's included


def adam_step(loss: Callable) -> tuple[Callable, optax.GradientTransformation]:
    """`step(params, opt_state, *args) -> (params, opt_state, value)`: value and gradient of the scalar
    `loss(params, *args)`, then one Adam update (`LEARNING_RATE`, as the torch rows); and the optimiser."""
    tx = optax.adam(LEARNING_RATE)

    def step(params, opt_state, *args):
        value, grads = jax.value_and_grad(loss)(params, *args)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step, tx


def _train_call(step: Callable, params, opt_state, *args) -> Callable[[], None]:
    """A call that runs `step` once and keeps the (params, opt_state) it returns for the next call."""
    state = [params, opt_state]

    def call() -> None:
        out = jax.block_until_ready(step(*state, *args))
        state[:] = out[:2]

    return call


def _timed(lower: Callable[[], jax.stages.Lowered]) -> Callable[[], tuple]:
    """`timed_compile() -> (compiled, seconds)`: trace, lower and compile from scratch."""

    def timed_compile():
        start = time.perf_counter()
        compiled = lower().compile()
        return compiled, time.perf_counter() - start

    return timed_compile


def _compiled(ctx: Context, timed_compile: Callable[[], tuple]) -> tuple:
    """`(compiled, compile_s, compile_again, memory)`, after the check that the compiled buffers fit: on a CPU,
    a case whose buffers would take more than `memory_fraction` of the free RAM is skipped (TooCostly)."""

    def compile_again() -> float:
        jax.clear_caches()  # or the trace and the executable come from jit's caches (the cases hold their own)
        return timed_compile()[1]

    compiled, compile_s = timed_compile()
    memory = _xla_memory(compiled)
    need = (memory or {}).get("temp_bytes", 0) + (memory or {}).get("argument_bytes", 0)
    avail = available_memory()
    if not ctx.on_gpu and avail is not None and need > ctx.cfg.memory_fraction * avail:
        raise TooCostly(f"compiled buffers need {need / 2**30:.1f} GiB > {ctx.cfg.memory_fraction:.0%} of the "
                   f"{avail / 2**30:.1f} GiB available")
    return compiled, compile_s, compile_again, memory


def compiled_case(ctx: Context, mode: str, fn: Callable, params, *args, library: bool = False) -> Case:
    """`fn(params, *args)` compiled ahead of time (timed apart) and called: a user's own code (peers, loops,
    limits). Forward: the call returns its result. Train: `fn` is a scalar loss and the call takes one Adam
    step on it (`adam_step`). `library`: compiled as the library compiles its own calls
    (`xla_flags.compiler_options()`, as `jsr.jit` does; `library_case`'s forward rows); otherwise with
    `jax.jit`'s defaults, as a user's own code.
    """
    if mode == "train":
        fn, tx = adam_step(fn)
        args = (tx.init(params), *args)
    options = xla_flags.compiler_options() if library else None
    compiled, compile_s, again, memory = _compiled(ctx, _timed(
        lambda: jax.jit(fn, compiler_options=options).lower(params, *args)))
    if mode == "train":
        return Case(_train_call(compiled, params, *args), compile_s=compile_s, compile_again=again, memory=memory)
    return Case(lambda: jax.block_until_ready(compiled(params, *args)), output=to_numpy, compile_s=compile_s,
                compile_again=again, memory=memory)


def library_case(ctx: Context, mode: str, fn: Callable, model: nnx.Module, *args) -> Case:
    """A jsr row: `fn(model, *args)` as the library runs it. Forward: compiled and called as `jsr.jit` compiles
    and calls it (`compiled_case(library=True)` over the model's parameters, passed as a flat list). Train: `fn` is a scalar loss and the call is
    one update of `jsr.train.TrainStep`, the step `fit` runs (its NaN guard and metric sums included), with
    Adam at `LEARNING_RATE` as every row; its compilation is timed apart (`TrainStep.lower`)."""
    if mode == "forward":
        # The parameters as a flat list of arrays, as `jsr.jit` passes them: an `nnx.State` argument is flattened
        # in Python at every call (~20 us here, 2 us per step at T=10; docs/tuning_cpu.md, the peers' rows).
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        leaves, treedef = jax.tree.flatten(params)
        return compiled_case(ctx, mode, lambda p, *a: fn(nnx.merge(graphdef, treedef.unflatten(p), rest), *a),
                             leaves, *args, library=True)
    step = TrainStep(model, lambda m, batch: (fn(m, *batch), {}), optax.adam(LEARNING_RATE), args)
    carry = step.init()
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), carry)
    compiled, compile_s, again, memory = _compiled(ctx, _timed(lambda: step.lower(shapes, args)))
    state = [carry]

    def call() -> dict:  # the carry is donated: keep the returned one (and return it, for the tests)
        state[0] = jax.block_until_ready(compiled(state[0], args))
        return state[0]

    return Case(call, compile_s=compile_s, compile_again=again, memory=memory)


def _xla_memory(compiled) -> dict | None:
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if stats is None:
        return None
    return {
        "kind": "xla-compiled",
        "temp_bytes": int(stats.temp_size_in_bytes),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
    }


def _trading_loss(ctx: Context, positions: Callable) -> Callable:
    """`loss(params, x, r, *extra) = -mean(net_utility(positions(params, x, *extra), r))`: the train step's loss."""

    def loss(params, x, r, *extra):
        return -net_utility(positions(params, x, *extra), r, ctx.market).mean()

    return loss


def traveller_case(ctx: Context, batch: int, steps: int, mode: str, positions: Callable, params=None,
                   extra: tuple = (), library: bool = False) -> Case:
    """A compiled case from `positions(params, x [B, T, F], *extra) -> [B, T, A]` (params: the shared ones):
    forward, or the train step on `-mean(net_utility(positions, r))`. `library`: a jsr row, `params` is the
    jsr model and `positions` takes it (`library_case`); otherwise a user's own code (`compiled_case`)."""
    d = ctx.data(batch, steps)
    x = jnp.asarray(d["x"])
    params = ctx.params if params is None else params
    build = library_case if library else compiled_case
    if mode == "forward":
        return build(ctx, mode, positions, params, x, *extra)
    return build(ctx, mode, _trading_loss(ctx, positions), params, x, jnp.asarray(d["r"]), *extra)


def _model(ctx: Context) -> nnx.Module:
    """The shared jsr.Traveller (eval mode, the torch rows' weights)."""
    return nnx.merge(ctx.graphdef, ctx.params, ctx.rest)


def scan(unroll: int | str) -> Callable[[Context, int, int, str], Case]:
    """jsr.Traveller at `unroll` ("auto": the library's measured choice, recorded in the row)."""

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        case = traveller_case(ctx, batch, steps, mode, lambda m, x: m(x, unroll=unroll)[0], _model(ctx), library=True)
        chosen = auto_unroll(batch, differentiated=mode == "train")
        case.info["unroll"] = f"auto ({chosen})" if unroll == "auto" else unroll
        return case

    return build


def remat(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """lax.scan with chunked rematerialisation (the library's `remat_chunk`), chunk ~ sqrt(T), unroll 1."""
    chunk = max(1, round(math.sqrt(steps)))
    model = nnx.merge(*ctx.jax_traveller(remat_chunk=chunk))
    case = traveller_case(ctx, batch, steps, mode, lambda m, x: m(x, unroll=1)[0], model, library=True)
    case.info.update(unroll=1, remat_chunk=chunk)
    return case


def user_call(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """`fast(x)`, `fast = jsr.jit(model)` made once: the call a user makes, weights read at each call (forward only)."""
    fast = jsr.jit(_model(ctx))
    x = jnp.asarray(ctx.data(batch, steps)["x"])
    t0 = time.perf_counter()
    jax.block_until_ready(fast(x))  # the first call traces and compiles
    compile_s = time.perf_counter() - t0
    return Case(lambda: jax.block_until_ready(fast(x)[0]),  # (positions, state): the positions
                output=to_numpy, compile_s=compile_s, info={"unroll": "auto"})


def _loop_positions(ctx: Context) -> Callable:
    """The seed's loop in JAX: a Python `for` over T steps (per-step input projection, as the seed)."""
    graphdef, rest = ctx.graphdef, ctx.rest

    def positions(params, x):
        model = nnx.merge(graphdef, params, rest)
        lstm = model.lstm_layers
        batch, steps, _ = x.shape
        first = lstm.layers[0]
        w_ih = first.w_ih[...].astype(x.dtype)
        w_fb, w_u = w_ih[:2], w_ih[2:]
        b_ih = first.b_ih[...].astype(x.dtype)
        carries = lstm.unstack_state(lstm.initial_state(batch, x.dtype))
        fb = jnp.zeros((batch, 2), x.dtype)
        ys = []
        for t in range(steps):
            carries, h = lstm.step(carries, x[:, t] @ w_u + b_ih + fb @ w_fb)
            fb = jnp.tanh(model.output_layer(h))
            ys.append(fb)
        return jnp.stack(ys, axis=1)

    return positions


def jit_loop(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """That Python loop traced by jax.jit: unrolled into T copies of the step."""
    return traveller_case(ctx, batch, steps, mode, _loop_positions(ctx))


def eager(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The same Python loop, not jitted: every op is dispatched from Python, one at a time."""
    positions = _loop_positions(ctx)
    d = ctx.data(batch, steps)
    x = jnp.asarray(d["x"])
    if mode == "forward":
        return Case(lambda: jax.block_until_ready(positions(ctx.params, x)), output=to_numpy)
    step, tx = adam_step(_trading_loss(ctx, positions))
    return Case(_train_call(step, ctx.params, tx.init(ctx.params), x, jnp.asarray(d["r"])))


def lstm_seq(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """jsr.LSTM over the whole sequence (one lax.scan per layer), fed-back positions given: no feedback."""
    def positions(model, x, fb):
        out, _ = model.lstm_layers(jnp.concatenate([fb, x], axis=2))
        return jnp.tanh(model.output_layer(out))

    fb = jnp.asarray(ctx.limit_inputs(batch, steps)["fb"])
    return traveller_case(ctx, batch, steps, mode, positions, _model(ctx), extra=(fb,), library=True)


def _limit_chunk(batch: int, steps: int, rows: int = LIMIT_CHUNK_ROWS) -> int:
    """Steps per chunk of the XLA limit: the largest divisor of T with batch * chunk <= rows (at least 1)."""
    target = max(1, rows // batch)
    return max(d for d in range(1, min(steps, target) + 1) if steps % d == 0)


def limit(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The limit in XLA: per chunk of steps, every step's matmuls and gates at once; chunks independent.

    One matmul over all B*T rows is what "no time dependency" means, but on a CPU its [B*T, 4H]
    operands spill out of cache and the memory traffic, not the FLOPs, sets the time; chunks of
    ~LIMIT_CHUNK_ROWS rows (a `lax.map`, i.e. a loop with no dependency between iterations) keep the
    operands in cache. The previous states are given in chunk-major layout, so no transpose is timed.
    """
    layers = ctx.cfg.num_layers
    params = {k: jnp.asarray(v) for k, v in ctx.np_weights.items()}
    d = ctx.limit_inputs(batch, steps)
    chunk = _limit_chunk(batch, steps)
    n = steps // chunk
    sigmoid = jax.nn.sigmoid

    def block(w, z, h_prev, c_prev):  # z [..., 2 + F], h_prev, c_prev [..., H] -> positions [..., 2]
        for k in range(layers):
            def lin(a, name, k=k):
                weight = w[f"lstm_layers.weight_{name}_l{k}"].T.astype(a.dtype)
                # bf16 as the library does it: bf16 matmul operands, float32 accumulation and state.
                return cells.matmul(a, weight, ctx.compute_dtype) + w[f"lstm_layers.bias_{name}_l{k}"].astype(a.dtype)

            i, f, g, o = jnp.split(lin(z, "ih") + lin(h_prev, "hh"), 4, axis=-1)
            c = sigmoid(f) * c_prev + sigmoid(i) * jnp.tanh(g)
            z = sigmoid(o) * jnp.tanh(c)
        return jnp.tanh(z @ w["output_layer.weight"].T.astype(z.dtype) + w["output_layer.bias"].astype(z.dtype))

    def to_chunks(a):  # [B, T, k] -> [T/c, B, c, k]
        return a.reshape(a.shape[0], n, chunk, a.shape[-1]).swapaxes(0, 1)

    def positions(w, x, fb, h_prev, c_prev):  # h_prev, c_prev already [T/c, B, c, H]
        z = to_chunks(jnp.concatenate([fb, x], axis=2))
        out = jax.lax.map(lambda args: block(w, *args), (z, h_prev, c_prev))  # [T/c, B, c, 2]
        return out.swapaxes(0, 1).reshape(batch, steps, 2)

    def chunk_major(a):
        return np.ascontiguousarray(a.reshape(batch, n, chunk, a.shape[-1]).swapaxes(0, 1))

    extra = (jnp.asarray(d["fb"]), jnp.asarray(chunk_major(d["h_prev"])), jnp.asarray(chunk_major(d["c_prev"])))
    case = traveller_case(ctx, batch, steps, mode, positions, params=params, extra=extra)
    case.info["limit_chunk_steps"] = chunk
    return case
