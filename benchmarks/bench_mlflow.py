"""MLflow benchmark: 100k metric points delivered durably into one local ``mlflow server``,
against the server's own sequential ``log_batch`` pace, phase by phase, beside the base version.

Each round, on one server (SQLite store, one worker, started on 127.0.0.1 by the benchmark),
in processes of their own (``benchmarks/mlflow_worker.py``, run with ``PYTHONPATH`` naming the
tree measured):

* ``log_batch direct``: ``MlflowClient.log_batch`` with 1,000 points per request, one request
  at a time, the run made before the clock starts: **the sequential log_batch limit**, what
  the server takes. Every other figure is a ratio to it, measured in the same round.
* ``new``: ``AppRun.log_metric`` over ``AsyncMLflowTracker`` with default options (flushes of
  up to 10k records, log_batch requests of up to 1,000 points, two in flight), from the first
  call until ``close()`` returned (which includes ending the MLflow run), this working tree.
* ``base``: the same with the base version (``--base``, a commit: ``git archive`` of it into
  a temporary folder), alternated with ``new``.
* with ``--durable``: ``new durable`` and ``base durable`` (``durable=True``).
* unless ``--no-mlflow-async``: MLflow's own async logging, ``mlflow.log_metric(...,
  synchronous=False)`` with ``MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1``, until
  ``flush_async_logging()`` returned, in this process.

Every run is checked by reading its points back. The order of the round's entries is
reversed every other round (the server's database grows). Per entry the phases are printed,
as timed where each ``MlflowClient`` call leaves: the time before the first points request
(starting the run: experiment and run lookups, creation), the points requests (how many,
their sizes, their span, their summed time: more than the span when they overlap, and the
time within the span with none in flight: the server waiting on the client), flushes and
requests per flush, the time before each flush's first request, the other calls (status,
tags, the close), the time after the last points request (the close), new HTTP connections
(urllib3's), and the client's CPU time.

The machine the figures come from is a shared, noisy 2-core VM: the MLflow server competes
for CPU with the client (and with whatever else runs). Ratios within a round are what count;
``--rounds`` gives their median. Run from the repository root::

    python -m benchmarks.bench_mlflow                      # 3 rounds, a few minutes
    python -m benchmarks.bench_mlflow --rounds 5 --no-mlflow-async
    python -m benchmarks.bench_mlflow --steps 2500 --rounds 1   # smoke run
    python -m benchmarks.bench_mlflow --durable --load 2 --json bench_mlflow.json

Targets: time to durable at most 1.10x the sequential log_batch limit (issue 33), and at most
0.5x MLflow async's (issue 14).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Before mlflow is imported: its async logging reads this when it starts its queue.
os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = "1"

from mlflow import MlflowClient

from tests.mlflow.server import MlflowServer

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "benchmarks" / "mlflow_worker.py"
NAMES = ("loss", "acc", "lr", "grad_norm")
DEFAULT_BASE = "8e7e8ab"
DIRECT = "log_batch direct"
MLFLOW_ASYNC = "mlflow async"
TARGET_LIMIT_RATIO = 1.10
TARGET_ASYNC_RATIO = 0.5
perf_ns = time.perf_counter_ns


def values(step: int) -> list[tuple[str, float]]:
    return [(name, (step % 97) / (i + 1.0)) for i, name in enumerate(NAMES)]


def checkout(rev: str, into: Path) -> Path:
    """The ``async_tracker`` package of commit ``rev``, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "async_tracker"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    into.mkdir(parents=True, exist_ok=True)
    path = into / "async_tracker.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into


