"""The tracker loop: one daemon thread per process running an anyio event loop.

Every run of the process flushes on this loop, never on the caller's own loop: a busy user
loop cannot starve the flusher, and a blocked one cannot lose data. Sync code calls into it
through an anyio ``BlockingPortal``; exceptions are re-raised in the caller.

The thread is a daemon, so a backend hung forever cannot keep the process alive, and the
anyio worker threads it starts inherit that. After a fork the child has no such thread (only
the forking thread survives a fork): :func:`get_loop` starts a new one on first use.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

T = TypeVar("T")

THREAD_NAME = "async-tracker-loop"


class TrackerLoop:
    """An event loop in a named daemon thread, and a portal to submit coroutines to it."""

    def __init__(self) -> None:
        self._portal: BlockingPortal | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise RuntimeError("async_tracker could not start its event loop") from self._failure

    def _main(self) -> None:
        try:
            anyio.run(self._serve)
        except BaseException as exc:  # pragma: no cover - reported to the starting thread
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        async with BlockingPortal() as portal:
            self._portal = portal
            self._ready.set()
            await portal.sleep_until_stopped()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(
        self, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> concurrent.futures.Future[T]:
        """Schedules ``fn(*args)`` on the loop; the caller decides how long to wait."""
        assert self._portal is not None
        return self._portal.start_task_soon(fn, *args)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Runs ``fn(*args)`` on the loop and waits for its result in the calling thread."""
        if self.in_loop_thread():
            # Waiting here would wait for ourselves forever.
            raise RuntimeError(
                "a blocking async_tracker call was made on the tracker loop itself; "
                "use the async method (a-prefixed) from backend code"
            )
        return self.submit(fn, *args).result(timeout)


_lock = threading.Lock()
_loop: TrackerLoop | None = None
_loop_pid = os.getpid()


def get_loop() -> TrackerLoop:
    """The process's tracker loop, started on first use (again in a forked child)."""
    global _loop, _loop_pid
    loop = _loop
    if loop is not None and _loop_pid == os.getpid():
        return loop
    with _lock:
        if _loop is None or _loop_pid != os.getpid():
            _loop = TrackerLoop()
            _loop_pid = os.getpid()
        return _loop


def _after_fork_in_child() -> None:
    global _loop, _lock
    # The parent's loop thread does not exist here; a lock it held would stay held forever.
    _loop = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
