"""Parquet as the fsspec store's metric format, end to end: what a run writes (one Parquet
segment per flush, JSON for steps beyond int64), what every reader reads back (both
formats, every point exactly), compaction at close and its safety rules (a crash between
the compacted file and the removal of its inputs, overlapping compacted files, failures,
other writers' files), the scalars cursor across a compaction, and DuckDB, Polars and
pandas querying a real store in place, locally and on S3."""

from __future__ import annotations

import functools
import glob
import json
import logging
import math
import posixpath
import re
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import AsyncFsspecTracker, encode_run_id
from async_tracker.backend.fsspec import parquet as parquet_module
from async_tracker.backend.fsspec import writer as writer_module
from async_tracker.backend.fsspec.metricfiles import (
    INPUTS_KEY,
    MetricsCursor,
    compacted_name,
    inputs_metadata,
    inputs_of,
    is_compacted,
)
from async_tracker.backend.fsspec.parquet import compact, decode_segment
from async_tracker.backend.fsspec.segments import _encode_column
from async_tracker.init_run import open_store
from async_tracker.records import Batch, TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.spool.store import new_token
from async_tracker.store.reader import ScalarsRead

RUN = "proj/parquet-1"
SEGMENT = re.compile(r"\d{19}-\d{19}x[0-9a-f]+-\d{12}-[0-9a-f]{12}\.parquet")


# -- helpers ------------------------------------------------------------------------------------


def tracker(root: Path | str) -> AsyncFsspecTracker:
    store = open_store(str(root))
    assert isinstance(store, AsyncFsspecTracker)
    return store


def metrics_dir(root: Path, run_id: str = RUN) -> Path:
    return root / encode_run_id(run_id) / "metrics"


def listed(root: Path, run_id: str = RUN) -> list[str]:
    folder = metrics_dir(root, run_id)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def bits(value: float) -> bytes:
    """A float's bytes: NaN equals NaN, -0.0 differs from 0.0."""
    return struct.pack("<d", value)


def as_rows(points: Sequence[TrackerMetric]) -> list[tuple[int, bytes, float]]:
    return [(p.step, bits(p.value), p.timestamp) for p in points]


def read_metrics(store: AsyncFsspecTracker, run_id: str = RUN) -> dict[str, list[TrackerMetric]]:
    return {k: list(v) for k, v in runtime().loop.call(store.metrics, run_id).items()}


def read_scalars(
    store: AsyncFsspecTracker, since: object | None = None, run_id: str = RUN
) -> ScalarsRead:
    reader = store.reader()
    return runtime().loop.call(functools.partial(reader.scalars, run_id, None, since))


def scalar_rows(read: ScalarsRead) -> dict[str, list[tuple[int, bytes, float]]]:
    return {
        name: [
            (s, bits(v), t)
            for s, v, t in zip(c.steps.tolist(), c.values.tolist(), c.times.tolist())
        ]
        for name, c in read.curves.items()
    }


def expected_rows(points: Sequence[TrackerMetric]) -> dict[str, list[tuple[int, bytes, float]]]:
    """What a read returns of ``points`` (logged in this order): each name's, by step,
    then time (stable: write order)."""
    out: dict[str, list[TrackerMetric]] = {}
    for p in points:
        out.setdefault(p.name, []).append(p)
    return {k: as_rows(sorted(v, key=lambda p: (p.step, p.timestamp))) for k, v in out.items()}


