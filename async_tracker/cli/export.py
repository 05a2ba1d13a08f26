"""``export tensorboard RUN... --out DIR`` and ``export csv RUN... --out FILE``: runs already
in a store, as TensorBoard event files, or as one CSV table of their metric points.

``export tensorboard``: each run is read whole from the store and written as one batch by the
TensorBoard backend (points keep their steps and client timestamps), then ended with the status
the store recorded, so that ``tensorboard --logdir DIR`` shows the same curves, params and
ending.

``export tensorboard`` replaces each run's folder under ``--out``: exporting again gives the
same event files' content, never doubled points.

``export csv``: long format, one row per point (``run,name,step,value,time``), a header row
first; runs in the order given, each run's metrics by name (or in ``--metrics`` order), each
metric's points in step order. Values and times are written as Python writes a float
(``repr``): a float64 reads back exact, and NaN and infinities are ``nan``, ``inf`` and
``-inf`` (what ``float()`` and pandas read). Times are seconds since the epoch. Text cells
(the header, run ids, metric names) are always quoted, numbers never: a name holding a comma,
a quote, a line feed or a carriage return reads back as it is (the csv module quotes only
the characters of its line terminator otherwise, and a lone carriage return split rows).
``--spreadsheet-safe`` puts a ``'`` before a text cell that a spreadsheet would take for a
formula (one starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from async_tracker.cli.common import (
    CliError,
    read_or_fail,
    reader_for,
    resolve_runs,
    to_json,
    warn,
)
from async_tracker.cli.query import read_metrics
from async_tracker.records import Batch, TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.sync_reader import Reader


def _tensorboard_backend() -> Any:
    # Checked before the store is read: a missing extra fails fast, with the pip command.
    try:
        return importlib.import_module("async_tracker.backend.tensorboard")
    except ImportError as exc:
        raise CliError(f"export tensorboard: {exc}") from exc


def read_batch(t: Reader, run_id: str) -> Batch:
    """Everything the store holds of a run, as one batch (a run's first flush)."""
    metrics = [p for pts in read_metrics(t, run_id).values() for p in pts]
    return Batch(
        seq=1,
        metadata=dict(t.metadata(run_id)),
        artifacts=dict(t.artifacts(run_id)),
        sources=list(t.lineage(run_id).parents),
        metrics=metrics,
        records=1,
    )


def cmd_export_tensorboard(args: argparse.Namespace) -> int:
    tensorboard = _tensorboard_backend()
    reader = reader_for(args)
    out = Path(args.out)
    with read_or_fail(reader.label):
        run_ids = resolve_runs(reader, args.RUN_ID)
        runs = [(r, read_batch(reader, r), reader.status(r)) for r in run_ids]
    writer = tensorboard.AsyncTensorBoardTracker(out)
    loop = runtime().loop
    exported = []
    for run_id, batch, ended in runs:
        # The run's folder replaced, not added to: a second export of the same run into
        # the same folder would otherwise add a second event file of every point.
        loop.call(writer.delete_run, run_id)
        status, end_time = ended
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


CSV_HEADER = ("run", "name", "step", "value", "time")


def metric_names(option: str | None) -> list[str] | None:
    """``--metrics a,b``: the names, in order; None for every metric."""
    if option is None:
        return None
    names = list(dict.fromkeys(n.strip() for n in option.split(",") if n.strip()))
    if not names:
        raise CliError(f"--metrics: no metric name in {option!r}")
    return names


def csv_rows(
    run_id: str,
    curves: dict[str, Sequence[TrackerMetric]],
    names: Sequence[str] | None,
    spreadsheet_safe: bool = False,
) -> Iterator[tuple[str, str, int, float, float]]:
    run = _safe(run_id) if spreadsheet_safe else run_id
    for name in sorted(curves) if names is None else names:
        cell = _safe(name) if spreadsheet_safe else name
        # Stable: points of one step keep the order the store gave (the order logged).
        for p in sorted(curves.get(name, ()), key=lambda p: p.step):
            yield run, cell, p.step, float(p.value), float(p.timestamp)


# What a spreadsheet takes a text cell for a formula by (OWASP's list for CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _safe(text: str) -> str:
    """``text`` as a spreadsheet shows it as text: a ``'`` before a formula's first character."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


@contextlib.contextmanager
def _output(out: str) -> Iterator[IO[str]]:
    if out == "-":
        yield sys.stdout
        return
    # newline="": the csv module writes its own line ends.
    with open(out, "w", newline="", encoding="utf-8") as f:
        yield f


def cmd_export_csv(args: argparse.Namespace) -> int:
    names = metric_names(args.metrics)
    reader = reader_for(args)
    with read_or_fail(reader.label):
        run_ids = resolve_runs(reader, args.RUN_ID)
        runs = [(r, dict(read_metrics(reader, r))) for r in run_ids]
    for name in names or ():
        if not any(name in curves for _, curves in runs):
            warn(f"export csv: no run exported has a metric {name!r}")
    exported = []
    # A file that cannot be written is an OSError: main says so, with exit code 1.
    with _output(args.out) as f:
        # Text quoted, numbers not (floats written as repr writes them: exact): see the
        # module's docstring for why not the csv module's minimal quoting.
        writer = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(CSV_HEADER)
        for run_id, curves in runs:
            rows = list(csv_rows(run_id, curves, names, args.spreadsheet_safe))
            writer.writerows(rows)
            exported.append({"run_id": run_id, "points": len(rows)})
    if args.out == "-":
        return 0
    if args.json:
        print(to_json({"out": args.out, "runs": exported}))
    else:
        for run in exported:
            print(f"{run['run_id']}: {run['points']} points")
        print(f"written: {args.out}")
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
    csv_p = exp_sub.add_parser(
        "csv",
        parents=[common],
        help="write the metric points of runs as one CSV table",
        description="Writes every metric point of the runs as CSV, one row per point: "
        "run,name,step,value,time (time in seconds since the epoch; NaN and infinities as "
        "nan, inf, -inf). Runs come in the order given, points in step order. Text cells are "
        "quoted, numbers not.",
    )
    csv_p.add_argument("RUN_ID", nargs="+", help="runs to export (ids or unique prefixes)")
    csv_p.add_argument("--out", required=True, metavar="FILE", help="the CSV file ('-': stdout)")
    csv_p.add_argument(
        "--metrics", metavar="NAME,...", help="only these metrics, in this order (default: all)"
    )
    csv_p.add_argument(
        "--spreadsheet-safe",
        action="store_true",
        help="put a ' before a run id or metric name starting with =, +, -, @, a tab or a "
        "carriage return, so that a spreadsheet shows it as text, not a formula (the cell "
        "then differs from the name)",
    )
    csv_p.set_defaults(func=cmd_export_csv)
