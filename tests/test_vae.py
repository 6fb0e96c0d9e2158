"""jsr.SeqVAE against docs/vae_spec.md (without torch): shapes, lengths, decoding modes, loss, generate, errors."""
from __future__ import annotations

import functools
import math
import re

import flax.errors
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.vae import EOS, PAD, SOS, check_tokens, pad_after_eos, replace_mask

# float64: two paths that run the same operations grouped differently (one gather + scan vs. the
# feedback loop; a padded batch vs. one sequence alone) differ only by accumulated rounding, ~1e-16 per op.
TOL_F64 = 1e-12
# float32: the same with ~6e-8 rounding per op, compounded over the T recurrent steps.
TOL_F32 = 1e-5

V, H, Z, L = 9, 6, 3, 2  # vocabulary (specials included), hidden, latent, layers


def make_model(*, bidirectional=False, concat_z=True, dtype=jnp.float64, seed=0, num_layers=L, **kw) -> jsr.SeqVAE:
    """A SeqVAE with random weights and clearly non-zero biases (a zero bias hides a mapping bug).

    concat_z=True by default: it exercises both of z's routes into the decoder, and one structure shared
    by most tests shares their compilations.

    Built abstractly and filled from numpy: the constructor's own initialisation would compile one
    random kernel per parameter shape, seconds that these tests do not need to spend.
    """
    model = nnx.eval_shape(
        lambda: jsr.SeqVAE(
            V, H, Z, num_layers, bidirectional=bidirectional, concat_z=concat_z, param_dtype=dtype,
            rngs=nnx.Rngs(seed), **kw,
        )
    )
    rng = np.random.default_rng(seed)
    for _, variable in nnx.iter_graph(model):
        if isinstance(variable, nnx.Param):
            variable.set_value(jnp.asarray(rng.uniform(-0.6, 0.6, variable.get_value().shape), dtype))
        elif isinstance(variable, nnx.RngKey):
            variable.set_value(jax.random.key(seed))
        elif isinstance(variable, nnx.RngCount):
            variable.set_value(jnp.zeros((), jnp.uint32))
    return model


def make_batch(lengths, seq_len, *, seed=1):
    """tokens [B, T]: random vocabulary ids (>= 3), one <eos> at lengths-1, then <pad>; and lengths [B]."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    tokens = rng.integers(3, V, (len(lengths), seq_len))
    position = np.arange(seq_len)
    tokens[position == lengths[:, None] - 1] = EOS
    tokens[position >= lengths[:, None]] = PAD
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32)


def randn(*shape, seed=2):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape))


def gumbel_noise(*shape, seed=3):
    return jnp.asarray(np.random.default_rng(seed).gumbel(size=shape))


# Jitted entry points shared by the tests: a model of the same structure and arguments of the same shapes
# reuse one compilation (an eager call re-traces and re-compiles its scans every time).
def decode(model, z, tokens, replace_mask=None, *, mode="argmax", gumbel=None, temperature=1.0, tau=1.0):
    """model.decode, jitted; every argument is passed as an array, so calls share one trace per mode."""
    if gumbel is None:
        gumbel = jnp.zeros((*tokens.shape, V), model.dtype)  # unused by "argmax" and teacher forcing
    temperature, tau = jnp.asarray(temperature), jnp.asarray(tau)
    return _decode(model, z, tokens, replace_mask, mode=mode, gumbel=gumbel, temperature=temperature, tau=tau)


@functools.partial(nnx.jit, static_argnames=("mode",))
def _decode(model, z, tokens, replace_mask, *, mode, gumbel, temperature, tau):
    kw = dict(replace_mask=replace_mask, mode=mode, gumbel=gumbel, temperature=temperature, tau=tau)
    return model.decode(z, tokens, **kw)


@nnx.jit
def encode(model, tokens, lengths):
    return model.encode(tokens, lengths)


def loss(model, tokens, lengths, *, eps=None, beta=1.0, free_bits=0.0):
    """model(...) (__call__ is loss), jitted, teacher-forced; beta and free_bits traced as a schedule's would be."""
    return _loss(model, tokens, lengths, eps, jnp.asarray(beta), jnp.asarray(free_bits))


@nnx.jit
def _loss(model, tokens, lengths, eps, beta, free_bits):
    return model(tokens, lengths, eps=eps, beta=beta, free_bits=free_bits)


@functools.partial(nnx.jit, static_argnames=("max_len", "mode", "top_k"))
def generate(model, z, max_len, *, mode="greedy", temperature=1.0, top_k=0, gumbel=None):
    return model.generate(z, max_len, mode=mode, temperature=temperature, top_k=top_k, gumbel=gumbel)


