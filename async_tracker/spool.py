"""The spool: batches that wait on local disk instead of in memory.

A lane spools when its backend stays down past the retry budget, when it holds more than
``max_buffered`` records, when ``close()`` reaches its deadline, and (``durable=True``) always,
before delivery. Batches come back in order as soon as the backend is healthy, on the next
start with the same spool directory, or through ``async-tracker sync``.

Layout: ``<spool_dir>/<base32(run_id)>/<backend name>/``, holding

* ``<time_ns>-<owner>.seg``: append-only segments, one batch per line, each line
  ``<crc32 in hex> <JSON>``; a damaged line (a torn write, a flipped bit) is skipped with a
  warning and the rest of the segment is read;
* ``<owner>.lock``: held (``flock``) by the live process that owns the segments named after
  it. A segment whose owner's lock can be taken belongs to a dead process: it is adopted and
  replayed. Two ranks sharing a spool directory never replay each other's live segments.

A segment is deleted once every batch in it is delivered: that is the "delivered" mark, and a
replay cut short by a crash only re-sends batches under the object names they already had
(``Batch.names``), which backends overwrite.

File I/O runs through aiofiles, never on the tracker loop itself, in daemon threads of our
own: aiofiles' default (asyncio's executor) cannot start threads once the interpreter is
exiting, which is exactly when ``close()`` may need to spool, and a disk that hangs must not
keep the process alive.
"""

from __future__ import annotations

import asyncio
import binascii
import concurrent.futures
import fcntl
import json
import logging
import operator
import os
import re
import secrets
import threading
import time
import zlib
from array import array
from base64 import b32decode, b32encode, b64decode, b64encode
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiofiles
import anyio

from async_tracker.records import Batch, TrackerArtifact, TrackerMetric, TrackerSource

logger = logging.getLogger(__name__)


class _DaemonExecutor(concurrent.futures.Executor):
    """Runs each call in a new daemon thread (spool calls are few: one per batch or segment)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=work, name="async-tracker-spool", daemon=True).start()
        return future


_EXECUTOR = _DaemonExecutor()


async def _io(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, fn, *args)

T = TypeVar("T")

SEGMENT_SUFFIX = ".seg"
ENV_SPOOL_DIR = "ASYNC_TRACKER_SPOOL_DIR"


def default_spool_dir() -> Path:
    """``$ASYNC_TRACKER_SPOOL_DIR``, else ``$XDG_CACHE_HOME/async_tracker/spool``, else
    ``~/.cache/async_tracker/spool``."""
    if os.environ.get(ENV_SPOOL_DIR):
        return Path(os.environ[ENV_SPOOL_DIR])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "async_tracker" / "spool"


def backend_dir_name(backend: str) -> str:
    """A file-system-safe, stable directory name for a backend name."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", backend)
    return safe or "_"


def run_dir_name(run_id: str) -> str:
    return b32encode(run_id.encode("utf-8")).decode("ascii")


# -- encoding ---------------------------------------------------------------------------------


def _encode_metrics(metrics: list[TrackerMetric]) -> list[object]:
    """Metrics as a name table and base64 columns of machine numbers: C loops only, several
    times faster than JSON numbers (spooling must keep pace with a stalled backend's load)."""
    if not metrics:
        return [[], "", "", "", ""]
    names = list(map(_NAME, metrics))
    table = list(dict.fromkeys(names))
    index = {n: i for i, n in enumerate(table)}
    steps: object
    try:
        steps = array("q", map(_STEP, metrics))
    except OverflowError:  # a step beyond int64: such a column stays a JSON list
        steps = list(map(_STEP, metrics))
    return columns(
        table,
        array("I", map(index.__getitem__, names)),
        array("d", map(_VALUE, metrics)),
        steps,
        array("d", map(_TIME, metrics)),
    )


def columns(table: list[str], *cols: object) -> list[object]:
    """The spooled form of metric columns: arrays as base64 of their bytes."""
    return [table, *(_b64(c) if isinstance(c, array) else c for c in cols)]


def _b64(a: array[Any]) -> str:
    return b64encode(a.tobytes()).decode("ascii")


def _decode_metrics(cols: list[Any]) -> list[TrackerMetric]:
    table, *data = cols
    arrays: list[Any] = []
    for code, col in zip("Idqd", data):
        if isinstance(col, list):
            arrays.append(col)
            continue
        a = array(code)
        a.frombytes(b64decode(col))
        arrays.append(a)
    if not len(arrays[0]) == len(arrays[1]) == len(arrays[2]) == len(arrays[3]):
        raise ValueError("metric columns differ in length")
    return [
        _new_metric(TrackerMetric, (table[i], v, s, t))
        for i, v, s, t in zip(*arrays)
    ]


