"""The spool files of one (run, backend): segments, acks, locks and quarantine.

Layout: ``<spool_dir>/<base32(run_id)>/<backend name>/``, holding

* ``<token>-<first>-<seq>-<records>-<n>.seg``: a segment, written once (a temporary name,
  then a rename: never torn), holding consecutive batches of one pipeline, one per line
  (:mod:`async_tracker.spool.codec`). ``first`` and ``seq`` are the sequence numbers of its
  first and last record, ``records`` how many records it holds, ``n`` counts the pipeline's
  writes. Tokens start with the time their pipeline started: pipelines replay oldest first,
  and each one's segments in the order of ``first`` (call order).
* ``<token>.ack``: the pipeline's high-water mark, the ``seq`` of the last batch delivered
  from disk (written to a temporary name, then renamed). A replay skips batches at or below
  it; only segments wholly at or below it are deleted.
* ``<token>.lock``: held while the pipeline lives (:mod:`async_tracker.spool.owner`).
* ``quarantine/``: files found here that are not ours (or that cannot be read), moved aside
  with a warning instead of stopping anything.

Every file operation runs through :mod:`async_tracker.spool.io`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import shutil
import threading
import time
from base64 import b32decode, b32encode
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from async_tracker.records import Batch
from async_tracker.spool.codec import encode_batch, read_segment_bytes
from async_tracker.spool.io import SpoolIO
from async_tracker.spool.owner import locks

logger = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
QUARANTINE = "quarantine"
ENV_SPOOL_DIR = "ASYNC_TRACKER_SPOOL_DIR"
# A run directory is named by the base32 of the id, and file names are limited to 255 bytes.
MAX_RUN_ID_BYTES = 155

_TOKEN = r"(?P<token>\d{19}x[0-9a-f]+)"
_SEGMENT = re.compile(
    rf"^{_TOKEN}-(?P<first>\d+)-(?P<seq>\d+)-(?P<records>\d+)-(?P<n>\d+)\.seg$"
)
_ACK = re.compile(rf"^{_TOKEN}\.ack$")
_LOCK = re.compile(rf"^{_TOKEN}\.lock$")
_TMP = re.compile(rf"^\.{_TOKEN}\..*\.tmp$")


def default_spool_dir() -> Path:
    """``$ASYNC_TRACKER_SPOOL_DIR``, else the user's cache directory (``platformdirs``:
    ``~/.cache/async_tracker/spool`` on Linux, honouring ``XDG_CACHE_HOME``): one per user,
    never a folder every user of the machine shares. Each run spools in a folder of its own
    under it."""
    if os.environ.get(ENV_SPOOL_DIR):
        return Path(os.environ[ENV_SPOOL_DIR])
    return Path(platformdirs.user_cache_dir("async_tracker", appauthor=False)) / "spool"


def backend_dir_name(backend: str) -> str:
    """A file-system-safe, stable directory name for a backend name."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", backend)[:100]
    return safe if safe.strip(".") else "_"


def run_dir_name(run_id: str) -> str:
    return b32encode(run_id.encode("utf-8")).decode("ascii")


def check_run_id(run_id: str) -> None:
    """ValueError naming the id if the spool (and torchx's layout) cannot store it."""
    if "\x00" in run_id:
        raise ValueError(f"run id {run_id!r} holds a NUL character")
    try:
        size = len(run_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"run id {run_id!r} is not valid text: {exc.reason}") from None
    if size > MAX_RUN_ID_BYTES:
        raise ValueError(
            f"run id {run_id[:40]!r}... is {size} bytes long; at most {MAX_RUN_ID_BYTES} fit a "
            "directory name"
        )


def new_token(now_ns: int | None = None) -> str:
    """A pipeline's token: its start time (so that names sort oldest pipeline first), then
    the pid and random bits (unique across processes and hosts)."""
    stamp = time.time_ns() if now_ns is None else now_ns
    return f"{stamp:019d}x{os.getpid():x}{os.urandom(4).hex()}"


@dataclass(frozen=True)
class Segment:
    """A segment file, described by its name."""

    path: Path
    token: str
    first: int
    seq: int
    records: int
    n: int = 0

    def order(self) -> tuple[int, int, int]:
        return (self.first, self.seq, self.n)


def parse_segment(path: Path) -> Segment | None:
    m = _SEGMENT.match(path.name)
    if m is None:
        return None
    return Segment(
        path, m["token"], int(m["first"]), int(m["seq"]), int(m["records"]), int(m["n"])
    )


class Abandoned(Exception):
    """A segment write given up before its commit point: its file never appears."""


