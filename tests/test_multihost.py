"""Several processes for real: 2 processes x 2 forced CPU devices on localhost, with JAX's own distributed
runtime (a coordinator on localhost, cross-process collectives through gloo), train as one 4-device process.

Each process runs the CLI exactly as docs/cli.md's multi-host section says (`--multihost` and the
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment). Slow: every run is a fresh
interpreter per process; CI runs this file in its own step.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

# The 4-device all-reduce sums the same per-device partial sums whether the devices sit in one process or
# two, but gloo's cross-process reduction may add them in another order: float32 rounding (~1e-7 relative per
# step) compounds over a few Adam steps; 1e-5 on losses of ~0.1-3 is far below any real difference.
LOSS_RTOL = 1e-5
RUN_TIMEOUT_S = 300  # one training command (imports, compilation, a few steps) on 2 shared cores
HEARTBEAT_S = 5  # JAX_SCAN_RNN_HEARTBEAT_TIMEOUT in the lost-process test: the bound on noticing a death
LOST_EXIT_TIMEOUT_S = 60  # the survivor must have exited this long after its peer was killed

WORKER = """
import sys
from jax_scan_rnn.cli import main
sys.exit(main(sys.argv[1:]))
"""

SHARES = """
import json, sys
import jax
from jax_scan_rnn.distributed import DataParallel, initialize_multihost
from jax_scan_rnn.tasks import traveller

initialize_multihost()
dp = DataParallel.create()
task = traveller.TravellerTask(hidden_size=4, num_layers=1, batch_size=8, seq_len=4, train_paths=64)
batch_fn = traveller.make_batch_fn(task)
shares = []
for step in range(3):
    for name, array in dp.put(batch_fn(step)).items():
        for shard in array.addressable_shards:
            rows = shard.index[0]
            shares.append({"step": step, "name": name, "start": rows.start, "stop": rows.stop,
                           "data": jax.device_get(shard.data).tolist()})
json.dump(shares, open(f"{sys.argv[1]}/shares{jax.process_index()}.json", "w"))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def env_for(devices: int, **extra: str) -> dict:
    return dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
                **extra)


def start(code: str, args: list[str], processes: int, extra_env: dict | None = None):
    """`processes` interpreters running `code args`: one with 4 devices, or 2 joined through a coordinator."""
    if processes == 1:
        return [subprocess.Popen([sys.executable, "-c", code, *args], env=env_for(4), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)]
    port = free_port()
    procs = []
    for rank in range(processes):
        env = env_for(4 // processes, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES=str(processes),
                      JAX_PROCESS_ID=str(rank), **(extra_env or {}))
        procs.append(subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs) -> list[tuple[int, str, str]]:
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=RUN_TIMEOUT_S)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            p.kill()
    return results


def train(argv: list[str], processes: int) -> list[tuple[int, str, str]]:
    multihost = ["--multihost"] if processes > 1 else []
    results = finish(start(WORKER, [*argv, *multihost], processes))
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"process {rank} of {processes} exited {code}:\n{err[-3000:]}"
    return results


def losses(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["split"] == "train"]


def assert_same_curve(got: list, want: list, what: str) -> None:
    assert [s for s, _ in got] == [s for s, _ in want], what
    for (step, a), (_, b) in zip(got, want):
        assert a == pytest.approx(b, rel=LOSS_RTOL), f"{what}: loss at step {step}: {a!r} vs {b!r}"


# A constant learning rate without warmup: a run extended by --resume --steps N (--override) then does the same
# math as one started with N steps, so every curve below can be compared with one uninterrupted run.
SCHEDULE = ["--lr-schedule", "constant", "--warmup-steps", "0"]
TRAVELLER = ["train", "traveller", *SCHEDULE, "--hidden-size", "8", "--num-layers", "2", "--batch-size", "16", "--seq-len", "16",
             "--train-paths", "256", "--eval-paths", "8", "--eval-steps", "16", "--log-every", "1", "--eval-every",
             "0", "--checkpoint-every", "3"]
VAE = ["train", "vae", *SCHEDULE, "--data", "rdkit", "--limit", "300", "--hidden-size", "16", "--latent-size", "4",
       "--batch-size", "16", "--log-every", "1", "--eval-every", "0", "--checkpoint-every", "2", "--eval-samples", "8",
       "--eval-sequences", "4"]


