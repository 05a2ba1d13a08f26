"""How runs end by themselves: at interpreter exit, on SIGTERM, and across a fork.

* At exit, every run still open is closed, all at once, within the longest close timeout.
* On SIGTERM (when the process has not set its own handler first... or has: we chain to it),
  every run is flushed within ``ASYNC_TRACKER_SIGTERM_GRACE`` seconds, then the previous
  handler runs. If that handler is the default one (the process dies), runs are closed instead,
  so that they end cleanly.
* In a forked child (DataLoader workers), every run starts empty with its own flusher: the
  parent's records stay with the parent.
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing.util
import os
import signal
import sys
import threading
import time
import weakref
from types import FrameType
from typing import TYPE_CHECKING, Any

from async_tracker.base import CloseReason
from async_tracker.settings import DEFAULT_SIGTERM_GRACE_S, env_float
from async_tracker.signals import Mask, block_sigterm, restore

if TYPE_CHECKING:
    from async_tracker.run import AppRun

logger = logging.getLogger(__name__)

# Keyed by id(): runs compare equal by value (id and backends, like torchx's dataclass), and
# each of two equal runs must still be found and closed here. An entry goes when its run dies,
# before its id() can be reused.
_runs: weakref.WeakValueDictionary[int, AppRun] = weakref.WeakValueDictionary()
_sigterm_installed = False
_previous_sigterm: Any = None
# The end of the first SIGTERM's grace (time.monotonic()): no close ends later.
_sigterm_deadline = math.inf


# Runs with records on their way, held until they close: the exit hook must close a run its
# caller dropped without closing (its records live on in the flusher, not in the object).
_held: dict[int, AppRun] = {}


def register(run: AppRun) -> None:
    _runs[id(run)] = run


def hold(run: AppRun) -> None:
    _held[id(run)] = run


def release(run: AppRun) -> None:
    _held.pop(id(run), None)


def _all_runs() -> list[AppRun]:
    # valuerefs() copies in one step: safe while another thread registers a run.
    return [run for ref in _runs.valuerefs() if (run := ref()) is not None]


def open_runs() -> list[AppRun]:
    return [r for r in _all_runs() if not r.closed]


def unfinished_runs() -> list[AppRun]:
    """Open runs, and runs whose close is under way (a SIGTERM during close() must wait for
    that close, not kill the process in the middle of it)."""
    return [r for r in _all_runs() if not r.close_finished()]


def exiting_on_exception() -> bool:
    """Whether the code calling this is ending on an exception.

    Two cases, checked in the calling thread:

    * an exception is propagating through the caller (``close()`` in a ``finally`` block or
      an ``except`` clause): ``sys.exc_info()``;
    * the interpreter is exiting after an uncaught exception (our close runs from an atexit
      hook): Python stores that exception in ``sys.last_exc``/``sys.last_value`` before it
      runs atexit hooks. We trust it only when the main thread has finished, because an
      interactive session (a notebook) keeps ``sys.last_value`` from any earlier error.

    ``SystemExit`` with code 0 or None is a normal exit. A ``sys.exit(1)`` is not seen
    (Python does not record it) and ends ``finished``; pass ``reason="failed"`` for that.
    """
    exc = sys.exc_info()[1]
    if exc is None and not threading.main_thread().is_alive():
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None:
        return False
    return not (isinstance(exc, SystemExit) and exc.code in (0, None))


def close_reason(reason: CloseReason | None) -> CloseReason:
    """``reason``, or when not given: ``failed`` while exiting on an exception, else
    ``finished``. Decided in the caller's thread, which is where the exception is known."""
    if reason is not None:
        return reason
    return "failed" if exiting_on_exception() else "finished"


def close_deadline(timeout: float) -> float:
    """The deadline (``time.monotonic()``) of a close given ``timeout`` seconds now: the
    earlier of now + ``timeout`` and the SIGTERM grace's end, once a SIGTERM came. Every
    close asks here, so that one that starts after the signal (the exit hook's, a
    ``close()`` in the previous handler's cleanup) ends within the grace too."""
    return min(time.monotonic() + timeout, _sigterm_deadline)


