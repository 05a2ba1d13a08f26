"""Outages of a real MLflow server: killed mid-run and restarted on the same port, killed
in the middle of a flush of several requests, frozen (SIGSTOP: connections accepted, never
answered), and killed for good.

These tests use the session's server (the `server` fixture), which they kill and restart on
its port with its store; the fixture leaves it running for the tests after each.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import pytest

from async_tracker import AppRun, Batch, RetryPolicy, TrackerMetric, as_sync
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.backend.mlflow import MAX_METRICS_PER_REQUEST, AsyncMLflowTracker
from async_tracker.backend.mlflow.summaries import stored_summaries
from async_tracker.errors import (
    BackendError,
    PermanentBackendError,
    TransientBackendError,
    classify,
)
from tests.core.helpers import wait_until
from tests.mlflow.server import MlflowServer

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup

# Short waits so that the test follows the server quickly; flush() and close() kick a parked
# lane anyway.
RETRY = RetryPolicy(
    max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.2, jitter_s=0.05, cooldown_s=0.5
)
# What close() may take beyond its timeout here: its own slack plus a loaded machine.


def read_back(url: str, experiment: str) -> tuple[Any, Any]:
    from mlflow import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id])  # exactly one MLflow run
    return client, run


def test_server_killed_mid_run_and_restarted(server: MlflowServer) -> None:
    backend = AsyncMLflowTracker("outage", server.url)
    mem = InMemoryTracker()
    run = AppRun("outage-run", [backend, mem], flush_interval=0.05, retry=RETRY)
    try:
        run.add_metadata(phase="before")
        for step in range(500):
            run.log_metric("loss", float(step), step=step)
        assert run.flush(timeout=60).ok

        server.kill()
        run.add_metadata(phase="during")
        run.add_artifact("ckpt", "/ckpt/during.pt", {"step": 1499})
        run.add_source("parent-job", "model")
        for step in range(500, 1500):
            run.log_metrics({"loss": float(step), "acc": step / 1500}, step=step)

        # MLflow is down, and failing: the memory backend still gets everything at once.
        wait_until(lambda: run.status().backends["mlflow"].retries > 0, "MLflow lane retrying")
        wait_until(
            lambda: len(mem.points("outage-run", "acc")) == 1000, "memory backend has all"
        )
        assert mem.runs["outage-run"].metadata["phase"] == "during"
        status = run.status().backends["mlflow"]
        assert status.in_flight > 0 and status.last_error is not None
        assert "Transient" in status.last_error

        server.start()  # same port, same store
        report = run.flush(timeout=60)
        assert report.ok, report
    finally:
        run.close(timeout=10)

    client, mlrun = read_back(server.url, "outage")
    loss = client.get_metric_history(mlrun.info.run_id, "loss")
    acc = client.get_metric_history(mlrun.info.run_id, "acc")
    # Exactly once: every step once, none missing.
    assert sorted(m.step for m in loss) == list(range(1500))
    assert sorted(m.step for m in acc) == list(range(500, 1500))
    assert mlrun.data.tags["phase"] == '"during"'
    view = as_sync(backend)
    assert view.artifacts("outage-run")["ckpt"].path == "/ckpt/during.pt"
    assert [(s.source_run_id, s.artifact_name) for s in view.sources("outage-run")] == [
        ("parent-job", "model")
    ]


def kill_after_first_request(backend: AsyncMLflowTracker, server: MlflowServer) -> list[int]:
    """Kills the server (SIGKILL) right after the first log_batch request of ``backend`` is
    stored: the other requests of the flush meet a dead server. Returns the sizes of the
    requests that were stored."""
    real = backend.client.log_batch
    stored: list[int] = []
    lock = threading.Lock()

    def log_batch(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        real(run_id, metrics=metrics, params=params, tags=tags)
        with lock:
            stored.append(len(metrics))
            first = len(stored) == 1
        if first:
            server.kill()

    backend.client.log_batch = log_batch
    return stored


async def test_server_dying_mid_flush_is_one_transient_error(server: MlflowServer) -> None:
    backend = AsyncMLflowTracker("mid-flush", server.url)  # 2 requests in flight at once
    points = [TrackerMetric("loss", float(i), i, 1_700_000_000 + i) for i in range(5000)]
    batch = Batch(0, metadata={"phase": "train"}, metrics=points, records=5001)
    stored = kill_after_first_request(backend, server)
    try:
        with pytest.raises(BackendError) as info:
            await backend.write_batch("mid-flush-run", batch)
    finally:
        server.start()
    error = info.value
    # One error, not an exception group; transient, so the lane retries (and keeps) it.
    assert not isinstance(error, BaseExceptionGroup)
    assert type(error) is TransientBackendError, error
    assert not isinstance(error, PermanentBackendError)
    assert classify(error) == "transient"
    assert "requests of the flush stored" in str(error)
    assert len(stored) == 1 and batch.done == {"mlflow:0"}

    await backend.write_batch("mid-flush-run", batch)  # the lane's retry: what is missing
    assert sum(stored) == 5000  # no point was sent twice
    history = await backend.metrics("mid-flush-run")
    assert sorted(p.step for p in history["loss"]) == list(range(5000))  # each point once
    assert await backend.metadata("mid-flush-run") == {"phase": "train"}
    await backend.aclose()


def test_server_dying_mid_flush_loses_nothing_through_apprun(server: MlflowServer) -> None:
    # On main this flush was dropped (5001 records) with 999 of 5000 points on the server.
    backend = AsyncMLflowTracker("mid-flush-apprun", server.url)
    run = AppRun(
        "mid-flush-apprun", [backend], flush_interval=3600, batch_size=100_000, retry=RETRY
    )
    try:
        run.add_metadata(phase="train")
        for step in range(5000):
            run.log_metric("loss", float(step), step=step)
        stored = kill_after_first_request(backend, server)
        try:
            report = run.flush(timeout=30)
        finally:
            server.start()
        # The first request landed: the metadata as a tag and a param, and 998 points.
        assert stored[:1] == [MAX_METRICS_PER_REQUEST - 2]
        assert report.dropped == 0 and report.delivered == 0, report
        assert report.pending + report.spooled == 5001, report
        report = run.flush(timeout=60)  # the server is back
        assert report.ok and report.dropped == 0, report
    finally:
        run.close(timeout=10)
    client, mlrun = read_back(server.url, "mid-flush-apprun")
    loss = client.get_metric_history(mlrun.info.run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(5000))
    assert mlrun.data.tags["phase"] == '"train"'


def test_a_retry_after_a_restart_stores_each_point_once_and_counts_it_once(
    server: MlflowServer,
) -> None:
    # The server dies once the first request of a flush is stored, the others (sent two at
    # a time) fail, and the retry sends what is missing; the writer's summary, sent last,
    # counts each point once.
    backend = AsyncMLflowTracker("restart-together", server.url, request_concurrency=3)
    run = AppRun(
        "restart-together", [backend], flush_interval=3600, batch_size=100_000, retry=RETRY
    )
    try:
        run.log_metric("loss", 0.0, step=0)
        assert run.flush(timeout=60).ok
        for step in range(1, 3001):
            run.log_metric("loss", float(step), step=step)
        stored = kill_after_first_request(backend, server)
        try:
            report = run.flush(timeout=30)
        finally:
            server.start()
        assert stored[:1] == [MAX_METRICS_PER_REQUEST]  # a points request, not the summary's
        assert report.dropped == 0 and report.pending + report.spooled == 3000, report
        report = run.flush(timeout=60)  # the server is back
        assert report.ok and report.dropped == 0, report
        # Stored before the outage and marked so: not sent again. A request stored while the
        # others failed, whose answer the cancelled flush no longer awaited, is sent again:
        # MLflow keeps its points once (same name, value, step and client timestamp).
        assert 3000 <= sum(stored) <= 3000 + 2 * MAX_METRICS_PER_REQUEST
    finally:
        run.close(timeout=10)
    client, mlrun = read_back(server.url, "restart-together")
    loss = client.get_metric_history(mlrun.info.run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(3001))
    (summary,) = stored_summaries(mlrun.data.tags).writers.values()
    assert summary.metrics["loss"].count == 3001


def test_frozen_server_close_returns_on_time(server: MlflowServer) -> None:
    backend = AsyncMLflowTracker("frozen", server.url)
    mem = InMemoryTracker()
    run = AppRun("frozen-run", [backend, mem], flush_interval=0.05, retry=RETRY)
    run.log_metric("loss", 0.0, step=0)
    assert run.flush(timeout=60).ok
    os.killpg(server.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        for step in range(1, 200):
            run.log_metric("loss", float(step), step=step)
        report = run.close(timeout=2.0)  # returns though the server never answers
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
    assert report.timed_out and not report.ok
    assert report.pending + report.spooled >= 199
    assert len(mem.points("frozen-run", "loss")) == 200


def test_server_that_never_comes_back(server: MlflowServer) -> None:
    backend = AsyncMLflowTracker("gone", server.url)
    mem = InMemoryTracker()
    run = AppRun("gone-run", [backend, mem], flush_interval=0.05, retry=RETRY)
    run.add_metadata(a=1)
    assert run.flush(timeout=60).ok
    server.kill()
    for step in range(300):
        run.log_metric("loss", float(step), step=step)
    report = run.close(timeout=2.0)  # retries until its deadline, then spools
    assert report.timed_out and not report.ok
    assert report.pending + report.spooled >= 300
    assert "mlflow" in report.errors and "failed" in report.errors["mlflow"]
    assert len(mem.points("gone-run", "loss")) == 300
