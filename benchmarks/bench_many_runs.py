"""Many runs in one process: threads, memory and time of an orchestrator with 1000 runs open,
the cost of a short run, and the files short-lived writers leave at the store's root.

    python -m benchmarks.bench_many_runs [--runs 1000] [--points 100] [--cycles 3000]
        [--ids 50] [--rounds 2] [--base 8e7e8ab | --no-base] [--tracemalloc] [--json FILE]

Three measurements, each in a fresh subprocess:

* **Many runs.** 1000 ``AppRun`` objects are opened at once, each with its own
  ``FsspecTracker`` on one local root (what a sweep driver or an orchestrator does); each logs
  100 points; then all are closed together (``aclose()`` gathered on one asyncio loop) and
  every point is read back. A sampler thread reads the process's thread count and RSS every
  2 ms throughout. Figures: the peak number of threads (sampled, the sampler excluded) beside
  the warmed-up process's; the worker pool's cap and peak (exact); the growth of RSS at its
  peak and after every run closed; the time from the first open to the last close.
  ``--tracemalloc`` also reports the peak of Python allocations (slower; inflates RSS).
* **Short runs.** ``--cycles`` times: an ``AppRun`` opened on a local root, one point logged,
  closed (``close()`` returned: delivered), run ids taken in turn from ``--ids``: the mean and
  median milliseconds of a cycle (the mean includes what is amortised, such as folds of the
  run index).
* **Root files.** The files at the store's root after those cycles (each cycle is a writer of
  its own: its summary file), and after a listing of the store (``run_summaries``), which also
  checks that every run id is listed once, finished.

Each process is warmed up first (one run opened, logged to and closed) so that imports, the
tracker loop and its threads are in its baseline. With a base revision (default 8e7e8ab, the
version before the many-runs work), the same measurements run against it too, in alternated
rounds: its ``async_tracker`` package is taken from git (``git archive``) into a temporary
folder put first on the child's ``PYTHONPATH``; each figure is printed beside the base's, as a
ratio of medians over the rounds. The machine these run on is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import asdict, dataclass
from typing import Any

import fsspec

from async_tracker import AppRun
from async_tracker.backend.fsspec import AsyncFsspecTracker, FsspecTracker
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


@dataclass
class Cycles:
    cycles: int
    run_ids: int
    cycle_ms_mean: float
    cycle_ms_median: float
    root_files: int
    root_files_after_listing: int
    runs_listed: int


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
        # Its own store beside the warm-up's: a listing of it finds no folder but runs.
        store = os.path.join(root, "store")
        with Sampler() as sampler:
            log_and_close(fs, store, runs, points)
            after_close = rss_bytes()
        seconds = time.perf_counter() - start
        traced = None
        if use_tracemalloc:
            traced = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        stored = read_back(fs, store, runs)
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


def run_cycles(cycles: int, ids: int, root: str | None = None) -> Cycles:
    """``cycles`` short runs (open, one point, close) on one local root, run ids in turn."""
    fs = fsspec.filesystem("file")
    owned = root is None
    root = root or tempfile.mkdtemp(prefix="bench-short-runs-")
    try:
        log_and_close(fs, os.path.join(root, "warmup"), 1, 1)
        store = os.path.join(root, "store")
        times: list[float] = []
        for i in range(cycles):
            start = time.perf_counter()
            run = AppRun(f"bench/short/{i % ids}", [FsspecTracker(fs, store)])
            run.log_metric("loss", 1.0, i)
            report = run.close()
            times.append(time.perf_counter() - start)
            assert report.ok and report.delivered == 1, report
        files = sum(1 for entry in os.scandir(store) if entry.is_file())
        listed = runtime().loop.call(AsyncFsspecTracker(fs, store).run_summaries)
        assert len({r.run_id for r in listed}) == len(listed) == min(ids, cycles), len(listed)
        assert all(r.status == "finished" for r in listed), [r.status for r in listed][:5]
        after = sum(1 for entry in os.scandir(store) if entry.is_file())
        return Cycles(
            cycles=cycles,
            run_ids=ids,
            cycle_ms_mean=round(statistics.fmean(times) * 1000, 2),
            cycle_ms_median=round(statistics.median(times) * 1000, 2),
            root_files=files,
            root_files_after_listing=after,
            runs_listed=len(listed),
        )
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One side's figures, in this process: the many runs, or the short runs."""
    import async_tracker

    # Which tree this side measured: the base's package, or this one's.
    tree = {"package": os.path.dirname(os.path.dirname(async_tracker.__file__))}
    if args.only == "many":
        return {**asdict(measure(args.runs, args.points, args.tracemalloc)), **tree}
    return {**asdict(run_cycles(args.cycles, args.ids)), **tree}


