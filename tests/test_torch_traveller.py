"""torch_ref.Traveller: its four loop methods agree, it loads the seed's checkpoints, dropout, errors."""
from __future__ import annotations

import warnings

import pytest
import torch

import torch_ref.traveller as traveller_module
from torch_ref import Traveller
from torch_ref.traveller import compiled_loop, scan_available

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


def make_model(num_layers=2, dropout=0.0, dtype=torch.float64, seed=0, num_inputs=NUM_INPUTS, hidden=HIDDEN):
    """A Traveller with random weights and clearly non-zero biases (a zero bias hides a mapping bug)."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        # nn.LSTM warns that dropout does nothing with one layer; that case is tested on purpose.
        warnings.filterwarnings("ignore", message=".*dropout option adds dropout after all but last")
        model = Traveller(num_inputs, hidden, num_layers, dropout).to(dtype)
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


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_all_methods_agree_in_float64_batched(num_layers):
    model = make_model(num_layers)
    x = random_inputs(3, 6, NUM_INPUTS)
    with torch.no_grad():
        want = model(x, method="loop")
        assert want.shape == (3, 6, 2)
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method), want, TOL_F64, f"method={method}, layers={num_layers}")


def test_all_methods_agree_in_float32():
    model = make_model(2, dtype=torch.float32)
    x = random_inputs(2, 8, NUM_INPUTS, dtype=torch.float32)
    with torch.no_grad():
        want = model(x, method="loop")
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method), want, TOL_F32, f"float32 method={method}")


def test_all_methods_agree_in_seed_layout():
    model = make_model(3)
    x = random_inputs(7, 1, NUM_INPUTS)
    with torch.no_grad():
        want = model(x, method="loop")
        assert want.shape == (7, 2)
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method), want, TOL_F64, f"seed layout, method={method}")


@pytest.mark.parametrize("method", ALL_METHODS)
def test_seed_layout_equals_batch_layout_with_one_sequence(method):
    model = make_model(2)
    x = random_inputs(6, 1, NUM_INPUTS)  # the seed's [T, 1, F]
    with torch.no_grad():
        seed = model(x, method=method)  # "auto" reads [T, 1, F] as the seed layout
        explicit = model(x, method=method, layout="seed")
        batched = model(x.transpose(0, 1), method=method, layout="batch")  # [1, T, F]
    assert torch.equal(seed, explicit)
    assert batched.shape == (1, 6, 2)
    assert_close(seed, batched[0], TOL_F64, f"seed vs batch B=1, method={method}")


def test_auto_layout_reads_a_batch_of_one_step_sequences_as_the_seed_layout():
    model = make_model(1)
    x = random_inputs(4, 1, NUM_INPUTS)
    with torch.no_grad():
        as_seed = model(x, method="cell")  # one sequence of T = 4 steps
        as_batch = model(x, method="cell", layout="batch")  # four sequences of one step
    assert as_seed.shape == (4, 2) and as_batch.shape == (4, 1, 2)
    assert_close(as_seed[0], as_batch[0, 0], TOL_F64, "first step is the same either way")
    assert not torch.allclose(as_seed[1:], as_batch[1:, 0]), "later steps differ: feedback vs. fresh state"


def test_sequences_in_a_batch_are_independent():
    model = make_model(2)
    x = random_inputs(3, 5, NUM_INPUTS)
    with torch.no_grad():
        whole = model(x, method="cell")
        alone = torch.cat([model(x[b : b + 1], method="cell", layout="batch") for b in range(3)])
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
        want = model(x, method="loop")
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method), want, TOL_F64, f"after an update, method={method}")


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
        assert torch.equal(model(x, method="loop"), want), "the seed's own loop must be reproduced exactly"
        for method in ALL_METHODS[1:]:
            assert_close(model(x, method=method), want, TOL_F64, f"seed checkpoint, method={method}")
    SeedTraveller(NUM_INPUTS, HIDDEN, 2, 0.0).double().load_state_dict(model.state_dict())  # and back


def test_seed_class_in_float32_matches_the_loop_exactly():
    torch.manual_seed(6)
    seed_model = SeedTraveller(NUM_INPUTS, HIDDEN, 3, 0.0).eval()
    model = Traveller(NUM_INPUTS, HIDDEN, 3, 0.0).eval()
    model.load_state_dict(seed_model.state_dict())
    x = random_inputs(5, 1, NUM_INPUTS, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(model(x), seed_model(x))


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
        (model(x, method=method) * weights).sum().backward()
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
        want = no_dropout(x, method="loop")
        for method in ALL_METHODS:
            assert_close(model(x, method=method), want, TOL_F64, f"eval mode with dropout, method={method}")


@pytest.mark.parametrize("method", ALL_METHODS)
def test_dropout_is_on_in_training_mode(method):
    model = make_model(2, dropout=0.5)
    x = random_inputs(2, 5, NUM_INPUTS)
    with torch.no_grad():
        eval_out = model(x, method=method)
        model.train()
        torch.manual_seed(0)
        first = model(x, method=method)
        second = model(x, method=method)
    assert not torch.allclose(first, eval_out), f"method={method}: training output equals eval output"
    assert not torch.allclose(first, second), f"method={method}: two training passes drew the same dropout"


def test_single_layer_has_no_dropout_even_in_training_mode():
    model = make_model(1, dropout=0.9).train()  # nn.LSTM: dropout only between layers
    x = random_inputs(2, 5, NUM_INPUTS)
    with torch.no_grad():
        want = model.eval()(x, method="loop")
        model.train()
        for method in ALL_METHODS:
            assert_close(model(x, method=method), want, TOL_F64, f"one layer in training, method={method}")


@pytest.mark.parametrize("method", EXPLICIT_MASK_METHODS)
def test_explicit_masks_of_ones_equal_eval_mode(method):
    model = make_model(2, dropout=0.5)
    x = random_inputs(2, 5, NUM_INPUTS)
    ones = torch.ones(1, 5, 2, HIDDEN, dtype=torch.float64)  # [L-1, T, B, H]
    with torch.no_grad():
        want = model(x, method="loop")
        got = model.train()(x, method=method, dropout_masks=ones)
    assert_close(got, want, TOL_F64, f"masks of ones in training mode, method={method}")


def test_explicit_masks_give_the_same_positions_in_every_method():
    model = make_model(2, dropout=0.4).train()
    x = random_inputs(2, 6, NUM_INPUTS)
    masks = model.sample_dropout_masks(6, 2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(x, method="cell", dropout_masks=masks)
        assert not torch.allclose(want, model.eval()(x, method="cell")), "the masks must change something"
        for method in EXPLICIT_MASK_METHODS[1:]:
            # explicit masks apply in eval mode too: explicit wins over the mode
            assert_close(model(x, method=method, dropout_masks=masks), want, TOL_F64, f"masks, method={method}")


def test_masks_sit_between_layers_only():
    """Zero masks cut the lower layer off: the top layer then sees only zeros, so the positions no longer
    depend on the inputs. (Dropout on the input or on the output would not do this.)"""
    model = make_model(2, dropout=0.5)
    zeros = torch.zeros(1, 4, 2, HIDDEN, dtype=torch.float64)
    with torch.no_grad():
        a = model(random_inputs(2, 4, NUM_INPUTS, seed=1), method="cell", dropout_masks=zeros)
        b = model(random_inputs(2, 4, NUM_INPUTS, seed=2), method="cell", dropout_masks=zeros)
    assert_close(a, b, TOL_F64, "positions with the lower layer masked out")


def test_sampled_masks_have_the_dropout_statistics():
    model = make_model(3, dropout=0.25)
    masks = model.sample_dropout_masks(50, 4, generator=torch.Generator().manual_seed(0))
    assert masks.shape == (2, 50, 4, HIDDEN) and masks.dtype == torch.float64
    values = set(masks.unique().tolist())
    assert values <= {0.0, 1.0 / 0.75}, values
    dropped = (masks == 0).double().mean().item()
    assert 0.2 < dropped < 0.3, f"fraction dropped {dropped} for p = 0.25"


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
            got = compiled(x, method="scan")
    with torch.no_grad():
        assert_close(got, model(x, method="loop"), TOL_F64, "torch.compile(model, fullgraph=True), scan")


@pytest.mark.slow
@pytest.mark.skipif(not scan_available(), reason="torch._higher_order_ops.scan is missing")
def test_compiled_scan_matches_eager_with_gradients():
    model = make_model(2)
    run = compiled_loop(model)  # inductor, fullgraph=True
    x = random_inputs(2, 12, NUM_INPUTS)
    got = run(x)
    got.sum().backward()
    got_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x, method="loop")
    want.sum().backward()
    assert_close(got, want, TOL_F64, "compiled scan")
    for (name, p), g in zip(model.named_parameters(), got_grads):
        assert_close(g, p.grad, GRAD_TOL_F64, f"compiled scan grad of {name}")
    assert_close(run(x[:, :7].contiguous()), model(x[:, :7], method="cell"), TOL_F64, "compiled scan, new T")


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, layout, expected",
    [
        ((5, NUM_INPUTS), "auto", r"inputs: expected shape \[B, T, 3\].*got \[5, 3\]"),
        ((2, 5, 4, NUM_INPUTS), "auto", r"inputs: expected shape .*got \[2, 5, 4, 3\]"),
        ((2, 5, NUM_INPUTS + 1), "auto", r"inputs: expected shape \[B, T, 3\] \(layout 'batch'\), got \[2, 5, 4\]"),
        ((5, 1, NUM_INPUTS + 1), "auto", r"inputs: expected shape \[T, 1, 3\] \(layout 'seed'\), got \[5, 1, 4\]"),
        ((5, 2, NUM_INPUTS), "seed", r"inputs: expected shape \[T, 1, 3\] \(layout 'seed'\), got \[5, 2, 3\]"),
        ((2, 0, NUM_INPUTS), "batch", r"inputs: expected shape \[B, T, 3\] .*T >= 1, got \[2, 0, 3\]"),
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
    with pytest.raises(ValueError, match=r"method: expected 'scan' or 'cell' for compiled_loop, got 'loop'"):
        compiled_loop(model, method="loop")


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
