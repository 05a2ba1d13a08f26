"""MLflow backend: one async implementation, a torchx-compatible sync face, and a factory.

* :class:`AsyncMLflowTracker` is the ``AsyncTrackerBase``. Every ``MlflowClient`` call is
  blocking, so each runs in a worker thread through
  :func:`async_tracker.threads.run_blocking` (its tracking URI is the endpoint): the tracker
  loop never waits on the network.
* :class:`MLflowTracker` is its blocking twin, with torchx's constructor
  ``MLflowTracker(experiment_name=None, tracking_uri=..., artifact_location=None)`` plus
  ``close()`` and ``log_params_flat``. ``AppRun`` unwraps it and talks to the async backend.
* :func:`create_tracker` is the ``mlflow`` factory: it reads the ``[tracker:mlflow]`` section of
  a ``.torchxconfig`` file (a directory holding one, or the file's path).

How a run maps onto MLflow::

    run id "app-123"  ->  one MLflow run in the tracker's experiment
                          run name "app-123", tag async_tracker.run_id = "app-123",
                          tag async_tracker.run_key = sha1("app-123") (what searches use)
    add_metadata(k=v) ->  tag k = json(v)                 (JSON, so values round-trip)
    add_artifact(n)   ->  tag async_tracker.artifact.<sha1(n)> = json({name, path, metadata})
    add_source(s, a)  ->  tag async_tracker.source.<sha1([s, a])> = json({source_run_id, ...})
                          tag async_tracker.parent.<sha1(s)> = "1"  (descendant searches)
    log_metric        ->  metric points via log_batch, client timestamps (ms) and steps
    log_params_flat   ->  params

Object names are hashes, so they are deterministic (a retry overwrites), always valid MLflow
keys whatever the artifact or source is called, and within the 250-character key limit.
Ranks starting together create the run once: the first to create the (then deleted) experiment
``async_tracker.locks/<experiment id>/<sha1(run id)>/<n>`` creates the run, the others wait
for it (see :meth:`AsyncMLflowTracker._create_once`).

Example::

    from async_tracker import AppRun
    from async_tracker.backend.mlflow import MLflowTracker

    tracker = MLflowTracker(experiment_name="demo", tracking_uri="http://127.0.0.1:5000")
    with AppRun("my-run", [tracker]) as run:
        run.add_metadata(lr=0.01)
        run.log_metric("loss", 0.5, step=1)
    tracker.close()  # ends the MLflow run FINISHED (FAILED when exiting on an exception)
"""

from __future__ import annotations

import configparser
import dataclasses
import getpass
import hashlib
import json
import logging
import os
import posixpath
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

import anyio

try:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag, ViewType
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "async_tracker.backend.mlflow needs the mlflow package: "
        "pip install 'async-tracker[mlflow]'"
    ) from _exc

from async_tracker.adapters import SyncTracker
from async_tracker.backend.errors import (
    chain,
    http_status,
    http_status_error,
    is_network_failure,
    leaves,
    map_group,
)
from async_tracker.base import AsyncTrackerBase, CloseReason
from async_tracker.errors import (
    BackendError,
    PermanentBackendError,
    RecordError,
    TrackerConfigError,
    TransientBackendError,
)
from async_tracker.records import (
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    check_artifact,
    check_metadata,
    check_name,
    check_source,
    sort_points,
)
from async_tracker.shutdown import exiting_on_exception
from async_tracker.threads import run_blocking

__all__ = [
    "DEFAULT_TRACKING_DIR",
    "AsyncMLflowTracker",
    "MLflowTracker",
    "create_tracker",
    "default_experiment_name",
    "default_tracking_uri",
    "flatten_params",
    "read_config",
]

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup

logger = logging.getLogger(__name__)

T = TypeVar("T")
RunStatus = Literal["FINISHED", "FAILED", "KILLED"]

# -- MLflow's limits (mlflow.utils.validation; the server enforces them) -----------------------
MAX_KEY_LENGTH = 250
MAX_TAG_VALUE_LENGTH = 8000
MAX_PARAM_VALUE_LENGTH = 6000
MAX_METRICS_PER_REQUEST = 1000
MAX_TAGS_PER_REQUEST = 100
MAX_PARAMS_PER_REQUEST = 100
MAX_ITEMS_PER_REQUEST = 1000
MAX_REQUEST_BYTES = 1_000_000
# What we allow ourselves per request: the client pretty-prints its JSON, so leave room for
# indentation and field names beyond the sizes we count.
REQUEST_BYTES_BUDGET = 800_000
_METRIC_OVERHEAD_BYTES = 160
_ENTRY_OVERHEAD_BYTES = 60
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# The SQL stores clip infinities to the largest double; reads map those back.
_FLOAT_MAX = sys.float_info.max

# -- client tuning -----------------------------------------------------------------------------
# MLflow's HTTP client retries 7 times with exponential backoff by default (minutes while a
# server restarts) and waits 120 s per request. Our lane retries with its own backoff and
# close() has a deadline, so the client should fail fast and let the lane decide: one retry
# (urllib3 makes the first at once: it covers a pooled connection the server has just
# closed, so that a blocking read does not fail for that), and 20 s per request. These are set
# with os.environ.setdefault when a tracker is built: a value the user exported wins.
# (MLflow reads them at each request; it has no per-client setting.)
DEFAULT_HTTP_MAX_RETRIES = 1
DEFAULT_HTTP_TIMEOUT_S = 20
# log_batch requests of one flush sent at once: the server overlaps JSON parsing with the
# database write of the other request. More gains nothing against a SQLite store.
DEFAULT_REQUEST_CONCURRENCY = 2

# -- tags --------------------------------------------------------------------------------------
TAG_PREFIX = "async_tracker."
TAG_RUN_ID = "async_tracker.run_id"
TAG_RUN_KEY = "async_tracker.run_key"
TAG_ARTIFACT_PREFIX = "async_tracker.artifact."
TAG_SOURCE_PREFIX = "async_tracker.source."
TAG_PARENT_PREFIX = "async_tracker.parent."
LOCK_EXPERIMENT_PREFIX = "async_tracker.locks/"
# How long a process waits for another to create the run it holds the creation lock of.
CREATION_WAIT_S = 10.0
CREATION_POLL_S = 0.05
MLFLOW_TAG_PREFIX = "mlflow."
RESERVED_TAG_PREFIXES = (TAG_PREFIX, MLFLOW_TAG_PREFIX)

