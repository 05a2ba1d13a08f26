"""The run index of the fsspec store: the writers' summaries, compacted into a checkpoint, so
that the run list costs O(1) requests plus what changed since the last compaction.

Files, at the store's root beside the run directories (names in ``layout.py``)::

    .index-summary-<digest>-<writer token>.json  what one process wrote to one run
                                                 (summaries.py), rewritten whole by that
                                                 process at each flush and heartbeat
    .index-summary-<digest>-rebuilt.json         a reader's summary of a run that had none
    .index-claim-<digest>-<name>.json            {"run": id}: a run claimed, listed before its
                                                 first summary
    .index-removed-<digest>-<name>.json          {"run": id, "files": {name: version}}: a run
                                                 deleted (a tombstone)
    .index-checkpoint-<20-digit n>.json[.gz]     everything above as of its compaction

``<digest>`` is the run id's (``layout._digest``), ``<name>`` a unique time-ordered name. Files,
not a folder: torchx's ``run_ids`` takes every folder at the root for a run, a hidden one too,
and skips files. One name prefix: an object store lists them alone (one request per 1,000 index
files, however many runs; on local disk, a scan of the root's names). The previous version
kept the summaries as ``.summary-<digest>-<token>.json``: those are still read, folded into a
checkpoint and removed like the others.

**A checkpoint** (``indexcheckpoint.py``) holds, per run, each writer's summary as its file
held it (the text: a checkpoint never rewrites what it folds, and a writer's newer summary
replaces its entry, never adds to it), the run as the list shows it when its status is final
(ended, or crashed: then with the time that was judged at), and the version (size and ETag
on object stores; size, mtime and inode on local disk) of each file it folded, each marked
when compaction may remove it. Also when it last listed the store's root. One file (see
:class:`Checkpoint`): a JSON line (its number, times, the files it folded), a JSON line of
one flat row per run, then the texts the rows point into
(each run's params and metrics; each writer's summary).
A listing parses the rows alone: a run's params and metrics when they are looked at (a list
of 100,000 runs shows 50), its writers' summaries when it must summarise the run again.
gzip'd on object stores (fewer bytes on the wire), plain on local disk (reading it from the
page cache is faster than inflating it). Params that orjson cannot write exactly (NaN,
infinities, huge ints: what a run may hold) are written by ``json``.

**A listing** (:func:`read`): one listing of the index files, a read of the newest checkpoint,
then a read of each file it did not fold, or folded at another version. A tombstone voids the
checkpoint's entries of its run and the files it names at the versions it names. A run no
file changed, whose status is final, comes straight from the checkpoint (no parse of its
writers' summaries, no status read); the others are summarised as before (``summaries.py``),
from their entries. A reader that lists again and again (the dashboard) keeps the checkpoint,
decoded, and the files in its :class:`SummaryFileCache`: an unchanged store costs one listing.

The store's root is listed in full (its run directories) at the first listing of a store,
then at a compaction every :data:`RESCAN_AFTER_S`: that finds runs that no summary or claim
names (written by torchx or by versions without summaries: each is summarised once, as
before), and drops runs whose directory went (removed by hand).

**Compaction** (:func:`compact`), by a reader after its listing: when the files it did not
fold that compaction may remove (summaries of writers that ended, rebuilt summaries, claims,
tombstones and what they void) number :data:`COMPACT_AFTER_FILES`, when the files it did not
fold number :data:`COMPACT_AFTER_CHANGES`, or when the root is due a listing. It writes the
checkpoint ``n + 1`` (``n``: the newest listed) by an atomic create-if-absent (a hard link
locally, a conditional PUT on S3 and GCS): of concurrent compactors exactly one wins; the
others stop there. (A filesystem without such a write gets a lookup then a write, as claims
do: two compactors within one round trip may then both win, and a summary one of them
removed may miss from the other's checkpoint until its writer writes again.) The winner
lists the index again and removes the files that its checkpoint folded, at the version they
still have, and marked removable, and the checkpoints older than the one before its own.
A live writer's summary is never removed: only a writer's that ended (its
status is final), which nobody rewrites but a replay of its batches (``async-tracker sync``).
The window between that second listing and the removal is the one race left: a replay that
rewrites an ended writer's summary within it loses that write from the list (its records
are stored; its next write, if any, puts it back).

Why a crash loses nothing and doubles nothing: a checkpoint is whole once it is there (a
link, a single PUT) and is written before anything is removed; a file removed is in the
checkpoint; a file not removed is either in the checkpoint at its version (not read again)
or read and put in place of its writer's entry. A reader that finds a file gone between the
listing and its read (a compactor removed it meanwhile) lists again.

Writers (``writer.py``) meet the index three times: ``claim_run`` adds a claim
(:func:`add_claim`); a writer that finds its own summary missing while the run holds records
(a replay by ``async-tracker sync`` after a compaction removed it) continues from the
checkpoint's entry (:func:`stored_summary`); ``delete_run`` writes a tombstone
(:func:`remove_run`). A read-only store is never compacted: it is listed as the previous
version listed it, from its root.

The index's file I/O (listings with versions, reads, exclusive creates, removals) is in
``indexfiles.py``; this module holds the names, a listing, compaction and the writers' side.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import logging
import posixpath
import re
import time
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import orjson

from async_tracker.backend.fsspec.cache import SummaryFileCache
from async_tracker.backend.fsspec.indexcheckpoint import (
    _AT,
    _START,
    _STATUS,
    Checkpoint,
    _decode,
    _encode,
    _gc_paused,
    _loads,
    _Row,
)

# The index's I/O, called by these names from this module: the tests of races and crashes
# replace _create, _read and _remove here.
from async_tracker.backend.fsspec.indexfiles import (
    Version,
    _create,
    _fetch,
    _put,
    _read,
    _remove,
    _scan_root,
    _takes_prefix,
    list_index,
)
from async_tracker.backend.fsspec.layout import (
    _SUMMARY_FILE,
    _UNPARSEABLE,
    INDEX_PREFIX,
    LEGACY_SUMMARY_PREFIX,
    REBUILT_TOKEN,
    SUMMARY_PREFIX,
    _digest,
    _names,
)
from async_tracker.backend.fsspec.parsing import _Skipped
from async_tracker.backend.fsspec.reader import FsspecReader
from async_tracker.backend.fsspec.storage import _encode_json, _mapped, _Storage
from async_tracker.errors import BackendError
from async_tracker.runtime.process import run_blocking
from async_tracker.store.summary import RunSummary, WriterSummary

logger = logging.getLogger(__name__)

CLAIM_PREFIX = INDEX_PREFIX + "claim-"
REMOVED_PREFIX = INDEX_PREFIX + "removed-"
CHECKPOINT_PREFIX = INDEX_PREFIX + "checkpoint-"
_CHECKPOINT = re.compile(r"\.index-checkpoint-(\d{20})\.json(\.gz)?")

# Compact once this many files not folded could be removed by it (summaries of writers that
# ended, rebuilt summaries, claims, tombstones): what a reader without a cache (the CLI)
# otherwise reads at every listing.
COMPACT_AFTER_FILES = 16
# ... or once this many files are not folded, whatever they are (live writers' summaries).
COMPACT_AFTER_CHANGES = 256
# List the store's root at a compaction at least this often (wall clock): runs that no
# summary names (torchx's) are found, and runs whose directory went are dropped.
RESCAN_AFTER_S = 600.0

# The statuses that no later listing changes while no file of the run changes.
_ENDED = frozenset({"finished", "failed", "killed"})

# What parses a summary file into the runs it is about: summaries.py's ``_add_summary``
# (``runs``, the file's name, its content) -> why it was skipped ("" if not).
Parse = Callable[[Mapping[str, "_Found"], str, "bytes | None"], str]


class _Found:
    """One run and its writers' summaries, as a listing found them."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.writers: dict[str, WriterSummary] = {}
        self.rebuilt: dict[str, WriterSummary] | None = None

    def merged(self) -> dict[str, WriterSummary]:
        """The writers' summaries: each writer's own, else the rebuilt one of its token."""
        return {**(self.rebuilt or {}), **self.writers}


