"""Metric segments as Apache Parquet: the schema, and the codec the fsspec backend writes with.

A store's metrics are plain Parquet files (``metrics/*.parquet`` in each run's directory)
that DuckDB, Polars, pandas and Spark read in place, without us::

    SELECT name, max_by(value, step) AS last
    FROM read_parquet('<root>/*/metrics/*.parquet') GROUP BY run, name

The schema (:data:`METRIC_SCHEMA`) is stable: a column is never renamed, retyped or given
another meaning; a later version may add columns and says so in the format key. One row per
point:

==========  =======  ========================================================================
column      type     meaning
==========  =======  ========================================================================
``run``     string   the run id (the directory holds it base32-encoded; the file spells it)
``name``    string   the metric name
``step``    int64    the step the caller gave
``value``   double   the value, as a float; NaN and infinities are stored as such
``time``    double   seconds since the epoch: exactly the float the caller logged
``writer``  string   who wrote it: a token unique across processes and hosts (the fsspec
                     store's: the run's pipeline in the writing process, a suffix per split
                     for a part of a batch the lane split; the process, for a direct call)
``seq``     int64    the point's number in its writer's order (see :func:`encode_segment`)
==========  =======  ========================================================================

No column holds nulls (Parquet ``required``). The file's key-value metadata holds
``async_tracker.format = metrics/1`` (:data:`FORMAT_KEY`, :data:`FORMAT_VERSION`); a file
without the key whose columns match is read too (one a user wrote with DuckDB, say). Rows are
in write order: a name's points in call order, names one after another within a segment,
segments one after another in a compacted file. A reader that wants one curve in order sorts
its rows by ``(step, seq)``; ``(writer, seq)`` identifies a point, so a reader that may see a
point twice (a compaction's output next to inputs not yet removed) keeps one of each.

Encodings, chosen for the write, which runs on the tracker's worker thread at every flush:
the strings are dictionary-encoded (a segment's ``run`` and ``writer`` hold one value each,
``name`` a handful); ``step`` and ``seq`` are DELTA_BINARY_PACKED (steps mostly count up by
one: a few bits a point) and ``value`` and ``time`` BYTE_STREAM_SPLIT (the bytes of floats
that change slowly, such as a time, then compress), and pages are compressed with snappy.
Measured here (pyarrow 25, 2 shared CPUs; write CPU per point of a whole ``encode_segment``,
file size per point; 4 metrics per step): a flush of 10,000 steps, snappy 95 ns 7.2 B, lz4
88 ns 6.3 B, zstd 106 ns 6.2 B, none 93 ns 16 B; a flush of 100 steps (where a file's fixed
cost dominates), snappy 0.73 us, lz4 0.73 us, zstd 1.34 us, none 0.71 us; reading 10M
steps and values back, snappy 0.11 s, lz4 0.08 s, zstd 0.13 s, none 0.17 s. With these
encodings the codecs differ little in size; zstd costs the most CPU (twice the others on a
small flush), and lz4 (LZ4_RAW), though a little faster, is not read by Spark before 3.4
(parquet-mr 1.13) nor by older tools: snappy is Parquet's default, which every reader has.
All three encodings are in Parquet's format since 2.x and read by DuckDB, Polars, pandas
(pyarrow) and Spark 3.3+.

The Arrow schema is not stored in the file (``store_schema=False``): every reader sees the
Parquet types above (strings as UTF-8 ``BYTE_ARRAY``), not Arrow's dictionary types, so pandas
gives ``str`` columns rather than categories.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from async_tracker.store.downsample import MAX_WIDTH, min_max


def release_memory() -> None:
    """Hands back to the system what Arrow's memory pool keeps after a read (the pages
    decompressed on the way): a long-lived reader (the dashboard) would otherwise hold about
    as much again as the columns it keeps. Called on the thread that read: the default pool
    (mimalloc) keeps a heap per thread, and a call from another thread frees none of it."""
    pa.default_memory_pool().release_unused()


__all__ = [
    "COMPACT_ROW_GROUP_ROWS",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "METRIC_SCHEMA",
    "OPTIONAL_COLUMNS",
    "OVERVIEW_MIN_ROWS",
    "SUFFIX",
    "Columns",
    "SegmentError",
    "compact",
    "decode_segment",
    "encode_segment",
    "overview",
    "release_memory",
    "row_columns",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
ObjectArray = npt.NDArray[np.object_]
# One metric's steps, values and times: Python numbers (as the ingress holds them), or numpy
# arrays (taken as they are: no work per point in Python at all).
_Points = tuple[
    Sequence[int] | npt.NDArray[Any],
    Sequence[float] | npt.NDArray[Any],
    Sequence[float] | npt.NDArray[Any],
]
# One metric's steps, values and times as numpy arrays (see row_columns).
ArrayPoints = tuple[IntArray, FloatArray, FloatArray]
# The most names per step that row_columns looks for (as the JSON codec's grouping does).
MAX_STRIDE: Final = 256
_NAME = operator.itemgetter(0)

FORMAT_KEY: Final = "async_tracker.format"
# "metrics/<major>": a reader of metrics/1 reads any metrics/1 file (later ones may add
# columns); another major is refused.
FORMAT_VERSION: Final = "metrics/1"
SUFFIX: Final = ".parquet"
# Row groups of a compacted file: big enough that a reader's per-group costs vanish, small
# enough that a reader of one metric skips groups by their name statistics.
COMPACT_ROW_GROUP_ROWS: Final = 1 << 20

STRING_COLUMNS: Final = ("run", "name", "writer")
INT_COLUMNS: Final = ("step", "seq")
FLOAT_COLUMNS: Final = ("value", "time")

METRIC_SCHEMA: Final = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("time", pa.float64(), nullable=False),
        pa.field("writer", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
    ],
    metadata={FORMAT_KEY: FORMAT_VERSION},
)
COLUMN_NAMES: Final = tuple(METRIC_SCHEMA.names)

# What is written: the strings as dictionary arrays (indices into a few values, made without
# a Python object per point); the file holds them as the strings of METRIC_SCHEMA.
_DICT = pa.dictionary(pa.int32(), pa.string())
_WRITE_SCHEMA: Final = pa.schema(
    [
        pa.field(f.name, _DICT if f.name in STRING_COLUMNS else f.type, nullable=False)
        for f in METRIC_SCHEMA
    ],
    metadata=METRIC_SCHEMA.metadata,
)
# See the module's docstring for why these.
_WRITE_OPTIONS: Final[dict[str, Any]] = {
    "compression": "snappy",
    "use_dictionary": list(STRING_COLUMNS),
    "column_encoding": {
        "step": "DELTA_BINARY_PACKED",
        "seq": "DELTA_BINARY_PACKED",
        "value": "BYTE_STREAM_SPLIT",
        "time": "BYTE_STREAM_SPLIT",
    },
    "store_schema": False,
    # Statistics (each group's min and max) of the columns readers filter on: a metric's name,
    # a range of steps or times. Those of the others cost a fifth of the write, for filters
    # nobody writes (by value), or that the file's path answers (run, writer).
    "write_statistics": ["name", "step", "time"],
}
# The columns a reader may leave out (decode_segment's columns=); name, step, value are read.
OPTIONAL_COLUMNS: Final = ("time", "writer", "seq")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# What pyarrow raises for bytes it cannot read (ArrowInvalid and ArrowIOError are among them:
# pyarrow's errors subclass both ArrowException and the builtin they resemble).
_ARROW_ERRORS = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError)


class SegmentError(ValueError):
    """Bytes that are not a metrics segment: not Parquet, truncated, corrupt, another schema
    or a newer format. Its message is one line saying which; the caller names the file."""


class Columns(NamedTuple):
    """One metric's points in one file, in the file's order, as numpy arrays (which may be
    read-only views of what was read: copy before writing to one). ``times``, ``writers``
    and ``seqs`` are ``None`` when not read (:func:`decode_segment`'s ``columns=``);
    ``writers`` holds ``str`` objects."""

    steps: IntArray
    values: FloatArray
    times: FloatArray | None = None
    writers: ObjectArray | None = None
    seqs: IntArray | None = None


# -- writing ------------------------------------------------------------------------------------


def encode_segment(
    run_id: str,
    writer: str,
    first_seq: int,
    columns: Mapping[str, _Points],
) -> bytes:
    """One Parquet file (in memory) holding each metric's points: ``columns`` maps a name to
    its steps, values and times in call order (what the fsspec backend's ``_columns_by_name``
    makes), and rows keep that order: names in the mapping's order, each name's points in
    theirs. Rows get ``seq`` ``first_seq``, ``first_seq + 1``, ... in that row order: within
    a name that is call order; across names it is not the interleaving of the calls, which
    the columns no longer hold (a batch's points get numbers of their own either way, when
    ``first_seq`` is the batch's first record's number in its writer's order).

    Runs on the tracker's worker thread at every flush, sharing the GIL with the training
    loop: each column is made by C loops over the Python numbers (``np.fromiter``), the
    strings as dictionary indices, and the Parquet writer runs without the GIL. Columns
    given as numpy arrays are taken as they are (no loop over points). Arrow arrays are
    made from numpy's buffers, never by ``pa.array`` (see :func:`_arrow`).

    Raises ValueError naming the metric for a step beyond int64 (Python ints are unbounded;
    the call site takes any), columns of unequal length, a value or time that is not a
    number, or a name, run id or writer that is not valid UTF-8 (a lone surrogate).

    >>> data = encode_segment("run-1", "w1", 0, {"loss": ((0, 1), (0.5, 0.25), (1e9, 1e9))})
    >>> decode_segment(data)[0]["loss"].values.tolist()
    [0.5, 0.25]
    """
    names = list(columns)
    cols = list(columns.values())
    lengths = [len(col[0]) for col in cols]
    for name, (s, v, t) in zip(names, cols):
        if not len(s) == len(v) == len(t):
            raise ValueError(
                f"metric {name!r}: its columns differ in length "
                f"({len(s)} steps, {len(v)} values, {len(t)} times)"
            )
    n = sum(lengths)
    if not _INT64_MIN <= first_seq <= _INT64_MAX - n:
        raise ValueError(f"seq {first_seq} + {n} points does not fit in int64")
    steps = _steps(names, cols, n)
    values = _floats(names, cols, 1, "value")
    times = _floats(names, cols, 2, "time")
    name_index = np.repeat(np.arange(len(names), dtype=np.int32), lengths)
    # One zero index per row: shared by run and writer (Arrow arrays are immutable).
    zeros = _arrow(np.zeros(n, dtype=np.int32))
    arrays = [
        _dictionary(zeros, [run_id], "run id"),
        _dictionary(_arrow(name_index), names, "metric name"),
        _arrow(steps),
        values,
        times,
        _dictionary(zeros, [writer], "writer"),
        _arrow(np.arange(first_seq, first_seq + n, dtype=np.int64)),
    ]
    return _write(pa.Table.from_arrays(arrays, schema=_WRITE_SCHEMA))


_VALUE, _STEP, _TIME = (operator.itemgetter(i) for i in (1, 2, 3))


def row_columns(rows: Sequence[tuple[Any, ...]]) -> dict[str, ArrayPoints] | None:
    """The points of ``rows`` (tuples ``(name, value, step, time)`` in call order) as each
    name's steps, values and times in numpy arrays, for the batch a training loop makes:
    the same names in the same order at every step. ``None`` for any other batch, and for
    points that are not plain numbers (a step beyond int64, a value that is not a number):
    the caller then groups them by :func:`~async_tracker.backend.fsspec.segments.
    _columns_by_name`, which knows every case.

    Why: this runs on the tracker's thread at every flush, holding the GIL that the training
    loop waits for. Three C loops over the rows (``np.fromiter``) make whole-batch columns,
    and each name's points are a strided view of them: no tuple per name and no second
    pass over the points to encode or summarise them."""
    n = len(rows)
    if not n:
        return None
    first = rows[0][0]
    period = next((i for i in range(1, min(n, MAX_STRIDE + 1)) if rows[i][0] == first), n)
    names = tuple(map(_NAME, rows))
    firsts = names[:period]
    # The batch may end mid-step (a flush is cut by time): the last step's names are a
    # prefix of the others'.
    if len(set(firsts)) != period or names != (firsts * -(-n // period))[:n]:
        return None
    try:
        values = np.fromiter(map(_VALUE, rows), np.float64, n)
        steps = np.fromiter(map(_STEP, rows), np.int64, n)
        times = np.fromiter(map(_TIME, rows), np.float64, n)
    except (TypeError, ValueError, OverflowError):
        return None
    # numpy makes None a NaN: where a NaN is, look (the rare path) and leave a None to the
    # general case, which refuses it by name.
    for column, field in ((values, 1), (times, 3)):
        nans = np.flatnonzero(np.isnan(column))
        if len(nans) and any(rows[i][field] is None for i in nans.tolist()):
            return None
    return {
        name: (steps[i::period], values[i::period], times[i::period])
        for i, name in enumerate(firsts)
    }


def _steps(names: Sequence[str], cols: Sequence[_Points], n: int) -> IntArray:
    """Every name's steps, concatenated by one C loop (numpy's: a third of pyarrow's time
    for ints). On failure each name's are made alone, to name the metric (the error path)."""
    arrays = [steps for steps, _, _ in cols if isinstance(steps, np.ndarray)]
    if cols and len(arrays) == len(cols):
        return np.concatenate([_int64(name, steps) for name, steps in zip(names, arrays)])
    try:
        chained = itertools.chain.from_iterable(steps for steps, _, _ in cols)
        return np.fromiter(chained, dtype=np.int64, count=n)
    except (TypeError, ValueError, OverflowError):
        pass
    for name, (steps, _, _) in zip(names, cols):
        try:
            np.fromiter(steps, dtype=np.int64, count=len(steps))
        except OverflowError as exc:
            raise ValueError(f"metric {name!r}: a step does not fit in int64") from exc
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metric {name!r}: a step is not an integer ({exc})") from exc
    raise ValueError("a step cannot be stored")  # pragma: no cover: a name failed above


def _int64(name: str, steps: npt.NDArray[Any]) -> IntArray:
    kind = steps.dtype.kind
    if kind == "u" and steps.size and int(steps.max()) > _INT64_MAX:
        raise ValueError(f"metric {name!r}: a step does not fit in int64")
    if kind not in "iu":
        raise ValueError(f"metric {name!r}: steps of dtype {steps.dtype} are not integers")
    return steps.astype(np.int64, copy=False)


def _floats(names: Sequence[str], cols: Sequence[_Points], field: int, what: str) -> Any:
    """Field ``field`` (1 values, 2 times) of every name as one float64 Arrow array: a C loop
    per name (numpy's, which takes what ``float()`` takes; an int a double does not hold
    exactly is rounded, as at the call site). numpy makes None a NaN: a NaN is looked at
    (the rare path), to refuse a None."""
    parts = []
    for name, col in zip(names, cols):
        numbers = col[field]
        if isinstance(numbers, np.ndarray):
            if numbers.dtype.kind not in "biuf":
                raise ValueError(
                    f"metric {name!r}: {what}s of dtype {numbers.dtype} are not numbers"
                )
            parts.append(numbers.astype(np.float64, copy=False))
            continue
        try:
            part = np.fromiter(numbers, np.float64, len(numbers))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"metric {name!r}: a {what} is not a number ({_reason(exc)})") from exc
        nans = np.flatnonzero(np.isnan(part))
        if len(nans) and any(numbers[i] is None for i in nans.tolist()):
            raise ValueError(f"metric {name!r}: a {what} is None")
        parts.append(part)
    if len(parts) == 1:
        return _arrow(parts[0])
    return _arrow(np.concatenate(parts) if parts else np.empty(0, np.float64))


