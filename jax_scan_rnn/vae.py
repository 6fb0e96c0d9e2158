"""`SeqVAE`: the GRU sequence VAE of seed 003 (`docs/vae_spec.md`), with its decoder as one `lax.scan`.

A token sequence is encoded by a GRU into a Gaussian latent; a second GRU, whose initial state comes
from a sample `z` of that latent, decodes it back one token at a time. The structure is the spec's,
number for number, and the attribute names are `torch_ref.SeqVAE`'s state_dict prefixes, so
`jsr.load_torch_state_dict` / `jsr.torch_state_dict` move weights between the twins unchanged.

Tokens: `PAD, SOS, EOS = 0, 1, 2`, then the vocabulary (V ids in all). A batch is `tokens [B, T]` (int):
each row its tokens, one `<eos>`, then `<pad>`; `lengths [B]` counts the non-pad tokens (`<eos>`
included). `<sos>` is never stored: the decoder is given it. With e(a) = one_hot(a, V):

    s          = last layer's final state of gru_encoder over e(tokens[b, :lengths[b]])    # [B, D*H]
                 (bidirectional: [forward final (step lengths-1); backward final (started at lengths-1)])
    mu, logvar = fc_mu(s), fc_logvar(s)                                  # [B, Z] each
    z          = mu + exp(logvar / 2) * eps                              # [B, Z]
    h_{-1}     = tanh(latent_to_hidden(z)) as [B, Ld, Hd] -> [Ld, B, Hd] # layer l: columns l*Hd:(l+1)*Hd
    h_t        = gru_decoder([e(a_t); z if concat_z], h_{t-1});  logits_t = h2o(h_t)
    a_0 = <sos>; a_t = tokens[:, t-1] (teacher forcing) or the model's own choice from logits_{t-1}
    word dropout (`word_mask`, teacher forcing): e(a_t) = 0 (no token at all) where word_mask[:, t], t >= 1

H, L are the encoder's sizes; Hd, Ld the decoder's (`decoder_hidden_size`, `decoder_layers`; by default H, L).

Why it is fast. Layer 0 of the decoder reads a one-hot, and `e(a) @ W_ih` is exactly row `a` of `W_ih`
(one product by 1.0, the rest exact zeros), so the projection is a row gather `W_tok[a]`, never a one-hot
matmul; `z`'s share `z @ W_z + b_ih` does not change over time and is computed once. Every decoding mode
is `feedback_scan` (the project's one feedback driver) with three small rules:

    inject(fb, x_t)  = embed(fb) + (z @ W_z + b_ih)     embed: W_tok[fb] for a token id [B] (gather),
                                                               fb @ W_tok for a vector [B, V] (gumbel-softmax)
    readout(h, x_t)  = h2o(h)                           (teacher forcing: h; h2o then runs once on [T, B, H])
    feed(y, x_t)     = what step t+1 reads              teacher forcing: nothing (the inputs are in x_t);
                                                        scheduled sampling: where(coin, model's choice, truth);
                                                        free running: the model's choice

Teacher forcing feeds nothing back, so h2o runs once on all steps after the loop, and its input
projection may be hoisted too (`hoist_inputs`): one gather over [T, B] before the loop (feedback_scan's
`prepare`; per chunk under `remat_chunk`), or one [B]-row gather per step, which "auto" chooses on CPU
(`scan.auto_hoist`: the hoisted [T, B, 3H] array is slower to stream back than the gather is to redo).
Scheduled sampling and generation keep the fed-back gather, the recurrent matmuls and h2o inside the loop.
One scan runs all L layers per step (measured faster on CPU than L layer-by-layer scans for L = 3).
`generate` outputs token ids, never [B, T, V] logits or one-hots, so 10,000 latents decode in one call.
The encoder reads a real one-hot through `gru_encoder` (the spec, literally): with V ~ 40 its input matmul
is a few percent of the step, not worth a second code path in `layers.py`.

Randomness is explicit: `eps` (latent noise), `gumbel` (sampling noise), `replace_mask` (scheduled
sampling coins, one per token) and `word_mask` (word dropout coins, one per token) can all be passed in,
so torch can be fed the same draws. When `eps` or a needed `gumbel` is None, a key is taken from the
module's own stream `sample_rngs` (the constructor's `rngs["sample"]`, which falls back to its default
stream): `eps = normal(key, [B, Z])`; `decode`'s
`gumbel = gumbel(key, [B, T, V])`; `generate` draws step t's noise in the loop as
`gumbel(fold_in(key, t), [B, V])` (no [B, max_len, V] array). `replace_mask` and `word_mask` are always
the caller's (`replace_mask(key, tokens.shape, p)` draws either).

Checked inputs. `tokens` must be integer [B, T] with ids in [0, V), `lengths` integer [B] in 1..T. Shapes
and dtypes are always checked. The values are checked when they are concrete (an eager call), and by
`jsr.jit` when they are host data (NumPy, lists, torch tensors: `SeqVAE.check_arguments`): a bad id or
length raises ValueError naming the first bad entry. Under `jax.jit` (and a `jax.Array` through `jsr.jit`)
they are traced and cannot be checked, so: lengths are clipped to 0..T (as `jsr.GRU` does; 0 encodes
nothing, giving the initial state), which never produces NaN; token ids are not checked, and `loss` turns any id outside [0, V) into a NaN
`recon`/`total` (loud: training's non-finite guard stops), while `encode`/`decode` give meaningless
numbers. Run `check_tokens(tokens, lengths, vocab_size)` on concrete data before it reaches a jitted
call (the VAE task does, on every array it encodes).
"""
from __future__ import annotations

