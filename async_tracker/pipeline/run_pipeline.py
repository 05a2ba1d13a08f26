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

from async_tracker.base import AsyncTrackerBase, CloseReason
from async_tracker.clock import Clock
from async_tracker.errors import describe
from async_tracker.ingress import Ingress, Packed, Record, Sink
from async_tracker.pipeline.cutter import Cutter
from async_tracker.pipeline.lane import Lane
from async_tracker.pipeline.overflow import HotPath, make_overflow
from async_tracker.records import Batch
from async_tracker.report import FlushReport, TrackerStatus
from async_tracker.runtime.ending import FINISHED, Ending
from async_tracker.runtime.process import runtime
from async_tracker.settings import PACKED_PAUSE_S, SPOOL_GRACE_S, RunOptions
from async_tracker.spool.io import SpoolIO
from async_tracker.spool.store import Spool, default_spool_dir, new_token
from async_tracker.tensors import DeferredValue, settle

logger = logging.getLogger(__name__)

# How many pauses without progress a flush of an overloaded run waits for its lanes to spill.
PACKED_STALL_ROUNDS = 40


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
            )
            for name, backend in backends
        ]
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
        # Once close's deadline has passed: why values still not ready are dropped.
        self._give_up: str | None = None
        # Where records wait, oldest first: after a switch, the structure written to before
        # it holds only older records, so it is drained first. Held records are older still.
        self._sources: list[Ingress | Packed] = [self.unsettled, ingress, self.packed]
        self.overloaded = False
        # Held by a cut from taking a batch to handing it to the lanes, and by status():
        # the one thing here other threads wait for, one batch's cut at most. Reentrant: a
        # signal handler may read the status on the thread that cuts (the simulator's).
        self._counting = threading.RLock()
        self.last_cut = self.clock.now()
        self.closed = False
        # The scopes of the flushes (and reads) waiting for lanes: close() ends them once it
        # has stopped the lanes, or they would wait forever for progress that cannot come.
        self._waiting: set[anyio.CancelScope] = set()
        # close()'s deadline, from the moment one is known (infinite until then). It only
        # ever moves earlier: shorten() (a SIGTERM) may set it before close() starts, or
        # while it runs; then the scopes of the close under way move with it. Each scope
        # maps to its floor: the time before which it must not end (the last step's bound).
        self._deadline = math.inf
        self._deadline_scopes: dict[anyio.CancelScope, float] = {}

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

    def cut(self, everything: bool = False) -> None:
        """Moves the records waiting in the ingress into batches of at most ``batch_size``,
        handed to every lane in order. Under overload the packed ingress is taken a share
        at a time, as the lanes write what they hold to disk: what waits stays packed
        (unless ``everything``)."""
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
        for source in list(self._sources):
            budget = len(source)
            if source is self.packed and self.overloaded and not everything:
                # Unpacked, a record takes five times the room: take no more than the
                # lanes can spill before the next look (half the bound: few, large writes,
                # since each hop to the spool thread waits for the GIL).
                held = max((lane.memory for lane in self.lanes), default=0)
                budget = min(budget, max(0, limit // 2 - held))
            while budget > 0:
                with self._counting:  # taken, numbered and handed over as one step
                    batch = self._take_batch(source, min(budget, self.options.batch_size))
                    if batch is not None:
                        for lane in self.lanes:
                            lane.put(batch)
                if batch is None:
                    break
                budget -= batch.records
                # A long cut shares the GIL with writers that may be filling the ingress
                # faster than it drains: look at the bound between batches, not only at ticks.
                self.check_memory()
                if self._stalled:
                    break
            if len(source) or self._stalled:
                break  # the rest of this one first: newer sources wait behind it

    def _take_batch(self, source: Ingress | Packed, limit: int) -> Batch | None:
        """The next batch of ``source``: packed points straight as columns when they allow
        it (no object per point), else records as the deque holds them."""
        if source is self.packed:
            columns = self.packed.take_columns(limit)
            if columns is not None:
                return self.cutter.cut_columns(columns)
        while True:
            records = _take(source, limit)
            if records and DeferredValue.made:
                records = self._settle(records)
                if not records and not self._stalled:
                    continue  # every point taken was lost (and counted): take the next
            return self.cutter.cut(records) if records else None

    def _settle(self, records: list[Record]) -> list[Record]:
        """The records whose device values are known, with those values; from the first
        not yet known on, records wait in ``unsettled`` (before they get their numbers, so
        that their order is kept: the next cut starts with them)."""
        ready, waiting, lost = settle(records, self._give_up)
        if waiting:
            self.unsettled.put_back(waiting)
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
        return ready

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
        return len(self.unsettled) + len(self.ingress) + len(self.packed)

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
        """Cuts everything waiting; under overload a share at a time, letting the lanes
        write each to disk before the next (memory stays bounded while a flush drains)."""
        self.cut()
        stalled = 0
        while len(self.packed) or len(self.unsettled):
            before = (len(self.packed), [lane.memory for lane in self.lanes])
            # Also a device value's short wait: polled, so that the loop goes on meanwhile.
            await self.clock.sleep(PACKED_PAUSE_S)
            self.cut()
            if len(self.unsettled):
                stalled = 0  # waiting for a device, not for the lanes
                continue
            # Lanes that cannot spill (a full disk) would make this wait forever: after a
            # while without progress, take the rest into memory (it is pending there).
            progress = (len(self.packed), [lane.memory for lane in self.lanes]) != before
            stalled = 0 if progress else stalled + 1
            if stalled >= PACKED_STALL_ROUNDS:
                self.cut(everything=True)

    def seal(self) -> None:
        """The run takes no more writes (from any thread): writers waiting for room under
        the block policy give up now, with TrackerClosedError."""
        self.closed = True
        self.packed.sealed = True  # writers waiting for room in it raise, not write
        self.overflow.seal()

    async def close(
        self, timeout: float, ending: Ending = FINISHED, stamp_ns: int = 0
    ) -> FlushReport:
        """Seals the run's end record (``ending``: its reason, and what ended a run that did
        not finish as metadata stamped ``stamp_ns``) after every record accepted, delivers
        what it can until ``timeout`` (or the earlier deadline :meth:`shorten` set), then
        stops the lanes whatever they do and spools what they still hold in memory, the end
        record included: a backend that is down gets it from the spool later, in its place
        (last). Then closes the backends the run built. The ingress was sealed by the
        caller."""
        self._deadline = min(self._deadline, self.clock.now() + timeout)
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
        for scope, floor in list(self._deadline_scopes.items()):
            self.clock.move(scope, max(floor, deadline))
        for lane in self.lanes:
            if lane.deadline is not None:  # retrying to the old deadline: stop sooner
                lane.begin_close(deadline)

    @contextmanager
    def _until_deadline(
        self, floor: float = -math.inf, shield: bool = False
    ) -> Iterator[anyio.CancelScope]:
        """A scope that ends at close()'s deadline, wherever :meth:`shorten` moves it, but
        not before ``floor``."""
        with self.clock.deadline(max(floor, self._deadline), shield) as scope:
            self._deadline_scopes[scope] = floor
            try:
                yield scope
            finally:
                del self._deadline_scopes[scope]

    async def _close(self, ending: Ending, stamp_ns: int) -> FlushReport:
        reason = ending.reason
        with self._until_deadline():
            await self._cut_all()
        # Device values not computed by now are dropped (counted), not waited for.
        self._give_up = "its device had not computed the value by close's deadline"
        self.cut(everything=True)  # what the deadline left packed: to the lanes, then disk
        if self.ends_run:
            # After the last cut: its number follows every record the run accepted.
            sealed = self.cutter.cut_end(
                reason, time.time(), self.life_start, ending.metadata(), stamp_ns
            )
            for lane in self.lanes:
                lane.put(sealed)
        for lane in self.lanes:
            lane.begin_close(self._deadline)
        with self._until_deadline() as scope:
            for lane in self.lanes:
                while not lane.drained() and lane.failure is None:
                    await lane.wait_progress()
        for lane in self.lanes:
            lane.stop()
        # Shielded and bounded: the records must reach the disk even if this close() is
        # itself cancelled, but a stuck disk must not hold the caller past its deadline.
        grace = max(self.clock.now(), self._deadline) + SPOOL_GRACE_S
        with self.clock.deadline(grace, shield=True):
            for lane in self.lanes:
                await lane.spool_leftovers()
        with self.clock.deadline(grace, shield=True):
            for lane in self.lanes:
                try:
                    await lane.release()
                except OSError as exc:
                    logger.warning("async_tracker: releasing the spool of %s: %s", lane.name, exc)
        report = self.report(timed_out=scope.cancelled_caught)
        if self.owns_backends:
            # Shielded: a backend left half-closed is worse than waiting out the rest of our
            # deadline. Only the backends the run built are closed (the end record told
            # every backend, those the user built too, how the run ended).
            with self._until_deadline(floor=self.clock.now() + SPOOL_GRACE_S, shield=True):
                async with anyio.create_task_group() as tg:
                    for lane in self.lanes:
                        tg.start_soon(self._close_quietly, lane, reason)
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
