"""The core install's floors: pyproject.toml states them, .ci/minimum-versions.txt pins them for CI's run at
those versions, and `import jax_scan_rnn` refuses an older package with one line naming it."""
from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement  # pytest's own dependency

from jax_scan_rnn import versions

ROOT = Path(__file__).resolve().parents[1]


def pinned(python: str) -> dict[str, str]:
    """The CI file's pin of each package for Python `python` ("3.11"): a line may hold for some Pythons only (a
    marker), where an older version has no wheel for a newer Python."""
    lines = (ROOT / ".ci" / "minimum-versions.txt").read_text().splitlines()
    pins: dict[str, str] = {}
    for line in lines:
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"python_version": python}):
                assert requirement.name not in pins, f"{requirement.name} pinned twice for Python {python}"
                (spec,) = requirement.specifier
                assert spec.operator == "==", f"{line}: expected an exact pin"
                pins[requirement.name] = spec.version
    return pins


def test_every_core_floor_is_pinned_in_the_ci_file_at_that_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"]
    floors = dict(versions.FLOOR.fullmatch(d).groups() for d in deps)
    assert len(floors) == len(deps), f"every core dependency should be 'name>=X.Y', got {deps}"
    oldest = project["requires-python"].removeprefix(">=")
    pins = pinned(oldest)  # the floors are the oldest Python's
    assert set(floors) == set(pins), f"pyproject.toml floors {sorted(floors)} != .ci/minimum-versions.txt {sorted(pins)}"
    for name, floor in floors.items():
        assert versions.release(pins[name]) == versions.release(floor), f"{name}: pyproject >={floor}, CI pins {pins[name]}"
    for python in ["3.12", "3.13"]:  # a newer Python's pins: each package, never below the floor
        pins = pinned(python)
        assert set(pins) == set(floors), f"Python {python}: .ci/minimum-versions.txt pins {sorted(pins)}"
        for name, floor in floors.items():
            pin = pins[name]
            assert versions.release(pin) >= versions.release(floor), f"{name}: >={floor}, Python {python} pins {pin}"


def test_the_installed_metadata_holds_these_floors_and_this_environment_meets_them():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    core = [r for r in metadata.requires(versions.DISTRIBUTION) if "extra ==" not in r]
    # What the import checks is the installed metadata: stale (installed before a floor moved), it would check old floors.
    assert sorted(versions.FLOOR.fullmatch(r).groups() for r in core) == \
        sorted(versions.FLOOR.fullmatch(d).groups() for d in deps), "reinstall: pip install -e ."
    assert versions.too_old() == []


@pytest.mark.parametrize("version, release", [("0.10.2", (0, 10, 2)), ("0.10.2.dev20260101", (0, 10, 2)),
                                              ("4.66.0", (4, 66)), ("2.0", (2,)), ("1.0rc1", (1,)), ("x", ())])
def test_release_reads_the_leading_numbers(version, release):
    assert versions.release(version) == release


INSTALLED = {"jax": "0.10.1", "flax": "0.12.8", "tqdm": "4.66.0", "numpy": "2.0.2"}


def installed(name: str) -> str:
    if name not in INSTALLED:
        raise metadata.PackageNotFoundError(name)
    return INSTALLED[name]


def test_only_core_requirements_below_their_floor_are_reported():
    requirements = ["jax>=0.10.2", "flax>=0.12.5", "tqdm>=4.66", "numpy>=2.0.2", "missing>=1.0",
                    'torch>=99; extra == "torch"']
    assert versions.too_old(requirements, installed) == [("jax", "0.10.1", "0.10.2")]


def test_an_old_package_is_one_import_error_naming_it_and_the_fix():
    with pytest.raises(ImportError) as err:
        versions.check(["jax>=0.10.2", "flax>=0.13"], installed)
    assert str(err.value) == ("jax_scan_rnn: these packages are older than the versions it is tested with: "
                              "jax 0.10.1 (needs >=0.10.2), flax 0.12.8 (needs >=0.13); "
                              "pip install -U 'jax>=0.10.2' 'flax>=0.13'")
    versions.check(["jax>=0.10.1", "flax>=0.12"], installed)  # at or above: nothing raised