class Writer:
    """Batches shaped as a pipeline cuts them (a key of its token, numbered records), written
    straight to a store: what several ranks of one run, or a crash, leave behind."""

    def __init__(self, store: AsyncFsspecTracker, run_id: str = RUN) -> None:
        self.store = store
        self.run_id = run_id
        self.token = new_token()
        self.next_seq = 0
        self.points: list[TrackerMetric] = []

    def key(self, seq: int) -> str:
        return f"{time.time_ns():019d}-{self.token}-{seq:012d}"

    def batch(self, points: Sequence[TrackerMetric]) -> Batch:
        first = self.next_seq
        seq = first + len(points) - 1
        self.next_seq = seq + 1
        return Batch(seq, metrics=list(points), records=len(points), first=first, key=self.key(seq))

    def write(self, points: Sequence[TrackerMetric]) -> Batch:
        batch = self.batch(points)
        self.points.extend(points)
        runtime().loop.call(self.store.write_batch, self.run_id, batch)
        return batch

    def end(self) -> None:
        seq = self.next_seq
        self.next_seq += 1
        batch = Batch(seq, first=seq, key=self.key(seq), end="finished", end_time=time.time())
        runtime().loop.call(self.store.write_batch, self.run_id, batch)


def steps_of(name: str, steps: range, value: float = 0.5) -> list[TrackerMetric]:
    return [TrackerMetric(name, value + s, s, 1.7e9 + s) for s in steps]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "runs"


# -- writing --------------------------------------------------------------------------------------

SPECIAL = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]


def log_run(root: Path, spool: Path) -> AppRun:
    """A run logged through AppRun over three flushes: special values, a step logged twice,
    a metric that starts late. Left open."""
    run = AppRun(RUN, [open_store(str(root))], spool_dir=str(spool), heartbeat_s=0)
    for step, value in enumerate(SPECIAL):
        run.log_metrics({"loss": value, "acc": step / 10}, step=step)
    assert run.flush(30).ok
    run.log_metric("loss", 1.0, step=2)  # the same step again: a second point
    run.log_metric("loss", 1.0, step=2)  # and again, the same value: a third
    assert run.flush(30).ok
    for step in range(6, 9):
        run.log_metrics({"loss": 0.25 * step, "lr": 1e-3}, step=step)
    assert run.flush(30).ok
    return run


def test_a_run_lands_as_parquet_segments_and_every_point_reads_back(
    root: Path, tmp_path: Path
) -> None:
    run = log_run(root, tmp_path / "spool")
    names = listed(root)
    assert len(names) == 3 and all(SEGMENT.fullmatch(n) for n in names), names
    data = (metrics_dir(root) / names[0]).read_bytes()
    assert data[:4] == b"PAR1"
    (loss,) = [c for n, c in decode_segment(data)[0].items() if n == "loss"]
    assert loss.writers is not None and set(loss.writers.tolist()) == {names[0].split("-")[1]}

    store = tracker(root)
    got = read_metrics(store)
    assert set(got) == {"loss", "acc", "lr"}
    loss_rows = [(p.step, bits(p.value)) for p in got["loss"]]
    assert loss_rows == [
        (0, bits(math.nan)), (1, bits(math.inf)), (2, bits(-math.inf)), (2, bits(1.0)),
        (2, bits(1.0)), (3, bits(-0.0)), (4, bits(5e-324)), (5, bits(1.7976931348623157e308)),
        (6, bits(1.5)), (7, bits(1.75)), (8, bits(2.0)),
    ]  # fmt: skip
    assert [p.step for p in got["lr"]] == [6, 7, 8]
    assert all(isinstance(p.step, int) and isinstance(p.timestamp, float) for p in got["loss"])
    # The scalars read the same points, columns for columns.
    scalars = read_scalars(store)
    assert scalars.reset
    assert scalar_rows(scalars) == {k: as_rows(v) for k, v in got.items()}
    assert scalars.curves["loss"].steps.dtype.name == "int64"
    assert scalars.curves["loss"].values.dtype.name == "float64"

    # Closing compacts the three segments into one file holding them all.
    assert run.close(30).ok
    (compacted,) = listed(root)
    assert is_compacted(compacted) and compacted.split("-")[:2] == names[0].split("-")[:2]
    assert inputs_of((metrics_dir(root) / compacted).read_bytes()) == frozenset(names)
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == {
        k: as_rows(v) for k, v in got.items()
    }
    assert scalar_rows(read_scalars(store)) == scalar_rows(scalars)
    summary = runtime().loop.call(store.reader().run_summary, RUN)
    assert summary is not None and summary.metrics["loss"].count == 11


