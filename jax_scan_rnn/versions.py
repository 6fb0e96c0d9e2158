"""The core dependencies' floors, checked once at `import jax_scan_rnn`.

pyproject.toml's `dependencies` name the oldest version of each package that the tests pass with: `.ci/run`
runs them at exactly those versions (`.ci/minimum-versions.txt` says why each floor is where it is). pip
enforces the floors when it installs this package, but an environment built another way (`pip install
--no-deps`, a preinstalled image) can hold older ones, which fail deep inside a call: an old flax lacks an
argument `jsr.jit` passes, an old jaxlib cannot compile a bfloat16 matmul inside a one-kernel loop. So the
import compares the installed versions with the package's own metadata (without importing JAX: `xla_flags`
must come first) and raises ImportError naming each package that is too old.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata

DISTRIBUTION = "jax-scan-rnn"
FLOOR = re.compile(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)")  # a core requirement "name>=X.Y" (no marker)


def release(version: str) -> tuple[int, ...]:
    """A version's release numbers, trailing zeros dropped: "0.10.2.dev20260101" -> (0, 10, 2); "4.66.0" -> (4, 66)."""
    match = re.match(r"\d+(\.\d+)*", version)
    parts = [int(part) for part in match.group(0).split(".")] if match else []
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def too_old(requirements: list[str] | None = None,
            installed: Callable[[str], str] = metadata.version) -> list[tuple[str, str, str]]:
    """`(name, installed version, floor)` for each core requirement whose installed version is older.

    `requirements` defaults to this package's installed metadata; without it (run from a source tree on
    PYTHONPATH, as benchmarks/gpu.sh does) nothing is checked. A requirement with an extra's marker is not a
    core one, and a package that is not installed is left to its own import to report."""
    if requirements is None:
        try:
            requirements = metadata.requires(DISTRIBUTION) or []
        except metadata.PackageNotFoundError:
            return []
    old = []
    for requirement in requirements:
        match = FLOOR.fullmatch(requirement.strip())
        if match is None:
            continue
        name, floor = match.groups()
        try:
            have = installed(name)
        except metadata.PackageNotFoundError:
            continue
        if release(have) < release(floor):
            old.append((name, have, floor))
    return old


def check(requirements: list[str] | None = None, installed: Callable[[str], str] = metadata.version) -> None:
    """Raise ImportError naming every core dependency installed below its floor, and the command that fixes it."""
    old = too_old(requirements, installed)
    if old:
        found = ", ".join(f"{name} {have} (needs >={floor})" for name, have, floor in old)
        fix = " ".join(f"'{name}>={floor}'" for name, _, floor in old)
        raise ImportError(f"jax_scan_rnn: these packages are older than the versions it is tested with: {found}; "
                          f"pip install -U {fix}")
