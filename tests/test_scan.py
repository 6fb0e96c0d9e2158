"""`time_scan`: unroll and chunked rematerialisation change what is stored, never the numbers."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn.scan import time_scan

# Rematerialisation recomputes the same float64 operations in the same order: results agree to
# rounding of reassociated fusions at most.
REMAT_ATOL = 1e-12


def test_chunked_remat_equals_plain_scan_including_a_remainder():
    def step(c, x):
        c = jnp.tanh(c * 0.9 + x)
        return c, c * 2

    xs = jnp.asarray(np.random.default_rng(0).standard_normal((23, 3)))
    want = time_scan(step, jnp.zeros(3), xs)
    for chunk in (1, 5, 23, 40):
        got = time_scan(step, jnp.zeros(3), xs, remat_chunk=chunk)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, atol=REMAT_ATOL, err_msg=f"remat_chunk={chunk}")


def test_bad_arguments():
    with pytest.raises(ValueError, match="^remat_chunk: expected None or an int >= 1, got 0$"):
        time_scan(lambda c, x: (c, x), 0.0, jnp.zeros(3), remat_chunk=0)
    with pytest.raises(ValueError, match="^unroll: expected an int >= 1, got 0$"):
        time_scan(lambda c, x: (c, x), 0.0, jnp.zeros(3), unroll=0)
    with pytest.raises(ValueError, match="^unroll: expected an int >= 1, got True$"):
        time_scan(lambda c, x: (c, x), 0.0, jnp.zeros(3), unroll=True)
    with pytest.raises(ValueError, match="^unroll: expected an int >= 1, got 0$"):
        time_scan(lambda c, x: (c, x), 0.0, jnp.zeros(3), unroll=(1, 0))


def traveller_grads(remat_chunk):
    model = jsr.Traveller(3, 8, 2, 0.0, param_dtype=jnp.float64, remat_chunk=remat_chunk, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 50, 3)))
    loss, grads = nnx.value_and_grad(lambda m: (m(x)[0] ** 2).sum())(model)
    return loss, jax.tree.leaves(grads)


def test_traveller_remat_gives_the_same_loss_and_gradients():
    loss, grads = traveller_grads(None)
    loss_r, grads_r = traveller_grads(7)
    np.testing.assert_allclose(loss_r, loss, atol=REMAT_ATOL)
    for a, b in zip(grads_r, grads):
        np.testing.assert_allclose(a, b, atol=REMAT_ATOL)


@pytest.mark.parametrize("cls", [jsr.LSTM, jsr.GRU])
@pytest.mark.parametrize("shape", [(2, 30, 3), (30, 1, 3)], ids=["T2-B30", "T30-B1"])  # B=1: "auto" is two unrolls
def test_layer_remat_gives_the_same_gradients(cls, shape):
    x = jnp.asarray(np.random.default_rng(2).standard_normal(shape))
    grads = []
    for chunk in (None, 4):
        model = cls(3, 5, 2, param_dtype=jnp.float64, remat_chunk=chunk, rngs=nnx.Rngs(0))
        grads.append(jax.tree.leaves(nnx.grad(lambda m: (m(x)[0] ** 2).sum())(model)))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, atol=REMAT_ATOL)


def train_step_temp_bytes(remat_chunk, steps=2000):
    model = jsr.Traveller(4, 32, 2, 0.0, remat_chunk=remat_chunk, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    x = jnp.zeros((4, steps, 4), jnp.float32)

    def loss(params, x):
        return (nnx.merge(graphdef, params, rest)(x)[0] ** 2).sum()

    compiled = jax.jit(jax.grad(loss)).lower(params, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_remat_cuts_training_memory_on_long_sequences():
    plain, remat = train_step_temp_bytes(None), train_step_temp_bytes(50)  # ~sqrt(2000), a divisor
    assert remat * 3 <= plain, f"remat temp memory {remat} B is not a third of the plain scan's {plain} B"


def test_auto_unroll_follows_the_measured_rule():
    from jax_scan_rnn import scan

    assert scan.auto_unroll(1, "cpu") == scan.AUTO_UNROLL_CPU_BATCH1
    assert scan.auto_unroll(2, "cpu") == scan.auto_unroll(4, "cpu") == scan.auto_unroll(8, "cpu") == 1  # batch 1 only
    assert scan.auto_unroll(64, "cpu") == 1
    assert scan.auto_unroll(1, "gpu") == scan.auto_unroll(1024, "gpu") == scan.AUTO_UNROLL_GPU == 4
    assert scan.auto_unroll(64, "gpu", differentiated=False) == 4  # a forward pass too, on an H200
    assert scan.auto_unroll(1, "tpu") == 1  # not measured there
    assert scan.auto_unroll(1, "cpu", differentiated=False) == 1  # a forward pass: as fast, a smaller program
    assert scan.resolve_unroll(3, 1) == (3, 3)
    assert scan.resolve_unroll("auto", 1) == (scan.auto_unroll(1, differentiated=False), scan.auto_unroll(1))
    with pytest.raises(ValueError, match="^unroll: expected 'auto' or an int >= 1, got 'fast'$"):
        scan.resolve_unroll("fast", 1)
    # time_scan leaves "auto" to its caller, who knows the batch size
    with pytest.raises(ValueError, match="^unroll: expected an int >= 1, got 'auto'$"):
        time_scan(lambda c, x: (c, x), 0.0, jnp.zeros(3), unroll="auto")


def test_auto_unroll_gives_the_same_numbers_as_unroll_1():
    model = jsr.Traveller(3, 8, 2, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    assert model.lstm_layers.unroll == "auto"
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 37, 3)))
    np.testing.assert_allclose(model(x)[0], model(x, unroll=1)[0], rtol=0, atol=1e-13)


def _scan_unrolls(jaxpr) -> list[int]:
    """The `unroll` of every `scan` in `jaxpr`, nested ones (in custom rules, conds, other scans) included."""
    from jax_scan_rnn.scan import _equations

    return [eqn.params["unroll"] for eqn in _equations(jaxpr) if eqn.primitive.name == "scan"]


@pytest.mark.parametrize("build", [
    lambda: jsr.GRU(4, 6, 2, batch_first=True, param_dtype=jnp.float64, rngs=nnx.Rngs(0)),
    lambda: jsr.Traveller(4, 6, 2, param_dtype=jnp.float64, rngs=nnx.Rngs(0)),
], ids=["GRU", "Traveller"])
def test_auto_unroll_runs_a_forward_pass_at_one_and_a_differentiated_one_at_two(build, monkeypatch):
    """At batch 1 on a CPU, "auto" is two programs: unroll 1 when not differentiated, 2 when differentiated
    (forward and backward); the numbers are those of an explicit unroll 1 and 2, and forward mode works."""
    from jax_scan_rnn import cells, scan

    assert jax.default_backend() == "cpu" and scan.AUTO_UNROLL_CPU_BATCH1 == 2
    graphdef, params, rest = nnx.split(build(), nnx.Param, ...)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(1, 9, 4)))

    def loss(params, x, unroll="auto"):
        return jnp.sum(jnp.sin(nnx.merge(graphdef, params, rest)(x, unroll=unroll)[0]))

    assert set(_scan_unrolls(jax.make_jaxpr(loss)(params, x).jaxpr)) == {1}
    assert set(_scan_unrolls(jax.make_jaxpr(jax.grad(loss))(params, x).jaxpr)) == {2}
    assert jax.jit(loss)(params, x) == jax.jit(loss, static_argnums=2)(params, x, 1)
    got, want = jax.jit(jax.grad(loss))(params, x), jax.jit(jax.grad(loss), static_argnums=2)(params, x, 2)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b, err_msg=f"d loss / d {jax.tree_util.keystr(path)}")
    monkeypatch.setattr(cells, "HAND_WRITTEN_VJP", False)  # forward mode through the cells (see cells.py)
    tangent = jnp.ones_like(x)
    _, forward = jax.jvp(lambda x: loss(params, x), (x,), (tangent,))
    backward = jax.grad(loss, argnums=1)(params, x)
    np.testing.assert_allclose(forward, jnp.vdot(backward, tangent), rtol=REMAT_ATOL)
    # Second order (forward over reverse, as jax.hessian) goes through the custom rule's own derivative.
    def hessian_times_tangent(unroll):
        return jax.jvp(jax.grad(lambda x: loss(params, x, unroll)), (x,), (tangent,))[1]

    np.testing.assert_allclose(hessian_times_tangent("auto"), hessian_times_tangent(1), atol=REMAT_ATOL)


# Unroll 2 against 1: the same float64 operations per step, fused and ordered differently.
UNROLL_ATOL = 1e-12
# Batch-1 calls under a vmap, as "auto" sees them (batch 1 on a CPU: unroll 1 forward, 2 differentiated).
_LAYERS_AT_BATCH_1 = {
    "GRU[T,I]": (lambda unroll: jsr.GRU(3, 4, 2, unroll=unroll, param_dtype=jnp.float64, rngs=nnx.Rngs(0)),
                 lambda m, x: m(x)[0]),
    "LSTM[T,1,I]": (lambda unroll: jsr.LSTM(3, 4, 2, unroll=unroll, param_dtype=jnp.float64, rngs=nnx.Rngs(0)),
                    lambda m, x: m(x[:, None])[0]),
    "Traveller[1,T,F]": (lambda unroll: jsr.Traveller(3, 4, 2, unroll=unroll, param_dtype=jnp.float64,
                                                      rngs=nnx.Rngs(0)),
                         lambda m, x: m(x[None])[0]),
}


@pytest.mark.parametrize("case", _LAYERS_AT_BATCH_1)
def test_gradients_through_a_vmap_of_batch_1_calls_equal_unroll_1s(case):
    """grad of a vmap whose calls each see batch 1 (unbatched sequences), and vmap of grad: the numbers of an
    explicit unroll 1. (Once "auto"'s unroll-by-use rule was a custom_jvp, which JAX cannot batch inside a grad
    over the cells' custom_vjp: a TypeError about forward mode.)"""
    build, call = _LAYERS_AT_BATCH_1[case]
    xs = jnp.asarray(np.random.default_rng(5).normal(size=(3, 6, 3)))  # 3 sequences, T=6, I=3

    def grad_of_vmap(model):
        return nnx.grad(lambda m: jnp.sum(jnp.sin(jax.vmap(lambda x: call(m, x))(xs))))(model)

    def vmap_of_grad(model):
        return nnx.vmap(nnx.grad(lambda m, x: jnp.sum(jnp.sin(call(m, x)))), in_axes=(None, 0))(model, xs)

    for grads in (grad_of_vmap, vmap_of_grad):
        got, want = grads(build("auto")), grads(build(1))
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, rtol=0, atol=UNROLL_ATOL,
                                       err_msg=f"{grads.__name__}: d loss / d {jax.tree_util.keystr(path)}")


