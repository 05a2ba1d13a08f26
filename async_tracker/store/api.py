"""Reading a store from Python: its runs as summaries, filtered and sorted, and their metric
points as a long table (a pandas DataFrame when pandas is installed)::

    from async_tracker import Store

    store = Store("s3://bucket/runs")            # default: $ASYNC_TRACKER_DIR, ./tracker_runs
    best = store.runs(filter="status==finished and loss.min<0.2", sort="loss.min", limit=5)
    frame = store.metrics([r.run_id for r in best], names=["loss"])

The filter and sort language is :mod:`async_tracker.store.expr`'s, the one of ``async-tracker
list jobs --filter/--sort``. Reads go through the store's run summaries (one small object per
writer of a run), so listing thousands of runs never reads their points.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from async_tracker.adapters import TrackerLike
from async_tracker.base import AsyncTrackerBase
from async_tracker.store.open import open_reader
from async_tracker.store.summary import RunSummary
from async_tracker.store.sync_reader import Reader

# The columns of Store.metrics(), one row per point.
METRIC_COLUMNS = ("run", "name", "step", "value", "time")


class Store:
    """The runs of one store (a path or an fsspec URL, like ``init(dir=...)``), read-only.

    Args:
        url: the store; default ``$ASYNC_TRACKER_DIR``, else ``./tracker_runs``.
        tracker: instead of ``url``, any backend (an MLflow or TensorBoard backend, a torchx
            ``TrackerBase`` plug-in): read through its reader (see
            :mod:`async_tracker.store.reader`).
        timeout: how long each read may take, in seconds (default
            ``$ASYNC_TRACKER_READ_TIMEOUT``, else 30); past it
            :class:`~async_tracker.errors.ReadTimeoutError` names the store.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | None = None,
        *,
        tracker: AsyncTrackerBase | TrackerLike | None = None,
        timeout: float | None = None,
    ) -> None:
        if tracker is not None and url is not None:
            raise ValueError("Store takes a url or a tracker, not both")
        self.reader: Reader = open_reader(tracker if tracker is not None else url, timeout=timeout)

    def __repr__(self) -> str:
        return f"Store({self.reader.label!r})"

    def runs(
        self, filter: str | None = None, sort: str | None = None, limit: int | None = None
    ) -> list[RunSummary]:
        """The runs ``filter`` accepts (all without one), in ``sort``'s order (``[-]KEY``;
        default newest first), at most ``limit``. A bad filter or sort key raises
        :class:`~async_tracker.store.expr.FilterError` (a ``ValueError``) naming the
        column."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be None or >= 0, got {limit}")
        return self.reader.select_runs(filter, sort, limit)[0]

    def run(self, run_id: str) -> RunSummary:
        """The summary of ``run_id``, or of the one run whose id starts with it; ``KeyError``
        naming the candidates otherwise."""
        runs = self.reader.run_summaries()
        exact = [r for r in runs if r.run_id == run_id]
        if exact:
            return exact[0]
        matches = sorted((r for r in runs if r.run_id.startswith(run_id)), key=_run_id)
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise KeyError(f"no run {run_id!r} in {self!r}")
        names = ", ".join(r.run_id for r in matches[:5])
        raise KeyError(f"{run_id!r} names {len(matches)} runs ({names}...): give more of it")

    def metrics(
        self, run_ids: str | Iterable[str], names: Sequence[str] | None = None
    ) -> Any:
        """Every point of the runs ``run_ids`` (one id or several), of the metrics ``names``
        (all without it), in long format: the columns ``run``, ``name``, ``step``,
        ``value``, ``time`` (seconds since the epoch), runs in the order given, each
        metric's points in step order. A pandas ``DataFrame`` when pandas is installed
        (``pip install 'async-tracker[dataframe]'``), else a list of dicts with those keys.
        An unknown run id raises ``KeyError``."""
        ids = [run_ids] if isinstance(run_ids, str) else list(run_ids)
        wanted = None if names is None else set(names)
        parts: list[tuple[str, str, Any]] = []
        for run_id in ids:
            curves = self.reader.scalars(run_id, wanted).curves
            if not curves and not self.reader.run_exists(run_id):
                raise KeyError(f"no run {run_id!r} in {self!r}")
            parts.extend((run_id, name, points) for name, points in curves.items())
        import numpy as np

        try:
            import pandas
        except ImportError:
            return [
                dict(zip(METRIC_COLUMNS, (run, name, s, v, t)))
                for run, name, p in parts
                for s, v, t in zip(p.steps.tolist(), p.values.tolist(), p.times.tolist())
            ]
        # Columns made whole by numpy: no Python object per point.
        lengths = [len(p) for _, _, p in parts]
        return pandas.DataFrame({
            "run": np.repeat(np.array([r for r, _, _ in parts], dtype=object), lengths),
            "name": np.repeat(np.array([n for _, n, _ in parts], dtype=object), lengths),
            "step": _joined([p.steps for _, _, p in parts], np.int64),
            "value": _joined([p.values for _, _, p in parts], np.float64),
            "time": _joined([p.times for _, _, p in parts], np.float64),
        }, columns=list(METRIC_COLUMNS))  # fmt: skip


def _joined(arrays: list[Any], dtype: Any) -> Any:
    import numpy as np

    return np.concatenate(arrays) if arrays else np.empty(0, dtype)


def _run_id(run: RunSummary) -> str:
    return run.run_id


__all__ = ["METRIC_COLUMNS", "Store"]
