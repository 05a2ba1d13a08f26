"""Reads see this process's writes: a read of a backend (or through the AppRun) that a run of
this process writes to first lets that run's pending records reach it (async_tracker/own_writes.py).

Every run here flushes only when told to (``make_run``: a flush interval of an hour), so a
read that did not wait for the writes would find nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest

from async_tracker import (
    AppRun,
    AsyncTrackerBase,
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerBase,
    TrackerMetric,
    TrackerSource,
    as_async,
    as_sync,
)
from async_tracker.adapters import SyncTracker
from async_tracker.backend.fsspec import AsyncFsspecTracker, FsspecTracker
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.runtime.process import runtime
from tests.core.test_process import run_in_fork
from tests.faulty import DictTracker, FaultyTracker, Hang

MakeRun = Callable[..., AppRun]

OWN_WRITES = "async_tracker.own_writes"


@pytest.fixture
def short_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads wait for this process's writes at most a moment (a hung backend's tests)."""
    monkeypatch.setenv("ASYNC_TRACKER_READ_TIMEOUT", "0.2")


def waited_in_vain(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == OWN_WRITES]


# -- the package's sync backends ------------------------------------------------------------------


def test_fsspec_tracker_reads_what_the_run_just_wrote(
    make_run: MakeRun, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = FsspecTracker(fsspec.filesystem("file"), str(tmp_path / "runs"))
    parent = make_run("job/parent", [tracker])
    parent.add_metadata(role="parent")
    run = make_run("job/child", [tracker])
    run.add_metadata(lr=0.01, bs=25)
    run.add_metadata(bs=10)
    run.add_artifact("model", "/ckpt/m.pt", {"epoch": 2})
    run.add_source("job/parent", "checkpoint")
    run.log_metric("loss", 0.5, step=1)
    assert tracker.metadata("job/child") == {"lr": 0.01, "bs": 10}
    assert tracker.artifacts("job/child") == {
        "model": TrackerArtifact("model", "/ckpt/m.pt", {"epoch": 2})
    }
    assert list(tracker.sources("job/child")) == [TrackerSource("job/parent", "checkpoint")]
    assert [(p.step, p.value) for p in tracker.metrics("job/child")["loss"]] == [(1, 0.5)]
    # Reads of the store, not of one run, wait for every run writing there.
    run.add_metadata(epoch=3)
    assert sorted(tracker.run_ids()) == ["job/child", "job/parent"]
    assert list(tracker.run_ids(parent_run_id="job/parent")) == ["job/child"]
    lineage = tracker.lineage("job/parent")
    assert lineage.descendants == [TrackerSource("job/child", "checkpoint")]
    assert tracker.metadata("job/child") == {"lr": 0.01, "bs": 10, "epoch": 3}
    assert waited_in_vain(caplog) == []


def test_another_tracker_on_the_same_store_reads_the_writes(
    make_run: MakeRun, tmp_path: Path
) -> None:
    # The store, not the object: a second FsspecTracker on the root (torchx's reader code
    # builds its own) waits for the run too.
    root = str(tmp_path / "runs")
    run = make_run("r", [FsspecTracker(fsspec.filesystem("file"), root)])
    run.add_metadata(lr=0.01)
    assert FsspecTracker(fsspec.filesystem("file"), root).metadata("r") == {"lr": 0.01}
    elsewhere = FsspecTracker(fsspec.filesystem("file"), str(tmp_path / "other"))
    assert elsewhere.metadata("r") == {}  # another store: nothing to wait for


def test_tensorboard_tracker_reads_what_the_run_just_wrote(
    make_run: MakeRun, tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard")
    from async_tracker.backend.tensorboard import TensorBoardTracker

    tracker = TensorBoardTracker(tmp_path / "tb")
    run = make_run("r", [tracker])
    run.add_metadata(lr=0.01)
    run.log_metric("loss", 0.5, step=1)
    assert tracker.metadata("r") == {"lr": 0.01}
    assert [(p.step, p.value) for p in tracker.metrics("r")["loss"]] == [(1, 0.5)]


def test_as_sync_over_the_memory_backend(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(lr=0.01)
    run.log_metric("loss", 0.5, step=1)
    reader = SyncTracker(mem)  # as_sync(mem), typed as the adapter that has metrics()
    assert reader.metadata("r") == {"lr": 0.01}
    assert [p.value for p in reader.metrics("r")["loss"]] == [0.5]


# -- a TrackerBase of your own: torchx's AppRun tests ---------------------------------------------


class UserTracker(TrackerBase):
    """What torchx's own AppRun tests use: a TrackerBase subclass keeping runs in dicts,
    written by an AppRun and read directly, right after the write."""

    def __init__(self) -> None:
        self.md: dict[str, dict[str, object]] = {}
        self.arts: dict[str, dict[str, tuple[str, Mapping[str, object] | None]]] = {}
        self.srcs: dict[str, dict[str | None, str]] = {}

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self.arts.setdefault(run_id, {})[name] = (path, metadata)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return {k: TrackerArtifact(k, p, m) for k, (p, m) in self.arts.get(run_id, {}).items()}

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self.md.setdefault(run_id, {}).update(kwargs)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return self.md.get(run_id, {})

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self.srcs.setdefault(run_id, {})[artifact_name] = source_id

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        return [TrackerSource(s, a) for a, s in self.srcs.get(run_id, {}).items()]

    def lineage(self, run_id: str) -> Lineage:
        return Lineage(run_id)

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        return sorted(self.md)


def test_your_trackerbase_subclass_reads_what_the_run_just_wrote(make_run: MakeRun) -> None:
    tracker = UserTracker()
    run = make_run("run_id", [tracker])
    run.add_metadata(lr=0.01, bs=25)
    assert tracker.metadata("run_id") == {"lr": 0.01, "bs": 25}
    run.add_metadata(bs=10)
    assert tracker.metadata("run_id") == {"lr": 0.01, "bs": 10}
    run.add_artifact("output", "/directory", {"date": "2020/01/01"})
    assert tracker.artifacts("run_id")["output"].metadata == {"date": "2020/01/01"}
    run.add_source("parent_model_run")
    assert list(tracker.sources("run_id")) == [TrackerSource("parent_model_run", None)]
    (source,) = run.sources()
    assert source.parent.id == "parent_model_run" and source.parent.backends == [tracker]
    run.add_metadata(last=True)
    assert tracker.run_ids() == ["run_id"] and tracker.md["run_id"]["last"] is True


def test_a_subclass_read_that_calls_another_read_waits_once(make_run: MakeRun) -> None:
    # DictTracker.lineage() reads sources(): the outer read waited for the writes already.
    tracker = DictTracker()
    run = make_run("child", [tracker])
    run.add_source("parent", "model")
    assert tracker.lineage("parent").descendants == [TrackerSource("child", "model")]


# -- async reads ----------------------------------------------------------------------------------


async def test_async_reads_wait_without_blocking_the_callers_loop(
    make_run: MakeRun, tmp_path: Path
) -> None:
    store = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "runs"))
    mem = InMemoryTracker()
    run = make_run("r", [store, mem])
    run.add_metadata(lr=0.01)
    run.log_metric("loss", 0.5, step=1)
    ticks = 0
    done = anyio.Event()

    async def other_work() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.sleep(0)  # yields to the read's wait: the loop is not blocked

    async with anyio.create_task_group() as tg:
        tg.start_soon(other_work)
        assert await store.metadata("r") == {"lr": 0.01}
        assert [p.value for p in (await mem.metrics("r"))["loss"]] == [0.5]
        done.set()
    assert ticks > 0
    run.add_metadata(b=2)
    assert await as_async(as_sync(mem)).metadata("r") == {"lr": 0.01, "b": 2}


# -- a backend that does not take the writes ------------------------------------------------------


def test_a_hung_backend_the_read_answers_after_its_deadline_and_nothing_is_lost(
    make_run: MakeRun,
    release: threading.Event,
    short_reads: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hang = Hang(release)
    hung = FaultyTracker(name="hung").on("write_batch", 1, action=hang)
    run = make_run("r", [hung])
    run.add_metadata(lr=0.01)
    reader = as_sync(hung)
    with caplog.at_level(logging.WARNING, OWN_WRITES):
        assert reader.metadata("r") == {}  # what the store has: the write hangs on its way
    assert hang.entered.is_set()
    (warning,) = waited_in_vain(caplog)
    assert "1 record of run 'r'" in warning and "0.2 s" in warning
    assert "ASYNC_TRACKER_READ_TIMEOUT" in warning
    # The AppRun's own read says so too, and answers.
    caplog.clear()
    with caplog.at_level(logging.WARNING, OWN_WRITES):
        assert run.metadata() == {}
    assert ["1 record of run 'r'" in w for w in waited_in_vain(caplog)] == [True]
    release.set()
    caplog.clear()
    assert reader.metadata("r") == {"lr": 0.01}  # delivered once the backend took it
    assert run.flush().ok and run.status().backends["hung"].delivered == 1
    assert waited_in_vain(caplog) == []


def test_a_slow_second_backend_never_delays_a_read_of_the_first(
    make_run: MakeRun, release: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    mem = InMemoryTracker()
    slow = FaultyTracker(name="slow").always("write_batch", Hang(release))
    run = make_run("r", [mem, slow])
    run.add_metadata(a=1)
    assert as_sync(mem).metadata("r") == {"a": 1}  # the default read timeout is 30 s
    assert waited_in_vain(caplog) == []
    assert run.status().backends["slow"].delivered == 0


def test_a_read_during_close_waits_for_the_close(
    make_run: MakeRun,
    release: threading.Event,
    short_reads: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hang = Hang(release)
    hung = FaultyTracker(name="hung").on("write_batch", 1, action=hang)
    run = make_run("r", [hung])
    run.add_metadata(lr=0.01)
    wait = run.begin_close(time.monotonic() + 60, "finished")  # closing, its write hung
    assert hang.entered.wait(10)
    with caplog.at_level(logging.WARNING, OWN_WRITES):
        assert as_sync(hung).metadata("r") == {}
    assert ["1 record of run 'r'" in w for w in waited_in_vain(caplog)] == [True]
    release.set()
    assert wait(time.monotonic() + 60).ok
    assert as_sync(hung).metadata("r") == {"lr": 0.01}
    assert len(runtime().writers.find(("object", id(hung)), "r")) == 0  # closed: not a writer


def test_a_closed_run_is_no_longer_waited_for(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(a=1)
    assert runtime().writers.find(("object", id(mem)), "r") == [run]
    assert run.close().ok
    assert runtime().writers.find(("object", id(mem)), "r") == []
    assert as_sync(mem).metadata("r") == {"a": 1}


# -- where a read must not wait -------------------------------------------------------------------


class ReadsInItsWrite(DictTracker):
    """A blocking backend whose write reads its own store: in a worker thread, delivering the
    very batch a wait would wait for."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Mapping[str, object]] = []

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self.seen.append(self.metadata(run_id))
        super().add_metadata(run_id, **kwargs)


def test_a_read_in_a_worker_thread_does_not_wait(
    make_run: MakeRun, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = ReadsInItsWrite()
    run = make_run("r", [tracker])
    run.add_metadata(a=1)
    assert run.flush().ok
    assert tracker.seen == [{}]
    assert waited_in_vain(caplog) == []


class AsyncReadsInItsWrite(AsyncTrackerBase):
    """An async backend whose write_batch awaits its own read: on the tracker loop."""

    def __init__(self) -> None:
        self.mem = InMemoryTracker()
        self.seen: list[Mapping[str, object]] = []

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        self.seen.append(await self.metadata(run_id))
        await self.mem.write_batch(run_id, batch)

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        await self.mem.add_artifact(run_id, name, path, metadata)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return await self.mem.artifacts(run_id)

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self.mem.add_metadata(run_id, **kwargs)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return await self.mem.metadata(run_id)

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        await self.mem.add_source(run_id, source_id, artifact_name)

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        return await self.mem.sources(run_id, artifact_name)

    async def lineage(self, run_id: str) -> Lineage:
        return await self.mem.lineage(run_id)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        return await self.mem.run_ids(**kwargs)

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self.mem.add_metrics(run_id, metrics)

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return await self.mem.metrics(run_id)


def test_a_read_on_the_tracker_loop_does_not_wait(
    make_run: MakeRun, caplog: pytest.LogCaptureFixture
) -> None:
    backend = AsyncReadsInItsWrite()
    run = make_run("r", [backend])
    run.add_metadata(a=1)
    assert run.flush().ok  # the loop never waited for itself
    assert backend.seen == [{}]
    assert waited_in_vain(caplog) == []
    assert as_sync(backend).metadata("r") == {"a": 1}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_wait_for_the_parents_runs(
    make_run: MakeRun, release: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    hang = Hang(release)
    hung = FaultyTracker(name="hung").on("write_batch", 1, action=hang)
    run = make_run("r", [hung])
    run.add_metadata(lr=0.01)
    assert run.flush(timeout=0).timed_out and hang.entered.wait(10)  # on its way, hung
    reader = as_sync(hung)

    def child() -> dict[str, Any]:
        # The parent's records are the parent's to deliver: the child reads the store as it
        # is (with the default 30 s read timeout, a wait would outlast run_in_fork's bound).
        writers = runtime().writers.find(("object", id(hung)), "r")
        return {"writers": len(writers), "metadata": dict(reader.metadata("r"))}

    _, seen = run_in_fork(child)
    assert seen == {"writers": 0, "metadata": {}}
    release.set()
    assert reader.metadata("r") == {"lr": 0.01}
    assert waited_in_vain(caplog) == []
