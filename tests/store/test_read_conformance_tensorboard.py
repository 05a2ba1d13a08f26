"""The read conformance suite on the TensorBoard backend (event files in a local folder)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from async_tracker import AsyncTrackerBase
from async_tracker.backend.tensorboard import SIDE_DIR, AsyncTensorBoardTracker
from async_tracker.store.conformance import Planted, ReadConformance

pytestmark = pytest.mark.server  # needs the tensorboard extra


class TestTensorBoard(ReadConformance):
    def another_writer(self, backend: AsyncTrackerBase) -> AsyncTrackerBase:
        assert isinstance(backend, AsyncTensorBoardTracker)
        return AsyncTensorBoardTracker(backend.root_dir)  # its own event files

    def corrupt(self, backend: AsyncTrackerBase, run_id: str) -> Planted:
        assert isinstance(backend, AsyncTensorBoardTracker)
        logdir = backend.logdir(run_id)
        events = os.path.join(logdir, "events.out.tfevents.0000000000.garbage")
        side = os.path.join(logdir, SIDE_DIR, "zzzz-garbage.json")
        Path(events).write_bytes(b"\x05" * 40)  # records with bad CRCs
        Path(side).write_text("{not json")
        # A log directory holds whatever else its user put there: only folders holding a
        # run count, and the rest is not read at all (as TensorBoard itself does).
        root = Path(backend.root_dir)
        (root / "notes.txt").write_text("a foreign file")
        (root / "not-a-run").mkdir()
        (root / "not-a-run" / "readme.txt").write_text("a foreign folder")
        return Planted(metadata=side, metrics=events, root=None)

    @pytest.fixture
    def backend(self, tmp_path: Path) -> AsyncTrackerBase:
        return AsyncTensorBoardTracker(tmp_path / "tb")