class _Runs(Mapping[str, _Found]):
    """Runs by id, each added at its first mention: the index knows runs by their summaries,
    not by their directories. ``last`` is the run the latest lookup was about: what the file
    just parsed was about."""

    def __init__(self) -> None:
        self.runs: dict[str, _Found] = {}
        self.last: str | None = None

    def __getitem__(self, run_id: str) -> _Found:
        self.last = run_id
        found = self.runs.get(run_id)
        if found is None:
            found = self.runs[run_id] = _Found(run_id)
        return found

    def add(self, run_id: str) -> _Found:
        return self[run_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)


# -- a listing --------------------------------------------------------------------------------


@dataclasses.dataclass
class IndexRead:
    """What one listing found: the runs to summarise from their entries (``found``), the ids
    of the runs the checkpoint gives as they are (``ready_ids``: their summaries are made
    from its rows when asked for, see :meth:`Checkpoint.summary`), and what a compaction
    builds on."""

    checkpoint: Checkpoint | None = None
    newest: int = 0  # the highest checkpoint number listed (0: none)
    listing: dict[str, Version] = dataclasses.field(default_factory=dict)
    # The root's summary files of the previous version, when the root was listed.
    legacy: dict[str, Version] | None = None
    found: list[_Found] = dataclasses.field(default_factory=list)
    ready_ids: list[str] = dataclasses.field(default_factory=list)
    ready_starts: list[float | None] = dataclasses.field(default_factory=list)  # their starts
    # What this listing read of the files not folded: by path, [version, removable]; the
    # summaries' texts by run and writer token; the runs deleted; the paths whose content
    # is void (named by a tombstone, or of a run whose directory went).
    files: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    texts: dict[str, dict[str, bytes]] = dataclasses.field(default_factory=dict)
    removed: set[str] = dataclasses.field(default_factory=set)
    void: set[str] = dataclasses.field(default_factory=set)
    vanished: bool = False  # a file listed was gone when read: list again


