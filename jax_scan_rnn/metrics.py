"""How good is a sequence VAE: MOSES sample metrics, reconstruction accuracy, latent usage.

Sample quality, computed as MOSES computes them (molsets 0.3.1: `moses/metrics/metrics.py`, `utils.py`
and fcd_torch's `fcd.py`; re-implemented here, checked against MOSES's own code in the tests):

    validity(smiles)          fraction that rdkit parses: non-empty, `MolFromSmiles` not None and
                              sanitisable (MOSES `fraction_valid`)
    uniqueness(smiles, k)     distinct canonical SMILES among the first k valid ones, divided by how
                              many those are (MOSES `unique@k` on `remove_invalid(gen)`)
    novelty(smiles, train)    fraction of the distinct valid canonical SMILES that are not in the
                              training set (MOSES `novelty`)

`moses_metrics(generated, train, reference)` gives MOSES's headline row. As MOSES's `get_all_metrics`,
it scores all generated SMILES for validity, then works on G, the canonical SMILES of the valid ones
(duplicates kept), and on a reference set R (MOSES's test set, or a list such as a held-out split):

    valid        validity(generated)
    unique@1k    distinct molecules among the first 1,000 of G, over their count (unique@10k: 10,000)
    FCD/Test     Frechet distance between Gaussians (mean, covariance) fitted to ChemNet's last-layer
                 activations of G and of R (fcd_torch's ChemNet weights): |mu_G - mu_R|^2 +
                 tr(S_G + S_R - 2 (S_G S_R)^(1/2))
    SNN/Test     mean over g in G of the largest Tanimoto similarity of g to a molecule of R (Morgan
                 fingerprints, radius 2, 1,024 bits; two empty fingerprints count as similarity 1)
    Frag/Test    cosine similarity of the BRICS-fragment count vectors of G and R
    Scaf/Test    cosine similarity of the Bemis-Murcko scaffold count vectors of G and R (only
                 scaffolds with at least 2 rings are counted)
    IntDiv       1 - mean over all ordered pairs (g, g') of G, g' = g included, of Tanimoto(g, g')
    IntDiv2      1 - mean over g of sqrt(mean over g' of Tanimoto(g, g')^2) (MOSES's code; the paper
                 writes the root outside the mean over g)
    Filters      fraction of G that `passes_filters`: no ring of 8 or more atoms, no charged atom,
                 only C, N, S, O, F, Cl, Br, H, no match of MOSES's MCF or PAINS SMARTS
    Novelty      fraction of the distinct molecules of G that are not in the training set

`reference_set("moses")` reads MOSES's precomputed test statistics (`test_stats.npz` from the molsets
package: ChemNet mean and covariance, the fingerprints, the fragment and scaffold counts), as MOSES
does; a list of SMILES is summarised the same way. `MOSES_PUBLISHED` holds MOSES's published rows and
`format_moses_table` prints ours next to them. Each building block (`fcd`, `snn`, `fragment_similarity`,
`scaffold_similarity`, `internal_diversity`, `passes_filters`, `morgan_fingerprints`, `tanimoto`,
`chemnet_activations`, `frechet_distance`) can be called on its own.

Reconstruction (numpy, on token ids): `token_accuracy` and `sequence_accuracy` over non-pad positions.
Latent space: `kl_active_units` (Burda et al. 2016) and `interpolate` (points between two codes).

rdkit, torch and fcd_torch are imported only inside the functions that need them, rdkit with its
error log silenced while parsing. MOSES's data (the test set's statistics, the training set, the MCF
and PAINS SMARTS) is read from the molsets package's files without importing `moses` (whose own
imports fail with current pandas and rdkit): `pip install --no-deps molsets fcd_torch`.
Everything else runs on numpy (jax arrays are accepted and converted).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import gzip
import importlib.metadata
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from jax_scan_rnn import validate
from jax_scan_rnn.data.smiles import PAD, parse_smiles, silence_rdkit
from jax_scan_rnn.data.smiles.sources import molsets_file
from jax_scan_rnn.optional import require


def validity(smiles: Sequence[str]) -> float:
    """Fraction of `smiles` that are valid molecules (MOSES `fraction_valid`).

    Valid: a non-empty string that `Chem.MolFromSmiles` parses and `Chem.SanitizeMol` accepts.
    Non-strings count as invalid. Raises ValueError on an empty list (the fraction is undefined).
    """
    smiles = validate.strings("smiles", smiles, each=False)
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
    smiles = validate.strings("smiles", smiles, each=False)
    with silence_rdkit():
        return [Chem.MolToSmiles(mol) for mol in map(parse_smiles, smiles) if mol is not None]


def uniqueness(smiles: Sequence[str], k: int | None = None) -> float:
    """unique@k: distinct canonical molecules among the first `k` valid ones, over their count.

    Invalid entries are dropped first (as MOSES does before `fraction_unique`). With fewer than `k`
    valid molecules all of them are used (MOSES warns there; this returns quietly), and `k=None`
    uses all. Returns nan when there is no valid molecule (the fraction is undefined).
    """
    k = validate.integer("k", k, lo=1, none=True)
    valid = valid_canonical(smiles)[:k]  # k=None: all
    if not valid:
        return float("nan")
    return len(set(valid)) / len(valid)


def novelty(smiles: Sequence[str], train: Sequence[str], *, train_is_canonical: bool = False) -> float:
    """Fraction of the distinct valid generated molecules that are not in `train` (MOSES `novelty`).

    Generated SMILES are canonicalised; so is `train` unless `train_is_canonical` (MOSES compares
    against the raw training strings, which its dataset stores canonically; canonicalising 1.6 M
    molecules takes minutes, so pass True when `train` came from the same rdkit's `Chem.MolToSmiles`).
    Invalid training entries are ignored. Returns nan when no generated molecule is valid. Only `train` counts:
    a sample that reproduces a held-out (validation or test) molecule is novel, as in MOSES.
    """
    generated = set(valid_canonical(smiles))
    train = validate.strings("train", train, each=False)
    train_set = set(train) if train_is_canonical else set(valid_canonical(train))
    if not generated:
        return float("nan")
    return len(generated - train_set) / len(generated)


# ================================================================================ MOSES's headline metrics

MOSES_COLUMNS = ("valid", "unique@1k", "unique@10k", "FCD/Test", "SNN/Test", "Frag/Test", "Scaf/Test",
                 "IntDiv", "IntDiv2", "Filters", "Novelty")

# MOSES's published rows: the README of molecularsets/moses (master, commit dd7ed6a), which gives each value
# as the mean +- standard deviation over MOSES's runs (it asks for at least 30,000 samples); the means are kept.
# "MOSES Train" is MOSES's training set scored as if generated; its Novelty of 1.0 is copied as printed
# there (the training set's novelty against itself would be 0).
MOSES_PUBLISHED: dict[str, dict[str, float]] = {
    "MOSES Train": {
        "valid": 1.0, "unique@1k": 1.0, "unique@10k": 1.0, "FCD/Test": 0.008, "SNN/Test": 0.6419,
        "Frag/Test": 1.0, "Scaf/Test": 0.9907, "IntDiv": 0.8567, "IntDiv2": 0.8508, "Filters": 1.0,
        "Novelty": 1.0,
    },
    "MOSES CharRNN": {
        "valid": 0.9748, "unique@1k": 1.0, "unique@10k": 0.9994, "FCD/Test": 0.0732, "SNN/Test": 0.6015,
        "Frag/Test": 0.9998, "Scaf/Test": 0.9242, "IntDiv": 0.8562, "IntDiv2": 0.8503, "Filters": 0.9943,
        "Novelty": 0.8419,
    },
    "MOSES VAE": {
        "valid": 0.9767, "unique@1k": 1.0, "unique@10k": 0.9984, "FCD/Test": 0.099, "SNN/Test": 0.6257,
        "Frag/Test": 0.9994, "Scaf/Test": 0.9386, "IntDiv": 0.8558, "IntDiv2": 0.8498, "Filters": 0.997,
        "Novelty": 0.6949,
    },
}

_UNIQUE_AT = {"unique@1k": 1_000, "unique@10k": 10_000}
_MORGAN_RADIUS, _MORGAN_BITS = 2, 1024
_SCAFFOLD_MIN_RINGS = 2  # MOSES's compute_scaffolds default: scaffolds with fewer rings are not counted
_FILTER_ATOMS = frozenset({"C", "N", "S", "O", "F", "Cl", "Br", "H"})
_FILTER_RING_SIZE = 8  # a ring of this many atoms or more fails the filters
# ChemNet's input (fcd_torch's get_one_hot): these symbols, "X" for any other, "." ends the string; a
# character followed by r, i or l is read together with it ("Cl", "Br", "Si"; "Li" is an unknown "X").
_CHEMNET_SYMBOLS = ("C", "N", "O", "H", "F", "Cl", "P", "B", "Br", "S", "I", "Si", "#", "(", ")", "+", "-",
                    "1", "2", "3", "4", "5", "6", "7", "8", "=", "[", "]", "@", "c", "n", "o", "s", "X", ".")
_CHEMNET_INDEX = {symbol: i for i, symbol in enumerate(_CHEMNET_SYMBOLS)}
_CHEMNET_LENGTH = 350  # positions per string: at most 349 symbols, then the end mark
_CHEMNET_BATCH = 512
_ROW_BLOCK, _COLUMN_BLOCK = 32, 16_384  # Tanimoto blocks: [32, 16384] similarities at a time


def _chem():
    return require("rdkit.Chem", "MOSES metrics")


def _molsets_file(*parts: str) -> str:
    path = molsets_file(*parts)
    if path is None:
        raise ImportError(f"MOSES's data (moses/{'/'.join(parts)}) needs molsets, which is not installed: "
                          "pip install --no-deps molsets (only its data files are read)")
    return path


def _molsets_version() -> str:
    try:
        return importlib.metadata.version("molsets")
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def _moses_smiles(split: str) -> list[str]:
    """The SMILES column of molsets' `moses/dataset/data/<split>.csv.gz`, as stored."""
    with gzip.open(_molsets_file("dataset", "data", f"{split}.csv.gz"), "rt", encoding="utf-8", newline="") as f:
        return [row["SMILES"] for row in csv.DictReader(f)]


def _molecules(items, name: str) -> list:
    """rdkit Mols of `items` (SMILES strings or Mols); an invalid entry is a ValueError naming it."""
    Chem = _chem()
    items = validate.strings(name, items, each=False)
    mols = []
    with silence_rdkit():
        for i, item in enumerate(items):
            mol = item if isinstance(item, Chem.Mol) else parse_smiles(item)
            if mol is None:
                raise ValueError(f"{name}[{i}]: expected a valid molecule (SMILES or rdkit Mol), got {item!r}")
            mols.append(mol)
    return mols


# -------------------------------------------------------------- fingerprints and Tanimoto similarity


def morgan_fingerprints(molecules) -> np.ndarray:
    """[N, 1024] uint8 of 0/1: Morgan fingerprints, radius 2, folded to 1,024 bits (MOSES's `fingerprints`)."""
    generator = require("rdkit.Chem.rdFingerprintGenerator", "MOSES metrics").GetMorganGenerator(
        radius=_MORGAN_RADIUS, fpSize=_MORGAN_BITS)
    mols = _molecules(molecules, "molecules")
    bits = np.zeros((len(mols), _MORGAN_BITS), np.uint8)
    for i, mol in enumerate(mols):
        bits[i] = generator.GetFingerprintAsNumPy(mol)
    return bits


def _pack(bits, name: str) -> np.ndarray:
    """[N, B] 0/1 fingerprints -> [N, ceil(B / 64)] uint64 words, for popcount arithmetic."""
    bits = np.asarray(bits)
    if bits.ndim != 2:
        raise ValueError(f"{name}: expected a [N, bits] array of 0/1 fingerprints, got shape {bits.shape}")
    packed = np.packbits(bits != 0, axis=1)
    packed = np.pad(packed, ((0, 0), (0, -packed.shape[1] % 8)))
    return np.ascontiguousarray(packed).view(np.uint64)


def _tanimoto_block(a, a_counts, b_words, b_counts) -> np.ndarray:
    """[len(a), m] Tanimoto of packed rows `a` [n, W] with the columns of `b_words` [W, m]; 0/0 counts as 1."""
    inter = np.bitwise_count(a[:, 0, None] & b_words[0]).astype(np.int32)  # numpy >= 2.0 (as jax needs)
    for w in range(1, a.shape[1]):
        inter += np.bitwise_count(a[:, w, None] & b_words[w])
    union = a_counts[:, None] + b_counts[None, :] - inter
    return np.divide(inter, union, out=np.ones(union.shape), where=union > 0)


def _fold_tanimoto(a, b, n_jobs: int, start, fold) -> list:
    """Visit the Tanimoto matrix of packed `a` against packed `b` block by block, never whole: for each
    block of rows of `a`, state = start(rows), then state = fold(state, block) over the blocks of `b`.
    Returns the states in row order; `n_jobs` threads share the row blocks (numpy releases the GIL)."""
    a_counts = np.bitwise_count(a).sum(1, dtype=np.int32)
    b_counts = np.bitwise_count(b).sum(1, dtype=np.int32)
    b_words = np.ascontiguousarray(b.T)

    def rows(i):
        rows_a, counts_a = a[i:i + _ROW_BLOCK], a_counts[i:i + _ROW_BLOCK]
        state = start(len(rows_a))
        for j in range(0, len(b), _COLUMN_BLOCK):
            columns = slice(j, j + _COLUMN_BLOCK)
            state = fold(state, _tanimoto_block(rows_a, counts_a, b_words[:, columns], b_counts[columns]))
        return state

    firsts = range(0, len(a), _ROW_BLOCK)
    if n_jobs == 1:
        return [rows(i) for i in firsts]
    with ThreadPoolExecutor(n_jobs) as pool:
        return list(pool.map(rows, firsts))


def tanimoto(a, b) -> np.ndarray:
    """[N, M] Tanimoto similarities |a_i & b_j| / |a_i | b_j| of 0/1 fingerprints `a` [N, bits] and `b`
    [M, bits] (e.g. `morgan_fingerprints`); two empty fingerprints have similarity 1 (as in MOSES)."""
    a_words, b_words = _pack(a, "a"), _pack(b, "b")
    if np.shape(a)[1] != np.shape(b)[1]:
        raise ValueError(f"b: expected fingerprints of {np.shape(a)[1]} bits (as a), got {np.shape(b)[1]}")
    if len(a_words) == 0 or len(b_words) == 0:
        return np.zeros((len(a_words), len(b_words)))
    rows = _fold_tanimoto(a_words, b_words, 1, lambda n: [], lambda blocks, block: [*blocks, block])
    return np.concatenate([np.concatenate(blocks, axis=1) for blocks in rows])


def _nearest_similarity(gen_words, ref_words, n_jobs: int) -> float:
    """Mean over the rows of `gen_words` of their largest Tanimoto to a row of `ref_words` (nan if none)."""
    if len(gen_words) == 0:
        return float("nan")
    best = _fold_tanimoto(gen_words, ref_words, n_jobs, np.zeros, lambda best, block: np.maximum(best, block.max(1)))
    return float(np.concatenate(best).mean())


def _internal_diversities(words, powers: Sequence[float], n_jobs: int) -> list[float]:
    """IntDiv_p for each p in `powers`: 1 - mean over rows of (mean over all rows of Tanimoto^p)^(1/p)."""
    if len(words) == 0:
        return [float("nan")] * len(powers)

    def fold(state, block):
        return state + np.stack([(block ** p).sum(1) for p in powers], axis=1)

    sums = np.concatenate(_fold_tanimoto(words, words, n_jobs, lambda n: np.zeros((n, len(powers))), fold))
    means = sums / len(words)
    return [float(1 - (means[:, k] ** (1 / p)).mean()) for k, p in enumerate(powers)]


# -------------------------------------------------------------- fragments, scaffolds, filters


def _fragment_counts(mols) -> Counter:
    """BRICS fragments (canonical SMILES, with their [n*] attachment points) of `mols`, counted."""
    Chem = _chem()
    counts = Counter()
    for mol in mols:
        counts.update(Chem.MolToSmiles(Chem.FragmentOnBRICSBonds(mol)).split("."))
    return counts


def _scaffold_counts(mols) -> Counter:
    """Bemis-Murcko scaffolds (canonical SMILES) of `mols` with at least 2 rings, counted."""
    Chem = _chem()
    MurckoScaffold = require("rdkit.Chem.Scaffolds.MurckoScaffold", "MOSES metrics")
    counts = Counter()
    for mol in mols:
        try:
            scaffold = MurckoScaffold.GetScaffoldForMol(mol)
        except (ValueError, RuntimeError):
            continue
        smiles = Chem.MolToSmiles(scaffold)
        if smiles and scaffold.GetRingInfo().NumRings() >= _SCAFFOLD_MIN_RINGS:
            counts[smiles] += 1
    return counts


def _count_cosine(a: Counter, b: Counter) -> float:
    """Cosine similarity of two count vectors given as {key: count} (absent keys count 0); nan if one is empty."""
    if not a or not b:
        return float("nan")
    dot = float(sum(count * b[key] for key, count in a.items() if key in b))
    squares = float(sum(c * c for c in a.values())) * float(sum(c * c for c in b.values()))
    return min(dot / math.sqrt(squares), 1.0)  # MOSES's scipy cosine distance is clipped to [0, 2]


@functools.lru_cache(maxsize=1)
def _filter_patterns() -> tuple:
    """The MCF and PAINS SMARTS of molsets' `moses/metrics/mcf.csv` and `wehi_pains.csv`, compiled."""
    Chem = _chem()
    mcf = _molsets_file("metrics", "mcf.csv")
    pains = _molsets_file("metrics", "wehi_pains.csv")
    with open(mcf, encoding="utf-8", newline="") as f:
        rows = [(mcf, row["smarts"]) for row in csv.DictReader(f)]  # columns: names, smarts
    with open(pains, encoding="utf-8", newline="") as f:
        rows += [(pains, row[0]) for row in csv.reader(f) if row]  # no header: smarts, name
    patterns = []
    for path, smarts in rows:
        pattern = Chem.MolFromSmarts(smarts.strip())
        if pattern is None:
            raise ValueError(f"{path}: rdkit cannot read the SMARTS {smarts.strip()!r}")
        patterns.append(pattern)
    return tuple(patterns)


def passes_filters(molecule) -> bool:
    """Whether `molecule` (a SMILES string or rdkit Mol) passes MOSES's filters (`mol_passes_filters`).

    It fails when it is not a valid molecule, has a ring of 8 or more atoms, a formally charged atom, an
    atom other than C, N, S, O, F, Cl, Br, H, matches one of MOSES's MCF or PAINS SMARTS (matched with
    explicit hydrogens), or when its non-isomeric SMILES is empty or does not parse back.
    """
    Chem = _chem()
    with silence_rdkit():
        if isinstance(molecule, str):
            mol = parse_smiles(molecule)
        elif molecule is None or isinstance(molecule, Chem.Mol):
            mol = molecule
        else:
            raise TypeError(f"molecule: expected a SMILES string or an rdkit Mol, got {type(molecule).__name__}")
        if mol is None:
            return False
        if any(len(ring) >= _FILTER_RING_SIZE for ring in mol.GetRingInfo().AtomRings()):
            return False
        if any(atom.GetFormalCharge() != 0 or atom.GetSymbol() not in _FILTER_ATOMS for atom in mol.GetAtoms()):
            return False
        with_hydrogens = Chem.AddHs(mol)
        if any(with_hydrogens.HasSubstructMatch(pattern) for pattern in _filter_patterns()):
            return False
        smiles = Chem.MolToSmiles(mol, isomericSmiles=False)
        return bool(smiles) and Chem.MolFromSmiles(smiles) is not None


# -------------------------------------------------------------- ChemNet and the Frechet distance


def _chemnet_symbols(smiles: str) -> list[int]:
    """ChemNet's symbol ids of `smiles`: read up to the first "." (or 349 symbols), then the end mark."""
    text = smiles + "."
    ids, i = [], 0
    while text[i] != "." and len(ids) < _CHEMNET_LENGTH - 1:
        width = 2 if text[i + 1] in "ril" else 1
        ids.append(_CHEMNET_INDEX.get(text[i:i + width], _CHEMNET_INDEX["X"]))
        i += width
    ids.append(_CHEMNET_INDEX["."])
    return ids


def _chemnet_input(strings: Sequence[str]) -> np.ndarray:
    """[B, 35, 350] float32: one-hot symbols (scaled by 1/35, as fcd_torch feeds them), zeros after the end."""
    x = np.zeros((len(strings), len(_CHEMNET_SYMBOLS), _CHEMNET_LENGTH), np.float32)
    for row, smiles in enumerate(strings):
        ids = _chemnet_symbols(smiles)
        x[row, ids, np.arange(len(ids))] = 1 / len(_CHEMNET_SYMBOLS)
    return x


@contextlib.contextmanager
def _torch_threads(torch, n: int):
    """torch's CPU threads set to `n` inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def _chemnet_model(device: str):
    """fcd_torch's ChemNet (the weights its wheel ships, nothing downloaded), in eval mode on `device`."""
    torch = require("torch", "FCD/Test")
    utils = require("fcd_torch.utils", "FCD/Test")
    path = os.path.join(os.path.dirname(utils.__file__), "ChemNet_v0.13_pretrained.pt")
    layers = torch.load(path, map_location="cpu", weights_only=True)
    return utils.load_imported_model(layers).eval().to(device)


def _chemnet(strings: Sequence[str], device: str, n_jobs: int) -> np.ndarray:
    """[N, 512] float32 ChemNet activations of `strings` as written; each distinct string is run once.

    torch runs on `n_jobs` CPU threads for the call (its setting is restored after): ChemNet's LSTM steps
    are small, and torch's threads slow to a crawl when other work holds a core (on 2 shared cores, 512
    molecules took 1.7 s on 1 thread and 4 s on 2).
    """
    if not strings:
        return np.zeros((0, 512), np.float32)
    torch = require("torch", "FCD/Test")
    model = _chemnet_model(device)
    position: dict[str, int] = {}
    order = [position.setdefault(s, len(position)) for s in strings]
    distinct = list(position)
    out = np.zeros((len(distinct), 512), np.float32)
    with _torch_threads(torch, n_jobs), torch.no_grad():
        for i in range(0, len(distinct), _CHEMNET_BATCH):
            x = torch.from_numpy(_chemnet_input(distinct[i:i + _CHEMNET_BATCH])).to(device)
            out[i:i + len(x)] = model(x).cpu().numpy()
    return out[np.asarray(order, dtype=np.int64)]


def chemnet_activations(molecules, *, device: str = "cpu", n_jobs: int = 1) -> np.ndarray:
    """[N, 512] float32: ChemNet's last-layer activations of each molecule (SMILES or rdkit Mol), read as
    rdkit's canonical SMILES (fcd_torch's `get_predictions` with canonize=True).

    `device`: a torch device ("cpu", "cuda:0"); `n_jobs`: torch's CPU threads for the call.
    """
    validate.instance("device", device, str)
    n_jobs = validate.integer("n_jobs", n_jobs, lo=1)
    Chem = _chem()
    return _chemnet([Chem.MolToSmiles(mol) for mol in _molecules(molecules, "molecules")], device, n_jobs)


def _gaussian(activations: np.ndarray):
    """(mean, covariance) of activations [N, 512], N >= 2; None for fewer (the covariance is undefined)."""
    if len(activations) < 2:
        return None
    activations = activations.astype(np.float64)
    return activations.mean(0), np.cov(activations, rowvar=False)


def frechet_distance(mu1, sigma1, mu2, sigma2, *, n_jobs: int = 1) -> float:
    """Frechet distance of N(mu1, sigma1) and N(mu2, sigma2): |mu1 - mu2|^2 + tr(sigma1 + sigma2 -
    2 (sigma1 sigma2)^(1/2)) (fcd_torch's `calculate_frechet_distance`).

    The trace of (sigma1 sigma2)^(1/2) is computed as the sum of the singular values of
    sigma1^(1/2) sigma2^(1/2) (their squares are the eigenvalues of sigma1 sigma2): real, and accurate
    when a covariance is singular, as it is from fewer samples than dimensions. The decompositions run
    in torch on `n_jobs` threads: numpy's threaded OpenBLAS took 4 s instead of 0.04 s for one 512 x 512
    eigendecomposition on 2 cores that other work was using.
    """
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    sigma1, sigma2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    if mu1.ndim != 1:
        raise ValueError(f"mu1: expected a [D] vector, got shape {mu1.shape}")
    d = mu1.shape[0]
    for name, value, shape in (("sigma1", sigma1, (d, d)), ("mu2", mu2, (d,)), ("sigma2", sigma2, (d, d))):
        if value.shape != shape:
            raise ValueError(f"{name}: expected shape {shape} (from mu1), got {value.shape}")
    n_jobs = validate.integer("n_jobs", n_jobs, lo=1)
    torch = require("torch", "frechet_distance")

    def root(matrix):  # the symmetric square root of a covariance (negative rounding noise clipped)
        values, vectors = torch.linalg.eigh(torch.from_numpy((matrix + matrix.T) / 2))
        return (vectors * values.clamp(min=0).sqrt()) @ vectors.T

    with _torch_threads(torch, n_jobs):
        trace_root = float(torch.linalg.svdvals(root(sigma1) @ root(sigma2)).sum())
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * trace_root)


