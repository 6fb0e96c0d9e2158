"""Tests for SMILES / text loading, the character vocabulary, splitting and batching (data/smiles/)."""

import gzip
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("rdkit")

from jax_scan_rnn.data import smiles as sm  # noqa: E402
from jax_scan_rnn.data.smiles import (  # noqa: E402
    DEFAULT_MAX_LENGTH,
    EOS,
    PAD,
    SOS,
    SPECIAL_TOKENS,
    LoadResult,
    Vocabulary,
    batch_at,
    canonical_smiles,
    load_sequences,
    split,
)


@pytest.fixture(scope="module")
def rdkit_set() -> LoadResult:
    return load_sequences("rdkit")


# ---------------------------------------------------------------- sources


def test_rdkit_source_gives_thousands_of_clean_canonical_unique_smiles(rdkit_set):
    seqs = rdkit_set.sequences
    assert 12_000 <= len(seqs) <= 17_000, len(seqs)
    assert len(set(seqs)) == len(seqs), "duplicates survived"
    assert max(map(len, seqs)) <= DEFAULT_MAX_LENGTH
    assert len(rdkit_set.sources) == len(sm.RDKIT_FILES)
    for reason in ("charged", "element", "fragments", "too_long", "duplicate", "unparsable"):
        assert rdkit_set.skipped.get(reason, 0) > 0, (reason, rdkit_set.skipped)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(seqs), 200, replace=False):
        assert canonical_smiles(seqs[i]) == seqs[i], f"not canonical: {seqs[i]!r}"
    chars = set("".join(seqs))
    assert chars <= set("#()-123456789=@/\\BCFHNOS[]clnors"), sorted(chars)
    assert "." not in chars and "+" not in chars


def test_file_source_counts_bad_lines_by_reason(tmp_path):
    path = tmp_path / "seqs.txt"
    lines = [
        b"CCO",
        b"",
        b"   ",
        b"hello world",
        b"\xff\xfeCC",
        b"x" * 11,
        b"C" * 12,
        b"CCO",
        b"C(",
        b"OCC eth",
    ]
    path.write_bytes(b"\r\n".join(lines) + b"\n")

    text = load_sequences(str(path), max_length=10)
    assert text.sequences == ["CCO", "C(", "OCC eth"]
    assert text.skipped == {"empty": 2, "undecodable": 1, "too_long": 3, "duplicate": 1}, text.skipped

    mols = load_sequences(path, max_length=10, smiles=True)
    # SMILES mode reads the first field: "hello", "xxxxxxxxxxx" and "C(" do not parse, the 12 carbons
    # are too long, and "OCC" canonicalises to the "CCO" already kept.
    assert mols.sequences == ["CCO"]
    assert mols.skipped == {"empty": 2, "undecodable": 1, "unparsable": 3, "too_long": 1, "duplicate": 2}, (
        mols.skipped
    )
    assert mols.sources == (str(path),)

    kept_all = load_sequences(str(path), max_length=10, dedupe=False)
    assert kept_all.sequences.count("CCO") == 2
    assert load_sequences(str(path), max_length=10, limit=1).sequences == ["CCO"]


def test_smiles_kept_as_written_are_deduplicated_by_molecule(tmp_path):
    """One molecule written two ways is one molecule (else it could land in training and in test): the first
    line's string is kept; text that is not parsed as SMILES is de-duplicated by its string."""
    path = tmp_path / "two_ways.smi"
    path.write_text("OCC\nc1ccccc1\nCCO\nC1=CC=CC=C1\nCCN\n")
    got = load_sequences(path, smiles=True, canonicalize=False)
    assert got.sequences == ["OCC", "c1ccccc1", "CCN"] and got.skipped == {"duplicate": 2}, got
    assert load_sequences(path, smiles=True).sequences == ["CCO", "c1ccccc1", "CCN"]  # canonical: as before
    assert len(load_sequences(path).sequences) == 5  # not SMILES: five strings


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    """Windows editors start a UTF-8 file with a BOM; it must not make the first molecule unparsable (or a
    character of the vocabulary)."""
    data = "\ufeffCCO\r\nCCN\r\n".encode("utf-8")
    (tmp_path / "bom.smi").write_bytes(data)
    with gzip.open(tmp_path / "bom.smi.gz", "wb") as f:
        f.write(data)
    for name in ("bom.smi", "bom.smi.gz"):
        assert load_sequences(tmp_path / name, smiles=True, canonicalize=False) == LoadResult(
            ["CCO", "CCN"], {}, (str(tmp_path / name),)), name
        assert load_sequences(tmp_path / name).sequences == ["CCO", "CCN"], name  # as text too


