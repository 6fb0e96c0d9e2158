"""Tests for the VAE metrics (jax_scan_rnn/metrics.py) on small hand-made examples, and MOSES's metrics
against hand-computed values and against MOSES's own code."""

import importlib.util
import inspect
import math
import random
import sys
import types

import numpy as np
import pytest

pytest.importorskip("rdkit")

from jax_scan_rnn import metrics  # noqa: E402
from jax_scan_rnn.metrics import (  # noqa: E402
    MOSES_COLUMNS,
    MOSES_PUBLISHED,
    chemnet_activations,
    fcd,
    format_moses_table,
    fragment_similarity,
    frechet_distance,
    internal_diversity,
    interpolate,
    kl_active_units,
    morgan_fingerprints,
    moses_metrics,
    novelty,
    passes_filters,
    reference_set,
    scaffold_similarity,
    sequence_accuracy,
    snn,
    tanimoto,
    token_accuracy,
    uniqueness,
    valid_canonical,
    validity,
)

HAS_MOLSETS = importlib.util.find_spec("moses") is not None  # found without importing moses
HAS_FCD = importlib.util.find_spec("fcd_torch") is not None and importlib.util.find_spec("torch") is not None
needs_molsets = pytest.mark.skipif(not HAS_MOLSETS, reason="needs molsets (pip install --no-deps molsets)")
needs_fcd = pytest.mark.skipif(not HAS_FCD, reason="needs torch and fcd_torch (pip install --no-deps fcd_torch)")


@pytest.fixture
def removed_apis_restored(monkeypatch):
    """What MOSES's and fcd_torch's code (the references, both unmaintained) call that NumPy 2.5 and SciPy 1.18
    removed, put back for one test: pip gives Python 3.13 those versions, where 3.11 stops at NumPy 2.4, SciPy 1.17.

    - `np.row_stack`: an alias of `np.vstack` (fcd_torch's `get_predictions`).
    - `scipy.linalg.sqrtm(a, disp=False)`: returned the root and an error estimate (fcd_torch's
      `calculate_frechet_distance` discards the estimate).
    """
    if not hasattr(np, "row_stack"):
        monkeypatch.setattr(np, "row_stack", np.vstack, raising=False)
    from scipy import linalg

    sqrtm = linalg.sqrtm
    if "disp" not in inspect.signature(sqrtm).parameters:
        def sqrtm_with_disp(a, disp=True, **kwargs):
            root = sqrtm(a, **kwargs)
            if disp:
                return root
            return root, np.linalg.norm(root @ root - a, "fro") / np.linalg.norm(a, "fro")

        monkeypatch.setattr(linalg, "sqrtm", sqrtm_with_disp)


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


# ---------------------------------------------------------------- MOSES's headline metrics

# Drug-like molecules, most with a scaffold of two or more rings (Scaf counts only those), none repeated.
SMALL_SET = [
    "c1ccc2ccccc2c1", "c1ccc(-c2ccccc2)cc1", "O=C(Nc1ccccc1)c1ccccc1", "CC(=O)Nc1ccc(O)cc1",
    "Cc1ccc(S(N)(=O)=O)cc1", "O=C(O)CCc1ccccc1", "CCOC(=O)c1ccccc1", "c1ccc2[nH]ccc2c1",
    "CN1CCN(c2ccccc2)CC1", "O=C1CCc2ccccc2N1", "CCN(CC)C(=O)c1cccc(C)c1", "COc1ccc(CCN)cc1",
]
# Valid molecules that MOSES's filters reject, each for one reason (see test_filters_...).
FILTER_FAILURES = [
    "CC(C)=CC#N", "S=C1SC(=Cc2ccccc2)C(=O)N1", "Oc1ccccc1O", "C[N+](C)(C)C", "CP(C)C", "C1CCCCCCC1",
    "O=[N+]([O-])c1ccccc1", "Ic1ccccc1", "C[Si](C)(C)C",
]


def test_tanimoto_by_hand():
    bits = np.zeros((3, 70), np.uint8)  # 70 bits: two 64-bit words, the last one partly used
    bits[0, [0, 1, 2]] = 1
    bits[1, [1, 2, 3, 69]] = 1  # row 2 stays empty
    # |{1, 2}| / |{0, 1, 2, 3, 69}| = 2/5; an empty fingerprint: 0 against a non-empty one, 1 against an empty one
    np.testing.assert_allclose(tanimoto(bits, bits), [[1, 2 / 5, 0], [2 / 5, 1, 0], [0, 0, 1]])
    assert tanimoto(bits[:0], bits).shape == (0, 3)
    with pytest.raises(ValueError, match="b"):
        tanimoto(bits, bits[:, :64])
    with pytest.raises(ValueError, match="a"):
        tanimoto(bits[0], bits)


