"""Artifacts on a real server: local files and directories uploaded with ``log_artifact`` and
downloadable with MLflow's own ``download_artifacts``; URIs and paths not on this machine
recorded only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.artifacts
import pytest

from async_tracker import AppRun, Batch, TrackerArtifact
from async_tracker.backend.mlflow import AsyncMLflowTracker, MLflowTracker


@pytest.fixture
def tracker(tracking_uri: str, experiment_name: str) -> MLflowTracker:
    return MLflowTracker(experiment_name, tracking_uri)


def test_local_files_and_directories_are_uploaded_and_download(
    tracker: MLflowTracker, tracking_uri: str, client: Any, tmp_path: Path
) -> None:
    model = tmp_path / "model.pt"
    model.write_bytes(b"\x00weights\xff")
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    (logs / "a.txt").write_text("a")
    (logs / "sub" / "b.txt").write_text("b")
    config = tmp_path / "config.yaml"
    config.write_text("lr: 0.1\n")
    wanted = {
        "model": TrackerArtifact("model", str(model), {"epoch": 3}),
        "logs": TrackerArtifact("logs", str(logs), None),
        "configs/main": TrackerArtifact("configs/main", config.as_uri(), None),  # file://
        "remote": TrackerArtifact("remote", "s3://bucket/model.pt", None),
        "elsewhere": TrackerArtifact("elsewhere", "/not/on/this/host.pt", None),
    }
    with AppRun("r", [tracker], flush_interval=3600) as run:
        for art in wanted.values():
            run.add_artifact(art.name, art.path, art.metadata)
    assert tracker.artifacts("r") == wanted  # each recorded as given

    uuid = tracker.get_run_id("r")

    def download(path: str) -> Path:
        return Path(
            mlflow.artifacts.download_artifacts(
                run_id=uuid, artifact_path=path, tracking_uri=tracking_uri,
                dst_path=str(tmp_path / "downloads" / path),
            )
        )  # fmt: skip

    assert download("model/model.pt").read_bytes() == b"\x00weights\xff"
    got = download("logs")
    assert (got / "logs" / "a.txt").read_text() == "a"
    assert (got / "logs" / "sub" / "b.txt").read_text() == "b"
    assert download("configs/main/config.yaml").read_text() == "lr: 0.1\n"
    # A URI, or a path that is not here, is recorded and not uploaded.
    assert sorted(a.path for a in client.list_artifacts(uuid)) == ["configs", "logs", "model"]


async def test_an_upload_retried_or_replayed_overwrites(
    tracking_uri: str, experiment_name: str, client: Any, tmp_path: Path
) -> None:
    backend = AsyncMLflowTracker(experiment_name, tracking_uri)
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_text("v1")
    batch = Batch(0, artifacts={"ckpt": TrackerArtifact("ckpt", str(ckpt), None)}, records=1)
    await backend.write_batch("r", batch)
    assert any(part.startswith("mlflow:upload:") for part in batch.done)
    ckpt.write_text("v2")
    await backend.write_batch("r", batch)  # a retry: the upload is done, not repeated
    await backend.write_batch("r", Batch(1, artifacts=batch.artifacts, records=1))  # a replay
    uuid = (await backend.get_run("r")).info.run_id
    (entry,) = client.list_artifacts(uuid, "ckpt")
    assert entry.path == "ckpt/ckpt.pt"
    got = mlflow.artifacts.download_artifacts(
        run_id=uuid, artifact_path="ckpt/ckpt.pt", tracking_uri=tracking_uri,
        dst_path=str(tmp_path / "dl"),
    )  # fmt: skip
    assert Path(got).read_text() == "v2"
    await backend.aclose()


def test_artifact_names_that_cannot_be_upload_paths_are_refused_at_the_call_site(
    tracker: MLflowTracker, client: Any, experiment_name: str, tmp_path: Path
) -> None:
    f = tmp_path / "f.txt"
    f.write_text("x")
    for name in ("../escape", "/abs", "a/../b", "with#hash", "what?", "100%", "a//b"):
        with pytest.raises(ValueError, match=r"artifact .*relative path"):
            tracker.add_artifact("r", name, str(f))
    assert client.get_experiment_by_name(experiment_name) is None  # nothing was sent
    tracker.add_artifact("r", "../escape", "https://example.com/f.txt")  # recorded only: fine
    assert list(tracker.artifacts("r")) == ["../escape"]
    tracker.close()
