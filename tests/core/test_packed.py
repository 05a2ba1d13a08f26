"""The packed ingress of an overloaded run, and its column path: points taken as columns with
no object per point must be exactly the points ``take`` would give, in order, numbered, with
the last step of each name noted, and survive the spool unchanged."""

from __future__ import annotations

import math
import struct
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_tracker.ingress import NO_STEP, OTHER, Packed, _holds
from async_tracker.pipeline.cutter import Cutter
from async_tracker.records import TrackerMetric
from async_tracker.spool.codec import decode_batch, encode_batch

names = st.sampled_from(["loss", "acc", "lr", "grad/norm", "é", "x" * 70])
values = st.floats(allow_nan=True, allow_infinity=True)
steps = st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1)
points = st.tuples(names, values, steps, st.floats(0, 2e9))


def same_value(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def same(a: list[TrackerMetric], b: list[TrackerMetric]) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and x[2:] == y[2:] and same_value(x[1], y[1]) for x, y in zip(a, b)
    )


@given(st.lists(points, max_size=300), st.integers(1, 400))
def test_columns_are_the_points_take_gives(
    records: list[tuple[str, float, int, float]], n: int
) -> None:
    by_columns, by_records = Packed(), Packed()
    for record in records:
        by_columns.append(record)
        by_records.append(record)
    cols = by_columns.take_columns(n)
    want = by_records.take(n)
    if not want:
        assert cols is None
        return
    assert cols is not None and len(by_columns) == len(by_records)
    columnar, plain = Cutter("t"), Cutter("t")
    batch, reference = columnar.cut_columns(cols), plain.cut(want)
    assert (batch.first, batch.seq, batch.records) == (reference.first, reference.seq, len(want))
    assert columnar.last_step == plain.last_step
    assert same(batch.metrics, reference.metrics)
    # Spooled as columns, read back as the same points (the line never made an object each).
    fresh = columnar.cut_columns(cols)
    assert fresh.metric_columns() is cols
    assert same(decode_batch(encode_batch(fresh)).metrics, reference.metrics)


def test_a_step_less_point_or_another_record_leaves_the_columns_to_take() -> None:
    packed = Packed()
    packed.append(("loss", 1.0, 0, 1.0))
    packed.append(("loss", 2.0, None, 1.0))  # its step comes from the cutter's state
    assert packed.take_columns(10) is None and len(packed) == 2  # nothing taken
    packed.take(10)
    packed.append(("loss", 3.0, 5, 1.0))
    packed.extend([("metadata", ({"a": 1}, 0))])
    assert packed.take_columns(10) is None and len(packed) == 2
    assert [r[0] for r in packed.take(10)] == ["loss", "metadata"]


def test_many_names_take_the_single_pass() -> None:
    packed = Packed()
    for i in range(200):
        packed.append((f"m{i % 100}", float(i), i, 1.0))
    cutter = Cutter("t")
    cols = packed.take_columns(1000)
    assert cols is not None
    cutter.cut_columns(cols)
    assert cutter.last_step == {f"m{k}": 100 + k for k in range(100)}


@given(st.lists(st.binary(min_size=8, max_size=8), max_size=20), st.binary(min_size=8, max_size=8))
def test_holds_finds_only_aligned_items(items: list[bytes], value: bytes) -> None:
    assert _holds(b"".join(items), value) == (value in items)


def test_markers_are_what_the_column_checks_search() -> None:
    assert struct.pack("<I", OTHER) == b"\xff\xff\xff\xff"
    assert struct.unpack("<q", struct.pack("<q", NO_STEP))[0] == NO_STEP


def test_writers_racing_the_swaps_lose_nothing_and_keep_their_order() -> None:
    # Four threads write while this one takes, swapping the buffers under them hundreds of
    # times (a tiny switch interval moves the GIL between bytecodes as often as it can).
    import sys
    import threading

    packed = Packed()
    per_thread = 20_000
    start = threading.Barrier(5)

    def write(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            packed.append((f"t{t}", float(i), i, 0.0))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        start.wait()
        got: list[tuple[object, ...]] = []
        while any(th.is_alive() for th in threads) or len(packed):
            cols = packed.take_columns(997)
            got.extend(cols.points() if cols is not None else packed.take(997))
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    for t in range(4):
        assert [p[2] for p in got if p[0] == f"t{t}"] == list(range(per_thread))


@pytest.mark.skipif(
    sys.version_info[:2] != (3, 11) and sys.version_info[:2] != (3, 10),
    reason="stops at an opcode offset found on 3.10 and 3.11; 3.12 traces calls differently",
)
def test_a_write_held_between_fetching_the_buffer_and_extending_it_is_not_lost() -> None:
    # The writer stops at its last opcode in Packed.append (it has fetched the old buffer's
    # extend, and calls it next) while the loop swaps the buffers and reads the old one.
    # The loop must not read past it until the write landed: nothing is taken while the
    # writer is inside, and the late point is read once it is.
    import dis
    import sys
    import threading
    from types import FrameType
    from typing import Any

    packed = Packed()
    packed.append(("m", 0.0, 0, 0.0))
    last = max(i.offset for i in dis.get_instructions(Packed.append) if "CALL" in i.opname)
    held, release = threading.Event(), threading.Event()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode" and frame.f_code is Packed.append.__code__ and frame.f_lasti == last:
            held.set()
            release.wait(10)
        return tracer

    def write() -> None:
        sys.settrace(tracer)
        try:
            packed.append(("m", 2.0, 2, 0.0))
        finally:
            sys.settrace(None)

    packed.take(10)  # the first point; the front is now read whole
    packed.append(("m", 1.0, 1, 0.0))  # in the writers' buffer, which the writer fetches
    writer = threading.Thread(target=write)
    writer.start()
    assert held.wait(10)
    early = packed.take(10)  # swaps; the writer is inside: nothing may be read yet
    release.set()
    writer.join(10)
    late = packed.take(10)
    assert early == [] and [r[2] for r in late] == [1, 2]
