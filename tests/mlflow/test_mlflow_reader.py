"""The MLflow backend's native reader against a real server: the run list from
``search_runs`` and the writers' summary tags equals what the generic reader computes from
every point, costs one search per page of runs and no point read, and falls back to the
points for the runs whose summaries do not account for them (alone)."""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun, Batch, TrackerMetric
from async_tracker.backend.mlflow import AsyncMLflowTracker, runs, summaries
from async_tracker.backend.mlflow.mapping import TAG_SUMMARIES, TAG_SUMMARY_PREFIX
from async_tracker.backend.mlflow.reader import MLflowReader
from async_tracker.backend.mlflow.requests import (
    LAST_REQUEST_MAX_ITEMS,
    MAX_ITEMS_PER_REQUEST,
    MAX_TAGS_PER_REQUEST,
    plan_requests,
    with_last_tags,
)
from async_tracker.backend.mlflow.summaries import (
    stored_summaries,
    summary_tags,
    writer_token,
)
from async_tracker.spool.store import new_token
from async_tracker.store.conformance import on_loop, same
from async_tracker.store.reader import GenericReader, reader_of
from async_tracker.store.summary import MetricSummary, RunSummary, WriterSummary
from async_tracker.store.sync_reader import Reader

WAIT_S = 60.0


