"""Fixtures for the CLI tests: an isolated environment, a store of prepared runs, and a way to
run ``async-tracker`` in this process or as a child process."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

import async_tracker.run
from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker
from tests.fsspec.conftest import s3_endpoint  # noqa: F401  # the moto server, one per session

REPO = Path(__file__).resolve().parents[2]

PARENT = "local://tests/parent"
CHILD_A = "local://tests/child-a"
CHILD_B = "local://tests/child-b"
GRANDCHILD = "local://tests/grandchild"
EMPTY = "local://tests/no-metrics"


@dataclass(frozen=True)
class Store:
    """Runs the tests prepared: ``root`` holds them, ``config`` is the fsspec config file."""

    root: Path
    config: Path

    def tracker(self) -> FsspecTracker:
        return FsspecTracker(LocalFileSystem(), str(self.root))


@pytest.fixture(scope="session")
def _mpl_config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matplotlib")


@pytest.fixture(autouse=True)
def isolated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _mpl_config_dir: Path
) -> Iterator[Path]:
    """A working directory and HOME of the test's own (the machine's ~/.torchxconfig is
    ignored); the environment is clean (see tests/conftest.py)."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    # matplotlib keeps its font cache under HOME: one for the session spares each child
    # process that plots a rebuild.
    monkeypatch.setenv("MPLCONFIGDIR", str(_mpl_config_dir))
    monkeypatch.chdir(work)
    yield work
    async_tracker.run._env_run = None


def write_store(root: Path) -> None:
    """Four runs with lineage parent -> child-a -> grandchild, parent -> child-b, and one
    run with metadata only."""
    tracker = FsspecTracker(LocalFileSystem(), str(root))
    with AppRun(PARENT, [tracker]) as run:
        run.add_metadata(model="mlp", lr=0.05, layers=[64, 64])
        run.add_artifact("checkpoint", "/ckpt/step-9.pt", {"step": 9})
        run.add_artifact("config", "/cfg/run.yaml")
        for step in range(10):
            run.log_metrics({"loss": 1.0 / (step + 1), "accuracy": step / 10}, step=step)
        run.log_metric("grad_norm", math.nan, step=0)
        run.log_metric("grad_norm", math.inf, step=1)
        run.log_metric("grad_norm", 2.0, step=2)
    for child, source, artifact in (
        (CHILD_A, PARENT, None),
        (CHILD_B, PARENT, "checkpoint"),
        (GRANDCHILD, CHILD_A, None),
    ):
        with AppRun(child, [tracker]) as run:
            run.add_source(source, artifact)
            for step in range(5):
                run.log_metric("loss", 2.0 / (step + 1), step=step)
    with AppRun(EMPTY, [tracker]) as run:
        run.add_metadata(note="no metrics here")


@pytest.fixture(scope="session")
def _store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store") / "runs"
    write_store(root)
    return root


@pytest.fixture
def store(_store_template: Path, tmp_path: Path) -> Store:
    """The prepared runs (written once per session, read-only) and a config file for them."""
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={_store_template}\n")
    return Store(_store_template, config)


@pytest.fixture
def writable_store(tmp_path: Path) -> Store:
    """An empty store of the test's own, for commands that add runs."""
    root = tmp_path / "runs"
    config = tmp_path / "fsspec-rw.cfg"
    config.write_text(f"protocol=file\nroot_path={root}\n")
    return Store(root, config)


def write_torchxconfig(where: Path, store: Store, name: str = "fsspec", factory: str = "") -> Path:
    path = where / ".torchxconfig"
    path.write_text(
        f"[torchx:tracker]\n{name} = {factory}\n\n[tracker:{name}]\nconfig = {store.config}\n"
    )
    return path


@pytest.fixture
def configured(store: Store, isolated: Path) -> Store:
    """The prepared store, configured by ``.torchxconfig`` in the working directory."""
    write_torchxconfig(isolated, store)
    return store


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child interpreter: ours (already isolated), importing this
    checkout and ``tests``, unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m async_tracker ARGS`` as a child process, in the working directory."""
    return subprocess.run(
        [sys.executable, "-m", "async_tracker", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def s3_store(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    """A fresh bucket; the endpoint comes from ``AWS_ENDPOINT_URL``, which botocore reads, so
    a plain ``s3://`` URL reaches it (in child processes too)."""
    boto3 = pytest.importorskip("boto3")
    for var, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", s3_endpoint),
    ):
        monkeypatch.setenv(var, value)
    bucket = f"cli-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/runs"