def _arrow(array: npt.NDArray[Any]) -> Any:
    """A numpy array of numbers or booleans as an Arrow array, over the same memory (bits,
    for booleans). Not ``pa.array``, which asks pyarrow's pandas shim about its argument:
    the first such call imports pandas (half a second, on the tracker's thread), and pandas
    imported by a thread other than the main one aborts the process at exit ("Fatal Python
    error: PyGILState_Release")."""
    array = np.ascontiguousarray(array)
    if array.dtype == np.bool_:
        bits = np.packbits(array, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(array), [None, pa.py_buffer(bits)])
    kind = pa.from_numpy_dtype(array.dtype)
    return pa.Array.from_buffers(kind, len(array), [None, pa.py_buffer(array)])


def _strings(values: Sequence[str]) -> Any:
    """``values`` as an Arrow string array (see :func:`_arrow`); UnicodeError for a value
    without a UTF-8 form."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers)


def _dictionary(indices: Any, values: Sequence[str], what: str) -> Any:
    try:
        dictionary = _strings(values)
    except UnicodeError as exc:  # a lone surrogate: no UTF-8 for it
        bad = next((v for v in values if not _is_utf8(v)), None)
        raise ValueError(f"{what} {bad!r} is not valid UTF-8: {_reason(exc)}") from exc
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeError:
        return False
    return True


def _write(table: Any) -> bytes:
    sink = pa.BufferOutputStream()
    with _writer(sink) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _writer(sink: Any) -> Any:
    """A Parquet writer of our schema and options into ``sink``. Without the Arrow schema
    stored, the schema's metadata is not written either: it is added here."""
    writer = pq.ParquetWriter(sink, _WRITE_SCHEMA, **_WRITE_OPTIONS)
    writer.add_key_value_metadata(METRIC_SCHEMA.metadata)
    return writer


