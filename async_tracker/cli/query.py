"""Reading what runs recorded: ``list jobs|metadata|artifacts|metrics`` and ``lineage``.

``list`` keeps the arguments and columns of ``torchx tracker list``; ``list metrics`` and
``lineage`` are new.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from async_tracker.base import TrackerBase
from async_tracker.cli.common import (
    CliError,
    cell,
    check_known,
    resolve_runs,
    run_query,
    run_status,
    table,
    to_json,
)
from async_tracker.records import TrackerMetric, TrackerSource


def cmd_jobs(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    ids = list(t.run_ids(parent_run_id=args.parent_run_id) if args.parent_run_id else t.run_ids())
    runs = [run_row(t, run_id) for run_id in ids]
    rows = [
        [
            r["run_id"],
            _time(r["start"]),
            _duration(r["duration_s"]),
            r["status"],
            _pairs(_few_params(r["params"])),
            _pairs(dict(list(r["metrics"].items())[:MAX_COLUMNS])),
        ]
        for r in runs
    ]
    headers = ["RUN ID", "STARTED", "DURATION", "STATUS", "PARAMS", "LAST METRICS"]
    return runs, table(headers, rows)


# At most this many params and metrics in a row of ``list jobs`` (--json has them all).
MAX_COLUMNS = 3


def run_row(t: TrackerBase, run_id: str) -> dict[str, Any]:
    """What ``list jobs`` shows of a run. Start and end come from its metric timestamps (the
    client's clock at each log call), the end from its recorded ending when there is one."""
    curves = read_metrics(t, run_id) if callable(getattr(t, "metrics", None)) else {}
    stamps = [p.timestamp for pts in curves.values() for p in pts]
    ended = run_status(t, run_id)
    status, end = ended if ended is not None else ("", None)
    start = min(stamps) if stamps else None
    if end is None and stamps:
        end = max(stamps)
    return {
        "run_id": run_id,
        "start": start,
        "end": end,
        "duration_s": end - start if start is not None and end is not None else None,
        "status": status,
        "params": dict(t.metadata(run_id)),
        "metrics": {name: pts[-1].value for name, pts in curves.items()},
    }


def _few_params(params: dict[str, object]) -> dict[str, object]:
    """The ``MAX_COLUMNS`` params with the shortest values (first keys first among equals),
    in their recorded order: short values are the hyperparameters a person scans for."""
    shortest = sorted(params, key=lambda k: len(cell(params[k])))[:MAX_COLUMNS]
    return {k: params[k] for k in params if k in shortest}


def _pairs(values: dict[str, object]) -> str:
    return " ".join(f"{k}={cell(v)}" for k, v in values.items())


def _time(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def cmd_metadata(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    md = dict(t.metadata(check_known(t, args.RUN_ID)))
    return md, table(["ID", "VALUE"], [[k, v] for k, v in md.items()])


def cmd_artifacts(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    run_id = check_known(t, args.RUN_ID)
    arts = [a for a in t.artifacts(run_id).values() if not args.artifact or a.name == args.artifact]
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
    run_id = check_known(t, args.RUN_ID)
    summary = {name: metric_summary(pts) for name, pts in read_metrics(t, run_id).items()}
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
    run_id = args.RUN_ID
    lineage = t.lineage(run_id)
    if not lineage.descendants:  # a source that never ran here (a data set) has descendants
        run_id = check_known(t, run_id)
        if run_id != args.RUN_ID:  # a prefix: read the run it names
            lineage = t.lineage(run_id)
    root = frozenset([run_id])
    data = {
        "run_id": run_id,
        "parents": [_walk(t, e, "parents", args.depth, root) for e in lineage.parents],
        "descendants": [_walk(t, e, "descendants", args.depth, root) for e in lineage.descendants],
    }
    lines = [run_id, "├── parents"]
    lines += _tree_lines(data["parents"], "parents", "│   ")
    lines.append("└── descendants")
    lines += _tree_lines(data["descendants"], "descendants", "    ")
    return data, "\n".join(lines)


# -- compare ---------------------------------------------------------------------------------


def cmd_compare(t: TrackerBase, args: argparse.Namespace) -> tuple[object, str]:
    run_ids = resolve_runs(t, args.RUN_ID)
    params = {r: dict(t.metadata(r)) for r in run_ids}
    keys = list(dict.fromkeys(k for md in params.values() for k in md))
    missing = object()
    differ = {
        k: {r: params[r].get(k) for r in run_ids}
        for k in keys
        if len({to_json(params[r].get(k, missing), None) for r in run_ids}) > 1
    }
    curves = {r: read_metrics(t, r) for r in run_ids}
    names = list(dict.fromkeys(n for c in curves.values() for n in c))
    metrics = {
        n: {r: _stats(curves[r][n]) if n in curves[r] else None for r in run_ids} for n in names
    }
    rows: list[list[object]] = [[k, "", *vals.values()] for k, vals in differ.items()]
    for n, per_run in metrics.items():
        for stat in ("last", "min", "max"):
            rows.append([n, stat, *(s[stat] if s else None for s in per_run.values())])
    text = table(["PARAM / METRIC", "", *run_ids], rows)
    if not differ:
        text += "\n(no param differs)"
    return {"runs": run_ids, "params": differ, "metrics": metrics}, text


def _stats(points: Sequence[TrackerMetric]) -> dict[str, float]:
    summary = metric_summary(points)
    return {k: summary[k] for k in ("last", "min", "max")}


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    ls = sub.add_parser("list", help="list jobs, metadata, artifacts or metrics")
    ls_sub = ls.add_subparsers(dest="what", required=True)
    jobs = ls_sub.add_parser(
        "jobs",
        parents=[common],
        help="runs: id, start, duration, status, a few params, last metrics",
    )
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

    cmp = sub.add_parser(
        "compare",
        parents=[common],
        help="params that differ and last/min/max of each metric, runs side by side",
    )
    cmp.add_argument("RUN_ID", nargs="+", help="runs to compare (ids or unique prefixes)")
    cmp.set_defaults(func=run_query(cmd_compare))

    lin = sub.add_parser(
        "lineage", parents=[common], help="a run's parents and descendants as a tree"
    )
    lin.add_argument("RUN_ID")
    lin.add_argument(
        "--depth", type=int, default=8, help="levels of parents and descendants (default: 8)"
    )
    lin.set_defaults(func=run_query(cmd_lineage))
