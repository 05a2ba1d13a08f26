"""``async-tracker ui`` as a real process: the URL first, served, Ctrl-C ends it cleanly;
off the loopback a token on every request; other sites' names refused; a free port for a
port taken; clear errors for bad options."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from tests.core.helpers import Child
from tests.ui.conftest import UiServer

pytestmark = pytest.mark.server


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_it_prints_its_url_first_serves_the_store_and_exits_0_on_ctrl_c(
    ui_server: UiServer,
) -> None:
    assert ui_server.url.startswith("http://127.0.0.1:") and ui_server.url.endswith("/")
    data = get_json(ui_server.url + "api/runs")
    assert isinstance(data, dict) and data["total"] == 3
    code, stderr = ui_server.interrupt()
    assert code == 0, stderr
    assert "Traceback" not in stderr and "WARNING" not in stderr


def request(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """GET ``url``: the status, the headers (lower-case names) and the body, errors included."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, \
                response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()


def test_off_the_loopback_every_request_needs_the_token(store: Path) -> None:
    server = UiServer("--store", str(store), "--host", "0.0.0.0")
    try:
        base, _, query = server.url.partition("?")
        assert base.startswith("http://127.0.0.1:") and query.startswith("token=")
        token = query.removeprefix("token=")
        assert len(token) >= 24
        # Without it: the page, its scripts and the API alike.
        for path in ("", "static/app.js", "api/runs"):
            status, _, body = request(base + path)
            assert status == 403 and "needs its token (no token given)" in body, (path, body)
        status, _, body = request(base + "api/runs?token=wrong-token")
        assert status == 403 and "a wrong token" in body
        # The printed URL: the page, and a cookie for the page's own requests.
        status, headers, body = request(server.url)
        assert status == 200 and "<html" in body.lower()
        cookie = headers["set-cookie"].split(";")[0]
        assert cookie.endswith("=" + token) and "HttpOnly" in headers["set-cookie"]
        status, _, body = request(base + "api/runs", {"Cookie": cookie})
        assert status == 200 and json.loads(body)["total"] == 3
        status, _, _ = request(base + "api/runs", {"Authorization": f"token {token}"})
        assert status == 200
        code, stderr = server.interrupt()
    finally:
        server.close()
    assert code == 0
    assert "serving on 0.0.0.0, not only this machine: every request needs the token" in stderr


def test_a_request_under_another_sites_name_is_refused(ui_server: UiServer) -> None:
    # What DNS rebinding makes a browser send: the loopback's address, the attacker's name.
    port = ui_server.url.rstrip("/").rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        status, headers, body = request(ui_server.url + "api/runs", {"Host": host})
        assert status == 403, host
        assert "is not allowed" in body and "--allow-host" in body
        assert headers["x-content-type-options"] == "nosniff"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        status, headers, _ = request(ui_server.url + "api/runs", {"Host": host})
        assert status == 200, host
        assert "frame-ancestors 'none'" in headers["content-security-policy"]


def test_allow_host_adds_a_name(store: Path) -> None:
    server = UiServer("--store", str(store), "--allow-host", "runs.example")
    try:
        status, _, _ = request(server.url + "api/runs", {"Host": "runs.example"})
        assert status == 200
        status, _, _ = request(server.url + "api/runs", {"Host": "other.example"})
        assert status == 403
    finally:
        server.close()


def ui_failing(*args: str) -> str:
    """``async-tracker ui ARGS`` that must fail with exit code 2: its stderr."""
    child = Child("import sys; from async_tracker.cli.main import main; sys.exit(main())",
                  "ui", *args)  # fmt: skip
    try:
        assert child.wait(60) == 2
        return child.stderr()
    finally:
        child.close()


def test_a_port_taken_is_replaced_by_a_free_one_and_said(store: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = UiServer("--store", str(store), "--port", str(port))
        try:
            served = int(server.url.rstrip("/").rsplit(":", 1)[1])
            assert served != port
            assert get_json(server.url + "api/runs")
            code, stderr = server.interrupt()
        finally:
            server.close()
    assert code == 0
    assert f"port {port} is busy: serving on port {served} instead" in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "--port must be 0 (a free port) to 65535, got 70000"),
        (["--preload", "-1"], "--preload must be 0 (none) or more points, got -1"),
        (["--host", ""], "cannot serve: give an address to serve on"),
        (["--token", "a b;c=d"], "cannot serve: a token is 8 to 256 of the characters"),
    ],
)
def test_bad_options_are_one_line_errors(store: Path, args: list[str], message: str) -> None:
    stderr = ui_failing("--store", str(store), *args)
    assert message in stderr and "Traceback" not in stderr


def test_serve_from_python_prints_its_url_and_returns_on_ctrl_c(store: Path) -> None:
    child = Child(
        "import sys, async_tracker.ui\n"
        "async_tracker.ui.serve(sys.argv[1], port=0)\n"
        "print('returned', flush=True)",
        str(store),
    )
    try:
        url = child.readline(60)
        data = get_json(url + "api/runs")
        assert isinstance(data, dict) and data["store"] == f"store {store.name}"
        os.kill(child.proc.pid, signal.SIGINT)
        assert child.readline(30) == "returned"
        assert child.wait(30) == 0
    finally:
        child.close()
