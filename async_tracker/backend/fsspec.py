"""The fsspec backend: torchx's on-disk layout on any fsspec filesystem, written in batches.

Layout under ``root_dir`` (torchx's ``FsspecTracker`` and ``torchx tracker list`` read it)::

    <base32(run_id)>/
        metadata/<name>           {"metadata": {...}}            see "Metadata" below
        artifacts/<base32(name)>  {"name": .., "path": .., "metadata": ..}, one per artifact
        sources/<base32(src)>     artifact names, one per line ("" for none), no repeats
        descendants/<base32(id)>  the same, written into the parent's directory
        metrics/<name>.jsonl      new (torchx ignores it): immutable segments, one per flush
        .tmp/                     staging for atomic renames on filesystems that have them

File names start with the wall-clock time in nanoseconds, then a token unique to the process
(hosts and forks included) and a counter, so names never collide and sort into write order.
A batch that has a ``key`` (fixed when it was cut, before its write-ahead line) names its files
after it: ``metadata/<key>`` and ``metrics/<key>-<digest of the segment>.jsonl``, so that a
retry, or a replay by another process after a crash, overwrites instead of duplicating (the
digest keeps apart the parts of a batch the lane split to find a record the store refused).
A batch without a key gets new names at its first attempt and keeps them for its retries
(``Batch.names``).

Errors: every failure leaves as one :class:`~async_tracker.errors.BackendError` naming the
file, mapped by :func:`map_error` from what fsspec, s3fs, botocore or the OS raised.

Metadata: torchx's reader merges metadata files in directory-listing order, which on local
disks is hash order, not write order. So each process writes its whole merged metadata in
every flush and then removes the file of its previous flush: one file per process, and
whatever order a reader takes, a process's last write wins. Our reader sorts by name, so
across processes the later write wins too.

Metric segments are JSON Lines with one line per metric name, columns of steps, values and
timestamps: ``{"name": "loss", "step": [...], "value": [...], "time": [...]}``. Columns let
the C JSON encoder do the work, and NaN and infinities round-trip (``NaN``, ``Infinity``).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import operator
import os
import posixpath
import secrets
import sys
import threading
import time
from base64 import b32decode, b32encode
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from async_tracker.adapters import SyncTracker
from async_tracker.backend.errors import (
    chain,
    errno_error,
    http_status,
    http_status_error,
    is_network_failure,
    map_group,
)
from async_tracker.base import AsyncTrackerBase
from async_tracker.errors import (
    BackendError,
    PermanentBackendError,
    RecordError,
    TrackerConfigError,
    TransientBackendError,
)
from async_tracker.records import (
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    sort_points,
)
from async_tracker.threads import run_blocking

if sys.version_info < (3, 11):  # pragma: no cover - 3.10
    from exceptiongroup import BaseExceptionGroup

logger = logging.getLogger(__name__)

_NAME = operator.itemgetter(0)

T = TypeVar("T")

METADATA_DIR = "metadata"
ARTIFACTS_DIR = "artifacts"
SOURCES_DIR = "sources"
DESCENDANTS_DIR = "descendants"
METRICS_DIR = "metrics"
TMP_DIR = ".tmp"


def encode_run_id(run_id: str) -> str:
    """torchx's directory name for a run id: base32 of its bytes (UTF-8; torchx's ASCII for
    ASCII ids), uppercase and padded."""
    return b32encode(run_id.encode("utf-8")).decode("ascii")


def decode_run_id(name: str) -> str | None:
    """The run id a directory or file name encodes, or None for a foreign name."""
    try:
        return b32decode(name.encode("ascii")).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        return None


class _Names:
    """Unique, time-ordered object names for this process (a new token after a fork)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._token = f"{secrets.token_hex(4)}{os.getpid():x}"
        self._count = 0
        self._last_ns = 0
        self._lock = threading.Lock()

    def new(self, suffix: str = "") -> str:
        with self._lock:
            # Never go back in time within a process, even if the wall clock does.
            now = max(time.time_ns(), self._last_ns + 1)
            self._last_ns = now
            self._count += 1
            return f"{now}-{self._token}-{self._count:06d}{suffix}"


