"""What a reader of the run list keeps between its listings: :class:`SummaryFileCache`."""

from __future__ import annotations

import os
from collections.abc import Hashable


class SummaryFileCache:
    """The files a reader of the run list read (summaries, and the status and heartbeat
    files of runs not ended), by path, with the version they had: on local disk their inode,
    size and mtime (writers replace a file by a rename, a new inode, so a rewrite within one
    mtime tick is still seen), on object stores the size and ETag of the listing. A file
    whose version is unchanged is not read again. Owned by one reader, one listing at a
    time: ``run_summaries`` (``summaries.py``) fills it and drops what a listing no longer
    sees."""

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
