"""The run list on S3 (moto's server), requests counted at s3fs's one entry for requests:
one listing of the store, then per run one listing of its ``summary/`` folder and one read
of each writer's summary; a run without summaries costs its rebuild once, then the same."""

from __future__ import annotations

import collections
import functools

import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import (
    REBUILT_SUMMARY,
    SUMMARY_DIR,
    AsyncFsspecTracker,
    encode_run_id,
)
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import RunSummary
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


def test_listing_costs_one_listing_plus_one_of_each_run_and_a_read_per_writer(store: str) -> None:
    for i in range(RUNS):
        with AppRun(f"proj/r{i}", [open_store(store)], heartbeat_s=0) as run:
            run.add_metadata(lr=0.1 * (i + 1))
            for step in range(10):
                run.log_metric("loss", float(step), step=step)
    runs, calls = listed(store)
    assert set(runs) == {f"proj/r{i}" for i in range(RUNS)}
    assert all(r.status == "finished" and r.metrics["loss"].count == 10 for r in runs.values())
    # The store's listing, and per run its summary folder's listing and its one summary.
    assert calls == {"list_objects_v2": 1 + RUNS, "get_object": RUNS}, calls

    # A run written before summaries existed: rebuilt once (more requests), then like others.
    fs = open_store(store).fs
    rebuilt_id = "proj/r0"
    folder = f"{store.removeprefix('s3://')}/{encode_run_id(rebuilt_id)}/{SUMMARY_DIR}"
    fs.rm(folder, recursive=True)
    fs.invalidate_cache()
    runs_after, first = listed(store)
    assert runs_after[rebuilt_id].metrics == runs[rebuilt_id].metrics
    assert runs_after[rebuilt_id].params == runs[rebuilt_id].params
    assert runs_after[rebuilt_id].status == "finished"
    assert first["put_object"] == 1  # the rebuilt summary
    assert fs.exists(f"{folder}/{REBUILT_SUMMARY}")
    _, again = listed(store)
    assert again == {"list_objects_v2": 1 + RUNS, "get_object": RUNS}, again


def test_a_reader_with_a_cache_reads_only_the_summaries_that_changed(store: str) -> None:
    from async_tracker.backend.fsspec import SummaryFileCache

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
