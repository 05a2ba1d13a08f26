"""The backend conformance suite on the TensorBoard backend (event files in a local folder)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from async_tracker import AsyncTrackerBase
from async_tracker.backend.tensorboard import AsyncTensorBoardTracker, map_error
from tests.conformance import BackendConformance

pytestmark = pytest.mark.server  # needs the tensorboard extra


class TestTensorBoard(BackendConformance):
    def mapped_faults(self) -> tuple[BaseException, BaseException]:
        outage = map_error(OSError(errno.EIO, "Input/output error"), "append to x")
        too_long = map_error(OSError(errno.ENAMETOOLONG, "File name too long"), "write of x")
        return outage, too_long

    @pytest.fixture
    def backend(self, tmp_path: Path) -> AsyncTrackerBase:
        return AsyncTensorBoardTracker(tmp_path / "tb")
