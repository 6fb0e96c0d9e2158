"""`jsr.jit(model)`: the one compiled way to call an NNX model, at the per-call cost of a bare `jax.jit`.

    fast = jsr.jit(model)
    positions = fast(x)                      # model(x), compiled once per input shapes/dtypes
    tokens = fast.generate(z, 100)           # any public method; 100 is static (part of the compile key)
    fast.eval(); fast.module                 # model.eval(), and the model itself

Why a wrapper of its own (figures: `benchmarks/results/call-overhead-cpu-2core.txt`, explained in
docs/scan_vs_loop.md, "Calling the compiled loop"):

- Eager, `model(x)`: every call builds its scan body as a new Python function, and JAX's trace and
  compile caches key on function identity, so each call traces and compiles the whole loop again, and JAX
  keeps each program. A second eager call from one line of code says so (`scan.EagerCallWarning`).
- `nnx.jit(lambda m, x: m(x))(model, x)`: compiled once, but every call walks the module graph in Python,
  splitting it into graphdef and state on the way in and merging the updates back on the way out
  (`nnx.cached_partial` caches the walk but still writes every Variable back).
- A bare `jax.jit` of `nnx.merge(graphdef, state)(x)` with the `nnx.split` state passed in: the state's
  leaves are Variables, pytree nodes that JAX flattens in Python on every call.
- This module: the graph is walked once, at `jsr.jit(model)` (`nnx.graph.flatten`), keeping the graphdef
  and the flat list of the model's Variable objects. A call reads their current values into a flat list,
  passes it with the call's arrays to a `jax.jit` of "merge, call the method, return the state leaves
  that changed", and writes those back: the per-call cost of a bare `jax.jit` or less.

What a call sees:
- Weights: the current value of every Variable, read at each call, so `jsr.load_torch_state_dict`,
  `nnx.update`, `variable[...] = ...` and an optax / `nnx.Optimizer` step (all of which set values on the
  same Variable objects) take effect at the next call, with no recompile unless a shape or dtype changed.
- RNG streams: an `nnx.Rngs` stream's count is a Variable that each draw (a dropout mask, a sample)
  increments. The traced call returns the state leaves it replaced (found at trace time: each leaf that
  is not the very tracer it was given) and they are written back after the call, so consecutive calls
  draw new masks, the same sequence as eager calls on an identically seeded model. Other Variables a call
  sets (BatchNorm's running statistics in train mode) are written back the same way.
- Mode: `model.train()` / `model.eval()` flip static attributes (`MODE_ATTRIBUTES`: `deterministic` on
  `nnx.Dropout`, `use_running_average` on `nnx.BatchNorm`) that live in the graphdef, not in the state.
  The (submodule, attribute) pairs of those flags are collected once; each call reads their values (one
  `getattr` per flag) into the compile key, and a new combination is flattened and compiled once, so
  `model.eval()` after `jsr.jit(model)` takes effect at the next call. `fast.train(**attrs)` /
  `fast.eval(**attrs)` also start watching any extra attribute named there.
- Arguments, as Equinox's `filter_jit`: array leaves (`jax.Array`, `np.ndarray`, NumPy scalars) of the
  arguments are traced, and so is array data from other libraries (a `torch.Tensor`, detached and copied to
  the host; anything with `__array__`), as a NumPy array: a torch tensor is data, not a compile key (as a
  static leaf it would compile again at every call). So is an argument that is a list of Python numbers
  (nested lists too: `lengths=[5, 3]`, as torch takes them), as `np.asarray` of it; a tuple stays a pytree
  (`(h, c)`), its numbers static. Every other leaf (Python int/float/bool/str/None, a
  dtype, ...) is static, part of the compile key, so `generate(z, 100)` compiles for 100 and the model's
  Python checks on such values run concretely (a bad value raises the model's own error). Pass `jnp.asarray(0.7)` rather than `0.7` to
  make a scalar traced (one compile for all its values). One compile per (argument structure, static
  values, array shapes/dtypes, mode).
- Values a traced call cannot check: a model may define `check_arguments(method, args, kwargs)`, which a
  call runs first on the arguments as given (`jsr.LSTM`/`GRU` check host `lengths`, `SeqVAE` host `tokens`
  and `lengths`, with an eager call's errors). It reads host data only (NumPy, lists, torch tensors):
  reading a `jax.Array` back would wait for the device, so those are handled as under `jax.jit`.

Not supported, and how it fails:
- Structural changes after `jsr.jit(model)`: replacing a submodule or a Variable object, or changing a
  static attribute other than a mode flag; the compiled calls hold the graphdef and Variables flattened
  at `jsr.jit`. Replacing one of the model's own attributes (`model.decoder = ...`) raises at the next
  call (a few identity checks per call); any change raises at the next trace (a new shape, static value
  or mode, where the model is flattened again and compared); a change deeper in the model followed by
  calls that reuse a compiled function is NOT seen. Call `jsr.jit(model)` again after such a change (it
  returns the same `Compiled` while the structure is unchanged, a new one after a change).
- A call that changes the model's structure itself (a new attribute, `Module.sow`): `RuntimeError`.
- Gradients with respect to the parameters: `fast` reads them itself, so `jax.grad` of a function that
  calls `fast` cannot reach them; a training step takes the model as an argument of the differentiated
  function (`nnx.value_and_grad` under `nnx.jit`) and calls that argument. `fast` called inside an NNX
  transform given its own model (`nnx.grad(lambda m: fast(x).sum())(model)`, an `nnx.jit` step) raises
  `RuntimeError`: it would read the outer model's weights as constants there (zero gradients, stale weights).
- Modules or Variables passed as arguments are plain pytrees to `fast`: their updates are not written back.
- Inside another JAX transformation (`jax.jit`, `vmap`, `grad` over the inputs) `fast` works when the
  call changes no state (eval mode); a call that would write a traced rng count back raises
  `RuntimeError` (call the model directly there).
- Variables created with `hijax=True` or `ref=True` (mutable array references): `TypeError` at `jsr.jit`.
"""
from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, ParamSpec, Protocol, Self, TypeVar, overload

