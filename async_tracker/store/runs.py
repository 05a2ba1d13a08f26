"""The run list: which runs a listing shows, in which order (the summaries come from a
store's reader, :mod:`async_tracker.store.reader`)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from async_tracker.store.expr import parse_filter, parse_sort
from async_tracker.store.summary import RunSummary


def newest_first(runs: Sequence[RunSummary]) -> list[RunSummary]:
    """``runs`` by start time, the latest first; runs with no start (nothing written but
    their claim) last, by id."""
    order = newest_order([r.start for r in runs], [r.run_id for r in runs])
    return [runs[i] for i in order]


def newest_order(
    starts: Sequence[float | None], run_ids: Sequence[str], limit: int | None = None
) -> list[int]:
    """The positions of runs (``starts[i]`` and ``run_ids[i]`` are run ``i``'s) in
    :func:`newest_first`'s order, the first ``limit`` of them (None or 0: all): by start,
    the latest first (runs that started at the same time in the order given), then the
    runs with no start, by id. For a store that orders its runs before it makes their
    summaries (its index keeps each run's start)."""
    # Sorted by C calls alone (a key that is a bound method of a list of floats): a
    # listing of 100,000 runs sorts them at every call. (0.0: a run with no start, which
    # is not among the dated.)
    keys = [0.0 if start is None else -(start or 0.0) for start in starts]
    dated: Sequence[int] = range(len(keys))
    undated: list[int] = []
    if None in starts:
        dated = [i for i, start in enumerate(starts) if start is not None]
        undated = [i for i, start in enumerate(starts) if start is None]
    first = _first(keys, dated, limit)
    if limit is not None and limit > 0 and len(first) >= limit:
        return first[:limit]
    first += sorted(undated, key=run_ids.__getitem__)
    return first[:limit] if limit else first


def _first(keys: Sequence[float], positions: Sequence[int], limit: int | None) -> list[int]:
    """``sorted(positions, key=keys.__getitem__)[:limit]`` (``positions`` ascending). When
    ``limit`` is much smaller: first the limit-th smallest key, in one pass, and then the
    positions up to it alone sorted (those it leaves out could not be among the first), unless
    a key may be NaN, which no order holds (then every position is sorted, as ``sorted``
    would)."""
    key = keys.__getitem__
    if limit is not None and 0 < limit * 8 < len(positions) and not math.isnan(
        sum(map(key, positions))
    ):
        # Every key is a number (an inf and a -inf would sum to NaN: sorted in full).
        last = heapq.nsmallest(limit, map(key, positions))[-1]
        positions = [i for i in positions if keys[i] <= last]
    ordered = sorted(positions, key=key)
    return ordered[:limit] if limit is not None and limit > 0 else ordered


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


__all__ = ["newest_first", "newest_order", "select"]
