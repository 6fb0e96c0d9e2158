"""Checkpoints: round trip (incl. nnx rng state), integrity manifest, stray files, atomicity under SIGKILL,
fallback, setting aside, pruning."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import types

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
    # An abstract nnx state (nnx.eval_shape), PRNG key included.
    _, state = model_state(0)
    ckpt.save(tmp_path, 1, state)
    abstract = nnx.state(nnx.eval_shape(lambda: Tiny(nnx.Rngs(5))))
    assert_trees_equal(ckpt.restore(tmp_path, 1, target=abstract).state, state)


def test_target_mismatch_names_the_leaf(tmp_path):
    ckpt.save(tmp_path, 1, {"w": jnp.zeros((2, 3))})
    with pytest.raises(ValueError, match=r"target: leaf 'w' expected shape \(2, 3\)"):
        ckpt.restore(tmp_path, target={"w": jnp.zeros((3, 2))})
    other_dtype = r"target: leaf 'w' expected shape \(2, 3\) dtype float(32|64) .*, got shape \(2, 3\) dtype bfloat16"
    with pytest.raises(ValueError, match=other_dtype):  # orbax alone would cast
        ckpt.restore(tmp_path, target={"w": jnp.zeros((2, 3), jnp.bfloat16)})
    with pytest.raises(ValueError, match="target: .*lacks \\['w'\\]"):
        ckpt.restore(tmp_path, target={"v": jnp.zeros((2, 3))})
    many = {f"w{i}": jnp.zeros(()) for i in range(10)}  # another optimiser's state: a leaf per parameter differs
    ckpt.save(tmp_path / "many", 1, many)
    with pytest.raises(ValueError, match=r"lacks \['w0', 'w1', 'w2', 'w3' and 6 more\] and has extra \[\]$"):
        ckpt.restore(tmp_path / "many", target={})
    ckpt.save(tmp_path / "four", 1, {f"w{i}": jnp.zeros(()) for i in range(4)})  # all four shown, no "and 0 more"
    with pytest.raises(ValueError, match=r"lacks \['w0', 'w1', 'w2', 'w3'\] and has extra \[\]$"):
        ckpt.restore(tmp_path / "four", target={})


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
    (path / "metadata" / "metadata").write_text(json.dumps({"hidden": 9}))  # orbax's JSON item
    with pytest.raises(CheckpointError, match="metadata/metadata is corrupted"):
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


def test_a_checkpoint_of_another_format_is_named_as_another_versions(tmp_path):
    # A run saved before 2026-12-01 (format 1) is refused, saying it is an older version's and what to do, not only
    # that the numbers differ; its files are left as they are.
    path = ckpt.save(tmp_path, 4, {"w": jnp.ones(3)})
    manifest = path / "MANIFEST.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 1}))
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(tmp_path, 4)
    assert str(err.value) == (f"checkpoint {path}: format 1 in MANIFEST.json, written by an older jax-scan-rnn; this "
                              "version reads format 2 only: load it with the version that wrote it")
    assert manifest.is_file() and ckpt.steps(tmp_path) == [4]



@pytest.mark.parametrize("fmt, by", [(3, "another"), ("2", "another"), (None, "another")])
def test_a_checkpoint_of_a_newer_or_unknown_format_is_named_as_another_versions(tmp_path, fmt, by):
    # Only an int below this version's format is an older version's; a newer one, or a value no version writes,
    # is refused as another's in the same one line (a string compared with an int would raise a bare TypeError).
    path = ckpt.save(tmp_path, 4, {"w": jnp.ones(3)})
    manifest = path / "MANIFEST.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": fmt}))
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(tmp_path, 4)
    assert str(err.value) == (f"checkpoint {path}: format {fmt!r} in MANIFEST.json, written by {by} jax-scan-rnn; "
                              "this version reads format 2 only: load it with the version that wrote it")

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


def test_a_step_that_is_not_there_is_named_with_the_steps_that_are(tmp_path):
    """`restore`, `read_metadata` and `verify` (a task's `load(out_dir, step)`) given another step."""
    for step in (10, 20):
        ckpt.save(tmp_path, step, {"w": jnp.zeros(2)}, metadata={"step": step})
    for call in (ckpt.restore, ckpt.read_metadata, ckpt.verify):
        with pytest.raises(CheckpointError, match=r"step_00000015: no such checkpoint directory \(the steps of "
                                                  rf"{re.escape(str(tmp_path))}: \[10, 20\]\)$"):
            call(tmp_path, 15)
        with pytest.raises(ValueError, match=r"^step: expected an int >= 0, got -1$"):
            call(tmp_path, -1)


def test_fallback_only_when_asked(tmp_path):
    ckpt.save(tmp_path, 10, {"w": jnp.full(3, 10.0)})
    bad = ckpt.save(tmp_path, 20, {"w": jnp.full(3, 20.0)})
    (bad / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="fallback=True"):
        ckpt.restore(tmp_path)
    r = ckpt.restore(tmp_path, fallback=True)
    assert r.step == 10 and float(r.state["w"][0]) == 10.0
    assert [s for s, _ in r.skipped] == [20] and "MANIFEST.json is missing (a save still being written" in r.skipped[0][1]
    assert ckpt.newest_valid_step(tmp_path) == (10, r.skipped)  # what a reader of a run still training loads
    with pytest.raises(CheckpointError, match="step_00000020"):  # an explicit step never falls back
        ckpt.restore(tmp_path, 20, fallback=True)
    (ckpt.step_path(tmp_path, 10) / "_CHECKPOINT_METADATA").unlink()  # orbax's step metadata
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        ckpt.restore(tmp_path, fallback=True)
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        ckpt.newest_valid_step(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        ckpt.newest_valid_step(tmp_path / "empty")


def test_pruning_waits_until_no_one_reads_the_checkpoint(tmp_path):
    """A training still running (keep=1) must not delete the step an `evaluate` is reading: orbax would fail half-way.
    The reader's hold is the one `restore` takes for its whole read."""
    import threading

    ckpt.save(tmp_path, 1, {"w": jnp.ones(2)})
    saver = threading.Thread(target=ckpt.save, args=(tmp_path, 2, {"w": jnp.zeros(2)}), kwargs={"keep": 1})
    with ckpt._held(ckpt.step_path(tmp_path, 1)):
        saver.start()
        saver.join(timeout=3.0)
        assert saver.is_alive() and ckpt.steps(tmp_path) == [1, 2]  # step 2 is saved, step 1 not yet deleted
        assert float(ckpt.restore(tmp_path, 1).state["w"][0]) == 1.0
    saver.join(timeout=30.0)
    assert not saver.is_alive() and ckpt.steps(tmp_path) == [2]


CRASH_SCRIPT = """
import os, signal, sys
import jax.numpy as jnp
from jax_scan_rnn import checkpoint as ckpt

def sigkill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finally: like a power cut

ckpt.save(sys.argv[1], 1, {"w": jnp.ones(3)})
if sys.argv[2] == "commit":
    os.rename = sigkill  # orbax's commit renames its temporary directories
else:
    ckpt._write_manifest = sigkill  # after orbax's commit, before the manifest
ckpt.save(sys.argv[1], 2, {"w": jnp.full(3, 2.0)}, keep=1)
"""


@pytest.mark.parametrize("at", ["commit", "manifest"])
def test_sigkill_mid_save_leaves_nothing_loadable_and_the_previous_checkpoint(tmp_path, at):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path), at], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    if at == "commit":  # only orbax's temporary directory: not a step
        [leftover] = [p.name for p in tmp_path.glob("step_00000002*")]
        assert leftover.startswith("step_00000002.orbax-checkpoint-tmp")
        assert ckpt.steps(tmp_path) == [1] and ckpt.restore(tmp_path).step == 1
    else:  # committed without a manifest: partial, refused; keep=1 has not pruned step 1 yet
        assert ckpt.steps(tmp_path) == [1, 2]
        with pytest.raises(CheckpointError, match=r"step_00000002: MANIFEST.json is missing.*fallback=True"):
            ckpt.restore(tmp_path)
        r = ckpt.restore(tmp_path, fallback=True)
        assert r.step == 1 and [s for s, _ in r.skipped] == [2]
    assert float(ckpt.restore(tmp_path, 1).state["w"][0]) == 1.0
    # The next save cleans up orbax's temporary directory or replaces the partial step.
    ckpt.save(tmp_path, 2, {"w": jnp.full(3, 2.0)}, keep=1)
    assert sorted(os.listdir(tmp_path)) == ["step_00000002"]
    assert float(ckpt.restore(tmp_path).state["w"][0]) == 2.0


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
    # A step older than the newest is saved too; pruning never deletes a newer one.
    ckpt.save(tmp_path, 30, {"w": jnp.ones(2)}, keep=1)
    assert ckpt.steps(tmp_path) == [30, 60] and float(ckpt.restore(tmp_path, 30).state["w"][0]) == 1.0