def test_gradients_of_an_nnx_vmap_ensemble_at_batch_1_equal_unroll_1s():
    """An ensemble of jsr.LSTMs (nnx.vmap over the members), each reading one batch-1 sequence."""
    x = jnp.asarray(np.random.default_rng(6).normal(size=(5, 1, 3)))

    def grads(unroll):
        @nnx.split_rngs(splits=2)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return jsr.LSTM(3, 4, 2, unroll=unroll, param_dtype=jnp.float64, rngs=rngs)

        def loss(members):
            return jnp.sum(jnp.sin(nnx.vmap(lambda m, x: m(x)[0], in_axes=(0, None))(members, x)))

        return jax.tree.leaves(nnx.grad(loss)(make(nnx.Rngs(0))))

    for a, b in zip(grads("auto"), grads(1)):
        np.testing.assert_allclose(a, b, rtol=0, atol=UNROLL_ATOL)


def test_forward_mode_through_a_vmap_of_batch_1_calls(monkeypatch):
    """Forward mode where it works, through the cells' JAX-derived gates: the tangents of unroll 1; with the
    cells' hand-written rule on it is refused, saying which switch to turn."""
    from jax_scan_rnn import cells

    build, call = _LAYERS_AT_BATCH_1["GRU[T,I]"]
    xs = jnp.asarray(np.random.default_rng(7).normal(size=(3, 6, 3)))
    tangent = jnp.ones_like(xs)

    def forward(model):
        return jax.jvp(jax.vmap(lambda x: call(model, x)), (xs,), (tangent,))[1]

    with pytest.raises(TypeError, match="custom_vjp.*HAND_WRITTEN_VJP = False"):
        forward(build("auto"))
    monkeypatch.setattr(cells, "HAND_WRITTEN_VJP", False)
    np.testing.assert_allclose(forward(build("auto")), forward(build(1)), rtol=0, atol=UNROLL_ATOL)


