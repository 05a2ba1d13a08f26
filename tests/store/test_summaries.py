"""Run summaries kept by their writers in the fsspec store and read by the run list: written
at flush boundaries (one small write per batch, never per point), merged across real
processes writing one run, kept by a run whose process was SIGKILLed (then crashed per its
heartbeats), a batch written twice (retry, replay by another process) counted once, and runs
without any summary (older stores, torchx's) rebuilt once."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from async_tracker import AppRun, Store
from async_tracker.backend.fsspec import (
    CLAIM_FILE,
    INDEX_PREFIX,
    REBUILT_TOKEN,
    SUMMARY_PREFIX,
    AsyncFsspecTracker,
    FsspecTracker,
    encode_run_id,
    summary_path,
)
from async_tracker.backend.fsspec.storage import _decode_json, _encode_json
from async_tracker.cli.main import main
from async_tracker.init_run import open_store
from async_tracker.records import Batch, TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.summary import RunSummary
from tests.core.helpers import Child, wait_until

RUN = "proj/run-1"


def summaries(root: Path | str, now: float | None = None) -> dict[str, RunSummary]:
    store = open_store(str(root))
    assert isinstance(store, AsyncFsspecTracker)
    return {r.run_id: r for r in runtime().loop.call(store.run_summaries, now)}


def writer_summaries(root: Path, run_id: str = RUN) -> list[Path]:
    """The files of the writers' summaries of ``run_id`` (the rebuilt one aside)."""
    rebuilt = rebuilt_summary(root, run_id)
    return sorted(p for p in root.glob(Path(summary_path(str(root), run_id, "*")).name)
                  if p != rebuilt)  # fmt: skip


def rebuilt_summary(root: Path, run_id: str = RUN) -> Path:
    return Path(summary_path(str(root), run_id, REBUILT_TOKEN))


def token_of(summary: Path) -> str:
    return summary.name.rsplit("-", 1)[1].removesuffix(".json")


