"""A backend without a reader of its own is read through the generic reader, and its author
is told once per backend class that listing its runs reads every point."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import pytest

from async_tracker import AppRun, TrackerBase
from async_tracker.records import Lineage, TrackerArtifact, TrackerSource
from async_tracker.store.open import open_reader


class DictTracker(TrackerBase):
    """A torchx-style plug-in: the eight methods over dicts, no metrics."""

    def __init__(self) -> None:
        self.md: dict[str, dict[str, object]] = {}

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self.md.setdefault(run_id, {})

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return {}

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self.md.setdefault(run_id, {}).update(kwargs)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return dict(self.md.get(run_id, {}))

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self.md.setdefault(run_id, {})

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        return []

    def lineage(self, run_id: str) -> Lineage:
        return Lineage(run_id, [], [])

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        return list(self.md)


def test_a_plugin_is_listed_and_its_author_told_once(caplog: pytest.LogCaptureFixture) -> None:
    plugin = DictTracker()
    with AppRun("p/1", [plugin], heartbeat_s=0) as run:
        run.add_metadata(lr=0.1)
    with caplog.at_level(logging.WARNING, logger="async_tracker.store.reader"):
        for _ in range(2):
            (summary,) = open_reader(plugin).run_summaries()
            assert summary.run_id == "p/1" and summary.params["lr"] == 0.1
        told = [r.getMessage() for r in caplog.records if r.name == "async_tracker.store.reader"]
    assert len(told) == 1 and "DictTracker has no reader of its own" in told[0], told


def test_the_packages_own_backends_are_not_told(caplog: pytest.LogCaptureFixture) -> None:
    from async_tracker.backend.memory import InMemoryTracker

    memory = InMemoryTracker()
    with AppRun("m/1", [memory], heartbeat_s=0) as run:
        run.log_metric("loss", 1.0, step=0)
    with caplog.at_level(logging.WARNING, logger="async_tracker.store.reader"):
        (summary,) = open_reader(memory).run_summaries()
    assert summary.metrics["loss"].count == 1 and caplog.records == []
