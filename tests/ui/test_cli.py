"""``async-tracker ui`` as a real process: the URL first, served, Ctrl-C ends it cleanly;
a warning for a non-loopback address; a clear error for a port taken."""

from __future__ import annotations

import json
import os
import signal
import socket
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


def test_another_address_than_the_loopback_is_warned_about(store: Path) -> None:
    server = UiServer("--store", str(store), "--host", "0.0.0.0")
    try:
        port = int(server.url.rstrip("/").rsplit(":", 1)[1])
        assert get_json(f"http://127.0.0.1:{port}/api/runs")
        code, stderr = server.interrupt()
    finally:
        server.close()
    assert code == 0
    assert "WARNING: serving on 0.0.0.0, not the loopback" in stderr


def ui_failing(*args: str) -> str:
    """``async-tracker ui ARGS`` that must fail with exit code 2: its stderr."""
    child = Child("import sys; from async_tracker.cli.main import main; sys.exit(main())",
                  "ui", *args)  # fmt: skip
    try:
        assert child.wait(60) == 2
        return child.stderr()
    finally:
        child.close()


def test_a_port_taken_is_a_one_line_error(store: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        stderr = ui_failing("--store", str(store), "--port", str(port))
    assert f"cannot serve on 127.0.0.1:{port}" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "--port must be 0 (a free port) to 65535, got 70000"),
        (["--preload", "-1"], "--preload must be 0 (none) or more points, got -1"),
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
        assert isinstance(data, dict) and data["store"] == f"store {store}"
        os.kill(child.proc.pid, signal.SIGINT)
        assert child.readline(30) == "returned"
        assert child.wait(30) == 0
    finally:
        child.close()
