"""The two backend interfaces: torchx's ``TrackerBase`` and its async twin.

``TrackerBase`` keeps exactly torchx's eight abstract methods and signatures, so that existing
backends plug in unchanged. ``AsyncTrackerBase`` has the same eight as coroutines, plus
metrics, a bulk ``write_batch`` and ``aclose``. ``AppRun`` talks to every backend through the
async interface: plain ``TrackerBase`` objects are wrapped by
:func:`async_tracker.adapters.as_async`.

Reads see this process's writes. The reads a subclass of either class defines (``metadata``,
``artifacts``, ``sources``, ``metrics``, ``lineage``, ``run_ids``) are wrapped when the class is
made: before reading, the wrapper asks the read hook to let the pending records of the runs
this process writes to that store reach it (see :mod:`async_tracker.own_writes`, which
installs the hook: this module, below the runtime, cannot call it).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

from async_tracker.records import (
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
)
from async_tracker.records import (
    CloseReason as CloseReason,  # re-exported: the backends' name for it
)

Checked: TypeAlias = "TrackerMetric | Mapping[str, object] | TrackerArtifact | TrackerSource"
"""What :meth:`AsyncTrackerBase.validate` is given: a metric point, the metadata of one
``add_metadata`` call, an artifact or a source."""

T = TypeVar("T")

# -- reads see this process's writes -----------------------------------------------------------
# The reads of one run (its run id first): they wait for the writers of that run id. lineage
# and run_ids wait for every writer of the store: lineage's descendants are other runs, and
# run_ids lists them all.
RUN_READS = frozenset({"metadata", "artifacts", "sources", "metrics"})
STORE_READS = frozenset({"lineage", "run_ids"})


class ReadHook(Protocol):
    """What a backend's read calls first (:mod:`async_tracker.own_writes` implements it):
    delivers the pending records this process wrote to ``backend``'s store (of ``run_id``;
    None: of every run), within a deadline, and returns, whatever is left pending."""

    def before_read(self, backend: object, run_id: str | None) -> None: ...

    async def abefore_read(self, backend: object, run_id: str | None) -> None: ...


_read_hook: ReadHook | None = None
# True while a wrapped read runs in this context (a thread, or a task): the reads it makes in
# turn (an adapter's read calling the plug-in's, lineage built from sources) have been waited
# for already.
_in_read: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "async_tracker_in_read", default=False
)


def install_read_hook(hook: ReadHook) -> None:
    """Sets what every wrapped read calls first (once, by :mod:`async_tracker.own_writes`)."""
    global _read_hook
    _read_hook = hook


def _run_id_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The run a read is about: its first argument, for the reads of one run; None (every
    run) for the others, or when the call gives none (it then fails in the read itself)."""
    if name not in RUN_READS:
        return None
    run_id = args[0] if args else kwargs.get("run_id")
    return run_id if isinstance(run_id, str) else None


