"""Ingress: the hot path's only data structure, and the seal that closes it.

``AppRun`` writes append one tuple to a deque and return: no lock, no I/O, no event-loop call.
One ``deque.append`` of one finished tuple is a single C call, so a ``KeyboardInterrupt`` (or
anything a signal handler raises) landing between two bytecodes of a write leaves the record
either wholly in the deque or not at all. The tracker loop drains the deque from the left and
gives each record its place in the run's order (see :mod:`async_tracker.pipeline.cutter`).

Record shapes (tuples keep the append cheap; the cutter tells them apart by length):

* metric: ``(name, value, step_or_None, timestamp)``
* other:  ``(kind, payload)`` with kind one of ``METADATA``, ``ARTIFACT``, ``SOURCE``; the
  payload of metadata is ``(values, time_ns)``: the call's time orders writes of a key across
  processes.

While a run is overloaded (more than half its ``max_buffered`` in memory, under the default
``spool`` policy), writes go to :class:`Packed` instead: 28 bytes a point rather than about
150 as a tuple, one ``bytearray.extend`` a write (as atomic as the deque's append).

Switching. ``AppRun`` swaps its append (for the packed one, back, or for one that raises
:class:`TrackerClosedError` at close), but a writer thread may have fetched the old append just
before the swap and call it just after. :func:`wait_for_writers` closes that window: after the
swap it waits until no other thread is inside a write method. Every write that returned before
is then in the old structure, every later one goes to the new: draining the old one first
keeps call order, and at close every write that returns normally is in the final drain. The
wait is bounded (a writer runs a few bytecodes once it has the GIL) and costs the hot path
nothing.

The bound at the door. The tracker loop switches to the packed ingress and has the lanes
spool, but it runs only when it gets the GIL: writers in a tight loop (16 threads of them)
can keep it away for long stretches and fill memory with tens of millions of records. So a
write that finds its structure holding ``max_buffered`` records or more does not append: it
waits in :func:`wait_for_room` (short sleeps, which hand the GIL to the loop) until the
loop has taken records out, or the run is sealed. The deque's check is one ``len()``
comparison on the hot path; the packed ingress checks its own length. A thread waiting
there has not fetched the structure it will write to yet, so :func:`wait_for_writers`
does not wait for it (it will fetch whatever is current when it leaves).

Why wait rather than spool on the writer's thread: the records' numbers (the run's order) and
the lanes' logs belong to the loop, and packing is already what the loop switches writers to;
what the loop lacks under sixteen writers is the GIL, which a waiting writer gives up. The
wait lasts one turn of the loop while the spool keeps up (the writers go at the spool's pace),
never on the backend. A loop that takes nothing for :data:`ROOM_WAIT_S` (stuck in an async
backend's blocking call) lets writes in past the bound, with a warning, until it drains again.
"""

from __future__ import annotations

import gc
import itertools
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sized
from types import CodeType, FrameType
from typing import Any, Final, Protocol

from async_tracker.errors import TrackerClosedError
from async_tracker.records import MetricColumns

METADATA: Final = "metadata"
ARTIFACT: Final = "artifact"
SOURCE: Final = "source"

Record = tuple[Any, ...]


class Sink(Protocol):
    """Where a run's writes go now: ``append`` takes one record, ``extend`` the points of
    one ``log_metrics`` call, each in one call that keeps all or (interrupted) nothing. The
    hot path calls ``run._sink.append(record)``: with the deque as the sink, that is one
    attribute load and one C call, as cheap as a write can be."""

    def append(self, record: Record, /) -> None: ...

    def extend(self, records: list[Record], /) -> None: ...


