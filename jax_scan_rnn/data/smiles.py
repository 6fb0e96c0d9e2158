"""Molecules as strings: load SMILES (or any text), tokenise them, split them, batch them.

    result = load_sequences("rdkit")                 # 14,734 canonical drug-like SMILES, offline
    vocab = Vocabulary.build(result.sequences)
    train, valid, test = split(result.sequences, (0.8, 0.1, 0.1), seed=0)   # sizes: split_sizes(n, ...)
    tokens, lengths = vocab.encode(train, max_len=DEFAULT_MAX_LENGTH)   # [N, T] int32, [N] int32
    batch_tokens, batch_lengths = batch_at(tokens, lengths, batch_size=128, step=step, seed=0)
    vocab.decode(batch_tokens)                       # -> list[str]

Token layout (docs/vae_spec.md): ids 0 `<pad>`, 1 `<sos>`, 2 `<eos>`, then the vocabulary. A batch is
`tokens [B, T]`: each sequence's tokens, one `<eos>`, then `<pad>` up to T = max_len + 1;
`lengths [B]` counts the non-pad tokens, `<eos>` included. `<sos>` is never stored.

Tokenisation is character level: one character of the string is one token. It is what MOSES's CharRNN
does; it works unchanged for any text, not only SMILES; a sequence of L characters is always L tokens,
so `max_length` in characters is exactly the token budget; and decoding is a plain join, so any token
string the model writes decodes to exactly the characters it chose. The price is that two-letter atoms
(`Cl`, `Br`) and bracket atoms (`[nH]`) take several steps, which a recurrent model learns early. The
common regex SMILES tokeniser would shorten these sets' sequences by under 2 % (measured on the rdkit
and MOSES test sets) and cannot tokenise text it does not expect.

Sources (`load_sequences`):
- `"rdkit"` (default): the SMILES files shipped inside the rdkit wheel (`RDKIT_FILES`: 4,999 NCI
  compounds, 10,000 WEHI screening compounds, 1,017 + 100 ChEMBL actives, 100 ZINC and 47 CDK2
  ligands), kept if they parse, pass `DRUG_LIKE` (one fragment; only C, N, O, S, F, Cl, Br, H, as in
  MOSES; no charged atoms; 6 to 50 heavy atoms), and fit `max_length` once written canonically,
  then de-duplicated: 14,734 molecules with rdkit 2026.09 and the default `max_length` (63), whose
  26 characters are exactly those of the MOSES training set. No download.
- `"moses"`, `"moses:test"`, `"moses:test_scaffolds"`: the MOSES benchmark sets (1,584,663 training
  SMILES), read from the `molsets` package's data files without importing `moses`
  (`pip install --no-deps molsets`).
- anything else: a path to a text file with one sequence per line (`smiles=True` to parse the first
  whitespace-separated field of each line as SMILES with the same code as the "rdkit" source, skipping
  invalid ones as "unparsable", and canonicalise it unless `canonicalize=False`).
  `is_builtin_source` tells the two kinds apart.

Bad lines never stop loading: each is skipped and counted by reason in `LoadResult.skipped`.
rdkit is imported only inside the functions that need it; everything else is numpy.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import gzip
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from jax_scan_rnn.optional import require

PAD, SOS, EOS = 0, 1, 2
SPECIAL_TOKENS = ("<pad>", "<sos>", "<eos>")  # ids 0, 1, 2 (docs/vae_spec.md)

# Longest sequence kept, in characters (tokens), <eos> excluded, so T = 64. It keeps 99.06 % of the
# rdkit source's drug-like canonical SMILES (99th percentile 63, longest 93) and every MOSES molecule
# (longest 57).
DEFAULT_MAX_LENGTH = 63

MOSES_INSTALL_HINT = "pip install --no-deps molsets"
MOSES_SPLITS = ("train", "test", "test_scaffolds")
MOSES_ELEMENTS = frozenset({"C", "N", "O", "S", "F", "Cl", "Br", "H"})  # the only atoms MOSES keeps


# --------------------------------------------------------------------------------------------------
# rdkit helpers (shared with jax_scan_rnn.metrics so that both canonicalise the same way)


def _import_chem():
    return require("rdkit.Chem", "SMILES support")


@contextlib.contextmanager
def silence_rdkit() -> Iterator[None]:
    """Block rdkit's error log (parse and sanitisation messages) inside the block; restores it after."""
    _import_chem()  # a clear error when rdkit is missing
    from rdkit import RDLogger, rdBase

    if hasattr(rdBase, "BlockLogs"):
        blocker = rdBase.BlockLogs()
        try:
            yield
        finally:
            del blocker
    else:  # pragma: no cover - rdkit < 2022.03
        RDLogger.DisableLog("rdApp.*")
        try:
            yield
        finally:
            RDLogger.EnableLog("rdApp.*")


