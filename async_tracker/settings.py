"""Every tunable of async_tracker in one place, with its ``ASYNC_TRACKER_*`` variable.

Durations are float seconds; names carry the unit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal, get_args

from async_tracker.retry import RetryPolicy

DEFAULT_FLUSH_INTERVAL_S = 1.0
DEFAULT_BATCH_SIZE = 10_000
DEFAULT_MAX_BUFFERED = 1_000_000
# What happens to writes while a run holds more than max_buffered records in memory:
# "spool" (the default) sends them to the disk spool; "block" makes the writer wait for room
# up to overflow_timeout, then spools; "drop_oldest" drops the oldest metrics in memory.
OverflowPolicy = Literal["spool", "block", "drop_oldest"]
OVERFLOW_POLICIES: tuple[str, ...] = get_args(OverflowPolicy)
DEFAULT_OVERFLOW_TIMEOUT_S = 10.0
DEFAULT_CLOSE_TIMEOUT_S = 10.0
# How often the flusher looks at the buffers. The hot path never wakes the flusher (that would
# be an event-loop call); it finds a full batch within this time instead. Each wake costs
# the caller a little GIL time, idle or not: 20 per second is a fair trade.
DEFAULT_WAKE_INTERVAL_S = 0.05
# While a run is overloaded, how long the flusher (and a flush) let its lanes spill before
# taking the next share of its packed ingress.
PACKED_PAUSE_S = 0.005
# What close(timeout) may take beyond its timeout, in all: it returns within
# timeout + CLOSE_SLACK_S, whatever the backends, the disk or the other threads do. Within it,
# measured from the close's deadline:
CLOSE_SLACK_S = 0.5
# ... until SPOOL_GRACE_S the tracker loop writes what is still undelivered to the spool (a
# slice at a time; what does not fit stays in memory, counted as lost at exit) ...
SPOOL_GRACE_S = 0.2
# ... until BACKEND_CLOSE_GRACE_S it closes the backends the run built (after its report) ...
BACKEND_CLOSE_GRACE_S = 0.28
# ... and at CLOSE_FENCE_S the caller stops waiting for the loop (stuck in a backend that
# blocks it, or starved of the GIL): it fences the run, whose report is then the state at that
# moment, and nothing of the run moves records afterwards (see RunPipeline.fence). The rest
# of the slack is the caller's own: threads that hold the GIL (16 of them spinning) make each
# of its few waits for it cost tens of milliseconds.
CLOSE_FENCE_S = 0.3
# While closing, the most records one step on the tracker loop's thread handles (rounded up to
# whole batches): a cut, or a write to the spool (encoded on the loop, a few microseconds a
# record under load), so that no step runs far past a deadline, and the steps of other runs
# interleave.
CLOSE_SLICE_RECORDS = 20_000
# What a write to the spool is expected to take per record before a run has measured its own.
DEFAULT_SPOOL_S_PER_RECORD = 3e-6
# While delivering at a close, what waits in memory goes to the spool (behind the batch being
# delivered) once the time left is under this many times what writing it is expected to take:
# the disk then holds it by the deadline, instead of a last-moment write that cannot finish.
CLOSE_SPILL_MARGIN = 2.0
# How often a close that waits for its lanes looks at the time left against that.
CLOSE_LOOK_S = 0.05
# The interpreter's switch interval while a close runs (sys.setswitchinterval; Python's default
# is 5 ms), restored when the last close under way returns. A thread that wants the GIL back
# (the closing thread waking at its deadline, the tracker loop after each wait) asks the holder
# to let go after this long, then waits for every other thread that wants it too: with 16
# threads that keep the GIL busy, each such wait costs 16 x 5 ms and more at the default, and
# a close takes a handful of them after its deadline.
CLOSE_SWITCH_INTERVAL_S = 0.0005
# Seconds between a live run's heartbeats in its stores (0: none): readers show a run that
# never ended and whose heartbeats are older than CRASHED_AFTER_BEATS intervals as crashed.
DEFAULT_HEARTBEAT_S = 30.0
CRASHED_AFTER_BEATS = 3
# How long SIGTERM waits for a flush before the previous handler runs.
DEFAULT_SIGTERM_GRACE_S = 5.0
# Worker threads for blocking calls (async_tracker/runtime/threads.py), shared by the process:
# at most ASYNC_TRACKER_THREADS in all, and ASYNC_TRACKER_THREADS_PER_ENDPOINT calls of one
# endpoint (a filesystem root, a tracking server) at once, so that one dead server holds at
# most that many. Past the cap, calls wait for a thread in call order. An idle thread ends
# after THREAD_IDLE_S.
DEFAULT_THREAD_LIMIT = 16
DEFAULT_THREADS_PER_ENDPOINT = 4
THREAD_IDLE_S = 10.0

ENV_PREFIX = "ASYNC_TRACKER_"

# How long ``init()`` waits for the store to answer its start check (does the run exist,
# its last steps, the claim of a new id) before it goes on without the answer: a store that
# is down must not keep training from starting. Local disks and a near object store answer in
# milliseconds; a cold S3 client (credentials, TLS) in a few hundred.
DEFAULT_INIT_TIMEOUT_S = 1.0
ENV_INIT_TIMEOUT = ENV_PREFIX + "INIT_TIMEOUT"


@dataclass(frozen=True)
class RunOptions:
    """The options of an ``AppRun``; ``from_env`` reads ``ASYNC_TRACKER_<OPTION>``."""

    flush_interval: float = DEFAULT_FLUSH_INTERVAL_S
    batch_size: int = DEFAULT_BATCH_SIZE
    max_buffered: int = DEFAULT_MAX_BUFFERED
    spool_dir: str | None = None
    durable: bool = False
    overflow: OverflowPolicy = "spool"
    overflow_timeout: float = DEFAULT_OVERFLOW_TIMEOUT_S
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    strict: bool = False
    # Seconds between samples of CPU, memory and GPU use, logged as metrics under system/
    # (see system_metrics.py); None or 0: none.
    system_metrics: float | None = None
    # Seconds between heartbeats of the run in its stores (see DEFAULT_HEARTBEAT_S); 0: none.
    heartbeat_s: float = DEFAULT_HEARTBEAT_S

    def __post_init__(self) -> None:
        if not self.flush_interval > 0:
            raise ValueError(f"flush_interval must be > 0 seconds, got {self.flush_interval!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")
        if self.max_buffered < self.batch_size:
            raise ValueError(
                f"max_buffered ({self.max_buffered}) must be >= batch_size ({self.batch_size})"
            )
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(
                f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}; got {self.overflow!r}"
            )
        if not self.overflow_timeout >= 0:
            raise ValueError(
                f"overflow_timeout must be >= 0 seconds, got {self.overflow_timeout!r}"
            )
        if not self.close_timeout >= 0:
            raise ValueError(f"close_timeout must be >= 0 seconds, got {self.close_timeout!r}")
        if not self.heartbeat_s >= 0:
            raise ValueError(
                f"heartbeat_s must be >= 0 seconds (0: off), got {self.heartbeat_s!r}"
            )
        if self.system_metrics is not None and not self.system_metrics >= 0:
            raise ValueError(
                f"system_metrics must be >= 0 seconds (0: off), got {self.system_metrics!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunOptions:
        """Options from ``ASYNC_TRACKER_FLUSH_INTERVAL``, ``..._DURABLE=1`` ..."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name == "retry":
                continue
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(f.name, raw)
        return cls(**values)  # type: ignore[arg-type]


