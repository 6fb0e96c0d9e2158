"""`SeqVAE`: the chemist's GRU sequence VAE of seed 003, as the project's PyTorch reference.

A token sequence is encoded by a GRU into a Gaussian latent; a second GRU, whose initial hidden state is
computed from a sample `z` of that latent, decodes it back one token at a time. The structure is fixed
number for number by `docs/vae_spec.md`, which the JAX twin `jsr.SeqVAE` implements too, so the same
weights give the same numbers in both frameworks.

Tokens (`PAD, SOS, EOS = 0, 1, 2`, then the vocabulary; V ids in all): a batch is `tokens [B, T]`
(integer), each row the sequence's tokens, one `<eos>`, then `<pad>` up to T; `lengths [B]` counts the
non-pad tokens, the `<eos>` included. `<sos>` is never stored in `tokens`: the decoder is given it.

Equations (e(a) = one_hot(a, V); all GRUs are `torch.nn.GRU`, gates r, z, n)::

    s            = last layer's final hidden state of gru_encoder over e(tokens[b, :lengths[b]])  # [B, D*H]
                   (bidirectional: [forward final (step lengths-1); backward final (started at lengths-1)])
    mu, logvar   = fc_mu(s), fc_logvar(s)                                   # [B, Z] each
    z            = mu + exp(logvar / 2) * eps,   eps ~ N(0, I)              # [B, Z]
    h_{-1}       = tanh(latent_to_hidden(z)) as [B, Ld, Hd] -> [Ld, B, Hd]  # layer l: columns l*Hd:(l+1)*Hd
    x_t          = e(a_t)                (concat_z: [e(a_t); z])            # [B, V (+ Z)]
    h_t          = gru_decoder(x_t, h_{t-1});   logits_t = h2o(h_t)         # [B, V]
    a_0 = <sos>;  a_t = tokens[:, t-1] (teacher forcing), or the model's own prediction from logits_{t-1}
    word dropout (`word_mask`, teacher forcing): e(a_t) = 0 (no token at all) where word_mask[:, t], t >= 1

H, L are the encoder's sizes; Hd, Ld the decoder's (`decoder_hidden_size`, `decoder_layers`; by default H, L).

Losses: recon = sum over non-pad positions of cross-entropy(logits_t, tokens_t), averaged over the batch;
kl_per_dim = batch mean of -0.5 (1 + logvar - mu^2 - exp(logvar)); kl = sum(kl_per_dim), or with free
bits sum(max(kl_per_dim, free_bits)); total = recon + beta * kl.

How the decoder runs:
- teacher forcing (`replace_mask=None`): every input is known up front, so `gru_decoder` runs over the
  whole sequence in ONE call (cuDNN/oneDNN fuse the time loop);
- scheduled sampling (`replace_mask` given) and free running (`generate`): the input of step t depends on
  the output of step t-1, so a Python loop over time calls `gru_decoder` on one step `[B, 1, V(+Z)]` at a
  time, carrying the hidden state. Both use the one loop `SeqVAE.feedback_loop`; they differ only in the
  function that chooses what is fed back.

Randomness is explicit: `eps` (latent noise), `gumbel` (sampling noise), `replace_mask` (scheduled
sampling coins, one per token as in Bengio et al. 2015, not one per step) and `word_mask` (word dropout
coins, one per token) can all be passed in, so the JAX twin can be fed the same draws. When `eps`/`gumbel`
are not given they are drawn from torch's global RNG (`torch.randn`; Gumbel as `-log(Exponential(1))`, as
`torch.nn.functional.gumbel_softmax` draws it); the caller draws `replace_mask` and `word_mask`, e.g.
`torch.rand(B, T) < p` (see `replace_mask_like`).
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

# Special token ids (docs/vae_spec.md); the vocabulary proper starts at 3.
PAD, SOS, EOS = 0, 1, 2

DECODE_MODES = ("argmax", "sample", "gumbel_softmax")
GENERATE_MODES = ("greedy", "sample")


def sample_gumbel(
    shape: Sequence[int],
    *,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Standard Gumbel noise `-log(E)`, E ~ Exponential(1), drawn as `F.gumbel_softmax` draws it."""
    return -torch.empty(tuple(shape), dtype=dtype, device=device).exponential_(generator=generator).log()


