"""The backend conformance suite: what every ``AsyncTrackerBase`` must do, whatever it stores.

Subclass :class:`BackendConformance` in a ``test_*.py`` module, give it a ``backend`` fixture
(a method, sync or async, plain or generator) returning the backend to test, and pytest
collects every test below for it::

    import pytest
    from tests.conformance import BackendConformance

    class TestFsspecFile(BackendConformance):
        @pytest.fixture
        async def backend(self, tmp_path):
            tracker = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path))
            yield tracker
            await tracker.aclose()

Optionally override ``run_id`` (a fixture returning a run id unique to the test; every other
id a test uses is derived from it) when the store is shared between tests or sessions and
needs a naming scheme of its own.

The suite uses nothing beyond the ``AsyncTrackerBase`` API, so it assumes nothing about how a
backend stores records. It does assume that the backend works from any event loop: the tests
call it on pytest's loop, and :class:`~async_tracker.AppRun` (``test_apprun_end_to_end``)
calls it on its own tracker loop.

Timestamps are compared to the millisecond (some stores keep milliseconds), so the points
written here are far more than a millisecond apart.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import pytest

from async_tracker import (
    AppRun,
    AsyncTrackerBase,
    Batch,
    Lineage,
    RecordError,
    RetryPolicy,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    TransientBackendError,
)
from async_tracker.base import END_PART, Checked, CloseReason
from async_tracker.errors import classify

# Batch keys as a pipeline cuts them ("<time ns>-<writer token>-<sequence>").
REPLAY_KEY = "1700000000000000000-1700000000000000000xab12cd-000000000001"
REPLAY_KEY_2 = "1700000000000000001-1700000000000000000xab12cd-000000000002"
T0 = 1_700_000_000.0  # a fixed, whole-second epoch time for points written directly

METADATA = {
    "lr": 0.01,
    "epochs": 3,
    "name": "résumé ✓",
    "flag": True,
    "nothing": None,
    "tags": ["a", "b"],
    "cfg": {"depth": 4, "opt": {"betas": [0.9, 0.99]}},
}


def pt(name: str, value: float, step: int, seconds: float) -> TrackerMetric:
    return TrackerMetric(name, value, step, T0 + seconds)


def same_points(got: Sequence[TrackerMetric], want: Sequence[TrackerMetric]) -> bool:
    """Equal in order, NaN equal to NaN, timestamps equal to the millisecond."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if (g.name, g.step) != (w.name, w.step):
            return False
        if not (g.value == w.value or (math.isnan(g.value) and math.isnan(w.value))):
            return False
        if abs(g.timestamp - w.timestamp) > 1e-3:
            return False
    return True


def source_pairs(sources: Iterable[TrackerSource]) -> Counter[tuple[str, str | None]]:
    return Counter((s.source_run_id, s.artifact_name) for s in sources)


def artifact_fields(artifacts: Mapping[str, TrackerArtifact]) -> dict[str, tuple[str, str, object]]:
    """Name -> (name, path, metadata), with ``{}`` and ``None`` metadata both read as None."""
    return {
        k: (a.name, a.path, dict(a.metadata) if a.metadata else None)
        for k, a in artifacts.items()
    }


class FlakyProxy(AsyncTrackerBase):
    """A backend in front of another: its first ``fail`` writes raise ``transient``, and a
    batch holding a point whose value is ``poison`` raises ``refused``; every other call goes
    to the backend's own methods (its bulk ``write_batch`` included)."""

    def __init__(
        self, inner: AsyncTrackerBase, transient: BaseException, refused: BaseException,
        fail: int, poison: float,
    ) -> None:
        self.inner = inner
        self.name = "flaky"
        self.transient, self.refused = transient, refused
        self.fail, self.poison = fail, poison
        self.writes = 0

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        self.writes += 1
        if self.writes <= self.fail:
            raise self.transient
        if any(m.value == self.poison for m in batch.metrics):
            raise self.refused
        await self.inner.write_batch(run_id, batch)

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

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        return await self.inner.run_ids(**kwargs)

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self.inner.add_metrics(run_id, metrics)

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return await self.inner.metrics(run_id)


