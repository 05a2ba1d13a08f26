"""The tracker loop: one daemon thread per process running an anyio event loop.

Every run of the process flushes on this loop, never on the caller's own loop: a busy user
loop cannot starve the flusher, and a blocked one cannot lose data. Other threads hand it
coroutines with :meth:`TrackerLoop.submit`, which never waits for the loop; exceptions are
re-raised in whoever waits on the returned future. Async callers wait on that future with
:func:`wait_future`, which starts nothing on their loop.

How work crosses threads (the design's "Signals and exit" rule): a submitting thread only
puts an item on an anyio memory object stream, through the loop's ``call_soon_threadsafe``;
one consumer task on the loop receives the items and starts each as a task of its task
group. Task-group methods are therefore only ever called from inside a task: called from a
bare loop callback (no current task), anyio asks sniffio which library runs, sniffio finds
no task and raises, and nothing would ever run (the defect of issue 13 with sniffio
installed). An anyio ``BlockingPortal`` is not used: its ``start_task_soon`` blocks until
the loop thread has spawned the task, so a loop blocked by a misbehaving backend would block
every writer and every close().

The thread is a daemon, so a backend hung forever cannot keep the process alive, and the
anyio worker threads it starts inherit that. After a fork the child has no such thread (only
the forking thread survives a fork): the child's own runtime starts a new one on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from async_tracker.runtime.signals import start_thread

T = TypeVar("T")

THREAD_NAME = "async-tracker-loop"

# One piece of work handed to the loop: fn, its arguments, and the future that reports it.
_Item = tuple[Callable[..., Awaitable[Any]], tuple[Any, ...], "concurrent.futures.Future[Any]"]


class TrackerLoop:
    """An asyncio event loop run by anyio in a named daemon thread, and a way in for other
    threads that never blocks them."""

    def __init__(self) -> None:
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._send: MemoryObjectSendStream[_Item] | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        start_thread(self._thread)  # signals blocked: they are the main thread's
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
        # Unbounded: send_nowait then never raises WouldBlock, so a submitter is never
        # refused or made to wait, however far behind the consumer is. What waits here is
        # bounded by the callers (one item per flush, read or close, not per write).
        send, receive = anyio.create_memory_object_stream[_Item](math.inf)
        async with anyio.create_task_group() as tg, receive:
            self._send = send
            self._ready.set()
            # The one consumer: start_soon is called here, inside a task, where anyio (and
            # sniffio, when installed) can tell which library runs. Tasks are started in the
            # order they were submitted, and asyncio runs new tasks in creation order: a
            # flush() submitted after a run's registration finds its lanes registered.
            async for fn, args, future in receive:
                tg.start_soon(self._run, fn, args, future)
                # Held here until the next item otherwise: the last read's reader and what
                # it keeps (a store's decoded run index, hundreds of MB) outlived its caller.
                del fn, args, future

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
        assert self._aloop is not None and self._send is not None
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        # call_soon_threadsafe only appends to the loop's queue and writes to its wake-up
        # pipe: it returns even when the loop thread is stuck (a blocking call in an async
        # backend). The stream itself is not thread-safe, hence the hop onto the loop thread
        # before send_nowait; callbacks run in the order they were scheduled, so items reach
        # the stream in submission order. send_nowait only appends to a deque or wakes the
        # waiting consumer (an asyncio Event): it never asks sniffio for the current library,
        # so running it from a bare callback is safe (tests/core/test_event_loops.py runs
        # everything with sniffio installed).
        self._aloop.call_soon_threadsafe(self._enqueue, self._send, (fn, args, future))
        return future

    @staticmethod
    def _enqueue(send: MemoryObjectSendStream[_Item], item: _Item) -> None:
        try:
            send.send_nowait(item)
        except Exception as exc:
            # The consumer is gone (only while the loop itself is ending): say so to the
            # waiter instead of leaving its future pending forever.
            _settle(item[2].set_exception, RuntimeError(f"the tracker loop is stopped: {exc!r}"))

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
                # Runs in the thread that cancelled the future (or here, once done). A cancel
                # scope's cancel() is fine in a bare loop callback, unlike task-group methods:
                # on asyncio it only marks the scope and calls Task.cancel(), as anyio's own
                # deadline callbacks do.
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

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Runs the plain function ``fn(*args)`` on the loop thread soon, and returns at once:
        it only queues a callback (no lock, no wait), so a signal handler may call it."""
        if self.in_loop_thread():
            fn(*args)
            return
        assert self._aloop is not None
        self._aloop.call_soon_threadsafe(fn, *args)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Runs ``fn(*args)`` on the loop and waits for its result in the calling thread."""
        if self.in_loop_thread():
            # Waiting here would wait for ourselves forever.
            raise RuntimeError(
                "a blocking async_tracker call was made on the tracker loop itself; "
                "use the async method (a-prefixed) from backend code"
            )
        return self.submit(fn, *args).result(timeout)


async def wait_future(
    future: concurrent.futures.Future[T], *, timeout: float | None = None, cancel: bool = True
) -> T:
    """Awaits a future of the tracker loop from the caller's own event loop (asyncio, uvloop,
    nest_asyncio or trio) and returns its result.

    It starts nothing there: no worker thread (a non-daemon anyio worker thread that a
    patched loop never stops keeps the process from exiting), no task. The future's done
    callback wakes the caller through its loop's own thread-safe entry, which never blocks
    the thread completing the future (the tracker loop).

    ``timeout`` (seconds) raises :class:`concurrent.futures.TimeoutError` when the future is
    not done by then. When the caller is cancelled or times out, ``cancel`` says whether the
    future is cancelled too (its task on the tracker loop with it) or only abandoned, left
    running for others who wait on it (a close that a later close() still waits for).
    """
    trio_token = _current_trio_token()
    if trio_token is not None:
        return await _wait_trio(trio_token, future, timeout, cancel)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "async_tracker's async methods need an asyncio (uvloop, nest_asyncio) or trio "
            "event loop; call the blocking methods otherwise"
        ) from None
    return await _wait_asyncio(future, timeout, cancel)


def _current_trio_token() -> Any:
    """The caller's trio token, or None when the caller is not in a trio run. Checked before
    asyncio: in trio's guest mode on an asyncio host, asyncio's loop runs in the same thread
    but the caller is a trio task, which cannot await an asyncio future."""
    trio = sys.modules.get("trio")
    if trio is None:  # trio runs nothing in this process
        return None
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None


async def _wait_asyncio(
    future: concurrent.futures.Future[T], timeout: float | None, cancel: bool
) -> T:
    # wrap_future chains the future to an asyncio future of this loop with the loop's
    # call_soon_threadsafe: no thread, and it works on uvloop and on nest_asyncio's patched
    # loop alike. Cancelling the wrapper cancels the concurrent future.
    wrapped = asyncio.wrap_future(future)
    try:
        # asyncio.wait, not wait_for or shield: on timeout or cancellation of the caller it
        # leaves `wrapped` alone, so that what happens to the future is decided below.
        await asyncio.wait({wrapped}, timeout=timeout)
    except BaseException:
        _give_up(wrapped, cancel)
        raise
    if not wrapped.done():
        _give_up(wrapped, cancel)
        raise concurrent.futures.TimeoutError
    return wrapped.result()


def _give_up(wrapped: asyncio.Future[Any], cancel: bool) -> None:
    if cancel:
        wrapped.cancel()  # and, through wrap_future's chain, the tracker loop's future
    else:
        # Abandoned: its result, when it comes, is read by nobody here; retrieving it keeps
        # asyncio from logging "exception was never retrieved".
        wrapped.add_done_callback(_retrieve)


def _retrieve(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


async def _wait_trio(
    token: Any, future: concurrent.futures.Future[T], timeout: float | None, cancel: bool
) -> T:
    import trio

    done = trio.Event()

    def wake(_: concurrent.futures.Future[T]) -> None:
        # Runs in the thread that completes the future (the tracker loop). run_sync_soon only
        # queues the call and wakes trio: it never waits for the caller's loop, unlike
        # trio.from_thread / anyio.from_thread, which would block the tracker loop on a busy
        # or blocked caller.
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:  # the caller's trio.run has ended: nobody waits
            pass

    future.add_done_callback(wake)
    try:
        with trio.move_on_after(math.inf if timeout is None else timeout):
            await done.wait()
    except BaseException:  # trio.Cancelled, KeyboardInterrupt
        if cancel:
            future.cancel()
        raise
    if not future.done():
        if cancel:
            future.cancel()
        raise concurrent.futures.TimeoutError
    return future.result()


def _settle(setter: Callable[[Any], None], value: Any) -> None:
    try:
        setter(value)
    except concurrent.futures.InvalidStateError:  # cancelled by the waiter meanwhile
        pass
