"""The in-memory backend reads every point back, and a retried batch once (see
tests/every_point.py)."""

from __future__ import annotations

from pathlib import Path

from async_tracker import AsyncTrackerBase
from async_tracker.backend.memory import InMemoryTracker
from tests.every_point import a_retried_batch_is_stored_once, every_point_comes_back

_STORES: dict[Path, InMemoryTracker] = {}


def memory(root: Path) -> AsyncTrackerBase:
    # One store per test folder: the reader sees what the writer stored.
    return _STORES.setdefault(root, InMemoryTracker())


def test_every_point_comes_back(tmp_path: Path) -> None:
    every_point_comes_back(memory, tmp_path)


def test_a_retried_batch_is_stored_once(tmp_path: Path) -> None:
    a_retried_batch_is_stored_once(memory, tmp_path)
