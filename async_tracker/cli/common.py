"""What every subcommand shares: the user-facing error, the tracker to read, tables, output."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from async_tracker.adapters import as_sync
from async_tracker.base import TrackerBase
from async_tracker.config import TrackerSpec, configured_trackers, resolve_tracker

# Exit codes: 2 is a usage problem (argparse's own code too), 1 a store that failed us.
EXIT_USAGE = 2
EXIT_FAILURE = 1

NO_TRACKER_HELP = (
    "no tracker configured: set [torchx:tracker] in .torchxconfig, or TORCHX_TRACKERS, "
    "or pass --tracker NAME --config CFG"
)


class CliError(Exception):
    """A message for the user, printed without a traceback; the exit code is 2."""


def tracker_specs(args: argparse.Namespace) -> list[TrackerSpec]:
    """``--tracker NAME --config CFG`` if given, else every configured tracker."""
    if args.tracker:
        return [resolve_tracker(args.tracker, args.config)]
    if args.config:
        raise CliError("--config needs --tracker NAME")
    specs = configured_trackers()
    if not specs:
        raise CliError(NO_TRACKER_HELP)
    return specs


def open_tracker(args: argparse.Namespace) -> TrackerBase:
    """The tracker to read: the one ``--tracker`` names, else the first configured one."""
    # A read-only command builds the tracker and never closes it: closing some backends
    # has effects (MLflow's marks a run finished), and the process exits right after.
    return as_sync(tracker_specs(args)[0].build())


def check_known(tracker: TrackerBase, run_id: str) -> None:
    if run_id not in set(tracker.run_ids()):
        raise CliError(f"unknown run id {run_id!r}: `async-tracker list jobs` lists the runs")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table like torchx's: left-aligned columns, a dashed rule under headers."""
    cells = [[str(h) for h in headers], *[[cell(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "" if value is None else str(value)


def to_json(data: object, indent: int | None = 2) -> str:
    """JSON for scripts. NaN and infinities become null: strict parsers reject the bare
    ``NaN`` and ``Infinity`` tokens Python writes. Done by the C encoder and decoder, with no
    Python recursion: a value nested as deep as a store's reader takes prints."""
    text = json.dumps(data, default=str)
    if "NaN" in text or "Infinity" in text:  # else nothing to replace (the common case)
        data = json.loads(text, parse_constant=lambda _: None)
    return json.dumps(data, indent=indent, default=str)


Query = Callable[[TrackerBase, argparse.Namespace], "tuple[object, str]"]


def run_query(query: Query) -> Callable[[argparse.Namespace], int]:
    """A command that reads the store: ``query`` returns (data for --json, text for humans)."""

    def command(args: argparse.Namespace) -> int:
        data, text = query(open_tracker(args), args)
        print(to_json(data) if args.json else text)
        return 0

    return command


def warn(message: str) -> None:
    print(f"async-tracker: {message}", file=sys.stderr, flush=True)
