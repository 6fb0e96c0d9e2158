"""Exposure bias, measured: a SMILES VAE trained with teacher forcing alone vs with scheduled sampling.

What it teaches:
  1. Teacher forcing trains the decoder on the TRUE previous token, but generation feeds it its OWN
     previous token. The mismatch ("exposure bias") shows up as a gap between teacher-forced and
     free-running reconstruction.
  2. Scheduled sampling (Bengio et al. 2015) closes part of that gap: during training, each token is
     replaced by the model's own prediction with a probability that rises over training, one coin per
     token. In `jsr.SeqVAE` it is the same `lax.scan` as teacher forcing and generation, only the
     "what is fed back" rule differs.
  3. It is not free: the target stays the true next token after a prefix the model corrupted, which
     rewards continuing the original string where it no longer parses. Prior samples decoded at
     temperature 1 are far less often valid SMILES than teacher forcing's (the README's VAE table, the
     `--decoding scheduled` rows). Which to use depends on the job: reconstruction from a latent, or
     generation.
  4. Both runs use the same data, initialisation, steps and noise; only the decoding differs.

Run:   python examples/03_smiles_vae.py           (two trainings of 600 steps with `train vae`'s model; STEPS sets it)
       python examples/03_smiles_vae.py --quick   (12 steps, small model, 600 molecules: ~30-60 s, mostly compiling)
Output: a table of free-running reconstruction and prior-sample validity; results.json (its numbers), a PNG of
the training curves and metrics.jsonl (their rows: `fit`'s train rows, each with its run's "decoding"), in
examples/out/03_smiles_vae (or --out).
"""
# %% Config
import argparse
import dataclasses
import json
import sys
from pathlib import Path

from jax_scan_rnn.cli import ProgressBar
from jax_scan_rnn.runlog import strict_json
from jax_scan_rnn.tasks import vae as vae_task
from jax_scan_rnn.train import TrainConfig

# --out's default is beside this file, wherever it runs from (a notebook kernel, which has no __file__,
# runs in the notebook's folder)
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
parser.add_argument("--quick", action="store_true", help="12 steps on 600 molecules: a smoke test")
parser.add_argument("--out", default=HERE / "out" / "03_smiles_vae", type=Path,
                    help="where results.json, metrics.jsonl and the PNG go (default: %(default)s, beside this file)")
args, unknown = parser.parse_known_args()
if unknown and "ipykernel" not in sys.modules:  # a notebook kernel passes its own (-f kernel.json)
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")

STEPS = 12 if args.quick else 600  # optimiser steps per run (`train vae` runs 1800)
LOG_EVERY = 3 if args.quick else 50  # steps per point of the curves (each the mean over its steps)
BASE = vae_task.VAETask(
    # rdkit's molecules, aromatic, in length-bucketed batches: the data every [chem] install has, and
    # `train vae`'s defaults until 2026-12-02 (now MOSES's data in Kekulé form, which needs molsets).
    data="rdkit",
    limit=None,
    kekule=False,
    bucket_pool=100,
    hidden_size=256,
    latent_size=64,
    batch_size=128,
    ss_midpoint=STEPS // 2,  # teacher-forcing probability 0.5 halfway through...
    ss_max=0.5,  # ...and never below 0.5
    kl_warmup=STEPS // 3,
    eval_samples=1000,
    eval_sequences=500,
)
if args.quick:  # a smaller model, data set and evaluation: its numbers mean nothing
    BASE = dataclasses.replace(BASE, hidden_size=32, latent_size=8, batch_size=16, limit=600, eval_samples=50,
                               eval_sequences=20)
OUT: Path = args.out

# %% Data: ~15,000 drug-like SMILES shipped inside the rdkit wheel, split 90/5/5
dataset = vae_task.load_dataset(BASE)
print(f"{len(dataset.train)} training molecules, vocabulary of {dataset.vocab.size} characters")
print("e.g.", ", ".join(dataset.train[:3]))

# %% Train the same model twice: teacher forcing alone, then scheduled sampling
config = TrainConfig(steps=STEPS, learning_rate=vae_task.LEARNING_RATE, warmup_steps=min(50, STEPS),
                     log_every=LOG_EVERY, eval_every=0, checkpoint_every=0)
results, curves, log_rows = {}, {}, []
for decoding in ("teacher", "scheduled"):
    task = vae_task.VAETask(**{**BASE.__dict__, "decoding": decoding})
    print(f"\ntraining with {decoding} decoding ({STEPS} steps)...")
    model, _, history = vae_task.train(task, config, dataset=dataset, callback=ProgressBar())  # the CLI's bar
    curves[decoding] = history.series("recon", "train")
    log_rows += [{"decoding": decoding, **row} for row in history.train]  # metrics.jsonl: the curves' numbers
    results[decoding] = vae_task.evaluate(model, dataset, task)

# %% Compare: free-running reconstruction is where exposure bias shows
print(f"\n{'':<22} {'teacher forcing':>16} {'scheduled sampling':>19}")
rows = [("TF token acc", "reconstruction", "tf_token_acc"),
        ("free-run token acc", "reconstruction", "free_token_acc"),
        ("free-run sequence acc", "reconstruction", "free_sequence_acc"),
        ("prior validity (T=1)", "samples", "validity"),
        ("prior validity (greedy)", "samples_greedy", "validity"),
        ("prior uniqueness", "samples", "uniqueness"),
        ("prior novelty", "samples", "novelty")]
for label, group, key in rows:
    a, b = results["teacher"][group][key], results["scheduled"][group][key]
    print(f"{label:<22} {a:>16.3f} {b:>19.3f}")
if args.quick:
    print(f"quick run: {STEPS} steps on {BASE.limit} molecules, so the comparison is not meaningful at this size")

# %% Plot the training reconstruction loss of both runs
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT.mkdir(parents=True, exist_ok=True)
fig, ax = plt.subplots(figsize=(7, 3.5))
for decoding, (steps, values) in curves.items():
    ax.plot(steps, values, label=decoding)
ax.set_xlabel("optimiser step")
ax.set_ylabel("reconstruction loss (nats / molecule)")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "recon_curves.png", dpi=110)
(OUT / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
(OUT / "metrics.jsonl").write_text("".join(strict_json(row) + "\n" for row in log_rows), encoding="utf-8")
print(f"results written to {OUT}")
