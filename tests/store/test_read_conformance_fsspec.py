"""The read conformance suite on the fsspec store: local disk, fsspec's memory filesystem,
and S3 (moto's server, through s3fs). The store's files make the corrupt-store case run."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from async_tracker import AsyncTrackerBase
from async_tracker.backend.fsspec import (
    METADATA_DIR,
    METRICS_DIR,
    AsyncFsspecTracker,
    encode_run_id,
)
from async_tracker.init_run import open_store
from async_tracker.store.conformance import Planted, ReadConformance

# Bytes no segment codec reads: neither JSON lines nor Parquet.
GARBAGE = b"\x00\x01 not a metric segment \xff\xfe\n{\"name\": \n"


class FsspecStore(ReadConformance):
    """What every fsspec store does beyond the defaults: it keeps heartbeats, end times and
    files a reader can meet damaged."""

    keeps_heartbeats = True

    def another_writer(self, backend: AsyncTrackerBase) -> AsyncTrackerBase:
        assert isinstance(backend, AsyncFsspecTracker)
        return AsyncFsspecTracker(backend.fs, backend.root_dir)

    def corrupt(self, backend: AsyncTrackerBase, run_id: str) -> Planted:
        assert isinstance(backend, AsyncFsspecTracker)
        fs, root = backend.fs, backend.root_dir
        run_dir = posixpath.join(root, encode_run_id(run_id))
        metadata = posixpath.join(run_dir, METADATA_DIR, "zz-garbage.json")
        metrics = posixpath.join(run_dir, METRICS_DIR, "zz-garbage.jsonl")
        # A foreign file at the root is the store's own business (a config file, a plot):
        # skipped without a word. A foreign folder could be a damaged run: named.
        folder = posixpath.join(root, "not-a-run")
        fs.makedirs(folder, exist_ok=True)
        fs.pipe_file(metadata, b"{not json")
        fs.pipe_file(metrics, GARBAGE)
        fs.pipe_file(posixpath.join(root, "notes.txt"), b"a foreign file")
        fs.pipe_file(posixpath.join(folder, "readme.txt"), b"a foreign folder")
        fs.invalidate_cache()
        return Planted(metadata=metadata, metrics=metrics, root=folder)


class TestFsspecFile(FsspecStore):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> AsyncTrackerBase:
        return AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "store"))


class TestFsspecMemory(FsspecStore):
    @pytest.fixture
    def backend(self) -> Iterator[AsyncTrackerBase]:
        fs = fsspec.filesystem("memory")
        root = f"/read-conformance-{uuid.uuid4().hex}"
        yield AsyncFsspecTracker(fs, root)
        if fs.exists(root):
            fs.rm(root, recursive=True)


class TestFsspecS3(FsspecStore):
    """A fresh bucket on a real S3 API server (moto's) per test: marked ``server`` by its
    fixture."""

    @pytest.fixture
    def backend(self, s3_url: str) -> AsyncTrackerBase:
        store = open_store(s3_url)
        assert type(store.fs).__name__ == "S3FileSystem"
        return store
