"""What the CLI's caches save: each command timed with empty caches and again with the ones it filled,
alternating, as a user runs them (`jax_scan_rnn/xla_flags.py`: `use_cli_compilation_cache`, the compiled
programs; `cli_data_cache`, the Kekulé forms of the VAE data).

    python benchmarks/cli_cache.py --out benchmarks/results/cli-cache-cpu-2core.json   # appends the run

Per round and command: `JAX_SCAN_RNN_COMPILATION_CACHE` and `JAX_SCAN_RNN_DATA_CACHE` set to new empty folders
("empty"), then the same command again with those folders ("filled"). Wall time of the whole command, start-up
included. The VAE commands read a short training run made first. About 10 minutes on a 2-core CPU (`train vae`
and `evaluate vae` convert MOSES's 300,000 molecules, the default data, when the data cache is empty).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import CACHE_ENV, DATA_CACHE_ENV, append_run, results_file  # noqa: E402
from jax_scan_rnn.cli import POSITIVE_INT  # noqa: E402  the CLI's option check

CLI = [sys.executable, "-m", "jax_scan_rnn.cli"]


def commands(work: Path) -> dict[str, list[str]]:
    vae = str(work / "vae")
    return {
        "train traveller --steps 20": ["train", "traveller", "--steps", "20", "--out", str(work / "t")],
        "train vae --steps 30 --eval-every 0": ["train", "vae", "--steps", "30", "--eval-every", "0", "--out",
                                                str(work / "v")],
        "sample vae -n 1000": ["sample", "vae", "--checkpoint", vae, "-n", "1000", "--output", str(work / "s.txt")],
        "evaluate vae -n 1000": ["evaluate", "vae", "--checkpoint", vae, "-n", "1000", "--output",
                                 str(work / "e.json")],
    }


def timed(argv: list[str], cache: str) -> float:
    t0 = time.perf_counter()
    env = {**os.environ, CACHE_ENV: os.path.join(cache, "xla"), DATA_CACHE_ENV: os.path.join(cache, "data")}
    subprocess.run([*CLI, *argv], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=3)
    parser.add_argument("--out", default=None, type=results_file, help="append the run to this JSON file (default: print only)")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([*CLI, "train", "vae", "--steps", "30", "--eval-every", "0", "--eval-samples", "100",
                        "--out", str(work / "vae")], env={**os.environ, CACHE_ENV: "0", DATA_CACHE_ENV: "0"}, check=True,
                       capture_output=True)
        rows = {name: {"empty_s": [], "filled_s": []} for name in commands(work)}
        for _ in range(args.rounds):
            for name, argv in commands(work).items():
                cache = tempfile.mkdtemp(dir=work)
                for kind in ("empty_s", "filled_s"):
                    for out in (work / "t", work / "v"):
                        shutil.rmtree(out, ignore_errors=True)  # a new run each time, as a user starts one
                    rows[name][kind].append(round(timed(argv, cache), 2))
                print(name, rows[name], flush=True)
    if args.out:  # a later run never replaces an earlier one
        append_run(args.out, {"command": " ".join(["python benchmarks/cli_cache.py", *sys.argv[1:]]),
                              "started": started, "load_average_end": os.getloadavg()[0], "commands": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