import functools
import inspect
from numbers import Real
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn import validate
from jax_scan_rnn.data.smiles import EOS, PAD, SOS  # the special token ids (docs/vae_spec.md)
from jax_scan_rnn.feedback import feedback_scan
from jax_scan_rnn.layers import GRU, Linear, check_host_lengths, check_lengths, own_stream_draw
from jax_scan_rnn.scan import Unroll, resolve_hoist, warns_when_called_eagerly

Array = jax.Array

DECODE_MODES = ("argmax", "sample", "gumbel_softmax")
GENERATE_MODES = ("greedy", "sample")
TOKEN_DTYPE = jnp.int32  # ids fed back and returned; fixed, whatever jax_enable_x64 says


def replace_mask(key: Array, shape: tuple[int, int], p: float | Array) -> Array:
    """Coins, one per token: bool `shape` ([B, T]), True w.p. `p`: scheduled sampling's `replace_mask` (True:
    feed the prediction) or word dropout's `word_mask` (True: feed no token)."""
    return jax.random.uniform(key, tuple(shape)) < validate.real_or_array("p", p, lo=0, hi=1)


def pad_after_eos(tokens: Array) -> Array:
    """tokens `[B, T]` with every position after a row's first `<eos>` set to `<pad>` (the `<eos>` kept)."""
    is_eos = (tokens == EOS).astype(jnp.int32)
    eos_before = jnp.cumsum(is_eos, axis=1) - is_eos  # number of <eos> strictly before each position
    return jnp.where(eos_before > 0, jnp.asarray(PAD, tokens.dtype), tokens)


def _check_token_array(tokens: Any, vocab_size: int) -> None:
    """An integer [B, T] array (B, T >= 1) of numpy or jax; its ids in [0, vocab_size) unless traced."""
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"tokens: expected an integer array of token ids, got dtype {tokens.dtype}")
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"tokens: expected shape [B, T] with B, T >= 1, got {list(tokens.shape)}")
    if isinstance(tokens, jax.core.Tracer):
        return
    ids = np.asarray(tokens)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        bad = (ids < 0) | (ids >= vocab_size)
        got = validate.first_bad("tokens", ids, bad, "ids")
        raise ValueError(f"tokens: expected ids in [0, vocab_size={vocab_size}), got {got}")


def check_tokens(tokens: Any, lengths: Any, vocab_size: int) -> None:
    """Check a concrete batch (numpy or jax arrays) before it reaches a jitted `SeqVAE` call.

    Under `jit` the model cannot see the values of its `tokens` and `lengths` (see the module docstring);
    this checks them where they are still concrete, with the messages of an eager call: tokens integer
    [B, T] (B, T >= 1) with ids in [0, vocab_size), and, unless `lengths` is None, lengths integer [B]
    in 1..T. Works on numpy without moving the data to a device, so a whole encoded dataset can be checked
    once. Raises ValueError naming the first bad entry (position and value), TypeError for a wrong dtype or
    for a traced array (there is nothing to check inside `jit`).
    """
    vocab_size = validate.integer("vocab_size", vocab_size, lo=1)
    for name, value in (("tokens", tokens), ("lengths", lengths)):
        if isinstance(value, jax.core.Tracer):
            raise TypeError(f"{name}: expected concrete values (call check_tokens outside jit), got a traced array")
    tokens = np.asarray(tokens)
    _check_token_array(tokens, vocab_size)
    if lengths is not None:
        check_lengths(lengths, *tokens.shape)


