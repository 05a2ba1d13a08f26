"""Who owns which spool files: a token per pipeline, and a lock file that proves it is alive.

Every run pipeline (one ``AppRun`` in one process) writes its segments and its ack under a
token of its own, and holds ``<token>.lock`` (``filelock``: ``flock`` on Unix, ``msvcrt``
elsewhere) while it lives. A token whose lock can be taken belongs to a dead pipeline (a
killed process, or a run closed before it delivered everything): its files are adopted and
replayed. Two ranks sharing a spool directory never replay each other's live segments.

A clean close releases the lock and removes the lock file: lock files do not pile up.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)


class Locks:
    """The lock files this process holds, by path."""

    def __init__(self) -> None:
        self._held: dict[Path, FileLock] = {}
        self._mutex = threading.Lock()

    def take(self, path: Path) -> bool:
        """Takes ``path``'s lock without waiting; False if a live owner holds it, another
        pipeline of this process included (it is alive: its files are not to adopt)."""
        with self._mutex:
            if path in self._held:
                return False
            lock = FileLock(str(path), thread_local=False)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                return False
            self._held[path] = lock
            return True

    def drop(self, path: Path) -> None:
        """Releases ``path``'s lock and removes the file (nobody else takes a dead token's
        lock once its files are gone; a racing adopter would find nothing to adopt)."""
        with self._mutex:
            lock = self._held.pop(path, None)
        if lock is None:
            return
        try:
            path.unlink(missing_ok=True)
        finally:
            lock.release()

    def forget_after_fork(self) -> None:
        """In a forked child: the inherited descriptors share the parent's locks (``flock``
        belongs to the open file, not the process). Close them without unlocking, so that
        the parent keeps its locks and the child holds none."""
        for lock in self._held.values():
            fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
            if isinstance(fd, int):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._held = {}
        self._mutex = threading.Lock()


# Forgotten in a forked child by the process's runtime (async_tracker.runtime.process),
# at the fork itself: see forget_after_fork.
locks = Locks()
