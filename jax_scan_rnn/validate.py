"""Argument checks shared by the whole package: one wording, and a bool is never a number.

Each check returns the value (as a Python int/float where it is one) or raises with one line that names
the argument, what was expected and what was given:

    integer("hidden_size", 0, lo=1)      ValueError: hidden_size: expected an int >= 1, got 0
    integer("unroll", "x", lo=1, also=("auto",))
                                         ValueError: unroll: expected 'auto' or an int >= 1, got 'x'
    real("dropout", 1.0, lo=0, hi=1, hi_open=True)
                                         ValueError: dropout: expected a finite number in [0, 1), got 1.0
    boolean("bias", 1)                   TypeError: bias: expected True or False, got 1
    choice("lr_schedule", "cos", ("constant", "cosine"))
                                         ValueError: lr_schedule: expected one of 'constant', 'cosine', got 'cos'
    shape("eps", eps, (4, None), "[B, Z]")
                                         ValueError: eps: expected shape [B, Z] = [4, Z], got [4]

Options (`choice`, `also`) match by equality, except that a bool matches only a bool (1 is not True).
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import jax
    import torch

# What a model's call takes as an array (`floating_array`, `host_array` read it): a JAX or NumPy array, a Python
# scalar, or a torch tensor. For type checkers and readers; each call checks the values it is given.
ArrayInput: TypeAlias = "jax.typing.ArrayLike | torch.Tensor"

# The largest seed an option takes: an unsigned 32-bit int, every tool's range (NumPy's legacy seeding too), and two
# of them added (a task's data seed and the run's) stay far inside the int64 that JAX's keys take (a larger
# --seed crashed there with an OverflowError).
SEED_MAX = 2**32 - 1


def integer(name: str, value: Any, lo: int | None = None, hi: int | None = None, *, none: bool = False,
            also: Iterable[Any] = ()) -> Any:
    """An int (or NumPy integer, not a bool) in [lo, hi]; None passes when `none`, and so does each value
    of `also` (e.g. "auto"), returned as it is."""
    extra = ((None,) if none else ()) + tuple(also)
    if any(_same(value, a) for a in extra):
        return value
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    if not ok or (lo is not None and value < lo) or (hi is not None and value > hi):
        either = "".join(f"{a!r} or " for a in extra)
        if _traced(value):  # a NumPy or JAX scalar under jsr.jit / jax.jit: "got JitTracer(int32[])" said not why
            raise ValueError(f"{name}: expected {either}an int{_bounds(lo, hi)}, a static one (a Python int: under "
                             f"jit a NumPy or JAX scalar is traced), got a traced {value.aval.str_short()}")
        raise ValueError(f"{name}: expected {either}an int{_bounds(lo, hi)}, got {value!r}")
    return int(value)


def real(name: str, value: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
         hi_open: bool = False, none: bool = False) -> float | None:
    """A finite real number (not a bool) in the interval given by lo/hi, each closed unless `*_open`."""
    if value is None and none:
        return None
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        v = float(value)
        ok = (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or (v < hi if hi_open else v <= hi))
    if not ok:
        if lo is not None and hi is not None:
            where = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        elif lo is not None:
            where = f" {'>' if lo_open else '>='} {lo:g}"
        elif hi is not None:
            where = f" {'<' if hi_open else '<='} {hi:g}"
        else:
            where = ""
        raise ValueError(f"{name}: expected {'None or ' if none else ''}a finite number{where}, got {value!r}")
    return float(value)


def real_or_array(name: str, value: Any, **bounds: Any) -> Any:
    """A number is checked with `real` (and `bounds`); an array (perhaps traced under `jit`, whose values cannot be
    seen) or a list, tuple or range of numbers (a schedule evaluated at several steps) is returned as it is: the
    caller's to check. Anything else (None, a string) is refused as `real` refuses it: JAX read "5" as 5.0 and failed
    on None with a message naming no argument."""
    array_like = hasattr(value, "shape") or isinstance(value, (list, tuple, range))
    if isinstance(value, Real) or not array_like:  # bools included: `real` refuses them
        real(name, value, **bounds)
    return value


def boolean(name: str, value: Any) -> bool:
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # as NumPy ints are sizes
        return bool(value)
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return value


def choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = tuple(choices)
    if not any(_same(value, c) for c in choices):
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def function(name: str, value: Any, *, none: bool = False) -> Any:
    if not (callable(value) or (none and value is None)):
        raise TypeError(f"{name}: expected {'None or ' if none else ''}a callable, got {type(value).__name__}")
    return value


def instance(name: str, value: Any, cls: type | tuple[type, ...]) -> Any:
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise TypeError(f"{name}: expected {names}, got {type(value).__name__}")
    return value


def strings(name: str, value: Any, *, each: bool = True) -> list:
    """A list from an iterable of strings (SMILES, sequences); one string alone is a TypeError, since iterating it
    would read each character as a molecule. `each`: every element must be a str (False: left to the caller,
    e.g. MOSES's metrics, which count a non-string as invalid)."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{name}: expected a list of strings, got a single {type(value).__name__} {value[:40]!r} "
                        f"(one molecule is a list of one: [{value[:40]!r}])")
    items = list(value)
    for i, item in enumerate(items if each else ()):
        if not isinstance(item, str):
            raise TypeError(f"{name}: expected strings, got {type(item).__name__} at index {i}")
    return items


