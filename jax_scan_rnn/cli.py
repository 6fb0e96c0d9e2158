"""The `jax-scan-rnn` command line.

    jax-scan-rnn --version
    jax-scan-rnn info                 # devices and library versions
    jax-scan-rnn check                # parity self-check against torch.nn on random weights
    jax-scan-rnn train traveller      # train the position-feedback LSTM on the simulated market
    jax-scan-rnn train traveller --data prices.csv --feature-cols 'lag_*' --return-cols 'next_*'
    jax-scan-rnn evaluate traveller --checkpoint runs/traveller
    jax-scan-rnn run traveller --checkpoint runs/traveller --data new.csv --output positions.csv
    jax-scan-rnn export traveller --checkpoint runs/traveller --format torch --output traveller.pt
    jax-scan-rnn train vae            # the SMILES sequence VAE (teacher forcing; --decoding scheduled)
    jax-scan-rnn train vae --preset moses   # MOSES's VAE and data (one GPU); explicit flags override it
    jax-scan-rnn sample vae --checkpoint runs/vae -n 1000
    jax-scan-rnn encode vae --checkpoint runs/vae --input mols.smi --output latents.npz
    jax-scan-rnn evaluate vae --checkpoint runs/vae
    jax-scan-rnn export vae --checkpoint runs/vae --format torch --output vae.pt
    jax-scan-rnn bench [--quick]      # scan vs loop timings, tables and plots

Errors in arguments or data (ValueError, TypeError, KeyError, FileNotFoundError), and a `JAX_PLATFORMS` that
JAX cannot start, are printed as one line on stderr and exit with code 2, like argparse's own usage errors.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import math
import os
import platform
import re
import sys
import warnings
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from jax_scan_rnn import options, validate
from jax_scan_rnn.optional import available
from jax_scan_rnn.runlog import strict_json, write_atomically

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(name: str):
    def register(fn):
        COMMANDS[name] = fn
        return fn

    return register


@command("info")
def cmd_info(args: argparse.Namespace) -> int:
    import flax
    import jax
    import optax

    import jax_scan_rnn

    rows = [
        ("jax-scan-rnn", jax_scan_rnn.__version__),
        ("python", platform.python_version()),
        ("jax", jax.__version__),
        ("flax", flax.__version__),
        ("optax", optax.__version__),
        ("backend", jax.default_backend()),
        ("devices", ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in jax.devices())),
        ("xla small-loop setting", f"{jax_scan_rnn.xla_flags.status()} (jax_scan_rnn/xla_flags.py)"),
        ("library compile options", f"{jax_scan_rnn.xla_flags.compiler_options()} (jax_scan_rnn/xla_flags.py)"),
        ("compilation cache", compilation_cache_status()),
        ("data cache", data_cache_status()),
    ]
    try:
        import torch

        rows.append(("torch", f"{torch.__version__} (cuda: {torch.cuda.is_available()})"))
    except ImportError:
        rows.append(("torch", "not installed"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def compilation_cache_status() -> str:
    """Where this command's compiled programs are kept across runs, and who chose it."""
    import jax

    from jax_scan_rnn import xla_flags

    folder = jax.config.jax_compilation_cache_dir
    if folder is None:
        turned_off = xla_flags.cli_compilation_cache() is None
        return f"off ({xla_flags.CACHE_ENV}=0)" if turned_off else "off (see the note above)"
    if folder == xla_flags.cli_cache_in_use():
        return f"{folder} (the CLI's; {xla_flags.CACHE_ENV}=0 turns it off)"
    return f"{folder} (JAX_COMPILATION_CACHE_DIR)"


def data_cache(command: str) -> str | None:
    """The folder the VAE commands keep their molecules' Kekulé forms in, or None: turned off, or a folder that
    cannot be written (one note says so: the command runs, converting as usual)."""
    from jax_scan_rnn import xla_flags

    folder = xla_flags.cli_data_cache()
    try:
        return None if folder is None else xla_flags.writable_folder(folder)
    except OSError as err:
        print(f"jax-scan-rnn {command}: note: data cache off: {err}; {xla_flags.DATA_CACHE_ENV}=DIR moves it, =0 "
              "turns it off", file=sys.stderr)
        return None


def data_cache_status() -> str:
    """Where the VAE commands keep the molecules they rewrite in Kekulé form across runs."""
    from jax_scan_rnn import xla_flags

    folder = xla_flags.cli_data_cache()
    if folder is None:
        return f"off ({xla_flags.DATA_CACHE_ENV}=0)"
    return f"{folder} (Kekulé forms of the VAE data; {xla_flags.DATA_CACHE_ENV}=DIR moves it, =0 turns it off)"


CHECK_ATOL = 1e-5  # float32 on both sides: the same sums in another order (the parity tests' float32 tolerance)


def max_diff(torch_value, jax_value) -> float:
    """max |a - b| over a tensor and an array, or over the leaves of two tuples (a model state) of them; inf where
    two shapes differ (no broadcasting)."""
    import numpy as np

    if isinstance(torch_value, tuple):
        return max(max_diff(t, j) for t, j in zip(torch_value, jax_value, strict=True))
    a, b = torch_value.detach().numpy(), np.asarray(jax_value)
    return float(np.abs(a - b).max()) if a.shape == b.shape else math.inf


@command("check")
def cmd_check(args: argparse.Namespace) -> int:
    """Random weights in torch_ref's models (torch.nn.LSTM/GRU/RNN, the Traveller, the SeqVAE) -> convert -> the same
    outputs and states in JAX, and the weights back bit for bit."""
    import jax
    import numpy as np
    from flax import nnx

    import jax_scan_rnn as jsr
    from jax_scan_rnn.optional import require

    torch = require("torch", "the parity check (it compares against torch.nn)")
    import torch_ref

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    rngs = nnx.Rngs(args.seed)
    x = rng.standard_normal((4, args.steps, 8)).astype(np.float32)  # [B, T, I]
    vocab, length = 20, min(args.steps, 100)  # the SeqVAE: molecule-sized sequences of V = 20 token ids
    tokens = rng.integers(3, vocab, (4, length)).astype(np.int64)
    lengths = rng.integers(1, length + 1, 4)
    tokens[np.arange(4), lengths - 1] = 2  # <eos>
    tokens[np.arange(length) >= lengths[:, None]] = 0  # <pad>

    def rnn(name: str, layers: int):  # torch's defaults, as a user writes them: time-major x [T, B, I]
        return (getattr(torch_ref, name)(8, 32, layers), getattr(jsr, name)(8, 32, layers, rngs=rngs),
                lambda m: m(torch.from_numpy(x.swapaxes(0, 1))), lambda m: jsr.jit(m)(x.swapaxes(0, 1)))

    def vae(model, tokens, lengths):  # the teacher-forced logits [B, T, V] from mu, and (mu, logvar)
        mu, logvar = model.encode(tokens, lengths)
        return model.decode(mu, tokens), (mu, logvar)

    cases = [(f"{name} {layers}", rnn(name, layers)) for name in ("LSTM", "GRU", "RNN") for layers in (1, 2)] + [
        ("Traveller 2", (torch_ref.Traveller(8, 32, 2, 0.0),
                         jsr.Traveller(num_inputs=8, hidden_size=32, num_layers=2, dropout=0.0, rngs=rngs),
                         lambda m: m(torch.from_numpy(x)), lambda m: jsr.jit(m)(x))),
        ("SeqVAE 2", (torch_ref.SeqVAE(vocab, 32, 8, 2), jsr.SeqVAE(vocab, 32, 8, 2, rngs=rngs),
                      lambda m: vae(m, torch.from_numpy(tokens), torch.from_numpy(lengths)),
                      lambda m: vae(jsr.jit(m), tokens, lengths))),
    ]
    ok = True
    print(f"{'model':<12} {'T':>5} {'max |out diff|':>15} {'max |state diff|':>17} {'round trip':>10}")
    for name, (ref, ours, run_torch, run_jax) in cases:
        jsr.load_torch_state_dict(ours, ref.state_dict())
        with torch.no_grad():
            t_out, t_state = run_torch(ref)
        # float32 matmuls as torch computes them: JAX's default on a GPU is TF32, which failed 46 parity tests on an
        # H200 before they pinned it too (benchmarks/results/gpu-h200-run1.log)
        with jax.default_matmul_precision("highest"):
            j_out, j_state = run_jax(ours)
        out_err, state_err = max_diff(t_out, j_out), max_diff(t_state, j_state)
        back = jsr.torch_state_dict(ours)
        exact = all(np.array_equal(back[k], v.numpy()) for k, v in ref.state_dict().items())
        ok &= out_err <= CHECK_ATOL and state_err <= CHECK_ATOL and exact
        steps = length if name.startswith("SeqVAE") else args.steps
        print(f"{name:<12} {steps:>5} {out_err:>15.2e} {state_err:>17.2e} {str(exact):>10}")
    print("parity self-check:", "PASSED" if ok else f"FAILED (float32 tolerance {CHECK_ATOL:g})",
          f"(JAX on {jax.default_backend()}, float32 matmuls at full precision)")
    return 0 if ok else 1


@contextlib.contextmanager
def sigterm_stops():
    """Training's `stop`: a SIGTERM (what a cluster's scheduler sends a job before it preempts it, and `kill`'s
    default) makes `fit` checkpoint the update it has reached and stop (`TrainingStopped`), instead of dying with
    every update since the last checkpoint lost. A second SIGTERM kills at once, as without this."""
    import signal
    import threading

    asked = threading.Event()

    def handler(signum, frame):
        asked.set()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (the CLI called from a thread): signals stay as they are
        yield asked.is_set
        return
    try:
        yield asked.is_set
    finally:
        # None: a handler installed outside Python (an embedding program), which Python cannot put back.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


class ProgressBar:
    """`fit` callback: a tqdm bar over optimiser steps, with the latest loss and evaluation. As a context manager
    it closes the bar on the way out, so that an interrupted run's one line is the last thing on the terminal."""

    def __init__(self):
        from tqdm import tqdm

        self.tqdm = tqdm
        self.bar = None
        self.postfix: dict[str, str] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def note(self, line: str) -> None:
        """`line` on stderr; through tqdm while the bar is up, so that it is not written into the bar's line."""
        if self.bar is not None and not self.bar.disable:
            self.tqdm.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def __call__(self, event: dict) -> None:
        kind = event["event"]
        if kind == "start":
            self.bar = self.tqdm(total=event["steps"], initial=event["step"], unit="step", dynamic_ncols=True,
                                 disable=not first_process())
            if event["resumed_from"] is not None:
                self.bar.write(f"resumed from step {event['resumed_from']}")
        elif kind == "log":
            self.bar.update(event["step"] - self.bar.n)
            self.postfix["loss"] = f"{event['loss']:.4g}"
            self.bar.set_postfix(self.postfix, refresh=True)
        elif kind == "eval":
            for key, value in event.get("metrics", {}).items():
                self.postfix[f"eval {key}"] = f"{value:.4g}"
            self.bar.set_postfix(self.postfix, refresh=True)
        elif kind == "checkpoint_skipped":
            self.note(f"skipped invalid checkpoint {event['step']}: {event['reason']}; kept as {event['moved_to']}")
        elif kind == "plot_skipped":
            self.note(f"{event['path']} not drawn: {event['reason']}")
        elif kind == "metrics_changed":  # a newer version of a task logs other metrics
            self.note(f"the run in {event['path']} logged the metrics {event['saved']}, this version {event['now']}: "
                      "the first train row after the resume covers the updates after it only")
        elif kind == "environment_changed":  # another jax, backend, device count or JAX_ENABLE_X64
            from jax_scan_rnn.train import environment_note

            self.note(environment_note(event))
        elif kind == "checkpoint_stray_files":
            self.note(f"checkpoint {event['step']} holds files it did not write (left alone, not read): "
                      f"{', '.join(event['files'])} in {event['path']}")
        elif kind == "end" and self.bar is not None:
            self.bar.close()


