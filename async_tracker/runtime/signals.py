"""Signal masks: which thread a SIGTERM or a Ctrl-C reaches, and when.

Python runs signal handlers in the main thread only, and only when that thread next checks
for them. Two ways a SIGTERM could reach the process and never run its handler (the process
then lives on, and a parent such as ``multiprocessing.Pool.terminate()`` waits on it forever):

* the kernel gives a process-wide signal to any thread that does not block it: one of our
  threads takes it, and the main thread, asleep in a blocking call, is never woken. So our
  threads start with SIGTERM and SIGINT blocked (a thread inherits the mask of the thread that
  starts it: the tracker loop's own worker threads are covered too);
* a signal that reaches a forked child before CPython has reset its signal state is dropped
  by that reset (a pool's workers are SIGTERMed while some may not have run yet). So while our
  handler is installed, SIGTERM is blocked across ``fork()`` and unblocked in the child after
  its reset: a signal sent meanwhile waits in the kernel, and is handled then.

Where ``pthread_sigmask`` does not exist (Windows) these are no-ops.
"""

from __future__ import annotations

import signal
import threading

Mask = set[int | signal.Signals]  # a thread's blocked signals

_CAN_MASK = hasattr(signal, "pthread_sigmask")
_QUIET = frozenset({signal.SIGTERM, signal.SIGINT})


def start_thread(thread: threading.Thread) -> None:
    """Starts one of our threads with SIGTERM and SIGINT blocked, leaving the caller's mask
    as it was."""
    if not _CAN_MASK:
        thread.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _QUIET)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def block_sigterm() -> Mask | None:
    """Blocks SIGTERM in this thread; returns the mask to restore (None: nothing to do)."""
    if not _CAN_MASK:
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def restore(mask: Mask | None) -> None:
    """Restores a mask that :func:`block_sigterm` returned; a SIGTERM that came meanwhile is
    delivered now."""
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