def replace_mask_like(tokens: Tensor, p: float, *, generator: torch.Generator | None = None) -> Tensor:
    """Coins, one per token: bool [B, T], True with probability p: scheduled sampling's `replace_mask` (True:
    feed the prediction) or word dropout's `word_mask` (True: feed no token)."""
    _check_number("p", p, 0, 1)
    return torch.rand(tuple(tokens.shape), generator=generator, device=tokens.device) < p


def pad_after_eos(tokens: Tensor) -> Tensor:
    """tokens [B, T] with every position after a row's first `<eos>` set to `<pad>` (the `<eos>` kept)."""
    is_eos = (tokens == EOS).long()
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # number of <eos> strictly before each position
    return tokens.masked_fill(eos_before > 0, PAD)


def _check_number(name: str, value, low: float, high: float | None = None, *, integer=False, above=False):
    """`value` as a Python int (if `integer`) or float; ValueError unless it is a finite real number (an integer
    if `integer`, NumPy's included; never a bool) >= `low` (> `low` if `above`) and <= `high`:
    jax_scan_rnn/validate.py's rule and wording, which torch_ref does not import. The plain Python value is
    what `nn.GRU`/`nn.LSTM` take (they refuse NumPy's integers)."""
    ok = isinstance(value, Integral if integer else Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if above else value < low) or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f"{'>' if above else '>='} {low}"
        raise ValueError(f"{name}: expected {'an int' if integer else 'a finite number'} {bounds}, got {value!r}")
    return int(value) if integer else float(value)