def test_a_replayed_batch_overwrites_its_segment(root: Path) -> None:
    store = tracker(root)
    w = Writer(store)
    batch = w.write(steps_of("loss", range(5)))
    (name,) = listed(root)
    # The process died before the ack: another process replays the batch from its log.
    again = Batch(
        batch.seq, metrics=list(batch.metrics), records=batch.records, first=batch.first,
        key=batch.key,
    )  # fmt: skip
    runtime().loop.call(tracker(root).write_batch, RUN, again)
    assert listed(root) == [name]
    assert len(read_metrics(store)["loss"]) == 5


def test_steps_beyond_int64_make_a_json_segment_read_with_the_rest(root: Path) -> None:
    store = tracker(root)
    w = Writer(store)
    w.write(steps_of("loss", range(3)))
    # 2**63 and 2**64 - 1 fit orjson's integers; 2**70 does not (it reads it as a float).
    huge = [TrackerMetric("loss", 9.0, 2**63, 1.8e9), TrackerMetric("big", 1.0, 2**64 - 1, 1.8e9),
            TrackerMetric("big", 2.0, 2**70, 1.8e9)]  # fmt: skip
    w.write(huge)
    names = listed(root)
    assert [n.rsplit(".", 1)[1] for n in names] == ["parquet", "jsonl"]
    got = read_metrics(store)
    assert [p.step for p in got["loss"]] == [0, 1, 2, 2**63]
    assert [p.step for p in got["big"]] == [2**64 - 1, 2**70]
    # Compaction takes the Parquet segments alone; the JSON one stays and is read.
    w.write(steps_of("loss", range(3, 5)))
    w.end()
    after = listed(root)
    assert len(after) == 2 and is_compacted(after[0]) and after[1] == names[1]
    assert [p.step for p in read_metrics(store)["loss"]] == [0, 1, 2, 3, 4, 2**63]


def test_a_store_of_json_and_parquet_segments_reads_both(root: Path, tmp_path: Path) -> None:
    # What an older version wrote: JSON Lines segments, in the same run's folder.
    folder = metrics_dir(root)
    folder.mkdir(parents=True)
    old_key = f"{time.time_ns() - 10**9:019d}-{new_token()}-{3:012d}"
    old = [
        TrackerMetric("loss", v, s, 1.6e9 + s) for s, v in enumerate([2.0, math.nan, math.inf])
    ]
    line = _encode_column("loss", [0, 1, 2], [2.0, math.nan, math.inf], [1.6e9, 1.6e9 + 1,
                          1.6e9 + 2], "test")  # fmt: skip
    (folder / f"{old_key}-0123456789ab.jsonl").write_bytes(line)
    run = AppRun(RUN, [open_store(str(root))], spool_dir=str(tmp_path / "spool"), heartbeat_s=0)
    for step in range(3, 6):
        run.log_metric("loss", step / 10, step=step)
    assert run.close(30).ok
    names = listed(root)
    assert names[0].endswith(".jsonl") and len(names) == 2 and names[1].endswith(".parquet")
    store = tracker(root)
    got = read_metrics(store)
    assert [(p.step, bits(p.value)) for p in got["loss"]] == [
        (p.step, bits(p.value)) for p in old
    ] + [(s, bits(s / 10)) for s in range(3, 6)]
    assert scalar_rows(read_scalars(store)) == {"loss": as_rows(got["loss"])}


# -- compaction -----------------------------------------------------------------------------------


