"""The shared argument checks: one wording, bools are never numbers, the value comes back."""
import numpy as np
import pytest

from jax_scan_rnn import validate


@pytest.mark.parametrize("value", [True, False, 1.0, "3", None, 0, 11])
def test_integer_refuses_bools_floats_and_out_of_range(value):
    with pytest.raises(ValueError, match=r"^hidden_size: expected an int in \[1, 10\], got "):
        validate.integer("hidden_size", value, lo=1, hi=10)


def test_integer_returns_python_ints_and_allows_none_when_asked():
    assert validate.integer("n", np.int64(3), lo=1) == 3 and type(validate.integer("n", np.int64(3))) is int
    assert validate.integer("n", None, lo=1, none=True) is None
    with pytest.raises(ValueError, match=r"^n: expected None or an int >= 1, got 0$"):
        validate.integer("n", 0, lo=1, none=True)


@pytest.mark.parametrize("value", [True, float("nan"), float("inf"), 1.0, -0.1, "0.5"])
def test_real_refuses_bools_nonfinite_and_out_of_range(value):
    with pytest.raises(ValueError, match=r"^dropout: expected a finite number in \[0, 1\), got "):
        validate.real("dropout", value, lo=0, hi=1, hi_open=True)


def test_real_bounds_wording_and_return():
    assert validate.real("lr", 1, lo=0, lo_open=True) == 1.0
    with pytest.raises(ValueError, match=r"^lr: expected a finite number > 0, got 0$"):
        validate.real("lr", 0, lo=0, lo_open=True)
    with pytest.raises(ValueError, match=r"^x: expected a finite number <= 2, got 3$"):
        validate.real("x", 3, hi=2)
    with pytest.raises(ValueError, match=r"^lr: expected a finite number > 0, got True$"):  # in range as 1: a bool
        validate.real("lr", True, lo=0, lo_open=True)


def test_boolean_choice_function_instance():
    assert validate.boolean("bias", False) is False
    # A NumPy bool is a bool, as a NumPy int is a size (a config read from an array: TrainConfig(..., x=np.True_));
    # returned as Python's, which JSON (a checkpoint's config) takes
    assert validate.boolean("bias", np.True_) is True and validate.boolean("bias", np.bool_(False)) is False
    with pytest.raises(TypeError, match=r"^bias: expected True or False, got array\(\[ True\]\)$"):
        validate.boolean("bias", np.array([True]))
    with pytest.raises(TypeError, match=r"^bias: expected True or False, got 1$"):
        validate.boolean("bias", 1)
    assert validate.choice("kind", "cosine", ("constant", "cosine")) == "cosine"
    with pytest.raises(ValueError, match=r"^kind: expected one of 'constant', 'cosine', got 'cos'$"):
        validate.choice("kind", "cos", ("constant", "cosine"))
    with pytest.raises(TypeError, match=r"^loss_fn: expected a callable, got int$"):
        validate.function("loss_fn", 3)
    assert validate.function("cb", None, none=True) is None
    with pytest.raises(TypeError, match=r"^cfg: expected dict, got list$"):
        validate.instance("cfg", [], dict)


def test_strings_takes_any_iterable_of_them_but_not_one_string():
    assert validate.strings("smiles", ("CCO", "CCN")) == ["CCO", "CCN"]
    assert validate.strings("smiles", iter(["C"])) == ["C"]
    assert validate.strings("smiles", ["C", None], each=False) == ["C", None]  # MOSES's metrics count it invalid
    for single in ("CCO", b"CCO"):
        kind = type(single).__name__
        with pytest.raises(TypeError, match=rf"^smiles: expected a list of strings, got a single {kind} "):
            validate.strings("smiles", single)
    with pytest.raises(TypeError, match=r"^smiles: expected strings, got NoneType at index 1$"):
        validate.strings("smiles", ["C", None])


def test_integer_also_accepts_named_values_and_choice_tells_bools_from_ints():
    assert validate.integer("unroll", "auto", lo=1, also=("auto",)) == "auto"
    assert validate.integer("unroll", 4, lo=1, also=("auto",)) == 4
    with pytest.raises(ValueError, match=r"^unroll: expected 'auto' or an int >= 1, got 'fast'$"):
        validate.integer("unroll", "fast", lo=1, also=("auto",))
    assert validate.choice("hoist", True, (True, False, "auto")) is True
    for bad in (1, 0, "yes"):
        with pytest.raises(ValueError, match=rf"^hoist: expected one of True, False, 'auto', got {bad!r}$"):
            validate.choice("hoist", bad, (True, False, "auto"))
    with pytest.raises(ValueError, match=r"^n: expected one of 1, 2, got True$"):
        validate.choice("n", True, (1, 2))
    with pytest.raises(ValueError, match=r"^n: expected one of 1, 2, got array"):
        validate.choice("n", np.array([1, 2]), (1, 2))


def test_shape_spells_the_expected_sizes_and_takes_any_size_of_one_or_more_for_none():
    validate.shape("eps", np.zeros((4, 2)), (4, None), "[B, Z]")
    validate.shape("masks", np.zeros((6, 0, 4)), (6, 0, 4), "[T, L-1, B]")  # a size given as 0 is that size
    for bad in (np.zeros(4), np.zeros((3, 2)), np.zeros((4, 0)), np.zeros((4, 2, 1))):
        with pytest.raises(ValueError, match=rf"^eps: expected shape \[B, Z\] = \[4, Z\], got \[{', '.join(map(str, bad.shape))}\]$"):
            validate.shape("eps", bad, (4, None), "[B, Z]")


def test_float_dtype_returns_the_scalar_type_and_names_anything_but_a_floating_dtype():
    import re

    import jax.numpy as jnp

    for given, want in (("float16", jnp.float16), (np.dtype("float64"), jnp.float64), (jnp.bfloat16, jnp.bfloat16)):
        assert validate.float_dtype("param_dtype", given) is jnp.dtype(want).type, given  # np.float16, ...
    assert validate.float_dtype("compute_dtype", None, none=True) is None
    assert validate.float_dtype("param_dtype", None) is float  # without none: JAX's default float, as float
    # an int, a complex, a bool, a name NumPy does not know, a tuple NumPy refuses with a ValueError (not a TypeError),
    # a typo NumPy parses as a struct and refuses with a SyntaxError
    for bad in (jnp.int32, jnp.complex64, True, "bf16", (np.float32, -1), "f4,,"):
        with pytest.raises(TypeError, match=rf"^dtype: expected a floating dtype .*, got {re.escape(repr(bad))}$"):
            validate.float_dtype("dtype", bad)