def test_morgan_tanimoto_of_ethanol_and_ethylamine_by_hand():
    # Morgan radius 2 of C-C-X sets one bit per atom at radius 0 (CH3, CH2, X) and one per atom at radius 1
    # (CH3 with its CH2; CH2 with CH3 and X; X with CH2); radius 2 only repeats radius 1's whole molecule,
    # which rdkit drops: 6 bits each. Shared: CH3 and CH2 at radius 0, CH3-with-CH2 at radius 1. 3 / (6 + 6 - 3).
    fps = morgan_fingerprints(["CCO", "CCN"])
    assert fps.shape == (2, 1024) and fps.dtype == np.uint8 and list(fps.sum(1)) == [6, 6]
    assert tanimoto(fps[:1], fps[1:])[0, 0] == pytest.approx(1 / 3)
    assert snn(["CCO"], ["CCN", "c1ccccc1"]) == pytest.approx(1 / 3)


def test_a_set_against_itself_scores_as_identical():
    assert snn(SMALL_SET, SMALL_SET) == 1.0
    assert snn(SMALL_SET[:3], SMALL_SET) == 1.0  # each is its own nearest neighbour
    assert fragment_similarity(SMALL_SET, SMALL_SET) == 1.0
    assert scaffold_similarity(SMALL_SET, SMALL_SET) == 1.0
    with pytest.raises(ValueError, match=r"generated\[1\]"):
        snn(["CCO", "C("], SMALL_SET)


def test_fragment_and_scaffold_cosines_by_hand():
    # Benzene and cyclohexane have no BRICS bond: each is one fragment. Counts (2, 1) against (1, 1).
    expected = 3 / math.sqrt(5 * 2)
    generated = ["c1ccccc1", "c1ccccc1", "C1CCCCC1"]
    assert fragment_similarity(generated, ["c1ccccc1", "C1CCCCC1"]) == pytest.approx(expected)
    # Methylnaphthalene's scaffold is naphthalene; biphenyl is its own. Same counts (2, 1) against (1, 1).
    generated = ["Cc1ccc2ccccc2c1", "c1ccc2ccccc2c1", "c1ccc(-c2ccccc2)cc1"]
    assert scaffold_similarity(generated, ["c1ccc2ccccc2c1", "c1ccc(-c2ccccc2)cc1"]) == pytest.approx(expected)
    # Scaffolds of fewer than 2 rings are not counted: no scaffold at all -> undefined.
    assert math.isnan(scaffold_similarity(["Cc1ccccc1", "CCO"], SMALL_SET))


def test_internal_diversity_by_hand():
    assert internal_diversity(["CCO"] * 4) == 0.0  # identical molecules
    assert internal_diversity(["CCO"] * 4, p=2) == 0.0
    # T = [[1, 1/3], [1/3, 1]], self-pairs included (MOSES): 1 - mean(1, 1/3, 1/3, 1) = 1/3
    assert internal_diversity(["CCO", "CCN"]) == pytest.approx(1 / 3)
    # IntDiv2 as MOSES's code computes it: 1 - mean over rows of sqrt(mean of the row's squares)
    assert internal_diversity(["CCO", "CCN"], p=2) == pytest.approx(1 - math.sqrt((1 + 1 / 9) / 2))
    assert internal_diversity(SMALL_SET, n_jobs=2) == pytest.approx(internal_diversity(SMALL_SET), abs=1e-15)
    with pytest.raises(ValueError, match="p"):
        internal_diversity(["CCO"], p=0)


@needs_molsets
def test_filters_reject_what_moses_rejects():
    assert passes_filters("CC(=O)Nc1ccc(O)cc1")  # paracetamol
    assert passes_filters("C1CCCCCC1")  # a ring of 7 is allowed
    assert all(passes_filters(s) for s in SMALL_SET)
    assert [passes_filters(s) for s in FILTER_FAILURES] == [False] * len(FILTER_FAILURES)
    # Why: MCF1 (acyclic C=C next to a nitrile); PAINS ene_rhod (a benzylidene rhodanine); PAINS catechol;
    # a charged N; P, then I, then Si are not allowed atoms; a ring of 8 atoms; a charged nitro group.
    assert not passes_filters("C(") and not passes_filters(None)
    with pytest.raises(TypeError, match="molecule"):
        passes_filters(3)


