"""What `TrainStep` pays per call for holding a Ctrl-C until its new carry is kept (`train._SigintHold`).

    python benchmarks/sigint_hold.py                                                     # ~2 minutes on 2 cores
    python benchmarks/sigint_hold.py --out benchmarks/results/sigint-hold-cpu-2core.txt

A loop's first step installs the holding SIGINT handler, `TrainStep.write` (the loop's end) puts Python's back;
each step in between looks at the installed handler (one `getsignal`) and sets two flags. Three arms, on
`jsr.Traveller` train steps (value, gradient and Adam over the mean squared positions), taking turns in `--rounds`
rounds of `--calls` calls each, after warm-up; each figure is the median over the rounds of the round's mean time
per call (the calls dispatched back to back, as a training loop does, then waited for):

    no hold      the step's call with the hold swapped for one that does nothing (the call before the hold)
    held         the call as shipped: the handler installed once, looked at and two flags set per step
    per call     the handler installed and put back around every call (two signal calls per step: not shipped)

Sizes: the smallest step (B=1, T=4, H=8), where the hold's cost shows most, and example 02's (B=64, T=128, H=32).

Then what the hold is for: `--interrupts` times, a loop of one's own runs steps back to back (B=16, T=64, H=32)
until a SIGINT sent from a timer 10-100 ms later stops it, and the trial counts as lost when no live carry is
left: without the hold, the loop's `carry` (donated when the interrupt landed inside the call); with it, `carry`
or `step.latest`.

`--notebook N` (needs `pip install ipykernel jupyter_client`): the same in a Jupyter kernel, where a first cell
starts the loop and each of N later cells goes on with it until the kernel is interrupted (the notebook's stop
button) 0.3-0.75 s in. The kernel puts Python's own SIGINT handler back before every cell, so only a hold that
each step installs again, where Python's is back, holds there.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jax_scan_rnn as jsr
from jax_scan_rnn import train
from jax_scan_rnn.train import TrainStep

SIZES = ((1, 4, 8), (64, 128, 32))  # (B, T, H)


class _NoHold:
    """A `_SigintHold` that holds nothing: installs no handler, so every call takes the unheld path."""

    def hold(self) -> bool:
        return False

    def uninstall(self) -> None:
        pass


def loss_fn(model, x):
    positions, _ = model(x)
    return jnp.mean(positions**2), {}


def measure(batch: int, steps: int, hidden: int, rounds: int, calls: int) -> dict[str, float]:
    """Median over rounds of each arm's mean seconds per call."""
    model = jsr.Traveller(8, hidden, 2, 0.0, rngs=nnx.Rngs(0))
    x = jnp.ones((batch, steps, 8), jnp.float32)
    step = TrainStep(model, loss_fn, optax.adam(1e-3), x)
    carry = step.init()
    for _ in range(20):
        carry = step(carry, x)
    jax.block_until_ready(carry)
    shipped, times = train._SIGINT, {"no hold": [], "held": [], "per call": []}
    try:
        for _ in range(rounds):
            for arm in times:
                train._SIGINT = _NoHold() if arm == "no hold" else shipped
                start = time.perf_counter()
                for _ in range(calls):
                    carry = step(carry, x)
                    if arm == "per call":
                        shipped.uninstall()  # the next call installs it again
                jax.block_until_ready(carry)
                times[arm].append((time.perf_counter() - start) / calls)
                shipped.uninstall()
    finally:
        train._SIGINT = shipped
    return {arm: statistics.median(values) for arm, values in times.items()}


