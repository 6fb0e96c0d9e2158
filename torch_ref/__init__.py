"""PyTorch reference implementations, written the way PyTorch users write them.

This package never imports `jax_scan_rnn`: it is the independent side of every parity test.
"""
from torch_ref.layers import GRU, LSTM, RNN
from torch_ref.traveller import Traveller, TravellerState
from torch_ref.vae import SeqVAE

__all__ = ["LSTM", "GRU", "RNN", "Traveller", "TravellerState", "SeqVAE"]
