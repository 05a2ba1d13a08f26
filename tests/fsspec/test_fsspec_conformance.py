"""The backend conformance suite on fsspec: local disk, fsspec's memory filesystem, and S3
(a real S3 API server, moto's, through s3fs), the last configured through ``create()``."""

from __future__ import annotations

import errno
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from async_tracker import AppRun, AsyncTrackerBase
from async_tracker.backend.fsspec import AsyncFsspecTracker, create, map_error
from tests.conformance import BackendConformance


class FsspecFaults:
    """The faults of the conformance suite's retry test, as fsspec's mapping makes them."""

    def mapped_faults(self) -> tuple[BaseException, BaseException]:
        outage = map_error(ConnectionResetError(errno.ECONNRESET, "reset by peer"), "write of x")
        too_big = map_error(OSError(errno.EFBIG, "File too large"), "write of x")
        return outage, too_big


class TestFsspecFile(FsspecFaults, BackendConformance):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> AsyncTrackerBase:
        return AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))


class TestFsspecMemory(FsspecFaults, BackendConformance):
    @pytest.fixture
    def backend(self) -> Iterator[AsyncTrackerBase]:
        fs = fsspec.filesystem("memory")
        root = f"/conformance-{uuid.uuid4().hex}"
        yield AsyncFsspecTracker(fs, root)
        if fs.exists(root):
            fs.rm(root, recursive=True)


class TestFsspecS3(FsspecFaults, BackendConformance):
    @pytest.fixture
    def backend(self, s3_config: str) -> AsyncTrackerBase:
        tracker = create(s3_config).async_tracker
        assert type(tracker.fs).__name__ == "S3FileSystem"
        return tracker


def test_s3_batches_are_a_handful_of_objects(s3_config: str) -> None:
    tracker = create(s3_config)
    fs = tracker.async_tracker.fs  # type: ignore[attr-defined]
    root = tracker.async_tracker.root_dir  # type: ignore[attr-defined]
    # No timed flush: under load the loop takes longer than a flush interval, and a timed
    # cut would make two segments; here the batch is cut by flush() alone.
    with AppRun("s3://job/run", [tracker], batch_size=50_000, flush_interval=3600) as run:
        run.add_metadata(a=1)
        for step in range(10_000):
            run.log_metrics({"loss": 1.0, "acc": 0.5}, step=step)
        report = run.flush()
        assert report.ok and report.delivered == 20_001
        assert len(run.metrics()["loss"]) == 10_000
    fs.invalidate_cache()
    objects = [p for p in fs.find(root)]
    # One metadata file and one metrics segment: never one object per record (and, once the
    # run ended, the file saying how, its heartbeat, its claim, made by its first heartbeat,
    # with its entry in the run index, and the writer's summary).
    assert len(objects) == 7, objects
    assert sum(p.endswith("/claim.json") for p in objects) == 1, objects
    assert sum("/.index-summary-" in p for p in objects) == 1, objects
    assert sum("/heartbeat/" in p for p in objects) == 1
    assert sum("/status/" in p for p in objects) == 1, objects
