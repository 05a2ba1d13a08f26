"""Fixtures for the MLflow tests: one real ``mlflow server`` for the session (SQLite store and
artifact root in a temporary directory, a free port on 127.0.0.1), killed at teardown.

Every test here has the ``server`` marker (tests/conftest.py). Without mlflow installed, the
whole directory is skipped when the run deselects them (``-m "not server"``), and fails otherwise.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from tests.mlflow.server import MlflowServer


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def server(mlflow_server: MlflowServer) -> Iterator[MlflowServer]:
    """The session's server, for a test that kills, stops or freezes it (each test uses an
    experiment of its own): running and answering again for the tests after it, whatever the
    test did. One server start per test process, not one more per outage module: a start
    costs seconds of CPU."""
    try:
        yield mlflow_server
    finally:
        mlflow_server.ensure_running()


@pytest.fixture(scope="session")
def tracking_uri(mlflow_server: MlflowServer) -> str:
    return mlflow_server.url


@pytest.fixture
def experiment_name() -> str:
    """An experiment of the test's own, so that searches see only its runs."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(tracking_uri: str) -> Any:
    """A plain MlflowClient on the server: what the tests read back with, independently of
    the tracker under test."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri)


@pytest.fixture(autouse=True)
def default_store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default local store (a SQLite file) in the test's directory, not the machine's:
    trackers built without a tracking URI open it."""
    from async_tracker.backend.mlflow import config

    monkeypatch.setattr(config, "DEFAULT_TRACKING_DIR", tmp_path / "default-store")
    return tmp_path / "default-store"

