"""The PyTorch rows of the Traveller: torch_ref's loops (the seed's `nn.LSTM` loop, the cell loop,
TorchScript, the scan prototype) eager and under `torch.compile`, a CUDA-graph capture, `nn.LSTM` over
the whole sequence (the bound) and the limit. `torch_case` also serves the VAE rows.

Each builder has the signature `build(ctx, B, T, mode) -> Case`; torch is imported only once a case is built.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jax_scan_rnn.bench.context import Case, Context, Skip
from jax_scan_rnn.data.trading import net_utility


def to_numpy(out) -> np.ndarray:
    """A forward result as numpy: floats as float32 (numpy has no bf16), integers (tokens) as they are."""
    return (out.float() if out.is_floating_point() else out).cpu().numpy()


def adam_call(ctx: Context, model, loss: Callable[[], Any]) -> Callable[[], None]:
    """A call that takes one Adam step (lr 1e-4) on the scalar `loss()` over `model`'s parameters."""
    opt = ctx.torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
        ctx.torch_sync()

    return step


def train_copy(ctx: Context, model):
    """A training-mode deep copy of `model` (training must not move the shared weights), its `nn.LSTM`/`nn.GRU`
    weights in one buffer again. A deep copy gives each weight a storage of its own, and cuDNN then packs them into
    one buffer at every call: extra copies inside every timed step (PyTorch's warning "RNN module weights are not
    part of single contiguous chunk of memory", printed by the H200's torch train rows before this). A no-op on CPUs."""
    model = copy.deepcopy(model).train()
    for module in model.modules():
        if isinstance(module, ctx.torch.nn.RNNBase):
            module.flatten_parameters()
    return model


def torch_case(ctx: Context, mode: str, model, forward: Callable, loss: Callable) -> Case:
    """Forward: `forward(model)` without gradients. Train: one Adam step on `loss(copy)`, the copy `train_copy`'s."""
    torch = ctx.torch
    if mode == "forward":
        def call():
            with torch.no_grad():
                out = forward(model)
            ctx.torch_sync()
            return out

        return Case(call, output=to_numpy)
    model = train_copy(ctx, model)
    return Case(adam_call(ctx, model, lambda: loss(model)))


def _traveller_case(ctx: Context, batch: int, steps: int, mode: str, positions: Callable) -> Case:
    """A case from `positions(model, x [B, T, F]) -> [B, T, 2]`; its train step's loss is the trading task's."""
    d = ctx.data(batch, steps)
    x, r = ctx.t(d["x"]), ctx.t(d["r"])
    return torch_case(ctx, mode, ctx.torch_model, lambda m: positions(m, x),
                      lambda m: _trading_loss(ctx, positions(m, x), r))


def _trading_loss(ctx: Context, positions, returns):
    """`-mean(net_utility)`, in float32 whatever the compute dtype."""
    return -net_utility(positions.float(), returns.float(), ctx.market).mean()


def _need_scan(ctx: Context, method: str) -> None:
    import torch_ref

    if method == "scan" and not torch_ref.traveller.scan_available():
        raise Skip(f"torch {ctx.torch.__version__} has no torch._higher_order_ops.scan")


def loop(method: str) -> Callable[[Context, int, int, str], Case]:
    """torch_ref.Traveller's forward with `method` "loop" (the seed's), "cell", "script" or "scan"."""

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        _need_scan(ctx, method)
        return _traveller_case(ctx, batch, steps, mode, lambda m, x: m(x, method=method)[0])

    return build


def compiled(method: str) -> Callable[[Context, int, int, str], Case]:
    """`torch_ref.traveller.compiled_loop(model, method=method)`: torch.compile of the "scan" or "cell" loop."""

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        from torch_ref.traveller import compiled_loop

        _need_scan(ctx, method)
        runs: dict[int, Callable] = {}

        def positions(model, x):
            # One compiled wrapper per model object (the train case trains a copy).
            run = runs.get(id(model))
            if run is None:
                run = runs[id(model)] = compiled_loop(model, method=method)
            return run(x)[0]  # (positions, final state): the positions

        return _traveller_case(ctx, batch, steps, mode, positions)

    return build


def lstm_seq(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """nn.LSTM over the whole sequence: the fed-back positions replaced by given values (no feedback)."""
    torch = ctx.torch
    fb = ctx.t(ctx.limit_inputs(batch, steps)["fb"])

    def positions(model, x):
        out, _ = model.lstm_layers(torch.cat([fb, x], dim=2))
        return model.activation(model.output_layer(out))

    return _traveller_case(ctx, batch, steps, mode, positions)


def limit(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The Traveller's FLOPs for all B x T rows at once, with the fed-back positions and previous states
    given: per layer `gates = z W_ih' + b_ih + h_prev W_hh' + b_hh`, then the LSTM gate math."""
    torch = ctx.torch
    linear = torch.nn.functional.linear
    d = ctx.limit_inputs(batch, steps)
    fb, h_prev, c_prev = ctx.t(d["fb"]), ctx.t(d["h_prev"]), ctx.t(d["c_prev"])

    def positions(model, x):
        z = torch.cat([fb, x], dim=2)  # [B, T, 2 + F]
        for w_ih, w_hh, b_ih, b_hh in model.lstm_layers.all_weights:  # per layer, no name lookups per call
            gates = linear(z, w_ih, b_ih) + linear(h_prev, w_hh, b_hh)
            i, f, g, o = gates.chunk(4, dim=2)
            c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
            z = torch.sigmoid(o) * torch.tanh(c)
        return torch.tanh(linear(z, model.output_layer.weight, model.output_layer.bias))

    return _traveller_case(ctx, batch, steps, mode, positions)


def graph_call(ctx: Context, forward: Callable[[], Any]) -> Callable[[], Any]:
    """`forward()` (tensors in, a tensor out, no gradient) captured once in a CUDA graph: -> a call that
    replays it and returns its output (the same static tensor each time). One warm-up call runs first on a
    side stream, as capture needs."""
    torch = ctx.torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = forward()
    torch.cuda.synchronize()

    def call():
        graph.replay()
        torch.cuda.synchronize()
        return static_out

    return call


def cuda_graph(ctx: Context, batch: int, steps: int, mode: str) -> Case:
    """The cell loop captured once in a CUDA graph, replayed per call (forward), or graphed fwd+bwd (train)."""
    torch = ctx.torch
    if not ctx.on_gpu:
        raise Skip("needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
    from torch_ref.traveller import traveller_loop  # the loop function itself

    d = ctx.data(batch, steps)
    xs = ctx.t(d["x"]).transpose(0, 1).contiguous()  # [T, B, F], the graph's static input
    r = ctx.t(d["r"])
    zero = ctx.torch_model.initial_state(batch)  # the loop's starting state, a static input too
    start = (zero.positions, zero.h, zero.c)
    t0 = time.perf_counter()
    if mode == "forward":
        weights = [w.detach() for w in ctx.torch_model.flat_weights()]
        call = graph_call(ctx, lambda: traveller_loop(xs, *start, weights, None)[0])  # positions [T, B, 2]
        return Case(call, output=lambda out: to_numpy(out.transpose(0, 1)), compile_s=time.perf_counter() - t0)

    model = train_copy(ctx, ctx.torch_model)
    params = model.flat_weights()

    def run(x, *weights):
        return traveller_loop(x, *start, list(weights), None)[0]

    graphed = torch.cuda.make_graphed_callables(run, (xs, *params))
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    return Case(adam_call(ctx, model, lambda: _trading_loss(ctx, graphed(xs, *params).transpose(0, 1), r)),
                compile_s=capture_s)
