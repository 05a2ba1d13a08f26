"""Ingress: the hot path's only data structure, and the seal that closes it.

``AppRun`` writes append one tuple to a deque and return: no lock, no I/O, no event-loop call.
One ``deque.append`` of one finished tuple is a single C call, so a ``KeyboardInterrupt`` (or
anything a signal handler raises) landing between two bytecodes of a write leaves the record
either wholly in the deque or not at all. The tracker loop drains the deque from the left and
gives each record its place in the run's order (see :mod:`async_tracker.pipeline.cutter`).

Record shapes (tuples keep the append cheap; the cutter tells them apart by length):

* metric: ``(name, value, step_or_None, timestamp)``
* other:  ``(kind, payload)`` with kind one of ``METADATA``, ``ARTIFACT``, ``SOURCE``.

Sealing. ``AppRun`` swaps its append for one that raises :class:`TrackerClosedError`, but a
writer thread may have fetched the old append just before the swap and call it just after.
:func:`wait_for_writers` closes that window: after the swap it waits until no other thread is
inside a write method. Every write that returns normally is then in the deque before the final
drain, and every later one raises. The wait is bounded (a writer runs a few bytecodes once it
has the GIL) and costs the hot path nothing.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from types import CodeType
from typing import Any, Final

METADATA: Final = "metadata"
ARTIFACT: Final = "artifact"
SOURCE: Final = "source"

Record = tuple[Any, ...]


class Ingress:
    """Records accepted by a run and not yet given their place in its order."""

    __slots__ = ("_records", "append", "extend")

    def __init__(self) -> None:
        self._records: deque[Record] = deque()
        # Bound once: AppRun calls these directly on the hot path. extend takes the points
        # of one log_metrics call in one C call: all of them, or (interrupted) none.
        self.append: Callable[[Record], None] = self._records.append
        self.extend: Callable[[list[Record]], None] = self._records.extend

    def __len__(self) -> int:
        return len(self._records)

    def drain(self, limit: int) -> list[Record]:
        """Takes up to ``limit`` of the oldest records (``popleft`` is atomic: writers may
        append meanwhile). Swapping the deque for a new one would be cheaper, but a writer
        holding the old ``append`` could then lose a record."""
        n = min(limit, len(self._records))
        # popleft called n times from C: no Python loop per record.
        return list(itertools.islice(iter(self._records.popleft, None), n))

    def clear(self) -> None:
        self._records.clear()


def writers_inside(codes: Collection[CodeType]) -> int:
    """How many threads other than this one are running one of ``codes`` (anywhere on their
    stack). ``sys._current_frames`` takes the snapshot under the GIL: it is consistent."""
    me = threading.get_ident()
    busy = 0
    for ident, frame in sys._current_frames().items():
        if ident == me:
            # This thread may be a signal handler that interrupted a write of its own: that
            # write resumes only after we return, so waiting for it would wait forever.
            continue
        f: Any = frame
        while f is not None:
            if f.f_code in codes:
                busy += 1
                break
            f = f.f_back
    return busy


def wait_for_writers(codes: Collection[CodeType], timeout: float) -> bool:
    """Waits until no other thread is inside ``codes``; False if ``timeout`` passed first.
    Polls with short sleeps, which release the GIL to the writers it waits for."""
    deadline = time.monotonic() + timeout
    pause = 0.0
    while writers_inside(codes):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(0.001, pause * 2 or 0.00005)
    return True