def test_compaction_at_close_leaves_one_file_per_writer_and_never_takes_anothers(
    root: Path,
) -> None:
    store = tracker(root)
    rank0, rank1 = Writer(store), Writer(store)
    for k in range(3):
        rank0.write(steps_of("loss", range(10 * k, 10 * k + 10)))
        rank1.write(steps_of("loss", range(10 * k, 10 * k + 10), value=100.0))
    # A direct call's segment: no pipeline's, never compacted.
    runtime().loop.call(store.add_metrics, RUN, steps_of("direct", range(2)))
    before = listed(root)
    assert len(before) == 7
    rank0.end()
    after = listed(root)
    mine = [n for n in after if rank0.token in n]
    (compacted,) = mine
    assert is_compacted(compacted)
    # rank1's segments and the direct call's are untouched: not rank0's to compact.
    assert [n for n in after if rank0.token not in n] == [n for n in before if rank0.token not in n]
    rank1.end()
    final = listed(root)
    assert len(final) == 3 and sum(is_compacted(n) for n in final) == 2
    expected = expected_rows([*rank0.points, *rank1.points, *steps_of("direct", range(2))])
    got = {k: as_rows(v) for k, v in read_metrics(store).items()}
    assert sorted(got["loss"]) == sorted(expected["loss"]) and len(got["loss"]) == 60
    assert got["direct"] == expected["direct"]
    # Each compacted file holds one writer's rows, in its order.
    for name, w in ((n, w) for w in (rank0, rank1) for n in final if w.token in n):
        (loss,) = decode_segment((metrics_dir(root) / name).read_bytes())[0].values()
        assert loss.seqs is not None and loss.seqs.tolist() == list(range(30))
        assert loss.writers is not None and set(loss.writers.tolist()) == {w.token}


def test_parts_of_a_split_batch_are_told_apart_and_compacted(root: Path) -> None:
    store = tracker(root)
    w = Writer(store)
    w.write(steps_of("loss", range(5)))
    # The lane split a batch to find a refused record: the parts keep its numbers (first,
    # seq) and get keys of their own.
    batch = w.batch(steps_of("loss", range(5, 15)))
    parts = []
    for i, points in enumerate((batch.metrics[:4], batch.metrics[4:])):
        part = Batch(batch.seq, metrics=list(points), records=len(points), first=batch.first,
                     key=f"{batch.key}.{i}")  # fmt: skip
        runtime().loop.call(store.write_batch, RUN, part)
        parts.append(part)
        w.points.extend(points)
    assert len(listed(root)) == 3
    ids = set()
    for name in listed(root):
        for col in decode_segment((metrics_dir(root) / name).read_bytes())[0].values():
            assert col.writers is not None and col.seqs is not None
            ids.update(zip(col.writers.tolist(), col.seqs.tolist()))
    assert len(ids) == 15  # (writer, seq) one point's, in every part
    assert {f"{w.token}.0", f"{w.token}.1"} <= {writer for writer, _ in ids}
    folder = metrics_dir(root)
    s = listed(root)
    # Two compactions sharing the first segment, one with each part: every point once.
    for names in ([s[0], s[1]], [s[0], s[2]]):
        data = compact([(folder / n).read_bytes() for n in names], metadata=inputs_metadata(names))
        (folder / compacted_name(names)).write_bytes(data)
    want = expected_rows(w.points)
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == want
    assert scalar_rows(read_scalars(store)) == want
    w.end()
    (left,) = listed(root)
    assert is_compacted(left)
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == want


def test_a_crash_after_the_compacted_file_before_removing_inputs_reads_every_point_once(
    root: Path,
) -> None:
    store = tracker(root)
    w = Writer(store)
    for k in range(3):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)))
    inputs = listed(root)
    # What a compaction writes, left beside its inputs (the process died before removing them).
    data = compact(
        [(metrics_dir(root) / n).read_bytes() for n in inputs], metadata=inputs_metadata(inputs)
    )
    (metrics_dir(root) / compacted_name(inputs)).write_bytes(data)
    assert len(listed(root)) == 4
    want = expected_rows(w.points)
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == want
    read = read_scalars(store)
    assert scalar_rows(read) == want
    # A later life of the writer's end batch (a replay) finishes the compaction.
    w.end()
    (left,) = listed(root)
    assert left == compacted_name(inputs)
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == want