# -- config ------------------------------------------------------------------------------------
CONFIG_FILE_NAME = ".torchxconfig"
CONFIG_SECTION = "tracker:mlflow"
CONFIG_KEYS = ("experiment_name", "tracking_uri", "artifact_location")
ENV_EXPERIMENT_NAME = "TORCHX_TRACKING_EXPERIMENT_NAME"
ENV_MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
DEFAULT_TRACKING_DIR = Path(tempfile.gettempdir()) / "async_tracker" / "mlflow"

_KEY_RE = re.compile(r"^[/\w.\- :]*$" if os.name != "nt" else r"^[/\w.\- ]*$")
# MLflow error codes (MlflowException.error_code) that may pass by themselves. INTERNAL_ERROR
# is what the client says for a 500 answer, and for a request that failed on the way.
_TRANSIENT_MLFLOW_CODES = frozenset(
    {
        "INTERNAL_ERROR",
        "TEMPORARILY_UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "REQUEST_LIMIT_EXCEEDED",
        "RESOURCE_EXHAUSTED",
        "ABORTED",
        "IO_ERROR",
    }
)
# INVALID_PARAMETER_VALUE is about the entries of the request when its message says so (paths
# of the entries in log_batch, MLflow's limits, immutable params); else (a run id, an
# experiment, a search filter) it is about the backend.
_RECORD_MESSAGE_RE = re.compile(
    r"for parameter '(?:metrics|params|tags|key|value|name)\b"
    r"|parameter '(?:metrics|params|tags)\["
    r"|exceeds the maximum length"
    r"|Changing param values is not allowed"
    r"|Duplicate parameter keys"
    r"|A batch logging request can contain at most"
    r"|Batched logging API requests must be at most"
    r"|Tag value cannot be None"
)


# =============================================================================================
# Defaults


