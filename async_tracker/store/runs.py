"""Many runs' summaries at once: what the run list reads.

A backend that keeps run summaries (the fsspec store: ``run_summaries()``, see
``backend/fsspec/summaries.py``) answers from them, in one pass over the store. Any other
tracker (MLflow, TensorBoard, a torchx plug-in) is read run by run through the tracker API:
its metadata, its metric curves and how it ended, summarised here the same way.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from async_tracker.base import TrackerBase
from async_tracker.runtime.process import runtime
from async_tracker.store.expr import parse_filter, parse_sort
from async_tracker.store.summary import MetricSummary, RunSummary


def read_runs(tracker: TrackerBase, cache: object | None = None) -> list[RunSummary]:
    """Every run's summary in ``tracker``'s store, in no particular order. ``cache``: what
    the backend's ``run_summaries`` keeps between reads of one reader (the fsspec store's
    ``SummaryFileCache``), passed on; ignored by a tracker without summaries."""
    inner = getattr(tracker, "async_tracker", tracker)
    read: Callable[..., Any] | None = getattr(inner, "run_summaries", None)
    if callable(read):
        is_async = inspect.iscoroutinefunction(read)
        if cache is not None:
            read = functools.partial(read, cache=cache)
        if is_async:
            result: list[RunSummary] = runtime().loop.call(read)
        else:
            result = read()
        return result
    return [_summary_of(tracker, run_id) for run_id in tracker.run_ids()]


def newest_first(runs: Sequence[RunSummary]) -> list[RunSummary]:
    """``runs`` by start time, the latest first; runs with no start (nothing written but
    their claim) last, by id."""
    dated = sorted((r for r in runs if r.start is not None), key=lambda r: -(r.start or 0.0))
    return dated + sorted((r for r in runs if r.start is None), key=lambda r: r.run_id)


def select(
    runs: Sequence[RunSummary],
    filter: str | None = None,
    sort: str | None = None,
    limit: int | None = None,
) -> tuple[list[RunSummary], int]:
    """The runs a list shows: those ``filter`` accepts (see :mod:`async_tracker.store.expr`),
    in ``sort``'s order (``[-]KEY``; default newest first), at most ``limit`` of them (None
    or 0: all); and how many ``limit`` left out. A bad filter or sort key raises
    :class:`~async_tracker.store.expr.FilterError` naming the column."""
    chosen = list(runs)
    if filter:
        accepts = parse_filter(filter)
        chosen = [r for r in chosen if accepts(r)]
    ordered = sorted(chosen, key=parse_sort(sort).key) if sort else newest_first(chosen)
    shown = ordered[:limit] if limit else ordered
    return shown, len(ordered) - len(shown)


def _summary_of(tracker: TrackerBase, run_id: str) -> RunSummary:
    """A run's summary through the tracker API (a tracker that keeps none)."""
    read = getattr(tracker, "metrics", None)
    curves: dict[str, Sequence[Any]] = (
        {n: p for n, p in read(run_id).items() if p} if callable(read) else {}
    )
    metrics = {}
    stamps = []
    for name, points in curves.items():
        values = [p.value for p in points if not math.isnan(p.value)]
        metrics[name] = MetricSummary(
            points[-1].value,
            min(values) if values else None,
            max(values) if values else None,
            len(points),
            points[-1].step,
        )
        stamps += [p.timestamp for p in points]
    status, end = _status(tracker, run_id)
    return RunSummary(
        run_id=run_id,
        status=status,
        start=min(stamps) if stamps else None,
        end=end,
        heartbeat=max(stamps) if stamps else None,
        params=dict(tracker.metadata(run_id)),
        metrics=metrics,
    )


def _status(tracker: TrackerBase, run_id: str) -> tuple[str, float | None]:
    inner = getattr(tracker, "async_tracker", tracker)
    read: Callable[..., Any] | None = getattr(inner, "run_status", None)
    if not callable(read):
        return "", None
    if inspect.iscoroutinefunction(read):
        result = runtime().loop.call(read, run_id)
    else:
        result = read(run_id)
    if isinstance(result, tuple):
        return str(result[0]), result[1]
    return ("running" if result is None else str(result)), None  # TensorBoard's: a str


__all__ = ["newest_first", "read_runs", "select"]