def test_a_failure_removing_the_inputs_fails_nothing_and_doubles_nothing(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = tracker(root)
    w = Writer(store)
    for k in range(3):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)))
    storage = store._writer._storage

    async def broken(paths: Sequence[str]) -> None:
        raise OSError("the disk went away")

    monkeypatch.setattr(storage, "rm_many", broken)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        w.end()  # the end batch is stored: compaction is not part of it
    assert any("not compacted" in r.getMessage() for r in caplog.records)
    assert len(listed(root)) == 4 and sum(map(is_compacted, listed(root))) == 1
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == expected_rows(w.points)
    assert runtime().loop.call(store.run_status, RUN)[0] == "finished"


def test_a_compaction_that_fails_keeps_every_segment(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = tracker(root)
    w = Writer(store)
    w.write(steps_of("loss", range(5)))
    w.write(steps_of("loss", range(5, 10)))
    before = listed(root)

    def failing(*args: object, **kwargs: object) -> bytes:
        raise MemoryError("no room to compact")

    # The writer imports the codec at its compaction (numpy and pyarrow load lazily).
    monkeypatch.setattr(parquet_module, "compact", failing)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        w.end()
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "not compacted" in warning.getMessage() and "MemoryError" in warning.getMessage()
    assert listed(root) == before
    assert len(read_metrics(store)["loss"]) == 10


def test_a_compaction_out_of_time_is_given_up_and_keeps_every_segment(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = tracker(root)
    w = Writer(store)
    w.write(steps_of("loss", range(5)))
    w.write(steps_of("loss", range(5, 10)))
    before = listed(root)
    monkeypatch.setattr(writer_module, "COMPACTION_BUDGET_S", 0.0)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        w.end()
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "not compacted within" in warning.getMessage()
    assert listed(root) == before
    assert runtime().loop.call(store.run_status, RUN)[0] == "finished"
    assert len(read_metrics(store)["loss"]) == 10


def test_a_segment_that_does_not_read_whole_is_left_out_of_the_compaction(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tracker(root)
    w = Writer(store)
    for k in range(3):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)))
    bad = listed(root)[1]
    path = metrics_dir(root) / bad
    path.write_bytes(path.read_bytes()[:-30])  # truncated: no footer
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        w.end()
    after = listed(root)
    assert bad in after and len(after) == 2
    assert str(path) in caplog.records[0].getMessage()
    assert [p.step for p in read_metrics(store)["loss"]] == [*range(10), *range(20, 30)]


def test_overlapping_compacted_files_keep_one_row_per_writer_and_seq(root: Path) -> None:
    store = tracker(root)
    w = Writer(store)
    for k in range(4):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)) + steps_of("acc", range(k, k + 1)))
    s = listed(root)
    folder = metrics_dir(root)

    def compacted(names: list[str]) -> None:
        data = compact([(folder / n).read_bytes() for n in names], metadata=inputs_metadata(names))
        (folder / compacted_name(names)).write_bytes(data)

    # Two processes compacted the writer's files from different listings; then died.
    compacted(s[:3])
    compacted(s[1:])
    assert len(listed(root)) == 6
    want = expected_rows(w.points)
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == want
    assert scalar_rows(read_scalars(store)) == want
    # Their inputs gone, the two files alone still read every point once.
    for name in s:
        (folder / name).unlink()
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == want
    first = read_scalars(store)
    assert scalar_rows(first) == want
    # And the writer's next compaction takes both into one.
    w.end()
    (left,) = listed(root)
    assert inputs_of((folder / left).read_bytes()) >= set(s)
    assert {k: as_rows(v) for k, v in read_metrics(store).items()} == want
    again = read_scalars(store, first.cursor)
    assert again.reset and scalar_rows(again) == want


# -- corrupt and foreign files --------------------------------------------------------------------


