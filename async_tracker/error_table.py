"""The table of what a failure of a backend's library means for the records.

One declarative table, shared by every backend, says for each failure a library may raise
what a lane does with it (see :func:`async_tracker.errors.classify`):

* ``"transient"``: may pass by itself (a connection refused or reset, a timeout, a throttled
  request, an answer 408/429/5xx): retried with backoff;
* ``"backend"``: about the backend, will not pass by retrying at once (credentials,
  permissions, a missing bucket, a read-only or full store): the records are kept and retried
  after a cooldown;
* ``"record"``: about records of the batch (a value the backend cannot encode or store, an
  object too large): the lane finds and drops those records alone.

A backend adds what is its own (an error code of its server, a message of its store) as more
rows, with :meth:`ErrorTable.extend`. A failure the table does not know is about the backend:
its records are kept, never dropped.

Third-party exceptions are recognised by the names of their classes (and their bases), so that
none of those libraries has to be imported to read the table. This module imports nothing of
the package: the error tree (:mod:`async_tracker.errors`) and the backends build on it.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "SHARED_TABLE",
    "ErrorTable",
    "Kind",
    "MessageRow",
    "chain",
    "http_status",
    "s3_error",
]

Kind = Literal["transient", "backend", "record"]


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling, and so on (no cycles)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _class_names(exc: BaseException) -> Iterator[str]:
    """``module.Name`` of each class of ``exc``'s MRO, the module cut to its top level
    (``botocore.exceptions.EndpointConnectionError`` -> ``botocore.EndpointConnectionError``),
    and the bare name for builtins (``ConnectionError``)."""
    for cls in type(exc).__mro__:
        top = cls.__module__.split(".", 1)[0]
        yield cls.__name__ if top == "builtins" else f"{top}.{cls.__name__}"


# Modules whose OSError subclasses may carry an HTTP status (requests' and urllib's
# HTTPError); any other OSError carries an errno, not a status.
_HTTP_OSERRORS = frozenset({"requests", "urllib", "aiohttp", "gcsfs"})


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception of an HTTP client carries (``status``, ``status_code``,
    ``code``, or ``response.status_code``), or None. OSErrors carry errnos, not statuses."""
    if isinstance(exc, OSError) and type(exc).__module__.split(".", 1)[0] not in _HTTP_OSERRORS:
        return None
    candidates: list[object] = [
        getattr(exc, "status", None),
        getattr(exc, "status_code", None),
        getattr(exc, "code", None),
        getattr(getattr(exc, "response", None), "status_code", None),
    ]
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    return None


