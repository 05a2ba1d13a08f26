"""Writes to the spool that a close gives up: each takes effect at one commit point (the
rename on the spool thread), so a write given up either took effect, and its records are
counted on disk, or never will, and they are counted in memory. Never both, never neither.

The spool thread is played by the test (:class:`HeldIO`): it decides when the job runs
relative to the moment the loop's await is cancelled (a close's deadline) or the log is
fenced (a close whose caller stopped waiting for a stuck loop)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from async_tracker.clock import Clock
from async_tracker.records import Batch
from async_tracker.spool.io import InlineIO, SpoolIO
from async_tracker.spool.log import BatchLog
from async_tracker.spool.store import Abandoned, Commit, Spool, new_token
from tests.spool.helpers import segments
from tests.spool.test_log import make_log, points

T = TypeVar("T")


class HeldIO(SpoolIO):
    """A spool thread the test runs by hand: each job waits in ``jobs`` until the test calls
    :meth:`run_job`, and the loop's await of it returns only once ``answered`` is set."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[..., Any], tuple[Any, ...], list[object]]] = []
        self.handed = anyio.Event()
        self.answered = anyio.Event()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        box: list[object] = []
        self.jobs.append((fn, args, box))
        self.handed.set()
        await self.answered.wait()  # cancellable: a close that stops waiting
        (outcome,) = box
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]

    def run_job(self) -> None:
        """Runs the oldest job as the spool thread would, whoever still waits for it."""
        fn, args, box = self.jobs.pop(0)
        try:
            box.append(fn(*args))
        except Exception as exc:
            box.append(exc)


def held_log(spool_dir: Path) -> tuple[BatchLog, HeldIO]:
    io = HeldIO()
    log = BatchLog(Spool(spool_dir, "job", "mem", io, new_token(1)), Clock())
    for i in range(3):
        log.put(points(10 * i, 10))
    return log, io


def test_commit_decides_once_between_the_spool_thread_and_who_gives_up() -> None:
    given_up, committed = Commit(), Commit()
    assert given_up.abandon() and not given_up.commit() and given_up.abandon()
    assert committed.commit() and not committed.abandon()
    assert committed.apply() and not committed.apply()  # counted once
    assert not given_up.apply()


@pytest.mark.parametrize("job_runs", ["after", "before"])
def test_a_write_cut_off_by_a_close_is_on_disk_exactly_when_counted_so(
    tmp_path: Path, job_runs: str
) -> None:
    async def main() -> None:
        log, io = held_log(tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(log.spill_leftovers)
            await io.handed.wait()
            if job_runs == "before":
                io.run_job()  # the spool thread renamed the segment; the loop has not heard
            tg.cancel_scope.cancel()  # the close's deadline
        if job_runs == "after":
            with pytest.raises(Abandoned):
                fn, args, _ = io.jobs[0]
                fn(*args)  # the spool thread gets to it late: it must not take effect
        on_disk = len(segments(tmp_path))
        assert on_disk == (job_runs == "before")
        assert (log.memory, log.disk) == ((0, 30) if on_disk else (30, 0))

    anyio.run(main)


@pytest.mark.parametrize("job_runs", ["after", "before"])
def test_a_fence_gives_up_a_write_under_way_or_counts_it_on_disk(
    tmp_path: Path, job_runs: str
) -> None:
    async def main() -> None:
        log, io = held_log(tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(log.spill_leftovers)
            await io.handed.wait()
            if job_runs == "before":
                io.run_job()
            log.fence()  # as a caller's thread does, the loop being held meanwhile
            if job_runs == "after":
                io.run_job()  # given up at its commit point: raises, leaves no file
            on_disk = len(segments(tmp_path))
            assert on_disk == (job_runs == "before")
            # (records, end records) in memory only, and on disk
            expected = ((0, 0), (30, 0)) if on_disk else ((30, 0), (0, 0))
            assert (log.memory_count(), log.disk_count()) == expected
            # The loop runs again: it hears how the write ended, and moves nothing.
            io.answered.set()
        assert (log.memory_count(), log.disk_count()) == expected
        assert len(segments(tmp_path)) == on_disk

    anyio.run(main)


def test_leftovers_that_cannot_all_be_written_in_time_begin_with_the_end_record(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        log = make_log(tmp_path, 1)
        for i in range(3):
            log.put(points(10 * i, 10))
        log.put(Batch(30, first=30, key="end", end="finished"))  # the run's end record
        assert isinstance(log.spool.io, InlineIO)
        # What the log's writes have shown: far too slow for the time left.
        log.s_per_record = 1.0
        until = log.clock.now() + 5.0
        await log.spill_leftovers(until)
        # The end record alone made it (one short line, first); the records stay in memory.
        assert (log.memory, log.ends_memory, log.disk, log.ends_disk) == (30, 0, 0, 1)
        [segment] = segments(tmp_path)
        assert segment.name.split("-")[1:4] == ["30", "30", "0"]

    anyio.run(main)
