"""What backends share to map their libraries' errors at their boundary.

A backend raises exactly one :class:`~async_tracker.errors.BackendError` per failed call (see
:func:`async_tracker.errors.classify` for what the lane does with each kind):

* :class:`TransientBackendError`: may pass by itself (a connection refused or reset, a
  timeout, a throttled request, an answer 408/429/5xx): retried with backoff;
* :class:`PermanentBackendError`: about the backend, will not pass by retrying at once
  (credentials, permissions, a missing bucket, a read-only or full store): the records are
  kept and retried later. Errors a backend does not recognise map here too, never to
  :class:`RecordError`;
* :class:`RecordError`: about records of the batch (a value the backend cannot encode or
  store, an object too large): the lane finds and drops those records alone.

The helpers recognise third-party exceptions by the names of their classes (and their
bases), so that none of those libraries has to be imported to map their errors.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Iterator, Sequence

from async_tracker.errors import (
    BackendError,
    PermanentBackendError,
    RecordError,
    TransientBackendError,
)

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup

__all__ = [
    "RECORD_ERRNOS",
    "STORE_ERRNOS",
    "TRANSIENT_ERRNOS",
    "chain",
    "combine",
    "errno_error",
    "http_status",
    "http_status_error",
    "is_network_failure",
    "leaves",
    "map_group",
]


def _errnos(*names: str) -> frozenset[int]:
    # Some numbers do not exist on every platform (EDQUOT, EREMOTEIO ...).
    return frozenset(getattr(errno, n) for n in names if hasattr(errno, n))


# OSError numbers that may pass by themselves.
TRANSIENT_ERRNOS = _errnos(
    "EAGAIN", "EWOULDBLOCK", "EINTR", "EBUSY", "EIO", "ETIMEDOUT", "ECONNRESET",
    "ECONNREFUSED", "ECONNABORTED", "EPIPE", "ENETDOWN", "ENETUNREACH", "ENETRESET",
    "EHOSTDOWN", "EHOSTUNREACH", "ESTALE", "EREMOTEIO", "EMFILE", "ENFILE", "ENOMEM",
    "ENOBUFS", "ENOLCK", "EDEADLK", "EINPROGRESS", "EALREADY",
    # A directory removed under us between makedirs and the write: the retry makes it again.
    "ENOENT",
)  # fmt: skip
# About the store, not the records: the records are kept and retried after a cooldown.
STORE_ERRNOS = _errnos(
    "EROFS", "EACCES", "EPERM", "ENOSPC", "EDQUOT", "ENOTDIR", "EISDIR", "EEXIST", "ENOSYS",
    "EOPNOTSUPP", "ENOTSUP", "ENODEV", "ENXIO", "ELOOP",
)  # fmt: skip
# About the record being written: a name the store refuses, an object too large.
RECORD_ERRNOS = _errnos("ENAMETOOLONG", "EFBIG", "EMSGSIZE", "EILSEQ")

# Exception classes (by the top-level module that defines them, and their name) that are a
# failure to reach the other side or to hear back from it. Subclasses match too.
_NETWORK_CLASSES = frozenset(
    {
        ("requests", "ConnectionError"),  # ConnectTimeout, ProxyError, SSLError ...
        ("requests", "Timeout"),  # ReadTimeout
        ("requests", "ChunkedEncodingError"),
        ("requests", "RetryError"),  # urllib3 retried 429/5xx answers until it gave up
        ("urllib3", "ProtocolError"),
        ("urllib3", "MaxRetryError"),
        ("urllib3", "NewConnectionError"),
        ("urllib3", "TimeoutError"),  # ConnectTimeoutError, ReadTimeoutError
        ("urllib3", "IncompleteRead"),
        ("http", "IncompleteRead"),
        ("http", "RemoteDisconnected"),
        ("botocore", "ConnectionError"),  # EndpointConnectionError, ConnectTimeoutError ...
        ("botocore", "HTTPClientError"),  # ConnectionClosedError, ReadTimeoutError ...
        ("botocore", "IncompleteReadError"),
        ("botocore", "ResponseParserError"),  # throttling answers that are not valid XML
        ("botocore", "ChecksumError"),
        ("aiohttp", "ClientConnectionError"),  # ClientOSError, ServerDisconnectedError ...
        ("aiohttp", "ClientPayloadError"),
        ("aiohttp", "ServerTimeoutError"),
        ("socket", "gaierror"),  # name resolution (also fails while DNS is down)
    }
)

# Modules whose OSError subclasses may carry an HTTP status (requests' and urllib's
# HTTPError).
_HTTP_OSERRORS = frozenset({"requests", "urllib", "aiohttp", "gcsfs"})
TRANSIENT_HTTP_STATUSES = frozenset({408, 425, 429})
RECORD_HTTP_STATUSES = frozenset({413, 414})  # payload, or URI (the object's name), too large


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling, and so on (no cycles)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _class_names(exc: BaseException) -> Iterator[tuple[str, str]]:
    for cls in type(exc).__mro__:
        yield cls.__module__.split(".", 1)[0], cls.__name__


def is_network_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) failed to reach the other side, or to
    hear back from it in time: ``ConnectionError``, ``TimeoutError``, and the connection and
    timeout errors of requests, urllib3, botocore and aiohttp."""
    for cur in chain(exc):
        if isinstance(cur, (ConnectionError, TimeoutError)):
            return True
        if any(name in _NETWORK_CLASSES for name in _class_names(cur)):
            return True
    return False


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


def http_status_error(status: int, message: str) -> BackendError:
    """408/425/429/5xx: transient; 413/414: about the record; any other: about the backend."""
    if status in TRANSIENT_HTTP_STATUSES or status >= 500:
        return TransientBackendError(message)
    if status in RECORD_HTTP_STATUSES:
        return RecordError(message)
    return PermanentBackendError(message)


def errno_error(err: int | None, message: str) -> BackendError | None:
    """The error for an OSError number, or None for a number not in the tables."""
    if err is None:
        return None
    if err in TRANSIENT_ERRNOS:
        return TransientBackendError(message)
    if err in STORE_ERRNOS:
        return PermanentBackendError(message)
    if err in RECORD_ERRNOS:
        return RecordError(message)
    return None


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
        return PermanentBackendError(text)
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
