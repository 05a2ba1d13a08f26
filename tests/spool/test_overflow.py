"""Overload: a run holding more than ``max_buffered`` records, under each overflow policy.

Each test stalls the backend on its first batch (a ``Hang``), fills the run past its bound,
and drives the flusher with ``flush(0)``, which cuts what is buffered and looks at the bound.
"""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

import anyio
import pytest

from async_tracker import AppRun, TrackerClosedError
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.pipeline.cutter import Cutter
from async_tracker.pipeline.overflow import Block
from async_tracker.records import Batch, TrackerMetric
from async_tracker.settings import RunOptions
from async_tracker.spool.codec import decode_batch, encode_batch
from tests.core.helpers import wait_until
from tests.faulty import FaultyTracker, Hang
from tests.spool.helpers import segments


def stalled_run(
    tmp_path: Path, release: threading.Event, **options: object
) -> tuple[AppRun, FaultyTracker, InMemoryTracker]:
    """A run whose backend hangs on its first batch (the first 50 points) until released."""
    mem = InMemoryTracker()
    backend = FaultyTracker(mem, name="slow").on("write_batch", 1, action=Hang(release))
    run = AppRun("over", [backend], spool_dir=str(tmp_path), max_buffered=100, batch_size=10,
                 flush_interval=3600, **options)  # type: ignore[arg-type]
    for i in range(50):
        run.log_metric("m", float(i), i)
    run.flush(0)
    assert backend.wait_for("write_batch", 1)
    return run, backend, mem


def waiting_for_room(writer: threading.Thread) -> bool:
    """Whether ``writer`` is inside the block policy's wait for room (its wait timed from
    before): its innermost frame in ``threading``, called from ``Block.wait_for_room``."""
    frame = sys._current_frames().get(writer.ident or -1)
    if frame is None or frame.f_code.co_filename != threading.__file__:
        return False
    while frame is not None and frame.f_code is not Block.wait_for_room.__code__:
        frame = frame.f_back
    return frame is not None


def overload(run: AppRun) -> None:
    """Steps 50 to 149 on top of stalled_run's 50: 150 records held, past half the bound."""
    for i in range(50, 150):
        run.log_metric("m", float(i), i)
    run.flush(0)
    assert run.status().overloaded


