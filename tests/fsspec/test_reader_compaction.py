"""Compaction by readers (``readcompact.py``): a read of a run's metrics compacts, beside it,
the segments that a writer no longer live left uncompacted (killed, crashed, or out of its
compaction budget at close), with the writer's own compaction; never a live writer's, never
from a listing of runs; two readers at once lose nothing and double nothing; a store that
refuses the write (read-only) is read as before, its refusal told once; a corrupt segment
stays where it is. Local disk and fsspec's memory filesystem; a process SIGKILLed for real.

Liveness goes by heartbeats, compared with a clock the test gives the reader (never a wait):
a writer whose newest heartbeat is older than three of its intervals is no longer live."""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import posixpath
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from async_tracker.backend.fsspec import AsyncFsspecTracker, encode_run_id
from async_tracker.backend.fsspec.metricfiles import inputs_of, is_compacted
from async_tracker.backend.fsspec.readcompact import writers_to_compact
from async_tracker.backend.fsspec.runreader import FsspecRunReader
from async_tracker.cli.main import main
from async_tracker.init_run import open_store
from async_tracker.records import TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.reader import RunReader
from tests.core.helpers import Child, python_env, wait_until
from tests.fsspec.test_parquet_store import (
    RUN,
    Writer,
    as_rows,
    expected_rows,
    scalar_rows,
    steps_of,
)

REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 1.0
# How far past the newest heartbeat a reader's clock is: within three intervals the writer
# is live, past them it is not.
LIVE, DEAD = 1.0, 3.5


# -- helpers ------------------------------------------------------------------------------------


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AsyncFsspecTracker]:
    if request.param == "file":
        yield tracker(str(tmp_path / "runs"))
        return
    url = f"memory://reader-compaction-{uuid.uuid4().hex}/runs"
    yield tracker(url)
    fs = fsspec.filesystem("memory")
    fs.rm(fs._strip_protocol(url), recursive=True)


def tracker(url: str) -> AsyncFsspecTracker:
    store = open_store(url)
    assert isinstance(store, AsyncFsspecTracker)
    return store


def names(store: AsyncFsspecTracker, run_id: str = RUN) -> list[str]:
    """The run's metric files, by name."""
    path = posixpath.join(store.root_dir, encode_run_id(run_id), "metrics")
    store.fs.invalidate_cache(path)
    return sorted(posixpath.basename(p) for p in store.fs.ls(path, detail=False))


def beat(store: AsyncFsspecTracker, run_id: str = RUN) -> float:
    """Writes a heartbeat of this process for the run, as a live writer does; its time."""
    runtime().loop.call(store.heartbeat, run_id, INTERVAL_S)
    return last_beat(store, run_id)


def last_beat(store: AsyncFsspecTracker, run_id: str = RUN) -> float:
    beats = runtime().loop.call(store._reader.heartbeats, run_id)
    return max(float(b["time"]) for b in beats.values())  # type: ignore[arg-type]


def age_heartbeats(root: Path, run_id: str = RUN) -> None:
    """Makes the run's heartbeats an age old, as a writer killed long ago left them (for
    readers that go by the wall clock: the CLI's)."""
    for path in (root / encode_run_id(run_id) / "heartbeat").iterdir():
        content = json.loads(path.read_text())
        content["time"] = 1.0
        path.write_text(json.dumps(content))


def reader_at(store: AsyncFsspecTracker, now: float) -> FsspecRunReader:
    """A reader of ``store`` whose clock says ``now``."""
    return FsspecRunReader(store._reader, f"store {store.store_url}", clock=lambda: now)


def scalars(reader: FsspecRunReader, run_id: str = RUN) -> Any:
    return runtime().loop.call(functools.partial(reader.scalars, run_id))


def metric_rows(reader: RunReader, run_id: str = RUN) -> dict[str, list[Any]]:
    got = runtime().loop.call(reader.metrics, run_id)
    return {name: as_rows(points) for name, points in got.items()}


