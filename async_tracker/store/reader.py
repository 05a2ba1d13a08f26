"""The read side's one interface: what the run list, ``Store``, every CLI read command and
the dashboard ask of a store, and nothing else.

Modelled on TensorBoard's data provider: a narrow set of coroutines a backend implements
once, natively (the fsspec store: its summaries, its segments read incrementally) or not at
all (a backend that only has the tracker API gets :class:`GenericReader`, built on its
``metrics()``, ``metadata()`` and ``run_ids()``). Readers never add to a run and never touch
a spool (the fsspec store's reader may compact the metric files of a writer no longer live:
the same points, in fewer files).

For backend authors: subclass :class:`RunReader`, implement the abstract coroutines, and
return an instance from your backend's ``reader()`` method (see :class:`ProvidesReader`).
Run the shipped read conformance suite (:mod:`async_tracker.store.conformance`) against it.
The optional coroutines have defaults built on the abstract ones; override them where the
store can answer more cheaply (``list_runs`` from an index, ``scalars`` from the segments
not read yet).

The sync face with a deadline on every call, which users and the CLI hold, is
:class:`async_tracker.store.sync_reader.Reader`.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from async_tracker.adapters import ForeignTracker, ThreadedTracker
from async_tracker.base import AsyncTrackerBase
from async_tracker.records import Lineage, TrackerArtifact, TrackerMetric
from async_tracker.store.runs import select
from async_tracker.store.summary import MetricSummary, RunSummary, stored_ending
from async_tracker.tags import split_metadata

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]

# numpy is imported by the reads that make columns, not with the package: a training job
# that only writes never loads it.


def _empty(dtype: str) -> Any:
    import numpy as np

    return np.empty(0, dtype)


@dataclass(frozen=True)
class Scalars:
    """One metric's points as columns: ``steps`` (int64), ``values`` and ``times`` (float64,
    seconds since the epoch), sorted by step, then time (as ``metrics()`` orders points).
    The arrays are never changed once returned."""

    steps: IntArray = field(default_factory=lambda: _empty("int64"))
    values: FloatArray = field(default_factory=lambda: _empty("float64"))
    times: FloatArray = field(default_factory=lambda: _empty("float64"))

    def __len__(self) -> int:
        return len(self.steps)

    @classmethod
    def of(cls, points: Sequence[TrackerMetric]) -> Scalars:
        """The columns of ``points`` (in step order already, as ``metrics()`` gives them)."""
        import numpy as np

        return cls(
            np.fromiter((p.step for p in points), np.int64, len(points)),
            np.fromiter((p.value for p in points), np.float64, len(points)),
            np.fromiter((p.timestamp for p in points), np.float64, len(points)),
        )

    def points(self) -> list[TrackerMetric]:
        """The points as :class:`~async_tracker.records.TrackerMetric` (name left empty: the
        caller knows it)."""
        return [
            TrackerMetric("", v, s, t)
            for s, v, t in zip(self.steps.tolist(), self.values.tolist(), self.times.tolist())
        ]


@dataclass(frozen=True)
class ScalarsRead:
    """What :meth:`RunReader.scalars` returns: ``curves``, the points read (per metric, in
    step order within this read), ``cursor``, to pass back as ``since=`` to read only what
    comes after, and ``reset``: True when ``curves`` holds every point (the caller replaces
    what it kept), False when it holds only the points new since the cursor (the caller
    adds them to what it kept)."""

    curves: dict[str, Scalars]
    cursor: object
    reset: bool = True


@dataclass(frozen=True)
class RunListing:
    """What :meth:`RunReader.list_runs` returns: the runs whose summary changed since the
    cursor (every run when ``complete``), the ids of runs gone since, and the cursor to
    pass next time."""

    runs: list[RunSummary]
    gone: frozenset[str]
    cursor: object
    complete: bool


@dataclass(frozen=True)
class _SnapshotCursor:
    """The default listing cursor: each run's summary as last listed."""

    seen: Mapping[str, RunSummary]