def default_experiment_name() -> str:
    """torchx's default: ``default-experiment/<user>/<host>``."""
    try:
        user = getpass.getuser()
    except Exception:  # no user entry (some containers)
        user = "unknown"
    return f"default-experiment/{user}/{socket.getfqdn()}"


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else a SQLite store under the temp directory.

    torchx defaulted to a ``file://`` store, which MLflow 3 no longer accepts by default.
    """
    env = os.environ.get(ENV_MLFLOW_TRACKING_URI)
    if env:
        return env
    return f"sqlite:///{DEFAULT_TRACKING_DIR / 'mlflow.db'}"


def _configure_http_client() -> None:
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(DEFAULT_HTTP_MAX_RETRIES))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(DEFAULT_HTTP_TIMEOUT_S))


# =============================================================================================
# Keys, values and limits


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def run_key(run_id: str) -> str:
    """The value of the ``async_tracker.run_key`` tag: safe in a search filter whatever the
    run id holds (quotes, backticks ...)."""
    return _sha1(run_id)


def _artifact_tag(name: str) -> str:
    return TAG_ARTIFACT_PREFIX + _sha1(name)


def _source_tag(source_id: str, artifact_name: str | None) -> str:
    return TAG_SOURCE_PREFIX + _sha1(json.dumps([source_id, artifact_name]))


def _parent_tag(source_id: str) -> str:
    return TAG_PARENT_PREFIX + _sha1(source_id)


def _dumps(value: object) -> str:
    # Compact, and NaN/Infinity kept (Python's json reads them back).
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _loads_tag(value: str) -> object:
    """A metadata tag value: JSON when we wrote it; a tag set by someone else (the MLflow UI,
    torchx's own tracker) that is not JSON comes back as the string it is."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def key_problem(key: str, what: str) -> str | None:
    """Why MLflow would refuse ``key`` as a tag, metric or param name, or None."""
    if len(key) > MAX_KEY_LENGTH:
        return f"{what} {key[:40]!r}... is {len(key)} characters; MLflow allows {MAX_KEY_LENGTH}"
    if not _KEY_RE.match(key):
        return (
            f"{what} {key!r}: MLflow names may only hold letters, digits, '_', '-', '.', ' ', "
            "':' and '/'"
        )
    norm = posixpath.normpath(key)
    if norm != key or norm == "." or norm.startswith("..") or norm.startswith("/"):
        return f"{what} {key!r}: MLflow refuses names that resolve to another path ({norm!r})"
    return None


def _value_problem(key: str, value: str, limit: int, what: str) -> str | None:
    if len(value) > limit:
        return (
            f"{what} {key!r}: its value is {len(value)} characters once encoded; "
            f"MLflow allows {limit}"
        )
    return None


def metadata_problems(metadata: Mapping[str, object]) -> list[str]:
    """Why MLflow would refuse any of these metadata entries (empty list: none)."""
    problems = []
    for key, value in metadata.items():
        if key.startswith(RESERVED_TAG_PREFIXES):
            problems.append(
                f"metadata key {key!r}: keys starting with {TAG_PREFIX!r} or "
                f"{MLFLOW_TAG_PREFIX!r} are reserved"
            )
            continue
        problem = key_problem(key, "metadata key") or _value_problem(
            key, _dumps(value), MAX_TAG_VALUE_LENGTH, "metadata"
        )
        if problem:
            problems.append(problem)
    return problems


def _artifact_value(art: TrackerArtifact) -> str:
    return _dumps({"name": art.name, "path": art.path, "metadata": art.metadata})


def artifact_problems(art: TrackerArtifact) -> list[str]:
    problem = _value_problem(art.name, _artifact_value(art), MAX_TAG_VALUE_LENGTH, "artifact")
    return [problem] if problem else []


def _source_value(src: TrackerSource, written_at: float) -> str:
    return _dumps(
        {"source_run_id": src.source_run_id, "artifact_name": src.artifact_name, "t": written_at}
    )


def source_problems(src: TrackerSource) -> list[str]:
    problem = _value_problem(
        src.source_run_id, _source_value(src, 0.0), MAX_TAG_VALUE_LENGTH, "source"
    )
    return [problem] if problem else []


def _param_problem(key: str, value: str) -> str | None:
    return key_problem(key, "param") or _value_problem(key, value, MAX_PARAM_VALUE_LENGTH, "param")


def metric_problem(metric: TrackerMetric) -> str | None:
    problem = key_problem(metric.name, "metric name")
    if problem is None and not _INT64_MIN <= metric.step <= _INT64_MAX:
        problem = f"metric {metric.name!r}: step {metric.step} does not fit in 64 bits"
    return problem


def _raise_value_error(problems: Sequence[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))


# =============================================================================================
# log_batch requests


@dataclass
class _Request:
    """One log_batch call: within MLflow's per-request limits."""

    tags: list[tuple[str, str]] = field(default_factory=list)
    params: list[tuple[str, str]] = field(default_factory=list)
    metrics: list[tuple[str, float, int, int]] = field(default_factory=list)  # key, v, ms, step
    size: int = 0

    @property
    def items(self) -> int:
        return len(self.tags) + len(self.params) + len(self.metrics)


def _entry_size(key: str, value: str) -> int:
    # json.dumps with ensure_ascii, as the client sends it: escapes count.
    return len(json.dumps(key)) + len(json.dumps(value)) + _ENTRY_OVERHEAD_BYTES


def plan_requests(
    tags: Sequence[tuple[str, str]] = (),
    metrics: Sequence[tuple[str, float, int, int]] = (),
    params: Sequence[tuple[str, str]] = (),
) -> list[_Request]:
    """Cuts tags, params and metrics into log_batch requests within MLflow's limits (1000
    metrics, 100 params, 100 tags, 1000 items, 1 MB). Deterministic: a retry of the same batch
    makes the same requests, so the parts already stored can be skipped by index."""
    requests: list[_Request] = []
    current = _Request()

    def room(kind: str, size: int) -> bool:
        if current.items >= MAX_ITEMS_PER_REQUEST or current.size + size > REQUEST_BYTES_BUDGET:
            return False
        if kind == "tag":
            return len(current.tags) < MAX_TAGS_PER_REQUEST
        if kind == "param":
            return len(current.params) < MAX_PARAMS_PER_REQUEST
        return len(current.metrics) < MAX_METRICS_PER_REQUEST

    def add(kind: str, size: int) -> _Request:
        nonlocal current
        if current.items and not room(kind, size):
            requests.append(current)
            current = _Request()
        current.size += size
        return current

    for key, value in tags:
        add("tag", _entry_size(key, value)).tags.append((key, value))
    for key, value in params:
        add("param", _entry_size(key, value)).params.append((key, value))
    for metric in metrics:
        add("metric", len(json.dumps(metric[0])) + _METRIC_OVERHEAD_BYTES).metrics.append(metric)
    if current.items:
        requests.append(current)
    return requests


# =============================================================================================
# Errors


def _is_database_busy(exc: BaseException) -> bool:
    """A SQLite store (local, or behind the server) busy with another writer."""
    return any(
        "database is locked" in str(cur) or "database table is locked" in str(cur)
        for cur in chain(exc)
    )


def is_record_refusal(exc: BaseException) -> bool:
    """Whether an ``INVALID_PARAMETER_VALUE`` is about entries of the request (a key, a
    value, MLflow's limits, a param logged again with another value, a request too large)."""
    return _RECORD_MESSAGE_RE.search(str(exc)) is not None


def map_error(exc: BaseException, what: str) -> BackendError:
    """The package's error for whatever the MLflow client (or its store) raised while doing
    ``what``, naming it.

    * transient: connection failures and timeouts (requests, urllib3), HTTP 408/429/5xx, the
      MLflow codes INTERNAL_ERROR, TEMPORARILY_UNAVAILABLE, DEADLINE_EXCEEDED,
      REQUEST_LIMIT_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, IO_ERROR, and a SQLite store's
      "database is locked";
    * about records (:class:`RecordError`, dropped alone by the lane): INVALID_PARAMETER_VALUE
      about a key or value of the request (see :func:`is_record_refusal`);
    * about the backend (the records are kept): RESOURCE_DOES_NOT_EXIST, PERMISSION_DENIED,
      UNAUTHENTICATED, every other code, and any error not recognised.

    Exception groups are unwrapped into one error (transient if any part is).
    """
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        mapped = map_group(exc, lambda e: map_error(e, what))
        if mapped is not None:
            return mapped
    message = f"MLflow {what} failed: {type(exc).__name__}: {exc}"
    code = getattr(exc, "error_code", None)
    if isinstance(code, str) and code not in message:
        message += f" ({code})"
    if is_network_failure(exc) or _is_database_busy(exc):
        return TransientBackendError(message)
    if isinstance(code, str):  # an MlflowException
        if code in _TRANSIENT_MLFLOW_CODES:
            return TransientBackendError(message)
        if code == "INVALID_PARAMETER_VALUE" and is_record_refusal(exc):
            return RecordError(message)
        return PermanentBackendError(message)
    status = http_status(exc)
    if status is not None:
        return http_status_error(status, message)
    mod = type(exc).__module__
    if mod.startswith("sqlalchemy") and type(exc).__name__ in (
        "OperationalError",
        "TimeoutError",
        "DisconnectionError",
    ):
        return TransientBackendError(message)
    return PermanentBackendError(message)


def _is_run_not_active(exc: BaseException) -> bool:
    return "must be in the 'active' state" in str(exc)


# =============================================================================================
# FAILED or FINISHED


# =============================================================================================
# The async backend


@dataclass
class _RunRef:
    uuid: str
    written: bool = False


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

    Nothing is sent at construction: the experiment and the run are looked up, or created,
    on first use, in a worker thread, and retried like any write.

    Example::

        backend = AsyncMLflowTracker("demo", "http://127.0.0.1:5000")
        async with AppRun("my-run", [backend]) as run:
            run.log_metric("loss", 0.5)
        await backend.aclose()
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        tracking_uri: str | None = None,
        artifact_location: str | None = None,
        *,
        name: str = "mlflow",
        request_concurrency: int = DEFAULT_REQUEST_CONCURRENCY,
    ) -> None:
        if request_concurrency < 1:
            raise ValueError(f"request_concurrency must be >= 1, got {request_concurrency}")
        self.name = name
        self.experiment_name = experiment_name or default_experiment_name()
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self._uses_default_store = tracking_uri is None and self.tracking_uri.startswith(
            f"sqlite:///{DEFAULT_TRACKING_DIR}"
        )
        if artifact_location is None and self._uses_default_store:
            # Next to the database, not in ./mlruns of whatever the working directory is.
            artifact_location = str(DEFAULT_TRACKING_DIR / "artifacts")
        self.artifact_location_requested = artifact_location
        self.request_concurrency = request_concurrency
        _configure_http_client()
        if self._uses_default_store:
            DEFAULT_TRACKING_DIR.mkdir(parents=True, exist_ok=True)
        # Built here, on the caller's thread, not lazily in a worker: the first write may
        # happen in the exit hook, when Python refuses the imports and atexit registrations
        # MLflow makes on first use. No request is sent (a SQLite store is opened, though).
        self._client: Any = MlflowClient(tracking_uri=self.tracking_uri)
        self._log_batch_fn = _store_log_batch(self._client)
        # Everything below is touched from worker threads, under these locks.
        self._experiment: Any = None
        self._experiment_lock = threading.Lock()
        self._runs: dict[str, _RunRef] = {}
        self._run_locks: dict[str, threading.Lock] = {}
        self._run_locks_lock = threading.Lock()
        self._checked_metric_names: set[str] = set()
        self._locks_unavailable = False
        self.creation_wait_s = CREATION_WAIT_S

    def __repr__(self) -> str:
        return (
            f"AsyncMLflowTracker(experiment_name={self.experiment_name!r}, "
            f"tracking_uri={self.tracking_uri!r})"
        )

    # -- blocking helpers: run in worker threads only -------------------------------------------
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

    def _client_sync(self) -> Any:
        return self._client

    def _experiment_sync(self) -> Any:
        with self._experiment_lock:
            if self._experiment is not None:
                return self._experiment
            client = self._client_sync()
            exp = client.get_experiment_by_name(self.experiment_name)
            if exp is None:
                try:
                    exp_id = client.create_experiment(
                        self.experiment_name, artifact_location=self.artifact_location_requested
                    )
                except Exception as exc:
                    # Another process created it between our lookup and our create.
                    if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                        raise
                    exp = client.get_experiment_by_name(self.experiment_name)
                else:
                    exp = client.get_experiment(exp_id)
                if exp is None:
                    raise TransientBackendError(
                        f"MLflow experiment {self.experiment_name!r} vanished while created"
                    )
            if exp.lifecycle_stage != "active":
                raise PermanentBackendError(
                    f"MLflow experiment {self.experiment_name!r} is deleted: restore it "
                    "(mlflow experiments restore) or choose another experiment_name"
                )
            self._experiment = exp
            return exp

    def _run_lock(self, run_id: str) -> threading.Lock:
        with self._run_locks_lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    def _search(self, filter_string: str, max_results: int = 1000) -> list[Any]:
        client = self._client_sync()
        exp_id = self._experiment_sync().experiment_id
        found: list[Any] = []
        token: str | None = None
        while True:
            page = client.search_runs(
                [exp_id],
                filter_string=filter_string,
                run_view_type=ViewType.ACTIVE_ONLY,
                max_results=max_results,
                page_token=token,
            )
            found.extend(page)
            token = page.token
            if not token:
                return found

    def _candidates(self, run_id: str) -> list[Any]:
        """The live MLflow runs of ``run_id``, the winner first: the oldest, then the
        smallest MLflow id, so that every process picks the same one."""
        runs = self._search(f"tags.`{TAG_RUN_KEY}` = '{run_key(run_id)}'")
        return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))

    def _torchx_run(self, run_id: str) -> Any | None:
        """A run torchx's own MLflowTracker made for ``run_id`` (named after it, without our
        tags), adopted so that both trackers share it. Only for ids safe in a filter."""
        if any(c in run_id for c in "'\"`\\"):
            return None
        runs = self._search(f"attributes.run_name = '{run_id}'")
        runs.sort(key=lambda r: (r.info.start_time or 0, r.info.run_id))
        return runs[0] if runs else None

    def _create_candidate(self, run_id: str) -> str:
        """Creates one MLflow run for ``run_id``; returns its MLflow id."""
        client = self._client_sync()
        run = client.create_run(
            self._experiment_sync().experiment_id,
            start_time=int(time.time() * 1000),
            tags={TAG_RUN_ID: run_id, TAG_RUN_KEY: run_key(run_id)},
            run_name=run_id,
        )
        return str(run.info.run_id)

    def _resolve_sync(self, run_id: str, create: bool) -> str | None:
        """The MLflow id of ``run_id``'s run, created (once) if ``create`` and none exists.

        Looked up by tag; a run torchx's own tracker made for the id is adopted; else created
        under the creation lock (see :meth:`_create_once`).
        """
        ref = self._runs.get(run_id)
        if ref is not None:
            return ref.uuid
        with self._run_lock(run_id):  # one lookup per run id in this process at a time
            ref = self._runs.get(run_id)
            if ref is not None:
                return ref.uuid
            runs = self._candidates(run_id)
            if not runs:
                adopted = self._torchx_run(run_id)
                if adopted is not None:
                    client = self._client_sync()
                    client.set_tag(adopted.info.run_id, TAG_RUN_ID, run_id)
                    client.set_tag(adopted.info.run_id, TAG_RUN_KEY, run_key(run_id))
                    runs = self._candidates(run_id)
            if runs:
                uuid = str(runs[0].info.run_id)
            elif create:
                uuid = self._create_once(run_id)
            else:
                return None
            self._runs[run_id] = _RunRef(uuid)
            return uuid

    def _create_once(self, run_id: str) -> str:
        """Creates the MLflow run of ``run_id`` when several processes (ranks) may be trying
        at the same moment.

        MLflow has no conditional create for runs, and "search, create, search again, keep the
        oldest" is not enough: a run stamped earlier can become visible after another process
        has already chosen. Experiment names, though, are unique: creating the experiment
        ``async_tracker.locks/<experiment id>/<sha1(run id)>/<generation>`` succeeds for one
        process only. That process creates the run, then deletes the lock experiment (deleted
        experiments keep their name, so the lock stays taken and out of sight). The others
        wait, polling, for the run to appear. The generation counts the deleted runs of the
        id, so that a run deleted by hand can be created again.

        Fallback, when the store refuses lock experiments (permissions, naming rules) or the
        lock holder died before creating the run: create, search again, keep the oldest (start
        time, then id), delete ours if it lost. A process that later finds its run deleted
        forgets it and resolves again (see :meth:`_log_batch_sync`).
        """
        client = self._client_sync()
        held = self._acquire_creation_lock(run_id)
        if held is False:
            deadline = time.monotonic() + self.creation_wait_s
            while time.monotonic() < deadline:
                runs = self._candidates(run_id)
                if runs:
                    return str(runs[0].info.run_id)
                # Polling the server for another process's create: bounded, and short.
                time.sleep(CREATION_POLL_S)
            logger.warning(
                "async_tracker: the process that took the creation lock of MLflow run %r did "
                "not create it within %.0f s; creating it here", run_id, self.creation_wait_s,
            )
        mine = self._create_candidate(run_id)
        if isinstance(held, str):
            try:
                client.delete_experiment(held)
            except Exception as exc:
                logger.warning("async_tracker: could not delete MLflow lock experiment: %s", exc)
        runs = self._candidates(run_id)
        winner = str(runs[0].info.run_id) if runs else mine
        if winner != mine:
            logger.info(
                "async_tracker: MLflow run for %r was created concurrently by another "
                "process; using %s and deleting ours (%s)", run_id, winner, mine,
            )
            try:
                client.delete_run(mine)
            except Exception as exc:
                # Harmless for correctness: every process picks the older winner.
                logger.warning(
                    "async_tracker: could not delete duplicate MLflow run %s of %r: %s",
                    mine, run_id, exc,
                )
        return winner

    def _acquire_creation_lock(self, run_id: str) -> str | bool | None:
        """The lock experiment's id if we took it; False if another process holds it; None if
        the store refuses lock experiments (then: the fallback)."""
        if self._locks_unavailable:
            return None
        client = self._client_sync()
        exp_id = self._experiment_sync().experiment_id
        deleted = client.search_runs(
            [exp_id],
            filter_string=f"tags.`{TAG_RUN_KEY}` = '{run_key(run_id)}'",
            run_view_type=ViewType.DELETED_ONLY,
            max_results=1000,
        )
        name = f"{LOCK_EXPERIMENT_PREFIX}{exp_id}/{run_key(run_id)}/{len(deleted)}"
        try:
            return str(client.create_experiment(name))
        except Exception as exc:
            if getattr(exc, "error_code", None) == "RESOURCE_ALREADY_EXISTS":
                return False
            error = map_error(exc, "create_experiment (creation lock)")
            if isinstance(error, TransientBackendError):
                raise error from exc
            logger.warning(
                "async_tracker: the MLflow store refuses lock experiments (%s); runs created "
                "by several processes at once may be duplicated, then resolved", exc,
            )
            self._locks_unavailable = True
            return None

    def _forget(self, run_id: str, uuid: str) -> None:
        with self._run_lock(run_id):
            ref = self._runs.get(run_id)
            if ref is not None and ref.uuid == uuid:
                del self._runs[run_id]

    def _log_batch_sync(self, run_id: str, request: _Request) -> None:
        uuid = self._resolve_sync(run_id, create=True)
        assert uuid is not None
        try:
            self._log_batch_fn(
                uuid,
                [Metric(k, v, ms, step) for k, v, ms, step in request.metrics],
                [Param(k, v) for k, v in request.params],
                [RunTag(k, v) for k, v in request.tags],
            )
        except Exception as exc:
            if _is_run_not_active(exc):
                # Our run was deleted (by hand, or as the loser of a fallback creation race):
                # resolve again on the retry.
                self._forget(run_id, uuid)
                raise TransientBackendError(
                    f"MLflow run {uuid} of {run_id!r} is deleted; looking it up again"
                ) from exc
            raise
        ref = self._runs.get(run_id)
        if ref is not None:
            ref.written = True

    async def _send(self, run_id: str, requests: Sequence[_Request], batch: Batch) -> None:
        """Sends requests not yet in ``batch.done``, a few at a time. Each is marked done when
        stored; a failure cancels the rest, and the lane's retry sends only what is missing.

        Whatever fails leaves as one :class:`BackendError`, never an exception group: the
        errors of the requests that failed together are combined (transient if any is)."""
        try:
            await self._send_requests(run_id, requests, batch)
            return
        except BaseExceptionGroup as group:
            error = map_group(group, lambda e: map_error(e, "log_batch"))
            if error is None:  # a cancellation or an interrupt: not a failure of MLflow
                raise
            if all(error is not leaf for leaf in leaves(group)):
                error.__cause__ = group  # a combined error: the group shows each part
        stored = sum(1 for i in range(len(requests)) if f"mlflow:{i}" in batch.done)
        error.args = (f"{error} ({stored} of {len(requests)} requests of the flush stored)",)
        raise error

    async def _send_requests(
        self, run_id: str, requests: Sequence[_Request], batch: Batch
    ) -> None:
        parts = [(f"mlflow:{i}", r) for i, r in enumerate(requests)]
        todo = [(part, r) for part, r in parts if part not in batch.done]
        if not todo:
            return
        # The first request alone: it resolves (maybe creates) the run before the others race.
        part, first = todo[0]
        await self._blocking("log_batch", self._log_batch_sync, run_id, first)
        batch.done.add(part)
        if len(todo) == 1:
            return
        limiter = anyio.CapacityLimiter(self.request_concurrency)

        async def send(part: str, request: _Request) -> None:
            async with limiter:
                await self._blocking("log_batch", self._log_batch_sync, run_id, request)
            batch.done.add(part)

        async with anyio.create_task_group() as tg:
            for part, request in todo[1:]:
                tg.start_soon(send, part, request)

    # -- writes ----------------------------------------------------------------------------------
    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Stores one flush in as few log_batch requests as MLflow's limits allow.

        Entries MLflow would refuse (a key too long, a value over 8000 characters ...) are
        left out, the rest is stored, then ``RecordError(refused=N)`` names them: one bad key
        does not cost the thousands of metric points flushed with it, and the lane counts the
        N entries as dropped without splitting and sending the batch again. N counts entries
        (a metadata key, an artifact, a source, a metric point), at most ``batch.records``.

        Any other failure leaves as one :class:`BackendError` (see :func:`map_error`).
        """
        # The time stamped on source tags, kept for retries: the requests of a retry must be
        # exactly those of the first attempt, since parts done are skipped by index.
        now = float(batch.names.setdefault("mlflow:t", repr(time.time())))
        problems: list[str] = []
        tags = self._metadata_tags(batch.metadata, problems)
        for art in batch.artifacts.values():
            tags.extend(self._artifact_tags(art, problems))
        for src in batch.sources:
            tags.extend(self._source_tags(src, now, problems))
        metrics = self._metric_entries(batch.metrics, problems)
        await self._send(run_id, plan_requests(tags=tags, metrics=metrics), batch)
        if problems:
            refused = len(problems)
            if batch.records:
                refused = min(refused, batch.records)
            raise RecordError(
                f"MLflow refused {len(problems)} entries of run {run_id!r} (the rest of the "
                "flush was stored): " + "; ".join(problems),
                refused=refused,
            )

    def _metadata_tags(
        self, metadata: Mapping[str, object], problems: list[str]
    ) -> list[tuple[str, str]]:
        bad = metadata_problems(metadata)
        problems.extend(bad)
        if bad:
            return [
                (k, _dumps(v)) for k, v in metadata.items() if not metadata_problems({k: v})
            ]
        return [(k, _dumps(v)) for k, v in metadata.items()]

    def _artifact_tags(self, art: TrackerArtifact, problems: list[str]) -> list[tuple[str, str]]:
        bad = artifact_problems(art)
        problems.extend(bad)
        return [] if bad else [(_artifact_tag(art.name), _artifact_value(art))]

    def _source_tags(
        self, src: TrackerSource, now: float, problems: list[str]
    ) -> list[tuple[str, str]]:
        bad = source_problems(src)
        problems.extend(bad)
        if bad:
            return []
        return [
            (_source_tag(src.source_run_id, src.artifact_name), _source_value(src, now)),
            (_parent_tag(src.source_run_id), "1"),
        ]

    def _metric_entries(
        self, metrics: Sequence[TrackerMetric], problems: list[str]
    ) -> list[tuple[str, float, int, int]]:
        checked = self._checked_metric_names
        out = []
        for m in metrics:
            if m.name not in checked or not _INT64_MIN <= m.step <= _INT64_MAX:
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
        art = TrackerArtifact(name, path, dict(metadata) if metadata is not None else None)
        await self.write_batch(run_id, Batch(0, artifacts={name: art}))

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        await self.write_batch(run_id, Batch(0, sources=[TrackerSource(source_id, artifact_name)]))

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self.write_batch(run_id, Batch(0, metrics=list(metrics)))

    async def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """Logs MLflow params (immutable in MLflow: a key logged again must keep its value)."""
        problems = [p for k, v in params.items() if (p := _param_problem(k, v))]
        if problems:
            raise RecordError("; ".join(problems))
        requests = plan_requests(params=sorted(params.items()))
        await self._send(run_id, requests, Batch(0))

    async def log_params_flat(self, run_id: str, cfg: object, key: str = "") -> None:
        """Flattens ``cfg`` (dataclasses, mappings, sequences) as torchx does, and logs the
        result as params. See :func:`flatten_params`."""
        await self.log_params(run_id, flatten_params(cfg, key))

    # -- reads -------------------------------------------------------------------------------
    def _tags_sync(self, run_id: str) -> dict[str, str]:
        uuid = self._resolve_sync(run_id, create=False)
        if uuid is None:
            return {}
        return dict(self._client_sync().get_run(uuid).data.tags)

    async def _tags(self, run_id: str) -> dict[str, str]:
        return await self._blocking("get_run", self._tags_sync, run_id)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        """The run's tags, decoded, without MLflow's system tags (``mlflow.*``) and ours."""
        tags = await self._tags(run_id)
        return {
            k: _loads_tag(v)
            for k, v in sorted(tags.items())
            if not k.startswith(RESERVED_TAG_PREFIXES)
        }

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        tags = await self._tags(run_id)
        found: list[TrackerArtifact] = []
        for k, v in tags.items():
            if k.startswith(TAG_ARTIFACT_PREFIX):
                data = _decode_object(k, v)
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
                data = _decode_object(k, v)
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
        return self._search(f"tags.`{_parent_tag(parent_run_id)}` = '1'")

    async def lineage(self, run_id: str) -> Lineage:
        """Parents: the run's sources. Descendants: the runs of the experiment that name it
        as a source, each with the artifact name of that link."""
        parents = list(await self.sources(run_id))
        children = await self._blocking("search_runs", self._children_sync, run_id)
        descendants: list[tuple[float, TrackerSource]] = []
        for child in children:
            child_id = _run_id_of(child)
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
            runs = await self._blocking("search_runs", self._search, "")
        seen: dict[str, None] = {}
        for r in sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id)):
            seen.setdefault(_run_id_of(r), None)
        return list(seen)

    def _metrics_sync(self, run_id: str) -> dict[str, list[TrackerMetric]]:
        uuid = self._resolve_sync(run_id, create=False)
        if uuid is None:
            return {}
        client = self._client_sync()
        out: dict[str, list[TrackerMetric]] = {}
        for name in sorted(client.get_run(uuid).data.metrics):
            points = [
                TrackerMetric(name, _from_stored(m.value), int(m.step), m.timestamp / 1000.0)
                for m in client.get_metric_history(uuid, name)
            ]
            out[name] = sort_points(points)
        return out

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        """Every metric of the run, points ordered by step then time. Timestamps have MLflow's
        millisecond resolution; infinities come back as infinities."""
        return await self._blocking("get_metric_history", self._metrics_sync, run_id)

    # -- MLflow objects ------------------------------------------------------------------------
    async def experiment(self) -> Any:
        """The MLflow ``Experiment`` (created if missing)."""
        return await self._blocking("get_experiment", self._experiment_sync)

    async def get_run(self, run_id: str, create: bool = True) -> Any:
        """The MLflow ``Run`` of ``run_id`` (created if missing and ``create``), or None."""

        def get() -> Any:
            uuid = self._resolve_sync(run_id, create)
            return None if uuid is None else self._client_sync().get_run(uuid)

        return await self._blocking("get_run", get)

    # -- lifecycle ----------------------------------------------------------------------------
    def _terminate_sync(self, status: RunStatus) -> None:
        client = self._client_sync()
        errors: list[BaseException] = []
        for run_id, ref in list(self._runs.items()):
            if not ref.written:
                continue
            try:
                current = client.get_run(ref.uuid).info.status
                # Ranks share the run: a rank finishing well must not hide another's failure.
                if status == "FINISHED" and current in ("FAILED", "KILLED"):
                    ref.written = False
                    continue
                client.set_terminated(ref.uuid, status=status)
                ref.written = False
            except Exception as exc:
                errors.append(exc)
                logger.warning(
                    "async_tracker: could not end MLflow run %s of %r as %s: %s",
                    ref.uuid, run_id, status, exc,
                )
        if errors:
            raise errors[0]

    async def aclose(self, status: CloseReason | RunStatus | None = None) -> None:
        """Ends the MLflow runs this process wrote to: FINISHED, or FAILED when the process is
        exiting on an exception (see :func:`exiting_on_exception`), or ``status``. A run
        another rank already marked FAILED or KILLED keeps that status. Idempotent; writes
        afterwards still land (MLflow accepts writes to ended runs)."""
        if status is None:
            status = "FAILED" if exiting_on_exception() else "FINISHED"
        status = cast(RunStatus, status.upper())
        if not any(ref.written for ref in self._runs.values()):
            return
        await self._blocking("set_terminated", self._terminate_sync, status)

    async def __aenter__(self) -> AsyncMLflowTracker:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose("FINISHED" if exc is None else "FAILED")


def _store_log_batch(client: Any) -> Callable[[str, list[Any], list[Any], list[Any]], None]:
    """``log_batch(run_id, metrics, params, tags)`` of the client's tracking store.

    ``AbstractStore.log_batch`` is the interface tracking-store plugins implement. Called
    directly, it skips what ``MlflowClient.log_batch`` adds and we do not need (re-wrapping
    every metric, chunking: our requests are already within the limits), about 12% of the
    time of a 1000-point request against a local server. The client's method if the store is
    not reachable so (another MLflow version).
    """
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    fn = getattr(store, "log_batch", None)
    if callable(fn):
        return lambda run_id, metrics, params, tags: fn(
            run_id=run_id, metrics=metrics, params=params, tags=tags
        )
    return lambda run_id, metrics, params, tags: client.log_batch(
        run_id, metrics=metrics, params=params, tags=tags
    )


def _decode_object(key: str, value: str) -> dict[str, Any] | None:
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        logger.warning("async_tracker: skipping MLflow tag %r: not what we wrote", key)
        return None
    return data


def _run_id_of(run: Any) -> str:
    return str(run.data.tags.get(TAG_RUN_ID) or run.info.run_name or run.info.run_id)


def _from_stored(value: float) -> float:
    if value == _FLOAT_MAX:
        return float("inf")
    if value == -_FLOAT_MAX:
        return float("-inf")
    return float(value)


# =============================================================================================
# log_params_flat


def _is_primitive(value: object) -> bool:
    return isinstance(value, (str, int, float, bool))


def flatten_params(cfg: object, key: str = "") -> dict[str, str]:
    """torchx's ``log_params_flat`` flattening, as ``{param key: value}``.

    Dataclasses and mappings recurse with ``parent.child`` keys; a sequence (or set) of
    primitives is one param (``"['a', 'b']"``), a sequence of anything else recurses per
    element with ``parent._<index>``; empty containers and ``None`` are logged as they print;
    other objects as ``str()``. Keys and values are checked against MLflow's limits here, so a
    bad one raises ``ValueError`` naming it before anything is sent.

    >>> flatten_params({"lr": 0.1, "layers": [{"n": 2}], "tags": ["a", "b"]})
    {'lr': '0.1', 'layers._0.n': '2', 'tags': "['a', 'b']"}
    """
    out: dict[str, str] = {}
    _flatten(cfg, key, out)
    return out


def _flatten(cfg: object, key: str, out: dict[str, str]) -> None:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    prefix = f"{key}." if key else ""
    if isinstance(cfg, Mapping) and cfg:
        for k, v in cfg.items():
            _flatten(v, f"{prefix}{k}", out)
    elif isinstance(cfg, (Sequence, set, frozenset)) and not isinstance(cfg, (str, bytes)) and cfg:
        if _is_primitive(next(iter(cfg))):
            _put_param(out, key, cfg)
        else:
            for i, elem in enumerate(cfg):
                _flatten(elem, f"{prefix}_{i}", out)
    else:
        _put_param(out, key, cfg)


def _put_param(out: dict[str, str], key: str, value: object) -> None:
    if not key:
        raise ValueError(f"log_params_flat: a bare value ({value!r}) needs a key")
    text = str(value)
    problem = _param_problem(key, text)
    if problem:
        raise ValueError(problem)
    if key in out and out[key] != text:
        raise ValueError(f"param {key!r}: two values flatten to this key ({out[key]!r}, {text!r})")
    out[key] = text


# =============================================================================================
# The sync face


class MLflowTracker(SyncTracker):
    """torchx's ``MLflowTracker``, over :class:`AsyncMLflowTracker`.

    Each call blocks until MLflow has stored or answered. Given to an ``AppRun``, it is
    unwrapped: the run's writes never block. Call :meth:`close` when the job ends, so that
    the MLflow run ends FINISHED (or FAILED) instead of staying RUNNING.

    Example::

        tracker = MLflowTracker("demo", "http://127.0.0.1:5000")
        tracker.add_metadata("my-run", lr=0.01)
        tracker.log_params_flat("my-run", Config())
        tracker.close()
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        tracking_uri: str | None = None,
        artifact_location: str | None = None,
        *,
        name: str = "mlflow",
    ) -> None:
        self.mlflow = AsyncMLflowTracker(
            experiment_name, tracking_uri, artifact_location, name=name
        )
        super().__init__(self.mlflow)

    default_experiment_name = staticmethod(default_experiment_name)

    @property
    def tracking_uri(self) -> str:
        return self.mlflow.tracking_uri

    @property
    def experiment_name(self) -> str:
        return self.mlflow.experiment_name

    @property
    def experiment(self) -> Any:
        """The MLflow ``Experiment`` (looked up, or created, on first use)."""
        return self._call(self.mlflow.experiment)

    @property
    def experiment_id(self) -> str:
        return str(self.experiment.experiment_id)

    @property
    def artifact_location(self) -> str:
        return str(self.experiment.artifact_location)

    def get_run(self, run_name: str) -> Any:
        """The MLflow ``Run`` for ``run_name`` (a torchx run id), created if missing."""
        check_name(run_name, "run_id")
        return self._call(self.mlflow.get_run, run_name)

    def get_run_id(self, run_name: str) -> str:
        """The MLflow id of the run for ``run_name``."""
        return str(self.get_run(run_name).info.run_id)

    # MLflow's limits, checked here on the caller's thread: bad input raises ValueError at the
    # call site and nothing of the call is sent.
    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        _raise_value_error(metadata_problems(check_metadata(kwargs)))
        super().add_metadata(run_id, **kwargs)

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        _raise_value_error(artifact_problems(check_artifact(name, path, metadata)))
        super().add_artifact(run_id, name, path, metadata)

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        _raise_value_error(source_problems(check_source(source_id, artifact_name)))
        super().add_source(run_id, source_id, artifact_name)

    def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        metrics = list(metrics)
        _raise_value_error([p for m in metrics if (p := metric_problem(m))])
        super().add_metrics(run_id, metrics)

    def log_params_flat(self, run_name: str, cfg: Any, key: str = "") -> None:
        """Logs ``cfg`` (a dataclass, mapping or sequence, nested) as flat MLflow params, as
        torchx does: ``{"opt": {"lr": 0.1}, "layers": [8, 8]}`` gives ``opt.lr = 0.1`` and
        ``layers = [8, 8]``. See :func:`flatten_params`."""
        check_name(run_name, "run_id")
        params = flatten_params(cfg, key)  # on the caller's thread: errors raise here
        self._call(self.mlflow.log_params, run_name, params)

    def close(self, status: CloseReason | RunStatus | None = None) -> None:
        """Ends the runs this process wrote to: FINISHED, or FAILED when called while an
        exception propagates or as the process exits on one (decided here, in the caller's
        thread, which is where that is known)."""
        if status is None:
            status = "FAILED" if exiting_on_exception() else "FINISHED"
        self._call(self.mlflow.aclose, status)

    def __enter__(self) -> MLflowTracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close("FINISHED" if exc is None else "FAILED")

    def __repr__(self) -> str:
        return (
            f"MLflowTracker(experiment_name={self.experiment_name!r}, "
            f"tracking_uri={self.tracking_uri!r})"
        )


