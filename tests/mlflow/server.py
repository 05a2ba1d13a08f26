"""A real ``mlflow server`` on 127.0.0.1, for the MLflow tests and ``benchmarks.bench_mlflow``.

SQLite backend store and artifact root in a directory of the caller's; readiness is polled on
the server's ``/health`` endpoint with a deadline. The server runs in a process group of its
own, so that killing it (an outage) takes its uvicorn worker along.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.core.helpers import free_port

# Cold start (database migrations) takes 5-15 s on a small machine; a restart is faster.
STARTUP_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.1


class MlflowServer:
    """``mlflow server`` with a SQLite store under ``root``; ``start()``, ``kill()``,
    ``start()`` again on the same port (the store survives)."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        cmd = [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--default-artifact-root", str(self.root / "artifacts"),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--workers", "1",
        ]  # fmt: skip
        # The job runner (a pool of huey consumers) is for GenAI evaluation jobs: not needed,
        # and it doubles the start time.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(POLL_INTERVAL_S)  # polling the server's readiness, bounded above
        raise RuntimeError(f"mlflow server not ready after {timeout_s} s:\n{self.log_tail()}")

    def _signal(self, sig: int) -> None:
        # To the whole group, even when the leader is gone: its uvicorn worker may not be.
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """SIGKILL, as a crash would: no graceful shutdown, connections reset."""
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        # The uvicorn worker is in our process group: make sure it is gone too.
        self._signal(signal.SIGKILL)

    def ensure_running(self) -> None:
        """Answering again after a test that paused (SIGSTOP), stopped or killed it: resumed,
        or started again on the same port with the same store."""
        self._signal(signal.SIGCONT)
        if self.proc is None or self.proc.poll() is not None:
            self._signal(signal.SIGKILL)  # a worker left behind by its leader's death
            self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
