"""A run's metric files as columns (:class:`~async_tracker.store.reader.Scalars`), for the
fsspec store's reader (``runreader.py``). It works with numpy, so the reader imports it
with the metric codec, at its first read of points, in a worker thread: a process that
lists runs and reads no point (``async-tracker list jobs``) never loads numpy or pyarrow."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from async_tracker.backend.fsspec.columns import parse_segment, times_array
from async_tracker.backend.fsspec.metricfiles import MetricsCursor
from async_tracker.backend.fsspec.parquet import Columns
from async_tracker.backend.fsspec.reader import FsspecReader, MetricSegments
from async_tracker.store.reader import Scalars, ScalarsRead


async def read_scalars(
    store: FsspecReader,
    run_id: str,
    names: Collection[str] | None = None,
    since: object | None = None,
    after_read: Callable[[str, MetricSegments[dict[str, Scalars]]], None] | None = None,
) -> ScalarsRead:
    """See :meth:`~async_tracker.backend.fsspec.runreader.FsspecRunReader.scalars`;
    ``after_read`` is given what was read (the reader's compactions look at it)."""
    cursor = since if isinstance(since, MetricsCursor) else None
    read = await store.metric_segments(run_id, _json_scalars, _scalars, since=cursor, names=names)
    if after_read is not None:
        after_read(run_id, read)
    joined = _by_name((curves for _, curves in read.segments), names)
    return ScalarsRead({n: c for n, c in joined.items() if len(c)}, read.cursor, read.reset)


async def read_overview(
    store: FsspecReader, run_id: str, names: Collection[str] | None = None
) -> dict[str, Scalars] | None:
    """See :meth:`~async_tracker.backend.fsspec.runreader.FsspecRunReader.overview`."""
    parts = await store.overview_segments(run_id, _scalars, names)
    if parts is None:
        return None
    return {n: c for n, c in _by_name(parts, names).items() if len(c)}


def _by_name(
    files: Iterable[Mapping[str, Scalars]], names: Collection[str] | None
) -> dict[str, Scalars]:
    """The curves of ``files`` (in write order) joined per metric (those of ``names``)."""
    parts: dict[str, list[Scalars]] = {}
    for curves in files:
        for name, part in curves.items():
            if names is None or name in names:
                parts.setdefault(name, []).append(part)
    return {name: _joined(group) for name, group in parts.items()}


def _scalars(columns: Mapping[str, Columns]) -> dict[str, Scalars]:
    """A Parquet file's decoded columns (times read) as Scalars, in file order."""
    out = {}
    for name, col in columns.items():
        assert col.times is not None
        out[name] = Scalars(col.steps, col.values, col.times)
    return out


def _json_scalars(data: bytes) -> tuple[dict[str, Scalars], str]:
    """A JSON Lines segment as Scalars, in file order, and the lines skipped."""
    chunks, bad = parse_segment(data)
    curves = {
        name: Scalars(chunk.steps.astype(np.int64), chunk.values, times_array(chunk.times))
        for name, chunk in chunks.items()
    }
    return curves, bad


def _joined(parts: Sequence[Scalars]) -> Scalars:
    """One metric's parts (files in write order, each in its order) as one, sorted by step,
    stably: points of one step keep write order."""
    if len(parts) == 1:
        steps, values, times = parts[0].steps, parts[0].values, parts[0].times
    else:
        steps = np.concatenate([p.steps for p in parts])
        values = np.concatenate([p.values for p in parts])
        times = np.concatenate([p.times for p in parts])
    if len(steps) > 1 and not bool(np.all(steps[1:] >= steps[:-1])):
        order = np.argsort(steps, kind="stable")
        steps, values, times = steps[order], values[order], times[order]
    return Scalars(steps, values, times)


__all__ = ["read_overview", "read_scalars"]
