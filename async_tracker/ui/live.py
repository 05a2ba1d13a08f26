"""What the dashboard has read of a store, and what changed since a client last asked.

One :class:`LiveStore` per server owns every cache; the endpoints only ask it. It reads:

* **The run list**, at most once per ``refresh_s`` however many clients poll (0.5 s; 5 s for
  a backend read through the generic reader, whose list reads every run; while nothing
  changes, less and less often, up to every ``QUIET_REFRESH_S``), through the
  store's reader (:mod:`async_tracker.store.reader`): what changed since the listing's
  cursor. Each run keeps the *version* at which its summary last changed; a client sends
  the version it has (its cursor) and gets back only the runs changed after it.
* **Metric points**, per run, when a chart asks for them and the run's summary says it has
  more points than were read: the reader's ``scalars`` since the run's cursor (on the
  fsspec store only the segments not read yet), appended to numpy arrays that stay in
  memory; a reader that cannot tell what is new reads the run whole again.

Concurrency: endpoints run in worker threads (the reads block on the tracker loop). The
index has one lock, the metric cache another, and each run's points their own, so that a
long first read of a huge metric stalls neither the run list that other clients poll nor
the charts of other runs. As the server starts, :meth:`LiveStore.preload` reads the newest
runs' points in the background, so that the first charts usually come from memory.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from async_tracker.store.expr import differing_params
from async_tracker.store.reader import GenericReader, Scalars
from async_tracker.store.runs import select
from async_tracker.store.summary import RunSummary
from async_tracker.store.sync_reader import Reader
from async_tracker.tags import split_metadata

# How often the run list is read again at most, in seconds: clients poll every second, and
# a point logged shows within this plus a poll.
DEFAULT_REFRESH_S = 0.5
# The same for a backend that keeps no run summaries (TensorBoard, MLflow, a plug-in): its
# list is every run read through the tracker API, points included, so it is read less often.
SLOW_REFRESH_S = 5.0
# A store where nothing changes is read less and less often, up to this (an idle dashboard
# over 20,000 runs then costs a fraction of a percent of a core); a change brings it back to
# refresh_s at once.
QUIET_REFRESH_S = 2.0
# The points kept in memory, all runs together (about 34 bytes each: step and value, and the
# time as text until charted by time; about 1.7 GB): past it, the runs least recently
# charted are dropped (read again if asked for again).
MAX_CACHED_POINTS = 50_000_000
# A chart of the whole of an ended run of at least this many points (all metrics) is drawn
# from the store's overview of it, where there is one, until its points are read (by a zoom):
# reading ten million points takes about half a second, cold, its overview milliseconds.
OVERVIEW_POINTS = 1_000_000
# The points read ahead as the server starts (newest runs first): about 0.7 GB at most, and
# a ten-million-point run among them.
PRELOAD_POINTS = 20_000_000

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# x of a chart: steps (int64) or times (float64).
XArray = npt.NDArray[np.int64] | npt.NDArray[np.float64]


class UnknownRunError(KeyError):
    """No run of that id in the store (the endpoints answer 404)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Curve:
    """Every point of one metric of one run read so far: steps (int64), values and times
    (float64) as numpy arrays in step order (then time), as the reader gave them. New chunks
    are appended and joined when next read. Its run's lock guards it; the arrays it returns
    are never changed afterwards (a join makes new ones), so they are read without a lock."""

    steps: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    values: FloatArray = field(default_factory=lambda: np.empty(0))
    times: FloatArray = field(default_factory=lambda: np.empty(0))
    _chunks: list[Scalars] = field(default_factory=list)
    _by_time: npt.NDArray[np.intp] | None = None

    def add(self, chunk: Scalars) -> None:
        if len(chunk):
            self._chunks.append(chunk)

    def by_step(self) -> tuple[IntArray, FloatArray]:
        """``(steps, values)``, sorted by step, then time."""
        if self._chunks:
            chunks, self._chunks = self._chunks, []
            in_order = len(self.steps) == 0 or chunks[0].steps.min() >= self.steps[-1]
            # Joined without a copy where there is nothing to join (a run's first read is
            # one chunk per metric): a ten-million-point curve held once, not twice.
            self.steps = _joined([self.steps, *(c.steps for c in chunks)])
            self.values = _joined([self.values, *(c.values for c in chunks)])
            self.times = _joined([self.times, *(c.times for c in chunks)])
            del chunks
            # (Not np.diff: it makes a float array as long as the curve.)
            in_order = in_order and bool(np.all(self.steps[1:] >= self.steps[:-1]))
            if not in_order:  # a late writer (another rank): sort again, by step then time
                order = np.lexsort((self.times, self.steps))
                self.steps, self.values = self.steps[order], self.values[order]
                self.times = self.times[order]
            self._by_time = None
        return self.steps, self.values

    def by_time(self) -> tuple[FloatArray, FloatArray]:
        """``(times, values)`` sorted by time, without points whose time is not a number."""
        _, values = self.by_step()
        times = self.times
        # (A NaN fails every comparison: a curve holding one is never taken as in order.)
        in_order = bool(np.all(times[1:] >= times[:-1])) and not (
            len(times) == 1 and np.isnan(times[0])
        )
        if not in_order:
            # Out of time order (or a time that is not a number): sorted once, and the order
            # kept. Most curves come in time order already (one writer, logged in step
            # order): no index, no copy, for them.
            if self._by_time is None:
                order = np.argsort(times, kind="stable")
                self._by_time = order[~np.isnan(times[order])]
            return times[self._by_time], values[self._by_time]
        return times, values

    def __len__(self) -> int:
        return len(self.steps) + sum(len(c) for c in self._chunks)


