"""The simulated world: runs, backends, a spool and a clock, driven by a schedule of steps.

Everything runs on one event loop with a :class:`~async_tracker.clock.VirtualClock` and the
spool's I/O inline, so a schedule runs the same way every time and time costs nothing. The
pipeline under test is the real one (:class:`RunPipeline`, its lanes, the spool on a real
temporary directory); only the backends and the clock are ours.

A :class:`Model` knows what every run accepted, in call order, and what must survive each
crash; :meth:`World.check` compares the system with it after every step.
"""

from __future__ import annotations

import errno
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from async_tracker import AppRun
from async_tracker.base import END_PART, AsyncTrackerBase
from async_tracker.clock import HybridClock
from async_tracker.errors import PermanentBackendError, RecordError
from async_tracker.ingress import ARTIFACT, METADATA, SOURCE, Ingress
from async_tracker.pipeline.run_pipeline import RunPipeline
from async_tracker.records import Batch, Lineage, TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.retry import RetryPolicy
from async_tracker.settings import BACKEND_CLOSE_GRACE_S, RunOptions
from async_tracker.spool.io import InlineIO
from async_tracker.spool.owner import locks
from async_tracker.spool.store import new_token, run_dir_name
from tests.interrupts import interrupted_at
from tests.simulation.virtual_clock import VirtualClock

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import ExceptionGroup

RUNS = ("a", "b")
BACKENDS = ("idem", "raw")
FAULTS = ("transient", "backend", "unknown", "group", "partial", "slow", "hang")
# Backends that store a batch part by part (as AsyncTrackerBase.write_batch does: metadata,
# each artifact, each source, the metrics in requests of METRICS_PER_PART points, the end
# record, each marked in Batch.done): "parts"
# fails one write after storing some of its parts; "flaky" fails each part of every write at
# random (FLAKY_RATE) until healed: a backend that half-works.
PART_FAULTS = ("parts", "flaky")
FLAKY_RATE = 0.3
METRICS_PER_PART = 2

# Quick retries: the clock is virtual, but fewer rounds keep schedules short.
POLICY = RetryPolicy(
    max_attempts=3, initial_backoff_s=0.05, max_backoff_s=1.0, jitter_s=0.05, cooldown_s=2.0
)


def uid(name: str, step: int) -> str:
    return f"{name}@{step}"


def token_of(key: str) -> str:
    """The pipeline token in a batch key (time-token-seq)."""
    return key.split("-")[1]


