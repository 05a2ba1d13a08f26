"""Reads return every stored point, and a replay or a retry of a batch stores its points once:
the scenarios, shared by the backends' test modules.

Many values are logged at each step in a tight loop, so that many points of one step share a
clock tick: a reader that told points apart by (step, time) would merge them. The values
count up in call order, so the points read back must be exactly ``expected(...)``.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from async_tracker import AppRun, AsyncTrackerBase, Batch, TrackerMetric, TransientBackendError
from tests.core.helpers import FAST_RETRY, Child

STEPS, PER_STEP = 50, 2_000  # 100k points: the measured case

Factory = Callable[[Path], AsyncTrackerBase]


def log_many(run: AppRun, steps: range, per_step: int) -> None:
    """``per_step`` values at each step of ``steps``; the value is the call's position."""
    value = steps.start * per_step
    for epoch in steps:
        for _ in range(per_step):
            run.log_metric("x", float(value), step=epoch)
            value += 1


def expected(steps: range, per_step: int) -> list[tuple[int, float]]:
    return [(s, float(s * per_step + i)) for s in steps for i in range(per_step)]


def read_back(backend: AsyncTrackerBase, run_id: str) -> list[tuple[int, float]]:
    points: Mapping[str, Sequence[TrackerMetric]] = asyncio.run(backend.metrics(run_id))
    return [(p.step, p.value) for p in points.get("x", [])]


def every_point_comes_back(make: Factory, root: Path) -> None:
    """The measured case: 2,000 values at each of 50 steps, all read back in order (step,
    then call order)."""
    backend = make(root)
    run = AppRun("many", [backend], retry=FAST_RETRY)
    log_many(run, range(STEPS), PER_STEP)
    report = run.close(120)
    assert report.ok and report.delivered == STEPS * PER_STEP, report
    got = read_back(make(root), "many")
    assert len(got) == STEPS * PER_STEP
    assert got == expected(range(STEPS), PER_STEP)


class _LostReplies:
    """Mixed into a backend: the first ``lost`` writes of batches with points are stored,
    then fail as if the store's reply was lost (a transient error, nothing marked done), so
    that the lane retries the whole batch."""

    lost = 3

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        await super().write_batch(run_id, batch)  # type: ignore[misc]
        if self.lost and batch.points():
            self.lost -= 1
            batch.done.clear()
            raise TransientBackendError("the store's reply was lost")


def with_lost_replies(backend: AsyncTrackerBase) -> AsyncTrackerBase:
    """A backend of ``backend``'s class, with the same state, whose first writes lose their
    replies (see _LostReplies)."""
    cls = type(f"LostReplies{type(backend).__name__}", (_LostReplies, type(backend)), {})
    lossy: AsyncTrackerBase = object.__new__(cls)
    lossy.__dict__.update(backend.__dict__)
    return lossy


def a_retried_batch_is_stored_once(make: Factory, root: Path) -> None:
    backend = with_lost_replies(make(root))
    run = AppRun("retried", [backend], retry=FAST_RETRY, batch_size=1_000)
    log_many(run, range(10), 400)
    report = run.close(120)
    assert report.ok and report.delivered == 4_000, report
    assert backend.lost == 0  # type: ignore[attr-defined]
    assert read_back(make(root), "retried") == expected(range(10), 400)


# The child: phase 1 delivered (and acknowledged in its spool), then phase 2's first batch is
# stored but its write never returns (no acknowledgement), and the test SIGKILLs the child.
_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from async_tracker import AppRun
    from tests.every_point import log_many, make_backend

    kind, root, spool = sys.argv[1:4]
    backend = make_backend(kind, Path(root))
    hang = False

    class StoredThenHung(type(backend)):
        __slots__ = ()

        async def write_batch(self, run_id, batch):
            await super().write_batch(run_id, batch)
            if hang and batch.points():
                print("stored", flush=True)
                await asyncio.Event().wait()  # the lane waits here until the SIGKILL

    backend.__class__ = StoredThenHung
    run = AppRun("killed", [backend], spool_dir=spool, durable=True, batch_size=1_000)
    log_many(run, range(0, 10), 400)
    assert run.flush(60).ok
    hang = True
    log_many(run, range(10, 20), 400)
    run.flush(0.001)
    # Cut and on disk (durable), all of phase 2, before the parent kills us: a batch still
    # being written to the write-ahead log when SIGKILL comes was never promised to survive.
    while sum(b.spooled for b in run.status().backends.values()) < 4_000:
        import time; time.sleep(0.01)
    print("logged", flush=True)
    while True:
        import time; time.sleep(3600)
    """
)


def make_backend(kind: str, root: Path) -> AsyncTrackerBase:
    """A backend of ``kind`` over ``root`` (for the child process)."""
    if kind == "fsspec":
        import fsspec

        from async_tracker.backend.fsspec import AsyncFsspecTracker

        return AsyncFsspecTracker(fsspec.filesystem("file"), str(root))
    if kind == "tensorboard":
        from async_tracker.backend.tensorboard import AsyncTensorBoardTracker

        return AsyncTensorBoardTracker(root)
    raise ValueError(kind)


def a_killed_durable_run_replays_each_point_once(kind: str, tmp_path: Path) -> None:
    """A durable run SIGKILLed with a batch stored but not acknowledged: the replay (a
    restarted job's run) stores that batch again, and every point is read once."""
    root, spool = tmp_path / "store", tmp_path / "spool"
    child = Child(_CHILD, kind, str(root), str(spool))
    try:
        lines = {child.readline(60), child.readline(60)}
        assert lines == {"stored", "logged"}
    finally:
        child.kill()
        child.close()
    replay = AppRun("killed", [make_backend(kind, root)], spool_dir=str(spool), retry=FAST_RETRY)
    report = replay.close(120)
    # All of phase 2: the batch stored before the kill (never acknowledged) is sent again.
    assert report.ok and report.delivered == 4_000, report
    assert read_back(make_backend(kind, root), "killed") == expected(range(20), 400)
