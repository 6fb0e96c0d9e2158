"""What a training run leaves for people to read: `metrics.jsonl` rows, the `History` of them, `curves.png`, and
reports as strict JSON (`strict_json`).

`fit` (train.py) computes; this module writes and draws. A row is one JSON object per line:
`{"step", "split": "train"|"eval", "loss", "metrics": {...}, "lr", "wall_time", "elapsed_s", ...}`, in strict JSON:
a number that is not finite (a NaN metric) is written as null, and `read_rows` reads it back as NaN.
"""
from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn

METRICS_FILE = "metrics.jsonl"  # one JSON row per log / eval, under out_dir
CURVES_FILE = "curves.png"  # loss / lr / metric curves, written at the end of fit
CHECKPOINT_DIR = "checkpoints"  # checkpoint root under out_dir


def write_atomically(path: str | os.PathLike, write: Callable[[IO], object], binary: bool = False) -> None:
    """`write(open file)` into a temporary file beside `path`, flushed to disk, then renamed to `path` in one step:
    a failed or interrupted write never leaves half a file, nor spoils an older one (a report, an export, a
    benchmark's results, the log cut back on resume). The file gets the permissions `open` gives (the umask's).

    A path that is not a regular file (`/dev/stdout`, `/dev/null`, a FIFO) or is a symbolic link is written through,
    in place: a rename would replace the node itself (as root, `/dev/null` with a regular file) or the link. An
    OSError names `path` (`filename`), whichever file the system refused.

    Text is UTF-8 whatever the locale: the package reads its files back as UTF-8, and Windows' locale encoding
    (cp1252) cannot hold every asset name or vocabulary symbol a user's data may have."""
    target = Path(path)
    mode, options = ("wb", {}) if binary else ("w", {"newline": "", "encoding": "utf-8"})
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        if target.is_symlink() or (target.exists() and not target.is_file()):
            with open(target, mode, **options) as f:
                write(f)
            return
        try:
            with open(tmp, mode, **options) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as err:  # a write that failed (a full disk) names no file, a failed open the temporary one
        _raise_naming(err, target, unless=str(tmp))


def _raise_naming(err: OSError, path: Path, unless: str | None = None) -> NoReturn:
    """Raise `err` as the same error naming `path` (`filename`) when it names no file (or `unless`, a temporary
    one); else as it is."""
    if err.errno is None or err.filename not in (None, unless):
        raise err
    raise type(err)(err.errno, err.strerror, str(path)) from err


def save_figure(fig, path: str | os.PathLike, dpi: int) -> None:
    """A matplotlib figure into `path` through `write_atomically` (an interrupted save leaves no half image), in the
    format its suffix names (PNG by default)."""
    kind = Path(path).suffix.lstrip(".").lower() or "png"
    write_atomically(path, lambda f: fig.savefig(f, format=kind, dpi=dpi), binary=True)


def strict_json(obj, **kwargs) -> str:
    """`json.dumps(obj)` as strict JSON, which has no NaN: a non-finite float (a metric undefined for this run, such
    as the uniqueness of samples none of which is valid) is written as null. NumPy scalars are written as numbers."""
    return json.dumps(_finite_or_none(obj), allow_nan=False, **kwargs)


def _finite_or_none(obj):
    if isinstance(obj, numbers.Integral) and not isinstance(obj, int):  # a NumPy integer
        return int(obj)
    if isinstance(obj, numbers.Real) and not isinstance(obj, int):  # float, and NumPy's floats of any width
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


@dataclass(frozen=True)
class History:
    """What `fit` returns: the rows of `metrics.jsonl` (also when `out_dir` is None)."""

    # train rows: step, split, loss, metrics, grad_norm (the gradient's global norm before clipping, as
    # clip_by_global_norm reads it), lr (the window's last update's), wall_time, elapsed_s (seconds since
    # this fit call began: from 0 again on resume), ...; loss, metrics and grad_norm are means over the window
    train: list[dict]
    eval: list[dict]  # eval rows: step, split, loss (if eval_fn returned one), metrics, lr, wall_time, ...
    step: int  # updates completed
    resumed_from: int | None = None  # checkpoint step the run resumed from, if it did
    out_dir: Path | None = None  # where metrics, curves and checkpoints were written
    checkpoints_skipped: tuple[tuple[int, str], ...] = ()  # invalid ones on resume
    checkpoints_moved_aside: tuple[tuple[int, Path], ...] = ()  # (step, where): kept, unused
    checkpoint_stray_files: tuple[str, ...] = ()  # unlisted files in the resumed checkpoint

    def series(self, key: str = "loss", split: str = "train") -> tuple[list[int], list[float]]:
        """(steps, values) of `key` (a row field such as `loss`/`lr`, or a metric name) in the `split` rows
        ("train" or "eval"). A key in no row of either split is a ValueError naming those there are (a misspelt
        metric gave an empty series, an empty plot); one that only the other split has gives an empty series."""
        if split not in ("train", "eval"):  # any other word read the eval rows
            raise ValueError(f"split: expected 'train' or 'eval', got {split!r}")
        rows = self.train + self.eval
        known = {k for r in rows for k in r if k != "metrics"} | {m for r in rows for m in r.get("metrics", {})}
        if rows and key not in known:
            raise ValueError(f"key: expected a row field or metric of this run, one of {', '.join(sorted(known))}; "
                             f"got {key!r}")
        return self._series(key, split)

    def _series(self, key: str, split: str) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for r in self.train if split == "train" else self.eval:
            v = r[key] if key in r else r.get("metrics", {}).get(key)
            if isinstance(v, (int, float)):
                xs.append(r["step"])
                ys.append(v)
        return xs, ys


