"""PyTorch `state_dict` <-> Flax NNX parameters, both directions, with PyTorch's key names.

    jsr.load_torch_state_dict(module, torch_model.state_dict())   # torch -> jax (tensors or numpy)
    torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in jsr.torch_state_dict(module).items()})
    lstm = jsr.from_torch_module(torch_lstm); torch_lstm = jsr.to_torch_module(lstm)   # built and loaded, one call

The one table of what maps to what (`_layout`), per kind of submodule:

    jsr.LSTM/GRU/RNN layer k     weight_ih_l{k} = w_ih.T   weight_hh_l{k} = w_hh.T
                                 bias_ih_l{k}   = b_ih     bias_hh_l{k}   = b_hh     (unless bias=False)
                                 weight_hr_l{k} = w_hr.T                         (LSTM with proj_size > 0)
      its backward direction     the same keys with `_reverse` appended (`reverse_layers[k]`)
    jsr.LSTMCell/GRUCell/RNNCell weight_ih = w_ih.T  weight_hh = w_hh.T  bias_ih = b_ih  bias_hh = b_hh
    nnx.Linear                   weight = kernel.T   bias = bias
    nnx.Embed                    weight = embedding    (torch's padding_idx and max_norm are constructor
                                 arguments, not in its state_dict, and nnx.Embed has neither: training here
                                 updates the padding row, which torch's gradient leaves at 0, and rows are not
                                 renormalised at lookup)
    nnx.MultiHeadAttention       in_proj_weight = the query's, key's and value's kernels [in, heads, head_dim], each
                                 as [heads * head_dim, in], one above the other (q_proj_weight, k_proj_weight,
                                 v_proj_weight apart when in_kv_features is not in_features: torch's kdim = vdim),
                                 in_proj_bias = their biases, out_proj.weight = out's kernel [heads, head_dim, out] as
                                 [out, heads * head_dim], out_proj.bias. torch.nn.MultiheadAttention's embed_dim is
                                 in_features = qkv_features = out_features (another is refused by name); its input is
                                 [L, B, E] unless batch_first=True, and its bool attn_mask is True where Flax's mask
                                 is False (may not attend); build nnx's with decode=False
    nnx.LayerNorm, nnx.GroupNorm weight = scale      bias = bias   (build them with epsilon=1e-5, torch's eps;
                                 Flax's default, 1e-6, differs: a warning names the module)
    nnx.RMSNorm                  weight = scale      (torch's default eps, None, is the dtype's machine epsilon,
                                 1.19e-7 for float32; Flax's, 1e-6, differs: a warning names the module)
    nnx.BatchNorm                weight = scale      bias = bias   running_mean = mean   running_var = var
                                 (nnx.BatchNorm holds mean and var in float32 whatever its param_dtype: a float64
                                 torch's are rounded, the load's cast warning saying so). num_batches_tracked:
                                 torch's counter, which nnx.BatchNorm has not: checked to be an integer and dropped
                                 on load, 0 on export. torch reads it only with momentum=None, a cumulative average
                                 nnx's fixed-rate momentum cannot compute (such a model trained on after a round
                                 trip starts its average again); with a momentum it changes no number. nnx's
                                 momentum m is torch's 1 - m (torch's default 0.1 is 0.9; Flax's default, 0.99,
                                 differs: a warning names the module). Both normalise with the batch's biased variance; torch
                                 averages the unbiased one into running_var, Flax the biased one
    nnx.Conv, n spatial dims     weight = kernel permuted [*K, I/groups, O] -> [O, I/groups, *K] (torch.nn.Conv1d
                                 for n=1, Conv2d, Conv3d), bias = bias. Padding, strides and dilation are
                                 constructor arguments, not weights: nnx.Conv's default padding is "SAME", torch's
                                 is 0 ("VALID"; "SAME" warns, naming the module); torch's input is channels-first
                                 [B, C, L], nnx.Conv's [B, L, C]
    nnx.ConvTranspose            weight [I, O, *K] (torch.nn.ConvTranspose1d/2d/3d, groups=1) = kernel permuted:
                                 with transpose_kernel=True [*K, O, I] (the kernel of the convolution it is the
                                 gradient of, as torch's), with the default False [*K, I, O] reversed along each
                                 spatial axis (Flax applies it unflipped); bias = bias. torch's padding p and
                                 output_padding q are Flax's padding ((d (K-1) - p, d (K-1) - p + q), ...), with
                                 kernel_dilation d = torch's dilation (nnx.ConvTranspose's docstring)
    nnx.Sequential               its layers by position, as torch.nn.Sequential's (`mlp.0.weight`, not Flax's
                                 attribute path `mlp.layers.0.weight`; an activation holds a position in both)
    Flax's nnx.LSTMCell, GRUCell their Linear layers' keys (as any other module, below): torch's cells' keys
                                 do not map to them (a Linear per gate, one bias where torch has two; a
                                 mismatch says so): build the model with jsr.LSTMCell/GRUCell, torch's layout
    any other module             recurse into its submodules; the attribute name is the key prefix
                                 (`lstm_layers.weight_ih_l0`, `output_layer.weight`, `layers.0.weight`), a
                                 position or key inside nnx.List/Dict or plain lists and dicts (`heads.a.weight`)
    anything else                a parameter no row maps is a NotImplementedError naming it, never left out; so is
                                 any other nnx.Variable (a class of the user's own) but random streams, sown
                                 values and attention's decoding cache, which are not weights

Only permutations and reversals of axes, reshapes and copies: both directions are bit-exact (but for BatchNorm's
float64 running statistics and its counter, above). Models do not import this module; it knows their layout by
walking their attributes, so a model whose attribute names are its torch twin's converts with no code of its own.
torch is never imported here: a torch tensor is recognised by its `.detach()` method.
"""
from __future__ import annotations

