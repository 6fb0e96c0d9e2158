"""benchmarks/bench_history.py: the headline cell of each committed benchmark run, and the committed history
file that the README quotes (docs/figures.py, `bench.headline_history`) holds the latest run of each file."""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
HISTORY = BENCHMARKS / "results/bench-history-cpu-2core.json"


BENCHMARK_SCRIPT = "bench_history"  # the `script` fixture (conftest.py) imports it


def row(method, per_step_us, **cell):
    return {"model": "traveller", "mode": "forward", "B": 1, "T": 1000, "method": method,
            "per_step_us": per_step_us, **cell}


def test_headline_reads_the_forward_batch1_cell_only(script):
    run = {"started": "2026-12-02T00:00:00+0000", "load_average": {"start": 0.1, "end": 0.2},
           "rows": [row("torch-loop", 200.0), row("jax-scan-auto", 2.5), row("jax-scan-auto", 9.0, B=64),
                    row("jax-scan-auto", 7.0, mode="train")]}
    got = script.headline(run)
    assert (got["seed_us"], got["scan_us"], got["user_call_us"]) == (200.0, 2.5, None)


def test_committed_history_holds_each_results_files_latest_run(script):
    history = json.loads(HISTORY.read_text())["runs"]
    for path in script.FILES:
        latest = script.headline(json.loads((ROOT / path).read_text()))
        mine = [r for r in history if r["file"] == Path(path).name and r["started"] == latest["started"]]
        assert mine, (f"{HISTORY.name} lacks the run of {path} started {latest['started']}: after committing a "
                      f"benchmark run, run `python benchmarks/bench_history.py --out {HISTORY.relative_to(ROOT)}`")
        assert (mine[0]["seed_us"], mine[0]["scan_us"]) == (latest["seed_us"], latest["scan_us"])