class SimBackend(AsyncTrackerBase):
    """An async backend that stores what it is sent and misbehaves when told to.

    ``arrivals`` keeps every metric point as it arrived (duplicates included); ``store`` is
    what an idempotent backend keeps (a point once). Faults apply to the next calls of
    ``write_batch``, one fault per call.
    """

    def __init__(self, name: str, clock: VirtualClock, rng: random.Random) -> None:
        self.name = name
        self.clock = clock
        self.rng = rng
        self.faults: dict[str, list[str]] = {run: [] for run in RUNS}  # per run, in turn
        self.poison: set[tuple[str, str]] = set()  # (run, point) refused for good
        self.arrivals: dict[str, list[tuple[str, str]]] = {}  # run -> [(uid, batch key)]
        self.metadata: dict[str, dict[str, object]] = {}
        # The stamp of each key's stored value: a key's writes merge by stamp (the last write
        # wins, whatever order they arrive in), as a store many processes write does.
        self.metadata_ns: dict[str, dict[str, int]] = {}
        self.metadata_arrivals: dict[str, set[object]] = {}  # values (write indexes) stored
        self.tainted: set[str] = set()  # batch keys written in part before a failure
        self.release = {run: anyio.Event() for run in RUNS}
        self.hung = {run: 0 for run in RUNS}
        self.flaky = {run: False for run in RUNS}  # every part fails at random (FLAKY_RATE)
        self.artifacts: dict[str, dict[str, str]] = {}
        self.sources: dict[str, set[str]] = {}
        self.artifact_arrivals: dict[str, set[str]] = {}
        # End records as they arrived: (token of the pipeline that sealed it, its place in
        # ``arrivals`` then), per run.
        self.end_arrivals: dict[str, list[tuple[str, int]]] = {}

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        faults = self.faults[run_id]
        fault = faults.pop(0) if faults else None
        if fault == "slow":
            await self.clock.sleep(self.rng.uniform(0.01, 3.0))
        elif fault == "hang":
            self.hung[run_id] += 1
            try:
                await self.release[run_id].wait()
            finally:
                self.hung[run_id] -= 1
        elif fault == "transient":
            raise ConnectionError("simulated outage")
        elif fault == "backend":
            raise PermanentBackendError("simulated: read-only store")
        elif fault == "unknown":
            raise self.rng.choice([ValueError("simulated bug"), KeyError("simulated")])
        elif fault == "group":
            raise ExceptionGroup("simulated", [ConnectionError("a"), TimeoutError("b")])
        refused = [m for m in batch.metrics if (run_id, uid(m.name, m.step)) in self.poison]
        if refused:
            raise RecordError(f"simulated: cannot store {refused[0].name}@{refused[0].step}")
        if fault == "parts" or self.flaky[run_id] or batch.done:
            # Parts stored by an earlier try are marked: the rest goes part by part too.
            self._store_parts(run_id, batch, fault == "parts")
            return
        metrics = batch.metrics
        if fault == "partial" and len(metrics) > 1:
            self.tainted.add(batch.key.split(".")[0])
            self._store(run_id, batch, metrics[: len(metrics) // 2], metadata=False)
            raise ConnectionError("simulated: connection lost mid-batch")
        self._store(run_id, batch, metrics, metadata=True)

    def _store(
        self, run_id: str, batch: Batch, metrics: Sequence[TrackerMetric], metadata: bool
    ) -> None:
        key = batch.key.split(".")[0]
        self.arrivals.setdefault(run_id, []).extend((uid(m.name, m.step), key) for m in metrics)
        if metadata:
            stored = self.metadata.setdefault(run_id, {})
            stamps = self.metadata_ns.setdefault(run_id, {})
            for name, value in batch.metadata.items():
                stamp = batch.metadata_ns[name]  # a KeyError: a batch lost its stamps
                if stamp >= stamps.get(name, -1):  # equal: the same write, delivered again
                    stored[name], stamps[name] = value, stamp
            self.metadata_arrivals.setdefault(run_id, set()).update(batch.metadata.values())
            arts = self.artifacts.setdefault(run_id, {})
            for name, art in batch.artifacts.items():
                arts[name] = art.path
                self.artifact_arrivals.setdefault(run_id, set()).add(art.path)
            self.sources.setdefault(run_id, set()).update(s.source_run_id for s in batch.sources)
            if batch.end is not None:
                place = len(self.arrivals.get(run_id, []))
                self.end_arrivals.setdefault(run_id, []).append((token_of(key), place))

    def _store_parts(self, run_id: str, batch: Batch, fail_once: bool) -> None:
        """Stores the parts of ``batch`` not yet in ``batch.done``, one at a time, marking
        each: a part stored is never sent again, so none of these faults allows a duplicate.
        ``fail_once``: the write fails (transient) after storing at least one part, at a
        random one; a flaky backend fails each part with probability FLAKY_RATE."""
        key = batch.key.split(".")[0]

        def metadata() -> None:
            self.metadata.setdefault(run_id, {}).update(batch.metadata)
            self.metadata_arrivals.setdefault(run_id, set()).update(batch.metadata.values())

        def artifact(name: str, path: str) -> None:
            self.artifacts.setdefault(run_id, {})[name] = path
            self.artifact_arrivals.setdefault(run_id, set()).add(path)

        def metrics(chunk: Sequence[TrackerMetric]) -> None:
            self.arrivals.setdefault(run_id, []).extend((uid(m.name, m.step), key) for m in chunk)

        def end() -> None:
            place = len(self.arrivals.get(run_id, []))
            self.end_arrivals.setdefault(run_id, []).append((token_of(key), place))

        parts: list[tuple[str, Callable[[], None]]] = []
        if batch.metadata:
            parts.append(("metadata", metadata))
        for name, art in batch.artifacts.items():
            parts.append((f"artifact:{name}", partial(artifact, name, art.path)))
        for src in batch.sources:
            parts.append((
                f"source:{src.source_run_id}:{src.artifact_name or ''}",
                partial(self.sources.setdefault(run_id, set()).add, src.source_run_id),
            ))
        # Points go in requests of a few (as MLflow's log_batch does), each a part.
        for i in range(0, len(batch.metrics), METRICS_PER_PART):
            chunk = batch.metrics[i : i + METRICS_PER_PART]
            parts.append((f"metrics:{i}", partial(metrics, chunk)))
        if batch.end is not None:
            parts.append((END_PART, end))
        todo = [(name, store) for name, store in parts if name not in batch.done]
        fail_at = self.rng.randrange(1, len(todo)) if fail_once and len(todo) > 1 else -1
        for i, (name, store) in enumerate(todo):
            if i == fail_at or (self.flaky[run_id] and self.rng.random() < FLAKY_RATE):
                raise ConnectionError(f"simulated: {name} failed, {i} parts stored")
            store()
            batch.done.add(name)

    def heal(self, run: str | None = None) -> None:
        for r in RUNS if run is None else (run,):
            self.faults[r].clear()
            self.flaky[r] = False
            self.release[r].set()
            self.release[r] = anyio.Event()

    def troubled(self, run: str) -> bool:
        """Faults wait for this run's writes, or one of them hangs. "parts" faults do not
        count: each stores a part before it fails, so retries that follow progress never
        give up on them, and a flush waits for everything through them."""
        return (
            any(f != "parts" for f in self.faults[run]) or self.hung[run] > 0 or self.flaky[run]
        )

    # The rest of the interface: not used by the pipeline's writes.
    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        raise AssertionError("write_batch is the only write")

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return {}

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        raise AssertionError("write_batch is the only write")

    async def metadata(self, run_id: str) -> Mapping[str, object]:  # type: ignore[override]
        return dict(self.metadata.get(run_id, {}))

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        raise AssertionError("write_batch is the only write")

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        return []

    async def lineage(self, run_id: str) -> Lineage:
        return Lineage(run_id)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        return list(self.arrivals)

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        raise AssertionError("write_batch is the only write")

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return {}


class FaultyIO(InlineIO):
    """The spool's I/O, inline, failing the next ``fail_writes`` writes with ``errno_``."""

    def __init__(self) -> None:
        self.fail_writes = 0
        self.errno_ = errno.ENOSPC
        # Acks that could not be written, by token: the highest sequence number. A replay
        # after a crash may send again what they covered (a duplicate, never a loss).
        self.failed_acks: dict[str, int] = {}

    async def run(self, fn: Any, *args: Any) -> Any:
        name = getattr(fn, "__name__", "")
        if self.fail_writes and name in ("_write_file", "_write_ack"):
            self.fail_writes -= 1
            if name == "_write_ack":
                token, seq = args
                self.failed_acks[token] = max(seq, self.failed_acks.get(token, -1))
            await anyio.lowlevel.checkpoint()
            raise OSError(self.errno_, f"simulated: {errno.errorcode[self.errno_]}")
        return await super().run(fn, *args)


@dataclass
class Written:
    """One accepted record, as the model knows it."""

    index: int  # its place in the run's call order, across incarnations
    uid: str | None  # metric points: what backends store; None for the others
    key: str | None = None  # metadata key
    poison: bool = False
    artifact: str | None = None  # artifact name (its path holds the index)
    source: str | None = None  # source id
    origin: int = 0  # 0: the job's main process; k: the k-th forked child (its own order)


@dataclass
class Incarnation:
    """One life of a run's pipeline (a process, until it closes or crashes)."""

    pipeline: RunPipeline
    ingress: Ingress
    scope: anyio.CancelScope
    # The hot path, as AppRun keeps it: the deque's append, or the packed ingress's while
    # the run is overloaded (the pipeline switches it through set_hot).
    append: Any = None
    extend: Any = None
    stopped: anyio.Event = field(default_factory=anyio.Event)  # its lane tasks are over
    accepted: list[Written] = field(default_factory=list)  # by sequence number
    closed: bool = False


@dataclass
class RunModel:
    """What a run accepted, and what each backend must end up with."""

    writes: list[Written] = field(default_factory=list)
    lost: dict[str, set[int]] = field(default_factory=dict)  # backend -> indexes lost to crashes
    heads_at_crash: dict[str, set[str]] = field(default_factory=dict)  # backend -> batch keys
    steps: Counter[str] = field(default_factory=Counter)
    # End records of closed lives (by pipeline token): the backends that must get each one
    # (those whose lane had it delivered or on disk when the life ended).
    ends: dict[str, set[str]] = field(default_factory=dict)


class World:
    """Two runs over two backends, a spool directory, a virtual clock."""

    def __init__(self, seed: int, spool_dir: Path, durable: bool, tg: anyio.abc.TaskGroup):
        self.rng = random.Random(seed)
        self.clock = VirtualClock()
        self.spool_dir = spool_dir
        self.durable = durable
        self.tg = tg
        self.io = FaultyIO()
        self.backends = {n: SimBackend(n, self.clock, random.Random(self.rng.random()))
                         for n in BACKENDS}
        self.models = {r: RunModel() for r in RUNS}
        self.runs: dict[str, Incarnation] = {}
        self.options = RunOptions(
            flush_interval=1.0,
            batch_size=self.rng.choice([3, 8, 25]),
            max_buffered=self.rng.choice([40, 200, 100_000]),
            durable=durable,
            close_timeout=5.0,
            retry=POLICY,
            spool_dir=str(spool_dir),
        )
        self.log: list[str] = []
        # The wall clock of the process the runs live in: the virtual time plus an offset
        # that a step of the schedule sets back (as NTP does). Metadata is stamped by the
        # process's hybrid clock from it, as AppRun.add_metadata does; the runs' lives share
        # it, as a run reopened in one process does.
        self.wall_offset_ns = 1_700_000_000 * 10**9
        self.metadata_clock = HybridClock()
        self._apps: dict[str, AppRun] = {}
        self.forks = 0
        self.launches = 0
        for run in RUNS:
            self.start(run)

    # -- life of a run --------------------------------------------------------------------------
    def start(self, run: str) -> None:
        """A new life of the run (a process started again), its lanes running."""
        self.runs[run] = self._launch(run)

    def _launch(self, run: str) -> Incarnation:
        """A pipeline of ``run`` with a token of its own, its lane tasks started."""
        self.launches += 1
        ingress = Ingress()
        holder: list[Incarnation] = []

        def set_hot(mode: str) -> None:
            target = holder[0].pipeline.packed if mode == "packed" else holder[0].ingress
            holder[0].append, holder[0].extend = target.append, target.extend

        pipeline = RunPipeline(
            run,
            ingress,
            [(n, b) for n, b in self.backends.items()],
            self.options,
            clock=self.clock,
            io=self.io,
            token=new_token(int(self.clock.now() * 1e9) + self.launches),
            rng=random.Random(self.rng.random()),
            set_hot=set_hot,  # type: ignore[arg-type]
        )
        scope = anyio.CancelScope()
        inc = Incarnation(pipeline, ingress, scope, ingress.append, ingress.extend)
        holder.append(inc)

        async def lanes() -> None:
            try:
                with scope:
                    async with anyio.create_task_group() as tg:
                        for lane in pipeline.lanes:
                            tg.start_soon(lane.run)
            finally:
                inc.stopped.set()

        self.tg.start_soon(lanes)
        return inc

    def wall_ns(self) -> int:
        return self.wall_offset_ns + int(self.clock.now() * 1e9)

    def step_wall_clock_back(self, seconds: float) -> None:
        self.wall_offset_ns -= int(seconds * 1e9)

    def write(self, run: str, writer: int, count: int, kind: str) -> None:
        inc = self.runs[run]
        model = self.models[run]
        for _ in range(count):
            index = len(model.writes)
            if kind == "metadata":
                key = f"k{index % 3}"
                written = Written(index, None, key=key)
                stamp = self.metadata_clock.stamp(self.wall_ns())
                inc.append((METADATA, ({key: index}, stamp)))
            elif kind == "artifact":
                name = f"a{index % 2}"
                written = Written(index, None, artifact=name)
                inc.append((ARTIFACT, TrackerArtifact(name, f"/p/{index}", None)))
            elif kind == "source":
                source = f"parent{index % 4}"
                written = Written(index, None, source=source)
                inc.append((SOURCE, TrackerSource(source, None)))
            else:
                name = f"w{writer}"
                step = model.steps[name]
                model.steps[name] += 1
                written = Written(index, uid(name, step), poison=kind == "poison")
                if written.poison:
                    self.backends[self.rng.choice(BACKENDS)].poison.add((run, uid(name, step)))
                inc.append((name, float(index), step, self.clock.now()))
            model.writes.append(written)
            inc.accepted.append(written)

    def interrupted_write(self, run: str, writer: int, k: int) -> None:
        """A write through AppRun's real hot path, with KeyboardInterrupt raised at its
        ``k``-th bytecode (as Ctrl-C would): the model accepts what reached the ingress,
        which must be the whole call or nothing of it."""
        inc = self.runs[run]
        model = self.models[run]
        app = self._apps.get(run)
        if app is None:
            app = self._apps[run] = AppRun(run, [])
        app._sink = inc
        name = f"w{writer}"
        step = model.steps[name]
        before = inc.pipeline.waiting()
        interrupted_at(
            k, lambda: app.log_metrics({name: float(len(model.writes))}, step=step)
        )
        added = inc.pipeline.waiting() - before
        assert added in (0, 1), f"a write interrupted at bytecode {k} kept {added} points"
        if added:
            model.steps[name] += 1
            written = Written(len(model.writes), uid(name, step))
            model.writes.append(written)
            inc.accepted.append(written)

    async def fork(self, run: str, count: int) -> None:
        """A forked child (a DataLoader worker) of the job: it starts empty, with a pipeline
        of its own on the same spool directory (another live owner beside the parent), logs
        ``count`` points and exits through close(). The parent's records are never its."""
        self.forks += 1
        child_origin = self.forks
        child = self._launch(run)
        ingress, pipeline = child.ingress, child.pipeline
        model = self.models[run]
        name = f"fork{child_origin}"
        for step in range(count):
            written = Written(len(model.writes), uid(name, step), origin=child_origin)
            ingress.append((name, float(written.index), step, self.clock.now()))
            model.writes.append(written)
            child.accepted.append(written)
        report = await pipeline.close(self.rng.choice([0.0, 1.0, 30.0]))
        self.note_end(run, child)
        child.scope.cancel()
        await child.stopped.wait()
        total = report.delivered + report.pending + report.spooled + report.dropped
        adopted = sum(lane.log.adopted for lane in pipeline.lanes)  # dead pipelines' leftovers
        assert total == count * len(self.backends) + adopted, (report, count)
        self._bury(run, child)

    async def crash(self, run: str) -> None:
        """The process dies where it is: in-memory records are gone, the spool stays, and
        the OS releases its locks. Then the job restarts with the same spool. (A write whose
        await had already returned completes: the process died just after it.)"""
        inc = self.runs[run]
        inc.scope.cancel()
        await inc.stopped.wait()
        self._bury(run, inc)
        # The OS releases a dead process's locks: its own, and those of what it adopted.
        tokens = {inc.pipeline.token}
        for lane in inc.pipeline.lanes:
            tokens.update(lane.log.adopted_tokens())
        for path in list(locks._held):
            if run_dir_name(run) in str(path) and path.name[: -len(".lock")] in tokens:
                locks.drop(path)
        self.start(run)

    async def close(self, run: str, timeout: float) -> None:
        """close() within its deadline, whatever the backends do; what it could not deliver
        is on disk, or (the disk failing too) reported as pending. Then the job goes on in a
        new process, which replays the spool."""
        inc = self.runs[run]
        start = self.clock.now()
        report = await inc.pipeline.close(timeout)
        self.note_end(run, inc)
        took = self.clock.now() - start
        assert took <= timeout + BACKEND_CLOSE_GRACE_S + 1e-6, f"close({timeout}) took {took}"
        inc.scope.cancel()
        for lane in inc.pipeline.lanes:
            memory = sum(e.records for e in lane.log.entries if e.segment is None)
            assert lane.log.memory == memory
            status = report  # counts are per run, summed over backends
        assert status.pending == sum(lane.log.memory for lane in inc.pipeline.lanes)
        assert status.spooled == sum(lane.log.disk for lane in inc.pipeline.lanes)
        if status.pending:
            assert not status.ok and status.errors, status
        await inc.stopped.wait()
        self._bury(run, inc)
        self.start(run)

    async def sigterm_while_closing(
        self, run: str, timeout: float, after: float, grace: float
    ) -> None:
        """close(``timeout``), whose deadline a SIGTERM moves ``after`` seconds in to the end
        of its ``grace`` (if that is earlier): the close ends by then, what it could not
        deliver is on disk, and the invariants of any close hold (see :meth:`close`)."""
        pipeline = self.runs[run].pipeline
        ended: list[float] = []

        async def closing() -> None:
            await self.close(run, timeout)
            ended.append(self.clock.now())

        async with anyio.create_task_group() as tg:
            tg.start_soon(closing)
            await self.clock.sleep(after)
            signalled = self.clock.now()
            pipeline.shorten(signalled + grace)
        if ended[0] > signalled:
            took = ended[0] - signalled
            assert took <= grace + BACKEND_CLOSE_GRACE_S + 1e-6, f"{took} s after the SIGTERM"

    def note_end(self, run: str, inc: Incarnation) -> None:
        """A life closed: its end record must reach every backend that has it delivered or
        on disk (one left in memory, the disk failing, is lost with the life, as a record)."""
        self.models[run].ends[inc.pipeline.token] = {
            lane.name for lane in inc.pipeline.lanes if lane.log.ends_memory == 0
        }

    def _bury(self, run: str, inc: Incarnation) -> None:
        """What an incarnation that ends takes with it: per backend, the records neither
        done nor on disk (in memory, or still in the ingress). Heads of lanes may be sent
        again by the next life: their batches may arrive twice."""
        model = self.models[run]
        for lane in inc.pipeline.lanes:
            on_disk: set[int] = set()
            for entry in lane.log.entries:
                if entry.token is None and entry.segment is not None:
                    on_disk.update(range(entry.first, entry.seq + 1))
            if lane.log.entries and lane.log.entries[0].batch is not None:
                heads = model.heads_at_crash.setdefault(lane.name, set())
                heads.add(lane.log.entries[0].batch.key.split(".")[0])
            backend = self.backends[lane.name]
            arrived = {u for u, _ in backend.arrivals.get(run, [])}
            metadata_arrived = backend.metadata_arrivals.get(run, set())
            artifacts_arrived = backend.artifact_arrivals.get(run, set())
            sources_arrived = backend.sources.get(run, set())
            lost = model.lost.setdefault(lane.name, set())
            for seq, written in enumerate(inc.accepted):
                if seq in on_disk or seq <= lane.log.acked:
                    continue
                if written.uid is not None and written.uid in arrived:
                    continue  # stored before the end, though the lane had not finished it
                if written.key is not None and written.index in metadata_arrived:
                    continue
                if written.artifact is not None and f"/p/{written.index}" in artifacts_arrived:
                    continue
                if written.source is not None and written.source in sources_arrived:
                    continue
                lost.add(written.index)

    # -- invariants -----------------------------------------------------------------------------
    def check(self) -> None:
        """What must hold after every step."""
        for run, inc in self.runs.items():
            for lane in inc.pipeline.lanes:
                log = lane.log
                assert log.memory >= 0 and log.disk >= 0, (lane.name, log.memory, log.disk)
                counted = log.memory + log.disk + lane.delivered + lane.dropped
                counted += inc.pipeline.waiting()
                assert counted == len(inc.accepted) + log.adopted, (
                    f"{lane.name}/{run}: memory {log.memory} + disk {log.disk} + delivered "
                    f"{lane.delivered} + dropped {lane.dropped} + ingress {len(inc.ingress)} "
                    f"!= accepted {len(inc.accepted)} + adopted {log.adopted}"
                )
                in_memory = sum(e.records for e in lane.log.entries if e.segment is None)
                on_disk = sum(e.records for e in lane.log.entries if e.segment is not None)
                assert (lane.log.memory, lane.log.disk) == (in_memory, on_disk), lane.name
            # The report says the same: pending counts the ingress once per backend.
            report = inc.pipeline.report()
            total = report.delivered + report.pending + report.spooled + report.dropped
            assert total == sum(len(inc.accepted) + lane.log.adopted for lane in inc.pipeline.lanes)
            self.check_order(run)

    def check_isolated(self, run: str) -> None:
        """After flush(None) of a run no fault is waiting for: everything it accepted is done,
        whatever the other run's faults (the backends are shared)."""
        inc = self.runs[run]
        for lane in inc.pipeline.lanes:
            assert not lane.log.entries or lane.failure, (
                f"{lane.name}/{run}: {len(lane.log.entries)} entries left after a healthy flush"
            )

    def check_order(self, run: str) -> None:
        """Per backend, points arrive (first arrivals) in call order, and a point arrives
        twice only if its batch was written in part before a failure, or was the head of
        the lane when the process crashed."""
        index = {w.uid: w.index for w in self.models[run].writes if w.uid is not None}
        origin = {w.uid: w.origin for w in self.models[run].writes if w.uid is not None}
        for name, backend in self.backends.items():
            # A life's end record arrives after every point that life accepted: each point
            # whose batch it cut arrived (first) before the end did.
            first: dict[str, tuple[int, str]] = {}
            for place, (u, key) in enumerate(backend.arrivals.get(run, [])):
                first.setdefault(u, (place, token_of(key)))
            for token, at in backend.end_arrivals.get(run, []):
                late = [u for u, (place, t) in first.items() if t == token and place >= at]
                assert not late, f"{name}: the end of {token} arrived before {late[:3]}"
            seen: set[str] = set()
            last: dict[int, int] = {}  # per process: a fork's writes have their own order
            allowed = backend.tainted | self.models[run].heads_at_crash.get(name, set())
            for u, key in backend.arrivals.get(run, []):
                if u in seen:
                    assert key in allowed or self._ack_lost(key), (
                        f"{name}: {u} of batch {key} arrived twice"
                    )
                    continue
                seen.add(u)
                assert index[u] > last.get(origin[u], -1), f"{name}: {u} arrived out of order"
                last[origin[u]] = index[u]

    def _ack_lost(self, key: str) -> bool:
        """Whether the batch of ``key`` (time-token-seq) was delivered while its pipeline
        could not write its ack: then a replay may send it again."""
        _, token, seq = key.split("-")
        return self.io.failed_acks.get(token, -1) >= int(seq)

    def check_final(self) -> None:
        """After everything healed, replayed and closed: each backend has every point the
        run accepted, but the refused ones and those a crash took from memory; metadata ends
        at the last surviving write of each key; counts add up."""
        for run, model in self.models.items():
            for name, backend in self.backends.items():
                lost = model.lost.get(name, set())
                expected = {
                    w.uid for w in model.writes
                    if w.uid is not None
                    and w.index not in lost
                    and (run, w.uid) not in backend.poison
                }
                got = {u for u, _ in backend.arrivals.get(run, [])}
                missing = expected - got
                assert not missing, f"{name}/{run}: {len(missing)} lost: {sorted(missing)[:5]}"
                extra = got - {w.uid for w in model.writes}
                assert not extra, f"{name}/{run}: points never written: {sorted(extra)[:5]}"
                refused = {u for u in got if (run, u) in backend.poison}
                assert not refused, f"{name}/{run}: refused points stored: {refused}"
                last: dict[str, int] = {}
                for w in model.writes:
                    if w.key is not None and w.index not in lost:
                        last[w.key] = w.index
                stored = backend.metadata.get(run, {})
                for key, value in last.items():
                    assert stored.get(key) == value, (
                        f"{name}/{run}: metadata {key}={stored.get(key)}, last write {value}"
                    )
                last_path: dict[str, str] = {}
                for w in model.writes:
                    if w.artifact is not None and w.index not in lost:
                        last_path[w.artifact] = f"/p/{w.index}"
                assert backend.artifacts.get(run, {}) == last_path, f"{name}/{run}: artifacts"
                surviving = {
                    w.source for w in model.writes if w.source is not None and w.index not in lost
                }
                assert backend.sources.get(run, set()) >= surviving, f"{name}/{run}: sources"
                ended = {token for token, _ in backend.end_arrivals.get(run, [])}
                due = {token for token, names in model.ends.items() if name in names}
                assert due <= ended, f"{name}/{run}: end records lost: {sorted(due - ended)}"
            inc = self.runs[run]
            for lane in inc.pipeline.lanes:
                left = len(lane.log.entries)
                assert not left, f"{lane.name}/{run}: {left} entries left"
        leftover = [p for p in self.spool_dir.rglob("*.seg") if "quarantine" not in p.parts]
        assert not leftover, f"segments left in the spool: {leftover[:3]}"
