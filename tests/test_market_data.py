"""Reading, checking, splitting and standardising a user's own market data (jax_scan_rnn.data.market_data)."""
import csv
import datetime
import json
import re
import warnings

import numpy as np
import pytest

from jax_scan_rnn.data import market_data
from jax_scan_rnn.data.market_data import (FILLS, MarketData, Standardiser, estimate_covariance, read,
                                           read_covariance, time_split)

N, T = 2, 6
RNG = np.random.default_rng(0)
FEATURES = RNG.normal(size=(N, T, 2)).round(4)  # [mom, vol]
RETURNS = (0.01 * RNG.normal(size=(N, T, 2))).round(6)  # [ret_a, ret_b]: daily decimal returns, as a file holds
HEADER = ["date", "mom", "ret_a", "vol", "id", "ret_b"]  # interleaved: selection follows file order


def table_rows():
    """Rows of HEADER, the two paths interleaved in time order (path 'x' first)."""
    rows = []
    for t in range(T):
        for n, ident in enumerate(["x", "y"]):
            rows.append([f"2024-01-{t + 1:02d}", FEATURES[n, t, 0], RETURNS[n, t, 0], FEATURES[n, t, 1], ident,
                         RETURNS[n, t, 1]])
    return rows


def write_csv(path, rows, header=HEADER):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_parquet(path, rows, header=HEADER):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({h: [row[i] for row in rows] for i, h in enumerate(header)}), path)
    return path


def read_table(path, **kw):
    return read(path, **{"feature_cols": ["mom", "vol"], "return_cols": ["ret_*"], "path_col": "id", **kw})


def check(data):
    np.testing.assert_array_equal(data.features, FEATURES)
    np.testing.assert_array_equal(data.returns, RETURNS)
    assert data.feature_names == ("mom", "vol") and data.asset_names == ("ret_a", "ret_b")
    assert (data.num_paths, data.num_steps, data.num_features, data.num_assets) == (N, T, 2, 2)
    assert data.features.dtype == data.returns.dtype == np.float64


def test_formats_read_the_same_numbers(tmp_path):
    np.savez(tmp_path / "m.npz", features=FEATURES, returns=RETURNS, feature_names=["mom", "vol"],
             asset_names=["ret_a", "ret_b"])
    check(read(tmp_path / "m.npz"))
    check(read_table(write_csv(tmp_path / "m.csv", table_rows())))
    check(read_table(write_parquet(tmp_path / "m.parquet", table_rows())))


def test_features_alone_for_new_bars(tmp_path):
    """returns=False: the features of bars whose next return is not known yet (what `run` trades on)."""
    rows = [row[:2] + row[3:5] for row in table_rows()]  # no return columns at all
    data = read(write_csv(tmp_path / "new.csv", rows, ["date", "mom", "vol", "id"]), feature_cols=["mom", "vol"],
                path_col="id", returns=False)
    np.testing.assert_array_equal(data.features, FEATURES)
    assert data.returns.shape == (N, T, 0) and data.asset_names == ()
    np.savez(tmp_path / "new.npz", features=FEATURES)
    np.testing.assert_array_equal(read(tmp_path / "new.npz", returns=False).features, FEATURES)
    with pytest.raises(ValueError, match=r"^return_cols: expected None when reading features alone"):
        read(tmp_path / "new.csv", feature_cols=["mom"], return_cols=["ret_*"], returns=False)
    np.savez(tmp_path / "flat.npz", features=FEATURES[0])  # no 'returns' asked for: none named in the error
    with pytest.raises(ValueError, match=rf"^flat.npz: 'features' must be a non-empty \[N, T, F\] array; got shape "
                                         rf"\({T}, 2\)$"):
        read(tmp_path / "flat.npz", returns=False)


def test_npz_default_names_and_int_arrays(tmp_path):
    np.savez(tmp_path / "m.npz", features=np.ones((1, 3, 2), np.int32), returns=np.zeros((1, 3, 1)))
    data = read(tmp_path / "m.npz")
    assert data.feature_names == ("feature_0", "feature_1") and data.asset_names == ("asset_0",)
    assert data.features.dtype == np.float64


def test_patterns_follow_file_order_without_path_col(tmp_path):
    rows = [r for r in table_rows() if r[4] == "x"]
    data = read(write_csv(tmp_path / "m.csv", rows), feature_cols=["vol", "m*"], return_cols=["ret_b", "ret_*"])
    assert data.feature_names == ("mom", "vol") and data.asset_names == ("ret_a", "ret_b")  # file order, no repeats
    np.testing.assert_array_equal(data.features, FEATURES[:1])
    # no path_col: the whole file is one path, rows in file order
    whole = read(tmp_path / "m.csv", feature_cols="mom", return_cols="ret_a")
    assert whole.features.shape == (1, T, 1)


def test_a_pattern_never_selects_the_path_column(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("pid,f1,pret\n" + "".join(f"{p},{t * 0.1},{t * 0.01}\n" for p in (1, 2) for t in range(4)))
    data = read(path, feature_cols=["f*"], return_cols=["p*"], path_col="pid")  # 'p*' matches pid too
    assert data.asset_names == ("pret",) and data.returns.shape == (2, 4, 1)


def test_path_col_groups_in_order_of_first_appearance(tmp_path):
    rows = table_rows()
    rows = [r[:4] + [{"x": "b", "y": "a"}[r[4]]] + r[5:] for r in rows]  # 'b' (path x) still appears first
    check(read_table(write_csv(tmp_path / "m.csv", rows)))


def test_paths_of_different_lengths(tmp_path):
    path = write_csv(tmp_path / "m.csv", table_rows()[:-1])  # path 'y' loses its last row
    with pytest.raises(ValueError, match=r"m\.csv: all paths must have the same number of rows; got 'x': 6, 'y': 5"):
        read_table(path)


def test_blank_lines_and_line_numbers(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("mom,ret\n1,2\n\n3,abc\n")
    with pytest.raises(ValueError, match=r"m\.csv: column 'ret', row 2 \(line 4\): expected a number, got 'abc'"):
        read(path, feature_cols=["mom"], return_cols=["ret"])


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_non_numeric_cell(tmp_path, suffix):
    rows = table_rows()
    rows[10][2] = "abc"  # data row 11, line 12
    write = write_csv if suffix == ".csv" else write_parquet  # parquet: every column text, to be parsed
    path = write(tmp_path / f"prices{suffix}", [list(map(str, r)) for r in rows])
    where = r"row 11 \(line 12\)" if suffix == ".csv" else "row 11"
    with pytest.raises(ValueError, match=rf"prices\{suffix}: column 'ret_a', {where}: expected a number, got 'abc'"):
        read_table(path)


def test_infinite_value_is_an_error_under_every_fill(tmp_path):
    rows = table_rows()
    rows[3][1] = "-inf"
    path = write_csv(tmp_path / "m.csv", rows)
    for fill in FILLS:
        with pytest.raises(ValueError, match=r"m\.csv: column 'mom', row 4 \(line 5\): -inf is not finite"):
            read_table(path, fill=fill)
    features = FEATURES.copy()
    features[1, 2, 0] = np.inf
    np.savez(tmp_path / "m.npz", features=features, returns=RETURNS)
    with pytest.raises(ValueError, match=r"m\.npz: features 'feature_0', path 1, step 2: inf is not finite"):
        read(tmp_path / "m.npz", fill="zero")


def with_gaps(rows, column=2):
    """Path 'x' (even rows) misses `column` (ret_a; 1: mom) at steps 2 and 3 ("" and "NA"), path 'y' misses vol at
    step 4 ("nan")."""
    rows = [list(r) for r in rows]
    rows[4][column], rows[6][column], rows[9][3] = "", "NA", "nan"
    return rows


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".npz"])
def test_fill_policies(tmp_path, suffix):
    """ffill and zero fill features; a missing return they refuse (a made-up return would be scored as earned),
    drop drops its row."""
    def write(name, column):  # column 2: path x misses ret_a at steps 2, 3; column 1: mom
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".csv":
            write_csv(path, with_gaps(table_rows(), column))
        elif suffix == ".parquet":  # real nulls in numeric columns
            write_parquet(path, [[None if c in ("", "NA", "nan") else c for c in r]
                                 for r in with_gaps(table_rows(), column)])
        else:
            features, returns = FEATURES.copy(), RETURNS.copy()
            (returns if column == 2 else features)[0, 2:4, 0] = features[1, 4, 1] = np.nan
            np.savez(path, features=features, returns=returns, feature_names=["mom", "vol"],
                     asset_names=["ret_a", "ret_b"])
        return path

    path, gappy_features = write("m", 2), write("f", 1)
    kw = {} if suffix == ".npz" else {"feature_cols": ["mom", "vol"], "return_cols": ["ret_*"], "path_col": "id"}

    first = {".csv": r"column 'ret_a', row 5 \(line 6\)", ".parquet": "column 'ret_a', row 5",
             ".npz": "returns 'ret_a', path 0, step 2"}[suffix]
    with pytest.raises(ValueError, match=rf"{first}: missing value \(3 missing in total\) \(or choose a --fill policy"):
        read(path, **kw)
    for fill in ("zero", "ffill"):
        with pytest.raises(ValueError, match=rf"{first}: missing return; fill='{fill}' fills features only, returns "
                                             r"are never made up .*use fill='drop', which drops the row, or remove"):
            read(path, fill=fill, **kw)

    zero = read(gappy_features, fill="zero", **kw)
    assert zero.features[0, 2, 0] == zero.features[0, 3, 0] == zero.features[1, 4, 1] == 0
    assert np.isfinite(zero.features).all()
    np.testing.assert_array_equal(zero.returns, RETURNS)

    ffill = read(gappy_features, fill="ffill", **kw)
    assert ffill.features[0, 2, 0] == ffill.features[0, 3, 0] == FEATURES[0, 1, 0]
    assert ffill.features[1, 4, 1] == FEATURES[1, 3, 1]
    np.testing.assert_array_equal(ffill.returns, RETURNS)

    if suffix == ".npz":  # both paths lose a different number of steps
        with pytest.raises(ValueError, match=r"same number of rows after fill='drop'; got 0: 4, 1: 5"):
            read(path, fill="drop", **kw)
    else:
        with pytest.raises(ValueError, match=r"same number of rows after fill='drop'; got 'x': 4, 'y': 5"):
            read(path, fill="drop", **kw)