def _check_float(name: str, x: Tensor, shape: tuple[int | None, ...], dtype: torch.dtype, what: str) -> None:
    """Raise TypeError/ValueError unless x is a `dtype` tensor of `shape` (None: any size >= 1 there).

    `what` spells the expected shape in symbols, e.g. "[B, Z]".
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (the model's parameters), got {x.dtype}")
    if x.ndim != len(shape) or any(n == 0 or (want is not None and n != want) for n, want in zip(x.shape, shape)):
        symbols = what[1:-1].split(", ")
        spelled = ", ".join(symbol if want is None else str(want) for symbol, want in zip(symbols, shape))
        raise ValueError(f"{name}: expected shape {what} = [{spelled}], got {list(x.shape)}")


class SeqVAE(nn.Module):
    """GRU sequence VAE: tokens [B, T] -> latent [B, Z] -> logits [B, T, V] (see the module docstring).

    Args:
        vocab_size: V, number of token ids, the specials PAD, SOS, EOS = 0, 1, 2 included.
        hidden_size: H of every encoder GRU layer (and of the decoder's unless `decoder_hidden_size`).
        latent_size: Z.
        num_layers: L, stacked GRU layers in the encoder (and in the decoder unless `decoder_layers`).
        decoder_hidden_size: Hd of every decoder GRU layer; None: H.
        decoder_layers: Ld, stacked GRU layers in the decoder; None: L.
        bidirectional: bidirectional encoder (the decoder is always forward).
        concat_z: append z to the decoder's input at every step, besides initialising its state from z.

    Attributes (the `state_dict()` prefixes, shared with `jsr.SeqVAE`); D = 2 if bidirectional else 1:
        gru_encoder: `nn.GRU(V, H, L, batch_first=True, bidirectional=bidirectional)`, reads one-hot [B, T, V].
        fc_mu, fc_logvar: `nn.Linear(D*H, Z)`.
        latent_to_hidden: `nn.Linear(Z, Ld*Hd)`; layer l of the decoder's h0 is `tanh` of columns l*Hd:(l+1)*Hd.
        gru_decoder: `nn.GRU(V + (Z if concat_z else 0), Hd, Ld, batch_first=True)`.
        h2o: `nn.Linear(Hd, V)`, hidden state to vocabulary logits.
        hidden_size, num_layers, decoder_hidden_size, decoder_layers: H, L, Hd, Ld (the last two resolved).

    `forward(tokens, lengths, ...)` is `loss(tokens, lengths, ...)`, so `model(tokens, lengths)["total"]`
    is what a training step backpropagates.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        latent_size: int,
        num_layers: int,
        *,
        decoder_hidden_size: int | None = None,
        decoder_layers: int | None = None,
        bidirectional: bool = False,
        concat_z: bool = False,
    ):
        super().__init__()
        vocab_size = _check_number("vocab_size", vocab_size, 3, integer=True)  # room for PAD, SOS, EOS
        hidden_size = _check_number("hidden_size", hidden_size, 1, integer=True)
        latent_size = _check_number("latent_size", latent_size, 1, integer=True)
        num_layers = _check_number("num_layers", num_layers, 1, integer=True)
        if decoder_hidden_size is not None:
            decoder_hidden_size = _check_number("decoder_hidden_size", decoder_hidden_size, 1, integer=True)
        if decoder_layers is not None:
            decoder_layers = _check_number("decoder_layers", decoder_layers, 1, integer=True)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.latent_size = latent_size
        self.num_layers = num_layers
        self.decoder_hidden_size = hidden_size if decoder_hidden_size is None else decoder_hidden_size
        self.decoder_layers = num_layers if decoder_layers is None else decoder_layers
        # bool(x) would read any truthy value ("no", 2) as True; jsr.SeqVAE refuses them too.
        for name, value in (("bidirectional", bidirectional), ("concat_z", concat_z)):
            if not isinstance(value, bool):
                raise TypeError(f"{name}: expected True or False, got {value!r}")
        self.bidirectional = bidirectional
        self.concat_z = concat_z
        directions = 2 if bidirectional else 1

        self.gru_encoder = nn.GRU(vocab_size, hidden_size, num_layers, batch_first=True, bidirectional=bidirectional)
        self.fc_mu = nn.Linear(directions * hidden_size, latent_size)
        self.fc_logvar = nn.Linear(directions * hidden_size, latent_size)
        self.latent_to_hidden = nn.Linear(latent_size, self.decoder_layers * self.decoder_hidden_size)
        decoder_input = vocab_size + (latent_size if concat_z else 0)
        self.gru_decoder = nn.GRU(decoder_input, self.decoder_hidden_size, self.decoder_layers, batch_first=True)
        self.h2o = nn.Linear(self.decoder_hidden_size, vocab_size)

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype; one-hot inputs are built in it and float arguments must have it."""
        return self.h2o.weight.dtype

    def _one_hot(self, tokens: Tensor) -> Tensor:
        """Integer ids [...] -> one-hot [..., V] in the parameters' dtype."""
        return F.one_hot(tokens.long(), self.vocab_size).to(self.dtype)

    # ---- Encoder and latent ----

    def encode(self, tokens: Tensor, lengths: Tensor | Sequence[int]) -> tuple[Tensor, Tensor]:
        """tokens [B, T] (int), lengths [B] -> (mu [B, Z], logvar [B, Z]).

        The encoder reads `one_hot(tokens)` [B, T, V] packed with `pack_padded_sequence(...,
        enforce_sorted=False)`, so nothing comes from positions at or beyond `lengths` (their content and
        their number do not matter). Its summary is the last layer's final hidden state, `h_n[-1]` (at step
        lengths-1), or `[h_n[-2]; h_n[-1]]` (forward final; backward final, started at step lengths-1) when
        bidirectional.
        """
        self._check_tokens(tokens)
        lengths = self._check_lengths(lengths, tokens)
        packed = pack_padded_sequence(self._one_hot(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h_n = self.gru_encoder(packed)  # [L*D, B, H], back in the batch's own order
        summary = torch.cat([h_n[-2], h_n[-1]], dim=-1) if self.bidirectional else h_n[-1]  # [B, D*H]
        return self.fc_mu(summary), self.fc_logvar(summary)

    def reparameterize(self, mu: Tensor, logvar: Tensor, eps: Tensor | None = None) -> Tensor:
        """z = mu + exp(logvar / 2) * eps: [B, Z]. eps [B, Z] is drawn with `torch.randn` when not given.

        Always samples (also in eval mode): pass `eps=torch.zeros_like(mu)` to decode the mean.
        """
        _check_float("mu", mu, (None, self.latent_size), self.dtype, "[B, Z]")
        _check_float("logvar", logvar, tuple(mu.shape), self.dtype, "[B, Z]")
        if eps is None:
            eps = torch.randn_like(mu)
        _check_float("eps", eps, tuple(mu.shape), self.dtype, "[B, Z]")
        return mu + torch.exp(0.5 * logvar) * eps

    def initial_hidden(self, z: Tensor) -> Tensor:
        """The decoder's initial state from z [B, Z]: tanh(latent_to_hidden(z)) [B, Ld*Hd] -> [Ld, B, Hd]."""
        self._check_z(z)
        h0 = torch.tanh(self.latent_to_hidden(z))  # [B, Ld*Hd]
        return h0.view(z.shape[0], self.decoder_layers, self.decoder_hidden_size).transpose(0, 1).contiguous()

    # ---- Decoder ----

    def feedback_loop(self, z: Tensor, steps: int, feed: Callable[[int, Tensor], Tensor]) -> Tensor:
        """The Python loop over time shared by scheduled sampling and free running: -> logits [B, steps, V].

        x_0 = one_hot(<sos>); step t gives logits_t; `feed(t, logits_t)` returns x_{t+1} [B, V], the vector
        fed to step t+1 (not called after the last step). `gru_decoder` runs one step [B, 1, V(+Z)] per call.
        It checks only z's shape and dtype, never a tensor's values, so it never waits on the GPU: a CUDA graph
        can capture it (the benchmark's graphed decoder rows, jax_scan_rnn/bench/vae_methods.py).
        """
        h = self.initial_hidden(z)  # [L, B, H]
        x = self._one_hot(torch.full((z.shape[0],), SOS, device=z.device))
        logits = []
        for t in range(steps):
            x_t = torch.cat([x, z], dim=-1) if self.concat_z else x
            out, h = self.gru_decoder(x_t.unsqueeze(1), h)  # [B, 1, Hd]
            logits.append(self.h2o(out[:, 0]))
            if t + 1 < steps:
                x = feed(t, logits[-1])
        return torch.stack(logits, dim=1)

    def decode(
        self,
        z: Tensor,
        tokens: Tensor,
        *,
        replace_mask: Tensor | None = None,
        word_mask: Tensor | None = None,
        mode: str = "argmax",
        gumbel: Tensor | None = None,
        temperature: float = 1.0,
        tau: float = 1.0,
    ) -> Tensor:
        """Decode z [B, Z] against tokens [B, T] (int): -> logits [B, T, V], logits_t predicting tokens[:, t].

        Step t is fed a_0 = <sos>, then:
        - `replace_mask=None`, teacher forcing: a_t = tokens[:, t-1]; one fused `gru_decoder` call.
          `word_mask` bool [B, T] (word dropout, Bowman et al. 2016; column 0 is ignored: <sos> is always
          read): where word_mask[:, t], step t reads no token, e(a_t) = 0 (still z when concat_z).
        - `replace_mask` bool [B, T], scheduled sampling (one coin per token; column 0 is ignored):
          a_t = pred_{t-1} where replace_mask[:, t], else tokens[:, t-1]; a Python loop over time. The
          prediction pred_{t-1} comes from logits_{t-1} by `mode`:
            "argmax"          argmax(logits_{t-1}) (ties: lowest index);
            "sample"          argmax(logits_{t-1} / temperature + gumbel[:, t-1]) (Gumbel-max sampling);
            "gumbel_softmax"  differentiable straight-through vector, fed in place of the one-hot:
                              y_soft = softmax((logits_{t-1} + gumbel[:, t-1]) / tau),
                              y_hard = one_hot(argmax(y_soft)), fed y_hard + y_soft - y_soft.detach()
                              (forward value y_hard, gradient of y_soft); replaced positions only.
        `gumbel` [B, T, V] is standard Gumbel noise (its last step is unused), drawn with torch's RNG when
        not given and the mode needs it. Under teacher forcing `mode`, `temperature` and `tau` are checked but
        unused and `gumbel` is not even checked (`jsr.SeqVAE` checks it); under "argmax" `gumbel` is unused but
        checked when given. `temperature` is used by "sample" only,
        `tau` by "gumbel_softmax" only. `word_mask` with `replace_mask` raises ValueError: word dropout is
        defined on teacher forcing.
        """
        self._check_tokens(tokens)
        self._check_z(z, batch=tokens.shape[0])
        if mode not in DECODE_MODES:
            raise ValueError(f"mode: expected one of {DECODE_MODES}, got {mode!r}")
        _check_number("temperature", temperature, 0, above=True)
        _check_number("tau", tau, 0, above=True)
        batch, seq_len = tokens.shape
        if word_mask is not None:
            if replace_mask is not None:
                raise ValueError("word_mask: expected None with a replace_mask (word dropout is defined on teacher "
                                 "forcing, not on scheduled sampling), got a mask")
            self._check_mask("word_mask", word_mask, batch, seq_len)

        if replace_mask is None:  # teacher forcing: all inputs known, one fused call over the sequence
            sos = tokens.new_full((batch, 1), SOS)
            x = self._one_hot(torch.cat([sos, tokens[:, :-1]], dim=1))  # [B, T, V]
            if word_mask is not None:  # no token where dropped; <sos> (column 0) always read
                dropped = torch.cat([word_mask.new_zeros(batch, 1), word_mask[:, 1:]], dim=1)  # [B, T]
                x = x.masked_fill(dropped[:, :, None], 0.0)
            if self.concat_z:
                x = torch.cat([x, z.unsqueeze(1).expand(batch, seq_len, self.latent_size)], dim=-1)
            out, _ = self.gru_decoder(x, self.initial_hidden(z))  # [B, T, H]
            return self.h2o(out)

        self._check_mask("replace_mask", replace_mask, batch, seq_len)
        gumbel = self._gumbel_for(
            gumbel, (batch, seq_len), needed=mode != "argmax", device=z.device, what="[B, T, V]"
        )
        teacher = self._one_hot(tokens)  # [B, T, V]; teacher[:, t] is fed to step t+1

        def feed(t: int, logits_t: Tensor) -> Tensor:
            """x_{t+1}: the prediction from logits_t where replace_mask[:, t+1], else one_hot(tokens[:, t])."""
            if mode == "gumbel_softmax":
                y_soft = torch.softmax((logits_t + gumbel[:, t]) / tau, dim=-1)
                y_hard = self._one_hot(y_soft.argmax(dim=-1))
                predicted = y_hard + y_soft - y_soft.detach()  # straight-through estimator
            elif mode == "sample":
                predicted = self._one_hot((logits_t / temperature + gumbel[:, t]).argmax(dim=-1))
            else:
                predicted = self._one_hot(logits_t.argmax(dim=-1))
            return torch.where(replace_mask[:, t + 1, None], predicted, teacher[:, t])

        return self.feedback_loop(z, seq_len, feed)

    # ---- Loss, forward, generation ----

    def loss(
        self,
        tokens: Tensor,
        lengths: Tensor | Sequence[int],
        *,
        beta: float = 1.0,
        free_bits: float = 0.0,
        eps: Tensor | None = None,
        z: Tensor | None = None,
        replace_mask: Tensor | None = None,
        word_mask: Tensor | None = None,
        mode: str = "argmax",
        gumbel: Tensor | None = None,
        temperature: float = 1.0,
        tau: float = 1.0,
    ) -> dict[str, Tensor]:
        """Encode, sample z (with `eps`), decode (the decoder options are passed to `decode`), and score.

        `z` [B, Z] given: decode from it instead, with no encoder and no KL (0), as jsr.SeqVAE's `loss(z=...)`:
        zeros make the decoder alone a CharRNN (`train vae --decoder-only`'s model).

        Returns a dict of tensors:
            recon       scalar: sum over t and over positions with tokens != <pad> of
                        cross_entropy(logits[:, t], tokens[:, t]), divided by B (per-sequence sum, batch mean);
            kl_per_dim  [Z]: batch mean of -0.5 * (1 + logvar - mu^2 - exp(logvar));
            kl          scalar: sum(kl_per_dim) if free_bits == 0, else sum(max(kl_per_dim, free_bits))
                        (free bits, Kingma et al. 2016, on the batch-averaged per-dimension KL);
            total       scalar: recon + beta * kl.
        """
        _check_number("beta", beta, 0)
        _check_number("free_bits", free_bits, 0)
        if z is None:
            mu, logvar = self.encode(tokens, lengths)
            z = self.reparameterize(mu, logvar, eps)
        else:
            self._check_tokens(tokens)  # first: z's check reads the tokens' batch size
            self._check_z(z, batch=tokens.shape[0])
            mu = logvar = torch.zeros_like(z)  # no posterior: KL(N(0, 1) || N(0, 1)) = 0 in every dimension
        logits = self.decode(z, tokens, replace_mask=replace_mask, word_mask=word_mask, mode=mode, gumbel=gumbel,
                             temperature=temperature, tau=tau)
        # cross_entropy wants the classes in dim 1: [B, V, T] against [B, T]; <pad> targets add nothing.
        recon = F.cross_entropy(logits.transpose(1, 2), tokens.long(), ignore_index=PAD, reduction="sum")
        recon = recon / tokens.shape[0]
        kl_per_dim = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).mean(dim=0)  # [Z]
        kl = kl_per_dim.sum() if free_bits == 0 else torch.clamp(kl_per_dim, min=free_bits).sum()
        return {"total": recon + beta * kl, "recon": recon, "kl": kl, "kl_per_dim": kl_per_dim}

    def forward(self, tokens: Tensor, lengths: Tensor | Sequence[int], **loss_kwargs) -> dict[str, Tensor]:
        """`self.loss(tokens, lengths, **loss_kwargs)`: the dict with `total`, `recon`, `kl`, `kl_per_dim`."""
        return self.loss(tokens, lengths, **loss_kwargs)

    @torch.no_grad()
    def generate(
        self,
        z: Tensor,
        max_len: int,
        *,
        mode: str = "greedy",
        temperature: float = 1.0,
        top_k: int = 0,
        gumbel: Tensor | None = None,
    ) -> Tensor:
        """Free-running generation from z [B, Z]: -> tokens [B, max_len] (int64), no gradient.

        a_0 = <sos>; next_t = argmax(logits_t) ("greedy"), or ("sample") argmax(logits_t / temperature +
        gumbel[:, t]) after setting, when top_k > 0, every logit below its row's k-th largest to -inf;
        a_{t+1} = next_t. Output next_t, with every position after a row's first <eos> set to <pad> (the
        loop itself runs all max_len steps). `gumbel` [B, max_len, V] is drawn with torch's RNG when not
        given under "sample"; "greedy" ignores `temperature`, `top_k` and `gumbel` (checked when given).
        """
        self._check_z(z)
        max_len = _check_number("max_len", max_len, 1, integer=True)
        if mode not in GENERATE_MODES:
            raise ValueError(f"mode: expected one of {GENERATE_MODES}, got {mode!r}")
        _check_number("temperature", temperature, 0, above=True)
        top_k = _check_number("top_k", top_k, 0, self.vocab_size, integer=True)  # 0: off
        gumbel = self._gumbel_for(
            gumbel, (z.shape[0], max_len), needed=mode == "sample", device=z.device, what="[B, max_len, V]"
        )

        def pick(t: int, logits_t: Tensor) -> Tensor:
            """next_t [B] from logits_t [B, V]."""
            if mode == "greedy":
                return logits_t.argmax(dim=-1)
            if top_k > 0:
                kth_largest = torch.topk(logits_t, top_k, dim=-1).values[..., -1:]
                logits_t = logits_t.masked_fill(logits_t < kth_largest, float("-inf"))
            return (logits_t / temperature + gumbel[:, t]).argmax(dim=-1)

        chosen: list[Tensor] = []  # next_t [B] for every step

        def feed(t: int, logits_t: Tensor) -> Tensor:
            chosen.append(pick(t, logits_t))
            return self._one_hot(chosen[-1])

        logits = self.feedback_loop(z, max_len, feed)
        chosen.append(pick(max_len - 1, logits[:, -1]))  # the last token is output, never fed
        return pad_after_eos(torch.stack(chosen, dim=1))

    # ---- Argument checks ----

    def _check_tokens(self, tokens: Tensor) -> None:
        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens: expected a torch.Tensor of token ids, got {type(tokens).__name__}")
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TypeError(f"tokens: expected an integer tensor of token ids, got dtype {tokens.dtype}")
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError(f"tokens: expected shape [B, T] with B, T >= 1, got {list(tokens.shape)}")
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.vocab_size:
            raise ValueError(f"tokens: expected ids in [0, vocab_size={self.vocab_size}), got ids in [{low}, {high}]")

    def _check_lengths(self, lengths: Tensor | Sequence[int], tokens: Tensor) -> Tensor:
        if not isinstance(lengths, Tensor):
            try:
                lengths = torch.as_tensor(lengths)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(
                    f"lengths: expected a tensor or sequence of ints, got {type(lengths).__name__}"
                ) from None
        if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise TypeError(f"lengths: expected an integer tensor, got dtype {lengths.dtype}")
        batch, seq_len = tokens.shape
        if tuple(lengths.shape) != (batch,):
            raise ValueError(f"lengths: expected shape [B] = [{batch}], got {list(lengths.shape)}")
        low, high = int(lengths.min()), int(lengths.max())
        if low < 1 or high > seq_len:
            raise ValueError(f"lengths: expected values in [1, T={seq_len}], got values in [{low}, {high}]")
        return lengths

    @staticmethod
    def _check_mask(name: str, mask: Tensor, batch: int, seq_len: int) -> None:
        """`replace_mask` / `word_mask`: a bool tensor [B, T]."""
        if not isinstance(mask, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"{name}: expected dtype torch.bool, got {mask.dtype}")
        if tuple(mask.shape) != (batch, seq_len):
            raise ValueError(f"{name}: expected shape [B, T] = {[batch, seq_len]}, got {list(mask.shape)}")

    def _check_z(self, z: Tensor, batch: int | None = None) -> None:
        """z must be [B, Z] in the parameters' dtype (B = `batch` when given, i.e. the tokens' B)."""
        _check_float("z", z, (batch, self.latent_size), self.dtype, "[B, Z]")

    def _gumbel_for(
        self, gumbel: Tensor | None, batch_steps: tuple[int, int], *, needed: bool, device: torch.device, what: str
    ) -> Tensor | None:
        """The given Gumbel noise [B, T, V], checked; drawn with torch's RNG if None and needed."""
        shape = (*batch_steps, self.vocab_size)
        if gumbel is None:
            return sample_gumbel(shape, dtype=self.dtype, device=device) if needed else None
        _check_float("gumbel", gumbel, shape, self.dtype, what)
        return gumbel