# -------------------------------------------------------------- the reference set


class Reference:
    """A reference set summarised for the Test metrics, as MOSES precomputes it ("precalc"): packed Morgan
    fingerprints (SNN), BRICS fragment counts (Frag), scaffold counts (Scaf), ChemNet Gaussian (FCD).

    Made by `reference_set`. For MOSES's test set every summary is read from molsets' `test_stats.npz`;
    for a list of molecules each is computed on first use and kept.
    """

    def __init__(self, description: str, *, molecules: list | None = None, summaries: dict | None = None):
        self.description = description
        self._molecules = molecules
        self._summaries = dict(summaries or {})

    def __repr__(self) -> str:
        return f"Reference({self.description!r})"

    def _summary(self, key: str, compute):
        if key not in self._summaries:
            self._summaries[key] = compute(self._molecules)
        return self._summaries[key]

    def fingerprints(self) -> np.ndarray:
        """[N, 16] uint64: the reference's Morgan fingerprints (radius 2, 1,024 bits), packed."""
        return self._summary("fingerprints", lambda mols: _pack(morgan_fingerprints(mols), "reference"))

    def fragments(self) -> Counter:
        """BRICS fragment SMILES -> count over the reference."""
        return self._summary("fragments", _fragment_counts)

    def scaffolds(self) -> Counter:
        """Scaffold SMILES (>= 2 rings) -> count over the reference."""
        return self._summary("scaffolds", _scaffold_counts)

    def chemnet_gaussian(self, device: str = "cpu", n_jobs: int = 1):
        """(mean [512], covariance [512, 512]) of ChemNet's activations; None with fewer than 2 molecules."""
        return self._summary("fcd", lambda mols: _gaussian(chemnet_activations(mols, device=device, n_jobs=n_jobs)))


