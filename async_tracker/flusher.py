"""The flusher and its lanes: from the buffer to the backends, on the tracker loop.

* :class:`Flusher`: one per process. Every ``DEFAULT_WAKE_INTERVAL_S`` it looks at each run's
  buffer and cuts batches when ``batch_size`` records wait or ``flush_interval`` has passed.
* :class:`RunFlusher`: one per ``AppRun``. Drains its buffer, coalesces records into
  :class:`~async_tracker.records.Batch` objects and hands a copy of each to every lane. It
  also keeps the run within ``max_buffered`` records in memory: past it, the run's writes go
  where the overflow policy says (see :meth:`RunFlusher.check_memory`).
* :class:`~async_tracker.lane.Lane` (in ``lane.py``): one per backend of a run.

Everything here runs on the tracker loop thread, so the objects need no locks; the caller's
threads only read counters (``status()``), which may be a moment stale but never torn.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import anyio.abc

from async_tracker.base import AsyncTrackerBase
from async_tracker.buffer import ARTIFACT, METADATA, NO_STEP, Buffer, Chunk, Overflow, Record
from async_tracker.errors import TrackerClosedError
from async_tracker.lane import Lane, describe
from async_tracker.loop import TrackerLoop, get_loop
from async_tracker.records import Batch, TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.report import FlushReport, TrackerStatus
from async_tracker.settings import DEFAULT_WAKE_INTERVAL_S, SPOOL_GRACE_S, RunOptions
from async_tracker.spool import Encoded, Spool, columns, default_spool_dir, encode_batch

logger = logging.getLogger(__name__)

_new_metric = tuple.__new__  # builds a TrackerMetric from a tuple without its Python __new__


def coalesce(records: Sequence[Record], seq: int, last_step: dict[str, int]) -> Batch:
    """One batch from records in call order: metadata merged (the last write of a key wins),
    an artifact name kept at its last write, a source kept once, metric steps resolved.

    A metric logged without a step gets the previous step of that metric plus one (0 for
    its first point); ``last_step`` carries that across batches.
    """
    batch = Batch(seq, records=len(records))
    metadata = batch.metadata
    artifacts = batch.artifacts
    metrics = batch.metrics
    seen_sources: set[tuple[str, str | None]] = set()
    for rec in records:
        if len(rec) == 4:
            name, _, step, _ = rec
            if step is None:
                step = last_step.get(name, -1) + 1
                rec = (name, rec[1], step, rec[3])
            last_step[name] = step
            metrics.append(_new_metric(TrackerMetric, rec))
            continue
        kind, payload = rec
        if kind is METADATA:
            metadata.update(payload)
        elif kind is ARTIFACT:
            art: TrackerArtifact = payload
            artifacts.pop(art.name, None)  # keep the order of last writes
            artifacts[art.name] = art
        else:
            src: TrackerSource = payload
            key = (src.source_run_id, src.artifact_name)
            if key not in seen_sources:
                seen_sources.add(key)
                batch.sources.append(src)
    return batch


def resolve_steps(chunk: Chunk, last_step: dict[str, int]) -> None:
    """Gives the overflow's step-less points their steps (as :func:`coalesce` does) and
    carries each name's last step on."""
    names, idx, steps = chunk.names, chunk.idx, chunk.steps
    if NO_STEP in steps:  # a C scan; the Python loop runs only for step-less points
        last = [last_step.get(n, -1) for n in names]
        for j, (i, step) in enumerate(zip(idx, steps)):
            if step == NO_STEP:
                step = steps[j] = last[i] + 1
            last[i] = step
        last_step.update(zip(names, last))
        return
    reversed_idx = idx[::-1]
    for i, name in enumerate(names):
        last_step[name] = steps[len(idx) - 1 - reversed_idx.index(i)]


