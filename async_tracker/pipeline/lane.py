"""A lane: one backend's ordered log of one run's batches, in two tiers, and its delivery.

The log (``Lane.log``) holds every batch the lane has not finished, oldest first. Each entry
is in memory, on disk in the spool, or both (``durable=True`` writes every batch ahead):

    log:   [ adopted segment | batch (in flight) | batch | segment (2 batches) | batch ... ]
             a dead pipeline's  memory              memory  disk                  memory

Delivery always takes the head; an entry on disk only is read back in its place. So the
tier of an entry never changes its turn: an overload, a backend outage or a close moves
records between memory and disk, never their order.

Two tasks per lane, both on the tracker loop, so that a backend hung in a write never keeps
records from reaching the disk:

* the deliverer writes the head with retries (:func:`~async_tracker.retry.write_with_retries`)
  and, once it is done, persists the ack (the head's ``seq``) when the entry is on disk;
* the spiller writes runs of memory entries to new segments: ahead of delivery when durable,
  behind a failing backend, or past the memory bound (then it drops the memory copy).

Failures (:func:`~async_tracker.errors.classify`): transient ones are retried with backoff;
a failure of the backend ends the round at once; after a round the lane pauses (``cooldown_s``,
or until a flush or close asks) and tries again, for as long as the run lives. Retries follow
progress: a round ends after ``max_attempts`` tries that stored nothing, and a try that stored
a part of the head (``Batch.done``) starts a new round, without a pause. A refused
record splits its batch until the record stands alone, and only it is dropped, counted and
named. If a task of the lane dies, its records stay where they are, the error is reported, and
nothing else stops.

Everything here runs on the tracker loop; other threads only read counters (``status()``).
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from async_tracker.base import AsyncTrackerBase, has_heartbeat
from async_tracker.clock import Clock
from async_tracker.errors import RecordError, classify
from async_tracker.pipeline.cutter import split
from async_tracker.records import Batch
from async_tracker.report import BackendStatus
from async_tracker.retry import RetryPolicy, write_with_retries
from async_tracker.settings import OverflowPolicy
from async_tracker.spool.store import Segment, Spool

logger = logging.getLogger(__name__)

# While closing, the pause between rounds against a backend that fails at once.
CLOSING_PAUSE_S = 0.05


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass(eq=False)
class Entry:
    """A stretch of the log: one batch (in memory, and maybe on disk), or lines of one
    segment on disk only."""

    first: int
    seq: int
    records: int
    since: float  # when it joined the lane (for the lag)
    batch: Batch | None = None
    segment: Segment | None = None
    lines: list[int] | None = None  # its lines in the segment; None: every line (adopted)
    token: str | None = None  # a dead pipeline's (its own numbering); None: ours
    last: bool = True  # False for the parts of a split batch but its last: no ack, no line
    part: bool = False  # a part of a split batch (never spilled on its own: it is the head)
    dropped: int = 0  # records a backend refused for good, counted when the entry is done
    # End records it holds (see Batch.end): not records, so counted apart. For a segment not
    # read yet, a guess (one if it holds no record: only an end record makes such a line);
    # exact once read.
    ends: int = 0


@dataclass
class _Adoption:
    ack: int
    segments: set[Path] = field(default_factory=set)


class Lane:
    """Delivery of one run's batches to one backend."""

    def __init__(
        self,
        run_id: str,
        name: str,
        backend: AsyncTrackerBase,
        *,
        policy: RetryPolicy,
        clock: Clock,
        spool: Spool,
        durable: bool = False,
        memory_limit: int = 500_000,
        overflow: OverflowPolicy = "spool",
        segment_records: int = 500_000,
        rng: random.Random | None = None,
        heartbeat_s: float = 0.0,
    ) -> None:
        self.run_id = run_id
        self.name = name
        self.backend = backend
        self.policy = policy
        self.clock = clock
        self.spool = spool
        self.durable = durable
        self.memory_limit = memory_limit
        self.overflow = overflow
        self.segment_records = segment_records
        self.rng = rng or random.Random()  # the run's (shared by its lanes), or one of its own
        self.takes_metrics = backend.supports_metrics
        # Seconds between heartbeats; 0: none (also for backends without the method).
        self.heartbeat_s = heartbeat_s if has_heartbeat(backend) else 0.0
        self.log: deque[Entry] = deque()
        # Counters, in records. Every record put in the lane is in exactly one of: memory
        # (not on disk), disk (undelivered, on disk), delivered, dropped.
        self.memory = 0
        self.disk = 0
        # End records (see Batch.end), apart from the records: in memory only, and on disk.
        self.ends_memory = 0
        self.ends_disk = 0
        self.delivered = 0
        self.dropped = 0
        self.shed = 0  # dropped by the drop_oldest policy (part of dropped)
        self.retries = 0
        self.parks = 0
        # Parts of batches (``Batch.done`` marks) stored by writes that failed: the progress
        # a round of retries follows (see write_with_retries). Only grows.
        self.parts_stored = 0
        self._try_stored = False  # the last write that failed stored a part before failing
        self.adopted = 0  # records of dead pipelines taken over (counted in the others)
        self.refused: list[str] = []  # what backends refused for good, for the report
        self.last_error: str | None = None
        self.healthy = True
        self.failure: str | None = None  # a task of the lane died
        self.overloaded = False  # the run asks for memory to go to disk
        self.parked = False
        self.adopting = True
        self.deadline: float | None = None  # set by close()
        self.acked = -1  # our own high-water mark (in memory)
        self._in_flight: Entry | None = None
        self._writing: set[int] = set()  # ids of entries the spiller is writing now
        self._left: dict[Path, int] = {}  # lines of a segment not done yet
        self._adopted: dict[str, _Adoption] = {}
        self._spool_broken_until = -1.0
        self._spool_failing = False  # the last write to disk failed
        self._spiller_dead = False
        self._running = False  # run() was started
        self._bound = False

    def bind(self) -> None:
        """Creates the lane's anyio objects on the loop (a lane is built on the caller's
        thread, before the loop first sees it)."""
        if not self._bound:
            self._work = anyio.Event()
            self._spill = anyio.Event()
            self._written = anyio.Event()
            self._progress = anyio.Event()
            self._kick = anyio.Event()
            self._idle = anyio.Event()  # the spiller is not writing
            self._idle.set()
            self._scope = anyio.CancelScope()
            self._spill_scope = anyio.CancelScope()
            self._deliver_scope = anyio.CancelScope()
            self._ended = anyio.Event()  # run() is over: neither task runs again
            self._bound = True

    # -- called by the run's pipeline, on the loop ---------------------------------------------
    def put(self, batch: Batch) -> None:
        """Appends a batch to the log (in memory)."""
        self.bind()
        mine = batch.for_lane()
        points = mine.points()
        if not self.takes_metrics and points:
            mine.records -= points
            mine.metrics = []
        if mine.is_empty():
            return
        ends = int(mine.end is not None)
        self.log.append(
            Entry(mine.first, mine.seq, mine.records, self.clock.now(), mine, ends=ends)
        )
        self.memory += mine.records
        self.ends_memory += ends
        if self.overflow == "drop_oldest" and self.memory > self.memory_limit:
            self._shed()
        self._work.set()
        if self._wants_spill():
            self._spill.set()

    def set_overloaded(self, overloaded: bool) -> None:
        """The run asks for (or releases) memory: while overloaded, what the lane holds goes
        to disk."""
        self.bind()
        if overloaded != self.overloaded:
            self.overloaded = overloaded
            if overloaded:
                self._spill.set()

    def kick(self) -> None:
        """Ends a pause between rounds: flush and close want their answer now. Only a pause
        under way: a kick kept for later would cut the next pause short."""
        self.bind()
        if self.parked:
            self._kick.set()

    def begin_close(self, deadline: float) -> None:
        """From now on, retry until ``deadline`` and no further."""
        self.deadline = deadline
        self.kick()

    def settled(self, target: int, parks: int) -> bool:
        """Whether a flush of everything up to ``target`` may return: our entries up to it
        are done (adopted ones first), or the lane ended a failed round since the flush began
        (``parks`` then), or it died."""
        if self.failure is not None or self.parks > parks:
            return True
        if self.adopting:
            return False
        head = self.log[0] if self.log else None
        return head is None or (head.token is None and head.first > target)

    def drained(self) -> bool:
        return not self.log and not self.adopting

    async def wait_progress(self) -> None:
        self.bind()
        await self._progress.wait()

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()

    def status(self, buffered: int) -> BackendStatus:
        head = self.log[0] if self.log else None
        return BackendStatus(
            name=self.name,
            buffered=buffered,
            in_flight=self.memory,
            spooled=self.disk,
            delivered=self.delivered,
            dropped=self.dropped,
            retries=self.retries,
            last_error=self.failure or self.last_error,
            lag_s=self.clock.now() - head.since if head is not None else 0.0,
            healthy=self.healthy and self.failure is None and not self._spool_failing,
            spool_path=self.spool.path,
            shed=self.shed,
            refused=tuple(self.refused),
            end_pending=self.ends_memory,
            end_spooled=self.ends_disk,
        )

    # -- the tasks ------------------------------------------------------------------------------
    async def run(self) -> None:
        """The lane's two tasks (and the heartbeat, if any), until close() stops them."""
        self.bind()
        self._running = True
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._supervised, self._spill_forever, self._spill_scope)
                    if self.heartbeat_s > 0:
                        tg.start_soon(self._heartbeat_forever)
                    await self._supervised(self._deliver_forever, self._deliver_scope)
        finally:
            self._ended.set()

    async def _heartbeat_forever(self) -> None:
        """Tells the backend the run is alive, every ``heartbeat_s``, until close stops the
        lane. A task of its own, beside delivery: each call is bounded by the interval and
        its failures are ignored (logged at debug level), so that a store that is slow or
        down costs delivery nothing. It stops once the run closes (its end record says the
        rest)."""
        while True:
            with self.clock.move_on_after(self.heartbeat_s):
                try:
                    await self.backend.heartbeat(self.run_id, self.heartbeat_s)
                except Exception as exc:
                    logger.debug(
                        "async_tracker: heartbeat of run %r on %s failed: %s",
                        self.run_id, self.name, describe(exc),
                    )
            if self.deadline is not None:
                return  # closing
            await self.clock.sleep(self.heartbeat_s)
            if self.deadline is not None:
                return

    async def _supervised(
        self, task: Callable[[], Awaitable[None]], scope: anyio.CancelScope
    ) -> None:
        """Runs a task of the lane; if it dies, the lane reports it and keeps its records
        (the process, the other lanes and the other runs go on)."""
        with scope:
            try:
                await task()
            except Exception as exc:
                if task == self._spill_forever:
                    self._spiller_dead = True  # the deliverer no longer waits for it
                    self._written.set()
                self.failure = f"lane stopped: {describe(exc)}"
                self.healthy = False
                self.adopting = False
                logger.exception(
                    "async_tracker: delivery of run %r to %s stopped; its records are kept",
                    self.run_id, self.name,
                )
                self._signal_progress()

    async def _deliver_forever(self) -> None:
        await self._adopt()
        while True:
            if not self.log:
                self._signal_progress()
                await self._work.wait()
                self._work = anyio.Event()
                continue
            entry = self.log[0]
            if entry.batch is None:
                await self._load(entry)
                continue
            if id(entry) in self._writing:
                # Being written to disk: deliver it once it is there, so that its ack covers
                # its line (delivered from memory meanwhile, a crash would replay it).
                await self._written.wait()
                continue
            if (
                self.durable
                and entry.segment is None
                and not entry.part  # split while the disk failed: delivered from memory
                and not self._spool_broken()
                and not self._spiller_dead
            ):
                # Write-ahead: the spiller logs it first; it wakes us when it did.
                self._spill.set()
                await self._written.wait()
                continue
            self._in_flight = entry
            try:
                done = await self._attempt(entry)
            finally:
                self._in_flight = None
            if done:
                await self._complete(entry)

    async def _attempt(self, entry: Entry) -> bool:
        """One round of writes of the head. True when it is done with (delivered, or its
        refused records counted); False when it must be tried again (a pause was taken, or
        the head was split)."""
        assert entry.batch is not None
        if entry.batch.is_empty():  # every metric of it shed by drop_oldest
            return True
        try:
            await write_with_retries(
                self.policy,
                self.clock,
                self.rng,
                lambda: self.deadline,
                self._on_retry,
                lambda: self.parts_stored,
                self._deliver,
                self.run_id,
                entry.batch,
            )
        except Exception as exc:
            self.last_error = describe(exc)
            kind = classify(exc)
            if kind == "record":
                return self._refuse(entry, exc)
            self.healthy = False
            if self._try_stored:
                # A failure of the backend ends a round at once, but the try stored a part:
                # the backend half-works, so a new round starts now rather than after a
                # cooldown (the parts of a batch are finite: this cannot go on for ever).
                return False
            await self._pause(kind)
            return False
        self.healthy = True
        return True

    async def _deliver(self, run_id: str, batch: Batch) -> None:
        """One write of the backend, its failure as the backend maps it (map_error): the
        lane's edge, where each failure is mapped once (an error the backend already mapped,
        naming its file or request, comes back as it is) and the lane decides retry, keep or
        drop by what the mapped error is (:func:`~async_tracker.errors.classify`).

        The batch's done marks are for the store that took those parts (``done_for``): a
        batch replayed into another store (``sync --to``) is written whole there. Marks whose
        store is unknown (either side without a ``store_id``) are kept: that is a replay into
        the same backend, the common case, where writing twice would duplicate."""
        store = self.backend.store_id
        if batch.done and store is not None and batch.done_for not in (None, store):
            batch.done.clear()
        if store is not None:
            batch.done_for = store
        before = len(batch.done)  # marks are only added while a write runs
        try:
            await self.backend.write_batch(run_id, batch)
        except Exception as exc:
            stored = len(batch.done) - before
            self.parts_stored += stored
            self._try_stored = stored > 0
            mapped = self.backend.map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    def _on_retry(self, exc: BaseException) -> None:
        self.retries += 1
        self.last_error = describe(exc)

    def _refuse(self, entry: Entry, exc: Exception) -> bool:
        """A backend refused records of the head for good: split it, or drop what stands
        alone. True when the head is done."""
        assert entry.batch is not None
        refused = exc.refused if isinstance(exc, RecordError) else None
        parts = [] if refused is not None else split(entry.batch)
        if not parts:
            entry.dropped = entry.records if refused is None else min(refused, entry.records)
            self.refused.append(f"{entry.dropped} records: {describe(exc)}")
            logger.error(
                "async_tracker: backend %s refused %d records of run %r for good: %s",
                self.name, entry.dropped, self.run_id, describe(exc),
            )
            return True
        # The parts take the head's place; only the last one completes the batch (its ack
        # and its line), so a crash in between re-sends the batch, never skips it.
        self.log.popleft()
        for i, part in enumerate(reversed(parts)):
            self.log.appendleft(
                Entry(
                    part.first, part.seq, part.records, entry.since, part,
                    entry.segment, entry.lines, entry.token, last=entry.last and i == 0,
                    part=True, ends=int(part.end is not None),
                )
            )
        return False

    async def _pause(self, kind: str) -> None:
        """The end of a failed round: spill what waits behind the head, tell the flushes
        waiting for us, and wait a cooldown (or for a kick) before the next round."""
        self.parks += 1
        self.parked = True
        if self._wants_spill():
            self._spill.set()
        self._signal_progress()
        if self.deadline is None:
            pause = self.policy.cooldown_s
            logger.warning(
                "async_tracker: backend %s of run %r is failing (%s); retrying in %.1f s",
                self.name, self.run_id, self.last_error, pause,
            )
        else:
            pause = min(self.policy.cooldown_s, max(self.policy.max_backoff_s, CLOSING_PAUSE_S))
        with self.clock.move_on_after(pause):
            await self._kick.wait()
        self._kick = anyio.Event()
        self.parked = False

    async def _complete(self, entry: Entry) -> None:
        """The head is done: persist the ack if it was on disk, remove segments no longer
        needed, then count it (a flush that sees the count finds the disk tidied)."""
        if entry.last:
            if entry.token is None:
                self.acked = max(self.acked, entry.seq)
            if entry.segment is not None:
                await self._line_done(entry.segment, entry.token, entry.seq, len(entry.lines or ()))
        self.log.popleft()
        self.delivered += entry.records - entry.dropped
        self.dropped += entry.dropped
        if entry.segment is None:
            self.memory -= entry.records
            self.ends_memory -= entry.ends
        else:
            self.disk -= entry.records
            self.ends_disk -= entry.ends
        if not self.log:
            self._spool_failing = False  # a failed spool write holds nothing back any more
        self._signal_progress()

    async def _line_done(self, segment: Segment, token: str | None, seq: int, lines: int) -> None:
        try:
            await self.spool.ack(token or self.spool.token, seq)
        except OSError as exc:
            # Delivered all the same; without the ack a crash would replay the line (a
            # duplicate for backends that are not idempotent, never a loss).
            self._spool_error("ack", exc)
        left = self._left[segment.path] = self._left.get(segment.path, 0) - lines
        if left <= 0:
            await self._segment_done(segment, token)

    async def _segment_done(self, segment: Segment, token: str | None) -> None:
        self._left.pop(segment.path, None)
        adoption = self._adopted.get(token) if token is not None else None
        try:
            await self.spool.remove(segment)
            if adoption is not None and token is not None:
                adoption.segments.discard(segment.path)
                if not adoption.segments:
                    del self._adopted[token]
                    await self.spool.forget(token)
        except OSError as exc:
            self._spool_error("cleanup", exc)  # a replay skips what the ack covers

    def _spool_error(self, what: str, exc: BaseException) -> None:
        self.last_error = f"spool {what}: {describe(exc)}"
        logger.warning(
            "async_tracker: spool of run %r, backend %s: %s", self.run_id, self.name,
            self.last_error,
        )

    # -- disk -----------------------------------------------------------------------------------
    async def _adopt(self) -> None:
        """Puts what dead pipelines left at the head of the log, oldest first: their records
        were accepted before any of ours."""
        try:
            found = await self.spool.adopt()
        except OSError as exc:
            self.last_error = f"spool: {describe(exc)}"
            found = []
        finally:
            self.adopting = False
        now = self.clock.now()
        adopted: list[Entry] = []
        for dead in found:
            self._adopted[dead.token] = _Adoption(dead.ack, {s.path for s in dead.segments})
            for seg in dead.segments:
                # A segment of no record holds end records only (one, as a rule).
                ends = int(seg.records == 0)
                # Only what its pipeline had not delivered: the lines at or below its ack were
                # counted delivered there, and are skipped by the replay.
                records = seg.records - dead.acked.get(seg.path, 0)
                adopted.append(
                    Entry(seg.first, seg.seq, records, now, None, seg, None, dead.token,
                          ends=ends)
                )
                self.disk += records
                self.ends_disk += ends
                self.adopted += records
        if adopted:
            logger.info(
                "async_tracker: replaying %d spooled segments of run %r into %s",
                len(adopted), self.run_id, self.name,
            )
            self.log.extendleft(reversed(adopted))
        self._signal_progress()

    async def _load(self, entry: Entry) -> None:
        """Reads a disk-only head back into memory, in its place."""
        assert entry.segment is not None
        segment = entry.segment
        result = await self.spool.read(segment)
        if result is None:
            self._lost(entry, entry.records, f"spool segment {segment.path.name} unreadable")
            self.log.popleft()
            self.disk -= entry.records
            self.ends_disk -= entry.ends
            self._left.pop(segment.path, None)
            self._signal_progress()
            return
        lines, _ = result
        if entry.lines is None:  # adopted: every line its dead pipeline had not acked
            ack = self._adopted[entry.token].ack if entry.token in self._adopted else -1
            picked = [(i, b) for i, b in enumerate(lines) if b is not None and b.seq > ack]
            # Acked lines the adoption did not leave out already (it counts them for the
            # segment the ack falls inside, when it can read it).
            acked = sum(b.records for b in lines if b is not None and b.seq <= ack)
            acked -= segment.records - entry.records
            self._left[segment.path] = len(picked)
        else:
            picked = [(i, lines[i]) for i in entry.lines if i < len(lines) and lines[i] is not None]  # type: ignore[misc]
            acked = 0
            self._left[segment.path] = self._left.get(segment.path, 0) - (
                len(entry.lines) - len(picked)
            )
        found = sum(b.records for _, b in picked if b is not None)
        self.adopted -= acked  # delivered by the dead pipeline: not ours to count
        damaged = entry.records - found - acked
        if damaged > 0:
            self._lost(entry, damaged, f"spool segment {segment.path.name} damaged")
        self.disk -= entry.records - found
        self.ends_disk += sum(b.end is not None for _, b in picked if b is not None) - entry.ends
        self.log.popleft()
        self.log.extendleft(
            Entry(b.first, b.seq, b.records, entry.since, b, segment, [i], entry.token,
                  ends=int(b.end is not None))
            for i, b in reversed(picked)
            if b is not None
        )
        if not picked and self._left.get(segment.path, 0) <= 0:
            await self._segment_done(segment, entry.token)
        self._signal_progress()

    def _lost(self, entry: Entry, records: int, why: str) -> None:
        self.dropped += records
        self.last_error = f"spool: {why}: {records} records lost"
        self.refused.append(self.last_error)
        logger.error(
            "async_tracker: run %r, backend %s: %s", self.run_id, self.name, self.last_error
        )

    def _spool_broken(self) -> bool:
        return self.clock.now() < self._spool_broken_until

    def _wants_spill(self) -> bool:
        if (self.memory == 0 and self.ends_memory == 0) or self._spool_broken():
            return False
        if self.durable or self.parked or self.overloaded:
            return True
        return self.overflow == "spool" and self.memory > self.memory_limit

    def _spill_run(self) -> list[Entry]:
        """The oldest run of consecutive memory-only entries that may go to disk, at most a
        segment's worth. The entry in flight stays (unless durable, where it never is
        memory-only); so do the parts of a split batch (their lines would not match)."""
        run: list[Entry] = []
        records = 0
        for entry in self.log:
            eligible = (
                entry.batch is not None
                and entry.segment is None
                and entry is not self._in_flight
                and not entry.part
                and id(entry) not in self._writing
            )
            if not eligible:
                if run:
                    break
                continue
            run.append(entry)
            records += entry.records
            if records >= self.segment_records:
                break
        return run

    async def _spill_forever(self) -> None:
        while True:
            await self._spill.wait()
            self._spill = anyio.Event()
            while self._wants_spill() and (run := self._spill_run()):
                if not await self._write(run):
                    break

    async def _write(self, run: list[Entry]) -> bool:
        """Writes ``run`` to a new segment; then its entries are on disk, and unless the lane
        writes ahead for durability alone, their memory copies go. False if the disk failed."""
        batches = [e.batch for e in run if e.batch is not None]
        self._writing.update(id(e) for e in run)
        self._idle = anyio.Event()
        try:
            segment = await self.spool.write(batches)
        except Exception as exc:
            # A full or broken disk: the records stay in memory (pending) and are delivered
            # from there; writes to disk are tried again after a cooldown.
            self.last_error = f"spool: {describe(exc)}"
            self._spool_failing = True
            self._spool_broken_until = self.clock.now() + self.policy.cooldown_s
            logger.error("async_tracker: spooling for %s failed: %s", self.name, self.last_error)
            self._written.set()
            self._written = anyio.Event()
            return False
        finally:
            self._writing.difference_update(id(e) for e in run)
            self._idle.set()
        self._spool_failing = False
        # All still in the log: the deliverer waits for an entry being written, and the one
        # in flight is never part of a run.
        for i, entry in enumerate(run):
            entry.segment = segment
            entry.lines = [i]
            self.memory -= entry.records
            self.disk += entry.records
            self.ends_memory -= entry.ends
            self.ends_disk += entry.ends
        self._left[segment.path] = len(run)
        if not self.durable or self.parked or self.overloaded or self.memory > self.memory_limit:
            self._evict(segment)
        self._written.set()
        self._written = anyio.Event()
        return True

    def _evict(self, segment: Segment) -> None:
        """Drops the memory copies of ``segment``'s entries (but the one in flight): they are
        now one disk-only entry, in the same place of the log."""
        out: deque[Entry] = deque()
        for entry in self.log:
            if entry.segment is segment and entry is not self._in_flight and not entry.part:
                prev = out[-1] if out else None
                if prev is not None and prev.batch is None and prev.segment is segment:
                    prev.seq = entry.seq
                    prev.records += entry.records
                    prev.ends += entry.ends
                    assert prev.lines is not None and entry.lines is not None
                    prev.lines.extend(entry.lines)
                    continue
                entry.batch = None
            out.append(entry)
        self.log = out

    def _shed(self) -> None:
        """drop_oldest: drops the metrics of the oldest batches in memory until the lane is
        back within its bound. The head (maybe half written) and batches on disk are kept."""
        for entry in list(self.log)[1:]:
            if self.memory <= self.memory_limit:
                break
            batch = entry.batch
            if batch is None or entry.segment is not None or not batch.points():
                continue
            n = batch.points()
            batch.metrics = []  # this lane's copy: the list itself is shared
            batch.records -= n
            entry.records -= n
            self.memory -= n
            self.shed += n
            self.dropped += n

    # -- close ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stops delivery for good (a write hung in a worker thread is left behind). The
        spiller goes on until :meth:`spool_leftovers`: a segment it is writing must finish
        (cancelled, the file could still appear, and its records be written twice)."""
        self.bind()
        self._deliver_scope.cancel()

    async def spool_leftovers(self) -> None:
        """After :meth:`stop`: writes what is still in memory only to disk, each run of
        consecutive entries to its own segment, so that a replay keeps the order."""
        try:
            while not self._idle.is_set():  # the spiller may have begun another write since
                await self._idle.wait()
        finally:
            self._scope.cancel()
        if self._running:
            # Cancelling is not stopping: anyio delivers a cancellation at a task's next
            # wait, so a deliverer whose write has just returned still takes one step, and
            # completes that batch. Only once both tasks are over is what is in memory ours;
            # read sooner, a batch would be both delivered and spooled (counted twice, and
            # sent again by the next start).
            await self._ended.wait()
        runs: list[list[Entry]] = []
        current: list[Entry] = []
        for entry in self.log:
            if entry.batch is not None and entry.segment is None:
                current.append(entry)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        for run in runs:
            batches = [e.batch for e in run if e.batch is not None]
            try:
                segment = await self.spool.write(batches)
            except Exception as exc:
                self.last_error = f"spool: {describe(exc)}"
                self._spool_failing = True
                logger.error("async_tracker: cannot spool %s: %s", self.name, self.last_error)
                return
            for i, entry in enumerate(run):
                entry.segment = segment
                entry.lines = [i]
                self.memory -= entry.records
                self.disk += entry.records
                self.ends_memory -= entry.ends
                self.ends_disk += entry.ends

    async def release(self) -> None:
        """Gives up this pipeline's hold on the spool: our lock (and our ack, if nothing of
        ours is left on disk), and the dead pipelines' we adopted, whose files stay for the
        next start."""
        await self.spool.forget(self.spool.token)
        for token in list(self._adopted):
            await self.spool.forget(token)
