"""The process around the tracker: one :class:`Runtime` per process owns what is per process.

* The tracker loop (:mod:`~async_tracker.runtime.loop`), the worker threads for blocking calls
  (:mod:`~async_tracker.runtime.threads`), the spool thread (:mod:`async_tracker.spool.io`)
  and the flusher (:mod:`~async_tracker.runtime.flusher`), each started on first use.
* The runs of the process (held as :class:`Run`; ``AppRun`` registers itself) and how they
  end by themselves: at interpreter exit every run still open is closed, all at once, each
  within its own close timeout; in a ``multiprocessing`` child too (it leaves with ``os._exit``).
* SIGTERM (when ``ASYNC_TRACKER_HANDLE_SIGTERM`` is not ``0``): every close under way, or to
  come, ends by the grace's end (``ASYNC_TRACKER_SIGTERM_GRACE`` seconds, default 5): what is
  not delivered by then is spooled. Then the previous handler runs (open runs were flushed,
  and stay open for it), or, if that is the default action, the runs are closed first, as
  ``killed``, and the process dies by the signal.

Fork, one mechanism. :func:`runtime` checks the pid: a forked child gets a new ``Runtime``,
so every per-process object (threads, loop, locks) is new there, and nothing the parent's
other threads held at the fork (a lock) is ever used. What cannot wait for a pid check is
done by the single ``os.register_at_fork`` registration below, in this order: a lazy import
under way on another thread is let finish (see :data:`lazy_imports`); SIGTERM is blocked
across the fork; in the child the parent's spool locks are forgotten, the child's
runtime takes over the runs and each forgets the parent's records (before any write of the
child), and only then is SIGTERM unblocked (a signal sent meanwhile runs the handler then, on
the child's runs). ``multiprocessing``'s own after-fork hook registers the child's exit close.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import importlib
import logging
import math
import multiprocessing.util
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any, Protocol, TypeVar

from async_tracker.base import CloseReason
from async_tracker.report import FlushReport
from async_tracker.runtime.ending import (
    Ending,
    decide,
    ending_of,
    exception_now,
    note_sigterm,
)
from async_tracker.runtime.flusher import Flusher
from async_tracker.runtime.loop import TrackerLoop, wait_future
from async_tracker.runtime.signals import Mask, block_sigterm, restore
from async_tracker.runtime.threads import ThreadPool
from async_tracker.runtime.writers import Writers
from async_tracker.settings import (
    CLOSE_SWITCH_INTERVAL_S,
    DEFAULT_SIGTERM_GRACE_S,
    DEFAULT_THREAD_LIMIT,
    DEFAULT_THREADS_PER_ENDPOINT,
    RunOptions,
    env_float,
    env_int,
)
from async_tracker.spool.io import ThreadIO
from async_tracker.spool.owner import locks

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Run(Protocol):
    """What the runtime needs of a run (``AppRun``)."""

    @property
    def id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def options(self) -> RunOptions: ...

    def close_finished(self) -> bool: ...

    def begin_close(
        self,
        deadline: float,
        reason: CloseReason | Ending | None = None,
        exc: BaseException | None = None,
        *,
        process_end: bool = False,
    ) -> Callable[[float], FlushReport]: ...

    def flush(self, timeout: float | None = None) -> FlushReport: ...

    def forget_after_fork(self) -> None: ...


class Runtime:
    """What one process has of async_tracker: its threads, its loop and its runs. Get it with
    :func:`runtime`; nothing here is shared with a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        # Guards starting the loop, the pool, the spool thread and the flusher. New with each
        # runtime: one a thread of the parent held at the fork is never used in the child.
        self._lock = threading.Lock()
        self._loop: TrackerLoop | None = None
        self._pool: ThreadPool | None = None
        self._spool_io: ThreadIO | None = None
        self._flusher: Flusher | None = None
        # Keyed by id(): runs compare equal by value (id and backends, like torchx's
        # dataclass), and each of two equal runs must still be found and closed. An entry
        # goes when its run dies, before its id() can be reused.
        self._runs: weakref.WeakValueDictionary[int, Run] = weakref.WeakValueDictionary()
        # Runs with records on their way, held until they close: the exit hook must close a
        # run its caller dropped without closing (its records live on in the flusher).
        self._held: dict[int, Run] = {}
        # The runs writing now, which reads wait for (see runtime/writers.py).
        self.writers = Writers()
        self.sigterm_installed = False
        self._previous_sigterm: Any = None
        # The end of the first SIGTERM's grace (time.monotonic()): no close ends later.
        self._sigterm_deadline = math.inf
        # The closes under way that asked for a short switch interval (see hurry()), and the
        # interval they found.
        self._hurrying = 0
        self._switch_interval = sys.getswitchinterval()
        self._hurry_lock = threading.Lock()
        # Work that no caller waits for (see background), each with the time.monotonic()
        # the exit waits for it until. An entry leaves when its work ends (a done callback,
        # on the loop's thread): dict operations are atomic under the GIL, and the exit
        # hook goes through a copy.
        self._background: dict[concurrent.futures.Future[Any], float] = {}

    # -- the process's threads, started on first use -----------------------------------------
    @property
    def loop(self) -> TrackerLoop:
        """The tracker loop (a daemon thread running an anyio event loop)."""
        loop = self._loop
        if loop is None:
            with self._lock:
                if self._loop is None:
                    self._loop = TrackerLoop()
                loop = self._loop
        return loop

    @property
    def pool(self) -> ThreadPool:
        """The worker threads for blocking calls, sized by ``ASYNC_TRACKER_THREADS`` and
        ``ASYNC_TRACKER_THREADS_PER_ENDPOINT``."""
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPool(
                        env_int("THREADS", DEFAULT_THREAD_LIMIT),
                        env_int("THREADS_PER_ENDPOINT", DEFAULT_THREADS_PER_ENDPOINT),
                    )
                pool = self._pool
        return pool

    @property
    def spool_io(self) -> ThreadIO:
        """The spool thread, where every spool file operation runs."""
        io = self._spool_io
        if io is None:
            with self._lock:
                if self._spool_io is None:
                    self._spool_io = ThreadIO()
                io = self._spool_io
        return io

    def flusher(self) -> Flusher:
        """The flusher on the tracker loop, started on first call, with the spool thread and
        one worker thread: the exit path may need them, and Python 3.12 refuses to start
        threads at interpreter shutdown."""
        flusher = self._flusher
        if flusher is None:
            loop, io, pool = self.loop, self.spool_io, self.pool
            io.start()
            pool.start()
            with self._lock:
                if self._flusher is None:
                    self._flusher = Flusher(loop)
                flusher = self._flusher
        return flusher

    def background(
        self, fn: Callable[..., Awaitable[T]], *args: Any, within_s: float
    ) -> concurrent.futures.Future[T]:
        """Starts ``fn(*args)`` on the tracker loop for no caller to wait for (a reader's
        compaction after its read), ``fn`` ending within ``within_s`` seconds by itself.
        The process's exit waits for it until then: it may be running pyarrow in a worker
        thread, and a process that exits under a thread in native code can abort."""
        future = self.loop.submit(fn, *args)
        self._background[future] = time.monotonic() + within_s
        future.add_done_callback(self._background_ended)
        return future

    def _background_ended(self, future: concurrent.futures.Future[Any]) -> None:
        self._background.pop(future, None)

    def wait_background(self) -> None:
        """Waits for the work :meth:`background` started, each until its bound."""
        for future, deadline in list(self._background.items()):
            concurrent.futures.wait([future], max(0.0, deadline - time.monotonic()))

    # -- the runs ------------------------------------------------------------------------------
    def register(self, run: Run) -> None:
        self._runs[id(run)] = run

    def hold(self, run: Run) -> None:
        self._held[id(run)] = run

    def release(self, run: Run) -> None:
        self._held.pop(id(run), None)

    def runs(self) -> list[Run]:
        # valuerefs() copies in one step: safe while another thread registers a run.
        return [run for ref in self._runs.valuerefs() if (run := ref()) is not None]

    def unfinished_runs(self) -> list[Run]:
        """Open runs, and runs whose close is under way (a SIGTERM during close() must wait
        for that close, not kill the process in the middle of it)."""
        return [r for r in self.runs() if not r.close_finished()]

    # -- the end of runs -----------------------------------------------------------------------
    @contextlib.contextmanager
    def hurry(self) -> Iterator[None]:
        """While closes run: the interpreter's switch interval at ``CLOSE_SWITCH_INTERVAL_S``
        (if it is not shorter already), so that the closing thread and the tracker loop get
        the GIL back within a fraction of a millisecond per thread that holds it, not 5 ms:
        a close's bound must hold while other threads keep the GIL busy. The interval found
        is restored when the last close under way returns (unless someone changed it
        meanwhile: theirs stays)."""
        with self._hurry_lock:
            if self._hurrying == 0:
                self._switch_interval = sys.getswitchinterval()
                if self._switch_interval > CLOSE_SWITCH_INTERVAL_S:
                    sys.setswitchinterval(CLOSE_SWITCH_INTERVAL_S)
            self._hurrying += 1
        try:
            yield
        finally:
            with self._hurry_lock:
                self._hurrying -= 1
                if self._hurrying == 0 and sys.getswitchinterval() == min(
                    self._switch_interval, CLOSE_SWITCH_INTERVAL_S
                ):
                    sys.setswitchinterval(self._switch_interval)

    def close_deadline(self, timeout: float) -> float:
        """The deadline (``time.monotonic()``) of a close given ``timeout`` seconds now: the
        earlier of now + ``timeout`` and the SIGTERM grace's end, once a SIGTERM came. Every
        close asks here, so that one that starts after the signal (the exit hook's, a
        ``close()`` in the previous handler's cleanup) ends within the grace too."""
        return min(time.monotonic() + timeout, self._sigterm_deadline)

    def close_all(self, timeout: float | None = None, reason: CloseReason | None = None) -> None:
        """Closes every open run concurrently, and waits for closes under way: each by
        ``timeout`` from now (default: its own ``close_timeout``, so that a run that allows
        0.2 s never waits out another's 10 s), or the SIGTERM grace's end if earlier; closes
        under way end by it too. Each run's close says what it could not deliver. Without
        ``reason``, each run's ending is decided by :func:`~async_tracker.runtime.ending.decide`
        from the exception ending the process (at exit: the uncaught one) and what was
        reported on the run. These are the closes of the process's end (exit, SIGTERM, a
        ``multiprocessing`` child's exit): a forked child's copy of a run of its parent ends
        its own share of the run, not the run (see ``AppRun.begin_close``)."""
        runs = self.unfinished_runs()
        if not runs:
            return
        # Looked up here, in the thread that closes: where the exception is known.
        exc = exception_now()
        deadlines = [
            self.close_deadline(r.options.close_timeout if timeout is None else timeout)
            for r in runs
        ]
        with self.hurry():
            # Every close begins before any is waited for: they run at once on the loop.
            waits = [
                r.begin_close(deadline, reason, exc, process_end=True)
                for r, deadline in zip(runs, deadlines)
            ]
            for wait, deadline in zip(waits, deadlines):
                wait(deadline)

    def flush_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for run in self.runs():
            if run.closed:
                continue
            try:
                run.flush(max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # a signal handler must not fail
                logger.warning("async_tracker: flushing run %r on SIGTERM failed: %s", run.id, exc)

    # -- SIGTERM -------------------------------------------------------------------------------
    def install_sigterm_handler(self) -> None:
        """Chains our SIGTERM handler in front of the current one, once, from the main thread
        (Python allows signal handlers to be set only there). ``ASYNC_TRACKER_HANDLE_SIGTERM=0``
        opts out. A process that ignores SIGTERM keeps ignoring it."""
        if self.sigterm_installed or os.environ.get("ASYNC_TRACKER_HANDLE_SIGTERM", "1") == "0":
            return
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current is signal.SIG_IGN:
            return
        self._previous_sigterm = current
        signal.signal(signal.SIGTERM, _on_sigterm)
        self.sigterm_installed = True

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # First: every run this process closes from now on ends killed, whoever closes it
        # (below, the previous handler's cleanup, a `with` block it unwinds, the exit hook).
        note_sigterm()
        grace = env_float("SIGTERM_GRACE", DEFAULT_SIGTERM_GRACE_S)
        # From now on every close, under way or to come, ends by the grace's end: what is not
        # delivered by then is spooled, before the process may die.
        self._sigterm_deadline = deadline = min(self._sigterm_deadline, time.monotonic() + grace)
        previous = self._previous_sigterm
        if previous in (signal.SIG_DFL, None):
            # The default action kills the process without running atexit: end runs now.
            self.close_all(grace)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        # The previous handler decides whether the process ends: open runs stay open
        # (flushed), and closes under way end (spooling what they could not deliver) first.
        with self.hurry():
            waits = [r.begin_close(deadline) for r in self.unfinished_runs() if r.closed]
            self.flush_all(max(0.0, deadline - time.monotonic()))
            for wait in waits:
                wait(deadline)
        if callable(previous):
            previous(signum, frame)

    # -- fork ----------------------------------------------------------------------------------
    def take_over(self, parent: Runtime) -> None:
        """In a forked child, before any other thread exists: the parent's runs become ours,
        each forgetting the parent's records (they stay the parent's), and the SIGTERM
        handler the child inherited stays chained as it was."""
        self.sigterm_installed = parent.sigterm_installed
        self._previous_sigterm = parent._previous_sigterm
        for run in parent.runs():
            run.forget_after_fork()
            self.register(run)


# One runtime per pid. dict.get and dict.setdefault are atomic under the GIL: two threads
# that race for a new process's runtime get the same one, and no lock is needed (a lock
# here could be held by another thread of the parent at a fork).
_runtimes: dict[int, Runtime] = {}


def runtime() -> Runtime:
    """This process's :class:`Runtime` (a new one in a forked child)."""
    pid = os.getpid()
    current = _runtimes.get(pid)
    if current is None:
        current = _runtimes.setdefault(pid, Runtime(pid))
    return current


async def run_blocking(fn: Callable[..., T], *args: Any, endpoint: str) -> T:
    """``fn(*args)`` in a worker thread of the process's pool, within ``endpoint``'s limit.

    ``endpoint`` names what the call talks to, so that calls hung on one server hold at most
    its share of the threads: a filesystem root (``file:///data/runs``), a tracking server
    URI, a bucket. Cancelling the await abandons the call (see
    :meth:`~async_tracker.runtime.threads.ThreadPool.submit`). Pass keyword arguments with
    ``functools.partial``.
    """
    future = runtime().pool.submit(functools.partial(fn, *args), endpoint)
    # Woken through the awaiting loop's thread-safe entry (the tracker loop's, or asyncio's or
    # trio's for a backend used directly); cancelling the await cancels the job's future.
    return await wait_future(future)


def exiting_on_exception() -> bool:
    """Whether the code calling this is ending on an exception that makes its runs end other
    than finished (see :func:`~async_tracker.runtime.ending.exception_now` for where it is
    looked up, and :func:`~async_tracker.runtime.ending.ending_of` for the rule)."""
    return ending_of(exception_now()).reason != "finished"


def close_reason(reason: CloseReason | None) -> CloseReason:
    """``reason``, or when not given, the reason :func:`~async_tracker.runtime.ending.decide`
    finds for the calling code now (SIGTERM, the exception it is ending on). Decided in the
    caller's thread, which is where the exception is known."""
    return decide(reason, exception_now()).reason


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    runtime().on_sigterm(signum, frame)


def _close_all_at_exit() -> None:
    current = runtime()
    try:
        current.close_all()
    except KeyboardInterrupt:
        # Ctrl-C while the exit waits for delivery. The closes under way were cut short (see
        # AppRun.begin_close): wait the moment their spooling takes, so that each says
        # where its records are, rather than a traceback and nothing said. The exit status
        # stays the program's (Python ignores an atexit hook's exception).
        logger.warning("async_tracker: interrupted at exit: spooling what is not delivered")
        try:
            current.close_all(0.0)
        except KeyboardInterrupt:
            logger.warning(
                "async_tracker: interrupted again: records not spooled yet are lost with the "
                "process"
            )
            return
    try:
        current.wait_background()
    except KeyboardInterrupt:
        return  # work no caller waits for (a reader's compaction): left to a later process


# -- the one fork registration ---------------------------------------------------------------

# Held by a thread while it imports a module lazily (the fsspec store's Parquet modules, numpy
# and pyarrow, at the first write or read of metrics, on the tracker's threads); a fork waits
# for it. A child forked in the middle would inherit the module half made, its import lock
# held by a thread the child does not have: the child's own import of it would never return.
lazy_imports = threading.RLock()
# The heavy modules loaded through import_in_thread (see there).
_LOADED: set[str] = set()


def import_here(name: str) -> None:
    """Imports the module ``name`` on the calling thread (under :data:`lazy_imports`), so
    that :func:`import_in_thread` finds it loaded. For the caller's own thread: CPython
    decides how a process that a Ctrl-C ended exits (by SIGINT, as a shell expects) with a
    flag that an import of pyarrow on another thread clears, so a store loads its codec on
    the thread that makes it rather than on the tracker's at its first write."""
    if name not in _LOADED:
        with lazy_imports:
            importlib.import_module(name)
        _LOADED.add(name)


async def import_in_thread(name: str, *, endpoint: str) -> None:
    """Imports the module ``name`` (and what it imports: numpy, pyarrow) in a worker thread,
    under :data:`lazy_imports`, unless it was loaded so already. Such an import takes a tenth
    of a second or more (seconds from a cold disk): on the tracker loop it would stall every
    run's deliveries and close deadlines meanwhile."""
    if name in _LOADED:
        return

    def load() -> None:
        with lazy_imports:
            importlib.import_module(name)

    await run_blocking(load, endpoint=endpoint)
    _LOADED.add(name)


# The most a fork waits for such an import (then it forks, as it would without the lock).
_FORK_IMPORT_WAIT_S = 30.0

# Per thread: the hooks run in the forking thread, and two threads may fork at once.
_forking = threading.local()


def _before_fork() -> None:
    _forking.importing = lazy_imports.acquire(timeout=_FORK_IMPORT_WAIT_S)
    parent = _runtimes.get(os.getpid())
    _forking.parent = parent
    # A SIGTERM that reached the child before CPython reset its signal state would be
    # dropped, and our handler never run: blocked, it waits in the kernel until the child
    # unblocks it (last, below), then runs the handler.
    _forking.mask = block_sigterm() if parent is not None and parent.sigterm_installed else None


def _after_fork_in_parent() -> None:
    mask: Mask | None = getattr(_forking, "mask", None)
    _forking.mask = _forking.parent = None
    _let_imports_go()
    restore(mask)


def _after_fork_in_child() -> None:
    mask: Mask | None = getattr(_forking, "mask", None)
    parent: Runtime | None = getattr(_forking, "parent", None)
    _forking.mask = _forking.parent = None
    # The inherited lock files share the parent's locks (flock belongs to the open file):
    # closed at once, or the parent's release would not free them while this child lives.
    locks.forget_after_fork()
    _let_imports_go()  # held by this thread, the one thread the child has
    if parent is not None:
        _runtimes.pop(parent.pid, None)  # the parent's threads and locks: not ours
        runtime().take_over(parent)
    restore(mask)


def _let_imports_go() -> None:
    if getattr(_forking, "importing", False):
        _forking.importing = False
        lazy_imports.release()


class _Token:
    """Keeps the multiprocessing after-fork registration alive (it holds a weak reference)."""


_mp_token = _Token()


def _close_at_multiprocessing_exit(_: object) -> None:
    # multiprocessing's fork and forkserver children (DataLoader workers) end with os._exit:
    # atexit never runs there, and whatever they logged since the last flush would be lost
    # silently. Their exit does run multiprocessing's own finalizers; this hook runs in each
    # child after it has cleared the parent's finalizers, so close the runs there.
    multiprocessing.util.Finalize(None, _close_all_at_exit, exitpriority=100)


atexit.register(_close_all_at_exit)
os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
multiprocessing.util.register_after_fork(_mp_token, _close_at_multiprocessing_exit)