import itertools
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_scan_rnn import cells, layers, validate
from jax_scan_rnn.cells import RNNCellBase
from jax_scan_rnn.layers import RNNBase


class Entry(NamedTuple):
    """One torch key and what holds it here. torch's tensor is each of `params` permuted by `axes`, reversed along
    `flip`, its axes merged by `groups`, the parts concatenated along the first axis: only copies, so both ways are
    bit-exact."""

    key: str
    # The nnx.Params (or BatchStats) behind the key: one; several (attention's in_proj_weight holds the query's, the
    # key's and the value's kernels one above the other); none (a torch buffer such as BatchNorm's counter).
    params: tuple[nnx.Variable, ...]
    axes: tuple[int, ...] | None = None  # ours permuted into torch's axis order; None: the same order
    # torch's axes as runs of the permuted ones, merged: ((0, 1), (2,)) makes attention's [heads, head_dim, in]
    # torch's [heads * head_dim, in]; None: one each.
    groups: tuple[tuple[int, ...], ...] | None = None
    flip: tuple[int, ...] = ()  # torch's axes (after the permutation) in reverse order: ConvTranspose's spatial ones


MATRIX = (1, 0)  # a weight matrix: torch's [out, in] is our [in, out] transposed
TORCH_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's and GroupNorm's default `eps`
# Each normalisation module torch has a twin of, and the twin's default eps (None: the dtype's machine epsilon).
NORMS = {nnx.LayerNorm: ("torch.nn.LayerNorm", TORCH_LAYER_NORM_EPS),
         nnx.GroupNorm: ("torch.nn.GroupNorm", TORCH_LAYER_NORM_EPS), nnx.RMSNorm: ("torch.nn.RMSNorm", None),
         nnx.BatchNorm: ("torch.nn.BatchNorm1d", TORCH_LAYER_NORM_EPS)}
TORCH_BATCH_NORM_MOMENTUM = 0.1  # torch.nn.BatchNorm1d's default: the batch's weight, where Flax's is the average's


def _check_module(module: Any) -> None:
    """TypeError for anything but an NNX module: a torch module here (the arguments swapped, or torch_state_dict of
    the torch model) has no NNX parameters to walk, and would give an empty state_dict without a word."""
    if not isinstance(module, nnx.Module):
        torch = type(module).__module__.startswith("torch")
        raise TypeError(f"module: expected a flax.nnx Module (a jax_scan_rnn model), got "
                        f"{'the torch module ' if torch else ''}{type(module).__name__}"
                        f"{'; a torch module gives its own weights with .state_dict()' if torch else ''}")


def _layout(module: nnx.Module, prefix: str = "") -> Iterator[Entry]:
    if isinstance(module, RNNBase):
        for k in range(module.num_layers):
            yield from _cell_layout(module.layers[k], prefix, suffix=f"_l{k}")
            if module.bidirectional:
                yield from _cell_layout(module.reverse_layers[k], prefix, suffix=f"_l{k}_reverse")
    elif isinstance(module, RNNCellBase):
        yield from _cell_layout(module, prefix, suffix="")
    elif isinstance(module, nnx.Linear):
        yield Entry(f"{prefix}weight", (module.kernel,), MATRIX)
        if module.bias is not None:
            yield Entry(f"{prefix}bias", (module.bias,))
    elif isinstance(module, (nnx.Conv, nnx.ConvTranspose)):
        n = len(module.kernel[...].shape) - 2  # spatial dimensions
        if isinstance(module, nnx.ConvTranspose) and not module.transpose_kernel:
            # [*K, I, O], applied unflipped: torch's [I, O, *K] reversed along every spatial axis
            yield Entry(f"{prefix}weight", (module.kernel,), (n, n + 1, *range(n)), flip=tuple(range(2, n + 2)))
        else:  # Conv's [*K, I/groups, O] is torch's [O, I/groups, *K]; a transposed kernel's [*K, O, I] its [I, O, *K]
            yield Entry(f"{prefix}weight", (module.kernel,), (n + 1, n, *range(n)))
        if module.bias is not None:
            yield Entry(f"{prefix}bias", (module.bias,))
        if isinstance(module.padding, str) and module.padding.upper() == "SAME":
            _warn_same_padding(module, prefix, n)
    elif isinstance(module, nnx.Embed):
        yield Entry(f"{prefix}weight", (module.embedding,))
    elif isinstance(module, tuple(NORMS)):
        _check_constants(module, prefix)
        for key, param in (("weight", module.scale), ("bias", getattr(module, "bias", None))):
            if param is not None:  # torch's elementwise_affine=False / affine=False / bias=False: not a parameter
                yield Entry(f"{prefix}{key}", (param,))
        if isinstance(module, nnx.BatchNorm):
            yield Entry(f"{prefix}running_mean", (module.mean,))
            yield Entry(f"{prefix}running_var", (module.var,))
            yield Entry(f"{prefix}num_batches_tracked", ())
    elif isinstance(module, nnx.MultiHeadAttention):
        yield from _attention_layout(module, prefix)
    else:
        if isinstance(module, nnx.Sequential):
            module = module.layers  # torch.nn.Sequential keys its layers by position directly
        yield from _children(module, prefix)


