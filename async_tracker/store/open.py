"""Opening a store to read it: a path or URL (the fsspec store ``init()`` writes), or any
backend object (MLflow, TensorBoard, a torchx plug-in), as one
:class:`~async_tracker.store.sync_reader.Reader`.
"""

from __future__ import annotations

import os

import fsspec.core

from async_tracker.adapters import TrackerLike, as_async
from async_tracker.backend.fsspec import AsyncFsspecTracker
from async_tracker.base import AsyncTrackerBase
from async_tracker.errors import TrackerConfigError
from async_tracker.store.reader import reader_of
from async_tracker.store.sync_reader import Reader

ENV_DIR = "ASYNC_TRACKER_DIR"
DEFAULT_DIR = "./tracker_runs"


def store_dir(dir: str | os.PathLike[str] | None = None) -> str:
    """The store ``init`` and the CLI use: ``dir``, else ``$ASYNC_TRACKER_DIR``, else
    ``./tracker_runs``."""
    return os.fspath(dir) if dir is not None else os.environ.get(ENV_DIR) or DEFAULT_DIR


def open_store(
    dir: str | os.PathLike[str] | None = None, *, load_codec: bool = True
) -> AsyncFsspecTracker:
    """The fsspec backend over a store path or URL (``s3://bucket/prefix``, ``memory://x``);
    :class:`TrackerConfigError` in one line for a URL no filesystem takes (an unknown
    protocol, a missing extra). ``load_codec``: see
    :class:`~async_tracker.backend.fsspec.AsyncFsspecTracker`."""
    url = store_dir(dir)
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError, TypeError) as exc:
        # One line: the user's mistake is the URL, not something in fsspec's stack.
        raise TrackerConfigError(f"cannot open the store {url!r}: {exc}") from None
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    if "file" in protocols:
        root = os.path.abspath(root)  # the same store whatever the working directory becomes
    return AsyncFsspecTracker(fs, root, load_codec=load_codec)


def open_reader(
    source: str | os.PathLike[str] | AsyncTrackerBase | TrackerLike | None = None,
    *,
    timeout: float | None = None,
    label: str | None = None,
) -> Reader:
    """The reader of ``source``: a store path or URL (default ``$ASYNC_TRACKER_DIR``, else
    ``./tracker_runs``), or a backend (async, a torchx ``TrackerBase``, a plug-in); each of
    its reads waits at most ``timeout`` seconds (see :class:`Reader`). ``label`` names it
    in errors (default: the store's URL, or the backend)."""
    if source is None or isinstance(source, (str, os.PathLike)):
        url = store_dir(source)
        return Reader(reader_of(open_store(url), label or f"store {url}"), timeout)
    return Reader(reader_of(as_async(source), label), timeout)


__all__ = ["DEFAULT_DIR", "ENV_DIR", "open_reader", "open_store", "store_dir"]
