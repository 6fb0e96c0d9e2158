"""The `jax-scan-rnn` command line.

    jax-scan-rnn --version
    jax-scan-rnn info                 # devices and library versions
    jax-scan-rnn check                # parity self-check against torch.nn on random weights
    jax-scan-rnn train traveller      # train the position-feedback LSTM on the simulated market
    jax-scan-rnn evaluate traveller --checkpoint runs/traveller
    jax-scan-rnn train vae            # the SMILES sequence VAE (teacher forcing; --decoding scheduled)
    jax-scan-rnn sample vae --checkpoint runs/vae -n 1000
    jax-scan-rnn evaluate vae --checkpoint runs/vae
    jax-scan-rnn bench [--quick]      # scan vs loop timings, tables and plots

Errors in arguments or data (ValueError, TypeError, KeyError, FileNotFoundError) are printed as one
line on stderr and exit with code 2, like argparse's own usage errors.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from jax_scan_rnn import options
from jax_scan_rnn.optional import available

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


@command("check")
def cmd_check(args: argparse.Namespace) -> int:
    """Random torch.nn.LSTM/GRU -> convert -> compare outputs, final states and a weight round trip."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import jax_scan_rnn as jsr
    from jax_scan_rnn.optional import require

    torch = require("torch", "the parity check (it compares against torch.nn)")
    import torch_ref

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    ok = True
    print(f"{'model':<6} {'layers':>6} {'T':>5} {'max |out diff|':>15} {'max |state diff|':>17} {'round trip':>10}")
    for name in ("LSTM", "GRU"):
        for layers in (1, 2):
            # torch's defaults on both sides, as a user writes them: time-major x [T, B, I].
            ref = getattr(torch_ref, name)(8, 32, layers)
            ours = getattr(jsr, name)(8, 32, layers, rngs=nnx.Rngs(args.seed))
            jsr.load_torch_state_dict(ours, ref.state_dict())
            x = rng.standard_normal((args.steps, 4, 8)).astype(np.float32)
            with torch.no_grad():
                t_out, t_state = ref(torch.from_numpy(x))
            j_out, j_state = ours(jnp.asarray(x))
            out_err = float(np.abs(t_out.numpy() - np.asarray(j_out)).max())
            t_leaves = t_state if isinstance(t_state, tuple) else (t_state,)
            j_leaves = j_state if isinstance(j_state, tuple) else (j_state,)
            state_err = max(float(np.abs(t.numpy() - np.asarray(j)).max()) for t, j in zip(t_leaves, j_leaves))
            back = jsr.torch_state_dict(ours)
            exact = all(np.array_equal(back[k], v.numpy()) for k, v in ref.state_dict().items())
            ok &= out_err <= 1e-5 and state_err <= 1e-5 and exact
            print(f"{name:<6} {layers:>6} {args.steps:>5} {out_err:>15.2e} {state_err:>17.2e} {str(exact):>10}")
    print("parity self-check:", "PASSED" if ok else "FAILED (float32 tolerance 1e-5)")
    return 0 if ok else 1


class ProgressBar:
    """`fit` callback: a tqdm bar over optimiser steps, with the latest loss and evaluation."""

    def __init__(self):
        from tqdm import tqdm

        self.tqdm = tqdm
        self.bar = None
        self.postfix: dict[str, str] = {}

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
            print(f"skipped invalid checkpoint {event['step']}: {event['reason']}; kept as {event['moved_to']}",
                  file=sys.stderr)
        elif kind == "plot_skipped":
            print(f"{event['path']} not drawn: {event['reason']}", file=sys.stderr)
        elif kind == "checkpoint_stray_files":
            print(f"checkpoint {event['step']} holds files it did not write (left alone, not read): "
                  f"{', '.join(event['files'])} in {event['path']}", file=sys.stderr)
        elif kind == "end" and self.bar is not None:
            self.bar.close()


