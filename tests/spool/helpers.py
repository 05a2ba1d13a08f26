"""What the spool tests share."""

from __future__ import annotations

from pathlib import Path

from async_tracker import RetryPolicy
from async_tracker.spool import SEGMENT_SUFFIX

NO_WAIT = RetryPolicy(max_attempts=2, initial_backoff_s=0, max_backoff_s=0, jitter_s=0,
                      cooldown_s=3600)


def segments(spool_dir: Path) -> list[Path]:
    return sorted(spool_dir.rglob(f"*{SEGMENT_SUFFIX}"))