@functools.cache
def _signature(method: str) -> inspect.Signature:
    """`SeqVAE.method`'s signature, to find its `tokens` and `lengths` among a call's arguments."""
    return inspect.signature(getattr(SeqVAE, method))


def _check_scalar(name: str, value: Any, **bounds) -> None:
    """A Python number is checked against `bounds` (`validate.real`'s; under `jsr.jit` Python numbers stay
    concrete); an array (perhaps traced, e.g. an annealed beta) must be a scalar, its value unchecked."""
    if not isinstance(validate.real_or_array(name, value, **bounds), Real) and jnp.ndim(value) != 0:
        raise ValueError(f"{name}: expected a scalar, got shape {tuple(jnp.shape(value))}")


def _check_mask(name: str, mask: Any, batch: int, steps: int) -> Array:
    """A bool [B, T] array (`replace_mask`, `word_mask`): TypeError for another dtype, ValueError for a shape."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"{name}: expected a bool array or None, got dtype {mask.dtype}")
    validate.shape(name, mask, (batch, steps), "[B, T]")
    return mask


def _as_float(name: str, x: Any, expected: tuple[int | None, ...], symbols: str, dtype) -> Array:
    """A floating array of the expected shape, cast to the model's compute dtype `dtype`."""
    x = validate.floating_array(name, x)
    validate.shape(name, x, expected, symbols)
    return x.astype(dtype)