def assert_close(got, want, tol, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = float(np.abs(got - want).max())
    assert err <= tol, f"{what}: max abs difference {err:.3e} > {tol:.0e}"


# ----------------------------------------------------------------------------------------------------
# Structure and shapes
# ----------------------------------------------------------------------------------------------------

TOKENS_3x8 = make_batch([6, 3, 8], 8)  # the tests' standard batch: jitted calls on it compile once


@pytest.mark.parametrize("bidirectional, concat_z", [(False, False), (True, True)])
def test_shapes_and_state_dict_layout(bidirectional, concat_z):
    model = make_model(bidirectional=bidirectional, concat_z=concat_z)
    d = 2 if bidirectional else 1
    sd = jsr.torch_state_dict(model)
    assert sd["gru_encoder.weight_ih_l0"].shape == (3 * H, V)
    assert ("gru_encoder.weight_ih_l0_reverse" in sd) == bidirectional
    assert sd["fc_mu.weight"].shape == sd["fc_logvar.weight"].shape == (Z, d * H)
    assert sd["latent_to_hidden.weight"].shape == (L * H, Z)
    assert sd["gru_decoder.weight_ih_l0"].shape == (3 * H, V + (Z if concat_z else 0))
    assert sd["h2o.weight"].shape == (V, H)
    prefixes = {"gru_encoder", "fc_mu", "fc_logvar", "latent_to_hidden", "gru_decoder", "h2o"}
    assert {k.split(".")[0] for k in sd} == prefixes
    jsr.load_torch_state_dict(make_model(bidirectional=bidirectional, concat_z=concat_z, seed=5), sd)  # round trip

    tokens, lengths = TOKENS_3x8
    mu, logvar = encode(model, tokens, lengths)
    assert mu.shape == logvar.shape == (3, Z)
    z = model.reparameterize(mu, logvar, randn(3, Z))
    assert z.shape == (3, Z)
    assert model.initial_hidden(z).shape == (L, 3, H)
    assert decode(model, z, tokens).shape == (3, 8, V)
    assert decode(model, z, tokens, jnp.ones((3, 8), bool)).shape == (3, 8, V)
    out = generate(model, z, 8)
    assert out.shape == (3, 8) and out.dtype == jnp.int32
    losses = loss(model, tokens, lengths, eps=randn(3, Z))
    assert set(losses) == {"total", "recon", "kl", "kl_per_dim"}
    assert losses["kl_per_dim"].shape == (Z,) and all(losses[k].shape == () for k in ("total", "recon", "kl"))


def test_decoder_of_its_own_size_layout_and_initial_hidden():
    """decoder_hidden_size Hd, decoder_layers Ld: latent_to_hidden [Z -> Ld*Hd], h2o [Hd -> V]; the encoder keeps
    H and L."""
    hd, ld = 5, 3
    model = make_model(bidirectional=True, decoder_hidden_size=hd, decoder_layers=ld)
    sd = jsr.torch_state_dict(model)
    assert sd["gru_encoder.weight_hh_l1"].shape == (3 * H, H) and "gru_encoder.weight_hh_l2" not in sd
    assert sd["fc_mu.weight"].shape == (Z, 2 * H)
    assert sd["latent_to_hidden.weight"].shape == (ld * hd, Z)
    assert sd["gru_decoder.weight_ih_l0"].shape == (3 * hd, V + Z)
    assert sd["gru_decoder.weight_hh_l2"].shape == (3 * hd, hd)
    assert sd["h2o.weight"].shape == (V, hd)
    z = randn(4, Z)
    flat, h0 = jnp.tanh(model.latent_to_hidden(z)), model.initial_hidden(z)
    assert h0.shape == (ld, 4, hd)
    for layer in range(ld):
        assert_close(h0[layer], flat[:, layer * hd : (layer + 1) * hd], 0.0, f"h0 layer {layer}")
    same = make_model(decoder_hidden_size=None, decoder_layers=None)  # None: the encoder's sizes, as before
    assert (same.decoder_hidden_size, same.decoder_layers) == (H, L)


def test_param_dtype_is_the_compute_dtype():
    model = make_model(dtype=jnp.float32)
    z = model.reparameterize(randn(3, Z), randn(3, Z), randn(3, Z))  # float64 arguments are cast to float32
    assert z.dtype == jnp.float32 and model.initial_hidden(z).dtype == jnp.float32


def test_reparameterize_and_initial_hidden_follow_the_spec():
    model = make_model(num_layers=3)
    mu, logvar, eps = randn(4, Z, seed=1), randn(4, Z, seed=2), randn(4, Z, seed=3)
    assert_close(model.reparameterize(mu, logvar, eps), mu + jnp.exp(logvar / 2) * eps, 0.0, "z")
    z = randn(4, Z)
    flat = jnp.tanh(model.latent_to_hidden(z))  # [B, L*H]
    h0 = model.initial_hidden(z)
    for layer in range(3):
        assert_close(h0[layer], flat[:, layer * H : (layer + 1) * H], 0.0, f"h0 layer {layer}")


def test_noise_not_given_is_drawn_from_the_module_stream():
    tokens, lengths = TOKENS_3x8
    a = loss(make_model(seed=0), tokens, lengths)["total"]
    model = make_model(seed=0)
    b = loss(model, tokens, lengths)["total"]
    c = loss(model, tokens, lengths)["total"]  # the stream advanced
    assert a == b and a != c


def test_default_initialisation_and_sample_stream():
    """torch's init (every weight and bias ~ U(-1/sqrt(fan), 1/sqrt(fan))); a "sample" stream of its own."""
    # V = H = Z keeps the number of distinct shapes (one compiled random kernel each) small.
    models = [jsr.SeqVAE(4, 4, 4, 1, param_dtype=jnp.float64, rngs=nnx.Rngs(s, sample=7)) for s in (0, 1)]
    sd = jsr.torch_state_dict(models[0])
    for key, value in sd.items():  # every fan-in is 4: U(-1/2, 1/2)
        assert 0.2 < np.abs(value).max() <= 0.5, key
    assert not np.array_equal(sd["h2o.weight"], jsr.torch_state_dict(models[1])["h2o.weight"])
    # The "sample" stream seeds the noise independently of the parameters' stream.
    keys = [jax.random.key_data(m.sample_rngs()) for m in models]
    assert np.array_equal(keys[0], keys[1])


# ----------------------------------------------------------------------------------------------------
# Encoder: lengths are honoured
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_content_and_extra_padding_do_not_change_the_encoding(bidirectional):
    model = make_model(bidirectional=bidirectional, concat_z=bidirectional)  # the structures compiled above
    tokens, lengths = TOKENS_3x8
    mu, logvar = encode(model, tokens, lengths)

    rng = np.random.default_rng(9)
    garbage = np.where(np.asarray(tokens) == PAD, rng.integers(0, V, tokens.shape), np.asarray(tokens))
    extra = np.concatenate([garbage, rng.integers(0, V, (3, 3))], axis=1)
    for name, variant in (("garbage padding", garbage), ("3 extra columns", extra)):
        mu2, logvar2 = encode(model, jnp.asarray(variant, jnp.int32), lengths)
        assert_close(mu2, mu, TOL_F64, f"mu with {name}")
        assert_close(logvar2, logvar, TOL_F64, f"logvar with {name}")
    # Each sequence alone, without padding (the backward direction starts at its own last token).
    b, n = 1, int(lengths[1])
    mu_b, logvar_b = encode(model, tokens[b : b + 1, :n], jnp.asarray([n], jnp.int32))
    assert_close(mu_b[0], mu[b], TOL_F64, f"mu of sequence {b} alone")
    assert_close(logvar_b[0], logvar[b], TOL_F64, f"logvar of sequence {b} alone")


def test_encoder_summary_is_last_layer_final_state():
    model = make_model(bidirectional=True)
    tokens, lengths = make_batch([4], 4)
    out, _ = model.gru_encoder(jax.nn.one_hot(tokens, V, dtype=jnp.float64))  # [1, T, 2H], no padding
    summary = jnp.concatenate([out[:, -1, :H], out[:, 0, H:]], axis=-1)  # forward at T-1, backward at 0
    mu, logvar = model.encode(tokens, lengths)
    assert_close(mu, model.fc_mu(summary), TOL_F64, "mu")
    assert_close(logvar, model.fc_logvar(summary), TOL_F64, "logvar")


# ----------------------------------------------------------------------------------------------------
# Decoder: teacher forcing, scheduled sampling, gumbel-softmax
# ----------------------------------------------------------------------------------------------------


def test_teacher_forcing_is_the_one_hot_gru_call():
    """The gathered, hoisted projection computes exactly the spec's gru_decoder(one_hot(<sos>, tokens[:-1]))."""
    model = make_model(concat_z=True)
    tokens, _ = TOKENS_3x8
    z = randn(3, Z)
    inputs = jnp.concatenate([jnp.full((3, 1), SOS), tokens[:, :-1]], axis=1)
    x = jnp.concatenate([jax.nn.one_hot(inputs, V, dtype=jnp.float64), jnp.broadcast_to(z[:, None], (3, 8, Z))], -1)
    out, _ = model.gru_decoder(x, model.initial_hidden(z))
    assert_close(decode(model, z, tokens), model.h2o(out), TOL_F64, "teacher-forced logits")


@pytest.mark.parametrize(
    "concat_z, mode, dtype, tol",
    [
        (False, "argmax", jnp.float64, TOL_F64),
        (True, "gumbel_softmax", jnp.float64, TOL_F64),
        (True, "sample", jnp.float32, TOL_F32),
    ],
)
def test_nothing_replaced_equals_teacher_forcing(concat_z, mode, dtype, tol):
    model = make_model(concat_z=concat_z, dtype=dtype)
    tokens, _ = TOKENS_3x8
    z = randn(3, Z)
    forced = decode(model, z, tokens)
    looped = decode(model, z, tokens, jnp.zeros((3, 8), bool), mode=mode)
    assert looped.dtype == dtype
    assert_close(looped, forced, tol, f"logits, feedback loop ({mode}) vs teacher forcing")


def test_all_replaced_argmax_reproduces_greedy_generate():
    model = make_model()
    model.h2o.bias[...] = model.h2o.bias[...].at[jnp.array([PAD, EOS])].set(-20.0)  # no <eos>/<pad>: all steps compare
    z = randn(3, Z)
    tokens_a, _ = TOKENS_3x8
    tokens_b, _ = make_batch([8, 2, 5], 8, seed=2)
    everything = jnp.ones((3, 8), bool)
    logits = decode(model, z, tokens_a, everything)
    # Only the model's own predictions are read, never the teacher's tokens.
    assert np.array_equal(logits, decode(model, z, tokens_b, everything))
    greedy = generate(model, z, 8)
    assert (greedy != PAD).all()
    assert np.array_equal(jnp.argmax(logits, -1), greedy)
    assert_close(decode(model, z, greedy), logits, TOL_F64, "teacher-forced on generate's tokens")


@pytest.mark.parametrize("mode", ["argmax", "sample"])
def test_scheduled_sampling_matches_a_written_out_loop(mode):
    """Per-token coins: a_t = pred_{t-1} where replace_mask[:, t], else tokens[:, t-1]; column 0 ignored."""
    model = make_model(concat_z=True)
    tokens, _ = TOKENS_3x8
    z = randn(3, Z)
    mask = np.random.default_rng(5).random((3, 8)) < 0.5
    mask[:, 0] = True  # ignored: a_0 is <sos> whatever column 0 says
    gumbel = gumbel_noise(3, 8, V)
    temperature = 0.7
    got = decode(model, z, tokens, jnp.asarray(mask), mode=mode, gumbel=gumbel, temperature=temperature)

    dec = model.gru_decoder
    carries = dec.unstack_state(model.initial_hidden(z))
    a = jnp.full((3,), SOS)
    want = []
    for t in range(8):
        x = jnp.concatenate([jax.nn.one_hot(a, V, dtype=jnp.float64), z], -1)
        carries, h = dec.step(carries, dec.layers[0].input_projection(x))
        logits_t = model.h2o(h)
        want.append(logits_t)
        scores = logits_t if mode == "argmax" else logits_t / temperature + gumbel[:, t]
        if t + 1 < 8:
            a = jnp.where(mask[:, t + 1], jnp.argmax(scores, -1), tokens[:, t])
    assert_close(got, jnp.stack(want, 1), TOL_F64, f"scheduled sampling ({mode})")


def test_gumbel_softmax_forward_equals_the_hard_modes():
    model = make_model()
    tokens, _ = TOKENS_3x8
    z = randn(3, Z)
    mask = jnp.asarray(np.random.default_rng(4).random((3, 8)) < 0.6)
    gumbel = gumbel_noise(3, 8, V)
    soft = decode(model, z, tokens, mask, mode="gumbel_softmax", gumbel=gumbel, tau=0.5)
    hard = decode(model, z, tokens, mask, mode="sample", gumbel=gumbel, temperature=1.0)
    assert_close(soft, hard, TOL_F64, "gumbel_softmax vs sample")
    soft0 = decode(model, z, tokens, mask, mode="gumbel_softmax", gumbel=jnp.zeros_like(gumbel), tau=2.0)
    assert_close(soft0, decode(model, z, tokens, mask), TOL_F64, "gumbel_softmax vs argmax")


def test_gumbel_softmax_gradient_flows_through_the_fed_predictions():
    model = make_model()
    tokens, _ = TOKENS_3x8
    z = randn(3, Z)
    gumbel = gumbel_noise(3, 8, V)
    weights = jnp.arange(V, dtype=jnp.float64)

    @functools.partial(nnx.jit, static_argnames="mode")
    def value_and_grad(model, mask, mode):
        def last_step(model):
            logits = model.decode(z, tokens, replace_mask=mask, mode=mode, gumbel=gumbel)
            return jnp.sum(logits[:, -1] * weights)

        return nnx.value_and_grad(last_step)(model)

    everything = jnp.ones((3, 8), bool)
    v_soft, g_soft = value_and_grad(model, everything, "gumbel_softmax")
    v_hard, g_hard = value_and_grad(model, everything, "sample")  # the same forward value (same noise)
    assert abs(float(v_soft) - float(v_hard)) <= TOL_F64
    # ... but straight-through adds gradient paths through every fed prediction.
    soft_w, hard_w = np.asarray(g_soft["h2o"]["kernel"][...]), np.asarray(g_hard["h2o"]["kernel"][...])
    assert np.all(np.isfinite(soft_w)) and np.abs(soft_w - hard_w).max() > 1e-6
    # With nothing replaced no prediction is fed, so both modes give the same gradient.
    nothing = jnp.zeros((3, 8), bool)
    _, g_none = value_and_grad(model, nothing, "gumbel_softmax")
    _, g_none_hard = value_and_grad(model, nothing, "sample")
    assert_close(g_none["h2o"]["kernel"][...], g_none_hard["h2o"]["kernel"][...], TOL_F64, "gradient, nothing fed")


# ----------------------------------------------------------------------------------------------------
# Loss
# ----------------------------------------------------------------------------------------------------


def test_loss_pieces_on_a_hand_example():
    """Constant logits and a latent that does not depend on the input: every piece by hand."""
    model = make_model()
    model.h2o.kernel[...] = jnp.zeros((H, V))
    bias = np.linspace(-1.0, 1.0, V)
    model.h2o.bias[...] = jnp.asarray(bias)  # logits_t = bias at every step
    mu0, logvar0 = np.array([0.5, -1.0, 0.0]), np.array([0.2, -0.3, 0.0])
    for layer, value in ((model.fc_mu, mu0), (model.fc_logvar, logvar0)):
        layer.kernel[...] = jnp.zeros((H, Z))
        layer.bias[...] = jnp.asarray(value)
    tokens, lengths = TOKENS_3x8
    targets = [int(t) for t in np.asarray(tokens).ravel() if t != PAD]
    assert len(targets) == int(lengths.sum())
    log_z = math.log(sum(math.exp(b) for b in bias))
    recon = sum(log_z - bias[t] for t in targets) / 3  # non-pad targets, per-sequence sum, batch mean
    kl_per_dim = -0.5 * (1 + logvar0 - mu0**2 - np.exp(logvar0))  # the same for every row
    eps = randn(3, Z)
    out = loss(model, tokens, lengths, eps=eps, beta=0.5)
    assert abs(float(out["recon"]) - recon) <= TOL_F64
    assert_close(out["kl_per_dim"], kl_per_dim, TOL_F64, "kl_per_dim")
    assert abs(float(out["kl"]) - kl_per_dim.sum()) <= TOL_F64
    assert abs(float(out["total"]) - (recon + 0.5 * kl_per_dim.sum())) <= TOL_F64
    assert kl_per_dim[2] == 0.0  # the N(0, 1) dimension


def test_free_bits():
    model = make_model()
    tokens, lengths = TOKENS_3x8
    eps = randn(3, Z)
    out = loss(model, tokens, lengths, eps=eps)
    kl_per_dim = np.asarray(out["kl_per_dim"])
    free_bits = float(np.sort(kl_per_dim)[1])  # one dimension below it, one above
    kl_fb = np.maximum(kl_per_dim, free_bits).sum()
    assert kl_fb > kl_per_dim.sum()
    # beta and free_bits are traced here (as an annealing schedule's values under jit)
    fb = loss(model, tokens, lengths, eps=eps, beta=2.0, free_bits=free_bits)
    assert abs(float(fb["kl"]) - kl_fb) <= TOL_F64
    assert abs(float(fb["total"]) - (float(out["recon"]) + 2.0 * kl_fb)) <= TOL_F64
    assert_close(fb["kl_per_dim"], kl_per_dim, 0.0, "kl_per_dim is not clamped")
    assert abs(float(out["kl"]) - kl_per_dim.sum()) <= TOL_F64
    # free_bits as a Python number (decided at trace time) gives the same
    python_fb = nnx.jit(lambda m: m.loss(tokens, lengths, eps=eps, free_bits=free_bits)["kl"])(model)
    assert abs(float(python_fb) - kl_fb) <= TOL_F64


# ----------------------------------------------------------------------------------------------------
# Token ids and lengths out of range: concrete values raise, traced lengths are clipped, traced ids poison
# ----------------------------------------------------------------------------------------------------

BAD_IDS = [V + 5, -3]  # under jit before the check: V+5 gave NaN, -3 a plausible finite loss
BAD_LENGTHS = [0, -4, 9]  # T = 8: all three gave plausible finite losses, none was refused


@pytest.mark.parametrize("bad", BAD_IDS)
def test_concrete_token_ids_out_of_range_name_the_first_bad_entry(bad):
    model = make_model()
    tokens, lengths = TOKENS_3x8
    tokens = tokens.at[1, 2].set(bad).at[2, 0].set(bad)
    message = rf"tokens: expected ids in \[0, vocab_size=9\), got tokens\[1, 2\]={bad} \(2 ids out of range\)"
    for call in (
        lambda: model.loss(tokens, lengths, eps=randn(3, Z)),
        lambda: model(tokens, lengths, eps=randn(3, Z)),
        lambda: model.encode(tokens, lengths),
        lambda: model.decode(randn(3, Z), tokens),
        lambda: check_tokens(np.asarray(tokens), np.asarray(lengths), V),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match=rf"got tokens\[0, 0\]={bad}$"):  # one bad id: no count
        model.encode(TOKENS_3x8[0].at[0, 0].set(bad), lengths)


@pytest.mark.parametrize("bad", BAD_LENGTHS)
def test_concrete_lengths_out_of_range_name_the_first_bad_entry(bad):
    model = make_model()
    tokens, lengths = TOKENS_3x8
    lengths = lengths.at[2].set(bad)
    message = rf"lengths: expected values in \[1, T=8\], got lengths\[2\]={bad}$"
    for call in (
        lambda: model.loss(tokens, lengths, eps=randn(3, Z)),
        lambda: model.encode(tokens, lengths),
        lambda: check_tokens(tokens, lengths, V),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_traced_lengths_out_of_range_are_clipped_never_nan():
    """Under jit lengths cannot be checked: they are clipped to 0..T (0: the encoder reads nothing)."""
    model = make_model()
    tokens, lengths = TOKENS_3x8
    eps = randn(3, Z)
    clipped = {}
    for bad in BAD_LENGTHS:
        out = loss(model, tokens, lengths.at[2].set(bad), eps=eps)
        for key, value in out.items():
            assert np.isfinite(np.asarray(value)).all(), f"lengths[2]={bad}: {key} is not finite"
        clipped[bad] = float(out["total"])
    assert clipped[0] == clipped[-4]  # both clipped to 0
    assert clipped[9] == float(loss(model, tokens, lengths.at[2].set(8), eps=eps)["total"])  # clipped to T
    assert clipped[0] != clipped[9]
    mu, logvar = encode(model, tokens, lengths.at[2].set(-4))
    assert np.isfinite(np.asarray(mu)).all() and np.isfinite(np.asarray(logvar)).all()


@pytest.mark.parametrize("bad", BAD_IDS)
def test_traced_token_ids_out_of_range_make_the_loss_nan(bad):
    """Under jit ids cannot be checked; an id outside [0, V) makes the loss NaN (loud), never plausible."""
    model = make_model()
    tokens, lengths = TOKENS_3x8
    out = loss(model, tokens.at[1, 2].set(bad), lengths, eps=randn(3, Z))
    assert np.isnan(float(out["recon"])) and np.isnan(float(out["total"]))
    assert np.isfinite(float(loss(model, tokens, lengths, eps=randn(3, Z))["total"]))  # the same trace, good ids


def test_check_tokens_helper():
    tokens, lengths = (np.asarray(a) for a in TOKENS_3x8)
    assert check_tokens(tokens, lengths, V) is None
    assert check_tokens(tokens, None, V) is None  # ids only (decode's input)
    with pytest.raises(ValueError, match=r"tokens: expected ids in \[0, vocab_size=5\), got tokens\[0, 0\]="):
        check_tokens(tokens, lengths, 5)
    with pytest.raises(TypeError, match="tokens: expected an integer array of token ids, got dtype float"):
        check_tokens(tokens * 1.0, lengths, V)
    with pytest.raises(ValueError, match=r"tokens: expected shape \[B, T\] with B, T >= 1, got \[0, 8\]"):
        check_tokens(tokens[:0], lengths[:0], V)
    with pytest.raises(ValueError, match=r"lengths: expected shape \[B\] = \[3\], got \[2\]"):
        check_tokens(tokens, lengths[:2], V)
    with pytest.raises(ValueError, match="vocab_size: expected an int >= 1, got 0"):
        check_tokens(tokens, lengths, 0)
    with pytest.raises(TypeError, match="tokens: expected concrete values .*outside jit.*traced"):
        jax.jit(lambda t: check_tokens(t, None, V))(tokens)
    with pytest.raises(TypeError, match="lengths: expected concrete values"):
        jax.jit(lambda n: check_tokens(tokens, n, V))(lengths)


# ----------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------


def test_pad_after_eos():
    tokens = jnp.asarray([[5, 2, 7, 2, 4], [3, 4, 5, 6, 7], [2, 2, 1, 0, 3]])
    want = np.array([[5, 2, 0, 0, 0], [3, 4, 5, 6, 7], [2, 0, 0, 0, 0]])
    assert np.array_equal(pad_after_eos(tokens), want)


def test_generate_pads_after_eos():
    model = make_model()
    model.h2o.bias[...] = model.h2o.bias[...].at[EOS].set(30.0)  # <eos> first, whatever follows
    assert np.array_equal(model.generate(randn(3, Z), 8), np.array([[EOS] + [PAD] * 7] * 3))  # eager
    model = make_model(seed=4)
    out = generate(model, randn(3, Z), 8, mode="sample", gumbel=gumbel_noise(3, 8, V), temperature=2.0)
    assert np.array_equal(out, pad_after_eos(out))
    assert (out == EOS).any() and (out == PAD).any(), "pick a seed whose samples end early"


def test_generate_top_k_1_equals_greedy_and_sampling_is_gumbel_max():
    model = make_model()
    z = randn(3, Z)
    greedy = generate(model, z, 8)
    noise = 10.0 * gumbel_noise(3, 8, V)
    assert np.array_equal(generate(model, z, 8, mode="sample", top_k=1, gumbel=noise, temperature=5.0), greedy)
    # Sampling with given noise is the Gumbel-max rule on temperature-scaled logits (up to the first <eos>).
    g = gumbel_noise(3, 8, V)
    hot = generate(model, z, 8, mode="sample", gumbel=g, temperature=0.5)
    logits = decode(model, z, hot)  # teacher-forced on its own output
    choice = np.asarray(jnp.argmax(logits / 0.5 + g, -1))
    hot = np.asarray(hot)
    valid = np.cumsum(hot == EOS, axis=1) - (hot == EOS) == 0  # up to and including the first <eos>
    assert np.array_equal(choice[valid], hot[valid])
    # top_k = 2: every choice is one of the two largest logits of its step.
    two = np.asarray(generate(model, z, 8, mode="sample", top_k=2, gumbel=noise, temperature=50.0))
    top2 = np.argsort(np.asarray(decode(model, z, jnp.asarray(two))), -1)[..., -2:]
    valid = np.cumsum(two == EOS, axis=1) - (two == EOS) == 0
    assert np.all((top2 == two[..., None]).any(-1)[valid])


def test_generate_ten_thousand_latents_in_one_jitted_call():
    model = make_model()
    z = jax.random.normal(jax.random.key(0), (10_000, Z), jnp.float64)
    out = generate(model, z, 8)
    assert out.shape == (10_000, 8) and out.dtype == jnp.int32
    assert np.array_equal(out[:3], generate(model, z[:3], 8))
    a, b = generate(model, z, 8, mode="sample", top_k=3), generate(model, z, 8, mode="sample", top_k=3)
    assert a.shape == (10_000, 8) and not np.array_equal(a, b)  # the module's stream advances under jit
    assert int(jnp.min(a)) >= 0 and int(jnp.max(a)) < V


def test_replace_mask_helper():
    mask = replace_mask(jax.random.key(1), (200, 50), 0.3)
    assert mask.dtype == jnp.bool_ and mask.shape == (200, 50)
    assert abs(float(mask.mean()) - 0.3) < 0.02
    assert not replace_mask(jax.random.key(1), (200, 50), 0.0).any()
    assert replace_mask(jax.random.key(1), (200, 50), 1.0).all()
    with pytest.raises(ValueError, match=r"p: expected a finite number in \[0, 1\], got 1.5"):
        replace_mask(jax.random.key(1), (4, 5), 1.5)


def test_concat_z_reaches_every_step():
    tokens, _ = TOKENS_3x8
    za, zb = randn(3, Z, seed=10), randn(3, Z, seed=11)
    for concat_z in (True, False):
        model = make_model(concat_z=concat_z)
        model.latent_to_hidden.kernel[...] = jnp.zeros((Z, L * H))  # h0 = tanh(bias), whatever z
        diff = float(np.abs(decode(model, za, tokens) - decode(model, zb, tokens)).max())
        assert (diff > 1e-3) if concat_z else (diff == 0.0), f"concat_z={concat_z}: logits moved by {diff}"


def test_remat_chunk_changes_memory_not_results():
    """Chunked rematerialisation (3 steps: two chunks and a remainder of T=8) runs the same computation.

    Only what the backward pass stores differs (scan.time_scan's own tests check its gradients); here the
    chunked loops must compute the same losses and logits, teacher-forced and with feedback.
    """
    tokens, lengths = TOKENS_3x8
    eps, z, mask = randn(3, Z), randn(3, Z), jnp.asarray(np.random.default_rng(6).random((3, 8)) < 0.5)
    plain, chunked = make_model(), make_model(remat_chunk=3)
    assert chunked.gru_encoder.remat_chunk == chunked.gru_decoder.remat_chunk == 3
    a, b = loss(plain, tokens, lengths, eps=eps), loss(chunked, tokens, lengths, eps=eps)
    assert abs(float(a["total"]) - float(b["total"])) <= TOL_F64
    got = decode(chunked, z, tokens, mask, mode="gumbel_softmax")
    assert_close(got, decode(plain, z, tokens, mask, mode="gumbel_softmax"), TOL_F64, "chunked feedback logits")


def test_sampling_without_noise_draws_step_ts_gumbel_from_one_key():
    """generate(mode="sample") without `gumbel` draws step t's noise as gumbel(fold_in(key, t), [B, V]), one key
    from `sample_rngs`: the same tokens as that noise given."""
    model = make_model(dtype=jnp.float32)
    z = randn(64, Z).astype(jnp.float32)
    key = nnx.clone(model).sample_rngs()
    noise = jnp.stack([jax.random.gumbel(jax.random.fold_in(key, t), (64, V), jnp.float32) for t in range(10)], 1)
    drawn = model.generate(z, 10, mode="sample", temperature=3.0)
    assert np.array_equal(drawn, model.generate(z, 10, mode="sample", temperature=3.0, gumbel=noise))


def test_bfloat16_token_rows_are_what_the_one_hot_matmul_reads():
    """The decoder gathers its tokens' rows of w_ih instead of a one-hot matmul: rounded to compute_dtype first,
    as the matmul's operands are, so teacher forcing gives the decoder GRU's own numbers."""
    model = make_model(dtype=jnp.float32, compute_dtype=jnp.bfloat16)
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, V, (5, 7)), jnp.int32)
    z = randn(5, Z).astype(jnp.float32)
    inputs = jax.nn.one_hot(jnp.concatenate([jnp.full((5, 1), SOS, jnp.int32), tokens[:, :-1]], 1), V)
    if model.concat_z:
        inputs = jnp.concatenate([inputs, jnp.broadcast_to(z[:, None], (5, 7, Z))], -1)
    hs, _ = model.gru_decoder(inputs, model.initial_hidden(z))
    np.testing.assert_allclose(model.decode(z, tokens), model.h2o(hs), atol=1e-5)  # 2.6e-4 with float32 rows


