"""close(timeout) returns whatever the backends do, and the process still exits by itself.

Records a close() could not deliver are reported as pending, or as spooled once a spool
exists: the tests count them together (``undelivered``).

No test here measures time: that close() returns at all is what the tests show (a hang is
caught by the harness's timeouts), and ``report.timed_out`` that it gave up at its deadline.
That the deadline is kept to the letter is proved under a virtual clock, in
``test_close_bounds.py`` and by the simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker import AppRun, FlushReport, TrackerClosedError, TrackerMetric
from async_tracker.backend.memory import InMemoryTracker
from tests.core.helpers import Child, wait_until
from tests.faulty import BlockLoop, FaultyTracker, Hang, HangingTracker, RefuseIf, Slow

MakeRun = Callable[..., AppRun]


def undelivered(report: FlushReport) -> int:
    return report.pending + report.spooled


def test_close_with_a_sync_backend_hanging_in_its_thread(
    make_run: MakeRun, release: threading.Event
) -> None:
    hung = HangingTracker(release=release, name="hung")
    mem = InMemoryTracker(name="mem")
    run = make_run("r", [hung, mem])
    run.add_metadata(a=1)
    run.log_metric("x", 1.0)
    # Both lanes at work before close(): the hung backend really stuck in its thread (which
    # may start late on a loaded machine), the other one done with its batch.
    run.flush(timeout=0)
    assert hung.entered.wait(10)
    wait_until(lambda: run.status().backends["mem"].delivered == 2, "mem delivered its batch")
    report = run.close(timeout=0.3)
    assert report.timed_out
    # The hung backend has no metric method: it holds 1 record, the other delivered 2.
    assert undelivered(report) == 1 and report.delivered == 2
    assert not report.ok
    assert mem.runs["r"].metadata == {"a": 1}
    status = run.status()
    hung_status = status.backends["hung"]
    assert status.closed and hung_status.in_flight + hung_status.spooled == 1
    with pytest.raises(TrackerClosedError):
        run.log_metric("x", 2.0)
    # Releasing the thread afterwards changes nothing: the lane was abandoned.
    release.set()
    assert run.close() is report


def test_close_with_an_async_backend_awaiting_forever(make_run: MakeRun) -> None:
    hang = Hang()  # forever
    stuck = FaultyTracker(name="stuck").always("write_batch", hang)
    mem = InMemoryTracker(name="mem")
    run = make_run("r", [stuck, mem])
    for i in range(10):
        run.log_metric("x", float(i), step=i)
    # Both lanes at work before close(): one awaiting forever, the other done.
    run.flush(timeout=0)
    assert hang.entered.wait(10)
    wait_until(lambda: run.status().backends["mem"].delivered == 10, "mem delivered its batch")
    report = run.close(timeout=0.3)
    assert undelivered(report) == 10 and report.delivered == 10
    # The hung call was cancelled, not left running on the loop.
    assert stuck.wait_for("write_batch", 1, outcome="cancelled")
    assert len(mem.points("r", "x")) == 10


def test_close_with_endless_transient_failures(make_run: MakeRun) -> None:
    down = FaultyTracker(name="down").always("add_metadata", Hang())
    run = make_run("r", [down])
    run.add_metadata(a=1)
    report = run.close(timeout=0.2)
    assert undelivered(report) == 1


def test_close_with_a_backend_blocking_the_tracker_loop(
    make_run: MakeRun, release: threading.Event
) -> None:
    # An async backend that calls a blocking library by mistake stops the whole tracker
    # loop. close() must still answer on time, and other runs' writes must not block.
    block = BlockLoop(release)
    blocker = FaultyTracker(name="blocker").on("add_metadata", 1, action=block)
    run = make_run("r", [blocker])
    run.add_metadata(a=1)
    run.flush(timeout=0)  # hands the batch to the lane, which then blocks the loop
    assert block.entered.wait(10)
    try:
        report = run.close(timeout=0.2)
        assert report.timed_out and not report.ok

        other = make_run("other", [InMemoryTracker()])
        other.add_metadata(b=2)  # the first write of a run returns though the loop is stuck
        other.log_metric("y", 1.0)
    finally:
        release.set()
    assert other.flush().ok
    assert other.metadata() == {"b": 2}


@pytest.mark.parametrize("timeout", [0.0, 0.05])
def test_every_record_is_accounted_for_whatever_the_timeout(
    make_run: MakeRun, timeout: float
) -> None:
    # delivered + pending + spooled + dropped == records x backends, at any cut-off.
    slow = FaultyTracker(name="slow").always("write_batch", Slow(0.02))
    picky = FaultyTracker(name="picky").always(
        "add_metrics", RefuseIf(lambda m: isinstance(m, TrackerMetric) and m.value == 15.0)
    )
    fine = InMemoryTracker(name="fine")
    run = make_run("r", [slow, picky, fine], batch_size=10)
    for i in range(100):
        run.log_metric("x", float(i), step=i)
        if i % 10 == 9:
            run.flush(timeout=0)
    # The cut-off falls anywhere in the other lanes' work, but after picky refused its point
    # (it is counted once refused: a close at the very start would find nothing refused yet).
    wait_until(lambda: run.status().backends["picky"].dropped == 1, "picky refused 15.0")
    report = run.close(timeout=timeout)
    assert report.pending >= 0 and report.spooled >= 0
    assert report.delivered + report.pending + report.spooled + report.dropped == 300
    assert report.dropped == 1  # picky refused one point for good: it alone is dropped
    status = run.status().backends
    for s in status.values():
        assert s.delivered + s.in_flight + s.spooled + s.dropped + s.buffered == 100


def test_flush_with_timeout_reports_pending_and_does_not_wait(
    make_run: MakeRun, release: threading.Event
) -> None:
    hang = Hang(release)
    slow = FaultyTracker(name="slow").on("write_batch", 1, action=hang)
    run = make_run("r", [slow])
    run.add_metadata(a=1)
    report = run.flush(timeout=0.1)
    assert report.timed_out and report.pending == 1 and report.delivered == 0
    assert hang.entered.wait(10)
    release.set()
    report = run.flush()
    assert report.ok and report.delivered == 1 and not report.timed_out


def test_flush_after_a_close_that_left_records_behind_does_not_hang(
    make_run: MakeRun,
) -> None:
    stuck = FaultyTracker(name="stuck").always("write_batch", Hang())
    run = make_run("r", [stuck])
    run.add_metadata(a=1)
    assert undelivered(run.close(timeout=0.1)) == 1
    with pytest.raises(TrackerClosedError):
        run.flush()


@pytest.mark.parametrize("closers", [2, 8])
def test_concurrent_closes_close_once(make_run: MakeRun, closers: int) -> None:
    stuck = FaultyTracker(name="stuck").always("write_batch", Hang())
    fine = FaultyTracker(name="fine")
    run = make_run("r", [stuck, fine])
    run.add_metadata(a=1)
    # Both lanes at work before the closes: one stuck in its write, the other done.
    run.flush(timeout=0)
    assert stuck.wait_for("write_batch", 1) and fine.wait_for("write_batch", 1, outcome="ok")
    start = threading.Barrier(closers)
    reports: list[FlushReport] = []

    def close() -> None:
        start.wait()
        reports.append(run.close(timeout=0.3))

    threads = [threading.Thread(target=close) for _ in range(closers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(reports) == closers
    for report in reports:
        # One undelivered record, counted (and spooled, where a spool exists) once.
        assert report.pending >= 0 and undelivered(report) == 1 and report.delivered == 1
    # The fine backend got the record's batch and then the run's end record, once each.
    assert fine.count("write_batch") == 2 and fine.count("end_run") == 1
    assert stuck.count("write_batch") == 1


async def test_close_after_a_cancelled_aclose_closes_once(make_run: MakeRun) -> None:
    import anyio

    stuck = FaultyTracker(name="stuck").always("write_batch", Hang())
    run = make_run("r", [stuck])
    run.add_metadata(a=1)
    await run.aflush(timeout=0)  # the lane takes the batch and gets stuck in its write
    assert await anyio.to_thread.run_sync(stuck.wait_for, "write_batch", 1)
    with anyio.move_on_after(0.05):
        await run.aclose(timeout=0.5)  # the caller gives up before close() is done
    report = await anyio.to_thread.run_sync(run.close)
    assert report.pending >= 0 and undelivered(report) == 1
    assert stuck.count("write_batch") == 1


def test_a_flush_waiting_when_another_thread_closes_returns(make_run: MakeRun) -> None:
    hang = Hang()  # forever
    stuck = FaultyTracker(name="stuck").always("write_batch", hang)
    run = make_run("r", [stuck])
    run.add_metadata(a=1)
    reports: list[FlushReport] = []
    flushing = threading.Thread(target=lambda: reports.append(run.flush()), daemon=True)
    flushing.start()
    assert hang.entered.wait(10)
    closed = run.close(timeout=0.2)
    # The lanes are stopped: the flush has nothing left to wait for and must say so.
    flushing.join(timeout=10)
    assert not flushing.is_alive(), "flush() still waits for a lane that close() stopped"
    (report,) = reports
    assert not report.ok and undelivered(report) == undelivered(closed) == 1


def test_close_of_many_runs_shares_one_deadline(make_run: MakeRun) -> None:
    from async_tracker.runtime.process import runtime

    runs = [make_run(f"r{i}", [FaultyTracker().always("write_batch", Hang())]) for i in range(5)]
    for run in runs:
        run.add_metadata(a=1)
    runtime().close_all(timeout=0.3)
    # Closed concurrently, to one deadline: each gave up at it.
    assert all(r.closed for r in runs)
    assert all(r.close().timed_out and undelivered(r.close()) == 1 for r in runs)


HANG_SCRIPT = """
import sys, threading, time
from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from tests.faulty import FaultyTracker, Hang, HangingTracker

