"""`jsr.feedback_scan` called as a user calls it on a model of their own (examples/05 runs one whole): the state
as the layers take it or per layer, and what a wrong one gets."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_scan_rnn as jsr


def rollout(core, state, steps: int = 6, batch: int = 3):
    """A forecaster's rollout: each step reads [its previous output, u_t]; returns (final state, outputs)."""
    head = nnx.Linear(core.hidden_size, 1, rngs=nnx.Rngs(1))
    u = jnp.asarray(np.random.default_rng(0).standard_normal((steps, batch, 2)), jnp.float32)  # [T, B, 2]
    final, last, ys = jsr.feedback_scan(
        core, state, jnp.zeros((batch, 1), jnp.float32), u,
        inject=lambda fb, u_t: core.layers[0].input_projection(jnp.concatenate([fb, u_t], -1)),
        readout=lambda h, u_t: head(h), feed=lambda y, u_t: y)
    np.testing.assert_array_equal(np.asarray(last), np.asarray(ys[-1]))  # the fed-back value after the last step
    return final, ys


@pytest.mark.parametrize("core", [
    lambda: jsr.GRU(3, 8, num_layers=3, dropout=0.4, rngs=nnx.Rngs(0)),
    lambda: jsr.LSTM(3, 8, num_layers=2, proj_size=3, dropout=0.5, rngs=nnx.Rngs(0)),  # masks [B, P], not [B, H]
], ids=["GRU-3-layers", "LSTM-projected"])
def test_a_dropout_key_draws_each_steps_masks_as_step_dropout_masks(core):
    """`dropout_key=key`: step t's inter-layer masks are `core.step_dropout_masks(key, t, h's shape)`, another draw
    each step; the same as passing those masks."""
    core = core()
    steps, batch = 6, 4
    u = jnp.asarray(np.random.default_rng(1).standard_normal((steps, batch, 2)), jnp.float32)
    key = jax.random.key(7)
    width = core.layers[0].state_size  # h's size: P with a projection

    def run(**masks):
        return jsr.feedback_scan(
            core, core.initial_state(batch), jnp.zeros((batch, 1), jnp.float32), u,
            inject=lambda fb, u_t: core.layers[0].input_projection(jnp.concatenate([fb, u_t], -1)),
            readout=lambda h, u_t: h[:, :1], feed=lambda y, u_t: y, **masks)[2]

    masks = jnp.stack([core.step_dropout_masks(key, t, (batch, width), jnp.float32) for t in range(steps)])
    assert not np.array_equal(masks[0], masks[1])
    np.testing.assert_allclose(run(dropout_key=key), run(dropout_masks=masks), atol=1e-6)


def test_the_cores_own_dropout_acts_by_default_in_training_mode():
    """As the core's call over a whole sequence applies its dropout in training mode, so does feedback_scan by
    default (its dropout stream); after eval(), or with dropout_key=None, none."""
    core = jsr.GRU(3, 8, num_layers=2, dropout=0.5, rngs=nnx.Rngs(0))
    u = jnp.asarray(np.random.default_rng(1).standard_normal((6, 4, 2)), jnp.float32)

    def run(**kw):
        return jsr.feedback_scan(
            core, core.initial_state(4), jnp.zeros((4, 1), jnp.float32), u,
            inject=lambda fb, u_t: core.layers[0].input_projection(jnp.concatenate([fb, u_t], -1)),
            readout=lambda h, u_t: h[:, :1], feed=lambda y, u_t: y, **kw)[2]

    first, second, without = run(), run(), run(dropout_key=None)
    assert not np.array_equal(first, second) and not np.array_equal(first, without)
    core.eval()
    np.testing.assert_array_equal(run(), without)
    with pytest.raises(ValueError, match=r"^dropout_key: expected one of 'core', got 'own'$"):
        run(dropout_key="own")


@pytest.mark.parametrize("cls", [jsr.GRU, jsr.RNN, jsr.LSTM])
def test_an_unprojected_input_is_refused_naming_inject(cls):
    """inject must give layer 0's projected input [B, G*H]: the raw [fb, u_t] would broadcast over a GRU's or an
    RNN's gates and train another model, silently."""
    core = cls(3, 8, rngs=nnx.Rngs(0))
    u = jnp.zeros((5, 4, 2), jnp.float32)
    width = core.layers[0].w_hh.shape[1]
    with pytest.raises(ValueError, match=rf"^xp0 \(feedback_scan's inject\): expected layer 0's projected input "
                                         rf"\[B, G\*H\] = \[4, {width}\] .* got shape \[4, 3\](\n|$)"):
        jsr.feedback_scan(core, core.initial_state(4), jnp.zeros((4, 1), jnp.float32), u,
                          inject=lambda fb, u_t: jnp.concatenate([fb, u_t], -1),
                          readout=lambda h, u_t: h[:, :1], feed=lambda y, u_t: y)