def parse_smiles(smiles: str):
    """rdkit Mol of `smiles`, or None when it is empty or rdkit rejects it (MOSES `get_mol`).

    Call inside `silence_rdkit()` to keep rdkit's messages off stderr.
    """
    Chem = _import_chem()
    if not isinstance(smiles, str) or len(smiles) == 0:
        return None
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    try:
        Chem.SanitizeMol(mol)
    except ValueError:
        return None
    return mol


def canonical_smiles(smiles: str) -> str | None:
    """rdkit's canonical SMILES (`Chem.MolToSmiles`, stereo kept) of `smiles`, or None if invalid.

    This is MOSES's `canonic_smiles`. Canonical forms can differ between rdkit releases, so compare
    strings canonicalised by the same rdkit.
    """
    with silence_rdkit():
        mol = parse_smiles(smiles)
        if mol is None:
            return None
        return _import_chem().MolToSmiles(mol)


# --------------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class LoadResult:
    """What `load_sequences` kept and what it skipped."""

    sequences: list[str]  # kept sequences, in file order (first occurrence of duplicates)
    skipped: dict[str, int]  # reason -> number of lines skipped for it (reasons with a zero count absent)
    sources: tuple[str, ...] = ()  # files read, in order


@dataclass(frozen=True)
class MoleculeFilter:
    """Which parsed molecules count as clean and drug-like (checked on rdkit Mol objects)."""

    elements: frozenset[str] = MOSES_ELEMENTS  # allowed atom symbols
    allow_charged: bool = False  # keep molecules with a formally charged atom (MOSES removes them)
    single_fragment: bool = True  # reject mixtures and salts ("." in the SMILES)
    min_heavy_atoms: int = 6  # fewest non-hydrogen atoms (drops solvents and reagents)
    max_heavy_atoms: int = 50  # most non-hydrogen atoms

    def __post_init__(self):
        if not 0 <= self.min_heavy_atoms <= self.max_heavy_atoms:
            raise ValueError(
                "min_heavy_atoms, max_heavy_atoms: expected 0 <= min <= max, got "
                f"{self.min_heavy_atoms!r}, {self.max_heavy_atoms!r}"
            )
        object.__setattr__(self, "elements", frozenset(self.elements))

    def reject_reason(self, mol) -> str | None:
        """None if `mol` passes, else the skip reason: "fragments", "element", "charged" or "size"."""
        Chem = _import_chem()
        if self.single_fragment and len(Chem.GetMolFrags(mol)) > 1:
            return "fragments"
        atoms = list(mol.GetAtoms())
        if any(atom.GetSymbol() not in self.elements for atom in atoms):
            return "element"
        if not self.allow_charged and any(atom.GetFormalCharge() != 0 for atom in atoms):
            return "charged"
        if not self.min_heavy_atoms <= mol.GetNumHeavyAtoms() <= self.max_heavy_atoms:
            return "size"
        return None


DRUG_LIKE = MoleculeFilter()  # the filter the "rdkit" source applies


@dataclass(frozen=True)
class SmilesFile:
    """One delimited text file of SMILES inside the rdkit installation."""

    root: str  # "data" (rdkit.RDConfig.RDDataDir) or "contrib" (rdkit.RDConfig.RDContribDir)
    path: str  # path below that root
    column: int  # 0-based column holding the SMILES
    delimiter: str | None  # None: any whitespace; "," : CSV (quotes honoured)
    header: bool  # whether the first line is a header (not counted as a skipped line)