def test_a_run_directory_given_for_its_checkpoints_is_named_as_such(tmp_path):
    """The CLI's --checkpoint takes a training run's out_dir; the API takes out_dir/checkpoints. Given the run's
    directory, read_metadata, restore and newest_valid_step said only 'no checkpoint found' in a folder that has
    them one level down: the message names the folder to pass."""
    ckpt.save(tmp_path / "checkpoints", 3, {"w": jnp.ones(2)}, {"model": "m"})
    hint = re.escape(f"{tmp_path / 'checkpoints'} holds checkpoints: pass that folder")
    for read in (ckpt.read_metadata, ckpt.restore, lambda d: ckpt.restore(d, fallback=True), ckpt.newest_valid_step):
        with pytest.raises(CheckpointError, match=f"no checkpoint found; {hint}"):
            read(tmp_path)
    assert ckpt.read_metadata(tmp_path / "checkpoints") == {"model": "m"}
    with pytest.raises(CheckpointError, match="no checkpoint found$"):  # nothing inside either: no hint
        ckpt.restore(tmp_path / "checkpoints" / "step_00000003" / "metadata")


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



@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_metadata_with_nan_or_inf_is_refused_as_not_json(tmp_path, value):
    # Python's json writes them as NaN and Infinity, which strict JSON readers (jq, JSON.parse) refuse: save
    # raises the same TypeError as for any value JSON lacks, and writes nothing.
    with pytest.raises(TypeError, match=r"^metadata: expected a JSON-serialisable dict, got one that is not \(Out of "
                                        r"range float values are not JSON compliant"):
        ckpt.save(tmp_path, 1, {"w": jnp.zeros(1)}, {"best_loss": value})
    assert ckpt.steps(tmp_path) == []


