"""The fsspec store's layout: where each record lies, and how files are named.

Layout under ``root_dir`` (torchx's ``FsspecTracker`` and ``torchx tracker list`` read it)::

    <base32(run_id)>/
        metadata/<time>-<tag>-<n>-<digest(key)> {"metadata": {key: value}}, one per key write
        artifacts/<base32(name)>                {"name": .., "path": .., "metadata": ..}
        sources/<base32(src)>                   artifact names, one a line ("" for none)
        parents/<base32(src)>.<digest(art)>     new: one file per lineage edge (its artifact)
        descendants/<base32(id)>.<digest(art)>  the same edge, in the source's directory
        metrics/<name>.parquet                  new (torchx ignores it): immutable segments
        overview/<name>.parquet                 new: what a chart draws of metrics/<name>
        .tmp/                                   staging for atomic renames, where there are
    .index-summary-<digest(run_id)>-<writer token>.json  new: what each process wrote, summed
    .index-summary-<digest(run_id)>-rebuilt.json         new: the same, rebuilt by a reader once
    .index-claim-<digest(run_id)>-<time>-<tag>-<n>.json  new: a run claimed (listed at once)
    .index-removed-<digest(run_id)>-<time>-<tag>-<n>.json  new: a run deleted (a tombstone)
    .index-checkpoint-<20-digit n>.json[.gz]            new: all of the above, compacted
    .summary-<digest(run_id)>-<writer token>.json       the previous version's summaries

The ``.index-`` files are the run index (see ``index.py``): files at the root, not a folder,
because torchx's ``run_ids`` takes every folder at the root for a run (a hidden one too);
one prefix, so that object stores list them alone (a request per 1,000 index files).

Names of metadata and metric files start with the wall-clock time in nanoseconds, then a tag
unique to the process (hosts and forks included) and a counter, so they never collide and
sort into write order. A batch that has a ``key`` (fixed when it was cut, before its
write-ahead line) uses it as the tag: ``metadata/<key>-<n>-<digest>`` and
``metrics/<key>-<digest of what the segment holds>.parquet``, so that a retry, or a replay by
another process after a crash, overwrites instead of duplicating. A batch without a key gets a
tag at its first attempt and keeps it for its retries (``Batch.names``). Metric segments are
Apache Parquet (``parquet.py``), compacted into one file per writer when its run ends, or by
a reader once the writer is no longer live (``<first key>-compact-<digest>.parquet``; see
``metricfiles.py`` and ``readcompact.py``); JSON Lines segments
(``.jsonl``: older versions, and batches whose steps do not fit int64) are read too.

Everything here is names and paths: no I/O. ``writer.py`` writes this layout, ``reader.py``
and ``summaries.py`` read it.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import posixpath
import re
import secrets
import threading
import time
from base64 import b32decode, b32encode

# The metric codec's module (it loads numpy and pyarrow), imported by the store when it is
# made (runtime.process.import_here), not with the package.
METRIC_CODEC = "async_tracker.backend.fsspec.metricfiles"
METADATA_DIR = "metadata"
ARTIFACTS_DIR = "artifacts"
SOURCES_DIR = "sources"
PARENTS_DIR = "parents"
DESCENDANTS_DIR = "descendants"
METRICS_DIR = "metrics"
# A big compacted metric file's overview (see parquet.overview), under the same name: not a
# run part (written only beside metrics/), and outside metrics/ so that a query of
# ``*/metrics/*.parquet`` (DuckDB, Polars) never counts its rows twice.
OVERVIEW_DIR = "overview"
TMP_DIR = ".tmp"
# How the run ended, one file per writing process: not a record torchx knows (its reader
# never lists this folder) and not one that makes a directory a run's (see RUN_PARTS).
STATUS_DIR = "status"
# When several processes end one run, the worst ending wins: a failed rank fails the run.
_STATUS_RANK = {"finished": 0, "killed": 1, "failed": 2}
# A live run's heartbeat, one file per writing process: ``{"time": .., "interval_s": ..}``.
# A run that never ended and whose every heartbeat is older than CRASHED_AFTER_BEATS of its
# intervals reads as crashed (not a run part either).
HEARTBEAT_DIR = "heartbeat"
# What each writing process wrote to a run, summed (see "Summaries" in summaries.py): a file
# of the run index at the store's root, ``.index-summary-<digest of the run id>-<writer
# token>.json``; the run's rebuilt summary has the token ``rebuilt`` (writer tokens are hex,
# or digits, an "x" and hex). The previous version named them ``.summary-...``: the name's
# pattern takes both.
INDEX_PREFIX = ".index-"
SUMMARY_PREFIX = ".index-summary-"
LEGACY_SUMMARY_PREFIX = ".summary-"
REBUILT_TOKEN = "rebuilt"
_SUMMARY_FILE = re.compile(r"\.(?:index-)?summary-[0-9a-f]{16}-([0-9a-fx]+|rebuilt)\.json")
# The token in a file name of ours: "<19-digit time>-<token>-..." (metadata, segments).
_FILE_TOKEN = re.compile(r"\d{19}-([^-]+)-")
# The writer token in a batch key "<19-digit time>-<token>-<seq>[.part...]".
_KEY_TOKEN = re.compile(r"\d{19}-(\d{19}x[0-9a-f]+)-")
# What makes a directory a run's: any record the run wrote itself. A directory holding only
# ``descendants/`` is the other end of an edge (a data set, a parent in another store).
# The run's claim: a small JSON file that its creator writes by an atomic create-if-absent
# (see FsspecWriter.claim_run), so that of several processes creating one run id exactly
# one succeeds. It makes the directory a run's from its start, before any record;
# torchx's reader only reads the folders it knows and never sees it.
CLAIM_FILE = "claim.json"
RUN_PARTS = frozenset(
    {METADATA_DIR, ARTIFACTS_DIR, SOURCES_DIR, PARENTS_DIR, METRICS_DIR, CLAIM_FILE}
)
# What a run holds once something wrote records to it (its claim aside).
_RECORD_PARTS = (RUN_PARTS - {CLAIM_FILE}) | {STATUS_DIR}

# One path component on common local filesystems (ext4, xfs, apfs, NTFS). Enforced on every
# filesystem: a store is copied between disks and buckets, and torchx reads both.
MAX_FILE_NAME_BYTES = 255
DIGEST_CHARS = 16  # 64 bits of sha256: a collision among one run's keys is not a concern
# A metadata file of ours: "<19-digit time>-<tag>-<position>-<digest of the key>".
_KEY_FILE = re.compile(r"\d{19}-.+-([0-9a-f]{16})")
_DIGEST = re.compile(r"[0-9a-f]{16}")
_LEADING_DIGITS = re.compile(r"\d+")

# What a read skips a file for: what json.loads and the parsers' checks (``parsing.py``,
# ``segments.py``) raise on a foreign, corrupt or truncated file (RecursionError: nested too
# deep; OverflowError: a huge number).
_UNPARSEABLE = (
    ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, OverflowError,
)  # fmt: skip


def encode_run_id(run_id: str) -> str:
    """torchx's directory name for a run id: base32 of its bytes (UTF-8; torchx's ASCII for
    ASCII ids), uppercase and padded."""
    return b32encode(run_id.encode("utf-8")).decode("ascii")


def summary_path(root_dir: str, run_id: str, writer: str) -> str:
    """Where the store at ``root_dir`` keeps the summary of ``run_id`` by ``writer`` (see
    "Summaries" in ``summaries.py``), in its run index at the root: named by a digest of the
    id, which a base32 name of the longest ids would not fit beside a writer token."""
    return posixpath.join(root_dir, f"{SUMMARY_PREFIX}{_digest(run_id)}-{writer}.json")


def legacy_summary_path(root_dir: str, run_id: str, writer: str) -> str:
    """Where the previous version kept the summary of ``run_id`` by ``writer``: at the
    store's root (still read; see ``index.py``)."""
    return posixpath.join(root_dir, f"{LEGACY_SUMMARY_PREFIX}{_digest(run_id)}-{writer}.json")


