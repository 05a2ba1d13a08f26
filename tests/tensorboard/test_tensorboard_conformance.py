"""The backend conformance suite on the TensorBoard backend (event files in a local folder)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from async_tracker import AsyncTrackerBase, TrackerMetric
from async_tracker.backend.tensorboard import AsyncTensorBoardTracker, map_error
from async_tracker.base import Checked
from tests.conformance import BackendConformance

pytestmark = pytest.mark.server  # needs the tensorboard extra


class TestTensorBoard(BackendConformance):
    def mapped_faults(self) -> tuple[BaseException, BaseException]:
        outage = map_error(OSError(errno.EIO, "Input/output error"), "append to x")
        too_long = map_error(OSError(errno.ENAMETOOLONG, "File name too long"), "write of x")
        return outage, too_long

    def library_faults(self) -> tuple[BaseException, BaseException | None]:
        return OSError(errno.EIO, "Input/output error"), OSError(errno.ENAMETOOLONG, "too long")

    def unstorable(self) -> Checked | None:
        return TrackerMetric("async_tracker/status", 1.0, 0, 0.0)  # a name the backend uses

    @pytest.fixture
    def backend(self, tmp_path: Path) -> AsyncTrackerBase:
        return AsyncTensorBoardTracker(tmp_path / "tb")