# -- reading ------------------------------------------------------------------------------------


def decode_segment(
    data: bytes,
    *,
    names: Collection[str] | None = None,
    columns: Collection[str] = OPTIONAL_COLUMNS,
) -> tuple[dict[str, Columns], str]:
    """A segment's points by metric name, names in the order they first come in the file,
    each name's points in file order, and what was skipped (``""`` if nothing): rows with a
    null in a column read (no file of ours has one; another tool's may).

    ``names`` reads only those metrics: row groups whose name statistics rule them out are
    not read at all (a compacted file's groups). ``columns`` are the optional columns to read
    (of :data:`OPTIONAL_COLUMNS`); a chart by step reads none: ``columns=()``.

    Raises :class:`SegmentError` (one line) for bytes that are not a segment: not Parquet,
    truncated, corrupt, another schema (a column missing or of another type), or a format
    version other than metrics/1. Integer columns of other widths and float32 are read as
    int64 and float64; strings of any Arrow string type are read.
    """
    if isinstance(names, str):
        raise TypeError(f"names: a collection of metric names, not one str ({names!r})")
    extra = set(columns) - set(OPTIONAL_COLUMNS)
    if extra:
        raise ValueError(f"columns: {sorted(extra)} not among {OPTIONAL_COLUMNS}")
    wanted = ["name", "step", "value", *(c for c in OPTIONAL_COLUMNS if c in columns)]
    asked = None if names is None else set(names)
    file = _open(data)
    groups = None if asked is None else _groups_for(file, asked)
    table = _read(file, wanted, groups)
    table, skipped = _drop_nulls(table)
    if not table.num_rows:
        return {}, skipped

    codes, dictionary = _codes(table.column("name"))
    if asked is not None:
        keep = [i for i, name in enumerate(dictionary) if name in asked]
        if len(keep) < len(dictionary):
            mask = np.isin(codes, keep)
            table = table.filter(_arrow(mask))
            codes = codes[mask]
            if not len(codes):
                return {}, skipped
    got = {
        "steps": _numpy(table.column("step")),
        "values": _numpy(table.column("value")),
    }
    if "time" in columns:
        got["times"] = _numpy(table.column("time"))
    if "seq" in columns:
        got["seqs"] = _numpy(table.column("seq"))
    if "writer" in columns:
        writer_codes, writer_names = _codes(table.column("writer"))
        got["writers"] = np.array(writer_names, dtype=object)[writer_codes]

    out: dict[str, Columns] = {}
    for code, where in _groups(codes, len(dictionary)):
        out[dictionary[code]] = Columns(**{key: array[where] for key, array in got.items()})
    del table
    release_memory()
    return out, skipped