RDKIT_FILES = (
    SmilesFile("data", "NCI/first_5K.smi", 0, None, False),  # 4,999 NCI open compounds
    SmilesFile("data", "Pains/test_data/wehi_mols.csv", 0, ",", False),  # 10,000 WEHI screening compounds
    SmilesFile("contrib", "FreeWilson/data/CHEMBL2321810.smi", 0, None, False),  # 1,017 ChEMBL actives
    SmilesFile("contrib", "fraggle/data/ChEMBL_11265_actives.smi", 0, None, False),  # 100 ChEMBL actives
    SmilesFile("contrib", "SA_Score/data/zim.100.txt", 0, None, True),  # 100 ZINC compounds
    SmilesFile("contrib", "Fastcluster/cdk2.smi", 1, None, False),  # 47 CDK2 ligands (name, SMILES)
)


class _Counter(dict):
    def add(self, reason: str) -> None:
        self[reason] = self.get(reason, 0) + 1


def _fields(raw_lines: Iterator[bytes], column: int | None, delimiter: str | None, skipped: _Counter):
    """Decoded field of each line (the whole stripped line when column is None); counts bad lines."""
    for raw in raw_lines:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.add("undecodable")
            continue
        line = line.strip()
        if not line:
            skipped.add("empty")
            continue
        if column is None:
            yield line
            continue
        if delimiter is None:
            parts = line.split()
        else:
            parts = next(csv.reader([line], delimiter=delimiter), [])
        if column >= len(parts) or not parts[column].strip():
            skipped.add("empty")
            continue
        yield parts[column].strip()


def _keep(
    items: Iterator[str],
    *,
    smiles: bool,
    canonicalize: bool,
    molecule_filter: MoleculeFilter | None,
    max_length: int,
    dedupe: bool,
    limit: int | None,
    skipped: _Counter,
    kept: list[str],
    seen: set[str],
) -> None:
    Chem = _import_chem() if smiles else None
    context = silence_rdkit() if smiles else contextlib.nullcontext()
    with context:
        for item in items:
            if limit is not None and len(kept) >= limit:
                return
            if smiles:
                mol = parse_smiles(item)
                if mol is None:
                    skipped.add("unparsable")
                    continue
                if molecule_filter is not None:
                    reason = molecule_filter.reject_reason(mol)
                    if reason is not None:
                        skipped.add(reason)
                        continue
                if canonicalize:
                    item = Chem.MolToSmiles(mol)
            if len(item) > max_length:
                skipped.add("too_long")
                continue
            if dedupe:
                if item in seen:
                    skipped.add("duplicate")
                    continue
                seen.add(item)
            kept.append(item)


def _moses_file(split_name: str) -> str:
    """Path of the molsets package's `moses/dataset/data/<split>.csv.gz`, found without importing moses."""
    relative = f"moses/dataset/data/{split_name}.csv.gz"
    try:
        path = str(importlib.metadata.distribution("molsets").locate_file(relative))
        if os.path.isfile(path):
            return path
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("moses")  # a top-level find_spec does not run moses/__init__.py
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = os.path.join(folder, "dataset", "data", f"{split_name}.csv.gz")
            if os.path.isfile(path):
                return path
    raise FileNotFoundError(
        f"source: the MOSES data file {relative} was not found; install it with `{MOSES_INSTALL_HINT}` "
        "(--no-deps: only its data files are read, and its pinned dependencies do not build)"
    )


def _raw_lines(path: str) -> Iterator[bytes]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        yield from handle.read().splitlines()


def is_builtin_source(source: str | os.PathLike) -> bool:
    """Whether `load_sequences` reads `source` as a built-in set ("rdkit", "moses", "moses:<split>"), not a file.

    Built-in sets are always SMILES; a file may hold any text (its caller says whether it is chemistry).
    """
    source = os.fspath(source)
    return source in ("rdkit", "moses") or source.startswith("moses:")


