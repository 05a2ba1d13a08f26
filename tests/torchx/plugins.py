"""Tracker plug-ins that have ``TrackerBase``'s eight methods but not our class: what a torchx
user brings. Importable without pytest or torchx, so that child scripts in torchx's venv can
name these factories in ``TORCHX_TRACKERS`` too.

* :class:`DuckTracker`: subclasses nothing; returns its own artifact and source classes (as
  torchx's trackers return torchx's), and records the thread of every call.
* :class:`DuckMetricTracker`: a ``DuckTracker`` with the optional ``add_metrics``/``metrics``.
* ``create_duck`` / ``create_duck_with_metrics``: factories by ``module:attr``; each keeps what
  it built (with the config string it was given) in :data:`BUILT`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BUILT: list[DuckTracker] = []


@dataclass
class Artifact:
    """Not our TrackerArtifact: the fields of one."""

    name: str
    path: str
    metadata: Mapping[str, object] | None


@dataclass
class Source:
    """Not our TrackerSource: the fields of one."""

    source_run_id: str
    artifact_name: str | None


class DuckTracker:
    """A blocking tracker with ``TrackerBase``'s eight methods, subclassing nothing."""

    def __init__(self, config: str | None = None) -> None:
        self.config = config
        self.runs: dict[str, dict[str, Any]] = {}
        # Every call, in order: (method, run_id, whether it ran on the main thread).
        self.calls: list[tuple[str, str, bool]] = []
        self.closed = 0

    def _run(self, method: str, run_id: str) -> dict[str, Any]:
        self.calls.append((method, run_id, threading.current_thread() is threading.main_thread()))
        return self.runs.setdefault(run_id, {"metadata": {}, "artifacts": {}, "sources": []})

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self._run("add_artifact", run_id)["artifacts"][name] = Artifact(name, path, metadata)

    def artifacts(self, run_id: str) -> Mapping[str, Artifact]:
        return dict(self._run("artifacts", run_id)["artifacts"])

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._run("add_metadata", run_id)["metadata"].update(kwargs)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return dict(self._run("metadata", run_id)["metadata"])

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self._run("add_source", run_id)["sources"].append(Source(source_id, artifact_name))

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[Source]:
        found = self._run("sources", run_id)["sources"]
        return [s for s in found if artifact_name is None or s.artifact_name == artifact_name]

    def lineage(self, run_id: str) -> object:
        return object()  # torchx's Lineage has no fields; ours is built from what is there

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        parent = kwargs.get("parent_run_id")
        return [
            rid
            for rid, run in self.runs.items()
            if parent is None or any(s.source_run_id == parent for s in run["sources"])
        ]

    def close(self) -> None:
        self.closed += 1


class DuckMetricTracker(DuckTracker):
    """A duck-typed plug-in with the optional metric methods of our sync backends."""

    def add_metrics(self, run_id: str, metrics: Sequence[Any]) -> None:
        self._run("add_metrics", run_id).setdefault("metrics", []).extend(metrics)

    def metrics(self, run_id: str) -> Mapping[str, Sequence[Any]]:
        out: dict[str, list[Any]] = {}
        for point in self._run("metrics", run_id).get("metrics", []):
            out.setdefault(point.name, []).append(point)
        return out


def create_duck(config: str | None) -> DuckTracker:
    tracker = DuckTracker(config)
    BUILT.append(tracker)
    return tracker


def create_duck_with_metrics(config: str | None) -> DuckMetricTracker:
    tracker = DuckMetricTracker(config)
    BUILT.append(tracker)
    return tracker
