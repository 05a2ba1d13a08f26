"""Compaction by readers: the metric segments of a writer that did not compact them at its
run's end (it was killed or crashed, or its close ran out of its compaction budget) are
compacted by a reader that reads them, with the writer's own compaction
(:meth:`~async_tracker.backend.fsspec.writer.FsspecWriter.compact`; ``metricfiles.py`` says
why a crash, or two compactions racing, at any point loses nothing and doubles nothing).

When. After a read of a run's metric files by the store's
:class:`~async_tracker.backend.fsspec.runreader.FsspecRunReader` (``scalars`` and
``metrics``: the dashboard's charts, ``Store.metrics``, the CLI's ``list metrics``, ``plot``
and ``export``), for each writer of the run with two or more files that readers read, or
with files that a compacted file covers (left by a compaction that stopped before removing
them), once no process of the run is live: the run has heartbeats and none is recent (none
younger than ``CRASHED_AFTER_BEATS`` of its interval: the rule that shows a run as crashed,
and by which ``rm`` finds live writers). A writer at its end compacts its own files, and its
heartbeat stays recent for that long after its close: its files are left to it. A run
without heartbeats (torchx's, or one written with ``heartbeat_s=0``) is never compacted by a
reader: nothing there tells a dead writer from a quiet one. A listing of runs (``list
jobs``, the run list) starts none.

Bounds. A run's compaction is a task of the tracker loop beside the read, not a part of it:
the read returns what it read, within its own deadline, whatever the compaction does. It gets
the writer's budget (:data:`~async_tracker.backend.fsspec.writer.COMPACTION_BUDGET_S`), then
is given up, leaving what a crash there would. One at a time per run and reader; a run
whose metric files are as this reader's last attempt left them is not tried again (a
read-only store is tried once per run), and one found live is not looked at again until its
newest heartbeat grows old. The process's exit waits for a compaction under way until its
budget's end (``Runtime.background``).

Failures never fail the read, and each attempt tells its own once: a store that refuses the
work (read-only, no permission, unreachable: a ``BackendError``) at debug level, as the run
index's compaction does, since reading a store one cannot write is normal use and nothing is
wrong with what it holds; anything else as a warning.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, TypeVar

import anyio

from async_tracker.backend.fsspec.layout import METRICS_DIR
from async_tracker.backend.fsspec.reader import FsspecReader, MetricSegments
from async_tracker.backend.fsspec.writer import COMPACTION_BUDGET_S, FsspecWriter
from async_tracker.errors import BackendError
from async_tracker.runtime.process import runtime
from async_tracker.settings import CRASHED_AFTER_BEATS

# metricfiles loads numpy and pyarrow: imported where a read of points (which loaded them)
# asks for a compaction, never with the reader (a listing of runs does not load them).
if TYPE_CHECKING:
    from async_tracker.backend.fsspec.metricfiles import MetricsCursor

logger = logging.getLogger(__name__)

# What a read made of each file: the compaction goes by the read's listing alone.
_Parsed = TypeVar("_Parsed")


def writers_to_compact(listed: Collection[str], cursor: MetricsCursor) -> list[str]:
    """The writers whose files a compaction would change, from a read's listing and what it
    learnt of the compacted files in it: those with two or more live files, or with a file
    that a compacted file covers, sorted."""
    from async_tracker.backend.fsspec.metricfiles import Coverage, compacting_writer

    files = Coverage(tuple(sorted(listed)), cursor.inputs, cursor.unreadable)
    live: dict[str, int] = {}
    for name in files.live:
        writer = compacting_writer(name)
        if writer is not None:
            live[writer] = live.get(writer, 0) + 1
    stale = {w for w in map(compacting_writer, files.covered) if w is not None}
    return sorted(stale | {w for w, n in live.items() if n >= 2})


class ReaderCompactions:
    """What one reader compacts after its reads, and what it remembers of its attempts (see
    the module's docstring). ``clock``: the wall clock heartbeats are compared with."""

    def __init__(self, files: FsspecReader, clock: Callable[[], float] = time.time) -> None:
        self._files = files
        # The writer's compaction over the reader's storage: a writer object keeps nothing
        # of a run it does not write, and compacts any writer's files it is given.
        self._compactor = FsspecWriter(files.storage, files.root_dir)
        self._clock = clock
        # Guards the three maps below. Reads run on the tracker loop (the sync Reader
        # submits them there), and so do the compactions; but a caller may await a reader
        # on a loop of its own, and a compaction's future completes on the loop's thread.
        self._lock = threading.Lock()
        # The compaction under way of each run: at most one per run and reader.
        self._running: dict[str, concurrent.futures.Future[list[str]]] = {}
        # Per run: a digest of its metric folder's names as the last attempt left them.
        self._tried: dict[str, str] = {}
        # Per run found live: the wall-clock time its newest heartbeat grows old.
        self._live_until: dict[str, float] = {}

    def after_read(self, run_id: str, read: MetricSegments[_Parsed]) -> None:
        """Starts the compaction of ``run_id`` in the background if ``read`` calls for one
        (see the module's docstring). Never raises: the read's result stands."""
        try:
            self._start(run_id, read.listed, read.cursor)
        except Exception as exc:  # a loop stopped at interpreter exit, say
            logger.debug("async_tracker: no compaction of run %r after its read: %s",
                         run_id, exc)  # fmt: skip

    def _start(self, run_id: str, listed: frozenset[str], cursor: MetricsCursor) -> None:
        writers = writers_to_compact(listed, cursor)
        if not writers:
            return
        state = _digest(listed)
        with self._lock:
            # One at a time per run: a second would only race the first over the same files
            # (safe, but twice the reads and writes).
            if run_id in self._running or self._tried.get(run_id) == state:
                return
            if self._clock() <= self._live_until.get(run_id, float("-inf")):
                return
            # On the tracker loop, not in the read's task: the read returns now, within its
            # own deadline, and a slow compaction cannot make it time out.
            future = runtime().background(
                self._compact_within_budget, run_id, writers, state,
                within_s=COMPACTION_BUDGET_S,
            )  # fmt: skip
            self._running[run_id] = future
        # Outside the lock: a future done already runs its callback here, at once.
        future.add_done_callback(lambda _: self._ended(run_id, future))

    def _ended(self, run_id: str, future: concurrent.futures.Future[list[str]]) -> None:
        with self._lock:
            if self._running.get(run_id) is future:
                del self._running[run_id]

    def running(self) -> list[concurrent.futures.Future[list[str]]]:
        """The compactions under way (each future gives the writers it compacted)."""
        with self._lock:
            return list(self._running.values())

    async def _compact_within_budget(
        self, run_id: str, writers: list[str], state: str
    ) -> list[str]:
        with anyio.move_on_after(COMPACTION_BUDGET_S):
            try:
                return await self.compact_run(run_id, writers)
            except BackendError as exc:
                logger.debug(
                    "async_tracker: segments of run %r not compacted by this reader, kept as "
                    "they are: %s", run_id, exc,
                )  # fmt: skip
            except Exception as exc:
                logger.warning(
                    "async_tracker: segments of run %r not compacted by this reader, kept as "
                    "they are: %s: %s", run_id, type(exc).__name__, exc,
                )  # fmt: skip
            self._remember(run_id, state)
            return []
        logger.warning(
            "async_tracker: segments of run %r not compacted by this reader within %.1f s, "
            "kept as they are", run_id, COMPACTION_BUDGET_S,
        )  # fmt: skip
        self._remember(run_id, state)
        return []

    async def compact_run(self, run_id: str, writers: Collection[str]) -> list[str]:
        """Compacts the files of each of ``writers`` of ``run_id`` if no process of the run
        is live, and returns those it compacted; unbounded, raising what fails (the read's
        background task bounds it and reports)."""
        beats = await self._files.heartbeats(run_id)
        if not beats:
            # Nothing tells a dead writer from a quiet one: never compacted by a reader.
            self._remember(run_id, _digest(await self._listing(run_id)))
            return []
        until = _live_until(beats)
        if self._clock() <= until:
            # A process of the run is live: perhaps a writer compacting its own files at
            # its end. Not looked at again before its newest heartbeat grows old.
            with self._lock:
                self._live_until[run_id] = until
            return []
        # One writer after another: each lists the folder afresh, so a writer's compaction
        # never goes by a listing that another one's removals made stale.
        done = [w for w in writers if await self._compactor.compact(run_id, w)]
        self._remember(run_id, _digest(await self._listing(run_id)))
        return done

    async def _listing(self, run_id: str) -> frozenset[str]:
        entries = await self._files.storage.ls(self._files.path(run_id, METRICS_DIR))
        return frozenset(name for name, kind in entries if kind == "file")

    def _remember(self, run_id: str, state: str) -> None:
        with self._lock:
            self._tried[run_id] = state
            self._live_until.pop(run_id, None)


def _live_until(beats: Mapping[str, Mapping[str, object]]) -> float:
    """The wall-clock time the newest of a run's heartbeats grows old: until then a process
    of the run may be live."""
    ends = [float("-inf")]
    for beat in beats.values():
        when, every = beat.get("time"), beat.get("interval_s")
        if isinstance(when, (int, float)) and isinstance(every, (int, float)):
            ends.append(when + CRASHED_AFTER_BEATS * every)
    return max(ends)


def _digest(names: Collection[str]) -> str:
    """A run's metric folder as a short key: what :class:`ReaderCompactions` remembers of
    each run it tried (a digest, not the names: a crashed run may have thousands)."""
    return hashlib.sha1("\n".join(sorted(names)).encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["ReaderCompactions", "writers_to_compact"]
