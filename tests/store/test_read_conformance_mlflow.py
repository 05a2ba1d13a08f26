"""The read conformance suite on MLflow: a real tracking server (started once per session,
on 127.0.0.1), one experiment per test, read through the backend's reader (``MLflowReader``):
runs listed from their writers' summary tags, and, where writers kept none (as an older
version wrote), from their points."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("mlflow")

from async_tracker import AsyncTrackerBase
from async_tracker.backend.mlflow import AsyncMLflowTracker, tracker
from async_tracker.store.conformance import ReadConformance, on_loop
from tests.mlflow.conftest import mlflow_server, tracking_uri  # noqa: F401

pytestmark = pytest.mark.server


class TestMLflow(ReadConformance):
    # MLflow keeps metric timestamps in whole milliseconds.
    time_resolution_s = 1e-3
    # Metadata lives in tags, whose values hold 8000 characters: a 1 MiB text is refused
    # at the call site (validate), naming its key.
    refused_params = frozenset({"huge_int", "megabyte"})

    @pytest.fixture
    def backend(self, tracking_uri: str) -> Iterator[AsyncTrackerBase]:  # noqa: F811
        tracker = AsyncMLflowTracker(f"read-conformance-{uuid.uuid4().hex[:12]}", tracking_uri)
        yield tracker
        on_loop(tracker.aclose)

    def another_writer(self, backend: AsyncTrackerBase) -> AsyncTrackerBase:
        assert isinstance(backend, AsyncMLflowTracker)
        return AsyncMLflowTracker(backend.experiment_name, backend.tracking_uri)


class TestMLflowWithoutSummaries(TestMLflow):
    """Every run as an older version wrote it: no summary tag, so the reader summarises
    every run from its points."""

    @pytest.fixture(autouse=True)
    def no_summaries(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(tracker, "summary_tags", lambda token, summary: [])
