"""The VAE decoder rows: scheduled sampling ("ss": one coin per token feeds back either the model's argmax
or the true token), teacher forcing ("tf": nothing fed back, the bound for "ss") and greedy generation
("greedy": free running), each as torch_ref.SeqVAE (a Python loop over nn.GRU steps), that loop captured in a
CUDA graph (GPU only), and jsr.SeqVAE (one jitted lax.scan). A train step is the whole VAE loss (encoder,
decoder, KL) + Adam.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.bench.context import Case, Context, Skip
from jax_scan_rnn.bench.jax_methods import library_case
from jax_scan_rnn.bench.torch_methods import adam_call, graph_call, to_numpy, torch_case, train_copy
from jax_scan_rnn.data.smiles import EOS, SPECIAL_TOKENS


class VAEContext:
    """torch_ref.SeqVAE and jsr.SeqVAE on the same weights (float32), and the token data of one (B, T)."""

    def __init__(self, ctx: Context):
        import torch_ref

        cfg = ctx.cfg
        if cfg.dtype != "float32":
            raise Skip("float32 only")
        sizes = (cfg.vae_vocab, cfg.vae_hidden, cfg.vae_latent, cfg.vae_layers)
        ctx.torch.manual_seed(cfg.seed)
        model = torch_ref.SeqVAE(*sizes)
        self.torch_model = model.to(ctx.torch_device).eval()
        jmodel = jsr.SeqVAE(*sizes, rngs=nnx.Rngs(cfg.seed))
        jsr.load_torch_state_dict(jmodel, model.state_dict())
        jmodel.eval()
        self.model = jmodel
        self.cfg = cfg
        self._data: dict[tuple, dict] = {}

    def data(self, batch: int, steps: int) -> dict:
        """Full-length sequences tokens [B, T] (random tokens, then <eos>), their lengths [B], one coin per
        token mask [B, T] (p = 0.5), and the latent z and the encoder's noise eps [B, Z] (numpy)."""
        key = (batch, steps)
        if key not in self._data:
            rng = np.random.default_rng([self.cfg.seed, batch, steps, 2])
            tokens = rng.integers(len(SPECIAL_TOKENS), self.cfg.vae_vocab, (batch, steps))  # no special one
            tokens[:, -1] = EOS
            self._data = {key: {
                "tokens": tokens,
                "lengths": np.full((batch,), steps),
                "mask": rng.random((batch, steps)) < 0.5,
                "z": rng.standard_normal((batch, self.cfg.vae_latent), dtype=np.float32),
                "eps": rng.standard_normal((batch, self.cfg.vae_latent), dtype=np.float32),
            }}
        return self._data[key]


def _vae(ctx: Context) -> VAEContext:
    if ctx.vae is None:
        ctx.vae = VAEContext(ctx)
    return ctx.vae


