"""What a reader that follows a store keeps between reads (the dashboard): metric segments
after the ones it read, summary files unchanged since its last listing, and each writer's
heartbeat with its delivery state."""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

from async_tracker import AppRun
from async_tracker.backend.fsspec import (
    AsyncFsspecTracker,
    MetricsCursor,
    MetricSegments,
    SummaryFileCache,
    points_of,
)
from async_tracker.backend.fsspec.segments import _parse_segment
from async_tracker.init_run import open_store
from async_tracker.records import TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import RunSummary


def backend(root: Path) -> AsyncFsspecTracker:
    store = open_store(str(root))
    assert isinstance(store, AsyncFsspecTracker)
    return store


def read(store: AsyncFsspecTracker, cache: SummaryFileCache) -> list[RunSummary]:
    return runtime().loop.call(functools.partial(store.run_summaries, cache=cache))


def segments(
    store: AsyncFsspecTracker, run_id: str, since: MetricsCursor | None = None
) -> MetricSegments[dict[str, list[TrackerMetric]]]:
    read = functools.partial(
        store.metric_segments, run_id, _parse_segment, points_of, since=since
    )
    return runtime().loop.call(read)


def test_metric_segments_returns_only_the_segments_not_read(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = AppRun("r/1", [open_store(str(root))], spool_dir=str(tmp_path / "spool"), heartbeat_s=0)
    values = [0.5, math.nan, math.inf, -math.inf]
    for step, value in enumerate(values):
        run.log_metric("loss", value, step=step)
    assert run.flush(30).ok
    store = backend(root)
    first = segments(store, "r/1")
    assert first.reset and len(first.segments) == 1
    name, points = first.segments[0]
    assert name.endswith(".parquet")
    steps = [p.step for p in points["loss"]]
    got = [p.value for p in points["loss"]]
    assert steps == [0, 1, 2, 3]
    assert got[0] == 0.5 and math.isnan(got[1]) and got[2:] == [math.inf, -math.inf]
    again = segments(store, "r/1", first.cursor)
    assert again.segments == [] and not again.reset
    run.log_metrics({"loss": 0.25, "acc": 0.9}, step=4)
    assert run.flush(30).ok
    (new,) = segments(store, "r/1", first.cursor).segments
    assert new[0] != name
    assert {k: [(p.step, p.value) for p in v] for k, v in new[1].items()} == {
        "loss": [(4, 0.25)], "acc": [(4, 0.9)]
    }
    assert run.close(30).ok
    # Closing compacted the run's two segments into one file: a read after the first one
    # starts again, with every point.
    closed = segments(store, "r/1", first.cursor)
    assert closed.reset and len(closed.segments) == 1
    assert [p.step for p in closed.segments[0][1]["loss"]] == [0, 1, 2, 3, 4]
    empty = segments(store, "nobody")
    assert empty.segments == [] and empty.reset


def test_summary_files_unchanged_are_taken_from_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    runs = []
    for i in range(3):
        run = AppRun(f"r/{i}", [open_store(str(root))], spool_dir=str(tmp_path / f"s{i}"),
                     heartbeat_s=0)  # fmt: skip
        run.log_metric("loss", 1.0, step=0)
        assert run.flush(30).ok
        runs.append(run)
    store = backend(root)
    cache = SummaryFileCache()
    first = read(store, cache)
    assert cache.reads == 3 and len(cache.files) == 3
    again = read(store, cache)
    assert cache.reads == 3 and again == first
    runs[1].log_metric("loss", 0.5, step=1)
    assert runs[1].flush(30).ok
    changed = {r.run_id: r for r in read(store, cache)}
    assert cache.reads == 4  # the one summary rewritten
    assert changed["r/1"].metrics["loss"].count == 2
    assert changed == {r.run_id: r for r in runtime().loop.call(store.run_summaries)}
    runtime().loop.call(store.delete_run, "r/2")
    read(store, cache)
    assert len(cache.files) == 2  # a file gone is dropped
    for run in runs:
        assert run.close(30).ok


def test_a_heartbeat_carries_the_writers_delivery_state(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = backend(root)
    runtime().loop.call(store.heartbeat, "r/1", 2.0)  # as an older writer wrote them
    (old,) = runtime().loop.call(store.heartbeats, "r/1").values()
    assert old["interval_s"] == 2.0 and "delivery" not in old
    state = {"lag_s": 1.5, "spooled": 12, "last_error": "ConnectionError: refused"}
    runtime().loop.call(functools.partial(store.heartbeat, "r/1", 2.0, delivery=state))
    (beat,) = runtime().loop.call(store.heartbeats, "r/1").values()
    assert beat["delivery"] == state and beat["time"] >= old["time"]  # type: ignore[operator]
    assert runtime().loop.call(store.run_status, "r/1") == ("running", None)


def test_heartbeats_of_runs_not_ended_are_read_again_only_when_rewritten(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = backend(root)
    runtime().loop.call(functools.partial(store.heartbeat, "r/1", 30.0))
    runtime().loop.call(functools.partial(store.add_metadata, "r/1", lr=0.1))  # a run
    cache = SummaryFileCache()
    (first,) = read(store, cache)
    # The writer's summary holds its heartbeat: running from that one file (and the run's
    # claim in the index, which its first heartbeat made).
    assert first.status == "running" and cache.reads == 2
    assert read(store, cache) == [first] and cache.reads == 2
    runtime().loop.call(functools.partial(store.heartbeat, "r/1", 30.0))
    read(store, cache)
    assert cache.reads == 3  # the summary rewritten with the beat, alone
    # Once the heartbeats are old, the run's heartbeat files are read: crashed.
    (late,) = runtime().loop.call(
        functools.partial(store.run_summaries, time.time() + 1000, cache=cache)
    )
    assert late.status == "crashed" and cache.reads == 4
    (again,) = runtime().loop.call(
        functools.partial(store.run_summaries, time.time() + 1000, cache=cache)
    )
    assert again.status == "crashed" and cache.reads == 4  # the kept heartbeat
