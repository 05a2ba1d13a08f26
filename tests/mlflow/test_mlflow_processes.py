"""Several processes against one MLflow server: ranks of one job sharing a run id, and the
run's final status when a job ends on an uncaught exception (the atexit path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from async_tracker.backend.mlflow import TAG_RUN_KEY, run_key
from tests.core.helpers import Child

RANK = r"""
import sys
from async_tracker import AppRun
from async_tracker.backend.mlflow import MLflowTracker

uri, experiment, run_id, rank = sys.argv[1:5]
tracker = MLflowTracker(experiment, uri)
import mlflow  # imported here, so that "go" finds every rank ready to race
print("ready", flush=True)
sys.stdin.readline()  # "go": every rank starts at once
with AppRun(run_id, [tracker], flush_interval=3600) as run:
    run.add_metadata(**{f"rank{rank}": int(rank)})
    for step in range(100):
        run.log_metric(f"loss{rank}", 1.0 / (step + 1), step=step)
    report = run.flush(timeout=60)
    assert report.ok, report
tracker.close()
print("done", tracker.get_run_id(run_id), flush=True)
"""


def done_line(child: Child) -> str:
    """The child's "done" line (MLflow prints links to the run on stdout when it ends one)."""
    while not (line := child.readline(timeout=60)).startswith("done"):
        pass
    return line


def test_ranks_starting_together_share_one_mlflow_run(
    tracking_uri: str, experiment_name: str, client: Any
) -> None:
    # Neither the experiment nor the run exists: the ranks race to create both.
    ranks = [Child(RANK, tracking_uri, experiment_name, "job-shared", str(r)) for r in range(3)]
    try:
        for child in ranks:
            assert child.readline(timeout=60) == "ready"
        for child in ranks:
            assert child.proc.stdin is not None
            child.proc.stdin.write(b"go\n")
            child.proc.stdin.flush()
        uuids = {done_line(child).split()[1] for child in ranks}
        assert [child.wait(30) for child in ranks] == [0, 0, 0]
    finally:
        for child in ranks:
            child.close()

    assert len(uuids) == 1
    exp = client.get_experiment_by_name(experiment_name)
    (run,) = client.search_runs(
        [exp.experiment_id], f"tags.`{TAG_RUN_KEY}` = '{run_key('job-shared')}'"
    )
    assert run.info.run_id in uuids
    from mlflow.entities import ViewType

    assert list(client.search_runs([exp.experiment_id], run_view_type=ViewType.DELETED_ONLY)) == []
    assert run.info.status == "FINISHED"
    assert {k: v for k, v in run.data.tags.items() if k.startswith("rank")} == {
        "rank0": "0",
        "rank1": "1",
        "rank2": "2",
    }
    for r in range(3):
        history = client.get_metric_history(run.info.run_id, f"loss{r}")
        assert sorted(m.step for m in history) == list(range(100))


JOB = r"""
import sys
from async_tracker import AppRun

run = AppRun.run_from_env()
run.add_metadata(stage="train")
run.log_metric("loss", 0.5, step=0)
if sys.argv[1] == "fail":
    raise RuntimeError("training diverged")
"""


def test_job_exiting_on_an_exception_ends_its_run_failed(
    tracking_uri: str, experiment_name: str, client: Any, tmp_path: Path
) -> None:
    (tmp_path / ".torchxconfig").write_text(
        f"[tracker:mlflow]\nexperiment_name = {experiment_name}\ntracking_uri = {tracking_uri}\n"
    )
    env = {"TORCHX_TRACKERS": "mlflow", "TORCHX_TRACKER_MLFLOW_CONFIG": str(tmp_path)}
    jobs = {mode: Child(JOB, mode, TORCHX_JOB_ID=f"job-{mode}", **env) for mode in ("fail", "ok")}
    try:
        codes = {mode: child.wait(60) for mode, child in jobs.items()}
        stderr = {mode: child.stderr() for mode, child in jobs.items()}
    finally:
        for child in jobs.values():
            child.close()
    assert codes == {"fail": 1, "ok": 0}, stderr
    assert "training diverged" in stderr["fail"]

    exp = client.get_experiment_by_name(experiment_name)
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert runs["job-fail"].info.status == "FAILED"
    assert runs["job-ok"].info.status == "FINISHED"
    for name, run in runs.items():
        # Everything logged before the exit was delivered by the exit hook.
        assert run.data.tags["stage"] == '"train"', name
        assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == [0.5]
