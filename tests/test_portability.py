"""What differs on macOS and Windows, checked on Linux: the text encoding a file or a stream gets, and the calls
only POSIX has."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A process whose locale encoding is ASCII (the C locale with Python's UTF-8 coercion off): text opened without
# encoding= gets it, as on Windows it gets cp1252, so what relies on the locale fails here for a non-ASCII name.
ASCII_LOCALE_ENV = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}


def run_in_ascii_locale(script: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`script` run by a fresh interpreter in the ASCII locale (its output captured, as text); skips the test where
    the C locale is UTF-8 (macOS)."""
    env = {**os.environ, **ASCII_LOCALE_ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), *(p for p in sys.path if p)])}
    check = "import locale, sys\nif locale.getpreferredencoding(False).lower() in ('utf-8', 'utf8'): sys.exit(77)\n"
    proc = subprocess.run([sys.executable, "-c", check + script], capture_output=True, env=env, cwd=cwd,
                          encoding="utf-8", errors="replace")
    if proc.returncode == 77:
        pytest.skip("the C locale is UTF-8 here")
    return proc


def test_outputs_are_utf8_whatever_the_locale(tmp_path):
    # A positions CSV names the --data file's assets; Windows' cp1252 (here ASCII) cannot hold every name.
    write = "lambda f: f.write('step,\\u00c5BO,Rendite_\\u20ac\\n')"
    proc = run_in_ascii_locale(f"from jax_scan_rnn.runlog import write_atomically\n"
                               f"write_atomically({str(tmp_path / 'p.csv')!r}, {write})")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "p.csv").read_bytes() == "step,ÅBO,Rendite_€\n".encode()


