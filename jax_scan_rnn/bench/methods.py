"""The rows of the suite: every way of running the Traveller (and the VAE decoder), by key.

`METHODS` is the one table of rows. A `Method` names a row and how to build it: `build(ctx, B, T, mode)`
returns a `Case` whose `call()` runs once (see `context`); the builders live with their subject in
`torch_methods`, `jax_methods`, `vae_methods` and `peer_methods`.

Peer rows (role "peer") are what a JAX user would write without this library (Flax NNX, Equinox,
torchax); each names in `versus` the jsr rows it is measured against, and in `requires` the optional
package it needs (missing: the row is "n/a" with the install hint, never an error).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jax_scan_rnn.bench import jax_methods, peer_methods, torch_methods, vae_methods
from jax_scan_rnn.bench.config import AUTO_KEY, LIMIT_CHUNK_ROWS, MODES, SCAN_UNROLLS, SEED_KEY, BenchConfig
from jax_scan_rnn.bench.context import Case, Context


@dataclass(frozen=True)
class Method:
    """One way of running the Traveller. `kind`: "eager" (probed on a short T first) or "compiled"."""

    key: str
    label: str
    framework: str  # "torch" | "jax"
    kind: str  # "eager" | "compiled"
    build: Callable[[Context, int, int, str], Case]
    # "seed", "limit", "bound" (no feedback: a lower bound), "peer" (another library's way), or "method"
    role: str = "method"
    where: str = "grid"  # "grid": the main grid; "sweep": only the short-T sweep; "both"
    max_t: int | None = None  # grid cells with larger T are skipped ("short T only")
    max_t_note: str = ""  # why, added to that reason
    versus: tuple[str, ...] = ()  # peers: the jsr rows compared with (ratio, agreement): the first one measured
    requires: str | None = None  # peers: the optional package the row needs (import name)
    modes: tuple[str, ...] = MODES  # the modes it has rows for
    modes_note: str = ""  # why a mode is missing
    gpu_only: bool = False
    model: str = "traveller"  # "traveller", "vae-ss" (scheduled-sampling decoder), "vae-greedy" (generation)
    note: str = ""  # one line for the README / table: what the row means


UNROLLED_NOTE = "forward only (its compile of the unrolled backward grows with T as well)"
FEEDBACK_JSR = (AUTO_KEY, "jax-scan-u1")  # the feedback peers' jsr rows: the library's default, in the sweep unroll 1
# torchax traces the seed's Python loop: T copies of nn.LSTM's step in one program, so its compile grows with T.
# First call measured (forward, B=1, 2-core CPU, load average ~4): 1.9 s at T=10, 5.1 s at T=100, 19 s at
# T=300, 289 s at T=1000; hence short T only.
TORCHAX_NOTE = ("torchax unrolls the seed's Python loop into T steps: its first call took 19 s at T=300 and "
                "289 s at T=1000 (forward, B=1, 2-core CPU)")
NO_GRADIENT = "generation has no gradient"

def _by_key(rows: list[Method]) -> dict[str, Method]:
    """The table keyed by each row's key; two rows with one key would silently lose one: refused."""
    table = {m.key: m for m in rows}
    if len(table) != len(rows):
        raise ValueError(f"METHODS: expected distinct keys, got {sorted(m.key for m in rows)}")
    return table