class Ingress:
    """Records accepted by a run and not yet given their place in its order."""

    __slots__ = ("_records", "append", "extend", "taken")

    def __init__(self) -> None:
        self._records: deque[Record] = deque()
        # Records taken out so far (by the loop): the writers' sign that it is not stuck.
        self.taken = 0
        self.append: Callable[[Record], None] = self._records.append
        self.extend: Callable[[list[Record]], None] = self._records.extend

    @property
    def sink(self) -> Sink:
        """The deque itself, for the hot path (``deque.extend`` takes one call's points in
        one C call: all of them, or none)."""
        return self._records

    @property
    def deque(self) -> deque[Record]:
        """The deque itself, for the hot path's check of the bound (one ``len()``)."""
        return self._records

    def __len__(self) -> int:
        return len(self._records)

    def drain(self, limit: int) -> list[Record]:
        """Takes up to ``limit`` of the oldest records (``popleft`` is atomic: writers may
        append meanwhile). Swapping the deque for a new one would be cheaper, but a writer
        holding the old ``append`` could then lose a record."""
        n = min(limit, len(self._records))
        # popleft called n times from C: no Python loop per record.
        out = list(itertools.islice(iter(self._records.popleft, None), n))
        self.taken += n
        return out

    def put_back(self, records: list[Record]) -> None:
        """Returns ``records`` (taken last, oldest first) to the front, where they were."""
        self._records.extendleft(reversed(records))

    def clear(self) -> None:
        self._records.clear()


# A packed point: name index, value, step (NO_STEP: none given), time. A record that is not a
# point (metadata, an artifact, a source, a step beyond 64 bits) is kept aside under a key, and
# its place in the order is a point with the name index OTHER and the key as its step.
POINT = struct.Struct("<Idqd")
_pack = POINT.pack
NO_STEP: Final = -(2**63)
OTHER: Final = 0xFFFFFFFF


def _always() -> bool:
    return True


