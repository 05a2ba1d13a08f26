"""``ui``: the local dashboard of a store, served until Ctrl-C (needs the ui extra)."""

from __future__ import annotations

import argparse
import os

from async_tracker.cli.common import CliError, reader_for

MISSING_UI = "the dashboard needs its extra: pip install 'async-tracker[ui]'"


def cmd_ui(args: argparse.Namespace) -> int:
    # Arrow's system allocator for this long-lived server, unless the user chose one: the
    # default (mimalloc) keeps freed pages of each big read for later, and a server holding
    # ten million points then holds about a third more than its columns. Read when pyarrow
    # loads, which is later (the store's codec, at the first read).
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    try:
        from async_tracker.ui import server
        from async_tracker.ui.live import PRELOAD_POINTS
    except ImportError as exc:  # starlette, uvicorn or numpy missing
        raise CliError(f"{MISSING_UI} ({exc})") from exc
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be 0 (a free port) to 65535, got {args.port}")
    if args.preload is not None and args.preload < 0:
        raise CliError(f"--preload must be 0 (none) or more points, got {args.preload}")
    reader = reader_for(args)
    try:
        # The store is first read on the first request (its errors go to the page); what
        # fails here is the address (a port taken, a host not ours).
        preload = PRELOAD_POINTS if args.preload is None else args.preload
        server.serve(host=args.host, port=args.port, reader=reader, preload=preload,
                     allow_hosts=args.allow_host, token=args.token)  # fmt: skip
    except server.ServeError as exc:
        raise CliError(f"cannot serve: {exc}") from exc
    except OSError as exc:
        raise CliError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "ui",
        parents=[common],
        help="serve the local dashboard of the store (needs the ui extra)",
        description="Serves a live dashboard of the store's runs on a local port, until "
        "Ctrl-C. Prints its URL first. Read-only.",
    )
    p.add_argument(
        "--host", default="127.0.0.1",
        help="address to bind (default: 127.0.0.1; 0.0.0.0: every interface, with a token)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=int, default=6070,
        help="port to bind (default: 6070; 0, or a port in use: a free one, printed)",
    )  # fmt: skip
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the dashboard answers to, beside IP addresses and localhost (a "
        "reverse proxy's or a tunnel's; repeatable; '*': any). Other names are refused, so "
        "that no web page can read your runs by DNS rebinding",
    )
    p.add_argument(
        "--token",
        help="the token every request must carry (in the URL once, then a cookie; or an "
        "'Authorization: token ...' header). Off the loopback one is generated if not given",
    )
    p.add_argument(
        "--preload",
        type=int,
        metavar="POINTS",
        help="points of the newest runs to read as it starts, so that their charts draw at "
        "once (default: 20 million, about 0.7 GB at most; 0: none)",
    )
    p.set_defaults(func=cmd_ui)
