"""Metadata of the fsspec store when wall clocks step back (NTP does this): a process's later
write of a key wins over its earlier ones, and processes order by their hybrid-clock stamps."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import METADATA_DIR, FsspecTracker, encode_run_id
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.clock import HybridClock
from tests.core.helpers import Child

RUN = "clock/run"
T0 = 1_700_000_000.0


@pytest.fixture(autouse=True)
def fresh_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new process clock for each test: stamps of earlier tests (real times) would be
    above the injected wall times, which would then only count on from them."""
    monkeypatch.setattr("async_tracker.run._metadata_clock", HybridClock())


def key_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / encode_run_id(RUN) / METADATA_DIR).iterdir())


def store(root: Path) -> FsspecTracker:
    return FsspecTracker(fsspec.filesystem("file"), str(root))


@pytest.mark.parametrize("reopen", [False, True], ids=["same-run", "reopened-run"])
def test_a_clock_stepped_back_never_lets_an_earlier_write_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reopen: bool
) -> None:
    now = [T0 + 100]
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: now[0])
    run = AppRun(RUN, [store(tmp_path)], flush_interval=3600)
    run.add_metadata(lr=1)
    assert run.flush().ok
    if reopen:  # the same process opens the run again (a resumed job)
        assert run.close().ok
        run = AppRun(RUN, [store(tmp_path)], flush_interval=3600)
    now[0] -= 10.0
    run.add_metadata(lr=2)
    assert run.flush().ok
    assert run.metadata() == {"lr": 2}
    assert run.close().ok
    assert store(tmp_path).metadata(RUN) == {"lr": 2}
    assert len(key_files(tmp_path)) == 1  # the superseded file is the lr=1 one


def test_files_written_before_the_clock_merge_with_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store written by an older version: files named by the bare wall time of the call,
    # then the writer's tag, position and the key's digest (sha256, 16 hex digits). Stamps
    # are ns times too, so an old file orders against new ones by its time.
    old = tmp_path / encode_run_id(RUN) / METADATA_DIR
    old.mkdir(parents=True)
    for when, key in [(T0 + 50, "lr"), (T0 + 500, "wd")]:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        name = f"{int(when * 1e9):019d}-1700000000000000000-abcd12-000001-000000-{digest}"
        (old / name).write_text(json.dumps({"metadata": {key: "old"}}))
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: T0 + 100)
    run = AppRun(RUN, [store(tmp_path)], flush_interval=3600)
    run.add_metadata(lr="new", wd="new")
    assert run.close().ok
    # lr: the new write is later than the old file; wd: the old file is later (its writer's
    # clock was ahead), and it stays the value. One file per key is left.
    assert store(tmp_path).metadata(RUN) == {"lr": "new", "wd": "old"}
    assert len(key_files(tmp_path)) == 2


# A writer process: one AppRun on the shared run; each line "<wall time> <value>" sets its
# wall clock, writes lr=<value> and flushes it before answering "ok".
WRITER = """
import sys
import async_tracker.run
from async_tracker import AppRun
from async_tracker.clock import HybridClock
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.backend.fsspec import FsspecTracker
import fsspec

now = [0.0]
async_tracker.run._wall_clock = lambda: now[0]
run = AppRun(sys.argv[2], [FsspecTracker(fsspec.filesystem("file"), sys.argv[1])],
             flush_interval=3600.0)
print("ready", flush=True)
for line in sys.stdin:
    if not line.strip():
        break
    when, value = line.split()
    now[0] = float(when)
    run.add_metadata(lr=value)
    report = run.flush()
    assert report.ok, report
    print("ok", flush=True)
assert run.close().ok
print("closed", flush=True)
"""


@pytest.fixture
def writers(tmp_path: Path) -> Iterator[tuple[Child, Child]]:
    pair = (Child(WRITER, str(tmp_path), RUN), Child(WRITER, str(tmp_path), RUN))
    try:
        for child in pair:
            assert child.readline() == "ready"
        yield pair
    finally:
        for child in pair:
            child.close()


def write(child: Child, when: float, value: str) -> None:
    assert child.proc.stdin is not None
    child.proc.stdin.write(f"{when} {value}\n".encode())
    child.proc.stdin.flush()
    assert child.readline() == "ok"


def test_two_processes_order_one_key_by_their_hybrid_clocks(
    tmp_path: Path, writers: tuple[Child, Child]
) -> None:
    a, b = writers
    read = store(tmp_path)
    write(a, T0 + 200, "a1")
    write(b, T0 + 150, "b1")  # b's clock is behind a's: a1 stays
    assert read.metadata(RUN) == {"lr": "a1"}
    write(a, T0 + 100, "a2")  # a's clock steps back 100 s: a2 is still after a1, and b1
    assert read.metadata(RUN) == {"lr": "a2"}
    write(b, T0 + 160, "b2")  # b's stamp is still behind a's last
    assert read.metadata(RUN) == {"lr": "a2"}
    write(b, T0 + 300, "b3")  # b's clock passes a's stamps: b3 wins
    assert read.metadata(RUN) == {"lr": "b3"}
    write(a, T0 + 250, "a3")  # a's wall clock (250) is still behind b3's stamp (300)
    assert read.metadata(RUN) == {"lr": "b3"}
    for child in writers:
        assert child.proc.stdin is not None
        child.proc.stdin.write(b"\n")
        child.proc.stdin.flush()
        assert child.readline() == "closed"
        assert child.wait() == 0
    assert read.metadata(RUN) == {"lr": "b3"}
    assert len(key_files(tmp_path)) == 1


def test_threads_writing_one_key_under_a_clock_running_backwards_keep_call_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wall clock goes back at every reading, and four threads write one key at once,
    # across many batches. The memory backend keeps the run's last write in sequence order;
    # the store, which merges by stamp, must end with the same value.
    ticks = itertools.count()  # next() is atomic: each reading is earlier than the last
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: T0 - next(ticks) * 1e-3)
    mem = InMemoryTracker()
    run = AppRun(RUN, [store(tmp_path), mem], flush_interval=3600, batch_size=16)
    start = threading.Barrier(4)

    def writer(n: int) -> None:
        start.wait()
        for i in range(300):
            run.add_metadata(lr=[n, i])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert run.close().ok
    last = mem.runs[RUN].metadata["lr"]
    assert store(tmp_path).metadata(RUN) == {"lr": last}
    assert len(key_files(tmp_path)) == 1
