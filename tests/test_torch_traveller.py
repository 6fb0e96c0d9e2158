"""torch_ref.Traveller: its four loop methods agree, state carried across calls, the seed's checkpoints,
dropout, errors."""
from __future__ import annotations

import collections
import re
import warnings

import numpy as np
import pytest
import torch

import torch_ref.traveller as traveller_module
from torch_ref import Traveller, TravellerState
from torch_ref.traveller import LAYOUTS, compiled_loop, scan_available

# float64: the methods run the same operations in a different grouping (per-step nn.LSTM vs. cell math),
# so they differ only by accumulated rounding, ~1e-16 per op.
TOL_F64 = 1e-12
# float32: rounding of ~6e-8 per op, compounded through the position feedback over T steps.
TOL_F32 = 1e-5
# float64 gradients: backward sums T per-step contributions into each weight entry, adding rounding.
GRAD_TOL_F64 = 1e-10

ALL_METHODS = ["loop", "cell", "script"] + (["scan"] if scan_available() else [])
EXPLICIT_MASK_METHODS = ["cell", "script"] + (["scan"] if scan_available() else [])
NUM_INPUTS, HIDDEN = 3, 8


def make_model(
    num_layers=2, dropout=0.0, dtype=torch.float64, seed=0, num_inputs=NUM_INPUTS, hidden=HIDDEN, num_assets=2
):
    """A Traveller with random weights and clearly non-zero biases (a zero bias hides a mapping bug)."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        # nn.LSTM warns that dropout does nothing with one layer; that case is tested on purpose.
        warnings.filterwarnings("ignore", message=".*dropout option adds dropout after all but last")
        model = Traveller(num_inputs, hidden, num_layers, dropout, num_assets).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.6, 0.6)
    assert all(model.lstm_layers.get_parameter(f"bias_ih_l{k}").abs().min() > 0 for k in range(num_layers))
    return model.eval()


def random_inputs(*shape, dtype=torch.float64, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_close(got, want, tol, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    assert err <= tol, f"{what}: max abs difference {err:.3e} > {tol:.0e}"


class SeedTraveller(torch.nn.Module):
    """The seed's Traveller, literally, corrected only where it was wrong: `super().__init__()`, the
    output-shape assert, and no `@torch.jit.script_method` (which compiles nothing on a plain nn.Module)."""

    def __init__(self, num_inputs: int, hidden_size: int, num_layers: int, dropout: float):
        super().__init__()
        self.lstm_layers = torch.nn.LSTM(
            input_size=num_inputs + 2,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
            batch_first=True,
        )
        self.output_layer = torch.nn.Linear(in_features=hidden_size, out_features=2)
        self.activation = torch.nn.Tanh()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        assert inputs.shape[1] == 1, "window should always be 1 since we're not using sequences"
        hidden_state = None
        prev_position = torch.zeros((1, 1, 2), device=inputs.device, dtype=inputs.dtype)
        positions_list = []
        seq_len = inputs.size(0)
        for t in range(seq_len):
            current_inputs = inputs[t : t + 1]
            input_data = torch.cat([prev_position, current_inputs], dim=2)
            lstm_out, hidden_state = self.lstm_layers(input_data, hidden_state)
            out = self.output_layer(lstm_out)
            position = self.activation(out)
            prev_position = position
            positions_list.append(position)
        positions = torch.cat(positions_list, dim=0).squeeze(dim=1)
        assert positions.shape == (inputs.shape[0], 2)
        return positions


# ---------------------------------------------------------------------------------------------------
# The methods agree
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("num_layers", "num_assets"), [(1, 2), (2, 2), (3, 2), (2, 1), (2, 5)])
def test_all_methods_agree_in_float64_batched(num_layers, num_assets):
    model = make_model(num_layers, num_assets=num_assets)
    x = random_inputs(3, 6, NUM_INPUTS) * 3  # large features push tanh to its bounds
    hc = (num_layers, 3, HIDDEN)
    with torch.no_grad():
        want, want_state = model(x, method="loop")
        assert want.shape == (3, 6, num_assets) and want.abs().max() <= 1.0
        assert [tuple(t.shape) for t in want_state] == [hc, hc, (3, num_assets)]
        for method in ALL_METHODS[1:]:
            got, state = model(x, method=method)
            assert_close(got, want, TOL_F64, f"method={method}, layers={num_layers}, A={num_assets}")
            for name in TravellerState._fields:
                what = f"final state.{name}, method={method}, layers={num_layers}, A={num_assets}"
                assert_close(getattr(state, name), getattr(want_state, name), TOL_F64, what)


def test_all_methods_agree_in_float32():
    model = make_model(2, dtype=torch.float32)
    x = random_inputs(2, 8, NUM_INPUTS, dtype=torch.float32)
    with torch.no_grad():
        want, _ = model(x, method="loop")
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method)[0], want, TOL_F32, f"float32 method={method}")


def test_all_methods_agree_in_seed_layout():
    model = make_model(3)
    x = random_inputs(7, 1, NUM_INPUTS)
    with torch.no_grad():
        want, _ = model(x, method="loop", layout="seed")
        assert want.shape == (7, 2)
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method, layout="seed")[0], want, TOL_F64, f"seed layout, method={method}")


@pytest.mark.parametrize("method", ALL_METHODS)
def test_seed_layout_equals_batch_layout_with_one_sequence(method):
    model = make_model(2)
    x = random_inputs(6, 1, NUM_INPUTS)  # the seed's [T, 1, F]
    with torch.no_grad():
        seed, seed_state = model(x, method=method, layout="seed")
        batched, batch_state = model(x.transpose(0, 1), method=method, layout="batch")  # [1, T, F]
    assert seed.shape == (6, 2) and batched.shape == (1, 6, 2)
    assert_close(seed, batched[0], TOL_F64, f"seed vs batch B=1, method={method}")
    assert seed_state.h.shape == (2, 1, HIDDEN) and seed_state.positions.shape == (1, 2)  # B = 1
    for name in TravellerState._fields:
        assert_close(getattr(seed_state, name), getattr(batch_state, name), TOL_F64, f"state.{name}, {method}")


def test_default_layout_is_batch_even_for_one_step_sequences():
    model = make_model(1)
    x = random_inputs(4, 1, NUM_INPUTS)
    with torch.no_grad():
        as_seed, _ = model(x, method="cell", layout="seed")  # one sequence of T = 4 steps
        as_batch, state = model(x, method="cell")  # the default: four sequences of one step
    assert LAYOUTS == ("batch", "seed")
    assert as_seed.shape == (4, 2) and as_batch.shape == (4, 1, 2) and state.positions.shape == (4, 2)
    assert_close(as_seed[0], as_batch[0, 0], TOL_F64, "first step is the same either way")
    assert not torch.allclose(as_seed[1:], as_batch[1:, 0]), "later steps differ: feedback vs. fresh state"


def test_sequences_in_a_batch_are_independent():
    model = make_model(2)
    x = random_inputs(3, 5, NUM_INPUTS)
    with torch.no_grad():
        whole, _ = model(x, method="cell")
        alone = torch.cat([model(x[b : b + 1], method="cell", layout="batch")[0] for b in range(3)])
    assert_close(whole, alone, TOL_F64, "batched vs one sequence at a time")


def test_methods_share_the_modules_parameters():
    model = make_model(2)
    weights = model.flat_weights()
    assert weights[0] is model.lstm_layers.weight_ih_l0 and weights[-1] is model.output_layer.bias
    assert len(weights) == 4 * 2 + 2
    x = random_inputs(2, 4, NUM_INPUTS)
    with torch.no_grad():
        model.lstm_layers.bias_hh_l1.add_(0.3)  # an in-place change must reach every method
        model.output_layer.weight.mul_(-1.0)
        want, _ = model(x, method="loop")
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method)[0], want, TOL_F64, f"after an update, method={method}")


# ---------------------------------------------------------------------------------------------------
# State: one call, chunks and single steps are the same computation
# ---------------------------------------------------------------------------------------------------

CHUNKS = (3, 4, 5)  # T = 12 in three calls of different lengths


def assert_identical(got, want, what):
    """Bit-identical tensors (the same operations on the same values), with a message naming `what`."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.equal(got, want), f"{what}: not bit-identical, max abs difference {(got - want).abs().max():.3e}"


