"""Time as the pipeline sees it: injected, so that tests and the simulator drive it.

The pipeline never reads the clock or sleeps on its own: every wait goes through a
:class:`Clock`, which is anyio's (monotonic) clock. The simulator swaps in a virtual clock
(``tests/simulation/virtual_clock.py``) under which time stands still while any task can run
and jumps to the next timer when every task is blocked, so a schedule of faults, backoffs and
deadlines runs in milliseconds, the same way every time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
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

    def move(self, scope: anyio.CancelScope, when: float) -> None:
        """Moves the deadline of a scope that :meth:`deadline` made to ``when`` (on the loop;
        a SIGTERM shortens a close under way this way)."""
        scope.deadline = when

    def move_on_after(
        self, seconds: float, shield: bool = False
    ) -> AbstractContextManager[anyio.CancelScope]:
        return self.deadline(self.now() + seconds, shield)
