"""`jsr.jit(model)`: same numbers as the eager model, current weights, rng streams, mode, static arguments."""
from __future__ import annotations

import gc
import sys
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.scan import warns_when_called_eagerly

# Eager runs op by op and jit compiles the whole call, so XLA may fuse (and round) a few float32 ops
# differently; on this CPU the results agree exactly, the tolerance is for other backends.
EAGER_RTOL = 1e-6
EAGER_ATOL = 1e-7

TRACES: list[str] = []  # appended by the toy's methods when they run under a trace, i.e. once per compile


def _traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


class Toy(nnx.Module):
    """Linear(3 -> 4) then Dropout: x [B, 3] -> [B, 4]; `repeat` takes a Python int."""

    def __init__(self, rate: float = 0.5, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(3, 4, rngs=rngs)
        self.dropout = nnx.Dropout(rate, rngs=rngs)

    def __call__(self, x):
        if _traced(x):
            TRACES.append("call")
        if x.ndim != 2 or x.shape[-1] != 3:
            raise ValueError(f"x: expected shape [B, 3], got {list(x.shape)}")
        return self.dropout(self.linear(x))

    def repeat(self, x, n: int):
        """n calls, one dropout draw each: [n, B, 4]."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n: expected an int >= 1, got {n!r}")
        if _traced(x):
            TRACES.append(f"repeat{n}")
        return jnp.stack([self(x) for _ in range(n)])

    def scale(self, x, factor):
        if _traced(x):
            TRACES.append("scale")
        return self.linear(x) * factor

    def record(self, x):
        self.seen = nnx.Intermediate(x)  # a new attribute: the call changes the module's structure
        return x


def _x(batch: int = 2) -> jax.Array:
    return jax.random.normal(jax.random.key(7), (batch, 3), jnp.float32)


def _close(actual, expected, what: str) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=EAGER_RTOL, atol=EAGER_ATOL,
                               err_msg=what)


# ----------------------------------------------------------------------------------------------------
# Numbers, weights, rng streams
# ----------------------------------------------------------------------------------------------------


def test_call_matches_eager_in_eval_mode():
    model = Toy(rngs=nnx.Rngs(0))
    model.eval()
    fast = jsr.jit(model)
    _close(fast(_x()), model(_x()), "fast(x) vs model(x)")
    assert fast.module is model


def test_train_mode_draws_new_masks_in_the_eager_sequence():
    compiled_model, eager_model = Toy(rngs=nnx.Rngs(0)), Toy(rngs=nnx.Rngs(0))  # identically seeded
    fast = jsr.jit(compiled_model)
    x = _x()
    compiled = [fast(x), fast.repeat(x, 2), fast(x), fast(x)]
    eager = [eager_model(x), eager_model.repeat(x, 2), eager_model(x), eager_model(x)]
    assert not np.array_equal(compiled[2], compiled[3]), "two consecutive calls drew the same dropout mask"
    for i, (c, e) in enumerate(zip(compiled, eager)):
        _close(c, e, f"call {i}: compiled vs eager (same rng consumption)")
    assert int(compiled_model.dropout.rngs.count[...]) == int(eager_model.dropout.rngs.count[...]) == 5


def test_sees_weights_set_after_compile():
    model = Toy(rngs=nnx.Rngs(0))
    model.eval()
    fast = jsr.jit(model)
    x = _x()
    fast(x)
    traces = len(TRACES)

    model.linear.kernel[...] = model.linear.kernel[...] * 2.0  # `variable[...] = value`
    _close(fast(x), model(x), "after kernel[...] = ...")

    nnx.update(model, nnx.state(Toy(rngs=nnx.Rngs(3))))  # another model's weights
    _close(fast(x), model(x), "after nnx.update")

    optimizer = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
    before = np.asarray(fast(x))
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    optimizer.update(model, grads)
    after = fast(x)
    assert not np.allclose(after, before), "the optimizer step is not seen"
    _close(after, model(x), "after an nnx.Optimizer step")
    assert len(TRACES) == traces, "new weight values (same shapes) recompiled"


def test_batch_statistics_set_by_a_call_are_written_back():
    def net(seed):
        return nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(seed)), nnx.BatchNorm(4, rngs=nnx.Rngs(seed)))

    compiled_model, eager_model = net(0), net(0)
    fast = jsr.jit(compiled_model)
    for i in range(2):
        _close(fast(_x()), eager_model(_x()), f"call {i}")
    _close(compiled_model.layers[1].mean[...], eager_model.layers[1].mean[...], "running mean")
    fast.eval()
    eager_model.eval()
    _close(fast(_x()), eager_model(_x()), "eval mode: running statistics used")


# ----------------------------------------------------------------------------------------------------
# Mode
# ----------------------------------------------------------------------------------------------------


def test_eval_and_train_after_jit_take_effect_at_the_next_call():
    model = Toy(rngs=nnx.Rngs(0))  # train mode: dropout on
    fast = jsr.jit(model)
    x = _x()
    no_dropout = model.linear(x)
    assert not np.allclose(fast(x), no_dropout)
    model.eval()
    _close(fast(x), no_dropout, "after model.eval()")
    model.train()
    assert not np.allclose(fast(x), no_dropout), "model.train() after eval() not seen"
    assert fast.eval() is fast and model.dropout.deterministic
    _close(fast(x), no_dropout, "after fast.eval()")
    assert fast.train() is fast and not model.dropout.deterministic


# ----------------------------------------------------------------------------------------------------
# Arguments: static and traced leaves, errors
# ----------------------------------------------------------------------------------------------------


def test_static_int_compiles_once_per_value():
    model = Toy(rngs=nnx.Rngs(0))
    model.eval()
    fast = jsr.jit(model)
    x = _x()
    TRACES.clear()
    assert fast.repeat(x, 2).shape == (2, 2, 4)
    assert fast.repeat(x, 3).shape == (3, 2, 4)
    _close(fast.repeat(x, 3), model.repeat(x, 3), "repeat(x, 3)")
    fast.repeat(x, 2)
    assert TRACES.count("repeat2") == 1 and TRACES.count("repeat3") == 1
    assert fast.repeat is fast.repeat  # the bound wrapper is cached


def test_python_scalar_is_static_and_array_scalar_traced():
    model = Toy(rngs=nnx.Rngs(0))
    fast = jsr.jit(model)
    x = _x()
    TRACES.clear()
    for factor in (2.0, 3.0):
        _close(fast.scale(x, factor), model.scale(x, factor), f"scale {factor}")
    assert TRACES.count("scale") == 2, "each Python float is its own compile"
    for factor in (2.0, 3.0):
        _close(fast.scale(x, jnp.asarray(factor)), model.scale(x, factor), f"scale array {factor}")
    assert TRACES.count("scale") == 3, "an array scalar is traced: one compile for all values"


def test_new_input_shape_compiles_again():
    model = Toy(rngs=nnx.Rngs(0))
    model.eval()
    fast = jsr.jit(model)
    for batch in (1, 5):
        _close(fast(_x(batch)), model(_x(batch)), f"B={batch}")


def test_unknown_method_raises_attribute_error_naming_it():
    fast = jsr.jit(Toy(rngs=nnx.Rngs(0)))
    with pytest.raises(AttributeError, match="no_such_method"):
        fast.no_such_method
    with pytest.raises(AttributeError, match="jsr.jit\\(model.linear\\)"):
        fast.linear  # a submodule, not a method
    with pytest.raises(AttributeError, match="fast.module.sow"):
        fast.sow  # nnx.Module's own API


def test_bad_argument_raises_the_models_own_value_error():
    fast = jsr.jit(Toy(rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"n: expected an int >= 1, got 0"):
        fast.repeat(_x(), 0)
    with pytest.raises(ValueError, match=r"x: expected shape \[B, 3\], got \[2, 5\]"):
        fast(jnp.ones((2, 5)))


def test_unhashable_static_argument_raises_type_error_naming_it():
    fast = jsr.jit(Toy(rngs=nnx.Rngs(0)))
    with pytest.raises(TypeError, match=r"Toy.scale: args\[1\]: set: expected an array \(traced\) or a hashable"):
        fast.scale(_x(), {2.0})


def test_not_a_module_raises_type_error():
    with pytest.raises(TypeError, match="module: expected Module, got function"):
        jsr.jit(lambda x: x)


# ----------------------------------------------------------------------------------------------------
# What is not supported fails loudly
# ----------------------------------------------------------------------------------------------------


def test_replaced_submodule_raises():
    model = Toy(rngs=nnx.Rngs(0))
    fast = jsr.jit(model)
    fast(_x())
    model.linear = nnx.Linear(3, 4, rngs=nnx.Rngs(1))
    with pytest.raises(RuntimeError, match="Toy.linear was replaced"):
        fast(_x())


def test_jit_again_reuses_the_compiled_calls_until_the_structure_changes():
    """`jsr.jit(model)` called again (inline, or by library code handed the model) costs no compile; after a
    structural change it gives a fresh Compiled that sees the new structure."""
    model = Toy(rngs=nnx.Rngs(0))
    model.eval()
    fast = jsr.jit(model)
    fast(_x())
    TRACES.clear()
    assert jsr.jit(model) is fast
    jsr.jit(model)(_x())
    assert TRACES == []
    model.linear = nnx.Linear(3, 4, rngs=nnx.Rngs(1))
    fresh = jsr.jit(model)
    assert fresh is not fast
    np.testing.assert_array_equal(fresh(_x()), model(_x()))


def test_a_model_is_freed_with_its_last_compiled_view():
    """A notebook cell re-run (`model = ...; fast = jsr.jit(model)`) must not keep every model it ever compiled
    alive: jit's cache held each Compiled, which held its model, a weak key kept alive by its own value."""
    for make in (Toy, lambda rngs: nnx.Dropout(0.5, rngs=rngs)):  # mode flags below the model, and on the model
        model = make(rngs=nnx.Rngs(0))
        fast = jsr.jit(model)
        fast(_x())
        model.eval()
        fast(_x())
        fast.repeat(_x(), 2) if isinstance(model, Toy) else None
        ref, core = weakref.ref(model), weakref.ref(fast._core)  # the core holds the model's Variables
        del model, fast
        gc.collect()
        assert ref() is None, "the model outlived every reference to it and to its jsr.jit"
        assert core() is None, "the compiled functions (and the Variables they read) outlived the model"


def test_compiled_view_keeps_its_model_and_inline_jit_still_reuses_the_compile():
    fast = jsr.jit(Toy(rngs=nnx.Rngs(0))).eval()  # the Compiled alone holds the model
    gc.collect()
    np.testing.assert_array_equal(fast(_x()), fast.module(_x()))
    model = fast.module
    del fast
    gc.collect()
    TRACES.clear()
    jsr.jit(model)(_x())  # a new view on the compiled functions kept for the live model: no trace
    jsr.jit(model)(_x())
    assert TRACES == []


def test_deeper_structural_change_raises_at_the_next_compile():
    model = Toy(rngs=nnx.Rngs(0))
    fast = jsr.jit(model)
    fast(_x())
    model.linear.kernel = nnx.Param(jnp.zeros((3, 4)))  # a new Variable object, below the root
    with pytest.raises(RuntimeError, match="structure of Toy"):
        fast(_x(batch=3))


def test_call_that_changes_structure_raises():
    fast = jsr.jit(Toy(rngs=nnx.Rngs(0)))
    with pytest.raises(RuntimeError, match="Toy.record changed the module's structure"):
        fast.record(_x())


def test_inside_jax_jit_eval_works_and_train_raises():
    model = Toy(rngs=nnx.Rngs(0))
    fast = jsr.jit(model)
    with pytest.raises(RuntimeError, match="inside another JAX transformation"):
        jax.jit(lambda x: fast(x))(_x())
    model.eval()
    _close(jax.jit(lambda x: fast(x))(_x()), model(_x()), "eval mode inside jax.jit")


def test_train_mode_inside_jax_grad_over_the_inputs_raises_its_own_error():
    fast = jsr.jit(Toy(rngs=nnx.Rngs(0)))  # the rng count comes back concrete there, and Flax refuses setting it
    with pytest.raises(RuntimeError, match="inside another JAX transformation"):
        jax.grad(lambda x: fast(x).sum())(_x())


def test_inside_an_nnx_transform_of_its_own_model_raises_and_elsewhere_works():
    """`fast` reads the outer model's weights; inside nnx.grad/nnx.jit over that model they would be constants
    (zero gradients, weights kept from the first trace): refused, the model itself or one of its submodules."""
    model = Toy(rngs=nnx.Rngs(0))
    model.eval()
    fast, fast_linear = jsr.jit(model), jsr.jit(model.linear)
    for transform, name in ((lambda f: nnx.grad(lambda m: f(_x()).sum())(model), "nnx.grad"),
                            (lambda f: nnx.jit(lambda m: f(_x()))(model), "nnx.jit")):
        for f, qualname in ((fast, "Toy.__call__"), (fast_linear, "Linear.__call__")):
            with pytest.raises(RuntimeError, match=rf"^jsr.jit: {qualname} called inside {name} over the same "
                                                   r"model: .* call the model the function is given there"):
                transform(f)
    expected = nnx.grad(lambda m: m(_x()).sum())(model)
    inner = nnx.grad(lambda m: jsr.jit(m)(_x()).sum())(model)  # a view of the transform's own copy: traced
    inner_leaves = dict(nnx.to_flat_state(inner))
    for path, value in nnx.to_flat_state(expected):
        _close(inner_leaves[path], value, f"gradient {path} through jsr.jit of the transform's copy")
    another = Toy(rngs=nnx.Rngs(1))
    another.eval()
    other = jsr.jit(another)  # another model's view: its weights are constants there, rightly
    nnx.grad(lambda m: (m(_x()) + other(_x())).sum())(model)
    _close(jax.grad(lambda x: fast(x).sum())(_x()), jax.grad(lambda x: model(x).sum())(_x()), "grad over inputs")


# ----------------------------------------------------------------------------------------------------
# SeqVAE
# ----------------------------------------------------------------------------------------------------


def _vae(seed: int) -> jsr.SeqVAE:
    return jsr.SeqVAE(12, 16, 4, 1, rngs=nnx.Rngs(seed))


TOKENS = jnp.array([[3, 4, 5, 2, 0], [6, 7, 2, 0, 0]], jnp.int32)
LENGTHS = jnp.array([4, 3], jnp.int32)


def test_vae_methods_match_eager_and_see_loaded_weights():
    compiled_model, eager_model = _vae(0), _vae(0)
    fast = jsr.jit(compiled_model)
    for got, want, what in zip(fast.encode(TOKENS, LENGTHS), eager_model.encode(TOKENS, LENGTHS), ("mu", "logvar")):
        _close(got, want, f"encode: {what}")
    other = _vae(1)
    jsr.load_torch_state_dict(compiled_model, jsr.torch_state_dict(other))
    _close(fast.encode(TOKENS, LENGTHS)[0], other.encode(TOKENS, LENGTHS)[0], "encode after load_torch_state_dict")


def test_vae_sampling_consumes_its_stream_as_eager():
    compiled_model, eager_model = _vae(0), _vae(0)
    fast = jsr.jit(compiled_model)
    z = jax.random.normal(jax.random.key(2), (2, 4))
    compiled = [fast.generate(z, 6, mode="sample") for _ in range(2)]
    eager = [eager_model.generate(z, 6, mode="sample") for _ in range(2)]
    for i, (c, e) in enumerate(zip(compiled, eager)):
        np.testing.assert_array_equal(c, e, err_msg=f"generate call {i}: token ids")
    assert not np.array_equal(compiled[0], compiled[1]), "two sampling calls drew the same noise"
    with pytest.raises(ValueError, match=r"z: expected shape \[B, Z\] = \[B, 4\], got \[2, 5\]"):
        fast.generate(jnp.ones((2, 5)), 6)
    with pytest.raises(ValueError, match="max_len: expected an int >= 1, got 0"):
        fast.generate(z, 0)


def test_vae_checks_host_tokens_and_lengths_the_traced_call_cannot():
    fast = jsr.jit(_vae(0))
    bad_id = np.array(TOKENS).copy()
    bad_id[1, 2] = 12  # vocab_size 12: ids 0..11
    with pytest.raises(ValueError, match=r"tokens: expected ids in \[0, vocab_size=12\), got tokens\[1, 2\]=12"):
        fast.encode(bad_id, np.array(LENGTHS))
    with pytest.raises(ValueError, match=r"lengths: expected values in \[1, T=5\], got lengths\[1\]=6"):
        fast.loss(np.array(TOKENS), lengths=np.array([4, 6]))
    with pytest.raises(ValueError, match=r"tokens: expected ids"):
        fast.decode(jnp.zeros((2, 4)), bad_id)
    # `fast(tokens, lengths)` is `fast.loss(...)`: checked alike, not a plausible loss of clipped lengths or a NaN
    with pytest.raises(ValueError, match=r"lengths: expected values in \[1, T=5\], got lengths\[1\]=6"):
        fast(np.array(TOKENS), np.array([4, 6]))
    with pytest.raises(ValueError, match=r"tokens: expected ids in \[0, vocab_size=12\), got tokens\[1, 2\]=12"):
        fast(bad_id, lengths=np.array(LENGTHS))
    # Device arrays are not read back (that would wait for the device): traced, as under jax.jit.
    mu, _ = fast.encode(TOKENS, jnp.array([4, 6], jnp.int32))
    assert np.isfinite(np.asarray(mu)).all()


# ----------------------------------------------------------------------------------------------------
# Host data the traced call cannot see: torch tensors, and the values of lengths
# ----------------------------------------------------------------------------------------------------


def test_torch_tensors_are_traced_data_not_compile_keys():
    torch = pytest.importorskip("torch")
    model = jsr.GRU(3, 4, rngs=nnx.Rngs(0))
    fast = jsr.jit(model)
    x = np.random.default_rng(0).normal(size=(5, 2, 3)).astype(np.float32)
    want = fast(x)[0]
    for tensor in (torch.from_numpy(x), torch.from_numpy(x).requires_grad_(), torch.from_numpy(x) * 1):
        _close(fast(tensor)[0], want, "output of a torch tensor input")
    _close(fast(x, lengths=torch.tensor([5, 3]))[0], fast(x, lengths=np.array([5, 3]))[0], "torch lengths")
    # Static leaves would have compiled once per tensor object: one compile per argument structure instead.
    assert len(fast._call._fns) == 2


def test_eager_calls_take_torch_tensors_as_jsr_jit_does():
    """An eager call reads torch data as `jsr.jit` does: an input that requires grad, a state `(h, c)` (JAX alone
    cannot read a torch dtype), torch's `[h, c]` list, the Traveller's input, step and state, the VAE's z."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).normal(size=(5, 2, 3)).astype(np.float32)
    h = np.random.default_rng(2).normal(size=(1, 2, 4)).astype(np.float32)
    for kind, state in (("LSTM", (h, 2 * h)), ("GRU", h)):
        model = getattr(jsr, kind)(3, 4, rngs=nnx.Rngs(0))
        want = jsr.jit(model)(x, state)
        as_torch = jax.tree.map(torch.from_numpy, state)
        for got_state in (as_torch, list(as_torch) if kind == "LSTM" else as_torch):
            for call in (model, jsr.jit(model)):
                got = call(torch.from_numpy(x).requires_grad_(), got_state)
                for name, g, w in zip(("output", "h", "c"), jax.tree.leaves(got), jax.tree.leaves(want)):
                    _close(g, w, f"{kind} {name} from torch data ({type(got_state).__name__} state)")
    trav = jsr.Traveller(num_inputs=3, hidden_size=4, rngs=nnx.Rngs(0))
    trav.eval()
    xb = np.swapaxes(x, 0, 1)  # [B, T, F]
    want, state = trav(xb)
    got, torch_state = trav(torch.from_numpy(xb).requires_grad_())
    _close(got, want, "Traveller positions from a torch input")
    torch_state = type(state)(*(torch.tensor(np.asarray(s)) for s in torch_state))
    _close(trav.step(torch_state, torch.from_numpy(xb[:, 0]))[0], trav.step(state, xb[:, 0])[0],
           "Traveller.step from a torch state and bar")
    vae = jsr.SeqVAE(6, 8, 3, 1, rngs=nnx.Rngs(0))
    z = np.random.default_rng(3).normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_array_equal(vae.generate(torch.from_numpy(z).requires_grad_(), 4), vae.generate(z, 4))


def test_a_bfloat16_torch_input_is_read_in_its_dtype():
    """NumPy has no bfloat16, so torch's .numpy() refuses such a tensor: it crashed an eager call and jsr.jit alike with
    torch's "Got unsupported ScalarType BFloat16"; now it reaches the model as bfloat16, exactly."""
    torch = pytest.importorskip("torch")
    model = jsr.GRU(3, 4, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = np.random.default_rng(1).normal(size=(5, 2, 3)).astype(jnp.bfloat16)
    want = jsr.jit(model)(x)[0]
    for call in (model, jsr.jit(model)):
        got = call(torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16))[0]
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_host_lengths_are_checked_as_an_eager_call_checks_them(bidirectional):
    model = jsr.LSTM(3, 4, batch_first=True, bidirectional=bidirectional, rngs=nnx.Rngs(0))
    fast = jsr.jit(model)
    x = jnp.ones((2, 5, 3))
    for lengths in (np.array([0, 3]), [6, 3], np.array([3, 9], np.int64)):
        bad = [i for i, n in enumerate(lengths) if not 1 <= n <= 5][0]
        message = rf"lengths: expected values in \[1, T=5\], got lengths\[{bad}\]={lengths[bad]}"
        with pytest.raises(ValueError, match=message):
            model(x, lengths=lengths)
        with pytest.raises(ValueError, match=message):
            fast(x, lengths=lengths)
    # A jax.Array is not read back (that would wait for the device): clipped to 0..T as under jax.jit.
    out, _ = fast(x, lengths=jnp.array([9, 3]))
    _close(out, fast(x, lengths=np.array([5, 3]))[0], "a device length beyond T, clipped to T")


def test_lists_of_numbers_are_data_as_torch_and_the_eager_model_read_them():
    model = jsr.GRU(3, 4, rngs=nnx.Rngs(0))
    fast = jsr.jit(model)
    rng = np.random.default_rng(0)
    for _ in range(3):  # new values each call: one compile, not one per value
        x = rng.normal(size=(5, 2, 3))
        lengths = [int(n) for n in rng.integers(1, 6, size=2)]
        _close(fast(x.tolist(), lengths=lengths)[0], model(x, lengths=np.array(lengths))[0], "list input and lengths")
    assert len(fast._call._fns) == 1
    with pytest.raises(ValueError, match=r"lengths: expected values in \[1, T=5\], got lengths\[0\]=6"):
        fast(x, lengths=[6, 3])


class Scale(nnx.Module):
    """x * n, or x * self.scale; `flags[0]` picks by Python control flow (a static argument)."""

    def __init__(self):
        self.scale = 2.0

    def __call__(self, x, n=None, flags=(True,)):
        return x * (self.scale if n is None else n) if flags[0] else x


def test_a_static_int_and_the_equal_float_compile_apart():
    # 1 == 1.0 and hash(1) == hash(1.0): a compile key of the values alone would reuse the int's program for the float.
    fast = jsr.jit(Scale())
    x = jnp.arange(3)
    assert fast(x, 1).dtype == x.dtype
    assert jnp.issubdtype(fast(x, 1.0).dtype, jnp.floating)
    assert fast(x, True).dtype == x.dtype  # True == 1 too (x * True keeps x's dtype)


def test_a_list_of_bools_stays_static_python_control_flow_reads_it():
    # Lists of numbers become traced arrays (lengths=[5, 3], as torch takes them); a list of flags must not, or
    # `if flags[0]` would be a tracer in a boolean context.
    fast = jsr.jit(Scale())
    assert fast(jnp.ones(2), flags=[True, False]).tolist() == [2.0, 2.0]
    assert fast(jnp.ones(2), flags=[False]).tolist() == [1.0, 1.0]


def test_jit_with_other_mode_attributes_is_a_new_compiled_view_that_watches_them():
    model = Scale()
    plain = jsr.jit(model)
    plain(jnp.ones(1))
    watching = jsr.jit(model, mode_attributes=("scale",))
    assert watching is not plain and jsr.jit(model, mode_attributes=("scale",)) is watching
    assert watching(jnp.ones(1)).tolist() == [2.0]
    model.scale = 3.0  # a static attribute: watched, so part of the compile key
    assert watching(jnp.ones(1)).tolist() == [3.0]


@pytest.mark.parametrize("bad", [None, "training", 3, ["training", 1]])
def test_jit_refuses_mode_attributes_that_are_no_names_first_call_or_cached(bad):
    """None on a model already compiled met the cache's tuple(None): Python's TypeError, naming no argument."""
    model = Scale()
    for _ in range(2):  # a fresh model, then one in the cache
        with pytest.raises(TypeError, match=r"^mode_attributes: expected a sequence of attribute names, got "):
            jsr.jit(model, mode_attributes=bad)
        jsr.jit(model)


def _eager_warnings(record) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, jsr.EagerCallWarning)]


