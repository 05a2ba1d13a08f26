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


class HybridClock:
    """A hybrid logical clock: stamps (integer ns) that follow the wall clock but never go
    back in this process, so that a clock stepped back (NTP does this) never lets an earlier
    write of this process win over a later one.

    A stamp is ``max(wall_ns, last + 1)``: the wall time while it moves forward; after a step
    back, the last stamp plus a counter (1 ns a stamp) until the wall clock passes it again.
    The counter lives in the low digits of the nanoseconds, so a stamp is a plain ns time:
    stamps written before this clock existed (the bare wall time) compare with new ones as
    they always did. Across processes, stamps compare as times: the later wall time wins, and
    a process whose clock stepped back by ``d`` keeps writing just after its last stamp for
    ``d`` seconds.
    """

    def __init__(self) -> None:
        self._last = 0

    def observe(self, stamp_ns: int) -> None:
        """Takes in a stamp seen elsewhere (the latest one a run stored before this process
        resumed it): later stamps of this clock come after it, whatever this machine's wall
        clock says. Raising the floor of a clock shared by the process's runs only moves
        their stamps past a time some process already used."""
        if stamp_ns > self._last:
            self._last = stamp_ns

    def stamp(self, wall_ns: int) -> int:
        # No lock. The metadata clock (run.py) stamps on the callers' threads, on the hot path of
        # add_metadata, where a lock would add about a tenth to the cost of every call. Under the
        # GIL two threads racing here can get equal stamps, or leave ``_last`` a little below the
        # highest stamp given; both only concern calls made at the same moment on different threads,
        # which have no order of their own. Within a run the sequence number decides anyway: the
        # cutter (one thread, the tracker loop) raises a stamp that is not above the run's previous
        # one. The key clock (cutter.py) is only used on the tracker loop's thread: never raced. A
        # forked child inherits ``_last`` and goes on from it (no lock to inherit held).
        last = self._last
        now = wall_ns if wall_ns > last else last + 1
        self._last = now
        return now
