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

from async_tracker.adapters import as_sync
from async_tracker.base import TrackerBase
from async_tracker.init_run import open_store
from async_tracker.records import TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.runs import read_runs, select
from async_tracker.store.summary import RunSummary

# The columns of Store.metrics(), one row per point.
METRIC_COLUMNS = ("run", "name", "step", "value", "time")


class Store:
    """The runs of one store (a path or an fsspec URL, like ``init(dir=...)``), read-only.

    Args:
        url: the store; default ``$ASYNC_TRACKER_DIR``, else ``./tracker_runs``.
        tracker: instead of ``url``, any torchx ``TrackerBase`` (an MLflow or TensorBoard
            backend, a plug-in): read run by run through the tracker API.
    """

    def __init__(
        self, url: str | os.PathLike[str] | None = None, *, tracker: TrackerBase | None = None
    ) -> None:
        if tracker is not None and url is not None:
            raise ValueError("Store takes a url or a tracker, not both")
        self.tracker: TrackerBase = tracker if tracker is not None else as_sync(open_store(url))

    def __repr__(self) -> str:
        return f"Store({self.tracker!r})"

    def runs(
        self, filter: str | None = None, sort: str | None = None, limit: int | None = None
    ) -> list[RunSummary]:
        """The runs ``filter`` accepts (all without one), in ``sort``'s order (``[-]KEY``;
        default newest first), at most ``limit``. A bad filter or sort key raises
        :class:`~async_tracker.store.expr.FilterError` (a ``ValueError``) naming the
        column."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be None or >= 0, got {limit}")
        return select(read_runs(self.tracker), filter, sort, limit)[0]

    def run(self, run_id: str) -> RunSummary:
        """The summary of ``run_id``, or of the one run whose id starts with it; ``KeyError``
        naming the candidates otherwise."""
        runs = read_runs(self.tracker)
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
        rows: list[tuple[str, str, int, float, float]] = []
        for run_id in ids:
            # Every tracker of ours reads metrics; a plain torchx TrackerBase has none.
            read = getattr(self.tracker, "metrics", None)
            curves: dict[str, Sequence[TrackerMetric]] = dict(read(run_id)) if read else {}
            if not curves and not self._exists(run_id):
                raise KeyError(f"no run {run_id!r} in {self!r}")
            for name, points in curves.items():
                if wanted is None or name in wanted:
                    rows.extend((run_id, name, p.step, p.value, p.timestamp) for p in points)
        try:
            import pandas
        except ImportError:
            return [dict(zip(METRIC_COLUMNS, row)) for row in rows]
        return pandas.DataFrame.from_records(rows, columns=list(METRIC_COLUMNS))


    def _exists(self, run_id: str) -> bool:
        """Whether the store holds ``run_id``: asked about that run alone where the backend
        can (the fsspec store: its directory), else from the list of every run id."""
        exists = getattr(getattr(self.tracker, "async_tracker", None), "run_exists", None)
        if exists is not None:
            return bool(runtime().loop.call(exists, run_id))
        return run_id in set(self.tracker.run_ids())


def _run_id(run: RunSummary) -> str:
    return run.run_id


__all__ = ["METRIC_COLUMNS", "Store"]
