"""XLA settings. Three for CPUs: small scans run as one kernel, with matrix-vector code suited to it (both
set when `jax_scan_rnn` is imported), and the library's own compiled calls compile at LLVM -O1 with 512-bit
vectors (`compiler_options`). One for the CLI: a persistent compilation cache (`use_cli_compilation_cache`).

XLA:CPU runs a compiled program as a sequence of "thunks" (one per fused kernel or library matmul), and a
`while` loop (what `lax.scan` becomes) re-dispatches its body's thunks on every iteration; for a small step
(a Traveller at batch 1) that dispatch is most of the time. XLA can instead compile a whole small loop into
ONE kernel, for loops whose per-iteration bytes (its cost analysis) are below
`xla_cpu_small_while_loop_byte_threshold` (1 kB by default, which no recurrent layer meets). This module
raises it to 2 MB and tiles the matrix-vector products XLA writes into that kernel (batch-1 matmuls) by one
vector register instead of 8:

    --xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=2000000,xla_llvm_dot_tiling_factor=1

2 MB admits the batch-1 loops measured faster (H <= 128) and leaves larger ones as they were; loops whose
matmuls XLA hands to its YNNPACK library (every batch >= 2) are never converted. Results are the same
operations, dispatched differently; the tiling moves outputs by float rounding at most. If you turn YNNPACK
off yourself (`--xla_cpu_experimental_ynn_fusion_type=`), batched loops become eligible and run far slower:
set `JAX_SCAN_RNN_XLA_FLAGS=0` then. Measured: docs/measurements.md#xla-small-loop-threshold and
#matrix-vector-code (the tiling is slower at H=32, and says how to override it).

XLA reads its flags once, when JAX creates its first backend, so this must run before the first JAX
computation; `import jax_scan_rnn` does that. It never overrides a user: an option `XLA_FLAGS` already
sets keeps the user's value, nothing changes with `JAX_SCAN_RNN_XLA_FLAGS=0` or once a backend exists, and
`status()` says which. Options prefixed `xla_` are not passed on to LLVM, so GPU backends ignore them.

`compiler_options()` is what the library's `jax.jit`s pass (`jsr.jit`, `TrainStep`, `make_eval_fn`) on a
CPU: LLVM at optimisation level 1 instead of 3 (as fast to run, quicker to compile; -O0 runs slower) and
vectors of up to 512 bits instead of 256 (faster at batch 1 and 64; LLVM stays at what the CPU has); both
round differently in the last bits. Measured: docs/measurements.md#llvm-optimisation-level and
#matrix-vector-code. They are per-compile options, so the user's own `jax.jit`s keep XLA's defaults; one that
the user's `XLA_FLAGS` sets is left out (theirs applies), and `JAX_SCAN_RNN_XLA_FLAGS=0` turns them off.

`jax-scan-rnn`'s commands (not the library, and not `bench`, which times compiles) keep the programs they
compile in JAX's persistent compilation cache, in `~/.cache/jax-scan-rnn/xla` (`$XDG_CACHE_HOME`), at most
`CLI_CACHE_MAX_BYTES` (least recently used programs go first): a second run of the same model, or `sample`
after `train`, loads them instead of compiling again (docs/measurements.md#the-clis-compilation-cache).
`JAX_SCAN_RNN_COMPILATION_CACHE` names another folder, or `0` turns it off; a user's own
`JAX_COMPILATION_CACHE_DIR` is used as it is. Beside it, `~/.cache/jax-scan-rnn/data` keeps the molecules the VAE
commands rewrite in Kekulé form (`cli_data_cache`; `JAX_SCAN_RNN_DATA_CACHE` moves it or, `0`, turns it off).
"""
from __future__ import annotations

import os
import re
import sys

SMALL_LOOP_OPTION = "xla_cpu_small_while_loop_byte_threshold"
SMALL_LOOP_BYTES = 2_000_000  # per-iteration bytes (XLA cost analysis): admits the loops measured faster
GEMV_TILING_OPTION = "xla_llvm_dot_tiling_factor"
GEMV_TILING = 1  # vector registers per tile of a one-kernel loop's matrix-vector product (XLA's default: 8)
BACKEND_OPTIONS = {SMALL_LOOP_OPTION: SMALL_LOOP_BYTES, GEMV_TILING_OPTION: GEMV_TILING}
OPT_OUT_ENV = "JAX_SCAN_RNN_XLA_FLAGS"  # "0": leave XLA_FLAGS and the compile options alone
# LLVM -O1: measured as fast to run, quicker to compile; 512-bit vectors: measured faster (XLA prefers 256).
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1, "xla_cpu_prefer_vector_width": 512}

CACHE_ENV = "JAX_SCAN_RNN_COMPILATION_CACHE"  # the CLI's cache folder, or "0": none
CLI_CACHE_MAX_BYTES = 2**30
CLI_CACHE_MIN_COMPILE_S = 0.1  # every model program the CLI compiles takes longer; JAX's default is 1 s
DATA_CACHE_ENV = "JAX_SCAN_RNN_DATA_CACHE"  # the CLI's folder of converted molecules, or "0": none

_status = "not configured"
# `use_cli_compilation_cache`'s folder once set: then JAX_COMPILATION_CACHE_DIR may be the CLI's, not the user's
_cli_cache_set: str | None = None


def _backends_initialized() -> bool:
    if "jax._src.xla_bridge" not in sys.modules:  # JAX not imported yet: no backend (and no 0.5 s import)
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - jax moved it; assume the worst (no change)
        return True
    return bool(xla_bridge.backends_are_initialized())


