"""The MLflow backend's native reader: the run list from ``search_runs``, not from points.

One ``search_runs`` request per page of 1,000 runs brings every run of the experiment with
its info (status, times), params, tags and latest metrics. The tags hold each writer's
summary of what it wrote (``summaries.py``), merged here by the store's rules
(:func:`async_tracker.store.summary.merge`); the params, tags and note come from the
metadata tags as :meth:`AsyncMLflowTracker.metadata` reads them, the status and end from
the run's info as :meth:`AsyncMLflowTracker.run_status` does. So a listing of N runs costs
``ceil(N / 1000)`` requests, where the generic reader costs several per run and one
``get_metric_history`` per metric of each.

A run whose summaries do not account for all of it is summarised from its points, as the
generic reader does, alone of the listing: a run no writer of this version wrote (an older
version, torchx, plain MLflow), a writer that found points no summary counted (``prior``),
a summary unreadable or omitted as too long, or a metric no summary names (a summary tag
removed). The summaries of such runs that have ended are kept by the reader while their
status, end and latest metrics stay the same: a dashboard polling the list reads their
points once.

Everything else (metadata, artifacts, lineage, metrics, scalars, status) is the generic
reader's, through the backend.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from async_tracker.backend.mlflow.mapping import TAG_HEARTBEAT, TAG_RUN_ID, TAG_RUN_KEY, run_key
from async_tracker.backend.mlflow.runs import run_id_of, start_order
from async_tracker.backend.mlflow.summaries import stored_summaries
from async_tracker.backend.mlflow.tracker import AsyncMLflowTracker, metadata_of, status_of
from async_tracker.records import TrackerMetric
from async_tracker.store.reader import GenericReader, summarize_points
from async_tracker.store.summary import MetricSummary, RunSummary, merge, stored_ending
from async_tracker.tags import split_metadata

# Run ids a search filter cannot quote: looked up by their tag only (as RunBook.named does).
_UNQUOTABLE = "'\"`\\"

_Fingerprint = tuple[object, ...]


@dataclasses.dataclass(frozen=True)
class _FromPoints:
    """What a run's points gave, kept while ``fingerprint`` (its status, end and latest
    metrics) stays the same."""

    fingerprint: _Fingerprint
    metrics: dict[str, MetricSummary]
    start: float | None
    heartbeat: float | None


class MLflowReader(GenericReader):
    """Reads an MLflow experiment (see the module's doc)."""

    backend: AsyncMLflowTracker

    def __init__(self, backend: AsyncMLflowTracker, label: str | None = None) -> None:
        super().__init__(
            backend,
            label or f"MLflow {backend.tracking_uri} (experiment {backend.experiment_name!r})",
        )
        # By MLflow run id; touched by the reader's coroutines (on the tracker loop), never by
        # the worker threads. A full listing keeps only the runs it met, so that deleted runs
        # do not pile up.
        self._from_points: dict[str, _FromPoints] = {}

    def __repr__(self) -> str:
        return f"MLflowReader({self.backend!r})"

    async def run_summaries(self) -> list[RunSummary]:
        runs = await self.backend.search_runs()
        by_id: dict[str, list[Any]] = {}
        for run in runs:
            by_id.setdefault(run_id_of(run), []).append(run)
        summaries = await self._summaries(by_id)
        met = {r.info.run_id for r in runs}
        self._from_points = {k: v for k, v in self._from_points.items() if k in met}
        return summaries

    async def run_summary(self, run_id: str) -> RunSummary | None:
        runs = await self._runs_of(run_id)
        if not runs:
            return None
        (summary,) = await self._summaries({run_id: runs})
        return summary

    async def run_exists(self, run_id: str) -> bool:
        return bool(await self._runs_of(run_id))

    async def _runs_of(self, run_id: str) -> list[Any]:
        """The MLflow runs of ``run_id``: tagged with its key, else (a run torchx's own
        tracker made) named after it. One or two requests."""
        runs = await self.backend.search_runs(f"tags.`{TAG_RUN_KEY}` = '{run_key(run_id)}'")
        if runs or any(c in run_id for c in _UNQUOTABLE):
            return runs
        named = await self.backend.search_runs(f"attributes.run_name = '{run_id}'")
        return [r for r in named if run_id_of(r) == run_id]

    async def _summaries(self, by_id: Mapping[str, Sequence[Any]]) -> list[RunSummary]:
        """The summary of each run id from its MLflow runs: from their tags, or, for the runs
        whose tags do not account for them, from their points (those read concurrently)."""
        chosen: list[tuple[str, Any]] = []
        generic: list[str] = []
        for run_id, runs in by_id.items():
            run = _the_run(runs)
            if run is None:
                generic.append(run_id)
            else:
                chosen.append((run_id, run))
        chosen.sort(key=lambda item: start_order(item[1]))  # as run_ids() lists them
        out: dict[str, RunSummary] = {}
        from_points: list[tuple[str, Any]] = []
        for run_id, run in chosen:
            summary = _from_tags(run_id, run)
            if summary is None:
                from_points.append((run_id, run))
            else:
                out[run_id] = summary
        if from_points:
            # Concurrently, as many at once as the backend sends requests of a flush: the
            # point reads are each a request per metric, and the listing waits for them all.
            limiter = anyio.CapacityLimiter(self.backend.request_concurrency)

            async def read(run_id: str, run: Any) -> None:
                async with limiter:
                    out[run_id] = await self._from_points_of(run_id, run)

            async with anyio.create_task_group() as tg:
                for run_id, run in from_points:
                    tg.start_soon(read, run_id, run)
        for run_id in generic:
            # Several runs named after the id and none of ours: the backend says which to
            # pick, or that it cannot (AmbiguousRunError), as the generic reader does.
            summary = await super().run_summary(run_id)
            if summary is not None:
                out[run_id] = summary
        return [out[run_id] for run_id, _ in chosen if run_id in out] + [
            out[run_id] for run_id in generic if run_id in out
        ]

    async def _from_points_of(self, run_id: str, run: Any) -> RunSummary:
        """The summary of ``run`` from every point of its metrics, as the generic reader
        makes it, without looking the run up again."""
        uuid = str(run.info.run_id)
        status, end = status_of(run.info)
        latest = run.data.metrics
        fingerprint = (
            str(run.info.status), run.info.end_time,
            tuple(sorted((k, repr(v)) for k, v in latest.items())),
        )  # fmt: skip
        kept = self._from_points.get(uuid)
        if kept is None or kept.fingerprint != fingerprint:
            history = await self.backend.metric_histories(uuid, latest) if latest else {}
            kept = _summarised(fingerprint, history)
            if status != "running":  # an ended run's points rarely change
                self._from_points[uuid] = kept
        metadata = metadata_of(run.data.tags)
        params, tags, note = split_metadata(metadata)
        return RunSummary(
            run_id=run_id,
            status=status,
            start=kept.start,
            end=end,
            heartbeat=kept.heartbeat,
            params=params,
            tags=tags,
            note=note,
            metrics=kept.metrics,
            ending=stored_ending(metadata, status),
        )


def _the_run(runs: Sequence[Any]) -> Any | None:
    """Of the MLflow runs of one run id, the one the backend reads and writes (see
    ``RunBook.resolve``): the oldest tagged with the id, else the only one named after it;
    None when several are named after it and none is tagged."""
    tagged = [r for r in runs if TAG_RUN_ID in r.data.tags]
    if tagged:
        return min(tagged, key=start_order)
    return runs[0] if len(runs) == 1 else None


def _from_tags(run_id: str, run: Any) -> RunSummary | None:
    """The summary of ``run`` from its tags and info alone, or None when its writers'
    summaries do not account for every point it holds (see the module's doc)."""
    tags: Mapping[str, str] = run.data.tags
    stored = stored_summaries(tags)
    writers = list(stored.writers.values())
    counted = {name for w in writers for name in w.metrics}
    latest = run.data.metrics
    if latest and not writers:
        return None  # points, and no summary of them
    if stored.unreadable or any(w.prior for w in writers) or not counted.issuperset(latest):
        return None
    status, end = status_of(run.info)
    merged = merge(run_id, writers, status, ended_at=end)
    beats = [t for t in (merged.heartbeat, _beat(tags.get(TAG_HEARTBEAT))) if t is not None]
    metadata = metadata_of(tags)
    params, run_tags, note = split_metadata(metadata)
    return dataclasses.replace(
        merged,
        heartbeat=max(beats) if beats else None,
        params=params,
        tags=run_tags,
        note=note,
        ending=stored_ending(metadata, status),
    )


def _summarised(
    fingerprint: _Fingerprint, history: Mapping[str, list[TrackerMetric]]
) -> _FromPoints:
    curves = {name: points for name, points in history.items() if points}
    stamps = [p.timestamp for points in curves.values() for p in points]
    return _FromPoints(
        fingerprint,
        {name: summarize_points(points) for name, points in curves.items()},
        min(stamps) if stamps else None,
        max(stamps) if stamps else None,
    )


def _beat(value: str | None) -> float | None:
    """The time of the run's last heartbeat tag, None without a readable one."""
    if value is None:
        return None
    try:
        when = json.loads(value)["time"]
        return float(when) if math.isfinite(float(when)) else None
    except (ValueError, TypeError, KeyError):
        return None


__all__ = ["MLflowReader"]
