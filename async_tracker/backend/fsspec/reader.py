"""The read half of the fsspec store: :class:`FsspecReader`, one run's records read back.

Reads sort by name and skip what they cannot parse (a foreign file, a truncated line, JSON
nested too deep, a step that is not an integer, a corrupt Parquet file, a file where a
directory should be) with one warning per read naming the files (see ``parsing.py``). The
run list (every run's summary) is read by ``summaries.py``, on top of this reader.

Metric files are read by their suffix: ``.parquet`` by the Parquet codec (``parquet.py``),
anything else as JSON Lines (``segments.py``), skipping what compacted files cover (see
``metricfiles.py``): :meth:`FsspecReader.metric_segments` is the one place that decides.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import posixpath
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio

from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.layout import (
    ARTIFACTS_DIR,
    DESCENDANTS_DIR,
    HEARTBEAT_DIR,
    METADATA_DIR,
    METRIC_CODEC,
    METRICS_DIR,
    OVERVIEW_DIR,
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
from async_tracker.runtime.process import import_in_thread, lazy_imports, run_blocking
from async_tracker.settings import CRASHED_AFTER_BEATS

# The Parquet modules (numpy, pyarrow) are imported by the reads of metric files, not with
# the package: a process that never reads metrics (a training job) never loads them. Under
# lazy_imports: a fork waits for the import (see runtime/process.py).
if TYPE_CHECKING:
    from async_tracker.backend.fsspec.metricfiles import MetricsCursor
    from async_tracker.backend.fsspec.parquet import Columns

T = TypeVar("T")
# What a metric_segments caller makes of one segment.
_Parsed = TypeVar("_Parsed")
# How many times a read of a run's metric files lists again when a file listed was gone
# when read (removed by a compaction meanwhile: the compacted file is there by then).
_METRIC_READS = 3
# Builds a TrackerMetric from a 4-tuple without its Python __new__ (a C call per point).
_METRIC = itertools.repeat(TrackerMetric)


@dataclasses.dataclass(frozen=True)
class MetricSegments(Generic[_Parsed]):
    """What :meth:`FsspecReader.metric_segments` returns: each file read, by name, in name
    order (which is write order), with what the caller made of it; the cursor to pass
    next time; whether ``segments`` holds every live file (``reset``: the first read,
    or files read before are no longer live, compacted meanwhile) or only those after the
    cursor; and the names the folder held as this read found it (``listed``: what a reader
    that compacts after its read goes by, see ``readcompact.py``)."""

    segments: list[tuple[str, _Parsed]]
    cursor: MetricsCursor
    reset: bool
    listed: frozenset[str] = frozenset()


def points_of(columns: Mapping[str, Columns]) -> dict[str, list[TrackerMetric]]:
    """Decoded Parquet columns (times read) as points, each metric's in file order."""
    out: dict[str, list[TrackerMetric]] = {}
    for name, col in columns.items():
        assert col.times is not None
        rows = zip(itertools.repeat(name), col.values.tolist(), col.steps.tolist(),
                   col.times.tolist())  # fmt: skip
        out[name] = list(map(tuple.__new__, _METRIC, rows))
    return out


