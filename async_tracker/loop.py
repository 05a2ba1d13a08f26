"""The tracker loop: one daemon thread per process running an anyio event loop.

Every run of the process flushes on this loop, never on the caller's own loop: a busy user
loop cannot starve the flusher, and a blocked one cannot lose data. Other threads hand it
coroutines with :meth:`TrackerLoop.submit`, which never waits for the loop (an anyio
``BlockingPortal`` would: its ``start_task_soon`` blocks until the loop thread has spawned the
task, so a loop blocked by a misbehaving backend would block every writer and every close());
exceptions are re-raised in whoever waits on the returned future.

The thread is a daemon, so a backend hung forever cannot keep the process alive, and the
anyio worker threads it starts inherit that. After a fork the child has no such thread (only
the forking thread survives a fork): :func:`get_loop` starts a new one on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc

T = TypeVar("T")

THREAD_NAME = "async-tracker-loop"


class TrackerLoop:
    """An asyncio event loop run by anyio in a named daemon thread, and a way in for other
    threads that never blocks them."""

    def __init__(self) -> None:
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise RuntimeError("async_tracker could not start its event loop") from self._failure

    def _main(self) -> None:
        try:
            anyio.run(self._serve, backend="asyncio")
        except BaseException as exc:  # pragma: no cover - reported to the starting thread
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._aloop = asyncio.get_running_loop()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._ready.set()
            await anyio.sleep_forever()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(
        self, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> concurrent.futures.Future[T]:
        """Schedules ``fn(*args)`` on the loop and returns at once; the caller decides how long
        to wait. Cancelling the future cancels the task."""
        assert self._aloop is not None and self._tg is not None
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        # call_soon_threadsafe only appends to the loop's queue and writes to its wake-up
        # pipe: it returns even when the loop thread is stuck. Tasks start in submission order.
        self._aloop.call_soon_threadsafe(self._tg.start_soon, self._run, fn, args, future)
        return future

    async def _run(
        self,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        future: concurrent.futures.Future[T],
    ) -> None:
        if future.cancelled():
            return
        aloop = self._aloop
        assert aloop is not None
        with anyio.CancelScope() as scope:

            def cancel_if_cancelled(f: concurrent.futures.Future[T]) -> None:
                # Runs in the thread that cancelled the future (or here, once done).
                if f.cancelled():
                    aloop.call_soon_threadsafe(scope.cancel)

            future.add_done_callback(cancel_if_cancelled)
            try:
                result = await fn(*args)
            except Exception as exc:
                # Reported to whoever waits; never raised into the task group (that would
                # stop the loop for every run).
                _settle(future.set_exception, exc)
            except BaseException as exc:  # cancellation: ours is absorbed by the scope
                _settle(future.set_exception, exc)
                raise
            else:
                _settle(future.set_result, result)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Runs ``fn(*args)`` on the loop and waits for its result in the calling thread."""
        if self.in_loop_thread():
            # Waiting here would wait for ourselves forever.
            raise RuntimeError(
                "a blocking async_tracker call was made on the tracker loop itself; "
                "use the async method (a-prefixed) from backend code"
            )
        return self.submit(fn, *args).result(timeout)


def _settle(setter: Callable[[Any], None], value: Any) -> None:
    try:
        setter(value)
    except concurrent.futures.InvalidStateError:  # cancelled by the waiter meanwhile
        pass


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