import jax
import numpy as np
from flax import nnx

from jax_scan_rnn import validate, xla_flags
from jax_scan_rnn.scan import trace_state_clean as _trace_state_clean  # False where JAX moved it: nested

try:  # the NNX transforms in progress, each with the outer objects it split (flax/nnx/graphlib.py, UpdateContext)
    from flax.nnx.graphlib import GRAPH_CONTEXT as _NNX_CONTEXT
except ImportError:  # pragma: no cover - moved in a later flax: the check below finds no transform
    _NNX_CONTEXT = None

Array = jax.Array

# The static attributes that `nnx.Module.train()` / `.eval()` flip (flax/nnx/module.py); they live in the
# graphdef, so a change needs a new graphdef and a new compile.
MODE_ATTRIBUTES = ("deterministic", "use_running_average")
# Leaves of the arguments that are traced; every other leaf is static (Equinox's `is_array`).
ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)

def mode_flags(module: nnx.Module, names: Sequence[str] = MODE_ATTRIBUTES) -> list[tuple[nnx.Module, str]]:
    """(submodule, attribute) for each submodule of `module` (itself included) that has an attribute in `names`."""
    return [(sub, name) for _, sub in nnx.iter_modules(module) for name in names if name in vars(sub)]


_TRACED = object()  # placeholder for a traced leaf in a compile key and in the static leaves
_MISSING = object()


# The compiled functions of each live module, and the `Compiled` last returned for it while one is held:
# `jsr.jit(model)` called again (inline, or by library code that gets a model passed in) reuses them instead of
# compiling anew, after one graph walk that checks the structure is unchanged (a changed one gets fresh ones).
# Neither value holds the module (a weak key's value that did would keep it, its weights and its programs alive
# for the whole session: every model a notebook ever compiled); the `Compiled` a user holds does.
_COMPILED: weakref.WeakKeyDictionary[nnx.Module, tuple[_Core, weakref.ref]] = weakref.WeakKeyDictionary()


P = ParamSpec("P")
R = TypeVar("R", covariant=True)


