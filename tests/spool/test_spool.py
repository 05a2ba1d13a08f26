"""Durability: the disk spool, crash recovery, overload, damage, and ``sync``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from async_tracker import AppRun, BackendStatus
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.records import Batch, TrackerMetric
from async_tracker.spool import spooled_runs
from async_tracker.spool.codec import decode_batch, encode_batch
from async_tracker.sync import sync_spool
from tests.core.helpers import wait_until
from tests.faulty import FaultyTracker, FileTracker, Hang, transient
from tests.spool.helpers import NO_WAIT, segments

REPO = Path(__file__).resolve().parents[2]
def metric_steps(tracker: FileTracker, run_id: str) -> list[int]:
    steps = []
    for line in tracker.lines():
        if line["run_id"] == run_id and line["op"] == "metrics":
            steps.extend(p[2] for p in line["points"])
    return steps


def test_encoding_round_trips_and_detects_damage() -> None:
    batch = Batch(
        3,
        metadata={"a": [1, 2]},
        metrics=[TrackerMetric("m", float("nan"), 4, 1.5)],
        records=2,
        done={"metadata"},
        names={"metrics": "x.jsonl"},
    )
    line = encode_batch(batch)
    back = decode_batch(line)
    assert back.metadata == {"a": [1, 2]} and back.done == {"metadata"}
    assert back.names == {"metrics": "x.jsonl"} and back.records == 2
    assert back.metrics[0].step == 4 and back.metrics[0].value != back.metrics[0].value
    damaged = line.replace(b'"a"', b'"b"')
    with pytest.raises(ValueError, match="checksum"):
        decode_batch(damaged)


KILL_SCRIPT = """
import sys
from async_tracker import AppRun
from tests.faulty import FaultyTracker, FileTracker, Hang

path, spool = sys.argv[1], sys.argv[2]
backend = FaultyTracker(FileTracker(path), name="files").when(
    "write_batch", lambda n: n >= 2, Hang())
run = AppRun("job-kill", [backend], durable=True, spool_dir=spool, flush_interval=3600)
for i in range(100):
    run.log_metric("m", float(i), step=i)
assert run.flush(10).ok           # batch 1: logged to the write-ahead log, then delivered
for i in range(100, 250):
    run.log_metric("m", float(i), step=i)