class RunReader(ABC):
    """A store as readers see it. Every method is a coroutine run on the tracker loop (the
    sync :class:`~async_tracker.store.sync_reader.Reader` puts a deadline on each); none has
    a side effect on a run or a spool. A run unknown to the store: ``run_exists`` is False,
    ``run_summary`` None, and the other per-run reads return empty results."""

    #: What errors name: ``store file:///data/runs``, ``tracker 'mlflow'``.
    label: str = "store"

    # -- the runs ---------------------------------------------------------------------------
    @abstractmethod
    async def run_summaries(self) -> list[RunSummary]:
        """Every run's summary, in no particular order."""

    async def list_runs(self, since: object | None = None) -> RunListing:
        """The runs changed since ``since`` (a cursor from an earlier listing; None: all).
        The default lists every summary and compares with the cursor's; a store with an
        index answers from what was added to it since."""
        runs = await self.run_summaries()
        seen = since.seen if isinstance(since, _SnapshotCursor) else None
        now = {r.run_id: r for r in runs}
        cursor = _SnapshotCursor(now)
        if seen is None:
            return RunListing(runs, frozenset(), cursor, complete=True)
        # Compared NaN-aware: a summary holding a NaN (a param, a last value) read twice is
        # unchanged, though NaN != NaN (and two reads of it are two float objects).
        changed = [
            r for r in runs
            if (old := seen.get(r.run_id)) is None or (old != r and not same_data(old, r))
        ]  # fmt: skip
        return RunListing(changed, frozenset(seen.keys() - now.keys()), cursor, complete=False)

    async def newest_runs(
        self, limit: int, run_ids: Collection[str] | None = None
    ) -> tuple[list[RunSummary], int]:
        """The ``limit`` runs that started last (those of ``run_ids``: all without it), newest
        first (:func:`~async_tracker.store.runs.newest_first`'s order; 0: every run), and
        how many more there are: what a list shows by default. The default sorts every
        summary; a store that keeps each run's start where it lists them (an index) makes
        the summaries of the runs it returns alone."""
        runs = await self.run_summaries()
        if run_ids is not None:
            runs = [r for r in runs if r.run_id in run_ids]
        return select(runs, limit=limit)

    async def run_summary(self, run_id: str) -> RunSummary | None:
        """The summary of ``run_id``, None when the store has no such run."""
        for run in await self.run_summaries():
            if run.run_id == run_id:
                return run
        return None

    @abstractmethod
    async def run_ids(self, parent_run_id: str | None = None) -> list[str]:
        """Every run's id; with ``parent_run_id``, those recorded as its children (torchx's
        ``list jobs --parent-run-id``)."""

    async def run_exists(self, run_id: str) -> bool:
        """Whether the store holds ``run_id``."""
        return run_id in await self.run_ids()

    # -- one run ----------------------------------------------------------------------------
    @abstractmethod
    async def metadata(self, run_id: str) -> Mapping[str, object]:
        """The run's metadata, the last write of each key winning (tags and note included)."""

    @abstractmethod
    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]: ...

    @abstractmethod
    async def lineage(self, run_id: str) -> Lineage: ...

    @abstractmethod
    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        """Every point of every metric of the run, each metric's points ordered by step,
        then as logged; no point merged with another."""

    async def scalars(
        self,
        run_id: str,
        names: Collection[str] | None = None,
        since: object | None = None,
    ) -> ScalarsRead:
        """The run's metrics (those of ``names``; all without it) as columns, each sorted by
    step then time. With ``since``
        (a cursor of an earlier call for this run) a store whose data is append-only returns
        only the points added after it (``reset`` False); the default reads every point."""
        curves = {
            name: Scalars.of(points)
            for name, points in (await self.metrics(run_id)).items()
            if points and (names is None or name in names)
        }
        return ScalarsRead(curves, None, reset=True)

    async def overview(
        self, run_id: str, names: Collection[str] | None = None
    ) -> dict[str, Scalars] | None:
        """A few thousand of the run's points per metric (those of ``names``; all without
        it) that stand for all of them in a chart: at least the extremes of each of 4,096
        buckets of the x range, by step and by time, and each curve's ends (see
        ``store/downsample.py``), sorted like :meth:`scalars`. Only the run's own points,
        none made up. ``None`` where the store keeps no overview of the run (the default;
        a live run): a chart then reads every point. A chart of the whole of a huge
        finished run reads this instead of every point; zooming in reads the points."""
        return None

    @abstractmethod
    async def status(self, run_id: str) -> tuple[str, float | None]:
        """How the run stands: ``running``, ``finished``, ``failed``, ``killed`` or
        ``crashed``, and when it ended (None while running), or ``("", None)`` when the
        store does not record how runs end."""

    async def writers(self, run_id: str) -> dict[str, dict[str, object]]:
        """Each live writer's last heartbeat by writer: ``{"time", "interval_s"}`` and, where
        kept, ``"delivery"`` (lag, spooled, last error). Empty where the store keeps none."""
        return {}


# The backend classes whose lack of a reader was said (see GenericReader.run_summaries).
_TOLD: set[type] = set()


@runtime_checkable
class ProvidesReader(Protocol):
    """A backend with a native reader: ``reader()`` returns it."""

    def reader(self) -> RunReader: ...


@runtime_checkable
class RecordsEndings(Protocol):
    """A backend that keeps how its runs ended: ``run_status(run_id)`` gives the ending
    (``finished``, ``failed``, ``killed``), alone or with the time the run ended as
    ``(status, time)``, and None (or ``("running", None)``) for a run that has not ended.
    :class:`GenericReader` reads a run's status through it."""

    async def run_status(self, run_id: str) -> str | tuple[str, float | None] | None: ...


