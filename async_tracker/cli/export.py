"""``export tensorboard RUN... --out DIR``: runs already in a store, as TensorBoard event files.

Each run is read whole from the store and written as one batch by the TensorBoard backend
(points keep their steps and client timestamps), then ended with the status the store
recorded, so that ``tensorboard --logdir DIR`` shows the same curves, params and ending.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from async_tracker.base import TrackerBase
from async_tracker.cli.common import (
    CliError,
    read_or_fail,
    resolve_runs,
    run_status,
    to_json,
    tracker_and_label,
)
from async_tracker.cli.query import read_metrics
from async_tracker.records import Batch
from async_tracker.runtime.process import runtime


def _tensorboard_backend() -> Any:
    # Checked before the store is read: a missing extra fails fast, with the pip command.
    try:
        return importlib.import_module("async_tracker.backend.tensorboard")
    except ImportError as exc:
        raise CliError(f"export tensorboard: {exc}") from exc


def read_batch(t: TrackerBase, run_id: str) -> Batch:
    """Everything the store holds of a run, as one batch (a run's first flush)."""
    metrics = [p for pts in read_metrics(t, run_id).values() for p in pts]
    return Batch(
        seq=1,
        metadata=dict(t.metadata(run_id)),
        artifacts=dict(t.artifacts(run_id)),
        sources=list(t.sources(run_id)),
        metrics=metrics,
        records=1,
    )


def cmd_export_tensorboard(args: argparse.Namespace) -> int:
    tensorboard = _tensorboard_backend()
    tracker, label = tracker_and_label(args)
    out = Path(args.out)
    with read_or_fail(label):
        run_ids = resolve_runs(tracker, args.RUN_ID)
        runs = [(r, read_batch(tracker, r), run_status(tracker, r)) for r in run_ids]
    writer = tensorboard.AsyncTensorBoardTracker(out)
    loop = runtime().loop
    exported = []
    for run_id, batch, ended in runs:
        status, end_time = ended if ended else ("running", None)
        # A run still going gets no ending it did not have; nor does a crashed one (it never
        # ended: TensorBoard's reader knows only the endings a run records). An ending goes
        # as the batch's end record, with the time the run ended, not the export's.
        if status in ("finished", "failed", "killed"):
            batch.end = status  # type: ignore[assignment]  # one of CloseReason's values
            batch.end_time = end_time or 0.0
        loop.call(writer.write_batch, run_id, batch)
        exported.append(
            {"run_id": run_id, "logdir": writer.logdir(run_id), "points": batch.points()}
        )
    loop.call(writer.aclose)
    if args.json:
        print(to_json({"out": str(out), "runs": exported}))
    else:
        for run in exported:
            print(f"{run['run_id']}: {run['points']} points -> {run['logdir']}")
        print(f"view them: tensorboard --logdir {out}")
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    exp = sub.add_parser("export", help="write runs of the store in another format")
    exp_sub = exp.add_subparsers(dest="format", required=True)
    tb = exp_sub.add_parser(
        "tensorboard",
        parents=[common],
        help="write runs as TensorBoard event files (needs the tensorboard extra)",
        description="Writes runs as TensorBoard event files under --out, one folder per run: "
        "view them with `tensorboard --logdir DIR`.",
    )
    tb.add_argument("RUN_ID", nargs="+", help="runs to export (ids or unique prefixes)")
    tb.add_argument("--out", required=True, metavar="DIR", help="the TensorBoard log directory")
    tb.set_defaults(func=cmd_export_tensorboard)
