"""``async-tracker rm`` on MLflow, against a real server: the run found by its tag is deleted
the MLflow way (soft: marked deleted, hidden from searches and from ``list jobs``), the other
runs of the experiment are left as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import ViewType

from async_tracker import AppRun
from async_tracker.backend.mlflow import MLflowTracker
from async_tracker.cli.main import main


def test_rm_deletes_the_mlflow_run(
    tracking_uri: str, experiment_name: str, client: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    tracker = MLflowTracker(experiment_name, tracking_uri)
    try:
        for run_id in ("sweep/keep", "sweep/gone"):
            with AppRun(run_id, [tracker]) as run:
                run.log_metric("loss", 1.0, step=0)
    finally:
        tracker.close()
    config = tmp_path / ".torchxconfig"
    config.write_text(
        "[tracker:mlflow]\n"
        f"tracking_uri = {tracking_uri}\nexperiment_name = {experiment_name}\n"
    )
    flags = ["--tracker", "mlflow", "--config", str(config)]
    capsys.readouterr()  # MLflow's own "View run ..." lines, printed as runs end

    assert main([*flags, "rm", "sweep/g", "--yes"]) == 0
    assert capsys.readouterr().out == "sweep/gone: tracker 'mlflow': deleted\n"

    experiment = client.get_experiment_by_name(experiment_name)
    active = client.search_runs([experiment.experiment_id])
    assert [r.data.tags["async_tracker.run_id"] for r in active] == ["sweep/keep"]
    (deleted,) = client.search_runs(
        [experiment.experiment_id], run_view_type=ViewType.DELETED_ONLY
    )
    assert deleted.data.tags["async_tracker.run_id"] == "sweep/gone"
    assert deleted.info.lifecycle_stage == "deleted"

    assert main([*flags, "--json", "list", "jobs"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ["sweep/keep"]
    assert main([*flags, "rm", "sweep/gone", "--yes"]) == 2
    assert "unknown run id 'sweep/gone'" in capsys.readouterr().err
