"""The MLflow mapping against a real server: one run per run id, tags, metrics with client
timestamps, requests cut to MLflow's limits, limits checked, run status, error mapping, and
the run-creation race."""

from __future__ import annotations

import json
import math
import secrets
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from async_tracker import (
    AppRun,
    Batch,
    RetryPolicy,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
)
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.backend.mlflow import (
    MAX_ITEMS_PER_REQUEST,
    MAX_METRICS_PER_REQUEST,
    MAX_REQUEST_BYTES,
    MAX_TAGS_PER_REQUEST,
    TAG_RUN_ID,
    TAG_RUN_KEY,
    AsyncMLflowTracker,
    MLflowTracker,
    default_tracking_uri,
    map_error,
    plan_requests,
    run_key,
)
from async_tracker.backend.mlflow.runs import RunBook, RunRef
from async_tracker.errors import (
    BackendError,
    PermanentBackendError,
    RecordError,
    TransientBackendError,
    classify,
)
from async_tracker.runtime.process import exiting_on_exception
from tests.core.helpers import free_port, python_env

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import ExceptionGroup

FAST_RETRY = RetryPolicy(
    max_attempts=3, initial_backoff_s=0, max_backoff_s=0, jitter_s=0, cooldown_s=3600
)


@pytest.fixture
def tracker(tracking_uri: str, experiment_name: str) -> Iterator[MLflowTracker]:
    t = MLflowTracker(experiment_name, tracking_uri)
    yield t
    t.close()


def uuid_of(ref: RunRef | None) -> str:
    assert ref is not None
    return ref.uuid


def runs_of(client: Any, experiment_name: str, deleted: bool = False) -> list[Any]:
    from mlflow.entities import ViewType

    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        return []
    view = ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY
    return list(client.search_runs([exp.experiment_id], run_view_type=view))