class BackendConformance:
    """The tests every backend passes. Subclasses provide the ``backend`` fixture."""

    @pytest.fixture
    def backend(self) -> AsyncTrackerBase:
        raise NotImplementedError("a BackendConformance subclass must define a backend fixture")

    def mapped_faults(self) -> tuple[BaseException, BaseException]:
        """What this backend raises, through its own error mapping, for a passing outage and
        for a value it cannot store (backends with a library override this)."""
        return TransientBackendError("outage"), RecordError("cannot store this value")

    def library_faults(self) -> tuple[BaseException, BaseException | None]:
        """Errors as this backend's libraries raise them, unmapped: one that passes (an
        outage) and one about a record (None if the backend has none). ``map_error`` must
        make them transient and record errors."""
        return ConnectionResetError("reset by peer"), None

    def unstorable(self) -> Checked | None:
        """A record this backend cannot store, which its ``validate`` refuses (None: it
        stores whatever the generic checks let through)."""
        return None

    @pytest.fixture
    def run_id(self) -> str:
        """A run id no other test (or earlier session on a shared store) uses."""
        return f"conformance-{uuid.uuid4().hex[:12]}"

    # -- metadata ------------------------------------------------------------------------------
    async def test_metadata_round_trip(self, backend: AsyncTrackerBase, run_id: str) -> None:
        await backend.add_metadata(run_id, **METADATA)
        assert dict(await backend.metadata(run_id)) == METADATA

    async def test_metadata_last_write_wins_across_calls(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        await backend.add_metadata(run_id, a=1, b="first")
        await backend.add_metadata(run_id, b="second", c=[3])
        await backend.add_metadata(run_id, c=[4], d={"x": 1})
        assert dict(await backend.metadata(run_id)) == {
            "a": 1,
            "b": "second",
            "c": [4],
            "d": {"x": 1},
        }

    # -- artifacts -----------------------------------------------------------------------------
    async def test_artifacts_with_and_without_metadata(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        await backend.add_artifact(run_id, "model", "/ckpt/model.pt", {"epoch": 3, "acc": 0.9})
        await backend.add_artifact(run_id, "log", "s3://bucket/log.txt")
        got = artifact_fields(await backend.artifacts(run_id))
        assert got == {
            "model": ("model", "/ckpt/model.pt", {"epoch": 3, "acc": 0.9}),
            "log": ("log", "s3://bucket/log.txt", None),
        }

    async def test_artifact_repeated_name_keeps_last(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        await backend.add_artifact(run_id, "model", "/ckpt/1.pt", {"epoch": 1})
        await backend.add_artifact(run_id, "other", "/other")
        await backend.add_artifact(run_id, "model", "/ckpt/2.pt", {"epoch": 2})
        got = artifact_fields(await backend.artifacts(run_id))
        assert got["model"] == ("model", "/ckpt/2.pt", {"epoch": 2})
        assert set(got) == {"model", "other"}

    # -- sources and lineage -------------------------------------------------------------------
    async def test_sources_and_artifact_filter(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        parent, data1, data2 = f"{run_id}-parent", f"{run_id}-data1", f"{run_id}-data2"
        await backend.add_source(run_id, parent)
        await backend.add_source(run_id, data1, "dataset")
        await backend.add_source(run_id, data2, "dataset")
        await backend.add_source(run_id, parent, "model")
        assert source_pairs(await backend.sources(run_id)) == Counter(
            {(parent, None): 1, (data1, "dataset"): 1, (data2, "dataset"): 1, (parent, "model"): 1}
        )
        assert source_pairs(await backend.sources(run_id, "dataset")) == Counter(
            {(data1, "dataset"): 1, (data2, "dataset"): 1}
        )
        assert source_pairs(await backend.sources(run_id, "model")) == Counter(
            {(parent, "model"): 1}
        )
        assert list(await backend.sources(run_id, "no-such-artifact")) == []

    async def test_source_added_twice_is_stored_once(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        data = f"{run_id}-data"
        await backend.add_source(run_id, data, "dataset")
        await backend.add_source(run_id, data, "dataset")
        assert source_pairs(await backend.sources(run_id)) == Counter({(data, "dataset"): 1})

    async def test_lineage_parents_and_descendants(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        parent, child1, child2 = run_id, f"{run_id}-child1", f"{run_id}-child2"
        await backend.add_metadata(parent, role="parent")
        await backend.add_source(child1, parent, "model")
        await backend.add_source(child2, parent)
        up = await backend.lineage(child1)
        assert source_pairs(up.parents) == Counter({(parent, "model"): 1})
        assert list(up.descendants) == []
        down = await backend.lineage(parent)
        assert list(down.parents) == []
        assert {d.source_run_id for d in down.descendants} == {child1, child2}

    # -- run ids -------------------------------------------------------------------------------
    async def test_run_ids_with_and_without_parent(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        parent, child1, child2, other = (
            run_id,
            f"{run_id}-child1",
            f"{run_id}-child2",
            f"{run_id}-other",
        )
        await backend.add_metadata(parent, role="parent")
        await backend.add_source(child1, parent)
        await backend.add_metadata(child1, role="child")
        await backend.add_source(child2, parent, "model")
        await backend.add_metadata(other, role="unrelated")
        assert {parent, child1, child2, other} <= set(await backend.run_ids())
        assert sorted(await backend.run_ids(parent_run_id=parent)) == sorted([child1, child2])
        assert list(await backend.run_ids(parent_run_id=child1)) == []

    # -- metrics -------------------------------------------------------------------------------
    async def test_metrics_round_trip_ordered_by_step_then_time(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        await backend.add_metrics(
            run_id, [pt("loss", 0.5, 2, 3), pt("loss", 1.0, 0, 1), pt("acc", 0.1, 0, 1)]
        )
        await backend.add_metrics(
            run_id, [pt("loss", 0.6, 1, 4), pt("loss", 0.7, 1, 2), pt("acc", 0.2, 5, 2)]
        )
        got = await backend.metrics(run_id)
        assert set(got) == {"loss", "acc"}
        assert same_points(
            got["loss"],
            [
                pt("loss", 1.0, 0, 1),
                pt("loss", 0.7, 1, 2),
                pt("loss", 0.6, 1, 4),
                pt("loss", 0.5, 2, 3),
            ],
        ), got["loss"]
        assert same_points(got["acc"], [pt("acc", 0.1, 0, 1), pt("acc", 0.2, 5, 2)]), got["acc"]

    async def test_metrics_keep_nan_and_infinities(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        want = [
            pt("odd", math.nan, 0, 1),
            pt("odd", math.inf, 1, 2),
            pt("odd", -math.inf, 2, 3),
            pt("odd", -0.0, 3, 4),
            pt("odd", 1e300, 4, 5),
        ]
        await backend.add_metrics(run_id, want)
        got = (await backend.metrics(run_id))["odd"]
        assert same_points(got, want), got
        assert math.isnan(got[0].value)
        assert got[1].value == math.inf and got[2].value == -math.inf

    async def test_metric_batch_replayed_is_stored_once(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        # A replay after a crash: the batch as the spool kept it (same key, same points, same
        # client timestamps), with nothing marked done, written again.
        points = [pt("loss", 0.5, 0, 1), pt("loss", 0.4, 1, 2)]
        for _ in range(2):
            await backend.write_batch(run_id, Batch(seq=1, metrics=list(points), key=REPLAY_KEY))
        assert same_points((await backend.metrics(run_id))["loss"], points)

    async def test_metric_points_alike_are_all_kept(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        # Points of one step logged within one clock tick are distinct points, in one batch
        # or in two: none is merged with another.
        first = [pt("loss", 0.5, 0, 1), pt("loss", 0.25, 0, 1)]
        second = [pt("loss", 0.125, 0, 1)]
        await backend.write_batch(run_id, Batch(seq=1, metrics=first, key=REPLAY_KEY))
        await backend.write_batch(run_id, Batch(seq=2, metrics=second, key=REPLAY_KEY_2))
        got = (await backend.metrics(run_id))["loss"]
        assert sorted(p.value for p in got) == [0.125, 0.25, 0.5], got

    # -- batches -------------------------------------------------------------------------------
    def _batch(self, run_id: str) -> Batch:
        parent = f"{run_id}-parent"
        batch = Batch(
            seq=0,
            metadata={"lr": 0.1, "name": "bätch"},
            artifacts={
                "model": TrackerArtifact("model", "/m.pt", {"epoch": 1}),
                "log": TrackerArtifact("log", "/log.txt", None),
            },
            sources=[TrackerSource(parent, None), TrackerSource(parent, "model")],
            metrics=[pt("loss", 1.0, 0, 1), pt("loss", 0.5, 1, 2), pt("acc", math.nan, 0, 1)],
        )
        batch.records = 2 + 2 + 2 + 3
        return batch

    async def _assert_batch_stored(self, backend: AsyncTrackerBase, run_id: str) -> None:
        parent = f"{run_id}-parent"
        assert dict(await backend.metadata(run_id)) == {"lr": 0.1, "name": "bätch"}
        assert artifact_fields(await backend.artifacts(run_id)) == {
            "model": ("model", "/m.pt", {"epoch": 1}),
            "log": ("log", "/log.txt", None),
        }
        assert source_pairs(await backend.sources(run_id)) == Counter(
            {(parent, None): 1, (parent, "model"): 1}
        )
        got = await backend.metrics(run_id)
        assert same_points(got["loss"], [pt("loss", 1.0, 0, 1), pt("loss", 0.5, 1, 2)])
        assert same_points(got["acc"], [pt("acc", math.nan, 0, 1)])
        assert run_id in set(await backend.run_ids(parent_run_id=parent))

    async def test_write_batch_then_read(self, backend: AsyncTrackerBase, run_id: str) -> None:
        await backend.write_batch(run_id, self._batch(run_id))
        await self._assert_batch_stored(backend, run_id)

    async def test_write_batch_retried_does_not_duplicate(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        # A lane retries with the same Batch object after a failure; whatever the backend
        # recorded in batch.done the first time, the second call must not store parts twice.
        batch = self._batch(run_id)
        await backend.write_batch(run_id, batch)
        await backend.write_batch(run_id, batch)
        await self._assert_batch_stored(backend, run_id)

    async def test_write_batch_skips_parts_marked_done(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        # The first attempt stored the metadata and metrics, then failed: the retry comes with
        # those parts in batch.done (the names AsyncTrackerBase.write_batch uses).
        batch = self._batch(run_id)
        await backend.add_metadata(run_id, **batch.metadata)
        await backend.add_metrics(run_id, batch.metrics)
        batch.done.update({"metadata", "metrics"})
        await backend.write_batch(run_id, batch)
        await self._assert_batch_stored(backend, run_id)

    async def test_empty_batch_stores_nothing(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        await backend.write_batch(run_id, Batch(seq=0))
        assert dict(await backend.metadata(run_id)) == {}
        assert dict(await backend.metrics(run_id)) == {}

    # -- ids and absent runs -------------------------------------------------------------------
    async def test_non_ascii_run_ids(self, backend: AsyncTrackerBase, run_id: str) -> None:
        rid = f"実験/ü é 🚀-{run_id}"
        parent = f"親-{run_id}"
        await backend.add_metadata(rid, note="ok")
        await backend.add_artifact(rid, "モデル", "/tmp/ü.pt", {"ключ": "значение"})
        await backend.add_source(rid, parent, "データ")
        await backend.add_metrics(rid, [pt("損失", 0.5, 0, 1)])
        assert dict(await backend.metadata(rid)) == {"note": "ok"}
        assert artifact_fields(await backend.artifacts(rid)) == {
            "モデル": ("モデル", "/tmp/ü.pt", {"ключ": "значение"})
        }
        assert source_pairs(await backend.sources(rid)) == Counter({(parent, "データ"): 1})
        assert same_points((await backend.metrics(rid))["損失"], [pt("損失", 0.5, 0, 1)])
        assert rid in set(await backend.run_ids())
        assert list(await backend.run_ids(parent_run_id=parent)) == [rid]

    async def test_unknown_run_reads_are_empty(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        await backend.add_metadata(run_id, present=True)  # the store is not empty
        unknown = f"{run_id}-never-written"
        assert dict(await backend.metadata(unknown)) == {}
        assert dict(await backend.artifacts(unknown)) == {}
        assert list(await backend.sources(unknown)) == []
        assert list(await backend.sources(unknown, "model")) == []
        assert dict(await backend.metrics(unknown)) == {}
        lineage = await backend.lineage(unknown)
        assert list(lineage.parents) == [] and list(lineage.descendants) == []
        assert list(await backend.run_ids(parent_run_id=unknown)) == []
        assert unknown not in set(await backend.run_ids())

    # -- through AppRun ------------------------------------------------------------------------
    async def test_apprun_end_to_end(self, backend: AsyncTrackerBase, run_id: str) -> None:
        parent = f"{run_id}-parent"
        retry = RetryPolicy(initial_backoff_s=0, max_backoff_s=0, jitter_s=0)
        async with AppRun(run_id, [backend], flush_interval=3600, retry=retry) as run:
            run.add_metadata(lr=0.1, model="resnet")
            run.add_metadata(lr=0.2)
            run.add_artifact("ckpt", "/ckpt/1.pt", {"epoch": 1})
            run.add_artifact("ckpt", "/ckpt/2.pt", {"epoch": 2})
            run.add_source(parent, "model")
            for step in range(5):
                run.log_metric("loss", 1.0 / (step + 1), step=step)
            run.log_metrics({"acc": 0.5, "odd": math.inf}, step=0)
            run.log_metric("acc", math.nan)  # no step: the previous step plus one
            report = await run.aflush()
            assert report.ok, report
            assert report.pending == 0 and report.dropped == 0
            assert report.delivered == 2 + 2 + 1 + 5 + 2 + 1

            assert dict(await run.ametadata()) == {"lr": 0.2, "model": "resnet"}
            assert artifact_fields(await run.aartifacts()) == {
                "ckpt": ("ckpt", "/ckpt/2.pt", {"epoch": 2})
            }
            sources = await run.asources()
            assert [(s.parent.id, s.artifact_name) for s in sources] == [(parent, "model")]
            metrics = await run.ametrics()
            assert [p.value for p in metrics["loss"]] == [1.0 / (s + 1) for s in range(5)]
            assert [p.step for p in metrics["acc"]] == [0, 1]
            assert math.isnan(metrics["acc"][1].value)
            assert metrics["odd"][0].value == math.inf

            run.log_metric("loss", 0.01, step=99)  # delivered by close
        assert run.closed
        final = await backend.metrics(run_id)
        assert [p.step for p in final["loss"]] == [0, 1, 2, 3, 4, 99]
        assert run_id in set(await backend.run_ids(parent_run_id=parent))

    async def test_apprun_retries_the_mapped_faults_and_drops_only_the_refused_point(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        # The lane's real retry path (tenacity, rounds, the split of a refused batch) over
        # the backend's own bulk write, with the errors its mapping produces.
        transient, refused = self.mapped_faults()
        assert classify(transient) == "transient" and classify(refused) == "record"
        flaky = FlakyProxy(backend, transient, refused, fail=2, poison=-1.0)
        retry = RetryPolicy(max_attempts=5, initial_backoff_s=0, max_backoff_s=0, jitter_s=0)
        async with AppRun(run_id, [flaky], flush_interval=3600, retry=retry) as run:
            run.add_metadata(phase="flaky")
            for step in range(50):
                run.log_metric("loss", -1.0 if step == 7 else float(step), step=step)
            report = await run.aflush()
        assert report.delivered == 50 and report.dropped == 1, report
        assert report.refused["flaky"] and "records" in report.refused["flaky"][0]
        assert run.status().backends["flaky"].retries >= 2
        steps = [p.step for p in (await backend.metrics(run_id))["loss"]]
        assert steps == [s for s in range(50) if s != 7]  # each once, in order
        assert dict(await backend.metadata(run_id)) == {"phase": "flaky"}

    # -- the contract: validate, map_error, end_run / aclose(reason) -------------------------
    async def test_validate_accepts_what_the_suite_stores(self, backend: AsyncTrackerBase) -> None:
        backend.validate(METADATA)
        backend.validate(pt("loss", 1.0, 0, 0))
        backend.validate(TrackerArtifact("model", "/tmp/model.pt", {"size": 1}))
        backend.validate(TrackerSource("parent-run", "model"))

    async def test_validate_refuses_at_the_call_site_and_keeps_the_rest(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        bad = self.unstorable()
        if bad is None:
            pytest.skip("this backend stores whatever the generic checks let through")
        with pytest.raises((TypeError, ValueError)):
            backend.validate(bad)
        async with AppRun(run_id, [backend], flush_interval=3600) as run:
            with pytest.raises((TypeError, ValueError)):
                if isinstance(bad, TrackerMetric):
                    run.log_metrics({"good": 1.0, bad.name: bad.value}, step=0)
                elif isinstance(bad, TrackerArtifact):
                    run.add_artifact(bad.name, bad.path, bad.metadata)
                elif isinstance(bad, TrackerSource):
                    run.add_source(bad.source_run_id, bad.artifact_name)
                else:
                    run.add_metadata(good=1, **bad)
            run.log_metric("loss", 1.0, step=0)
            report = await run.aflush()
        assert report.ok and report.delivered == 1, report  # nothing of the refused call
        assert list(await backend.metrics(run_id)) == ["loss"]
        assert dict(await backend.metadata(run_id)) == {}

    async def test_map_error_sorts_the_libraries_errors(self, backend: AsyncTrackerBase) -> None:
        outage, refused = self.library_faults()
        assert classify(backend.map_error(outage)) == "transient"
        if refused is not None:
            assert classify(backend.map_error(refused)) == "record"
        # An error nobody knows keeps the records (never "record", which would drop them).
        assert classify(backend.map_error(RuntimeError("unknown"))) != "record"

    @pytest.mark.parametrize("reason", ["finished", "failed", "killed"])
    async def test_the_end_record_is_stored_last_by_write_batch(
        self, backend: AsyncTrackerBase, run_id: str, reason: CloseReason
    ) -> None:
        batch = Batch(
            1,
            metadata={"phase": "end"},
            metrics=[pt("loss", 1.0, 0, 0)],
            records=2,
            first=0,
            key=f"{1795000000000000000:019d}-{1795000000000000000:019d}x1a-{1:012d}",
            end=reason,
            end_time=1795000000.0,
        )
        await backend.write_batch(run_id, batch)
        assert END_PART in batch.done
        await backend.write_batch(run_id, batch)  # a retry: nothing left to do, no error
        assert dict(await backend.metadata(run_id)) == {"phase": "end"}
        assert [p.step for p in (await backend.metrics(run_id))["loss"]] == [0]
        assert await stored_end(backend, run_id) in (None, reason)

    async def test_a_closed_run_tells_the_backend_how_it_ended(
        self, backend: AsyncTrackerBase, run_id: str
    ) -> None:
        run = AppRun(run_id, [backend], flush_interval=3600, heartbeat_s=0)
        run.log_metric("loss", 1.0, step=0)
        report = await run.aclose(reason="killed")
        assert report.ok and report.delivered == 1, report
        assert await stored_end(backend, run_id) in (None, "killed")

    @pytest.mark.parametrize("reason", ["finished", "failed", "killed"])
    async def test_end_run_takes_every_reason_and_keeps_what_was_stored(
        self, backend: AsyncTrackerBase, run_id: str, reason: CloseReason
    ) -> None:
        await backend.add_metrics(run_id, [pt("loss", 1.0, 0, 0)])
        await backend.end_run(run_id, reason)
        assert [p.step for p in (await backend.metrics(run_id))["loss"]] == [0]


async def stored_end(backend: AsyncTrackerBase, run_id: str) -> str | None:
    """How the backend says ``run_id`` ended, where it can say (``run_status``, the memory
    backend's ``ended``); None where it cannot."""
    read = getattr(backend, "run_status", None)
    if callable(read):
        status = await read(run_id)
        return status[0] if isinstance(status, tuple) else status  # type: ignore[no-any-return]
    ended = getattr(backend, "ended", None)
    return ended(run_id) if callable(ended) else None  # type: ignore[no-any-return]
