"""Where async_tracker's time to durable goes against a real MLflow server, beside the same
points sent by sequential ``MlflowClient.log_batch`` calls of 1,000 (the server's pace).

    python -m benchmarks.bench_mlflow_phases [--steps 25000] [--rounds 2]

Per round, one after the other on one server: ``log_batch direct`` (the run made before the
clock starts, as in ``bench_mlflow``), then ``AppRun`` over ``AsyncMLflowTracker`` with its
default options, whose client calls are timed where they leave (``MlflowClient``'s methods,
wrapped): the time until its first points request (finding or creating the experiment and
the run), the span of its points requests (how many, their summed time: more than the span
when requests overlap), and the time after the last one (ending the run). The ratio
ours / direct is the figure ``bench_mlflow`` reports as ``/ log_batch direct``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from async_tracker import AppRun
from async_tracker.backend.mlflow import AsyncMLflowTracker
from tests.mlflow.server import MlflowServer

NAMES = ("loss", "accuracy", "lr", "grad_norm")
TIMED = (
    "log_batch", "create_run", "search_runs", "set_terminated", "get_run",
    "get_experiment_by_name", "create_experiment", "set_tag",
)  # fmt: skip
# (method, start, end, metric points) of each client call while ``ours`` runs.
calls: list[tuple[str, float, float, int]] = []


def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = real(self, *args, **kwargs)
        calls.append((name, start, time.perf_counter(), len(kwargs.get("metrics") or ())))
        return out

    return timed


def direct(url: str, steps: int, tag: str) -> float:
    client = MlflowClient(url)
    run_id = client.create_run(client.create_experiment(f"direct-{tag}")).info.run_id
    now = int(time.time() * 1000)
    points = [Metric(n, 0.5, now + s, s) for s in range(steps) for n in NAMES]
    start = time.perf_counter()
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i : i + 1000])
    took = time.perf_counter() - start
    client.set_terminated(run_id)
    return took


def ours(url: str, steps: int, tag: str) -> float:
    calls.clear()
    run = AppRun(f"ours-{tag}", [AsyncMLflowTracker(f"ours-{tag}", url)])
    run.add_metadata(bench=True)
    start = time.perf_counter()
    for step in range(steps):
        for name in NAMES:
            run.log_metric(name, 0.5, step)
    report = run.close(600)
    end = time.perf_counter()
    if not report.ok:
        raise SystemExit(f"not delivered: {report}")
    points = [(s, e) for name, s, e, n in calls if name == "log_batch" and n]
    first, last = min(s for s, _ in points), max(e for _, e in points)
    print(
        f"  ours: {end - start:.2f} s = until the first points request {first - start:.2f} s"
        f" + {len(points)} points requests over {last - first:.2f} s (their sum "
        f"{sum(e - s for s, e in points):.2f} s) + after the last {end - last:.2f} s"
    )
    others = [f"{name} {e - s:.2f}" for name, s, e, n in calls if name != "log_batch" or not n]
    print(f"  its other calls (s): {', '.join(others)}")
    return end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=25_000, help="steps of 4 metrics each")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for name in TIMED:
        setattr(MlflowClient, name, wrap(name, getattr(MlflowClient, name)))
    with tempfile.TemporaryDirectory(prefix="bench-mlflow-") as tmp, MlflowServer(
        Path(tmp) / "server"
    ) as server:
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        for r in range(args.rounds):
            base = direct(server.url, args.steps, f"r{r}")
            print(f"round {r + 1}: log_batch direct {base:.2f} s")
            mine = ours(server.url, args.steps, f"r{r}")
            print(f"  ours / direct: {mine / base:.2f}x")


if __name__ == "__main__":
    main()
