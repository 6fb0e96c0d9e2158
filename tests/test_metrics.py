"""Tests for the VAE metrics (jax_scan_rnn/metrics.py) on small hand-made examples."""

import math

import numpy as np
import pytest

pytest.importorskip("rdkit")

from jax_scan_rnn.metrics import (  # noqa: E402
    interpolate,
    kl_active_units,
    novelty,
    sequence_accuracy,
    token_accuracy,
    uniqueness,
    valid_canonical,
    validity,
)

# ---------------------------------------------------------------- MOSES sample metrics


def test_validity_counts_parsable_non_empty_strings():
    assert validity(["CCO", "C(", ""]) == pytest.approx(1 / 3)
    assert validity(["c1ccccc1", "C1CC", "CC(C)(C)(C)(C)C", "N#N"]) == pytest.approx(
        2 / 4
    )  # open ring, 5-valent C
    assert validity(["CCO", None]) == 0.5
    with pytest.raises(ValueError, match="smiles"):
        validity([])
    with pytest.raises(TypeError, match="smiles"):
        validity("CCO")


def test_rdkit_errors_are_silenced_and_logging_restored(capfd):
    validity(["C(", "c1cc", "C1CC"])
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    from rdkit import Chem

    Chem.MolFromSmiles("C(")
    assert "SMILES Parse Error" in capfd.readouterr().err


def test_valid_canonical_drops_invalid_and_canonicalises():
    assert valid_canonical(["OCC", "C(", "C(O)C", "c1ccccc1"]) == ["CCO", "CCO", "c1ccccc1"]


def test_uniqueness_is_over_the_first_k_valid_canonical_molecules():
    gen = ["CCO", "OCC", "C(", "c1ccccc1", "C1=CC=CC=C1", "CCN"]
    # valid canonical: CCO, CCO, c1ccccc1, c1ccccc1, CCN -> 3 distinct of 5
    assert uniqueness(gen) == pytest.approx(3 / 5)
    assert uniqueness(gen, k=2) == pytest.approx(1 / 2)  # the invalid "C(" is not among the k
    assert uniqueness(gen, k=3) == pytest.approx(2 / 3)
    assert uniqueness(gen, k=100) == pytest.approx(3 / 5)  # fewer than k valid: all of them
    assert math.isnan(uniqueness(["C(", ""]))
    with pytest.raises(ValueError, match="k"):
        uniqueness(gen, k=0)


def test_novelty_compares_canonical_forms():
    train = ["C(O)C", "c1ccccc1", "not a molecule"]
    gen = ["OCC", "CCO", "CCN", "C(", "NCC", "CCCC"]
    # distinct valid canonical generated: CCO, CCN, CCCC; CCO is in train (as "C(O)C")
    assert novelty(gen, train) == pytest.approx(2 / 3)
    # Told the training strings are canonical, "C(O)C" is compared as written (so CCO looks novel).
    assert novelty(gen, train, train_is_canonical=True) == pytest.approx(3 / 3)
    assert novelty(gen, ["CCO", "CCN", "CCCC"], train_is_canonical=True) == 0.0
    assert math.isnan(novelty(["C("], train))


# ---------------------------------------------------------------- reconstruction


def test_accuracies_ignore_padding():
    # Rows: sequence, <eos>=2, <pad>=0. Predictions differ from the target only under padding in row 0.
    target = np.array([[5, 6, 2, 0, 0], [7, 2, 0, 0, 0], [5, 5, 5, 6, 2]])
    predicted = np.array([[5, 6, 2, 9, 9], [7, 3, 1, 1, 1], [5, 5, 4, 6, 2]])
    # scored positions: 3 + 2 + 5 = 10; wrong: row 1's <eos>, row 2's third token
    assert token_accuracy(predicted, target) == pytest.approx(8 / 10)
    assert sequence_accuracy(predicted, target) == pytest.approx(1 / 3)
    assert token_accuracy(target, target) == 1.0 and sequence_accuracy(target, target) == 1.0
    mask = np.zeros_like(target, dtype=bool)
    mask[:, 0] = True  # only the first token of each row
    assert token_accuracy(predicted, target, mask) == 1.0
    assert sequence_accuracy(predicted, target, mask) == 1.0


def test_accuracy_arguments_are_checked():
    target = np.array([[5, 2, 0]])
    with pytest.raises(ValueError, match="predicted"):
        token_accuracy(np.array([[5, 2]]), target)
    with pytest.raises(ValueError, match="target"):
        sequence_accuracy(np.array([5, 2, 0]), np.array([5, 2, 0]))
    with pytest.raises(ValueError, match="mask"):
        token_accuracy(target, target, np.ones((1, 2), bool))
    with pytest.raises(ValueError, match="mask"):
        token_accuracy(target, target, np.zeros((1, 3), bool))


# ---------------------------------------------------------------- latent space


def test_active_units_count_dimensions_whose_mean_varies_across_inputs():
    rng = np.random.default_rng(0)
    mu = np.stack(
        [
            rng.normal(0.0, 1.0, 500),  # used
            rng.normal(0.0, 0.2, 500),  # variance 0.04 > 0.01: used
            rng.normal(0.0, 0.05, 500),  # variance 0.0025: collapsed
            np.full(500, 3.0),  # constant (however large): collapsed
        ],
        axis=1,
    )
    assert kl_active_units(mu) == 2
    assert kl_active_units(mu, threshold=0.001) == 3
    assert kl_active_units(np.zeros((10, 8))) == 0
    with pytest.raises(ValueError, match="mu"):
        kl_active_units(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="mu"):
        kl_active_units(np.zeros(4))


def test_interpolate_includes_both_ends():
    z_a = np.array([0.0, 1.0, -2.0], np.float32)
    z_b = np.array([1.0, 3.0, 2.0], np.float32)
    points = interpolate(z_a, z_b, 5)
    assert points.shape == (5, 3) and points.dtype == np.float32
    np.testing.assert_array_equal(points[0], z_a)
    np.testing.assert_array_equal(points[-1], z_b)
    np.testing.assert_allclose(points[2], (z_a + z_b) / 2)
    np.testing.assert_allclose(np.diff(points, axis=0), np.tile((z_b - z_a) / 4, (4, 1)), rtol=1e-6)
    with pytest.raises(ValueError, match="n"):
        interpolate(z_a, z_b, 1)
    with pytest.raises(ValueError, match="z_b"):
        interpolate(z_a, z_b[:2], 3)
