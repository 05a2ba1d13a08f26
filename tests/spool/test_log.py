"""The ordered log of one backend's batches on its own, with no lane and no backend: its
order, its two tiers and its counts, on a real spool directory.

Each test plays the lane's part by hand: it takes the head, reads it back when it is on disk
only (``load``), and says when it is done (``complete``)."""

from __future__ import annotations

from pathlib import Path

import anyio

from async_tracker.clock import Clock
from async_tracker.records import Batch, TrackerMetric
from async_tracker.settings import OverflowPolicy
from async_tracker.spool.io import InlineIO
from async_tracker.spool.log import BatchLog
from async_tracker.spool.store import Spool, new_token
from tests.spool.helpers import segments


def points(first: int, n: int) -> Batch:
    metrics = [TrackerMetric("m", float(i), i, 0.0) for i in range(first, first + n)]
    return Batch(first + n - 1, metrics=metrics, records=n, first=first, key=f"b{first}")


class Told:
    """What a log tells its reader: spool errors, and records a damaged segment lost."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.lost: list[tuple[int, str]] = []

    def error(self, message: str) -> None:
        self.errors.append(message)

    def lose(self, records: int, message: str) -> None:
        self.lost.append((records, message))


def make_log(
    spool_dir: Path,
    stamp: int,
    told: Told | None = None,
    *,
    durable: bool = False,
    memory_limit: int = 500_000,
    overflow: OverflowPolicy = "spool",
) -> BatchLog:
    """A log of its own pipeline (``stamp`` makes its token), on the real spool files."""
    told = told or Told()
    spool = Spool(spool_dir, "job", "mem", InlineIO(), new_token(stamp))
    return BatchLog(
        spool, Clock(), durable=durable, memory_limit=memory_limit, overflow=overflow,
        on_error=told.error, on_lost=told.lose,
    )


def counts(log: BatchLog) -> tuple[int, int]:
    """(memory, disk), checked against the entries themselves."""
    in_memory = sum(e.records for e in log.entries if e.segment is None)
    on_disk = sum(e.records for e in log.entries if e.segment is not None)
    assert (log.memory, log.disk) == (in_memory, on_disk)
    return log.memory, log.disk


def ack_of(log: BatchLog) -> int:
    return int((log.spool.dir / f"{log.spool.token}.ack").read_text())


def test_past_the_bound_the_spiller_moves_batches_to_disk_and_they_come_back_in_order(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        log = make_log(tmp_path, 1, memory_limit=15)
        async with anyio.create_task_group() as tg:
            tg.start_soon(log.spill_forever)
            for i in range(3):
                log.put(points(10 * i, 10))
            assert counts(log) == (30, 0)
            log.spill_soon()
            await log.wait_written()
            # One segment, its memory copies dropped: one disk-only entry in their place.
            assert counts(log) == (0, 30)
            assert len(log.entries) == 1 and log.entries[0].batch is None
            assert log.entries[0].lines == [0, 1, 2]
            [segment] = segments(tmp_path)
            head = log.head()
            assert head is not None
            await log.load(head)
            # Back in memory, one entry a batch, still counted on disk (the file is there).
            assert [(e.first, e.batch is not None) for e in log.entries] == [
                (0, True), (10, True), (20, True),
            ]
            assert counts(log) == (0, 30)
            done = []
            while (head := log.head()) is not None:
                await log.complete(head)
                done.append(head.first)
                assert log.acked == head.seq == ack_of(log)
                # The segment stays until its last line is done.
                assert segment.exists() == (head.first != 20)
            assert done == [0, 10, 20] and counts(log) == (0, 0)
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_durable_writes_each_batch_ahead_and_keeps_it_in_memory(tmp_path: Path) -> None:
    async def main() -> None:
        log = make_log(tmp_path, 1, durable=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(log.spill_forever)
            log.put(points(0, 5))
            head = log.head()
            assert head is not None and log.needs_write_ahead(head)
            log.write_ahead()
            await log.wait_written()
            assert head.segment is not None and head.batch is not None  # on disk and in memory
            assert not log.needs_write_ahead(head) and counts(log) == (0, 5)
            assert len(segments(tmp_path)) == 1
            await log.complete(head)
            assert ack_of(log) == 4 and counts(log) == (0, 0)
            assert segments(tmp_path) == []  # acked: its segment goes
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_what_a_dead_pipeline_left_goes_first_without_the_lines_it_acked(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        dead = Spool(tmp_path, "job", "mem", InlineIO(), new_token(1))
        left = [points(0, 10), points(10, 10), points(20, 10)]
        await dead.write(left)
        await dead.ack(dead.token, left[0].seq)  # it delivered the first batch, then died
        await dead.forget(dead.token)

        log = make_log(tmp_path, 2)
        log.put(points(100, 5))  # ours, accepted after everything the dead one left
        await log.adopt()
        assert not log.adopting and log.adopted_tokens() == [dead.token]
        assert counts(log) == (5, 20) and log.adopted == 20
        assert [(e.first, e.token) for e in log.entries] == [(0, dead.token), (100, None)]
        head = log.head()
        assert head is not None
        await log.load(head)
        # Only the lines its ack does not cover, in order, before ours.
        assert [e.first for e in log.entries] == [10, 20, 100]
        for _ in range(2):
            head = log.head()
            assert head is not None and head.token == dead.token
            await log.complete(head)
        assert segments(tmp_path) == [] and log.adopted_tokens() == []
        assert list(log.spool.dir.glob(f"{dead.token}*")) == []  # its ack and lock forgotten
        head = log.head()
        assert head is not None and head.first == 100
        await log.complete(head)
        assert counts(log) == (0, 0) and log.acked == 104 and log.adopted == 20

    anyio.run(main)


def test_leftovers_are_spooled_in_order_and_the_next_start_adopts_them(tmp_path: Path) -> None:
    async def main() -> None:
        log = make_log(tmp_path, 1)
        for i in range(3):
            log.put(points(5 * i, 5))
        await log.spill_leftovers()
        assert counts(log) == (0, 15) and len(segments(tmp_path)) == 1
        await log.release()

        again = make_log(tmp_path, 2)
        await again.adopt()
        assert counts(again) == (0, 15)
        head = again.head()
        assert head is not None
        await again.load(head)
        assert [e.first for e in again.entries] == [0, 5, 10]

    anyio.run(main)


def test_drop_oldest_sheds_metrics_behind_the_head_down_to_the_bound(tmp_path: Path) -> None:
    async def main() -> None:
        log = make_log(tmp_path, 1, memory_limit=10, overflow="drop_oldest")
        for i in range(3):
            log.put(points(10 * i, 10))
        assert log.shed() == 20
        # The head (maybe half written) is kept whole; the others lost their points.
        assert [e.records for e in log.entries] == [10, 0, 0] and counts(log) == (10, 0)

    anyio.run(main)


def test_a_segment_that_cannot_be_read_loses_its_records_counted_and_named(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        told = Told()
        log = make_log(tmp_path, 1, told, memory_limit=0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(log.spill_forever)
            log.put(points(0, 10))
            log.spill_soon()
            await log.wait_written()
            tg.cancel_scope.cancel()
        [segment] = segments(tmp_path)
        segment.write_bytes(b"garbage\n")
        head = log.head()
        assert head is not None and head.batch is None
        await log.load(head)
        assert not log.entries and counts(log) == (0, 0)
        assert [records for records, _ in told.lost] == [10]
        assert segment.name in told.lost[0][1]

    anyio.run(main)
