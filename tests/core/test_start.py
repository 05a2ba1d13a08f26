"""The start of a job on a local store: ``init()`` asks the store about its run alone, claims
a new id by an exclusive create, refuses bad paths in one line, and a resumed run continues
after the steps stored or still spooled. (The store down or silent: tests/fsspec/
test_start_s3.py, through a proxy in front of an S3 server.)"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

import async_tracker
from async_tracker import AppRun, TrackerConfigError, as_sync
from async_tracker.backend.fsspec import CLAIM_FILE, AsyncFsspecTracker, encode_run_id
from async_tracker.init_run import open_store
from async_tracker.spool import has_spool, spooled_last_steps
from tests.core.helpers import Child
from tests.creators import DURABLE_CHILD, check_one_winner, race

# What a resumed run's points look like in the store: (step, value) in step order.
Points = list[tuple[int, float]]


def stored(store: str | Path, run_id: str, name: str = "loss") -> Points:
    return [(p.step, p.value) for p in AppRun(run_id, [open_store(store)]).metrics()[name]]


# -- exclusive creation ---------------------------------------------------------------------------


def test_concurrent_creates_of_one_id_exactly_one_wins(tmp_path: Path) -> None:
    """4 processes released at once on one id with resume="never", 30 times: each time one
    wins and three are refused (a 1-in-10 failure passes 30 trials with a chance of 4%)."""
    seed, answers = race(str(tmp_path / "runs"), processes=4, trials=30)
    check_one_winner(seed, answers)


def test_a_new_run_is_claimed_and_listed_before_any_record(tmp_path: Path) -> None:
    store = tmp_path / "runs"
    run = async_tracker.init("p", dir=str(store), flush_interval=3600, timeout=60)
    try:
        claim = json.loads((store / encode_run_id(run.id) / CLAIM_FILE).read_text())
        assert claim["run_id"] == run.id and claim["project"] == "p"
        # Listed as a run from its claim on (nothing written yet), and the claim is no run.
        assert list(as_sync(open_store(store)).run_ids()) == [run.id]
        with pytest.raises(TrackerConfigError, match="already exists"):
            async_tracker.init("p", dir=str(store), id=run.id, resume="never", timeout=60)
    finally:
        run.close(timeout=30)


# -- one request about the run ----------------------------------------------------------------


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path the local filesystem lists (fsspec's ``ls``), in order."""
    seen: list[str] = []
    real_ls = LocalFileSystem.ls

    def counted(self: LocalFileSystem, path: str, detail: bool = False, **kw: object) -> object:
        seen.append(self._strip_protocol(path))
        return real_ls(self, path, detail=detail, **kw)

    monkeypatch.setattr(LocalFileSystem, "ls", counted)
    yield seen


def test_the_start_asks_about_its_run_never_lists_the_store(
    tmp_path: Path, listings: list[str]
) -> None:
    store = tmp_path / "runs"
    for i in range(20):
        async_tracker.init("p", dir=str(store), id=f"p/old-{i}", timeout=60).close(timeout=30)
    listings.clear()
    # No flush until close (whose metadata writes list their folder): the start's alone.
    new = async_tracker.init("p", dir=str(store), timeout=60, flush_interval=3600)
    given = async_tracker.init("p", dir=str(store), id="p/given", timeout=60, flush_interval=3600)
    resumed = async_tracker.init("p", dir=str(store), id="p/old-3", timeout=60, flush_interval=3600)
    listings = list(listings)
    for run in (new, given, resumed):
        run.close(timeout=30)
    root = str(store)
    assert root not in listings, listings
    old = str(store / encode_run_id("p/old-3"))
    # The given new id: no listing (a lookup of its directory). The resumed one: its
    # directory, its metrics (its last steps), and its status, heartbeat and metadata folders
    # (the life it continues after, and its latest metadata stamp).
    expected = [old, *(f"{old}/{part}" for part in ("metrics", "status", "heartbeat", "metadata"))]
    assert sorted(listings) == sorted(expected), listings


