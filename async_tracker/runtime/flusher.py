"""The flusher: one per process, on the tracker loop, ticking every run's pipeline.

Every ``DEFAULT_WAKE_INTERVAL_S`` it looks at each open run: a cut when one is due, and the
memory bound. The hot path never wakes it (that would be an event-loop call). Lanes are tasks
of its task group; a lane supervises itself (see :mod:`async_tracker.pipeline.lane`), and a
run whose tick fails is reported and skipped, so that one run's fault never stops the others.

It drives pipelines through :class:`Ticked` (what :class:`~async_tracker.pipeline.run_pipeline.
RunPipeline` offers): the runtime sits below the pipeline and never imports it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc

from async_tracker.runtime.loop import TrackerLoop
from async_tracker.settings import DEFAULT_WAKE_INTERVAL_S, PACKED_PAUSE_S

logger = logging.getLogger(__name__)


class Ticked(Protocol):
    """A run's pipeline, as the flusher drives it."""

    run_id: str
    closed: bool

    def tick(self) -> None:
        """A cut if one is due, and the memory bound."""

    def draining(self) -> bool:
        """Whether an overload's records wait to be taken a share at a time: look soon."""

    def tasks(self) -> Sequence[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        """The tasks (name, function) to run on the loop until the run closes: its lanes."""


class Flusher:
    """The process-wide ticker that cuts batches for every run on the tracker loop."""

    def __init__(self, loop: TrackerLoop) -> None:
        self.loop = loop
        self.runs: set[Ticked] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._has_runs: anyio.Event | None = None  # created on the loop, by _serve
        ready = threading.Event()
        loop.submit(self._serve, ready)
        # Wait for the task group, so that add() never has to: submitted tasks then run in
        # submission order, and a flush() submitted after add() finds the lanes registered.
        if not loop.in_loop_thread():
            ready.wait()

    async def _serve(self, ready: threading.Event) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._has_runs = anyio.Event()
            ready.set()
            while True:
                if not self.runs:
                    # No open run: sleep until add(), so that a process whose runs are all
                    # closed pays nothing for the ticker (each tick takes the GIL).
                    await self._has_runs.wait()
                    self._has_runs = anyio.Event()
                # An overloaded run drains its packed ingress a share at a time: look again
                # soon, so that the share keeps pace with a loop that does nothing but log.
                draining = any(run.draining() for run in self.runs)
                await anyio.sleep(PACKED_PAUSE_S if draining else DEFAULT_WAKE_INTERVAL_S)
                for run in list(self.runs):
                    if run.closed:
                        self.runs.discard(run)
                        continue
                    try:
                        run.tick()
                    except Exception:
                        logger.exception("async_tracker: flushing run %r failed", run.run_id)

    async def add(self, run: Ticked) -> None:
        """Registers a run and starts its tasks (on the loop: lanes are tasks of ours)."""
        while self._tg is None:  # only when created from the loop thread itself
            await anyio.sleep(0)
        self.runs.add(run)
        assert self._has_runs is not None
        self._has_runs.set()
        for name, task in run.tasks():
            self._tg.start_soon(task, name=name)
