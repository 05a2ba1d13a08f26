"""Metric segments as Parquet (async_tracker.backend.fsspec.parquet): what is written reads back
exactly and in write order, anything else is refused with one SegmentError, compaction
keeps every row, and DuckDB, Polars and pandas read the files in place."""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_tracker.backend.fsspec.parquet import (
    FORMAT_KEY,
    FORMAT_VERSION,
    METRIC_SCHEMA,
    OPTIONAL_COLUMNS,
    Columns,
    SegmentError,
    compact,
    decode_segment,
    encode_segment,
)

RUN, WRITER = "local://parquet/run", "0123abcd"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Points = tuple[Sequence[int], Sequence[float], Sequence[float]]


def bits(values: Sequence[float] | np.ndarray) -> list[int]:
    """Each float's bits: NaN (whatever its payload), -0.0 and infinities compared exactly."""
    return np.asarray(values, dtype=np.float64).view(np.uint64).tolist()  # type: ignore[no-any-return]


def assert_round_trip(columns: Mapping[str, Points], first_seq: int = 0) -> dict[str, Columns]:
    got, skipped = decode_segment(encode_segment(RUN, WRITER, first_seq, columns))
    assert skipped == ""
    expected = {name: pts for name, pts in columns.items() if len(pts[0])}
    assert list(got) == list(expected)
    seq = first_seq
    for name, (steps, values, times) in expected.items():
        col = got[name]
        assert col.steps.dtype == np.int64 and col.seqs is not None and col.times is not None
        assert col.steps.tolist() == list(steps)
        assert bits(col.values) == bits(values)
        assert bits(col.times) == bits(times)
        assert col.writers is not None and set(col.writers.tolist()) == {WRITER}
        assert col.seqs.tolist() == list(range(seq, seq + len(steps)))
        seq += len(steps)
    return got


def table_bytes(table: pa.Table, **options: object) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def rows_of(table: pa.Table) -> dict[str, list[object]]:
    """``table``'s columns as lists, floats as their bits (NaN equals NaN)."""
    return {
        name: bits(column.to_numpy()) if pa.types.is_floating(column.type) else column.to_pylist()
        for name, column in zip(table.column_names, table.columns)
    }


def our_table(n: int = 3) -> dict[str, pa.Array]:
    """Columns of a valid file, as plain Arrow arrays, for foreign files to vary."""
    return {
        "run": pa.array([RUN] * n),
        "name": pa.array(["loss"] * n),
        "step": pa.array(range(n), pa.int64()),
        "value": pa.array([0.5] * n, pa.float64()),
        "time": pa.array([1.0] * n, pa.float64()),
        "writer": pa.array([WRITER] * n),
        "seq": pa.array(range(n), pa.int64()),
    }


# -- round trips ----------------------------------------------------------------------------------


def test_special_values_round_trip_exactly() -> None:
    nan, inf = float("nan"), float("inf")
    assert_round_trip(
        {"loss": ((0, 1, 2, 3, 4), (nan, inf, -inf, -0.0, 0.0), (1.0, 2.0, 3.0, 4.0, 5.0))}
    )


def test_steps_across_int64_and_exact_times() -> None:
    steps = (INT64_MIN, -1, 0, 2**53 + 1, INT64_MAX)
    times = (1_790_000_000.123456789, 0.0, -1.5, 1e-300, 5e-324)
    assert_round_trip({"s": (steps, (1.0,) * 5, times)}, first_seq=INT64_MAX - 5)


def test_many_names_in_mapping_order_and_unicode() -> None:
    names = [f"m{i:03}" for i in range(299, -1, -1)] + [
        "损失/训练",
        "αβγ",
        "🚀 loss",
        "e\u0301",
        " ",
    ]
    columns = {
        name: ((i, i + 1), (float(i), -float(i)), (1.0, 2.0)) for i, name in enumerate(names)
    }
    assert list(assert_round_trip(columns)) == names


def test_one_point() -> None:
    assert_round_trip({"x": ((7,), (0.25,), (3.0,))})


def test_empty_input_is_a_valid_empty_file() -> None:
    data = encode_segment(RUN, WRITER, 0, {})
    assert decode_segment(data) == ({}, "")
    assert pq.read_table(pa.BufferReader(data)).num_rows == 0
    # A name with no points has no rows.
    assert decode_segment(encode_segment(RUN, WRITER, 0, {"a": ((), (), ())})) == ({}, "")


