"""A run's lives, ordered by a counter in the store, not by clocks: a requeued run reads
``running`` while its new life beats, the last life's ending and params win whatever the
clocks did, and the ranks of one life still combine (the worst ending winning)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import async_tracker
import async_tracker.run as run_module
from async_tracker import AppRun
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime
from async_tracker.store.open import open_reader

RUN_ID = "job/requeued"


@pytest.fixture(autouse=True)
def _no_env_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNC_TRACKER_DIR", raising=False)


def listed_status(root: str) -> str:
    (run,) = open_reader(root).run_summaries()
    return run.status


def test_a_requeued_run_reads_running_while_its_new_life_beats(tmp_path: Path) -> None:
    root, spool = str(tmp_path / "runs"), str(tmp_path / "spool")
    first = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=spool, quiet=True)
    first.log_metric("loss", 2.0, step=0)
    assert first.close(reason="killed").ok  # preempted
    assert listed_status(root) == "killed"
    assert open_reader(root).status(RUN_ID)[0] == "killed"
    # Requeued: the new life starts, logs, beats (at its start), and has not ended.
    second = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=spool, quiet=True)
    try:
        second.log_metric("loss", 1.0, step=1)
        assert second.flush(30).ok
        assert listed_status(root) == "running"
        assert open_reader(root).status(RUN_ID)[0] == "running"
    finally:
        assert second.close(30).ok
    assert listed_status(root) == "finished"
    assert open_reader(root).status(RUN_ID)[0] == "finished"


def test_the_last_life_wins_whatever_the_clocks_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, spool = str(tmp_path / "runs"), str(tmp_path / "spool")
    first = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=spool, quiet=True)
    first.add_metadata(lr=0.1)
    assert first.close(reason="killed").ok
    # The requeued job runs on a machine whose clock is an hour behind: its stamps and its
    # ending's time are all earlier than the first life's.
    behind = time.time() - 3600
    monkeypatch.setattr(run_module, "_wall_clock", lambda: behind)
    monkeypatch.setattr(time, "time", lambda: behind)
    try:
        second = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=spool, quiet=True)
        second.add_metadata(lr=0.01)
        assert second.close(30).ok
    finally:
        monkeypatch.undo()
    (run,) = open_reader(root).run_summaries()
    assert run.status == "finished"
    assert run.params["lr"] == 0.01
    assert open_reader(root).metadata(RUN_ID)["lr"] == 0.01
    assert open_reader(root).status(RUN_ID)[0] == "finished"


def test_ranks_of_one_life_still_combine(tmp_path: Path) -> None:
    root = str(tmp_path / "runs")
    first = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=str(tmp_path / "s"))
    assert first.close(reason="killed").ok
    with async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=str(tmp_path / "s")) as run:
        run.log_metric("loss", 1.0)
    # Another rank of that life (a run object of its own, which does not look its life
    # up) failing fails the run.
    rank1 = AppRun(RUN_ID, [open_store(root)], spool_dir=str(tmp_path / "s2"))
    with pytest.raises(RuntimeError), rank1:
        rank1.log_metric("loss", 3.0)
        raise RuntimeError("rank 1 failed")
    assert listed_status(root) == "failed"
    assert open_reader(root).status(RUN_ID)[0] == "failed"


def test_a_resume_begins_a_life_after_an_ended_one_and_joins_a_live_one(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "runs")
    lives = []
    for _ in range(3):
        # What the next start would live: one past each life that ended.
        run = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=str(tmp_path / "s"))
        assert run.close(30).ok
        lives.append(runtime().loop.call(open_store(root).life_state, RUN_ID)[0])
    assert lives == [2, 3, 4]
    # A life that has not ended (a rank of it still writes, or it crashed) is joined.
    rank0 = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=str(tmp_path / "s"))
    assert rank0.flush(30).ok
    assert runtime().loop.call(open_store(root).life_state, RUN_ID)[0] == 4
    assert rank0.close(30).ok
