"""The machine the suite runs on: its short name (`host_kind`), GPU, CPU model, free memory, load."""
from __future__ import annotations

import os
import platform
import re


def _gpu_name() -> str | None:
    import jax

    for dev in jax.devices():
        if dev.platform in ("gpu", "cuda", "rocm"):
            return dev.device_kind
    return None


def host_kind() -> str:
    """A short name for this machine's kind: `gpu-h200` from the first GPU JAX sees, else `cpu-<N>core`."""
    gpu = _gpu_name()
    if gpu:
        tokens = re.findall(r"[a-z]+\d+[a-z]*", gpu.lower())
        model = tokens[0] if tokens else re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        return f"gpu-{model}"
    return f"cpu-{os.cpu_count() or 1}core"


def _proc_field(path: str, key: str) -> str | None:
    """The value of the first `key: value` line of a /proc file, or None where there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), None)
    except OSError:
        return None


def available_memory() -> int | None:
    """Bytes of RAM available now (MemAvailable), or None where unknown."""
    kib = _proc_field("/proc/meminfo", "MemAvailable:")  # "123456 kB"
    return int(kib.split()[0]) * 1024 if kib else None


def cpu_model() -> str:
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None