def _open(data: bytes) -> Any:
    """``data`` as a ParquetFile whose string columns read as dictionaries, or SegmentError:
    not Parquet, truncated (the footer is at the end), or not our schema."""
    source = pa.BufferReader(data)
    try:
        metadata = pq.read_metadata(source)
    except _ARROW_ERRORS as exc:
        raise SegmentError(f"not a Parquet file: {_reason(exc)}") from exc
    try:
        schema = metadata.schema.to_arrow_schema()
    except _ARROW_ERRORS as exc:
        raise SegmentError(f"unreadable schema: {_reason(exc)}") from exc
    _check_schema(schema)
    try:
        return pq.ParquetFile(source, metadata=metadata, read_dictionary=list(STRING_COLUMNS))
    except _ARROW_ERRORS as exc:
        raise SegmentError(f"not a Parquet file: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """``exc`` in one line (pyarrow's messages may hold several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _check_schema(schema: Any) -> None:
    """Raises SegmentError unless ``schema`` (a file's) holds our columns, of types we read,
    and names no other major version of the format."""
    metadata = schema.metadata or {}
    version = metadata.get(FORMAT_KEY.encode())
    if version is not None:
        text = version.decode("utf-8", errors="replace")
        if text != FORMAT_VERSION and not text.startswith(FORMAT_VERSION + "."):
            raise SegmentError(f"format {text!r}, not {FORMAT_VERSION!r}")
    found = {c: len(schema.get_all_field_indices(c)) for c in COLUMN_NAMES}
    missing = [c for c, count in found.items() if not count]
    if missing:
        raise SegmentError(f"another schema: no column {', '.join(missing)}")
    for column in COLUMN_NAMES:
        if found[column] > 1:
            raise SegmentError(f"another schema: column {column} is there twice")
        kind = schema.field(column).type
        if not _readable(column, kind):
            raise SegmentError(f"another schema: column {column} is {kind}")


def _readable(column: str, kind: Any) -> bool:
    if column in STRING_COLUMNS:
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind)) or (
            str(kind) == "string_view"
        )
    if column in INT_COLUMNS:
        return bool(pa.types.is_integer(kind))
    return bool(pa.types.is_floating(kind))