@functools.lru_cache(maxsize=1)
def _moses_test_reference() -> Reference:
    path = _molsets_file("dataset", "data", "test_stats.npz")
    # molsets' own file: a pickled dict of numpy arrays and Counters, read the way MOSES reads it.
    with np.load(path, allow_pickle=True) as data:
        stats = data["stats"].item()
    return Reference(f"MOSES test set (molsets {_molsets_version()})", summaries={
        "fingerprints": _pack(stats["SNN"]["fps"], "test_stats.npz"),
        "fragments": Counter(stats["Frag"]["frag"]),
        "scaffolds": Counter(stats["Scaf"]["scaf"]),
        "fcd": (np.asarray(stats["FCD"]["mu"], np.float64), np.asarray(stats["FCD"]["sigma"], np.float64)),
    })


def reference_set(reference="moses", *, name: str = "held-out split") -> Reference:
    """The set the Test metrics compare against.

    Args:
        reference: "moses" (MOSES's test set, 176,074 molecules, with the statistics MOSES precomputed;
            needs `pip install --no-deps molsets`), a list of valid SMILES (e.g. our held-out split), or a
            `Reference` (returned as it is). The MOSES reference is read once per process. (MOSES's test
            file is ordered: a part of it scored against the whole should be a random sample, not its
            first rows, whose FCD is 4.8 at 2,000 molecules against 0.6 for a random 2,000.)
        name: what a list is called in `Reference.description` ("<name>, n=<count>").
    """
    if isinstance(reference, Reference):
        return reference
    if isinstance(reference, str):
        if reference != "moses":
            raise ValueError(f"reference: expected 'moses', a list of SMILES or a Reference, got {reference!r}")
        return _moses_test_reference()
    mols = _molecules(reference, "reference")
    if not mols:
        raise ValueError("reference: expected at least one molecule, got an empty list")
    return Reference(f"{name}, n={len(mols)}", molecules=mols)