def test_write_order_is_kept_and_seq_numbers_rows_in_order() -> None:
    columns = {
        "b": ((5, 3, 9, 3), (1.0, 2.0, 3.0, 4.0), (4.0, 3.0, 2.0, 1.0)),
        "a": ((1,), (0.0,), (0.0,)),
    }
    got = assert_round_trip(columns, first_seq=100)
    assert list(got) == ["b", "a"]
    table = pq.read_table(pa.BufferReader(encode_segment(RUN, WRITER, 100, columns)))
    assert table.column("name").to_pylist() == ["b"] * 4 + ["a"]
    assert table.column("seq").to_pylist() == [100, 101, 102, 103, 104]
    assert table.column("run").to_pylist() == [RUN] * 5


def test_accepts_what_the_backend_groups() -> None:
    """Tuples of Python ints and floats, ints among values and times included."""
    assert_round_trip({"x": ((0, 1), (1, 2.5), (3, 4.0)), "y": ([2], [True], [7])})
    # An int a double does not hold exactly is rounded, as float() does at the call site.
    got = assert_round_trip({"z": ((0, 1), (2**53 + 1, 2**70), (2**63, 1.0))})
    assert got["z"].values.tolist() == [float(2**53 + 1), float(2**70)]


def test_numpy_arrays_are_taken_as_they_are() -> None:
    steps = np.array([3, 1, 2], dtype=np.int32)
    values = np.array([np.nan, -0.0, np.inf])
    got = assert_round_trip({"a": (steps, values, np.arange(3.0)), "b": ([1], [2.0], [3.0])})
    assert got["a"].steps.tolist() == [3, 1, 2]
    mixed = {"a": (np.array([1, 2], np.uint64), np.array([1, 2], np.int64), [1.0, 2.0])}
    assert decode_segment(encode_segment(RUN, WRITER, 0, mixed))[0]["a"].values.tolist() == [1, 2]
    too_big = {"a": (np.array([2**64 - 1], np.uint64), [1.0], [1.0])}
    with pytest.raises(ValueError, match="metric 'a': a step does not fit in int64"):
        encode_segment(RUN, WRITER, 0, too_big)
    with pytest.raises(ValueError, match="metric 'a': steps of dtype float64 are not integers"):
        encode_segment(RUN, WRITER, 0, {"a": (np.array([1.5]), [1.0], [1.0])})
    with pytest.raises(ValueError, match="metric 'a': values of dtype <U1 are not numbers"):
        encode_segment(RUN, WRITER, 0, {"a": ([1], np.array(["x"]), [1.0])})


@settings(max_examples=200, deadline=None)
@given(
    columns=st.dictionaries(
        st.text(max_size=20),
        st.integers(0, 20).flatmap(
            lambda n: st.tuples(
                st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=n, max_size=n),
                st.lists(st.floats(width=64), min_size=n, max_size=n),
                st.lists(st.floats(width=64), min_size=n, max_size=n),
            )
        ),
        max_size=8,
    ),
    first_seq=st.integers(-(2**62), 2**62),
)
def test_round_trip_property(columns: dict[str, Points], first_seq: int) -> None:
    assert_round_trip(columns, first_seq)


# -- the file as other tools see it -------------------------------------------------------------


def test_schema_metadata_and_encodings() -> None:
    data = encode_segment(
        RUN, WRITER, 0, {"a": ((0, 1), (1.0, 2.0), (1.0, 2.0)), "b": ((0,), (1.0,), (1.0,))}
    )
    file = pq.ParquetFile(pa.BufferReader(data))
    assert file.schema_arrow.equals(METRIC_SCHEMA, check_metadata=True)
    assert file.metadata.metadata[FORMAT_KEY.encode()] == FORMAT_VERSION.encode()
    group = file.metadata.row_group(0)
    for i, name in enumerate(METRIC_SCHEMA.names):
        chunk = group.column(i)
        assert chunk.compression == "SNAPPY"
        if name in ("name", "step", "time"):  # what readers filter on
            assert chunk.statistics is not None and chunk.statistics.has_min_max
        if name in ("run", "name", "writer"):
            assert chunk.has_dictionary_page, name


def test_step_beyond_int64_names_the_metric() -> None:
    for step in (2**63, INT64_MIN - 1, 10**30):
        with pytest.raises(ValueError, match="metric 'bad': a step does not fit in int64"):
            encode_segment(
                RUN,
                WRITER,
                0,
                {"ok": ((1,), (1.0,), (1.0,)), "bad": ((0, step), (1.0, 2.0), (1.0, 2.0))},
            )


