"""The dashboard's guard: who may ask, and what every answer carries.

An ASGI middleware in front of the whole app (page, static files, API), with three duties:

* **The Host header.** A page of another site can make a browser send requests to
  ``127.0.0.1:6070`` under that site's own name (DNS rebinding: the attacker's name first
  resolves to their server, then to the loopback), and read the answers as same-origin. Such a
  request always carries the attacker's name in ``Host``. So a request is served only when its
  Host is an IP literal (it cannot be rebound), a loopback name (``localhost``), one of the
  machine's own names when the server is bound off the loopback, or a name the user allowed
  (``--allow-host``; ``*`` turns the check off). Anything else is refused with 403, naming the
  flag that allows it.
* **The token.** Bound off the loopback, whoever reaches the address could read every run:
  the server then requires a token (generated, printed in the URL, as Jupyter does; or the
  user's ``--token``), on every request, the page included. It is taken from the query
  (``?token=``: the printed URL; the answer then sets a cookie, so that the page's own
  requests carry it), from that cookie, or from an ``Authorization: token ...`` or
  ``Bearer ...`` header (scripts). Compared in constant time.
* **Headers on every answer:** a Content-Security-Policy that allows only the server's own
  scripts, styles and connections and no framing; ``nosniff``; no referrer (the URL may hold
  the token); resources for the same origin only.

Everything here is per request and stateless: the guard's state is its configuration.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie

import orjson
from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})

CSP = "; ".join([
    "default-src 'self'",
    "img-src 'self' data: blob:",  # uPlot and the PNG download draw to canvases
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
])  # fmt: skip
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine alone."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The name of a Host header, lower-case, without its port; an IPv6 literal without its
    brackets. None when the header is not a host (empty, or junk)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 1 else None
    name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    if not name or any(c in name for c in "/\\@ \t"):
        return None
    return name.rstrip(".")  # "localhost." is localhost


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def own_names() -> frozenset[str]:
    """This machine's names, as users on the network reach it."""
    names = {socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:  # pragma: no cover - a resolver that fails
        pass
    return frozenset(n for n in names if n)


@dataclass(frozen=True)
class Access:
    """Who may ask: ``hosts`` the names allowed beside IP literals and loopback names
    (``*``: any), ``token`` the token every request must carry (None: none), ``cookie`` the
    cookie that keeps it (one per port: cookies do not tell ports apart)."""

    hosts: frozenset[str] = frozenset()
    token: str | None = None
    cookie: str = "async_tracker_token"
    any_host: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "any_host", "*" in self.hosts)

    @classmethod
    def for_bind(
        cls, host: str, port: int, allow: Iterable[str] = (), token: str | None = None
    ) -> Access:
        """The access of a server bound to ``host:port``: off the loopback, the machine's
        names are allowed too."""
        hosts = {h.strip().lower().strip("[]") for h in allow if h.strip()}
        if not is_loopback(host):
            hosts |= own_names()
            if host and not _is_ip(host):
                hosts.add(host.lower())
        return cls(frozenset(hosts), token, f"async_tracker_token_{port}")

    def host_allowed(self, name: str) -> bool:
        return self.any_host or name in LOOPBACK_NAMES or _is_ip(name) or name in self.hosts

    def token_of(self, scope: Scope, headers: Headers) -> tuple[str | None, bool]:
        """The token a request carries, and whether it came in the query (then the answer
        sets the cookie)."""
        query = QueryParams(scope.get("query_string", b"")).get("token")
        if query:
            return query, True
        auth = headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return value.strip(), False
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except Exception:  # a malformed cookie header: as if none
            return None, False
        morsel = jar.get(self.cookie)
        return (morsel.value if morsel is not None else None), False


class Guard:
    """The middleware (see the module's text)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: nothing to guard
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        name = host_name(headers.get("host", ""))
        if name is None or not self.access.host_allowed(name):
            shown = headers.get("host", "")[:100]
            await _refuse(
                send, 403,
                f"host {shown!r} is not allowed: a page of another site may be reaching this "
                "server through its own name (DNS rebinding). Open the address the server "
                f"printed, or start it with --allow-host {name or 'NAME'}",
            )  # fmt: skip
            return
        set_cookie = False
        if self.access.token is not None:
            given, from_query = self.access.token_of(scope, headers)
            if given is None or not hmac.compare_digest(
                given.encode(), self.access.token.encode()
            ):
                what = "a wrong token" if given else "no token"
                await _refuse(
                    send, 403,
                    f"this dashboard needs its token ({what} given): open the URL it printed "
                    "(…/?token=…), or send 'Authorization: token …'",
                )  # fmt: skip
                return
            set_cookie = from_query

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(SECURITY_HEADERS)
                if set_cookie:
                    assert self.access.token is not None
                    cookie = (
                        f"{self.access.cookie}={self.access.token}; Path=/; HttpOnly; "
                        "SameSite=Strict"
                    )
                    extra.append((b"set-cookie", cookie.encode("latin-1")))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_guarded)


async def _refuse(send: Send, status: int, message: str) -> None:
    body = orjson.dumps({"error": message})
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *SECURITY_HEADERS,
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


__all__ = ["CSP", "Access", "Guard", "host_name", "is_loopback", "own_names"]