def _joined(parts: list[Any]) -> Any:
    """``parts`` (arrays of one type) as one array; the one part that is not empty as it
    is."""
    full = [p for p in parts if len(p)]
    if len(full) == 1:
        return full[0]
    return np.concatenate(full) if full else parts[0]


@dataclass
class _RunPoints:
    """The points read of one run, and how far: the reader's cursor and the run's summary
    point count at the last read. ``lock`` guards all of it: one thread reads a
    run's points at a time, while other runs are read beside it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    curves: dict[str, Curve] = field(default_factory=dict)
    # The reader's cursor after the last read (what the next read starts after).
    cursor: object | None = None
    seen_count: int = -1
    # The points held, as of the last read: what eviction counts (read without the lock).
    held: int = 0
    # The run's overview (see LiveStore.series), read when its summary counted view_count
    # points (None: the store has none). Its own lock, not ``lock``: a chart of the whole
    # run is answered from it while another thread reads every point under ``lock``.
    view_lock: threading.Lock = field(default_factory=threading.Lock)
    view: dict[str, Curve] | None = None
    view_count: int = -1


@dataclass(frozen=True)
class Changes:
    """What :meth:`LiveStore.changes` returns: the version now, the runs that changed after
    the client's cursor (all of them for cursor 0), whether the filter accepts them or not,
    the ids of every run the filter accepts in order, and the params that differ between
    them."""

    version: int
    runs: list[RunSummary]
    ids: list[str]
    differ: list[str]
    total: int


class LiveStore:
    """The dashboard's reader of one store (see the module's docstring)."""

    def __init__(
        self,
        reader: Reader,
        *,
        refresh_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_points: int = MAX_CACHED_POINTS,
    ) -> None:
        self.reader = reader
        self.label = reader.label
        self._clock = clock
        if refresh_s is None:
            generic = isinstance(reader.reader, GenericReader)
            refresh_s = SLOW_REFRESH_S if generic else DEFAULT_REFRESH_S
        self.refresh_s = refresh_s
        self._index_lock = threading.Lock()
        self._points_lock = threading.Lock()
        # Guarded by _index_lock: the runs as last read, each with the version at which its
        # summary last changed; the version grows by one per read that changed anything.
        self._runs: dict[str, tuple[RunSummary, int]] = {}
        self._version = 0
        self._cursor: object | None = None  # the reader's, after the last listing
        self._read_at: float | None = None
        # Reads in a row that found nothing changed: each doubles the wait before the next,
        # up to QUIET_REFRESH_S (never below refresh_s).
        self._quiet = 0
        # Guarded by _points_lock: the points read of each run, least recently asked first.
        self._points: collections.OrderedDict[str, _RunPoints] = collections.OrderedDict()
        self.max_points = max_points
        self.reads = 0  # run-list reads of the store, for tests and the benchmark
        # This server's mark in the run list's ETags (see app._runs): versions count from 0
        # again in another server.
        self.instance = secrets.token_hex(4)

    # -- the run list ---------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> int:
        """Reads the run list if it was last read over ``refresh_s`` ago (or ``force``);
        the version now. Store errors (``OSError``, ``BackendError``) propagate."""
        with self._index_lock:
            now = self._clock()
            wait = max(self.refresh_s, min(QUIET_REFRESH_S, self.refresh_s * 2**self._quiet))
            if not force and self._read_at is not None and now - self._read_at < wait:
                return self._version
            listing = self.reader.list_runs(self._cursor)
            self.reads += 1
            self._read_at = now
            self._cursor = listing.cursor
            runs = listing.runs
            changed = [r for r in runs if r.run_id not in self._runs
                       or self._runs[r.run_id][0] != r]  # fmt: skip
            gone: set[str] = (
                self._runs.keys() - {r.run_id for r in runs}
                if listing.complete
                else set(listing.gone & self._runs.keys())
            )
            self._quiet = 0 if changed or gone else min(self._quiet + 1, 8)
            if changed or gone:
                self._version += 1
                for r in changed:
                    self._runs[r.run_id] = (r, self._version)
                for run_id in gone:
                    del self._runs[run_id]
            version = self._version
        if gone:
            self.forget(gone)  # after the index lock: the two locks are never nested
        return version

    def changes(
        self,
        cursor: int = 0,
        filter: str | None = None,
        sort: str | None = None,
        search: str = "",
    ) -> Changes:
        """The runs changed after ``cursor``, and the ids of those ``filter`` and ``search``
        (text in the id, a param value, a tag or the note, ignoring case) accept, in
        ``sort``'s order. A bad filter raises
        :class:`~async_tracker.store.expr.FilterError`."""
        self.refresh()
        with self._index_lock:
            version = self._version
            entries = dict(self._runs)
        summaries = [r for r, _ in entries.values()]
        shown, _ = select(summaries, filter or None, sort or None, None)
        if search:
            needle = search.lower()
            shown = [r for r in shown if needle in _search_text(r)]
        return Changes(
            version=version,
            # Every run changed, shown or not: the page keeps them, so that a new filter
            # needs no run sent again (only its ids).
            runs=[r for r, v in entries.values() if v > cursor],
            ids=[r.run_id for r in shown],
            differ=differing_params(shown) if len(shown) > 1 else [],
            total=len(summaries),
        )

    def summary(self, run_id: str) -> RunSummary:
        """The run's summary as last read; :class:`UnknownRunError` if there is none."""
        self.refresh()
        with self._index_lock:
            entry = self._runs.get(run_id)
        if entry is None:
            raise UnknownRunError(f"no run {run_id!r} in the {self.label}")
        return entry[0]

    # -- one run --------------------------------------------------------------------------------
    def detail(self, run_id: str) -> dict[str, Any]:
        """What the run page shows: the summary's fields, the full metadata (params, tags,
        note), artifacts, lineage, and each live writer's heartbeat with its delivery
        state (where the backend keeps heartbeats)."""
        summary = self.summary(run_id)
        metadata = dict(self.reader.metadata(run_id))
        params, tags, note = split_metadata(metadata)
        artifacts = [
            {"name": a.name, "path": a.path, "metadata": a.metadata}
            for a in self.reader.artifacts(run_id).values()
        ]
        lineage = self.reader.lineage(run_id)
        edges = [
            {"run": e.source_run_id, "artifact": e.artifact_name, "known": e.source_run_id in
             self._known()}
            for e in lineage.parents
        ]  # fmt: skip
        children = [
            {"run": e.source_run_id, "artifact": e.artifact_name,
             "known": e.source_run_id in self._known()}
            for e in lineage.descendants
        ]  # fmt: skip
        return {
            "params": params,
            "tags": sorted(tags),
            "note": note,
            "artifacts": artifacts,
            "parents": edges,
            "children": children,
            "writers": self._heartbeats(run_id) if summary.status == "running" else [],
        }

    def _known(self) -> set[str]:
        with self._index_lock:
            return set(self._runs)

    def _heartbeats(self, run_id: str) -> list[dict[str, Any]]:
        beats = self.reader.writers(run_id)
        return [{"writer": w, **b} for w, b in sorted(beats.items())]

    # -- metric points --------------------------------------------------------------------------
    def series(
        self,
        run_id: str,
        names: Iterable[str] | None = None,
        axis: str = "step",
        *,
        whole: bool = False,
    ) -> dict[str, tuple[XArray, FloatArray, int]]:
        """The run's curves (those of ``names``, all without it) read up to what its summary
        counts (only what is new since the last call): per metric ``(x, y, count)``, x the
        step or the time (``axis``), sorted, ``count`` the points the metric has. The
        arrays are never changed afterwards.

        ``whole``: for a chart of the whole run (not zoomed in). An ended run of at least
        ``OVERVIEW_POINTS`` points that are not in memory is then answered from the
        store's overview of it where there is one (:meth:`RunReader.overview`: the points
        such a chart draws), without reading every point."""
        summary = self.summary(run_id)
        count = sum(m.count for m in summary.metrics.values())
        with self._points_lock:
            points = self._points.get(run_id)
            if points is None or count < points.seen_count:
                # New, or fewer points than read: the run was deleted and written anew.
                points = self._points[run_id] = _RunPoints()
            self._points.move_to_end(run_id)
        # seen_count is read without the run's lock: a chart that sees a full read just
        # ended uses the overview once more, which draws the same.
        if (
            whole
            and count >= OVERVIEW_POINTS
            and summary.status != "running"  # a live run has no overview yet
            and points.seen_count != count
        ):
            view = self._overview(run_id, points, count)
            if view is not None:
                wanted = view if names is None else {n: view[n] for n in names if n in view}
                counts = summary.metrics
                return {
                    name: (*(c.by_step() if axis == "step" else c.by_time()),
                           counts[name].count if name in counts else len(c))
                    for name, c in wanted.items()
                }  # fmt: skip
        # The run's own lock, not the cache's: a long first read of a huge run (seconds)
        # holds up only the requests for that run. The two locks are never nested.
        with points.lock:
            if points.seen_count != count:
                self._read_points(run_id, points)
                points.seen_count = count
                points.held = sum(len(c) for c in points.curves.values())
            wanted = points.curves if names is None else {
                n: points.curves[n] for n in names if n in points.curves
            }  # fmt: skip
            out = {}
            for name, curve in wanted.items():
                x, y = curve.by_step() if axis == "step" else curve.by_time()
                out[name] = (x, y, len(curve))
        self._evict()
        return out

    def _overview(self, run_id: str, points: _RunPoints, count: int) -> dict[str, Curve] | None:
        """The run's overview as curves, read once per point count (None: none kept)."""
        with points.view_lock:
            if points.view_count != count:
                read = self.reader.overview(run_id)
                points.view = None
                if read is not None:
                    points.view = {}
                    for name, chunk in read.items():
                        points.view.setdefault(name, Curve()).add(chunk)
                points.view_count = count
            return points.view

    def _evict(self) -> None:
        """Drops the runs least recently charted while the points kept exceed the bound
        (the run just read stays, however big). A reader of a run dropped meanwhile keeps
        what it holds; the next request reads the run again."""
        with self._points_lock:
            total = sum(p.held for p in self._points.values())
            while total > self.max_points and len(self._points) > 1:
                _, dropped = self._points.popitem(last=False)
                total -= dropped.held

    def held_points(self) -> int:
        """The points kept in memory, all runs together."""
        with self._points_lock:
            return sum(p.held for p in self._points.values())

    def forget(self, run_ids: Iterable[str]) -> None:
        """Drops the points kept of ``run_ids`` (runs gone from the store)."""
        with self._points_lock:
            for run_id in run_ids:
                self._points.pop(run_id, None)

    def preload(self, stop: threading.Event, budget: int = PRELOAD_POINTS) -> None:
        """Reads the run list, then the points of the newest runs (by start) while they fit
        in ``budget`` points held (and in ``max_points``), until ``stop`` is set: what the
        server does in the background as it starts, so that the first page and its charts
        come from memory. Errors end it quietly: the requests that meet them report them."""
        budget = min(budget, self.max_points)
        try:
            self.refresh()
            if budget <= 0:
                return  # the run list alone
            with self._index_lock:
                runs = sorted((r for r, _ in self._runs.values()), key=_started, reverse=True)
            for run in runs:
                if stop.is_set() or self.held_points() >= budget:
                    return
                if sum(m.count for m in run.metrics.values()) <= budget - self.held_points():
                    self.series(run.run_id)
        except Exception:  # a read error is the next request's to report
            return

    def _read_points(self, run_id: str, points: _RunPoints) -> None:
        read = self.reader.scalars(run_id, None, points.cursor)
        if read.reset:
            points.curves = {}
        for metric, chunk in read.curves.items():
            points.curves.setdefault(metric, Curve()).add(chunk)
        points.cursor = read.cursor


def _started(run: RunSummary) -> float:
    return run.start if run.start is not None else float("-inf")


def _search_text(run: RunSummary) -> str:
    parts = [run.run_id, run.note, *run.tags, *(f"{k}={v}" for k, v in run.params.items())]
    return "\n".join(parts).lower()


__all__ = [
    "DEFAULT_REFRESH_S",
    "MAX_CACHED_POINTS",
    "OVERVIEW_POINTS",
    "PRELOAD_POINTS",
    "SLOW_REFRESH_S",
    "Changes",
    "Curve",
    "LiveStore",
    "UnknownRunError",
]
