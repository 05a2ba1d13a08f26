"""How MLflow runs end, on a real server: the status a job's exit gives (a clean exit, an
exception, SIGTERM, each in a child process), trackers the user built, several ranks on one
run, a resumed run, and a run name that matches several MLflow runs."""

from __future__ import annotations

import signal
import sys
from typing import Any

import pytest

from async_tracker import AppRun, RetryPolicy
from async_tracker.backend.mlflow import (
    TAG_WRITER_PREFIX,
    AmbiguousRunError,
    AsyncMLflowTracker,
    MLflowTracker,
)
from async_tracker.errors import PermanentBackendError, TrackerConfigError, classify
from tests.core.helpers import Child

FAST_RETRY = RetryPolicy(
    max_attempts=3, initial_backoff_s=0, max_backoff_s=0, jitter_s=0, cooldown_s=3600
)


def only_run(client: Any, experiment_name: str, run_name: str) -> Any:
    exp = client.get_experiment_by_name(experiment_name)
    (run,) = client.search_runs([exp.experiment_id], f"attributes.run_name = '{run_name}'")
    return run


def writers(run: Any) -> list[str]:
    return [k for k in run.data.tags if k.startswith(TAG_WRITER_PREFIX)]


# -- a job's exit, in a child process ----------------------------------------------------------
JOB = r"""
import sys, time
from async_tracker import AppRun
from async_tracker.backend.mlflow import MLflowTracker

uri, experiment, run_id, mode = sys.argv[1:5]
tracker = MLflowTracker(experiment, uri)  # built by the user: the run does not own it
run = AppRun(run_id, [tracker])
run.add_metadata(mode=mode)
run.log_metric("loss", 0.5, step=0)
if mode == "exception":
    raise RuntimeError("training diverged")
if mode == "sigterm":
    print("ready", flush=True)
    while True:  # sleeps, not signal.pause(): see tests/core/helpers.py
        time.sleep(0.01)
# clean: the exit hook closes the run
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize(
    ("mode", "status"), [("clean", "FINISHED"), ("exception", "FAILED"), ("sigterm", "KILLED")]
)
def test_a_job_exit_ends_its_mlflow_run_with_the_matching_status(
    tracking_uri: str, experiment_name: str, client: Any, mode: str, status: str
) -> None:
    child = Child(JOB, tracking_uri, experiment_name, f"job-{mode}", mode)
    try:
        if mode == "sigterm":
            assert child.readline(timeout=60) == "ready"
            child.proc.send_signal(signal.SIGTERM)
            assert child.wait(60) == -signal.SIGTERM, child.stderr()
        else:
            assert child.wait(60) == (1 if mode == "exception" else 0), child.stderr()
    finally:
        child.close()
    run = only_run(client, experiment_name, f"job-{mode}")
    assert run.info.status == status
    assert run.info.end_time is not None
    assert writers(run) == []  # the process said it was done
    # Everything logged before the exit was delivered before the run was ended.
    assert run.data.tags["mode"] == f'"{mode}"'
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == [0.5]


# -- trackers the user built -------------------------------------------------------------------
def test_a_user_built_tracker_has_its_run_ended_by_apprun_close(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    tracker = MLflowTracker(experiment_name, tracking_uri)
    run = AppRun("built", [tracker], flush_interval=3600)
    run.log_metric("loss", 1.0, step=0)
    assert run.flush(timeout=30).ok
    assert only_run(client, experiment_name, "built").info.status == "RUNNING"
    assert run.close(timeout=30).ok  # no tracker.close(): the run's close ends it
    assert only_run(client, experiment_name, "built").info.status == "FINISHED"

    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    with pytest.raises(KeyError), AppRun("built-failing", [backend]) as failing:
        failing.log_metric("loss", 1.0, step=0)
        raise KeyError("boom")
    assert only_run(client, experiment_name, "built-failing").info.status == "FAILED"


def test_close_reason_given_explicitly(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    tracker = MLflowTracker(experiment_name, tracking_uri)
    run = AppRun("stopped", [tracker], flush_interval=3600)
    run.log_metric("loss", 1.0, step=0)
    run.close(timeout=30, reason="killed")
    assert only_run(client, experiment_name, "stopped").info.status == "KILLED"
    tracker.add_metadata("direct", a=1)  # used directly: close() ends what it wrote to
    tracker.close("failed")
    assert only_run(client, experiment_name, "direct").info.status == "FAILED"


# -- several ranks on one run --------------------------------------------------------------------
def rank_runs(tracking_uri: str, experiment_name: str, n: int) -> list[AppRun]:
    """``n`` ranks of one job: one tracker and one AppRun each, as ``n`` processes would
    have (each tracker is a writer of its own)."""
    runs = []
    for rank in range(n):
        tracker = MLflowTracker(experiment_name, tracking_uri, name=f"rank{rank}")
        run = AppRun("job", [tracker], flush_interval=3600)
        run.log_metric(f"loss{rank}", 1.0, step=0)
        assert run.flush(timeout=30).ok
        runs.append(run)
    return runs


def test_the_last_rank_to_finish_ends_the_run(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    ranks = rank_runs(tracking_uri, experiment_name, 3)
    assert len(writers(only_run(client, experiment_name, "job"))) == 3
    ranks[1].close(timeout=30)
    ranks[0].close(timeout=30)
    run = only_run(client, experiment_name, "job")
    assert run.info.status == "RUNNING" and len(writers(run)) == 1  # rank 2 still writes
    ranks[2].log_metric("loss2", 0.5, step=1)
    ranks[2].close(timeout=30)
    run = only_run(client, experiment_name, "job")
    assert run.info.status == "FINISHED" and writers(run) == []
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss2")] == [0, 1]


def test_a_failed_rank_fails_the_run_at_once_and_it_stays_failed(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    ranks = rank_runs(tracking_uri, experiment_name, 3)
    ranks[1].close(timeout=30, reason="failed")
    assert only_run(client, experiment_name, "job").info.status == "FAILED"  # not waiting
    ranks[2].close(timeout=30, reason="killed")  # torchrun stops the others: still FAILED
    ranks[0].close(timeout=30)  # finishing well does not hide the failure
    run = only_run(client, experiment_name, "job")
    assert run.info.status == "FAILED" and writers(run) == []


def test_a_resumed_run_runs_again_then_finishes(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    (first,) = rank_runs(tracking_uri, experiment_name, 1)
    first.close(timeout=30)
    assert only_run(client, experiment_name, "job").info.status == "FINISHED"
    (resumed,) = rank_runs(tracking_uri, experiment_name, 1)  # the job restarted
    assert only_run(client, experiment_name, "job").info.status == "RUNNING"
    resumed.close(timeout=30)
    assert only_run(client, experiment_name, "job").info.status == "FINISHED"


def test_reads_do_not_make_a_process_a_writer(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    (writer,) = rank_runs(tracking_uri, experiment_name, 1)
    reader = MLflowTracker(experiment_name, tracking_uri)
    assert reader.metrics("job")["loss0"][0].value == 1.0
    assert reader.get_run("job").info.status == "RUNNING"
    reader.close()  # it wrote nothing: it ends nothing
    assert only_run(client, experiment_name, "job").info.status == "RUNNING"
    writer.close(timeout=30)
    assert only_run(client, experiment_name, "job").info.status == "FINISHED"


# -- a run name that matches several runs ------------------------------------------------------
def test_a_run_name_matching_several_runs_is_a_clear_error(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    tracker = MLflowTracker(experiment_name, tracking_uri)
    exp_id = tracker.experiment_id
    made = [client.create_run(exp_id, run_name="dup").info.run_id for _ in range(2)]
    with pytest.raises(AmbiguousRunError, match=r"2 MLflow runs .* are named 'dup'") as info:
        tracker.get_run("dup")
    assert isinstance(info.value, TrackerConfigError) and isinstance(info.value, ValueError)
    # torchx's MLflowTracker raises RuntimeError for duplicate names: caught the same way.
    assert isinstance(info.value, RuntimeError)
    assert all(uuid in str(info.value) for uuid in made)

    # Through a run: nothing is written to either run, and nothing is dropped; the records
    # wait (a failure of the backend) and the report says why.
    run = AppRun("dup", [tracker], flush_interval=3600, retry=FAST_RETRY)
    try:
        run.log_metric("loss", 1.0, step=0)
        report = run.flush(timeout=30)
        assert not report.ok and report.dropped == 0, report
        assert "2 MLflow runs" in report.errors["mlflow"]
        assert classify(info.value) == "backend" and isinstance(info.value, PermanentBackendError)
        for uuid in made:
            assert client.get_metric_history(uuid, "loss") == []
        client.delete_run(made[1])  # the user settles it: the records go to the one left
        report = run.flush(timeout=30)
        assert report.ok, report
    finally:
        run.close(timeout=30)
    assert [m.value for m in client.get_metric_history(made[0], "loss")] == [1.0]
    assert client.get_run(made[0]).info.status == "FINISHED"
