"""Weight conversion: errors name the key and shapes, failed loads change nothing, safetensors files."""
from __future__ import annotations

import inspect
import os
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.torch import load_file as torch_load_file

import jax_scan_rnn as jsr
from jax_scan_rnn import validate
import torch_ref


def pair(kind="LSTM", layers=2):
    torch.manual_seed(0)
    ref = getattr(torch_ref, kind)(3, 4, layers)
    ours = getattr(jsr, kind)(3, 4, layers, rngs=nnx.Rngs(0))
    return ref, ours


def params_of(module) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in jsr.torch_state_dict(module).items()}


def assert_unchanged(module, before):
    after = jsr.torch_state_dict(module)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=f"{key} changed by a failed load")


def test_missing_key_names_it_and_changes_nothing():
    ref, ours = pair()
    before = params_of(ours)
    sd = dict(ref.state_dict())
    del sd["bias_hh_l1"]
    with pytest.raises(KeyError, match=r"missing \['bias_hh_l1'\], unexpected \[\]"):
        jsr.load_torch_state_dict(ours, sd)
    assert_unchanged(ours, before)


def test_unexpected_key_names_it():
    ref, ours = pair()
    sd = dict(ref.state_dict()) | {"weight_ih_l2": torch.zeros(16, 4)}
    with pytest.raises(KeyError, match=r"unexpected \['weight_ih_l2'\]"):
        jsr.load_torch_state_dict(ours, sd)


@pytest.mark.parametrize("theirs, ours", [
    ("LSTM(4, 8, bidirectional=True)", "LSTM(4, 8)"), ("LSTM(4, 8, num_layers=2)", "LSTM(4, 8)"),
    ("LSTM(4, 8)", "LSTM(4, 8, num_layers=2)"), ("LSTM(4, 8, proj_size=3)", "LSTM(4, 8)"),
    ("LSTM(4, 16)", "LSTM(4, 8)"), ("GRU(4, 8)", "LSTM(4, 8)"), ("LSTM(4, 8, bias=False)", "LSTM(4, 8)"),
    ("GRU(3, 8, num_layers=2, bias=False, bidirectional=True)", "GRU(3, 8, num_layers=2, bidirectional=True)"),
])
def test_a_torch_rnn_built_otherwise_is_named_with_both_constructors(theirs, ours):
    """A porter sees which argument differs, not only keys and shapes to decode."""
    model = eval(f"jsr.{ours[:-1]}, rngs=nnx.Rngs(0))")  # noqa: S307 (the test's own literals)
    sd = eval(f"torch.nn.{theirs}").state_dict()  # noqa: S307
    hint = f"; the state_dict comes from torch.nn.{theirs}, this model is jsr.{ours}: build it with the same arguments"
    with pytest.raises((KeyError, ValueError), match=re.escape(hint)):
        jsr.load_torch_state_dict(model, sd)


def test_a_submodules_torch_rnn_built_otherwise_is_named_too():
    """The same reading for an LSTM inside a model (the Traveller's lstm_layers)."""
    model = jsr.Traveller(num_inputs=4, hidden_size=8, num_layers=2, rngs=nnx.Rngs(0))
    sd = torch_ref.Traveller(4, 16, 2, 0.0).state_dict()
    with pytest.raises(ValueError, match=re.escape("; its 'lstm_layers' is a torch.nn.LSTM(6, 16, num_layers=2), this "
                                                   "model's a LSTM(6, 8, num_layers=2)")):
        jsr.load_torch_state_dict(model, sd)


def test_a_prefixed_state_dict_names_the_prefix_and_how_to_strip_it():
    """A DataParallel checkpoint (`module.` keys), a larger model's (`rnn.` keys beside others), a submodule's keys
    given for the whole, a training checkpoint holding the state_dict: the error says which, and the way it names
    for the first two loads."""
    ref, ours = pair()
    sd = ref.state_dict()
    for prefix, extra in (("module.", {}), ("rnn.", {"head.weight": torch.zeros(2, 16)})):
        wrapped = {prefix + k: v for k, v in sd.items()} | extra
        with pytest.raises(KeyError, match=f"every expected key is there with the prefix '{prefix}'"):
            jsr.load_torch_state_dict(ours, wrapped)
        jsr.load_torch_state_dict(ours, {k.removeprefix(prefix): v for k, v in wrapped.items() if k.startswith(prefix)})
        assert_unchanged(ours, {k: v.numpy() for k, v in sd.items()})

    class Net(nnx.Module):
        def __init__(self):
            self.rnn = ours

    with pytest.raises(KeyError, match="given are the keys of its submodule 'rnn' alone"):
        jsr.load_torch_state_dict(Net(), sd)
    checkpoint = {"epoch": 3, "model_state_dict": sd, "optimizer_state_dict": {"state": {}}}  # torch's tutorial's
    with pytest.raises(KeyError, match=r"state_dict\['model_state_dict'\] holds every expected key"):
        jsr.load_torch_state_dict(ours, checkpoint)
    with pytest.raises(KeyError, match=r"unexpected \[\]\W*$"):  # no prefix explains a missing key: no hint
        jsr.load_torch_state_dict(ours, {k: v for k, v in sd.items() if k != "bias_hh_l1"})


def test_a_torch_module_in_place_of_the_jax_one_is_named_not_an_empty_state_dict():
    ref, ours = pair()
    message = r"module: expected a flax.nnx Module \(a jax_scan_rnn model\), got the torch module LSTM; a torch module"
    with pytest.raises(TypeError, match=message):
        jsr.torch_state_dict(ref)  # was {}
    with pytest.raises(TypeError, match=message):
        jsr.load_torch_state_dict(ref, jsr.torch_state_dict(ours))  # the arguments swapped
    with pytest.raises(TypeError, match=r"module: expected a flax.nnx Module \(a jax_scan_rnn model\), got dict$"):
        jsr.torch_state_dict({})


def test_wrong_shape_names_key_and_shapes_and_changes_nothing():
    ref, ours = pair()
    before = params_of(ours)
    sd = dict(ref.state_dict())
    sd["weight_hh_l1"] = torch.zeros(16, 5)  # the last key: earlier ones were valid and must not be written
    with pytest.raises(ValueError, match=r"state_dict\['weight_hh_l1'\]: expected shape \(16, 4\), got \(16, 5\)"):
        jsr.load_torch_state_dict(ours, sd)
    assert_unchanged(ours, before)
    # The right number of values in another shape (a weight transposed by hand) is refused too, never reshaped.
    sd = dict(ref.state_dict())
    sd["weight_ih_l0"] = sd["weight_ih_l0"].T
    with pytest.raises(ValueError, match=r"state_dict\['weight_ih_l0'\]: expected shape \(16, 3\), got \(3, 16\)"):
        jsr.load_torch_state_dict(ours, sd)
    assert_unchanged(ours, before)


