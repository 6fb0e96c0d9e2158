"""torch_ref.SeqVAE against docs/vae_spec.md: shapes, lengths, the decoder's feedback modes, loss, generate, errors."""
from __future__ import annotations

import math

import pytest
import torch

from torch_ref import SeqVAE
from torch_ref.vae import EOS, PAD, SOS, pad_after_eos, replace_mask_like, sample_gumbel

# float64: two paths that run the same operations grouped differently (one fused GRU call over T vs. T
# one-step calls; a packed batch vs. one sequence alone) differ only by accumulated rounding, ~1e-16 per op.
TOL_F64 = 1e-12
# float32: the same, with ~6e-8 rounding per op compounded over the T recurrent steps.
TOL_F32 = 1e-5

V, H, Z, L = 9, 6, 3, 2  # vocabulary (specials included), hidden, latent, layers


def make_model(*, bidirectional=False, concat_z=False, dtype=torch.float64, seed=0, num_layers=L, **kw) -> SeqVAE:
    """A SeqVAE with random weights and clearly non-zero biases (a zero bias hides a mapping bug)."""
    torch.manual_seed(seed)
    model = SeqVAE(V, H, Z, num_layers, bidirectional=bidirectional, concat_z=concat_z, **kw).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.6, 0.6)
    return model.eval()


