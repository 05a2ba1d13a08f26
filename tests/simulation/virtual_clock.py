"""A discrete-event clock for the simulator.

Time only moves when every task of the loop is blocked: :meth:`VirtualClock.drive`, run as a
task beside the code under test, then jumps to the earliest timer and fires it (as trio's
autojump clock does). If every task is blocked and no timer is set, nothing can ever happen
again: ``drive`` raises :class:`VirtualClock.Deadlock`, which is how the simulator proves
that every wait is bounded.

"Every task is blocked" is read from asyncio's tasks (anyio's ``wait_all_tasks_blocked``
polls with real 0.1 s sleeps, which would make a schedule take seconds).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import anyio.lowlevel

from async_tracker.clock import Clock


class VirtualClock(Clock):
    """A clock that only moves when every task of the loop is blocked."""

    class Deadlock(AssertionError):
        pass

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count()
        self._cancelled: set[int] = set()
        # The timers of each scope deadline() made, by id(scope): move() adds one, and all
        # go when the scope ends (a timer firing later would jump the clock for nothing).
        self._scope_timers: dict[int, list[int]] = {}

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
            timers = self._scope_timers[id(scope)] = []
            if when < math.inf:
                timers.append(self._add(when, scope.cancel))
            try:
                yield scope
            finally:
                self._cancelled.update(self._scope_timers.pop(id(scope)))

    def move(self, scope: anyio.CancelScope, when: float) -> None:
        # Only ever earlier (a close's deadline shortened): the earlier timer wins, and the
        # later one is a no-op on a cancelled scope.
        timers = self._scope_timers.get(id(scope))
        if timers is not None:
            timers.append(self._add(when, scope.cancel))

    def has_timers(self) -> bool:
        self._prune()
        return bool(self._timers)

    def _prune(self) -> None:
        while self._timers and self._timers[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._timers)[1])

    async def drive(self) -> None:
        """Advances time whenever every other task is blocked; forever (cancel it)."""
        while True:
            await _all_others_blocked()
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


async def _all_others_blocked() -> None:
    """Returns once every other task of the running asyncio loop waits on a future that is
    not done, and no callback is ready to run."""
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(0)
        if getattr(loop, "_ready", None):
            continue  # callbacks (wake-ups among them) are queued: let them run first
        for task in asyncio.all_tasks():
            if task is me or task.done():
                continue
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is None or waiter.done():
                break
        else:
            return