# -------------------------------------------------------------- each metric on its own


def fcd(generated, reference="moses", *, device: str = "cpu", n_jobs: int = 1) -> float:
    """FCD/Test: Frechet ChemNet distance of the valid molecules `generated` to `reference`; nan when either
    has fewer than 2 molecules (as fcd_torch). `device`, `n_jobs`: as `chemnet_activations`."""
    reference = reference_set(reference)
    activations = chemnet_activations(_molecules(generated, "generated"), device=device, n_jobs=n_jobs)
    return _fcd(activations, reference, device, n_jobs)


def _fcd(activations: np.ndarray, reference: Reference, device: str, n_jobs: int) -> float:
    ours = _gaussian(activations)
    theirs = None if ours is None else reference.chemnet_gaussian(device, n_jobs)
    if ours is None or theirs is None:
        return float("nan")
    return frechet_distance(*ours, *theirs, n_jobs=n_jobs)


def snn(generated, reference="moses", *, n_jobs: int = 1) -> float:
    """SNN/Test: mean over `generated` of the largest Tanimoto similarity to a molecule of `reference`."""
    reference = reference_set(reference)
    n_jobs = validate.integer("n_jobs", n_jobs, lo=1)
    words = _pack(morgan_fingerprints(_molecules(generated, "generated")), "generated")
    return _nearest_similarity(words, reference.fingerprints(), n_jobs)