def worker(mode: str, tree: Path, url: str, steps: int, tag: str, cwd: str) -> dict[str, Any]:
    """One measured delivery in a process of its own, ``tree``'s async_tracker imported."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, str(WORKER), mode, url, str(steps), tag],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out: dict[str, Any] = json.loads(line[len("RESULT ") :])
            if Path(out.pop("tree")).resolve() != tree.resolve():
                raise SystemExit(f"{mode}: imported the wrong async_tracker, not {tree}")
            return out
    raise SystemExit(f"{mode} ({tree}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def mlflow_async(url: str, steps: int, tag: str) -> dict[str, Any]:
    import mlflow

    mlflow.set_tracking_uri(url)
    mlflow.set_experiment("bench-mlflow-async")
    log = mlflow.log_metric
    with mlflow.start_run(run_name=f"bench-mlflow-async-{tag}") as active:
        start = perf_ns()
        for step in range(steps):
            for name, value in values(step):
                log(name, value, step=step, synchronous=False)
        mlflow.flush_async_logging()
        durable = (perf_ns() - start) / 1e9
    client = MlflowClient(url)
    for name in NAMES:
        got = len(client.get_metric_history(active.info.run_id, name))
        if got != steps:
            raise SystemExit(f"mlflow async: {name} has {got} points on the server, not {steps}")
    return {"durable_s": durable}


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


def phases_line(res: dict[str, Any]) -> str:
    if "points_requests" not in res:
        return ""
    parts = [
        f"start {res['before_first_s']:.2f} s",
        f"{res['points_requests']} points requests (sizes min/median/max "
        f"{'/'.join(str(int(x)) for x in res['sizes'])}) over {res['points_span_s']:.2f} s, "
        f"their sum {res['request_sum_s']:.2f} s, none in flight {res['idle_in_span_s']:.2f} s",
    ]
    if "flushes" in res:
        parts.append(
            f"{res['flushes']} flushes, requests per flush min/median/max "
            f"{'/'.join(str(int(x)) for x in res['requests_per_flush'])}, before each "
            f"flush's first request {res['flush_prep_s']:.2f} s in all, between flushes "
            f"{res['between_flushes_s']:.2f} s"
        )
    others = ", ".join(f"{k} x{n} {s:.2f} s" for k, (n, s) in res["other_calls"].items())
    parts.append(f"other calls: {others or 'none'}")
    parts.append(
        f"close {res['after_last_s']:.2f} s after the last points request; "
        f"{res['new_connections']} HTTP connections; client CPU {res['client_cpu_s']:.2f} s"
    )
    return "\n".join(f"      {p}" for p in parts)


def run_round(
    url: str, steps: int, index: int, trees: dict[str, Path], args: argparse.Namespace, cwd: str
) -> dict[str, dict[str, Any]]:
    tag = f"r{index}"
    entries: list[tuple[str, str, Path | None]] = [
        (DIRECT, "direct", trees["new"]),
        ("new", "ours", trees["new"]),
        ("base", "ours", trees["base"]),
    ]
    if args.durable:
        entries += [("new durable", "ours-durable", trees["new"]),
                    ("base durable", "ours-durable", trees["base"])]  # fmt: skip
    if not args.no_mlflow_async:
        entries.append((MLFLOW_ASYNC, "", None))
    if index % 2:  # the server's database grows: alternate who writes into the larger one
        entries.reverse()
    out: dict[str, dict[str, Any]] = {}
    for name, mode, tree in entries:
        if tree is None:
            res = mlflow_async(url, steps, tag)
        else:
            res = worker(mode, tree, url, steps, f"{tag}-{name.replace(' ', '-')}", cwd)
        res["load_average"] = os.getloadavg()[0]
        out[name] = res
        print(
            f"  {name:<18} durable after {res['durable_s']:7.2f} s  "
            f"(load average {res['load_average']:.1f})",
            flush=True,
        )
        line = phases_line(res)
        if line:
            print(line, flush=True)
    for res in out.values():
        res["limit_ratio"] = res["durable_s"] / out[DIRECT]["durable_s"]
    return out


def median_of(rounds: list[dict[str, dict[str, Any]]], name: str, key: str) -> float:
    return statistics.median(float(r[name][key]) for r in rounds if key in r[name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=25_000, help="steps of 4 metrics each")
    parser.add_argument("--rounds", type=int, default=3, help="repeat the comparison")
    parser.add_argument("--load", type=int, default=0, help="busy processes alongside")
    parser.add_argument("--base", default=DEFAULT_BASE, help="the commit to compare with")
    parser.add_argument("--durable", action="store_true", help="also with durable=True")
    parser.add_argument("--no-mlflow-async", action="store_true", help="skip MLflow async")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    rounds: list[dict[str, dict[str, Any]]] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-mlflow-") as tmp,
        MlflowServer(Path(tmp) / "server") as server,
        load(args.load),
    ):
        base = checkout(args.base, Path(tmp) / "base")
        trees = {"new": ROOT, "base": base}
        print(
            f"mlflow server at {server.url}; {args.steps} steps x {len(NAMES)} metrics; "
            f"base {args.base}; {os.cpu_count()} CPUs shared with the server; "
            f"{args.load} busy processes; load average {os.getloadavg()[0]:.1f}"
        )
        for index in range(args.rounds):
            print(f"round {index + 1} of {args.rounds}", flush=True)
            rounds.append(run_round(server.url, args.steps, index, trees, args, tmp))

    names = [n for n in rounds[0] if n != DIRECT]
    print()
    print(f"{DIRECT} (the sequential limit): median {median_of(rounds, DIRECT, 'durable_s'):.2f} s")
    for name in names:
        each = [r[name]["limit_ratio"] for r in rounds]
        target = f"; target <= {TARGET_LIMIT_RATIO}x" if name.startswith("new") else ""
        print(
            f"time to durable, {name:<13} / {DIRECT}: {statistics.median(each):.2f}x "
            f"(rounds: {', '.join(f'{x:.2f}' for x in each)}{target})"
        )
    if MLFLOW_ASYNC in rounds[0]:
        for name in ("new", "base"):
            each = [r[name]["durable_s"] / r[MLFLOW_ASYNC]["durable_s"] for r in rounds]
            print(
                f"time to durable, {name} / {MLFLOW_ASYNC}: {statistics.median(each):.2f}x "
                f"(target <= {TARGET_ASYNC_RATIO}x)"
            )
    print("\nphases, median of the rounds (new | base | log_batch direct), seconds or counts:")
    keys = [
        ("durable_s", "time to durable"), ("before_first_s", "before the first points request"),
        ("points_requests", "points requests"), ("points_span_s", "their span"),
        ("request_sum_s", "their summed time"), ("idle_in_span_s", "none in flight, in the span"),
        ("flushes", "flushes"), ("flush_prep_s", "before each flush's first request, in all"),
        ("after_last_s", "after the last points request"),
        ("new_connections", "HTTP connections"), ("client_cpu_s", "client CPU"),
    ]  # fmt: skip
    for key, label in keys:
        cells = []
        for name in ("new", "base", DIRECT):
            try:
                cells.append(f"{median_of(rounds, name, key):8.2f}")
            except statistics.StatisticsError:
                cells.append(f"{'-':>8}")
        print(f"  {label:<44} {' | '.join(cells)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "python": sys.version.split()[0],
                    "machine": platform.platform(),
                    "cpus": os.cpu_count(),
                    "base": args.base,
                    "load_processes": args.load,
                    "rounds": rounds,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