class RunLog:
    """The rows of one run, kept in memory and appended to `out_dir/metrics.jsonl` (if `out_dir` is set).

    `resume_at(step)` keeps the earlier run's rows up to `step` and drops later ones (they will be recomputed),
    so the file reads as one run. With `write=False` (every process of a multi-process run but the first) the
    rows are kept in memory only: one process writes the file.
    """

    def __init__(self, out_dir: Path | None, write: bool = True):
        self.path = out_dir / METRICS_FILE if out_dir is not None else None
        self.write = write and self.path is not None
        self.rows: list[dict] = []
        self.file = None

    def resume_at(self, step: int) -> None:
        self.rows = [r for r in read_rows(self.path) if r["step"] <= step]
        if not self.write:
            return
        write_atomically(self.path, lambda f: f.writelines(strict_json(r) + "\n" for r in self.rows))

    def __enter__(self) -> RunLog:
        if self.write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a" if self.rows else "w", encoding="utf-8")
        return self

    def __exit__(self, *exc) -> None:
        if self.file is None:
            return
        try:
            self.file.close()
        except OSError as err:  # closing flushes what a full disk refused again: the first error is the one to see
            if exc[0] is None:
                _raise_naming(err, self.path)

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        if self.file is not None:
            try:
                self.file.write(strict_json(row) + "\n")
                self.file.flush()
            except OSError as err:  # a full disk: name the log
                _raise_naming(err, self.path)
        return row

    def history(self, **kwargs) -> History:
        return History(train=[r for r in self.rows if r.get("split") == "train"],
                       eval=[r for r in self.rows if r.get("split") == "eval"], **kwargs)


def read_rows(path: Path) -> list[dict]:
    """The rows of the log at `path` (none if there is no file), skipping a last line a crash cut short and any
    line that is not a row (a note, bytes that are not text: a row is ASCII JSON)."""
    rows = []
    if not path.is_file():
        return rows
    text = path.read_text(encoding="utf-8", errors="replace")  # undecodable bytes: a line no JSON parser takes
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(_nan_for_null(row))
    return rows


def _nan_for_null(row: dict) -> dict:
    """A row as `RunLog.add` had it: strict JSON's null back to NaN in the numeric fields (an eval row's loss is
    its metrics' "loss", None where `eval_fn` returned none)."""
    if isinstance(row.get("metrics"), dict):
        row["metrics"] = {m: math.nan if v is None else v for m, v in row["metrics"].items()}
    for key in ("loss", "grad_norm", "lr", "steps_per_s"):
        if key in row and row[key] is None:
            row[key] = row.get("metrics", {}).get("loss") if key == "loss" and row.get("split") == "eval" else math.nan
    return row


def curve_panels(history: History) -> tuple[dict[str, dict[str, list]], dict[str, float]]:
    """({panel: {split: [(step, value)]}} for every series that changes, {name: value} for those that do not).

    A series is constant when two or more of its points, train and eval together, all have one value; a series of one
    point (a run shorter than two log windows) is drawn: one value says nothing about whether it changed (a cosine
    learning rate logged once is no constant learning rate)."""
    names = list(dict.fromkeys(m for r in history.train + history.eval for m in r.get("metrics", {}) if m != "loss"))
    series = {key: {split: [(x, y) for x, y in zip(*history._series(key, split)) if math.isfinite(y)]
                    for split in (("train", "eval") if key != "lr" else ("train",))}
              for key in ["loss", "lr", "grad_norm", *names]}
    constant = {key: pts[0][1] for key, by_split in series.items()
                if len(pts := [p for split in by_split.values() for p in split]) > 1 and len({y for _, y in pts}) == 1}
    return {k: v for k, v in series.items() if k not in constant and any(v.values())}, constant


def plot_curves(history: History, path: Path) -> None:
    """Loss, learning rate, gradient norm and every metric against the step, as one PNG. Train points are means
    over a log window; eval points come from `eval_fn` (the run's held-out set). A series that never changes
    (a learning rate held constant, a replacement probability of 0 under teacher forcing) gets no panel: the
    figure's title lists it with its value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is slow to import
    from matplotlib.figure import Figure

    series, constant = curve_panels(history)
    panels = list(series)
    ncols = max(1, min(3, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    height = 3.2 * nrows + 0.8  # inches: the panels and a two-line title
    fig = Figure(figsize=(4.5 * ncols, height))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.5 / height, top=1 - 0.85 / height, wspace=0.3, hspace=0.5)
    FigureCanvasAgg(fig)
    title = "train: mean over each log window; eval: the held-out set"
    if constant:
        title += "\nconstant, not drawn: " + ", ".join(f"{k} = {v:g}" for k, v in constant.items())
    fig.suptitle(title, fontsize="small")
    for idx, key in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, idx + 1)
        for split, pts in series[key].items():
            if pts:
                ax.plot(*zip(*pts), label=split, marker="." if len(pts) < 30 else None)
        values = [y for line in ax.lines for y in line.get_ydata()]
        if key == "loss" and min(values) > 0:
            ax.set_yscale("log")
        ax.set(title=key, xlabel="step", ylabel=key)
        ax.grid(alpha=0.3)
        if key != "lr":
            ax.legend(fontsize="small")
    save_figure(fig, path, dpi=90)
