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
import hashlib
import logging
import math
import posixpath
import time
from collections.abc import Mapping, Sequence

import anyio
import orjson

from async_tracker.backend.fsspec import index
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
    METRICS_DIR,
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
from async_tracker.backend.fsspec.segments import _Columns, _columns_by_name, _encode_column
from async_tracker.backend.fsspec.storage import (
    NotADirectory,
    _encode_json,
    _mapped,
    _Storage,
)
from async_tracker.backend.fsspec.summaries import _add_summary
from async_tracker.base import END_PART, CloseReason
from async_tracker.errors import BackendError, RecordError
from async_tracker.records import Batch, MetricRow, TrackerMetric
from async_tracker.store.summary import WriterSummary, summarize_columns

logger = logging.getLogger(__name__)


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
        next files again; nothing stops it."""
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
        return True

    async def _write_status(
        self, run_id: str, reason: CloseReason, when: float, writer: str, started: float = 0.0
    ) -> None:
        # One file per writer, so ranks ending one run never overwrite each other.
        path = self._path(run_id, STATUS_DIR, f"{writer}.json")
        content: dict[str, object] = {"status": reason, "time": when}
        if started:
            content["started"] = started
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
            for (run, _), tally in list(self._tallies.items()):
                if run == run_id and tally.loaded:
                    async with tally.lock:
                        tally.summary = dataclasses.replace(tally.summary, beat=(now, interval_s))
                        await self._put_summary(run_id, tally)

    # -- writes ---------------------------------------------------------------------------------
    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Writes the parts of ``batch`` not yet done. Any failure leaves as one
        :class:`~async_tracker.errors.BackendError` naming the file (see :func:`map_error`)."""
        with _mapped(f"write of run {run_id!r}"):
            await self._write_batch(run_id, batch)

    async def _write_batch(self, run_id: str, batch: Batch) -> None:
        found = _KEY_TOKEN.match(batch.key)
        writer = found.group(1) if found else _names.token
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
            _columns_by_name(batch.metric_rows())
            if batch.points() and ("metrics" not in batch.done or not counted)
            else {}
        )
        if "metrics" not in batch.done and batch.points():
            await self._write_segment(
                run_id, batch.metric_rows(), batch.names, batch.key, columns
            )
            batch.done.add("metrics")
        when = batch.end_time or time.time()
        if batch.end is not None and END_PART not in batch.done:
            # The run's end follows everything it recorded (its summary aside).
            await self._write_status(run_id, batch.end, when, writer, batch.life_start)
            batch.done.add(END_PART)
        # Last, at this flush boundary: the writer's summary with this batch counted (once,
        # whatever was retried or replayed). A failure here fails the batch, whose retry
        # skips the parts above and writes the summary again.
        tag = batch.names.get("metadata") or batch.key
        params = _stamped(batch.metadata, batch.metadata_ns, tag)
        end = None if batch.end is None else (str(batch.end), when, batch.life_start)
        await self._update_summary(
            run_id, tally, None if counted else (batch.key, batch.seq, params, columns, end)
        )
        if batch.end is not None:
            self._tallies.pop((run_id, writer), None)  # a later life reloads it from the store
            self._beats.pop(run_id, None)

    def _tally(self, run_id: str, writer: str) -> _Tally:
        tally = self._tallies.get((run_id, writer))
        if tally is None:
            path = summary_path(self.root_dir, run_id, writer)
            tally = self._tallies[(run_id, writer)] = _Tally(path, writer)
        return tally

    async def _update_summary(self, run_id: str, tally: _Tally, batch: _Counted | None) -> None:
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
                        [*(max(t) for _, _, t in columns.values() if t), *stamps, *ended],
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
            return WriterSummary.from_json(orjson.loads(data))
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
    ) -> None:
        if columns is None:
            columns = _columns_by_name(metrics)
        where = self._path(run_id, METRICS_DIR)
        data = b"".join(
            _encode_column(n, s, v, t, f"metric {n!r} in {where}")
            for n, (s, v, t) in columns.items()
        )
        if key:
            # Named after the batch and what it holds: a replay of the batch overwrites its
            # segment, and parts of a batch split by the lane do not overwrite each other.
            name = f"{key}-{hashlib.sha1(data).hexdigest()[:12]}.jsonl"
        else:
            name = names.setdefault("metrics", _names.new(".jsonl"))
        await self._storage.put(
            self._path(run_id, METRICS_DIR, name), data, self._path(run_id, TMP_DIR)
        )

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
        await self._write_segment(run_id, metrics, {}, "", columns)
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


def _stamped(
    metadata: Mapping[str, object], stamps: Mapping[str, int], tag: str
) -> dict[str, tuple[int, object]]:
    """Each key with the stamp of its write: the call's, else the time leading ``tag``."""
    default = int(tag[:19]) if tag[:19].isdigit() else time.time_ns()
    return {k: (stamps.get(k, default), v) for k, v in metadata.items()}