def test_spool_policy_takes_writes_past_the_bound_to_disk_and_back_in_order(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    run, _, mem = stalled_run(tmp_path, release)
    for i in range(50, 200):
        run.log_metric("m", float(i), i)
        run.log_metric("auto", float(i))  # steps resolved across the switch: 0, 1, 2 ...
    run.flush(0)
    assert run.status().overloaded

    # Overloaded: what the lane holds behind the stuck batch goes to disk, in its place.
    for i in range(200, 300):
        run.log_metric("m", float(i), i)
        run.log_metric("auto", float(i))
    run.add_metadata(last=299)
    run.flush(0)

    def within_bound() -> bool:  # at most max_buffered in memory (packed or not), the rest on disk
        s = run.status().backends["slow"]
        return s.buffered + s.in_flight <= 100 and s.spooled + s.buffered + s.in_flight == 551

    wait_until(within_bound)
    assert segments(tmp_path)

    release.set()
    report = run.flush(60)
    assert report.ok and report.delivered == 300 + 250 + 1, report
    assert [p.step for p in mem.points("over", "m")] == list(range(300))
    assert [p.value for p in mem.points("over", "m")] == [float(i) for i in range(300)]
    assert [p.step for p in mem.points("over", "auto")] == list(range(250))
    assert anyio.run(mem.metadata, "over") == {"last": 299}
    assert not run.status().overloaded
    assert segments(tmp_path) == []

    run.log_metric("m", 300.0, 300)
    assert run.close().ok


def test_block_policy_makes_the_writer_wait_for_room(tmp_path: Path) -> None:
    release = threading.Event()
    run, _, mem = stalled_run(tmp_path, release, overflow="block", overflow_timeout=60)
    overload(run)
    # The lane holds its records in memory: block never spills them.
    assert run.status().backends["slow"].spooled == 0

    writer = threading.Thread(target=run.log_metric, args=("m", 150.0, 150))
    writer.start()
    # Watched from the moment it waits (a loaded machine may start it late), so that it has
    # waited at least as long as it is watched below.
    wait_until(lambda: waiting_for_room(writer) or not writer.is_alive())
    writer.join(0.3)
    assert writer.is_alive(), "a write past the bound returned while the backend was stuck"

    release.set()  # the backend drains, the flusher sees room and wakes the writer
    writer.join(30)
    assert not writer.is_alive()
    report = run.flush(30)
    assert report.ok and report.delivered == 151, report
    assert report.blocked_writes == 1 and report.blocked_s >= 0.3
    assert [p.step for p in mem.points("over", "m")] == list(range(151))
    assert segments(tmp_path) == []
    run.close()


def test_block_policy_spools_once_its_deadline_passes(tmp_path: Path) -> None:
    release = threading.Event()
    run, _, mem = stalled_run(tmp_path, release, overflow="block", overflow_timeout=0)
    overload(run)
    # No room within the deadline (0 s): this write and the rest of the overload spool.
    for i in range(150, 250):
        run.log_metric("m", float(i), i)
    status = run.status()
    assert status.blocked_writes == 1
    run.flush(0)
    wait_until(lambda: run.status().backends["slow"].spooled >= 100)

    release.set()
    report = run.flush(60)
    assert report.ok and report.delivered == 250, report
    assert [p.step for p in mem.points("over", "m")] == list(range(250))
    run.close()


def test_closing_releases_a_blocked_writer_with_an_error(tmp_path: Path) -> None:
    release = threading.Event()
    run, _, _ = stalled_run(tmp_path, release, overflow="block", overflow_timeout=60)
    overload(run)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            run.log_metric("m", 150.0, 150)
        except TrackerClosedError as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(0.2)
    assert writer.is_alive()
    report = run.close(timeout=0.5)
    writer.join(30)
    assert not writer.is_alive() and len(errors) == 1
    # Nothing accepted is lost: the stuck batch and the rest are spooled.
    assert report.spooled + report.pending == 150 and report.delivered == 0, report
    release.set()


def test_drop_oldest_policy_drops_old_metrics_and_counts_them(tmp_path: Path) -> None:
    release = threading.Event()
    run, _, mem = stalled_run(tmp_path, release, overflow="drop_oldest")
    for i in range(50, 400):
        run.log_metric("m", float(i), i)
        if i % 100 == 0:
            run.add_metadata(at=i)  # never dropped
    run.flush(0)
    status = run.status().backends["slow"]
    assert status.shed > 0 and status.dropped == status.shed
    assert status.in_flight <= 100 + 10  # the bound, plus the batch being written
    assert status.spooled == 0

    release.set()
    report = run.flush(60)
    steps = [p.step for p in mem.points("over", "m")]
    assert report.delivered + report.shed == 400 + 3, report
    assert report.dropped == report.shed and not report.ok
    assert steps == sorted(steps) and steps[:10] == list(range(10))  # the batch in flight
    assert steps[-80:] == list(range(320, 400))  # the newest are kept
    assert anyio.run(mem.metadata, "over") == {"at": 300}
    assert segments(tmp_path) == []
    run.close()


def test_overflow_options_come_from_the_environment_and_are_checked() -> None:
    env = {"ASYNC_TRACKER_OVERFLOW": "block", "ASYNC_TRACKER_OVERFLOW_TIMEOUT": "2.5"}
    options = RunOptions.from_env(env)
    assert options.overflow == "block" and options.overflow_timeout == 2.5
    with pytest.raises(ValueError, match="ASYNC_TRACKER_OVERFLOW='wait'"):
        RunOptions.from_env({"ASYNC_TRACKER_OVERFLOW": "wait"})
    with pytest.raises(ValueError, match="overflow must be one of spool, block, drop_oldest"):
        AppRun("r", [InMemoryTracker()], overflow="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="overflow_timeout"):
        RunOptions(overflow_timeout=-1)


def test_steps_resolve_the_same_on_the_fast_and_the_mixed_path() -> None:
    rng = random.Random(7)
    records = []
    for i in range(2000):
        name = rng.choice("abc")
        step = rng.randrange(-5, 50)
        records.append((name, float(i), step, float(i)))
    fast = Cutter("t")
    fast.last_step = {"a": 3}
    batch = fast.cut(records)
    slow = Cutter("t")
    slow.last_step = {"a": 3}
    mixed = slow.cut([*records, ("metadata", ({"k": 1}, 0))])
    assert batch.metrics == mixed.metrics
    assert fast.last_step == slow.last_step
    assert (batch.first, batch.seq, mixed.seq) == (0, 1999, 2000)
    # Step-less points continue each name's last step, across batches.
    cutter = Cutter("t")
    cutter.cut([("a", 1.0, 5, 0.0), ("b", 1.0, 2, 0.0)])
    later = cutter.cut([("a", 1.0, None, 0.0), ("b", 1.0, None, 0.0), ("a", 1.0, None, 0.0)])
    assert [p.step for p in later.metrics] == [6, 3, 7]


def test_steps_beyond_int64_survive_the_spool() -> None:
    batch = Batch(0, metrics=[TrackerMetric("m", 1.0, 2**70, 0.0)], records=1)
    assert decode_batch(encode_batch(batch)).metrics == batch.metrics


def test_writers_in_threads_across_the_switches_keep_their_order(tmp_path: Path) -> None:
    # Four threads write while the run goes into overload (the packed ingress) and out again:
    # each thread's points arrive in its own call order, once, whatever the switches.
    release = threading.Event()
    run, _, mem = stalled_run(tmp_path, release)
    go = threading.Barrier(4)

    def write(t: int) -> None:
        go.wait()
        for i in range(3000):
            run.log_metric(f"t{t}", float(i), step=i)
            if i == 1500:
                run.add_metadata(**{f"half{t}": True})

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    run.flush(0)
    assert run.status().overloaded
    release.set()
    report = run.flush(60)
    assert report.ok and report.delivered == 50 + 4 * 3001, report
    for t in range(4):
        assert [p.step for p in mem.points("over", f"t{t}")] == list(range(3000))
    assert anyio.run(mem.metadata, "over") == {f"half{t}": True for t in range(4)}
    run.close()