def train_config(args: argparse.Namespace):
    """The training options as a TrainConfig, checked (with --resume/--override) before any work."""
    from jax_scan_rnn.configs.train import TrainConfig, default_warmup

    if args.override and not args.resume:
        raise ValueError("--override: expected only with --resume (it accepts changed options of a resumed run)")
    warmup = default_warmup(args.steps) if args.warmup_steps is None else args.warmup_steps
    with flag_names():  # "TrainConfig.warmup_steps: expected at most steps=10" -> the flags' names
        return options.from_args(TrainConfig, args, warmup_steps=warmup)


@contextlib.contextmanager
def output_directory(out: Path, resume: bool):
    """Hold `--out` for this run (training, evaluation, plots): one writer per run directory (`lock.py`), and
    a finished or running run there is never overwritten without --resume."""
    from jax_scan_rnn.lock import run_lock

    refuse_run_file(str(out), "--out")  # a run inside another run's checkpoints/ would mix with its steps
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: expected a directory, got the file {out}")
    if not first_process():  # several processes: the first one holds the directory (and writes)
        yield
        return
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(run_lock(out))
        except ValueError as err:  # RunDirectoryLocked / RunDirectoryUnwritable: name the flag
            raise ValueError(f"--out: {err}") from None
        refuse_a_finished_run(out, resume)
        yield


def refuse_a_finished_run(out: Path, resume: bool) -> None:
    """ValueError naming --out when it holds an earlier run (`train.earlier_run`: checkpoints, or the log of a run
    that left none) and --resume is not given. `output_directory` checks it under the directory's lock;
    a command whose data takes long to load checks it before, too."""
    from jax_scan_rnn.train import earlier_run

    found = earlier_run(out)
    if found and not resume:
        raise ValueError(f"--out: {out} already holds a run ({found}); pass --resume to continue it, or choose "
                         "another --out")


NOT_DRAWN = "not drawn (pip install 'jax-scan-rnn[plot]')"


def drawn(path: Path) -> str:
    """`path` if the plot is there, else why not (training draws its curves only with matplotlib installed)."""
    return str(path) if path.exists() else NOT_DRAWN


EVALUATION_FILE = "evaluation.json"  # a training run's final report, under --out
POSITIONS_FILE = "positions.png"  # the Traveller's positions plot, under --out


def run_files(out: Path) -> str:
    """The line that names what training wrote under `out`: its log and its curves (or why they are not drawn)."""
    from jax_scan_rnn.runlog import CURVES_FILE, METRICS_FILE

    return f"metrics: {out / METRICS_FILE}  curves: {drawn(out / CURVES_FILE)}"


def refuse_run_file(path: str | None, flag: str) -> None:
    """An output must not be a file that a training run keeps in its directory (its log, report, plots, lock
    or anything under checkpoints/): another command's output would replace the run's own. A run directory
    is one whose checkpoints/ holds a committed step, or that has a metrics.jsonl beside it (a folder of
    the user's that happens to be called checkpoints is not one)."""
    from jax_scan_rnn.lock import LOCK_FILE
    from jax_scan_rnn.runlog import CHECKPOINT_DIR, CURVES_FILE, METRICS_FILE

    if path is None:
        return
    for target in {Path(path).absolute(), Path(path).resolve()}:  # a link is written through (write_atomically)
        for run in target.parents:
            if not (run / CHECKPOINT_DIR).is_dir():
                continue
            from jax_scan_rnn.checkpoint import steps  # (with JAX) only where a checkpoints/ folder is

            if (run / METRICS_FILE).is_file() or steps(run / CHECKPOINT_DIR):
                break
        else:
            continue
        inside = target.relative_to(run).parts
        if inside[0] == CHECKPOINT_DIR or (len(inside) == 1 and inside[0] in (
                METRICS_FILE, CURVES_FILE, EVALUATION_FILE, POSITIONS_FILE, LOCK_FILE)):
            raise ValueError(f"{flag}: {path} belongs to the training run in {run} (its own "
                             f"{'checkpoints' if inside[0] == CHECKPOINT_DIR else inside[0]}); choose another path")


def check_output_file(path: str | None, flag: str = "--output") -> None:
    """An output file must be one we can write and not one of a training run's own (checked before any work,
    so nothing is computed in vain)."""
    if path is None:
        return
    refuse_run_file(path, flag)
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{flag}: expected a file path, got the directory {target}")
    if not target.parent.is_dir():
        raise ValueError(f"{flag}: the directory {target.parent} does not exist")
    # A regular file is replaced through a temporary file beside it (its folder must be writable); a device or a
    # link (/dev/stdout) is written through (`runlog.write_atomically`).
    in_place = target.is_symlink() or (target.exists() and not target.is_file())
    if (not in_place and not os.access(target.parent, os.W_OK)) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"{flag}: cannot write {target} (permission denied)")


def refuse_an_input(path: str | None, flag: str, inputs: dict[str, str | None]) -> None:
    """ValueError naming `flag` when the output `path` is one of the files the command reads (`inputs`: flag or
    description -> path): writing it would replace the data, or the state, it was computed from."""
    if path is None:
        return
    for what, source in inputs.items():
        if source is not None and Path(source).resolve() == Path(path).resolve():
            raise ValueError(f"{flag}: expected another file than {what}, got {path} for both")


def check_simulated_markets(task) -> None:
    """The Traveller's simulated markets, training and held-out, must fit in memory (refused before either is
    built)."""
    check_memory("the simulated training market (--train-paths x --seq-len, --num-assets)",
                 task.market_bytes(task.train_paths, task.seq_len))
    check_memory("the simulated held-out market (--eval-paths x --eval-steps, --num-assets)",
                 task.market_bytes(task.eval_paths, task.eval_steps))


def check_memory(what: str, needed: int) -> None:
    """Refuse a size whose data alone cannot fit in this machine's memory, before allocating any of it."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: nothing to compare with
        return
    if needed > total:
        raise ValueError(f"{what}: needs about {needed / 2**30:.0f} GiB, more than this machine's {total / 2**30:.1f} GiB "
                         "of memory; choose smaller sizes")


def flag_for(field: str) -> str:
    """The CLI flag that sets a task or TrainConfig field: `seq_len` -> `--seq-len`, `learning_rate` -> `--lr`."""
    from jax_scan_rnn.configs.train import TrainConfig

    return options.flag(TrainConfig, field)


def flagged(message: str, only: Collection[str] | None = None) -> str:
    """A task's `field: ...` (or `TrainConfig.field: ...`) message as the CLI's user reads it, `--field: ...`:
    they know the flag, not the field. With `only`: when every field named first is one of `only`."""
    head, sep, rest = message.partition(":")
    # "a, b: ..." names two; "TrainConfig.steps" (its checks) and fit's "cfg.steps" are the same field
    fields = [name.strip().removeprefix("TrainConfig.").removeprefix("cfg.") for name in head.split(",")]
    # A field is snake_case; XLA's and tensorstore's "RESOURCE_EXHAUSTED: ..." are not one.
    if not (sep and all(re.fullmatch(r"[a-z][a-z0-9_]*", field) for field in fields)):
        return message
    if only is not None and not set(fields) <= set(only):
        return message
    # "at most steps=10" and "with hidden_size=32, latent_size=8" too, not a constructor's
    # "LSTM(6, 8, num_layers=2)" in a hint: only outside parentheses
    pieces, depth = re.split(r"([()])", rest), 0
    for i, piece in enumerate(pieces):
        depth = depth + 1 if piece == "(" else max(depth - 1, 0) if piece == ")" else depth
        if depth == 0 and piece not in "()":
            pieces[i] = re.sub(r"\b([a-z_]+)=", lambda m: f"{flag_for(m.group(1))} ", piece)
    return f"{', '.join(map(flag_for, fields))}:{''.join(pieces)}"


@contextlib.contextmanager
def flag_names():
    """Raise a task's `field: ...` ValueError (or FileNotFoundError) as `--field: ...` (`flagged`)."""
    try:
        yield
    except (ValueError, FileNotFoundError) as err:
        message = flagged(str(err))
        try:
            renamed = type(err)(message)
        except TypeError:  # an error whose constructor takes more (UnicodeDecodeError): its message, as a ValueError
            renamed = ValueError(message)
        raise renamed from None


@contextlib.contextmanager
def field_as_flag(field: str, flag: str):
    """Raise a library ValueError about `field` (`field: ...`) as one about `flag`, the command's option that gave it
    under another name (`flag_names` maps a field to the flag of the same name)."""
    try:
        yield
    except ValueError as err:
        if not str(err).startswith(f"{field}:"):
            raise
        raise ValueError(f"{flag}:{str(err).removeprefix(f'{field}:')}") from None


