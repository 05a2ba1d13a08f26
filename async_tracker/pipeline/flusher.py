"""The flusher: one per process, on the tracker loop, ticking every run's pipeline.

Every ``DEFAULT_WAKE_INTERVAL_S`` it looks at each open run: a cut when one is due, and the
memory bound. The hot path never wakes it (that would be an event-loop call). Lanes are tasks
of its task group; a lane supervises itself (see :mod:`async_tracker.pipeline.lane`), and a
run whose tick fails is reported and skipped, so that one run's fault never stops the others.
"""

from __future__ import annotations

import logging
import os
import threading

import anyio
import anyio.abc

from async_tracker.loop import TrackerLoop, get_loop
from async_tracker.pipeline.run_pipeline import PACKED_PAUSE_S, RunPipeline
from async_tracker.settings import DEFAULT_WAKE_INTERVAL_S
from async_tracker.spool.io import thread_io
from async_tracker.threads import thread_pool

logger = logging.getLogger(__name__)


class Flusher:
    """The process-wide ticker that cuts batches for every run on the tracker loop."""

    def __init__(self, loop: TrackerLoop) -> None:
        self.loop = loop
        self.runs: set[RunPipeline] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._has_runs: anyio.Event | None = None  # created on the loop, by _serve
        # Started now, not when first needed: the exit path may need them, and Python 3.12
        # refuses to start threads at interpreter shutdown.
        thread_io.start()
        thread_pool().start()
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
                packed = any(len(run.packed) for run in self.runs)
                await anyio.sleep(PACKED_PAUSE_S if packed else DEFAULT_WAKE_INTERVAL_S)
                for run in list(self.runs):
                    if run.closed:
                        self.runs.discard(run)
                        continue
                    try:
                        run.tick()
                    except Exception:
                        logger.exception("async_tracker: flushing run %r failed", run.run_id)

    async def add(self, run: RunPipeline) -> None:
        """Registers a run and starts its lanes (on the loop: lanes are tasks of ours)."""
        while self._tg is None:  # only when created from the loop thread itself
            await anyio.sleep(0)
        self.runs.add(run)
        assert self._has_runs is not None
        self._has_runs.set()
        for lane in run.lanes:
            self._tg.start_soon(lane.run, name=f"async-tracker lane {lane.name}")


_flusher: Flusher | None = None
_flusher_lock = threading.Lock()


def get_flusher() -> Flusher:
    """The flusher of this process's tracker loop (a new one after a fork)."""
    global _flusher
    loop = get_loop()
    with _flusher_lock:
        if _flusher is None or _flusher.loop is not loop:
            _flusher = Flusher(loop)
        return _flusher


def _after_fork_in_child() -> None:
    global _flusher_lock
    _flusher_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
