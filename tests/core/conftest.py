"""Fixtures shared by the core tests: a clean environment, runs closed after each test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun
from tests.core.helpers import FAST_RETRY, Child


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


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event that ends the hangs of a test when it is over (set even if the test fails)."""
    event = threading.Event()
    yield event
    event.set()