def load_sequences(
    source: str = "rdkit",
    *,
    max_length: int = DEFAULT_MAX_LENGTH,
    smiles: bool | None = None,
    canonicalize: bool | None = None,
    molecule_filter: MoleculeFilter | None = None,
    dedupe: bool = True,
    limit: int | None = None,
) -> LoadResult:
    """Load sequences (SMILES or any text) from `source`, skipping and counting bad lines.

    Args:
        source: "rdkit" (SMILES files shipped with rdkit), "moses" / "moses:train" / "moses:test" /
            "moses:test_scaffolds" (MOSES sets from `pip install --no-deps molsets`), or a path to a
            text file (".gz" allowed) with one sequence per line (write "./rdkit" for a file that is
            named like a source).
        max_length: longest sequence kept, in characters (= tokens, <eos> excluded); longer: "too_long".
        smiles: parse each line with rdkit (unparsable lines: "unparsable"). None: True for "rdkit",
            False for MOSES (curated and valid; parsing 1.6 M molecules takes minutes) and for a file.
            For a file with `smiles=True` the first whitespace-separated field of a line is the
            SMILES (so "SMILES name" lines work).
        canonicalize: write each parsed molecule as rdkit's canonical SMILES (only with smiles).
            None: True when `smiles` is, except for MOSES, whose strings are kept as published.
        molecule_filter: reject parsed molecules that fail it (reasons "fragments", "element",
            "charged", "size"). None: `DRUG_LIKE` for "rdkit", no filter otherwise.
        dedupe: drop repeated sequences (after canonicalisation), counted as "duplicate".
        limit: stop once this many sequences are kept (None: all).

    Returns:
        LoadResult(sequences, skipped, sources). Skip reasons: "undecodable" (not UTF-8), "empty",
        "unparsable", "fragments", "element", "charged", "size", "too_long", "duplicate".
    """
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"source: expected 'rdkit', 'moses' or a file path, got {type(source).__name__}")
    source = os.fspath(source)
    if isinstance(max_length, bool) or not isinstance(max_length, int | np.integer) or max_length < 1:
        raise ValueError(f"max_length: expected a positive int, got {max_length!r}")
    if limit is not None and (not isinstance(limit, int | np.integer) or limit < 0):
        raise ValueError(f"limit: expected None or an int >= 0, got {limit!r}")

    is_moses = is_builtin_source(source) and source != "rdkit"
    if source == "rdkit":
        smiles = True if smiles is None else bool(smiles)
        canonicalize = smiles if canonicalize is None else bool(canonicalize)
        if molecule_filter is None and smiles:
            molecule_filter = DRUG_LIKE
    else:
        smiles = False if smiles is None else bool(smiles)
        canonicalize = (smiles and not is_moses) if canonicalize is None else bool(canonicalize)
    if canonicalize and not smiles:
        raise ValueError("canonicalize: expected False or None when smiles=False, got True")
    if molecule_filter is not None and not smiles:
        raise ValueError(f"molecule_filter: expected None when smiles=False, got {molecule_filter!r}")

    skipped, kept, seen = _Counter(), [], set()

    def keep(items: Iterator[str]) -> None:
        _keep(
            items,
            smiles=smiles,
            canonicalize=canonicalize,
            molecule_filter=molecule_filter,
            max_length=int(max_length),
            dedupe=dedupe,
            limit=limit,
            skipped=skipped,
            kept=kept,
            seen=seen,
        )

    if source == "rdkit":
        from rdkit import RDConfig

        roots = {"data": RDConfig.RDDataDir, "contrib": RDConfig.RDContribDir}
        sources = []
        for spec in RDKIT_FILES:
            path = os.path.join(roots[spec.root], spec.path)
            if not os.path.isfile(path):
                continue  # some rdkit builds omit Contrib; `sources` says what was read
            sources.append(path)
            lines = _raw_lines(path)
            if spec.header:
                next(lines, None)
            keep(_fields(lines, spec.column, spec.delimiter, skipped))
        if not sources:
            raise FileNotFoundError(
                "source: none of rdkit's SMILES files were found under "
                f"{roots['data']!r} or {roots['contrib']!r}"
            )
        return LoadResult(kept, dict(skipped), tuple(sources))

    if is_moses:
        split_name = source.partition(":")[2] or "train"
        if split_name not in MOSES_SPLITS:
            raise ValueError(
                f"source: expected 'moses' or 'moses:<split>' with split in {MOSES_SPLITS}, got {source!r}"
            )
        path = _moses_file(split_name)
        lines = _raw_lines(path)
        header = next(lines, b"").decode("utf-8", "replace").strip().split(",")
        if "SMILES" not in header:
            raise ValueError(f"source: expected a 'SMILES' column in {path}, got header {header!r}")
        keep(_fields(lines, header.index("SMILES"), ",", skipped))
        return LoadResult(kept, dict(skipped), (path,))

    if not os.path.isfile(source):
        raise FileNotFoundError(
            f"source: expected 'rdkit', 'moses', 'moses:<split>' or an existing file, got {source!r}"
        )
    keep(_fields(_raw_lines(source), 0 if smiles else None, None, skipped))
    return LoadResult(kept, dict(skipped), (source,))


