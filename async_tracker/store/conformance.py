"""The read conformance suite: what every store's reader answers, whatever the backend.

Shipped in the package, as fsspec ships its abstract tests, so that a backend written
outside this project runs the same tests as ours. Subclass :class:`ReadConformance` in a
test module and give it a ``backend`` fixture that returns a fresh
:class:`~async_tracker.AsyncTrackerBase` over a store of its own; pytest collects every
``test_*`` method for it::

    import fsspec
    import pytest

    from async_tracker.backend.fsspec import AsyncFsspecTracker
    from async_tracker.store.conformance import ReadConformance

    class TestMyStore(ReadConformance):
        keeps_heartbeats = True  # what differs from the defaults, declared

        @pytest.fixture
        def backend(self, tmp_path):
            return AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path / "runs"))

The tests write through the real write path (:class:`~async_tracker.AppRun` with that
backend, closed; a heartbeat or a deletion through the backend's own method, on the
tracker loop) and read through :func:`async_tracker.store.open.open_reader` alone, the sync
face every caller holds. They are plain (not ``async``) tests: no pytest plugin is needed.

What a store cannot do is declared by the subclass as a capability (``records_endings``,
``can_delete``, ``keeps_heartbeats``, ``time_resolution_s``, ``refused_params``), never by
skipping a whole test: a declared capability is itself checked (a store that declares no
heartbeats must answer ``writers()`` with nothing). ``corrupt`` is the hook of stores made
of files.

This module imports pytest when it is imported, which only a test run does: nothing in
``async_tracker`` imports it, so ``import async_tracker`` works without pytest.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio
import numpy as np
import pytest

from async_tracker.base import AsyncTrackerBase, CloseReason
from async_tracker.errors import ReadTimeoutError
from async_tracker.records import Lineage, TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.run import AppRun
from async_tracker.runtime.process import runtime
from async_tracker.store.open import open_reader
from async_tracker.store.reader import Scalars, merge_points
from async_tracker.store.runs import select
from async_tracker.store.sync_reader import Reader
from async_tracker.tags import NOTE_KEY, TAG_KEY_PREFIX

T = TypeVar("T")

# A bound on each wait of the suite for the store (writes at close, reads, the tracker
# loop): far beyond what a working store takes, so that a hung one fails instead of
# waiting forever.
STORE_WAIT_S = 60.0

DEPTH = 50  # levels of the nested param


def nested(depth: int) -> dict[str, object]:
    """``{"a": {"a": ... {"leaf": 1, ...}, "level": 1}, "level": 0}``: ``depth`` levels."""
    value: dict[str, object] = {"leaf": 1, "text": "bottom"}
    for level in reversed(range(depth - 1)):
        value = {"a": value, "level": level}
    return value


# Values a run's params may hold, each written by a call of its own: a store keeps and reads
# back exactly what it accepts, and may refuse at the call site what it cannot store.
EXOTIC_PARAMS: dict[str, object] = {
    "nan": math.nan,
    "inf": math.inf,
    "ninf": -math.inf,
    "int64_max": 2**63 - 1,
    "huge_int": 10**30,
    "deep": nested(DEPTH),
    "unicode": "résumé ✓ 実験 🚀 Ω\u200b",
    "megabyte": "0123456789abcdé\n" * 65_536,  # 1 MiB of UTF-8 text
    "nested_nan": {"values": [math.nan, math.inf, -math.inf, 1.5], "ok": True, "none": None},
}


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN, and of the same type at every level (``True`` is not ``1``,
    ``1`` is not ``1.0``); tuples and lists alike, mappings in any order."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if is_dataclass(a) and is_dataclass(b) and type(a) is type(b):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return type(a) is type(b) and a == b


def same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def artifact_fields(
    artifacts: Mapping[str, TrackerArtifact],
) -> dict[str, tuple[str, str, dict[str, object] | None]]:
    """Name -> (name, path, metadata), with ``{}`` and ``None`` metadata both read as None."""
    return {
        k: (a.name, a.path, dict(a.metadata) if a.metadata else None)
        for k, a in artifacts.items()
    }


def edges(sources: Iterable[TrackerSource]) -> set[tuple[str, str | None]]:
    return {(s.source_run_id, s.artifact_name) for s in sources}


@dataclass(frozen=True)
class Planted:
    """What :meth:`ReadConformance.corrupt` put in a store, as the store's own reads name
    paths: a garbage file among a run's metadata records, one among its metrics, and at
    the store's root a foreign entry whose listing is warned about (``root``; None where
    the store skips foreign entries at its root without a word: a TensorBoard log directory,
    where only folders holding runs count)."""

    metadata: str
    metrics: str
    root: str | None = None


class ReadConformance:
    """The read conformance suite. Subclasses provide the ``backend`` fixture and declare
    what the store cannot do with the class attributes below."""

    #: ``status()`` says how a run ended (``finished``, ``failed``, ``killed``), and
    #: ``running`` before. False: the store keeps no endings and says ``""``.
    records_endings: bool = True
    #: ``status()`` also says when a run ended (a time, not None).
    records_end_time: bool = True
    #: ``delete_run`` removes a run (the listing tests check that it is gone).
    can_delete: bool = True
    #: ``writers()`` returns the heartbeats the backend's ``heartbeat()`` stored. False:
    #: ``writers()`` is always empty.
    keeps_heartbeats: bool = False
    #: Seconds to which the store keeps metric times (MLflow: milliseconds): times read
    #: back are within it of the times written, and points of one step logged within it
    #: may come back in either order. 0: times exact, points of one step in logged order.
    time_resolution_s: float = 0.0
    #: Keys of :data:`EXOTIC_PARAMS` whose values a write refuses at the call site (a
    #: ``ValueError``/``TypeError`` naming the key). ``huge_int`` is refused by the generic
    #: checks, for every store (the spool cannot keep it either).
    refused_params: frozenset[str] = frozenset({"huge_int"})
    #: Each read's deadline (seconds).
    read_timeout_s: float = STORE_WAIT_S

    # -- what a subclass provides ---------------------------------------------------------------
    @pytest.fixture
    def backend(self) -> AsyncTrackerBase:
        """A fresh backend over a store of its own. Override it with a fixture: plain or
        generator (to close the backend after the test; ``on_loop(backend.aclose)``), or
        async where pytest-asyncio runs the tests."""
        raise NotImplementedError("a ReadConformance subclass must define a backend fixture")

    def another_writer(self, backend: AsyncTrackerBase) -> AsyncTrackerBase:
        """A second backend over the same store, as another process would open it (default:
        ``backend`` itself, for stores that live in one object; each ``AppRun`` is a writer
        of its own all the same)."""
        return backend

    def corrupt(self, backend: AsyncTrackerBase, run_id: str) -> Planted | None:
        """Plants, in the store of ``backend``, a garbage file among the metadata records of
        ``run_id`` and one among its metrics, and a foreign file and folder at the store's
        root; returns their paths (see :class:`Planted`). None (the default): the store
        has no files to damage, and the corrupt-store test is skipped."""
        return None

    def delete(self, backend: AsyncTrackerBase, run_id: str) -> bool:
        """Deletes ``run_id`` through the backend (its ``delete_run``, on the tracker loop)."""
        return on_loop(backend.delete_run, run_id)

    @pytest.fixture
    def run_id(self) -> str:
        """A run id no other test, and no earlier session on a shared store, uses."""
        return f"read-conformance-{uuid.uuid4().hex[:12]}"

    # -- helpers --------------------------------------------------------------------------------
    _spools = itertools.count()

    def app_run(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path, **options: Any
    ) -> AppRun:
        """A run writing to ``backend`` alone: no timed flush, no heartbeat (unless
        asked), its own spool folder under ``tmp_path``."""
        settings: dict[str, Any] = {
            "flush_interval": 3600,
            "heartbeat_s": 0,
            "close_timeout": STORE_WAIT_S,
            "spool_dir": str(tmp_path / f"spool-{next(self._spools)}"),
        }
        settings.update(options)
        return AppRun(run_id, [backend], **settings)

    def reader(self, backend: AsyncTrackerBase) -> Reader:
        return open_reader(backend, timeout=self.read_timeout_s)

    def close(self, run: AppRun, reason: CloseReason | None = None) -> None:
        report = run.close(STORE_WAIT_S, reason=reason)
        assert report.ok and report.pending == 0, report

    def assert_times(self, times: Sequence[float], start: float, end: float) -> None:
        slack = self.time_resolution_s + 1e-6
        assert all(start - slack <= t <= end + slack for t in times), (start, end, times)

    def assert_points(
        self, got: Sequence[TrackerMetric], want: Sequence[tuple[int, float]]
    ) -> None:
        """``got`` holds the points of ``want`` (step, value): in this order, or, where the
        store keeps coarse times, in any order within one step."""
        assert [p.step for p in got] == [s for s, _ in want], (got, want)
        if self.time_resolution_s == 0:
            pairs = [(p.step, p.value) for p in got]
            assert all(same(g, w) for g, w in zip(pairs, want)), (got, want)
            return

        def order(v: float) -> tuple[bool, float]:
            return math.isnan(v), 0.0 if math.isnan(v) else v

        for step in {s for s, _ in want}:
            a = sorted((p.value for p in got if p.step == step), key=order)
            b = sorted((v for s, v in want if s == step), key=order)
            assert all(map(same_value, a, b)), (step, got, want)

    # -- metrics --------------------------------------------------------------------------------
    def test_every_point_reads_back_through_metrics_and_scalars(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        want: dict[str, list[tuple[int, float]]] = {}

        def log(run: AppRun, name: str, value: float, step: int) -> None:
            run.log_metric(name, value, step=step)
            want.setdefault(name, []).append((step, value))

        start = time.time()
        run = self.app_run(backend, run_id, tmp_path)
        for step in range(30):
            log(run, "loss", 1.0 / (step + 1), step)
            log(run, "acc", step / 30, step)
        assert run.flush(STORE_WAIT_S).ok
        # Points of one step: in one batch (one clock tick, most likely), and in a later one.
        for value in (0.1, 0.2, 0.3):
            log(run, "same", value, 7)
        log(run, "loss", 0.05, 5)
        for step, value in enumerate([math.nan, math.inf, -math.inf, -0.0, 1e300, 5e-324]):
            log(run, "odd", value, step)
        log(run, "all_nan", math.nan, 0)
        self.close(run)
        end = time.time()

        reader = self.reader(backend)
        metrics = reader.metrics(run_id)
        assert set(metrics) == set(want)
        for name, points in want.items():
            ordered = sorted(points, key=lambda p: p[0])  # stable: as logged within a step
            self.assert_points(metrics[name], ordered)
            self.assert_times([p.timestamp for p in metrics[name]], start, end)
        odd = {p.step: p.value for p in metrics["odd"]}
        assert math.isnan(odd[0]) and odd[1] == math.inf and odd[2] == -math.inf
        assert odd[3] == 0.0 and odd[4] == 1e300 and odd[5] == 5e-324

        read = reader.scalars(run_id)
        assert set(read.curves) == set(want)
        for name, curve in read.curves.items():
            stored = metrics[name]
            assert len(curve) == len(stored)
            assert curve.steps.tolist() == [p.step for p in stored]
            assert np.array_equal(curve.values, [p.value for p in stored], equal_nan=True)
            assert curve.times.tolist() == [p.timestamp for p in stored], name
        only = reader.scalars(run_id, names=["acc", "no-such-metric"])
        assert set(only.curves) == {"acc"}
        assert only.curves["acc"].steps.tolist() == list(range(30))

    def test_scalars_since_a_cursor_add_up_to_every_point(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        first = self.app_run(backend, run_id, tmp_path)
        for step in range(10):
            first.log_metric("loss", float(step), step=step)
        self.close(first)
        reader = self.reader(backend)
        kept = reader.scalars(run_id)
        assert kept.reset and kept.curves["loss"].steps.tolist() == list(range(10))

        again = self.app_run(backend, run_id, tmp_path)  # the run resumed: more points
        for step in range(10, 15):
            again.log_metrics({"loss": float(step), "new": -float(step)}, step=step)
        self.close(again)
        more = reader.scalars(run_id, since=kept.cursor)
        curves = dict(more.curves) if more.reset else _added(kept.curves, more.curves)
        if not more.reset:
            assert more.curves["loss"].steps.tolist() == list(range(10, 15))
        every = reader.metrics(run_id)
        assert set(curves) == set(every) == {"loss", "new"}
        for name, points in every.items():
            assert curves[name].steps.tolist() == [p.step for p in points]
            assert curves[name].values.tolist() == [p.value for p in points]

        # Nothing new since: nothing added (or, without a cursor of the store's own, all).
        same_again = reader.scalars(run_id, since=more.cursor)
        if same_again.reset:
            assert {n: len(c) for n, c in same_again.curves.items()} == {"loss": 15, "new": 5}
        else:
            assert all(len(c) == 0 for c in same_again.curves.values()), same_again

    def test_a_second_writer_of_the_run_adds_its_points(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        # Two writers of one run at once, as two ranks of a job: each its own pipeline (batch
        # keys, writer token), the second over its own backend object where the store allows.
        one = self.app_run(backend, run_id, tmp_path)
        two = self.app_run(self.another_writer(backend), run_id, tmp_path)
        for step in range(5):
            one.log_metric("loss", float(step), step=step)
            two.log_metric("loss", 10.0 + step, step=step)
        two.log_metric("rank1_only", 1.0, step=0)
        one.add_metadata(rank0=0)
        two.add_metadata(rank1=1)
        assert one.flush(STORE_WAIT_S).ok and two.flush(STORE_WAIT_S).ok
        one.log_metric("loss", 0.5, step=5)
        self.close(two)
        self.close(one)

        reader = self.reader(backend)
        loss = reader.metrics(run_id)["loss"]
        assert [p.step for p in loss] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
        for step in range(5):
            assert sorted(p.value for p in loss if p.step == step) == [float(step), 10.0 + step]
        assert [p.value for p in reader.metrics(run_id)["rank1_only"]] == [1.0]
        assert dict(reader.metadata(run_id)) == {"rank0": 0, "rank1": 1}
        summary = reader.run_summary(run_id)
        assert summary is not None
        assert summary.metrics["loss"].count == 11 and summary.metrics["loss"].last == 0.5
        assert summary.metrics["rank1_only"].count == 1
        assert dict(summary.params) == {"rank0": 0, "rank1": 1}
        if self.records_endings:
            assert summary.status == "finished"

    # -- the run list ---------------------------------------------------------------------------
    def test_summaries_hold_params_tags_note_metrics_and_start(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        start = time.time()
        run = self.app_run(backend, run_id, tmp_path)
        run.add_metadata(lr=0.1, name="a", layers=[64, 32], nan_param=math.nan)
        run.add_tags("baseline", "v2")
        run.set_note("first try")
        for step, value in enumerate([1.0, math.nan, 0.5, 0.75]):
            run.log_metric("loss", value, step=step)
        assert run.flush(STORE_WAIT_S).ok
        run.log_metric("loss", 0.25, step=3)  # the highest step again: the last value
        run.log_metric("all_nan", math.nan, step=0)
        run.log_metric("all_nan", math.nan, step=1)
        run.remove_tags("v2")
        self.close(run)
        end = time.time()

        reader = self.reader(backend)
        summary = reader.run_summary(run_id)
        assert summary is not None and summary.run_id == run_id
        assert same(dict(summary.params), {"lr": 0.1, "name": "a", "layers": [64, 32],
                                           "nan_param": math.nan}), summary.params  # fmt: skip
        assert summary.tags == frozenset({"baseline"}) and summary.note == "first try"
        loss = summary.metrics["loss"]
        assert (loss.last, loss.min, loss.max, loss.count, loss.last_step) == (
            0.25, 0.25, 1.0, 5, 3
        )
        nan = summary.metrics["all_nan"]
        assert math.isnan(nan.last) and (nan.min, nan.max, nan.count) == (None, None, 2)
        assert summary.start is not None
        self.assert_times([summary.start], start, end)
        assert summary.start <= min(p.timestamp for p in reader.metrics(run_id)["loss"]) + (
            self.time_resolution_s + 1e-6
        )
        if self.records_endings:
            assert summary.status == "finished"
        # The run list says the same of the run.
        listed = {r.run_id: r for r in reader.run_summaries()}
        assert same(listed[run_id], summary)
        listing = reader.list_runs()
        assert listing.complete and not listing.gone
        assert same({r.run_id: r for r in listing.runs}[run_id], summary)
        # Metadata holds the tags and the note as their keys; the summary splits them out.
        metadata = reader.metadata(run_id)
        assert metadata["lr"] == 0.1 and metadata[NOTE_KEY] == "first try"
        assert metadata[f"{TAG_KEY_PREFIX}baseline"] is True
        assert metadata[f"{TAG_KEY_PREFIX}v2"] is False

    def test_the_newest_runs_are_the_first_of_the_list(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        """``newest_runs`` (what ``list jobs`` shows by default) gives what ``select`` of
        every summary gives: the runs that started last, newest first, and how many more."""
        ids = [f"{run_id}-{i}" for i in range(3)]
        for i, rid in enumerate(ids):  # one after another: each starts after the one before
            run = self.app_run(backend, rid, tmp_path)
            run.add_metadata(i=i)
            run.log_metric("loss", 1.0 / (i + 1), step=0)
            self.close(run)
        reader = self.reader(backend)
        wanted = set(ids)
        every = [r for r in reader.run_summaries() if r.run_id in wanted]
        for limit in (1, 2, 3, 4, 0):
            shown, left_out = reader.newest_runs(limit, wanted)
            assert [r.run_id for r in shown] == ids[::-1][: limit or None], limit
            assert left_out == 3 - len(shown), limit
            expected, expected_left_out = select(every, limit=limit)
            assert same(shown, expected) and left_out == expected_left_out, limit
        # The sync face's choice: the newest alone, or every summary filtered and sorted.
        assert reader.select_runs(limit=2, run_ids=wanted)[1] == 1
        picked, _ = reader.select_runs(filter="i>=1", sort="-i", run_ids=wanted)
        assert [r.run_id for r in picked] == ids[:0:-1]

    def test_list_runs_since_a_cursor_gives_what_changed_and_what_is_gone(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        a, b = f"{run_id}-a", f"{run_id}-b"
        for rid in (a, b):
            run = self.app_run(backend, rid, tmp_path)
            # NaN where summaries are compared between listings: a NaN param and last value.
            run.add_metadata(which=rid, odd=math.nan)
            run.log_metric("loss", 1.0, step=0)
            run.log_metric("loss", math.nan, step=1)
            self.close(run)
        reader = self.reader(backend)
        first = reader.list_runs()
        assert first.complete and {a, b} <= {r.run_id for r in first.runs}

        unchanged = reader.list_runs(since=first.cursor)
        if not unchanged.complete:
            assert unchanged.runs == [] and not unchanged.gone, unchanged

        more = self.app_run(backend, b, tmp_path)
        more.log_metric("loss", 0.5, step=2)
        self.close(more)
        second = reader.list_runs(since=first.cursor)
        changed = {r.run_id: r for r in second.runs}
        if not second.complete:
            assert set(changed) == {b} and not second.gone, second
        assert changed[b].metrics["loss"].count == 3 and changed[b].metrics["loss"].last == 0.5

        if not self.can_delete:
            assert self.delete(backend, a) is False, "declare can_delete: the store deletes"
            assert reader.run_exists(a)
            return
        assert self.delete(backend, a)
        third = reader.list_runs(since=second.cursor)
        ids = {r.run_id for r in third.runs}
        assert a not in ids
        if not third.complete:
            assert third.gone == frozenset({a}) and ids == set(), third
        assert not reader.run_exists(a) and reader.run_summary(a) is None
        assert a not in reader.run_ids() and b in reader.run_ids()
        assert a not in {r.run_id for r in reader.run_summaries()}

    # -- params ---------------------------------------------------------------------------------
    def test_params_of_any_value_read_back_exactly(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        run = self.app_run(backend, run_id, tmp_path)
        refused: set[str] = set()
        for key, value in EXOTIC_PARAMS.items():
            try:
                run.add_metadata(**{key: value})
            except (TypeError, ValueError) as exc:
                assert key in str(exc), f"the refusal of {key!r} does not name it: {exc}"
                refused.add(key)
        run.log_metric("loss", 1.0, step=0)
        self.close(run)
        assert refused == set(self.refused_params), "declare what the store refuses"
        stored = {k: v for k, v in EXOTIC_PARAMS.items() if k not in refused}

        reader = self.reader(backend)
        metadata = reader.metadata(run_id)
        for key, value in stored.items():
            assert key in metadata, key
            assert same(metadata[key], value), (key, str(metadata[key])[:200])
        assert set(metadata) == set(stored)
        summary = reader.run_summary(run_id)
        assert summary is not None
        assert set(summary.params) == set(stored)
        for key, value in stored.items():
            assert same(summary.params[key], value), (key, str(summary.params[key])[:200])

    # -- how runs end ---------------------------------------------------------------------------
    def test_status_through_each_ending(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        reader = self.reader(backend)
        ids = {r: f"{run_id}-{r}" for r in ("finished", "failed", "killed")}
        live = self.app_run(backend, f"{run_id}-live", tmp_path)
        live.log_metric("loss", 1.0, step=0)
        assert live.flush(STORE_WAIT_S).ok
        live_status = reader.status(live.id)

        before = time.time()
        with self.app_run(backend, ids["finished"], tmp_path) as run:
            run.log_metric("loss", 1.0, step=0)
        assert run.close().ok
        failing = self.app_run(backend, ids["failed"], tmp_path)
        with pytest.raises(RuntimeError, match="the job failed"), failing as run:
            run.log_metric("loss", 1.0, step=0)
            raise RuntimeError("the job failed")
        assert run.close().ok
        killed = self.app_run(backend, ids["killed"], tmp_path)
        killed.log_metric("loss", 1.0, step=0)
        self.close(killed, reason="killed")
        after = time.time()

        if not self.records_endings:
            # The store keeps no endings: it says so, for every run.
            for rid in [*ids.values(), live.id]:
                assert reader.status(rid) == ("", None)
            self.close(live)
            return
        assert live_status == ("running", None), live_status
        summaries = {r.run_id: r for r in reader.run_summaries()}
        for reason, rid in ids.items():
            status, ended = reader.status(rid)
            assert status == reason, (rid, status)
            assert summaries[rid].status == reason
            if self.records_end_time:
                assert ended is not None
                self.assert_times([ended], before, after)
                assert summaries[rid].end == ended
            else:
                assert ended is None, "declare records_end_time: the store says when"
        assert summaries[live.id].status == "running" and summaries[live.id].end is None
        self.close(live)
        assert reader.status(live.id)[0] == "finished"

    def test_writers_are_the_heartbeats_kept(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        run = self.app_run(backend, run_id, tmp_path)
        run.log_metric("loss", 1.0, step=0)
        assert run.flush(STORE_WAIT_S).ok
        before = time.time()
        on_loop(backend.heartbeat, run_id, 120.0)  # as the run's lane beats
        after = time.time()
        writers = self.reader(backend).writers(run_id)
        self.close(run)
        if not self.keeps_heartbeats:
            assert writers == {}
            return
        assert writers, "a heartbeat was stored, and writers() does not show it"
        beats = [w for w in writers.values() if w.get("interval_s") == 120.0]
        assert len(beats) == 1, writers
        when = beats[0]["time"]
        assert isinstance(when, float)
        self.assert_times([when], before, after)

    # -- an unknown run -------------------------------------------------------------------------
    def test_an_unknown_run_reads_as_empty(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        run = self.app_run(backend, run_id, tmp_path)  # the store is not empty
        run.add_metadata(present=True)
        run.log_metric("loss", 1.0, step=0)
        self.close(run)
        unknown = f"{run_id}-never-written"
        reader = self.reader(backend)
        assert reader.run_exists(run_id) and not reader.run_exists(unknown)
        assert reader.run_summary(unknown) is None
        assert dict(reader.metadata(unknown)) == {}
        assert dict(reader.artifacts(unknown)) == {}
        assert dict(reader.metrics(unknown)) == {}
        assert reader.scalars(unknown).curves == {}
        lineage = reader.lineage(unknown)
        assert list(lineage.parents) == [] and list(lineage.descendants) == []
        assert reader.run_ids(parent_run_id=unknown) == []
        assert unknown not in reader.run_ids() and run_id in reader.run_ids()
        assert unknown not in {r.run_id for r in reader.run_summaries()}
        assert reader.writers(unknown) == {}
        assert reader.status(unknown)[0] not in ("finished", "failed", "killed")

    # -- artifacts and lineage ------------------------------------------------------------------
    def test_artifacts_and_lineage_round_trip(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        parent, child, data = run_id, f"{run_id}-child", f"{run_id}-data"
        with self.app_run(backend, parent, tmp_path) as run:
            run.add_metadata(role="parent")
            run.add_artifact("model", "s3://bucket/ckpt/1.pt", {"epoch": 1})
        with self.app_run(backend, child, tmp_path) as run:
            run.add_source(parent, "model")
            run.add_source(data)
            run.add_artifact("model", "s3://bucket/ckpt/2.pt", {"epoch": 2})
            run.add_artifact("model", "s3://bucket/ckpt/3.pt", {"epoch": 3, "acc": 0.9})
            run.add_artifact("log", "s3://bucket/log.txt")
            run.add_artifact("résumé ✓", "s3://bucket/ü.txt", {"ключ": "значение"})
            run.log_metric("loss", 1.0, step=0)
        assert run.close().ok

        reader = self.reader(backend)
        assert artifact_fields(reader.artifacts(child)) == {
            "model": ("model", "s3://bucket/ckpt/3.pt", {"epoch": 3, "acc": 0.9}),
            "log": ("log", "s3://bucket/log.txt", None),
            "résumé ✓": ("résumé ✓", "s3://bucket/ü.txt", {"ключ": "значение"}),
        }
        assert artifact_fields(reader.artifacts(parent)) == {
            "model": ("model", "s3://bucket/ckpt/1.pt", {"epoch": 1})
        }
        up = reader.lineage(child)
        assert isinstance(up, Lineage)
        assert edges(up.parents) == {(parent, "model"), (data, None)}
        assert list(up.descendants) == []
        down = reader.lineage(parent)
        assert list(down.parents) == []
        assert edges(down.descendants) == {(child, "model")}
        assert reader.run_ids(parent_run_id=parent) == [child]
        assert reader.run_ids(parent_run_id=child) == []
        assert {parent, child} <= set(reader.run_ids())

    # -- deadlines ------------------------------------------------------------------------------
    def test_a_read_that_hangs_fails_in_its_deadline_naming_the_store(
        self, backend: AsyncTrackerBase, run_id: str, tmp_path: Path
    ) -> None:
        with self.app_run(backend, run_id, tmp_path) as run:
            run.add_metadata(lr=0.1)
            run.log_metric("loss", 1.0, step=0)
        assert run.close().ok
        hanging = Hanging(backend)
        label = f"store hanging://{run_id}"
        reader = open_reader(hanging, timeout=0.5, label=label)
        for read in (lambda: reader.metrics(run_id), reader.run_summaries, reader.run_ids):
            began = time.monotonic()
            with pytest.raises(ReadTimeoutError) as raised:
                read()
            assert label in str(raised.value) and "0.5 s" in str(raised.value)
            # Bounded, not timed: far below the store's own waits.
            assert time.monotonic() - began < STORE_WAIT_S / 2
        # Each hung read was cancelled on the tracker loop, which keeps serving reads.
        assert hanging.cancelled.acquire(timeout=STORE_WAIT_S)
        assert hanging.cancelled.acquire(timeout=STORE_WAIT_S)
        assert hanging.cancelled.acquire(timeout=STORE_WAIT_S)
        assert hanging.waiting == 0
        assert dict(reader.metadata(run_id)) == {"lr": 0.1}

    # -- damaged stores -------------------------------------------------------------------------
    def test_corrupt_and_foreign_files_are_skipped_with_one_warning(
        self,
        backend: AsyncTrackerBase,
        run_id: str,
        tmp_path: Path,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        with self.app_run(backend, run_id, tmp_path) as run:
            run.add_metadata(lr=0.1, name="good")
            for step in range(5):
                run.log_metric("loss", float(step), step=step)
        assert run.close().ok
        planted = self.corrupt(backend, run_id)
        if planted is None:
            pytest.skip("the store has no files to damage")
        reader = self.reader(backend)

        def warned(read: Callable[[], T]) -> tuple[T, list[str]]:
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                result = read()
            return result, [
                r.getMessage()
                for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("async_tracker")
            ]

        def one_naming(path: str | None, messages: list[str]) -> None:
            if path is None:
                assert messages == [], messages
            else:
                assert len(messages) == 1 and path in messages[0], (path, messages)

        metadata, messages = warned(lambda: reader.metadata(run_id))
        assert dict(metadata) == {"lr": 0.1, "name": "good"}
        one_naming(planted.metadata, messages)
        metrics, messages = warned(lambda: reader.metrics(run_id))
        assert [(p.step, p.value) for p in metrics["loss"]] == [(s, float(s)) for s in range(5)]
        assert set(metrics) == {"loss"}
        one_naming(planted.metrics, messages)
        read, messages = warned(lambda: reader.scalars(run_id))
        assert read.curves["loss"].values.tolist() == [float(s) for s in range(5)]
        one_naming(planted.metrics, messages)
        ids, messages = warned(reader.run_ids)
        assert run_id in ids
        one_naming(planted.root, messages)
        # The run list reads more than one kind of file: each it met named once, no more.
        summaries, messages = warned(reader.run_summaries)
        summary = {r.run_id: r for r in summaries}[run_id]
        assert summary.metrics["loss"].count == 5 and dict(summary.params) == {
            "lr": 0.1, "name": "good"
        }
        named = [p for p in (planted.metadata, planted.metrics, planted.root) if p]
        for message in messages:
            assert any(p in message for p in named), message
        for path in named:
            assert sum(path in m for m in messages) <= 1, (path, messages)


def on_loop(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``fn(*args)`` (a coroutine function) run on the tracker loop, where the backend's
    writes run, waited for at most :data:`STORE_WAIT_S`."""
    return runtime().loop.call(fn, *args, timeout=STORE_WAIT_S)