def assert_states_identical(got, want, what):
    assert isinstance(got, TravellerState), f"{what}: got a {type(got).__name__}, not a TravellerState"
    for name in TravellerState._fields:
        assert_identical(getattr(got, name), getattr(want, name), f"{what}, state.{name}")


def run_in_chunks(model, x, chunks, state=None, **kwargs):
    """`model` over x [B, T, F] in consecutive chunks of the given lengths, passing the state along."""
    positions, start = [], 0
    for length in chunks:
        p, state = model(x[:, start : start + length], state, **kwargs)
        positions.append(p)
        start += length
    assert start == x.shape[1]
    return torch.cat(positions, dim=1), state


def run_by_step(model, x, state=None):
    """`model.step` over x [B, T, F], one step at a time."""
    positions = []
    for t in range(x.shape[1]):
        p, state = model.step(state, x[:, t])
        positions.append(p)
    return torch.stack(positions, dim=1), state


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_one_call_chunks_and_single_steps_are_bit_identical(method, dtype):
    model = make_model(2, dtype=dtype)
    x = random_inputs(2, sum(CHUNKS), NUM_INPUTS, dtype=dtype)
    with torch.no_grad():
        want, want_state = model(x, method=method)
        got, state = run_in_chunks(model, x, CHUNKS, method=method)
        assert_identical(got, want, f"positions in chunks {CHUNKS}, method={method}")
        assert_states_identical(state, want_state, f"chunks {CHUNKS}, method={method}")
        got, state = run_in_chunks(model, x, [1] * x.shape[1], method=method)
        assert_identical(got, want, f"positions one step per call, method={method}")
        assert_states_identical(state, want_state, f"one step per call, method={method}")
        assert_identical(want_state.positions, want[:, -1], f"state.positions is the last step's, method={method}")

        got, state = run_by_step(model, x)
        if method == "loop":
            # `step` runs the cell math of "cell"/"script"/"scan"; "loop" runs nn.LSTM's kernel, which
            # (in float32 on CPU) rounds differently: equal to rounding, not bit for bit.
            tol = TOL_F32 if dtype == torch.float32 else TOL_F64
            assert_close(got, want, tol, "step one at a time vs method=loop")
            for name in TravellerState._fields:
                assert_close(getattr(state, name), getattr(want_state, name), tol, f"step vs loop, state.{name}")
        else:
            assert_identical(got, want, f"positions of step one at a time, method={method}")
            assert_states_identical(state, want_state, f"step one at a time, method={method}")