def with_backend_options(flags: str, options: dict | None = None) -> str:
    """`flags` (an XLA_FLAGS string) with each of `options` (default `BACKEND_OPTIONS`) that it does not
    already set added to `--xla_backend_extra_options`.

    XLA takes one `--xla_backend_extra_options=k1=v1,k2=v2` flag (the last one wins), so an existing one
    is extended rather than repeated, and an option the user already gives keeps the user's value.
    """
    match = re.search(r"--xla_backend_extra_options=(\S*)", flags)
    given = {item.partition("=")[0] for item in match.group(1).split(",")} if match else set()
    wanted = BACKEND_OPTIONS if options is None else options
    added = ",".join(f"{key}={value}" for key, value in wanted.items() if key not in given)
    if not added:
        return flags
    if match is None:
        return f"{flags} --xla_backend_extra_options={added}".strip()
    merged = f"{match.group(1)},{added}" if match.group(1) else added
    return flags[: match.start(1)] + merged + flags[match.end(1) :]


def configure(environ=None) -> str:
    """Add `BACKEND_OPTIONS` to `XLA_FLAGS` where it is safe; returns what happened.

    Returns one of: "set" (added; any option the user already gives keeps its value), "user" (XLA_FLAGS
    already sets every one of them: kept), "opted out" (`JAX_SCAN_RNN_XLA_FLAGS=0`), "too late" (a JAX
    backend already exists, so XLA has read its flags; set XLA_FLAGS yourself or import jax_scan_rnn first).
    """
    global _status
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "")
    wanted = with_backend_options(flags)
    if _opted_out(env):
        _status = "opted out"
    elif wanted == flags:
        _status = "user"
    elif _backends_initialized():
        _status = "too late"
    else:
        env["XLA_FLAGS"] = wanted
        _status = "set"
    return _status


def _opted_out(env, name: str = OPT_OUT_ENV) -> bool:
    """Whether the variable `name` of `env` says off ("0", "false", "no", "off")."""
    return env.get(name, "1").strip().lower() in ("0", "false", "no", "off")


def compiler_options(environ=None) -> dict | None:
    """`compiler_options` for the library's `jax.jit`s: `CPU_COMPILER_OPTIONS` when JAX's default backend is
    the CPU, less any option the user's `XLA_FLAGS` sets (a per-compile option would override it); None
    (XLA's defaults) on other backends or with `JAX_SCAN_RNN_XLA_FLAGS=0`."""
    import jax

    env = os.environ if environ is None else environ
    if _opted_out(env) or jax.default_backend() != "cpu":
        return None
    flags = env.get("XLA_FLAGS", "")
    return {key: value for key, value in CPU_COMPILER_OPTIONS.items() if f"--{key}=" not in flags}


def status() -> str:
    """What `configure` did in this process (see its docstring), for `jax-scan-rnn info` and the benchmark."""
    return _status


def cli_compilation_cache(environ=None) -> str | None:
    """The folder `use_cli_compilation_cache` would keep compiled programs in, or None: turned off
    (`JAX_SCAN_RNN_COMPILATION_CACHE=0`), or the user's own `JAX_COMPILATION_CACHE_DIR` applies."""
    env = os.environ if environ is None else environ
    return None if env.get("JAX_COMPILATION_CACHE_DIR") else _cli_cache(env, CACHE_ENV, "xla")


def cli_data_cache(environ=None) -> str | None:
    """The folder the CLI keeps the VAE data's Kekulé forms in (`smiles.kekule_forms(..., cache=)`), or None:
    turned off (`JAX_SCAN_RNN_DATA_CACHE=0`)."""
    return _cli_cache(os.environ if environ is None else environ, DATA_CACHE_ENV, "data")


def writable_folder(folder: str) -> str:
    """`folder`, made where missing; OSError naming it where it cannot be made or written."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise OSError(f"cannot create {folder} ({err.strerror or err})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OSError(f"cannot write {folder} (permission denied)")
    return folder


def _cli_cache(env, variable: str, name: str) -> str | None:
    """`$variable`'s folder, None where it says off, else `name` in the user's cache (`$XDG_CACHE_HOME`, ~/.cache)."""
    if _opted_out(env, variable):
        return None
    if env.get(variable):
        return env[variable]
    home = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "jax-scan-rnn", name)


def use_cli_compilation_cache() -> str | None:
    """Point JAX's persistent compilation cache at `cli_compilation_cache()`, bounded to `CLI_CACHE_MAX_BYTES`
    (before the process's first compile: JAX decides once). Returns the folder, or None where nothing was
    set: turned off, or the user's own cache. Raises OSError naming the folder if it cannot be written (JAX
    would fail at the first compile), ImportError if `filelock`, which JAX needs to bound it, is missing.

    Called before JAX is imported (the CLI checks a command's arguments first, so that a bad one is answered
    without waiting seconds for JAX), it sets the environment variables JAX reads its settings from when it is
    imported; after, `jax.config`."""
    global _cli_cache_set
    folder = cli_compilation_cache()
    if folder is None:
        return None
    import filelock  # noqa: F401

    writable_folder(folder)
    settings = {"jax_compilation_cache_dir": folder, "jax_compilation_cache_max_size": CLI_CACHE_MAX_BYTES,
                "jax_persistent_cache_min_compile_time_secs": CLI_CACHE_MIN_COMPILE_S}
    if "jax" in sys.modules:
        import jax

        for name, value in settings.items():
            jax.config.update(name, value)
    else:
        os.environ.update({name.upper(): str(value) for name, value in settings.items()})
    _cli_cache_set = folder
    return folder


def cli_cache_in_use() -> str | None:
    """The folder `use_cli_compilation_cache` pointed JAX's cache at in this process, or None."""
    return _cli_cache_set
