"""Reading what runs recorded: ``list jobs|metadata|artifacts|metrics`` and ``lineage``.

``list`` keeps the arguments and columns of ``torchx tracker list``; ``list metrics`` and
``lineage`` are new.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

from async_tracker.base import TrackerBase
from async_tracker.cli.common import CliError, check_known, run_query, table
from async_tracker.records import TrackerMetric, TrackerSource


def cmd_jobs(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    ids = list(t.run_ids(parent_run_id=args.parent_run_id) if args.parent_run_id else t.run_ids())
    return ids, table(["JOB ID"], [[i] for i in ids])


def cmd_metadata(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    check_known(t, args.RUN_ID)
    md = dict(t.metadata(args.RUN_ID))
    return md, table(["ID", "VALUE"], [[k, v] for k, v in md.items()])


def cmd_artifacts(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    check_known(t, args.RUN_ID)
    arts = [
        a for a in t.artifacts(args.RUN_ID).values() if not args.artifact or a.name == args.artifact
    ]
    data = [{"name": a.name, "path": a.path, "metadata": a.metadata} for a in arts]
    rows = [[a.name, a.path, a.metadata] for a in arts]
    return data, table(["ARTIFACT", "PATH", "METADATA"], rows)


def read_metrics(t: TrackerBase, run_id: str) -> dict[str, Sequence[TrackerMetric]]:
    """A run's metric curves, or a :class:`CliError` when the tracker keeps no metrics (a
    plain torchx ``TrackerBase``)."""
    read: Callable[[str], Any] | None = getattr(t, "metrics", None)
    if not callable(read):
        raise CliError(f"tracker {t!r} does not store metrics")
    return {name: pts for name, pts in read(run_id).items() if pts}


def metric_summary(points: Sequence[TrackerMetric]) -> dict[str, Any]:
    values = [p.value for p in points if not math.isnan(p.value)]
    return {
        "last": points[-1].value,
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
        "count": len(points),
        "last_step": points[-1].step,
    }


def cmd_metrics(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    check_known(t, args.RUN_ID)
    summary = {name: metric_summary(pts) for name, pts in read_metrics(t, args.RUN_ID).items()}
    rows = [
        [n, s["last"], s["min"], s["max"], s["count"], s["last_step"]] for n, s in summary.items()
    ]
    return summary, table(["METRIC", "LAST", "MIN", "MAX", "COUNT", "LAST STEP"], rows)


# -- lineage ---------------------------------------------------------------------------------


def _walk(
    t: TrackerBase, edge: TrackerSource, key: str, depth: int, path: frozenset[str]
) -> dict[str, Any]:
    """One edge and, ``depth`` levels on, the edges of the run it points to. ``path`` holds
    the runs above, so a cycle in the store ends the walk instead of looping."""
    node: dict[str, Any] = {"run_id": edge.source_run_id, "artifact": edge.artifact_name}
    if edge.source_run_id in path:
        node["cycle"] = True
        return node
    if depth > 1:
        lineage = t.lineage(edge.source_run_id)
        edges = lineage.parents if key == "parents" else lineage.descendants
        node[key] = [_walk(t, e, key, depth - 1, path | {edge.source_run_id}) for e in edges]
    return node


def _tree_lines(nodes: Sequence[dict[str, Any]], key: str, prefix: str) -> list[str]:
    lines = []
    for i, node in enumerate(nodes):
        last = i == len(nodes) - 1
        label = node["run_id"]
        if node["artifact"]:
            label += f"  [{node['artifact']}]"
        if node.get("cycle"):
            label += "  (cycle)"
        lines.append(f"{prefix}{'└── ' if last else '├── '}{label}")
        lines += _tree_lines(node.get(key, []), key, prefix + ("    " if last else "│   "))
    return lines


def cmd_lineage(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    if args.depth < 1:
        raise CliError(f"--depth must be at least 1, got {args.depth}")
    lineage = t.lineage(args.RUN_ID)
    if not lineage.descendants:  # a source that never ran here (a data set) has descendants
        check_known(t, args.RUN_ID)
    root = frozenset([args.RUN_ID])
    data = {
        "run_id": args.RUN_ID,
        "parents": [_walk(t, e, "parents", args.depth, root) for e in lineage.parents],
        "descendants": [_walk(t, e, "descendants", args.depth, root) for e in lineage.descendants],
    }
    lines = [args.RUN_ID, "├── parents"]
    lines += _tree_lines(data["parents"], "parents", "│   ")
    lines.append("└── descendants")
    lines += _tree_lines(data["descendants"], "descendants", "    ")
    return data, "\n".join(lines)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    ls = sub.add_parser("list", help="list jobs, metadata, artifacts or metrics")
    ls_sub = ls.add_subparsers(dest="what", required=True)
    jobs = ls_sub.add_parser("jobs", parents=[common], help="run ids in the store")
    jobs.add_argument("--parent-run-id", help="only the runs with this parent")
    jobs.set_defaults(func=run_query(cmd_jobs))
    md = ls_sub.add_parser("metadata", parents=[common], help="a run's metadata")
    md.add_argument("RUN_ID")
    md.set_defaults(func=run_query(cmd_metadata))
    arts = ls_sub.add_parser("artifacts", parents=[common], help="a run's artifacts")
    arts.add_argument("--artifact", help="only the artifact with this name")
    arts.add_argument("RUN_ID")
    arts.set_defaults(func=run_query(cmd_artifacts))
    mets = ls_sub.add_parser(
        "metrics", parents=[common], help="a run's metrics: last, min, max, count, last step"
    )
    mets.add_argument("RUN_ID")
    mets.set_defaults(func=run_query(cmd_metrics))

    lin = sub.add_parser(
        "lineage", parents=[common], help="a run's parents and descendants as a tree"
    )
    lin.add_argument("RUN_ID")
    lin.add_argument(
        "--depth", type=int, default=8, help="levels of parents and descendants (default: 8)"
    )
    lin.set_defaults(func=run_query(cmd_lineage))