_names = _Names()


# -- errors ------------------------------------------------------------------------------------

# S3 error codes (botocore's ClientError, which s3fs keeps as the cause of what it raises)
# that may pass by themselves, after s3fs's and botocore's own retries gave up.
S3_TRANSIENT_CODES = frozenset(
    {
        "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
        "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
        "RequestLimitExceeded", "BandwidthLimitExceeded", "ProvisionedThroughputExceededException",
        "RequestTimeout", "RequestTimeoutException", "ServiceUnavailable", "InternalError",
        "OperationAborted", "PriorRequestNotComplete", "Busy",
    }
)  # fmt: skip
# S3 error codes about the object being written: the lane drops that record alone.
S3_RECORD_CODES = frozenset(
    {
        "EntityTooLarge", "KeyTooLongError", "MetadataTooLarge", "InlineDataTooLarge",
        "MaxMessageLengthExceeded", "MaxPostPreDataLengthExceededError",
    }
)  # fmt: skip
# Every other S3 code (AccessDenied, NoSuchBucket, InvalidAccessKeyId, SignatureDoesNotMatch,
# ExpiredToken ...) is about the backend: the records are kept.


def _s3_error(exc: BaseException) -> tuple[str, int | None] | None:
    """(code, HTTP status) of the botocore ClientError in ``exc``'s chain, or None."""
    for cur in chain(exc):
        response = getattr(cur, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            meta = response.get("ResponseMetadata")
            status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
            return str(response["Error"].get("Code") or ""), (
                status if isinstance(status, int) else None
            )
    return None


def map_error(exc: BaseException, what: str) -> BackendError:
    """The package's error for what fsspec (or s3fs, botocore, aiohttp, the OS) raised while
    doing ``what`` (``"write of <path>"``...), naming it.

    * transient: connection and endpoint errors, timeouts, HTTP 408/429/5xx, S3's SlowDown,
      Throttling, RequestTimeout, ServiceUnavailable, InternalError; OSErrors that may pass
      (ECONNRESET, EIO, EAGAIN, ENOENT of a directory removed under us ...);
    * about the backend (the records are kept): S3's AccessDenied, NoSuchBucket,
      InvalidAccessKeyId and every other S3 code; EROFS, EACCES, EPERM, ENOSPC, EDQUOT,
      ENOTDIR ...; any error not recognised;
    * about the record (dropped alone): S3's EntityTooLarge, KeyTooLongError; ENAMETOOLONG,
      EFBIG; HTTP 413.

    Exception groups are unwrapped into one error (transient if any part is).
    """
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        mapped = map_group(exc, lambda e: map_error(e, what))
        if mapped is not None:
            return mapped
    message = f"fsspec {what} failed: {type(exc).__name__}: {exc}"
    s3 = _s3_error(exc)
    if s3 is not None:
        code, status = s3
        message += f" (S3 {code or 'error'}, HTTP {status})"
        if code in S3_TRANSIENT_CODES:
            return TransientBackendError(message)
        if code in S3_RECORD_CODES:
            return RecordError(message)
        if status is not None:
            return http_status_error(status, message)
        return PermanentBackendError(message)
    if isinstance(exc, OSError):
        mapped = errno_error(exc.errno, message)
        if mapped is not None:
            return mapped
    if is_network_failure(exc):
        return TransientBackendError(message)
    status = http_status(exc)
    if status is not None:
        return http_status_error(status, message)
    if isinstance(exc, FileNotFoundError):  # without an errno (memory://): as ENOENT
        return TransientBackendError(message)
    return PermanentBackendError(message)


@contextlib.contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Whatever the block raises leaves as one BackendError about ``what``."""
    try:
        yield
    except BackendError:
        raise
    except Exception as exc:
        raise map_error(exc, what) from exc


def _encode_json(content: object, path: str) -> bytes:
    """``content`` as JSON (NaN and infinities as Python writes them), or RecordError naming
    the file: a value JSON cannot hold (a cycle, an int beyond Python's digit limit, a lone
    surrogate once UTF-8 encoded, an object that is not JSON data)."""
    try:
        return json.dumps(content).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise RecordError(
            f"fsspec cannot encode {path} as JSON: {type(exc).__name__}: {exc}"
        ) from exc


class _Storage:
    """The handful of operations the tracker needs, as coroutines over any fsspec filesystem.

    Async filesystems (s3fs, gcsfs, http) run their own coroutines on fsspec's I/O loop; we
    submit to that loop and await the result, without a thread. Others run in worker threads
    behind the process-wide limiter. Either way the tracker loop itself never blocks on I/O.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, endpoint: str) -> None:
        self.fs = fs
        self.is_async = bool(getattr(fs, "async_impl", False)) and not getattr(
            fs, "asynchronous", False
        )
        self.endpoint = endpoint  # whose limit its worker threads count against
        # Only filesystems with an atomic rename stage files; an object store PUT is atomic.
        self.stages = isinstance(fs, LocalFileSystem)

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            coro = getattr(self.fs, "_" + name)(*args, **kwargs)
            future = asyncio.run_coroutine_threadsafe(coro, self.fs.loop)
            return await asyncio.wrap_future(future)
        call = functools.partial(getattr(self.fs, name), *args, **kwargs)
        return await run_blocking(call, endpoint=self.endpoint)

    async def put(self, path: str, data: bytes, stage_dir: str) -> None:
        with _mapped(f"write of {path}"):
            if self.stages:
                await run_blocking(self._put_staged, path, data, stage_dir, endpoint=self.endpoint)
            else:
                await self._call("pipe_file", path, data)

    def _put_staged(self, path: str, data: bytes, stage_dir: str) -> None:
        self.fs.makedirs(stage_dir, exist_ok=True)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        tmp = posixpath.join(stage_dir, secrets.token_hex(8))
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        except BaseException:
            # A full disk may have left part of the file: do not leave it behind.
            with contextlib.suppress(Exception):
                if self.fs.exists(tmp):
                    self.fs.rm_file(tmp)
            raise

    async def get(self, path: str) -> bytes | None:
        with _mapped(f"read of {path}"):
            try:
                data: bytes = await self._call("cat_file", path)
                return data
            except FileNotFoundError:
                return None

    async def ls(self, path: str) -> list[tuple[str, str]]:
        """``(basename, type)`` of each entry, sorted by name; [] for a missing directory.
        The listing cache is dropped first: other processes write here too."""
        with _mapped(f"listing of {path}"):
            self.fs.invalidate_cache(path)
            try:
                entries = await self._call("ls", path, detail=True)
            except FileNotFoundError:
                return []
        out = [(posixpath.basename(e["name"].rstrip("/")), e.get("type", "file")) for e in entries]
        return sorted(out)

    async def rm(self, path: str) -> None:
        with _mapped(f"removal of {path}"):
            try:
                await self._call("rm_file", path)
            except FileNotFoundError:
                pass

    async def exists(self, path: str) -> bool:
        with _mapped(f"lookup of {path}"):
            return bool(await self._call("exists", path))