class CountingClient:
    """Stands in for a tracker's ``MlflowClient`` (the tracker's and its run book's): every
    method call counted by name, then made."""

    def __init__(self, tracker: AsyncMLflowTracker) -> None:
        self.real = tracker.client
        self.calls: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # calls come from worker threads
        tracker.client = self
        tracker.runs.client = self

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def http_requests(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """The HTTP requests the MLflow client sends meanwhile, by endpoint, counted where every
    REST call of the client goes through (``mlflow.utils.rest_utils.http_request``)."""
    from mlflow.utils import rest_utils

    calls: collections.Counter[str] = collections.Counter()
    real = rest_utils.http_request
    lock = threading.Lock()

    def counted(host_creds: Any, endpoint: str, method: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            calls[endpoint.rsplit("/", 1)[-1]] += 1
        return real(host_creds, endpoint, method, *args, **kwargs)

    monkeypatch.setattr(rest_utils, "http_request", counted)
    return calls


@pytest.fixture
def backend(tracking_uri: str, experiment_name: str) -> Iterator[AsyncMLflowTracker]:
    tracker = AsyncMLflowTracker(experiment_name, tracking_uri)
    yield tracker
    on_loop(tracker.aclose)


def app_run(backend: AsyncMLflowTracker, run_id: str, tmp_path: Path, **kw: Any) -> AppRun:
    spool = tmp_path / f"spool-{run_id}-{time.monotonic_ns()}"
    return AppRun(run_id, [backend], flush_interval=3600, heartbeat_s=0,
                  close_timeout=WAIT_S, spool_dir=str(spool), **kw)  # fmt: skip


def close(run: AppRun, reason: Any = None) -> None:
    report = run.close(WAIT_S, reason=reason)
    assert report.ok and report.pending == 0, report


def fresh(backend: AsyncMLflowTracker) -> AsyncMLflowTracker:
    """Another tracker on the same experiment, as another process (a reader) opens it, the
    experiment looked up already (one request per tracker, not per listing)."""
    tracker = AsyncMLflowTracker(backend.experiment_name, backend.tracking_uri)
    on_loop(tracker.experiment)
    return tracker


def native(backend: AsyncMLflowTracker) -> Reader:
    reader = reader_of(backend)
    assert isinstance(reader, MLflowReader)
    return Reader(reader, WAIT_S)


def generic(backend: AsyncMLflowTracker) -> dict[str, RunSummary]:
    return {r.run_id: r for r in Reader(GenericReader(backend), WAIT_S).run_summaries()}


def assert_as_generic(ours: RunSummary, theirs: RunSummary) -> None:
    """What the run list shows of a run, as the generic reader computes it from the points:
    every metric's tallies, params, tags, note, status and end; the start no later."""
    for name in ("run_id", "status", "end", "params", "tags", "note", "metrics"):
        assert same(getattr(ours, name), getattr(theirs, name)), (name, ours, theirs)
    if theirs.start is not None:
        assert ours.start is not None and ours.start <= theirs.start + 1e-3, (ours, theirs)


def summary_tag_names(backend: AsyncMLflowTracker, run_id: str) -> list[str]:
    run = on_loop(backend.get_run, run_id, False)
    return sorted(k for k in run.data.tags if k.startswith(TAG_SUMMARY_PREFIX))


# -- the run list equals the generic reader's ---------------------------------------------------
def test_the_run_list_equals_what_the_points_give(
    backend: AsyncMLflowTracker, tmp_path: Path, http_requests: collections.Counter[str]
) -> None:
    # Finished, over several flushes, with NaN and infinities, params, tags and a note.
    run = app_run(backend, "full", tmp_path)
    run.add_metadata(lr=0.1, layers=[64, 32], odd=math.nan)
    run.add_tags("baseline", "v2")
    run.set_note("first try")
    for step, value in enumerate([1.0, math.nan, math.inf, -math.inf, 0.5]):
        run.log_metrics({"loss": 1.0 / (step + 1), "odd": value}, step=step)
    assert run.flush(WAIT_S).ok
    run.log_metric("loss", 0.25, step=4)  # the highest step again: the last value
    run.log_metric("all_nan", math.nan, step=0)
    run.log_metric("all_nan", math.nan, step=1)
    run.remove_tags("v2")
    close(run)
    # Failed; killed; metadata and no point; live (a flush, no end yet).
    failing = app_run(backend, "failed", tmp_path)
    with pytest.raises(RuntimeError), failing as r:
        r.log_metric("loss", 2.0, step=0)
        raise RuntimeError("the job failed")
    assert failing.close().ok
    killed = app_run(backend, "killed", tmp_path)
    killed.log_metric("loss", 3.0, step=7)
    close(killed, reason="killed")
    quiet = app_run(backend, "metadata-only", tmp_path)
    quiet.add_metadata(only="metadata")
    close(quiet)
    live = app_run(backend, "live", tmp_path)
    for step in range(3):
        live.log_metric("loss", float(step), step=step)
    assert live.flush(WAIT_S).ok

    reader = native(fresh(backend))
    http_requests.clear()
    ours = {r.run_id: r for r in reader.run_summaries()}
    assert dict(http_requests) == {"search": 1}  # one page, no point read
    theirs = generic(fresh(backend))
    assert set(ours) == set(theirs) == {"full", "failed", "killed", "metadata-only", "live"}
    for run_id, summary in ours.items():
        assert_as_generic(summary, theirs[run_id])
    assert [ours[r].status for r in ("full", "failed", "killed", "live")] == [
        "finished", "failed", "killed", "running"
    ]
    loss = ours["full"].metrics["loss"]
    assert (loss.last, loss.min, loss.max, loss.count, loss.last_step) == (0.25, 0.2, 1.0, 6, 4)
    odd = ours["full"].metrics["odd"]
    assert (odd.min, odd.max, odd.count) == (-math.inf, math.inf, 5)
    nan = ours["full"].metrics["all_nan"]
    assert math.isnan(nan.last) and (nan.min, nan.max, nan.count) == (None, None, 2)
    assert ours["full"].tags == frozenset({"baseline"}) and ours["full"].note == "first try"
    assert ours["metadata-only"].metrics == {} and ours["metadata-only"].start is not None

    # One run, and the listing with a cursor (the dashboard's), say the same.
    http_requests.clear()
    one = reader.run_summary("full")
    assert one is not None and same(one, ours["full"])
    assert reader.run_summary("never-written") is None
    assert http_requests["get-history"] == 0
    listing = reader.list_runs()
    assert listing.complete and same({r.run_id: r for r in listing.runs}, ours)
    live.log_metric("loss", -1.0, step=3)
    close(live)
    again = reader.list_runs(since=listing.cursor)
    assert [r.run_id for r in again.runs] == ["live"] and not again.gone
    assert again.runs[0].status == "finished" and again.runs[0].metrics["loss"].count == 4
    assert_as_generic(again.runs[0], generic(fresh(backend))["live"])


def test_two_writers_of_one_run_merge_as_their_points(
    backend: AsyncMLflowTracker, tmp_path: Path
) -> None:
    # Two ranks, each its own tracker object (as its own process), writing together.
    one = app_run(backend, "ranks", tmp_path)
    two = app_run(fresh(backend), "ranks", tmp_path)
    for step in range(5):
        one.log_metric("loss", float(step), step=step)
        two.log_metric("loss", 10.0 + step, step=step)
    two.log_metric("rank1_only", math.nan, step=0)
    one.add_metadata(rank0=0)
    two.add_metadata(rank1=1)
    assert one.flush(WAIT_S).ok and two.flush(WAIT_S).ok
    one.log_metric("loss", 0.5, step=5)
    close(two)
    close(one)

    assert len(summary_tag_names(backend, "ranks")) == 2  # one per writer
    summary = native(fresh(backend)).run_summary("ranks")
    assert summary is not None
    assert_as_generic(summary, generic(fresh(backend))["ranks"])
    loss = summary.metrics["loss"]
    assert (loss.count, loss.last, loss.last_step, loss.min, loss.max) == (11, 0.5, 5, 0.0, 14.0)
    assert dict(summary.params) == {"rank0": 0, "rank1": 1}
    assert summary.status == "finished"


def test_a_batch_sent_again_counts_once(backend: AsyncMLflowTracker) -> None:
    # A writer's batch sent twice: retried by it, then replayed by another process (another
    # tracker object: its own run book and tallies), as `async-tracker sync` does.
    token = new_token()

    def batch(seq: int, start: int) -> Batch:
        points = [TrackerMetric("loss", float(s), s, 1_700_000_000 + s)
                  for s in range(start, start + 5)]  # fmt: skip
        key = f"{time.time_ns():019d}-{token}-{seq:012d}"
        return Batch(seq, metrics=points, records=5, key=key)

    first, second = batch(4, 0), batch(9, 5)
    assert writer_token(first.key) == token
    on_loop(backend.write_batch, "replayed", first)
    on_loop(backend.write_batch, "replayed", first)  # every part done: nothing sent
    other = fresh(backend)
    on_loop(other.write_batch, "replayed", dataclasses.replace(first, done=set(), names={}))
    on_loop(other.write_batch, "replayed", second)
    on_loop(other.write_batch, "replayed", dataclasses.replace(second, done=set(), names={}))
    summary = native(fresh(backend)).run_summary("replayed")
    assert summary is not None and summary.metrics["loss"].count == 10
    assert_as_generic(summary, generic(fresh(backend))["replayed"])
    on_loop(other.aclose)


# -- the runs summaries do not account for ------------------------------------------------------
def test_runs_without_summaries_alone_are_read_from_their_points(
    backend: AsyncMLflowTracker, client: Any, tmp_path: Path,
    http_requests: collections.Counter[str],
) -> None:  # fmt: skip
    from mlflow.entities import Metric

    for run_id in ("kept", "tag-removed"):
        run = app_run(backend, run_id, tmp_path)
        run.add_metadata(lr=0.1)
        for step in range(4):
            run.log_metrics({"loss": 1.0 / (step + 1), "acc": step / 4}, step=step)
        close(run)
    # Its summary tag removed by hand: its points say what it holds.
    (removed,) = summary_tag_names(backend, "tag-removed")
    uuid = on_loop(backend.get_run, "tag-removed", False).info.run_id
    client.delete_tag(uuid, removed)
    # Written by plain MLflow (as an older version, or torchx, would): no summary at all.
    exp = on_loop(backend.experiment).experiment_id
    plain = client.create_run(exp, run_name="plain").info.run_id
    now = int(time.time() * 1000)
    client.log_batch(plain, metrics=[Metric("loss", v, now + i, i) for i, v in
                                     enumerate([3.0, math.nan, 1.0])])  # fmt: skip
    client.set_terminated(plain)

    reader = native(fresh(backend))
    http_requests.clear()
    ours = {r.run_id: r for r in reader.run_summaries()}
    # The two runs without summaries: a history per metric (2 + 1); the other: none.
    assert dict(http_requests) == {"search": 1, "get-history": 3}
    theirs = generic(fresh(backend))
    assert set(ours) == set(theirs) == {"kept", "tag-removed", "plain"}
    for run_id, summary in ours.items():
        assert_as_generic(summary, theirs[run_id])
    assert ours["plain"].metrics["loss"] == MetricSummary(1.0, 1.0, 3.0, 3, 2)
    # The same reader again: the ended runs read from their points are kept.
    http_requests.clear()
    assert same({r.run_id: r for r in reader.run_summaries()}, ours)
    assert dict(http_requests) == {"search": 1}


def test_a_writer_new_to_a_run_with_points_it_cannot_count_says_so(
    backend: AsyncMLflowTracker, client: Any, tmp_path: Path
) -> None:
    from mlflow.entities import Metric

    # A run torchx's own tracker made (named after the run id, no tags of ours), with points.
    exp = on_loop(backend.experiment).experiment_id
    old = client.create_run(exp, run_name="adopted").info.run_id
    client.log_batch(old, metrics=[Metric("loss", float(s), 1_700_000_000_000 + s, s)
                                   for s in range(3)])  # fmt: skip
    run = app_run(backend, "adopted", tmp_path)
    run.log_metric("loss", 0.5, step=3)
    close(run)
    tags = client.get_run(old).data.tags
    assert TAG_SUMMARIES not in tags
    (writer,) = stored_summaries(tags).writers.values()
    assert writer.prior and writer.metrics["loss"].count == 1
    summary = native(fresh(backend)).run_summary("adopted")
    assert summary is not None and summary.metrics["loss"].count == 4  # its points, all
    assert_as_generic(summary, generic(fresh(backend))["adopted"])


def test_a_summary_longer_than_a_tag_is_cut_into_parts_or_left_out(
    backend: AsyncMLflowTracker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    http_requests: collections.Counter[str],
) -> None:  # fmt: skip
    names = [f"layer_{i:03d}/grad_norm" for i in range(300)]  # about 18,000 characters
    for run_id in ("parts", "omitted"):
        if run_id == "omitted":
            monkeypatch.setattr(summaries, "MAX_SUMMARY_PARTS", 1)
        run = app_run(backend, run_id, tmp_path)
        for step in range(2):
            run.log_metrics({name: float(i + step) for i, name in enumerate(names)}, step=step)
        close(run)
    parts = summary_tag_names(backend, "parts")
    assert len(parts) >= 3 and all(p.startswith(f"{parts[0]}.") for p in parts[1:])
    assert len(summary_tag_names(backend, "omitted")) == 1

    reader = native(fresh(backend))
    http_requests.clear()
    ours = {r.run_id: r for r in reader.run_summaries()}
    # The omitted summary: that run's points, a history per metric; the parts: none.
    assert dict(http_requests) == {"search": 1, "get-history": len(names)}
    theirs = generic(fresh(backend))
    for run_id in ("parts", "omitted"):
        assert len(ours[run_id].metrics) == len(names)
        assert_as_generic(ours[run_id], theirs[run_id])


# -- what listing costs -------------------------------------------------------------------------
def test_listing_costs_a_search_per_page_and_no_point_read(
    backend: AsyncMLflowTracker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    http_requests: collections.Counter[str],
) -> None:  # fmt: skip
    n = 25
    for i in range(n):
        run = app_run(backend, f"run-{i:02d}", tmp_path)
        run.add_metadata(i=i)
        run.log_metrics({"loss": 1.0 / (i + 1), "acc": i / n}, step=0)
        close(run)

    reader = fresh(backend)
    counted = CountingClient(reader)
    http_requests.clear()
    assert len(native(reader).run_summaries()) == n
    assert dict(counted.calls) == {"search_runs": 1}
    assert dict(http_requests) == {"search": 1}
    # Pages of 10 runs: one search each, still no other request.
    monkeypatch.setattr(runs, "SEARCH_PAGE_SIZE", 10)
    counted.calls.clear()
    http_requests.clear()
    assert len(native(reader).run_summaries()) == n
    assert dict(counted.calls) == {"search_runs": 3} and dict(http_requests) == {"search": 3}
    # The generic reader, for comparison: requests per run, a history per metric of each.
    counted.calls.clear()
    Reader(GenericReader(reader), WAIT_S).run_summaries()
    assert counted.calls["get_metric_history"] == 2 * n


def test_a_flush_sends_its_summary_in_its_last_request(
    backend: AsyncMLflowTracker, tmp_path: Path, http_requests: collections.Counter[str]
) -> None:
    run = app_run(backend, "requests", tmp_path)
    run.log_metric("warm", 1.0, step=0)
    assert run.flush(WAIT_S).ok  # the run looked up and made
    sent = CountingClient(backend)
    for step in range(10):
        run.log_metric("loss", float(step), step=step)
    assert run.flush(WAIT_S).ok
    assert dict(sent.calls) == {"log_batch": 1}  # the summary rode along
    # 2,500 points: three requests, the summary in the last, sent after the others.
    order: list[int] = []
    real = sent.real.log_batch

    def log_batch(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        real(run_id, metrics=metrics, params=params, tags=tags)
        order.append(sum(t.key.startswith(TAG_SUMMARY_PREFIX) for t in tags))

    sent.real.log_batch = log_batch
    for step in range(2500):
        run.log_metric("loss", float(step), step=step)
    close(run)
    # 2,500 points: [1000, 1000, 401] and the last, small one with the summary, stored last.
    assert order == [0, 0, 0, 1]
    summary = native(fresh(backend)).run_summary("requests")
    assert summary is not None and summary.metrics["loss"].count == 2510


def test_the_summary_is_current_after_close_when_requests_go_together(
    tracking_uri: str, experiment_name: str, tmp_path: Path
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri, request_concurrency=3)
    run = app_run(backend, "together", tmp_path)
    run.log_metric("warm", 1.0, step=0)
    assert run.flush(WAIT_S).ok  # the run made
    real = backend.client.log_batch
    lock = threading.Lock()
    in_flight = [0]
    stored = [0]  # "loss" points stored
    checked: list[int] = []
    # The second and third points requests wait for each other here (the first goes alone):
    # the test fails (a broken barrier) unless they are in flight together.
    together = threading.Barrier(2, timeout=WAIT_S)
    entered = [0]

    def log_batch(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        summaries = stored_summaries({t.key: t.value for t in tags}).writers
        points = sum(m.key == "loss" for m in metrics)
        with lock:
            if summaries:
                # Sent once every other request of the flush is stored; it counts those and
                # its own points (MLflow stores a request's metrics before its tags).
                assert in_flight[0] == 0
                (summary,) = summaries.values()
                assert summary.metrics["loss"].count == stored[0] + points
                checked.append(stored[0] + points)
            in_flight[0] += 1
            entered[0] += 1
            wait = not summaries and entered[0] in (2, 3)
        if wait:
            together.wait()
        try:
            real(run_id, metrics=metrics, params=params, tags=tags)
        finally:
            with lock:
                in_flight[0] -= 1
                stored[0] += points

    backend.client.log_batch = log_batch
    for flush in range(3):
        for step in range(2500):
            run.log_metric("loss", float(step), step=2500 * flush + step)
        assert run.flush(WAIT_S).ok
    close(run)
    assert checked == [2500, 5000, 7500]
    summary = native(fresh(backend)).run_summary("together")
    assert summary is not None and summary.metrics["loss"].count == 7500
    assert_as_generic(summary, generic(fresh(backend))["together"])
    on_loop(backend.aclose)


# -- the parts, alone ---------------------------------------------------------------------------
def test_summary_tags_round_trip_and_a_torn_one_is_unreadable() -> None:
    metrics = {
        f"m{i:04d}": MetricSummary(math.nan if i % 2 else float(i), -math.inf, math.inf, i, i)
        for i in range(600)
    }
    summary = WriterSummary(start=1.0, updated=2.0, metrics=metrics, seq=3, keys=frozenset({"k"}))
    tags = dict(summary_tags("tok", summary))
    assert len(tags) > 2 and all(len(v) <= 8000 for v in tags.values())
    (back,) = stored_summaries(tags).writers.values()
    assert same(back, summary)
    torn = {**tags, f"{TAG_SUMMARY_PREFIX}tok.2": tags[f"{TAG_SUMMARY_PREFIX}tok.2"][:-1] + " "}
    assert stored_summaries(torn).unreadable == frozenset({"tok"})
    small = dict(summary_tags("tok", WriterSummary(metrics={"a": metrics["m0001"]})))
    assert list(small) == [f"{TAG_SUMMARY_PREFIX}tok"]


def test_plan_requests_puts_the_last_tags_last_and_makes_room() -> None:
    last = [("async_tracker.summary.t", "x" * 100)]
    # Room in the only request: no request more.
    plan = plan_requests(metrics=[("m", 1.0, 0, s) for s in range(10)], last_tags=last)
    assert len(plan) == 1 and plan[0].tags == last
    # The only request stays whole while the tags fit in it, however large.
    plan = plan_requests(metrics=[("m", 1.0, 0, s) for s in range(999)], last_tags=last)
    assert len(plan) == 1 and plan[0].tags == last
    plan = plan_requests(metrics=[("m", 1.0, 0, s) for s in range(1000)], last_tags=last)
    assert [len(r.metrics) for r in plan] == [901, 99]
    # A large last request: its head moves to a request before it, and the last request,
    # sent alone once the others are stored, stays small.
    metrics = [("m", 1.0, 0, s) for s in range(2000)]
    plan = plan_requests(metrics=metrics, last_tags=last)
    assert [len(r.metrics) for r in plan] == [1000, 901, 99] and plan[-1].tags == last
    assert plan[-1].items == LAST_REQUEST_MAX_ITEMS
    # The requests before the last one do not depend on the last tags (they leave first).
    assert plan_requests(metrics=metrics)[:-1] == plan[:-2]
    assert with_last_tags(plan_requests(metrics=metrics)[-1], last) == plan[-2:]
    assert [m for r in plan for m in r.metrics] == metrics
    assert all(r.items <= MAX_ITEMS_PER_REQUEST for r in plan)
    tags = [(f"k{i}", "v") for i in range(MAX_TAGS_PER_REQUEST)]
    plan = plan_requests(tags=tags, last_tags=last)
    assert [t for r in plan for t in r.tags] == [*tags, *last] and plan[-1].tags[-1] == last[0]
    assert all(len(r.tags) <= MAX_TAGS_PER_REQUEST for r in plan)
    assert plan_requests(tags=tags, last_tags=last) == plan  # deterministic
    assert plan_requests(last_tags=last)[0].tags == last
