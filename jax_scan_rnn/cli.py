"""The `jax-scan-rnn` command line.

    jax-scan-rnn --version
    jax-scan-rnn info                 # devices and library versions
    jax-scan-rnn check                # parity self-check against torch.nn on random weights

Errors in arguments or data (ValueError, TypeError, KeyError, FileNotFoundError) are printed as one
line on stderr and exit with code 2, like argparse's own usage errors.
"""
from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable, Sequence

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
    import torch
    from flax import nnx

    import jax_scan_rnn as jsr
    import torch_ref

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    ok = True
    print(f"{'model':<6} {'layers':>6} {'T':>5} {'max |out diff|':>15} {'max |state diff|':>17} {'round trip':>10}")
    for name in ("LSTM", "GRU"):
        for layers in (1, 2):
            ref = getattr(torch_ref, name)(8, 32, layers)
            ours = getattr(jsr, name)(8, 32, layers, rngs=nnx.Rngs(args.seed))
            jsr.load_torch_state_dict(ours, ref.state_dict())
            x = rng.standard_normal((4, args.steps, 8)).astype(np.float32)
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


def build_parser() -> argparse.ArgumentParser:
    from jax_scan_rnn import __version__

    parser = argparse.ArgumentParser(
        prog="jax-scan-rnn", description="Feedback recurrent networks in JAX, driven by lax.scan."
    )
    parser.add_argument("--version", action="version", version=f"jax-scan-rnn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", help="devices and library versions")
    check = sub.add_parser("check", help="parity self-check against torch.nn on random weights")
    check.add_argument("--steps", type=int, default=500, help="sequence length T (default: 500)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, TypeError, KeyError, FileNotFoundError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"jax-scan-rnn {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
