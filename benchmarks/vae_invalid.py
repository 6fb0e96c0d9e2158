"""Why a trained VAE's prior samples are invalid, and what a SMILES syntax mask at sampling time changes.

    python benchmarks/vae_invalid.py --run runs/vae --out benchmarks/results/vae-invalid-cpu-2core.json  # appends

Draws --samples prior samples (z ~ N(0, I), temperature 1, as `jax-scan-rnn train vae` evaluates them) twice:
  - plain: the model's own samples (`tasks.vae.sample`);
  - masked: the same model, with every token that would break the SMILES grammar's bookkeeping given
    probability 0 at each step: `)` with no branch open or right after `(`, `<eos>` while a branch, a ring
    bond or a bracket atom is open, `[` inside a bracket atom and `]` outside one (the syntax-directed idea of
    Dai et al. 2018, reduced to the counters a character-level model breaks).
Each invalid sample is put in one class by what rdkit rejects: "parentheses" (unbalanced branches), "ring
closure" (a ring-bond digit left open), "other syntax" (rdkit cannot parse it for another reason), "aromaticity"
(parsed, but the aromatic ring cannot be kekulized, or a non-ring atom is aromatic), "valence" (an atom with
more bonds than allowed), "other chemistry". If the mask turned the syntax classes into valid molecules, the
model's errors would be bookkeeping the sampler could do for it; where they turn into chemistry errors and
over-long strings instead, they are the language model's.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

from jax_scan_rnn import metrics
from jax_scan_rnn.checkpoint import CheckpointError
from jax_scan_rnn.cli import POSITIVE_INT
from jax_scan_rnn.data import smiles
from jax_scan_rnn.optional import require
from jax_scan_rnn.tasks import vae as vae_task
from call_overhead import machine  # this folder's scripts: the script's own directory is on sys.path
from timed_run import append_run, results_file

CLASSES = ("parentheses", "ring closure", "other syntax", "aromaticity", "valence", "other chemistry")
_BRACKET_ATOM = re.compile(r"\[[^\]]*\]")
_RING_BOND = re.compile(r"%\d\d|\d")


def invalid_class(text: str) -> str | None:
    """None for a valid SMILES (`metrics.validity`'s rule), else the first of `CLASSES` that rdkit's rejection fits."""
    from rdkit import Chem

    if text and smiles.parse_smiles(text) is not None:
        return None
    mol = Chem.MolFromSmiles(text, sanitize=False) if text else None
    if mol is None:
        outside = _BRACKET_ATOM.sub("", text)
        if outside.count("(") != outside.count(")"):
            return "parentheses"
        if any(n % 2 for n in Counter(_RING_BOND.findall(outside)).values()):
            return "ring closure"
        return "other syntax"
    try:
        Chem.SanitizeMol(mol)
    except (Chem.KekulizeException, Chem.AtomKekulizeException):
        return "aromaticity"
    except Chem.AtomValenceException:
        return "valence"
    except Exception:  # noqa: BLE001 - any other rejection is counted, not raised
        pass
    return "other chemistry"


def masked_sample(model, vocab: smiles.Vocabulary, n: int, *, max_len: int, seed: int, decoder_only: bool) -> list[str]:
    """`n` prior samples at temperature 1 with the syntax mask above: one jitted `lax.scan` over max_len steps.

    The decoder's step is the model's own (`gru_decoder.step` on `embed(token) + b_ih`, `h2o` readout, as
    `SeqVAE.generate`); the carry adds per row the open branches, the open ring-bond digits (a bit each) and
    whether a bracket atom is open.
    """
    if model.concat_z:
        raise SystemExit("--run: a model trained with --concat-z is not supported by this script's sampler")
    ids = {token: i for i, token in enumerate(vocab.tokens)}

    def table(chars, value=True, dtype=bool):
        out = np.zeros(vocab.size, dtype)
        for c in chars:
            if c in ids:
                out[ids[c]] = value if not callable(value) else value(c)
        return jnp.asarray(out)

    opens, closes, left, right = table("("), table(")"), table("["), table("]")
    ring_bit = table("123456789", lambda c: 1 << int(c), np.int32)
    decoder = model.gru_decoder
    w_tok = jnp.asarray(decoder.layers[0].w_ih[...])[: vocab.size]  # a jax array: indexed by traced ids
    b_ih = jnp.asarray(decoder.layers[0].b_ih[...])

    def run(z, key):
        def body(state, key_t):
            carries, token, depth, rings, bracket, after_open, t = state
            carries, h = decoder.step(carries, w_tok[token] + b_ih)
            logits = model.h2o(h)
            ban = closes[None] & ((depth == 0) | bracket | after_open)[:, None]
            ban |= (left[None] & bracket[:, None]) | (right[None] & ~bracket[:, None])
            ban = ban.at[:, smiles.EOS].set((depth > 0) | (rings != 0) | bracket | (t == 0))
            ban = ban.at[:, smiles.PAD].set(True).at[:, smiles.SOS].set(True)
            chosen = jnp.argmax(jnp.where(ban, -jnp.inf, logits) + jax.random.gumbel(key_t, logits.shape), -1)
            chosen = jnp.where(token == smiles.EOS, smiles.EOS, chosen).astype(jnp.int32)
            depth = depth + jnp.where(bracket, 0, opens[chosen].astype(jnp.int32) - closes[chosen].astype(jnp.int32))
            rings = jnp.where(bracket, rings, rings ^ ring_bit[chosen])
            bracket = jnp.where(left[chosen], True, jnp.where(right[chosen], False, bracket))
            return (carries, chosen, depth, rings, bracket, opens[chosen], t + 1), chosen

        zeros = jnp.zeros(z.shape[:1], jnp.int32)
        start = (decoder.unstack_state(model.initial_hidden(z)), jnp.full_like(zeros, smiles.SOS), zeros, zeros,
                 zeros.astype(bool), zeros.astype(bool), 0)
        tokens = jax.lax.scan(body, start, jax.random.split(key, max_len))[1].T  # [B, max_len]
        return jnp.where(jnp.cumsum(tokens == smiles.EOS, axis=1) > (tokens == smiles.EOS), smiles.PAD, tokens)

    key_z, key_g = jax.random.split(jax.random.key(seed))
    z = jax.random.normal(key_z, (n, model.latent_size), model.dtype)
    if decoder_only:
        z = jnp.zeros_like(z)
    return vocab.decode(np.asarray(jax.jit(run)(z, key_g)))


def summary(samples: list[str], max_len: int) -> dict:
    with smiles.silence_rdkit():
        classes = Counter(invalid_class(s) for s in samples)
    n = len(samples)
    return {
        "validity": classes[None] / n,  # invalid_class's None is metrics.validity's rule: counted once, not parsed twice
        "uniqueness": metrics.uniqueness(samples),
        "invalid": {c: classes[c] / n for c in CLASSES},
        "at_max_length": sum(len(s) >= max_len - 1 for s in samples) / n,  # strings that ran out of steps
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="a `jax-scan-rnn train vae` output directory")
    parser.add_argument("--samples", type=POSITIVE_INT, default=10_000, help="prior samples per sampler")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (both samplers)")
    parser.add_argument("--out", type=results_file, help="append the result to this JSON results file")
    args = parser.parse_args(argv)
    try:
        require("rdkit.Chem", "sorting invalid SMILES")
    except ImportError as err:
        parser.error(str(err))
    try:
        model, vocab, task = vae_task.load(args.run)
    except (CheckpointError, OSError, ValueError) as err:
        parser.error(f"--run {args.run}: {err}")
    max_len = task.max_length + 1
    plain = vae_task.sample(model, vocab, args.samples, max_len=max_len, seed=args.seed,
                            decoder_only=task.decoder_only)
    masked = masked_sample(model, vocab, args.samples, max_len=max_len, seed=args.seed,
                           decoder_only=task.decoder_only)
    result = {"run": args.run, "task": task.to_json(), "samples": args.samples, "seed": args.seed,
              "plain": summary(plain, max_len), "masked": summary(masked, max_len)}
    print(f"{'':10s} {'valid':>6s} {'unique':>6s} " + " ".join(f"{c:>15s}" for c in CLASSES) + "  at max length")
    for name in ("plain", "masked"):
        row = result[name]
        print(f"{name:10s} {row['validity']:6.3f} {row['uniqueness']:6.3f} "
              + " ".join(f"{row['invalid'][c]:15.3f}" for c in CLASSES) + f"  {row['at_max_length']:.3f}")
    if args.out:
        append_run(args.out, result, machine())
    return 0


if __name__ == "__main__":
    sys.exit(main())