def base_tree(rev: str) -> str:
    """A temporary folder holding the ``async_tracker`` package at ``rev`` (from git)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = tempfile.mkdtemp(prefix=f"bench-base-{rev}-")
    archive = subprocess.run(
        ["git", "-C", here, "archive", rev, "async_tracker"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return folder


def in_subprocess(args: argparse.Namespace, only: str, first: str | None) -> dict[str, Any]:
    """The figures of ``only`` in a fresh process, its ``async_tracker`` from ``first`` (this
    tree's if None)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (first, here) if p)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            sys.executable, "-m", "benchmarks.bench_many_runs", "--child", "--only", only,
            "--runs", str(args.runs), "--points", str(args.points),
            "--cycles", str(args.cycles), "--ids", str(args.ids), "--json", out.name,
        ]  # fmt: skip
        if args.tracemalloc:
            cmd.append("--tracemalloc")
        # Run from the side's tree: ``-m`` puts the working directory first on sys.path.
        subprocess.run(cmd, env=env, check=True, cwd=first or here)
        with open(out.name) as f:
            figures: dict[str, Any] = json.load(f)
            return figures


SHOWN = {
    "many": ["seconds", "rss_growth_peak_mb", "rss_growth_after_close_mb", "peak_threads",
             "points_read_back"],
    "short": ["cycle_ms_mean", "cycle_ms_median", "root_files", "root_files_after_listing",
              "runs_listed"],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--ids", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", default="8e7e8ab", help="git revision measured beside")
    parser.add_argument("--no-base", action="store_true")
    parser.add_argument("--only", choices=["many", "short"])
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.child:
        with open(args.json, "w") as f:
            json.dump(child(args), f)
        return
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, load {load[0]:.1f}"
    )
    sides: dict[str, str | None] = {"this": None}
    if not args.no_base:
        sides["base"] = base_tree(args.base)
    parts = [args.only] if args.only else ["many", "short"]
    got: dict[str, dict[str, list[dict[str, Any]]]] = {
        part: {side: [] for side in sides} for part in parts
    }
    try:
        for n in range(args.rounds):
            for part in parts:
                # Alternated, and the order flipped each round: neither side always goes first.
                order = list(sides) if n % 2 == 0 else list(reversed(sides))
                for side in order:
                    figures = in_subprocess(args, part, sides[side])
                    got[part][side].append(figures)
                    shown = {k: figures[k] for k in [*SHOWN[part], "package"]}
                    print(f"round {n + 1} {part} {side}: {shown}", flush=True)
    finally:
        for folder in sides.values():
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    out: dict[str, Any] = {"rounds": got}
    for part in parts:
        print(f"\n{part}: median of {args.rounds} rounds (each round's values in brackets)")
        header = f"{'figure':28} {'this':>10}"
        if "base" in sides:
            header += f" {'base ' + args.base:>16} {'ratio':>7}"
        print(header)
        for key in SHOWN[part]:
            this = [float(r[key]) for r in got[part]["this"]]
            line = f"{key:28} {statistics.median(this):>10.2f}"
            if "base" in sides:
                base = [float(r[key]) for r in got[part]["base"]]
                ratio = statistics.median(this) / statistics.median(base) if any(base) else 0.0
                line += f" {statistics.median(base):>16.2f} {ratio:>7.2f}"
                line += f"   {this} vs {base}"
            else:
                line += f"   {this}"
            print(line)
    expected = args.runs * args.points
    short = [r for r in got.get("many", {}).get("this", [])]
    if any(r["points_read_back"] != expected for r in short):
        print("MISSING POINTS", file=sys.stderr)
        sys.exit(1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
