"""Serving the dashboard: :func:`serve` binds, prints the URL, and serves until Ctrl-C."""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import secrets
import socket
import sys
import threading
from collections.abc import Sequence

from async_tracker.adapters import TrackerLike
from async_tracker.base import AsyncTrackerBase
from async_tracker.store.open import open_reader
from async_tracker.store.sync_reader import Reader
from async_tracker.ui.app import create_app
from async_tracker.ui.guard import Access, is_loopback
from async_tracker.ui.live import PRELOAD_POINTS, LiveStore

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6070
# What a token may hold: it travels in a URL, a header and a cookie unescaped.
TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~-]{8,256}")


class ServeError(ValueError):
    """An address or a token the dashboard cannot serve with."""


def serve(
    store: str | os.PathLike[str] | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    tracker: AsyncTrackerBase | TrackerLike | None = None,
    reader: Reader | None = None,
    refresh_s: float | None = None,
    preload: int = PRELOAD_POINTS,
    timeout: float | None = None,
    allow_hosts: Sequence[str] = (),
    token: str | None = None,
) -> None:
    """Serves the dashboard of ``store`` (a path or fsspec URL; default
    ``$ASYNC_TRACKER_DIR``, else ``./tracker_runs``), or of ``tracker`` (any backend: a
    TensorBoard or MLflow backend, a torchx ``TrackerBase``), or of ``reader`` (an open
    :class:`~async_tracker.store.sync_reader.Reader`), on ``host:port`` (port 0: a free
    one), until Ctrl-C; then returns. Read-only. Each read of the store a request makes
    waits at most ``timeout`` seconds (see ``Store``). Its URL is the first line on
    stdout::

        import async_tracker.ui
        async_tracker.ui.serve("s3://bucket/runs", port=8080)

    Safe by default (see :mod:`async_tracker.ui.guard`): requests whose ``Host`` is not an
    IP literal, a loopback name or one of ``allow_hosts`` (``"*"``: any) are refused, so
    that no page of another site reads the runs through DNS rebinding. Bound off the
    loopback, every request must carry a token: ``token``, else one generated and printed in
    the URL (a ``token`` given on the loopback is required there too). A busy ``port`` is
    replaced by a free one, said on stderr. ``refresh_s``: how often the run list is
    read again at most (default: 0.5 s, 5 s for a backend without run summaries).
    ``preload``: the points of the newest runs to read in the background as the server
    starts, so that the first charts come from memory (0: none)."""
    import uvicorn

    if not host.strip():
        raise ServeError("give an address to serve on: 127.0.0.1 (this machine), or 0.0.0.0 "
                         "(every interface, with a token)")  # fmt: skip
    if token is not None and not TOKEN_CHARS.fullmatch(token):
        raise ServeError("a token is 8 to 256 of the characters A-Z a-z 0-9 . _ ~ -")
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(24)
    if reader is None:
        reader = open_reader(tracker if tracker is not None else store, timeout=timeout)
    live = LiveStore(reader, refresh_s=refresh_s)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    if port not in (0, bound):
        print(f"port {port} is busy: serving on port {bound} instead (--port picks one)",
              file=sys.stderr, flush=True)  # fmt: skip
    query = f"?token={token}" if token is not None else ""
    # The first line on stdout is a URL that works from this machine; a wildcard bind's own
    # address is not one a browser opens.
    wildcard = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}
    name = wildcard.get(host) or (f"[{host}]" if ":" in host else host)
    print(f"http://{name}:{bound}/{query}", flush=True)
    if not is_loopback(host):
        print(
            f"serving on {host}, not only this machine: every request needs the token "
            f"(from other machines: http://{socket.gethostname()}:{bound}/{query})",
            file=sys.stderr,
            flush=True,
        )
    access = Access.for_bind(host, bound, allow_hosts, token)
    config = uvicorn.Config(
        create_app(live, access), log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    # A daemon thread: it only reads, and Ctrl-C must not wait for it. It checks `stop`
    # between runs, so it ends within one run's read once the server is done.
    stop = threading.Event()
    # The run list is read as the server starts, in the background (with the points when
    # preloading): the page's first poll, a moment later, finds it read or under way.
    threading.Thread(
        target=live.preload, args=(stop, preload), name="async-tracker-ui-preload", daemon=True
    ).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn shut down on the first Ctrl-C and raises it again once done: that is the
        # way out we asked for, not an error.
        pass
    finally:
        stop.set()
        sock.close()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, bound before the URL is printed (so that the
    URL names the port a free-port request got, and is served once a client reads it). A
    port in use gives a free one instead (the caller says so)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a name: localhost
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise
            sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ServeError", "serve"]
