"""`jax-scan-rnn bench` and `python -m jax_scan_rnn.bench`: options, the config they ask for, and the
printed summary (the only part of the suite that prints).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import jax

from jax_scan_rnn.bench.config import BenchConfig
from jax_scan_rnn.bench.engine import run_suite
from jax_scan_rnn.bench.machine import host_kind
from jax_scan_rnn.bench.methods import METHODS, check_method_keys
from jax_scan_rnn.bench.report import (criteria, earlier_results, file_stem, format_ratio, format_us, headline,
                                       write_results)
from jax_scan_rnn.cli import POSITIVE_INT, positive_int_list
from jax_scan_rnn.lock import RunDirectoryLocked, RunDirectoryUnwritable, run_lock


# ----------------------------------------------------------------------------------------------------
# CLI hook: `jax-scan-rnn bench` = add_arguments(sub.add_parser("bench")) + run(args)
# ----------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `jax-scan-rnn bench`."""
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true",
                        help="short run (< 2 min on a 2-core CPU): T=1000, B in {1,64} (train: B=1), fewer samples")
    preset.add_argument("--peers", action="store_true",
                        help="Flax, Equinox and torchax against the jsr rows (~9-11 min on a 2-core CPU; needs "
                             "pip install -e '.[bench]'); the default run leaves them out")
    # Not benchmarks/results by default: a user's run must not overwrite the project's committed results
    # (the maintainers regenerate those with --out benchmarks/results --replace).
    parser.add_argument("--out", default="runs/bench", metavar="DIR",
                        help="where to write <host-kind>.json/.md and the PNG plots (default: runs/bench; the "
                             "committed results: --out benchmarks/results --replace)")
    parser.add_argument("--seq-lens", type=positive_int_list, metavar="T,T,...", help="sequence lengths of the grid")
    parser.add_argument("--batch-sizes", type=positive_int_list, metavar="B,B,...", help="batch sizes of the grid")
    parser.add_argument("--sweep-seq-lens", type=positive_int_list, metavar="T,T,...",
                        help="short sequence lengths for the compile-bound loops")
    parser.add_argument("--vae-batch-sizes", type=positive_int_list, metavar="B,B,...",
                        help="batch sizes of the VAE decoder rows (the VAE issue's point: 128)")
    parser.add_argument("--vae-seq-lens", type=positive_int_list, metavar="T,T,...", help="sequence lengths of the VAE rows")
    parser.add_argument("--methods", metavar="KEY,KEY,...",
                        help=f"only these rows (the seed loop and limits always run); keys: {', '.join(METHODS)}")
    parser.add_argument("--modes", default=None, metavar="MODE,...", help="forward,train (default: both)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="compute dtype (bfloat16 is meant for GPUs; default: float32)")
    parser.add_argument("--max-call-s", type=float, metavar="S", help="skip cases predicted to take longer per call")
    parser.add_argument("--budget-s", type=float, metavar="S", help="start no new case after S seconds")
    parser.add_argument("--repeats", type=int, metavar="N", help="timed samples per case (at most)")
    parser.add_argument("--torch-threads", type=POSITIVE_INT, metavar="N",
                        help="torch intra-op threads on CPU (default: the faster of 1 and torch's default)")
    parser.add_argument("--label", metavar="NAME", help="preset name used in the output file names")
    parser.add_argument("--replace", action="store_true",
                        help="write over an earlier run's results of the same name in --out (default: refuse)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig an argparse namespace (from `add_arguments`) asks for."""
    overrides: dict[str, Any] = {"dtype": args.dtype}
    for name in ("seq_lens", "batch_sizes", "sweep_seq_lens", "vae_batch_sizes", "vae_seq_lens", "max_call_s",
                 "budget_s", "repeats", "torch_threads", "label"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    preset = BenchConfig.quick if args.quick else BenchConfig.peers if args.peers else BenchConfig.default
    if getattr(args, "repeats", None) is not None:  # fewer repeats than the preset's minimum lower it too
        overrides["min_repeats"] = min(args.repeats, preset().min_repeats)
    if args.methods:
        overrides["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if args.modes:
        overrides["modes"] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    cfg = preset(**overrides)
    try:
        cfg.validate()
        check_method_keys(cfg)
    except ValueError as err:  # "seq_lens: ..." -> "--seq-lens: ...": the user typed the flag
        name, sep, rest = str(err).partition(":")
        flag = f"--{name.replace('_', '-')}"
        raise ValueError(f"{flag}{sep}{rest}" if sep and name.isidentifier() else str(err)) from None
    return cfg


def run(args: argparse.Namespace) -> int:
    """`jax-scan-rnn bench`: run the suite, print progress and the headline tables, write the results."""
    cfg = config_from_args(args)
    # Held for the whole suite, so that a folder that cannot be written, or a second bench writing to the same
    # one, is refused now rather than after the suite's minutes (one would lose its results to the other).
    try:
        with run_lock(args.out):
            return _run(args, cfg)
    except (RunDirectoryLocked, RunDirectoryUnwritable) as err:
        raise ValueError(f"--out: {err}") from None


def _run(args: argparse.Namespace, cfg: BenchConfig) -> int:
    earlier = earlier_results(args.out, file_stem(host_kind(), cfg.dtype, cfg.label))
    if earlier and not args.replace:  # said now, not after the suite's minutes
        raise ValueError(f"--out {args.out}: already holds {earlier[0].name} from an earlier run; pass --replace to "
                         "write over it, or another --out or --label")

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    print(f"jax-scan-rnn bench: preset {cfg.label}, {cfg.dtype}, host {host_kind()}; progress on stderr",
          flush=True)
    if jax.config.jax_compilation_cache_dir:
        progress(f"note: JAX_COMPILATION_CACHE_DIR is set ({jax.config.jax_compilation_cache_dir}): compile times may "
                 "be loads from that cache, not compiles; unset it to time compiles")
    results = run_suite(cfg, progress=progress)
    paths = write_results(results, args.out, plots=not args.no_plots, replace=args.replace)
    print()
    for mode in cfg.modes:
        for batch in sorted(cfg.batch_sizes):
            for steps in sorted(cfg.seq_lens):
                h = headline(results, batch, steps, mode)
                if h["scan_us"] is None:
                    continue
                print(f"{mode:<7} B={batch:<5} T={steps:<6} seed loop {format_us(h['seed_us']):>10}/step   "
                      f"lax.scan {format_us(h['scan_us']):>10}/step "
                      f"({format_ratio(h['scan_speedup_vs_seed'])} vs seed)   "
                      f"limit {format_us(h['limit_us']):>10}/step (scan = {format_ratio(h['scan_x_limit'])} limit)")
    print()
    for c in criteria(results):
        met = "—" if c["met"] is None else ("met" if c["met"] else "NOT met")
        print(f"{met:>8}  {c['criterion']}")
    # wall_s times the cases (built, warmed up, sampled), not the imports and plots around them
    print(f"\nmeasured in {results['wall_s']:.0f} s; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m jax_scan_rnn.bench [options]`: the same as `jax-scan-rnn bench` (for scripts like gpu.sh)."""
    from jax_scan_rnn import bench  # its docstring (what the suite measures) describes the command

    parser = argparse.ArgumentParser(prog="python -m jax_scan_rnn.bench", description=bench.__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, TypeError) as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
