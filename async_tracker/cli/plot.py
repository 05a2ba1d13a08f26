"""``plot``: metric curves against step, one panel per metric, several runs overlaid.

matplotlib (the ``plot`` extra) draws through its Agg canvas on a bare ``Figure``: no pyplot,
so no GUI backend, no global figure state, nothing left open in a long-lived process.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from async_tracker.cli.common import (
    CliError,
    read_or_fail,
    reader_for,
    resolve_runs,
    to_json,
)
from async_tracker.cli.query import read_metrics
from async_tracker.plotting import MISSING_MATPLOTLIB, draw, select

FORMATS = {".png": "png", ".svg": "svg"}


def cmd_plot(args: argparse.Namespace) -> int:
    out = Path(args.output)
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise CliError(f"cannot tell the image format of {str(out)!r}: name it .png or .svg")
    try:
        import matplotlib  # noqa: F401  # checked before reading the store: fail fast
    except ImportError as exc:
        raise CliError(MISSING_MATPLOTLIB) from exc
    reader = reader_for(args)
    with read_or_fail(reader.label):
        run_ids = resolve_runs(reader, args.RUN_ID)
        curves = {run_id: read_metrics(reader, run_id) for run_id in run_ids}
    try:
        metrics = select(curves, args.metric)
        fig = draw(curves, metrics)
    except (ValueError, ImportError) as exc:
        raise CliError(str(exc)) from exc
    try:
        fig.savefig(out, format=fmt, dpi=args.dpi)
    except OSError as exc:
        raise CliError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from exc
    if args.json:
        print(to_json({"output": str(out), "runs": run_ids, "metrics": metrics}))
    else:
        print(f"wrote {out}: {len(metrics)} metric(s), {len(run_ids)} run(s)")
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "plot",
        parents=[common],
        help="draw metric curves against step as PNG or SVG (needs the plot extra)",
        description="Draws metric curves against step, one panel per metric, runs overlaid.",
    )
    p.add_argument("RUN_ID", nargs="+", help="runs to overlay")
    p.add_argument(
        "--metric",
        action="append",
        metavar="NAME",
        help="a metric to draw (repeatable; default: all)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE.png or FILE.svg")
    p.add_argument("--dpi", type=int, default=120, help="resolution of a PNG (default: 120)")
    p.set_defaults(func=cmd_plot)
