"""benchmarks/timed_run.py's results writer, which every measuring script here appends its runs with."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
WRITERS = 4  # processes appending at once
RUNS_EACH = 25


def benchmark_script(name: str = "timed_run"):
    """benchmarks/NAME.py imported as a module (the folder is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_a_run_records_the_commit_it_ran_and_the_commands_last_line(tmp_path, capfd, monkeypatch):
    # The suite's wall time is quoted against the tests it ran: the README's range once mixed runs of a suite of
    # ~940 tests with runs of ~1,570 (docs/figures.py, pytest.run).
    import subprocess as sp

    timed_run = benchmark_script()
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    sp.run([*git, "init", "-q"], check=True)
    (repo / "f.txt").write_text("a\n")
    sp.run([*git, "add", "f.txt"], check=True)
    sp.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = sp.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    results = tmp_path / "results.json"
    command = [sys.executable, "-c", "print('collected'); print('3 passed in 0.1s'); print()"]
    monkeypatch.chdir(repo)
    assert timed_run.main(["--results", str(results), "--", *command]) == 0
    (repo / "f.txt").write_text("b\n")  # a tracked file changed: not the commit's code
    assert timed_run.main(["--results", str(results), "--", *command]) == 0
    monkeypatch.chdir(tmp_path)  # outside git
    assert timed_run.main(["--results", str(results), "--", *command]) == 0
    runs = json.loads(results.read_text())["runs"]
    assert [(r["commit"], r["last_line"]) for r in runs] == [
        (head, "3 passed in 0.1s"), (head + "+changes", "3 passed in 0.1s"), (None, "3 passed in 0.1s")]
    assert capfd.readouterr().out.count("collected\n3 passed in 0.1s\n") == 3  # the output is passed on as it comes
    # What it ran with: this Python, and the versions of the packages a result depends on (CI_PYTHON gets others).
    assert {r["python"] for r in runs} == {platform.python_version()}
    assert runs[0]["packages"]["jax"] == jax.__version__ and runs[0]["packages"]["numpy"] == np.__version__


def test_steps_timed_elsewhere_are_one_run_and_a_bad_step_is_one_line(tmp_path, capsys):
    # .ci/run times its own steps (bash's SECONDS) and records them as one run: the README says what CI takes.
    timed_run = benchmark_script()
    results = tmp_path / "ci.json"
    assert timed_run.main(["--results", str(results), "--steps", "install=120", "pytest=917"]) == 0
    run = json.loads(results.read_text())["runs"][0]
    assert run["command"] == ".ci/run" and run["steps"] == {"install": 120, "pytest": 917} and run["wall_s"] == 1037
    assert run["python"] == platform.python_version() and run["packages"]["jax"] == jax.__version__
    assert "1037 s in 2 steps ->" in capsys.readouterr().out
    for argv, said in ((["--steps", "pytest"], "argument --steps: expected NAME=SECONDS (e.g. pytest=917), got 'pytest'"),
                       (["--steps", "a=1", "--", "ls"], "--steps: expected no command with it, got ls"),
                       (["--steps", "a=1", "b=2", "a=3"], "--steps: expected each NAME once, got a more than once")):
        with pytest.raises(SystemExit) as exit_:
            timed_run.main(["--results", str(results), *argv])
        assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert len(json.loads(results.read_text())["runs"]) == 1
    assert timed_run.main(["--results", str(results), "--steps", "pytest=917"]) == 0
    assert "917 s in 1 step ->" in capsys.readouterr().out and len(json.loads(results.read_text())["runs"]) == 2
