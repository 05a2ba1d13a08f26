"""The spool under faults that touch its counts and its files: a dead pipeline's segment
half-delivered before it died, and a disk that fills up in the middle of a write."""

from __future__ import annotations

import builtins
import errno
from pathlib import Path
from typing import IO, Any

import anyio
import pytest

import async_tracker.spool.store
from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.records import Batch, TrackerMetric
from async_tracker.spool.io import InlineIO
from async_tracker.spool.store import Spool, new_token
from tests.faulty import FaultyTracker, Hang
from tests.spool.helpers import NO_WAIT, segments


def points(first: int, n: int) -> Batch:
    metrics = [TrackerMetric("m", float(i), i, 0.0) for i in range(first, first + n)]
    return Batch(first + n - 1, metrics=metrics, records=n, first=first, key=f"b{first}")


async def leave(spool_dir: Path, run_id: str, stamp: int, batches: list[Batch], ack: int) -> None:
    """What a pipeline that ended leaves: one segment of ``batches``, its ack at ``ack`` (-1:
    none), and no lock (a crash, or a close whose backend was down)."""
    spool = Spool(spool_dir, run_id, "mem", InlineIO(), new_token(stamp))
    await spool.write(batches)
    if ack >= 0:
        await spool.ack(spool.token, ack)
    await spool.forget(spool.token)


def test_a_half_delivered_segment_of_a_dead_pipeline_is_counted_once(tmp_path: Path) -> None:
    # Two dead pipelines: the older left 10 records nobody delivered; the newer a segment of
    # three batches whose first two it delivered (its ack) before it died. A new start owes
    # 20 records, not 40: the acked ones were counted delivered by the pipeline that sent them.
    spool = tmp_path / "spool"
    anyio.run(leave, spool, "job", 1, [points(0, 10)], -1)
    newer = [points(10, 10), points(20, 10), points(30, 10)]
    anyio.run(leave, spool, "job", 2, newer, newer[1].seq)
    hung = FaultyTracker(InMemoryTracker(), name="mem").always("write_batch", Hang())
    run = AppRun("job", [hung], spool_dir=str(spool), retry=NO_WAIT, flush_interval=3600)
    # The replay hangs on the older pipeline's batch: the newer one's segment waits unread.
    assert hung.wait_for("write_batch", 1, timeout=60)
    report = run.close(0.2)
    assert report.spooled == 20 and report.delivered == report.pending == 0, report
    # And the next start delivers those 20, once, in order.
    mem = InMemoryTracker(name="mem")
    again = AppRun("job", [mem], spool_dir=str(spool), retry=NO_WAIT, flush_interval=3600)
    report = again.close(30)
    assert report.ok and report.delivered == 20, report
    assert [p.step for p in mem.points("job", "m")] == list(range(10)) + list(range(30, 40))
    assert segments(spool) == []


class _FullDisk:
    """A file opened for writing on a disk with ``room`` bytes left: writes past it store
    what fits, then raise ENOSPC, as a full file system does."""

    def __init__(self, f: IO[bytes], room: int) -> None:
        self.f = f
        self.room = room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.f.write(data[: self.room])
            self.f.flush()
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.f.write(data)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def test_a_full_disk_leaves_no_temporary_file_after_a_clean_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"

    def full_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = builtins.open(file, mode, *args, **kwargs)  # noqa: SIM115 - _FullDisk closes it
        return _FullDisk(f, room=64) if "w" in mode else f

    # The spool's segment writes open their file through the module's name ``open``.
    monkeypatch.setattr(async_tracker.spool.store, "open", full_open, raising=False)
    hung = FaultyTracker(InMemoryTracker(), name="mem").always("write_batch", Hang())
    run = AppRun("full", [hung], spool_dir=str(spool), retry=NO_WAIT, flush_interval=3600)
    for i in range(50):
        run.log_metric("m", float(i), step=i)
    run.flush(0)
    assert hung.wait_for("write_batch", 1, timeout=60)
    report = run.close(0.2)  # the backend hangs: the close spools, and the disk is full
    # Nothing accepted is lost silently: the records are counted as not delivered.
    assert report.pending == 50 and report.spooled == 0 and not report.ok, report
    assert "No space left" in report.errors["mem"], report
    left = [p.name for p in spool.rglob("*") if p.is_file()]
    assert not [n for n in left if n.endswith(".tmp")], left
    assert segments(spool) == []