def train_config(args: argparse.Namespace):
    """The training options as a TrainConfig, checked (with --resume/--override) before any work."""
    from jax_scan_rnn.train import TrainConfig

    if args.override and not args.resume:
        raise ValueError("--override: expected only with --resume (it accepts changed options of a resumed run)")
    warmup = min(100, args.steps // 10) if args.warmup_steps is None else args.warmup_steps
    with flag_names():  # "TrainConfig.warmup_steps: expected at most steps=10" -> the flags' names
        return options.from_args(TrainConfig, args, warmup_steps=warmup)


@contextlib.contextmanager
def output_directory(out: Path, resume: bool):
    """Hold `--out` for this run (training, evaluation, plots): one writer per run directory (`lock.py`), and
    a finished or running run there is never overwritten without --resume."""
    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.lock import run_lock
    from jax_scan_rnn.train import CHECKPOINT_DIR

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
        done = checkpoint.steps(out / CHECKPOINT_DIR)
        if done and not resume:
            raise ValueError(f"--out: {out} already holds a run (checkpoints at steps {done}); pass --resume to "
                             "continue it, or choose another --out")
        yield


def check_output_file(path: str | None) -> None:
    """`--output` must be a file we can write (checked before any work, so nothing is computed in vain)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"--output: expected a file path, got the directory {target}")
    if not target.parent.is_dir():
        raise ValueError(f"--output: the directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"--output: cannot write {target} (permission denied)")


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
    from jax_scan_rnn.train import TrainConfig

    return options.flag(TrainConfig, field)


@contextlib.contextmanager
def flag_names():
    """Turn a task's `field: ...` (or `TrainConfig.field: ...`) ValueError into `--field: ...`: the CLI's
    user knows the flag, not the field."""
    try:
        yield
    except ValueError as err:
        message = str(err)
        head, sep, rest = message.partition(":")
        field = head.removeprefix("TrainConfig.")
        if sep and field.isidentifier():  # "expected at most steps=10" names another field: its flag too
            rest = re.sub(r"\b([a-z_]+)=", lambda m: f"{flag_for(m.group(1))} ", rest)
            message = f"{flag_for(field)}:{rest}"
        raise ValueError(message) from None


def _flat(settings: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resume(out: Path, args: argparse.Namespace, task: dict, cfg) -> None:
    """--resume: the settings saved with the run against this command's. A difference is refused, naming each
    changed option, unless --override is given; then the changes are printed and training continues."""
    from jax_scan_rnn import checkpoint
    from jax_scan_rnn.train import CHECKPOINT_DIR

    if not args.resume:
        return
    saved = None
    for step in reversed(checkpoint.steps(out / CHECKPOINT_DIR)):  # the newest that verifies, as fit resumes
        try:
            saved = checkpoint.read_metadata(out / CHECKPOINT_DIR, step)
            break
        except checkpoint.CheckpointError:
            continue
    if saved is None:
        return  # nothing to resume: a fresh start
    # JSON round trip: the saved settings are JSON (tuples became lists), the new ones must compare alike.
    before = {flag_for(k): v for k, v in _flat({**saved.get("task", {}), **saved.get("train_config", {})}).items()}
    now = {flag_for(k): v for k, v in _flat(json.loads(json.dumps({**task, **dataclasses.asdict(cfg)}))).items()}
    changed = [f"{name} {before[name]!r} -> {now[name]!r}" for name in now if name in before and before[name] != now[name]]
    if not changed:
        return
    if not args.override:
        raise ValueError(f"--resume: the run in {out} was started with other settings ({'; '.join(changed)}); "
                         "give the same options, or add --override to continue with the new ones")
    print(f"resuming with changed settings (--override): {'; '.join(changed)}")


def run_directory(text: str) -> Path:
    """`--checkpoint`: a training run's output directory (train's --out), with a hint for the usual slip of
    naming one of its step folders instead."""
    from jax_scan_rnn.checkpoint import step_of
    from jax_scan_rnn.train import CHECKPOINT_DIR

    path = Path(text)
    if step_of(path) is not None and path.parent.name == CHECKPOINT_DIR:
        raise FileNotFoundError(f"--checkpoint: expected the run directory (train's --out), got its checkpoint folder "
                                f"{path}; pass --checkpoint {path.parent.parent} --step {step_of(path)}")
    if not path.is_dir():
        raise FileNotFoundError(f"--checkpoint: expected a training output directory (train's --out), got {path}")
    return path


def first_process() -> bool:
    import jax

    return jax.process_index() == 0


def data_parallel(args: argparse.Namespace, batch_size: int):
    from jax_scan_rnn.distributed import DataParallel, initialize_multihost

    if args.multihost:
        initialize_multihost()
        if not first_process():  # the first process speaks (and writes) for the run; errors still reach stderr
            sys.stdout = open(os.devnull, "w")
    dp = DataParallel.create(args.devices)
    dp.check_batch_size(batch_size)
    return dp


@command("train traveller")
def cmd_train_traveller(args: argparse.Namespace) -> int:
    from jax_scan_rnn.tasks import traveller as task_lib

    with flag_names():
        task = options.from_args(task_lib.TravellerTask, args)
    cfg = train_config(args)
    check_memory("the simulated training market (--seq-len)", task.data_bytes())
    out = Path(args.out)
    dp = data_parallel(args, task.batch_size)
    with output_directory(out, args.resume):
        check_resume(out, args, task.to_json(), cfg)
        print(f"training the Traveller ({task.objective} objective) for {args.steps} steps on {dp.size} device(s) "
              f"-> {out}")
        model, history = task_lib.train(
            task, cfg, out, resume=args.resume, callback=ProgressBar(),
            data_sharding=dp.data, state_sharding=dp.replicated,
        )
        table = task_lib.evaluate(model, task)  # every process computes: the model's arrays span them all
        plot = "not drawn (pip install 'jax-scan-rnn[plot]')"  # after training: report the missing extra
        if first_process():
            task_lib.save_table(table, out / "evaluation.json")
            if available("matplotlib"):
                plot = task_lib.plot_positions(model, task, out / "positions.png")
    print(f"\nout of sample: {task.eval_paths} held-out paths x {task.eval_steps} steps")
    print(task_lib.format_table(table))
    print(f"\nmetrics: {out / 'metrics.jsonl'}  curves: {out / 'curves.png'}  positions: {plot}")
    return 0


@command("evaluate traveller")
def cmd_evaluate_traveller(args: argparse.Namespace) -> int:
    from jax_scan_rnn.tasks import traveller as task_lib

    checkpoint = run_directory(args.checkpoint)
    model, task = task_lib.load(checkpoint, args.step)
    if args.paths is not None or args.horizon is not None:
        task = dataclasses.replace(
            task, eval_paths=args.paths or task.eval_paths, eval_steps=args.horizon or task.eval_steps
        )
    table = task_lib.evaluate(model, task)
    print(f"out of sample: {task.eval_paths} held-out paths x {task.eval_steps} steps")
    print(task_lib.format_table(table))
    target = Path(args.plot) if args.plot else checkpoint / "positions.png"
    try:  # after the table: a run folder that is read-only still gets its evaluation
        plot = task_lib.plot_positions(model, task, target)
    except OSError as err:
        raise ValueError(f"--plot: cannot write {target} ({err.strerror}); pass --plot FILE elsewhere") from None
    print(f"\npositions plot: {plot}")
    return 0


def vae_evaluation_banner(task, test_sequences: int) -> str:
    """Said before the final evaluation, which compiles and runs for tens of seconds without a step to count."""
    return (f"evaluating: reconstructing {min(task.eval_sequences, test_sequences)} test sequences, drawing "
            f"{task.eval_samples} prior samples twice (sampled and greedy), interpolating...")


def print_vae_report(report: dict) -> None:
    rec, latent = report["reconstruction"], report["latent"]
    print(f"{'reconstruction (decoding from mu)':<36} {'token acc':>10} {'sequence acc':>13}")
    print(f"{'  teacher-forced':<36} {rec['tf_token_acc']:>10.3f} {rec['tf_sequence_acc']:>13.3f}")
    print(f"{'  free-running (greedy)':<36} {rec['free_token_acc']:>10.3f} {rec['free_sequence_acc']:>13.3f}")
    for key, how in (("samples", "sampled, T=1"), ("samples_greedy", "greedy")):
        samples = report[key]
        print(f"prior samples, {how} (n={samples['n']}): valid {samples['validity']:.3f}  "
              f"unique {samples['uniqueness']:.3f}  novel {samples['novelty']:.3f}")
    print(f"latent: KL {latent['kl']:.2f} nats, active units {latent['active_units']} of {len(latent['kl_per_dim'])}")
    print("interpolation:", " -> ".join(report["interpolation"]["path"][:: max(1, len(report["interpolation"]["path"]) // 4)]))


@command("train vae")
def cmd_train_vae(args: argparse.Namespace) -> int:
    from jax_scan_rnn.data import smiles
    from jax_scan_rnn.tasks import vae as task_lib

    if not args.smiles_check and smiles.is_builtin_source(args.data):
        raise ValueError(f"--no-smiles-check: expected only with a --data file that is not chemistry, got --data "
                         f"{args.data}, a built-in source (always SMILES)")
    with flag_names():
        task = options.from_args(task_lib.VAETask, args)
    cfg = train_config(args)
    out = Path(args.out)
    dp = data_parallel(args, task.batch_size)
    dataset = task_lib.load_dataset(task)
    skipped = ", ".join(f"{k} {v}" for k, v in dataset.skipped.items()) or "none"
    print(f"data {task.data}: {len(dataset.train)} train / {len(dataset.valid)} valid / {len(dataset.test)} test "
          f"sequences, vocabulary {dataset.vocab.size}; skipped: {skipped}")
    with output_directory(out, args.resume):
        check_resume(out, args, dataclasses.asdict(task), cfg)
        print(f"training the VAE ({task.decoding} decoding) for {args.steps} steps on {dp.size} device(s) -> {out}")
        model, dataset, _ = task_lib.train(
            task, cfg, out, resume=args.resume, callback=ProgressBar(), dataset=dataset,
            data_sharding=dp.data, state_sharding=dp.replicated,
        )
        print(vae_evaluation_banner(task, len(dataset.test)), flush=True)
        report = task_lib.evaluate(model, dataset, task, seed=args.seed)
        if first_process():
            (out / "evaluation.json").write_text(json.dumps(report, indent=2) + "\n")
    print()
    print_vae_report(report)
    print(f"\nmetrics: {out / 'metrics.jsonl'}  curves: {out / 'curves.png'}  report: {out / 'evaluation.json'}")
    return 0


def load_vae(args: argparse.Namespace):
    from jax_scan_rnn.tasks import vae as task_lib

    return task_lib.load(run_directory(args.checkpoint), args.step)


@command("sample vae")
def cmd_sample_vae(args: argparse.Namespace) -> int:
    from jax_scan_rnn import metrics
    from jax_scan_rnn.tasks import vae as task_lib

    check_output_file(args.output)
    model, vocab, task = load_vae(args)
    model.eval()
    with flag_names():  # the sampler's own checks ("top_k: ...") name the flag
        generated = task_lib.sample(model, vocab, args.n, max_len=task.max_length + 1, seed=args.seed,
                                    temperature=args.temperature, top_k=args.top_k, greedy=args.greedy)
    if args.output:
        Path(args.output).write_text("\n".join(generated) + "\n")
    else:
        print("\n".join(generated))
    if task.data in ("rdkit", "moses"):
        print(f"valid {metrics.validity(generated):.3f}  unique {metrics.uniqueness(generated):.3f}", file=sys.stderr)
    return 0


@command("evaluate vae")
def cmd_evaluate_vae(args: argparse.Namespace) -> int:
    from jax_scan_rnn.tasks import vae as task_lib

    check_output_file(args.output)
    model, vocab, task = load_vae(args)
    dataset = task_lib.load_dataset(task)
    if dataset.vocab != vocab:
        raise ValueError(f"--checkpoint: its vocabulary differs from the one rebuilt from {task.data!r}")
    task = dataclasses.replace(task, eval_samples=args.n)
    print(vae_evaluation_banner(task, len(dataset.test)), flush=True)
    report = task_lib.evaluate(model, dataset, task)
    print_vae_report(report)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return 0


@command("bench")
def cmd_bench(args: argparse.Namespace) -> int:
    from jax_scan_rnn import bench

    return bench.run(args)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def add_train_arguments(parser: argparse.ArgumentParser, task: type, defaults: dict, out: str) -> None:
    """The task's options, then TrainConfig's (with this command's defaults), then the run's own flags."""
    from jax_scan_rnn.train import TrainConfig

    options.add_arguments(parser.add_argument_group("model and data"), task)
    group = parser.add_argument_group("training")
    options.add_arguments(group, TrainConfig, {"log_every": 25, "eval_every": 250, "checkpoint_every": 250,
                                               "warmup_steps": None, **defaults},
                          shown={"warmup_steps": "min(100, steps / 10)"})
    group.add_argument("--out", default=out, help=f"output directory (default: {out})")
    group.add_argument("--resume", action="store_true", help="continue from the latest valid checkpoint in --out")
    group.add_argument("--override", action="store_true",
                       help="with --resume: continue even if options differ from the run's saved ones (listed)")
    group.add_argument(
        "--devices", type=positive_int, default=None,
        help="data-parallel over this many devices: the batch is split, parameters replicated (default: all)",
    )
    group.add_argument(
        "--multihost", action="store_true",
        help="call jax.distributed.initialize() first (run the same command on every host; see README)",
    )


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and where to look) instead of the whole usage block first."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line. The options of `train ...` and `bench` come from modules that import JAX, so they are
    added only when `argv` names that command: `--version`, `--help` and the other commands start at once."""
    from jax_scan_rnn import __version__

    words = [a for a in argv if not a.startswith("-")][:2]
    parser = Parser(prog="jax-scan-rnn", description="Feedback recurrent networks in JAX, driven by lax.scan.")
    parser.add_argument("--version", action="version", version=f"jax-scan-rnn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    sub.add_parser("info", help="devices and library versions")
    check = sub.add_parser("check", help="parity self-check against torch.nn on random weights")
    check.add_argument("--steps", type=positive_int, default=500, help="sequence length T (default: 500)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    bench_parser = sub.add_parser("bench", help="time scan against every kind of loop (benchmarks/)")
    if words[:1] == ["bench"]:
        from jax_scan_rnn import bench

        bench.add_arguments(bench_parser)

    train = sub.add_parser("train", help="train a model").add_subparsers(dest="model", required=True, metavar="MODEL")
    trav = train.add_parser("traveller", help="the position-feedback LSTM on the simulated market")
    if words == ["train", "traveller"]:
        from jax_scan_rnn.tasks.traveller import TravellerTask

        add_train_arguments(trav, TravellerTask, {"steps": 1000, "learning_rate": 3e-3}, out="runs/traveller")
    vae = train.add_parser("vae", help="the SMILES sequence VAE (GRU encoder/decoder, teacher forcing or scheduled "
                                       "sampling)")
    if words == ["train", "vae"]:
        from jax_scan_rnn.tasks.vae import LEARNING_RATE, VAETask

        add_train_arguments(vae, VAETask, {"steps": 1200, "learning_rate": LEARNING_RATE}, out="runs/vae")

    sample = sub.add_parser("sample", help="generate from a trained model").add_subparsers(
        dest="model", required=True, metavar="MODEL"
    )
    sv = sample.add_parser("vae", help="SMILES from the prior z ~ N(0, I), in one jitted call")
    sv.add_argument("--checkpoint", required=True, help="the training output directory (--out of train)")
    sv.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    sv.add_argument("-n", type=positive_int, default=1000, help="number of samples (default: 1000)")
    sv.add_argument("--temperature", type=positive_float, default=1.0, help="sampling temperature (default: 1.0)")
    sv.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (default: 0, off)")
    sv.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    sv.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    sv.add_argument("--output", default=None, help="write the samples here, one per line (default: stdout)")

    evaluate = sub.add_parser("evaluate", help="evaluate a trained model").add_subparsers(
        dest="model", required=True, metavar="MODEL"
    )
    ev = evaluate.add_parser("traveller", help="out-of-sample utility table and a positions plot")
    ev.add_argument("--checkpoint", required=True, help="the training output directory (--out of train)")
    ev.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    ev.add_argument("--paths", type=positive_int, default=None, help="held-out paths (default: the task's)")
    ev.add_argument("--horizon", type=positive_int, default=None, help="steps per held-out path")
    ev.add_argument("--plot", default=None, help="positions plot path (default: CHECKPOINT/positions.png)")
    ev = evaluate.add_parser("vae", help="reconstruction, prior-sample validity/uniqueness/novelty, KL, interpolation")
    ev.add_argument("--checkpoint", required=True, help="the training output directory (--out of train)")
    ev.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    ev.add_argument("-n", type=positive_int, default=1000, help="prior samples (default: 1000)")
    ev.add_argument("--output", default=None, help="also write the report as JSON here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    name = f"{args.command} {args.model}" if getattr(args, "model", None) else args.command
    try:
        return COMMANDS[name](args)
    except KeyboardInterrupt:
        # Checkpoints are committed atomically: an interrupted save leaves the previous one intact.
        print(f"\njax-scan-rnn {name}: interrupted; every completed checkpoint is kept (continue with --resume)",
              file=sys.stderr)
        return 130
    except Exception as err:
        from jax_scan_rnn.checkpoint import CheckpointError  # here: importing them at start-up imports JAX
        from jax_scan_rnn.train import NonFiniteLossError

        if isinstance(err, NonFiniteLossError):
            print(f"jax-scan-rnn {name}: error: {err}", file=sys.stderr)
            return 1
        if not isinstance(err, (ValueError, TypeError, KeyError, FileNotFoundError, ImportError, CheckpointError)):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"jax-scan-rnn {name}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