def test_bfloat16_compute_dtype_stays_close_to_float32():
    tokens, lengths = TOKENS_3x8
    eps = randn(3, Z)
    full = loss(make_model(dtype=jnp.float32), tokens, lengths, eps=eps)["total"]
    half = loss(make_model(dtype=jnp.float32, compute_dtype=jnp.bfloat16), tokens, lengths, eps=eps)["total"]
    assert half.dtype == jnp.float32 and 0 < abs(float(half) - float(full)) <= 2e-2 * abs(float(full))


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------

TOKENS, LENGTHS = make_batch([3, 2], 4)
Z2 = randn(2, Z)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda m: m.encode(TOKENS.astype(jnp.float32), LENGTHS), TypeError, "tokens: expected an integer array"),
        (lambda m: m.encode(TOKENS[0], LENGTHS), ValueError, r"tokens: expected shape \[B, T\] .* got \[4\]"),
        (lambda m: m.encode(TOKENS + V, LENGTHS), ValueError, r"tokens: expected ids in \[0, vocab_size=9\)"),
        (lambda m: m.encode(TOKENS, LENGTHS[:1]), ValueError, r"lengths: expected shape \[B\] = \[2\], got \[1\]"),
        (lambda m: m.encode(TOKENS, LENGTHS * 1.0), TypeError, "lengths: expected an integer array, got dtype float"),
        (lambda m: m.encode(TOKENS, LENGTHS * 0), ValueError, r"lengths: expected values in \[1, T=4\]"),
        (lambda m: m.encode(TOKENS, LENGTHS + 3), ValueError, r"lengths: expected values in \[1, T=4\]"),
        (
            lambda m: m.reparameterize(Z2, Z2[:1]),
            ValueError,
            r"logvar: expected shape \[B, Z\] = \[2, 3\], got \[1, 3\]",
        ),
        (lambda m: m.reparameterize(Z2, Z2, jnp.ones((2, 3), int)), TypeError, "eps: expected a floating dtype"),
        (lambda m: m.decode(Z2[:, :2], TOKENS), ValueError, r"z: expected shape \[B, Z\] = \[2, 3\], got \[2, 2\]"),
        (lambda m: m.decode(Z2[:1], TOKENS), ValueError, r"z: expected shape \[B, Z\] = \[2, 3\], got \[1, 3\]"),
        (lambda m: m.decode(Z2, TOKENS, mode="beam"), ValueError, "mode: expected one of .*'argmax'.* got 'beam'"),
        (lambda m: m.decode(Z2, TOKENS, tau=0.0), ValueError, "tau: expected a finite number > 0, got 0.0"),
        (lambda m: m.decode(Z2, TOKENS, temperature=-1), ValueError, "temperature: expected a finite number > 0, got -1"),
        (
            lambda m: m.decode(Z2, TOKENS, replace_mask=jnp.ones((2, 4))),
            TypeError,
            "replace_mask: expected a bool array or None, got dtype float",
        ),
        (
            lambda m: m.decode(Z2, TOKENS, replace_mask=jnp.ones((2, 3), bool)),
            ValueError,
            r"replace_mask: expected shape \[B, T\] = \[2, 4\], got \[2, 3\]",
        ),
        (
            lambda m: m.decode(Z2, TOKENS, word_mask=jnp.ones((2, 4))),
            TypeError,
            "word_mask: expected a bool array or None, got dtype float",
        ),
        (
            lambda m: m.decode(Z2, TOKENS, word_mask=jnp.ones((2, 3), bool)),
            ValueError,
            r"word_mask: expected shape \[B, T\] = \[2, 4\], got \[2, 3\]",
        ),
        (
            lambda m: m.decode(Z2, TOKENS, word_mask=jnp.ones((2, 4), bool), replace_mask=jnp.ones((2, 4), bool)),
            ValueError,
            r"word_mask: expected None with a replace_mask \(word dropout is defined on teacher forcing",
        ),
        (
            lambda m: m.decode(
                Z2, TOKENS, replace_mask=jnp.ones((2, 4), bool), mode="sample", gumbel=jnp.zeros((2, 4, 3))
            ),
            ValueError,
            r"gumbel: expected shape \[B, T, V\] = \[2, 4, 9\], got \[2, 4, 3\]",
        ),
        (lambda m: m.loss(TOKENS, LENGTHS, beta=-1.0), ValueError, "beta: expected a finite number >= 0, got -1.0"),
        # a string failed late, in the loss: "Only integer scalar arrays can be converted to a scalar index"
        (lambda m: m.loss(TOKENS, LENGTHS, beta="1"), ValueError, "^beta: expected a finite number >= 0, got '1'$"),
        (lambda m: m.loss(TOKENS, LENGTHS, free_bits=-0.1), ValueError,
         "free_bits: expected a finite number >= 0, got -0.1"),
        (lambda m: m.generate(Z2, 0), ValueError, "max_len: expected an int >= 1, got 0"),
        (lambda m: m.generate(Z2, 5, mode="argmax"), ValueError, "mode: expected one of .*'greedy'.* got 'argmax'"),
        (lambda m: m.generate(Z2, 5, top_k=V + 1), ValueError, r"top_k: expected an int in \[0, 9\], got 10"),
        (
            lambda m: m.generate(Z2, 5, mode="sample", gumbel=jnp.zeros((2, 4, V))),
            ValueError,
            r"gumbel: expected shape \[B, max_len, V\] = \[2, 5, 9\], got \[2, 4, 9\]",
        ),
        (lambda m: m.generate(Z2.astype(jnp.int32), 5), TypeError, "z: expected a floating dtype, got int32"),
        # no array at all: named, not JAX's "None is not a valid value for jnp.array"
        (lambda m: m.generate(None, 5), TypeError, "^z: expected a floating array, got NoneType$"),
        (lambda m: m.loss(None, LENGTHS), TypeError, "^tokens: expected an integer array of token ids, got NoneType$"),
    ],
)
def test_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call(make_model())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(vocab_size=2), "vocab_size: expected an int >= 3, got 2"),
        (dict(latent_size=0), "latent_size: expected an int >= 1, got 0"),
        (dict(num_layers=1.5), "num_layers: expected an int >= 1, got 1.5"),
        (dict(decoder_hidden_size=0), "decoder_hidden_size: expected None or an int >= 1, got 0"),
        (dict(decoder_layers=1.5), "decoder_layers: expected None or an int >= 1, got 1.5"),
    ],
)
def test_bad_constructor_arguments(kwargs, message):
    args = dict(vocab_size=V, hidden_size=H, latent_size=Z, num_layers=L) | kwargs
    with pytest.raises(ValueError, match=message):
        jsr.SeqVAE(**args, rngs=nnx.Rngs(0))


