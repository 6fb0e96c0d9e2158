"""benchmarks/vae_invalid.py: its classes of invalid SMILES, and that its syntax mask keeps the grammar's counts."""
from __future__ import annotations

import re
from collections import Counter

import pytest
from flax import nnx

pytest.importorskip("rdkit")

from jax_scan_rnn.data import smiles  # noqa: E402
from jax_scan_rnn.vae import SeqVAE  # noqa: E402

BENCHMARK_SCRIPT = "vae_invalid"  # the `script` fixture (conftest.py) imports it


@pytest.mark.parametrize("text, expected", [
    ("CCO", None),
    ("c1ccccc1", None),
    ("CC(C", "parentheses"),
    ("CC)C", "parentheses"),
    ("C1CC", "ring closure"),
    ("C[NH3+]1CC", "ring closure"),  # the digit inside the bracket atom is its H count, not a ring bond
    ("", "other syntax"),  # an empty string is not a molecule (MOSES's rule)
    ("C==C", "other syntax"),
    ("c1ccnc1", "aromaticity"),  # pyrrole without its [nH]
    ("CC(C)(C)(C)(C)C", "valence"),  # a carbon with five bonds
])
def test_invalid_class(script, text, expected):
    assert script.invalid_class(text) == expected


def test_masked_samples_keep_the_grammar_counts(script):
    """A random model writes random strings; with the mask, every string that ends before the length limit has
    its branches, ring bonds and bracket atoms closed, and no `)` opens a count below zero."""
    vocab = smiles.Vocabulary(smiles.SPECIAL_TOKENS + tuple(sorted("()[]123CNOc=H")))
    model = SeqVAE(vocab.size, 16, 4, 1, decoder_layers=2, rngs=nnx.Rngs(0))
    max_len = 24
    samples = script.masked_sample(model, vocab, 400, max_len=max_len, seed=0, decoder_only=False)
    finished = [s for s in samples if len(s) < max_len]
    assert len(finished) > 20, "the random model should end some strings before the limit"
    for text in samples:
        depth, bracket = 0, False
        for i, ch in enumerate(text):
            if ch == "[":
                assert not bracket, f"{text!r}: '[' inside a bracket atom at {i}"
                bracket = True
            elif ch == "]":
                assert bracket, f"{text!r}: ']' outside a bracket atom at {i}"
                bracket = False
            elif ch == ")" and not bracket:
                assert depth > 0 and text[i - 1] != "(", f"{text!r}: ')' with no branch open, or empty, at {i}"
                depth -= 1
            elif ch == "(" and not bracket:
                depth += 1
        if len(text) < max_len:
            outside = re.sub(r"\[[^\]]*\]", "", text)
            assert depth == 0 and not bracket and text, f"{text!r}: ended with a branch or bracket open"
            assert all(n % 2 == 0 for n in Counter(re.findall(r"\d", outside)).values()), (
                f"{text!r}: ended with a ring bond open")
