"""The metric segment codec of the fsspec store: one JSON Lines file per flush.

Metric segments are JSON Lines with one line per metric name, columns of steps, values and
timestamps: ``{"name": "loss", "step": [...], "value": [...], "time": [...]}``. Columns let
the C JSON encoder do the work, and NaN and infinities round-trip (``NaN``, ``Infinity``).
"""

from __future__ import annotations

import itertools
import json
import math
import operator
from collections.abc import Sequence

import orjson

from async_tracker.backend.fsspec.layout import _UNPARSEABLE
from async_tracker.backend.fsspec.storage import _encode_json
from async_tracker.records import MetricRow, TrackerMetric

_NAME = operator.itemgetter(0)
# Builds a TrackerMetric from a 4-tuple without its Python __new__ (a C call per point).
_METRIC = itertools.repeat(TrackerMetric)

_Columns = tuple[Sequence[int], Sequence[float], Sequence[float]]
MAX_STRIDE = 256  # names per step looked for by _columns_by_name's strided case


def _columns_by_name(rows: Sequence[MetricRow]) -> dict[str, _Columns]:
    """Each name's steps, values and times in call order, the names in the order they first
    came (readers list metrics in that order). Made with C loops, no Python loop per point.

    A training loop logs the same names in the same order at every step, and then each
    name's points are a stride of the columns: found by the first name's next occurrence,
    spot-checked at the middle and the end (a batch that is not strided mostly fails there,
    at no cost), then checked whole. Any other batch is grouped by a stable sort."""
    if not rows:
        return {}
    n, first = len(rows), rows[0][0]
    period = next((i for i in range(1, min(n, MAX_STRIDE + 1)) if rows[i][0] == first), n)
    if all(rows[i][0] == rows[i % period][0] for i in (n // 2, n - 1)):
        names = tuple(map(_NAME, rows))
        firsts = names[:period]
        if len(set(firsts)) == period and all(
            names[i::period].count(name) == len(names[i::period])
            for i, name in enumerate(firsts)
        ):
            _, values, steps, times = zip(*rows)
            return {
                name: (steps[i::period], values[i::period], times[i::period])
                for i, name in enumerate(firsts)
            }
    grouped: dict[str, _Columns] = {}
    for name, group in itertools.groupby(sorted(rows, key=_NAME), key=_NAME):
        _, group_values, group_steps, group_times = zip(*group)
        grouped[name] = (group_steps, group_values, group_times)
    return {name: grouped[name] for name in dict.fromkeys(map(_NAME, rows))}


def _encode_column(
    name: str, steps: Sequence[int], values: Sequence[float], times: Sequence[float], path: str
) -> bytes:
    """One line of a metrics segment. orjson writes numbers some twenty times faster than the
    json module (the flusher shares the GIL with the training loop), but writes NaN and
    infinities as null: a column holding one (its sum is then not finite; a sum of finite
    values that overflows only costs the slower path), or a step beyond 64 bits, takes the
    json module, which keeps them."""
    line = {"name": name, "step": steps, "value": values, "time": times}
    if math.isfinite(sum(values)) and math.isfinite(sum(times)):
        try:
            return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError:
            pass  # a step beyond 64 bits, a lone surrogate: json says which
    return _encode_json(line, path) + b"\n"


_NUMBERS = frozenset({int, float})


def _parse_segment(data: bytes) -> tuple[dict[str, list[TrackerMetric]], str]:
    """The points of a metrics segment by name, and what was wrong with the lines skipped
    (``""`` if none): a truncated line, columns of unequal length, a step that is not an
    integer (NaN, infinities), a value or time that is not a number."""
    columns, bad = parse_segment_columns(data)
    # One C loop per metric: a segment holds up to a million points.
    points = {
        name: list(
            map(
                tuple.__new__,
                _METRIC,
                zip(itertools.repeat(name), values, steps, times),
            )
        )
        for name, (steps, values, times) in columns.items()
    }
    return points, bad


# One metric of one segment as columns: steps, values, times.
SegmentColumns = tuple[list[int], list[float], list[float]]


def parse_segment_columns(data: bytes) -> tuple[dict[str, SegmentColumns], str]:
    """:func:`_parse_segment`'s checks, keeping the columns as lists (no object per point):
    what a reader of millions of points wants. Lines are read by :func:`parse_column_line`;
    the second item describes the lines skipped (:func:`describe_skipped`)."""
    out: dict[str, SegmentColumns] = {}
    bad: list[str] = []
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            name, steps, values, times = parse_column_line(line)
        except UNPARSEABLE_LINE as exc:
            bad.append(skipped_line(lineno, exc))
            continue
        if name in out:
            s, v, t = out[name]
            s.extend(steps)
            v.extend(values)
            t.extend(times)
        else:
            out[name] = (steps, values, times)
    return out, describe_skipped(bad)


# What parse_column_line raises for a line it rejects.
UNPARSEABLE_LINE = (*_UNPARSEABLE, orjson.JSONDecodeError)


def parse_column_line(line: bytes) -> tuple[str, list[int], list[float], list[float]]:
    """One line of a metrics segment: ``(name, steps, values, times)``, values and times as
    floats. Raises one of :data:`UNPARSEABLE_LINE` for a line to skip: not JSON (a truncated
    line), columns of unequal length, a step that is not an integer (NaN, infinities), a
    value or time that is not a number. orjson parses a line unless it holds NaN or
    infinities (JSON has none; the json module reads Python's tokens for them)."""
    try:
        col = orjson.loads(line)
    except orjson.JSONDecodeError:
        col = json.loads(line)
    name, steps, values, times = col["name"], col["step"], col["value"], col["time"]
    if not isinstance(name, str):
        raise TypeError("the metric name is not a string")
    if not (type(steps) is type(values) is type(times) is list):
        raise TypeError("the columns are not lists")
    if not len(steps) == len(values) == len(times):
        raise ValueError("the columns differ in length")
    # Type checks by C loops (map, set): a segment holds up to a million points.
    if not set(map(type, steps)) <= {int}:
        # orjson reads an integer beyond 64 bits as a float: the json module reads it whole
        # (such steps are why the writer chose JSON for this segment).
        col = json.loads(line)
        steps, values, times = col["step"], col["value"], col["time"]
    if not set(map(type, steps)) <= {int}:
        raise TypeError("a step is not an integer")
    if not set(map(type, values)) <= _NUMBERS or not set(map(type, times)) <= _NUMBERS:
        raise TypeError("a value or time is not a number")
    # Floats (an int too large for one is OverflowError: the line is skipped).
    return name, steps, list(map(float, values)), list(map(float, times))


def skipped_line(lineno: int, exc: Exception) -> str:
    """Why line ``lineno`` of a segment was skipped, for :func:`describe_skipped`."""
    return f"line {lineno}: {type(exc).__name__}: {exc}"


def describe_skipped(bad: Sequence[str]) -> str:
    """The lines skipped of one segment in one line (``""`` if none): the first two, and how
    many more."""
    return "; ".join(bad[:2]) + (f"; {len(bad) - 2} more lines" if len(bad) > 2 else "")
