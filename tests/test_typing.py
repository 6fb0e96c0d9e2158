"""The packages are typed (PEP 561): type checkers and editors read the real classes behind `jsr.LSTM` & co., and the
array arguments the models take at run time (NumPy, torch, lengths as a list) are what their hints say."""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jax_scan_rnn

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(jax_scan_rnn.__file__).parent

# A user's calls, each taken at run time (the last test runs them): the models with NumPy arrays, torch tensors and
# host lengths, their twins and state_dicts, jsr.jit, the seed's Traveller in torch_ref and its weights moved over.
USER_CALLS = """
import numpy as np
import torch
from flax import nnx

import jax_scan_rnn as jsr
import torch_ref

x = np.zeros((10, 4, 8), np.float32)
lstm = jsr.LSTM(8, 32, num_layers=2, rngs=nnx.Rngs(0))
out, (h, c) = lstm(x)
out, state = lstm(torch.zeros(10, 4, 8), (h, c))
gru = jsr.GRU(8, 16, batch_first=True, bidirectional=True, rngs=nnx.Rngs(0))
out, h = gru(np.swapaxes(x, 0, 1), lengths=[3, 4, 5, 6])
out, h = gru(np.swapaxes(x, 0, 1), lengths=np.array([3, 4, 5, 6]))
h1, c1 = jsr.LSTMCell(8, 16, rngs=nnx.Rngs(0))(x[0])
h1 = jsr.GRUCell(8, 16, rngs=nnx.Rngs(0))(torch.zeros(4, 8), h1)
trav = jsr.Traveller(num_inputs=8, hidden_size=64, num_layers=2, rngs=nnx.Rngs(0))
positions, trav_state = trav(np.zeros((1, 5, 8), np.float32))
p_t, trav_state = trav.step(trav_state, np.ones((1, 8), np.float32))
positions, trav_state = jsr.jit(trav)(np.zeros((1, 5, 8), np.float32))
positions, trav_state = jsr.jit(trav).eval()(np.zeros((1, 5, 8), np.float32), trav_state, layout="batch")
vae = jsr.SeqVAE(30, 64, 16, 1, rngs=nnx.Rngs(0))
tokens, lengths = np.ones((2, 6), np.int32), np.array([6, 4])
mu, logvar = vae.encode(tokens, lengths)
losses = vae.loss(tokens, lengths, eps=np.zeros((2, 16), np.float32))
generated = vae.generate(np.zeros((2, 16), np.float32), 10, mode="sample", temperature=0.8)
generated = jsr.jit(vae).generate(np.zeros((2, 16), np.float32), 10, mode="sample", temperature=0.8)
jsr.load_torch_state_dict(lstm, torch.nn.LSTM(8, 32, num_layers=2).state_dict())
jsr.save_safetensors(jsr.torch_state_dict(lstm), "lstm.safetensors")
twin = jsr.from_torch_module(torch.nn.GRU(8, 16))
back = jsr.to_torch_module(twin)
seed_model = torch_ref.Traveller(8, 64, 2, 0.0)
torch_positions, torch_state = seed_model(torch.zeros(1, 5, 8))
torch_p_t, torch_state = seed_model.step(torch_state, torch.zeros(1, 8))
jsr.load_torch_state_dict(trav, seed_model.state_dict())
torch_out, (torch_h, torch_c) = torch_ref.LSTM(8, 16, batch_first=True)(torch.zeros(2, 3, 8))
"""
# Misuses a type checker catches only when it sees the classes (the lazy names alone would read as Any):
# (line, what mypy names).
MISUSES = [
    ('jsr.LSTM("eight", 32, rngs=nnx.Rngs(0))', 'Argument 1 to "LSTM" has incompatible type "str"; expected "int"'),
    ("jsr.Traveller(8, 64, num_assets=2.5, rngs=nnx.Rngs(0))", '"num_assets" to "Traveller" has incompatible type'),
    ('jsr.torch_state_dict(lstm).weight_ih_l0', 'has no attribute "weight_ih_l0"'),
    ("jsr.jit(lstm)(x, lenghts=[3, 4, 5, 6])", 'Unexpected keyword argument "lenghts" for "__call__" of "Compiled"'),
]


