"""Writers fold the run index (``indexfold.py``): after many short-lived writers the store's
root holds a bounded number of index files, and every run is still listed once, with the
summary of everything its writers wrote; folds racing each other or a listing lose nothing."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import AsyncFsspecTracker, FsspecTracker, index, indexfold
from async_tracker.backend.fsspec.layout import INDEX_PREFIX, SUMMARY_PREFIX
from async_tracker.backend.fsspec.reader import FsspecReader
from async_tracker.backend.fsspec.storage import MAX_CONCURRENT_FILES, _gather_bounded
from async_tracker.backend.fsspec.summaries import run_summaries
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import RunSummary

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def eager_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small thresholds, so that a few dozen writers fold many times; fresh per-root state."""
    monkeypatch.setattr(indexfold, "FOLD_AFTER_FILES", 8)
    monkeypatch.setattr(indexfold, "FOLD_CHECK_EVERY", 1)
    monkeypatch.setattr(index, "COMPACT_AFTER_FILES", 4)
    monkeypatch.setattr(indexfold, "_states", {})


def index_files(root: Path) -> list[str]:
    """The run index's files at the root, checkpoints aside."""
    return sorted(
        name
        for name in os.listdir(root)
        if name.startswith(INDEX_PREFIX) and not name.startswith(index.CHECKPOINT_PREFIX)
    )


def short_runs(root: Path, cycles: int, ids: int) -> None:
    """``cycles`` writers, each an AppRun that logs one point (its cycle number) and closes."""
    fs = fsspec.filesystem("file")
    for i in range(cycles):
        run = AppRun(f"short/{i % ids}", [FsspecTracker(fs, str(root))])
        run.log_metric("step", float(i), i)
        report = run.close()
        assert report.ok and report.delivered == 1, report
        # The fold an end started runs beside the next cycle: waited for, so that each end
        # finds the root as the previous one left it.
        runtime().wait_background()


def listed(root: Path) -> dict[str, RunSummary]:
    store = AsyncFsspecTracker(fsspec.filesystem("file"), str(root))
    runs = runtime().loop.call(store.run_summaries)
    assert len(runs) == len({r.run_id for r in runs}), "a run listed twice"
    return {r.run_id: r for r in runs}


def check_runs(found: dict[str, RunSummary], cycles: int, ids: int, writers: int = 1) -> None:
    assert sorted(found) == sorted(f"short/{k}" for k in range(ids))
    for k in range(ids):
        summary = found[f"short/{k}"]
        assert summary.status == "finished"
        metric = summary.metrics["step"]
        # Every writer's point counted once; the last is the highest step.
        assert metric.count == writers * len(range(k, cycles, ids)), (k, metric)
        assert metric.last == max(range(k, cycles, ids))


def test_short_writers_leave_a_bounded_number_of_files_at_the_root(tmp_path: Path) -> None:
    cycles, ids = 60, 6
    short_runs(tmp_path, cycles, ids)
    # Without folds: one summary per writer and a claim per run (66 files). With them: what
    # the last fold left (live writers' files: none) plus those written since, under the
    # threshold.
    left = index_files(tmp_path)
    assert len(left) < indexfold.FOLD_AFTER_FILES + index.COMPACT_AFTER_FILES, left
    assert any(n.startswith(index.CHECKPOINT_PREFIX) for n in os.listdir(tmp_path))
    check_runs(listed(tmp_path), cycles, ids)


def test_a_live_writers_summary_is_never_folded_away(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    live = AppRun("live/run", [FsspecTracker(fs, str(tmp_path))])
    live.log_metric("step", 1.0, 1)
    assert live.flush().ok
    short_runs(tmp_path, 30, 3)  # no fold while this process holds a live writer: one now
    storage = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path))._writer._storage
    assert runtime().loop.call(
        lambda: indexfold._fold(storage, str(tmp_path), indexfold._FoldState())
    )
    # Its summary file is still at the root, and it is listed as running.
    token_files = [n for n in index_files(tmp_path) if n.startswith(SUMMARY_PREFIX)]
    assert token_files, "the live writer's summary was removed"
    assert listed(tmp_path)["live/run"].status == "running"
    assert live.close().ok
    found = listed(tmp_path)
    assert found["live/run"].status == "finished" and found["live/run"].metrics["step"].count == 1


def test_runs_closing_together_fold_once_after_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = fsspec.filesystem("file")
    opened = [AppRun(f"open/{i}", [FsspecTracker(fs, str(tmp_path))]) for i in range(20)]
    for run in opened:
        run.log_metric("step", 1.0, 1)
        assert run.flush().ok
    folds: list[int] = []
    real = indexfold.run_list

    async def counted(*args: Any, **kwargs: Any) -> Any:
        folds.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(indexfold, "run_list", counted)
    # While other writers of this process are live, an end does not look at the root: the
    # closes of runs that end together fold once, after the last of them.
    for run in opened[:-1]:
        assert run.close().ok
    runtime().wait_background()
    assert folds == []
    assert opened[-1].close().ok
    runtime().wait_background()
    assert len(folds) == 1
    # Every writer ended: all their files folded, without a reader.
    assert len(index_files(tmp_path)) < indexfold.FOLD_AFTER_FILES, index_files(tmp_path)
    found = listed(tmp_path)
    assert len(found) == 20 and all(r.status == "finished" for r in found.values())


