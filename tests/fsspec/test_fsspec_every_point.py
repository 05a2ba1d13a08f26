"""fsspec reads every stored point back (local disk and S3), and a retried or replayed batch
once: a segment's name is fixed by its batch, so a second write of the batch overwrites it
(see tests/every_point.py)."""

from __future__ import annotations

from pathlib import Path

import fsspec

from async_tracker import AsyncTrackerBase
from async_tracker.backend.fsspec import AsyncFsspecTracker, create
from tests.every_point import (
    a_killed_durable_run_replays_each_point_once,
    a_retried_batch_is_stored_once,
    every_point_comes_back,
)


def local(root: Path) -> AsyncTrackerBase:
    return AsyncFsspecTracker(fsspec.filesystem("file"), str(root))


def test_every_point_comes_back(tmp_path: Path) -> None:
    every_point_comes_back(local, tmp_path)


def test_a_retried_batch_is_stored_once(tmp_path: Path) -> None:
    a_retried_batch_is_stored_once(local, tmp_path)


def test_a_killed_durable_run_replays_each_point_once(tmp_path: Path) -> None:
    a_killed_durable_run_replays_each_point_once("fsspec", tmp_path)


def test_every_point_comes_back_from_s3(s3_config: str, tmp_path: Path) -> None:
    every_point_comes_back(lambda _: create(s3_config).async_tracker, tmp_path)


def test_a_retried_batch_is_stored_once_on_s3(s3_config: str, tmp_path: Path) -> None:
    a_retried_batch_is_stored_once(lambda _: create(s3_config).async_tracker, tmp_path)