def test_integer_values_are_a_type_error():
    ref, ours = pair("GRU", 1)
    sd = dict(ref.state_dict()) | {"bias_ih_l0": torch.zeros(12, dtype=torch.int64)}
    with pytest.raises(TypeError, match=r"state_dict\['bias_ih_l0'\]: expected a floating dtype, got int64"):
        jsr.load_torch_state_dict(ours, sd)


def test_numpy_state_dict_loads_like_torch_tensors():
    ref, ours = pair("GRU", 2)
    jsr.load_torch_state_dict(ours, {k: v.numpy() for k, v in ref.state_dict().items()})
    for key, value in jsr.torch_state_dict(ours).items():
        np.testing.assert_array_equal(value, ref.state_dict()[key].numpy())


def test_float64_values_are_cast_to_the_module_dtype():
    ref, ours = pair("LSTM", 1)
    with pytest.warns(UserWarning, match="float64 to float32"):
        jsr.load_torch_state_dict(ours, {k: v.double() for k, v in ref.state_dict().items()})
    assert all(v.dtype == np.float32 for v in jsr.torch_state_dict(ours).values())


def user_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, UserWarning)]


def test_a_dtype_change_warns_once_naming_keys_and_dtypes():
    ref, ours = pair("LSTM", 2)  # 8 keys: 3 are named, the rest counted
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        jsr.load_torch_state_dict(ours, {k: v.double() for k, v in ref.state_dict().items()})
    assert user_warnings(record) == [
        "state_dict: values cast to the module's parameter dtype: 8 from float64 to float32 "
        "('weight_ih_l0', 'weight_hh_l0', 'bias_ih_l0' and 5 more)"
    ]


def test_one_warning_names_each_dtype_change():
    ref, ours = pair("GRU", 1)
    sd = dict(ref.state_dict()) | {"bias_ih_l0": ref.bias_ih_l0.detach().double(),
                                   "bias_hh_l0": ref.bias_hh_l0.detach().half()}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        jsr.load_torch_state_dict(ours, sd)
    assert user_warnings(record) == [
        "state_dict: values cast to the module's parameter dtype: "
        "1 from float64 to float32 ('bias_ih_l0'); 1 from float16 to float32 ('bias_hh_l0')"
    ]


def test_same_dtype_loads_without_a_warning():
    ref, ours = pair("LSTM", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jsr.load_torch_state_dict(ours, ref.state_dict())
        jsr.load_torch_state_dict(ours, {k: v.numpy() for k, v in ref.state_dict().items()})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_torch_checkpoint_loads_into_float32(dtype):
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 4, 2).to(dtype)
    ours = jsr.LSTM(3, 4, 2, rngs=nnx.Rngs(0))
    name = str(dtype).removeprefix("torch.")
    with pytest.warns(UserWarning, match=f"8 from {name} to float32"):
        jsr.load_torch_state_dict(ours, ref.state_dict())
    for key, value in jsr.torch_state_dict(ours).items():
        assert value.dtype == np.float32
        # Every half-precision value is exact in float32: nothing may be rounded on the way.
        np.testing.assert_array_equal(value, ref.state_dict()[key].float().numpy(), err_msg=key)


def test_a_bfloat16_models_state_dict_loads_into_its_torch_twin_as_the_docstring_says():
    # torch_state_dict's documented route, `torch.from_numpy(v)`, refuses ml_dtypes' bfloat16: the docstring now
    # gives the bit view that works; weights and dtype come back unchanged through torch.
    ours = jsr.Traveller(3, 4, 2, 0.0, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    sd = jsr.torch_state_dict(ours)
    with pytest.raises(TypeError, match="ml_dtypes.bfloat16"):
        torch.from_numpy(sd["output_layer.weight"])
    twin = torch_ref.Traveller(3, 4, 2, 0.0).to(torch.bfloat16)
    twin.load_state_dict({k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) for k, v in sd.items()})
    back = jsr.Traveller(3, 4, 2, 0.0, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(1))
    jsr.load_torch_state_dict(back, twin.state_dict())
    for key, value in jsr.torch_state_dict(back).items():
        assert value.dtype == jnp.bfloat16 and np.array_equal(value.view(np.int16), sd[key].view(np.int16)), key


def test_bfloat16_survives_a_safetensors_round_trip(tmp_path):
    torch.manual_seed(0)
    sd = torch.nn.GRU(3, 4).to(torch.bfloat16).state_dict()
    path = tmp_path / "bf16.safetensors"
    jsr.save_safetensors(sd, path)
    loaded = torch_load_file(str(path))
    for key, value in sd.items():
        assert loaded[key].dtype == torch.bfloat16 and torch.equal(loaded[key], value), key
    assert {str(v.dtype) for v in jsr.load_safetensors(path).values()} == {"bfloat16"}


@pytest.mark.parametrize("bad", [None, [("weight_ih_l0", np.zeros((16, 3)))], "weights.pt"])
def test_a_non_mapping_state_dict_is_a_type_error(bad, tmp_path):
    _, ours = pair("LSTM", 1)
    got = type(bad).__name__
    # A path names what to read it with.
    why = r" 'weights.pt' \(a file's path: pass its contents, jsr.load_safetensors\(path\) or torch.load" \
          r"\(path, weights_only=True\)\)" if isinstance(bad, str) else ""
    expected = rf"state_dict: expected a mapping of torch key -> tensor/array, got {got}{why}$"
    with pytest.raises(TypeError, match=expected):
        jsr.load_torch_state_dict(ours, bad)
    with pytest.raises(TypeError, match=rf"state_dict: expected a mapping .*, got {got}$"):
        jsr.save_safetensors(bad, tmp_path / "unused.safetensors")
    assert not list(tmp_path.iterdir())


def test_a_torch_module_instead_of_its_state_dict_says_so():
    ref, ours = pair("LSTM", 1)
    with pytest.raises(TypeError, match=r"got LSTM \(pass its \.state_dict\(\)\)"):
        jsr.load_torch_state_dict(ours, ref)


@pytest.mark.parametrize("bad, found", [(float("nan"), "1 NaN and 0 inf"), (float("inf"), "0 NaN and 1 inf"),
                                        (-float("inf"), "0 NaN and 1 inf")])
def test_non_finite_weights_are_refused_and_change_nothing(bad, found):
    ref, ours = pair("LSTM", 2)
    before = params_of(ours)
    sd = dict(ref.state_dict())
    sd["weight_hh_l1"] = sd["weight_hh_l1"].clone()
    sd["weight_hh_l1"][3, 2] = bad  # the last key: earlier ones were valid and must not be written
    expected = rf"state_dict\['weight_hh_l1'\]: expected finite values, got {found} among 64$"
    with pytest.raises(ValueError, match=expected):
        jsr.load_torch_state_dict(ours, sd)
    assert_unchanged(ours, before)