def random_state(model, batch, seed=7):
    lstm = model.lstm_layers
    g = torch.Generator().manual_seed(seed)
    shape = (lstm.num_layers, batch, lstm.hidden_size)
    dtype = lstm.weight_hh_l0.dtype
    return TravellerState(
        h=torch.randn(shape, generator=g, dtype=dtype).tanh(),
        c=torch.randn(shape, generator=g, dtype=dtype),
        positions=torch.rand(batch, 2, generator=g, dtype=dtype) * 2 - 1,
    )


def test_every_method_starts_from_a_given_state():
    model = make_model(3)
    x = random_inputs(2, 5, NUM_INPUTS)
    start = random_state(model, 2)
    with torch.no_grad():
        want, want_state = model(x, start, method="loop")
        from_zero, _ = model(x, method="loop")
        assert not torch.allclose(want, from_zero), "the given state must change the positions"
        # The first step reads the given positions and (h, c): check it against the single-step math.
        first, _ = model.step(start, x[:, 0])
        assert_close(want[:, 0], first, TOL_F64, "first step from the given state")
        for method in ALL_METHODS[1:]:
            got, state = model(x, start, method=method)
            assert_close(got, want, TOL_F64, f"positions from a given state, method={method}")
            for name in TravellerState._fields:
                what = f"final state.{name} from a given state, method={method}"
                assert_close(getattr(state, name), getattr(want_state, name), TOL_F64, what)
    assert_identical(start.h, random_state(model, 2).h, "the given state is not modified in place")


def test_state_none_is_the_zero_state():
    model = make_model(2)
    zero = model.initial_state(3)
    assert isinstance(zero, TravellerState)
    assert [tuple(t.shape) for t in zero] == [(2, 3, HIDDEN), (2, 3, HIDDEN), (3, 2)]
    assert all(t.dtype == torch.float64 and t.device.type == "cpu" and not t.any() for t in zero)
    x = random_inputs(3, 4, NUM_INPUTS)
    with torch.no_grad():
        for method in ALL_METHODS:
            assert_identical(model(x, zero, method=method)[0], model(x, method=method)[0], f"zero state, {method}")
        assert_identical(model.step(zero, x[:, 0])[0], model.step(None, x[:, 0])[0], "step from the zero state")
    with pytest.raises(TypeError, match=r"batch_size: expected an int, got float"):
        model.initial_state(2.0)


def test_gradients_flow_through_the_state_across_chunks():
    model = make_model(2)
    x = random_inputs(2, 7, NUM_INPUTS)
    weights = torch.linspace(-1.0, 1.0, 2 * 7 * 2, dtype=torch.float64).reshape(2, 7, 2)
    for method in ("loop", "cell"):
        model.zero_grad()
        (model(x, method=method)[0] * weights).sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        (run_in_chunks(model, x, (3, 4), method=method)[0] * weights).sum().backward()
        for (name, p), g in zip(model.named_parameters(), want):
            assert_close(p.grad, g, GRAD_TOL_F64, f"grad of {name} in chunks, method={method}")


@pytest.mark.parametrize("method", ALL_METHODS)
def test_seed_layout_round_trip_with_state(method):
    """The seed's [T, 1, F] in chunks, and stepped, carries a B = 1 state that the batch layout accepts."""
    model = make_model(2)
    x = random_inputs(9, 1, NUM_INPUTS)  # the seed's [T, 1, F]
    with torch.no_grad():
        want, want_state = model(x, method=method, layout="seed")
        assert want.shape == (9, 2) and want_state.h.shape == (2, 1, HIDDEN) and want_state.positions.shape == (1, 2)
        head, state = model(x[:4], method=method, layout="seed")
        tail, state = model(x[4:], state, method=method, layout="seed")
        assert_identical(torch.cat([head, tail]), want, f"seed layout in two chunks, method={method}")
        assert_states_identical(state, want_state, f"seed layout in two chunks, method={method}")
        # A state from the seed layout continues in the batch layout ([1, T, F]), and back.
        _, state = model(x[:4], method=method, layout="seed")
        tail, state = model(x[4:].transpose(0, 1), state, method=method, layout="batch")
        assert_identical(tail[0], want[4:], f"seed layout, then batch layout, method={method}")
        assert_states_identical(state, want_state, f"seed layout, then batch layout, method={method}")
        stepped = []
        state = None
        for t in range(9):
            p, state = model.step(state, x[t])  # x[t] is [1, F]: one bar of the one sequence
            stepped.append(p[0])
        assert_close(torch.stack(stepped), want, TOL_F64, f"seed layout stepped, method={method}")


