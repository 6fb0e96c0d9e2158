"""The Python snippets of the README and docs/library.md run as written (a newcomer copies them first)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
ROOT = README.parent
SNIPPET_PAGES = [README, ROOT / "docs" / "library.md"]  # docs/scan_vs_loop.md's blocks: tests/test_docs_code.py
SNIPPETS = [(page, index, code) for page in SNIPPET_PAGES
            for index, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))]


@pytest.mark.parametrize("page", SNIPPET_PAGES, ids=lambda p: p.name)
def test_the_page_has_python_snippets(page):
    assert any(p == page for p, _, _ in SNIPPETS), f"no ```python block in {page}"


@pytest.mark.parametrize(("page", "index", "code"), SNIPPETS, ids=[f"{p.name}-{i + 1}" for p, i, _ in SNIPPETS])
def test_snippet_runs_as_written(page, index, code, tmp_path, monkeypatch, readers_jax_defaults):
    monkeypatch.chdir(tmp_path)  # a snippet may write files (lstm.safetensors, runs/): keep them out of the repo
    compiled = compile(code, f"{page.name} python block {index + 1}", "exec")
    exec(compiled, {"__name__": f"snippet_{page.stem}_{index}"})


DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc):
    """A clone must explain itself: every relative link of the README and docs names a file in the repo."""
    for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), f"{doc.name} links to {target}, which is not in the repo"


def load_figures():
    """docs/figures.py, the one renderer of measured figures (a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("figures", ROOT / "docs" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quoted_figures_agree_with_their_results_files():
    """A figure between <!--fig:NAME--> markers is what docs/figures.py renders from its committed results
    file: a number typed by hand, or a results file replaced without re-rendering, fails here."""
    figures = load_figures()
    used = set()
    for doc in figures.DOCUMENTS:
        text = doc.read_text()
        _, changed = figures.render(text)
        assert not changed, f"{doc.name}: figures {changed} disagree with their results files; run python docs/figures.py"
        used.update(match.group(1) for match in figures.MARKER.finditer(text))
    assert used == set(figures.FIGURES), f"figures defined but quoted nowhere: {sorted(set(figures.FIGURES) - used)}"


def test_the_b64_lstm_sentence_says_which_row_the_results_file_has_faster():
    """scan_vs_loop.md's words around the B=64 comparison of `nn.LSTM` over the whole sequence with the scan
    say which was faster in the results file (they once said "the fused library LSTM wins" above figures in
    which the scan led)."""
    figures = load_figures()
    seq, scan = (figures.bench_row(figures.MAIN, m, "forward", 64, 1000)["per_step_us"]
                 for m in ("torch-lstm-seq", "jax-scan-auto"))
    page = (ROOT / "docs" / "scan_vs_loop.md").read_text()
    start = page.index("**`nn.LSTM` over the whole sequence**")
    paragraph = figures.MARKER.sub(lambda m: m.group(2), page[start:page.index("\n\n", start)])
    says = ("the scan still leads" in paragraph, "wins" in paragraph)  # (the scan faster, nn.LSTM faster)
    assert says == (scan < seq, scan >= seq), (
        f"nn.LSTM {seq:.1f} vs scan {scan:.1f} µs per step at B=64, but the page says: {paragraph!r}")


def test_vae_experiments_says_what_the_default_is_as_the_code_has_it():
    """docs/vae_experiments.md logs runs made under earlier defaults, but where it says in the present tense
    what the default is, that is `train vae`'s default today: it once said "It is the default" of length
    bucketing and "The default keeps rdkit's data" after both had changed (random batches, MOSES's data)."""
    from jax_scan_rnn.tasks.vae import VAETask

    task = VAETask()
    text = " ".join((ROOT / "docs" / "vae_experiments.md").read_text().split())
    bucketing = text[text.index("- Length bucketing costs no validity"):]
    bucketing = bucketing[:bucketing.index(" - ")]
    assert ("It is the default." in bucketing) == (task.bucket_pool > 0), bucketing
    assert ("The default keeps rdkit's data" in text) == (task.data == "rdkit"), f"train vae's default data: {task.data}"


def test_tuning_cpu_states_the_thin_matmul_rule_the_cells_apply():
    """`cells.matmul` writes x @ w as broadcast products when K <= THIN_MATMUL_DIM, or when N is and x has at
    most THIN_OUTPUT_MAX_ROWS rows; tuning_cpu.md once said "any product with a side of at most 4", which the
    B=64 readout (a dot since the peers' measurement) contradicts."""
    import jax
    import jax.numpy as jnp

    from jax_scan_rnn import cells

    def uses_dot(x, w):
        return "dot_general" in str(jax.make_jaxpr(cells.matmul)(x, w))

    assert cells.THIN_OUTPUT_MAX_ROWS == 1
    assert not uses_dot(jnp.ones((1, 64)), jnp.ones((64, 2))) and uses_dot(jnp.ones((64, 64)), jnp.ones((64, 2)))
    assert not uses_dot(jnp.ones((64, 2)), jnp.ones((2, 256)))
    text = " ".join((ROOT / "docs" / "tuning_cpu.md").read_text().split())
    assert "any product with a side of at most 4" not in text and "for a single row" in text


SEED_ANSWER_MODULE = '''
import torch
from typing import Optional, Tuple


class Traveller(torch.nn.Module):  # the seed answer's module, its @torch.jit.script_method line removed
    def __init__(self, num_inputs: int, hidden_size: int, num_layers: int, dropout: float):
        super().__init__()
        self.lstm_layers = torch.nn.LSTM(input_size=num_inputs + 2, hidden_size=hidden_size,
                                         num_layers=num_layers, dropout=dropout, batch_first=True)
        self.output_layer = torch.nn.Linear(in_features=hidden_size, out_features=2)
        self.activation = torch.nn.Tanh()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        assert (inputs.shape[1] == 1), "window should always be 1 since we're not using sequences"
        hidden_state: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        prev_position = torch.zeros((1, 1, 2), device=inputs.device, dtype=inputs.dtype)
        positions_list = []
        seq_len = inputs.size(0)
        for t in range(seq_len):
            current_inputs = inputs[t : t + 1]
            input_data = torch.cat([prev_position, current_inputs], dim=2)
            lstm_out, hidden_state = self.lstm_layers(input_data, hidden_state)
            out = self.output_layer(lstm_out)
            position = self.activation(out)
            prev_position = position
            positions_list.append(position)
        positions = torch.cat(positions_list, dim=0).squeeze(dim=1)
        assert positions.shape == (inputs.shape[0], 2)
        return positions
'''


def test_torch_jit_script_of_the_seed_answers_module_works_as_the_docs_say(tmp_path, monkeypatch):
    """The seed answer's module, without its `@torch.jit.script_method`, scripts with `torch.jit.script(model)`
    (its hidden state is annotated Optional) and gives the eager module's positions; seeds.md once said scripting
    the module fails and only a function works."""
    import importlib
    import warnings

    torch = pytest.importorskip("torch")
    (tmp_path / "seed_answer.py").write_text(SEED_ANSWER_MODULE)  # TorchScript reads the source from a file
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module("seed_answer").Traveller(8, 16, 2, 0.0).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated, and still works
        scripted = torch.jit.script(model)
    x = torch.randn(20, 1, 8)
    with torch.no_grad():
        assert torch.equal(scripted(x), model(x))
    seeds = " ".join((ROOT / "docs" / "seeds.md").read_text().split())
    assert "scripting the seed's module as written fails" not in seeds and "`torch.jit.script(model)`" in seeds


# A compile's first call moves by well under 2x with this shared machine's load (the jsr rows' first calls over
# T = 100 to 10,000 in the same run: 0.31-0.39 s); a spread beyond it is a real difference, not noise.
FIRST_CALL_SPREAD = 2.0


def test_tuning_cpu_does_not_say_the_compiled_scans_compile_is_flat_when_its_first_calls_are_not():
    """tuning_cpu.md said `torch.compile` of the scan prototype has a compile that "does not grow with T", next
    to first calls of 1.2-5.4 s over T = 100 to 10,000 from the same results file."""
    figures = load_figures()
    first = [figures.bench_row(figures.MAIN, "torch-compile-scan", "forward", 1, t)["first_call_s"]
             for t in (100, 1000, 10000)]
    text = " ".join((ROOT / "docs" / "tuning_cpu.md").read_text().split())
    section = text[text.index("## Compiling a Python loop instead"):text.index("## The peers' rows, explained")]
    if max(first) > FIRST_CALL_SPREAD * min(first):
        assert "its compile does not grow with T" not in section, first


def logged_metric_names(monkeypatch, tmp_path) -> dict[str, set[str]]:
    """{task: the metric names its train and eval rows hold}, from each task's own loss_fn and eval_fn (fit replaced
    by a stand-in that keeps them): the simulated market, your data, the VAE."""
    import numpy as np

    from jax_scan_rnn.data.market_data import MarketData
    from jax_scan_rnn.tasks import traveller as tv
    from jax_scan_rnn.tasks import vae as vt
    from jax_scan_rnn.train import TrainConfig
    from tests.test_vae_task import SMILES

    names = {}
    for lib, label, run in (
            (tv, "traveller, simulated", lambda: tv.train(tv.TravellerTask(
                hidden_size=2, num_layers=1, batch_size=2, seq_len=3, train_paths=2, eval_paths=2, eval_steps=3),
                TrainConfig(steps=1))),
            (tv, "traveller, your data", lambda: tv.train(tv.TravellerTask(
                data="mem.npz", hidden_size=2, num_layers=1, batch_size=2, seq_len=3),
                TrainConfig(steps=1), data=MarketData(np.random.default_rng(0).standard_normal((1, 40, 2)),
                                                      0.01 * np.random.default_rng(1).standard_normal((1, 40, 1)),
                                                      ("f0", "f1"), ("a",)))),
            (vt, "vae", lambda: vt.train(vt.VAETask(data=str(tmp_path / "mols.smi"), max_length=20, hidden_size=8,
                                                    latent_size=2, batch_size=8), TrainConfig(steps=1)))):
        seen = {}
        monkeypatch.setattr(lib, "fit", lambda model, loss_fn, batch_fn, cfg, **kw: seen.update(
            model=model, loss_fn=loss_fn, batch_fn=batch_fn, **kw))
        (tmp_path / "mols.smi").write_text("\n".join(SMILES) + "\n")
        run()
        _, train_metrics = seen["loss_fn"](seen["model"], seen["batch_fn"](0))
        names[label] = set(train_metrics) | set(seen["eval_fn"](seen["model"]))
    return names


@pytest.mark.slow  # ~12 s on 2 cores: each task's eval_fn compiles its model
def test_the_cli_page_says_what_every_logged_metric_is(monkeypatch, tmp_path):
    """metrics.jsonl's rows hold each task's metrics by name; the README named none of them, nor that the VAE's eval
    `recon` (from z = mu, teacher-forced) is not the train rows' figure: a script reading the log had only the code.
    Every name a task logs is explained where docs/cli.md (the README's CLI section links it) describes
    metrics.jsonl."""
    assert "(docs/cli.md)" in README.read_text()
    text = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    start = text.index("A row of `metrics.jsonl`")
    paragraph = text[start:text.index("`--resume` continues from the newest valid checkpoint", start)]
    for label, names in logged_metric_names(monkeypatch, tmp_path).items():
        for name in names:
            assert f"`{name}`" in paragraph, f"{label}: {name} is logged but not explained in docs/cli.md"
    from jax_scan_rnn.tasks.vae import EVAL_LOSS, EVAL_RECONSTRUCT  # the counts it quotes are the code's

    assert f"up to {EVAL_LOSS} validation molecules" in paragraph and f"up to {EVAL_RECONSTRUCT} of them" in paragraph


@pytest.mark.slow  # ~45 s on 2 cores: four CLI commands, each a fresh interpreter that compiles
def test_the_cli_pages_run_from_start_to_finish_works_as_written(tmp_path, monkeypatch):
    """docs/cli.md's walk-through as a newcomer types it: its shell block in a new folder (train, resume for more
    updates, evaluate, export), then its Python block loading the export into torch_ref. A page that says what to
    type must not rot."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text[text.index("## A run from start to finish"):]
    section = section[:section.index("\n## ", 1)]
    shell = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    # the console script pip put beside this interpreter, as an activated virtual environment has it
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-e", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, f"docs/cli.md's commands failed:\n{result.stderr[-3000:]}"
    rows = [json.loads(line) for line in (tmp_path / "runs" / "first" / "metrics.jsonl").read_text().splitlines()]
    assert max(row["step"] for row in rows) == 120  # "60 more updates" after the first 60
    assert "Traveller (learned)" in result.stdout  # evaluate's table
    monkeypatch.chdir(tmp_path)
    exec(compile(python, "docs/cli.md python block", "exec"), {"__name__": "cli_page_block"})