def test_auto_hoist_follows_the_measured_rule():
    from jax_scan_rnn import scan

    assert scan.auto_hoist("cpu") is False and scan.auto_hoist("gpu") is True
    assert scan.resolve_hoist(True) is True and scan.resolve_hoist(False) is False
    assert scan.resolve_hoist("auto") is scan.auto_hoist()
    for build in (
        lambda: jsr.Traveller(3, 8, 2, hoist_inputs="yes", rngs=nnx.Rngs(0)),
        lambda: jsr.GRU(3, 8, hoist_inputs="yes", rngs=nnx.Rngs(0)),
        lambda: jsr.SeqVAE(8, 8, 2, 1, hoist_inputs="yes", rngs=nnx.Rngs(0)),
    ):
        with pytest.raises(ValueError, match="hoist_inputs: expected one of True, False, 'auto', got 'yes'"):
            build()


@pytest.mark.parametrize("remat_chunk", [None, 7])
def test_hoisted_and_inside_projections_give_the_same_numbers(remat_chunk):
    """Layer 0's feature projection before the loop or inside it: the same positions and gradients."""
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 30, 3)))
    results = []
    for hoist in (True, False):
        model = jsr.Traveller(3, 8, 2, param_dtype=jnp.float64, hoist_inputs=hoist, remat_chunk=remat_chunk,
                              rngs=nnx.Rngs(0))
        # jitted as users call it (jsr.jit): eagerly, every op of the scan's gradient compiles on its own (2x slower)
        loss, grads = nnx.jit(nnx.value_and_grad(lambda m: (m(x)[0] ** 2).sum()))(model)
        results.append((nnx.jit(lambda m: m(x)[0])(model), loss, jax.tree.leaves(grads)))
    (pos_a, loss_a, grads_a), (pos_b, loss_b, grads_b) = results
    np.testing.assert_allclose(pos_b, pos_a, atol=REMAT_ATOL)
    np.testing.assert_allclose(loss_b, loss_a, atol=REMAT_ATOL)
    for a, b in zip(grads_b, grads_a):
        np.testing.assert_allclose(b, a, atol=REMAT_ATOL)