def test_a_corrupt_parquet_file_is_skipped_with_one_warning(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = log_run(root, tmp_path / "spool")
    folder = metrics_dir(root)
    garbage = folder / "0000000000000000001-x-000001.parquet"
    garbage.write_bytes(b"PAR1 not really PAR1")
    store = tracker(root)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        got = read_metrics(store)
    (warning,) = caplog.records
    assert str(garbage) in warning.getMessage()
    assert len(got["loss"]) == 11
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        read = read_scalars(store)
    (warning,) = caplog.records
    assert str(garbage) in warning.getMessage() and len(read.curves["loss"]) == 11
    caplog.clear()
    # A later read after the cursor does not read (nor warn about) it again.
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        later = read_scalars(store, read.cursor)
    assert caplog.records == [] and later.curves == {} and not later.reset
    garbage.unlink()
    assert run.close(30).ok


def test_a_compacted_file_that_cannot_be_read_covers_nothing(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tracker(root)
    w = Writer(store)
    for k in range(2):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)))
    inputs = listed(root)
    folder = metrics_dir(root)
    data = compact([(folder / n).read_bytes() for n in inputs], metadata=inputs_metadata(inputs))
    # Its footer (which names the inputs) reads; its pages do not.
    pages = pq.read_metadata(pa.BufferReader(data)).row_group(0).column(2)  # step
    start = pages.dictionary_page_offset or pages.data_page_offset
    broken = data[:start] + bytes(32) + data[start + 32 :]
    assert inputs_of(broken) == frozenset(inputs)
    target = folder / compacted_name(inputs)
    target.write_bytes(broken)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        got = read_metrics(store)
        read = read_scalars(store)
    assert [r.getMessage().count(str(target)) for r in caplog.records] == [1, 1]
    assert {k: as_rows(v) for k, v in got.items()} == expected_rows(w.points)
    assert scalar_rows(read) == expected_rows(w.points)


# -- the scalars cursor ---------------------------------------------------------------------------


def test_the_scalars_cursor_follows_a_run_and_resets_across_its_compaction(
    root: Path, tmp_path: Path
) -> None:
    run = AppRun(RUN, [open_store(str(root))], spool_dir=str(tmp_path / "spool"), heartbeat_s=0)
    store = tracker(root)
    for step in range(3):
        run.log_metric("loss", step / 10, step=step)
    assert run.flush(30).ok
    first = read_scalars(store)
    assert first.reset and first.curves["loss"].steps.tolist() == [0, 1, 2]
    assert isinstance(first.cursor, MetricsCursor)
    same = read_scalars(store, first.cursor)
    assert not same.reset and same.curves == {}
    run.log_metrics({"loss": 0.5, "acc": 0.9}, step=3)
    assert run.flush(30).ok
    new = read_scalars(store, first.cursor)
    assert not new.reset
    assert {k: v.steps.tolist() for k, v in new.curves.items()} == {"loss": [3], "acc": [3]}
    assert run.close(30).ok  # two segments compacted into one
    after = read_scalars(store, new.cursor)
    assert after.reset
    assert {k: v.steps.tolist() for k, v in after.curves.items()} == {
        "loss": [0, 1, 2, 3], "acc": [3]
    }
    settled = read_scalars(store, after.cursor)
    assert not settled.reset and settled.curves == {}
    # A cursor of another kind (an older reader's) reads everything.
    assert read_scalars(store, frozenset()).reset


def test_scalars_read_only_the_metrics_asked_for(root: Path) -> None:
    store = tracker(root)
    w = Writer(store)
    w.write(steps_of("loss", range(5)) + steps_of("acc", range(5)) + steps_of("lr", range(2)))
    reader = store.reader()
    read = runtime().loop.call(reader.scalars, RUN, ["acc"])
    assert list(read.curves) == ["acc"] and read.curves["acc"].steps.tolist() == list(range(5))


# -- DuckDB, Polars and pandas, in place ----------------------------------------------------------


