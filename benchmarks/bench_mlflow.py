"""MLflow benchmark: 100k metric points into one local MLflow server, three ways.

* ``async_tracker``: ``AppRun.log_metric`` over :class:`AsyncMLflowTracker` (default options:
  flushes every second or 10k records, log_batch requests of up to 1000 points, two in flight).
* ``mlflow async``: MLflow's own async logging, ``mlflow.log_metric(..., synchronous=False)``
  with ``MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1``.
* ``log_batch direct``: ``MlflowClient.log_batch`` with 1000 points per request, one request at
  a time, called by the benchmark itself: what the server takes, for orientation.

For each: the time from the first call until every point is durable on the server (``close()``
returned, ``flush_async_logging()`` returned, or the last request answered), checked by
reading the points back; and the caller's median cost per call (each call timed on its own).
The figures that matter are the ratios, measured in one process against the same server.
Run from the repository root (starts its own server; about a minute or two)::

    python -m benchmarks.bench_mlflow
    python -m benchmarks.bench_mlflow --steps 2500    # smoke run
    python -m benchmarks.bench_mlflow --json bench_mlflow.json

Targets (issue 4): time to durable at most 0.55x MLflow async's; caller's cost per call at
least 100x lower than MLflow async's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Before mlflow is imported: its async logging reads this when it starts its queue.
os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = "1"

from mlflow import MlflowClient
from mlflow.entities import Metric

from async_tracker import AppRun
from async_tracker.backend.mlflow import AsyncMLflowTracker
from tests.mlflow.server import MlflowServer

perf_ns = time.perf_counter_ns
NAMES = ("loss", "acc", "lr", "grad_norm")

TARGET_DURABLE_RATIO = 0.55
TARGET_CALL_RATIO = 100.0


@dataclass
class Result:
    name: str
    points: int
    durable_s: float
    median_call_us: float
    mean_call_us: float


def values(step: int) -> list[tuple[str, float]]:
    return [(name, (step % 97) / (i + 1.0)) for i, name in enumerate(NAMES)]


def check_durable(client: Any, run_id: str, steps: int) -> None:
    for name in NAMES:
        got = len(client.get_metric_history(run_id, name))
        if got != steps:
            raise SystemExit(f"run {run_id}: {name} has {got} points on the server, not {steps}")


def bench_async_tracker(url: str, steps: int) -> tuple[Result, str]:
    backend = AsyncMLflowTracker("bench-async-tracker", url)
    run = AppRun("bench-async-tracker", [backend])
    log = run.log_metric
    run.add_metadata(bench=True)  # starts the run's flusher, as a job's first write would
    costs: list[int] = []
    append = costs.append
    start = perf_ns()
    for step in range(steps):
        for name, value in values(step):
            t = perf_ns()
            log(name, value, step)
            append(perf_ns() - t)
    loop_ns = perf_ns() - start
    report = run.close(timeout=600)
    durable = (perf_ns() - start) / 1e9
    if not report.ok:
        raise SystemExit(f"async_tracker did not deliver everything: {report}")
    mlflow_run_id = run_id_of(backend, "bench-async-tracker")
    return result("async_tracker", costs, loop_ns, durable), mlflow_run_id


def run_id_of(backend: AsyncMLflowTracker, run_id: str) -> str:
    uuid = backend._resolve_sync(run_id, create=False)
    assert uuid is not None
    return uuid


def bench_mlflow_async(url: str, steps: int) -> tuple[Result, str]:
    import mlflow

    mlflow.set_tracking_uri(url)
    mlflow.set_experiment("bench-mlflow-async")
    log = mlflow.log_metric
    costs: list[int] = []
    append = costs.append
    with mlflow.start_run(run_name="bench-mlflow-async") as active:
        start = perf_ns()
        for step in range(steps):
            for name, value in values(step):
                t = perf_ns()
                log(name, value, step=step, synchronous=False)
                append(perf_ns() - t)
        loop_ns = perf_ns() - start
        mlflow.flush_async_logging()
        durable = (perf_ns() - start) / 1e9
    return result("mlflow async", costs, loop_ns, durable), active.info.run_id


def bench_log_batch(url: str, steps: int) -> tuple[Result, str]:
    client = MlflowClient(url)
    exp = client.create_experiment(f"bench-log-batch-{time.time_ns()}")
    run_id = client.create_run(exp, run_name="bench-log-batch").info.run_id
    now = int(time.time() * 1000)
    points = [Metric(n, v, now + step, step) for step in range(steps) for n, v in values(step)]
    start = perf_ns()
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i : i + 1000])
    durable = (perf_ns() - start) / 1e9
    client.set_terminated(run_id)
    return Result("log_batch direct", len(points), durable, float("nan"), float("nan")), run_id


def result(name: str, costs: list[int], loop_ns: int, durable_s: float) -> Result:
    return Result(
        name=name,
        points=len(costs),
        durable_s=durable_s,
        median_call_us=statistics.median(costs) / 1e3,
        mean_call_us=loop_ns / len(costs) / 1e3,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=25_000, help="steps of 4 metrics each")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    with (
        tempfile.TemporaryDirectory(prefix="bench-mlflow-") as tmp,
        MlflowServer(Path(tmp) / "server") as server,
    ):
        client = MlflowClient(server.url)
        print(f"mlflow server at {server.url}; {args.steps} steps x {len(NAMES)} metrics")
        results: list[Result] = []
        for bench in (bench_mlflow_async, bench_async_tracker, bench_log_batch):
            res, run_id = bench(server.url, args.steps)
            check_durable(client, run_id, args.steps)
            results.append(res)
            print(
                f"  {res.name:<18} durable after {res.durable_s:7.2f} s   "
                f"median call {res.median_call_us:8.2f} us   mean call "
                f"{res.mean_call_us:8.2f} us",
                flush=True,
            )

    ml, ours, direct = results
    durable_ratio = ours.durable_s / ml.durable_s
    call_ratio = ml.median_call_us / ours.median_call_us
    print()
    print(
        f"time to durable, async_tracker / mlflow async: {durable_ratio:.2f}x "
        f"(target <= {TARGET_DURABLE_RATIO}x); "
        f"async_tracker / log_batch direct: {ours.durable_s / direct.durable_s:.2f}x"
    )
    print(
        f"median cost per call, mlflow async / async_tracker: {call_ratio:.0f}x "
        f"(target >= {TARGET_CALL_RATIO:.0f}x)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "python": sys.version.split()[0],
                    "machine": platform.platform(),
                    "cpus": os.cpu_count(),
                    "results": [asdict(r) for r in results],
                    "durable_ratio": durable_ratio,
                    "call_ratio": call_ratio,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