def _parse(name: str, raw: str) -> object:
    var = ENV_PREFIX + name.upper()
    try:
        if name in (
            "flush_interval", "close_timeout", "overflow_timeout", "system_metrics",
            "heartbeat_s",
        ):
            return float(raw)
        if name in ("batch_size", "max_buffered"):
            return int(raw)
        if name in ("durable", "strict"):
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if name == "overflow" and raw not in OVERFLOW_POLICIES:
            raise ValueError(raw)
        return raw
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a valid value for {name}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(ENV_PREFIX + name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{ENV_PREFIX}{name}={raw!r} is not a number of seconds") from None


def init_timeout(timeout: float | None = None) -> float:
    """``timeout`` if given, else ``$ASYNC_TRACKER_INIT_TIMEOUT``, else
    :data:`DEFAULT_INIT_TIMEOUT_S`; ValueError naming it unless it is a number > 0."""
    if timeout is None:
        timeout = env_float("INIT_TIMEOUT", DEFAULT_INIT_TIMEOUT_S)
        what = f"{ENV_INIT_TIMEOUT}={timeout!r}"
    else:
        what = f"timeout={timeout!r}"
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{what}: the start timeout must be a number of seconds > 0")
    return float(timeout)


# How long `async-tracker sync` tries to deliver each spooled run (its --timeout) before it
# gives up on it, leaving its records in the spool: a store that is down must not keep the
# command retrying forever.
DEFAULT_SYNC_TIMEOUT_S = 60.0

# How long one read of a store may take (``Store(timeout=)``, the CLI's ``--timeout``, each
# request of the dashboard) before it fails naming the store: a store that accepts a
# connection and never answers must not hold a command for minutes.
# Also how long a read of a backend (or through an AppRun) waits first for this process's
# pending writes to it (see own_writes.py) before it answers without them, with a warning.
DEFAULT_READ_TIMEOUT_S = 30.0
ENV_READ_TIMEOUT = ENV_PREFIX + "READ_TIMEOUT"


def read_timeout(timeout: float | None = None) -> float | None:
    """``timeout`` if given (``math.inf``: none), else ``$ASYNC_TRACKER_READ_TIMEOUT``, else
    :data:`DEFAULT_READ_TIMEOUT_S`; ValueError naming it unless it is a number > 0."""
    if timeout is None:
        timeout = env_float("READ_TIMEOUT", DEFAULT_READ_TIMEOUT_S)
        what = f"{ENV_READ_TIMEOUT}={timeout!r}"
    else:
        what = f"timeout={timeout!r}"
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{what}: the read timeout must be a number of seconds > 0")
    return None if timeout == float("inf") else float(timeout)


# ``init()`` prints one line on stderr naming the run, its store and how to see it (as W&B
# and Trackio do); ASYNC_TRACKER_SILENT=1 (or init(quiet=True)) keeps it quiet.
ENV_SILENT = ENV_PREFIX + "SILENT"


def silent() -> bool:
    """Whether ``$ASYNC_TRACKER_SILENT`` asks for quiet (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get(ENV_SILENT, "").strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(ENV_PREFIX + name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"{ENV_PREFIX}{name}={raw!r} is not a whole number >= {minimum}")
    return value
