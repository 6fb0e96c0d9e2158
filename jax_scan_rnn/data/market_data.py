"""Read, check, split and standardise a user's own time-ordered market data (numpy only).

Convention: N paths of T steps. `features[:, t]` is what the model reads at step t; `returns[:, t]` is the
return EARNED BY THE POSITION CHOSEN AT t, i.e. the NEXT period's return (as the simulated `Market.returns`).
In a CSV, row t holds the features known at t and the return from t to t+1:

    date,mom_20,ret_spx          # ret_spx on row 2024-01-02 is the return from 01-02 to 01-03
    2024-01-02,0.31,0.0110
    2024-01-03,-0.12,-0.0040

A price file usually has the return UP TO t on row t (close[t] / close[t-1] - 1): shift that column up by
one row (ret_next[t] = ret[t + 1]) and drop the last row, which has no next return. Unshifted, the position
chosen at t would be paid a return already realised at t: look-ahead, and a backtest too good to be true. A feature
whose correlation with its row's return reaches `LOOK_AHEAD_CORRELATION` (the 1-day return up to t beside that
unshifted return) draws a warning naming both, but for a return its own previous row foretells as closely (a cash
asset's, the rate known at t); a looser look-ahead (a 5-day momentum beside it) is not caught.

Returns are simple returns as decimal fractions: 0.01 is +1% (not percent, not log returns, not prices). The
objective's risk aversion and trading cost (gamma, lambda) do not scale with the unit: percent returns (1.0 for
1%) give a different optimum, not the same one scaled. A return column that looks like prices (every value > 0,
and a mean > 0.5 or steps small beside a level of at least 0.1) or like percent (both signs, median non-zero |value|
> 0.3) draws a warning.

Formats of `read`:
    .npz      arrays features [N, T, F] and returns [N, T, A]; optional feature_names [F], asset_names [A]
    .csv      header row, comma separated, rows in time order, oldest first (stdlib `csv`)
    .parquet  the same table as a CSV (needs pyarrow: pip install 'jax-scan-rnn[parquet]')
For a table, `feature_cols` / `return_cols` select columns by exact name or fnmatch pattern ("ret_*"), in
the file's column order (a pattern, '*' too, skips the date columns and pandas' index named below); `path_col`
groups rows into paths, in order of first appearance (default: the whole file is one path), and is never a
feature or a return. A boolean feature (a flag, parquet or npz) reads
as 0.0 / 1.0; a boolean return is an error.

Time order: a column named date, datetime, time or timestamp (any case) or pandas' unnamed index ("" in a CSV,
__index_level_0__ in a parquet file), neither a feature nor a return, whose non-blank cells are all dates or times
is checked: ISO (2024-01-02, 2024-01-02T15:30, 20240102 as text or integers), parquet dates, or an export's
(01/31/2024, 31/01/2024, 31.01.2024, 2024/01/31, 31-Jan-2024, each with or without a time HH:MM[:SS];
`OTHER_DATE_FORMATS`), a date and time as one number (20240102153000), or Unix time in seconds, milliseconds,
microseconds or nanoseconds (`EPOCH_MIN`). Within a path each stamp must be later than the one before (a file
written newest first, or the same bar twice, is refused); a blank cell is refused (date missing); and the stamps
must all have a time zone, or none. A column that reads two ways (01/02/2024: month or day first) passes if either
reading is in order; a column of other cells is taken as it comes. Local times without a zone repeat an hour when
daylight saving time ends (01:00-02:00 twice): that is refused as going back in time, as nothing in the file says
which hour came first; write the stamps with their UTC offset (2024-10-27T02:30+01:00) or in UTC, or the date and
the time of day as two columns (date, time: only the dates are then checked, and may repeat).

Missing values (empty cell, "nan"/"NA", parquet null, NaN in npz) follow `fill`:
    error  (default) refuse, naming the first one;
    ffill  carry the path's last value of the feature forward;
    zero   replace a missing feature by 0, in the file's units, before standardisation: not the feature's mean
           (a feature around 5 gets an outlier), so ffill or drop usually suit a feature better;
    drop   drop the steps with any missing value, feature or return, per path (paths must stay equal).
ffill and zero fill features only. Returns are never made up (a made-up return would be scored as earned): a
missing return under them is an error; choose drop, or remove the row (e.g. the last row after the shift above).
An infinite value is always an error: it is a data bug, not a gap.

`time_split` cuts contiguous train/valid/test periods (never shuffled). Fit `Standardiser` on the training
period only and apply it to every period, so no statistic looks ahead. A slice [a, b) ends with the return
realised at step b, which is known when step b begins: the next period's labels do not overlap it. Every path is
cut at the same step, so paths (path_col) must cover the same dates row for row: paths of different years would
put one path's training period after another's test period (`check_split` refuses that, by the date column).
"""
from __future__ import annotations

import contextlib
import csv
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta, timezone
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

from jax_scan_rnn import validate
from jax_scan_rnn.optional import require

FILLS = ("error", "ffill", "zero", "drop")
WHOLE_FILE = "(whole file)"  # the one path of a table without path_col, as messages name it
SUFFIXES = (".npz", ".csv", ".parquet")
_MISSING = ("", "nan", "na")  # compared lower-cased, after stripping blanks


