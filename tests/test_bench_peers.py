"""The benchmark's peer rows (`jax_scan_rnn/bench/peer_methods.py`): Flax NNX, Equinox and torchax written as
their users would, on the jsr rows' weights.

Each peer builds and runs at a tiny size and computes what its jsr row computes (forward, same weights);
its train step runs; a peer whose package is missing is "n/a" with the install hint, in the results and
the Markdown, and the run goes on. No timing is asserted.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from jax_scan_rnn import bench
from jax_scan_rnn.bench import peer_methods
from jax_scan_rnn.bench.context import Context, Skip
from jax_scan_rnn.bench.report import peer_groups

# Tiny sizes: H=16 keeps the compiles short; two layers keep the stacking (and the per-layer weight copies) tested.
CFG = dict(hidden_size=16, num_layers=2, num_inputs=8, torch_threads=1)
BATCH, STEPS = 2, 5
# float32, the same math on the same weights: the peers add torch's two biases into one before the gates and
# split or fuse the gate matmuls differently, so positions (in [-1, 1]) differ by float rounding only, ~1e-7
# after 5 steps. A wrong copy (a gate order, a missing bias, b_hn) differs by ~1e-2 or more.
AGREE_TOL = 1e-5
PEERS = [key for key, m in bench.METHODS.items() if m.role == "peer"]
INSTALLED = {pkg: importlib.util.find_spec(pkg) is not None for pkg in ("equinox", "torchax")}


@pytest.fixture(scope="module")
def ctx():
    return Context(bench.BenchConfig.quick(**CFG))


@pytest.fixture(scope="module")
def jsr_output(ctx):
    """A jsr row's forward positions at the tiny size, by key (computed once: four peers share jax-scan-auto)."""
    outputs: dict[str, np.ndarray] = {}

    def get(key: str) -> np.ndarray:
        if key not in outputs:
            case = bench.METHODS[key].build(ctx, BATCH, STEPS, "forward")
            outputs[key] = case.output(case.call())
        return outputs[key]

    return get


def _needs(key: str) -> None:
    package = bench.METHODS[key].requires
    if package and not INSTALLED[package]:
        pytest.skip(f"{package} not installed (pip install 'jax-scan-rnn[bench]', which [dev] includes)")


def test_every_peer_row_is_declared_as_a_jax_peer_against_jsr_rows():
    assert set(PEERS) >= {"peer-flax-lstm-seq", "peer-flax-optlstm-seq", "peer-flax-gru-seq", "peer-flax-fb",
                          "peer-flax-fb-opt", "peer-eqx-lstm", "peer-eqx-gru-seq", "peer-torchax-loop"}
    for key in PEERS:
        method = bench.METHODS[key]
        assert method.framework == "jax" and method.kind == "compiled", key
        assert method.versus and all(bench.METHODS[v].framework == "jax" and bench.METHODS[v].role != "peer"
                                     for v in method.versus), key
    torchax = bench.METHODS["peer-torchax-loop"]
    assert torchax.max_t == 100 and "unrolls" in torchax.max_t_note


@pytest.mark.parametrize("key", PEERS)
def test_peer_forward_agrees_with_its_jsr_row(ctx, jsr_output, key):
    _needs(key)
    method = bench.METHODS[key]
    case = method.build(ctx, BATCH, STEPS, "forward")
    out = case.output(case.call())
    assert case.compile_s is not None and case.compile_s > 0  # compiled ahead of time, like the jsr rows
    ref = jsr_output(method.versus[0])
    assert out.shape == ref.shape == (BATCH, STEPS, 2)
    assert np.max(np.abs(out - ref)) < AGREE_TOL, key
    if key == "peer-torchax-loop":  # torchax made torch's accelerator "jax": it must not claim to be available,
        assert not ctx.torch.accelerator.is_available()  # or every later torch.compile fails (import_torchax)
        compiled = ctx.torch.compile(lambda v: ctx.torch.tanh(v) + 1, fullgraph=True, backend="eager")  # Dynamo only
        assert float(compiled(ctx.torch.zeros(1))[0]) == 1.0