def type_checking_imports() -> dict[str, str]:
    """Name -> module of the `if TYPE_CHECKING:` imports in jax_scan_rnn/__init__.py."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.name: node.module.removeprefix("jax_scan_rnn.") for node in block.body
            for alias in node.names if isinstance(node, ast.ImportFrom)}


def test_type_checkers_see_each_lazy_name_where_it_is_loaded_from():
    assert type_checking_imports() == jax_scan_rnn._EXPORTS
    for package in (PACKAGE, ROOT / "torch_ref"):  # PEP 561: without it mypy reads an installed package as untyped
        assert (package / "py.typed").is_file(), package


def test_submodules_are_reached_from_the_package_as_the_docs_write_them():
    """`jsr.cells.HAND_WRITTEN_VJP` (docs/library.md) and `jsr.cells.matmul` (docs/tuning_cpu.md) in a fresh process,
    before any other name is touched; a name that is neither an export nor a submodule is Python's AttributeError."""
    code = ("import sys, jax_scan_rnn as jsr\n"
            "assert 'jax' not in sys.modules  # the import itself stays light\n"
            "assert jsr.cells.HAND_WRITTEN_VJP is True and callable(jsr.cells.matmul) and callable(jsr.train.fit)\n"
            "assert not hasattr(jsr, 'cells.x') and not hasattr(jsr, 'foo.bar')  # getattr's probes: a name only\n"
            "try:\n    jsr.nonexistent\nexcept AttributeError as err:\n    print(err)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "module 'jax_scan_rnn' has no attribute 'nonexistent'"


def checker_errors(checker: str, tmp_path: Path) -> tuple[list[tuple[str, int, str]], str]:
    """(file, line, message) of each error `checker` (mypy or basedpyright, pyright's command-line build that
    pip installs with its own node) reports for the README's and docs/library.md's blocks, USER_CALLS + MISUSES and
    the examples, and its raw output."""
    blocks = []
    for page in ("README.md", "docs/library.md"):  # each page's Python blocks, as a reader copies them
        for k, code in enumerate(re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)):
            blocks.append(f"{Path(page).stem.lower()}_block_{k + 1}.py")
            (tmp_path / blocks[-1]).write_text(code)
    (tmp_path / "user_calls.py").write_text("\n".join([*USER_CALLS.splitlines(), *(c for c, _ in MISUSES)]) + "\n")
    # The examples too: a reader copies from them, so they must check as clean as the calls above.
    files = [*blocks, "user_calls.py", *sorted(str(f) for f in (ROOT / "examples").glob("*.py"))]
    if checker == "mypy":
        # MYPYPATH: the package's source, which an editable install's import hook hides from mypy. The package's
        # own modules are checked silently: their hints are what this test reads, not their bodies.
        command = [sys.executable, "-m", "mypy", "--python-executable", sys.executable, "--follow-imports=silent",
                   "--ignore-missing-imports", "--no-implicit-reexport", "--cache-dir", str(tmp_path / "cache"),
                   "--no-error-summary", "--hide-error-context", *files]
        env = {**os.environ, "MYPYPATH": str(ROOT)}
    else:
        (tmp_path / "pyrightconfig.json").write_text(json.dumps({"extraPaths": [str(ROOT), str(ROOT / "examples")],
                                                                   "typeCheckingMode": "standard"}))
        command = [str(Path(sys.executable).with_name("basedpyright")), "--pythonpath", sys.executable, *files]
        env = dict(os.environ)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    pattern = (r"^(\S+\.py):(\d+): error: (.*)$" if checker == "mypy" else r"^\s*\S*/(\S+\.py):(\d+):\d+ - error: (.*)$")
    found = [re.match(pattern, line) for line in result.stdout.splitlines()]
    return [(m[1], int(m[2]), m[3]) for m in found if m], result.stdout + result.stderr


@pytest.mark.parametrize("checker", ["mypy", "basedpyright"])
def test_type_checkers_take_the_users_calls_and_name_each_misuse(checker, tmp_path):
    if checker == "mypy":
        pytest.importorskip("mypy")
    elif not Path(sys.executable).with_name("basedpyright").exists():
        pytest.skip("basedpyright is not installed (pip install basedpyright)")
    errors, output = checker_errors(checker, tmp_path)
    first_misuse = len(USER_CALLS.splitlines()) + 1
    wrong = [e for e in errors if e[:2] not in {("user_calls.py", first_misuse + k) for k in range(len(MISUSES))}]
    assert not wrong, f"{checker} refused calls the models (or the examples) take at run time: {wrong}\n{output}"
    for k, (call, message) in enumerate(MISUSES):
        said = [text for file, line, text in errors if (file, line) == ("user_calls.py", first_misuse + k)]
        assert said, f"{checker} let {call} pass: it reads the name as Any\n{output}"
        assert checker != "mypy" or message in said[0], (call, message, said)


def test_the_users_calls_run(tmp_path, monkeypatch):
    """What the type check above takes is what the models take."""
    monkeypatch.chdir(tmp_path)  # the safetensors file
    exec(compile(USER_CALLS, "user_calls.py", "exec"), {})