def _attention_layout(module: nnx.MultiHeadAttention, prefix: str) -> Iterator[Entry]:
    """torch.nn.MultiheadAttention's keys: the query's, key's and value's kernels `[in, heads, head_dim]`, each
    torch's `[heads * head_dim, in]`, one above the other in `in_proj_weight` (or apart, `q/k/v_proj_weight`, when
    the key and value inputs are another size, torch's kdim = vdim); their biases in `in_proj_bias`; the output
    kernel `[heads, head_dim, out]` as torch's `out_proj.weight [out, heads * head_dim]`."""
    name = prefix[:-1] or "module"
    embed = module.in_features  # torch's embed_dim: the query's size, the attention's and the output's
    # (flax 0.12.5, the floor, has no num_kv_heads: as many key/value heads as heads)
    unlike = [f"{field}={getattr(module, field)}" for field, torch_value in
              (("qkv_features", embed), ("out_features", embed), ("num_kv_heads", module.num_heads),
               ("normalize_qk", False)) if getattr(module, field, torch_value) != torch_value]
    if unlike:
        raise NotImplementedError(f"convert: no PyTorch mapping for nnx.MultiHeadAttention {name!r} with "
                                  f"{', '.join(unlike)}: torch.nn.MultiheadAttention has qkv_features = out_features "
                                  f"= in_features (embed_dim), as many key/value heads as heads, no query/key norm")
    heads_first = ((0, 1), (2,))  # [heads, head_dim, in] -> [heads * head_dim, in]
    projections = (module.query, module.key, module.value)
    if module.in_kv_features == embed:
        yield Entry(f"{prefix}in_proj_weight", tuple(p.kernel for p in projections), (1, 2, 0), heads_first)
    else:
        for letter, projection in zip("qkv", projections):
            yield Entry(f"{prefix}{letter}_proj_weight", (projection.kernel,), (1, 2, 0), heads_first)
    if module.query.bias is not None:
        yield Entry(f"{prefix}in_proj_bias", tuple(p.bias for p in projections), None, ((0, 1),))
    yield Entry(f"{prefix}out_proj.weight", (module.out.kernel,), (2, 0, 1), ((0,), (1, 2)))
    if module.out.bias is not None:
        yield Entry(f"{prefix}out_proj.bias", (module.out.bias,))


def _check_constants(module: nnx.Module, prefix: str) -> None:
    """Warn when a normalisation module's epsilon (or BatchNorm's momentum) is not its torch twin's default: not in
    the state_dict, so no load can check it, and far from negligible: over features of variance 1e-4, LayerNorm's
    two epsilons' outputs differed by up to 0.3 (weights ~ N(0, 1))."""
    twin, eps = next(twin for kind, twin in NORMS.items() if isinstance(module, kind))
    if eps is None:
        eps = float(jnp.finfo(module.param_dtype).eps)
    if isinstance(module, nnx.BatchNorm) and not np.isclose(module.momentum, 1 - TORCH_BATCH_NORM_MOMENTUM):
        warnings.warn(f"convert: nnx.BatchNorm {prefix[:-1] or 'module'!r} has momentum {module.momentum:g}, which is "
                      f"torch's momentum={1 - module.momentum:g}; {twin}'s default is {TORCH_BATCH_NORM_MOMENTUM:g} "
                      f"(nnx's {1 - TORCH_BATCH_NORM_MOMENTUM:g}): training updates the running statistics at "
                      f"another rate", UserWarning, stacklevel=validate.user_stacklevel())
    if module.epsilon != eps:
        warnings.warn(f"convert: nnx.{type(module).__name__} {prefix[:-1] or 'module'!r} has epsilon "
                      f"{module.epsilon:g}, {twin}'s default eps is {eps:g}: the two compute other numbers unless the "
                      f"torch model was built with eps={module.epsilon:g}", UserWarning,
                      stacklevel=validate.user_stacklevel())


def _warn_same_padding(module: nnx.Conv | nnx.ConvTranspose, prefix: str, n: int) -> None:
    """Flax's default padding, "SAME", is not torch's (0, "VALID") and not in the state_dict: a convolution left at
    it gives another output length than its torch twin (kernel 3 over 10 steps: 10 outputs against torch's 8)."""
    kind = type(module).__name__
    twin = f"torch.nn.{kind}{n}d"
    remedy = ("unless the torch model was built with padding='same'" if kind == "Conv" else
              "(torch has no 'same' for it: give nnx's padding as the table above translates torch's)")
    warnings.warn(f"convert: nnx.{kind} {prefix[:-1] or 'module'!r} has padding 'SAME' (Flax's default), {twin}'s "
                  f"default is 0 ('VALID'): the two give other outputs {remedy}", UserWarning,
                  stacklevel=validate.user_stacklevel())


def _children(container: Any, prefix: str) -> Iterator[Entry]:
    """The entries of a module's submodules, or of a list, tuple or dict of them (a `pytree=False` module may hold
    plain ones), keyed by attribute name, position or dict key as torch's ModuleList and ModuleDict are."""
    if isinstance(container, (nnx.List, list, tuple)):
        items = enumerate(container)
    else:
        items = container.items() if isinstance(container, dict) else vars(container).items()
    for name, value in items:  # a parameter no row maps is left to `_full_layout`'s check
        if isinstance(value, nnx.Module):
            yield from _layout(value, f"{prefix}{name}.")
        elif isinstance(value, (list, tuple, dict)):
            yield from _children(value, f"{prefix}{name}.")


# The nnx.Variables that are not weights, so no torch key stands for them: random streams (torch's generator is
# global, not in a state_dict), values sown by a call, attention's decoding cache.
NOT_WEIGHTS = (nnx.RngState, nnx.Intermediate, nnx.Cache)


