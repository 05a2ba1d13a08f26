"""A metadata change writes the changed keys, not the whole table again, while the full table
overlaid with the changes table (what TensorBoard shows) and ``metadata()`` stay complete."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.util import tensor_util

from async_tracker import AppRun
from async_tracker.backend.tensorboard import (
    METADATA_CHANGES_TAG,
    METADATA_TAG,
    AsyncTensorBoardTracker,
)
from tests.tensorboard.helpers import accumulate

pytestmark = pytest.mark.server  # needs the tensorboard extra


def event_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("events.out.tfevents*"))


def cell(value: object) -> str:
    """A cell as the tables show it (JSON, text as it is, in a code span)."""
    return "`" + (value if isinstance(value, str) else json.dumps(value)) + "`"


def shown(logdir: str) -> dict[str, str]:
    """What TensorBoard's reader shows: the last full table, overlaid with the last changes
    table when it holds rows."""
    acc = accumulate(logdir)
    tables: dict[str, str] = {}
    for tag in (METADATA_TAG, METADATA_CHANGES_TAG):
        if tag not in acc.Tags()["tensors"]:
            continue
        array = tensor_util.make_ndarray(acc.Tensors(tag)[-1].tensor_proto)
        if array.ndim == 2:
            tables.update((k.decode(), v.decode()) for k, v in array)
    return tables


def test_a_large_config_then_one_key_updates_writes_the_config_once(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    # About 2.3 MB of JSON: a config of nested values, and text values (which go to hparams).
    config: dict[str, object] = {
        f"layer{i}": {"width": i, "act": "gelu" * 16, "dropout": 0.1} for i in range(16_000)
    }
    config.update({f"tag{i}": "v" * 60 for i in range(5_000)})
    assert 2_000_000 < len(json.dumps(config)) < 2_600_000
    tracker = AsyncTensorBoardTracker(root)
    with AppRun("big", [tracker]) as run:
        run.add_metadata(**config)
        assert run.flush().ok
        table = event_bytes(root)
        for i in range(20):
            run.add_metadata(**{f"update{i}": i, "tag0": f"changed {i}"})
            assert run.flush().ok
        written = event_bytes(root)
    # Every change rewrote the table before: 21 tables. Now the table once, plus the changes.
    assert written < 2 * table, (written, table)
    want = {**config, **{f"update{i}": i for i in range(20)}, "tag0": "changed 19"}
    assert shown(tracker.logdir("big")) == {cell(k): cell(v) for k, v in want.items()}
    assert asyncio.run(AsyncTensorBoardTracker(root).metadata("big")) == want


def test_many_changes_rewrite_the_table_now_and_then_and_show_every_key(tmp_path: Path) -> None:
    # A small table: the changes outgrow it soon, and the full table is written again.
    root = tmp_path / "tb"
    tracker = AsyncTensorBoardTracker(root)
    want: dict[str, object] = {"lr": 0.1, "optimizer": "adam"}
    with AppRun("small", [tracker]) as run:
        run.add_metadata(**want)
        for i in range(60):
            change = {f"k{i % 7}": i, "lr": i / 100}
            run.add_metadata(**change)
            want.update(change)
            assert run.flush().ok
            assert shown(tracker.logdir("small")) == {cell(k): cell(v) for k, v in want.items()}
    acc = accumulate(tracker.logdir("small"))
    fulls = len(acc.Tensors(METADATA_TAG))
    assert 2 <= fulls < 30, fulls  # rewritten now and then, not at every change
