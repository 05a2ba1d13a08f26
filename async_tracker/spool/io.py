"""Where spool file I/O runs: one daemon thread per process, started before it is needed.

Every spool call (write a segment, read one, persist an ack, list a directory) is a plain,
blocking file operation handed to this thread; the tracker loop awaits its future. One
mechanism, chosen over aiofiles on the tracker loop because of the exit path: Python 3.12
refuses to start threads at interpreter shutdown, which is exactly when ``close()`` may have
to spool, and aiofiles (like asyncio's default executor, and ``ThreadPoolExecutor``, which
refuses work once shutdown has begun) starts its threads on demand. The process's runtime
starts this thread with the tracker loop, so the exit path only hands it work. It is a daemon:
a disk that hangs must not keep the process alive, and every wait on it is bounded by the
caller's deadline.

:class:`InlineIO` runs the same calls on the loop's own thread, for the simulator, where
determinism matters more than a blocked loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.lowlevel

from async_tracker.runtime.signals import start_thread

T = TypeVar("T")

logger = logging.getLogger(__name__)

THREAD_NAME = "async-tracker-spool"


class SpoolIO(ABC):
    """Runs blocking file operations for the spool; ``await io.run(fn, *args)``."""

    @abstractmethod
    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...

    def post(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[None]:
        """Runs ``fn(*args)`` in its turn, whoever waits for it or stops waiting (see
        :func:`wait_released`); an error is logged. Here (no worker): at once, on the calling
        thread."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        try:
            fn(*args)
        except Exception as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)
        _log_failure(future)
        return future

    def start(self) -> None:  # noqa: B027 - optional
        """Makes sure the worker exists (no-op where there is none)."""


class ThreadIO(SpoolIO):
    """A spool thread: the process's runtime owns one (``runtime().spool_io``), and a forked
    child's runtime a new one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[
            tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future[Any]]
        ] = queue.SimpleQueue()
        self._started = False

    def start(self) -> None:
        if self._started:
            return
        with self._lock:
            if not self._started:
                start_thread(
                    threading.Thread(
                        target=self._serve, args=(self._queue,), name=THREAD_NAME, daemon=True
                    )
                )
                self._started = True

    @staticmethod
    def _serve(
        jobs: queue.SimpleQueue[
            tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future[Any]]
        ],
    ) -> None:
        while True:
            fn, args, future = jobs.get()
            # A job whose waiter gave up (a close() deadline) before it started is skipped.
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        self.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((fn, args, future))
        return future

    def post(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[None]:
        # After every job submitted before it (one thread, in order); no waiter cancels it.
        future = self.submit(fn, *args)
        future.add_done_callback(_log_failure)
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        # The tracker loop is asyncio (anyio's asyncio backend): wrap_future wakes it through
        # call_soon_threadsafe, and cancelling the await cancels a job not yet started.
        return await asyncio.wrap_future(self.submit(fn, *args))


def _log_failure(future: concurrent.futures.Future[Any]) -> None:
    exc = future.exception()
    if exc is not None:
        logger.warning("async_tracker: spool: %s", exc)


async def wait_released(future: concurrent.futures.Future[None]) -> None:
    """Waits (on the tracker loop: asyncio) for a job :meth:`SpoolIO.post` handed over.
    Cancelling the wait leaves the job alone: it runs in its turn all the same. Its failure
    was logged already (a spool folder gone, say): nothing to raise about."""
    try:
        await asyncio.shield(asyncio.wrap_future(future))
    except Exception:
        pass


class InlineIO(SpoolIO):
    """Runs each call at once on the calling (loop) thread, after a checkpoint."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        await anyio.lowlevel.checkpoint()
        return fn(*args)
