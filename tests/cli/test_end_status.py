"""How a job ended, as its store shows it, with real child processes: a job that fails, or is
killed by SIGTERM, while its store is down shows ``failed`` / ``killed`` once ``async-tracker
sync`` has delivered its spool; a job SIGKILLed shows ``crashed`` once its heartbeats are
old; ``sync --to`` another store delivers every part of a half-delivered batch, and a second
sync into a store stores nothing twice."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import HEARTBEAT_DIR, AsyncFsspecTracker, encode_run_id
from async_tracker.cli.main import main
from async_tracker.cli.query import run_row
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime
from async_tracker.store.open import open_reader
from async_tracker.tags import ENDING_KEY
from tests.cli.conftest import Store
from tests.core.helpers import FAST_RETRY, Child, wait_until

RUN_ID = "job/1"

# A job on a store (argv[1]) spooling in argv[2]: starts, says "started" and waits for a line
# on stdin (the test may take the store down meanwhile), logs, says "ready", then fails
# (argv[3] is "fail") or waits to be signalled. Quick retries (the store may be down), and a
# close that has time to spool everything on a loaded machine: a 1 s close once left records
# in memory under load (a figure for the benchmarks, not a condition of this test).
JOB = """
import sys, time
import async_tracker
from async_tracker import RetryPolicy
store, spool, mode, heartbeat = sys.argv[1:5]
retry = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.05, jitter_s=0,
                    cooldown_s=0.2)
with async_tracker.init("job", dir=store, id="job/1", spool_dir=spool, close_timeout=5.0,
                        retry=retry, heartbeat_s=float(heartbeat)) as run:
    print("started", flush=True)
    sys.stdin.readline()
    run.add_metadata(lr=0.1)
    for step in range(5):
        run.log_metric("loss", float(step), step=step)
    run.flush(10)
    print("ready", flush=True)
    if mode == "fail":
        raise RuntimeError("the job failed")
    while True:
        time.sleep(0.01)
"""


def status(root: Path, now: float | None = None) -> tuple[str, float | None]:
    store = open_store(root)
    return runtime().loop.call(store.run_status, RUN_ID, now)


def go(job: Child, root: Path | None = None) -> None:
    """Lets a started job log; with ``root``, the store is down for its run from now on (see
    :func:`block`)."""
    assert job.readline() == "started"
    if root is not None:
        block(root)
    assert job.proc.stdin is not None
    job.proc.stdin.write(b"go\n")
    job.proc.stdin.flush()


def block(root: Path) -> None:
    """The store is down for this run: its directory (which the start claimed) is moved
    aside and a file takes its place, so every write of the run fails."""
    run_dir = root / encode_run_id(RUN_ID)
    run_dir.rename(root / "aside")
    run_dir.write_text("not a directory")


def unblock(root: Path) -> None:
    """The store is back: the run's directory returns."""
    run_dir = root / encode_run_id(RUN_ID)
    run_dir.unlink()
    (root / "aside").rename(run_dir)


def sync(spool: Path, to: Path) -> None:
    assert main(["sync", str(spool), "--to", str(to), "--timeout", "30"]) == 0


def test_a_job_that_fails_with_its_store_down_is_failed_after_sync(tmp_path: Path) -> None:
    root, spool = tmp_path / "runs", tmp_path / "spool"
    job = Child(JOB, str(root), str(spool), "fail", "0")
    try:
        go(job, root)
        assert job.readline() == "ready"
        assert job.wait(60) == 1  # the exception ended the process
    finally:
        job.close()
    unblock(root)
    sync(spool, root)
    assert status(root)[0] == "failed"
    row = run_row(open_reader(Store(root, root).tracker()), RUN_ID)
    assert row["status"] == "failed" and row["params"] == {"project": "job", "lr": 0.1}


def test_a_job_killed_by_sigterm_with_its_store_down_is_killed_after_sync(
    tmp_path: Path,
) -> None:
    root, spool = tmp_path / "runs", tmp_path / "spool"
    job = Child(JOB, str(root), str(spool), "wait", "0")
    try:
        go(job, root)
        assert job.readline() == "ready"
        os.kill(job.proc.pid, signal.SIGTERM)
        assert job.wait(60) != 0
    finally:
        job.close()
    unblock(root)
    sync(spool, root)
    assert status(root)[0] == "killed"
    assert [p.step for p in Store(root, root).tracker().metrics(RUN_ID)["loss"]] == [0, 1, 2, 3, 4]


def test_a_sigkilled_job_is_crashed_once_its_heartbeats_are_old(tmp_path: Path) -> None:
    root, spool = tmp_path / "runs", tmp_path / "spool"
    beats = root / encode_run_id(RUN_ID) / HEARTBEAT_DIR
    job = Child(JOB, str(root), str(spool), "wait", "0.5")
    try:
        go(job)
        assert job.readline() == "ready"
        wait_until(lambda: beats.is_dir() and any(beats.iterdir()), "a heartbeat")
        assert status(root)[0] == "running"
        os.kill(job.proc.pid, signal.SIGKILL)
        assert job.wait(60) == -signal.SIGKILL
    finally:
        job.close()
    (beat,) = beats.iterdir()
    content = json.loads(beat.read_text())
    last, every = content["time"], content["interval_s"]
    assert every == 0.5
    # Readers with an injected now: alive within 3 intervals of the last heartbeat, crashed
    # after (a run that ended is never crashed: see the tests above).
    assert status(root, now=last + 2 * every) == ("running", None)
    assert status(root, now=last + 3 * every + 0.01) == ("crashed", last)
    # The CLI's list jobs, on the wall clock: crashed once 1.5 s have passed.
    reader = open_reader(Store(root, root).tracker())
    wait_until(lambda: run_row(reader, RUN_ID)["status"] == "crashed",
               "list jobs shows the run as crashed")


