"""How good is a sequence VAE: MOSES sample metrics, reconstruction accuracy, latent usage.

Sample quality, computed as MOSES computes them (molecularsets/moses, `moses/metrics/metrics.py`):

    validity(smiles)          fraction that rdkit parses: non-empty, `MolFromSmiles` not None and
                              sanitisable (MOSES `fraction_valid`)
    uniqueness(smiles, k)     distinct canonical SMILES among the first k valid ones, divided by how
                              many those are (MOSES `unique@k` on `remove_invalid(gen)`)
    novelty(smiles, train)    fraction of the distinct valid canonical SMILES that are not in the
                              training set (MOSES `novelty`)

Reconstruction (numpy, on token ids): `token_accuracy` and `sequence_accuracy` over non-pad positions.
Latent space: `kl_active_units` (Burda et al. 2016) and `interpolate` (points between two codes).

rdkit is imported only inside the SMILES metrics, with its error log silenced while parsing.
Everything else runs on numpy (jax arrays are accepted and converted).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jax_scan_rnn import validate
from jax_scan_rnn.data.smiles import PAD, parse_smiles, silence_rdkit
from jax_scan_rnn.optional import require


def _check_smiles_list(smiles, name: str) -> list[str]:
    if isinstance(smiles, str | bytes):
        raise TypeError(f"{name}: expected a list of SMILES strings, got a single {type(smiles).__name__}")
    return list(smiles)


def validity(smiles: Sequence[str]) -> float:
    """Fraction of `smiles` that are valid molecules (MOSES `fraction_valid`).

    Valid: a non-empty string that `Chem.MolFromSmiles` parses and `Chem.SanitizeMol` accepts.
    Non-strings count as invalid. Raises ValueError on an empty list (the fraction is undefined).
    """
    smiles = _check_smiles_list(smiles, "smiles")
    if not smiles:
        raise ValueError("smiles: expected at least one string, got an empty list")
    with silence_rdkit():
        valid = sum(parse_smiles(s) is not None for s in smiles)
    return valid / len(smiles)


def valid_canonical(smiles: Sequence[str]) -> list[str]:
    """Canonical SMILES of the valid entries of `smiles`, in order, invalid ones dropped.

    This is MOSES's `remove_invalid(gen, canonize=True)`; the canonical form is
    `jax_scan_rnn.data.smiles.canonical_smiles`'s, the one the "rdkit" data source stores.
    """
    Chem = require("rdkit.Chem", "SMILES metrics")

    smiles = _check_smiles_list(smiles, "smiles")
    out = []
    with silence_rdkit():
        for s in smiles:
            mol = parse_smiles(s)
            if mol is not None:
                out.append(Chem.MolToSmiles(mol))
    return out


def uniqueness(smiles: Sequence[str], k: int | None = None) -> float:
    """unique@k: distinct canonical molecules among the first `k` valid ones, over their count.

    Invalid entries are dropped first (as MOSES does before `fraction_unique`). With fewer than `k`
    valid molecules all of them are used (MOSES warns there; this returns quietly), and `k=None`
    uses all. Returns nan when there is no valid molecule (the fraction is undefined).
    """
    k = validate.integer("k", k, lo=1, none=True)
    valid = valid_canonical(smiles)
    if k is not None:
        valid = valid[:k]
    if not valid:
        return float("nan")
    return len(set(valid)) / len(valid)


def novelty(smiles: Sequence[str], train: Sequence[str], *, train_is_canonical: bool = False) -> float:
    """Fraction of the distinct valid generated molecules that are not in `train` (MOSES `novelty`).

    Generated SMILES are canonicalised; so is `train` unless `train_is_canonical` (MOSES compares
    against the raw training strings, which its dataset stores canonically; canonicalising 1.6 M
    molecules takes minutes, so pass True when `train` came from the same rdkit's `Chem.MolToSmiles`).
    Invalid training entries are ignored. Returns nan when no generated molecule is valid.
    """
    generated = set(valid_canonical(smiles))
    train = _check_smiles_list(train, "train")
    train_set = set(train) if train_is_canonical else set(valid_canonical(train))
    if not generated:
        return float("nan")
    return len(generated - train_set) / len(generated)


def _prediction_arrays(predicted, target, mask):
    predicted, target = np.asarray(predicted), np.asarray(target)
    if target.ndim != 2:
        raise ValueError(f"target: expected a [B, T] array of token ids, got shape {target.shape}")
    if predicted.shape != target.shape:
        raise ValueError(f"predicted: expected shape {target.shape} (as target), got {predicted.shape}")
    if mask is None:
        mask = target != PAD
    else:
        mask = np.asarray(mask)
        if mask.shape != target.shape:
            raise ValueError(f"mask: expected shape {target.shape} (as target), got {mask.shape}")
        mask = mask.astype(bool)
    return predicted, target, mask


def token_accuracy(predicted, target, mask=None) -> float:
    """Fraction of scored positions where `predicted == target`.

    Args:
        predicted: [B, T] token ids (e.g. argmax of the decoder's logits [B, T, V]).
        target: [B, T] token ids: sequence, <eos>, <pad>... (docs/vae_spec.md).
        mask: [B, T] bool, True where a position is scored; None: `target != <pad>` (so each
            sequence's <eos> counts, padding does not).
    """
    predicted, target, mask = _prediction_arrays(predicted, target, mask)
    total = int(mask.sum())
    if total == 0:
        raise ValueError("mask: expected at least one scored position, got none")
    return int(((predicted == target) & mask).sum()) / total


def sequence_accuracy(predicted, target, mask=None) -> float:
    """Fraction of rows whose scored positions all match (exact reconstruction of a sequence).

    Arguments as `token_accuracy`; a row with no scored position counts as correct.
    """
    predicted, target, mask = _prediction_arrays(predicted, target, mask)
    if target.shape[0] == 0:
        raise ValueError("target: expected at least one row, got shape (0, T)")
    correct = ((predicted == target) | ~mask).all(axis=1)
    return float(correct.mean())


def kl_active_units(mu, threshold: float = 0.01) -> int:
    """Number of active latent units (Burda et al. 2016): Cov_x(E_q(z|x)[z]) > threshold per dimension.

    Args:
        mu: [N, Z] posterior means (the encoder's mu) over N inputs, N >= 2.
        threshold: a unit is active when the variance of its mean across inputs exceeds this.

    The variance is the unbiased sample variance over N (ddof=1, as in He et al. 2019's code).
    A unit the decoder ignores has its posterior collapse to the prior, mu ~ 0 for every input, so
    its variance is ~0; with posterior collapse every unit is inactive.
    """
    mu = np.asarray(mu, dtype=np.float64)
    if mu.ndim != 2 or mu.shape[0] < 2:
        raise ValueError(f"mu: expected a [N, Z] array with N >= 2, got shape {mu.shape}")
    validate.real("threshold", threshold, lo=0)
    return int((mu.var(axis=0, ddof=1) > threshold).sum())


def interpolate(z_a, z_b, n: int) -> np.ndarray:
    """n evenly spaced points on the segment from z_a to z_b, both ends included.

    Args:
        z_a, z_b: [Z] latent codes.
        n: number of points, >= 2.
    Returns:
        [n, Z]: row i is z_a + i / (n - 1) * (z_b - z_a); row 0 is z_a, row n - 1 is z_b.
    """
    z_a, z_b = np.asarray(z_a), np.asarray(z_b)
    if z_a.ndim != 1:
        raise ValueError(f"z_a: expected a [Z] vector, got shape {z_a.shape}")
    if z_b.shape != z_a.shape:
        raise ValueError(f"z_b: expected shape {z_a.shape} (as z_a), got {z_b.shape}")
    n = validate.integer("n", n, lo=2)
    dtype = np.result_type(z_a.dtype, z_b.dtype, np.float32)
    t = np.linspace(0.0, 1.0, n, dtype=dtype)[:, None]
    out = (1 - t) * z_a.astype(dtype) + t * z_b.astype(dtype)
    out[-1] = z_b  # exact end point
    return out