def test_a_float64_that_overflows_float32_is_refused():
    ref, ours = pair("GRU", 1)
    before = params_of(ours)
    sd = {k: v.double() for k, v in ref.state_dict().items()}
    sd["bias_hh_l0"][[0, 5]] = torch.tensor([1e300, -1e40], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither numpy's overflow warning nor the dtype warning: the error says it
        with pytest.raises(ValueError, match=(
            r"state_dict\['bias_hh_l0'\]: expected values that fit the module's float32, "
            r"got 2 float64 values that overflow to inf \(largest magnitude 1e\+300\)"
        )):
            jsr.load_torch_state_dict(ours, sd)
    assert_unchanged(ours, before)


def test_a_missing_safetensors_file_names_the_path(tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(FileNotFoundError, match=re.escape(f"load_safetensors: no file at '{path}'")):
        jsr.load_safetensors(path)
    with pytest.raises(IsADirectoryError, match=re.escape(
        f"load_safetensors: expected a .safetensors file, got the directory '{tmp_path}'"
    )):
        jsr.load_safetensors(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "empty", "junk"])
def test_a_damaged_safetensors_file_is_a_value_error_naming_the_path(tmp_path, damage):
    path = tmp_path / "lstm.safetensors"
    jsr.save_safetensors(jsr.torch_state_dict(pair("LSTM", 1)[1]), path)
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) - 7], "empty": b"", "junk": b"not a safetensors file"}[damage])
    with pytest.raises(ValueError, match=re.escape(
        f"load_safetensors: '{path}' is not a whole .safetensors file (truncated or corrupt): "
    )):
        jsr.load_safetensors(path)


def test_a_safetensors_file_whose_header_length_starts_with_the_pickle_mark_is_read_as_safetensors(tmp_path):
    # A safetensors file starts with its header's length, little-endian: 1152 bytes (this Traveller's keys and shapes)
    # is 0x80 0x04 ..., the byte a pickle starts with. Such a file (one in 32: lengths are multiples of 8) was read as
    # torch's, and --init-from refused the command's own export as "not a readable torch state_dict".
    from jax_scan_rnn.convert import read_state_dict_file

    state_dict = jsr.torch_state_dict(jsr.Traveller(100, 8, 3, rngs=nnx.Rngs(0)))
    path = tmp_path / "trav.safetensors"
    jsr.save_safetensors(state_dict, path)
    assert path.read_bytes()[:1] == b"\x80"  # what the test is about
    read = read_state_dict_file(path, "init_from")
    assert read.keys() == state_dict.keys()
    for key, value in state_dict.items():
        np.testing.assert_array_equal(read[key], value, err_msg=key)


def test_a_torch_file_given_to_load_safetensors_is_named_as_such(tmp_path):
    # A whole file torch.save wrote is neither truncated nor corrupt: the error says what it is and what reads it.
    path = tmp_path / "lstm.pt"
    torch.save(torch.nn.LSTM(2, 3).state_dict(), path)
    with pytest.raises(ValueError) as err:
        jsr.load_safetensors(path)
    assert str(err.value) == (f"load_safetensors: '{path}' is a torch.save file (zip or pickle), not a .safetensors "
                              "file: read it with torch.load(path, weights_only=True)")


def test_a_saved_file_has_the_permissions_of_a_plain_file(tmp_path):
    """safetensors' own save_file leaves 0600 (its temporary file's mode): a weights file hidden from its group."""
    jsr.save_safetensors(jsr.torch_state_dict(pair("GRU", 1)[1]), tmp_path / "gru.safetensors")
    (tmp_path / "plain").write_text("")
    assert (tmp_path / "gru.safetensors").stat().st_mode == (tmp_path / "plain").stat().st_mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gru.safetensors", "plain"]