def test_limit_reached_only_when_a_usable_sequence_was_left_out(tmp_path):
    """A file of exactly `limit` usable molecules was read whole: `limit_reached` is False (the CLI must not say
    the data was cut); one more usable molecule makes it True. Skipped lines count only up to the last one kept:
    the look past the limit adds none."""
    exact = tmp_path / "exact.smi"
    exact.write_text("CCO\nOCC\nCCN\nC(\nCCC\n")  # 3 molecules, a duplicate, an unparsable line
    got = load_sequences(exact, smiles=True, limit=3)
    assert got.sequences == ["CCO", "CCN", "CCC"] and not got.limit_reached
    assert got.skipped == {"duplicate": 1, "unparsable": 1}
    assert not load_sequences(exact, limit=5).limit_reached and load_sequences(exact, limit=4).limit_reached  # text
    assert not load_sequences(exact, smiles=True, limit=4).limit_reached
    assert not load_sequences(exact, smiles=True).limit_reached
    more = tmp_path / "more.smi"
    more.write_text("CCO\nOCC\nCCN\nC(\nCCC\nX\nCCS\n")  # one more molecule after an unparsable line
    got = load_sequences(more, smiles=True, limit=3)
    assert got.sequences == ["CCO", "CCN", "CCC"] and got.limit_reached
    assert got.skipped == {"duplicate": 1, "unparsable": 1}  # "X", read to find "CCS", is not counted
    only_bad = tmp_path / "only_bad.smi"
    only_bad.write_text("CCO\nCCN\nCCC\nC(\nOCC\n")  # nothing usable after the third: not cut
    assert not load_sequences(only_bad, smiles=True, limit=3).limit_reached


def test_max_length_none_keeps_every_length(tmp_path):
    path = tmp_path / "long.smi"
    path.write_text("C" * 80 + "\nCCO\n")
    assert load_sequences(path, smiles=True, max_length=None).sequences == ["C" * 80, "CCO"]
    assert load_sequences(path, smiles=True).skipped == {"too_long": 1}


def test_names_first_tells_name_smiles_lines_from_bad_smiles(tmp_path):
    named = tmp_path / "named.smi"
    named.write_text("mol1 CCO\nmol2 c1ccccc1\nmol3 C1CC\nCCN ok\n")  # 2 of 3 unparsable firsts have a SMILES
    assert sm.names_first(named)
    smiles_first = tmp_path / "smiles_first.smi"
    smiles_first.write_text("CCO mol1\nC1CC mol2\nXyz mol3\n")  # the unparsable ones are bad SMILES, not names
    assert not sm.names_first(smiles_first)
    (tmp_path / "mols.csv").write_text("name,smiles\nmol1,CCO\n")
    assert not sm.names_first(tmp_path / "mols.csv")  # a table is read by its header


def test_a_table_is_read_by_its_smiles_column(tmp_path):
    """A .csv/.tsv (.gz too) with a header: the column named smiles in any case, quoted fields with a newline
    inside (ZINC's), rows without it counted; without such a column, one error naming the file and its header.
    Not read as a table without `smiles=True` (whole lines, as any text)."""
    rows = 'id,SMILES,label\n1,CCO,a\n2,"c1ccccc1\n",b\n3,,c\n4\n5,C(,d\n'
    (tmp_path / "mols.csv").write_text(rows)
    (tmp_path / "mols.tsv").write_text(rows.replace(",", "\t"))
    with gzip.open(tmp_path / "mols.csv.gz", "wt") as f:
        f.write(rows.replace("SMILES", "smiles"))
    for name in ("mols.csv", "mols.tsv", "mols.csv.gz"):
        got = load_sequences(tmp_path / name, smiles=True)
        assert got.sequences == ["CCO", "c1ccccc1"] and got.skipped == {"empty": 2, "unparsable": 1}, (name, got)
    assert load_sequences(tmp_path / "mols.csv").sequences[:2] == ["id,SMILES,label", "1,CCO,a"]
    (tmp_path / "prices.csv").write_text("date,close\n1,2\n")
    with pytest.raises(ValueError, match=r"source: expected a column named 'smiles' \(in any case\) in the header "
                                         r"of .*prices\.csv, got \['date', 'close'\]"):
        load_sequences(tmp_path / "prices.csv", smiles=True)


def test_file_source_arguments_are_checked(tmp_path):
    with pytest.raises(FileNotFoundError, match="source"):
        load_sequences(str(tmp_path / "missing.txt"))
    path = tmp_path / "a.txt"
    path.write_text("CCO\n")
    with pytest.raises(ValueError, match="max_length"):
        load_sequences(str(path), max_length=0)
    with pytest.raises(ValueError, match="molecule_filter"):
        load_sequences(str(path), molecule_filter=sm.DRUG_LIKE)
    with pytest.raises(ValueError, match="canonicalize"):
        load_sequences(str(path), canonicalize=True)
    with pytest.raises(ValueError, match="source"):
        load_sequences("moses:validation")
    with pytest.raises(ValueError, match="max_heavy_atoms: expected an int >= 10, got 5"):
        sm.MoleculeFilter(min_heavy_atoms=10, max_heavy_atoms=5)
    fifty = sm.parse_smiles("C" * 50)  # both bounds are inclusive
    assert sm.MoleculeFilter(max_heavy_atoms=50).reject_reason(fifty) is None
    assert sm.MoleculeFilter(max_heavy_atoms=49).reject_reason(fifty) == "size"
    assert sm.MoleculeFilter(min_heavy_atoms=50).reject_reason(fifty) is None
    assert sm.MoleculeFilter(min_heavy_atoms=51, max_heavy_atoms=60).reject_reason(fifty) == "size"


def test_moses_source_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps molsets"):
        load_sequences("moses")


def test_molsets_file_is_a_file_the_package_holds_or_none(monkeypatch, tmp_path):
    # A molsets folder without the file asked for (an older or partial install) is None, not a path that then
    # fails to open.
    from types import SimpleNamespace

    from jax_scan_rnn.data.smiles.sources import molsets_file

    (tmp_path / "dataset" / "data").mkdir(parents=True)
    (tmp_path / "dataset" / "data" / "test.csv.gz").write_bytes(b"")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(submodule_search_locations=[
        str(tmp_path)]))
    assert molsets_file("dataset", "data", "test.csv.gz") == str(tmp_path / "dataset" / "data" / "test.csv.gz")
    assert molsets_file("metrics", "mcf.csv") is None

