"""jsr.LSTM/GRU against torch.nn.LSTM/GRU with the same weights: every output step, final states, gradients.

Weights always move through `jsr.load_torch_state_dict` (never by hand), so a mapping bug shows here.
torch's default initialisation gives every bias a non-zero value, which is what exposes bias bugs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_scan_rnn as jsr
import torch_ref
from parity_tests.compare import (
    assert_close,
    assert_grads_close,
    assert_steps_close,
    atol_for,
    grad_rtol_for,
)

KINDS = ("LSTM", "GRU", "RNN")  # RNN: the Elman network, torch.nn.RNN
# Both ways of computing each layer's input projection (`hoist_inputs`): before the loop (the GPU default)
# and inside each step (the CPU default); each must match torch on its own.
HOIST = (True, False)
DTYPES = {"float32": (jnp.float32, torch.float32), "float64": (jnp.float64, torch.float64)}


def make_pair(kind: str, input_size: int, hidden: int, layers: int, dtype: str, seed: int = 0, hoist_inputs="auto"):
    torch.manual_seed(seed)
    jdt, tdt = DTYPES[dtype]
    # The batch-major layout throughout this file's older tests; torch's own default (time-major) and its
    # other constructor options are the subject of `test_torch_constructor_means_the_same`.
    ref = getattr(torch_ref, kind)(input_size, hidden, layers, batch_first=True).to(tdt)
    ours = getattr(jsr, kind)(
        input_size, hidden, layers, batch_first=True, param_dtype=jdt, hoist_inputs=hoist_inputs, rngs=nnx.Rngs(seed + 1)
    )
    jsr.load_torch_state_dict(ours, ref.state_dict())
    return ref, ours


def state_leaves(state) -> list:
    return list(state) if isinstance(state, tuple) else [state]


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_torch_every_step(kind, layers, batch, dtype, hoist):
    steps = 500
    ref, ours = make_pair(kind, 6, 24, layers, dtype, hoist_inputs=hoist)
    x = np.random.default_rng(1).standard_normal((batch, steps, 6))
    with torch.no_grad():
        t_out, t_state = ref(torch.from_numpy(x).to(DTYPES[dtype][1]))
    j_out, j_state = ours(jnp.asarray(x, DTYPES[dtype][0]))
    assert j_out.dtype == DTYPES[dtype][0]
    atol = atol_for(j_out.dtype)
    assert_steps_close(f"{kind} output (hoist_inputs={hoist})", j_out, t_out, atol)
    for name, j, t in zip(("h", "c"), state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{kind} final {name} (hoist_inputs={hoist})", j, t, atol)


@pytest.mark.parametrize("kind", KINDS)
def test_initial_state_is_honoured(kind):
    ref, ours = make_pair(kind, 4, 8, 2, "float64")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 20, 4))
    init = tuple(rng.standard_normal((2, 3, 8)) for _ in range(2 if kind == "LSTM" else 1))
    t_init = tuple(torch.from_numpy(s) for s in init)
    with torch.no_grad():
        t_out, t_state = ref(torch.from_numpy(x), t_init if kind == "LSTM" else t_init[0])
    j_out, j_state = ours(jnp.asarray(x), init if kind == "LSTM" else init[0])
    assert_steps_close(f"{kind} output with initial_state", j_out, t_out, atol_for(np.float64))
    for j, t in zip(state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{kind} final state with initial_state", j, t, atol_for(np.float64))


def jax_gradients(model, x, w_out, w_state):
    """Gradients of `sum(out * w_out) + sum(state * w_state)` as `{torch key: grad}` and d/dx."""

    def loss(model, x):
        out, state = model(x)
        return (out * w_out).sum() + sum((s * w).sum() for s, w in zip(state_leaves(state), w_state))

    g_model, g_x = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(model, x)
    holder = nnx.clone(model)
    nnx.update(holder, g_model)  # the converter's table then names each gradient with its torch key
    return jsr.torch_state_dict(holder), g_x


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_torch(kind, layers, dtype, hoist):
    jdt, tdt = DTYPES[dtype]
    ref, ours = make_pair(kind, 5, 16, layers, dtype, hoist_inputs=hoist)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 200, 5))
    w_out = rng.standard_normal((7, 200, 16))
    w_state = [rng.standard_normal((layers, 7, 16)) for _ in range(2 if kind == "LSTM" else 1)]

    t_x = torch.from_numpy(x).to(tdt).requires_grad_(True)
    t_out, t_state = ref(t_x)
    t_loss = (t_out * torch.from_numpy(w_out).to(tdt)).sum() + sum(
        (s * torch.from_numpy(w).to(tdt)).sum() for s, w in zip(state_leaves(t_state), w_state)
    )
    t_loss.backward()
    t_grads = {k: p.grad for k, p in ref.named_parameters()}

    j_grads, j_gx = jax_gradients(
        ours, jnp.asarray(x, jdt), jnp.asarray(w_out, jdt), [jnp.asarray(w, jdt) for w in w_state]
    )
    rtol = grad_rtol_for(jdt)
    context = f"{kind} L={layers} {dtype} hoist_inputs={hoist}: "
    assert_grads_close(j_grads, t_grads, rtol, context=context)
    assert_grads_close({"input": j_gx}, {"input": t_x.grad}, rtol, context=context)


@pytest.mark.parametrize("kind, kwargs", [("LSTMCell", {}), ("GRUCell", {}), ("RNNCell", {}),
                                          ("RNNCell", {"nonlinearity": "relu", "bias": False})])
def test_single_cells_match_torch_cells(kind, kwargs):
    torch.manual_seed(4)
    ref = getattr(torch.nn, kind)(5, 9, **kwargs).double()
    ours = getattr(jsr, kind)(5, 9, **kwargs, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    rng = np.random.default_rng(5)
    x, h, c = (rng.standard_normal((3, n)) for n in (5, 9, 9))
    # torch's call, copied as written: cell(input, hx) -> h' (GRU) or (h', c') (LSTM); batched and unbatched
    # ([I] input, [H] state), with the state given and left to its zeros.
    for rows in (slice(None), 0):
        state = (h[rows], c[rows]) if kind == "LSTMCell" else h[rows]
        for hx in (state, None):
            t_hx = None if hx is None else jax.tree.map(torch.from_numpy, hx)
            with torch.no_grad():
                expected = ref(torch.from_numpy(x[rows]), t_hx)
            got = ours(jnp.asarray(x[rows]), None if hx is None else jax.tree.map(jnp.asarray, hx))
            where = f"{kind} {'batched' if rows == slice(None) else 'unbatched'}, hx {'None' if hx is None else 'given'}"
            assert_same_structure_and_close(where, got, expected, atol_for(np.float64))


def assert_same_structure_and_close(where: str, got, expected, atol: float) -> None:
    got_leaves, expected_leaves = jax.tree.leaves(got), list(expected) if isinstance(expected, tuple) else [expected]
    assert len(got_leaves) == len(expected_leaves) and isinstance(got, tuple) == isinstance(expected, tuple), where
    for name, g, e in zip(("h", "c"), got_leaves, expected_leaves):
        assert_close(f"{where}: {name}", g, e, atol)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bit_exact(kind, dtype):
    ref, ours = make_pair(kind, 3, 7, 3, dtype)
    back = jsr.torch_state_dict(ours)
    assert list(back) == list(ref.state_dict())
    for key, value in ref.state_dict().items():
        assert back[key].dtype == value.numpy().dtype, key
        np.testing.assert_array_equal(back[key], value.numpy(), err_msg=key)
    twin = getattr(torch_ref, kind)(3, 7, 3).to(DTYPES[dtype][1])
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)
    for key, value in ref.state_dict().items():
        assert torch.equal(twin.state_dict()[key], value), key


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    input_size=st.integers(1, 9),
    hidden=st.integers(1, 17),
    layers=st.integers(1, 3),
    batch=st.integers(1, 5),
    steps=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_match_torch(kind, input_size, hidden, layers, batch, steps, seed):
    ref, ours = make_pair(kind, input_size, hidden, layers, "float64", seed)
    x = np.random.default_rng(seed).standard_normal((batch, steps, input_size))
    with torch.no_grad():
        t_out, t_state = ref(torch.from_numpy(x))
    j_out, j_state = ours(jnp.asarray(x))
    assert_steps_close(f"{kind} output", j_out, t_out, atol_for(np.float64))
    for j, t in zip(state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{kind} final state", j, t, atol_for(np.float64))


@pytest.mark.parametrize("kind", KINDS)
def test_jit_and_unroll_do_not_change_results(kind):
    _, ours = make_pair(kind, 4, 8, 2, "float64")
    x = jnp.asarray(np.random.default_rng(6).standard_normal((2, 33, 4)))
    base, _ = ours(x)
    for unroll in (2, 16):
        out, _ = nnx.jit(lambda m, x, u=unroll: m(x, unroll=u))(ours, x)
        assert_steps_close(f"{kind} unroll={unroll}", out, base, atol_for(np.float64))


def packed_torch_run(ref, x, lengths):
    """torch.nn.LSTM/GRU over padded sequences the PyTorch way: pack, run, unpack (zeros after length)."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    packed = pack_padded_sequence(torch.from_numpy(x), torch.from_numpy(lengths), batch_first=True, enforce_sorted=False)
    out, state = ref(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out, state


@pytest.mark.parametrize("hoist", HOIST)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_lengths_match_packed_sequences(kind, bidirectional, hoist):
    torch.manual_seed(7)
    ref = getattr(torch_ref, kind)(4, 10, 2, batch_first=True, bidirectional=bidirectional).double()
    ours = getattr(jsr, kind)(
        4, 10, 2, batch_first=True, bidirectional=bidirectional, hoist_inputs=hoist, param_dtype=jnp.float64,
        rngs=nnx.Rngs(0),
    )
    jsr.load_torch_state_dict(ours, ref.state_dict())
    assert list(jsr.torch_state_dict(ours)) == list(ref.state_dict())
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 30, 4))
    lengths = np.array([30, 1, 17, 29, 5])
    with torch.no_grad():
        t_out, t_state = packed_torch_run(ref, x, lengths)
    j_out, j_state = ours(jnp.asarray(x), lengths=jnp.asarray(lengths))
    label = f"{kind} bidirectional={bidirectional} hoist_inputs={hoist} with lengths"
    assert_steps_close(f"{label}: output", j_out, t_out, atol_for(np.float64))
    for name, j, t in zip(("h", "c"), state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{label}: final {name}", j, t, atol_for(np.float64))


@pytest.mark.parametrize("kind", KINDS)
def test_a_packed_sequence_is_refused_with_a_recipe_that_gives_torchs_numbers(kind):
    """A torch user passes the PackedSequence they give nn.LSTM: refused eagerly and under jsr.jit (JAX would take
    the namedtuple apart and fail rebuilding it), naming pad_packed_sequence and lengths=; that recipe, run as
    written, gives torch's outputs on the packed input."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(9)
    ref = getattr(torch_ref, kind)(4, 6, 2, batch_first=True).double()
    ours = getattr(jsr, kind)(4, 6, 2, batch_first=True, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    padded = torch.from_numpy(np.random.default_rng(9).standard_normal((3, 12, 4)))
    packed = pack_padded_sequence(padded, torch.tensor([7, 12, 3]), batch_first=True, enforce_sorted=False)
    recipe = r"pad_packed_sequence\(packed, batch_first=True\), then model\(x, lengths=lengths\)"
    for call in (ours, jsr.jit(ours)):
        with pytest.raises(TypeError, match=r"^x: expected an array, got a torch PackedSequence; .*" + recipe):
            call(packed)
    x, lengths = pad_packed_sequence(packed, batch_first=True)
    j_out, j_state = jsr.jit(ours)(x, lengths=lengths)
    with torch.no_grad():
        t_out, t_state = ref(packed)
    t_out, _ = pad_packed_sequence(t_out, batch_first=True)
    assert_steps_close(f"{kind} from a PackedSequence: output", j_out, t_out, atol_for(np.float64))
    for name, j, t in zip(("h", "c"), state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{kind} from a PackedSequence: final {name}", j, t, atol_for(np.float64))
    with pytest.raises(TypeError, match=r"^Traveller.__call__: argument 0: expected an array, got a torch "
                                        r"PackedSequence; pass a padded array"):
        jsr.jit(jsr.Traveller(num_inputs=4, hidden_size=4, rngs=nnx.Rngs(0)))(packed)


@pytest.mark.parametrize("kind", KINDS)
def test_bidirectional_without_lengths_matches_torch(kind):
    torch.manual_seed(8)
    ref = getattr(torch_ref, kind)(3, 6, 3, batch_first=True, bidirectional=True).double()
    ours = getattr(jsr, kind)(3, 6, 3, batch_first=True, bidirectional=True, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    x = np.random.default_rng(8).standard_normal((2, 25, 3))
    with torch.no_grad():
        t_out, t_state = ref(torch.from_numpy(x))
    j_out, j_state = ours(jnp.asarray(x))
    assert j_out.shape == (2, 25, 12)
    assert_steps_close(f"{kind} bidirectional output", j_out, t_out, atol_for(np.float64))
    for j, t in zip(state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{kind} bidirectional final state", j, t, atol_for(np.float64))


# torch.nn.LSTM/GRU constructor calls as a PyTorch user writes them, passed unchanged to jsr.LSTM/GRU.
# (kind, positional args after (input_size, hidden_size), keyword args)
TORCH_CONSTRUCTORS = [
    ("LSTM", (), {}),  # torch's defaults: one layer, time-major
    ("GRU", (2,), {}),
    ("LSTM", (2, True, True), {}),  # num_layers, bias, batch_first by position
    ("GRU", (2,), {"bias": False}),
    ("LSTM", (2,), {"bias": False, "bidirectional": True}),
    ("LSTM", (1,), {"proj_size": 3}),
    ("LSTM", (2,), {"proj_size": 3, "bidirectional": True, "batch_first": True}),
    ("GRU", (3,), {"bidirectional": True}),
    ("RNN", (), {}),  # tanh, torch's default
    ("RNN", (2, "relu"), {}),  # nonlinearity by position: before bias, as in torch
    ("RNN", (1,), {"nonlinearity": "relu", "bias": False, "bidirectional": True, "batch_first": True}),
]


def torch_pair(kind: str, args: tuple, kwargs: dict, dtype: str, input_size: int = 4, hidden: int = 6):
    torch.manual_seed(11)
    jdt, tdt = DTYPES[dtype]
    ref = getattr(torch.nn, kind)(input_size, hidden, *args, **kwargs).to(tdt)
    ours = getattr(jsr, kind)(input_size, hidden, *args, **kwargs, param_dtype=jdt, rngs=nnx.Rngs(0))
    jsr.load_torch_state_dict(ours, ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,args,kwargs", TORCH_CONSTRUCTORS)
def test_torch_constructor_means_the_same(kind, args, kwargs, dtype):
    """Code written for torch.nn gives the same outputs, states and gradients in jsr, and its weights
    round-trip bit for bit."""
    jdt, tdt = DTYPES[dtype]
    ref, ours = torch_pair(kind, args, kwargs, dtype)
    label = f"{kind}(4, 6, *{args}, **{kwargs}) {dtype}"
    batch_first = ref.batch_first
    assert ours.batch_first == batch_first, label
    assert ours.output_size == (getattr(ref, "proj_size", 0) or ref.hidden_size) * (1 + ref.bidirectional), label
    rng = np.random.default_rng(12)
    x = rng.standard_normal((5, 30, 4) if batch_first else (30, 5, 4))
    t_x = torch.from_numpy(x).to(tdt).requires_grad_(True)
    t_out, t_state = ref(t_x)
    j_out, j_state = ours(jnp.asarray(x, jdt))
    atol = atol_for(jdt)
    assert_steps_close(f"{label}: output", j_out, t_out.detach(), atol, time_axis=1 if batch_first else 0)
    for name, j, t in zip(("h", "c"), state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{label}: final {name}", j, t.detach(), atol)

    # Gradients of a weighted sum of the outputs and the final states, per torch key and for the input.
    w_out = rng.standard_normal(t_out.shape)
    w_state = [rng.standard_normal(tuple(s.shape)) for s in state_leaves(t_state)]
    t_loss = (t_out * torch.from_numpy(w_out).to(tdt)).sum() + sum(
        (s * torch.from_numpy(w).to(tdt)).sum() for s, w in zip(state_leaves(t_state), w_state)
    )
    t_loss.backward()
    j_grads, j_gx = jax_gradients(
        ours, jnp.asarray(x, jdt), jnp.asarray(w_out, jdt), [jnp.asarray(w, jdt) for w in w_state]
    )
    t_grads = {k: p.grad for k, p in ref.named_parameters()}
    assert_grads_close(j_grads, t_grads, grad_rtol_for(jdt), context=f"{label}: ")
    assert_grads_close({"input": j_gx}, {"input": t_x.grad}, grad_rtol_for(jdt), context=f"{label}: ")

    # Weights back to torch: the same keys in the same order, bit for bit, into a fresh torch module.
    back = jsr.torch_state_dict(ours)
    assert list(back) == list(ref.state_dict()), label
    twin = getattr(torch.nn, kind)(4, 6, *args, **kwargs).to(tdt)
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)
    for key, value in ref.state_dict().items():
        assert torch.equal(twin.state_dict()[key], value), f"{label}: {key} changed in the round trip"


@pytest.mark.parametrize("kind,args,kwargs", TORCH_CONSTRUCTORS)
def test_unbatched_input_as_torch(kind, args, kwargs):
    """torch reads a 2-D input as one unbatched sequence [T, I] (state [L*D, H]) whatever batch_first says."""
    ref, ours = torch_pair(kind, args, kwargs, "float64")
    rng = np.random.default_rng(13)
    x = rng.standard_normal((9, 4))
    with torch.no_grad():
        _, t_init = ref(torch.from_numpy(rng.standard_normal((3, 4))))  # a non-zero unbatched state
        t_out, t_state = ref(torch.from_numpy(x), t_init)
    j_init = jax.tree.map(lambda t: jnp.asarray(t.numpy()), t_init)
    j_out, j_state = ours(jnp.asarray(x), j_init)
    label = f"{kind}(4, 6, *{args}, **{kwargs}) unbatched"
    assert j_out.shape == tuple(t_out.shape), label
    assert_steps_close(f"{label}: output", j_out[None], t_out[None], atol_for(np.float64))
    for name, j, t in zip(("h", "c"), state_leaves(j_state), state_leaves(t_state)):
        assert j.shape == tuple(t.shape), f"{label}: final {name} shape"
        assert_close(f"{label}: final {name}", j, t, atol_for(np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,kwargs", [("LSTM", {"proj_size": 3}), ("LSTM", {"bias": False}), ("GRU", {}),
                                         ("RNN", {"nonlinearity": "relu"})])
def test_time_major_bidirectional_lengths_match_packed(kind, kwargs, dtype):
    """torch's default layout with pack_padded_sequence (time-major), bidirectional, 2 layers."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    jdt, tdt = DTYPES[dtype]
    ref, ours = torch_pair(kind, (2,), {"bidirectional": True, **kwargs}, dtype)
    rng = np.random.default_rng(14)
    x = rng.standard_normal((20, 4, 4))  # [T, B, I]
    lengths = np.array([20, 3, 1, 11])
    with torch.no_grad():
        packed = pack_padded_sequence(torch.from_numpy(x).to(tdt), torch.from_numpy(lengths), enforce_sorted=False)
        t_out, t_state = ref(packed)
        t_out, _ = pad_packed_sequence(t_out, total_length=20)
    j_out, j_state = ours(jnp.asarray(x, jdt), lengths=jnp.asarray(lengths))
    label = f"{kind}(4, 6, 2, bidirectional=True, **{kwargs}) {dtype} time-major with lengths"
    assert_steps_close(f"{label}: output", j_out, t_out, atol_for(jdt), time_axis=0)
    for name, j, t in zip(("h", "c"), state_leaves(j_state), state_leaves(t_state)):
        assert_close(f"{label}: final {name}", j, t, atol_for(jdt))
