"""A run's tags and note in a TensorBoard log directory: read back by ``AppRun.tags()`` and
``note()``, shown in the Text tab's metadata table, and kept out of the HParams table's
columns (one per tag ever used would crowd it)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from async_tracker import AppRun
from async_tracker.backend.tensorboard import METADATA_TAG, AsyncTensorBoardTracker, run_path
from async_tracker.tags import NOTE_KEY, TAG_KEY_PREFIX
from tests.tensorboard.helpers import accumulate, text
from tests.tensorboard.test_tensorboard_hparams import HParamsTab, session

pytestmark = pytest.mark.server  # needs the tensorboard extra


def test_tags_and_the_note_round_trip_and_stay_out_of_hparams(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    with AppRun("sweep/a", [AsyncTensorBoardTracker(root)]) as run:
        run.add_metadata(lr=0.1, model="mlp")
        run.add_tags("baseline", "draft")
        run.set_note("first")
        run.log_metric("loss", 0.5, step=1)
        assert run.flush(30).ok
        run.remove_tags("draft")
        run.set_note("the baseline")
    reader = AppRun("sweep/a", [AsyncTensorBoardTracker(root)])
    assert reader.tags() == {"baseline"}
    assert reader.note() == "the baseline"
    assert reader.metadata() == {"lr": 0.1, "model": "mlp"}
    # In the Text tab: the first full table holds them (later changes are smaller tables;
    # cells are code spans).
    rows = {k: v for k, v in text(accumulate(root / run_path("sweep/a")), METADATA_TAG)}
    assert rows[f"`{TAG_KEY_PREFIX}baseline`"] == "`true`"
    assert rows[f"`{NOTE_KEY}`"] == "`first`"
    # In the HParams tab: the params alone.
    tab = HParamsTab(root)
    _, group = session(tab, "sweep/a")
    assert set(group.hparams) == {"lr", "model"}
    assert set(tab.columns()) == {"lr", "model"}