@pytest.mark.skipif(importlib.util.find_spec("moses") is None, reason="molsets not installed")
def test_moses_source_reads_the_data_without_importing_moses():
    result = load_sequences("moses:test", limit=500, smiles=True)
    assert len(result.sequences) == 500 and result.skipped == {}
    assert "moses" not in sys.modules


def test_importing_the_module_does_not_import_rdkit():
    code = "import sys, jax_scan_rnn.data.smiles, jax_scan_rnn.metrics; print('rdkit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- vocabulary


def test_kekule_forms_are_canonical_kekule_and_canonical_smiles_in_workers_or_not(rdkit_set, monkeypatch):
    """`kekule_forms`: each SMILES's Kekulé form and canonical SMILES, None for an invalid one, in order, the same
    whether this process converts them or worker processes do (here from 100 molecules on, instead of 20,000)."""
    from jax_scan_rnn.data.smiles.sources import _kekule_chunk

    given = [*rdkit_set.sequences[:300], "C1CC", "c1cccc1", ""]  # an open ring, a ring with no Kekulé form, empty
    expected = [None if sm.canonical_smiles(s) is None
                else (sm.canonical_smiles(s, kekule=True), sm.canonical_smiles(s)) for s in given]
    assert expected[-3:] == [None] * 3 and all(not set("cnops") & set(k) for k, _ in expected[:-3])
    assert _kekule_chunk(given) == expected
    monkeypatch.setattr(sm.sources, "KEKULE_PARALLEL_FROM", 100)
    assert sm.kekule_forms(given) == expected
    monkeypatch.delattr(sm.sources.os, "sched_getaffinity")  # macOS has none: os.cpu_count() instead
    assert sm.kekule_forms(given) == expected


def test_a_kekule_worker_reads_and_writes_utf8_lines_split_at_newline_only(monkeypatch):
    """The worker's stdin and stdout as Windows gives them to a child whose stdio are files: cp1252, universal
    newlines in ("\r" ends a line), "\r\n" out. It reads and writes bytes, so the caller gets one "\n"-ended line per
    SMILES it sent, in UTF-8, whatever the platform: an "Á" (bytes cp1252 cannot decode) and a "\r" inside a line
    are one invalid molecule each, and a canonical form carries no "\r"."""
    from jax_scan_rnn.data.smiles import sources

    given = "CCO\nÁ\nC\rC\nc1ccccc1"
    out = io.BytesIO()
    monkeypatch.setattr(sources.sys, "stdin", io.TextIOWrapper(io.BytesIO(given.encode()), encoding="cp1252"))
    monkeypatch.setattr(sources.sys, "stdout", io.TextIOWrapper(out, encoding="cp1252", newline="\r\n"))
    sources._kekule_worker()
    assert out.getvalue().decode().split("\n") == ["CCO CCO", "", "", "C1=CC=CC=C1 c1ccccc1", ""]


