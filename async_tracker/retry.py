"""Retries of backend writes: tenacity, exponential backoff with jitter, by error type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from async_tracker.errors import is_transient

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How a lane retries a transient failure before it parks the batch.

    ``max_attempts`` counts the first try. Waits grow from ``initial_backoff_s`` doubling up
    to ``max_backoff_s``, each plus up to ``jitter_s`` of random delay so that ranks that failed
    together do not retry together. A parked lane tries again after ``cooldown_s``, or at the
    next ``flush()``/``close()``.
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    jitter_s: float = 0.1
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if min(self.initial_backoff_s, self.max_backoff_s, self.jitter_s, self.cooldown_s) < 0:
            raise ValueError("backoff, jitter and cooldown must be >= 0 seconds")


async def retry_call(
    policy: RetryPolicy,
    on_retry: Callable[[BaseException], None],
    fn: Callable[..., Awaitable[T]],
    *args: Any,
) -> T:
    """Awaits ``fn(*args)`` (a coroutine function) until it succeeds, raises a permanent
    error, or the attempts run out (then the last error is raised). ``on_retry`` sees each
    error that will be retried."""

    def before_sleep(state: RetryCallState) -> None:
        if state.outcome is not None and (exc := state.outcome.exception()) is not None:
            on_retry(exc)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.max_attempts),
        wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s)
        + wait_random(0, policy.jitter_s),
        retry=retry_if_exception(is_transient),
        # anyio.sleep, not asyncio.sleep: a cancelled close() must interrupt the wait.
        sleep=anyio.sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return await retrying(fn, *args)
