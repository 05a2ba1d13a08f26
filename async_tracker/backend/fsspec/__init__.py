"""The fsspec backend: torchx's on-disk layout on any fsspec filesystem, written in batches.

* :class:`AsyncFsspecTracker` is the ``AsyncTrackerBase``: a writer and a reader over one
  storage.
* :class:`FsspecTracker` is its blocking face, torchx's ``FsspecTracker(fs, root_dir)``.
* :func:`create` is the ``fsspec`` factory: a tracker from torchx's ``key=value`` config file.

The modules, from the bottom up: ``layout`` (where each record lies and how files are named:
the reference for the layout), ``storage`` (the I/O, as coroutines over any fsspec
filesystem, and the one boundary where errors are mapped), ``segments`` (the metric segment
codec), ``parsing`` (the record files read back, and what a read skipped), ``cache`` (what a
reader of the run list keeps between listings), ``reader`` (the read half: one run's
records, status and heartbeats), ``index`` (the run index: the writers' summaries and their
compacted checkpoint; with ``indexcheckpoint``, the checkpoint's format, and ``indexfiles``,
the index's file I/O), ``summaries`` (the run list, from the index), ``writer`` (the write
half: batches, summaries, heartbeats, a run's claim and end), ``config`` (torchx's config
file), and this module, which puts them together. Metric data is Apache Parquet:
``parquet`` (the schema and codec) and ``metricfiles`` (the metric files of a run: names,
what compaction covers, what a following reader keeps), which import numpy and pyarrow and
so are imported at the first write or read of metrics, never with the package.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import fsspec
import fsspec.core

from async_tracker.adapters import SyncTracker
from async_tracker.backend.fsspec import summaries
from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.config import read_config
from async_tracker.backend.fsspec.layout import (
    ARTIFACTS_DIR,
    CLAIM_FILE,
    DESCENDANTS_DIR,
    DIGEST_CHARS,
    HEARTBEAT_DIR,
    INDEX_PREFIX,
    LEGACY_SUMMARY_PREFIX,
    MAX_FILE_NAME_BYTES,
    METADATA_DIR,
    METRIC_CODEC,
    METRICS_DIR,
    PARENTS_DIR,
    REBUILT_TOKEN,
    RUN_PARTS,
    SOURCES_DIR,
    STATUS_DIR,
    SUMMARY_PREFIX,
    TMP_DIR,
    _check_file_name,
    _utf8,
    decode_run_id,
    encode_run_id,
    legacy_summary_path,
    summary_path,
)

# Private names that tests import from here.
from async_tracker.backend.fsspec.layout import _names as _names
from async_tracker.backend.fsspec.reader import FsspecReader, MetricSegments, _Parsed, points_of
from async_tracker.backend.fsspec.segments import (
    MAX_STRIDE,
    UNPARSEABLE_LINE,
    SegmentColumns,
    describe_skipped,
    parse_column_line,
    parse_segment_columns,
    skipped_line,
)
from async_tracker.backend.fsspec.segments import _columns_by_name as _columns_by_name
from async_tracker.backend.fsspec.segments import _encode_column as _encode_column
from async_tracker.backend.fsspec.storage import (
    MAX_CONCURRENT_FILES,
    NotADirectory,
    _Storage,
    map_error,
)
from async_tracker.backend.fsspec.writer import FsspecWriter
from async_tracker.base import AsyncTrackerBase, Checked, CloseReason
from async_tracker.errors import TrackerConfigError
from async_tracker.records import (
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
)
from async_tracker.runtime.process import import_here, lazy_imports
from async_tracker.store.reader import RunReader
from async_tracker.store.summary import RunSummary

# The Parquet modules (numpy, pyarrow) are not imported with the package, but at the first
# write or read of metrics (see writer.py and reader.py): MetricsCursor is given on demand.
if TYPE_CHECKING:
    from async_tracker.backend.fsspec.metricfiles import MetricsCursor
    from async_tracker.backend.fsspec.parquet import Columns

__all__ = [
    "ARTIFACTS_DIR",
    "CLAIM_FILE",
    "DESCENDANTS_DIR",
    "DIGEST_CHARS",
    "HEARTBEAT_DIR",
    "INDEX_PREFIX",
    "LEGACY_SUMMARY_PREFIX",
    "MAX_CONCURRENT_FILES",
    "MAX_FILE_NAME_BYTES",
    "MAX_STRIDE",
    "METADATA_DIR",
    "METRICS_DIR",
    "PARENTS_DIR",
    "REBUILT_TOKEN",
    "RUN_PARTS",
    "SOURCES_DIR",
    "STATUS_DIR",
    "SUMMARY_PREFIX",
    "TMP_DIR",
    "UNPARSEABLE_LINE",
    "AsyncFsspecTracker",
    "FsspecReader",
    "FsspecTracker",
    "FsspecWriter",
    "MetricSegments",
    "MetricsCursor",
    "NotADirectory",
    "SegmentColumns",
    "SummaryFileCache",
    "create",
    "decode_run_id",
    "describe_skipped",
    "encode_run_id",
    "legacy_summary_path",
    "map_error",
    "parse_column_line",
    "parse_segment_columns",
    "points_of",
    "read_config",
    "skipped_line",
    "summary_path",
]


def __getattr__(name: str) -> object:
    """``MetricsCursor``, imported when first asked for (it loads numpy and pyarrow)."""
    if name == "MetricsCursor":
        with lazy_imports:  # a fork waits for the import (see runtime/process.py)
            from async_tracker.backend.fsspec.metricfiles import MetricsCursor

        return MetricsCursor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class AsyncFsspecTracker(AsyncTrackerBase):
    """Runs stored under ``root_dir`` of an fsspec filesystem, in torchx's layout.

    ``write_batch`` writes one file per metadata key, one file per distinct artifact, the
    lineage files, and one metrics segment per flush. Many processes may write one run at
    once: the last write of a metadata key wins, and no lineage edge is lost. Reads sort by
    name and skip, with one warning per read naming them, files they cannot parse.

    The tracker is a :class:`FsspecWriter` and a :class:`FsspecReader` over one storage:
    each method hands its call to the half it belongs to.

    The metric codec (numpy and pyarrow) loads when the store is made, on the caller's
    thread; with ``load_codec=False``, at its first read or write of points, in a worker
    thread (a process that never touches a point never loads it).
    """

    name = "fsspec"

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root_dir: str, *, load_codec: bool = True
    ) -> None:
        # The metric codec (numpy, pyarrow) loads here, on the caller's thread, not with the
        # package (a job that imports it to log elsewhere never pays for it) nor on the
        # tracker's thread at the first write (see runtime.process.import_here: why).
        # load_codec=False leaves it to the first read or write of points (in a worker
        # thread): for a process that may never touch one and does not end by an uncaught
        # Ctrl-C, such as the CLI's (`list jobs` reads the run index alone).
        if load_codec:
            import_here(METRIC_CODEC)
        self.fs = fs
        self.root_dir = fs._strip_protocol(root_dir).rstrip("/") or "/"
        # The store as a URL (file:///data/runs, s3://bucket/runs), as errors name it; and
        # what `async-tracker sync --to` takes to deliver spooled records here, unless the
        # filesystem was made with options a URL does not carry (a config file's endpoint or
        # credentials: the URL alone would reach another store, or none).
        url = fs.unstrip_protocol(self.root_dir)
        self.url = url
        self.store_url: str | None = None if fs.storage_options else url
        storage = _Storage(fs, url)
        # The store's identity: parts of a batch done here are not done elsewhere.
        self.store_id = url
        # The two halves share the storage, which holds no state of theirs: the writer owns
        # what this process keeps of the runs it writes (summaries, heartbeats), the reader
        # keeps nothing.
        self._writer = FsspecWriter(storage, self.root_dir)
        self._reader = FsspecReader(storage, self.root_dir)

    def summary_path(self, run_id: str, writer: str) -> str:
        """The file of the summary of ``run_id`` by ``writer`` (a token, or ``rebuilt``)."""
        return summary_path(self.root_dir, run_id, writer)

    # -- the contract -------------------------------------------------------------------------
    def validate(self, record: Checked) -> None:
        """Refuses, naming it, what this layout cannot store: names that make no file name
        (no UTF-8 form, or a base32 name over 255 bytes) and artifact names of lineage edges
        that would not read back (line breaks, surrounding blanks: lines are stripped, by
        torchx's reader too). Metadata keys, values and metric names are only ever inside
        JSON files, which hold whatever the generic checks let through."""
        if isinstance(record, TrackerArtifact):
            _check_file_name(record.name, f"artifact {record.name!r}", 0)
        elif isinstance(record, TrackerSource):
            what = f"source {record.source_run_id!r}"
            _check_file_name(record.source_run_id, what, 1 + DIGEST_CHARS)
            art = record.artifact_name
            if art:
                if not _utf8(art):
                    raise ValueError(f"{what}: artifact_name {art!r} holds a lone surrogate")
                if "\n" in art or "\r" in art or art != art.strip():
                    raise ValueError(
                        f"{what}: artifact_name {art!r} has a line break or surrounding "
                        "blanks, which the sources file cannot keep"
                    )

    def map_error(self, exc: BaseException) -> BaseException:
        """See :func:`map_error` (writes already raise mapped errors naming their file; this
        maps whatever else escapes, such as an exception group from a library)."""
        return map_error(exc, "call")

    async def aclose(self, reason: CloseReason = "finished") -> None:
        """Nothing to release, whatever the ``reason``: every write is complete when it
        returns (no open file, no buffered part), and the filesystem is not ours to close
        (fsspec caches and shares its instances across the process)."""

    # -- writes (FsspecWriter) ------------------------------------------------------------------
    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Writes the parts of ``batch`` not yet done (see :meth:`FsspecWriter.write_batch`)."""
        await self._writer.write_batch(run_id, batch)

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self._writer.add_metadata(run_id, **kwargs)

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        await self._writer.add_artifact(run_id, name, path, metadata)

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        """Stores the edge as its own file on both ends (see :meth:`FsspecWriter.add_source`)."""
        await self._writer.add_source(run_id, source_id, artifact_name)

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self._writer.add_metrics(run_id, metrics)

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        """Records how the run ended, now (see :meth:`FsspecWriter.end_run`)."""
        await self._writer.end_run(run_id, reason)

    async def claim_run(self, run_id: str, claim: Mapping[str, object]) -> bool:
        """Claims ``run_id`` in one atomic step: True if this call created its claim, False if
        the run was claimed already (see :meth:`FsspecWriter.claim_run`)."""
        return await self._writer.claim_run(run_id, claim)

    async def run_claim(self, run_id: str) -> dict[str, object] | None:
        """What the claim of ``run_id`` holds (what :meth:`claim_run` was given): None when
        the run has no claim, ``{}`` when it cannot be read as a JSON object (one being
        created shows empty for a moment on local and POSIX filesystems)."""
        data = await self._reader.storage.get(self._reader.path(run_id, CLAIM_FILE))
        if data is None:
            return None
        try:
            claim = json.loads(data)
        except ValueError:
            return {}
        return claim if isinstance(claim, dict) else {}

    async def heartbeat(
        self, run_id: str, interval_s: float, delivery: Mapping[str, object] | None = None
    ) -> None:
        """Writes this process's heartbeat of the run (see :meth:`FsspecWriter.heartbeat`)."""
        await self._writer.heartbeat(run_id, interval_s, delivery)

    async def delete_run(self, run_id: str) -> bool:
        """Removes the run and its edges (see :meth:`FsspecWriter.delete_run`)."""
        return await self._writer.delete_run(run_id)

    # -- reads (FsspecReader, and the run list: summaries.py) ------------------------------------
    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return await self._reader.metadata(run_id)

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return await self._reader.artifacts(run_id)

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        return await self._reader.sources(run_id, artifact_name)

    async def lineage(self, run_id: str) -> Lineage:
        return await self._reader.lineage(run_id)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        """The runs under the root (see :meth:`FsspecReader.run_ids`)."""
        return await self._reader.run_ids(**kwargs)

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return await self._reader.metrics(run_id)

    async def metric_segments(
        self,
        run_id: str,
        parse_json: Callable[[bytes], tuple[_Parsed, str]],
        convert: Callable[[dict[str, Columns]], _Parsed],
        *,
        since: MetricsCursor | None = None,
        names: Collection[str] | None = None,
    ) -> MetricSegments[_Parsed]:
        """The run's live metric files after ``since``, in write order (see
        :meth:`FsspecReader.metric_segments`)."""
        return await self._reader.metric_segments(
            run_id, parse_json, convert, since=since, names=names
        )

    async def run_exists(self, run_id: str) -> bool:
        """Whether the store holds ``run_id`` (see :meth:`FsspecReader.run_exists`)."""
        return await self._reader.run_exists(run_id)

    async def run_status(
        self, run_id: str, now: float | None = None, *, cache: SummaryFileCache | None = None
    ) -> tuple[str, float | None]:
        """How the run ended and when (see :meth:`FsspecReader.run_status`)."""
        return await self._reader.run_status(run_id, now, cache=cache)

    async def heartbeats(self, run_id: str) -> dict[str, dict[str, object]]:
        """Each writer's last heartbeat, by writer token (see :meth:`FsspecReader.heartbeats`)."""
        return await self._reader.heartbeats(run_id)

    async def run_summaries(
        self, now: float | None = None, *, cache: SummaryFileCache | None = None
    ) -> list[RunSummary]:
        """Every run's summary, from the writers' summary files (see
        :func:`~async_tracker.backend.fsspec.summaries.run_summaries`)."""
        return await summaries.run_summaries(self._reader, now, cache=cache)

    async def life_state(self, run_id: str) -> tuple[int, int]:
        """See :meth:`FsspecReader.life_state`."""
        return await self._reader.life_state(run_id)

    def reader(self) -> RunReader:
        """The read side's view of this store (see
        :class:`~async_tracker.backend.fsspec.runreader.FsspecRunReader`)."""
        # Imported here: it reads columns with numpy, which a process that only writes
        # never loads (under lazy_imports: a fork waits for the import).
        with lazy_imports:
            from async_tracker.backend.fsspec.runreader import FsspecRunReader

        return FsspecRunReader(self._reader, f"store {self.url}")

    def __repr__(self) -> str:
        return f"AsyncFsspecTracker({type(self.fs).__name__}, {self.root_dir!r})"


class FsspecTracker(SyncTracker):
    """torchx's ``FsspecTracker(fs, root_dir)``: the blocking face of :class:`AsyncFsspecTracker`.

    Unlike torchx's, the root directory need not exist yet: it is created on first write.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root_dir: str) -> None:
        super().__init__(AsyncFsspecTracker(fs, root_dir))

    def __repr__(self) -> str:
        tracker = self.async_tracker
        assert isinstance(tracker, AsyncFsspecTracker)
        return f"<FsspecTracker: root_path={tracker.root_dir}>"


def create(config_file: str | None) -> FsspecTracker:
    """The ``fsspec`` factory: a tracker from torchx's config file.

    The file names the store either by ``protocol`` (``file``, ``memory``, ``s3`` ...) and
    ``root_path``, as torchx's does, or by one ``url`` (``s3://bucket/prefix``, resolved by
    ``fsspec.core.url_to_fs``, chained URLs included). Every other key goes to the filesystem
    as an option (``client_kwargs.endpoint_url=...`` nests, numbers and booleans parsed).
    """
    if not config_file:
        raise TrackerConfigError(
            "the fsspec tracker needs a config file (TORCHX_TRACKER_FSSPEC_CONFIG) "
            "with 'protocol' and 'root_path', or 'url'"
        )
    config = read_config(config_file)
    if "url" in config:
        if "protocol" in config or "root_path" in config:
            raise TrackerConfigError(
                f"tracker config {config_file!r}: give 'url', or 'protocol' and 'root_path', "
                "not both"
            )
        url = str(config.pop("url"))
        # The URL may hold credentials (user:password@host): only its scheme is shown.
        what = f"the {url.partition('://')[0] if '://' in url else 'file'!r} filesystem"
        try:
            fs, root = fsspec.core.url_to_fs(url, **config)
        except (ImportError, ValueError, TypeError) as exc:
            raise TrackerConfigError(
                f"tracker config {config_file!r}: cannot create {what} "
                f"({type(exc).__name__}; options given: {sorted(config)})"
            ) from exc
        return FsspecTracker(fs, str(root))
    missing = [k for k in ("protocol", "root_path") if k not in config]
    if missing:
        raise TrackerConfigError(
            f"tracker config {config_file!r} lacks {' and '.join(repr(k) for k in missing)} "
            "(or give 'url')"
        )
    protocol = config.pop("protocol")
    root = config.pop("root_path")
    try:
        fs = fsspec.filesystem(protocol, **config)
    except (ImportError, ValueError, TypeError) as exc:
        raise TrackerConfigError(
            f"tracker config {config_file!r}: cannot create the {protocol!r} filesystem "
            f"({type(exc).__name__}; options given: {sorted(config)})"
        ) from exc
    return FsspecTracker(fs, str(root))
