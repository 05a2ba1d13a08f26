"""A lane: the delivery of one run's batches to one backend, from their ordered log.

The batches wait in the lane's log (:class:`~async_tracker.spool.log.BatchLog`), oldest first,
in memory or on disk: the log owns the entries, the two tiers, the spiller, the acks and the
spool's files. The lane owns delivery: it always takes the head of the log (an entry on disk
only is read back in its place first), so the tier of an entry never changes its turn.

Two tasks per lane, both on the tracker loop, so that a backend hung in a write never keeps
records from reaching the disk:

* the deliverer writes the head with retries (:func:`~async_tracker.retry.write_with_retries`)
  and, once it is done, has the log persist the ack (the head's ``seq``) when the entry is on
  disk;
* the log's spiller writes runs of memory entries to new segments: ahead of delivery when
  durable, with a failing backend between rounds, or past the memory bound (then it drops
  the memory copy).

Failures (:func:`~async_tracker.errors.classify`): transient ones are retried with backoff;
a failure of the backend ends the round at once; after a round the lane pauses (``cooldown_s``,
or until a flush or close asks) and tries again, for as long as the run lives. Retries follow
progress: a round ends after ``max_attempts`` tries that stored nothing, and a try that stored
a part of the head (``Batch.done``) starts a new round, without a pause. A refused
record splits its batch until the record stands alone, and only it is dropped, counted and
named. If a task of the lane dies, its records stay where they are, the error is reported, and
nothing else stops.

At a close, the run's pipeline stops the lane at its deadline (:meth:`Lane.stop`, then
:meth:`Lane.wind_down`). A write cut off there may still be stored by the backend (a call
left running in a worker thread, a request already sent): its records stay where they are
(and are spooled with the rest), and the report counts them ``in_doubt`` as well.

Everything here runs on the tracker loop; other threads only read counters (``status()``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import anyio

from async_tracker.base import AsyncTrackerBase, has_heartbeat, takes_delivery
from async_tracker.clock import Clock
from async_tracker.errors import RecordError, classify, describe
from async_tracker.pipeline.cutter import split
from async_tracker.records import Batch
from async_tracker.report import BackendStatus
from async_tracker.retry import RetryPolicy, write_with_retries
from async_tracker.settings import OverflowPolicy
from async_tracker.spool.log import BatchLog, Entry
from async_tracker.spool.store import Spool

logger = logging.getLogger(__name__)

# While closing, the pause between rounds against a backend that fails at once.
CLOSING_PAUSE_S = 0.05


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
        life: int = 0,
        ledger: AbstractContextManager[object] | None = None,
    ) -> None:
        self.run_id = run_id
        # Which life of the run this process lives (see Batch.life): said with each
        # heartbeat, so that readers tell a requeued run's new life, beating, from the
        # ending of an earlier one.
        self.life = life
        self.name = name
        self.backend = backend
        self.policy = policy
        self.clock = clock
        self.rng = rng or random.Random()  # the run's (shared by its lanes), or one of its own
        self.takes_metrics = backend.supports_metrics
        # Seconds between heartbeats; 0: none (also for backends without the method).
        self.heartbeat_s = heartbeat_s if has_heartbeat(backend) else 0.0
        # A backend whose heartbeat takes ``delivery`` stores the lane's state with each
        # beat (lag, spooled, last error), for readers of a live run (the dashboard).
        self._beat_delivery = self.heartbeat_s > 0 and takes_delivery(backend)
        self.log = BatchLog(
            spool,
            clock,
            durable=durable,
            memory_limit=memory_limit,
            overflow=overflow,
            segment_records=segment_records,
            cooldown_s=policy.cooldown_s,
            run_id=run_id,
            name=name,
            on_error=self._on_spool_error,
            on_lost=self._on_lost,
            ledger=ledger,
        )
        # Counters, in records. Every record put in the lane is in exactly one of: the log's
        # memory, the log's disk, delivered, dropped.
        self.delivered = 0
        self.dropped = 0
        self.shed = 0  # dropped by the drop_oldest policy (part of dropped)
        self.retries = 0
        self.parks = 0
        # Parts of batches (``Batch.done`` marks) stored by writes that failed: the progress
        # a round of retries follows (see write_with_retries). Only grows.
        self.parts_stored = 0
        self._try_stored = False  # the last write that failed stored a part before failing
        self.refused: list[str] = []  # what backends refused for good, for the report
        self.last_error: str | None = None
        self.healthy = True
        self.failure: str | None = None  # a task of the lane died
        self.deadline: float | None = None  # set by close()
        self._running = False  # run() was started
        self._bound = False
        # Records of the backend call under way, of the delivered head being completed (its
        # ack), and of a backend call the close cut off: the report's ``in_doubt``.
        self._calling = 0
        self._completing = 0
        self._cut_off = 0
        self._stopped = False  # stop() was called: delivery is over
        # The run's lanes, this one included (set by the run's pipeline; read on the loop by
        # the heartbeat, see delivery_state).
        self.peers: list[Lane] = [self]

    @property
    def memory(self) -> int:
        """Records the lane holds in memory only (what the run's memory bound counts)."""
        return self.log.memory

    def bind(self) -> None:
        """Creates the lane's anyio objects on the loop (a lane is built on the caller's
        thread, before the loop first sees it)."""
        if not self._bound:
            self.log.bind()
            self._work = anyio.Event()
            self._progress = anyio.Event()
            self._kick = anyio.Event()
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
        self.log.put(mine)
        if self.log.overflow == "drop_oldest" and self.log.memory > self.log.memory_limit:
            shed = self.log.shed()
            self.shed += shed
            self.dropped += shed
        self._work.set()
        self.log.spill_soon()

    def set_overloaded(self, overloaded: bool) -> None:
        """The run asks for (or releases) memory: while overloaded, what the lane holds goes
        to disk."""
        self.bind()
        self.log.set_overloaded(overloaded)

    def kick(self) -> None:
        """Ends a pause between rounds: flush and close want their answer now. Only a pause
        under way: a kick kept for later would cut the next pause short."""
        self.bind()
        if self.log.paused:
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
        if self.log.adopting:
            return False
        head = self.log.head()
        return head is None or (head.token is None and head.first > target)

    def drained(self) -> bool:
        return not self.log.entries and not self.log.adopting

    async def wait_progress(self) -> None:
        self.bind()
        await self._progress.wait()

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()

    def status(self, buffered: int) -> BackendStatus:
        log = self.log
        head = log.head()
        memory, ends_memory = log.memory_count()
        disk, ends_disk = log.disk_count()
        return BackendStatus(
            name=self.name,
            buffered=buffered,
            in_flight=memory,
            spooled=disk,
            delivered=self.delivered,
            dropped=self.dropped,
            retries=self.retries,
            last_error=self.failure or self.last_error,
            lag_s=self.clock.now() - head.since if head is not None else 0.0,
            healthy=self.healthy and self.failure is None and not log.spool_failing,
            spool_path=log.spool.path,
            shed=self.shed,
            refused=tuple(self.refused),
            end_pending=ends_memory,
            end_spooled=ends_disk,
            replayed=log.adopted,
            in_doubt=self.in_doubt(),
        )

    def in_doubt(self) -> int:
        """Once delivery stopped (a close): the records a backend may store although they are
        counted where they wait, on disk or in memory. Those of a call the close cut off; or,
        while the deliverer is still at it (on a tracker loop that a backend blocks, or a
        disk slow to take an ack), those of the call under way or of the head it completes."""
        if not (self._stopped or self.log.fenced):
            return 0
        return self._cut_off + self._calling + self._completing

    def delivery_state(self) -> dict[str, object]:
        """What a heartbeat tells readers of the lane (see :meth:`status`); with other
        lanes in the run, theirs as well (``backends``, by name, this one's included): the
        store's heartbeat is where a dashboard sees an MLflow lane failing beside it."""
        state = self._own_state()
        if len(self.peers) > 1:
            state["backends"] = {lane.name: lane._own_state() for lane in self.peers}
        return state

    def _own_state(self) -> dict[str, object]:
        s = self.status(0)
        return {
            "lag_s": round(s.lag_s, 3), "pending": s.in_flight, "spooled": s.spooled,
            "delivered": s.delivered, "dropped": s.dropped, "retries": s.retries,
            "last_error": s.last_error, "healthy": s.healthy, "life": self.life,
        }  # fmt: skip

    # -- what the log tells --------------------------------------------------------------------
    def _on_spool_error(self, message: str) -> None:
        self.last_error = message

    def _on_lost(self, records: int, message: str) -> None:
        """A damaged spool segment lost ``records``: dropped, and named in the report."""
        self.dropped += records
        self.last_error = message
        self.refused.append(message)

    # -- the tasks ------------------------------------------------------------------------------
    async def run(self) -> None:
        """The lane's two tasks (and the heartbeat, if any), until close() stops them."""
        self.bind()
        self._running = True
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._supervised, self.log.spill_forever, self._spill_scope)
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
                    if self._beat_delivery:
                        beat: Any = self.backend.heartbeat
                        await beat(self.run_id, self.heartbeat_s, delivery=self.delivery_state())
                    else:
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
                if task == self.log.spill_forever:
                    self.log.spiller_died()  # the deliverer no longer waits for it
                self.failure = f"lane stopped: {describe(exc)}"
                self.healthy = False
                self.log.adopting = False
                logger.exception(
                    "async_tracker: delivery of run %r to %s stopped; its records are kept",
                    self.run_id, self.name,
                )
                self._signal_progress()

    async def _deliver_forever(self) -> None:
        await self.log.adopt()
        self._signal_progress()
        while True:
            if self.log.fenced:
                return  # the close has its report: nothing moves any more
            entry = self.log.head()
            if entry is None:
                self._signal_progress()
                await self._work.wait()
                self._work = anyio.Event()
                continue
            if entry.batch is None:
                await self.log.load(entry)  # a disk-only head: read back in its place
                self._signal_progress()
                continue
            if self.log.is_writing(entry):
                # Being written to disk: deliver it once it is there, so that its ack covers
                # its line (delivered from memory meanwhile, a crash would replay it).
                await self.log.wait_written()
                continue
            if self.log.needs_write_ahead(entry):
                # Write-ahead: the spiller logs it first; it wakes us when it did.
                self.log.write_ahead()
                await self.log.wait_written()
                continue
            self.log.in_flight = entry
            try:
                done = await self._attempt(entry)
            finally:
                self.log.in_flight = None
            if done:
                # Shielded: the backend has the batch, and a close's deadline landing here
                # must not leave it counted where it waited (its ack is one small file).
                self._completing = entry.records
                try:
                    with anyio.CancelScope(shield=True):
                        await self._complete(entry)
                finally:
                    self._completing = 0

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
        self._calling = batch.records
        try:
            await self.backend.write_batch(run_id, batch)
        except anyio.get_cancelled_exc_class():
            # Cut off by the close: the call may go on without us (a worker thread), or
            # have reached the backend already. Its records are in doubt.
            self._cut_off = batch.records
            raise
        except Exception as exc:
            stored = len(batch.done) - before
            self.parts_stored += stored
            self._try_stored = stored > 0
            mapped = self.backend.map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            self._calling = 0

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
        self.log.split_head(parts)  # the head is ``entry``
        return False

    async def _pause(self, kind: str) -> None:
        """The end of a failed round: spill the head and what waits behind it, tell the flushes
        waiting for us, and wait a cooldown (or for a kick) before the next round."""
        self.parks += 1
        # Between rounds nothing writes the head: it goes to disk with what waits behind it.
        # Kept in memory, it would wait for a close's last moment (its grace, where a loaded
        # machine may not give it the time), and a crash during a long outage would lose it.
        self.log.in_flight = None
        self.log.set_paused(True)
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
        self.log.set_paused(False)

    async def _complete(self, entry: Entry) -> None:
        """The head is done: the log persists the ack and tidies the disk, then the lane counts
        it (no wait in between: a flush that sees the count finds the disk tidied). The log's
        counters and ours move as one, under the ledger; not once fenced (the close's report
        is made: it counts the head where it waited, in doubt)."""
        await self.log.settle(entry)
        with self.log.ledger:
            if self.log.fenced:
                return
            self.log.take_out(entry)
            self.delivered += entry.records - entry.dropped
            self.dropped += entry.dropped
        self._signal_progress()

    # -- close ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stops delivery for good (a write hung in a worker thread is left behind: its
        records are in doubt), and the spiller from starting another write. The write it has
        under way ends in :meth:`wind_down`."""
        self.bind()
        self._stopped = True
        self.log.stop_spilling()
        self._deliver_scope.cancel()

    async def wind_down(self) -> None:
        """After :meth:`stop`: lets the spiller's write under way end (the caller bounds the
        wait; cut short, the write is given up at its commit point), then ends the lane's
        tasks and waits until they are over."""
        try:
            await self.log.wait_idle()
        finally:
            self._scope.cancel()
        if self._running:
            # Cancelling is not stopping: anyio delivers a cancellation at a task's next
            # wait, so a deliverer whose write has just returned still takes one step, and
            # completes that batch. Only once both tasks are over is what is in memory ours;
            # read sooner, a batch would be both delivered and spooled (counted twice, and
            # sent again by the next start).
            await self._ended.wait()

    async def spool_leftovers(self) -> None:
        """After :meth:`stop`: :meth:`wind_down`, then writes what is still in memory only to
        disk, each run of consecutive entries to segments of its own, so that a replay keeps
        the order."""
        await self.wind_down()
        await self.log.spill_leftovers()

    async def release(self) -> None:
        """Gives up this pipeline's hold on the spool: our lock (and our ack, if nothing of
        ours is left on disk), and the dead pipelines' we adopted, whose files stay for the
        next start."""
        await self.log.release()