@dataclass(frozen=True)
class MarketData:
    """Time-ordered market data: N paths of T steps (see the module docstring for the alignment)."""

    features: np.ndarray  # [N, T, F] float64: what the model reads at step t
    returns: np.ndarray  # [N, T, A] float64: the return earned by the position chosen at t (next period's)
    feature_names: tuple[str, ...]
    asset_names: tuple[str, ...]
    # Where each step came from, for output that must line up with the file: the path's label (its path_col
    # value; an npz's path index) and [N, T] each step's index among its path's rows as read (0 = the first), which
    # skips the rows fill='drop' dropped. Default: paths 0..N-1, steps 0..T-1.
    path_labels: tuple | None = None
    source_steps: np.ndarray | None = None
    # [N, T] datetime64 (UTC where the file gave zones): each step's stamp in the file's date column; None without one
    # that reads (one way) as dates. What the time split and a Sharpe ratio's periods_per_year are checked by.
    step_times: np.ndarray | None = None

    def __post_init__(self):
        x, r = np.asarray(self.features, np.float64), np.asarray(self.returns, np.float64)
        if x.ndim != 3 or r.ndim != 3 or x.shape[:2] != r.shape[:2]:
            raise ValueError(f"features, returns: expected [N, T, F] and [N, T, A], got {x.shape} and {r.shape}")
        if len(self.feature_names) != x.shape[2] or len(self.asset_names) != r.shape[2]:
            raise ValueError(f"feature_names, asset_names: expected {x.shape[2]} and {r.shape[2]} names, got "
                             f"{len(self.feature_names)} and {len(self.asset_names)}")
        labels = tuple(range(x.shape[0])) if self.path_labels is None else tuple(self.path_labels)
        steps = (np.broadcast_to(np.arange(x.shape[1]), x.shape[:2]) if self.source_steps is None
                 else np.asarray(self.source_steps))
        if len(labels) != x.shape[0] or steps.shape != x.shape[:2]:
            raise ValueError(f"path_labels, source_steps: expected {x.shape[0]} labels and shape {x.shape[:2]}, got "
                             f"{len(labels)} and {steps.shape}")
        for name, value in (("features", x), ("returns", r), ("feature_names", tuple(self.feature_names)),
                            ("asset_names", tuple(self.asset_names)), ("path_labels", labels), ("source_steps", steps)):
            object.__setattr__(self, name, value)

    num_paths = property(lambda self: self.features.shape[0])
    num_steps = property(lambda self: self.features.shape[1])
    num_features = property(lambda self: self.features.shape[2])
    num_assets = property(lambda self: self.returns.shape[2])

    def time_slice(self, start: int, stop: int) -> MarketData:
        """Steps [start, stop) of every path (views, not copies); an empty slice (start == stop) is allowed."""
        validate.integer("start", start, lo=0, hi=self.num_steps)
        validate.integer("stop", stop, lo=start, hi=self.num_steps)
        return replace(self, features=self.features[:, start:stop], returns=self.returns[:, start:stop],
                       source_steps=self.source_steps[:, start:stop],
                       step_times=None if self.step_times is None else self.step_times[:, start:stop])

    @property
    def bars_per_year(self) -> float | None:
        """Rows a year by the dates: steps per path over a path's span, on average (365.25 days a year); None
        without `step_times`, with fewer than `RATE_ROWS` steps per path, or over less than `RATE_SPAN_DAYS` where
        the bars pause (a gap over twice the median one: a night, a weekend)."""
        if self.step_times is None or self.num_steps < RATE_ROWS:
            return None
        spans = np.ptp(self.step_times, axis=1) / np.timedelta64(1, "s")  # [N] seconds
        span = float(spans.mean()) / (365.25 * 86400)  # years
        gaps = np.diff(self.step_times, axis=1)  # [N, T-1]
        if span * 365.25 < RATE_SPAN_DAYS and (gaps > 2 * np.median(gaps)).any():
            return None
        return (self.num_steps - 1) / span if span > 0 else None


def read(path, *, feature_cols: Sequence[str] | None = None, return_cols: Sequence[str] | None = None,
         path_col: str | None = None, fill: str = "error", returns: bool = True) -> MarketData:
    """Read a .npz, .csv or .parquet file into `MarketData` (formats and `fill` in the module docstring).

    `returns=False` reads the features alone (new bars to trade on, whose next returns are not known yet):
    `return_cols` must then be None, an npz needs no 'returns', and `MarketData.returns` is `[N, T, 0]`."""
    validate.choice("fill", fill, FILLS)
    if not returns and return_cols is not None:
        raise ValueError(f"return_cols: expected None when reading features alone (returns=False), got {return_cols!r}")
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{path.name}: unsupported suffix {suffix!r}; expected one of {', '.join(SUFFIXES)}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    given = {"feature_cols": feature_cols, "return_cols": return_cols, "path_col": path_col}
    if suffix == ".npz":
        for arg, value in given.items():
            if value is not None:
                raise ValueError(f"{arg}: only for .csv/.parquet files, got {value!r} with {path.name}")
        return _read_npz(path, fill, returns)
    for arg in ("feature_cols", "return_cols") if returns else ("feature_cols",):
        if given[arg] is None:
            raise ValueError(f"{arg}: required to read {path.name} (column names or patterns such as 'ret_*')")
    columns, get, where = _read_csv(path) if suffix == ".csv" else _read_parquet(path)
    if len(set(columns)) < len(columns):
        duplicates = sorted({c for c in columns if columns.count(c) > 1})
        raise ValueError(f"{path.name}: duplicate column names {duplicates}")
    if path_col is not None and path_col not in columns:
        raise ValueError(f"path_col: no column {path_col!r} in {path.name}; its columns are {_listing(columns)}")
    features = _select("feature_cols", feature_cols, columns, path_col, path.name)
    targets = _select("return_cols", return_cols, columns, path_col, path.name) if returns else []
    both = [c for c in features if c in targets]
    if both:
        raise ValueError(f"return_cols: {both} also selected by feature_cols; a feature must be known when the "
                         f"position is chosen, a return column is the future")
    names = features + targets
    matrix = np.stack([_to_float(path.name, c, get(c), where, flag=c in features) for c in names], axis=1)  # [R, C]
    if path_col is None:
        ids, labels = np.zeros(len(matrix), np.int64), [WHOLE_FILE]
    else:
        index: dict = {}
        ids = np.array([index.setdefault(k, len(index)) for k in get(path_col)], np.int64)
        # a parquet integer id column reads as floats: 101.0 is the path 101
        labels = [int(k) if isinstance(k, float) and k.is_integer() else k for k in index]
    stamps = _check_time_order(path.name, columns, get, ids, where, exclude=[*names, path_col])
    cells = [f"column {c!r}" for c in names]
    data = _assemble(path.name, matrix, ids, labels, where, cells, names, len(features), fill)
    if stamps is None:
        return data
    utc = [s.astimezone(timezone.utc).replace(tzinfo=None) if s.utcoffset() is not None else s for s in stamps]
    times = np.array(utc, dtype="datetime64[us]")  # [R] each row's
    # Each step's row: rows grouped by path, file order kept within each (as _assemble groups them), at each path's
    # first row plus its source steps; one sort, not a scan of every row for each path (40,000 paths: 12 s)
    first = np.concatenate([[0], np.cumsum(np.bincount(ids))[:-1]])  # [N]
    rows = np.argsort(ids, kind="stable")[first[:, None] + data.source_steps]  # [N, T]
    return replace(data, step_times=times[rows])