def s3_error(exc: BaseException) -> tuple[str, int | None] | None:
    """(code, HTTP status) of the botocore ClientError in ``exc``'s chain, or None."""
    for cur in chain(exc):
        response = getattr(cur, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            meta = response.get("ResponseMetadata")
            status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
            return str(response["Error"].get("Code") or ""), (
                status if isinstance(status, int) else None
            )
    return None


@dataclass(frozen=True)
class MessageRow:
    """A failure known by its message: ``pattern`` found in the text of an exception of the
    chain (with the error code ``code``, when given) makes it ``kind``."""

    pattern: re.Pattern[str]
    kind: Kind
    code: str | None = None


@dataclass(frozen=True)
class ErrorTable:
    """What each failure means, looked up in this order (the first row that matches wins):

    1. ``messages``: rows matching an error code and the text of the failure;
    2. ``codes``: the error code the exception carries (its ``error_code``, as the MLflow
       client's exceptions do);
    3. ``s3_codes``: the code of an S3 error answer in the chain; an S3 code not in the table
       goes by the answer's HTTP status, else is about the backend;
    4. ``errnos``: the number of an OSError;
    5. ``types``: the exception's class or one of its bases, by ``module.Name`` (the module cut
       to its top level; bare names for builtins), anywhere in the chain;
    6. ``statuses``: the HTTP status of the exception; a status not in the table is about the
       backend.

    :meth:`kind` is None when no row matches (the caller treats that as about the backend).
    """

    errnos: Mapping[int, Kind] = field(default_factory=dict)
    statuses: Mapping[int, Kind] = field(default_factory=dict)
    s3_codes: Mapping[str, Kind] = field(default_factory=dict)
    types: Mapping[str, Kind] = field(default_factory=dict)
    codes: Mapping[str, Kind] = field(default_factory=dict)
    messages: tuple[MessageRow, ...] = ()

    def extend(
        self,
        *,
        errnos: Mapping[int, Kind] | None = None,
        statuses: Mapping[int, Kind] | None = None,
        s3_codes: Mapping[str, Kind] | None = None,
        types: Mapping[str, Kind] | None = None,
        codes: Mapping[str, Kind] | None = None,
        messages: Iterable[MessageRow] = (),
    ) -> ErrorTable:
        """This table with more rows (a row given here replaces the shared row of its key)."""
        return ErrorTable(
            errnos={**self.errnos, **(errnos or {})},
            statuses={**self.statuses, **(statuses or {})},
            s3_codes={**self.s3_codes, **(s3_codes or {})},
            types={**self.types, **(types or {})},
            codes={**self.codes, **(codes or {})},
            messages=(*self.messages, *messages),
        )

    def kind(self, exc: BaseException) -> Kind | None:
        """What ``exc`` (not a group) means by the table, or None when no row matches."""
        code = getattr(exc, "error_code", None)
        code = code if isinstance(code, str) else None
        for row in self.messages:
            if row.code is not None and row.code != code:
                continue
            if any(row.pattern.search(str(cur)) for cur in chain(exc)):
                return row.kind
        if code is not None and code in self.codes:
            return self.codes[code]
        s3 = s3_error(exc)
        if s3 is not None:
            s3_code, status = s3
            if s3_code in self.s3_codes:
                return self.s3_codes[s3_code]
            return self.statuses.get(status, "backend") if status is not None else "backend"
        if isinstance(exc, OSError) and exc.errno is not None and exc.errno in self.errnos:
            return self.errnos[exc.errno]
        for cur in chain(exc):
            for name in _class_names(cur):
                if name in self.types:
                    return self.types[name]
        status = http_status(exc)
        if status is not None:
            return self.statuses.get(status, "backend")
        return None


def _errnos(kind: Kind, *names: str) -> dict[int, Kind]:
    # Some numbers do not exist on every platform (EDQUOT, EREMOTEIO ...).
    return {getattr(errno, n): kind for n in names if hasattr(errno, n)}


# OSError numbers that may pass by themselves.
_TRANSIENT_ERRNOS = (
    "EAGAIN", "EWOULDBLOCK", "EINTR", "EBUSY", "EIO", "ETIMEDOUT", "ECONNRESET",
    "ECONNREFUSED", "ECONNABORTED", "EPIPE", "ENETDOWN", "ENETUNREACH", "ENETRESET",
    "EHOSTDOWN", "EHOSTUNREACH", "ESTALE", "EREMOTEIO", "EMFILE", "ENFILE", "ENOMEM",
    "ENOBUFS", "ENOLCK", "EDEADLK", "EINPROGRESS", "EALREADY",
    # A directory removed under us between makedirs and the write: the retry makes it again.
    "ENOENT",
)  # fmt: skip
# About the store, not the records: the records are kept and retried after a cooldown.
_STORE_ERRNOS = (
    "EROFS", "EACCES", "EPERM", "ENOSPC", "EDQUOT", "ENOTDIR", "EISDIR", "EEXIST", "ENOSYS",
    "EOPNOTSUPP", "ENOTSUP", "ENODEV", "ENXIO", "ELOOP",
)  # fmt: skip
# About the record being written: a name the store refuses, an object too large.
_RECORD_ERRNOS = ("ENAMETOOLONG", "EFBIG", "EMSGSIZE", "EILSEQ")

# S3 error codes (botocore's ClientError, which s3fs keeps as the cause of what it raises)
# that may pass by themselves, after s3fs's and botocore's own retries gave up.
_TRANSIENT_S3_CODES = (
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "ProvisionedThroughputExceededException",
    "RequestTimeout", "RequestTimeoutException", "ServiceUnavailable", "InternalError",
    "OperationAborted", "PriorRequestNotComplete", "Busy",
)  # fmt: skip
# S3 error codes about the object being written: the lane drops that record alone. Every
# other S3 code (AccessDenied, NoSuchBucket, InvalidAccessKeyId, SignatureDoesNotMatch,
# ExpiredToken ...) goes by the answer's status: about the backend, the records kept.
_RECORD_S3_CODES = (
    "EntityTooLarge", "KeyTooLongError", "MetadataTooLarge", "InlineDataTooLarge",
    "MaxMessageLengthExceeded", "MaxPostPreDataLengthExceededError",
)  # fmt: skip

# Exception classes that are a failure to reach the other side or to hear back from it.
# Subclasses match too.
_NETWORK_TYPES = (
    "ConnectionError",
    "TimeoutError",
    "FileNotFoundError",  # without an errno (memory://): as ENOENT
    "requests.ConnectionError",  # ConnectTimeout, ProxyError, SSLError ...
    "requests.Timeout",  # ReadTimeout
    "requests.ChunkedEncodingError",
    "requests.RetryError",  # urllib3 retried 429/5xx answers until it gave up
    "urllib3.ProtocolError",
    "urllib3.MaxRetryError",
    "urllib3.NewConnectionError",
    "urllib3.TimeoutError",  # ConnectTimeoutError, ReadTimeoutError
    "urllib3.IncompleteRead",
    "http.IncompleteRead",
    "http.RemoteDisconnected",
    "botocore.ConnectionError",  # EndpointConnectionError, ConnectTimeoutError ...
    "botocore.HTTPClientError",  # ConnectionClosedError, ReadTimeoutError ...
    "botocore.IncompleteReadError",
    "botocore.ResponseParserError",  # throttling answers that are not valid XML
    "botocore.ChecksumError",
    "aiohttp.ClientConnectionError",  # ClientOSError, ServerDisconnectedError ...
    "aiohttp.ClientPayloadError",
    "aiohttp.ServerTimeoutError",
    "socket.gaierror",  # name resolution (also fails while DNS is down)
)

# The table every backend starts from.
SHARED_TABLE = ErrorTable(
    errnos={
        **_errnos("transient", *_TRANSIENT_ERRNOS),
        **_errnos("backend", *_STORE_ERRNOS),
        **_errnos("record", *_RECORD_ERRNOS),
    },
    statuses={
        **dict.fromkeys((408, 425, 429, *range(500, 600)), "transient"),
        # The payload, or the URI (the object's name), too large.
        **dict.fromkeys((413, 414), "record"),
    },
    s3_codes={
        **dict.fromkeys(_TRANSIENT_S3_CODES, "transient"),
        **dict.fromkeys(_RECORD_S3_CODES, "record"),
    },
    types=dict.fromkeys(_NETWORK_TYPES, "transient"),
)
