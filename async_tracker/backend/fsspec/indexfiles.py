"""The run index's files (see ``index.py``): the index listed with each file's version, the
store's root listed, files read (through a reader's cache), created if absent, written whole,
and removed.

On local disk (a storage that stages its writes) each is one call in a worker thread: a
listing by ``os.listdir`` and ``os.stat``, an exclusive create by a hard link, a write by a
rename. On object stores each costs as few requests as the filesystem allows: a listing of
the index's prefix alone, a read from the first byte (no HEAD first), a conditional PUT, a
bulk removal (s3fs).
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import posixpath
import secrets
from collections.abc import Hashable, Sequence
from typing import Any

from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.layout import INDEX_PREFIX, _root_entry
from async_tracker.backend.fsspec.parsing import _Skipped
from async_tracker.backend.fsspec.reader import FsspecReader
from async_tracker.backend.fsspec.storage import _gather_bounded, _mapped, _Storage, _version_of
from async_tracker.errors import BackendError
from async_tracker.runtime.process import run_blocking

# Local writes are staged under this name, then renamed or linked into place.
_STAGE_PREFIX = INDEX_PREFIX + "tmp-"

# A file's version as the checkpoint keeps it (None: the filesystem tells none).
Version = str | None


def _local_version(stat: os.stat_result) -> str:
    # The inode too: a writer replaces a file by a rename, a new inode, so a rewrite within
    # one mtime tick is still a new version.
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"


def _version_text(version: Hashable) -> Version:
    if version is None:
        return None
    return "|".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _takes_prefix(fs: Any) -> bool:
    """Whether the filesystem's ``find`` lists the keys under a prefix in one request, with
    no lookup of the path first (s3fs, gcsfs)."""
    find = getattr(type(fs), "_find", None)
    try:
        return find is not None and "prefix" in inspect.signature(find).parameters
    except (TypeError, ValueError):
        return False


async def list_index(storage: _Storage, root: str) -> dict[str, Version]:
    """Every file of the index by name, with its version: one request on object stores
    while there are fewer than 1,000."""
    if storage.stages:
        with _mapped(f"listing of {root}"):
            listed: dict[str, Version] = await run_blocking(
                _list_local, root, endpoint=storage.endpoint
            )
        return listed
    if not (storage.is_async and _takes_prefix(storage.fs)):
        entries = await storage.ls_versions(root)
        return {n: _version_text(v) for n, kind, v in entries
                if n.startswith(INDEX_PREFIX) and kind == "file"}  # fmt: skip
    with _mapped(f"listing of {root}/{INDEX_PREFIX}*"):
        storage.fs.invalidate_cache(root)
        try:
            found = await storage._call("find", root, prefix=INDEX_PREFIX, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return {}
    out: dict[str, Version] = {}
    for path, entry in dict(found).items():
        name = posixpath.basename(str(path).rstrip("/"))
        if name.startswith(INDEX_PREFIX) and entry.get("type", "file") == "file":
            out[name] = _version_text(_version_of(entry))
    return out


def _list_local(root: str) -> dict[str, Version]:
    out: dict[str, Version] = {}
    try:
        # Names alone for the run directories (no stat): 100,000 in ~20 ms.
        names = [name for name in os.listdir(root) if name.startswith(INDEX_PREFIX)]
    except (FileNotFoundError, NotADirectoryError):
        return out
    for name in names:
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile
            out[name] = _local_version(os.stat(os.path.join(root, name)))
    return out


async def _read(
    reader: FsspecReader,
    rels: Sequence[str],
    versions: Sequence[Version],
    cache: SummaryFileCache | None,
) -> list[bytes | None]:
    """The content of each file (None: gone meanwhile); with ``cache``, what it kept of a
    file at the version listed (on local disk all of them in one worker-thread call)."""
    if not rels:
        return []
    paths = [posixpath.join(reader.root_dir, rel) for rel in rels]
    storage = reader.storage
    if storage.stages:
        with _mapped(f"read of {paths[0]} and {len(paths) - 1} more"):
            read: list[bytes | None] = await run_blocking(
                _read_local, paths, versions, cache, endpoint=storage.endpoint
            )
        return read
    kept = [cache.get(p, v) if cache is not None else None for p, v in zip(paths, versions)]
    missing = [i for i, data in enumerate(kept) if data is None]
    fetched = await _gather_bounded([_fetch(storage, paths[i]) for i in missing])
    for i, data in zip(missing, fetched):
        if data is not None and cache is not None:
            cache.put(paths[i], versions[i], data)
        kept[i] = data
    return kept


async def _fetch(storage: _Storage, path: str) -> bytes | None:
    """The content of a file not listed through fsspec's cache: a read from its first byte,
    one request (a plain read asks s3fs for the size first: a HEAD), else a plain read (an
    empty object has no range to read)."""
    with contextlib.suppress(BackendError, OSError):
        try:
            data: bytes = await storage._call("cat_file", path, start=0)
            return data
        except FileNotFoundError:
            return None
    return await storage.get(path)


def _read_local(
    paths: Sequence[str], versions: Sequence[Version], cache: SummaryFileCache | None
) -> list[bytes | None]:
    out: list[bytes | None] = []
    for path, version in zip(paths, versions):
        data = cache.get(path, version) if cache is not None else None
        if data is None:
            try:
                with open(path, "rb") as file:
                    data = file.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                out.append(None)
                continue
            if cache is not None:
                cache.put(path, version, data)
        out.append(data)
    return out


async def _scan_root(
    reader: FsspecReader, skipped: _Skipped
) -> tuple[set[str], dict[str, Version]]:
    """One listing of the store's root: the ids of the directories named as runs, and the
    previous version's summary files there, with their versions."""
    if reader.storage.stages:
        with _mapped(f"listing of {reader.root_dir}"):
            dirs, legacy, bad = await run_blocking(
                _scan_root_local, reader.root_dir, endpoint=reader.storage.endpoint
            )
        for path, why in bad:
            skipped.add(path, why)
        return dirs, legacy
    runs, summaries = await reader.root(skipped)
    return {run_id for _, run_id in runs}, {n: _version_text(v) for n, v in summaries}


