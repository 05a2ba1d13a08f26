"""The hot path's only data structure: an unbounded-append, drain-from-the-left deque.

``AppRun`` writes append one tuple to it and return: no lock, no I/O, no event-loop call.
``deque.append`` and ``deque.popleft`` are atomic, so the caller's threads and the flusher on
the tracker loop need nothing shared but the deque itself.

Record shapes (tuples keep the append cheap; the flusher tells them apart by length):

* metric: ``(name, value, step_or_None, timestamp)``
* other:  ``(kind, payload)`` with kind one of ``METADATA``, ``ARTIFACT``, ``SOURCE``.

While a run holds more than ``max_buffered`` records in memory, its writes go to the
:class:`Overflow` instead: compact columns that the flusher sends to the spool.
"""

from __future__ import annotations

import threading
from array import array
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


# A step the caller left to the tracker, in the overflow's int64 step column.
NO_STEP: Final = -(2**63)


class Overflow:
    """Records accepted past ``max_buffered``, in compact columns: a metric point takes 28
    bytes here instead of about 150 as a tuple in the deque. The flusher takes them as a
    :class:`Chunk` and sends them straight to the spool.

    The hot path switches to ``append`` only while the run is over its memory bound. Unlike
    the deque, appending touches four arrays and a dict, which must stay consistent: a lock
    (uncontended, about 50 ns) is cheaper than anything cleverer.
    """

    __slots__ = ("_chunk", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunk = Chunk()

    def __len__(self) -> int:
        return self._chunk.records

    def append(self, record: Record) -> None:
        with self._lock:
            self._chunk.add(record)

    def take(self) -> Chunk:
        with self._lock:
            chunk, self._chunk = self._chunk, Chunk()
        return chunk


class Chunk:
    """What the overflow held when the flusher took it, in call order per column."""

    __slots__ = ("idx", "index", "names", "others", "records", "steps", "times", "values")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.idx = array("I")
        self.values = array("d")
        self.steps = array("q")
        self.times = array("d")
        self.others: list[Record] = []  # metadata, artifacts, sources, and odd metrics
        self.records = 0

    def add(self, record: Record) -> None:
        self.records += 1
        if len(record) != 4:
            self.others.append(record)
            return
        name, value, step, ts = record
        if step is None:
            step = NO_STEP
        elif not NO_STEP < step < 2**63:
            # A step beyond int64 (the tuple path stores it as given): kept as a record.
            self.others.append(record)
            return
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
        self.idx.append(i)
        self.values.append(value)
        self.steps.append(step)
        self.times.append(ts)
