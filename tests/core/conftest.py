"""Fixtures shared by the core tests: a clean environment, runs closed after each test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import async_tracker.run
from async_tracker import AppRun
from tests.core.helpers import FAST_RETRY, Child


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No TORCHX_* or ASYNC_TRACKER_* variable leaks into a test, and the per-process
    run_from_env() singleton is forgotten before and after it."""
    for var in list(os.environ):
        if var.startswith(("TORCHX_", "ASYNC_TRACKER_")):
            monkeypatch.delenv(var)
    async_tracker.run._env_run = None
    yield
    env_run = async_tracker.run._env_run
    if env_run is not None and not env_run.closed:
        env_run.close(timeout=1.0)
    async_tracker.run._env_run = None


@pytest.fixture
def make_run() -> Iterator[Callable[..., AppRun]]:
    """Builds AppRuns that flush only when told to (``flush_interval`` of an hour) and retry
    without waiting, and closes whatever the test left open."""
    runs: list[AppRun] = []

    def make(run_id: str, backends: Any = (), **kwargs: Any) -> AppRun:
        kwargs.setdefault("flush_interval", 3600)
        kwargs.setdefault("retry", FAST_RETRY)
        run = AppRun(run_id, backends, **kwargs)
        runs.append(run)
        return run

    yield make
    for run in runs:
        if not run.closed:
            run.close(timeout=1.0)


@pytest.fixture
def child() -> Iterator[Callable[..., Child]]:
    """Starts child interpreters and kills whatever is left of them after the test."""
    children: list[Child] = []

    def start(script: str | Path, *args: str, **env: str) -> Child:
        c = Child(script, *args, **env)
        children.append(c)
        return c

    yield start
    for c in children:
        c.close()
