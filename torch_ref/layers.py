"""`torch.nn.LSTM`/`torch.nn.GRU` with `batch_first=True` by default, as `jax_scan_rnn` uses.

They are the `torch.nn` classes themselves (same parameters, same `state_dict()` keys
`weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}`), so a checkpoint of a plain
`nn.LSTM(..., batch_first=True)` loads unchanged.
"""
from torch import nn


class LSTM(nn.LSTM):
    """`nn.LSTM(input_size, hidden_size, num_layers, dropout=dropout, batch_first=True)`."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0, **kwargs):
        kwargs.setdefault("batch_first", True)
        super().__init__(input_size, hidden_size, num_layers, dropout=dropout, **kwargs)


class GRU(nn.GRU):
    """`nn.GRU(input_size, hidden_size, num_layers, dropout=dropout, batch_first=True)`."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0, **kwargs):
        kwargs.setdefault("batch_first", True)
        super().__init__(input_size, hidden_size, num_layers, dropout=dropout, **kwargs)
