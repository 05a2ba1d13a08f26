"""The write half of the fsspec store: :class:`FsspecWriter`, one batch at a time.

Names of metadata and metric files start with the time, a tag unique to the process and a
counter (see ``layout.py``); a batch that has a ``key`` is named after it, so that a retry,
or a replay by another process after a crash, overwrites instead of duplicating.

Metadata, many processes. Each key written gets a file of its own, named by the stamp of its
call (``Batch.metadata_ns``: a hybrid-clock time in ns, which never goes back within the
writing process; see ``async_tracker.clock.HybridClock``), and a writer never rewrites what it
wrote before: readers merge files by that time, so the last write of each key wins across
processes, and a process's clock stepped back never lets its earlier write win. Stamps are
plain ns times in the same 19 digits, so files written before stamps existed (named by the
wall time of the call, or of the cut) merge with new ones by their times.

torchx's reader merges files in listing order (hash order on local disks), so after each
write the writer lists the directory and removes every key file that a newer file of the same
key supersedes. Whichever of two writers lists last sees both files, so once writers are done
one file per key is left, the newest, and torchx's reader sees what ours does (no lock, no
read-modify-write).

Lineage. Each edge is a file named after the edge (source, digest of the artifact name), in
the run's ``parents/`` and in the source's ``descendants/``: written whole, never read and
rewritten, so concurrent writers never lose one. ``sources/<base32(src)>`` is also kept for
torchx's reader (read, merged, rewritten); our readers take the union of all three.

After each ``write_batch`` (a flush boundary) the writer rewrites its summary of the run
in the store's run index (see ``summaries.py`` and ``index.py``), and at each heartbeat.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import posixpath
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio
import orjson

from async_tracker.backend.fsspec import index, indexfold
from async_tracker.backend.fsspec.layout import (
    _DIGEST,
    _KEY_FILE,
    _KEY_TOKEN,
    _RECORD_PARTS,
    _UNPARSEABLE,
    ARTIFACTS_DIR,
    CLAIM_FILE,
    DESCENDANTS_DIR,
    HEARTBEAT_DIR,
    METADATA_DIR,
    METRIC_CODEC,
    METRICS_DIR,
    OVERVIEW_DIR,
    PARENTS_DIR,
    SOURCES_DIR,
    STATUS_DIR,
    TMP_DIR,
    _digest,
    _names,
    decode_run_id,
    encode_run_id,
    legacy_summary_path,
    run_path,
    summary_path,
)
from async_tracker.backend.fsspec.segments import _columns_by_name, _encode_column
from async_tracker.backend.fsspec.storage import (
    NotADirectory,
    _decode_json,
    _encode_json,
    _gather_bounded,
    _mapped,
    _Storage,
)
from async_tracker.backend.fsspec.summaries import _add_summary
from async_tracker.base import END_PART, CloseReason
from async_tracker.errors import BackendError, RecordError
from async_tracker.records import Batch, MetricRow, TrackerMetric
from async_tracker.runtime.process import import_in_thread, lazy_imports, run_blocking
from async_tracker.store.summary import WriterSummary, _Columns, summarize_columns

# The Parquet modules (numpy, pyarrow) are imported at the first write of metrics, not with
# the package: a process that imports async_tracker and writes no metrics never loads them.
# Under lazy_imports: a fork waits for the import (see runtime/process.py).
if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from async_tracker.backend.fsspec.parquet import SegmentError

logger = logging.getLogger(__name__)

# The most a writer spends compacting its segments of a run, in the batch that ends the run
# (see FsspecWriter.compact_segments). Measured here: ten segments of a million points each
# (75 MB) took 1.8 s on a local disk; on an object store, reading the segments dominates.
COMPACTION_BUDGET_S = 5.0


class FsspecWriter:
    """Writes runs under ``root_dir`` through ``storage``: the write half of
    :class:`~async_tracker.backend.fsspec.AsyncFsspecTracker`, and the owner of what this
    process keeps of the runs it writes (its summary of each, its last heartbeat)."""

    def __init__(self, storage: _Storage, root_dir: str) -> None:
        self._storage = storage
        self.root_dir = root_dir
        # This process's summary of each (run, writer token) it writes: touched on the loop
        # only (write_batch and the direct calls), each behind its own lock.
        self._tallies: dict[tuple[str, str], _Tally] = {}
        # This process's last heartbeat of each run it writes: (time, interval_s).
        self._beats: dict[str, tuple[float, float]] = {}
        # The claim of each run it beats, as its last heartbeat read it (see _check_claim).
        self._claims: dict[str, bytes] = {}

    def _run_dir(self, run_id: str) -> str:
        return run_path(self.root_dir, run_id)

    def _path(self, run_id: str, *parts: str) -> str:
        return run_path(self.root_dir, run_id, *parts)

    async def _put_json(self, run_id: str, path: str, content: object) -> None:
        await self._storage.put(path, _encode_json(content, path), self._path(run_id, TMP_DIR))

    # -- the run's life -------------------------------------------------------------------------
    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        """Records how the run ended, now, in ``status/<writer token>.json`` (this process's
        token). The end record of a batch is written by :meth:`write_batch`, named by the
        token of the pipeline that sealed it and stamped with its time: a replay of it
        (another process, ``async-tracker sync``) overwrites, never adds an ending."""
        await self._direct_tally(run_id)
        when = time.time()
        await self._write_status(run_id, reason, when, _names.token)
        await self._count_direct(run_id, end=(reason, when, 0.0))

    async def claim_run(self, run_id: str, claim: Mapping[str, object]) -> bool:
        """Claims ``run_id`` by creating its ``claim.json`` (holding ``claim``) if absent, in
        one atomic step (see :meth:`_Storage.create`): True if this call created it, False
        if the run was claimed already (by any process, on any host)."""
        path = self._path(run_id, CLAIM_FILE)
        if not await self._storage.create(path, _encode_json(dict(claim), path)):
            return False
        # Listed from now on, before its first summary. Best effort: a run the index does
        # not name yet is listed at its first summary (or found at a listing of the root).
        with contextlib.suppress(BackendError):
            await index.add_claim(self._storage, self.root_dir, run_id)
        return True

    async def delete_run(self, run_id: str) -> bool:
        """Removes the run's directory and everything in it (records, summaries, status,
        heartbeats, its claim), after the run's edges in its sources' ``descendants/`` (so
        that their lineage no longer names it). A process still writing the run writes its
        next files again; nothing stops it, but its next heartbeat notices (see
        :meth:`_check_claim`)."""
        me = encode_run_id(run_id)
        try:
            parents = await self._storage.ls(self._path(run_id, PARENTS_DIR))
        except NotADirectory:
            parents = []
        edges = []
        for name, _ in parents:
            source, dot, digest = name.partition(".")
            if dot and decode_run_id(source) is not None and _DIGEST.fullmatch(digest):
                back = posixpath.join(self.root_dir, source, DESCENDANTS_DIR, f"{me}.{digest}")
                edges.append(back)
        await self._storage.rm_many(edges)
        await self._storage.rm_tree(self._run_dir(run_id))
        # The summaries after the directory, with a tombstone in the run index: a reader
        # never sees a run without its summaries (which it would rebuild and keep).
        await index.remove_run(self._storage, self.root_dir, run_id)
        # This process's summaries of the run would otherwise carry on from the deleted one.
        for key in [k for k in self._tallies if k[0] == run_id]:
            del self._tallies[key]
        self._claims.pop(run_id, None)  # gone by this process's hand: nothing to report
        return True

    async def _write_status(
        self,
        run_id: str,
        reason: CloseReason,
        when: float,
        writer: str,
        started: float = 0.0,
        life: int = 0,
    ) -> None:
        # One file per writer, so ranks ending one run never overwrite each other.
        path = self._path(run_id, STATUS_DIR, f"{writer}.json")
        content: dict[str, object] = {"status": reason, "time": when}
        if started:
            content["started"] = started
        if life:
            content["life"] = life
        with _mapped(f"write of run {run_id!r}"):
            await self._put_json(run_id, path, content)

    async def heartbeat(
        self, run_id: str, interval_s: float, delivery: Mapping[str, object] | None = None
    ) -> None:
        """Writes ``heartbeat/<writer token>.json``: the time now and the interval, which
        readers need to tell a live run from a crashed one (see ``FsspecReader.run_status``),
        and the lane's ``delivery`` state (lag, spooled, last error: what the dashboard shows
        of a live writer)."""
        now = time.time()
        await self._check_claim(run_id)
        path = self._path(run_id, HEARTBEAT_DIR, f"{_names.token}.json")
        content: dict[str, object] = {"time": now, "interval_s": interval_s}
        if delivery is not None:
            content["delivery"] = dict(delivery)
        with _mapped(f"write of run {run_id!r}"):
            await self._put_json(run_id, path, content)
            # The same beat in the summaries this process writes of the run (its batches'
            # writer token; replays of other processes' batches too: this process is live),
            # which the run list reads alone; one not written yet takes it with its first
            # batch (see _update_summary).
            self._beats[run_id] = (now, interval_s)
            said = (delivery or {}).get("life")
            life = said if isinstance(said, int) and not isinstance(said, bool) else 0
            for (run, _), tally in list(self._tallies.items()):
                if run == run_id and tally.loaded:
                    async with tally.lock:
                        tally.summary = dataclasses.replace(
                            tally.summary, beat=(now, interval_s),
                            life=max(life, tally.summary.life),
                        )  # fmt: skip
                        await self._put_summary(run_id, tally)

    async def _check_claim(self, run_id: str) -> None:
        """At each heartbeat (every ~30 s, off the hot path): whether the run was removed from
        the store (``rm --force``, by any process) while this process writes it. Its claim
        (``claim.json``) is made once, never rewritten, and removed only with the run: a
        claim gone, or another one in its place (another writer of the run noticed first and
        claimed it anew), since the last heartbeat means the run was removed. Then this
        process's summaries of the run would make it again with counts and params the store
        no longer holds: they start anew, empty (what this process writes from now on is
        counted; what it wrote between the removal and now is in the store, uncounted), one
        warning says so, and the run is claimed again, so that the next removal is noticed
        too. A run without a claim (opened by ``AppRun`` rather than ``init()``, or by an
        older version) is claimed at its first heartbeat here. A failed lookup is left to
        the next heartbeat: this one is written anyway."""
        path = self._path(run_id, CLAIM_FILE)
        try:
            claim = await self._storage.get(path)
            if claim is None:
                mine = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                        "time": time.time(), "writer": _names.token}  # fmt: skip
                claim = _encode_json(mine, path)
                if not await self.claim_run(run_id, mine):
                    claim = await self._storage.get(path)  # another process's, meanwhile
        except BackendError as exc:
            logger.debug("async_tracker: cannot look up the claim of run %r: %s", run_id, exc)
            return
        if not claim:
            return  # being written (an exclusive create shows empty for a moment): next beat
        seen, self._claims[run_id] = self._claims.get(run_id), claim
        held = [t for (run, _), t in list(self._tallies.items()) if run == run_id]
        if seen is None or seen == claim or not held:
            return
        logger.warning(
            "async_tracker: run %r was removed from the store while this process was writing "
            "it; what it writes from now on starts the run anew",
            run_id,
        )
        for tally in held:
            # In place, under its lock: a batch being counted meanwhile lands before the
            # reset or after it, on the new summary, and its summary write is followed by
            # this heartbeat's. Loaded: what the store holds of it now is not to be continued.
            async with tally.lock:
                tally.summary = WriterSummary()
                tally.loaded = True

    # -- writes ---------------------------------------------------------------------------------
    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Writes the parts of ``batch`` not yet done. Any failure leaves as one
        :class:`~async_tracker.errors.BackendError` naming the file (see :func:`map_error`)."""
        with _mapped(f"write of run {run_id!r}"):
            await self._write_batch(run_id, batch)

    async def _write_batch(self, run_id: str, batch: Batch) -> None:
        found = _KEY_TOKEN.match(batch.key)
        writer = found.group(1) if found else _names.token
        if (run_id, writer) not in self._tallies:
            # A pipeline's writer begins here; its end batch drops the tally (below).
            indexfold.writer_started(self.root_dir)
        tally = self._tally(run_id, writer)
        await self._load_early(run_id, tally)
        if batch.metadata and "metadata" not in batch.done:
            tag = batch.key or batch.names.setdefault("metadata", _names.new())
            await self._write_metadata(run_id, batch.metadata, tag, batch.metadata_ns)
            batch.done.add("metadata")
        for art in batch.artifacts.values():
            part = f"artifact:{art.name}"
            if part not in batch.done:
                await self.add_artifact(run_id, art.name, art.path, art.metadata)
                batch.done.add(part)
        for src in batch.sources:
            part = f"source:{src.source_run_id}:{src.artifact_name or ''}"
            if part not in batch.done:
                await self.add_source(run_id, src.source_run_id, src.artifact_name)
                batch.done.add(part)
        counted = tally.summary.counted(batch.key, batch.seq)
        columns = (
            await self._batch_columns(batch.metric_rows())
            if batch.points() and ("metrics" not in batch.done or not counted)
            else {}
        )
        if "metrics" not in batch.done and batch.points():
            with lazy_imports:  # see the imports (loaded by _batch_columns)
                from async_tracker.backend.fsspec.metricfiles import row_writer

            await self._write_segment(
                run_id, batch.metric_rows(), batch.names, batch.key, columns,
                writer=row_writer(writer, batch.key), first_seq=batch.first,
            )  # fmt: skip
            batch.done.add("metrics")
        when = batch.end_time or time.time()
        if batch.end is not None and END_PART not in batch.done:
            # The run's end follows everything it recorded (its summary aside).
            await self._write_status(
                run_id, batch.end, when, writer, batch.life_start, batch.life
            )
            batch.done.add(END_PART)
        if batch.end is not None:
            # This writer wrote its last segment of the run: one file of them all. Again at a
            # retry of the batch (it finds one file, or finishes what a crash left).
            await self.compact_segments(run_id, writer)
        # Last, at this flush boundary: the writer's summary with this batch counted (once,
        # whatever was retried or replayed). A failure here fails the batch, whose retry
        # skips the parts above and writes the summary again.
        tag = batch.names.get("metadata") or batch.key
        params = _stamped(batch.metadata, batch.metadata_ns, tag)
        end = None if batch.end is None else (str(batch.end), when, batch.life_start)
        await self._update_summary(
            run_id, tally, None if counted else (batch.key, batch.seq, params, columns, end),
            batch.life,
        )
        if batch.end is not None:
            # This writer's summary says it ended, so a fold may take it off the root. Started
            # beside, not awaited: the batch is written whatever the fold does, and its
            # acknowledgement (the close's report) does not wait for it.
            indexfold.fold_soon(self._storage, self.root_dir)
            self._tallies.pop((run_id, writer), None)  # a later life reloads it from the store
            self._beats.pop(run_id, None)
            self._claims.pop(run_id, None)

    async def _batch_columns(self, rows: Sequence[MetricRow]) -> Mapping[str, _Columns]:
        """Each name's steps, values and times of a batch's points: numpy arrays made once
        for the segment and the summary alike where the batch allows (see
        ``parquet.row_columns``), else Python sequences (``_columns_by_name``)."""
        await import_in_thread(METRIC_CODEC, endpoint=self._storage.endpoint)
        with lazy_imports:  # see the imports
            from async_tracker.backend.fsspec.parquet import row_columns

        arrays = row_columns(rows)
        return arrays if arrays is not None else _columns_by_name(rows)

    def _tally(self, run_id: str, writer: str) -> _Tally:
        tally = self._tallies.get((run_id, writer))
        if tally is None:
            path = summary_path(self.root_dir, run_id, writer)
            tally = self._tallies[(run_id, writer)] = _Tally(path, writer)
        return tally

    async def _update_summary(
        self, run_id: str, tally: _Tally, batch: _Counted | None, life: int = 0
    ) -> None:
        """Counts ``batch`` (key, seq, params, metric columns, end) in ``tally`` unless None
        (already counted), and writes the summary. Under the tally's lock: the first use
        loads what the writer's summary holds in the store (a replay by another process,
        or a later life in this one, continues it), and each write encodes the summary as it
        is then, so writes land in the order they were made and the last holds everything."""
        await self._load(run_id, tally)
        async with tally.lock:
            if batch is not None:
                key, seq, params, columns, end = batch
                if not tally.summary.counted(key, seq):
                    metrics, first = summarize_columns(columns)
                    # The run started at its first record: a point's time, a metadata
                    # call's stamp, or its end record's time.
                    stamps = [ns / 1e9 for ns, _ in params.values()]
                    ended = (end[1],) if end is not None else ()
                    first = min([first, *stamps, *ended])
                    # Its last write is when the batch's records were made, not when they
                    # were stored: a replay (`async-tracker sync`) days later must not stretch
                    # a run that never ended (killed) to the time of the sync.
                    last = max(
                        [*(_latest(t) for _, _, t in columns.values() if len(t)), *stamps, *ended],
                        default=math.nan,
                    )
                    tally.summary = tally.summary.with_batch(
                        last if math.isfinite(last) else time.time(), key=key, seq=seq,
                        params=params, metrics=metrics,
                        first_time=first if math.isfinite(first) else None, end=end,
                    )  # fmt: skip
            beat = self._beats.get(run_id)
            if beat is not None and (tally.summary.beat or (0.0,))[0] < beat[0]:
                tally.summary = dataclasses.replace(tally.summary, beat=beat)
            if life > tally.summary.life:
                tally.summary = dataclasses.replace(tally.summary, life=life)
            await self._put_summary(run_id, tally)

    async def _put_summary(self, run_id: str, tally: _Tally) -> None:
        """Writes the tally's summary whole (the caller holds its lock), with the run id:
        the file's name holds only a digest of it."""
        data = _encode_json({**tally.summary.to_json(), "run": run_id}, tally.path)
        await self._storage.put(tally.path, data, self._path(run_id, TMP_DIR))

    async def _load(self, run_id: str, tally: _Tally) -> None:
        """At a writer's first write to a run in this process, what its summary holds in the
        store: a replay by another process, or a later life in this one, continues it. A run
        that holds records already, before this writer's first files, and no summary of this
        writer may hold records no summary counts (written by an older version or by torchx):
        the summary says so (``prior``), and readers summarise the run's files once (see
        ``summaries._rebuild``; each writer's own summary then replaces its part)."""
        if tally.loaded:
            return
        async with tally.lock:
            if tally.loaded:
                return  # loaded by a call that held the lock meanwhile
            stored = await self._stored_summary(tally.path)
            if stored is None:
                entries = await self._storage.ls_or_none(self._run_dir(run_id)) or []
                if not _RECORD_PARTS.isdisjoint(name for name, _ in entries):
                    stored = await self._kept_summary(run_id, tally.token)
                    if stored is None:
                        stored = dataclasses.replace(tally.summary, prior=True)
            if stored is not None:
                tally.summary = stored
            tally.loaded = True

    async def _kept_summary(self, run_id: str, token: str) -> WriterSummary | None:
        """The writer's summary kept elsewhere than its file, which is missing: the previous
        version's file at the store's root, or the run index's checkpoint, once a compaction
        removed the file of a writer that had ended (which writes again: a replay)."""
        stored = await self._stored_summary(legacy_summary_path(self.root_dir, run_id, token))
        if stored is None:
            stored = await index.stored_summary(
                self._storage, self.root_dir, run_id, token, _add_summary
            )
        return stored

    async def _stored_summary(self, path: str) -> WriterSummary | None:
        data = await self._storage.get(path)
        if data is None:
            return None
        try:
            return WriterSummary.from_json(_decode_json(data))
        except (*_UNPARSEABLE, orjson.JSONDecodeError) as exc:
            logger.warning("async_tracker: %s is not a run summary, rewritten: %s", path, exc)
            return None

    async def _write_metadata(
        self,
        run_id: str,
        metadata: Mapping[str, object],
        tag: str,
        times: Mapping[str, int] | None = None,
    ) -> None:
        """One file per key, named ``<time>-<rest of tag>-<position>-<digest of the key>``.
        The time, which orders the writes of a key across processes, is the hybrid-clock
        stamp of the call (``times``) where known, else the tag's own (when the batch was
        cut, or a direct call was made)."""
        directory = self._path(run_id, METADATA_DIR)
        files: dict[str, bytes] = {}
        # The position in the name keeps the keys of one call in call order for readers.
        for position, (key, value) in enumerate(metadata.items()):
            stamp = (times or {}).get(key)
            key_tag = f"{stamp:019d}{tag[19:]}" if stamp is not None and tag[:19].isdigit() else tag
            path = posixpath.join(directory, f"{key_tag}-{position:06d}-{_digest(key)}")
            files[path] = _encode_json({"metadata": {key: value}}, path)
        await self._storage.put_many(files, self._path(run_id, TMP_DIR))
        await self._remove_superseded(directory)

    async def _remove_superseded(self, directory: str) -> None:
        """Removes each key file that a newer file of the same key supersedes.

        Why this converges without a lock: a writer lists only after its own file is in
        place, so of two writers of a key, whichever lists last sees both files, and removes
        the older (its own, or the other's). A file is removed only when a newer one of its
        key was seen, so the newest is never removed. Removing a file already gone is fine.
        """
        newest: dict[str, str] = {}
        stale: list[str] = []
        # Sorted by name, and within one key's files the name orders by time, then tag.
        for name, kind in await self._storage.ls(directory):
            match = _KEY_FILE.fullmatch(name)
            if kind != "file" or match is None:
                continue  # torchx's files and older layouts hold several keys: kept
            older = newest.get(match[1])
            if older is not None:
                stale.append(posixpath.join(directory, older))
            newest[match[1]] = name
        await self._storage.rm_many(stale)

    async def _write_segment(
        self,
        run_id: str,
        metrics: Sequence[MetricRow],
        names: dict[str, str],
        key: str = "",
        columns: Mapping[str, _Columns] | None = None,
        *,
        writer: str = "",
        first_seq: int = 0,
    ) -> None:
        """One segment of ``metrics`` (``columns``: the same by name), in Parquet: each point
        a row with ``writer`` (default: this process's token) and its number from
        ``first_seq``. Steps beyond int64, which Parquet's column cannot hold, make it a JSON
        Lines segment (read as well; nothing is lost).

        Encoded here, on the tracker loop's thread, as the JSON segments were: the columns
        are made by C loops (no Python loop per point) and pyarrow writes the file without
        the GIL, so the training loop, which shares the GIL, loses little to it."""
        # numpy and pyarrow load here, at the first write, in a worker thread (see the imports)
        await import_in_thread(METRIC_CODEC, endpoint=self._storage.endpoint)
        with lazy_imports:
            from async_tracker.backend.fsspec.metricfiles import JSON_SUFFIX, segment_digest
            from async_tracker.backend.fsspec.parquet import SUFFIX, encode_segment

        if columns is None:
            columns = _columns_by_name(metrics)
        where = self._path(run_id, METRICS_DIR)
        try:
            data = encode_segment(run_id, writer or _names.token, first_seq, columns)
            suffix = SUFFIX
        except ValueError as exc:
            logger.debug("async_tracker: a JSON segment in %s: %s", where, exc)
            # The JSON codec takes Python numbers (the columns may be numpy's): this rare
            # path groups the points again.
            data = b"".join(
                _encode_column(n, s, v, t, f"metric {n!r} in {where}")
                for n, (s, v, t) in _columns_by_name(metrics).items()
            )
            suffix = JSON_SUFFIX
        if key:
            # Named after the batch and what it holds: a replay of the batch overwrites its
            # segment, and parts of a batch split by the lane do not overwrite each other.
            name = f"{key}-{segment_digest(first_seq, columns)}{suffix}"
        else:
            # Chosen at the first attempt and kept for the retries (which encode the same
            # points, in the same format).
            name = names.setdefault("metrics", _names.new(suffix))
            if not name.endswith(suffix):  # named by an older version (JSON) in the spool
                name = names["metrics"] = name.removesuffix(JSON_SUFFIX) + suffix
        await self._storage.put(
            self._path(run_id, METRICS_DIR, name), data, self._path(run_id, TMP_DIR)
        )

    # -- compaction -----------------------------------------------------------------------------
    async def compact_segments(self, run_id: str, writer: str) -> bool:
        """Compacts ``writer``'s segments of the run into one Parquet file, if it has two or
        more, and removes them; True if it did. Never raises (but for cancellation): a
        failure is logged and leaves every segment where it was.

        Safe at any point of a crash, and with other compactions of the same files running:

        * the compacted file is written whole (a rename, or one PUT) before any input is
          removed, and records its inputs (see ``metricfiles.py``): readers that see it skip
          them, so a crash in between doubles nothing;
        * its name is fixed by its inputs: a compaction of the same files overwrites it;
          two of different files that share inputs are told apart by readers, who keep one
          row per ``(writer, seq)``;
        * another writer's files are never taken (nor direct calls'), nor a file that
          cannot be read (it stays, and is skipped by readers as before).

        Inputs covered by a compacted file (a crash before their removal) are removed too,
        once that file reads whole.

        It runs in the batch holding the run's end, before the batch is acknowledged, so it
        gets at most :data:`COMPACTION_BUDGET_S`: a run of many segments on a slow store is
        left as it is rather than make ``close()`` run out of time (given up at any step, it
        leaves what a crash there would: nothing lost, nothing doubled)."""
        try:
            with anyio.move_on_after(COMPACTION_BUDGET_S):
                return await self._compact(run_id, writer)
            logger.warning(
                "async_tracker: segments of run %r (writer %s) not compacted within %.1f s, "
                "kept as they are", run_id, writer, COMPACTION_BUDGET_S,
            )  # fmt: skip
        except Exception as exc:
            logger.warning(
                "async_tracker: segments of run %r (writer %s) not compacted, kept as they "
                "are: %s: %s", run_id, writer, type(exc).__name__, exc,
            )  # fmt: skip
        return False

    async def compact(self, run_id: str, writer: str) -> bool:
        """:meth:`compact_segments` without its bound and its logging, raising what fails:
        what readers call (``readcompact.py``), which bound and report it their own way."""
        return await self._compact(run_id, writer)

    async def _compact(self, run_id: str, writer: str) -> bool:
        directory = self._path(run_id, METRICS_DIR)
        try:
            listing = await self._storage.ls(directory)
        except NotADirectory:
            return False
        # Imported here (see the imports): a run's end does not load numpy and pyarrow
        # when it has nothing to compact.
        listed = [n for n, kind in listing if kind == "file"]
        if len(listed) < 2:
            return False
        with lazy_imports:
            from async_tracker.backend.fsspec.metricfiles import (
                Coverage,
                compactable,
                compacted_name,
                inputs_metadata,
                inputs_of,
                is_compacted,
            )
            from async_tracker.backend.fsspec.parquet import SegmentError, compact, overview

        mine = [n for n in listed if compactable(n, writer)]
        if len(mine) < 2:
            return False
        contents = await _gather_bounded(
            [self._storage.get(posixpath.join(directory, n)) for n in mine]
        )
        data = {n: d for n, d in zip(mine, contents) if d is not None}
        inputs: dict[str, frozenset[str]] = {}
        unreadable: set[str] = set()
        for name in data:
            if is_compacted(name):
                try:
                    inputs[name] = inputs_of(data[name])
                except SegmentError:
                    unreadable.add(name)
        files = Coverage(tuple(data), inputs, frozenset(unreadable))
        live, stale = list(files.live), sorted(files.covered)
        endpoint = self._storage.endpoint
        if len(live) < 2:
            if stale and len(live) == 1 and is_compacted(live[0]):
                # A compaction that crashed before removing its inputs: finish it, once the
                # file that covers them reads whole.
                await run_blocking(_check, data[live[0]], endpoint=endpoint)
                await self._storage.rm_many([posixpath.join(directory, n) for n in stale])
            return False
        while len(live) >= 2:
            covered = set(live).union(*(inputs.get(n, ()) for n in live))
            # Compacted files that share inputs (two compactions of different listings)
            # hold the same rows: each row is taken once.
            dedupe = bool(Coverage(tuple(live), inputs).overlapping)
            try:
                compacted = await run_blocking(
                    functools.partial(
                        compact, [data[n] for n in live], metadata=inputs_metadata(covered),
                        dedupe=dedupe,
                    ),
                    endpoint=endpoint,
                )  # fmt: skip
            except SegmentError as exc:
                # An input that does not read whole stays as it is (readers skip what they
                # cannot read of it, as before); the others are compacted.
                bad = _segment_index(exc)
                if bad is None:
                    raise
                logger.warning(
                    "async_tracker: %s left out of the compaction of run %r: %s",
                    posixpath.join(directory, live[bad]), run_id, exc,
                )
                del live[bad]
                continue
            name = compacted_name(live)
            await self._storage.put(
                posixpath.join(directory, name), compacted, self._path(run_id, TMP_DIR)
            )
            # Only now, with the compacted file in place: its inputs, and what they covered
            # (not what a compacted file left out covers: it was not read whole).
            gone = [n for n in data if n in covered and n != name]
            await self._storage.rm_many([posixpath.join(directory, n) for n in gone])
            await self._write_overview(run_id, name, compacted, overview, SegmentError)
            # The overviews of the compacted files it replaced (theirs alone had any).
            await self._storage.rm_many(
                [self._path(run_id, OVERVIEW_DIR, n) for n in gone if is_compacted(n)]
            )
            return True
        return False

    async def _write_overview(
        self,
        run_id: str,
        name: str,
        data: bytes,
        make: Callable[[bytes], bytes | None],
        errors: type[Exception],
    ) -> None:
        """Writes the overview of the compacted file ``name`` (``data``) where it is big
        enough to have one (``make``: parquet.overview). A chart of the whole run reads it
        instead of every point; without it a chart reads the points, so a failure here is
        logged and loses nothing."""
        try:
            view = await run_blocking(make, data, endpoint=self._storage.endpoint)
            if view is not None:
                await self._storage.put(
                    self._path(run_id, OVERVIEW_DIR, name), view, self._path(run_id, TMP_DIR)
                )
        except (BackendError, OSError, errors) as exc:
            logger.warning(
                "async_tracker: no overview of %s of run %r (charts read its points): %s",
                name, run_id, exc,
            )  # fmt: skip

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self._direct_tally(run_id)
        tag = _names.new()
        await self._write_metadata(run_id, kwargs, tag)
        await self._count_direct(run_id, params=_stamped(kwargs, {}, tag))

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        # One file per artifact name: a later write replaces it, whatever order readers list.
        try:
            file = self._path(run_id, ARTIFACTS_DIR, encode_run_id(name))
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 file name for it
            raise RecordError(
                f"fsspec cannot store artifact {name!r} of run {run_id!r}: {exc}"
            ) from exc
        content = {"name": name, "path": path, "metadata": dict(metadata) if metadata else metadata}
        await self._put_json(run_id, file, content)

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        """Stores the edge as its own file on both ends (``parents/`` of the run,
        ``descendants/`` of the source): nothing to read first, nothing another writer can
        overwrite. torchx's ``sources/`` file is written first, for torchx's reader and for
        ``run_ids(parent_run_id=...)``, which looks for it."""
        line = artifact_name or ""
        try:
            data = (line + "\n").encode("utf-8")
            edge = f"{encode_run_id(source_id)}.{_digest(line)}"
            back = f"{encode_run_id(run_id)}.{_digest(line)}"
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 name or line for it
            raise RecordError(
                f"fsspec cannot store source {source_id!r} (artifact {artifact_name!r}) of run "
                f"{run_id!r}: {exc}"
            ) from exc
        await self._add_torchx_source(run_id, source_id, line)
        await self._storage.put(
            self._path(run_id, PARENTS_DIR, edge), data, self._path(run_id, TMP_DIR)
        )
        await self._storage.put(
            self._path(source_id, DESCENDANTS_DIR, back), data, self._path(source_id, TMP_DIR)
        )

    async def _add_torchx_source(self, run_id: str, source_id: str, line: str) -> None:
        """Adds ``line`` to torchx's ``sources/<base32(source)>`` unless present. A read then
        a write: two processes adding different artifact names of one source at the same
        moment may leave one name out of this file (the file itself is always there), so
        our readers take edges from ``parents/`` too."""
        path = self._path(run_id, SOURCES_DIR, encode_run_id(source_id))
        old = await self._storage.get(path)
        # surrogateescape: bytes of a foreign file that are not UTF-8 are kept as they were.
        lines = old.decode("utf-8", errors="surrogateescape").split("\n")[:-1] if old else []
        if line in lines:
            return
        lines.append(line)
        data = ("\n".join(lines) + "\n").encode("utf-8", errors="surrogateescape")
        await self._storage.put(path, data, self._path(run_id, TMP_DIR))

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self._direct_tally(run_id)
        columns = _columns_by_name(metrics)
        # A direct call is in no run's order: its points are numbered by this process (whose
        # token is their writer), so that (writer, seq) still tells every point apart.
        first = _names.numbers(len(metrics))
        await self._write_segment(run_id, metrics, {}, "", columns, first_seq=first)
        await self._count_direct(run_id, columns=columns)

    async def _direct_tally(self, run_id: str) -> _Tally:
        """This process's summary of ``run_id``, loaded before a direct call's files."""
        tally = self._tally(run_id, _names.token)
        await self._load_early(run_id, tally)
        return tally

    async def _load_early(self, run_id: str, tally: _Tally) -> None:
        """:meth:`_load` before a write's files, where it tells a run an older version wrote
        from a new one. Its failure is left to the write, whose own error names the file it
        was about; the summary's write loads it then (and may take the run's new files for
        older ones: that costs readers one needless rebuild, never a wrong count)."""
        with contextlib.suppress(BackendError):
            await self._load(run_id, tally)

    async def _count_direct(
        self,
        run_id: str,
        params: Mapping[str, tuple[int, object]] | None = None,
        columns: Mapping[str, _Columns] | None = None,
        end: tuple[str, float, float] | None = None,
    ) -> None:
        """A direct call (torchx's API, not a batch) counted in this process's summary of
        the run and written: each call is its own flush."""
        tally = await self._direct_tally(run_id)
        await self._update_summary(run_id, tally, ("", -1, params or {}, columns or {}, end))


