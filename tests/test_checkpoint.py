"""Checkpoints: round trip (incl. nnx rng state), integrity manifest, stray files, atomicity, fallback,
setting aside, pruning."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_scan_rnn import checkpoint as ckpt
from jax_scan_rnn.checkpoint import CheckpointError


class Tiny(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(3, 2, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(2, 2, rngs=rngs)])

    def __call__(self, x):
        return self.layers[0](self.drop(self.lin(x)))


def model_state(seed: int):
    m = Tiny(nnx.Rngs(seed))
    m(jnp.ones((1, 3)))  # advance the dropout rng count
    return m, nnx.state(m)


def assert_trees_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jax.dtypes.issubdtype(y.dtype, jax.dtypes.prng_key)
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert np.asarray(x).dtype == np.asarray(y).dtype


def data_file(step_dir):
    """The largest array data file orbax wrote (a byte in it belongs to the arrays)."""
    files = [p for p in (step_dir / "arrays").rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def test_round_trip_nnx_state_with_rng_and_metadata(tmp_path):
    _, state = model_state(0)
    meta = {"model": {"hidden": 2, "layers": 1}, "vocab": ["a", "b"]}
    path = ckpt.save(tmp_path, 7, state, meta)
    assert path == ckpt.step_path(tmp_path, 7) and path.name == "step_00000007"
    assert ckpt.steps(tmp_path) == [7] and ckpt.latest_step(tmp_path) == 7
    assert ckpt.read_metadata(tmp_path) == meta

    # Restore into a differently-initialised model: everything (incl. rng key and count) comes back.
    other, target = model_state(1)
    restored = ckpt.restore(tmp_path, target=target)
    assert restored.step == 7 and restored.metadata == meta and restored.skipped == ()
    assert isinstance(restored.state, nnx.State)
    assert_trees_equal(restored.state, state)
    nnx.update(other, restored.state)
    assert int(other.drop.rngs.count[...]) == 1

    # Without a target: a flat {name: array} dict with readable names; keys re-wrapped.
    flat = ckpt.restore(tmp_path).state
    np.testing.assert_array_equal(flat["lin/kernel"], np.asarray(state["lin"]["kernel"][...]))
    np.testing.assert_array_equal(flat["layers/0/bias"], np.asarray(state["layers"][0]["bias"][...]))
    key = flat["drop/rngs/key"]
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


def test_round_trip_plain_pytree_and_abstract_target(tmp_path):
    tree = {"a": jnp.arange(5.0), "b": [np.int32(3), jnp.ones((2, 2), jnp.bfloat16)]}
    ckpt.save(tmp_path, 0, tree)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype), tree)
    assert_trees_equal(ckpt.restore(tmp_path, 0, target=abstract).state, jax.tree.map(jnp.asarray, tree))


def test_target_mismatch_names_the_leaf(tmp_path):
    ckpt.save(tmp_path, 1, {"w": jnp.zeros((2, 3))})
    with pytest.raises(ValueError, match=r"target: leaf 'w' expected shape \(2, 3\)"):
        ckpt.restore(tmp_path, target={"w": jnp.zeros((3, 2))})
    with pytest.raises(ValueError, match="target: .*lacks \\['w'\\]"):
        ckpt.restore(tmp_path, target={"v": jnp.zeros((2, 3))})


def test_tampered_byte_is_detected(tmp_path):
    _, state = model_state(0)
    path = ckpt.save(tmp_path, 3, state)
    victim = data_file(path)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    victim.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"step_00000003.*corrupted \(sha256 mismatch\)"):
        ckpt.restore(tmp_path, target=state)
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.verify(tmp_path, 3)


def test_tampered_metadata_is_detected(tmp_path):
    path = ckpt.save(tmp_path, 3, {"w": jnp.ones(3)}, {"hidden": 8})
    (path / "metadata.json").write_text(json.dumps({"hidden": 9}))
    with pytest.raises(CheckpointError, match="metadata.json"):
        ckpt.read_metadata(tmp_path, 3)


def test_missing_manifest_is_detected(tmp_path):
    path = ckpt.save(tmp_path, 4, {"w": jnp.ones(3)})
    (path / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match=r"step_00000004: MANIFEST.json is missing"):
        ckpt.restore(tmp_path)


def test_truncated_manifest_is_detected(tmp_path):
    path = ckpt.save(tmp_path, 4, {"w": jnp.ones(3)})
    m = path / "MANIFEST.json"
    m.write_text(m.read_text()[:40])
    with pytest.raises(CheckpointError, match="MANIFEST.json is unreadable"):
        ckpt.restore(tmp_path, 4)


def test_missing_and_extra_files_are_detected(tmp_path):
    path = ckpt.save(tmp_path, 5, {"w": jnp.ones(3)})
    victim = data_file(path)
    rel = victim.relative_to(path).as_posix()
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"missing: \\['{rel}'\\]"):
        ckpt.restore(tmp_path, 5)
    path = ckpt.save(tmp_path, 6, {"w": jnp.ones(3)})
    (path / "arrays" / "stray.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="not in MANIFEST.json.*stray.bin"):
        ckpt.restore(tmp_path, 6)


def test_stray_files_are_reported_not_treated_as_corruption(tmp_path):
    _, state = model_state(0)
    path = ckpt.save(tmp_path, 8, state, {"v": 1})
    (path / "notes.txt").write_text("lr 2e-2 looked best")  # a user's note next to the checkpoint
    (path / ".DS_Store").write_bytes(b"\0Bud1")  # Finder, in the step directory...
    (path / "plots").mkdir()
    (path / "plots" / "loss.png").write_bytes(b"png")
    (path / "arrays" / ".DS_Store").write_bytes(b"\0Bud1")  # ...and inside orbax's directory
    (path / "arrays" / "._manifest.ocdbt").write_bytes(b"AppleDouble")
    expect = tuple(sorted(["arrays/._manifest.ocdbt", "arrays/.DS_Store", ".DS_Store", "notes.txt",
                           "plots/loss.png"]))
    assert ckpt.verify(tmp_path, 8) == expect
    r = ckpt.restore(tmp_path, target=state)
    assert r.step == 8 and r.stray_files == expect and r.skipped == ()
    assert_trees_equal(r.state, state)
    assert ckpt.restore(tmp_path, fallback=True).stray_files == expect
    assert ckpt.read_metadata(tmp_path) == {"v": 1}
    assert (path / "notes.txt").read_text() == "lr 2e-2 looked best"  # left alone
    # A clean checkpoint has none.
    ckpt.save(tmp_path, 9, state)
    assert ckpt.verify(tmp_path, 9) == () and ckpt.restore(tmp_path, 9).stray_files == ()


def test_unlisted_file_orbax_would_read_is_still_invalid(tmp_path):
    # orbax globs arrays/array_metadatas/process_* on restore: an unlisted one could change what loads.
    path = ckpt.save(tmp_path, 5, {"w": jnp.ones(3)})
    (path / "arrays" / "array_metadatas" / "process_1").write_text("{}")
    unlisted = r"step_00000005: file\(s\) not in MANIFEST.json: \['arrays/array_metadatas/process_1'\]"
    with pytest.raises(CheckpointError, match=unlisted):
        ckpt.verify(tmp_path, 5)
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        ckpt.restore(tmp_path, fallback=True)


def test_set_aside_keeps_the_data_and_hides_it_from_steps_and_pruning(tmp_path):
    for s in (1, 2):
        ckpt.save(tmp_path, s, {"w": jnp.full(2, float(s))})
    bad = ckpt.step_path(tmp_path, 2)
    before = {p.relative_to(bad): p.read_bytes() for p in bad.rglob("*") if p.is_file()}
    aside = ckpt.set_aside(tmp_path, 2)
    assert aside == tmp_path / "step_00000002.invalid-1" and not bad.exists()
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == before
    assert ckpt.steps(tmp_path) == [1] and ckpt.latest_step(tmp_path) == 1
    assert ckpt.restore(tmp_path).step == 1
    # The same step set aside again gets the next number; the first one is never overwritten.
    ckpt.save(tmp_path, 2, {"w": jnp.zeros(2)})
    assert ckpt.set_aside(tmp_path, 2) == tmp_path / "step_00000002.invalid-2"
    # save's cleanup of temporaries and keep-N pruning neither count nor delete them.
    for s in (3, 4, 5):
        ckpt.save(tmp_path, s, {"w": jnp.zeros(2)}, keep=2)
    assert ckpt.steps(tmp_path) == [4, 5]
    assert sorted(os.listdir(tmp_path)) == [
        "step_00000002.invalid-1", "step_00000002.invalid-2", "step_00000004", "step_00000005",
    ]
    ckpt.save(tmp_path, 6, {"w": jnp.zeros(2)}, keep=1)
    assert ckpt.steps(tmp_path) == [6] and aside.is_dir()
    # Renaming it back makes it a checkpoint again (nothing was changed inside it).
    os.rename(aside, ckpt.step_path(tmp_path, 2))
    assert float(ckpt.restore(tmp_path, 2).state["w"][0]) == 2.0
    with pytest.raises(CheckpointError, match=r"step_00000007: no such checkpoint directory"):
        ckpt.set_aside(tmp_path, 7)


def test_fallback_only_when_asked(tmp_path):
    ckpt.save(tmp_path, 10, {"w": jnp.full(3, 10.0)})
    bad = ckpt.save(tmp_path, 20, {"w": jnp.full(3, 20.0)})
    (bad / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="fallback=True"):
        ckpt.restore(tmp_path)
    r = ckpt.restore(tmp_path, fallback=True)
    assert r.step == 10 and float(r.state["w"][0]) == 10.0
    assert [s for s, _ in r.skipped] == [20] and "MANIFEST.json is missing" in r.skipped[0][1]
    with pytest.raises(CheckpointError, match="step_00000020"):  # an explicit step never falls back
        ckpt.restore(tmp_path, 20, fallback=True)
    (ckpt.step_path(tmp_path, 10) / "tree.json").unlink()
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        ckpt.restore(tmp_path, fallback=True)


def test_crash_mid_write_leaves_nothing_loadable(tmp_path, monkeypatch):
    ckpt.save(tmp_path, 1, {"w": jnp.ones(3)})

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("power cut")

    # Crash after the arrays and files are written, just before the commit rename.
    monkeypatch.setattr(ckpt.os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(tmp_path, 2, {"w": jnp.full(3, 2.0)})
    monkeypatch.undo()
    assert ckpt.steps(tmp_path) == [1]
    assert ckpt.restore(tmp_path).step == 1

    # A hard crash (no cleanup ran) leaves a hidden temporary directory: ignored, then cleaned up.
    leftover = tmp_path / ".tmp-step_00000002-999-deadbeef"
    (leftover / "arrays").mkdir(parents=True)
    assert ckpt.steps(tmp_path) == [1] and ckpt.restore(tmp_path).step == 1
    ckpt.save(tmp_path, 2, {"w": jnp.full(3, 2.0)})
    assert not leftover.exists()
    assert ckpt.restore(tmp_path).step == 2


def test_overwrite_same_step(tmp_path):
    ckpt.save(tmp_path, 3, {"w": jnp.zeros(2)})
    ckpt.save(tmp_path, 3, {"w": jnp.ones(2)}, {"v": 2})
    r = ckpt.restore(tmp_path, 3)
    assert float(r.state["w"][0]) == 1.0 and r.metadata == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000003"]


def test_keep_n_pruning(tmp_path):
    for s in range(1, 6):
        ckpt.save(tmp_path, s * 10, {"w": jnp.full(2, float(s))}, keep=2)
    assert ckpt.steps(tmp_path) == [40, 50]
    assert sorted(os.listdir(tmp_path)) == ["step_00000040", "step_00000050"]
    ckpt.save(tmp_path, 60, {"w": jnp.zeros(2)}, keep=1)
    assert ckpt.steps(tmp_path) == [60]


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="^step:"):
        ckpt.save(tmp_path, -1, {"w": jnp.zeros(1)})
    with pytest.raises(ValueError, match="^keep:"):
        ckpt.save(tmp_path, 1, {"w": jnp.zeros(1)}, keep=0)
    with pytest.raises(TypeError, match="^metadata:"):
        ckpt.save(tmp_path, 1, {"w": jnp.zeros(1)}, {"f": object()})
    with pytest.raises(TypeError, match="^state:.*'w'"):
        ckpt.save(tmp_path, 1, {"w": "not an array"})
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        ckpt.restore(tmp_path / "empty")
    assert ckpt.latest_step(tmp_path / "empty") is None