# remat_chunk=None repeats chunk 7's check without rematerialisation: slow (15 s), outside the default run.
@pytest.mark.parametrize("remat_chunk", [pytest.param(None, marks=pytest.mark.slow), 7])
def test_layers_hoisted_and_inside_give_the_same_numbers(remat_chunk):
    """jsr.LSTM (bidirectional, with lengths) and the SeqVAE's teacher-forced loss, projections before the
    loop or inside it: the same outputs and gradients, with and without remat."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((3, 30, 5)))
    lengths = jnp.asarray([30, 4, 17])
    tokens = jnp.asarray(rng.integers(3, 9, (3, 12)))
    results = []
    for hoist in (True, False):
        lstm = jsr.LSTM(5, 6, 2, batch_first=True, bidirectional=True, param_dtype=jnp.float64, hoist_inputs=hoist,
                        remat_chunk=remat_chunk, rngs=nnx.Rngs(0))
        vae = jsr.SeqVAE(9, 6, 2, 2, param_dtype=jnp.float64, hoist_inputs=hoist, remat_chunk=remat_chunk,
                         rngs=nnx.Rngs(0))
        # jitted as users call it (jsr.jit): eagerly this test took 30-70 s, every op of the gradient compiled alone
        out, grads = nnx.jit(nnx.value_and_grad(lambda m: (m(x, lengths=lengths)[0] ** 2).sum()))(lstm)
        elbo, vae_grads = nnx.jit(nnx.value_and_grad(
            lambda m: m.loss(tokens, jnp.full((3,), 12), eps=jnp.zeros((3, 2)))["total"]
        ))(vae)
        results.append([out, *jax.tree.leaves(grads), elbo, *jax.tree.leaves(vae_grads)])
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, atol=REMAT_ATOL)


@pytest.mark.parametrize("steps", [5, 0])
@pytest.mark.parametrize("remat_chunk", [None, 2])
def test_inside_shard_map_a_carry_leaf_the_step_keeps_invariant_stays_invariant(remat_chunk, steps):
    # The zero state is marked varying because the step mixes it with the split batch; marking every leaf over
    # every axis also made a step counter varying, and shard_map refused it an unsplit output (out_specs P():
    # "out_specs which require replication which can't be statically inferred"), which it had accepted.
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    P = jax.sharding.PartitionSpec

    def step(carry, x):
        count, h = carry
        return (count + 1, 0.5 * h + x), h

    def run(xs):
        (count, h), ys = time_scan(step, (jnp.int32(0), jnp.zeros(xs.shape[1:])), xs, remat_chunk=remat_chunk)
        return count, h, ys

    xs = jnp.ones((steps, 4, 3))
    split = jax.shard_map(run, mesh=mesh, in_specs=P(None, "data"), out_specs=(P(), P("data"), P(None, "data")))
    count, h, ys = split(xs)
    want = jax.lax.scan(step, (jnp.int32(0), jnp.zeros((4, 3))), xs)
    assert int(count) == steps
    np.testing.assert_array_equal(h, want[0][1])
    np.testing.assert_array_equal(ys, want[1])