from tests.core.helpers import wait_until

kind = sys.argv[1]
if kind == "thread":
    hung = HangingTracker()            # blocks its worker thread forever
    entered = hung.entered
else:
    hang = Hang()
    hung = FaultyTracker().always("write_batch", hang)   # awaits forever
    entered = hang.entered
mem = InMemoryTracker()
run = AppRun("r", [hung, mem], flush_interval=3600)
run.add_metadata(a=1)
run.add_source("p")
# Both lanes at work before close(): one hung, the other done (either may start late).
run.flush(timeout=0)
assert entered.wait(30)
wait_until(lambda: run.status().backends["InMemoryTracker"].delivered == 2, "mem delivered")
report = run.close(timeout=0.5)
undelivered = report.pending + report.spooled
print(f"closed {report.timed_out} {undelivered} {report.delivered}", flush=True)
# Exit without any further help: the hung thread and the tracker loop must not hold us.
"""


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_process_exits_promptly_after_close_with_a_hung_backend(
    child: Callable[..., Child], kind: str
) -> None:
    proc = child(HANG_SCRIPT, kind)
    word, timed_out, pending, delivered = proc.readline().split()
    assert (word, timed_out) == ("closed", "True")
    assert (int(pending), int(delivered)) == (2, 2)
    assert proc.wait(timeout=30) == 0, proc.stderr()  # exits by itself


EXIT_WITHOUT_CLOSE_SCRIPT = """
import sys
from async_tracker import AppRun
from tests.faulty import FaultyTracker, Hang

