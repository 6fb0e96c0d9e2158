"""jsr.SeqVAE against torch_ref.SeqVAE (docs/vae_spec.md) with the same weights and the same draws.

Weights move only through `jsr.load_torch_state_dict` / `jsr.torch_state_dict`; the noise (`eps`,
`gumbel`) and the coins (`replace_mask`, `word_mask`) are drawn once in numpy and given to both.
Covered: the encoder (uni- and bidirectional, with lengths), teacher-forced logits and loss, scheduled
sampling (argmax, sample, gumbel-softmax) logits and loss, word dropout (`word_mask`), greedy and sampled
generation token for token, the ELBO's gradient for every parameter, a decoder of its own size
(`decoder_hidden_size`, `decoder_layers`), and 20 Adam steps; float32 and float64.

Scheduled sampling and generation feed back argmax decisions: one flipped decision would change every
later step, so token-identical agreement over the whole sequence is a strong check (the weights are
drawn wide enough that no decision here is a near tie in float32).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import jax_scan_rnn as jsr
from parity_tests.compare import assert_close, assert_grads_close, assert_steps_close, atol_for, grad_rtol_for
from torch_ref.vae import EOS, PAD, SOS, SeqVAE as TorchSeqVAE

DTYPES = {"float32": (jnp.float32, torch.float32), "float64": (jnp.float64, torch.float64)}
# Loss values are sums of ~40 cross-entropies of size ~2 (plus the KL), so they are compared relative to
# their size: float32 rounds each term at ~6e-8, float64 at ~1e-16.
LOSS_RTOL = {"float32": 1e-5, "float64": 1e-12}
# 20 Adam steps: Adam divides by sqrt(v), which amplifies rounding differences in the first steps, where v
# is tiny; 1e-4 (float32) on parameters of size ~0.5 still catches any wrong gradient or update rule.
TRAJECTORY_ATOL = {"float32": 1e-4, "float64": 1e-10}

# Both ways of computing the GRUs' and teacher forcing's input projections (`hoist_inputs`): before the
# loop (the GPU default) and inside each step (the CPU default).
HOIST = (True, False)

V, H, Z, L = 12, 16, 4, 2  # vocabulary (specials included), hidden, latent, layers
# A decoder of its own size: H_enc=8, L_enc=1 against H_dec=12, L_dec=2 (every size differs from the others).
MIXED = dict(hidden_size=8, num_layers=1, decoder_hidden_size=12, decoder_layers=2)
B, T = 6, 10
LENGTHS = [10, 1, 4, 7, 2, 9]  # the full T, a lone <eos>, and everything in between


def make_pair(dtype: str, *, bidirectional=False, concat_z=False, seed=0, hoist_inputs="auto", **sizes):
    """torch_ref.SeqVAE with wide random weights and non-zero biases, and jsr.SeqVAE loaded from it.

    `sizes`: the constructors' size arguments (hidden_size, num_layers, decoder_*), by default H and L."""
    jdt, tdt = DTYPES[dtype]
    sizes = dict(hidden_size=H, num_layers=L) | sizes
    torch.manual_seed(seed)
    ref = TorchSeqVAE(V, latent_size=Z, bidirectional=bidirectional, concat_z=concat_z, **sizes).to(tdt)
    with torch.no_grad():
        for p in ref.parameters():
            p.uniform_(-0.5, 0.5)
    # Built abstractly with zero placeholders: jax's own initial values would be overwritten, and computing
    # them compiles one random kernel per parameter shape (seconds per model). Then every parameter is
    # loaded through convert, as in the real use.
    ours = nnx.eval_shape(
        lambda: jsr.SeqVAE(
            V, latent_size=Z, bidirectional=bidirectional, concat_z=concat_z, param_dtype=jdt,
            hoist_inputs=hoist_inputs, rngs=nnx.Rngs(0), **sizes,
        )
    )
    for _, variable in nnx.iter_graph(ours):
        if isinstance(variable, nnx.Param):
            variable.set_value(jnp.full(variable.get_value().shape, jnp.nan, jdt))  # any value left over shows
        elif isinstance(variable, nnx.RngKey):
            variable.set_value(jax.random.key(seed))  # the sample stream (unused: every draw is given)
        elif isinstance(variable, nnx.RngCount):
            variable.set_value(jnp.zeros((), jnp.uint32))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    return ref, ours


