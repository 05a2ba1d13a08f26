"""close(timeout) keeps its deadline to the letter, whatever the backends do: measured on a
virtual clock (tests/simulation/virtual_clock.py), so the test is exact and takes no time."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pytest

from async_tracker.ingress import Ingress
from async_tracker.pipeline.run_pipeline import RunPipeline
from async_tracker.retry import RetryPolicy
from async_tracker.settings import SPOOL_GRACE_S, RunOptions
from async_tracker.spool.io import InlineIO
from tests.faulty import Action, Call, FaultyTracker, Hang, Raise, Slow
from tests.simulation.virtual_clock import VirtualClock

BACKENDS = {
    "hangs": lambda: FaultyTracker(name="b").always("write_batch", Hang()),
    "always-down": lambda: FaultyTracker(name="b").always(
        "write_batch", Raise(lambda: ConnectionError("down"))
    ),
    "read-only": lambda: FaultyTracker(name="b").always(
        "write_batch", Raise(lambda: PermissionError(13, "read-only"))
    ),
    "slow": lambda: FaultyTracker(name="b").always("write_batch", Slow(3.0)),
}


@pytest.mark.parametrize("timeout", [0.0, 0.5, 4.0, 30.0])
@pytest.mark.parametrize("kind", list(BACKENDS))
def test_close_returns_by_its_deadline(tmp_path: Path, kind: str, timeout: float) -> None:
    clock = VirtualClock()
    backend = BACKENDS[kind]()
    ingress = Ingress()
    options = RunOptions(
        flush_interval=3600, batch_size=10, spool_dir=str(tmp_path), close_timeout=timeout,
        retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.1, max_backoff_s=2.0,
                          cooldown_s=5.0),
    )

    async def main() -> None:
        pipeline = RunPipeline(
            "r", ingress, [("b", backend)], options, clock=clock, io=InlineIO(),
            rng=random.Random(1),
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(clock.drive)
            for lane in pipeline.lanes:
                tg.start_soon(lane.run)
            for i in range(95):
                ingress.append(("m", float(i), i, 0.0))
            await pipeline.flush(0)
            await clock.sleep(1.0)  # the backend is at work (or stuck) when close() starts
            start = clock.now()
            report = await pipeline.close(timeout)
            took = clock.now() - start
            assert took <= timeout + SPOOL_GRACE_S, (kind, timeout, took)
            # Every record is accounted for: delivered, or on disk with the path said.
            assert report.delivered + report.spooled == 95 and report.pending == 0, report
            if report.spooled:
                assert report.spool_paths["b"].startswith(str(tmp_path))
                assert report.timed_out
            tg.cancel_scope.cancel()

    anyio.run(main)


class Gate(Action):
    """Holds the call until the test opens the gate, on the loop (no thread in between): the
    test decides the very loop turn in which the write returns."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.open = anyio.Event()

    async def apply(self, call: Call) -> None:
        self.entered.set()
        await self.open.wait()


@pytest.mark.parametrize("durable", [False, True])
def test_a_write_that_returns_as_close_stops_the_lane_is_delivered_or_spooled_never_both(
    tmp_path: Path, durable: bool
) -> None:
    # close() stops a lane whose write has just returned, in the same loop turn: the lane's
    # task still takes that step (anyio cancels a task only at its next wait) and completes
    # the batch. It must then not be written to the spool as well: counted twice (pending
    # -10), and sent again by the next start.
    ingress = Ingress()
    options = RunOptions(
        flush_interval=3600, batch_size=10, spool_dir=str(tmp_path), durable=durable
    )

    async def main() -> None:
        gate = Gate()
        backend = FaultyTracker(name="b").on("write_batch", 1, action=gate)
        pipeline = RunPipeline(
            "r", ingress, [("b", backend)], options, clock=VirtualClock(), io=InlineIO(),
            rng=random.Random(1),
        )
        lane = pipeline.lanes[0]
        async with anyio.create_task_group() as tg:
            tg.start_soon(lane.run)
            for i in range(10):
                ingress.append(("m", float(i), i, 0.0))
            pipeline.cut()
            await gate.entered.wait()
            gate.open.set()  # the write returns ...
            lane.stop()  # ... as close() stops the lane, before the lane's task runs again
            await lane.spool_leftovers()
            status = lane.status(0)
            assert (status.delivered, status.spooled, status.in_flight) in ((10, 0, 0), (0, 10, 0))
            # On disk exactly when counted as spooled (durable: the write-ahead segment is
            # removed once the batch is acknowledged).
            segments = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".seg"]
            assert bool(segments) == (status.spooled == 10), segments
            tg.cancel_scope.cancel()

    anyio.run(main)
