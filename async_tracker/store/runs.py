"""The run list: which runs a listing shows, in which order (the summaries come from a
store's reader, :mod:`async_tracker.store.reader`)."""

from __future__ import annotations

from collections.abc import Sequence

from async_tracker.store.expr import parse_filter, parse_sort
from async_tracker.store.summary import RunSummary


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


__all__ = ["newest_first", "select"]