run = AppRun("r", [FaultyTracker().always("write_batch", Hang())], flush_interval=3600,
             close_timeout=0.5)
run.add_metadata(a=1)
print("ready", flush=True)
"""


def test_exit_hook_is_bounded_by_close_timeout(child: Callable[..., Child]) -> None:
    proc = child(EXIT_WITHOUT_CLOSE_SCRIPT)
    assert proc.readline() == "ready"
    assert proc.wait(timeout=30) == 0, proc.stderr()  # exits by itself
    err = proc.stderr()
    assert "ended with records not delivered" in err  # and said what it could not deliver
    assert "1 spooled" in err and "async-tracker sync" in err


EXIT_SUMMARY_SCRIPT = """
import sys
from async_tracker import AppRun
from tests.faulty import FaultyTracker, backend_down

backend = FaultyTracker(name="store").always("write_batch", backend_down())
run = AppRun("job/a", [backend], flush_interval=3600, close_timeout=0.2, spool_dir=sys.argv[1])
for step in range(1000):
    run.log_metric("loss", 1.0, step=step)
ok = AppRun("job/b", [FaultyTracker(name="fine")], flush_interval=3600)
ok.log_metric("loss", 1.0)
"""


def test_exit_summary_is_short_and_says_how_to_deliver(
    child: Callable[..., Child], tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    proc = child(EXIT_SUMMARY_SCRIPT, str(spool))
    assert proc.wait(timeout=30) == 0, proc.stderr()
    err = proc.stderr().removeprefix("stderr:\n")
    assert err.count("ended with records not delivered") == 1, err
    # What the lane logged while it ran comes before; the summary is the end of stderr.
    lines = err[err.index("async_tracker: run 'job/a' ended") :].strip().splitlines()
    # About the failing run only (nothing for the one that delivered), five lines at most,
    # none of them a raw report, and the exact command that delivers what waits.
    assert 2 <= len(lines) <= 5 and all(len(line) < 240 for line in lines), lines
    assert "1000 spooled" in lines[0] and "job/b" not in err and "FlushReport" not in err
    assert lines[-1].strip().startswith(f"deliver them: async-tracker sync {spool}")
