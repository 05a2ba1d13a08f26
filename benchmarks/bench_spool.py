"""Durability costs: peak memory against a stalled backend, and what ``durable=True`` costs.

    python -m benchmarks.bench_spool [--records 2000000] [--points 1000000] [--rounds 3]

1. A backend that hangs on its first write; 2M records logged with ``max_buffered=100_000``.
   Figure: growth of the process's peak RSS (MB) from just before the first record to the
   moment everything is in memory or on disk, measured in a fresh process. The same process
   also measures a baseline that keeps the 2M records in an unbounded queue (what MLflow's
   async queue does), so the ratio reads beside it.
2. 1M metrics to local disk through the fsspec backend until ``close()`` returns, with
   ``durable=False`` and ``durable=True``, alternated; figure: the throughput ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEMORY_CHILD = """
import resource, sys, tempfile, threading, time
from collections import deque
from async_tracker import AppRun, AsyncTrackerBase
from async_tracker.backend.memory import InMemoryTracker
import anyio

mode, total = sys.argv[1], int(sys.argv[2])

def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

class Stalled(InMemoryTracker):
    async def write_batch(self, run_id, batch):
        await anyio.sleep_forever()

start = rss_mb()
if mode == "ours":
    run = AppRun("stalled", [Stalled(name="stalled")], spool_dir=tempfile.mkdtemp(),
                 max_buffered=100_000, batch_size=20_000, flush_interval=0.05)
    for i in range(total):
        run.log_metric("m", float(i), i)
    run.flush(0)
    while run.status().backends["stalled"].spooled + 100_000 < total:
        time.sleep(0.01)
else:
    q = deque()
    for i in range(total):
        q.append(("m", float(i), i, time.time()))
print(rss_mb() - start)
"""


def peak_memory(total: int) -> dict[str, float]:
    out = {}
    for mode in ("ours", "unbounded"):
        proc = subprocess.run(
            [sys.executable, "-c", MEMORY_CHILD, mode, str(total)],
            check=True, capture_output=True, text=True,
        )
        out[f"{mode}_mb"] = float(proc.stdout.strip().splitlines()[-1])
    out["ratio"] = out["ours_mb"] / out["unbounded_mb"]
    return out


def durable_cost(points: int, rounds: int) -> dict[str, float]:
    import fsspec

    from async_tracker import AppRun
    from async_tracker.backend.fsspec import FsspecTracker

    def once(durable: bool) -> float:
        d = tempfile.mkdtemp(prefix="bench-durable-")
        try:
            tracker = FsspecTracker(fsspec.filesystem("file"), os.path.join(d, "store"))
            start = time.perf_counter()
            run = AppRun(f"durable-{durable}", [tracker], durable=durable,
                         spool_dir=os.path.join(d, "spool"), batch_size=50_000)
            log = run.log_metric
            for i in range(points // 4):
                log("loss", 0.5, i)
                log("acc", 0.5, i)
                log("lr", 0.001, i)
                log("grad", 1.0, i)
            report = run.close(600)
            assert report.ok, report
            return time.perf_counter() - start
        finally:
            shutil.rmtree(d)

    plain, durable = [], []
    for _ in range(rounds):
        plain.append(once(False))
        durable.append(once(True))
    p, d = statistics.median(plain), statistics.median(durable)
    return {"plain_s": p, "durable_s": d, "throughput_ratio": p / d}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"{platform.platform()}")
    mem = peak_memory(args.records)
    print(f"stalled backend, {args.records} records, max_buffered=100000: peak RSS growth "
          f"{mem['ours_mb']:.0f} MB (unbounded queue: {mem['unbounded_mb']:.0f} MB, "
          f"ratio {mem['ratio']:.2f})")
    cost = durable_cost(args.points, args.rounds)
    print(f"{args.points} metrics to local disk: durable=False {cost['plain_s']:.2f} s, "
          f"durable=True {cost['durable_s']:.2f} s, throughput ratio "
          f"{cost['throughput_ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"memory": mem, "durable": cost}, indent=2))


if __name__ == "__main__":
    main()