class CallableModel(Protocol[P, R]):
    """An `nnx.Module` with a `__call__`, as a type checker sees it: `jit` gives the `Compiled` its signature."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...
    def train(self, **attributes: Any) -> None: ...
    def eval(self, **attributes: Any) -> None: ...


@overload
def jit(module: CallableModel[P, R], *, mode_attributes: Sequence[str] = ...) -> Compiled[P, R]: ...
@overload
def jit(module: nnx.Module, *, mode_attributes: Sequence[str] = ...) -> Compiled[..., Any]: ...
def jit(module: Any, *, mode_attributes: Sequence[str] = MODE_ATTRIBUTES) -> Compiled:
    """A compiled view of `module`: `jit(model)(*args)` is `model(*args)`, `jit(model).m(...)` is `model.m(...)`.

    Args:
      module: the `nnx.Module` to call; its structure is flattened now, its weights are read at each call.
      mode_attributes: names of static attributes whose current value, on every submodule that has
        them, is part of the compile key (default: the flags `train()` / `eval()` flip).

    Returns:
      `Compiled`, the same one for the same module while its structure is unchanged and the last one is
      held (else a new one on the same compiled functions), so calling `jsr.jit(model)` again costs one graph
      walk, not a compile. It holds the model; the cache behind it does not (a dropped model is freed). See
      the module docstring for what a call sees (weights, rng streams, mode), which arguments are static,
      and what is not supported.
    """
    core, handle = _COMPILED.get(module, (None, None))
    if (
        core is not None
        and core._mode_names == _mode_names(mode_attributes)
        and core._current_graphdef(core._mode()) is not None
    ):
        fast = handle()
        if fast is None:  # the last one was dropped: a new handle on the same compiled functions
            fast = Compiled(module, mode_attributes=mode_attributes, _core=core)
            _COMPILED[module] = (core, weakref.ref(fast))
        return fast
    fast = Compiled(module, mode_attributes=mode_attributes)
    _COMPILED[module] = (fast._core, weakref.ref(fast))
    return fast


def _mode_names(mode_attributes: Any) -> tuple[str, ...]:
    if isinstance(mode_attributes, (str, bytes)) or not isinstance(mode_attributes, Iterable):
        raise TypeError(f"mode_attributes: expected a sequence of attribute names, got {mode_attributes!r}")
    names = tuple(mode_attributes)
    if not all(isinstance(a, str) for a in names):
        raise TypeError(f"mode_attributes: expected a sequence of attribute names, got {mode_attributes!r}")
    return names


def _path_text(path: tuple) -> str:
    return "/".join(map(str, path)) or "<root>"


def _get_at(root: Any, path: tuple) -> Any:
    node = root
    for key in path:
        node = getattr(node, key) if isinstance(key, str) else node[key]
    return node


def _set_at(root: Any, path: tuple, value: Any) -> None:
    parent = _get_at(root, path[:-1])
    if isinstance(path[-1], str):
        setattr(parent, path[-1], value)
    else:
        parent[path[-1]] = value


class Compiled(Generic[P, R]):
    """`jsr.jit(module)`: call it as the module, or call its public methods by name (compiled, cached).

    Typed as the module's `__call__` (`Compiled[P, R]`), so a checker reads `fast(x)` as it reads `model(x)`;
    a method by name (`fast.generate`) is a `CompiledMethod`, its result untyped.

    Attributes:
      module: the wrapped model (the same object, not a copy).
    """

    def __init__(self, module: nnx.Module, *, mode_attributes: Sequence[str] = MODE_ATTRIBUTES,
                 _core: _Core | None = None):
        # The one strong reference to the module: the compiled functions (`_core`, shared through the cache of
        # `jit`) hold it weakly, so a model is freed with the last `Compiled` of it.
        self._module = module
        self._core = _Core(module, mode_attributes) if _core is None else _core
        self._methods: dict[str, CompiledMethod] = {}
        self._call = CompiledMethod(self._core, "__call__", module)

    @property
    def module(self) -> nnx.Module:
        """The wrapped model."""
        return self._module

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """`module(*args, **kwargs)`, compiled (array leaves traced, other leaves static)."""
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> CompiledMethod:
        """`fast.name`: the module's public method `name`, compiled; AttributeError for anything else."""
        if name.startswith("_"):  # private and protocol names (`__deepcopy__`, ...) are not delegated
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if name not in self._methods:
            self._methods[name] = CompiledMethod(self._core, name, self._module)
        return self._methods[name]

    def train(self, **attributes) -> Self:
        """`module.train(**attributes)`; returns self. Extra attributes named here are watched as mode flags."""
        self._module.train(**attributes)
        self._core._watch(attributes)
        return self

    def eval(self, **attributes) -> Self:
        """`module.eval(**attributes)`; returns self. Extra attributes named here are watched as mode flags."""
        self._module.eval(**attributes)
        self._core._watch(attributes)
        return self

    def __repr__(self) -> str:
        return f"jsr.jit({type(self._module).__name__})"