class AsyncFsspecTracker(AsyncTrackerBase):
    """Runs stored under ``root_dir`` of an fsspec filesystem, in torchx's layout.

    ``write_batch`` writes one metadata file, one file per distinct artifact, the source and
    descendant files, and one metrics segment per flush. Reads sort by name and skip, with one
    warning per read, files they cannot parse.
    """

    name = "fsspec"

    def __init__(self, fs: fsspec.AbstractFileSystem, root_dir: str) -> None:
        self.fs = fs
        self.root_dir = fs._strip_protocol(root_dir).rstrip("/") or "/"
        self._storage = _Storage(fs, fs.unstrip_protocol(self.root_dir))
        # Per run: (pid, merged metadata, name of our last metadata file). The pid makes a
        # forked child start afresh instead of removing its parent's file.
        self._metadata_state: dict[str, tuple[int, dict[str, object], str | None]] = {}

    def _run_dir(self, run_id: str) -> str:
        return posixpath.join(self.root_dir, encode_run_id(run_id))

    def _path(self, run_id: str, *parts: str) -> str:
        return posixpath.join(self._run_dir(run_id), *parts)

    async def _put_json(self, run_id: str, path: str, content: object) -> None:
        await self._storage.put(path, _encode_json(content, path), self._path(run_id, TMP_DIR))

    # -- writes ---------------------------------------------------------------------------------
    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Writes the parts of ``batch`` not yet done. Any failure leaves as one
        :class:`~async_tracker.errors.BackendError` naming the file (see :func:`map_error`)."""
        with _mapped(f"write of run {run_id!r}"):
            await self._write_batch(run_id, batch)

    async def _write_batch(self, run_id: str, batch: Batch) -> None:
        if batch.metadata and "metadata" not in batch.done:
            await self._write_metadata(run_id, batch.metadata, batch.names, batch.key)
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
        if batch.metrics and "metrics" not in batch.done:
            await self._write_segment(run_id, batch.metrics, batch.names, batch.key)
            batch.done.add("metrics")

    async def _write_metadata(
        self, run_id: str, metadata: Mapping[str, object], names: dict[str, str], key: str = ""
    ) -> None:
        pid = os.getpid()
        state = self._metadata_state.get(run_id)
        fresh = state is None or state[0] != pid
        if state is None or fresh:
            state = (pid, {}, None)
        _, merged, previous = state
        merged = {**merged, **metadata}
        name = key or names.setdefault("metadata", _names.new())
        path = self._path(run_id, METADATA_DIR, name)
        if fresh and key:
            # A file already under this batch's key was written by an earlier attempt at
            # this batch: a replay after a crash, by a process that has no metadata state
            # yet. That attempt's file held all its process had written before, and removed
            # since: keep it, under this batch's values.
            merged = {**await self._earlier_metadata(path), **merged}
        await self._put_json(run_id, path, {"metadata": merged})
        self._metadata_state[run_id] = (pid, merged, name)
        if previous is not None and previous != name:
            # Superseded by the file just written, which holds all it held.
            await self._storage.rm(self._path(run_id, METADATA_DIR, previous))

    async def _earlier_metadata(self, path: str) -> dict[str, object]:
        try:
            data = await self._storage.get(path)
        except TransientBackendError:
            raise
        except PermanentBackendError as exc:  # a store that lets us write but not read
            logger.debug("async_tracker: cannot read %s before replacing it: %s", path, exc)
            return {}
        if data is None:
            return {}
        try:
            return _as_dict(json.loads(data)["metadata"])
        except (ValueError, TypeError, KeyError, UnicodeError):
            return {}

    async def _write_segment(
        self, run_id: str, metrics: Sequence[TrackerMetric], names: dict[str, str], key: str = ""
    ) -> None:
        # Grouped by name with C loops (a stable sort keeps each name's points in order,
        # zip makes the columns): no Python loop per point.
        grouped: dict[str, tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]] = {}
        for name, group in itertools.groupby(sorted(metrics, key=_NAME), key=_NAME):
            _, values, steps, times = zip(*group)
            grouped[name] = (steps, values, times)
        # Lines in the order the names first came (readers list metrics in that order).
        columns = {name: grouped[name] for name in dict.fromkeys(map(_NAME, metrics))}
        where = self._path(run_id, METRICS_DIR)
        data = b"".join(
            _encode_json({"name": n, "step": s, "value": v, "time": t}, f"metric {n!r} in {where}")
            + b"\n"
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
        await self._write_metadata(run_id, kwargs, {})

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

    async def _add_line(self, run_id: str, path: str, line: str) -> None:
        """Adds ``line`` to a small text file unless present (read, then one atomic write)."""
        old = await self._storage.get(path)
        lines = old.decode("utf-8", errors="surrogateescape").split("\n")[:-1] if old else []
        if line in lines:
            return
        lines.append(line)
        data = ("\n".join(lines) + "\n").encode("utf-8", errors="surrogateescape")
        await self._storage.put(path, data, self._path(run_id, TMP_DIR))

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        line = artifact_name or ""
        try:
            line.encode("utf-8")
            source_file = encode_run_id(source_id)
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 name or line for it
            raise RecordError(
                f"fsspec cannot store source {source_id!r} (artifact {artifact_name!r}) of run "
                f"{run_id!r}: {exc}"
            ) from exc
        await self._add_line(run_id, self._path(run_id, SOURCES_DIR, source_file), line)
        await self._add_line(
            source_id, self._path(source_id, DESCENDANTS_DIR, encode_run_id(run_id)), line
        )

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self._write_segment(run_id, metrics, {})

    # -- reads ----------------------------------------------------------------------------------
    async def _read_dir(
        self, directory: str, parse: Callable[[str, bytes], T], skipped: list[str]
    ) -> list[T]:
        out: list[T] = []
        for name, kind in await self._storage.ls(directory):
            if kind != "file":
                skipped.append(posixpath.join(directory, name))
                continue
            data = await self._storage.get(posixpath.join(directory, name))
            if data is None:  # removed since listed (a superseded metadata file)
                continue
            try:
                out.append(parse(name, data))
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeError):
                skipped.append(posixpath.join(directory, name))
        return out

    @staticmethod
    def _warn(skipped: list[str]) -> None:
        if skipped:
            logger.warning(
                "async_tracker: skipped %d entries that are not tracker records: %s",
                len(skipped), ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""),
            )

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        skipped: list[str] = []
        entries = await self._read_dir(
            self._path(run_id, METADATA_DIR), lambda _, d: _as_dict(json.loads(d)["metadata"]),
            skipped,
        )
        self._warn(skipped)
        merged: dict[str, object] = {}
        for entry in entries:
            merged.update(entry)
        return merged

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        skipped: list[str] = []
        entries = await self._read_dir(
            self._path(run_id, ARTIFACTS_DIR), lambda _, d: _parse_artifact(d), skipped
        )
        self._warn(skipped)
        return {a.name: a for a in entries}

    async def _edges(self, run_id: str, category: str) -> list[TrackerSource]:
        skipped: list[str] = []

        def parse(name: str, data: bytes) -> list[TrackerSource]:
            other = decode_run_id(name)
            if other is None:
                raise ValueError(name)
            lines = data.decode("utf-8").splitlines()
            names = list(dict.fromkeys(line.strip() for line in lines))
            if not names:
                names = [""]
            return [TrackerSource(other, n or None) for n in names]

        groups = await self._read_dir(self._path(run_id, category), parse, skipped)
        self._warn(skipped)
        return [s for g in groups for s in g]

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        edges = await self._edges(run_id, SOURCES_DIR)
        if artifact_name is None:
            return edges
        return [s for s in edges if s.artifact_name == artifact_name]

    async def lineage(self, run_id: str) -> Lineage:
        return Lineage(
            run_id,
            parents=await self._edges(run_id, SOURCES_DIR),
            descendants=await self._edges(run_id, DESCENDANTS_DIR),
        )

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        parent = kwargs.get("parent_run_id")
        ids: list[str] = []
        foreign: list[str] = []
        for name, kind in await self._storage.ls(self.root_dir):
            run_id = decode_run_id(name) if kind == "directory" else None
            if run_id is None:
                foreign.append(name)
                continue
            if parent is not None and not await self._storage.exists(
                self._path(run_id, SOURCES_DIR, encode_run_id(parent))
            ):
                continue
            ids.append(run_id)
        self._warn(foreign)
        return ids

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        skipped: list[str] = []
        segments = await self._read_dir(
            self._path(run_id, METRICS_DIR), lambda _, d: _parse_segment(d), skipped
        )
        self._warn(skipped)
        # Keyed by (step, client timestamp): a point written twice (a retry whose first try
        # reached the store after all) is one point.
        points: dict[str, dict[tuple[int, float], TrackerMetric]] = {}
        for segment in segments:
            for name, seg_points in segment.items():
                store = points.setdefault(name, {})
                for p in seg_points:
                    store[(p.step, p.timestamp)] = p
        return {name: sort_points(list(p.values())) for name, p in points.items()}

    def __repr__(self) -> str:
        return f"AsyncFsspecTracker({type(self.fs).__name__}, {self.root_dir!r})"


def _as_dict(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TypeError("metadata file does not hold a mapping")
    return value


def _parse_artifact(data: bytes) -> TrackerArtifact:
    entry = json.loads(data)
    meta = entry.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError("artifact metadata is not a mapping")
    return TrackerArtifact(str(entry["name"]), str(entry["path"]), meta)


def _parse_segment(data: bytes) -> dict[str, list[TrackerMetric]]:
    out: dict[str, list[TrackerMetric]] = {}
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            continue
        col = json.loads(line)
        name = col["name"]
        if not isinstance(name, str):
            raise TypeError("metric name is not a string")
        steps, values, times = col["step"], col["value"], col["time"]
        if not len(steps) == len(values) == len(times):
            raise ValueError("segment columns differ in length")
        out.setdefault(name, []).extend(
            TrackerMetric(name, float(v), int(s), float(t))
            for s, v, t in zip(steps, values, times)
        )
    return out


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


# -- torchx's config file --------------------------------------------------------------------


def _put_config(config: dict[str, Any], key: str, value: object, where: str) -> None:
    parts = key.split(".")
    if any(not p for p in parts):
        raise TrackerConfigError(f"{where}: malformed key {key!r}")
    node = config
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TrackerConfigError(f"{where}: key {key!r} conflicts with a value set earlier")
        node = child
    node[parts[-1]] = value


def _config_value(raw: str) -> object:
    # fsspec filesystems want booleans, not the strings "true"/"false" (which are truthy).
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    return raw


def read_config(config_file: str) -> dict[str, Any]:
    """Reads torchx's ``key=value`` tracker config: ``#`` comments, dotted keys nest.

    Values are never logged nor put in error messages: configs hold credentials.
    """
    try:
        with fsspec.open(config_file, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as exc:
        raise TrackerConfigError(f"cannot read tracker config {config_file!r}: {exc}") from exc
    config: dict[str, Any] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        key, sep, value = stripped.partition("=")
        where = f"{config_file}, line {lineno}"
        if not sep or not key.strip():
            raise TrackerConfigError(f"{where}: expected key=value")
        _put_config(config, key.strip(), _config_value(value.strip()), where)
    return config


def create(config_file: str | None) -> FsspecTracker:
    """The ``fsspec`` factory: a tracker from torchx's config file.

    The file needs ``protocol`` (``file``, ``memory``, ``s3`` ...) and ``root_path``; every
    other key goes to ``fsspec.filesystem`` (``client_kwargs.endpoint_url=...`` nests).
    """
    if not config_file:
        raise TrackerConfigError(
            "the fsspec tracker needs a config file (TORCHX_TRACKER_FSSPEC_CONFIG) "
            "with 'protocol' and 'root_path'"
        )
    config = read_config(config_file)
    missing = [k for k in ("protocol", "root_path") if k not in config]
    if missing:
        raise TrackerConfigError(
            f"tracker config {config_file!r} lacks {' and '.join(repr(k) for k in missing)}"
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