def _flat(settings: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def saved_metadata(out: Path, model: str) -> dict | None:
    """The metadata of the run in `out`'s newest checkpoint that verifies (the one `fit` resumes from), or None.
    ValueError naming --out when that run trained another model than `model` ("traveller", "vae")."""
    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.runlog import CHECKPOINT_DIR

    try:
        step, _ = checkpoint.newest_valid_step(out / CHECKPOINT_DIR)
    except checkpoint.CheckpointFormatError:  # now, before the banner: fit would refuse the run the same way
        raise
    except checkpoint.CheckpointError:
        return None
    saved = checkpoint.read_metadata(out / CHECKPOINT_DIR, step)
    if saved.get("model", model) != model:
        raise ValueError(f"--out: {out} holds a run of the {saved['model']} model, not of the {model}; resume it "
                         f"with train {saved['model']}, or choose another --out")
    return saved


def adopt_saved_settings(args: argparse.Namespace, task_cls: type, preset=None) -> dict | None:
    """--resume: each task or training option not given on the command line (nor by the given --preset) takes the
    resumed run's own value, so that `train MODEL --out DIR --resume` continues the run as it was started; an option
    given is compared with the run's by `check_resume` (a --warmup-steps not given follows a given --steps, as in a
    fresh run). The options taken that differ from this command's defaults are said in one line, and an --init-from,
    which the checkpoint replaces, in a note. Nothing happens without --resume or a valid checkpoint in --out.
    Returns the run's metadata (`saved_metadata`, for `check_resume`), or None."""
    from jax_scan_rnn.configs.train import TrainConfig, default_warmup

    if not args.resume:
        return None
    saved = saved_metadata(Path(args.out), args.model)
    if saved is None:
        return None
    if args.init_from is not None:  # the same command starts a requeued job from the file, then resumes it: a note
        print(f"jax-scan-rnn train {args.model}: note: --init-from {args.init_from} is not read: --resume continues "
              f"from the run's checkpoint in {args.out}", file=sys.stderr)
        args.init_from = None
    if "task" not in saved:
        return saved
    given = set(args.given) | (set(preset.task) | set(preset.train) if preset else set())
    values = {**dataclasses.asdict(task_cls.from_json(saved["task"])), **saved.get("train_config", {})}
    fields = [f.name for cls in (task_cls, TrainConfig) for f in dataclasses.fields(cls) if f.metadata.get("cli")]
    taken = []
    if "steps" in given:  # --warmup-steps not given follows a given --steps, as in a fresh run (default_warmup)
        given.add("warmup_steps")
    for name in fields:
        if name in values and name not in given and hasattr(args, name) and getattr(args, name) != values[name]:
            value = values[name]
            derived = name == "warmup_steps" and args.warmup_steps is None and default_warmup(args.steps) == value
            setattr(args, name, value)
            if not derived:  # (the value this command would have derived anyway goes unsaid)
                taken.append(f"{flag_for(name)} {value:g}" if isinstance(value, float) else f"{flag_for(name)} {value}")
    if taken:
        print(f"--resume: the run's own settings where not given: {', '.join(taken)}")
    return saved


def data_change(saved: dict, now: dict) -> str | None:
    """What differs between the `DataStats` a Traveller run saved (JSON) and those of the data read now, or None."""
    def without_digest(stats: dict) -> dict:
        return {k: v for k, v in stats.items() if k != "data_sha256"}

    if "data_sha256" not in saved:  # a run that predates the digest: its statistics alone
        now = without_digest(now)
    if saved == now:
        return None
    for key, what in (("num_steps", "steps per path"), ("train_end", "training steps"), ("asset_names", "assets")):
        if saved.get(key) != now.get(key):
            return f"{what} {saved.get(key)!r} -> {now.get(key)!r}"
    if without_digest(saved) == without_digest(now):
        return "its values (sha256), though not the training period's mean, std or covariance"
    return "its training period's mean, std or covariance"


# Why a VAE run's data may not read back as the molecules it trained on while its file is unchanged: since
# 2026-12-06 the SMILES reader keeps each molecule once however it is written, applies --max-length to the Kekulé
# form learnt and counts --limit in distinct molecules, so a run saved before reads its --data (rdkit's own file
# included) into other molecules and another split. A run saved before 2026-12-04 recorded no digest to compare.
VAE_DATA_DIFFERS = "the file changed since, or the run predates this version's SMILES reader (2026-12-06)"
VAE_DATA_UNRECORDED = ("the run predates the record of the molecules it trained on (2026-12-04), and SMILES files "
                       "have been read into other molecules since (2026-12-06): its split could not be checked")


def check_resume(out: Path, args: argparse.Namespace, task, cfg, data: dict | None = None,
                 saved: dict | None = None) -> None:
    """--resume: the settings saved with the run against this command's. A difference is refused, naming each
    changed option, unless --override is given; then the changes are printed and training continues. The saved
    task is read back by `type(task).from_json`, so a field the run predates counts with the value it ran with.
    `data`: what the run saved of its data, as read now (a Traveller's `{"data_stats": DataStats.to_json()}`, the
    VAE's `{"data_sha256": Dataset.digest}`): a data file that changed since the run started (rows appended,
    values revised) counts as a changed setting too, since training would go on with other data. `saved`: the run's
    metadata where the caller has read it already (`saved_metadata` verifies the whole checkpoint)."""
    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.runlog import CHECKPOINT_DIR

    if not args.resume:
        return
    saved = saved_metadata(out, args.model) if saved is None else saved
    if saved is None:  # none that verifies: fit says so (CheckpointError); none at all: a fresh start, said
        if not checkpoint.steps(out / CHECKPOINT_DIR):  # (the same command can then start and restart a job)
            from jax_scan_rnn.train import earlier_run

            log = earlier_run(out)
            print(f"--resume: {out} holds no checkpoint yet: training from step 0"
                  + (f" (replacing {log})" if log else ""))
        return
    saved_task = type(task).from_json(saved["task"]).to_json() if "task" in saved else {}

    def flags(settings: dict) -> dict:
        # JSON round trip: the saved settings are JSON (tuples became lists), the new ones must compare alike.
        return {flag_for(k): v for k, v in _flat(json.loads(json.dumps(settings))).items()}

    before = flags({**saved_task, **saved.get("train_config", {})})
    now = flags({**task.to_json(), **dataclasses.asdict(cfg)})
    changed = [f"{name} {before[name]!r} -> {now[name]!r}" for name in now if name in before and before[name] != now[name]]
    for key, value in (data or {}).items():
        if key in saved:  # a run that predates the record: nothing to compare
            value = json.loads(json.dumps(value))  # JSON, as saved: lists and floats alike
            if key == "data_stats":
                what = data_change(saved[key], value)
            else:
                what = None if saved[key] == value else (f"its molecules: {VAE_DATA_DIFFERS}" if task.smiles_check
                                                         else "its sequences: the file changed since")
            if what is not None:
                changed.append(f"the data in --data {task.data} ({what})")
        elif key == "data_sha256" and task.smiles_check:  # (other text is read as it was)
            warnings.warn(f"--resume: {VAE_DATA_UNRECORDED}; training goes on with the molecules of --data "
                          f"{task.data} as this version reads them, and the final report's test molecules may include "
                          "ones the run trained on")
    if not changed:
        return
    if not args.override:
        raise ValueError(f"--resume: the run in {out} was started with other settings ({'; '.join(changed)}); "
                         "give the same options, or add --override to continue with the new ones")
    print(f"resuming with changed settings (--override): {'; '.join(changed)}")


def run_directory(text: str, step: int | None = None) -> Path:
    """`--checkpoint`: a training run's output directory (train's --out), with a hint for the usual slip of
    naming one of its step folders instead; and `--step`, if given, one of its checkpoints. A path that is not a
    directory is refused before JAX is imported (by the checkpoint module): a typo costs no start-up."""
    from jax_scan_rnn.runlog import CHECKPOINT_DIR

    path = Path(text)
    if not path.is_dir():
        raise FileNotFoundError(f"--checkpoint: expected a training output directory (train's --out), got {path}")
    if not (path / CHECKPOINT_DIR).is_dir():
        hint = ""
        if CHECKPOINT_DIR in (path.name, path.parent.name):  # a run's own folders: which one to pass instead
            from jax_scan_rnn.checkpoint import step_of, steps

            if step_of(path) is not None and path.parent.name == CHECKPOINT_DIR:
                raise FileNotFoundError(f"--checkpoint: expected the run directory (train's --out), got its "
                                        f"checkpoint folder {path}; pass --checkpoint {path.parent.parent} --step "
                                        f"{step_of(path)}")
            if path.name == CHECKPOINT_DIR and steps(path):  # the run's checkpoints/ folder itself
                hint = f"; pass --checkpoint {path.parent}"
        raise FileNotFoundError(f"--checkpoint: expected a training output directory (train's --out), got {path}, "
                                f"which holds no {CHECKPOINT_DIR}/ folder{hint}")
    from jax_scan_rnn.checkpoint import steps

    saved = steps(path / CHECKPOINT_DIR)
    if not saved:
        raise FileNotFoundError(f"--checkpoint {path}: holds no committed checkpoint (training stopped before its "
                                "first save?)")
    if step is not None and step not in saved:
        raise ValueError(f"--step: expected one of the checkpoint steps of {path}, {saved}, got {step}")
    return path


def first_process() -> bool:
    import jax

    return jax.process_index() == 0


def data_parallel(args: argparse.Namespace, batch_size: int):
    from jax_scan_rnn.distributed import DataParallel, initialize_multihost

    if args.multihost:
        initialize_multihost()
        if not first_process():  # the first process speaks (and writes) for the run; errors still reach stderr
            sys.stdout = open(os.devnull, "w", encoding="utf-8")
    import jax

    if args.devices is not None and args.devices > jax.device_count():
        cpu = jax.default_backend() == "cpu"  # one CPU device unless XLA is told to split the host
        raise ValueError(f"--devices: expected at most the {jax.device_count()} device(s) JAX sees (jax-scan-rnn info "
                         f"lists them), got {args.devices}" + (
                             f"; on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count={args.devices} gives "
                             "that many" if cpu else ""))
    with field_as_flag("num_devices", "--devices"):
        dp = DataParallel.create(args.devices)
    with flag_names():  # "batch_size: expected a multiple of the 2 devices ..." -> --batch-size
        try:
            dp.check_batch_size(batch_size)
        except ValueError as err:
            if args.devices is not None:
                raise
            # The user typed neither number (the README's own command on a 3- or 6-GPU machine): say where the
            # device count came from, and which --devices would split the batch.
            # (a share of the mesh would leave some processes of a multi-process run without a device: no hint there)
            fits = max(n for n in range(1, dp.size + 1) if batch_size % n == 0)
            hint = f"; --devices {fits} splits it evenly" if jax.process_count() == 1 else ""
            raise ValueError(f"{err} (every device JAX sees, --devices not being given{hint})") from None
    return dp


UnreadRule = tuple[tuple[str, ...], bool, str, str]  # (fields, unread in this run, when they are read, why)


def train_rules(args: argparse.Namespace) -> list[UnreadRule]:
    """The unread-flag rules of `train_config`'s flags, which every model's train command has."""
    return [(("final_lr_fraction",), args.lr_schedule == "constant", "with --lr-schedule cosine or linear",
             "constant has no decay")]


def unread_flags(args: argparse.Namespace, rules: list[UnreadRule]) -> list[tuple]:
    """`(flag, value, when, why)` for each flag typed on the command line that the run will not read: rules are
    `(fields, unread, when, why)`, `unread` saying whether `fields` go unread in this run. Only flags the user
    typed count: a default, a preset's included, never does."""
    found = []
    for fields, unread, when, why in rules:
        for name in fields if unread else ():
            if name in args.given:
                value = getattr(args, name)
                found.append((flag_for(name), f"{value:g}" if isinstance(value, float) else value, when, why))
    return found


def refuse_unread(args: argparse.Namespace, rules: list[UnreadRule]) -> None:
    """A flag the run would not read is an error ("--flag: expected only WHEN (WHY), got VALUE"), not silently
    without effect (`unread_flags`' rules)."""
    found = unread_flags(args, rules)
    if found:
        flag, value, when, why = found[0]
        raise ValueError(f"{flag}: expected only {when} ({why}), got {value}")


@command("train traveller")
def cmd_train_traveller(args: argparse.Namespace) -> int:
    from jax_scan_rnn.configs import traveller as config  # JAX-free: every option is checked before JAX is imported

    saved = adopt_saved_settings(args, config.TravellerTask)
    if args.data is not None:  # saved with the run: evaluate and run find it from any working directory
        args.data = os.path.abspath(args.data)
    refuse_unread(args, [
        (config.DATA_SETTINGS, args.data is None, "together with --data FILE", "the simulated market does not read it"),
        (config.SIMULATED_ONLY, args.data is not None, "on the simulated market",
         f"--data {args.data} does not read it"),
        *train_rules(args),
    ])
    with flag_names():
        task = options.from_args(config.TravellerTask, args)
    cfg = train_config(args)
    if args.init_from is not None and not Path(args.init_from).is_file():
        raise FileNotFoundError(f"--init-from: no file at {args.init_from}")
    from jax_scan_rnn.tasks import traveller as task_lib

    data = stats = None  # the simulated market's
    if task.data is not None:  # read and checked before any work: a bad file or column is one line, naming its flag
        with flag_names():
            data = task_lib.read_data(task)
            stats = task_lib.fit_stats(task, data)
        print(f"data {task.data}: {data.num_paths} path(s) x {data.num_steps} steps, {data.num_features} features, "
              f"assets {', '.join(data.asset_names)}; train steps 0-{stats.train_end - 1}, "
              + (f"validation {stats.train_end}-{stats.valid_end - 1}" if stats.valid_end > stats.train_end else
                 "no validation period (the bar's eval figures score the training period)")
              + f", test {stats.valid_end}-{data.num_steps - 1}")
    check_simulated_markets(task)
    if args.init_from is not None:  # a file of other sizes is one line before --out is made (train reads it again,
        with flag_names(), warnings.catch_warnings():  # and warns then)
            warnings.simplefilter("ignore")
            task_lib.load_init(task_lib.build_model(task, cfg.seed, stats), args.init_from, stats)
    out = Path(args.out)
    dp = data_parallel(args, task.batch_size)
    with output_directory(out, args.resume):
        now = None if stats is None else stats.to_json()
        digest = saved and saved.get("data_stats", {}).get("data_sha256")
        if now and digest and task_lib.data_digest_matches(data, digest):  # the same data, an older run's digest
            now["data_sha256"] = digest
        check_resume(out, args, task, cfg, now and {"data_stats": now}, saved)
        market = "your data" if data is not None else f"the simulated market, {task.market.num_assets} assets"
        print(f"training the Traveller ({task.objective} objective, {market}) for {args.steps} steps on {dp.size} "
              f"device(s) -> {out}")
        # --init-from's errors name the flag; fit's out_dir is --out
        with flag_names(), field_as_flag("out_dir", "--out"), ProgressBar() as progress, sigterm_stops() as stop:
            model, history, stats = task_lib.train(
                task, cfg, out, resume=args.resume, callback=progress, init_from=args.init_from, data=data,
                data_sharding=dp.data, state_sharding=dp.replicated, stop=stop,
            )
        # every process computes: the model's arrays span them all
        table = task_lib.evaluate(model, task) if data is None else task_lib.data_table(
            model, data, stats, "test", task.periods_per_year)
        plot = NOT_DRAWN  # after training: report the missing extra
        if first_process():
            task_lib.save_table(table, out / EVALUATION_FILE)
            if available("matplotlib"):
                plot = (task_lib.plot_positions(model, task, out / POSITIONS_FILE) if data is None
                        else task_lib.plot_data(model, data, stats, out / POSITIONS_FILE))
    print()
    print(traveller_heading(task, table))
    print(task_lib.format_table(table))
    print(f"\n{run_files(out)}  positions: {plot}")
    return 0


def traveller_heading(task, table: dict) -> str:
    if "policies" not in table:
        return f"out of sample: {task.eval_paths} held-out paths x {task.eval_steps} steps"
    (start, stop), paths = table["steps"], table["paths"]
    return (f"{table['period']} period: steps {start}-{stop - 1} of {paths} path(s); per step, net of costs; "
            f"Sharpe annualised with {task.periods_per_year:g} steps a year")


def load_run(args: argparse.Namespace, model: str) -> tuple:
    """--checkpoint and --step: what `tasks.<model>.load` returns (`model`: "traveller" or "vae"), then the step it
    was loaded from. Without --step: the newest checkpoint that verifies, so that a run still training can be read:
    a newer step that does not (one being saved, whose manifest comes last; a crashed or corrupted one) is named on
    stderr and skipped; when the step read fails and a newer one has been saved since (the training deletes older
    ones, --keep-checkpoints), the newest is chosen again."""
    import importlib

    from jax_scan_rnn.runlog import CHECKPOINT_DIR

    run = run_directory(args.checkpoint, args.step)  # a path that is no run: one line before JAX is imported
    from jax_scan_rnn import checkpoint

    task_lib = importlib.import_module(f"jax_scan_rnn.tasks.{model}")

    def load(step):
        with field_as_flag("out_dir", "--checkpoint"):  # "out_dir: expected a VAE run, got model 'traveller'"
            return task_lib.load(run, step)

    if args.step is not None:
        return *load(args.step), args.step
    for attempt in range(3):
        step, skipped = checkpoint.newest_valid_step(run / CHECKPOINT_DIR)
        try:
            loaded = load(step)
        except checkpoint.CheckpointError:
            if attempt == 2 or checkpoint.latest_step(run / CHECKPOINT_DIR) == step:
                raise
            continue  # a training still running saved a newer one and deleted this one (--keep-checkpoints)
        for s, reason in skipped:
            print(f"--checkpoint: step {s} skipped, loading step {step}: {reason}", file=sys.stderr)
        return *loaded, step


def traveller_data(task, stats, path: str | None, *, returns: bool = True, fill: str | None = None):
    """The run's own data file (path None) or another one, read with the run's columns (and its --fill, unless
    `fill` is given) and checked against what the model was trained on."""
    from jax_scan_rnn.tasks import traveller as task_lib

    if fill is not None:
        task = dataclasses.replace(task, fill=fill)
    if path is None and not Path(task.data).is_file():
        raise FileNotFoundError(f"--checkpoint: the run's data file {task.data} is gone; pass --data FILE to score "
                                "another file")
    with flag_names():
        data = task_lib.read_data(task, path, returns=returns)
    flag = "--data" if path else "--checkpoint"
    source = path or task.data
    if data.feature_names != stats.standardiser.names:
        raise ValueError(f"{flag}: {source} has the features {list(data.feature_names)}, the model was trained on "
                         f"{list(stats.standardiser.names)}")
    if returns and data.num_assets != stats.objective.num_assets:
        raise ValueError(f"{flag}: {source} has {data.num_assets} return columns, the model trades "
                         f"{stats.objective.num_assets} assets")
    if path is None and data.num_steps != stats.num_steps:
        raise ValueError(f"--checkpoint: the run's data file {source} now has {data.num_steps} steps per path, "
                         f"{stats.num_steps} when the model was trained: its periods would move; pass --data FILE "
                         "to evaluate on a file as a whole")
    if path is None and stats.data_sha256 and not task_lib.data_digest_matches(data, stats.data_sha256):
        raise ValueError(f"--checkpoint: the run's data file {source} is not the data the model was trained on (its "
                         "values changed since, or the run was given other data in Python): its periods would be "
                         "scored on other values; pass --data FILE to evaluate on a file as a whole")
    return data


@command("evaluate traveller")
def cmd_evaluate_traveller(args: argparse.Namespace) -> int:
    refuse_run_file(args.plot, "--plot")
    plotting = available("matplotlib")
    if args.plot and not plotting:  # asked for by name: refused before any work, not after the table
        raise ValueError(f"--plot: drawing {args.plot} needs matplotlib, which is not installed: "
                         "pip install 'jax-scan-rnn[plot]'")
    if args.plot and Path(args.plot).suffix:  # checked before any work
        from matplotlib.figure import Figure

        kinds = Figure().canvas.get_supported_filetypes()
        if Path(args.plot).suffix.lstrip(".").lower() not in kinds:
            raise ValueError(f"--plot: expected a file ending in one of {', '.join('.' + k for k in sorted(kinds))}, "
                             f"got {args.plot}")
    model, task, stats, step = load_run(args, "traveller")
    from jax_scan_rnn.tasks import traveller as task_lib

    scored = None if stats is None else Path(args.data).stem if args.data else args.period or "test"
    # Named by what it shows, never the training's own positions.png: an evaluation of an earlier step or
    # another period must not replace the plot the run left (and one evaluation does not replace another's).
    default = Path(args.checkpoint) / f"positions-step{step}{'' if scored is None else '-' + scored}.png"
    target = Path(args.plot) if args.plot else default
    if stats is None:
        for name in ("data", "period", "fill"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name}: expected only for a run trained on your data (--data); this run "
                                 "trained on the simulated market (use --paths and --horizon)")
        if args.paths is not None or args.horizon is not None:
            task = dataclasses.replace(
                task, eval_paths=args.paths or task.eval_paths, eval_steps=args.horizon or task.eval_steps
            )
            check_memory("the simulated held-out market (--paths x --horizon)",
                         task.market_bytes(task.eval_paths, task.eval_steps))
        table = task_lib.evaluate(model, task)
        draw = lambda: task_lib.plot_positions(model, task, target)  # noqa: E731
    else:
        for name in ("paths", "horizon"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name}: expected only for a run on the simulated market; this run trained on "
                                 f"{task.data} (use --period, or --data FILE)")
        period = args.period or ("all" if args.data else "test")
        if args.data and period != "all":
            raise ValueError(f"--period: expected 'all' with --data (another file is scored as a whole), got {period}")
        if args.fill and not args.data:
            raise ValueError("--fill: expected only with --data (the run's own file is read as it was in training)")
        data = traveller_data(task, stats, args.data, fill=args.fill)
        with flag_names():
            table = task_lib.data_table(model, data, stats, period, task.periods_per_year)
        draw = lambda: task_lib.plot_data(model, data, stats, target, period)  # noqa: E731
    print(traveller_heading(task, table))
    print(task_lib.format_table(table))
    if not plotting:  # the default plot is extra: the table is the evaluation (as train's missing curves)
        print(f"\npositions plot: {NOT_DRAWN}")
        return 0
    try:  # after the table: a run folder that is read-only still gets its evaluation
        plot = draw()
    except OSError as err:
        raise ValueError(f"--plot: cannot write {target} ({err.strerror}); pass --plot FILE elsewhere") from None
    print(f"\npositions plot: {plot}")
    return 0


