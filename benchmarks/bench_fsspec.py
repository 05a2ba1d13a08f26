"""1M metrics from ``log_metric`` to durable storage, against a naive same-process baseline.

    python -m benchmarks.bench_fsspec [--points 1000000] [--rounds 3] [--s3]

Ours: ``AppRun`` with the fsspec backend; the clock stops when ``close()`` has returned (every
point stored). Baseline: append ``(name, value, step, time)`` tuples to a list, then write
them once as JSON Lines at the end. Rounds alternate the two; the figure is the ratio of
medians. ``--s3`` repeats the workload on a local S3 API server (moto's, through s3fs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import fsspec

from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker

NAMES = ("loss", "acc", "lr", "grad_norm")


def ours(fs: fsspec.AbstractFileSystem, root: str, points: int) -> tuple[float, int]:
    tracker = FsspecTracker(fs, root)
    start = time.perf_counter()
    run = AppRun("bench://fsspec/1m", [tracker], batch_size=50_000)
    log = run.log_metric
    steps = points // len(NAMES)
    for step in range(steps):
        x = 1.0 / (step + 1)
        log("loss", x, step)
        log("acc", 1.0 - x, step)
        log("lr", 0.001, step)
        log("grad_norm", x * 3.0, step)
    report = run.close(600)
    elapsed = time.perf_counter() - start
    assert report.ok and report.delivered == steps * len(NAMES), report
    fs.invalidate_cache()
    return elapsed, len(fs.find(root))


def naive(directory: str, points: int) -> float:
    start = time.perf_counter()
    buf: list[tuple[str, float, int, float]] = []
    append = buf.append
    steps = points // len(NAMES)
    for step in range(steps):
        x = 1.0 / (step + 1)
        append(("loss", x, step, time.time()))
        append(("acc", 1.0 - x, step, time.time()))
        append(("lr", 0.001, step, time.time()))
        append(("grad_norm", x * 3.0, step, time.time()))
    with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(t) + "\n" for t in buf)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def alternate(rounds: int, a: Callable[[], float], b: Callable[[], float]) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(a())
        tb.append(b())
    return statistics.median(ta), statistics.median(tb)


def local(points: int, rounds: int) -> dict[str, float]:
    files: list[int] = []

    def run_ours() -> float:
        d = tempfile.mkdtemp(prefix="bench-ours-")
        try:
            elapsed, n = ours(fsspec.filesystem("file"), d, points)
            files.append(n)
            return elapsed
        finally:
            shutil.rmtree(d)

    def run_naive() -> float:
        d = tempfile.mkdtemp(prefix="bench-naive-")
        try:
            return naive(d, points)
        finally:
            shutil.rmtree(d)

    t_ours, t_naive = alternate(rounds, run_ours, run_naive)
    return {"ours_s": t_ours, "naive_s": t_naive, "ratio": t_ours / t_naive, "files": files[-1]}


def s3(points: int, rounds: int) -> dict[str, float]:
    import socket

    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client(
            "s3", endpoint_url=url, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="bench")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        fs = fsspec.filesystem(
            "s3", key="testing", secret="testing",
            client_kwargs={"endpoint_url": url, "region_name": "us-east-1"},
        )
        files: list[int] = []
        counter = iter(range(1_000_000))

        def run_ours() -> float:
            elapsed, n = ours(fs, f"bench/run-{next(counter)}", points)
            files.append(n)
            return elapsed

        def run_naive() -> float:
            start = time.perf_counter()
            buf = []
            steps = points // len(NAMES)
            for step in range(steps):
                x = 1.0 / (step + 1)
                for name, v in zip(NAMES, (x, 1.0 - x, 0.001, x * 3.0)):
                    buf.append((name, v, step, time.time()))
            data = "".join(json.dumps(t) + "\n" for t in buf).encode()
            fs.pipe_file(f"bench/naive-{next(counter)}.jsonl", data)
            return time.perf_counter() - start

        t_ours, t_naive = alternate(rounds, run_ours, run_naive)
        return {"ours_s": t_ours, "naive_s": t_naive, "ratio": t_ours / t_naive, "files": files[-1]}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--s3", action="store_true", help="also run on a local S3 API server")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"{platform.platform()}")
    results = {"local": local(args.points, args.rounds)}
    if args.s3:
        results["s3"] = s3(args.points, args.rounds)
    print(f"{'store':6} {'ours (s)':>9} {'naive (s)':>10} {'ratio':>6} {'files':>6}")
    for store, r in results.items():
        print(f"{store:6} {r['ours_s']:9.2f} {r['naive_s']:10.2f} {r['ratio']:6.2f} "
              f"{r['files']:6d}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