METHODS: dict[str, Method] = _by_key([
    # -- torch -----------------------------------------------------------------------------------
    Method(SEED_KEY, "torch: seed loop (nn.LSTM per step)", "torch", "eager", torch_methods.loop("loop"),
           role="seed", where="both",
           note="the seed's code: a Python loop calling nn.LSTM on one step, torch.cat, Linear, tanh"),
    Method("torch-cell", "torch: LSTM-cell loop", "torch", "eager", torch_methods.loop("cell"),
           note="the same Python loop over per-step cell math (F.linear + gates): no nn.LSTM call per step"),
    Method("torch-script", "torch: jit.script(loop)", "torch", "eager", torch_methods.loop("script"),
           note="TorchScript of that loop function, the working form of the seed answer's script_method"),
    Method("torch-scan", "torch: _higher_order_ops.scan, eager", "torch", "eager", torch_methods.loop("scan"),
           note="the private scan prototype without compile: still a Python loop (through Dynamo)"),
    Method("torch-compile-scan", "torch: compile(scan)", "torch", "compiled", torch_methods.compiled("scan"),
           note="torch.compile (inductor) of the scan: one graph node for the loop; compiled per cell"),
    Method("torch-compile-loop", "torch: compile(loop), short T", "torch", "compiled", torch_methods.compiled("cell"),
           where="sweep", modes=("forward",), modes_note=UNROLLED_NOTE,
           note="torch.compile of the Python loop: Dynamo unrolls T steps, so compile time grows with T"),
    Method("torch-cuda-graph", "torch: CUDA graph of the loop", "torch", "compiled", torch_methods.cuda_graph,
           gpu_only=True, note="the cell loop captured once as a CUDA graph and replayed (GPU only)"),
    Method("torch-lstm-seq", "torch: nn.LSTM whole sequence, no feedback", "torch", "eager", torch_methods.lstm_seq,
           role="bound",
           note="lower bound: one nn.LSTM call over all T (cuDNN on GPU), positions given, not fed back"),
    # -- JAX -------------------------------------------------------------------------------------
    *[Method(f"jax-scan-u{u}", f"jax: lax.scan, unroll={u}", "jax", "compiled", jax_methods.scan(u),
             where="both" if u == 1 else "grid",
             note=f"jsr.Traveller: one jitted lax.scan over T, {u} step(s) per loop iteration") for u in SCAN_UNROLLS],
    Method(AUTO_KEY, "jax: lax.scan, unroll=auto", "jax", "compiled", jax_methods.scan("auto"),
           note="the library's default: unroll chosen from measurements (jax_scan_rnn.scan.auto_unroll)"),
    Method("jax-user-call", "jax: jsr.jit(model)(x)", "jax", "compiled", jax_methods.user_call,
           modes=("forward",), modes_note="forward only: a training step differentiates the model itself",
           note="the user's compiled call: jsr.jit over the model, its weights read at each call (the "
                "row above is the same scan AOT-compiled and called on its parameters)"),
    Method("jax-jit-loop", "jax: jit(Python loop), short T", "jax", "compiled", jax_methods.jit_loop,
           where="sweep", modes=("forward",), modes_note=UNROLLED_NOTE,
           note="a Python for-loop traced by jax.jit: unrolled into T copies, so compile time grows with T"),
    Method("jax-eager", "jax: eager op-by-op, short T", "jax", "eager", jax_methods.eager,
           where="both", max_t=100, modes=("forward",),
           modes_note="forward only: an eager value_and_grad of the loop costs ~0.2 s per step on a CPU",
           note="the same loop without jit: every op dispatched from Python"),
    Method("jax-scan-remat", "jax: lax.scan, remat chunks of ~sqrt(T)", "jax", "compiled", jax_methods.remat,
           modes=("train",), modes_note="train only: rematerialisation changes what the backward pass stores",
           note="jsr.Traveller(remat_chunk=round(sqrt(T))), unroll=1: training memory ~sqrt(T) instead of ~T"),
    Method("jax-lstm-seq", "jax: jsr.LSTM whole sequence, no feedback", "jax", "compiled", jax_methods.lstm_seq,
           role="bound", note="jsr.LSTM over all T (a lax.scan per layer), positions given, not fed back"),
    # -- peers: what a JAX user would write without jsr, on the same weights -----------------------
    Method("jax-gru-seq", "jax: jsr.GRU whole sequence, no feedback", "jax", "compiled", peer_methods.jsr_gru_seq,
           role="bound", note="the GRU peers' jsr row: jsr.GRU (the Traveller's sizes, its own weights with "
                              "b_hn = 0) over all T and the Traveller's readout, positions given, not fed back"),
    Method("peer-flax-lstm-seq", "peer: Flax nnx.RNN(LSTMCell) whole sequence", "jax", "compiled",
           peer_methods.flax_seq("lstm"), role="peer", versus=("jax-lstm-seq",),
           note="nnx.RNN(nnx.LSTMCell) per layer over all T (one Linear per gate), positions given: vs jax-lstm-seq"),
    Method("peer-flax-optlstm-seq", "peer: Flax nnx.RNN(OptimizedLSTMCell) whole sequence", "jax", "compiled",
           peer_methods.flax_seq("optimized-lstm"), role="peer", versus=("jax-lstm-seq",),
           note="nnx.RNN(nnx.OptimizedLSTMCell) per layer over all T (fused gate matmuls), positions given: "
                "vs jax-lstm-seq"),
    Method("peer-flax-gru-seq", "peer: Flax nnx.RNN(GRUCell) whole sequence", "jax", "compiled",
           peer_methods.flax_seq("gru"), role="peer", versus=("jax-gru-seq",),
           note="nnx.RNN(nnx.GRUCell) per layer over all T on jax-gru-seq's weights (b_hn = 0: nnx.GRUCell has "
                "none), positions given: vs jax-gru-seq"),
    Method("peer-flax-fb", "peer: Flax feedback cell in nnx.RNN (LSTMCell)", "jax", "compiled",
           peer_methods.flax_feedback("lstm"), role="peer", versus=FEEDBACK_JSR,
           note="the Traveller the Flax docs' way: a custom NNX cell (nnx.LSTMCell layers + nnx.Linear) whose "
                "carry holds the last positions, run by nnx.RNN: vs jax-scan-auto"),
    Method("peer-flax-fb-opt", "peer: Flax feedback cell in nnx.RNN (OptimizedLSTMCell)", "jax", "compiled",
           peer_methods.flax_feedback("optimized-lstm"), role="peer", versus=FEEDBACK_JSR,
           note="the same feedback cell with nnx.OptimizedLSTMCell layers: vs jax-scan-auto"),
    Method("peer-eqx-lstm", "peer: Equinox LSTMCell feedback in lax.scan", "jax", "compiled",
           peer_methods.eqx_traveller, role="peer", versus=FEEDBACK_JSR, requires="equinox",
           note="the Traveller with eqx.nn.LSTMCell layers and eqx.nn.Linear: lax.scan over one sequence, "
                "jax.vmap over the batch: vs jax-scan-auto"),
    Method("peer-eqx-gru-seq", "peer: Equinox GRUCell whole sequence", "jax", "compiled", peer_methods.eqx_gru_seq,
           role="peer", versus=("jax-gru-seq",), requires="equinox",
           note="eqx.nn.GRUCell layers (a lax.scan each, vmapped over the batch) on jax-gru-seq's weights, "
                "positions given: vs jax-gru-seq"),
    Method("peer-torchax-loop", "peer: torchax, the seed's torch loop under jax.jit", "jax", "compiled",
           peer_methods.torchax_loop, role="peer", versus=FEEDBACK_JSR, requires="torchax", where="both",
           max_t=100, max_t_note=TORCHAX_NOTE,
           note="the torch-loop row's model and code (nn.LSTM per step) as a JAX function (torchax.extract_jax) "
                "under jax.jit: unrolled into T steps, short T only (forward T <= 100, train T <= 10)"),
    # -- the limit: the same FLOPs without the time dependency -----------------------------------
    Method("limit-xla", "limit: batched matmuls (XLA)", "jax", "compiled", jax_methods.limit,
           role="limit", note="the same FLOPs with the time dependency removed, jitted JAX, in chunks of "
                              f"~{LIMIT_CHUNK_ROWS} rows (B x steps) so that the operands stay in cache"),
    Method("limit-torch", "limit: batched matmuls (torch)", "torch", "eager", torch_methods.limit,
           role="limit", note="the same FLOPs with the time dependency removed, torch, all B x T rows at once"),
    # -- the VAE decoder -------------------------------------------------------------------------
    Method("vae-ss-torch", "torch: decoder loop, scheduled sampling", "torch", "eager", vae_methods.torch_row("ss"),
           role="seed", model="vae-ss",
           note="torch_ref.SeqVAE.decode(z, tokens, replace_mask): a Python loop over nn.GRU steps; train: "
                "its loss (encoder + decoder + KL)"),
    Method("vae-ss-torch-graph", "torch: CUDA graph of the decoder loop, scheduled sampling", "torch", "compiled",
           vae_methods.torch_graph_row("ss"), gpu_only=True, model="vae-ss",
           note="that loop captured once as a CUDA graph and replayed; train: the decoder's forward and backward "
                "graphed (make_graphed_callables), the encoder, KL and Adam eager (GPU only)"),
    Method("vae-ss-jax", "jax: decoder scan, scheduled sampling", "jax", "compiled", vae_methods.jax_row("ss"),
           model="vae-ss", note="jsr.SeqVAE.decode with the same replace_mask: one jitted lax.scan"),
    Method("vae-tf-torch", "torch: teacher forcing, no feedback", "torch", "eager", vae_methods.torch_row("tf"),
           role="bound", model="vae-ss", note="decode(z, tokens) without replace_mask: one nn.GRU call"),
    Method("vae-tf-jax", "jax: teacher forcing, no feedback", "jax", "compiled", vae_methods.jax_row("tf"),
           role="bound", model="vae-ss", note="jsr.SeqVAE.decode without replace_mask"),
    Method("vae-greedy-torch", "torch: greedy generation loop", "torch", "eager", vae_methods.torch_row("greedy"),
           role="seed", model="vae-greedy", modes=("forward",), modes_note=NO_GRADIENT,
           note="torch_ref.SeqVAE.generate(z, T): argmax fed back as a one-hot, a Python loop"),
    Method("vae-greedy-torch-graph", "torch: CUDA graph of the generation loop", "torch", "compiled",
           vae_methods.torch_graph_row("greedy"), gpu_only=True, model="vae-greedy", modes=("forward",),
           modes_note=NO_GRADIENT, note="generate(z, T) captured once as a CUDA graph and replayed (GPU only)"),
    Method("vae-greedy-jax", "jax: greedy generation scan", "jax", "compiled", vae_methods.jax_row("greedy"),
           model="vae-greedy", modes=("forward",), modes_note=NO_GRADIENT,
           note="jsr.SeqVAE.generate(z, T), jitted: one lax.scan"),
])


def check_method_keys(cfg: BenchConfig) -> None:
    """Every key in `cfg.methods` / `cfg.train_methods` names a row of `METHODS`."""
    for name in ("methods", "train_methods"):
        unknown = [m for m in getattr(cfg, name) or () if m not in METHODS]
        if unknown:
            raise ValueError(f"{name}: unknown {unknown}; expected keys of {sorted(METHODS)}")