@needs_fcd
def test_frechet_distance_by_hand():
    # N(0, 1) against N(1, 4): (0 - 1)^2 + 1 + 4 - 2 sqrt(1 * 4) = 2
    assert frechet_distance([0.0], [[1.0]], [1.0], [[4.0]]) == pytest.approx(2.0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 64))  # fewer samples than dimensions: a singular covariance
    mu, sigma = x.mean(0), np.cov(x, rowvar=False)
    assert abs(frechet_distance(mu, sigma, mu, sigma)) < 1e-9
    with pytest.raises(ValueError, match="sigma2"):
        frechet_distance(mu, sigma, mu, sigma[:3, :3])
    with pytest.raises(ValueError, match="mu1"):
        frechet_distance(sigma, sigma, mu, sigma)
    with pytest.raises(ValueError, match=r"generated\[1\]"):
        fcd(["CCO", "C("], ["CCO", "CCN"])


@needs_fcd
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fcd_torch's np.row_stack, sqrtm's disp
def test_frechet_distance_and_chemnet_match_fcd_torch(removed_apis_restored):
    from fcd_torch import FCD, calculate_frechet_distance
    from fcd_torch.utils import get_one_hot

    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(300, 32)), rng.normal(size=(300, 32)) @ rng.normal(size=(32, 32)) * 0.3 + 0.1
    stats = (a.mean(0), np.cov(a, rowvar=False), b.mean(0), np.cov(b, rowvar=False))
    assert frechet_distance(*stats) == pytest.approx(calculate_frechet_distance(*stats), rel=1e-9)

    # ChemNet's reading of a SMILES: two-letter atoms, unknown symbols, stereo, the first fragment only, and
    # a string longer than its 349 symbols.
    strings = ["Clc1ccccc1Br", "C[C@@H](N)C(=O)O", "c1cc[nH]c1", "C.O", "C[Li]", "C[Si](C)(C)C", "C" * 400]
    expected = np.stack([get_one_hot(s, 350) / 35 for s in strings]).transpose(0, 2, 1).astype(np.float32)
    np.testing.assert_array_equal(metrics._chemnet_input(strings), expected)
    molecules = SMALL_SET[:6] + strings[:4]
    ours = chemnet_activations(molecules)
    theirs = FCD(device="cpu", n_jobs=1).get_predictions(molecules)
    assert ours.shape == (10, 512) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


@needs_fcd
def test_fcd_of_a_set_against_itself_is_zero():
    assert abs(fcd(SMALL_SET, SMALL_SET)) < 1e-9
    assert math.isnan(fcd(SMALL_SET[:1], SMALL_SET))  # one molecule has no covariance


@needs_fcd
@needs_molsets
def test_moses_metrics_of_a_set_against_itself():
    generated = SMALL_SET + ["C(", ""]
    row = moses_metrics(generated, train=SMALL_SET[:4], reference=SMALL_SET)
    assert list(row)[: len(MOSES_COLUMNS)] == list(MOSES_COLUMNS)
    assert row["valid"] == pytest.approx(12 / 14)
    assert row["unique@1k"] == row["unique@10k"] == 1.0
    assert abs(row["FCD/Test"]) < 1e-9
    assert row["SNN/Test"] == row["Frag/Test"] == row["Scaf/Test"] == 1.0
    assert row["IntDiv"] == pytest.approx(internal_diversity(SMALL_SET))
    assert row["IntDiv2"] == pytest.approx(internal_diversity(SMALL_SET, p=2))
    assert row["Filters"] == 1.0
    assert row["Novelty"] == pytest.approx(8 / 12)
    assert (row["n_generated"], row["n_valid"]) == (14, 12)
    assert row["reference"] == "held-out split, n=12" and row["train"] == "given set, n=4"
    # Training SMILES known to be canonical are compared as given (train vae's Kekulé runs keep them): the same
    # novelty; written otherwise, they would not match (a Kekulé form is not a canonical SMILES).
    from jax_scan_rnn.data.smiles import canonical_smiles

    canonical = [canonical_smiles(s) for s in SMALL_SET[:4]]
    assert moses_metrics(generated, canonical, SMALL_SET, train_is_canonical=True)["Novelty"] == pytest.approx(8 / 12)
    kekule = [canonical_smiles(s, kekule=True) for s in SMALL_SET[:4]]
    assert moses_metrics(generated, kekule, SMALL_SET)["Novelty"] == pytest.approx(8 / 12)
    # Duplicates count in every metric after "valid", as in MOSES: unique@k drops, Frag is no longer 1.
    row = moses_metrics(SMALL_SET + SMALL_SET[:3], reference=reference_set(SMALL_SET, name="itself"))
    assert row["unique@1k"] == pytest.approx(12 / 15)
    assert row["Frag/Test"] < 1.0 and row["SNN/Test"] == 1.0
    assert math.isnan(row["Novelty"]) and row["reference"] == "itself, n=12" and row["train"] == "none"