def _added(kept: Mapping[str, Scalars], new: Mapping[str, Scalars]) -> dict[str, Scalars]:
    """What a caller that keeps curves holds after adding a read that is not a reset."""
    out = dict(kept)
    for name, curve in new.items():
        out[name] = merge_points([out[name], curve]) if name in out else curve
    return out


class Hanging(AsyncTrackerBase):
    """``inner`` whose ``metrics()`` and ``run_ids()`` never answer: they wait on an event
    nobody sets. ``cancelled`` is released once per such wait cancelled; ``waiting`` counts
    the waits still on. Every other call goes to ``inner``."""

    def __init__(self, inner: AsyncTrackerBase) -> None:
        self.inner = inner
        self.name = "hanging"
        self.cancelled = threading.Semaphore(0)
        self.waiting = 0

    def __repr__(self) -> str:
        return f"Hanging({self.inner!r})"

    async def _hang(self) -> NoReturn:
        self.waiting += 1
        try:
            await anyio.Event().wait()
        except anyio.get_cancelled_exc_class():
            # Counted before it is told: whoever acquires ``cancelled`` sees the count.
            self.waiting -= 1
            self.cancelled.release()
            raise
        raise AssertionError("an event nobody sets was set")

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        await self._hang()

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        await self._hang()

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self.inner.add_metrics(run_id, metrics)

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        await self.inner.add_artifact(run_id, name, path, metadata)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return await self.inner.artifacts(run_id)

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self.inner.add_metadata(run_id, **kwargs)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return await self.inner.metadata(run_id)

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        await self.inner.add_source(run_id, source_id, artifact_name)

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        return await self.inner.sources(run_id, artifact_name)

    async def lineage(self, run_id: str) -> Lineage:
        return await self.inner.lineage(run_id)


__all__ = [
    "EXOTIC_PARAMS", "Hanging", "Planted", "ReadConformance", "nested", "on_loop", "same",
]
