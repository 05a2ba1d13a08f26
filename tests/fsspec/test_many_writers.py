"""The ranks of one job write to one run at once: 4 processes, 2 threads each, 50k metrics
per process. Nothing collides and nothing is lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsspec

from async_tracker.backend.fsspec import FsspecTracker

RANK_SCRIPT = """
import sys, threading, fsspec
from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker

root, rank, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
run = AppRun("local://job/ranks", [FsspecTracker(fsspec.filesystem("file"), root)],
             batch_size=5_000, flush_interval=0.05)
run.add_metadata(**{f"rank{rank}": rank})
run.add_artifact(f"ckpt-{rank}", f"/ckpt/{rank}")
run.add_source("local://job/parent", None)

def worker(t):
    for i in range(n // 2):
        run.log_metric(f"loss/r{rank}/t{t}", float(i), step=i)

threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
for th in threads: th.start()
for th in threads: th.join()
report = run.close(60)
assert report.ok, report
print(report.delivered)
"""


def test_four_processes_write_one_run(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    n = 50_000
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, root, str(rank), str(n)],
            stdout=subprocess.PIPE, text=True,
        )
        for rank in range(4)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    assert [int(o) for o in outs] == [n + 3] * 4

    tracker = FsspecTracker(fsspec.filesystem("file"), root)
    run_id = "local://job/ranks"
    assert tracker.metadata(run_id) == {f"rank{r}": r for r in range(4)}
    assert sorted(tracker.artifacts(run_id)) == [f"ckpt-{r}" for r in range(4)]
    assert [s.source_run_id for s in tracker.sources(run_id)] == ["local://job/parent"]
    metrics = tracker.metrics(run_id)
    assert len(metrics) == 8
    for name, points in metrics.items():
        assert [p.step for p in points] == list(range(n // 2)), name
        assert [p.value for p in points] == [float(i) for i in range(n // 2)]
