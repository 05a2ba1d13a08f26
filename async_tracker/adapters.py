"""Thin adapters between the blocking and the async backend interfaces.

* :func:`as_async` runs a blocking ``TrackerBase`` in the process's worker threads
  (:mod:`async_tracker.threads`), so that it never blocks the tracker loop.
* :func:`as_sync` runs an ``AsyncTrackerBase`` on the tracker loop and blocks the caller until
  the call is done. ``FsspecTracker`` and ``MLflowTracker`` are such adapters; ``AppRun``
  unwraps them and talks to the async backend directly.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from async_tracker.base import AsyncTrackerBase, CloseReason, TrackerBase, backend_name
from async_tracker.loop import get_loop
from async_tracker.records import (
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    check_artifact,
    check_metadata,
    check_name,
    check_source,
)
from async_tracker.threads import run_blocking

T = TypeVar("T")


class ThreadedTracker(AsyncTrackerBase):
    """An ``AsyncTrackerBase`` over a blocking ``TrackerBase`` (see :func:`as_async`).

    A ``TrackerBase`` has no metric method; one that has ``add_metrics(run_id, metrics)`` and
    ``metrics(run_id)`` anyway gets its metrics, the others skip them.
    """

    def __init__(self, tracker: TrackerBase) -> None:
        self.tracker = tracker
        self.name = backend_name(tracker)
        # What it talks to is unknown: each backend object is an endpoint of its own (shared
        # by the runs it serves), so that a hung one holds at most its share of the threads.
        # An id is not reused while a call holds a slot: the call holds the object.
        self.endpoint = f"{type(tracker).__qualname__}@{id(tracker):#x}"

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await run_blocking(fn, *args, endpoint=self.endpoint)

    @property
    def supports_metrics(self) -> bool:
        return callable(getattr(self.tracker, "add_metrics", None)) and callable(
            getattr(self.tracker, "metrics", None)
        )

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        await self._run(self.tracker.add_artifact, run_id, name, path, metadata)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return await self._run(self.tracker.artifacts, run_id)

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self._run(functools.partial(self.tracker.add_metadata, run_id, **kwargs))

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return await self._run(self.tracker.metadata, run_id)

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        await self._run(self.tracker.add_source, run_id, source_id, artifact_name)

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        return await self._run(lambda: list(self.tracker.sources(run_id, artifact_name)))

    async def lineage(self, run_id: str) -> Lineage:
        return await self._run(self.tracker.lineage, run_id)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        return await self._run(lambda: list(self.tracker.run_ids(**kwargs)))

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        if self.supports_metrics:
            await self._run(self.tracker.add_metrics, run_id, metrics)  # type: ignore[attr-defined]

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        if not self.supports_metrics:
            return {}
        return await self._run(self.tracker.metrics, run_id)  # type: ignore[attr-defined]

    async def aclose(self, reason: CloseReason = "finished") -> None:
        close = getattr(self.tracker, "close", None)
        if callable(close):
            await self._run(close)

    def __repr__(self) -> str:
        return f"as_async({self.tracker!r})"


class SyncTracker(TrackerBase):
    """A blocking ``TrackerBase`` over an ``AsyncTrackerBase`` (see :func:`as_sync`).

    Each call runs on the tracker loop and returns once the backend has stored or read.
    Input is checked here, as ``AppRun`` checks it, so bad input fails the same way.
    """

    def __init__(self, tracker: AsyncTrackerBase) -> None:
        self.async_tracker = tracker

    @property
    def name(self) -> str:
        return backend_name(self.async_tracker)

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return get_loop().call(fn, *args)

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        check_name(run_id, "run_id")
        art = check_artifact(name, path, metadata)
        self._call(self.async_tracker.add_artifact, run_id, art.name, art.path, art.metadata)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return self._call(self.async_tracker.artifacts, run_id)

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        check_name(run_id, "run_id")
        md = check_metadata(kwargs)
        self._call(functools.partial(self.async_tracker.add_metadata, run_id, **md))

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return self._call(self.async_tracker.metadata, run_id)

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        check_name(run_id, "run_id")
        src = check_source(source_id, artifact_name)
        self._call(self.async_tracker.add_source, run_id, src.source_run_id, src.artifact_name)

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        return list(self._call(self.async_tracker.sources, run_id, artifact_name))

    def lineage(self, run_id: str) -> Lineage:
        return self._call(self.async_tracker.lineage, run_id)

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        return list(self._call(functools.partial(self.async_tracker.run_ids, **kwargs)))

    def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        check_name(run_id, "run_id")
        self._call(self.async_tracker.add_metrics, run_id, list(metrics))

    def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return self._call(self.async_tracker.metrics, run_id)

    def close(self, reason: CloseReason = "finished") -> None:
        self._call(self.async_tracker.aclose, reason)

    def __repr__(self) -> str:
        return f"as_sync({self.async_tracker!r})"


def as_async(tracker: TrackerBase | AsyncTrackerBase) -> AsyncTrackerBase:
    """The async face of any backend: itself if already async, the wrapped async backend of
    an :func:`as_sync` adapter, else a :class:`ThreadedTracker` running it in threads."""
    if isinstance(tracker, AsyncTrackerBase):
        return tracker
    if isinstance(tracker, SyncTracker):
        return tracker.async_tracker
    if isinstance(tracker, TrackerBase):
        return ThreadedTracker(tracker)
    raise TypeError(
        f"a backend must be a TrackerBase or an AsyncTrackerBase, got {type(tracker).__name__}"
    )


def as_sync(tracker: AsyncTrackerBase | TrackerBase) -> TrackerBase:
    """The blocking face of any backend (see :class:`SyncTracker`)."""
    if isinstance(tracker, ThreadedTracker):
        return tracker.tracker
    if isinstance(tracker, TrackerBase):
        return tracker
    if isinstance(tracker, AsyncTrackerBase):
        return SyncTracker(tracker)
    raise TypeError(
        f"a backend must be a TrackerBase or an AsyncTrackerBase, got {type(tracker).__name__}"
    )
