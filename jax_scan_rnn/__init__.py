"""jax-scan-rnn: feedback recurrent networks in JAX/Flax NNX, driven by `jax.lax.scan`.

    import jax_scan_rnn as jsr
    lstm = jsr.LSTM(input_size, hidden_size, num_layers=1, rngs=nnx.Rngs(0))  # torch.nn.LSTM's arguments
    jsr.load_torch_state_dict(lstm, torch_lstm.state_dict())
    out, (h, c) = jsr.jit(lstm)(x)             # x [T, B, I] (batch_first=False, torch's default) -> [T, B, H]
    positions, state = jsr.jit(trav)(x, state)  # the Traveller carries its state across calls

Importing the package first adds one CPU setting to `XLA_FLAGS` (whole small loops compiled as one
kernel; `xla_flags.py` says what it does, what it measured, and how to opt out).
"""
from jax_scan_rnn import xla_flags

xla_flags.configure()  # before anything below can create a JAX backend

from jax_scan_rnn.cells import GRUCell, LSTMCell, RNNCell
from jax_scan_rnn.compiled import Compiled, jit
from jax_scan_rnn.convert import load_safetensors, load_torch_state_dict, save_safetensors, torch_state_dict
from jax_scan_rnn.feedback import feedback_scan
from jax_scan_rnn.layers import GRU, LSTM, RNN
from jax_scan_rnn.traveller import Traveller, TravellerState
from jax_scan_rnn.vae import SeqVAE

__version__ = "0.1.0"

__all__ = [
    "LSTM",
    "GRU",
    "RNN",
    "Traveller",
    "TravellerState",
    "SeqVAE",
    "feedback_scan",
    "LSTMCell",
    "GRUCell",
    "RNNCell",
    "load_torch_state_dict",
    "torch_state_dict",
    "save_safetensors",
    "load_safetensors",
    "jit",
    "Compiled",
    "__version__",
]
