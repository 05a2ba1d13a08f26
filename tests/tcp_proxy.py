"""A TCP proxy on 127.0.0.1 in front of a real server, whose behaviour a test switches.

Modes (:attr:`TcpProxy.mode`):

* ``pass``: connections are relayed to the server both ways;
* ``refuse``: nothing listens on the port (the listening socket is closed): a connect gets
  ECONNREFUSED at once;
* ``reset``: a connection is accepted, then reset (RST) before a byte is answered;
* ``silent``: a connection is accepted and held open, its request read and never answered
  (a server that hangs, or a firewall that drops the replies).

Switching the mode resets every connection open at that moment, so that a client's pooled
keep-alive connection cannot carry on in the old mode; its next request meets the new one.
Threads, not asyncio: the proxy serves clients of any event loop, and outlives none of them
(:meth:`close` ends its threads).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Literal

Mode = Literal["pass", "refuse", "reset", "silent"]
MODES: tuple[Mode, ...] = ("pass", "refuse", "reset", "silent")


def _reset(sock: socket.socket) -> None:
    """Closes ``sock`` with an RST (SO_LINGER of 0 s), not a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class TcpProxy:
    """Relays ``127.0.0.1:<port>`` to ``target`` (``host``, ``port``) as :attr:`mode` says."""

    def __init__(self, target: tuple[str, int], mode: Mode = "pass") -> None:
        self.target = target
        self._lock = threading.Lock()  # guards the fields below
        self._mode: Mode = mode
        self._open: set[socket.socket] = set()  # every connection's sockets, both ends
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._closed = False
        # A pipe that wakes the accept loop when the listener is to close (closing a socket
        # another thread waits on in accept() does not wake it on every platform).
        self._wake_r, self._wake_w = socket.socketpair()
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        if mode != "refuse":
            self._listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        with self._lock:
            self._mode = mode
            dropped, self._open = self._open, set()
        for sock in dropped:
            _reset(sock)
        if mode == "refuse":
            self._stop_listening()
        elif self._listener is None:
            self._listen()

    def connections(self) -> int:
        """Sockets open now (both ends of relayed connections, and held silent ones)."""
        with self._lock:
            return len(self._open)

    # -- listening ---------------------------------------------------------------------------
    def _listen(self) -> None:
        listener = socket.socket()
        # The same port again after ``refuse``: its old connections may sit in TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._accepter = threading.Thread(
            target=self._accept_loop, args=(listener,), name="tcp-proxy-accept", daemon=True
        )
        self._accepter.start()

    def _stop_listening(self) -> None:
        listener, accepter = self._listener, self._accepter
        self._listener = self._accepter = None
        if listener is None or accepter is None:
            return
        self._wake_w.send(b"x")
        accepter.join()
        with contextlib.suppress(OSError):
            self._wake_r.recv(16)
        listener.close()  # after the loop left accept(): no connection slips in meanwhile

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            ready, _, _ = select.select([listener, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._serve(client)

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            mode = self._mode
            if mode in ("silent", "pass"):
                self._open.add(client)
        if mode == "reset" or mode == "refuse":  # refuse: accepted just before the switch
            _reset(client)
        elif mode == "silent":
            threading.Thread(
                target=self._swallow, args=(client,), name="tcp-proxy-silent", daemon=True
            ).start()
        else:
            try:
                server = socket.create_connection(self.target)
            except OSError:
                self._drop(client)
                return
            with self._lock:
                self._open.add(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(a, b), name="tcp-proxy-pump", daemon=True
                ).start()

    # -- relaying ----------------------------------------------------------------------------
    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        self._drop(src, dst)

    def _swallow(self, sock: socket.socket) -> None:
        """Reads and discards what the client sends, answering nothing, until it leaves."""
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
        self._drop(sock)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_listening()
        with self._lock:
            dropped, self._open = self._open, set()
        for sock in dropped:
            _reset(sock)
        self._wake_r.close()
        self._wake_w.close()


@contextlib.contextmanager
def tcp_proxy(target_url: str, mode: Mode = "pass") -> Iterator[TcpProxy]:
    """A :class:`TcpProxy` in front of ``http://host:port``, closed on exit."""
    host, _, port = target_url.removeprefix("http://").rstrip("/").partition(":")
    proxy = TcpProxy((host, int(port)), mode)
    try:
        yield proxy
    finally:
        proxy.close()