def write_runs(store: str, spool: Path) -> tuple[dict[str, float], AppRun]:
    """Three runs, each over a few flushes, the last one left open (its segments not
    compacted yet, which the queries read as well); the last value of ``loss`` of each run,
    and the open run."""
    last: dict[str, float] = {}
    for r in range(3):
        run = AppRun(f"proj/r{r}", [open_store(store)], spool_dir=str(spool / str(r)),
                     heartbeat_s=0)  # fmt: skip
        for step in range(12):
            run.log_metrics({"loss": 10.0 * r + 1.0 / (step + 1), "acc": step / 12}, step=step)
            if step % 5 == 4:
                assert run.flush(30).ok
        assert run.flush(30).ok
        last[f"proj/r{r}"] = 10.0 * r + 1.0 / 12
        if r < 2:
            assert run.close(30).ok
    return last, run


def duckdb_last_loss(con: Any, files: str) -> dict[str, float]:
    rows = con.execute(
        f"""
        SELECT run, arg_max(value, (step, time)) AS last_loss
        FROM read_parquet('{files}')
        WHERE name = 'loss'
        GROUP BY run
        """
    ).fetchall()
    return dict(rows)


def polars_last_loss(frame: Any) -> dict[str, float]:
    pl = pytest.importorskip("polars")
    last = (
        frame.filter(pl.col("name") == "loss")
        .group_by("run")
        .agg(pl.col("value").sort_by(["step", "time"]).last().alias("last_loss"))
        .collect()
    )
    return {row["run"]: row["last_loss"] for row in last.iter_rows(named=True)}


def pandas_last_loss(frame: Any) -> dict[str, float]:
    loss = frame[frame["name"] == "loss"].sort_values(["run", "step", "time"])
    return dict(loss.drop_duplicates("run", keep="last").set_index("run")["value"])


