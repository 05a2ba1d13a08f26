"""The run list of the fsspec store: every run's summary, from the run index.

Summaries. Each process keeps, per run it writes, a summary of what it wrote (params, each
metric's last/min/max/count/last step, start, end, its last heartbeat; see
``async_tracker.store.summary``) and rewrites it whole at the end of each ``write_batch`` (a
flush boundary, never per point) and at each heartbeat (see ``writer.py``). Readers of the
run list (:func:`run_summaries`) read those files only, merging the writers' summaries. They
sit in the store's run index (``.index-*`` files at its root, see ``index.py``), not in the
run's directory, and hold the run id: the list costs one listing of the index and a read of
its checkpoint, plus one small read per summary written since the checkpoint, where a folder
per run would cost a listing per run. torchx's reader skips files at the root; the leading
dot hides them from ``ls``. A batch counts once in its
writer's summary whatever happens to it: it is named by the batch's writer token (a replay
by another process continues that writer's summary from the store), and the summary keeps
which batches it counts (see ``WriterSummary.counted``). A run without any summary (written
before summaries existed, or by torchx) is summarised from its files once, per writer token
found in the file names, and that is kept as the run's ``rebuilt`` summary; a writer's own
summary replaces the rebuilt part of its token, so nothing counts twice when a writer was
still writing while a reader rebuilt.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Mapping

import orjson

from async_tracker.backend.fsspec import index
from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.index import _Found
from async_tracker.backend.fsspec.indexcheckpoint import Checkpoint
from async_tracker.backend.fsspec.layout import (
    _STATUS_RANK,
    _SUMMARY_FILE,
    _UNPARSEABLE,
    METADATA_DIR,
    METRICS_DIR,
    REBUILT_TOKEN,
    RUN_PARTS,
    STATUS_DIR,
    TMP_DIR,
    _file_token,
    _write_order,
    summary_path,
)
from async_tracker.backend.fsspec.parsing import (
    _last_life_ending,
    _parse_metadata,
    _parse_status,
    _Skipped,
)
from async_tracker.backend.fsspec.reader import FsspecReader, points_of
from async_tracker.backend.fsspec.segments import _parse_segment
from async_tracker.backend.fsspec.storage import _decode_json, _encode_json, _gather_bounded
from async_tracker.errors import BackendError
from async_tracker.records import TrackerMetric
from async_tracker.runtime.process import run_blocking
from async_tracker.settings import CRASHED_AFTER_BEATS
from async_tracker.store.runs import newest_order
from async_tracker.store.summary import RunSummary, WriterSummary, merge, summarize_columns

logger = logging.getLogger(__name__)


class RunList:
    """The runs of one listing (:func:`run_list`): those it summarised, and those the run
    index's checkpoint gives as they are, by id, whose summaries are made from its rows
    when asked for: a list of 100,000 runs that shows the newest 20 makes 20."""

    def __init__(
        self,
        summarised: list[RunSummary],
        checkpoint: Checkpoint | None,
        ready: list[str],
        starts: list[float | None],
        endpoint: str,
    ) -> None:
        self.summarised = summarised
        self.checkpoint = checkpoint
        # The runs the checkpoint gives, and when each started (as its row keeps it).
        self.ready = ready if checkpoint is not None else []
        self.starts = starts if checkpoint is not None else []
        self.endpoint = endpoint

    async def summaries(self) -> list[RunSummary]:
        """Every run's summary: those summarised, then the checkpoint's (in a worker
        thread: the loop over every run of the store)."""
        if self.checkpoint is None or not self.ready:
            return list(self.summarised)
        made = await run_blocking(self.checkpoint.summaries, self.ready, endpoint=self.endpoint)
        return self.summarised + made

    async def newest(
        self, limit: int, run_ids: Collection[str] | None = None
    ) -> tuple[list[RunSummary], int]:
        """What ``select(await self.summaries(), limit=limit)`` gives (of the runs of
        ``run_ids``: all without it), with summaries made of the runs it shows alone."""
        return await run_blocking(self._newest, limit, run_ids, endpoint=self.endpoint)

    def _newest(
        self, limit: int, run_ids: Collection[str] | None
    ) -> tuple[list[RunSummary], int]:
        runs, ready, starts = self.summarised, self.ready, self.starts
        if run_ids is not None:
            runs = [r for r in runs if r.run_id in run_ids]
            kept = [i for i, run_id in enumerate(ready) if run_id in run_ids]
            ready, starts = [ready[i] for i in kept], [starts[i] for i in kept]
        # As summaries() lists them, the order select() starts from.
        every = [r.start for r in runs] + starts
        shown = newest_order(every, [r.run_id for r in runs] + ready, limit)
        k = len(runs)
        made = iter(
            self.checkpoint.summaries([ready[i - k] for i in shown if i >= k])
            if self.checkpoint is not None
            else ()
        )
        return [runs[i] if i < k else next(made) for i in shown], len(every) - len(shown)


async def run_summaries(
    reader: FsspecReader, now: float | None = None, *, cache: SummaryFileCache | None = None
) -> list[RunSummary]:
    """Every run's summary (in no particular order): :func:`run_list`'s, all made."""
    return await (await run_list(reader, now, cache=cache)).summaries()


async def run_list(
    reader: FsspecReader, now: float | None = None, *, cache: SummaryFileCache | None = None
) -> RunList:
    """Every run of the store (in no particular order), from the writers' summary files:
    one listing of the store's run index, a read of its checkpoint and of each summary file
    written since (see ``index.py``; on local disk in one worker-thread call each). A
    listing may then compact the index (:func:`index.compact`).

    The status comes from the summaries' endings, by :meth:`FsspecReader.run_status`'s
    rules. A run no summary says ended is ``running`` while a writer's heartbeat in its
    summary is recent; else (every heartbeat old, or none: torchx's runs) it gets
    :meth:`FsspecReader.run_status` itself, from its status and heartbeat files:
    ``crashed``, an ending its summary does not hold yet (a write that failed between the
    two), or ``running``. A run without any summary (written before summaries existed, or by
    torchx) is summarised from its files once, and that is kept as its ``rebuilt``
    summary if the store takes it (a read-only store: rebuilt again at the next read).

    ``cache``: a reader that lists the store again and again (the dashboard) passes the
    same :class:`SummaryFileCache` each time; a summary file unchanged since (on local
    disk its inode, size and mtime; on an object store its size and ETag) is then not
    read again, nor the checkpoint decoded again."""
    now = time.time() if now is None else now
    for _ in range(3):
        skipped = _Skipped()
        if cache is not None:
            cache.start_pass()
        state = await index.read(reader, now, skipped, cache, _add_summary)
        # A file gone between the listing and its read: removed by a compaction meanwhile,
        # which put it in a newer checkpoint. List again.
        if not state.vanished:
            break
    found = state.found
    # Runs without any summary, or that a writer found with records and no summary.
    missing = [
        f for f in found
        if f.rebuilt is None and (not f.writers or any(w.prior for w in f.writers.values()))
    ]  # fmt: skip
    rebuilt = await _gather_bounded([_rebuild(reader, f.run_id, skipped) for f in missing])
    for f, writers in zip(missing, rebuilt):
        f.rebuilt = writers  # None: not a run (a source's descendants alone)
    runs = [f for f in found if f.writers or f.rebuilt is not None]
    endings: list[tuple[str, float] | None] = []
    for f in runs:
        summaries = list(f.merged().values())
        ended = [
            (w.status, w.end, w.life_start, w.life)
            for w in summaries
            if w.status in _STATUS_RANK and w.end is not None
        ]
        # The lives of writers that have not ended: a requeued run's new life overtakes
        # the ending of the one before it (see _last_life_ending).
        unended = [w.life for w in summaries if w.end is None]
        endings.append(_last_life_ending(ended, unended) if ended else None)
    live: dict[str, tuple[str, float | None]] = {}
    for f, e in zip(runs, endings):
        beats = [w.beat for w in f.merged().values() if w.beat is not None]
        if e is None and any(now - t <= CRASHED_AFTER_BEATS * every for t, every in beats):
            live[f.run_id] = ("running", None)
    asked = [f.run_id for f, e in zip(runs, endings) if e is None and f.run_id not in live]
    statuses = dict(
        zip(
            asked,
            await _gather_bounded([reader.run_status(r, now, cache=cache) for r in asked]),
        )
    )
    statuses.update(live)
    if cache is not None:
        cache.end_pass()  # what this listing did not see is gone from the store
    skipped.warn()
    out = []
    for f, ending in zip(runs, endings):
        status, when = ending if ending is not None else statuses[f.run_id]
        beat = when if status == "crashed" else None
        out.append(merge(f.run_id, f.merged().values(), status, beat, when))
    await index.compact(reader, state, runs, out, now, cache)
    return RunList(
        out, state.checkpoint, state.ready_ids, state.ready_starts, reader.storage.endpoint
    )


async def _rebuild(
    reader: FsspecReader, run_id: str, skipped: _Skipped
) -> dict[str, WriterSummary] | None:
    """The summary of each writer token found in the run's file names (``""`` for files
    named otherwise: torchx's), from its metadata, metric segments and status files;
    None if the directory is not a run's. Kept as the run's ``rebuilt`` summary, best
    effort. Each writer's own summary replaces its part at read, so a writer that wrote
    while this ran is never counted twice; a writer of an older version (or torchx's)
    that writes after it is not seen by later reads (the rebuilt summary is not redone)."""
    entries = await reader.storage.ls_or_none(reader.run_dir(run_id))
    if entries is None or RUN_PARTS.isdisjoint(name for name, _ in entries):
        return None
    present = {name for name, _ in entries}
    meta_dir = reader.path(run_id, METADATA_DIR)
    meta = (
        await reader.parsed(meta_dir, _parse_metadata, skipped)
        if METADATA_DIR in present
        else []
    )
    segments = (
        (await reader.metric_segments(run_id, _parse_segment, points_of, skipped=skipped)).segments
        if METRICS_DIR in present
        else []
    )
    ends = (
        await reader.parsed(reader.path(run_id, STATUS_DIR), _parse_status, skipped)
        if STATUS_DIR in present
        else []
    )
    params: dict[str, dict[str, tuple[int, object]]] = {}
    times: dict[str, list[float]] = {}
    for name, values in sorted(meta, key=lambda e: _write_order(e[0])):
        token, stamp = _file_token(name), _write_order(name)[0]
        for key, value in values.items():
            params.setdefault(token, {})[key] = (max(stamp, 0), value)
        if stamp > 0:
            times.setdefault(token, []).append(stamp / 1e9)
    points: dict[str, dict[str, list[TrackerMetric]]] = {}
    for name, parsed in segments:
        # A compacted file is one writer's: its name carries the token, as its inputs' did.
        for metric, pts in parsed.items():
            points.setdefault(_file_token(name), {}).setdefault(metric, []).extend(pts)
    writers: dict[str, WriterSummary] = {}
    for token in {*params, *points, *(n[: -len(".json")] for n, _ in ends)}:
        # Segments read in write order: each metric's points in call order.
        columns = {
            metric: (
                [p.step for p in pts], [p.value for p in pts], [p.timestamp for p in pts]
            )
            for metric, pts in points.get(token, {}).items()
        }
        metrics, first = summarize_columns(columns)
        stamps = times.get(token, [])
        last = max((p.timestamp for pts in points.get(token, {}).values() for p in pts),
                   default=None)  # fmt: skip
        ending = next((e for n, e in ends if n == f"{token}.json"), None)
        # As a writer counts it: its first record (a point, a metadata write, its end).
        earliest = min([first, *stamps, *((ending[1],) if ending else ())])
        start = earliest if math.isfinite(earliest) else None
        updated = max(
            [t for t in (last, *stamps, ending[1] if ending else None) if t is not None],
            default=None,
        )
        writers[token] = WriterSummary(
            start=start, updated=updated, params=params.get(token, {}), metrics=metrics,
            status=ending[0] if ending else None, end=ending[1] if ending else None,
            life_start=ending[2] if ending else 0.0, life=ending[3] if ending else 0,
        )  # fmt: skip
    path = summary_path(reader.root_dir, run_id, REBUILT_TOKEN)
    content = {"v": 1, "run": run_id, "writers": {t: w.to_json() for t, w in writers.items()}}
    try:
        await reader.storage.put(path, _encode_json(content, path), reader.path(run_id, TMP_DIR))
    except BackendError as exc:  # a read-only store: rebuilt again next time
        logger.debug("async_tracker: cannot keep the rebuilt summary %s: %s", path, exc)
    return writers


def _add_summary(found: Mapping[str, _Found], name: str, data: bytes | None) -> str:
    """Adds the summary file ``name`` (its content ``data``) to its run in ``found``; what is
    wrong with it ("" if nothing). A file removed meanwhile (None), or the summary of a run
    whose directory is gone (deleted while a writer still wrote), is passed over."""
    matched = _SUMMARY_FILE.fullmatch(name)
    if data is None or matched is None:
        return ""
    try:
        content = _decode_json(data)  # exactly: NaN, huge and deep params too
        if not isinstance(content, dict) or content.get("v") != 1:
            raise ValueError("not a run summary (version 1)")
        f = found.get(str(content["run"]))
        if f is None:
            return ""
        if matched.group(1) == REBUILT_TOKEN:
            f.rebuilt = {
                str(t): WriterSummary.from_json(w) for t, w in dict(content["writers"]).items()
            }
        else:
            f.writers[matched.group(1)] = WriterSummary.from_json(content)
    except (*_UNPARSEABLE, orjson.JSONDecodeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""
