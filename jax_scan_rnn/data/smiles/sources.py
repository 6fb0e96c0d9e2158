"""Where sequences come from: the built-in molecule sets or a text file, parsed, filtered and de-duplicated.

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
  invalid ones as "unparsable", and canonicalise it unless `canonicalize=False`), or with `smiles=True` a
  `.csv`/`.tsv` table whose header names a "smiles" column (any case), as MOSES's own files do.
  `is_builtin_source` tells the two kinds apart.

Loading is a pipeline of generators: the source's fields, then (SMILES only) parse, filter and
canonicalise, then the length limit and de-duplication (of SMILES by molecule, of other text by
string). Bad lines never stop it: each is skipped and counted by reason in `LoadResult.skipped`. rdkit,
an optional extra, is imported only by the functions that need it.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import gzip
import hashlib
import importlib.util
import itertools
import os
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from jax_scan_rnn.optional import require
from jax_scan_rnn.validate import boolean, instance, integer, strings

# Longest sequence kept, in characters (tokens), <eos> excluded, so T = 64. It keeps 99.06 % of the
# rdkit source's drug-like canonical SMILES (99th percentile 63, longest 93) and every MOSES molecule
# (longest 57).
DEFAULT_MAX_LENGTH = 63

MOSES_SPLITS = ("train", "test", "test_scaffolds")


# --------------------------------------------------------------------------------------------------
# rdkit helpers (jax_scan_rnn.metrics uses them too, so that both parse and canonicalise the same way)


def _chem():
    return require("rdkit.Chem", "SMILES support")


@contextlib.contextmanager
def silence_rdkit() -> Iterator[None]:
    """Block rdkit's error log (parse and sanitisation messages) inside the block; restores it after."""
    blocker = require("rdkit.rdBase", "SMILES support").BlockLogs()  # the log is back once it is deleted
    try:
        yield
    finally:
        del blocker


def parse_smiles(smiles: str):
    """rdkit Mol of `smiles`, or None when it is empty or rdkit rejects it (MOSES `get_mol`).

    Call inside `silence_rdkit()` to keep rdkit's messages off stderr.
    """
    Chem = _chem()
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


def canonical_smiles(smiles: str, kekule: bool = False) -> str | None:
    """rdkit's canonical SMILES (`Chem.MolToSmiles`, stereo kept) of `smiles`, or None if invalid.

    This is MOSES's `canonic_smiles`. Canonical forms can differ between rdkit releases, so compare
    strings canonicalised by the same rdkit. `kekule=True` writes the Kekulé form: aromatic rings as
    alternating single and double bonds (`C1=CC=CC=C1`, not `c1ccccc1`), no lowercase atoms, no `[nH]`.
    """
    kekule = boolean("kekule", kekule)
    with silence_rdkit():
        mol = parse_smiles(smiles)
        return None if mol is None else _chem().MolToSmiles(mol, kekuleSmiles=kekule)


# Fewer molecules convert sooner in this process than worker processes start (about a second each).
KEKULE_PARALLEL_FROM = 20_000


def _kekule_pair(Chem, smiles: str) -> tuple[str, str] | None:
    # MolFromSmiles sanitises: parse_smiles's second SanitizeMol (MOSES's get_mol) changes no canonical form of a
    # molecule that parsed (checked on 300,000 MOSES molecules) and would cost a quarter of the time here.
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    return None if mol is None else (Chem.MolToSmiles(mol, kekuleSmiles=True), Chem.MolToSmiles(mol))


def _kekule_chunk(chunk: list[str]) -> list[tuple[str, str] | None]:
    Chem = _chem()
    with silence_rdkit():  # one molecule alive at a time: 150,000 rdkit Mols held together took 4.5 GB
        return [_kekule_pair(Chem, s) for s in chunk]


def _kekule_worker() -> None:
    """A `kekule_forms` worker: SMILES on stdin, one per line; "KEKULE CANONICAL" or an empty line out, in UTF-8."""
    # Bytes, not sys.stdin/stdout's text: on Windows those decode in the locale's encoding (cp1252), read a "\r"
    # inside a line as a line end and write "\r\n", and the caller splits UTF-8 at "\n".
    try:
        forms = _kekule_chunk(sys.stdin.buffer.read().decode().split("\n"))  # not splitlines: "\r" stays in its line
    except KeyboardInterrupt:  # a terminal's Ctrl-C reaches every worker too: the caller's process says it, once
        sys.exit(130)
    sys.stdout.buffer.write(_form_lines(forms))
    sys.stdout.buffer.flush()


