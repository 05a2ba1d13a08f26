"""Many runs' summaries at once: what the run list reads.

A backend that keeps run summaries (the fsspec store: ``run_summaries()``, see its module)
answers from them, in one pass over the store. Any other tracker (MLflow, TensorBoard, a
torchx plug-in) is read run by run through the tracker API: its metadata, its metric curves
and how it ended, summarised here the same way.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from async_tracker.base import TrackerBase
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import MetricSummary, RunSummary


def read_runs(tracker: TrackerBase) -> list[RunSummary]:
    """Every run's summary in ``tracker``'s store, in no particular order."""
    inner = getattr(tracker, "async_tracker", tracker)
    read: Callable[..., Any] | None = getattr(inner, "run_summaries", None)
    if callable(read):
        if inspect.iscoroutinefunction(read):
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


def differing_params(runs: Sequence[RunSummary]) -> list[str]:
    """The param keys whose values are not the same in every run of ``runs`` (a key that
    some runs lack differs), in the order first met; with one run, its keys."""
    keys = list(dict.fromkeys(k for r in runs for k in r.params))
    if len(runs) <= 1:
        return keys
    missing = object()
    out = []
    for key in keys:
        first = runs[0].params.get(key, missing)
        if any(_differ(first, r.params.get(key, missing)) for r in runs[1:]):
            out.append(key)
    return out


def _differ(a: object, b: object) -> bool:
    try:
        return bool(a != b)
    except Exception:  # an object whose comparison fails (an array): compare its text
        return repr(a) != repr(b)


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


__all__ = ["differing_params", "newest_first", "read_runs"]
