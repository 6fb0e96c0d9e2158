"""`LSTM`, `GRU`, `RNN`: `torch.nn.LSTM`, `torch.nn.GRU` and `torch.nn.RNN` themselves.

They are the classes PyTorch users already write, with torch's defaults (`batch_first=False`: time-major
`[T, B, I]`), parameters and `state_dict()` keys (`weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`,
`bias_hh_l{k}`, `weight_hr_l{k}` with `proj_size`, `_reverse` for the backward direction). `jsr.LSTM`,
`jsr.GRU` and `jsr.RNN` take the same constructor arguments with the same meaning, so code and checkpoints move
across unchanged.
"""
from torch import nn

LSTM = nn.LSTM
GRU = nn.GRU
RNN = nn.RNN