@pytest.mark.parametrize("cls", [jsr.LSTM, jsr.GRU, jsr.RNN])
def test_the_state_as_the_layers_take_it_or_per_layer_gives_the_same_rollout(cls):
    core = cls(3, 5, 2, rngs=nnx.Rngs(0))
    state = jax.tree.map(lambda z: z + 0.3, core.initial_state(3))  # [2, 3, 5] leaves, not zeros
    final, ys = rollout(core, state)
    per_layer_final, per_layer_ys = rollout(core, core.unstack_state(state))
    np.testing.assert_array_equal(np.asarray(ys), np.asarray(per_layer_ys))
    assert isinstance(per_layer_final, list) and len(per_layer_final) == 2
    # Given stacked, returned stacked: the layout jsr.LSTM/GRU/RNN return and take back.
    assert jax.tree.structure(final) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(core.stack_carries(per_layer_final))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_core_of_ones_own_and_masks_shared_by_the_batch_are_taken():
    """A module with a stack's methods is a core (not only jsr's classes), and inter-layer masks of batch 1 broadcast
    over the batch, as they did before the arguments were checked."""

    class Wrapped(nnx.Module):
        def __init__(self):
            self.gru = jsr.GRU(3, 5, 2, rngs=nnx.Rngs(0))
            self.num_layers, self.layers = 2, self.gru.layers

        def step(self, *args):
            return self.gru.step(*args)

        def unstack_state(self, state):
            return self.gru.unstack_state(state)

        def stack_carries(self, carries):
            return self.gru.stack_carries(carries)

        def dropout_key(self):
            return None

    wrapped = Wrapped()
    core = wrapped.gru
    mask = jax.random.bernoulli(jax.random.key(1), 0.5, (6, 1, 1, 5)).astype(jnp.float32) * 2
    runs = []
    for c, masks in ((wrapped, mask), (core, jnp.broadcast_to(mask, (6, 1, 4, 5)))):
        runs.append(jsr.feedback_scan(
            c, core.initial_state(4), jnp.zeros((4, 1), jnp.float32), jnp.ones((6, 4, 2), jnp.float32),
            dropout_masks=masks, dropout_key=None, inject=lambda fb, u_t: core.layers[0].input_projection(jnp.concatenate([fb, u_t], -1)),
            readout=lambda h, u_t: h[:, :1], feed=lambda y, u_t: y)[2])
    np.testing.assert_array_equal(runs[0], runs[1])


def test_a_per_layer_list_of_the_wrong_length_names_carries():
    core = jsr.GRU(3, 5, 2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"carries: expected one per layer \(2\), got 1"):
        rollout(core, core.unstack_state(core.initial_state(3))[:1])