class RunFlusher:
    """The loop-side state of one run: its buffer, lanes and batch numbering."""

    def __init__(
        self,
        run_id: str,
        buffer: Buffer,
        backends: Sequence[tuple[str, AsyncTrackerBase]],
        options: RunOptions,
        owns_backends: bool,
        set_append: Callable[[Callable[[Record], None]], None],
    ) -> None:
        self.run_id = run_id
        self.buffer = buffer
        self.options = options
        self.owns_backends = owns_backends
        spool_dir = Path(options.spool_dir) if options.spool_dir else default_spool_dir()
        self.lanes = [
            Lane(
                run_id,
                name,
                b,
                options.retry,
                max_buffered=options.max_buffered,
                spool=Spool(spool_dir, run_id, name, max(1, options.max_buffered // 2)),
                durable=options.durable,
                overflow=options.overflow,
            )
            for name, b in backends
        ]
        # The run's memory bound. While overloaded, the caller's writes go through the
        # function given to set_append (AppRun swaps its hot path's append; the swap is
        # the only cost the bound adds to the hot path, and only while it holds).
        self.overflow = Overflow()
        self.overloaded = False
        self._set_append = set_append
        self._room = threading.Event()  # set while not overloaded: blocked writers wait on it
        self._room.set()
        self._counts_lock = threading.Lock()  # blocked writers count from their own threads
        self.blocked_writes = 0
        self.blocked_s = 0.0
        self.seq = 0
        self.last_step: dict[str, int] = {}
        self.last_cut = time.monotonic()
        self.closed = False
        # The scopes of the flushes (and reads) waiting for lanes: close() ends them once it
        # has stopped the lanes, or they would wait forever for progress that cannot come.
        self._waiting: set[anyio.CancelScope] = set()

    def tick(self, now: float) -> None:
        """The flusher's look at this run: its memory bound, and a cut if one is due."""
        n = len(self.buffer)
        if (
            n >= self.options.batch_size
            or len(self.overflow)
            or (n > 0 and now - self.last_cut >= self.options.flush_interval)
        ):
            self.cut()
        else:
            self.check_memory()

    def held(self) -> int:
        """Records of this run in memory: buffered (the overflow too: a writer that keeps
        it filling keeps the overload going), and the most any lane holds."""
        lanes = max((lane.in_flight for lane in self.lanes), default=0)
        return len(self.buffer) + len(self.overflow) + lanes

    def check_memory(self) -> None:
        """Starts or ends an overload, which keeps the run within ``max_buffered`` records in
        memory.

        The overload starts at half the bound, not at the bound: the flusher looks every
        50 ms (and between the batches of a cut), and a loop that does nothing but log can
        write tens of thousands of records in between; the other half is room for them. It
        ends at a quarter, so that a run near the threshold does not switch at every look.
        ``spool`` sends writes to the compact overflow, which goes to disk; ``block`` makes
        writers wait for room (see :meth:`_blocking_append`); ``drop_oldest`` changes
        nothing here: cut() and the lanes drop metrics at the bound itself.
        """
        limit = self.options.max_buffered
        held = self.held()
        if not self.overloaded and held > limit // 2:
            self.overloaded = True
            logger.info(
                "async_tracker: run %r holds %d records (max_buffered=%d); overflow policy %s",
                self.run_id, held, limit, self.options.overflow,
            )
            if self.options.overflow == "spool":
                self._set_append(self.overflow.append)
            elif self.options.overflow == "block":
                self._room.clear()
                self._set_append(self._blocking_append)
        elif self.overloaded and held <= limit // 4:
            self.overloaded = False
            self._room.set()
            self._set_append(self.buffer.append)

    def _blocking_append(self, record: Record) -> None:
        """The ``block`` policy's write, on the caller's thread: waits until the run is
        back within its bound. Past ``overflow_timeout`` it spools instead, and so do the
        writes after it until the overload ends: one wait per overload, not one per write."""
        start = time.monotonic()
        room = self._room.wait(self.options.overflow_timeout)
        if self.closed:
            raise TrackerClosedError(f"run {self.run_id!r} closed while this write waited")
        if room:
            self.buffer.append(record)
        else:
            self.overflow.append(record)
            self._set_append(self.overflow.append)
        with self._counts_lock:
            self.blocked_writes += 1
            self.blocked_s += time.monotonic() - start

    def cut(self) -> None:
        """Moves everything buffered now into batches of at most ``batch_size`` records,
        and the overflow's records to the lanes' spools."""
        self.check_memory()
        self.last_cut = time.monotonic()
        # The overflow first: a write that went to the deque (through an append fetched
        # just before the switch) happened before every write in the overflow, so draining
        # the deque after taking the overflow keeps them in order.
        chunk = self.overflow.take()
        pending = len(self.buffer)
        if self.options.overflow == "drop_oldest" and pending > self.options.max_buffered:
            self._shed(self.buffer.drain(pending - self.options.max_buffered))
            pending = len(self.buffer)
        while pending > 0:
            records = self.buffer.drain(min(pending, self.options.batch_size))
            pending -= len(records)
            self._put(coalesce(records, self.seq, self.last_step))
            # A long cut shares the GIL with writers that may be filling the buffer faster
            # than it drains: look at the bound between batches, not only at ticks.
            self.check_memory()
        if chunk.records:
            self._cut_chunk(chunk)

    def _put(self, batch: Batch) -> None:
        self.seq += 1
        # Spool-policy overload: what the deque holds goes to disk too, not into the lanes'
        # memory, so that the run's memory is its buffer's overshoot and no more.
        spill = self.overloaded and self.options.overflow == "spool"
        for lane in self.lanes:
            lane.put(batch, spill)

    def _shed(self, records: list[Record]) -> None:
        """drop_oldest, for records still in the buffer: the metrics go (their steps still
        count), the rest is kept."""
        batch = coalesce(records, self.seq, self.last_step)
        shed = len(batch.metrics)
        batch.metrics = []
        batch.records -= shed
        for lane in self.lanes:
            if lane.takes_metrics:
                lane.shed += shed
                lane.dropped += shed
        if not batch.is_empty():
            self._put(batch)

    def _cut_chunk(self, chunk: Chunk) -> None:
        """The overflow's records, encoded once into spool lines of at most ``batch_size``
        points that every lane taking metrics appends to its spool as they are."""
        resolve_steps(chunk, self.last_step)
        rest = coalesce(chunk.others, self.seq, self.last_step)
        if not rest.is_empty():
            self._put(rest)
        n, size = len(chunk.idx), self.options.batch_size
        for start in range(0, n, size):
            end = min(n, start + size)
            cols = columns(
                chunk.names,
                chunk.idx[start:end],
                chunk.values[start:end],
                chunk.steps[start:end],
                chunk.times[start:end],
            )
            encoded = Encoded(encode_batch(Batch(self.seq, records=end - start), cols), end - start)
            self.seq += 1
            for lane in self.lanes:
                if lane.takes_metrics:
                    lane.put_encoded(encoded)

    async def _settle(self, lanes: Sequence[Lane]) -> None:
        for lane in lanes:
            lane.kick()
        for lane in lanes:
            while not lane.settled():
                await lane.wait_progress()

    async def flush(
        self, timeout: float | None = None, lanes: Sequence[Lane] | None = None
    ) -> FlushReport:
        """Cuts what is buffered and waits until each lane has delivered it or given up."""
        self.cut()
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            self._waiting.add(scope)
            try:
                await self._settle(self.lanes if lanes is None else lanes)
            finally:
                self._waiting.discard(scope)
        self.check_memory()  # so that status() after a flush tells the overload as it is now
        return FlushReport.from_status(self.status(), timed_out=scope.cancelled_caught)

    async def close(self, timeout: float) -> FlushReport:
        """Flushes within ``timeout``, then stops the lanes whatever they are doing and
        spools what they still hold."""
        deadline = anyio.current_time() + timeout
        self.closed = True
        self._room.set()  # writers blocked by the block policy give up now
        try:
            return await self._close(deadline, timeout)
        finally:
            for scope in list(self._waiting):
                scope.cancel()

    async def _close(self, deadline: float, timeout: float) -> FlushReport:
        report = await self.flush(timeout)
        for lane in self.lanes:
            lane.abandon()
        if not report.ok:
            # Shielded and bounded: the records must reach the disk even if this close() is
            # itself cancelled, but a stuck disk must not hold the caller past its deadline.
            remaining = max(0.0, deadline - anyio.current_time()) + SPOOL_GRACE_S
            with anyio.move_on_after(remaining, shield=True):
                for lane in self.lanes:
                    await lane.spool_leftovers()
            report = FlushReport.from_status(self.status(), timed_out=report.timed_out)
        if self.owns_backends:
            # Shielded: close() may itself be cancelled, and a backend left half-closed (an
            # MLflow run left RUNNING) is worse than waiting out the rest of our deadline.
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time()), shield=True):
                async with anyio.create_task_group() as tg:
                    for lane in self.lanes:
                        tg.start_soon(_aclose_quietly, lane)
        return report

    def status(self) -> TrackerStatus:
        buffered = len(self.buffer) + len(self.overflow)
        return TrackerStatus(
            run_id=self.run_id,
            closed=self.closed,
            backends={lane.name: lane.status(buffered) for lane in self.lanes},
            overloaded=self.overloaded,
            blocked_writes=self.blocked_writes,
            blocked_s=self.blocked_s,
        )


