"""Comparison helpers for parity tests: each failure names the tensor and the step that diverged."""
from __future__ import annotations

import numpy as np

# float32 vs float32 on CPU: two implementations of the same recurrence round differently; over 500-1000
# steps the accumulated difference stays near 1e-7, so 1e-5 leaves two orders of magnitude of margin.
FLOAT32_ATOL = 1e-5
# float64: rounding is ~1e-16 per op; 1e-12 still catches any real (mapping or math) difference.
FLOAT64_ATOL = 1e-12
# Gradients are sums over T steps and B sequences, so compared relative to their largest entry.
FLOAT32_GRAD_RTOL = 1e-5
FLOAT64_GRAD_RTOL = 1e-12


def atol_for(dtype) -> float:
    return FLOAT64_ATOL if np.dtype(dtype) == np.float64 else FLOAT32_ATOL


def grad_rtol_for(dtype) -> float:
    return FLOAT64_GRAD_RTOL if np.dtype(dtype) == np.float64 else FLOAT32_GRAD_RTOL


def to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def assert_steps_close(name: str, got, want, atol: float, time_axis: int = 1) -> None:
    """Compare `[B, T, ...]` sequences; on failure name the first time step that diverged."""
    got, want = to_numpy(got), to_numpy(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != reference {want.shape}"
    err = np.abs(got - want)
    per_step = np.moveaxis(err, time_axis, 0).reshape(err.shape[time_axis], -1).max(axis=1)
    bad = np.flatnonzero(per_step > atol)
    assert bad.size == 0, (
        f"{name}: first diverges at step {bad[0]} of {per_step.size} "
        f"(max |diff| there {per_step[bad[0]]:.3e}, worst {per_step.max():.3e} at step {per_step.argmax()}, "
        f"atol {atol:.0e})"
    )


def assert_close(name: str, got, want, atol: float) -> None:
    got, want = to_numpy(got), to_numpy(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != reference {want.shape}"
    err = float(np.abs(got - want).max()) if got.size else 0.0
    assert err <= atol, f"{name}: max |diff| {err:.3e} > atol {atol:.0e}"


def assert_grads_close(grads: dict, ref: dict, rtol: float, context: str = "") -> None:
    """Compare `{torch key: gradient}` dicts relative to each reference gradient's largest entry."""
    assert set(grads) == set(ref), f"{context}gradient keys differ: {sorted(set(grads) ^ set(ref))}"
    for key in ref:
        g, r = to_numpy(grads[key]), to_numpy(ref[key])
        assert g.shape == r.shape, f"{context}grad {key}: shape {g.shape} != reference {r.shape}"
        scale = max(float(np.abs(r).max()), 1e-30)
        rel = float(np.abs(g - r).max()) / scale
        assert rel <= rtol, f"{context}grad {key}: max relative diff {rel:.3e} > rtol {rtol:.0e}"
