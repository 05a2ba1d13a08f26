"""The sync face of a :class:`~async_tracker.store.reader.RunReader`, with a deadline on
every read: what ``Store``, the CLI and the dashboard hold.

Each call runs the reader's coroutine on the tracker loop and waits for it at most
``timeout`` seconds; past it the coroutine is cancelled and :class:`ReadTimeoutError` names
the store. A store that accepts connections and never answers (an S3 endpoint behind a
stuck proxy) then fails a command in its deadline instead of minutes of retries.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from async_tracker.errors import ReadTimeoutError
from async_tracker.records import Lineage, TrackerArtifact, TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.settings import read_timeout
from async_tracker.store.reader import RunListing, RunReader, Scalars, ScalarsRead
from async_tracker.store.runs import select
from async_tracker.store.summary import RunSummary

T = TypeVar("T")


class Reader:
    """A store's :class:`RunReader` read from plain code: each method is the reader's
    coroutine of the same name, waited for at most ``timeout`` seconds (default
    ``$ASYNC_TRACKER_READ_TIMEOUT``, else 30 s; ``math.inf``: no deadline)."""

    def __init__(self, reader: RunReader, timeout: float | None = None) -> None:
        self.reader = reader
        self.timeout = read_timeout(timeout)

    @property
    def label(self) -> str:
        """What errors call the store (``store file:///data/runs``)."""
        return self.reader.label

    def __repr__(self) -> str:
        return f"Reader({self.reader!r})"

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        future = runtime().loop.submit(fn, *args)
        try:
            return future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            # Cancelling the future cancels the read's task on the loop: nothing of it
            # goes on in the background.
            future.cancel()
            raise ReadTimeoutError(
                f"the {self.label} did not answer within {self.timeout:g} s "
                "(--timeout / timeout= sets the deadline)"
            ) from None

    def run_summaries(self) -> list[RunSummary]:
        return self._call(self.reader.run_summaries)

    def list_runs(self, since: object | None = None) -> RunListing:
        return self._call(self.reader.list_runs, since)

    def newest_runs(
        self, limit: int, run_ids: Collection[str] | None = None
    ) -> tuple[list[RunSummary], int]:
        return self._call(self.reader.newest_runs, limit, run_ids)

    def select_runs(
        self,
        filter: str | None = None,
        sort: str | None = None,
        limit: int | None = None,
        run_ids: Collection[str] | None = None,
    ) -> tuple[list[RunSummary], int]:
        """:func:`~async_tracker.store.runs.select` of the runs (those of ``run_ids``: all
        without it): the runs ``filter`` accepts, in ``sort``'s order, at most ``limit``,
        and how many ``limit`` left out. The newest ``limit`` runs, unfiltered (what a
        list shows by default), are asked of the store's reader (:meth:`newest_runs`),
        which may make those summaries alone; a filter or a sort looks at every summary,
        here, on the caller's thread (not on the tracker loop: a filter over 100,000 runs
        takes a while)."""
        if limit and not filter and not sort:
            return self.newest_runs(limit, run_ids)
        runs = self.run_summaries()
        if run_ids is not None:
            runs = [r for r in runs if r.run_id in run_ids]
        return select(runs, filter, sort, limit)

    def run_summary(self, run_id: str) -> RunSummary | None:
        return self._call(self.reader.run_summary, run_id)

    def run_ids(self, parent_run_id: str | None = None) -> list[str]:
        return self._call(self.reader.run_ids, parent_run_id)

    def run_exists(self, run_id: str) -> bool:
        return self._call(self.reader.run_exists, run_id)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return self._call(self.reader.metadata, run_id)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return self._call(self.reader.artifacts, run_id)

    def lineage(self, run_id: str) -> Lineage:
        return self._call(self.reader.lineage, run_id)

    def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return self._call(self.reader.metrics, run_id)

    def scalars(
        self, run_id: str, names: Collection[str] | None = None, since: object | None = None
    ) -> ScalarsRead:
        return self._call(self.reader.scalars, run_id, names, since)

    def overview(
        self, run_id: str, names: Collection[str] | None = None
    ) -> dict[str, Scalars] | None:
        return self._call(self.reader.overview, run_id, names)

    def status(self, run_id: str) -> tuple[str, float | None]:
        return self._call(self.reader.status, run_id)

    def writers(self, run_id: str) -> dict[str, dict[str, object]]:
        return self._call(self.reader.writers, run_id)


__all__ = ["Reader"]