# =============================================================================================
# The factory


def read_config(config: str | None) -> dict[str, str | None]:
    """The ``[tracker:mlflow]`` section of a ``.torchxconfig``: ``config`` is a directory
    holding one, or the file's path. ``None`` or empty: no config (defaults). Anything that
    cannot be read is a :class:`TrackerConfigError` saying why."""
    if config is None or not config.strip():
        return {}
    path = Path(config).expanduser()
    if path.is_dir():
        file = path / CONFIG_FILE_NAME
        if not file.is_file():
            raise TrackerConfigError(
                f"mlflow tracker config: directory {str(path)!r} has no {CONFIG_FILE_NAME} file"
            )
    elif path.is_file():
        file = path
    else:
        raise TrackerConfigError(
            f"mlflow tracker config {config!r} is neither a directory holding "
            f"{CONFIG_FILE_NAME} nor a config file"
        )
    # No interpolation: a '%' in a URI (an encoded password) must stay as written.
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(file, encoding="utf-8") as f:
            parser.read_file(f)
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        raise TrackerConfigError(
            f"mlflow tracker config {str(file)!r} cannot be read: {type(exc).__name__}: {exc}"
        ) from exc
    if not parser.has_section(CONFIG_SECTION):
        raise TrackerConfigError(
            f"mlflow tracker config {str(file)!r} has no [{CONFIG_SECTION}] section "
            f"(sections: {', '.join(parser.sections()) or 'none'})"
        )
    values = dict(parser.items(CONFIG_SECTION))
    values.pop("config", None)  # reserved by torchx for the tracker's own config string
    unknown = sorted(set(values) - set(CONFIG_KEYS))
    if unknown:
        raise TrackerConfigError(
            f"mlflow tracker config {str(file)!r}: unknown keys {unknown} in "
            f"[{CONFIG_SECTION}] (known: {', '.join(CONFIG_KEYS)})"
        )
    return {k: (v.strip() or None) for k, v in values.items()}


def create_tracker(config: str | None = None) -> MLflowTracker:
    """The ``mlflow`` tracker factory (``TORCHX_TRACKERS=mlflow``).

    ``config`` is what torchx passes: a directory holding ``.torchxconfig``, or that file's
    path, whose ``[tracker:mlflow]`` section may set ``experiment_name``, ``tracking_uri`` and
    ``artifact_location``. ``$TORCHX_TRACKING_EXPERIMENT_NAME`` overrides the experiment name
    (torchx's ``dist.spmd`` sets it).
    """
    values = read_config(config)
    experiment_name = os.environ.get(ENV_EXPERIMENT_NAME) or values.get("experiment_name")
    return MLflowTracker(
        experiment_name=experiment_name,
        tracking_uri=values.get("tracking_uri"),
        artifact_location=values.get("artifact_location"),
    )