# --------------------------------------------------------------------------------------------------
# Vocabulary


def _check_strings(sequences, name: str) -> list[str]:
    if isinstance(sequences, str | bytes):
        raise TypeError(f"{name}: expected a list of strings, got a single {type(sequences).__name__}")
    sequences = list(sequences)
    for i, seq in enumerate(sequences):
        if not isinstance(seq, str):
            raise TypeError(f"{name}: expected strings, got {type(seq).__name__} at index {i}")
    return sequences


@dataclass(frozen=True)
class Vocabulary:
    """Character-level vocabulary: ids 0..2 are `SPECIAL_TOKENS`, then one character per id.

    Save it with a checkpoint (`to_json` / `from_json`): the ids a model was trained on are fixed by it.
    """

    tokens: tuple[str, ...]  # id -> token; SPECIAL_TOKENS first, then single characters in sorted order
    _index: dict[str, int] = field(init=False, repr=False, compare=False)  # character -> id

    def __post_init__(self):
        if isinstance(self.tokens, str):
            raise TypeError("tokens: expected a tuple of strings, got a single str")
        tokens = tuple(self.tokens)
        if tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
            raise ValueError(f"tokens: expected to start with {SPECIAL_TOKENS}, got {tokens[:3]!r}")
        chars = tokens[len(SPECIAL_TOKENS) :]
        for ch in chars:
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"tokens: expected single characters after the specials, got {ch!r}")
        if len(set(chars)) != len(chars):
            duplicated = sorted({ch for ch in chars if chars.count(ch) > 1})
            raise ValueError(f"tokens: expected distinct characters, got duplicates {duplicated!r}")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "_index", {ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(chars)})

    @classmethod
    def build(cls, sequences: Sequence[str]) -> Vocabulary:
        """Vocabulary of every character in `sequences` (sorted), after the special tokens.

        Build it from all the data you will encode (train, validation and test), or encoding a
        held-out sequence with an unseen character raises.
        """
        sequences = _check_strings(sequences, "sequences")
        chars = sorted(set().union(*map(set, sequences)))
        return cls(SPECIAL_TOKENS + tuple(chars))

    @property
    def size(self) -> int:
        """V: number of ids, specials included (the model's one-hot width)."""
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, sequences: Sequence[str], max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of `sequences`.

        Args:
            sequences: B strings.
            max_len: longest sequence allowed, in characters; None: the longest in `sequences`.

        Returns:
            tokens int32 [B, max_len + 1]: each sequence's ids, one <eos>, then <pad>.
            lengths int32 [B]: characters + 1 (the <eos>).

        Raises:
            ValueError: a sequence longer than max_len, or a character not in the vocabulary (both
                name the sequence).
        """
        sequences = _check_strings(sequences, "sequences")
        num_chars = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        if max_len is None:
            max_len = int(num_chars.max(initial=0))
        if isinstance(max_len, bool) or not isinstance(max_len, int | np.integer) or max_len < 0:
            raise ValueError(f"max_len: expected an int >= 0, got {max_len!r}")
        too_long = np.flatnonzero(num_chars > max_len)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(
                f"sequences: expected at most max_len={max_len} characters, got {num_chars[i]} in "
                f"sequence {i} {sequences[i]!r} ({too_long.size} too long)"
            )
        # All characters at once: one code point per character (UTF-32), looked up in a dense table
        # (-1: not in the vocabulary), so 1.6 M MOSES SMILES encode in seconds.
        codes = np.frombuffer("".join(sequences).encode("utf-32-le"), dtype=np.uint32)
        table = np.full(max(int(codes.max(initial=0)), *map(ord, self._index), 0) + 1, -1, dtype=np.int32)
        for ch, token in self._index.items():
            table[ord(ch)] = token
        ids = table[codes]
        if (ids < 0).any():
            position = int(np.argmax(ids < 0))
            i = int(np.searchsorted(np.cumsum(num_chars), position, side="right"))
            raise ValueError(
                f"sequences: character {chr(codes[position])!r} of sequence {i} {sequences[i]!r} is not "
                f"in the vocabulary (expected one of {''.join(self.tokens[len(SPECIAL_TOKENS) :])!r})"
            )
        batch = len(sequences)
        tokens = np.full((batch, max_len + 1), PAD, dtype=np.int32)
        tokens[np.arange(max_len + 1) < num_chars[:, None]] = ids  # row-major = concatenation order
        tokens[np.arange(batch), num_chars] = EOS
        return tokens, (num_chars + 1).astype(np.int32)

    def decode(self, tokens) -> list[str]:
        """Strings of `tokens` [B, T] (ints): each row up to its first <eos>, <pad> and <sos> skipped."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"tokens: expected a [B, T] array, got shape {tokens.shape}")
        if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"tokens: expected integer ids, got dtype {tokens.dtype}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.size):
            raise ValueError(
                f"tokens: expected ids in [0, {self.size}), got values in [{tokens.min()}, {tokens.max()}]"
            )
        out = []
        for row in tokens.tolist():
            chars = []
            for token in row:
                if token == EOS:
                    break
                if token >= len(SPECIAL_TOKENS):
                    chars.append(self.tokens[token])
            out.append("".join(chars))
        return out

    def to_json(self) -> str:
        """JSON text that `from_json` turns back into an equal Vocabulary."""
        return json.dumps({"format": "jax_scan_rnn.Vocabulary", "version": 1, "tokens": list(self.tokens)})

    @classmethod
    def from_json(cls, text: str) -> Vocabulary:
        """The Vocabulary that `to_json` wrote."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(
                f"text: expected the JSON written by Vocabulary.to_json, got {str(text)[:60]!r}"
            ) from err
        if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            raise ValueError(f"text: expected a JSON object with a 'tokens' list, got {str(text)[:60]!r}")
        return cls(tuple(data["tokens"]))


# --------------------------------------------------------------------------------------------------
# Splitting and batching


def split(
    sequences: Sequence, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> tuple[list, ...]:
    """Deterministic random split of `sequences` into len(fractions) disjoint parts.

    The same (len(sequences), fractions, seed) always gives the same parts; each part keeps the input
    order. Part sizes are round(cumsum(fractions) * N) differences, so they add up to N. Parts are
    disjoint by position; de-duplicate first (`load_sequences` does) so that they are disjoint by value.
    """
    fractions = _check_fractions(fractions)
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    sequences = list(sequences)
    n = len(sequences)
    order = np.random.default_rng(seed).permutation(n)
    bounds = np.cumsum(_part_sizes(np.asarray([n]), fractions)[0])
    starts = np.concatenate([[0], bounds[:-1]])
    return tuple([sequences[i] for i in np.sort(order[a:b])] for a, b in zip(starts, bounds, strict=True))


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    fractions = np.asarray(fractions, dtype=np.float64)
    if (
        fractions.ndim != 1
        or fractions.size == 0
        or (fractions < 0).any()
        or abs(fractions.sum() - 1.0) > 1e-6
    ):
        raise ValueError(f"fractions: expected non-negative numbers summing to 1, got {fractions.tolist()}")
    return fractions


def _part_sizes(counts: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """[len(counts), len(fractions)]: the sizes of `split`'s parts for each number of sequences in `counts`."""
    bounds = np.round(np.cumsum(fractions)[None, :] * counts[:, None]).astype(np.int64)
    bounds[:, -1] = counts
    return np.diff(bounds, axis=1, prepend=0)


