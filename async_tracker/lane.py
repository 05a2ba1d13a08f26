"""A lane: ordered delivery of one run's batches to one backend, with its own retries,
health, counters and spool.

Batches live in memory (``queue``) or on local disk (the spool), and memory always holds the
older ones: once a lane starts spilling to disk, every new batch goes to disk too until the
disk is drained. A lane spills when

* its backend failed past the retry budget (the batch being retried stays in memory; the
  rest go to disk),
* it holds more than ``max_buffered`` records in memory (a stalled backend), or its run is
  overloaded (``put(batch, spill=True)``), unless the run's overflow policy says otherwise:
  ``drop_oldest`` drops the metrics of its oldest queued batches instead, ``block`` leaves
  it to the caller to wait,
* the run's overflow (see :class:`~async_tracker.buffer.Overflow`) hands it lines already
  encoded for the spool (``put_encoded``).

With ``durable=True`` every batch is also written to disk before it is delivered (a
write-ahead log): it is then delivered from memory, and its segment removed once delivered.

Two tasks per lane, both on the tracker loop: the deliverer, and the spool writer, so that a
backend hung in a write can never stop records from reaching the disk.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path

import anyio

from async_tracker.base import AsyncTrackerBase
from async_tracker.errors import is_transient
from async_tracker.records import Batch
from async_tracker.report import BackendStatus
from async_tracker.retry import RetryPolicy, retry_call
from async_tracker.settings import OverflowPolicy
from async_tracker.spool import Encoded, Spool, decode_batch, is_adopted

logger = logging.getLogger(__name__)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def as_batch(item: Batch | Encoded) -> Batch:
    return decode_batch(item.line) if isinstance(item, Encoded) else item


class Lane:
    """Delivery of one run's batches to one backend."""

    def __init__(
        self,
        run_id: str,
        name: str,
        backend: AsyncTrackerBase,
        policy: RetryPolicy,
        *,
        max_buffered: int,
        spool: Spool,
        durable: bool = False,
        overflow: OverflowPolicy = "spool",
    ) -> None:
        self.run_id = run_id
        self.name = name
        self.backend = backend
        self.policy = policy
        self.max_buffered = max_buffered
        self.spool = spool
        self.durable = durable
        self.overflow = overflow
        self.takes_metrics = backend.supports_metrics
        self.queue: deque[tuple[Batch, float]] = deque()  # (batch, monotonic time queued)
        self.in_flight = 0  # records in memory: queued, being written, or waiting for disk
        self.spooled = 0  # records on disk, not yet delivered
        self.delivered = 0
        self.dropped = 0
        self.shed = 0  # metrics dropped by the drop_oldest policy (also counted in dropped)
        self.retries = 0
        self.last_error: str | None = None
        self.healthy = True
        # Parked: the retry budget ran out; the lane waits for its cooldown or a kick from
        # flush()/close() before trying again.
        self.parked = False
        self.spilling = False
        self._to_spool: list[Batch | Encoded] = []
        # Write-ahead log (durable): the segment of each logged batch held in memory, and how
        # many batches of each such segment are still undelivered.
        self._wal_segment: dict[int, Path] = {}
        self._wal_left: dict[Path, int] = {}
        self._replay: deque[Path] = deque()  # sealed segments, oldest first
        self._replay_batches: deque[Batch] | None = None  # what is left of _replay[0]
        self._oldest_on_disk: float | None = None
        # Until the lane has looked for segments an earlier process left, it is not settled:
        # a flush() must wait for their replay.
        self._adopting = True
        self._spool_broken_until = 0.0  # after a spool write failed: keep records in memory
        self._bound = False

    def bind(self) -> None:
        """Creates the lane's anyio objects; they belong to the loop, so this runs on it
        (lanes are built on the caller's thread, before the loop first sees them)."""
        if not self._bound:
            self._work = anyio.Event()
            self._kick = anyio.Event()
            self._progress = anyio.Event()
            self._spool_work = anyio.Event()
            self._scope = anyio.CancelScope()
            self._bound = True

    # -- called on the loop by RunFlusher ---------------------------------------------------
    def put(self, batch: Batch, spill: bool = False) -> None:
        """Queues a batch; ``spill``: the run is over its memory bound, so the batch goes to
        disk (and the lane spills from now on, as when it is over the bound itself)."""
        self.bind()
        mine = batch.for_lane()
        if not self.takes_metrics and mine.metrics:
            mine.records -= len(mine.metrics)
            mine.metrics = []
        if mine.is_empty():
            return
        self.in_flight += mine.records
        if self.in_flight > self.max_buffered and self.overflow == "drop_oldest":
            self._shed()
        if (
            not self.spilling
            and (self.in_flight > self.max_buffered or spill)
            and self.overflow == "spool"
            and time.monotonic() >= self._spool_broken_until
        ):
            logger.info(
                "async_tracker: backend %s of run %r holds %d records; spooling to %s",
                self.name, self.run_id, self.in_flight, self.spool.path,
            )
            self.spilling = True
        if self.spilling or self.durable:
            self._to_spool.append(mine)
            self._spool_work.set()
        else:
            self.queue.append((mine, time.monotonic()))
        self._work.set()

    def put_encoded(self, encoded: Encoded) -> None:
        """Takes records of the run's overflow: they go to disk, and what comes after them
        too, until the disk is drained (the order of delivery is the order of the calls)."""
        self.bind()
        self.in_flight += encoded.records
        self.spilling = True
        self._to_spool.append(encoded)
        self._spool_work.set()
        self._work.set()

    def _shed(self) -> None:
        """drop_oldest: drops the metrics of the oldest queued batches until the lane is
        back within ``max_buffered``. The head may be half written; it is kept."""
        for batch, _ in list(self.queue)[1:]:
            if self.in_flight <= self.max_buffered:
                break
            n = len(batch.metrics)
            if n and id(batch) not in self._wal_segment:
                batch.metrics = []  # this lane's copy: the list itself is shared
                batch.records -= n
                self.in_flight -= n
                self.shed += n
                self.dropped += n
        # Batches emptied of everything are skipped by the deliverer at no cost.

    def kick(self) -> None:
        """Retry a parked batch now (flush and close want their answer now, not later)."""
        self.bind()
        if self.parked:
            self.parked = False
            self._kick.set()

    def settled(self) -> bool:
        """Nothing left to try now: all delivered, or parked until the backend is back."""
        return self.parked or (
            self.in_flight == 0 and not self._adopting and not self.spilling_pending()
        )

    def spilling_pending(self) -> bool:
        return self.spilling and (self.spooled > 0 or bool(self._replay))

    async def wait_progress(self) -> None:
        self.bind()
        await self._progress.wait()

    def abandon(self) -> None:
        """Stops the lane's tasks for good; a write hung in a worker thread is left behind."""
        self.bind()
        self._scope.cancel()

    async def spool_leftovers(self) -> None:
        """After ``abandon()``: moves what is still in memory to disk (close's last step)."""
        logged = [b for b, _ in self.queue if id(b) in self._wal_segment]  # already on disk
        batches = [b for b, _ in self.queue if id(b) not in self._wal_segment] + self._to_spool
        if batches:
            try:
                await self.spool.append(batches)
            except OSError as exc:
                self.last_error = f"spool: {describe(exc)}"
                logger.error("async_tracker: cannot spool %s: %s", self.name, self.last_error)
                return
        n = sum(b.records for b in batches + logged)
        self.queue.clear()
        self._to_spool = []
        self.in_flight -= n
        self.spooled += n

    def status(self, buffered: int) -> BackendStatus:
        now = time.monotonic()
        oldest = [t for t in (self._oldest_on_disk,) if t is not None]
        try:
            oldest.append(self.queue[0][1])
        except IndexError:  # empty, or emptied by the loop while we looked
            pass
        return BackendStatus(
            name=self.name,
            buffered=buffered,
            in_flight=self.in_flight,
            spooled=self.spooled,
            delivered=self.delivered,
            dropped=self.dropped,
            retries=self.retries,
            last_error=self.last_error,
            lag_s=now - min(oldest) if oldest else 0.0,
            healthy=self.healthy,
            spool_path=self.spool.path,
            shed=self.shed,
        )

    # -- the tasks ------------------------------------------------------------------------------
    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()

    def _on_retry(self, exc: BaseException) -> None:
        self.retries += 1
        self.last_error = describe(exc)

    async def run(self) -> None:
        """The lane's two tasks, until ``abandon()``."""
        self.bind()
        with self._scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_spool)
                await self._adopt_earlier_segments()
                await self._deliver_forever()

    async def _adopt_earlier_segments(self) -> None:
        """Segments left by a process that died or closed on a deadline: replayed first."""
        try:
            segments = await self.spool.take()
        except OSError as exc:
            self.last_error = f"spool: {describe(exc)}"
            segments = []
        finally:
            self._adopting = False
        if segments:
            logger.info(
                "async_tracker: replaying %d spooled segments of run %r into %s",
                len(segments), self.run_id, self.name,
            )
            self.spilling = True
            self._replay.extend(segments)
            self._oldest_on_disk = time.monotonic()

    def _next_write(self) -> list[Batch | Encoded]:
        """The oldest batches waiting for disk, up to a segment's worth of records."""
        out: list[Batch | Encoded] = []
        n = 0
        for b in self._to_spool:
            out.append(b)
            n += b.records
            if n >= self.spool.segment_records:
                break
        return out

    async def _write_spool(self) -> None:
        while True:
            await self._spool_work.wait()
            self._spool_work = anyio.Event()
            while self._to_spool:
                # Removed from _to_spool only once on disk: if close() cancels us mid-write,
                # spool_leftovers() still finds them (a torn line is skipped on replay).
                batches = self._next_write()
                try:
                    # A segment of its own per write-ahead write: its batches are then either
                    # all in memory or all left on disk, never split.
                    segment = await self.spool.append(batches, new_segment=self.durable)
                except OSError as exc:
                    # A full disk: the records stay in memory and count as pending; the
                    # training loop is never told by an exception, status() says it.
                    self.last_error = f"spool: {describe(exc)}"
                    self.healthy = False
                    logger.error("async_tracker: spooling for %s failed: %s", self.name, exc)
                    self._spool_broken_until = time.monotonic() + self.policy.cooldown_s
                    if self.spooled == 0 and not self._replay:
                        # Nothing older is on disk, so delivering these from memory keeps
                        # the order: stop spilling until the cooldown has passed.
                        now = time.monotonic()
                        self.queue.extend((as_batch(b), now) for b in self._to_spool)
                        self._to_spool.clear()
                        self.spilling = False
                        self._work.set()
                        break
                    with anyio.move_on_after(self.policy.cooldown_s):
                        await self._kick.wait()
                    continue
                del self._to_spool[: len(batches)]
                if self.durable and not self.spilling:
                    # Logged: deliver from memory; the segment goes once all are delivered.
                    # (Encoded batches come only with spilling set.)
                    now = time.monotonic()
                    for b in batches:
                        assert isinstance(b, Batch)
                        self._wal_segment[id(b)] = segment
                        self.queue.append((b, now))
                    self._wal_left[segment] = len(batches)
                else:
                    n = sum(b.records for b in batches)
                    self.in_flight -= n
                    self.spooled += n
                    if self._oldest_on_disk is None:
                        self._oldest_on_disk = time.monotonic()
                self._work.set()

    async def _deliver_forever(self) -> None:
        while True:
            if self.queue:
                batch, _ = self.queue[0]
                if await self._deliver(batch):
                    self.queue.popleft()
                    self.in_flight -= batch.records
                    await self._logged_delivered(batch)
                    self._signal_progress()
                continue
            if self.spilling and await self._deliver_from_disk():
                continue
            self._signal_progress()
            await self._work.wait()
            self._work = anyio.Event()

    async def _logged_delivered(self, batch: Batch) -> None:
        segment = self._wal_segment.pop(id(batch), None)
        if segment is None:
            return
        self._wal_left[segment] -= 1
        if self._wal_left[segment] == 0:
            del self._wal_left[segment]
            await self.spool.delivered(segment)

    async def _deliver_from_disk(self) -> bool:
        """Delivers the next spooled batch. False when there is nothing on disk to deliver."""
        if not self._replay:
            if self._to_spool:
                return False  # the writer has it; it wakes us when it is on disk
            # Write-ahead segments whose batches are in memory are delivered from there.
            taken = await self.spool.take()
            self._replay.extend(s for s in taken if s not in self._wal_left)
            if not self._replay:
                # Disk drained: new batches may stay in memory again.
                self.spilling = False
                self._oldest_on_disk = None
                self.spooled = 0
                return False
        segment = self._replay[0]
        if self._replay_batches is None:
            batches = await self.spool.read(segment)
            if is_adopted(segment):
                # Adopted from an earlier process: not counted by this one until now.
                self.spooled += sum(b.records for b in batches)
            self._replay_batches = deque(batches)
        while self._replay_batches:
            batch = self._replay_batches[0]
            if not await self._deliver(batch):
                return True
            self._replay_batches.popleft()
            self.spooled -= batch.records
        await self.spool.delivered(segment)
        self._replay.popleft()
        self._replay_batches = None
        self._signal_progress()
        return True

    async def _deliver(self, batch: Batch) -> bool:
        """Writes one batch with retries. True when it is done with (delivered, or dropped
        as permanently refused); False when the lane parked and the batch must be retried."""
        if batch.is_empty():  # every metric of it shed by drop_oldest
            return True
        try:
            await retry_call(
                self.policy, self._on_retry, self.backend.write_batch, self.run_id, batch
            )
        except Exception as exc:
            self.last_error = describe(exc)
            self.healthy = False
            if is_transient(exc):
                await self._park()
                return False
            # Permanent: retrying cannot help, and holding the batch would block everything
            # behind it. Count it and say so, loudly, once per batch.
            logger.error(
                "async_tracker: backend %s refused %d records of run %r for good: %s",
                self.name, batch.records, self.run_id, self.last_error,
            )
            self.dropped += batch.records
            return True
        self.healthy = True
        self.delivered += batch.records
        return True

    async def _park(self) -> None:
        logger.warning(
            "async_tracker: backend %s of run %r is failing (%s); retrying in %.1f s",
            self.name, self.run_id, self.last_error, self.policy.cooldown_s,
        )
        if not self.spilling and len(self.queue) > 1:
            # Down past the retry budget: everything behind the batch being retried goes to
            # disk, and so does what comes next, until the backend is back and caught up.
            head = self.queue.popleft()
            self._to_spool[:0] = [b for b, _ in self.queue]
            self.queue.clear()
            self.queue.append(head)
            self.spilling = True
            self._spool_work.set()
        self.parked = True
        self._signal_progress()
        with anyio.move_on_after(self.policy.cooldown_s):
            await self._kick.wait()
        self._kick = anyio.Event()
        self.parked = False
