"""benchmarks/call_overhead.py's live tick, the source of the README's `calls.live` figure: both arms run the same
ticks on the same weights, so their positions agree, and each row carries what the figure and table read."""

import pytest

pytest.importorskip("torch")

PARITY_ATOL = 1e-5  # float32 LSTM steps in two frameworks, a few ticks: rounding only (the parity tests' bound)
BENCHMARK_SCRIPT = "call_overhead"  # the `script` fixture (conftest.py) imports it


def test_live_ticks_of_jsr_and_torch_agree_and_are_timed(script):
    rows = script.live(rounds=2, calls=3)
    assert [r["arm"] for r in rows] == ["jsr.jit step", "torch step"]
    for r in rows:
        assert r["calls"] == 6 and r["median_us"] > 0 and r["first_call_s"] > 0
        assert r["round_median_min_us"] <= r["round_median_max_us"]
        assert r["max_abs_diff_jsr_vs_torch"] < PARITY_ATOL, f"{r['arm']}: positions diverged after 7 ticks"
