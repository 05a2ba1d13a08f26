"""The fsspec store's native reader (:class:`~async_tracker.store.reader.RunReader`): the
run list from the run index (``index.py``: its checkpoint and the summaries written since,
cached by version between listings), a run's scalars from the metric files not read yet (files are
immutable once written, so a cursor is the set of files read, and what the compacted ones
among them cover: see ``metricfiles.py``). A read of a run's metrics may start, beside it,
the compaction of what writers no longer live left uncompacted (``readcompact.py``); a
listing of runs never does."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from async_tracker.backend.fsspec import summaries
from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.columns import parse_segment, times_array
from async_tracker.backend.fsspec.metricfiles import MetricsCursor
from async_tracker.backend.fsspec.parquet import Columns
from async_tracker.backend.fsspec.readcompact import ReaderCompactions
from async_tracker.backend.fsspec.reader import FsspecReader, merged_points
from async_tracker.records import Lineage, TrackerArtifact, TrackerMetric
from async_tracker.store.reader import RunReader, Scalars, ScalarsRead
from async_tracker.store.summary import RunSummary


class FsspecRunReader(RunReader):
    """Reads the runs of one fsspec store (see the module's docstring) through its file
    reader (:class:`~async_tracker.backend.fsspec.reader.FsspecReader`). ``clock``: the
    wall clock that tells whether a run's writers are live (see ``readcompact.py``)."""

    def __init__(
        self, files: FsspecReader, label: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = files
        self.label = label
        # Kept across listings of this reader: a summary file unchanged since (its version:
        # inode, size, mtime; an object's ETag) is not read again.
        self._cache = SummaryFileCache()
        # What this reader compacts after its reads of metrics, and what it remembers of it.
        self.compactions = ReaderCompactions(files, clock)

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
        read = await self.store.metric_points(run_id)
        self.compactions.after_read(run_id, read)
        return merged_points(read)

    async def scalars(
        self,
        run_id: str,
        names: Collection[str] | None = None,
        since: object | None = None,
    ) -> ScalarsRead:
        """The points of the metric files not read by the read that returned ``since``,
        decoded straight into columns (Parquet: the name, step, value and time columns of
        the row groups that may hold ``names``). After a compaction of files read then,
        every point (``reset``)."""
        cursor = since if isinstance(since, MetricsCursor) else None
        read = await self.store.metric_segments(
            run_id, _json_scalars, _scalars, since=cursor, names=names
        )
        self.compactions.after_read(run_id, read)
        parts: dict[str, list[Scalars]] = {}
        for _, curves in read.segments:
            for name, part in curves.items():
                if names is None or name in names:
                    parts.setdefault(name, []).append(part)
        joined = {name: _joined(group) for name, group in parts.items()}
        return ScalarsRead({n: c for n, c in joined.items() if len(c)}, read.cursor, read.reset)

    async def overview(
        self, run_id: str, names: Collection[str] | None = None
    ) -> dict[str, Scalars] | None:
        """The compacted files' overviews (``overview/``), the small files themselves; None
        while the run has files that are not compacted (see
        FsspecReader.overview_segments)."""
        parts = await self.store.overview_segments(run_id, _scalars, names)
        if parts is None:
            return None
        grouped: dict[str, list[Scalars]] = {}
        for curves in parts:
            for name, part in curves.items():
                if len(part) and (names is None or name in names):
                    grouped.setdefault(name, []).append(part)
        joined = {name: _joined(group) for name, group in grouped.items()}
        return joined

    async def status(self, run_id: str) -> tuple[str, float | None]:
        return await self.store.run_status(run_id)

    async def writers(self, run_id: str) -> dict[str, dict[str, object]]:
        return await self.store.heartbeats(run_id)


def _scalars(columns: Mapping[str, Columns]) -> dict[str, Scalars]:
    """A Parquet file's decoded columns (times read) as Scalars, in file order."""
    out = {}
    for name, col in columns.items():
        assert col.times is not None
        out[name] = Scalars(col.steps, col.values, col.times)
    return out


def _json_scalars(data: bytes) -> tuple[dict[str, Scalars], str]:
    """A JSON Lines segment as Scalars, in file order, and the lines skipped."""
    chunks, bad = parse_segment(data)
    curves = {
        name: Scalars(chunk.steps.astype(np.int64), chunk.values, times_array(chunk.times))
        for name, chunk in chunks.items()
    }
    return curves, bad


def _joined(parts: Sequence[Scalars]) -> Scalars:
    """One metric's parts (files in write order, each in its order) as one, sorted by step,
    stably: points of one step keep write order."""
    if len(parts) == 1:
        steps, values, times = parts[0].steps, parts[0].values, parts[0].times
    else:
        steps = np.concatenate([p.steps for p in parts])
        values = np.concatenate([p.values for p in parts])
        times = np.concatenate([p.times for p in parts])
    if len(steps) > 1 and not bool(np.all(steps[1:] >= steps[:-1])):
        order = np.argsort(steps, kind="stable")
        steps, values, times = steps[order], values[order], times[order]
    return Scalars(steps, values, times)


__all__ = ["FsspecRunReader"]
