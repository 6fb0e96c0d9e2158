"""jax-scan-rnn: feedback recurrent networks in JAX/Flax NNX, driven by `jax.lax.scan`.

    import jax_scan_rnn as jsr
    lstm = jsr.LSTM(input_size, hidden_size, num_layers=1, rngs=nnx.Rngs(0))  # torch.nn.LSTM's arguments
    jsr.load_torch_state_dict(lstm, torch_lstm.state_dict())
    fast = jsr.jit(lstm)                       # once: each jsr.jit(model) walks the model's graph
    out, (h, c) = fast(x)                      # x [T, B, I] (batch_first=False, torch's default) -> [T, B, H]
    step = jsr.jit(trav)                       # kept, and called once per market tick:
    positions, state = step(x, state)          # the state goes back in: the next call continues from it

Importing the package first adds two CPU settings to `XLA_FLAGS` (whole small loops compiled as one
kernel, and the matrix-vector code inside it; `xla_flags.py` says what they do, what they measured, and
how to opt out).
"""
import importlib
import importlib.util
from typing import TYPE_CHECKING

from jax_scan_rnn import versions, xla_flags

if TYPE_CHECKING:  # what type checkers and editors read for the lazy names below (tests/test_typing.py: the same names)
    # `X as X`: a re-export to strict checkers (mypy --strict, pyright), which read a plain import as private.
    from jax_scan_rnn.cells import GRUCell as GRUCell, LSTMCell as LSTMCell, RNNCell as RNNCell
    from jax_scan_rnn.cells import RNNCellBase as RNNCellBase
    from jax_scan_rnn.compiled import Compiled as Compiled, jit as jit
    from jax_scan_rnn.convert import from_torch_module as from_torch_module, to_torch_module as to_torch_module
    from jax_scan_rnn.convert import load_torch_state_dict as load_torch_state_dict, torch_state_dict as torch_state_dict
    from jax_scan_rnn.convert import load_safetensors as load_safetensors, save_safetensors as save_safetensors
    from jax_scan_rnn.feedback import feedback_scan as feedback_scan
    from jax_scan_rnn.scan import EagerCallWarning as EagerCallWarning
    from jax_scan_rnn.layers import GRU as GRU, LSTM as LSTM, RNN as RNN, RNNBase as RNNBase
    from jax_scan_rnn.traveller import Traveller as Traveller, TravellerState as TravellerState
    from jax_scan_rnn.vae import SeqVAE as SeqVAE

xla_flags.configure()  # before anything below can create a JAX backend
versions.check()  # an older jax, flax, ... than the tested floors: one ImportError naming them

__version__ = "0.1.0"

# Public name -> the module that defines it. Imported on first use (PEP 562), so that `import jax_scan_rnn`,
# `jax-scan-rnn --version` and `--help` do not pay for importing JAX, Flax and the models.
_EXPORTS = {
    "LSTM": "layers", "GRU": "layers", "RNN": "layers", "RNNBase": "layers",
    "Traveller": "traveller", "TravellerState": "traveller",
    "SeqVAE": "vae",
    "feedback_scan": "feedback",
    "LSTMCell": "cells", "GRUCell": "cells", "RNNCell": "cells", "RNNCellBase": "cells",
    "load_torch_state_dict": "convert", "torch_state_dict": "convert", "save_safetensors": "convert",
    "load_safetensors": "convert", "from_torch_module": "convert", "to_torch_module": "convert",
    "jit": "compiled", "Compiled": "compiled", "EagerCallWarning": "scan",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"jax_scan_rnn.{_EXPORTS[name]}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    # A submodule too (`jsr.cells.HAND_WRITTEN_VJP`, `jsr.train.fit`), as after `import jax_scan_rnn.cells`
    if name.isidentifier() and not name.startswith("_") and importlib.util.find_spec(f"jax_scan_rnn.{name}"):
        return importlib.import_module(f"jax_scan_rnn.{name}")  # the import binds it here
    raise AttributeError(f"module 'jax_scan_rnn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