def _form_lines(forms: Sequence[tuple[str, str] | None]) -> bytes:
    """A worker's output and a cache file's body: "KEKULE CANONICAL" per molecule, an empty line where invalid."""
    return "".join("\n" if f is None else f"{f[0]} {f[1]}\n" for f in forms).encode()


def _read_form_lines(data: bytes) -> list[tuple[str, str] | None]:
    return [tuple(line.split(" ")) if line else None for line in data.decode().split("\n")[:-1]]  # type: ignore[misc]


def kekule_forms(sequences: Sequence[str], cache: str | os.PathLike | None = None) -> list[tuple[str, str] | None]:
    """`(canonical_smiles(s, kekule=True), canonical_smiles(s))` of each SMILES from one parse, or None if invalid.

    rdkit holds the GIL, so lists of `2 * KEKULE_PARALLEL_FROM` or more are split over worker processes, one per
    CPU this process may use (a few hundred microseconds per molecule on one core: 300,000 MOSES molecules
    took over a minute of a 10-minute run, docs/vae_experiments.md). The workers are fresh interpreters: a
    fork would copy JAX's threads mid-lock, and multiprocessing's spawn would re-run the caller's script.

    `cache`: a folder that keeps each list's forms for the next call with the same list and rdkit version, in this
    process or another (the CLI's: `xla_flags.cli_data_cache`). MOSES's 300,000 molecules convert in ~50 s on 2
    cores and read back in under a second (docs/measurements.md#the-clis-data-cache). Each list is one gzip file
    named by the sha256 of the list, its length and rdkit's version; the newest files are kept up to
    `KEKULE_CACHE_MAX_BYTES`. A file that does not read back whole (gzip's CRC, the count) is a `UserWarning`, and
    its list is converted again and the file replaced; a folder that cannot be written is a `UserWarning`, and the
    forms are returned all the same.
    """
    sequences = strings("sequences", sequences)
    entry = _cache_entry(cache, sequences)
    forms = None if entry is None else _cached_forms(entry, len(sequences))
    if forms is None:
        forms = _convert(sequences)
        if entry is not None:
            _keep_forms(entry, forms)
    return forms


KEKULE_CACHE_VERSION = 1  # in every cache file's name and header: bump it when _kekule_pair's output changes
KEKULE_CACHE_MAX_BYTES = 2**28  # ~40 lists of MOSES's default 300,000 molecules (6.5 MB each)
_STALE_TEMPORARY_S = 24 * 3600  # a temporary file this old was left by a process that died while writing it


def _cache_entry(cache: str | os.PathLike | None, sequences: list[str]) -> Path | None:
    if cache is None or any("\n" in s for s in sequences):  # one molecule per line in the file
        return None
    version = require("rdkit", "SMILES support").__version__  # the rdkit that wrote the forms
    digest = hashlib.sha256(f"{KEKULE_CACHE_VERSION} {version} {len(sequences)}\n".encode())
    digest.update("\n".join(sequences).encode("utf-8", "surrogatepass"))
    return Path(cache) / f"kekule-{digest.hexdigest()}.gz"


def _cache_header(count: int) -> bytes:
    return f"jax-scan-rnn kekule forms {KEKULE_CACHE_VERSION} {count}\n".encode()


def _cached_forms(entry: Path, count: int) -> list[tuple[str, str] | None] | None:
    """The forms `entry` holds, or None: not there yet, or not whole (then converted again and replaced)."""
    try:
        with gzip.open(entry, "rb") as file:
            data = file.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, EOFError, zlib.error) as err:  # gzip's CRC or length check, a truncated file, a bad disk
        warnings.warn(f"kekule_forms: cannot read {entry} back ({err}); converting the molecules again", stacklevel=3)
        return None
    header, _, body = data.partition(b"\n")
    forms = _read_form_lines(body) if header + b"\n" == _cache_header(count) else []
    if len(forms) != count:
        warnings.warn(f"kekule_forms: {entry} holds another list; converting the molecules again", stacklevel=3)
        return None
    with contextlib.suppress(OSError):  # the newest use: kept longest
        os.utime(entry)
    return forms