class Packed:
    """The ingress of an overloaded run: records packed into one ``bytearray``.

    A write packs its record(s) and extends the buffer in one C call: the only change a
    write makes to the order (a name first seen is registered before, under a lock, and an
    unused registration is harmless).

    The tracker loop never deletes from the front of the buffer writers extend: CPython then
    moves the buffer at its next growth to a new allocation, holding two copies of a backlog
    of millions of points for a moment. Instead it swaps in an empty buffer and reads the
    old one (``_front``) by an offset, dropping it whole once read. A writer may have fetched
    the old buffer's ``extend`` just before the swap: the loop reads on only once no thread
    is inside a write (:func:`wait_for_writers`), so the old buffer is complete by then.
    """

    def __init__(
        self, limit: int = 0, beside: Sized = (), may_wait: Callable[[], bool] | None = None
    ) -> None:
        # Points the writers may have waiting here and in ``beside`` (the run's deque, which
        # drains while this fills) before they wait for room (0: no bound).
        self._limit = limit if limit > 0 else 1 << 62
        self._beside = beside
        # Whether this thread may wait for room: not the tracker loop's own (a backend's or
        # the system metrics' write there would wait for itself).
        self._may_wait = may_wait or _always
        # Points taken out so far (by the loop), and that count when a wait for room ran out
        # (see _wait; -1: none did).
        self.taken = 0
        self._stuck_taken = -1
        # Set (once) by the run's seal: a writer that waited for room raises, not writes.
        self.sealed = False
        self._buf = bytearray()
        self._push = self._buf.extend
        self._front = bytearray()  # swapped out, complete; read from _offset on
        self._offset = 0
        self._settled = True  # no writer can still extend _front
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        self._others: dict[int, Record] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()  # name registration only (rare: a name's first point)

    def __len__(self) -> int:
        return (len(self._front) - self._offset + len(self._buf)) // POINT.size

    def append(self, record: Record) -> None:
        if self._full():
            self._wait()
        try:  # the common case inline: a point of a known name
            name, value, step, ts = record
            packed = _pack(self._index[name], value, NO_STEP if step is None else step, ts)
        except (KeyError, ValueError, struct.error):
            packed = self._pack(record)  # a new name, another kind of record, a huge step
        # _push read here, after any wait: a swap meanwhile gave it a new buffer.
        self._push(packed)

    def extend(self, records: list[Record]) -> None:
        if self._full():
            self._wait()
        self._push(b"".join(map(self._pack, records)))

    def _full(self) -> bool:
        # A method call and two len()s on each packed write: the overloaded path only.
        return len(self) + len(self._beside) >= self._limit

    def _wait(self) -> None:
        """Past the bound: waits for the loop to take points out (see the module's note).
        The seal is read after the wait, out of wait_for_room: a close that waits for the
        writers then sees this thread inside the write until it has raised or written.
        After a wait ran out (a stuck loop), writes wait no more until the loop took some:
        then they wait again, so that a loop slowed down (not stuck) still holds the bound
        within what writers add between two of its takes."""
        if self._may_wait() and self.taken != self._stuck_taken:
            taken = self.taken
            if wait_for_room(self._full, lambda: self.sealed):
                self._stuck_taken = -1
            else:
                self._stuck_taken = taken
        if self.sealed:
            raise TrackerClosedError("the run was closed while this write waited for room")

    def _pack(self, record: Record) -> bytes:
        if len(record) == 4:
            name, value, step, ts = record
            i = self._index.get(name)
            if i is None:
                i = self._register(name)
            try:
                return POINT.pack(i, value, NO_STEP if step is None else step, ts)
            except struct.error:
                pass  # a step beyond 64 bits: kept aside, as a record
        key = next(self._keys)
        self._others[key] = record
        return POINT.pack(OTHER, 0.0, key, 0.0)

    def _register(self, name: str) -> int:
        with self._lock:
            i = self._index.get(name)
            if i is None:
                i = len(self._names)
                self._names.append(name)
                self._index[name] = i
            return i

    def ready(self) -> bool:
        """Makes the front buffer readable (on the loop): once it is read whole, the writers'
        buffer takes its place, after the writers that fetched its ``extend`` are done. The
        one step of a take that may wait: a cut calls it before it takes its ledger lock
        (see RunPipeline.cut), and the take then finds it done. False if a writer is held
        up (a debugger): nothing is read now."""
        if self._offset >= len(self._front) and self._buf:
            self._front, self._offset = self._buf, 0
            self._buf = bytearray()
            self._push = self._buf.extend
            self._settled = False
        if not self._settled:
            # Writers that fetched the old extend finish before we read it: a few bytecodes
            # once they have the GIL, so the wait is short. Bounded all the same: a writer
            # held up longer (a debugger) makes us read nothing now and look again later.
            self._settled = wait_for_writers(_PACKED_WRITES, SWAP_WAIT_S)
        return self._settled

    def _peek(self, limit: int) -> bytes:
        """The oldest ``limit`` points at most, as bytes, without taking them (on the loop).
        Only from the front buffer: once it is read, the writers' buffer takes its place."""
        if not self.ready():
            return b""
        end = min(len(self._front), self._offset + limit * POINT.size)
        return bytes(self._front[self._offset : end])

    def _consume(self, size: int) -> None:
        self._offset += size
        self.taken += size // POINT.size
        if self._offset >= len(self._front):
            self._front, self._offset = bytearray(), 0  # read whole: its memory goes

    def take_columns(self, limit: int) -> MetricColumns | None:
        """Up to ``limit`` of the oldest records as columns, without an object per point, if
        they are all points with a step; else None, and nothing is taken (``take`` then)."""
        if not _COLUMNS_OK:
            return None
        raw = self._peek(limit)
        n = len(raw) // POINT.size
        if not n:
            return None
        index = _column(raw, 0, 4, n)
        steps = _column(raw, 12, 8, n)
        if _holds(index, _OTHER_BYTES) or _holds(steps, _NO_STEP_BYTES):
            return None
        self._consume(len(raw))
        # The table as it is now: names only grow, and every index taken is in it.
        return MetricColumns(
            list(self._names), index, _column(raw, 4, 8, n), steps, _column(raw, 20, 8, n)
        )

    def take(self, limit: int) -> list[Record]:
        """Up to ``limit`` of the oldest records, as the deque holds them (on the loop)."""
        data = self._peek(limit)
        self._consume(len(data))
        names, others = self._names, self._others
        rows = list(POINT.iter_unpack(data))
        if not rows:
            return []
        idxs, values, steps, times = zip(*rows)
        if OTHER not in idxs and NO_STEP not in steps:  # all points with steps: C loops only
            return list(zip(map(names.__getitem__, idxs), values, steps, times))
        out: list[Record] = []
        for i, value, step, ts in rows:
            if i == OTHER:
                out.append(others.pop(step))
            else:
                out.append((names[i], value, None if step == NO_STEP else step, ts))
        return out


# Columns are read in the machine's order (array, the spool): the packed points are
# little-endian, so columns are made on little-endian machines alone (the others unpack).
_COLUMNS_OK = sys.byteorder == "little"
_OTHER_BYTES = struct.pack("<I", OTHER)
_NO_STEP_BYTES = struct.pack("<q", NO_STEP)