async def _aclose_quietly(lane: Lane) -> None:
    try:
        await lane.backend.aclose()
    except Exception as exc:
        lane.last_error = describe(exc)
        logger.warning("async_tracker: closing backend %s failed: %s", lane.name, lane.last_error)


class Flusher:
    """The process-wide ticker that cuts batches for every run on the tracker loop."""

    def __init__(self, loop: TrackerLoop) -> None:
        self.loop = loop
        self.runs: set[RunFlusher] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._has_runs: anyio.Event | None = None  # created on the loop, by _serve
        ready = threading.Event()
        loop.submit(self._serve, ready)
        # Wait for the task group, so that add() never has to: submitted tasks then run in
        # submission order, and a flush() submitted after add() finds the lanes registered.
        if not loop.in_loop_thread():
            ready.wait()

    async def _serve(self, ready: threading.Event) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._has_runs = anyio.Event()
            ready.set()
            while True:
                if not self.runs:
                    # No open run: sleep until add(), so that a process whose runs are all
                    # closed pays nothing for the ticker (each tick takes the GIL).
                    await self._has_runs.wait()
                    self._has_runs = anyio.Event()
                await anyio.sleep(DEFAULT_WAKE_INTERVAL_S)
                now = time.monotonic()
                for run in list(self.runs):
                    if run.closed:
                        self.runs.discard(run)
                    else:
                        run.tick(now)

    async def add(self, run: RunFlusher) -> None:
        """Registers a run and starts its lanes (on the loop: lanes are tasks of ours)."""
        while self._tg is None:  # only when created from the loop thread itself
            await anyio.sleep(0)
        self.runs.add(run)
        assert self._has_runs is not None
        self._has_runs.set()
        for lane in run.lanes:
            self._tg.start_soon(lane.run, name=f"async-tracker lane {lane.name}")


_flusher: Flusher | None = None
_flusher_lock = threading.Lock()


def get_flusher() -> Flusher:
    """The flusher of this process's tracker loop (a new one after a fork)."""
    global _flusher
    loop = get_loop()
    with _flusher_lock:
        if _flusher is None or _flusher.loop is not loop:
            _flusher = Flusher(loop)
        return _flusher


def _after_fork_in_child() -> None:
    global _flusher_lock
    _flusher_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
