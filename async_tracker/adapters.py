"""Thin adapters between the blocking and the async backend interfaces.

* :func:`as_async` runs a blocking ``TrackerBase`` in the process's worker threads
  (:mod:`async_tracker.runtime.threads`), so that it never blocks the tracker loop. Any object with
  ``TrackerBase``'s eight methods counts as one: torchx's own tracker plug-ins (subclasses of
  ``torchx.tracker.api.TrackerBase``) and duck-typed classes, seen through a
  :class:`ForeignTracker`.
* :func:`as_sync` runs an ``AsyncTrackerBase`` on the tracker loop and blocks the caller until
  the call is done. ``FsspecTracker`` and ``MLflowTracker`` are such adapters; ``AppRun``
  unwraps them and talks to the async backend directly.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from async_tracker.base import AsyncTrackerBase, CloseReason, TrackerBase, backend_name
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
from async_tracker.runtime.process import run_blocking, runtime

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
        return runtime().loop.call(fn, *args)

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


class TrackerLike(Protocol):
    """What a blocking backend needs: ``TrackerBase``'s eight methods, whatever its class.

    torchx's own ``torchx.tracker.api.TrackerBase`` subclasses (every torchx tracker plug-in)
    match, and so does any duck-typed class. Return types are loose on purpose: a plug-in
    returns its own library's ``TrackerArtifact`` and ``TrackerSource`` classes, which
    :class:`ForeignTracker` converts to ours.
    """

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> object: ...

    def artifacts(self, run_id: str) -> Any: ...

    def add_metadata(self, run_id: str, **kwargs: object) -> object: ...

    def metadata(self, run_id: str) -> Any: ...

    def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> object: ...

    def sources(self, run_id: str, artifact_name: str | None = None) -> Any: ...

    def lineage(self, run_id: str) -> Any: ...

    def run_ids(self, **kwargs: str) -> Any: ...


NOT_A_BACKEND = "a backend must be a TrackerBase, an AsyncTrackerBase or have TrackerBase's methods"
TRACKER_METHODS = (
    "add_artifact",
    "artifacts",
    "add_metadata",
    "metadata",
    "add_source",
    "sources",
    "lineage",
    "run_ids",
)
# What a ForeignTracker takes from its plug-in when the plug-in has it (ThreadedTracker
# looks for these to decide on metrics and closing).
_OPTIONAL_METHODS = frozenset({"add_metrics", "metrics", "close"})


def tracker_problem(obj: object) -> str | None:
    """Why ``obj`` cannot be a backend, or None when it can: a ``TrackerBase``, an
    ``AsyncTrackerBase``, or an instance with ``TrackerBase``'s eight methods, not async."""
    if isinstance(obj, (TrackerBase, AsyncTrackerBase)):
        return None
    return _plugin_problem(obj)


def _plugin_problem(obj: object) -> str | None:
    kind = type(obj).__name__
    if isinstance(obj, type):
        # A class has the methods too (as functions): the instance was meant.
        return f"the class {obj.__name__}, not an instance of it"
    missing = [m for m in TRACKER_METHODS if not callable(getattr(obj, m, None))]
    if len(missing) == len(TRACKER_METHODS):
        return f"{kind}, not a TrackerBase or AsyncTrackerBase"
    if missing:
        return (
            f"{kind}, not a TrackerBase or AsyncTrackerBase: it lacks TrackerBase's "
            + ", ".join(missing)
        )
    coroutines = [m for m in TRACKER_METHODS if inspect.iscoroutinefunction(getattr(obj, m))]
    if coroutines:
        return (
            f"{kind}, whose {', '.join(coroutines)} are coroutine functions: an async "
            "backend must subclass AsyncTrackerBase"
        )
    return None


