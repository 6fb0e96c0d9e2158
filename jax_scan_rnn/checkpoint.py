"""Checkpoints of pytrees (including ``nnx.State``) written by orbax's ``CheckpointManager``, plus what orbax
lacks: a sha256 manifest, :func:`verify`, and falling back to the newest *valid* step.

Layout (orbax's, with ``step_prefix="step"`` and 8 digits)::

    directory/
      step_00000120/            one checkpoint, committed by orbax
        arrays/                 orbax item: the flat {leaf name: array} dict (``StandardSave``)
        metadata/metadata       orbax item: the caller's JSON metadata (model config, vocabulary, ...)
        _CHECKPOINT_METADATA    orbax's step metadata (commit_success.txt files: orbax's commit markers)
        MANIFEST.json           sha256 and size of every other file; written LAST, after orbax's commit
      step_00000130.orbax-checkpoint-tmp   a save in progress (or one that crashed): never read
      step_00000140.invalid-1   set aside by :func:`set_aside` (``fit(resume=True)`` does this to a
                                checkpoint that failed :func:`verify`): never read, counted or pruned

Saving, on one host or several (every process calls :func:`save` with its shards; the metadata written
is process 0's):

1. orbax writes every process's shards into a temporary directory; after a barrier, process 0 renames
   it to ``step_<step>`` (atomic on POSIX) and all processes wait again. The save is synchronous.
2. Process 0 hashes (and fsyncs) every file and writes ``MANIFEST.json``; the others wait at a barrier.
3. Only then are checkpoints beyond ``keep`` deleted (orbax's ``delete``: process 0 deletes, all wait),
   so a crash at any point leaves the previous complete checkpoint in place. Each waits until no other
   process reads it (a ``flock`` on the step directory: shared while read, exclusive while deleted), so
   ``evaluate`` or ``export`` of a run that is still training never has its checkpoint deleted under it.

A crash in 1 leaves only orbax's temporary directory (ignored; the next :func:`save` deletes it); a crash
in 2 leaves a step without a valid manifest: partial, and refused like a corrupted one. Every checkpoint
is verified before any array is read: a missing manifest, a missing, truncated or altered file raises
:class:`CheckpointError` naming the path and the problem. Reading (:func:`steps`, :func:`verify`,
:func:`read_metadata`, :func:`restore`) uses orbax's item handlers without the manager's barriers, so
any process may read alone; in a multi-host job each process restores its own shards of ``target``.

Files the manifest does not list are "stray" (a user's ``notes.txt``, a ``.DS_Store``): nothing reads
them, so they are reported (``verify``'s return value, ``Restored.stray_files``), not treated as
corruption; except inside ``arrays/``, where orbax finds files by name and by glob
(``array_metadatas/process_*``, ``ocdbt.process_*``), so an unlisted file could change what is loaded:
there it invalidates the checkpoint, unless it is operating-system clutter that orbax never reads
(``.DS_Store``, ``._*``, ``Thumbs.db``, ``desktop.ini``).

Leaf names are key paths joined with ``/`` (the ``.value`` of an ``nnx.Variable`` dropped), e.g.
``train_state/model/lin/kernel``. Typed PRNG keys are stored by orbax as their ``key_data`` with their
implementation and come back as typed keys, so ``nnx.Rngs`` round-trips. One job writes to a
``directory`` at a time (orbax's ``CheckpointManager`` is multi-process-safe, not multi-job-safe).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import itertools
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jax_scan_rnn import validate

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock between a reader and a deleting writer
    fcntl = None

__all__ = ["CheckpointError", "Restored", "save", "restore", "steps", "latest_step", "verify", "read_metadata",
           "step_path", "step_of", "set_aside", "named_leaves", "newest_valid_step"]

FORMAT_VERSION = 2  # of MANIFEST.json and the layout; 2: orbax's CheckpointManager
MANIFEST, ARRAYS, METADATA = "MANIFEST.json", "arrays", "metadata"
_PREFIX, _DIGITS = "step", 8
_INVALID_RE = re.compile(r"^(step_\d{8,})\.invalid-(\d+)$")  # set aside; never an orbax step name
_OS_CLUTTER = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})  # orbax never reads (nor globs) these
_barrier_ids = itertools.count()  # barrier names must be unique; all processes call in the same order


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupted. The message names the path and the problem."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint written in another format (by an older or a newer jax-scan-rnn): whole, but not this version's to
    read. Never a reason to fall back to an older step (``fallback=True`` raises it): that would resume a run of the
    other version from behind its newest step."""


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` returns."""

    step: int  # the step of the checkpoint that was loaded
    state: Any  # the restored pytree: the structure of ``target``, or a flat {leaf name: np.ndarray}
    metadata: dict  # the JSON metadata saved with it
    path: Path  # the step directory that was loaded
    skipped: tuple[tuple[int, str], ...] = ()  # (step, reason) of newer invalid ones
    stray_files: tuple[str, ...] = ()  # files in ``path`` not in its manifest (unread)


def _name_format():
    import orbax.checkpoint as ocp  # heavy import, deferred to first use

    return ocp.step.standard_name_format(step_prefix=_PREFIX, step_format_fixed_length=_DIGITS)


def step_path(directory: str | os.PathLike, step: int) -> Path:
    """The directory a committed checkpoint of ``step`` lives in: ``directory/step_{step:08d}``."""
    return Path(directory) / f"{_PREFIX}_{validate.integer('step', step, lo=0):0{_DIGITS}d}"


def step_of(path: str | os.PathLike) -> int | None:
    """The step a committed checkpoint's directory name holds (``step_00000120`` -> 120), else None."""
    match = re.fullmatch(rf"{_PREFIX}_(\d{{{_DIGITS},}})", Path(path).name)
    return int(match.group(1)) if match else None


def steps(directory: str | os.PathLike, *, manifested: bool = False) -> list[int]:
    """Steps of all committed checkpoints in ``directory`` as orbax finds them, ascending (not verified).

    Orbax's temporary directories and checkpoints set aside (``step_<n>.invalid-<k>``) are not listed. A
    missing ``directory`` has no steps. With ``manifested``, only steps whose manifest is written: a save killed
    after orbax's commit and before its manifest is committed but never complete (its presence only, not a
    verify, which hashes every file).
    """
    d = Path(directory)
    found = sorted(m.step for m in _name_format().find_all(d)) if d.is_dir() else []
    return [s for s in found if (step_path(d, s) / MANIFEST).is_file()] if manifested else found


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest committed step in ``directory``, or ``None`` when there is none (not verified)."""
    return max(steps(directory), default=None)


def named_leaves(tree: Any, argname: str) -> tuple[list[str], list[Any], Any]:
    """Flatten ``tree`` to (names, leaves, treedef); names are unique ``a/b/c`` paths."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = [_leaf_name(path) for path, _ in with_path]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"{argname}: expected a pytree whose leaf paths give distinct names, got duplicates {dup}")
    return names, [leaf for _, leaf in with_path], treedef


def _leaf_name(path: tuple) -> str:
    """``a/b/c`` from a key path, the ``.value`` of an ``nnx.Variable`` dropped."""
    kept = tuple(e for e in path if not (isinstance(e, jax.tree_util.GetAttrKey) and e.name == "value"))
    return jax.tree_util.keystr(kept, simple=True, separator="/") or "_root"


def check_metadata(metadata: Mapping[str, Any] | None) -> dict:
    """``metadata`` as the dict :func:`save` writes (None: empty); TypeError if it is not JSON-serialisable
    (NaN and inf included, which strict JSON lacks)."""
    if metadata is not None and not isinstance(metadata, Mapping):  # dict("abc"): "dictionary update sequence ..."
        raise TypeError(f"metadata: expected a dict of JSON values or None, got {type(metadata).__name__}")
    metadata = dict(metadata or {})
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"metadata: expected a JSON-serialisable dict, got one that is not ({e})") from e
    _check_string_keys("metadata", metadata)
    return metadata


def _check_string_keys(where: str, value: Any) -> None:
    """JSON's keys are strings: json.dumps writes 1 as "1" (and 1 beside "1" as the same key twice, one value
    lost when read back), so a restored dict would not be the one saved."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: expected string keys (JSON writes {key!r} as {json.dumps({key: 0})[1:-4]}), "
                                f"got {key!r}")
            _check_string_keys(f"{where}[{key!r}]", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_string_keys(f"{where}[{i}]", item)


def save(directory: str | os.PathLike, step: int, state: Any, metadata: Mapping[str, Any] | None = None, *,
         keep: int | None = None) -> Path:
    """Write ``state`` (any pytree of arrays, e.g. an ``nnx.State``) as checkpoint ``step``, atomically.

    Every process of a multi-host job calls this (see the module docstring).

    Args:
      directory: the checkpoint root; created if missing.
      step: a non-negative int. An existing checkpoint of that step is deleted first: a crash in between
        leaves none of it, or a partly deleted one that :func:`verify` refuses, never a mixture.
      state: pytree of arrays (jax or numpy), scalars allowed; typed PRNG keys are supported.
      metadata: JSON-serialisable dict, string keys at every level, saved with it (model config, vocabulary,
        ...), so another process can rebuild the model before restoring (several processes: process 0's is
        written).
      keep: if given (>= 1), afterwards delete older checkpoints so that ``step`` and the ``keep - 1``
        newest older ones remain. Checkpoints newer than ``step`` are never deleted here.

    Returns:
      The committed step directory.

    Raises:
      OSError: the file system refused (``ENOSPC``: before anything is written when the disk cannot hold it, or
        after orbax failed, its temporary directory then removed), naming the step directory.
    """
    import orbax.checkpoint as ocp

    step = validate.integer("step", step, lo=0)
    validate.integer("keep", keep, lo=1, none=True)
    metadata = check_metadata(metadata)
    names, leaves, _ = named_leaves(state, "state")
    for name, leaf in zip(names, leaves):
        if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex)):
            raise TypeError(f"state: expected array leaves, got {type(leaf).__name__} at {name!r}")
    arrays = {n: x if isinstance(x, (jax.Array, np.ndarray)) else np.asarray(x) for n, x in zip(names, leaves)}

    root = Path(directory).absolute()  # orbax requires absolute paths
    _check_free_space(root, step, arrays)
    options = ocp.CheckpointManagerOptions(
        step_name_format=_name_format(),
        enable_async_checkpointing=False,  # save() returns with the step committed (exact resume)
        cleanup_tmp_directories=True,  # a crashed save's temporary directory
        save_root_metadata=False,  # nothing in `directory` but step directories
        lightweight_initialize=True,  # no step metadata read (nor logged about, if a step is damaged)
    )
    with ocp.CheckpointManager(root, options=options) as manager:
        if step in manager.all_steps():  # orbax never overwrites a step
            _delete(manager, root, step)
        items = {ARRAYS: ocp.args.StandardSave(arrays), METADATA: ocp.args.JsonSave(metadata)}
        failed = None
        try:
            manager.save(step, args=ocp.args.Composite(**items), force=True)  # force: also older than the newest
        except ValueError as e:  # tensorstore's OS error (a full disk) comes as a ValueError naming the code
            code = re.search(r"os_error_code='(\d+)'", str(e))
            if code is None:
                raise
            failed = OSError(int(code[1]), os.strerror(int(code[1])), str(step_path(root, step)))
            failed.__cause__ = e  # raised below, out of this block: orbax's tasks are collected first
        if failed is not None:
            if jax.process_count() == 1:  # the half-written step gives its space back at once, not at the next save
                for tmp in root.glob(f"{step_path(root, step).name}.orbax-checkpoint-tmp*"):
                    shutil.rmtree(tmp, ignore_errors=True)
            gc.collect()  # orbax's failed write tasks log their errors now, above the caller's message, not after it
            raise failed
        if jax.process_index() == 0:
            _write_manifest(step_path(root, step), step)
        _barrier("manifest")
        if keep is not None:  # not orbax's max_to_keep: it deletes before the manifest exists
            older = [s for s in manager.all_steps() if s < step]
            for s in older[: max(0, len(older) - (keep - 1))]:
                _delete(manager, root, s)
    return step_path(root, step)


def _delete(manager: Any, root: Path, step: int) -> None:
    """orbax's delete (process 0 deletes, every process waits), once no other process is reading the step."""
    with _held(step_path(root, step), exclusive=True) if jax.process_index() == 0 else contextlib.nullcontext():
        manager.delete(step)


def _check_free_space(root: Path, step: int, arrays: Mapping[str, Any]) -> None:
    """OSError(ENOSPC) naming the step, before orbax writes anything, when the disk cannot hold the checkpoint: orbax
    would fail half-way, its threads printing pages of tracebacks. Needed: the newest checkpoint's size on disk (in a
    training run the same arrays, whose compressed size barely moves between steps), at most the arrays' bytes (another
    tree is not held to an older, larger one's size); for a first save half the arrays' bytes (orbax's compression
    never halves weights). The estimate may be low, and orbax's own failure is then reported as before. One process
    only: on several, one refusing alone would leave the others waiting at orbax's barriers."""
    if jax.process_count() > 1:
        return
    def size(s: int) -> int:
        return sum(f.stat().st_size for f in step_path(root, s).rglob("*") if f.is_file())

    saved, nbytes = steps(root), sum(x.nbytes for x in arrays.values())
    needed = min(size(saved[-1]), nbytes) if saved else nbytes // 2
    where = root
    while not where.exists():  # the directory is created by the save: the disk it will be on
        where = where.parent
    free = shutil.disk_usage(where).free + (size(step) if step in saved else 0)  # a step saved again: deleted first
    if free < needed:
        raise OSError(errno.ENOSPC, f"No space left on device (the checkpoint needs about {needed} bytes, {free} are "
                      "free)", str(step_path(root, step)))


def _barrier(name: str) -> None:
    """Wait for every process (nothing to wait for with one)."""
    import orbax.checkpoint as ocp

    ocp.multihost.sync_global_processes(f"jax_scan_rnn.checkpoint.{name}.{next(_barrier_ids)}")


def _write_manifest(path: Path, step: int) -> None:
    files = {rel: {"size": (path / rel).stat().st_size, "sha256": _sha256(path / rel, fsync=True)}
             for rel in _files(path)}
    for d, _, _ in os.walk(path):
        _fsync(d)
    with open(path / MANIFEST, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT_VERSION, "step": step, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    _fsync(path)


def _sha256(path: Path, *, fsync: bool = False) -> str:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        if fsync:  # when saving: the bytes are durable before the manifest vouches for them
            os.fsync(f.fileno())
    return digest


def _files(root: Path) -> list[str]:
    return sorted(Path(d, name).relative_to(root).as_posix() for d, _, names in os.walk(root) for name in names)


def _fsync(directory: str | os.PathLike) -> None:
    """Flush `directory`'s entries (a new file, a rename) to disk, where a directory opens as a file."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except PermissionError:  # Windows opens no directory as a file; NTFS journals its directory changes itself
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify(directory: str | os.PathLike, step: int) -> tuple[str, ...]:
    """Check checkpoint ``step`` against its manifest; raise :class:`CheckpointError` if anything is off.

    Detects: a missing step directory; a missing (e.g. a save that crashed after orbax's commit) or
    unreadable ``MANIFEST.json``, or one of another format or step; a listed file that is missing or has
    another size or sha256; an unlisted file under ``arrays/`` (orbax finds files there by name, so it
    could change what is loaded; operating-system clutter such as ``.DS_Store`` excepted).

    Returns:
      The stray files: paths relative to the step directory, sorted, of files the manifest does not
      list and nothing reads (a user's ``notes.txt``, a ``.DS_Store``). They do not make the checkpoint
      invalid; they are returned so the caller can report them.
    """
    with _held(step_path(directory, step)):
        return _check(directory, step)


def _check(directory: str | os.PathLike, step: int) -> tuple[str, ...]:
    path = step_path(directory, step)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: no such checkpoint directory (the steps of {Path(directory)}: "
                              f"{steps(directory)})")
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is missing (a save still being written, "
                              "a crashed save, or a tampered checkpoint)")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        fmt, mstep = manifest["format"], manifest["step"]
        files = {rel: (int(v["size"]), str(v["sha256"])) for rel, v in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is unreadable ({e})") from e
    if fmt != FORMAT_VERSION:  # 1: jax-scan-rnn before 2026-12-01, its own orbax layout (metadata.json, tree.json)
        by = "an older" if isinstance(fmt, int) and fmt < FORMAT_VERSION else "another"
        raise CheckpointFormatError(f"checkpoint {path}: format {fmt!r} in {MANIFEST}, written by {by} jax-scan-rnn; this "
                              f"version reads format {FORMAT_VERSION} only: load it with the version that wrote it")
    if mstep != step:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} says step {mstep!r}, directory says {step}")
    on_disk = set(_files(path)) - {MANIFEST}
    missing = sorted(set(files) - on_disk)
    if missing:
        raise CheckpointError(f"checkpoint {path}: file(s) listed in {MANIFEST} are missing: {missing}")
    extra = sorted(on_disk - set(files))
    unsafe = [rel for rel in extra if rel.split("/", 1)[0] == ARRAYS and not _is_os_clutter(rel)]
    if unsafe:
        raise CheckpointError(f"checkpoint {path}: file(s) not in {MANIFEST}: {unsafe} (inside {ARRAYS}/, where "
                              "orbax finds files by name, so they could change what is loaded)")
    for rel, (size, sha256) in sorted(files.items()):
        if (path / rel).stat().st_size != size:
            raise CheckpointError(f"checkpoint {path}: {rel} has {(path / rel).stat().st_size} bytes, "
                                  f"{MANIFEST} says {size}")
        if _sha256(path / rel) != sha256:
            raise CheckpointError(f"checkpoint {path}: {rel} is corrupted (sha256 mismatch)")
    return tuple(extra)


def _is_os_clutter(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name in _OS_CLUTTER or name.startswith("._")  # "._x": macOS AppleDouble resource forks


def read_metadata(directory: str | os.PathLike, step: int | None = None) -> dict:
    """The JSON metadata of checkpoint ``step`` (default: the newest committed), after :func:`verify`.

    Lets another process rebuild the model (from a saved config) before calling :func:`restore`.
    """
    root = Path(directory).absolute()
    if step is None and (step := latest_step(root)) is None:
        raise CheckpointError(_none_found(root))
    with _held(step_path(root, step)):
        _check(root, step)
        return _read_json(step_path(root, step))


def _none_found(root: Path) -> str:
    """The message for a `directory` without checkpoints; where a folder inside it holds some (a training run's
    `out_dir`, whose checkpoints live in `out_dir/checkpoints`, the directory the CLI's --checkpoint names), it says
    to pass that folder."""
    try:
        inside = sorted(p for p in root.iterdir() if p.is_dir() and steps(p)) if root.is_dir() else []
    except OSError:  # a folder we may not list: the message without the hint
        inside = []
    message = f"checkpoint directory {root}: no checkpoint found"
    if inside:
        message += f"; {inside[0]} holds checkpoints: pass that folder (a training run's out_dir keeps them there)"
    return message


def _read_json(path: Path) -> dict:
    import orbax.checkpoint as ocp

    return ocp.JsonCheckpointHandler().restore(path / METADATA)


def restore(directory: str | os.PathLike, step: int | None = None, target: Any = None, *,
            fallback: bool = False) -> Restored:
    """Verify and load a checkpoint.

    Args:
      directory: the checkpoint root given to :func:`save`.
      step: the step to load; ``None`` loads the newest committed checkpoint.
      target: optional pytree with the structure to restore into (e.g. ``nnx.state(model)``, concrete or
        abstract from ``nnx.eval_shape``/``jax.ShapeDtypeStruct``). Its leaf names, shapes and dtypes must
        match the checkpoint exactly (``ValueError`` naming the leaf otherwise); leaves with a
        ``.sharding`` are restored with that sharding, the others (and every leaf without ``target``) on this
        process's first device, whatever devices saved them. Without ``target`` the result is a flat
        ``{leaf name: np.ndarray}`` dict (PRNG keys as typed keys). ``target`` may also be a function of the
        checkpoint's metadata returning the tree, for a structure that depends on what was saved (`fit`'s log
        window holds the metrics the saved run logged).
      fallback: only with ``step=None``: if the newest checkpoint is invalid, try the next older one,
        and so on; the skipped ones are reported in ``Restored.skipped`` (and left where they are:
        ``restore`` never changes the directory; see :func:`set_aside`). Without it an invalid newest
        checkpoint raises. A checkpoint of another format (:class:`CheckpointFormatError`) raises either way.

    Stray files in the loaded checkpoint (not in its manifest, never read) are reported in
    ``Restored.stray_files``; they do not make it invalid (see :func:`verify`).

    Raises:
      CheckpointError: no checkpoint, or the chosen one (all of them, with ``fallback``) failed
        :func:`verify`.
    """
    root = Path(directory).absolute()  # orbax requires absolute paths
    explicit = step is not None

    def read(s: int, stray: tuple[str, ...], skipped: tuple) -> Restored:  # called holding the step (_held)
        path = step_path(root, s)
        metadata = _read_json(path)
        tree = target(metadata) if callable(target) else target
        return Restored(s, _load(path, tree), metadata, path, skipped, stray)

    if step is None and fallback:
        return _newest_valid(root, read)
    if step is None and (step := latest_step(root)) is None:
        raise CheckpointError(_none_found(root))
    step = validate.integer("step", step, lo=0)
    with _held(step_path(root, step)):
        try:
            stray = _check(root, step)
        except CheckpointError as e:
            if explicit:
                raise
            raise CheckpointError(f"{e}; pass fallback=True to restore the newest valid checkpoint instead") from None
        return read(step, stray, ())


@contextlib.contextmanager
def _held(path: Path, *, exclusive: bool = False):
    """A `flock` on the step directory itself: shared while it is read, exclusive while :func:`save` deletes it
    (``keep``), so a job still training never deletes the checkpoint that another process (evaluate, export) is
    reading; orbax would fail half-way through, and its threads print pages of tracebacks. Nothing is written, so a
    read-only run directory reads as before. A missing directory is left for :func:`verify` to report."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield
        return
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)  # readers hold it for a read: seconds
            except OSError:  # NFS emulates flock with POSIX locks, whose exclusive kind a directory cannot take
                pass  # a best effort there: the read or the delete goes ahead as without the lock
        yield
    finally:
        os.close(fd)  # releases the lock


def newest_valid_step(directory: str | os.PathLike) -> tuple[int, tuple[tuple[int, str], ...]]:
    """The newest checkpoint in ``directory`` that passes :func:`verify`, and ``(step, reason)`` of each newer one
    that does not (a save still being written by a running job, a crashed or a corrupted one), newest first.

    For readers of a run that may still be training (evaluate, export): the newest committed step can lack its
    manifest for the moment between orbax's commit and the manifest's write.

    Raises:
      CheckpointError: no checkpoint, or none is valid.
    """
    return _newest_valid(Path(directory).absolute(), lambda s, stray, skipped: (s, skipped))


def _newest_valid(root: Path, then: Callable[[int, tuple[str, ...], tuple], Any]) -> Any:
    """`then(step, stray files, skipped)` for the newest checkpoint that verifies, called while the step is held
    (`_held`), each step verified once; `skipped`: `(step, reason)` of the newer ones that do not."""
    skipped: list[tuple[int, str]] = []
    for s in reversed(steps(root)):
        with _held(step_path(root, s)):
            try:
                stray = _check(root, s)
            except CheckpointFormatError:
                raise
            except CheckpointError as e:
                skipped.append((s, str(e)))
                continue
            return then(s, stray, tuple(skipped))
    if not skipped:
        raise CheckpointError(_none_found(root))
    raise CheckpointError(f"checkpoint directory {root}: no valid checkpoint ({'; '.join(r for _, r in skipped)})")


def _load(path: Path, target: Any) -> Any:
    """The arrays of the verified checkpoint at ``path``; ``target`` as in :func:`restore`."""
    import orbax.checkpoint as ocp

    handler = ocp.StandardCheckpointHandler()
    try:
        saved = handler.metadata(path / ARRAYS).tree
        if target is None:
            here = _here()
            abstract = {name: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=here) for name, m in saved.items()}
        else:
            abstract = _abstract(target, saved, path)
        try:
            raw = handler.restore(path / ARRAYS, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # orbax/tensorstore failures on a verified checkpoint
            raise CheckpointError(f"checkpoint {path}: could not be read ({type(e).__name__}: {e})") from e
    finally:
        handler.close()
    if target is None:
        return {n: x if _is_prng_key(x) else np.asarray(x) for n, x in raw.items()}
    names, _, treedef = named_leaves(target, "target")
    return jax.tree_util.tree_unflatten(treedef, [raw[n] for n in names])


def _abstract(target: Any, saved: Mapping[str, Any], path: Path) -> dict[str, jax.ShapeDtypeStruct]:
    """{name: shape, dtype and sharding to restore} from ``target``, checked against orbax's ``saved``
    metadata (orbax alone would cast another dtype)."""
    names, leaves, _ = named_leaves(target, "target")
    missing, unexpected = sorted(set(saved) - set(names)), sorted(set(names) - set(saved))
    if missing or unexpected:
        raise ValueError(f"target: expected the leaves of checkpoint {path}, got a tree that lacks "
                         f"[{validate.listed(missing, 4)}] and has extra [{validate.listed(unexpected, 4)}]")
    abstract = {}
    for name, leaf in zip(names, leaves):
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        want = jax.ShapeDtypeStruct(np.shape(leaf), dtype, sharding=getattr(leaf, "sharding", None) or _here())
        got = jax.eval_shape(jax.random.key_data, want) if _is_prng_key(want) else want  # a key: stored as key_data
        if (got.shape, got.dtype) != (tuple(saved[name].shape), saved[name].dtype):
            # A float64 model built without x64 holds float32 (JAX only warns), so say what builds it.
            x64 = ("; 64-bit leaves need jax.config.update('jax_enable_x64', True) before the model is built"
                   if saved[name].dtype.itemsize == 8 and not jax.config.jax_enable_x64 else "")
            raise ValueError(f"target: leaf {name!r} expected shape {tuple(saved[name].shape)} dtype "
                             f"{saved[name].dtype} (as saved in {path}), got shape {got.shape} dtype {got.dtype}{x64}")
        abstract[name] = want
    return abstract


def _here() -> jax.sharding.Sharding:
    """Where a leaf without a sharding of its own is restored: this process's first device. orbax alone would
    rebuild the mesh that saved it, and refuse a checkpoint saved on other devices (a run trained with
    `--devices 2`, evaluated on a laptop). `make_single_device_sharding`: jax 0.12.1 deprecates the class's name."""
    return jax.sharding.make_single_device_sharding(jax.local_devices()[0])


def _is_prng_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def set_aside(directory: str | os.PathLike, step: int) -> Path:
    """Move checkpoint ``step`` out of the way without deleting anything; returns where it now is.

    The step directory is renamed (atomically, within ``directory``) to ``step_<step>.invalid-<k>``, with
    ``k`` one more than the highest already there, so earlier ones are never overwritten. That is no
    orbax step name, so :func:`steps`, :func:`restore`, ``keep`` pruning and orbax's cleanup of temporaries
    all ignore it: it is kept until someone deletes it by hand (renaming it back to ``step_<step>`` makes
    it a checkpoint again). ``fit(resume=True)`` uses this for newer checkpoints that failed
    :func:`verify`, which the resumed run then recomputes. Like :func:`save`, every process of a
    multi-host job calls it; process 0 renames.

    Raises:
      CheckpointError: there is no committed checkpoint ``step`` in ``directory``.
    """
    path = step_path(directory, step)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: no such checkpoint directory to set aside")
    taken = [int(m[2]) for e in path.parent.iterdir() if (m := _INVALID_RE.match(e.name)) and m[1] == path.name]
    aside = path.parent / f"{path.name}.invalid-{max(taken, default=0) + 1}"
    _barrier("set_aside.chosen")  # every process has chosen the same name before it is taken
    if jax.process_index() == 0:
        os.rename(path, aside)
        _fsync(path.parent)  # the move itself must survive a crash, like a commit
    _barrier("set_aside.done")
    return aside
