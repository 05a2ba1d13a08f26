"""The read conformance suite on the in-memory backend, read through the generic reader."""

from __future__ import annotations

import pytest

from async_tracker import AsyncTrackerBase
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.store.conformance import ReadConformance


class TestInMemory(ReadConformance):
    # The memory backend keeps how a run ended, not when.
    records_end_time = False
    # It cannot delete runs (AsyncTrackerBase.delete_run's default says so).
    can_delete = False

    @pytest.fixture
    def backend(self) -> AsyncTrackerBase:
        return InMemoryTracker()
