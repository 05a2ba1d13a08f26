"""A training loop recording to MLflow, offline: a local `mlflow server`, a `.torchxconfig`.

Run it from the repository root (needs the mlflow extra):

    pip install -e '.[mlflow]' && python examples/mlflow_example.py [--dir mlflow_example]

It starts `mlflow server` on 127.0.0.1 with a SQLite store under --dir (its own folder, not the
package's default store `tracker_runs`, whose commands would take it for a foreign run), writes the
`[tracker:mlflow]` section a torchx job would use, logs the job's config as MLflow params and
its metrics and a checkpoint file through an AppRun (the loop never waits for the server; the
file is uploaded to the run's artifacts), ends the run FINISHED as the run closes, reads it
back with MLflow's own client, and stops the server; then it prints the command that serves
that store again, to see the run in MLflow's UI. Against a real server, the config's
tracking_uri is all that changes.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient

from async_tracker import AppRun
from async_tracker.mlflow import create_tracker  # was: torchx.tracker.mlflow

SERVER_START_TIMEOUT_S = 90.0


@dataclass
class Optimizer:
    name: str = "adamw"
    lr: float = 3e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])


@dataclass
class Config:
    model: str = "mlp"
    layers: list[int] = field(default_factory=lambda: [256, 256])
    optimizer: Optimizer = field(default_factory=Optimizer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mlflow_server(store: Path) -> Iterator[str]:
    """`mlflow server` with a SQLite store in ``store``; its URL while it runs."""
    store.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server",
         "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
         "--default-artifact-root", str(store / "artifacts"),
         "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,  # its uvicorn worker too is stopped below
    )  # fmt: skip
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:  # poll the health endpoint until the server answers
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except (urllib.error.URLError, OSError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start on {url}") from None
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="mlflow_example", help="server store and config")
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    root = Path(args.dir).resolve()

    with mlflow_server(root / "mlflow-server") as url:
        # The [tracker:mlflow] section torchx users keep in .torchxconfig.
        (root / ".torchxconfig").write_text(
            f"[tracker:mlflow]\nexperiment_name = examples\ntracking_uri = {url}\n"
        )
        tracker = create_tracker(str(root))  # what TORCHX_TRACKERS=mlflow builds
        run_id = f"local://examples/mlflow-{secrets.token_hex(3)}"

        tracker.log_params_flat(run_id, Config())  # nested config -> flat MLflow params
        with AppRun(run_id, [tracker]) as run:
            run.add_metadata(dataset="synthetic", seed=0)
            loss = 2.5
            for step in range(args.steps):
                loss *= 0.998
                # Returns at once: points reach MLflow in log_batch requests of 1000.
                run.log_metrics({"loss": loss, "acc": 1 - math.exp(-step / 400)}, step=step)
            checkpoint = root / f"step-{args.steps - 1}.pt"
            checkpoint.write_bytes(b"weights")
            run.add_artifact("checkpoint", str(checkpoint))  # a local file: uploaded
        # The with block closed the run and ended the MLflow run: FINISHED (FAILED had the
        # block raised). Here is its report:
        print(f"run {run_id}: {run.close()}")

        # Read back with MLflow's own client.
        client = MlflowClient(url)
        mlrun = tracker.get_run(run_id)
        history = client.get_metric_history(mlrun.info.run_id, "loss")
        print(f"MLflow run {mlrun.info.run_id} ({mlrun.info.run_name}): {mlrun.info.status}")
        print(f"  params: {dict(sorted(mlrun.data.params.items()))}")
        print(f"  loss: {len(history)} points, last {history[-1].value:.4f}")
        print(f"  metadata: {dict(tracker.metadata(run_id))}")
        print(f"  artifacts: {list(tracker.artifacts(run_id))}")
        uploaded = client.list_artifacts(mlrun.info.run_id, "checkpoint")
        print(f"  uploaded: {[f.path for f in uploaded]}")
        page = f"#/experiments/{mlrun.info.experiment_id}/runs/{mlrun.info.run_id}"
    # The server stops with this script: its URL would be dead. The same store, served again:
    store = root / "mlflow-server"
    print(
        "see it in MLflow's UI: mlflow server --backend-store-uri "
        f"sqlite:///{store / 'mlflow.db'} --default-artifact-root {store / 'artifacts'} "
        f"--port 5000, then open http://127.0.0.1:5000/{page}"
    )


if __name__ == "__main__":
    main()
