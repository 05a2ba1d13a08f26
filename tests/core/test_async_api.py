"""AppRun's async face: aflush, aclose, the a-prefixed reads, ``async with``; the caller's
event loop is never blocked by the tracker."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import anyio
import pytest

from async_tracker import AppRun, TrackerArtifact, TrackerClosedError
from async_tracker.backend.memory import InMemoryTracker
from tests.core.helpers import FAST_RETRY, wait_until
from tests.faulty import FaultyTracker, Hang

MakeRun = Callable[..., AppRun]


async def test_async_with_reads_and_close() -> None:
    mem = InMemoryTracker()
    async with AppRun("r", [mem], flush_interval=3600, retry=FAST_RETRY) as run:
        run.add_metadata(lr=0.1)
        run.add_metadata(lr=0.2, opt="adam")
        run.add_artifact("model", "/m.pt", {"epoch": 1})
        run.add_source("parent", "model")
        run.log_metric("loss", 0.5, step=0)
        run.log_metrics({"loss": 0.25, "acc": math.nan}, step=1)
        # Reads see the caller's own writes without an explicit flush.
        assert await run.ametadata() == {"lr": 0.2, "opt": "adam"}
        assert await run.aartifacts() == {"model": TrackerArtifact("model", "/m.pt", {"epoch": 1})}
        assert [(s.parent.id, s.artifact_name) for s in await run.asources()] == [
            ("parent", "model")
        ]
        metrics = await run.ametrics()
        assert [(p.step, p.value) for p in metrics["loss"]] == [(0, 0.5), (1, 0.25)]
        assert math.isnan(metrics["acc"][0].value)
        run.log_metric("loss", 0.1, step=2)
    assert run.closed
    assert [p.value for p in mem.points("r", "loss")] == [0.5, 0.25, 0.1]


async def test_aflush_and_aclose_reports(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(a=1)
    run.log_metric("x", 1.0)
    report = await run.aflush()
    assert report.ok and report.delivered == 2 and report.pending == 0
    run.log_metric("x", 2.0)
    closed = await run.aclose()
    assert closed.ok and closed.delivered == 3
    assert await run.aclose() is closed
    assert run.close() is closed
    with pytest.raises(TrackerClosedError):
        run.log_metric("x", 3.0)
    with pytest.raises(TrackerClosedError):
        await run.aflush()


async def test_aflush_does_not_block_the_callers_loop(
    make_run: MakeRun, release: threading.Event
) -> None:
    # The backend hangs until released; the release comes from another task of the caller's
    # loop, which can only run if aflush() awaits instead of blocking the loop.
    hang = Hang(release)
    slow = FaultyTracker(name="slow").on("write_batch", 1, action=hang)
    run = make_run("r", [slow])
    run.add_metadata(a=1)
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        await anyio.to_thread.run_sync(hang.entered.wait)
        for _ in range(10):
            ticks += 1
            await anyio.sleep(0)
        release.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(other_work)
            report = await run.aflush()
    assert ticks == 10
    assert report.ok and report.delivered == 1


async def test_aclose_is_bounded_and_does_not_block_the_callers_loop(make_run: MakeRun) -> None:
    stuck = FaultyTracker(name="stuck").always("write_batch", Hang())  # forever
    run = make_run("r", [stuck, InMemoryTracker(name="mem")])
    run.add_metadata(a=1)
    # Both lanes at work before aclose(): one stuck in its write, the other done (either
    # may start late on a loaded machine).
    await run.aflush(timeout=0)
    assert await anyio.to_thread.run_sync(stuck.wait_for, "write_batch", 1)
    await anyio.to_thread.run_sync(
        wait_until, lambda: run.status().backends["mem"].delivered == 1, "mem delivered"
    )
    ticks = 0
    done = anyio.Event()

    async def other_work() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.sleep(0.001)  # a busy caller loop, not a synchronisation

    async with anyio.create_task_group() as tg:
        tg.start_soon(other_work)
        report = await run.aclose(timeout=0.3)
        done.set()
    assert report.timed_out  # gave up at its deadline (kept exactly: test_close_bounds.py)
    assert ticks > 1  # the caller's loop kept running while aclose() waited
    assert report.pending + report.spooled == 1 and report.delivered == 1
    assert stuck.wait_for("write_batch", 1, outcome="cancelled")


async def test_async_reads_do_not_wait_for_a_slow_second_backend(
    make_run: MakeRun, release: threading.Event
) -> None:
    mem = InMemoryTracker(name="mem")
    hang = Hang(release)
    slow = FaultyTracker(name="slow").always("write_batch", hang)
    run = make_run("r", [mem, slow])
    run.add_metadata(a=1)
    run.log_metric("x", 1.0, step=0)
    with anyio.fail_after(10):
        assert await run.ametadata() == {"a": 1}
        assert [p.value for p in (await run.ametrics())["x"]] == [1.0]
    assert run.status().backends["slow"].delivered == 0
    release.set()
    assert (await run.aflush()).ok


async def test_cancelled_aflush_leaves_the_run_working(
    make_run: MakeRun, release: threading.Event
) -> None:
    hang = Hang(release)
    slow = FaultyTracker(name="slow").on("write_batch", 1, action=hang)
    run = make_run("r", [slow])
    run.add_metadata(a=1)

    async def flush_until_hung() -> None:
        await run.aflush()

    async with anyio.create_task_group() as tg:
        tg.start_soon(flush_until_hung)
        await anyio.to_thread.run_sync(hang.entered.wait)
        tg.cancel_scope.cancel()  # the caller gives up on its flush
    release.set()
    run.add_metadata(b=2)
    report = await run.aflush()
    assert report.ok and report.delivered == 2
    assert await run.ametadata() == {"a": 1, "b": 2}


async def test_writes_from_many_tasks(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem], batch_size=50)

    async def worker(i: int) -> None:
        for step in range(100):
            run.log_metric(f"task{i}", float(step))
            if step % 10 == 0:
                await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(worker, i)
    report = await run.aflush()
    assert report.ok and report.delivered == 1000
    metrics = await run.ametrics()
    for i in range(10):
        assert [(p.step, p.value) for p in metrics[f"task{i}"]] == [
            (s, float(s)) for s in range(100)
        ]


async def test_async_reads_of_an_unstarted_run(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    mem.runs.clear()
    run = make_run("r", [mem])
    assert await run.ametadata() == {}
    assert await run.aartifacts() == {}
    assert await run.asources() == []
    assert await run.ametrics() == {}
    assert (await run.aflush()).ok
