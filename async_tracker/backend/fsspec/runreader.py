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

from async_tracker.backend.fsspec import summaries
from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.readcompact import ReaderCompactions
from async_tracker.backend.fsspec.reader import FsspecReader, merged_points
from async_tracker.records import Lineage, TrackerArtifact, TrackerMetric
from async_tracker.runtime.process import import_in_thread, lazy_imports
from async_tracker.store.reader import RunReader, Scalars, ScalarsRead
from async_tracker.store.summary import RunSummary

# Reads points as columns with numpy and pyarrow: imported at the first such read, in a
# worker thread (runtime.process.import_in_thread), not with the reader, so that a listing
# of runs never loads them (a tenth of a second or more).
_SCALARS = "async_tracker.backend.fsspec.runscalars"


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

    async def newest_runs(
        self, limit: int, run_ids: Collection[str] | None = None
    ) -> tuple[list[RunSummary], int]:
        """Ordered by the starts the run index keeps: the summaries of the runs returned
        alone are made (see :class:`~async_tracker.backend.fsspec.summaries.RunList`)."""
        listing = await summaries.run_list(self.store, cache=self._cache)
        return await listing.newest(limit, run_ids)

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
        await import_in_thread(_SCALARS, endpoint=self.store.storage.endpoint)
        with lazy_imports:  # loaded: a fork waits for the import (see runtime/process.py)
            from async_tracker.backend.fsspec.runscalars import read_scalars

        return await read_scalars(self.store, run_id, names, since, self.compactions.after_read)

    async def overview(
        self, run_id: str, names: Collection[str] | None = None
    ) -> dict[str, Scalars] | None:
        """The compacted files' overviews (``overview/``), the small files themselves; None
        while the run has files that are not compacted (see
        FsspecReader.overview_segments)."""
        await import_in_thread(_SCALARS, endpoint=self.store.storage.endpoint)
        with lazy_imports:
            from async_tracker.backend.fsspec.runscalars import read_overview

        return await read_overview(self.store, run_id, names)

    async def status(self, run_id: str) -> tuple[str, float | None]:
        return await self.store.run_status(run_id)

    async def writers(self, run_id: str) -> dict[str, dict[str, object]]:
        return await self.store.heartbeats(run_id)


__all__ = ["FsspecRunReader"]
