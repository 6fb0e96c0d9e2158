"""Data parallelism with JAX's own sharding: a 1-D device mesh, the batch split, the parameters replicated.

    dp = DataParallel.create(num_devices=4)       # default: every local device
    fit(model, loss_fn, batch_fn, cfg, data_sharding=dp.data, state_sharding=dp.replicated)

Nothing here communicates by hand. The train step is one `jax.jit`; because its batch argument is
sharded along the mesh's "data" axis and its state is replicated, XLA's SPMD partitioner runs each
device's share of the batch locally and inserts the all-reduce of the gradients (the loss is a mean
over the batch, so the reduced gradient is exactly the single-device gradient of the global batch).

Several hosts: call `initialize_multihost()` (`jax.distributed.initialize`, which reads the coordinator
address, process count and index from its arguments or the cluster's environment) on every host
before anything else touches JAX; the mesh then spans all hosts' devices, and each host feeds the
rows of the global batch that belong to its own devices (`DataParallel.put`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_scan_rnn import validate, versions

DATA_AXIS = "data"


@dataclass(frozen=True)
class DataParallel:
    """A data-parallel layout over `mesh`: batch sharded on its leading axis, state replicated."""

    mesh: Mesh  # 1-D mesh over the participating devices, axis "data"

    @classmethod
    def create(cls, num_devices: int | None = None) -> DataParallel:
        """Use the first `num_devices` devices (all of them, across hosts, when None); on several processes the
        first `num_devices / process_count` of each process's own (`pick_devices`)."""
        devices = jax.devices()
        if num_devices is None:
            num_devices = len(devices)
        num_devices = validate.integer("num_devices", num_devices, lo=1, hi=len(devices))
        return cls(Mesh(np.array(pick_devices(devices, num_devices, jax.process_count())), (DATA_AXIS,)))

    @property
    def size(self) -> int:
        return self.mesh.size

    @property
    def data(self) -> NamedSharding:
        """Sharding of a batch: its leading (batch) axis split over the devices."""
        return NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))

    @property
    def replicated(self) -> NamedSharding:
        """Sharding of parameters and optimiser state: a full copy on every device."""
        return NamedSharding(self.mesh, PartitionSpec())

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size % self.size:
            raise ValueError(
                f"batch_size: expected a multiple of the {self.size} devices it is split over, got {batch_size}"
            )

    def put(self, batch):
        """Place a global batch (pytree of `[B, ...]` host arrays) sharded over the mesh (`put_batch`)."""
        return put_batch(batch, self.data)


def pick_devices(devices: list, count: int, processes: int) -> list:
    """`count` of `devices` (`jax.devices()`: ordered by process) for a data-parallel mesh: the first `count`; on
    `processes` > 1 processes the first `count / processes` of each process's, in process order, since every
    process feeds the rows of its own devices (`put_batch`: process p the p-th of equal row blocks). The first
    `count` alone would leave a process without a device in the mesh, and its rows nowhere to go (it crashed with
    "generator raised StopIteration", the others waiting on it until a collective timed out)."""
    if processes == 1:
        return list(devices[:count])
    each, rest = divmod(count, processes)
    own: dict[int, list] = {}
    for device in devices:
        own.setdefault(device.process_index, []).append(device)
    if rest or any(len(mine) < each for mine in own.values()):
        raise ValueError(f"num_devices: expected a multiple of the {processes} processes, at most "
                         f"{processes * min(len(mine) for mine in own.values())} (each process feeds its equal share "
                         f"of the batch from its own devices), got {count}")
    return [device for p in sorted(own) for device in own[p][:each]]


def replicated_over(sharding: jax.sharding.Sharding) -> NamedSharding:
    """A full copy on every device of `sharding` (over a NamedSharding's mesh; else over its devices, by id): the
    state's placement beside a batch placed with `sharding`."""
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        return NamedSharding(sharding.mesh, PartitionSpec())
    devices = sorted(sharding.device_set, key=lambda d: (d.process_index, d.id))
    return NamedSharding(Mesh(np.array(devices), (DATA_AXIS,)), PartitionSpec())


