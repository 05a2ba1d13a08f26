"""``sync [SPOOL_DIR] [--to URL|FACTORY]``: replay what runs left in a spool.

The replay itself is :func:`async_tracker.sync.sync_spool`; this module resolves where to:
``--to`` (or ``--store``), a store or a factory that takes every spooled run, else the
trackers configured the torchx way (each under its configured name, the spool's key).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from async_tracker.cli.common import CliError, to_json, tracker_specs, warn
from async_tracker.factory import (
    AnyTracker,
    build_tracker,
    registered_factories,
    tracker_config_env_var_name,
)
from async_tracker.init_run import open_store
from async_tracker.settings import DEFAULT_SYNC_TIMEOUT_S


def _sync_module() -> Any:
    # Imported by name at run time: the spool's replay evolves on its own, and every other
    # command must keep working (and importing) whatever state it is in.
    try:
        return importlib.import_module("async_tracker.sync")
    except ImportError as exc:
        raise CliError(f"sync is not available in this installation: {exc}") from exc


def is_store_url(target: str) -> bool:
    """A store path or URL, not a factory: an existing path, or one with a ``/`` (``./runs``,
    ``/data/runs``, ``s3://b/p``), or a bare word that is no installed factory's name
    (``store2``: a new folder). Factories: installed names (``tensorboard``, ``mlflow``)
    and ``pkg.module:attr`` paths."""
    if "://" in target or "/" in target or os.sep in target or target.startswith("~"):
        return True
    if os.path.exists(target):
        return True
    return ":" not in target and target not in registered_factories()


def target_tracker(target: str) -> AnyTracker:
    """What ``--to`` names: a store (the fsspec backend over it), or a factory built with
    the config torchx would give it (``$TORCHX_TRACKER_<NAME>_CONFIG``; none if unset, as
    ``init(backends=[name])`` builds it)."""
    if is_store_url(target):
        return open_store(os.path.expanduser(target))
    return build_tracker(target, target, os.environ.get(tracker_config_env_var_name(target)))


def cmd_sync(args: argparse.Namespace) -> int:
    sync = _sync_module()
    if args.SPOOL_DIR:
        spool_dir = Path(args.SPOOL_DIR)
    else:
        spool_dir = Path(importlib.import_module("async_tracker.spool").default_spool_dir())
    if not spool_dir.is_dir():
        raise CliError(f"no spool directory at {str(spool_dir)!r}")
    # --timeout here: how long each run is tried before its records are left in the spool.
    timeout = getattr(args, "timeout", None) or DEFAULT_SYNC_TIMEOUT_S
    target = args.to or getattr(args, "store", None)
    if target:
        to = target_tracker(target)
        result = sync.sync_spool(spool_dir, {}, timeout=timeout, out=sys.stderr, to=to)
    else:
        trackers = {spec.name: spec.build() for spec in tracker_specs(args)}
        result = sync.sync_spool(spool_dir, trackers, timeout=timeout, out=sys.stderr)
    left = {key: r for key, r in result.reports.items() if not r.ok}
    if left:
        records = sum(r.spooled + r.pending for r in left.values())
        errors = [str(e) for r in left.values() for e in r.errors.values() if e]
        why = f" (last error: {' '.join(errors[-1].split())[:200]})" if errors else ""
        warn(
            f"gave up on {len(left)} run(s) after {timeout:g} s each: {records} records "
            f"stay in the spool {spool_dir}{why}; run the same sync again when the store "
            "is reachable (--timeout S waits longer)"
        )
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
            "Replays the runs a spool directory holds into --to (a store or a factory), else "
            "into the trackers configured the torchx way (or --tracker/--config), exactly "
            "once: a second sync stores nothing twice. Exit code 1 if something is left."
        ),
    )
    p.add_argument(
        "SPOOL_DIR",
        nargs="?",
        help="default: $ASYNC_TRACKER_SPOOL_DIR, else ~/.cache/async_tracker/spool",
    )
    p.add_argument(
        "--to",
        metavar="URL|FACTORY",
        help="replay every spooled run into this store (a path or fsspec URL) or backend "
        "factory (tensorboard, mlflow, module:attr), whatever backend it was spooled for",
    )
    p.set_defaults(func=cmd_sync)
