"""The results, read: the headline comparison, the issues' criteria, the Markdown tables, the plots,
and `write_results` (JSON + Markdown + PNG files named after the machine).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from jax_scan_rnn.bench.config import AUTO_KEY, LIMIT_KEYS, SEED_KEY
from jax_scan_rnn.optional import require
from jax_scan_rnn.runlog import save_figure, strict_json, write_atomically


# ----------------------------------------------------------------------------------------------------
# Writing: JSON, Markdown, plots
# ----------------------------------------------------------------------------------------------------


def file_stem(host_kind: str, dtype: str, label: str) -> str:
    """`<host-kind>` plus `-bf16` / `-<label>` where those differ from the defaults: the results' file names."""
    return host_kind + ("-bf16" if dtype == "bfloat16" else "") + ("" if label == "default" else f"-{label}")


def results_stem(results: dict) -> str:
    """The file stem of `results` (`file_stem` of its host, dtype and label)."""
    return file_stem(results["host"]["host_kind"], results["config"]["dtype"], results["config"]["label"])


def earlier_results(out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """The results files of an earlier run with this stem in `out_dir` (its JSON and Markdown), if any."""
    return [p for p in (Path(out_dir) / f"{stem}.json", Path(out_dir) / f"{stem}.md") if p.exists()]


def write_results(results: dict, out_dir: str | os.PathLike, *, plots: bool = True,
                  replace: bool = False) -> dict[str, Path]:
    """Write `<stem>.json`, `<stem>.md` and the PNG plots under `out_dir`; returns their paths by kind. An
    earlier run's files of the same stem are replaced only with `replace` (else FileExistsError, before any write)."""
    out = Path(out_dir)
    stem = results_stem(results)
    earlier = earlier_results(out, stem)
    if earlier and not replace:
        raise FileExistsError(f"{out}: already holds {earlier[0].name} from an earlier run; pass replace=True "
                              "(the CLI's --replace) to write over it")
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md"}
    if plots:
        paths.update(_plot(results, out, stem))
    # Each replaced in one rename: an interrupted run leaves the earlier results whole (committed ones too)
    write_atomically(paths["json"], lambda f: f.write(strict_json(results, indent=1) + "\n"))
    md = markdown(results, {k: p.name for k, p in paths.items() if k.startswith("png")})
    write_atomically(paths["md"], lambda f: f.write(md))
    return paths


def format_us(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1e5:
        return f"{value / 1e3:,.0f} ms"
    if value >= 999.5:
        return f"{value / 1e3:.3g} ms"
    return f"{value:.3g} µs"


def format_ratio(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}×" if value >= 100 else f"{value:.3g}×"


def _bytes(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _find(rows: list[dict], **match) -> dict | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def headline(results: dict, batch: int = 1, steps: int = 1000, mode: str = "forward") -> dict:
    """The key comparison of one grid cell: seed loop, best JAX scan, limit; their ratios."""
    rows = [r for r in results["rows"] if r["section"] == "grid" and r["model"] == "traveller"
            and r["B"] == batch and r["T"] == steps and r["mode"] == mode]
    seed = _find(rows, method=SEED_KEY, status="ok")
    scan = _find(rows, method=AUTO_KEY, status="ok")
    limits = [r for r in rows if r["method"] in LIMIT_KEYS and r["status"] == "ok"]
    limit = min(limits, key=lambda r: r["call_s"]) if limits else None
    return {
        "B": batch, "T": steps, "mode": mode,
        "seed_us": seed and seed["per_step_us"],
        "scan_us": scan and scan["per_step_us"], "scan_method": scan and scan["method"],
        "scan_unroll": scan and scan.get("unroll"),
        "limit_us": limit and limit["per_step_us"], "limit_method": limit and limit["method"],
        "scan_speedup_vs_seed": scan and scan["speedup_vs_seed"],
        "scan_x_limit": scan and scan["x_limit"],
    }


def peer_groups(results: dict) -> list[dict]:
    """Per cell (section, mode, B, T) and jsr row that peers were measured against: the fastest peer
    (warm call) and the fastest-compiling one, and jsr's time over theirs (<= 1: jsr at least as fast)."""
    rows = results["rows"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["role"] == "peer" and r["status"] == "ok" and r.get("vs_jsr"):
            groups.setdefault((r["section"], r["mode"], r["B"], r["T"], r["vs_jsr"]["vs"]), []).append(r)
    out = []
    for (section, mode, batch, steps, vs), peers in groups.items():
        # The fastest peer: the one jsr's time is the largest multiple of (the rows' `vs_jsr`, round by round).
        fastest = max(peers, key=lambda r: r["vs_jsr"]["call"])
        compiled = [r for r in peers if r["vs_jsr"]["compile"]]
        quickest = max(compiled, key=lambda r: r["vs_jsr"]["compile"]) if compiled else None
        out.append({
            "section": section, "mode": mode, "B": batch, "T": steps, "jsr": vs,
            "fastest_peer": fastest["method"], "call_ratio": fastest["vs_jsr"]["call"],
            "quickest_compile_peer": quickest and quickest["method"],
            "compile_ratio": quickest and quickest["vs_jsr"]["compile"],
        })
    return out


def criteria(results: dict) -> list[dict]:
    """The issues' speed targets, evaluated on these results (None where the rows are missing)."""
    fwd1 = headline(results, 1, 1000, "forward")
    train1 = headline(results, 1, 1000, "train")
    fwd64 = headline(results, 64, 1000, "forward")

    def check(name, value, ok):
        return {"criterion": name, "value": value, "met": None if value is None else bool(ok(value))}

    remat_ratio = None
    rows = {r["method"]: r for r in results["rows"] if r["model"] == "traveller" and r["section"] == "grid"
            and r["mode"] == "train" and r["B"] == 1 and r["T"] == 10000 and r["status"] == "ok" and r["memory"]}
    if "jax-scan-remat" in rows and "jax-scan-u1" in rows:
        remat_ratio = rows["jax-scan-remat"]["memory"]["temp_bytes"] / rows["jax-scan-u1"]["memory"]["temp_bytes"]
    peers = peer_groups(results)
    worst_call = max((g["call_ratio"] for g in peers), default=None)
    worst_compile = max((g["compile_ratio"] for g in peers if g["compile_ratio"] is not None), default=None)
    return [
        check("forward B=1 T=1000: lax.scan >= 30x the seed loop (issues 3, 5)", fwd1["scan_speedup_vs_seed"],
              lambda v: v >= 30),
        check("train step B=1 T=1000: jitted >= 10x the eager torch step (issue 3)", train1["scan_speedup_vs_seed"],
              lambda v: v >= 10),
        check("forward B=1 T=1000: <= 3 µs per step (issue 6)", fwd1["scan_us"], lambda v: v <= 3),
        check("forward B=1 T=1000: >= 80x the seed loop (issue 6)", fwd1["scan_speedup_vs_seed"], lambda v: v >= 80),
        check("forward B=64 T=1000: within 2x of the limit row (issue 6)", fwd64["scan_x_limit"], lambda v: v <= 2),
        check("train B=1 T=10000: temp memory with remat <= 1/3 of without (issue 6)", remat_ratio,
              lambda v: v <= 1 / 3),
        check("peers: jsr's warm call <= the fastest JAX peer's in every peer cell (jsr ÷ peer, worst; issue 16)",
              worst_call, lambda v: v <= 1),
        check("peers: jsr's compile <= the fastest-compiling peer's in every peer cell (jsr ÷ peer, worst; "
              "issue 16)", worst_compile, lambda v: v <= 1),
    ]


def markdown(results: dict, plots: dict[str, str] | None = None) -> str:
    """The results as Markdown: headline, criteria, per-step tables, compile sweep, memory, agreement."""
    host, cfg, rows = results["host"], results["config"], results["rows"]
    threads = host["torch_threads"]
    vae = host.get("torch_threads_vae")
    vae_threads = ("; VAE rows: " + ", ".join(f"{t['chosen']} at B={b}" for b, t in vae.items())
                   + f", {next(iter(vae.values()))['how']}") if vae else ""
    lines = [
        f"# Scan vs loop: `{host['host_kind']}` ({cfg['dtype']}, preset `{cfg['label']}`)",
        "",
        f"Machine: {host['cpu']} ({host['cpu_count']} cores), torch device `{host['torch_device']}`, "
        f"JAX devices {', '.join(host['jax_devices'])}. torch {host['torch']} "
        f"({threads['chosen']} intra-op thread(s), {threads['how']}{vae_threads}), jax {host['jax']}, "
        f"flax {host['flax']}, "
        f"Python {host['python']}."
        + (f" JAX bf16 via `{results['jax_bf16']}`." if results.get("jax_bf16") else "")
        + f" Load average at start / end: {results['load_average']['start']} / "
        f"{results['load_average']['end']}. Started {results['started']}, wall time {results['wall_s']:.0f} s.",
        "",
        f"Traveller: H={cfg['hidden_size']}, {cfg['num_layers']} layers, F={cfg['num_inputs']}, the same weights "
        "in every row. Each figure is the median of up to "
        f"{cfg['repeats']} timed samples (at least {cfg['min_repeats']}) after a warm-up call, divided by T; "
        "every ratio compares two medians of the same cell of this run. `vs seed`: how many times faster "
        "than the seed's loop (higher is better). `vs limit`: how many times slower than the limit row, the "
        "same FLOPs with the time dependency removed (a reference, not a bound: a row below 1× ran faster than "
        "the limit's batched code). Train step: value + grad + Adam "
        "update of the trading loss; the jsr rows through `TrainStep`, as `fit` takes it.",
        "",
    ]
    if results.get("interrupted"):
        lines += [f"**Incomplete:** {results['interrupted']}; later cells are missing.", ""]
    for mode in ("forward", "train"):
        h = headline(results, 1, 1000, mode)
        if h["scan_us"] is None and h["seed_us"] is None:
            continue
        lines += [
            f"**Headline, {mode}, B=1, T=1000:** seed loop {format_us(h['seed_us'])}/step, "
            f"lax.scan ({h['scan_method']}, unroll={h['scan_unroll']}) {format_us(h['scan_us'])}/step = "
            f"**{format_ratio(h['scan_speedup_vs_seed'])} faster** than the seed loop; limit ({h['limit_method']}) "
            f"{format_us(h['limit_us'])}/step, so the scan is {format_ratio(h['scan_x_limit'])} the limit.",
            "",
        ]
    lines += ["## Targets from the issues", "", "| criterion | measured | met |", "|---|---|---|"]
    for c in criteria(results):
        v = c["value"]
        shown = "—" if v is None else (f"{v:.3g} µs" if "µs" in c["criterion"] else
                                       f"{v:.1%} of it" if "memory" in c["criterion"] else format_ratio(v))
        lines.append(f"| {c['criterion']} | {shown} | {'—' if c['met'] is None else ('yes' if c['met'] else 'no')} |")
    lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{k}]({name})" for k, name in sorted(plots.items())] + [""]

    methods = results["methods"]
    seq_lens, batch_sizes = sorted(cfg["seq_lens"]), sorted(cfg["batch_sizes"])
    trav = [r for r in rows if r["model"] == "traveller" and not r.get("mode_na")]
    for mode in cfg["modes"]:
        for batch in batch_sizes:
            cell_rows = [r for r in trav if r["section"] == "grid" and r["mode"] == mode and r["B"] == batch]
            if not cell_rows:
                continue
            lines += [f"## {mode.capitalize()}, B={batch}: time per step", ""]
            header = "| method |" + "".join(f" T={t} | vs seed | vs limit |" for t in seq_lens)
            lines += [header, "|---|" + "---:|---:|---:|" * len(seq_lens)]
            notes: list[str] = []
            for key in _ordered_keys(cell_rows):
                cells = []
                for steps in seq_lens:
                    r = _find(cell_rows, method=key, T=steps)
                    if r is None:
                        cells.append("| | |")
                    elif r["status"] == "ok":
                        cells.append(f"{format_us(r['per_step_us'])} | {format_ratio(r['speedup_vs_seed'])} | "
                                     f"{format_ratio(r['x_limit'])}")
                    else:
                        tag = _note_tag(notes, r["status"], r["reason"])
                        cells.append(f"{r['status']} {tag} | | ")
                lines.append(f"| {_label(methods, key)} | " + " | ".join(cells) + " |")
            lines.append("")
            lines += [f"{tag} {text}  " for tag, text in _notes(notes)] + [""]

    lines += _peer_section(results, methods)

    vae = [r for r in rows if r["model"] != "traveller" and not r.get("mode_na")]
    if vae:
        lines += ["## VAE decoder: scheduled sampling and greedy generation", "",
                  f"GRU decoder, V={cfg['vae_vocab']}, H={cfg['vae_hidden']}, Z={cfg['vae_latent']}, "
                  f"{cfg['vae_layers']} layer(s). Scheduled sampling: one coin per token (p = 0.5) chooses between "
                  "the model's argmax and the true token; its train step is the whole VAE loss (encoder, "
                  "decoder, KL) + Adam. `vs torch loop`: how many times faster than torch_ref's eager loop of "
                  "the same task. Teacher forcing feeds nothing back: the bound for scheduled sampling.", "",
                  "| task | method | mode | B | T | per step | vs torch loop | agreement |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        notes = []
        for r in vae:
            agree = r.get("max_abs_diff") or {}
            shown = "—" if agree.get("value") is None or r["method"] == agree.get("vs") else (
                f"{agree['value']:.1%} tokens differ" if agree.get("metric") == "tokens differing"
                else f"max abs diff {agree['value']:.1e}")
            if r["status"] == "ok":
                lines.append(f"| {r['model']} | {_label(methods, r['method'])} | {r['mode']} | {r['B']} | {r['T']} | "
                             f"{format_us(r['per_step_us'])} | {format_ratio(r['speedup_vs_seed'])} | {shown} |")
            else:
                tag = _note_tag(notes, r["status"], r["reason"])
                lines.append(f"| {r['model']} | {_label(methods, r['method'])} | {r['mode']} | {r['B']} | {r['T']} | "
                             f"{r['status']} {tag} | | |")
        lines += [""] + [f"{tag} {text}  " for tag, text in _notes(notes)] + [""]

    sweep = [r for r in rows if r["section"] == "sweep"]
    if sweep:
        lens = sorted({r["T"] for r in sweep})
        lines += [f"## Short-T sweep (forward, B={cfg['sweep_batch']}): first call (compile) and time per step", "",
                  "| method |" + "".join(f" T={t} first call | T={t} per step |" for t in lens),
                  "|---|" + "---:|---:|" * len(lens)]
        for key in _ordered_keys(sweep):
            cells = []
            for steps in lens:
                r = _find(sweep, method=key, T=steps)
                if r is None or r["status"] != "ok":
                    cells.append(f"{r['status'] if r else ''} | ")
                else:
                    cells.append(f"{r['first_call_s']:.3g} s | {format_us(r['per_step_us'])}")
            lines.append(f"| {_label(methods, key)} | " + " | ".join(cells) + " |")
        lines.append("")

    b0 = batch_sizes[0]
    compiled = [r for r in trav if r["section"] == "grid" and r["status"] == "ok" and r["B"] == b0
                and (r["compile_s"] is not None or r["method"].startswith("torch-compile"))]
    if compiled:
        lines += [f"## First call (compile included), B={b0}", "",
                  "| method | mode |" + "".join(f" T={t} |" for t in seq_lens), "|---|---|" + "---:|" * len(seq_lens)]
        for key in _ordered_keys(compiled):
            for mode in cfg["modes"]:
                cells = []
                for steps in seq_lens:
                    r = _find(compiled, method=key, T=steps, mode=mode)
                    cells.append("—" if r is None else f"{r['first_call_s']:.3g} s")
                if any(c != "—" for c in cells):
                    lines.append(f"| {_label(methods, key)} | {mode} | " + " | ".join(cells) + " |")
        lines.append("")

    mem = [r for r in trav if r["section"] == "grid" and r["status"] == "ok" and r["memory"]]
    if mem:
        lines += ["## Memory", "",
                  "JAX rows: temporary buffers of the compiled program (`compiled.memory_analysis()`); "
                  "torch rows on a GPU: `torch.cuda.max_memory_allocated()` during the first call, above what "
                  "was allocated before it; torch rows on a CPU: not measured.", ""]
        for mode in cfg["modes"]:
            mode_rows = [r for r in mem if r["mode"] == mode]
            if not mode_rows:
                continue
            cells = sorted({(r["B"], r["T"]) for r in mode_rows})
            lines += [f"{mode.capitalize()}:", "",
                      "| method |" + "".join(f" B={b}, T={t} |" for b, t in cells), "|---|" + "---:|" * len(cells)]
            for key in _ordered_keys(mode_rows):
                row_cells = []
                for b, t in cells:
                    r = _find(mode_rows, method=key, B=b, T=t)
                    m = r["memory"] if r else {}
                    row_cells.append(_bytes(m.get("temp_bytes", m.get("peak_bytes"))) if m else "—")
                lines.append(f"| {_label(methods, key)} | " + " | ".join(row_cells) + " |")
            lines.append("")

    agree = [r for r in trav if r.get("max_abs_diff") and r["max_abs_diff"].get("value") is not None
             and r["method"] != r["max_abs_diff"]["vs"]]
    if agree:
        worst: dict[str, dict] = {}
        for r in agree:
            if r["method"] not in worst or r["max_abs_diff"]["value"] > worst[r["method"]]["max_abs_diff"]["value"]:
                worst[r["method"]] = r
        lines += ["## Agreement (same weights, same inputs)", "",
                  "Largest |positions - reference| over every forward cell measured (reference: the seed loop, "
                  "or lax.scan unroll=1 where the seed loop was skipped).", "",
                  "| method | vs | max abs diff | at B, T |", "|---|---|---:|---|"]
        for key, r in worst.items():
            d = r["max_abs_diff"]
            lines.append(f"| {_label(methods, key)} | {d['vs']} | {d['value']:.2e} | {r['B']}, {r['T']} |")
        lines.append("")
    lines += ["## Rows", "", "| key | method | what it is |", "|---|---|---|"]
    for key, m in methods.items():
        lines.append(f"| `{key}` | {m['label']} | {m['note']} |")
    return "\n".join(lines) + "\n"


def _peer_section(results: dict, methods: dict) -> list[str]:
    """The peer rows against their jsr rows, cell by cell, and the fastest peer of each cell."""
    peers = [r for r in results["rows"] if r["role"] == "peer" and not r.get("mode_na")]
    if not peers:
        return []
    lines = ["## Peers: what a JAX user would write, vs jsr", "",
             "Flax NNX, Equinox and torchax written the way their users would, jitted as the jsr rows are (a "
             "`jax.jit` of a function of the parameters, compiled ahead of time; the jsr rows with the library's "
             "compiler options, `jax_scan_rnn.xla_flags.compiler_options()`, the peers with jax.jit's defaults), "
             "on the jsr rows' weights; each "
             "against the jsr row named (feedback peers: jsr.Traveller; peers without feedback: jsr.LSTM / "
             "jsr.GRU over the whole sequence). `jsr ÷ peer`: jsr's time over the peer's (<= 1: jsr at "
             "least as fast), the median over the cell's interleaved rounds of the two rows' ratio, for the warm "
             "call (the rows' samples) and for the compile (trace + XLA compile, timed apart; "
             f"{results['config'].get('compile_rounds', 1)} compile(s) per row, interleaved across the cell); "
             "agreement: max |positions - jsr's|.", "",
             "| mode | B | T | peer | per step | jsr row | jsr per step | jsr ÷ peer | compile, peer | compile, jsr | "
             "jsr ÷ peer | agreement |",
             "|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    notes: list[str] = []
    rows = results["rows"]
    for r in peers:
        steps = f"{r['T']}" + (" (sweep)" if r["section"] == "sweep" else "")
        head = f"| {r['mode']} | {r['B']} | {steps} | {_label(methods, r['method'])} |"
        if r["status"] != "ok":
            lines.append(f"{head} {r['status']} {_note_tag(notes, r['status'], r['reason'])} | | | | | | | |")
            continue
        vs = r.get("vs_jsr") or {}
        jsr_row = _find(rows, section=r["section"], mode=r["mode"], B=r["B"], T=r["T"], method=vs.get("vs"))
        agree = (r.get("max_abs_diff") or {}).get("value")
        lines.append(
            f"{head} {format_us(r['per_step_us'])} | {vs.get('vs', '—')} | "
            f"{format_us(jsr_row and jsr_row['per_step_us'])} | {format_ratio(vs.get('call'))} | "
            f"{_seconds(r['compile_s'])} | {_seconds(jsr_row and jsr_row['compile_s'])} | "
            f"{format_ratio(vs.get('compile'))} | {'—' if agree is None else f'{agree:.1e}'} |")
    lines += [""] + [f"{tag} {text}  " for tag, text in _notes(notes)] + [""]
    groups = peer_groups(results)
    if groups:
        lines += ["Fastest peer of each cell against its jsr row:", "",
                  "| mode | B | T | jsr row | fastest peer | jsr ÷ it | fastest-compiling peer | jsr ÷ it |",
                  "|---|---:|---|---|---|---:|---|---:|"]
        for g in groups:
            steps = f"{g['T']}" + (" (sweep)" if g["section"] == "sweep" else "")
            lines.append(f"| {g['mode']} | {g['B']} | {steps} | {g['jsr']} | {_label(methods, g['fastest_peer'])} | "
                         f"{format_ratio(g['call_ratio'])} | "
                         f"{_label(methods, g['quickest_compile_peer']) if g['quickest_compile_peer'] else '—'} | "
                         f"{format_ratio(g['compile_ratio'])} |")
        lines.append("")
    return lines


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g} s"


def _label(methods: dict, key: str) -> str:
    return methods.get(key, {}).get("label", key)


def _ordered_keys(rows: list[dict]) -> list[str]:
    """The rows' method keys, each once, in the order they were measured."""
    return list(dict.fromkeys(r["method"] for r in rows))


def _note_tag(notes: list[str], status: str, reason: str | None) -> str:
    text = f"{status}: {reason or 'no reason given'}"
    if text not in notes:
        notes.append(text)
    return f"({_letter(notes.index(text))})"


def _letter(i: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[i] if i < 26 else f"n{i}"


def _notes(notes: list[str]) -> list[tuple[str, str]]:
    return [(f"({_letter(i)})", text) for i, text in enumerate(notes)]


def _plot(results: dict, out: Path, stem: str) -> dict[str, Path]:
    require("matplotlib", "the benchmark's plots (or pass --no-plots)").use("Agg")
    import matplotlib.pyplot as plt

    rows, cfg = [r for r in results["rows"] if r["model"] == "traveller"], results["config"]
    methods = {k: m for k, m in results["methods"].items() if any(r["method"] == k for r in rows)}
    paths = {}
    batches = sorted(cfg["batch_sizes"])
    styles = _styles(list(methods))
    for mode in cfg["modes"]:
        fig, axes = plt.subplots(1, len(batches), figsize=(5.2 * len(batches), 4.6), squeeze=False)
        for ax, batch in zip(axes[0], batches):
            for key in methods:
                pts = sorted((r["T"], r["per_step_us"]) for r in rows if r["method"] == key and r["mode"] == mode
                             and r["status"] == "ok" and (r["B"] == batch))
                if not pts:
                    continue
                ax.plot(*zip(*pts), label=methods[key]["label"], **styles[key])
            ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="time per step (µs)",
                   title=f"{mode}, B={batch}")
            ax.grid(True, which="both", alpha=0.3)
        handles, labels = axes[0][0].get_legend_handles_labels()
        for ax in axes[0][1:]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.suptitle(f"Traveller {mode}: time per step vs T ({results['host']['host_kind']}, {cfg['dtype']})")
        fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(labels) / 3), 1, 1))
        path = out / f"{stem}-{mode}.png"
        save_figure(fig, path, dpi=110)
        plt.close(fig)
        paths[f"png_{mode}"] = path

    fig, ax = plt.subplots(figsize=(7.5, 5))
    b0 = cfg["sweep_batch"]
    compiling = [k for k in methods if methods[k].get("kind") == "compiled"
                 and methods[k]["role"] not in ("limit", "bound")]
    for key in compiling:  # the one-off cost of the first call: first call minus a warm call
        pts = sorted((r["T"], max(r["first_call_s"] - r["call_s"], 1e-4)) for r in rows if r["method"] == key
                     and r["mode"] == "forward" and r["status"] == "ok" and r["B"] == b0)
        if pts:
            ax.plot(*zip(*pts), label=methods[key]["label"], **styles[key])
    ax.set(xscale="log", yscale="log", xlabel="sequence length T",
           ylabel="first call minus a warm call (s)",
           title=f"Compile / trace / capture cost vs T, forward, B={b0} ({results['host']['host_kind']})")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a run of VAE rows only has no compile curve
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{stem}-compile.png"
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    paths["png_compile"] = path
    return paths


def _styles(keys: list[str]) -> dict[str, dict]:
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20").colors
    styles = {}
    for i, key in enumerate(keys):
        style = {"color": colors[i % len(colors)], "marker": "os^vD<>ph*"[i % 10], "markersize": 4, "linewidth": 1.3}
        if key.startswith("limit"):
            style.update(color="black", linestyle="--", marker="x")
        elif key == SEED_KEY:
            style.update(color="tab:red", linewidth=2.2)
        elif key == AUTO_KEY:
            style.update(color="tab:blue", linewidth=2.2)
        elif key.startswith("peer-"):
            style.update(linestyle="-.")
        elif key.endswith(("lstm-seq", "gru-seq")):
            style.update(linestyle=":")
        styles[key] = style
    return styles
