"""The hot path's only data structure: an unbounded-append, drain-from-the-left deque.

``AppRun`` writes append one tuple to it and return: no lock, no I/O, no event-loop call.
``deque.append`` and ``deque.popleft`` are atomic, so the caller's threads and the flusher on
the tracker loop need nothing shared but the deque itself.

Record shapes (tuples keep the append cheap; the flusher tells them apart by length):

* metric: ``(name, value, step_or_None, timestamp)``
* other:  ``(kind, payload)`` with kind one of ``METADATA``, ``ARTIFACT``, ``SOURCE``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

METADATA: Final = "metadata"
ARTIFACT: Final = "artifact"
SOURCE: Final = "source"

Record = tuple[Any, ...]


class Buffer:
    """Records accepted by a run and not yet cut into batches."""

    __slots__ = ("_records", "append")

    def __init__(self) -> None:
        self._records: deque[Record] = deque()
        # Bound once: AppRun calls this attribute directly on the hot path.
        self.append = self._records.append

    def __len__(self) -> int:
        return len(self._records)

    def drain(self, limit: int) -> list[Record]:
        """Takes up to ``limit`` of the oldest records. Swapping the deque for a new one would
        be cheaper, but a writer holding the old ``append`` could then lose a record."""
        popleft = self._records.popleft
        n = min(limit, len(self._records))
        return [popleft() for _ in range(n)]

    def clear(self) -> None:
        self._records.clear()