def test_the_last_row_of_a_shifted_return_column_is_dropped_never_filled(tmp_path):
    """The module docstring's shift (ret_next[t] = ret[t + 1]) leaves the last row without a return: ffill would
    pay it the return before, zero a flat period, and either would be scored. Refused; drop drops the row."""
    rows = [r for r in table_rows() if r[4] == "x"]
    rows[-1][2] = ""
    path = write_csv(tmp_path / "shifted.csv", rows)
    for fill in ("ffill", "zero"):
        with pytest.raises(ValueError, match=r"^shifted\.csv: column 'ret_a', row 6 \(line 7\): missing return; "
                                             rf"fill='{fill}' fills features only, returns are never made up"):
            read_table(path, fill=fill, path_col=None)
    dropped = read_table(path, fill="drop", path_col=None)
    np.testing.assert_array_equal(dropped.returns[0], RETURNS[0, :-1])


def test_drop_keeps_equal_paths(tmp_path):
    rows = table_rows()
    rows[4][2] = rows[7][5] = ""  # path x step 2, path y step 3
    data = read_table(write_csv(tmp_path / "m.csv", rows), fill="drop")
    np.testing.assert_array_equal(data.features[0], np.delete(FEATURES[0], 2, axis=0))
    np.testing.assert_array_equal(data.returns[1], np.delete(RETURNS[1], 3, axis=0))


def test_leading_gap_with_ffill(tmp_path):
    rows = table_rows()
    rows[1][3] = ""  # path 'y', its first row: nothing to carry forward
    with pytest.raises(ValueError, match=r"m\.csv: column 'vol', row 2 \(line 3\): missing value with no earlier "
                                         r"value in its path to carry forward"):
        read_table(write_csv(tmp_path / "m.csv", rows), fill="ffill")


def test_bad_arguments(tmp_path):
    path = write_csv(tmp_path / "m.csv", table_rows())
    with pytest.raises(ValueError, match="fill: expected one of 'error', 'ffill', 'zero', 'drop', got 'mean'"):
        read_table(path, fill="mean")
    with pytest.raises(ValueError, match="return_cols: required to read m.csv"):
        read(path, feature_cols=["mom"])
    with pytest.raises(ValueError, match="feature_cols: required"):
        read(path, return_cols=["ret_a"])
    with pytest.raises(ValueError, match=r"feature_cols: 'mon\*' matches no column of m\.csv; its columns are "
                                         r"'date', 'mom', 'ret_a', 'vol', 'id', 'ret_b'"):
        read_table(path, feature_cols=["mon*"])
    with pytest.raises(ValueError, match=r"return_cols: \['ret_a'\] also selected by feature_cols; a feature must be"):
        read_table(path, feature_cols=["mom", "ret_a"])
    with pytest.raises(ValueError, match="path_col: no column 'ident' in m.csv"):
        read_table(path, path_col="ident")
    with pytest.raises(ValueError, match="feature_cols: 'id' is the path_col"):
        read_table(path, feature_cols=["mom", "id"])
    assert read_table(path, feature_cols=["*o*"]).feature_names == ("mom", "vol")  # never the path id


def test_a_pattern_skips_the_date_columns_and_pandas_index(tmp_path):
    """'*' (or 'd*') matched the date column, refused as no number, and pandas' unnamed index (df.to_csv()'s row
    numbers), which trained as a feature without a word. A pattern now skips them; an exact name still takes one."""
    rows = [[str(i), *row] for i, row in enumerate(table_rows())]
    path = write_csv(tmp_path / "m.csv", rows, ["", *HEADER])
    data = read(path, feature_cols="*", path_col="id", returns=False)
    assert data.feature_names == ("mom", "ret_a", "vol", "ret_b")
    assert read(path, feature_cols=["", "mom"], path_col="id", returns=False).feature_names == ("", "mom")
    with pytest.raises(ValueError, match=r"feature_cols: 'd\*' matches no column of m\.csv but the date or index "
                                         r"column 'date', which a pattern skips; its columns are '', 'date', 'mom'"):
        read(path, feature_cols="d*", path_col="id", returns=False)


def test_assets_stacked_one_after_another_without_path_col_are_told_to_give_it(tmp_path):
    """A long table of several assets, each series whole before the next (pandas' MultiIndex (ticker, date)
    written flat), goes back in time where the second asset begins: the message said only that a file written
    newest first must be reversed. It now names path_col; a file written newest first is not told so."""
    rows = sorted(table_rows(), key=lambda row: row[4])  # path 'x' whole, then 'y'
    with pytest.raises(ValueError, match=r"goes back from 2024-01-06 to 2024-01-01 at row 7 \(line 8\); a file "
                                         r"written newest first must be reversed; or, if the rows are of several "
                                         r"assets one after another, give path_col$"):
        read_table(write_csv(tmp_path / "stacked.csv", rows), path_col=None)
    check(read_table(tmp_path / "stacked.csv"))
    with pytest.raises(ValueError, match=r"at row 2 \(line 3\); a file written newest first must be reversed$"):
        read_table(write_csv(tmp_path / "newest.csv", [r for r in table_rows() if r[4] == "x"][::-1]), path_col=None)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"m\.xlsx: unsupported suffix '\.xlsx'; expected one of \.npz, \.csv, "):
        read(tmp_path / "m.xlsx")
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read(tmp_path / "nope.csv", feature_cols=["a"], return_cols=["b"])
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text("mom,ret\n")
    for name in ("empty.csv", "header.csv"):
        with pytest.raises(ValueError, match=rf"{name}: no data rows"):
            read(tmp_path / name, feature_cols=["mom"], return_cols=["ret"])
    (tmp_path / "ragged.csv").write_text("mom,ret\n1,2\n3\n")
    with pytest.raises(ValueError, match=r"ragged\.csv: line 3 has 1 fields, the header 2"):
        read(tmp_path / "ragged.csv", feature_cols=["mom"], return_cols=["ret"])
    for sep in ";\t":  # a spreadsheet's export where the comma is the decimal mark
        (tmp_path / "other.csv").write_text(f"mom{sep}ret\n1{sep}2\n")
        message = f"other.csv: expected comma-separated columns, got one column {f'mom{sep}ret'!r} (separated by {sep!r}?)"
        with pytest.raises(ValueError, match=re.escape(message)):
            read(tmp_path / "other.csv", feature_cols=["mom"], return_cols=["ret"])


def test_bad_npz(tmp_path):
    path = tmp_path / "m.npz"
    np.savez(path, features=FEATURES, returns=RETURNS)
    with pytest.raises(ValueError, match=r"feature_cols: only for \.csv/\.parquet files, got \['mom'\] with m\.npz"):
        read(path, feature_cols=["mom"])
    with pytest.raises(ValueError, match="path_col: only for .csv/.parquet files"):
        read(path, path_col="id")
    np.savez(path, features=FEATURES)
    with pytest.raises(ValueError, match=r"m\.npz: no array 'returns'"):
        read(path)
    np.savez(path, features=FEATURES, returns=RETURNS[:, :5])
    with pytest.raises(ValueError, match=r"m\.npz: 'features' and 'returns' .* got features \(2, 6, 2\), "
                                         r"returns \(2, 5, 2\)"):
        read(path)
    np.savez(path, features=FEATURES[0], returns=RETURNS)
    with pytest.raises(ValueError, match=r"got features \(6, 2\), returns \(2, 6, 2\)"):
        read(path)
    np.savez(path, features=FEATURES, returns=RETURNS, asset_names=["a"])
    with pytest.raises(ValueError, match=r"m\.npz: 'asset_names' has 1 names for 2 columns"):
        read(path)
    np.savez(path, features=np.full((2, 6, 2), "x"), returns=RETURNS)
    with pytest.raises(ValueError, match=r"m\.npz: array 'features' is not numeric \(dtype <U1\)"):
        read(path)
    np.savez(path, features=FEATURES, returns=np.empty((2, 6, 2), object))
    with pytest.raises(ValueError, match=r"m\.npz: array 'returns' is not numeric \(dtype object\)"):
        read(path)
    np.savez(path, features=FEATURES, returns=RETURNS > 0)  # a flag can be a feature, never a return
    with pytest.raises(ValueError, match=r"m\.npz: array 'returns' is not numeric \(dtype bool\)"):
        read(path)


