"""``InMemoryTracker``: an ``AsyncTrackerBase`` that keeps everything in process memory.

For tests and examples: it stores exactly what a real backend would, so code under test can
assert on what it recorded::

    mem = InMemoryTracker()
    with AppRun("r", [mem]) as run:
        run.log_metric("loss", 0.5, step=1)
    assert mem.points("r", "loss")[0].value == 0.5
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from async_tracker.base import AsyncTrackerBase, CloseReason
from async_tracker.records import (
    Batch,
    Lineage,
    MetricRow,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    sort_points,
)


@dataclass
class _Run:
    metadata: dict[str, object] = field(default_factory=dict)
    artifacts: dict[str, TrackerArtifact] = field(default_factory=dict)
    sources: list[TrackerSource] = field(default_factory=list)
    # The points of each batch written, by the batch's identity (its key), in write order,
    # as the batches held them (plain tuples, or TrackerMetric): a write is one dict store,
    # with no cost per point. A replay of a batch (same key) replaces its points, as a store
    # with deterministic object names overwrites them; points are never merged otherwise, so
    # two points alike (same step, same clock tick) are both kept. Reads make the objects.
    batches: dict[str, Sequence[MetricRow]] = field(default_factory=dict)
    # How the run ended (its end record), None while it has not.
    ended: CloseReason | None = None

    def points(self, name: str | None = None) -> list[TrackerMetric]:
        """The points of ``name`` (default: every name), ordered by step, then time, then
        write order."""
        rows = [p for rows in self.batches.values() for p in rows if name in (None, p[0])]
        return sort_points(list(map(TrackerMetric._make, rows)))

    def by_name(self) -> dict[str, list[TrackerMetric]]:
        out: dict[str, list[TrackerMetric]] = {}
        for point in self.points():
            out.setdefault(point.name, []).append(point)
        return out


class InMemoryTracker(AsyncTrackerBase):
    """Runs kept in a dict. Metric points are kept per batch, by the batch's key: a replay
    of a batch replaces its points (it is read once, as real backends store it), and every
    other point is kept, however alike."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self.runs: dict[str, _Run] = {}
        self.batches_written = 0
        self._unkeyed = itertools.count()

    def _run(self, run_id: str) -> _Run:
        return self.runs.setdefault(run_id, _Run())

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self._run(run_id).artifacts[name] = TrackerArtifact(
            name, path, dict(metadata) if metadata is not None else None
        )

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        run = self.runs.get(run_id)
        return dict(run.artifacts) if run else {}

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._run(run_id).metadata.update(kwargs)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        run = self.runs.get(run_id)
        return dict(run.metadata) if run else {}

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        sources = self._run(run_id).sources
        src = TrackerSource(source_id, artifact_name)
        if src not in sources:
            sources.append(src)

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        run = self.runs.get(run_id)
        if run is None:
            return []
        return [s for s in run.sources if artifact_name is None or s.artifact_name == artifact_name]

    async def lineage(self, run_id: str) -> Lineage:
        parents = list(await self.sources(run_id))
        descendants = [
            TrackerSource(child, s.artifact_name)
            for child, run in self.runs.items()
            for s in run.sources
            if s.source_run_id == run_id
        ]
        return Lineage(run_id, parents, descendants)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        parent = kwargs.get("parent_run_id")
        return [
            rid
            for rid, run in self.runs.items()
            if parent is None or any(s.source_run_id == parent for s in run.sources)
        ]

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        self._store(run_id, metrics, "")

    def _store(self, run_id: str, points: Sequence[MetricRow], key: str) -> None:
        batches = self._run(run_id).batches
        # A batch without a key (a direct call) is a write of its own, never a replay.
        batches[key or f"\x00{next(self._unkeyed)}"] = list(points)  # a copy, in C

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        run = self.runs.get(run_id)
        if run is None:
            return {}
        return run.by_name()

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        self._run(run_id).ended = reason

    def ended(self, run_id: str) -> CloseReason | None:
        """How ``run_id`` ended (its end record), None while it has not."""
        run = self.runs.get(run_id)
        return None if run is None else run.ended

    async def run_status(self, run_id: str) -> CloseReason | None:
        """:meth:`ended`, as the read side asks for it (see
        :class:`~async_tracker.store.reader.RecordsEndings`)."""
        return self.ended(run_id)

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        # The points as the batch holds them (no TrackerMetric per point: reads make them);
        # the rest as the default does.
        if batch.points() and "metrics" not in batch.done:
            self._store(run_id, batch.metric_rows(), batch.key)
            batch.done.add("metrics")
        await super().write_batch(run_id, batch)
        self.batches_written += 1

    # Sync conveniences for assertions in tests (no I/O is involved).
    def points(self, run_id: str, name: str) -> list[TrackerMetric]:
        run = self.runs.get(run_id)
        return [] if run is None else run.points(name)

    def __repr__(self) -> str:
        return f"InMemoryTracker(runs={len(self.runs)})"
