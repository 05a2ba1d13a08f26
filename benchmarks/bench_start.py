"""The start of a job: ``init()`` against an S3 endpoint that is down, and on stores of many runs.

    python -m benchmarks.bench_start [--sizes 10,1000,10000] [--rounds 5] [--old-check-s 30]

Against a local S3 API server (moto's, through s3fs) behind a TCP proxy (tests/tcp_proxy.py),
with botocore's default retries:

* **down**: the time ``init()`` (default timeout, 1 s) takes to return when the endpoint
  refuses connections, resets them, or accepts them and never answers; median of ``--rounds``.
  Beside it, in the same run: ``init()`` on the healthy endpoint, ``AppRun`` over the same
  store (it asks the store nothing at its start), and the check ``init()`` made before this
  change (``run_ids()``, a listing of the store, then of each run), cut at ``--old-check-s``.
* **sizes**: stores of 10, 1,000 and 10,000 runs (each one claim object, as ``init()`` leaves
  it): the S3 requests of ``init()`` for a generated id, a given new id, and a resume of a run
  holding 100 points, counted at s3fs's one entry for requests (``S3FileSystem._call_s3``,
  one call per request, retries aside), and their time (median of ``--rounds``); beside,
  the requests and time of the old check (``run_ids()``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import boto3
import fsspec.config

import async_tracker
from async_tracker import AppRun
from async_tracker.backend.fsspec import CLAIM_FILE, encode_run_id
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime
from tests.s3_requests import counting
from tests.tcp_proxy import Mode, TcpProxy

DOWN_MODES: tuple[Mode, ...] = ("refuse", "reset", "silent")
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return proc, f"http://127.0.0.1:{port}"


def make_bucket(endpoint: str) -> Any:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket="bench")
            return client
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the server is starting


def use_endpoint(endpoint: str) -> None:
    """``s3://`` URLs reach ``endpoint`` (fsspec's config, as a user sets it)."""
    fsspec.config.conf["s3"] = {
        "key": "testing", "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


def old_check(url: str, cut_s: float) -> tuple[float, str]:
    """What init() did before: ``run_ids()`` of the store (then a lookup in it); its time,
    cut at ``cut_s``, and how it ended."""
    store = open_store(url)
    start = time.perf_counter()
    future = runtime().loop.submit(store.run_ids)
    try:
        future.result(cut_s)
        outcome = "answered"
    except concurrent.futures.TimeoutError:
        future.cancel()
        outcome = f"still waiting at {cut_s:g} s"
    except Exception as exc:
        outcome = f"raised {type(exc).__name__}"
    return time.perf_counter() - start, outcome


def start_and_close(start: Callable[[], AppRun]) -> float:
    """The time ``start()`` takes to return a run; the run is then closed, untimed."""
    begin = time.perf_counter()
    run = start()
    took = time.perf_counter() - begin
    run.close(timeout=0)
    return took


def down(proxy: TcpProxy, url: str, rounds: int, cut_s: float) -> None:
    print(f"\n== init() with the endpoint down: seconds to return (median of {rounds} rounds)")

    def new_run() -> AppRun:
        return async_tracker.init("bench", dir=url)

    def app_run() -> AppRun:
        return AppRun(f"bench/app-{uuid.uuid4().hex[:6]}", [open_store(url)])

    proxy.mode = "pass"
    cold = start_and_close(new_run)  # the process's first S3 client: botocore's models
    healthy = statistics.median(start_and_close(new_run) for _ in range(rounds))
    print(f"{'healthy endpoint: init()':28} {healthy:7.3f}   (the first, cold: {cold:.3f})")
    for mode in DOWN_MODES:
        proxy.mode = mode
        ours = statistics.median(start_and_close(new_run) for _ in range(rounds))
        base = statistics.median(start_and_close(app_run) for _ in range(rounds))
        was, outcome = old_check(url, cut_s)
        print(
            f"{mode + ': init()':28} {ours:7.3f}   AppRun {base:6.3f}   "
            f"old check {was:6.2f} ({outcome})"
        )
    proxy.mode = "pass"


def populate(client: Any, root: str, runs: int) -> None:
    """``runs`` claimed runs under ``bench/<root>`` (one object each), written in parallel."""
    def put(i: int) -> None:
        key = f"{root}/{encode_run_id(f'bench/run-{i}')}/{CLAIM_FILE}"
        client.put_object(Bucket="bench", Key=key, Body=b'{"run_id": "x"}')

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(runs)))


def new_id_run(url: str) -> AppRun:
    return async_tracker.init("bench", dir=url, id=f"bench/new-{uuid.uuid4().hex}")


def sizes(client: Any, sizes: list[int], rounds: int, cut_s: float) -> None:
    print("\n== init() on stores of many runs: S3 requests (by operation), median seconds")
    for size in sizes:
        root = f"size-{size}"
        url = f"s3://bench/{root}"
        start = time.perf_counter()
        populate(client, root, size)
        with async_tracker.init("bench", dir=url, id="bench/resumed") as run:
            for step in range(100):
                run.log_metric("loss", 1.0 / (step + 1), step)
        built = time.perf_counter() - start
        cases: dict[str, Callable[[], AppRun]] = {
            "generated id": functools.partial(async_tracker.init, "bench", dir=url),
            "given new id": functools.partial(new_id_run, url),
            "resume (100 points)": functools.partial(
                async_tracker.init, "bench", dir=url, id="bench/resumed", resume="must"
            ),
        }
        print(f"store of {size} runs (built in {built:.1f} s)")
        for name, case in cases.items():
            times = []
            for _ in range(rounds):
                with counting() as calls:
                    begin = time.perf_counter()
                    run = case()
                    times.append(time.perf_counter() - begin)
                    counted = dict(calls)  # the start's requests (the round's last)
                run.close(timeout=0)
            total = sum(counted.values())
            print(f"  {name:22} {total:6d} requests {counted}  {statistics.median(times):7.3f} s")
        with counting() as calls:
            was, outcome = old_check(url, cut_s)
        print(
            f"  {'old check (run_ids)':22} {sum(calls.values()):6d} requests "
            f"{dict(calls)}  {was:7.3f} s ({outcome})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old-check-s", type=float, default=30.0)
    parser.add_argument("--only", choices=["down", "sizes"])
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, load {load[0]:.1f}"
    )
    # The runs' records spool to a temporary directory, never the user's cache; the warnings
    # of every start against a dead endpoint are the point, not the output.
    os.environ["ASYNC_TRACKER_SPOOL_DIR"] = tempfile.mkdtemp(prefix="bench-start-spool-")
    logging.getLogger("async_tracker").setLevel(logging.ERROR)
    proc, endpoint = start_moto()
    try:
        client = make_bucket(endpoint)
        proxy = TcpProxy(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
        try:
            use_endpoint(proxy.url)
            if args.only in (None, "down"):
                down(proxy, "s3://bench/down", args.rounds, args.old_check_s)
            if args.only in (None, "sizes"):
                sizes(client, [int(s) for s in args.sizes.split(",")], args.rounds,
                      args.old_check_s)
        finally:
            proxy.close()
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
