"""Worker threads for blocking calls, shared by the whole process.

Every blocking call of every backend runs here: a third-party ``TrackerBase`` (through
:class:`async_tracker.adapters.ThreadedTracker`), a sync fsspec filesystem, the MLflow client.
The tracker loop awaits them through the process's pool (``runtime().pool``)::

    await run_blocking(fs.pipe_file, path, data, endpoint="file:///data/runs")

(:func:`async_tracker.runtime.process.run_blocking`).

Two limits, read from the environment when the pool is first used in a process:

* the process: at most ``ASYNC_TRACKER_THREADS`` worker threads (default 16), however many
  runs and backends are open: 1000 runs on one store share them;
* the endpoint, whatever one server or disk is to its backend (a filesystem root, a tracking
  server URI, a bucket): at most ``ASYNC_TRACKER_THREADS_PER_ENDPOINT`` of its calls (default
  4) hold a thread at once, the others wait their turn in call order. Calls hung on a dead
  server hold at most that many threads, and the other endpoints keep the rest.

A call holds its slot until it returns in its thread, not until its caller stops waiting. A
caller that gives up (a close() deadline cancels it) returns at once and abandons the call:
one not yet started never starts, one running keeps its thread until it returns, maybe never.
That is what makes the cap true with hung calls: anyio's ``to_thread`` gives a cancelled
call's limiter token back while its thread runs on, so each close() deadline of a run on a dead
server would add a thread for good.

The pool is plain threads and a lock, tied to no event loop: the process's runtime creates it
on first use, and a forked child's runtime a new one (the child has none of the parent's
threads, and maybe a copy of a held lock).
Its threads are daemons, so a hung call never keeps the process alive. Idle threads end after
``THREAD_IDLE_S``, but for one: the tracker loop starts it with itself, and it stays, because
Python 3.12 refuses to start threads at interpreter exit, when open runs are closed.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from async_tracker.runtime.signals import start_thread
from async_tracker.settings import THREAD_IDLE_S

T = TypeVar("T")

THREAD_NAME = "async-tracker-worker"

# Set in each worker thread (see in_worker_thread): a plain attribute of a thread-local, read
# without the pool's lock.
_this_thread = threading.local()


def in_worker_thread() -> bool:
    """Whether the calling thread is a worker of a pool (it runs a backend's blocking call).
    Such a call must not wait for deliveries: they may need this very thread, or its
    endpoint's slot, which it holds until it returns."""
    return getattr(_this_thread, "worker", False)


class _Job(Generic[T]):
    __slots__ = ("endpoint", "fn", "future")

    def __init__(self, fn: Callable[[], T], endpoint: str) -> None:
        self.fn = fn
        self.endpoint = endpoint
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # its caller gave up before it started
        try:
            result = self.fn()
        except BaseException as exc:  # the caller's to handle, whatever it is
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


class _Endpoint:
    __slots__ = ("held", "waiting")

    def __init__(self) -> None:
        self.held = 0  # jobs holding a slot: waiting for a thread, or running
        self.waiting: deque[_Job[Any]] = deque()  # jobs waiting for a slot, in call order


class ThreadPool:
    """At most ``max_threads`` daemon threads, and ``per_endpoint`` calls of one endpoint at
    once (see the module's docstring). ``submit`` never blocks."""

    def __init__(
        self, max_threads: int, per_endpoint: int, idle_s: float = THREAD_IDLE_S
    ) -> None:
        if max_threads < 1 or per_endpoint < 1:
            raise ValueError(
                f"a thread pool needs max_threads >= 1 and per_endpoint >= 1, "
                f"got {max_threads} and {per_endpoint}"
            )
        self.max_threads = max_threads
        self.per_endpoint = per_endpoint
        self.idle_s = idle_s
        # One lock for all the state below. It is never held while a call runs, nor by the
        # event loop for longer than a few deque operations.
        self._cond = threading.Condition(threading.Lock())
        self._ready: deque[_Job[Any]] = deque()  # holding a slot, waiting for a thread
        self._endpoints: dict[str, _Endpoint] = {}  # only endpoints with slots held
        self._threads = 0  # started and not ended
        self._idle = 0  # waiting for a job
        self._named = 0
        self.peak_threads = 0

    @property
    def threads(self) -> int:
        """Worker threads now (running a call, hung in one, or idle)."""
        return self._threads

    def held(self, endpoint: str) -> tuple[int, int]:
        """(slots held, calls waiting for one) of an endpoint."""
        with self._cond:
            ep = self._endpoints.get(endpoint)
            return (0, 0) if ep is None else (ep.held, len(ep.waiting))

    def start(self) -> None:
        """Makes sure one thread exists (see the module's docstring: the exit path)."""
        with self._cond:
            if self._threads == 0:
                self._spawn_locked()

    def submit(self, fn: Callable[[], T], endpoint: str) -> concurrent.futures.Future[T]:
        """Runs ``fn()`` in a worker thread when its endpoint has a free slot and a thread is
        free. Cancelling the future abandons the call (it runs on if it has started)."""
        job = _Job(fn, endpoint)
        with self._cond:
            ep = self._endpoints.get(endpoint)
            if ep is None:
                ep = self._endpoints[endpoint] = _Endpoint()
            if ep.held < self.per_endpoint:
                ep.held += 1
                self._ready.append(job)
                self._wake_locked()
                if self._threads == 0:
                    # Not even one thread could be started (the interpreter is exiting, or
                    # the system is out of threads): nobody would ever run the call.
                    self._ready.remove(job)
                    self._release_locked(endpoint)
                    raise RuntimeError(
                        "async_tracker cannot start a worker thread for a blocking call"
                    )
            else:
                ep.waiting.append(job)
        # Registered outside the lock: the callback takes it. It holds the endpoint, not the
        # job: the future keeps its callbacks, and job -> future -> job would be a cycle that
        # keeps the call's arguments (a batch) alive until the garbage collector runs.
        job.future.add_done_callback(functools.partial(self._forget, endpoint))
        return job.future

    def _forget(self, endpoint: str, future: concurrent.futures.Future[Any]) -> None:
        # Runs in the thread that cancels the future (the event loop's, at a deadline). A
        # job that has not started is taken out at once: its slot goes to the next call, and
        # behind a dead endpoint the abandoned calls of every close() do not pile up.
        if not future.cancelled():
            return
        with self._cond:
            for i, job in enumerate(self._ready):
                if job.future is future:
                    del self._ready[i]
                    self._release_locked(endpoint)
                    return
            ep = self._endpoints.get(endpoint)
            if ep is not None:
                for i, job in enumerate(ep.waiting):
                    if job.future is future:
                        del ep.waiting[i]
                        return
            # Else a worker has taken it: the worker sees the cancellation and frees the slot.

    def _wake_locked(self) -> None:
        if len(self._ready) > self._idle and self._threads < self.max_threads:
            self._spawn_locked()
        self._cond.notify()

    def _spawn_locked(self) -> None:
        self._named += 1
        thread = threading.Thread(
            target=self._work, name=f"{THREAD_NAME}-{self._named}", daemon=True
        )
        try:
            # The new thread starts by taking the lock held here: no deadlock, it waits.
            start_thread(thread)
        except RuntimeError:
            return  # at exit (Python 3.12+) or out of threads: the threads there are will do
        self._threads += 1
        self.peak_threads = max(self.peak_threads, self._threads)

    def _release_locked(self, endpoint: str) -> None:
        ep = self._endpoints[endpoint]
        if ep.waiting:
            # The slot passes to the endpoint's next call, in call order.
            self._ready.append(ep.waiting.popleft())
            self._wake_locked()
        else:
            ep.held -= 1
            if ep.held == 0:
                del self._endpoints[endpoint]

    def _take_locked(self) -> _Job[Any] | None:
        timed_out = False
        while not self._ready:
            # One idle thread always stays (see the module's docstring: the exit path), also
            # when the others are hung in calls.
            if timed_out and self._idle > 0:
                return None
            self._idle += 1
            try:
                timed_out = not self._cond.wait(self.idle_s)
            finally:
                self._idle -= 1
        return self._ready.popleft()

    def _work(self) -> None:
        _this_thread.worker = True
        finished: str | None = None  # the endpoint of the call just run
        while True:
            with self._cond:
                if finished is not None:
                    self._release_locked(finished)
                job = self._take_locked()
                if job is None:
                    self._threads -= 1
                    return
            job.run()
            # Not kept while idle: the job holds the call's arguments and result.
            finished, job = job.endpoint, None
