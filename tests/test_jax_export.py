"""`jax.export`, the way to ship a JAX model to serving: the layers, the Traveller (its stateful call and live
step, whose `TravellerState` the serialized program names) and the VAE's generation, exported with a symbolic
batch and time, serialized, read back and called at concrete sizes give the eager call's numbers."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import export

import jax_scan_rnn as jsr

pytest.importorskip("flatbuffers", reason="jax.export's serialization needs flatbuffers (the [dev] extra)")

B, T = export.symbolic_shape("b, t")
# The exported program is the one jax.jit compiles, but with b symbolic a one-row readout is a matmul, where a
# concrete B=1 is written as a fused sum (cells.matmul): the same products summed in another order.
SUMMATION_ORDER = 1e-6


def spec(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def round_trip(model: nnx.Module, call, *specs):
    """`call(model, *args)` exported over the model's parameters (a flat list: serializable) and `specs`, then
    serialized and deserialized: what a serving process would load."""
    model.eval()
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)

    def f(weights, *args):
        return call(nnx.merge(graph, jax.tree.unflatten(treedef, weights), rest), *args)

    loaded = export.deserialize(export.export(jax.jit(f))(leaves, *specs).serialize())
    return lambda *args: loaded.call(leaves, *args)


def traveller():
    return jsr.Traveller(num_inputs=4, hidden_size=8, num_layers=2, dropout=0.0, rngs=nnx.Rngs(0))


CASES = {
    "LSTM": (lambda: jsr.LSTM(4, 8, num_layers=2, rngs=nnx.Rngs(0)), lambda m, x: m(x), [spec(T, B, 4)],
             [jnp.linspace(-1, 1, 7 * 3 * 4, dtype=jnp.float32).reshape(7, 3, 4)]),
    "LSTM batch_first, bidirectional, proj_size": (
        lambda: jsr.LSTM(4, 8, batch_first=True, bidirectional=True, proj_size=3, rngs=nnx.Rngs(0)),
        lambda m, x: m(x), [spec(B, T, 4)], [jnp.linspace(-1, 1, 3 * 7 * 4, dtype=jnp.float32).reshape(3, 7, 4)]),
    "GRU": (lambda: jsr.GRU(4, 8, num_layers=2, rngs=nnx.Rngs(0)), lambda m, x: m(x), [spec(T, B, 4)],
            [jnp.linspace(-1, 1, 7 * 3 * 4, dtype=jnp.float32).reshape(7, 3, 4)]),
    # B=1 at the call: the thin readout's single-row path is chosen at trace time, where b is symbolic.
    "Traveller, positions and state": (traveller, lambda m, x: m(x), [spec(B, T, 4)],
                                       [jnp.linspace(-1, 1, 1 * 9 * 4, dtype=jnp.float32).reshape(1, 9, 4)]),
    "Traveller.step": (traveller, lambda m, state, x: m.step(state, x),
                       [jsr.TravellerState(spec(2, B, 8), spec(2, B, 8), spec(B, 2)), spec(B, 4)],
                       [jsr.TravellerState(jnp.full((2, 3, 8), 0.1, jnp.float32),
                                           jnp.full((2, 3, 8), -0.2, jnp.float32),
                                           jnp.full((3, 2), 0.3, jnp.float32)),
                        jnp.linspace(-1, 1, 12, dtype=jnp.float32).reshape(3, 4)]),
    "SeqVAE.generate": (lambda: jsr.SeqVAE(12, 8, 3, 1, rngs=nnx.Rngs(0)), lambda m, z: m.generate(z, 9),
                        [spec(B, 3)], [jnp.linspace(-2, 2, 12, dtype=jnp.float32).reshape(4, 3)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_exported_with_symbolic_batch_and_time_gives_the_eager_numbers(name):
    build, call, specs, args = CASES[name]
    model = build()
    got = round_trip(model, call, *specs)(*args)
    want = call(model, *args)
    assert jax.tree.structure(got) == jax.tree.structure(want)  # a TravellerState comes back as one
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert jnp.allclose(g, w, rtol=SUMMATION_ORDER, atol=SUMMATION_ORDER), \
            f"{name}: max |diff| {float(jnp.abs(g - w).max())}"
