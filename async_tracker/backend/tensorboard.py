"""The TensorBoard backend: one log directory per run, in event files TensorBoard reads.

Layout under the root (``tensorboard --logdir <root>`` shows every run)::

    <root>/<run id>/            one directory per run; the "/"-parts of the id nest
        events.out.tfevents.<seconds>.<host>.<pid>.<n>
                                this process's event file for the run: each metric point a
                                ``simple_value`` scalar, as torch's ``SummaryWriter`` writes
                                them (float32; its step; the client's wall time), after an
                                event naming its batch that holds the exact float64s;
                                metadata, artifacts, sources and the end status as text
                                tables at step 0; metadata values as hparams (a session
                                started at the run's first record, ended with its status). A
                                metadata change writes the keys changed since the last
                                full table (``METADATA_CHANGES_TAG``), and the full table
                                (with the hparams) only once those changes add up to its
                                size: the two tables together show every key
        .async_tracker/
            run.json            {"run_id": ...}: the exact id (directory names escape it)
            <key>-<digest>.json one file per flush holding metadata, artifacts, sources,
                                descendants (written by a child into its parent's folder)
                                or the end status: what ``metadata()`` & co. read back

Event records are framed by TensorBoard's own ``RecordWriter`` (length, CRC-32C, protobuf).
A flush is framed in memory, then appended with one ``os.write`` loop to a file opened for
it, so that no file handle stays open per run (a sweep may hold a thousand runs open).

Retries. A flush whose append fails is cut back to where it started and the run moves to a
new event file: a torn record would hide everything after it from TensorBoard's readers,
and the retry must not store the points twice. Parts of a batch stored before a failure are
marked in ``batch.done`` and skipped by the retry. Side files are written to a temporary
name and renamed; those of a batch with a key are named after it and their content, so that
a replay after a crash overwrites them. Event files cannot be overwritten: after a crash,
the batch that was in flight may be in two event files. So each batch's scalars follow an
event naming the batch (its key) and its number of points (``BATCH_TAG``, a plugin
TensorBoard does not show); ``metrics()`` reads a batch's n-th point once, and keeps every
other point, however alike (one step, one clock tick). TensorBoard's own views keep one
point per step.

Path escaping of each "/"-part of a run id: ``%`` becomes ``%25``, NUL ``%00``, a lone
surrogate ``%uXXXX``, a leading ``.`` ``%2E``, an empty part ``%``, and a part over 200 bytes
keeps its start plus ``%~`` and a digest of the whole: distinct ids get distinct folders,
and no run folder is a hidden folder, the side folder of its parent run included.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import itertools
import json
import logging
import math
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from async_tracker.adapters import SyncTracker
from async_tracker.backend.errors import map_failure
from async_tracker.base import END_PART, AsyncTrackerBase, Checked, CloseReason
from async_tracker.errors import (
    BackendError,
    RecordError,
    TrackerConfigError,
    TransientBackendError,
)
from async_tracker.records import (
    Batch,
    Lineage,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
    sort_points,
)
from async_tracker.runtime.process import run_blocking
from async_tracker.store.reader import GenericReader, RunReader
from async_tracker.tags import split_metadata

try:
    import numpy as np  # a dependency of tensorboard
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat import tf
    from tensorboard.compat.proto import event_pb2, summary_pb2, types_pb2
    from tensorboard.plugins.hparams import api_pb2 as hparams_api
    from tensorboard.plugins.hparams import metadata as hparams_metadata
    from tensorboard.plugins.hparams import plugin_data_pb2 as hparams_data
    from tensorboard.plugins.hparams import summary_v2 as hparams_summary
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.plugins.text import summary_v2 as text_summary
    from tensorboard.summary.writer.record_writer import RecordWriter
    from tensorboard.util import tensor_util
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "the TensorBoard backend needs the tensorboard package: "
        "pip install 'async-tracker[tensorboard]'"
    ) from exc

__all__ = [
    "AsyncTensorBoardTracker",
    "TensorBoardTracker",
    "create",
    "map_error",
    "run_path",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SIDE_DIR = ".async_tracker"
RUN_FILE = "run.json"
STATUS_SUFFIX = "-status.json"  # the side files of a run's endings
TMP_PREFIX = ".tmp-"
# Text tags of the run's records; metric names may not take them (see ``validate``).
TAG_PREFIX = "async_tracker/"
METADATA_TAG = TAG_PREFIX + "metadata"
# The keys changed since the last full metadata table, with their values: a metadata change
# writes this (small) table, not the whole one again. What the run holds is the full table
# overlaid with this one.
METADATA_CHANGES_TAG = TAG_PREFIX + "metadata_changes"
ARTIFACTS_TAG = TAG_PREFIX + "artifacts"
SOURCES_TAG = TAG_PREFIX + "sources"
STATUS_TAG = TAG_PREFIX + "status"
# Each batch's scalars follow one event naming the batch (its key) and how many points it
# holds: what tells a replayed batch (a crash, then the spool) from new points. Its summary
# is of a plugin TensorBoard does not have, which its views ignore.
BATCH_TAG = TAG_PREFIX + "batch"
BATCH_PLUGIN = "async_tracker_batch"
RESERVED_PREFIXES = (TAG_PREFIX, "_hparams_/")
FILE_VERSION = "brain.Event:2"  # also tells TensorBoard not to purge on a step going back
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_PART_BYTES = 200

_SCALAR_PLUGIN = scalar_metadata.PLUGIN_NAME
_files = itertools.count()


# -- paths -------------------------------------------------------------------------------------


def _escape_part(part: str) -> str:
    out = []
    for ch in part:
        if ch == "%":
            out.append("%25")
        elif ch == "\x00":
            out.append("%00")
        elif "\ud800" <= ch <= "\udfff":
            out.append(f"%u{ord(ch):04X}")
        else:
            out.append(ch)
    text = "".join(out)
    if text.startswith("."):
        text = "%2E" + text[1:]
    if not text:
        return "%"
    if len(text.encode("utf-8")) > MAX_PART_BYTES:
        digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:20]
        head = text.encode("utf-8")[:150].decode("utf-8", "ignore")
        text = f"{head}%~{digest}"
    return text


def run_path(run_id: str) -> str:
    """The folder of ``run_id`` under the root, "/"-separated: each "/"-part of the id is a
    folder, escaped (see the module's docstring)."""
    return "/".join(_escape_part(p) for p in run_id.split("/"))


# -- errors ------------------------------------------------------------------------------------


def map_error(exc: BaseException, what: str = "write") -> BackendError:
    """The package's error for what the file system raised while doing ``what``, mapped by
    the shared table (:data:`~async_tracker.error_table.SHARED_TABLE`; tensorboard adds no
    rows of its own): OSErrors go by their number (EIO, ENOENT of a folder removed under us
    ... transient; ENOSPC, EROFS, EACCES, ENOTDIR ... about the store, the records kept;
    ENAMETOOLONG about the record). Anything the table does not know is about the store: the
    records are kept and retried after a cooldown. An error already mapped is returned as it
    is.
    """
    return map_failure(exc, lambda e: f"tensorboard {what} failed: {type(e).__name__}: {e}")


# -- encoding ----------------------------------------------------------------------------------


def _json(value: object) -> bytes:
    # ASCII: \u escapes keep what UTF-8 cannot (a run id with a lone surrogate) exact.
    try:
        return json.dumps(value).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        raise RecordError(f"tensorboard cannot encode {value!r:.200}: {exc}") from exc


def _cell(value: object) -> str:
    """A table cell of a text summary: JSON in a code span (no Markdown inside)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "`" + text.replace("`", "'") + "`"


def _text_event(tag: str, rows: list[list[str]] | str, wall_time: float) -> bytes:
    """A text summary at step 0: the text plugin shows a two-column array as a table, and
    a later table at the same step replaces the earlier one in TensorBoard's view."""
    data = np.array(rows, dtype=np.object_)
    event = event_pb2.Event(wall_time=wall_time, step=0)
    event.summary.CopyFrom(text_summary.text_pb(tag, data))
    return bytes(event.SerializeToString())


def _hparam(value: object) -> bool | float | str:
    """A metadata value as the HParams plugin can show it: a bool, a number it holds exactly
    (finite, within float64's integers), else text. The plugin shows no other kind (a
    ``None`` or a list would be missing from its table), and skips NaN: those are their
    JSON text (``null``, ``[64, 64]``, ``NaN``), as the Text tab's tables show them."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) and math.isfinite(value) and abs(value) < 2**53:
        return value
    return json.dumps(value, ensure_ascii=False)


def _hparams_event(metadata: Mapping[str, object], start: float, wall_time: float) -> bytes | None:
    """Every metadata value as an hparam of a session that started at ``start`` (seconds
    since the epoch), or None when the run has no metadata. The keys of the run's tags and
    note are left out: a column per tag ever used would crowd the HParams table (the Text
    tab's metadata table shows them)."""
    params = split_metadata(metadata)[0]
    if not params:
        return None
    hparams = {k: _hparam(v) for k, v in params.items()}
    event = event_pb2.Event(wall_time=wall_time, step=0)
    event.summary.CopyFrom(hparams_summary.hparams_pb(hparams, start_time_secs=start))
    return bytes(event.SerializeToString())


# How each ending shows in the HParams plugin's Status column. The plugin knows success,
# failure, running and unknown, no "aborted": a killed run did not finish, so it shows as a
# failure (the Text tab's status table says "killed").
_SESSION_STATUS: dict[str, int] = {
    "finished": hparams_api.STATUS_SUCCESS,
    "failed": hparams_api.STATUS_FAILURE,
    "killed": hparams_api.STATUS_FAILURE,
}


def _session_end_event(reason: str, end_time: float, wall_time: float) -> bytes:
    """The HParams plugin's session end: the run's status and when it ended."""
    info = hparams_data.SessionEndInfo(
        status=_SESSION_STATUS.get(reason, hparams_api.STATUS_UNKNOWN), end_time_secs=end_time
    )
    plugin_data = hparams_data.HParamsPluginData(session_end_info=info)
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=hparams_metadata.SESSION_END_INFO_TAG,
        metadata=hparams_metadata.create_summary_metadata(plugin_data),
        tensor=hparams_metadata.NULL_TENSOR,
    )
    event = event_pb2.Event(wall_time=wall_time, step=0, summary=summary)
    return bytes(event.SerializeToString())


def _framed(records: Iterable[bytes]) -> bytes:
    """Serialized events framed by TensorBoard's ``RecordWriter`` (length, CRC-32C, data)."""
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    for record in records:
        writer.write(record)
    return buffer.getvalue()


# -- per-run state of this process --------------------------------------------------------------


@dataclass
class _Run:
    """What this process has written to one run: its event file and the views shown in it."""

    logdir: str
    pid: int = field(default_factory=os.getpid)
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: str | None = None  # this process's event file, None until the first append
    marked: bool = False  # run.json written
    # The earliest time among the records this process wrote to the run (their own times,
    # not the time of writing): the HParams session's start. A run exported or replayed
    # later keeps the time it ran.
    start: float | None = None
    metadata: _Table = field(default_factory=lambda: _Table())
    artifacts: dict[str, TrackerArtifact] = field(default_factory=dict)
    sources: list[TrackerSource] = field(default_factory=list)


@dataclass(frozen=True)
class _Table:
    """The metadata tables this process has shown for one run: ``merged`` (every key, as
    this process wrote them), ``changes`` (the keys written since the last full table was),
    the size of that full table's events, and the bytes of changes tables written since.

    A change writes the changes table alone until the changes tables written since the
    last full table add up to its size; then the full table is written again, and the
    changes start afresh. So a run writes metadata bytes in proportion to what it changes
    (a large config then many small updates write the config about once), while the two
    tables together always show every key's last value."""

    merged: dict[str, object] = field(default_factory=dict)
    changes: dict[str, object] = field(default_factory=dict)
    full_bytes: int = 0
    changes_bytes: int = 0

    def events(
        self, update: Mapping[str, object], start: float, now: float
    ) -> tuple[list[bytes], _Table]:
        """The events that show ``update`` (the hparams' session started at ``start``), and
        the tables once they are written."""
        merged = {**self.merged, **update}
        changes = {**self.changes, **update}
        table = _text_event(METADATA_CHANGES_TAG, _rows(changes), now)
        written = self.changes_bytes + len(table)
        if self.full_bytes and written < self.full_bytes:
            return [table], _Table(merged, changes, self.full_bytes, written)
        records = [_text_event(METADATA_TAG, _rows(merged), now)]
        # hparams hold every simple value, so they go with the full table.
        hparams = _hparams_event(merged, start, now)
        if hparams is not None:
            records.append(hparams)
        if self.changes:
            # The full table holds the changes now: the changes table shows none.
            records.append(_text_event(METADATA_CHANGES_TAG, _NO_CHANGES, now))
        return records, _Table(merged, {}, sum(map(len, records)), 0)


_NO_CHANGES = "none since the last full table"


def _rows(metadata: Mapping[str, object]) -> list[list[str]]:
    return [[_cell(k), _cell(v)] for k, v in metadata.items()]


@dataclass
class _Records:
    """A run's side files, merged in name order (write order)."""

    metadata: dict[str, object] = field(default_factory=dict)
    artifacts: dict[str, TrackerArtifact] = field(default_factory=dict)
    sources: list[TrackerSource] = field(default_factory=list)
    descendants: list[TrackerSource] = field(default_factory=list)
    status: str | None = None
    ended: float | None = None  # when the run ended with ``status``


def _new_name() -> str:
    # Sorts after every batch key cut before it (keys start with the same 19-digit time).
    return f"{time.time_ns():019d}-{secrets.token_hex(6)}"


def _source_part(source: TrackerSource) -> str:
    # The part name AsyncTrackerBase.write_batch uses, so that batch.done means the same.
    return f"source:{source.source_run_id}:{source.artifact_name or ''}"


class AsyncTensorBoardTracker(AsyncTrackerBase):
    """Runs stored as TensorBoard log directories under ``root_dir`` (a local folder).

    Example::

        tracker = AsyncTensorBoardTracker("/data/tb")
        async with AppRun("sweep/trial-1", [tracker]) as run:
            run.log_metric("loss", 0.5, step=1)
        # tensorboard --logdir /data/tb

    Blocking file I/O runs in worker threads (:func:`~async_tracker.runtime.process.run_blocking`,
    the folder as its endpoint).
    """

    name = "tensorboard"

    def __init__(self, root_dir: str | os.PathLike[str]) -> None:
        root = os.fspath(root_dir)
        if root.startswith("file://"):
            root = root[len("file://") :]
        self.root_dir = os.path.abspath(os.path.expanduser(root))
        self._runs: dict[str, _Run] = {}

    def __repr__(self) -> str:
        return f"AsyncTensorBoardTracker({self.root_dir!r})"

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await run_blocking(fn, *args, endpoint=f"file://{self.root_dir}")

    def logdir(self, run_id: str) -> str:
        """The log directory of ``run_id``."""
        return os.path.join(self.root_dir, *run_path(run_id).split("/"))

    def _state(self, run_id: str) -> _Run:
        # No lock around the dict (its operations are atomic): a lock held by a parent's
        # thread at a fork would stay held forever in the child.
        state = self._runs.get(run_id)
        if state is not None and state.pid == os.getpid():
            return state
        fresh = _Run(self.logdir(run_id))
        if state is None:
            return self._runs.setdefault(run_id, fresh)
        # A forked child starts its own event file: the parent's (and its lock) stay its.
        self._runs[run_id] = fresh
        return fresh

    # -- the contract ---------------------------------------------------------------------------
    def validate(self, record: Checked) -> None:
        """Refuses what an event file or a folder name cannot hold: metric names with a
        lone surrogate or taken by this backend's own tags (``async_tracker/...``,
        ``_hparams_/...``), steps beyond 64 bits, and artifact or source names with lone
        surrogates."""
        if isinstance(record, TrackerMetric):
            _check_text(record.name, f"metric {record.name!r}")
            if record.name.startswith(RESERVED_PREFIXES):
                raise ValueError(
                    f"metric {record.name!r}: names starting with "
                    f"{' or '.join(repr(p) for p in RESERVED_PREFIXES)} are the TensorBoard "
                    "backend's own tags"
                )
            if not INT64_MIN <= record.step <= INT64_MAX:
                raise ValueError(f"metric {record.name!r}: step {record.step} exceeds 64 bits")
        elif isinstance(record, TrackerArtifact):
            _check_text(record.name, f"artifact {record.name!r}")
            _check_text(record.path, f"artifact {record.name!r}: path")
        elif isinstance(record, TrackerSource):
            _check_text(record.source_run_id, f"source {record.source_run_id!r}")
            if record.artifact_name is not None:
                _check_text(record.artifact_name, f"source {record.source_run_id!r}: artifact")

    def map_error(self, exc: BaseException) -> BaseException:
        return map_error(exc)

    async def end_run(self, run_id: str, reason: CloseReason) -> None:
        """Records how the run ended, now, if this process wrote to it (see
        :meth:`_end`)."""
        await self._end(run_id, reason, time.time())

    async def _end(self, run_id: str, reason: CloseReason, end_time: float) -> None:
        """Records how the run ended and when: a side file, a text summary, and the HParams
        plugin's session end (``finished`` shows as success, ``failed`` and ``killed``
        as failure); then forgets the run's event file. Only if this process
        wrote to the run: a process that did not has no file of its own to end."""
        state = self._runs.pop(run_id, None)
        if state is not None and state.pid == os.getpid():
            await self._blocking(self._write_status, state, reason, end_time)

    async def aclose(self, reason: CloseReason = "finished") -> None:
        """Ends every run this process wrote to and has not ended (see :meth:`end_run`).
        Nothing is buffered: each flush is on disk when ``write_batch`` returns."""
        for run_id in list(self._runs):
            await self.end_run(run_id, reason)

    async def delete_run(self, run_id: str) -> bool:
        """Removes the run's folder: its event files and side files. A run whose id extends
        this one's (``a/b`` for ``a``) lives in a subfolder of it, which is kept."""
        # Forgotten first: a later write of this process starts a new event file.
        self._runs.pop(run_id, None)
        try:
            await self._blocking(self._delete, self.logdir(run_id))
        except OSError as exc:
            raise map_error(exc, f"removal of run {run_id!r}") from exc
        return True

    @staticmethod
    def _delete(logdir: str) -> None:
        try:
            names = sorted(os.listdir(logdir))
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(logdir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                if name == SIDE_DIR or not _holds_run(path):
                    shutil.rmtree(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        # Not empty: it holds another run's folder.
        with contextlib.suppress(OSError):
            os.rmdir(logdir)

    async def run_status(self, run_id: str) -> str | None:
        """How the run ended (``finished``, ``failed``, ``killed``), None while running."""
        records = await self._blocking(self._read_records, run_id, STATUS_SUFFIX)
        return records.status

    def reader(self) -> RunReader:
        """The read side's view of this log directory: the generic reader (each run read
        through the tracker API) with the endings the runs recorded."""
        return TensorBoardReader(self)

    # -- writes ---------------------------------------------------------------------------------
    async def write_batch(self, run_id: str, batch: Batch) -> None:
        """Stores one flush: a side file for its metadata, artifacts and sources (and one in
        each parent's folder), then one append of its scalars and text summaries; last, the
        run's end record if it holds it (see :meth:`end_run`)."""
        try:
            await self._blocking(self._write_batch, run_id, batch)
            if batch.end is not None and END_PART not in batch.done:
                # This process delivers the run's end: it ends the run (a sync process may
                # not have written to it before), at the time the run ended (a spool
                # replayed later keeps it).
                self._state(run_id)
                await self._end(run_id, batch.end, batch.end_time or time.time())
                batch.done.add(END_PART)
        except Exception as exc:
            raise map_error(exc, f"write of run {run_id!r}") from exc

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self.write_batch(run_id, Batch(seq=0, metadata=dict(kwargs)))

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        meta = dict(metadata) if metadata is not None else None
        artifact = TrackerArtifact(name, path, meta)
        await self.write_batch(run_id, Batch(seq=0, artifacts={name: artifact}))

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        source = TrackerSource(source_id, artifact_name)
        await self.write_batch(run_id, Batch(seq=0, sources=[source]))

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self.write_batch(run_id, Batch(seq=0, metrics=list(metrics)))

    def _write_batch(self, run_id: str, batch: Batch) -> None:
        if batch.is_empty():
            return
        state = self._state(run_id)
        # One writer at a time per run: two lanes or a lane and a sync call on one backend.
        with state.lock:
            # Everything is encoded before anything is written: a value that cannot be
            # stored fails the batch whole (RecordError), and the parts the lane splits it
            # into hold nothing already stored.
            side, parts = self._encode_side(run_id, batch)
            events = None if "events" in batch.done else _encode_events(state, batch)
            if not state.marked:
                _put(os.path.join(state.logdir, SIDE_DIR, RUN_FILE), _json({"run_id": run_id}))
                state.marked = True
            for path, data in side:
                _put(path, data)
            batch.done.update(parts)
            if events is not None:
                if events.data:
                    self._append(state, events.data)
                state.start = events.start
                state.metadata, state.artifacts, state.sources = events.views
                batch.done.update(("events", "metrics"))

    def _encode_side(self, run_id: str, batch: Batch) -> tuple[list[tuple[str, bytes]], list[str]]:
        """The batch's side file, and one in each parent's folder, for the parts not done;
        and the names of those parts (as ``AsyncTrackerBase.write_batch`` names them)."""
        record: dict[str, object] = {}
        parts: list[str] = []
        if batch.metadata and "metadata" not in batch.done:
            record["metadata"] = batch.metadata
            parts.append("metadata")
        artifacts = [a for a in batch.artifacts.values() if f"artifact:{a.name}" not in batch.done]
        if artifacts:
            record["artifacts"] = [
                {"name": a.name, "path": a.path, "metadata": a.metadata} for a in artifacts
            ]
            parts += [f"artifact:{a.name}" for a in artifacts]
        sources = [s for s in batch.sources if _source_part(s) not in batch.done]
        if sources:
            record["sources"] = [[s.source_run_id, s.artifact_name] for s in sources]
            parts += [_source_part(s) for s in sources]
        if not record:
            return [], []
        folders = [(self.logdir(run_id), _json(record))]
        by_parent: dict[str, list[list[str | None]]] = {}
        for s in sources:
            by_parent.setdefault(s.source_run_id, []).append([run_id, s.artifact_name])
        for parent, edges in by_parent.items():
            folders.append((self.logdir(parent), _json({"descendants": edges})))
        base = batch.key or batch.names.setdefault("records", _new_name())
        # Named after the batch and its content: a replay overwrites; the halves of a batch
        # the lane split have different content, hence different names.
        files = [
            (
                os.path.join(
                    folder, SIDE_DIR, f"{base}-{hashlib.sha1(data).hexdigest()[:12]}.json"
                ),
                data,
            )
            for folder, data in folders
        ]
        return files, parts

    def _append(self, state: _Run, data: bytes) -> None:
        """Appends ``data`` to this process's event file whole, or not at all."""
        if state.events is None:
            os.makedirs(state.logdir, exist_ok=True)
            state.events = _new_event_file(state.logdir)
        fd = os.open(state.events, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            start = os.fstat(fd).st_size  # only this process appends to this file
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as exc:
                path, state.events = state.events, None  # the retry starts a new file
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise _append_error(exc, path) from exc
        finally:
            os.close(fd)

    def _write_status(self, state: _Run, reason: str, end_time: float) -> None:
        with state.lock:
            now = time.time()
            data = _json({"status": reason, "time": end_time})
            _put(os.path.join(state.logdir, SIDE_DIR, f"{_new_name()}{STATUS_SUFFIX}"), data)
            status = _text_event(STATUS_TAG, [[_cell(reason)]], now)
            self._append(state, _framed([status, _session_end_event(reason, end_time, now)]))

    # -- reads ----------------------------------------------------------------------------------
    async def metadata(self, run_id: str) -> Mapping[str, object]:
        return (await self._blocking(self._read_records, run_id)).metadata

    async def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return (await self._blocking(self._read_records, run_id)).artifacts

    async def sources(
        self, run_id: str, artifact_name: str | None = None
    ) -> Iterable[TrackerSource]:
        found = (await self._blocking(self._read_records, run_id)).sources
        return [s for s in found if artifact_name is None or s.artifact_name == artifact_name]

    async def lineage(self, run_id: str) -> Lineage:
        records = await self._blocking(self._read_records, run_id)
        return Lineage(run_id, parents=records.sources, descendants=records.descendants)

    async def run_ids(self, **kwargs: str) -> Iterable[str]:
        parent = kwargs.get("parent_run_id")
        if parent is not None:
            records = await self._blocking(self._read_records, parent)
            return list(dict.fromkeys(d.source_run_id for d in records.descendants))
        return await self._blocking(self._list_runs)

    async def metrics(self, run_id: str) -> Mapping[str, Sequence[TrackerMetric]]:
        return await self._blocking(self._read_metrics, run_id)

    def _read_records(self, run_id: str, suffix: str = ".json") -> _Records:
        """The run's side files whose names end with ``suffix`` (all of them by default;
        ``STATUS_SUFFIX``: its endings alone), merged."""
        side = os.path.join(self.logdir(run_id), SIDE_DIR)
        out = _Records()
        skipped: list[str] = []
        for name in _listdir(side, skipped):
            if not name.endswith(suffix) or name == RUN_FILE or name.startswith(TMP_PREFIX):
                continue
            path = os.path.join(side, name)
            try:
                with open(path, "rb") as f:
                    record = _parse_record(f.read())
            except FileNotFoundError:
                continue
            except (OSError, ValueError, TypeError, KeyError, RecursionError):
                skipped.append(path)
                continue
            _merge(out, record)
        _warn(skipped)
        return out

    def _list_runs(self) -> list[str]:
        ids: list[str] = []
        skipped: list[str] = []
        for top, dirs, _ in os.walk(self.root_dir, onerror=lambda e: skipped.append(str(e))):
            dirs.sort()
            if SIDE_DIR not in dirs:
                continue
            dirs.remove(SIDE_DIR)
            path = os.path.join(top, SIDE_DIR, RUN_FILE)
            try:
                with open(path, "rb") as f:
                    run_id = json.loads(f.read())["run_id"]
                if not isinstance(run_id, str):
                    raise TypeError("run_id is not a string")
            except FileNotFoundError:  # a parent's folder made by its children's edges
                continue
            except (OSError, ValueError, TypeError, KeyError, RecursionError):
                skipped.append(path)
                continue
            ids.append(run_id)
        _warn(skipped)
        return ids

    def _read_metrics(self, run_id: str) -> dict[str, list[TrackerMetric]]:
        logdir = self.logdir(run_id)
        skipped: list[str] = []
        files = sorted(n for n in _listdir(logdir, skipped) if "tfevents" in n)
        points: dict[str, list[TrackerMetric]] = {}
        scalar_tags: dict[str, bool] = {}
        seen: set[tuple[str, int]] = set()
        for name in files:
            path = os.path.join(logdir, name)
            try:
                _read_event_file(path, points, scalar_tags, seen)
            except FileNotFoundError:
                continue
            except (OSError, DecodeError, ValueError, TypeError, tf.errors.OpError):
                skipped.append(path)
        _warn(skipped)
        # Files in name order (a process's files by creation time), points in file order:
        # the stable sort keeps points of one step in the order they were logged.
        return {name: sort_points(p) for name, p in points.items()}


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what}: the text holds a lone surrogate, which TensorBoard cannot store"
        ) from None


@dataclass
class _Events:
    """A batch's event records, framed, and the state of the run once they are appended."""

    data: bytes
    start: float | None
    views: tuple[_Table, dict[str, TrackerArtifact], list[TrackerSource]]


def _first_time(state: _Run, batch: Batch) -> float | None:
    """The earliest of the run's start so far and the times the batch's records carry: its
    points' client times and its metadata calls' stamps (seconds since the epoch; a time
    of 0 or less is no time)."""
    times = [p.timestamp for p in batch.metrics if p.timestamp > 0]
    times += [ns / 1e9 for ns in batch.metadata_ns.values() if ns > 0]
    if state.start is not None:
        times.append(state.start)
    return min(times) if times else None


def _encode_events(state: _Run, batch: Batch) -> _Events:
    """Text tables of the run's metadata, artifacts and sources as this process wrote them
    (when the batch changes them), hparams, and a scalar per metric point not yet stored."""
    now = time.time()
    records: list[bytes] = []
    metadata, artifacts, sources = state.metadata, state.artifacts, state.sources
    start = _first_time(state, batch)
    try:
        if batch.metadata:
            shown, metadata = metadata.events(batch.metadata, now if start is None else start, now)
            records += shown
        if batch.artifacts:
            artifacts = {**artifacts, **batch.artifacts}
            rows = [[_cell(a.name), _cell(a.path), _cell(a.metadata)] for a in artifacts.values()]
            records.append(_text_event(ARTIFACTS_TAG, rows, now))
        if batch.sources:
            sources = [*sources, *(s for s in batch.sources if s not in sources)]
            rows = [[_cell(s.source_run_id), _cell(s.artifact_name)] for s in sources]
            records.append(_text_event(SOURCES_TAG, rows, now))
    except (ValueError, TypeError) as exc:
        raise RecordError(f"tensorboard cannot encode a text summary: {exc}") from exc
    if batch.metrics and "metrics" not in batch.done:
        # The batch's identity: its key, fixed before any write-ahead line, so that a replay
        # names the same batch; a batch without one (a direct call) gets a name of its own,
        # kept in batch.names for a retry of the same call.
        ident = batch.key or batch.names.setdefault("records", _new_name())
        records.append(_batch_event(ident, batch.metrics, now))
        records += _scalar_events(batch.metrics)
    return _Events(_framed(records), start, (metadata, artifacts, sources))


def _batch_event(ident: str, metrics: Sequence[TrackerMetric], wall_time: float) -> bytes:
    """The event that names the batch whose scalars follow it in the file (at step 0, as
    the run's text tables: a step of a point may be beyond what events hold): its identity
    and number of points as JSON, then the points' exact values, packed as little-endian
    float64s (``metrics()`` reads them; the scalars TensorBoard plots are float32)."""
    event = event_pb2.Event(wall_time=wall_time, step=0)
    value = event.summary.value.add(tag=BATCH_TAG)
    value.metadata.plugin_data.plugin_name = BATCH_PLUGIN
    value.tensor.dtype = types_pb2.DT_STRING
    value.tensor.string_val.append(_json({"batch": ident, "points": len(metrics)}))
    value.tensor.string_val.append(np.array([p.value for p in metrics], "<f8").tobytes())
    return bytes(event.SerializeToString())


@dataclass(frozen=True)
class _BatchInfo:
    """What a batch event says: the batch's identity, its number of points, and their exact
    values (None in a file written before the values travelled in the batch event)."""

    ident: str
    points: int
    exact: Sequence[float] | None


def _batch_of(value: Any) -> _BatchInfo | None:
    """What the batch event of ``value`` says, None for any other value."""
    if value.tag != BATCH_TAG or value.metadata.plugin_data.plugin_name != BATCH_PLUGIN:
        return None
    strings = value.tensor.string_val
    try:
        content = json.loads(strings[0])
        ident, points = content["batch"], content["points"]
    except (IndexError, ValueError, TypeError, KeyError, RecursionError):
        return None
    if not isinstance(ident, str) or type(points) is not int:
        return None
    exact = None
    if len(strings) > 1 and len(strings[1]) == 8 * points:
        exact = np.frombuffer(strings[1], "<f8").tolist()
    return _BatchInfo(ident, points, exact)


def _as_float32(value: float) -> float:
    """``value`` as a float32 field holds it (beyond float32's range: an infinity)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _scalar_events(metrics: Sequence[TrackerMetric]) -> list[bytes]:
    """One event per point, as torch's and tensorboardX's ``SummaryWriter`` write them: a
    ``simple_value`` (float32), its step and the client's time. Both of TensorBoard's
    readers show these: the classic ``EventAccumulator.Scalars`` and the plugin reader
    behind the Scalars tab. The exact float64 is in the batch event before them."""
    records = []
    for point in metrics:
        try:
            event = event_pb2.Event(wall_time=point.timestamp, step=point.step)
            event.summary.value.add(tag=point.name, simple_value=point.value)
            records.append(event.SerializeToString())
        except (ValueError, TypeError) as exc:  # a step beyond 64 bits, a lone surrogate
            raise RecordError(
                f"tensorboard cannot store metric {point.name!r} at step {point.step}: {exc}"
            ) from exc
    return records


def _read_event_file(
    path: str,
    points: dict[str, list[TrackerMetric]],
    scalar_tags: dict[str, bool],
    seen: set[tuple[str, int]],
) -> None:
    """Adds the scalars of one event file: ours (a ``simple_value``, made exact by the
    float64 its batch event holds; in older files, the ``double_val`` of a float tensor),
    and those of other writers (``simple_value``, one-element tensors) in the same folder.

    A point that follows a batch event is the batch's n-th: ``(batch, n)`` in ``seen`` means
    a replay of the batch stored it already (in this file or an earlier one), and it is
    skipped. Every other point is kept, however alike another.

    TensorBoard's loader ends a file quietly at its first record that does not read (a
    torn last record is how a live file ends), so a file of which no record reads at all,
    though not empty, is not an event file: ``ValueError``, for the caller to name it."""
    batch: _BatchInfo | None = None
    index = left = 0
    records = 0
    for raw in RawEventFileLoader(path).Load():
        records += 1
        event = event_pb2.Event.FromString(raw)
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            tag = value.tag
            found = _batch_of(value)
            if found is not None:
                batch, left, index = found, found.points, 0
                continue
            if value.HasField("metadata") and tag not in scalar_tags:
                scalar_tags[tag] = value.metadata.plugin_data.plugin_name == _SCALAR_PLUGIN
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                number = float(value.simple_value)
            elif kind == "tensor" and scalar_tags.get(tag):
                tensor = value.tensor
                if len(tensor.double_val) == 1:
                    number = tensor.double_val[0]
                else:
                    array = tensor_util.make_ndarray(tensor)
                    if array.size != 1:
                        continue
                    number = float(array.reshape(()))
            else:
                continue
            if left > 0:
                assert batch is not None
                if batch.exact is not None and kind == "simple_value":
                    # The exact float64 the batch event holds for this point; the float32
                    # beside it must be its rounding (else the point is not the one the
                    # batch event counted, and its float32 is all there is).
                    exact = batch.exact[index]
                    if _same(_as_float32(exact), number):
                        number = exact
                ident = (batch.ident, index)
                index, left = index + 1, left - 1
                if ident in seen:
                    continue
                seen.add(ident)
            metric = TrackerMetric(tag, number, int(event.step), float(event.wall_time))
            points.setdefault(tag, []).append(metric)
    if not records and os.path.getsize(path):
        raise ValueError("no event record reads: not an event file")


def _parse_record(data: bytes) -> _Records:
    """One side file, whole or not at all (TypeError, ValueError, KeyError)."""
    entry = json.loads(data)
    if not isinstance(entry, dict):
        raise TypeError("a side file holds a JSON object")
    out = _Records()
    metadata = entry.get("metadata", {})
    if not isinstance(metadata, dict):
        raise TypeError("metadata is not an object")
    out.metadata = metadata
    for a in entry.get("artifacts", ()):
        meta = a.get("metadata") if isinstance(a, dict) else None
        if meta is not None and not isinstance(meta, dict):
            raise TypeError("artifact metadata is not an object")
        out.artifacts[str(a["name"])] = TrackerArtifact(str(a["name"]), str(a["path"]), meta)
    for key, into in (("sources", out.sources), ("descendants", out.descendants)):
        for run, artifact in entry.get(key, ()):
            into.append(TrackerSource(str(run), None if artifact is None else str(artifact)))
    status, ended = entry.get("status"), entry.get("time")
    if status is not None:
        out.status = str(status)
        out.ended = None if ended is None else float(ended)
    return out


def _merge(out: _Records, record: _Records) -> None:
    """Adds a later side file: its metadata keys and artifact names win, edges are kept
    once, in the order first written."""
    out.metadata.update(record.metadata)
    out.artifacts.update(record.artifacts)
    for into, edges in ((out.sources, record.sources), (out.descendants, record.descendants)):
        into.extend(e for e in edges if e not in into)
    if record.status:
        out.status, out.ended = record.status, record.ended


def _holds_run(folder: str) -> bool:
    """Whether a run's folder is ``folder`` or under it (it has ``.async_tracker/run.json``)."""
    return any(
        SIDE_DIR in dirs and os.path.exists(os.path.join(top, SIDE_DIR, RUN_FILE))
        for top, dirs, _ in os.walk(folder)
    )


def _listdir(path: str, skipped: list[str]) -> list[str]:
    """The names in a folder, sorted; [] when it does not exist (a run never written)."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        skipped.append(path)
        return []


def _warn(skipped: list[str]) -> None:
    if skipped:
        logger.warning(
            "async_tracker: skipped %d entries that are not tracker records: %s",
            len(skipped),
            ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""),
        )


def _put(path: str, data: bytes) -> None:
    """Writes a small file atomically: a temporary name in the same folder, then a rename."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, TMP_PREFIX + secrets.token_hex(8))
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _new_event_file(logdir: str) -> str:
    """Creates an event file named as TensorBoard's writers name theirs, holding the
    file-version event TensorBoard reads first."""
    header = event_pb2.Event(wall_time=time.time(), file_version=FILE_VERSION)
    data = _framed([header.SerializeToString()])
    host = socket.gethostname().replace("/", "_") or "localhost"
    while True:
        name = f"events.out.tfevents.{int(time.time()):010d}.{host}.{os.getpid()}.{next(_files)}"
        path = os.path.join(logdir, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:  # another process with our pid and host (a container)
            continue
        try:
            os.write(fd, data)
        except BaseException:
            with contextlib.suppress(OSError):  # no empty file per failed attempt
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        return path


def _append_error(exc: OSError, path: str) -> BackendError:
    what = f"append to {path}"
    if exc.errno == errno.EFBIG:
        # The file hit a size limit, not the record: the retry goes to a new file.
        return TransientBackendError(
            f"tensorboard {what} failed: {exc}; the next attempt starts a new event file"
        )
    return map_error(exc, what)


class TensorBoardReader(GenericReader):
    """:class:`~async_tracker.store.reader.GenericReader` over a TensorBoard log directory,
    with each run's ending and the time it ended as its end record stored them."""

    backend: AsyncTensorBoardTracker

    def __init__(self, backend: AsyncTensorBoardTracker) -> None:
        super().__init__(backend, f"tensorboard {backend.root_dir}")

    async def status(self, run_id: str) -> tuple[str, float | None]:
        records = await self.backend._blocking(
            self.backend._read_records, run_id, STATUS_SUFFIX
        )
        if records.status is None:
            return "running", None
        return records.status, records.ended


class TensorBoardTracker(SyncTracker):
    """The blocking face of :class:`AsyncTensorBoardTracker` (a ``TrackerBase``)."""

    def __init__(self, root_dir: str | os.PathLike[str]) -> None:
        super().__init__(AsyncTensorBoardTracker(root_dir))

    def __repr__(self) -> str:
        tracker = self.async_tracker
        assert isinstance(tracker, AsyncTensorBoardTracker)
        return f"<TensorBoardTracker: root_path={tracker.root_dir}>"


# -- the factory -------------------------------------------------------------------------------

CONFIG_KEYS = frozenset({"root_path"})


def read_config(config_file: str) -> dict[str, str]:
    """``key=value`` lines (``#`` comments), as torchx's tracker configs. Values are never
    put in messages."""
    try:
        with open(os.path.expanduser(config_file), encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as exc:
        raise TrackerConfigError(f"cannot read tracker config {config_file!r}: {exc}") from exc
    config: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            raise TrackerConfigError(f"{config_file}, line {lineno}: expected key=value")
        config[key.strip()] = value.strip()
    return config


ENV_DEFAULT_ROOT = "ASYNC_TRACKER_TENSORBOARD_DIR"
DEFAULT_ROOT = "./tensorboard_runs"


def create(config: str | None) -> TensorBoardTracker:
    """The ``tensorboard`` factory: ``config`` is a file of ``key=value`` lines with
    ``root_path`` (a local folder, created on the first write); without one, the folder is
    ``$ASYNC_TRACKER_TENSORBOARD_DIR``, else ``./tensorboard_runs``::

        TORCHX_TRACKERS=tensorboard
        TORCHX_TRACKER_TENSORBOARD_CONFIG=/path/to/tensorboard.cfg   # root_path=/data/tb
    """
    if not config:
        # No config (TORCHX_TRACKERS=tensorboard alone, init(backends=["tensorboard"])):
        # $ASYNC_TRACKER_TENSORBOARD_DIR, else ./tensorboard_runs, for tensorboard --logdir.
        return TensorBoardTracker(os.environ.get(ENV_DEFAULT_ROOT) or DEFAULT_ROOT)
    values = read_config(config)
    unknown = sorted(set(values) - CONFIG_KEYS)
    if unknown:
        raise TrackerConfigError(
            f"tracker config {config!r}: unknown keys {unknown} (known: {sorted(CONFIG_KEYS)})"
        )
    root = values.get("root_path")
    if not root:
        raise TrackerConfigError(f"tracker config {config!r} lacks 'root_path'")
    if "://" in root and not root.startswith("file://"):
        raise TrackerConfigError(
            f"tracker config {config!r}: root_path must be a local folder (file:// or a path)"
        )
    return TensorBoardTracker(root)
