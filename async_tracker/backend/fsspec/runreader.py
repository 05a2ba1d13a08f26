"""The fsspec store's native reader (:class:`~async_tracker.store.reader.RunReader`): the
run list from the writers' summaries (one listing of the store's root, summary files cached
by version between listings), a run's scalars from the metric segments not read yet
(segments are immutable once written, so a cursor is the set of segments read)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from async_tracker.backend.fsspec import summaries
from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.columns import parse_segment, times_array
from async_tracker.backend.fsspec.reader import FsspecReader
from async_tracker.records import Lineage, TrackerArtifact, TrackerMetric
from async_tracker.store.reader import RunReader, Scalars, ScalarsRead, merge_points
from async_tracker.store.summary import RunSummary


class FsspecRunReader(RunReader):
    """Reads the runs of one fsspec store (see the module's docstring) through its file
    reader (:class:`~async_tracker.backend.fsspec.reader.FsspecReader`)."""

    def __init__(self, files: FsspecReader, label: str) -> None:
        self.store = files
        self.label = label
        # Kept across listings of this reader: a summary file unchanged since (its version:
        # inode, size, mtime; an object's ETag) is not read again.
        self._cache = SummaryFileCache()

    def __repr__(self) -> str:
        return f"FsspecRunReader({self.store!r})"

    async def run_summaries(self) -> list[RunSummary]:
        return await summaries.run_summaries(self.store, cache=self._cache)

    async def run_ids(self, parent_run_id: str | None = None) -> list[str]:
        if parent_run_id is None:
            return list(await self.store.run_ids())
        return list(await self.store.run_ids(parent_run_id=parent_run_id))

    async def run_exists(self, run_id: str) -> bool:
        return await self.store.run_exists(run_id)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return await self.store.metadata(run_id)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return await self.store.artifacts(run_id)

    async def lineage(self, run_id: str) -> Lineage:
        return await self.store.lineage(run_id)

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return await self.store.metrics(run_id)

    async def scalars(
        self,
        run_id: str,
        names: Collection[str] | None = None,
        since: object | None = None,
    ) -> ScalarsRead:
        """The points of the segments not in ``since`` (the segments an earlier read took),
        parsed straight into columns."""
        known = since if isinstance(since, frozenset) else frozenset()
        segments = await self.store.metric_segments(run_id, known, parse_segment)
        parts: dict[str, list[Scalars]] = {}
        for _, chunks in segments:
            for name, chunk in chunks.items():
                if names is None or name in names:
                    parts.setdefault(name, []).append(
                        Scalars(
                            chunk.steps.astype("int64"), chunk.values, times_array(chunk.times)
                        )
                    )
        curves = {name: merge_points(group) for name, group in parts.items()}
        cursor = known | {name for name, _ in segments}
        return ScalarsRead(curves, cursor, reset=not known)

    async def status(self, run_id: str) -> tuple[str, float | None]:
        return await self.store.run_status(run_id)

    async def writers(self, run_id: str) -> dict[str, dict[str, object]]:
        return await self.store.heartbeats(run_id)


__all__ = ["FsspecRunReader"]
