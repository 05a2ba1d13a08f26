"""Serving the dashboard: :func:`serve` binds, prints the URL, and serves until Ctrl-C."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import threading

from async_tracker.adapters import TrackerLike
from async_tracker.base import AsyncTrackerBase
from async_tracker.store.open import open_reader
from async_tracker.store.sync_reader import Reader
from async_tracker.ui.app import create_app
from async_tracker.ui.live import PRELOAD_POINTS, LiveStore

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6070
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


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

    Binding anything but the loopback prints a warning: the dashboard has no login, and
    whoever reaches the address reads every run. ``refresh_s``: how often the run list is
    read again at most (default: 0.5 s, 5 s for a backend without run summaries).
    ``preload``: the points of the newest runs to read in the background as the server
    starts, so that the first charts come from memory (0: none)."""
    import uvicorn

    if reader is None:
        reader = open_reader(tracker if tracker is not None else store, timeout=timeout)
    live = LiveStore(reader, refresh_s=refresh_s)
    if host not in LOOPBACK:
        print(
            f"WARNING: serving on {host}, not the loopback: anyone who can reach this address "
            "reads every run of the store (there is no login). Use --host 127.0.0.1 unless "
            "you mean it.",
            file=sys.stderr,
            flush=True,
        )
    sock = _bind(host, port)
    shown = sock.getsockname()[1]
    name = f"[{host}]" if ":" in host else host
    print(f"http://{name}:{shown}/", flush=True)
    config = uvicorn.Config(create_app(live), log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    # A daemon thread: it only reads, and Ctrl-C must not wait for it. It checks `stop`
    # between runs, so it ends within one run's read once the server is done.
    stop = threading.Event()
    if preload > 0:
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
    URL names the port a free-port request got, and is served once a client reads it)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a name: localhost
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "serve"]
