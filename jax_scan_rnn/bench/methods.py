"""The rows of the suite: every way of running the Traveller (and the VAE decoder), as case builders.

A `Method` names one row; its `build(ctx, B, T, mode)` returns a `Case` whose `call()` runs once and
waits for the result. `Context` holds what every builder shares: one set of weights in torch and JAX,
and the data of the current (B, T). `METHODS` is the table of all rows, by key.
"""
from __future__ import annotations

import copy
import inspect
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jax_scan_rnn import cells
from jax_scan_rnn.bench.config import AUTO_KEY, LIMIT_CHUNK_ROWS, MODES, SCAN_UNROLLS, SEED_KEY, BenchConfig
from jax_scan_rnn.bench.machine import available_memory


class Skip(Exception):
    """Raised by a case builder: this method does not apply here (the message says why)."""


def _accepts(fn: Callable, name: str) -> bool:
    """Whether `fn` (a function, or a class's constructor) takes a parameter called `name`."""
    try:
        # A class's own signature can be its metaclass's `__call__` (NNX modules): ask `__init__`.
        return name in inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------------
# The shared context: one set of weights in both frameworks, and the data of the current cell
# ----------------------------------------------------------------------------------------------------


class Context:
    """Both models on the same weights, devices, dtypes and per-(B, T) data."""

    def __init__(self, cfg: BenchConfig):
        import jax
        import jax.numpy as jnp

        import jax_scan_rnn as jsr
        from jax_scan_rnn.optional import require

        torch = require("torch", "the benchmark (its PyTorch rows and shared weights)")
        import torch_ref
        from jax_scan_rnn.data.trading import MarketConfig

        self.cfg = cfg
        self.torch = torch
        self.jax = jax
        self.jnp = jnp
        self.market = MarketConfig()
        self.torch_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.on_gpu = self.torch_device.type == "cuda"
        self.jax_device = jax.devices()[0]
        self.torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
        # bf16 in JAX: the library's own option where it has one (bf16 matmul operands, float32 state and
        # inputs: `Traveller(compute_dtype=bf16)`), else bf16 inputs (everything computed in bf16).
        self.jax_bf16 = None
        if cfg.dtype == "bfloat16":
            self.jax_bf16 = "compute_dtype" if _accepts(jsr.Traveller, "compute_dtype") else "inputs"
        self.jax_dtype = jnp.bfloat16 if self.jax_bf16 == "inputs" else jnp.float32

        torch.manual_seed(cfg.seed)
        model = torch_ref.Traveller(cfg.num_inputs, cfg.hidden_size, cfg.num_layers, 0.0)
        self.torch_model = model.to(self.torch_device, self.torch_dtype).eval()
        # Torch-layout numpy weights: the JAX twins load them, and the limit rows are written against them.
        self.np_weights = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        # The JAX twin keeps float32 parameters.
        self.graphdef, self.params, self.rest = self.jax_traveller()
        self.vae = None  # built on first use by the VAE rows
        self._data: dict[tuple, dict] = {}  # (B, T) -> arrays; the two most recent sizes are kept

    def jax_traveller(self, **options):
        """`nnx.split(jsr.Traveller(..., **options), nnx.Param, ...)` on the shared weights (eval mode)."""
        import jax_scan_rnn as jsr
        from flax import nnx

        cfg = self.cfg
        if self.jax_bf16 == "compute_dtype":
            options.setdefault("compute_dtype", self.jnp.bfloat16)
        model = jsr.Traveller(cfg.num_inputs, cfg.hidden_size, cfg.num_layers, 0.0, rngs=nnx.Rngs(cfg.seed),
                              **options)
        jsr.load_torch_state_dict(model, self.np_weights)
        model.eval()
        return nnx.split(model, nnx.Param, ...)

    # -- data ------------------------------------------------------------------------------------
    def data(self, batch: int, steps: int) -> dict:
        """Standard-normal features [B, T, F], returns [B, T, 2] and stand-in states (numpy float32).

        Timings do not depend on the values; the same arrays feed both frameworks. One (B, T) is kept.
        """
        key = (batch, steps)
        if key not in self._data:
            while len(self._data) >= 2:
                self._data.pop(next(iter(self._data)))
            rng = np.random.default_rng([self.cfg.seed, batch, steps])
            self._data[key] = {
                "x": rng.standard_normal((batch, steps, self.cfg.num_inputs), dtype=np.float32),
                "r": rng.standard_normal((batch, steps, 2), dtype=np.float32),
            }
        return self._data[key]

    def limit_inputs(self, batch: int, steps: int) -> dict:
        """Inputs of the limit rows: fed-back positions, previous h and c given, not computed [B, T, .]."""
        d = self.data(batch, steps)
        if "h_prev" not in d:
            rng = np.random.default_rng([self.cfg.seed, batch, steps, 1])
            d["fb"] = np.tanh(d["r"])
            d["h_prev"] = np.tanh(rng.standard_normal((batch, steps, self.cfg.hidden_size), dtype=np.float32))
            d["c_prev"] = rng.standard_normal((batch, steps, self.cfg.hidden_size), dtype=np.float32)
        return d

    def t(self, array: np.ndarray):
        """numpy -> torch tensor on the torch device, in the compute dtype."""
        return self.torch.from_numpy(array).to(self.torch_device, self.torch_dtype)

    def j(self, array: np.ndarray):
        """numpy -> jax array on the default device, in the compute dtype."""
        return self.jax.device_put(self.jnp.asarray(array, self.jax_dtype), self.jax_device)

    # -- synchronisation -------------------------------------------------------------------------
    def torch_sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def torch_loss(self, positions, returns):
        from jax_scan_rnn.data.trading import net_utility

        return -net_utility(positions.float(), returns.float(), self.market).mean()

    def jax_loss(self, positions, returns):
        from jax_scan_rnn.data.trading import net_utility

        return -net_utility(positions.astype(self.jnp.float32), returns.astype(self.jnp.float32), self.market).mean()