def test_moses_metrics_without_a_valid_molecule_is_nan_not_an_error():
    row = moses_metrics(["C(", "", "c1cc"], reference=SMALL_SET)
    assert row["valid"] == 0.0 and row["n_valid"] == 0
    assert all(math.isnan(row[column]) for column in MOSES_COLUMNS[1:])


def test_moses_metrics_arguments_are_checked():
    with pytest.raises(ValueError, match="generated"):
        moses_metrics([], reference=SMALL_SET)
    with pytest.raises(TypeError, match="generated"):
        moses_metrics("CCO", reference=SMALL_SET)
    with pytest.raises(ValueError, match="reference"):
        moses_metrics(["CCO"], reference="zinc")
    with pytest.raises(ValueError, match=r"reference\[1\]"):
        reference_set(["CCO", "C("])
    with pytest.raises(ValueError, match="reference"):
        reference_set([])
    with pytest.raises(ValueError, match="train"):
        moses_metrics(["CCO"], train="zinc", reference=SMALL_SET)
    with pytest.raises(ValueError, match="n_jobs"):
        moses_metrics(["CCO"], reference=SMALL_SET, n_jobs=0)
    with pytest.raises(TypeError, match="device"):
        moses_metrics(["CCO"], reference=SMALL_SET, device=0)


@needs_molsets
def test_moses_reference_is_molsets_precomputed_test_statistics():
    reference = reference_set("moses")
    assert reference.description.startswith("MOSES test set (molsets ")
    assert reference.fingerprints().shape == (176_074, 16)  # 1,024 bits as 16 words
    mu, sigma = reference.chemnet_gaussian()
    assert mu.shape == (512,) and sigma.shape == (512, 512)
    assert len(reference.fragments()) == 16_038 and len(reference.scaffolds()) == 77_114
    assert reference_set("moses") is reference and reference_set(reference) is reference


def test_format_moses_table_lists_our_rows_then_the_published_ones():
    row = {column: 0.5 for column in MOSES_COLUMNS if column != "Novelty"}
    row.update(n_generated=10, n_valid=9, reference="held-out split, n=12", train="none")
    text = format_moses_table({"ours": row})
    lines = text.splitlines()
    assert lines[0].split() == ["model", *MOSES_COLUMNS]
    assert lines[1].split() == ["ours"] + ["0.5000"] * 10 + ["-"]
    assert lines[2].split()[:3] == ["MOSES", "Train", "(published)"]
    assert "MOSES VAE (published)" in text and "0.9767" in text and "held-out split, n=12" in text
    assert "published" not in format_moses_table({"ours": row}, published=False)
    with pytest.raises(TypeError, match="rows"):
        format_moses_table([row])


def test_published_rows_have_every_column():
    for name, row in MOSES_PUBLISHED.items():
        assert list(row) == list(MOSES_COLUMNS), name
    # As the issue quotes them (rounded to 3 places).
    assert MOSES_PUBLISHED["MOSES VAE"]["FCD/Test"] == 0.099 and MOSES_PUBLISHED["MOSES CharRNN"]["Novelty"] == 0.8419


@pytest.fixture(scope="module")
def moses_code():
    """MOSES's own metrics code (molsets 0.3.1) and its test statistics.

    Importing it needs two stand-ins for what its dependencies have since removed: pandas 2 dropped
    DataFrame.append (moses/metrics/utils.py joins its MCF and PAINS tables with it) and rdkit dropped
    rdkit.six (MOSES's SA scorer imports iteritems from it). Both are in place only while importing.
    """
    if not (HAS_MOLSETS and HAS_FCD):
        pytest.skip("needs molsets, torch and fcd_torch")
    pd = pytest.importorskip("pandas")
    with pytest.MonkeyPatch.context() as patch:
        if not hasattr(pd.DataFrame, "append"):
            patch.setattr(pd.DataFrame, "append", lambda self, other, sort=False: pd.concat([self, other], sort=sort),
                          raising=False)
        if importlib.util.find_spec("rdkit.six") is None:
            six = types.ModuleType("rdkit.six")
            six.iteritems = lambda d: iter(d.items())
            patch.setitem(sys.modules, "rdkit.six", six)
        try:
            from moses.dataset import get_statistics
            from moses.metrics import metrics as moses_metrics_code
            from moses.metrics import utils as moses_utils
        except ImportError as err:
            pytest.skip(f"MOSES's metrics cannot be imported here: {err}")
    yield moses_metrics_code, moses_utils, get_statistics("test")
    # Forget MOSES's modules again: other tests check that the library reads molsets' files without them.
    for name in [n for n in sys.modules if n == "moses" or n.startswith("moses.")]:
        del sys.modules[name]