class CountingFS(LocalFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """The local filesystem, counting the summary files it puts in place (a staged write
    ends with a move; an unstaged one is a pipe)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.summary_writes = 0

    def mv(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        if f"/{SUMMARY_PREFIX}" in str(path2):
            self.summary_writes += 1
        super().mv(path1, path2, **kwargs)


class CountingTracker(AsyncFsspecTracker):
    """The fsspec backend, counting the batches it is given."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        super().__init__(fs, root)
        self.batches = 0

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        self.batches += 1
        await super().write_batch(run_id, batch)


def test_the_summary_is_written_once_per_batch_never_per_point(tmp_path: Path) -> None:
    fs = CountingFS(skip_instance_cache=True)
    backend = CountingTracker(fs, str(tmp_path / "runs"))
    run = AppRun(RUN, [backend], spool_dir=str(tmp_path / "spool"), heartbeat_s=0)
    run.add_metadata(lr=0.1)
    for flush in range(5):
        for step in range(flush * 200, (flush + 1) * 200):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        assert run.flush(30).ok
        (found,) = summaries(tmp_path / "runs").values()
        # After each flush the summary holds every point flushed so far.
        assert found.metrics["loss"].count == (flush + 1) * 200
        assert found.metrics["loss"].last_step == (flush + 1) * 200 - 1
    run.close(30)
    assert backend.batches >= 6  # five flushes and the end record
    assert fs.summary_writes == backend.batches  # one per batch: 1,000 points, no more
    (found,) = summaries(tmp_path / "runs").values()
    assert found.status == "finished" and found.params == {"lr": 0.1}
    loss = found.metrics["loss"]
    assert (loss.count, loss.last, loss.min, loss.max) == (1000, 1 / 1000, 1 / 1000, 1.0)


# A rank of a job (argv: store, rank): logs its own metric and a shared one, then closes.
RANK = """
import sys
import async_tracker
store, rank = sys.argv[1], int(sys.argv[2])
with async_tracker.init("proj", dir=store, id="proj/run-1", resume="allow",
                        config={f"rank{rank}": rank, "shared": rank}) as run:
    for step in range(50):
        run.log_metric(f"own{rank}", float(step), step=step)
        run.log_metric("shared", float(rank * 100 + step), step=step)
        if step % 10 == 9:
            run.flush(30)
print("done", flush=True)
"""


def test_summaries_of_two_processes_writing_one_run_merge(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    ranks = [Child(RANK, str(root), str(rank)) for rank in (0, 1)]
    try:
        for child in ranks:
            assert child.readline(60) == "done"
            assert child.wait(60) == 0
    finally:
        for child in ranks:
            child.close()
    assert len(writer_summaries(root)) == 2  # one per process
    run = summaries(root)[RUN]
    assert run.status == "finished"
    assert {run.params["rank0"], run.params["rank1"]} == {0, 1}
    assert run.metrics["own0"].count == run.metrics["own1"].count == 50
    shared = run.metrics["shared"]
    assert (shared.count, shared.min, shared.max, shared.last_step) == (100, 0.0, 149.0, 49)
    # What the full read of the run says, the summary says.
    store = FsspecTracker(fsspec.filesystem("file"), str(root))
    assert len(store.metrics(RUN)["shared"]) == shared.count


# A job (argv: store, spool) that logs, flushes, says "ready" and waits to be SIGKILLed.
DOOMED = """
import sys, time
from async_tracker import AppRun
from async_tracker.init_run import open_store
run = AppRun("proj/run-1", [open_store(sys.argv[1])], spool_dir=sys.argv[2], heartbeat_s=0.5)
run.add_metadata(lr=0.5)
for step in range(30):
    run.log_metric("loss", float(30 - step), step=step)
assert run.flush(30).ok
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def test_a_sigkilled_run_is_listed_with_what_it_wrote_and_crashed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    beats = root / encode_run_id(RUN) / "heartbeat"
    job = Child(DOOMED, str(root), str(tmp_path / "spool"))
    try:
        assert job.readline(60) == "ready"
        wait_until(lambda: beats.is_dir() and any(beats.iterdir()), "a heartbeat")
        assert summaries(root)[RUN].status == "running"
        os.kill(job.proc.pid, signal.SIGKILL)
        assert job.wait(60) == -signal.SIGKILL
    finally:
        job.close()
    (beat,) = beats.iterdir()
    last = json.loads(beat.read_text())["time"]
    assert summaries(root, now=last + 1.0)[RUN].status == "running"  # within 3 intervals
    run = summaries(root, now=last + 1.6)[RUN]
    assert run.status == "crashed" and run.heartbeat == last and run.end is None
    assert run.params == {"lr": 0.5}
    loss = run.metrics["loss"]
    assert (loss.count, loss.last, loss.min, loss.last_step) == (30, 1.0, 1.0, 29)


def keyed_batch(token: str, seq: int, steps: range, part: str = "") -> Batch:
    """A batch as a pipeline cuts it: its key names its writer and number."""
    key = f"{time.time_ns():019d}-{token}-{seq:012d}{part}"
    points = [TrackerMetric("loss", float(s), s, 1000.0 + s) for s in steps]
    return Batch(seq, metrics=points, records=len(points), first=seq - len(points) + 1, key=key)


def test_a_batch_written_twice_counts_once(tmp_path: Path) -> None:
    root = str(tmp_path / "runs")
    token = "1795000000000000000xabc123"
    writer = AsyncFsspecTracker(fsspec.filesystem("file"), root)
    first, second = keyed_batch(token, 9, range(10)), keyed_batch(token, 19, range(10, 20))
    loop = runtime().loop
    loop.call(writer.write_batch, RUN, first)
    loop.call(writer.write_batch, RUN, second)
    # A retry after a partial write (done marks lost), by the same process.
    loop.call(writer.write_batch, RUN, first.for_lane())
    assert summaries(root)[RUN].metrics["loss"].count == 20
    # A replay of both by another process (`async-tracker sync`): it continues the
    # writer's summary from the store, and counts nothing twice.
    replayer = AsyncFsspecTracker(fsspec.filesystem("file"), root)
    loop.call(replayer.write_batch, RUN, first.for_lane())
    loop.call(replayer.write_batch, RUN, second.for_lane())
    # Parts of a batch the lane split share its number: both count, once each.
    for part in (".0", ".1"):
        batch = keyed_batch(token, 29, range(20 + 5 * int(part[1]), 25 + 5 * int(part[1])), part)
        loop.call(replayer.write_batch, RUN, batch)
        loop.call(replayer.write_batch, RUN, batch.for_lane())
    loss = summaries(root)[RUN].metrics["loss"]
    assert (loss.count, loss.last_step) == (30, 29)
    stored = FsspecTracker(fsspec.filesystem("file"), root).metrics(RUN)["loss"]
    assert [p.step for p in stored] == list(range(30))
    assert [token_of(p) for p in writer_summaries(tmp_path / "runs")] == [token]


def write_run(root: Path, run_id: str = RUN, points: int = 20) -> None:
    with AppRun(run_id, [open_store(root)], heartbeat_s=0) as run:
        run.add_metadata(lr=0.1, epochs=3)
        for step in range(points):
            run.log_metric("loss", float(points - step), step=step)


def drop_index(root: Path) -> None:
    """As a store written before summaries existed: no run index at all."""
    for p in root.glob(f"{INDEX_PREFIX}*"):
        p.unlink()


def test_a_run_without_summaries_is_rebuilt_once(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root)
    # Before a listing: it compacts the index, and removes the summary of a writer that ended.
    kept = {p.name: p.read_bytes() for p in writer_summaries(root)}
    expected = summaries(root)[RUN]
    drop_index(root)
    rebuilt_at = rebuilt_summary(root)
    found = summaries(root)[RUN]
    assert rebuilt_at.exists()
    assert (found.status, found.params, found.metrics) == (
        expected.status, expected.params, expected.metrics,
    )  # fmt: skip
    assert found.start == expected.start and found.end == expected.end
    # Read again: from the rebuilt summary, not rebuilt again (the file is not rewritten).
    inode = rebuilt_at.stat().st_ino
    assert summaries(root)[RUN] == found
    assert rebuilt_at.stat().st_ino == inode
    # A writer whose own summary lands after the rebuild (it was writing meanwhile): its
    # summary replaces its part of the rebuilt one, nothing counts twice.
    for name, data in kept.items():
        (root / name).write_bytes(data)
    assert summaries(root)[RUN].metrics == expected.metrics


def test_a_run_written_by_the_direct_api_only_is_summarised(tmp_path: Path) -> None:
    # torchx's API (FsspecTracker's methods, no pipeline): each call is its own flush.
    root = tmp_path / "runs"
    store = FsspecTracker(fsspec.filesystem("file"), str(root))
    store.add_metadata(RUN, lr=0.3)
    store.add_metrics(RUN, [TrackerMetric("acc", 0.5, 0, 10.0), TrackerMetric("acc", 0.7, 1, 11)])
    store.add_metadata(RUN, lr=0.4)
    run = summaries(root)[RUN]
    assert run.params == {"lr": 0.4} and run.metrics["acc"].count == 2
    assert run.start == 10.0 and run.status == "running"
    assert not rebuilt_summary(root).exists()


def test_a_directory_that_is_no_run_is_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root)
    # A source of lineage that never ran here: only its descendants folder.
    other = root / encode_run_id("dataset/v1") / "descendants"
    other.mkdir(parents=True)
    (other / "x").write_text("")
    assert set(summaries(root)) == {RUN}
    assert not rebuilt_summary(root, "dataset/v1").exists()


def test_an_old_run_resumed_by_a_new_writer_lists_both(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, points=20)
    for p in writer_summaries(root):  # the first life, written before summaries existed
        p.unlink()
    with AppRun(RUN, [open_store(root)], heartbeat_s=0) as run:  # a new version resumes it
        run.add_metadata(lr=0.2, stage=2)
        for step in range(20, 30):
            run.log_metric("loss", 0.5, step=step)
    (own,) = writer_summaries(root)
    assert json.loads(own.read_text())["prior"] is True
    found = summaries(root)[RUN]
    assert found.params == {"lr": 0.2, "epochs": 3, "stage": 2}
    loss = found.metrics["loss"]
    assert (loss.count, loss.last, loss.min, loss.max, loss.last_step) == (30, 0.5, 0.5, 20, 29)
    assert rebuilt_summary(root).exists()
    assert summaries(root)[RUN] == found  # from the rebuilt summary and the writer's own


def test_a_new_run_is_not_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root)
    (own,) = writer_summaries(root)
    assert json.loads(own.read_text())["prior"] is False
    summaries(root)
    assert not rebuilt_summary(root).exists()


def nested(levels: int) -> object:
    value: object = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def test_params_json_lacks_are_read_back_from_the_summary_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # NaN and infinities (JSON has none: Python writes its own tokens, which orjson refuses),
    # integers past 64 bits (orjson reads them as floats) and values nested deeper than
    # orjson writes: a run holds them, so its summary must, or every listing rebuilds the run.
    root = tmp_path / "runs"
    odd = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf,
           "inner": {"a": [math.nan, {"b": -math.inf}], "c": 1}}  # fmt: skip
    with AppRun(RUN, [open_store(root)], heartbeat_s=0) as run:
        run.add_metadata(**odd)
        run.log_metric("loss", 1.0, step=0)
    # The call site refuses huge ints and deep values, but the backend's own API (unchecked,
    # torchx's) stores them.
    direct, other = open_store(root), "proj/direct-2"
    huge = {**odd, "big": 10**30, "low": -(10**30), "deep": nested(300)}
    runtime().loop.call(lambda: direct.add_metadata(other, **huge))
    runtime().loop.call(direct.add_metrics, other, [TrackerMetric("loss", 2.0, 0, 10.0)])

    def check(params: Mapping[str, Any], run_id: str) -> None:
        assert math.isnan(params["nan"]) and params["inf"] == math.inf
        assert params["ninf"] == -math.inf
        assert math.isnan(params["inner"]["a"][0]) and params["inner"]["a"][1] == {"b": -math.inf}
        assert params["inner"]["c"] == 1
        if run_id == other:
            assert type(params["big"]) is int and params["big"] == 10**30
            assert type(params["low"]) is int and params["low"] == -(10**30)
            assert params["deep"] == nested(300)

    caplog.set_level(logging.WARNING)
    found = summaries(root)
    for run_id in (RUN, other):
        check(found[run_id].params, run_id)
        assert found[run_id].metrics["loss"].count == 1
        # Read from the writers' summaries: nothing was skipped, nothing rebuilt.
        assert not rebuilt_summary(root, run_id).exists()
    assert found[RUN].status == "finished"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for r in Store(root).runs():
        check(r.params, r.run_id)

    assert main(["--json", "list", "jobs", "--store", str(root)]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}  # strict JSON
    for run_id in (RUN, other):
        params = rows[run_id]["params"]  # NaN and infinities as null
        assert (params["nan"], params["inf"], params["ninf"]) == (None, None, None)
        assert params["inner"] == {"a": [None, {"b": None}], "c": 1}
    assert rows[other]["params"]["big"] == 10**30
    assert rows[other]["params"]["deep"] == nested(300)

    # The writer carries on with the run: its summary, read back, continues.
    runtime().loop.call(lambda: direct.add_metadata(other, more=1))
    again = summaries(root)[other]
    check(again.params, other)
    assert again.params["more"] == 1 and again.metrics["loss"].count == 1
    assert not rebuilt_summary(root, other).exists()


def test_a_run_torchx_wrote_with_params_json_lacks_is_rebuilt_once(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    other = "torchx/run-2"
    meta = root / encode_run_id(other) / "metadata"
    meta.mkdir(parents=True)
    params = {"nan": math.nan, "inf": math.inf, "big": 10**30, "deep": nested(300)}
    (meta / "5f0c").write_text(json.dumps({"metadata": params}))  # as torchx's json.dump does
    found = summaries(root)[other].params
    rebuilt_at = rebuilt_summary(root, other)
    assert rebuilt_at.exists()
    inode = rebuilt_at.stat().st_ino
    again = summaries(root)[other].params
    # Read from the rebuilt summary: not rebuilt again (the file is not rewritten).
    assert rebuilt_at.stat().st_ino == inode
    for read in (found, again):
        assert math.isnan(read["nan"]) and read["inf"] == math.inf  # type: ignore[arg-type]
        assert type(read["big"]) is int and read["big"] == 10**30
        assert read["deep"] == nested(300)


REMOVED = "was removed from the store while this process was writing it"


def removal_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if REMOVED in r.getMessage()]


def test_a_run_removed_under_its_writer_starts_anew_at_its_next_heartbeat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # rm --force of a run a live process writes: that process's next summary must not make
    # the run again with the counts and params it held before (the store no longer does).
    root = tmp_path / "runs"
    store = open_store(root)
    beat = functools.partial(runtime().loop.call, store.heartbeat, RUN, 30.0)
    caplog.set_level(logging.WARNING)
    run = AppRun(RUN, [store], spool_dir=str(tmp_path / "spool"), heartbeat_s=0)
    try:
        run.add_metadata(lr=0.1, old=True)
        for step in range(10):
            run.log_metric("loss", 1.0, step=step)
        assert run.flush(30).ok
        beat()  # claims the run (AppRun, not init(): no claim yet)
        assert (root / encode_run_id(RUN) / CLAIM_FILE).exists()
        beat()
        assert summaries(root)[RUN].metrics["loss"].count == 10
        assert not removal_warnings(caplog)

        # Removed by another process (its own backend: nothing of this one's is touched).
        runtime().loop.call(open_store(root).delete_run, RUN)
        beat()
        (warning,) = removal_warnings(caplog)
        assert repr(RUN) in warning and "starts the run anew" in warning
        assert (root / encode_run_id(RUN) / CLAIM_FILE).exists()  # claimed again
        listed = summaries(root)[RUN]  # listed anew, empty, live
        assert (listed.params, listed.metrics, listed.status) == ({}, {}, "running")

        run.add_metadata(lr=0.2)
        for step in range(10, 13):
            run.log_metric("loss", 2.0, step=step)
        assert run.flush(30).ok
    finally:
        run.close(30)
    found = summaries(root)[RUN]
    assert found.params == {"lr": 0.2} and found.status == "finished"
    loss = found.metrics["loss"]
    assert (loss.count, loss.min, loss.last_step) == (3, 2.0, 12)
    assert len(removal_warnings(caplog)) == 1
    assert not rebuilt_summary(root).exists()


def test_a_run_removed_under_a_direct_writer_starts_anew_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "runs"
    store, call = open_store(root), runtime().loop.call
    caplog.set_level(logging.WARNING)
    call(lambda: store.claim_run(RUN, {"run_id": RUN}))  # as init() claims it
    call(lambda: store.add_metadata(RUN, lr=0.1))
    call(store.add_metrics, RUN, [TrackerMetric("acc", 0.5, 0, 10.0)])
    call(store.heartbeat, RUN, 30.0)
    call(store.heartbeat, RUN, 30.0)
    assert not removal_warnings(caplog)
    call(open_store(root).delete_run, RUN)
    # A write before the heartbeat makes the run again with the old counts, until the beat.
    call(store.add_metrics, RUN, [TrackerMetric("acc", 0.6, 1, 11.0)])
    assert summaries(root)[RUN].metrics["acc"].count == 2
    call(store.heartbeat, RUN, 30.0)
    assert len(removal_warnings(caplog)) == 1
    call(store.add_metrics, RUN, [TrackerMetric("acc", 0.7, 2, 12.0)])
    found = summaries(root)[RUN]
    assert found.params == {} and found.metrics["acc"].count == 1
    assert found.metrics["acc"].last == 0.7
    call(store.heartbeat, RUN, 30.0)
    assert len(removal_warnings(caplog)) == 1  # once


def test_a_run_its_own_process_removes_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "runs"
    store, call = open_store(root), runtime().loop.call
    caplog.set_level(logging.WARNING)
    call(lambda: store.add_metadata(RUN, lr=0.1))
    call(store.heartbeat, RUN, 30.0)
    call(store.delete_run, RUN)  # this process's own tallies go with it
    call(lambda: store.add_metadata(RUN, lr=0.2))
    call(store.heartbeat, RUN, 30.0)
    assert not removal_warnings(caplog)
    assert summaries(root)[RUN].params == {"lr": 0.2}


@pytest.mark.parametrize(
    "value",
    [
        [2**64 - 1, -(2**63), 2**64, -(2**63) - 1, 10**30, -(10**30), 1730000000000000000],
        {"key": "1730000000000000000-1730000000000000000x1f-000001", "n": 12345678901234567890},
        {"text": " 123456789012345678901234 ", "float": 1e300, "small": 5e-324},
        [math.nan, math.inf, -math.inf, {"deep": nested(600)}],
    ],
)
def test_summary_json_is_read_back_exactly(value: object) -> None:
    data = _encode_json(value, "x")
    read = _decode_json(data)
    assert json.dumps(read) == json.dumps(value)  # ints stay ints, of every size
