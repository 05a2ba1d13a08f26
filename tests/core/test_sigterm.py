"""SIGTERM while a run is slow to deliver: whatever the main thread is doing (in ``close()``,
in ``flush()``, logging, in the exit hook's close), the records not delivered by the end of
the grace are spooled before the process dies, and a replay delivers each exactly once.

The backend takes 1.5 s per batch and the grace is 1 s: nothing but the spool can keep the
records. Each scenario runs in a real child process, signalled with ``os.kill``.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker.sync import sync_spool
from tests.core.helpers import Child
from tests.faulty import FileTracker

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes and signals")

POINTS = 5000

SLOW_SCRIPT = """
import sys, threading, time
from async_tracker import AppRun
from tests.faulty import FaultyTracker, FileTracker, Slow

path, spool, mode = sys.argv[1], sys.argv[2], sys.argv[3]
backend = FaultyTracker(FileTracker(path), name="files").always("write_batch", Slow(1.5))
run = AppRun("job", [backend], spool_dir=spool, batch_size=1000, flush_interval=3600,
             close_timeout=10)

def say_when_busy():
    # The second batch goes out 1.5 s after the first: by then the main thread is well into
    # what the mode says (a close under way, a flush waiting, the exit hook's close).
    if backend.wait_for("write_batch", 2, timeout=60):
        print("busy", flush=True)

threading.Thread(target=say_when_busy, daemon=True).start()
for i in range(5000):
    run.log_metric("m", float(i), step=i)
if mode == "close":
    run.close(timeout=10)
elif mode == "flush":
    run.flush()
elif mode == "logging":
    i = 5000
    while True:
        run.log_metric("m", float(i), step=i)
        i += 1
        time.sleep(0.0005)  # pacing, so that the run holds a modest number of records
# "exit": no close(); the exit hook closes the run (within close_timeout=10)
"""


def steps_in(path: Path) -> list[int]:
    return [p[2] for x in FileTracker(path).lines() if x["op"] == "metrics" for p in x["points"]]


@pytest.mark.parametrize("mode", ["close", "flush", "logging", "exit"])
def test_sigterm_spools_what_the_grace_leaves_and_a_replay_delivers_it_once(
    tmp_path: Path, child: Callable[..., Child], mode: str
) -> None:
    path, spool = tmp_path / "store.jsonl", tmp_path / "spool"
    proc = child(SLOW_SCRIPT, str(path), str(spool), mode, ASYNC_TRACKER_SIGTERM_GRACE="1")
    assert proc.readline(timeout=60) == "busy"
    os.kill(proc.proc.pid, signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM, proc.stderr()
    err = proc.stderr()
    # Said once before dying: what waits, and the command that delivers it.
    assert err.count("ended with records not delivered") == 1, err
    assert f"deliver them: async-tracker sync {spool}" in err, err
    delivered = steps_in(path)
    # The next start's replay (async-tracker sync) delivers what was spooled.
    store = FileTracker(path, name="files")
    result = sync_spool(spool, {}, timeout=30, out=io.StringIO(), to=store)
    assert result.ok, result.reports
    spooled = sum(r.delivered for r in result.reports.values())
    steps = steps_in(path)
    logged = POINTS if mode != "logging" else len(steps)
    assert len(delivered) + spooled == logged >= POINTS, (len(delivered), spooled, err)
    assert sorted(steps) == list(range(logged)), "a point lost or stored twice"
