"""Retries of backend writes: tenacity, exponential backoff with jitter, to a deadline.

A lane never gives up on a batch while its run lives: a round of ``max_attempts`` tries with
backoff, then a pause of ``cooldown_s`` (or until ``flush()``/``close()`` asks again), then
another round. Retries follow progress: only tries that stored nothing count towards a round,
and a try that stored any part of the batch starts a new one (its backoff from the start), so a
backend that half-works is slow, never paused as a dead one. While closing, it retries until
the close deadline and no further: a wait that would end past the deadline is not started.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception
from tenacity.wait import wait_base

from async_tracker.clock import Clock
from async_tracker.errors import is_transient

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How a lane retries a failing backend.

    ``max_attempts`` tries in a row that stored nothing make a round (the first try included;
    a try that stored a part of the batch starts a new round, its next try at once); waits
    grow from ``initial_backoff_s`` doubling with each such try up to ``max_backoff_s``, each
    plus up to ``jitter_s`` of random delay, so that ranks that failed together do not retry
    together. After a round the lane pauses for ``cooldown_s`` (a ``flush()`` or ``close()``
    ends the pause), spools what waits behind the failing batch, and starts another round: it
    never gives up while the run lives. Records are given up only at the close deadline, onto
    the spool.
    """

    # Short first waits, many of them: most transient failures (a reset connection, one 503)
    # pass at once, and a lane waiting on a retry holds every record behind it (a store
    # failing 30% of its calls took 7.7x a healthy one's time with a first wait of 0.1 s,
    # 2.6x with 0.01 s: benchmarks/bench_flaky.py). A dead store still ends its round after
    # 1.3 s of doubling waits (0.01 to 0.64 s), then the cooldown.
    max_attempts: int = 8
    initial_backoff_s: float = 0.01
    max_backoff_s: float = 5.0
    jitter_s: float = 0.01
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if min(self.initial_backoff_s, self.max_backoff_s, self.jitter_s, self.cooldown_s) < 0:
            raise ValueError("backoff, jitter and cooldown must be >= 0 seconds")


class _Backoff(wait_base):
    """``initial_backoff_s`` doubling with each try in a row that stored nothing (as read from
    ``fruitless()``), up to ``max_backoff_s``, plus the jitter; none after a try that stored a
    part. Tenacity's attempt number counts every try, and progress must start the growth
    again: the first try of a new round goes at once, as the first try of a batch does (the
    backend has just stored something, and another part of the batch waits)."""

    def __init__(
        self, policy: RetryPolicy, fruitless: Callable[[], int], jitter: wait_base
    ) -> None:
        self.policy = policy
        self.fruitless = fruitless
        self.jitter = jitter

    def __call__(self, retry_state: RetryCallState) -> float:
        fruitless = self.fruitless()
        if fruitless == 0:
            return 0.0
        return self._exponential(fruitless - 1) + self.jitter(retry_state)

    def _exponential(self, exponent: int) -> float:
        if exponent > 60:  # 2**60 times any backoff is past any maximum (and float overflow)
            return self.policy.max_backoff_s
        return min(self.policy.max_backoff_s, self.policy.initial_backoff_s * 2.0**exponent)


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
    progress: Callable[[], int],
    fn: Callable[..., Awaitable[T]],
    *args: Any,
) -> T:
    """Awaits ``fn(*args)`` until it succeeds, raises an error that is not transient, or the
    round ends: ``max_attempts`` tries in a row that stored nothing, or, once ``deadline()``
    is set (closing), whenever the next wait would end past it. The last error is then
    raised. ``progress()`` counts what ``fn`` stored (parts of a batch): a failed try that
    moved it starts a new round. ``on_retry`` sees each error that will be retried."""
    # The first try outside tenacity: a healthy backend (nearly every batch) then costs one
    # await, not tenacity's set-up and its inspection of fn (a good part of what the
    # flusher spends on a batch, GIL time taken from the training loop). A failure is
    # handed to tenacity as its first attempt, so the retries go exactly as if it had made it.
    mark = progress()
    try:
        return await fn(*args)
    except Exception as exc:
        first: Exception | None = exc
        if not is_transient(exc):
            raise
    # Tries in a row that stored nothing: the round and the backoff are counted in these
    # (one owner, read by stop and wait below), not in tenacity's attempts, so that a backend
    # that stores a part at each try is never given up on as a dead one.
    fruitless = 1 if progress() == mark else 0

    async def attempt(*args: Any) -> T:
        nonlocal first, fruitless
        if first is not None:
            exc, first = first, None
            raise exc
        before = progress()
        try:
            return await fn(*args)
        except Exception:
            fruitless = fruitless + 1 if progress() == before else 0
            raise

    def stop(state: RetryCallState) -> bool:
        end = deadline()
        if end is None:
            return fruitless >= policy.max_attempts
        return clock.now() + (state.upcoming_sleep or 0.0) >= end

    def before_sleep(state: RetryCallState) -> None:
        if state.outcome is not None and (exc := state.outcome.exception()) is not None:
            on_retry(exc)

    retrying = AsyncRetrying(
        stop=stop,
        wait=_Backoff(policy, lambda: fruitless, _Jitter(rng, policy.jitter_s)),
        retry=retry_if_exception(is_transient),
        # The clock's sleep: cancellable by a close() deadline, and virtual in the simulator.
        sleep=clock.sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return await retrying(attempt, *args)