def put_batch(batch, sharding: jax.sharding.Sharding):
    """Place a global batch (pytree of `[B, ...]` host arrays) with a batch-axis `sharding`.

    On one process this is `jax.device_put`. On several, every process holds the same global batch (the data
    is a function of the step) and contributes the rows of its own devices: process p the p-th of
    `process_count` equal row blocks (the devices of a mesh from `jax.devices()` are ordered by process).
    """
    spec = getattr(sharding, "spec", None)  # a NamedSharding's PartitionSpec: one entry per leading axis it places
    for path, x in jax.tree_util.tree_flatten_with_path(batch)[0]:
        if spec is not None and np.ndim(x) < len(spec):  # JAX's error: an IndexError, or one naming no batch
            raise ValueError(f"batch{jax.tree_util.keystr(path)}: expected an array whose leading axes {spec} splits "
                             f"(the batch axis first), got shape {np.shape(x)}; give a per-batch scalar one entry per "
                             "row (np.full((B,), value))")
        try:
            sharding.shard_shape(np.shape(x))
        except ValueError:  # JAX's IndivisibleError names no batch
            raise ValueError(f"batch: expected a leading (batch) size that the {len(sharding.device_set)} devices "
                             f"split evenly, got an array of shape {np.shape(x)}") from None
    if jax.process_count() == 1:
        return jax.device_put(batch, sharding)

    def local(x):
        rows = np.asarray(x).shape[0] // jax.process_count()
        start = jax.process_index() * rows
        return jax.make_array_from_process_local_data(sharding, np.asarray(x)[start : start + rows])

    return jax.tree.map(local, batch)


# The environment of a launch by hand (tests/test_multihost.py runs exactly this on localhost). JAX itself
# reads only the coordinator's address; the count and index are read here.
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
ENV_HEARTBEAT = "JAX_SCAN_RNN_HEARTBEAT_TIMEOUT"  # seconds before the others give up on a lost process (JAX: 100)
# From jax 0.12.1 on the CPU, a program with cross-process collectives that JAX's persistent compilation cache gives
# back (the CLI's cache, or JAX_COMPILATION_CACHE_DIR) waits in every process forever: a second run hangs at its
# first step. 0.10.2 to 0.12.0 do not (docs/measurements.md#several-processes-on-the-cpu-and-the-compilation-cache).
CPU_CACHE_HANGS_FROM_JAX = (0, 12, 1)


def initialize_multihost() -> None:
    """Join a multi-process run: `jax.distributed.initialize`, before anything else touches JAX.

    Launched by hand (every process runs the same command): set JAX_COORDINATOR_ADDRESS=host:port (process
    0's host; it serves the coordinator there), JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=0..N-1 on each. On a
    cluster JAX detects these itself (Slurm: srun; Kubernetes JobSet; Open MPI; Cloud TPU): leave them unset.
    If a process dies, the others stop with JAX's "another task died" error once JAX_SCAN_RNN_HEARTBEAT_TIMEOUT
    seconds pass without its heartbeat (JAX's default, 100, when unset): bounded, never a hang.
    Several processes on the CPU with jax >= 0.12.1 compile without JAX's persistent compilation cache, whose
    programs hang there (`CPU_CACHE_HANGS_FROM_JAX`).
    """
    env = os.environ
    kwargs = {}
    for name, key in ((ENV_NUM_PROCESSES, "num_processes"), (ENV_PROCESS_ID, "process_id"),
                      (ENV_HEARTBEAT, "heartbeat_timeout_seconds")):
        if env.get(name):
            try:
                kwargs[key] = int(env[name])
            except ValueError:
                raise ValueError(f"{name}: expected an int, got {env[name]!r}") from None
    if ("num_processes" in kwargs) != ("process_id" in kwargs):
        raise ValueError(f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}: expected both or neither, got only "
                         f"{ENV_NUM_PROCESSES if 'num_processes' in kwargs else ENV_PROCESS_ID}")
    if "num_processes" in kwargs and not env.get(ENV_COORDINATOR):
        raise ValueError(f"{ENV_COORDINATOR}: expected host:port of process 0 with {ENV_NUM_PROCESSES}, got nothing")
    try:
        jax.distributed.initialize(**kwargs)
    except ValueError as err:  # no cluster detected and nothing set: JAX's "coordinator_address should be defined."
        if "coordinator_address" not in str(err) or env.get(ENV_COORDINATOR):
            raise
        raise ValueError(f"{ENV_COORDINATOR}: expected host:port of process 0 (with {ENV_NUM_PROCESSES} and "
                         f"{ENV_PROCESS_ID} on every process), got nothing, and JAX found no cluster (Slurm, "
                         f"Kubernetes, Open MPI, Cloud TPU) to read them from") from None
    if (jax.process_count() > 1 and jax.default_backend() == "cpu"
            and versions.release(jax.__version__) >= CPU_CACHE_HANGS_FROM_JAX):
        # Compiled anew each run instead; JAX decides at the first compile, which comes after this.
        jax.config.update("jax_enable_compilation_cache", False)