# -- bad paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["a file", "under a file", "/proc", "an unknown protocol"])
def test_a_bad_store_path_is_one_line_naming_it(tmp_path: Path, where: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    dir = {
        "a file": str(afile),
        "under a file": str(afile / "runs"),
        "/proc": "/proc/async-tracker-runs",
        "an unknown protocol": "nosuchprotocol://bucket/runs",
    }[where]
    for resume_id in (None, "p/x"):
        with pytest.raises(TrackerConfigError) as info:
            async_tracker.init("p", dir=dir, id=resume_id, timeout=60)
        message = str(info.value)
        assert dir in message and "\n" not in message, message
        # Raised from None: no chained traceback of fsspec's or the OS's internals.
        assert info.value.__cause__ is None
        assert info.value.__context__ is None or info.value.__suppress_context__


def test_bad_timeouts_are_refused_naming_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            async_tracker.init("p", dir=str(tmp_path), timeout=bad)
    monkeypatch.setenv("ASYNC_TRACKER_INIT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="ASYNC_TRACKER_INIT_TIMEOUT"):
        async_tracker.init("p", dir=str(tmp_path))


# -- resume="must" --------------------------------------------------------------------------------

HOLDER = """
import sys
import async_tracker
run = async_tracker.init("p", dir=sys.argv[1], id=sys.argv[2], resume="never",
                         flush_interval=3600, timeout=60)
print("started", flush=True)
sys.stdin.read()  # open until the parent lets go: nothing flushed, only the claim is stored
run.close(timeout=30)
"""


def test_must_accepts_a_run_open_in_another_process_and_never_refuses_it(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "runs")
    child = Child(HOLDER, store, "p/shared")
    try:
        assert child.readline(60) == "started"
        with pytest.raises(TrackerConfigError, match="already exists"):
            async_tracker.init("p", dir=store, id="p/shared", resume="never", timeout=60)
        with async_tracker.init("p", dir=store, id="p/shared", resume="must", timeout=60) as run:
            run.log_metric("loss", 1.0)
        assert stored(store, "p/shared") == [(0, 1.0)]
    finally:
        child.close()


def test_must_accepts_a_run_only_in_this_machines_spool(tmp_path: Path) -> None:
    """A run whose records never reached the store (it was a file then) but wait in this
    machine's spool is resumed by ``must``, after its spooled steps, the spool replayed."""
    spool, store = tmp_path / "spool", tmp_path / "runs"
    store.write_text("a file: every write fails, the records are spooled")
    broken = AsyncFsspecTracker(LocalFileSystem(), str(store))
    run = AppRun("p/offline", [broken], spool_dir=str(spool), flush_interval=3600)
    for i in range(5):
        run.log_metric("loss", float(i))
    report = run.close(timeout=0.5)
    assert report.spooled == 5 and has_spool(spool, "p/offline"), report
    store.unlink()
    with async_tracker.init(
        "p", dir=str(store), id="p/offline", resume="must", spool_dir=str(spool), timeout=60
    ) as resumed:
        resumed.log_metric("loss", 5.0)
    assert stored(store, "p/offline") == [(i, float(i)) for i in range(6)]
    assert not has_spool(spool, "p/offline")


# -- resume after SIGKILL, with points in the spool ----------------------------------------------


def test_resume_after_sigkill_continues_after_the_spooled_steps(tmp_path: Path) -> None:
    store, spool, run_id = tmp_path / "runs", tmp_path / "spool", "p/killed"
    metrics_dir = store / encode_run_id(run_id) / "metrics"
    child = Child(DURABLE_CHILD, str(store), str(spool), run_id)
    try:
        assert child.readline(60) == "stored"
        # A file where the metrics folder was: every later write of points fails (kept).
        metrics_dir.rename(metrics_dir.with_name("metrics.saved"))
        metrics_dir.write_text("in the way")
        assert child.proc.stdin is not None
        child.proc.stdin.write(b"go\n")
        child.proc.stdin.flush()
        assert child.readline(60) == "spooled"
        child.kill()  # SIGKILL: steps 100 to 499 exist only in the spool
    finally:
        child.close()
    metrics_dir.unlink()
    metrics_dir.with_name("metrics.saved").rename(metrics_dir)
    assert [s for s, _ in stored(store, run_id)] == list(range(100))
    assert spooled_last_steps(spool, run_id) == {"loss": 499}

    with async_tracker.init(
        "p", dir=str(store), id=run_id, spool_dir=str(spool), timeout=60
    ) as run:
        for i in range(500, 600):
            run.log_metric("loss", float(i))  # no step: after the spooled 499
    points = AppRun(run_id, [open_store(store)]).metrics()["loss"]
    # Every step once, with the value logged for it: replayed points (100 to 499) before
    # the new ones, none holding two values.
    assert [(p.step, p.value) for p in points] == [(i, float(i)) for i in range(600)]
    by_time = sorted(points, key=lambda p: p.timestamp)
    assert [p.step for p in by_time] == list(range(600))
    assert not has_spool(spool, run_id)


def test_a_resume_skips_spool_segments_it_cannot_read_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool"
    segment_dir = spool / encode_run_id("p/r") / "fsspec"
    segment_dir.mkdir(parents=True)
    (segment_dir / "0000000000000000001x1-0-5-9-1.seg").write_bytes(b"garbage\n")
    with caplog.at_level(logging.WARNING, logger="async_tracker.spool.store"):
        assert spooled_last_steps(spool, "p/r") == {}
    warned = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(warned) == 1 and "1 damaged lines" in warned[0], warned
    shutil.rmtree(segment_dir)