def test_the_log_and_a_side_file_are_read_as_utf8_whatever_the_locale(tmp_path):
    # JSON is UTF-8 (RFC 8259): a row another tool wrote unescaped, or a side file saved by an editor (with
    # Notepad's byte-order mark), came back in the locale's encoding: the metric's name as U+FFFD, the side file
    # refused.
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "metrics": {"Rendite_€": 0.5}}\n', encoding="utf-8")
    (tmp_path / "m.pt.json").write_text('{"arguments": {"note": "ÅBO"}}', encoding="utf-8-sig")
    proc = run_in_ascii_locale("from pathlib import Path\nfrom jax_scan_rnn.runlog import read_rows\n"
                               "from jax_scan_rnn.tasks.traveller import _side_of\n"
                               "print(ascii([read_rows(Path('metrics.jsonl'))[0]['metrics'], _side_of(Path('m.pt'))]))",
                               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ascii([{"Rendite_€": 0.5}, ({"note": "ÅBO"}, None)])


# The code a user runs: the package, its PyTorch twin, the examples and the benchmark scripts.
SOURCES = ("jax_scan_rnn", "torch_ref", "examples", "benchmarks")
# Modules whose `open(file, mode="rb", ...)` opens bytes unless its mode says "t".
COMPRESSED = {"gzip", "bz2", "lzma"}


def source_files() -> list[Path]:
    """Every .py file of SOURCES (tests/test_deprecations.py reads them too)."""
    return [path for folder in SOURCES for path in sorted((ROOT / folder).rglob("*.py"))]


def text_opens_without_encoding(source: str):
    """(line, call) of each open()/Path.open()/read_text()/write_text() in `source` that opens text without
    encoding=: it gets the locale's encoding, which is cp1252 on Windows (os.open and binary modes excepted; a
    `**options` is taken to name it)."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        if name not in ("open", "read_text", "write_text") or owner == "os":
            continue
        if any(k.arg in ("encoding", None) for k in node.keywords):
            continue
        mode = next((k.value for k in node.keywords if k.arg == "mode"), None)
        mode_at = 1 if isinstance(func, ast.Name) or owner in COMPRESSED else 0  # Path.open(mode)
        if mode is None and name == "open" and len(node.args) > mode_at:
            mode = node.args[mode_at]
        if mode is None and owner in COMPRESSED or isinstance(mode, ast.Constant) and "b" in str(mode.value):
            continue
        yield node.lineno, ast.unparse(node)[:80]


def test_every_text_file_names_its_encoding():
    # Windows reads and writes text in cp1252 unless told: an asset name or a "µs" in a table was written in it,
    # or refused, and a UTF-8 file (JSON always is) read back as mojibake.
    found = [f"{path.relative_to(ROOT)}:{line}: {call}" for path in source_files()
             for line, call in text_opens_without_encoding(path.read_text(encoding="utf-8"))]
    assert found == [], "text opened in the locale's encoding; name encoding='utf-8':\n" + "\n".join(found)


def test_the_check_finds_text_opens_and_passes_binary_ones():
    source = ("open(p)\nopen(p, 'w')\ngzip.open(p, 'rt')\nPath(p).read_text()\nq.write_text(s)\nq.open()\n"
              "open(p, 'rb')\ngzip.open(p)\nq.open('wb')\nos.open(p, 0)\nopen(p, encoding='utf-8')\nopen(p, 'w', **o)\n")
    assert [line for line, _ in text_opens_without_encoding(source)] == [1, 2, 3, 4, 5, 6]


def test_the_cli_prints_names_its_stdouts_encoding_lacks(tmp_path):
    # Windows' stdout, redirected to a file or a pipe, is cp1252 (here ASCII): the data summary's asset names
    # raised UnicodeEncodeError, an error that named no flag, and the command stopped. Now they print escaped and
    # the command goes on, here to the error of --init-from (a file that is no state_dict) that comes after them.
    rows = [f"{t},{0.1 * t},{0.01 * (t % 3 - 1)},{0.02 * (t % 2)}" for t in range(40)]
    (tmp_path / "prices.csv").write_text("t,mom,Rendite_€,ÅBO\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "weights.pt").write_bytes(b"not a state_dict")
    argv = ["train", "traveller", "--seq-len", "8", "--data", "prices.csv", "--feature-cols", "mom",
            "--return-cols", "Rendite_*,*BO", "--init-from", "weights.pt", "--out", "run"]  # ASCII: argv is no file
    proc = run_in_ascii_locale(f"import sys\nfrom jax_scan_rnn.cli import main\nsys.exit(main({argv!r}))", cwd=tmp_path)
    assert "assets Rendite_\\u20ac, \\xc5BO" in proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == 2 and "error: --init-from" in proc.stderr and "codec" not in proc.stderr, proc.stderr


def test_a_checkpoint_manifest_is_written_where_directories_cannot_be_opened(tmp_path, monkeypatch):
    # Windows' os.open refuses a directory (PermissionError): the directory fsyncs after every save made
    # checkpoint.save fail there once orbax had written the arrays.
    from jax_scan_rnn import checkpoint

    (tmp_path / "arrays").mkdir()
    (tmp_path / "arrays" / "a.bin").write_bytes(b"\0" * 8)
    posix_open = os.open

    def windows_open(path, flags, *args):
        if Path(path).is_dir():
            raise PermissionError(13, "Permission denied", str(path))
        return posix_open(path, flags, *args)

    monkeypatch.setattr(checkpoint.os, "open", windows_open)
    checkpoint._write_manifest(tmp_path, 3)
    monkeypatch.undo()
    manifest = json.loads((tmp_path / checkpoint.MANIFEST).read_text(encoding="utf-8"))
    assert manifest["step"] == 3 and list(manifest["files"]) == ["arrays/a.bin"]


def test_without_fcntl_a_runs_own_os_error_passes_through_the_run_lock(tmp_path, monkeypatch):
    # Windows has no fcntl: run_lock yielded inside the try that turns a failed mkdir into RunDirectoryUnwritable,
    # so a full disk during training (or a missing input file) came out as "cannot write the run directory".
    import errno

    from jax_scan_rnn import lock

    monkeypatch.setattr(lock, "fcntl", None)
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))
    # Unlocked, and said so: docs/cli.md's "a second process on the same --out is refused" does not hold there.
    with pytest.warns(lock.RunDirectoryUnlocked, match=r"not locked \(this platform has no fcntl\): a second run"):
        with pytest.raises(OSError) as raised, lock.run_lock(tmp_path / "run"):
            raise full
    assert raised.value is full
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / lock.LOCK_FILE).exists()
