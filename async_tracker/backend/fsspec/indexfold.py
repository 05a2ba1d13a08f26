"""Writers fold the run index: the summaries of writers that ended leave the store's root.

Each writing pipeline leaves one summary file per run at the store's root
(``.index-summary-<digest>-<writer token>.json``, see ``index.py``), and a run claimed leaves a
claim. Readers compact them into the index's checkpoint after a listing (``index.compact``),
but a store that only short-lived writers touch (a sweep, a test suite, jobs that each open,
log and close a run) would otherwise keep one file per writer at its root without bound: the
next listing reads them all, and every later scan of the root lists them.

So a writer, once it has written a run's end (the end batch's summary), folds the index when
it is due: it counts the index files at the root (their names: a scan on local disk, one
listing request per 1,000 on object stores) and, when there are :data:`FOLD_AFTER_FILES`
more than at this process's last fold of that root (or its own ends since then made enough
of them removable, below), runs a reader's listing, which compacts by its own rules
(``index.compact``): it writes the next checkpoint first, by an atomic create-if-absent, and
only then removes what that checkpoint folded of writers that ended. The count at the root
is then the live writers' summaries plus a constant.

Concurrency: a fold is a reader's compaction, so two processes folding one store at once,
or a fold racing a listing, behave as two readers' compactions do: of two checkpoints
``n + 1``, one is created and the other writer stops; a file is removed only after a
checkpoint holding it exists, and only at the version folded (a summary rewritten since is
kept); a listing that finds a file gone meanwhile lists again, and reads it from the newer
checkpoint, so it sees each run once. A fold never fails a write: it is bounded by
:data:`FOLD_BUDGET_S` (cut short at any step it leaves what a crash there would) and what
goes wrong is logged at debug level; the next fold, or the next reader, does it. Nor does it
delay one: it runs on the tracker loop beside the closes (``Runtime.background``), not in the
batch that holds the run's end, so that batch is acknowledged and the close reports at once;
the process's exit waits for it, within its budget.

Which process checks, and when: each process counts per store root (:class:`_FoldState`)
its writers that began and the ends they wrote, and checks at an end that leaves it no other
live writer of the root: at its first such end, then every :data:`FOLD_CHECK_EVERY` ends. A
process that opens one short run checks once; one with 1,000 runs closing at once checks
after the last of them, once (not in the middle of their closes, whose memory would then
peak with the fold's); one that always holds a live run of the root leaves the fold to the
readers' listings. After a fold that compacted nothing (the files are live writers'
summaries, not removable), the next waits for :data:`FOLD_AFTER_FILES` more files than that
fold saw, so many live writers do not make every check read the index; and a process whose
own ends since then number half that floor (and at least :data:`FOLD_AFTER_FILES`) folds
again, since those writers' files are now removable: a fold per half as many ends as the root
holds files, no more often.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

import anyio

from async_tracker.backend.fsspec import index
from async_tracker.backend.fsspec.indexfiles import list_index
from async_tracker.backend.fsspec.layout import INDEX_PREFIX
from async_tracker.backend.fsspec.reader import FsspecReader
from async_tracker.backend.fsspec.storage import _Storage
from async_tracker.backend.fsspec.summaries import run_list
from async_tracker.runtime.process import run_blocking, runtime

logger = logging.getLogger(__name__)

# Fold once the index files at the root (checkpoints aside) number this many more than at
# this process's last fold of the store: more than the readers' own threshold to compact
# (index.COMPACT_AFTER_FILES), so that a fold finds enough to remove to write a checkpoint.
FOLD_AFTER_FILES = 64
# Look at the root at a process's first end in a store that leaves it no live writer there,
# then every this many ends.
FOLD_CHECK_EVERY = 16
# A fold runs beside the closes, on the tracker loop, and the process's exit waits for it:
# given up past this, as a crash there would leave it.
FOLD_BUDGET_S = 2.0


@dataclasses.dataclass
class _FoldState:
    """What this process knows of one store root: its live writers and the ends written to
    it, how many index files its last fold saw (the floor the next fold waits to exceed), and
    whether a fold of it is under way here."""

    ends: int = 0
    floor: int = 0
    ends_at_fold: int = 0  # ``ends`` when the floor was set
    checked_at: int = 0  # ``ends`` at the last check (0: none yet)
    live: int = 0  # this process's writers of the root that have not written their end
    folding: bool = False


# Per process and root. A forked child inherits the parent's counts, which only shifts when
# it first checks; the lock guards the counts against writers on several threads (the
# tracker loop, and a user's own loop calling a backend directly).
_states: dict[str, _FoldState] = {}
_states_lock = threading.Lock()


def writer_started(root: str) -> None:
    """A writer of this process began a run's batches on ``root`` (its end comes later)."""
    with _states_lock:
        _states.setdefault(root, _FoldState()).live += 1