def test_traveller_two_processes_train_checkpoint_and_resume_like_one(tmp_path):
    from jax_scan_rnn import checkpoint

    one = tmp_path / "one"
    train([*TRAVELLER, "--steps", "9", "--out", str(one)], 1)
    two = tmp_path / "two"
    results = train([*TRAVELLER, "--steps", "3", "--out", str(two)], 2)
    assert "training the Traveller" in results[0][1]
    assert "training" not in results[1][1] and "step/s" not in results[1][2], "process 1 must print nothing of ours"
    assert_same_curve(losses(two), losses(one)[:3], "2 processes vs 1")
    ckdir = two / "checkpoints"
    assert checkpoint.steps(ckdir) == [3]
    checkpoint.verify(ckdir, 3)  # one manifest for both processes' shards, complete
    # Resume the 2-process checkpoint on 1 process, then that one's on 2 again: one curve throughout.
    train([*TRAVELLER, "--steps", "6", "--out", str(two), "--resume", "--override"], 1)
    train([*TRAVELLER, "--steps", "9", "--out", str(two), "--resume", "--override"], 2)
    assert_same_curve(losses(two), losses(one), "3 steps on 2 processes, 3 on 1, 3 on 2 vs 9 on 1")
    assert checkpoint.steps(ckdir) == [3, 6, 9]
    for step in (3, 6, 9):
        checkpoint.verify(ckdir, step)


def test_vae_two_processes_train_and_resume_like_one(tmp_path):
    one = tmp_path / "one"
    train([*VAE, "--steps", "4", "--out", str(one)], 1)
    two = tmp_path / "two"
    train([*VAE, "--steps", "2", "--out", str(two)], 2)
    train([*VAE, "--steps", "4", "--out", str(two), "--resume", "--override"], 2)
    assert_same_curve(losses(two), losses(one), "VAE: 2 + 2 steps on 2 processes vs 4 on 1")
    assert json.loads((two / "evaluation.json").read_text())["reconstruction"]


def test_each_process_feeds_a_disjoint_share_of_every_global_batch(tmp_path):
    for rank, (code, _, err) in enumerate(finish(start(SHARES, [str(tmp_path)], 2))):
        assert code == 0, f"process {rank}: {err[-3000:]}"
    outs = [tmp_path / f"shares{rank}.json" for rank in range(2)]
    from jax_scan_rnn.tasks import traveller

    task = traveller.TravellerTask(hidden_size=4, num_layers=1, batch_size=8, seq_len=4, train_paths=64)
    batch_fn = traveller.make_batch_fn(task)
    shares = [json.loads(o.read_text()) for o in outs]
    for step in range(3):
        for name, full in batch_fn(step).items():
            rows = [[(s["start"], s["stop"]) for s in share if s["step"] == step and s["name"] == name]
                    for share in shares]
            mine = [set(range(a, b)) for rs in rows for a, b in rs]
            assert sum(map(len, mine)) == len(set().union(*mine)) == full.shape[0], f"{name}, step {step}: {rows}"
            per_process = [set().union(*(set(range(a, b)) for a, b in rs)) for rs in rows]
            assert not per_process[0] & per_process[1], f"{name}, step {step}: both processes feed rows"
            for share in shares:
                for s in share:
                    if s["step"] == step and s["name"] == name:
                        np.testing.assert_array_equal(np.asarray(s["data"], full.dtype), full[s["start"]:s["stop"]])


def test_a_lost_process_stops_the_other_with_a_clear_message(tmp_path):
    out = tmp_path / "run"
    procs = start(WORKER, [*TRAVELLER, "--steps", "100000", "--log-every", "10", "--checkpoint-every", "0", "--out",
                           str(out), "--multihost"], 2, {"JAX_SCAN_RNN_HEARTBEAT_TIMEOUT": str(HEARTBEAT_S)})
    try:
        deadline = time.time() + RUN_TIMEOUT_S
        while not (out / "metrics.jsonl").is_file() or not losses(out):  # both are training
            assert time.time() < deadline and procs[0].poll() is None, "the run never started"
            time.sleep(0.5)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.time()
        _, err = procs[0].communicate(timeout=LOST_EXIT_TIMEOUT_S)
        waited = time.time() - killed
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0
    assert "another task died" in err, err[-3000:]  # JAX's coordination service names the cause
    assert waited < LOST_EXIT_TIMEOUT_S


def test_fewer_devices_than_the_processes_hold_take_each_processes_share(tmp_path):
    # --devices 2 on 2 processes of 2 devices: one device of each (it took process 0's two, and process 1 crashed).
    one = tmp_path / "one"
    train([*TRAVELLER, "--steps", "3", "--devices", "2", "--out", str(one)], 1)
    two = tmp_path / "two"
    results = train([*TRAVELLER, "--steps", "3", "--devices", "2", "--out", str(two)], 2)
    assert "on 2 device(s)" in results[0][1]
    assert_same_curve(losses(two), losses(one), "--devices 2: 2 processes vs 1")
