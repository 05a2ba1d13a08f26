"""The run index on S3 (moto's server), requests counted at s3fs's one entry for requests:
after a compaction a listing costs the same whatever the number of runs (the index's listing
and its checkpoint), plus one read per summary written since; two compactors racing on the
conditional PUT, one checkpoint wins; a deleted run leaves the list at once."""

from __future__ import annotations

import collections
import functools
import time
from typing import Any

import anyio
import pytest

from async_tracker.backend.fsspec import AsyncFsspecTracker, index
from async_tracker.backend.fsspec.summaries import run_summaries
from async_tracker.init_run import open_store
from async_tracker.records import Batch, TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import RunSummary
from tests.s3_requests import counting

# The readers' compaction alone: writers' folds (indexfold.py) would compact first.
pytestmark = pytest.mark.usefixtures("no_writer_folds")

pytest.importorskip("s3fs")

TOKEN = "1795000000000000000xabc123"
OTHER = "1795000000000000001xdef456"


def backend(url: str) -> AsyncFsspecTracker:
    store = open_store(url)
    assert isinstance(store, AsyncFsspecTracker)
    return store


def batch(token: str, run: int, points: int = 5, end: str | None = "finished") -> Batch:
    ns = time.time_ns()
    metrics = [TrackerMetric("loss", 1.0 / (s + run + 1), s, 1000.0 + s) for s in range(points)]
    return Batch(
        points, metrics=metrics, records=points, first=1, key=f"{ns:019d}-{token}-{points:012d}",
        end=end, end_time=1000.0 + points if end else 0.0,  # type: ignore[arg-type]
    )  # fmt: skip


def write_runs(url: str, first: int, last: int, token: str = TOKEN) -> None:
    store = backend(url)

    async def write_all() -> None:
        limiter = anyio.CapacityLimiter(16)

        async def one(i: int) -> None:
            async with limiter:
                await store.write_batch(f"run/{i:04d}", batch(token, i))

        async with anyio.create_task_group() as tg:
            for i in range(first, last):
                tg.start_soon(one, i)

    runtime().loop.call(write_all)


def listed(url: str) -> tuple[dict[str, RunSummary], collections.Counter[str]]:
    store = backend(url)
    with counting() as calls:
        runs = runtime().loop.call(store.run_summaries)
    assert len(runs) == len({r.run_id for r in runs})
    return {r.run_id: r for r in runs}, calls


def index_objects(url: str) -> list[str]:
    store = backend(url)
    store.fs.invalidate_cache()
    return sorted(
        p.rsplit("/", 1)[1]
        for p in store.fs.find(store.root_dir, prefix=".index-")
    )


@pytest.mark.parametrize("runs", [50, 200])
def test_a_listing_costs_the_same_whatever_the_number_of_runs(s3_url: str, runs: int) -> None:
    write_runs(s3_url, 0, runs)
    found, first = listed(s3_url)
    assert len(found) == runs and all(r.status == "finished" for r in found.values())
    # The first listing: the index's and the root's listings, a read per summary, the
    # checkpoint, and the summaries it folded removed (in one request per 1,000).
    assert first["get_object"] == runs and first["put_object"] == 1, first
    assert first["delete_objects"] == 1, first
    assert index_objects(s3_url) == [f"{index.CHECKPOINT_PREFIX}{1:020d}.json.gz"]
    # Then: the index's listing and its checkpoint, for 50 runs as for 200.
    again, calls = listed(s3_url)
    assert again == found
    assert calls == {"list_objects_v2": 1, "get_object": 1}, calls
    # Plus one read per summary written since the compaction.
    write_runs(s3_url, runs, runs + 3, token=OTHER)
    changed, calls = listed(s3_url)
    assert len(changed) == runs + 3
    assert calls == {"list_objects_v2": 1, "get_object": 1 + 3}, calls


def test_two_compactors_racing_on_s3_one_checkpoint_wins(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_runs(s3_url, 0, 6)
    real_create = index._create
    outcomes: list[bool] = []

    async def create_after_another(storage: Any, path: str, data: bytes) -> bool:
        if not outcomes:
            outcomes.append(True)  # the other compactor's create, made first, below
            await run_summaries(backend(s3_url)._reader)
        created = await real_create(storage, path, data)
        outcomes.append(created)
        return created

    monkeypatch.setattr(index, "_create", create_after_another)
    found, _ = listed(s3_url)
    # The conditional PUT: the other's checkpoint 1 was there; this one's was refused.
    assert outcomes == [True, True, False]
    monkeypatch.setattr(index, "_create", real_create)
    assert index_objects(s3_url) == [f"{index.CHECKPOINT_PREFIX}{1:020d}.json.gz"]
    again, _ = listed(s3_url)
    assert again == found and len(again) == 6
    assert all(r.metrics["loss"].count == 5 for r in again.values())


def test_a_deleted_run_leaves_the_list_at_once(s3_url: str) -> None:
    write_runs(s3_url, 0, 4)
    listed(s3_url)
    store = backend(s3_url)
    assert runtime().loop.call(store.delete_run, "run/0002")
    found, calls = listed(s3_url)
    assert set(found) == {"run/0000", "run/0001", "run/0003"}
    # The index's listing, its checkpoint, the tombstone.
    assert calls == {"list_objects_v2": 1, "get_object": 2}, calls
    claimed = runtime().loop.call(
        functools.partial(store.claim_run, "run/new", {"host": "here"})
    )
    assert claimed
    found, _ = listed(s3_url)
    assert found["run/new"].status == "running" and "run/0002" not in found