def _groups_for(file: Any, names: set[str]) -> list[int]:
    """The row groups that may hold one of ``names``, by their name statistics."""
    metadata = file.metadata
    # The leaf column's index (another tool's file may have nested columns before it).
    paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    index = paths.index("name")
    groups = []
    for i in range(metadata.num_row_groups):
        try:
            stats = metadata.row_group(i).column(index).statistics
            bounds = (stats.min, stats.max) if stats is not None and stats.has_min_max else None
        except _ARROW_ERRORS:
            bounds = None  # statistics we cannot read: read the group
        if bounds is None or _may_hold(*bounds, names):
            groups.append(i)
    return groups


def _may_hold(low: object, high: object, names: set[str]) -> bool:
    """Whether a row group whose names lie in ``[low, high]`` may hold one of ``names``.
    UTF-8's byte order, Parquet's for strings, is the order of code points: Python's."""
    if not (isinstance(low, str) and isinstance(high, str)):
        return True  # statistics of another kind: read the group
    return any(low <= name <= high for name in names)


def _read(file: Any, wanted: Sequence[str], groups: Sequence[int] | None) -> Any:
    """The columns ``wanted`` of ``file`` (all groups, or ``groups``), cast to the types of
    METRIC_SCHEMA (strings as dictionaries), or SegmentError."""
    try:
        if groups is None:
            # use_threads=False: no Arrow thread pool, whose threads a process ending right
            # after a read (a CLI command) can abort on (std::terminate at exit); a file is
            # decoded in one of our worker threads already.
            table = file.read(columns=list(wanted), use_threads=False)
        else:
            table = file.read_row_groups(list(groups), columns=list(wanted), use_threads=False)
        return _normalized(table)
    except SegmentError:
        raise
    except _ARROW_ERRORS as exc:
        raise SegmentError(f"unreadable: {_reason(exc)}") from exc