run.add_metadata(last=249)
run.flush(0)                      # cut batch 2 now; the backend hangs on it
# It was read back from the log: it is on disk. (Asserted: "ready" must not come before.)
assert backend.wait_for("write_batch", 2, timeout=60)
print("ready", flush=True)
sys.stdin.read()
"""


def test_sigkill_with_durable_then_recovery_exactly_once(tmp_path: Path) -> None:
    path, spool = tmp_path / "records.jsonl", tmp_path / "spool"
    child = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(path), str(spool)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait(10)

    files = FileTracker(path, name="files")
    assert metric_steps(files, "job-kill") == list(range(100))  # what was delivered
    assert segments(spool)  # what was not is on disk

    # The next start with the same spool directory replays it, once.
    with AppRun("job-kill", [files], spool_dir=str(spool)) as run:
        report = run.flush(30)
        assert report.ok, report
    assert sorted(metric_steps(files, "job-kill")) == list(range(250))
    assert segments(spool) == []
    # A second start finds nothing left to replay.
    with AppRun("job-kill", [files], spool_dir=str(spool)) as run:
        run.flush(30)
    assert sorted(metric_steps(files, "job-kill")) == list(range(250))


@pytest.mark.scale
def test_stalled_backend_keeps_memory_bounded_and_delivers_in_order(tmp_path: Path) -> None:
    total, max_buffered, batch_size = 2_000_000, 100_000, 20_000
    release = threading.Event()
    mem = InMemoryTracker()
    stalled = FaultyTracker(mem, name="stalled").on("write_batch", 1, action=Hang(release))
    run = AppRun("stalled", [stalled], spool_dir=str(tmp_path), max_buffered=max_buffered,
                 batch_size=batch_size, flush_interval=0.05)
    log = run.log_metric
    for i in range(total):
        log("m", float(i), i)
    assert stalled.wait_for("write_batch", 1, timeout=60)
    run.flush(0)  # cut what is still buffered
    # Once the spool writer has caught up with the burst, memory holds at most max_buffered
    # records and the rest is on disk. (How far a burst can run ahead of the writer is
    # measured by benchmarks/bench_spool.py, not asserted here.)
    seen: list[BackendStatus] = []

    def caught_up() -> bool:  # one snapshot (status() may be read while a cut is under way)
        seen.append(run.status().backends["stalled"])
        s = seen[-1]
        return s.spooled >= total - max_buffered and s.buffered + s.in_flight + s.spooled == total

    wait_until(caught_up)
    assert seen[-1].in_flight <= max_buffered  # the rest waits packed, in order, or on disk
    assert len(list(tmp_path.rglob("*.seg"))) >= 1
    release.set()
    report = run.flush(120)
    assert report.ok and report.delivered == total, report
    steps = [p.step for p in mem.points("stalled", "m")]
    assert steps == list(range(total))
    assert segments(tmp_path) == []
    run.close()


def test_backend_down_past_the_retry_budget_spools_then_recovers(tmp_path: Path) -> None:
    files = FileTracker(tmp_path / "out.jsonl", name="files")
    down = FaultyTracker(files, name="files").always("write_batch", transient("down"))
    run = AppRun("down", [down], spool_dir=str(tmp_path / "spool"), retry=NO_WAIT,
                 flush_interval=3600)
    for batch in range(5):
        for i in range(10):
            run.log_metric("m", float(i), step=batch * 10 + i)
        run.flush()  # each: a new batch; the first exhausts its retries and parks the lane
    # Between rounds the batch being retried goes to disk too: all of it is there.
    wait_until(lambda: run.status().backends["files"].spooled == 50)
    s = run.status().backends["files"]
    assert not s.healthy and "down" in (s.last_error or "")
    assert s.in_flight == 0
    assert segments(tmp_path / "spool")
    down.heal()
    report = run.flush(30)  # kicks the parked lane
    assert report.ok, report
    assert metric_steps(files, "down") == list(range(50))  # in order, once
    assert segments(tmp_path / "spool") == []
    run.close()


def test_close_deadline_spools_and_sync_replays(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    out = tmp_path / "out.jsonl"
    hung = FaultyTracker(FileTracker(out), name="files").always("write_batch", Hang())
    run = AppRun("closing", [hung], spool_dir=str(spool), flush_interval=3600)
    run.add_metadata(a=1)
    for i in range(30):
        run.log_metric("m", float(i), step=i)
    report = run.close(0.2)
    assert report.spooled == 31 and report.pending == 0 and not report.ok
    assert report.spool_paths["files"].startswith(str(spool))
    # This process still owns those segments: a sync here must leave them alone ...
    assert spooled_runs(spool)[0][0] == "closing"


SYNC_SCRIPT = """
import sys
from async_tracker.sync import sync_spool
from tests.faulty import FileTracker
result = sync_spool(__import__("pathlib").Path(sys.argv[1]), {"files": FileTracker(sys.argv[2])})
print("ok" if result.ok else result)
"""


def test_sync_replays_what_a_dead_process_spooled(tmp_path: Path) -> None:
    spool, out = tmp_path / "spool", tmp_path / "out.jsonl"
    script = (
        "import sys\n"
        "from async_tracker import AppRun\n"
        "from tests.faulty import FaultyTracker, FileTracker, Hang\n"
        "b = FaultyTracker(FileTracker(sys.argv[2]), name='files').always('write_batch', Hang())\n"
        "run = AppRun('to-sync', [b], spool_dir=sys.argv[1], flush_interval=3600)\n"
        "run.add_artifact('model', '/m.pt')\n"
        "for i in range(40): run.log_metric('m', float(i), step=i)\n"
        "assert run.close(0.2).spooled == 41\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", script, str(spool), str(out)], check=True, env=env)
    assert segments(spool)
    files = FileTracker(out, name="files")
    result = sync_spool(spool, {"files": files}, timeout=30)
    assert result.ok, result
    assert result.reports[("to-sync", "files")].delivered == 41
    assert metric_steps(files, "to-sync") == list(range(40))
    assert segments(spool) == []
    # Idempotent: a second sync has nothing to do.
    assert sync_spool(spool, {"files": files}).reports == {}


def test_damaged_segments_are_skipped_past_the_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool"
    script = (
        "import sys\n"
        "from async_tracker import AppRun\n"
        "from tests.faulty import FaultyTracker, InMemoryTracker, Hang\n"
        "b = FaultyTracker(InMemoryTracker(), name='files').always('write_batch', Hang())\n"
        "run = AppRun('damaged', [b], spool_dir=sys.argv[1], flush_interval=3600)\n"
        "for k in range(3):\n"
        "    for i in range(10): run.log_metric('m', float(i), step=k * 10 + i)\n"
        "    run.flush(0)\n"
        "assert run.close(0.2).spooled == 30\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", script, str(spool)], check=True, env=env)
    (segment,) = segments(spool)
    lines = segment.read_bytes().split(b"\n")
    assert len([x for x in lines if x]) == 4  # three batches, then the run's end record
    lines[1] = lines[1].replace(b"[", b"{", 1)  # a flipped byte in the middle batch
    segment.write_bytes(b"\n".join(lines) + b'deadbeef {"torn')  # and a torn write at the end
    mem = InMemoryTracker(name="files")
    with caplog.at_level(logging.WARNING, logger="async_tracker"):
        run = AppRun("damaged", [mem], spool_dir=str(spool))
        run.flush(30)
        report = run.close()
    assert [p.step for p in mem.points("damaged", "m")] == list(range(10)) + list(range(20, 30))
    assert "skipped 2 damaged lines" in caplog.text
    # The lost batch is not lost silently: counted as dropped, and named.
    assert report.delivered == 20 and report.dropped == 10
    assert "damaged: 10 records lost" in report.refused["files"][0]


def test_unwritable_spool_is_an_error_in_status_not_a_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the spool directory should be")
    release = threading.Event()
    stalled = FaultyTracker(InMemoryTracker(), name="s").on("write_batch", 1, action=Hang(release))
    run = AppRun("nospace", [stalled], spool_dir=str(blocker / "spool"), max_buffered=20,
                 batch_size=10, flush_interval=3600)
    for i in range(10):
        run.log_metric("m", float(i), step=i)
    run.flush(0)
    assert stalled.wait_for("write_batch", 1, timeout=60)
    for i in range(10, 100):  # past max_buffered: the lane tries the spool, which fails
        run.log_metric("m", float(i), step=i)
        if i % 10 == 9:
            run.flush(0)
    wait_until(lambda: "spool" in (run.status().backends["s"].last_error or ""))
    s = run.status().backends["s"]
    assert s.buffered + s.in_flight == 100 and s.spooled == 0  # in memory, as pending
    run.log_metric("still", 1.0)  # the training loop goes on
    release.set()
    report = run.close(30)
    assert report.delivered == 101 and report.ok, report
