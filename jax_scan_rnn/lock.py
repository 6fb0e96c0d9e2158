"""One writer per run directory: `with run_lock(out_dir): ...` around everything a run writes there.

Two trainings started on the same `--out` would interleave `metrics.jsonl`, overwrite each other's
`evaluation.json` and delete each other's half-written checkpoints. The lock is an exclusive `flock` on
`out_dir/.lock`, which holds the PID of the process that owns it: a second process is refused at once
with `RunDirectoryLocked`, naming that PID. The kernel releases a `flock` when its process exits, however it
exits (SIGKILL included), so a crash never leaves a stale lock behind; the file itself stays, harmless.

Re-entrant within a thread (the CLI holds the lock around training and evaluation, and `train.fit` takes
it again inside), because a second `flock` on a new file descriptor would conflict with the first; another
thread of the same process is refused as another process is (two `fit` calls in threads on one directory).
POSIX only (`fcntl`); elsewhere, and on a file system that has no locks (NFS without its lock daemon), the lock is
a no-op, said by a `RunDirectoryUnlocked` warning: there a second run into the directory is not refused.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

LOCK_FILE = ".lock"

_held: dict[Path, tuple[int, int]] = {}  # directory -> (file descriptor, thread): the locks this process holds
_unlocked: set[Path] = set()  # directories this process writes without a lock, said once each


class RunDirectoryLocked(ValueError):
    """Another process is writing to the run directory."""


class RunDirectoryUnwritable(ValueError):
    """The run directory cannot be created or written (a file in the way, no permission)."""


class RunDirectoryUnlocked(UserWarning):
    """No lock can be held on the run directory (no `fcntl` on this platform, or a file system without locks): it is
    written all the same, but a second process writing there is not refused."""


@contextlib.contextmanager
def run_lock(directory: str | os.PathLike) -> Iterator[Path]:
    """Hold the run directory `directory` (created if missing) for this process; yields its path.

    Raises:
      RunDirectoryLocked: another live process holds it (the message names its PID).
      RunDirectoryUnwritable: it cannot be created or written.
    Warns:
      RunDirectoryUnlocked: no lock can be held there; the run goes on unlocked.
    """
    path = Path(directory).resolve()
    if path in _held:
        if _held[path][1] != threading.get_ident():
            raise RunDirectoryLocked(f"{path}: another thread of this process (PID {os.getpid()}) is writing to "
                                     "this directory; wait for it to finish or choose another output directory")
        yield path  # already this thread's: the outermost holder releases it
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = None if fcntl is None else os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise RunDirectoryUnwritable(f"{path}: cannot write the run directory ({err.strerror})") from None
    why = "this platform has no fcntl" if fd is None else None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirectoryLocked(
            f"{path}: another run (PID {holder}) is writing to this directory; wait for it to finish or "
            "choose another output directory"
        ) from None
    except OSError as err:  # a file system without locks (NFS without its lock daemon: ENOLCK): as without fcntl
        os.close(fd)
        fd, why = None, f"its file system refuses locks ({err.strerror})"
    if fd is None:  # no lock to hold: the run's own errors (a full disk) pass through the yield as they are
        if path not in _unlocked:  # once per directory (the CLI holds it, then fit)
            _unlocked.add(path)
            warnings.warn(f"{path}: not locked ({why}): a second run writing to this directory is not refused; "
                          "start one at a time", RunDirectoryUnlocked, stacklevel=3)
        yield path
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[path] = (fd, threading.get_ident())
    try:
        yield path
    finally:
        del _held[path]
        os.close(fd)  # releases the flock