def _normalized(table: Any) -> Any:
    """``table``'s columns as METRIC_SCHEMA's types (strings as dictionary arrays), each one
    chunk, dictionaries unified."""
    arrays = []
    for column in table.column_names:
        array = table.column(column)
        if column in STRING_COLUMNS:
            if not pa.types.is_dictionary(array.type):
                array = array.cast(pa.string()).dictionary_encode()
            if array.type != _DICT:
                array = array.cast(_DICT)
        else:
            target = METRIC_SCHEMA.field(column).type
            if array.type != target:
                try:
                    array = array.cast(target)  # safe: an overflow raises
                except _ARROW_ERRORS as exc:
                    raise SegmentError(f"column {column}: {_reason(exc)}") from exc
        arrays.append(array)
    normalized = pa.Table.from_arrays(arrays, names=table.column_names).unify_dictionaries()
    normalized = normalized.combine_chunks()
    # Parquet's reader checks neither UTF-8 nor dictionary indices: corrupt bytes could
    # give a string that is not text, or an index past its dictionary. Linear, and cheap
    # next to the read (the strings checked are the dictionaries').
    normalized.validate(full=True)
    return normalized


def _drop_nulls(table: Any) -> tuple[Any, str]:
    counts = {c: table.column(c).null_count for c in table.column_names}
    if not any(counts.values()):
        return table, ""
    before = table.num_rows
    table = table.drop_null()
    nulls = ", ".join(c for c, count in counts.items() if count)
    return table, f"{before - table.num_rows} rows with a null {nulls}"


def _codes(column: Any) -> tuple[npt.NDArray[np.int32], list[str]]:
    """A dictionary column (one chunk) as indices and the distinct values; a value the
    dictionary holds twice gets the first one's index."""
    (chunk,) = column.chunks if column.num_chunks else [column.combine_chunks()]
    values: list[str] = chunk.dictionary.to_pylist()
    codes = np.asarray(_view(chunk.indices), dtype=np.int32)
    first: dict[str, int] = {}
    remap = [first.setdefault(v, len(first)) for v in values]
    if len(first) < len(values):
        codes = np.asarray(remap, dtype=np.int32)[codes]
        values = list(first)
    return codes, values


