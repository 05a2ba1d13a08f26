"""The ordered log of one backend's batches of one run, in two tiers: memory, then disk.

A :class:`BatchLog` holds every batch its backend has not finished with, oldest first. Each
entry is in memory, on disk in the spool, or both (``durable=True`` writes every batch
ahead):

    entries: [ adopted segment | batch (in flight) | batch | segment (2 batches) | batch ... ]
               a dead pipeline's  memory              memory  disk                  memory

Its reader (a lane, :mod:`async_tracker.pipeline.lane`) always takes the head; an entry on
disk only is read back in its place (:meth:`BatchLog.load`). So the tier of an entry never
changes its turn: an overload, a backend outage or a close moves records between memory and
disk, never their order.

The log has one task of its own, the spiller (:meth:`BatchLog.spill_forever`), on the tracker
loop beside its reader, so that a backend hung in a write never keeps records from reaching
the disk: it writes runs of memory entries to new segments: ahead of delivery when durable,
with a failing backend (:attr:`BatchLog.paused`), or past the memory bound (then it drops
the memory copy). When the reader is done with the head (:meth:`BatchLog.complete`), the ack
(the head's ``seq``) is persisted when the entry is on disk, and segments no longer needed
are removed.

Counters, in records: every record put in the log is in exactly one of ``memory`` (not on
disk) and ``disk`` (on disk) until :meth:`~BatchLog.complete` takes it out (its reader counts
it delivered or dropped) or a damaged segment loses it (``on_lost``). Errors of the spool are
told to ``on_error`` (the reader's last error) as they happen.

At a close (see :meth:`BatchLog.begin_close`), writes to disk go in slices of at most
``CLOSE_SLICE_RECORDS`` records, each started only if it fits before the close's end at the
rate this log's writes have shown, so that no write on the loop's thread runs much past a
deadline. Each write takes effect at one commit point (:class:`~async_tracker.spool.store.Commit`):
a write the close gives up (its deadline, or :meth:`BatchLog.fence`) either took effect, and
its records are counted on disk, or never will, and they are counted where they are. So when
a close has its report, the disk holds exactly what the report says.

Everything here runs on the tracker loop; other threads only read counters, but for
:meth:`BatchLog.fence`, which a ``close()`` whose caller stopped waiting for a stuck loop
calls from its own thread, under the run's ledger lock (the lock every move of records
between the counters takes).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from async_tracker.clock import Clock
from async_tracker.errors import describe
from async_tracker.records import Batch
from async_tracker.settings import (
    CLOSE_SLICE_RECORDS,
    DEFAULT_SPOOL_S_PER_RECORD,
    OverflowPolicy,
)
from async_tracker.spool.io import wait_released
from async_tracker.spool.store import Abandoned, Adopted, Commit, Segment, Spool

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Entry:
    """A stretch of the log: one batch (in memory, and maybe on disk), or lines of one
    segment on disk only."""

    first: int
    seq: int
    records: int
    since: float  # when it joined the log (for the lag)
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


def _ignore_error(message: str) -> None:
    pass


def _ignore_lost(records: int, message: str) -> None:
    pass


class BatchLog:
    """One backend's ordered log of one run's batches, in memory and in ``spool``."""

    def __init__(
        self,
        spool: Spool,
        clock: Clock,
        *,
        durable: bool = False,
        memory_limit: int = 500_000,
        overflow: OverflowPolicy = "spool",
        segment_records: int = 500_000,
        cooldown_s: float = 30.0,
        run_id: str = "",
        name: str = "",
        on_error: Callable[[str], None] = _ignore_error,
        on_lost: Callable[[int, str], None] = _ignore_lost,
        ledger: AbstractContextManager[object] | None = None,
    ) -> None:
        self.spool = spool
        self.clock = clock
        self.durable = durable
        self.memory_limit = memory_limit
        self.overflow = overflow
        self.segment_records = segment_records
        self.cooldown_s = cooldown_s  # how long writes to disk wait after the disk failed
        self.run_id = run_id  # for messages
        self.name = name  # for messages: the backend's
        # Spool errors as they happen (the reader's last error), and records a damaged
        # segment lost (counted dropped by the reader, and named).
        self.on_error = on_error
        self.on_lost = on_lost
        self.entries: deque[Entry] = deque()
        # Counters, in records. Every record put in the log is in exactly one of: memory (not
        # on disk), disk (undelivered, on disk), or out of the log (complete() or lost).
        self.memory = 0
        self.disk = 0
        # End records (see Batch.end), apart from the records: in memory only, and on disk.
        self.ends_memory = 0
        self.ends_disk = 0
        self.adopted = 0  # records of dead pipelines taken over (counted in the others)
        self.acked = -1  # our own high-water mark (in memory)
        self.adopting = True  # the dead pipelines' segments are not in the log yet
        # Set by the reader: the entry it is writing (never evicted, never spilled unless
        # durable), and whether it paused after a failed round (then the head, no longer in
        # flight, and what waits behind it go to disk).
        self.in_flight: Entry | None = None
        self.paused = False
        self.overloaded = False  # the run asks for memory to go to disk
        self.spool_failing = False  # the last write to disk failed
        self._writing: set[int] = set()  # ids of entries the spiller is writing now
        self._left: dict[Path, int] = {}  # lines of a segment not done yet
        self._adopted: dict[str, _Adoption] = {}
        self._spool_broken_until = -1.0
        self._spiller_dead = False
        self._bound = False
        # The run's ledger lock (its pipeline's; a lock of its own for a log used alone):
        # every move of records between the counters below and the reader's (delivered,
        # dropped) happens under it, so that fence(), from another thread, reads them whole.
        self.ledger: AbstractContextManager[object] = (
            ledger if ledger is not None else threading.RLock()
        )
        # Closing (see begin_close): the end of the close (time.monotonic(), this clock's),
        # by which every write to disk must be over; writes then go in slices.
        self.closing_until: float | None = None
        # The close wants what waits in memory on disk now (the time left is about what
        # writing it takes): the spiller writes what waits behind the head.
        self.close_spill = False
        # The close stopped the spiller: it starts no new write (the one under way ends).
        self.spill_stopped = False
        # Set by fence(): the close has its report; nothing here moves records any more.
        self.fenced = False
        # Records (and end records) of writes that took effect when fence() gave them up,
        # and that the loop had not counted on disk yet: on disk for status() from then on.
        self.fenced_disk = (0, 0)
        # The writes to disk under way, each with its entries and segment: fence() gives
        # them up, or counts what took effect.
        self._open: dict[Commit, tuple[list[Entry], Segment]] = {}
        # Seconds a write to disk takes per record, as this log's writes have shown (encoding
        # on the loop and the write on the spool thread, GIL waits included).
        self.s_per_record = DEFAULT_SPOOL_S_PER_RECORD

    def bind(self) -> None:
        """Creates the log's anyio objects on the loop (a log is built on the caller's
        thread, before the loop first sees it)."""
        if not self._bound:
            self._spill = anyio.Event()
            self._written = anyio.Event()
            self._idle = anyio.Event()  # the spiller is not writing
            self._idle.set()
            self._bound = True

    # -- the reader's side ----------------------------------------------------------------------
    def head(self) -> Entry | None:
        return self.entries[0] if self.entries else None

    def put(self, batch: Batch) -> None:
        """Appends a batch (not empty) to the log, in memory."""
        self.bind()
        ends = int(batch.end is not None)
        self.entries.append(
            Entry(batch.first, batch.seq, batch.records, self.clock.now(), batch, ends=ends)
        )
        self.memory += batch.records
        self.ends_memory += ends

    def set_overloaded(self, overloaded: bool) -> None:
        """The run asks for (or releases) memory: while overloaded, what the log holds goes
        to disk."""
        self.bind()
        if overloaded != self.overloaded:
            self.overloaded = overloaded
            if overloaded:
                self._spill.set()

    def set_paused(self, paused: bool) -> None:
        """The reader paused after a failed round (or resumed): while paused, the head (no
        longer in flight) and what waits behind it go to disk."""
        self.bind()
        self.paused = paused
        if paused:
            self.spill_soon()

    def spill_soon(self) -> None:
        """Wakes the spiller if there is something it should write now."""
        self.bind()
        if self._wants_spill():
            self._spill.set()

    def is_writing(self, entry: Entry) -> bool:
        """Whether the spiller is writing ``entry`` to disk now."""
        return id(entry) in self._writing

    def needs_write_ahead(self, entry: Entry) -> bool:
        """Whether ``entry`` must reach the disk before it is delivered (durable)."""
        return (
            self.durable
            and entry.segment is None
            and not entry.part  # split while the disk failed: delivered from memory
            and not self._spool_broken()
            and not self._spiller_dead
        )

    def write_ahead(self) -> None:
        """Asks the spiller to log what is in memory now (the reader then waits for
        :meth:`wait_written`)."""
        self.bind()
        self._spill.set()

    async def wait_written(self) -> None:
        """Until the spiller's next write ends (or fails, or the spiller dies)."""
        self.bind()
        await self._written.wait()

    async def complete(self, entry: Entry) -> None:
        """The head is done: :meth:`settle` its place on disk, then :meth:`take_out` (the
        reader counts it delivered or dropped with that, under the ledger)."""
        await self.settle(entry)
        with self.ledger:
            self.take_out(entry)

    async def settle(self, entry: Entry) -> None:
        """The head is done: persist the ack if it was on disk and remove segments no longer
        needed (a flush that then sees the reader's count finds the disk tidied). Not once
        fenced: the close's report counts the entry on disk, and on disk it stays."""
        if entry.last:
            if entry.token is None:
                self.acked = max(self.acked, entry.seq)
            if entry.segment is not None and not self.fenced:
                await self._line_done(entry.segment, entry.token, entry.seq, len(entry.lines or ()))

    def take_out(self, entry: Entry) -> None:
        """Takes the settled head out of the log and its counters. Under the ledger, with
        the reader's own count of it: the two move as one."""
        if self.fenced:
            return  # the report is made: the head stays counted where it was
        self.entries.popleft()
        if entry.segment is None:
            self.memory -= entry.records
            self.ends_memory -= entry.ends
        else:
            self.disk -= entry.records
            self.ends_disk -= entry.ends
        if not self.entries:
            self.spool_failing = False  # a failed spool write holds nothing back any more

    def split_head(self, parts: Sequence[Batch]) -> None:
        """The head's batch is replaced by ``parts`` (in order, covering the same records)."""
        entry = self.entries.popleft()
        # The parts take the head's place; only the last one completes the batch (its ack
        # and its line), so a crash in between re-sends the batch, never skips it.
        for i, part in enumerate(reversed(parts)):
            self.entries.appendleft(
                Entry(
                    part.first, part.seq, part.records, entry.since, part,
                    entry.segment, entry.lines, entry.token, last=entry.last and i == 0,
                    part=True, ends=int(part.end is not None),
                )
            )

    def shed(self) -> int:
        """drop_oldest: drops the metrics of the oldest batches in memory until the log is
        back within its bound. The head (maybe half written) and batches on disk are kept.
        Returns the points dropped."""
        shed = 0
        for entry in list(self.entries)[1:]:
            if self.memory <= self.memory_limit:
                break
            batch = entry.batch
            if batch is None or entry.segment is not None or not batch.points():
                continue
            n = batch.points()
            batch.metrics = []  # this log's copy: the list itself is shared
            batch.records -= n
            entry.records -= n
            self.memory -= n
            shed += n
        return shed

    def adopted_tokens(self) -> list[str]:
        """The dead pipelines whose segments this log took over (and still holds)."""
        return list(self._adopted)

    async def _line_done(self, segment: Segment, token: str | None, seq: int, lines: int) -> None:
        try:
            await self.spool.ack(token or self.spool.token, seq)
        except OSError as exc:
            # Delivered all the same; without the ack a crash would replay the line (a
            # duplicate for backends that are not idempotent, never a loss).
            self._spool_error("ack", exc)
        if self.fenced:
            return  # the files are another pipeline's to take over now
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
        message = f"spool {what}: {describe(exc)}"
        self.on_error(message)
        logger.warning(
            "async_tracker: spool of run %r, backend %s: %s", self.run_id, self.name, message,
        )

    # -- disk -----------------------------------------------------------------------------------
    async def adopt(self) -> None:
        """Puts what dead pipelines left at the head of the log, oldest first: their records
        were accepted before any of ours."""
        try:
            found = await self.spool.adopt()
        except OSError as exc:
            self.on_error(f"spool: {describe(exc)}")
            found = []
        finally:
            self.adopting = False
        now = self.clock.now()
        adopted: list[Entry] = []
        with self.ledger:
            self._take_over(found, now, adopted)
        if adopted:
            logger.info(
                "async_tracker: replaying %d spooled segments of run %r into %s",
                len(adopted), self.run_id, self.name,
            )

    def _take_over(self, found: list[Adopted], now: float, adopted: list[Entry]) -> None:
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
        self.entries.extendleft(reversed(adopted))

    async def load(self, entry: Entry) -> None:
        """Reads a disk-only head back into memory, in its place."""
        assert entry.segment is not None
        segment = entry.segment
        result = await self.spool.read(segment)
        if self.fenced:
            return
        if result is None:
            with self.ledger:
                self._lost(entry.records, f"spool segment {segment.path.name} unreadable")
                self.entries.popleft()
                self.disk -= entry.records
                self.ends_disk -= entry.ends
            self._left.pop(segment.path, None)
            return
        with self.ledger:
            done = self._read_back(entry, segment, result[0])
        if done:
            await self._segment_done(segment, entry.token)

    def _read_back(self, entry: Entry, segment: Segment, lines: list[Batch | None]) -> bool:
        """The lines read back take ``entry``'s place; True if none is left to deliver."""
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
            self._lost(damaged, f"spool segment {segment.path.name} damaged")
        self.disk -= entry.records - found
        self.ends_disk += sum(b.end is not None for _, b in picked if b is not None) - entry.ends
        self.entries.popleft()
        self.entries.extendleft(
            Entry(b.first, b.seq, b.records, entry.since, b, segment, [i], entry.token,
                  ends=int(b.end is not None))
            for i, b in reversed(picked)
            if b is not None
        )
        return not picked and self._left.get(segment.path, 0) <= 0

    def _lost(self, records: int, why: str) -> None:
        message = f"spool: {why}: {records} records lost"
        self.on_lost(records, message)
        logger.error("async_tracker: run %r, backend %s: %s", self.run_id, self.name, message)

    def _spool_broken(self) -> bool:
        return self.clock.now() < self._spool_broken_until

    def _wants_spill(self) -> bool:
        if (self.memory == 0 and self.ends_memory == 0) or self._spool_broken():
            return False
        if self.fenced or self.spill_stopped:
            return False
        if self.durable or self.paused or self.overloaded or self.close_spill:
            return True
        return self.overflow == "spool" and self.memory > self.memory_limit

    def _spill_run(self) -> list[Entry]:
        """The oldest run of consecutive memory-only entries that may go to disk, at most a
        segment's worth. The entry in flight stays (unless durable, where it never is
        memory-only); so do the parts of a split batch (their lines would not match)."""
        run: list[Entry] = []
        records = 0
        most = self.segment_records
        if self.closing_until is not None:
            most = min(most, CLOSE_SLICE_RECORDS)  # closing: no long write on the loop
        for entry in self.entries:
            eligible = (
                entry.batch is not None
                and entry.segment is None
                and entry is not self.in_flight
                and not entry.part
                and id(entry) not in self._writing
            )
            if not eligible:
                if run:
                    break
                continue
            run.append(entry)
            records += entry.records
            if records >= most:
                break
        return run

    async def spill_forever(self) -> None:
        """The spiller: a task of its own beside the reader (a backend hung in a write never
        keeps records from reaching the disk)."""
        self.bind()
        while True:
            await self._spill.wait()
            self._spill = anyio.Event()
            while self._wants_spill() and (run := self._spill_run()):
                if not await self._write(run):
                    break

    def spiller_died(self) -> None:
        """The spiller's task died: the reader no longer waits for it."""
        self.bind()
        self._spiller_dead = True
        self._written.set()

    async def _write(self, run: list[Entry]) -> bool:
        """Writes ``run`` to a new segment; then its entries are on disk, and unless the log
        keeps a copy in memory (durable, or a close that still delivers), their memory copies
        go. False if the disk failed, or the write was given up.

        Cancelled (a close's deadline), the write is given up at its commit point: either it
        took effect, and its entries are counted on disk all the same, or its file never
        appears, and they stay in memory. Never both, never neither."""
        batches = [e.batch for e in run if e.batch is not None]
        commit = Commit()
        segment = self.spool.segment_for(batches)
        with self.ledger:
            # Registered before the spool thread can commit it, and not at all once fenced:
            # fence() either finds it here (and gives it up) or it never starts.
            if self.fenced:
                return False
            self._open[commit] = (run, segment)
        self._writing.update(id(e) for e in run)
        self._idle = anyio.Event()
        records = sum(e.records for e in run)
        started = self.clock.now()
        try:
            await self.spool.write(batches, commit, segment)
        except Exception as exc:
            if isinstance(exc, Abandoned) or self.fenced:
                return False  # given up by fence(): nothing of it is on disk
            # A full or broken disk: the records stay in memory (pending) and are delivered
            # from there; writes to disk are tried again after a cooldown.
            message = f"spool: {describe(exc)}"
            self.on_error(message)
            self.spool_failing = True
            self._spool_broken_until = self.clock.now() + self.cooldown_s
            logger.error("async_tracker: spooling for %s failed: %s", self.name, message)
            self._written.set()
            self._written = anyio.Event()
            return False
        except BaseException:
            # Cancelled: a close stops waiting. Whatever the spool thread does next, the
            # commit point says where the records are.
            if not commit.abandon():
                self._on_disk(commit, run, segment)
            raise
        else:
            # Counted before the write leaves _open (finally): fence() finds it either here,
            # or counted already.
            self._on_disk(commit, run, segment)
        finally:
            self._open.pop(commit, None)
            self._writing.difference_update(id(e) for e in run)
            self._idle.set()
        if records:
            # The rate of this log's writes, smoothed: what a close expects the next to take.
            took = max(0.0, self.clock.now() - started) / records
            self.s_per_record = 0.7 * self.s_per_record + 0.3 * took
        if self.fenced:
            return False
        keep = self.durable or self.close_spill
        if not keep or self.paused or self.overloaded or self.memory > self.memory_limit:
            self._evict(segment)
        self._written.set()
        self._written = anyio.Event()
        return True

    def _on_disk(self, commit: Commit, run: list[Entry], segment: Segment) -> None:
        """A write took effect: its entries are on disk. Counted once, by the loop or by
        fence(), whichever comes first (under the ledger)."""
        with self.ledger:
            if not commit.apply():
                return
            self.spool_failing = False
            # All still in the log: the reader waits for an entry being written, and the one
            # in flight is never part of a run.
            for i, entry in enumerate(run):
                entry.segment = segment
                entry.lines = [i]
                self.memory -= entry.records
                self.disk += entry.records
                self.ends_memory -= entry.ends
                self.ends_disk += entry.ends
            self._left[segment.path] = len(run)

    def _evict(self, segment: Segment) -> None:
        """Drops the memory copies of ``segment``'s entries (but the one in flight): they are
        now one disk-only entry, in the same place of the log."""
        out: deque[Entry] = deque()
        for entry in self.entries:
            if entry.segment is segment and entry is not self.in_flight and not entry.part:
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
        self.entries = out

    # -- close ----------------------------------------------------------------------------------
    def begin_close(self, until: float) -> None:
        """A close is under way, to end by ``until``: writes to disk go in slices from now
        on (see :data:`~async_tracker.settings.CLOSE_SLICE_RECORDS`). Called again when a
        SIGTERM moves the close's end."""
        self.closing_until = until

    def spool_need_s(self) -> float:
        """Seconds writing what waits in memory only would take, at this log's rate."""
        return self.memory * self.s_per_record

    def spill_now(self) -> None:
        """The close wants what waits in memory on disk from now on (while the head is
        still being delivered): the time left is about what writing it takes."""
        self.bind()
        if not self.close_spill:
            self.close_spill = True
            self.spill_soon()

    def stop_spilling(self) -> None:
        """The spiller starts no new write (the one under way ends; see :meth:`wait_idle`)."""
        self.spill_stopped = True

    async def wait_idle(self) -> None:
        """Until the spiller is not writing."""
        self.bind()
        while not self._idle.is_set():  # the spiller may have begun another write since
            await self._idle.wait()

    def leftovers(self, until: float = math.inf) -> Iterator[list[Entry]]:
        """What is still in memory only, in slices of consecutive entries of at most
        ``CLOSE_SLICE_RECORDS`` records, each slice one segment (a replay keeps the order).
        If writing them all should not end by ``until``, the end record's entry comes first,
        alone: one short line, it is written even when the time runs out for the records
        before it (a replay still sends it last: segments replay in the order of their first
        record)."""
        waiting = [e for e in self.entries if e.batch is not None and e.segment is None]
        end = waiting[-1] if waiting and waiting[-1].ends and not waiting[-1].records else None
        if end is not None and self.fits(waiting, until):
            end = None  # all of it should fit: in order, the end record in the last slice
        if end is not None:
            yield [end]
        current: list[Entry] = []
        records = 0
        for entry in self.entries:
            if entry.batch is None or entry.segment is not None or entry is end:
                if current:
                    yield current  # a run of memory entries ends: its own segments
                current, records = [], 0
                continue
            if current and records + entry.records > CLOSE_SLICE_RECORDS:
                yield current
                current, records = [], 0
            current.append(entry)
            records += entry.records
        if current:
            yield current

    def fits(self, run: list[Entry], until: float) -> bool:
        """Whether writing ``run`` should end by ``until`` at this log's rate."""
        records = sum(e.records for e in run)
        return self.clock.now() + records * self.s_per_record <= until

    async def write_leftover(self, run: list[Entry]) -> bool:
        """Writes one slice of :meth:`leftovers` (the reader and the spiller have stopped).
        False if the disk failed: the rest stays in memory."""
        if self.fenced or self._spool_broken():
            return False
        return await self._write(run)

    async def spill_leftovers(self, until: float = math.inf) -> None:
        """Once neither the reader nor the spiller runs: writes what is still in memory only
        to disk, a slice at a time (see :meth:`leftovers`), each only if it fits before
        ``until``; what does not stays in memory."""
        for run in list(self.leftovers(until)):
            if not self.fits(run, until) or not await self.write_leftover(run):
                return

    def fence(self) -> None:
        """The close has its report (made by a caller that stopped waiting for a stuck
        loop): from now on nothing here moves records. Each write to disk under way is given
        up at its commit point; one that took effect already is counted on disk now (in
        :attr:`fenced_disk`: the loop, if it ever runs again, moves nothing). From the
        caller's thread, under the ledger."""
        self.fenced = True
        records = ends = 0
        for commit, (run, _) in list(self._open.items()):
            if not commit.abandon() and commit.apply():
                records += sum(e.records for e in run)
                ends += sum(e.ends for e in run)
        self.fenced_disk = (records, ends)

    def memory_count(self) -> tuple[int, int]:
        """Records and end records in memory only, as a report counts them."""
        return self.memory - self.fenced_disk[0], self.ends_memory - self.fenced_disk[1]

    def disk_count(self) -> tuple[int, int]:
        """Records and end records on disk, as a report counts them."""
        return self.disk + self.fenced_disk[0], self.ends_disk + self.fenced_disk[1]

    async def release(self) -> None:
        """Gives up this pipeline's hold on the spool: our lock (and our ack, if nothing of
        ours is left on disk), and the dead pipelines' we adopted, whose files stay for the
        next start: a run reopened in this process, or the next process. A job of the spool
        thread that runs even if this wait is cancelled."""
        await wait_released(self.release_now())

    def release_now(self) -> concurrent.futures.Future[None]:
        """:meth:`release` handed to the spool thread without waiting, from any thread
        (fence() calls it from the caller's); the future says when it ran."""
        return self.spool.release([self.spool.token, *list(self._adopted)])