def _checkpoint_number(name: str) -> int | None:
    found = _CHECKPOINT.fullmatch(name)
    return int(found[1]) if found else None


_KINDS = (
    (SUMMARY_PREFIX, "summary"), (CLAIM_PREFIX, "claim"), (REMOVED_PREFIX, "removed"),
    (CHECKPOINT_PREFIX, "checkpoint"), (LEGACY_SUMMARY_PREFIX, "legacy"),
)  # fmt: skip


def _kind(name: str) -> str:
    """What a file of the index is: ``summary``, ``claim``, ``removed``, ``checkpoint``,
    ``legacy`` (the previous version's summary), or ``""`` (staging, a foreign file)."""
    for prefix, kind in _KINDS:
        if name.startswith(prefix):
            return kind
    return ""


def _renamed(legacy: str) -> str:
    """The name this version gives the previous version's summary file."""
    return SUMMARY_PREFIX + legacy.removeprefix(LEGACY_SUMMARY_PREFIX)


def _digest_of(name: str) -> str:
    """The digest of the run id that a summary, claim or tombstone is about."""
    for prefix, _ in _KINDS:
        if name.startswith(prefix):
            return name[len(prefix) : len(prefix) + 16]
    return ""


def _folded(checkpoint: Checkpoint | None, rel: str, version: Version) -> bool:
    """Whether the checkpoint folded the file at this version (never, when the filesystem
    tells no version)."""
    held = checkpoint.files.get(rel) if checkpoint is not None else None
    return held is not None and version is not None and held[0] == version


