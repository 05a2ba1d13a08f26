"""What the MLflow client raises, as the package's error tree (see
:mod:`async_tracker.errors`), and the errors of this backend's own."""

from __future__ import annotations

import re
from collections.abc import Callable

from async_tracker.backend.errors import map_failure
from async_tracker.error_table import SHARED_TABLE, ErrorTable, MessageRow
from async_tracker.errors import (
    BackendError,
    BackendUnavailableError,
    TrackerConfigError,
)

__all__ = ["MLFLOW_TABLE", "AmbiguousRunError", "is_record_refusal", "map_error"]


class AmbiguousRunError(TrackerConfigError, BackendUnavailableError, RuntimeError):
    """Several MLflow runs of the experiment are named after one run id, and none is ours:
    which one to write to is the user's choice. A :class:`TrackerConfigError` (and so a
    ``ValueError``) for a caller, and a ``RuntimeError`` as torchx's ``MLflowTracker``
    raises for the same case (an ``except RuntimeError:`` written for it still catches it);
    for a lane, a failure of the backend that keeps the records until the duplicates are
    gone."""


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

# MLflow error codes (MlflowException.error_code) that may pass by themselves.
# INTERNAL_ERROR is what the client says for a 500 answer, and for a request that failed on
# the way.
_TRANSIENT_CODES = (
    "INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "REQUEST_LIMIT_EXCEEDED",
    "RESOURCE_EXHAUSTED", "ABORTED", "IO_ERROR",
)  # fmt: skip
# About the backend: the records are kept (INVALID_PARAMETER_VALUE only when not about the
# entries of the request, see the message row below). A code in neither list goes by the
# rest of the table, and is about the backend when nothing there matches.
_BACKEND_CODES = (
    "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "PERMISSION_DENIED",
    "UNAUTHENTICATED", "CUSTOMER_UNAUTHORIZED", "BAD_REQUEST", "INVALID_PARAMETER_VALUE",
    "INVALID_STATE", "ENDPOINT_NOT_FOUND", "FEATURE_DISABLED", "NOT_IMPLEMENTED",
)  # fmt: skip
# The store's database behind a local tracking URI.
_TRANSIENT_TYPES = (
    "sqlalchemy.OperationalError", "sqlalchemy.TimeoutError", "sqlalchemy.DisconnectionError",
)  # fmt: skip

# What is MLflow's own, added to the shared table (connections, timeouts, HTTP statuses and
# the OSErrors of a local artifact store go by the shared rows).
MLFLOW_TABLE: ErrorTable = SHARED_TABLE.extend(
    messages=(
        # A SQLite store (local, or behind the server) busy with another writer.
        MessageRow(re.compile("database (?:table )?is locked"), "transient"),
        MessageRow(_RECORD_MESSAGE_RE, "record", code="INVALID_PARAMETER_VALUE"),
    ),
    codes={
        **dict.fromkeys(_TRANSIENT_CODES, "transient"),
        **dict.fromkeys(_BACKEND_CODES, "backend"),
    },
    types=dict.fromkeys(_TRANSIENT_TYPES, "transient"),
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


def _message(what: str) -> Callable[[BaseException], str]:
    def message(exc: BaseException) -> str:
        text = f"MLflow {what} failed: {type(exc).__name__}: {exc}"
        code = error_code(exc)
        if code is not None and code not in text:
            text += f" ({code})"
        return text

    return message


def map_error(exc: BaseException, what: str = "request") -> BackendError:
    """The package's error for whatever the MLflow client (or its store) raised while doing
    ``what``, naming it, mapped by :data:`MLFLOW_TABLE` (the shared table with MLflow's rows):

    * transient: connection failures and timeouts (requests, urllib3), HTTP 408/429/5xx, the
      MLflow codes INTERNAL_ERROR, TEMPORARILY_UNAVAILABLE, DEADLINE_EXCEEDED,
      REQUEST_LIMIT_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, IO_ERROR, a SQLite store's
      "database is locked", and the OSErrors that pass (a reset, EAGAIN ...);
    * about records (:class:`RecordError`, dropped alone by the lane): INVALID_PARAMETER_VALUE
      about a key or value of the request (see :func:`is_record_refusal`);
    * about the backend (the records are kept): RESOURCE_DOES_NOT_EXIST, PERMISSION_DENIED,
      UNAUTHENTICATED, every other code, a full or read-only artifact store, and any error
      not recognised.

    An error already mapped is returned as it is; exception groups are unwrapped into one
    error (transient if any part is).
    """
    return map_failure(exc, _message(what), MLFLOW_TABLE)