def _scan_root_local(root: str) -> tuple[set[str], dict[str, Version], list[tuple[str, str]]]:
    bad: list[tuple[str, str]] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return set(), {}, []
    except NotADirectoryError:
        return set(), {}, [(root, "a file where the store's directory should be")]
    runs: list[tuple[str, str]] = []
    names: list[str] = []
    for entry in entries:
        why = _root_entry(entry.name, entry.is_dir(), runs, names)
        if why:
            bad.append((entry.path, why))
    legacy: dict[str, Version] = {}
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            legacy[name] = _local_version(os.stat(os.path.join(root, name)))
    return {run_id for _, run_id in runs}, legacy, bad


async def _create(storage: _Storage, path: str, data: bytes) -> bool:
    """Writes ``path`` unless it exists, atomically: True if this call created it."""
    if storage.stages:
        with _mapped(f"exclusive create of {path}"):
            created: bool = await run_blocking(
                _create_local, path, data, endpoint=storage.endpoint
            )
        return created
    return await storage.create(path, data)


def _create_local(path: str, data: bytes) -> bool:
    """A staged file hard-linked into place: exclusive (the link fails if the name exists)
    and whole (a reader never sees it partly written, as it may an ``O_EXCL`` create's)."""
    tmp = _staged(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
            raise
        # No hard links here (some network and FUSE filesystems): an exclusive create.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


async def _remove(storage: _Storage, paths: Sequence[str]) -> None:
    """Removes ``paths`` (one already gone is no error): one bulk request per 1,000 on
    object stores that have it (s3fs)."""
    if not paths:
        return
    if not storage.is_async:
        await storage.rm_many(paths)
        return
    with _mapped(f"removal of {paths[0]} and {len(paths) - 1} more"):
        with contextlib.suppress(FileNotFoundError):
            await storage._call("rm", list(paths))
        storage.fs.invalidate_cache(posixpath.dirname(paths[0]))


def _staged(path: str, data: bytes) -> str:
    """``data`` in a new file beside ``path``, named so that no listing takes it for one of
    the index's (nor torchx for a run: a file)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, _STAGE_PREFIX + secrets.token_hex(8))
    with open(tmp, "xb") as file:
        file.write(data)
    return tmp


async def _put(storage: _Storage, path: str, data: bytes) -> None:
    """Writes ``path`` whole (locally: staged beside it, then renamed into place: not in a
    run's ``.tmp/``, which would make a directory at the root, where torchx sees runs)."""
    if storage.stages:
        await run_blocking(_put_local, path, data, endpoint=storage.endpoint)
    else:
        await storage.put(path, data, posixpath.dirname(path))


def _put_local(path: str, data: bytes) -> None:
    with _mapped(f"write of {path}"):
        tmp = _staged(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


__all__ = ["Version", "list_index"]