def test_a_second_eager_call_from_one_line_warns_once_at_that_line_that_each_compiles_the_loop():
    # A PyTorch habit, `for x in batches: model(x)`, compiles the whole scan at every call and keeps each program:
    # the second call from a line says so, once, at the user's line; a first call anywhere says nothing.
    model = jsr.LSTM(3, 4, bidirectional=True, rngs=nnx.Rngs(0))  # two scans per call, one call counted
    x = jnp.ones((2, 5, 3), jnp.float32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model(x)
        for _ in range(3):
            model(x); line = sys._getframe().f_lineno  # noqa: E702 - the line the warning must name
    (warned,) = _eager_warnings(record)
    assert (warned.filename, warned.lineno) == (__file__, line)
    said = str(warned.message)
    assert said.startswith("LSTM ran eagerly again from this line") and "fast = jsr.jit(model)" in said
    assert "call fast(...)" in said and "compiles its whole time loop anew" in said

    # A method names itself; the calls it makes itself (the SeqVAE's loss: encode, decode) are not counted
    class Toy(nnx.Module):
        @warns_when_called_eagerly()
        def loss(self, x):
            return self.encode(x) + self.encode(x)

        @warns_when_called_eagerly()
        def encode(self, x):
            return x + 1

    toy = Toy()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            toy.loss(x)
    (warned,) = _eager_warnings(record)
    assert str(warned.message).startswith("Toy.loss ran eagerly again") and "call fast.loss(...)" in str(warned.message)
    # ... and every public method of the models that runs a time loop is one that says so
    for method in (jsr.RNNBase.__call__, jsr.Traveller.__call__, jsr.Traveller.step, jsr.SeqVAE.__call__,
                   jsr.SeqVAE.encode, jsr.SeqVAE.decode, jsr.SeqVAE.loss, jsr.SeqVAE.generate):
        assert method.__code__ is Toy.loss.__code__, method.__qualname__  # the decorator's wrapper

    # jsr.feedback_scan, a function: compiled in a function of one's own
    core = jsr.LSTM(2, 3, rngs=nnx.Rngs(0))  # gates [B, 4H]: layer 0's input is the fed-back value, tiled
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            jsr.feedback_scan(core, core.initial_state(1), jnp.zeros((1, 1), jnp.float32),
                              jnp.ones((4, 1, 1), jnp.float32), inject=lambda fb, x_t: jnp.tile(fb + x_t, (1, 12)), readout=lambda h, x_t: h[:, :1],
                              feed=lambda y, x_t: y)
    (warned,) = _eager_warnings(record)
    said = str(warned.message)
    assert said.startswith("feedback_scan ran eagerly again") and "jax.jit-compiled" in said


def test_compiled_calls_and_calls_under_disable_jit_never_warn_that_they_ran_eagerly():
    model = jsr.LSTM(3, 4, rngs=nnx.Rngs(0))
    x = jnp.ones((2, 5, 3), jnp.float32)
    graphdef, state = nnx.split(model)
    fast = jsr.jit(model)
    pure = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0])
    graph_jit = nnx.jit(lambda m, x: m(x)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", jsr.EagerCallWarning)
        for _ in range(3):
            fast(x)
            pure(state, jnp.ones((2, 5 + _, 3), jnp.float32))  # a new shape: traced again, inside jax.jit
            graph_jit(model, x)
            jax.grad(lambda x: model(x)[0].sum())(x)  # inside a transformation (traced)
        with jax.disable_jit():  # debugging: nothing is compiled, so there is nothing to say
            for _ in range(2):
                model(x)


class Offsets(nnx.Module):
    """Array attributes that are not Variables (`nnx.data`): one read, a list's item read, and a count the call sets."""

    def __init__(self):
        self.w = nnx.Param(jnp.ones(3))
        self.offset = nnx.data(jnp.full(3, 2.0))
        self.items = nnx.data([jnp.zeros(3), jnp.ones(3)])
        self.calls = nnx.data(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.calls = self.calls + 1
        return x * self.w + self.offset + self.items[1]


def test_array_attributes_that_are_not_variables_are_read_each_call_and_written_back():
    model = Offsets()
    fast = jsr.jit(model)
    x = jnp.ones(3)
    np.testing.assert_array_equal(fast(x), np.full(3, 4.0))
    model.offset = jnp.full(3, 5.0)  # replaced, as a Variable's value would be: the next call reads it
    model.items[1] = jnp.full(3, 10.0)  # an item of a list attribute
    np.testing.assert_array_equal(fast(x), np.full(3, 16.0))
    assert int(model.calls) == 2  # what the call set is written back, as a Variable's update is


def test_a_variable_holding_a_mutable_reference_is_refused_at_jit():
    try:
        model = nnx.Module()
        model.w = nnx.Param(jnp.ones(3), ref=True)
    except TypeError:  # a flax without Variable references
        pytest.skip("this flax has no Variable(ref=True)")
    with pytest.raises(TypeError, match=r"^module: Variable at w was created with hijax=True or ref=True; jsr.jit "
                                        r"supports plain Variables only"):
        jsr.jit(model)