def _full_layout(module: nnx.Module) -> list[Entry]:
    """`_layout(module)`, checked to hold every Variable of the module but `NOT_WEIGHTS`: one that no row maps (held
    by a module of another kind, inside a container the walk does not know, or of a Variable class of the user's
    own) would otherwise be left out of `torch_state_dict`, and left as it was by `load_torch_state_dict`, without a
    word."""
    layout = list(_layout(module))
    mapped = {id(param) for entry in layout for param in entry.params}
    for path, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Variable) and not isinstance(node, NOT_WEIGHTS) and id(node) not in mapped:
            weight = isinstance(node, (nnx.Param, nnx.BatchStat))
            kind = "" if type(node) in (nnx.Param, nnx.BatchStat) else f" (a {type(node).__name__}" + (
                ")" if weight else ", an nnx.Variable that is neither an nnx.Param nor an nnx.BatchStat)")
            raise NotImplementedError(f"convert: no PyTorch mapping for {'parameter' if weight else 'state'} "
                                      f"{'.'.join(map(str, path))} of {type(module).__name__}{kind}")
    return layout


def _cell_layout(cell: RNNCellBase, prefix: str, suffix: str) -> Iterator[Entry]:
    # torch.nn.LSTM's order of `_flat_weights_names`: weight_ih, weight_hh, bias_ih, bias_hh, weight_hr.
    yield Entry(f"{prefix}weight_ih{suffix}", (cell.w_ih,), MATRIX)
    yield Entry(f"{prefix}weight_hh{suffix}", (cell.w_hh,), MATRIX)
    if cell.b_ih is not None:
        yield Entry(f"{prefix}bias_ih{suffix}", (cell.b_ih,))
        yield Entry(f"{prefix}bias_hh{suffix}", (cell.b_hh,))
    if getattr(cell, "w_hr", None) is not None:
        yield Entry(f"{prefix}weight_hr{suffix}", (cell.w_hr,), MATRIX)


def torch_state_dict(module: nnx.Module) -> dict[str, np.ndarray]:
    """The module's parameters as a PyTorch `state_dict`: `{torch key: np.ndarray in torch layout}`.

    The keys are exactly the `state_dict()` keys of the `torch_ref` twin, so
    `twin.load_state_dict({k: torch.from_numpy(v) ...})` loads it with `strict=True`. The arrays keep the
    parameters' dtype; a bfloat16 model's are ml_dtypes' `bfloat16`, which `torch.from_numpy` refuses:
    `torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)` takes the same bits (or `save_safetensors`, whose
    file `safetensors.torch.load_file` reads as bfloat16 tensors).
    """
    _check_module(module)
    # A copy, never a view: JAX may share its CPU buffer with numpy, and torch.from_numpy shares
    # numpy's, so an in-place torch update would otherwise write into the JAX parameter. An entry
    # with no params is a torch counter: 0.
    return {entry.key: np.array(_to_torch(entry), order="C", copy=True) if entry.params else np.array(0, np.int64)
            for entry in _full_layout(module)}


# torch.nn's recurrent modules (torch_ref's LSTM, GRU and RNN are these), each the twin of jsr's class of its name.
TWINS = {"LSTM": layers.LSTM, "GRU": layers.GRU, "RNN": layers.RNN, "LSTMCell": cells.LSTMCell,
         "GRUCell": cells.GRUCell, "RNNCell": cells.RNNCell}


def _twin_kind(module: Any, torch_side: bool) -> str:
    """The TWINS name of `module`'s class or of the first of its bases that is one (a subclass of torch.nn.LSTM, say),
    on the torch side (`torch_side`) or jsr's; TypeError otherwise."""
    for cls in type(module).__mro__:
        ours = cls in TWINS.values()
        if (cls.__module__.startswith("torch.nn") if torch_side else ours) and cls.__name__ in TWINS:
            return cls.__name__
    side, other = ("torch.nn", "to_torch_module") if torch_side else ("jsr", "from_torch_module")
    twin = f"; jsr.{other} makes the twin of such a module" if type(module).__name__ in TWINS else ""
    # torch.compile's and (Distributed)DataParallel's wrappers hold the module itself: name where, or a porter who
    # compiled or parallelised the model reads only that an OptimizedModule is no LSTM.
    for attribute in ("_orig_mod", "module") if torch_side else ():
        inner = getattr(module, attribute, None)
        if any(cls.__module__.startswith("torch.nn") and cls.__name__ in TWINS for cls in type(inner).__mro__):
            twin = f" wrapping a {type(inner).__name__}: pass the wrapped module, module.{attribute}"
            break
    raise TypeError(f"module: expected a {side}.LSTM, GRU, RNN, LSTMCell, GRUCell or RNNCell, got "
                    f"{type(module).__module__}.{type(module).__name__}{twin}")


def _constructor_arguments(module: Any, kind: str, bias: bool, dropout: float) -> dict[str, Any]:
    """torch's constructor keyword arguments of a recurrent module, read from the attributes both sides share."""
    arguments = {"input_size": module.input_size, "hidden_size": module.hidden_size, "bias": bias}
    if not kind.endswith("Cell"):
        arguments |= {"num_layers": module.num_layers, "batch_first": module.batch_first, "dropout": dropout,
                      "bidirectional": module.bidirectional}
    if kind == "LSTM":
        arguments["proj_size"] = module.proj_size
    if kind.startswith("RNN"):
        arguments["nonlinearity"] = module.nonlinearity
    return arguments


