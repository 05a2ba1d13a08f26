"""What backends share to map their libraries' errors, once, at their boundary.

A backend raises exactly one :class:`~async_tracker.errors.BackendError` per failed call,
made by :func:`map_failure` from the shared table
(:data:`~async_tracker.error_table.SHARED_TABLE`, with the backend's own rows added by
:meth:`~async_tracker.error_table.ErrorTable.extend`) and a message naming what failed (see
:func:`async_tracker.errors.classify` for what the lane does with each kind):

* :class:`TransientBackendError`: may pass by itself (a connection refused or reset, a
  timeout, a throttled request, an answer 408/429/5xx): retried with backoff;
* :class:`BackendUnavailableError`: about the backend, will not pass by retrying at once
  (credentials, permissions, a missing bucket, a read-only or full store): the records are
  kept and retried later. Errors the table does not know map here too, never to
  :class:`RecordError`;
* :class:`RecordError`: about records of the batch (a value the backend cannot encode or
  store, an object too large): the lane finds and drops those records alone.

A failure is mapped once: an error that already is a :class:`BackendError` (mapped where the
backend knew which file or request failed) is returned as it is by every later mapping, the
lane's included, its message never wrapped again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from async_tracker.error_table import SHARED_TABLE, ErrorTable, Kind, chain
from async_tracker.errors import (
    BackendError,
    BackendUnavailableError,
    RecordError,
    TransientBackendError,
)

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup

__all__ = [
    "chain",
    "combine",
    "error_of_kind",
    "leaves",
    "map_failure",
    "map_group",
]

_CLASSES: dict[Kind, type[BackendError]] = {
    "transient": TransientBackendError,
    "backend": BackendUnavailableError,
    "record": RecordError,
}


def error_of_kind(kind: Kind, message: str) -> BackendError:
    """The error of the tree for ``kind``, with ``message``."""
    return _CLASSES[kind](message)


def map_failure(
    exc: BaseException, message: Callable[[BaseException], str], table: ErrorTable = SHARED_TABLE
) -> BackendError:
    """The one mapping of a backend's failure: ``exc`` as the error of the tree ``table``
    says, with the text ``message(exc)`` (naming what failed). An error already mapped (a
    :class:`BackendError`) is returned as it is. An exception group is mapped leaf by leaf
    into one error (see :func:`map_group`); one holding a leaf that is not an ``Exception``
    (a cancellation) is not a failure the table knows: about the backend."""
    if isinstance(exc, BaseExceptionGroup):
        mapped = map_group(exc, lambda leaf: _map_one(leaf, message, table))
        if mapped is not None:
            return mapped
    return _map_one(exc, message, table)


def _map_one(
    exc: BaseException, message: Callable[[BaseException], str], table: ErrorTable
) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    return error_of_kind(table.kind(exc) or "backend", message(exc))


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions of a (nested) exception group, or ``[exc]``."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


def combine(errors: Sequence[BackendError], prefix: str = "") -> BackendError:
    """One error for several parts of one call that failed (the requests of a flush).

    Transient if any part is (a retry at once may succeed, and meets the other errors
    again if they persist); else about the backend if any part is; else about records, with
    ``refused`` summed when every part says how many it left out.
    """
    if not errors:
        raise ValueError("combine() needs at least one error")
    if len(errors) == 1 and not prefix:
        return errors[0]
    text = prefix + "; ".join(str(e) for e in errors)
    transient = [e for e in errors if isinstance(e, TransientBackendError)]
    if transient:
        return TransientBackendError(text)
    if any(not isinstance(e, RecordError) for e in errors):
        return BackendUnavailableError(text)
    counts = [e.refused for e in errors if isinstance(e, RecordError)]
    refused = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    return RecordError(text, refused=refused)


def map_group(
    group: BaseExceptionGroup[BaseException], map_one: Callable[[Exception], BackendError]
) -> BackendError | None:
    """One error for an exception group: each leaf mapped by ``map_one``, then combined
    (see :func:`combine`). None when a leaf is not an ``Exception`` (a cancellation, a
    ``KeyboardInterrupt``): never a backend's failure, the group must propagate as it is."""
    parts = leaves(group)
    errors: list[BackendError] = []
    for leaf in parts:
        if not isinstance(leaf, Exception):
            return None
        errors.append(map_one(leaf))
    return combine(errors)