def close_all(timeout: float | None = None, reason: CloseReason | None = None) -> None:
    """Closes every open run concurrently, and waits for closes under way, by one deadline:
    ``timeout`` (default: the longest ``close_timeout`` among them) from now, or the SIGTERM
    grace's end if earlier; closes under way end by it too. Each run's close logs what it
    could not deliver.
    ``reason`` defaults as :func:`close_reason` says."""
    runs = unfinished_runs()
    if not runs:
        return
    why = close_reason(reason)
    limit = max(r.options.close_timeout for r in runs) if timeout is None else timeout
    deadline = close_deadline(limit)
    # Each run's close says what it could not deliver (once): nothing to log here.
    for wait in [r.begin_close(deadline, why) for r in runs]:
        wait(deadline)


def flush_all(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for run in open_runs():
        try:
            run.flush(max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # a signal handler must not fail
            logger.warning("async_tracker: flushing run %r on SIGTERM failed: %s", run.id, exc)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _sigterm_deadline
    grace = env_float("SIGTERM_GRACE", DEFAULT_SIGTERM_GRACE_S)
    # From now on every close, under way or to come, ends by the grace's end: what is not
    # delivered by then is spooled, before the process may die.
    _sigterm_deadline = min(_sigterm_deadline, time.monotonic() + grace)
    previous = _previous_sigterm
    if previous in (signal.SIG_DFL, None):
        # The default action kills the process without running atexit: end runs now.
        close_all(grace, "killed")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    # The previous handler decides whether the process ends: open runs stay open (flushed),
    # and closes under way end (spooling what they could not deliver) before it runs.
    closing = [r for r in unfinished_runs() if r.closed]
    waits = [r.begin_close(_sigterm_deadline, "killed") for r in closing]
    flush_all(max(0.0, _sigterm_deadline - time.monotonic()))
    for wait in waits:
        wait(_sigterm_deadline)
    if callable(previous):
        previous(signum, frame)


def install_sigterm_handler() -> None:
    """Chains our SIGTERM handler in front of the current one, once, from the main thread
    (Python allows signal handlers to be set only there). ``ASYNC_TRACKER_HANDLE_SIGTERM=0``
    opts out. A process that ignores SIGTERM keeps ignoring it."""
    global _sigterm_installed, _previous_sigterm
    if _sigterm_installed or os.environ.get("ASYNC_TRACKER_HANDLE_SIGTERM", "1") == "0":
        return
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is signal.SIG_IGN:
        return
    _previous_sigterm = current
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = True
    # Registered now, after the other modules' fork hooks: the child unblocks SIGTERM only
    # once its runs, loop and flusher are reset (see signals.py).
    os.register_at_fork(
        before=_block_sigterm_for_fork,
        after_in_parent=_unblock_sigterm_after_fork,
        after_in_child=_unblock_sigterm_after_fork,
    )


# Per thread: the hooks run in the forking thread, and two threads may fork at once.
_fork_masks = threading.local()


def _block_sigterm_for_fork() -> None:
    # A SIGTERM that reached the child before CPython reset its signal state would be
    # dropped, and our handler never run: blocked, it waits in the kernel until the child
    # unblocks it, then runs the handler.
    _fork_masks.mask = block_sigterm()


def _unblock_sigterm_after_fork() -> None:
    mask: Mask | None = getattr(_fork_masks, "mask", None)
    _fork_masks.mask = None
    restore(mask)


def _after_fork_in_child() -> None:
    global _sigterm_deadline
    _sigterm_deadline = math.inf  # the parent's signal, not ours
    for run in _all_runs():
        run._reset_after_fork()


class _Token:
    """Keeps the multiprocessing after-fork registration alive (it holds a weak reference)."""


_mp_token = _Token()


def _close_at_multiprocessing_exit(_: object) -> None:
    # multiprocessing's fork and forkserver children (DataLoader workers) end with os._exit:
    # atexit never runs there, and whatever they logged since the last flush would be lost
    # silently. Their exit does run multiprocessing's own finalizers; this hook runs in each
    # child after it has cleared the parent's finalizers, so close the runs there.
    multiprocessing.util.Finalize(None, close_all, exitpriority=100)


atexit.register(close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
multiprocessing.util.register_after_fork(_mp_token, _close_at_multiprocessing_exit)
