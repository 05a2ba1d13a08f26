"""What a reader of the run list keeps between its listings: :class:`SummaryFileCache`."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class SummaryFileCache:
    """The files a reader of the run list read (the run index's checkpoint and summaries,
    and the status and heartbeat files of runs not ended), by path, with the version they
    had: on local disk their inode, size and mtime (writers replace a file by a rename, a new
    inode, so a rewrite within one mtime tick is still seen), on object stores the size and
    ETag of the listing. A file whose version is unchanged is not read again, and a
    checkpoint not decoded again (``decoded``). Owned by one reader, one listing at a time:
    ``run_summaries`` (``summaries.py``) fills it and drops what a listing no longer sees."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[Hashable, bytes]] = {}
        # What was made of a file at a version (the run index's checkpoint, decoded), by path.
        self.decoded: dict[str, tuple[Hashable, Any]] = {}
        self.reads = 0  # files read (not taken from the cache), for tests
        self._seen: set[str] = set()

    def start_pass(self) -> None:
        """A listing of the store begins: the files it does not ask for are dropped at
        :meth:`end_pass` (gone from the store)."""
        self._seen = set()

    def end_pass(self) -> None:
        for gone in self.files.keys() - self._seen:
            del self.files[gone]
        for gone in self.decoded.keys() - self._seen:
            del self.decoded[gone]

    def get(self, path: str, version: Hashable) -> bytes | None:
        """The content kept of ``path`` if it was kept at ``version`` (never for None)."""
        self._seen.add(path)
        cached = self.files.get(path)
        if version is None or cached is None or cached[0] != version:
            return None
        return cached[1]

    def get_decoded(self, path: str, version: Hashable) -> Any:
        """What was made of ``path`` at ``version`` (never for None), or None."""
        self._seen.add(path)
        kept = self.decoded.get(path)
        if version is None or kept is None or kept[0] != version:
            return None
        return kept[1]

    def put_decoded(self, path: str, version: Hashable, value: Any, *, read: bool = True) -> None:
        """Keeps what was made of ``path`` at ``version``; ``read``: it was read to make it
        (not written by this reader itself: a compaction's checkpoint)."""
        self._seen.add(path)
        self.reads += read
        self.decoded[path] = (version, value)

    def put(self, path: str, version: Hashable, data: bytes) -> None:
        self._seen.add(path)
        self.reads += 1
        self.files[path] = (version, data)