class GenericReader(RunReader):
    """The reader of a backend without a native one: every run read through the tracker
    API (its metadata and every point), summarised here. Correct for any backend that passes
    the write conformance suite; its run list costs a read of every run, so a backend that
    holds many runs should bring a native reader."""

    def __init__(self, backend: AsyncTrackerBase, label: str | None = None) -> None:
        self.backend = backend
        self.label = label or f"tracker {backend!r}"

    def __repr__(self) -> str:
        return f"GenericReader({self.backend!r})"

    async def run_summaries(self) -> list[RunSummary]:
        backend = _origin(self.backend)
        ours = backend.__module__.startswith("async_tracker.")
        if type(self) is GenericReader and not ours and backend not in _TOLD:
            # Said once per backend class: its author can bring a native reader (the
            # package's own backends without one, MLflow's, list through the server).
            _TOLD.add(backend)
            logger.warning(
                "async_tracker: %s has no reader of its own: listing its runs reads every "
                "point of every run (a backend's reader() method gives a faster one; see "
                "docs/reading.md)", backend.__qualname__,
            )
        return [await self._summary_of(run_id) for run_id in await self.run_ids()]

    async def run_summary(self, run_id: str) -> RunSummary | None:
        if not await self.run_exists(run_id):
            return None
        return await self._summary_of(run_id)

    async def run_ids(self, parent_run_id: str | None = None) -> list[str]:
        if parent_run_id is None:
            return list(await self.backend.run_ids())
        return list(await self.backend.run_ids(parent_run_id=parent_run_id))

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return await self.backend.metadata(run_id)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return await self.backend.artifacts(run_id)

    async def lineage(self, run_id: str) -> Lineage:
        return await self.backend.lineage(run_id)

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        if not self.backend.supports_metrics:
            return {}  # a plain torchx TrackerBase: no metric method
        return await self.backend.metrics(run_id)

    async def status(self, run_id: str) -> tuple[str, float | None]:
        """The ending the backend keeps (see :class:`RecordsEndings`): ``running`` until
        the run has one; ``""`` from a backend that keeps none."""
        if not isinstance(self.backend, RecordsEndings):
            return "", None
        ending = await self.backend.run_status(run_id)
        if isinstance(ending, tuple):
            return ending
        return ending or "running", None

    async def _summary_of(self, run_id: str) -> RunSummary:
        curves = {n: p for n, p in (await self.metrics(run_id)).items() if p}
        status, end = await self.status(run_id)
        metrics = {name: summarize_points(points) for name, points in curves.items()}
        stamps = [p.timestamp for points in curves.values() for p in points]
        metadata = dict(await self.metadata(run_id))
        params, tags, note = split_metadata(metadata)
        return RunSummary(
            run_id=run_id,
            status=status,
            start=min(stamps) if stamps else None,
            end=end,
            heartbeat=max(stamps) if stamps else None,
            params=params,
            tags=tags,
            note=note,
            metrics=metrics,
            ending=stored_ending(metadata, status),
        )


def _origin(backend: object) -> type:
    """The class of the backend itself, seen through the package's adapters (a torchx
    ``TrackerBase`` plug-in runs behind a ``ThreadedTracker``)."""
    while isinstance(backend, (ThreadedTracker, ForeignTracker)):
        backend = backend.tracker
    return type(backend)


def summarize_points(points: Sequence[TrackerMetric]) -> MetricSummary:
    """One metric's summary from its points (in step order): the last value at the highest
    step, min and max ignoring NaN."""
    values = [p.value for p in points if not math.isnan(p.value)]
    return MetricSummary(
        points[-1].value,
        min(values) if values else None,
        max(values) if values else None,
        len(points),
        points[-1].step,
    )


def reader_of(backend: AsyncTrackerBase, label: str | None = None) -> RunReader:
    """The reader of ``backend``: its own (``reader()``), else a :class:`GenericReader`."""
    if isinstance(backend, ProvidesReader):
        reader = backend.reader()
        if label:
            reader.label = label
        return reader
    return GenericReader(backend, label)


def same_data(a: object, b: object) -> bool:
    """``a == b``, with NaN equal to NaN at any depth: in floats, mappings, lists, tuples and
    dataclasses (a :class:`RunSummary`, its :class:`MetricSummary`)."""
    if a is b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_data(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_data, a, b))
    if is_dataclass(a) and not isinstance(a, type) and type(a) is type(b):
        return all(same_data(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return a == b


def merge_points(parts: Iterable[Scalars]) -> Scalars:
    """Several reads' points of one metric as one, sorted by step, then time (stably: points
    alike keep the order of ``parts``, then their own)."""
    import numpy as np

    chunks = [p for p in parts if len(p)]
    if not chunks:
        return Scalars()
    if len(chunks) == 1:
        return chunks[0]
    steps = np.concatenate([c.steps for c in chunks])
    values = np.concatenate([c.values for c in chunks])
    times = np.concatenate([c.times for c in chunks])
    if len(steps) > 1 and not bool(np.all(steps[1:] >= steps[:-1])):
        order = np.lexsort((times, steps))  # stable
        steps, values, times = steps[order], values[order], times[order]
    return Scalars(steps, values, times)


__all__ = [
    "GenericReader", "ProvidesReader", "RecordsEndings", "RunListing", "RunReader", "Scalars",
    "ScalarsRead", "merge_points", "reader_of", "same_data", "summarize_points",
]
