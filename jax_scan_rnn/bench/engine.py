"""The measuring engine: builds every case of a (B, T, mode) cell, warms it up, samples the cases
round-robin, derives the ratios, and `run_suite` returns it all as a JSON-ready dict.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jax_scan_rnn import xla_flags
from jax_scan_rnn.bench import peer_methods, vae_methods
from jax_scan_rnn.bench.config import AUTO_KEY, LIMIT_KEYS, SCHEMA_VERSION, SEED_KEY, SEEDS, BenchConfig
from jax_scan_rnn.bench.context import Case, Context, Skip, TooCostly
from jax_scan_rnn.bench.machine import available_memory, cpu_model, host_kind, load_average
from jax_scan_rnn.bench.methods import METHODS, Method, check_method_keys

CALIBRATION_CALLS = 3  # warm calls timed to choose calls per sample (the quickest counts)


# ----------------------------------------------------------------------------------------------------
# The measuring engine
# ----------------------------------------------------------------------------------------------------


def _calibrate_torch_threads(ctx: Context, default: int, probe: Callable[[], None] | None = None) -> dict:
    """On CPU, time a probe of torch work with 1 thread and with torch's default; keep the faster.

    The default probe is the Traveller's: its seed loop (B=1) and cell loop (B=64). On a busy machine,
    torch's OpenMP threads wait for each other and such per-step loops get several times slower with 2
    threads than with 1, while wide matmuls (the VAE rows: `probe` is then its decoder loop) gain from
    every thread; the benchmark gives torch the faster setting for each model, and says so. `default`:
    torch's own thread count (read before any calibration changed it).
    """
    torch = ctx.torch
    if ctx.cfg.torch_threads is not None:
        torch.set_num_threads(ctx.cfg.torch_threads)
        return {"chosen": ctx.cfg.torch_threads, "default": default, "how": "given"}
    if ctx.on_gpu or default == 1:
        return {"chosen": default, "default": default, "how": "torch default"}

    inputs = [(method, ctx.t(ctx.data(batch, 20)["x"])) for method, batch in (("loop", 1), ("cell", 64))]

    def traveller_probe() -> None:  # timed: the inputs are made once, above
        with torch.no_grad():
            for method, x in inputs:
                ctx.torch_model(x, method=method)

    probe = probe or traveller_probe
    candidates = sorted({1, default})
    samples: dict[int, list[float]] = {threads: [] for threads in candidates}
    for round_ in range(6):  # the settings alternate, so that a change of machine load hits both alike
        for threads in candidates:
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            probe()
            if round_ > 0:  # round 0 is the warm-up: first calls allocate
                samples[threads].append(time.perf_counter() - t0)
    timings = {threads: statistics.median(times) for threads, times in samples.items()}
    chosen = min(timings, key=timings.get)
    torch.set_num_threads(chosen)
    return {"chosen": chosen, "default": default, "how": "calibrated",
            "calibration_s": {str(k): round(v, 5) for k, v in timings.items()}}


def _base_row(method: Method, model: str, mode: str, batch: int, steps: int, section: str) -> dict:
    return {
        "model": model, "method": method.key, "label": method.label, "framework": method.framework,
        "role": method.role, "mode": mode, "B": batch, "T": steps, "section": section,
        "status": "pending", "reason": None, "per_step_us": None, "call_s": None, "call_s_min": None,
        "samples": [], "calls_per_sample": None, "first_call_s": None, "compile_s": None, "memory": None,
        "max_abs_diff": None, "speedup_vs_seed": None, "x_limit": None,
        "versus": list(method.versus), "vs_jsr": None,
    }


class _Engine:
    def __init__(self, cfg: BenchConfig, ctx: Context, progress: Callable[[str], None] | None):
        self.cfg = cfg
        self.ctx = ctx
        self.progress = progress or (lambda message: None)
        self.start = time.perf_counter()
        self.history: dict[tuple, float] = {}  # (method, mode, B, T) -> seconds per step
        self.device_lost: str | None = None  # the row whose CUDA error left the GPU unusable to this process

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def cap(self, method: Method, batch: int, steps: int) -> float:
        """Longest predicted call allowed; the seed and limit rows get longer in the headline cells."""
        headline = (batch, steps) in self.cfg.headline_cells and method.role in ("seed", "limit")
        factor = self.cfg.headline_cap_factor if headline else 1.0
        return self.cfg.max_call_s * factor

    def predict(self, key: str, mode: str, batch: int, steps: int) -> float | None:
        """Predicted seconds per call from this method's earlier cells (None: no earlier cell).

        From the same B: the smallest time per step seen at a shorter T, times T (the smallest, so that
        one disturbed measurement does not skip everything after it). Else from a smaller B at this T,
        scaled up linearly in B beyond 32 rows.
        """
        same_b = [s for (k, m, b, t), s in self.history.items() if (k, m, b) == (key, mode, batch) and t < steps]
        if same_b:
            return min(same_b) * steps
        smaller_b = [(b, s) for (k, m, b, t), s in self.history.items()
                     if (k, m, t) == (key, mode, steps) and b < batch]
        if smaller_b:
            b, s = max(smaller_b)
            return s * steps * max(1.0, batch / max(b, 32))
        return None

    def cell(self, methods: Sequence[Method], model: str, batch: int, steps: int, mode: str,
             section: str) -> list[dict]:
        """Measure every method on one (B, T, mode): build and warm up each, then sample round-robin."""
        rows, live = [], []
        # Forget every graph Dynamo compiled so far: each cell's first calls compile from scratch (the
        # compile times are comparable across cells) and no cache limit is reached over the suite.
        self.ctx.torch._dynamo.reset()
        # CUDA-graph rows are built last: a capture that fails leaves a sticky CUDA error, after which no row
        # of this process can run (seen on an H200: every later JAX row failed), so it must not stop the others.
        for method in sorted(methods, key=lambda m: m.gpu_only):
            row = _base_row(method, model, mode, batch, steps, section)
            rows.append(row)
            reason = self.static_skip(method, batch, steps, mode, section)
            if reason:
                row["status"], row["reason"] = reason
                row["mode_na"] = mode not in method.modes  # tables leave such rows out
                continue
            if self.device_lost:
                row["status"], row["reason"] = "skipped", f"the GPU is unusable after {self.device_lost}"
                continue
            if self.elapsed() > self.cfg.budget_s:
                row["status"], row["reason"] = "skipped", f"suite budget of {self.cfg.budget_s:.0f} s spent"
                continue
            cap = self.cap(method, batch, steps)
            predicted = self.predict(method.key, mode, batch, steps)
            # Eager methods are probed at this B below (which also sees fixed per-call costs that a
            # per-step extrapolation misses); the history only skips them when clearly hopeless.
            hopeless = cap * (10 if method.kind == "eager" else 1)
            if predicted is not None and predicted > hopeless:
                row["status"] = "skipped"
                row["reason"] = f"predicted {_fmt_s(predicted)} per call > {_fmt_s(cap)} cap"
                continue
            self.progress(f"[{self.elapsed():6.0f} s] {mode:<7} B={batch:<5} T={steps:<6} {method.label}")
            try:
                case = self.build_and_warm(method, row, batch, steps, mode, cap)
            except Skip as why:
                row["status"] = why.status
                row["reason"] = str(why)
            except Exception as err:  # noqa: BLE001 - one failing method must not stop the suite
                row["status"], row["reason"] = "error", _one_line(err)
                if "CUDA error" in str(err):  # sticky: the process's CUDA context is gone
                    self.device_lost = f"{method.key}'s error ({mode}, B={batch}, T={steps})"
            else:
                live.append((row, case))
            gc.collect()
        order = {m.key: i for i, m in enumerate(methods)}
        rows.sort(key=lambda r: order[r["method"]])  # back in the table's order
        if self.device_lost:  # the rows built before the error cannot run either
            for row, _ in live:
                row["status"], row["reason"] = "skipped", f"the GPU is unusable after {self.device_lost}"
            live.clear()
        self.agreement(rows)
        self.sample(live)
        self.compile_rounds(live)
        for row, _ in live:
            self.finish(row)
        live.clear()
        gc.collect()
        return rows

    def static_skip(self, method: Method, batch: int, steps: int, mode: str, section: str) -> tuple[str, str] | None:
        if method.gpu_only and not self.ctx.on_gpu:
            return "n/a", "GPU only: no CUDA device on this machine"
        if method.requires and peer_methods.missing(method.requires):
            return "n/a", peer_methods.missing(method.requires)
        if mode not in method.modes:
            return "n/a", method.modes_note or f"no {mode} row"
        if mode == "train" and self.cfg.train_batch_sizes is not None and batch not in self.cfg.train_batch_sizes:
            return "n/a", f"no train rows at B={batch} in the {self.cfg.label} preset"
        if mode == "train" and self.cfg.train_methods is not None and method.key not in self.cfg.train_methods:
            return "n/a", f"no train row in the {self.cfg.label} preset"
        if section == "grid" and method.where == "sweep":
            return "n/a", f"short T only: see the compile sweep (T in {list(self.cfg.sweep_seq_lens)})"
        if section == "grid" and method.max_t is not None and steps > min(method.max_t, self.cfg.short_max_t):
            note = f": {method.max_t_note}" if method.max_t_note else ""
            return "n/a", f"short T only (T <= {min(method.max_t, self.cfg.short_max_t)}){note}"
        return None

    def build_and_warm(self, method: Method, row: dict, batch: int, steps: int, mode: str, cap: float) -> Case:
        ctx = self.ctx
        short, long = self.cfg.probe_t, 4 * self.cfg.probe_t
        if method.kind == "eager" and steps > long:
            # Two short calls fit call time = a + b * T (a: per-call costs, b: per step), each after a
            # warm-up call of its length that pays the first-use costs (allocations, oneDNN primitives,
            # TorchScript profiling, the eager scan's tracing).
            times = []
            for probe_steps in (short, long):  # each length warmed up first (e.g. the eager scan re-traces)
                probe = method.build(ctx, batch, probe_steps, mode)
                probe.call()
                t0 = time.perf_counter()
                probe.call()
                times.append(time.perf_counter() - t0)
                del probe
            b = max((times[1] - times[0]) / (long - short), times[1] / long / 4)
            a = max(times[0] - b * short, 0.0)
            if a + b * steps > cap:
                raise TooCostly(f"predicted {_fmt_s(a + b * steps)} per call > {_fmt_s(cap)} cap "
                           f"(probes at T={short}, {long})")
        mem_before = self.torch_mem_reset()
        t0 = time.perf_counter()
        case = method.build(ctx, batch, steps, mode)
        out = case.call()
        row["first_call_s"] = time.perf_counter() - t0
        row["compile_s"] = case.compile_s
        row["memory"] = self.memory(method, case, mem_before)
        row.update(case.info)
        if case.output is not None and out is not None:
            row["_output"] = case.output(out)
        return case

    def torch_mem_reset(self) -> int | None:
        if not self.ctx.on_gpu:
            return None
        torch = self.ctx.torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()

    def memory(self, method: Method, case: Case, mem_before: int | None) -> dict | None:
        memory = dict(case.memory) if case.memory else None
        if self.ctx.on_gpu and method.framework == "torch":
            torch = self.ctx.torch
            peak = torch.cuda.max_memory_allocated() - (mem_before or 0)
            memory = {"kind": "torch-cuda-peak", "peak_bytes": int(peak)}
        elif self.ctx.on_gpu and method.framework == "jax":
            stats = jax.devices()[0].memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                memory = dict(memory or {"kind": "jax-device"})
                memory["process_peak_bytes"] = int(stats["peak_bytes_in_use"])
        return memory

    def agreement(self, rows: list[dict]) -> None:
        """Max |positions - reference| per forward row; reference: the seed loop, else lax.scan unroll=1; for a
        peer, the first of its `versus` jsr rows measured (a peer without feedback computes another function)."""
        outputs = {r["method"]: r.pop("_output") for r in rows if "_output" in r}
        model = rows[0]["model"] if rows else "traveller"
        seed = SEEDS.get(model, SEED_KEY)
        default_key = seed if seed in outputs else ("jax-scan-u1" if "jax-scan-u1" in outputs else None)
        for row in rows:
            out = outputs.get(row["method"])
            if out is None or row["role"] in ("limit", "bound"):
                continue
            if row["role"] == "peer":
                ref_key = next((k for k in row["versus"] if k in outputs), None)
            else:
                ref_key = default_key
            if ref_key is None:
                continue
            ref = outputs[ref_key]
            if out.shape != ref.shape:
                row["max_abs_diff"] = {"vs": ref_key, "value": None, "note": f"shape {out.shape} != {ref.shape}"}
            elif np.issubdtype(out.dtype, np.integer):  # generated tokens: the share that differ
                row["max_abs_diff"] = {"vs": ref_key, "value": float(np.mean(out != ref)), "metric": "tokens differing"}
            else:
                row["max_abs_diff"] = {"vs": ref_key, "value": float(np.max(np.abs(out.astype(np.float64) - ref)))}

    def sample(self, live: list[tuple[dict, Case]]) -> None:
        """Round-robin: each pass takes one sample of every unfinished case, so load drifts hit all alike."""
        for row, case in live:
            # Calls per sample from the quickest of up to CALIBRATION_CALLS warm calls: one call slowed by the
            # scheduler once made a 0.1 ms call look like 3 ms, so its samples held 6 calls and were noise.
            times = []
            while len(times) < CALIBRATION_CALLS and sum(times) < self.cfg.min_sample_s:
                t0 = time.perf_counter()
                case.call()
                times.append(max(time.perf_counter() - t0, 1e-7))
            row["calls_per_sample"] = max(1, min(10_000, math.ceil(self.cfg.min_sample_s / min(times))))
            if row["calls_per_sample"] == 1:  # each call lasts a sample: the calibration calls are samples
                row["samples"].extend(times)
        active = [(row, case) for row, case in live if not self.done(row)]
        while active:
            for row, case in active:
                n = row["calls_per_sample"]
                t0 = time.perf_counter()
                for _ in range(n):
                    case.call()
                row["samples"].append((time.perf_counter() - t0) / n)
            active = [(row, case) for row, case in active if not self.done(row)]

    def compile_rounds(self, live: list[tuple[dict, Case]]) -> None:
        """`compile_s`: the median of `compile_rounds` compiles of each JAX case, the rounds after the build's
        interleaved across the cell (after sampling: clearing JAX's caches must not land in a timed call)."""
        timed = [(row, case) for row, case in live if case.compile_again is not None and row["compile_s"] is not None]
        for row, _ in timed:
            row["compile_rounds_s"] = [row["compile_s"]]
        for _ in range(self.cfg.compile_rounds - 1):
            for row, case in timed:
                row["compile_rounds_s"].append(case.compile_again())
        for row, _ in timed:
            row["compile_s"] = statistics.median(row["compile_rounds_s"])

    def done(self, row: dict) -> bool:
        """`repeats` samples, or `min_repeats` once they took `case_budget_s`."""
        samples, cfg = row["samples"], self.cfg
        spent = sum(samples) * row["calls_per_sample"]
        return len(samples) >= cfg.repeats or (len(samples) >= cfg.min_repeats and spent >= cfg.case_budget_s)

    def finish(self, row: dict) -> None:
        samples = row["samples"]
        row["status"] = "ok"
        row["call_s"] = statistics.median(samples)
        row["call_s_min"] = min(samples)
        row["per_step_us"] = row["call_s"] / row["T"] * 1e6
        self.history[(row["method"], row["mode"], row["B"], row["T"])] = row["call_s"] / row["T"]


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def _derive(rows: list[dict]) -> list[dict]:
    """The ratios of every row (vs its cell's seed loop and limit; a peer's also vs its jsr row)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["section"], row["mode"], row["B"], row["T"]), []).append(row)
    for (model, *_), group in groups.items():
        seed = next((r for r in group if r["method"] == SEEDS.get(model) and r["status"] == "ok"), None)
        limits = [r for r in group if r["method"] in LIMIT_KEYS and r["status"] == "ok"]
        limit = min(limits, key=lambda r: r["call_s"]) if limits else None
        for row in group:
            if row["status"] != "ok":
                continue
            if seed is not None:
                row["speedup_vs_seed"] = seed["call_s"] / row["call_s"]
            if limit is not None:
                row["x_limit"] = row["call_s"] / limit["call_s"]
                row["limit_method"] = limit["method"]
            if row["role"] == "peer":
                row["vs_jsr"] = _vs_jsr(row, group)
    return [row for group in groups.values() for row in group]  # cells in measuring order


def _vs_jsr(peer: dict, group: list[dict]) -> dict | None:
    """A measured peer against the first of its `versus` jsr rows measured in its cell: jsr's time over the
    peer's (<= 1: jsr at least as fast), warm call and compile, each the median over the cell's interleaved
    rounds of the two rows' ratio (`_paired`); the ratio of the two rows' medians is kept beside it
    (`*_of_medians`). None when no such row was measured."""
    ok = {r["method"]: r for r in group if r["status"] == "ok"}
    jsr_row = next((ok[k] for k in peer["versus"] if k in ok), None)
    if jsr_row is None:
        return None

    def ratio(name: str) -> float | None:
        a, b = jsr_row.get(name), peer.get(name)
        return a / b if a is not None and b else None

    return {"vs": jsr_row["method"],
            "call": _paired(jsr_row["samples"], peer["samples"]) or ratio("call_s"),
            "compile": _paired(jsr_row.get("compile_rounds_s"), peer.get("compile_rounds_s")) or ratio("compile_s"),
            "call_of_medians": ratio("call_s"), "compile_of_medians": ratio("compile_s"),
            "first_call": ratio("first_call_s")}


def _paired(a: Sequence[float] | None, b: Sequence[float] | None) -> float | None:
    """The median over rounds i of a[i] / b[i] (the rounds both rows took; None if none). A cell's rows are
    sampled, and compiled, in turn, one round at a time, so a slow spell of the host falls on one round of both
    rows; the ratio of the two rows' medians can take them from different spells (docs/tuning_cpu.md, "The
    peers' rows, explained")."""
    pairs = [x / y for x, y in zip(a or (), b or ()) if y > 0]
    return statistics.median(pairs) if pairs else None


def _versions(ctx: Context, threads: dict, vae_threads: dict | None = None) -> dict:
    torch = ctx.torch
    return {
        "host_kind": host_kind(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "torch": torch.__version__,
        "jax_devices": [f"{d.platform}:{d.device_kind}" for d in jax.devices()],
        "torch_device": str(ctx.torch_device) + (f" ({torch.cuda.get_device_name()})" if ctx.on_gpu else ""),
        "torch_threads": threads,  # the Traveller rows'
        "torch_threads_vae": vae_threads,  # the VAE rows', per batch size (None: no torch VAE rows)
        "memory_available_gib": round((available_memory() or 0) / 2**30, 1),
        # The CPU small-loop setting changes batch-1 scan times (jax_scan_rnn/xla_flags.py).
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "xla_small_loop_setting": xla_flags.status(),
        "library_compiler_options": xla_flags.compiler_options(),  # the jsr rows' (jax_methods.compiled_case)
        # Set (JAX_COMPILATION_CACHE_DIR), compile times may be loads from it: `bench` itself never sets it.
        "compilation_cache": jax.config.jax_compilation_cache_dir,
    }


def run_suite(cfg: BenchConfig | None = None, *, progress: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark; returns the results as a JSON-ready dict (see `write_results`). Prints nothing."""
    cfg = cfg or BenchConfig.default()
    cfg.validate()
    check_method_keys(cfg)
    started, load_start = time.time(), load_average()
    with contextlib.ExitStack() as restore:  # every setting changed below is put back, however the run ends
        if cfg.dtype == "float32" and cfg.matmul_precision:
            restore.enter_context(jax.default_matmul_precision(cfg.matmul_precision))
        ctx = Context(cfg)
        torch = ctx.torch
        if ctx.on_gpu and cfg.dtype == "float32":  # float32 means float32: no TF32 matmuls
            _set(restore, torch.backends.cuda.matmul, "allow_tf32", False)
            _set(restore, torch.backends.cudnn, "allow_tf32", False)
        dynamo = torch._dynamo.config
        limit_name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
        _set(restore, dynamo, limit_name, max(getattr(dynamo, limit_name), 64))
        # torch.compile keeps compiled graphs on disk between processes (FX graph and AOT-autograd caches):
        # a second run would time cache hits, not compiles. Those are off here; the C++/Triton kernel cache
        # stays on, as on any machine that has compiled before (a first-ever run takes longer).
        caches = ((torch._inductor.config, "fx_graph_cache"), (torch._functorch.config, "enable_autograd_cache"))
        for config, name in caches:
            if hasattr(config, name):
                _set(restore, config, name, False)
        return _run(cfg, ctx, progress, started, load_start, restore)


def _set(restore: contextlib.ExitStack, obj, name: str, value) -> None:
    """`obj.name = value` until `restore` closes."""
    restore.callback(setattr, obj, name, getattr(obj, name))
    setattr(obj, name, value)


def _warm_up_compilers(ctx: Context) -> None:
    """Pay each compiler's one-time start-up (imports, toolchain, worker pools) before any row is timed."""
    torch = ctx.torch
    x = torch.ones(4, device=ctx.torch_device)
    torch.compile(lambda v: torch.tanh(v) * 2 + 1, fullgraph=True)(x)
    jax.block_until_ready(jax.jit(lambda v: jnp.tanh(v) * 2 + 1)(jnp.ones(4)))
    torch._dynamo.reset()


def selected_methods(cfg: BenchConfig) -> list[Method]:
    """The rows `cfg` runs, in METHODS' order: `cfg.methods` with what their ratios need, or (None) every row
    but the peers (`BenchConfig.peers` measures them in a run of their own)."""
    if cfg.methods is None:
        wanted = {k for k, m in METHODS.items() if m.role != "peer"}
    else:
        # The seed loop, the limits and the library's own choice (the headline row) always run.
        wanted = set(cfg.methods) | {SEED_KEY, AUTO_KEY, *LIMIT_KEYS}
        wanted |= {SEEDS[METHODS[k].model] for k in wanted}  # each model's ratios need its torch loop
        wanted |= {v for k in set(wanted) for v in METHODS[k].versus}  # and each peer's, its jsr rows
    return [m for k, m in METHODS.items() if k in wanted]


def _run(cfg: BenchConfig, ctx: Context, progress, started: float, load_start,
         restore: contextlib.ExitStack) -> dict:
    default_threads = ctx.torch.get_num_threads()
    threads = _calibrate_torch_threads(ctx, default_threads)
    _warm_up_compilers(ctx)
    if not gc.get_freeze_count():  # a caller's own freeze is left as it is
        # What is alive now (JAX, torch and their compilers' modules) is never the suite's garbage: frozen, it
        # is skipped by the collections between cases, which then cost milliseconds instead of ~0.3 s each
        # (docs/measurements.md, "The benchmark's collections").
        gc.freeze()
        restore.callback(gc.unfreeze)
    engine = _Engine(cfg, ctx, progress)
    methods = selected_methods(cfg)
    grid_methods = [m for m in methods if m.where in ("grid", "both") and m.model == "traveller"]
    sweep_methods = [m for m in methods if m.where in ("sweep", "both") and m.model == "traveller"]
    vae_rows = {model: [m for m in methods if m.model == model] for model in ("vae-ss", "vae-greedy")}

    # Order: the short-T sweep, the Traveller grid up to the VAE's batch sizes, the VAE rows, then the
    # larger batches (on a CPU mostly skipped as too slow: the first to go when the budget runs out).
    plan = [(sweep_methods, "traveller", cfg.sweep_batch, steps, "forward", "sweep")
            for steps in sorted(cfg.sweep_seq_lens) if "forward" in cfg.modes]
    vae_max_b = max(cfg.vae_batch_sizes, default=0)
    grid = [(grid_methods, "traveller", batch, steps, mode, "grid") for batch in sorted(cfg.batch_sizes)
            for steps in sorted(cfg.seq_lens) for mode in cfg.modes]
    plan += [p for p in grid if p[2] <= vae_max_b]
    plan += [(vae_rows[model], model, batch, steps, mode, "grid") for model in ("vae-ss", "vae-greedy")
             for batch in sorted(cfg.vae_batch_sizes) for steps in sorted(cfg.vae_seq_lens) for mode in cfg.modes
             if vae_rows[model]]
    plan += [p for p in grid if p[2] > vae_max_b]
    # The VAE rows' torch work is matmuls as wide as their batch, not the Traveller's per-step loops:
    # calibrated on its own decoder loop, per batch size.
    vae_threads: dict[int, dict] = {}
    if any(m.framework == "torch" for ms in vae_rows.values() for m in ms):
        try:
            for batch in sorted(cfg.vae_batch_sizes):
                probe = vae_methods.torch_probe(ctx, batch)
                vae_threads[batch] = _calibrate_torch_threads(ctx, default_threads, probe)
        except Skip:
            vae_threads = {}
    rows: list[dict] = []
    interrupted = None
    for methods_, model, batch, steps, mode, section in plan:
        chosen = threads if model == "traveller" else vae_threads.get(batch, threads)
        ctx.torch.set_num_threads(chosen["chosen"])
        try:
            rows += engine.cell(methods_, model, batch, steps, mode, section)
        except KeyboardInterrupt:  # e.g. a hard time limit (gpu.sh): keep what was measured
            interrupted = f"interrupted during {mode} B={batch} T={steps} ({section}) after {engine.elapsed():.0f} s"
            break
    rows = _derive(rows)
    for row in rows:
        row["samples"] = [round(s, 9) for s in row["samples"]]
    used = {r["method"] for r in rows}
    described = {m.key: {"label": m.label, "framework": m.framework, "role": m.role, "model": m.model,
                         "kind": m.kind, "note": m.note}
                 for m in methods if m.key in used}
    return {
        "schema": SCHEMA_VERSION,
        "kind": "jax-scan-rnn benchmark",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": round(engine.elapsed(), 1),
        "host": _versions(ctx, threads, {str(b): t for b, t in vae_threads.items()} or None),
        "load_average": {"start": load_start, "end": load_average()},
        "config": dataclasses.asdict(cfg),
        "jax_bf16": "compute_dtype" if cfg.dtype == "bfloat16" else None,  # how the JAX rows run bf16
        "interrupted": interrupted,
        "methods": described,
        "rows": rows,
    }
