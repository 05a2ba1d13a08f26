"""Metric segments read straight into numpy columns: how the reader's ``scalars`` (the
dashboard's charts) reads big runs.

The backend's reader (:func:`~async_tracker.backend.fsspec.segments.parse_segment_columns`) checks
every point in Python lists; for a ten-million-point metric that is seconds before the
first chart. This reader knows the one line shape the fsspec backend writes (orjson's
``{"name":"loss","step":[...],"value":[...],"time":[...]}``) and reads its columns with C
loops: steps by numpy's integer parser, once the text is checked to hold only integers,
values by orjson straight into an array. Times are kept as text, checked to hold one number
per step, and parsed when a chart first asks for time as x (:func:`times_array`):
most charts are by step, and times cost as much to parse as values.

Any other line (spaces, keys in another order, NaN or infinities, which the backend writes
with the json module, a step beyond int64, a foreign writer's) goes to the backend's
strict :func:`~async_tracker.backend.fsspec.segments.parse_column_line`, so that the points accepted
and the lines skipped are the backend's, with the same messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import orjson

from async_tracker.backend.fsspec.segments import (
    UNPARSEABLE_LINE,
    describe_skipped,
    parse_column_line,
    skipped_line,
)

FloatArray = npt.NDArray[np.float64]

_EMPTY: FloatArray = np.empty(0)
_INTEGER_CHARS = b"0123456789-,"
# With the brackets: text is checked whole, rather than copied without them.
_NUMBER_CHARS = b"0123456789.eE+-,[]"
_INT64 = np.iinfo(np.int64)


@dataclass
class Chunk:
    """The points of one metric in one segment, in the segment's order: steps and values
    as float64 arrays, and ``times`` as parts, each an array or a JSON array's text
    (brackets included) holding one number per point, parsed by :func:`times_array`."""

    steps: FloatArray
    values: FloatArray
    times: list[FloatArray | bytes]

    def __len__(self) -> int:
        return len(self.steps)


def parse_segment(data: bytes) -> tuple[dict[str, Chunk], str]:
    """A segment's metrics as :class:`Chunk` by name, and the lines skipped as the backend
    describes them (``""`` if none); a metric on several lines gets one chunk."""
    parts: dict[str, list[tuple[FloatArray, FloatArray, FloatArray | bytes]]] = {}
    bad: list[str] = []
    times: FloatArray | bytes
    # Lines are found by offset, not split out: a segment is often one line of 50 MB.
    end, lineno = -1, 0
    while end < len(data):
        start, lineno = end + 1, lineno + 1
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        fast = _fast_line(data, start, end)
        if fast is not None:
            name, steps, values, times = fast
        else:
            line = data[start:end]
            if not line.strip():
                continue
            try:
                name, int_steps, float_values, float_times = parse_column_line(line)
            except UNPARSEABLE_LINE as exc:
                bad.append(skipped_line(lineno, exc))
                continue
            steps = np.asarray(int_steps, np.float64)
            values = np.asarray(float_values, np.float64)
            times = np.asarray(float_times, np.float64)
        parts.setdefault(name, []).append((steps, values, times))
    chunks = {
        name: Chunk(
            np.concatenate([p[0] for p in group]) if len(group) > 1 else group[0][0],
            np.concatenate([p[1] for p in group]) if len(group) > 1 else group[0][1],
            [p[2] for p in group],
        )
        for name, group in parts.items()
    }
    return chunks, describe_skipped(bad)


def times_array(parts: list[FloatArray | bytes]) -> FloatArray:
    """``parts`` of times (see :class:`Chunk`) as one array. Text was checked to hold the
    right count of numbers' characters, not that each is a number: a token that is not
    (``1.2.3``: a corrupt file) reads as NaN, which time charts leave out."""
    arrays = [p if isinstance(p, np.ndarray) else _parse_times(p) for p in parts]
    if not arrays:
        return _EMPTY
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _parse_times(text: bytes) -> FloatArray:
    count = text.count(b",") + 1 if text != b"[]" else 0
    try:
        times = np.array(orjson.loads(text), np.float64)
        if times.shape == (count,):
            return times
    except (orjson.JSONDecodeError, TypeError, ValueError, OverflowError):
        pass
    # Not a flat list of numbers: token by token, each that is not a number NaN.
    return np.array([_float_or_nan(t) for t in text[1:-1].split(b",")], np.float64)


def _float_or_nan(token: bytes) -> float:
    try:
        return float(token)
    except ValueError:
        return float("nan")


_HEAD = b'{"name":"'
_STEPS = b'","step":['
_VALUES = b'],"value":['
_TIMES = b'],"time":['


def _fast_line(
    data: bytes, start: int, end: int
) -> tuple[str, FloatArray, FloatArray, bytes] | None:
    """The columns of the line ``data[start:end]`` if it has the backend's own shape and
    every check passes; else ``None`` (the strict reader decides). Times stay text,
    brackets included."""
    if not (data.startswith(_HEAD, start, end) and data.endswith(b"]}", start, end)):
        return None
    # A JSON string holds no bare quote, so the first '","step":[' ends the name; the
    # steps' text holds only digits, signs and commas, so the first '],"value":[' after it
    # ends the steps; values' text holds no ']'.
    a = data.find(_STEPS, start, end)
    b = data.find(_VALUES, a, end)
    c = data.find(_TIMES, b, end)
    if a < 0 or b < 0 or c < 0:
        return None
    try:
        name = orjson.loads(data[start + len(_HEAD) - 1 : a + 1])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(name, str):
        return None
    steps = _integers(data[a + len(_STEPS) : b])
    if steps is None:
        return None
    values = _floats(data[b + len(_VALUES) - 1 : c + 1])
    times = data[c + len(_TIMES) - 1 : end - 1]
    if values is None or len(values) != len(steps) or not _numbers_text(times, len(steps)):
        return None
    return name, steps, values, times


def _integers(text: bytes) -> FloatArray | None:
    """``text`` (a JSON array's body) as floats if it holds only integers within int64;
    else ``None``. numpy's parser reads them; each check is one pass over the bytes, as
    few as will do: a huge segment's first read is mostly such passes. Unlike JSON, it
    takes leading zeros (``07``)."""
    if not text:
        return _EMPTY
    if text.translate(None, _INTEGER_CHARS):
        return None
    # numpy reads a sign alone as 0. (A search for one byte is cheap; for two, less so.)
    if b"-" in text and (text.endswith(b"-") or b"-," in text):
        return None
    try:
        steps = np.fromstring(text, dtype=np.int64, sep=",")
    except ValueError:  # where numpy raises on text it cannot read to its end
        return None
    # Elsewhere numpy stops at such text (with a DeprecationWarning): fewer steps than tokens.
    if len(steps) != text.count(b",") + 1:
        return None
    # numpy's parser saturates beyond int64: the bounds go to the strict reader (which keeps
    # Python ints).
    if steps.max() == _INT64.max or steps.min() == _INT64.min:
        return None
    return steps.astype(np.float64)


def _floats(text: bytes) -> FloatArray | None:
    """``text`` (a JSON array, brackets included) as floats if it holds numbers alone (no
    NaN nor infinities: the backend writes those with the json module, which the strict
    reader takes); else ``None``."""
    if text.translate(None, _NUMBER_CHARS):
        return None
    try:
        values = np.array(orjson.loads(text), np.float64)
    except (orjson.JSONDecodeError, TypeError, ValueError, OverflowError):
        return None  # not JSON, or nested lists of unequal lengths
    return values if values.ndim == 1 else None  # nested lists of equal lengths


def _numbers_text(text: bytes, count: int) -> bool:
    """Whether ``text`` (a JSON array, brackets included) may hold ``count`` numbers: only
    numbers' characters, and ``count - 1`` commas."""
    if count == 0:
        return text == b"[]"
    return (
        text != b"[]" and not text.translate(None, _NUMBER_CHARS) and text.count(b",") == count - 1
    )


__all__ = ["Chunk", "parse_segment", "times_array"]