def test_saving_where_no_file_can_be_written_names_the_path(tmp_path):
    sd = jsr.torch_state_dict(pair("GRU", 1)[1])
    for path in [tmp_path, tmp_path / "no_such_folder" / "gru.safetensors"]:
        with pytest.raises(OSError, match=re.escape(f": '{path}'")) as error:  # not the temporary file beside it
            jsr.save_safetensors(sd, path)
        assert error.value.filename == str(path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write to a read-only folder")
def test_saving_into_a_read_only_folder_names_the_path(tmp_path):
    folder = tmp_path / "read_only"
    folder.mkdir(mode=0o500)
    path = folder / "gru.safetensors"
    with pytest.raises(PermissionError, match=re.escape(f": '{path}'")) as error:
        jsr.save_safetensors(jsr.torch_state_dict(pair("GRU", 1)[1]), path)
    assert error.value.filename == str(path)


def test_safetensors_file_is_readable_by_torch(tmp_path):
    ref, ours = pair("LSTM", 2)
    jsr.load_torch_state_dict(ours, ref.state_dict())
    path = tmp_path / "lstm.safetensors"
    jsr.save_safetensors(jsr.torch_state_dict(ours), path)
    loaded = torch_load_file(str(path))
    ref.load_state_dict(loaded, strict=True)
    for key, value in loaded.items():
        assert torch.equal(value, ref.state_dict()[key])
    back = jsr.load_safetensors(path)
    fresh = jsr.LSTM(3, 4, 2, rngs=nnx.Rngs(9))
    jsr.load_torch_state_dict(fresh, back)
    for key, value in jsr.torch_state_dict(fresh).items():
        np.testing.assert_array_equal(value, loaded[key].numpy())


def test_unknown_parameter_has_no_silent_mapping():
    class Odd(nnx.Module):
        def __init__(self):
            self.scale = nnx.Param(np.ones(3, np.float32))

    with pytest.raises(NotImplementedError, match="no PyTorch mapping for parameter scale of Odd"):
        jsr.torch_state_dict(Odd())


def test_state_of_a_variable_class_of_its_own_is_named_both_ways_never_left_out():
    class Scale(nnx.Param):  # a weight: mapped where a Param is, and named where none is
        pass

    class Running(nnx.Variable):  # state a torch twin would keep as a buffer
        pass

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.head = nnx.Linear(2, 3, rngs=rngs)
            self.dropout = nnx.Dropout(0.1, rngs=rngs)  # random streams and a cache are not weights: no key
            self.cache = nnx.Cache(np.zeros(3, np.float32))

    net = Net(nnx.Rngs(0))
    net.head.kernel = Scale(net.head.kernel[...])
    state_dict = jsr.torch_state_dict(net)
    assert sorted(state_dict) == ["head.bias", "head.weight"]
    jsr.load_torch_state_dict(net, state_dict)
    net.total = Running(np.ones(3, np.float32))
    message = (r"^convert: no PyTorch mapping for state total of Net \(a Running, an nnx.Variable that is neither an "
               r"nnx.Param nor an nnx.BatchStat\)$")
    with pytest.raises(NotImplementedError, match=message):
        jsr.torch_state_dict(net)  # was the state_dict without it, without a word
    with pytest.raises(NotImplementedError, match=message):
        jsr.load_torch_state_dict(net, state_dict)  # was a load that left it as it was
    del net.total
    net.gain = Scale(np.ones(3, np.float32))
    with pytest.raises(NotImplementedError, match=r"^convert: no PyTorch mapping for parameter gain of Net \(a Scale\)$"):
        jsr.torch_state_dict(net)



def test_sown_values_are_no_weights_and_an_unmapped_batch_stat_is_a_parameter():
    # A value a call sows (an nnx.Intermediate attribute, as `Module.sow` stores it) has no torch key and is not
    # refused; a plain nnx.BatchStat no row maps is named as a parameter (a weight torch would hold), not as state.
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.head = nnx.Linear(2, 3, rngs=rngs)

    net = Net(nnx.Rngs(0))
    net.hidden = nnx.Intermediate((np.ones((1, 3), np.float32),))
    assert sorted(jsr.torch_state_dict(net)) == ["head.bias", "head.weight"]
    net.count = nnx.BatchStat(np.zeros(3, np.float32))
    with pytest.raises(NotImplementedError, match=r"^convert: no PyTorch mapping for parameter count of Net$"):
        jsr.torch_state_dict(net)

def test_nested_modules_use_attribute_names_as_prefixes():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.encoder = jsr.GRU(3, 4, 2, rngs=rngs)
            self.heads = nnx.List([nnx.Linear(4, 2, rngs=rngs), nnx.Linear(4, 1, use_bias=False, rngs=rngs)])

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch_ref.GRU(3, 4, 2)
            self.heads = torch.nn.ModuleList([torch.nn.Linear(4, 2), torch.nn.Linear(4, 1, bias=False)])

    ours, ref = Net(nnx.Rngs(0)), TorchNet()
    jsr.load_torch_state_dict(ours, ref.state_dict())
    assert list(jsr.torch_state_dict(ours)) == list(ref.state_dict())


def test_loaded_weights_do_not_alias_torch_memory():
    ref, ours = pair("LSTM", 1)
    jsr.load_torch_state_dict(ours, ref.state_dict())
    before = params_of(ours)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(1.0)  # an in-place optimiser step on the torch side
    assert_unchanged(ours, before)


def test_exported_arrays_do_not_alias_jax_memory():
    _, ours = pair("GRU", 1)
    before = params_of(ours)
    for value in jsr.torch_state_dict(ours).values():
        torch.from_numpy(value).add_(1.0)
    assert_unchanged(ours, before)


def test_layer_norm_maps_to_torchs_and_gives_its_numbers():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lstm = jsr.LSTM(3, 8, batch_first=True, rngs=rngs)
            self.norm = nnx.LayerNorm(8, epsilon=1e-5, rngs=rngs)
            self.plain = nnx.LayerNorm(8, epsilon=1e-5, use_scale=False, use_bias=False, rngs=rngs)
            self.head = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, x):
            out, _ = self.lstm(x)
            return self.head(self.plain(self.norm(out)))

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(3, 8, batch_first=True)
            self.norm = torch.nn.LayerNorm(8)
            self.plain = torch.nn.LayerNorm(8, elementwise_affine=False)
            self.head = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.plain(self.norm(self.lstm(x)[0])))

    torch.manual_seed(0)
    ref = TorchNet()
    with torch.no_grad():  # not torch's initial ones and zeros, which would hide a swapped or unloaded pair
        ref.norm.weight.normal_(), ref.norm.bias.normal_()
    ours = Net(nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # epsilon=1e-5 is torch's: no warning
        jsr.load_torch_state_dict(ours, ref.state_dict())
        assert list(jsr.torch_state_dict(ours)) == list(ref.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32) * 1e-2  # small variances: eps matters
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(ours(x)), expected, atol=1e-5)  # float32 rounding of two frameworks


@pytest.mark.parametrize("kind,torch_eps,keys", [
    ("LayerNorm", "1e-05", ["norm.bias", "norm.weight"]),
    ("GroupNorm", "1e-05", ["norm.bias", "norm.weight"]),
    ("RMSNorm", "1.19209e-07", ["norm.weight"]),  # torch's eps=None: float32's machine epsilon
])
def test_a_norm_with_flaxs_default_epsilon_warns_naming_it(kind, torch_eps, keys):
    class Net(nnx.Module):
        def __init__(self, rngs):
            groups = {"num_groups": 2} if kind == "GroupNorm" else {}
            self.norm = getattr(nnx, kind)(4, **groups, rngs=rngs)  # Flax's default epsilon, 1e-6

    with pytest.warns(UserWarning, match=rf"nnx.{kind} 'norm' has epsilon 1e-06, torch.nn.{kind}'s default eps "
                                         rf"is {torch_eps}:"):
        state_dict = jsr.torch_state_dict(Net(nnx.Rngs(0)))
    assert sorted(state_dict) == keys


