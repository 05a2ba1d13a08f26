"""The memory bound under producers that outrun the tracker loop, and close() under them.

Two measurements, each in a fresh child process (peak RSS is per process)::

    python -m benchmarks.bench_bound                 # both, full size
    python -m benchmarks.bench_bound --quick         # smaller bursts
    python -m benchmarks.bench_bound rss 5000000     # one burst of N points
    python -m benchmarks.bench_bound close 16        # close(timeout=5) under N writers
    python -m benchmarks.bench_bound hot             # the bound's cost on the hot path

* ``rss``: one thread logs N points as fast as it can against a store taking 50 ms per
  batch, with ``max_buffered=100_000``; the figure is the growth of the peak RSS over the
  process's RSS before the burst. The bound means it is about the same for 5M and 20M.
* ``close``: N threads log at full speed while the main thread closes the run with
  ``close(timeout=5)`` (same slow store); the figures are the time close() took, the records
  it left pending in memory, and whether the report counts every accepted record once.
* ``hot``: the cost of the bound's check on the common (not overloaded) path: ``log_metric``
  against the same method without the check (``log_metric`` as it was before the bound, kept
  here for the comparison) and against a bare ``deque.append`` of the same tuple, in
  alternated rounds in one process, compared by medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import anyio

from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.errors import TrackerClosedError
from async_tracker.records import Batch


class SlowStore(InMemoryTracker):
    """A store taking 50 ms per batch that keeps nothing (its own memory is not measured)."""

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        await anyio.sleep(0.05)


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss(points: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as spool:
        run = AppRun("bench-bound-rss", [SlowStore()], max_buffered=100_000, spool_dir=spool)
        run.log_metric("loss", 0.0, 0)
        run.flush(timeout=5)
        before = _peak_rss_mb()
        start = time.perf_counter()
        log = run.log_metric
        for i in range(points):
            log("loss", 0.5, i)
        burst_s = time.perf_counter() - start
        grown = _peak_rss_mb() - before
        report = run.close(timeout=1)
    return {
        "points": points,
        "burst_s": round(burst_s, 2),
        "peak_rss_growth_mb": round(grown, 1),
        "spooled": report.spooled,
        "pending": report.pending,
    }


def close(writers: int, timeout: float = 5.0, warmup_s: float = 1.0) -> dict[str, object]:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as spool:
        run = AppRun("bench-bound-close", [SlowStore()], spool_dir=spool)
        run.log_metric("loss", 0.0, 0)
        accepted = [0] * writers
        go = threading.Event()

        def write(k: int) -> None:
            name = f"w{k}"
            run.log_metric(name, 0.0, 0)
            accepted[k] = 1
            go.wait()
            log = run.log_metric
            n = 1
            try:
                while True:
                    log(name, 1.0, n)
                    n += 1
            except TrackerClosedError:
                accepted[k] = n

        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        for t in threads:
            t.start()
        go.set()
        time.sleep(warmup_s)  # a benchmark: producers at full speed for a while
        start = time.perf_counter()
        run.flush(timeout=timeout)  # as a job's periodic flush would, then its close
        start = time.perf_counter()
        report = run.close(timeout=timeout)
        took = time.perf_counter() - start
        for t in threads:
            t.join()
        total = 1 + sum(accepted) + 1  # the first point, the writers', the end record
        counted = report.delivered + report.spooled + report.dropped + report.pending
        return {
            "writers": writers,
            "close_s": round(took, 2),
            "accepted": total - 1,
            "counted_minus_accepted": counted - (total - 1),
            "pending": report.pending,
            "spooled": report.spooled,
            "delivered": report.delivered,
            "peak_rss_mb": round(_peak_rss_mb(), 1),
        }


_wall_clock = time.time  # what AppRun stamps points with


class _Unchecked(AppRun):
    """``log_metric``'s common path as it was before the bound's check (the comparison):
    a benchmark's copy, reading AppRun's fields as the method itself does."""

    def log_metric(self, name: Any, value: Any, step: Any = None) -> None:
        try:
            if (
                name in self._metric_names
                and type(value) is float
                and (step is None or type(step) is int)
            ):
                self._sink.append((name, value, step, _wall_clock()))
                return
        except TypeError:
            pass
        super().log_metric(name, value, step)


def hot(rounds: int = 400, calls: int = 2000) -> dict[str, object]:
    from collections import deque

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as spool:
        checked = AppRun("bench-hot-a", [InMemoryTracker()], spool_dir=spool)
        unchecked = _Unchecked("bench-hot-b", [InMemoryTracker()], spool_dir=spool)
        sink: deque[tuple[Any, ...]] = deque()

        def bare(name: str, value: float, step: int | None = None) -> None:
            sink.append((name, value, step, _wall_clock()))

        variants = {"checked": checked.log_metric, "unchecked": unchecked.log_metric,
                    "deque": bare}
        for fn in variants.values():
            fn("loss", 0.0, 0)
        times: dict[str, list[float]] = {k: [] for k in variants}
        perf = time.perf_counter_ns
        for r in range(rounds):
            for key, fn in variants.items():
                start = perf()
                for i in range(calls):
                    fn("loss", 0.5, i)
                times[key].append((perf() - start) / calls)
            if r % 20 == 19:
                sink.clear()
                checked.flush()
                unchecked.flush()
        checked.close(timeout=5)
        unchecked.close(timeout=5)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "ns_per_call": {k: round(v, 1) for k, v in med.items()},
        "checked_over_unchecked": round(med["checked"] / med["unchecked"], 3),
        "checked_over_deque": round(med["checked"] / med["deque"], 3),
        "unchecked_over_deque": round(med["unchecked"] / med["deque"], 3),
    }


def _child(args: list[str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_bound", *args, "--json"],
        check=True, capture_output=True, text=True, env=dict(os.environ),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", nargs="?", choices=("rss", "close", "hot", "all"), default="all")
    p.add_argument("n", nargs="?", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.what == "rss":
        result: object = rss(a.n or 5_000_000)
    elif a.what == "close":
        result = close(a.n or 16)
    elif a.what == "hot":
        result = hot()
    else:
        sizes = (1_000_000, 4_000_000) if a.quick else (5_000_000, 20_000_000)
        result = [_child(["rss", str(n)]) for n in sizes] + [_child(["close", "16"])]
        result.append(_child(["hot"]))
    if a.json:
        print(json.dumps(result))
    else:
        for row in result if isinstance(result, list) else [result]:
            print(row)


if __name__ == "__main__":
    main()