def test_ctrl_c_during_kekule_forms_is_quiet_in_the_workers_and_stops_every_one(monkeypatch):
    """A terminal's Ctrl-C reaches every worker: each exits 130 without a traceback (the CLI says it, once). The
    caller's KeyboardInterrupt (or any error) kills the workers still running instead of leaving them orphaned."""
    from jax_scan_rnn.data.smiles import sources

    def interrupted(chunk):
        raise KeyboardInterrupt

    monkeypatch.setattr(sources, "_kekule_chunk", interrupted)
    monkeypatch.setattr(sources.sys, "stdin", io.TextIOWrapper(io.BytesIO(b"CCO\n")))
    with pytest.raises(SystemExit) as stopped:
        sources._kekule_worker()
    assert stopped.value.code == 130

    killed = []

    class Worker:  # the first is waited on when Ctrl-C comes; the second still runs
        def __init__(self, *args, **kwargs):
            self.index = len(killed)
            killed.append(False)

        def wait(self):
            raise KeyboardInterrupt

        def poll(self):
            return None

        def kill(self):
            killed[self.index] = True

    monkeypatch.setattr(sources, "KEKULE_PARALLEL_FROM", 1)
    monkeypatch.setattr(sources.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(sources.subprocess, "Popen", Worker)
    with pytest.raises(KeyboardInterrupt):
        sources.kekule_forms(["CCO", "CCN", "CCC", "CCS"])
    assert killed == [True, True]


def test_kekule_forms_read_back_from_the_cache_are_the_ones_converted(tmp_path, monkeypatch):
    """`kekule_forms(..., cache=folder)` keeps one file per list; the same list again is read back, nothing converted;
    another list, or the same under another rdkit version, is converted (and kept) anew."""
    from jax_scan_rnn.data.smiles import sources

    given = ["CCO", "c1ccccc1", "C1CC", "", "Á", "C\rC"]  # valid, aromatic, open ring, empty, no SMILES, a "\r"
    expected = sources.kekule_forms(given)
    assert sources.kekule_forms(given, cache=tmp_path) == expected
    (entry,) = tmp_path.glob("kekule-*.gz")
    umask = os.umask(0o022)
    os.umask(umask)
    assert entry.stat().st_mode & 0o777 == 0o666 & ~umask  # as any file the user writes: a shared folder works
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # no temporary file left
    converted = []
    convert = sources._convert
    monkeypatch.setattr(sources, "_convert", lambda sequences: converted.append(sequences) or convert(sequences))
    assert sources.kekule_forms(given, cache=tmp_path) == expected and converted == []
    assert sources.kekule_forms(given[:-1], cache=tmp_path) == expected[:-1] and converted == [given[:-1]]
    monkeypatch.setattr(sources.require("rdkit", "test"), "__version__", "1999.01")
    assert sources.kekule_forms(given, cache=tmp_path) == expected and converted[-1] == given
    assert len(list(tmp_path.glob("kekule-*.gz"))) == 3
    # a line break inside a molecule would split the file's lines: such a list is converted, never kept
    assert sources.kekule_forms(["C\nC"], cache=tmp_path) == sources.kekule_forms(["C\nC"])
    assert len(list(tmp_path.glob("kekule-*.gz"))) == 3


@pytest.mark.parametrize("damage", ["truncated", "a flipped bit", "another list"])
def test_a_cache_file_that_does_not_read_back_whole_is_converted_again_and_replaced(tmp_path, damage):
    from jax_scan_rnn.data.smiles import sources

    given = ["CCO", "c1ccccc1", "C1CC"]
    expected = sources.kekule_forms(given, cache=tmp_path)
    (entry,) = tmp_path.glob("kekule-*.gz")
    whole = entry.read_bytes()
    if damage == "truncated":  # a process killed mid-write cannot leave this (os.replace): a disk can
        entry.write_bytes(whole[:-9])
    elif damage == "a flipped bit":  # in the compressed body: zlib or gzip's CRC-32 refuses it
        entry.write_bytes(whole[:len(whole) // 2] + bytes([whole[len(whole) // 2] ^ 1]) + whole[len(whole) // 2 + 1:])
    else:  # a whole file whose header counts other molecules
        entry.write_bytes(gzip.compress(sources._cache_header(2) + b"CCO CCO\n\n"))
    with pytest.warns(UserWarning, match="converting the molecules again"):
        assert sources.kekule_forms(given, cache=tmp_path) == expected
    assert entry.read_bytes() == whole  # written whole again (gzip's mtime is 0: the same bytes)


def test_a_cache_that_cannot_be_written_warns_and_the_forms_are_returned(tmp_path):
    from jax_scan_rnn.data.smiles import sources

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match=f"cannot keep the forms in {blocker}/cache"):
        assert sources.kekule_forms(["CCO"], cache=blocker / "cache") == [("CCO", "CCO")]
    assert list(tmp_path.iterdir()) == [blocker]


def test_the_cache_keeps_the_most_recently_used_lists_within_its_bound(tmp_path, monkeypatch):
    """Past `KEKULE_CACHE_MAX_BYTES` the least recently used files go (a read counts as a use), never the one just
    written; a temporary file a dead process left a day ago goes too, a newer one (a writer at work) stays."""
    from jax_scan_rnn.data.smiles import sources

    lists = [["CCO"], ["CCN"], ["CCC"], ["CCS"]]
    entries = [sources._cache_entry(tmp_path, molecules) for molecules in lists]
    for age, molecules in zip((40, 30, 20), lists):
        sources.kekule_forms(molecules, cache=tmp_path)
        os.utime(sources._cache_entry(tmp_path, molecules), (time.time() - age,) * 2)
    sources.kekule_forms(lists[0], cache=tmp_path)  # read back: now the newest of the three
    stale, fresh = tmp_path / ".kekule-dead", tmp_path / ".kekule-writing"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * 24 * 3600,) * 2)
    # room for two of these (near-equal) files: the newest two stay
    monkeypatch.setattr(sources, "KEKULE_CACHE_MAX_BYTES", sum(entries[i].stat().st_size for i in (0, 2)) + 10)
    sources.kekule_forms(lists[3], cache=tmp_path)
    assert [e.exists() for e in entries] == [True, False, False, True]
    assert not stale.exists() and fresh.exists()


def test_special_tokens_have_one_definition():
    from jax_scan_rnn import vae

    assert (PAD, SOS, EOS) == (0, 1, 2) and SPECIAL_TOKENS == ("<pad>", "<sos>", "<eos>")  # docs/vae_spec.md
    assert (vae.PAD, vae.SOS, vae.EOS) == (PAD, SOS, EOS)
    # torch_ref never imports jax_scan_rnn, so it keeps its own copy: it must agree.
    torch_vae = pytest.importorskip("torch_ref.vae")
    assert (torch_vae.PAD, torch_vae.SOS, torch_vae.EOS) == (PAD, SOS, EOS)


def test_vocabulary_round_trip(rdkit_set):
    vocab = Vocabulary.build(rdkit_set.sequences)
    assert vocab.tokens[:3] == SPECIAL_TOKENS and vocab.size == len(vocab.tokens)
    seqs = rdkit_set.sequences[:300] + [""]
    tokens, lengths = vocab.encode(seqs, DEFAULT_MAX_LENGTH)
    assert tokens.shape == (len(seqs), DEFAULT_MAX_LENGTH + 1) and tokens.dtype == np.int32
    assert lengths.dtype == np.int32
    np.testing.assert_array_equal(lengths, [len(s) + 1 for s in seqs])
    np.testing.assert_array_equal((tokens != PAD).sum(axis=1), lengths)
    np.testing.assert_array_equal(tokens[np.arange(len(seqs)), lengths - 1], EOS)
    assert vocab.decode(tokens) == seqs


