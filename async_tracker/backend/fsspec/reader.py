"""The read half of the fsspec store: :class:`FsspecReader`, one run's records read back.

Reads sort by name and skip what they cannot parse (a foreign file, a truncated line, JSON
nested too deep, a step that is not an integer, a file where a directory should be) with one
warning per read naming the files (see ``parsing.py``). The run list (every run's summary)
is read by ``summaries.py``, on top of this reader.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

import anyio

from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.layout import (
    ARTIFACTS_DIR,
    DESCENDANTS_DIR,
    HEARTBEAT_DIR,
    METADATA_DIR,
    METRICS_DIR,
    PARENTS_DIR,
    RUN_PARTS,
    SOURCES_DIR,
    STATUS_DIR,
    _root_entry,
    _write_order,
    encode_run_id,
    run_path,
)
from async_tracker.backend.fsspec.parsing import (
    _last_life_ending,
    _parse_artifact,
    _parse_each,
    _parse_edges,
    _parse_heartbeat,
    _parse_heartbeat_file,
    _parse_life,
    _parse_metadata,
    _parse_status,
    _Skipped,
)
from async_tracker.backend.fsspec.segments import _parse_segment
from async_tracker.backend.fsspec.storage import NotADirectory, _gather_bounded, _Storage
from async_tracker.errors import BackendUnavailableError
from async_tracker.records import (
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    sort_points,
)
from async_tracker.runtime.process import run_blocking
from async_tracker.settings import CRASHED_AFTER_BEATS

T = TypeVar("T")
# What a metric_segments caller's parser makes of one segment.
_Parsed = TypeVar("_Parsed")


class FsspecReader:
    """Reads the runs stored under ``root_dir`` through ``storage``. It keeps nothing between
    calls (a caller that keeps files between reads passes its own :class:`SummaryFileCache`),
    so any number of readers, and the writers of the same store, share one storage."""

    def __init__(self, storage: _Storage, root_dir: str) -> None:
        self.storage = storage
        self.root_dir = root_dir

    def run_dir(self, run_id: str) -> str:
        return run_path(self.root_dir, run_id)

    def path(self, run_id: str, *parts: str) -> str:
        return run_path(self.root_dir, run_id, *parts)

    # -- files ----------------------------------------------------------------------------------
    async def read_files(
        self, directory: str, skipped: _Skipped, cache: SummaryFileCache | None = None
    ) -> tuple[list[tuple[str, bytes]], bool]:
        """``(name, content)`` of the files in ``directory``, sorted by name, and whether
        one listed was gone when read (removed by a writer meanwhile). With ``cache``, a
        file whose listed version is the one kept there is not read again."""
        try:
            listing = await self.storage.ls_versions(directory)
        except NotADirectory:
            # This folder, or the run's directory above it, is a file: name the one it is.
            parent = posixpath.dirname(directory)
            if await self.storage.exists(parent) and not await self.storage.isdir(parent):
                skipped.add(parent, "a file where the run's directory should be")
            else:
                skipped.add(directory, "a file where a directory should be")
            return [], False
        names: list[str] = []
        versions: list[Hashable] = []
        for name, kind, version in listing:
            if kind == "file":
                names.append(name)
                versions.append(version)
            else:
                skipped.add(posixpath.join(directory, name), "a directory where files are kept")
        paths = [posixpath.join(directory, n) for n in names]
        contents = await self.get_all(paths, versions, cache)
        files = [(n, c) for n, c in zip(names, contents) if c is not None]
        return files, len(files) < len(names)

    async def get_all(
        self, paths: list[str], versions: list[Hashable], cache: SummaryFileCache | None
    ) -> list[bytes | None]:
        """The content of each of ``paths`` (None: gone meanwhile); with ``cache``, a file
        whose listed version is the one kept there is not read again."""
        if cache is None:
            return await _gather_bounded([self.storage.get(p) for p in paths])
        kept = [cache.get(p, v) for p, v in zip(paths, versions)]
        missing = [i for i, data in enumerate(kept) if data is None]
        read = await _gather_bounded([self.storage.get(paths[i]) for i in missing])
        for i, data in zip(missing, read):
            if data is not None:
                cache.put(paths[i], versions[i], data)
            kept[i] = data
        return kept

    async def parsed(
        self,
        directory: str,
        parse: Callable[[str, bytes], T],
        skipped: _Skipped,
        cache: SummaryFileCache | None = None,
    ) -> list[tuple[str, T]]:
        files, _ = await self.read_files(directory, skipped, cache)
        return _parse_each(directory, files, parse, skipped)

    # -- records --------------------------------------------------------------------------------
    async def metadata(self, run_id: str) -> Mapping[str, object]:
        directory = self.path(run_id, METADATA_DIR)
        for _ in range(3):
            skipped = _Skipped()
            files, vanished = await self.read_files(directory, skipped)
            # A file gone between listing and reading was superseded by a newer file of its
            # key, which the listing may not have shown yet: list again.
            if not vanished:
                break
        entries = _parse_each(directory, files, _parse_metadata, skipped)
        skipped.warn()
        # By time, then name: for our files the time the batch was cut, for torchx's (named
        # by their time) and older layouts the time of the write.
        entries.sort(key=lambda entry: _write_order(entry[0]))
        merged: dict[str, object] = {}
        for _, values in entries:
            merged.update(values)
        return merged

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        skipped = _Skipped()
        entries = await self.parsed(
            self.path(run_id, ARTIFACTS_DIR), lambda _, d: _parse_artifact(d), skipped
        )
        skipped.warn()
        return {a.name: a for _, a in entries}

    async def _edges(
        self, run_id: str, categories: Sequence[str], skipped: _Skipped
    ) -> list[TrackerSource]:
        """The edges in the files of ``categories`` (each file: a run id in its name, artifact
        names in its lines), each edge once, in the order first found."""
        groups = await _gather_bounded(
            [self.parsed(self.path(run_id, c), _parse_edges, skipped) for c in categories]
        )
        seen: dict[tuple[str, str | None], TrackerSource] = {}
        for group in groups:
            for _, edges in group:
                for edge in edges:
                    seen.setdefault((edge.source_run_id, edge.artifact_name), edge)
        return list(seen.values())

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        skipped = _Skipped()
        edges = await self._edges(run_id, (SOURCES_DIR, PARENTS_DIR), skipped)
        skipped.warn()
        if artifact_name is None:
            return edges
        return [s for s in edges if s.artifact_name == artifact_name]

    async def lineage(self, run_id: str) -> Lineage:
        skipped = _Skipped()
        parents = await self._edges(run_id, (SOURCES_DIR, PARENTS_DIR), skipped)
        descendants = await self._edges(run_id, (DESCENDANTS_DIR,), skipped)
        skipped.warn()
        return Lineage(run_id, parents=parents, descendants=descendants)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        """The runs under the root: directories named by base32 of a run id that hold a
        record the run wrote (not a directory holding only the descendants of a source)."""
        parent = kwargs.get("parent_run_id")
        skipped = _Skipped()
        candidates = await self._run_dirs(skipped)
        listings = await _gather_bounded(
            [self.storage.ls_or_none(posixpath.join(self.root_dir, n)) for n, _ in candidates]
        )
        ids = [
            run_id
            for (_, run_id), entries in zip(candidates, listings)
            if entries is not None and not RUN_PARTS.isdisjoint(name for name, _ in entries)
        ]
        skipped.warn()
        if parent is None:
            return ids
        parent_file = encode_run_id(parent)
        found = await _gather_bounded(
            [self.storage.exists(self.path(i, SOURCES_DIR, parent_file)) for i in ids]
        )
        return [i for i, yes in zip(ids, found) if yes]

    async def _run_dirs(self, skipped: _Skipped) -> list[tuple[str, str]]:
        """``(directory name, run id)`` of each directory under the root named by a run id
        (one listing); whatever else is there, summaries aside, is named in ``skipped``."""
        return (await self.root(skipped))[0]

    async def root(
        self, skipped: _Skipped
    ) -> tuple[list[tuple[str, str]], list[tuple[str, Hashable]]]:
        """One listing of the root: its run directories (as :meth:`_run_dirs`) and its
        summary files, each with its listed version (see :class:`SummaryFileCache`)."""
        try:
            listing = await self.storage.ls_versions(self.root_dir)
        except NotADirectory:
            skipped.add(self.root_dir, "a file where the store's directory should be")
            return [], []
        runs: list[tuple[str, str]] = []
        names: list[str] = []
        versions: dict[str, Hashable] = {}
        for name, kind, version in listing:
            versions[name] = version
            why = _root_entry(name, kind == "directory", runs, names)
            if why:
                skipped.add(posixpath.join(self.root_dir, name), why)
        return runs, [(name, versions[name]) for name in names]

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        skipped = _Skipped()
        directory = self.path(run_id, METRICS_DIR)
        files, _ = await self.read_files(directory, skipped)
        # Every point of every segment, none merged with another: a segment's name is fixed
        # by its batch (its key and content) before any write, so a retry or a replay of the
        # batch overwrites its own segment and never adds one; two points alike (a step, a
        # clock tick, a value) are two writes. Segments sort by name, which is write order
        # (the key's time, writer, sequence), and the sort below is stable: points of one
        # step keep the order they were logged in.
        points: dict[str, list[TrackerMetric]] = {}
        for name, data in files:
            segment, bad = _parse_segment(data)
            if bad:
                skipped.add(posixpath.join(directory, name), bad)
            for metric, seg_points in segment.items():
                points.setdefault(metric, []).extend(seg_points)
        skipped.warn()
        return {name: sort_points(p) for name, p in points.items()}

    async def metric_segments(
        self,
        run_id: str,
        known: Collection[str],
        parse: Callable[[bytes], tuple[_Parsed, str]],
    ) -> list[tuple[str, _Parsed]]:
        """The run's metric segments not in ``known`` (names returned by earlier calls), in
        write order: ``(name, parse(content)[0])``. Segments are immutable once written, so
        a reader that keeps what it read asks only for the new ones: one listing, and reads
        of the new files alone (how the dashboard follows a live run).

        ``parse`` turns a segment's bytes into columns and describes the lines it skipped
        (``""`` if none), which are warned about as by :meth:`metrics`:
        :func:`parse_segment_columns` gives lists, in each segment's order (not sorted)."""
        skipped = _Skipped()
        directory = self.path(run_id, METRICS_DIR)
        try:
            listing = await self.storage.ls(directory)
        except NotADirectory:
            skipped.add(directory, "a file where a directory should be")
            skipped.warn()
            return []
        names = [n for n, kind in listing if kind == "file" and n not in known]

        # Each segment is parsed as soon as it is read (in a worker thread), so that reading
        # the next ones overlaps the parsing: a huge metric's first read is mostly parsing.
        # One parse at a time: parsing holds the GIL, and threads taking turns at it only
        # lose time (and hold more segments in memory at once).
        parsing = anyio.Lock()

        async def read(name: str) -> tuple[_Parsed, str] | None:
            data = await self.storage.get(posixpath.join(directory, name))
            if data is None:
                return None  # gone meanwhile (the run was deleted)
            async with parsing:
                return await run_blocking(parse, data, endpoint=self.storage.endpoint)

        out: list[tuple[str, _Parsed]] = []
        for name, result in zip(names, await _gather_bounded([read(n) for n in names])):
            if result is None:
                continue
            columns, bad = result
            if bad:
                skipped.add(posixpath.join(directory, name), bad)
            out.append((name, columns))
        skipped.warn()
        return out

    # -- how the run is doing -------------------------------------------------------------------
    async def run_exists(self, run_id: str) -> bool:
        """Whether the store holds ``run_id`` (its claim or any record it wrote), asking about
        the run's own directory alone, never the store: one request on object stores for a
        new run (is there a directory), then its listing. A file where the run's directory
        should be is a BackendUnavailableError."""
        run_dir = self.run_dir(run_id)
        # Not a listing straight away: s3fs lists a missing directory's parent (the whole
        # store, a page per 1,000 runs) to see whether it is a file.
        if not await self.storage.isdir(run_dir):
            return False
        try:
            entries = await self.storage.ls(run_dir)
        except NotADirectory:
            raise BackendUnavailableError(
                f"fsspec: {run_dir} is a file where the directory of run {run_id!r} should be"
            ) from None
        return not RUN_PARTS.isdisjoint(name for name, _ in entries)

    async def run_status(
        self, run_id: str, now: float | None = None, *, cache: SummaryFileCache | None = None
    ) -> tuple[str, float | None]:
        """How the run ended and when: ``failed`` if any writer failed, else ``killed`` if
        any was killed, else ``finished`` (the time of the latest such ending). Only the
        endings of the run's last life count: one that came before another writer began the
        run (its ``started``: a job resumed after it was killed or failed) is overtaken. A run no
        writer ended is ``running`` (time None), or ``crashed`` (time: its last heartbeat)
        when it has heartbeats and every one is older than ``CRASHED_AFTER_BEATS`` of its
        intervals at ``now`` (default: the wall clock). A run without heartbeats (torchx's,
        or one written with heartbeats off) stays ``running``. ``cache``: see
        ``run_summaries`` (``summaries.py``)."""
        skipped = _Skipped()
        status_dir = self.path(run_id, STATUS_DIR)
        parsed = await self.parsed(status_dir, _parse_status, skipped, cache)
        heartbeat_dir = self.path(run_id, HEARTBEAT_DIR)
        beats = await self.parsed(heartbeat_dir, _parse_heartbeat, skipped, cache)
        # The lives writers beat in: a life newer than every ending (a requeued run's, training
        # again) has not ended; a writer that ended has its ending in its life too.
        unended = [life for _, (_, _, life) in beats]
        skipped.warn()
        ending = _last_life_ending([e for _, e in parsed], unended) if parsed else None
        if ending is not None:
            return ending
        now = time.time() if now is None else now
        last = max([0, *unended])
        live = [(t, every) for _, (t, every, life) in beats if life >= last]
        if live and all(now - t > CRASHED_AFTER_BEATS * every for t, every in live):
            return "crashed", max(t for t, _ in live)
        return "running", None

    async def heartbeats(self, run_id: str) -> dict[str, dict[str, object]]:
        """Each writer's last heartbeat, by writer token: ``{"time", "interval_s"}`` and,
        from writers of this version, ``"delivery"`` (see ``FsspecWriter.heartbeat``). Unparseable
        files are skipped with a warning."""
        skipped = _Skipped()
        parsed = await self.parsed(
            self.path(run_id, HEARTBEAT_DIR), lambda _, d: _parse_heartbeat_file(d), skipped
        )
        skipped.warn()
        return {name.removesuffix(".json"): beat for name, beat in parsed}

    async def life_state(self, run_id: str) -> tuple[int, int]:
        """What a process resuming ``run_id`` lives and continues after: the run's life it
        joins or begins, and the latest metadata stamp the run holds (ns; 0 for none).

        The latest life a writer beat in without any writer of it ending (a rank of it still
        training, or a life that crashed) is joined; once the latest life has an ending (it
        finished, failed or was killed), a new one begins, one past it. A run with no life
        recorded yet (a writer that just claimed it, or an older version's) is in its first.
        Three listings and the status and heartbeat files: read once, at a resume."""
        skipped = _Skipped()
        ends = await self.parsed(self.path(run_id, STATUS_DIR), _parse_life, skipped)
        beats = await self.parsed(self.path(run_id, HEARTBEAT_DIR), _parse_life, skipped)
        names = await self.storage.ls_or_none(self.path(run_id, METADATA_DIR)) or []
        skipped.warn()
        ended = max((life for _, life in ends), default=0)
        beating = max((life for _, life in beats), default=0)
        life = beating if beating > ended else ended + 1 if ends else max(beating, 1)
        stamps = [_write_order(name)[0] for name, _ in names]
        return life, max(stamps, default=0)
