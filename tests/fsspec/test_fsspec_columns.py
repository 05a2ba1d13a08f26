"""The dashboard's reader of metric segments against the backend's strict reader: the same
points from the lines the backend writes, the same lines skipped (with the same messages)
from anything else, whatever a corrupt or foreign file holds."""

from __future__ import annotations

import math
import re

import orjson
import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("starlette")

from hypothesis import event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from async_tracker.backend.fsspec import _encode_column, parse_segment_columns  # noqa: E402
from async_tracker.backend.fsspec import columns as segments  # noqa: E402
from async_tracker.backend.fsspec.columns import Chunk, parse_segment, times_array  # noqa: E402
from async_tracker.store.reader import Scalars  # noqa: E402
from async_tracker.ui.live import Curve  # noqa: E402

pytestmark = pytest.mark.server


def line(name: str, steps: list[int], values: list[float], times: list[float]) -> bytes:
    """A line as the backend writes it."""
    return _encode_column(name, steps, values, times, "test")


def columns(chunk: Chunk) -> tuple[list[float], list[float], list[float]]:
    return chunk.steps.tolist(), chunk.values.tolist(), times_array(chunk.times).tolist()


def same(a: list[float], b: list[float]) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b)) and len(a) == len(
        b
    )


def test_the_backends_own_lines_take_the_fast_path_with_every_point_exact() -> None:
    steps = [0, 1, 2, 10**15, -5]
    values = [0.1, 1e-300, -2.5e20, 3, 0.30000000000000004]
    times = [1795720670.772582, 0.0, 1e9, 2.5, 1795720670.1]
    data = line("loss/train", steps, values, times) + line('é "q"', [7], [1.0], [2.0])
    assert segments._fast_line(data, 0, data.index(b"\n")) is not None
    got, bad = parse_segment(data)
    assert bad == "" and list(got) == ["loss/train", 'é "q"']
    chunk = got["loss/train"]
    # Times stay text until asked for: the fast path kept them so.
    assert isinstance(chunk.times[0], bytes)
    assert columns(chunk) == (
        [float(s) for s in steps], [float(v) for v in values], times
    )  # fmt: skip
    assert columns(got['é "q"']) == ([7.0], [1.0], [2.0])


def test_nan_and_infinities_written_by_the_json_module_are_read_by_the_strict_reader() -> None:
    data = line("loss", [0, 1, 2], [math.nan, math.inf, -math.inf], [1.0, 2.0, 3.0])
    assert b"NaN" in data and segments._fast_line(data, 0, len(data) - 1) is None
    (chunk,) = parse_segment(data)[0].values()
    steps, values, _ = columns(chunk)
    assert steps == [0, 1, 2] and math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]


def test_a_metric_on_several_lines_is_one_chunk_in_line_order() -> None:
    data = line("a", [0, 1], [1.0, 2.0], [1.0, 2.0]) + line("b", [0], [5.0], [1.0])
    data += line("a", [2], [3.0], [3.0])
    got, bad = parse_segment(data)
    assert bad == "" and columns(got["a"]) == ([0, 1, 2], [1, 2, 3], [1, 2, 3])


def test_skipped_lines_are_described_as_the_strict_reader_does() -> None:
    good = line("a", [0, 1], [1.0, 2.0], [1.0, 2.0])
    data = good + b'{"name":"a","step":[1.5],"value":[1],"time":[1]}\n' + good[:20] + b"\n"
    got, bad = parse_segment(data)
    assert bad == parse_segment_columns(data)[1] != ""
    assert bad.startswith("line 2: TypeError: a step is not an integer; line 3:")
    assert columns(got["a"]) == ([0, 1], [1, 2], [1, 2])


def scalars(chunk: Chunk) -> Scalars:
    """A chunk as the reader hands it over (what the dashboard's curves take)."""
    return Scalars(chunk.steps.astype(np.int64), chunk.values, times_array(chunk.times))