def fragment_similarity(generated, reference="moses") -> float:
    """Frag/Test: cosine similarity of the BRICS fragment counts of `generated` and `reference`."""
    reference = reference_set(reference)
    return _count_cosine(_fragment_counts(_molecules(generated, "generated")), reference.fragments())


def scaffold_similarity(generated, reference="moses") -> float:
    """Scaf/Test: cosine similarity of the scaffold counts (>= 2 rings) of `generated` and `reference`."""
    reference = reference_set(reference)
    return _count_cosine(_scaffold_counts(_molecules(generated, "generated")), reference.scaffolds())


def internal_diversity(generated, p: float = 1, *, n_jobs: int = 1) -> float:
    """IntDiv_p: 1 - mean over g of (mean over g' of Tanimoto(g, g')^p)^(1/p), all pairs of the valid
    molecules `generated`, g' = g included (MOSES's `internal_diversity`; IntDiv is p=1, IntDiv2 p=2)."""
    p = validate.real("p", p, lo=0, lo_open=True)
    n_jobs = validate.integer("n_jobs", n_jobs, lo=1)
    words = _pack(morgan_fingerprints(_molecules(generated, "generated")), "generated")
    return _internal_diversities(words, (p,), n_jobs)[0]


# -------------------------------------------------------------- the whole row


