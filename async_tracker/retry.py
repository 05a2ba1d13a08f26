"""Retries of backend writes: tenacity, exponential backoff with jitter, to a deadline.

A lane never gives up on a batch while its run lives: a round of ``max_attempts`` tries with
backoff, then a pause of ``cooldown_s`` (or until ``flush()``/``close()`` asks again), then
another round. While closing, it retries until the close deadline and no further: a wait that
would end past the deadline is not started.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential
from tenacity.wait import wait_base

from async_tracker.clock import Clock
from async_tracker.errors import is_transient

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How a lane retries a failing backend.

    ``max_attempts`` tries make a round (the first try included); waits grow from
    ``initial_backoff_s`` doubling up to ``max_backoff_s``, each plus up to ``jitter_s`` of
    random delay, so that ranks that failed together do not retry together. After a round
    the lane pauses for ``cooldown_s`` (a ``flush()`` or ``close()`` ends the pause), spools
    what waits behind the failing batch, and starts another round: it never gives up while
    the run lives. Records are given up only at the close deadline, onto the spool.
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


class _Jitter(wait_base):
    """Up to ``most`` seconds of random delay, from the lane's own (seedable) generator."""

    def __init__(self, rng: random.Random, most: float) -> None:
        self.rng = rng
        self.most = most

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.rng.uniform(0, self.most) if self.most > 0 else 0.0


async def write_with_retries(
    policy: RetryPolicy,
    clock: Clock,
    rng: random.Random,
    deadline: Callable[[], float | None],
    on_retry: Callable[[BaseException], None],
    fn: Callable[..., Awaitable[T]],
    *args: Any,
) -> T:
    """Awaits ``fn(*args)`` until it succeeds, raises an error that is not transient, or the
    round ends: ``max_attempts`` tries, or, once ``deadline()`` is set (closing), whenever the
    next wait would end past it. The last error is then raised. ``on_retry`` sees each error
    that will be retried."""
    # The first try outside tenacity: a healthy backend (nearly every batch) then costs one
    # await, not tenacity's set-up and its inspection of fn (a good part of what the
    # flusher spends on a batch, GIL time taken from the training loop). A failure is
    # handed to tenacity as its first attempt, so the retries go exactly as if it had made it.
    try:
        return await fn(*args)
    except Exception as exc:
        first: Exception | None = exc
        if not is_transient(exc):
            raise

    async def attempt(*args: Any) -> T:
        nonlocal first
        if first is not None:
            exc, first = first, None
            raise exc
        return await fn(*args)

    def stop(state: RetryCallState) -> bool:
        end = deadline()
        if end is None:
            return state.attempt_number >= policy.max_attempts
        return clock.now() + (state.upcoming_sleep or 0.0) >= end

    def before_sleep(state: RetryCallState) -> None:
        if state.outcome is not None and (exc := state.outcome.exception()) is not None:
            on_retry(exc)

    retrying = AsyncRetrying(
        stop=stop,
        wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s)
        + _Jitter(rng, policy.jitter_s),
        retry=retry_if_exception(is_transient),
        # The clock's sleep: cancellable by a close() deadline, and virtual in the simulator.
        sleep=clock.sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return await retrying(attempt, *args)
