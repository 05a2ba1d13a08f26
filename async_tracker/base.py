"""The two backend interfaces: torchx's ``TrackerBase`` and its async twin.

``TrackerBase`` keeps exactly torchx's eight abstract methods and signatures, so that existing
backends plug in unchanged. ``AsyncTrackerBase`` has the same eight as coroutines, plus
metrics, a bulk ``write_batch`` and ``aclose``. ``AppRun`` talks to every backend through the
async interface: plain ``TrackerBase`` objects are wrapped by
:func:`async_tracker.adapters.as_async`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

from async_tracker.records import (
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
)


class TrackerBase(ABC):
    """A blocking tracker backend: torchx's interface, unchanged."""

    @abstractmethod
    def add_artifact(
        self,
        run_id: str,
        name: str,
        path: str,
        metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Adds an artifact with a name, a path and any metadata."""

    @abstractmethod
    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        """The artifacts of a run, by name."""

    @abstractmethod
    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        """Adds metadata values to a run; a later value of a key replaces an earlier one."""

    @abstractmethod
    def metadata(self, run_id: str) -> Mapping[str, object]:
        """The metadata of a run."""

    @abstractmethod
    def add_source(
        self,
        run_id: str,
        source_id: str,
        artifact_name: str | None = None,
    ) -> None:
        """Links a run to a source it derives from (a parent run, a data set ...)."""

    @abstractmethod
    def sources(
        self,
        run_id: str,
        artifact_name: str | None = None,
    ) -> Iterable[TrackerSource]:
        """The sources of a run, optionally only those with ``artifact_name``."""

    @abstractmethod
    def lineage(self, run_id: str) -> Lineage:
        """The parents and descendants of a run."""

    @abstractmethod
    def run_ids(self, **kwargs: str) -> Iterable[str]:
        """The run ids in the store, filtered by ``parent_run_id=`` where given."""


class AsyncTrackerBase(ABC):
    """An async tracker backend.

    Implement the eight torchx methods as coroutines plus ``add_metrics`` and ``metrics``.
    Override ``write_batch`` to store a whole flush in bulk, and ``aclose`` to release
    resources. Raise ``ConnectionError``, ``TimeoutError`` or
    :class:`~async_tracker.errors.TransientBackendError` for failures worth retrying; anything
    else is treated as permanent.

    ``name`` names the backend in reports, ``status()`` and spool keys (default: class name).
    """

    name: str | None = None

    @abstractmethod
    async def add_artifact(
        self,
        run_id: str,
        name: str,
        path: str,
        metadata: Mapping[str, object] | None = None,
    ) -> None: ...

    @abstractmethod
    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]: ...

    @abstractmethod
    async def add_metadata(self, run_id: str, **kwargs: object) -> None: ...

    @abstractmethod
    async def metadata(self, run_id: str) -> Mapping[str, object]: ...

    @abstractmethod
    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None: ...

    @abstractmethod
    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]: ...

    @abstractmethod
    async def lineage(self, run_id: str) -> Lineage: ...

    @abstractmethod
    async def run_ids(self, **kwargs: str) -> Iterable[str]: ...

    @abstractmethod
    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        """Stores metric points (steps already resolved, timestamps from the client)."""

    @abstractmethod
    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        """Every metric of a run, its points ordered by step then time."""

    @property
    def supports_metrics(self) -> bool:
        """False for adapters over a plain ``TrackerBase``, which has no metric method."""
        return True

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Stores one flush. The default replays it through the single-record methods.

        Parts already in ``batch.done`` are skipped and each part is marked when stored, so
        that a retry after a failure half-way never writes a part twice.
        """
        if batch.metadata and "metadata" not in batch.done:
            await self.add_metadata(run_id, **batch.metadata)
            batch.done.add("metadata")
        for name, artifact in batch.artifacts.items():
            part = f"artifact:{name}"
            if part not in batch.done:
                await self.add_artifact(run_id, name, artifact.path, artifact.metadata)
                batch.done.add(part)
        for source in batch.sources:
            part = f"source:{source.source_run_id}:{source.artifact_name or ''}"
            if part not in batch.done:
                await self.add_source(run_id, source.source_run_id, source.artifact_name)
                batch.done.add(part)
        if batch.metrics and self.supports_metrics and "metrics" not in batch.done:
            await self.add_metrics(run_id, batch.metrics)
            batch.done.add("metrics")

    async def aclose(self) -> None:  # noqa: B027 - optional, not abstract
        """Releases the backend's resources. ``AppRun.close()`` calls it for the backends the
        run built itself (from ``TORCHX_TRACKERS``); close backends you built yourself."""


def backend_name(backend: object) -> str:
    """The name of a backend in reports: its ``name`` attribute, else its class name."""
    name = getattr(backend, "name", None)
    return name if isinstance(name, str) and name else type(backend).__name__