# A wrong argument is refused in one line naming it, with what was expected and what was given (shapes are static),
# rather than by lax.scan ("different leading axis sizes"), an op inside the step ("mul got incompatible shapes"),
# Python ("list index out of range", "no attribute 'unstack_state'") or as a wrong xp0.
@pytest.mark.parametrize("change, error, message", [
    ({"xs": None}, ValueError,
     (r"xs: expected per-step inputs with time-major \[T, \.\.\.\] leaves \(e\.g\. jnp\.zeros\(\(T, 0\)\) for none\), "
      r"got None")),
    ({"xs": ()}, ValueError, r"xs: expected per-step inputs .*, got \(\)"),
    ({"xs": (jnp.zeros((6, 4, 2)), jnp.zeros(5))}, ValueError,
     r"xs: expected time-major \[T, \.\.\.\] leaves with one T, got shapes \[6, 4, 2\], \[5\]"),
    ({"dropout_masks": jnp.ones((6, 1, 4, 6))}, ValueError,
     r"dropout_masks: expected shape \[T, L-1, B, H\] = \[6, 1, 4, 5\], got \[6, 1, 4, 6\]"),
    ({"dropout_masks": jnp.ones((5, 1, 4, 5))}, ValueError,
     r"dropout_masks: expected shape \[T, L-1, B, H\] = \[6, 1, 4, 5\], got \[5, 1, 4, 5\]"),
    ({"core": jsr.GRUCell(3, 5, rngs=nnx.Rngs(0))}, TypeError,
     r"core: expected a stack of layers \(jsr.LSTM, jsr.GRU, jsr.RNN\), got GRUCell"),
    ({"core": nnx.GRUCell(3, 5, rngs=nnx.Rngs(0))}, TypeError, r"core: expected a stack of layers .*, got GRUCell"),
    ({"carries": jnp.zeros((2, 3, 5))}, ValueError,
     (r"carries: expected batch 4, that of the step's input \(inject's xp0 \[4, 15\], from feedback and xs\), "
      r"got batch 3 \(layer 0's \[3, 5\]\)")),
    ({"feedback": jnp.zeros((4, 1), jnp.float16), "xs": jnp.zeros((6, 4, 2), jnp.float32)}, ValueError,
     r"feedback: expected what `feed` returns each step, float32\[4, 1\], got float16\[4, 1\]: give feedback in "
     r"feed's shape and dtype"),
    ({"feedback": jnp.zeros((4, 2), jnp.float32), "xs": jnp.zeros((6, 4, 2), jnp.float32)}, ValueError,
     r"feedback: expected what `feed` returns each step, float32\[4, 1\], got float32\[4, 2\]: give .*"),
    # A stacked state of another number of layers ran: JAX clamps the index past its end, so a [1, B, H] state fed
    # layer 0's state to layer 1 too, and a [3, B, H] one dropped its last layer; another H failed inside the step.
    ({"carries": jnp.zeros((1, 4, 5))}, ValueError, r"carries: expected a \[2, 4, 5\] array, got shape \(1, 4, 5\)"),
    ({"carries": jnp.zeros((3, 4, 5))}, ValueError, r"carries: expected a \[2, 4, 5\] array, got shape \(3, 4, 5\)"),
    ({"carries": jnp.zeros((2, 4, 6))}, ValueError, r"carries: expected a \[2, 4, 5\] array, got shape \(2, 4, 6\)"),
    ({"carries": jnp.zeros((4, 5))}, ValueError, r"carries: expected a \[2, B, 5\] array, got shape \(4, 5\)"),
], ids=["xs-None", "xs-empty", "xs-two-T", "masks-H", "masks-T", "jsr-cell", "nnx-cell", "carries-batch",
        "feedback-dtype", "feedback-shape", "carries-fewer-layers", "carries-more-layers", "carries-H", "carries-rank"])
def test_a_wrong_argument_is_named_in_one_line(change, error, message):
    core = jsr.GRU(3, 5, 2, rngs=nnx.Rngs(0))
    args = {"core": core, "carries": core.initial_state(4), "feedback": jnp.zeros((4, 1)), "xs": jnp.zeros((6, 4, 2)),
            "dropout_key": None} | change
    with pytest.raises(error, match=f"^{message}(\n|$)"):  # carries': checked in the scan body (JAX adds a note)
        jsr.feedback_scan(
            # (layer 0 reads the feedback's first column, in the inputs' dtype: a wrong feedback reaches `feed`)
            **args, readout=lambda h, u_t: h[:, :1], feed=lambda y, u_t: y,
            inject=lambda fb, u_t: core.layers[0].input_projection(jnp.concatenate([fb[:, :1].astype(u_t.dtype), u_t],
                                                                                   -1)))


def test_the_masks_of_a_projected_lstm_are_spelled_with_p():
    """With `proj_size=P` the layers pass P features to each other, so the masks are `[T, L-1, B, P]`; the error
    spells that, not `[..., H] = [..., P]` (a width H, the hidden size, that the masks must not have)."""
    core = jsr.LSTM(3, 5, 2, proj_size=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"^dropout_masks: expected shape \[T, L-1, B, P\] = \[6, 1, 4, 2\], "
                                         r"got \[6, 1, 4, 5\]$"):
        jsr.feedback_scan(core, core.initial_state(4), jnp.zeros((4, 1)), jnp.zeros((6, 4, 2)),
                          inject=lambda fb, u_t: core.layers[0].input_projection(jnp.concatenate([fb, u_t], -1)),
                          readout=lambda h, u_t: h[:, :1], feed=lambda y, u_t: y, dropout_masks=jnp.ones((6, 1, 4, 5)))
