"""Weight conversion: errors name the key and shapes, failed loads change nothing, safetensors files."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.torch import load_file as torch_load_file

import jax_scan_rnn as jsr
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


def test_wrong_shape_names_key_and_shapes_and_changes_nothing():
    ref, ours = pair()
    before = params_of(ours)
    sd = dict(ref.state_dict())
    sd["weight_hh_l1"] = torch.zeros(16, 5)  # the last key: earlier ones were valid and must not be written
    with pytest.raises(ValueError, match=r"state_dict\['weight_hh_l1'\]: expected shape \(16, 4\), got \(16, 5\)"):
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
    jsr.load_torch_state_dict(ours, {k: v.double() for k, v in ref.state_dict().items()})
    assert all(v.dtype == np.float32 for v in jsr.torch_state_dict(ours).values())


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