def test_unreadable_times_are_left_out_of_time_charts_alone() -> None:
    data = line("a", [0, 1, 2], [1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    data = data.replace(b"20.0,", b"20.0.1,")
    (chunk,) = parse_segment(data)[0].values()
    curve = Curve()
    curve.add(scalars(chunk))
    steps, values = curve.by_step()
    assert steps.tolist() == [0, 1, 2] and values.tolist() == [1, 2, 3]
    times, by_time = curve.by_time()
    assert times.tolist() == [10.0, 30.0] and by_time.tolist() == [1.0, 3.0]


def test_times_that_are_not_a_flat_list_of_numbers_read_as_nan_each() -> None:
    # One time per comma-separated token, as the count checked when the line was read.
    assert np.isnan(times_array([b"[[1,2]]"])).tolist() == [True, True]
    assert np.isnan(times_array([b"[1,[2],3]"])).tolist() == [False, True, False]
    assert times_array([b"[]", b"[5]"]).tolist() == [5.0]


def test_late_points_are_sorted_by_step_then_time_parsing_the_times() -> None:
    curve = Curve()
    curve.add(scalars(parse_segment(line("a", [5, 6], [5.0, 6.0], [5.0, 6.0]))[0]["a"]))
    curve.by_step()
    curve.add(scalars(parse_segment(line("a", [6, 1], [0.5, 1.0], [0.5, 1.0]))[0]["a"]))
    steps, values = curve.by_step()
    assert steps.tolist() == [1, 5, 6, 6] and values.tolist() == [1.0, 5.0, 0.5, 6.0]
    assert curve.by_time()[0].tolist() == [0.5, 1.0, 5.0, 6.0]


# -- against the strict reader, on mutated lines --------------------------------------------

BYTES = list(b'0123456789-+.eE,[]{}":NaIfinty ')


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, char in edits:
        at = where % (len(out) + 1)
        if kind == 0 and at < len(out):
            del out[at]
        elif kind == 1:
            out.insert(at, BYTES[char % len(BYTES)])
        elif at < len(out):
            out[at] = BYTES[char % len(BYTES)]
    return bytes(out)


def json_numbers(text: bytes, count: int) -> bool:
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return (
        isinstance(parsed, list)
        and len(parsed) == count
        and all(type(x) in (int, float) for x in parsed)
    )


LEADING_ZERO = re.compile(rb"(^|[,\[-])0[0-9]")


@settings(max_examples=400, deadline=None)
@given(
    steps=st.lists(st.integers(-(2**62), 2**62) | st.integers(0, 50), min_size=0, max_size=6),
    edits=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 400), st.integers(0, 255)), max_size=3
    ),
    data=st.data(),
)
def test_every_line_reads_as_the_strict_reader_reads_it(
    steps: list[int], edits: list[tuple[int, int, int]], data: st.DataObject
) -> None:
    n = len(steps)
    finite = st.floats(allow_nan=False, allow_infinity=False)
    values = data.draw(st.lists(finite, min_size=n, max_size=n))
    times = data.draw(st.lists(finite, min_size=n, max_size=n))
    text = mutate(line("m", steps, values, times), edits)
    strict, strict_bad = parse_segment_columns(text)
    fast, fast_bad = parse_segment(text)
    event("strict reads it" if strict else "strict skips it")
    event("fast path" if segments._fast_line(text, 0, len(text) - 1) else "strict path")
    if strict:
        # Whatever the strict reader takes, the dashboard reads the same, exactly.
        assert fast_bad == strict_bad
        assert list(fast) == list(strict)
        for name, (s, v, t) in strict.items():
            got = columns(fast[name])
            assert got[0] == [float(x) for x in s]
            assert same(got[1], v) and same(got[2], t)
    elif fast:
        # What the dashboard takes beyond it: leading zeros in steps, and times that are
        # not numbers (left out of time charts). Never a value the strict reader lacks.
        (chunk,) = fast.values()
        step_text = text[text.index(b'"step":[') : text.index(b'"value":[')]
        times_text = text[text.index(b'"time":[') + 7 : text.rindex(b"]") + 1]
        assert LEADING_ZERO.search(step_text) or not json_numbers(times_text, len(chunk))
    else:
        assert fast_bad == strict_bad
