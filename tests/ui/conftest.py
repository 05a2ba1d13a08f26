"""Fixtures of the dashboard's tests: stores written by real runs, the app under a test
client, ``async-tracker ui`` as a child process, and headless Chromium.

Every test here needs the ``ui`` extra (starlette, uvicorn, numpy): each module is marked
``server`` and skips without it (``pytest.importorskip``). The browser tests also need
Chromium and its driver (Debian: ``apt-get install chromium chromium-driver``) and skip
with the reason when they are missing.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import async_tracker
from tests.core.helpers import Child

# Three finished runs that differ by lr (and one by batch size).
CONFIGS = [
    ("base/a", {"lr": 0.1, "batch_size": 32, "model": "mlp"}, ["baseline"]),
    ("base/b", {"lr": 0.01, "batch_size": 32, "model": "mlp"}, []),
    ("base/c", {"lr": 0.001, "batch_size": 64, "model": "mlp"}, []),
]
STEPS = 120


def loss(lr: float, step: int) -> float:
    return math.exp(-step * lr * 0.3) + 0.05 * math.sin(step)


def write_finished_runs(root: Path, spool: Path) -> None:
    """The runs of CONFIGS, each logging loss and acc at STEPS steps, an artifact, closed."""
    for run_id, config, tags in CONFIGS:
        run = async_tracker.init(
            "base", config=config, dir=str(root), id=run_id, tags=tags, spool_dir=str(spool)
        )
        lr = float(config["lr"])  # type: ignore[arg-type]
        for step in range(STEPS):
            run.log_metrics({"loss": loss(lr, step), "acc": 1 - loss(lr, step),
                             "system/cpu_percent": 40.0 + step % 9}, step=step)  # fmt: skip
        run.add_artifact("model", f"/models/{run_id}.pt", {"format": "torch"})
        report = run.close(30)
        assert report.ok, report


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    write_finished_runs(root, tmp_path / "spool")
    return root


# A live run (argv: store, spool, run id, heartbeat seconds): logs 10 points, says "ready";
# then each line "log" on stdin logs one more point, flushed, and says "logged N" (N points
# in all); stdin closed: the run ends (finished).
LIVE = """
import sys
import async_tracker
store, spool, run_id, beat = sys.argv[1:5]
run = async_tracker.init("live", dir=store, id=run_id, spool_dir=spool,
                         config={"lr": 0.5, "batch_size": 16}, heartbeat_s=float(beat))
step = 0
for step in range(10):
    run.log_metric("loss", 1.0 / (step + 1), step=step)
    run.log_metric("system/cpu_percent", 30.0 + step % 4, step=step)
assert run.flush(30).ok
print("ready", flush=True)
for line in sys.stdin:
    step += 1
    run.log_metric("loss", 1.0 / (step + 1), step=step)
    assert run.flush(30).ok
    print(f"logged {step + 1}", flush=True)
run.close(30)
"""


def local_client(app: Any) -> Any:
    """Starlette's test client as a browser on this machine asks: ``Host: 127.0.0.1`` (its
    default, ``testserver``, is a name the dashboard's guard refuses)."""
    from starlette.testclient import TestClient

    return TestClient(app, base_url="http://127.0.0.1")


def start_live(root: Path, spool: Path, run_id: str, heartbeat_s: float = 30.0) -> Child:
    job = Child(LIVE, str(root), str(spool), run_id, str(heartbeat_s))
    assert job.readline(60) == "ready", job.dump()
    return job


class UiServer:
    """``async-tracker ui`` in a child process: its URL, and a Ctrl-C that must end it
    cleanly (exit 0, nothing on stderr but what the test expects)."""

    def __init__(self, *args: str) -> None:
        self.child = Child(
            "import sys; from async_tracker.cli.main import main; sys.exit(main())",
            "ui", "--port", "0", *args,
        )  # fmt: skip
        self.url = self.child.readline(60)
        assert self.url.startswith("http://"), self.url

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C: the exit code and stderr."""
        os.kill(self.child.proc.pid, signal.SIGINT)
        code = self.child.wait(30)
        return code, self.child.stderr()

    def close(self) -> None:
        self.child.close()


@pytest.fixture
def ui_server(store: Path) -> Iterator[UiServer]:
    server = UiServer("--store", str(store))
    try:
        yield server
    finally:
        server.close()


def _browser_paths() -> tuple[str, str] | None:
    browser = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def start_chromium(*args: str) -> Any:
    """Headless Chromium at 1400x900, driven by selenium, with its console kept (for
    ``get_log("browser")``); ``args``: more switches. Skips without the browser."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    paths = _browser_paths()
    if paths is None:
        pytest.skip(
            "the browser tests need Chromium and chromedriver on PATH "
            "(Debian: apt-get install -y chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,900", "--disable-gpu", "--hide-scrollbars", *args):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(paths[1]))
    driver.set_window_size(1400, 900)
    return driver


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium (one for the session)."""
    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()


def screenshots_dir(tmp_path: Path) -> Path:
    """Where the browser tests save their screenshots: ``$UI_SCREENSHOTS`` (the docs use
    ``UI_SCREENSHOTS=docs/images``), else the test's temporary directory."""
    return Path(os.environ.get("UI_SCREENSHOTS") or tmp_path)