def test_refuses_what_it_cannot_store() -> None:
    with pytest.raises(ValueError, match="metric 'x': its columns differ in length"):
        encode_segment(RUN, WRITER, 0, {"x": ((1, 2), (1.0,), (1.0,))})
    with pytest.raises(ValueError, match="metric 'x': a value is None"):
        encode_segment(RUN, WRITER, 0, {"x": ((1,), (None,), (1.0,))})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="metric 'y': a time is not a number"):
        encode_segment(RUN, WRITER, 0, {"y": ((1,), (1.0,), ("soon",))})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="metric 'y': a value is not a number"):
        encode_segment(RUN, WRITER, 0, {"y": ((1,), (10**400,), (1.0,))})
    with pytest.raises(ValueError, match="metric 'z': a step is not an integer"):
        encode_segment(RUN, WRITER, 0, {"z": ((None,), (1.0,), (1.0,))})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="not valid UTF-8"):
        encode_segment(RUN, WRITER, 0, {"\ud800": ((1,), (1.0,), (1.0,))})
    with pytest.raises(ValueError, match="run id"):
        encode_segment("r\udcff", WRITER, 0, {"x": ((1,), (1.0,), (1.0,))})
    with pytest.raises(ValueError, match="seq"):
        encode_segment(RUN, WRITER, INT64_MAX, {"x": ((1, 2), (1.0, 1.0), (1.0, 1.0))})


# -- reading: only some, and refusing what is not ours ---------------------------------------


def test_reads_some_names_and_columns() -> None:
    columns = {n: ((0, 1), (float(i), 1.0), (2.0, 3.0)) for i, n in enumerate("abcd")}
    data = compact(
        [encode_segment(RUN, WRITER, 10 * k, columns) for k in range(3)], row_group_rows=5
    )
    got, skipped = decode_segment(data, names=["c", "zz"], columns=())
    assert skipped == "" and list(got) == ["c"]
    c = got["c"]
    assert isinstance(c, Columns)
    assert c.steps.tolist() == [0, 1] * 3 and c.values.tolist() == [2.0, 1.0] * 3
    assert c.times is None and c.writers is None and c.seqs is None
    got, _ = decode_segment(data, names={"a", "d"}, columns=("seq",))
    assert list(got) == ["a", "d"]
    seqs = got["d"].seqs
    assert seqs is not None and seqs.tolist() == [6, 7, 16, 17, 26, 27]
    assert got["d"].times is None
    assert decode_segment(data, names=[]) == ({}, "")
    with pytest.raises(ValueError, match="columns"):
        decode_segment(data, columns=("value",))
    with pytest.raises(TypeError, match="names"):
        decode_segment(data, names="loss")


def test_garbage_truncated_and_json_bytes_raise_segment_error() -> None:
    data = encode_segment(RUN, WRITER, 0, {"loss": ((0, 1), (0.5, 0.25), (1.0, 2.0))})
    json_line = b'{"name": "loss", "step": [0], "value": [1.0], "time": [1.0]}\n'
    for bad in (
        b"",
        b"PAR1",
        b"garbage" * 100,
        json_line,
        data[:-1],
        data[: len(data) // 2],
        data[4:],
        b"PAR1" + data[8:],
    ):
        with pytest.raises(SegmentError) as info:
            decode_segment(bad)
        assert str(info.value) and "\n" not in str(info.value)


def test_corrupt_bytes_never_raise_anything_else() -> None:
    data = encode_segment(
        RUN,
        WRITER,
        0,
        {"loss": (tuple(range(20)), (0.5,) * 20, (1.0,) * 20), "x": ((1,), (2.0,), (3.0,))},
    )
    for i in range(0, len(data), 3):
        for byte in (0x00, 0xFF, data[i] ^ 0x01):
            corrupt = data[:i] + bytes([byte]) + data[i + 1 :]
            try:
                decode_segment(corrupt)
            except SegmentError as exc:
                assert "\n" not in str(exc)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda t: t.pop("seq"), "no column seq"),
        (lambda t: [t.pop("run"), t.pop("writer")], "no column run, writer"),
        (lambda t: t.update(step=pa.array(["0", "1", "2"])), "column step is string"),
        (lambda t: t.update(value=pa.array([1, 2, 3])), "column value is int64"),
        (
            lambda t: t.update(time=pa.array([1, 2, 3], pa.timestamp("s"))),
            "column time is timestamp",
        ),
        (lambda t: t.update(name=pa.array([1, 2, 3])), "column name is int64"),
    ],
)
def test_foreign_schema_raises_segment_error(change: object, reason: str) -> None:
    columns = our_table()
    change(columns)  # type: ignore[operator]
    with pytest.raises(SegmentError, match=reason):
        decode_segment(table_bytes(pa.table(columns)))
    with pytest.raises(SegmentError, match=f"segment 1: .*{reason}"):
        compact([encode_segment(RUN, WRITER, 0, {}), table_bytes(pa.table(columns))])


