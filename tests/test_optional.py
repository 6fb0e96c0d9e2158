"""The core install: without torch, rdkit and matplotlib the package imports, runs its models and trains,
and what needs one of them says which extra to install (simulated by blocking their import)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

WITHOUT_EXTRAS = textwrap.dedent("""
    import sys
    BLOCKED = {"torch", "rdkit", "matplotlib"}

    class Block:  # as if they were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"No module named {name!r}")

    sys.meta_path.insert(0, Block())
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    import jax_scan_rnn as jsr
    from jax_scan_rnn.cli import main
    from jax_scan_rnn.data import smiles

    out, (h, c) = jsr.jit(jsr.LSTM(3, 4, 2, rngs=nnx.Rngs(0)))(np.ones((5, 2, 3), np.float32))
    assert out.shape == (5, 2, 4)
    sd = jsr.torch_state_dict(jsr.LSTM(3, 4, rngs=nnx.Rngs(0)))
    jsr.load_torch_state_dict(jsr.LSTM(3, 4, rngs=nnx.Rngs(1)), sd)
    positions, state = jsr.jit(jsr.Traveller(4, 8, rngs=nnx.Rngs(0)))(jnp.zeros((1, 6, 4)))
    try:
        smiles.parse_smiles("CCO")
    except ImportError as err:
        print("SMILES:", err)
    assert main(["check", "--steps", "3"]) == 2
    out_dir = sys.argv[1]
    code = main(["train", "traveller", "--steps", "2", "--hidden-size", "4", "--num-layers", "1", "--batch-size", "4",
                 "--seq-len", "8", "--eval-every", "0", "--out", out_dir])
    assert code == 0, code
    # evaluate: the table is the evaluation and the default plot is extra (exit 0); a plot asked for by name is
    # refused before any work
    assert main(["evaluate", "traveller", "--checkpoint", out_dir, "--paths", "4", "--horizon", "8"]) == 0
    assert main(["evaluate", "traveller", "--checkpoint", out_dir, "--plot", out_dir + "/p.png"]) == 2
    assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print("OK")
""")


def test_core_install_runs_without_torch_rdkit_matplotlib(tmp_path):
    result = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, str(tmp_path / "run")], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK"), result.stdout
    assert "SMILES: SMILES support needs rdkit, which is not installed: pip install 'jax-scan-rnn[chem]'" in result.stdout
    err = result.stderr
    assert "jax-scan-rnn check: error: the parity check (it compares against torch.nn) needs torch, which is not " \
           "installed: pip install 'jax-scan-rnn[torch]'" in err, err[-2000:]
    assert f"{tmp_path / 'run' / 'curves.png'} not drawn: matplotlib is not installed" in err, err[-2000:]
    assert "curves: not drawn (pip install 'jax-scan-rnn[plot]')  positions: not drawn (pip install " \
           "'jax-scan-rnn[plot]')" in result.stdout
    assert (tmp_path / "run" / "evaluation.json").exists() and not (tmp_path / "run" / "curves.png").exists()
    assert "positions plot: not drawn (pip install 'jax-scan-rnn[plot]')" in result.stdout, result.stdout[-2000:]
    assert f"--plot: drawing {tmp_path / 'run'}/p.png needs matplotlib, which is not installed" in err, err[-2000:]
    assert not list((tmp_path / "run").glob("positions*"))