def lost_carries(trials: int, hold: bool) -> int:
    """Of `trials` Ctrl-Cs in a loop of steps, how many left no live carry to write."""
    model = jsr.Traveller(8, 32, 2, 0.0, rngs=nnx.Rngs(0))
    x = jnp.ones((16, 64, 8), jnp.float32)
    step = TrainStep(model, loss_fn, optax.adam(1e-3), x)
    shipped, lost = train._SIGINT, 0
    train._SIGINT = shipped if hold else _NoHold()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        carry = step(step.init(), x)
        for _ in range(trials):
            threading.Timer(random.uniform(0.01, 0.1), os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                while True:
                    carry = step(carry, x)
            except KeyboardInterrupt:
                pass
            live = [c for c in (carry, step.latest if hold else None) if train._live(c)]
            lost += not live
            carry = live[0] if live else step.init()
            step.write(carry)
    finally:
        train._SIGINT = shipped
        signal.signal(signal.SIGINT, previous)
    return lost


NOTEBOOK_FIRST_CELL = """
import jax.numpy as jnp, optax
from flax import nnx
import jax_scan_rnn as jsr
from jax_scan_rnn import train
model = jsr.Traveller(8, 32, 2, 0.0, rngs=nnx.Rngs(0))
x = jnp.ones((16, 64, 8), jnp.float32)
step = train.TrainStep(model, lambda m, x: (jnp.mean(m(x)[0] ** 2), {}), optax.adam(1e-3), x)
carry = step.init()
for _ in range(3):
    carry = step(carry, x)
"""
NOTEBOOK_LOOP_CELL = "while True:\n    carry = step(carry, x)\n"
NOTEBOOK_CHECK_CELL = ("live = [c for c in (carry, step.latest) if train._live(c)]\nprint(len(live))\n"
                       "carry = live[0] if live else step.init()\n")


def notebook_lost(trials: int) -> int:
    """Of `trials` interrupts of a Jupyter kernel's cell going on with a loop an earlier cell started, how many
    left no live carry."""
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError:
        sys.exit("--notebook needs a Jupyter kernel: pip install ipykernel jupyter_client")
    manager, client = start_new_kernel(kernel_name="python3")

    def run(code: str) -> str:  # one cell, to its end: what it printed
        msg_id, printed = client.execute(code), []
        while True:
            msg = client.get_iopub_msg(timeout=300)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                printed.append(msg["content"]["text"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(printed)

    try:
        run(NOTEBOOK_FIRST_CELL)
        lost = 0
        for trial in range(trials):
            timer = threading.Timer(0.3 + 0.45 * trial / max(trials - 1, 1), manager.interrupt_kernel)
            timer.start()
            run(NOTEBOOK_LOOP_CELL)
            timer.join()
            lost += run(NOTEBOOK_CHECK_CELL).strip() == "0"
        return lost
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--interrupts", type=int, default=40, help="Ctrl-Cs sent to a loop, with and without the hold")
    parser.add_argument("--notebook", type=int, default=0, metavar="N", help="also N interrupts of a Jupyter "
                        "kernel's later cells (pip install ipykernel jupyter_client)")
    parser.add_argument("--out", type=Path, help="append the table to this text file")
    args = parser.parse_args(argv)
    for name in ("rounds", "calls", "interrupts"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name}: expected an int >= 1, got {getattr(args, name)}")
    if args.notebook < 0:
        parser.error(f"argument --notebook: expected an int >= 0, got {args.notebook}")
    notebook = f" --notebook {args.notebook}" if args.notebook else ""
    lines = [f"# python benchmarks/sigint_hold.py --rounds {args.rounds} --calls {args.calls}{notebook}",
             f"# jax {jax.__version__}, backend {jax.default_backend()}, {time.strftime('%Y-%m-%d')}",
             "    B     T    H  no hold us   held us   (+us)  per call us   (+us)"]
    for batch, steps, hidden in SIZES:
        t = {arm: s * 1e6 for arm, s in measure(batch, steps, hidden, args.rounds, args.calls).items()}
        base, held, per_call = t["no hold"], t["held"], t["per call"]
        lines.append(f"{batch:5d} {steps:5d} {hidden:4d} {base:11.1f} {held:9.1f} ({held - base:+6.1f}) "
                     f"{per_call:12.1f} ({per_call - base:+6.1f})")
    random.seed(0)
    lines += [f"# Ctrl-Cs in a loop of one's own (B=16, T=64, H=32) that left no live carry: "
              f"without the hold {lost_carries(args.interrupts, False)} of {args.interrupts}, "
              f"with it {lost_carries(args.interrupts, True)} of {args.interrupts}"]
    if args.notebook > 0:
        lines += [f"# interrupts of a Jupyter kernel's later cells going on with one loop (B=16, T=64, H=32) that left "
                  f"no live carry: {notebook_lost(args.notebook)} of {args.notebook}"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