def test_a_file_that_is_not_an_npz_is_named(tmp_path):
    """Text renamed .npz (numpy would speak of pickled data), an empty or truncated file, a lone .npy renamed, a
    damaged array: one error naming the file."""
    path = tmp_path / "m.npz"
    np.savez(path, features=FEATURES, returns=RETURNS)
    good = path.read_bytes()
    np.save(tmp_path / "lone.npy", FEATURES)
    damaged_header, damaged_data = bytearray(good), bytearray(good)
    start = good.index(b"\x93NUMPY")  # the first array's header: magic, version, length, then "{'descr': ..."
    damaged_header[start + 10] ^= 0xFF
    damaged_data[start + 140] ^= 0xFF  # past the 128-byte header: the CRC fails when read
    for content in (b"date,mom,ret\n2024-01-02,0.1,0.01\n", b"", good[:100], good[:-30],
                    (tmp_path / "lone.npy").read_bytes(), bytes(damaged_header), bytes(damaged_data)):
        path.write_bytes(content)
        with pytest.raises(ValueError, match=r"^m\.npz: not a readable \.npz file \(expected a zip of arrays"):
            read(path)


def test_a_flag_is_a_feature_read_as_0_or_1_never_a_return(tmp_path):
    """A boolean column (parquet bool, npz bool array) reads as 0.0 / 1.0 as a feature; as a return it is refused."""
    rows = table_rows()
    flags = [bool(r[1] > 0) for r in rows]
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    columns = {h: [r[i] for r in rows] for i, h in enumerate(HEADER)}
    pq.write_table(pa.table({**columns, "up": flags}), tmp_path / "m.parquet")
    data = read_table(tmp_path / "m.parquet", feature_cols=["mom", "up"])
    np.testing.assert_array_equal(data.features[..., 1], FEATURES[..., 0] > 0)
    assert data.features.dtype == np.float64
    with pytest.raises(ValueError, match=r"m\.parquet: column 'up', row 1: expected a number, got (True|False)"):
        read_table(tmp_path / "m.parquet", return_cols=["up"])
    pq.write_table(pa.table({**columns, "up": [None, *flags[1:]]}), tmp_path / "gap.parquet")  # a null: missing
    with pytest.raises(ValueError, match=r"gap\.parquet: column 'up', row 1: missing value"):
        read_table(tmp_path / "gap.parquet", feature_cols=["mom", "up"])

    np.savez(tmp_path / "m.npz", features=FEATURES > 0, returns=RETURNS)
    np.testing.assert_array_equal(read(tmp_path / "m.npz").features, FEATURES > 0)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_rows_newest_first_are_refused_by_their_date_column(tmp_path, suffix):
    """Two interleaved paths each in time order read (the table above); a file written newest first would train on
    time run backwards, each return paid to a position chosen after it: refused, naming the column and the row."""
    write = write_csv if suffix == ".csv" else write_parquet
    check(read_table(write(tmp_path / f"ok{suffix}", table_rows())))
    newest_first = table_rows()[::-1]
    with pytest.raises(ValueError, match=r"rows must be in time order \(oldest first\), but column 'date' goes back "
                                         r"from 2024-01-06 to 2024-01-05 at row 3\b.*must be reversed$"):
        read_table(write(tmp_path / f"newest{suffix}", newest_first))
    rows = [row for row in table_rows() if row[4] == "x"]
    rows[3][0] = "2024-01-02"  # back in time within one path
    with pytest.raises(ValueError, match=r"goes back from 2024-01-03 to 2024-01-02 at row 4\b"):
        read_table(write(tmp_path / f"back{suffix}", rows))
    us_dates = [[f"01/{31 - i:02d}/2024", *row[1:]] for i, row in enumerate(table_rows())]  # month first: read so
    with pytest.raises(ValueError, match=r"column 'date' goes back from 01/31/2024 to 01/29/2024 at row 3\b"):
        read_table(write(tmp_path / f"us{suffix}", us_dates))