def test_peer_train_step_runs(ctx):
    """One peer's train step (every peer's comes from the same code, `peer_methods._case`; all: slow below)."""
    case = bench.METHODS["peer-flax-fb"].build(ctx, BATCH, STEPS, "train")
    assert case.output is None and case.compile_s > 0
    case.call()
    case.call()  # the second step starts from the first one's updated parameters


@pytest.mark.slow
@pytest.mark.parametrize("key", [k for k in PEERS if k != "peer-flax-fb"])
def test_every_other_peer_train_step_runs(ctx, key):
    _needs(key)
    case = bench.METHODS[key].build(ctx, BATCH, STEPS, "train")
    case.call()
    case.call()


def test_the_gru_rows_refuse_a_nonzero_b_hn(ctx):
    """nnx.GRUCell has no b_hn: the copy refuses weights it cannot represent instead of dropping them."""
    w_ih, w_hh, b_ih, b_hh = peer_methods._gru_layers(ctx)[0]
    assert not np.any(b_hh[2 * CFG["hidden_size"]:])  # the GRU rows' weights have b_hn = 0
    with pytest.raises(ValueError, match="^b_hh: expected b_hn"):
        peer_methods.flax_gru_cell(w_ih, w_hh, b_ih, b_hh + 1.0)


@pytest.fixture
def no_equinox(monkeypatch):
    """As if equinox were not installed (its spec is not found; nothing imports it)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "equinox" else find_spec(name, *a))


def test_a_missing_peer_package_is_named_with_its_install_hint(ctx, no_equinox):
    hint = "equinox not installed: pip install jax-scan-rnn[bench]"
    assert peer_methods.missing("equinox") == hint
    assert peer_methods.missing("numpy") is None
    with pytest.raises(Skip, match=r"^equinox not installed: pip install jax-scan-rnn\[bench\]$") as why:
        bench.METHODS["peer-eqx-lstm"].build(ctx, BATCH, STEPS, "forward")
    assert why.value.status == "n/a"


def test_a_run_reports_missing_peers_as_na_and_measures_the_rest(tmp_path, no_equinox):
    cfg = bench.BenchConfig.quick(  # no sweep; torchax is past its max T here (short_max_t=3), so n/a unbuilt
        **CFG, seq_lens=(4,), batch_sizes=(1,), modes=("forward",), sweep_seq_lens=(), vae_batch_sizes=(),
        methods=("peer-eqx-lstm", "peer-flax-fb", "peer-torchax-loop"), short_max_t=3,
        repeats=1, min_repeats=1, case_budget_s=0.01, min_sample_s=0.001, budget_s=600.0, label="peers")
    results = bench.run_suite(cfg)
    rows = {(r["method"], r["section"]): r for r in results["rows"]}
    eqx = rows["peer-eqx-lstm", "grid"]
    assert eqx["status"] == "n/a" and eqx["reason"] == "equinox not installed: pip install jax-scan-rnn[bench]"
    flax = rows["peer-flax-fb", "grid"]
    assert flax["status"] == "ok" and flax["vs_jsr"]["vs"] == bench.AUTO_KEY  # its jsr row ran though not asked
    assert flax["vs_jsr"]["call"] > 0 and flax["vs_jsr"]["compile"] > 0
    assert flax["max_abs_diff"]["vs"] == bench.AUTO_KEY and flax["max_abs_diff"]["value"] < AGREE_TOL
    torchax = rows["peer-torchax-loop", "grid"]
    if INSTALLED["torchax"]:  # past its max T, with the reason: the compile of its unrolled loop
        assert torchax["status"] == "n/a" and "unrolls the seed's Python loop" in torchax["reason"]
    groups = peer_groups(results)
    assert {(g["section"], g["fastest_peer"]) for g in groups} >= {("grid", "peer-flax-fb")}
    crit = {c["criterion"].split(" (")[0]: c for c in bench.criteria(results)}
    assert crit["peers: jsr's warm call <= the fastest JAX peer's in every peer cell"]["value"] > 0
    md = bench.write_results(results, tmp_path, plots=False)["md"].read_text()
    assert "## Peers: what a JAX user would write, vs jsr" in md
    assert "equinox not installed: pip install jax-scan-rnn[bench]" in md
    assert "| forward | 1 | 4 | peer: Flax feedback cell in nnx.RNN (LSTMCell) |" in md