@command("run traveller")
def cmd_run_traveller(args: argparse.Namespace) -> int:
    """Positions for new data, from the zero state or a saved one; the state after the last row is saved."""
    import numpy as np

    from jax_scan_rnn.data import market_data

    for flag, path in (("--output", args.output), ("--final-state", args.final_state)):
        check_output_file(path, flag)
    # --initial-state and --final-state may be one file: a state carried forward in place, read before it is written.
    refuse_an_input(args.output, "--output", {"--data": args.data, "--initial-state": args.initial_state,
                                              "--final-state": args.final_state})
    refuse_an_input(args.final_state, "--final-state", {"--data": args.data})
    model, task, stats, step = load_run(args, "traveller")
    from jax_scan_rnn.tasks import traveller as task_lib
    from jax_scan_rnn.traveller import TravellerState

    refuse_an_input(args.output, "--output", {"the run's --data file": task.data})
    if stats is not None:
        data = traveller_data(task, stats, args.data, returns=False, fill=args.fill)
        features, assets = stats.standardiser(data.features), stats.asset_names
    else:  # trained on the simulated market: its features, as an .npz (`features [N, T, F]`)
        if Path(args.data).suffix != ".npz":
            raise ValueError(f"--data: expected an .npz file with features [N, T, {task.market.num_signals}] (this "
                             f"run trained on the simulated market, which has no column names), got {args.data}")
        if not Path(args.data).is_file():
            raise FileNotFoundError(f"--data: {args.data}: no such file")
        with flag_names():
            data = market_data.read(args.data, returns=False, fill=args.fill or "error")
        if data.num_features != model.num_inputs:
            raise ValueError(f"--data: {args.data} has {data.num_features} features per step, the model reads "
                             f"{model.num_inputs} (the simulated market's signals)")
        features, assets = data.features, tuple(f"asset_{i}" for i in range(task.market.num_assets))
    state, producer = None, produced_by(model, args.checkpoint, step)
    if args.initial_state is not None:
        try:
            with np.load(args.initial_state) as saved:
                state = TravellerState(*(saved[name] for name in TravellerState._fields))
                recorded = {key: saved[key] for key in producer if key in saved}  # none before 2026-12
        except (OSError, KeyError, ValueError) as err:
            raise ValueError(f"--initial-state: {args.initial_state} is not a state saved by --final-state ({err})") from None
        # same shapes, other weights: silently wrong positions
        check_produced_by(recorded, producer, "--initial-state", args.initial_state, "is the state",
                          "a state continues only the model that produced it; leave --initial-state out to start "
                          "from the zero state")
    try:
        positions, state = task_lib.positions(model, features, state)
    except ValueError as err:
        if state is None or not str(err).startswith("state."):
            raise
        raise ValueError(f"--initial-state: {err} (it was saved for another model or number of paths)") from None
    write_atomically(args.output, lambda f: write_positions_csv(f, positions, assets, data))
    print(f"positions: {positions.shape[0]} path(s) x {positions.shape[1]} steps x {len(assets)} assets -> {args.output}")
    if args.final_state is not None:
        arrays = {**{k: np.asarray(v) for k, v in state._asdict().items()}, **producer}
        write_atomically(args.final_state, lambda f: np.savez(f, **arrays), binary=True)
        print(f"state after the last step -> {args.final_state} (continue with --initial-state)")
    return 0


