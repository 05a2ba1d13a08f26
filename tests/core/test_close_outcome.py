"""A close's report is the outcome: once ``close()`` returns, the run's records are where its
report says, and nothing of the run moves them afterwards but the ``in_doubt`` ones (a
backend call the close cut off, which may still store them). A run reopened in the same
process takes over what the closed one spooled.

Each test lets everything settle after the close (the backend's cut-off call ends, the spool
thread and the tracker loop run every job they were given), then counts what the backend
holds and what the spool holds, and compares both with the report. Nothing here measures
time: the close's deadline cuts writers and backends off wherever they are, and the
comparison must hold whatever that moment was. That close() keeps its bound is a benchmark
(``python -m benchmarks.bench_bound close 16``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from async_tracker import AppRun, FlushReport, TrackerClosedError, TrackerMetric
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.runtime.process import runtime
from async_tracker.spool.codec import read_segment_bytes
from tests.core.helpers import wait_until
from tests.faulty import BlockLoop, FaultyTracker, MetricDictTracker, transient

MakeRun = Callable[..., AppRun]


class StallingTracker(MetricDictTracker):
    """A blocking backend (a plain ``TrackerBase``, run in worker threads) whose first
    ``add_metrics`` call holds its thread until ``release`` is set, then stores its points:
    a call that a close cuts off, and that ends after the close returned."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(name="slow")
        self.release = release
        self.entered = threading.Event()
        self.first_stored = threading.Event()
        self._calls = 0

    def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        with self.lock:
            self._calls += 1
            first = self._calls == 1
        if first:
            self.entered.set()
            self.release.wait()
        super().add_metrics(run_id, metrics)
        if first:
            self.first_stored.set()

    def stored(self, run_id: str) -> int:
        with self.lock:
            return sum(len(points) for points in self.points.get(run_id, {}).values())


def spool_holds(spool_dir: Path) -> int:
    """Records waiting in the spool: every readable line of every segment, less the lines
    its pipeline's ack covers (delivered, left for the segment's last line to remove)."""
    held = 0
    for path in spool_dir.rglob("*.seg"):
        token = path.name.split("-")[0]
        ack_file = path.parent / f"{token}.ack"
        ack = int(ack_file.read_text()) if ack_file.exists() else -1
        batches, _ = read_segment_bytes(path.read_bytes())
        held += sum(b.records for b in batches if b is not None and b.seq > ack)
    return held


async def _nothing() -> None:
    pass


def settle() -> None:
    """Until the spool thread and the tracker loop have run every job handed to them so far
    (each runs its jobs in order): a write given up, a lock released, a close going on."""
    runtime().spool_io.submit(lambda: None).result(timeout=60)
    runtime().loop.call(_nothing, timeout=60)
    runtime().spool_io.submit(lambda: None).result(timeout=60)


def counted(report: FlushReport) -> int:
    return report.delivered + report.spooled + report.pending + report.dropped


def log_until_closed(
    run: AppRun, writers: int, warm: int
) -> tuple[list[int], list[threading.Thread]]:
    """``writers`` threads log as fast as they can, each its own metric, until the run is
    closed; returns once each has logged ``warm`` points (and goes on). The list holds what
    each had accepted when its write raised."""
    accepted = [0] * writers
    warmed = [threading.Event() for _ in range(writers)]

    def write(k: int) -> None:
        n = 0
        try:
            while True:
                run.log_metric(f"w{k}", 1.0, n)
                n += 1
                if n == warm:
                    warmed[k].set()
        except TrackerClosedError:
            accepted[k] = n
            warmed[k].set()

    threads = [threading.Thread(target=write, args=(k,), daemon=True) for k in range(writers)]
    for t in threads:
        t.start()
    for event in warmed:
        assert event.wait(60)
    return accepted, threads


def test_with_sixteen_threads_logging_the_report_is_what_the_backend_and_the_spool_hold(
    make_run: MakeRun, release: threading.Event, tmp_path: Path
) -> None:
    backend = StallingTracker(release)
    spool = tmp_path / "spool"
    # Cut at 1000 records waiting (the flush interval is an hour): the first batch is full.
    run = make_run("r", [backend], spool_dir=str(spool), batch_size=1000)
    accepted, threads = log_until_closed(run, writers=16, warm=2000)
    assert backend.entered.wait(60)  # the lane's first write holds its worker thread
    report = run.close(timeout=0.5)  # cut off in the middle of everything
    for t in threads:
        t.join(60)
    total = sum(accepted)
    assert counted(report) == total, (report, total)
    assert report.in_doubt == 1000 and report.timed_out and not report.ok
    # The call the close cut off ends now, and stores its batch after all: the one thing
    # that moves after the close, and the report said so.
    release.set()
    assert backend.first_stored.wait(60)
    settle()
    assert backend.stored("r") == report.delivered + report.in_doubt
    assert spool_holds(spool) == report.spooled
    # And it stays so: nothing of the run is at work any more.
    settle()
    assert backend.stored("r") == report.delivered + report.in_doubt
    assert spool_holds(spool) == report.spooled
    assert run.close() is report