def make_batch(lengths, seq_len, *, seed=1):
    """tokens [B, T]: random vocabulary ids (>= 3), one <eos> at lengths-1, then <pad>; and lengths [B]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.as_tensor(lengths)
    tokens = torch.randint(3, V, (len(lengths), seq_len), generator=g)
    position = torch.arange(seq_len)
    tokens[position == lengths[:, None] - 1] = EOS
    tokens[position >= lengths[:, None]] = PAD
    return tokens, lengths


def randn(*shape, dtype=torch.float64, seed=2):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def gumbel_noise(*shape, dtype=torch.float64, seed=3):
    return sample_gumbel(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def assert_close(got, want, tol, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    assert err <= tol, f"{what}: max abs difference {err:.3e} > {tol:.0e}"


# ----------------------------------------------------------------------------------------------------
# Structure and shapes
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("concat_z", [False, True])
def test_shapes_and_state_dict_layout(bidirectional, concat_z):
    model = make_model(bidirectional=bidirectional, concat_z=concat_z)
    d = 2 if bidirectional else 1
    sd = model.state_dict()
    assert sd["gru_encoder.weight_ih_l0"].shape == (3 * H, V)
    assert ("gru_encoder.weight_ih_l0_reverse" in sd) == bidirectional
    assert sd["fc_mu.weight"].shape == sd["fc_logvar.weight"].shape == (Z, d * H)
    assert sd["latent_to_hidden.weight"].shape == (L * H, Z)
    assert sd["gru_decoder.weight_ih_l0"].shape == (3 * H, V + (Z if concat_z else 0))
    assert sd["h2o.weight"].shape == (V, H)
    prefixes = {"gru_encoder", "fc_mu", "fc_logvar", "latent_to_hidden", "gru_decoder", "h2o"}
    assert {k.split(".")[0] for k in sd} == prefixes

    tokens, lengths = make_batch([5, 2, 7], 7)
    mu, logvar = model.encode(tokens, lengths)
    assert mu.shape == logvar.shape == (3, Z)
    z = model.reparameterize(mu, logvar, randn(3, Z))
    assert z.shape == (3, Z)
    assert model.initial_hidden(z).shape == (L, 3, H)
    assert model.decode(z, tokens).shape == (3, 7, V)
    assert model.decode(z, tokens, replace_mask=torch.ones(3, 7, dtype=torch.bool)).shape == (3, 7, V)
    out = model.generate(z, 11)
    assert out.shape == (3, 11) and out.dtype == torch.int64
    losses = model.loss(tokens, lengths, eps=randn(3, Z))
    assert set(losses) == {"total", "recon", "kl", "kl_per_dim"}
    assert losses["kl_per_dim"].shape == (Z,) and all(losses[k].shape == () for k in ("total", "recon", "kl"))


def test_concat_z_changes_decoder_input_size():
    assert make_model(concat_z=False).gru_decoder.input_size == V
    assert make_model(concat_z=True).gru_decoder.input_size == V + Z
    # With concat_z, z reaches every step directly, not only through h0: with h0 held fixed (same
    # latent_to_hidden output), changing z still changes the logits.
    model = make_model(concat_z=True)
    with torch.no_grad():
        model.latent_to_hidden.weight.zero_()  # h0 = tanh(bias), whatever z
    tokens, _ = make_batch([4, 4], 4)
    a = model.decode(randn(2, Z, seed=10), tokens)
    b = model.decode(randn(2, Z, seed=11), tokens)
    assert (a - b).abs().max() > 1e-3


def test_decoder_of_its_own_size():
    """decoder_hidden_size Hd, decoder_layers Ld: latent_to_hidden [Z -> Ld*Hd], h2o [Hd -> V]; the encoder keeps
    H and L."""
    hd, ld = 5, 3
    model = make_model(bidirectional=True, concat_z=True, decoder_hidden_size=hd, decoder_layers=ld)
    sd = model.state_dict()
    assert sd["gru_encoder.weight_hh_l1"].shape == (3 * H, H) and "gru_encoder.weight_hh_l2" not in sd
    assert sd["fc_mu.weight"].shape == (Z, 2 * H)
    assert sd["latent_to_hidden.weight"].shape == (ld * hd, Z)
    assert sd["gru_decoder.weight_ih_l0"].shape == (3 * hd, V + Z)
    assert sd["gru_decoder.weight_hh_l2"].shape == (3 * hd, hd)
    assert sd["h2o.weight"].shape == (V, hd)
    z = randn(4, Z)
    flat, h0 = torch.tanh(model.latent_to_hidden(z)), model.initial_hidden(z)
    assert h0.shape == (ld, 4, hd)
    for layer in range(ld):
        assert_close(h0[layer], flat[:, layer * hd : (layer + 1) * hd], 0.0, f"h0 layer {layer}")
    tokens, lengths = make_batch([5, 2, 7, 1], 7)
    assert model.decode(z, tokens).shape == (4, 7, V) and model.generate(z, 6).shape == (4, 6)
    assert model.loss(tokens, lengths, eps=z)["total"].shape == ()
    # None is the encoder's size: the same modules as before the option existed.
    same = make_model(decoder_hidden_size=None, decoder_layers=None)
    assert (same.decoder_hidden_size, same.decoder_layers) == (H, L)
    shapes = lambda model: {k: v.shape for k, v in model.state_dict().items()}  # noqa: E731
    assert shapes(same) == shapes(make_model())


def test_reparameterize_and_initial_hidden_follow_the_spec():
    model = make_model(num_layers=3)
    mu, logvar, eps = randn(4, Z, seed=1), randn(4, Z, seed=2), randn(4, Z, seed=3)
    assert_close(model.reparameterize(mu, logvar, eps), mu + torch.exp(logvar / 2) * eps, 0.0, "z")
    z = randn(4, Z)
    flat = torch.tanh(model.latent_to_hidden(z))  # [B, L*H]
    h0 = model.initial_hidden(z)
    for layer in range(3):
        assert_close(h0[layer], flat[:, layer * H : (layer + 1) * H], 0.0, f"h0 layer {layer}")


def test_eps_is_drawn_from_torch_rng_when_not_given():
    model = make_model()
    tokens, lengths = make_batch([3, 5], 5)
    torch.manual_seed(123)
    a = model.loss(tokens, lengths)["total"]
    torch.manual_seed(123)
    b = model.loss(tokens, lengths)["total"]
    c = model.loss(tokens, lengths)["total"]
    assert a == b and a != c
    # forward is the loss
    eps = randn(2, Z)
    assert model(tokens, lengths, eps=eps)["total"] == model.loss(tokens, lengths, eps=eps)["total"]


# ----------------------------------------------------------------------------------------------------
# Encoder: lengths are honoured
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_content_and_extra_padding_do_not_change_the_encoding(bidirectional):
    model = make_model(bidirectional=bidirectional)
    lengths = [5, 2, 7, 1]
    tokens, lengths = make_batch(lengths, 7)
    mu, logvar = model.encode(tokens, lengths)

    garbage = tokens.clone()
    pad = garbage == PAD
    garbage[pad] = torch.randint(0, V, (int(pad.sum()),), generator=torch.Generator().manual_seed(9))
    extra = torch.cat([garbage, torch.randint(0, V, (4, 3), generator=torch.Generator().manual_seed(8))], dim=1)
    for name, variant in (("garbage padding", garbage), ("3 extra columns", extra)):
        mu2, logvar2 = model.encode(variant, lengths)
        assert_close(mu2, mu, TOL_F64, f"mu with {name}")
        assert_close(logvar2, logvar, TOL_F64, f"logvar with {name}")

    # Each sequence alone, with no padding at all, encodes to the same numbers (the backward direction
    # starts at its own last token, not at the batch's T-1).
    for b, n in enumerate(lengths.tolist()):
        mu_b, logvar_b = model.encode(tokens[b : b + 1, :n], [n])
        assert_close(mu_b[0], mu[b], TOL_F64, f"mu of sequence {b} alone")
        assert_close(logvar_b[0], logvar[b], TOL_F64, f"logvar of sequence {b} alone")


def test_encoder_summary_is_last_layer_final_state():
    """The summary is h_n of the last layer: forward at lengths-1, backward started at lengths-1."""
    model = make_model(bidirectional=True)
    tokens, lengths = make_batch([4], 4)
    x = torch.nn.functional.one_hot(tokens, V).double()
    out, _ = model.gru_encoder(x)  # no padding: the plain sequence; out [1, T, 2H]
    summary = torch.cat([out[:, -1, :H], out[:, 0, H:]], dim=-1)  # forward at T-1, backward at 0
    mu, logvar = model.encode(tokens, lengths)
    assert_close(mu, model.fc_mu(summary), TOL_F64, "mu")
    assert_close(logvar, model.fc_logvar(summary), TOL_F64, "logvar")


# ----------------------------------------------------------------------------------------------------
# Decoder: teacher forcing, scheduled sampling, gumbel-softmax
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("concat_z", [False, True])
@pytest.mark.parametrize("mode", ["argmax", "sample", "gumbel_softmax"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, TOL_F64), (torch.float32, TOL_F32)])
def test_loop_with_nothing_replaced_equals_fused_teacher_forcing(concat_z, mode, dtype, tol):
    model = make_model(concat_z=concat_z, dtype=dtype)
    tokens, _ = make_batch([6, 3, 8], 8)
    z = randn(3, Z, dtype=dtype)
    fused = model.decode(z, tokens)
    looped = model.decode(z, tokens, replace_mask=torch.zeros(3, 8, dtype=torch.bool), mode=mode)
    assert_close(looped, fused, tol, f"logits, loop ({mode}) vs fused")


@pytest.mark.parametrize("concat_z", [False, True])
def test_word_dropout_feeds_an_all_zero_one_hot(concat_z):
    """Where word_mask[:, t] (t >= 1), step t reads no token: its one-hot input is all zeros (z still read)."""
    model = make_model(concat_z=concat_z)
    tokens, lengths = make_batch([6, 3, 8], 8)
    z = randn(3, Z)
    mask = replace_mask_like(tokens, 0.5, generator=torch.Generator().manual_seed(4))
    mask[:, 0] = True  # ignored: <sos> is always read
    sos = torch.full((3, 1), SOS)
    x = torch.nn.functional.one_hot(torch.cat([sos, tokens[:, :-1]], dim=1), V).double()
    x[:, 1:][mask[:, 1:]] = 0.0
    if concat_z:
        x = torch.cat([x, z[:, None].expand(3, 8, Z)], dim=-1)
    out, _ = model.gru_decoder(x, model.initial_hidden(z))
    got = model.decode(z, tokens, word_mask=mask)
    assert_close(got, model.h2o(out), TOL_F64, "logits with word dropout vs the written-out zero inputs")
    assert_close(model.decode(z, tokens, word_mask=torch.zeros(3, 8, dtype=torch.bool)), model.decode(z, tokens), 0.0,
                 "logits with nothing dropped vs no word_mask")
    # The loss passes word_mask to decode (eps = 0: z = mu).
    logits = model.decode(model.encode(tokens, lengths)[0], tokens, word_mask=mask)
    recon = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens, ignore_index=PAD, reduction="sum") / 3
    eps = torch.zeros(3, Z, dtype=torch.float64)
    assert_close(model.loss(tokens, lengths, eps=eps, word_mask=mask)["recon"], recon, TOL_F64, "recon")


def test_all_replaced_with_argmax_reproduces_generate_greedy():
    model = make_model()
    with torch.no_grad():
        model.h2o.bias[EOS] = -20.0  # never predict <eos>, so generate pads nothing and all T steps compare
    z = randn(4, Z)
    tokens_a, _ = make_batch([8, 8, 8, 8], 8, seed=1)
    tokens_b, _ = make_batch([3, 8, 5, 1], 8, seed=2)
    everything = torch.ones(4, 8, dtype=torch.bool)
    logits = model.decode(z, tokens_a, replace_mask=everything, mode="argmax")
    # The decoder consumes only its own predictions: the teacher's tokens are never read.
    assert torch.equal(logits, model.decode(z, tokens_b, replace_mask=everything, mode="argmax"))
    greedy = model.generate(z, 8)
    assert (greedy != PAD).all()
    assert torch.equal(logits.argmax(-1), greedy)
    # generate's inputs are its own outputs: teacher-forcing it on <sos> + greedy[:, :-1] gives the same logits.
    assert_close(model.decode(z, greedy), logits, TOL_F64, "teacher-forced on generate's tokens")


@pytest.mark.parametrize("mode", ["argmax", "sample"])
def test_scheduled_sampling_matches_a_written_out_loop(mode):
    """Per-token coins: a_t = pred_{t-1} where replace_mask[:, t], else tokens[:, t-1]; column 0 ignored."""
    model = make_model(concat_z=True)
    tokens, _ = make_batch([7, 4, 2], 7)
    z = randn(3, Z)
    mask = torch.rand(3, 7, generator=torch.Generator().manual_seed(5)) < 0.5
    mask[:, 0] = True  # ignored: a_0 is <sos> whatever column 0 says
    gumbel = gumbel_noise(3, 7, V)
    temperature = 0.7
    got = model.decode(z, tokens, replace_mask=mask, mode=mode, gumbel=gumbel, temperature=temperature)

    # The seed answer's loop, corrected to one coin per token, written out with the model's own modules.
    h = torch.tanh(model.latent_to_hidden(z)).view(3, L, H).transpose(0, 1).contiguous()
    a = torch.full((3,), SOS)
    want = []
    for t in range(7):
        x = torch.cat([torch.nn.functional.one_hot(a, V).double(), z], dim=-1).unsqueeze(1)
        out, h = model.gru_decoder(x, h)
        logits_t = model.h2o(out[:, 0])
        want.append(logits_t)
        if t + 1 < 7:
            scores = logits_t if mode == "argmax" else logits_t / temperature + gumbel[:, t]
            a = torch.where(mask[:, t + 1], scores.argmax(-1), tokens[:, t])
    assert_close(got, torch.stack(want, 1), TOL_F64, f"scheduled sampling ({mode})")


def test_gumbel_softmax_forward_equals_hard_modes_given_the_same_noise():
    model = make_model()
    tokens, _ = make_batch([8, 5, 8], 8)
    z = randn(3, Z)
    mask = torch.rand(3, 8, generator=torch.Generator().manual_seed(4)) < 0.6
    gumbel = gumbel_noise(3, 8, V)
    soft = model.decode(z, tokens, replace_mask=mask, mode="gumbel_softmax", gumbel=gumbel, tau=0.5)
    # argmax(softmax((l + g) / tau)) = argmax(l + g): the "sample" mode at temperature 1 with the same noise.
    hard = model.decode(z, tokens, replace_mask=mask, mode="sample", gumbel=gumbel, temperature=1.0)
    assert_close(soft, hard, TOL_F64, "gumbel_softmax vs sample")
    zero = torch.zeros_like(gumbel)
    soft0 = model.decode(z, tokens, replace_mask=mask, mode="gumbel_softmax", gumbel=zero, tau=2.0)
    assert_close(soft0, model.decode(z, tokens, replace_mask=mask, mode="argmax"), TOL_F64, "gumbel_softmax vs argmax")


def _no_grad(t: torch.Tensor) -> bool:
    """No gradient reached t (None, or the zeros that torch.stack's backward hands every slice)."""
    return t.grad is None or t.grad.abs().max() == 0


def _step_logits_with_grads(model, z, tokens, mask, mode, gumbel):
    """Run decode, keep every per-step h2o output (logits_t) with retain_grad, backprop the last step."""
    outputs = []

    def keep(_module, _inputs, out):
        out.retain_grad()
        outputs.append(out)

    handle = model.h2o.register_forward_hook(keep)
    try:
        logits = model.decode(z, tokens, replace_mask=mask, mode=mode, gumbel=gumbel)
    finally:
        handle.remove()
    (logits[:, -1] * torch.arange(V, dtype=logits.dtype)).sum().backward()
    return outputs


def test_gumbel_softmax_is_differentiable_through_the_fed_predictions():
    model = make_model()
    tokens, _ = make_batch([6, 6], 6)
    z = randn(2, Z)
    gumbel = gumbel_noise(2, 6, V)
    everything = torch.ones(2, 6, dtype=torch.bool)

    outputs = _step_logits_with_grads(model, z, tokens, everything, "gumbel_softmax", gumbel)
    assert len(outputs) == 6
    for t in range(5):  # the last step's loss reaches every earlier step's logits, hence h2o, through the feed
        assert not _no_grad(outputs[t]), f"no gradient into logits_{t}"
    assert model.h2o.weight.grad.abs().max() > 0

    # argmax feeds a one-hot: no gradient path from later steps into earlier logits.
    model.zero_grad()
    outputs = _step_logits_with_grads(model, z, tokens, everything, "argmax", gumbel)
    assert all(_no_grad(outputs[t]) for t in range(5))

    # Replaced positions only: step 5 is teacher-fed, so logits_4 gets nothing, while logits_3 (fed to
    # step 4, which was replaced) still does, through h_4.
    model.zero_grad()
    mask = everything.clone()
    mask[:, 5] = False
    outputs = _step_logits_with_grads(model, z, tokens, mask, "gumbel_softmax", gumbel)
    assert _no_grad(outputs[4])
    assert not _no_grad(outputs[3])


def test_decode_draws_gumbel_from_torch_rng_when_not_given():
    model = make_model()
    tokens, _ = make_batch([6, 6], 6)
    z = randn(2, Z)
    mask = torch.ones(2, 6, dtype=torch.bool)
    torch.manual_seed(7)
    a = model.decode(z, tokens, replace_mask=mask, mode="sample", temperature=3.0)
    torch.manual_seed(7)
    b = model.decode(z, tokens, replace_mask=mask, mode="sample", temperature=3.0)
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------------
# Loss
# ----------------------------------------------------------------------------------------------------


def test_loss_pieces_match_a_hand_computation():
    model = make_model()
    tokens = torch.tensor([[5, 3, 2, 0], [4, 2, 0, 0]])
    lengths = torch.tensor([3, 2])
    eps = randn(2, Z)
    beta = 0.5
    mu, logvar = model.encode(tokens, lengths)
    logits = model.decode(model.reparameterize(mu, logvar, eps), tokens)

    recon = 0.0
    for b in range(2):
        for t in range(4):
            target = int(tokens[b, t])
            if target == PAD:
                continue
            row = logits[b, t].tolist()
            recon += math.log(sum(math.exp(v) for v in row)) - row[target]
    recon /= 2
    kl_per_dim = []
    for j in range(Z):
        terms = [(mu[b, j].item(), logvar[b, j].item()) for b in range(2)]
        kl_per_dim.append(sum(-0.5 * (1 + lv - m**2 - math.exp(lv)) for m, lv in terms) / 2)

    out = model.loss(tokens, lengths, eps=eps, beta=beta)
    assert abs(out["recon"].item() - recon) <= TOL_F64
    assert_close(out["kl_per_dim"], torch.tensor(kl_per_dim, dtype=torch.float64), TOL_F64, "kl_per_dim")
    assert abs(out["kl"].item() - sum(kl_per_dim)) <= TOL_F64
    assert abs(out["total"].item() - (recon + beta * sum(kl_per_dim))) <= TOL_F64

    # Free bits: each dimension's batch-mean KL counts at least free_bits.
    free_bits = sorted(kl_per_dim)[1]  # the middle value: one dimension below it, one above
    out_fb = model.loss(tokens, lengths, eps=eps, beta=beta, free_bits=free_bits)
    kl_fb = sum(max(k, free_bits) for k in kl_per_dim)
    assert kl_fb > sum(kl_per_dim)
    assert abs(out_fb["kl"].item() - kl_fb) <= TOL_F64
    assert abs(out_fb["total"].item() - (recon + beta * kl_fb)) <= TOL_F64
    assert_close(out_fb["kl_per_dim"], out["kl_per_dim"], 0.0, "kl_per_dim is not clamped")


def test_loss_passes_decoder_options_through():
    model = make_model()
    tokens, lengths = make_batch([6, 4], 6)
    eps, gumbel = randn(2, Z), gumbel_noise(2, 6, V)
    mask = torch.ones(2, 6, dtype=torch.bool)
    z = model.reparameterize(*model.encode(tokens, lengths), eps)
    logits = model.decode(z, tokens, replace_mask=mask, mode="sample", gumbel=gumbel, temperature=0.3)
    want = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens, ignore_index=PAD, reduction="sum") / 2
    got = model.loss(tokens, lengths, eps=eps, replace_mask=mask, mode="sample", gumbel=gumbel, temperature=0.3)
    assert_close(got["recon"], want, TOL_F64, "recon under scheduled sampling")