@pytest.mark.parametrize("metadata, where, key, written", [
    ({1: "a", "1": "b"}, "metadata", "1", '"1"'),  # the same key twice in the file: one value lost
    ({"vocab": {"C": 0, 7: 1}}, "metadata['vocab']", "7", '"7"'),
    ({"layers": [{"sizes": {True: 4}}]}, "metadata['layers'][0]['sizes']", "True", '"true"'),
])
def test_metadata_with_keys_json_turns_into_strings_is_refused(tmp_path, metadata, where, key, written):
    """json.dumps writes an int key 1 as "1" without a word, so what restore gives back differs from what was
    saved (and {1: .., "1": ..} loses a value). save now names the key and writes nothing."""
    with pytest.raises(TypeError, match=rf"^{re.escape(where)}: expected string keys \(JSON writes {key} as "
                                        rf"{re.escape(written)}\), got {key}$"):
        ckpt.save(tmp_path, 1, {"w": jnp.zeros(1)}, metadata)
    assert ckpt.steps(tmp_path) == []


def test_metadata_given_as_a_read_only_mapping_is_saved_as_its_dict(tmp_path):
    # save takes any Mapping (a MappingProxyType, a frozen config's view): it is written as the dict it holds
    meta = types.MappingProxyType({"run": "a", "seed": 3})
    ckpt.save(tmp_path, 1, {"w": jnp.zeros(1)}, meta)
    assert ckpt.read_metadata(tmp_path, 1) == {"run": "a", "seed": 3}

