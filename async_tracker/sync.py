"""Replaying a spool directory into its backends: what ``async-tracker sync`` does.

Each ``<run>/<backend>`` directory of the spool is replayed by an ``AppRun`` of that run over
the backend of that name (the factory name for backends configured the torchx way), which
adopts the segments of dead processes and delivers them in order, exactly as a restarted job
would. Segments still owned by a live process are left to it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from async_tracker.factory import AnyTracker
from async_tracker.report import FlushReport
from async_tracker.run import AppRun
from async_tracker.spool import backend_dir_name, spooled_runs

# What close() gets at least after a flush that used up the run's budget: time to hand
# back what is undelivered to the spool.
CLOSE_FLOOR_S = 0.5


@dataclass
class SyncResult:
    """What a sync did: a report per (run id, backend), and what it could not replay."""

    reports: dict[tuple[str, str], FlushReport] = field(default_factory=dict)
    unknown_backends: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unknown_backends and all(r.ok for r in self.reports.values())


def sync_spool(
    spool_dir: Path,
    trackers: Mapping[str, AnyTracker],
    timeout: float | None = None,
    out: TextIO = sys.stderr,
    to: AnyTracker | None = None,
) -> SyncResult:
    """Replays every run spooled under ``spool_dir`` into ``trackers`` (by backend name), or
    into ``to``, whatever backend the records were spooled for. A progress bar and a line per
    (run, backend) go to ``out``.

    Running it twice stores nothing twice: a replay acknowledges in the spool what it
    delivered, and the next one finds only what is left (nothing)."""
    by_dir = {backend_dir_name(name): (name, t) for name, t in trackers.items()}
    todo = spooled_runs(spool_dir)
    result = SyncResult()
    with tqdm(total=len(todo), file=out, unit="run", desc="sync", leave=True) as bar:
        for run_id, backend_dir, _ in todo:
            if to is not None:
                # The spool's key is the backend directory: replaying under that name
                # adopts its segments, whatever backend stores them now.
                name, tracker = backend_dir, to
            elif backend_dir in by_dir:
                name, tracker = by_dir[backend_dir]
            else:
                result.unknown_backends.append((run_id, backend_dir))
                bar.write(f"{run_id} -> {backend_dir}: no such tracker configured", file=out)
                bar.update()
                continue
            # A replay: it seals no end record of its own (the job's, spooled, is replayed),
            # and beats no heartbeat (the job's run is not alive again).
            run = AppRun(
                run_id,
                [tracker],
                spool_dir=str(spool_dir),
                heartbeat_s=0,
                _backend_names=[name],
                _replay=True,
            )
            # One budget per run: what the flush leaves of it bounds the close (which spools
            # what is still undelivered: the records stay in the spool for the next sync).
            until = time.monotonic() + (timeout if timeout is not None else 60.0)
            run.flush(timeout)
            report = run.close(max(CLOSE_FLOOR_S, until - time.monotonic()))
            result.reports[(run_id, name)] = report
            state = "ok" if report.ok else f"{report.spooled + report.pending} records left"
            bar.write(
                f"{run_id} -> {name}: {report.delivered} records delivered, {state}", file=out
            )
            bar.update()
    return result
