"""``async-tracker``: query what runs recorded, with torchx's ``tracker list`` arguments.

    async-tracker list jobs [--parent-run-id ID]
    async-tracker list metadata RUN_ID
    async-tracker list artifacts [--artifact NAME] RUN_ID
    async-tracker list metrics RUN_ID
    async-tracker lineage RUN_ID

The tracker is the first one configured the torchx way (``.torchxconfig``, ``TORCHX_*``), or
``--tracker NAME --config CFG``. ``--json`` prints machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from async_tracker.adapters import as_sync
from async_tracker.base import TrackerBase
from async_tracker.config import TrackerSpec, configured_trackers
from async_tracker.errors import TrackerError
from async_tracker.records import Lineage, TrackerMetric


class CliError(Exception):
    """A message for the user, printed without a traceback; the exit code is 2."""


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[_cell(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "" if value is None else str(value)


def _tracker(args: argparse.Namespace) -> TrackerBase:
    if args.tracker:
        spec = TrackerSpec(args.tracker, args.tracker, args.config)
    else:
        specs = configured_trackers()
        if not specs:
            raise CliError(
                "no tracker configured: set [torchx:tracker] in .torchxconfig, or "
                "TORCHX_TRACKERS, or pass --tracker NAME --config CFG"
            )
        spec = specs[0]
    return as_sync(spec.build())


def _known(tracker: TrackerBase, run_id: str) -> None:
    if run_id not in set(tracker.run_ids()):
        raise CliError(f"unknown run id {run_id!r}: `async-tracker list jobs` lists the runs")


def _metric_summary(points: Sequence[TrackerMetric]) -> dict[str, Any]:
    values = [p.value for p in points if not math.isnan(p.value)]
    return {
        "last": points[-1].value,
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
        "count": len(points),
        "last_step": points[-1].step,
    }


def cmd_jobs(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    ids = list(t.run_ids(parent_run_id=args.parent_run_id) if args.parent_run_id else t.run_ids())
    return ids, table(["JOB ID"], [[i] for i in ids])


def cmd_metadata(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    _known(t, args.RUN_ID)
    md = dict(t.metadata(args.RUN_ID))
    return md, table(["ID", "VALUE"], [[k, v] for k, v in md.items()])


def cmd_artifacts(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    _known(t, args.RUN_ID)
    arts = [a for a in t.artifacts(args.RUN_ID).values() if not args.artifact or a.name == args.artifact]
    data = [{"name": a.name, "path": a.path, "metadata": a.metadata} for a in arts]
    return data, table(["ARTIFACT", "PATH", "METADATA"], [[a.name, a.path, a.metadata] for a in arts])


def cmd_metrics(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    _known(t, args.RUN_ID)
    read = getattr(t, "metrics", None)
    if not callable(read):
        raise CliError(f"tracker {t!r} does not store metrics")
    summary = {name: _metric_summary(pts) for name, pts in read(args.RUN_ID).items() if pts}
    rows = [[n, s["last"], s["min"], s["max"], s["count"], s["last_step"]] for n, s in summary.items()]
    return summary, table(["METRIC", "LAST", "MIN", "MAX", "COUNT", "LAST STEP"], rows)


def cmd_lineage(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    _known(t, args.RUN_ID)
    lineage: Lineage = t.lineage(args.RUN_ID)

    def edge(s: Any) -> str:
        return s.source_run_id + (f"  [{s.artifact_name}]" if s.artifact_name else "")

    lines = [args.RUN_ID]
    for title, edges in (("parents", lineage.parents), ("descendants", lineage.descendants)):
        lines.append(f"├── {title}" if title == "parents" else f"└── {title}")
        bar = "│   " if title == "parents" else "    "
        for i, s in enumerate(edges):
            lines.append(f"{bar}{'└── ' if i == len(edges) - 1 else '├── '}{edge(s)}")
    data = {
        "run_id": args.RUN_ID,
        "parents": [{"run_id": s.source_run_id, "artifact": s.artifact_name} for s in lineage.parents],
        "descendants": [
            {"run_id": s.source_run_id, "artifact": s.artifact_name} for s in lineage.descendants
        ],
    }
    return data, "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="async-tracker", description=__doc__.split("\n\n")[0])
    p.add_argument("--tracker", help="tracker factory name or module:attr (default: configured)")
    p.add_argument("--config", help="config string for --tracker (e.g. a config file path)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub = p.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("list", help="list jobs, metadata, artifacts or metrics")
    ls_sub = ls.add_subparsers(dest="what", required=True)
    jobs = ls_sub.add_parser("jobs", help="run ids in the store")
    jobs.add_argument("--parent-run-id", help="only the runs with this parent")
    jobs.set_defaults(func=cmd_jobs)
    md = ls_sub.add_parser("metadata", help="a run's metadata")
    md.add_argument("RUN_ID")
    md.set_defaults(func=cmd_metadata)
    arts = ls_sub.add_parser("artifacts", help="a run's artifacts")
    arts.add_argument("--artifact", help="only the artifact with this name")
    arts.add_argument("RUN_ID")
    arts.set_defaults(func=cmd_artifacts)
    mets = ls_sub.add_parser("metrics", help="a run's metrics: last, min, max, count, last step")
    mets.add_argument("RUN_ID")
    mets.set_defaults(func=cmd_metrics)

    lin = sub.add_parser("lineage", help="a run's parents and descendants as a tree")
    lin.add_argument("RUN_ID")
    lin.set_defaults(func=cmd_lineage)
    for sp in (jobs, md, arts, mets, lin):
        # Accepted after the subcommand too, as scripts tend to put it last.
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        tracker = _tracker(args)
        data, text = args.func(tracker, args)
    except (CliError, TrackerError) as exc:
        print(f"async-tracker: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=2, default=str) if args.json else text)
    return 0