def test_duckdb_and_polars_query_a_local_store_in_place(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    root = tmp_path / "runs"
    expected, open_run = write_runs(str(root), tmp_path / "spool")
    files = f"{root}/*/metrics/*.parquet"
    with duckdb.connect() as con:
        assert duckdb_last_loss(con, files) == expected
    assert polars_last_loss(pl.scan_parquet(files)) == expected
    assert open_run.close(30).ok
    with duckdb.connect() as con:
        assert duckdb_last_loss(con, files) == expected


@pytest.mark.server  # pandas is the dataframe extra, not in [test]
def test_pandas_queries_a_local_store_in_place(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    root = tmp_path / "runs"
    expected, open_run = write_runs(str(root), tmp_path / "spool")
    frame = pd.read_parquet(sorted(glob.glob(f"{root}/*/metrics/*.parquet")))
    assert pandas_last_loss(frame) == expected
    assert open_run.close(30).ok


@pytest.fixture
def s3_store(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """``s3://<fresh bucket>/runs`` on moto's server, and an s3fs filesystem on it."""
    s3fs = pytest.importorskip("s3fs")
    from tests.fsspec.conftest import make_bucket

    options = {
        "key": "testing", "secret": "testing", "skip_instance_cache": True,
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }  # fmt: skip
    monkeypatch.setitem(fsspec.config.conf, "s3", options)
    yield f"s3://{make_bucket(s3_endpoint)}/runs", s3fs.S3FileSystem(**options)


def test_duckdb_polars_and_pandas_query_a_store_on_s3_in_place(
    s3_store: tuple[str, Any], s3_endpoint: str, tmp_path: Path
) -> None:
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    pd = pytest.importorskip("pandas")
    url, fs = s3_store
    expected, open_run = write_runs(url, tmp_path / "spool")
    assert open_run.close(30).ok
    files = f"{url}/*/metrics/*.parquet"
    # DuckDB through fsspec (no httpfs extension to download here).
    with duckdb.connect() as con:
        con.register_filesystem(fs)
        assert duckdb_last_loss(con, files) == expected
    # Polars through its own object store client.
    storage_options = {
        "aws_endpoint_url": s3_endpoint, "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing", "aws_region": "us-east-1", "aws_allow_http": "true",
    }  # fmt: skip
    assert polars_last_loss(pl.scan_parquet(files, storage_options=storage_options)) == expected
    # pandas (pyarrow) through fsspec: the files the glob finds.
    paths = fs.glob(files)
    assert paths and all(posixpath.basename(p).endswith(".parquet") for p in paths)
    assert pandas_last_loss(pd.read_parquet(paths, filesystem=fs)) == expected
    # And the store's own reader on S3 reads what it wrote.
    store = tracker(url)
    got = read_metrics(store, "proj/r1")
    assert [p.step for p in got["loss"]] == list(range(12))
    assert scalar_rows(read_scalars(store, run_id="proj/r1")) == {
        k: as_rows(v) for k, v in got.items()
    }


def test_inputs_are_recorded_in_the_compacted_files_metadata(root: Path) -> None:
    store = tracker(root)
    w = Writer(store)
    w.write(steps_of("loss", range(3)))
    w.write(steps_of("loss", range(3, 6)))
    inputs = listed(root)
    w.end()
    (name,) = listed(root)
    meta = pq.read_metadata(pa.BufferReader((metrics_dir(root) / name).read_bytes())).metadata
    assert sorted(json.loads(meta[INPUTS_KEY.encode()])) == inputs
    assert meta[b"async_tracker.format"] == b"metrics/1"


NO_PANDAS = """
import sys

asked = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            asked.append(name)
        return None

sys.meta_path.insert(0, Watch())
from async_tracker import AppRun
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime

root, spool = sys.argv[1], sys.argv[2]
run = AppRun("r/1", [open_store(root)], spool_dir=spool, heartbeat_s=0)
for step in range(20):
    run.log_metric("loss", 1.0 / (step + 1), step=step)
    if step % 7 == 0:
        assert run.flush(30).ok
assert run.close(30).ok
store = open_store(root)
assert len(runtime().loop.call(store.metrics, "r/1")["loss"]) == 20
assert len(runtime().loop.call(store.reader().scalars, "r/1").curves["loss"]) == 20
print(bool(asked) or "pandas" in sys.modules, flush=True)
"""


def test_writing_compacting_and_reading_never_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas the first time some of its calls meet Python or numpy objects
    (``pa.array``, ``to_numpy``): half a second on the tracker's thread, and a process that
    imports pandas off its main thread aborts at exit. The store makes none of those calls."""
    import subprocess
    import sys

    from tests.core.helpers import python_env

    done = subprocess.run(
        [sys.executable, "-c", NO_PANDAS, str(tmp_path / "runs"), str(tmp_path / "spool")],
        env=python_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


LAZY_PARQUET = """
import sys

def loaded():
    return sorted(m for m in ("numpy", "pyarrow", "pandas") if m in sys.modules)

import async_tracker, async_tracker.cli.main
from async_tracker import AppRun
from async_tracker.backend.fsspec import AsyncFsspecTracker
from async_tracker.init_run import open_store

root, spool = sys.argv[1], sys.argv[2]
store = open_store(root)
assert isinstance(store, AsyncFsspecTracker), store
print(loaded(), flush=True)
with AppRun("r/1", [store], spool_dir=spool, heartbeat_s=0) as run:
    run.add_metadata(lr=0.01)
print(loaded(), flush=True)
with AppRun("r/2", [store], spool_dir=spool, heartbeat_s=0) as run:
    run.log_metric("loss", 0.5, step=1)
print(loaded(), flush=True)
"""


def test_the_package_loads_neither_numpy_nor_pyarrow_and_a_store_loads_them_when_made(
    tmp_path: Path,
) -> None:
    """``import async_tracker`` (and the CLI's module) loads neither numpy nor pyarrow (a
    quarter of the import's time); a store, when it is made, does, on the caller's thread
    (an import of pyarrow on the tracker's thread would change how a Ctrl-C'd process
    exits)."""
    import subprocess
    import sys

    from tests.core.helpers import python_env

    done = subprocess.run(
        [sys.executable, "-c", LAZY_PARQUET, str(tmp_path / "runs"), str(tmp_path / "spool")],
        env=python_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    codec = "['numpy', 'pyarrow']"
    assert done.stdout.split("\n")[:3] == [codec, codec, codec], done.stdout
