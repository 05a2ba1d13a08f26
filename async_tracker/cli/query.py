"""Reading what runs recorded: ``list jobs|metadata|artifacts|metrics`` and ``lineage``.

``list`` keeps the arguments and columns of ``torchx tracker list``; ``list metrics`` and
``lineage`` are new.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from typing import Any

from async_tracker.cli.common import (
    CliError,
    cell,
    check_known,
    clip,
    resolve_runs,
    run_query,
    table,
    to_json,
    warn,
)
from async_tracker.records import TrackerMetric, TrackerSource
from async_tracker.store.expr import (
    FilterError,
    differing_params,
    parse_filter,
    parse_sort,
    unknown_keys,
)
from async_tracker.store.summary import MetricSummary, RunSummary
from async_tracker.store.sync_reader import Reader
from async_tracker.tags import split_metadata


def cmd_jobs(t: Reader, args: argparse.Namespace) -> tuple[object, str]:
    if args.limit < 0:
        raise CliError(f"--limit must be 0 (all) or more, got {args.limit}")
    children = set(t.run_ids(parent_run_id=args.parent_run_id)) if args.parent_run_id else None
    try:
        # The newest N, unfiltered (the default), cost summaries of the N runs shown alone.
        shown, left_out = t.select_runs(args.filter, args.sort, args.limit, children)
    except FilterError as exc:
        # Its first line says where and what was expected; the rest repeats the text.
        raise CliError(str(exc).splitlines()[0]) from None
    for line in _unknown_keys(t, args.filter, args.sort, shown):
        warn(line)
    # The params that tell the listed runs apart (a lone run: all of its own).
    keys = (differing_params(shown) if len(shown) > 1 else list(shown[0].params) if shown
            else [])[:MAX_PARAMS]  # fmt: skip
    rows = [
        [
            r.run_id,
            _time(r.start),
            _duration(r.duration_s),
            status_cell(r),
            _pairs({k: r.params[k] for k in keys if k in r.params}),
            _pairs({n: m.last for n, m in list(r.metrics.items())[:MAX_COLUMNS]}),
        ]
        for r in shown
    ]
    headers = ["RUN ID", "STARTED", "DURATION", "STATUS", "PARAMS", "LAST METRICS"]
    text = table(headers, rows)
    if left_out:
        text += (
            f"\n({left_out} more run{'s' if left_out > 1 else ''} not shown: "
            f"--limit N shows more, --limit 0 all)"
        )
        if args.json:
            warn(f"{left_out} more runs not listed (--limit 0 lists all)")
    return [summary_row(r) for r in shown], text


def _unknown_keys(
    t: Reader, filter: str | None, sort: str | None, shown: Sequence[RunSummary]
) -> list[str]:
    """A line per param or metric the filter or sort key names that no run has (with the
    nearest names): a typo would give an empty or unsorted list and say nothing. Looked up
    in the runs shown first; the whole store is read only when one is missing there."""
    keys = [*(parse_filter(filter).keys if filter else ()), *(parse_sort(sort).keys if sort
            else ())]  # fmt: skip
    if not unknown_keys(keys, shown) and shown:
        return []
    return unknown_keys(keys, t.run_summaries())


# At most this many metrics in a row of ``list jobs``, and params that differ between the
# runs listed (--json has them all).
MAX_COLUMNS = 3
MAX_PARAMS = 6
DEFAULT_LIMIT = 50


def run_row(t: Reader, run_id: str) -> dict[str, Any]:
    """:func:`summary_row` of the run ``run_id`` (a CliError if the store lacks it)."""
    r = t.run_summary(run_id)
    if r is not None:
        return summary_row(r)
    raise CliError(f"unknown run id {run_id!r}: `async-tracker list jobs` lists the runs")


def status_cell(r: RunSummary) -> str:
    """The run's status as ``list jobs`` shows it: with what ended a run that failed or was
    killed, when known (``failed (ValueError: bad lr)``, ``killed (SIGTERM)``)."""
    cause = r.cause if r.status in ENDED_BADLY else ""
    return f"{r.status} ({cause})" if cause else r.status


# The statuses whose runs may say what ended them (RunSummary.ending): looked up for those
# alone, which a long listing's runs mostly are not.
ENDED_BADLY = ("failed", "killed")


def summary_row(r: RunSummary) -> dict[str, Any]:
    """What ``list jobs --json`` gives of a run: every field of its summary. ``metrics``
    holds each metric's last value, ``metric_summaries`` its last, min, max, count and last
    step. ``start`` is its first point's time (or its first write's), ``end`` when it
    ended (None while running), ``heartbeat`` when a writer last wrote or beat. ``ending``
    is what ended a run that failed or was killed (``reason``, and the exception's ``type``
    and ``message``, or the signal as ``message``), when known, else empty."""
    return {
        "run_id": r.run_id,
        "start": r.start,
        "end": r.end,
        "duration_s": r.duration_s,
        "status": r.status,
        "ending": dict(r.ending) if r.status in ENDED_BADLY else {},
        "heartbeat": r.heartbeat,
        "params": dict(r.params),
        "tags": sorted(r.tags),
        "note": r.note,
        "metrics": {name: m.last for name, m in r.metrics.items()},
        "metric_summaries": {name: _stats_of(m) for name, m in r.metrics.items()},
    }


def _stats_of(m: MetricSummary) -> dict[str, object]:
    return {"last": m.last, "min": m.min, "max": m.max, "count": m.count, "last_step": m.last_step}


def _pairs(values: dict[str, object]) -> str:
    # Each value cut as a cell is: the table cuts the whole again.
    return " ".join(f"{k}={clip(cell(v))}" for k, v in values.items())


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


def cmd_metadata(t: Reader, args: argparse.Namespace) -> tuple[object, str]:
    # Tags and the note are reserved keys of the metadata: list jobs and tag show them.
    md = split_metadata(t.metadata(check_known(t, args.RUN_ID)))[0]
    return md, table(["ID", "VALUE"], [[k, v] for k, v in md.items()])


def cmd_artifacts(t: Reader, args: argparse.Namespace) -> tuple[object, str]:
    run_id = check_known(t, args.RUN_ID)
    arts = [a for a in t.artifacts(run_id).values() if not args.artifact or a.name == args.artifact]
    data = [{"name": a.name, "path": a.path, "metadata": a.metadata} for a in arts]
    rows = [[a.name, a.path, a.metadata] for a in arts]
    return data, table(["ARTIFACT", "PATH", "METADATA"], rows, names=(0, 1))


def read_metrics(t: Reader, run_id: str) -> dict[str, Sequence[TrackerMetric]]:
    """A run's metric curves (none from a tracker that keeps no metrics: a plain torchx
    ``TrackerBase``)."""
    return {name: pts for name, pts in t.metrics(run_id).items() if pts}


def metric_summary(points: Sequence[TrackerMetric]) -> dict[str, Any]:
    values = [p.value for p in points if not math.isnan(p.value)]
    return {
        "last": points[-1].value,
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
        "count": len(points),
        "last_step": points[-1].step,
    }


def cmd_metrics(t: Reader, args: argparse.Namespace) -> tuple[object, str]:
    run_id = check_known(t, args.RUN_ID)
    summary = {name: metric_summary(pts) for name, pts in read_metrics(t, run_id).items()}
    rows = [
        [n, s["last"], s["min"], s["max"], s["count"], s["last_step"]] for n, s in summary.items()
    ]
    return summary, table(["METRIC", "LAST", "MIN", "MAX", "COUNT", "LAST STEP"], rows)


# -- lineage ---------------------------------------------------------------------------------


def _walk(
    t: Reader, edge: TrackerSource, key: str, depth: int, path: frozenset[str]
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


def cmd_lineage(t: Reader, args: argparse.Namespace) -> tuple[object, str]:
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


def cmd_compare(t: Reader, args: argparse.Namespace) -> tuple[object, str]:
    if args.group is not None:
        return compare_groups(t, args)
    if args.filter is not None:
        raise CliError("compare: --filter chooses the runs of --group KEY; name runs otherwise")
    if not args.RUN_ID:
        raise CliError("compare: give the runs to compare (ids or names), or --group KEY")
    run_ids = resolve_runs(t, args.RUN_ID)
    params = {r: split_metadata(t.metadata(r))[0] for r in run_ids}
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


def compare_groups(t: Reader, args: argparse.Namespace) -> tuple[object, str]:
    """``compare --group KEY``: the runs (those named, else those ``--filter`` accepts, else
    all) grouped by their value of the param KEY, side by side: per metric the mean of the
    runs' last values, their spread (lowest to highest last) and the group's min and max,
    from the run summaries (no point is read). Runs without KEY form a group of their own."""
    key = args.group
    if not key:
        raise CliError("compare: --group takes a param's name, got ''")
    if args.RUN_ID:
        if args.filter is not None:
            raise CliError("compare: name runs, or choose them with --filter, not both")
        runs, _ = t.select_runs(None, None, None, resolve_runs(t, args.RUN_ID))
    else:
        try:
            runs, _ = t.select_runs(args.filter, None, None)
        except FilterError as exc:
            raise CliError(f"compare: --filter: {exc}") from exc
    if not runs:
        raise CliError("compare: no run to group" + (" (the filter accepts none)"
                                                     if args.filter else ""))  # fmt: skip
    missing = object()
    groups: dict[str, list[RunSummary]] = {}
    for run in sorted(runs, key=lambda r: r.run_id):
        value = run.params.get(key, missing)
        label = f"{key}={cell(value)}" if value is not missing else f"{key} unset"
        groups.setdefault(label, []).append(run)
    if all(label == f"{key} unset" for label in groups):
        raise CliError(f"compare: no run has the param {key!r}")
    labels = sorted(groups, key=lambda g: (g.endswith(" unset"), _number_first(g)))
    names = sorted({n for rs in groups.values() for r in rs for n in r.metrics})
    data: dict[str, Any] = {"group": key, "groups": {}}
    rows: list[list[object]] = [["runs", "", *(len(groups[g]) for g in labels)]]
    stats: dict[str, dict[str, dict[str, float | None]]] = {}
    for label in labels:
        per_metric: dict[str, dict[str, float | None]] = {}
        for name in names:
            summaries = [r.metrics[name] for r in groups[label] if name in r.metrics]
            lasts = [m.last for m in summaries if m.last is not None and not math.isnan(m.last)]
            lows = [m.min for m in summaries if m.min is not None and not math.isnan(m.min)]
            highs = [m.max for m in summaries if m.max is not None and not math.isnan(m.max)]
            per_metric[name] = {
                "runs": len(summaries),
                "last_mean": sum(lasts) / len(lasts) if lasts else None,
                "last_min": min(lasts, default=None),
                "last_max": max(lasts, default=None),
                "min": min(lows, default=None),
                "max": max(highs, default=None),
            }
        stats[label] = per_metric
        data["groups"][label] = {"runs": [r.run_id for r in groups[label]], "metrics": per_metric}
    shown = (("last_mean", "last, mean"), ("last_min", "last, lowest"),
             ("last_max", "last, highest"), ("min", "min"), ("max", "max"))  # fmt: skip
    for name in names:
        for stat, title in shown:
            rows.append([name, title, *(stats[g][name][stat] for g in labels)])
    return data, table(["METRIC", "", *labels], rows)


def _number_first(label: str) -> tuple[int, float, str]:
    """Groups in the order of their values: numbers by value, then text."""
    value = label.split("=", 1)[-1]
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


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
        help="runs, newest first: id, start, duration, status, params that differ, last "
        "metrics",
    )
    jobs.add_argument("--parent-run-id", help="only the runs with this parent")
    jobs.add_argument(
        "--filter",
        metavar="EXPR",
        help="only the runs EXPR accepts: lr>0.01, status==crashed, tag:baseline, "
        "loss.min<0.2, acc.last>=0.9, with and, or, not and parentheses",
    )
    jobs.add_argument(
        "--sort",
        metavar="[-]KEY",
        help="order by KEY (start, end, duration, status, id, a param, METRIC.last|min|max|"
        "count|step); --sort -KEY from largest to smallest (default: newest first)",
    )
    jobs.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"the N newest runs (default: {DEFAULT_LIMIT}; 0: all)",
    )
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
        help="params that differ and last/min/max of each metric, runs side by side; "
        "--group KEY: groups of runs (by a param) side by side",
    )
    cmp.add_argument("RUN_ID", nargs="*", help="runs to compare (ids, names or unique prefixes)")
    cmp.add_argument(
        "--group",
        metavar="KEY",
        help="group the runs by their value of the param KEY (all seeds of one lr): per group "
        "and metric, the mean of the last values, their spread, min and max. Without runs "
        "named: every run, or those --filter accepts",
    )
    cmp.add_argument(
        "--filter", metavar="EXPR", help="with --group: the runs to group (as list jobs --filter)"
    )
    cmp.set_defaults(func=run_query(cmd_compare))

    lin = sub.add_parser(
        "lineage", parents=[common], help="a run's parents and descendants as a tree"
    )
    lin.add_argument("RUN_ID")
    lin.add_argument(
        "--depth", type=int, default=8, help="levels of parents and descendants (default: 8)"
    )
    lin.set_defaults(func=run_query(cmd_lineage))
