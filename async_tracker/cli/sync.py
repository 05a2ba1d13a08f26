"""``sync [SPOOL_DIR]``: replay what runs left in a spool into the configured backends.

The replay itself is :func:`async_tracker.sync.sync_spool`; this module only resolves the
trackers the torchx way (each under its configured name, the spool's key) and reports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from async_tracker.cli.common import CliError, to_json, tracker_specs


def _sync_module() -> Any:
    # Imported by name at run time: the spool's replay evolves on its own, and every other
    # command must keep working (and importing) whatever state it is in.
    try:
        return importlib.import_module("async_tracker.sync")
    except ImportError as exc:
        raise CliError(f"sync is not available in this installation: {exc}") from exc


def cmd_sync(args: argparse.Namespace) -> int:
    sync = _sync_module()
    if args.SPOOL_DIR:
        spool_dir = Path(args.SPOOL_DIR)
    else:
        spool_dir = Path(importlib.import_module("async_tracker.spool").default_spool_dir())
    if not spool_dir.is_dir():
        raise CliError(f"no spool directory at {str(spool_dir)!r}")
    trackers = {spec.name: spec.build() for spec in tracker_specs(args)}
    result = sync.sync_spool(spool_dir, trackers, timeout=args.timeout, out=sys.stderr)
    if args.json:
        print(
            to_json(
                {
                    "spool_dir": str(spool_dir),
                    "ok": result.ok,
                    "runs": [
                        {
                            "run_id": run_id,
                            "backend": backend,
                            "delivered": report.delivered,
                            "ok": report.ok,
                        }
                        for (run_id, backend), report in result.reports.items()
                    ],
                    "unknown_backends": [
                        {"run_id": run_id, "backend": backend}
                        for run_id, backend in result.unknown_backends
                    ],
                }
            )
        )
    elif not result.reports and not result.unknown_backends:
        print(f"nothing to replay in {spool_dir}")
    return 0 if result.ok else 1


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "sync",
        parents=[common],
        help="replay spooled records into the configured trackers",
        description=(
            "Replays the runs a spool directory holds into the trackers configured the torchx "
            "way (or --tracker/--config), exactly once. Exit code 1 if something is left."
        ),
    )
    p.add_argument(
        "SPOOL_DIR",
        nargs="?",
        help="default: $ASYNC_TRACKER_SPOOL_DIR, else ~/.cache/async_tracker/spool",
    )
    p.add_argument("--timeout", type=float, metavar="S", help="seconds per run (default: none)")
    p.set_defaults(func=cmd_sync)
