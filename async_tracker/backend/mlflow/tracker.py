"""The async MLflow backend: :class:`AsyncMLflowTracker`.

Every ``MlflowClient`` call blocks, so each runs in a worker thread through
:func:`async_tracker.runtime.process.run_blocking` (the tracking URI as its endpoint): the tracker
loop never waits on the network. Only the client's public API is used (``log_batch``,
``log_artifact``, ``search_runs`` ...).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import anyio

try:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "async_tracker.backend.mlflow needs the mlflow package: "
        "pip install 'async-tracker[mlflow]'"
    ) from _exc

from async_tracker.backend.errors import leaves, map_group
from async_tracker.backend.mlflow import config
from async_tracker.backend.mlflow.errors import (
    is_param_conflict,
    is_run_not_active,
    map_error,
)
from async_tracker.backend.mlflow.mapping import (
    INT64_MAX,
    INT64_MIN,
    MLFLOW_NOTE_TAG,
    RESERVED_TAG_PREFIXES,
    TAG_ARTIFACT_PREFIX,
    TAG_HEARTBEAT,
    TAG_SOURCE_PREFIX,
    TAG_SUMMARIES,
    artifact_problems,
    artifact_tag,
    artifact_value,
    decode_object,
    dumps,
    flatten_params,
    from_stored,
    loads_tag,
    local_path,
    metadata_problems,
    metric_problem,
    mlflow_tag,
    param_problem,
    parent_tag,
    raise_problems,
    sha1,
    source_problems,
    source_tag,
    source_value,
    tag_problem,
)
from async_tracker.backend.mlflow.requests import (
    MetricEntry,
    Request,
    plan_requests,
    with_last_tags,
)
from async_tracker.backend.mlflow.runs import (
    STATUS_OF_REASON,
    RunBook,
    RunRef,
    run_id_of,
    start_order,
)
from async_tracker.backend.mlflow.summaries import (
    Tally,
    count_batch,
    stored_summaries,
    summary_tags,
    writer_token,
)
from async_tracker.base import END_PART, AsyncTrackerBase, Checked, CloseReason
from async_tracker.errors import BackendError, RecordError, TransientBackendError
from async_tracker.records import (
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    sort_points,
)
from async_tracker.runtime.process import run_blocking
from async_tracker.store.reader import RunReader
from async_tracker.store.summary import WriterSummary
from async_tracker.tags import ENDING_KEY, NOTE_KEY, TAG_KEY_PREFIX, is_reserved_key

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup

logger = logging.getLogger("async_tracker.backend.mlflow")

T = TypeVar("T")
# Attempts at a log_batch whose first-write params race with another process's (each
# attempt reads the run's params again and sends only those still missing).
PARAM_RACE_ATTEMPTS = 3
# An MLflow run's end status as the read side names it (RUNNING, SCHEDULED: not ended).
ENDING_OF_STATUS: dict[str, str] = {status: reason for reason, status in STATUS_OF_REASON.items()}


class AsyncMLflowTracker(AsyncTrackerBase):
    """Records runs in an MLflow tracking server (or a local SQLite store).

    Args:
        experiment_name: the MLflow experiment holding the runs (default: torchx's
            ``default-experiment/<user>/<host>``); created when first needed.
        tracking_uri: ``http(s)://`` server, ``sqlite:///`` file, or any URI MLflow takes
            (default: ``$MLFLOW_TRACKING_URI``, else a SQLite store under the temp directory).
        artifact_location: where MLflow puts artifacts of the experiment, when it creates it.
        name: the backend's name in reports and spool keys.
        request_concurrency: log_batch requests of one flush in flight at once.
        metadata_params: also log the first write of each metadata key as MLflow params
            (flattened as ``log_params_flat`` does), so that configs show in MLflow's
            Parameters. Metadata then has to fit MLflow's param limits too.

    Nothing is sent at construction: the experiment and the run are looked up, or created,
    on first use, in a worker thread, and retried like any write. An ``AppRun`` ends the
    MLflow runs it wrote to when it closes (:meth:`end_run`); :meth:`aclose` ends any other.

    Example::

        backend = AsyncMLflowTracker("demo", "http://127.0.0.1:5000")
        async with AppRun("my-run", [backend]) as run:
            run.log_metric("loss", 0.5)
        # the MLflow run is FINISHED here (FAILED if the block raised)
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        tracking_uri: str | None = None,
        artifact_location: str | None = None,
        *,
        name: str = "mlflow",
        request_concurrency: int = config.DEFAULT_REQUEST_CONCURRENCY,
        metadata_params: bool = True,
    ) -> None:
        if request_concurrency < 1:
            raise ValueError(f"request_concurrency must be >= 1, got {request_concurrency}")
        self.name = name
        self.experiment_name = experiment_name or config.default_experiment_name()
        self.tracking_uri = tracking_uri or config.default_tracking_uri()
        store_dir = config.default_store_dir()
        uses_default_store = tracking_uri is None and self.tracking_uri.startswith(
            f"sqlite:///{store_dir}"
        )
        if artifact_location is None and uses_default_store:
            # Next to the database, where MLflow puts them by default: ./mlruns beside
            # ./mlflow.db, whatever the working directory becomes later.
            artifact_location = str(store_dir / "mlruns")
        self.artifact_location_requested = artifact_location
        self.request_concurrency = request_concurrency
        self.metadata_params = metadata_params
        config.configure_http_client()
        if uses_default_store:
            store_dir.mkdir(parents=True, exist_ok=True)
        # Built here, on the caller's thread, not lazily in a worker: the first write may
        # happen in the exit hook, when Python refuses the imports and atexit registrations
        # MLflow makes on first use. No request is sent (a SQLite store is opened, though).
        self.client: Any = MlflowClient(tracking_uri=self.tracking_uri)
        self.runs = RunBook(self.client, self.experiment_name, artifact_location)
        # The store: a server and an experiment in it (where a batch's parts were stored).
        self.store_id = f"{self.tracking_uri}#{self.experiment_name}"
        self._checked_metric_names: set[str] = set()
        # This process's summary of each (MLflow run, writer token) it writes (see
        # summaries.py): touched by write_batch's coroutine (on the tracker loop under an
        # AppRun), never by the worker threads, each behind its own lock. Keyed by the MLflow
        # run, so that a run deleted and made again starts from nothing.
        self._tallies: dict[tuple[str, str], Tally] = {}
        # The writer token of this process's direct calls (add_metadata ... without an
        # AppRun), by pid: a forked child is another writer.
        self._direct_tokens: dict[int, str] = {}

    def __repr__(self) -> str:
        return (
            f"AsyncMLflowTracker(experiment_name={self.experiment_name!r}, "
            f"tracking_uri={self.tracking_uri!r})"
        )

    # -- the backend contract -----------------------------------------------------------------
    def validate(self, record: Checked) -> None:
        """Raises ``ValueError`` naming the key when MLflow would refuse ``record``: a name
        over 250 characters or with characters MLflow refuses, a tag value over 8000
        characters (metadata as JSON, an artifact's or a source's record), a reserved tag
        (``mlflow.*``, ``async_tracker.*``), metadata whose params would break MLflow's param
        limits (6000 characters per value), a step beyond 64 bits, an artifact with a local
        path whose name is not a relative path MLflow can upload to."""
        if isinstance(record, TrackerMetric):
            problem = metric_problem(record)
            raise_problems([problem] if problem else [])
        elif isinstance(record, TrackerArtifact):
            raise_problems(artifact_problems(record))
        elif isinstance(record, TrackerSource):
            raise_problems(source_problems(record))
        else:
            raise_problems(metadata_problems(record, params=self.metadata_params))

    def map_error(self, exc: BaseException) -> BaseException:
        """What the MLflow client raised, as transient, backend or record error (see
        :func:`async_tracker.backend.mlflow.errors.map_error`)."""
        return map_error(exc)

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        """Ends the MLflow run of ``run_id`` if this process wrote to it: FINISHED when the
        last writing process ends it cleanly, FAILED or KILLED at once (see
        :mod:`async_tracker.backend.mlflow.runs`). A run already FAILED or KILLED keeps that
        status."""
        if run_id in self.runs.writing():
            await self._blocking("set_terminated", self.runs.end, run_id, reason)

    async def aclose(self, reason: CloseReason = "finished") -> None:
        """Ends, with ``reason``, every MLflow run this process wrote to and has not ended
        yet. Idempotent; writes afterwards still land (and start the run again)."""
        errors: list[BaseException] = []
        for run_id in self.runs.writing():
            try:
                await self.end_run(run_id, reason)
            except BackendError as exc:
                errors.append(exc)
                logger.warning(
                    "async_tracker: could not end MLflow run of %r as %s: %s", run_id, reason, exc
                )
        if errors:
            raise errors[0]

    async def __aenter__(self) -> AsyncMLflowTracker:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose("finished" if exc is None else "failed")

    # -- blocking calls: in worker threads ------------------------------------------------------
    async def _blocking(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread; whatever it raises leaves as a BackendError."""

        def call() -> T:
            try:
                return fn(*args)
            except BackendError:
                raise
            except Exception as exc:
                raise map_error(exc, what) from exc

        return await run_blocking(call, endpoint=self.tracking_uri)

    async def heartbeat(self, run_id: str, interval_s: float) -> None:
        """Tags the run ``async_tracker.heartbeat`` with the time and the interval: one
        request, only for a run this process writes to (a heartbeat creates no run)."""
        if run_id in self.runs.writing():
            await self._blocking("set_tag", self._heartbeat_sync, run_id, interval_s)

    def _heartbeat_sync(self, run_id: str, interval_s: float) -> None:
        ref = self.runs.for_writing(run_id)
        beat = dumps({"time": time.time(), "interval_s": interval_s})
        self.client.set_tag(ref.uuid, TAG_HEARTBEAT, beat)

    def _end_sync(self, run_id: str, reason: CloseReason, end_time: float | None) -> None:
        """Ends ``run_id``'s MLflow run as a writer of it: this process may not have written
        to it before (a sync delivering a job's end record), and only writers end runs."""
        self.runs.for_writing(run_id)
        self.runs.end(run_id, reason, end_time)

    def _log_batch_sync(self, run_id: str, request: Request, first_params: bool) -> None:
        """One log_batch request. With ``first_params``, its params are first writes of
        metadata keys: those the run has already (from an earlier write, or another process)
        are left out, since MLflow params are immutable and the tag holds the latest value."""
        ref = self.runs.for_writing(run_id)
        params = request.params
        for attempt in range(PARAM_RACE_ATTEMPTS):
            if first_params and params:
                params = self._new_params(ref, request.params)
            if not (params or request.tags or request.metrics):
                return
            try:
                self.client.log_batch(
                    ref.uuid,
                    metrics=[Metric(k, v, ms, step) for k, v, ms, step in request.metrics],
                    params=[Param(k, v) for k, v in params],
                    tags=[RunTag(k, v) for k, v in request.tags],
                )
                break
            except Exception as exc:
                if is_run_not_active(exc):
                    # Our run was deleted (by hand, or as the loser of a fallback creation
                    # race): look it up again on the retry.
                    self.runs.forget(run_id, ref.uuid)
                    raise TransientBackendError(
                        f"MLflow run {ref.uuid} of {run_id!r} is deleted; looking it up again"
                    ) from exc
                if not (first_params and params and is_param_conflict(exc)):
                    raise
                # Another process logged one of these params in between: read them again.
                ref.params = None
                if attempt == PARAM_RACE_ATTEMPTS - 1:
                    raise TransientBackendError(
                        f"MLflow params of run {run_id!r} keep changing under us"
                    ) from exc
        if ref.params is not None:
            ref.params.update(params)

    def _new_params(self, ref: RunRef, params: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        if ref.params is None:  # read once per process (and again after a race)
            ref.params = dict(self.client.get_run(ref.uuid).data.params)
        known = ref.params
        return [(k, v) for k, v in params if k not in known]

    def _upload_sync(self, run_id: str, art: TrackerArtifact) -> None:
        path = local_path(art.path)
        assert path is not None
        if not os.path.exists(path):
            logger.warning(
                "async_tracker: artifact %r of run %r: %r is not a file or directory here; "
                "recorded without upload", art.name, run_id, art.path,
            )
            return
        ref = self.runs.for_writing(run_id)
        # A file goes to <name>/<file name>, a directory to <name>/<directory name>/...;
        # uploading again (a retry, a replay) overwrites.
        self.client.log_artifact(ref.uuid, path, artifact_path=art.name)

    # -- sending a flush ------------------------------------------------------------------------
    async def _send(
        self,
        run_id: str,
        requests: Sequence[Request],
        batch: Batch,
        first_params: bool,
        tail: Callable[[Request], list[Request]] | None = None,
    ) -> None:
        """Sends requests not yet in ``batch.done``, a few at a time. Each is marked done when
        stored; a failure cancels the rest, and the lane's retry sends only what is missing.
        With ``tail``, the last of ``requests`` is replaced by ``tail(last)`` once the others
        are under way (see :meth:`_send_requests`).

        Whatever fails leaves as one :class:`BackendError`, never an exception group: the
        errors of the requests that failed together are combined (transient if any is)."""
        planned = list(requests)  # the tail replaces its last entry once planned
        try:
            await self._send_requests(run_id, planned, batch, first_params, tail)
            return
        except BaseExceptionGroup as group:
            error = map_group(group, lambda e: map_error(e, "log_batch"))
            if error is None:  # a cancellation or an interrupt: not a failure of MLflow
                raise
            if all(error is not leaf for leaf in leaves(group)):
                error.__cause__ = group  # a combined error: the group shows each part
        stored = sum(1 for i in range(len(planned)) if f"mlflow:{i}" in batch.done)
        error.args = (f"{error} ({stored} of {len(planned)} requests of the flush stored)",)
        raise error

    async def _send_requests(
        self,
        run_id: str,
        planned: list[Request],
        batch: Batch,
        first_params: bool,
        tail: Callable[[Request], list[Request]] | None,
    ) -> None:
        """Sends ``planned`` (request ``i`` is the part ``mlflow:i`` of the batch), at most
        ``request_concurrency`` in flight. With ``tail``: the last planned request is held
        back; once the first of the others is under way, ``tail(last)`` (computed on this
        thread: the writer's summary) gives the requests that replace it, and the very last
        of those is sent only after every other one is stored."""
        limiter = anyio.CapacityLimiter(self.request_concurrency)
        under_way = anyio.Event()

        async def send(index: int, request: Request) -> None:
            part = f"mlflow:{index}"
            if part in batch.done:
                return
            async with limiter:
                # Set before the call is handed to a worker thread, but a waiter runs only
                # once this task waits on that thread: the request has left by then.
                under_way.set()
                await self._blocking(
                    "log_batch", self._log_batch_sync, run_id, request, first_params
                )
            batch.done.add(part)

        head = planned[:-1] if tail is not None else planned
        todo = [(i, r) for i, r in enumerate(head) if f"mlflow:{i}" not in batch.done]
        if todo:
            # The first request alone: it makes this process a writer of the run (a tag, and
            # RUNNING again for an ended run) and reads the run's params once, before the
            # others race for them in worker threads. Sending it beside the others from a
            # flush's start gained nothing measurable: the server (SQLite) stores one
            # request at a time, and bench_mlflow saw more time per request, not less.
            await send(*todo.pop(0))
        async with anyio.create_task_group() as tg:
            for index, request in todo:
                tg.start_soon(send, index, request)
            if tail is not None:
                if todo:
                    # Whatever ``tail`` computes here costs the server no idle time: it works
                    # on the requests already sent meanwhile.
                    await under_way.wait()
                planned[-1:] = tail(planned[-1])
                for index in range(len(head), len(planned) - 1):
                    tg.start_soon(send, index, planned[index])
        if tail is not None:
            # The last request (it holds the writer's summary) waits until every other one is
            # stored: a summary never counts points the run does not hold.
            await send(len(planned) - 1, planned[-1])

    # -- the writer's summary --------------------------------------------------------------------
    def _tally(self, ref: RunRef, token: str) -> Tally:
        """This process's summary of writer ``token`` in ``ref``'s run: at first use, what the
        run's tags held of it when this process looked the run up (a replay of another
        process's batches continues its summary). A writer new to a run that holds points
        from a writer keeping no summary (an older version, torchx, plain MLflow) says so
        (``prior``): readers then read that run's points."""
        tally = self._tallies.get((ref.uuid, token))
        if tally is None:
            stored = stored_summaries(ref.tags)
            summary = stored.writers.get(token)
            if summary is None:
                unknown = TAG_SUMMARIES not in ref.tags and ref.had_metrics
                summary = WriterSummary(prior=unknown or token in stored.unreadable)
            tally = self._tallies[(ref.uuid, token)] = Tally(summary)
        return tally

    def _token(self, batch: Batch) -> str:
        token = writer_token(batch.key)
        if token is not None:
            return token
        pid = os.getpid()
        if pid not in self._direct_tokens:
            self._direct_tokens[pid] = f"{time.time_ns():019d}x{pid:x}{os.urandom(4).hex()}"
        return self._direct_tokens[pid]

    def _batch_summary(
        self, ref: RunRef, tally: Tally, batch: Batch, metrics: Sequence[MetricEntry]
    ) -> WriterSummary | None:
        """The writer's summary with ``batch`` counted, or None when it counts it already.
        Kept in ``batch.names`` for its MLflow run: a retry (or a replay of the spooled
        batch) sends exactly the requests of the first attempt, whose parts done are
        skipped by index, whatever the tally holds by then."""
        planned = f"mlflow:summary:{ref.uuid}"
        text = batch.names.get(planned)
        if text is not None:
            return WriterSummary.from_json(json.loads(text))
        if tally.summary.counted(batch.key, batch.seq):
            return None
        stamps = [
            batch.metadata_ns[k] / 1e9 for k in batch.metadata if k in batch.metadata_ns
        ]
        summary = count_batch(
            tally.summary, key=batch.key, seq=batch.seq, entries=metrics, stamps_s=stamps,
            now=time.time(),
        )  # fmt: skip
        batch.names[planned] = dumps(summary.to_json())
        return summary

    async def _send_counted(
        self,
        run_id: str,
        batch: Batch,
        tags: list[tuple[str, str]],
        metrics: list[MetricEntry],
        params: list[tuple[str, str]],
    ) -> None:
        """Sends the batch's entries with the writer's summary in the last request (see
        summaries.py), then keeps the summary sent."""
        if not (tags or metrics or params):
            return  # nothing to send (an end record alone): the summary is unchanged
        # The run looked up (made if missing) before the requests are planned: the summary
        # is planned for it. This process becomes a writer of the run only when a request
        # is sent (in _log_batch_sync): a retry of a batch stored whole sends nothing and
        # must not make an ended run a running one again.
        ref = self.runs.known(run_id)
        if ref is None:
            ref = await self._blocking("log_batch", self.runs.resolve, run_id, True)
            assert ref is not None
        token = self._token(batch)
        tally = self._tally(ref, token)
        # Held until the summary is stored and kept (see Tally): uncontended for an AppRun,
        # whose batches of a run come one at a time.
        async with tally.lock:
            # Planned without the summary: the requests before the last one are the same
            # with it (see with_last_tags), so they leave before the summary is computed.
            requests = plan_requests(tags=tags, metrics=metrics, params=params)
            counted: list[WriterSummary] = []

            def tail(last: Request) -> list[Request]:
                summary = self._batch_summary(ref, tally, batch, metrics)
                if summary is None:  # counted already (a replay): nothing to add
                    return [last]
                counted.append(summary)
                alone = len(requests) == 1
                return with_last_tags(last, summary_tags(token, summary), alone=alone)

            await self._send(run_id, requests, batch, first_params=True, tail=tail)
            if counted:
                tally.summary = counted[0]

    # -- writes ----------------------------------------------------------------------------------
    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Stores one flush: local artifacts uploaded first, then everything else in as few
        log_batch requests as MLflow's limits allow.

        Entries MLflow would refuse (a key too long, a value over 8000 characters ...) are
        left out, the rest is stored, then ``RecordError(refused=N)`` names them: one bad key
        does not cost the thousands of metric points flushed with it, and the lane counts the
        N entries as dropped without splitting and sending the batch again. N counts entries
        (a metadata key, an artifact, a source, a metric point), at most ``batch.records``.
        (Through ``AppRun`` such entries are refused at the call site by :meth:`validate`;
        they reach here from other paths, such as a spool replayed into MLflow.)

        Any other failure leaves as one :class:`BackendError` (see :func:`map_error`).
        """
        # The time stamped on source tags, kept for retries: the requests of a retry must be
        # exactly those of the first attempt, since parts done are skipped by index.
        now = float(batch.names.setdefault("mlflow:t", repr(time.time())))
        problems: list[str] = []
        tags = self._metadata_tags(batch.metadata, problems)
        params = self._metadata_params(batch.metadata) if self.metadata_params else []
        uploads: list[TrackerArtifact] = []
        for art in batch.artifacts.values():
            bad = artifact_problems(art)
            problems.extend(bad)
            if not bad:
                tags.append((artifact_tag(art.name), artifact_value(art)))
                if local_path(art.path) is not None:
                    uploads.append(art)
        for src in batch.sources:
            tags.extend(self._source_tags(src, now, problems))
        metrics = self._metric_entries(batch.metrics, problems)
        # Uploads before the tags: an artifact's tag says its file is there.
        for art in uploads:
            part = f"mlflow:upload:{sha1(art.name)}"
            if part not in batch.done:
                await self._blocking("log_artifact", self._upload_sync, run_id, art)
                batch.done.add(part)
        await self._send_counted(run_id, batch, tags, metrics, params)
        if batch.end is not None and END_PART not in batch.done:
            # Last, after what the batch stored (and before a refusal is raised: the end
            # record is not what MLflow refused).
            end_time = batch.end_time or None
            await self._blocking("set_terminated", self._end_sync, run_id, batch.end, end_time)
            batch.done.add(END_PART)
        if batch.end is not None:
            # The writer's last batch: nothing more of it to count (a later life of the run
            # is a pipeline, a writer, of its own).
            token = self._token(batch)
            for key in [k for k in self._tallies if k[1] == token]:
                del self._tallies[key]
        if problems:
            refused = len(problems)
            if batch.records:
                refused = min(refused, batch.records)
            raise RecordError(
                f"MLflow refused {len(problems)} entries of run {run_id!r} (the rest of the "
                "flush was stored): " + "; ".join(problems),
                refused=refused,
            )

    @staticmethod
    def _metadata_tags(
        metadata: Mapping[str, object], problems: list[str]
    ) -> list[tuple[str, str]]:
        tags = []
        for key, value in metadata.items():
            problem = tag_problem(key, value)
            if problem:
                problems.append(problem)
            else:
                tags.append(mlflow_tag(key, value))
        return tags

    def _metadata_params(self, metadata: Mapping[str, object]) -> list[tuple[str, str]]:
        """The params of these metadata entries, the first of each param key. Which of them
        are first writes in the run is decided when sending (see :meth:`_log_batch_sync`),
        so that a retry plans the same requests. Params MLflow would refuse are left out
        (validate refuses them at the call site): the tag still holds the value."""
        params: dict[str, str] = {}
        for key, value in metadata.items():
            # A run's tags and note are tags only: params would freeze their first value.
            if is_reserved_key(key) or tag_problem(key, value):
                continue
            try:
                flat = flatten_params(value, key)
            except ValueError as exc:
                logger.warning("async_tracker: metadata %r is not logged as params: %s", key, exc)
                continue
            for k, v in flat.items():
                params.setdefault(k, v)
        return list(params.items())

    @staticmethod
    def _source_tags(
        src: TrackerSource, now: float, problems: list[str]
    ) -> list[tuple[str, str]]:
        bad = source_problems(src)
        problems.extend(bad)
        if bad:
            return []
        return [
            (source_tag(src.source_run_id, src.artifact_name), source_value(src, now)),
            (parent_tag(src.source_run_id), "1"),
        ]

    def _metric_entries(
        self, metrics: Sequence[TrackerMetric], problems: list[str]
    ) -> list[MetricEntry]:
        checked = self._checked_metric_names
        out = []
        for m in metrics:
            if m.name not in checked or not INT64_MIN <= m.step <= INT64_MAX:
                problem = metric_problem(m)
                if problem:
                    problems.append(problem)
                    continue
                checked.add(m.name)
            out.append((m.name, m.value, round(m.timestamp * 1000), m.step))
        return out

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self.write_batch(run_id, Batch(0, metadata=dict(kwargs)))

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        """Records an artifact; a local file or directory is uploaded to ``<name>/`` in the
        run's artifacts (``mlflow.artifacts.download_artifacts`` gets it back), a URI of
        another scheme (``s3://`` ...) is recorded only."""
        art = TrackerArtifact(name, path, dict(metadata) if metadata is not None else None)
        await self.write_batch(run_id, Batch(0, artifacts={name: art}))

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        await self.write_batch(run_id, Batch(0, sources=[TrackerSource(source_id, artifact_name)]))

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self.write_batch(run_id, Batch(0, metrics=list(metrics)))

    async def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """Logs MLflow params (immutable in MLflow: a key logged again must keep its value,
        else :class:`RecordError`). A key or value MLflow refuses raises ``ValueError``."""
        raise_problems([p for k, v in params.items() if (p := param_problem(k, v))])
        requests = plan_requests(params=sorted(params.items()))
        await self._send(run_id, requests, Batch(0), first_params=False)

    async def log_params_flat(self, run_id: str, cfg: object, key: str = "") -> None:
        """Flattens ``cfg`` (dataclasses, mappings, sequences) as torchx does, and logs the
        result as params. See :func:`flatten_params`."""
        await self.log_params(run_id, flatten_params(cfg, key))

    # -- reads -------------------------------------------------------------------------------
    def _tags_sync(self, run_id: str) -> dict[str, str]:
        ref = self.runs.resolve(run_id, create=False)
        if ref is None:
            return {}
        return dict(self.client.get_run(ref.uuid).data.tags)

    async def _tags(self, run_id: str) -> dict[str, str]:
        return await self._blocking("get_run", self._tags_sync, run_id)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        """The run's tags, decoded, without MLflow's system tags (``mlflow.*``) and ours,
        but with the run's own tags (``async_tracker.tag.*``), its description (as the
        note's key) and its ending (``async_tracker.ending``): what ``AppRun.tags()`` and
        ``note()`` read, and how a run that did not finish ended (see :func:`metadata_of`)."""
        return metadata_of(await self._tags(run_id))

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        tags = await self._tags(run_id)
        found: list[TrackerArtifact] = []
        for k, v in tags.items():
            if k.startswith(TAG_ARTIFACT_PREFIX):
                data = decode_object(k, v)
                if data is not None and isinstance(data.get("name"), str):
                    meta = data.get("metadata")
                    found.append(
                        TrackerArtifact(
                            data["name"],
                            str(data.get("path", "")),
                            meta if isinstance(meta, dict) else None,
                        )
                    )
        return {a.name: a for a in sorted(found, key=lambda a: a.name)}

    @staticmethod
    def _sources_of(tags: Mapping[str, str]) -> list[tuple[float, TrackerSource]]:
        found: list[tuple[float, TrackerSource]] = []
        for k, v in tags.items():
            if k.startswith(TAG_SOURCE_PREFIX):
                data = decode_object(k, v)
                if data is None or not isinstance(data.get("source_run_id"), str):
                    continue
                art = data.get("artifact_name")
                t = data.get("t")
                found.append(
                    (
                        float(t) if isinstance(t, (int, float)) else 0.0,
                        TrackerSource(data["source_run_id"], art if isinstance(art, str) else None),
                    )
                )
        found.sort(key=lambda p: (p[0], p[1].source_run_id, p[1].artifact_name or ""))
        return found

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        """The run's sources in the order they were first recorded."""
        tags = await self._tags(run_id)
        return [
            s
            for _, s in self._sources_of(tags)
            if artifact_name is None or s.artifact_name == artifact_name
        ]

    def _children_sync(self, parent_run_id: str) -> list[Any]:
        return self.runs.search(f"tags.`{parent_tag(parent_run_id)}` = '1'")

    async def lineage(self, run_id: str) -> Lineage:
        """Parents: the run's sources. Descendants: the runs of the experiment that name it
        as a source, each with the artifact name of that link."""
        parents = list(await self.sources(run_id))
        children = await self._blocking("search_runs", self._children_sync, run_id)
        descendants: list[tuple[float, TrackerSource]] = []
        for child in children:
            child_id = run_id_of(child)
            for t, src in self._sources_of(child.data.tags):
                if src.source_run_id == run_id:
                    descendants.append((t, TrackerSource(child_id, src.artifact_name)))
        descendants.sort(key=lambda p: (p[0], p[1].source_run_id, p[1].artifact_name or ""))
        return Lineage(run_id, parents, [s for _, s in descendants])

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        """The run ids of the experiment, or only the children of ``parent_run_id=``. Runs made
        by torchx's own MLflow tracker appear under their run name."""
        parent = kwargs.get("parent_run_id")
        if parent is not None:
            runs = await self._blocking("search_runs", self._children_sync, parent)
        else:
            runs = await self._blocking("search_runs", self.runs.search, "")
        seen: dict[str, None] = {}
        for r in sorted(runs, key=start_order):
            seen.setdefault(run_id_of(r), None)
        return list(seen)

    def _metrics_sync(self, run_id: str) -> dict[str, list[TrackerMetric]]:
        ref = self.runs.resolve(run_id, create=False)
        if ref is None:
            return {}
        return self._histories_sync(ref.uuid, self.client.get_run(ref.uuid).data.metrics)

    def _histories_sync(self, uuid: str, names: Iterable[str]) -> dict[str, list[TrackerMetric]]:
        out: dict[str, list[TrackerMetric]] = {}
        for name in sorted(names):
            points = [
                TrackerMetric(name, from_stored(m.value), int(m.step), m.timestamp / 1000.0)
                for m in self.client.get_metric_history(uuid, name)
            ]
            out[name] = sort_points(points)
        return out

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        """Every metric of the run, points ordered by step then time. Timestamps have MLflow's
        millisecond resolution; infinities come back as infinities."""
        return await self._blocking("get_metric_history", self._metrics_sync, run_id)

    def _status_sync(self, run_id: str) -> tuple[str, float | None] | None:
        ref = self.runs.resolve(run_id, create=False)
        if ref is None:
            return None
        return status_of(self.client.get_run(ref.uuid).info)

    async def run_status(self, run_id: str) -> tuple[str, float | None] | None:
        """How the MLflow run of ``run_id`` ended and when (``finished``, ``failed`` or
        ``killed``, and its end time in seconds), ``("running", None)`` before, None when
        the experiment holds no such run: what the read side shows as the run's status."""
        return await self._blocking("get_run", self._status_sync, run_id)

    def _delete_sync(self, run_id: str) -> None:
        runs = self.runs.candidates(run_id)
        if not runs:
            named = self.runs.named(run_id)  # a run torchx's own tracker made
            runs = [] if named is None else [named]
        for run in runs:
            self.client.delete_run(run.info.run_id)
            self.runs.forget(run_id, str(run.info.run_id))

    async def delete_run(self, run_id: str) -> bool:
        """Deletes the MLflow runs of ``run_id`` (tagged with it, or the run torchx's own
        tracker named after it). MLflow deletes softly: the run is marked deleted, which its
        UI and searches hide (``run_ids`` too); ``mlflow gc`` removes it for good."""
        await self._blocking("delete_run", self._delete_sync, run_id)
        return True

    # -- the read side -------------------------------------------------------------------------
    def reader(self) -> RunReader:
        """The read side's view of the experiment: run lists from ``search_runs`` and the
        writers' summaries (see :class:`~async_tracker.backend.mlflow.reader.MLflowReader`)."""
        # Imported here: the reader module builds on this one.
        from async_tracker.backend.mlflow.reader import MLflowReader

        return MLflowReader(self)

    async def search_runs(self, filter_string: str = "") -> list[Any]:
        """The live MLflow ``Run`` objects of the experiment that match ``filter_string``
        (MLflow's search syntax; all of them without one): one request per page of 1,000
        runs, each with its info, params, tags and latest metrics."""
        return await self._blocking("search_runs", self.runs.search, filter_string)

    async def metric_histories(
        self, mlflow_run_id: str, names: Iterable[str]
    ) -> dict[str, list[TrackerMetric]]:
        """Every point of the metrics ``names`` of the MLflow run ``mlflow_run_id`` (one
        ``get_metric_history`` request each), ordered by step then time."""
        return await self._blocking(
            "get_metric_history", self._histories_sync, mlflow_run_id, list(names)
        )

    # -- MLflow objects ------------------------------------------------------------------------
    async def experiment(self) -> Any:
        """The MLflow ``Experiment`` (created if missing)."""
        return await self._blocking("get_experiment", self.runs.experiment)

    async def get_run(self, run_id: str, create: bool = True) -> Any:
        """The MLflow ``Run`` of ``run_id`` (created if missing and ``create``, then ended by
        :meth:`aclose`), or None. Several runs named ``run_id`` and none of ours:
        :class:`~async_tracker.backend.mlflow.errors.AmbiguousRunError`."""

        def get() -> Any:
            ref = self.runs.resolve(run_id, create)
            return None if ref is None else self.client.get_run(ref.uuid)

        return await self._blocking("get_run", get)


def metadata_of(tags: Mapping[str, str]) -> dict[str, object]:
    """The metadata an MLflow run's ``tags`` hold, decoded: every tag but MLflow's system
    tags (``mlflow.*``) and ours, with the run's own tags (``async_tracker.tag.*``) as
    booleans, its description as the note's key, and its ending (``async_tracker.ending``)."""
    out: dict[str, object] = {}
    for k, v in sorted(tags.items()):
        if k.startswith(TAG_KEY_PREFIX):
            out[k] = loads_tag(v) is True
        elif k == MLFLOW_NOTE_TAG:
            out[NOTE_KEY] = v
        elif k == ENDING_KEY or not k.startswith(RESERVED_TAG_PREFIXES):
            out[k] = loads_tag(v)
    return out


def status_of(info: Any) -> tuple[str, float | None]:
    """How an MLflow run stands, from its ``RunInfo``: ``finished``, ``failed`` or
    ``killed`` and its end time in seconds, or ``("running", None)`` (RUNNING, SCHEDULED)."""
    ending = ENDING_OF_STATUS.get(str(info.status))
    if ending is None:
        return "running", None
    return ending, info.end_time / 1000.0 if info.end_time is not None else None
