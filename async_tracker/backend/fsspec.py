"""The fsspec backend: torchx's on-disk layout on any fsspec filesystem, written in batches.

Layout under ``root_dir`` (torchx's ``FsspecTracker`` and ``torchx tracker list`` read it)::

    <base32(run_id)>/
        metadata/<time>-<tag>-<n>-<digest(key)> {"metadata": {key: value}}, one per key write
        artifacts/<base32(name)>                {"name": .., "path": .., "metadata": ..}
        sources/<base32(src)>                   artifact names, one a line ("" for none)
        parents/<base32(src)>.<digest(art)>     new: one file per lineage edge (its artifact)
        descendants/<base32(id)>.<digest(art)>  the same edge, in the source's directory
        metrics/<name>.jsonl                    new (torchx ignores it): immutable segments
        .tmp/                                   staging for atomic renames, where there are
    .summary-<digest(run_id)>-<writer token>.json   new: what each writing process wrote, summed
    .summary-<digest(run_id)>-rebuilt.json          new: the same, rebuilt by a reader once

Names of metadata and metric files start with the wall-clock time in nanoseconds, then a tag
unique to the process (hosts and forks included) and a counter, so they never collide and
sort into write order. A batch that has a ``key`` (fixed when it was cut, before its
write-ahead line) uses it as the tag: ``metadata/<key>-<n>-<digest>`` and
``metrics/<key>-<digest of the segment>.jsonl``, so that a retry, or a replay by another
process after a crash, overwrites instead of duplicating. A batch without a key gets a tag at
its first attempt and keeps it for its retries (``Batch.names``).

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

Reads sort by name and skip what they cannot parse (a foreign file, a truncated line, JSON
nested too deep, a step that is not an integer, a file where a directory should be) with one
warning per read naming the files.

Errors: every failure leaves as one :class:`~async_tracker.errors.BackendError` naming the
file, mapped by :func:`map_error` from what fsspec, s3fs, botocore or the OS raised.

Summaries. Each process keeps, per run it writes, a summary of what it wrote (params, each
metric's last/min/max/count/last step, start, end, its last heartbeat; see
``async_tracker.store.summary``) and rewrites it whole at the end of each ``write_batch`` (a
flush boundary, never per point) and at each heartbeat. Readers of the run list
(:meth:`run_summaries`) read those files only, merging the writers' summaries. They sit at the
store's root, not in the run's directory, and hold the run id: one listing of the root finds
every run and every summary, so the list costs one listing (a request per 1,000 entries on
object stores) plus one small read per summary, where a folder per run would cost a listing
per run. torchx's reader skips files at the root; the leading dot hides them from ``ls``.
A batch counts once in its writer's summary whatever happens to it: it is named by the
batch's writer token (a replay by another process continues that writer's summary from the
store), and the summary keeps which batches it counts (see ``WriterSummary.counted``). A run
without any summary (written before summaries existed, or by torchx) is summarised from its
files once, per writer token found in the file names, and that is kept as the run's
``rebuilt`` summary; a writer's own summary replaces the rebuilt part of its token, so nothing
counts twice when a writer was still writing while a reader rebuilt.

Metric segments are JSON Lines with one line per metric name, columns of steps, values and
timestamps: ``{"name": "loss", "step": [...], "value": [...], "time": [...]}``. Columns let
the C JSON encoder do the work, and NaN and infinities round-trip (``NaN``, ``Infinity``).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import dataclasses
import errno
import functools
import hashlib
import itertools
import json
import logging
import math
import operator
import os
import posixpath
import re
import secrets
import threading
import time
from base64 import b32decode, b32encode
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

import anyio
import fsspec
import fsspec.core
import orjson
from fsspec.implementations.local import LocalFileSystem

from async_tracker.adapters import SyncTracker
from async_tracker.backend.errors import map_failure
from async_tracker.base import END_PART, AsyncTrackerBase, Checked, CloseReason
from async_tracker.error_table import s3_error
from async_tracker.errors import (
    BackendError,
    BackendUnavailableError,
    RecordError,
    TrackerConfigError,
)
from async_tracker.records import (
    Batch,
    Lineage,
    MetricRow,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    sort_points,
)
from async_tracker.runtime.loop import wait_future
from async_tracker.runtime.process import run_blocking
from async_tracker.settings import CRASHED_AFTER_BEATS
from async_tracker.store.summary import (
    RunSummary,
    WriterSummary,
    merge,
    summarize_columns,
)

logger = logging.getLogger(__name__)

_NAME = operator.itemgetter(0)
# Builds a TrackerMetric from a 4-tuple without its Python __new__ (a C call per point).
_METRIC = itertools.repeat(TrackerMetric)

T = TypeVar("T")
# What a metric_segments caller's parser makes of one segment.
_Parsed = TypeVar("_Parsed")

METADATA_DIR = "metadata"
ARTIFACTS_DIR = "artifacts"
SOURCES_DIR = "sources"
PARENTS_DIR = "parents"
DESCENDANTS_DIR = "descendants"
METRICS_DIR = "metrics"
TMP_DIR = ".tmp"
# How the run ended, one file per writing process: not a record torchx knows (its reader
# never lists this folder) and not one that makes a directory a run's (see RUN_PARTS).
STATUS_DIR = "status"
# When several processes end one run, the worst ending wins: a failed rank fails the run.
_STATUS_RANK = {"finished": 0, "killed": 1, "failed": 2}
# A live run's heartbeat, one file per writing process: ``{"time": .., "interval_s": ..}``.
# A run that never ended and whose every heartbeat is older than CRASHED_AFTER_BEATS of its
# intervals reads as crashed (not a run part either).
HEARTBEAT_DIR = "heartbeat"
# What each writing process wrote to a run, summed (see "Summaries" above): a file at the
# store's root, ``.summary-<digest of the run id>-<writer token>.json``; the run's rebuilt
# summary has the token ``rebuilt`` (writer tokens are hex, or digits, an "x" and hex).
SUMMARY_PREFIX = ".summary-"
REBUILT_TOKEN = "rebuilt"
_SUMMARY_FILE = re.compile(r"\.summary-[0-9a-f]{16}-([0-9a-fx]+|rebuilt)\.json")
# The token in a file name of ours: "<19-digit time>-<token>-..." (metadata, segments).
_FILE_TOKEN = re.compile(r"\d{19}-([^-]+)-")
# The writer token in a batch key "<19-digit time>-<token>-<seq>[.part...]".
_KEY_TOKEN = re.compile(r"\d{19}-(\d{19}x[0-9a-f]+)-")
# What makes a directory a run's: any record the run wrote itself. A directory holding only
# ``descendants/`` is the other end of an edge (a data set, a parent in another store).
# The run's claim: a small JSON file that its creator writes by an atomic create-if-absent
# (see AsyncFsspecTracker.claim_run), so that of several processes creating one run id
# exactly one succeeds. It makes the directory a run's from its start, before any record;
# torchx's reader only reads the folders it knows and never sees it.
CLAIM_FILE = "claim.json"
RUN_PARTS = frozenset(
    {METADATA_DIR, ARTIFACTS_DIR, SOURCES_DIR, PARENTS_DIR, METRICS_DIR, CLAIM_FILE}
)
# What a run holds once something wrote records to it (its claim aside).
_RECORD_PARTS = (RUN_PARTS - {CLAIM_FILE}) | {STATUS_DIR}

# One path component on common local filesystems (ext4, xfs, apfs, NTFS). Enforced on every
# filesystem: a store is copied between disks and buckets, and torchx reads both.
MAX_FILE_NAME_BYTES = 255
DIGEST_CHARS = 16  # 64 bits of sha256: a collision among one run's keys is not a concern
# A metadata file of ours: "<19-digit time>-<tag>-<position>-<digest of the key>".
_KEY_FILE = re.compile(r"\d{19}-.+-([0-9a-f]{16})")
_DIGEST = re.compile(r"[0-9a-f]{16}")
_LEADING_DIGITS = re.compile(r"\d+")
# At most this many reads (or removals) of one call in flight at once.
MAX_CONCURRENT_FILES = 32

# What a read skips a file for: what json.loads and the checks below raise on a foreign,
# corrupt or truncated file (RecursionError: nested too deep; OverflowError: a huge number).
_UNPARSEABLE = (
    ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, OverflowError,
)  # fmt: skip


def encode_run_id(run_id: str) -> str:
    """torchx's directory name for a run id: base32 of its bytes (UTF-8; torchx's ASCII for
    ASCII ids), uppercase and padded."""
    return b32encode(run_id.encode("utf-8")).decode("ascii")


def summary_path(root_dir: str, run_id: str, writer: str) -> str:
    """Where the store at ``root_dir`` keeps the summary of ``run_id`` by ``writer`` (see
    "Summaries" above): named by a digest of the id, which a base32 name of the longest ids
    would not fit beside a writer token."""
    return posixpath.join(root_dir, f"{SUMMARY_PREFIX}{_digest(run_id)}-{writer}.json")


def decode_run_id(name: str) -> str | None:
    """The run id a directory or file name encodes, or None for a foreign name."""
    try:
        return b32decode(name.encode("ascii")).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        return None


def _beside_runs(name: str, is_dir: bool) -> bool:
    """Whether an entry of the store's root that is not named as a run is the store's own,
    skipped without a word: a file (its fsspec config file, a ``.torchxconfig``, a plot) or
    a hidden folder. A run is a directory with a base32 name, so these cannot be a damaged
    run, and naming them at every read would bury the warnings that matter."""
    return not is_dir or name.startswith(".")


class _Names:
    """Unique, time-ordered object names for this process: its token is new in a forked child
    (a pid check; with its own counter and lock, never one the parent's threads held)."""

    class _State:
        def __init__(self) -> None:
            self.token = f"{secrets.token_hex(4)}{os.getpid():x}"
            self.count = 0
            self.last_ns = 0
            self.lock = threading.Lock()

    def __init__(self) -> None:
        self._by_pid: dict[int, _Names._State] = {}

    def _state(self) -> _Names._State:
        pid = os.getpid()
        state = self._by_pid.get(pid)
        if state is None:
            # setdefault is atomic under the GIL: racing threads of a new process share one.
            state = self._by_pid.setdefault(pid, _Names._State())
        return state

    @property
    def token(self) -> str:
        """This process's token: unique across processes and hosts."""
        return self._state().token

    def new(self, suffix: str = "") -> str:
        state = self._state()
        with state.lock:
            # Never go back in time within a process, even if the wall clock does.
            now = max(time.time_ns(), state.last_ns + 1)
            state.last_ns = now
            state.count += 1
            return f"{now}-{state.token}-{state.count:06d}{suffix}"


_names = _Names()


# -- errors ------------------------------------------------------------------------------------


def _message(what: str) -> Callable[[BaseException], str]:
    def message(exc: BaseException) -> str:
        text = f"fsspec {what} failed: {type(exc).__name__}: {exc}"
        s3 = s3_error(exc)
        if s3 is not None:
            code, status = s3
            text += f" (S3 {code or 'error'}, HTTP {status})"
        return text

    return message


def map_error(exc: BaseException, what: str) -> BackendError:
    """The package's error for what fsspec (or s3fs, botocore, aiohttp, the OS) raised while
    doing ``what`` (``"write of <path>"``...), naming it (and the S3 code and HTTP status of
    an S3 error answer), mapped by the shared table
    (:data:`~async_tracker.error_table.SHARED_TABLE`; fsspec adds no rows of its own):

    * transient: connection and endpoint errors, timeouts, HTTP 408/429/5xx, S3's SlowDown,
      Throttling, RequestTimeout, ServiceUnavailable, InternalError; OSErrors that may pass
      (ECONNRESET, EIO, EAGAIN, ENOENT of a directory removed under us ...);
    * about the backend (the records are kept): S3's AccessDenied, NoSuchBucket,
      InvalidAccessKeyId and every other S3 code; EROFS, EACCES, EPERM, ENOSPC, EDQUOT,
      ENOTDIR ...; any error not recognised;
    * about the record (dropped alone): S3's EntityTooLarge, KeyTooLongError; ENAMETOOLONG,
      EFBIG; HTTP 413.

    An error already mapped is returned as it is; exception groups are unwrapped into one
    error (transient if any part is).
    """
    return map_failure(exc, _message(what))


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


_Columns = tuple[Sequence[int], Sequence[float], Sequence[float]]
MAX_STRIDE = 256  # names per step looked for by _columns_by_name's strided case


def _columns_by_name(rows: Sequence[MetricRow]) -> dict[str, _Columns]:
    """Each name's steps, values and times in call order, the names in the order they first
    came (readers list metrics in that order). Made with C loops, no Python loop per point.

    A training loop logs the same names in the same order at every step, and then each
    name's points are a stride of the columns: found by the first name's next occurrence,
    spot-checked at the middle and the end (a batch that is not strided mostly fails there,
    at no cost), then checked whole. Any other batch is grouped by a stable sort."""
    if not rows:
        return {}
    n, first = len(rows), rows[0][0]
    period = next((i for i in range(1, min(n, MAX_STRIDE + 1)) if rows[i][0] == first), n)
    if all(rows[i][0] == rows[i % period][0] for i in (n // 2, n - 1)):
        names = tuple(map(_NAME, rows))
        firsts = names[:period]
        if len(set(firsts)) == period and all(
            names[i::period].count(name) == len(names[i::period])
            for i, name in enumerate(firsts)
        ):
            _, values, steps, times = zip(*rows)
            return {
                name: (steps[i::period], values[i::period], times[i::period])
                for i, name in enumerate(firsts)
            }
    grouped: dict[str, _Columns] = {}
    for name, group in itertools.groupby(sorted(rows, key=_NAME), key=_NAME):
        _, group_values, group_steps, group_times = zip(*group)
        grouped[name] = (group_steps, group_values, group_times)
    return {name: grouped[name] for name in dict.fromkeys(map(_NAME, rows))}


def _encode_column(
    name: str, steps: Sequence[int], values: Sequence[float], times: Sequence[float], path: str
) -> bytes:
    """One line of a metrics segment. orjson writes numbers some twenty times faster than the
    json module (the flusher shares the GIL with the training loop), but writes NaN and
    infinities as null: a column holding one (its sum is then not finite; a sum of finite
    values that overflows only costs the slower path), or a step beyond 64 bits, takes the
    json module, which keeps them."""
    line = {"name": name, "step": steps, "value": values, "time": times}
    if math.isfinite(sum(values)) and math.isfinite(sum(times)):
        try:
            return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError:
            pass  # a step beyond 64 bits, a lone surrogate: json says which
    return _encode_json(line, path) + b"\n"


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
            return await wait_future(future)  # from any event loop (asyncio, trio)
        call = functools.partial(getattr(self.fs, name), *args, **kwargs)
        return await run_blocking(call, endpoint=self.endpoint)

    async def put(self, path: str, data: bytes, stage_dir: str) -> None:
        await self.put_many({path: data}, stage_dir)

    async def put_many(self, files: Mapping[str, bytes], stage_dir: str) -> None:
        """Writes each of ``files`` (path: content). A failure names the file it was about,
        once every write has ended (none is left running behind the error)."""
        if not files:
            return
        if self.is_async:
            await _gather_bounded([self._pipe(path, data) for path, data in files.items()])
        else:
            # One worker-thread call for them all: the thread hop costs more than a small
            # local write.
            await run_blocking(self._put_many_sync, files, stage_dir, endpoint=self.endpoint)

    async def _pipe(self, path: str, data: bytes) -> None:
        with _mapped(f"write of {path}"):
            await self._call("pipe_file", path, data)

    def _put_many_sync(self, files: Mapping[str, bytes], stage_dir: str) -> None:
        for path, data in files.items():
            with _mapped(f"write of {path}"):
                if self.stages:
                    self._put_staged(path, data, stage_dir)
                else:
                    self.fs.pipe_file(path, data)

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
        """``(basename, type)`` of each entry, sorted by name; [] for a missing directory;
        :class:`NotADirectory` for a file. The listing cache is dropped first: other
        processes write here too."""
        return [(name, kind) for name, kind, _ in await self.ls_versions(path)]

    async def ls_versions(self, path: str) -> list[tuple[str, str, Hashable]]:
        """:meth:`ls`, each entry with what tells its content apart from an earlier one
        (size and ETag, or size and modification time; None where the filesystem gives
        neither): what a reader that keeps files compares."""
        entries: list[dict[str, Any]] | None
        with _mapped(f"listing of {path}"):
            self.fs.invalidate_cache(path)
            try:
                entries = await self._call("ls", path, detail=True)
            except FileNotFoundError:
                return []
            except NotADirectoryError:
                # Raised outside _mapped: a file on the path (this directory or one above
                # it) is corrupt data for a read to skip, not a failure of the backend.
                entries = None
        if entries is None:
            raise NotADirectory(path)
        # fsspec lists a file as itself (local, memory and s3 alike).
        if (
            len(entries) == 1
            and entries[0].get("type") == "file"
            and entries[0]["name"].rstrip("/") == path.rstrip("/")
        ):
            raise NotADirectory(path)
        out = [
            (posixpath.basename(e["name"].rstrip("/")), e.get("type", "file"), _version_of(e))
            for e in entries
        ]
        return sorted(out, key=_NAME)

    async def rm_many(self, paths: Sequence[str]) -> None:
        """Removes ``paths``; one already gone (another writer removed it) is no error."""
        if not paths:
            return
        if not self.is_async:
            await run_blocking(self._rm_many_sync, paths, endpoint=self.endpoint)
            return
        await _gather_bounded([self.rm(path) for path in paths])

    def _rm_many_sync(self, paths: Sequence[str]) -> None:
        for path in paths:
            with _mapped(f"removal of {path}"), contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

    async def rm(self, path: str) -> None:
        with _mapped(f"removal of {path}"):
            try:
                await self._call("rm_file", path)
            except FileNotFoundError:
                pass

    async def rm_tree(self, path: str) -> None:
        """Removes the directory ``path`` and everything under it (on object stores: every
        key under its prefix, listed then deleted in bulk); one already gone is no error."""
        with _mapped(f"removal of {path}"):
            self.fs.invalidate_cache(path)
            try:
                await self._call("rm", path, recursive=True)
            except FileNotFoundError:
                pass
            finally:
                self.fs.invalidate_cache(path)

    async def glob(self, pattern: str) -> list[str]:
        """The paths matching ``pattern`` (on object stores: a listing of the prefix before
        its first wildcard)."""
        with _mapped(f"listing of {pattern}"):
            self.fs.invalidate_cache(posixpath.dirname(pattern))
            return [str(p) for p in await self._call("glob", pattern)]

    async def exists(self, path: str) -> bool:
        with _mapped(f"lookup of {path}"):
            return bool(await self._call("exists", path))

    async def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory (on object stores: one request for one key under
        its prefix)."""
        with _mapped(f"lookup of {path}"):
            self.fs.invalidate_cache(path)
            return bool(await self._call("isdir", path))

    async def create(self, path: str, data: bytes) -> bool:
        """Writes ``path`` unless it exists, as one atomic step: True if this call created
        it, False if it was there. Local and POSIX filesystems (NFS included) create it with
        ``O_EXCL``; s3fs sends a conditional PUT (``If-None-Match: *``, which S3 and moto
        honour); other filesystems get fsspec's ``mode="create"``, which for those without a
        conditional write is a lookup then a write (not atomic: two creators racing within
        one round trip may both succeed)."""
        with _mapped(f"exclusive create of {path}"):
            try:
                if self.stages:
                    await run_blocking(self._create_local, path, data, endpoint=self.endpoint)
                else:
                    await self._call("pipe_file", path, data, mode="create")
            except FileExistsError:
                return False
        return True

    @staticmethod
    def _create_local(path: str, data: bytes) -> None:
        directory = posixpath.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
        except FileExistsError:  # a file where the directory should be: not "claimed"
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory) from None
        # O_EXCL: the kernel (or the NFS server) creates the file only if no other did. A
        # reader may see it empty for a moment; what counts is that it exists.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


class NotADirectory(Exception):
    """A file where the layout has a directory (a corrupt or foreign store)."""


async def _gather_bounded(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """The results of ``awaitables``, at most :data:`MAX_CONCURRENT_FILES` in flight: reads
    of a run's files overlap (one round trip each on object stores), without opening
    hundreds of connections at once. Every one ends before an error is raised (the first by
    position). anyio, not asyncio.gather: a backend called directly from trio code works."""
    limiter = anyio.CapacityLimiter(MAX_CONCURRENT_FILES)
    results: list[Any] = [None] * len(awaitables)
    errors: dict[int, Exception] = {}

    async def one(i: int, aw: Awaitable[T]) -> None:
        async with limiter:
            try:
                results[i] = await aw
            except Exception as exc:
                errors[i] = exc

    async with anyio.create_task_group() as tg:
        for i, aw in enumerate(awaitables):
            tg.start_soon(one, i, aw)
    if errors:
        raise errors[min(errors)]
    return results


class AsyncFsspecTracker(AsyncTrackerBase):
    """Runs stored under ``root_dir`` of an fsspec filesystem, in torchx's layout.

    ``write_batch`` writes one file per metadata key, one file per distinct artifact, the
    lineage files, and one metrics segment per flush. Many processes may write one run at
    once: the last write of a metadata key wins, and no lineage edge is lost. Reads sort by
    name and skip, with one warning per read naming them, files they cannot parse.
    """

    name = "fsspec"

    def __init__(self, fs: fsspec.AbstractFileSystem, root_dir: str) -> None:
        self.fs = fs
        self.root_dir = fs._strip_protocol(root_dir).rstrip("/") or "/"
        # The store as a URL (file:///data/runs, s3://bucket/runs): what
        # `async-tracker sync --to` takes to deliver spooled records here.
        url = fs.unstrip_protocol(self.root_dir)
        self.store_url: str | None = url
        self._storage = _Storage(fs, url)
        # The store's identity: parts of a batch done here are not done elsewhere.
        self.store_id = url
        # This process's summary of each (run, writer token) it writes: touched on the loop
        # only (write_batch and the direct calls), each behind its own lock.
        self._tallies: dict[tuple[str, str], _Tally] = {}
        # This process's last heartbeat of each run it writes: (time, interval_s).
        self._beats: dict[str, tuple[float, float]] = {}

    def _run_dir(self, run_id: str) -> str:
        return posixpath.join(self.root_dir, encode_run_id(run_id))

    def summary_path(self, run_id: str, writer: str) -> str:
        """The file of the summary of ``run_id`` by ``writer`` (a token, or ``rebuilt``)."""
        return summary_path(self.root_dir, run_id, writer)

    def _path(self, run_id: str, *parts: str) -> str:
        return posixpath.join(self._run_dir(run_id), *parts)

    async def _put_json(self, run_id: str, path: str, content: object) -> None:
        await self._storage.put(path, _encode_json(content, path), self._path(run_id, TMP_DIR))

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
        return await self._storage.create(path, _encode_json(dict(claim), path))

    async def run_exists(self, run_id: str) -> bool:
        """Whether the store holds ``run_id`` (its claim or any record it wrote), asking about
        the run's own directory alone, never the store: one request on object stores for a
        new run (is there a directory), then its listing. A file where the run's directory
        should be is a BackendUnavailableError."""
        run_dir = self._run_dir(run_id)
        # Not a listing straight away: s3fs lists a missing directory's parent (the whole
        # store, a page per 1,000 runs) to see whether it is a file.
        if not await self._storage.isdir(run_dir):
            return False
        try:
            entries = await self._storage.ls(run_dir)
        except NotADirectory:
            raise BackendUnavailableError(
                f"fsspec: {run_dir} is a file where the directory of run {run_id!r} should be"
            ) from None
        return not RUN_PARTS.isdisjoint(name for name, _ in entries)

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
        # The summaries after the directory: a reader in between sees summaries without a run
        # (skipped), never a run without its summaries (which it would rebuild and keep).
        await self._storage.rm_many(
            await self._storage.glob(self.summary_path(run_id, "*"))
        )
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
        readers need to tell a live run from a crashed one (see :meth:`run_status`), and
        the lane's ``delivery`` state (lag, spooled, last error: what the dashboard shows
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

    async def heartbeats(self, run_id: str) -> dict[str, dict[str, object]]:
        """Each writer's last heartbeat, by writer token: ``{"time", "interval_s"}`` and,
        from writers of this version, ``"delivery"`` (see :meth:`heartbeat`). Unparseable
        files are skipped with a warning."""
        skipped = _Skipped()
        parsed = await self._parsed(
            self._path(run_id, HEARTBEAT_DIR), lambda _, d: _parse_heartbeat_file(d), skipped
        )
        skipped.warn()
        return {name.removesuffix(".json"): beat for name, beat in parsed}

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
        :meth:`run_summaries`."""
        skipped = _Skipped()
        status_dir = self._path(run_id, STATUS_DIR)
        parsed = await self._parsed(status_dir, _parse_status, skipped, cache)
        if not parsed:
            beats = await self._parsed(
                self._path(run_id, HEARTBEAT_DIR), _parse_heartbeat, skipped, cache
            )
            skipped.warn()
            now = time.time() if now is None else now
            if beats and all(now - t > CRASHED_AFTER_BEATS * every for _, (t, every) in beats):
                return "crashed", max(t for _, (t, _) in beats)
            return "running", None
        skipped.warn()
        return _last_life_ending([ending for _, ending in parsed])

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
            tally = self._tallies[(run_id, writer)] = _Tally(self.summary_path(run_id, writer))
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
        :meth:`_rebuild`; each writer's own summary then replaces its part)."""
        if tally.loaded:
            return
        async with tally.lock:
            if tally.loaded:
                return  # loaded by a call that held the lock meanwhile
            stored = await self._stored_summary(tally.path)
            if stored is not None:
                tally.summary = stored
            else:
                entries = await self._listing_or_none(self._run_dir(run_id)) or []
                if not _RECORD_PARTS.isdisjoint(name for name, _ in entries):
                    tally.summary = dataclasses.replace(tally.summary, prior=True)
            tally.loaded = True

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

    # -- reads ----------------------------------------------------------------------------------
    async def _read_files(
        self, directory: str, skipped: _Skipped, cache: SummaryFileCache | None = None
    ) -> tuple[list[tuple[str, bytes]], bool]:
        """``(name, content)`` of the files in ``directory``, sorted by name, and whether
        one listed was gone when read (removed by a writer meanwhile). With ``cache``, a
        file whose listed version is the one kept there is not read again."""
        try:
            listing = await self._storage.ls_versions(directory)
        except NotADirectory:
            # This folder, or the run's directory above it, is a file: name the one it is.
            parent = posixpath.dirname(directory)
            if await self._storage.exists(parent) and not await self._storage.isdir(parent):
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
        contents = await self._get_all(paths, versions, cache)
        files = [(n, c) for n, c in zip(names, contents) if c is not None]
        return files, len(files) < len(names)

    async def _get_all(
        self, paths: list[str], versions: list[Hashable], cache: SummaryFileCache | None
    ) -> list[bytes | None]:
        """The content of each of ``paths`` (None: gone meanwhile); with ``cache``, a file
        whose listed version is the one kept there is not read again."""
        if cache is None:
            return await _gather_bounded([self._storage.get(p) for p in paths])
        kept = [cache.get(p, v) for p, v in zip(paths, versions)]
        missing = [i for i, data in enumerate(kept) if data is None]
        read = await _gather_bounded([self._storage.get(paths[i]) for i in missing])
        for i, data in zip(missing, read):
            if data is not None:
                cache.put(paths[i], versions[i], data)
            kept[i] = data
        return kept

    async def _parsed(
        self,
        directory: str,
        parse: Callable[[str, bytes], T],
        skipped: _Skipped,
        cache: SummaryFileCache | None = None,
    ) -> list[tuple[str, T]]:
        files, _ = await self._read_files(directory, skipped, cache)
        return _parse_each(directory, files, parse, skipped)

    async def metadata(self, run_id: str) -> Mapping[str, object]:
        directory = self._path(run_id, METADATA_DIR)
        for _ in range(3):
            skipped = _Skipped()
            files, vanished = await self._read_files(directory, skipped)
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
        entries = await self._parsed(
            self._path(run_id, ARTIFACTS_DIR), lambda _, d: _parse_artifact(d), skipped
        )
        skipped.warn()
        return {a.name: a for _, a in entries}

    async def _edges(
        self, run_id: str, categories: Sequence[str], skipped: _Skipped
    ) -> list[TrackerSource]:
        """The edges in the files of ``categories`` (each file: a run id in its name, artifact
        names in its lines), each edge once, in the order first found."""
        groups = await _gather_bounded(
            [self._parsed(self._path(run_id, c), _parse_edges, skipped) for c in categories]
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
            [self._listing_or_none(posixpath.join(self.root_dir, n)) for n, _ in candidates]
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
            [self._storage.exists(self._path(i, SOURCES_DIR, parent_file)) for i in ids]
        )
        return [i for i, yes in zip(ids, found) if yes]

    async def _listing_or_none(self, path: str) -> list[tuple[str, str]] | None:
        try:
            return await self._storage.ls(path)
        except NotADirectory:  # listed as a directory, a file now: not a run
            return None

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        skipped = _Skipped()
        directory = self._path(run_id, METRICS_DIR)
        files, _ = await self._read_files(directory, skipped)
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
        directory = self._path(run_id, METRICS_DIR)
        try:
            listing = await self._storage.ls(directory)
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
            data = await self._storage.get(posixpath.join(directory, name))
            if data is None:
                return None  # gone meanwhile (the run was deleted)
            async with parsing:
                return await run_blocking(parse, data, endpoint=self._storage.endpoint)

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

    # -- summaries: the run list ----------------------------------------------------------------
    async def run_summaries(
        self, now: float | None = None, *, cache: SummaryFileCache | None = None
    ) -> list[RunSummary]:
        """Every run's summary (in no particular order), from the writers' summary files:
        one listing of the store's root, then a read of each summary file (on local disk
        all of it in one worker-thread call).

        The status comes from the summaries' endings, by :meth:`run_status`'s rules. A run
        no summary says ended is ``running`` while a writer's heartbeat in its summary is
        recent; else (every heartbeat old, or none: torchx's runs) it gets
        :meth:`run_status` itself, from its status and heartbeat files: ``crashed``, an
        ending its summary does not hold yet (a write that failed between the two), or
        ``running``. A run without any summary (written before summaries existed, or by
        torchx) is summarised from its files once, and that is kept as its ``rebuilt``
        summary if the store takes it (a read-only store: rebuilt again at the next read).

        ``cache``: a reader that lists the store again and again (the dashboard) passes the
        same :class:`SummaryFileCache` each time; a summary file unchanged since (on local
        disk its inode, size and mtime; on an object store its size and ETag) is then not
        read again."""
        now = time.time() if now is None else now
        skipped = _Skipped()
        if cache is not None:
            cache.start_pass()
        if self._storage.stages:
            found, bad = await run_blocking(
                _scan_local, self.root_dir, cache, endpoint=self._storage.endpoint
            )
            for path, why in bad:
                skipped.add(path, why)
        else:
            found = await self._scan(skipped, cache)
        # Runs without any summary, or that a writer found with records and no summary.
        missing = [
            f for f in found
            if f.rebuilt is None and (not f.writers or any(w.prior for w in f.writers.values()))
        ]  # fmt: skip
        rebuilt = await _gather_bounded([self._rebuild(f.run_id, skipped) for f in missing])
        for f, writers in zip(missing, rebuilt):
            f.rebuilt = writers  # None: not a run (a source's descendants alone)
        runs = [f for f in found if f.writers or f.rebuilt is not None]
        endings: list[tuple[str, float] | None] = []
        for f in runs:
            ended = [
                (w.status, w.end, w.life_start)
                for w in f.merged().values()
                if w.status in _STATUS_RANK and w.end is not None
            ]
            endings.append(_last_life_ending(ended) if ended else None)
        live: dict[str, tuple[str, float | None]] = {}
        for f, e in zip(runs, endings):
            beats = [w.beat for w in f.merged().values() if w.beat is not None]
            if e is None and any(now - t <= CRASHED_AFTER_BEATS * every for t, every in beats):
                live[f.run_id] = ("running", None)
        unended = [f.run_id for f, e in zip(runs, endings) if e is None and f.run_id not in live]
        statuses = dict(
            zip(
                unended,
                await _gather_bounded([self.run_status(r, now, cache=cache) for r in unended]),
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
        return out

    async def _run_dirs(self, skipped: _Skipped) -> list[tuple[str, str]]:
        """``(directory name, run id)`` of each directory under the root named by a run id
        (one listing); whatever else is there, summaries aside, is named in ``skipped``."""
        return (await self._root(skipped))[0]

    async def _root(
        self, skipped: _Skipped
    ) -> tuple[list[tuple[str, str]], list[tuple[str, Hashable]]]:
        """One listing of the root: its run directories (as :meth:`_run_dirs`) and its
        summary files, each with its listed version (see :class:`SummaryFileCache`)."""
        try:
            listing = await self._storage.ls_versions(self.root_dir)
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

    async def _scan(self, skipped: _Skipped, cache: SummaryFileCache | None) -> list[_Found]:
        runs, summaries = await self._root(skipped)
        found = {run_id: _Found(run_id) for _, run_id in runs}
        paths = [posixpath.join(self.root_dir, name) for name, _ in summaries]
        contents = await self._get_all(paths, [v for _, v in summaries], cache)
        for path, data in zip(paths, contents):
            why = _add_summary(found, posixpath.basename(path), data)
            if why:
                skipped.add(path, why)
        return list(found.values())

    async def _rebuild(self, run_id: str, skipped: _Skipped) -> dict[str, WriterSummary] | None:
        """The summary of each writer token found in the run's file names (``""`` for files
        named otherwise: torchx's), from its metadata, metric segments and status files;
        None if the directory is not a run's. Kept as the run's ``rebuilt`` summary, best
        effort. Each writer's own summary replaces its part at read, so a writer that wrote
        while this ran is never counted twice; a writer of an older version (or torchx's)
        that writes after it is not seen by later reads (the rebuilt summary is not redone)."""
        entries = await self._listing_or_none(self._run_dir(run_id))
        if entries is None or RUN_PARTS.isdisjoint(name for name, _ in entries):
            return None
        present = {name for name, _ in entries}
        meta_dir, seg_dir = self._path(run_id, METADATA_DIR), self._path(run_id, METRICS_DIR)
        meta = (
            await self._parsed(meta_dir, _parse_metadata, skipped)
            if METADATA_DIR in present
            else []
        )
        segments, _ = (
            await self._read_files(seg_dir, skipped) if METRICS_DIR in present else ([], False)
        )
        ends = (
            await self._parsed(self._path(run_id, STATUS_DIR), _parse_status, skipped)
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
        for name, data in segments:
            parsed, bad = _parse_segment(data)
            if bad:
                skipped.add(posixpath.join(seg_dir, name), bad)
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
                life_start=ending[2] if ending else 0.0,
            )  # fmt: skip
        path = self.summary_path(run_id, REBUILT_TOKEN)
        content = {"v": 1, "run": run_id, "writers": {t: w.to_json() for t, w in writers.items()}}
        try:
            await self._put_json(run_id, path, content)
        except BackendError as exc:  # a read-only store: rebuilt again next time
            logger.debug("async_tracker: cannot keep the rebuilt summary %s: %s", path, exc)
        return writers

    def __repr__(self) -> str:
        return f"AsyncFsspecTracker({type(self.fs).__name__}, {self.root_dir!r})"


class _Found:
    """One run directory and its summaries, as a read of the root found them."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.writers: dict[str, WriterSummary] = {}
        self.rebuilt: dict[str, WriterSummary] | None = None

    def merged(self) -> dict[str, WriterSummary]:
        """The writers' summaries: each writer's own, else the rebuilt one of its token."""
        return {**(self.rebuilt or {}), **self.writers}


def _root_entry(
    name: str, is_dir: bool, runs: list[tuple[str, str]], summaries: list[str]
) -> str:
    """Sorts one entry of the root into ``runs`` (``(name, run id)``) or ``summaries``;
    why it is neither ("" if it is one, or one of the store's own files: see _beside_runs)."""
    if _SUMMARY_FILE.fullmatch(name) and not is_dir:
        summaries.append(name)
        return ""
    run_id = decode_run_id(name)
    if run_id is None and _beside_runs(name, is_dir):
        return ""
    if run_id is None:
        return "not a run: no base32 name"
    if not is_dir:
        return "a file, not a run directory"
    runs.append((name, run_id))
    return ""


def _add_summary(found: Mapping[str, _Found], name: str, data: bytes | None) -> str:
    """Adds the summary file ``name`` (its content ``data``) to its run in ``found``; what is
    wrong with it ("" if nothing). A file removed meanwhile (None), or the summary of a run
    whose directory is gone (deleted while a writer still wrote), is passed over."""
    matched = _SUMMARY_FILE.fullmatch(name)
    if data is None or matched is None:
        return ""
    try:
        content = orjson.loads(data)
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


class SummaryFileCache:
    """The files a reader of the run list read (summaries, and the status and heartbeat
    files of runs not ended), by path, with the version they had: on local disk their inode,
    size and mtime (writers replace a file by a rename, a new inode, so a rewrite within one
    mtime tick is still seen), on object stores the size and ETag of the listing. A file
    whose version is unchanged is not read again. Owned by one reader, one listing at a
    time: :meth:`AsyncFsspecTracker.run_summaries` fills it and drops what a listing no
    longer sees."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[Hashable, bytes]] = {}
        self.reads = 0  # files read (not taken from the cache), for tests
        self._seen: set[str] = set()

    def start_pass(self) -> None:
        """A listing of the store begins: the files it does not ask for are dropped at
        :meth:`end_pass` (gone from the store)."""
        self._seen = set()

    def end_pass(self) -> None:
        for gone in self.files.keys() - self._seen:
            del self.files[gone]

    def get(self, path: str, version: Hashable) -> bytes | None:
        """The content kept of ``path`` if it was kept at ``version`` (never for None)."""
        self._seen.add(path)
        cached = self.files.get(path)
        if version is None or cached is None or cached[0] != version:
            return None
        return cached[1]

    def put(self, path: str, version: Hashable, data: bytes) -> None:
        self._seen.add(path)
        self.reads += 1
        self.files[path] = (version, data)

    def read(self, path: str, stat: os.stat_result) -> bytes:
        """The content of the local file ``path``: cached if its stat is unchanged."""
        version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        data = self.get(path, version)
        if data is None:
            with open(path, "rb") as file:
                data = file.read()
            self.put(path, version, data)
        return data



def _scan_local(
    root: str, cache: SummaryFileCache | None = None
) -> tuple[list[_Found], list[tuple[str, str]]]:
    """:meth:`AsyncFsspecTracker._scan` on local disk, in one blocking call (a worker
    thread's): os calls straight, no fsspec layer nor thread hop per file; 10,000 runs read
    in a fraction of a second. Also what it skipped: ``(path, why)``. With ``cache``, files
    unchanged since its last scan are taken from it."""
    bad: list[tuple[str, str]] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return [], []
    except NotADirectoryError:
        return [], [(root, "a file where the store's directory should be")]
    runs: list[tuple[str, str]] = []
    names: list[str] = []
    for entry in entries:
        why = _root_entry(entry.name, entry.is_dir(), runs, names)
        if why:
            bad.append((entry.path, why))
    found = {run_id: _Found(run_id) for _, run_id in runs}
    for name in names:
        path = os.path.join(root, name)
        try:
            if cache is None:
                with open(path, "rb") as file:
                    data: bytes | None = file.read()
            else:
                data = cache.read(path, os.stat(path))
        except FileNotFoundError:
            data = None  # removed meanwhile
        why = _add_summary(found, name, data)
        if why:
            bad.append((path, why))
    return list(found.values()), bad


def _version_of(entry: Mapping[str, Any]) -> Hashable:
    """What tells a listed file's content from an earlier one: size and ETag (S3, GCS), or
    size, modification time and inode (local disk); None when the listing has neither."""
    tag = entry.get("ETag") or entry.get("etag") or entry.get("md5Hash")
    stamp = entry.get("mtime") or entry.get("LastModified") or entry.get("updated")
    if tag is None and stamp is None:
        return None
    # The inode too where there is one: a file replaced by a rename is a new one.
    return (entry.get("size"), str(tag), str(stamp), entry.get("ino"))


def _file_token(name: str) -> str:
    """The writer token in a file name of ours (metadata, segment, status), "" for another."""
    if name.endswith(".json") and not _LEADING_DIGITS.match(name):
        return name[: -len(".json")]  # status/<token>.json
    found = _FILE_TOKEN.match(name)
    return found.group(1) if found else ""


# -- names and parsing ---------------------------------------------------------------------------


def _digest(text: str) -> str:
    # surrogatepass: a key with a lone surrogate still gets a name (JSON escapes the key).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_file_name(name: str, what: str, suffix_bytes: int) -> None:
    """ValueError naming ``what`` unless base32 of ``name`` plus a suffix makes a file name."""
    if not _utf8(name):
        raise ValueError(f"{what}: the name holds a lone surrogate, which no file name can hold")
    size = len(name.encode("utf-8"))
    longest = (MAX_FILE_NAME_BYTES - suffix_bytes) // 8 * 5
    if size > longest:
        raise ValueError(
            f"{what}: the name is {size} bytes in UTF-8; the fsspec store names a file after "
            f"it, which holds at most {longest} bytes"
        )


def _write_order(name: str) -> tuple[int, str]:
    """How metadata files order: by the time leading their name, then by name."""
    match = _LEADING_DIGITS.match(name)
    return (int(match[0]) if match else -1, name)


def _last_life_ending(endings: Sequence[tuple[str, float, float]]) -> tuple[str, float]:
    """The run's ending from its writers' ``(status, time, started)`` (at least one): the
    worst ending of its last life, at the latest time of that ending."""
    latest_start = max(started for _, _, started in endings)
    # Ranks of one life end after every rank began; an ending before the latest start is
    # an earlier life's. At least the latest ending is always kept.
    last_life = [(s, t) for s, t, _ in endings if t >= latest_start] or [
        max(((s, t) for s, t, _ in endings), key=lambda e: e[1])
    ]
    worst = max(_STATUS_RANK[s] for s, _ in last_life)
    times = [t for s, t in last_life if _STATUS_RANK[s] == worst]
    return next(s for s, r in _STATUS_RANK.items() if r == worst), max(times)


# A batch to count in a writer's summary: key, seq, params, metric columns, end record.
_Counted = tuple[
    str, int, Mapping[str, tuple[int, object]], Mapping[str, _Columns],
    "tuple[str, float, float] | None",
]  # fmt: skip


class _Tally:
    """One writer's summary of one run, as this process keeps it (see
    :meth:`AsyncFsspecTracker._update_summary`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.summary = WriterSummary()
        self.loaded = False
        self.lock = anyio.Lock()


def _stamped(
    metadata: Mapping[str, object], stamps: Mapping[str, int], tag: str
) -> dict[str, tuple[int, object]]:
    """Each key with the stamp of its write: the call's, else the time leading ``tag``."""
    default = int(tag[:19]) if tag[:19].isdigit() else time.time_ns()
    return {k: (stamps.get(k, default), v) for k, v in metadata.items()}


class _Skipped:
    """What one read skipped, told in one warning naming the files."""

    SHOWN = 5

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.paths: set[str] = set()

    def add(self, path: str, why: object) -> None:
        if path in self.paths:
            return  # one read that meets a path twice (a run directory that is a file)
        self.paths.add(path)
        if isinstance(why, BaseException):
            why = f"{type(why).__name__}: {why}"
        text = str(why)
        self.entries.append(f"{path} ({text[:120]}{'...' if len(text) > 120 else ''})")

    def warn(self) -> None:
        if not self.entries:
            return
        shown = self.entries[: self.SHOWN]
        more = len(self.entries) - len(shown)
        logger.warning(
            "async_tracker: skipped what is not a tracker record: %s%s",
            "; ".join(shown),
            f"; and {more} more" if more else "",
        )


def _parse_each(
    directory: str,
    files: Iterable[tuple[str, bytes]],
    parse: Callable[[str, bytes], T],
    skipped: _Skipped,
) -> list[tuple[str, T]]:
    out: list[tuple[str, T]] = []
    for name, data in files:
        try:
            out.append((name, parse(name, data)))
        except _UNPARSEABLE as exc:
            skipped.add(posixpath.join(directory, name), exc)
    return out


def _parse_metadata(_: str, data: bytes) -> dict[str, object]:
    entry = json.loads(data)
    values = entry["metadata"] if isinstance(entry, dict) else None
    if not isinstance(values, dict):
        raise TypeError('not {"metadata": {...}}')
    return values


def _parse_status(_: str, data: bytes) -> tuple[str, float, float]:
    content = json.loads(data)
    status, when = content["status"], float(content["time"])
    if status not in _STATUS_RANK:
        raise ValueError(f"unknown status {status!r}")
    return status, when, float(content.get("started", 0.0))


def _parse_heartbeat(_: str, data: bytes) -> tuple[float, float]:
    content = json.loads(data)
    when, every = float(content["time"]), float(content["interval_s"])
    if not every > 0:
        raise ValueError(f"heartbeat interval {every!r} is not > 0")
    return when, every


def _parse_heartbeat_file(data: bytes) -> dict[str, object]:
    when, every = _parse_heartbeat("", data)
    content = json.loads(data)
    delivery = content.get("delivery")
    out: dict[str, object] = {"time": when, "interval_s": every}
    if isinstance(delivery, dict):
        out["delivery"] = delivery
    return out


def _parse_artifact(data: bytes) -> TrackerArtifact:
    entry = json.loads(data)
    if not isinstance(entry, dict):
        raise TypeError("not an artifact object")
    name, path, meta = entry["name"], entry["path"], entry.get("metadata")
    if not isinstance(name, str) or not isinstance(path, str):
        raise TypeError("artifact name or path is not a string")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError("artifact metadata is not a mapping")
    return TrackerArtifact(name, path, meta)


def _parse_edges(name: str, data: bytes) -> list[TrackerSource]:
    """A lineage file: ``<base32(run id)>`` (torchx's, several artifact names, one a line) or
    ``<base32(run id)>.<digest of its artifact name>`` (ours, one edge)."""
    encoded, dot, digest = name.partition(".")
    if dot and not _DIGEST.fullmatch(digest):
        raise ValueError("not a lineage file name")
    other = decode_run_id(encoded)
    if other is None:
        raise ValueError("not a lineage file name: no base32 run id")
    lines = data.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()  # the last line's newline
    names = list(dict.fromkeys(line.strip() for line in lines)) or [""]
    return [TrackerSource(other, n or None) for n in names]


_NUMBERS = frozenset({int, float})


def _parse_segment(data: bytes) -> tuple[dict[str, list[TrackerMetric]], str]:
    """The points of a metrics segment by name, and what was wrong with the lines skipped
    (``""`` if none): a truncated line, columns of unequal length, a step that is not an
    integer (NaN, infinities), a value or time that is not a number."""
    columns, bad = parse_segment_columns(data)
    # One C loop per metric: a segment holds up to a million points.
    points = {
        name: list(
            map(
                tuple.__new__,
                _METRIC,
                zip(itertools.repeat(name), values, steps, times),
            )
        )
        for name, (steps, values, times) in columns.items()
    }
    return points, bad


# One metric of one segment as columns: steps, values, times.
SegmentColumns = tuple[list[int], list[float], list[float]]


def parse_segment_columns(data: bytes) -> tuple[dict[str, SegmentColumns], str]:
    """:func:`_parse_segment`'s checks, keeping the columns as lists (no object per point):
    what a reader of millions of points wants. Lines are read by :func:`parse_column_line`;
    the second item describes the lines skipped (:func:`describe_skipped`)."""
    out: dict[str, SegmentColumns] = {}
    bad: list[str] = []
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            name, steps, values, times = parse_column_line(line)
        except UNPARSEABLE_LINE as exc:
            bad.append(skipped_line(lineno, exc))
            continue
        if name in out:
            s, v, t = out[name]
            s.extend(steps)
            v.extend(values)
            t.extend(times)
        else:
            out[name] = (steps, values, times)
    return out, describe_skipped(bad)


# What parse_column_line raises for a line it rejects.
UNPARSEABLE_LINE = (*_UNPARSEABLE, orjson.JSONDecodeError)


def parse_column_line(line: bytes) -> tuple[str, list[int], list[float], list[float]]:
    """One line of a metrics segment: ``(name, steps, values, times)``, values and times as
    floats. Raises one of :data:`UNPARSEABLE_LINE` for a line to skip: not JSON (a truncated
    line), columns of unequal length, a step that is not an integer (NaN, infinities), a
    value or time that is not a number. orjson parses a line unless it holds NaN or
    infinities (JSON has none; the json module reads Python's tokens for them)."""
    try:
        col = orjson.loads(line)
    except orjson.JSONDecodeError:
        col = json.loads(line)
    name, steps, values, times = col["name"], col["step"], col["value"], col["time"]
    if not isinstance(name, str):
        raise TypeError("the metric name is not a string")
    if not (type(steps) is type(values) is type(times) is list):
        raise TypeError("the columns are not lists")
    if not len(steps) == len(values) == len(times):
        raise ValueError("the columns differ in length")
    # Type checks by C loops (map, set): a segment holds up to a million points.
    if not set(map(type, steps)) <= {int}:
        raise TypeError("a step is not an integer")
    if not set(map(type, values)) <= _NUMBERS or not set(map(type, times)) <= _NUMBERS:
        raise TypeError("a value or time is not a number")
    # Floats (an int too large for one is OverflowError: the line is skipped).
    return name, steps, list(map(float, values)), list(map(float, times))


def skipped_line(lineno: int, exc: Exception) -> str:
    """Why line ``lineno`` of a segment was skipped, for :func:`describe_skipped`."""
    return f"line {lineno}: {type(exc).__name__}: {exc}"


def describe_skipped(bad: Sequence[str]) -> str:
    """The lines skipped of one segment in one line (``""`` if none): the first two, and how
    many more."""
    return "; ".join(bad[:2]) + (f"; {len(bad) - 2} more lines" if len(bad) > 2 else "")


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


_INT = re.compile(r"[+-]?(0|[1-9][0-9]*)")
# A number with a leading zero ("007", "01.5") stays text: it may be an id or a secret.
_FLOAT = re.compile(r"[+-]?(0|[1-9][0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]+)?|[+-]?\.[0-9]+")
# Keys whose values stay text even when they look like numbers: credentials, and names.
_TEXT_KEYS = re.compile(r"key|secret|token|password|passwd|profile|name|path|url|bucket")


def _config_value(key: str, raw: str) -> object:
    """``raw`` as fsspec's options want it: booleans and numbers parsed (``timeout=30``,
    ``config_kwargs.retries.max_attempts=5``), text otherwise. Numbers with a leading zero
    and values of credential- or name-like keys stay text: ``0123`` may be a secret."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if _TEXT_KEYS.search(key.rsplit(".", 1)[-1].lower()):
        return raw
    if _INT.fullmatch(raw):
        return int(raw)
    if _FLOAT.fullmatch(raw):
        return float(raw)
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
        _put_config(config, key.strip(), _config_value(key.strip(), value.strip()), where)
    return config


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


def _reader_of(store: AsyncFsspecTracker) -> Any:
    from async_tracker.backend.fsspec_runreader import FsspecRunReader

    return FsspecRunReader(store)


AsyncFsspecTracker.reader = _reader_of  # type: ignore[attr-defined]  # TEMP until split lands
