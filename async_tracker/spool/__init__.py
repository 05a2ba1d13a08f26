"""The spool: records that wait on local disk, in order, until their backend takes them.

* :mod:`~async_tracker.spool.log`: one backend's ordered log of batches, in memory then on
  disk: the spiller, acks, adoption of dead pipelines' segments, leftovers at close.
* :mod:`~async_tracker.spool.codec`: one batch per line, with a checksum.
* :mod:`~async_tracker.spool.store`: segments, acks, quarantine of one (run, backend).
* :mod:`~async_tracker.spool.owner`: lock files that tell live pipelines from dead ones.
* :mod:`~async_tracker.spool.io`: the one thread all spool file I/O runs on.
"""

from __future__ import annotations

from async_tracker.spool.store import (
    SEGMENT_SUFFIX,
    Segment,
    Spool,
    backend_dir_name,
    check_run_id,
    default_spool_dir,
    has_spool,
    new_token,
    remove_run_spool,
    run_dir_name,
    spooled_last_steps,
    spooled_runs,
)

__all__ = [
    "SEGMENT_SUFFIX",
    "Segment",
    "Spool",
    "backend_dir_name",
    "check_run_id",
    "default_spool_dir",
    "has_spool",
    "new_token",
    "remove_run_spool",
    "run_dir_name",
    "spooled_last_steps",
    "spooled_runs",
]