class ForeignTracker(TrackerBase):
    """Our ``TrackerBase`` over a plug-in that has its eight methods but not our class:
    torchx's own trackers (``torchx.tracker.backend.fsspec.FsspecTracker``, MLflow's ...) and
    duck-typed ones. Calls pass through unchanged; what reads return is converted to our
    ``TrackerArtifact``, ``TrackerSource`` and ``Lineage``, so that ``AppRun``'s reads look
    the same whatever the backend; a ``lineage()`` the plug-in does not implement is built
    from its ``sources()`` and ``run_ids(parent_run_id=...)``. ``add_metrics``, ``metrics``
    and ``close`` are the plug-in's, when it has them.
    """

    def __init__(self, tracker: TrackerLike) -> None:
        problem = _plugin_problem(tracker)
        if problem is not None:
            raise TypeError(f"{NOT_A_BACKEND}, got {problem}")
        self.tracker = tracker
        self.name = backend_name(tracker)

    def __getattr__(self, attr: str) -> Any:
        # Called only for attributes the class lacks: the plug-in's optional methods, so that
        # ThreadedTracker's getattr(..., None) sees exactly what the plug-in has.
        if attr in _OPTIONAL_METHODS:
            return getattr(self.tracker, attr)
        raise AttributeError(attr)

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self.tracker.add_artifact(run_id, name, path, metadata)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        found = self.tracker.artifacts(run_id)
        return {key: self._artifact(value) for key, value in found.items()}

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self.tracker.add_metadata(run_id, **kwargs)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return dict(self.tracker.metadata(run_id))

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self.tracker.add_source(run_id, source_id, artifact_name)

    def sources(self, run_id: str, artifact_name: str | None = None) -> list[TrackerSource]:
        return [self._source(s) for s in self.tracker.sources(run_id, artifact_name)]

    def lineage(self, run_id: str) -> Lineage:
        try:
            found = self.tracker.lineage(run_id)
        except NotImplementedError:  # torchx's FsspecTracker, for one
            found = None
        if isinstance(found, Lineage):
            return found
        if hasattr(found, "parents") and hasattr(found, "descendants"):
            return Lineage(
                run_id,
                [self._source(s) for s in found.parents],
                [self._source(s) for s in found.descendants],
            )
        # torchx's Lineage has no fields, and its trackers leave lineage() unimplemented:
        # what the two queries every torchx tracker answers say instead.
        descendants = [
            TrackerSource(child, source.artifact_name)
            for child in self.run_ids(parent_run_id=run_id)
            for source in self.sources(child)
            if source.source_run_id == run_id
        ]
        return Lineage(run_id, self.sources(run_id), descendants)

    def run_ids(self, **kwargs: str) -> list[str]:
        return list(self.tracker.run_ids(**kwargs))

    def _artifact(self, value: Any) -> TrackerArtifact:
        if isinstance(value, TrackerArtifact):
            return value
        try:
            return TrackerArtifact(value.name, value.path, value.metadata)
        except AttributeError:
            raise TypeError(
                f"{self.tracker!r}.artifacts() gave {value!r}, not an artifact "
                "(name, path, metadata)"
            ) from None

    def _source(self, value: Any) -> TrackerSource:
        if isinstance(value, TrackerSource):
            return value
        try:
            return TrackerSource(value.source_run_id, value.artifact_name)
        except AttributeError:
            raise TypeError(
                f"{self.tracker!r} gave {value!r} as a source, not a TrackerSource "
                "(source_run_id, artifact_name)"
            ) from None

    def __repr__(self) -> str:
        return repr(self.tracker)


def as_async(tracker: TrackerLike | AsyncTrackerBase) -> AsyncTrackerBase:
    """The async face of any backend: itself if already async, the wrapped async backend of
    an :func:`as_sync` adapter, else a :class:`ThreadedTracker` running it in threads (a
    plug-in with ``TrackerBase``'s methods but not our class through a
    :class:`ForeignTracker`). Anything else is a ``TypeError`` saying what it lacks."""
    if isinstance(tracker, AsyncTrackerBase):
        return tracker
    if isinstance(tracker, SyncTracker):
        return tracker.async_tracker
    if isinstance(tracker, TrackerBase):
        return ThreadedTracker(tracker)
    return ThreadedTracker(ForeignTracker(tracker))


def as_sync(tracker: AsyncTrackerBase | TrackerLike) -> TrackerBase:
    """The blocking face of any backend (see :class:`SyncTracker`); a plug-in with
    ``TrackerBase``'s methods but not our class is seen through a :class:`ForeignTracker`."""
    if isinstance(tracker, ThreadedTracker):
        return tracker.tracker
    if isinstance(tracker, TrackerBase):
        return tracker
    if isinstance(tracker, AsyncTrackerBase):
        return SyncTracker(tracker)
    return ForeignTracker(tracker)
