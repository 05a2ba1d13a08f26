"""The three overflow policies: what a run does past its ``max_buffered`` records in memory.

:class:`~async_tracker.pipeline.run_pipeline.RunPipeline` decides when a run is overloaded
(past half the bound) and when it is not any more (a quarter), and asks its policy, one
object per run, what that means:

* :class:`Spool` (``"spool"``, the default): the hot path is switched to the packed ingress,
  and the lanes write what they hold to disk once it fills past half the bound.
* :class:`Block` (``"block"``): writers wait for room, at most ``overflow_timeout`` per
  overload; after that the writes go on and the lanes spool until the overload ends.
* :class:`DropOldest` (``"drop_oldest"``): each cut first sheds the metrics of the oldest
  records past the bound (the lanes shed what they hold past theirs).

The pipeline keeps the cutting, the numbering, flush and close. Everything here runs on the
tracker loop, except :meth:`Block.wait_for_room` (on the writers' threads) and
:meth:`Overflow.seal` (on whichever thread closes the run, the SIGTERM handler's included).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal

from async_tracker.errors import TrackerClosedError
from async_tracker.ingress import Ingress, Record, Sink
from async_tracker.pipeline.lane import Lane
from async_tracker.records import Batch
from async_tracker.settings import OverflowPolicy, RunOptions

# What AppRun's hot path writes to: the deque, the block policy's waiting write, the packed
# ingress of an overloaded run.
HotPath = Literal["plain", "block", "packed"]
SetHot = Callable[[HotPath], None]


class Overflow:
    """What a run does past its bound: the interface RunPipeline calls, and the behaviour of
    a policy that does nothing special (each policy overrides what it changes)."""

    name: OverflowPolicy
    # The block policy's cost to the writers (status() reads them from any thread).
    blocked_writes = 0
    blocked_s = 0.0

    def lane_memory_limit(self, max_buffered: int) -> int:
        """Records a lane holds in memory before it acts (spools or sheds)."""
        return max_buffered

    def excess(self, waiting: int, limit: int) -> int:
        """How many of the oldest waiting records a cut sheds (:meth:`shed`) first."""
        return 0

    def shed(self, batch: Batch, lanes: Sequence[Lane]) -> None:
        """Drops what the policy drops of ``batch`` (numbered by the cut) and hands the rest
        to the lanes."""
        raise NotImplementedError(self.name)

    def start(self) -> None:
        """The run has just gone over half its bound."""

    def end(self) -> None:
        """The run has just come back under a quarter of its bound."""

    def hot_path(self, overloaded: bool) -> HotPath | None:
        """The hot path the pipeline switches to at each look (None: it does not switch)."""
        return None

    def spill(self, overloaded: bool, packed: int, limit: int) -> bool:
        """Whether the lanes keep what they hold on disk now (``packed``: the records in the
        packed ingress)."""
        return False

    def seal(self) -> None:
        """The run takes no more writes (from any thread, the SIGTERM handler's too)."""

    def sink(self, ingress: Ingress) -> Sink:
        """The hot path's sink while switched to ``"block"``."""
        return ingress.sink


class Spool(Overflow):
    """``spool``: the lanes act at half the bound (the other half is the ingress's); while
    overloaded the hot path writes to the packed ingress, and once that holds more than half
    the bound (a backend not keeping up: a burst a healthy one drains stays below), the
    lanes keep what they hold on disk."""

    name: OverflowPolicy = "spool"

    def lane_memory_limit(self, max_buffered: int) -> int:
        return max(1, max_buffered // 2)

    def hot_path(self, overloaded: bool) -> HotPath | None:
        return "packed" if overloaded else "plain"

    def spill(self, overloaded: bool, packed: int, limit: int) -> bool:
        return overloaded and packed > limit // 2


class DropOldest(Overflow):
    """``drop_oldest``: sheds at the bound itself, the oldest metrics first."""

    name: OverflowPolicy = "drop_oldest"

    def excess(self, waiting: int, limit: int) -> int:
        return waiting - limit if waiting > limit else 0

    def shed(self, batch: Batch, lanes: Sequence[Lane]) -> None:
        """Records still in the ingress: the metrics go (their steps still count, and they
        keep their numbers), the rest is kept."""
        shed = batch.points()
        batch.metrics = []
        batch.records -= shed
        for lane in lanes:
            if lane.takes_metrics:
                lane.shed += shed
                lane.dropped += shed
            if batch.records:
                lane.put(batch)


class Block(Overflow):
    """``block``: while overloaded, writes wait for room (:meth:`wait_for_room`, through
    :meth:`sink`), at most ``timeout`` per overload; once a wait ran out the writes go on
    without waiting and the lanes spool, until the overload ends."""

    name: OverflowPolicy = "block"

    def __init__(self, run_id: str, timeout: float, set_hot: SetHot | None) -> None:
        self.run_id = run_id
        self.timeout = timeout
        self._set_hot = set_hot
        self.room = Room()  # set while not overloaded: blocked writers wait on it
        self.expired = False  # a writer's wait ran out in this overload
        self.sealed = False
        self._counts_lock = threading.Lock()  # blocked writers count from their own threads
        self.blocked_writes = 0
        self.blocked_s = 0.0

    def start(self) -> None:
        if self._set_hot is not None and not self.sealed:
            self.expired = False
            self.room.clear()
            self._set_hot("block")

    def end(self) -> None:
        if not self.room.is_set():
            self.room.set()
            if self._set_hot is not None:
                self._set_hot("plain")

    def spill(self, overloaded: bool, packed: int, limit: int) -> bool:
        return overloaded and self.expired

    def seal(self) -> None:
        # Sealed before the room opens: a writer it wakes must see why.
        self.sealed = True
        self.room.set()

    def sink(self, ingress: Ingress) -> Sink:
        return _BlockingSink(self, ingress)

    def wait_for_room(self) -> None:
        """On the caller's thread: waits until the run is back within its bound, at most
        ``timeout`` per overload; after that the writes go on without waiting (and the
        lanes spool) until the overload ends."""
        start = time.monotonic()
        room = self.room.wait(self.timeout)
        if self.sealed:
            raise TrackerClosedError(f"run {self.run_id!r} closed while this write waited")
        if not room and self._set_hot is not None:
            self.expired = True  # the loop has the lanes spool at its next look
            self._set_hot("plain")
        with self._counts_lock:
            self.blocked_writes += 1
            self.blocked_s += time.monotonic() - start


def make_overflow(run_id: str, options: RunOptions, set_hot: SetHot | None) -> Overflow:
    """The policy ``options.overflow`` names, for the run ``run_id``."""
    if options.overflow == "block":
        return Block(run_id, options.overflow_timeout, set_hot)
    if options.overflow == "drop_oldest":
        return DropOldest()
    return Spool()


class Room:
    """A ``threading.Event`` (set at first) that ``seal()`` can always set.

    ``seal()`` runs also in the SIGTERM handler, which runs in the main thread on top of
    whatever that thread was doing: maybe inside this very object's ``set()`` (an exit hook's
    close) or ``wait()`` (a blocked writer), holding its lock. So the lock is reentrant (a
    plain Event's would wait for its own thread forever), and setting what is set takes no
    lock: the close that the handler then waits for seals again on the tracker loop, which
    must not wait for the main thread's lock either."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._flag = True

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if self._flag:
            return  # no waiter: they wait only while it is clear (see the class's note)
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._flag = False

    def wait(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._flag, timeout)


class _BlockingSink:
    """The ``block`` policy's writes: wait for room (:meth:`Block.wait_for_room`), then one
    append or extend of the ingress, atomic as on the hot path."""

    __slots__ = ("_ingress", "_policy")

    def __init__(self, policy: Block, ingress: Ingress) -> None:
        self._policy = policy
        self._ingress = ingress

    def append(self, record: Record) -> None:
        self._policy.wait_for_room()
        self._ingress.append(record)

    def extend(self, records: list[Record]) -> None:
        self._policy.wait_for_room()
        self._ingress.extend(records)