class Commit:
    """The one moment a segment write takes effect, decided between two threads.

    The spool thread writes a segment to a temporary name, then renames it: the rename makes
    the records appear on disk. Whoever waits for the write (the tracker loop; a ``close()``
    whose caller stopped waiting for a stuck loop) may give it up until then. Both sides ask
    here, under a lock held for the decision alone, never across the rename (a disk that
    hangs must not hang the side giving up): :meth:`commit` just before the rename,
    :meth:`abandon` to give up. Exactly one of them wins, so whoever counts the records knows
    where they are: on disk (committed) or still in memory only (abandoned, and the spool
    thread removes its temporary file instead). Once committed, :meth:`apply` is won exactly
    once, by the side that moves the records to the disk's count.
    """

    OPEN, COMMITTED, ABANDONED = "open", "committed", "abandoned"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = self.OPEN
        self._applied = False

    def commit(self) -> bool:
        """The spool thread, before the rename: True if the write may take effect."""
        with self._lock:
            if self.state == self.OPEN:
                self.state = self.COMMITTED
            return self.state == self.COMMITTED

    def abandon(self) -> bool:
        """Gives the write up: True if it will never take effect, False if it did (or is
        taking effect: the rename after a commit is not undone)."""
        with self._lock:
            if self.state == self.OPEN:
                self.state = self.ABANDONED
            return self.state == self.ABANDONED

    def apply(self) -> bool:
        """True once, for the first side that accounts for a committed write."""
        with self._lock:
            if self.state != self.COMMITTED or self._applied:
                return False
            self._applied = True
            return True


@dataclass
class Adopted:
    """What a dead pipeline left: its segments (in order) and its ack. ``acked`` holds, for a
    segment that the ack falls inside (its first lines delivered, the others not), the
    records of its lines at or below the ack: they are not left to deliver, and must not be
    counted again (its pipeline counted them delivered)."""

    token: str
    segments: list[Segment]
    ack: int
    acked: dict[Path, int] = field(default_factory=dict)