def time_split(num_steps: int, valid_fraction: float, test_fraction: float) -> tuple[int, int]:
    """(train_end, valid_end): periods [0, train_end), [train_end, valid_end), [valid_end, num_steps).

    Each size is its fraction of num_steps, rounded to nearest (halves up); the train period gets the rest.
    valid_fraction == 0 gives an empty validation period (train_end == valid_end); any positive fraction must
    give at least 1 step, test at least 1 step and train at least 2, else ValueError.
    """
    validate.integer("num_steps", num_steps, lo=1)
    validate.real("valid_fraction", valid_fraction, lo=0, hi=1, hi_open=True)
    validate.real("test_fraction", test_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
    num_valid, num_test = int(num_steps * valid_fraction + 0.5), int(num_steps * test_fraction + 0.5)
    for arg, fraction, size in (("valid_fraction", valid_fraction, num_valid),
                                ("test_fraction", test_fraction, num_test)):
        if fraction > 0 and size < 1:
            raise ValueError(f"{arg}: {fraction} of {num_steps} steps is {size} steps; the period needs at least 1")
    num_train = num_steps - num_valid - num_test
    if num_train < 2:
        raise ValueError(f"valid_fraction, test_fraction: {valid_fraction} and {test_fraction} of {num_steps} steps "
                         f"({num_valid} + {num_test}) leave {num_train} training steps; training needs at least 2")
    return num_train, num_train + num_valid


def check_split(data: MarketData, train_end: int, valid_end: int) -> None:
    """ValueError if, by the dates (`MarketData.step_times`), a path's period runs past the start of the next period
    of another path: `time_split` cuts every path at the same step, so paths of other dates (one a year behind)
    would train on days that another path holds for its test. Nothing to check without dates."""
    times = data.step_times
    if times is None:
        return
    periods = [(name, a, b) for name, a, b in (("training", 0, train_end), ("validation", train_end, valid_end),
                                               ("test", valid_end, data.num_steps)) if b > a]
    for (earlier, a0, b0), (later, a1, b1) in zip(periods, periods[1:]):
        last, first = times[:, a0:b0].max(axis=1), times[:, a1:b1].min(axis=1)  # [N] each path's
        i, j = int(last.argmax()), int(first.argmin())
        if last[i] > first[j]:  # equal: a date column beside a time of day, cut within a day
            raise ValueError(f"path_col: the {earlier} period of path {data.path_labels[i]!r} runs to "
                             f"{_when(last[i])}, after the {later} period of path {data.path_labels[j]!r} begins "
                             f"({_when(first[j])}): the periods cut every path at the same step, so the paths must "
                             f"cover the same dates row for row")


def _when(stamp: np.datetime64) -> str:
    return str(stamp.astype("datetime64[s]")).removesuffix("T00:00:00")


@dataclass(frozen=True)
class Standardiser:
    """Per-feature (x - mean) / std, with statistics fitted on the training period only."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    names: tuple[str, ...]

    def __post_init__(self):
        mean, std, names = tuple(map(float, self.mean)), tuple(map(float, self.std)), tuple(map(str, self.names))
        if not len(mean) == len(std) == len(names):
            raise ValueError(f"standardiser: mean, std, names have lengths {len(mean)}, {len(std)}, {len(names)}")
        if not (np.isfinite(mean).all() and np.isfinite(std).all() and min(std, default=1) > 0):
            raise ValueError(f"standardiser: expected finite means and positive finite stds, got {mean}, {std}")
        for name, value in (("mean", mean), ("std", std), ("names", names)):
            object.__setattr__(self, name, value)

    @classmethod
    def fit(cls, features: np.ndarray, names: Sequence[str]) -> Standardiser:
        """Mean and (population) std of each feature of `features` [N, T, F], over N and T."""
        x = np.asarray(features, np.float64)
        names = tuple(names)
        if x.ndim != 3 or x.shape[2] != len(names) or x.shape[0] * x.shape[1] == 0:
            raise ValueError(f"features: expected a non-empty [N, T, {len(names)}] array, got shape {x.shape}")
        mean, std = x.mean(axis=(0, 1)), x.std(axis=(0, 1))
        # max == min as well: a constant's std is round-off (~1e-17), not 0, so `std == 0` alone misses it
        bad = ~np.isfinite(std) | (std == 0) | (x.max(axis=(0, 1)) == x.min(axis=(0, 1)))
        if bad.any():
            i = int(np.argmax(bad))
            # Named after the option that selects features, which is where the fix goes.
            raise ValueError(f"feature_cols: {names[i]!r} is constant or not finite over the training period (std "
                             f"{std[i]:g}); it cannot be standardised, so leave it out of feature_cols")
        return cls(tuple(mean), tuple(std), names)

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """features [..., F] -> standardised [..., F] float32. A value that is not finite is refused: fed to the
        Traveller, it would make this step's positions NaN and every later step's too, through the state."""
        x = np.asarray(features, np.float64)
        if x.ndim == 0 or x.shape[-1] != len(self.mean):
            raise ValueError(f"features: expected {len(self.mean)} features {self.names} on the last axis, "
                             f"got shape {x.shape}")
        if not np.isfinite(x).all():
            at = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
            raise ValueError(f"features: expected finite values, got {x[at]} at index {list(at)} (feature "
                             f"{self.names[at[-1]]!r}): fill a missing value first, as --fill does for a file")
        return ((x - np.array(self.mean)) / np.array(self.std)).astype(np.float32)

    def to_json(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std), "names": list(self.names)}

    @classmethod
    def from_json(cls, d: dict) -> Standardiser:
        missing = [k for k in ("mean", "std", "names") if k not in d]
        if missing:
            raise ValueError(f"standardiser: missing keys {missing} in {sorted(d)}")
        return cls(tuple(d["mean"]), tuple(d["std"]), tuple(d["names"]))


def estimate_covariance(returns: np.ndarray) -> np.ndarray:
    """returns [N, T, A] -> [A, A] sample covariance (ddof 1) of all N * T return vectors."""
    r = np.asarray(returns, np.float64)
    if r.ndim != 3 or r.shape[1] < 2:
        raise ValueError(f"returns: expected [N, T, A] with at least 2 steps, got shape {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError(f"returns: {validate.first_bad('returns', r, ~np.isfinite(r), 'entries')} is not finite")
    cov = np.cov(r.reshape(-1, r.shape[2]), rowvar=False).reshape(r.shape[2], r.shape[2])
    _check_positive_definite("return_cols: the sample covariance of the training period's returns", cov)
    return cov


def read_covariance(path, num_assets: int) -> np.ndarray:
    """An [A, A] covariance matrix from a .npy file or a headerless .csv; returned symmetrised, (C + C.T) / 2."""
    validate.integer("num_assets", num_assets, lo=1)
    path = Path(path)
    if path.suffix.lower() not in (".npy", ".csv"):
        raise ValueError(f"{path.name}: unsupported suffix {path.suffix!r}; expected .npy or .csv")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix.lower() == ".npy":
        m = _numeric(path.name, lambda: np.load(path, allow_pickle=False))
    else:
        m = []
        with _utf8(path), open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            for row in filter(None, reader):
                try:
                    m.append([float(cell) for cell in row])
                except ValueError:
                    raise ValueError(f"{path.name}: line {reader.line_num}: expected numbers (a headerless CSV), "
                                     f"got {row}") from None
        if len({len(row) for row in m}) > 1:
            raise ValueError(f"{path.name}: rows of different lengths {[len(row) for row in m]}")
    m = np.asarray(m, np.float64)
    if m.shape != (num_assets, num_assets):
        raise ValueError(f"{path.name}: expected a [{num_assets}, {num_assets}] covariance (num_assets={num_assets}), "
                         f"got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError(f"{path.name}: {validate.first_bad('C', m, ~np.isfinite(m), 'entries')} is not finite")
    asymmetry = np.abs(m - m.T).max()
    if asymmetry > 1e-8 * np.abs(m).max():
        raise ValueError(f"{path.name}: not symmetric (|C - C.T| up to {asymmetry:.3g}, "
                         f"largest |C| {np.abs(m).max():.3g})")
    m = (m + m.T) / 2
    _check_positive_definite(f"{path.name}: the covariance", m)
    return m


# --- helpers -------------------------------------------------------------------------------------------


def _read_npz(path: Path, fill: str, returns: bool = True) -> MarketData:
    unreadable = f"{path.name}: not a readable .npz file (expected a zip of arrays, as numpy.savez writes)"
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile):  # text (numpy then tries pickle), empty, truncated
        raise ValueError(unreadable) from None
    if not isinstance(z, np.lib.npyio.NpzFile):  # a lone .npy renamed
        raise ValueError(unreadable)

    def array(key):
        try:
            return z[key]
        except (ValueError, EOFError, OSError, zipfile.BadZipFile) as e:  # bad CRC, cut short, a bad header
            if isinstance(e, ValueError) and "Object arrays" in str(e):  # refused by allow_pickle=False
                raise ValueError(f"{path.name}: array {key!r} is not numeric (dtype object)") from None
            raise ValueError(f"{unreadable}: array {key!r} is damaged") from None

    with z:
        for key in ("features", "returns") if returns else ("features",):
            if key not in z.files:
                raise ValueError(f"{path.name}: no array {key!r}; it has {z.files}")
        # Read here, not in _numeric's `load`: it would take a damaged array's error for an object array's.
        features, targets = array("features"), array("returns") if returns else None
        x = _numeric(f"{path.name}: array 'features'", lambda: features, flags=True)
        if returns:
            r = _numeric(f"{path.name}: array 'returns'", lambda: targets)
        else:
            r = np.zeros(x.shape[:2] + (0,)) if x.ndim == 3 else np.zeros((0, 0, 0))
        if not returns and (x.ndim != 3 or 0 in x.shape):
            raise ValueError(f"{path.name}: 'features' must be a non-empty [N, T, F] array; got shape {x.shape}")
        if x.ndim != 3 or r.ndim != 3 or x.shape[:2] != r.shape[:2] or 0 in x.shape + r.shape[: 3 if returns else 2]:
            raise ValueError(f"{path.name}: 'features' and 'returns' must be non-empty [N, T, F] and [N, T, A] with "
                             f"the same N and T; got features {x.shape}, returns {r.shape}")
        names = []
        for key, size, prefix in (("feature_names", x.shape[2], "feature"), ("asset_names", r.shape[2], "asset")):
            given = ([str(s) for s in array(key).reshape(-1)] if key in z.files
                     else [f"{prefix}_{i}" for i in range(size)])
            if len(given) != size:
                raise ValueError(f"{path.name}: {key!r} has {len(given)} names for {size} columns "
                                 f"(features {x.shape}, returns {r.shape})")
            names.append(given)
    n, t, num_features = x.shape
    cells = [f"features {s!r}" for s in names[0]] + [f"returns {s!r}" for s in names[1]]
    return _assemble(path.name, np.concatenate([x, r], axis=2).reshape(n * t, -1), np.repeat(np.arange(n), t),
                     list(range(n)), lambda i: f"path {i // t}, step {i % t}", cells, names[0] + names[1],
                     num_features, fill)


@contextlib.contextmanager
def _utf8(path: Path) -> Iterator[None]:
    """Reading `path` as UTF-8 text: a file in another encoding (a spreadsheet's Windows-1252 export) is named."""
    try:
        yield
    except UnicodeDecodeError as err:
        raise ValueError(f"{path.name}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
                         "save it as UTF-8 (a spreadsheet's 'CSV UTF-8')") from None


def _read_csv(path: Path):
    """(columns, get(name) -> [R] cells, where(row) -> "row r (line l)") of a CSV file."""
    with _utf8(path), open(path, newline="", encoding="utf-8-sig") as f:  # -sig: Excel writes a byte-order mark
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        other = [sep for sep in ";\t|" if len(header) == 1 and sep in header[0]]
        if other:  # a spreadsheet's export in a locale whose decimal mark is the comma
            raise ValueError(f"{path.name}: expected comma-separated columns, got one column {header[0]!r} "
                             f"(separated by {other[0]!r}?): save the file with commas")
        rows, lines = [], []
        for row in filter(None, reader):  # skips blank lines
            if len(row) != len(header):
                raise ValueError(f"{path.name}: line {reader.line_num} has {len(row)} fields, the header {len(header)}")
            rows.append(row)
            lines.append(reader.line_num)
    if not rows:
        raise ValueError(f"{path.name}: no data rows (expected a header row, then one row per time step)")
    columns = dict(zip(header, zip(*rows)))
    return header, columns.__getitem__, lambda i: f"row {i + 1} (line {lines[i]})"


def _read_parquet(path: Path):
    """(columns, get(name) -> [R] float64 or cells, where(row) -> "row r") of a parquet file."""
    pq = require("pyarrow.parquet", "reading .parquet files")
    import pyarrow as pa  # importable: pyarrow.parquet was

    table = pq.read_table(path)
    if table.num_rows == 0:
        raise ValueError(f"{path.name}: no data rows")

    def get(name):
        col = table.column(name)
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_decimal(col.type):
            # nulls -> NaN; unsafe: an int64 beyond 2**53 (a Unix time in nanoseconds) rounds, as NumPy's would
            return col.cast(pa.float64(), safe=False).to_numpy()
        return col.to_pylist()  # text to parse, or the path ids

    return table.column_names, get, lambda i: f"row {i + 1}"


# A column of these names (any case) is checked for order; "": the unnamed column pandas writes for an index without
# a name (a DatetimeIndex, df.to_csv()), the dates of a table built in pandas.
DATE_COLUMNS = ("date", "datetime", "time", "timestamp", "")
# The same unnamed index as df.to_parquet() writes it (pyarrow names each level so)
PANDAS_PARQUET_INDEX = re.compile(r"__index_level_\d+__")


def _stamp_column(column: str) -> bool:
    """Whether `column` is one `_check_time_order` reads as dates, when it holds them: by name, or pandas' index."""
    return column.lower() in DATE_COLUMNS or _unnamed_index(column)


def _unnamed_index(column: str) -> bool:
    """Whether `column` is pandas' unnamed index, as a CSV ("") or a parquet file holds it."""
    return column == "" or PANDAS_PARQUET_INDEX.fullmatch(column) is not None


RATE_ROWS = 20  # fewest rows per path to tell bars a year from the dates (MarketData.bars_per_year): a few say little
# Fewest days spanned to tell bars a year from bars that pause (an exchange's, closed nights and weekends): a shorter
# span may hold no weekend, and a week of hourly bars, Monday to Friday, reads as 1.7 times their rate a year.
RATE_SPAN_DAYS = 7
# Dates as spreadsheets, brokers and data sites write them (many of those exports newest first), read where ISO does
# not: month or day first, with or without a time of day. 01/02/2024 reads both ways; a day above 12 rules one out.
OTHER_DATE_FORMATS = tuple(day + time for day in ("%m/%d/%Y", "%d/%m/%Y", "%m/%d/%y", "%d/%m/%y", "%Y/%m/%d",
                                                  "%d.%m.%Y", "%Y.%m.%d", "%d-%b-%Y", "%d %b %Y", "%b %d, %Y")
                           for time in ("", " %H:%M", " %H:%M:%S"))
# How to write a naive local clock's repeated hour (daylight saving time ends): the file gives no zone to order it by.
CLOCK_BACK = ("if a local clock went back (daylight saving time ended), write each stamp with its UTC offset "
              "(2024-10-27T02:30+01:00) or in UTC, or the date and the time of day as two columns (date, time)")


def _check_time_order(file: str, columns: list[str], get: Callable, ids: np.ndarray, where: Callable[[int], str],
                      exclude: list) -> list[datetime] | None:
    """Rows must be in time order: a file written newest first (as many exports are) would train on time run
    backwards, each return paid to the position chosen after it, without a word. Checked on a date column that is
    neither a feature nor a return, when its non-blank cells are all dates or times (`_readings`): within a path each
    stamp must be later than the one before (an equal one is the same bar twice, trained on twice), a blank cell is
    an error (one gap must not switch the check off), and the stamps must all have a time zone or none (the two
    cannot be ordered). A column that reads as dates two ways (01/02/2024) passes if either reading is in order; a
    column of other cells is taken as it comes. Where the file has more than one such column (a broker's date and
    time of day), a stamp may repeat in one of them: only going back is an error (pandas' unnamed index
    counts as one only if it holds dates). A naive local clock that goes back
    at most an hour (the hour repeated when daylight saving time ends) is refused too, as no zone says where it
    belongs: the message says how to write it (`CLOCK_BACK`). Returns the (non-blank) stamps of the first checked
    column that only one reading has in time order; None if there is none."""
    cells = {c: _cells(get(c)) for c in columns if _stamp_column(c) and c not in exclude}
    readings = {name: _readings(column) for name, column in cells.items()}
    # pandas' unnamed index is a date column only when it holds dates: df.to_csv()'s RangeIndex (0, 1, ...) is no
    # time of day beside a date column, whose repeats must still be refused
    stamped = [name for name in cells if not _unnamed_index(name) or readings[name]]
    found = None
    for name in stamped:
        errors = [_order_error(file, name, cells[name], stamps, ids, where, len(stamped) == 1)
                  for stamps in readings[name]]
        if errors and all(errors):
            raise ValueError(errors[0])
        if found is None and errors.count(None) == 1:  # two readings in order (01/02, 01/03): which one is unknown
            found = [stamp for stamp in readings[name][errors.index(None)] if stamp is not None] or None
    return found


def _cells(cells) -> list:
    """A date column's cells as `get` gives them, a parquet numeric column's floats as integers where whole
    (20240102.0 is the date 20240102)."""
    return [int(c) if c.is_integer() else c for c in cells.tolist()] if isinstance(cells, np.ndarray) else cells


def _order_error(file: str, name: str, cells: list, stamps: list, ids: np.ndarray, where: Callable[[int], str],
                 alone: bool) -> str | None:
    """What is wrong with the time order of one reading of a date column (`_check_time_order`), None if nothing;
    `alone`: the file's only date column, in which a stamp may not repeat."""
    if all(stamp is None for stamp in stamps):
        return None  # an empty column: nothing to check
    if None in stamps:
        i = stamps.index(None)
        return (f"{file}: column {name!r}, {where(i)}: date missing (the column's other cells are dates, checked for "
                f"time order); fill it in or remove the row")
    zoned = [stamp.utcoffset() is not None for stamp in stamps]
    if len(set(zoned)) > 1:
        i = zoned.index(not zoned[0])
        return (f"{file}: column {name!r}, {where(i)}: {cells[i]} has {'a' if zoned[i] else 'no'} time zone, the rows "
                f"before it {'none' if zoned[i] else 'one'}; write every stamp with a zone, or none")
    last: dict = {}
    first: dict = {}
    one_path = len(set(ids.tolist())) == 1
    for i, (path, stamp) in enumerate(zip(ids.tolist(), stamps)):
        j = last.get(path)
        first.setdefault(path, i)
        if j is not None and stamp == stamps[j] and alone:
            clock = f", or {CLOCK_BACK}" if not zoned[i] and ":" in str(cells[i]) else ""  # a time of day
            return (f"{file}: column {name!r}, {where(i)}: {cells[i]} repeats {where(j)} in the same path: a repeated "
                    f"bar (the same period twice); remove one, or give path_col if the rows are of several "
                    f"assets{clock}")
        if j is not None and stamp < stamps[j]:
            # within an hour, on a clock without a zone: maybe the autumn night's repeated hour
            clock = f"; or, {CLOCK_BACK}" if not zoned[i] and stamps[j] - stamp <= timedelta(hours=1) else ""
            if one_path and j > first[path] and stamp <= stamps[first[path]]:  # back past the start: the next asset
                clock += "; or, if the rows are of several assets one after another, give path_col"
            return (f"{file}: rows must be in time order (oldest first), but column {name!r} goes back from "
                    f"{cells[j]} to {cells[i]} at {where(i)}; a file written newest first must be reversed{clock}")
        last[path] = i
    return None


# Unix time, as exchanges' and crypto data's exports stamp their bars: numbers from EPOCH_MIN on, whose size gives the
# unit (seconds up to 1e11, i.e. until the year 5138; then milliseconds, microseconds, nanoseconds). Below, a number
# is no Unix time: 20240102 is an ISO date, 930 a time of day.
EPOCH_MIN = 1e9  # 2001-09-09 in seconds
EPOCH_UNITS = ((1e11, 1.0), (1e14, 1e3), (1e17, 1e6), (float("inf"), 1e9))  # (below, units per second)


def _numbers(cells: list) -> list | None:
    """A date column's cells as finite floats (None where blank), or None if another cell is no such number."""
    numbers = []
    for cell in cells:
        text = "" if cell is None else str(cell).strip()
        if text.lower() in _MISSING:
            numbers.append(None)
            continue
        try:
            numbers.append(float(text))
        except ValueError:
            return None
        if not np.isfinite(numbers[-1]):
            return None
    return numbers


def _epoch_reading(cells: list) -> list | None:
    """A date column's cells as Unix times (UTC datetimes; None where blank), if every other cell is a number of the
    same unit from `EPOCH_MIN` on (`EPOCH_UNITS`); else None."""
    numbers = _numbers(cells)
    given = [x for x in numbers or [] if x is not None]
    if not given or not all(x >= EPOCH_MIN for x in given):
        return None
    units = {next(per_second for below, per_second in EPOCH_UNITS if x < below) for x in given}
    if len(units) > 1:
        return None
    per_second = units.pop()
    return [None if x is None else datetime.fromtimestamp(x / per_second, timezone.utc) for x in numbers]


# An export's date and time of day as one number (20240102153000, 202401021530): as large as a Unix time in
# milliseconds, which it is not
COMPACT_DATE_FORMATS = {14: "%Y%m%d%H%M%S", 12: "%Y%m%d%H%M"}  # (digits, format)


def _compact_reading(cells: list) -> list | None:
    """A date column's cells as datetimes (None where blank), if every other cell is a whole number whose digits are
    a date and time of day, all of one `COMPACT_DATE_FORMATS` (text, or a float as parquet's integers read); else
    None."""
    numbers = _numbers(cells)
    if numbers is None or not all(x is None or (x == int(x) and x > 0) for x in numbers):
        return None
    digits = [None if x is None else str(int(x)) for x in numbers]
    lengths = {len(d) for d in digits if d is not None}
    if len(lengths) != 1 or (form := COMPACT_DATE_FORMATS.get(lengths.pop())) is None:
        return None
    try:
        return [None if d is None else datetime.strptime(d, form) for d in digits]
    except ValueError:
        return None


def _readings(cells: list) -> list[list]:
    """Each way to read a date column's cells as datetimes (None where blank) that reads every cell: ISO dates or
    times (or parquet dates) alone if they do, else Unix times (`_epoch_reading`), else each of
    `OTHER_DATE_FORMATS` that does; [] if none does."""
    try:
        return [[_stamp(cell) for cell in cells]]
    except ValueError:
        pass
    compact = _compact_reading(cells)  # before Unix time: 20240102153000 is no millisecond of the year 2611
    if compact is not None:
        return [compact]
    epoch = _epoch_reading(cells)
    if epoch is not None:
        return [epoch]
    texts = [None if cell is None or str(cell).strip().lower() in _MISSING else str(cell).strip() for cell in cells]
    readings = []
    for form in OTHER_DATE_FORMATS:
        with contextlib.suppress(ValueError):  # most forms fail at the first cell
            readings.append([None if text is None else datetime.strptime(text, form) for text in texts])
    return readings


def _stamp(cell):
    """A date column's cell -> datetime, None if blank; ValueError if it is not an ISO date or time."""
    if cell is None or str(cell).strip().lower() in _MISSING:
        return None
    if isinstance(cell, datetime):
        return cell
    if isinstance(cell, date):  # a parquet date: its midnight, so that it compares with times
        return datetime(cell.year, cell.month, cell.day)
    return datetime.fromisoformat(str(cell).strip())


def _to_float(file: str, name: str, cells, where: Callable[[int], str], flag: bool = False) -> np.ndarray:
    """[R] cells -> [R] float64, NaN where missing; a cell that is not a number is an error naming its row.

    `flag`: a feature, whose booleans (a parquet bool column) read as 0.0 / 1.0; a return must be a number."""
    if isinstance(cells, np.ndarray):
        return cells
    out = np.empty(len(cells))
    for i, cell in enumerate(cells):
        if flag and isinstance(cell, bool):
            out[i] = float(cell)
            continue
        text = "" if cell is None else str(cell).strip()
        try:
            out[i] = np.nan if text.lower() in _MISSING else float(text)
        except ValueError:
            raise ValueError(f"{file}: column {name!r}, {where(i)}: expected a number, got {cell!r}") from None
    return out


def _numeric(what: str, load: Callable[[], np.ndarray], flags: bool = False) -> np.ndarray:
    """The array `load()` returns, as float64, if it holds real numbers (ints or floats; bools, as 0 / 1, only
    with `flags`: a feature may be a flag, a return or a covariance may not)."""
    try:
        a = np.asarray(load())
    except ValueError:  # an object array, which allow_pickle=False refuses to load
        raise ValueError(f"{what} is not numeric (dtype object)") from None
    if flags and a.dtype == np.bool_:
        return a.astype(np.float64)
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"{what} is not numeric (dtype {a.dtype})")
    return a.astype(np.float64)


def _assemble(file: str, matrix: np.ndarray, ids: np.ndarray, labels: list, where: Callable[[int], str],
              cells: list[str], names: list[str], num_features: int, fill: str) -> MarketData:
    """matrix [R, C] (feature then return columns, NaN = missing), ids [R] its rows' paths 0..N-1 -> MarketData."""
    inf = np.isinf(matrix)
    if inf.any():
        i, c = np.argwhere(inf)[0]  # row-major: the first in file order
        raise ValueError(f"{file}: {cells[c]}, {where(i)}: {matrix[i, c]} is not finite "
                         f"(a data error, not a missing value)")
    missing = np.isnan(matrix)
    if fill == "error" and missing.any():
        i, c = np.argwhere(missing)[0]
        raise ValueError(f"{file}: {cells[c]}, {where(i)}: missing value ({missing.sum()} missing in total) "
                         f"(or choose a --fill policy: ffill, zero, drop)")
    if fill in ("ffill", "zero") and missing[:, num_features:].any():
        i, c = np.argwhere(missing[:, num_features:])[0]
        c += num_features
        raise ValueError(f"{file}: {cells[c]}, {where(i)}: missing return; fill={fill!r} fills features only, returns "
                         f"are never made up (a made-up return is scored as earned): use fill='drop', which drops the "
                         f"row, or remove the row")
    if fill == "zero":  # features only: the returns have no gap, and nothing is inf (both refused above)
        matrix = np.nan_to_num(matrix, nan=0.0)
    order = np.argsort(ids, kind="stable")  # rows grouped by path, file order kept within each
    blocks, steps = [], []
    for rows in np.split(order, np.cumsum(np.bincount(ids))[:-1]):
        block, step = matrix[rows], np.arange(len(rows))
        if fill == "ffill":
            last = np.where(np.isnan(block), 0, np.arange(len(block))[:, None])
            block = block[np.maximum.accumulate(last, axis=0), np.arange(block.shape[1])]
            if np.isnan(block).any():
                t, c = np.argwhere(np.isnan(block))[0]
                raise ValueError(f"{file}: {cells[c]}, {where(rows[t])}: missing value with no earlier value in its "
                                 f"path to carry forward (fill='ffill')")
        elif fill == "drop":
            keep = ~np.isnan(block).any(axis=1)
            block, step = block[keep], step[keep]
        blocks.append(block)
        steps.append(step)
    lengths = [len(b) for b in blocks]
    after = " after fill='drop'" if fill == "drop" else ""
    if len(set(lengths)) > 1:
        shown = ", ".join(f"{label!r}: {n}" for label, n in list(zip(labels, lengths))[:10])
        raise ValueError(f"{file}: all paths must have the same number of rows{after}; got {shown}"
                         f"{' ...' if len(labels) > 10 else ''} ({len(labels)} paths)")
    if lengths[0] == 0:
        raise ValueError(f"{file}: no rows left{after}")
    data = np.stack(blocks)
    _warn_if_prices(file, data[..., num_features:], cells[num_features:])
    _warn_if_look_ahead(file, data[..., :num_features], data[..., num_features:], names)
    return MarketData(data[..., :num_features], data[..., num_features:], tuple(names[:num_features]),
                      tuple(names[num_features:]), None if labels == [WHOLE_FILE] else tuple(labels), np.stack(steps))


# A price moves each period by a few percent of its level at most (a crypto coin's median daily move is ~3%); a
# positive return series moves by about its own size (it is as likely to halve as to double), but for a cash asset's,
# which moves as slowly as a price: it is a few basis points a period, far below any price the step rule reads.
PRICE_STEP = 0.1  # median |x[t+1] - x[t]| / median x below it: a price, whatever its scale above PRICE_LEVEL
PRICE_LEVEL = 0.1  # median x at least: a cash asset's return (< 0.01 a period even monthly) is never read as a price
# median |r| above it in a two-signed column: percent. A decimal daily return's is ~0.01; a volatile asset's monthly
# one (an altcoin at 35% a month) ~0.24; percent daily returns of equities ~0.7, of a currency ~0.35.
PERCENT_TYPICAL = 0.3
PERCENT_SIGNS = 0.1  # fewest of the values on each side of 0 for a column to read as returns (its signs mixed)


def _warn_if_prices(file: str, returns: np.ndarray, cells: list[str]) -> None:
    """Warn about each return column [N, T] that looks like prices or like percent returns.

    Prices: every value > 0 (a real return series has down periods) and either a mean > 0.5 (a return series
    averages far below +50% a period: this is a gross return 1 + r too) or a median level of at least
    `PRICE_LEVEL` that moves each step (within a path, the median |x[t+1] - x[t]|) by less than `PRICE_STEP` of
    it: a price at any scale above that (a penny stock). Percent: non-zero values of both signs (each side at least
    `PERCENT_SIGNS` of them) whose median |r| is above `PERCENT_TYPICAL`. Not caught: prices below `PRICE_LEVEL`
    (a currency quoted per yen, read as a cash asset's return), percent returns of a calm asset (a bond's or a
    currency's daily 0.2%), and prices of a one-step file."""
    for a, what in enumerate(cells):
        column = returns[..., a]
        if not column.size:
            continue
        if (column > 0).all():
            steps = np.abs(np.diff(column, axis=-1))
            level = np.median(column)
            step = np.median(steps) / level if steps.size else np.inf
            if column.mean() > 0.5 or (level >= PRICE_LEVEL and step < PRICE_STEP):
                why = (f"mean {column.mean():.4g}" if column.mean() > 0.5
                       else f"median step {step:.2%} of the median value {level:.4g}")
                warnings.warn(f"{file}: {what} looks like prices, not returns (every value > 0, {why}): the return "
                              f"columns must be per-period returns as fractions", UserWarning,
                              stacklevel=validate.user_stacklevel())
            continue
        moved = column[column != 0]  # an illiquid asset's (or a weekend's) zero returns say nothing of the unit
        if moved.size and min((moved < 0).mean(), (moved > 0).mean()) >= PERCENT_SIGNS and \
                (typical := np.median(np.abs(moved))) > PERCENT_TYPICAL:
            warnings.warn(f"{file}: {what} looks like percent returns, not fractions (median non-zero |value| "
                          f"{typical:.4g}; decimal returns' is about 0.01 a day, below {PERCENT_TYPICAL:g} even a "
                          "volatile asset's monthly): divide a percent column by 100", UserWarning,
                          stacklevel=validate.user_stacklevel())


# |correlation| of a feature with the same row's return at or above it: the feature is that return, not a forecast of
# it. A daily signal that forecasts the next return with a correlation of even 0.1 is rare; 0.95 is the return itself
# written twice (the 1-day return up to t beside an unshifted return column: 0.999), or a feature built from the next
# bar. A 5-day momentum beside an unshifted 1-day return (~0.45) is not caught.
LOOK_AHEAD_CORRELATION = 0.95
LOOK_AHEAD_ROWS = 20  # fewest rows for the check: a correlation of a handful says nothing (a toy file's is often 1)


def _warn_if_look_ahead(file: str, features: np.ndarray, returns: np.ndarray, names: list[str]) -> None:
    """Warn about each (feature, return column) pair whose correlation over all N T rows of features [N, T, F] and
    returns [N, T, A] reaches `LOOK_AHEAD_CORRELATION` in size (`names`: the F features', then the A returns'): the
    return column is most likely the return UP TO each row, unshifted, which a position chosen at that row would be
    paid although its features already show it (module docstring). Not for a return column that its own previous
    row foretells as closely (lag-1 autocorrelation at least as high): a cash asset's, paid the rate known when the
    position is chosen, which a feature (that rate) may track without looking ahead."""
    if returns.shape[-1] == 0 or features.shape[0] * features.shape[1] < LOOK_AHEAD_ROWS:  # features alone, or few
        return
    num_assets = returns.shape[-1]
    correlation = _correlation(features.reshape(-1, features.shape[-1]), returns.reshape(-1, num_assets))  # [F, A]
    if returns.shape[1] > 1:
        earlier, later = returns[:, :-1].reshape(-1, num_assets), returns[:, 1:].reshape(-1, num_assets)  # [N(T-1), A]
        correlation[:, np.abs(_correlation(earlier, later, pairs=True)) >= LOOK_AHEAD_CORRELATION] = 0
    for f, a in np.argwhere(np.abs(correlation) >= LOOK_AHEAD_CORRELATION):
        warnings.warn(f"{file}: the feature {names[f]!r} has correlation {correlation[f, a]:.3f} with the return "
                      f"{names[features.shape[-1] + a]!r} of the same row: a return column holds the return EARNED BY "
                      f"the position chosen at its row (the next period's); if it is the return up to the row "
                      f"(close[t] / close[t-1] - 1), shift it up one row, or every score looks ahead", UserWarning,
                      stacklevel=validate.user_stacklevel())


def _correlation(x: np.ndarray, r: np.ndarray, pairs: bool = False) -> np.ndarray:
    """[F, A] Pearson correlation of each column of x [R, F] with each of r [R, A]; with `pairs` (F = A), [A] that of
    each column of x with the same column of r alone. 0 where a column is constant."""
    x, r = x - x.mean(axis=0), r - r.mean(axis=0)
    nx, nr = np.linalg.norm(x, axis=0), np.linalg.norm(r, axis=0)
    product, scale = ((x * r).sum(axis=0), nx * nr) if pairs else (x.T @ r, np.outer(nx, nr))
    return np.divide(product, scale, out=np.zeros(scale.shape), where=scale > 0)


def _select(arg: str, patterns, columns: list[str], path_col: str | None, file: str) -> list[str]:
    """The columns (but `path_col`) matching any of `patterns`, exact names or fnmatch patterns, in file order. A
    pattern skips the date columns and pandas' unnamed index (`_stamp_column`): '*' would otherwise feed the model
    the row number or refuse a date as no number; an exact name still selects one."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    if not patterns:
        raise ValueError(f"{arg}: empty; expected at least one column name or pattern")
    chosen = set()
    for p in patterns:
        if p == path_col:
            raise ValueError(f"{arg}: {p!r} is the path_col; the path id is neither a feature nor a return")
        hits = [p] if p in columns else [c for c in columns if fnmatchcase(c, p) and c != path_col]
        skipped = [c for c in hits if p not in columns and _stamp_column(c)]
        hits = [c for c in hits if c not in skipped]
        if not hits:
            why = f" but the date or index column {_listing(skipped)}, which a pattern skips" if skipped else ""
            raise ValueError(f"{arg}: {p!r} matches no column of {file}{why}; its columns are {_listing(columns)}")
        chosen.update(hits)
    return [c for c in columns if c in chosen]


def _check_positive_definite(what: str, cov: np.ndarray) -> None:
    eig = np.linalg.eigvalsh(cov)
    if not eig[0] > 1e-12 * max(eig[-1], 0):  # relative: round-off leaves a singular matrix's eigenvalue ~1e-17
        raise ValueError(f"{what} of {len(cov)} assets is not positive definite (smallest eigenvalue {eig[0]:.3g}, "
                         f"largest {eig[-1]:.3g})")


def _listing(columns: Sequence[str], most: int = 20) -> str:
    shown = ", ".join(map(repr, columns[:most]))
    return shown + (f", ... ({len(columns)} in all)" if len(columns) > most else "")