class SeqVAE(nnx.Module):
    """GRU sequence VAE: tokens [B, T] -> latent [B, Z] -> logits [B, T, V] (see the module docstring).

    Args:
      vocab_size: V, number of token ids, the specials PAD, SOS, EOS = 0, 1, 2 included (V >= 3).
      hidden_size: H of every encoder GRU layer (and of the decoder's unless `decoder_hidden_size`).
      latent_size: Z.
      num_layers: L, stacked GRU layers in the encoder (and in the decoder unless `decoder_layers`).
      decoder_hidden_size: Hd of every decoder GRU layer; None: H.
      decoder_layers: Ld, stacked GRU layers in the decoder; None: L.
      bidirectional: bidirectional encoder (the decoder is always forward).
      concat_z: append z to the decoder's input at every step, besides initialising its state from z.
      param_dtype: parameter dtype; all computation runs in it (float arguments are cast to it).
      compute_dtype: None, or the GRU matmuls' operand dtype (`jnp.bfloat16`); states, gates and sums
        stay in `param_dtype` (see `cells.RNNCellBase.matmul`).
      unroll: `lax.scan` unroll factor of both GRUs and of the feedback loop, or "auto" (measured per
        batch size, and for training or not: `scan.auto_unroll`).
      remat_chunk: None, or rematerialise the time loops in chunks of this many steps when training
        (memory ~T/c + c instead of ~T; see `scan.time_scan`).
      hoist_inputs: both GRUs' and teacher forcing's input projections for all steps before the loop
        (True), inside each step (False), or "auto": per backend (`scan.auto_hoist`: inside on CPU).
      rngs: `nnx.Rngs`: `params` for the initialisation (torch's), `sample` (or its default stream) for
        `eps`/`gumbel` not passed in, and `dropout` for its GRUs' (held even without dropout); `nnx.Rngs(0)`
        has every stream.

    Attributes (the torch twin's state_dict prefixes); D = 2 if bidirectional else 1:
      gru_encoder: `GRU(V, H, L, batch_first=True, bidirectional=bidirectional)`, reads one-hot [B, T, V].
      fc_mu, fc_logvar: `Linear(D*H, Z)`.
      latent_to_hidden: `Linear(Z, Ld*Hd)`; the decoder's layer l starts at `tanh` of columns l*Hd:(l+1)*Hd.
      gru_decoder: `GRU(V + (Z if concat_z else 0), Hd, Ld, batch_first=True)`; `w_ih` rows 0..V-1 read the
        token, V.. read z.
      h2o: `Linear(Hd, V)`, hidden state to vocabulary logits.
      hidden_size, num_layers, decoder_hidden_size, decoder_layers: H, L, Hd, Ld (the last two resolved).
      sample_rngs: the rng stream for noise that is not passed in (not a parameter).

    `model(tokens, lengths, ...)` is `model.loss(tokens, lengths, ...)`.
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
        param_dtype=jnp.float32,
        compute_dtype=None,
        unroll: Unroll = "auto",
        remat_chunk: int | None = None,
        hoist_inputs: bool | Literal["auto"] = "auto",
        rngs: nnx.Rngs,
    ):
        validate.integer("vocab_size", vocab_size, lo=3)  # room for PAD, SOS, EOS
        validate.integer("hidden_size", hidden_size, lo=1)
        validate.integer("latent_size", latent_size, lo=1)
        validate.integer("num_layers", num_layers, lo=1)
        validate.integer("decoder_hidden_size", decoder_hidden_size, lo=1, none=True)
        validate.integer("decoder_layers", decoder_layers, lo=1, none=True)
        param_dtype = validate.model_dtype("param_dtype", param_dtype)
        compute_dtype = validate.model_dtype("compute_dtype", compute_dtype, none=True)  # here, not per layer
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.latent_size = latent_size
        self.num_layers = num_layers
        self.decoder_hidden_size = hidden_size if decoder_hidden_size is None else decoder_hidden_size
        self.decoder_layers = num_layers if decoder_layers is None else decoder_layers
        self.bidirectional = validate.boolean("bidirectional", bidirectional)
        self.concat_z = validate.boolean("concat_z", concat_z)
        directions = 2 if bidirectional else 1
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        rnn = dict(
            compute_dtype=compute_dtype, unroll=unroll, remat_chunk=remat_chunk, hoist_inputs=hoist_inputs, **kw
        )

        self.gru_encoder = GRU(
            vocab_size, hidden_size, num_layers, batch_first=True, bidirectional=self.bidirectional, **rnn
        )
        self.fc_mu = Linear(directions * hidden_size, latent_size, **kw)
        self.fc_logvar = Linear(directions * hidden_size, latent_size, **kw)
        self.latent_to_hidden = Linear(latent_size, self.decoder_layers * self.decoder_hidden_size, **kw)
        decoder_input = vocab_size + (latent_size if self.concat_z else 0)
        self.gru_decoder = GRU(decoder_input, self.decoder_hidden_size, self.decoder_layers, batch_first=True, **rnn)
        self.h2o = Linear(self.decoder_hidden_size, vocab_size, **kw)
        self.sample_rngs = rngs["sample"].fork()

    @property
    def dtype(self):
        """The parameters' dtype, in which everything is computed."""
        return self.h2o.kernel[...].dtype

    @warns_when_called_eagerly()
    def encode(self, tokens: validate.ArrayInput, lengths: validate.ArrayInput) -> tuple[Array, Array]:
        """tokens [B, T] (int), lengths [B] (int) -> (mu [B, Z], logvar [B, Z]).

        The encoder reads `one_hot(tokens)` [B, T, V] with `lengths` honoured (no state comes from steps
        at or beyond `lengths`); its summary is the last layer's final state (forward: at step
        lengths-1; bidirectional: `[forward final; backward final]`, the backward pass started at step
        lengths-1), as torch's packed `h_n[-1]` / `[h_n[-2]; h_n[-1]]`.

        Checks: the module docstring's "Checked inputs"; under `jit`, a length of 0 reads nothing and an id
        outside [0, V) reads as an all-zero one-hot.
        """
        tokens = self._check_tokens(tokens)
        lengths = check_lengths(lengths, *tokens.shape)  # jsr.GRU's rule: concrete checked, traced clipped
        x = jax.nn.one_hot(tokens, self.vocab_size, dtype=self.dtype)  # [B, T, V]
        _, h_n = self.gru_encoder(x, lengths=lengths)  # [L*D, B, H]
        summary = jnp.concatenate([h_n[-2], h_n[-1]], axis=-1) if self.bidirectional else h_n[-1]
        return self.fc_mu(summary), self.fc_logvar(summary)

    def reparameterize(self, mu: Array, logvar: Array, eps: Array | None = None) -> Array:
        """z = mu + exp(logvar / 2) * eps: [B, Z]. eps [B, Z] ~ N(0, I) from `sample_rngs` when None.

        Always samples: pass `eps=jnp.zeros_like(mu)` to decode the mean.
        """
        dt = self.dtype
        mu = _as_float("mu", mu, (None, self.latent_size), "[B, Z]", dt)
        logvar = _as_float("logvar", logvar, tuple(mu.shape), "[B, Z]", dt)
        if eps is None:
            eps = jax.random.normal(own_stream_draw("eps", self.sample_rngs, "pass eps"), mu.shape, dt)
        eps = _as_float("eps", eps, tuple(mu.shape), "[B, Z]", dt)
        return mu + jnp.exp(0.5 * logvar) * eps

    def initial_hidden(self, z: Array) -> Array:
        """The decoder's initial state from z [B, Z]: tanh(latent_to_hidden(z)) [B, Ld*Hd] -> [Ld, B, Hd]."""
        z = self._check_z(z)
        h0 = jnp.tanh(self.latent_to_hidden(z))  # [B, Ld*Hd]
        return jnp.swapaxes(h0.reshape(z.shape[0], self.decoder_layers, self.decoder_hidden_size), 0, 1)

    def _decoder(self, z: Array, *, unknown: bool = False):
        """The decoder started from z [B, Z], as `run(feedback, xs, *, readout, feed, remat=True,
        hoisted=False) -> ys`: `feedback_scan` whose layer-0 input is `project(a) = embed(a) + (z @ W_z +
        b_ih)` of the fed value a (hoisted: of the token ids `xs` [T, B], all steps before the loop).

        `unknown`: the id V is fed as no token at all (word dropout's all-zero one-hot, as
        `jax.nn.one_hot(V, V)` is): its row of the gathered weights is zeros, so `project(V) = z @ W_z + b_ih`.
        """
        decoder = self.gru_decoder
        first = decoder.layers[0]
        dt = z.dtype
        w_ih = first.w_ih[...]  # [V (+ Z), 3Hd]
        w_tok = w_ih[: self.vocab_size]
        base = first.b_ih[...].astype(dt)
        if self.concat_z:
            base = first.matmul(z, w_ih[self.vocab_size :]) + base  # [B, 3Hd], hoisted out of the loop
        rows = w_tok.astype(first.compute_dtype or dt).astype(dt)  # what a one-hot matmul would read
        if unknown:  # only then: the default path's gather stays exactly as it was
            rows = jnp.concatenate([rows, jnp.zeros((1, rows.shape[1]), dt)])  # [V + 1, 3Hd]

        def project(fb: Array) -> Array:
            # A token id selects its row (= one_hot(fb) @ w_tok, bit for bit); a vector [B, V]
            # (straight-through gumbel-softmax) is multiplied.
            return (rows[fb] if jnp.issubdtype(fb.dtype, jnp.integer) else first.matmul(fb, w_tok)) + base

        carries = decoder.unstack_state(self.initial_hidden(z))

        def run(feedback, xs, *, readout, feed, remat: bool = True, hoisted: bool = False):
            rules = dict(prepare=project, inject=lambda _, xp_t: xp_t) if hoisted else dict(
                inject=lambda fb, _: project(fb)
            )
            _, _, ys = feedback_scan(
                decoder, carries, feedback, xs, readout=readout, feed=feed, **rules,
                unroll=decoder.scan_unroll(None, z.shape[0]), remat_chunk=decoder.remat_chunk if remat else None,
            )
            return ys

        return run

    @warns_when_called_eagerly()
    def decode(
        self,
        z: validate.ArrayInput,
        tokens: validate.ArrayInput,
        *,
        replace_mask: validate.ArrayInput | None = None,
        word_mask: validate.ArrayInput | None = None,
        mode: str = "argmax",
        gumbel: validate.ArrayInput | None = None,
        temperature: float | Array = 1.0,
        tau: float | Array = 1.0,
    ) -> Array:
        """Decode z [B, Z] against tokens [B, T] (int): -> logits [B, T, V], logits_t predicting tokens[:, t].

        Step t is fed a_0 = <sos>, then:
        - `replace_mask=None`, teacher forcing: a_t = tokens[:, t-1]; with `hoist_inputs` (not "auto"'s choice
          on CPU) the input projection of all steps is one gather before the scan. `word_mask` bool [B, T] (word
          dropout, Bowman et al. 2016; column 0 is ignored: <sos> is always read): where word_mask[:, t], step t
          reads no token, e(a_t) = 0 (the decoder still reads z when concat_z, and its state). Draw it with
          `replace_mask(key, shape, p)`.
        - `replace_mask` bool [B, T], scheduled sampling (one coin per token; column 0 is ignored):
          a_t = pred_{t-1} where replace_mask[:, t], else tokens[:, t-1]. pred_{t-1} from logits_{t-1}:
            "argmax"          argmax(logits_{t-1}) (ties: lowest index);
            "sample"          argmax(logits_{t-1} / temperature + gumbel[:, t-1]) (Gumbel-max sampling);
            "gumbel_softmax"  differentiable straight-through vector fed in place of the one-hot:
                              y_soft = softmax((logits_{t-1} + gumbel[:, t-1]) / tau),
                              y_hard = one_hot(argmax(y_soft)), fed y_hard + y_soft - stop_gradient(y_soft)
                              (replaced positions only; the others are fed the true token's one-hot).
        `gumbel` [B, T, V]: standard Gumbel noise (its last step is unused), drawn from `sample_rngs` when
        None and the mode needs it. Under teacher forcing `mode`, `gumbel`, `temperature`, `tau` are
        checked but unused; `temperature` is used by "sample" only, `tau` by "gumbel_softmax" only.

        `word_mask` with `replace_mask` raises ValueError: word dropout is defined on teacher forcing.

        Checks: the module docstring's "Checked inputs"; under `jit`, ids outside [0, V) give meaningless logits.
        """
        tokens = self._check_tokens(tokens)
        batch, steps = tokens.shape
        z = self._check_z(z, batch)
        if word_mask is not None:
            if replace_mask is not None:
                raise ValueError("word_mask: expected None with a replace_mask (word dropout is defined on teacher "
                                 "forcing, not on scheduled sampling), got a mask")
            word_mask = _check_mask("word_mask", word_mask, batch, steps)
        validate.choice("mode", mode, DECODE_MODES)
        _check_scalar("temperature", temperature, lo=0, lo_open=True)
        _check_scalar("tau", tau, lo=0, lo_open=True)
        dt = self.dtype
        if gumbel is not None:
            gumbel = _as_float("gumbel", gumbel, (batch, steps, self.vocab_size), "[B, T, V]", dt)
        run_decoder = self._decoder(z, unknown=word_mask is not None)
        truth = jnp.swapaxes(tokens, 0, 1).astype(TOKEN_DTYPE)  # [T, B]; truth[t] is fed to step t+1

        if replace_mask is None:  # teacher forcing: every input known up front, h2o after the loop
            if word_mask is not None:  # truth[t] is dropped where word_mask[:, t+1]: fed as the id V (no token)
                dropped = jnp.concatenate([word_mask[:, 1:], jnp.zeros((batch, 1), bool)], axis=1).T  # [T, B]
                truth = jnp.where(dropped, jnp.asarray(self.vocab_size, TOKEN_DTYPE), truth)
            if resolve_hoist(self.gru_decoder.hoist_inputs):  # all steps' layer-0 projections, one gather
                inputs = jnp.concatenate([jnp.full((1, batch), SOS, TOKEN_DTYPE), truth[:-1]])  # [T, B]
                hs = run_decoder(None, inputs, readout=lambda h, _: h,
                                 feed=lambda _y, _x: None, hoisted=True)  # [T, B, 3Hd] before the loop
            else:  # the true token is "fed back": step t reads a_t = truth[t-1] from the carry, faster
                # on CPU than scanning the tokens (docs/measurements.md#vae-teacher-forcing-feed)
                hs = run_decoder(jnp.full((batch,), SOS, TOKEN_DTYPE), truth,
                                 readout=lambda h, _: h, feed=lambda _y, truth_t: truth_t)
            return self.h2o(jnp.swapaxes(hs, 0, 1))  # [B, T, V]: one matmul for all steps

        replace_mask = _check_mask("replace_mask", replace_mask, batch, steps)
        if gumbel is None and mode != "argmax":
            key = own_stream_draw("gumbel", self.sample_rngs, "pass gumbel")
            gumbel = jax.random.gumbel(key, (batch, steps, self.vocab_size), dt)
        # Step t's feed decides a_{t+1}: it reads truth[t], the coin replace_mask[:, t+1] and gumbel[:, t].
        coins = jnp.concatenate([replace_mask[:, 1:], jnp.zeros((batch, 1), bool)], axis=1).T  # [T, B]
        noise = None if mode == "argmax" else jnp.swapaxes(gumbel, 0, 1)  # [T, B, V]

        if mode == "gumbel_softmax":
            first = jax.nn.one_hot(jnp.full((batch,), SOS), self.vocab_size, dtype=dt)  # a vector [B, V]

            def feed(logits, x_t):
                truth_t, coin_t, g_t = x_t
                y_soft = jax.nn.softmax((logits + g_t) / tau, axis=-1)
                y_hard = jax.nn.one_hot(jnp.argmax(y_soft, axis=-1), self.vocab_size, dtype=dt)
                straight_through = y_hard + y_soft - jax.lax.stop_gradient(y_soft)
                teacher = jax.nn.one_hot(truth_t, self.vocab_size, dtype=dt)
                return jnp.where(coin_t[:, None], straight_through, teacher)

        else:
            first = jnp.full((batch,), SOS, TOKEN_DTYPE)  # a token id [B]

            def feed(logits, x_t):
                truth_t, coin_t, g_t = x_t
                scores = logits if mode == "argmax" else logits / temperature + g_t
                return jnp.where(coin_t, jnp.argmax(scores, axis=-1).astype(TOKEN_DTYPE), truth_t)

        xs = (truth, coins, noise)
        logits = run_decoder(first, xs, readout=lambda h, _: self.h2o(h), feed=feed)
        return jnp.swapaxes(logits, 0, 1)  # [B, T, V]

    @warns_when_called_eagerly()
    def loss(
        self,
        tokens: validate.ArrayInput,
        lengths: validate.ArrayInput,
        *,
        beta: float | Array = 1.0,
        free_bits: float | Array = 0.0,
        eps: validate.ArrayInput | None = None,
        z: validate.ArrayInput | None = None,
        replace_mask: validate.ArrayInput | None = None,
        word_mask: validate.ArrayInput | None = None,
        mode: str = "argmax",
        gumbel: validate.ArrayInput | None = None,
        temperature: float | Array = 1.0,
        tau: float | Array = 1.0,
    ) -> dict[str, Array]:
        """Encode, sample z (with `eps`), decode (the decoder options go to `decode`), and score.

        `z` [B, Z] given: decode from it instead, with no encoder and no KL (0): zeros make the decoder alone
        a CharRNN (a language model with a learned start state `tanh(latent_to_hidden.bias)`), the baseline
        that tells an undertrained decoder from a latent space with holes.

        `beta` and `free_bits` may be traced scalars (annealing schedules under jit). Returns:
          recon       scalar: sum over t and positions with tokens != <pad> of
                      cross_entropy(logits[:, t], tokens[:, t]), divided by B (per-sequence sum, batch mean);
          kl_per_dim  [Z]: batch mean of -0.5 * (1 + logvar - mu^2 - exp(logvar));
          kl          scalar: sum(kl_per_dim) if free_bits == 0, else sum(max(kl_per_dim, free_bits))
                      (free bits, Kingma et al. 2016, on the batch-averaged per-dimension KL);
          total       scalar: recon + beta * kl.

        Checks: the module docstring's "Checked inputs"; under `jit`, any id outside [0, V) makes `recon`
        and `total` NaN, so training stops at that step rather than learn from it.
        """
        _check_scalar("beta", beta, lo=0)
        _check_scalar("free_bits", free_bits, lo=0)
        tokens = self._check_tokens(tokens)
        if z is None:
            mu, logvar = self.encode(tokens, lengths)
            z = self.reparameterize(mu, logvar, eps)
        else:
            z = self._check_z(z, tokens.shape[0])
            mu = logvar = jnp.zeros_like(z)  # no posterior: KL(N(0, 1) || N(0, 1)) = 0 in every dimension
        logits = self.decode(z, tokens, replace_mask=replace_mask, word_mask=word_mask, mode=mode, gumbel=gumbel,
                             temperature=temperature, tau=tau)
        log_probs = jax.nn.log_softmax(logits, axis=-1)  # [B, T, V]
        target = jnp.take_along_axis(log_probs, tokens[..., None].astype(TOKEN_DTYPE), axis=-1)[..., 0]
        recon = -jnp.sum(jnp.where(tokens != PAD, target, 0.0)) / tokens.shape[0]
        if isinstance(tokens, jax.core.Tracer):  # unchecked ids: a NaN loss (loud) rather than a plausible number
            out_of_range = jnp.any((tokens < 0) | (tokens >= self.vocab_size))
            recon = jnp.where(out_of_range, jnp.asarray(jnp.nan, recon.dtype), recon)
        kl_per_dim = jnp.mean(-0.5 * (1.0 + logvar - mu**2 - jnp.exp(logvar)), axis=0)  # [Z]
        clamped = jnp.sum(jnp.maximum(kl_per_dim, free_bits))
        if isinstance(free_bits, (int, float)):
            kl = jnp.sum(kl_per_dim) if free_bits == 0 else clamped
        else:
            kl = jnp.where(free_bits > 0, clamped, jnp.sum(kl_per_dim))
        return {"total": recon + beta * kl, "recon": recon, "kl": kl, "kl_per_dim": kl_per_dim}

    @warns_when_called_eagerly()
    def __call__(self, tokens: validate.ArrayInput, lengths: validate.ArrayInput, **loss_kwargs) -> dict[str, Array]:
        """`self.loss(tokens, lengths, **loss_kwargs)`."""
        return self.loss(tokens, lengths, **loss_kwargs)

    @warns_when_called_eagerly()
    def generate(
        self,
        z: validate.ArrayInput,
        max_len: int,
        *,
        mode: str = "greedy",
        temperature: float | Array = 1.0,
        top_k: int = 0,
        gumbel: validate.ArrayInput | None = None,
    ) -> Array:
        """Free-running generation from z [B, Z]: -> tokens [B, max_len] (int32). Jit-able; no gradient.

        a_0 = <sos>; next_t = argmax(logits_t) ("greedy"), or ("sample") argmax(logits_t / temperature +
        gumbel[:, t]) after setting, when top_k > 0, every logit below its row's k-th largest to -inf;
        a_{t+1} = next_t. Output next_t, with every position after a row's first <eos> set to <pad> (the
        loop runs all max_len steps). `gumbel` [B, max_len, V]; when None under "sample", step t's noise
        is `gumbel(fold_in(key, t), [B, V])` with one key from `sample_rngs`. "greedy" ignores
        `temperature`, `top_k` and `gumbel` (checked when given). `max_len` and `top_k` are static.
        """
        z = self._check_z(z)
        batch = z.shape[0]
        validate.integer("max_len", max_len, lo=1)
        validate.choice("mode", mode, GENERATE_MODES)
        _check_scalar("temperature", temperature, lo=0, lo_open=True)
        validate.integer("top_k", top_k, lo=0, hi=self.vocab_size)  # 0: off
        dt = self.dtype
        if gumbel is not None:
            gumbel = _as_float("gumbel", gumbel, (batch, max_len, self.vocab_size), "[B, max_len, V]", dt)
        z = jax.lax.stop_gradient(z)
        run_decoder = self._decoder(z)

        if mode == "greedy":
            xs = jnp.arange(max_len)  # only the length matters
        elif gumbel is not None:
            xs = jnp.swapaxes(gumbel, 0, 1)  # [max_len, B, V]
        else:
            key = own_stream_draw("gumbel", self.sample_rngs, "pass gumbel")
            xs = jax.vmap(lambda t: jax.random.fold_in(key, t))(jnp.arange(max_len))  # one key per step

        def choose(h, x_t):
            logits = self.h2o(h)  # [B, V]
            if mode == "greedy":
                return jnp.argmax(logits, axis=-1).astype(TOKEN_DTYPE)
            noise = x_t if gumbel is not None else jax.random.gumbel(x_t, logits.shape, dt)
            if top_k > 0:
                kth_largest = jax.lax.top_k(logits, top_k)[0][..., -1:]
                logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
            return jnp.argmax(logits / temperature + noise, axis=-1).astype(TOKEN_DTYPE)

        first = jnp.full((batch,), SOS, TOKEN_DTYPE)
        chosen = run_decoder(first, xs, readout=choose, feed=lambda next_t, _: next_t, remat=False)
        return pad_after_eos(jnp.swapaxes(chosen, 0, 1))  # [B, max_len]

    def check_arguments(self, method: str, args: tuple, kwargs: dict) -> None:
        """What `jsr.jit` checks before an `encode`, `decode` or `loss` call (and `model(...)`, which is `loss`),
        which the traced call cannot: host `tokens` (ids in [0, V)) and `lengths` (in 1..T), NumPy, lists or torch
        tensors, with an eager call's errors. A `jax.Array` is left to the call (as under `jax.jit`; module
        docstring): reading it back would wait for the device."""
        if method not in ("encode", "decode", "loss", "__call__"):  # `__call__` is `loss`
            return
        given = _signature(method).bind(self, *args, **kwargs).arguments
        tokens, lengths = given.get("tokens"), given.get("lengths")
        if tokens is None or np.ndim(tokens) != 2:  # the call raises its own error
            return
        if not isinstance(tokens, jax.Array):
            _check_token_array(validate.host_array(tokens), self.vocab_size)
        if lengths is not None and not isinstance(lengths, jax.Array):
            check_host_lengths(lengths, *np.shape(tokens))

    def _check_tokens(self, tokens: Any) -> Array:
        try:
            tokens = jnp.asarray(tokens)
        except (TypeError, ValueError):  # None, a string: JAX's own message names no argument
            raise TypeError(f"tokens: expected an integer array of token ids, got {type(tokens).__name__}") from None
        _check_token_array(tokens, self.vocab_size)
        return tokens

    def _check_z(self, z: Any, batch: int | None = None) -> Array:
        """z must be a floating [B, Z] (B = `batch` when given); returned in the parameters' dtype."""
        return _as_float("z", z, (batch, self.latent_size), "[B, Z]", self.dtype)
