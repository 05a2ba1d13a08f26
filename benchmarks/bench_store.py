"""The run list over stores of many runs: time and S3 requests of reading every run's summary.

    python -m benchmarks.bench_store [--sizes 100 1000 10000] [--s3-sizes 100 1000]
                                     [--rounds 3] [--no-s3] [--old-up-to 1000]

Each store holds N runs, written fast through the fsspec backend's own ``write_batch`` (one
batch per run as a pipeline cuts it: 3 params, 2 metrics of 50 points, its end record, so
each run has its metadata files, a metric segment, a status file and its writer's summary),
plus 3 runs written by real ``AppRun`` objects, whose summaries are checked against a full
read of those runs (so the fast-written store is a faithful one).

Figures per store, local disk and moto's S3 server (requests counted at s3fs's one entry for
requests, ``S3FileSystem._call_s3``):

* ``summaries``: ``run_summaries()`` (what ``list jobs`` reads), median of ``--rounds``;
* ``list jobs``: the command, ``python -m async_tracker list jobs --store ...`` in a fresh
  interpreter (imports and printing the 50 newest included), wall time, local disk only;
* ``filter+sort``: ``Store(url).runs(filter=FILTER, sort="-loss.min", limit=50)``, median;
* ``DataFrame``: ``Store(url).metrics(BIG_RUN)``, one run's 100,000 points (2 metrics, written
  by ``AppRun``) into a pandas DataFrame, median;
* ``old way``: what ``list jobs`` did before summaries (every run's metadata, metrics and
  status read through the tracker API), for stores up to ``--old-up-to`` runs;
* ``rebuild``: the first listing of the same store with its summaries removed (as written
  before summaries existed): each run rebuilt once, then ``again`` (read from the rebuilt
  summaries).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import anyio
import fsspec
import fsspec.config

from async_tracker import AppRun
from async_tracker.adapters import as_sync
from async_tracker.backend.fsspec import AsyncFsspecTracker
from async_tracker.init_run import open_store
from async_tracker.records import Batch, TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.api import Store
from async_tracker.store.runs import read_runs
from tests.s3_requests import counting

POINTS = 50
TOKEN = "1795000000000000000xbe0c4"
REAL_RUNS = 3
BIG_RUN = "bench/big"
BIG_STEPS = 50_000
FILTER = "lr>=0.001 and status==finished and not tag:baseline"


def batch_of(i: int) -> Batch:
    now = time.time()
    seq = 2 * POINTS + 1
    points = [
        TrackerMetric(name, 1.0 / (s + 1 + i % 7), s, now + s * 1e-3)
        for s in range(POINTS)
        for name in ("loss", "accuracy")
    ]
    ns = time.time_ns()
    return Batch(
        seq,
        metadata={"lr": 10.0 ** -(i % 5 + 1), "batch": 32 * (1 + i % 3), "model": "mlp"},
        metadata_ns={"lr": ns, "batch": ns, "model": ns},
        metrics=points,
        records=len(points) + 3,
        key=f"{ns:019d}-{TOKEN}-{seq:012d}",
        end="finished",
        end_time=now + 1.0,
    )


async def write_fast(backend: AsyncFsspecTracker, n: int, start: int = 0) -> None:
    limiter = anyio.CapacityLimiter(32)

    async def one(i: int) -> None:
        async with limiter:
            await backend.write_batch(f"bench/run-{i:05d}", batch_of(i))

    async with anyio.create_task_group() as tg:
        for i in range(start, n):
            tg.start_soon(one, i)


def build(url: str, n: int) -> None:
    """``n`` runs in the store at ``url``: REAL_RUNS by AppRun, the rest fast."""
    for i in range(REAL_RUNS):
        with AppRun(f"bench/real-{i}", [open_store(url)], heartbeat_s=0) as run:
            run.add_metadata(lr=0.1 * (i + 1), batch=32, model="mlp")
            for s in range(POINTS):
                run.log_metrics({"loss": 1.0 / (s + 1), "accuracy": s / POINTS}, step=s)
    with AppRun(BIG_RUN, [open_store(url)], heartbeat_s=0) as run:
        run.add_metadata(lr=0.01, batch=64, model="big")
        for s in range(BIG_STEPS):
            run.log_metrics({"loss": 1.0 / (s + 1), "accuracy": s / BIG_STEPS}, step=s)
    backend = open_store(url)
    assert isinstance(backend, AsyncFsspecTracker)
    runtime().loop.call(write_fast, backend, n - REAL_RUNS - 1)


def check(url: str, n: int) -> None:
    """The summaries of the AppRun-written runs match a full read of them."""
    tracker = as_sync(open_store(url))
    runs = {r.run_id: r for r in read_runs(tracker)}
    assert len(runs) == n, (len(runs), n)
    for i in range(REAL_RUNS):
        run_id = f"bench/real-{i}"
        full = tracker.metrics(run_id)  # type: ignore[attr-defined]
        summary = runs[run_id]
        assert summary.status == "finished", summary
        assert summary.params == dict(tracker.metadata(run_id))
        for name, points in full.items():
            m = summary.metrics[name]
            last = points[-1]
            assert (m.count, m.last, m.last_step) == (len(points), last.value, last.step)


def timed(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def summaries(url: str) -> None:
    backend = open_store(url)
    assert isinstance(backend, AsyncFsspecTracker)
    runtime().loop.call(backend.run_summaries)


def old_way(url: str) -> None:
    """What list jobs read before summaries: each run through the tracker API."""
    tracker = as_sync(open_store(url))
    for run_id in tracker.run_ids():
        tracker.metadata(run_id)
        tracker.metrics(run_id)  # type: ignore[attr-defined]
        runtime().loop.call(tracker.async_tracker.run_status, run_id)  # type: ignore[attr-defined]


def drop_summaries(url: str, n: int) -> None:
    backend = open_store(url)
    assert isinstance(backend, AsyncFsspecTracker)
    fs = backend.fs
    # The run index (its summaries and checkpoints), as a store written before it existed.
    fs.rm(fs.glob(f"{backend.root_dir}/.index-*"))
    fs.invalidate_cache()


def filtered(url: str) -> None:
    runs = Store(url).runs(filter=FILTER, sort="-loss.min", limit=50)
    assert len(runs) == 50, len(runs)


def dataframe(url: str) -> None:
    frame = Store(url).metrics(BIG_RUN)
    assert len(frame) == 2 * BIG_STEPS, len(frame)


def requests(url: str, fn: Callable[[str], object]) -> str:
    with counting() as calls:
        fn(url)
    return ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "-"


def cli_time(url: str, env: dict[str, str]) -> float:
    begin = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "async_tracker", "list", "jobs", "--store", url],
        check=True, stdout=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    return time.perf_counter() - begin


def bench(url: str, n: int, args: argparse.Namespace, local: bool) -> None:
    where = "local" if local else "s3"
    t0 = time.perf_counter()
    build(url, n)
    built = time.perf_counter() - t0
    check(url, n)
    line = f"{where:5} {n:>6} runs (written in {built:.1f} s): "
    line += f"summaries {timed(lambda: summaries(url), args.rounds):.3f} s"
    if not local:
        line += f" [{requests(url, summaries)}]"
    line += f"; filter+sort {timed(lambda: filtered(url), args.rounds):.3f} s"
    if not local:
        line += f" [{requests(url, filtered)}]"
    line += f"; DataFrame {timed(lambda: dataframe(url), args.rounds):.3f} s"
    if not local:
        line += f" [{requests(url, dataframe)}]"
    if local:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        cli = statistics.median(cli_time(url, env) for _ in range(args.rounds))
        line += f"; list jobs {cli:.3f} s"
    if n <= args.old_up_to:
        line += f"; old way {timed(lambda: old_way(url), 1):.3f} s"
        if not local:
            line += f" [{requests(url, old_way)}]"
    drop_summaries(url, n)
    begin = time.perf_counter()
    calls = requests(url, summaries)
    line += f"; rebuild {time.perf_counter() - begin:.3f} s"
    if not local:
        line += f" [{calls}]"
    line += f", again {timed(lambda: summaries(url), 1):.3f} s"
    print(line, flush=True)


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.1)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--s3-sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--old-up-to", type=int, default=1000)
    parser.add_argument("--no-s3", action="store_true")
    args = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.platform()}, load {os.getloadavg()[0]:.2f}"
    )
    for n in args.sizes:
        tmp = tempfile.mkdtemp(prefix="bench-store-")
        try:
            bench(os.path.join(tmp, "runs"), n, args, local=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.no_s3:
        return
    import boto3

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    proc, endpoint = start_moto()
    try:
        fsspec.config.conf["s3"] = {
            "key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }  # fmt: skip
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for n in args.s3_sizes:
            bucket = f"bench-{n}"
            client.create_bucket(Bucket=bucket)
            bench(f"s3://{bucket}/runs", n, args, local=False)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