@dataclass
class Case:
    """One (method, B, T, mode): `call()` runs once and waits for the result."""

    call: Callable[[], Any]
    output: Callable[[Any], np.ndarray] | None = None  # first call's result -> numpy [B, T, 2]
    compile_s: float | None = None  # ahead-of-time compile (JAX) or capture (CUDA graph), if measured apart
    memory: dict | None = None  # static memory figures known once built
    info: dict = field(default_factory=dict)  # extra fields for the row (e.g. the unroll used)


# ----------------------------------------------------------------------------------------------------
# torch builders
# ----------------------------------------------------------------------------------------------------


def _torch_case(ctx: Context, batch: int, steps: int, mode: str, forward: Callable) -> Case:
    """A case from `forward(model, x) -> positions [B, T, 2]`: no-grad forward, or one Adam step."""
    torch = ctx.torch
    d = ctx.data(batch, steps)
    x, r = ctx.t(d["x"]), ctx.t(d["r"])
    if mode == "forward":
        model = ctx.torch_model

        def call():
            with torch.no_grad():
                out = forward(model, x)
            ctx.torch_sync()
            return out

        return Case(call, output=lambda out: out.float().cpu().numpy())
    model = copy.deepcopy(ctx.torch_model).train()  # training must not move the shared weights
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = ctx.torch_loss(forward(model, x), r)
        loss.backward()
        opt.step()
        ctx.torch_sync()

    return Case(step)


def _quiet(fn: Callable) -> Callable:
    """`fn` with torch's deprecation/non-leaf `.grad` warnings silenced (they are torch's noise here)."""

    def wrapped(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=r".*\.grad attribute of a Tensor that is not a leaf.*")
            return fn(*args, **kwargs)

    return wrapped


def _build_torch_method(method: str) -> Callable:
    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        import torch_ref

        if method == "scan" and not torch_ref.traveller.scan_available():
            raise Skip(f"torch {ctx.torch.__version__} has no torch._higher_order_ops.scan")
        return _torch_case(ctx, batch, steps, mode, _quiet(lambda m, x: m(x, method=method, layout="batch")[0]))

    return build


def _build_torch_compiled(method: str) -> Callable:
    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        import torch_ref
        from torch_ref.traveller import compiled_loop

        if method == "scan" and not torch_ref.traveller.scan_available():
            raise Skip(f"torch {ctx.torch.__version__} has no torch._higher_order_ops.scan")
        runs: dict[int, Callable] = {}

        def forward(model, x):
            # One compiled wrapper per model object (the train case trains a copy).
            run = runs.get(id(model))
            if run is None:
                run = runs[id(model)] = compiled_loop(model, method=method)
            return run(x, layout="batch")[0]  # (positions, final state): the positions

        return _torch_case(ctx, batch, steps, mode, _quiet(forward))

    return build