async def read(
    reader: FsspecReader,
    now: float,
    skipped: _Skipped,
    cache: SummaryFileCache | None,
    parse: Parse,
) -> IndexRead:
    """One listing of the index (see the module's docstring)."""
    root = reader.root_dir
    state = IndexRead(listing=await list_index(reader.storage, root))
    checkpoint = await _newest(reader, state, skipped, cache)
    state.checkpoint = checkpoint
    dirs: set[str] | None = None
    if checkpoint is None or time.time() - checkpoint.rescan >= RESCAN_AFTER_S:
        dirs, state.legacy = await _scan_root(reader, skipped)

    # The files the checkpoint did not fold: the previous version's first (a writer of this
    # version that continued one of them replaces it), tombstones, summaries, claims.
    wanted: list[tuple[str, Version]] = sorted(
        (rel, v) for rel, v in (state.legacy or {}).items() if not _folded(checkpoint, rel, v)
    )
    for kind in ("removed", "summary", "claim"):
        wanted += sorted(
            (rel, v)
            for rel, v in state.listing.items()
            if _kind(rel) == kind and not _folded(checkpoint, rel, v)
        )
    contents = await _read(reader, [r for r, _ in wanted], [v for _, v in wanted], cache)
    # One gone meanwhile (a compactor removed it after folding it in a newer checkpoint):
    # the caller lists again.
    state.vanished = any(data is None for data in contents)

    runs = _Runs()
    run_of: dict[str, str] = {}  # a summary or claim file: its run
    hidden: dict[str, Version] = {}
    for (rel, version), data in zip(wanted, contents):
        if data is None:
            continue
        path = posixpath.join(root, rel)
        kind = _kind(rel)
        if hidden.get(rel, False) == version and version is not None:
            state.void.add(rel)
            continue
        if kind in ("removed", "claim"):
            try:
                content = _loads(data)
                run_id = str(content["run"])
                files = dict(content.get("files") or {}) if kind == "removed" else {}
            except (*_UNPARSEABLE, orjson.JSONDecodeError) as exc:
                skipped.add(path, exc)
                continue
            if kind == "removed":
                state.removed.add(run_id)
                hidden.update({str(k): v for k, v in files.items()})
            else:
                runs.add(run_id)  # a claim: the run is known, with no summary yet
                run_of[rel] = run_id
            state.files[rel] = [version, True]
            continue
        runs.last = None
        why = parse(runs, rel, data)
        if why:
            skipped.add(path, why)
            continue
        matched = _SUMMARY_FILE.fullmatch(rel)
        about = runs.last
        if about is None or matched is None:
            continue  # not a summary of ours, or of a run passed over
        run_id, token = about, matched[1]
        found = runs.runs[run_id]
        writer = found.writers.get(token)
        ended = token == REBUILT_TOKEN or (
            writer is not None and writer.status is not None and writer.end is not None
        )
        state.texts.setdefault(run_id, {})[token] = data
        state.files[rel] = [version, ended]
        run_of[rel] = run_id

    gone = set() if dirs is None else {r for r in runs.runs if r not in dirs}
    for rel, run_id in run_of.items():
        if run_id in gone and rel in state.files:
            state.void.add(rel)
            del state.files[rel]
    changed = {r for r, f in runs.runs.items() if r not in gone}
    changed |= state.removed
    held = checkpoint.runs if checkpoint is not None else {}
    stale, state.ready_ids, state.ready_starts = await run_blocking(
        _resolve, checkpoint, changed, state.removed, dirs, now,
        endpoint=reader.storage.endpoint,
    )  # fmt: skip

    # The runs to summarise: from their checkpoint entries (none for a run deleted since),
    # then what the files not folded hold in place of them.
    entries = _Runs()
    for run_id in stale:
        entries.add(run_id)  # known, even with no entry left
        texts = checkpoint.texts(run_id) if checkpoint is not None else {}
        for token, text in texts.items():
            name = f"{SUMMARY_PREFIX}{_digest(run_id)}-{token}.json"
            why = parse(entries, name, text)
            if why:
                skipped.add(f"{root}: checkpoint's {name} (run {run_id!r})", why)
    # A summary that names another run than its entry's (a corrupt entry) is not counted.
    wanted_ids = set(stale)
    entries.runs = {k: v for k, v in entries.runs.items() if k in wanted_ids}
    for run_id, f in runs.runs.items():
        if run_id in gone:
            continue
        found = entries[run_id]
        found.writers.update(f.writers)
        if f.rebuilt is not None:
            found.rebuilt = f.rebuilt
    for run_id in dirs or ():
        if run_id not in entries.runs and (run_id not in held or run_id in state.removed):
            entries.add(run_id)  # a directory no summary names: summarised once
    state.found = list(entries.runs.values())
    return state