MULTIHOST_SCRIPT = """
import json, os, sys
process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=process)
import numpy as np, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax_scan_rnn import checkpoint as ckpt

mesh = Mesh(np.array(jax.devices()), ("data",))  # 2 processes x 2 devices
rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
full = np.arange(24, dtype=np.float32).reshape(8, 3)
x = jax.make_array_from_callback(full.shape, rows, lambda index: full[index])  # each process: its rows
key = jax.jit(lambda: jax.random.key(3), out_shardings=replicated)()
for step in (1, 2, 3):
    ckpt.save(out, step, {"x": x * step, "key": key}, {"step": step}, keep=2)  # every process saves
r = ckpt.restore(out, target={"x": x, "key": key})
result = {"steps": ckpt.steps(out), "step": r.step, "metadata": r.metadata, "stray": list(r.stray_files),
          "rows": {str(s.index[0].start): np.asarray(s.data).tolist() for s in r.state["x"].addressable_shards},
          "key": np.asarray(jax.random.key_data(r.state["key"]).addressable_shards[0].data).tolist()}
result["aside"] = str(ckpt.set_aside(out, 3))  # every process calls it; one rename
result["after"] = ckpt.steps(out)
json.dump(result, open(os.path.join(out, f"process_{process}.json"), "w"))
"""


def test_two_processes_save_their_shards_into_one_verified_checkpoint_and_set_it_aside_once(tmp_path):
    import socket

    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    out = tmp_path / "ck"
    procs = [subprocess.Popen([sys.executable, "-c", MULTIHOST_SCRIPT, str(i), port, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    results = [json.loads((out / f"process_{i}.json").read_text()) for i in (0, 1)]
    assert [(r["aside"], r["after"]) for r in results] == [(str(out / "step_00000003.invalid-1"), [2])] * 2
    full = np.arange(24, dtype=np.float32).reshape(8, 3) * 3
    rows = {}
    for r in results:
        assert r["steps"] == [2, 3] and r["step"] == 3 and r["metadata"] == {"step": 3} and r["stray"] == []
        assert r["key"] == np.asarray(jax.random.key_data(jax.random.key(3))).tolist()
        rows.update({int(start): np.array(data) for start, data in r["rows"].items()})
    assert sorted(rows) == [0, 2, 4, 6]  # each process restored its own devices' rows, exactly
    for start, data in rows.items():
        np.testing.assert_array_equal(data, full[start:start + 2])
    # One manifest (process 0's) covers both processes' shards, and verifies.
    os.rename(out / "step_00000003.invalid-1", ckpt.step_path(out, 3))
    manifest = json.loads((ckpt.step_path(out, 3) / "MANIFEST.json").read_text())
    arrays_dirs = {f.split("/")[1] for f in manifest["files"] if f.startswith("arrays/")}
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= arrays_dirs
    assert ckpt.verify(out, 3) == ()


def test_set_aside_numbers_past_the_highest_never_onto_a_kept_one(tmp_path):
    # Two set aside, the first deleted by hand: the next is number 3 (a count would pick 2, the one still there).
    import shutil

    state = {"w": jnp.ones(2)}
    ckpt.save(tmp_path, 1, state)
    first = ckpt.set_aside(tmp_path, 1)
    ckpt.save(tmp_path, 1, state)
    second = ckpt.set_aside(tmp_path, 1)
    shutil.rmtree(first)
    ckpt.save(tmp_path, 1, state)
    third = ckpt.set_aside(tmp_path, 1)
    assert (second.name, third.name) == ("step_00000001.invalid-2", "step_00000001.invalid-3")
    assert second.is_dir() and third.is_dir()


def test_a_step_directory_copied_under_another_step_is_refused(tmp_path):
    # Its files are all intact, but its manifest names the step it was written as: restoring it as step 20 would
    # resume a run at the wrong update.
    import shutil

    saved = ckpt.save(tmp_path, 10, {"w": jnp.ones(2)})
    shutil.copytree(saved, ckpt.step_path(tmp_path, 20))
    with pytest.raises(CheckpointError, match="says step 10, directory says 20"):
        ckpt.verify(tmp_path, 20)


def test_an_altered_orbax_metadata_file_is_refused_by_its_digest(tmp_path):
    """Every file the manifest lists is checked by sha256, orbax's own _CHECKPOINT_METADATA too: a same-size change
    of one digit is refused."""
    ckpt.save(tmp_path, 1, {"w": np.zeros(4, np.float32)})
    meta = ckpt.step_path(tmp_path, 1) / "_CHECKPOINT_METADATA"
    data = bytearray(meta.read_bytes())
    i = data.index(b"1")
    data[i:i + 1] = b"2"
    meta.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"_CHECKPOINT_METADATA is corrupted"):
        ckpt.verify(tmp_path, 1)


def test_the_free_space_needed_is_the_newest_checkpoints_size(tmp_path, monkeypatch):
    """A save needs about the newest checkpoint's size free, not an older, larger one's (an incompressible step 1
    of ~400 kB, then zeros that compress to a few kB: step 3 fits in twice step 2's size)."""
    import shutil

    rng = np.random.default_rng(0)
    ckpt.save(tmp_path, 1, {"w": rng.standard_normal(100_000).astype(np.float32)})
    ckpt.save(tmp_path, 2, {"w": np.zeros(100_000, np.float32)})

    def size(step):
        return sum(f.stat().st_size for f in ckpt.step_path(tmp_path, step).rglob("*") if f.is_file())

    assert size(2) * 4 < size(1)
    disk = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda path: disk._replace(free=2 * size(2)))
    ckpt.save(tmp_path, 3, {"w": np.zeros(100_000, np.float32)})


def test_the_fallback_is_the_newest_valid_step_not_any_older_one(tmp_path):
    """Steps 2, 3, 4 with 4's save crashed (no manifest): the newest valid is 3, not 2."""
    for s in (2, 3, 4):
        ckpt.save(tmp_path, s, {"w": np.full(4, float(s), np.float32)})
    (ckpt.step_path(tmp_path, 4) / ckpt.MANIFEST).unlink()
    step, skipped = ckpt.newest_valid_step(tmp_path)
    restored = ckpt.restore(tmp_path, fallback=True)
    assert step == restored.step == 3 and [s for s, _ in skipped] == [4] and float(restored.state["w"][0]) == 3.0


def test_a_64_bit_leaf_restored_without_x64_says_what_builds_it(tmp_path):
    # float64 parameters built without x64 are float32 (JAX only warns), so the mismatch alone misleads.
    with jax.enable_x64(True):
        ckpt.save(tmp_path, 1, {"w": jnp.zeros((2, 3), jnp.float64)})
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match=r"dtype float64 .*got shape \(2, 3\) dtype float32; 64-bit leaves need "
                                             r"jax\.config\.update\('jax_enable_x64', True\)"):
            ckpt.restore(tmp_path, target={"w": jnp.zeros((2, 3), jnp.float32)})
    with jax.enable_x64(True):  # under x64 the same mismatch is the model's own, and no hint is given
        with pytest.raises(ValueError, match=r"dtype float32$"):
            ckpt.restore(tmp_path, target={"w": jnp.zeros((2, 3), jnp.float32)})


