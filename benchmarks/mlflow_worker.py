"""One measured delivery of ``benchmarks.bench_mlflow``, in a process of its own.

    python benchmarks/mlflow_worker.py MODE URL STEPS TAG

Run as a script with ``PYTHONPATH`` naming the async_tracker tree to measure (the benchmark
runs it once with the working tree and once with the base version's checkout), so it imports
nothing of the benchmarks package. ``MODE``:

* ``direct``: ``MlflowClient.log_batch`` with 1,000 points per request, one request at a time,
  the run made before the clock starts: the server's sequential pace.
* ``ours`` / ``ours-durable``: ``AppRun`` over ``AsyncMLflowTracker`` with default options
  (``durable=True`` for the second), from the first ``log_metric`` until ``close()`` returned.

Every ``MlflowClient`` call is timed where it leaves (its public methods, wrapped), new HTTP
connections are counted where urllib3 opens them, and ``AsyncMLflowTracker.write_batch`` (one
call per flush) is timed. It prints one JSON line: the time to durable and the phases.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

NAMES = ("loss", "acc", "lr", "grad_norm")
TIMED = (
    "log_batch", "create_run", "search_runs", "set_terminated", "update_run", "get_run",
    "get_experiment_by_name", "create_experiment", "delete_experiment", "set_tag",
    "delete_tag", "get_metric_history",
)  # fmt: skip

# (method, start, end, metrics, tags, params) of each client call; appended from worker
# threads (list.append is atomic under the GIL).
calls: list[tuple[str, float, float, int, int, int]] = []
flushes: list[tuple[float, float, int]] = []  # write_batch: start, end, metric points
connections = [0]
_count_lock = threading.Lock()


def values(step: int) -> list[tuple[str, float]]:
    return [(name, (step % 97) / (i + 1.0)) for i, name in enumerate(NAMES)]


def instrument() -> None:
    import urllib3.connection
    from mlflow import MlflowClient

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(self, *args, **kwargs)
            finally:
                calls.append((
                    name, start, time.perf_counter(), len(kwargs.get("metrics") or ()),
                    len(kwargs.get("tags") or ()), len(kwargs.get("params") or ()),
                ))  # fmt: skip

        return timed

    for name in TIMED:
        setattr(MlflowClient, name, wrap(name, getattr(MlflowClient, name)))
    real_connect = urllib3.connection.HTTPConnection.connect

    def connect(self: Any) -> None:
        with _count_lock:
            connections[0] += 1
        real_connect(self)

    urllib3.connection.HTTPConnection.connect = connect  # type: ignore[method-assign]


def instrument_flushes() -> None:
    from async_tracker.backend.mlflow import AsyncMLflowTracker

    real = AsyncMLflowTracker.write_batch

    async def write_batch(self: Any, run_id: str, batch: Any) -> None:
        start = time.perf_counter()
        try:
            await real(self, run_id, batch)
        finally:
            flushes.append((start, time.perf_counter(), len(batch.metrics)))

    AsyncMLflowTracker.write_batch = write_batch  # type: ignore[method-assign]


def direct(url: str, steps: int, tag: str) -> tuple[float, float, float]:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(url)
    exp = client.create_experiment(f"bench-log-batch-{tag}-{time.time_ns()}")
    run_id = client.create_run(exp, run_name="bench-log-batch").info.run_id
    now = int(time.time() * 1000)
    points = [Metric(n, v, now + step, step) for step in range(steps) for n, v in values(step)]
    calls.clear()
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i : i + 1000])
    end, cpu = time.perf_counter(), time.process_time() - cpu
    client.set_terminated(run_id)
    check(client, run_id, steps)
    return start, end, cpu


def ours(url: str, steps: int, tag: str, durable: bool) -> tuple[float, float, float]:
    from mlflow import MlflowClient

    from async_tracker import AppRun
    from async_tracker.backend.mlflow import TAG_RUN_KEY, AsyncMLflowTracker, run_key

    experiment = f"bench-ours-{tag}"
    run_id = f"{experiment}-{'durable' if durable else 'plain'}"
    with tempfile.TemporaryDirectory(prefix="bench-mlflow-spool-") as spool:
        run = AppRun(run_id, [AsyncMLflowTracker(experiment, url)], durable=durable,
                     spool_dir=spool)  # fmt: skip
        log = run.log_metric
        run.add_metadata(bench=True)  # starts the run's flusher, as a job's first write would
        cpu, start = time.process_time(), time.perf_counter()
        for step in range(steps):
            for metric, value in values(step):
                log(metric, value, step)
        report = run.close(timeout=600)
        end, cpu = time.perf_counter(), time.process_time() - cpu
    if not report.ok:
        raise SystemExit(f"async_tracker did not deliver everything: {report}")
    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    key = run_key(run_id)
    (found,) = client.search_runs([exp.experiment_id], f"tags.`{TAG_RUN_KEY}` = '{key}'")
    if found.info.status != "FINISHED":
        raise SystemExit(f"run {run_id}: {found.info.status} after close(), not FINISHED")
    check(client, found.info.run_id, steps)
    return start, end, cpu


def check(client: Any, uuid: str, steps: int) -> None:
    for name in NAMES:
        got = len(client.get_metric_history(uuid, name))
        if got != steps:
            raise SystemExit(f"run {uuid}: {name} has {got} points on the server, not {steps}")


def union(spans: list[tuple[float, float]]) -> float:
    """The time covered by at least one of ``spans``."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def phases(start: float, end: float) -> dict[str, Any]:
    mine = [c for c in calls if start <= c[1] <= end]
    points = [c for c in mine if c[0] == "log_batch" and c[3]]
    other: dict[str, list[float]] = {}
    for name, s, e, m, t, p in mine:
        if not (name == "log_batch" and m):
            key = name if name != "log_batch" else f"log_batch (tags {t}, params {p})"
            count_s = other.setdefault(key, [0, 0.0])
            count_s[0] += 1
            count_s[1] += e - s
    first = min(s for _, s, *_ in points)
    last = max(e for _, _, e, *_ in points)
    spans = [(s, e) for _, s, e, *_ in points]
    sizes = [m for *_, m, _, _ in points]
    out: dict[str, Any] = {
        "durable_s": end - start,
        "before_first_s": first - start,
        "points_span_s": last - first,
        "after_last_s": end - last,
        "points_requests": len(points),
        "request_sum_s": sum(e - s for s, e in spans),
        # Within the span, time with no points request in flight: the server waits on us.
        "idle_in_span_s": (last - first) - union(spans),
        "sizes": [min(sizes), statistics.median(sizes), max(sizes)],
        "summary_tags_in_points_requests": sum(1 for c in points if c[4]),
        "other_calls": {k: [int(v[0]), round(v[1], 3)] for k, v in sorted(other.items())},
        "new_connections": connections[0],
    }
    if flushes:
        with_points = [f for f in flushes if f[2]]
        per = []
        prep = []
        for fs, fe, _ in with_points:
            inside = [c for c in points if fs <= c[1] <= fe]
            per.append(len(inside))
            if inside:
                prep.append(min(c[1] for c in inside) - fs)
        out["flushes"] = len(with_points)
        out["flush_points"] = [f[2] for f in with_points][:3]
        out["requests_per_flush"] = [min(per), statistics.median(per), max(per)] if per else []
        out["flush_prep_s"] = sum(prep)
        gaps = [b[0] - a[1] for a, b in itertools.pairwise(with_points)]
        out["between_flushes_s"] = sum(gaps)
    return out


def main() -> None:
    mode, url, steps, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    instrument()
    if mode == "direct":
        start, end, cpu = direct(url, steps, tag)
    else:
        instrument_flushes()
        connections[0] = 0
        start, end, cpu = ours(url, steps, tag, durable=mode == "ours-durable")
    out = phases(start, end)
    out["client_cpu_s"] = cpu
    import async_tracker

    out["tree"] = os.path.dirname(os.path.dirname(os.path.abspath(async_tracker.__file__)))
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
