"""Validity against novelty for every recorded VAE experiment, beside MOSES's published models: the plot of
issue 15's line (both at least 0.9) and of how close each run came.

    python benchmarks/vae_frontier.py  # reads benchmarks/results/vae-experiments-cpu-2core.json, writes its .png

One point per run of the results file (prior samples at temperature 1): filled when the run took at most
10 minutes, hollow when longer; by training data (rdkit's 13k molecules or MOSES's); a triangle for molecules
written in Kekulé form, a square for the decoder alone (the CharRNN baseline). MOSES's CharRNN and VAE are their published means (`metrics.MOSES_PUBLISHED`),
trained on GPUs for many epochs of MOSES's 1.6M molecules.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "vae-experiments-cpu-2core.json"
LINE = 0.9  # issue 15: validity and novelty both at least this
MINUTES = 10  # issue 15: the default run's budget


@functools.cache
def _figures():
    """docs/figures.py, which knows `train vae`'s defaults at every date (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("figures", Path(__file__).parents[1] / "docs" / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    return figures


def data_and_kekule(run: dict) -> tuple[str, bool]:
    """(the run's training data, whether it wrote Kekulé forms): its options against today's defaults (MOSES's
    data in Kekulé form), with the defaults in force when it started for the options it did not give."""
    options = _figures().vae_run_options(run)
    return options.get("--data", "moses"), "--no-kekule" not in options


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the experiments' results file")
    parser.add_argument("--out", type=Path, help="the plot (default: the results file's name with .png)")
    args = parser.parse_args(argv)
    try:
        runs = json.loads(args.results.read_text(encoding="utf-8"))["runs"]
    except (OSError, ValueError, KeyError) as err:
        parser.error(f"--results {args.results}: expected a timed_run.py results file ({err})")
    from jax_scan_rnn.metrics import MOSES_PUBLISHED
    from jax_scan_rnn.optional import require

    try:
        require("matplotlib", "the plot").use("Agg")
    except ImportError as err:
        parser.error(str(err))
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    ax.fill_between([LINE, 1.0], LINE, 1.0, color="tab:green", alpha=0.12)
    colours = {"rdkit": "tab:blue", "moses": "tab:orange"}
    for run in runs:
        samples = run["report"]["samples"]
        data, kekule = data_and_kekule(run)
        colour = colours["moses" if data == "moses" else "rdkit"]
        quick = run["wall_s"] <= MINUTES * 60
        marker = "s" if "--decoder-only" in run["command"] else "^" if kekule else "o"
        ax.scatter(samples["novelty"], samples["validity"], s=36, marker=marker,
                   facecolors=colour if quick else "none", edgecolors=colour)
    legend = [Line2D([], [], ls="", marker="o", color=colours["rdkit"], label="rdkit's data (13k molecules)"),
              Line2D([], [], ls="", marker="o", color=colours["moses"], label="MOSES's data (270k)"),
              Line2D([], [], ls="", marker="^", color="grey", label="Kekulé form"),
              Line2D([], [], ls="", marker="s", color="grey", label="decoder alone (CharRNN)"),
              Line2D([], [], ls="", marker="o", mfc="none", color="grey", label=f"over {MINUTES} minutes")]
    for name in ("MOSES CharRNN", "MOSES VAE"):
        row = MOSES_PUBLISHED[name]
        ax.scatter(row["Novelty"], row["valid"], marker="*", s=140, color="black")
        ax.annotate(name + " (published)", (row["Novelty"], row["valid"]), textcoords="offset points", xytext=(6, -12),
                    fontsize=8)
    ax.set_xlabel("novelty (prior samples, T=1)")
    ax.set_ylabel("validity (prior samples, T=1)")
    ax.set_title(f"VAE runs on 2 CPU cores (filled: <= {MINUTES} min; triangle: Kekulé; square: decoder only)",
                 fontsize=9)
    ax.set_xlim(0.65, 1.0)
    ax.set_ylim(0.0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(handles=[ax.fill_between([], [], color="tab:green", alpha=0.12, label="issue 15's line")] + legend,
              loc="lower left", fontsize=8)
    out = args.out or args.results.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"{len(runs)} runs -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