def from_torch_module(module: Any, *, dtype: Any = None, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """The jsr twin of a `torch.nn.LSTM`, `GRU`, `RNN`, `LSTMCell`, `GRUCell` or `RNNCell`: built with the same
    constructor arguments, holding its weights bit for bit, in its mode (after `.eval()`, dropout off).

        lstm = jsr.from_torch_module(torch.nn.LSTM(8, 32, num_layers=2, batch_first=True))

    Parameters take `dtype` (a floating dtype: `jnp.bfloat16`, `"float64"`, `torch.float16`, ...), by default the
    torch weights' own, where JAX holds it (float64 needs `jax_enable_x64`; float32 otherwise, with the load's
    warning naming the cast); the torch module itself is left as it is. `rngs`
    (default `nnx.Rngs(0)`) builds the twin: its params stream draws the weights the load then replaces, its dropout
    stream the twin's dropout masks.
    """
    kind = _twin_kind(module, torch_side=True)
    state_dict = module.state_dict()
    if dtype is not None:
        import torch

        to = getattr(torch, jnp.dtype(validate.float_dtype("dtype", dtype)).name)
        state_dict = {key: value.to(to) for key, value in state_dict.items()}
    dtype = str(next(iter(state_dict.values())).dtype).removeprefix("torch.")
    if dtype == "float64" and not jax.config.jax_enable_x64:
        # Said here, at the caller's line: the load's own cast warning named a line of this file and a state_dict
        # the caller never gave, and not why, nor how to keep float64.
        warnings.warn(f"from_torch_module: the torch.nn.{kind}'s float64 weights are cast to float32, as JAX computes "
                      "in float32 unless jax_enable_x64 is on (jax.config.update('jax_enable_x64', True) before "
                      "building keeps float64)", UserWarning, stacklevel=2)
        state_dict = {key: value.float() for key, value in state_dict.items()}
        dtype = "float32"
    arguments = _constructor_arguments(module, kind, module.bias, getattr(module, "dropout", 0.0))
    ours = TWINS[kind](**arguments, param_dtype=jnp.dtype(dtype), rngs=rngs or nnx.Rngs(0))
    load_torch_state_dict(ours, state_dict)
    if not module.training:
        ours.eval()
    return ours


def to_torch_module(module: nnx.Module, *, dtype: Any = None, device: Any = None) -> Any:
    """The `torch.nn` twin of a jsr `LSTM`, `GRU`, `RNN`, `LSTMCell`, `GRUCell` or `RNNCell`: built with the same
    constructor arguments, holding its weights bit for bit in their dtype, in its mode (`eval()` after the jsr
    module's `.eval()`: a layer's dropout is off, a cell records the mode), on the CPU (needs torch: `pip install
    'jax-scan-rnn[torch]'`).

    `dtype` (a floating `torch.dtype`) and `device` are torch.nn constructors' own: the twin is built with them, its
    weights cast as `.to(dtype)` casts them (exact to a wider dtype), as `to_torch_module(module).to(device, dtype)`.
    """
    from jax_scan_rnn.optional import require

    torch = require("torch", "to_torch_module")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype: expected None or a floating torch.dtype (torch.float64, say), as torch.nn's "
                        f"constructors take, got {dtype!r}")
    kind = _twin_kind(module, torch_side=False)
    cell = kind.endswith("Cell")
    if kind == "LSTMCell" and module.proj_size:
        raise ValueError(f"module: torch.nn.LSTMCell has no projection, so no twin of an LSTMCell with proj_size="
                         f"{module.proj_size} (torch projects only inside torch.nn.LSTM)")
    arguments = _constructor_arguments(module, kind, module.bias if cell else module.layers[0].bias,
                                       0.0 if cell else module.dropout.rate)
    compute_dtype = (module if cell else module.layers[0]).compute_dtype
    if compute_dtype is not None:  # torch's module has no such setting: its matmuls run in its weights' dtype
        warnings.warn(f"to_torch_module: the twin computes in its weights' dtype; torch.nn.{kind} has nothing like "
                      f"this module's compute_dtype={jnp.dtype(compute_dtype).name}", UserWarning, stacklevel=2)
    state_dict = torch_state_dict(module)
    weights = getattr(torch, str(next(iter(state_dict.values())).dtype))
    twin = getattr(torch.nn, kind)(**arguments, dtype=dtype or weights, device=device)
    # torch.from_numpy knows no bfloat16: through float32, which holds every bfloat16 value exactly. The load
    # copies each value to the twin's dtype and device.
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32 if v.dtype == jnp.bfloat16 else v.dtype))
                          .to(weights) for k, v in state_dict.items()})
    if (module if cell else module.dropout).deterministic:
        twin.eval()
    return twin


def _check_mapping(state_dict: Any, *, reading: bool = False) -> None:
    if not isinstance(state_dict, Mapping):
        hint = " (pass its .state_dict())" if hasattr(state_dict, "state_dict") else ""
        if reading and isinstance(state_dict, str | os.PathLike):
            hint = (f" {str(state_dict)!r} (a file's path: pass its contents, jsr.load_safetensors(path) or "
                    "torch.load(path, weights_only=True))")
        raise TypeError(
            f"state_dict: expected a mapping of torch key -> tensor/array, got {type(state_dict).__name__}{hint}"
        )


def _to_numpy(key: str, value: Any) -> np.ndarray:
    """One state_dict value (torch tensor, numpy or JAX array) as a numpy array of the same dtype."""
    # A torch tensor in its own dtype, bfloat16 included, so that the dtype warning and safetensors files report
    # the dtype that was given.
    value = validate.host_array(value, f"state_dict[{key!r}]")
    if not jnp.issubdtype(value.dtype, jnp.floating):  # np.issubdtype says no to bfloat16
        raise TypeError(f"state_dict[{key!r}]: expected a floating dtype, got {value.dtype}")
    return value