def test_another_major_version_is_refused_a_minor_one_read() -> None:
    for version, ok in (("metrics/2", False), ("metrics/1.1", True), ("metrics/10", False)):
        table = pa.table(our_table()).replace_schema_metadata({FORMAT_KEY: version})
        if ok:
            assert list(decode_segment(table_bytes(table))[0]) == ["loss"]
        else:
            with pytest.raises(SegmentError, match="format"):
                decode_segment(table_bytes(table))


def test_compatible_foreign_file_is_read_and_nulls_skipped() -> None:
    """Another tool's file: narrower numbers, large strings, dictionary-less, extra columns,
    a nullable column with a null (its row is skipped and said so)."""
    table = pa.table(
        {
            "extra": pa.array([1, 2, 3]),
            "seq": pa.array([0, 1, 2], pa.uint32()),
            "writer": pa.array(["w", "w", "w"], pa.large_string()),
            "time": pa.array([1.0, 2.0, 3.0], pa.float32()),
            "value": pa.array([0.5, None, 1.5], pa.float64()),
            "step": pa.array([1, 2, 3], pa.int32()),
            "name": pa.array(["a", "a", "b"], pa.large_string()),
            "run": pa.array(["r"] * 3),
        }
    )
    got, skipped = decode_segment(table_bytes(table, use_dictionary=False))
    assert skipped == "1 rows with a null value"
    assert list(got) == ["a", "b"]
    assert got["a"].steps.tolist() == [1] and got["a"].steps.dtype == np.int64
    assert got["b"].values.tolist() == [1.5] and got["b"].times is not None
    assert got["b"].times.dtype == np.float64
    with pytest.raises(SegmentError, match="segment 0: nulls in value"):
        compact([table_bytes(table)])


def test_uint64_beyond_int64_is_refused() -> None:
    columns = our_table()
    columns["step"] = pa.array([0, 1, 2**64 - 1], pa.uint64())
    with pytest.raises(SegmentError, match="column step"):
        decode_segment(table_bytes(pa.table(columns)))


# -- compaction ----------------------------------------------------------------------------------


def segments() -> list[bytes]:
    """Three flushes of two writers: names in different orders, one empty flush."""
    return [
        encode_segment(
            RUN, "w1", 0, {"loss": ((0, 1), (1.0, 0.9), (1.0, 2.0)), "acc": ((0,), (0.1,), (1.0,))}
        ),
        encode_segment(
            RUN,
            "w2",
            0,
            {"acc": ((5,), (0.5,), (5.0,)), "loss": ((5, 6), (0.5, float("nan")), (5.0, 6.0))},
        ),
        encode_segment(RUN, "w1", 3, {}),
        encode_segment(
            RUN, "w1", 3, {"lr": ((2,), (1e-3,), (3.0,)), "loss": ((2,), (0.8,), (3.0,))}
        ),
    ]


@pytest.mark.parametrize("rows", [1, 3, 1 << 20])
def test_compact_equals_the_concatenation(rows: int) -> None:
    parts = segments()
    data = compact(parts, row_group_rows=rows)
    expected = pa.concat_tables(pq.read_table(pa.BufferReader(p)) for p in parts)
    assert rows_of(pq.read_table(pa.BufferReader(data))) == rows_of(expected)
    file = pq.ParquetFile(pa.BufferReader(data))
    assert file.schema_arrow.equals(METRIC_SCHEMA, check_metadata=True)
    sizes = [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)]
    assert sum(sizes) == 8 and all(s == rows for s in sizes[:-1]) and sizes[-1] <= rows
    got, skipped = decode_segment(data)
    assert skipped == "" and list(got) == ["loss", "acc", "lr"]
    loss = got["loss"]
    assert loss.steps.tolist() == [0, 1, 5, 6, 2]
    assert bits(loss.values) == bits([1.0, 0.9, 0.5, float("nan"), 0.8])
    assert loss.writers is not None and loss.writers.tolist() == ["w1", "w1", "w2", "w2", "w1"]
    assert loss.seqs is not None and loss.seqs.tolist() == [0, 1, 1, 2, 4]
    # Compacting compacted files changes nothing.
    again = compact([data, compact([])])
    assert rows_of(pq.read_table(pa.BufferReader(again))) == rows_of(expected)