def test_step_draws_dropout_in_training_mode_and_takes_explicit_masks():
    model = make_model(2, dropout=0.5)
    x = random_inputs(2, 4, NUM_INPUTS)
    masks = model.sample_dropout_masks(4, 2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, _ = model(x, method="cell", dropout_masks=masks)
        eval_p, _ = model.step(None, x[:, 0])
        assert_identical(model.step(None, x[:, 0])[0], eval_p, "no dropout in eval mode")
        model.train()
        torch.manual_seed(0)
        first, _ = model.step(None, x[:, 0])
        second, _ = model.step(None, x[:, 0])
        assert not torch.allclose(first, eval_p), "step in training mode: no dropout drawn"
        assert not torch.allclose(first, second), "step in training mode: the same dropout drawn twice"
        state, stepped = None, []
        for t in range(4):
            p, state = model.step(state, x[:, t], dropout_masks=masks[:, t])
            stepped.append(p)
    assert_identical(torch.stack(stepped, 1), want, "step with masks[:, t] vs forward with masks")


# ---------------------------------------------------------------------------------------------------
# The seed's checkpoints
# ---------------------------------------------------------------------------------------------------


def test_state_dict_of_the_seeds_class_loads_unchanged_and_gives_identical_outputs():
    torch.manual_seed(5)
    seed_model = SeedTraveller(NUM_INPUTS, HIDDEN, 2, 0.0).double().eval()
    state = seed_model.state_dict()
    model = Traveller(NUM_INPUTS, HIDDEN, 2, 0.0).double().eval()
    assert list(model.state_dict()) == list(state)
    assert "lstm_layers.weight_ih_l0" in state and "output_layer.bias" in state
    model.load_state_dict(state)  # strict: same keys, same shapes
    x = random_inputs(9, 1, NUM_INPUTS)
    with torch.no_grad():
        want = seed_model(x)
        got, _ = model(x, method="loop", layout="seed")
        assert torch.equal(got, want), "the seed's own loop must be reproduced exactly"
        for method in ALL_METHODS[1:]:
            got, _ = model(x, method=method, layout="seed")
            assert_close(got, want, TOL_F64, f"seed checkpoint, method={method}")
    SeedTraveller(NUM_INPUTS, HIDDEN, 2, 0.0).double().load_state_dict(model.state_dict())  # and back


def test_seed_class_in_float32_matches_the_loop_exactly():
    torch.manual_seed(6)
    seed_model = SeedTraveller(NUM_INPUTS, HIDDEN, 3, 0.0).eval()
    model = Traveller(NUM_INPUTS, HIDDEN, 3, 0.0).eval()
    model.load_state_dict(seed_model.state_dict())
    x = random_inputs(5, 1, NUM_INPUTS, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(model(x, layout="seed")[0], seed_model(x))


# ---------------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------------


def test_gradients_agree_across_methods():
    model = make_model(2)
    x0 = random_inputs(2, 5, NUM_INPUTS)
    weights = torch.linspace(-1.0, 1.0, 2 * 5 * 2, dtype=torch.float64).reshape(2, 5, 2)  # every output counts
    grads = {}
    for method in ALL_METHODS:
        model.zero_grad()
        x = x0.clone().requires_grad_(True)
        (model(x, method=method)[0] * weights).sum().backward()
        grads[method] = {"inputs": x.grad} | {name: p.grad.clone() for name, p in model.named_parameters()}
    for method in ALL_METHODS[1:]:
        for name, want in grads["loop"].items():
            assert_close(grads[method][name], want, GRAD_TOL_F64, f"grad of {name}, method={method}")


# ---------------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------------


def test_dropout_is_off_in_eval_mode():
    model = make_model(2, dropout=0.5)
    no_dropout = make_model(2, dropout=0.0)  # same seed, same weights
    x = random_inputs(2, 5, NUM_INPUTS)
    with torch.no_grad():
        want, _ = no_dropout(x, method="loop")
        for method in ALL_METHODS:
            assert_close(model(x, method=method)[0], want, TOL_F64, f"eval mode with dropout, method={method}")


@pytest.mark.parametrize("method", ALL_METHODS)
def test_dropout_is_on_in_training_mode(method):
    model = make_model(2, dropout=0.5)
    x = random_inputs(2, 5, NUM_INPUTS)
    with torch.no_grad():
        eval_out, _ = model(x, method=method)
        model.train()
        torch.manual_seed(0)
        first, _ = model(x, method=method)
        second, _ = model(x, method=method)
    assert not torch.allclose(first, eval_out), f"method={method}: training output equals eval output"
    assert not torch.allclose(first, second), f"method={method}: two training passes drew the same dropout"


def test_single_layer_has_no_dropout_even_in_training_mode():
    model = make_model(1, dropout=0.9).train()  # nn.LSTM: dropout only between layers
    x = random_inputs(2, 5, NUM_INPUTS)
    with torch.no_grad():
        want, _ = model.eval()(x, method="loop")
        model.train()
        for method in ALL_METHODS:
            assert_close(model(x, method=method)[0], want, TOL_F64, f"one layer in training, method={method}")


@pytest.mark.parametrize("method", EXPLICIT_MASK_METHODS)
def test_explicit_masks_of_ones_equal_eval_mode(method):
    model = make_model(2, dropout=0.5)
    x = random_inputs(2, 5, NUM_INPUTS)
    ones = torch.ones(1, 5, 2, HIDDEN, dtype=torch.float64)  # [L-1, T, B, H]
    with torch.no_grad():
        want, _ = model(x, method="loop")
        got, _ = model.train()(x, method=method, dropout_masks=ones)
    assert_close(got, want, TOL_F64, f"masks of ones in training mode, method={method}")


def test_explicit_masks_give_the_same_positions_in_every_method():
    model = make_model(2, dropout=0.4).train()
    x = random_inputs(2, 6, NUM_INPUTS)
    masks = model.sample_dropout_masks(6, 2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, _ = model(x, method="cell", dropout_masks=masks)
        assert not torch.allclose(want, model.eval()(x, method="cell")[0]), "the masks must change something"
        for method in EXPLICIT_MASK_METHODS[1:]:
            # explicit masks apply in eval mode too: explicit wins over the mode
            got, _ = model(x, method=method, dropout_masks=masks)
            assert_close(got, want, TOL_F64, f"masks, method={method}")


def test_masks_sit_between_layers_only():
    """Zero masks cut the lower layer off: the top layer then sees only zeros, so the positions no longer
    depend on the inputs. (Dropout on the input or on the output would not do this.)"""
    model = make_model(2, dropout=0.5)
    zeros = torch.zeros(1, 4, 2, HIDDEN, dtype=torch.float64)
    with torch.no_grad():
        a, _ = model(random_inputs(2, 4, NUM_INPUTS, seed=1), method="cell", dropout_masks=zeros)
        b, _ = model(random_inputs(2, 4, NUM_INPUTS, seed=2), method="cell", dropout_masks=zeros)
    assert_close(a, b, TOL_F64, "positions with the lower layer masked out")


def test_sampled_masks_have_the_dropout_statistics():
    model = make_model(3, dropout=0.25)
    masks = model.sample_dropout_masks(50, 4, generator=torch.Generator().manual_seed(0))
    assert masks.shape == (2, 50, 4, HIDDEN) and masks.dtype == torch.float64
    values = set(masks.unique().tolist())
    assert values <= {0.0, 1.0 / 0.75}, values
    dropped = (masks == 0).double().mean().item()
    assert 0.2 < dropped < 0.3, f"fraction dropped {dropped} for p = 0.25"


@pytest.mark.parametrize(
    "args, error, expected",
    [  # torch's own errors named no argument ("Trying to create tensor with negative dimension -1"), and
        # a bool was taken as a size
        ((-1, 2), ValueError, r"^seq_len: expected an int >= 0, got -1$"),
        ((2.5, 2), TypeError, r"^seq_len: expected an int, got float$"),
        ((True, 2), TypeError, r"^seq_len: expected an int, got bool$"),
        ((3, -2), ValueError, r"^batch_size: expected an int >= 0, got -2$"),
    ],
)
def test_bad_sample_dropout_masks_arguments_are_named(args, error, expected):
    with pytest.raises(error, match=expected):
        make_model(2, dropout=0.5).sample_dropout_masks(*args)


# ---------------------------------------------------------------------------------------------------
# TorchScript and scan specifics
# ---------------------------------------------------------------------------------------------------


def test_script_method_is_compiled_once_and_quiet():
    model = make_model(1)
    x = random_inputs(1, 3, NUM_INPUTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither our code nor torch may warn here
        model(x, method="script")
        if scan_available():
            model(x, method="scan")
    scripted = traveller_module._scripted_loop()
    assert scripted is traveller_module._scripted_loop()
    assert isinstance(scripted, torch.jit.ScriptFunction)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_inference_mode_after_training_calls(method):
    # "script" raised "Inference tensors cannot be saved for backward" here: TorchScript had planned the
    # loop with autograd during the calls that backpropagated, and kept that plan under inference_mode.
    model = make_model(2)
    x = random_inputs(2, 4, NUM_INPUTS)
    for _ in range(3):  # TorchScript's profiling executor settles its plan after a couple of runs
        model(x, method=method)[0].sum().backward()
    want, want_state = model(x, method=method)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            got, state = model(x, method=method)
        assert not got.requires_grad
        # Not bit for bit: "scan" runs through Dynamo, which traces a graph of its own without autograd.
        assert_close(got, want.detach(), TOL_F64, f"{method} under {mode.__name__}")
        for name in TravellerState._fields:
            what = f"{method} under {mode.__name__}, state.{name}"
            assert_close(getattr(state, name), getattr(want_state, name).detach(), TOL_F64, what)


def test_scan_unavailable_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(traveller_module, "_torch_scan", None)
    assert not scan_available()
    with pytest.raises(RuntimeError, match=r"torch\._higher_order_ops\.scan"):
        make_model(1)(random_inputs(1, 3, NUM_INPUTS), method="scan")
    with pytest.raises(RuntimeError, match=r"torch\._higher_order_ops\.scan"):
        compiled_loop(make_model(1), method="scan")


@pytest.mark.skipif(not scan_available(), reason="torch._higher_order_ops.scan is missing")
def test_whole_model_traces_as_one_graph_with_scan():
    model = make_model(2)
    x = random_inputs(2, 5, NUM_INPUTS)
    # Dynamo refuses nn.LSTM modules unless allow_rnn is set; backend "eager" checks the trace, fast.
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        with torch.no_grad():
            got, got_state = compiled(x, method="scan")
    with torch.no_grad():
        want, want_state = model(x, method="loop")
    assert isinstance(got_state, TravellerState)
    assert_close(got, want, TOL_F64, "torch.compile(model, fullgraph=True), scan")
    assert_close(got_state.c, want_state.c, TOL_F64, "torch.compile(model, fullgraph=True), scan, state.c")


@pytest.mark.slow
@pytest.mark.skipif(not scan_available(), reason="torch._higher_order_ops.scan is missing")
def test_compiled_scan_matches_eager_with_gradients():
    model = make_model(2)
    run = compiled_loop(model)  # inductor, fullgraph=True
    x = random_inputs(2, 12, NUM_INPUTS)
    got, got_state = run(x)
    got.sum().backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want, want_state = model(x, method="loop")
    want.sum().backward()
    assert_close(got, want, TOL_F64, "compiled scan")
    for name in TravellerState._fields:
        assert_close(getattr(got_state, name), getattr(want_state, name), TOL_F64, f"compiled scan, state.{name}")
    for (name, p), g in zip(model.named_parameters(), got_grads):
        assert_close(g, p.grad, GRAD_TOL_F64, f"compiled scan grad of {name}")
    with torch.no_grad():
        head, state = run(x[:, :7].contiguous())  # a new T, then the rest from the returned state
        assert_close(head, model(x[:, :7], method="cell")[0], TOL_F64, "compiled scan, new T")
        tail, state = run(x[:, 7:].contiguous(), state)
        assert_close(torch.cat([head, tail], 1), want.detach(), TOL_F64, "compiled scan in two chunks")
        assert_close(state.h, want_state.h.detach(), TOL_F64, "compiled scan in two chunks, state.h")


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, layout, expected",
    [
        ((5, NUM_INPUTS), "batch", r"inputs: expected shape \[B, T, 3\].*got \[5, 3\] \(rank 2\)"),
        ((5, NUM_INPUTS), "seed", r"inputs: expected shape \[T, 1, 3\].*got \[5, 3\] \(rank 2\)"),
        ((2, 5, 4, NUM_INPUTS), "batch", r"inputs: expected shape .*got \[2, 5, 4, 3\]"),
        ((2, 5, NUM_INPUTS + 1), "batch", r"inputs: expected shape \[B, T, 3\] \(layout 'batch'\), got \[2, 5, 4\]"),
        ((5, 1, NUM_INPUTS + 1), "seed", r"inputs: expected shape \[T, 1, 3\] \(layout 'seed'\), got \[5, 1, 4\]"),
        ((5, 2, NUM_INPUTS), "seed", r"inputs: expected shape \[T, 1, 3\] \(layout 'seed'\), got \[5, 2, 3\]"),
        ((2, 0, NUM_INPUTS), "batch", r"inputs: expected shape \[B, T, 3\] .*T >= 1, got \[2, 0, 3\]"),
        ((0, 1, NUM_INPUTS), "seed", r"inputs: expected shape \[T, 1, 3\] .*T >= 1, got \[0, 1, 3\]"),
    ],
)
def test_bad_input_shapes_raise_value_error(shape, layout, expected):
    with pytest.raises(ValueError, match=expected):
        make_model(1)(torch.zeros(shape, dtype=torch.float64), layout=layout)


def test_bad_dtypes_raise_type_error():
    model = make_model(1)
    with pytest.raises(TypeError, match=r"inputs: expected a floating-point tensor, got dtype torch.int64"):
        model(torch.zeros(2, 3, NUM_INPUTS, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"inputs: expected dtype torch.float64.*got torch.float32"):
        model(torch.zeros(2, 3, NUM_INPUTS, dtype=torch.float32))


def test_bad_method_or_layout_raise_value_error():
    model = make_model(1)
    x = random_inputs(2, 3, NUM_INPUTS)
    with pytest.raises(ValueError, match=r"method: expected one of .*'scan'.*got 'jit'"):
        model(x, method="jit")
    with pytest.raises(ValueError, match=r"layout: expected one of .*got 'time'"):
        model(x, layout="time")
    with pytest.raises(ValueError, match=r"layout: expected one of \('batch', 'seed'\).*got 'auto'"):
        model(x, layout="auto")  # no guessing between [B, T, F] and the seed's [T, 1, F]
    with pytest.raises(ValueError, match=r"method: expected 'scan' or 'cell' for compiled_loop, got 'loop'"):
        compiled_loop(model, method="loop")
    with pytest.raises(ValueError, match=r"layout: expected one of \('batch', 'seed'\).*got 'auto'"):
        compiled_loop(model, method="cell")(x, layout="auto")  # checked eagerly, before anything compiles


def bad_states(model, batch):
    good = model.initial_state(batch)
    return [
        ((good.h, good.c), TypeError, r"state: expected a TravellerState\(h, c, positions\) or None, got tuple"),
        (good._replace(h=good.h[:, :1]), ValueError,
         r"state\.h: expected shape \[L, B, H\] = \[2, 2, 8\] \(B = 2, the batch size of the inputs\), "
         r"got \[2, 1, 8\]"),
        (good._replace(c=good.c[:1]), ValueError,
         r"state\.c: expected shape \[L, B, H\] = \[2, 2, 8\].*got \[1, 2, 8\]"),
        (good._replace(positions=good.positions[:, :1]), ValueError,
         r"state\.positions: expected shape \[B, A\] = \[2, 2\].*got \[2, 1\]"),
        (good._replace(h=good.h.float()), TypeError,
         r"state\.h: expected dtype torch\.float64 \(the model's parameters\), got torch\.float32"),
        (good._replace(positions=[[0.0, 0.0]] * batch), TypeError,
         r"state\.positions: expected a torch\.Tensor, got list"),
        # another package's class of the same name (jsr.TravellerState, of JAX arrays): the message said "expected a
        # TravellerState ..., got TravellerState"
        (OtherTravellerState(*good), TypeError,
         r"^state: expected a TravellerState\(h, c, positions\) or None, got [\w.]+\.TravellerState; build a "
         r"torch_ref\.traveller\.TravellerState of torch tensors from its fields$"),
    ]


OtherTravellerState = collections.namedtuple("TravellerState", "h c positions")  # another package's, as jsr's


def test_bad_state_raises_a_clear_error():
    model = make_model(2)
    x = random_inputs(2, 3, NUM_INPUTS)
    for state, error, message in bad_states(model, 2):
        for method in ALL_METHODS:
            with pytest.raises(error, match=message):
                model(x, state, method=method)
        with pytest.raises(error, match=message):
            model.step(state, x[:, 0])
    with pytest.raises(ValueError, match=r"state\.h: expected shape \[L, B, H\] = \[2, 1, 8\] \(B = 1"):
        model(x[:1].transpose(0, 1), model.initial_state(2), layout="seed")  # the seed layout has B = 1


def test_bad_step_arguments_raise():
    model = make_model(2, dropout=0.5)
    with pytest.raises(ValueError, match=r"x_t: expected shape \[B, 3\], got \[2, 1, 3\]"):
        model.step(None, random_inputs(2, 1, NUM_INPUTS))
    with pytest.raises(TypeError, match=r"x_t: expected dtype torch\.float64.*got torch\.float32"):
        model.step(None, random_inputs(2, NUM_INPUTS, dtype=torch.float32))
    expected = r"dropout_masks: expected shape \[num_layers-1, B, H\] = \[1, 2, 8\], got \[1, 1, 2, 8\]"
    with pytest.raises(ValueError, match=expected):
        model.step(None, random_inputs(2, NUM_INPUTS), dropout_masks=torch.ones(1, 1, 2, HIDDEN, dtype=torch.float64))


def test_bad_dropout_masks_raise():
    model = make_model(2, dropout=0.5)
    x = random_inputs(2, 3, NUM_INPUTS)
    good = torch.ones(1, 3, 2, HIDDEN, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"dropout_masks: not supported by method='loop'"):
        model(x, method="loop", dropout_masks=good)
    expected = r"dropout_masks: expected shape \[num_layers-1, T, B, H\] = \[1, 3, 2, 8\], got \[1, 3, 8\]"
    with pytest.raises(ValueError, match=expected):
        model(x, method="cell", dropout_masks=good[:, :, 0])
    with pytest.raises(TypeError, match=r"dropout_masks: expected dtype torch.float64"):
        model(x, method="cell", dropout_masks=good.float())


# ---------------------------------------------------------------------------------------------------
# Any number of assets A (`num_assets`; 2, the seed's, by default)
# ---------------------------------------------------------------------------------------------------

ASSETS = [1, 2, 5]


def test_default_is_the_seeds_two_assets():
    model = Traveller(NUM_INPUTS, HIDDEN, 2, 0.0)  # the seed's four arguments
    assert model.num_assets == 2 and model.num_inputs == NUM_INPUTS
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["lstm_layers.weight_ih_l0"] == (4 * HIDDEN, 2 + NUM_INPUTS)
    assert shapes["output_layer.weight"] == (2, HIDDEN) and shapes["output_layer.bias"] == (2,)


@pytest.mark.parametrize("num_assets", ASSETS)
def test_num_assets_sets_the_output_state_and_weight_shapes(num_assets):
    model = make_model(2, num_assets=num_assets)
    assert model.num_assets == num_assets and model.num_inputs == NUM_INPUTS
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["lstm_layers.weight_ih_l0"] == (4 * HIDDEN, num_assets + NUM_INPUTS)  # columns 0:A see p_{t-1}
    assert shapes["output_layer.weight"] == (num_assets, HIDDEN) and shapes["output_layer.bias"] == (num_assets,)
    assert [tuple(t.shape) for t in model.initial_state(3)] == [(2, 3, HIDDEN), (2, 3, HIDDEN), (3, num_assets)]
    x = random_inputs(3, 6, NUM_INPUTS)  # every method agrees for A assets: test_all_methods_agree_in_float64_batched
    with torch.no_grad():
        seed, seed_state = model(x[0].unsqueeze(1), method="cell", layout="seed")  # [T, 1, F] -> [T, A]
        assert seed.shape == (6, num_assets) and seed_state.positions.shape == (1, num_assets)
        assert model.step(None, x[:, 0])[0].shape == (3, num_assets)


@pytest.mark.parametrize("num_assets", ASSETS)
def test_any_number_of_assets_one_call_chunks_and_single_steps_are_bit_identical(num_assets):
    """As `test_one_call_chunks_and_single_steps_are_bit_identical`, for A assets: the state carries [B, A]
    positions across calls; `step` runs the cell math, so it is compared with every method but "loop"."""
    model = make_model(2, num_assets=num_assets)
    x = random_inputs(2, sum(CHUNKS), NUM_INPUTS)
    with torch.no_grad():
        stepped, stepped_state = run_by_step(model, x)
        for method in ALL_METHODS:
            want, want_state = model(x, method=method)
            what = f"A={num_assets}, method={method}"
            got, state = run_in_chunks(model, x, CHUNKS, method=method)
            assert_identical(got, want, f"{what}: positions in chunks {CHUNKS}")
            assert_states_identical(state, want_state, f"{what}: chunks {CHUNKS}")
            if method != "loop":  # nn.LSTM's kernel rounds differently from the cell math
                assert_identical(stepped, want, f"{what}: positions of step one at a time")
                assert_states_identical(stepped_state, want_state, f"{what}: step one at a time")


@pytest.mark.parametrize("num_assets", [0, True, 2.5])  # none, a bool (not a count), not an int
def test_bad_num_assets_is_named(num_assets):
    with pytest.raises(ValueError, match=rf"^num_assets: expected an int >= 1, got {num_assets!r}$"):
        Traveller(NUM_INPUTS, HIDDEN, 1, 0.0, num_assets)


@pytest.mark.parametrize(
    "name, value",
    [
        ("num_inputs", 0),  # nn.LSTM took it: input_size = num_assets, and num_inputs read back 0
        ("num_inputs", -1),  # ... and -1 built a model whose num_inputs is -1
        ("num_inputs", 2.5),  # nn.LSTM's error spoke of its own input_size
        ("hidden_size", 0),
        ("hidden_size", "8"),
        ("num_layers", 0),
        ("num_layers", True),  # a bool is not a count; nn.LSTM took it as 1
        ("dropout", 1.5),
        ("dropout", float("nan")),
        ("dropout", "0.1"),
    ],
)
def test_bad_constructor_arguments_are_named(name, value):
    args = {"num_inputs": NUM_INPUTS, "hidden_size": HIDDEN, "num_layers": 2, "dropout": 0.0} | {name: value}
    expected = rf"^{name}: expected an? (int|finite number) .*, got {re.escape(repr(value))}$"
    with pytest.raises(ValueError, match=expected):
        Traveller(**args)


def test_state_of_another_number_of_assets_is_refused():
    five = make_model(2, num_assets=5)
    x = random_inputs(2, 3, NUM_INPUTS)
    two_assets_state = make_model(2).initial_state(2)
    expected = r"state\.positions: expected shape \[B, A\] = \[2, 5\] .*got \[2, 2\]"
    for method in ALL_METHODS:
        with pytest.raises(ValueError, match=expected):
            five(x, two_assets_state, method=method)
    with pytest.raises(ValueError, match=expected):
        five.step(two_assets_state, x[:, 0])


def test_checkpoint_of_another_number_of_assets_is_refused_naming_the_keys():
    with pytest.raises(RuntimeError, match=r"size mismatch for output_layer\.weight.*\[2, 8\].*\[5, 8\]"):
        make_model(2, num_assets=5).load_state_dict(make_model(2).state_dict())


def test_numpy_integers_are_sizes():
    # jsr.Traveller takes NumPy's integers as sizes; nn.LSTM refuses them, so they are passed on as ints.
    model = Traveller(np.int64(3), np.int64(8), np.int64(2), np.float32(0.25), num_assets=np.int32(2))
    assert model.lstm_layers.hidden_size == 8 and model.num_assets == 2
    assert model.initial_state(np.int64(4)).h.shape == (2, 4, 8)
    assert model.sample_dropout_masks(np.int64(5), np.int64(4)).shape == (1, 5, 4, 8)