def test_encode_layout_and_decode_rules():
    vocab = Vocabulary.build(["ab", "ca"])
    assert vocab.tokens == SPECIAL_TOKENS + ("a", "b", "c")
    tokens, lengths = vocab.encode(["ab", "c"], max_len=3)
    np.testing.assert_array_equal(tokens, [[3, 4, 2, 0], [5, 2, 0, 0]])
    np.testing.assert_array_equal(lengths, [3, 2])
    assert vocab.encode(["ab", "c"])[0].shape == (2, 3)  # max_len=None: the longest
    # Decoding stops at the first <eos> (a row without one is decoded whole); a <pad> or <sos> before it is what the
    # model wrote, so it is written out by name, not dropped.
    assert vocab.decode(np.array([[1, 3, 0, 4, 2, 5], [5, 5, 5, 5, 5, 5]])) == ["<sos>a<pad>b", "cccccc"]


def test_a_sampled_pad_or_sos_is_never_decoded_into_a_valid_molecule():
    """Dropped, `C <pad> C <eos>` would read "CC", a valid molecule the model did not write."""
    from jax_scan_rnn import metrics

    vocab = Vocabulary.build(["CO"])
    c, o = vocab.tokens.index("C"), vocab.tokens.index("O")
    written = vocab.decode(np.array([[c, PAD, c, EOS, PAD], [c, SOS, o, EOS, PAD], [c, o, EOS, PAD, PAD]]))
    assert written == ["C<pad>C", "C<sos>O", "CO"]
    assert [metrics.validity([s]) for s in written] == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="tokens"):
        vocab.decode(np.array([[3, 9]]))
    with pytest.raises(ValueError, match="tokens"):
        vocab.decode(np.array([3, 4]))


def test_unknown_character_names_character_and_sequence():
    vocab = Vocabulary.build(["CCO", "c1ccccc1"])
    with pytest.raises(ValueError, match=r"'l'.*'CCCl'"):
        vocab.encode(["CCO", "CCCl"], max_len=10)
    with pytest.raises(ValueError, match=r"max_len=3.*'CCCC'"):
        vocab.encode(["CCCC"], max_len=3)
    with pytest.raises(TypeError, match="sequences"):
        vocab.encode("CCO", max_len=3)
    with pytest.raises(ValueError, match=r"'l'.*'CCCl' is not in the vocabulary \(expected one of '1COc'\)$"):
        vocab.encode(["CCCl"], max_len=10)  # a vocabulary with aromatic atoms: no Kekulé hint
    with pytest.raises(ValueError, match=r"character 'N' of sequence 1 'NC' is not"):  # its first character: still sequence 1
        vocab.encode(["CC", "NC"], max_len=10)
    kekule = Vocabulary.build(["CCO", "C1=CC=CC=C1"])  # a Kekulé run's: aromatic SMILES are named as the cause
    with pytest.raises(ValueError, match=r"'c' of sequence 0 'c1ccccc1' is not in the vocabulary \(expected one of "
                                         r"'1=CO'\); it has no aromatic atoms: a model trained on Kekulé SMILES .*"
                                         r"canonical_smiles\(s, kekule=True\)$"):
        kekule.encode(["c1ccccc1"], max_len=10)


def test_vocabulary_json_round_trip_and_validation():
    vocab = Vocabulary.build(["CC(=O)Nc1ccc(O)cc1", "Brc1ccccc1", "é"])
    again = Vocabulary.from_json(vocab.to_json())
    assert again == vocab and again.tokens == vocab.tokens
    assert hash(again) == hash(vocab)
    np.testing.assert_array_equal(again.encode(["CC(=O)"], 8)[0], vocab.encode(["CC(=O)"], 8)[0])
    with pytest.raises(ValueError, match="text"):
        Vocabulary.from_json("not json")
    with pytest.raises(ValueError, match="tokens"):
        Vocabulary(("a", "b"))
    with pytest.raises(ValueError, match="tokens"):
        Vocabulary(SPECIAL_TOKENS + ("a", "a"))
    with pytest.raises(ValueError, match="tokens"):
        Vocabulary(SPECIAL_TOKENS + ("Cl",))
    # Another format version (a newer tokenisation, "Cl" one token) is refused naming it, never read as this one's;
    # a vocabulary saved without the field (none was) reads as version 1.
    newer = json.dumps({"format": "jax_scan_rnn.Vocabulary", "version": 2, "tokens": [*SPECIAL_TOKENS, "C", "Cl"]})
    with pytest.raises(ValueError, match=r"^text: expected a Vocabulary of format version 1, got version 2: it "
                                         r"was written by another jax-scan-rnn than this one \(.*\); read it with"):
        Vocabulary.from_json(newer)
    assert Vocabulary.from_json(json.dumps({"tokens": list(vocab.tokens)})) == vocab


# ---------------------------------------------------------------- split and batches


