"""What every subcommand shares: the user-facing error, the tracker to read, tables, output."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import sys
from collections.abc import Callable, Collection, Iterator, Sequence

from fsspec.implementations.local import LocalFileSystem

from async_tracker.adapters import as_async, as_sync
from async_tracker.base import AsyncTrackerBase, TrackerBase
from async_tracker.config import TrackerSpec, configured_trackers, resolve_tracker
from async_tracker.errors import BackendError, ReadTimeoutError
from async_tracker.store.open import ENV_DIR, open_reader, open_store, store_dir
from async_tracker.store.sync_reader import Reader

# Exit codes: 2 is a usage problem (argparse's own code too), 1 a store that failed us.
EXIT_USAGE = 2
EXIT_FAILURE = 1

NO_TRACKER_HELP = (
    "no tracker configured: set [torchx:tracker] in .torchxconfig, or TORCHX_TRACKERS, "
    "or pass --tracker NAME --config CFG (or --store URL)"
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


def tracker_and_label(args: argparse.Namespace) -> tuple[TrackerBase, str]:
    """The tracker a command writes to (``tag``, ``rm``), and what to call it in an error:
    see :func:`backend_and_label`."""
    backend, label = backend_and_label(args)
    return as_sync(backend), label


def reader_for(args: argparse.Namespace) -> Reader:
    """The reader of the store a read command reads (see :func:`backend_and_label`), each
    read bounded by ``--timeout``."""
    backend, label = backend_and_label(args)
    timeout = getattr(args, "timeout", None)
    return open_reader(backend, timeout=timeout, label=label)


def backend_and_label(args: argparse.Namespace) -> tuple[AsyncTrackerBase, str]:
    """The backend to read: ``--tracker``/``--config`` if given, else ``--store``, else the
    first tracker configured the torchx way, else the default store (``init``'s:
    ``$ASYNC_TRACKER_DIR`` or ``./tracker_runs``)."""
    # A command builds the backend and never closes it: closing some backends has effects
    # (MLflow's marks a run finished), and the process exits right after.
    if args.tracker or args.config:
        spec = tracker_specs(args)[0]
        return as_async(spec.build()), f"tracker {spec.name!r}"
    store = getattr(args, "store", None)
    if store is None:
        specs = configured_trackers()
        if specs:
            return as_async(specs[0].build()), f"tracker {specs[0].name!r}"
    url = store_dir(store)
    # The metric codec (numpy, pyarrow) loads at the first read of points, in a worker
    # thread, not when the store is made: `list jobs` reads the run index alone. (A job's
    # store loads it on the job's thread, for how an uncaught Ctrl-C ends the process:
    # runtime.process.import_here. main() catches Ctrl-C.)
    backend = open_store(url, load_codec=False)
    if isinstance(backend.fs, LocalFileSystem):
        _check_local_store(backend.root_dir, url, explicit=store is not None or bool(
            os.environ.get(ENV_DIR)
        ))
    return backend, f"store {url}"


def timeout_arg(text: str) -> float:
    """``--timeout``: a number of seconds > 0 (``inf``: no deadline)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def _check_local_store(root: str, url: str, explicit: bool) -> None:
    """A :class:`StoreError` for a local store that cannot be read: a path named by
    ``--store`` or ``$ASYNC_TRACKER_DIR`` that is missing (a typo must not read as an empty
    store), a file, a folder we may not list. The default ``./tracker_runs`` missing is no
    error: no run was stored here yet (a line on stderr says so)."""
    if not os.path.exists(root):
        if explicit:
            raise StoreError(f"cannot read the store {url}: no such directory")
        warn(f"no runs yet: {url} does not exist (async_tracker.init() writes there; "
             "--store PATH reads another store)")
        return
    if not os.path.isdir(root):
        raise StoreError(f"cannot read the store {url}: not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise StoreError(f"cannot read the store {url}: permission denied")


class StoreError(Exception):
    """The store could not be read (unreachable, refused): one line, exit code 1."""


@contextlib.contextmanager
def read_or_fail(label: str) -> Iterator[None]:
    """Turns a failed read of the store (unreachable, refused) into one line naming it."""
    try:
        yield
    except ReadTimeoutError as exc:
        raise StoreError(str(exc)) from None
    except (BackendError, OSError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if len(reason) > 200:
            reason = reason[:197] + "..."
        raise StoreError(f"cannot read the {label}: {reason}") from exc


def resolve_run(reader: Reader, run_id: str, ids: Sequence[str] | None = None) -> str:
    """``run_id`` if the store holds it, else the one run whose id starts with it; a
    :class:`CliError` when none or several do."""
    if not run_id.strip():
        # Every id starts with "": an unset shell variable ($RUN) must not name a run.
        raise CliError(f"a run id must not be empty or blank, got {run_id!r}")
    known = reader.run_ids() if ids is None else list(ids)
    if run_id in known:
        return run_id
    matches = sorted(i for i in known if i.startswith(run_id))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CliError(f"unknown run id {run_id!r}: `async-tracker list jobs` lists the runs")
    shown = ", ".join(matches[:3]) + (", ..." if len(matches) > 3 else "")
    raise CliError(f"run id prefix {run_id!r} matches {len(matches)} runs: {shown}")


# The end of a run id ``init()`` made, ``<project>/<name>-<6 hex digits>``: what comes before
# it is the run's name, which runs of the same script share.
_INIT_ID_SUFFIX = re.compile(r"-[0-9a-f]{6}\Z")


def run_name(run_id: str) -> str | None:
    """The name ``init()`` gave a run (``mnist/lr-0.1`` of ``mnist/lr-0.1-a1b2c3``), or None
    for an id it did not make."""
    match = _INIT_ID_SUFFIX.search(run_id)
    return run_id[: match.start()] if match else None


def resolve_runs(reader: Reader, run_ids: Sequence[str]) -> list[str]:
    """Each of ``run_ids`` resolved, duplicates dropped: a run id; else a run name
    (``mnist/lr-0.1``: ``init()``'s id without its 6 hex digits), the newest run of that name
    when several have it (said on stderr, one line); else a unique prefix (see
    :func:`resolve_run`)."""
    for wanted in run_ids:
        if not wanted.strip():
            raise CliError(f"a run id must not be empty or blank, got {wanted!r}")
    known = reader.run_ids()
    by_name: dict[str, list[str]] = {}
    for run_id in known:
        name = run_name(run_id)
        if name is not None:
            by_name.setdefault(name, []).append(run_id)
    resolved = []
    for wanted in run_ids:
        named = by_name.get(wanted, []) if wanted not in known else []
        if len(named) > 1:
            # Like `wandb` and MLflow's UI, a name means its latest run: running a script
            # twice must not make the README's `compare NAME NAME` fail.
            newest = _newest(reader, named)
            warn(
                f"{wanted!r} is the name of {len(named)} runs: using the newest, {newest} "
                "(give a run id to pick another)"
            )
            resolved.append(newest)
        elif named:
            resolved.append(named[0])
        else:
            resolved.append(resolve_run(reader, wanted, known))
    return list(dict.fromkeys(resolved))


def _newest(reader: Reader, run_ids: Sequence[str]) -> str:
    """The run of ``run_ids`` that started last (by the store's summaries)."""
    runs, _ = reader.newest_runs(1, set(run_ids))
    return runs[0].run_id if runs else sorted(run_ids)[-1]


def check_known(reader: Reader, run_id: str) -> str:
    """The run ``run_id`` names, by the one rule every command follows (see
    :func:`resolve_runs`): a run id, a run name (its newest run, said on stderr), or a unique
    prefix."""
    return resolve_runs(reader, [run_id])[0]


# The widest a table shows a cell, in characters; longer text is cut in the middle ("...").
# A table's lines, and the memory it takes, are then bounded by what it shows, whatever a run
# holds (a 2 MB config): never rows x the widest cell. --json prints every value whole. Names
# (the first column: run ids, keys; the headers: compare's run ids; artifacts' paths) get
# more room, to be read and copied whole.
MAX_CELL_CHARS = 60
MAX_ID_CHARS = 200
ELLIPSIS = "..."
# A cell is one line: line breaks and tabs in a value show as spaces.
_ONE_LINE = str.maketrans("\n\r\t\v\f", "     ")


def clip(text: str, limit: int = MAX_CELL_CHARS) -> str:
    """``text`` as a table shows it: on one line, at most ``limit`` characters. Longer text
    is cut in the middle, where "..." stands: its start and its end show (a path's file
    name, the suffix of a run id, the closing keys of a config)."""
    if len(text) > limit:
        head = (limit - len(ELLIPSIS) + 1) // 2
        tail = limit - len(ELLIPSIS) - head
        text = text[:head] + ELLIPSIS + text[len(text) - tail :]
    return text.translate(_ONE_LINE)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], names: Collection[int] = (0,)
) -> str:
    """A plain-text table like torchx's: left-aligned columns, a dashed rule under headers.
    Each cell is cut to :data:`MAX_CELL_CHARS` (see :func:`clip`); the headers and the
    columns ``names`` (by position; the first) hold names, cut to :data:`MAX_ID_CHARS`."""
    limits = [MAX_ID_CHARS if i in names else MAX_CELL_CHARS for i in range(len(headers))]
    cells = [
        [clip(str(h), MAX_ID_CHARS) for h in headers],
        *[[clip(cell(c), limit) for c, limit in zip(r, limits)] for r in rows],
    ]
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