def _non_finite_message(key: str, value: np.ndarray, cast: np.ndarray) -> str:
    nan, inf = int(np.isnan(value).sum()), int(np.isinf(value).sum())
    if nan or inf:
        return f"state_dict[{key!r}]: expected finite values, got {nan} NaN and {inf} inf among {value.size}"
    overflow = ~np.isfinite(cast)
    return (
        f"state_dict[{key!r}]: expected values that fit the module's {cast.dtype}, got {int(overflow.sum())} "
        f"{value.dtype} values that overflow to inf (largest magnitude {float(np.abs(value[overflow]).max()):.3g})"
    )


def _cast_warning(casts: dict[tuple[str, str], list[str]]) -> str:
    parts = []
    for (given, ours), keys in casts.items():
        parts.append(f"{len(keys)} from {given} to {ours} ({validate.listed(keys, 3)})")
    return "state_dict: values cast to the module's parameter dtype: " + "; ".join(parts)


def load_torch_state_dict(module: nnx.Module, state_dict: Mapping[str, Any]) -> None:
    """Load a PyTorch `state_dict` (torch tensors or numpy arrays) into `module`, in place.

    Every key must be present and no other key may be given; every shape must match. Values are cast to
    the module's parameter dtype; when any dtype differs (float64 or bfloat16 into float32, say), one
    `UserWarning` names the keys and both dtypes. Everything is checked before anything is written, so
    after an error the module is unchanged.

    Raises:
      TypeError: `module` is not an NNX module (a torch one, say), `state_dict` is not a mapping, or a value is
        not floating.
      KeyError: missing or unexpected keys (all of them are named, and a key prefix that explains them:
        `module.` of a DataParallel checkpoint, a larger model's, or a submodule's keys alone).
      ValueError: a shape mismatch (key, expected and given shape), or a NaN/inf, given or made by the
        cast (a float64 1e300 into float32): loading it would only show up later as a NaN loss.
    """
    _check_module(module)
    _check_mapping(state_dict, reading=True)
    layout = _full_layout(module)
    expected_keys = [entry.key for entry in layout]
    missing = [k for k in expected_keys if k not in state_dict]
    unexpected = [k for k in state_dict if k not in set(expected_keys)]
    if missing or unexpected:
        hint = (_prefix_hint(expected_keys, state_dict) or _arguments_hint(layout, state_dict)
                or _flax_cell_hint(module))
        raise KeyError(f"state_dict: keys do not match {type(module).__name__}: missing {missing}, unexpected "
                       f"{unexpected}{hint}")
    updates, casts, running = [], {}, False
    for entry in layout:
        key = entry.key
        if not entry.params:
            _check_counter(key, state_dict[key])
            continue
        value = _to_numpy(key, state_dict[key])
        expected = _torch_shape(entry)
        if value.shape != expected:
            raise ValueError(f"state_dict[{key!r}]: expected shape {expected}, got {tuple(value.shape)}"
                             f"{_arguments_hint(layout, state_dict)}")
        dtype = entry.params[0][...].dtype  # the parts of one key share a module's param_dtype
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, naming the key
            # astype copies (even to the same dtype): the module never aliases the caller's (torch's) memory,
            # which a later in-place optimiser step would change behind its back.
            cast = value.astype(dtype)
        if not np.isfinite(cast).all():
            raise ValueError(_non_finite_message(key, value, cast))
        if value.dtype != dtype:
            casts.setdefault((str(value.dtype), str(dtype)), []).append(key)
            running |= isinstance(entry.params[0], nnx.BatchStat)
        updates += _from_torch(entry, cast)
    if casts:
        # (a float64 model's running statistics are cast to float32 too, which its param_dtype would not say)
        note = "; nnx.BatchNorm holds its running statistics in float32 whatever its param_dtype" if running else ""
        warnings.warn(_cast_warning(casts) + note, UserWarning, stacklevel=validate.user_stacklevel())
    for param, value in updates:
        param[...] = value


def _check_counter(key: str, value: Any) -> None:
    """A torch counter with nothing of ours behind it (BatchNorm's num_batches_tracked) is read to be an integer."""
    value = validate.host_array(value, f"state_dict[{key!r}]")
    if value.shape != () or not np.issubdtype(value.dtype, np.integer):
        raise TypeError(f"state_dict[{key!r}]: expected an integer count (torch's int64 scalar), got "
                        f"{value.dtype} of shape {value.shape}")


def _permuted_shape(param: nnx.Variable, entry: Entry) -> tuple[int, ...]:
    """The shape of one of `entry.params` in torch's axis order, before any axes are merged."""
    shape = tuple(param[...].shape)
    return shape if entry.axes is None else tuple(shape[a] for a in entry.axes)


def _part_shape(param: nnx.Variable, entry: Entry) -> tuple[int, ...]:
    """The shape one of `entry.params` takes inside torch's tensor: permuted, then its axes merged."""
    shape = _permuted_shape(param, entry)
    return shape if entry.groups is None else tuple(math.prod(shape[a] for a in run) for run in entry.groups)


def _torch_shape(entry: Entry) -> tuple[int, ...]:
    """The shape of torch's tensor for `entry`: its parts' shapes, concatenated along the first axis."""
    if not entry.params:
        return ()
    shapes = [_part_shape(param, entry) for param in entry.params]
    return (sum(shape[0] for shape in shapes), *shapes[0][1:])


