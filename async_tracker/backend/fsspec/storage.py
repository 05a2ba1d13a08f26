"""The fsspec store's I/O: the few operations the tracker needs, as coroutines over any
fsspec filesystem, and the one boundary where what they raise is mapped.

Errors: every failure leaves as one :class:`~async_tracker.errors.BackendError` naming the
file, mapped by :func:`map_error` from what fsspec, s3fs, botocore or the OS raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import inspect
import json
import operator
import os
import posixpath
import secrets
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import fsspec
import orjson
from fsspec.implementations.local import LocalFileSystem

from async_tracker.backend.errors import map_failure
from async_tracker.error_table import s3_error
from async_tracker.errors import BackendError, RecordError
from async_tracker.runtime.loop import wait_future
from async_tracker.runtime.process import run_blocking

_NAME = operator.itemgetter(0)

T = TypeVar("T")

# At most this many reads (or removals) of one call in flight at once.
MAX_CONCURRENT_FILES = 32


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


# Where an integer past 64 bits may stand in JSON, which orjson reads as a float, not exactly:
# a number token of 20 digits, or of a minus and 19. Found without a regular expression (two
# to ten times slower than orjson's parse): digits become "0", what may come before a number
# "s", a minus "n", by one C pass, then two substring searches. Text that holds such digits
# after a space or a comma (or an "s") matches too, and only costs the slower parser.
_KINDS = bytes.maketrans(b"0123456789[,: \t\r\n-", b"0" * 10 + b"s" * 7 + b"n")
_LONG_INTEGERS = (b"s" + b"0" * 20, b"sn" + b"0" * 19)


def _decode_json(data: bytes) -> Any:
    """What :func:`_encode_json` wrote, read back exactly: by orjson (fast), else by the json
    module, which reads what orjson refuses or reads inexactly: NaN and infinities (the
    tokens Python writes), integers past 64 bits (orjson makes them floats), nesting deeper
    than orjson's limit. Raises ``ValueError`` (or ``RecursionError``) for what is not JSON."""
    kinds = data.translate(_KINDS)
    if not any(long in kinds for long in _LONG_INTEGERS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # perhaps JSON that only the json module reads; else it raises below
    return json.loads(data)


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
        # fsspec's own LocalFileSystem (not a subclass, which may change what a write does)
        # is written with plain os calls: see _put_os.
        self.plain_local = type(fs) is LocalFileSystem

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
        if self.plain_local:
            _put_os(path, data, stage_dir)
            return
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

    async def ls_or_none(self, path: str) -> list[tuple[str, str]] | None:
        """:meth:`ls`, or None where ``path`` is a file."""
        try:
            return await self.ls(path)
        except NotADirectory:  # listed as a directory, a file now: not a run
            return None


def _put_os(path: str, data: bytes, stage_dir: str) -> None:
    """What ``_put_staged`` does on local disk (a staged file, then a rename over ``path``),
    by os calls: fsspec's makedirs, open and mv cost tens of microseconds of Python per file,
    on a worker thread whose Python holds the GIL the training loop waits for. Folders are
    made only when missing (the first file in them)."""
    tmp = posixpath.join(stage_dir, secrets.token_hex(8))
    try:
        try:
            _write_file(tmp, data)
        except FileNotFoundError:
            os.makedirs(stage_dir, exist_ok=True)
            _write_file(tmp, data)
        try:
            os.replace(tmp, path)
        except FileNotFoundError:
            os.makedirs(posixpath.dirname(path), exist_ok=True)
            os.replace(tmp, path)
    except BaseException:
        # A full disk may have left part of the file: do not leave it behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


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

    try:
        async with anyio.create_task_group() as tg:
            for i, aw in enumerate(awaitables):
                tg.start_soon(one, i, aw)
    finally:
        # Cancelled (a bounded caller: a writer's fold of the run index), the coroutines not
        # started yet are closed, not left to warn that they were never awaited; closing
        # one that ended does nothing, and the group's tasks have all ended here.
        for aw in awaitables:
            if inspect.iscoroutine(aw):
                aw.close()
    if errors:
        raise errors[min(errors)]
    return results


def _version_of(entry: Mapping[str, Any]) -> Hashable:
    """What tells a listed file's content from an earlier one: size and ETag (S3, GCS), or
    size, modification time and inode (local disk); None when the listing has neither."""
    tag = entry.get("ETag") or entry.get("etag") or entry.get("md5Hash")
    stamp = entry.get("mtime") or entry.get("LastModified") or entry.get("updated")
    if tag is None and stamp is None:
        return None
    # The inode too where there is one: a file replaced by a rename is a new one.
    return (entry.get("size"), str(tag), str(stamp), entry.get("ino"))