def test_the_manifest_holds_each_files_sha256_and_the_newest_step_is_the_default(tmp_path):
    # A checkpoint written before (or by another tool) is verified against these digests: SHA-256 of the bytes.
    for s in (2, 10, 3):  # saved out of order: the newest is the largest step, not the last saved
        ckpt.save(tmp_path, s, {"w": jnp.full(3, float(s))}, {"step": s})
    path = ckpt.step_path(tmp_path, 3)
    files = json.loads((path / "MANIFEST.json").read_text())["files"]
    assert files and all(v["sha256"] == hashlib.sha256((path / f).read_bytes()).hexdigest() for f, v in files.items())
    assert ckpt.latest_step(tmp_path) == 10 and ckpt.read_metadata(tmp_path) == {"step": 10}
    assert ckpt.read_metadata(tmp_path, 2) == {"step": 2}  # a step given is read, not the newest


def test_a_32_bit_leaf_restored_into_another_dtype_gets_no_x64_hint(tmp_path):
    ckpt.save(tmp_path, 1, {"w": jnp.zeros((2, 3), jnp.float32)})
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match=r"dtype float32 .*got shape \(2, 3\) dtype bfloat16$"):
            ckpt.restore(tmp_path, target={"w": jnp.zeros((2, 3), jnp.bfloat16)})
