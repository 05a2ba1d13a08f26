"""The conformance suite on the in-memory backend, the thread adapter and the test file backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from async_tracker import AsyncTrackerBase, as_async, as_sync
from async_tracker.adapters import ThreadedTracker
from async_tracker.backend.memory import InMemoryTracker
from tests.conformance import BackendConformance
from tests.faulty import FileTracker, MetricDictTracker


class TestInMemory(BackendConformance):
    @pytest.fixture
    def backend(self) -> AsyncTrackerBase:
        return InMemoryTracker()


class TestThreadedAdapter(BackendConformance):
    """``as_async`` over a blocking ``TrackerBase`` that has the optional metric methods."""

    @pytest.fixture
    async def backend(self) -> AsyncIterator[AsyncTrackerBase]:
        sync = MetricDictTracker()
        tracker = as_async(sync)
        assert isinstance(tracker, ThreadedTracker)
        yield tracker
        await tracker.aclose()
        assert sync.closed


class TestSyncAdapterRoundTrip(BackendConformance):
    """``as_async(as_sync(x))`` gives ``x`` back: AppRun talks to the async backend directly."""

    @pytest.fixture
    def backend(self) -> AsyncTrackerBase:
        mem = InMemoryTracker()
        tracker = as_async(as_sync(mem))
        assert tracker is mem
        return tracker


class TestFileTracker(BackendConformance):
    """The file-backed double the process tests use must itself behave like a backend."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> AsyncTrackerBase:
        return FileTracker(tmp_path / "records.jsonl")