def _training_set(train, train_is_canonical: bool = False):
    """(set of training SMILES to compare with, description); (None, "none") when `train` is None."""
    if train is None:
        return None, "none"
    if isinstance(train, str):
        if train != "moses":
            raise ValueError(f"train: expected None, 'moses' or a list of SMILES, got {train!r}")
        # MOSES compares with its training strings as stored (canonical for the rdkit MOSES used).
        return set(_moses_smiles("train")), f"MOSES train set (molsets {_molsets_version()})"
    train = validate.strings("train", train, each=False)
    return set(train) if train_is_canonical else set(valid_canonical(train)), f"given set, n={len(train)}"


def moses_metrics(generated: Sequence[str], train: Sequence[str] | str | None = None,
                  reference: str | Sequence[str] | Reference = "moses", *, n_jobs: int = 1,
                  device: str = "cpu", train_is_canonical: bool = False) -> dict[str, float | int | str]:
    """MOSES's headline metrics of `generated`, computed as MOSES's `get_all_metrics` computes them.

    Args:
        generated: the sampled SMILES, invalid ones included (MOSES asks for at least 30,000).
        train: the training SMILES for Novelty (canonicalised; invalid ones ignored), "moses" for MOSES's
            training set (1,584,663 molecules, compared as stored, as MOSES does: a molecule whose
            canonical SMILES rdkit now writes differently, ~1 in 10,000, counts as novel), or None
            (Novelty nan).
        reference: what the Test metrics compare with: "moses" (MOSES's test set and its precomputed
            statistics), a list of SMILES (e.g. our held-out split) or a `reference_set(...)`.
        n_jobs: CPU threads for the Tanimoto searches (SNN, IntDiv) and for torch's ChemNet (FCD); on 2
            cores shared with other work, 1 was the fastest.
        device: torch device for ChemNet (FCD), e.g. "cpu" or "cuda:0".
        train_is_canonical: a list `train` is canonical SMILES already (as `novelty`'s): compared as given.

    Returns:
        {column: value} for each of `MOSES_COLUMNS` (nan where undefined, e.g. no valid molecule), then
        "n_generated", "n_valid", "reference" (its description, e.g. "MOSES test set (molsets 0.3.1)")
        and "train" (the training set's description). Every metric after "valid" is over G, the
        canonical SMILES of the valid molecules with their duplicates; unique@k uses the first k of G
        (all of G when it is shorter, as MOSES does, with a warning there).
    """
    generated = validate.strings("generated", generated, each=False)
    if not generated:
        raise ValueError("generated: expected at least one SMILES string, got an empty list")
    n_jobs = validate.integer("n_jobs", n_jobs, lo=1)
    validate.instance("device", device, str)
    reference = reference_set(reference)
    train_set, train_description = _training_set(train, validate.boolean("train_is_canonical", train_is_canonical))
    Chem = _chem()

    canonical = valid_canonical(generated)  # MOSES: remove_invalid(gen, canonize=True)
    with silence_rdkit():  # MOSES: get_mol of each; a SMILES rdkit wrote but cannot read back is dropped
        mols = [mol for mol in map(parse_smiles, canonical) if mol is not None]
    # What MOSES's canonic_smiles (unique@k, Novelty) and fcd_torch (canonize=True) make of each.
    written = [Chem.MolToSmiles(mol) for mol in mols]
    words = _pack(morgan_fingerprints(mols), "generated")
    nan = float("nan")

    row: dict[str, float | int | str] = {"valid": len(canonical) / len(generated)}
    for column, k in _UNIQUE_AT.items():
        row[column] = len(set(written[:k])) / len(written[:k]) if written else nan
    row["FCD/Test"] = _fcd(_chemnet(written, device, n_jobs), reference, device, n_jobs)
    row["SNN/Test"] = _nearest_similarity(words, reference.fingerprints(), n_jobs)
    row["Frag/Test"] = _count_cosine(_fragment_counts(mols), reference.fragments())
    row["Scaf/Test"] = _count_cosine(_scaffold_counts(mols), reference.scaffolds())
    row["IntDiv"], row["IntDiv2"] = _internal_diversities(words, (1, 2), n_jobs)
    row["Filters"] = float(np.mean([passes_filters(mol) for mol in mols])) if mols else nan
    distinct = set(written)
    row["Novelty"] = len(distinct - train_set) / len(distinct) if distinct and train_set is not None else nan
    row.update(n_generated=len(generated), n_valid=len(canonical), reference=reference.description,
               train=train_description)
    return row