class Spool:
    """The spool of one (run, backend) for one pipeline, which owns ``token``."""

    def __init__(
        self, spool_dir: Path, run_id: str, backend: str, io: SpoolIO, token: str
    ) -> None:
        self.dir = Path(spool_dir) / run_dir_name(run_id) / backend_dir_name(backend)
        self.io = io
        self.token = token
        self._lock_path = self.dir / f"{token}.lock"
        self._locked = False  # our lock, taken at our first write here
        self._writes = 0

    @property
    def path(self) -> str:
        return str(self.dir)

    # -- writing --------------------------------------------------------------------------------
    def segment_for(self, batches: Sequence[Batch]) -> Segment:
        """The segment a write of ``batches`` (consecutive, in order) makes: named before
        the write, so that whoever gives the write up knows which file it would have been."""
        first, seq = batches[0].first, batches[-1].seq
        records = sum(b.records for b in batches)
        self._writes += 1
        name = f"{self.token}-{first}-{seq}-{records}-{self._writes}{SEGMENT_SUFFIX}"
        return Segment(self.dir / name, self.token, first, seq, records, self._writes)

    async def write(
        self,
        batches: Sequence[Batch],
        commit: Commit | None = None,
        segment: Segment | None = None,
    ) -> Segment:
        """A new segment holding ``batches`` (consecutive, in order). With ``commit``, the
        write takes effect only if the spool thread commits it before it is abandoned (see
        :class:`Commit`); an abandoned write raises :class:`Abandoned`."""
        data = b"".join(encode_batch(b) for b in batches)  # on the loop: batches are its
        segment = segment or self.segment_for(batches)
        await self.io.run(self._write_file, segment.path, data, commit)
        return segment

    def _write_file(self, path: Path, data: bytes, commit: Commit | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._locked:  # ours from the first write on (the token is ours alone)
            self._locked = locks.take(self._lock_path)
        tmp = self.dir / f".{self.token}.{path.name}.tmp"
        # No fsync: the page cache survives a SIGKILL of this process, which is the crash the
        # spool is for; surviving a power loss would cost a disk flush per batch.
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            if commit is not None and not commit.commit():
                raise Abandoned(str(path))  # given up: the file must never appear
            os.replace(tmp, path)
        except BaseException:
            # A full disk (ENOSPC) fails the write or the close half-way: the partial file
            # holds records the caller keeps in memory, and would sit there until a next
            # start adopted this token (a clean close leaves nothing behind).
            _unlink_quietly(tmp)
            raise

    async def ack(self, token: str, seq: int) -> None:
        """Persists ``token``'s high-water mark."""
        await self.io.run(self._write_ack, token, seq)

    def _write_ack(self, token: str, seq: int) -> None:
        tmp = self.dir / f".{token}.ack.tmp"
        try:
            tmp.write_text(str(seq))
            os.replace(tmp, self.dir / f"{token}.ack")
        except BaseException:
            _unlink_quietly(tmp)  # as for a segment: nothing half-written stays
            raise

    async def remove(self, segment: Segment) -> None:
        await self.io.run(_unlink, segment.path)

    async def forget(self, token: str) -> None:
        """Removes what is left of ``token`` once all its segments are gone: its ack and its
        lock file (ours at a clean close, or a dead pipeline's after its replay)."""
        await self.io.run(self._forget, token)

    def release(self, tokens: Sequence[str]) -> concurrent.futures.Future[None]:
        """:meth:`forget` for each of ``tokens``, handed to the spool thread as one job that
        no waiter cancels: at a close's end, whose deadline may pass before it runs. Nothing
        is lost by not waiting for it: the spool thread runs its jobs in order, so every later
        adoption of this process (a run reopened with the same id) finds the locks released
        and takes the files over. The future says when it ran."""
        return self.io.post(self._forget_all, list(tokens))

    def _forget_all(self, tokens: list[str]) -> None:
        for token in tokens:
            self._forget(token)

    def _forget(self, token: str) -> None:
        if not any(self.dir.glob(f"{token}-*{SEGMENT_SUFFIX}")):
            _unlink(self.dir / f"{token}.ack")
        locks.drop(self.dir / f"{token}.lock")

    # -- reading --------------------------------------------------------------------------------
    async def read(self, segment: Segment) -> tuple[list[Batch | None], int] | None:
        """The lines of a segment as batches (None for a damaged line) and how many were
        damaged; None if the file cannot be read at all (it is then moved to quarantine)."""
        try:
            data = await self.io.run(segment.path.read_bytes)
        except FileNotFoundError:
            logger.warning("async_tracker: spool segment %s vanished", segment.path)
            return None
        except OSError as exc:
            logger.warning("async_tracker: cannot read spool segment %s: %s", segment.path, exc)
            await self.io.run(self._quarantine, segment.path)
            return None
        batches, damaged = read_segment_bytes(data)
        if damaged == len(batches):
            # Not one readable line: not ours (or ruined); keep it aside for a person to see.
            await self.io.run(self._quarantine, segment.path)
            return None
        if damaged:
            logger.warning(
                "async_tracker: spool segment %s: skipped %d damaged lines of %d",
                segment.path, damaged, len(batches),
            )
        return batches, damaged

    async def adopt(self) -> list[Adopted]:
        """Takes over what dead pipelines left here, oldest first; moves foreign files to
        quarantine and removes dead pipelines' unfinished temporary files."""
        return await self.io.run(self._adopt)

    def _adopt(self) -> list[Adopted]:
        try:
            entries = sorted(os.listdir(self.dir))
        except (FileNotFoundError, NotADirectoryError):
            return []
        segments: dict[str, list[Segment]] = {}
        tokens: set[str] = set()
        for name in entries:
            path = self.dir / name
            if name == QUARANTINE:
                continue
            if (seg := parse_segment(path)) is not None and path.is_file():
                segments.setdefault(seg.token, []).append(seg)
                tokens.add(seg.token)
            elif (m := _ACK.match(name) or _LOCK.match(name) or _TMP.match(name)) is not None:
                tokens.add(m["token"])
            else:
                self._quarantine(path)
        adopted: list[Adopted] = []
        for token in sorted(tokens):
            if token == self.token or not locks.take(self.dir / f"{token}.lock"):
                continue  # ours, or a live pipeline's (another rank, another run object)
            for tmp in self.dir.glob(f".{token}.*.tmp"):
                _unlink(tmp)  # a write the dead pipeline never finished
            ack = self._read_ack(token)
            mine = sorted(segments.get(token, []), key=Segment.order)
            done = [s for s in mine if s.seq <= ack]
            for s in done:
                _unlink(s.path)
            left = [s for s in mine if s.seq > ack]
            if left:
                acked = {s.path: self._acked_records(s, ack) for s in left if s.first <= ack}
                adopted.append(Adopted(token, left, ack, acked))
            else:
                self._forget(token)
        return adopted

    def _acked_records(self, segment: Segment, ack: int) -> int:
        """The records of ``segment``'s readable lines at or below ``ack`` (0 if it cannot be
        read now: its replay then finds out what it holds)."""
        try:
            batches, _ = read_segment_bytes(segment.path.read_bytes())
        except OSError:
            return 0
        return sum(b.records for b in batches if b is not None and b.seq <= ack)

    def _read_ack(self, token: str) -> int:
        path = self.dir / f"{token}.ack"
        try:
            return int(path.read_text().strip())
        except FileNotFoundError:
            return -1
        except (OSError, ValueError):
            # Unreadable: replay everything of that token (a duplicate at worst, never a loss).
            self._quarantine(path)
            return -1

    def _quarantine(self, path: Path) -> None:
        target_dir = self.dir / QUARANTINE
        try:
            target_dir.mkdir(exist_ok=True)
            target = target_dir / f"{time.time_ns()}-{path.name}"
            os.replace(path, target)
        except OSError as exc:
            logger.warning("async_tracker: cannot move %s aside: %s", path, exc)
            return
        logger.warning(
            "async_tracker: spool: %s is not a readable spool file; moved to %s", path, target
        )


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def _unlink_quietly(path: Path) -> None:
    """Removes a temporary file after a failed write; the write's own error is the one to
    report, so a failure here (the directory gone, say) is ignored."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def has_spool(spool_dir: str | Path, run_id: str) -> bool:
    """Whether segments of this run wait in the spool (a cheap check, no lock)."""
    run_dir = Path(spool_dir) / run_dir_name(run_id)
    try:
        return any(run_dir.glob(f"*/*{SEGMENT_SUFFIX}"))
    except OSError:
        return False


def spooled_last_steps(spool_dir: str | Path, run_id: str) -> dict[str, int]:
    """The last step of each metric in this run's segments under ``spool_dir``, whatever
    the backend: what a resumed run still has on this machine, not yet stored (a dead
    process's spool waiting for its replay). Reads only, takes no lock and moves nothing
    (the replay does that); a segment that cannot be read, or a damaged line, is skipped
    with one warning naming it."""
    run_dir = Path(spool_dir) / run_dir_name(run_id)
    last: dict[str, int] = {}
    skipped: list[str] = []
    try:
        paths = sorted(run_dir.glob(f"*/*{SEGMENT_SUFFIX}"))
    except OSError as exc:
        logger.warning("async_tracker: cannot list the spool of run %r: %s", run_id, exc)
        return last
    for path in paths:
        if parse_segment(path) is None:
            continue
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue  # replayed and removed meanwhile: its points are in the store now
        except OSError as exc:
            skipped.append(f"{path} ({exc.strerror or exc})")
            continue
        batches, damaged = read_segment_bytes(data)
        if damaged:
            skipped.append(f"{path} ({damaged} damaged lines of {len(batches)})")
        for batch in filter(None, batches):
            for name, _, step, _ in batch.metric_rows():
                if name not in last or step > last[name]:
                    last[name] = step
    if skipped:
        more = f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        logger.warning(
            "async_tracker: run %r: skipped what cannot be read in its spool: %s%s",
            run_id, "; ".join(skipped[:5]), more,
        )
    return last


def spooled_runs(spool_dir: Path) -> list[tuple[str, str, Path]]:
    """``(run_id, backend_dir, path)`` of every (run, backend) directory holding segments;
    anything else under ``spool_dir`` is skipped."""
    out: list[tuple[str, str, Path]] = []
    try:
        run_dirs = sorted(p for p in spool_dir.iterdir() if p.is_dir())
    except OSError:
        return out
    for run_dir in run_dirs:
        try:
            run_id = b32decode(run_dir.name).decode("utf-8")
            backend_dirs = sorted(p for p in run_dir.iterdir() if p.is_dir())
        except (ValueError, OSError):
            continue
        for backend_dir in backend_dirs:
            if any(parse_segment(p) for p in backend_dir.iterdir()):
                out.append((run_id, backend_dir.name, backend_dir))
    return out


def remove_run_spool(spool_dir: str | Path, run_id: str) -> tuple[Path | None, list[str]]:
    """Removes what waits in this run's spool under ``spool_dir``, except the folder of each
    backend where a live pipeline holds its lock (a process still writing the run: removing
    its files under it would lose what it holds in memory against them, and it replays its
    own). Returns the run's spool folder (None if it has none) and the backend folders kept.
    An OSError of a removal is raised, after the locks taken here are released."""
    run_dir = Path(spool_dir) / run_dir_name(run_id)
    try:
        backend_dirs = sorted(p for p in run_dir.iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return None, []
    kept: list[str] = []
    for backend_dir in backend_dirs:
        tokens: set[str] = set()
        for name in os.listdir(backend_dir):
            m = _SEGMENT.match(name) or _ACK.match(name) or _LOCK.match(name) or _TMP.match(name)
            if m is not None:
                tokens.add(m["token"])
        # Each token's lock taken, as an adopter would: a token whose lock is held belongs to
        # a live pipeline (of another process, or of this one). Held while removing, so that
        # no replay adopts the files meanwhile.
        taken: list[Path] = []
        try:
            for token in sorted(tokens):
                lock = backend_dir / f"{token}.lock"
                if not locks.take(lock):
                    kept.append(backend_dir.name)
                    break
                taken.append(lock)
            else:
                shutil.rmtree(backend_dir)
        finally:
            for lock in taken:
                locks.drop(lock)
    if not kept:
        for path in run_dir.iterdir():  # foreign files: the folder goes whole
            if not path.is_dir():
                _unlink(path)
        try:
            run_dir.rmdir()
        except OSError:
            pass  # a pipeline started spooling the run meanwhile: its folder stays
    return run_dir, kept