def test_a_run_without_heartbeats_stays_running(tmp_path: Path) -> None:
    # torchx's runs, and ours with heartbeats off, keep the status they always had.
    root = tmp_path / "runs"
    run = AppRun(RUN_ID, [open_store(root)], spool_dir=str(tmp_path / "spool"), heartbeat_s=0)
    run.log_metric("loss", 1.0, step=0)
    assert run.flush(30).ok
    assert status(root, now=time.time() + 10**6) == ("running", None)
    run.close(30)
    assert status(root)[0] == "finished"


def test_sync_to_another_store_sends_every_part_and_twice_stores_nothing_twice(
    tmp_path: Path,
) -> None:
    old, new, spool = tmp_path / "old", tmp_path / "new", tmp_path / "spool"
    # The old store takes metadata but not metrics: a file where its metrics directory goes.
    run_dir = old / encode_run_id(RUN_ID)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics").write_text("not a directory")
    backend = AsyncFsspecTracker(open_store(old).fs, str(old))
    run = AppRun(RUN_ID, [backend], spool_dir=str(spool), retry=FAST_RETRY, heartbeat_s=0,
                 flush_interval=3600)
    run.add_metadata(lr=0.1)
    for step in range(3):
        run.log_metric("loss", float(step), step=step)
    report = run.close(timeout=5, reason="failed")
    assert report.spooled == 4 and report.end_spooled == 1, report
    assert open_store(old).fs.exists(str(run_dir / "metadata"))  # half delivered
    # Into a new store: every part, the metadata marked done in the old store included.
    sync(spool, new)
    target = Store(new, new).tracker()
    # The ending of a failed run goes with its end record (see runtime/ending.py).
    assert target.metadata(RUN_ID) == {"lr": 0.1, ENDING_KEY: {"reason": "failed"}}
    assert [p.step for p in target.metrics(RUN_ID)["loss"]] == [0, 1, 2]
    assert status(new)[0] == "failed"
    written = sorted(p.relative_to(new) for p in new.rglob("*") if p.is_file())
    stamps = {p: (new / p).stat().st_mtime_ns for p in written}
    # A second sync finds everything delivered: the new store is left as it is.
    assert main(["sync", str(spool), "--to", str(new)]) == 0
    assert {p: (new / p).stat().st_mtime_ns for p in written} == stamps
    assert sorted(p.relative_to(new) for p in new.rglob("*") if p.is_file()) == written


def test_sync_into_the_same_store_writes_a_part_once(tmp_path: Path) -> None:
    root, spool = tmp_path / "runs", tmp_path / "spool"
    run_dir = root / encode_run_id(RUN_ID)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics").write_text("not a directory")
    run = AppRun(RUN_ID, [open_store(root)], spool_dir=str(spool), retry=FAST_RETRY,
                 heartbeat_s=0, flush_interval=3600)
    run.add_metadata(lr=0.1)
    run.log_metric("loss", 1.0, step=0)
    assert run.close(timeout=5).spooled == 2
    (metadata,) = (run_dir / "metadata").iterdir()
    first = metadata.stat().st_ino
    (run_dir / "metrics").unlink()  # the store is whole again
    sync(spool, root)
    # The metadata part was done in this very store: not written again (a new file would
    # be a new inode: writes are a rename of a staged file).
    (again,) = (run_dir / "metadata").iterdir()
    assert again == metadata and again.stat().st_ino == first
    assert [p.step for p in Store(root, root).tracker().metrics(RUN_ID)["loss"]] == [0]
    assert status(root)[0] == "finished"


@pytest.fixture(autouse=True)
def _no_env_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNC_TRACKER_DIR", raising=False)


def test_a_resumed_run_ends_as_its_last_life_did(tmp_path: Path) -> None:
    # A job killed (preempted), then requeued under its id, that finishes: finished, as W&B
    # and MLflow show it; ranks of one life still combine, the worst ending winning.
    import async_tracker

    root = str(tmp_path / "runs")
    first = async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=str(tmp_path / "s"))
    first.log_metric("loss", 2.0)
    assert first.close(reason="killed").ok  # the first life: killed (SIGTERM's ending)
    assert status(tmp_path / "runs")[0] == "killed"
    with async_tracker.init("job", dir=root, id=RUN_ID, spool_dir=str(tmp_path / "s")) as run:
        run.log_metric("loss", 1.0)
    assert status(tmp_path / "runs")[0] == "finished"
    # The same life's other rank failing (a run object of its own, no resume) still fails it.
    rank1 = AppRun(RUN_ID, [open_store(root)], spool_dir=str(tmp_path / "s2"))
    with pytest.raises(RuntimeError), rank1:
        rank1.log_metric("loss", 3.0)
        raise RuntimeError("rank 1 failed")
    assert status(tmp_path / "runs")[0] == "failed"