def _keep_forms(entry: Path, forms: list[tuple[str, str] | None]) -> None:
    """Write `entry` whole or not at all (a temporary file, then `os.replace`), then drop the least recently used
    files beyond `KEKULE_CACHE_MAX_BYTES`."""
    temporary = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        # A name of this process's own; "x": created here, with the umask's permissions (as JAX's compiled programs
        # beside it), so that a folder shared on purpose is readable by its other users
        name = entry.parent / f".kekule-{os.getpid()}-{os.urandom(4).hex()}"
        with open(name, "xb") as file:
            temporary = name
            # 4x smaller in 0.3 s; no name or time in the header: the same forms make the same bytes
            with gzip.GzipFile("", mode="wb", compresslevel=1, fileobj=file, mtime=0) as packed:
                packed.write(_cache_header(len(forms)) + _form_lines(forms))
        os.replace(temporary, entry)
        temporary = None
        _prune(entry)
    except OSError as err:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        warnings.warn(f"kekule_forms: cannot keep the forms in {entry.parent} ({err.strerror or err}); they are "
                      "converted again next time", stacklevel=3)


def _prune(kept: Path) -> None:
    sizes = {}
    for path in kept.parent.glob("kekule-*.gz"):
        with contextlib.suppress(OSError):  # another process may delete it meanwhile
            stat = path.stat()
            sizes[path] = (stat.st_mtime, stat.st_size)
    total = sum(size for _, size in sizes.values())
    for path, (_, size) in sorted(sizes.items(), key=lambda item: item[1][0]):  # least recently used first
        if total <= KEKULE_CACHE_MAX_BYTES:
            break
        if path != kept:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size
    now = time.time()
    for path in kept.parent.glob(".kekule-*"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > _STALE_TEMPORARY_S:
                path.unlink()


def _convert(sequences: list[str]) -> list[tuple[str, str] | None]:
    """`kekule_forms` without the cache: in this process, or over worker processes for long lists."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # Linux; macOS
    workers = min(cpus, len(sequences) // KEKULE_PARALLEL_FROM)
    if workers <= 1:
        return _kekule_chunk(sequences)
    size = -(-len(sequences) // workers)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the modules this process sees
    code = "from jax_scan_rnn.data.smiles.sources import _kekule_worker; _kekule_worker()"
    with contextlib.ExitStack() as files:
        running = []
        for start in range(0, len(sequences), size):  # files, not pipes: every worker has its input at once
            given, got = (files.enter_context(tempfile.TemporaryFile()) for _ in range(2))
            given.write("\n".join(sequences[start:start + size]).encode())
            given.seek(0)
            running.append((subprocess.Popen([sys.executable, "-c", code], stdin=given, stdout=got, env=env), got))
        files.callback(lambda: [worker.kill() for worker, _ in running if worker.poll() is None])  # on an error
        forms: list[tuple[str, str] | None] = []
        for worker, got in running:
            if worker.wait() != 0:
                raise RuntimeError(f"kekule_forms: a worker process failed with exit code {worker.returncode}")
            got.seek(0)
            forms += _read_form_lines(got.read())
    if len(forms) != len(sequences):
        raise RuntimeError(f"kekule_forms: expected {len(sequences)} forms from the workers, got {len(forms)}")
    return forms


def randomized_smiles(smiles: str, count: int, seed: int, max_length: int, kekule: bool = False) -> list[str]:
    """`count` randomized SMILES of the molecule (Arús-Pous et al. 2019): the same graph written from random
    starting atoms and branch orders (`Chem.MolToRandomSmilesVect`, seeded, so the same arguments give the
    same strings), in Kekulé form if `kekule`, those of at most `max_length` characters, duplicates dropped.
    [] if `smiles` is invalid."""
    integer("count", count, lo=0)
    kekule = boolean("kekule", kekule)
    with silence_rdkit():
        mol = parse_smiles(smiles)
        if mol is None or count == 0:
            return []
        variants = _chem().MolToRandomSmilesVect(mol, count, randomSeed=integer("seed", seed, lo=0),
                                                 kekuleSmiles=kekule)
    return list(dict.fromkeys(v for v in variants if len(v) <= max_length))


@dataclass(frozen=True)
class MoleculeFilter:
    """Which parsed molecules count as clean and drug-like (checked on rdkit Mol objects)."""

    elements: frozenset[str] = frozenset({"C", "N", "O", "S", "F", "Cl", "Br", "H"})  # allowed atoms: MOSES's
    allow_charged: bool = False  # keep molecules with a formally charged atom (MOSES removes them)
    single_fragment: bool = True  # reject mixtures and salts ("." in the SMILES)
    min_heavy_atoms: int = 6  # fewest non-hydrogen atoms (drops solvents and reagents)
    max_heavy_atoms: int = 50  # most non-hydrogen atoms

    def __post_init__(self):
        fewest = integer("min_heavy_atoms", self.min_heavy_atoms, lo=0)
        integer("max_heavy_atoms", self.max_heavy_atoms, lo=fewest)
        object.__setattr__(self, "elements", frozenset(self.elements))

    def reject_reason(self, mol) -> str | None:
        """None if `mol` passes, else the skip reason: "fragments", "element", "charged" or "size"."""
        if self.single_fragment and len(_chem().GetMolFrags(mol)) > 1:
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


# --------------------------------------------------------------------------------------------------
# Sources


@dataclass(frozen=True)
class LoadResult:
    """What `load_sequences` kept and what it skipped."""

    sequences: list[str]  # kept sequences, in file order (the first occurrence of duplicates)
    skipped: dict[str, int]  # reason -> number of lines skipped for it (reasons with a zero count absent)
    sources: tuple[str, ...] = ()  # files read, in order
    limit_reached: bool = False  # `limit` sequences were kept and the source holds at least one more it would keep


@dataclass(frozen=True)
class SmilesFile:
    """One delimited text file of SMILES inside the rdkit installation."""

    root: str  # the rdkit.RDConfig folder it is in: "RDDataDir" or "RDContribDir"
    path: str  # path below that folder
    column: int  # 0-based column holding the SMILES
    delimiter: str | None  # None: any whitespace; "," : CSV (quotes honoured)
    header_lines: int  # lines before the first SMILES (not counted as skipped)


RDKIT_FILES = (
    SmilesFile("RDDataDir", "NCI/first_5K.smi", 0, None, 0),  # 4,999 NCI open compounds
    SmilesFile("RDDataDir", "Pains/test_data/wehi_mols.csv", 0, ",", 0),  # 10,000 WEHI screening compounds
    SmilesFile("RDContribDir", "FreeWilson/data/CHEMBL2321810.smi", 0, None, 0),  # 1,017 ChEMBL actives
    SmilesFile("RDContribDir", "fraggle/data/ChEMBL_11265_actives.smi", 0, None, 0),  # 100 ChEMBL actives
    SmilesFile("RDContribDir", "SA_Score/data/zim.100.txt", 0, None, 1),  # 100 ZINC compounds
    SmilesFile("RDContribDir", "Fastcluster/cdk2.smi", 1, None, 0),  # 47 CDK2 ligands (name, SMILES)
)


def is_builtin_source(source: str | os.PathLike) -> bool:
    """Whether `load_sequences` reads `source` as a built-in set ("rdkit", "moses", "moses:<split>"), not a file.

    Built-in sets are always SMILES; a file may hold any text (its caller says whether it is chemistry).
    """
    source = os.fspath(source)
    return source in ("rdkit", "moses") or source.startswith("moses:")


GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip stream (RFC 1952)


@contextlib.contextmanager
def _opened(path: str, **text) -> Iterator:
    """The file at `path` open for reading: as bytes, or as text with `text` (open's encoding, errors, newline);
    gunzipped when its content is gzip's, whatever its name says (a ".GZ"; a ".gz" a browser already unpacked).
    A gzip stream cut short or corrupt (an interrupted download) is a ValueError naming `source` and the file."""
    with open(path, "rb") as handle:
        compressed = handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    try:
        with (gzip.open if compressed else open)(path, "rt" if text else "rb", **text) as handle:
            yield handle
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:  # cut short; a CRC or header error; corrupt data
        raise ValueError(f"source: expected a whole gzip stream, got {path} cut short or corrupt ({err})") from None


def _read_lines(path: str) -> list[bytes]:
    """The raw lines of a file, gunzipped if compressed (`_opened`), without a leading UTF-8 byte-order mark."""
    with _opened(path) as handle:
        # Windows editors start UTF-8 files with a BOM: it is no part of the first line (utf-8-sig, as tables are read).
        return handle.read().removeprefix(codecs.BOM_UTF8).splitlines()


def _fields(lines: Iterable[bytes], column: int | None, delimiter: str | None,
            skipped: Counter) -> Iterator[tuple[int, str]]:
    """(line number from 1, field `column` of the line split on `delimiter` (None: whitespace), or the whole line
    when `column` is None, stripped); lines that are not UTF-8 or give an empty field are counted in `skipped`."""
    for number, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            skipped["undecodable"] += 1
            continue
        if column is not None:
            parts = line.split() if delimiter is None else next(csv.reader([line], delimiter=delimiter), [])
            line = parts[column].strip() if column < len(parts) else ""
        if line:
            yield number, line
        else:
            skipped["empty"] += 1


def _rdkit_fields(skipped: Counter) -> tuple[tuple[str, ...], Iterator[str]]:
    """(paths read, SMILES fields) of the `RDKIT_FILES` this rdkit installation has."""
    RDConfig = require("rdkit.RDConfig", "the 'rdkit' data source")
    found = [(spec, os.path.join(getattr(RDConfig, spec.root), spec.path)) for spec in RDKIT_FILES]
    found = [(spec, path) for spec, path in found if os.path.isfile(path)]  # some rdkit builds omit Contrib
    if not found:
        raise FileNotFoundError(f"source: none of rdkit's SMILES files were found under {RDConfig.RDDataDir!r} "
                                f"or {RDConfig.RDContribDir!r}")
    fields = ((field for _, field in _fields(_read_lines(path)[spec.header_lines :], spec.column, spec.delimiter,
                                             skipped)) for spec, path in found)
    return tuple(path for _, path in found), itertools.chain.from_iterable(fields)


def molsets_file(*parts: str) -> str | None:
    """Path of the file `parts` of the molsets package (folder `moses`), or None without molsets: found without
    importing moses, whose own imports fail on current pandas (a top-level find_spec does not run its __init__)."""
    spec = importlib.util.find_spec("moses")
    for folder in (spec and spec.submodule_search_locations) or ():
        path = os.path.join(folder, *parts)
        if os.path.isfile(path):
            return path
    return None


def _moses_file(split_name: str) -> str:
    """Path of the molsets package's `moses/dataset/data/<split>.csv.gz`."""
    path = molsets_file("dataset", "data", f"{split_name}.csv.gz")
    if path is None:
        raise FileNotFoundError(
            f"source: the MOSES data file moses/dataset/data/{split_name}.csv.gz was not found; install it with "
            "`pip install --no-deps molsets` (--no-deps: only its data files are read, and its pinned dependencies "
            "do not build), or use the 'rdkit' source, which ships with rdkit"
        )
    return path


def moses_split(source: str, name: str = "source") -> str:
    """The MOSES split that `source` ("moses" or "moses:<split>") names: "moses" is "train". Raises ValueError
    naming `name` for another split."""
    split_name = source.partition(":")[2] or "train"
    if split_name not in MOSES_SPLITS:
        raise ValueError(f"{name}: expected 'moses' or 'moses:<split>' with split in {MOSES_SPLITS}, got {source!r}")
    return split_name


TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t"}  # a table's delimiter by its file's suffix (before any ".gz")


def _table_delimiter(path: str) -> str | None:
    """The delimiter of a CSV or TSV file (".gz" allowed, in any case), whose SMILES are a column under a header, or
    None."""
    return TABLE_SUFFIXES.get(Path(path[:-3] if path.lower().endswith(".gz") else path).suffix.lower())


def _table_fields(path: str, delimiter: str, skipped: Counter) -> Iterator[tuple[int, str]]:
    """(data row number from 1, the column named "smiles" (in any case: MOSES's "SMILES", ZINC's "smiles")) of a CSV
    or TSV file with a header row, as the csv module reads it (quoted fields, even those holding a newline, as
    ZINC's do); rows without that field are counted as "empty"."""
    with _opened(path, encoding="utf-8-sig", errors="replace", newline="") as handle:
        rows = csv.reader(handle, delimiter=delimiter)
        header = next(rows, [])
        names = [name.strip().lower() for name in header]
        if "smiles" not in names:
            raise ValueError(f"source: expected a column named 'smiles' (in any case) in the header of {path}, got "
                             f"{header}")
        column = names.index("smiles")
        for number, row in enumerate(rows, 1):
            field = row[column].strip() if column < len(row) else ""
            if field:
                yield number, field
            else:
                skipped["empty"] += 1


def _moses_fields(source: str, skipped: Counter) -> tuple[tuple[str, ...], Iterator[str]]:
    """(path read, SMILES fields) of the MOSES set `source` names ("moses" is "moses:train")."""
    path = _moses_file(moses_split(source))
    return (path,), (field for _, field in _table_fields(path, ",", skipped))


# Lines that end a molfile ("M  END") or an SD record ("$$$$"); neither is a SMILES, nor begins one.
SD_FILE_LINES = (b"M  END", b"$$$$")


def file_fields(path: str, smiles: bool, skipped: Counter) -> Iterator[tuple[int, str]]:
    """(record number from 1, sequence) of each record of a data file, as `load_sequences` reads one: with `smiles`,
    the "smiles" column of a CSV/TSV (".gz" allowed) by data row, else each line's first whitespace-separated
    field (a name may follow); without, each whole line. Empty and undecodable records are counted in `skipped`.
    With `smiles`, an SD or MOL file (molfile blocks) is a ValueError naming `source` and the file: read line by
    line, its property values that happen to parse ("N", a SMILES property) would be its molecules."""
    delimiter = _table_delimiter(path) if smiles else None
    if delimiter:
        return _table_fields(path, delimiter, skipped)
    lines = _read_lines(path)
    if smiles and any(line.rstrip() in SD_FILE_LINES for line in lines):
        raise ValueError(f"source: expected one SMILES per line or a .csv/.tsv table, got an SD/MOL file (its "
                         f"molfile blocks end with 'M  END') in {path}: write its molecules as SMILES first (rdkit: "
                         "Chem.SDMolSupplier, Chem.MolToSmiles)")
    return _fields(lines, 0 if smiles else None, None, skipped)


def _molecules(items: Iterable[str], canonicalize: bool, dedupe: bool, molecule_filter: MoleculeFilter | None,
               skipped: Counter) -> Iterator[tuple[str, str]]:
    """(sequence, de-duplication key) of the items that parse as SMILES and pass `molecule_filter`, the rest counted:
    the sequence is the item, or its canonical SMILES if `canonicalize`; the key is the canonical SMILES (one per
    molecule, however written) if `dedupe`, else the item (not read)."""
    Chem = _chem()
    for item in items:
        mol = parse_smiles(item)
        if mol is None:
            skipped["unparsable"] += 1
        elif molecule_filter is not None and (reason := molecule_filter.reject_reason(mol)):
            skipped[reason] += 1
        else:
            # the canonical form only where it is read (it costs half a parse)
            canonical = Chem.MolToSmiles(mol) if canonicalize or dedupe else item
            yield canonical if canonicalize else item, canonical


def _short_and_new(items: Iterable[tuple[str, str]], max_length: int | None, dedupe: bool,
                   skipped: Counter) -> Iterator[str]:
    """The items of (sequence, dedupe key) of at most `max_length` characters (None: any), each key once if
    `dedupe`; the rest counted."""
    seen = set()
    for item, key in items:
        if max_length is not None and len(item) > max_length:
            skipped["too_long"] += 1
        elif dedupe and key in seen:
            skipped["duplicate"] += 1
        else:
            seen.add(key)
            yield item


def names_first(path: str | os.PathLike, lines: int = 1000) -> bool:
    """Whether a SMILES file looks written name first (`mol1 CCO`), not as `load_sequences` reads it (SMILES, then an
    optional name: the .smi convention of MOSES's and rdkit's files): most of the first `lines` lines whose first
    field rdkit cannot parse have a second field that it can. False for a CSV/TSV table (read by its header)."""
    path = os.fspath(path)
    if _table_delimiter(path):
        return False
    unparsable = named = 0
    with silence_rdkit():
        for raw in _read_lines(path):
            parts = raw.decode("utf-8", errors="replace").split()
            if not parts or parse_smiles(parts[0]) is not None:
                continue
            unparsable += 1
            named += len(parts) > 1 and parse_smiles(parts[1]) is not None
            if unparsable == lines:
                break
    return named > unparsable / 2


def comma_separated(path: str | os.PathLike, lines: int = 1000) -> bool:
    """Whether a SMILES file looks like a comma-separated table under another name than .csv (`CCO,mol1`): most of
    its first `lines` non-empty lines hold a comma in their first whitespace-separated field, which no SMILES holds.
    False for a CSV/TSV table (read by its header)."""
    path = os.fspath(path)
    if _table_delimiter(path):
        return False
    fields = [line.split()[0] for line in itertools.islice(filter(bytes.strip, _read_lines(path)), lines)]
    return sum(b"," in field for field in fields) > len(fields) / 2


def load_sequences(
    source: str | os.PathLike = "rdkit",
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
            text file with one sequence per line (write "./rdkit" for a file that is named like a source),
            gzip-compressed too (known by its content, whatever the name); with `smiles=True`, a ".csv" or
            ".tsv" file (".gz" after it allowed) is a table whose header names a "smiles" column (in any
            case), as MOSES's and ZINC's are. A gzip file cut short or corrupt: ValueError.
        max_length: longest sequence kept, in characters (= tokens, <eos> excluded); longer: "too_long".
            None: any length (for a caller that rewrites the sequences and limits the form it keeps).
        smiles: parse each line with rdkit (unparsable lines: "unparsable"). None: True for "rdkit",
            False for MOSES (curated and valid; parsing 1.6 M molecules takes minutes) and for a file.
            For a file with `smiles=True` the first whitespace-separated field of a line is the
            SMILES (so "SMILES name" lines work).
        canonicalize: write each parsed molecule as rdkit's canonical SMILES (only with smiles).
            None: True when `smiles` is, except for MOSES, whose strings are kept as published.
        molecule_filter: reject parsed molecules that fail it (reasons "fragments", "element",
            "charged", "size"). None: `DRUG_LIKE` for "rdkit", no filter otherwise.
        dedupe: drop repeats, counted as "duplicate": with `smiles`, repeated molecules (the same canonical
            SMILES, however each line writes it; without `canonicalize`, the first line's string is kept), else
            repeated strings.
        limit: stop once this many sequences are kept (None: all). Whether that left one out is
            `LoadResult.limit_reached`; `skipped` counts the lines read up to the last one kept.

    Returns:
        LoadResult(sequences, skipped, sources, limit_reached). Skip reasons: "undecodable" (not UTF-8), "empty",
        "unparsable", "fragments", "element", "charged", "size", "too_long", "duplicate".
    """
    source = os.fspath(instance("source", source, (str, os.PathLike)))
    max_length = integer("max_length", max_length, lo=1, none=True)
    limit = integer("limit", limit, lo=0, none=True)
    dedupe = boolean("dedupe", dedupe)
    is_moses = is_builtin_source(source) and source != "rdkit"
    smiles = (source == "rdkit") if smiles is None else boolean("smiles", smiles)
    canonicalize = (smiles and not is_moses) if canonicalize is None else boolean("canonicalize", canonicalize)
    if molecule_filter is None and smiles and source == "rdkit":
        molecule_filter = DRUG_LIKE
    if canonicalize and not smiles:
        raise ValueError("canonicalize: expected False or None when smiles=False, got True")
    if molecule_filter is not None and not smiles:
        raise ValueError(f"molecule_filter: expected None when smiles=False, got {molecule_filter!r}")

    skipped = Counter()
    if source == "rdkit":
        paths, items = _rdkit_fields(skipped)
    elif is_moses:
        paths, items = _moses_fields(source, skipped)
    elif os.path.isfile(source):
        paths, items = (source,), (field for _, field in file_fields(source, smiles, skipped))
    else:
        raise FileNotFoundError(
            f"source: expected 'rdkit', 'moses', 'moses:<split>' or an existing file, got {source!r}"
        )
    # (sequence, dedupe key): a molecule is one however it is written; any other text is its string.
    keyed = _molecules(items, canonicalize, dedupe, molecule_filter, skipped) if smiles else ((s, s) for s in items)
    with silence_rdkit() if smiles else contextlib.nullcontext():  # the generators above run here
        usable = _short_and_new(keyed, max_length, dedupe, skipped)
        kept = list(itertools.islice(usable, limit))
        counted = dict(skipped)  # before the look past the limit, whose skipped lines were not to be read
        # A file of exactly `limit` usable sequences was read whole: only one more usable sequence was left out.
        limit_reached = len(kept) == limit and next(usable, None) is not None
    return LoadResult(kept, counted, paths, limit_reached)