def torch_probe(ctx: Context, batch: int) -> Callable[[], None]:
    """One call of torch_ref's scheduled-sampling decoder loop at `batch` and ~2,000 sequence-steps (T
    from 2 to 20), ~10-100 ms on a CPU: what the VAE rows' torch thread count is calibrated on (CPU only)."""
    torch = ctx.torch
    model = _vae(ctx).torch_model
    d = ctx.vae.data(batch, max(2, min(20, 2000 // batch)))
    tokens, mask, z = torch.from_numpy(d["tokens"]), torch.from_numpy(d["mask"]), torch.from_numpy(d["z"])

    def call() -> None:
        with torch.no_grad():
            model.decode(z, tokens, replace_mask=mask)

    return call


def torch_row(task: str) -> Callable[[Context, int, int, str], Case]:
    """torch_ref.SeqVAE for `task` ("ss", "tf" or "greedy")."""

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        vae = _vae(ctx)
        d = {k: ctx.torch.from_numpy(v).to(ctx.torch_device) for k, v in vae.data(batch, steps).items()}
        mask = d["mask"] if task == "ss" else None

        def forward(model):
            if task == "greedy":
                return model.generate(d["z"], steps)
            return model.decode(d["z"], d["tokens"], replace_mask=mask)

        def loss(model):
            return model.loss(d["tokens"], d["lengths"], eps=d["eps"], replace_mask=mask)["total"]

        return torch_case(ctx, mode, vae.torch_model, forward, loss)

    return build


def scheduled_decoder(torch, model, tokens, mask):
    """A module whose `forward(z [B, Z]) -> logits [B, T, V]` equals `model.decode(z, tokens, replace_mask=mask)`
    (argmax mode): `model.feedback_loop` with decode's feed and none of decode's checks, which read the token
    ids' range on the host and so cannot be captured in a CUDA graph."""
    def one_hot(ids):
        return torch.nn.functional.one_hot(ids.long(), model.vocab_size).to(model.dtype)

    teacher = one_hot(tokens)  # teacher[:, t] is fed to step t+1 where the coin says so

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model  # its parameters are the module's, for make_graphed_callables

        def forward(self, z):
            def feed(t, logits_t):
                return torch.where(mask[:, t + 1, None], one_hot(logits_t.argmax(dim=-1)), teacher[:, t])

            return self.model.feedback_loop(z, tokens.shape[1], feed)

    return Decoder()


def torch_graph_row(task: str) -> Callable[[Context, int, int, str], Case]:
    """`torch_row(task)` with the decoder loop captured once in a CUDA graph and replayed (GPU only).

    Forward: "greedy" graphs `generate(z, T)` whole, "ss" the scheduled-sampling loop (`scheduled_decoder`).
    Train ("ss"): the decoder's forward and backward graphed by `torch.cuda.make_graphed_callables`; the
    encoder (packed sequences, whose lengths live on the host), the KL and Adam run eagerly around it.
    """

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        torch = ctx.torch
        if not ctx.on_gpu:
            raise Skip("needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
        vae = _vae(ctx)
        d = {k: torch.from_numpy(v).to(ctx.torch_device) for k, v in vae.data(batch, steps).items()}
        t0 = time.perf_counter()
        if mode == "forward":
            model = vae.torch_model
            if task == "greedy":
                call = graph_call(ctx, lambda: model.generate(d["z"], steps))
            else:
                decoder = scheduled_decoder(torch, model, d["tokens"], d["mask"])
                call = graph_call(ctx, lambda: decoder(d["z"]))
            return Case(call, output=to_numpy, compile_s=time.perf_counter() - t0)
        model = train_copy(ctx, vae.torch_model)
        graph_decoder(torch, model, d["tokens"], d["mask"], d["z"])
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        return Case(adam_call(ctx, model, lambda: model.loss(d["tokens"], d["lengths"], eps=d["eps"],
                                                             replace_mask=d["mask"])["total"]), compile_s=compile_s)

    return build


def graph_decoder(torch, model, tokens, mask, z, make_graphed=None):
    """Make `model.loss(tokens, ..., replace_mask=mask)` decode through a graphed `scheduled_decoder`:
    `model.decode` becomes that module (forward and backward captured by `make_graphed`, by default
    `torch.cuda.make_graphed_callables`, with a z [B, Z] like the encoder's as its sample). Returns the module.
    Only for the benchmark's own copy of a model: it replaces that instance's `decode`."""
    make_graphed = make_graphed or torch.cuda.make_graphed_callables
    decoder = scheduled_decoder(torch, model, tokens, mask)
    # allow_unused_input: the encoder's parameters belong to the module but get no gradient from the decoder
    graphed = make_graphed(decoder, (z.detach().clone().requires_grad_(),), allow_unused_input=True)
    model.decode = lambda z, tokens, **_: graphed(z)
    return graphed


def jax_row(task: str) -> Callable[[Context, int, int, str], Case]:
    """jsr.SeqVAE for `task` ("ss", "tf" or "greedy"), as the library runs it (`library_case`)."""

    def build(ctx: Context, batch: int, steps: int, mode: str) -> Case:
        vae = _vae(ctx)
        d = vae.data(batch, steps)
        tokens, lengths = jnp.asarray(d["tokens"], jnp.int32), jnp.asarray(d["lengths"], jnp.int32)
        mask = jnp.asarray(d["mask"]) if task == "ss" else None
        z, eps = jnp.asarray(d["z"]), jnp.asarray(d["eps"])
        if mode == "train":
            def loss(m, tokens, lengths, eps, mask):
                return m.loss(tokens, lengths, eps=eps, replace_mask=mask)["total"]

            return library_case(ctx, mode, loss, vae.model, tokens, lengths, eps, mask)
        if task == "greedy":
            return library_case(ctx, mode, lambda m, z: m.generate(z, steps), vae.model, z)
        return library_case(ctx, mode, lambda m, z, tokens, mask: m.decode(z, tokens, replace_mask=mask), vae.model,
                            z, tokens, mask)

    return build
