"""docs/scan_vs_loop.md's Python blocks run as written, and its torch loop and `lax.scan` agree.

The page shows the seed's PyTorch loop (`SeedTraveller`, a block that imports torch) next to a plain
`jax.lax.scan` version (`traveller(params, x)`, a block that does not), then a block that runs both on
the same weights and a timing block. A reader copies them in that order, so they are run here in that
order, in one namespace; the agreement is also asserted at a short T on fresh weights, and against
`jsr.Traveller` on the same weights (the page says it is this function plus state, checks and options).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "scan_vs_loop.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
TORCH_BLOCKS = [b for b in BLOCKS if re.search(r"^import torch", b, flags=re.M)]
JAX_BLOCKS = [b for b in BLOCKS if "jax.lax.scan" in b and b not in TORCH_BLOCKS]

# Positions are tanh outputs in [-1, 1]; float32 rounding of two different op orders over a short
# feedback loop stays near 1e-7 (the benchmark's agreement table: ~5e-8 at T=1000), so 1e-5 is loose
# enough for any BLAS and tight enough to catch a wrong gate order or a missing bias.
FLOAT32_POSITION_TOL = 1e-5
SHORT_T = 50


# x64 off, as in a reader's session (conftest.py), so the page's `jnp.zeros` are float32 and the whole computation
# runs in float32, as the page says.
pytestmark = pytest.mark.usefixtures("readers_jax_defaults")


def run_block(code: str, namespace: dict, name: str) -> dict:
    exec(compile(code, f"{PAGE.name}: {name}", "exec"), namespace)
    return namespace


def test_the_page_has_its_blocks():
    assert len(TORCH_BLOCKS) == 1, "expected one block defining the torch loop (`import torch`)"
    assert len(JAX_BLOCKS) == 1, "expected one block defining the lax.scan version (`jax.lax.scan`)"
    assert BLOCKS.index(TORCH_BLOCKS[0]) < BLOCKS.index(JAX_BLOCKS[0]), "torch first, then JAX"


def jax_namespace() -> dict:
    return run_block(JAX_BLOCKS[0], {"__name__": "docs_scan_vs_loop_jax"}, "the lax.scan block")


def test_the_jax_block_runs_without_torch():
    """The JAX block stands alone: fed weights in the torch state_dict layout, it gives [T, 2] positions."""
    ns = jax_namespace()
    rng = np.random.default_rng(0)
    features, hidden, layers = 8, 16, 2
    params = {"output_layer.weight": rng.normal(0, 0.3, (2, hidden)), "output_layer.bias": rng.normal(0, 0.3, 2)}
    for k in range(layers):
        inputs = 2 + features if k == 0 else hidden
        params |= {f"lstm_layers.weight_ih_l{k}": rng.normal(0, 0.3, (4 * hidden, inputs)),
                   f"lstm_layers.weight_hh_l{k}": rng.normal(0, 0.3, (4 * hidden, hidden)),
                   f"lstm_layers.bias_ih_l{k}": rng.normal(0, 0.3, 4 * hidden),
                   f"lstm_layers.bias_hh_l{k}": rng.normal(0, 0.3, 4 * hidden)}
    params = {name: np.asarray(w, np.float32) for name, w in params.items()}
    positions = np.asarray(ns["traveller"](params, rng.standard_normal((SHORT_T, 1, features), dtype=np.float32)))
    assert positions.shape == (SHORT_T, 2) and positions.dtype == np.float32
    assert np.isfinite(positions).all() and np.abs(positions).max() <= 1.0


def test_torch_loop_and_lax_scan_agree_on_the_same_weights():
    torch = pytest.importorskip("torch")
    import jax.numpy as jnp
    from flax import nnx

    import jax_scan_rnn as jsr

    ns = run_block(TORCH_BLOCKS[0], {"__name__": "docs_scan_vs_loop_torch"}, "the torch block")
    ns = run_block(JAX_BLOCKS[0], ns, "the lax.scan block")
    torch.manual_seed(1)
    model = ns["SeedTraveller"]().eval()
    x = torch.randn(SHORT_T, 1, 8)
    with torch.no_grad():
        expected = model(x).numpy()
    params = {name: jnp.asarray(w.numpy()) for name, w in model.state_dict().items()}
    positions = np.asarray(ns["traveller"](params, jnp.asarray(x.numpy())))
    assert positions.shape == expected.shape == (SHORT_T, 2) and positions.dtype == np.float32
    assert np.abs(positions - expected).max() < FLOAT32_POSITION_TOL

    # jsr.Traveller on the same state_dict (the seed's names load unchanged) gives the same positions.
    trav = jsr.Traveller(8, 64, 2, rngs=nnx.Rngs(0))
    jsr.load_torch_state_dict(trav, model.state_dict())
    trav.eval()
    library, _ = jsr.jit(trav)(x.numpy(), layout="seed")
    assert np.abs(np.asarray(library) - positions).max() < FLOAT32_POSITION_TOL


def test_every_block_runs_as_written_in_order(capsys):
    """What a reader does: paste the blocks one after another (T=1000 as written: a second or two)."""
    pytest.importorskip("torch")
    ns: dict = {"__name__": "docs_scan_vs_loop"}
    for index, code in enumerate(BLOCKS):
        run_block(code, ns, f"python block {index + 1}")
    assert np.abs(np.asarray(ns["positions"]) - ns["expected"]).max() < FLOAT32_POSITION_TOL
    assert "µs per step" in capsys.readouterr().out
