"""How a job ended, on a real MLflow server that was down when the job ended: a job that
fails, or is killed by SIGTERM, leaves its end status in its spool, and the sync that
delivers the spool once the server is back makes the MLflow run FAILED / KILLED (not left
RUNNING, nor FINISHED by the sync).

The tests share one server of their own (module scope), which they stop and start."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun
from async_tracker.backend.mlflow import AsyncMLflowTracker
from async_tracker.backend.mlflow.mapping import TAG_HEARTBEAT
from async_tracker.sync import sync_spool
from tests.core.helpers import Child, wait_until
from tests.mlflow.server import MlflowServer

pytestmark = pytest.mark.server

# A job logging to MLflow (argv[1]: tracking URI, argv[2]: experiment) that spools in
# argv[3]; says "ready", then fails (argv[4] is "fail") or waits to be signalled.
JOB = """
import sys, time
from async_tracker import AppRun, RetryPolicy
from async_tracker.backend.mlflow import AsyncMLflowTracker
uri, experiment, spool, mode = sys.argv[1:5]
retry = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.05, jitter_s=0,
                    cooldown_s=0.2)
backend = AsyncMLflowTracker(experiment, uri)
# close_timeout: time enough, on a loaded machine, for the first failed round (which spools
# what waits) even when importing MLflow's client takes seconds of this process's CPU share.
with AppRun("job", [backend], spool_dir=spool, close_timeout=5.0, retry=retry,
            heartbeat_s=0) as run:
    run.add_metadata(lr=0.1)
    for step in range(3):
        run.log_metric("loss", float(step), step=step)
    print("ready", flush=True)
    if mode == "fail":
        raise RuntimeError("the job failed")
    while True:
        time.sleep(0.01)
"""


def the_run(url: str, experiment: str) -> Any:
    from mlflow import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id])
    return client, run


@pytest.mark.parametrize(("mode", "expected"), [("fail", "FAILED"), ("sigterm", "KILLED")])
def test_a_job_ending_while_the_server_is_down_gets_its_status_from_sync(
    server: MlflowServer, tmp_path: Path, experiment_name: str, mode: str, expected: str
) -> None:
    spool = tmp_path / "spool"
    server.stop()
    try:
        job = Child(JOB, server.url, experiment_name, str(spool), mode)
        try:
            assert job.readline(60) == "ready"
            if mode == "sigterm":
                os.kill(job.proc.pid, signal.SIGTERM)
            assert job.wait(60) != 0
        finally:
            job.close()
    finally:
        server.start()  # same port, same store
    result = sync_spool(spool, {"mlflow": AsyncMLflowTracker(experiment_name, server.url)},
                        timeout=60)
    assert result.ok, result
    client, run = the_run(server.url, experiment_name)
    assert run.info.status == expected
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2]
    # A second sync has nothing left to send, and changes nothing.
    assert sync_spool(spool, {"mlflow": AsyncMLflowTracker(experiment_name, server.url)}).ok
    assert the_run(server.url, experiment_name)[1].info.status == expected


def test_a_live_run_tags_its_heartbeat(
    server: MlflowServer, tmp_path: Path, experiment_name: str
) -> None:
    backend = AsyncMLflowTracker(experiment_name, server.url)
    run = AppRun("beating", [backend], spool_dir=str(tmp_path), heartbeat_s=0.1)
    run.add_metadata(lr=0.1)
    assert run.flush(60).ok

    def beat() -> Any:
        tags = the_run(server.url, experiment_name)[1].data.tags
        return json.loads(tags[TAG_HEARTBEAT]) if TAG_HEARTBEAT in tags else None

    wait_until(lambda: beat() is not None, "the heartbeat tag")
    assert beat()["interval_s"] == 0.1
    assert dict(run.metadata()) == {"lr": 0.1}  # not metadata of the user's
    assert run.close(60).ok
    assert the_run(server.url, experiment_name)[1].info.status == "FINISHED"
