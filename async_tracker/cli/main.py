"""``async-tracker``: query what runs recorded, plot their metrics, launch tracked jobs.

    async-tracker list jobs [--parent-run-id ID]
    async-tracker list metadata RUN_ID
    async-tracker list artifacts [--artifact NAME] RUN_ID
    async-tracker list metrics RUN_ID
    async-tracker compare RUN_ID [RUN_ID ...]
    async-tracker lineage RUN_ID [--depth N]
    async-tracker plot RUN_ID [RUN_ID ...] [--metric NAME ...] -o FILE.png|FILE.svg
    async-tracker export tensorboard RUN_ID [RUN_ID ...] --out DIR
    async-tracker export csv RUN_ID [RUN_ID ...] --out FILE|- [--metrics NAME,...]
    async-tracker run [--name NAME] [--parent-run-id ID] -- COMMAND ...
    async-tracker sync [SPOOL_DIR] [--to URL|FACTORY]
    async-tracker tag RUN_ID [+TAG ...] [-TAG ...] [--note TEXT]
    async-tracker rm RUN_ID [RUN_ID ...] [--yes]
    async-tracker ui [--host 127.0.0.1] [--port N]
    async-tracker --version

The tracker read is ``--tracker NAME --config CFG`` if given, else ``--store PATH|URL``, else
the first one configured the torchx way (``.torchxconfig``, ``TORCHX_*``), else the default
store (``$ASYNC_TRACKER_DIR`` or ``./tracker_runs``, where ``init()`` writes); ``run`` passes
on every configured one (``--store``, or with none configured the default store). Run ids may
be given by a unique prefix; ``compare``, ``plot`` and ``export`` also take a run name
(``init()``'s id without its 6 hex digits: the newest run of that name). ``--json`` prints
machine-readable output. A usage problem (unknown run id, no tracker) exits with code 2, a
store that cannot be read with code 1.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.metadata
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

import async_tracker
from async_tracker.cli import export, plot, query, rm, run, sync, tag, ui
from async_tracker.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CliError,
    StoreError,
    timeout_arg,
    warn,
)
from async_tracker.errors import TrackerError

EXIT_INTERRUPTED = 130


def parser() -> argparse.ArgumentParser:
    # The shared options are accepted before and after the subcommand. After it, their
    # default is SUPPRESS so that an omitted option does not undo one given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--tracker", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("--store", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument(
        "--timeout", type=timeout_arg, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )

    p = argparse.ArgumentParser(
        prog="async-tracker",
        description="Query what runs recorded, plot their metrics, launch tracked jobs.",
        epilog="Every command and its options: docs/cli.md.",
    )
    p.add_argument(
        "--tracker", metavar="NAME", help="tracker name or module:factory (default: configured)"
    )
    p.add_argument("--config", metavar="CFG", help="config string for --tracker (e.g. a file)")
    p.add_argument(
        "--store",
        metavar="PATH|URL",
        help="the store to read: a path or fsspec URL (default: $ASYNC_TRACKER_DIR, else "
        "./tracker_runs, unless trackers are configured the torchx way)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--timeout",
        type=timeout_arg,
        metavar="SECONDS",
        help="how long each read of the store may take before the command fails naming it "
        "(default: $ASYNC_TRACKER_READ_TIMEOUT, else 30); for sync, how long each spooled "
        "run is tried (default: 60); for tag, also how long the change may take to store",
    )
    p.add_argument("--version", action="version", version=f"async-tracker {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    query.register(sub, common)
    plot.register(sub, common)
    export.register(sub, common)
    run.register(sub, common)
    sync.register(sub, common)
    tag.register(sub, common)
    rm.register(sub, common)
    ui.register(sub, common)
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments, as ``parse_args`` would give them; but a command that sets
    ``takes_extra`` (``tag``, whose "-TAG" words look like options to argparse) gets the
    words argparse did not know as ``args.extra``."""
    p = parser()
    args, extra = p.parse_known_args(_signed_values(sys.argv[1:] if argv is None else argv))
    if extra:
        if not getattr(args, "takes_extra", False):
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        args.extra = extra
    return args


# Options whose value may start with "-" as users type it: `--sort -lr` (largest first).
# argparse takes "-lr" for an option and fails ("expected one argument").
_SIGNED_VALUE_OPTIONS = ("--sort",)


def _signed_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--sort -KEY`` joined into ``--sort=-KEY``. A value starting with "--"
    is left alone (another option; argparse then says the value is missing), and so is
    everything after ``--`` (``run``'s command)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.extend(argv[i:])
            break
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if arg in _SIGNED_VALUE_OPTIONS and nxt.startswith("-") and not nxt.startswith("--"):
            out.append(f"{arg}={nxt}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _version() -> str:
    """The installed distribution's version (what pip installed), else the package's own."""
    try:
        return importlib.metadata.version("async-tracker")
    except importlib.metadata.PackageNotFoundError:
        return async_tracker.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns its exit code (``async-tracker`` exits with it)."""
    return _main(argv, ends_process=False)


def _main(argv: Sequence[str] | None, ends_process: bool) -> int:
    try:
        args = parse(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    # Whether the process ends right after the command (entry): what the command leaves
    # for the interpreter's teardown is never cleaned up (see common.collector_paused).
    args.ends_process = ends_process
    try:
        code: int = args.func(args)
    except StoreError as exc:
        warn(str(exc))
        return EXIT_FAILURE
    except (CliError, TrackerError) as exc:
        warn(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        # The store failed us (a missing bucket, a refused connection): say so, no traceback.
        warn(f"{type(exc).__name__}: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    sys.stdout.flush()
    return code


def entry() -> NoReturn:
    """The ``async-tracker`` program (its console script, ``python -m async_tracker``):
    :func:`main`, then the process ends by :func:`exit_now`."""
    exit_now(_main(None, ends_process=True))


def exit_now(code: int) -> NoReturn:
    """Ends the process with ``code`` the way the interpreter would, less its teardown.

    The exit hooks run (``atexit``'s: the tracker closes the runs still open, ``logging``
    flushes its handlers), stdout and stderr are flushed, then ``os._exit``. What it skips
    is freeing every object and module one by one: a listing of 100,000 runs leaves half a
    million objects, and freeing them took a third of ``list jobs``'s time. Where the
    teardown has more to do, the usual ``SystemExit``: a thread that is not a daemon still
    runs (the interpreter waits for it first), or a stream cannot be flushed (a closed
    pipe: the interpreter reports it, and exits with 120, as without this)."""
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        raise SystemExit(code)
    # As the interpreter orders them: the hooks first (they may still write), then the
    # streams. The hooks run once: _run_exitfuncs clears them.
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(code) from None
    os._exit(code)