def _sync_read(name: str, read: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(read)
    def reads_own_writes(self: object, *args: Any, **kwargs: Any) -> T:
        hook = _read_hook
        if hook is None or _in_read.get():
            return read(self, *args, **kwargs)
        hook.before_read(self, _run_id_of(name, args, kwargs))
        token = _in_read.set(True)
        try:
            return read(self, *args, **kwargs)
        finally:
            _in_read.reset(token)

    reads_own_writes.__reads_own_writes__ = True  # type: ignore[attr-defined]
    return reads_own_writes


def _async_read(name: str, read: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(read)
    async def reads_own_writes(self: object, *args: Any, **kwargs: Any) -> T:
        hook = _read_hook
        if hook is None or _in_read.get():
            return await read(self, *args, **kwargs)
        await hook.abefore_read(self, _run_id_of(name, args, kwargs))
        token = _in_read.set(True)
        try:
            return await read(self, *args, **kwargs)
        finally:
            _in_read.reset(token)

    reads_own_writes.__reads_own_writes__ = True  # type: ignore[attr-defined]
    return reads_own_writes


def _wrap_reads(cls: type) -> None:
    """Wraps the reads ``cls`` defines itself (inherited ones are wrapped where defined)."""
    for name in RUN_READS | STORE_READS:
        read = cls.__dict__.get(name)
        if not inspect.isfunction(read) or getattr(read, "__reads_own_writes__", False):
            continue
        if inspect.iscoroutinefunction(read):
            setattr(cls, name, _async_read(name, read))
        else:
            setattr(cls, name, _sync_read(name, read))


class TrackerBase(ABC):
    """A blocking tracker backend: torchx's interface, unchanged.

    A subclass's reads first let this process's pending writes to it arrive (see the
    module's docstring), so ``tracker.metadata(run_id)`` right after ``run.add_metadata(...)``
    through an ``AppRun`` on ``tracker`` returns that write.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _wrap_reads(cls)

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
    Override ``write_batch`` to store a whole flush in bulk. The rest of the contract, all
    optional:

    * ``validate(record)``: refuse at the call site what this backend cannot store.
    * ``map_error(exc)``: map this backend's libraries' errors to the tree of
      :mod:`async_tracker.errors`, which decides retry, keep or drop.
    * ``end_run(run_id, reason)``: store how the run ended. Every ``AppRun`` seals its end
      record at close, after everything it accepted; it reaches the backend in the last
      batch, and ``write_batch`` (the default, and the package's backends) stores it with
      ``end_run``, last. A backend that is down gets it later, from the spool, like any
      record.
    * ``heartbeat(run_id, interval_s)``: a live run says it is alive, every ``interval_s``
      (readers show a run that stopped saying so without ending as crashed). One that also
      takes ``delivery=`` gets the lane's delivery state to store with it.
    * ``aclose(reason)``: release the backend (called for the backends a run built itself).
    * ``delete_run(run_id)``: delete a run (``async-tracker rm``); the default cannot.

    ``name`` names the backend in reports, ``status()`` and spool keys (default: class name).
    ``store_url``: where the backend stores runs as a URL that ``async-tracker sync --to``
    takes (the fsspec backend's root), or None: the exit summary names it in its command.
    ``store_id`` names the store it writes to (``file:///data/runs``): the parts of a batch
    marked done in one store are written again when the batch is replayed into another
    (``async-tracker sync --to``). None: unknown, and marks are kept. Reads use it too: a
    read waits for this process's writes to any backend object with the same ``store_id``
    (without one, to this very object).

    The reads a subclass defines, awaited off the tracker loop, first let this process's
    pending writes to the store arrive (see the module's docstring). On the tracker loop
    (backend code, the package's readers) they read at once: a delivery may be the very
    caller, and ``AppRun``'s reads wait for the writes before they read.
    """

    name: str | None = None
    store_url: str | None = None
    store_id: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Awaited off the tracker loop, a subclass's reads first let this process's pending
        # writes to it arrive (see the module's docstring).
        _wrap_reads(cls)

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
        that a retry after a failure half-way never writes a part twice. The run's end record
        (``batch.end``), if the batch holds it, is stored last, with :meth:`end_run`.
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
        if "metrics" not in batch.done and batch.points() and self.supports_metrics:
            await self.add_metrics(run_id, batch.metrics)
            batch.done.add("metrics")
        if batch.end is not None and END_PART not in batch.done:
            await self.end_run(run_id, batch.end)
            batch.done.add(END_PART)

    def validate(self, record: Checked) -> None:  # noqa: B027 - optional, not abstract
        """Raises ``TypeError`` or ``ValueError`` naming the key when this backend cannot
        store ``record`` (a key over its length limit, a value too large).

        Called on the caller's thread before anything of the call is kept, after the generic
        checks (names are non-empty strings, values JSON data, metric values floats, steps
        ints). For metrics it is called with the first point of each name only: later points
        differ in value and step alone, which the generic checks cover. Keep it fast, with no
        I/O: it runs inside the training loop's writes.
        """

    def map_error(self, exc: BaseException) -> BaseException:
        """The error a lane should see for ``exc``, raised by this backend or its libraries:
        a :class:`~async_tracker.errors.TransientBackendError` (retry with backoff), a
        :class:`~async_tracker.errors.BackendUnavailableError` (keep the records, retry after
        a cooldown) or a :class:`~async_tracker.errors.RecordError` (drop only the refused
        records). The lane calls it once per failure, at its edge, then
        :func:`~async_tracker.errors.classify`.

        An override maps through the shared table
        (:func:`async_tracker.backend.errors.map_failure` with
        :data:`~async_tracker.error_table.SHARED_TABLE`, extended with the backend's own rows)
        and returns an error that already is a
        :class:`~async_tracker.errors.BackendError` (mapped where the backend knew what
        failed) as it is. The default keeps ``exc``: :func:`~async_tracker.errors.classify`
        looks it up in the shared table, and anything unknown keeps the records."""
        return exc

    async def end_run(self, run_id: str, reason: CloseReason) -> None:  # noqa: B027
        """Stores that ``run_id`` ended with ``reason`` (an MLflow run is ended with the
        matching status). ``write_batch`` calls it for the run's end record, after every
        record the run accepted: at close, or later from the spool."""

    async def heartbeat(self, run_id: str, interval_s: float) -> None:  # noqa: B027
        """Stores that ``run_id`` is alive now and says so every ``interval_s`` seconds.
        Optional: a lane calls it off the delivery path, bounded, and ignores its failures;
        readers show a run that never ended and whose heartbeats stopped as crashed."""

    async def delete_run(self, run_id: str) -> bool:
        """Deletes everything this backend stores of ``run_id``; True once it is gone (a run
        it did not hold included), False if this backend cannot delete runs (the default:
        ``async-tracker rm`` then says so). Raises a
        :class:`~async_tracker.errors.BackendError` when the deletion failed. A process still
        writing the run may write it again afterwards."""
        return False

    async def aclose(self, reason: CloseReason = "finished") -> None:  # noqa: B027
        """Releases the backend's resources; ``reason`` says how the job ended. ``AppRun``
        calls it for the backends the run built itself (from ``TORCHX_TRACKERS``), after
        ``end_run``; close backends you built yourself."""


# The done mark of a batch's end record (see AsyncTrackerBase.write_batch).
END_PART = "end"


def has_heartbeat(backend: AsyncTrackerBase) -> bool:
    """Whether ``backend`` implements :meth:`AsyncTrackerBase.heartbeat`."""
    return type(backend).heartbeat is not AsyncTrackerBase.heartbeat


def takes_delivery(backend: AsyncTrackerBase) -> bool:
    """Whether ``backend``'s heartbeat takes a ``delivery`` keyword: the lane's state (lag,
    spooled, last error...), which it then stores for readers (the fsspec store does)."""
    try:
        return "delivery" in inspect.signature(backend.heartbeat).parameters
    except (TypeError, ValueError):  # no signature to read (a C callable)
        return False


def backend_name(backend: object) -> str:
    """The name of a backend in reports: its ``name`` attribute, else its class name."""
    name = getattr(backend, "name", None)
    return name if isinstance(name, str) and name else type(backend).__name__