def _due_to_check(root: str) -> _FoldState | None:
    """Counts an end written to ``root``; the root's state, marked folding, when this end
    should check: only once this process holds no other live writer of the root (runs
    closing together fold once, after the last of them, not in the middle of their
    closes), then at its first such end and every FOLD_CHECK_EVERY ends; never while a
    fold of it is under way here."""
    with _states_lock:
        state = _states.setdefault(root, _FoldState())
        state.ends += 1
        state.live = max(0, state.live - 1)
        if state.live or state.folding:
            return None
        if state.checked_at and state.ends - state.checked_at < FOLD_CHECK_EVERY:
            return None
        state.checked_at = state.ends
        state.folding = True
        return state


def _count_local(root: str) -> int:
    """The index files at a local root, checkpoints aside, by name (no stat)."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return sum(
        1
        for name in names
        if name.startswith(INDEX_PREFIX) and not name.startswith(index.CHECKPOINT_PREFIX)
    )


async def _count(storage: _Storage, root: str) -> int:
    if storage.stages:  # local disk: names alone
        return await run_blocking(_count_local, root, endpoint=storage.endpoint)
    listed = await list_index(storage, root)
    return sum(1 for name in listed if not name.startswith(index.CHECKPOINT_PREFIX))


def fold_soon(storage: _Storage, root: str) -> None:
    """After a writer wrote a run's end: counts the end and, if a fold of ``root`` is due
    (see the module's docstring), starts it on the tracker loop, for no close to wait for:
    the batch is acknowledged and the close reports at once, whatever the fold takes. The
    process's exit waits for it, within :data:`FOLD_BUDGET_S`
    (``Runtime.background``)."""
    state = _due_to_check(root)
    if state is not None:
        runtime().background(_fold_bounded, storage, root, state, within_s=FOLD_BUDGET_S)


async def _fold_bounded(storage: _Storage, root: str, state: _FoldState) -> bool:
    """:func:`_fold` within :data:`FOLD_BUDGET_S`, never raising (but for cancellation). True
    if the root then held fewer index files (this fold, or a racing one, removed some)."""
    try:
        with anyio.move_on_after(FOLD_BUDGET_S):
            return await _fold(storage, root, state)
        logger.debug("async_tracker: the run index of %s not folded within %.1f s",
                     root, FOLD_BUDGET_S)  # fmt: skip
    except Exception as exc:  # the writes it follows succeeded: a reader folds it later
        logger.debug("async_tracker: the run index of %s not folded: %s: %s",
                     root, type(exc).__name__, exc)  # fmt: skip
    finally:
        with _states_lock:
            state.folding = False
    return False


async def _fold(storage: _Storage, root: str, state: _FoldState) -> bool:
    count = await _count(storage, root)
    with _states_lock:
        # The files this process's own ends made removable since the floor was set (the live
        # writers' files it left may be theirs): half the floor, so that over many live
        # writers a fold reads the index once per as many ends as it holds files.
        ended = state.ends - state.ends_at_fold >= max(FOLD_AFTER_FILES, state.floor // 2)
        if count < state.floor + FOLD_AFTER_FILES and not (ended and count >= FOLD_AFTER_FILES):
            # Fewer than the floor: another process folded meanwhile; let the floor follow.
            state.floor = min(state.floor, count)
            return False
        # Raised before the listing: a fold given up (its budget) is not retried at once.
        state.floor, state.ends_at_fold = count, state.ends
    # A reader's listing, which compacts by its own rules (index.compact).
    await run_list(FsspecReader(storage, root))
    after = await _count(storage, root)
    with _states_lock:
        # What is left are live writers' files (or files a racing fold has not removed yet):
        # the next fold waits for FOLD_AFTER_FILES more than that.
        state.floor = after
    return after < count


__all__ = ["FOLD_AFTER_FILES", "FOLD_BUDGET_S", "FOLD_CHECK_EVERY", "fold_soon", "writer_started"]