def saved_names(name: str, saved: Any, known: Iterable[str]) -> None:
    """Settings saved with a run (`saved`, a dict) hold only names this version knows (`known`): a name it has no
    field for comes from a newer jax-scan-rnn, and reading past it would drop a setting the run was trained with.
    ValueError naming them, instead of Python's "unexpected keyword argument"."""
    unknown = sorted(set(saved) - set(known))
    if unknown:
        raise written_by_another_version(name, f"the run's saved settings hold {listed(unknown, 5)}, which this "
                                               "version does not know")


def written_by_another_version(name: str, found: str) -> ValueError:
    """The error for what another jax-scan-rnn (a newer one, as a rule) wrote and this one cannot read: `found`
    says what, and the message names this version and the cure."""
    from jax_scan_rnn import __version__

    return ValueError(f"{name}: {found}: it was written by another jax-scan-rnn than this one ({__version__}); read "
                      "it with that one (pip install -U jax-scan-rnn)")


def shape(name: str, value: Any, expected: tuple[int | None, ...], symbols: str) -> None:
    """ValueError unless `value`'s shape is `expected`, each size as given or, for None, any size >= 1; `symbols`
    spells the shape, e.g. "[B, Z]", and the message gives it with the sizes known: `[B, Z] = [4, Z]`."""
    import numpy as np

    got = tuple(np.shape(value))  # an array's, a torch tensor's, a nested list's
    if len(got) != len(expected) or any(n != e if e is not None else n == 0 for n, e in zip(got, expected)):
        spelled = ", ".join(s if e is None else str(e) for s, e in zip(symbols[1:-1].split(", "), expected))
        raise ValueError(f"{name}: expected shape {symbols} = [{spelled}], got {list(got)}")


def listed(items: Sequence[Any], shown: int) -> str:
    """The first `shown` of `items` as reprs, and how many more: "'a', 'b' and 5 more" ("" for none), for a
    message that would otherwise run to kilobytes (every leaf of another optimiser's state)."""
    head = ", ".join(map(repr, items[:shown]))
    return head + (f" and {len(items) - shown} more" if len(items) > shown else "")


def first_bad(name: str, values: Any, bad: Any, what: str) -> str:
    """"name[i, j]=value" of the first True entry of the NumPy mask `bad`, and how many `what` are out of range
    when more than one: what an error message says of an array with bad entries."""
    import numpy as np  # here: the rest of this module is plain Python

    where = np.argwhere(bad)
    index = tuple(int(i) for i in where[0])
    text = f"{name}[{', '.join(map(str, index))}]={values[index]}"
    return text + (f" ({len(where)} {what} out of range)" if len(where) > 1 else "")


def host_array(value: Any, name: str = "value") -> Any:
    """`value` (host data: NumPy, a list, a torch tensor, anything with `__array__`) as a NumPy array; a torch
    tensor is detached and copied to the host first (NumPy refuses one that requires grad or lives on a GPU), in its
    own dtype (bfloat16 included); TypeError naming `name` for a torch dtype no array library here holds."""
    import numpy as np

    return np.asarray(_untorched(value, name))


def from_torch(tree: Any) -> Any:
    """`tree` with each torch tensor in it as `host_array` gives it, everything else as it is: an eager call takes
    torch tensors (an input, a state `(h, c)`) as `jsr.jit` does, where JAX alone refuses a tensor that requires
    grad or lives on a GPU, and cannot read a torch dtype."""
    import jax

    return jax.tree.map(_untorched, tree)


def float_dtype(name: str, value: Any, *, none: bool = False) -> Any:
    """`value`, a floating dtype (`jnp.bfloat16`, `"float16"`, `np.dtype("float64")`, or torch's `torch.float64`, which
    means the dtype of its name, as in code copied from PyTorch), as its scalar type (`jnp.float64`, ...); None
    with `none`. TypeError naming `name` for anything else (NumPy alone says "data type 'bf16' not understood",
    naming no argument). Python's `float`, and None without `none`, are `float`: JAX's default floating dtype
    where it is used, not a float64 that JAX truncates with a warning when x64 is off."""
    import jax.numpy as jnp

    if value is None and none:
        return None
    if value is float or value is None:  # JAX's default float (float32, float64 under x64), as jax.random's
        return float  # dtype=None means; not the float64 NumPy reads both as
    given = value
    if type(value).__module__ == "torch":  # a torch.dtype: "torch.bfloat16" -> "bfloat16"
        value = str(value).removeprefix("torch.")
    try:
        dtype = None if isinstance(value, bool) else jnp.dtype(value)
    except (TypeError, ValueError, SyntaxError):  # NumPy parses a string with a comma as a struct: "f4,," SyntaxError
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name}: expected {'None or ' if none else ''}a floating dtype (jnp.bfloat16, 'float16', "
                        f"torch.float64, ...), got {given!r}")
    return dtype.type