def test_a_convolution_with_flaxs_default_padding_warns_naming_it():
    """nnx.Conv's default padding "SAME" is not torch's 0 and not in the state_dict: a kernel-3 Conv1d over 10 steps
    gives 10 outputs in Flax and 8 in torch, so a load or an export says it; an explicit padding says nothing."""
    conv = torch.nn.Conv1d(5, 6, 3)
    with pytest.warns(UserWarning, match=r"^convert: nnx.Conv 'module' has padding 'SAME' \(Flax's default\), "
                                         r"torch.nn.Conv1d's default is 0 \('VALID'\): the two give other outputs "
                                         r"unless the torch model was built with padding='same'$"):
        jsr.load_torch_state_dict(nnx.Conv(5, 6, 3, rngs=nnx.Rngs(0)), conv.state_dict())
    with pytest.warns(UserWarning, match=r"nnx.ConvTranspose 'module' has padding 'SAME' .* torch.nn.ConvTranspose2d"
                                         r"'s default is 0 .*torch has no 'same' for it"):
        jsr.torch_state_dict(nnx.ConvTranspose(2, 3, (2, 2), rngs=nnx.Rngs(0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for padding in ("VALID", ((1, 1),), 0):
            jsr.load_torch_state_dict(nnx.Conv(5, 6, 3, padding=padding, rngs=nnx.Rngs(0)), conv.state_dict())


def test_a_batch_norms_running_statistics_map_to_torchs_and_give_its_numbers():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.BatchNorm(3, momentum=1 - 0.1, rngs=rngs)  # torch's default momentum, 0.1
            self.lstm = jsr.LSTM(3, 8, batch_first=True, rngs=rngs)

        def __call__(self, x):  # [B, T, F]
            return self.lstm(self.norm(x))[0]

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(3)
            self.lstm = torch.nn.LSTM(3, 8, batch_first=True)

        def forward(self, x):  # BatchNorm1d normalises [B, C, L]
            return self.lstm(self.norm(x.transpose(1, 2)).transpose(1, 2))[0]

    torch.manual_seed(0)
    ref = TorchNet()
    with torch.no_grad():
        ref.norm.weight.normal_(), ref.norm.bias.normal_()
        for _ in range(3):  # training moves the running statistics off torch's initial zeros and ones
            ref(torch.randn(4, 5, 3) * 2 + 1)
    ref.eval()
    ours = Net(nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's epsilon and momentum: no warning
        jsr.load_torch_state_dict(ours, ref.state_dict())
        back = jsr.torch_state_dict(ours)
    ours.eval()
    assert list(back) == list(ref.state_dict())
    for key in ("norm.weight", "norm.bias", "norm.running_mean", "norm.running_var"):
        np.testing.assert_array_equal(back[key], ref.state_dict()[key].numpy(), err_msg=key)
    assert back["norm.num_batches_tracked"].dtype == np.int64  # nnx.BatchNorm has no counter: 0
    TorchNet().load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(ours(x)), expected, atol=1e-5)  # float32 rounding of two frameworks

    with pytest.raises(TypeError, match=r"state_dict\['norm.num_batches_tracked'\]: expected an integer count"):
        jsr.load_torch_state_dict(ours, {**ref.state_dict(), "norm.num_batches_tracked": torch.tensor([1.5])})
    ours.norm.momentum = 0.99  # Flax's default
    with pytest.warns(UserWarning, match=r"nnx.BatchNorm 'norm' has momentum 0.99, which is torch's momentum=0.01; "
                                         r"torch.nn.BatchNorm1d's default is 0.1"):
        jsr.torch_state_dict(ours)


@pytest.mark.skipif(not jax.config.jax_enable_x64, reason="float64 parameters need jax_enable_x64 (conftest sets it)")
def test_a_float64_batch_norm_round_trip_is_exact_but_for_what_nnx_cannot_hold_and_says_so():
    """torch -> jax -> torch of a float64 BatchNorm1d (x64 on, as conftest sets it): its weights come back bit for
    bit; its running statistics are float32 in nnx.BatchNorm whatever its param_dtype, and its counter is not held,
    as the module docstring says; the load's warning names the statistics and why."""
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm1d(3, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.normal_(), ref.bias.normal_()
        for _ in range(3):
            ref(torch.randn(8, 3, dtype=torch.float64))
    ours = nnx.BatchNorm(3, momentum=0.9, epsilon=1e-5, param_dtype=np.float64, rngs=nnx.Rngs(0))
    with pytest.warns(UserWarning, match=r"^state_dict: values cast to the module's parameter dtype: 2 from float64 "
                                         r"to float32 \('running_mean', 'running_var'\); nnx.BatchNorm holds its "
                                         r"running statistics in float32 whatever its param_dtype$"):
        jsr.load_torch_state_dict(ours, ref.state_dict())
    back = jsr.torch_state_dict(ours)
    for key in ("weight", "bias"):
        assert back[key].dtype == np.float64 and np.array_equal(back[key], ref.state_dict()[key].numpy()), key
    for key in ("running_mean", "running_var"):
        np.testing.assert_array_equal(back[key], ref.state_dict()[key].numpy().astype(np.float32), err_msg=key)
    assert int(ref.num_batches_tracked) == 3 and back["num_batches_tracked"] == 0  # nnx.BatchNorm has no counter


def test_convolutions_group_and_rms_norms_map_to_torchs_and_give_its_numbers():
    """A convolutional front end before a GRU: torch's channels-first Conv1d kernel [O, I/groups, K] is nnx.Conv's
    [K, I/groups, O] permuted, for any number of spatial dimensions, groups included."""
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 8, 3, padding="VALID", rngs=rngs)  # torch's default padding, 0
            self.grouped = nnx.Conv(8, 8, 2, padding=((1, 1),), feature_group_count=4, use_bias=False, rngs=rngs)
            self.norm = nnx.GroupNorm(8, num_groups=2, epsilon=1e-5, rngs=rngs)
            self.gru = jsr.GRU(8, 16, batch_first=True, rngs=rngs)
            self.rms = nnx.RMSNorm(16, epsilon=float(np.finfo(np.float32).eps), rngs=rngs)
            self.image = nnx.Conv(1, 2, (2, 3), padding="VALID", rngs=rngs)

        def __call__(self, x):  # [B, L, C]
            return self.rms(self.gru(self.norm(self.grouped(self.conv(x))))[0])

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(3, 8, 3)
            self.grouped = torch.nn.Conv1d(8, 8, 2, padding=1, groups=4, bias=False)
            self.norm = torch.nn.GroupNorm(2, 8)
            self.gru = torch.nn.GRU(8, 16, batch_first=True)
            self.rms = torch.nn.RMSNorm(16)
            self.image = torch.nn.Conv2d(1, 2, (2, 3))

        def forward(self, x):  # [B, C, L]
            return self.rms(self.gru(self.norm(self.grouped(self.conv(x))).transpose(1, 2))[0])

    torch.manual_seed(0)
    ref = TorchNet()
    with torch.no_grad():  # not torch's initial ones and zeros, which would hide a swapped or unloaded pair
        for p in (*ref.norm.parameters(), *ref.rms.parameters()):
            p.normal_()
    ours = Net(nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every epsilon is torch's: no warning
        jsr.load_torch_state_dict(ours, ref.state_dict())
        back = jsr.torch_state_dict(ours)
    assert list(back) == list(ref.state_dict())
    for key, value in ref.state_dict().items():
        np.testing.assert_array_equal(back[key], value.numpy(), err_msg=key)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 10)).astype(np.float32)
    image = rng.standard_normal((2, 1, 5, 6)).astype(np.float32)
    with torch.no_grad():
        expected, expected_image = ref(torch.from_numpy(x)).numpy(), ref.image(torch.from_numpy(image)).numpy()
    # float32 rounding of two frameworks
    np.testing.assert_allclose(np.asarray(ours(x.transpose(0, 2, 1))), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours.image(image.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2),
                               expected_image, atol=1e-5)

    bad = {**ref.state_dict(), "conv.weight": torch.zeros(8, 3, 4)}
    with pytest.raises(ValueError, match=r"state_dict\['conv.weight'\]: expected shape \(8, 3, 3\), got \(8, 3, 4\)"):
        jsr.load_torch_state_dict(ours, bad)


@pytest.mark.parametrize("transpose_kernel", [True, False])
def test_transposed_convolutions_map_to_torchs_and_give_its_numbers(transpose_kernel):
    """An upsampling decoder: torch's ConvTranspose kernel [I, O, *K] is nnx.ConvTranspose's [*K, O, I] permuted with
    transpose_kernel=True; with False, Flax applies [*K, I, O] unflipped, so torch's is that reversed along every
    spatial axis. Stride, padding, output_padding and dilation as the converter's docstring translates them."""
    k, stride, padding, output_padding, dilation = 3, 2, 1, 1, 2
    pad = dilation * (k - 1) - padding  # Flax pads the stretched input; torch's padding takes from the output

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.ConvTranspose(3, 4, k, strides=stride, padding=((pad, pad + output_padding),),
                                        kernel_dilation=dilation, transpose_kernel=transpose_kernel, rngs=rngs)
            self.image = nnx.ConvTranspose(2, 3, (2, 3), strides=(1, 2), padding="VALID", use_bias=False,
                                           transpose_kernel=transpose_kernel, rngs=rngs)

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.ConvTranspose1d(3, 4, k, stride=stride, padding=padding, output_padding=output_padding,
                                               dilation=dilation)
            self.image = torch.nn.ConvTranspose2d(2, 3, (2, 3), stride=(1, 2), bias=False)

    torch.manual_seed(0)
    ref, ours = TorchNet(), Net(nnx.Rngs(0))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    back = jsr.torch_state_dict(ours)
    assert list(back) == list(ref.state_dict())
    for key, value in ref.state_dict().items():
        np.testing.assert_array_equal(back[key], value.numpy(), err_msg=key)
    assert np.asarray(ours.image.kernel[...]).shape == ((2, 3, 3, 2) if transpose_kernel else (2, 3, 2, 3))
    rng = np.random.default_rng(0)
    x, image = rng.standard_normal((2, 3, 7)).astype(np.float32), rng.standard_normal((2, 2, 4, 5)).astype(np.float32)
    with torch.no_grad():
        expected, expected_image = ref.up(torch.from_numpy(x)).numpy(), ref.image(torch.from_numpy(image)).numpy()
    got = np.asarray(ours.up(x.transpose(0, 2, 1))).transpose(0, 2, 1)
    got_image = np.asarray(ours.image(image.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
    assert got.shape == expected.shape == (2, 4, 16) and got_image.shape == expected_image.shape
    np.testing.assert_allclose(got, expected, atol=1e-5)  # float32 rounding of two frameworks
    np.testing.assert_allclose(got_image, expected_image, atol=1e-5)
    grouped = {**ref.state_dict(), "up.weight": torch.zeros(3, 2, k)}  # groups=2's [I, O/groups, K]: refused by shape
    with pytest.raises(ValueError, match=r"state_dict\['up.weight'\]: expected shape \(3, 4, 3\), got \(3, 2, 3\)"):
        jsr.load_torch_state_dict(ours, grouped)


def test_a_sequential_has_torchs_keys_and_numbers():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.rnn = jsr.GRU(3, 8, rngs=rngs)
            self.mlp = nnx.Sequential(nnx.Linear(8, 16, rngs=rngs), nnx.relu, nnx.Linear(16, 2, rngs=rngs))

        def __call__(self, x):
            return self.mlp(self.rnn(x)[0])

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(3, 8)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

        def forward(self, x):
            return self.mlp(self.rnn(x)[0])

    torch.manual_seed(0)
    ref, ours = TorchNet(), Net(nnx.Rngs(0))
    jsr.load_torch_state_dict(ours, ref.state_dict())  # Flax's own path would be mlp.layers.0.weight
    assert list(jsr.torch_state_dict(ours)) == list(ref.state_dict())
    x = np.random.default_rng(0).standard_normal((6, 2, 3)).astype(np.float32)  # [T, B, I]
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(ours(x)), expected, atol=1e-5)  # float32 rounding of two frameworks


def test_plain_containers_of_a_pytree_false_module_are_keyed_as_torchs_and_nothing_is_left_out():
    from flax import struct

    class Net(nnx.Module, pytree=False):  # such a module may hold plain lists, tuples and dicts of modules
        def __init__(self, rngs):
            self.heads = {"a": nnx.Linear(8, 2, rngs=rngs)}
            self.blocks = [jsr.GRU(8, 8, rngs=rngs)]
            self.pair = (nnx.Linear(8, 3, rngs=rngs),)

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(8, 2)})
            self.blocks = torch.nn.ModuleList([torch.nn.GRU(8, 8)])
            self.pair = torch.nn.ModuleList([torch.nn.Linear(8, 3)])

    ours, ref = Net(nnx.Rngs(0)), TorchNet()
    jsr.load_torch_state_dict(ours, ref.state_dict())  # every key: they were all left out, the load refused
    assert sorted(jsr.torch_state_dict(ours)) == sorted(ref.state_dict())
    np.testing.assert_array_equal(np.asarray(ours.heads["a"].kernel[...]), ref.heads["a"].weight.detach().numpy().T)

    @struct.dataclass
    class Holder:  # a pytree the key mapping does not walk into, where Flax finds the parameters
        head: nnx.Linear

    ours.held = Holder(nnx.Linear(8, 5, rngs=nnx.Rngs(1)))
    with pytest.raises(NotImplementedError, match=r"no PyTorch mapping for parameter held\.head\.\w+ of Net$"):
        jsr.torch_state_dict(ours)  # was the state_dict without them, without a word


TWIN_CONSTRUCTORS = [  # torch.nn modules as a porter builds them, each kind and option once
    lambda: torch.nn.LSTM(3, 5, 2, batch_first=True, proj_size=2, bidirectional=True),
    lambda: torch.nn.GRU(3, 5, bias=False),
    lambda: torch.nn.RNN(3, 5, 2, nonlinearity="relu", dropout=0.2).eval(),
    lambda: torch.nn.LSTMCell(3, 5),
    lambda: torch.nn.GRUCell(3, 5, bias=False).eval(),  # a cell's mode as a layer's (its twin was in train mode)
    lambda: torch.nn.RNNCell(3, 5, nonlinearity="relu"),
    lambda: torch.nn.GRU(3, 5).to(torch.bfloat16),
]


@pytest.mark.parametrize("make", TWIN_CONSTRUCTORS)
def test_a_torch_module_and_its_jsr_twin_carry_arguments_weights_and_mode_both_ways(make):
    torch.manual_seed(0)
    ref = make()
    ours = jsr.from_torch_module(ref)
    assert type(ours).__name__ == type(ref).__name__
    assert ours.input_size == ref.input_size and ours.hidden_size == ref.hidden_size
    back = jsr.to_torch_module(ours)
    assert repr(back) == repr(ref) and back.training == ref.training  # every constructor argument, the mode
    for key, value in ref.state_dict().items():  # bit for bit, in the module's dtype
        assert back.state_dict()[key].dtype == value.dtype and torch.equal(back.state_dict()[key], value), key
    x = torch.randn(4, 2, 3).to(value.dtype)
    cell = type(ref).__name__.endswith("Cell")
    with torch.no_grad():
        want = ref(x[0] if cell else x)
    got = ours(x[0] if cell else x)
    want, got = (w[0] if isinstance(w, tuple) else w for w in (want, got))
    # float32: two frameworks' rounding; bfloat16: its 8-bit mantissa over a 4-step recurrence
    atol = 1e-5 if value.dtype == torch.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), want.float().numpy(), atol=atol)


