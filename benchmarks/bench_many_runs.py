"""Many runs in one process: threads and memory of an orchestrator with 1000 runs open.

    python -m benchmarks.bench_many_runs [--runs 1000] [--points 100] [--tracemalloc]

1000 ``AppRun`` objects are opened at once, each with its own ``FsspecTracker`` on one local
root (what a sweep driver or an orchestrator does); each logs 100 points; then all are closed
together (``aclose()`` gathered on one asyncio loop) and every point is read back. A sampler
thread reads the process's thread count and RSS every 2 ms throughout.

Figures: the peak number of threads in the process (sampled, the sampler excluded), beside the
warmed-up process's; the worker pool's cap and its peak number of threads (exact); the growth
of RSS, at its peak and after every run closed (MB, and KB per run). ``--tracemalloc`` also
reports the peak of Python allocations, which leaves out thread stacks, C libraries and the
allocator's caching; it slows the run and inflates RSS. The process is warmed up first (one
run opened, logged to and closed) so that imports, the tracker loop and its threads are in
the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import asdict, dataclass

import fsspec

from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.runtime.process import runtime

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Sampler:
    """Samples the thread count and RSS from a thread of its own (excluded from the count)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peak_threads = threading.active_count()
        self.peak_rss = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_threads = max(self.peak_threads, threading.active_count() - 1)
            self.peak_rss = max(self.peak_rss, rss_bytes())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Result:
    runs: int
    points_per_run: int
    baseline_threads: int
    peak_threads: int
    pool_max_threads: int
    pool_peak_threads: int
    rss_growth_peak_mb: float
    rss_growth_after_close_mb: float
    rss_per_run_kb: float
    tracemalloc_peak_mb: float | None
    points_read_back: int
    seconds: float


def log_and_close(fs: fsspec.AbstractFileSystem, root: str, runs: int, points: int) -> None:
    opened = []
    for i in range(runs):
        # A close deadline far beyond the work: the figures are threads and memory, and a
        # loaded machine (tracemalloc slows every allocation) must not spool instead.
        run = AppRun(f"bench/many/{i}", [FsspecTracker(fs, root)], close_timeout=300)
        for step in range(points):
            run.log_metric("loss", 1.0 / (step + 1), step)
        opened.append(run)

    async def close_all() -> None:
        reports = await asyncio.gather(*(run.aclose() for run in opened))
        bad = [r for r in reports if not r.ok or r.delivered != points]
        assert not bad, bad[:3]

    asyncio.run(close_all())


def read_back(fs: fsspec.AbstractFileSystem, root: str, runs: int) -> int:
    reader = FsspecTracker(fs, root)
    stored = 0
    for i in range(runs):
        stored += len(reader.metrics(f"bench/many/{i}").get("loss", ()))
    return stored


def measure(runs: int, points: int, use_tracemalloc: bool, root: str | None = None) -> Result:
    """The figures of one round in this process, with the stores under ``root`` (a temporary
    directory, removed after, by default)."""
    fs = fsspec.filesystem("file")
    owned = root is None
    root = root or tempfile.mkdtemp(prefix="bench-many-runs-")
    try:
        log_and_close(fs, os.path.join(root, "warmup"), 1, points)
        baseline_threads = threading.active_count()
        if use_tracemalloc:
            tracemalloc.start()
        baseline_rss = rss_bytes()
        start = time.perf_counter()
        with Sampler() as sampler:
            log_and_close(fs, root, runs, points)
            after_close = rss_bytes()
        seconds = time.perf_counter() - start
        traced = None
        if use_tracemalloc:
            traced = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        stored = read_back(fs, root, runs)
        pool = runtime().pool
        mb = 2**20
        return Result(
            runs=runs,
            points_per_run=points,
            baseline_threads=baseline_threads,
            peak_threads=sampler.peak_threads,
            pool_max_threads=pool.max_threads,
            pool_peak_threads=pool.peak_threads,
            rss_growth_peak_mb=round((sampler.peak_rss - baseline_rss) / mb, 1),
            rss_growth_after_close_mb=round((after_close - baseline_rss) / mb, 1),
            rss_per_run_kb=round((sampler.peak_rss - baseline_rss) / runs / 1024, 1),
            tracemalloc_peak_mb=None if traced is None else round(traced, 1),
            points_read_back=stored,
            seconds=round(seconds, 2),
        )
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, load {load[0]:.1f}"
    )
    result = measure(args.runs, args.points, args.tracemalloc)
    for key, value in asdict(result).items():
        print(f"{key:28} {value}")
    expected = args.runs * args.points
    if result.points_read_back != expected:
        print(f"MISSING POINTS: {expected - result.points_read_back}", file=sys.stderr)
        sys.exit(1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(result), f, indent=2)


if __name__ == "__main__":
    main()