def test_split_is_deterministic_disjoint_and_complete():
    seqs = [f"s{i}" for i in range(1000)]
    parts = split(seqs, (0.8, 0.1, 0.1), seed=3)
    assert [len(p) for p in parts] == [800, 100, 100]
    assert parts == split(seqs, (0.8, 0.1, 0.1), seed=3)
    assert parts != split(seqs, (0.8, 0.1, 0.1), seed=4)
    sets = [set(p) for p in parts]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert set().union(*sets) == set(seqs)
    assert parts[1] == sorted(parts[1], key=seqs.index)  # input order kept within a part
    assert [len(p) for p in split(seqs[:7], (0.5, 0.5), seed=0)] == [4, 3]
    with pytest.raises(ValueError, match="fractions"):
        split(seqs, (0.8, 0.3))
    with pytest.raises(ValueError, match="seed"):
        split(seqs, (1.0,), seed=-1)


def test_split_sizes_and_the_minimum_for_given_part_sizes():
    fractions = (0.9, 0.05, 0.05)
    for n in (0, 1, 7, 10, 31, 1000):
        parts = split(list(range(n)), fractions, seed=1)
        assert sm.split_sizes(n, fractions) == tuple(len(p) for p in parts), n
    assert sm.split_sizes(30, fractions) == (27, 2, 1)  # round-half-even: 28.5 -> 28
    assert sm.split_sizes(31, fractions) == (28, 1, 2)
    need = sm.min_split_size(fractions, (8, 1, 2))
    assert need == 31
    assert all(min(np.subtract(sm.split_sizes(n, fractions), (8, 1, 2))) >= 0 for n in range(need, need + 500))
    # The first size that works is not always the threshold: 25..30 give 2 validation sequences, 31 only 1.
    assert sm.min_split_size(fractions, (1, 2, 1)) == 36
    assert sm.split_sizes(25, fractions)[1] == 2 and sm.split_sizes(31, fractions)[1] == 1
    assert sm.min_split_size((0.5, 0.5), (0, 0)) == 0

    def by_trying_each(sizes, minimums):  # the definition: the last size that fails, plus 1 (sizes: n = 0, 1, ...)
        fails = np.flatnonzero((sizes < np.array(minimums)).any(axis=1))
        return int(fails[-1]) + 1 if fails.size else 0

    rng = np.random.default_rng(0)
    for fractions in [(0.9, 0.05, 0.05), (0.8, 0.1, 0.1), (1 / 3, 1 / 3, 1 / 3), (0.7, 0.3)]:
        sizes = np.array([sm.split_sizes(n, fractions) for n in range(3000)])  # once for the 20 minimums below
        for _ in range(20):
            minimums = tuple(int(m) for m in rng.integers(0, 60, len(fractions)))
            assert sm.min_split_size(fractions, minimums) == by_trying_each(sizes, minimums), (fractions, minimums)
    # A batch size of billions (`train vae --batch-size 5000000000`): found at once, without trying every size.
    need = sm.min_split_size(fractions := (0.9, 0.05, 0.05), minimums := (5_000_000_000, 1, 2))
    assert min(np.subtract(sm.split_sizes(need - 1, fractions), minimums)) < 0
    assert all(min(np.subtract(sm.split_sizes(n, fractions), minimums)) >= 0 for n in range(need, need + 100))
    with pytest.raises(ValueError, match="minimums: expected 0 for a part of fraction 0"):
        sm.min_split_size((1.0, 0.0), (1, 1))
    with pytest.raises(ValueError, match="minimums: expected 2 ints >= 0"):
        sm.min_split_size((0.5, 0.5), (1,))
    with pytest.raises(ValueError, match="fractions"):
        sm.split_sizes(10, (0.5, 0.6))
    with pytest.raises(ValueError, match="n: expected an int >= 0, got -1"):
        sm.split_sizes(-1)


def test_builtin_sources_and_files():
    assert sm.is_builtin_source("rdkit") and sm.is_builtin_source("moses") and sm.is_builtin_source("moses:test")
    assert not sm.is_builtin_source("./rdkit") and not sm.is_builtin_source("mols.smi")


