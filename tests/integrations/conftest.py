"""Fixtures for the framework integrations: an environment of the test's own (no TORCHX_* or
ASYNC_TRACKER_* variable, no run_from_env() singleton, its own working directory) and a store
to read back what was logged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import async_tracker.run
from tests.integrations.helpers import Store


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work
    async_tracker.AppRun.reset_from_env(timeout=10.0)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty store (``dir=`` of ``async_tracker.init``), read with the fsspec backend."""
    return Store(tmp_path / "runs")