def test_with_the_tracker_loop_held_the_report_made_without_it_is_the_outcome(
    make_run: MakeRun, release: threading.Event, tmp_path: Path
) -> None:
    # The first tries fail: the lane pauses, and the head and what waits behind it go to disk.
    # A flush kicks it, and its next try blocks the tracker loop itself (an async backend
    # calling a blocking library). close() cannot wait for the loop, which never even begins
    # the close: it answers with a report made from its own thread, and that report must
    # hold whatever the loop does once it runs again.
    mem = InMemoryTracker()
    block = BlockLoop(release)
    backend = FaultyTracker(mem, name="b").on("write_batch", 1, 2, 3, action=transient())
    backend.on("write_batch", 4, action=block)
    spool = tmp_path / "spool"
    run = make_run("r", [backend], spool_dir=str(spool), batch_size=10)
    for i in range(100):
        run.log_metric("x", float(i), step=i)
    run.flush(timeout=0)
    wait_until(lambda: run.status().backends["b"].spooled == 100, "all of it spooled")
    try:
        run.flush(timeout=0)  # the kick: the next try blocks the loop
        assert block.entered.wait(60)
        report = run.close(timeout=0.2)
    finally:
        release.set()
    assert report.timed_out and report.delivered == 0 and report.in_doubt == 10
    # The end record was never sealed (the loop never ran the close): it goes with the
    # process, as one left in memory would.
    # The head in doubt is counted where it waits: on disk, as the rest.
    assert (report.spooled, report.pending, report.end_pending) == (100, 0, 1), report
    assert backend.wait_for("write_batch", 1, outcome="ok")  # the held try ends: stored
    settle()
    assert len(mem.points("r", "x")) == report.delivered + report.in_doubt == 10
    assert spool_holds(spool) == report.spooled == 100
    settle()
    assert backend.count("write_batch") == 4  # the loop, running again, delivers nothing more
    assert backend.count("end_run") == 0
    assert spool_holds(spool) == 100

    # The same process opens the run again: it takes over what the closed one spooled, now.
    again = make_run("r", [FaultyTracker(mem, name="b")], spool_dir=str(spool))
    flushed = again.flush(timeout=60)
    assert flushed.replayed == 100 and flushed.delivered == 100 and flushed.ok, flushed
    # The head in doubt is sent again: this backend, unlike fsspec and MLflow, keeps both.
    assert [p.step for p in mem.points("r", "x")] == sorted([*range(10), *range(100)])
    again.close(timeout=60)
    settle()
    assert spool_holds(spool) == 0


def test_a_run_reopened_in_the_same_process_replays_what_its_close_spooled(
    make_run: MakeRun, tmp_path: Path
) -> None:
    # A notebook cell that runs again: the first run's store was down, its records are on
    # disk (written ahead: durable), its close spooled them.
    spool = tmp_path / "spool"
    down = FaultyTracker(name="store").always("write_batch", transient("store is down"))
    first = make_run("nb", [down], spool_dir=str(spool), durable=True)
    for i in range(500):
        first.log_metric("loss", float(i), step=i)
    first.flush(timeout=0)
    wait_until(lambda: first.status().backends["store"].spooled == 500, "written ahead")
    report = first.close(timeout=0.2)
    assert report.spooled == 500 and counted(report) == 500
    assert report.end_spooled + report.end_pending == 1  # the end record too, if in time
    settle()
    assert spool_holds(spool) == 500

    mem = InMemoryTracker(name="store")
    second = make_run("nb", [mem], spool_dir=str(spool))
    flushed = second.flush(timeout=60)
    assert flushed.replayed == 500 and flushed.delivered == 500 and flushed.ok, flushed
    assert [p.step for p in mem.points("nb", "loss")] == list(range(500))
    # The first run's end record with them, if its close spooled it.
    assert mem.ended("nb") == ("finished" if report.end_spooled else None)
    assert second.close(timeout=60).ok
    settle()
    assert spool_holds(spool) == 0 and not list(spool.rglob("*.seg"))