def model_dtype(name: str, value: Any, *, none: bool = False) -> Any:
    """`float_dtype(name, value, none=none)` for a dtype a model computes or keeps weights in: float64 with JAX's
    64-bit mode off is float32, as JAX makes it, with a warning at the caller's line naming `name` and the switch
    (JAX's own warning named a line inside the model's initialiser, and not the argument)."""
    import jax
    import jax.numpy as jnp

    dtype = float_dtype(name, value, none=none)
    if dtype not in (None, float) and jax.dtypes.canonicalize_dtype(dtype) != dtype:
        warnings.warn(f"{name}: {jnp.dtype(dtype).name} is {jax.dtypes.canonicalize_dtype(dtype).name} while JAX's "
                      "64-bit mode is off (jax.config.update('jax_enable_x64', True) before building the model keeps "
                      f"{jnp.dtype(dtype).name})", UserWarning, stacklevel=user_stacklevel())
        dtype = jax.dtypes.canonicalize_dtype(dtype).type
    return dtype


def floating_array(name: str, value: Any, like: Any = None) -> Any:
    """`value` (a JAX or NumPy array, a torch tensor as `from_torch` reads it, a list) as a JAX array of a floating
    dtype: what every model's input is checked for first. TypeError naming `name` for another dtype, or for what is no
    array (None, a string, a tuple of arrays of different shapes: a state passed where the input goes). With `like`
    (the parameters' dtype), promoted to the dtype that holds both (`jnp.promote_types`), the dtype the model then
    computes in, as Flax's layers do: a float16 or bfloat16 input to float32 weights runs in float32, never in
    the lower precision silently (torch refuses the mismatch; `compute_dtype` asks for low-precision matmuls)."""
    import jax.numpy as jnp

    host = from_torch(value)  # (its own error for a torch dtype no array library here holds)
    try:
        x = jnp.asarray(host)
    except (TypeError, ValueError):  # JAX's own message ("None is not a valid value for jnp.array") names no argument
        raise TypeError(f"{name}: expected a floating array, got {type(value).__name__}") from None
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name}: expected a floating dtype, got {x.dtype}")
    return x if like is None else x.astype(jnp.promote_types(x.dtype, like))


def _untorched(value: Any, name: str = "value") -> Any:
    if not (type(value).__module__.startswith("torch") and hasattr(value, "detach")):
        return value
    value = value.detach().cpu()
    dtype = str(value.dtype).removeprefix("torch.")
    if value.is_floating_point() and dtype not in ("float16", "float32", "float64"):
        # NumPy has no bfloat16/float8, so torch's .numpy() refuses them; float32 holds each of their values exactly,
        # and JAX's NumPy dtype of the same name (ml_dtypes') gives the dtype back.
        import jax.numpy as jnp

        if not hasattr(jnp, dtype):
            raise TypeError(f"{name}: expected a dtype NumPy or JAX can hold, got {value.dtype}")
        return value.float().numpy().astype(getattr(jnp, dtype))
    return value.numpy()


def not_packed(name: str, value: Any, instead: str) -> None:
    """TypeError naming `name` when `value` is a torch `PackedSequence` (a namedtuple: JAX would take it apart as a
    pytree and fail inside the model); `instead` says what the model takes."""
    if type(value).__name__ == "PackedSequence" and type(value).__module__.startswith("torch"):
        raise TypeError(f"{name}: expected an array, got a torch PackedSequence; {instead}")


def user_stacklevel() -> int:
    """The `warnings.warn` stacklevel, for the function that calls this, that names the user's own line: the first
    frame outside this package and Flax (an NNX module's constructor runs under Flax's metaclass, and a model
    builds its layers: a fixed stacklevel named a line of Flax's or of the model)."""
    inside = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                   for module in (sys.modules[__package__], sys.modules.get("flax")) if module is not None)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _traced(value: Any) -> bool:
    """Whether `value` is a JAX tracer (JAX not imported: it cannot be one)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.core.Tracer)


def _bounds(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" >= {lo}"
    return f" <= {hi}" if hi is not None else ""


def _same(value: Any, option: Any) -> bool:
    """Equal, and a bool only to a bool (1 is not True); an array equals no option."""
    if isinstance(value, bool) != isinstance(option, bool):
        return False
    try:
        return bool(value == option)
    except (TypeError, ValueError):  # an array or a tracer: no single truth value
        return False
