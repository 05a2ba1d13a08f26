"""What the MLflow client raises, as the package's error tree (see
:mod:`async_tracker.errors`), and the errors of this backend's own."""

from __future__ import annotations

import re
import sys

from async_tracker.backend.errors import (
    chain,
    errno_error,
    http_status,
    http_status_error,
    is_network_failure,
    map_group,
)
from async_tracker.errors import (
    BackendError,
    PermanentBackendError,
    RecordError,
    TrackerConfigError,
    TransientBackendError,
)

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup

__all__ = ["AmbiguousRunError", "is_record_refusal", "map_error"]


class AmbiguousRunError(TrackerConfigError, PermanentBackendError):
    """Several MLflow runs of the experiment are named after one run id, and none is ours:
    which one to write to is the user's choice. A :class:`TrackerConfigError` (and so a
    ``ValueError``) for a caller; for a lane, a failure of the backend that keeps the records
    until the duplicates are gone."""


# MLflow error codes (MlflowException.error_code) that may pass by themselves. INTERNAL_ERROR
# is what the client says for a 500 answer, and for a request that failed on the way.
_TRANSIENT_MLFLOW_CODES = frozenset(
    {
        "INTERNAL_ERROR",
        "TEMPORARILY_UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "REQUEST_LIMIT_EXCEEDED",
        "RESOURCE_EXHAUSTED",
        "ABORTED",
        "IO_ERROR",
    }
)
# INVALID_PARAMETER_VALUE is about the entries of the request when its message says so (paths
# of the entries in log_batch, MLflow's limits, immutable params); else (a run id, an
# experiment, a search filter) it is about the backend.
_RECORD_MESSAGE_RE = re.compile(
    r"for parameter '(?:metrics|params|tags|key|value|name)\b"
    r"|parameter '(?:metrics|params|tags)\["
    r"|exceeds the maximum length"
    r"|Changing param values is not allowed"
    r"|Duplicate parameter keys"
    r"|A batch logging request can contain at most"
    r"|Batched logging API requests must be at most"
    r"|Tag value cannot be None"
)
_SQLALCHEMY_TRANSIENT = frozenset({"OperationalError", "TimeoutError", "DisconnectionError"})


def _is_database_busy(exc: BaseException) -> bool:
    """A SQLite store (local, or behind the server) busy with another writer."""
    return any(
        "database is locked" in str(cur) or "database table is locked" in str(cur)
        for cur in chain(exc)
    )


def is_record_refusal(exc: BaseException) -> bool:
    """Whether an ``INVALID_PARAMETER_VALUE`` is about entries of the request (a key, a
    value, MLflow's limits, a param logged again with another value, a request too large)."""
    return _RECORD_MESSAGE_RE.search(str(exc)) is not None


def is_param_conflict(exc: BaseException) -> bool:
    """MLflow refused a param already logged with another value (params are immutable)."""
    return "Changing param values is not allowed" in str(exc)


def is_run_not_active(exc: BaseException) -> bool:
    """The run was deleted (MLflow refuses writes to it)."""
    return "must be in the 'active' state" in str(exc)


def error_code(exc: BaseException) -> str | None:
    code = getattr(exc, "error_code", None)
    return code if isinstance(code, str) else None


def map_error(exc: BaseException, what: str = "request") -> BackendError:
    """The package's error for whatever the MLflow client (or its store) raised while doing
    ``what``, naming it.

    * transient: connection failures and timeouts (requests, urllib3), HTTP 408/429/5xx, the
      MLflow codes INTERNAL_ERROR, TEMPORARILY_UNAVAILABLE, DEADLINE_EXCEEDED,
      REQUEST_LIMIT_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, IO_ERROR, a SQLite store's
      "database is locked", and the OSErrors that pass (a reset, EAGAIN ...);
    * about records (:class:`RecordError`, dropped alone by the lane): INVALID_PARAMETER_VALUE
      about a key or value of the request (see :func:`is_record_refusal`);
    * about the backend (the records are kept): RESOURCE_DOES_NOT_EXIST, PERMISSION_DENIED,
      UNAUTHENTICATED, every other code, a full or read-only artifact store, and any error
      not recognised.

    Exception groups are unwrapped into one error (transient if any part is).
    """
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        mapped = map_group(exc, lambda e: map_error(e, what))
        if mapped is not None:
            return mapped
    message = f"MLflow {what} failed: {type(exc).__name__}: {exc}"
    code = error_code(exc)
    if code is not None and code not in message:
        message += f" ({code})"
    if is_network_failure(exc) or _is_database_busy(exc):
        return TransientBackendError(message)
    if code is not None:  # an MlflowException
        if code in _TRANSIENT_MLFLOW_CODES:
            return TransientBackendError(message)
        if code == "INVALID_PARAMETER_VALUE" and is_record_refusal(exc):
            return RecordError(message)
        return PermanentBackendError(message)
    status = http_status(exc)
    if status is not None:
        return http_status_error(status, message)
    if isinstance(exc, OSError):  # a local artifact store: a copy that failed
        mapped_os = errno_error(exc.errno, message)
        if mapped_os is not None:
            return mapped_os
    if type(exc).__module__.startswith("sqlalchemy") and type(exc).__name__ in (
        _SQLALCHEMY_TRANSIENT
    ):
        return TransientBackendError(message)
    return PermanentBackendError(message)
