"""The examples, run top to bottom as a user would (smoke tests: they exit 0 and show what
they promise)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, child_env, cli

EXAMPLES = REPO / "examples"


def run_example(name: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def test_train_loop(isolated: Path) -> None:
    out = run_example("train_loop.py", "--dir", "runs", "--steps", "50", cwd=isolated)
    assert "records delivered, ok=True" in out
    assert "final_loss" in out
    assert "/checkpoints/step-49.pt" in out
    assert "loss" in out.split("$ async-tracker list metrics", 1)[1]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (isolated / "runs" / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_orchestrator(isolated: Path) -> None:
    out = run_example("orchestrator.py", "--dir", "runs", "--trials", "3", "--steps", "20",
                      cwd=isolated)  # fmt: skip
    tree = out.split("$ async-tracker lineage ", 1)[1].split("\n\n", 1)[0].splitlines()
    sweep_id = tree[0]
    assert tree[1:3] == [sweep_id, "├── parents"]
    trials = [line.split("── ", 1)[1] for line in tree[4:]]
    assert len(trials) == 3
    assert all(t.startswith("local://async_tracker/trial") for t in trials)
    assert "best_run" in out


@pytest.mark.server  # it starts moto's S3 server; needs the s3 extra
def test_s3_setup(isolated: Path) -> None:
    for module in ("s3fs", "boto3", "moto"):
        pytest.importorskip(module)
    out = run_example("s3_setup.py", "--dir", "cfg", "--steps", "5", cwd=isolated)
    assert "client_kwargs.endpoint_url=http://127.0.0.1:" in out
    run_id = out.split("$ async-tracker list metrics ", 1)[1].splitlines()[0]
    assert run_id.startswith("local://examples/s3-")
    assert run_id in out.split("$ async-tracker list jobs", 1)[1]
    assert "5      4" in out  # COUNT and LAST STEP of the loss


@pytest.mark.server  # it starts an mlflow server; needs the mlflow extra
def test_mlflow_example(isolated: Path) -> None:
    # Written with the MLflow backend; it starts its own local server and reads the run back
    # with MLflow's own client: what it prints is what the server holds.
    pytest.importorskip("mlflow")
    # Its default --dir: the commands of the package's default store, run afterwards in the
    # same folder, find nothing of it to warn about.
    out = run_example("mlflow_example.py", "--steps", "300", cwd=isolated)
    assert not (isolated / "tracker_runs").exists()
    listed = cli("list", "jobs")
    assert listed.returncode == 0 and "mlflow" not in listed.stderr, listed.stderr
    # No link to the server that stopped with the script: how to serve its store again.
    assert "http://127.0.0.1:5000/#/experiments/" in out and "UI: http" not in out
    db = isolated / "mlflow_example" / "mlflow-server" / "mlflow.db"
    assert f"mlflow server --backend-store-uri sqlite:///{db}" in out
    report = out.split(": FlushReport(", 1)[1]
    assert report.startswith("delivered=602, pending=0, spooled=0, dropped=0"), out  # 2x300+2
    assert "(local://examples/mlflow-" in out and "): FINISHED" in out
    assert "loss: 300 points, last " in out
    last = float(out.split("loss: 300 points, last ", 1)[1].split()[0])
    assert abs(last - 2.5 * 0.998**300) < 1e-4
    assert "metadata: {'dataset': 'synthetic', 'seed': 0}" in out
    assert "artifacts: ['checkpoint']" in out
    assert "uploaded: ['checkpoint/step-299.pt']" in out  # the local file, in MLflow
    assert "'optimizer.lr': '0.0003'" in out  # the nested config, flattened into params


@pytest.mark.server  # needs the lightning extra
def test_lightning_example(isolated: Path) -> None:
    pytest.importorskip("lightning")
    out = run_example("lightning_mnist_like.py", "--dir", "runs", "--epochs", "2", cwd=isolated)
    run_id = out.split("$ async-tracker list metadata ", 1)[1].splitlines()[0]
    assert run_id.startswith("mnist-like/")
    assert f"run {run_id}: val_acc " in out
    metadata = out.split("$ async-tracker list artifacts", 1)[0]
    assert "hidden" in metadata and "0.05" in metadata  # the hyperparameters
    artifacts = out.split("$ async-tracker list artifacts", 1)[1].split("$ async-tracker", 1)[0]
    assert "checkpoint/best" in artifacts and "last.ckpt" in artifacts
    metrics = out.split("$ async-tracker list metrics", 1)[1].split("$ async-tracker", 1)[0]
    rows = {line.split()[0]: line.split() for line in metrics.splitlines()[3:] if line}
    assert rows["val_acc"][-2] == "2"  # COUNT: one per epoch
    assert {"train_loss", "train_acc", "val_loss"} <= set(rows)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (isolated / "runs" / "lightning_curves.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.server  # needs the transformers extra
def test_hf_trainer_example(isolated: Path) -> None:
    for module in ("transformers", "accelerate"):
        pytest.importorskip(module)
    out = run_example("hf_trainer.py", "--dir", "runs", "--steps", "40", cwd=isolated)
    run_id = out.split("$ async-tracker list artifacts ", 1)[1].splitlines()[0]
    assert run_id.startswith("hf-trainer/")
    artifacts = out.split("$ async-tracker list artifacts", 1)[1].split("$ async-tracker", 1)[0]
    assert str(isolated / "runs" / ".hf" / "checkpoint-40") in artifacts
    metrics = out.split("$ async-tracker list metrics", 1)[1].split("$ async-tracker", 1)[0]
    rows = {line.split()[0]: line.split() for line in metrics.splitlines()[3:] if line}
    assert rows["loss"][-2:] == ["4", "40"]  # COUNT, LAST STEP: logged every 10 steps
    assert rows["eval_loss"][-2:] == ["1", "40"]
    assert f"async-tracker list metadata {run_id}" in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert (isolated / "runs" / "hf_curves.png").read_bytes().startswith(b"\x89PNG")


def test_the_first_example_writes_where_the_cli_reads_by_default(isolated: Path) -> None:
    # As in the README: the example with no --dir, then `async-tracker list jobs` with no
    # --store, from the same folder: the run is listed, and nothing is said about the
    # store's own config file.
    out = run_example("train_loop.py", "--steps", "20", cwd=isolated)
    run_id = out.split("$ async-tracker list metadata ", 1)[1].splitlines()[0]
    assert (isolated / "tracker_runs" / "fsspec.cfg").is_file()
    listed = cli("list", "jobs")
    assert listed.returncode == 0, listed.stderr
    assert run_id in listed.stdout
    assert "finished" in listed.stdout
    assert listed.stderr == ""