def _numpy(column: Any) -> npt.NDArray[Any]:
    (chunk,) = column.chunks if column.num_chunks else [column.combine_chunks()]
    array: npt.NDArray[Any] = _view(chunk)
    return array


# The numpy type of each Arrow type a column is read as (see _view).
_NUMPY_TYPES: Final[dict[Any, np.dtype[Any]]] = {
    pa.int8(): np.dtype(np.int8), pa.int16(): np.dtype(np.int16),
    pa.int32(): np.dtype(np.int32), pa.int64(): np.dtype(np.int64),
    pa.uint8(): np.dtype(np.uint8), pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32), pa.uint64(): np.dtype(np.uint64),
    pa.float32(): np.dtype(np.float32), pa.float64(): np.dtype(np.float64),
}  # fmt: skip


def _view(array: Any) -> npt.NDArray[Any]:
    """An Arrow array of numbers without nulls as a read-only numpy view of its memory. Not
    ``to_numpy``: Arrow's conversion to numpy imports pandas on first use (see
    :func:`_arrow`)."""
    if array.null_count:
        raise SegmentError("unexpected nulls")  # pragma: no cover: dropped before
    dtype = _NUMPY_TYPES[array.type]
    data = array.buffers()[1]
    if data is None:
        return np.empty(0, dtype)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _groups(codes: npt.NDArray[np.int32], size: int) -> Iterable[tuple[int, slice | IntArray]]:
    """``(code, where)`` per distinct code, in order of first appearance, ``where`` indexing
    that code's rows in order: a slice when they are contiguous (one metric per file, or a
    segment's names one after another), else their positions."""
    n = len(codes)
    starts = np.flatnonzero(np.diff(codes)) + 1
    bounds = [0, *starts.tolist(), n]
    run_codes = codes[bounds[:-1]]
    if len(np.unique(run_codes)) == len(run_codes):  # each code in one run: slices
        for i, code in enumerate(run_codes.tolist()):
            yield code, slice(bounds[i], bounds[i + 1])
        return
    # Interleaved (a compacted file): a stable sort by code keeps each code's file order.
    # numpy sorts 16-bit integers by radix sort, in linear time.
    key = codes.astype(np.int16) if size <= 2**15 else codes
    order = np.argsort(key, kind="stable")
    counts = np.bincount(codes, minlength=size)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    for code in dict.fromkeys(run_codes.tolist()):
        yield code, order[offsets[code] : offsets[code + 1]]


# -- compaction ---------------------------------------------------------------------------------


def compact(
    segments: Sequence[bytes],
    row_group_rows: int = COMPACT_ROW_GROUP_ROWS,
    metadata: Mapping[str, str] | None = None,
    *,
    dedupe: bool = False,
) -> bytes:
    """The rows of ``segments`` (in write order) as one Parquet file of the same schema, in
    the order given: row groups of ``row_group_rows`` rows (the last one smaller; their name
    statistics let a reader of one metric skip the groups that cannot hold it). Rows are
    not sorted: a reader recovers a curve's order by ``(step, seq)``. ``metadata`` is added
    to the file's key-value metadata (the fsspec store records the inputs there). With
    ``dedupe``, a row whose ``(writer, seq)`` an earlier segment holds is left out: segments
    that hold the same rows (two compacted files of shared inputs) give each row once.

    Safe because nothing is rewritten: the output is a new immutable file, and the inputs
    are removed only once it is in place (the caller's job). A crash in between leaves the
    inputs, and the output if it was in place: nothing is lost, and a reader that lists both
    keeps one point per ``(writer, seq)`` (or knows, from the output's name, which inputs it
    replaced), so nothing counts twice.

    Raises :class:`SegmentError` naming the segment (its index in ``segments``) that cannot
    be read, or that holds rows a reader skips (nulls): compacting it would change what
    readers see, so the caller leaves it out (and where it is).
    """
    sink = pa.BufferOutputStream()
    writer = _writer(sink)
    if metadata:
        writer.add_key_value_metadata(dict(metadata))
    pending: list[Any] = []
    count = 0
    seen: dict[str, list[IntArray]] = {}
    try:
        for i, segment in enumerate(segments):
            try:
                table = _read(_open(segment), COLUMN_NAMES, None)
            except SegmentError as exc:
                raise SegmentError(f"segment {i}: {exc}") from exc
            nulls = [c for c in COLUMN_NAMES if table.column(c).null_count]
            if nulls:
                raise SegmentError(f"segment {i}: nulls in {', '.join(nulls)}")
            if dedupe:
                table = _unseen(table, seen)
            pending.append(table.cast(_WRITE_SCHEMA))
            count += table.num_rows
            while count >= row_group_rows:
                # Whole groups now; the rest waits for the next segments.
                batch = pa.concat_tables(pending).unify_dictionaries()
                writer.write_table(batch.slice(0, row_group_rows), row_group_size=row_group_rows)
                rest = batch.slice(row_group_rows)
                pending, count = [rest], rest.num_rows
        if count:
            batch = pa.concat_tables(pending).unify_dictionaries()
            writer.write_table(batch, row_group_size=row_group_rows)
    finally:
        writer.close()
    data: bytes = sink.getvalue().to_pybytes()
    return data