def test_a_fold_racing_another_and_a_listing_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fold A is about to create its checkpoint when fold B runs whole (creates the same
    number, removes what it folded); A's create is refused. Then fold C, at its removal, has
    a listing run between its checkpoint and the removal: the listing sees each run once."""
    cycles, ids = 24, 4
    monkeypatch.setattr(indexfold, "FOLD_CHECK_EVERY", 10**9)  # no fold but ours
    checked = indexfold._FoldState(ends=1, checked_at=1)
    monkeypatch.setattr(indexfold, "_states", {str(tmp_path): checked})
    short_runs(tmp_path, cycles, ids)
    assert len(index_files(tmp_path)) >= cycles  # nothing folded yet
    storage = AsyncFsspecTracker(fsspec.filesystem("file"), str(tmp_path))._writer._storage
    real_create, real_remove = index._create, index._remove
    outcomes: list[bool] = []
    seen: list[dict[str, RunSummary]] = []

    async def create_after_another(storage_: Any, path: str, data: bytes) -> bool:
        if not outcomes:
            outcomes.append(True)
            await indexfold._fold(storage, str(tmp_path), indexfold._FoldState())
        created = await real_create(storage_, path, data)
        outcomes.append(created)
        return created

    monkeypatch.setattr(index, "_create", create_after_another)
    runtime().loop.call(lambda: indexfold._fold(storage, str(tmp_path), indexfold._FoldState()))
    assert outcomes == [True, True, False]  # B's checkpoint won; A stopped there
    monkeypatch.setattr(index, "_create", real_create)
    check_runs(listed(tmp_path), cycles, ids)

    short_runs(tmp_path, cycles, ids)  # more files to fold, two writers per cycle index now

    async def listing(storage_: Any, paths: Sequence[str]) -> None:
        # Between the fold's checkpoint and its removal: a reader lists the store.
        runs = await run_summaries(FsspecReader(storage, str(tmp_path)))
        assert len(runs) == len({r.run_id for r in runs}), "a run listed twice"
        seen.append({r.run_id: r for r in runs})
        await real_remove(storage_, paths)

    monkeypatch.setattr(index, "_remove", listing)
    runtime().loop.call(lambda: indexfold._fold(storage, str(tmp_path), indexfold._FoldState()))
    monkeypatch.setattr(index, "_remove", real_remove)
    assert seen, "the fold removed nothing"
    check_runs(seen[0], cycles, ids, writers=2)
    check_runs(listed(tmp_path), cycles, ids, writers=2)


# Writers in two processes at once, each folding at every end.
WRITER = """
import sys
import fsspec
from async_tracker import AppRun
from async_tracker.backend.fsspec import AsyncFsspecTracker, FsspecTracker, index, indexfold

indexfold.FOLD_AFTER_FILES = 4
indexfold.FOLD_CHECK_EVERY = 1
index.COMPACT_AFTER_FILES = 2
root, cycles, ids = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fs = fsspec.filesystem("file")
for i in range(cycles):
    run = AppRun(f"short/{i % ids}", [FsspecTracker(fs, root)])
    run.log_metric("step", float(i), i)
    assert run.close().ok
"""


def test_two_processes_writing_and_folding_at_once_lose_no_summary(tmp_path: Path) -> None:
    cycles, ids = 40, 5
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(cycles), str(ids)], env=env
        )
        for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    # Counted before the listing below, which compacts too: 80 writers' summaries and 5
    # claims without a fold.
    left = len(index_files(tmp_path))
    check_runs(listed(tmp_path), cycles, ids, writers=2)
    assert left < 2 * cycles


def test_a_fold_cut_short_leaves_no_coroutine_unawaited() -> None:
    """A fold given up at its budget cancels reads waiting for their turn: they are closed,
    not left to warn, at their collection, that they were never awaited."""
    started: list[int] = []

    async def cut_short() -> None:
        with anyio.CancelScope() as scope:

            async def read(i: int) -> int:
                started.append(i)
                scope.cancel()  # the budget runs out while the first reads are under way
                await anyio.sleep(0)
                return i

            await _gather_bounded([read(i) for i in range(3 * MAX_CONCURRENT_FILES)])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime().loop.call(cut_short)
        gc.collect()
    assert 0 < len(started) <= MAX_CONCURRENT_FILES
    assert not [w for w in caught if "never awaited" in str(w.message)], caught