def decode_run_id(name: str) -> str | None:
    """The run id a directory or file name encodes, or None for a foreign name."""
    try:
        return b32decode(name.encode("ascii")).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        return None


def _beside_runs(name: str, is_dir: bool) -> bool:
    """Whether an entry of the store's root that is not named as a run is the store's own,
    skipped without a word: a file (its fsspec config file, a ``.torchxconfig``, a plot) or
    a hidden folder. A run is a directory with a base32 name, so these cannot be a damaged
    run, and naming them at every read would bury the warnings that matter."""
    return not is_dir or name.startswith(".")


def run_path(root_dir: str, run_id: str, *parts: str) -> str:
    """The directory of ``run_id`` in the store at ``root_dir``, or ``parts`` under it."""
    return posixpath.join(root_dir, encode_run_id(run_id), *parts)


def _root_entry(
    name: str, is_dir: bool, runs: list[tuple[str, str]], summaries: list[str]
) -> str:
    """Sorts one entry of the root into ``runs`` (``(name, run id)``) or ``summaries`` (the
    previous version's, ``.summary-...``); why it is neither ("" if it is one, or one of the
    store's own files: see _beside_runs)."""
    if name.startswith(LEGACY_SUMMARY_PREFIX) and _SUMMARY_FILE.fullmatch(name) and not is_dir:
        summaries.append(name)
        return ""
    run_id = decode_run_id(name)
    if run_id is None and _beside_runs(name, is_dir):
        return ""
    if run_id is None:
        return "not a run: no base32 name"
    if not is_dir:
        return "a file, not a run directory"
    runs.append((name, run_id))
    return ""