@pytest.mark.parametrize("cls", [jsr.LSTM, jsr.GRU, jsr.RNN])
def test_a_layer_built_from_numpy_sizes_and_bools_has_a_torch_twin(cls):
    # Sizes read from an array or a config file (np.int64) and flags (np.True_) are taken as Python's; the layer
    # kept np.int64 attributes, which to_torch_module passed on to torch.nn, which refuses them ("input_size should
    # be of type int, got: int64").
    kw = {"proj_size": np.int64(2)} if cls is jsr.LSTM else {}
    layer = cls(np.int64(3), np.int32(4), np.int64(2), bias=np.True_, batch_first=np.True_,
                bidirectional=np.bool_(True), rngs=nnx.Rngs(0), **kw)
    twin = jsr.to_torch_module(layer)
    assert (twin.input_size, twin.hidden_size, twin.num_layers, twin.batch_first, twin.bidirectional) == \
        (3, 4, 2, True, True)
    assert all(type(getattr(layer, a)) is int for a in ("input_size", "hidden_size", "num_layers", "proj_size"))
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jsr.jit(layer)(x)[0]), twin(torch.from_numpy(x))[0].detach().numpy(),
                               atol=1e-5)


def test_to_torch_module_takes_torch_constructors_dtype_and_device():
    ours = jsr.GRU(3, 4, rngs=nnx.Rngs(0))
    twin = jsr.to_torch_module(ours, dtype=torch.float64, device="cpu")  # was a TypeError: unexpected keyword
    assert twin.weight_ih_l0.dtype == torch.float64 and twin.weight_ih_l0.device == torch.device("cpu")
    for key, value in jsr.torch_state_dict(ours).items():  # float32 into float64: exact
        assert torch.equal(twin.state_dict()[key], torch.from_numpy(value).double()), key
    with pytest.raises(TypeError, match=r"^dtype: expected None or a floating torch.dtype \(torch.float64, say\), as "
                                        r"torch.nn's constructors take, got 'float64'$"):
        jsr.to_torch_module(ours, dtype="float64")