class _Core:
    """What `Compiled` compiles and checks for one module, holding the module only weakly (see `_COMPILED`)."""

    def __init__(self, module: nnx.Module, mode_attributes: Sequence[str]):
        validate.instance("module", module, nnx.Module)
        mode_names = _mode_names(mode_attributes)
        self._ref = weakref.ref(module)
        graphdef, flat = nnx.graph.flatten(module, with_paths=True, graph=True)
        self._paths: tuple[tuple, ...] = tuple(flat.paths)
        self._leaves: list[Any] = list(flat.leaves)  # Variable objects (or a bare array attribute's value)
        readers: list[Callable[[], Any]] = []
        for path, leaf in zip(self._paths, self._leaves):
            if isinstance(leaf, nnx.Variable):
                if leaf.hijax or leaf.ref:
                    raise TypeError(
                        f"module: Variable at {_path_text(path)} was created with hijax=True or ref=True; "
                        "jsr.jit supports plain Variables only"
                    )
                readers.append(leaf.get_raw_value)
            else:  # an array attribute that is not a Variable (`nnx.data`): read by its path, rarely used
                readers.append(lambda path=path, ref=self._ref: _get_at(ref(), path))
        self._readers = readers
        self._mode_names = mode_names
        self._mode_refs: list[tuple[nnx.Module, str]] = []
        self._mode_ids: set[tuple[int, str]] = set()
        self._watch(self._mode_names)
        self._graphdefs = {self._mode(): graphdef}
        # The module's own node attributes (submodules, Variables) by identity: replacing one (the common
        # structural change) is then caught on every call for a few `dict.get`s.
        self._root_dict = vars(module)
        self._root_nodes = tuple(
            (name, value)
            for name, value in self._root_dict.items()
            if not name.startswith("_pytree__") and (nnx.graph.is_graph_node(value) or isinstance(value, nnx.Pytree))
        )
        self._fns: dict[str, dict[tuple, Callable]] = {}  # method name -> its compiled functions (CompiledMethod)

    @property
    def _module(self) -> nnx.Module:
        return self._ref()

    def _watch(self, names) -> None:
        """Add (submodule, attribute) for each submodule that has an attribute in `names` (a graph walk)."""
        if not names:
            return
        root = self._module
        for sub, name in mode_flags(root, names):
            if (id(sub), name) not in self._mode_ids:
                # the module itself by a proxy (getattr reads through it): a strong reference would keep it alive
                self._mode_refs.append((weakref.proxy(sub) if sub is root else sub, name))
                self._mode_ids.add((id(sub), name))

    def _mode(self) -> tuple:
        return tuple([getattr(m, a) for m, a in self._mode_refs])

    def _check_root(self) -> None:
        get = self._root_dict.get
        for name, value in self._root_nodes:
            if get(name) is not value:
                raise RuntimeError(
                    f"jsr.jit: {type(self._module).__name__}.{name} was replaced after jsr.jit(model); the "
                    "compiled calls still hold the old one. Call jsr.jit(model) again after structural changes."
                )

    def _current_graphdef(self, mode: tuple):
        """The module's graphdef now, or None if its structure is no longer the one flattened at jit (a graph walk)."""
        graphdef, flat = nnx.graph.flatten(self._module, with_paths=True, graph=True)
        same_leaves = len(flat.leaves) == len(self._leaves) and all(
            a is b or not isinstance(a, nnx.Variable) for a, b in zip(flat.leaves, self._leaves)
        )
        known = self._graphdefs.get(mode)
        if not same_leaves or tuple(flat.paths) != self._paths or (known is not None and known != graphdef):
            return None
        return graphdef

    def _graphdef(self, mode: tuple):
        """The graphdef for `mode`, after checking that the structure is still the one flattened at jit.

        A graph walk, run at each trace (a new compile); the per-call check sees the root only."""
        graphdef = self._current_graphdef(mode)
        if graphdef is None:
            raise RuntimeError(
                f"jsr.jit: the structure of {type(self._module).__name__} (its submodules, Variables or static "
                "attributes other than the mode flags) changed after jsr.jit(model). Call jsr.jit(model) again "
                "after structural changes."
            )
        self._graphdefs[mode] = graphdef
        return graphdef

    def _write_back(self, changed: dict[int, Any], nested: bool) -> None:
        for i, value in changed.items():
            # Inside a transformation a changed value is a tracer, or concrete but refused by Flax (a Variable is
            # set only at its own trace level: under jax.grad over the inputs, the count comes back concrete).
            if nested or isinstance(value, jax.core.Tracer):
                raise RuntimeError(
                    f"jsr.jit: the call changed {_path_text(self._paths[i])} (an rng count or other state) "
                    "inside another JAX transformation, where it cannot be written back to the model; call the "
                    "model directly there, or in eval mode"
                )
            leaf = self._leaves[i]
            if isinstance(leaf, nnx.Variable):
                leaf.set_raw_value(value)
            else:
                _set_at(self._module, self._paths[i], value)