def test_a_local_clock_going_back_is_refused_saying_how_to_write_it(tmp_path):
    """Naive local stamps repeat an hour when daylight saving time ends (here 02:00-03:00 on 2024-10-27, half-hour
    bars): no zone says which 02:30 came first, so the step back is refused, and the message says how to write it
    (UTC offsets or UTC, or a date and a time-of-day column), each of which then reads."""
    local = ["00:30", "01:00", "01:30", "02:00", "02:30", "02:00", "02:30", "03:00"]  # 02:00 and 02:30 twice
    offsets = ["+02:00"] * 5 + ["+01:00"] * 3  # CEST, then CET
    header = ["datetime", "mom", "ret"]

    def rows(stamps):
        return [[stamp, 0.1 * t, 0.01 * (-1) ** t] for t, stamp in enumerate(stamps)]

    hint = (r"if a local clock went back \(daylight saving time ended\), write each stamp with its UTC offset "
            r"\(2024-10-27T02:30\+01:00\) or in UTC, or the date and the time of day as two columns \(date, time\)$")
    path = write_csv(tmp_path / "dst.csv", rows([f"2024-10-27T{t}" for t in local]), header)
    with pytest.raises(ValueError, match=r"^dst\.csv: rows must be in time order \(oldest first\), but column "
                                         r"'datetime' goes back from 2024-10-27T02:30 to 2024-10-27T02:00 at row 6 "
                                         r"\(line 7\); a file written newest first must be reversed; or, " + hint):
        read(path, feature_cols=["mom"], return_cols=["ret"])
    hourly = write_csv(tmp_path / "hourly.csv", rows([f"2024-10-27T{t}" for t in ("01:00", "02:00", "02:00")]),
                       header)
    with pytest.raises(ValueError, match=r"row 3 \(line 4\): 2024-10-27T02:00 repeats row 2 \(line 3\) in the same "
                                         r"path: a repeated bar .*, or " + hint):
        read(hourly, feature_cols=["mom"], return_cols=["ret"])
    zoned = write_csv(tmp_path / "zoned.csv", rows([f"2024-10-27T{t}{z}" for t, z in zip(local, offsets)]), header)
    assert read(zoned, feature_cols=["mom"], return_cols=["ret"]).num_steps == len(local)
    split = write_csv(tmp_path / "split.csv", [["2024-10-27", t, *row[1:]] for t, row in zip(local, rows(local))],
                      ["date", "time", "mom", "ret"])
    assert read(split, feature_cols=["mom"], return_cols=["ret"]).num_steps == len(local)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_time_order_check_does_not_switch_itself_off(tmp_path, suffix):
    """A blank date, the same date twice in one path, and zone-aware beside naive stamps each used to switch the
    check off (a newest-first file with one blank date trained); each is now an error naming the row."""
    write = write_csv if suffix == ".csv" else write_parquet
    line = {".csv": lambda r: rf"row {r} \(line {r + 1}\)", ".parquet": lambda r: f"row {r}"}[suffix]

    newest_first = table_rows()[::-1]
    newest_first[5][0] = None if suffix == ".parquet" else ""
    with pytest.raises(ValueError, match=rf"column 'date', {line(6)}: date missing"):
        read_table(write(tmp_path / f"blank{suffix}", newest_first))
    if suffix == ".parquet":  # a date column of its own type, with a null
        rows = [[datetime.date(2024, 1, t // 2 + 1), *row[1:]] for t, row in enumerate(table_rows())]
        check(read_table(write(tmp_path / "dates.parquet", rows)))
        rows[7][0] = None
        with pytest.raises(ValueError, match=r"column 'date', row 8: date missing"):
            read_table(write(tmp_path / "null.parquet", rows))

    rows = [row for row in table_rows() if row[4] == "x"]
    rows[3][0] = rows[2][0]  # the same bar twice
    # a date-only file is not told about clocks going back (a time of day's repeated hour, above)
    with pytest.raises(ValueError, match=rf"column 'date', {line(4)}: 2024-01-03 repeats {line(3)} in the same "
                                         r"path: a repeated bar \(the same period twice\); remove one, or give "
                                         r"path_col if the rows are of several assets$"):
        read_table(write(tmp_path / f"twice{suffix}", rows))
    with pytest.raises(ValueError, match=rf"{line(2)}: 2024-01-01 repeats {line(1)} in the same path: .*path_col"):
        read_table(write(tmp_path / f"m{suffix}", table_rows()), path_col=None)  # two assets' rows as one path

    rows = [row for row in table_rows() if row[4] == "x"]
    for t, row in enumerate(rows):
        row[0] = f"2024-01-0{t + 1}T16:00" + ("+00:00" if t >= 3 else "")
    with pytest.raises(ValueError, match=rf"column 'date', {line(4)}: 2024-01-04T16:00\+00:00 has a time zone, the "
                                         r"rows before it none; write every stamp with a zone, or none"):
        read_table(write(tmp_path / f"zones{suffix}", rows))
    rows = rows[::-1]
    with pytest.raises(ValueError, match=rf"{line(4)}: 2024-01-03T16:00 has no time zone, the rows before it one"):
        read_table(write(tmp_path / f"zones{suffix}", rows))


def test_a_price_column_given_as_returns_draws_a_warning(tmp_path):
    """Prices read as returns train without a word (a utility of -17 a step): each return column whose values are all
    positive with a mean above 0.5 draws one warning naming it; real returns, even all positive, none."""
    rows = [row for row in table_rows() if row[4] == "x"]
    for t, row in enumerate(rows):
        row[2], row[5] = 100.0 + t, 0.001 * (t + 1)  # ret_a: prices; ret_b: positive, but returns
    path = write_csv(tmp_path / "m.csv", rows)
    with pytest.warns(UserWarning) as caught:
        read_table(path, path_col=None)
    assert [str(w.message) for w in caught] == [
        "m.csv: column 'ret_a' looks like prices, not returns (every value > 0, mean 102.5): the return columns must "
        "be per-period returns as fractions"]
    assert caught[0].filename == __file__  # the caller's line, not the library's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_table(path, path_col=None, return_cols=["ret_b"])
    np.savez(tmp_path / "m.npz", features=FEATURES, returns=np.stack([100 + RETURNS[..., 0], RETURNS[..., 1]], -1),
             asset_names=["spx", "ndx"])
    with pytest.warns(UserWarning, match=r"^m\.npz: returns 'spx' looks like prices, not returns"):
        read(tmp_path / "m.npz")


def test_the_module_docstring_states_the_unit_of_returns_and_what_zero_fills():
    doc = " ".join(market_data.__doc__.split())
    assert "simple returns as decimal fractions: 0.01 is +1%" in doc and "(gamma, lambda) do not scale" in doc
    assert "replace a missing feature by 0, in the file's units, before standardisation: not the feature's mean" in doc


def test_time_slice():
    data = MarketData(FEATURES, RETURNS, ("mom", "vol"), ("a", "b"))
    part = data.time_slice(2, 5)
    np.testing.assert_array_equal(part.features, FEATURES[:, 2:5])
    np.testing.assert_array_equal(part.returns, RETURNS[:, 2:5])
    assert part.feature_names == data.feature_names
    assert data.time_slice(3, 3).num_steps == 0
    with pytest.raises(ValueError, match="stop: expected an int in"):
        data.time_slice(3, 7)
    with pytest.raises(ValueError, match="features, returns"):
        MarketData(FEATURES, RETURNS[:, :3], ("mom", "vol"), ("a", "b"))


def test_time_split():
    assert time_split(100, 0.15, 0.15) == (70, 85)
    assert time_split(10, 0.0, 0.2) == (8, 8)  # empty validation period
    assert time_split(4, 0.25, 0.25) == (2, 3)
    assert time_split(10, 0.25, 0.25) == (4, 7)  # halves round up: 2.5 -> 3
    with pytest.raises(ValueError, match="test_fraction: 0.01 of 20 steps is 0 steps"):
        time_split(20, 0.2, 0.01)
    with pytest.raises(ValueError, match="valid_fraction: 0.01 of 20 steps is 0 steps"):
        time_split(20, 0.01, 0.2)
    with pytest.raises(ValueError, match=r"valid_fraction, test_fraction: 0.4 and 0.4 of 5 steps \(2 \+ 2\) leave 1 "
                                         r"training steps"):
        time_split(5, 0.4, 0.4)
    for args, name in (((10, 0.2, 0.0), "test_fraction"), ((10, 0.2, 1.0), "test_fraction"),
                       ((10, -0.1, 0.2), "valid_fraction"), ((0, 0.2, 0.2), "num_steps")):
        with pytest.raises(ValueError, match=name):
            time_split(*args)


def test_standardiser():
    x = RNG.normal(3.0, 2.0, size=(3, 50, 2))
    s = Standardiser.fit(x, ["mom", "vol"])
    np.testing.assert_allclose(s.mean, x.mean(axis=(0, 1)))
    np.testing.assert_allclose(s.std, x.std(axis=(0, 1)))
    z = s(x)
    assert z.dtype == np.float32 and z.shape == x.shape
    np.testing.assert_allclose(z.mean(axis=(0, 1)), 0, atol=1e-6)
    np.testing.assert_allclose(z.std(axis=(0, 1)), 1, atol=1e-6)
    again = Standardiser.from_json(json.loads(json.dumps(s.to_json())))
    assert again == s
    np.testing.assert_array_equal(again(x[0]), z[0])  # any leading shape
    with pytest.raises(ValueError, match=r"features: expected 2 features \('mom', 'vol'\) on the last axis, got shape"):
        s(x[..., :1])
    # A missing live bar (NaN) would make the Traveller's state NaN from then on: refused, naming where it is.
    bar = x[0, 0].copy()
    bar[1] = np.nan
    with pytest.raises(ValueError, match=r"^features: expected finite values, got nan at index \[1\] \(feature "
                                         r"'vol'\): fill a missing value first, as --fill does for a file$"):
        s(bar)
    const = x.copy()
    const[..., 1] = 0.1  # a float constant: its computed std is round-off, not exactly 0
    with pytest.raises(ValueError, match="feature_cols: 'vol' is constant or not finite over the training period"):
        Standardiser.fit(const, ["mom", "vol"])
    with pytest.raises(ValueError, match=r"features: expected a non-empty \[N, T, 2\] array, got shape \(3, 50, 1\)"):
        Standardiser.fit(x[..., :1], ["mom", "vol"])
    with pytest.raises(ValueError, match="standardiser: missing keys"):
        Standardiser.from_json({"mean": [0.0]})
    with pytest.raises(ValueError, match="standardiser: expected finite means and positive finite stds"):
        Standardiser.from_json({"mean": [0.0], "std": [0.0], "names": ["a"]})


def test_estimate_covariance():
    r = RNG.normal(size=(3, 40, 2)) @ np.array([[1.0, 0.5], [0.0, 2.0]])
    np.testing.assert_allclose(estimate_covariance(r), np.cov(r.reshape(-1, 2).T))
    np.testing.assert_allclose(estimate_covariance(r[..., :1]), [[np.var(r[..., 0], ddof=1)]])
    with pytest.raises(ValueError, match="returns: expected .* at least 2 steps"):
        estimate_covariance(r[:, :1])
    with pytest.raises(ValueError, match="returns: expected"):
        estimate_covariance(r[0])
    collinear = np.concatenate([r[..., :1], 2 * r[..., :1]], axis=2)
    with pytest.raises(ValueError, match="return_cols: the sample covariance of the training period's returns of 2 assets is not positive definite "
                                         r"\(smallest eigenvalue"):
        estimate_covariance(collinear)
    r[1, 3, 0] = np.nan
    with pytest.raises(ValueError, match=r"returns\[1, 3, 0\]=nan is not finite"):
        estimate_covariance(r)


def test_read_covariance(tmp_path):
    cov = np.array([[1.0, 0.3], [0.3, 2.0]])
    np.save(tmp_path / "c.npy", cov)
    np.testing.assert_array_equal(read_covariance(tmp_path / "c.npy", 2), cov)
    np.savetxt(tmp_path / "c.csv", cov, delimiter=",")
    np.testing.assert_array_equal(read_covariance(tmp_path / "c.csv", 2), cov)

    errors = {
        "shape.npy": (np.eye(3), r"shape\.npy: expected a \[2, 2\] covariance \(num_assets=2\), got shape \(3, 3\)"),
        "asym.npy": (np.array([[1.0, 0.3], [0.2, 2.0]]), r"asym\.npy: not symmetric"),
        "notpd.npy": (np.array([[1.0, 2.0], [2.0, 1.0]]), r"notpd\.npy: the covariance of 2 assets is not positive "
                                                           r"definite \(smallest eigenvalue -1"),
        "inf.npy": (np.array([[1.0, np.inf], [np.inf, 1.0]]), r"inf\.npy: C\[0, 1\]=inf .* is not finite"),
        "text.npy": (np.array([["a", "b"], ["c", "d"]]), r"text\.npy is not numeric"),
        "asym.csv": (np.array([[1.0, 0.3], [0.2, 2.0]]), r"asym\.csv: not symmetric"),
    }
    for name, (matrix, message) in errors.items():
        (np.save if name.endswith(".npy") else lambda p, m: np.savetxt(p, m, delimiter=","))(tmp_path / name, matrix)
        with pytest.raises(ValueError, match=message):
            read_covariance(tmp_path / name, 2)
    (tmp_path / "header.csv").write_text("a,b\n1,0\n0,1\n")
    with pytest.raises(ValueError, match=r"header\.csv: line 1: expected numbers \(a headerless CSV\)"):
        read_covariance(tmp_path / "header.csv", 2)
    with pytest.raises(ValueError, match=r"c\.txt: unsupported suffix '\.txt'; expected \.npy or \.csv"):
        read_covariance(tmp_path / "c.txt", 2)
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        read_covariance(tmp_path / "missing.npy", 2)


def test_selected_columns_keep_the_files_order_and_paths_are_ordered_apart(tmp_path):
    """Columns chosen by name or pattern come in the file's order, whatever order they are named in; with a path
    column, each path's dates must rise, not the rows' across paths (path b's dates are older than a's)."""
    (tmp_path / "x.csv").write_text("zeta,alpha,ret_b,ret_a\n1,10,0.1,0.2\n2,20,0.3,0.4\n3,30,0.5,0.6\n")
    m = read(tmp_path / "x.csv", feature_cols=["alpha", "zeta"], return_cols=["ret_*"])
    assert m.feature_names == ("zeta", "alpha") and m.asset_names == ("ret_b", "ret_a")
    assert m.features[0, :, 0].tolist() == [1, 2, 3] and m.returns[0, 0].tolist() == [0.1, 0.2]
    rows = ["date,asset,f,r"]
    for t in range(4):
        rows += [f"2024-01-0{t + 1},a,{t},{(-1) ** t * 0.01}", f"2020-01-0{t + 1},b,{-t},{(-1) ** t * 0.02}"]
    (tmp_path / "paths.csv").write_text("\n".join(rows) + "\n")
    m = read(tmp_path / "paths.csv", feature_cols=["f"], return_cols=["r"], path_col="asset")
    assert m.features.shape == (2, 4, 1) and m.features[1, :, 0].tolist() == [0, -1, -2, -3]


def test_a_file_in_another_encoding_is_named(tmp_path):
    # A spreadsheet's Windows-1252 export (a feature named "vol_é"): one line naming the file, not the codec's error.
    path = tmp_path / "m.csv"
    path.write_bytes("date,vol_\xe9,r\n2024-01-02,1.0,0.01\n".encode("cp1252"))
    with pytest.raises(ValueError, match=r"^m\.csv: not UTF-8 text \(byte 0xe9 at offset 9\); save it as UTF-8"):
        market_data.read(path, feature_cols=["vol_*"], return_cols=["r"])
    cov = tmp_path / "c.csv"
    cov.write_bytes("1.0,0.1\xe9\n0.1,1.0\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"^c\.csv: not UTF-8 text"):
        market_data.read_covariance(cov, 2)


def test_each_step_says_where_it_came_from(tmp_path):
    # path_col's values name the paths, and each step keeps its index among its path's rows in the file when
    # fill='drop' drops a row before it: output written per step lines up with the file's rows.
    path = tmp_path / "m.csv"
    rows = [("x", 1, 0.01), ("y", 2, 0.02), ("x", "", 0.03), ("y", 4, 0.04), ("x", 5, 0.05), ("y", 6, "")]
    path.write_text("ticker,f,r\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    data = read(path, feature_cols=["f"], return_cols=["r"], path_col="ticker", fill="drop")
    assert data.path_labels == ("x", "y")
    assert data.source_steps.tolist() == [[0, 2], [0, 1]]
    assert data.features[:, :, 0].tolist() == [[1, 5], [2, 4]]
    assert data.time_slice(1, 2).source_steps.tolist() == [[2], [1]]
    plain = read(path, feature_cols=["f"], return_cols=None, returns=False, fill="ffill")  # one path: 0, its rows
    assert plain.path_labels == (0,) and plain.source_steps.tolist() == [list(range(6))]


@pytest.mark.parametrize("name", ["Date", "DATE", "TimeStamp"])
def test_a_date_column_is_found_in_any_case(tmp_path, name):
    """A column headed 'Date' or 'DATE' (as many exports write it) is checked for time order like 'date': a file
    written newest first is refused, naming the column as the file spells it."""
    header = [name, *HEADER[1:]]
    check(read_table(write_csv(tmp_path / "ok.csv", table_rows(), header)))
    with pytest.raises(ValueError, match=rf"rows must be in time order \(oldest first\), but column '{name}' goes "
                                         r"back from 2024-01-06 to 2024-01-05 at row 3\b"):
        read_table(write_csv(tmp_path / "newest.csv", table_rows()[::-1], header))


@pytest.mark.parametrize("zone", [None, datetime.UTC, datetime.timezone(datetime.timedelta(hours=-5))])
def test_parquet_timestamps_are_compared_with_their_time_of_day(tmp_path, zone):
    """A parquet TIMESTAMP column of intraday bars: bars of one day at different hours are successive bars (read
    as they are), not the same bar repeated; zone-aware or naive alike. The same bars newest first are refused by
    their times, and the same time twice is a repeated bar."""
    def stamps(rows):
        return [[datetime.datetime(2024, 1, 2, 9 + t // 2, 30, tzinfo=zone), *row[1:]] for t, row in enumerate(rows)]

    check(read_table(write_parquet(tmp_path / "bars.parquet", stamps(table_rows()))))
    rows = stamps(table_rows())[::-1]
    with pytest.raises(ValueError, match=r"rows must be in time order \(oldest first\), but column 'date' goes back "
                                         r"from 2024-01-02 14:30:00.* to 2024-01-02 13:30:00.* at row 3\b"):
        read_table(write_parquet(tmp_path / "newest.parquet", rows))
    rows = [row for row in stamps(table_rows()) if row[4] == "x"]
    rows[3][0] = rows[2][0]
    with pytest.raises(ValueError, match=r"column 'date', row 4: 2024-01-02 11:30:00.* repeats row 3 in the same "
                                         r"path: a repeated bar"):
        read_table(write_parquet(tmp_path / "twice.parquet", rows))


@pytest.mark.parametrize("missing", ["NaN", "NA", "nan", " na "])
def test_a_nan_date_among_iso_dates_is_a_missing_date(tmp_path, missing):
    """A date cell written 'NaN' or 'NA' (as pandas and R write a missing value) in a column of ISO dates is a
    missing date, named as such: it must not make the column look 'not ISO dates' and switch the order check off
    (a newest-first file would then train on time run backwards)."""
    newest_first = table_rows()[::-1]
    newest_first[5][0] = missing
    with pytest.raises(ValueError, match=r"column 'date', row 6 \(line 7\): date missing \(the column's other cells "
                                         r"are dates, checked for time order\)"):
        read_table(write_csv(tmp_path / "nan.csv", newest_first))


def test_gross_returns_draw_the_price_warning_and_mixed_sign_returns_do_not(tmp_path):
    """Gross returns 1 + r (all positive, mean about 1.0) given as returns would train as a 100% gain a step: they
    draw the price warning. A column with down periods is a return series whatever its mean: no price warning (one
    this large, a median |r| of 350%, is percent: it draws that warning instead)."""
    rows = [row for row in table_rows() if row[4] == "x"]
    for t, row in enumerate(rows):
        row[2] = 1.0 + (0.01 if t % 2 else -0.01)  # ret_a: gross returns, mean exactly 1.0
        row[5] = [5.0, -1.0, 3.0, 4.0, -2.0, 6.0][t]  # ret_b: large mean 2.5 but down periods: returns
    path = write_csv(tmp_path / "m.csv", rows)
    percent = ("m.csv: column 'ret_b' looks like percent returns, not fractions (median non-zero |value| 3.5; "
               "decimal "
               "returns' is about 0.01 a day, below 0.3 even a volatile asset's monthly): divide a percent column by "
               "100")
    with pytest.warns(UserWarning) as caught:
        read_table(path, path_col=None)
    assert [str(w.message) for w in caught] == [
        ("m.csv: column 'ret_a' looks like prices, not returns (every value > 0, mean 1): the return columns must "
         "be per-period returns as fractions"), percent]
    with pytest.warns(UserWarning) as caught:
        data = read_table(path, path_col=None, return_cols=["ret_b"])
    assert [str(w.message) for w in caught] == [percent]
    np.testing.assert_array_equal(data.returns[0, :, 0], [5.0, -1.0, 3.0, 4.0, -2.0, 6.0])


def test_prices_at_any_scale_and_percent_returns_draw_a_warning_decimal_returns_none(tmp_path):
    """A price below 0.5 (a penny stock, a currency ~0.3) moves by a small part of its level each day: the price
    warning; percent returns (1.5 for 1.5%) the percent warning; realistic decimal daily returns (|r| 0.01 to 0.05
    and a crash day of -20%), the same all positive, and a cash asset's (a few basis points a day, all positive and
    as slow as a price), none. Each warning is one line naming the column and file. A price below PRICE_LEVEL (a
    currency quoted per yen) reads as a cash asset's return: not caught."""
    rng = np.random.default_rng(1)
    steps = 250
    daily = rng.choice([-1, 1], steps) * rng.uniform(0.01, 0.05, steps)
    daily[100] = -0.2  # a crash day
    columns = {"penny": 0.3 * np.cumprod(1 + daily),  # a price around 0.3: mean < 0.5
               "pct": 100 * daily,  # percent
               "dec": daily,  # decimal: no warning
               "up": np.abs(daily),  # decimal, all positive (a run of up days): no warning
               "cash": 0.0002 * np.exp(np.cumsum(0.002 * rng.standard_normal(steps))),  # a T-bill's daily return
               "fx": 0.0067 * np.exp(np.cumsum(0.005 * rng.standard_normal(steps)))}  # USD per yen: not caught
    names = list(columns)
    path = tmp_path / "d.csv"
    rows = [[f"day{t}", rng.normal(), *(columns[c][t] for c in names)] for t in range(steps)]
    write_csv(path, rows, header=["date", "mom", *names])
    with pytest.warns(UserWarning) as caught:
        read(path, feature_cols=["mom"], return_cols=names)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and all("\n" not in m for m in messages), messages
    assert re.fullmatch(r"d\.csv: column 'penny' looks like prices, not returns \(every value > 0, median step "
                        r"[0-9.]+% of the median value 0\.[0-9]+\): the return columns must be per-period returns as "
                        r"fractions", messages[0]), messages[0]
    assert re.fullmatch(r"d\.csv: column 'pct' looks like percent returns, not fractions \(median non-zero \|value\| "
                        r"[0-9.]+; "
                        r"decimal returns' is about 0\.01 a day, below 0\.3 even a volatile asset's monthly\): "
                        r"divide a percent column by 100", messages[1]), messages[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read(path, feature_cols=["mom"], return_cols=["dec", "up", "cash", "fx"])


def test_time_slice_refuses_a_stop_before_its_start():
    """time_slice(3, 2) is a mistake (not an empty slice, which is time_slice(3, 3)): refused, naming stop and
    the range it must lie in."""
    data = MarketData(FEATURES, RETURNS, ("mom", "vol"), ("a", "b"))
    with pytest.raises(ValueError, match=rf"^stop: expected an int in \[3, {T}\], got 2$"):
        data.time_slice(3, 2)
    with pytest.raises(ValueError, match=rf"^stop: expected an int in \[{T}, {T}\], got 0$"):
        data.time_slice(T, 0)


def test_a_date_beside_a_time_of_day_column_may_repeat(tmp_path):
    # A broker's intraday export: a date and a time column, 2 bars a day. The date repeats within the path by design;
    # only a date going back is refused. The one-column case still refuses a repeated bar.
    path = tmp_path / "bars.csv"
    rows = [("2024-01-02", "09:30", 1, 0.01), ("2024-01-02", "10:00", 2, 0.02), ("2024-01-03", "09:30", 3, 0.03),
            ("2024-01-03", "10:00", 4, 0.04)]
    path.write_text("date,time,f,r\n" + "".join(f"{d},{t},{f},{r}\n" for d, t, f, r in rows))
    assert read(path, feature_cols=["f"], return_cols=["r"]).num_steps == 4
    path.write_text("date,time,f,r\n" + "".join(f"{d},{t},{f},{r}\n" for d, t, f, r in reversed(rows)))
    with pytest.raises(ValueError, match=r"rows must be in time order \(oldest first\), but column 'date' goes back"):
        read(path, feature_cols=["f"], return_cols=["r"])


def test_integer_path_ids_of_a_parquet_file_stay_integers(tmp_path):
    # pyarrow reads an integer column as floats here: the positions file would name the path 101.0, not 101.
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [101, 202, 101, 202], "f": [1.0, 2.0, 3.0, 4.0], "r": [0.01, 0.02, 0.03, 0.04]}),
                   tmp_path / "m.parquet")
    data = read(tmp_path / "m.parquet", feature_cols=["f"], return_cols=["r"], path_col="id")
    assert data.path_labels == (101, 202) and all(type(k) is int for k in data.path_labels)


def unit_warnings(tmp_path, **columns):
    """The return-unit warnings reading an npz whose return columns are `columns` ({name: [N, T]})."""
    returns = np.stack(list(columns.values()), axis=-1)
    path = tmp_path / "units.npz"
    np.savez(path, features=np.zeros(returns.shape[:2] + (1,)), returns=returns, feature_names=["f"],
             asset_names=list(columns))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read(path)
    return [str(w.message) for w in caught]


def test_return_unit_warnings_hold_at_their_thresholds(tmp_path):
    """The unit checks' thresholds against the series each is set for (`_warn_if_prices`): a decimal series is
    never called percent or prices, percent returns and prices at any scale are."""
    rng = np.random.default_rng(3)
    signs = rng.choice([-1, 1], (1, 120))
    # Decimal monthly returns of a volatile asset (median |r| ~0.1), and of an altcoin at 35% a month (~0.24, under
    # PERCENT_TYPICAL): no warning.
    assert unit_warnings(tmp_path, monthly=signs * rng.uniform(0.05, 0.15, (1, 120))) == []
    assert unit_warnings(tmp_path, altcoin=signs * rng.uniform(0.19, 0.29, (1, 120))) == []
    # Percent daily returns of a calm asset (median |r| ~0.5, i.e. 0.5%): percent.
    (message,) = unit_warnings(tmp_path, calm=signs * rng.uniform(0.3, 0.7, (1, 120)))
    assert "returns 'calm' looks like percent returns, not fractions" in message, message
    # Decimal daily returns of a meme coin, three +500% days among 60 (mean |r| ~0.28, median ~0.03): the median
    # is the typical size, so no warning.
    coin = signs[:, :60] * rng.uniform(0.01, 0.05, (1, 60))
    coin[0, [10, 30, 50]] = 5.0
    assert unit_warnings(tmp_path, coin=coin) == []
    # Zero returns (an illiquid asset's days without a trade, 70% of them) say nothing of the unit: percent returns
    # among them are still percent, decimal ones still decimal.
    idle = rng.uniform(0, 1, (1, 120)) < 0.7
    (message,) = unit_warnings(tmp_path, idle_pct=np.where(idle, 0.0, signs * rng.uniform(0.5, 2.0, (1, 120))))
    assert "returns 'idle_pct' looks like percent returns" in message, message
    assert unit_warnings(tmp_path, idle=np.where(idle, 0.0, signs * rng.uniform(0.005, 0.05, (1, 120)))) == []
    # A column almost all of one sign (an oil future's price, negative for a few days) is not percent returns,
    # whose signs are mixed (at least PERCENT_SIGNS on each side).
    oil = np.full((1, 120), 20.0) + rng.uniform(-1, 1, (1, 120))
    oil[0, 50:53] = -10.0
    assert not any("percent" in m for m in unit_warnings(tmp_path, oil=oil))
    # One step per path: no step to measure, so positive returns are not called prices.
    assert unit_warnings(tmp_path, one=rng.uniform(0.001, 0.03, (20, 1))) == []
    # Paths of two penny stocks (0.2 and 0.4), three in five calm: each moves by a small part of its level within
    # its path, so prices, though the jumps from one path to the next are large (steps are taken within a path).
    rows = np.arange(20)
    prices = (np.where(rows % 2 == 0, 0.2, 0.4)[:, None]
              + np.where(rows % 5 < 3, 0.002, 0.04)[:, None] * np.cumsum(rng.choice([-1, 1], (20, 3)), axis=1))
    (message,) = unit_warnings(tmp_path, penny=prices)
    assert "returns 'penny' looks like prices, not returns (every value > 0, median step" in message, message


@pytest.mark.parametrize("back, hinted", [("01:30", True), ("01:00", False)])
def test_a_naive_clock_back_at_most_an_hour_is_hinted_as_daylight_saving(tmp_path, back, hinted):
    """The daylight-saving hint is for a naive clock going back at most an hour (the repeated hour); further back
    is a file out of order, refused without it."""
    rows = [[f"2024-10-27T{t}", 0.1, 0.01] for t in ("02:00", "02:30", back)]
    path = write_csv(tmp_path / "back.csv", rows, ["datetime", "mom", "ret"])
    with pytest.raises(ValueError, match="goes back from 2024-10-27T02:30") as err:
        read(path, feature_cols=["mom"], return_cols=["ret"])
    assert ("daylight saving time ended" in str(err.value)) == hinted, str(err.value)


def test_integer_dates_are_checked_in_a_parquet_file_as_in_a_csv(tmp_path):
    """Dates written as integers yyyymmdd (20240102, as many databases store them) are ISO basic dates: a CSV's are
    checked for time order. A parquet integer column reads as floats (20240102.0), which used to read as 'not ISO
    dates' and switch the check off, so the same table newest first trained on time run backwards; now it is refused
    as the CSV is, and in time order it reads."""
    def rows(table):
        return [[int(row[0].replace("-", "")), *row[1:]] for row in table]

    check(read_table(write_parquet(tmp_path / "ok.parquet", rows(table_rows()))))
    for write, suffix in ((write_csv, "csv"), (write_parquet, "parquet")):
        with pytest.raises(ValueError, match=r"rows must be in time order \(oldest first\), but column 'date' goes "
                                             r"back from 20240106 to 20240105 at row 3\b"):
            read_table(write(tmp_path / f"newest.{suffix}", rows(table_rows()[::-1])))


@pytest.mark.parametrize("form", ["%m/%d/%Y", "%d/%m/%Y", "%d.%m.%Y", "%Y/%m/%d", "%d-%b-%Y", "%m/%d/%Y %H:%M"])
def test_dates_as_exports_write_them_are_checked_for_time_order(tmp_path, form):
    """Data sites and spreadsheets write dates month or day first (01/31/2024, 31.01.2024, 31-Jan-2024), often newest
    first: such a column used to be taken as it came, so a newest-first download trained on time run backwards. It is
    read as each of these forms that reads all its cells: newest first it is refused naming the cells as written, in
    time order it reads; 01/02 and 02/01 (either way round) read one of their two ways in order, and so are read."""
    days = [datetime.datetime(2024, 1, 28) + datetime.timedelta(days=d) for d in range(T)]  # across a month's end
    rows = [[days[t].strftime(form), *row[1:]] for t, row in enumerate(table_rows()[::2])]  # path 'x' alone

    check_x = read_table(write_csv(tmp_path / "ok.csv", rows), path_col=None)
    np.testing.assert_array_equal(check_x.features[0], FEATURES[0])
    with pytest.raises(ValueError, match=rf"column 'date' goes back from {re.escape(rows[-1][0])} to "
                                         rf"{re.escape(rows[-2][0])} at row 2\b.*must be reversed"):
        read_table(write_csv(tmp_path / "newest.csv", rows[::-1]), path_col=None)
    ambiguous = [[day, *row[1:]] for day, row in zip(("01/02/2024", "02/01/2024"), rows)]  # both orders read
    for order in (ambiguous, ambiguous[::-1]):
        assert read_table(write_csv(tmp_path / "two.csv", order), path_col=None).num_steps == 2


@pytest.mark.parametrize("suffix", [".csv", ".npz"])
def test_an_unshifted_return_column_beside_its_own_feature_draws_a_warning(tmp_path, suffix):
    """The look-ahead the module docstring warns about: a price file's return up to t (close[t] / close[t-1] - 1)
    given as the return column, unshifted, beside a feature holding that same day's return (here its log). Every
    score would then be paid a return the features already show; the pair's correlation (0.999) draws one warning
    naming both columns. Shifted up one row, as the convention asks, the same columns draw none."""
    rng = np.random.default_rng(2)
    close = 100 * np.cumprod(1 + rng.normal(0.0003, 0.01, 201))
    past = close[1:] / close[:-1] - 1  # [200] row t: the return up to t
    header = ["date", "mom_1", "vol", "ret"]
    days = [(datetime.date(2024, 1, 1) + datetime.timedelta(days=t)).isoformat() for t in range(200)]
    vol = rng.uniform(0.005, 0.02, 200)

    def write(name, ret, mom):
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".npz":
            np.savez(path, features=np.stack([mom, vol], -1)[None], returns=ret[None, :, None],
                     feature_names=["mom_1", "vol"], asset_names=["ret"])
        else:
            write_csv(path, [[d, m, v, r] for d, m, v, r in zip(days, mom, vol, ret)], header)
        return path

    kw = {} if suffix == ".npz" else {"feature_cols": ["mom_1", "vol"], "return_cols": ["ret"]}
    with pytest.warns(UserWarning) as caught:
        read(write("unshifted", past, np.log1p(past)), **kw)
    assert [str(w.message) for w in caught] == [
        f"unshifted{suffix}: the feature 'mom_1' has correlation 1.000 with the return 'ret' of the same row: a "
        "return column holds the return EARNED BY the position chosen at its row (the next period's); if it is the "
        "return up to the row (close[t] / close[t-1] - 1), shift it up one row, or every score looks ahead"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read(write("shifted", np.append(past[1:], 0.001), np.log1p(past)), **kw)  # the next day's return at t


def test_the_unnamed_index_column_pandas_writes_is_checked_for_time_order(tmp_path):
    """A table built in pandas on a DatetimeIndex without a name, saved with df.to_csv(), has its dates in a first
    column headed '' (the header row starts with a comma). That column was never checked, so such a file newest first
    trained on time run backwards; it is now checked as a 'date' column is."""
    header = ["", *HEADER[1:]]
    check(read_table(write_csv(tmp_path / "ok.csv", table_rows(), header)))
    with pytest.raises(ValueError, match=r"rows must be in time order \(oldest first\), but column '' goes back from "
                                         r"2024-01-06 to 2024-01-05 at row 3\b"):
        read_table(write_csv(tmp_path / "newest.csv", table_rows()[::-1], header))


def test_the_unnamed_index_pandas_writes_to_parquet_is_checked_for_time_order(tmp_path):
    """df.to_parquet() of a frame on a DatetimeIndex without a name stores its dates in a column named
    '__index_level_0__' (pyarrow's name for it): the same file newest first trained on time run backwards, where its
    CSV was refused. Written here as pandas writes it: the dates as parquet timestamps under that name."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")

    def write(path, rows):
        stamps = [datetime.datetime.fromisoformat(row[0]) for row in rows]
        columns = {h: [row[i] for row in rows] for i, h in enumerate(HEADER) if h != "date"}
        pq.write_table(pa.table({**columns, "__index_level_0__": pa.array(stamps, pa.timestamp("ns"))}), path)
        return path

    check(read_table(write(tmp_path / "ok.parquet", table_rows())))
    with pytest.raises(ValueError, match=r"newest\.parquet: rows must be in time order \(oldest first\), but column "
                                         r"'__index_level_0__' goes back from 2024-01-06 00:00:00 to 2024-01-05 "
                                         r"00:00:00 at row 3; a file written newest first must be reversed$"):
        read_table(write(tmp_path / "newest.parquet", table_rows()[::-1]))
    # a RangeIndex kept as a column (df.reset_index() then to_parquet keeps 'index'; pyarrow itself may store one as
    # __index_level_0__ of row numbers): no dates, nothing to check
    rows = table_rows()
    columns = {h: [row[i] for row in rows] for i, h in enumerate(HEADER)}
    numbers = list(range(len(rows)))[::-1]  # even counting down
    pq.write_table(pa.table({**columns, "__index_level_0__": numbers}), tmp_path / "numbered.parquet")
    check(read_table(tmp_path / "numbered.parquet"))


def test_a_repeated_date_is_refused_beside_the_row_numbers_pandas_writes(tmp_path):
    """df.to_csv() of a frame on the default RangeIndex writes a first column headed '' of row numbers 0, 1, ...
    Since '' was checked as a date column, it counted as the file's second one (a date beside a time of day), where a
    date may repeat, so the same bar twice in the 'date' column passed. Row numbers are no dates: a repeat is refused
    as in the same file without them, and a DatetimeIndex '' beside a 'date' column still allows it."""
    rows = table_rows()
    rows[2][0] = rows[0][0]  # path 'x' at t=1 repeats t=0
    numbered = [[i, *row] for i, row in enumerate(rows)]
    with pytest.raises(ValueError, match=r"column 'date', row 3 \(line 4\): 2024-01-01 repeats row 1 \(line 2\) in the "
                                         r"same path: a repeated bar"):
        read_table(write_csv(tmp_path / "numbered.csv", numbered, ["", *HEADER]))
    stamped = [[f"2024-01-01T{10 + i // 2}:00", *row] for i, row in enumerate(rows)]  # hourly bars: the date repeats
    check(read_table(write_csv(tmp_path / "stamped.csv", stamped, ["", *HEADER])))


def test_a_cash_return_beside_the_rate_it_is_paid_draws_no_look_ahead_warning(tmp_path):
    """A cash asset earns over the next period the rate known when the position is chosen: a feature holding that rate
    (a T-bill yield) moves with the cash return of its own row (correlation 1.000) without looking ahead, and used to
    draw the unshifted-return warning. Such a return is foretold as closely by its own previous row (lag-1
    autocorrelation ~1, which no market return has), so it is not checked; an unshifted stock return in the same file
    still is."""
    rng = np.random.default_rng(3)
    days = [(datetime.date(2024, 1, 1) + datetime.timedelta(days=t)).isoformat() for t in range(240)]
    rate = np.repeat([0.0525, 0.05, 0.0475], 80) + rng.normal(0, 1e-5, 240)  # [240] the annual yield, cut twice
    spx = rng.normal(0.0004, 0.01, 241)  # [241] daily returns
    header = ["date", "tbill", "spx_1d", "ret_spx", "ret_cash"]

    def read_with(ret_spx):
        rows = [[d, y, past, r, y / 252] for d, y, past, r in zip(days, rate, spx[:-1], ret_spx)]
        return read(write_csv(tmp_path / "cash.csv", rows, header), feature_cols=["tbill", "spx_1d"],
                    return_cols=["ret_*"])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_with(spx[1:])  # shifted: the next day's return at t
    with pytest.warns(UserWarning) as caught:
        read_with(spx[:-1])  # unshifted: spx_1d is ret_spx
    assert [str(w.message).split(":")[1] for w in caught] == [
        " the feature 'spx_1d' has correlation 1.000 with the return 'ret_spx' of the same row"]


def test_step_times_are_each_paths_steps_stamps(tmp_path):
    """MarketData.step_times [N, T] is each step's stamp, with the paths interleaved in the file and fill='drop'
    dropping another row in each."""
    rows = table_rows()
    rows[2][1], rows[9][3] = "", "nan"  # gaps in path 'x' at t=1 and path 'y' at t=4
    data = read_table(write_csv(tmp_path / "gaps.csv", rows), fill="drop")
    assert data.source_steps.tolist() == [[0, 2, 3, 4, 5], [0, 1, 2, 3, 5]]  # the gaps' rows dropped
    days = np.array([f"2024-01-0{t + 1}" for t in range(T)], "datetime64[us]")
    np.testing.assert_array_equal(data.step_times, days[data.source_steps])


def test_step_times_are_each_steps_stamp_of_the_first_date_column_in_utc(tmp_path):
    """`step_times` (what the time split and periods_per_year are checked by): each step's stamp in UTC where the file
    gives zones (09:30-05:00 is 14:30), of the file's first date column that reads one way (a second, a bar's close
    time, is only checked for order); the rows fill='drop' dropped are skipped and `time_slice` slices them with the
    steps. A date column left blank, or an export's date column with a blank cell, is not a column of dates to keep."""
    header = ["date", "timestamp", "mom", "ret_a"]
    days = [datetime.date(2024, 3, 4) + datetime.timedelta(days=t) for t in range(T)]
    rows = [[d.isoformat(), f"{d.isoformat()}T09:30-05:00", f, r] for d, f, r in zip(days, FEATURES[0, :, 0],
                                                                                     RETURNS[0, :, 0])]
    rows[2][2] = ""  # a missing feature: fill='drop' drops the row
    data = read(write_csv(tmp_path / "m.csv", rows, header), feature_cols=["mom"], return_cols=["ret_a"], fill="drop")
    kept = [d for t, d in enumerate(days) if t != 2]
    np.testing.assert_array_equal(data.step_times, np.array([kept], "datetime64[us]"))
    np.testing.assert_array_equal(data.time_slice(1, 3).step_times, np.array([kept[1:3]], "datetime64[us]"))
    zoned = read(write_csv(tmp_path / "z.csv", [row[1:] for row in rows], header[1:]), feature_cols=["mom"],
                 return_cols=["ret_a"], fill="drop")
    np.testing.assert_array_equal(zoned.step_times[0, :2], np.array(["2024-03-04T14:30", "2024-03-05T14:30"],
                                                                    "datetime64[us]"))
    blank = read(write_csv(tmp_path / "b.csv", [["", *row[2:]] for row in rows], ["date", "mom", "ret_a"]),
                 feature_cols=["mom"], return_cols=["ret_a"], fill="drop")
    assert blank.step_times is None and blank.num_steps == T - 1
    export = [[d.strftime("%d.%m.%Y"), *row[2:]] for d, row in zip(days, rows)]
    export[4][0] = ""
    with pytest.raises(ValueError, match=r"^e\.csv: column 'date', row 5 \(line 6\): date missing"):
        read(write_csv(tmp_path / "e.csv", export, ["date", "mom", "ret_a"]), feature_cols=["mom"],
             return_cols=["ret_a"], fill="drop")


def test_step_times_of_an_export_are_its_reading_in_time_order(tmp_path):
    """05/01/2024, 01/02/2024, ... read both ways as dates, but only day first in time order (month first, 1 May
    comes before 2 January): the steps' stamps are that reading's, 5 January, 1 February, ..."""
    days = [datetime.date(2024, m, d) for m, d in ((1, 5), (2, 1), (2, 3), (3, 2), (4, 1), (4, 9))]  # days <= 12
    rows = [[d.strftime("%d/%m/%Y"), *row[1:]] for d, row in zip(days, table_rows()[::2])]  # path 'x' alone
    assert rows[0][0] == "05/01/2024" and rows[1][0] == "01/02/2024"
    data = read_table(write_csv(tmp_path / "days.csv", rows), path_col=None)
    np.testing.assert_array_equal(data.step_times, np.array([days], "datetime64[us]"))

@pytest.mark.parametrize("per_second", [1, 1000, 10**6, 10**9], ids=["s", "ms", "us", "ns"])
def test_unix_times_are_dates_checked_for_time_order(tmp_path, per_second):
    """Exchanges' and crypto data's exports stamp bars in Unix time (Binance's open_time: milliseconds). Such a
    'timestamp' column was no date, so the file newest first trained on time run backwards without a word; now it is
    read as UTC times, in the unit its size gives, and checked."""
    days = [datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(days=t) for t in range(T)]
    stamps = [int(d.timestamp()) * per_second for d in days]
    rows = [[stamp, *row[1:]] for stamp, row in zip(stamps, table_rows()[::2])]  # path 'x' alone
    header = ["timestamp", *HEADER[1:]]
    data = read_table(write_csv(tmp_path / "bars.csv", rows, header), path_col=None)
    np.testing.assert_array_equal(data.step_times, np.array([[d.replace(tzinfo=None) for d in days]],
                                                            "datetime64[us]"))
    with pytest.raises(ValueError, match=rf"rows must be in time order \(oldest first\), but column 'timestamp' goes "
                                         rf"back from {stamps[-1]} to {stamps[-2]} at row 2 \(line 3\)"):
        read_table(write_csv(tmp_path / "newest.csv", rows[::-1], header), path_col=None)
    with pytest.raises(ValueError, match=r"column 'timestamp' goes back"):  # a parquet integer column alike
        read_table(write_parquet(tmp_path / "newest.parquet", rows[::-1], header), path_col=None)


def test_numbers_of_no_one_unix_unit_are_no_dates(tmp_path):
    """Below 1e9 a number is no Unix time (20240102 is an ISO date, 930 a time of day), nor is a column mixing
    seconds and milliseconds: such a column is taken as it comes, as before."""
    rows = [[stamp, *row[1:]] for stamp, row in zip([1_700_000_000_000, 1_600_000_000, 1_700_000_000_000, 930,
                                                     1_600_000_000, 5][:T], table_rows()[::2])]
    read_table(write_csv(tmp_path / "mixed.csv", rows, ["timestamp", *HEADER[1:]]), path_col=None)


@pytest.mark.parametrize("form", ["%Y%m%d%H%M%S", "%Y%m%d%H%M"])
def test_compact_date_and_time_numbers_are_no_unix_times(tmp_path, form):
    """An export's date and time of day as one number (20240102153000, MetaTrader's and many vendors') is as large
    as a Unix time in milliseconds: it was read as one (the year 2611, a day 1000 s long), so the stamps, and the
    bars a year told from them, were wrong. Now it reads as the date and time it spells, text or parquet integer."""
    days = [datetime.datetime(2024, 1, 1, 15, 30) + datetime.timedelta(days=t) for t in range(T)]
    rows = [[int(d.strftime(form)), *row[1:]] for d, row in zip(days, table_rows()[::2])]  # path 'x' alone
    header = ["timestamp", *HEADER[1:]]
    for file in (write_csv(tmp_path / "bars.csv", rows, header), write_parquet(tmp_path / "bars.parquet", rows, header)):
        data = read_table(file, path_col=None)
        np.testing.assert_array_equal(data.step_times, np.array([days], "datetime64[us]"))
    with pytest.raises(ValueError, match=r"column 'timestamp' goes back"):
        read_table(write_csv(tmp_path / "newest.csv", rows[::-1], header), path_col=None)


def test_bars_per_year_averages_the_paths_spans_from_rate_rows_steps():
    """Rows a year: steps per path over the paths' mean span. From `RATE_ROWS` steps per path; with fewer a rate
    says little (None)."""
    steps = market_data.RATE_ROWS
    start = np.datetime64("2020-01-01T00:00", "us")
    # one path daily, the other every other day: spans of T-1 and 2 (T-1) days, 1.5 (T-1) on average
    times = np.stack([start + np.arange(steps) * np.timedelta64(k, "D") for k in (1, 2)])
    zeros = np.zeros((2, steps, 1))
    data = MarketData(zeros, zeros, ("f",), ("r",), step_times=times)
    assert data.bars_per_year == pytest.approx(365.25 / 1.5, rel=1e-12)
    assert data.time_slice(0, steps - 1).bars_per_year is None
    assert MarketData(zeros, zeros, ("f",), ("r",)).bars_per_year is None


def test_check_split_compares_each_period_with_the_next_and_skips_an_empty_one():
    """A path whose validation period runs past another path's test start (here: rows dropped in one path, so its
    steps fall on later days) is refused as a training period running past validation is; an empty validation period
    (valid_fraction 0) is skipped, training then compared with test."""
    days = np.datetime64("2024-01-01", "us") + np.arange(12) * np.timedelta64(1, "D")
    gappy = days[[0, 1, 2, 3, 4, 5, 8, 9, 10, 11]]  # path 'B' lacks 01-07 and 01-08
    zeros = np.zeros((2, 10, 1))
    data = MarketData(zeros, zeros, ("f",), ("r",), path_labels=("A", "B"), step_times=np.stack([days[:10], gappy]))
    with pytest.raises(ValueError, match=r"^path_col: the validation period of path 'B' runs to 2024-01-09, after the "
                                         r"test period of path 'A' begins \(2024-01-08\)"):
        market_data.check_split(data, 4, 7)
    market_data.check_split(data, 4, 4)  # training ends 01-04 in both, test begins 01-05 or later
    with pytest.raises(ValueError, match=r"^path_col: the training period of path 'B' runs to 2024-01-09, after the "
                                         r"test period of path 'A' begins \(2024-01-08\)"):
        market_data.check_split(data, 7, 7)


def test_the_look_ahead_check_is_of_a_correlation_in_size_over_every_paths_rows(tmp_path):
    """A feature that is its row's return negated, or its gross return 1 + r (no mean of 0), correlates with it
    fully: each draws the warning. The rows counted are every path's (4 paths of 5: LOOK_AHEAD_ROWS = 20 rows);
    19 rows draw none."""
    rng = np.random.default_rng(3)
    ret = 0.01 * rng.normal(size=(4, market_data.LOOK_AHEAD_ROWS // 4, 1))
    names = {"feature_names": ["x"], "asset_names": ["ret"]}
    for feature, shown in ((-ret, "-1.000"), (1 + ret, "1.000")):
        np.savez(tmp_path / "m.npz", features=feature, returns=ret, **names)
        with pytest.warns(UserWarning, match=rf"^m\.npz: the feature 'x' has correlation {shown} with the return "):
            read(tmp_path / "m.npz")
    few = ret.reshape(1, -1, 1)[:, 1:]  # one path of 19 rows
    np.savez(tmp_path / "few.npz", features=few, returns=few, **names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read(tmp_path / "few.npz")
