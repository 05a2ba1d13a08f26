"""A tracker plug-in written against torchx itself: a subclass of
``torchx.tracker.api.TrackerBase`` returning torchx's dataclasses, as every torchx plug-in
does. Imported only by child scripts in torchx's venv (``.venvs/torchx``)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from torchx.tracker.api import Lineage, TrackerArtifact, TrackerBase, TrackerSource
from torchx.tracker.backend.fsspec import create as create_torchx_fsspec

BUILT: list[TorchxRecordingTracker] = []


class TorchxRecordingTracker(TrackerBase):
    """Keeps runs in dicts and records every call with whether it ran on the main thread."""

    def __init__(self, config: str | None = None) -> None:
        self.config = config
        self.runs: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, bool]] = []

    def _run(self, method: str, run_id: str) -> dict[str, Any]:
        self.calls.append((method, run_id, threading.current_thread() is threading.main_thread()))
        return self.runs.setdefault(run_id, {"metadata": {}, "artifacts": {}, "sources": []})

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self._run("add_artifact", run_id)["artifacts"][name] = TrackerArtifact(
            name, path, metadata
        )

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return dict(self._run("artifacts", run_id)["artifacts"])

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._run("add_metadata", run_id)["metadata"].update(kwargs)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return dict(self._run("metadata", run_id)["metadata"])

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self._run("add_source", run_id)["sources"].append(TrackerSource(source_id, artifact_name))

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        found = self._run("sources", run_id)["sources"]
        return [s for s in found if artifact_name is None or s.artifact_name == artifact_name]

    def lineage(self, run_id: str) -> Lineage:
        return Lineage()

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        return list(self.runs)


def create_recording(config: str | None) -> TorchxRecordingTracker:
    """A ``module:attr`` factory of a torchx plug-in."""
    tracker = TorchxRecordingTracker(config)
    BUILT.append(tracker)
    return tracker


def create_fsspec(config: str) -> TrackerBase:
    """A ``module:attr`` factory of the user's own that hands over to torchx's fsspec one."""
    return create_torchx_fsspec(config)
