"""benchmarks/timed_run.py's results writer, which every measuring script here appends its runs with."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
WRITERS = 4  # processes appending at once
RUNS_EACH = 25


def test_processes_appending_together_lose_no_run(tmp_path):
    results = tmp_path / "results.json"
    code = (f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r})\n"
            "from timed_run import append_run\n"
            f"for i in range({RUNS_EACH}):\n"
            f"    append_run(sys.argv[1], {{'writer': int(sys.argv[2]), 'i': i}}, machine_info={{'cpu': 'test'}})\n")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(results), str(w)]) for w in range(WRITERS)]
    assert [w.wait(timeout=120) for w in writers] == [0] * WRITERS
    data = json.loads(results.read_text())
    assert data["machine"] == {"cpu": "test"}
    got = sorted((r["writer"], r["i"]) for r in data["runs"])
    assert got == [(w, i) for w in range(WRITERS) for i in range(RUNS_EACH)]
