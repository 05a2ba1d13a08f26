"""``tensorboard --logdir <root>`` (the real server and its data server) shows what the
backend wrote: runs nested by their ids, scalars, text tables, hparams, and a batch replayed
after a crash once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard")

from async_tracker import AppRun, Batch, TrackerMetric
from async_tracker.backend.tensorboard import AsyncTensorBoardTracker
from tests.core.helpers import free_port
from tests.fsspec.conftest import wait_http
from tests.tensorboard.helpers import f32

pytestmark = pytest.mark.server


class TensorBoard:
    """A ``tensorboard --logdir`` on 127.0.0.1, asked over its HTTP API."""

    def __init__(self, logdir: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
             "--host", "127.0.0.1", "--port", port, "--load_fast=true", "--reload_interval=1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def get(self, path: str, **query: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.loads(answer.read())

    def post(self, path: str, body: object) -> Any:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def scalars_when(self, run: str, tag: str, last_step: int, timeout_s: float = 60) -> Any:
        """The points of a series once TensorBoard has loaded up to ``last_step`` (it loads
        event files in the background: polling its answer, not timing our own code)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if tag in self.get("/data/plugin/scalars/tags").get(run, {}):
                points = self.get("/data/plugin/scalars/scalars", run=run, tag=tag)
                if points and points[-1][1] == last_step:
                    return points
            time.sleep(0.2)
        raise AssertionError(f"TensorBoard did not load {run}/{tag} up to step {last_step}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def replayed(root: Path) -> None:
    """A crash after an append and before its ack: the next process replays the batch (its
    key fixed when it was cut) into an event file of its own, then goes on."""
    batch = Batch(1, metrics=[TrackerMetric("loss", s / 10, s, 1.7e9 + s) for s in range(50)])
    batch.key = f"{time.time_ns():019d}-deadbeef-{1:012d}"
    first, replay = AsyncTensorBoardTracker(root), AsyncTensorBoardTracker(root)
    await first.write_batch("sweep/replayed", batch.for_lane())
    await replay.write_batch("sweep/replayed", batch.for_lane())
    await replay.add_metrics("sweep/replayed", [TrackerMetric("loss", 9.0, 50, 1.7e9 + 60)])


@pytest.fixture
def written(tmp_path: Path) -> Path:
    root = tmp_path / "tb"
    with AppRun("sweep/trial-1", [AsyncTensorBoardTracker(root)]) as run:
        run.add_metadata(lr=0.1, optimizer="adam")
        for step in range(100):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
    asyncio.run(replayed(root))
    return root


def test_tensorboard_shows_the_runs(written: Path) -> None:
    server = TensorBoard(written)
    try:
        wait_http(server.url, server.proc, 60)
        points = server.scalars_when("sweep/trial-1", "loss", last_step=99)
        assert [(p[1], p[2]) for p in points] == [(s, f32(1.0 / (s + 1))) for s in range(100)]
        # The replayed batch is in two event files; TensorBoard keeps the last point it reads
        # at a step, so it shows each once.
        points = server.scalars_when("sweep/replayed", "loss", last_step=50)
        assert [(p[1], p[2]) for p in points] == [(s, f32(s / 10)) for s in range(50)] + [(50, 9.0)]
        assert set(server.get("/data/runs")) == {"sweep/trial-1", "sweep/replayed"}
        text = server.get("/data/plugin/text/text", run="sweep/trial-1", tag="async_tracker/status")
        assert "<code>finished</code>" in text[-1]["text"]
        text = server.get(
            "/data/plugin/text/text", run="sweep/trial-1", tag="async_tracker/metadata"
        )
        assert "<code>optimizer</code>" in text[-1]["text"]
        hparams = server.post("/data/plugin/hparams/experiment", {"experimentName": ""})
        assert {h["name"] for h in hparams["hparamInfos"]} == {"lr", "optimizer"}
    finally:
        server.close()
