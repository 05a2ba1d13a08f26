"""How a run ended: the one rule that turns what ended a run into its ending.

Every run's ending is decided here, whoever closes it: ``close()`` and ``with`` blocks
(``AppRun``), the exit hook and SIGTERM (:mod:`~async_tracker.runtime.process`), and the
framework integrations, which report what happened (an exception, a training that never
reached its end) and never choose a reason of their own.

What ended a run, and the reason it ends with (:func:`ending_of`):

* nothing (the code ran to its end), ``SystemExit(0)`` or ``SystemExit(None)``, and
  ``GeneratorExit`` (the consumer of a generator stopped it): **finished**;
* ``KeyboardInterrupt`` (Ctrl-C, SIGINT), and any other ``BaseException`` that is not an
  ``Exception`` (asyncio's or trio's cancellation: the work was stopped from outside):
  **killed**;
* ``SystemExit`` with any other code (``sys.exit(1)``, ``sys.exit("message")``): **failed**;
* a ``SystemExit`` raised while handling another exception ends as that exception would, and
  finished for a code of 0 or None after an ``Exception``: ``sys.exit(1)`` in an ``except
  KeyboardInterrupt`` (what Lightning does on Ctrl-C) is killed, in an ``except ValueError``
  failed with the ``ValueError``;
* any other exception: **failed**.

Which evidence counts, first to last (:func:`decide`): a reason the caller names
(``close(reason=...)``); SIGTERM (once the process got one, through the runtime's handler,
its runs end killed: the runs a handler's cleanup closes too); the exception at hand (the one
leaving a ``with`` block, the one propagating through ``close()``, or at exit the one the
interpreter exits on); the last outcome a framework reported on the run
(``AppRun.report_ending``: a training that raised, even if the caller caught it); else
finished.

An ending carries what ended the run where that is known: the exception's type (its name,
with its module outside the builtins) and message (its ``str()``, cut to
:data:`MAX_MESSAGE_CHARS`), or ``SIGTERM``. A run that did not finish stores it with its end
record, as the reserved metadata key ``async_tracker.ending`` (see :meth:`Ending.record`).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

from async_tracker.records import CloseReason
from async_tracker.tags import ENDING_KEY, ending_cause

__all__ = [
    "FINISHED",
    "MAX_MESSAGE_CHARS",
    "SIGTERM",
    "Ending",
    "decide",
    "ending_of",
    "exception_now",
    "got_sigterm",
    "note_sigterm",
]

# The most characters of an exception's message that an ending keeps: enough to say what
# went wrong, and within every backend's limit (an MLflow tag holds 5,000 to 8,000).
MAX_MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class Ending:
    """How a run ended: its ``reason``, and what ended it when that is known.

    ``exc_type`` is the type of the exception that ended it (``ValueError``,
    ``torch.OutOfMemoryError``), ``message`` its message; for a signal, ``exc_type`` is None
    and ``message`` the signal's name. Both None when nothing more is known."""

    reason: CloseReason
    exc_type: str | None = None
    message: str | None = None

    @property
    def cause(self) -> str:
        """What ended the run, as one line (``ValueError: bad lr``, ``KeyboardInterrupt``,
        ``SIGTERM``; "" when unknown)."""
        return ending_cause(self.record() or {})

    def record(self) -> dict[str, object] | None:
        """The value the run's end record stores under ``async_tracker.ending`` (None for a
        run that finished: its end record alone says so)."""
        if self.reason == "finished":
            return None
        out: dict[str, object] = {"reason": self.reason}
        if self.exc_type is not None:
            out["type"] = self.exc_type
        if self.message is not None:
            out["message"] = self.message
        return out

    def metadata(self) -> dict[str, object]:
        """The metadata sealed with the run's end record: ``{ENDING_KEY: record}``, or
        nothing for a run that finished."""
        record = self.record()
        return {} if record is None else {ENDING_KEY: record}


FINISHED = Ending("finished")
SIGTERM = Ending("killed", None, "SIGTERM")


def ending_of(exc: BaseException | None) -> Ending:
    """The ending of a run that ``exc`` ended (None: nothing did, it ran to its end)."""
    if exc is None or isinstance(exc, GeneratorExit):
        return FINISHED
    if isinstance(exc, SystemExit):
        clean = exc.code in (0, None)
        context = None if exc.__suppress_context__ else (exc.__cause__ or exc.__context__)
        if context is not None and not isinstance(context, SystemExit):
            # Exiting while handling another exception: that one is what ended the run.
            handled = ending_of(context)
            if handled.reason == "killed" or (handled.reason == "failed" and not clean):
                return handled
        return FINISHED if clean else _described("failed", exc)
    if isinstance(exc, Exception):
        return _described("failed", exc)
    # KeyboardInterrupt, a cancellation (asyncio.CancelledError, trio.Cancelled), a
    # BaseExceptionGroup holding one: stopped from outside.
    return _described("killed", exc)


def _described(reason: CloseReason, exc: BaseException) -> Ending:
    kind = type(exc)
    module = kind.__module__
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises must not stop the run's end
        message = f"<{kind.__name__} whose str() raised>"
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    # A lone surrogate is the one thing text can hold that no backend stores.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return Ending(reason, name, message)


def exception_now() -> BaseException | None:
    """The exception ending the calling code, if any, looked up in the calling thread.

    * An exception propagating through the caller (``close()`` in a ``finally`` block or an
      ``except`` clause): ``sys.exc_info()``.
    * At interpreter exit (an atexit hook), the uncaught exception the interpreter exits on:
      Python stores it in ``sys.last_exc`` (``sys.last_value`` before 3.12) before it runs
      the atexit hooks. Trusted only once the main thread has finished: an interactive
      session (a notebook) keeps there the last error it showed, long after.

    Python records no uncaught ``SystemExit``: a bare ``sys.exit(1)`` at the top of a script
    is not seen here (a ``with`` block it leaves sees it)."""
    exc = sys.exc_info()[1]
    if exc is None and not threading.main_thread().is_alive():
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return exc


# The pid of the process when it got SIGTERM (0: never): a forked child starts without it.
_sigterm_pid = 0


def note_sigterm() -> None:
    """This process got SIGTERM (the runtime's handler says so, first thing): from now on,
    its runs end killed."""
    global _sigterm_pid
    _sigterm_pid = os.getpid()


def got_sigterm() -> bool:
    """Whether this process (not the parent it was forked from) got SIGTERM."""
    return _sigterm_pid == os.getpid()


def decide(
    reason: CloseReason | Ending | None = None,
    exc: BaseException | None = None,
    reported: Ending | None = None,
) -> Ending:
    """A run's ending, from the evidence at hand, strongest first: ``reason`` named by the
    caller (an ``Ending`` as it is; a reason with what ``exc`` says of it, when ``exc`` leads
    to that reason too); SIGTERM; ``exc``, the exception at hand; ``reported``, what a
    framework last said of the run; else finished.

    An integration finds what to report with ``decide(None, exc, otherwise)``: SIGTERM, else
    what the exception it saw says, else its own finding (a training that did not reach its
    end: failed, its exception unknown)."""
    if isinstance(reason, Ending):
        return reason
    if reason is not None:
        said = SIGTERM if got_sigterm() else ending_of(exc)
        return said if said.reason == reason else Ending(reason)
    if got_sigterm():
        return SIGTERM
    if exc is not None:
        return ending_of(exc)
    return reported or FINISHED
