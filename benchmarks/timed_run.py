"""Time one command as a user runs it, and append the run to a results file the docs quote from.

    python benchmarks/timed_run.py --results benchmarks/results/train-traveller-cpu-2core.json \
        --report runs/t/evaluation.json -- jax-scan-rnn train traveller --out runs/t

Each run appends {command, wall_s, peak_rss_mib, peak_total_rss_mib, peak_total_pss_mib, load average before/after,
started, compilation_cache, commit, last_line, python, packages, report} to the file's "runs", so the docs can quote
a range over runs (`docs/figures.py`). `commit` is the git HEAD of the folder the command ran in (with "+changes"
when its tracked files differed from it), `last_line` the last line the command printed (pytest's "1567 passed ...
in 917.40s"): a run of one command is then read against the code it ran, which a suite that grows changes; `python`
and `packages` (`PACKAGES`' versions) say what it ran on. Wall time is the command's, start-up included, as a user
waits for it. Memory, the figure that decides whether a machine can run it: `peak_rss_mib` is the largest resident
set of the command or any one process it started (`getrusage(RUSAGE_CHILDREN)`); `peak_total_rss_mib` is the largest
sum over the whole process tree at one moment (sampled from /proc every 0.2 s), which is what counts when the
command runs processes side by side (pytest's workers). That sum counts the pages the processes share (the same
jaxlib, torch and Python libraries mapped in each) once per process; `peak_total_pss_mib` sums their proportional
set sizes (/proc/PID/smaps_rollup: a shared page split among its sharers), the memory the tree takes from the
machine. Reading smaps_rollup walks each process's page tables (~0.18 s for pytest's two workers, measured): done
every 0.2 s it took half a core from the command it measured, so the PSS is read only while the resident sum is
within PSS_NEAR_PEAK of its peak so far, at most every PSS_EVERY_S.
The command starts with the CLI's caches empty (`JAX_SCAN_RNN_COMPILATION_CACHE` and `JAX_SCAN_RNN_DATA_CACHE`
set to a new temporary folder, removed after it, unless already set), so the time is a first run's, as a newcomer
waits for it; the run records which (`compilation_cache`).
The results file is only written when named: nothing here overwrites committed results by default.
`--steps NAME=SECONDS ...` instead of a command records steps timed elsewhere as one run: `.ci/run`'s own.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CACHE_ENV = "JAX_SCAN_RNN_COMPILATION_CACHE"  # jax_scan_rnn.xla_flags.CACHE_ENV (this script imports no JAX)
DATA_CACHE_ENV = "JAX_SCAN_RNN_DATA_CACHE"  # jax_scan_rnn.xla_flags.DATA_CACHE_ENV


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


# The packages whose versions a run's numbers and passes depend on, recorded with each run (`packages()`): a file's
# runs span upgrades, and .ci/run with another CI_PYTHON gets newer ones.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "torch")


def packages() -> dict[str, str]:
    """The installed version of each of PACKAGES in this interpreter's environment (from their metadata: nothing is
    imported). timed_run runs in the environment of the command it times (.ci/run's .venv)."""
    from importlib import metadata

    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def results_file(value: str) -> str:
    """argparse `type=` for a results file to write or append to: its folder must exist, checked when the
    arguments are parsed (one line, exit 2) rather than after the measurement's minutes."""
    folder = Path(value).resolve().parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the directory {folder} does not exist")
    return value


def measurement_start(script: str) -> dict:
    """What a measuring script records at its start: `command` (`python benchmarks/SCRIPT args...`), `started`
    and the load average; `measurement_end` completes it for `append_run`."""
    return {"command": " ".join([f"python benchmarks/{script}", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average": {"start": os.getloadavg()[0]}}


def measurement_end(run: dict, **fields) -> dict:
    """`run` (from `measurement_start`) with the load average at the end and the measurement's `fields`."""
    return {**run, "load_average": {**run["load_average"], "end": os.getloadavg()[0]}, **fields}


def alternating_processes(child: str, models, ways, rounds: int, env: dict | None = None) -> dict:
    """Per round and model, each way in turn: `python -c child WAY MODEL` in a new process, whose last line of
    output starts with the seconds it measured. Returns `{model: {way: [that line's words, per round]}}`; a
    model's seconds are printed after each round."""
    words: dict = {m: {w: [] for w in ways} for m in models}
    for _ in range(rounds):
        for model in models:
            for way in ways:
                out = subprocess.run([sys.executable, "-c", child, way, model], check=True, capture_output=True,
                                     text=True, env=env).stdout
                words[model][way].append(out.splitlines()[-1].split())
            print(model, {w: [round(float(r[0]), 3) for r in runs] for w, runs in words[model].items()}, flush=True)
    return words


def alternating_benchmark(script: str, doc: str, child: str, models, ways, *, env: dict | None = None,
                          same_last_word: bool = False) -> int:
    """The whole of a fresh-process A/B script (model_init.py, optimizer_init.py): its `--rounds` and `--out`, the
    `alternating_processes` loop, and the run appended with `seconds` `{model: {way: [per round]}}`. With
    `same_last_word`, every run of a model must end in the same word (a digest of what the ways built), or the
    script says which model differed and exits 1, recording nothing."""
    from jax_scan_rnn.cli import POSITIVE_INT  # the CLI's option check (the CLI module imports no JAX)

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=POSITIVE_INT, default=5)
    parser.add_argument("--out", default=None, type=results_file, help="append the run to this JSON file (default: print only)")
    args = parser.parse_args()
    run = measurement_start(script)
    words = alternating_processes(child, models, ways, args.rounds, env=env)
    for model, runs in words.items():
        if same_last_word and len({r[-1] for way_runs in runs.values() for r in way_runs}) != 1:
            print(f"{script.removesuffix('.py')}: {model}: the ways built different results", file=sys.stderr)
            return 1
    seconds = {m: {w: [round(float(r[0]), 4) for r in runs] for w, runs in ways.items()} for m, ways in words.items()}
    if args.out:
        append_run(args.out, measurement_end(run, seconds=seconds))
    return 0


def append_run(results: Path, run: dict, machine_info: dict | None = None) -> int:
    """Add `run` to the "runs" of the JSON file `results` (made, with `machine_info` or this `machine()`, if
    missing), written whole then renamed: never half a file, which the docs test reads. Returns the run count.
    Also the results writer of the other scripts here (call_overhead.py, weight_bandwidth.py).

    Read, append and write hold `<results>.lock`: two measurements ending together (two scripts appending to
    one file) would otherwise each write the file it read, and one run would be lost."""
    import filelock  # a dependency of the package's core (JAX's compilation cache needs it)

    results = Path(results)
    with filelock.FileLock(results.with_name(results.name + ".lock")):
        data = json.loads(results.read_text(encoding="utf-8")) if results.exists() else {"machine": machine_info or machine(),
                                                                         "runs": []}
        data["runs"].append(run)
        tmp = results.with_name(results.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, results)
    return len(data["runs"])


PSS_EVERY_S = 5.0
PSS_NEAR_PEAK = 0.95


def tree_rss_mib(root: int) -> tuple[float, list[int]]:
    """(resident set of process `root` and all its descendants now, in MiB; their pids), from Linux's /proc
    (0 and [] elsewhere)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
            children.setdefault(int(fields[1]), []).append(int(entry.name))  # field 4: ppid
        except (OSError, IndexError, ValueError):
            continue  # the process ended while being read
    total, pids, todo = 0, [], [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return total / 2**20, pids


def pss_mib(pids: list[int]) -> float:
    """The proportional set sizes of `pids` summed, in MiB (0 for a process without smaps_rollup)."""
    return sum(_pss_bytes(pid) for pid in pids) / 2**20


def _pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="utf-8").splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, IndexError, ValueError):
        pass  # ended while being read, or no smaps_rollup (kernel < 4.14)
    return 0


def commit() -> str | None:
    """The git HEAD of the current folder, with "+changes" when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if changed else "")


def _run(command: list[str], env: dict) -> tuple[int, float, list[float], str]:
    """Run `command`, its output passed on as it comes; returns (exit code, wall seconds, [peak RSS, peak PSS] of
    its process tree in MiB, its last non-empty line of standard output)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)
    peak_total = [0.0, 0.0]  # RSS, PSS
    last = [b""]

    def relay() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            if line.strip():
                last[0] = line

    def sample() -> None:
        last_pss = -PSS_EVERY_S
        while proc.poll() is None:
            rss, pids = tree_rss_mib(proc.pid)
            peak_total[0] = max(peak_total[0], rss)
            if rss >= PSS_NEAR_PEAK * peak_total[0] and time.monotonic() - last_pss >= PSS_EVERY_S:
                peak_total[1] = max(peak_total[1], pss_mib(pids))
                last_pss = time.monotonic()
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    relayer = threading.Thread(target=relay, daemon=True)
    sampler.start()
    relayer.start()
    code = proc.wait()
    wall = time.perf_counter() - t0
    sampler.join()
    relayer.join()
    return code, wall, peak_total, last[0].decode("utf-8", "replace").strip()


def step_time(value: str) -> tuple[str, int]:
    """argparse `type=` for NAME=SECONDS (whole seconds, as bash's SECONDS counts them)."""
    name, _, seconds = value.partition("=")
    if not name or not seconds.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS (e.g. pytest=917), got {value!r}")
    return name, int(seconds)


def record_steps(results: Path, steps: dict[str, int]) -> int:
    """Append a run made of `steps` ({name: seconds}, in order; timed by the caller, which ends now): the whole
    `.ci/run`, whose README figure says how long CI takes and where the time goes."""
    wall = sum(steps.values())
    now = datetime.datetime.now(datetime.timezone.utc)
    run = {"command": ".ci/run", "wall_s": wall, "steps": steps,
           "started": (now - datetime.timedelta(seconds=wall)).isoformat(timespec="seconds"),
           "load_average": {"end": round(os.getloadavg()[0], 2)}, "commit": commit(),
           "python": platform.python_version(), "packages": packages()}
    count = append_run(results, run)
    print(f"timed_run: {wall} s in {len(steps)} step{'' if len(steps) == 1 else 's'} -> {results} ({count} run(s))")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, type=results_file,
                        help="the JSON file to append this run to (created if missing)")
    parser.add_argument("--report", default=None, help="a JSON file the command writes (evaluation.json), kept with "
                                                       "the run")
    parser.add_argument("--steps", nargs="+", type=step_time, default=None, metavar="NAME=SECONDS",
                        help="record steps timed elsewhere instead of running a command (.ci/run's own steps)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to time")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.steps is not None:
        if command:
            parser.error("--steps: expected no command with it, got " + " ".join(command))
        names = [name for name, _ in args.steps]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # a dict would keep the last time and drop the other from the run's whole
            parser.error(f"--steps: expected each NAME once, got {', '.join(twice)} more than once")
        return record_steps(Path(args.results), dict(args.steps))
    if not command:
        parser.error("expected a command after --")
    results = Path(args.results)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    code_at = commit()  # before the command, which may write into the folder
    load_before = os.getloadavg()[0]
    cache = "as set by the caller" if {CACHE_ENV, DATA_CACHE_ENV} & set(os.environ) else "empty at start"
    with tempfile.TemporaryDirectory(prefix="timed-run-xla-cache-") as folder:
        env = {CACHE_ENV: folder, DATA_CACHE_ENV: os.path.join(folder, "data"), **os.environ}
        code, wall, peak_total, last_line = _run(command, env)
    if code != 0:
        print(f"timed_run: the command exited with {code}; nothing recorded", file=sys.stderr)
        return code
    run = {"command": " ".join([Path(command[0]).name, *command[1:]]),  # as a user types it, not a venv path
            "wall_s": round(wall, 1),
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
           "peak_total_rss_mib": round(peak_total[0], 1),
           "peak_total_pss_mib": round(peak_total[1], 1),
           "load_average": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)},
           "started": started,
           "compilation_cache": cache, "commit": code_at, "last_line": last_line,
           "python": platform.python_version(), "packages": packages()}
    if args.report:
        run["report"] = json.loads(Path(args.report).read_text(encoding="utf-8"))
    count = append_run(results, run)
    print(f"timed_run: {wall:.1f} s wall, peak RSS {run['peak_rss_mib']:.0f} MiB (all processes together "
          f"{run['peak_total_rss_mib']:.0f} MiB, PSS {run['peak_total_pss_mib']:.0f} MiB) -> {results} "
          f"({count} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
