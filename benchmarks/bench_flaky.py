"""A backend that half-works: how much longer delivery takes when 30% of its calls fail.

    python -m benchmarks.bench_flaky [--rate 0.3] [--rounds 3] [--delay-ms 2] [--batch-size N]

Each round logs 100,000 metric points and 300 other records (metadata, artifacts, sources,
interleaved) and closes the run; the time is from the first write until ``close()`` returns,
everything delivered. Rounds alternate a healthy backend and one whose calls (each part of a
batch: the metrics, the metadata, each artifact, each source) fail with a transient error at
random, ``--rate`` of them, from a seeded generator. Both backends keep the records in memory
after ``--delay-ms`` per call (a store's round trip); the retry policy is the default one
unless ``--backoff-ms`` sets the first wait (and the jitter). Figure: the ratio of the median
times, flaky over healthy (the goal is at most 3x). A flaky round whose close times out says
so, with what it delivered.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence

import anyio

from async_tracker import AppRun, RetryPolicy, TrackerMetric
from async_tracker.backend.memory import InMemoryTracker

METRICS = 100_000
OTHERS = 100  # of each kind: metadata, artifacts, sources


class Store(InMemoryTracker):
    """An in-memory store with a round trip per call, failing ``rate`` of its calls."""

    def __init__(self, delay: float, rate: float, seed: int) -> None:
        super().__init__(name="store")
        self.delay = delay
        self.rate = rate
        self.rng = random.Random(seed)
        self.calls = 0
        self.failures = 0

    async def _call(self) -> None:
        self.calls += 1
        if self.delay:
            await anyio.sleep(self.delay)
        if self.rate and self.rng.random() < self.rate:
            self.failures += 1
            raise ConnectionError("injected: connection reset")

    async def add_metrics(self, run_id: str, metrics: Sequence[TrackerMetric]) -> None:
        await self._call()
        await super().add_metrics(run_id, metrics)

    async def add_metadata(self, run_id: str, **kwargs: object) -> None:
        await self._call()
        await super().add_metadata(run_id, **kwargs)

    async def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Mapping[str, object] | None = None
    ) -> None:
        await self._call()
        await super().add_artifact(run_id, name, path, metadata)

    async def add_source(
        self, run_id: str, source_id: str, artifact_name: str | None = None
    ) -> None:
        await self._call()
        await super().add_source(run_id, source_id, artifact_name)


def one_round(
    run_id: str, store: Store, retry: RetryPolicy, batch_size: int | None, timeout: float
) -> tuple[float, str]:
    spool = tempfile.mkdtemp(prefix="bench-flaky-")
    start = time.perf_counter()
    run = AppRun(run_id, [store], spool_dir=spool, retry=retry, batch_size=batch_size)
    every = METRICS // OTHERS
    for i in range(METRICS):
        run.log_metric("loss", float(i), step=i)
        if i % every == 0:
            k = i // every
            run.add_metadata(**{f"key{k}": k})
            run.add_artifact(f"art{k}", f"/out/{k}")
            run.add_source(f"parent{k}")
    report = run.close(timeout=timeout)
    took = time.perf_counter() - start
    steps = [p.step for p in store.points(run_id, "loss")]
    assert report.pending + report.spooled + report.dropped + report.delivered == METRICS + 300
    if report.ok:
        assert steps == list(range(METRICS)), "points out of order or duplicated"
    state = "ok" if report.ok else (
        f"TIMED OUT: {report.delivered} delivered, {report.spooled} spooled"
    )
    return took, f"{state}; {store.calls} calls, {store.failures} failed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--backoff-ms", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    retry = RetryPolicy()
    if args.backoff_ms is not None:
        retry = RetryPolicy(initial_backoff_s=args.backoff_ms / 1000,
                            jitter_s=args.backoff_ms / 1000)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; {retry}")
    times: dict[str, list[float]] = {"healthy": [], "flaky": []}
    for r in range(args.rounds):
        for kind in ("healthy", "flaky"):
            store = Store(args.delay_ms / 1000, args.rate if kind == "flaky" else 0.0, seed=r)
            took, what = one_round(f"{kind}-{r}", store, retry, args.batch_size, args.timeout)
            times[kind].append(took)
            print(f"round {r} {kind:8} {took:7.2f} s  {what}", flush=True)
    healthy, flaky = statistics.median(times["healthy"]), statistics.median(times["flaky"])
    print(f"median: healthy {healthy:.2f} s, flaky ({args.rate:.0%} of calls fail) "
          f"{flaky:.2f} s: {flaky / healthy:.2f}x")


if __name__ == "__main__":
    main()
