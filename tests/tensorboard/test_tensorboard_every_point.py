"""TensorBoard reads every stored point back, and a retried or replayed batch once: event
files are appended to, so a batch sent again is in the files twice, and the batch event
before its points tells the copies apart (see tests/every_point.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from async_tracker import AsyncTrackerBase
from async_tracker.backend.tensorboard import AsyncTensorBoardTracker
from tests.every_point import (
    a_killed_durable_run_replays_each_point_once,
    a_retried_batch_is_stored_once,
    every_point_comes_back,
)

pytestmark = pytest.mark.server  # needs the tensorboard extra


def local(root: Path) -> AsyncTrackerBase:
    return AsyncTensorBoardTracker(root)


def test_every_point_comes_back(tmp_path: Path) -> None:
    every_point_comes_back(local, tmp_path)


def test_a_retried_batch_is_stored_once(tmp_path: Path) -> None:
    a_retried_batch_is_stored_once(local, tmp_path)


def test_a_killed_durable_run_replays_each_point_once(tmp_path: Path) -> None:
    a_killed_durable_run_replays_each_point_once("tensorboard", tmp_path)
