"""The memory bound holds where records enter, whatever the writers do: past ``max_buffered``
a write waits for the tracker loop to take records out (on its own thread), so neither a
producer that outruns the loop nor sixteen that keep it from the GIL fill memory; and
``close()`` under such writers spools what it cannot deliver and counts every accepted
record exactly once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.errors import TrackerClosedError
from tests.core.helpers import wait_until
from tests.faulty import BlockLoop, FaultyTracker, Hang

WRITERS = 16


@pytest.mark.scale
def test_close_under_sixteen_writers_counts_each_record_once_and_leaves_none_in_memory(
    tmp_path: Path, make_run: Callable[..., AppRun]
) -> None:
    # A store that never takes a batch: everything accepted ends on disk at close.
    store = FaultyTracker(name="stuck").always("write_batch", Hang())
    run = make_run(
        "sixteen", [store], spool_dir=str(tmp_path), max_buffered=10_000, batch_size=1_000
    )
    written = [0] * WRITERS  # per writer: points accepted (steps 0 .. n-1, in call order)
    go = threading.Event()

    def write(k: int) -> None:
        name, log = f"w{k}", run.log_metric
        go.wait()
        try:
            while True:
                log(name, 1.0, written[k])
                written[k] += 1
        except TrackerClosedError:
            pass

    threads = [threading.Thread(target=write, args=(k,)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    go.set()
    # Far past the bound, with every writer going: the loop has had to keep up with them.
    wait_until(lambda: sum(written) >= 1_000_000 and min(written) > 0, "1M points written")
    report = run.close(timeout=0.5)
    for t in threads:
        t.join()
    accepted = sum(written)
    assert report.pending == 0 and report.end_pending == 0, report
    assert report.delivered + report.spooled + report.dropped == accepted, (report, accepted)

    # Replayed from the spool: every writer's points, each once, in its call order.
    # The same backend name: a spool is kept per run and backend name.
    replay = FaultyTracker(InMemoryTracker(), name="stuck")
    again = AppRun("sixteen", [replay], spool_dir=str(tmp_path), flush_interval=3600)
    try:
        assert again.flush(timeout=60).ok
        metrics = again.metrics()
    finally:
        again.close(timeout=5)
    for k in range(WRITERS):
        assert [m.step for m in metrics.get(f"w{k}", [])] == list(range(written[k])), k


def test_one_fast_producer_against_a_stalled_store_stays_within_the_bound(
    tmp_path: Path, make_run: Callable[..., AppRun]
) -> None:
    store = FaultyTracker(name="stuck").always("write_batch", Hang())
    limit = 2_000
    run = make_run("fast", [store], spool_dir=str(tmp_path), max_buffered=limit, batch_size=100)
    run.log_metric("loss", 0.0, 0)
    pipeline: Any = run._pipeline
    assert pipeline is not None
    most = 0
    for i in range(1, 200_001):
        run.log_metric("loss", 0.5, i)
        # Sampled by the producer itself, after each write: no timing involved.
        held = len(pipeline.ingress) + len(pipeline.packed)
        if held > most:
            most = held
    # The deque and the packed ingress together: the bound, plus, for a moment after an
    # overload ends (at a quarter of the bound), the quarter still packed as it drains.
    assert most <= limit + limit // 4, most
    report = run.close(timeout=1.0)
    assert report.pending == 0 and report.spooled == 200_001, report


def test_a_stuck_tracker_loop_lets_writes_past_the_bound_with_a_warning(
    tmp_path: Path, make_run: Callable[..., AppRun], caplog: pytest.LogCaptureFixture
) -> None:
    # An async backend that blocks the tracker loop itself: nothing takes records out, so a
    # wait for room runs out once; the writes then go on (they wait no more until the loop
    # drains), said once, and nothing is lost.
    release = threading.Event()
    mem = InMemoryTracker()
    store = FaultyTracker(mem, name="blocking").on("write_batch", 1, action=BlockLoop(release))
    run = make_run("stuck", [store], spool_dir=str(tmp_path), max_buffered=100, batch_size=10)
    try:
        for i in range(10):
            run.log_metric("m", float(i), i)
        run.flush(0)
        assert store.wait_for("write_batch", 1)
        with caplog.at_level(logging.WARNING, logger="async_tracker.run"):
            for i in range(10, 400):
                run.log_metric("m", float(i), i)
        assert sum("took no records" in r.getMessage() for r in caplog.records) == 1
    finally:
        release.set()
    assert run.flush(60).ok
    assert [p.step for p in mem.points("stuck", "m")] == list(range(400))