def settle(reader: FsspecRunReader) -> None:
    """Waits for the compactions the reader started (those ended already have their
    effect in the store)."""
    for future in reader.compactions.running():
        future.result()


def count_attempts(reader: FsspecRunReader, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the run of each compaction the reader attempts (past its own checks)."""
    calls: list[str] = []
    real = reader.compactions.compact_run

    async def counted(run_id: str, writers: Sequence[str]) -> list[str]:
        calls.append(run_id)
        return await real(run_id, writers)

    monkeypatch.setattr(reader.compactions, "compact_run", counted)
    return calls


def killed_writer(store: AsyncFsspecTracker, segments: int = 4) -> Writer:
    """A writer that flushed ``segments`` batches, beat, and died without ending."""
    w = Writer(store)
    for k in range(segments):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)) + steps_of("acc", range(k, k + 1)))
    beat(store)
    return w


# -- a writer no longer live --------------------------------------------------------------------


def test_a_read_compacts_a_killed_writers_segments_and_reads_every_point_once(
    store: AsyncFsspecTracker,
) -> None:
    w = killed_writer(store)
    before = names(store)
    assert len(before) == 4
    want = expected_rows(w.points)
    reader = reader_at(store, last_beat(store) + DEAD)
    # The read's result is what was stored, whatever the compaction beside it does.
    assert scalar_rows(scalars(reader)) == want
    settle(reader)
    (compacted,) = names(store)
    assert is_compacted(compacted)
    assert inputs_of(store.fs.cat(posixpath.join(
        store.root_dir, encode_run_id(RUN), "metrics", compacted
    ))) == set(before)  # fmt: skip
    # Every point once, in order, by every read (a new reader and the cursor of the old).
    assert metric_rows(reader) == want
    assert scalar_rows(scalars(reader_at(store, last_beat(store) + DEAD))) == want
    settle(reader)
    assert names(store) == [compacted]


def test_the_cli_reads_compact_and_list_jobs_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    store = tracker(str(root))
    w = killed_writer(store, segments=3)
    age_heartbeats(root)
    before = names(store)
    assert main(["--store", str(root), "list", "jobs"]) == 0
    runtime().wait_background()
    assert names(store) == before
    assert main(["--store", str(root), "list", "metrics", RUN]) == 0
    runtime().wait_background()
    (compacted,) = names(store)
    assert is_compacted(compacted)
    capsys.readouterr()
    assert metric_rows(store.reader()) == expected_rows(w.points)


def test_a_cli_process_that_reads_and_exits_finishes_the_compaction_first(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = tracker(str(root))
    w = killed_writer(store, segments=5)
    age_heartbeats(root)
    done = subprocess.run(
        [sys.executable, "-m", "async_tracker", "--store", str(root), "list", "metrics", RUN],
        cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The process printed its read, then its exit waited for the compaction it started.
    (compacted,) = names(store)
    assert is_compacted(compacted)
    assert metric_rows(store.reader()) == expected_rows(w.points)


# A job (argv: store, spool) that logs three flushes, says "ready" and waits to be SIGKILLed.
DOOMED = """
import sys, time
from async_tracker import AppRun
from async_tracker.init_run import open_store
run = AppRun("proj/parquet-1", [open_store(sys.argv[1])], spool_dir=sys.argv[2], heartbeat_s=0.5)
for flush in range(3):
    for step in range(10 * flush, 10 * flush + 10):
        run.log_metric("loss", float(step) / 7, step=step)
    assert run.flush(30).ok
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def test_a_sigkilled_writers_segments_are_compacted_by_the_next_read(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    beats = root / encode_run_id(RUN) / "heartbeat"
    job = Child(DOOMED, str(root), str(tmp_path / "spool"))
    try:
        assert job.readline(60) == "ready"
        wait_until(lambda: beats.is_dir() and any(beats.iterdir()), "a heartbeat")
        os.kill(job.proc.pid, signal.SIGKILL)
        assert job.wait(60) == -signal.SIGKILL
    finally:
        job.close()
    store = tracker(str(root))
    before = names(store)
    assert len(before) >= 3  # one per flush at least (the flusher's timer may cut more)
    want = expected_rows([TrackerMetric("loss", s / 7, s, 0.0) for s in range(30)])
    live = reader_at(store, last_beat(store) + LIVE)
    assert [r[:2] for r in scalar_rows(scalars(live))["loss"]] == [r[:2] for r in want["loss"]]
    settle(live)
    assert names(store) == before  # within three intervals of its last beat: maybe live
    reader = reader_at(store, last_beat(store) + DEAD)
    first = metric_rows(reader)
    settle(reader)
    (compacted,) = names(store)
    assert is_compacted(compacted)
    assert metric_rows(reader) == first
    assert [r[:2] for r in first["loss"]] == [r[:2] for r in want["loss"]]


def test_an_ended_writer_out_of_its_budget_is_compacted_once_no_longer_live(
    store: AsyncFsspecTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from async_tracker.backend.fsspec import writer as writer_module

    w = killed_writer(store, segments=3)
    monkeypatch.setattr(writer_module, "COMPACTION_BUDGET_S", 0.0)  # its close ran out
    w.end()
    monkeypatch.undo()
    assert len(names(store)) == 3
    reader = reader_at(store, last_beat(store) + DEAD)
    assert scalar_rows(scalars(reader)) == expected_rows(w.points)
    settle(reader)
    assert len(names(store)) == 1
    assert metric_rows(reader) == expected_rows(w.points)


# -- what a reader leaves alone -------------------------------------------------------------------


def test_a_live_writers_segments_are_not_compacted_by_a_reader(
    store: AsyncFsspecTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = killed_writer(store)
    before = names(store)
    reader = reader_at(store, last_beat(store) + LIVE)
    attempts = count_attempts(reader, monkeypatch)
    assert scalar_rows(scalars(reader)) == expected_rows(w.points)
    settle(reader)
    assert names(store) == before and attempts == [RUN]
    # Read again while its heartbeat is recent: not looked at again, nor after a new
    # segment (the run is live until its newest heartbeat grows old).
    w.write(steps_of("loss", range(40, 45)))
    assert metric_rows(reader) == expected_rows(w.points)
    settle(reader)
    assert len(names(store)) == 5 and attempts == [RUN]


def test_a_run_without_heartbeats_is_never_compacted_by_a_reader(
    store: AsyncFsspecTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = Writer(store)  # heartbeats off (heartbeat_s=0), or torchx's: nothing tells it dead
    for k in range(3):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)))
    before = names(store)
    reader = reader_at(store, 1e12)
    attempts = count_attempts(reader, monkeypatch)
    assert scalar_rows(scalars(reader)) == expected_rows(w.points)
    settle(reader)
    assert names(store) == before
    # Its files as they were: not looked at again.
    assert scalar_rows(scalars(reader)) == expected_rows(w.points)
    settle(reader)
    assert attempts == [RUN] and names(store) == before


def test_listing_runs_starts_no_compaction(
    store: AsyncFsspecTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed_writer(store)
    before = names(store)
    reader = reader_at(store, last_beat(store) + DEAD)
    attempts = count_attempts(reader, monkeypatch)
    (summary,) = runtime().loop.call(reader.run_summaries)
    assert summary.run_id == RUN
    assert runtime().loop.call(reader.run_ids) == [RUN]
    assert attempts == [] and names(store) == before


def test_one_writers_files_are_compacted_and_a_direct_calls_are_not(
    store: AsyncFsspecTracker,
) -> None:
    a, b = killed_writer(store, segments=2), Writer(store)
    b.write(steps_of("other", range(3)))  # one segment: nothing to compact
    runtime().loop.call(store.add_metrics, RUN, steps_of("direct", range(2)))
    runtime().loop.call(store.add_metrics, RUN, steps_of("direct", range(2, 4)))
    before = names(store)
    reader = reader_at(store, last_beat(store) + DEAD)
    scalars(reader)
    settle(reader)
    after = names(store)
    assert [n for n in after if a.token in n and is_compacted(n)] != []
    assert [n for n in after if a.token not in n] == [n for n in before if a.token not in n]
    want = expected_rows([*a.points, *b.points, *steps_of("direct", range(4))])
    assert metric_rows(reader) == want


# -- two readers at once --------------------------------------------------------------------------


def gate(
    target: Any, name: str, reached: anyio.Event, until: anyio.Event,
    monkeypatch: pytest.MonkeyPatch, only: Callable[[str], bool] = lambda _: True,
) -> None:  # fmt: skip
    """Holds each call of ``target.name`` about a path that ``only`` takes until ``until``
    is set; sets ``reached`` first."""
    real: Callable[..., Awaitable[Any]] = getattr(target, name)

    async def held(*args: Any) -> Any:
        if only(str(args[0])):
            reached.set()
            await until.wait()
        return await real(*args)

    monkeypatch.setattr(target, name, held)


@pytest.mark.parametrize("held_at", ["put", "rm_many", "get", None])
def test_two_readers_compacting_the_same_files_at_once_lose_nothing_and_double_nothing(
    store: AsyncFsspecTracker, held_at: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = killed_writer(store, segments=5)
    now = last_beat(store) + DEAD
    # Two readers, each with a storage of its own (two processes, say).
    other = tracker(store.store_url or "")
    first, second = reader_at(store, now), reader_at(other, now)
    assert first.store.storage is not second.store.storage
    (writer,) = writers_to_compact(names(store), runtime().loop.call(
        functools.partial(store._reader.metric_points, RUN)).cursor)  # fmt: skip
    results: dict[str, list[str]] = {}

    async def both() -> None:
        first_held, second_done = anyio.Event(), anyio.Event()
        if held_at == "get":
            # The first listed every input and reads the last one only after the second
            # has compacted and removed them all: it compacts the others, from its listing.
            last = names(store)[-1]
            gate(first.store.storage, "get", first_held, second_done, monkeypatch,
                 only=lambda path: path.endswith(last))  # fmt: skip
        elif held_at is not None:
            # The first stops before writing its compacted file, or after writing it and
            # before removing its inputs; the second starts then, and does all of its own
            # before the first goes on.
            gate(first.store.storage, held_at, first_held, second_done, monkeypatch)
        else:
            first_held.set()  # both at once, as the scheduler interleaves them

        async def run_first() -> None:
            results["first"] = await first.compactions.compact_run(RUN, [writer])

        async def run_second() -> None:
            await first_held.wait()
            results["second"] = await second.compactions.compact_run(RUN, [writer])
            second_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_first)
            tg.start_soon(run_second)

    runtime().loop.call(both)
    if held_at == "put":
        # Both read the same files: the same compacted file, written twice.
        assert results == {"first": [writer], "second": [writer]}
    elif held_at == "rm_many":
        # The second found the first's compacted file beside its inputs, and removed them.
        assert results == {"first": [writer], "second": []}
    elif held_at == "get":
        # Two compacted files that share inputs: readers keep one row per (writer, seq).
        assert results == {"first": [writer], "second": [writer]}
        assert len(names(store)) == 2
    left = names(store)
    assert all(is_compacted(n) for n in left) and 1 <= len(left) <= 2
    want = expected_rows(w.points)
    assert metric_rows(reader_at(store, now)) == want
    assert scalar_rows(scalars(reader_at(store, now))) == want
    # What a race leaves is one file, or two that readers keep one row of each point of;
    # the next read's compaction leaves one.
    third = reader_at(store, now)
    scalars(third)
    settle(third)
    assert len(names(store)) == 1 and metric_rows(third) == want


# -- failures -------------------------------------------------------------------------------------


class ReadOnlyFileSystem(LocalFileSystem):
    """A local filesystem mounted read-only: every write fails with EROFS."""

    code = errno.EROFS

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError(self.code, os.strerror(self.code), str(args[0]) if args else "")

    pipe_file = makedirs = mkdir = mv = rm_file = rm = touch = _refuse


class DeniedFileSystem(ReadOnlyFileSystem):
    """A local filesystem whose every write is refused with EACCES (no permission)."""

    code = errno.EACCES


@pytest.mark.parametrize("why", ["read-only filesystem", "permission denied", "directory mode"])
def test_a_store_that_refuses_the_compaction_is_read_as_before_told_once(
    tmp_path: Path, why: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    w = killed_writer(tracker(str(root)))
    folders = [root / encode_run_id(RUN) / "metrics", root / encode_run_id(RUN) / ".tmp"]
    if why == "directory mode":
        if os.geteuid() == 0:
            pytest.skip("root writes to a directory whatever its mode")
        store = tracker(str(root))
        for folder in folders:
            folder.mkdir(exist_ok=True)
            folder.chmod(0o555)
    elif why == "permission denied":
        store = AsyncFsspecTracker(DeniedFileSystem(), str(root))
    else:
        store = AsyncFsspecTracker(ReadOnlyFileSystem(), str(root))
    before = names(store)
    reader = reader_at(store, last_beat(store) + DEAD)
    attempts = count_attempts(reader, monkeypatch)
    want = expected_rows(w.points)
    try:
        with caplog.at_level(logging.DEBUG, logger="async_tracker"):
            assert scalar_rows(scalars(reader)) == want
            settle(reader)
            assert metric_rows(reader) == want  # again: not tried again, not told again
            settle(reader)
    finally:
        if why == "directory mode":
            for folder in folders:
                folder.chmod(0o755)
    assert names(store) == before and attempts == [RUN]
    told = [r for r in caplog.records if "not compacted by this reader" in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.DEBUG
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_compaction_that_fails_leaves_the_reads_result_and_every_segment(
    store: AsyncFsspecTracker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from async_tracker.backend.fsspec import parquet as parquet_module

    w = killed_writer(store)
    before = names(store)

    def failing(*args: object, **kwargs: object) -> bytes:
        raise MemoryError("no room to compact")

    monkeypatch.setattr(parquet_module, "compact", failing)
    reader = reader_at(store, last_beat(store) + DEAD)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        assert scalar_rows(scalars(reader)) == expected_rows(w.points)
        settle(reader)
        scalars(reader)
        settle(reader)
    (warning,) = caplog.records
    assert "not compacted by this reader" in warning.getMessage()
    assert "MemoryError" in warning.getMessage()
    assert names(store) == before


def test_a_compaction_out_of_budget_is_given_up_and_the_read_stands(
    store: AsyncFsspecTracker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from async_tracker.backend.fsspec import readcompact

    w = killed_writer(store)
    before = names(store)
    monkeypatch.setattr(readcompact, "COMPACTION_BUDGET_S", 0.0)
    reader = reader_at(store, last_beat(store) + DEAD)
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        assert scalar_rows(scalars(reader)) == expected_rows(w.points)
        settle(reader)
    (warning,) = caplog.records
    assert "within 0.0 s" in warning.getMessage()
    assert names(store) == before


def test_a_corrupt_segment_is_left_out_and_where_it_is(
    store: AsyncFsspecTracker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = Writer(store)
    for k in range(3):
        w.write(steps_of("loss", range(10 * k, 10 * k + 10)))
    beat(store)
    bad = names(store)[1]
    path = posixpath.join(store.root_dir, encode_run_id(RUN), "metrics", bad)
    store.fs.pipe_file(path, store.fs.cat(path)[:-30])  # truncated: no footer
    reader = reader_at(store, last_beat(store) + DEAD)
    attempts = count_attempts(reader, monkeypatch)
    good = [*range(10), *range(20, 30)]
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        assert scalars(reader).curves["loss"].steps.tolist() == good
        settle(reader)
    assert any(bad in r.getMessage() and "left out" in r.getMessage() for r in caplog.records)
    after = names(store)
    assert bad in after and len(after) == 2 and is_compacted(next(n for n in after if n != bad))
    assert [p[0] for p in metric_rows(reader)["loss"]] == good
    # What is left does not change by compacting again: not tried again.
    settle(reader)
    assert attempts == [RUN] and names(store) == after