def test_to_torch_module_builds_on_the_device_and_refuses_a_dtype_torch_cannot_hold_weights_in():
    ours = jsr.GRU(3, 4, rngs=nnx.Rngs(0))
    with warnings.catch_warnings():  # torch: a load into a meta parameter is a no-op (meta holds shapes only)
        warnings.simplefilter("ignore")
        twin = jsr.to_torch_module(ours, device="meta")
    assert all(p.device == torch.device("meta") for p in twin.parameters())
    with pytest.raises(TypeError, match=r"^dtype: expected None or a floating torch.dtype .* got torch.int64$"):
        jsr.to_torch_module(ours, dtype=torch.int64)


@pytest.mark.parametrize("wrap, attribute", [(torch.compile, "_orig_mod"), (torch.nn.DataParallel, "module")])
def test_a_compiled_or_parallel_wrapper_is_refused_naming_the_module_inside(wrap, attribute):
    # torch.compile(model) and nn.DataParallel(model) are what a porter often holds; the error said only that an
    # OptimizedModule (or DataParallel) is no torch.nn.LSTM, not that the LSTM is right inside it.
    lstm = torch.nn.LSTM(2, 3)
    with pytest.raises(TypeError, match=rf"^module: expected a torch.nn.LSTM, .* got \S+ wrapping a LSTM: pass the "
                                        rf"wrapped module, module.{attribute}$"):
        jsr.from_torch_module(wrap(lstm))
    assert type(jsr.from_torch_module(getattr(wrap(lstm), attribute))) is jsr.LSTM


def test_a_subclass_has_its_torch_bases_twin_and_other_modules_are_named():
    class Mine(torch.nn.GRU):
        pass

    assert type(jsr.from_torch_module(Mine(2, 3))) is jsr.GRU
    with pytest.raises(TypeError, match=r"module: expected a torch.nn.LSTM, GRU, RNN, LSTMCell, GRUCell or RNNCell, "
                                        r"got torch.nn.modules.linear.Linear$"):
        jsr.from_torch_module(torch.nn.Linear(2, 3))
    with pytest.raises(TypeError, match=r"got torch.nn.modules.rnn.GRU; jsr.from_torch_module makes the twin"):
        jsr.to_torch_module(torch.nn.GRU(2, 3))
    with pytest.raises(ValueError, match=r"^module: torch.nn.LSTMCell has no projection, so no twin of an LSTMCell "
                                         r"with proj_size=2 "):  # (it failed inside torch's load_state_dict)
        jsr.to_torch_module(jsr.LSTMCell(3, 4, proj_size=2, rngs=nnx.Rngs(0)))
    with pytest.warns(UserWarning, match=r"^to_torch_module: the twin computes in its weights' dtype; torch.nn.GRU "
                                         r"has nothing like this module's compute_dtype=bfloat16$"):
        jsr.to_torch_module(jsr.GRU(3, 4, compute_dtype="bfloat16", rngs=nnx.Rngs(0)))


def test_flax_own_cells_are_named_with_the_jsr_cell_to_build():
    """torch's LSTMCell/GRUCell keys into a model of Flax's nnx.LSTMCell/GRUCell (gates in other layers, one bias
    where torch has two): the mismatch names the Flax cell and the jsr cell in torch's layout."""
    class Flaxy(nnx.Module):
        def __init__(self, rngs):
            self.cell = nnx.OptimizedLSTMCell(3, 4, rngs=rngs)

    class Torchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.LSTMCell(3, 4)

    with pytest.raises(KeyError, match=r"; cell is Flax's nnx.OptimizedLSTMCell, whose gates are other layers than "
                                       r"torch's: build it as jsr.LSTMCell, torch's layout"):
        jsr.load_torch_state_dict(Flaxy(nnx.Rngs(0)), Torchy().state_dict())
    with pytest.raises(KeyError, match=r"; the module is Flax's nnx.GRUCell, .* build it as jsr.GRUCell"):
        jsr.load_torch_state_dict(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), torch.nn.GRUCell(3, 4).state_dict())


