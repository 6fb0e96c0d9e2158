"""What every parity test runs under: float32 matmuls computed in float32 by both frameworks."""
import jax
import pytest
import torch


@pytest.fixture(autouse=True)
def full_precision_matmuls():
    """CPU computes float32 matmuls exactly anyway; on a GPU both frameworks may use TF32 (JAX's default
    precision does on Ampere and later, and so does cuDNN's), which moved the LSTM/GRU/Traveller outputs by
    up to ~4e-4 on an H200 (benchmarks/results/parity-gpu-h200.txt), past the float32 tolerances: pin it off."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with jax.default_matmul_precision("highest"):
        yield