_new_metric = tuple.__new__
_NAME, _VALUE, _STEP, _TIME = (operator.itemgetter(i) for i in range(4))


def encode_batch(batch: Batch, metrics: list[object] | None = None) -> bytes:
    """One line: crc32 of the JSON, a space, the JSON (metrics as columns), a newline.
    ``metrics``, if given, are the batch's metrics already as :func:`columns`."""
    body = {
        "seq": batch.seq,
        "records": batch.records,
        "metadata": batch.metadata,
        "artifacts": [[a.name, a.path, a.metadata] for a in batch.artifacts.values()],
        "sources": [[s.source_run_id, s.artifact_name] for s in batch.sources],
        "metrics": _encode_metrics(batch.metrics) if metrics is None else metrics,
        "names": batch.names,
        "done": sorted(batch.done),
    }
    data = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return b"%08x %s\n" % (zlib.crc32(data), data)


@dataclass
class Encoded:
    """A batch already encoded as a spool line: the overflow's chunks, encoded once for
    every lane."""

    line: bytes
    records: int


def decode_batch(line: bytes) -> Batch:
    """The batch of one line; ValueError if the line is damaged."""
    crc, sep, data = line.rstrip(b"\n").partition(b" ")
    if not sep or len(crc) != 8 or int(crc, 16) != zlib.crc32(data):
        raise ValueError("checksum mismatch")
    body = json.loads(data)
    return Batch(
        seq=int(body["seq"]),
        metadata=dict(body["metadata"]),
        artifacts={a[0]: TrackerArtifact(a[0], a[1], a[2]) for a in body["artifacts"]},
        sources=[TrackerSource(s[0], s[1]) for s in body["sources"]],
        metrics=_decode_metrics(body["metrics"]),
        records=int(body["records"]),
        done=set(body["done"]),
        names=dict(body["names"]),
    )


def read_segment_bytes(data: bytes, where: str) -> list[Batch]:
    """Every intact batch of a segment, in order; damaged lines are skipped with a warning."""
    batches: list[Batch] = []
    damaged = 0
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            batches.append(decode_batch(line))
        except (ValueError, KeyError, TypeError, IndexError, binascii.Error):
            damaged += 1
    if damaged:
        logger.warning(
            "async_tracker: spool segment %s: skipped %d damaged records, kept %d",
            where, damaged, len(batches),
        )
    return batches


# -- ownership --------------------------------------------------------------------------------


