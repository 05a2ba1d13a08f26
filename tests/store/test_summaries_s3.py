"""The run list on S3 (moto's server), requests counted at s3fs's one entry for requests:
one listing of the store's root (runs and summaries), then one read of each writer's
summary, running runs included; a run without summaries costs its rebuild once, then the
same."""

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
    runs, calls = listed(store)
    assert set(runs) == {f"proj/r{i}" for i in range(RUNS)}
    assert all(r.status == "finished" and r.metrics["loss"].count == 10 for r in runs.values())
    # The root's listing, and per run its one summary.
    assert calls == {"list_objects_v2": 1, "get_object": RUNS}, calls

    # A run written before summaries existed: rebuilt once (more requests), then like others.
    backend = open_store(store)
    assert isinstance(backend, AsyncFsspecTracker)
    fs = backend.fs
    rebuilt_id = "proj/r0"
    fs.rm(fs.glob(backend.summary_path(rebuilt_id, "*")))
    fs.invalidate_cache()
    runs_after, first = listed(store)
    assert runs_after[rebuilt_id].metrics == runs[rebuilt_id].metrics
    assert runs_after[rebuilt_id].params == runs[rebuilt_id].params
    assert runs_after[rebuilt_id].status == "finished"
    assert first["put_object"] == 1  # the rebuilt summary
    assert fs.exists(backend.summary_path(rebuilt_id, REBUILT_TOKEN))
    _, again = listed(store)
    assert again == {"list_objects_v2": 1, "get_object": RUNS}, again


def test_a_live_run_costs_its_summary_alone_and_a_crashed_one_its_status(store: str) -> None:
    """A running run's heartbeat is in its writer's summary: the list tells it is live
    from that one read. A run whose every beat is old gets its status and heartbeat files
    read (crashed, unless an ending its summary lacks is there)."""
    for i in range(RUNS):
        with AppRun(f"proj/r{i}", [open_store(store)], heartbeat_s=0) as run:
            run.log_metric("loss", 1.0, step=0)
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
        assert (calls["list_objects_v2"], calls["get_object"]) == (1, RUNS + 1), calls
        # The same store read ten hours later: the live run's beat is old.
        with counting() as later:
            crashed = runtime().loop.call(backend.run_summaries, time.time() + 36_000)
        assert {r.run_id: r.status for r in crashed}["proj/live"] == "crashed"
        # Its summary, then its status/ (none: s3fs lists the run's folder too to tell) and
        # heartbeat/ listings and its one heartbeat.
        assert (later["list_objects_v2"], later["get_object"]) == (4, RUNS + 2), later
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