def format_moses_table(rows: Mapping[str, Mapping[str, float]], *, published: bool = True) -> str:
    """A text table of MOSES's columns: one line per entry of `rows` (name -> a `moses_metrics` result),
    then, with `published`, MOSES's published rows (`MOSES_PUBLISHED`). A missing value prints as "-".
    Lines under the table say, for each of our rows, what it was computed on."""
    if not isinstance(rows, Mapping) or not all(isinstance(r, Mapping) for r in rows.values()):
        raise TypeError("rows: expected a dict of row name -> metrics dict (as moses_metrics returns)")
    table = {str(name): row for name, row in rows.items()}
    if published:
        table.update({f"{name} (published)": row for name, row in MOSES_PUBLISHED.items()})

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float | int | np.floating | np.integer) and not isinstance(value, bool):
            return f"{float(value):.4f}"
        return str(value)

    cells = [[name, *(cell(row.get(column)) for column in MOSES_COLUMNS)] for name, row in table.items()]
    header = ["model", *MOSES_COLUMNS]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    lines = ["  ".join(text.ljust(w) if i == 0 else text.rjust(w) for i, (text, w) in enumerate(zip(line, widths)))
             for line in [header, *cells]]
    for name, row in rows.items():
        if "reference" in row:
            lines.append(f"{name}: {row.get('n_valid', '?')} valid of {row.get('n_generated', '?')} generated; "
                         f"Test metrics against {row['reference']}; Novelty against {row.get('train', '?')}")
    if published:
        lines.append("(published): means from MOSES's README, against the MOSES test set (MOSES asks for at least "
                     "30,000 samples: FCD, Scaf and unique@k depend on the sample size)")
    return "\n".join(lines)


# ================================================================================ reconstruction, latent space


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
    return float(((predicted == target) | ~mask).all(axis=1).mean())


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
