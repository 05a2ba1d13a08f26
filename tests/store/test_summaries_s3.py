"""The run list on S3 (moto's server), requests counted at s3fs's one entry for requests:
one listing of the run index and a read of its checkpoint, plus a read of each writer's
summary written since its last compaction; the first listing of a store lists its root too
(runs without summaries, rebuilt once), then compacts it. More in test_index_s3.py."""

from __future__ import annotations

import collections
import functools
import time

import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import (
    REBUILT_TOKEN,
    AsyncFsspecTracker,
    SummaryFileCache,
    encode_run_id,
)
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import RunSummary
from tests.core.helpers import wait_until
from tests.s3_requests import counting

s3fs = pytest.importorskip("s3fs")


@pytest.fixture
def store(s3_url: str) -> str:
    return s3_url


def listed(url: str) -> tuple[dict[str, RunSummary], collections.Counter[str]]:
    backend = open_store(url)
    assert isinstance(backend, AsyncFsspecTracker)
    with counting() as calls:
        runs = runtime().loop.call(backend.run_summaries)
    return {r.run_id: r for r in runs}, calls


RUNS = 6


def test_listing_costs_one_listing_plus_a_read_per_writer(store: str) -> None:
    for i in range(RUNS):
        with AppRun(f"proj/r{i}", [open_store(store)], heartbeat_s=0) as run:
            run.add_metadata(lr=0.1 * (i + 1))
            for step in range(10):
                run.log_metric("loss", float(step), step=step)
    backend = open_store(store)
    assert isinstance(backend, AsyncFsspecTracker)
    fs = backend.fs
    rebuilt_id = "proj/r0"
    # A run written before summaries existed: none of its own.
    fs.rm(fs.glob(backend.summary_path(rebuilt_id, "*")))
    fs.invalidate_cache()
    runs, first = listed(store)
    assert set(runs) == {f"proj/r{i}" for i in range(RUNS)}
    assert all(r.status == "finished" and r.metrics["loss"].count == 10 for r in runs.values())
    # The first listing: the index's, the root's (it holds a run no summary names: rebuilt,
    # with its own listing), a read of each other run's summary and of the rebuilt run's
    # files; then the rebuilt summary written and the first checkpoint, and, listed again,
    # the summaries it folded removed (their writers ended) in one request.
    assert first["get_object"] >= RUNS - 1 and first["put_object"] == 2, first
    assert first["delete_objects"] == 1, first
    assert fs.exists(backend.summary_path(rebuilt_id, REBUILT_TOKEN))
    # Then: the index's listing and its checkpoint, and the rebuilt summary written after
    # the listing that compacted.
    again, calls = listed(store)
    assert again == runs
    assert calls == {"list_objects_v2": 1, "get_object": 2}, calls


def test_a_live_run_costs_its_summary_alone_and_a_crashed_one_its_status(store: str) -> None:
    """A running run's heartbeat is in its writer's summary: the list tells it is live
    from that one read. A run whose every beat is old gets its status and heartbeat files
    read (crashed, unless an ending its summary lacks is there)."""
    for i in range(RUNS):
        with AppRun(f"proj/r{i}", [open_store(store)], heartbeat_s=0) as run:
            run.log_metric("loss", 1.0, step=0)
    listed(store)  # the first listing compacts the index: the ended runs in its checkpoint
    backend = open_store(store)
    assert isinstance(backend, AsyncFsspecTracker)
    with AppRun("proj/live", [backend], heartbeat_s=3600) as live:
        live.log_metric("loss", 0.7, step=0)
        assert live.flush().ok
        # The first beat is written when the lane starts, beside delivery; the next batch's
        # summary holds it.
        beats = f"{backend.root_dir}/{encode_run_id('proj/live')}/heartbeat"
        wait_until(lambda: bool(backend.fs.exists(beats) and backend.fs.ls(beats, refresh=True)))
        live.log_metric("loss", 0.5, step=1)
        assert live.flush().ok
        runs, calls = listed(store)
        assert runs["proj/live"].status == "running"
        # The index's listing, its checkpoint, the live run's summary and its claim (made
        # by its first heartbeat).
        assert calls == {"list_objects_v2": 1, "get_object": 3}, calls
        # The same store read ten hours later: the live run's beat is old.
        with counting() as later:
            crashed = runtime().loop.call(backend.run_summaries, time.time() + 36_000)
        assert {r.run_id: r.status for r in crashed}["proj/live"] == "crashed"
        # The same, then its status/ (none: s3fs lists the run's folder too to tell) and
        # heartbeat/ listings and its one heartbeat.
        assert later == {"list_objects_v2": 4, "get_object": 4}, later
    runs, _ = listed(store)
    assert runs["proj/live"].status == "finished"


def test_a_reader_with_a_cache_reads_only_the_summaries_that_changed(store: str) -> None:
    runs = []
    for i in range(3):
        run = AppRun(f"proj/c{i}", [open_store(store)], heartbeat_s=0)
        run.log_metric("loss", 1.0, step=0)
        assert run.flush(30).ok
        runs.append(run)
    backend = open_store(store)
    assert isinstance(backend, AsyncFsspecTracker)
    cache = SummaryFileCache()

    def read() -> tuple[dict[str, RunSummary], collections.Counter[str]]:
        with counting() as calls:
            found = runtime().loop.call(functools.partial(backend.run_summaries, cache=cache))
        return {r.run_id: r for r in found}, calls

    first, calls = read()
    assert calls["get_object"] == 3
    again, calls = read()
    assert again == first and calls["get_object"] == 0  # listings only
    runs[2].log_metric("loss", 0.5, step=1)
    assert runs[2].flush(30).ok
    changed, calls = read()
    assert calls["get_object"] == 1 and changed["proj/c2"].metrics["loss"].count == 2
    for run in runs:
        assert run.close(30).ok