def _to_torch(entry: Entry) -> np.ndarray:
    """torch's tensor for `entry`: each param permuted and flipped, its axes merged, the parts one above the other."""
    parts = []
    for param in entry.params:
        value = np.asarray(param[...])
        value = np.flip(value if entry.axes is None else value.transpose(entry.axes), entry.flip)
        parts.append(value.reshape(_part_shape(param, entry)))
    return np.concatenate(parts)


def _from_torch(entry: Entry, value: np.ndarray) -> list[tuple[nnx.Variable, jax.Array]]:
    """torch's tensor for `entry` as the value of each of its params: split along the first axis, the merged axes
    unmerged, the flip and the permutation undone."""
    out, start = [], 0
    for param in entry.params:
        rows = _part_shape(param, entry)[0]
        part = np.flip(value[start:start + rows].reshape(_permuted_shape(param, entry)), entry.flip)
        out.append((param, jnp.asarray(part if entry.axes is None else part.transpose(np.argsort(entry.axes)))))
        start += rows
    return out


def _prefix_hint(expected: list[str], state_dict: Mapping[str, Any]) -> str:
    """The usual cause of a key mismatch, said: a value of `state_dict` is the state_dict (a training checkpoint,
    `{"model_state_dict": ..., "optimizer_state_dict": ..., "epoch": ...}`); every expected key is in it under one
    prefix (a model wrapped in DataParallel saves `module.`-prefixed keys; a larger model holds this one as `rnn.`);
    or it is every expected key without one (the state_dict of a submodule of `module`)."""
    given = list(state_dict)
    for name, value in state_dict.items():
        if isinstance(value, Mapping) and set(expected) <= set(value):
            return f"; state_dict[{name!r}] holds every expected key (a training checkpoint's model part): load that"
    for keys, inside in ((given, expected), (expected, given)):
        key = next((k for k in keys if inside and k.endswith(inside[0]) and k != inside[0]), None)
        prefix = key and key[: -len(inside[0])]
        if prefix and {prefix + k for k in inside} <= set(keys):
            if keys is given:
                return (f"; every expected key is there with the prefix {prefix!r}: pass "
                        f"{{k.removeprefix({prefix!r}): v for k, v in state_dict.items() if k.startswith({prefix!r})}}")
            return f"; given are the keys of its submodule {prefix[:-1]!r} alone: load them into that submodule"
    return ""


# Flax's own recurrent cells and the jsr cell in torch's layout that replaces each.
FLAX_CELLS = {"LSTMCell": "LSTMCell", "OptimizedLSTMCell": "LSTMCell", "GRUCell": "GRUCell", "SimpleCell": "RNNCell"}


def _flax_cell_hint(module: nnx.Module) -> str:
    """A model holding Flax's own nnx.LSTMCell/GRUCell/...: their gates are other Linear layers than torch's, with
    one bias where torch has two (GRU: none inside r * (W_hn h + b_hn)), so no torch key maps to them; said, naming
    the jsr cell to build instead."""
    for path, node in nnx.iter_graph(module):
        name = type(node).__name__
        if name in FLAX_CELLS and type(node).__module__.startswith("flax."):
            where = ".".join(map(str, path)) or "the module"
            return (f"; {where} is Flax's nnx.{name}, whose gates are other layers than torch's: build it as "
                    f"jsr.{FLAX_CELLS[name]}, torch's layout")
    return ""


def _arguments_hint(layout: list, state_dict: Mapping[str, Any]) -> str:
    """For the keys of a torch.nn.LSTM/GRU (the module's own, or a submodule's, such as the Traveller's
    `lstm_layers.`), the constructor each side was built with, when they differ: a porter sees "torch.nn.LSTM(4, 16,
    num_layers=2) ... jsr.LSTM(4, 8)" instead of working it out from keys and shapes."""
    ours_all = {entry.key: _torch_shape(entry) for entry in layout}
    theirs_all = {k: tuple(np.shape(v)) for k, v in state_dict.items()}
    for prefix in (k.removesuffix("weight_ih_l0") for k in ours_all if k.endswith("weight_ih_l0")):
        theirs, ours = (_rnn_arguments({k.removeprefix(prefix): v for k, v in shapes.items() if k.startswith(prefix)})
                        for shapes in (theirs_all, ours_all))
        if theirs is None or ours is None or theirs == ours:
            continue
        if not prefix:
            return f"; the state_dict comes from torch.nn.{theirs}, this model is jsr.{ours}: build it with the same arguments"
        return f"; its {prefix[:-1]!r} is a torch.nn.{theirs}, this model's a {ours}"
    return ""