class _Owner:
    """This process's spool identity: a token and the lock files that prove it is alive.
    A forked child gets a new token (its parent's locks are not its own)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.token = f"{os.getpid():x}{secrets.token_hex(4)}"
        self.locks: dict[Path, int] = {}  # directory -> fd of the lock file we hold

    def hold(self, directory: Path, token: str) -> bool:
        """Takes the lock of ``token`` in ``directory`` (ours, or a dead owner's). False if
        a live process holds it."""
        path = directory / f"{token}.lock"
        if path in self.locks:
            return True
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.locks[path] = fd
        return True

    def release(self, directory: Path, token: str) -> None:
        path = directory / f"{token}.lock"
        fd = self.locks.pop(path, None)
        if fd is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            os.close(fd)


_owner = _Owner()


def _token_of(segment: Path) -> str:
    return segment.name[: -len(SEGMENT_SUFFIX)].split("-", 1)[1]


def is_adopted(segment: Path) -> bool:
    """True for a segment an earlier (dead) process wrote."""
    return _token_of(segment) != _owner.token


def has_spool(spool_dir: str | Path, run_id: str) -> bool:
    """Whether an earlier process left segments of this run (a cheap check, no lock)."""
    run_dir = Path(spool_dir) / run_dir_name(run_id)
    return run_dir.is_dir() and any(run_dir.glob(f"*/*{SEGMENT_SUFFIX}"))


class Spool:
    """The segments of one (run, backend) in one directory.

    ``append`` adds batches to the open segment; ``take`` seals it and returns every segment
    this process may replay (its own and those of dead processes), oldest first.
    """

    def __init__(
        self, spool_dir: Path, run_id: str, backend: str, segment_records: int = 100_000
    ) -> None:
        self.dir = Path(spool_dir) / run_dir_name(run_id) / backend_dir_name(backend)
        # A segment is sealed once it holds this many records: replay reads a whole segment
        # into memory, so this bounds the memory a replay takes.
        self.segment_records = segment_records
        self._current: Path | None = None
        self._file: Any = None  # aiofiles' handle of the open segment
        self._current_records = 0
        self._lock_obj: anyio.Lock | None = None

    @property
    def _lock(self) -> anyio.Lock:
        # Created on first use, on the loop (anyio ties locks to a running loop).
        if self._lock_obj is None:
            self._lock_obj = anyio.Lock()
        return self._lock_obj

    @property
    def path(self) -> str:
        return str(self.dir)

    def _new_segment(self) -> Path:
        return self.dir / f"{time.time_ns()}-{_owner.token}{SEGMENT_SUFFIX}"

    async def append(
        self, batches: Sequence[Batch | Encoded], new_segment: bool = False
    ) -> Path:
        """Appends batches to the open segment (created on first use, when the open one is
        full, or now if ``new_segment``, which also seals it) and returns the segment's path."""
        data = b"".join(b.line if isinstance(b, Encoded) else encode_batch(b) for b in batches)
        async with self._lock:
            if (
                self._file is None
                or new_segment
                or self._current_records >= self.segment_records
            ):
                await self._seal()
                await _io(self._prepare)
                segment = self._new_segment()
                # Unbuffered and kept open until sealed: one worker-thread hop per append.
                # Each hop waits for the GIL, and a training loop that only logs holds it
                # for 5 ms at a time, so hops, not bytes, set the pace of the spool.
                self._file = await aiofiles.open(segment, "ab", buffering=0, executor=_EXECUTOR)
                self._current = segment
                self._current_records = 0
            assert self._file is not None and self._current is not None
            segment = self._current
            self._current_records += sum(b.records for b in batches)
            try:
                # Straight to the OS, which keeps it through a SIGKILL of this process.
                view = memoryview(data)
                while view:
                    written = await self._file.write(view)
                    view = view[written:]
            except BaseException:
                # A write that failed or was cancelled may have left a torn line: the next
                # append must not run into it, so it starts a new segment. Shielded: the
                # handle must be closed even when we are cancelled.
                with anyio.CancelScope(shield=True):
                    await self._seal()
                raise
            if new_segment:
                await self._seal()
        return segment

    async def _seal(self) -> None:
        """Closes the open segment: later appends go to a new one."""
        f, self._file, self._current = self._file, None, None
        if f is not None:
            await f.close()

    def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _owner.hold(self.dir, _owner.token)

    async def take(self) -> list[Path]:
        """Seals the open segment and lists the segments to replay: ours, and those whose
        owner is dead (adopted: their lock is now ours), oldest first."""
        async with self._lock:
            await self._seal()
        return await _io(self._replayable)

    def _replayable(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        segments = sorted(p for p in self.dir.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        return [
            s for s in segments
            if _token_of(s) == _owner.token or _owner.hold(self.dir, _token_of(s))
        ]

    async def read(self, segment: Path) -> list[Batch]:
        f = await aiofiles.open(segment, "rb", executor=_EXECUTOR)
        try:
            data = await f.read()
        finally:
            await f.close()
        return read_segment_bytes(data, str(segment))

    async def delivered(self, segment: Path) -> None:
        """Marks a segment delivered by removing it; a dead owner's lock goes with its last
        segment."""
        await _io(self._remove, segment)

    def _remove(self, segment: Path) -> None:
        segment.unlink(missing_ok=True)
        token = _token_of(segment)
        if token != _owner.token and not any(self.dir.glob(f"*-{token}{SEGMENT_SUFFIX}")):
            _owner.release(self.dir, token)



def spooled_runs(spool_dir: Path) -> list[tuple[str, str, Path]]:
    """``(run_id, backend_dir, path)`` of every (run, backend) directory holding segments."""
    out: list[tuple[str, str, Path]] = []
    if not spool_dir.is_dir():
        return out
    for run_dir in sorted(spool_dir.iterdir()):
        try:
            run_id = b32decode(run_dir.name).decode("utf-8")
        except ValueError:
            continue
        for backend_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
            if any(p.suffix == SEGMENT_SUFFIX for p in backend_dir.iterdir()):
                out.append((run_id, backend_dir.name, backend_dir))
    return out