async def _newest(
    reader: FsspecReader, state: IndexRead, skipped: _Skipped, cache: SummaryFileCache | None
) -> Checkpoint | None:
    """The newest checkpoint that reads (an older one if the newest does not parse)."""
    numbered = sorted(
        ((n, rel) for rel in state.listing if (n := _checkpoint_number(rel)) is not None),
        reverse=True,
    )
    state.newest = numbered[0][0] if numbered else 0
    for _, rel in numbered:
        version = state.listing[rel]
        path = posixpath.join(reader.root_dir, rel)
        kept = cache.get_decoded(path, version) if cache is not None else None
        if isinstance(kept, Checkpoint):
            return kept
        # Not kept in the cache's files: what the reader keeps of it is the decoded form.
        (data,) = await _read(reader, [rel], [version], None)
        if data is None:
            state.vanished = True  # removed by a newer compaction meanwhile
            continue
        try:
            checkpoint = await run_blocking(
                _decode, rel, data, endpoint=reader.storage.endpoint
            )
        except (*_UNPARSEABLE, orjson.JSONDecodeError, OSError, EOFError, zlib.error) as exc:
            skipped.add(path, exc)
            continue
        if cache is not None:
            cache.put_decoded(path, version, checkpoint)
        return checkpoint
    return None


def _resolve(
    checkpoint: Checkpoint | None,
    changed: Collection[str],
    removed: Collection[str],
    dirs: Collection[str] | None,
    now: float,
) -> tuple[list[str], list[str], list[float | None]]:
    """Sorts the checkpoint's runs: those to summarise from their entries (a file of theirs
    changed, or their status may have: not final, or crashed as judged after ``now``), and
    those it gives as they are (their ids, and their starts as their rows keep them: a
    summary is made of a row when it is asked for, and a list of 100,000 runs that shows the
    newest 20 asks for 20). A run deleted since, or whose
    directory went (``dirs``: the root's, when listed), is neither. One blocking call: the
    loop over every run of the store."""
    stale: list[str] = []
    ids: list[str] = []
    starts: list[float | None] = []
    if checkpoint is None:
        return stale, ids, starts
    with _gc_paused():
        for run_id, row in checkpoint.runs.items():
            if dirs is not None and run_id not in dirs:
                continue
            if run_id in changed:
                if run_id not in removed:
                    stale.append(run_id)
                continue
            status = row[_STATUS]
            if status in _ENDED or (status == "crashed" and row[_AT] <= now):
                ids.append(run_id)
                starts.append(row[_START])
            else:
                stale.append(run_id)
    return stale, ids, starts


# -- compaction -------------------------------------------------------------------------------


def _wanted(state: IndexRead, rescanned: bool) -> bool:
    if state.vanished:
        return False
    if rescanned:
        return bool(state.found or state.ready_ids or state.files or state.void)
    held = state.checkpoint.files if state.checkpoint is not None else {}
    # Files folded by name whose filesystem tells no version are read at every listing
    # (memory://), but count once.
    new = [info for rel, info in state.files.items() if rel not in held or info[0] is not None]
    removable = sum(1 for info in new if info[1]) + len(state.void)
    return removable >= COMPACT_AFTER_FILES or len(new) >= COMPACT_AFTER_CHANGES


async def compact(
    reader: FsspecReader,
    state: IndexRead,
    runs: Sequence[_Found],
    summaries: Sequence[RunSummary],
    now: float,
    cache: SummaryFileCache | None = None,
) -> int | None:
    """Writes the next checkpoint when :func:`read`'s listing calls for one: the runs it gave
    as they are, and ``runs`` (each summarised as ``summaries``); then, if this compactor's
    checkpoint is the one created, removes what it made redundant, and gives ``cache`` the
    checkpoint (the next listing of this reader does not read it back). Its number, or None
    (none called for, another compactor's won, or the store refused the write: a read-only
    store)."""
    rescanned = state.legacy is not None
    if not _wanted(state, rescanned):
        return None
    try:
        return await _compact(reader, state, runs, summaries, now, rescanned, cache)
    except BackendError as exc:  # a read-only store: compacted by a reader that can write
        logger.debug("async_tracker: the run index of %s is not compacted: %s",
                     reader.root_dir, exc)  # fmt: skip
        return None