class _Names:
    """Unique, time-ordered object names for this process: its token is new in a forked child
    (a pid check; with its own counter and lock, never one the parent's threads held)."""

    class _State:
        def __init__(self) -> None:
            self.token = f"{secrets.token_hex(4)}{os.getpid():x}"
            self.count = 0
            self.last_ns = 0
            self.points = 0
            self.lock = threading.Lock()

    def __init__(self) -> None:
        self._by_pid: dict[int, _Names._State] = {}

    def _state(self) -> _Names._State:
        pid = os.getpid()
        state = self._by_pid.get(pid)
        if state is None:
            # setdefault is atomic under the GIL: racing threads of a new process share one.
            state = self._by_pid.setdefault(pid, _Names._State())
        return state

    @property
    def token(self) -> str:
        """This process's token: unique across processes and hosts."""
        return self._state().token

    def new(self, suffix: str = "") -> str:
        state = self._state()
        with state.lock:
            # Never go back in time within a process, even if the wall clock does.
            now = max(time.time_ns(), state.last_ns + 1)
            state.last_ns = now
            state.count += 1
            return f"{now}-{state.token}-{state.count:06d}{suffix}"


    def numbers(self, n: int) -> int:
        """The first of ``n`` numbers new in this process (under its token): what the points
        of a direct ``add_metrics`` call are numbered by (``seq`` in Parquet segments)."""
        state = self._state()
        with state.lock:
            first = state.points
            state.points += n
            return first


_names = _Names()


def _file_token(name: str) -> str:
    """The writer token in a file name of ours (metadata, segment, status), "" for another."""
    if name.endswith(".json") and not _LEADING_DIGITS.match(name):
        return name[: -len(".json")]  # status/<token>.json
    found = _FILE_TOKEN.match(name)
    return found.group(1) if found else ""


def _digest(text: str) -> str:
    # surrogatepass: a key with a lone surrogate still gets a name (JSON escapes the key).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_file_name(name: str, what: str, suffix_bytes: int) -> None:
    """ValueError naming ``what`` unless base32 of ``name`` plus a suffix makes a file name."""
    if not _utf8(name):
        raise ValueError(f"{what}: the name holds a lone surrogate, which no file name can hold")
    size = len(name.encode("utf-8"))
    longest = (MAX_FILE_NAME_BYTES - suffix_bytes) // 8 * 5
    if size > longest:
        raise ValueError(
            f"{what}: the name is {size} bytes in UTF-8; the fsspec store names a file after "
            f"it, which holds at most {longest} bytes"
        )


def _write_order(name: str) -> tuple[int, str]:
    """How metadata files order: by the time leading their name, then by name."""
    match = _LEADING_DIGITS.match(name)
    return (int(match[0]) if match else -1, name)