def test_compact_of_nothing_is_an_empty_file() -> None:
    assert decode_segment(compact([])) == ({}, "")


# -- read in place by data tools -------------------------------------------------------------


def write_store(root: Path) -> dict[tuple[str, str], float]:
    """Two runs' metrics folders, each with a few segments (one compacted), as the backend
    lays them out; the last value (by step, then seq) of each (run, name)."""
    last: dict[tuple[str, str], float] = {}
    for r, run in enumerate(("run-a", "run-b")):
        folder = root / f"RUN{r}" / "metrics"
        folder.mkdir(parents=True)
        files = []
        for k in range(3):
            steps = tuple(range(10 * k, 10 * k + 10))
            columns = {
                "loss": (
                    steps,
                    tuple(1.0 / (s + 1) + r for s in steps),
                    tuple(float(s) for s in steps),
                ),
                "acc": (steps[:5], (float("nan"), *(float(s) for s in steps[1:5])), (1.0,) * 5),
            }
            files.append(encode_segment(run, f"writer-{r}", 100 * k, columns))
        last[(run, "loss")] = 1.0 / 30 + r
        last[(run, "acc")] = 24.0
        for name, data in (("000-a", compact(files[:2])), ("002-c", files[2])):
            digest = hashlib.sha1(data).hexdigest()[:12]
            (folder / f"{name}-{digest}.parquet").write_bytes(data)
    return last


def test_duckdb_reads_the_files_in_place(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    expected = write_store(tmp_path)
    files = f"read_parquet('{tmp_path}/*/metrics/*.parquet')"
    with duckdb.connect() as con:
        rows = con.execute(
            f"""
            SELECT run, name, value FROM {files}
            QUALIFY row_number() OVER (PARTITION BY run, name ORDER BY step DESC, seq DESC) = 1
            """
        ).fetchall()
        assert {(run, name): value for run, name, value in rows} == expected
        stats = con.execute(
            f"SELECT count(*) FILTER (WHERE isnan(value)), max(step), count(*) FROM {files} "
            "WHERE name = 'acc'"
        ).fetchall()
        assert stats == [(6, 24, 30)]
        types = {
            row[0]: row[1] for row in con.execute(f"DESCRIBE SELECT * FROM {files}").fetchall()
        }
        assert types == {
            "run": "VARCHAR", "name": "VARCHAR", "step": "BIGINT", "value": "DOUBLE",
            "time": "DOUBLE", "writer": "VARCHAR", "seq": "BIGINT",
        }  # fmt: skip


def test_polars_reads_the_files_in_place(tmp_path: Path) -> None:
    pl = pytest.importorskip("polars")
    expected = write_store(tmp_path)
    frame = (
        pl.scan_parquet(str(tmp_path / "*" / "metrics" / "*.parquet"))
        .sort(["run", "name", "step", "seq"])
        .group_by(["run", "name"])
        .agg(pl.col("value").last())
        .collect()
    )
    assert {
        (row["run"], row["name"]): row["value"] for row in frame.iter_rows(named=True)
    } == expected
    schema = pl.scan_parquet(str(tmp_path / "*" / "metrics" / "*.parquet")).collect_schema()
    assert (
        schema["step"] == pl.Int64 and schema["value"] == pl.Float64 and schema["name"] == pl.String
    )


@pytest.mark.server  # pandas is the dataframe extra, not in [test]
def test_pandas_reads_the_files_in_place(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    expected = write_store(tmp_path)
    frame = pd.concat(
        [pd.read_parquet(path) for path in sorted(tmp_path.glob("*/metrics/*.parquet"))],
        ignore_index=True,
    )
    assert list(frame.columns) == METRIC_SCHEMA.names
    assert str(frame["step"].dtype) == "int64" and str(frame["value"].dtype) == "float64"
    assert not isinstance(frame["name"].dtype, pd.CategoricalDtype)
    last = frame.sort_values(["step", "seq"]).groupby(["run", "name"])["value"].last()
    got = {key: value for key, value in last.items()}
    # pandas' last() skips NaN: acc's last value is not NaN here, so it agrees.
    assert got == expected
    assert math.isnan(frame[frame["name"] == "acc"]["value"].iloc[0])


def test_optional_columns_are_named() -> None:
    assert OPTIONAL_COLUMNS == ("time", "writer", "seq")
    assert struct.calcsize("<q") == 8  # seq and step are int64 on every platform
