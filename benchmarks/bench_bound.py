"""The memory bound under producers that outrun the tracker loop, and close() under them.

Two measurements, each in a fresh child process (peak RSS is per process)::

    python -m benchmarks.bench_bound                 # both, full size
    python -m benchmarks.bench_bound --quick         # smaller bursts
    python -m benchmarks.bench_bound rss 5000000     # one burst of N points
    python -m benchmarks.bench_bound close 16        # close(timeout=5) under N writers
    python -m benchmarks.bench_bound close 16 --load busy --trials 5
    python -m benchmarks.bench_bound hot             # the bound's cost on the hot path

* ``rss``: one thread logs N points as fast as it can against a store taking 50 ms per
  batch, with ``max_buffered=100_000``; the figure is the growth of the peak RSS over the
  process's RSS before the burst. The bound means it is about the same for 5M and 20M.
* ``close``: N threads log at full speed while the main thread closes the run with
  ``close(timeout=5)`` (a store taking 50 ms per batch that counts what it stores), one child
  process per trial. The figures: the time close() took (its bound is the timeout + 0.5 s),
  the report, and the outcome: what the store holds and what the spool holds once
  everything has settled (each thread's jobs run, a few seconds gone by), against the
  report's ``delivered`` (+ ``in_doubt``) and ``spooled``. Three loads: ``log`` (the writers
  stop at the close, when their writes raise), ``busy`` (they go on holding the GIL in a
  pure-Python loop until close() returns: the tracker loop and the caller get a
  seventeenth of it), ``down`` (the store refuses every batch: everything ends spooled).
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


class CountingStore(InMemoryTracker):
    """A store taking 50 ms per batch that counts the records it stored (and keeps nothing
    else); ``down``: it refuses every batch (a store that is down)."""

    def __init__(self, down: bool = False) -> None:
        super().__init__(name="store")
        self.down = down
        self.stored = 0
        self._lock = threading.Lock()

    async def write_batch(self, run_id: str, batch: Batch) -> None:
        await anyio.sleep(0.05)
        if self.down:
            raise ConnectionError("the store is down")
        with self._lock:
            self.stored += batch.records


def _spool_holds(spool_dir: str) -> int:
    """Records in the spool: lines of its segments above their pipeline's ack."""
    from pathlib import Path

    from async_tracker.spool.codec import read_segment_bytes

    held = 0
    for path in Path(spool_dir).rglob("*.seg"):
        ack_file = path.parent / f"{path.name.split('-')[0]}.ack"
        ack = int(ack_file.read_text()) if ack_file.exists() else -1
        batches, _ = read_segment_bytes(path.read_bytes())
        held += sum(b.records for b in batches if b is not None and b.seq > ack)
    return held


def close(
    writers: int, load: str = "log", timeout: float = 5.0, warmup_s: float = 1.0
) -> dict[str, object]:
    from async_tracker.runtime.process import runtime

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as spool:
        store = CountingStore(down=load == "down")
        run = AppRun("bench-bound-close", [store], spool_dir=spool)
        accepted = [0] * writers
        go = threading.Event()
        returned = threading.Event()

        def write(k: int) -> None:
            name = f"w{k}"
            go.wait()
            log = run.log_metric
            n = 0
            try:
                while True:
                    log(name, 1.0, n)
                    n += 1
            except TrackerClosedError:
                accepted[k] = n
            if load == "busy":  # the thread goes on with other work, holding the GIL
                spin = 0
                while not returned.is_set():
                    spin += 1

        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        for t in threads:
            t.start()
        go.set()
        time.sleep(warmup_s)  # a benchmark: producers at full speed for a while
        start = time.perf_counter()
        report = run.close(timeout=timeout)
        took = time.perf_counter() - start
        returned.set()
        for t in threads:
            t.join()
        at_return = (store.stored, _spool_holds(spool))
        # Settle: each thread runs the jobs it was given, then time for anything left to move.
        runtime().spool_io.submit(lambda: None).result(timeout=60)
        time.sleep(3.0)
        runtime().spool_io.submit(lambda: None).result(timeout=60)
        settled = (store.stored, _spool_holds(spool))
        total = sum(accepted)
        # Read so that the benchmark also runs on versions before the field (as a baseline).
        in_doubt = getattr(report, "in_doubt", 0)
        counted = report.delivered + report.spooled + report.dropped + report.pending
        return {
            "writers": writers,
            "load": load,
            "close_s": round(took, 3),
            "accepted": total,
            "counted_minus_accepted": counted - total,
            "delivered": report.delivered,
            "spooled": report.spooled,
            "pending": report.pending,
            "in_doubt": in_doubt,
            "stored_at_return": at_return[0],
            "stored_settled": settled[0],
            "spool_at_return": at_return[1],
            "spool_settled": settled[1],
            # The outcome against the report: both 0 when the report is the outcome.
            "stored_beyond_report": max(0, settled[0] - report.delivered - in_doubt),
            "stored_below_report": max(0, report.delivered - settled[0]),
            "spool_minus_spooled": settled[1] - report.spooled,
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


def _close_trials(writers: int, loads: list[str], trials: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for load in loads:
        runs = [
            _child(["close", str(writers), "--load", load]) for _ in range(trials)
        ]
        took = sorted(float(r["close_s"]) for r in runs)  # type: ignore[arg-type]
        rows.extend(runs)
        rows.append({
            "summary": f"close {load}", "trials": trials,
            "close_s_median": round(statistics.median(took), 3), "close_s_max": took[-1],
            "within_5_5_s": sum(t <= 5.5 for t in took),
            "report_is_outcome": sum(
                r["stored_beyond_report"] == r["stored_below_report"]
                == r["spool_minus_spooled"] == r["counted_minus_accepted"] == 0
                for r in runs
            ),
        })
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", nargs="?", choices=("rss", "close", "hot", "all"), default="all")
    p.add_argument("n", nargs="?", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--load", choices=("log", "busy", "down", "all"), default=None,
                   help="close: what the writer threads do (default: every load)")
    p.add_argument("--trials", type=int, default=3, help="close: trials per load")
    a = p.parse_args()
    loads = ["log", "busy", "down"] if a.load in (None, "all") else [a.load]
    if a.what == "rss":
        result: object = rss(a.n or 5_000_000)
    elif a.what == "close" and a.json:  # one trial, in this process (a child of the parent)
        result = close(a.n or 16, loads[0])
    elif a.what == "close":
        result = _close_trials(a.n or 16, loads, a.trials)
    elif a.what == "hot":
        result = hot()
    else:
        sizes = (1_000_000, 4_000_000) if a.quick else (5_000_000, 20_000_000)
        result = [_child(["rss", str(n)]) for n in sizes]
        result += _close_trials(16, loads, 1 if a.quick else a.trials)
        result.append(_child(["hot"]))
    if a.json:
        print(json.dumps(result))
    else:
        for row in result if isinstance(result, list) else [result]:
            print(row)


if __name__ == "__main__":
    main()
