"""Two CPU processes, one train step with a cross-process all-reduce, run twice on one persistent compilation cache:
does the second run, which reads the step back from the cache, finish? (docs/measurements.md, "Several processes on
the CPU and the compilation cache")

    python benchmarks/multiprocess_cache.py                 # plain jax.distributed.initialize
    python benchmarks/multiprocess_cache.py --library       # jax_scan_rnn.distributed.initialize_multihost
    python benchmarks/multiprocess_cache.py --out benchmarks/results/multiprocess-cache-cpu-2core.txt   # appends

Runs with the interpreter it is started by: start it from the environment whose jax is to be checked (a process
that waits longer than --timeout is killed and counted as hung). About 10 s a run; a hung one takes --timeout.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import subprocess
import sys
import tempfile

STEP = """
import os, sys
import jax, jax.numpy as jnp, numpy as np
if sys.argv[1] == "library":
    from jax_scan_rnn.distributed import initialize_multihost
    initialize_multihost()
else:
    jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], int(os.environ["JAX_NUM_PROCESSES"]),
                               int(os.environ["JAX_PROCESS_ID"]))
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("data",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), np.ones((4, 3), np.float32))
w = jax.device_put(jnp.ones((3,)), NamedSharding(mesh, P()))
step = jax.jit(lambda w, x: w - 0.1 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w))  # gradients all-reduced
jax.block_until_ready(step(w, x))
print("done")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_once(cache: str, how: str, timeout: float) -> str:
    """'finished' or 'hung' (a process still running after `timeout` s, killed), for 2 processes x 2 devices."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
                   JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-c", STEP, how], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outcome = "finished"
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            outcome = "hung"
            break
        if p.returncode != 0 or "done" not in out:
            raise SystemExit(f"multiprocess_cache: a process exited {p.returncode}:\n{err[-2000:]}")
    for p in procs:
        p.kill()
        p.wait()
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", action="store_true", help="join through jax_scan_rnn's initialize_multihost")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as hung (60)")
    parser.add_argument("--out", default=None, help="a text file to append the result line to")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout: expected seconds > 0, got {args.timeout}")
    import jax  # the version checked; the processes import it themselves

    how = "library" if args.library else "jax"
    with tempfile.TemporaryDirectory(prefix="multiprocess-cache-") as cache:
        first = run_once(cache, how, args.timeout)
        cached = len(os.listdir(cache))
        second = run_once(cache, how, args.timeout)
    line = (f"{datetime.date.today()} jax {jax.__version__}, Python {platform.python_version()}, "
            f"{'initialize_multihost' if args.library else 'jax.distributed.initialize'}: first run {first} "
            f"({cached} programs cached), second run {second}")
    print(line)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