class LogBatchSpy:
    """Records the requests the tracker's client sends (and sends them)."""

    def __init__(self, tracker: AsyncMLflowTracker) -> None:
        self.calls: list[dict[str, list[Any]]] = []
        real = tracker.client.log_batch
        lock = threading.Lock()

        def log_batch(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
            with lock:
                self.calls.append(
                    {"metrics": list(metrics), "params": list(params), "tags": list(tags)}
                )
            real(run_id, metrics=metrics, params=params, tags=tags)

        tracker.client.log_batch = log_batch


# -- the run ------------------------------------------------------------------------------------
def test_one_mlflow_run_per_run_id_named_and_tagged(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    for _ in range(2):  # two trackers: nothing cached between them
        t = MLflowTracker(experiment_name, tracking_uri)
        with AppRun("job-1", [t], flush_interval=3600) as run:
            run.add_metadata(attempt=1)
            run.log_metric("loss", 0.5)
        t.close()
    (run,) = runs_of(client, experiment_name)
    assert run.info.run_name == "job-1"
    assert run.data.tags[TAG_RUN_ID] == "job-1"
    assert run.data.tags[TAG_RUN_KEY] == run_key("job-1")
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 2


def test_metadata_tags_are_json_and_foreign_tags_read_as_strings(
    tracker: MLflowTracker, client: Any
) -> None:
    tracker.add_metadata("r", n=3, s="3", cfg={"a": [1, None]})
    run = tracker.get_run("r")
    tags = run.data.tags
    assert (tags["n"], tags["s"], tags["cfg"]) == ("3", '"3"', '{"a":[1,null]}')
    client.set_tag(run.info.run_id, "set.in.ui", "hello world")
    assert tracker.metadata("r") == {
        "n": 3,
        "s": "3",
        "cfg": {"a": [1, None]},
        "set.in.ui": "hello world",
    }


def test_metric_points_keep_client_timestamps_and_steps(
    tracker: MLflowTracker, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    times = iter([1_700_000_000.123, 1_700_000_001.456, 1_700_000_002.789])
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: next(times))
    with AppRun("r", [tracker], flush_interval=3600) as run:
        run.log_metric("loss", 1.0, step=10)
        run.log_metric("loss", 0.5)  # step 11
        run.log_metric("loss", math.inf, step=20)
    history = client.get_metric_history(tracker.get_run_id("r"), "loss")
    assert sorted((m.step, m.timestamp) for m in history) == [
        (10, 1_700_000_000_123),
        (11, 1_700_000_001_456),
        (20, 1_700_000_002_789),
    ]
    points = tracker.metrics("r")["loss"]
    assert [p.value for p in points] == [1.0, 0.5, math.inf]
    assert points[0].timestamp == pytest.approx(1_700_000_000.123, abs=1e-6)


# -- requests within MLflow's limits --------------------------------------------------------------
def test_plan_requests_respects_every_limit() -> None:
    tags = [(f"k{i}", "v" * 7000) for i in range(250)]
    metrics = [(f"m{i % 7}", 0.5, 1000 + i, i) for i in range(4321)]
    params = [(f"p{i}", "x") for i in range(130)]
    requests = plan_requests(tags=tags, metrics=metrics, params=params)
    for r in requests:
        assert len(r.tags) <= MAX_TAGS_PER_REQUEST and len(r.params) <= 100
        assert len(r.metrics) <= MAX_METRICS_PER_REQUEST
        assert r.items <= MAX_ITEMS_PER_REQUEST
        body = json.dumps(
            {
                "tags": [{"key": k, "value": v} for k, v in r.tags],
                "params": [{"key": k, "value": v} for k, v in r.params],
                "metrics": [
                    {"key": k, "value": v, "timestamp": t, "step": s} for k, v, t, s in r.metrics
                ],
            },
            indent=2,
        )
        assert len(body) < MAX_REQUEST_BYTES
    assert [t for r in requests for t in r.tags] == tags
    assert [p for r in requests for p in r.params] == params
    assert [m for r in requests for m in r.metrics] == metrics
    assert plan_requests(tags, metrics, params) == requests  # deterministic: retries match


async def test_big_flush_is_cut_into_requests_mlflow_accepts(
    tracking_uri: str, experiment_name: str
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri, metadata_params=False)
    metadata = {f"key{i}": "v" * 7000 for i in range(150)}  # > 100 tags and > 1 MB
    metrics = [TrackerMetric(f"m{i % 3}", float(i), i // 3, 1_700_000_000 + i) for i in range(2500)]
    await backend.write_batch("big", Batch(0, metadata=metadata, metrics=metrics))
    spy = LogBatchSpy(backend)
    await backend.write_batch("big", Batch(1, metadata=metadata, metrics=metrics))  # again
    assert len(spy.calls) >= 3
    assert all(len(c["tags"]) <= 100 and len(c["metrics"]) <= 1000 for c in spy.calls)
    assert dict(await backend.metadata("big")) == metadata
    got = await backend.metrics("big")
    assert sum(len(v) for v in got.values()) == 2500  # the second write stored nothing twice
    await backend.aclose()


async def test_write_batch_retry_skips_requests_already_stored(
    tracking_uri: str, experiment_name: str
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    metrics = [TrackerMetric("m", float(i), i, 1_700_000_000 + i) for i in range(2500)]
    batch = Batch(0, sources=[TrackerSource("parent", None)], metrics=metrics)
    await backend.write_batch("r", batch)
    # [2 tags + 998, 1000, 403], then 99 points with the writer's summary.
    assert batch.done == {"mlflow:0", "mlflow:1", "mlflow:2", "mlflow:3"}
    assert "mlflow:t" in batch.names  # what the source tags were stamped with, kept
    spy = LogBatchSpy(backend)
    await backend.write_batch("r", batch)
    assert spy.calls == []
    batch.done.discard("mlflow:1")  # as if that request had failed
    await backend.write_batch("r", batch)
    assert [len(c["metrics"]) for c in spy.calls] == [1000]
    assert len((await backend.metrics("r"))["m"]) == 2500
    await backend.aclose()


# -- MLflow's limits -------------------------------------------------------------------------------
def test_limits_checked_at_the_call_site_of_the_sync_face(
    tracker: MLflowTracker, client: Any, experiment_name: str
) -> None:
    long_key = "k" * 251
    with pytest.raises(ValueError, match=r"metadata key 'kkkk.*251 characters; MLflow allows 250"):
        tracker.add_metadata("r", **{long_key: 1})
    with pytest.raises(ValueError, match=r"metadata 'big': its value is 8002 characters"):
        tracker.add_metadata("r", big="x" * 8000)
    with pytest.raises(ValueError, match=r"'mlflow.runName'.*reserved"):
        tracker.add_metadata("r", **{"mlflow.runName": "other"})
    with pytest.raises(ValueError, match=r"metric name 'loss@1'"):
        tracker.add_metrics("r", [TrackerMetric("loss@1", 1.0, 0, 1.0)])
    with pytest.raises(ValueError, match=r"artifact 'a'"):
        tracker.add_artifact("r", "a", "/p", {"blob": "x" * 8000})
    with pytest.raises(ValueError, match=r"param 'p'"):
        tracker.log_params_flat("r", {"p": "x" * 6001})
    assert runs_of(client, experiment_name) == []  # nothing of those calls was sent


def test_apprun_refuses_what_mlflow_would_at_the_call_site(tracker: MLflowTracker) -> None:
    mem = InMemoryTracker()
    with AppRun("r", [tracker, mem], flush_interval=3600, retry=FAST_RETRY) as run:
        with pytest.raises(ValueError, match=r"metadata key 'kkkk.*300 characters"):
            run.add_metadata(good=1, **{"k" * 300: 2})
        with pytest.raises(ValueError, match=r"metadata 'notes' as MLflow params.*7000"):
            run.add_metadata(notes="n" * 7000)  # a tag could hold it, its param could not
        with pytest.raises(ValueError, match=r"metric name 'loss@1'"):
            run.log_metrics({"acc": 0.5, "loss@1": 1.0}, step=0)
        with pytest.raises(ValueError, match=r"artifact '\.\./up'"):
            run.add_artifact("../up", "/tmp/model.pt")  # a local file: uploaded under its name
        with pytest.raises(ValueError, match=r"'mlflow.note'.*reserved"):
            run.add_metadata(**{"mlflow.note": "x"})
        run.add_artifact("../up", "s3://bucket/model.pt")  # a URI is only recorded: fine
        run.add_metadata(good=1)
        for step in range(100):
            run.log_metric("loss", 1.0, step=step)
        report = run.flush()
    # Nothing of the refused calls was kept, by any backend; the rest was stored.
    assert report.ok and report.delivered == 2 * 102, report
    assert tracker.metadata("r") == mem.runs["r"].metadata == {"good": 1}
    assert list(tracker.metrics("r")) == ["loss"] and len(tracker.metrics("r")["loss"]) == 100
    assert list(tracker.artifacts("r")) == ["../up"]


def test_without_metadata_params_only_tag_limits_apply(
    tracking_uri: str, experiment_name: str
) -> None:
    tracker = MLflowTracker(experiment_name, tracking_uri, metadata_params=False)
    with AppRun("r", [tracker], flush_interval=3600) as run:
        run.add_metadata(notes="n" * 7000)
    assert tracker.metadata("r") == {"notes": "n" * 7000}
    assert tracker.get_run("r").data.params == {}


async def test_metadata_too_long_for_a_param_reaching_write_batch_keeps_its_tag(
    tracking_uri: str, experiment_name: str
) -> None:
    # Not through validate (a spool replayed into MLflow, say): the tag holds the value, the
    # param is left out, and nothing is refused.
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    await backend.write_batch("r", Batch(0, metadata={"notes": "n" * 7000, "lr": 0.1}))
    assert await backend.metadata("r") == {"notes": "n" * 7000, "lr": 0.1}
    assert (await backend.get_run("r")).data.params == {"lr": "0.1"}
    await backend.aclose()


# -- run status ------------------------------------------------------------------------------------
def test_close_ends_finished_and_failed_inside_an_exception(
    tracking_uri: str, experiment_name: str
) -> None:
    ok = MLflowTracker(experiment_name, tracking_uri)
    ok.add_metadata("fine", a=1)
    ok.close()
    assert ok.get_run("fine").info.status == "FINISHED"
    ok.close()  # idempotent

    bad = MLflowTracker(experiment_name, tracking_uri)
    bad.add_metadata("broken", a=1)
    try:
        raise RuntimeError("training diverged")
    except RuntimeError:
        bad.close()  # while the exception propagates: FAILED
    assert bad.get_run("broken").info.status == "FAILED"

    # Another rank ending well afterwards does not hide the failure.
    other_rank = MLflowTracker(experiment_name, tracking_uri)
    other_rank.add_metadata("broken", rank=1)
    other_rank.close()
    assert other_rank.get_run("broken").info.status == "FAILED"

    with pytest.raises(ValueError), MLflowTracker(experiment_name, tracking_uri) as ctx:
        ctx.add_metadata("ctx", a=1)
        raise ValueError("boom")
    assert ok.get_run("ctx").info.status == "FAILED"


def test_exiting_on_exception_sees_the_propagating_exception() -> None:
    assert not exiting_on_exception()
    try:
        raise KeyError("x")
    except KeyError:
        assert exiting_on_exception()
    try:
        raise SystemExit(0)
    except SystemExit:
        assert not exiting_on_exception()


# -- errors ----------------------------------------------------------------------------------------
def test_connection_failures_are_transient_and_refusals_are_about_records(
    tracker: MLflowTracker,
) -> None:
    dead = AsyncMLflowTracker("x", f"http://127.0.0.1:{free_port()}")
    dead_sync = MLflowTracker("x", dead.tracking_uri)
    with pytest.raises(TransientBackendError, match="MLflow get_run failed"):
        dead_sync.metadata("r")

    tracker.log_params_flat("r", {"lr": 0.1})
    tracker.log_params_flat("r", {"lr": 0.1})  # the same value again is fine
    with pytest.raises(RecordError, match="INVALID_PARAMETER_VALUE") as info:
        tracker.log_params_flat("r", {"lr": 0.2})  # MLflow params are immutable
    assert "Changing param values is not allowed" in str(info.value)
    assert classify(info.value) == "record"


async def test_entries_mlflow_would_refuse_are_counted_and_the_rest_stored(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    metrics = [TrackerMetric("loss", float(i), i, 1_700_000_000 + i) for i in range(100)]
    metrics.append(TrackerMetric("bad@name", 1.0, 0, 1_700_000_000))
    batch = Batch(
        0,
        metadata={"good": 1, "too_long": "x" * 9000, "k" * 251: 1},
        artifacts={"model": TrackerArtifact("model", "/m", {"blob": "y" * 8000})},
        metrics=metrics,
        records=104,
    )
    with pytest.raises(RecordError) as info:
        await backend.write_batch("refused", batch)
    error = info.value
    assert error.refused == 4  # two metadata keys, the artifact, the metric point
    assert classify(error) == "record"
    message = str(error)
    assert "MLflow refused 4 entries" in message and "'too_long'" in message
    assert "'model'" in message and "bad@name" in message
    # The rest is stored, once: a retry of the batch sends nothing again.
    assert await backend.metadata("refused") == {"good": 1}
    assert await backend.artifacts("refused") == {}
    assert len((await backend.metrics("refused"))["loss"]) == 100
    assert batch.done == {"mlflow:0"}
    await backend.aclose()


async def test_refused_is_at_most_the_records_of_the_batch() -> None:
    backend = AsyncMLflowTracker("x", f"http://127.0.0.1:{free_port()}")
    # One add_metadata call (one record) with two keys MLflow refuses: nothing to send, so
    # no request reaches the (absent) server.
    batch = Batch(0, metadata={"a" * 300: 1, "b" * 300: 2}, records=1)
    with pytest.raises(RecordError) as info:
        await backend.write_batch("r", batch)
    assert info.value.refused == 1


def mlflow_error(code: int, message: str = "x") -> Exception:
    from mlflow.exceptions import MlflowException

    return MlflowException(message, error_code=code)


def rest_error(code: str, message: str) -> Exception:
    """What the client raises for a JSON error answer of the server."""
    from mlflow.exceptions import RestException

    return RestException({"error_code": code, "message": message})


def test_map_error_by_mlflow_error_code() -> None:
    from mlflow.protos import databricks_pb2 as codes

    cases: list[tuple[Exception, type[BackendError]]] = [
        (mlflow_error(codes.TEMPORARILY_UNAVAILABLE), TransientBackendError),
        (mlflow_error(codes.INTERNAL_ERROR), TransientBackendError),
        (mlflow_error(codes.REQUEST_LIMIT_EXCEEDED), TransientBackendError),
        (mlflow_error(codes.RESOURCE_EXHAUSTED), TransientBackendError),
        (mlflow_error(codes.DEADLINE_EXCEEDED), TransientBackendError),
        (mlflow_error(codes.RESOURCE_DOES_NOT_EXIST), PermanentBackendError),
        (mlflow_error(codes.PERMISSION_DENIED), PermanentBackendError),
        (mlflow_error(codes.UNAUTHENTICATED), PermanentBackendError),
        (mlflow_error(codes.CUSTOMER_UNAUTHORIZED), PermanentBackendError),
        (mlflow_error(codes.BAD_REQUEST), PermanentBackendError),
        # INVALID_PARAMETER_VALUE: about a record when the message says so ...
        (
            rest_error(
                "INVALID_PARAMETER_VALUE",
                "Invalid value \"x@y\" for parameter 'metrics[3].name' supplied: Names may "
                "only contain alphanumerics, underscores (_), dashes (-), periods (.), "
                "spaces ( ), colon(:) and slashes (/).",
            ),
            RecordError,
        ),
        (
            rest_error(
                "INVALID_PARAMETER_VALUE",
                "'tags[0].value' exceeds the maximum length of 8000 characters",
            ),
            RecordError,
        ),
        (
            mlflow_error(
                codes.INVALID_PARAMETER_VALUE,
                "'Param key' exceeds the maximum length of 250 characters",
            ),
            RecordError,
        ),
        (
            rest_error(
                "INVALID_PARAMETER_VALUE",
                "Changing param values is not allowed. Param with key='lr' was already "
                "logged with value='0.1' for run ID='abc'. Attempted logging new value '0.2'.",
            ),
            RecordError,
        ),
        (
            rest_error(
                "INVALID_PARAMETER_VALUE",
                "A batch logging request can contain at most 1000 metrics. Got 1001 metrics.",
            ),
            RecordError,
        ),
        # ... and about the backend otherwise (never a RecordError for what is unknown).
        (
            rest_error(
                "INVALID_PARAMETER_VALUE", "Invalid value 123 for parameter 'run_id' supplied."
            ),
            PermanentBackendError,
        ),
        (mlflow_error(codes.INVALID_PARAMETER_VALUE, "x"), PermanentBackendError),
        (ValueError("bad"), PermanentBackendError),
        (KeyError("k"), PermanentBackendError),
    ]
    for exc, kind in cases:
        mapped = map_error(exc, "log_batch")
        assert type(mapped) is kind, (exc, mapped)
        assert str(mapped).startswith("MLflow log_batch failed: ")


def test_map_error_of_connections_statuses_and_locked_databases(tmp_path: Path) -> None:
    import requests
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2 as codes

    assert isinstance(map_error(requests.ConnectionError("refused"), "w"), TransientBackendError)
    assert isinstance(map_error(requests.ReadTimeout("slow"), "w"), TransientBackendError)
    try:
        try:
            raise requests.exceptions.ConnectionError("refused")
        except Exception as inner:
            # what mlflow.utils.rest_utils.http_request raises on a connection failure
            raise MlflowException(f"API request failed with exception {inner}") from None
    except MlflowException as exc:
        exc.__context__ = requests.exceptions.ConnectionError("refused")
        assert isinstance(map_error(exc, "w"), TransientBackendError)

    for status, kind in [
        (429, TransientBackendError),
        (503, TransientBackendError),
        (500, TransientBackendError),
        (413, RecordError),
        (403, PermanentBackendError),
        (404, PermanentBackendError),
    ]:
        response = requests.Response()
        response.status_code = status
        error = requests.HTTPError(f"{status} answer", response=response)
        assert type(map_error(error, "w")) is kind, status

    # A SQLite store locked by another writer (a real lock, on a real file; MLflow's own
    # store waits 20 s for it before failing, too long for a test).
    path = tmp_path / "store.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("create table t (x)")
    holder.execute("begin exclusive")
    other = sqlite3.connect(path, timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError) as locked:
            other.execute("insert into t values (1)")
    finally:
        other.close()
        holder.execute("rollback")
        holder.close()
    assert "database is locked" in str(locked.value)
    assert isinstance(map_error(locked.value, "w"), TransientBackendError)
    wrapped = sqlalchemy.exc.OperationalError("insert", {}, locked.value)
    # MLflow's store says TEMPORARILY_UNAVAILABLE; other paths say otherwise: the message
    # decides.
    as_mlflow = MlflowException(str(wrapped), error_code=codes.BAD_REQUEST)
    assert isinstance(map_error(as_mlflow, "w"), TransientBackendError)
    assert isinstance(map_error(wrapped, "w"), TransientBackendError)


def test_map_error_unwraps_exception_groups() -> None:
    from mlflow.protos import databricks_pb2 as codes

    transient = mlflow_error(codes.TEMPORARILY_UNAVAILABLE)
    denied = mlflow_error(codes.PERMISSION_DENIED)
    refused = rest_error("INVALID_PARAMETER_VALUE", "Duplicate parameter keys have been sent")
    group = ExceptionGroup("flush", [denied, ExceptionGroup("inner", [transient])])
    mapped = map_error(group, "log_batch")
    assert type(mapped) is TransientBackendError  # transient if any part is
    assert "PERMISSION_DENIED" in str(mapped)
    assert type(map_error(ExceptionGroup("f", [denied, refused]), "w")) is PermanentBackendError
    assert type(map_error(ExceptionGroup("f", [refused, refused]), "w")) is RecordError


def test_http_client_fails_fast_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch, tracking_uri: str
) -> None:
    import os

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")
    AsyncMLflowTracker("x", tracking_uri)
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "77"


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")
def test_default_tracking_uri_is_a_local_sqlite_store_that_works(
    monkeypatch: pytest.MonkeyPatch, default_store_dir: Path
) -> None:
    assert default_tracking_uri() == f"sqlite:///{default_store_dir / 'mlflow.db'}"
    t = MLflowTracker()
    assert t.tracking_uri == default_tracking_uri()
    assert t.experiment_name.startswith("default-experiment/")
    with AppRun("local", [t], flush_interval=3600) as run:
        run.add_metadata(a=1)
        run.log_metric("loss", 0.5, step=3)
    t.close()
    assert t.metadata("local") == {"a": 1}
    assert [p.step for p in t.metrics("local")["loss"]] == [3]
    assert t.get_run("local").info.status == "FINISHED"
    # Artifacts of the default store go next to it, not to ./mlruns.
    assert t.artifact_location.startswith(str(default_store_dir))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example.invalid:5000")
    assert MLflowTracker().tracking_uri == "http://example.invalid:5000"


# -- races and strays --------------------------------------------------------------------------
def test_concurrent_creation_makes_one_run(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    """Four trackers (as four ranks) all find no run and all go to create it at the same
    moment: one takes the creation lock and creates it, the others wait for it."""
    n = 4
    barrier = threading.Barrier(n, timeout=30)

    def racing(book: RunBook) -> RunBook:
        acquire = book.acquire_creation_lock

        def after_everyone_searched(run_id: str) -> str | bool | None:
            barrier.wait()  # every tracker has searched and found nothing
            return acquire(run_id)

        book.acquire_creation_lock = after_everyone_searched  # type: ignore[method-assign]
        return book

    books = [racing(AsyncMLflowTracker(experiment_name, tracking_uri).runs) for _ in range(n)]
    books[0].experiment()  # the experiment exists; the race is on the run
    with ThreadPoolExecutor(n) as pool:
        uuids = list(pool.map(lambda b: uuid_of(b.resolve("raced", True)), books))
    assert len(set(uuids)) == 1
    (live,) = runs_of(client, experiment_name)
    assert live.info.run_id == uuids[0]
    assert runs_of(client, experiment_name, deleted=True) == []  # no duplicate was made
    # The lock is a deleted experiment: out of the experiment list.
    names = [e.name for e in client.search_experiments()]
    assert not [n for n in names if n.startswith("async_tracker.locks/")]


def test_a_lock_whose_holder_died_does_not_block_creation(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    exp_id = backend.runs.experiment().experiment_id
    client.create_experiment(f"async_tracker.locks/{exp_id}/{run_key('orphan')}/0")
    backend.runs.creation_wait_s = 0.2
    uuid = uuid_of(backend.runs.resolve("orphan", True))
    (live,) = runs_of(client, experiment_name)
    assert live.info.run_id == uuid


def test_without_lock_experiments_runs_are_still_created_once(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    books = [AsyncMLflowTracker(experiment_name, tracking_uri).runs for _ in range(2)]
    for book in books:
        book.locks_unavailable = True  # as when the store refuses them
    assert uuid_of(books[0].resolve("r", True)) == uuid_of(books[1].resolve("r", True))
    assert len(runs_of(client, experiment_name)) == 1


def test_a_deleted_run_is_looked_up_again(tracker: MLflowTracker, client: Any) -> None:
    tracker.add_metadata("r", a=1)
    first = tracker.get_run_id("r")
    client.delete_run(first)
    with AppRun("r", [tracker], flush_interval=3600, retry=FAST_RETRY) as run:
        run.add_metadata(b=2)
        report = run.flush()
    assert report.ok, report
    assert tracker.get_run_id("r") != first
    assert tracker.metadata("r") == {"b": 2}


def test_a_run_made_by_torchx_is_adopted(
    tracker: MLflowTracker, client: Any, experiment_name: str
) -> None:
    exp_id = tracker.experiment_id
    torchx_run = client.create_run(exp_id, run_name="torchx-app-42")
    client.set_tag(torchx_run.info.run_id, "torchx_key", "value")
    tracker.add_metadata("torchx-app-42", ours=True)
    assert tracker.get_run_id("torchx-app-42") == torchx_run.info.run_id
    assert tracker.metadata("torchx-app-42") == {"torchx_key": "value", "ours": True}
    assert len(runs_of(client, experiment_name)) == 1


def test_artifacts_with_any_name_are_tags_of_bounded_keys(tracker: MLflowTracker) -> None:
    name = "a name with / slashes, commas, 'quotes' and " + "x" * 300
    tracker.add_artifact("r", name, "s3://bucket/key", {"epoch": 1})
    assert tracker.artifacts("r") == {name: TrackerArtifact(name, "s3://bucket/key", {"epoch": 1})}
    assert all(len(k) <= 250 for k in tracker.get_run("r").data.tags)


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")
def test_the_default_store_is_mlflows_own_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As MLflow's own default: ./mlflow.db, artifacts in ./mlruns; a place the user finds
    # again (and `mlflow ui` there shows), not the temporary directory. `sync --to mlflow`
    # writes there too, as init(backends=["mlflow"]) does.
    from async_tracker.backend.mlflow import config
    from async_tracker.cli.main import main

    monkeypatch.setattr(config, "DEFAULT_TRACKING_DIR", None)
    monkeypatch.chdir(tmp_path)
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert MLflowTracker().artifact_location.startswith(str(tmp_path / "mlruns"))
    spool = tmp_path / "spool"
    # A job whose "mlflow" backend hung: its records wait in the spool.
    job = (
        "import sys\n"
        "from async_tracker import AppRun\n"
        "from tests.faulty import FaultyTracker, Hang\n"
        "hung = FaultyTracker(name='mlflow').always('write_batch', Hang())\n"
        "run = AppRun('local://to-sync', [hung], spool_dir=sys.argv[1], flush_interval=3600)\n"
        "run.log_metric('loss', 0.25, step=0)\n"
        "assert run.close(0.2).spooled >= 1\n"
    )
    subprocess.run(
        [sys.executable, "-c", job, str(spool)], check=True, env=python_env(), timeout=60
    )
    assert main(["sync", str(spool), "--to", "mlflow", "--timeout", "30"]) == 0
    capsys.readouterr()
    reader = MLflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [p.value for p in reader.metrics("local://to-sync")["loss"]] == [0.25]


def test_init_with_the_mlflow_backend_lands_in_the_experiment_named_by_the_project(
    tracking_uri: str, client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not torchx's default experiment (named after the user and host): the project's, unless
    an experiment is chosen ($TORCHX_TRACKING_EXPERIMENT_NAME, $MLFLOW_EXPERIMENT_NAME)."""
    import async_tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    project = f"proj-{secrets.token_hex(3)}"
    with async_tracker.init(project, dir=str(tmp_path / "runs"), backends=["mlflow"],
                            quiet=True) as run:  # fmt: skip
        run.log_metric("loss", 0.5, step=0)
    experiment = client.get_experiment_by_name(project)
    assert experiment is not None
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == run.id and found.data.metrics == {"loss": 0.5}

    chosen = f"chosen-{secrets.token_hex(3)}"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", chosen)
    with async_tracker.init(project, dir=str(tmp_path / "runs"), backends=["mlflow"],
                            quiet=True) as other:  # fmt: skip
        other.log_metric("loss", 0.25, step=0)
    chosen_experiment = client.get_experiment_by_name(chosen)  # the user's choice wins
    assert chosen_experiment is not None
    (found,) = client.search_runs([chosen_experiment.experiment_id])
    assert found.info.run_name == other.id