# A batch to count in a writer's summary: key, seq, params, metric columns, end record.
_Counted = tuple[
    str, int, Mapping[str, tuple[int, object]], Mapping[str, _Columns],
    "tuple[str, float, float] | None",
]  # fmt: skip


class _Tally:
    """One writer's summary of one run, as this process keeps it (see
    :meth:`FsspecWriter._update_summary`)."""

    def __init__(self, path: str, token: str) -> None:
        self.path = path
        self.token = token
        self.summary = WriterSummary()
        self.loaded = False
        self.lock = anyio.Lock()


def _latest(times: Sequence[float] | npt.NDArray[np.float64]) -> float:
    """The latest of a batch's times (not empty): numpy's own max for an array (Python's
    would make an object per point), and Python's answer where a NaN makes them differ."""
    if isinstance(times, Sequence):
        return max(times)
    latest = float(times.max())
    return latest if not math.isnan(latest) else float(max(times.tolist()))


def _check(data: bytes) -> None:
    """Raises SegmentError unless ``data`` is a segment that reads whole."""
    # Imported already, by _compact (its one caller).
    from async_tracker.backend.fsspec.parquet import decode_segment

    decode_segment(data, columns=())


def _segment_index(exc: SegmentError) -> int | None:
    """The input a :func:`compact` error names (``segment <i>: ...``), or None."""
    head, _, _ = str(exc).partition(":")
    number = head.removeprefix("segment ")
    return int(number) if number != head and number.isdigit() else None


def _stamped(
    metadata: Mapping[str, object], stamps: Mapping[str, int], tag: str
) -> dict[str, tuple[int, object]]:
    """Each key with the stamp of its write: the call's, else the time leading ``tag``."""
    default = int(tag[:19]) if tag[:19].isdigit() else time.time_ns()
    return {k: (stamps.get(k, default), v) for k, v in metadata.items()}