def make_batch(seed=1):
    """tokens [B, T] (vocabulary ids >= 3, <eos> at lengths-1, then <pad>) and lengths [B], as numpy."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(LENGTHS)
    tokens = rng.integers(3, V, (B, T))
    position = np.arange(T)
    tokens[position == lengths[:, None] - 1] = EOS
    tokens[position >= lengths[:, None]] = PAD
    return tokens, lengths


def draws(dtype: str, seed=2, steps=T, batch=B):
    """Shared noise: eps [B, Z], gumbel [B, steps, V], replace_mask [B, steps] (p = 0.5), as numpy."""
    rng = np.random.default_rng(seed)
    eps = rng.standard_normal((batch, Z)).astype(dtype)
    gumbel = rng.gumbel(size=(batch, steps, V)).astype(dtype)
    mask = rng.random((batch, steps)) < 0.5
    return eps, gumbel, mask


def to_torch(*arrays):
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def to_jax(*arrays):
    return [jnp.asarray(a) for a in arrays]


def loss_kwargs(dtype, case: str, *, torch_side: bool):
    """The decoder options of one case: teacher forcing, or scheduled sampling in one mode, shared draws."""
    eps, gumbel, mask = draws(dtype)
    conv = to_torch if torch_side else to_jax
    (eps,) = conv(eps)
    if case == "teacher":
        return dict(eps=eps)
    gumbel, mask = conv(gumbel, mask)
    mode = case.removeprefix("ss_")
    return dict(eps=eps, replace_mask=mask, mode=mode, gumbel=gumbel, temperature=0.8, tau=0.7)


@functools.partial(nnx.jit, static_argnames=("mode",))
def jax_loss_and_grads(model, tokens, lengths, eps, replace_mask, gumbel, *, mode, beta, free_bits, temperature, tau):
    def total(m):
        out = m.loss(
            tokens, lengths, beta=beta, free_bits=free_bits, eps=eps, replace_mask=replace_mask, mode=mode,
            gumbel=gumbel, temperature=temperature, tau=tau,
        )
        return out["total"], out

    (_, out), grads = nnx.value_and_grad(total, has_aux=True)(model)
    return out, grads


def jax_elbo(model, tokens, lengths, kw, beta=0.5, free_bits=0.0):
    """(loss dict, {torch key: gradient}) of the jax model, jitted."""
    out, grads = jax_loss_and_grads(
        model, tokens, lengths, kw["eps"], kw.get("replace_mask"), kw.get("gumbel"), mode=kw.get("mode", "argmax"),
        beta=beta, free_bits=free_bits, temperature=kw.get("temperature", 1.0), tau=kw.get("tau", 1.0),
    )
    holder = nnx.clone(model)
    nnx.update(holder, grads)
    return out, jsr.torch_state_dict(holder)


def torch_elbo(model, tokens, lengths, kw, beta=0.5, free_bits=0.0):
    model.zero_grad()
    out = model.loss(tokens, lengths, beta=beta, free_bits=free_bits, **kw)
    out["total"].backward()
    return out, {k: p.grad.clone() for k, p in model.named_parameters()}


def assert_losses_close(context: str, got: dict, want: dict, dtype: str) -> None:
    for key in ("total", "recon", "kl"):
        g, w = float(got[key]), float(want[key].detach())
        assert abs(g - w) <= LOSS_RTOL[dtype] * max(1.0, abs(w)), (
            f"{context}: loss[{key!r}] {g!r} (jax) vs {w!r} (torch), rtol {LOSS_RTOL[dtype]:.0e}"
        )
    assert_close(f"{context}: loss['kl_per_dim']", got["kl_per_dim"], want["kl_per_dim"], atol_for(DTYPES[dtype][0]))


# ----------------------------------------------------------------------------------------------------
# Layout and encoder
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional, concat_z, sizes", [(False, False, {}), (True, True, {}), (True, True, MIXED)])
def test_state_dict_keys_match_and_round_trip(bidirectional, concat_z, sizes):
    ref, ours = make_pair("float64", bidirectional=bidirectional, concat_z=concat_z, **sizes)
    ours_sd = jsr.torch_state_dict(ours)
    differ = sorted(set(ours_sd) ^ set(ref.state_dict()))
    assert not differ, f"state_dict keys differ: {differ}"
    wrong = {k: (v.shape, tuple(ref.state_dict()[k].shape)) for k, v in ours_sd.items()
             if v.shape != tuple(ref.state_dict()[k].shape)}
    assert not wrong, f"state_dict shapes differ (jax, torch): {wrong}"
    sizes = dict(hidden_size=H, num_layers=L) | sizes
    back = TorchSeqVAE(V, latent_size=Z, bidirectional=bidirectional, concat_z=concat_z, **sizes).double()
    back.load_state_dict({k: torch.from_numpy(v) for k, v in ours_sd.items()}, strict=True)
    for key, value in ref.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), f"round trip changed {key}"


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_encoder_mu_and_logvar_with_lengths(bidirectional, dtype, hoist):
    ref, ours = make_pair(dtype, bidirectional=bidirectional, hoist_inputs=hoist)
    tokens, lengths = make_batch()
    with torch.no_grad():
        t_mu, t_logvar = ref.encode(*to_torch(tokens, lengths))
    j_mu, j_logvar = ours.encode(*to_jax(tokens, lengths))
    atol = atol_for(DTYPES[dtype][0])
    label = f"bidirectional={bidirectional}, hoist_inputs={hoist}, {dtype}"
    assert_close(f"mu ({label})", j_mu, t_mu, atol)
    assert_close(f"logvar ({label})", j_logvar, t_logvar, atol)


# ----------------------------------------------------------------------------------------------------
# Decoder logits and losses
# ----------------------------------------------------------------------------------------------------


@functools.partial(nnx.jit, static_argnames=("mode",))
def jax_decode(model, z, tokens, replace_mask, gumbel, word_mask=None, *, mode, temperature, tau):
    kw = dict(replace_mask=replace_mask, mode=mode, gumbel=gumbel, temperature=temperature, tau=tau)
    return model.decode(z, tokens, word_mask=word_mask, **kw)


CASES = ["teacher", "ss_argmax", "ss_sample", "ss_gumbel_softmax"]


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_decoder_logits_every_step(case, dtype, hoist):
    """Teacher forcing, and scheduled sampling with a shared mask (and shared gumbel noise)."""
    concat_z = case in ("teacher", "ss_sample")  # both decoder inputs layouts, spread over the cases
    ref, ours = make_pair(dtype, concat_z=concat_z, hoist_inputs=hoist)
    tokens, lengths = make_batch()
    t_kw, j_kw = loss_kwargs(dtype, case, torch_side=True), loss_kwargs(dtype, case, torch_side=False)
    z = np.random.default_rng(5).standard_normal((B, Z)).astype(dtype)
    dec = {k: v for k, v in t_kw.items() if k != "eps"}
    with torch.no_grad():
        t_logits = ref.decode(torch.from_numpy(z), torch.from_numpy(tokens), **dec)
    j_logits = jax_decode(
        ours, jnp.asarray(z), jnp.asarray(tokens), j_kw.get("replace_mask"), j_kw.get("gumbel"),
        mode=j_kw.get("mode", "argmax"), temperature=j_kw.get("temperature", 1.0), tau=j_kw.get("tau", 1.0),
    )
    label = f"{case} logits ({dtype}, hoist_inputs={hoist})"
    assert_steps_close(label, j_logits, t_logits, atol_for(DTYPES[dtype][0]))
    if case != "teacher":  # the draws did replace some tokens, and the predictions differ from the truth
        predictions = np.asarray(jnp.argmax(j_logits, -1))[:, :-1]
        assert (j_kw["replace_mask"][:, 1:] & (predictions != tokens[:, :-1])).any(), "nothing was fed back"
    # The losses of every case are compared in test_elbo_gradients_for_every_parameter, next to their gradients.


# ----------------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, case, bidirectional, concat_z, hoist",
    [  # every case in each dtype would double the time; each case, dtype, layout and hoist appears at least once
        ("float64", "teacher", False, False, False),
        ("float32", "teacher", True, True, False),
        ("float64", "teacher", True, True, True),
        ("float32", "ss_argmax", True, False, True),
        ("float32", "ss_argmax", False, False, False),
        ("float64", "ss_sample", False, True, False),
        ("float64", "ss_gumbel_softmax", True, False, False),
        ("float32", "ss_gumbel_softmax", False, True, True),
    ],
)
def test_elbo_gradients_for_every_parameter(dtype, case, bidirectional, concat_z, hoist):
    ref, ours = make_pair(dtype, bidirectional=bidirectional, concat_z=concat_z, hoist_inputs=hoist)
    tokens, lengths = make_batch()
    t_kw, j_kw = loss_kwargs(dtype, case, torch_side=True), loss_kwargs(dtype, case, torch_side=False)
    t_out, t_grads = torch_elbo(ref, *to_torch(tokens, lengths), t_kw, free_bits=0.05)
    j_out, j_grads = jax_elbo(ours, *to_jax(tokens, lengths), j_kw, free_bits=0.05)
    context = f"ELBO {case} (bidirectional={bidirectional}, concat_z={concat_z}, hoist_inputs={hoist}, {dtype}): "
    assert_losses_close(context, j_out, t_out, dtype)
    assert_grads_close(j_grads, t_grads, grad_rtol_for(DTYPES[dtype][0]), context=context)


@pytest.mark.parametrize("dtype, concat_z, hoist", [("float64", True, True), ("float32", False, False)])
def test_word_dropout_logits_every_step(dtype, concat_z, hoist):
    """word_mask [B, T]: the dropped steps read an all-zero one-hot (torch builds it, jax gathers a zero row),
    with z still read (concat_z) or nothing at all; both ways of projecting the inputs (hoist_inputs)."""
    ref, ours = make_pair(dtype, concat_z=concat_z, hoist_inputs=hoist)
    tokens, _ = make_batch()
    mask = draws(dtype)[2]  # coins at p = 0.5; column 0 holds some True: ignored (<sos> is always read)
    assert mask[:, 0].any() and mask[:, 1:].any()
    z = np.random.default_rng(5).standard_normal((B, Z)).astype(dtype)
    with torch.no_grad():
        t_logits = ref.decode(torch.from_numpy(z), torch.from_numpy(tokens), word_mask=torch.from_numpy(mask))
        kept = ref.decode(torch.from_numpy(z), torch.from_numpy(tokens))
    assert (t_logits - kept).abs().max() > 1e-3, "the word mask changed nothing: a vacuous check"
    j_logits = jax_decode(ours, jnp.asarray(z), jnp.asarray(tokens), None, None, jnp.asarray(mask),
                          mode="argmax", temperature=1.0, tau=1.0)
    label = f"word dropout logits (concat_z={concat_z}, hoist_inputs={hoist}, {dtype})"
    assert_steps_close(label, j_logits, t_logits, atol_for(DTYPES[dtype][0]))


@pytest.mark.parametrize("dtype, hoist", [("float32", True), ("float64", False)])
def test_separate_decoder_size_elbo_gradients_and_generation(dtype, hoist):
    """decoder_hidden_size / decoder_layers (MIXED): latent_to_hidden [Z -> L_dec*H_dec], fc_mu reading D*H_enc
    (bidirectional), h2o reading H_dec: the ELBO, every gradient, then greedy generation token for token."""
    ref, ours = make_pair(dtype, bidirectional=True, concat_z=True, hoist_inputs=hoist, **MIXED)
    tokens, lengths = make_batch()
    t_kw, j_kw = loss_kwargs(dtype, "teacher", torch_side=True), loss_kwargs(dtype, "teacher", torch_side=False)
    t_out, t_grads = torch_elbo(ref, *to_torch(tokens, lengths), t_kw)
    j_out, j_grads = jax_elbo(ours, *to_jax(tokens, lengths), j_kw)
    context = f"ELBO with a decoder of its own size ({MIXED}, hoist_inputs={hoist}, {dtype}): "
    assert_losses_close(context, j_out, t_out, dtype)
    assert_grads_close(j_grads, t_grads, grad_rtol_for(DTYPES[dtype][0]), context=context)

    z = np.random.default_rng(7).standard_normal((20, Z)).astype(dtype)
    with torch.no_grad():
        want = ref.generate(torch.from_numpy(z), 12).numpy()
    got = np.asarray(jax_generate(ours, jnp.asarray(z), None, max_len=12, mode="greedy", top_k=0, temperature=1.0))
    differ = np.flatnonzero((got != want).any(axis=1))
    assert differ.size == 0, (
        f"generate(greedy) with {MIXED} ({dtype}): {differ.size} of 20 latents differ; latent {differ[0]}: "
        f"jax {got[differ[0]].tolist()} vs torch {want[differ[0]].tolist()}"
    )


# ----------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------


@functools.partial(nnx.jit, static_argnames=("max_len", "mode", "top_k"))
def jax_generate(model, z, gumbel, *, max_len, mode, top_k, temperature):
    return model.generate(z, max_len, mode=mode, top_k=top_k, temperature=temperature, gumbel=gumbel)


@pytest.mark.parametrize("dtype", DTYPES)
def test_generations_token_identical_for_100_latents(dtype):
    ref, ours = make_pair(dtype, concat_z=True)
    with torch.no_grad():  # rarer specials, so that sequences run a while (about half run to max_len greedily)
        ref.h2o.bias[PAD] = ref.h2o.bias[SOS] = -3.0
        ref.h2o.bias[EOS] = -1.0
    jsr.load_torch_state_dict(ours, ref.state_dict())
    max_len, n = 16, 100
    rng = np.random.default_rng(7)
    z = rng.standard_normal((n, Z)).astype(dtype)
    gumbel = rng.gumbel(size=(n, max_len, V)).astype(dtype)
    lengths = []
    for mode, top_k, temperature in (("greedy", 0, 1.0), ("sample", 0, 0.9), ("sample", 3, 1.3)):
        with torch.no_grad():
            want = ref.generate(torch.from_numpy(z), max_len, mode=mode, top_k=top_k, temperature=temperature,
                                gumbel=torch.from_numpy(gumbel) if mode == "sample" else None).numpy()
        got = np.asarray(jax_generate(ours, jnp.asarray(z), jnp.asarray(gumbel) if mode == "sample" else None,
                                      max_len=max_len, mode=mode, top_k=top_k, temperature=temperature))
        differ = np.flatnonzero((got != want).any(axis=1))
        assert differ.size == 0, (
            f"generate({mode}, top_k={top_k}, {dtype}): {differ.size} of {n} latents differ; latent {differ[0]}: "
            f"jax {got[differ[0]].tolist()} vs torch {want[differ[0]].tolist()}"
        )
        lengths.append((want != PAD).sum(axis=1))
    lengths = np.concatenate(lengths)
    assert lengths.mean() > 4 and (lengths < max_len).any(), "generations too short, or none stopped: a weak check"


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_twenty_adam_steps_end_in_the_same_parameters(dtype):
    """Scheduled sampling (argmax, p = 0.25) with fresh shared draws every step, beta and free bits on."""
    ref, ours = make_pair(dtype, concat_z=True)
    lr, steps = 1e-2, 20
    t_opt = torch.optim.Adam(ref.parameters(), lr=lr)
    optimizer = nnx.Optimizer(ours, optax.adam(lr), wrt=nnx.Param)
    tokens, lengths = make_batch()

    @nnx.jit
    def jax_step(model, optimizer, eps, mask):
        def total(m):
            return m.loss(tokens, lengths, beta=0.5, free_bits=0.05, eps=eps, replace_mask=mask)["total"]

        value, grads = nnx.value_and_grad(total)(model)
        optimizer.update(model, grads)
        return value

    rng = np.random.default_rng(11)
    for step in range(steps):
        eps = rng.standard_normal((B, Z)).astype(dtype)
        mask = rng.random((B, T)) < 0.25
        t_opt.zero_grad()
        t_loss = ref.loss(*to_torch(tokens, lengths), beta=0.5, free_bits=0.05, eps=torch.from_numpy(eps),
                          replace_mask=torch.from_numpy(mask))["total"]
        t_loss.backward()
        t_opt.step()
        j_loss = float(jax_step(ours, optimizer, jnp.asarray(eps), jnp.asarray(mask)))
        assert abs(j_loss - t_loss.item()) <= TRAJECTORY_ATOL[dtype] * max(1.0, abs(t_loss.item())), (
            f"Adam step {step} ({dtype}): loss {j_loss!r} (jax) vs {t_loss.item()!r} (torch)"
        )
    ours_sd = jsr.torch_state_dict(ours)
    for key, value in ref.state_dict().items():
        assert_close(f"parameter {key} after {steps} Adam steps ({dtype})", ours_sd[key], value, TRAJECTORY_ATOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_decoder_alone_from_a_given_z_and_its_gradients(dtype):
    # loss(z=...): the CharRNN (--decoder-only) a run exports is scored alike in torch: no encoder, KL 0.
    ref, ours = make_pair(dtype)
    tokens, lengths = make_batch()
    z = np.zeros((len(lengths), ours.latent_size), DTYPES[dtype][0])
    t_out = ref.loss(*to_torch(tokens, lengths), z=torch.from_numpy(z), beta=0.5)
    t_out["total"].backward()
    t_grads = {k: p.grad for k, p in ref.named_parameters() if p.grad is not None}

    def total(model):
        return model.loss(jnp.asarray(tokens), jnp.asarray(lengths), z=jnp.asarray(z), beta=0.5)["total"]

    j_out = ours.loss(jnp.asarray(tokens), jnp.asarray(lengths), z=jnp.asarray(z), beta=0.5)
    context = f"decoder alone from z = 0 ({dtype})"
    assert_losses_close(context, j_out, t_out, dtype)
    assert float(t_out["kl"]) == 0.0
    holder = nnx.clone(ours)
    nnx.update(holder, nnx.grad(total)(ours))
    j_grads = {k: v for k, v in jsr.torch_state_dict(holder).items() if k in t_grads}
    assert set(t_grads) == {k for k in t_grads if not k.startswith(("gru_encoder", "fc_mu", "fc_logvar"))}
    assert_grads_close(j_grads, t_grads, grad_rtol_for(DTYPES[dtype][0]), context=context)
