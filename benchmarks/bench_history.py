"""The headline cell of every committed benchmark run, read back from git: how much it moves between runs.

    python benchmarks/bench_history.py --out benchmarks/results/bench-history-cpu-2core.json

The benchmark's results files (`cpu-2core.json`, the default preset; `cpu-2core-peers.json`) hold only their
latest run; each earlier run is still in git. For every commit that changed one of them, this reads the file
as committed and keeps the Traveller's forward cell at B=1, T=1000 (the README's headline): the seed loop's,
the scan's (`jax-scan-auto`) and the compiled user call's (`jax-user-call`, in runs that have it) time per
step, with the run's start, load average and the commit. Nothing is measured here: the figures are the runs'
own, and the library changed between some of them (the commit says which code a run measured).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from timed_run import results_file  # this folder's script: the script's own directory is on sys.path

FILES = ("benchmarks/results/cpu-2core.json", "benchmarks/results/cpu-2core-peers.json")
CELL = {"model": "traveller", "mode": "forward", "B": 1, "T": 1000}
METHODS = {"seed_us": "torch-loop", "scan_us": "jax-scan-auto", "user_call_us": "jax-user-call"}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def headline(run: dict) -> dict:
    """`METHODS`' times per step in `CELL` of one results file (None where the run has no such row)."""
    rows = [r for r in run["rows"] if all(r.get(k) == v for k, v in CELL.items())]
    times = {name: next((r["per_step_us"] for r in rows if r["method"] == method), None)
             for name, method in METHODS.items()}
    return {"started": run["started"], "load_average": run["load_average"], **times}


def history() -> list[dict]:
    runs = []
    for path in FILES:
        for commit in git("log", "--format=%H", "--", path).split():
            try:
                run = json.loads(git("show", f"{commit}:{path}"))
            except subprocess.CalledProcessError:  # the commit deleted the file
                continue
            record = headline(run)
            if record["seed_us"] and record["scan_us"]:
                runs.append({"file": Path(path).name, "commit": commit[:7], **record})
    return sorted(runs, key=lambda r: r["started"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=results_file, help="write the history here (default: print it)")
    args = parser.parse_args()
    runs = history()
    for r in runs:
        print(f"{r['started']}  {r['file']:22s} {r['commit']}  seed {r['seed_us']:6.1f} us  scan {r['scan_us']:5.2f} us"
              f"  {r['seed_us'] / r['scan_us']:5.1f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python benchmarks/bench_history.py --out " + args.out,
                                              "cell": CELL, "methods": METHODS, "runs": runs}, indent=1) + "\n",
                                  encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
