"""Errors raised by async_tracker, and how a lane treats a backend's failure.

The hierarchy::

    TrackerError
    ├── TrackerClosedError        a write or flush after close()
    ├── TrackerConfigError        a factory, config string or config file that cannot be used
    ├── DeliveryError             close(strict=True) could not deliver everything
    ├── ReadTimeoutError          a read of a store did not answer within its deadline
    └── BackendError              raised by backends (each failure of their libraries
        │                         mapped once, through :mod:`async_tracker.error_table`)
        ├── TransientBackendError   may pass by itself (a server restarting, a throttled or
        │                           timed-out request): retried with backoff
        └── BackendUnavailableError about the backend, will not pass by retrying at once
            │                       (permissions, read-only, disk full, auth, no bucket):
            │                       the records are kept (spooled), retried after a cooldown
            └── RecordError         about records of the batch (a value the backend cannot
                                    store): the lane splits the batch to find them and drops
                                    those records alone, counted and named in the report

``PermanentBackendError`` is a deprecated alias of :class:`BackendUnavailableError` (the
same class: ``isinstance`` and ``except`` work with either name); the failure is not
permanent, the lane keeps the records and retries them after a cooldown.

Lanes decide by :func:`classify` alone. A failure a backend did not map goes by the shared
table (:data:`async_tracker.error_table.SHARED_TABLE`); one the table does not know is
treated as a failure of the backend: the records are kept, never dropped.
"""

from __future__ import annotations

import sys

from async_tracker.error_table import SHARED_TABLE, Kind

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup


class TrackerError(Exception):
    """Base class of every error async_tracker raises on purpose."""


class TrackerClosedError(TrackerError, RuntimeError):
    """The run was closed: it accepts no more writes."""


class TrackerConfigError(TrackerError, ValueError):
    """A tracker factory, config string or config file cannot be used."""


class DeliveryError(TrackerError):
    """Raised by ``close()`` on a strict run when records were not delivered."""


class ReadTimeoutError(TrackerError, TimeoutError):
    """A read of a store (``Store``, a CLI read command, the dashboard) did not answer
    within its deadline (``timeout=``, ``--timeout``); the message names the store."""


class BackendError(TrackerError):
    """A backend failed to store or read records."""


class TransientBackendError(BackendError):
    """A failure that may pass (a server restarting, a throttled request): retried."""


class BackendUnavailableError(BackendError):
    """A failure of the backend that retrying at once will not mend (a missing permission, a
    read-only or full store, a missing bucket). The records are kept and retried after a
    cooldown."""


# Deprecated alias (the old name): the same class, so that code catching or raising
# PermanentBackendError keeps working. New code names BackendUnavailableError.
PermanentBackendError = BackendUnavailableError


class RecordError(BackendUnavailableError):
    """The backend refused records of the batch for good (a value it cannot store).

    By default the lane splits the batch until it finds them, and drops only those. A backend
    that stored the rest of the batch and knows what it refused says so with ``refused`` (how
    many records it left out): the lane then counts those as dropped and the batch as done.
    """

    def __init__(self, message: str, refused: int | None = None) -> None:
        super().__init__(message)
        self.refused = refused


__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "DeliveryError",
    "Kind",
    "PermanentBackendError",
    "ReadTimeoutError",
    "RecordError",
    "TrackerClosedError",
    "TrackerConfigError",
    "TrackerError",
    "TransientBackendError",
    "classify",
    "describe",
    "is_transient",
]


def classify(exc: BaseException) -> Kind:
    """What a lane does with ``exc``: ``"transient"`` retry with backoff, ``"record"`` split
    the batch and drop the refused records, ``"backend"`` keep the records and retry after a
    cooldown. Exception groups are unwrapped: any failure of the backend wins, then any
    transient one (a retry may then meet the record error alone).

    A :class:`BackendError` goes by its class alone (it was mapped, once, by its backend);
    anything else by the shared table (:data:`~async_tracker.error_table.SHARED_TABLE`),
    and what the table does not know is about the backend."""
    if isinstance(exc, BaseExceptionGroup):
        kinds = {classify(e) for e in exc.exceptions}
        if "transient" in kinds and "backend" not in kinds:
            return "transient"
        return "record" if kinds == {"record"} else "backend"
    if isinstance(exc, RecordError):
        return "record"
    if isinstance(exc, TransientBackendError):
        return "transient"
    if isinstance(exc, BackendError):
        return "backend"
    return SHARED_TABLE.kind(exc) or "backend"


def describe(exc: BaseException) -> str:
    """``exc`` in one line, its type first, for reports and logs."""
    return f"{type(exc).__name__}: {exc}"


def is_transient(exc: BaseException) -> bool:
    """True when a retry may succeed at once where ``exc`` was raised."""
    return classify(exc) == "transient"