def merged_points(
    read: MetricSegments[dict[str, list[TrackerMetric]]],
) -> dict[str, list[TrackerMetric]]:
    """The points of a read's segments (made by :func:`points_of` and ``_parse_segment``),
    each metric's sorted by step, then time, then write order (see
    :meth:`FsspecReader.metrics`)."""
    points: dict[str, list[TrackerMetric]] = {}
    for _, segment in read.segments:
        for metric, seg_points in segment.items():
            points.setdefault(metric, []).extend(seg_points)
    # A stable sort: points of one step and time keep write order.
    return {name: sort_points(p) for name, p in points.items()}


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
        """Every point of every metric, sorted by step, then time (the tracker API's
        order), then write order: a writer's points by their number (files sort in write
        order, and rows within a file are in it), and points of several writers by the
        order of their files. No point is merged with another: a segment's name is fixed
        by its batch before any write, so a retry or a replay of the batch overwrites its
        own segment and never adds one; two points alike (a step, a clock tick, a value)
        are two writes."""
        return merged_points(await self.metric_points(run_id))

    async def metric_points(self, run_id: str) -> MetricSegments[dict[str, list[TrackerMetric]]]:
        """The run's live metric files, each read as points by name: what :meth:`metrics`
        merges (:func:`merged_points`)."""
        return await self.metric_segments(run_id, _parse_segment, points_of)

    async def metric_segments(
        self,
        run_id: str,
        parse_json: Callable[[bytes], tuple[_Parsed, str]],
        convert: Callable[[dict[str, Columns]], _Parsed],
        *,
        since: MetricsCursor | None = None,
        names: Collection[str] | None = None,
        skipped: _Skipped | None = None,
    ) -> MetricSegments[_Parsed]:
        """The run's live metric files (see ``metricfiles.py``: what compacted files cover is
        not read), in name order: Parquet files decoded (name, step, value and time; with
        ``names``, only those metrics' rows, and only the row groups that may hold them)
        and handed to ``convert``, others parsed by ``parse_json``, which returns what it
        made and describes the lines it skipped (``""`` if none). Each file is parsed as
        soon as it is read, in a worker thread, one at a time (parsing JSON holds the GIL,
        and threads taking turns at it only lose time), while the next ones are read.

        With ``since`` (the cursor of an earlier read), only the files after it are read,
        unless a file read then is no longer live (``reset``: every live file is read).
        Files are immutable once written, so a reader that keeps what it read asks only
        for the new ones: one listing, the footers of new compacted files, and the new
        files (how the dashboard follows a live run).

        What cannot be read is named in one warning (in ``skipped`` when given: the caller
        warns). A file listed but gone when read (removed by a compaction meanwhile) makes
        the read list again, a few times at most: the compacted file is there by then."""
        own = skipped is None
        for attempt in range(_METRIC_READS):
            tried = _Skipped() if own else skipped
            assert tried is not None
            result, vanished = await self._metric_segments(
                run_id, parse_json, convert, since, names, tried
            )
            if not vanished or attempt == _METRIC_READS - 1:
                if own:
                    tried.warn()
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _metric_segments(
        self,
        run_id: str,
        parse_json: Callable[[bytes], tuple[_Parsed, str]],
        convert: Callable[[dict[str, Columns]], _Parsed],
        since: MetricsCursor | None,
        names: Collection[str] | None,
        skipped: _Skipped,
    ) -> tuple[MetricSegments[_Parsed], bool]:
        # numpy and pyarrow load here, at the first read, in a worker thread (see the imports)
        await import_in_thread(METRIC_CODEC, endpoint=self.storage.endpoint)
        with lazy_imports:
            from async_tracker.backend.fsspec.metricfiles import (
                Coverage,
                MetricsCursor,
                Seen,
                inputs_of,
                is_compacted,
                is_parquet,
            )
            from async_tracker.backend.fsspec.parquet import SegmentError, decode_segment

        directory = self.path(run_id, METRICS_DIR)
        try:
            listing = await self.storage.ls(directory)
        except NotADirectory:
            skipped.add(directory, "a file where a directory should be")
            return MetricSegments([], MetricsCursor(), reset=True), False
        present: list[str] = []
        for name, kind in listing:
            if kind == "file":
                present.append(name)
            else:
                skipped.add(posixpath.join(directory, name), "a directory where files are kept")
        known = since or MetricsCursor()
        inputs = {n: known.inputs[n] for n in present if n in known.inputs}
        unreadable = {n for n in present if n in known.unreadable}
        contents: dict[str, bytes] = {}
        gone: set[str] = set()

        async def fetch(wanted: Sequence[str]) -> None:
            reads = [self.storage.get(posixpath.join(directory, n)) for n in wanted]
            for name, data in zip(wanted, await _gather_bounded(reads)):
                if data is None:
                    gone.add(name)
                else:
                    contents[name] = data

        # The inputs of the compacted files not met before, from their footers.
        met = inputs.keys() | unreadable
        await fetch([n for n in present if is_compacted(n) and n not in met])
        for name in present:
            if name in contents:
                try:
                    inputs[name] = inputs_of(contents[name])
                except SegmentError as exc:
                    skipped.add(posixpath.join(directory, name), exc)
                    unreadable.add(name)

        parsing = anyio.Lock()
        endpoint = self.storage.endpoint

        async def decode(name: str, ids: bool) -> dict[str, Columns] | None:
            """A Parquet file's columns (with writers and seqs when ``ids``), or None."""
            columns = ("time", "writer", "seq") if ids else ("time",)
            call = functools.partial(decode_segment, contents[name], names=names, columns=columns)
            try:
                async with parsing:
                    decoded, bad = await run_blocking(call, endpoint=endpoint)
            except SegmentError as exc:
                skipped.add(posixpath.join(directory, name), exc)
                return None
            if bad:
                skipped.add(posixpath.join(directory, name), bad)
            return decoded

        # Compacted files first: one that does not read whole covers nothing, and what it
        # would have covered is read instead. Each round settles at least one file.
        decoded: dict[str, tuple[dict[str, Columns], bool]] = {}
        while True:
            files = Coverage(
                tuple(n for n in present if n not in gone), inputs, frozenset(unreadable)
            )
            live, overlapping = files.live, files.overlapping
            reset = (
                since is None
                or not known.consumed <= set(live)
                # Rows of a new file that a file read before holds too: read both again.
                or bool(overlapping & known.consumed and overlapping - known.consumed)
            )
            todo = [n for n in live if reset or n not in known.consumed]
            pending = [
                n for n in todo
                if is_compacted(n)
                and (n not in decoded or (n in overlapping and not decoded[n][1]))
            ]  # fmt: skip
            if not pending:
                break
            await fetch([n for n in pending if n not in contents])
            for name in pending:
                if name in gone:
                    continue
                got = await decode(name, name in overlapping)
                if got is None:
                    unreadable.add(name)
                else:
                    decoded[name] = (got, name in overlapping)

        async def read(name: str) -> _Parsed | None:
            """What the caller makes of a file that is not compacted (None: gone, or not
            Parquet after all)."""
            if name not in contents:
                data = await self.storage.get(posixpath.join(directory, name))
                if data is None:
                    gone.add(name)
                    return None
                contents[name] = data
            if is_parquet(name):
                got = await decode(name, False)
                del contents[name]
                return None if got is None else convert(got)
            async with parsing:
                parsed, bad = await run_blocking(parse_json, contents.pop(name), endpoint=endpoint)
            if bad:
                skipped.add(posixpath.join(directory, name), bad)
            return parsed

        rest = [n for n in todo if n not in decoded]
        results = dict(zip(rest, await _gather_bounded([read(n) for n in rest])))
        seen = Seen()
        segments: list[tuple[str, _Parsed]] = []
        for name in todo:
            if name in decoded:
                columns = decoded[name][0]
                if name in overlapping:
                    # Two compacted files share inputs: the first keeps their rows.
                    columns = seen.keep(columns)
                segments.append((name, convert(columns)))
            elif (parsed := results.get(name)) is not None:
                segments.append((name, parsed))
        listed = set(present) - gone
        cursor = MetricsCursor(
            consumed=frozenset(n for n in live if n not in gone),
            inputs={n: i for n, i in inputs.items() if n in listed and n not in unreadable},
            unreadable=frozenset(unreadable & listed),
        )
        return MetricSegments(segments, cursor, reset, frozenset(listed)), bool(gone)

    async def overview_segments(
        self,
        run_id: str,
        convert: Callable[[dict[str, Columns]], _Parsed],
        names: Collection[str] | None = None,
    ) -> list[_Parsed] | None:
        """What a chart of the whole run draws, per metric file (see ``parquet.overview``):
        each compacted file's overview, or the file itself where it has none (a small one),
        decoded (name, step, value, time; with ``names``, only those metrics) and handed to
        ``convert``. ``None`` while any metric file is not a compacted one (a live run, a
        run whose writer never compacted): only every point then gives the chart.

        An overview that cannot be read is named in one warning, and its file read whole
        instead; a file gone meanwhile (a compaction) gives ``None``: the caller reads the
        points, which handles it."""
        await import_in_thread(METRIC_CODEC, endpoint=self.storage.endpoint)
        with lazy_imports:
            from async_tracker.backend.fsspec.metricfiles import is_compacted
            from async_tracker.backend.fsspec.parquet import SegmentError, decode_segment

        directory = self.path(run_id, METRICS_DIR)
        try:
            files = [n for n, kind in await self.storage.ls(directory) if kind == "file"]
            views = self.path(run_id, OVERVIEW_DIR)
            viewed = {n for n, kind in await self.storage.ls(views) if kind == "file"}
        except NotADirectory:
            return None
        if not all(is_compacted(n) for n in files):
            return None
        skipped = _Skipped()
        endpoint = self.storage.endpoint
        decode = functools.partial(decode_segment, names=names, columns=("time",))

        async def one(name: str) -> _Parsed | None:
            if name in viewed:
                path = posixpath.join(views, name)
                data = await self.storage.get(path)
                if data is not None:
                    try:
                        columns, _ = await run_blocking(decode, data, endpoint=endpoint)
                        return convert(columns)
                    except SegmentError as exc:
                        skipped.add(path, exc)
            data = await self.storage.get(posixpath.join(directory, name))
            if data is None:
                return None
            try:
                columns, _ = await run_blocking(decode, data, endpoint=endpoint)
            except SegmentError:
                return None  # the read of the points names it
            return convert(columns)

        got = await _gather_bounded([one(n) for n in files])
        skipped.warn()
        if any(part is None for part in got):
            return None
        return [part for part in got if part is not None]

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
