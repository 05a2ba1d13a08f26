"""What the spool tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from async_tracker import RetryPolicy
from async_tracker.spool import SEGMENT_SUFFIX

NO_WAIT = RetryPolicy(max_attempts=2, initial_backoff_s=0, max_backoff_s=0, jitter_s=0,
                      cooldown_s=3600)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Waits for a condition of the system under test (not for time to pass), bounded."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def segments(spool_dir: Path) -> list[Path]:
    return sorted(spool_dir.rglob(f"*{SEGMENT_SUFFIX}"))
