"""Measure the process-level choices of this project's scans: XLA's small-loop setting, `unroll`, hoisting.

    python benchmarks/tune_scan.py flag     # each config with and without the setting (two processes)
    python benchmarks/tune_scan.py flag --threshold 100000000   # ... with a larger threshold
    python benchmarks/tune_scan.py unroll   # time per step vs unroll, forward and train step
    python benchmarks/tune_scan.py unroll --out benchmarks/results/unroll-cpu-2core.json
    python benchmarks/tune_scan.py unroll-layers   # unroll 1 vs 2 at batch 1 for jsr.LSTM/GRU (no feedback)
    python benchmarks/tune_scan.py hoist    # features projected before the loop vs inside each step
    python benchmarks/tune_scan.py hoist-layers   # the same for jsr.LSTM/GRU over whole sequences, the VAE
    python benchmarks/tune_scan.py remat-dropout  # training memory with dropout on: masks per step vs [T] array
    python benchmarks/tune_scan.py opt-level      # compile and run time: XLA's LLVM -O3 (default) vs -O1
    python benchmarks/tune_scan.py compile-options  # XLA options that shorten compiles, on top of the library's
    python benchmarks/tune_scan.py gemv           # batch-1 matrix-vector code: GEMV tiling x vector width
    python benchmarks/tune_scan.py gpu-compile    # on a GPU: compile and run time under XLA:GPU's autotuning options

`flag` backs the figures quoted in `jax_scan_rnn/xla_flags.py`; `unroll` the rule behind `unroll="auto"`
(`jax_scan_rnn/scan.py`, `AUTO_UNROLL_CPU_BATCH1`), `unroll-layers` the same rule for the layers without
feedback; `hoist` and `hoist-layers` the rule behind `hoist_inputs="auto"` (`scan.auto_hoist`). The model is
the Traveller (2 LSTM layers, F=8), a forward pass or a value-and-grad train step of a linear loss; `hoist-layers` times `jsr.LSTM`/`jsr.GRU`
(`HOIST_LAYER_CASES`, forward and gradient of a sum of squares) and the SeqVAE's teacher-forced decoder.
`remat-dropout` compiles (does not run) a Traveller train step with dropout on and reads XLA's temporary
memory: without remat, with remat chunks of ~sqrt(T) and each step's masks drawn in the loop (the library),
and with remat but the `[L-1, T, B, H]` mask array passed in (how dropout worked before).
`opt-level` backs `xla_flags.CPU_COMPILER_OPTIONS`: each of `OPT_LEVEL_CASES` compiled at each level,
compile time (every round), warm time per step (arms interleaved), and the outputs' largest difference;
`compile-options` measures the same for `COMPILE_OPTION_ARMS`, each added to the library's options (none is kept).
`gemv` backs the GEMV settings of `jax_scan_rnn/xla_flags.py`: `GEMV_CASES` (the same cases, and the batch-1
Traveller at H=32 and H=128, whose matrix-vector products are 4x smaller and 4x larger), compiled as the library does
(-O1) under each `GEMV_TILINGS` (a process-wide XLA option: one process per value, rotated over `--rounds`
rounds) at each `VECTOR_WIDTHS` (a per-compile option: interleaved in the process).
`gpu-compile` compiles the same cases (and the Traveller at B=1024, generation at B=10,000) under each
`GPU_COMPILE_ARMS` (per-compile options, but each arm in a process of its own: XLA keeps autotuning results
per process); on a CPU it runs `CPU_CHECK_CASES` at tiny sizes, a check of the script.
Each figure: the minimum over 3 rounds (`hoist-layers` and `unroll`: 5 rounds, the arms interleaved) of the median
of n calls after warm-up calls, divided by T (us per time step). Runs on whatever JAX backend is present;
takes ~2-5 minutes per subcommand on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from jax_scan_rnn.cli import POSITIVE_INT
from timed_run import results_file  # this folder's script: the script's own directory is on sys.path

FLAG_CONFIGS = ["1x64", "1x128", "1x256", "1x64:f64", "1x256:f64", "4x64", "64x64", "8x128", "64x64:f64", "128x256"]
UNROLL_CONFIGS = ["1x64", "1x256", "8x64", "64x64", "64x256", "512x64"]
UNROLLS = (1, 2, 4, 8, 16)
HOIST_CONFIGS = ["1x64", "8x64", "64x64", "1024x64", "1x256", "64x256"]
# (kind, I, H, L, B, T, lengths): the VAE's encoder (one-hot V=40, B=128, T=60, with lengths), a deeper
# stack, wide inputs, and LSTMs from B=1 to B=1024.
HOIST_LAYER_CASES = [
    ("GRU", 40, 256, 1, 128, 60, True), ("GRU", 40, 256, 3, 128, 60, True), ("GRU", 256, 256, 2, 128, 60, False),
    ("LSTM", 8, 64, 2, 1, 1000, False), ("LSTM", 64, 64, 1, 64, 1000, False), ("LSTM", 64, 64, 2, 8, 1000, False),
    ("LSTM", 256, 256, 2, 64, 200, False), ("LSTM", 64, 64, 2, 1024, 100, False),
]


def _time_per_step(fn, args, steps: int) -> float:
    """us per time step of `fn(*args)`: min over 3 rounds of the median of n calls, after warm-up."""
    return _time_interleaved([(fn, args)], steps, rounds=3)[0]


def _time_interleaved(calls: list, steps: int, rounds: int = 5) -> list[float]:
    """us per step of each `(fn, args)` in `calls`, their rounds interleaved (A B A B ...) so that a drift
    in the machine's speed hits both arms of an A/B alike: min over rounds of the median of n calls, n
    chosen so that a round of the slowest lasts ~0.3 s (3 to 30 calls)."""
    import jax
    import numpy as np

    once = []
    for fn, args in calls:
        jax.block_until_ready(fn(*args))
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        once.append(time.perf_counter() - start)
    n = max(3, min(30, int(0.3 / max(max(once), 1e-6))))
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, (fn, args) in enumerate(calls):
            times = []
            for _ in range(n):
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times.append(time.perf_counter() - start)
            best[i] = min(best[i], float(np.median(times)))
    return [b / steps * 1e6 for b in best]


def _model(config: str, steps: int, hoist_inputs="auto"):
    """'BxH[:f64]' -> (params, rest, graphdef, x, r)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jax_scan_rnn as jsr

    shape, _, dtype_name = config.partition(":")
    batch, hidden = map(int, shape.split("x"))
    if dtype_name == "f64":
        jax.config.update("jax_enable_x64", True)
    dtype = jnp.float64 if dtype_name == "f64" else jnp.float32
    model = jsr.Traveller(8, hidden, 2, param_dtype=dtype, hoist_inputs=hoist_inputs, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    x = jax.random.normal(jax.random.key(1), (batch, steps, 8), dtype)
    r = jax.random.normal(jax.random.key(2), (batch, steps, 2), dtype)
    return graphdef, params, rest, x, r


def _functions(graphdef, rest, unroll):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def positions(p, x):
        return nnx.merge(graphdef, p, rest)(x, unroll=unroll)[0]

    def loss(p, x, r):
        return -jnp.mean(jnp.sum(positions(p, x) * r, -1))

    return jax.jit(positions), jax.jit(jax.value_and_grad(loss))


def _steps_for(config: str) -> int:
    batch = int(config.split("x")[0])
    return 1000 if batch <= 64 else 100


def flag_worker(configs: list[str]) -> list[dict]:
    """In this process (XLA_FLAGS already decided): forward and train time per step of each config."""
    import jax

    import jax_scan_rnn as jsr

    rows = []
    for config in configs:
        steps = _steps_for(config)
        graphdef, params, rest, x, r = _model(config, steps)
        fwd, train = _functions(graphdef, rest, 1)
        one_kernel = "xla_cpu_small_call" in fwd.lower(params, x).compile().as_text()
        rows.append({"config": config, "T": steps, "one_kernel": one_kernel, "xla_flags": jsr.xla_flags.status(),
                     "forward_us": _time_per_step(fwd, (params, x), steps),
                     "train_us": _time_per_step(train, (params, x, r), steps), "backend": jax.default_backend()})
    return rows


def run_flag(configs: list[str], threshold: int | None) -> list[dict]:
    """Each config in a process with the setting (the library's, or `threshold`) and one without."""
    from jax_scan_rnn.xla_flags import OPT_OUT_ENV, SMALL_LOOP_OPTION, with_backend_options

    results = []
    for arm in ("set", "default"):
        env = dict(os.environ, **{OPT_OUT_ENV: "1" if arm == "set" else "0"})
        if arm == "set" and threshold is not None:
            env["XLA_FLAGS"] = with_backend_options(env.get("XLA_FLAGS", ""), {SMALL_LOOP_OPTION: threshold})
        out = subprocess.run([sys.executable, __file__, "_flag_worker", *configs], env=env, capture_output=True,
                             text=True, check=True)
        results += [dict(row, arm=arm) for row in json.loads(out.stdout.strip().splitlines()[-1])]
    return results


def run_unroll(configs: list[str], rounds: int = 5) -> list[dict]:
    """Per config: each unroll compiled as the library compiles (`xla_flags.compiler_options()`), its compile
    time, and its warm forward and train times with the unrolls interleaved (a drift hits every arm alike)."""
    from jax_scan_rnn.xla_flags import compiler_options

    options = compiler_options()
    rows = []
    for config in configs:
        steps = _steps_for(config)
        graphdef, params, rest, x, r = _model(config, steps)
        compiled = {mode: {} for mode in ("forward", "train")}
        compile_s = {}
        for unroll in UNROLLS:
            fwd, train = _functions(graphdef, rest, unroll)
            compiled["forward"][unroll], compile_s[unroll] = _compile(fwd, (params, x), options)
            compiled["train"][unroll], _ = _compile(train, (params, x, r), options)
        forward = _time_interleaved([(compiled["forward"][u], (params, x)) for u in UNROLLS], steps, rounds)
        train = _time_interleaved([(compiled["train"][u], (params, x, r)) for u in UNROLLS], steps, rounds)
        for i, unroll in enumerate(UNROLLS):
            row = {"config": config, "T": steps, "unroll": unroll, "compile_s": compile_s[unroll],
                   "forward_us": forward[i], "train_us": train[i], "compiler_options": options}
            rows.append(row)
            print(f"{config:10s} T={steps:5d} unroll={unroll:2d}  forward {row['forward_us']:9.2f} us/step  "
                  f"train {row['train_us']:9.2f} us/step  forward compile {compile_s[unroll]:5.2f} s", flush=True)
    return rows


# (kind, I, H, L, B, T): jsr.LSTM/GRU over a given sequence (no feedback) at batch 1: the peers' rows' layers
# (H=64, 2 layers, F=8) and the VAE encoder's size (one-hot V=40, H=256, 1 layer).
UNROLL_LAYER_CASES = [("GRU", 8, 64, 2, 1, 1000), ("GRU", 8, 64, 2, 1, 100), ("LSTM", 8, 64, 2, 1, 1000),
                      ("LSTM", 8, 64, 2, 1, 100), ("GRU", 40, 256, 1, 1, 100), ("LSTM", 40, 256, 1, 1, 100)]
LAYER_UNROLLS = (1, 2)


def run_unroll_layers(rounds: int = 5) -> list[dict]:
    """Per `UNROLL_LAYER_CASES`: each of `LAYER_UNROLLS` compiled as the library compiles, forward and gradient
    of a sum of squares; the median compile over `rounds` (interleaved) and the interleaved warm times."""
    import statistics

    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jax_scan_rnn as jsr
    from jax_scan_rnn.xla_flags import compiler_options

    options = compiler_options()
    rows = []
    for kind, inputs, hidden, layers, batch, steps in UNROLL_LAYER_CASES:
        model = getattr(jsr, kind)(inputs, hidden, layers, rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        x = jax.random.normal(jax.random.key(1), (steps, batch, inputs))
        fns = {}
        for unroll in LAYER_UNROLLS:
            def forward(p, x, unroll=unroll):
                return nnx.merge(graphdef, p, rest)(x, unroll=unroll)[0]

            fns[unroll] = {"forward": forward,
                           "train": jax.value_and_grad(lambda p, x, f=forward: jnp.sum(f(p, x) ** 2))}
        compiled = {mode: {} for mode in ("forward", "train")}
        compile_s = {(mode, u): [] for mode in compiled for u in LAYER_UNROLLS}
        for _ in range(rounds):
            for unroll in LAYER_UNROLLS:
                for mode in compiled:
                    compiled[mode][unroll], seconds = _compile(fns[unroll][mode], (params, x), options)
                    compile_s[mode, unroll].append(seconds)
        warm = {mode: _time_interleaved([(compiled[mode][u], (params, x)) for u in LAYER_UNROLLS], steps, rounds + 2)
                for mode in compiled}
        for i, unroll in enumerate(LAYER_UNROLLS):
            case = f"{kind} I={inputs} H={hidden} L={layers} B={batch}"
            row = {"case": case, "T": steps, "unroll": unroll, "compiler_options": options,
                   **{f"{mode}_us": warm[mode][i] for mode in compiled},
                   **{f"{mode}_compile_s": statistics.median(compile_s[mode, unroll]) for mode in compiled}}
            rows.append(row)
            print(f"{case:26s} T={steps:5d} unroll={unroll}  forward {row['forward_us']:7.2f} us/step  train "
                  f"{row['train_us']:7.2f} us/step  compile forward {row['forward_compile_s']:5.3f} s  train "
                  f"{row['train_compile_s']:5.3f} s", flush=True)
    return rows


def run_hoist(configs: list[str]) -> list[dict]:
    import jax
    import numpy as np

    rows = []
    for config in configs:
        steps = _steps_for(config)
        out = {}
        for hoist in (True, False):
            graphdef, params, rest, x, r = _model(config, steps, hoist_inputs=hoist)
            fwd, train = _functions(graphdef, rest, 1)
            out[hoist] = np.asarray(fwd(params, x))
            row = {"config": config, "T": steps, "hoist_inputs": hoist, "backend": jax.default_backend(),
                   "forward_us": _time_per_step(fwd, (params, x), steps),
                   "train_us": _time_per_step(train, (params, x, r), steps)}
            rows.append(row)
        before, inside = rows[-2], rows[-1]
        diff = float(np.max(np.abs(out[True] - out[False])))
        print(f"{config:10s} T={steps:5d}  forward {before['forward_us']:9.2f} -> {inside['forward_us']:9.2f} us/step  "
              f"train {before['train_us']:9.2f} -> {inside['train_us']:9.2f} us/step  (hoisted -> inside; "
              f"max diff {diff:.1e})", flush=True)
    return rows


def run_hoist_layers() -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import jax_scan_rnn as jsr

    rows = []
    for kind, inputs, hidden, layers, batch, steps, with_lengths in HOIST_LAYER_CASES:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((batch, steps, inputs)), jnp.float32)
        lengths = jnp.asarray(rng.integers(steps // 2, steps + 1, batch)) if with_lengths else None
        arms = {}
        for hoist in (True, False):
            model = getattr(jsr, kind)(inputs, hidden, layers, batch_first=True, hoist_inputs=hoist, rngs=nnx.Rngs(0))
            graphdef, params, rest = nnx.split(model, nnx.Param, ...)

            def run(p, x, graphdef=graphdef, rest=rest):
                return nnx.merge(graphdef, p, rest)(x, lengths=lengths)[0]

            grad = jax.grad(lambda p, x, run=run: jnp.sum(run(p, x) ** 2))
            arms[hoist] = (jax.jit(run), jax.jit(grad), params)
        forward = _time_interleaved([(arms[h][0], (arms[h][2], x)) for h in (True, False)], steps)
        train = _time_interleaved([(arms[h][1], (arms[h][2], x)) for h in (True, False)], steps)
        outs = [np.asarray(fwd(params, x)) for fwd, _, params in arms.values()]
        diff = float(np.max(np.abs(outs[0] - outs[1])))
        case = f"{kind} I={inputs} H={hidden} L={layers} B={batch}"
        for i, hoist in enumerate((True, False)):
            rows.append({"case": case, "T": steps, "lengths": with_lengths, "hoist_inputs": hoist,
                         "backend": jax.default_backend(), "forward_us": forward[i], "train_us": train[i]})
        print(f"{case:28s} T={steps:5d}{' lengths' if with_lengths else ''}  forward {forward[0]:9.2f} -> "
              f"{forward[1]:9.2f} us/step  grad {train[0]:9.2f} -> {train[1]:9.2f} us/step  (hoisted -> inside; "
              f"max diff {diff:.1e})", flush=True)
    rows += _hoist_vae_decoder()
    return rows


def _hoist_vae_decoder(batch: int = 128, steps: int = 60) -> list[dict]:
    """SeqVAE.decode under teacher forcing (V=40, H=256, Z=64, one layer), forward."""
    import jax
    import numpy as np
    from flax import nnx

    import jax_scan_rnn as jsr

    rng = np.random.default_rng(0)
    tokens = jax.numpy.asarray(rng.integers(3, 40, (batch, steps)), jax.numpy.int32)
    z = jax.numpy.asarray(rng.standard_normal((batch, 64)), jax.numpy.float32)
    arms = {}
    for hoist in (True, False):
        graphdef, params, rest = nnx.split(jsr.SeqVAE(40, 256, 64, 1, hoist_inputs=hoist, rngs=nnx.Rngs(0)),
                                           nnx.Param, ...)
        arms[hoist] = (jax.jit(lambda p, z, tokens, g=graphdef, r=rest: nnx.merge(g, p, r).decode(z, tokens)), params)
    forward = _time_interleaved([(arms[h][0], (arms[h][1], z, tokens)) for h in (True, False)], steps)
    out = {h: np.asarray(fn(p, z, tokens)) for h, (fn, p) in arms.items()}
    case = f"SeqVAE teacher-forced decode B={batch}"
    print(f"{case:28s} T={steps:5d}  forward {forward[0]:9.2f} -> {forward[1]:9.2f} us/step  (hoisted -> inside; "
          f"max diff {float(np.max(np.abs(out[True] - out[False]))):.1e})", flush=True)
    return [{"case": case, "T": steps, "hoist_inputs": h, "backend": jax.default_backend(), "forward_us": forward[i]}
            for i, h in enumerate((True, False))]


OPT_LEVELS = (3, 1, 0)  # XLA's default (3), the library's choice, and the bottom for scale
# (case, B, T): the Traveller (H=64, 2 layers) as the benchmark's cells, and the VAE's train step and greedy
# generation at its benchmark size (V=40, H=256, Z=64, one layer, B=128, T=60).
OPT_LEVEL_CASES = [("traveller", 1, 100), ("traveller", 1, 1000), ("traveller", 64, 100), ("traveller", 64, 1000),
                   ("vae", 128, 60)]


def _opt_level_functions(case: str, batch: int, steps: int) -> dict:
    """{mode: (fn, args)} of one case: forward and Adam train step (Traveller; "traveller-h32": H=32, else 64),
    or train and greedy (VAE)."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    import jax_scan_rnn as jsr
    from jax_scan_rnn.bench.jax_methods import adam_step

    rng = np.random.default_rng(0)
    if case.startswith("traveller"):
        graphdef, params, rest, x, r = _model(f"{batch}x{case.partition('-h')[2] or 64}", steps)
        positions = lambda p, x: nnx.merge(graphdef, p, rest)(x)[0]  # noqa: E731 - unroll "auto", as users get
        loss = lambda p, x, r: -jnp.mean(jnp.sum(positions(p, x) * r, -1))  # noqa: E731
        forward, train_args = (positions, (params, x)), (x, r)
    else:
        model = jsr.SeqVAE(40, 256, 64, 1, rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        tokens = jnp.asarray(rng.integers(4, 40, (batch, steps)), jnp.int32)
        eps = jnp.asarray(rng.standard_normal((batch, 64)), jnp.float32)
        lengths = jnp.full((batch,), steps)

        def loss(p, tokens, eps):
            return nnx.merge(graphdef, p, rest).loss(tokens, lengths, eps=eps)["total"]

        generate = lambda p, z: nnx.merge(graphdef, p, rest).generate(z, steps)  # noqa: E731
        forward, train_args = (generate, (params, eps)), (tokens, eps)

    step, tx = adam_step(loss)  # the benchmark's train step: value, grad and one Adam update
    return {"forward" if case.startswith("traveller") else "greedy": forward,
            "train": (step, (params, tx.init(params), *train_args))}


def _compile(fn, args, options: dict):
    """(`fn` compiled for `args` with `options`, the seconds it took from an empty cache)."""
    import jax

    jax.clear_caches()
    start = time.perf_counter()
    compiled = jax.jit(fn, compiler_options=options).lower(*args).compile()
    return compiled, time.perf_counter() - start


def run_compile_arms(arms: dict[str, dict], reference: str, rounds: int = 3) -> list[dict]:
    """Per case of `OPT_LEVEL_CASES` and mode: each arm's (label -> per-compile options) compile times (one per
    round) and interleaved warm us/step, and its outputs' largest difference from the first arm's (named
    `reference` in the log)."""
    import jax
    import numpy as np

    rows = []
    labels = list(arms)
    for case, batch, steps in OPT_LEVEL_CASES:
        for mode, (fn, args) in _opt_level_functions(case, batch, steps).items():
            compile_s = {label: [] for label in labels}
            compiled = {}
            for _ in range(rounds):
                for label in labels:
                    compiled[label], seconds = _compile(fn, args, arms[label])
                    compile_s[label].append(seconds)
            warm = _time_interleaved([(compiled[label], args) for label in labels], steps)
            outs = {label: jax.tree.leaves(jax.device_get(compiled[label](*args))) for label in labels}
            for i, label in enumerate(labels):
                # Largest |output - the first arm's output| over every output leaf (the positions, or the
                # updated parameters, optimiser state and loss): float rounding, or a real change.
                diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0))
                           for a, b in zip(outs[labels[0]], outs[label]))
                rows.append({"case": case, "B": batch, "T": steps, "mode": mode, "arm": label,
                             "options": arms[label], "compile_s": compile_s[label], "us_per_step": warm[i],
                             "max_abs_diff": diff, "backend": jax.default_backend()})
                print(f"{case:9s} B={batch:4d} T={steps:5d} {mode:7s} {label}  compile "
                      f"{' '.join(f'{c:5.2f}' for c in compile_s[label])} s  warm {warm[i]:9.2f} us/step  "
                      f"max |out - {reference}'s| {diff:.1e}", flush=True)
    return rows


def run_opt_level() -> list[dict]:
    """Each of `OPT_LEVELS` alone (XLA's other options at their defaults)."""
    return run_compile_arms({f"-O{level}": {"xla_backend_optimization_level": level} for level in OPT_LEVELS}, "O3")


# XLA:CPU options that shorten compiles, each tried on top of the library's own (`xla_flags.CPU_COMPILER_OPTIONS`):
# its newer (MLIR) emitters for fused kernels off, LLVM's expensive passes off, the LLVM module compiled as one
# part instead of split for parallel codegen.
COMPILE_OPTION_ARMS = {
    "no-fusion-emitters": {"xla_cpu_use_fusion_emitters": False},
    "no-expensive-passes": {"xla_llvm_disable_expensive_passes": True},
    "codegen-split-1": {"xla_cpu_parallel_codegen_split_count": 1},
}


def run_compile_options() -> list[dict]:
    """The library's compiler options against each of `COMPILE_OPTION_ARMS` added to them."""
    from jax_scan_rnn.xla_flags import CPU_COMPILER_OPTIONS

    arms = {"library": dict(CPU_COMPILER_OPTIONS)}
    arms.update({label: {**CPU_COMPILER_OPTIONS, **extra} for label, extra in COMPILE_OPTION_ARMS.items()})
    return run_compile_arms(arms, "library")


# XLA:CPU emits a batch-1 matmul inside a one-kernel loop (xla_flags.py's small-loop setting) as its own
# matrix-vector loop, tiled by `xla_llvm_dot_tiling_factor` vector registers (XLA's default 8), in vectors of
# `xla_cpu_prefer_vector_width` bits (XLA's default 256).
GEMV_TILINGS = (8, 1, 2)
GEMV_CASES = OPT_LEVEL_CASES + [("traveller-h32", 1, 1000), ("traveller-h128", 1, 1000)]
VECTOR_WIDTHS = (256, 512)


def _run_workers(workers: dict, rounds: int) -> tuple[list[dict], dict]:
    """Each of `workers` (label -> (this script's arguments, environment or None)) in a process of its own, every
    round in turn, with an npz path appended for its outputs: all the rows they printed, and each label's
    first-round outputs."""
    import tempfile

    import numpy as np

    runs, outputs = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds):
            for label, (argv, env) in workers.items():
                path = os.path.join(folder, f"{label}-{r}.npz")
                out = subprocess.run([sys.executable, __file__, *argv, path], env=env, capture_output=True, text=True)
                if out.returncode:  # its own error, not just "returned non-zero exit status 1"
                    sys.exit(f"tune_scan.py: the worker {' '.join(argv)} failed (exit {out.returncode}):\n"
                             f"{out.stderr[-3000:]}")
                rows = json.loads(out.stdout.strip().splitlines()[-1])
                runs += rows
                # As each process ends, so that a run stopped at a time limit still leaves its figures in the log.
                print(f"{label} (round {r + 1}): " + "; ".join(
                    f"{row['case']} compile {row['compile_s']:.2f} s" for row in rows if "compile_s" in row), flush=True)
                if r == 0:
                    with np.load(path) as data:
                        outputs[label] = dict(data)
    return runs, outputs


def gemv_worker(tiling: int, outputs: str) -> list[dict]:
    """In this process (XLA_FLAGS already carries `tiling`): each case's compile and warm time at each width;
    every output leaf saved to `outputs` (npz) for the parent to compare."""
    import jax
    import numpy as np

    rows, saved = [], {}
    for case, batch, steps in GEMV_CASES:
        for mode, (fn, args) in _opt_level_functions(case, batch, steps).items():
            compiled, compile_s = {}, {}
            for width in VECTOR_WIDTHS:
                compiled[width], compile_s[width] = _compile(
                    fn, args, {"xla_backend_optimization_level": 1, "xla_cpu_prefer_vector_width": width})
            warm = _time_interleaved([(compiled[width], args) for width in VECTOR_WIDTHS], steps, rounds=3)
            for i, width in enumerate(VECTOR_WIDTHS):
                key = f"{case} B={batch} T={steps} {mode}"
                for j, leaf in enumerate(jax.tree.leaves(jax.device_get(compiled[width](*args)))):
                    saved[f"{key} {width} {j}"] = np.asarray(leaf)
                rows.append({"case": key, "tiling": tiling, "width": width, "compile_s": compile_s[width],
                             "us_per_step": warm[i], "backend": jax.default_backend()})
    np.savez(outputs, **saved)
    return rows


def run_gemv(rounds: int) -> list[dict]:
    """Rotate the tilings' processes over `rounds`; per case, tiling and width: the compile of each round,
    the median over rounds of the warm time, and the largest output difference from XLA's defaults'."""
    import numpy as np

    from jax_scan_rnn.xla_flags import GEMV_TILING_OPTION, OPT_OUT_ENV, SMALL_LOOP_BYTES, SMALL_LOOP_OPTION
    from jax_scan_rnn.xla_flags import with_backend_options

    def env(tiling: int) -> dict:  # both options given, so the library's own values (xla_flags.configure) stay out
        flags = with_backend_options("", {SMALL_LOOP_OPTION: SMALL_LOOP_BYTES, GEMV_TILING_OPTION: tiling})
        return dict(os.environ, XLA_FLAGS=flags, **{OPT_OUT_ENV: "1"})

    runs, outputs = _run_workers({tiling: (["_gemv_worker", str(tiling)], env(tiling)) for tiling in GEMV_TILINGS},
                                 rounds)
    rows = []
    for key in dict.fromkeys(r["case"] for r in runs):
        for tiling in GEMV_TILINGS:
            for width in VECTOR_WIDTHS:
                mine = [r for r in runs if (r["case"], r["tiling"], r["width"]) == (key, tiling, width)]
                # Largest |output - XLA's defaults' output| over every output leaf (first round's processes).
                reference, got = outputs[GEMV_TILINGS[0]], outputs[tiling]
                leaves = [k for k in reference if k.startswith(f"{key} {VECTOR_WIDTHS[0]} ")]
                diff = max(float(np.max(np.abs(reference[k].astype(np.float64)
                                               - got[k.replace(f" {VECTOR_WIDTHS[0]} ", f" {width} ")]), initial=0))
                           for k in leaves)
                row = {"case": key, "tiling": tiling, "width": width, "compile_s": [r["compile_s"] for r in mine],
                       "warm_us": [r["us_per_step"] for r in mine],
                       "us_per_step": float(np.median([r["us_per_step"] for r in mine])), "max_abs_diff": diff,
                       "backend": mine[0]["backend"]}
                rows.append(row)
                print(f"{key:32s} tiling {tiling} width {width}  compile "
                      f"{' '.join(f'{c:5.2f}' for c in row['compile_s'])} s  warm {row['us_per_step']:9.2f} us/step "
                      f"(rounds {' '.join(f'{w:.3g}' for w in row['warm_us'])})  max |out - default's| {diff:.1e}",
                      flush=True)
    return rows


REMAT_DROPOUT_STEPS = (1000, 4000, 16000)


def run_remat_dropout(batch: int = 64, hidden: int = 64, layers: int = 3, rate: float = 0.3) -> list[dict]:
    """Temp bytes of a compiled Traveller train step with dropout on, three ways, for each T."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jax_scan_rnn as jsr

    rows = []
    print(f"Traveller F=8 H={hidden} L={layers} B={batch}, dropout {rate}, train step (grad of sum of squares): "
          "XLA temp MiB", flush=True)
    for steps in REMAT_DROPOUT_STEPS:
        chunk = round(steps**0.5)
        x = jnp.zeros((batch, steps, 8), jnp.float32)
        masks = jnp.ones((layers - 1, steps, batch, hidden), jnp.float32)
        row = {"T": steps, "B": batch, "H": hidden, "L": layers, "remat_chunk": chunk, "backend": jax.default_backend()}
        for arm, remat, given in (("no remat", None, False), ("remat, masks per step", chunk, False),
                                  ("remat, [T] mask array", chunk, True)):
            graphdef, state = nnx.split(jsr.Traveller(8, hidden, layers, dropout=rate, remat_chunk=remat,
                                                      rngs=nnx.Rngs(0)))

            def grads(state, x, masks, given=given):
                loss = lambda m: jnp.sum(m(x, dropout_masks=masks if given else None)[0] ** 2)  # noqa: E731
                return nnx.grad(loss)(nnx.merge(graphdef, state))

            compiled = jax.jit(grads).lower(state, x, masks).compile()
            row[arm] = compiled.memory_analysis().temp_size_in_bytes
        rows.append(row)
        print(f"  T={steps:6d} chunk {chunk:4d}:  " + ",  ".join(
            f"{arm} {row[arm] / 2**20:8.1f}" for arm in ("no remat", "remat, masks per step", "remat, [T] mask array")
        ) + f"   (the mask array itself: {masks.nbytes / 2**20:.1f})", flush=True)
    return rows


# XLA:GPU options that may shorten compiles, each alone, against XLA's defaults. On the H200 the library's programs
# compiled far slower than on a 2-core CPU, and slower the larger the batch (the VAE train step ~16 s, generation at
# B=10,000 ~11 s, the Traveller's train step 2.4 s at B=1 and 15 s at B=1024: README, GPU), which points at XLA's
# GEMM and fusion autotuning, run per matmul shape at compile time. Off, lighter (no correctness check, data
# uninitialised), and Triton's GEMMs (one source of autotuning candidates) off:
GPU_COMPILE_ARMS = {
    "default": {},
    "autotune-0": {"xla_gpu_autotune_level": 0},
    "autotune-1": {"xla_gpu_autotune_level": 1},
    "no-triton-gemm": {"xla_gpu_enable_triton_gemm": False},
}
# (case, B, T, modes) as `_opt_level_functions` builds them; on a CPU (a check of the script) at tiny sizes.
GPU_COMPILE_CASES = [("traveller", 1, 1000, ("forward", "train")), ("traveller", 1024, 1000, ("forward", "train")),
                     ("vae", 128, 60, ("greedy", "train")), ("vae", 10000, 60, ("greedy",))]
CPU_CHECK_CASES = [("traveller", 1, 20, ("forward", "train")), ("vae", 8, 6, ("greedy", "train"))]


def gpu_compile_worker(arm: str, outputs: str) -> list[dict]:
    """In a process of its own (XLA keeps autotuning results per process), the cases compiled in turn with
    `GPU_COMPILE_ARMS[arm]`, as a user's process compiles its programs: each one's compile and warm time; every
    output leaf saved to `outputs` (npz)."""
    import jax
    import numpy as np

    jax.jit(lambda x: x @ x).lower(np.ones((8, 8), np.float32)).compile()  # the backend's own start-up, not timed
    cases = GPU_COMPILE_CASES if jax.default_backend() == "gpu" else CPU_CHECK_CASES
    rows, saved = [], {}
    for case, batch, steps, modes in cases:
        functions = _opt_level_functions(case, batch, steps)
        for mode in modes:
            fn, args = functions[mode]
            key = f"{case} B={batch} T={steps} {mode}"
            try:
                compiled, compile_s = _compile(fn, args, GPU_COMPILE_ARMS[arm])
            except Exception as err:  # noqa: BLE001 - an option this XLA does not know: the row says so
                rows.append({"case": key, "arm": arm, "error": f"{type(err).__name__}: {err}"[:300]})
                continue
            for j, leaf in enumerate(jax.tree.leaves(jax.device_get(compiled(*args)))):
                saved[f"{key} {j}"] = np.asarray(leaf)
            rows.append({"case": key, "arm": arm, "compile_s": compile_s,
                         "us_per_step": _time_interleaved([(compiled, args)], steps, rounds=3)[0],
                         "backend": jax.default_backend()})
    np.savez(outputs, **saved)
    return rows


def run_gpu_compile(rounds: int) -> list[dict]:
    """Each arm of `GPU_COMPILE_ARMS` in processes of its own, rotated over `rounds`; per case and arm: the compile
    of each round, the median warm time, and the largest output difference from the default arm's (round 1)."""
    import numpy as np

    runs, outputs = _run_workers({arm: (["_gpu_compile_worker", arm], None) for arm in GPU_COMPILE_ARMS}, rounds)
    rows = []
    for key in dict.fromkeys(r["case"] for r in runs):
        for arm in GPU_COMPILE_ARMS:
            mine = [r for r in runs if (r["case"], r["arm"]) == (key, arm)]
            if "error" in mine[0]:
                rows.append(mine[0])
                print(f"{key:32s} {arm:15s} {mine[0]['error']}", flush=True)
                continue
            reference, got = outputs["default"], outputs[arm]
            diff = max((float(np.max(np.abs(reference[k].astype(np.float64) - got[k]), initial=0))
                        for k in reference if k.startswith(f"{key} ")), default=float("nan"))
            row = {"case": key, "arm": arm, "options": GPU_COMPILE_ARMS[arm],
                   "compile_s": [r["compile_s"] for r in mine],
                   "us_per_step": float(np.median([r["us_per_step"] for r in mine])), "max_abs_diff": diff,
                   "backend": mine[0]["backend"]}
            rows.append(row)
            print(f"{key:32s} {arm:15s} compile {' '.join(f'{c:6.2f}' for c in row['compile_s'])} s  warm "
                  f"{row['us_per_step']:9.2f} us/step  max |out - default's| {diff:.1e}", flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["flag", "unroll", "unroll-layers", "hoist", "hoist-layers", "remat-dropout",
                                         "opt-level", "compile-options", "gemv", "gpu-compile", "_flag_worker", "_gemv_worker",
                                         "_gpu_compile_worker"])
    parser.add_argument("configs", nargs="*", help="BxH or BxH:f64 (default: the module's lists)")
    parser.add_argument("--out", type=results_file, help="also write the rows as JSON here")
    parser.add_argument("--threshold", type=int, help="flag: this small-loop threshold instead of the library's")
    parser.add_argument("--rounds", type=POSITIVE_INT, default=None,
                        help="gemv: processes per tiling, rotated (default 3); gpu-compile: processes per arm (default 1); unroll, unroll-layers: interleaved "
                             "rounds (default 5)")
    args = parser.parse_args(argv)
    if args.what == "_flag_worker":
        print(json.dumps(flag_worker(args.configs)))
        return
    if args.what == "_gemv_worker":
        print(json.dumps(gemv_worker(int(args.configs[0]), args.configs[1])))
        return
    if args.what == "_gpu_compile_worker":
        print(json.dumps(gpu_compile_worker(*args.configs)))
        return
    if args.what == "flag":
        rows = run_flag(args.configs or FLAG_CONFIGS, args.threshold)
        by = {(r["config"], r["arm"]): r for r in rows}
        print(f"{'config':10s} {'one kernel':>10s} {'forward default -> set':>26s} {'train default -> set':>26s}")
        for config in args.configs or FLAG_CONFIGS:
            off, on = by[(config, "default")], by[(config, "set")]
            print(f"{config:10s} {str(on['one_kernel']):>10s} {off['forward_us']:11.2f} -> {on['forward_us']:8.2f} us "
                  f"{off['train_us']:11.2f} -> {on['train_us']:8.2f} us")
    elif args.what == "unroll-layers":
        rows = run_unroll_layers(args.rounds or 5)
    elif args.what == "hoist":
        rows = run_hoist(args.configs or HOIST_CONFIGS)
    elif args.what == "hoist-layers":
        rows = run_hoist_layers()
    elif args.what == "remat-dropout":
        rows = run_remat_dropout()
    elif args.what == "opt-level":
        rows = run_opt_level()
    elif args.what == "compile-options":
        rows = run_compile_options()
    elif args.what == "gemv":
        rows = run_gemv(args.rounds or 3)
    elif args.what == "gpu-compile":
        rows = run_gpu_compile(args.rounds or 1)
    else:
        rows = run_unroll(args.configs or UNROLL_CONFIGS, args.rounds or 5)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