async def _compact(
    reader: FsspecReader,
    state: IndexRead,
    runs: Sequence[_Found],
    summaries: Sequence[RunSummary],
    now: float,
    rescanned: bool,
    cache: SummaryFileCache | None,
) -> int | None:
    storage, root = reader.storage, reader.root_dir
    checkpoint = state.checkpoint
    rows: list[_Row] = []
    if checkpoint is not None:
        for run_id in state.ready_ids:  # as they were
            held = (checkpoint, checkpoint.runs[run_id])
            rows.append(_Row(run_id, checkpoint.texts(run_id), held=held))
    for found, summary in zip(runs, summaries):
        texts: dict[str, bytes] = {}
        if checkpoint is not None and found.run_id not in state.removed:
            texts.update(checkpoint.texts(found.run_id))
        texts.update(state.texts.get(found.run_id, {}))
        if found.rebuilt is not None and REBUILT_TOKEN not in texts:
            # Rebuilt by this listing (its file, if the store took it, is read next time).
            content = {"v": 1, "run": found.run_id,
                       "writers": {t: w.to_json() for t, w in found.rebuilt.items()}}  # fmt: skip
            texts[REBUILT_TOKEN] = _encode_json(content, found.run_id)
        final = summary.status in _ENDED or summary.status == "crashed"
        at = now if summary.status == "crashed" else None
        rows.append(_Row(found.run_id, texts, summary if final else None, at))
    listed = {row.run_id for row in rows}
    digests = await run_blocking(
        lambda: {_digest(run_id) for run_id in listed}, endpoint=storage.endpoint
    )
    files = _folded_files(state, digests, rescanned)
    rescan = time.time() if rescanned or checkpoint is None else checkpoint.rescan
    n = state.newest + 1
    gz = not storage.stages
    name = f"{CHECKPOINT_PREFIX}{n:020d}.json{'.gz' if gz else ''}"
    made = await run_blocking(_encode, n, rescan, files, rows, endpoint=storage.endpoint)
    data = made.data
    if gz:
        # Level 1: most of what level 9 saves on this repetitive text, in a fraction of its time.
        data = await run_blocking(
            functools.partial(gzip.compress, data, compresslevel=1, mtime=0),
            endpoint=storage.endpoint,
        )
    if not await _create(storage, posixpath.join(root, name), data):
        return None  # another compactor's checkpoint n is there: it removes what it folded
    # The winner: what its checkpoint made redundant, at the version it folded (listed again
    # just now: a file rewritten since is kept), and the checkpoints before the last two.
    fresh = await list_index(storage, root)
    doomed = [
        rel
        for rel, (version, removable) in files.items()
        if removable
        and version is not None
        and (_kind(rel) == "legacy" or fresh.get(rel) == version)
    ]
    doomed += [rel for rel in fresh if (k := _checkpoint_number(rel)) is not None and k < n - 1]
    await _remove(storage, [posixpath.join(root, rel) for rel in doomed])
    if cache is not None and fresh.get(name) is not None:
        if checkpoint is not None:  # the runs carried as they were keep what was made of them
            made.decoded.update(
                {r: checkpoint.decoded[r] for r in state.ready_ids if r in checkpoint.decoded}
            )
        cache.put_decoded(posixpath.join(root, name), fresh[name], made, read=False)
    return n


def _folded_files(
    state: IndexRead, digests: Collection[str], rescanned: bool
) -> dict[str, list[Any]]:
    """The files the next checkpoint folds, by path: ``[version, removable]``."""
    held = state.checkpoint.files if state.checkpoint is not None else {}
    present = dict(state.listing)
    if rescanned:
        present.update(state.legacy or {})
    else:  # the root was not listed: the previous version's files as they were folded
        present.update({rel: info[0] for rel, info in held.items() if _kind(rel) == "legacy"})
    # The previous version's summary names, as this version names them.
    index_names = {name for name in state.listing if _kind(name) == "summary"}
    out: dict[str, list[Any]] = {}
    for rel, version in present.items():
        kind = _kind(rel)
        if kind in ("checkpoint", ""):
            continue
        if rel in state.void:
            out[rel] = [version, True]
            continue
        info = state.files.get(rel)
        if info is None:
            if not _folded(state.checkpoint, rel, version):
                continue  # read, and it did not parse: left for a later listing
            info = held[rel]
        removable = bool(info[1])
        if kind in ("summary", "claim", "legacy"):
            if _digest_of(rel) not in digests:
                removable = True  # of a run no more listed (deleted, or its directory gone)
            elif kind == "legacy" and _renamed(rel) in index_names:
                removable = True  # continued by a writer of this version, in the index
        out[rel] = [version, removable]
    return out