def _build_torch_lstm_seq(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """nn.LSTM over the whole sequence: the fed-back positions replaced by given values (no feedback)."""
    torch = ctx.torch
    fb = ctx.t(ctx.limit_inputs(batch, steps)["fb"])

    def forward(model, x):
        out, _ = model.lstm_layers(torch.cat([fb, x], dim=2))
        return model.activation(model.output_layer(out))

    return _torch_case(ctx, batch, steps, mode, forward)


def _build_cuda_graph(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The cell loop captured once in a CUDA graph, replayed per call (forward), or graphed fwd+bwd (train)."""
    torch = ctx.torch
    if not ctx.on_gpu:
        raise Skip("needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
    from torch_ref.traveller import _traveller_loop

    d = ctx.data(batch, steps)
    xs = ctx.t(d["x"]).transpose(0, 1).contiguous()  # [T, B, F], the graph's static input
    zero = ctx.torch_model.initial_state(batch)  # the loop's starting state, a static input too
    start = (zero.positions, zero.h, zero.c)
    t0 = time.perf_counter()
    if mode == "forward":
        weights = [w.detach() for w in ctx.torch_model.flat_weights()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            _traveller_loop(xs, *start, weights, None)  # warm-up outside the capture, as CUDA graphs need
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = _traveller_loop(xs, *start, weights, None)[0]  # positions [T, B, 2]
        torch.cuda.synchronize()
        capture_s = time.perf_counter() - t0

        def call():
            graph.replay()
            torch.cuda.synchronize()
            return static_out

        return Case(call, output=lambda out: out.transpose(0, 1).float().cpu().numpy(), compile_s=capture_s)

    model = copy.deepcopy(ctx.torch_model).train()
    params = model.flat_weights()
    r = ctx.t(d["r"])

    def loop(x, *weights):
        return _traveller_loop(x, *start, list(weights), None)[0]

    graphed = torch.cuda.make_graphed_callables(loop, (xs, *params))
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        positions = graphed(xs, *params).transpose(0, 1)
        ctx.torch_loss(positions, r).backward()
        opt.step()
        torch.cuda.synchronize()

    return Case(step, compile_s=capture_s)


def _torch_limit_forward(torch, w: dict, num_layers: int, x, fb, h_prev, c_prev):
    """The Traveller's FLOPs for all steps at once, with given fed-back positions and previous states."""
    import torch.nn.functional as F

    z = torch.cat([fb, x], dim=2)  # [B, T, 2 + F]
    for k in range(num_layers):
        gates = F.linear(z, w[f"lstm_layers.weight_ih_l{k}"], w[f"lstm_layers.bias_ih_l{k}"]) + F.linear(
            h_prev, w[f"lstm_layers.weight_hh_l{k}"], w[f"lstm_layers.bias_hh_l{k}"]
        )
        i, f, g, o = gates.chunk(4, dim=2)
        c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
        z = torch.sigmoid(o) * torch.tanh(c)
    return torch.tanh(F.linear(z, w["output_layer.weight"], w["output_layer.bias"]))


def _build_torch_limit(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    torch = ctx.torch
    d = ctx.limit_inputs(batch, steps)
    fb, hp, cp = ctx.t(d["fb"]), ctx.t(d["h_prev"]), ctx.t(d["c_prev"])
    layers = ctx.cfg.num_layers

    def forward(model, x):
        w = dict(model.named_parameters())
        return _torch_limit_forward(torch, w, layers, x, fb, hp, cp)

    return _torch_case(ctx, batch, steps, mode, forward)


# ----------------------------------------------------------------------------------------------------
# JAX builders
# ----------------------------------------------------------------------------------------------------


def _jax_compiled_case(ctx: Context, fn: Callable, args: tuple, *, train: bool, output: bool,
                       as_float: bool = True) -> Case:
    """AOT-compile `fn(*args)` (timed apart), check its memory fits, and call the executable.

    For train, `fn(params, opt_state, *rest) -> (params, opt_state, loss)` and the state is threaded.
    """
    jax = ctx.jax
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    memory = _xla_memory(compiled)
    need = (memory or {}).get("temp_bytes", 0) + (memory or {}).get("argument_bytes", 0)
    avail = available_memory()
    if not ctx.on_gpu and avail is not None and need > ctx.cfg.memory_fraction * avail:
        raise Skip(
            f"compiled buffers need {need / 2**30:.1f} GiB > {ctx.cfg.memory_fraction:.0%} of the "
            f"{avail / 2**30:.1f} GiB available"
        )
    if train:
        state = list(args[:2])
        rest = args[2:]

        def call():
            out = compiled(state[0], state[1], *rest)
            jax.block_until_ready(out)
            state[0], state[1] = out[0], out[1]

        return Case(call, compile_s=compile_s, memory=memory)

    def call():
        return jax.block_until_ready(compiled(*args))

    def to_numpy(out):
        return np.asarray(out, dtype=np.float32) if as_float else np.asarray(out)

    return Case(call, output=to_numpy if output else None, compile_s=compile_s, memory=memory)


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


def _jax_train_fn(ctx: Context, positions_fn: Callable) -> tuple[Callable, Any]:
    """`step(params, opt_state, x, r)` = value_and_grad of the trading loss + one Adam update."""
    import optax

    jax = ctx.jax
    tx = optax.adam(1e-4)

    def step(params, opt_state, x, r, *extra):
        def loss(p):
            return ctx.jax_loss(positions_fn(p, x, *extra), r)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step, tx


def _scan_positions(ctx: Context, unroll) -> Callable:
    from flax import nnx

    graphdef, rest = ctx.graphdef, ctx.rest

    def positions(params, x):
        return nnx.merge(graphdef, params, rest)(x, unroll=unroll)[0]

    return positions


def _jax_case_from_positions(ctx: Context, batch: int, steps: int, mode: str, positions: Callable,
                             params=None, extra: tuple = ()) -> Case:
    d = ctx.data(batch, steps)
    x = ctx.j(d["x"])
    params = ctx.params if params is None else params
    if mode == "forward":
        return _jax_compiled_case(ctx, positions, (params, x, *extra), train=False, output=True)
    step, tx = _jax_train_fn(ctx, positions)
    return _jax_compiled_case(ctx, step, (params, tx.init(params), x, ctx.j(d["r"]), *extra), train=True,
                              output=False)


def _build_jax_user_call(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """`jsr.jit(model)(x)`: the call a user makes, the model's weights read at each call (forward only)."""
    from flax import nnx

    import jax_scan_rnn as jsr

    jax = ctx.jax
    fast = jsr.jit(nnx.merge(ctx.graphdef, ctx.params, ctx.rest))
    x = ctx.j(ctx.data(batch, steps)["x"])
    t0 = time.perf_counter()
    jax.block_until_ready(fast(x))  # the first call traces and compiles
    compile_s = time.perf_counter() - t0

    def call():
        return jax.block_until_ready(fast(x)[0])  # (positions, state): the positions

    return Case(call, output=lambda out: np.asarray(out, dtype=np.float32), compile_s=compile_s,
                 info={"unroll": "auto"})


def _build_jax_scan(unroll) -> Callable:
    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        case = _jax_case_from_positions(ctx, batch, steps, mode, _scan_positions(ctx, unroll))
        if unroll == "auto":  # record what it chose
            from jax_scan_rnn.scan import auto_unroll

            case.info["unroll"] = f"auto ({auto_unroll(batch)})"
        else:
            case.info["unroll"] = unroll
        return case

    return build


def _jax_loop_positions(ctx: Context) -> Callable:
    """The seed's loop in JAX: a Python `for` over T steps (per-step input projection, as the seed)."""
    from flax import nnx

    jnp = ctx.jnp
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


def _build_jax_jit_loop(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    return _jax_case_from_positions(ctx, batch, steps, mode, _jax_loop_positions(ctx))


def _build_jax_eager(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The same Python loop, not jitted: every op is dispatched from Python, one at a time."""
    jax = ctx.jax
    positions = _jax_loop_positions(ctx)
    d = ctx.data(batch, steps)
    x = ctx.j(d["x"])
    if mode == "forward":
        return Case(lambda: jax.block_until_ready(positions(ctx.params, x)),
                     output=lambda out: np.asarray(out, dtype=np.float32))
    step, tx = _jax_train_fn(ctx, positions)
    state = [ctx.params, tx.init(ctx.params)]
    r = ctx.j(d["r"])

    def call():
        out = step(state[0], state[1], x, r)
        jax.block_until_ready(out)
        state[0], state[1] = out[0], out[1]

    return Case(call)


def _build_jax_lstm_seq(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """jsr.LSTM over the whole sequence (one lax.scan per layer), fed-back positions given: no feedback."""
    from flax import nnx

    jnp = ctx.jnp
    graphdef, rest = ctx.graphdef, ctx.rest

    def positions(params, x, fb):
        model = nnx.merge(graphdef, params, rest)
        out, _ = model.lstm_layers(jnp.concatenate([fb, x], axis=2))
        return jnp.tanh(model.output_layer(out))

    fb = ctx.j(ctx.limit_inputs(batch, steps)["fb"])
    return _jax_case_from_positions(ctx, batch, steps, mode, positions, extra=(fb,))


def _limit_chunk(batch: int, steps: int, rows: int = LIMIT_CHUNK_ROWS) -> int:
    """Steps per chunk of the XLA limit: the largest divisor of T with batch * chunk <= rows (at least 1)."""
    target = max(1, rows // batch)
    return max(d for d in range(1, min(steps, target) + 1) if steps % d == 0)


def _build_jax_limit(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The limit in XLA: per chunk of steps, every step's matmuls and gates at once; chunks independent.

    One matmul over all B*T rows is what "no time dependency" means, but on a CPU its [B*T, 4H]
    operands spill out of cache and the memory traffic, not the FLOPs, sets the time; chunks of
    ~LIMIT_CHUNK_ROWS rows (a `lax.map`, i.e. a loop with no dependency between iterations) keep the
    operands in cache. The previous states are given in chunk-major layout, so no transpose is timed.
    """
    jax, jnp = ctx.jax, ctx.jnp
    layers = ctx.cfg.num_layers
    params = {k: jnp.asarray(v) for k, v in ctx.np_weights.items()}
    d = ctx.limit_inputs(batch, steps)
    chunk = _limit_chunk(batch, steps)
    n = steps // chunk
    sigmoid = jax.nn.sigmoid
    # bf16 as the library does it (compute_dtype): bf16 matmul operands, float32 accumulation and state.
    operands = jnp.bfloat16 if ctx.jax_bf16 == "compute_dtype" else None

    def block(w, z, h_prev, c_prev):  # z [..., 2 + F], h_prev, c_prev [..., H] -> positions [..., 2]
        for k in range(layers):
            def lin(a, name, k=k):
                weight = w[f"lstm_layers.weight_{name}_l{k}"].T.astype(a.dtype)
                return cells.matmul(a, weight, operands) + w[f"lstm_layers.bias_{name}_l{k}"].astype(a.dtype)

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

    extra = (ctx.j(d["fb"]), ctx.j(chunk_major(d["h_prev"])), ctx.j(chunk_major(d["c_prev"])))
    case = _jax_case_from_positions(ctx, batch, steps, mode, positions, params=params, extra=extra)
    case.info["limit_chunk_steps"] = chunk
    return case


def _build_jax_remat(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """lax.scan with chunked rematerialisation (the library's `remat_chunk`), chunk ~ sqrt(T), unroll 1."""
    import jax_scan_rnn as jsr
    from flax import nnx

    if not _accepts(jsr.Traveller, "remat_chunk"):
        raise Skip("this jsr.Traveller has no remat_chunk option")
    chunk = max(1, round(math.sqrt(steps)))
    graphdef, params, rest = ctx.jax_traveller(remat_chunk=chunk)

    def positions(p, x):
        return nnx.merge(graphdef, p, rest)(x, unroll=1)[0]

    case = _jax_case_from_positions(ctx, batch, steps, mode, positions, params=params)
    case.info.update(unroll=1, remat_chunk=chunk)
    return case


# ----------------------------------------------------------------------------------------------------
# VAE decoder builders: scheduled sampling (feedback of the argmax token, per-token coins), teacher
# forcing (no feedback: the bound), greedy generation (free running)
# ----------------------------------------------------------------------------------------------------


class _VAEContext:
    """torch_ref.SeqVAE and jsr.SeqVAE on the same weights, and per-(B, T) token data."""

    def __init__(self, ctx: Context):
        import jax_scan_rnn as jsr
        import torch_ref
        from flax import nnx

        cfg = ctx.cfg
        if not hasattr(jsr, "SeqVAE") or not hasattr(torch_ref, "SeqVAE"):
            raise Skip("needs jsr.SeqVAE and torch_ref.SeqVAE")
        if cfg.dtype != "float32":
            raise Skip("float32 only")
        sizes = (cfg.vae_vocab, cfg.vae_hidden, cfg.vae_latent, cfg.vae_layers)
        ctx.torch.manual_seed(cfg.seed)
        model = torch_ref.SeqVAE(*sizes)
        self.torch_model = model.to(ctx.torch_device).eval()
        jmodel = jsr.SeqVAE(*sizes, rngs=nnx.Rngs(cfg.seed))
        jsr.load_torch_state_dict(jmodel, {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
        jmodel.eval()
        self.graphdef, self.params, self.rest = nnx.split(jmodel, nnx.Param, ...)
        self.cfg = cfg
        self._data: dict[tuple, dict] = {}

    def data(self, batch: int, steps: int) -> dict:
        """Full-length sequences (random tokens, then <eos>), one coin per token (p = 0.5), z and eps."""
        key = (batch, steps)
        if key not in self._data:
            rng = np.random.default_rng([self.cfg.seed, batch, steps, 2])
            tokens = rng.integers(3, self.cfg.vae_vocab, (batch, steps))
            tokens[:, -1] = 2  # <eos>
            self._data = {key: {
                "tokens": tokens,
                "lengths": np.full((batch,), steps),
                "mask": rng.random((batch, steps)) < 0.5,
                "z": rng.standard_normal((batch, self.cfg.vae_latent), dtype=np.float32),
                "eps": rng.standard_normal((batch, self.cfg.vae_latent), dtype=np.float32),
            }}
        return self._data[key]


def vae_torch_probe(ctx: Context, batch: int, steps: int | None = None) -> Callable[[], None]:
    """One call of torch_ref's scheduled-sampling decoder loop at (batch, steps): what the VAE rows'
    torch thread setting is calibrated on (`engine._calibrate_torch_threads`). `steps` defaults to
    ~2,000 sequence-steps per call (20 at most, 2 at least), ~10-100 ms on a CPU."""
    steps = steps or max(2, min(20, 2000 // batch))
    torch = ctx.torch
    if ctx.vae is None:
        ctx.vae = _VAEContext(ctx)
    d = ctx.vae.data(batch, steps)
    tokens, mask = torch.from_numpy(d["tokens"]), torch.from_numpy(d["mask"])
    z = torch.from_numpy(d["z"])

    def call() -> None:
        with torch.no_grad():
            ctx.vae.torch_model.decode(z, tokens, replace_mask=mask)

    return call


def _build_vae(task: str, framework: str) -> Callable:
    """Builder of a VAE row: task "ss" (scheduled sampling), "tf" (teacher forcing) or "greedy"."""

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        if ctx.vae is None:
            ctx.vae = _VAEContext(ctx)
        vae = ctx.vae
        d = vae.data(batch, steps)
        return (_vae_torch if framework == "torch" else _vae_jax)(ctx, vae, d, task, mode)

    return build


def _vae_torch(ctx: Context, vae: _VAEContext, d: dict, task: str, mode: str) -> Case:
    torch = ctx.torch
    dev = ctx.torch_device
    tokens, lengths = torch.from_numpy(d["tokens"]).to(dev), torch.from_numpy(d["lengths"]).to(dev)
    mask = torch.from_numpy(d["mask"]).to(dev) if task == "ss" else None
    z, eps = torch.from_numpy(d["z"]).to(dev), torch.from_numpy(d["eps"]).to(dev)
    if mode == "forward":
        model = vae.torch_model

        def call():
            with torch.no_grad():
                if task == "greedy":
                    out = model.generate(z, tokens.shape[1])
                else:
                    out = model.decode(z, tokens, replace_mask=mask)
            ctx.torch_sync()
            return out

        return Case(call, output=lambda out: out.cpu().numpy())
    model = copy.deepcopy(vae.torch_model).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        model.loss(tokens, lengths, eps=eps, replace_mask=mask)["total"].backward()
        opt.step()
        ctx.torch_sync()

    return Case(step)


def _vae_jax(ctx: Context, vae: _VAEContext, d: dict, task: str, mode: str) -> Case:
    import optax
    from flax import nnx

    jax, jnp = ctx.jax, ctx.jnp
    graphdef, rest = vae.graphdef, vae.rest
    tokens, lengths = jnp.asarray(d["tokens"], jnp.int32), jnp.asarray(d["lengths"], jnp.int32)
    mask = jnp.asarray(d["mask"]) if task == "ss" else None
    z, eps = jnp.asarray(d["z"]), jnp.asarray(d["eps"])
    steps = d["tokens"].shape[1]
    if mode == "forward":
        if task == "greedy":
            def fn(p, z):
                return nnx.merge(graphdef, p, rest).generate(z, steps)

            args = (vae.params, z)
        else:
            def fn(p, z, tokens, mask):
                return nnx.merge(graphdef, p, rest).decode(z, tokens, replace_mask=mask)

            args = (vae.params, z, tokens, mask)
        return _jax_compiled_case(ctx, fn, args, train=False, output=True, as_float=False)
    tx = optax.adam(1e-4)

    def step(p, opt_state, tokens, lengths, eps, mask):
        def loss(p):
            return nnx.merge(graphdef, p, rest).loss(tokens, lengths, eps=eps, replace_mask=mask)["total"]

        value, grads = jax.value_and_grad(loss)(p)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, value

    return _jax_compiled_case(ctx, step, (vae.params, tx.init(vae.params), tokens, lengths, eps, mask),
                              train=True, output=False)


# ----------------------------------------------------------------------------------------------------
# The method table
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """One way of running the Traveller. `kind`: "eager" (probed on a short T first) or "compiled"."""

    key: str
    label: str
    framework: str  # "torch" | "jax" | "both"
    kind: str  # "eager" | "compiled"
    build: Callable[[Context, int, int, str], Case]
    role: str = "method"  # "seed", "limit", "bound" (no feedback: a lower bound), or "method"
    where: str = "grid"  # "grid": the main grid; "sweep": only the short-T sweep; "both"
    max_t: int | None = None  # grid cells with larger T are skipped ("short T only")
    modes: tuple[str, ...] = MODES  # the modes it has rows for
    modes_note: str = ""  # why a mode is missing
    gpu_only: bool = False
    model: str = "traveller"  # "traveller", "vae-ss" (scheduled-sampling decoder), "vae-greedy" (generation)
    note: str = ""  # one line for the README / table: what the row means


def _methods() -> dict[str, Method]:
    rows = [
        Method(SEED_KEY, "torch: seed loop (nn.LSTM per step)", "torch", "eager", _build_torch_method("loop"),
               role="seed", where="both",
               note="the seed's code: a Python loop calling nn.LSTM on one step, torch.cat, Linear, tanh"),
        Method("torch-cell", "torch: LSTM-cell loop", "torch", "eager", _build_torch_method("cell"),
               note="the same Python loop over per-step cell math (F.linear + gates): no nn.LSTM call per step"),
        Method("torch-script", "torch: jit.script(loop)", "torch", "eager", _build_torch_method("script"),
               note="TorchScript of that loop function, the working form of the seed answer's script_method"),
        Method("torch-scan", "torch: _higher_order_ops.scan, eager", "torch", "eager", _build_torch_method("scan"),
               note="the private scan prototype without compile: still a Python loop (through Dynamo)"),
        Method("torch-compile-scan", "torch: compile(scan)", "torch", "compiled", _build_torch_compiled("scan"),
               note="torch.compile (inductor) of the scan: one graph node for the loop; compiled per cell"),
        Method("torch-compile-loop", "torch: compile(loop), short T", "torch", "compiled",
               _build_torch_compiled("cell"), where="sweep", modes=("forward",),
               modes_note="forward only (its compile of the unrolled backward grows with T as well)",
               note="torch.compile of the Python loop: Dynamo unrolls T steps, so compile time grows with T"),
        Method("torch-cuda-graph", "torch: CUDA graph of the loop", "torch", "compiled", _build_cuda_graph,
               gpu_only=True, note="the cell loop captured once as a CUDA graph and replayed (GPU only)"),
        Method("torch-lstm-seq", "torch: nn.LSTM whole sequence, no feedback", "torch", "eager",
               _build_torch_lstm_seq, role="bound",
               note="lower bound: one nn.LSTM call over all T (cuDNN on GPU), positions given, not fed back"),
    ]
    for u in SCAN_UNROLLS:
        rows.append(Method(f"jax-scan-u{u}", f"jax: lax.scan, unroll={u}", "jax", "compiled", _build_jax_scan(u),
                           where="both" if u == 1 else "grid",
                           note=f"jsr.Traveller: one jitted lax.scan over T, {u} step(s) per loop iteration"))
    rows += [
        Method(AUTO_KEY, "jax: lax.scan, unroll=auto", "jax", "compiled", _build_jax_scan("auto"),
               note="the library's default: unroll chosen from measurements (jax_scan_rnn.scan.auto_unroll)"),
        Method("jax-user-call", "jax: jsr.jit(model)(x)", "jax", "compiled", lambda *a: _build_jax_user_call(*a),
               modes=("forward",), modes_note="forward only: a training step differentiates the model itself",
               note="the user's compiled call: jsr.jit over the model, its weights read at each call (the "
                    "row above is the same scan AOT-compiled and called on its parameters)"),
        Method("jax-jit-loop", "jax: jit(Python loop), short T", "jax", "compiled", lambda *a: _build_jax_jit_loop(*a),
               where="sweep", modes=("forward",),
               modes_note="forward only (its compile of the unrolled backward grows with T as well)",
               note="a Python for-loop traced by jax.jit: unrolled into T copies, so compile time grows with T"),
        Method("jax-eager", "jax: eager op-by-op, short T", "jax", "eager", lambda *a: _build_jax_eager(*a),
               where="both", max_t=100, modes=("forward",),
               modes_note="forward only: an eager value_and_grad of the loop costs ~0.2 s per step on a CPU",
               note="the same loop without jit: every op dispatched from Python"),
        Method("jax-scan-remat", "jax: lax.scan, remat chunks of ~sqrt(T)", "jax", "compiled",
               lambda *a: _build_jax_remat(*a), modes=("train",),
               modes_note="train only: rematerialisation changes what the backward pass stores",
               note="jsr.Traveller(remat_chunk=round(sqrt(T))), unroll=1: training memory ~sqrt(T) instead of ~T"),
        Method("jax-lstm-seq", "jax: jsr.LSTM whole sequence, no feedback", "jax", "compiled",
               lambda *a: _build_jax_lstm_seq(*a), role="bound",
               note="jsr.LSTM over all T (a lax.scan per layer), positions given, not fed back"),
        Method("limit-xla", "limit: batched matmuls (XLA)", "jax", "compiled", lambda *a: _build_jax_limit(*a),
               role="limit", note="the same FLOPs with the time dependency removed, jitted JAX, in chunks of "
                                  f"~{LIMIT_CHUNK_ROWS} rows (B x steps) so that the operands stay in cache"),
        Method("limit-torch", "limit: batched matmuls (torch)", "torch", "eager", lambda *a: _build_torch_limit(*a),
               role="limit", note="the same FLOPs with the time dependency removed, torch, all B x T rows at once"),
    ]
    rows += [
        Method("vae-ss-torch", "torch: decoder loop, scheduled sampling", "torch", "eager", _build_vae("ss", "torch"),
               role="seed", model="vae-ss",
               note="torch_ref.SeqVAE.decode(z, tokens, replace_mask): a Python loop over nn.GRU steps; train: "
                    "its loss (encoder + decoder + KL)"),
        Method("vae-ss-jax", "jax: decoder scan, scheduled sampling", "jax", "compiled", _build_vae("ss", "jax"),
               model="vae-ss", note="jsr.SeqVAE.decode with the same replace_mask: one jitted lax.scan"),
        Method("vae-tf-torch", "torch: teacher forcing, no feedback", "torch", "eager", _build_vae("tf", "torch"),
               role="bound", model="vae-ss", note="decode(z, tokens) without replace_mask: one nn.GRU call"),
        Method("vae-tf-jax", "jax: teacher forcing, no feedback", "jax", "compiled", _build_vae("tf", "jax"),
               role="bound", model="vae-ss", note="jsr.SeqVAE.decode without replace_mask"),
        Method("vae-greedy-torch", "torch: greedy generation loop", "torch", "eager", _build_vae("greedy", "torch"),
               role="seed", model="vae-greedy", modes=("forward",), modes_note="generation has no gradient",
               note="torch_ref.SeqVAE.generate(z, T): argmax fed back as a one-hot, a Python loop"),
        Method("vae-greedy-jax", "jax: greedy generation scan", "jax", "compiled", _build_vae("greedy", "jax"),
               model="vae-greedy", modes=("forward",), modes_note="generation has no gradient",
               note="jsr.SeqVAE.generate(z, T), jitted: one lax.scan"),
    ]
    return {m.key: m for m in rows}


METHODS: dict[str, Method] = _methods()


def check_method_keys(cfg: BenchConfig) -> None:
    """Every key in `cfg.methods` / `cfg.train_methods` names a row of `METHODS`."""
    for name in ("methods", "train_methods"):
        keys = getattr(cfg, name)
        unknown = [m for m in keys if m not in METHODS] if keys is not None else []
        if unknown:
            raise ValueError(f"{name}: unknown {unknown}; expected keys of {sorted(METHODS)}")
