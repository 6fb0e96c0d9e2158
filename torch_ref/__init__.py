"""PyTorch reference implementations, written the way PyTorch users write them.

This package never imports `jax_scan_rnn`: it is the independent side of every parity test.
"""
from torch_ref.layers import GRU, LSTM

__all__ = ["LSTM", "GRU"]
