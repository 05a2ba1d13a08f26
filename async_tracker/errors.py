"""Errors raised by async_tracker.

The hierarchy::

    TrackerError
    ├── TrackerClosedError        a write or flush after close()
    ├── TrackerConfigError        a factory, config string or config file that cannot be used
    ├── DeliveryError             close(strict=True) could not deliver everything
    └── BackendError              raised by backends
        ├── TransientBackendError   retried (with ConnectionError and TimeoutError)
        └── PermanentBackendError   never retried

Retries decide by type alone: see :func:`is_transient`.
"""

from __future__ import annotations


class TrackerError(Exception):
    """Base class of every error async_tracker raises on purpose."""


class TrackerClosedError(TrackerError, RuntimeError):
    """The run was closed: it accepts no more writes."""


class TrackerConfigError(TrackerError, ValueError):
    """A tracker factory, config string or config file cannot be used."""


class DeliveryError(TrackerError):
    """Raised by ``close()`` on a strict run when records were not delivered."""


class BackendError(TrackerError):
    """A backend failed to store or read records."""


class TransientBackendError(BackendError):
    """A failure that may pass (a server restarting, a throttled request): retried."""


class PermanentBackendError(BackendError):
    """A failure that will not pass by retrying (a rejected value, a missing permission)."""


TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    TransientBackendError,
)


def is_transient(exc: BaseException) -> bool:
    """True when a retry may succeed where ``exc`` was raised."""
    return isinstance(exc, TRANSIENT_ERRORS)
