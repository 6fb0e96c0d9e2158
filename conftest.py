"""Shared pytest set-up: float64 must be available for the float64 parity tests.

With x64 enabled, JAX still computes in float32 whenever the inputs and parameters are float32 (the
library never relies on default dtypes), so float32 tests keep their meaning.
"""
import ctypes
import gc
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest's workers (pyproject: -n 2) already fill the cores: torch's OpenMP threads would spin against
    # the other worker's (set before any test imports torch).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# glibc's malloc gives each thread that allocates its own arena, up to 8 per core, and XLA's compile and
# run threads leave freed memory spread over all of them: four arenas per worker took 3-13% less of the run's
# memory for 3-7% more time (docs/measurements.md#pytest-workers-malloc-arenas).
WORKER_MALLOC_ARENAS = "4"

# Every program goes in the run's compilation cache: JAX's default keeps only those that compile in over 1 s,
# and most of the tests' programs take less. Measured: about a fifth off the compile-heavy modules
# (docs/measurements.md#pytests-compilation-cache).
CACHE_MIN_COMPILE_S = 0.0


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the run's first process: xdist's controller, or the only one
        _share_compiled_programs(config)
    # Only where tests run: pytest-xdist's controller (-n 2) runs none, and without JAX it holds ~0.1 GiB
    # less of the run's memory (the README quotes the run's peak). Its workers start after this hook and
    # inherit its environment; glibc reads MALLOC_ARENA_MAX when a process starts (a user's value is kept).
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        os.environ.setdefault("MALLOC_ARENA_MAX", WORKER_MALLOC_ARENAS)
        return
    import jax

    jax.config.update("jax_enable_x64", True)


@pytest.fixture
def readers_jax_defaults():
    """JAX's defaults as a reader's session has them, x64 off (pytest_configure turns it on for the float64 tests):
    for the docs' code blocks, which a reader runs as written, so NumPy's float64 arrives as float32 there too."""
    import jax

    with jax.enable_x64(False):
        yield


def _share_compiled_programs(config) -> None:
    """One JAX compilation cache for the whole run, in a fresh temporary folder removed at its end: the
    workers, the CLI's subprocesses and each module after `jax.clear_caches()` compile many of the same
    programs. It starts empty, so a run never reads another run's programs. A user's own
    JAX_COMPILATION_CACHE_DIR is kept. The CLI's data cache (Kekulé forms) goes in the same folder, not the user's
    (`JAX_SCAN_RNN_DATA_CACHE`; one set by hand is kept)."""
    folder = tempfile.mkdtemp(prefix="jax-scan-rnn-pytest-xla-cache-")
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    os.environ.setdefault("JAX_SCAN_RNN_DATA_CACHE", os.path.join(folder, "data"))  # xla_flags.DATA_CACHE_ENV
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(CACHE_MIN_COMPILE_S)


# Within a module, a worker whose resident size grew by this much since the module began (or since the last
# drop) drops its compiled programs after the test: parity_tests/test_layers_parity.py alone grew from
# ~0.9 GiB to 1.96 GiB in 125 s; dropping them at ~1.4 GiB kept it to 1.44 GiB in 116 s. Growth, not size:
# the imports alone take a different size in each environment, and a bound below it would drop the programs
# after every test (at 1.1 GiB, 158 s: the module's tests share programs). 0.35 GiB rather than 0.5: the whole
# default run's peak took 2,649 instead of 2,800 MiB summed PSS, its largest process 1,760 instead of 2,028 MiB
# RSS (2026-12-02, one run each, back to back; their wall times, 428 and 529 s, moved with the machine).
GROWTH_BOUND = 0.35 * 2**30
_since = [0]  # the resident size the growth counts from


def _resident() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: only the module-scoped drop
        return 0


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """JAX caches every compiled program per function for the life of the process: kept over the whole
    default run, one process reached 5.4 GiB (measured). Each module's programs are dropped after it."""
    _since[0] = _resident()
    yield
    import jax

    jax.clear_caches()
    _clear_package_caches()
    gc.collect()
    _trim()


def _trim() -> None:
    """glibc keeps freed pages in its arenas: hand them back (a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _clear_package_caches() -> None:
    """Empty the package's `functools` caches (MOSES's test statistics, ChemNet, the filters' SMARTS: 45 MiB
    after tests/test_metrics.py, measured): a later module that needs them builds them again."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("jax_scan_rnn", "torch_ref"):
            for obj in list(vars(module).values()):
                if callable(getattr(obj, "cache_clear", None)) and getattr(obj, "__module__", None) == name:
                    obj.cache_clear()


@pytest.fixture(autouse=True)
def _bound_growth():
    """Within a module that compiles many programs, drop them each time the worker has grown by GROWTH_BOUND;
    after every test, hand glibc's free pages back (XLA's compiles leave hundreds of MiB freed but held)."""
    yield
    if _resident() - _since[0] > GROWTH_BOUND:
        import jax

        jax.clear_caches()
        _trim()
        _since[0] = _resident()
    else:
        _trim()


BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"


@pytest.fixture(scope="module")
def script(request):
    """The benchmarks/ script named by the test module's `BENCHMARK_SCRIPT`, imported with its folder on
    `sys.path` (the scripts import their folder's `timed_run` and each other)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(request.module.BENCHMARK_SCRIPT)
    finally:
        sys.path.remove(str(BENCHMARKS))
