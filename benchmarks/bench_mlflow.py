"""MLflow benchmark: 100k metric points into one local MLflow server, four ways.

* ``mlflow async``: MLflow's own async logging, ``mlflow.log_metric(..., synchronous=False)``
  with ``MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1``: the baseline.
* ``async_tracker``: ``AppRun.log_metric`` over :class:`AsyncMLflowTracker` (default options:
  flushes every second or 10k records, log_batch requests of up to 1000 points, two in flight;
  only MLflow's public client API).
* ``async_tracker durable``: the same with ``durable=True`` (each batch goes to a local
  write-ahead log before delivery).
* ``log_batch direct``: ``MlflowClient.log_batch`` with 1000 points per request, one request at
  a time, called by the benchmark itself: what the server takes, for orientation.

For each: the time from the first call until every point is durable on the server (``close()``
returned, which includes ending the MLflow run; ``flush_async_logging()`` returned; or the last
request answered), checked by reading the points back; and the caller's median cost per call
(each call timed on its own). The figures that matter are the ratios, measured in one process
against the same server. ``--rounds`` repeats the comparison (alternating which tool goes
first, since the server's database grows) and reports the median ratio; ``--load N`` runs N
busy processes (pure-Python loops) alongside, for the figure under load. Run from the
repository root (starts its own server; a minute or two per round)::

    python -m benchmarks.bench_mlflow
    python -m benchmarks.bench_mlflow --rounds 3 --load 2
    python -m benchmarks.bench_mlflow --steps 2500    # smoke run
    python -m benchmarks.bench_mlflow --json bench_mlflow.json

Targets (issue 14): time to durable at most 0.5x MLflow async's, quiet and under load;
caller's cost per call at least 100x lower than MLflow async's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Before mlflow is imported: its async logging reads this when it starts its queue.
os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = "1"

from mlflow import MlflowClient
from mlflow.entities import Metric

from async_tracker import AppRun
from async_tracker.backend.mlflow import TAG_RUN_KEY, AsyncMLflowTracker, run_key
from tests.mlflow.server import MlflowServer

perf_ns = time.perf_counter_ns
NAMES = ("loss", "acc", "lr", "grad_norm")

TARGET_DURABLE_RATIO = 0.5
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


def mlflow_run_of(client: Any, experiment: str, run_id: str) -> str:
    """The MLflow id of the run async_tracker made for ``run_id`` (read back by its tag)."""
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], f"tags.`{TAG_RUN_KEY}` = '{run_key(run_id)}'")
    if run.info.status != "FINISHED":
        raise SystemExit(f"run {run_id}: {run.info.status} after close(), not FINISHED")
    return str(run.info.run_id)


def bench_async_tracker(url: str, steps: int, tag: str, durable: bool) -> tuple[Result, str]:
    name = "async_tracker durable" if durable else "async_tracker"
    experiment = f"bench-{name.replace(' ', '-')}"
    run_id = f"{experiment}-{tag}"
    with tempfile.TemporaryDirectory(prefix="bench-mlflow-spool-") as spool:
        backend = AsyncMLflowTracker(experiment, url)
        run = AppRun(run_id, [backend], durable=durable, spool_dir=spool)
        log = run.log_metric
        run.add_metadata(bench=True)  # starts the run's flusher, as a job's first write would
        costs: list[int] = []
        append = costs.append
        start = perf_ns()
        for step in range(steps):
            for metric, value in values(step):
                t = perf_ns()
                log(metric, value, step)
                append(perf_ns() - t)
        loop_ns = perf_ns() - start
        report = run.close(timeout=600)
        durable_s = (perf_ns() - start) / 1e9
    if not report.ok:
        raise SystemExit(f"async_tracker did not deliver everything: {report}")
    uuid = mlflow_run_of(MlflowClient(url), experiment, run_id)
    return result(name, costs, loop_ns, durable_s), uuid


def bench_mlflow_async(url: str, steps: int, tag: str) -> tuple[Result, str]:
    import mlflow

    mlflow.set_tracking_uri(url)
    mlflow.set_experiment("bench-mlflow-async")
    log = mlflow.log_metric
    costs: list[int] = []
    append = costs.append
    with mlflow.start_run(run_name=f"bench-mlflow-async-{tag}") as active:
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


def bench_log_batch(url: str, steps: int, tag: str) -> tuple[Result, str]:
    client = MlflowClient(url)
    exp = client.create_experiment(f"bench-log-batch-{tag}-{time.time_ns()}")
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


def _busy() -> None:
    while True:  # a CPU-bound neighbour: pure Python, holding its own GIL
        sum(i * i for i in range(10_000))


@contextmanager
def load(n: int) -> Iterator[None]:
    """``n`` busy processes while the block runs (stopped by their handles after it)."""
    procs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
            p.join(10)


def run_round(url: str, client: Any, steps: int, index: int) -> dict[str, Result]:
    tag = f"r{index}"
    benches: list[Callable[[], tuple[Result, str]]] = [
        lambda: bench_mlflow_async(url, steps, tag),
        lambda: bench_async_tracker(url, steps, tag, durable=False),
        lambda: bench_async_tracker(url, steps, tag, durable=True),
    ]
    if index % 2:  # the server's database grows: alternate who writes into the larger one
        benches.reverse()
    benches.append(lambda: bench_log_batch(url, steps, tag))
    out: dict[str, Result] = {}
    for bench in benches:
        res, run_id = bench()
        check_durable(client, run_id, steps)
        out[res.name] = res
        print(
            f"  {res.name:<22} durable after {res.durable_s:7.2f} s   "
            f"median call {res.median_call_us:8.2f} us   mean call "
            f"{res.mean_call_us:8.2f} us",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=25_000, help="steps of 4 metrics each")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the comparison")
    parser.add_argument("--load", type=int, default=0, help="busy processes alongside")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    rounds: list[dict[str, Result]] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-mlflow-") as tmp,
        MlflowServer(Path(tmp) / "server") as server,
        load(args.load),
    ):
        client = MlflowClient(server.url)
        print(
            f"mlflow server at {server.url}; {args.steps} steps x {len(NAMES)} metrics; "
            f"{args.load} busy processes; load average {os.getloadavg()[0]:.1f}"
        )
        for index in range(args.rounds):
            print(f"round {index + 1} of {args.rounds}")
            rounds.append(run_round(server.url, client, args.steps, index))

    def ratios(name: str) -> list[float]:
        return [r[name].durable_s / r["mlflow async"].durable_s for r in rounds]

    print()
    summary: dict[str, Any] = {}
    for name in ("async_tracker", "async_tracker durable"):
        each = ratios(name)
        median = statistics.median(each)
        direct = statistics.median(
            r[name].durable_s / r["log_batch direct"].durable_s for r in rounds
        )
        summary[name] = {"durable_ratios": each, "durable_ratio": median}
        print(
            f"time to durable, {name} / mlflow async: {median:.2f}x (rounds: "
            f"{', '.join(f'{x:.2f}' for x in each)}; target <= {TARGET_DURABLE_RATIO}x); "
            f"/ log_batch direct: {direct:.2f}x"
        )
    call_ratio = statistics.median(
        r["mlflow async"].median_call_us / r["async_tracker"].median_call_us for r in rounds
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
                    "load_processes": args.load,
                    "rounds": [{k: asdict(v) for k, v in r.items()} for r in rounds],
                    "summary": summary,
                    "call_ratio": call_ratio,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
