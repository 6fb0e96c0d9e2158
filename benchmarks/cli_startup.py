"""How long `jax-scan-rnn` takes to answer when it stops before any work: `--help`, a flag's bad value, and options
that contradict each other, against importing JAX itself (what a command that needs JAX pays before anything).

    python benchmarks/cli_startup.py --out benchmarks/results/cli-startup-cpu-2core.json   # appends the run
    git worktree add /tmp/before COMMIT && python benchmarks/cli_startup.py --package /tmp/before --out ...  # another

Each command in a new process (`python -m jax_scan_rnn.cli ...`, as the console script starts it), rounds
alternating over the commands; wall time of the whole process. The train commands' options come from
`jax_scan_rnn/configs/` (no JAX) and are checked before their task imports JAX; `bench` builds its options from
the benchmark's rows, which import JAX; `sample vae` checks that --checkpoint is a directory before importing JAX
(since ec4e5d1; before it, after). About 1 minute on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timed_run import CACHE_ENV, append_run, measurement_end, measurement_start, results_file  # noqa: E402

CLI = [sys.executable, "-m", "jax_scan_rnn.cli"]
# name -> (argv of the CLI, or of python, and the exit code it must give)
COMMANDS = {
    "--help": (["--help"], 0),
    "train traveller --help": (["train", "traveller", "--help"], 0),
    "train vae --help": (["train", "vae", "--help"], 0),
    "train traveller --steps abc": (["train", "traveller", "--steps", "abc"], 2),
    "train traveller --num-layers 1 --dropout 0.2": (["train", "traveller", "--num-layers", "1", "--dropout", "0.2"],
                                                     2),
    "train vae --ss-max 0.3": (["train", "vae", "--ss-max", "0.3"], 2),
    "sample vae --checkpoint nowhere": (["sample", "vae", "--checkpoint", "nowhere"], 2),
    "bench --help": (["bench", "--help"], 0),
    "python -c 'import jax.numpy, flax.nnx'": (["-c", "import jax.numpy, flax.nnx"], 0),
}


def timed(name: str, cwd: str, env: dict) -> float:
    argv, code = COMMANDS[name]
    command = [sys.executable, *argv] if name.startswith("python") else [*CLI, *argv]
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode != code:
        raise SystemExit(f"cli_startup: {name}: expected exit code {code}, got {done.returncode}: {done.stderr[-300:]}")
    return seconds


def main() -> int:
    from jax_scan_rnn.cli import POSITIVE_INT  # the CLI's option check (the CLI module imports no JAX)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=5)
    parser.add_argument("--out", default=None, type=results_file,
                        help="append the run to this JSON file (default: print only)")
    parser.add_argument("--package", default=None, metavar="DIR",
                        help="time the jax_scan_rnn of this checkout (another commit's worktree) instead of this one's")
    args = parser.parse_args()
    if args.package is not None and not (Path(args.package) / "jax_scan_rnn" / "cli.py").is_file():
        parser.error(f"--package: expected a checkout of jax-scan-rnn, got {args.package}")
    package = Path(args.package or Path(__file__).parents[1]).resolve()
    env = {**os.environ, CACHE_ENV: "0", "PYTHONPATH": str(package)}  # before the installed (editable) one
    commit = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    run = measurement_start("cli_startup.py")
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as cwd:  # an empty folder: `nowhere` is nowhere
        for _ in range(args.rounds):
            for name in COMMANDS:
                seconds[name].append(round(timed(name, cwd, env), 3))
    for name, times in seconds.items():
        print(f"{name:<50} {sorted(times)[len(times) // 2]:.2f} s  {times}")
    if args.out:  # a later run never replaces an earlier one
        append_run(args.out, measurement_end(run, package_commit=commit, seconds=seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