def print_json(data: object) -> None:
    """Prints :func:`to_json` of ``data``; a list element by element, in the same text, so
    that the output of many runs is never one string in memory (each run's row is made,
    written and dropped)."""
    if not isinstance(data, list) or not data:
        print(to_json(data))
        return
    write = sys.stdout.write
    for i, item in enumerate(data):
        # As json.dumps(indent=2) writes a list: each element one level in (JSON text holds
        # no raw line break but those of its indentation).
        write(",\n  " if i else "[\n  ")
        write(to_json(item).replace("\n", "\n  "))
    write("\n]\n")


Query = Callable[[Reader, argparse.Namespace], "tuple[object, str]"]


def run_query(query: Query) -> Callable[[argparse.Namespace], int]:
    """A command that reads the store: ``query`` returns (data for --json, text for humans)."""

    def command(args: argparse.Namespace) -> int:
        reader = reader_for(args)
        resume = not getattr(args, "ends_process", False)
        with read_or_fail(reader.label), collector_paused(resume):
            data, text = query(reader, args)
        if args.json:
            print_json(data)
        else:
            print(text)
        return 0

    return command


@contextlib.contextmanager
def collector_paused(resume: bool = True) -> Iterator[None]:
    """The cyclic garbage collector off while a read command reads, and on again after if
    it was (``resume``). A store's run index decodes into a container per run, which each
    collection until the command ends would walk again: a tenth of the time of `list jobs`
    over 100,000 runs. A read makes little garbage that only the collector frees (the rest
    is freed as it goes). ``resume=False`` when the process ends right after the command
    (:func:`async_tracker.cli.main.entry`): turning the collector on would first walk every
    object the read made, for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled and resume:
            gc.enable()


def warn(message: str) -> None:
    print(f"async-tracker: {message}", file=sys.stderr, flush=True)