def _column(raw: bytes, offset: int, width: int, n: int) -> bytes:
    """The field at ``offset`` (``width`` bytes) of ``n`` packed points, as one contiguous
    column: ``width`` strided copies in C, nothing per point."""
    out = bytearray(n * width)
    for k in range(width):
        out[k::width] = raw[offset + k :: POINT.size]
    return bytes(out)


def _holds(column: bytes, value: bytes) -> bool:
    """Whether an item of ``column`` (items of ``len(value)`` bytes) equals ``value``: a C
    search, then a check that the match is aligned on an item."""
    width = len(value)
    at = column.find(value)
    while at >= 0:
        if at % width == 0:
            return True
        at = column.find(value, at + 1)
    return False


# The code of the packed writes, for the wait after a swap.
_PACKED_WRITES = frozenset({Packed.append.__code__, Packed.extend.__code__})
# At most this long for writers inside a packed write to finish (they need a few bytecodes).
SWAP_WAIT_S = 0.1


def _current_frames() -> dict[int, Any]:
    """``sys._current_frames()`` with the garbage collector off meanwhile. On CPython 3.11 and
    before, a collection inside it can deadlock the process: it holds the interpreter's
    thread-list lock while it allocates, and a finalizer run by the collection (a
    ``threading.local`` freed) takes the same lock (CPython issue gh-106883, not fixed in
    3.11). Re-enabled only if it was on: a user who turned the collector off keeps it off."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        return sys._current_frames()
    finally:
        if enabled:
            gc.enable()


# At most this long a write waits for room (per wait). The loop takes records out within its
# next turn at the GIL, which the waiting writers give it; a loop stuck longer (an async
# backend blocking it) must not stall the program: the write then goes in past the bound.
ROOM_WAIT_S = 1.0


def wait_for_room(full: Callable[[], bool], sealed: Callable[[], bool]) -> bool:
    """On a writer's thread, before it fetches where it writes: waits while ``full()`` and
    not ``sealed()``, at most :data:`ROOM_WAIT_S`; False if that ran out. Sleeps, so that the
    tracker loop (and the writers' own thread switches) get the GIL: with every writer here,
    the loop runs at once."""
    deadline = time.monotonic() + ROOM_WAIT_S
    pause = 0.0001
    while full() and not sealed():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(0.002, pause * 2)
    return True


# The wait for room: a thread inside it is not inside a write yet (see writers_inside).
_ROOM_CODE = wait_for_room.__code__


def writers_inside(codes: Collection[CodeType]) -> dict[int, FrameType]:
    """The threads other than this one running one of ``codes`` (anywhere on their stack),
    each with the frame of that call. ``sys._current_frames`` takes the snapshot under the
    GIL: it is consistent."""
    me = threading.get_ident()
    inside: dict[int, FrameType] = {}
    for ident, frame in _current_frames().items():
        if ident == me:
            # This thread may be a signal handler that interrupted a write of its own: that
            # write resumes only after we return, so waiting for it would wait forever.
            continue
        f: FrameType | None = frame
        while f is not None:
            if f.f_code is _ROOM_CODE:
                break  # waiting for room: it fetches where it writes only once it leaves
            if f.f_code in codes:
                inside[ident] = f
                break
            f = f.f_back
    return inside


def _still_running(call: FrameType, top: FrameType | None) -> bool:
    while top is not None:
        if top is call:
            return True
        if top.f_code is _ROOM_CODE:
            return False  # it has entered a wait for room: it will fetch the new structure
        top = top.f_back
    return False


def wait_for_writers(codes: Collection[CodeType], timeout: float) -> bool:
    """Waits until the writes under way now (calls of ``codes`` by other threads) have
    returned; False if ``timeout`` passed first.

    It waits for those very calls, by their frames, not for a moment when no thread is
    inside ``codes``: a thread writing in a tight loop is inside a write nearly all the
    time, but each of its calls ends within a few bytecodes. We hold the frames, so a new
    call never gets the identity of one we wait for. Polls with short sleeps, which release
    the GIL to the writers it waits for."""
    waiting = writers_inside(codes)
    deadline = time.monotonic() + timeout
    pause = 0.0
    while waiting:
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(0.001, pause * 2 or 0.00005)
        now = _current_frames()
        waiting = {i: f for i, f in waiting.items() if _still_running(f, now.get(i))}
    return True
