"""Time as the pipeline sees it: injected, so that tests and the simulator drive it.

The pipeline never reads the wall clock or sleeps on its own: every wait goes through a
:class:`Clock`. :class:`RealClock` is anyio's clock. :class:`VirtualClock` is a discrete-event
clock for tests: time stands still while any task can run, and jumps to the next timer when
every task is blocked (as trio's autojump clock does), so a schedule of faults, backoffs and
deadlines runs in milliseconds and the same way every time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import anyio


class Clock:
    """Monotonic seconds, sleeps and deadlines: anyio's own (the real clock)."""

    def now(self) -> float:
        # anyio's clock on the tracker loop (asyncio) is time.monotonic: reading it directly
        # works off the loop too (a pipeline is built on the caller's thread).
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))

    @contextmanager
    def deadline(self, when: float, shield: bool = False) -> Iterator[anyio.CancelScope]:
        """A cancel scope that ends its block at ``when`` (this clock's time)."""
        with anyio.CancelScope(deadline=when, shield=shield) as scope:
            yield scope

    def move_on_after(
        self, seconds: float, shield: bool = False
    ) -> AbstractContextManager[anyio.CancelScope]:
        return self.deadline(self.now() + seconds, shield)


class VirtualClock(Clock):
    """A clock that only moves when every task of the loop is blocked.

    Run :meth:`drive` as a task beside the code under test: it waits until all other tasks
    are blocked, then jumps to the earliest timer and fires it. If every task is blocked and
    no timer is set, nothing can ever happen again: :meth:`drive` raises ``Deadlock``, which
    is how the simulator proves that every wait is bounded.
    """

    class Deadlock(AssertionError):
        pass

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count()
        self._cancelled: set[int] = set()

    def now(self) -> float:
        return self._now

    def _add(self, when: float, fire: Callable[[], None]) -> int:
        ident = next(self._ids)
        heapq.heappush(self._timers, (when, ident, fire))
        return ident

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        ident = self._add(self._now + seconds, event.set)
        try:
            await event.wait()
        finally:
            self._cancelled.add(ident)

    @contextmanager
    def deadline(self, when: float, shield: bool = False) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope(shield=shield) as scope:
            ident = self._add(when, scope.cancel) if when < math.inf else None
            try:
                yield scope
            finally:
                if ident is not None:
                    self._cancelled.add(ident)

    def has_timers(self) -> bool:
        self._prune()
        return bool(self._timers)

    def _prune(self) -> None:
        while self._timers and self._timers[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._timers)[1])

    async def drive(self) -> None:
        """Advances time whenever every other task is blocked; forever (cancel it)."""
        while True:
            await anyio.wait_all_tasks_blocked()
            self._prune()
            if not self._timers:
                raise VirtualClock.Deadlock("every task is blocked and no timer is set")
            when = self._timers[0][0]
            self._now = max(self._now, when)
            while self._timers and self._timers[0][0] <= self._now:
                _, ident, fire = heapq.heappop(self._timers)
                if ident in self._cancelled:
                    self._cancelled.discard(ident)
                else:
                    fire()
