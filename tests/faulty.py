"""Test doubles for fault injection: backends that fail, hang or slow on a schedule.

* :class:`FaultyTracker`: an ``AsyncTrackerBase`` over an :class:`InMemoryTracker` (or any
  async backend) that applies an :class:`Action` to chosen calls of chosen methods (by call
  number, or always), and records every call with its outcome. ``write_batch`` is the base
  class's replay, so faults scheduled on ``add_metadata`` / ``add_artifact`` / ``add_source`` /
  ``add_metrics`` hit the parts of a batch one by one; ``write_batch`` itself can fail too.
  Actions: :class:`Raise` (:func:`transient`, :func:`permanent`), :class:`Hang`,
  :class:`BlockLoop`, :class:`Slow`::

      faulty = FaultyTracker(name="flaky")
      faulty.on("add_metadata", 1, 2, action=transient())   # first two calls fail
      faulty.always("add_artifact", action=Hang())          # every call hangs forever
      faulty.wait_for("write_batch", 3)                     # blocks until 3 calls were made

* :class:`DictTracker`: a plain, blocking ``TrackerBase`` that keeps runs in a dict;
  :class:`MetricDictTracker` adds the optional ``add_metrics`` / ``metrics`` methods.
* :class:`HangingTracker`: a ``DictTracker`` whose chosen methods block the worker thread that
  runs them, until a ``threading.Event`` is set or forever.
* :class:`FileTracker`: an ``AsyncTrackerBase`` that appends every write to a JSON Lines file
  (with the writing process's pid), for tests whose process dies (SIGTERM, fork, exit).

Synchronise on the events these doubles expose (``Hang.entered``, :meth:`FaultyTracker.wait_for`,
``HangingTracker.entered``), never on sleeps.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from async_tracker import (
    AsyncTrackerBase,
    Batch,
    Lineage,
    PermanentBackendError,
    RecordError,
    TrackerArtifact,
    TrackerBase,
    TrackerMetric,
    TrackerSource,
)
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.base import CloseReason
from async_tracker.records import sort_points

# ---------------------------------------------------------------------------------------------
# Actions


@dataclass
class Call:
    """One call of a backend method, as the backend saw it."""

    method: str
    number: int  # 1-based, per method
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outcome: str = "running"  # "ok", "raised <Type>", "hung", "cancelled"


class Action:
    """What to do to a call before (or instead of) delegating it."""

    async def apply(self, call: Call) -> None:
        raise NotImplementedError


@dataclass
class Raise(Action):
    """Raises ``make()`` instead of delegating."""

    make: Callable[[], BaseException]

    async def apply(self, call: Call) -> None:
        raise self.make()


def transient(message: str = "injected transient failure") -> Raise:
    """A failure the lanes retry (``ConnectionError``)."""
    return Raise(lambda: ConnectionError(message))


def permanent(message: str = "injected permanent failure") -> Raise:
    """A refusal of the records for good: the lane splits the batch and drops those alone."""
    return Raise(lambda: RecordError(message))


def backend_down(message: str = "injected failure of the backend") -> Raise:
    """A failure of the backend itself (permissions, disk full): records kept, retried later."""
    return Raise(lambda: PermanentBackendError(message))


@dataclass
class RefuseIf(Action):
    """Raises :class:`RecordError` when the call carries an item ``bad`` picks: a metric point
    (``add_metrics``), a metadata value (``add_metadata``) or an artifact path
    (``add_artifact``). A backend that cannot store one value, and stores the rest."""

    bad: Callable[[object], bool]

    async def apply(self, call: Call) -> None:
        if call.method == "add_metrics":
            items: list[object] = list(call.args[1])
        elif call.method == "add_metadata":
            items = list(call.kwargs.values())
        elif call.method == "add_artifact":
            items = [call.args[2]]
        else:
            items = []
        if any(self.bad(x) for x in items):
            raise RecordError(f"{call.method}: value refused")


@dataclass
class Hang(Action):
    """Blocks the call until ``release`` is set (then delegates), or forever when it is None.

    ``entered`` is set each time a call starts hanging: wait on it to know the backend is stuck.
    The wait is cancellable (a close() deadline abandons it).
    """

    release: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)

    async def apply(self, call: Call) -> None:
        call.outcome = "hung"
        self.entered.set()
        if self.release is None:
            await anyio.sleep_forever()
        elif not self.release.is_set():
            await anyio.to_thread.run_sync(self.release.wait, abandon_on_cancel=True)
        call.outcome = "running"


@dataclass
class BlockLoop(Action):
    """Blocks the thread the call runs on (the tracker loop itself) until ``release`` is set:
    an async backend that calls a blocking library by mistake. Always set ``release`` at the
    end of the test: the loop is shared by the whole process."""

    release: threading.Event
    entered: threading.Event = field(default_factory=threading.Event)

    async def apply(self, call: Call) -> None:
        self.entered.set()
        self.release.wait()


@dataclass
class Slow(Action):
    """Delays the call by ``seconds`` (injected latency, not synchronisation)."""

    seconds: float

    async def apply(self, call: Call) -> None:
        await anyio.sleep(self.seconds)


# ---------------------------------------------------------------------------------------------
# FaultyTracker


_Rule = tuple[str, Callable[[int], bool], Action]


class FaultyTracker(AsyncTrackerBase):
    """An async backend that misbehaves on a schedule and records every call."""

    def __init__(self, inner: AsyncTrackerBase | None = None, *, name: str | None = None) -> None:
        self.inner = inner if inner is not None else InMemoryTracker()
        self.name = name
        self.calls: list[Call] = []
        self._rules: list[_Rule] = []
        self._counts: dict[str, int] = {}
        self._cond = threading.Condition()
        self.closed = False

    # -- the schedule ------------------------------------------------------------------------
    def on(self, method: str, *numbers: int, action: Action) -> FaultyTracker:
        """Applies ``action`` to the given (1-based) calls of ``method``."""
        wanted = frozenset(numbers)
        self._rules.append((method, wanted.__contains__, action))
        return self

    def always(self, method: str, action: Action) -> FaultyTracker:
        """Applies ``action`` to every later call of ``method``."""
        self._rules.append((method, lambda _n: True, action))
        return self

    def when(self, method: str, predicate: Callable[[int], bool], action: Action) -> FaultyTracker:
        self._rules.append((method, predicate, action))
        return self

    def heal(self) -> None:
        """Drops every scheduled fault: later calls behave."""
        self._rules.clear()

    # -- what happened -----------------------------------------------------------------------
    def calls_to(self, method: str, outcome: str | None = None) -> list[Call]:
        with self._cond:
            return [
                c
                for c in self.calls
                if c.method == method and (outcome is None or c.outcome == outcome)
            ]

    def count(self, method: str, outcome: str | None = None) -> int:
        return len(self.calls_to(method, outcome))

    def wait_for(
        self, method: str, n: int, outcome: str | None = None, timeout: float = 10.0
    ) -> bool:
        """Blocks until ``method`` was called ``n`` times (with ``outcome``, if given)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count(method, outcome) >= n, timeout)

    def _count(self, method: str, outcome: str | None) -> int:
        return sum(
            1
            for c in self.calls
            if c.method == method and (outcome is None or c.outcome == outcome)
        )

    # -- plumbing ----------------------------------------------------------------------------
    async def _invoke(self, method: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._cond:
            number = self._counts.get(method, 0) + 1
            self._counts[method] = number
            call = Call(method, number, args, kwargs)
            self.calls.append(call)
            self._cond.notify_all()  # wait_for(n) counts calls that started, hung or not
            action = next((a for m, p, a in self._rules if m == method and p(number)), None)
        try:
            if action is not None:
                await action.apply(call)
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            # Cancellation (a close() deadline) is a BaseException: record it as well.
            outcome = "cancelled" if isinstance(exc, anyio.get_cancelled_exc_class()) else (
                f"raised {type(exc).__name__}"
            )
            self._settle(call, outcome)
            raise
        self._settle(call, "ok")
        return result

    def _settle(self, call: Call, outcome: str) -> None:
        with self._cond:
            call.outcome = outcome
            self._cond.notify_all()

    # -- the backend interface ---------------------------------------------------------------
    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        await self._invoke("add_artifact", self.inner.add_artifact, run_id, name, path, metadata)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return await self._invoke("artifacts", self.inner.artifacts, run_id)  # type: ignore[no-any-return]

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self._invoke("add_metadata", self.inner.add_metadata, run_id, **kwargs)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return await self._invoke("metadata", self.inner.metadata, run_id)  # type: ignore[no-any-return]

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        await self._invoke("add_source", self.inner.add_source, run_id, source_id, artifact_name)

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        return await self._invoke("sources", self.inner.sources, run_id, artifact_name)  # type: ignore[no-any-return]

    async def lineage(self, run_id: str) -> Lineage:
        return await self._invoke("lineage", self.inner.lineage, run_id)  # type: ignore[no-any-return]

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        return await self._invoke("run_ids", self.inner.run_ids, **kwargs)  # type: ignore[no-any-return]

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self._invoke("add_metrics", self.inner.add_metrics, run_id, list(metrics))

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return await self._invoke("metrics", self.inner.metrics, run_id)  # type: ignore[no-any-return]

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        await self._invoke("end_run", self.inner.end_run, run_id, reason)

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        # The base class's replay, so that faults on the single-record methods hit the parts.
        await self._invoke("write_batch", super().write_batch, run_id, batch)

    async def aclose(self, reason: CloseReason = "finished") -> None:
        await self._invoke("aclose", self.inner.aclose, reason)
        self.closed = True

    def __repr__(self) -> str:
        return f"FaultyTracker({self.name or ''}, calls={len(self.calls)})"


# ---------------------------------------------------------------------------------------------
# Blocking TrackerBase doubles


class DictTracker(TrackerBase):
    """A plain, blocking torchx ``TrackerBase`` keeping runs in dicts (thread-safe)."""

    def __init__(self, name: str | None = None) -> None:
        if name is not None:
            self.name = name
        self.lock = threading.Lock()
        self.md: dict[str, dict[str, object]] = {}
        self.arts: dict[str, dict[str, TrackerArtifact]] = {}
        self.srcs: dict[str, list[TrackerSource]] = {}
        self.closed = False

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        with self.lock:
            self.md.setdefault(run_id, {})
            self.arts.setdefault(run_id, {})[name] = TrackerArtifact(
                name, path, None if metadata is None else dict(metadata)
            )

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        with self.lock:
            return dict(self.arts.get(run_id, {}))

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        with self.lock:
            self.md.setdefault(run_id, {}).update(kwargs)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        with self.lock:
            return dict(self.md.get(run_id, {}))

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        with self.lock:
            self.md.setdefault(run_id, {})
            srcs = self.srcs.setdefault(run_id, [])
            src = TrackerSource(source_id, artifact_name)
            if src not in srcs:
                srcs.append(src)

    def sources(self, run_id: str, artifact_name: str | None = None) -> Iterable[TrackerSource]:
        with self.lock:
            return [
                s
                for s in self.srcs.get(run_id, [])
                if artifact_name is None or s.artifact_name == artifact_name
            ]

    def lineage(self, run_id: str) -> Lineage:
        parents = list(self.sources(run_id))
        with self.lock:
            descendants = [
                TrackerSource(child, s.artifact_name)
                for child, srcs in self.srcs.items()
                for s in srcs
                if s.source_run_id == run_id
            ]
        return Lineage(run_id, parents, descendants)

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        parent = kwargs.get("parent_run_id")
        with self.lock:
            ids = set(self.md) | set(self.srcs) | set(self.arts)
            if parent is None:
                return sorted(ids)
            return sorted(
                r for r in ids if any(s.source_run_id == parent for s in self.srcs.get(r, []))
            )

    def close(self) -> None:
        self.closed = True


class MetricDictTracker(DictTracker):
    """A ``DictTracker`` that also has the optional metric methods a ``TrackerBase`` may offer."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        # Keyed by content, as a store without batch identities (MLflow's) keeps points: a
        # replay is read once; points that differ in value alone are all kept.
        self.points: dict[str, dict[str, dict[tuple[int, float, str], TrackerMetric]]] = {}

    def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        with self.lock:
            self.md.setdefault(run_id, {})
            store = self.points.setdefault(run_id, {})
            for m in metrics:
                store.setdefault(m.name, {})[(m.step, m.timestamp, repr(m.value))] = m

    def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        with self.lock:
            store = self.points.get(run_id, {})
            return {n: sort_points(list(p.values())) for n, p in store.items()}


class HangingTracker(DictTracker):
    """A ``DictTracker`` whose methods in ``hang_on`` block their thread: until ``release`` is
    set, or forever when it is None. ``entered`` is set when a call starts blocking."""

    def __init__(
        self,
        hang_on: Iterable[str] = ("add_metadata", "add_artifact", "add_source"),
        release: threading.Event | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.hang_on = set(hang_on)
        self.release = release
        self.entered = threading.Event()
        self.hung_calls = 0

    def _maybe_hang(self, method: str) -> None:
        if method not in self.hang_on:
            return
        with self.lock:
            self.hung_calls += 1
        self.entered.set()
        (self.release or threading.Event()).wait()

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        self._maybe_hang("add_artifact")
        super().add_artifact(run_id, name, path, metadata)

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._maybe_hang("add_metadata")
        super().add_metadata(run_id, **kwargs)

    def add_source(self, run_id: str, source_id: str, artifact_name: str | None = None) -> None:
        self._maybe_hang("add_source")
        super().add_source(run_id, source_id, artifact_name)

    def close(self) -> None:
        self._maybe_hang("close")
        super().close()


# ---------------------------------------------------------------------------------------------
# FileTracker


class FileTracker(AsyncTrackerBase):
    """Appends each write as one JSON line to ``path`` (opened, written and closed per write,
    so what a dying process wrote is on disk). Each line carries the writer's pid.

    Reads replay the file: metadata merged in order, last artifact of a name wins, sources
    once, metric points keyed by content (step, timestamp, value).
    """

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name

    def _append(self, op: str, run_id: str, **payload: Any) -> None:
        line = json.dumps({"pid": os.getpid(), "op": op, "run_id": run_id, **payload})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def lines(self) -> list[dict[str, Any]]:
        """Every line written so far, in order."""
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def _of(self, run_id: str, op: str) -> list[dict[str, Any]]:
        return [x for x in self.lines() if x["run_id"] == run_id and x["op"] == op]

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        meta = None if metadata is None else dict(metadata)
        self._append("artifact", run_id, name=name, path=path, metadata=meta)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        out: dict[str, TrackerArtifact] = {}
        for x in self._of(run_id, "artifact"):
            out[x["name"]] = TrackerArtifact(x["name"], x["path"], x["metadata"])
        return out

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._append("metadata", run_id, metadata=kwargs)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        out: dict[str, object] = {}
        for x in self._of(run_id, "metadata"):
            out.update(x["metadata"])
        return out

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        self._append("source", run_id, source=source_id, artifact_name=artifact_name)

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        out: list[TrackerSource] = []
        for x in self._of(run_id, "source"):
            src = TrackerSource(x["source"], x["artifact_name"])
            if src not in out and (artifact_name is None or src.artifact_name == artifact_name):
                out.append(src)
        return out

    async def lineage(self, run_id: str) -> Lineage:
        parents = list(await self.sources(run_id))
        descendants: list[TrackerSource] = []
        for x in self.lines():
            if x["op"] == "source" and x["source"] == run_id:
                src = TrackerSource(x["run_id"], x["artifact_name"])
                if src not in descendants:
                    descendants.append(src)
        return Lineage(run_id, parents, descendants)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        parent = kwargs.get("parent_run_id")
        ids: list[str] = []
        for x in self.lines():
            rid = x["run_id"]
            if rid in ids:
                continue
            if parent is None or (x["op"] == "source" and x["source"] == parent):
                ids.append(rid)
        return ids

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        self._append("metrics", run_id, points=[list(m) for m in metrics])

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        store: dict[str, dict[tuple[int, float, str], TrackerMetric]] = {}
        for x in self._of(run_id, "metrics"):
            for name, value, step, ts in x["points"]:
                point = TrackerMetric(name, value, step, ts)
                store.setdefault(name, {})[(step, ts, repr(value))] = point
        return {n: sort_points(list(p.values())) for n, p in store.items()}