def test_batch_at_is_a_pure_function_of_the_step():
    n, t, batch = 103, 5, 10
    tokens = np.arange(n * t, dtype=np.int32).reshape(n, t)
    lengths = np.arange(n, dtype=np.int32)
    run = [batch_at(tokens, lengths, batch, step, seed=7) for step in range(25)]
    for step in (0, 9, 10, 24):  # "resuming" at any step gives the same batch
        b_tokens, b_lengths = batch_at(tokens, lengths, batch, step, seed=7)
        np.testing.assert_array_equal(b_tokens, run[step][0])
        np.testing.assert_array_equal(b_lengths, run[step][1])
    for b_tokens, b_lengths in run:
        assert b_tokens.shape == (batch, t)
        np.testing.assert_array_equal(b_tokens[:, 0] // t, b_lengths)  # rows stay paired
    epoch0 = np.concatenate([run[s][1] for s in range(10)])  # 103 // 10 = 10 batches per epoch
    epoch1 = np.concatenate([run[s][1] for s in range(10, 20)])
    assert len(set(epoch0)) == 100 and len(set(epoch1)) == 100  # no row twice within an epoch
    assert not np.array_equal(epoch0, epoch1)  # reshuffled each epoch
    assert not np.array_equal(run[0][1], batch_at(tokens, lengths, batch, 0, seed=8)[1])
    with pytest.raises(ValueError, match="batch_size"):
        batch_at(tokens, lengths, n + 1, 0)
    with pytest.raises(ValueError, match="step"):
        batch_at(tokens, lengths, batch, -1)
    with pytest.raises(ValueError, match="lengths"):
        batch_at(tokens, lengths[:-1], batch, 0)


def test_bucketed_batches_hold_similar_lengths_and_visit_every_row_once_per_epoch():
    """pool > 0: each pool of batches is sorted by length before it is cut, so a batch's lengths span a
    small range; every row is still visited once per epoch, the batches' order is shuffled, and the batch
    is a pure function of the step. `trim` then cuts the padding columns, rounding up to `multiple`."""
    n, t, batch, pool = 1000, 64, 20, 10  # 50 batches per epoch: five pools of ten
    lengths = np.random.default_rng(0).integers(1, t + 1, n).astype(np.int32)
    tokens = np.where(np.arange(t) < lengths[:, None], np.arange(n)[:, None] + 1, 0).astype(np.int32)  # id + 1, then 0
    run = [batch_at(tokens, lengths, batch, step, seed=3, pool=pool) for step in range(100)]
    for step in (0, 37, 50, 99):  # "resuming" at any step gives the same batch
        np.testing.assert_array_equal(batch_at(tokens, lengths, batch, step, seed=3, pool=pool)[0], run[step][0])
    for b_tokens, b_lengths in run:
        np.testing.assert_array_equal(b_tokens[:, 0] - 1 >= 0, True)
        np.testing.assert_array_equal(lengths[b_tokens[:, 0] - 1], b_lengths)  # rows stay paired
    for epoch in (0, 1):
        ids = np.concatenate([b[0][:, 0] - 1 for b in run[50 * epoch : 50 * (epoch + 1)]])
        assert len(set(ids)) == n  # 50 * 20 = every row, once
    spread = np.mean([b_lengths.max() - b_lengths.min() for _, b_lengths in run])
    random_spread = np.mean([b[1].max() - b[1].min() for b in (batch_at(tokens, lengths, batch, s) for s in range(100))])
    assert spread < 0.2 * random_spread, (spread, random_spread)  # ~6 of 64 against ~60
    firsts = [b[1].min() for b in run[:10]]
    assert firsts != sorted(firsts)  # the batches' order is shuffled, not short to long
    assert not np.array_equal(run[0][0], batch_at(tokens, lengths, batch, 0, seed=4, pool=pool)[0])
    with pytest.raises(ValueError, match="pool: expected an int >= 0"):
        batch_at(tokens, lengths, batch, 0, pool=-1)

    b_tokens, b_lengths = run[0]
    cut = sm.trim(b_tokens, b_lengths)
    assert cut.shape[1] == min(t, -(-int(b_lengths.max()) // 8) * 8) and cut.shape[1] % 8 == 0
    np.testing.assert_array_equal(b_tokens[:, cut.shape[1]:], 0)  # only padding was cut
    assert sm.trim(b_tokens, np.full(batch, 61), multiple=8).shape == (batch, t)  # at most T
    assert sm.trim(b_tokens, b_lengths, multiple=1).shape == (batch, int(b_lengths.max()))
    with pytest.raises(ValueError, match="lengths: expected at most T=64"):
        sm.trim(b_tokens, np.full(batch, 65))


def test_bucketing_leaves_out_the_same_rows_as_the_plain_epoch_when_nothing_divides():
    # 10 rows in batches of 3: 3 batches an epoch and one row left out; pools of 2 batches: the last pool holds one
    # batch. The pooled epoch regroups the plain epoch's 9 rows; it never reaches for the row left out.
    tokens = np.arange(10, dtype=np.int32)[:, None]  # row id as its token
    lengths = np.arange(10, 0, -1, dtype=np.int32)
    for seed in range(20):
        plain = [int(i) for step in range(3) for i in batch_at(tokens, lengths, 3, step, seed)[0][:, 0]]
        pooled = [int(i) for step in range(3) for i in batch_at(tokens, lengths, 3, step, seed, pool=2)[0][:, 0]]
        assert sorted(pooled) == sorted(plain) and len(set(pooled)) == 9, (seed, plain, pooled)


def test_names_first_needs_more_than_half_of_the_unparsable_lines_named(tmp_path):
    """"Most" unparsable first fields followed by a SMILES means more than half: a file where exactly half are
    (as many bad SMILES with a name after them as name-first lines) is not taken for name-first; one more is."""
    half = tmp_path / "half.smi"
    half.write_text("mol1 CCO\nXyz mol2\nCCN ok\nmol3 c1ccccc1\nQq mol4\n")  # 4 unparsable firsts, 2 named
    assert not sm.names_first(half)
    half.write_text("mol1 CCO\nXyz mol2\n")  # 1 of 2
    assert not sm.names_first(half)
    more = tmp_path / "more.smi"
    more.write_text("mol1 CCO\nXyz mol2\nmol3 c1ccccc1\n")  # 2 of 3
    assert sm.names_first(more)


@pytest.mark.parametrize("bad", [-1, 6, 7])
def test_decode_refuses_ids_outside_the_vocabulary(bad):
    """Ids must lie in [0, size): the id equal to the size (one past the last token) and -1 (which numpy indexing
    would read as the last token, decoding a character the model never wrote) are refused, naming the range."""
    vocab = Vocabulary.build(["ab", "ca"])
    assert vocab.size == 6
    assert vocab.decode(np.array([[3, 5, 2]])) == ["ac"]  # the last id, 5, is still a token
    with pytest.raises(ValueError, match=rf"^tokens: expected ids in \[0, 6\), got values in \[{min(bad, 2)}, "
                                         rf"{max(bad, 3)}\]$"):
        vocab.decode(np.array([[3, bad, 2]]))


def test_gzip_is_known_by_its_content_and_a_broken_one_is_one_error_naming_the_file(tmp_path):
    """A compressed file is read whatever its name's case (".CSV.GZ") or suffix (a ".gz" a browser already
    unpacked is plain text); one cut short (an interrupted download) or not gzip inside is a ValueError naming
    `source` and the file, never a traceback from the gzip module."""
    lines = "CCO ethanol\nc1ccccc1 benzene\n"
    table = "ID,SMILES\n1,CCO\n2,c1ccccc1\n"
    packed = gzip.compress(table.encode())
    (tmp_path / "MOLS.CSV.GZ").write_bytes(packed)
    (tmp_path / "mols.smi.GZ").write_bytes(gzip.compress(lines.encode()))
    (tmp_path / "unpacked.smi.gz").write_text(lines)
    (tmp_path / "unpacked.csv.gz").write_text(table)
    for name in ("MOLS.CSV.GZ", "mols.smi.GZ", "unpacked.smi.gz", "unpacked.csv.gz"):
        result = load_sequences(tmp_path / name, smiles=True, canonicalize=False)
        assert (result.sequences, result.skipped) == (["CCO", "c1ccccc1"], {}), name
    (tmp_path / "cut.csv.gz").write_bytes(packed[: len(packed) // 2])
    (tmp_path / "cut.smi.gz").write_bytes(gzip.compress(lines.encode())[:-9])
    for name in ("cut.csv.gz", "cut.smi.gz"):
        path = tmp_path / name
        with pytest.raises(ValueError, match=rf"^source: expected a whole gzip stream, got {re.escape(str(path))} "
                                             r"cut short or corrupt \(.+\)$"):
            load_sequences(path, smiles=True)


def test_an_sd_file_is_refused_naming_the_file_not_read_line_by_line(tmp_path):
    """An SD file given as SMILES lines would yield its property values that happen to parse ("N", a SMILES
    property) as its molecules and count the rest as unparsable: refused in one line naming the file instead (a
    file that is not chemistry, smiles=False, is read as the text it is)."""
    from rdkit import Chem

    path = tmp_path / "mine.sdf"
    with Chem.SDWriter(str(path)) as writer:
        for i, text in enumerate(["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1"]):
            mol = Chem.MolFromSmiles(text)
            mol.SetProp("_Name", f"mol{i}")
            mol.SetProp("SMILES", text)
            mol.SetProp("class", "N")
            writer.write(mol)
    with pytest.raises(ValueError, match=rf"^source: expected one SMILES per line or a .csv/.tsv table, got an "
                                         rf"SD/MOL file \(its molfile blocks end with 'M  END'\) in "
                                         rf"{re.escape(str(path))}: write its molecules as SMILES first"):
        load_sequences(path, smiles=True)
    assert len(load_sequences(path, smiles=False, dedupe=False).sequences) > 3 * 3  # text: every non-empty line


def test_comma_separated_needs_more_than_half_of_the_first_fields_with_a_comma(tmp_path):
    """A comma in a line's first whitespace-separated field (`CCO,mol1`), in more than half of the non-empty lines
    (blank ones not counted), says the file is a comma-separated table; a comma in a name after the SMILES, or in
    half the lines, does not; a .csv is read by its header, never told this."""
    path = tmp_path / "mols.smi"
    path.write_text("CCO,mol1\n\n\n\nc1ccccc1,mol2\n\nCCN ok\n")  # 2 of 3 non-empty lines
    assert sm.comma_separated(path)
    path.write_text("CCO,mol1\nCCN ok\n")  # 1 of 2
    assert not sm.comma_separated(path)
    path.write_text("CCO mol,1\nCCN mol,2\n")  # the commas are in the names
    assert not sm.comma_separated(path)
    (tmp_path / "mols.csv").write_text("smiles,name\nCCO,mol1\n")
    assert not sm.comma_separated(tmp_path / "mols.csv")


def test_a_mol_file_and_a_corrupt_gzip_are_refused_naming_the_file(tmp_path):
    """A single molfile (.mol: one 'M  END', no SD record's '$$$$') is refused as an SD file is; a gzip file whose
    compressed data is corrupt (not cut short: zlib's error, not EOFError) is one ValueError naming the file."""
    from rdkit import Chem

    mol = tmp_path / "one.mol"
    mol.write_text(Chem.MolToMolBlock(Chem.MolFromSmiles("CCO")))
    with pytest.raises(ValueError, match=rf"got an SD/MOL file .* in {re.escape(str(mol))}:"):
        load_sequences(mol, smiles=True)
    packed = gzip.compress(b"CCO\nc1ccccc1\n" * 50)
    corrupt = tmp_path / "corrupt.smi.gz"
    corrupt.write_bytes(packed[:10] + b"\xff" * 20 + packed[30:])  # the deflate blocks after the header
    with pytest.raises(ValueError, match=rf"^source: expected a whole gzip stream, got {re.escape(str(corrupt))} cut "
                                         r"short or corrupt \(Error -3 while decompressing data: .+\)$"):
        load_sequences(corrupt, smiles=True)