@pytest.mark.parametrize("kdim,bias", [(None, True), (6, True), (None, False)])
def test_embedding_and_attention_map_to_torchs_and_give_its_numbers(kdim, bias):
    """nnx.Embed <-> torch.nn.Embedding, nnx.MultiHeadAttention <-> torch.nn.MultiheadAttention (in_proj_weight holds
    the query's, key's and value's kernels; q/k/v_proj_weight apart when the keys are another size), in a model that
    embeds tokens, runs a GRU and attends over its outputs under a causal mask: every key both ways bit for bit, the
    outputs torch's."""
    kv_size = kdim or 16

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(11, 5, rngs=rngs)
            self.gru = jsr.GRU(5, 16, batch_first=True, rngs=rngs)
            self.memory = nnx.Linear(16, kv_size, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(4, 16, in_kv_features=kv_size, use_bias=bias, decode=False, rngs=rngs)

        def __call__(self, tokens):
            out, _ = self.gru(self.embed(tokens))
            memory = self.memory(out)
            causal = nnx.make_causal_mask(tokens)  # True: may attend (torch's bool mask is the opposite)
            return self.attn(out, memory, memory, mask=causal)

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(11, 5)
            self.gru = torch.nn.GRU(5, 16, batch_first=True)
            self.memory = torch.nn.Linear(16, kv_size)
            self.attn = torch.nn.MultiheadAttention(16, 4, bias=bias, kdim=kdim, vdim=kdim, batch_first=True)

        def forward(self, tokens):
            out = self.gru(self.embed(tokens))[0]
            memory = self.memory(out)
            steps = tokens.shape[1]
            future = torch.triu(torch.ones(steps, steps, dtype=torch.bool), diagonal=1)  # True: may not attend
            return self.attn(out, memory, memory, attn_mask=future, need_weights=False)[0]

    torch.manual_seed(0)
    ref = TorchNet()
    with torch.no_grad():  # torch starts the attention's biases at zero, which would hide a misplaced one
        for name, value in ref.attn.named_parameters():
            if "bias" in name:
                value.normal_()
    ours = Net(nnx.Rngs(0))
    expected_keys = list(ref.state_dict())
    assert list(jsr.torch_state_dict(ours)) == expected_keys
    jsr.load_torch_state_dict(ours, ref.state_dict())
    for key, value in jsr.torch_state_dict(ours).items():
        np.testing.assert_array_equal(value, ref.state_dict()[key].numpy(), err_msg=key)
    tokens = np.random.default_rng(0).integers(0, 11, (3, 7))
    with torch.no_grad():
        expected = ref(torch.from_numpy(tokens)).numpy()
    np.testing.assert_allclose(np.asarray(ours(tokens)), expected, atol=1e-5)  # float32 rounding of two frameworks
    # And back: weights of ours, loaded into the torch twin, give ours' numbers.
    fresh = Net(nnx.Rngs(1))
    twin = TorchNet()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in jsr.torch_state_dict(fresh).items()})
    with torch.no_grad():
        np.testing.assert_allclose(twin(torch.from_numpy(tokens)).numpy(), np.asarray(fresh(tokens)), atol=1e-5)


@pytest.mark.parametrize("arguments,named", [
    ({"qkv_features": 8}, "qkv_features=8"),
    ({"out_features": 8}, "out_features=8"),
    ({"num_kv_heads": 2}, "num_kv_heads=2"),
    ({"normalize_qk": True}, "normalize_qk=True"),
])
def test_attention_torch_cannot_hold_is_refused_by_name(arguments, named):
    if not set(arguments) <= set(inspect.signature(nnx.MultiHeadAttention.__init__).parameters):
        pytest.skip(f"this flax's nnx.MultiHeadAttention has no {named.split('=')[0]}")
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.attn = nnx.MultiHeadAttention(4, 16, decode=False, rngs=rngs, **arguments)

    with pytest.raises(NotImplementedError, match=rf"^convert: no PyTorch mapping for nnx.MultiHeadAttention 'attn' "
                                                  rf"with {named}: torch.nn.MultiheadAttention has"):
        jsr.torch_state_dict(Net(nnx.Rngs(0)))


def test_a_state_dict_files_errors_hint_at_sizes_only_where_sizes_differ(tmp_path):
    # A NaN in the file is the file's fault, not a size to set: no "its sizes must match" there.
    from jax_scan_rnn.convert import load_state_dict_file, save_safetensors

    lstm = jsr.LSTM(3, 4, rngs=nnx.Rngs(0))
    sd = jsr.torch_state_dict(lstm)
    bad = {**sd, "bias_hh_l0": np.full_like(sd["bias_hh_l0"], np.nan)}
    save_safetensors(bad, tmp_path / "nan.safetensors")
    with pytest.raises(ValueError) as err:
        load_state_dict_file(lstm, bad, tmp_path / "nan.safetensors", "init_from", "hidden_size")
    assert "does not fit this model" in str(err.value) and "its sizes must" not in str(err.value)
    with pytest.raises(ValueError, match=r"\); its sizes must match hidden_size$"):
        load_state_dict_file(jsr.LSTM(3, 5, rngs=nnx.Rngs(0)), sd, tmp_path / "nan.safetensors", "init_from",
                             "hidden_size")


def test_a_float64_torch_module_without_x64_is_cast_with_a_warning_at_the_callers_line():
    # The load's own warning named convert.py's line and a state_dict the caller never gave, not why nor the way out
    ref = torch.nn.LSTM(3, 4).double()
    with jax.enable_x64(False), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = jsr.from_torch_module(ref)
    assert [str(w.message) for w in caught] == [
        "from_torch_module: the torch.nn.LSTM's float64 weights are cast to float32, as JAX computes in float32 unless "
        "jax_enable_x64 is on (jax.config.update('jax_enable_x64', True) before building keeps float64)"]
    assert caught[0].filename == __file__
    for key, value in jsr.torch_state_dict(ours).items():  # each weight rounded once, as torch's .float() does
        assert value.dtype == np.float32, key
        np.testing.assert_array_equal(value, ref.state_dict()[key].float().numpy(), err_msg=key)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, "float64", torch.float16])
def test_from_torch_module_takes_a_dtype_and_leaves_the_torch_module_as_it_is(dtype):
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 4, num_layers=2)
    want = validate.float_dtype("dtype", dtype)
    ours = jsr.from_torch_module(ref, dtype=dtype)  # was a TypeError: unexpected keyword
    assert ref.weight_ih_l0.dtype == torch.float32
    for key, value in jsr.torch_state_dict(ours).items():  # each weight rounded once, as torch's .to(dtype) does
        assert value.dtype == want, key
        cast = ref.state_dict()[key].to(getattr(torch, np.dtype(want).name)).float().numpy()
        assert np.array_equal(value.astype(np.float32), cast), key
    with pytest.raises(TypeError, match=r"^dtype: expected a floating dtype .*got 'int32'"):
        jsr.from_torch_module(ref, dtype="int32")


def test_conversion_warnings_name_the_callers_line_so_a_rerun_warns_again(tmp_path):
    """The epsilon, momentum and padding warnings named a line of convert.py (a fixed stacklevel inside a generator),
    and the cast warning of a file load another: Python's default filter shows a warning once per line, so a notebook
    cell run again, or a second model of the same layout, said nothing. Each names the caller's own line now."""
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.LayerNorm(4, rngs=rngs)  # Flax's default epsilon, 1e-6

    from jax_scan_rnn.convert import load_state_dict_file

    net = Net(nnx.Rngs(0))
    path = tmp_path / "net.pt"
    with pytest.warns(UserWarning, match="epsilon 1e-06"):  # exporting warns too: checked below, not shown here
        torch.save({k: torch.from_numpy(v).double() for k, v in jsr.torch_state_dict(net).items()}, path)
    calls = {"torch_state_dict": lambda: jsr.torch_state_dict(net),
             "load_torch_state_dict": lambda: jsr.load_torch_state_dict(net, torch.load(path)),
             "load_state_dict_file": lambda: load_state_dict_file(net, torch.load(path), path, "init_from", "")}
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            call()
        assert record and {os.path.abspath(w.filename) for w in record} == {os.path.abspath(__file__)}, (
            f"{name}: warned at {[(w.filename, w.lineno) for w in record]}, not at the caller's line")