# -- overviews ----------------------------------------------------------------------------------

# A compacted file of more rows than this gets an overview (see :func:`overview`); a smaller
# one is read whole by a chart (a few MB at most).
OVERVIEW_MIN_ROWS: Final = 1 << 16


def overview(data: bytes, width: int = MAX_WIDTH) -> bytes | None:
    """An overview of the file ``data`` (a compacted file): its rows that a chart ``width``
    pixels wide draws of each metric, by step and by time (:func:`min_max` of each curve
    along each axis: every bucket's extremes and the curve's ends), as a file of the same
    schema; ``None`` for a file of at most :data:`OVERVIEW_MIN_ROWS` rows.

    A chart of the whole of a huge finished run reads this (thousands of rows per metric)
    instead of every point; zooming in reads the points. The rows are the file's own, so
    the overview is exact where it is drawn: no point is invented or averaged. Raises
    :class:`SegmentError` for bytes that are not a segment."""
    table = _read(_open(data), COLUMN_NAMES, None)
    if table.num_rows <= OVERVIEW_MIN_ROWS:
        return None
    codes, dictionary = _codes(table.column("name"))
    steps, values = _numpy(table.column("step")), _numpy(table.column("value"))
    times, seqs = _numpy(table.column("time")), _numpy(table.column("seq"))
    keep: list[npt.NDArray[np.intp]] = []
    for _, where in _groups(codes, len(dictionary)):
        rows = np.arange(len(codes))[where] if isinstance(where, slice) else where
        # A curve's order, as readers recover it: by step, then by seq (write order). Most
        # curves are written in it already: then the sort, which would leave them as they
        # are (it is stable), is skipped.
        by_step = rows if _in_order(steps[rows], seqs[rows]) else rows[
            np.lexsort((seqs[rows], steps[rows]))
        ]
        keep.append(by_step[min_max(steps[by_step], values[by_step], width)])
        # The time axis: its own buckets (a run resumed may step back in time), NaN left out.
        timed = by_step[~np.isnan(times[by_step])]
        stamps = times[timed]
        by_time = timed if _in_order(stamps) else timed[np.argsort(stamps, kind="stable")]
        if len(by_time):
            keep.append(by_time[min_max(times[by_time], values[by_time], width)])
    chosen = np.unique(np.concatenate(keep)) if keep else np.empty(0, np.intp)
    picked = table.take(_arrow(chosen)).cast(_WRITE_SCHEMA)
    return _write(picked.unify_dictionaries())


def _in_order(keys: npt.NDArray[Any], ties: npt.NDArray[Any] | None = None) -> bool:
    """Whether a stable sort by ``keys`` (then ``ties``) would leave the rows as they are."""
    steps = np.diff(keys)
    if not (steps >= 0).all():
        return False
    return ties is None or bool((np.diff(ties)[steps == 0] >= 0).all())


def _unseen(table: Any, seen: dict[str, list[IntArray]]) -> Any:
    """``table`` less the rows whose ``(writer, seq)`` is in ``seen`` (seqs by writer), and
    the rows kept added to ``seen``."""
    codes, writers = _codes(table.column("writer"))
    seqs = _numpy(table.column("seq"))
    keep = np.ones(len(seqs), dtype=bool)
    for code, writer in enumerate(writers):
        rows = codes == code
        earlier = seen.get(writer)
        if earlier:
            keep[rows] &= ~np.isin(seqs[rows], np.concatenate(earlier))
    for code, writer in enumerate(writers):
        seen.setdefault(writer, []).append(seqs[(codes == code) & keep])
    return table if keep.all() else table.filter(_arrow(keep))