def split_sizes(n: int, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> tuple[int, ...]:
    """The sizes of the parts `split` makes of `n` sequences with `fractions` (they add up to n)."""
    fractions = _check_fractions(fractions)
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n: expected an int >= 0, got {n!r}")
    return tuple(int(k) for k in _part_sizes(np.asarray([n]), fractions)[0])


def min_split_size(fractions: Sequence[float], minimums: Sequence[int]) -> int:
    """Fewest sequences N for which `split(..., fractions)` gives part i at least `minimums[i]` sequences,
    for N and for every larger N (rounding makes the part sizes step unevenly, so the first N that works
    is not always the threshold).

    Part i of N sequences holds at least fractions[i] * N - 1 (rounding moves each bound by at most 1/2),
    so every N >= (minimums[i] + 1) / fractions[i] works for it; below that bound each N is tried.
    """
    fractions = _check_fractions(fractions)
    minimums = np.asarray(minimums)
    if minimums.shape != fractions.shape or not np.issubdtype(minimums.dtype, np.integer) or (minimums < 0).any():
        raise ValueError(
            f"minimums: expected {fractions.size} ints >= 0, one per fraction, got {minimums.tolist()}"
        )
    needed = minimums > 0
    if (fractions[needed] == 0).any():
        raise ValueError(
            f"minimums: expected 0 for a part of fraction 0 (it is always empty), got {minimums.tolist()} for "
            f"fractions {fractions.tolist()}"
        )
    upper = int(np.max(np.ceil((minimums[needed] + 1) / fractions[needed]), initial=0)) + 1
    counts = np.arange(upper + 1)
    works = (_part_sizes(counts, fractions) >= minimums).all(axis=1)
    failing = np.flatnonzero(~works)
    return int(failing[-1]) + 1 if failing.size else 0


@functools.lru_cache(maxsize=4)
def _epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    perm.setflags(write=False)
    return perm


def batch_at(tokens, lengths, batch_size: int, step: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Batch number `step` of shuffled epochs: a pure function of (data, batch_size, step, seed).

    Epoch e = step // (N // batch_size) visits the rows in the order of a permutation seeded by
    (seed, e); batch i of it is rows perm[i * batch_size : (i + 1) * batch_size]. The last
    N % batch_size rows of each permutation are left out (a different few each epoch), so every batch
    has the same shape. Resuming at step s gives exactly the batches an uninterrupted run would.

    Args:
        tokens: [N, T] token ids; lengths: [N].
    Returns:
        (tokens [batch_size, T], lengths [batch_size]).
    """
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if tokens.ndim != 2:
        raise ValueError(f"tokens: expected a [N, T] array, got shape {tokens.shape}")
    if lengths.shape != tokens.shape[:1]:
        raise ValueError(f"lengths: expected shape ({tokens.shape[0]},) to match tokens, got {lengths.shape}")
    n = tokens.shape[0]
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int | np.integer)
        or not 1 <= batch_size <= n
    ):
        raise ValueError(f"batch_size: expected an int in [1, N={n}], got {batch_size!r}")
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"step: expected an int >= 0, got {step!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: expected an int >= 0, got {seed!r}")
    epoch, index = divmod(int(step), n // int(batch_size))
    rows = _epoch_permutation(n, int(seed), epoch)[index * batch_size : (index + 1) * batch_size]
    return tokens[rows], lengths[rows]