# -- the writers' side ------------------------------------------------------------------------


async def add_claim(storage: _Storage, root: str, run_id: str) -> None:
    """Names a run just claimed, so that it is listed before its first summary."""
    path = posixpath.join(root, f"{CLAIM_PREFIX}{_digest(run_id)}-{_names.new()}.json")
    await _put(storage, path, _encode_json({"run": run_id}, path))


async def remove_run(storage: _Storage, root: str, run_id: str) -> None:
    """``delete_run``'s part: the run's summaries and claims removed, and first a tombstone
    naming them, with the versions they have, so that the run leaves the list at once (the
    checkpoint's entries of the run are void) and a file its removal missed (a crash) is
    void too. A summary written after it (a writer still writing) is a new run's."""
    digest = _digest(run_id)
    # The previous version's summaries, at the root: before the tombstone, which names
    # files of the index alone.
    with _mapped(f"listing of the summaries of {run_id!r}"):
        if _takes_prefix(storage.fs) and storage.is_async:
            storage.fs.invalidate_cache(root)
            found = await storage._call("find", root, prefix=f"{LEGACY_SUMMARY_PREFIX}{digest}-")
            legacy = [str(p) for p in found]
        else:
            legacy = await storage.glob(posixpath.join(root, f"{LEGACY_SUMMARY_PREFIX}{digest}-*"))
    await _remove(storage, legacy)
    mine = {
        rel: version
        for rel, version in (await list_index(storage, root)).items()
        if _kind(rel) in ("summary", "claim") and _digest_of(rel) == digest
    }
    path = posixpath.join(root, f"{REMOVED_PREFIX}{digest}-{_names.new()}.json")
    await _put(storage, path, _encode_json({"run": run_id, "files": mine}, path))
    await _remove(storage, [posixpath.join(root, rel) for rel in mine])


async def stored_summary(
    storage: _Storage, root: str, run_id: str, token: str, parse: Parse
) -> WriterSummary | None:
    """The summary of ``run_id`` by ``token`` that the newest checkpoint holds, or None
    (none, or the run was deleted since that checkpoint). For a writer whose own summary a
    compaction removed (it ended), which writes again: a replay of its batches."""
    listing = await list_index(storage, root)
    digest = _digest(run_id)
    numbered = sorted(
        ((n, rel) for rel in listing if (n := _checkpoint_number(rel)) is not None),
        reverse=True,
    )
    for _, rel in numbered:
        data = await _fetch(storage, posixpath.join(root, rel))
        if data is None:
            continue  # removed by a newer compaction meanwhile: an older one
        try:
            checkpoint = await run_blocking(_decode, rel, data, endpoint=storage.endpoint)
        except (*_UNPARSEABLE, orjson.JSONDecodeError, OSError, EOFError, zlib.error):
            continue
        if any(
            _kind(name) == "removed" and _digest_of(name) == digest
            and not _folded(checkpoint, name, version)
            for name, version in listing.items()
        ):  # fmt: skip
            return None  # deleted after this checkpoint: what it holds is void
        text = checkpoint.texts(run_id).get(token)
        if text is None:
            return None
        runs = _Runs()
        if parse(runs, f"{SUMMARY_PREFIX}{digest}-{token}.json", text):
            return None
        found = runs.runs.get(run_id)
        return found.writers.get(token) if found is not None else None
    return None


__all__ = [
    "CHECKPOINT_PREFIX",
    "CLAIM_PREFIX",
    "COMPACT_AFTER_CHANGES",
    "COMPACT_AFTER_FILES",
    "REMOVED_PREFIX",
    "RESCAN_AFTER_S",
    "Checkpoint",
    "IndexRead",
    "add_claim",
    "compact",
    "list_index",
    "read",
    "remove_run",
    "stored_summary",
]