def produced_by(model, checkpoint: str, step: int) -> dict[str, str]:
    """What a file computed from a model (run traveller's --final-state, encode vae's latents) records of it: its
    weights' sha256 and the checkpoint they were read from."""
    return {"weights_sha256": weights_digest(model), "checkpoint": f"{Path(checkpoint).absolute()} --step {step}"}


def check_produced_by(recorded, producer: dict[str, str], flag: str, path: str, what: str, remedy: str) -> None:
    """ValueError naming `flag` when the file `path` recorded (`recorded`: its arrays, an open .npz) other weights
    than `producer`'s (`produced_by`): read with another model, a state or latents give wrong numbers without a
    word. A file that records none (made by hand, or before 2026-12) passes."""
    theirs = {key: str(recorded[key]) for key in producer if key in recorded}
    if theirs and theirs["weights_sha256"] != producer["weights_sha256"]:
        raise ValueError(f"{flag}: {path} {what} of other weights (saved with --checkpoint {theirs['checkpoint']}; "
                         f"this --checkpoint's weights differ): {remedy}")


def weights_digest(model) -> str:
    """sha256 of the model's parameters (shapes, dtypes and bytes, in order): which weights a saved state belongs to."""
    import hashlib

    import jax
    import numpy as np
    from flax import nnx

    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
        value = np.ascontiguousarray(leaf)
        digest.update(f"{value.shape}{value.dtype}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def write_positions_csv(file, positions, assets, data) -> None:
    """One row per --data row read: its path (path_col's value, or 0..N-1), its step (its index among its path's rows
    in the file, 0 first: rows --fill drop dropped are skipped, not renumbered, so each row lines up with its bar),
    then one position per asset, as the shortest decimal that reads back as the same number of the positions' dtype
    (NumPy's `str`: 9 significant digits at most for float32; a fixed 8 left some float32 positions 1 ulp off)."""
    import csv

    import numpy as np

    writer = csv.writer(file)
    writer.writerow(["path", "step", *assets])
    for label, steps, rows in zip(data.path_labels, data.source_steps, positions):
        for step, row in zip(steps.tolist(), np.asarray(rows)):
            writer.writerow([label, step, *(str(v) for v in row)])


def write_export(model, step: int, args: argparse.Namespace, side: dict) -> Path:
    """`model`'s torch state_dict ({torch key: np.ndarray}) to --output in --format, and `side` (the torch model's
    "model" class and its "arguments", ...) as JSON to FILE.json, each written atomically; says what was written
    (`step` of --checkpoint). Returns the side file's path. The side file may not be a training run's own file
    either (`--output RUN/evaluation` would replace the run's evaluation.json): refused before anything is written."""
    import jax_scan_rnn as jsr
    from jax_scan_rnn.convert import save_safetensors, side_file

    refuse_run_file(str(side_file(args.output)), "--output (its side file)")
    suffixes = {"torch": (".pt", ".pth"), "safetensors": (".safetensors",)}[args.format]
    if Path(args.output).suffix.lower() not in suffixes:  # the name --init-from (and a reader) takes the format from
        raise ValueError(f"--output: expected a {' or '.join(suffixes)} file for --format {args.format}, got "
                         f"{args.output}")
    state_dict = jsr.torch_state_dict(model)
    if args.format == "torch":
        from jax_scan_rnn.optional import require

        torch = require("torch", "export --format torch")
        write_atomically(args.output, lambda f: torch.save({k: torch.from_numpy(v) for k, v in state_dict.items()}, f),
                         binary=True)
    else:
        save_safetensors(state_dict, args.output)  # atomically, as every output
    path = side_file(args.output)
    # where the weights came from: two exports of one run (or of two) tell apart by their files alone
    side = {**side, "source": {"checkpoint": os.path.abspath(args.checkpoint), "step": step}}
    write_atomically(str(path), lambda f: f.write(json.dumps(side, indent=2) + "\n"))
    shown = ", ".join(f"{k}={v}" for k, v in side["arguments"].items())
    print(f"state_dict of {side['model']}({shown}), step {step} of {args.checkpoint} -> {args.output}")
    return path


@command("export traveller")
def cmd_export_traveller(args: argparse.Namespace) -> int:
    """The weights as a PyTorch state_dict that the seed's class (and torch_ref.Traveller) loads."""
    check_output_file(args.output)
    model, task, stats, step = load_run(args, "traveller")
    from jax_scan_rnn.tasks import traveller as task_lib

    path = write_export(model, step, args, task_lib.export_side(model, task, stats))
    print("its arguments" + ("" if stats is None else " and the standardisation of the features it reads (the "
                              "training period's mean and std)") + f": {path}")
    return 0


@command("export vae")
def cmd_export_vae(args: argparse.Namespace) -> int:
    """The weights as a PyTorch state_dict that torch_ref.SeqVAE loads, and in FILE.json what they are of no use
    without: torch_ref.SeqVAE's arguments and the vocabulary (token id -> character) the model reads and writes."""
    check_output_file(args.output)
    model, vocab, task, step = load_run(args, "vae")
    from jax_scan_rnn.tasks import vae as task_lib

    side = write_export(model, step, args, {
        "model": "torch_ref.SeqVAE", "arguments": task_lib.model_arguments(task, vocab.size),
        # Vocabulary.from_json(json.dumps(this)) rebuilds it; a molecule is one id per character, then <eos>.
        "vocabulary": json.loads(vocab.to_json()),
        "max_length": task.max_length, "kekule": task.writes_kekule, "decoder_only": task.decoder_only})
    print(f"its arguments and vocabulary (token id -> character; ids 0-2: <pad>, <sos>, <eos>): {side}")
    if task.decoder_only:
        print("a CharRNN (--decoder-only): it decodes from z = 0, the encoder was not trained")
    return 0


def vae_evaluation_banner(task, test_sequences: int) -> str:
    """Said before the final evaluation, which compiles and runs for tens of seconds without a step to count."""
    if task.decoder_only:
        return f"evaluating: drawing {task.eval_samples} samples twice (sampled and greedy)..."
    return (f"evaluating: reconstructing {min(task.eval_sequences, test_sequences)} test sequences, drawing "
            f"{task.eval_samples} prior samples twice (sampled and greedy), interpolating...")


def fraction(value: float | None) -> str:
    """A metric in [0, 1] for a person, 3 decimals; "n/a" where it is undefined (unique/novel among no valid sample)."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f}"


def print_vae_report(report: dict) -> None:
    if "reconstruction" in report:  # a CharRNN (--decoder-only) has no latent: samples only
        rec = report["reconstruction"]
        what = "molecules" if report["samples"]["validity"] is not None else "sequences"  # --no-smiles-check: None
        head = f"reconstruction of {rec['n']} test {what}" if "n" in rec else "reconstruction (decoding from mu)"
        print(f"{head:<36} {'token acc':>10} {'sequence acc':>13}")
        print(f"{'  teacher-forced':<36} {rec['tf_token_acc']:>10.3f} {rec['tf_sequence_acc']:>13.3f}")
        print(f"{'  free-running (greedy)':<36} {rec['free_token_acc']:>10.3f} {rec['free_sequence_acc']:>13.3f}")
    for key, how in (("samples", "sampled, T=1"), ("samples_greedy", "greedy")):
        samples = report[key]
        never_ended = f"  unterminated {fraction(samples['unterminated'])}" if "unterminated" in samples else ""
        formed = f"  well-formed {fraction(samples['well_formed'])}" if "well_formed" in samples else ""
        print(f"prior samples, {how} (n={samples['n']}): valid {fraction(samples['validity'])}{formed}{never_ended}  "
              f"unique {fraction(samples['uniqueness'])}  novel {fraction(samples['novelty'])}")
    if "latent" in report:
        latent, path = report["latent"], report["interpolation"]["path"]
        print(f"latent: KL {latent['kl']:.2f} nats, active units {latent['active_units']} of {len(latent['kl_per_dim'])}")
        print("interpolation:", " -> ".join(path[:: max(1, len(path) // 4)]))


@command("train vae")
def cmd_train_vae(args: argparse.Namespace) -> int:
    from jax_scan_rnn.configs import vae as config  # JAX-free: every option is checked before JAX is imported
    from jax_scan_rnn.data import smiles

    saved = adopt_saved_settings(args, config.VAETask, config.PRESETS[args.preset] if args.preset else None)
    if not args.smiles_check and smiles.is_builtin_source(args.data):
        raise ValueError(f"--no-smiles-check: expected only with a --data file that is not chemistry, got --data "
                         f"{args.data}, a built-in source (always SMILES)")
    if not smiles.is_builtin_source(args.data) and os.path.isfile(args.data):  # saved with the run: evaluate finds
        args.data = os.path.abspath(args.data)  # it from any working directory (a missing one is named as typed)
    refuse_unread(args, [
        (config.SCHEDULED_ONLY, args.decoding == "teacher", "with --decoding scheduled",
         "teacher forcing does not read it"),
        (("kl_warmup",), args.kl_schedule == "constant", "with --kl-schedule linear or sigmoid", "constant has no warm-up"),
        *train_rules(args),
    ])
    # A CharRNN baseline shares its VAE's flags (docs/vae_experiments.md compares them), so these are said, not refused.
    for flag, value, when, why in unread_flags(args, [(config.ENCODER_ONLY, args.decoder_only, "with --decoder-only",
                                                       "the decoder alone has no encoder and no KL")]):
        print(f"jax-scan-rnn train vae: note: {flag} {value} has no effect {when} ({why})", file=sys.stderr)
    with flag_names():
        task = options.from_args(config.VAETask, args)
    cfg = train_config(args)
    from jax_scan_rnn.tasks import vae as task_lib

    out = Path(args.out)
    dp = data_parallel(args, task.batch_size)
    if args.preset:
        print(f"preset {args.preset}: {config.PRESETS[args.preset].summary}; explicit flags override it")
    init_from = None
    if args.init_from is not None:  # read and checked before the data: a wrong file or size is one line
        with flag_names():
            init_from = task_lib.InitFrom.read(args.init_from)
            init_from.check(task)
    refuse_a_finished_run(out, args.resume)  # before the data: MOSES's 300,000 molecules take half a minute
    vocab = smiles.Vocabulary.from_json(saved["vocab"]) if saved and "vocab" in saved else init_from and init_from.vocab
    dataset = task_lib.load_dataset(task, vocab, cache=data_cache("train vae"))
    check_memory("the final evaluation's samples (--eval-samples)",
                 task_lib.sample_bytes(task, dataset.vocab.size, task.eval_samples))
    print(f"data {task.data}: {len(dataset.train)} train / {len(dataset.valid)} valid / {len(dataset.test)} test "
          f"sequences, vocabulary {dataset.vocab.size}; skipped: {task_lib.describe_skipped(dataset.skipped)}"
          + (f"; read up to --limit {task.limit}" if dataset.limit_reached else ""))
    with output_directory(out, args.resume):
        check_resume(out, args, task, cfg, {"data_sha256": dataset.digest}, saved)
        print(f"training the VAE ({task.decoding} decoding) for {args.steps} steps on {dp.size} device(s) -> {out}")
        accuracy = ("" if task.decoder_only else f", free-running (greedy, from mu) accuracy on "
                                                    f"{min(task_lib.EVAL_RECONSTRUCT, len(dataset.valid))}")
        print(f"the bar's eval figures: loss on {min(task_lib.EVAL_LOSS, len(dataset.valid))} validation "
              f"{'molecules' if task.smiles_check else 'sequences'}"
              f"{accuracy}; the final report uses the test set")
        # --init-from's errors name the flag; fit's out_dir is --out
        with flag_names(), field_as_flag("out_dir", "--out"), ProgressBar() as progress, sigterm_stops() as stop:
            model, dataset, _ = task_lib.train(
                task, cfg, out, resume=args.resume, callback=progress, dataset=dataset, init_from=init_from,
                data_sharding=dp.data, state_sharding=dp.replicated, stop=stop,
            )
        print(vae_evaluation_banner(task, len(dataset.test)), flush=True)
        report = task_lib.evaluate(model, dataset, task, seed=args.seed)
        if first_process():
            write_atomically(out / EVALUATION_FILE, lambda f: f.write(strict_json(report, indent=2) + "\n"))
    print()
    print_vae_report(report)
    print(f"\n{run_files(out)}  report: {out / EVALUATION_FILE}")
    return 0


def vae_data_file(task) -> str | None:
    """The run's --data file, or None for a built-in source ('moses', 'rdkit')."""
    from jax_scan_rnn.data import smiles

    return None if smiles.is_builtin_source(task.data) else task.data


@command("sample vae")
def cmd_sample_vae(args: argparse.Namespace) -> int:
    from jax_scan_rnn import metrics

    refuse_unread(args, [(("temperature", "top_k"), args.greedy, "without --greedy",
                          "greedy decoding takes each step's most likely token")])
    # With --latents, -n counts the samples of each row (default 1); checked here, before the run is read.
    n = args.n if args.latents is None or "n" in args.given else 1
    if args.latents is not None and args.greedy and n > 1:
        raise ValueError(f"-n: expected 1 with --latents and --greedy (greedy decoding gives each latent one "
                         f"sequence), got {n}")
    if args.latents is not None and not Path(args.latents).is_file():
        raise FileNotFoundError(f"--latents: no file at {args.latents}")
    check_output_file(args.output)
    refuse_an_input(args.output, "--output", {"--latents": args.latents})
    model, vocab, task, step = load_run(args, "vae")
    from jax_scan_rnn.tasks import vae as task_lib

    refuse_an_input(args.output, "--output", {"the run's --data file": vae_data_file(task)})
    z = None if args.latents is None else read_latents(args.latents, model, task.decoder_only,
                                                       produced_by(model, args.checkpoint, step))
    check_memory("the samples (-n)" if z is None else "the samples (--latents, -n per row)",
                 task_lib.sample_bytes(task, vocab.size, n if z is None else n * len(z)))
    model.eval()
    with flag_names():  # the sampler's own checks ("top_k: ...") name the flag
        tokens = task_lib.sample_tokens(model, n, max_len=task.max_length + 1, seed=args.seed,
                                        temperature=args.temperature, top_k=args.top_k, greedy=args.greedy,
                                        decoder_only=task.decoder_only, z=z)
    generated = vocab.decode(tokens)
    if args.output:
        write_atomically(args.output, lambda f: f.write("\n".join(generated) + "\n"))
    else:
        print("\n".join(generated))
    if task.smiles_check:  # the samples are SMILES: a built-in set's, or a --data file's (not --no-smiles-check)
        print(f"valid {fraction(metrics.validity(generated))}  unterminated {fraction(task_lib.unterminated(tokens))}  "
              f"unique {fraction(metrics.uniqueness(generated))}", file=sys.stderr)
    return 0


def read_latents(path: str, model, decoder_only: bool, producer: dict[str, str]):
    """--latents: the `mu` (or `z`) array [N, Z] of an .npz file (as `encode vae` writes), or an .npy array [N, Z],
    checked: N >= 1, this model's Z, finite, and, where `encode vae` recorded them, this model's weights (another
    model's latents, another step's of the same run too, decode into other molecules without a word)."""
    import numpy as np

    latent_size = model.latent_size
    if decoder_only:
        raise ValueError(f"--latents: expected a run with an encoder, got a --decoder-only run (its decoder reads no "
                         f"latent), for {path}")
    try:
        loaded = np.load(path)  # an .npy array, or an .npz archive (read lazily: closed below)
    except (OSError, ValueError):  # neither (a text file, a pickle, which np.load refuses)
        raise ValueError(f"--latents: expected an .npz or .npy file of latents [N, {latent_size}], got {path}") from None
    if isinstance(loaded, np.ndarray):
        z = loaded
    else:
        with loaded:
            key = next((k for k in ("z", "mu") if k in loaded), None)
            if key is None:
                raise ValueError(f"--latents: expected an .npz with a 'z' or 'mu' array [N, {latent_size}], got {path} "
                                 f"with {sorted(loaded) or 'no arrays'}")
            z = loaded[key]
            check_produced_by(loaded, producer, "--latents", path, "holds the latents",
                              "they decode into other molecules; encode the molecules again with this checkpoint")
    if z.ndim != 2 or z.shape[0] < 1 or z.shape[1] != latent_size or not np.issubdtype(z.dtype, np.floating):
        raise ValueError(f"--latents: expected floating latents [N, {latent_size}] with N >= 1 (this model's latent "
                         f"size), got {z.dtype} of shape {tuple(z.shape)} in {path}")
    if not np.isfinite(z).all():
        raise ValueError(f"--latents: expected finite values, got {int((~np.isfinite(z)).sum())} NaN or inf in {path}")
    return z


@command("encode vae")
def cmd_encode_vae(args: argparse.Namespace) -> int:
    """The posterior mean and log-variance of each molecule of --input, as an .npz that `sample vae --latents` reads."""
    from collections import Counter

    import numpy as np

    from jax_scan_rnn.data import smiles

    check_output_file(args.output)
    refuse_an_input(args.output, "--output", {"--input": args.input})
    if not Path(args.input).is_file():
        raise FileNotFoundError(f"--input: no file at {args.input}")
    model, vocab, task, step = load_run(args, "vae")
    from jax_scan_rnn.tasks import vae as task_lib

    if task.decoder_only:
        raise ValueError(f"--checkpoint: expected a run with an encoder, got a --decoder-only run: {args.checkpoint}")
    skipped = Counter()
    try:  # read as the run's --data file would be: the same formats
        records = list(smiles.file_fields(args.input, task.smiles_check, skipped))
    except ValueError as err:  # a table without a SMILES column
        raise ValueError(f"--input: {str(err).removeprefix('source: ')}") from None
    model.eval()
    found = task_lib.latents(model, vocab, task, [seq for _, seq in records], cache=data_cache("encode vae"))
    total = len(records) + sum(skipped.values())  # the empty and undecodable records counted as they were read
    skipped.update(found["skipped"])
    described = task_lib.describe_skipped(dict(skipped))
    if not found["sequences"]:
        raise ValueError(f"--input: none of the {total} records of {args.input} can be encoded (skipped: {described})")
    arrays = {"mu": found["mu"], "logvar": found["logvar"], "smiles": np.asarray(found["sequences"]),
              "row": np.asarray([records[i][0] for i in found["index"]], np.int64),
              **produced_by(model, args.checkpoint, step)}
    write_atomically(args.output, lambda f: np.savez(f, **arrays), binary=True)
    print(f"encoded {len(found['sequences'])} of {total} records{f' (skipped: {described})' if skipped else ''} -> "
          f"{args.output}: mu and logvar [N, {model.latent_size}], smiles as encoded, row (of --input: its line, or "
          f"its data row for a table, from 1); decode with sample vae --latents {args.output}")
    return 0


@command("evaluate vae")
def cmd_evaluate_vae(args: argparse.Namespace) -> int:
    from jax_scan_rnn.runlog import CHECKPOINT_DIR

    check_output_file(args.output)
    if "reference" in args.given and args.metrics != "moses":
        raise ValueError("--reference: expected only with --metrics moses (it picks the set MOSES's Test metrics "
                         f"compare with), got --metrics {args.metrics}")
    model, vocab, task, step = load_run(args, "vae")
    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.tasks import vae as task_lib

    if args.metrics == "moses" and not task.smiles_check:  # before molsets is asked for: it would not help
        raise ValueError(f"--metrics moses: expected a run on SMILES, got one trained with --no-smiles-check on "
                         f"{task.data} (MOSES's metrics parse every sample as a molecule)")
    if args.metrics == "moses" and args.reference == "moses":  # without molsets: one line now, not after the samples
        from jax_scan_rnn import metrics

        metrics.reference_set("moses")
    data_file = vae_data_file(task)
    refuse_an_input(args.output, "--output", {"the run's --data file": data_file})
    check_memory("the samples (-n)", task_lib.sample_bytes(task, vocab.size, args.n))
    if data_file and not Path(data_file).is_file():
        items = "molecules" if task.smiles_check else "sequences"
        raise FileNotFoundError(f"--checkpoint: the run's data file {task.data} is gone (its test {items} are "
                                f"scored, its training {items} make novelty); `sample vae` needs no data")
    # The run's own vocabulary, as --resume reads the data (a run started --init-from another model's has that
    # model's, not the one its data would build)
    dataset = task_lib.load_dataset(task, vocab, cache=data_cache("evaluate vae"))
    saved = checkpoint.read_metadata(Path(args.checkpoint) / CHECKPOINT_DIR, step)
    if "data_sha256" not in saved:
        if task.smiles_check:  # (other text is read as it was)
            warnings.warn(f"--checkpoint: {VAE_DATA_UNRECORDED}; its test molecules as this version reads --data "
                          f"{task.data} may include ones it trained on")
    elif saved["data_sha256"] != dataset.digest:
        items, why = ("molecules", VAE_DATA_DIFFERS) if task.smiles_check else ("sequences", "the file changed since")
        raise ValueError(f"--checkpoint: the run's data file {task.data} is not the data it was trained on (its "
                         f"{items} as read now differ: {why}): its test split would hold other {items}, maybe ones "
                         "the model trained on; restore the file or evaluate with the version that trained the run, "
                         f"or score other {items} with sample vae and your own metrics")
    task = dataclasses.replace(task, eval_samples=args.n)
    # The run's own seed, as its final evaluation drew them: -n of its --eval-samples gives its evaluation.json's
    # samples, not another draw of them (a run saved before its seed was recorded: 0, as it then drew)
    seed = saved.get("seed", 0)
    print(vae_evaluation_banner(task, len(dataset.test)), flush=True)
    report = task_lib.evaluate(model, dataset, task, seed=seed)
    print_vae_report(report)
    if args.metrics == "moses":
        report["moses"] = moses_row(model, vocab, task, dataset, args.n, seed, args.reference)
    if args.output:
        write_atomically(args.output, lambda f: f.write(strict_json(report, indent=2) + "\n"))
    return 0


def moses_row(model, vocab, task, dataset, n: int, seed: int, reference: str = "moses") -> dict:
    """MOSES's metrics of `n` prior samples at temperature 1 (the report's own, drawn with `seed`), printed as
    MOSES's table beside its published rows. The Test metrics compare with `reference`: "moses", MOSES's test set
    (as its published rows; an ImportError naming molsets without it), or "held-out", this run's test split."""
    from jax_scan_rnn import metrics
    from jax_scan_rnn.tasks import vae as task_lib

    if reference == "moses":  # molsets' data files, read without importing moses (whose imports fail on current pandas)
        reference, where = metrics.reference_set("moses"), "MOSES's test set"
    else:
        reference, where = dataset.test, f"the held-out split ({len(dataset.test)} molecules)"
    print(f"\nMOSES metrics of {n} prior samples against {where}: about {max(10, n // 80)} s on 2 cores...",
          flush=True)
    generated = task_lib.sample(model, vocab, n, max_len=task.max_length + 1, seed=seed, decoder_only=task.decoder_only)
    # The canonical training set the basic evaluation already has: no second parse of every training molecule.
    row = metrics.moses_metrics(generated, list(dataset.canonical_train), reference, train_is_canonical=True)
    print(metrics.format_moses_table({"this run (T=1)": row}))
    return row


@command("bench")
def cmd_bench(args: argparse.Namespace) -> int:
    from jax_scan_rnn import bench

    return bench.run(args)


def positive_int_list(text: str) -> tuple[int, ...]:
    """`"4,1000"` -> (4, 1000): comma-separated positive ints (the T or B values of a sweep), each once. An empty
    entry ("1,,64": a value left out?) is refused rather than skipped."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"expected each value once, got {text!r}")
    return values


# `check --seed` and `sample vae --seed`: the seed options' range and message, from the parser `options` gives them
SEED = options.argument_type(int, lo=0, hi=validate.SEED_MAX)
POSITIVE_INT = options.argument_type(int, lo=1)
POSITIVE_FLOAT = options.argument_type(float, lo=0, lo_open=True)  # finite too, as validate.real's every number


def add_train_arguments(parser: argparse.ArgumentParser, task: type, defaults: dict, out: str, init_from: str,
                        task_defaults: dict | None = None) -> None:
    """The task's options (with `task_defaults`), then TrainConfig's (with this command's `defaults`), then the
    run's own flags (`init_from`: what --init-from reads, for its help)."""
    from jax_scan_rnn.configs.train import COMMAND_DEFAULTS, TrainConfig

    options.add_arguments(parser.add_argument_group("model and data"), task, task_defaults)
    group = parser.add_argument_group("training")
    options.add_arguments(group, TrainConfig, {**COMMAND_DEFAULTS, "warmup_steps": None, **defaults},
                          shown={"warmup_steps": "min(100, steps // 10)"})
    group.add_argument("--out", default=out, metavar="DIR", help=f"output directory (default: {out})")
    group.add_argument("--init-from", default=None, metavar="FILE",
                       help=f"start from {init_from}, instead of random weights")
    group.add_argument("--resume", action="store_true", help="continue from the latest valid checkpoint in --out, with the run's own "
                       "settings for the options not given")
    group.add_argument("--override", action="store_true",
                       help="with --resume: continue even if options given differ from the run's saved ones (listed)")
    group.add_argument("--devices", type=POSITIVE_INT, default=None, metavar="N",
                       help="data-parallel over this many devices: the batch is split, parameters replicated "
                            "(default: all)")
    group.add_argument("--multihost", action="store_true",
                       help="call jax.distributed.initialize() first (run the same command on every host; "
                            "see docs/cli.md)")


def model_commands(sub, name: str, help: str):
    """`jax-scan-rnn NAME MODEL ...`: a command with one sub-command per model."""
    return sub.add_parser(name, help=help).add_subparsers(dest="model", required=True, metavar="MODEL")


FILL_HELP = "missing values in --data: error, or ffill, zero, drop (rows) (default: the run's own --fill)"


def trained_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--checkpoint and --step: which training run (and which of its checkpoints) a command reads."""
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="the training output directory (--out of "
                        "train)")
    parser.add_argument("--step", type=int, default=None, metavar="N", help="checkpoint step (default: the latest)")


def preset_named(argv: Sequence[str], presets: dict):
    """The preset that `--preset NAME` in `argv` names, or None (also for an unknown name: the command's own
    parser then refuses it, with the choices). Read before the command's parser is built, because the
    preset's values become its flags' defaults: an explicit flag overrides them."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--preset")
    return presets.get(early.parse_known_args(argv)[0].preset)


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and where to look) instead of the whole usage block first."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line. The options of `train ...` (from `configs`, JAX-free) and `bench` (from modules that import
    JAX) are added only when `argv` names that command: `--version`, `--help` and the other commands start at once,
    and `train ... --help` too."""
    from jax_scan_rnn import __version__
    from jax_scan_rnn.data import market_data  # NumPy, not JAX: --fill's choices

    words = [a for a in argv if not a.startswith("-")][:2]
    parser = Parser(prog="jax-scan-rnn", description="Feedback recurrent networks in JAX, driven by lax.scan.",
                    epilog="COMMAND --help lists its options; what the commands write and guarantee (runs, resume, "
                           "caches, your own data): docs/cli.md in the source repository")
    parser.add_argument("--version", action="version", version=f"jax-scan-rnn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    sub.add_parser("info", help="devices and library versions")
    check = sub.add_parser("check", help="parity self-check against torch.nn on random weights")
    check.add_argument("--steps", type=POSITIVE_INT, default=500, metavar="T", help="sequence length T (default: 500)")
    check.add_argument("--seed", type=SEED, default=0, metavar="N", help="random seed (default: 0)")
    bench_parser = sub.add_parser("bench", help="time scan against every kind of loop (benchmarks/)")
    if words[:1] == ["bench"]:
        from jax_scan_rnn import bench

        bench.add_arguments(bench_parser)

    train = model_commands(sub, "train", "train a model")
    trav = train.add_parser("traveller", help="the position-feedback LSTM, on the simulated market or --data FILE")
    if words == ["train", "traveller"]:
        from jax_scan_rnn.configs.traveller import TRAIN_DEFAULTS, TravellerTask

        add_train_arguments(trav, TravellerTask, TRAIN_DEFAULTS, out="runs/traveller",
                            init_from="a PyTorch state_dict (.pt/.pth/.safetensors) of the seed's Traveller class or "
                                      "torch_ref.Traveller")
    vae = train.add_parser("vae", help="the SMILES sequence VAE (GRU encoder/decoder, teacher forcing or scheduled "
                                       "sampling)")
    if words == ["train", "vae"]:
        from jax_scan_rnn.configs.vae import PRESETS, TRAIN_DEFAULTS, VAETask

        vae.add_argument("--preset", choices=tuple(PRESETS), default=None,
                         help="; ".join(f"{p.name}: {p.summary}" for p in PRESETS.values())
                         + ". Its values become the defaults below; an explicit flag overrides them")
        preset = preset_named(argv, PRESETS)
        train_defaults = {**TRAIN_DEFAULTS, **(preset.train if preset else {})}
        add_train_arguments(vae, VAETask, train_defaults, out="runs/vae",
                            init_from="a torch_ref.SeqVAE state_dict (.pt/.pth/.safetensors) with its side file "
                                      "FILE.json (its arguments and vocabulary), as export vae writes them (the data "
                                      "is then read with its vocabulary)",
                            task_defaults=dict(preset.task) if preset else None)

    sample = model_commands(sub, "sample", "generate from a trained model")
    sv = sample.add_parser("vae", help="SMILES from the prior z ~ N(0, I) or from given latents (--latents), in "
                                      "one jitted call")
    trained_run_arguments(sv)
    sv.add_argument("-n", type=POSITIVE_INT, default=1000,
                    help="number of samples (default: 1000); with --latents, samples per row (default: 1)")
    sv.add_argument("--temperature", type=POSITIVE_FLOAT, default=1.0, metavar="X",
                    help="sampling temperature (default: 1.0)")
    sv.add_argument("--top-k", type=int, default=0, metavar="K",
                    help="sample among the k most likely tokens (default: 0, off)")
    sv.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    sv.add_argument("--seed", type=SEED, default=0, metavar="N", help="random seed (default: 0)")
    sv.add_argument("--output", default=None, metavar="FILE",
                    help="write the samples here, one per line (default: stdout)")
    sv.add_argument("--latents", default=None, metavar="FILE",
                    help="decode these latents instead of prior draws: -n samples (default 1) per row of the 'z' or "
                         "'mu' array [N, Z] of an .npz (as encode vae writes) or of an .npy file, row 0's first")
    encode = model_commands(sub, "encode", "latents of a trained model for given sequences")
    en = encode.add_parser("vae", help="each molecule's posterior mean and log-variance, as an .npz")
    trained_run_arguments(en)
    en.add_argument("--input", required=True, metavar="FILE", help="the molecules, in any format train vae's --data "
                                                                  "reads (one SMILES per line, a name after it "
                                                                  "allowed, or a .csv/.tsv with a smiles column), each "
                                                                  "written as the run's molecules were (Kekulé form by "
                                                                  "default)")
    en.add_argument("--output", required=True, metavar="NPZ", help="write mu, logvar [N, Z], smiles (as encoded) and row "
                                                                   "(of --input, from 1) here")

    run = model_commands(sub, "run", "positions from a trained model for new data")
    rt = run.add_parser("traveller", help="positions for every row of a data file, as CSV; the state can carry on")
    trained_run_arguments(rt)
    rt.add_argument("--data", required=True, metavar="FILE",
                    help="features to trade on, read with the run's columns (return columns are not needed)")
    rt.add_argument("--output", required=True, metavar="CSV", help="write the positions here: path (--path-col's "
                    "value), step (the row's index in its path, 0 first; rows --fill drop dropped are skipped), one "
                    "column per asset")
    rt.add_argument("--initial-state", default=None, metavar="NPZ",
                    help="continue from this state (a previous run's --final-state) instead of the zero state")
    rt.add_argument("--final-state", default=None, metavar="NPZ", help="save the state after the last row here")
    rt.add_argument("--fill", default=None, choices=market_data.FILLS, help=FILL_HELP)
    export = model_commands(sub, "export", "a trained model's weights for PyTorch")
    for name, help in (("traveller", "a state_dict that the seed's class and torch_ref.Traveller load"),
                       ("vae", "a state_dict that torch_ref.SeqVAE loads; its arguments and vocabulary in FILE.json")):
        ex = export.add_parser(name, help=help)
        trained_run_arguments(ex)
        ex.add_argument("--format", required=True, choices=("torch", "safetensors"),
                        help="torch: torch.save of the state_dict (.pt); safetensors: a .safetensors file")
        ex.add_argument("--output", required=True, metavar="FILE", help="the file to write")

    evaluate = model_commands(sub, "evaluate", "evaluate a trained model")
    ev = evaluate.add_parser("traveller", help="out-of-sample utility table and a positions plot")
    trained_run_arguments(ev)
    ev.add_argument("--paths", type=POSITIVE_INT, default=None, metavar="N", help="simulated held-out paths (default: "
                    "the run's --eval-paths)")
    ev.add_argument("--horizon", type=POSITIVE_INT, default=None, metavar="N", help="steps per simulated held-out path "
                    "(default: the run's --eval-steps)")
    ev.add_argument("--plot", default=None, metavar="PNG",
                    help="positions plot path (default: CHECKPOINT/positions-stepN[-PERIOD or -FILE].png, named by "
                         "the step, period or file scored; the training's own positions.png is left as it is)")
    ev.add_argument("--period", default=None, choices=("train", "valid", "test", "all"),
                    help="run on your data: the period of its file to score (default: test)")
    ev.add_argument("--data", default=None, metavar="FILE",
                    help="run on your data: score this file as a whole instead (read with the run's columns)")
    ev.add_argument("--fill", default=None, choices=market_data.FILLS, help=f"with --data: {FILL_HELP}")
    ev = evaluate.add_parser("vae", help="reconstruction, prior-sample validity/uniqueness/novelty, KL, interpolation")
    trained_run_arguments(ev)
    ev.add_argument("-n", type=POSITIVE_INT, default=1000,
                    help="prior samples (default: 1000), drawn with the run's --seed: its --eval-samples give the "
                         "samples of its evaluation.json")
    ev.add_argument("--metrics", choices=("basic", "moses"), default="basic",
                    help="moses: also MOSES's table (FCD/SNN/Frag/Scaf against --reference, Novelty against the run's "
                         "training split; IntDiv, Filters) beside MOSES's published VAE and CharRNN rows (about 2 min "
                         "for -n 10000)")
    ev.add_argument("--reference", choices=("moses", "held-out"), default="moses",
                    help="with --metrics moses, the Test metrics' set: moses, MOSES's test set, as its published rows "
                         "(needs `pip install --no-deps molsets`); held-out, the run's own test split (your own "
                         "molecules' distribution) (default: moses)")
    ev.add_argument("--output", default=None, metavar="JSON", help="also write the report as JSON here")
    return parser


def given_options(argv: Sequence[str]) -> set[str]:
    """The dests of the options that `argv` sets itself (not a default, nor a preset's): the command line parsed
    again with every default suppressed (argparse then leaves out what was not given)."""
    parser = build_parser(argv)
    parsers = [parser]
    while parsers:
        for action in parsers.pop()._actions:  # argparse keeps no public list of them
            action.default = argparse.SUPPRESS
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    return set(vars(parser.parse_args(argv)))


def kept(args: argparse.Namespace) -> str | None:
    """What a training run stopped before its end (Ctrl-C, a full disk) leaves in --out: its committed checkpoints
    (atomic: an interrupted save leaves the previous one intact), or none yet; None for another command (its output
    files are written atomically: an interrupted one leaves none, or the older one)."""
    if args.command != "train":
        return None
    try:
        from jax_scan_rnn import checkpoint
        from jax_scan_rnn.runlog import CHECKPOINT_DIR, METRICS_FILE, read_rows

        # A save the interrupt cut short is committed by orbax but has no manifest yet: resume skips it.
        done = checkpoint.steps(Path(args.out) / CHECKPOINT_DIR, manifested=True)
        logged = bool(read_rows(Path(args.out) / METRICS_FILE))
    except Exception:  # noqa: BLE001 (Ctrl-C came while JAX was still being imported: nothing was trained)
        return None
    if done:
        return f"every completed checkpoint is kept, the last at step {done[-1]} (continue with --resume)"
    return (f"no checkpoint was written yet (--checkpoint-every {args.checkpoint_every}): nothing to resume"
            + (f"; its log is kept ({METRICS_FILE}: --resume there starts again from step 0)" if logged else ""))


# A file system that refuses a read or a write mid-run (full, over quota, read-only, failing, a file's permissions):
# one line naming the file, not a traceback.
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.EACCES, errno.EPERM)


def backend_error(err: BaseException) -> str | None:
    """The line that says JAX could not start the platform `JAX_PLATFORMS` names (its GPU build not installed, a
    misspelt name), or None for any other error. JAX raises it where it starts its backends, as a RuntimeError,
    or for `cuda` without JAX's CUDA build as a bare AssertionError (JAX 0.10); where an array operation started
    them, from its dispatch, with xla_bridge's frames cut from the traceback: asking for the devices again tells."""
    if not isinstance(err, (RuntimeError, AssertionError)):
        return None
    import traceback

    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as again:
        frames = traceback.extract_tb(again.__traceback__)
        if not (frames and Path(frames[-1].filename).name == "xla_bridge.py"):
            return None
        err = again
    else:
        return None
    detail = str(err).split(" (set JAX_PLATFORMS", 1)[0].strip() or f"{type(err).__name__} in JAX's xla_bridge"
    return (f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}: JAX could not start it ({detail}); install "
            "JAX's build for that device (a GPU: pip install -e '.[cuda12]', see the README's GPU section), or unset "
            "JAX_PLATFORMS to use the devices JAX finds (jax-scan-rnn info lists them)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    printable_stdout()
    try:
        args = build_parser(argv).parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while a model's options import JAX (seconds): one line, as in a command
        print("\njax-scan-rnn: interrupted", file=sys.stderr)
        return 130
    args.given = given_options(argv)  # refuse_unread's
    name = f"{args.command} {args.model}" if getattr(args, "model", None) else args.command
    with warnings.catch_warnings():  # put back as they were on return (a caller's, a test's)
        # A warning of the library's (a price column given as returns) is one line naming the command, not a
        # source line of the package's; one that names an option's field ("init_from: ...") names its flag
        warnings.showwarning = lambda message, *_, **__: print(
            f"jax-scan-rnn {name}: warning: {flagged(str(message), only=vars(args))}", file=sys.stderr)
        return run_command(name, args)


def printable_stdout() -> None:
    """The process's stdout writes what its encoding lacks as a backslash escape (as stderr does), not raising.

    Output names the user's columns and assets (`data ...: assets Rendite_€, ÅBO`). Redirected to a file or a pipe
    on Windows, stdout is in the locale's encoding (cp1252): a name outside it raised UnicodeEncodeError, and the
    command stopped with an error naming no flag. A stream a caller put in its place (a test's) is left alone."""
    # surrogateescape: Python's choice in the C locale, which raises as strict does for a character it lacks
    if sys.stdout is sys.__stdout__ and getattr(sys.stdout, "errors", None) in ("strict", "surrogateescape"):
        with contextlib.suppress(AttributeError, ValueError):  # not a TextIOWrapper, or closed
            sys.stdout.reconfigure(errors="backslashreplace")


def loaded(module: str, name: str) -> type[Exception] | tuple[()]:
    """The exception class `module.name` where `module` is imported, else `()`, which `isinstance` matches with
    nothing."""
    return getattr(sys.modules.get(module), name, ())


class AnnounceJax:
    """An import hook (on `sys.meta_path`) that prints "jax-scan-rnn NAME: starting (loading JAX)..." once, the
    moment JAX begins to load, and removes itself. Importing JAX (and torch) takes seconds: a person at a terminal
    sees at once that the command runs; a command refused on its options before any work says only its error."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname: str, path=None, target=None) -> None:  # importlib's MetaPathFinder protocol
        if fullname == "jax":
            self.remove()
            print(f"jax-scan-rnn {self.name}: starting (loading JAX)...", file=sys.stderr, flush=True)
        return None  # the import itself is left to the other finders

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def run_command(name: str, args: argparse.Namespace) -> int:
    """The command `name` with its parsed `args`: its exit code, an error as one line (`main`)."""
    announce = AnnounceJax(name)
    if sys.stderr.isatty() and "jax" not in sys.modules:
        sys.meta_path.insert(0, announce)
    try:
        return run_and_report(name, args)
    finally:
        announce.remove()


def run_and_report(name: str, args: argparse.Namespace) -> int:
    """`run_command`'s work: the command's exit code, its error as one line."""
    if name != "bench":  # the benchmark times compiles: they must not come from the cache
        from jax_scan_rnn import xla_flags

        try:
            xla_flags.use_cli_compilation_cache()
        except (OSError, ImportError) as err:  # a speed-up only: the command runs, compiling as usual
            print(f"jax-scan-rnn {name}: note: compilation cache off: {err}; {xla_flags.CACHE_ENV}=DIR moves it, "
                  "=0 turns it off", file=sys.stderr)
    try:
        return COMMANDS[name](args)
    except KeyboardInterrupt:  # for a training run, also what it left (`kept`)
        left = kept(args)
        print(f"\njax-scan-rnn {name}: interrupted" + (f"; {left}" if left else ""), file=sys.stderr)
        return 130
    except Exception as err:
        # Classes of modules that import JAX, taken only where loaded: an error raised before (a bad argument) is not
        # one of them, and its line comes without importing JAX
        checkpoint_error = loaded("jax_scan_rnn.checkpoint", "CheckpointError")
        non_finite_loss = loaded("jax_scan_rnn.train", "NonFiniteLossError")
        training_stopped = loaded("jax_scan_rnn.train", "TrainingStopped")
        if isinstance(err, non_finite_loss):
            print(f"jax-scan-rnn {name}: error: {err}", file=sys.stderr)
            return 1
        if isinstance(err, training_stopped):
            print(f"\njax-scan-rnn {name}: stopped by SIGTERM at step {err.step}; checkpoint {err.checkpoint} written: "
                  "the same command with --resume continues from it", file=sys.stderr)
            return 128 + 15  # the status of a process SIGTERM ended
        if isinstance(err, OSError) and err.errno in DISK_ERRORS:
            where = f" ({err.filename})" if err.filename else ""
            left = kept(args)
            print(f"jax-scan-rnn {name}: error: {err.strerror}{where}" + (f"; {left}" if left else ""), file=sys.stderr)
            return 1
        if isinstance(err, MemoryError) or "RESOURCE_EXHAUSTED" in str(err):  # NumPy's, or XLA's on any device
            what = (str(err).strip().splitlines() or [type(err).__name__])[0]
            print(f"jax-scan-rnn {name}: error: out of memory ({what}); choose smaller sizes (--help lists them)",
                  file=sys.stderr)
            return 1
        no_backend = backend_error(err)
        if no_backend is not None:
            print(f"jax-scan-rnn {name}: error: {no_backend}", file=sys.stderr)
            return 2
        if not isinstance(err, (ValueError, TypeError, KeyError, FileNotFoundError, ImportError, checkpoint_error)):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"jax-scan-rnn {name}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
