"""Reads see this process's writes: a read first lets the pending records reach the store.

An ``AppRun`` write returns at once and a background lane delivers it later, so a read of
the backend right after it would miss it. torchx's code expects the opposite (its ``AppRun``
writes synchronously)::

    run = AppRun("job", [tracker])
    run.add_metadata(lr=0.01)
    tracker.metadata("job")  # {'lr': 0.01}, as with torchx

So every read waits, first, for the runs of this process that write to the store it reads:

* which runs: the process's :class:`~async_tracker.runtime.writers.Writers` (a run is there
  from its first write until its close is over), those writing the run id read (every run
  for ``run_ids`` and ``lineage``, which tell of other runs) to the same store
  (:func:`store_key`);
* what it waits for: each such run flushes the lanes of that store only (a slow other
  backend never delays the read); a run that is closing is waited for until its close is
  over (the close delivers or spools everything, and stops the lanes a flush would wait on);
* how long: at most the read timeout (``ASYNC_TRACKER_READ_TIMEOUT``, default 30 s, the
  deadline of every read of a store, :func:`~async_tracker.settings.read_timeout`). A lane
  that ends a failed round (its backend is down) answers sooner. What has not reached the
  store by then is named in one warning, and the read answers with what the store has: the
  records stay where they were, delivered later or spooled, never lost.

Which reads: those of ``AppRun`` (``metadata()``, ``artifacts()``, ``sources()``,
``metrics()``, ``lineage()``, ``children()`` and their ``a``-twins), and the reads every
subclass of ``TrackerBase`` or ``AsyncTrackerBase`` defines (``metadata``, ``artifacts``,
``sources``, ``metrics``, ``lineage``, ``run_ids``), wrapped when the class is made
(:mod:`async_tracker.base`): the package's ``FsspecTracker``, ``MLflowTracker``,
``TensorBoardTracker`` and their async classes, ``InMemoryTracker``, and your own subclasses.
A read waits on the caller's thread, or, awaited, on the caller's event loop without
blocking it (:func:`~async_tracker.runtime.loop.wait_future`).

Where a read does not wait:

* on the tracker loop (an async backend's own code, the package's store readers: a delivery
  under way may be the very caller, and waiting for the loop from the loop never ends), and
  in the worker threads that run blocking backends (the call holds the thread, or its
  endpoint's slot, that a delivery may need). ``AppRun``'s reads wait before they go there;
* in a forked child, for the parent's runs: the child's runtime knows only its own;
* a backend that is not our class: torchx's own ``TrackerBase`` subclasses and duck-typed
  plug-ins (``TORCHX_TRACKERS=torchx.tracker.backend.fsspec:create``) keep their methods, which
  we cannot wrap. Read such a backend through the ``AppRun`` or ``as_sync(plugin)`` (their
  reads wait), or call ``run.flush()`` first.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Hashable

import anyio

from async_tracker.adapters import ForeignTracker, SyncTracker, ThreadedTracker
from async_tracker.base import backend_name, install_read_hook
from async_tracker.runtime.loop import wait_future
from async_tracker.runtime.process import Runtime, runtime
from async_tracker.runtime.threads import in_worker_thread
from async_tracker.runtime.writers import Writer
from async_tracker.settings import CLOSE_SLACK_S, ENV_READ_TIMEOUT, read_timeout

logger = logging.getLogger(__name__)


def store_key(backend: object) -> Hashable:
    """The store ``backend`` reads and writes, as reads and writes agree on it: its
    ``store_id`` (two ``FsspecTracker`` objects on one root are one store), else the object
    itself; an adapter (``as_sync``, ``as_async``, a plug-in seen as ours) is the backend it
    wraps."""
    while True:
        if isinstance(backend, SyncTracker):
            backend = backend.async_tracker
        elif isinstance(backend, (ThreadedTracker, ForeignTracker)):
            backend = backend.tracker
        else:
            break
    store = getattr(backend, "store_id", None)
    if isinstance(store, str) and store:
        return ("store", store)
    # The object's id: a run holds its backends, so no other object gets this id while a
    # writer of it is registered.
    return ("object", id(backend))


async def settle(store: Hashable, run_id: str | None, timeout: float | None, what: str) -> None:
    """On the tracker loop: waits at most ``timeout`` seconds (None: no bound) until the
    runs of this process writing ``run_id`` (None: any run) to ``store`` have delivered
    there what they accepted so far; says in one warning what has not arrived. ``what``
    names the read in it."""
    runs = runtime().writers.find(store, run_id)
    if not runs:
        return
    left: dict[str, int] = {}

    async def settle_one(run: Writer) -> None:
        try:
            undelivered = await run.settle_writes(store, timeout)
        except Exception as exc:  # the read goes on, and says why it may miss writes
            logger.warning("async_tracker: %s: waiting for run %r failed: %r", what, run.id, exc)
            return
        if undelivered:
            left[run.id] = left.get(run.id, 0) + undelivered

    # At once: each run waits for its own lanes, all within the one deadline.
    async with anyio.create_task_group() as tg:
        for run in runs:
            tg.start_soon(settle_one, run)
    if left:
        logger.warning(
            "async_tracker: %s answers without %s that this process wrote: not in the store "
            "within %s (they stay pending, or spooled, and are delivered later; nothing is "
            "lost). %s sets the wait; run.flush() waits for them.",
            what,
            ", ".join(f"{n} record{'s' * (n != 1)} of run {r!r}" for r, n in left.items()),
            "its deadline" if timeout is None else f"{timeout:g} s",
            ENV_READ_TIMEOUT,
        )


def _waits(process: Runtime) -> bool:
    """Whether a read on this thread may wait for writers: some run writes, and this thread
    is neither the tracker loop's nor a worker's (see the module's docstring)."""
    return len(process.writers) > 0 and not (
        process.loop.in_loop_thread() or in_worker_thread()
    )


def _what(backend: object, run_id: str | None) -> str:
    where = backend_name(backend)
    return f"a read of run {run_id!r} from {where}" if run_id else f"a read of {where}"


class _OwnWrites:
    """The read hook of :mod:`async_tracker.base`: what every wrapped read calls first."""

    def before_read(self, backend: object, run_id: str | None) -> None:
        process = runtime()
        if not _waits(process):
            return
        store = store_key(backend)
        if not process.writers.find(store, run_id):
            return
        timeout = read_timeout()
        what = _what(backend, run_id)
        future = process.loop.submit(settle, store, run_id, timeout, what)
        try:
            # settle() ends by the deadline itself; the slack covers a loop that is slow to
            # start it. A loop that is stuck (an async backend blocking it) is not waited
            # for past that: the read goes on.
            future.result(None if timeout is None else timeout + CLOSE_SLACK_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            _loop_stuck(what)

    async def abefore_read(self, backend: object, run_id: str | None) -> None:
        process = runtime()
        if not _waits(process):
            return
        store = store_key(backend)
        if not process.writers.find(store, run_id):
            return
        timeout = read_timeout()
        what = _what(backend, run_id)
        # Awaited on the caller's loop without blocking it, and without starting anything
        # there; cancelling the caller cancels the wait on the tracker loop.
        future = process.loop.submit(settle, store, run_id, timeout, what)
        try:
            await wait_future(future, timeout=None if timeout is None else timeout + CLOSE_SLACK_S)
        except concurrent.futures.TimeoutError:
            _loop_stuck(what)


def _loop_stuck(what: str) -> None:
    logger.warning(
        "async_tracker: %s answers without waiting for this process's pending writes: the "
        "tracker loop did not answer (an async backend may be blocking it)",
        what,
    )


install_read_hook(_OwnWrites())