class CompiledMethod:
    """One method of a `Compiled` model, compiled per (argument structure, static values, mode)."""

    __slots__ = ("_owner", "_module", "_name", "_fns", "_qualname", "_check")

    def __init__(self, owner: _Core, name: str, module: nnx.Module):
        cls = type(module)
        if name == "__call__":
            if not callable(module):
                raise TypeError(f"module: {cls.__name__} defines no __call__; call one of its methods instead")
        else:
            attr = inspect.getattr_static(module, name, _MISSING)
            if attr is _MISSING:
                raise AttributeError(f"jsr.jit: {cls.__name__} has no method {name!r}")
            if name in vars(nnx.Module):
                raise AttributeError(
                    f"jsr.jit: {cls.__name__}.{name} is an nnx.Module method, not one of the model's own that "
                    f"jsr.jit compiles; call fast.module.{name}"
                )
            if not inspect.isfunction(attr):
                hint = f"jsr.jit(model.{name})" if isinstance(attr, nnx.Module) else f"fast.module.{name}"
                raise AttributeError(
                    f"jsr.jit: {cls.__name__}.{name} is a {type(attr).__name__}, not a method; use {hint}"
                )
        self._owner = owner
        self._module = module  # held here (and by the Compiled), not by the owner shared through jit's cache
        self._name = name
        self._check = hasattr(module, "check_arguments")  # the model's checks of host values, if any
        self._fns = owner._fns.setdefault(name, {})
        self._qualname = f"{cls.__name__}.{name}"

    def __call__(self, *args, **kwargs):
        owner = self._owner
        if owner._root_nodes:
            owner._check_root()
        nested = not _trace_state_clean()  # inside jax.jit/vmap/grad: a jit without compiler options (_compile)
        if nested:
            self._refuse_inside_a_transform_of_the_model()
        elif self._check:
            self._module.check_arguments(self._name, args, kwargs)
        if any(type(a) is list for a in args) or any(type(a) is list for a in kwargs.values()):
            args, kwargs = _number_lists_as_arrays(args), _number_lists_as_arrays(kwargs)
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        arrays = []
        static = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, ARRAY_TYPES):
                if not hasattr(leaf, "__array__") or isinstance(leaf, type):
                    # The type too: 1, 1.0 and True are equal and hash alike, but a model may tell them apart.
                    static.append((type(leaf), leaf))
                    continue
                leaf = leaves[i] = validate.host_array(leaf)
            arrays.append(leaf)
            static.append(_TRACED)
        mode = tuple([getattr(m, a) for m, a in owner._mode_refs]) if owner._mode_refs else ()
        key = (mode, treedef, tuple(static), nested)
        try:
            fn = self._fns.get(key)
        except TypeError:
            raise TypeError(self._unhashable_message(args, kwargs)) from None
        if fn is None:  # a new argument structure: checked here, off the cached path (a refused one is never cached)
            for where, value in [*enumerate(args), *kwargs.items()]:  # JAX would take one apart, then fail rebuilding
                validate.not_packed(f"{self._qualname}: argument {where!r}", value,
                                    "pass a padded array (jsr.LSTM and jsr.GRU take lengths= too)")
            fn = self._fns[key] = self._compile(mode, treedef, leaves, nested)
        out, changed = fn([read() for read in owner._readers], arrays)
        if changed:
            owner._write_back(changed, nested)
        return out

    def __repr__(self) -> str:
        return f"jsr.jit({self._qualname})"

    def _refuse_inside_a_transform_of_the_model(self) -> None:
        """Inside an NNX transform given this very model (`nnx.grad(loss)(model)`, an `nnx.jit` step taking it),
        the function works on the transform's copy; `fast` would read the outer model's weights as constants:
        zero gradients, and a jitted step would keep the weights of its first trace. Refused, naming the fix."""
        if _NNX_CONTEXT is None or not _NNX_CONTEXT.update_context_stacks:
            return
        module = self._module
        for tag, stack in _NNX_CONTEXT.update_context_stacks.items():
            for context in stack:
                outer = getattr(context, "outer_ref_outer_index", None)
                if outer is not None and module in outer:
                    # nnx.grad's tag is "grad"; nnx.jit's its JitWrapped function
                    name = tag if isinstance(tag, str) else type(tag).__name__.lower().removesuffix("wrapped")
                    raise RuntimeError(
                        f"jsr.jit: {self._qualname} called inside nnx.{name} over the same model: the compiled "
                        "view reads the outer model's weights, which the transform does not trace (their gradients "
                        "would be zero, a jitted step would keep them as constants); call the model the function "
                        "is given there (`m(x)`)"
                    )

    def _unhashable_message(self, args: tuple, kwargs: dict) -> str:
        """Names each argument leaf that is static (not an array) but unhashable, so cannot be a compile key."""
        bad = []
        for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]:
            if not isinstance(leaf, ARRAY_TYPES) and not _hashable(leaf):
                where = ("args" if path[0].idx == 0 else "kwargs") + jax.tree_util.keystr(path[1:])
                bad.append(f"{where}: {type(leaf).__name__}")
        return (
            f"{self._qualname}: {'; '.join(bad)}: expected an array (traced) or a hashable value (static, part of "
            "the compile key), got an unhashable non-array"
        )

    def _compile(self, mode: tuple, treedef, leaves: list, nested: bool) -> Callable:
        """A `jax.jit` of merge -> method -> changed state leaves, for one compile key. `nested`: called inside
        another transformation, whose own compile then applies (JAX refuses compiler options on a nested jit)."""
        owner = self._owner
        name = self._name
        static_leaves = [_TRACED if isinstance(leaf, ARRAY_TYPES) else leaf for leaf in leaves]
        module_name = type(owner._module).__name__

        def run(values: list, arrays: list):
            # Here, at each trace (jax.jit retraces for new shapes under the same key), not in _compile.
            graphdef = owner._graphdef(mode)
            module = nnx.graph.unflatten(graphdef, values)
            it = iter(arrays)
            args, kwargs = jax.tree_util.tree_unflatten(
                treedef, [next(it) if leaf is _TRACED else leaf for leaf in static_leaves]
            )
            out = getattr(module, name)(*args, **kwargs)
            graphdef_after, after = nnx.graph.flatten(module, with_paths=False, graph=True)
            if graphdef_after != graphdef:
                raise RuntimeError(
                    f"jsr.jit: {module_name}.{name} changed the module's structure during the call (e.g. "
                    "Module.sow, a new attribute); jsr.jit supports calls that only set Variable values"
                )
            # A leaf the call did not set is the very tracer it was given; the others are written back.
            return out, {i: new for i, (new, old) in enumerate(zip(after, values)) if new is not old}

        run.__name__ = f"{module_name}.{name}".replace(".", "_")
        return jax.jit(run, compiler_options=None if nested else xla_flags.compiler_options())  # xla_flags.py


def _number_lists_as_arrays(arguments):
    """`arguments` (a tuple or dict) with each list whose leaves are all Python numbers as a NumPy array: data, as
    it is to torch and to the eager model, where as static leaves it would compile once per value."""
    def convert(value):
        if type(value) is list:
            leaves = jax.tree_util.tree_leaves(value)
            if leaves and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in leaves):
                try:
                    return np.asarray(value)
                except ValueError:  # ragged: left as it is, the model says what it expected
                    pass
        return value

    if isinstance(arguments, dict):
        return {k: convert(v) for k, v in arguments.items()}
    return tuple(convert(v) for v in arguments)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True
