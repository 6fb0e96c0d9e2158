"""Atomic, integrity-checked checkpoints of pytrees (including ``nnx.State``) with orbax.

Layout of one checkpoint directory::

    directory/
      step_00000120/            one committed checkpoint (the name holds the step, 8+ digits)
        arrays/                 the arrays, written by orbax (``StandardCheckpointer``)
        tree.json               leaf names, shapes, dtypes, PRNG key implementations
        metadata.json           the caller's metadata (model config, vocabulary, ...), plain JSON
        MANIFEST.json           sha256 and size of every other file; written LAST
      .tmp-step_00000130-...    a save in progress (or one that crashed): never read
      step_00000140.invalid-1   a checkpoint that failed :func:`verify`, moved aside by :func:`set_aside`
                                (``fit(resume=True)`` does this instead of deleting it): never read,
                                never counted, never pruned; delete it by hand once inspected

How a save is made atomic:

1. Everything is written into a fresh hidden ``.tmp-step_<step>-<unique>`` directory next to the final
   one (same filesystem): orbax arrays, ``tree.json``, ``metadata.json``.
2. Every file is hashed (and fsynced) and ``MANIFEST.json`` is written last, then fsynced.
3. The temporary directory is renamed to ``step_<step>`` with one ``os.rename`` (atomic on POSIX), and the
   parent directory is fsynced.

A crash before step 3 leaves only a hidden temporary directory, which :func:`steps`, :func:`latest_step`
and :func:`restore` ignore (the next :func:`save` deletes it). A committed directory is still verified
against its manifest before any array is read: a missing manifest, a missing, truncated or altered file
raises :class:`CheckpointError` naming the path and the problem; nothing corrupted is ever loaded.

Files the manifest does not list are "stray" (a user's ``notes.txt``, a ``.DS_Store``): nothing reads
them, so they are reported (``verify``'s return value, ``Restored.stray_files``), not treated as
corruption. The one exception is ``arrays/``: orbax finds files there by name and by glob
(``array_metadatas/process_*``, ``ocdbt.process_*``), so an unlisted file there could change what is
loaded, and it invalidates the checkpoint, unless it is operating-system clutter that orbax never
reads (``.DS_Store``, ``._*``, ``Thumbs.db``, ``desktop.ini``).

Leaf naming: a pytree is flattened with its key paths; each leaf is named by its path components joined
with ``/`` (dict keys, sequence indices, attribute names; the ``.value`` of an ``nnx.Variable`` is
dropped), e.g. ``train_state/model/lin/kernel``. Typed PRNG keys (``jax.random.key``) are stored as their
``key_data`` and re-wrapped on restore, so ``nnx.Rngs`` state round-trips.

Single writer: one process writes to a ``directory`` at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = [
    "CheckpointError",
    "Restored",
    "save",
    "restore",
    "steps",
    "latest_step",
    "verify",
    "read_metadata",
    "step_path",
    "set_aside",
    "named_leaves",
]

FORMAT_VERSION = 1  # bumped when the on-disk layout changes incompatibly
MANIFEST = "MANIFEST.json"
TREE = "tree.json"
METADATA = "metadata.json"
ARRAYS = "arrays"
_STEP_RE = re.compile(r"^step_(\d{8,})$")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_INVALID_RE = re.compile(r"^(step_\d{8,})\.invalid-(\d+)$")  # set aside; _STEP_RE never matches it
# Names operating systems drop into folders a user browses; orbax neither writes nor reads (nor globs)
# them, so they are harmless even inside arrays/.
_OS_CLUTTER = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
_HASH_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupted. The message names the path and the problem."""


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` returns."""

    step: int  # the step of the checkpoint that was loaded
    state: Any  # the restored pytree: the structure of ``target``, or a flat {leaf name: np.ndarray}
    metadata: dict  # the JSON metadata saved with it
    path: Path  # the step directory that was loaded
    skipped: tuple[tuple[int, str], ...] = field(default=())  # (step, reason) of newer invalid ones
    stray_files: tuple[str, ...] = field(default=())  # files in ``path`` not in its manifest (unread)


# --------------------------------------------------------------------------------------------- paths


def step_path(directory: str | os.PathLike, step: int) -> Path:
    """The directory a committed checkpoint of ``step`` lives in: ``directory/step_{step:08d}``."""
    return Path(directory) / f"step_{int(step):08d}"


def steps(directory: str | os.PathLike) -> list[int]:
    """Steps of all committed checkpoints in ``directory``, ascending (not verified; see :func:`verify`).

    Temporary directories of saves in progress or that crashed, and checkpoints moved aside by
    :func:`set_aside` (``step_<n>.invalid-<k>``), are not listed. A missing ``directory`` has no steps.
    """
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for entry in d.iterdir():
        m = _STEP_RE.match(entry.name)
        if m and entry.is_dir():
            found.append(int(m.group(1)))
    return sorted(found)


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest committed step in ``directory``, or ``None`` when there is none (not verified)."""
    s = steps(directory)
    return s[-1] if s else None


# ------------------------------------------------------------------------------------- flattening


def _key_name(entry: Any) -> str:
    if isinstance(entry, jax.tree_util.DictKey):
        return str(entry.key)
    if isinstance(entry, jax.tree_util.SequenceKey):
        return str(entry.idx)
    if isinstance(entry, jax.tree_util.GetAttrKey):
        return entry.name
    if isinstance(entry, jax.tree_util.FlattenedIndexKey):
        return str(entry.key)
    return str(entry)


def named_leaves(tree: Any, argname: str) -> tuple[list[str], list[Any], Any]:
    """Flatten ``tree`` to (names, leaves, treedef); names are unique ``a/b/c`` paths."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names, leaves = [], []
    for path, leaf in with_path:
        parts = [
            _key_name(e)
            for e in path
            if not (isinstance(e, jax.tree_util.GetAttrKey) and e.name == "value")
        ]
        names.append("/".join(parts) if parts else "_root")
        leaves.append(leaf)
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(
            f"{argname}: expected a pytree whose leaf paths give distinct names, got duplicates {dup}"
        )
    return names, leaves, treedef


def _is_prng_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


# ------------------------------------------------------------------------------------------ hashing


def _sha256(path: Path, *, fsync: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
        if fsync:  # when saving: make the bytes durable before the commit rename
            os.fsync(f.fileno())
    return h.hexdigest()


def _files(root: Path) -> list[str]:
    out = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            out.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(out)


def _files_digest(files: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())


def _rmtree_atomically(path: Path) -> None:
    """Rename ``path`` out of the step namespace first, then delete it (a crash leaves only trash)."""
    trash = path.parent / f"{_TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


# --------------------------------------------------------------------------------------------- save


def save(
    directory: str | os.PathLike,
    step: int,
    state: Any,
    metadata: Mapping[str, Any] | None = None,
    *,
    keep: int | None = None,
) -> Path:
    """Write ``state`` (any pytree of arrays, e.g. an ``nnx.State``) as checkpoint ``step``, atomically.

    Args:
      directory: the checkpoint root; created if missing.
      step: a non-negative int; an existing checkpoint of the same step is replaced (a crash during the
        replacement leaves the old one, the new one, or none of that step; never a mixture).
      state: pytree of arrays (jax or numpy), scalars allowed; typed PRNG keys are supported.
      metadata: JSON-serialisable dict saved as ``metadata.json`` (model config, vocabulary, ...), so
        another process can rebuild the model before restoring.
      keep: if given (>= 1), afterwards delete older checkpoints so that ``step`` and the ``keep - 1``
        newest older ones remain. Checkpoints newer than ``step`` are never deleted here.

    Returns:
      The committed step directory.
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step: expected a non-negative int, got {step!r}")
    step = int(step)
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep: expected None or an int >= 1, got {keep!r}")
    metadata = dict(metadata or {})
    try:
        meta_text = json.dumps(metadata, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"metadata: expected a JSON-serialisable dict, got one that is not ({e})") from e

    names, leaves, _ = named_leaves(state, "state")
    arrays: dict[str, Any] = {}
    tree_info: dict[str, dict] = {}
    for name, leaf in zip(names, leaves):
        if leaf is None:
            raise ValueError(f"state: expected arrays at every leaf, got None at {name!r}")
        info: dict[str, Any] = {}
        if _is_prng_key(leaf):
            info["prng_impl"] = str(jax.random.key_impl(leaf))
            info["dtype"] = str(leaf.dtype)
            info["shape"] = list(leaf.shape)
            leaf = jax.random.key_data(leaf)
        elif not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex)):
            raise TypeError(
                f"state: expected array leaves, got {type(leaf).__name__} at {name!r}"
            )
        else:
            leaf = leaf if isinstance(leaf, (jax.Array, np.ndarray)) else np.asarray(leaf)
            info["dtype"] = str(leaf.dtype)
            info["shape"] = list(leaf.shape)
        arrays[name] = leaf
        tree_info[name] = info

    root = Path(directory).absolute()  # orbax requires absolute paths
    root.mkdir(parents=True, exist_ok=True)
    _clean_temporaries(root)
    final = step_path(root, step)
    tmp = root / f"{_TMP_PREFIX}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        import orbax.checkpoint as ocp  # heavy import, deferred to first use

        ckptr = ocp.StandardCheckpointer()
        try:
            ckptr.save(tmp / ARRAYS, arrays)
            ckptr.wait_until_finished()
        finally:
            ckptr.close()
        _write_json(tmp / TREE, {"format": FORMAT_VERSION, "leaves": tree_info})
        with open(tmp / METADATA, "w") as f:
            f.write(meta_text)
            f.flush()
            os.fsync(f.fileno())
        files = {}
        for rel in _files(tmp):
            p = tmp / rel
            files[rel] = {"sha256": _sha256(p, fsync=True), "size": p.stat().st_size}
        for dirpath, _, _ in os.walk(tmp):
            _fsync_dir(Path(dirpath))
        _write_json(
            tmp / MANIFEST,
            {"format": FORMAT_VERSION, "step": step, "files": files, "digest": _files_digest(files)},
        )
        _fsync_dir(tmp)
        trash = None
        if final.exists():  # replacing a step: move the old one aside, commit, then delete it
            trash = root / f"{_TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
        os.rename(tmp, final)
        _fsync_dir(root)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        older = [s for s in steps(root) if s < step]
        for s in older[: max(0, len(older) - (keep - 1))]:
            _rmtree_atomically(step_path(root, s))
    return final


def _clean_temporaries(root: Path) -> None:
    for entry in root.iterdir():
        if entry.is_dir() and entry.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)):
            shutil.rmtree(entry, ignore_errors=True)


# ------------------------------------------------------------------------------------------- verify


def verify(directory: str | os.PathLike, step: int) -> tuple[str, ...]:
    """Check checkpoint ``step`` against its manifest; raise :class:`CheckpointError` if anything is off.

    Detects: a missing step directory, a missing/unreadable/inconsistent ``MANIFEST.json``, a file listed
    in the manifest that is missing, has another size or another sha256, and a file under ``arrays/``
    that the manifest does not list (orbax finds files there by name, so it could change what is
    loaded; operating-system clutter such as ``.DS_Store`` excepted).

    Returns:
      The stray files: paths relative to the step directory, sorted, of files the manifest does not
      list and nothing reads (a user's ``notes.txt``, a ``.DS_Store``). They do not make the checkpoint
      invalid; they are returned so the caller can report them.
    """
    path = step_path(directory, step)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: no such checkpoint directory")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(
            f"checkpoint {path}: {MANIFEST} is missing (incomplete or tampered checkpoint)"
        )
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
        digest = manifest["digest"]
        fmt = manifest["format"]
        mstep = manifest["step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is unreadable ({e})") from e
    if fmt != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path}: format {fmt!r} in {MANIFEST}, this version reads {FORMAT_VERSION}"
        )
    if not isinstance(files, dict) or _files_digest(files) != digest:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} does not match its own digest")
    if mstep != step:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} says step {mstep!r}, directory says {step}")
    on_disk = set(_files(path)) - {MANIFEST}
    missing = sorted(set(files) - on_disk)
    if missing:
        raise CheckpointError(f"checkpoint {path}: file(s) listed in {MANIFEST} are missing: {missing}")
    extra = sorted(on_disk - set(files))
    unsafe = [rel for rel in extra if rel.split("/", 1)[0] == ARRAYS and not _is_os_clutter(rel)]
    if unsafe:
        raise CheckpointError(
            f"checkpoint {path}: file(s) not in {MANIFEST}: {unsafe} (inside {ARRAYS}/, where orbax finds "
            f"files by name, so they could change what is loaded)"
        )
    for rel, expect in sorted(files.items()):
        p = path / rel
        size = p.stat().st_size
        if size != expect["size"]:
            raise CheckpointError(
                f"checkpoint {path}: {rel} has {size} bytes, {MANIFEST} says {expect['size']}"
            )
        if _sha256(p) != expect["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {rel} is corrupted (sha256 mismatch)")
    return tuple(extra)


def _is_os_clutter(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name in _OS_CLUTTER or name.startswith("._")  # "._x": macOS AppleDouble resource forks


def read_metadata(directory: str | os.PathLike, step: int | None = None) -> dict:
    """The JSON metadata of checkpoint ``step`` (default: the newest committed), after :func:`verify`.

    Lets another process rebuild the model (from a saved config) before calling :func:`restore`.
    """
    if step is None:
        step = latest_step(directory)
        if step is None:
            raise CheckpointError(f"checkpoint directory {Path(directory)}: no checkpoint found")
    verify(directory, step)
    return json.loads((step_path(directory, step) / METADATA).read_text())


# ------------------------------------------------------------------------------------------ restore


def restore(
    directory: str | os.PathLike,
    step: int | None = None,
    target: Any = None,
    *,
    fallback: bool = False,
) -> Restored:
    """Verify and load a checkpoint.

    Args:
      directory: the checkpoint root given to :func:`save`.
      step: the step to load; ``None`` loads the newest committed checkpoint.
      target: optional pytree with the structure to restore into (e.g. ``nnx.state(model)``, concrete or
        abstract from ``nnx.eval_shape``/``jax.ShapeDtypeStruct``). Its leaf names, shapes and dtypes must
        match the checkpoint exactly (``ValueError`` naming the leaf otherwise); leaves with a
        ``.sharding`` are restored with that sharding. Without ``target`` the result is a flat
        ``{leaf name: np.ndarray}`` dict (PRNG keys re-wrapped as typed keys).
      fallback: only with ``step=None``: if the newest checkpoint is invalid, try the next older one,
        and so on; the skipped ones are reported in ``Restored.skipped`` (and left where they are:
        ``restore`` never changes the directory; see :func:`set_aside`). Without it an invalid newest
        checkpoint raises.

    Stray files in the loaded checkpoint (not in its manifest, never read) are reported in
    ``Restored.stray_files``; they do not make it invalid (see :func:`verify`).

    Raises:
      CheckpointError: no checkpoint, or the chosen one (all of them, with ``fallback``) failed
        :func:`verify`.
    """
    root = Path(directory).absolute()  # orbax requires absolute paths
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step: expected None or a non-negative int, got {step!r}")
        candidates = [int(step)]
    else:
        candidates = list(reversed(steps(root)))
        if not candidates:
            raise CheckpointError(f"checkpoint directory {root}: no checkpoint found")
    skipped: list[tuple[int, str]] = []
    for s in candidates:
        try:
            stray = verify(root, s)
        except CheckpointError as e:
            if step is None and fallback:
                skipped.append((s, str(e)))
                continue
            if step is None:
                raise CheckpointError(
                    f"{e}; pass fallback=True to restore the newest valid checkpoint instead"
                ) from None
            raise
        path = step_path(root, s)
        metadata = json.loads((path / METADATA).read_text())
        state = _load_arrays(path, target)
        return Restored(
            step=s, state=state, metadata=metadata, path=path, skipped=tuple(skipped), stray_files=stray
        )
    reasons = "; ".join(r for _, r in skipped)
    raise CheckpointError(f"checkpoint directory {root}: no valid checkpoint ({reasons})")


def _load_arrays(path: Path, target: Any) -> Any:
    import orbax.checkpoint as ocp

    info = json.loads((path / TREE).read_text())["leaves"]
    ckptr = ocp.StandardCheckpointer()
    try:
        if target is None:
            raw = ckptr.restore(path / ARRAYS)
            out = {}
            for name, meta in info.items():
                arr = np.asarray(raw[name])
                if "prng_impl" in meta:
                    out[name] = jax.random.wrap_key_data(arr, impl=meta["prng_impl"])
                else:
                    out[name] = arr
            return out

        names, leaves, treedef = named_leaves(target, "target")
        missing = sorted(set(info) - set(names))
        unexpected = sorted(set(names) - set(info))
        if missing or unexpected:
            raise ValueError(
                f"target: expected the leaves of checkpoint {path}, got a tree that lacks {missing} "
                f"and has extra {unexpected}"
            )
        abstract = {}
        for name, leaf in zip(names, leaves):
            meta = info[name]
            shape = tuple(getattr(leaf, "shape", np.shape(leaf)))
            dtype = getattr(leaf, "dtype", None)
            dtype = np.asarray(leaf).dtype if dtype is None else dtype
            if shape != tuple(meta["shape"]) or str(dtype) != meta["dtype"]:
                raise ValueError(
                    f"target: leaf {name!r} expected shape {tuple(meta['shape'])} dtype {meta['dtype']} "
                    f"(as saved in {path}), got shape {shape} dtype {dtype}"
                )
            sharding = getattr(leaf, "sharding", None)
            if "prng_impl" in meta:
                key_shape = shape + tuple(
                    jax.random.key_data(jax.random.key(0, impl=meta["prng_impl"])).shape
                )
                abstract[name] = jax.ShapeDtypeStruct(key_shape, np.uint32, sharding=sharding)
            else:
                abstract[name] = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
        raw = ckptr.restore(path / ARRAYS, abstract)
        restored = []
        for name in names:
            arr = raw[name]
            if "prng_impl" in info[name]:
                arr = jax.random.wrap_key_data(arr, impl=info[name]["prng_impl"])
            restored.append(arr)
        return jax.tree_util.tree_unflatten(treedef, restored)
    except (ValueError, TypeError):
        raise
    except Exception as e:  # orbax/tensorstore failures on a verified checkpoint
        raise CheckpointError(f"checkpoint {path}: could not be read ({type(e).__name__}: {e})") from e
    finally:
        ckptr.close()


def set_aside(directory: str | os.PathLike, step: int) -> Path:
    """Move checkpoint ``step`` out of the way without deleting anything; returns where it now is.

    The step directory is renamed (atomically, within ``directory``) to ``step_<step>.invalid-<k>``, with
    ``k`` one more than the highest already there, so earlier ones are never overwritten. From then on
    :func:`steps`, :func:`latest_step`, :func:`restore`, ``keep`` pruning in :func:`save` and its cleanup
    of temporaries all ignore it: it is kept for inspection until someone deletes it by hand (renaming it
    back to ``step_<step>`` makes it a checkpoint again). ``fit(resume=True)`` uses this for newer
    checkpoints that failed :func:`verify`, which the resumed run then recomputes.

    Raises:
      CheckpointError: there is no committed checkpoint ``step`` in ``directory``.
    """
    path = step_path(directory, step)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: no such checkpoint directory to set aside")
    taken = [
        int(m.group(2))
        for entry in path.parent.iterdir()
        if (m := _INVALID_RE.match(entry.name)) and m.group(1) == path.name
    ]
    aside = path.parent / f"{path.name}.invalid-{max(taken, default=0) + 1}"
    os.rename(path, aside)
    _fsync_dir(path.parent)  # the move itself must survive a crash, like a commit
    return aside