def _rnn_arguments(shapes: Mapping[str, tuple]) -> str | None:
    """`LSTM(input_size, hidden_size, ...)` as torch's keys and shapes tell it (the layout in layers.py), or None
    for other keys."""
    if len(shapes.get("weight_ih_l0", ())) != 2 or len(shapes.get("weight_hh_l0", ())) != 2:
        return None
    projection = shapes.get("weight_hr_l0", (0, 0))
    hidden = projection[1] if projection[0] else shapes["weight_hh_l0"][1]
    kind = {4: "LSTM", 3: "GRU", 1: "RNN"}.get(shapes["weight_ih_l0"][0] // max(hidden, 1))
    if kind is None:
        return None
    layers = next(k for k in itertools.count(1) if f"weight_ih_l{k}" not in shapes)
    arguments = [str(shapes["weight_ih_l0"][1]), str(hidden)]
    arguments += [f"num_layers={layers}"] * (layers > 1) + ["bias=False"] * ("bias_ih_l0" not in shapes)
    arguments += ["bidirectional=True"] * ("weight_ih_l0_reverse" in shapes)
    arguments += [f"proj_size={projection[0]}"] * (projection[0] > 0)
    return f"{kind}({', '.join(arguments)})"


def save_safetensors(state_dict: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write a state_dict (numpy arrays or torch tensors) as `.safetensors`, readable by torch/safetensors.

    Each value keeps its dtype (bfloat16 included). Written atomically (`runlog.write_atomically`: an
    interrupted save leaves no half file), with the permissions a plain `open` gives (safetensors' own `save_file`
    leaves its files readable by their owner only). Raises OSError naming `path` when it cannot be written (a
    directory, a missing folder, no permission).
    """
    from safetensors.numpy import save

    from jax_scan_rnn.runlog import write_atomically

    _check_mapping(state_dict)
    data = save({k: np.ascontiguousarray(_to_numpy(k, v)) for k, v in state_dict.items()})
    write_atomically(path, lambda f: f.write(data), binary=True)  # an OSError names `path`


def load_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a `.safetensors` file into `{key: np.ndarray}` (e.g. one written by `safetensors.torch`).

    Raises:
      FileNotFoundError: no file at `path`.
      IsADirectoryError: `path` is a directory.
      ValueError: the file is not a whole `.safetensors` file (truncated, say, by an interrupted copy), or is a
        `torch.save` file.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = os.fspath(path)
    # safetensors' own messages do not say which file, or that it was the file that was bad.
    if os.path.isdir(path):
        raise IsADirectoryError(f"load_safetensors: expected a .safetensors file, got the directory {path!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_safetensors: no file at {path!r}")
    try:
        return load_file(path)
    except SafetensorError as err:
        if _file_kind(path) == "torch":
            raise ValueError(f"load_safetensors: {path!r} is a torch.save file (zip or pickle), not a .safetensors "
                             "file: read it with torch.load(path, weights_only=True)") from None
        raise ValueError(
            f"load_safetensors: {path!r} is not a whole .safetensors file (truncated or corrupt): {err}"
        ) from err


def _file_kind(path: str) -> str | None:
    """"safetensors", "torch" (a torch.save file) or None (neither mark), from the file's first 9 bytes: a safetensors
    file starts with its header's length (8 bytes) and the header's "{", a torch.save file with a zip's or a pickle's
    mark (whose 9th byte is never "{"). The "{" is looked at first: a header of 128 + 256k bytes starts with the
    pickle's mark, 0x80, as its length's low byte (one safetensors file in 32 was read as a pickle)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:] == b"{":
        return "safetensors"
    return "torch" if head.startswith((b"PK", b"\x80")) else None


def side_file(path: str | os.PathLike) -> Path:
    """The side file of an exported state_dict FILE: FILE.json beside it (what the weights are of no use without:
    the Traveller's feature statistics, the SeqVAE's arguments and vocabulary). Named after the export, so another
    export's side file is never replaced."""
    return Path(f"{os.fspath(path)}.json")


def read_state_dict_file(path: str | os.PathLike, argname: str = "path") -> dict[str, Any]:
    """The state_dict in a `.pt`/`.pth` file (`torch.save`; read with `weights_only=True`, torch needed) or a
    `.safetensors` file, as `{key: tensor or np.ndarray}` for `load_torch_state_dict`.

    Raises FileNotFoundError (no file), ValueError (another suffix, or a file that is not a whole state_dict),
    each naming `argname` and the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{argname}: no file at {path}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".pt", ".pth", ".safetensors"):
        raise ValueError(f"{argname}: expected a .pt, .pth or .safetensors file, got {os.path.basename(path)}")
    # Read as what it holds, whatever its suffix says (a safetensors file named .pt, or the other way).
    kind = _file_kind(path)
    if kind == "safetensors" or (kind is None and suffix == ".safetensors"):
        try:
            return load_safetensors(path)
        except ValueError as err:
            raise ValueError(f"{argname}: {err}") from None
    from jax_scan_rnn.optional import require

    torch = require("torch", "reading a .pt state_dict")
    try:
        with open(path, "rb") as f:  # a file object: torch reads a path named .safetensors as safetensors
            return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle and zip errors of every kind: the file is the problem
        if "Unsupported global" in str(err):  # torch.save(model): a pickled module, which weights_only refuses
            raise ValueError(f"{argname}: {path} holds pickled Python objects (a whole module saved with "
                             "torch.save(model)?), not a state_dict of tensors: save model.state_dict() "
                             "instead") from None
        first = (str(err).strip().splitlines() or [""])[0]  # torch's own lines after it advise weights_only=False
        raise ValueError(f"{argname}: {path} is not a readable torch state_dict "
                         f"({type(err).__name__}: {first})") from None


def load_state_dict_file(module: nnx.Module, state_dict: Mapping[str, Any], path: str | os.PathLike, argname: str,
                         sizes: str) -> dict[str, str]:
    """`load_torch_state_dict(module, state_dict)` for the state_dict read from the file `path`
    (`read_state_dict_file`): one that does not fit raises ValueError naming `argname`, the file and `sizes` (what
    must match). Returns `{path, sha256}`: what a run's metadata keeps of the file it started from."""
    import hashlib

    try:
        load_torch_state_dict(module, state_dict)
    except (KeyError, ValueError, TypeError) as err:
        message = err.args[0] if isinstance(err, KeyError) else str(err)
        # other keys or shapes: another model's sizes; a NaN or a dtype is the file's own fault
        sized = "keys do not match" in message or "expected shape" in message
        hint = f"; its sizes must match {sizes}" if sized else ""
        raise ValueError(f"{argname}: {os.fspath(path)} does not fit this model ({message}){hint}") from None
    with open(path, "rb") as f:
        return {"path": os.fspath(path), "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
