"""``AppRun``: what a job calls to record its run.

Writes (``add_metadata``, ``add_artifact``, ``add_source``, ``log_metric``, ``log_metrics``)
check their input, stamp the time and append one tuple to an in-memory buffer: they never
block, do no I/O and never touch an event loop. The process's tracker loop drains the buffer
in the background (see :mod:`async_tracker.pipeline`). Reads, the run's and its backends'
own, first wait for this process's pending writes (see :mod:`async_tracker.own_writes`), so
they see the caller's own writes.

Example::

    from async_tracker import AppRun
    from async_tracker.backend.memory import InMemoryTracker

    with AppRun("my-run", [InMemoryTracker()]) as run:
        run.add_metadata(lr=0.01, model="resnet")
        for step in range(100):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
    # close() on exit delivered everything, or said what it could not.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import functools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex, TypeVar

from async_tracker.adapters import TrackerLike, as_async
from async_tracker.base import (
    RUN_READS,
    AsyncTrackerBase,
    Checked,
    CloseReason,
    TrackerBase,
    backend_name,
)
from async_tracker.clock import HybridClock
from async_tracker.errors import DeliveryError, TrackerClosedError
from async_tracker.factory import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    UNDEFINED_JOB_ID,
    build_named_trackers,
    factories_from_environ,
    trackers_config_from_environ,
)
from async_tracker.ingress import (
    ARTIFACT,
    METADATA,
    ROOM_WAIT_S,
    SOURCE,
    Ingress,
    Record,
    Sink,
    wait_for_room,
    wait_for_writers,
)
from async_tracker.own_writes import settle, store_key
from async_tracker.pipeline.overflow import HotPath
from async_tracker.pipeline.run_pipeline import RunPipeline
from async_tracker.records import (
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    check_artifact,
    check_metadata,
    check_metric,
    check_name,
    check_source,
)
from async_tracker.report import BackendStatus, FlushReport, TrackerStatus
from async_tracker.retry import RetryPolicy
from async_tracker.run_config import RunConfig
from async_tracker.runtime.ending import FINISHED, Ending, decide, exception_now
from async_tracker.runtime.loop import wait_future
from async_tracker.runtime.process import runtime
from async_tracker.settings import (
    CLOSE_FENCE_S,
    CLOSE_SLACK_S,
    OverflowPolicy,
    RunOptions,
    read_timeout,
)
from async_tracker.spool import check_run_id, default_spool_dir, has_spool
from async_tracker.system_metrics import SystemMetrics
from async_tracker.tags import NOTE_KEY, check_note, split_metadata, tag_metadata

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The wall clock that stamps records (seconds since the epoch): a module global, which the
# hot path calls for less than an attribute of the run costs. Tests set it with monkeypatch.
_wall_clock: Callable[[], float] = time.time
# The process's metadata clock (one per process: every run's writes share it, so a run
# reopened after a clock step back still writes after what it wrote before).
_metadata_clock = HybridClock()

# How many metric names a run remembers as checked (its hot path skips their checks).
MAX_KNOWN_METRIC_NAMES = 100_000
Backend = TrackerBase | AsyncTrackerBase | TrackerLike


@dataclass
class AppRunTrackableSource:
    """A source of a run at the ``AppRun`` level (torchx's dataclass)."""

    parent: AppRun
    artifact_name: str | None


class RunState(enum.Enum):
    """Where a run is in its life (:attr:`AppRun.state`)."""

    NEW = "new"  # nothing started yet: the first write starts the run's pipeline
    OPEN = "open"  # its pipeline runs: writes, flushes and reads go on
    CLOSING = "closing"  # close() has begun: writes and flushes raise TrackerClosedError
    CLOSED = "closed"  # close() has its report (later closes return it)


# The sinks a run's writes go to besides the ingress (see ingress.Sink): swapping the sink
# keeps every state check off the hot path. The sink follows the state: NEW, _FirstWrite
# (or _Discard, _Nowhere for a run without backends); OPEN, the ingress (an overload's own
# while overloaded); CLOSING and CLOSED, _Closed.


class _Discard:
    """The sink of a run with no backend (``<UNDEFINED>`` job id): writes go nowhere."""

    def append(self, record: Record) -> None:
        pass

    def extend(self, records: list[Record]) -> None:
        pass


_DISCARD = _Discard()


class _Nowhere(_Discard):
    """The first write of the environment's run without a job id, or without a tracker:
    warns once, then discards (this write and every later one)."""

    def __init__(self, run: AppRun) -> None:
        self._run = run

    def append(self, record: Record) -> None:
        self._run._sink = _DISCARD
        if self._run.id == UNDEFINED_JOB_ID:
            logger.warning(
                "async_tracker: AppRun.run_from_env() has no %s, so its writes are not "
                "recorded; set it (torchx does), or use async_tracker.init(project) for a run "
                "in ./tracker_runs",
                ENV_TORCHX_JOB_ID,
            )
            return
        logger.warning(
            "async_tracker: %s is set (%s) but no tracker is configured, so "
            "AppRun.run_from_env()'s writes are not recorded (as in torchx); set %s (and "
            "TORCHX_TRACKER_<NAME>_CONFIG), or [torchx:tracker] in .torchxconfig where the job "
            "is launched (torchx run, async-tracker run), or use async_tracker.init(project) "
            "for a run in ./tracker_runs",
            ENV_TORCHX_JOB_ID, self._run.id, ENV_TORCHX_TRACKERS,
        )  # fmt: skip

    def extend(self, records: list[Record]) -> None:
        self.append(())


class _FirstWrite:
    """The sink until the first write, which starts the run's pipeline (and with it sets the
    run's sink), then writes to the run's sink as it is now: the ingress, or, if a close got
    in first, the closed run's, which raises."""

    def __init__(self, run: AppRun) -> None:
        self._run = run

    def append(self, record: Record) -> None:
        self._run._ensure_started()
        self._run._sink.append(record)

    def extend(self, records: list[Record]) -> None:
        self._run._ensure_started()
        self._run._sink.extend(records)


class _Closed:
    """The sink of a closed run: every write raises."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id

    def append(self, record: object) -> None:
        raise TrackerClosedError(f"run {self._run_id!r} is closed; it accepts no more writes")

    def extend(self, records: object) -> None:
        self.append(records)


class AppRun:
    """One run of a job, recording to one or more backends without blocking the caller.

    Args:
        id: the run id (torchx: the job's app handle).
        backends: ``TrackerBase`` and ``AsyncTrackerBase`` objects, mixed freely.
        flush_interval: seconds between flushes while records wait.
        batch_size: records per batch; a full batch is flushed within the flusher's wake
            interval (50 ms) whatever ``flush_interval`` says.
        max_buffered: records the run holds in memory (its buffer and the fullest lane)
            before the overflow policy acts.
        overflow: past ``max_buffered``, ``"spool"`` (default) writes records to the spool,
            ``"block"`` makes writes wait for room (at most ``overflow_timeout`` seconds per
            overload, then spools), ``"drop_oldest"`` drops the oldest metrics in memory.
        spool_dir, durable: where and whether to write records to local disk first.
        close_timeout: seconds ``close()`` and the exit hook wait at most.
        retry: how each backend's lane retries transient failures.
        strict: ``close()`` raises :class:`DeliveryError` when its report is not ok.
        system_metrics: seconds between samples of CPU, memory and GPU use, logged under
            ``system/`` (see :mod:`async_tracker.system_metrics`); None or 0: none.
        heartbeat_s: seconds between heartbeats of the live run in its stores (default 30;
            0: none): a run that dies without ending (SIGKILL) then reads as crashed.

    Closing seals the run's end record (finished, failed or killed) after everything it
    accepted; it is delivered, or spooled, like the rest. How the run ended is decided in one
    place, :mod:`async_tracker.runtime.ending`, from what ended it: a run left by an
    exception, Ctrl-C or SIGTERM, or closed at exit after one, records the reason and, when it
    did not finish, the exception's type and message. A run that never wrote anything never
    started its pipeline: its close sends nothing (no store holds such a run).
    """

    def __init__(
        self,
        id: str,
        backends: Iterable[Backend] = (),
        *,
        flush_interval: float | None = None,
        batch_size: int | None = None,
        max_buffered: int | None = None,
        spool_dir: str | None = None,
        durable: bool | None = None,
        overflow: OverflowPolicy | None = None,
        overflow_timeout: float | None = None,
        close_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        strict: bool | None = None,
        system_metrics: float | None = None,
        heartbeat_s: float | None = None,
        options: RunOptions | None = None,
        _backend_names: Sequence[str] | None = None,
        _owns_backends: bool = False,
        _read_only: bool = False,
        _last_steps: Mapping[str, int] | None = None,
        _life_start: float = 0.0,
        _life: int = 0,
        _stamp_floor: int = 0,
        _replay: bool = False,
    ) -> None:
        check_name(id, "run id")
        check_run_id(id)
        self.id = id
        self.backends: list[Backend] = list(backends)
        given = {
            "flush_interval": flush_interval,
            "batch_size": batch_size,
            "max_buffered": max_buffered,
            "spool_dir": spool_dir,
            "durable": durable,
            "overflow": overflow,
            "overflow_timeout": overflow_timeout,
            "close_timeout": close_timeout,
            "retry": retry,
            "strict": strict,
            "system_metrics": system_metrics,
            "heartbeat_s": heartbeat_s,
        }
        base = options or RunOptions()
        self.options = RunOptions(
            **{**base.__dict__, **{k: v for k, v in given.items() if v is not None}}
        )
        self._async_backends = [as_async(b) for b in self.backends]
        # The store of each backend, as reads name it (see own_writes.py): a read of one of
        # them waits for this run's writes there.
        self._stores: list[Hashable] = [store_key(b) for b in self._async_backends]
        self._names = _unique_names(
            list(_backend_names)
            if _backend_names
            else [backend_name(b) for b in self._async_backends]
        )
        self._owns_backends = _owns_backends
        # Whether close seals the run's end record. Not for a replay of a spool (sync), which
        # delivers what runs recorded, their end records included; nor for another run seen
        # for reading (its own job ends it).
        self._ends_run = not (_replay or _read_only)
        # A resumed run's last step of each metric: step-less points continue after it.
        self._last_steps = dict(_last_steps or {})
        self._life_start = _life_start
        self._life = _life
        # A resumed run's metadata is stamped after everything its earlier lives stored,
        # whatever this machine's clock says (a requeued job on another host).
        _metadata_clock.observe(_stamp_floor)
        # The backends that check records at the call site (see AsyncTrackerBase.validate).
        self._validators = [
            b.validate
            for b in self._async_backends
            if type(b).validate is not AsyncTrackerBase.validate
        ]
        # Metric names that passed every check: the hot path's set lookup. Bounded, so that
        # a run logging ever new names keeps its memory (those take the slow path).
        self._metric_names: set[str] = set()
        self._ingress = Ingress()
        # Reentrant: the SIGTERM handler closes runs on the main thread, which may be holding
        # this lock at that moment (in its first write, or in close()).
        self._start_lock = threading.RLock()
        self._pipeline: RunPipeline | None = None
        self._close_report: FlushReport | None = None
        # The flusher's close, once started: a second close() (another thread, the exit hook,
        # a close() after a cancelled aclose()) waits for it instead of closing again.
        self._close_future: concurrent.futures.Future[FlushReport] | None = None
        # Set under the start lock when close begins (and never unset). With _pipeline and
        # _close_report, what `state` reads: no field of its own to keep in step with them.
        self.closed = False
        # What a framework last reported of the work done in this run (report_ending): how a
        # close that nothing else decides ends it (see runtime.ending.decide).
        self._reported: Ending | None = None
        # Whether this process inherited the run from the parent it was forked from (see
        # begin_close's process_end).
        self._forked = False
        # Popped by the first close report that leaves records behind (list.pop is atomic,
        # also against a SIGTERM handler's close on top of this thread's): said once.
        self._summary_due: list[None] = [None]
        # Where writes go now (see ingress.Sink): the hot path calls self._sink.append (or
        # extend, for log_metrics: all points of one call in one C call, so that a
        # KeyboardInterrupt cannot keep some of them and lose the rest). Until the first
        # write the sink starts the flusher; after close() it raises.
        self._sink: Sink = _FirstWrite(self) if self._async_backends else _DISCARD
        # The bound at the door (see ingress.py): the hot path compares the deque's length
        # with max_buffered, one comparison; past it the write waits for the tracker loop to
        # take records out, on its own thread, whether or not the loop got the GIL lately.
        # The packed ingress counts the deque too, so that the two together stay within
        # max_buffered while writes go there; after an overload (it ends at a quarter), the
        # quarter still packed drains while the deque fills: at most a quarter more then.
        self._queue = self._ingress.deque
        self._room = self.options.max_buffered
        self._overrun_due: list[None] = [None]  # said once (list.pop is atomic)
        # The ingress's count of records taken when a wait for room ran out (see
        # _wait_for_room; -1: none did); a plain int that racing writers may each set: any
        # of their values does.
        self._stuck_taken = -1
        if not _backend_names or _owns_backends:
            # Not for the read-only runs _relative() makes: the run they came from said it.
            self._warn_skipped_metrics()
        # Built before the run is registered anywhere: without psutil it raises here.
        self._system = (
            SystemMetrics(self, self.options.system_metrics)
            if self.options.system_metrics and self._async_backends and not _read_only
            else None
        )
        process = runtime()
        process.register(self)
        if self._async_backends:
            process.install_sigterm_handler()
            # Start the tracker loop now (importing anyio's backend takes tens of ms), so
            # that the first write costs what every other write costs.
            process.flusher()
            if self._system is not None:
                self._system.start(process.loop.submit)
            if not _read_only and has_spool(
                self.options.spool_dir or default_spool_dir(), self.id
            ):
                # An earlier process left records of this run on disk: replay them now,
                # not at the first write, which may never come.
                self._ensure_started()

    # -- torchx's construction from the environment ----------------------------------------
    @staticmethod
    def run_from_env() -> AppRun:
        """The run of this job, from the environment torchx's runner sets; one per process.

        ``TORCHX_JOB_ID`` is the run id (default ``<UNDEFINED>``, whose writes go nowhere),
        ``TORCHX_TRACKERS`` and ``TORCHX_TRACKER_<NAME>_CONFIG`` name and configure the
        backends (with none, the writes go nowhere too, as in torchx, and the first says so),
        ``TORCHX_PARENT_RUN_ID`` becomes a source of the run. Options come from
        ``ASYNC_TRACKER_<OPTION>`` variables.
        """
        global _env_run, _env_run_pid
        with _env_lock():
            if _env_run is None or _env_run_pid != os.getpid():
                _env_run = _build_run_from_env()
                _env_run_pid = os.getpid()
            return _env_run

    @staticmethod
    def reset_from_env(timeout: float | None = None) -> FlushReport | None:
        """Closes the :meth:`run_from_env` run and forgets it, for tests: the next
        ``run_from_env()`` builds a new run from the environment as it is then.

        The old run is closed, not dropped: its pending records are delivered within
        ``timeout`` (default: its ``close_timeout``), else spooled and counted, as ``close()``
        does; its report is returned (None when there was no run to reset). A strict run's
        :class:`DeliveryError` is raised after the run is forgotten.

        Example (a pytest fixture)::

            @pytest.fixture(autouse=True)
            def fresh_run_from_env():
                yield
                AppRun.reset_from_env(timeout=5.0)
        """
        global _env_run
        with _env_lock():
            run, _env_run = _env_run, None
        # Closed outside the lock: a close may take its whole timeout, and another thread's
        # run_from_env() meanwhile gets a new run, not this closing one.
        return None if run is None else run.close(timeout)

    def job_id(self) -> str:
        """The run id (torchx's name for it)."""
        return self.id

    def __eq__(self, other: object) -> bool:
        """Equal when the ids and the backends are, like torchx's dataclass ``AppRun``:
        ``AppRun("a", [t]) == AppRun("a", [t])``, as in the runs ``sources()`` returns."""
        if not isinstance(other, AppRun):
            return NotImplemented
        return self.id == other.id and self.backends == other.backends

    def __hash__(self) -> int:
        # The id alone: equal runs have equal ids, and backends need not be hashable.
        return hash(self.id)

    # -- writes: the hot path ----------------------------------------------------------------
    # Each write checks its input (generic checks, then every backend's validate) before it
    # keeps anything: a bad value raises here, naming its key, and nothing of the call is kept.
    def add_metadata(self, **kwargs: object) -> None:
        """Records metadata; a later value of a key replaces an earlier one.
        Values must be JSON data (dict, list, str, int, float, bool, None)."""
        self._append_metadata(check_metadata(kwargs))

    def add_tags(self, *tags: str) -> None:
        """Adds tags to the run (``run.add_tags("baseline", "v2")``); a tag it has already
        stays. A tag is 1 to 100 letters, digits, ``_``, ``.`` or ``-``, starting with a
        letter, digit or ``_``; a bad one raises ``ValueError`` naming it, and no tag of the
        call is kept. Each tag is a key of its own, so processes tagging one run at once
        keep each other's tags (see :mod:`async_tracker.tags`)."""
        metadata = tag_metadata(add=tags)
        if metadata:
            self._append_metadata(metadata)

    def remove_tags(self, *tags: str) -> None:
        """Removes tags from the run; removing a tag it does not have is no error."""
        metadata = tag_metadata(remove=tags)
        if metadata:
            self._append_metadata(metadata)

    def set_note(self, text: str) -> None:
        """Sets the run's note, a free text about it (MLflow shows it as the run's
        description); ``""`` clears it. A later note replaces an earlier one."""
        self._append_metadata({NOTE_KEY: check_note(text)})

    def _append_metadata(self, metadata: dict[str, object]) -> None:
        """The write of checked metadata (the user's, or the reserved keys of tags and the
        note): every backend's check, then one record."""
        self._validate(metadata)
        # Stamped by the process's hybrid clock: the call's wall time, never back in the
        # process (backends that many processes write order a key's writes by it).
        stamp = _metadata_clock.stamp(int(_wall_clock() * 1_000_000_000))
        self._wait_for_room()
        self._sink.append((METADATA, (metadata, stamp)))

    def add_artifact(
        self, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        """Records an artifact: a name, where it lives, and optional metadata."""
        artifact = check_artifact(name, path, metadata)
        self._validate(artifact)
        self._wait_for_room()
        self._sink.append((ARTIFACT, artifact))

    def add_source(self, source_id: str, artifact_name: str | None = None) -> None:
        """Records that this run derives from ``source_id`` (a parent run, a data set ...)."""
        source = check_source(source_id, artifact_name)
        self._validate(source)
        self._wait_for_room()
        self._sink.append((SOURCE, source))

    def log_metric(
        self, name: str, value: SupportsFloat, step: SupportsIndex | None = None
    ) -> None:
        """Records one metric point. ``value`` is anything ``float()`` takes (numpy scalars,
        0-d tensors); ``step`` defaults to the metric's previous step plus one."""
        # The common case (a name seen before, a float value, an int or no step) costs a set
        # lookup and two type checks; anything else takes the slow path, which converts,
        # checks (also with every backend's validate) or raises. The set holds only names
        # that passed the checks, so a name found in it is a str equal to one of them (a str
        # subclass passes as it is): no type check of the name. An unhashable name raises
        # TypeError in the lookup (nothing else in the block can), and the slow path says
        # what is wrong with it.
        try:
            if (
                name in self._metric_names
                and type(value) is float
                and (step is None or type(step) is int)
                and len(self._queue) < self._room
            ):
                self._sink.append((name, value, step, _wall_clock()))
                return
        except TypeError:
            pass
        name, value, step = self._check_metric(name, value, step)
        self._wait_for_room()
        self._sink.append((name, value, step, _wall_clock()))

    def log_metrics(
        self, metrics: Mapping[str, SupportsFloat], step: SupportsIndex | None = None
    ) -> None:
        """Records several metrics at one step and time. All are checked before any is kept."""
        if type(metrics) is not dict and not isinstance(metrics, Mapping):
            raise TypeError(
                f"metrics must be a mapping of name to value, got {type(metrics).__name__}"
            )
        now = _wall_clock()
        # The common case (log_metric's fast checks for every point: a known name, a float
        # value; the step an int or None) in a plain loop, no comprehension: it builds no
        # function, frame or cell per call. Any other point sends the whole call to the slow
        # path, which checks point by point; every point is checked before any is kept. An
        # unhashable name raises TypeError in the lookup, and the slow path says what it is.
        if step is None or type(step) is int:
            known = self._metric_names
            points = []
            try:
                for name, value in metrics.items():
                    if name not in known or type(value) is not float:
                        break
                    points.append((name, value, step, now))
                else:
                    if len(self._queue) >= self._room:
                        self._wait_for_room()
                    self._sink.extend(points)
                    return
            except TypeError:
                pass
        points = [
            (*self._check_metric(name, value, step), now) for name, value in metrics.items()
        ]
        self._wait_for_room()
        self._sink.extend(points)

    # What W&B and Trackio users type: run.log({...}, step=N) is log_metrics (a value that
    # is not a number raises TypeError naming its key, and nothing of the call is kept).
    log = log_metrics

    @property
    def config(self) -> RunConfig:
        """The run's params as W&B's ``run.config``: read what was recorded (``init``'s
        ``config``, ``add_metadata``) and add to it with ``run.config.update({...})`` or
        ``run.config["k"] = v`` (both are ``add_metadata``)."""
        return RunConfig(self.metadata, self.add_metadata)

    def _wait_for_room(self) -> None:
        """Past the bound, waits for the tracker loop to take records out of the ingress
        (see ingress.py, "The bound at the door"), at most ROOM_WAIT_S; a close meanwhile
        ends the wait, and the write then finds the closed run's sink. The caller fetches
        ``self._sink`` only after this returns: it writes where the run writes now."""
        queue, room = self._queue, self._room
        n = len(queue)
        if n < room or runtime().loop.in_loop_thread():
            return  # room; or the loop's own thread (system metrics), which cannot wait on itself
        taken = self._ingress.taken
        if taken == self._stuck_taken:
            # A wait ran out and the loop has taken nothing since (it is stuck: an async
            # backend blocking it): not a second per write. The waits resume once it takes
            # any: a loop slowed down, not stuck, still holds the bound within what the
            # writers add between two of its takes.
            return
        if wait_for_room(lambda: len(queue) >= room, lambda: self.closed):
            self._stuck_taken = -1
        else:
            self._stuck_taken = taken
            self._overrun()

    def _overrun(self) -> None:
        try:
            self._overrun_due.pop()
        except IndexError:
            return  # said already
        logger.warning(
            "async_tracker: run %r: the tracker loop took no records for %.0f s; writes go "
            "on past max_buffered meanwhile", self.id, ROOM_WAIT_S,
        )

    def _check_metric(
        self, name: object, value: object, step: object
    ) -> tuple[str, Any, int | None]:  # the value: a float or a DeferredValue
        """log_metric's slow path: converts or raises naming the metric; a name not seen
        before is also checked by every backend's ``validate``, then known. A CUDA tensor
        becomes a DeferredValue, read later on the tracker loop (see tensors.py)."""
        key, number, index = check_metric(name, value, step)
        if key not in self._metric_names:
            # A deferred value is not known yet: backends check the name (values are all
            # floats, which the generic checks cover).
            known = number if type(number) is float else 0.0
            self._validate(TrackerMetric(key, known, index or 0, 0.0))
            if len(self._metric_names) < MAX_KNOWN_METRIC_NAMES:
                self._metric_names.add(key)
        return key, number, index

    def _validate(self, record: Checked) -> None:
        for validate in self._validators:
            validate(record)

    # -- lifecycle ----------------------------------------------------------------------------
    def _ensure_started(self) -> RunPipeline:
        with self._start_lock:
            if self._pipeline is None:
                if self.closed:
                    raise TrackerClosedError(f"run {self.id!r} is {self.state.value}")
                process = runtime()
                flusher = process.flusher()
                self._pipeline = RunPipeline(
                    self.id,
                    self._ingress,
                    list(zip(self._names, self._async_backends)),
                    self.options,
                    owns_backends=self._owns_backends,
                    set_hot=self._set_hot,
                    last_steps=self._last_steps,
                    life_start=self._life_start,
                    life=self._life,
                    io=process.spool_io,
                    ends_run=self._ends_run,
                )
                # Registration runs on the loop (the lanes become its tasks); we do not wait
                # for it: records appended meanwhile simply wait in the buffer.
                flusher.loop.submit(flusher.add, self._pipeline)
                self._sink = self._ingress.sink
                # Held until closed: a run dropped without close() still has records to
                # deliver, and the exit hook must find it.
                process.hold(self)
                # Reads of its stores wait for its writes from now until its close is over.
                process.writers.add(self)
            return self._pipeline

    def _set_hot(self, mode: HotPath) -> None:
        """The pipeline's switch of the hot path into and out of an overload (on the tracker
        loop). Under the lock, so that it never undoes close()'s switch to the closed sink;
        then it waits until no writer still uses the old path (see ingress.py)."""
        with self._start_lock:
            pipeline = self._pipeline
            if self.closed or pipeline is None:
                return
            if mode == "block":
                self._sink = pipeline.blocking
            elif mode == "packed":
                self._sink = pipeline.packed
            else:
                self._sink = self._ingress.sink
        if mode != "block" and not wait_for_writers(_WRITE_CODES, 1.0):
            logger.warning("async_tracker: run %r: a writer is stuck in a write", self.id)

    def _run_on_loop(
        self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None
    ) -> T:
        wait = None if timeout is None else timeout + CLOSE_SLACK_S
        return runtime().loop.call(fn, *args, timeout=wait)

    def flush(self, timeout: float | None = None) -> FlushReport:
        """Delivers everything written so far, waiting at most ``timeout`` seconds (None:
        until each backend has delivered or exhausted its retries)."""
        self._check_open()
        if self._pipeline is None:
            return self._idle_report()
        try:
            return self._run_on_loop(self._pipeline.flush, timeout, timeout=timeout)
        except concurrent.futures.TimeoutError:
            return FlushReport.from_status(self.status(), timed_out=True)

    async def aflush(self, timeout: float | None = None) -> FlushReport:
        """``flush()`` for async callers: awaits the tracker loop, never blocks this loop."""
        self._check_open()
        if self._pipeline is None:
            return self._idle_report()
        return await _await_on_tracker_loop(self._pipeline.flush, timeout)

    def _check_open(self) -> None:
        # After close() the lanes are stopped: a flush would wait for lanes that no longer
        # run (forever, when close() left a batch behind a hung backend).
        if self.closed:
            raise TrackerClosedError(
                f"run {self.id!r} is {self.state.value}; flush() needs an open run"
            )

    def report_ending(self, ending: Ending | None) -> None:
        """What a framework says of the work it last did in this run: None when it ended
        well, else how it ended (``runtime.ending.ending_of(exc)``, or a failure whose
        exception is unknown). The integrations call it; a later report replaces an earlier
        one. A close that nothing else decides (no reason given, no exception at hand, no
        SIGTERM: the exit hook's after a training that raised and was caught, a ``with``
        block left normally) ends the run as the last report says."""
        self._reported = ending

    def begin_close(
        self,
        deadline: float,
        reason: CloseReason | Ending | None = None,
        exc: BaseException | None = None,
        *,
        process_end: bool = False,
    ) -> Callable[[float], FlushReport]:
        """Begins closing the run by ``deadline`` (``time.monotonic()`` seconds), or moves
        the deadline of the close under way earlier (never later); returns a function that
        waits for the report until a given ``time.monotonic()`` deadline (plus a slack), and
        answers with the state then if the close is not over. Split so that the process's
        exit and SIGTERM can close every run at once. The run's ending is decided from
        ``reason`` (named by the caller), ``exc`` (the exception at hand) and what was
        reported (see :func:`~async_tracker.runtime.ending.decide`); it counts only for the
        first close.

        ``process_end``: the runtime closes the run because this process ends (exit,
        SIGTERM). In a forked child (a ``multiprocessing`` pool's or a DataLoader's worker),
        the run it inherited is its parent's: the child ends its own share as finished, and
        the run ends as the process that opened it says (a pool that terminates its workers
        by SIGTERM at its exit must not make the job's run killed). Code in the child that
        closes the run itself (a framework's rank forked to train) decides as anywhere."""
        if self._system is not None:
            self._system.stop()
        with self._start_lock:
            self.closed = True
            self._sink = _Closed(self.id)
            pipeline = self._pipeline
        timeout = max(0.0, deadline - time.monotonic())
        if pipeline is not None and self._close_future is None:
            # Writers blocked by the block policy give up now; then wait until no thread is
            # inside a write (one may have fetched the old append just before the swap), so
            # that the final drain sees every write that returned normally.
            pipeline.seal()
            # Bounded: at least a moment (a writer needs only its next turn at the GIL), at
            # most a second; within close()'s slack even for close(timeout=0).
            if not wait_for_writers(_WRITE_CODES, min(max(timeout, 0.1), 1.0)):
                logger.warning("async_tracker: run %r: a writer is stuck in a write", self.id)
        runtime().release(self)
        pipeline = self._pipeline
        if self._close_report is not None or pipeline is None:
            report = self._close_report or self._idle_report()
            self._close_report = report
            return lambda _: report
        loop = runtime().loop
        with self._start_lock:
            future = self._close_future
            if future is None:
                forked = process_end and self._forked
                ending = FINISHED if forked else decide(reason, exc, self._reported)
                # What ended a run that did not finish is metadata, stamped by the process's
                # metadata clock as a write is: a later life's ending wins over an earlier
                # one's whatever the clocks did. (The wall clock of the end record's time,
                # not the records' own, which tests replace.)
                stamp = _metadata_clock.stamp(time.time_ns()) if ending.record() else 0
                timeout = max(0.0, deadline - time.monotonic())
                # The deadline itself, not only the time left: a loop that starts the close
                # late (busy, or short of the GIL) must not move it later.
                future = self._close_future = loop.submit(
                    functools.partial(pipeline.close, timeout, ending, stamp, deadline=deadline)
                )
                # Reads wait for a closing run until its close is over, then no more.
                future.add_done_callback(self._writes_ended)
            else:
                # A close under way (another thread's, the exit hook's, the one this signal
                # interrupted): it ends by the earlier deadline. Handed to the loop, which
                # owns the pipeline; a plain callback, so a loop busy in a task still takes it.
                loop.call_soon(pipeline.shorten, deadline)
        if loop.in_loop_thread():
            # Called on the tracker loop itself (from a backend's code): waiting here would
            # wait for ourselves. The close goes on; this answers with the state now, and a
            # later close() returns the final report.
            return lambda _: FlushReport.from_status(self.status(), timed_out=True)

        def wait(until: float) -> FlushReport:
            if self._close_report is not None:
                return self._close_report
            try:
                # Until the deadline; then on through the slack, unless the loop is far
                # behind (see RunPipeline.behind).
                try:
                    report = future.result(max(0.0, until - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    if pipeline.behind():
                        raise
                    report = future.result(max(0.0, until - time.monotonic()) + CLOSE_FENCE_S)
            except concurrent.futures.TimeoutError:
                # The loop is held (an async backend blocking it, or starved of the GIL):
                # answer anyway, with a report that is the outcome (see RunPipeline.fence).
                report = pipeline.fence()
            except KeyboardInterrupt:
                # Ctrl-C while this close waits: its user wants out now. The close's deadline
                # becomes now (what is undelivered goes to the spool within SPOOL_GRACE_S),
                # and the interrupt goes on: whoever waits for this close next (the exit
                # hook, a later close()) waits for that spooling only, not the timeout left.
                loop.call_soon(pipeline.shorten, time.monotonic())
                raise
            return self._closed_with(report)

        return wait

    def _closed_with(self, report: FlushReport) -> FlushReport:
        """Keeps the close's report, and says once, on stderr (the logger), what it left
        undelivered and the command that delivers it: at close(), at a ``with`` block's
        end, at exit and on SIGTERM alike."""
        self._close_report = report
        if report.spooled or report.pending or report.dropped:
            try:
                self._summary_due.pop()
            except IndexError:
                return report  # said already
            stores = {
                name: backend.store_url
                for name, backend in zip(self._names, self._async_backends)
                if backend.store_url
            }
            logger.warning("%s", report.summary(self.id, stores))
        return report

    def close(
        self, timeout: float | None = None, reason: CloseReason | Ending | None = None
    ) -> FlushReport:
        """Delivers what it can within ``timeout`` (default ``close_timeout``) and stops.

        Returns within the timeout plus half a second (``CLOSE_SLACK_S``) whatever the
        backends or the disk do; threads that keep the GIL delay it only by its own few waits
        for the GIL. The report is the outcome: its records are where it says (delivered;
        spooled, for the next start or ``async-tracker sync``; or left in memory, lost at
        exit), and nothing of the run moves them afterwards, but the ``in_doubt`` records of
        a backend call cut off at the deadline, which the backend may still store.
        Idempotent; writes afterwards raise :class:`TrackerClosedError`. ``reason`` (how the
        job ended, passed to each backend's ``end_run``: an MLflow run's status) is decided
        when not given, by the rule of :mod:`async_tracker.runtime.ending`: ``killed`` after
        SIGTERM or while a ``KeyboardInterrupt`` propagates, ``failed`` (with the exception's
        type and message) while another exception propagates or as the process exits on one,
        else what a framework last reported on the run, else ``finished``. An
        :class:`~async_tracker.runtime.ending.Ending` (an integration's, found by that rule)
        is taken as it is.
        """
        return self._close(timeout, reason, exception_now())

    def _close(
        self,
        timeout: float | None,
        reason: CloseReason | Ending | None,
        exc: BaseException | None,
    ) -> FlushReport:
        if self._close_report is not None:
            return self._close_report
        limit = self.options.close_timeout if timeout is None else timeout
        process = runtime()
        deadline = process.close_deadline(limit)
        with process.hurry():  # the GIL back promptly, for this thread and the loop
            report = self.begin_close(deadline, reason, exc)(deadline)
        self._check_strict(report)
        return report

    async def aclose(
        self, timeout: float | None = None, reason: CloseReason | Ending | None = None
    ) -> FlushReport:
        """``close()`` for async callers."""
        return await self._aclose(timeout, reason, exception_now())

    async def _aclose(
        self,
        timeout: float | None,
        reason: CloseReason | Ending | None,
        exc: BaseException | None,
    ) -> FlushReport:
        if self._close_report is not None:
            return self._close_report
        with runtime().hurry():  # the GIL back promptly, for this thread and the loop
            report = await self._aclose_within(timeout, reason, exc)
        self._check_strict(report)
        return report

    async def _aclose_within(
        self,
        timeout: float | None,
        reason: CloseReason | Ending | None,
        exc: BaseException | None,
    ) -> FlushReport:
        limit = self.options.close_timeout if timeout is None else timeout
        deadline = runtime().close_deadline(limit)
        wait = self.begin_close(deadline, reason, exc)
        future = self._close_future
        if future is None:  # nothing was started: wait() answers at once
            report = wait(deadline)
        elif self._close_report is not None:  # another closer has its answer already
            report = self._close_report
        else:
            # Awaited on the caller's loop without a thread (a worker thread there keeps a
            # nest_asyncio process from exiting), bounded as close() is. Cancelling the caller
            # abandons the wait, not the close: a later close() waits for the same future.
            pipeline = self._pipeline
            assert pipeline is not None
            try:
                # Until the deadline; then on through the slack, unless the loop is far
                # behind (see RunPipeline.behind), as close() does.
                try:
                    wait_s = max(0.0, deadline - time.monotonic())
                    report = await wait_future(future, timeout=wait_s, cancel=False)
                except concurrent.futures.TimeoutError:
                    if pipeline.behind():
                        raise
                    wait_s = max(0.0, deadline - time.monotonic()) + CLOSE_FENCE_S
                    report = await wait_future(future, timeout=wait_s, cancel=False)
            except concurrent.futures.TimeoutError:
                # The loop is held (an async backend blocking it): answer anyway, with a
                # report that is the outcome (see RunPipeline.fence).
                report = pipeline.fence()
            report = self._closed_with(report)
        return report

    # W&B's and Trackio's name for the end of a run: close() (and aclose()), with its report.
    finish = close
    afinish = aclose

    def close_finished(self) -> bool:
        """Whether close() has its report: False for an open run, and while a close is
        under way (from its first step: a signal may land anywhere in it)."""
        return self.state is RunState.CLOSED

    @property
    def state(self) -> RunState:
        """Where the run is in its life: NEW, OPEN, CLOSING or CLOSED (see :class:`RunState`).

        Read from what each step leaves behind, each set once by the step's own owner (the
        first write's pipeline, close()'s seal under the start lock, the close's report),
        never assigned apart from them: a SIGTERM handler closing runs on top of whatever
        the main thread was doing can never leave the state and those steps disagreeing."""
        if self._close_report is not None:
            return RunState.CLOSED
        if self.closed:
            return RunState.CLOSING
        return RunState.NEW if self._pipeline is None else RunState.OPEN

    def _check_strict(self, report: FlushReport) -> None:
        if self.options.strict and not report.ok:
            raise DeliveryError(f"run {self.id!r} closed without delivering everything: {report}")

    def _idle_report(self) -> FlushReport:
        return FlushReport()

    def status(self) -> TrackerStatus:
        """Per backend: buffered, in flight, delivered, dropped, retries, last error, lag.
        Reads counters only; never waits for the tracker loop."""
        if self._pipeline is None:
            # Nothing written yet: every backend, idle.
            idle = {
                name: BackendStatus(name, 0, 0, 0, 0, 0, 0, None, 0.0, True)
                for name in self._names
            }
            return TrackerStatus(self.id, self.closed, idle)
        return self._pipeline.status()

    def __enter__(self) -> AppRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The block's own exception decides (None: it ended normally, whatever an enclosing
        # except clause is handling): see runtime.ending for the rule.
        try:
            self._close(None, None, exc)
        except DeliveryError:
            if exc is None:  # a strict run's error must not replace the caller's own
                raise

    async def __aenter__(self) -> AppRun:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._aclose(None, None, exc)
        except DeliveryError:
            if exc is None:
                raise

    def forget_after_fork(self) -> None:
        """In a forked child: forget the parent's records and flusher; start anew on the
        next write. Called by the child's runtime at the fork (no other thread exists yet):
        a write must never find the parent's records."""
        self._ingress.clear()
        self._pipeline = None
        self._close_future = None
        self._summary_due = [None]
        self._system = None  # the parent samples; its task is not ours to stop
        self._reported = None  # the parent's training, not the child's
        self._forked = True
        self._start_lock = threading.RLock()
        if not self.closed and self._async_backends:
            self._sink = _FirstWrite(self)

    # -- what reads wait for (the process's writers: see own_writes.py) -----------------------
    def writes_to(self, store: Hashable) -> bool:
        """Whether one of the run's backends is ``store`` (an :func:`own_writes.store_key`)."""
        return store in self._stores

    async def settle_writes(self, store: Hashable, timeout: float | None) -> int:
        """On the tracker loop, for a read of ``store``: waits at most ``timeout`` seconds
        (None: no bound) until what the run accepted so far has reached ``store``; returns
        how many of its records have not (in memory, or spooled)."""
        pipeline = self._pipeline
        if pipeline is None:  # nothing written (or, in a forked child, nothing of its own)
            return 0
        lanes = [lane for lane, s in zip(pipeline.lanes, self._stores) if s == store]
        future = self._close_future
        if not self.closed:
            # Only the lanes of that store: a slow other backend must not delay the read.
            await pipeline.flush(timeout, lanes)
        elif future is not None:
            # Closing: the close delivers (or spools) everything by its own deadline, and
            # stops the lanes a flush would wait for; wait for it instead. Abandoned, not
            # cancelled, at the read's deadline; its errors are its caller's to see.
            with contextlib.suppress(Exception):
                await wait_future(future, timeout=timeout, cancel=False)
        backends = pipeline.status().backends
        return sum(
            b.buffered + b.in_flight + b.spooled
            for b in (backends[lane.name] for lane in lanes)
        )

    def _writes_ended(self, _: object) -> None:
        # The close's done callback (on the tracker loop, or where the close ended): its
        # report is made, nothing of the run is on its way any more.
        runtime().writers.discard(self)

    # -- reads ---------------------------------------------------------------------------------
    async def _read(self, method: str, *args: Any) -> Any:
        """``method`` of the first backend (as in torchx), on the tracker loop, once this
        process's writes there have arrived: this run's, and any other run's of this id (of
        any id for lineage, whose descendants are other runs)."""
        backend = self._async_backends[0]
        run_id = self.id if method in RUN_READS else None
        await settle(self._stores[0], run_id, read_timeout(), f"run {self.id!r}: {method}()")
        return await getattr(backend, method)(self.id, *args)

    def _read_sync(self, method: str, *args: Any) -> Any:
        if not self._async_backends:
            return None
        return self._run_on_loop(self._read, method, *args)

    async def _aread(self, method: str, *args: Any) -> Any:
        if not self._async_backends:
            return None
        return await _await_on_tracker_loop(self._read, method, *args)

    def metadata(self) -> Mapping[str, object]:
        """The run's metadata, including this process's writes so far (without the keys
        that hold its tags and note: see :meth:`tags` and :meth:`note`)."""
        return split_metadata(self._read_sync("metadata") or {})[0]

    async def ametadata(self) -> Mapping[str, object]:
        return split_metadata(await self._aread("metadata") or {})[0]

    def tags(self) -> frozenset[str]:
        """The run's tags (from the first backend), including this process's writes."""
        return split_metadata(self._read_sync("metadata") or {})[1]

    async def atags(self) -> frozenset[str]:
        return split_metadata(await self._aread("metadata") or {})[1]

    def note(self) -> str:
        """The run's note ("" when it has none), including this process's writes."""
        return split_metadata(self._read_sync("metadata") or {})[2]

    async def anote(self) -> str:
        return split_metadata(await self._aread("metadata") or {})[2]

    def artifacts(self) -> Mapping[str, TrackerArtifact]:
        """The run's artifacts by name."""
        return self._read_sync("artifacts") or {}

    async def aartifacts(self) -> Mapping[str, TrackerArtifact]:
        return await self._aread("artifacts") or {}

    def metrics(self) -> Mapping[str, Sequence[TrackerMetric]]:
        """The run's metrics, each ordered by step then time."""
        return self._read_sync("metrics") or {}

    async def ametrics(self) -> Mapping[str, Sequence[TrackerMetric]]:
        return await self._aread("metrics") or {}

    def _as_trackable(self, sources: Iterable[TrackerSource]) -> list[AppRunTrackableSource]:
        return [
            AppRunTrackableSource(self._relative(s.source_run_id), s.artifact_name)
            for s in sources
        ]

    def _relative(self, run_id: str) -> AppRun:
        """Another run seen through our backends, for reading (it owns nothing)."""
        return AppRun(
            run_id,
            self.backends,
            options=self.options,
            _backend_names=self._names,
            _read_only=True,  # a read must not replay that run's spool
        )

    def sources(self) -> list[AppRunTrackableSource]:
        """The runs and entities this run derives from, read from the first backend."""
        return self._as_trackable(self._read_sync("sources") or [])

    async def asources(self) -> list[AppRunTrackableSource]:
        return self._as_trackable(await self._aread("sources") or [])

    def children(self) -> list[AppRun]:
        """The runs that name this run as their parent (``run_ids(parent_run_id=...)``),
        this process's runs writing there included."""
        if not self._async_backends:
            return []
        backend = self._async_backends[0]
        ids = self._run_on_loop(_run_ids_of_parent, backend, self._stores[0], self.id)
        return [self._relative(i) for i in ids]

    def lineage(self) -> Lineage:
        """Parents and descendants of this run, from the first backend."""
        return self._read_sync("lineage") or Lineage(self.id)

    def plot(self, names: Sequence[str] | None = None) -> Figure:
        """The run's metric curves (``names``, default every metric) against step, one panel
        per metric, as a matplotlib ``Figure`` (a notebook shows it; ``fig.savefig(path)``
        writes it). Reads the first backend, so it works after ``close()`` too. Needs the
        ``plot`` extra."""
        from async_tracker.plotting import draw, select

        curves = {self.id: self.metrics()}
        return draw(curves, select(curves, names))

    def _warn_skipped_metrics(self) -> None:
        skipped = [n for n, b in zip(self._names, self._async_backends) if not b.supports_metrics]
        if skipped:
            logger.warning(
                "async_tracker: backends %s are plain TrackerBase objects without a metric "
                "method; they get metadata, artifacts and sources, not metrics",
                ", ".join(skipped),
            )

    def __repr__(self) -> str:
        return f"AppRun(id={self.id!r}, backends={self._names})"


# The code of every write method: close() waits until no thread runs one (see ingress.py).
# Whatever a write calls (a first start, the block policy's wait) runs below these frames.
_WRITE_CODES = frozenset(
    f.__code__
    for f in (
        AppRun.add_metadata,
        AppRun.add_tags,
        AppRun.remove_tags,
        AppRun.set_note,
        AppRun.add_artifact,
        AppRun.add_source,
        AppRun.log_metric,
        AppRun.log_metrics,
    )
)


async def _run_ids_of_parent(
    backend: AsyncTrackerBase, store: Hashable, parent: str
) -> list[str]:
    await settle(store, None, read_timeout(), f"run {parent!r}: children()")
    return list(await backend.run_ids(parent_run_id=parent))


async def _await_on_tracker_loop(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Awaits ``fn(*args)`` run on the tracker loop, from whatever loop the caller is on."""
    loop = runtime().loop
    if loop.in_loop_thread():
        return await fn(*args)
    # Starts nothing on the caller's loop (asyncio, uvloop, nest_asyncio, trio); cancelling
    # the caller cancels the work on the tracker loop.
    return await wait_future(loop.submit(fn, *args))


def _unique_names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


# run_from_env()'s lock, one per process: another thread of the parent may have held the
# parent's (building the run's backends) at a fork, and the child's copy would stay locked
# forever. dict.setdefault is atomic under the GIL: the threads of a process share one.
_env_locks: dict[int, threading.Lock] = {}
_env_run: AppRun | None = None
_env_run_pid = 0


def _env_lock() -> threading.Lock:
    return _env_locks.setdefault(os.getpid(), threading.Lock())


def _build_run_from_env() -> AppRun:
    job_id = os.environ.get(ENV_TORCHX_JOB_ID, UNDEFINED_JOB_ID)
    options = RunOptions.from_env()
    if job_id == UNDEFINED_JOB_ID:
        # Not launched as a job: no canonical id exists, so nothing is recorded (as in
        # torchx), but the first write says so instead of going nowhere silently.
        run = AppRun(job_id, [], options=options)
        run._sink = _Nowhere(run)
        return run
    config = trackers_config_from_environ()
    named = build_named_trackers(config, factories_from_environ(config))
    run = AppRun(
        job_id,
        [t for _, t in named],
        options=options,
        _backend_names=[n for n, _ in named],
        _owns_backends=True,
    )
    if not named:
        # A job with no tracker configured: nothing is recorded, as in torchx (a torchx job
        # always has a job id, and trackers only when configured), but the first write says
        # so instead of going nowhere silently.
        run._sink = _Nowhere(run)
    parent = os.environ.get(ENV_TORCHX_PARENT_RUN_ID)
    if parent:
        logger.info("async_tracker: parent run of %r is %r", job_id, parent)
        run.add_source(parent, None)
    return run


def app_run_from_env() -> AppRun:
    """torchx's module-level alias of :meth:`AppRun.run_from_env`."""
    return AppRun.run_from_env()