# ----------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------


def test_replace_mask_like_draws_one_coin_per_token():
    tokens = torch.zeros(64, 50, dtype=torch.long)
    assert not replace_mask_like(tokens, 0.0).any() and replace_mask_like(tokens, 1.0).all()
    coins = replace_mask_like(tokens, 0.3, generator=torch.Generator().manual_seed(0))
    assert coins.dtype == torch.bool and coins.shape == (64, 50)
    assert abs(coins.float().mean().item() - 0.3) < 0.03  # 3200 coins: ~4 standard deviations
    assert not (coins == coins[:1]).all(dim=0).any()  # no time step shares one coin over the batch (the seed's bug)
    again = replace_mask_like(tokens, 0.3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(coins, again)
    with pytest.raises(ValueError, match=r"^p: expected a finite number in \[0, 1\], got 1.5$"):
        replace_mask_like(tokens, 1.5)


def test_pad_after_eos():
    tokens = torch.tensor([[5, 2, 7, 2, 4], [3, 4, 5, 6, 7], [2, 2, 1, 0, 3]])
    want = torch.tensor([[5, 2, 0, 0, 0], [3, 4, 5, 6, 7], [2, 0, 0, 0, 0]])
    assert torch.equal(pad_after_eos(tokens), want)


def test_generate_pads_after_eos():
    model = make_model()
    with torch.no_grad():
        model.h2o.bias[EOS] = 30.0  # <eos> first, whatever follows
    out = model.generate(randn(3, Z), 6)
    assert torch.equal(out, torch.tensor([[EOS, PAD, PAD, PAD, PAD, PAD]] * 3))

    model = make_model(seed=4)
    out = model.generate(randn(16, Z), 12, mode="sample", gumbel=gumbel_noise(16, 12, V), temperature=2.0)
    assert torch.equal(out, pad_after_eos(out))
    assert (out == EOS).any(), "pick a seed whose samples contain <eos>, or this test checks nothing"


def test_generate_top_k_1_equals_greedy():
    model = make_model()
    z = randn(5, Z)
    greedy = model.generate(z, 10)
    sampled = model.generate(z, 10, mode="sample", top_k=1, gumbel=10.0 * gumbel_noise(5, 10, V), temperature=5.0)
    assert torch.equal(sampled, greedy)


def test_generate_temperature_and_gumbel():
    model = make_model()
    z = randn(5, Z)
    gumbel = gumbel_noise(5, 10, V)
    a = model.generate(z, 10, mode="sample", gumbel=gumbel)
    assert torch.equal(a, model.generate(z, 10, mode="sample", gumbel=gumbel)), "same noise, same tokens"
    # Near-zero temperature: the logits dominate the noise, greedy.
    assert torch.equal(model.generate(z, 10, mode="sample", gumbel=gumbel, temperature=1e-9), model.generate(z, 10))
    # Huge temperature: the noise dominates, tokens are argmax of the noise.
    hot = model.generate(z, 10, mode="sample", gumbel=gumbel, temperature=1e9)
    assert torch.equal(hot, pad_after_eos(gumbel.argmax(-1)))
    # ... unless top_k keeps only the k best logits: the first token is the noisiest among logits_0's top 2.
    hot2 = model.generate(z, 10, mode="sample", gumbel=gumbel, temperature=1e9, top_k=2)
    top2 = model.decode(z, torch.full((5, 1), 3))[:, 0].topk(2, dim=-1).indices  # logits_0 (fed <sos>)
    assert torch.equal(hot2[:, 0], top2.gather(1, gumbel[:, 0].gather(1, top2).argmax(1, keepdim=True))[:, 0])
    # Without noise given, torch's RNG draws it.
    torch.manual_seed(11)
    b = model.generate(z, 10, mode="sample", temperature=2.0)
    torch.manual_seed(11)
    assert torch.equal(b, model.generate(z, 10, mode="sample", temperature=2.0))


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    model = make_model()
    tokens, lengths = make_batch([3, 4], 4)
    z = randn(2, Z)
    cases = [
        (TypeError, "tokens", lambda: model.encode(tokens.double(), lengths)),
        (ValueError, "tokens", lambda: model.encode(tokens[0], lengths)),
        (ValueError, "tokens", lambda: model.encode(tokens + V, lengths)),
        (TypeError, "lengths", lambda: model.encode(tokens, lengths.float())),
        (ValueError, "lengths", lambda: model.encode(tokens, lengths[:1])),
        (ValueError, "lengths", lambda: model.encode(tokens, torch.tensor([0, 4]))),
        (ValueError, "lengths", lambda: model.encode(tokens, torch.tensor([3, 5]))),
        (TypeError, "eps", lambda: model.loss(tokens, lengths, eps=z.float())),
        (ValueError, "eps", lambda: model.loss(tokens, lengths, eps=randn(2, Z + 1))),
        (TypeError, "z", lambda: model.decode(z.float(), tokens)),
        (ValueError, "z", lambda: model.decode(randn(3, Z), tokens)),
        (ValueError, "z", lambda: model.generate(randn(2, Z + 1), 5)),
        (TypeError, "replace_mask", lambda: model.decode(z, tokens, replace_mask=torch.ones(2, 4))),
        (ValueError, "replace_mask", lambda: model.decode(z, tokens, replace_mask=torch.ones(2, 5, dtype=torch.bool))),
        (TypeError, "word_mask", lambda: model.decode(z, tokens, word_mask=torch.ones(2, 4))),
        (ValueError, "word_mask", lambda: model.decode(z, tokens, word_mask=torch.ones(2, 5, dtype=torch.bool))),
        (ValueError, "word_mask", lambda: model.decode(z, tokens, word_mask=torch.ones(2, 4, dtype=torch.bool),
                                                       replace_mask=torch.ones(2, 4, dtype=torch.bool))),
        (ValueError, "mode", lambda: model.decode(z, tokens, mode="greedy")),
        (ValueError, "mode", lambda: model.generate(z, 5, mode="argmax")),
        (ValueError, "gumbel", lambda: model.decode(z, tokens, replace_mask=torch.ones(2, 4, dtype=torch.bool),
                                                    mode="sample", gumbel=randn(2, 3, V))),
        (TypeError, "gumbel", lambda: model.generate(z, 5, mode="sample", gumbel=randn(2, 5, V, dtype=torch.float32))),
        (ValueError, "temperature", lambda: model.generate(z, 5, mode="sample", temperature=0.0)),
        (ValueError, "tau", lambda: model.decode(z, tokens, tau=-1.0)),
        (ValueError, "top_k", lambda: model.generate(z, 5, mode="sample", top_k=V + 1)),
        (ValueError, "max_len", lambda: model.generate(z, 0)),
        (ValueError, "free_bits", lambda: model.loss(tokens, lengths, free_bits=-0.1)),
        (ValueError, "vocab_size", lambda: SeqVAE(2, H, Z, L)),
        (ValueError, "hidden_size", lambda: SeqVAE(V, True, Z, L)),  # a bool is not a size
        (ValueError, "decoder_hidden_size", lambda: SeqVAE(V, H, Z, L, decoder_hidden_size=0)),
        (ValueError, "decoder_layers", lambda: SeqVAE(V, H, Z, L, decoder_layers=1.5)),
        (ValueError, "beta", lambda: model.loss(tokens, lengths, beta=float("nan"))),
        # bool() read these as True: a bidirectional encoder and z concatenated, silently
        (TypeError, "bidirectional", lambda: SeqVAE(V, H, Z, L, bidirectional="no")),
        (TypeError, "concat_z", lambda: SeqVAE(V, H, Z, L, concat_z=2)),
    ]
    for error, name, call in cases:
        with pytest.raises(error, match=rf"^{name}: expected"):
            call()


def test_decoder_only_loss_names_tokens_that_are_no_tensor():
    """`loss(tokens, lengths, z=...)` (the decoder alone) checks `tokens` before reading their batch size for z's
    check: a list is named as `encode` names it, not an AttributeError ("'list' object has no attribute 'shape'")."""
    model = make_model()
    tokens, lengths = make_batch([3, 4], 4)
    with pytest.raises(TypeError, match=r"^tokens: expected a torch.Tensor of token ids, got list$"):
        model.loss(tokens.tolist(), lengths, z=torch.zeros(2, Z, dtype=model.dtype))


def test_numpy_numbers_are_taken_as_their_python_values():
    # Sizes read from a NumPy config or a sweep (np.int64) are integers as jsr.SeqVAE takes them; nn.GRU
    # itself refuses NumPy's integers ("hidden_size should be of type int"), so they are passed on as ints.
    import numpy as np

    model = SeqVAE(np.int64(9), np.int64(6), np.int32(3), np.int64(1), decoder_hidden_size=np.int64(5))
    assert (model.hidden_size, model.decoder_hidden_size, type(model.latent_size)) == (6, 5, int)
    assert model.gru_decoder.hidden_size == 5
    stacked = SeqVAE(9, 6, 3, 1, decoder_layers=np.int64(2))  # nn.GRU keeps a NumPy num_layers as it is given
    assert type(stacked.gru_decoder.num_layers) is int and stacked.gru_decoder.num_layers == 2
    tokens = model.generate(torch.zeros(2, 3), max_len=np.int64(4), mode="sample", temperature=np.float32(0.5),
                            top_k=np.int64(2))
    assert tokens.shape == (2, 4)
    with pytest.raises(ValueError, match=r"^hidden_size: expected an int >= 1, got np.float64\(6.0\)$"):
        SeqVAE(9, np.float64(6.0), 3, 1)