def test_flags_are_bools():
    with pytest.raises(TypeError, match="^bidirectional: expected True or False, got 1$"):
        jsr.SeqVAE(V, H, Z, L, bidirectional=1, rngs=nnx.Rngs(0))


def test_a_numpy_max_len_through_jsr_jit_is_named_as_traced():
    """jsr.jit traces NumPy scalars (compiled.py), so `fast.generate(z, np.int64(5))` reaches the static `max_len` as a
    tracer: the error says so and what to pass, not "expected an int >= 1, got JitTracer(int32[])" of a 5."""
    fast = jsr.jit(make_model())
    with pytest.raises(ValueError, match=re.escape(
        "max_len: expected an int >= 1, a static one (a Python int: under jit a NumPy or JAX scalar is traced), got a "
        "traced int"
    ) + r"(32|64)\[\]"):  # int64 under x64
        fast.generate(Z2, np.int64(5))
    assert fast.generate(Z2, 5).shape == (2, 5)  # the Python int: static, as documented


def test_noise_from_the_modules_stream_under_a_plain_jax_transform_names_the_way_out():
    # Flax's own "Cannot mutate RngCount from a different trace level" names neither cause nor way out.
    model = make_model(dtype=jnp.float32)
    z = randn(4, Z).astype(jnp.float32)
    tokens, lengths = make_batch([5, 3, 4, 2], 5)
    calls = {
        "eps": lambda: jax.jit(lambda t, n: model(t, n)["loss"])(tokens, lengths),
        "gumbel": lambda: jax.jit(lambda z: model.generate(z, 6, mode="sample"))(z),
        "gumbel ": lambda: jax.jit(lambda z, t: model.decode(z, t, replace_mask=jnp.ones(t.shape, bool),
                                                             mode="sample"))(z, tokens),
    }
    for name, call in calls.items():
        with pytest.raises(flax.errors.TraceContextError,
                           match=rf"^{name.strip()}: drawn from .*nnx\.jit.* or pass {name.strip()} \("):
            call()
    assert jax.jit(lambda z: model.generate(z, 6))(z).shape == (4, 6)  # greedy draws nothing
