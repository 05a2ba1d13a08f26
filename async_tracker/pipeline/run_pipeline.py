"""The pipeline of one run, on the tracker loop: ingress -> cutter -> a lane per backend.

:class:`RunPipeline` drains the run's ingress into numbered batches (when ``batch_size``
records wait, or ``flush_interval`` passed, or a flush asks), hands each batch to every lane,
keeps the run within ``max_buffered`` records in memory, and answers ``flush()`` and
``close()`` with reports whose counts come from the lanes' own state, read on the loop: they
add up exactly.

Everything here runs on the tracker loop (or, in the simulator, on its loop), so the state
needs no locks; the caller's threads only read counters (``status()``), which may be a moment
stale but never torn. What the run does past its bound is its overflow policy's
(:mod:`async_tracker.pipeline.overflow`); the ``block`` policy is the exception to the loop's
ownership: its writers wait on their own threads, on a ``threading.Event``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from async_tracker.base import AsyncTrackerBase, CloseReason
from async_tracker.clock import Clock
from async_tracker.errors import describe
from async_tracker.ingress import Ingress, Packed, Record, Sink
from async_tracker.pipeline.cutter import Cutter
from async_tracker.pipeline.lane import Lane
from async_tracker.pipeline.overflow import HotPath, make_overflow
from async_tracker.records import Batch, MetricColumns
from async_tracker.report import FlushReport, TrackerStatus
from async_tracker.runtime.ending import FINISHED, Ending
from async_tracker.runtime.process import runtime
from async_tracker.settings import (
    BACKEND_CLOSE_GRACE_S,
    CLOSE_FENCE_S,
    CLOSE_LOOK_S,
    CLOSE_SLICE_RECORDS,
    CLOSE_SPILL_MARGIN,
    PACKED_PAUSE_S,
    SPOOL_GRACE_S,
    RunOptions,
)
from async_tracker.spool.io import SpoolIO, wait_released
from async_tracker.spool.store import Spool, default_spool_dir, new_token
from async_tracker.tensors import DeferredValue, settle

logger = logging.getLogger(__name__)

# How many pauses without progress a flush of an overloaded run waits for its lanes to spill.
PACKED_STALL_ROUNDS = 40

# Why a close drops the metric values a device has not computed in time.
GIVE_UP = "its device had not computed the value by close's deadline"


# The jitter of retries in runs given no generator of their own.
JITTER = random.Random()


class RunPipeline:
    """The loop-side state of one run: its ingress, its numbering and its lanes."""

    def __init__(
        self,
        run_id: str,
        ingress: Ingress,
        backends: Sequence[tuple[str, AsyncTrackerBase]],
        options: RunOptions,
        *,
        owns_backends: bool = False,
        set_hot: Callable[[HotPath], None] | None = None,
        clock: Clock | None = None,
        io: SpoolIO | None = None,
        token: str | None = None,
        rng: random.Random | None = None,
        last_steps: Mapping[str, int] | None = None,
        life_start: float = 0.0,
        life: int = 0,
        ends_run: bool = True,
    ) -> None:
        self.run_id = run_id
        # Whether close seals the run's end record: not for a replay of a spool (sync), which
        # delivers the ends the jobs recorded and is no end of the run itself.
        self.ends_run = ends_run
        # When this process resumed the run (0: the run's first life): sealed with the end
        # record, so that readers tell a resumed run's later life from the ranks of one.
        self.life_start = life_start
        self.life = life
        self.ingress = ingress
        self.options = options
        self.owns_backends = owns_backends
        self.clock = clock or Clock()
        self.token = token or new_token()
        self.cutter = Cutter(self.token, life)
        self.cutter.last_step.update(last_steps or {})  # a resumed run goes on from its steps
        spool_dir = Path(options.spool_dir) if options.spool_dir else default_spool_dir()
        # Spool files are read and written on the process's spool thread (the simulator's
        # runs pass their own, inline).
        io = io if io is not None else runtime().spool_io
        # Retry jitter needs no generator of its own per lane (2.5 KB each: an orchestrator
        # may hold thousands of runs): the lanes of a run share one, and runs without a
        # seeded one (the simulator's) share the process's.
        rng = rng or JITTER
        # What the run does past its bound (spool, block, drop_oldest): one object, owning
        # that policy's state; the lanes are told its name and their share of the bound.
        self.overflow = make_overflow(run_id, options, set_hot)
        # The run's ledger: held by a cut while it takes a batch and while it hands it to
        # the lanes (not while it numbers it: see cut()), by every move of records between
        # the lanes' counters (delivered, in memory, on disk), and by status() and fence():
        # the one thing here other threads wait for, a few counter updates at most, and
        # never across an await. Reentrant: a signal handler may read the status on the
        # thread that cuts (the simulator's).
        self._counting = threading.RLock()
        self.lanes = [
            Lane(
                run_id,
                name,
                backend,
                policy=options.retry,
                clock=self.clock,
                spool=Spool(spool_dir, run_id, name, io, self.token),
                durable=options.durable,
                memory_limit=self.overflow.lane_memory_limit(options.max_buffered),
                overflow=self.overflow.name,
                segment_records=max(1, options.max_buffered // 2),
                rng=rng,
                heartbeat_s=options.heartbeat_s,
                life=life,
                ledger=self._counting,
            )
            for name, backend in backends
        ]
        for lane in self.lanes:
            lane.peers = self.lanes
        # While overloaded, AppRun's hot path is swapped (set_hot) for the packed ingress
        # (spool policy) or for the blocking sink (block policy): the only cost the
        # bound adds to the hot path. set_hot returns once no writer still uses the old one.
        self._set_hot = set_hot
        self._hot: HotPath = "plain"
        # Bounded too: past max_buffered records in it and the deque together, its writers
        # wait for room (see ingress.py).
        self.packed = Packed(options.max_buffered, ingress, self._off_the_loop)
        # The thread that cuts (the tracker loop's; the simulator's own): a write there must
        # not wait for room, which only that very thread can make. Set at each cut.
        self._cutter_thread: int | None = None
        # Records taken from the ingress whose first one has a metric value still being
        # computed on a device (see tensors.py): they wait here, in order, ahead of the rest.
        self.unsettled = Ingress()
        self._stalled = False  # this cut stopped at such a value
        # Records a cut has taken and not yet handed to the lanes (see cut()).
        self._in_hand = 0
        # Once close's deadline has passed: why values still not ready are dropped.
        self._give_up: str | None = None
        # Where records wait, oldest first: after a switch, the structure written to before
        # it holds only older records, so it is drained first. Held records are older still.
        self._sources: list[Ingress | Packed] = [self.unsettled, ingress, self.packed]
        self.overloaded = False
        self.last_cut = self.clock.now()
        self.closed = False
        # Set by fence() (under the ledger): the close's report was made from another thread
        # while this loop was held; nothing here moves records any more.
        self.fenced = False
        # The close's report, once made: by the close on the loop or by fence(), whichever
        # comes first (under the ledger); the other one answers with it.
        self._final: FlushReport | None = None
        # How far the close on the loop has come ("" until it starts; "cut", "deliver",
        # "spool", "done"): read by a caller deciding whether waiting for it is worth it
        # (see behind()).
        self.close_phase = ""
        self.sealed_at = math.inf  # when seal() was first called (this clock's time)
        self._end_sealed = False  # the run's end record is in the lanes
        # The scopes of the flushes (and reads) waiting for lanes: close() ends them once it
        # has stopped the lanes, or they would wait forever for progress that cannot come.
        self._waiting: set[anyio.CancelScope] = set()
        # close()'s deadline, from the moment one is known (infinite until then). It only
        # ever moves earlier: shorten() (a SIGTERM) may set it before close() starts, or
        # while it runs; then the scopes of the close under way move with it. Each scope
        # maps to its floor: the time before which it must not end (the last step's bound).
        self._deadline = math.inf
        self._deadline_scopes: dict[anyio.CancelScope, tuple[float, float]] = {}

    # -- what the process's flusher drives (async_tracker.runtime.flusher.Ticked) ----------------
    def tasks(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        """The lanes' tasks, which the flusher runs on the loop until the lanes stop."""
        return [(f"async-tracker lane {lane.name}", lane.run) for lane in self.lanes]

    def draining(self) -> bool:
        """Whether the packed ingress of an overload holds records: the flusher then looks
        again soon, so that taking them a share at a time keeps pace with the writers."""
        return len(self.packed) > 0

    # -- cutting --------------------------------------------------------------------------------
    def tick(self) -> None:
        """The flusher's look at this run: a cut if one is due, and the memory bound."""
        now = self.clock.now()
        n = self.waiting()
        if n >= self.options.batch_size or len(self.packed) or (
            n > 0 and now - self.last_cut >= self.options.flush_interval
        ):
            self.cut()
        else:
            self.check_memory()

    def cut(self, everything: bool = False, most: int | None = None) -> None:
        """Moves the records waiting in the ingress into batches of at most ``batch_size``,
        handed to every lane in order. Under overload the packed ingress is taken a share
        at a time, as the lanes write what they hold to disk: what waits stays packed
        (unless ``everything``). ``most``: records to take in this call, at most, rounded
        up to whole batches (a slice: the caller awaits between slices, so that a long cut
        does not hold the loop)."""
        if self.fenced:
            return  # the close's report is made: what waits stays where it is counted
        self._cutter_thread = threading.get_ident()
        self.check_memory()
        self.last_cut = self.clock.now()
        self._stalled = False
        limit = self.options.max_buffered
        excess = self.overflow.excess(self.waiting(), limit)
        if excess:
            # Past the bound (drop_oldest): the oldest records, numbered, go to the policy.
            for source in self._sources:
                with self._counting:
                    taken = _take(source, excess)
                    if taken:
                        self.overflow.shed(self.cutter.cut(taken), self.lanes)
                excess -= len(taken)
        left = math.inf if most is None else most
        for source in list(self._sources):
            budget = len(source)
            if source is self.packed and self.overloaded and not everything:
                # Unpacked, a record takes five times the room: take no more than the
                # lanes can spill before the next look (half the bound: few, large writes,
                # since each hop to the spool thread waits for the GIL).
                held = max((lane.memory for lane in self.lanes), default=0)
                budget = min(budget, max(0, limit // 2 - held))
            while budget > 0 and left > 0:
                # A slice ends between batches: it never cuts one short (a flush is still
                # one write_batch per backend for up to batch_size records).
                size = int(min(budget, self.options.batch_size))
                # Taken under the ledger, and counted as in hand until the lanes have it, so
                # that a reader of the counts (status(), fence()) never sees a batch in
                # neither place. Numbered and made a batch outside it: the costly part, which
                # a fence (a caller at its close's deadline) must not wait for; so is the
                # packed ingress's wait for its writers before a take.
                if source is self.packed:
                    self.packed.ready()
                with self._counting:
                    if self.fenced:
                        return
                    got, n = self._take_some(source, size)
                    self._in_hand = n
                if not n:
                    break
                batch, back, lost = self._make_batch(got)
                with self._counting:
                    if self.fenced:
                        return  # its report counts them in hand (pending): so they stay
                    self._in_hand = 0
                    self._settled(back, lost)
                    if batch is not None:
                        for lane in self.lanes:
                            lane.put(batch)
                budget -= n
                left -= n
                # A long cut shares the GIL with writers that may be filling the ingress
                # faster than it drains: look at the bound between batches, not only at ticks.
                self.check_memory()
                if self._stalled:
                    break
            if len(source) or self._stalled or left <= 0:
                break  # the rest of this one first: newer sources wait behind it

    def _take_some(
        self, source: Ingress | Packed, limit: int
    ) -> tuple[MetricColumns | list[Record], int]:
        """Up to ``limit`` of the oldest records of ``source`` and how many: packed points
        straight as columns when they allow it (no object per point), else records as the
        deque holds them."""
        if source is self.packed:
            columns = self.packed.take_columns(limit)
            if columns is not None:
                return columns, len(columns)
        records = _take(source, limit)
        return records, len(records)

    def _make_batch(
        self, taken: MetricColumns | list[Record]
    ) -> tuple[Batch | None, list[Record], list[str]]:
        """The batch of what was taken; and, of records whose first device value is not
        ready, those from it on (they wait, before they get their numbers, so that their
        order is kept), and what was lost (see tensors.py)."""
        if isinstance(taken, MetricColumns):
            return self.cutter.cut_columns(taken), [], []
        records: list[Record] = taken
        back: list[Record] = []
        lost: list[str] = []
        if records and DeferredValue.made:
            records, back, lost = settle(records, self._give_up)
        return (self.cutter.cut(records) if records else None), back, lost

    def _settled(self, back: list[Record], lost: list[str]) -> None:
        """Under the ledger: records whose device value is not ready go back to wait in
        ``unsettled`` (the next cut starts with them); lost points are counted and named."""
        if back:
            self.unsettled.put_back(back)
            self._stalled = True
        if lost:
            logger.warning(
                "async_tracker: run %r: %d metric points lost: %s",
                self.run_id, len(lost), "; ".join(lost[:3]),
            )
            for lane in self.lanes:
                if lane.takes_metrics:
                    lane.dropped += len(lost)
                    more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
                    lane.refused.append(f"{len(lost)} records: {lost[0]}{more}")

    # -- the memory bound -----------------------------------------------------------------------
    def _off_the_loop(self) -> bool:
        """Whether this thread is not the one that cuts: a writer here may wait for room."""
        return threading.get_ident() != self._cutter_thread

    def held(self) -> int:
        """Records of this run in memory: the ingress (the packed one too: a writer that
        keeps it filling keeps the overload going), and the most any lane holds."""
        lanes = max((lane.memory for lane in self.lanes), default=0)
        return self.waiting() + lanes

    def waiting(self) -> int:
        """Records not in a lane yet: in the ingress, waiting for a device, or in a cut's
        hands."""
        return len(self.unsettled) + len(self.ingress) + len(self.packed) + self._in_hand

    def _switch(self, to: HotPath) -> None:
        """Swaps the hot path between the deque and the packed ingress. Once set_hot has
        returned no writer uses the old one, whose records are all older: it goes first."""
        assert self._set_hot is not None
        new: Ingress | Packed = self.packed if to == "packed" else self.ingress
        self._set_hot(to)
        self._hot = to
        self._sources.remove(new)
        self._sources.append(new)

    def check_memory(self) -> None:
        """Starts or ends an overload, which keeps the run within ``max_buffered`` records in
        memory. It starts at half the bound: the flusher looks every 50 ms, and a loop that
        does nothing but log writes tens of thousands of records in between; the other half
        is room for them. It ends at a quarter, so that a run near the threshold does not
        switch at every look. What an overload does is the overflow policy's (see
        overflow.py): ``spool`` has the lanes write what they hold to disk; ``block`` makes
        writers wait for room; ``drop_oldest`` sheds at the bound itself."""
        limit = self.options.max_buffered
        held = self.held()
        if not self.overloaded and held > limit // 2:
            self.overloaded = True
            logger.info(
                "async_tracker: run %r holds %d records (max_buffered=%d); overflow policy %s",
                self.run_id, held, limit, self.options.overflow,
            )
            self.overflow.start()
        elif self.overloaded and held <= limit // 4:
            self.overloaded = False
            self.overflow.end()
        want = self.overflow.hot_path(self.overloaded)
        if want is not None and self._set_hot is not None:
            target = self.packed if want == "packed" else self.ingress
            # Only into an empty structure: one that still held older records would mix
            # them with the newer ones to come, and draining it first would reorder them.
            if want != self._hot and not len(target):
                self._switch(want)
        # While overloaded, lanes keep what they hold on disk when the policy says so (spool:
        # once the packed ingress holds more than half the bound; block: once a writer's
        # wait ran out, the writes then going on without waiting).
        spill = self.overflow.spill(self.overloaded, len(self.packed), limit)
        for lane in self.lanes:
            lane.set_overloaded(spill)

    @property
    def blocking(self) -> Sink:
        """The ``block`` policy's sink: a write waits for room, then goes to the ingress."""
        return self.overflow.sink(self.ingress)

    # -- flush and close ------------------------------------------------------------------------
    async def flush(
        self, timeout: float | None = None, lanes: Sequence[Lane] | None = None
    ) -> FlushReport:
        """Cuts what waits and waits until each lane has delivered it, or ended a failed
        round (then the report says what is pending and why), or ``timeout`` passed."""
        chosen = self.lanes if lanes is None else lanes
        end = math.inf if timeout is None else self.clock.now() + timeout
        with self.clock.deadline(end) as scope:
            self._waiting.add(scope)
            try:
                await self._cut_all()
                target = self.cutter.next_seq - 1
                marks = []
                for lane in chosen:
                    lane.kick()
                    marks.append(lane.parks)
                for lane, parks in zip(chosen, marks):
                    while not lane.settled(target, parks):
                        await lane.wait_progress()
            finally:
                self._waiting.discard(scope)
        self.check_memory()  # so that status() after a flush tells the overload as it is now
        return self.report(timed_out=scope.cancelled_caught)

    async def _cut_all(self) -> None:
        """Cuts everything waiting; a slice at a time, awaiting in between (a long cut on the
        loop would hold every deadline, this run's close's included); under overload a share
        at a time, letting the lanes write each to disk before the next (memory stays bounded
        while a flush drains)."""
        target = self.cutter.next_seq + self.waiting()  # what waits now: writers may add more
        await self._cut_slices(target)
        stalled = 0
        while (len(self.packed) or len(self.unsettled)) and not self.fenced:
            before = (len(self.packed), [lane.memory for lane in self.lanes])
            # Also a device value's short wait: polled, so that the loop goes on meanwhile.
            await self.clock.sleep(PACKED_PAUSE_S)
            # Lanes that cannot spill (a full disk) would make this wait forever: after a
            # while without progress, take the rest into memory (it is pending there).
            self.cut(everything=stalled >= PACKED_STALL_ROUNDS, most=CLOSE_SLICE_RECORDS)
            if len(self.unsettled):
                stalled = 0  # waiting for a device, not for the lanes
                continue
            if stalled < PACKED_STALL_ROUNDS:
                progress = (len(self.packed), [lane.memory for lane in self.lanes]) != before
                stalled = 0 if progress else stalled + 1
        await self._cut_slices(target)  # what the deque holds behind the packed records

    async def _cut_slices(self, target: int, everything: bool = False) -> None:
        """Cuts until the records numbered below ``target`` are, a slice at a time."""
        while self.cutter.next_seq < target and not self.fenced:
            before = self.cutter.next_seq
            self.cut(everything=everything, most=CLOSE_SLICE_RECORDS)
            if self.cutter.next_seq == before or self.cutter.next_seq >= target or self._stalled:
                # All of it; or nothing more to take now (packed under overload, a device
                # value). No await then: the lanes have not run since the cut.
                return
            await anyio.lowlevel.checkpoint()

    def seal(self) -> None:
        """The run takes no more writes (from any thread): writers waiting for room under
        the block policy give up now, with TrackerClosedError."""
        if not self.closed:
            self.sealed_at = self.clock.now()
        self.closed = True
        self.packed.sealed = True  # writers waiting for room in it raise, not write
        self.overflow.seal()

    async def close(
        self,
        timeout: float,
        ending: Ending = FINISHED,
        stamp_ns: int = 0,
        *,
        deadline: float | None = None,
    ) -> FlushReport:
        """Seals the run's end record (``ending``: its reason, and what ended a run that did
        not finish as metadata stamped ``stamp_ns``) after every record accepted, delivers
        what it can until ``timeout`` (or the earlier deadline :meth:`shorten` set), then
        stops the lanes whatever they do and spools what they still hold in memory, the end
        record first, until ``SPOOL_GRACE_S`` past the deadline. Then closes the backends the
        run built. The ingress was sealed by the caller.

        The report is the outcome: once it is made, the lanes are over and every write to
        disk either took effect or never will (see :meth:`~async_tracker.spool.log.BatchLog.
        fence`), so the records are where it says, and stay there. See :meth:`fence` for a
        caller that cannot wait for this (a loop held by a backend). ``deadline``, if given,
        is the deadline itself (this clock's time), as the caller computed it: a loop that
        starts this task late must not move it later."""
        end = self.clock.now() + timeout if deadline is None else deadline
        self._deadline = min(self._deadline, end)
        self.seal()
        try:
            return await self._close(ending, stamp_ns)
        finally:
            for scope in list(self._waiting):
                scope.cancel()

    def shorten(self, deadline: float) -> None:
        """Moves close()'s deadline, under way or to come, to ``deadline`` if that is
        earlier (a SIGTERM's grace). On the loop: another thread hands it over with the
        loop's ``call_soon``. What the lanes have not delivered by then is spooled."""
        if deadline >= self._deadline:
            return
        self._deadline = deadline
        for scope, (floor, offset) in list(self._deadline_scopes.items()):
            self.clock.move(scope, max(floor, deadline + offset))
        for lane in self.lanes:
            if lane.deadline is not None:  # retrying to the old deadline: stop sooner
                lane.begin_close(deadline)
                lane.log.begin_close(deadline + SPOOL_GRACE_S)

    @contextmanager
    def _until_deadline(
        self, floor: float = -math.inf, shield: bool = False, offset: float = 0.0
    ) -> Iterator[anyio.CancelScope]:
        """A scope that ends ``offset`` seconds past close()'s deadline, wherever
        :meth:`shorten` moves it, but not before ``floor``."""
        with self.clock.deadline(max(floor, self._deadline + offset), shield) as scope:
            self._deadline_scopes[scope] = (floor, offset)
            try:
                yield scope
            finally:
                del self._deadline_scopes[scope]

    def _seal_end(self, ending: Ending, stamp_ns: int) -> None:
        """The run's end record, after every record cut: to every lane (the last batch)."""
        with self._counting:
            if self.fenced:
                return
            sealed = self.cutter.cut_end(
                ending.reason, time.time(), self.life_start, ending.metadata(), stamp_ns
            )
            for lane in self.lanes:
                lane.put(sealed)
            self._end_sealed = True

    async def _close(self, ending: Ending, stamp_ns: int) -> FlushReport:
        reason = ending.reason
        # Until the deadline: cut what waits, seal the end record after it, deliver.
        self._step("cut")
        for lane in self.lanes:
            lane.begin_close(self._deadline)
            lane.log.begin_close(self._deadline + SPOOL_GRACE_S)
        # Values a device is still computing are waited for until a quarter of the close's
        # time before its deadline (SPOOL_GRACE_S at most); then they are dropped (counted),
        # and the records behind them still have that time to be delivered.
        margin = min(SPOOL_GRACE_S, max(0.0, self._deadline - self.clock.now()) / 4)
        with self._until_deadline(offset=-margin) as cutting:
            await self._cut_all()
        if cutting.cancelled_caught:
            if len(self.unsettled):
                self._give_up = GIVE_UP
            with self._until_deadline():
                await self._cut_all()
        if self.ends_run and not self.waiting():
            self._seal_end(ending, stamp_ns)
        self._step("deliver")
        with self._until_deadline() as scope:
            await self._deliver_until_deadline()
        if self.fenced:
            # The report is made (fence()) and no record moves any more, but the lanes'
            # tasks still end: a backend call queued for a worker thread is given up, not
            # left in the pool's queue (where it would hold its endpoint's share for ever).
            for lane in self.lanes:
                lane.stop()
            with self._until_deadline(shield=True, offset=SPOOL_GRACE_S):
                for lane in self.lanes:
                    await lane.wind_down()
            assert self._final is not None
            return self._final
        # The deadline: delivery stops; until SPOOL_GRACE_S past it, what is undelivered goes
        # to disk. Shielded: the records must reach the disk even if this close() is itself
        # cancelled; bounded: every step is a slice, and a write cut short at the end is given
        # up at its commit point (it took effect, or never will).
        self._step("spool")
        for lane in self.lanes:
            lane.stop()
        with self._until_deadline(shield=True, offset=SPOOL_GRACE_S):
            for lane in self.lanes:
                await lane.wind_down()
        # Device values not computed by now are dropped (counted), not waited for.
        self._give_up = GIVE_UP
        with self._until_deadline(shield=True, offset=SPOOL_GRACE_S):
            await self._cut_slices(self.cutter.next_seq + self.waiting(), everything=True)
        if self.ends_run and not self._end_sealed:
            # After the last cut. Records the grace left uncut stay in the ingress (counted
            # pending): they never get a number, and the end record is still the last one.
            self._seal_end(ending, stamp_ns)
        with self._until_deadline(shield=True, offset=SPOOL_GRACE_S):
            await self._spool_leftovers()
        # Our spool locks, released on the spool thread, in its turn: waited for within the
        # grace (a clean close leaves no lock file), and done all the same if not.
        released = [lane.log.release_now() for lane in self.lanes]
        with self._until_deadline(shield=True, offset=SPOOL_GRACE_S):
            for done in released:
                await wait_released(done)
        with self._counting:
            if self._final is None:  # else fence() made it while this loop was held
                self._final = self.report(timed_out=scope.cancelled_caught)
            report = self._final
        self._step("done")
        if self.owns_backends and not self.fenced:
            # Shielded: a backend left half-closed is worse than waiting out the rest of our
            # slack. Only the backends the run built are closed (the end record told
            # every backend, those the user built too, how the run ended).
            with self._until_deadline(shield=True, offset=BACKEND_CLOSE_GRACE_S):
                async with anyio.create_task_group() as tg:
                    for lane in self.lanes:
                        tg.start_soon(self._close_quietly, lane, reason)
        return report

    async def _deliver_until_deadline(self) -> None:
        """Waits for the lanes to deliver everything (or fail), looking every CLOSE_LOOK_S
        at the time left: once it is about what writing what waits in memory to the spool
        takes, the lanes write it behind the batch they deliver, so that the disk holds it by
        the deadline instead of a last write that cannot finish."""
        while True:
            busy = [lane for lane in self.lanes if not lane.drained() and lane.failure is None]
            if not busy or self.fenced:
                return
            need = sum(lane.log.spool_need_s() for lane in busy)  # one spool thread for all
            if self._deadline - self.clock.now() <= CLOSE_SPILL_MARGIN * need:
                for lane in busy:
                    lane.log.spill_now()
            with self.clock.move_on_after(CLOSE_LOOK_S):
                await busy[0].wait_progress()

    async def _spool_leftovers(self) -> None:
        """Writes what the lanes still hold in memory only to disk, slices taken from each
        lane in turn (each backend keeps its copy), each begun only if it should end before
        the spool's grace ends; when not all of a lane's should, its first slice is its end
        record (see BatchLog.leftovers). What does not fit stays in memory: the report counts
        it as lost at exit."""
        until = self._deadline + SPOOL_GRACE_S
        slices = {lane: list(lane.log.leftovers(until)) for lane in self.lanes}
        while any(slices.values()) and not self.fenced:
            for lane, runs in slices.items():
                if not runs:
                    continue
                run = runs.pop(0)
                until = self._deadline + SPOOL_GRACE_S
                if not lane.log.fits(run, until) or not await lane.log.write_leftover(run):
                    runs.clear()  # no time, or the disk failed: the rest of it stays

    def _step(self, phase: str | None = None) -> None:
        """The close on the loop takes a step: where it is, for a caller deciding how long
        to wait for it (see behind())."""
        if phase is not None:
            self.close_phase = phase

    def behind(self) -> bool:
        """At the close's deadline (from another thread): whether the close on the loop is so
        far behind that waiting out the slack for it is not worth it: given the time (at
        least ``CLOSE_FENCE_S`` since the run was sealed), the loop has not begun it, or is
        still cutting what waited when it began (starved of the GIL by threads that keep it
        busy, or held by a backend). Its caller then fences at once, keeping the slack for
        its own waits for the GIL. A close that delivers or spools is waited for through the
        slack, however slowly it goes: a loop that is slow, not stuck, still writes what it
        holds to the spool in that time; and so is any close given no time (``timeout=0``)."""
        if self.clock.now() - self.sealed_at < CLOSE_FENCE_S:
            return False
        return self.close_phase in ("", "cut")

    def fence(self) -> FlushReport:
        """The close's report, for a caller that stopped waiting for the tracker loop (held
        by a backend that blocks it, or starved of the GIL) past the close's slack. From the
        caller's thread. Under the ledger, which every move of records takes: from here on
        nothing of the run moves records, so the report made here is the outcome. What the
        loop was doing is given up: writes to disk at their commit point (the records of one
        that took effect count as spooled), a cut between two batches. The one write to a
        backend under way, if any, may still end: its records are counted ``in_doubt``.
        Our spool locks are released (a run reopened in this process takes the files over).
        If the loop made its report first, that one is returned."""
        with self._counting:
            if self._final is None:
                self.fenced = True
                for lane in self.lanes:
                    lane.log.fence()
                report = self.report(timed_out=True)
                if self.ends_run and not self._end_sealed:
                    # The loop never got to seal the end record: it is in no lane, and goes
                    # with the process, as one left in memory does.
                    report = dataclasses.replace(
                        report, end_pending=report.end_pending + len(self.lanes)
                    )
                self._final = report
            report = self._final
        if self.fenced:
            for lane in self.lanes:
                lane.log.release_now()
        return report

    async def _close_quietly(self, lane: Lane, reason: CloseReason) -> None:
        """aclose; a failure is logged and shown as the lane's last error, never raised: the
        report is already made."""
        try:
            await lane.backend.aclose(reason)
        except Exception as exc:
            lane.last_error = describe(exc)
            logger.warning(
                "async_tracker: closing backend %s failed: %s", lane.name, lane.last_error
            )

    def report(self, timed_out: bool = False) -> FlushReport:
        return FlushReport.from_status(self.status(), timed_out=timed_out)

    def status(self) -> TrackerStatus:
        # Under the lock a cut holds while a batch is in its hands (taken from the ingress,
        # not yet in the lanes): read from another thread meanwhile (a close whose loop is
        # still busy answers with the state then), that batch would be counted nowhere.
        with self._counting:
            buffered = self.waiting()
            backends = {lane.name: lane.status(buffered) for lane in self.lanes}
        return TrackerStatus(
            run_id=self.run_id,
            closed=self.closed,
            backends=backends,
            overloaded=self.overloaded,
            blocked_writes=self.overflow.blocked_writes,
            blocked_s=self.overflow.blocked_s,
        )


def _take(source: Ingress | Packed, limit: int) -> list[Record]:
    return source.drain(limit) if isinstance(source, Ingress) else source.take(limit)
