"""Optional dependencies, and the extra of `jax-scan-rnn` that installs each.

The core install (jax, flax, optax, orbax, numpy, safetensors, tqdm) runs every model, `jsr.jit`,
conversion from numpy state dicts and training. The rest is imported only where it is needed, through
`require`, so a missing package gives one line that says which extra to install:

    torch       torch_ref, the parity check, the benchmark's PyTorch rows      pip install 'jax-scan-rnn[torch]'
    rdkit       SMILES parsing and Kekulé form, validity metrics, --data rdkit  pip install 'jax-scan-rnn[chem]'
    matplotlib  plots (curves.png, positions.png, benchmark charts)            pip install 'jax-scan-rnn[plot]'
    pyarrow     reading --data FILE.parquet (market data for the Traveller)     pip install 'jax-scan-rnn[parquet]'
    fcd_torch   FCD/Test among MOSES's metrics (ChemNet's weights in its wheel)  pip install 'jax-scan-rnn[moses]'

`pip install 'jax-scan-rnn[dev]'` installs all of them (and the test tools).
"""
from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {"torch": "torch", "rdkit": "chem", "matplotlib": "plot", "pyarrow": "parquet", "fcd_torch": "moses"}


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` (e.g. "rdkit.Chem"), or raise ImportError naming `purpose` and the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        raise ImportError(f"{purpose} needs {top}, which is not installed: pip install 'jax-scan-rnn[{EXTRAS[top]}]'") from err


def available(module: str) -> bool:
    """Whether `module` can be imported (it is imported to find out)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