@pytest.mark.filterwarnings("ignore:Can't compute unique@", "ignore::DeprecationWarning")  # MOSES's, fcd_torch's
def test_moses_metrics_match_moses_own_code(moses_code, removed_apis_restored):
    code, utils, statistics = moses_code
    test_set = metrics._moses_smiles("test")
    rng = random.Random(0)
    # 115 SMILES (ChemNet costs ~10 ms a molecule on a CPU, twice here): MOSES test molecules, ones the filters
    # reject, small drug-like ones, invalid ones, duplicates.
    generated = rng.sample(test_set, 80) + FILTER_FAILURES + SMALL_SET + ["C(", "", "c1cc", "CC(C)(C)(C)(C)C"]
    generated += generated[:10]  # duplicates
    rng.shuffle(generated)
    train = valid_canonical(generated[:60])  # canonical: MOSES compares training strings as given
    ours = moses_metrics(generated, train, "moses")

    gen = code.remove_invalid(generated, canonize=True)
    mols = [utils.get_mol(s) for s in gen]
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as ours runs ChemNet with n_jobs=1 (torch's threads crawl on a busy CPU)
    try:
        their_gaussian = code.FCDMetric().precalc(gen)  # MOSES's ChemNet mean and covariance of gen
    finally:
        torch.set_num_threads(threads)
    # MOSES's own distance (scipy's sqrtm) took 10 s on a busy 2-core machine: ours is compared with it on
    # small matrices in test_frechet_distance_and_chemnet_match_fcd_torch, and applied here to MOSES's numbers.
    their_fcd = frechet_distance(their_gaussian["mu"], their_gaussian["sigma"], statistics["FCD"]["mu"],
                                 statistics["FCD"]["sigma"])
    theirs = {
        "valid": code.fraction_valid(generated),
        "unique@1k": code.fraction_unique(gen, 1000),
        "unique@10k": code.fraction_unique(gen, 10000),
        "FCD/Test": their_fcd,
        "SNN/Test": code.SNNMetric()(gen=mols, pref=statistics["SNN"]),
        "Frag/Test": code.FragMetric()(gen=mols, pref=statistics["Frag"]),
        "Scaf/Test": code.ScafMetric()(gen=mols, pref=statistics["Scaf"]),
        "IntDiv": code.internal_diversity(mols),
        "IntDiv2": code.internal_diversity(mols, p=2),
        "Filters": code.fraction_passes_filters(mols),
        "Novelty": code.novelty(mols, train),
    }
    # MOSES computes Tanimoto and ChemNet in float32 with torch: agreement to ~1e-7.
    assert {c: ours[c] for c in MOSES_COLUMNS} == pytest.approx(theirs, rel=1e-6, abs=1e-6)
    assert ours["Filters"] < 1 and ours["valid"] < 1 and ours["unique@1k"] < 1  # the checks had something to do

    from rdkit import Chem

    smarts = sorted(Chem.MolToSmarts(p) for p in metrics._filter_patterns())
    assert smarts == sorted(Chem.MolToSmarts(p) for p in utils._filters) and len(smarts) == 502


@needs_fcd
@needs_molsets
def test_fcd_of_a_moses_test_sample_against_moses_statistics_is_small():  # ~8 s: ChemNet on 2,000 molecules
    # A random sample: the test file is ordered, its first 2,000 molecules score 4.78.
    sample = random.Random(0).sample(metrics._moses_smiles("test"), 2000)
    # Measured 0.617 (rdkit 2026.09, torch 2.13, CPU), all of it the bias of estimating a 512-dimensional
    # covariance from 2,000 molecules (MOSES's training set scores 1.33 at 1,000, 0.13 at 10,000); a misread
    # input scores far more (one-hot symbols not scaled by 1/35: the squared distance of the means alone is 16.9).
    assert 0 < fcd(sample, "moses") < 1.0


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
    # The unbiased sample variance (ddof=1): of 0 and 0.2 it is 0.02 (the population's, ddof=0, is 0.01).
    assert kl_active_units(np.array([[0.0], [0.2]]), threshold=0.015) == 1
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
