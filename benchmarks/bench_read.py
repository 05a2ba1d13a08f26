"""The read side, beside its baselines, in one run on the same data.

    python -m benchmarks.bench_read                  # defaults below, about 10 minutes
    python -m benchmarks.bench_read --quick          # smoke run, under a minute, no MLflow
    python -m benchmarks.bench_read --only lists --runs 100000 --mlflow-runs 1000
    python -m benchmarks.bench_read --only big --points 1000000 --json read.json

Everything is read through the public read interface (``open_reader``, ``Store``, the
``async-tracker`` commands, the dashboard's HTTP API), so the figures follow whatever the
store writes (JSON Lines or Parquet segments, a run index or none). Stores are written by the
package's own write path: ``AppRun`` for the big metric, the fsspec backend's ``write_batch``
in a few processes for the many runs.

1. **First read of one big metric** (``--points``, 10M, one run written by ``AppRun`` with
   default options), cold: each figure in a fresh process, the page cache dropped before it
   (``sync; echo 3 > /proc/sys/vm/drop_caches``, as root; otherwise the output says "page
   cache warm"). (a) ``open_reader(store).scalars(run, ["loss"])``: the time until steps and
   values are in hand (x = step), and in another process until times and values are (x =
   time); (b) the dashboard's first chart: ``async-tracker ui --store S --port 0 --preload 0``
   started, its page and run list fetched as a browser would, then the clock on ``GET
   /api/series?run=R&metric=loss`` (and ``&x=time``, in another fresh server): the run has
   ended, so this chart of the whole run is drawn from its overview (written at compaction);
   then a zoom (``&xmin=&xmax=``), which reads every point, is timed too; (c) baselines,
   per point: TensorBoard's ``EventAccumulator`` (``size_guidance={"scalars": 0}``) loading
   ``--tb-points`` (1M: parsing 10M events takes minutes here) written by the package's
   TensorBoard backend, and ``MlflowClient.get_metric_history`` of ``--mlflow-points`` (50k,
   logged with ``log_batch``) on a local ``mlflow server`` (SQLite).
2. **Dashboard memory**: the ``async-tracker ui`` process's RSS (``VmRSS``) after the first
   chart, and after the zoom that holds every point, less before them, against the raw data
   (points x 16 bytes, step and value); target at most 2x once every point is held. Its peak
   (``VmHWM``) is printed too.
3. **``list jobs`` of many local runs** (``--runs``, 50,000 so that the whole benchmark
   takes about 10 minutes on a shared 2-core machine; the issue's 100,000 adds about 5; each
   run 3 params, 2 metrics of 50 points and its end, as one flush), written through
   ``write_batch`` by ``--gen-procs`` processes at once (the writing time is printed apart):
   ``async-tracker list jobs --limit 20`` as a process (start and imports included), and
   ``open_reader(store).run_summaries()`` in a process (the call alone), cold, then warm
   (median of ``--rounds``), then again with the same reader. Baselines, per run: ``mlflow
   runs list`` as a process for the command (mostly its start and imports at this size), and
   ``MlflowClient.search_runs`` (every run, one page) for ``run_summaries()``, over
   ``--mlflow-runs`` runs (300: the server creates about 10 to 20 runs a second here). Then
   as many runs written by our MLflow backend (``write_batch``: params, two metrics, the
   end): ``run_summaries()`` through the backend's reader (``search_runs`` and the writers'
   summary tags) and through the generic reader (every point of every run), in a fresh
   process each with the HTTP requests counted, and ``async-tracker --tracker mlflow list
   jobs --limit 20`` as a process, beside ``search_runs`` and ``mlflow runs list``.
4. **Listing S3**: ``--s3-runs`` (10,000) runs on moto's S3 server, on 127.0.0.1: the
   requests (counted at s3fs's ``_call_s3``, one call per request) and wall time of
   ``open_reader("s3://bucket/runs").run_summaries()``, first and again with the same
   reader; targets at most 20 requests and 2 s. The runs are written to local disk by the
   backend and their files loaded into the S3 server's memory as they are (an upload
   through HTTP would take longer than the rest of the benchmark).
5. **DuckDB in place**: the last value of ``loss`` in each of ``--duckdb-runs`` runs (1,000
   runs of ``--duckdb-steps`` steps), by one DuckDB query over the store's metric files
   (``read_parquet('<root>/*/metrics/*.parquet')``, or ``read_json`` over JSON Lines
   segments: the output says which it found), in a fresh process, cold, then warm; target at
   most 0.5 s. Baseline: the same answer through ``Store(root).runs()`` and
   ``Store(root).metrics(ids, names=["loss"])`` with pandas. The two answers are compared.

Ratios are ours / baseline (per point or per run where the sizes differ): below 1, ours is
faster. These machines are shared and noisy: the ratios, measured minutes apart on the same
data, matter more than the absolute times. ``--quick`` skips MLflow (its server alone takes
20 s or more to start here) unless ``--mlflow-points`` or ``--mlflow-runs`` is given; the
commands get ``--timeout 600``, so that a slow read gives a figure rather than an error.
Each part that fails says why and the others still report.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RUN = "big/1"
METRIC = "loss"
RAW_BYTES_PER_POINT = 16  # an int64 step and a float64 value
MEMORY_TARGET = 2.0
FIRST_CHART_TARGET_S = 0.3  # DESIGN.md: "a cold first chart in 0.3 s"
S3_REQUESTS_TARGET = 20
S3_TIME_TARGET_S = 2.0
DUCKDB_TARGET_S = 0.5
# The reads' deadline given to the commands: a slow machine gives a slow figure, not a 503.
READ_TIMEOUT_S = 600
CHILD_TIMEOUT_S = 1800
CLOSE_TIMEOUT_S = 1200.0
ROOT_DIR = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class Row:
    figure: str
    ours: str
    baseline: str = "-"
    ratio: str = "-"
    target: str = "-"
    met: str = "-"


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def note(self, text: str) -> None:
        print(f"  {text}", flush=True)
        self.notes.append(text)


def seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def per_point(s: float, n: int) -> str:
    return f"{s / n * 1e9:,.0f} ns/pt" if n else "-"


def ratio(ours: float, base: float) -> str:
    return f"{ours / base:.3g}x" if base > 0 else "-"


def met(ok: bool) -> str:
    return "yes" if ok else "NO"


# ---------------------------------------------------------------------------------------------
# Processes: the page cache, children, servers


class Cold:
    """Drops the page cache before a cold measurement, where this process may (root, and a
    kernel that lets it); ``label`` says which it was."""

    def __init__(self) -> None:
        self.works = os.name == "posix" and os.geteuid() == 0 and self._drop()
        self.label = "cold" if self.works else "cold, page cache warm"

    @staticmethod
    def _drop() -> bool:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return True
        except OSError:
            return False

    def __call__(self) -> None:
        if self.works:
            self._drop()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT_DIR), env.get("PYTHONPATH")]))
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    env.update(extra or {})
    return env


def in_child(name: str, **kwargs: Any) -> dict[str, Any]:
    """``CHILDREN[name](**kwargs)`` in a fresh interpreter; its JSON result."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_read", "--child", name, json.dumps(kwargs)],
        capture_output=True, text=True, env=child_env(), cwd=ROOT_DIR, timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"child {name} exited with {proc.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def in_children(name: str, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Several children at once (writers of one store), each with its own kwargs."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_read", "--child", name, json.dumps(kw)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            cwd=ROOT_DIR,
        )
        for kw in chunks
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT_S)
        if proc.returncode != 0:
            tail = "\n".join(stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"child {name} exited with {proc.returncode}:\n{tail}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Local servers only: no proxy from the environment in between.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float = READ_TIMEOUT_S) -> bytes:
    with _OPENER.open(url, timeout=timeout) as response:
        data: bytes = response.read()
        return data


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    return out


class MlflowServer:
    """``mlflow server`` with a SQLite store under ``root``, started at once and waited for
    only when first used (it takes 10 to 30 s to start here: other parts run meanwhile)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self.started = time.perf_counter()
        self.ready_s: float | None = None
        self.waited_s = 0.0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server",
                 "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                 "--default-artifact-root", str(root / "artifacts"),
                 "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=child_env({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}),
            )  # fmt: skip

    def wait(self, timeout_s: float = 300) -> str:
        deadline = time.monotonic() + timeout_s
        t = time.perf_counter()
        while self.ready_s is None:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError("mlflow server exited:\n" + "\n".join(tail))
            try:
                get(f"{self.url}/health", timeout=2)
                self.ready_s = time.perf_counter() - self.started
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server not ready in {timeout_s} s") from None
                time.sleep(0.2)  # polling the server's readiness
        self.waited_s += time.perf_counter() - t
        return self.url

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


# ---------------------------------------------------------------------------------------------
# Writing the stores (children)


def _token() -> str:
    # A pipeline's writer token, as a run's pipeline makes it: the backend knows its batches
    # by it (a run's end compacts that writer's segments, as a real run's close does).
    from async_tracker.spool.store import new_token

    return new_token()


def child_write_runs(
    root: str, start: int, stop: int, steps: int, segments: int, concurrency: int = 32
) -> dict[str, Any]:
    """Runs ``start`` to ``stop`` through the fsspec backend's ``write_batch``, as a pipeline
    cuts them: ``segments`` flushes of ``steps // segments`` steps of ``loss`` and
    ``accuracy``, the params in the first, the end record in the last; runs concurrently on
    the tracker loop, each run's flushes in order."""
    import anyio

    from async_tracker.records import Batch, TrackerMetric
    from async_tracker.runtime.process import runtime
    from async_tracker.store.open import open_store

    token = _token()
    backend = open_store(root)
    per = max(1, steps // segments)

    def batches(i: int) -> list[Batch]:
        def value(name: str, s: int) -> float:
            return 1.0 / (s + 1 + i % 7) if name == "loss" else s / steps

        out = []
        seq = 0
        now = time.time()
        for k, first_step in enumerate(range(0, steps, per)):
            points = [
                TrackerMetric(name, value(name, s), s, now + s * 1e-3)
                for s in range(first_step, min(steps, first_step + per))
                for name in ("loss", "accuracy")
            ]
            first, seq = seq + 1, seq + len(points) + (3 if k == 0 else 0)
            ns = time.time_ns()
            last = first_step + per >= steps
            batch = Batch(
                seq, metrics=points, records=seq - first + 1, first=first,
                key=f"{ns:019d}-{token}-{seq:012d}",
            )  # fmt: skip
            if k == 0:
                batch.metadata = {"lr": 10.0 ** -(i % 5 + 1), "batch": 32 * (1 + i % 3),
                                  "model": "mlp"}  # fmt: skip
                batch.metadata_ns = dict.fromkeys(batch.metadata, ns)
            if last:
                batch.end, batch.end_time = "finished", now + steps * 1e-3
            out.append(batch)
        return out

    async def write_all() -> None:
        limiter = anyio.CapacityLimiter(concurrency)

        async def one(i: int) -> None:
            async with limiter:
                for batch in batches(i):
                    await backend.write_batch(f"bench/run-{i:06d}", batch)

        async with anyio.create_task_group() as tg:
            for i in range(start, stop):
                tg.start_soon(one, i)
        await backend.aclose()

    t = time.perf_counter()
    runtime().loop.call(write_all)
    return {"runs": stop - start, "s": time.perf_counter() - t}


def log_points(log: Callable[[str, float, int], None], points: int) -> None:
    for s in range(points):
        log(METRIC, 1.0 / (s + 1) + (s % 97) * 1e-4, s)


def child_write_big(root: str, points: int, spool: str) -> dict[str, Any]:
    """One run of one metric of ``points`` points, logged by ``AppRun`` (default options,
    one ``log_metric`` per step) to the fsspec store at ``root``."""
    from async_tracker import AppRun
    from async_tracker.store.open import open_store

    t = time.perf_counter()
    run = AppRun(RUN, [open_store(root)], heartbeat_s=0, spool_dir=spool)
    run.add_metadata(lr=0.01, model="big")
    log_points(run.log_metric, points)
    # A loop that only logs outruns delivery: the rest waits in the spool, delivered by
    # close() (given the time it needs, unlike a job's default close deadline).
    report = run.close(timeout=CLOSE_TIMEOUT_S)
    assert report.ok, report
    return {"s": time.perf_counter() - t}


def child_write_tensorboard(root: str, points: int, spool: str) -> dict[str, Any]:
    """The same metric, ``points`` points, through the package's TensorBoard backend."""
    from async_tracker import AppRun
    from async_tracker.backend.tensorboard import AsyncTensorBoardTracker

    t = time.perf_counter()
    run = AppRun(RUN, [AsyncTensorBoardTracker(root)], heartbeat_s=0, spool_dir=spool)
    log_points(run.log_metric, points)
    report = run.close(timeout=CLOSE_TIMEOUT_S)
    assert report.ok, report
    files = [str(p) for p in Path(root).rglob("events.out.tfevents.*")]
    return {"s": time.perf_counter() - t, "logdir": str(Path(files[0]).parent)}


def child_write_mlflow(url: str, points: int, runs: int) -> dict[str, Any]:
    """``points`` points of one metric in one run (``log_batch``, 1000 a request), and
    ``runs`` runs (each 3 params and 2 metrics' last values, ended) in another experiment."""
    from concurrent.futures import ThreadPoolExecutor

    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(url)
    out: dict[str, Any] = {}
    now = int(time.time() * 1000)
    if points:
        exp = client.create_experiment(f"big-{time.time_ns()}")
        run_id = client.create_run(exp, run_name=RUN).info.run_id
        batch = [Metric(METRIC, 1.0 / (s + 1) + (s % 97) * 1e-4, now + s, s) for s in range(points)]
        t = time.perf_counter()
        for i in range(0, points, 1000):
            client.log_batch(run_id, metrics=batch[i : i + 1000])
        out.update(points_s=time.perf_counter() - t, run_id=run_id)
    if runs:
        exp = client.create_experiment(f"many-{time.time_ns()}")

        def one(i: int) -> None:
            rid = client.create_run(exp, run_name=f"bench/run-{i:06d}").info.run_id
            client.log_batch(
                rid,
                metrics=[Metric("loss", 1.0 / (50 + i % 7), now, 49),
                         Metric("accuracy", 0.98, now, 49)],
                params=[Param("lr", str(10.0 ** -(i % 5 + 1))),
                        Param("batch", str(32 * (1 + i % 3))), Param("model", "mlp")],
            )  # fmt: skip
            client.set_terminated(rid)

        t = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(runs)))
        out.update(runs_s=time.perf_counter() - t, experiment=exp)
    return out


def child_write_mlflow_ours(url: str, runs: int, concurrency: int = 8) -> dict[str, Any]:
    """``runs`` runs through the MLflow backend's ``write_batch``, as a pipeline cuts them:
    one flush of 3 params and the last points of ``loss`` and ``accuracy`` (as the baseline's
    runs hold), then the end record; each run with its summary tag, as our writers keep it."""
    import anyio

    from async_tracker.backend.mlflow import AsyncMLflowTracker
    from async_tracker.records import Batch, TrackerMetric
    from async_tracker.runtime.process import runtime

    experiment = f"ours-{time.time_ns()}"
    backend = AsyncMLflowTracker(experiment, url)
    token = _token()
    now = time.time()

    def batches(i: int) -> list[Batch]:
        ns = time.time_ns()
        points = [TrackerMetric("loss", 1.0 / (50 + i % 7), 49, now),
                  TrackerMetric("accuracy", 0.98, 49, now)]  # fmt: skip
        data = Batch(4, metrics=points, records=5, key=f"{ns:019d}-{token}-{4:012d}")
        data.metadata = {"lr": 10.0 ** -(i % 5 + 1), "batch": 32 * (1 + i % 3), "model": "mlp"}
        data.metadata_ns = dict.fromkeys(data.metadata, ns)
        end = Batch(5, key=f"{ns + 1:019d}-{token}-{5:012d}", end="finished", end_time=now)
        return [data, end]

    async def write_all() -> None:
        limiter = anyio.CapacityLimiter(concurrency)

        async def one(i: int) -> None:
            async with limiter:
                for batch in batches(i):
                    await backend.write_batch(f"bench/run-{i:06d}", batch)

        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(one, i)
        await backend.aclose()

    t = time.perf_counter()
    runtime().loop.call(write_all)
    return {"runs_s": time.perf_counter() - t, "experiment": experiment}


def _counting_mlflow_requests() -> dict[str, int]:
    """The MLflow client's HTTP requests from now on, by endpoint (every REST call goes
    through ``mlflow.utils.rest_utils.http_request``)."""
    import collections

    from mlflow.utils import rest_utils

    calls: collections.Counter[str] = collections.Counter()
    real = rest_utils.http_request

    def counted(host_creds: Any, endpoint: str, *args: Any, **kwargs: Any) -> Any:
        calls[endpoint.rsplit("/", 1)[-1]] += 1
        return real(host_creds, endpoint, *args, **kwargs)

    rest_utils.http_request = counted
    return calls


def child_mlflow_summaries(url: str, experiment: str, rounds: int, generic: bool) -> dict[str, Any]:
    """``run_summaries()`` of an MLflow experiment through our reader (``generic``: the
    generic reader, every point of every run read), first and again, with the requests."""
    t = time.perf_counter()
    from async_tracker.backend.mlflow import AsyncMLflowTracker
    from async_tracker.store.open import open_reader
    from async_tracker.store.reader import GenericReader
    from async_tracker.store.sync_reader import Reader

    imported = time.perf_counter() - t
    backend = AsyncMLflowTracker(experiment, url)
    if generic:
        reader = Reader(GenericReader(backend), READ_TIMEOUT_S)
    else:
        reader = open_reader(backend, timeout=READ_TIMEOUT_S)
    calls = _counting_mlflow_requests()
    t = time.perf_counter()
    runs = reader.run_summaries()
    first = time.perf_counter() - t
    requests = dict(calls)
    again = []
    for _ in range(rounds):
        t = time.perf_counter()
        reader.run_summaries()
        again.append(time.perf_counter() - t)
    # The request our reader makes, alone: the server's and the client's share of the time
    # (our runs carry more tags than plain ones: the summary, the run id and key ...).
    exp = backend.client.get_experiment_by_name(experiment).experiment_id
    raw = []
    for _ in range(max(1, rounds)):
        t = time.perf_counter()
        backend.client.search_runs([exp], max_results=1000)
        raw.append(time.perf_counter() - t)
    return {"import_s": imported, "first_s": first, "runs": len(runs), "requests": requests,
            "again_s": statistics.median(again) if again else None,
            "search_runs_s": statistics.median(raw)}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Reading (children: each a fresh process, the import timed apart from the read)


def child_scalars(root: str, axis: str) -> dict[str, Any]:
    t = time.perf_counter()
    from async_tracker.store.open import open_reader

    imported = time.perf_counter() - t
    reader = open_reader(root, timeout=READ_TIMEOUT_S)
    t = time.perf_counter()
    curve = reader.scalars(RUN, [METRIC]).curves[METRIC]
    x = curve.steps if axis == "step" else curve.times
    # Touch both ends of both columns: a lazy column is paid for here.
    _ = (x[0], x[-1], curve.values[0], curve.values[-1])
    read = time.perf_counter() - t
    t = time.perf_counter()
    other = curve.times if axis == "step" else curve.steps
    _ = (other[0], other[-1])
    rest = time.perf_counter() - t
    return {"import_s": imported, "read_s": read, "other_s": rest, "points": len(curve)}


def child_event_accumulator(logdir: str) -> dict[str, Any]:
    t = time.perf_counter()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    imported = time.perf_counter() - t
    t = time.perf_counter()
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars(METRIC)
    read = time.perf_counter() - t
    return {"import_s": imported, "read_s": read, "points": len(events)}


def child_metric_history(url: str, run_id: str) -> dict[str, Any]:
    t = time.perf_counter()
    from mlflow import MlflowClient

    imported = time.perf_counter() - t
    t = time.perf_counter()
    history = MlflowClient(url).get_metric_history(run_id, METRIC)
    read = time.perf_counter() - t
    return {"import_s": imported, "read_s": read, "points": len(history)}


def child_summaries(root: str, rounds: int) -> dict[str, Any]:
    t = time.perf_counter()
    from async_tracker.store.open import open_reader

    imported = time.perf_counter() - t
    reader = open_reader(root, timeout=READ_TIMEOUT_S)
    t = time.perf_counter()
    runs = reader.run_summaries()
    first = time.perf_counter() - t
    again = []
    for _ in range(rounds):
        t = time.perf_counter()
        reader.run_summaries()
        again.append(time.perf_counter() - t)
    return {"import_s": imported, "first_s": first, "runs": len(runs),
            "again_s": statistics.median(again) if again else None}  # fmt: skip


def child_search_runs(url: str, experiment: str, rounds: int) -> dict[str, Any]:
    t = time.perf_counter()
    from mlflow import MlflowClient

    imported = time.perf_counter() - t
    client = MlflowClient(url)
    out: dict[str, Any] = {"import_s": imported}
    for name, kwargs in (
        ("all", {"max_results": 50_000}),
        ("newest20", {"max_results": 20, "order_by": ["attributes.start_time DESC"]}),
    ):
        times = []
        for _ in range(rounds + 1):
            t = time.perf_counter()
            runs = client.search_runs([experiment], **kwargs)
            times.append(time.perf_counter() - t)
        out[name] = {"first_s": times[0], "again_s": statistics.median(times[1:]),
                     "runs": len(runs)}  # fmt: skip
    return out


def child_s3_summaries(endpoint: str, url: str) -> dict[str, Any]:
    """``run_summaries()`` of an S3 store, twice with one reader: S3 requests counted at
    s3fs's one entry for them (``S3FileSystem._call_s3``), as tests/s3_requests.py does."""
    import collections

    import fsspec.config
    import s3fs

    fsspec.config.conf["s3"] = {
        "key": "testing", "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }  # fmt: skip
    calls: collections.Counter[str] = collections.Counter()
    real = s3fs.S3FileSystem._call_s3

    async def counted(fs: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        calls[method if isinstance(method, str) else getattr(method, "__name__", "?")] += 1
        return await real(fs, method, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = counted
    from async_tracker.store.open import open_reader

    first = open_reader(url, timeout=READ_TIMEOUT_S)
    # "first": the store's first listing, which builds its run index (once per store);
    # "new": a listing by a new reader (another process) of a store in use; "again": the
    # same reader listing again (the dashboard's refresh).
    out: dict[str, Any] = {}
    for name, reader in (("first", first), ("new", open_reader(url, timeout=READ_TIMEOUT_S)),
                         ("again", None)):  # fmt: skip
        reader = reader or out["_last"]
        calls.clear()
        t = time.perf_counter()
        runs = reader.run_summaries()
        out[name] = {"s": time.perf_counter() - t, "requests": dict(calls), "runs": len(runs)}
        out["_last"] = reader
    del out["_last"]
    return out


def _metric_files(root: str) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for run_dir in os.scandir(root):
        metrics = os.path.join(run_dir.path, "metrics")
        if run_dir.is_dir() and os.path.isdir(metrics):
            for entry in os.scandir(metrics):
                suffix = os.path.splitext(entry.name)[1] or entry.name
                kinds[suffix] = kinds.get(suffix, 0) + 1
    return kinds


def child_duckdb_last(root: str, rounds: int) -> dict[str, Any]:
    """The last ``loss`` of every run, by one DuckDB query over the metric files in place."""
    import base64

    kinds = _metric_files(root)
    t = time.perf_counter()
    import duckdb

    con = duckdb.connect()
    imported = time.perf_counter() - t
    if kinds.get(".parquet"):
        fmt = "parquet"
        sql = (
            "SELECT run, max_by(value, step) AS last "
            f"FROM read_parquet('{root}/*/metrics/*.parquet') "
            f"WHERE name = '{METRIC}' GROUP BY run"
        )
    elif kinds.get(".jsonl"):
        # JSON Lines segments: one line per metric and flush, its points as arrays; the run
        # is the directory (its id base32-encoded), decoded below.
        fmt = "json"
        sql = (
            "SELECT dir AS run, max_by(v, s) AS last FROM ("
            "  SELECT split_part(filename, '/', -3) AS dir, unnest(step) AS s,"
            "         unnest(value) AS v"
            f"  FROM read_json('{root}/*/metrics/*.jsonl', format='newline_delimited',"
            "       filename=true, columns={'name': 'VARCHAR', 'step': 'BIGINT[]',"
            "       'value': 'DOUBLE[]'})"
            f"  WHERE name = '{METRIC}') GROUP BY dir"
        )
    else:
        return {"format": None, "kinds": kinds}
    times = []
    for _ in range(rounds + 1):
        t = time.perf_counter()
        rows = con.execute(sql).fetchall()
        if fmt == "json":
            rows = [(base64.b32decode(d).decode("utf-8"), v) for d, v in rows]
        times.append(time.perf_counter() - t)
    return {"format": fmt, "kinds": kinds, "import_s": imported, "first_s": times[0],
            "again_s": statistics.median(times[1:]), "last": dict(rows)}  # fmt: skip


def child_pandas_last(root: str, rounds: int) -> dict[str, Any]:
    """The same answer through the read API: the runs, their ``loss`` as a DataFrame, the
    last point of each (points come in step order)."""
    t = time.perf_counter()
    from async_tracker import Store

    imported = time.perf_counter() - t
    times = []
    last: dict[str, float] = {}
    for _ in range(rounds + 1):
        t = time.perf_counter()
        store = Store(root, timeout=READ_TIMEOUT_S)
        ids = [r.run_id for r in store.runs()]
        frame = store.metrics(ids, names=[METRIC])
        last = frame.groupby("run", sort=False)["value"].last().to_dict()
        times.append(time.perf_counter() - t)
    return {"import_s": imported, "first_s": times[0], "again_s": statistics.median(times[1:]),
            "last": last}  # fmt: skip


def child_moto(source: str, bucket: str, prefix: str) -> None:
    """An S3 server (moto's, in this process's threads) whose bucket holds the files under
    ``source`` as they are, put straight into its memory; prints its endpoint, then serves
    until stdin closes."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    t = time.perf_counter()
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(bucket, "us-east-1")
    count = 0
    for folder, _, files in os.walk(source):
        for name in files:
            path = os.path.join(folder, name)
            key = prefix + "/" + os.path.relpath(path, source).replace(os.sep, "/")
            backend.put_object(bucket, key, Path(path).read_bytes())
            count += 1
    loaded = time.perf_counter() - t
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(json.dumps({"endpoint": f"http://{host}:{port}", "objects": count, "s": loaded}),
          flush=True)  # fmt: skip
    sys.stdin.read()
    server.stop()


CHILDREN: dict[str, Callable[..., Any]] = {
    "write_runs": child_write_runs,
    "write_big": child_write_big,
    "write_tensorboard": child_write_tensorboard,
    "write_mlflow": child_write_mlflow,
    "write_mlflow_ours": child_write_mlflow_ours,
    "mlflow_summaries": child_mlflow_summaries,
    "scalars": child_scalars,
    "event_accumulator": child_event_accumulator,
    "metric_history": child_metric_history,
    "summaries": child_summaries,
    "search_runs": child_search_runs,
    "s3_summaries": child_s3_summaries,
    "duckdb_last": child_duckdb_last,
    "pandas_last": child_pandas_last,
    "moto": child_moto,
}


# ---------------------------------------------------------------------------------------------
# The parts


def write_runs(root: Path, runs: int, steps: int, segments: int, procs: int) -> float:
    """``runs`` runs written by ``procs`` processes at once; the wall time."""
    procs = max(1, min(procs, runs // 100 or 1))
    bounds = [runs * k // procs for k in range(procs + 1)]
    t = time.perf_counter()
    in_children("write_runs", [
        {"root": str(root), "start": a, "stop": b, "steps": steps, "segments": segments}
        for a, b in itertools.pairwise(bounds)
    ])  # fmt: skip
    return time.perf_counter() - t


def dashboard_first_chart(root: Path, axis: str, tmp: Path) -> dict[str, Any]:
    """``async-tracker ui`` started on the store (no preload), the page and the run list
    fetched as a browser does, then the first ``/api/series`` of the big run timed, with the
    server's RSS before and after; then a request on the other axis."""
    log = open(tmp / f"ui-{axis}.log", "wb")  # noqa: SIM115 (closed in finally)
    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "async_tracker", "ui", "--store", str(root), "--port", "0",
         "--preload", "0", "--timeout", str(READ_TIMEOUT_S)],
        stdout=subprocess.PIPE, stderr=log, text=True, env=child_env(), cwd=ROOT_DIR,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        printed = time.perf_counter() - started
        get(url)  # the page: served once uvicorn runs
        up = time.perf_counter() - started
        t = time.perf_counter()
        listing = json.loads(get(url + "api/runs"))
        runs_s = time.perf_counter() - t
        assert RUN in listing["ids"], listing["ids"][:5]
        before = proc_status(server.pid)
        query = {"run": RUN, "metric": METRIC}
        if axis == "time":
            query["x"] = "time"
        t = time.perf_counter()
        body = get(url + "api/series?" + urllib.parse.urlencode(query))
        first = time.perf_counter() - t
        after = proc_status(server.pid)
        series = json.loads(body)["series"][0]
        query["x"] = "step" if axis == "time" else "time"
        t = time.perf_counter()
        get(url + "api/series?" + urllib.parse.urlencode(query))
        other = time.perf_counter() - t
        after_other = proc_status(server.pid)
        # A zoom (any x range given): every point read and held, downsampled to the range.
        query.update({"x": axis, "xmin": "0", "xmax": str(2**62)})
        t = time.perf_counter()
        zoomed = json.loads(get(url + "api/series?" + urllib.parse.urlencode(query)))
        zoom = time.perf_counter() - t
        assert zoomed["series"][0]["count"] == series["count"], zoomed["series"][0]["count"]
        after_zoom = proc_status(server.pid)
        return {
            "zoom_s": zoom, "rss_after_zoom": after_zoom["VmRSS"],
            "hwm_after_zoom": after_zoom["VmHWM"],
            "url_printed_s": printed, "up_s": up, "runs_s": runs_s, "first_s": first,
            "other_axis_s": other, "count": series["count"], "shown": len(series["x"]),
            "rss_before": before["VmRSS"], "rss_after": after["VmRSS"],
            "hwm_after": after["VmHWM"], "rss_after_other": after_other["VmRSS"],
            "hwm_after_other": after_other["VmHWM"],
        }  # fmt: skip
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def part_big(args: argparse.Namespace, tmp: Path, cold: Cold, out: Results,
             mlflow: Callable[[], str] | None) -> None:  # fmt: skip
    n = args.points
    print(f"\n== 1, 2: first read of one metric of {n:,} points ({cold.label}) ==", flush=True)
    root = tmp / "big" / "runs"
    w = in_child("write_big", root=str(root), points=n, spool=str(tmp / "spool-big"))
    files = _metric_files(str(root))
    out.note(f"written by AppRun in {w['s']:.1f} s: metric files {files}")
    reads = {}
    for axis in ("step", "time"):
        cold()
        reads[axis] = r = in_child("scalars", root=str(root), axis=axis)
        assert r["points"] == n, r
        other = "times" if axis == "step" else "steps"
        out.note(
            f"reader, x={axis}: {r['read_s']:.3f} s ({per_point(r['read_s'], n)}), "
            f"then {other} {r['other_s'] * 1e3:.1f} ms; import {r['import_s']:.2f} s"
        )
    charts = {}
    for axis in ("step", "time"):
        cold()
        charts[axis] = c = dashboard_first_chart(root, axis, tmp)
        assert c["count"] == n, c
        out.note(
            f"dashboard, first chart x={axis}: {c['first_s']:.3f} s ({c['shown']} points "
            f"sent); server: URL at {c['url_printed_s']:.2f} s, up at {c['up_s']:.2f} s, "
            f"/api/runs {c['runs_s'] * 1e3:.0f} ms; then the other axis "
            f"{c['other_axis_s'] * 1e3:.0f} ms, then a zoom (every point read) "
            f"{c['zoom_s']:.3f} s"
        )
    out.figures["big"] = {"points": n, "write": w, "files": files, "reader": reads,
                          "dashboard": charts}  # fmt: skip

    # Baselines, per point.
    base: dict[str, tuple[float, int]] = {}
    if args.tb_points:
        logdir = tmp / "tensorboard"
        tw = in_child("write_tensorboard", root=str(logdir), points=args.tb_points,
                      spool=str(tmp / "spool-tb"))  # fmt: skip
        cold()
        tb = in_child("event_accumulator", logdir=tw["logdir"])
        assert tb["points"] == args.tb_points, tb
        base["TensorBoard"] = (tb["read_s"], tb["points"])
        out.note(
            f"TensorBoard EventAccumulator, {tb['points']:,} points (written by the "
            f"TensorBoard backend in {tw['s']:.1f} s): {tb['read_s']:.2f} s "
            f"({per_point(tb['read_s'], tb['points'])}); import {tb['import_s']:.2f} s"
        )
        out.figures["tensorboard"] = {"write": tw, "read": tb}
    if mlflow is not None and args.mlflow_points:
        url = mlflow()
        mw = in_child("write_mlflow", url=url, points=args.mlflow_points, runs=0)
        cold()
        mh = in_child("metric_history", url=url, run_id=mw["run_id"])
        assert mh["points"] == args.mlflow_points, mh
        base["MLflow"] = (mh["read_s"], mh["points"])
        out.note(
            f"MLflow get_metric_history, {mh['points']:,} points (log_batch in "
            f"{mw['points_s']:.1f} s): {mh['read_s']:.2f} s "
            f"({per_point(mh['read_s'], mh['points'])}); import {mh['import_s']:.2f} s"
        )
        out.figures["mlflow_history"] = {"write": mw, "read": mh}

    def baseline_cols(ours_s: float) -> tuple[str, str]:
        if not base:
            return "-", "-"
        text = "; ".join(f"{k} {per_point(s, m)} ({m / 1e6:g}M)" for k, (s, m) in base.items())
        ratios = "; ".join(f"{k} {ratio(ours_s / n, s / m)}" for k, (s, m) in base.items())
        return text, ratios

    size = f"{n / 1e6:g}M"
    for axis in ("step", "time"):
        r = reads[axis]
        b, q = baseline_cols(r["read_s"])
        what = "steps+values" if axis == "step" else "times+values"
        out.add(
            Row(
                f"1a reader.scalars, {size} pts, {what}, {cold.label}",
                f"{seconds(r['read_s'])}, {per_point(r['read_s'], n)}",
                b,
                q,
            )
        )
    for axis in ("step", "time"):
        c = charts[axis]
        b, q = baseline_cols(c["first_s"])
        out.add(
            Row(
                f"1b dashboard first chart, x={axis}, {size} pts, {cold.label}",
                f"{seconds(c['first_s'])}, {per_point(c['first_s'], n)}",
                b,
                q,
                f"<= {FIRST_CHART_TARGET_S} s",
                met(c["first_s"] <= FIRST_CHART_TARGET_S),
            )
        )
    raw = n * RAW_BYTES_PER_POINT
    for axis in ("step", "time"):
        c = charts[axis]
        # What the server holds: after the first chart (an ended run's overview), and after
        # a zoom, which reads and keeps every point: the target is on the second.
        for when, key in (("first chart", "after"), ("a zoom, every point held", "after_zoom")):
            grown = c[f"rss_{key}"] - c["rss_before"]
            peak = c[f"hwm_{key}"] - c["rss_before"]
            out.add(Row(
                f"2 ui RSS growth after {when} (x={axis})",
                f"+{grown / 2**20:.0f} MiB (peak +{peak / 2**20:.0f} MiB)",
                f"raw {raw / 2**20:.0f} MiB ({n / 1e6:g}M x 16 B)",
                f"{grown / raw:.2f}x (peak {peak / raw:.2f}x)",
                f"<= {MEMORY_TARGET:g}x", met(grown <= MEMORY_TARGET * raw),
            ))  # fmt: skip
        out.note(
            f"ui RSS x={axis}: {c['rss_before'] / 2**20:.0f} MiB before, "
            f"{c['rss_after'] / 2**20:.0f} after, {c['rss_after_other'] / 2**20:.0f} "
            f"after the other axis too, {c['rss_after_zoom'] / 2**20:.0f} after a zoom "
            f"(peak {c['hwm_after_zoom'] / 2**20:.0f})"
        )


def part_lists(args: argparse.Namespace, tmp: Path, cold: Cold, out: Results,
               mlflow: Callable[[], str] | None) -> None:  # fmt: skip
    n = args.runs
    print(f"\n== 3: list jobs of {n:,} local runs ({cold.label}) ==", flush=True)
    root = tmp / "many" / "runs"
    gen = write_runs(root, n, 50, 1, args.gen_procs)
    out.note(
        f"written in {gen:.1f} s by {args.gen_procs} processes through write_batch "
        f"({n / gen:,.0f} runs/s)"
    )

    def list_jobs() -> float:
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "async_tracker", "list", "jobs", "--limit", "20",
             "--store", str(root), "--timeout", str(READ_TIMEOUT_S)],
            check=True, stdout=subprocess.DEVNULL, env=child_env(), cwd=ROOT_DIR,
        )  # fmt: skip
        return time.perf_counter() - t

    # The store's first listing builds its run index (once per store, as a store written
    # before the index gets it): not what a listing of a store in use costs.
    t = time.perf_counter()
    in_child("summaries", root=str(root), rounds=0)
    out.note(f"the first listing, which builds the run index: {time.perf_counter() - t:.1f} s")
    cold()
    cli_cold = list_jobs()
    cli_warm = statistics.median(list_jobs() for _ in range(args.rounds))
    cold()
    s_cold = in_child("summaries", root=str(root), rounds=0)
    s_warm = in_child("summaries", root=str(root), rounds=args.rounds)
    assert s_cold["runs"] == n, s_cold
    out.note(f"list jobs --limit 20: {cli_cold:.2f} s cold, {cli_warm:.2f} s warm")
    out.note(
        f"run_summaries(): {s_cold['first_s']:.2f} s cold, {s_warm['first_s']:.2f} s "
        f"warm (fresh process), {s_warm['again_s']:.2f} s again with the same reader; "
        f"import {s_warm['import_s']:.2f} s"
    )
    figures: dict[str, Any] = {"runs": n, "write_s": gen, "list_jobs_cold_s": cli_cold,
                               "list_jobs_warm_s": cli_warm, "summaries_cold": s_cold,
                               "summaries_warm": s_warm}  # fmt: skip

    ml: dict[str, Any] | None = None
    ml_cli = ml_cli_warm = 0.0
    m = args.mlflow_runs
    if mlflow is not None and m:
        url = mlflow()
        mw = in_child("write_mlflow", url=url, points=0, runs=m)
        out.note(f"MLflow: {m:,} runs created in {mw['runs_s']:.1f} s")

        def runs_list() -> float:
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "mlflow", "runs", "list", "--experiment-id",
                 mw["experiment"]],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=child_env({"MLFLOW_TRACKING_URI": url}), cwd=ROOT_DIR,
            )  # fmt: skip
            return time.perf_counter() - t

        cold()
        ml_cli = runs_list()
        ml_cli_warm = statistics.median(runs_list() for _ in range(args.rounds))
        cold()
        ml = in_child("search_runs", url=url, experiment=mw["experiment"], rounds=args.rounds)
        assert ml["all"]["runs"] == m, ml
        out.note(
            f"MLflow `mlflow runs list` ({m:,} runs): {ml_cli:.2f} s cold, "
            f"{ml_cli_warm:.2f} s warm; search_runs all {ml['all']['first_s']:.2f} s "
            f"first, {ml['all']['again_s']:.2f} s again; newest 20 "
            f"{ml['newest20']['first_s'] * 1e3:.0f} ms first, "
            f"{ml['newest20']['again_s'] * 1e3:.0f} ms again"
        )
        figures.update(
            mlflow_runs=m,
            mlflow_write=mw,
            mlflow_runs_list_cold_s=ml_cli,
            mlflow_runs_list_warm_s=ml_cli_warm,
            mlflow_search=ml,
        )
        ours_ml = mlflow_ours(args, tmp, cold, out, url, ml, ml_cli, ml_cli_warm)
        figures["mlflow_ours"] = ours_ml
    out.figures["list"] = figures

    def per_run(s: float, count: int) -> str:
        return f"{s / count * 1e6:,.1f} us/run"

    def vs(ours_s: float, base_s: float | None) -> tuple[str, str]:
        if base_s is None:
            return "-", "-"
        return (f"{seconds(base_s)}, {per_run(base_s, m)} ({m:,} runs)",
                ratio(ours_s / n, base_s / m))  # fmt: skip

    size = f"{n:,} runs"
    for label, ours_s, base_s in (
        (f"3 `list jobs --limit 20`, {size}, {cold.label}", cli_cold,
         ml_cli if ml else None),
        (f"3 `list jobs --limit 20`, {size}, warm", cli_warm, ml_cli_warm if ml else None),
        (f"3 run_summaries(), {size}, {cold.label}", s_cold["first_s"],
         ml["all"]["first_s"] if ml else None),
        (f"3 run_summaries(), {size}, warm", s_warm["first_s"],
         ml["all"]["again_s"] if ml else None),
        (f"3 run_summaries() again, same reader, {size}", s_warm["again_s"], None),
    ):  # fmt: skip
        b, q = vs(ours_s, base_s)
        out.add(Row(label, f"{seconds(ours_s)}, {per_run(ours_s, n)}", b, q))
    if ml:
        out.note(
            "baselines: `mlflow runs list` for the command, search_runs (all runs, one "
            "page) for run_summaries(), per run"
        )


def mlflow_ours(
    args: argparse.Namespace, tmp: Path, cold: Cold, out: Results, url: str,
    ml: dict[str, Any], ml_cli: float, ml_cli_warm: float,
) -> dict[str, Any]:  # fmt: skip
    """Our run list over an MLflow experiment of ``--mlflow-runs`` runs written by our
    backend (so with summary tags): ``run_summaries()`` through the backend's reader and
    through the generic one, and ``list jobs --limit 20``, beside the MLflow baselines."""
    m = args.mlflow_runs
    mw = in_child("write_mlflow_ours", url=url, runs=m)
    out.note(f"MLflow: {m:,} runs written by our backend in {mw['runs_s']:.1f} s")
    cfg = tmp / "mlflow-cfg"
    cfg.mkdir(exist_ok=True)
    (cfg / ".torchxconfig").write_text(
        f"[tracker:mlflow]\nexperiment_name = {mw['experiment']}\ntracking_uri = {url}\n"
    )

    def list_jobs() -> float:
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "async_tracker", "--tracker", "mlflow", "--config", str(cfg),
             "--timeout", str(READ_TIMEOUT_S), "list", "jobs", "--limit", "20"],
            check=True, stdout=subprocess.DEVNULL, env=child_env(), cwd=ROOT_DIR,
        )  # fmt: skip
        return time.perf_counter() - t

    cold()
    cli_cold = list_jobs()
    cli_warm = statistics.median(list_jobs() for _ in range(args.rounds))
    ours = in_child("mlflow_summaries", url=url, experiment=mw["experiment"],
                    rounds=args.rounds, generic=False)  # fmt: skip
    gen = in_child("mlflow_summaries", url=url, experiment=mw["experiment"], rounds=0,
                   generic=True)  # fmt: skip
    assert ours["runs"] == gen["runs"] == m, (ours, gen)
    out.note(
        f"MLflow, our reader over {m:,} runs of ours: run_summaries() {ours['first_s']:.2f} s "
        f"first ({ours['requests']}), {ours['again_s']:.2f} s again (its search_runs "
        f"request alone: {ours['search_runs_s']:.2f} s); the generic reader "
        f"{gen['first_s']:.2f} s ({sum(gen['requests'].values()):,} requests: "
        f"{gen['requests']}); list jobs --limit 20: {cli_cold:.2f} s cold, {cli_warm:.2f} s warm"
    )
    for label, ours_s, base_s, base in (
        (f"3 MLflow run_summaries(), {m:,} runs", ours["first_s"], ml["all"]["first_s"],
         "search_runs"),
        (f"3 MLflow run_summaries() again, {m:,} runs", ours["again_s"],
         ml["all"]["again_s"], "search_runs"),
        (f"3 MLflow run_summaries() again, {m:,} runs, vs its own search", ours["again_s"],
         ours["search_runs_s"], "search_runs of our runs"),
        (f"3 MLflow run_summaries(), {m:,} runs, generic reader", gen["first_s"],
         ours["first_s"], "our reader"),
        (f"3 MLflow `list jobs --limit 20`, {m:,} runs, {cold.label}", cli_cold, ml_cli,
         "mlflow runs list"),
        (f"3 MLflow `list jobs --limit 20`, {m:,} runs, warm", cli_warm, ml_cli_warm,
         "mlflow runs list"),
    ):  # fmt: skip
        out.add(Row(label, seconds(ours_s), f"{seconds(base_s)} ({base})",
                    ratio(ours_s, base_s)))  # fmt: skip
    return {"write": mw, "summaries": ours, "generic": gen, "list_jobs_cold_s": cli_cold,
            "list_jobs_warm_s": cli_warm}  # fmt: skip


def part_s3(args: argparse.Namespace, tmp: Path, out: Results) -> None:
    n = args.s3_runs
    print(f"\n== 4: listing {n:,} runs on S3 (moto's server) ==", flush=True)
    source = tmp / "s3src" / "runs"
    gen = write_runs(source, n, 50, 1, args.gen_procs)
    moto = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_read", "--child", "moto",
         json.dumps({"source": str(source), "bucket": "bench", "prefix": "runs"})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=child_env(), cwd=ROOT_DIR,
    )  # fmt: skip
    try:
        assert moto.stdout is not None
        line = moto.stdout.readline()
        if not line:
            raise RuntimeError("the moto child exited before serving")
        server = json.loads(line)
        out.note(
            f"written locally in {gen:.1f} s, {server['objects']:,} objects loaded into "
            f"the S3 server in {server['s']:.1f} s"
        )
        r = in_child("s3_summaries", endpoint=server["endpoint"], url="s3://bench/runs")
    finally:
        assert moto.stdin is not None
        moto.stdin.close()
        try:
            moto.wait(30)
        except subprocess.TimeoutExpired:
            moto.kill()
            moto.wait()
    out.figures["s3"] = {"runs": n, "write_s": gen, "load": server, "read": r}
    for name, label in (
        ("first", "first listing (builds the index, once)"),
        ("new", "a new reader"),
        ("again", "again, same reader"),
    ):
        x = r[name]
        assert x["runs"] == n, x
        count = sum(x["requests"].values())
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(x["requests"].items()))
        out.note(f"{label}: {x['s']:.2f} s, {count} requests ({kinds})")
        ok = count <= S3_REQUESTS_TARGET and x["s"] <= S3_TIME_TARGET_S
        out.add(Row(
            f"4 S3 run_summaries(), {n:,} runs, {label}", f"{seconds(x['s'])}, {count} requests",
            "-", "-", f"<= {S3_REQUESTS_TARGET} req, <= {S3_TIME_TARGET_S:g} s", met(ok),
        ))  # fmt: skip


def part_duckdb(args: argparse.Namespace, tmp: Path, cold: Cold, out: Results) -> None:
    n = args.duckdb_runs
    print(f"\n== 5: last value of one metric across {n:,} runs, DuckDB in place ==",
          flush=True)  # fmt: skip
    root = tmp / "duck" / "runs"
    gen = write_runs(root, n, args.duckdb_steps, args.duckdb_segments, args.gen_procs)
    out.note(
        f"{n:,} runs of {args.duckdb_steps:,} steps x 2 metrics in "
        f"{args.duckdb_segments} flushes each, written in {gen:.1f} s"
    )
    cold()
    duck = in_child("duckdb_last", root=str(root), rounds=args.rounds)
    cold()
    pd_ = in_child("pandas_last", root=str(root), rounds=args.rounds)
    out.figures["duckdb"] = {
        "runs": n,
        "steps": args.duckdb_steps,
        "duckdb": {k: v for k, v in duck.items() if k != "last"},
        "pandas": {k: v for k, v in pd_.items() if k != "last"},
    }
    if duck["format"] is None:
        out.note(f"no metric files DuckDB reads in place: {duck['kinds']}")
        out.add(Row("5 DuckDB last value, in place", "not measured (no known files)"))
        return
    agree = duck["last"].keys() == pd_["last"].keys() and all(
        abs(duck["last"][k] - pd_["last"][k]) <= 1e-12 for k in pd_["last"]
    )
    out.note(
        f"DuckDB read {duck['format']} files {duck['kinds']}: first query "
        f"{duck['first_s']:.3f} s, again {duck['again_s']:.3f} s (import "
        f"{duck['import_s']:.2f} s); Store + pandas {pd_['first_s']:.2f} s, again "
        f"{pd_['again_s']:.2f} s; answers agree: {agree} ({len(duck['last'])} runs)"
    )
    for label, d, p in (
        (cold.label, duck["first_s"], pd_["first_s"]),
        ("warm", duck["again_s"], pd_["again_s"]),
    ):
        out.add(Row(
            f"5 DuckDB last `{METRIC}`, {n:,} runs ({duck['format']}), {label}", seconds(d),
            f"Store.metrics+pandas {seconds(p)}", ratio(d, p), f"<= {DUCKDB_TARGET_S} s",
            met(d <= DUCKDB_TARGET_S),
        ))  # fmt: skip


# ---------------------------------------------------------------------------------------------


def remove_stores(tmp: Path) -> None:
    """Removes ``tmp`` (what the parts wrote). A store of many runs is hundreds of thousands
    of entries, each removal waiting on the disk (longer still with the page cache just
    dropped): eight ``rm -rf`` at once take a tenth of the time of one."""
    paths: list[Path] = []
    for part in tmp.iterdir():
        for entry in part.iterdir() if part.is_dir() else ():
            paths.extend(entry.iterdir() if entry.is_dir() else [entry])
    if paths and shutil.which("xargs") and shutil.which("rm"):
        subprocess.run(
            ["xargs", "-0", "-n", "1000", "-P", "8", "rm", "-rf", "--"],
            input=b"\0".join(os.fsencode(p) for p in paths), check=False,
        )  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)


def print_table(rows: list[Row]) -> None:
    head = Row("figure", "ours", "baseline", "ratio", "target", "met?")
    table = [head, *rows]
    widths = [
        max(len(getattr(r, f)) for r in table)
        for f in ("figure", "ours", "baseline", "ratio", "target", "met")
    ]
    for i, r in enumerate(table):
        cells = (r.figure, r.ours, r.baseline, r.ratio, r.target, r.met)
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("pyarrow", "duckdb", "tensorboard", "mlflow", "moto"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} missing")
    return ", ".join(out)


PARTS = ("big", "lists", "s3", "duckdb")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run, under a minute (MLflow skipped)"
    )
    parser.add_argument("--points", type=int, help="points of the big metric (10M)")
    parser.add_argument("--tb-points", type=int, help="TensorBoard's points (1M; 0: skip)")
    parser.add_argument("--mlflow-points", type=int, help="MLflow's points (50k; 0: skip)")
    parser.add_argument("--runs", type=int, help="local runs for list jobs (50,000)")
    parser.add_argument("--mlflow-runs", type=int, help="MLflow runs for search_runs (300)")
    parser.add_argument("--s3-runs", type=int, help="runs on S3 (10,000)")
    parser.add_argument("--duckdb-runs", type=int, help="runs DuckDB reads (1,000)")
    parser.add_argument("--duckdb-steps", type=int, help="steps of each of them (1,000)")
    parser.add_argument("--duckdb-segments", type=int, default=4, help="flushes of each (4)")
    parser.add_argument("--rounds", type=int, help="warm repeats, median (3)")
    parser.add_argument("--gen-procs", type=int, default=4, help="processes writing runs")
    parser.add_argument("--only", action="append", choices=PARTS, help="parts to run")
    parser.add_argument("--no-mlflow", action="store_true", help="skip MLflow's baselines")
    parser.add_argument("--keep", metavar="DIR", help="write the stores here and keep them")
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("child_args", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = CHILDREN[args.child](**json.loads(args.child_args or "{}"))
        if result is not None:
            print(json.dumps(result), flush=True)
        return 0

    quick = args.quick
    defaults = {
        "points": (200_000, 10_000_000), "tb_points": (50_000, 1_000_000),
        "mlflow_points": (5_000, 50_000), "runs": (2_000, 50_000),
        "mlflow_runs": (50, 300), "s3_runs": (300, 10_000), "duckdb_runs": (100, 1_000),
        "duckdb_steps": (200, 1_000), "rounds": (1, 3),
    }  # fmt: skip
    if quick and args.mlflow_points is None and args.mlflow_runs is None:
        # Its server alone takes 20 s or more to start here: a smoke run skips it unless
        # asked for by size.
        args.no_mlflow = True
    for name, (small, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    parts = args.only or list(PARTS)
    cold = Cold()
    print(
        f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.platform()}, load {os.getloadavg()[0]:.2f}; {versions()}"
    )
    print(
        f"sizes: big metric {args.points:,} points (TensorBoard {args.tb_points:,}, MLflow "
        f"{args.mlflow_points:,}); list {args.runs:,} runs (MLflow {args.mlflow_runs:,}); "
        f"{'MLflow skipped; ' if args.no_mlflow else ''}"
        f"S3 {args.s3_runs:,} runs; DuckDB {args.duckdb_runs:,} runs x "
        f"{args.duckdb_steps:,} steps; rounds {args.rounds}; parts {', '.join(parts)}"
    )
    print(
        "cold reads: "
        + (
            "page cache dropped before each"
            if cold.works
            else "page cache warm (cannot drop it: not root, or not allowed)"
        )
    )
    out = Results()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp = Path(args.keep).resolve()
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = Path(tempfile.mkdtemp(prefix="bench-read-"))
            stack.callback(remove_stores, tmp)
        mlflow: Callable[[], str] | None = None
        server: MlflowServer | None = None
        wants_mlflow = (("big" in parts and args.mlflow_points)
                        or ("lists" in parts and args.mlflow_runs))  # fmt: skip
        if wants_mlflow and not args.no_mlflow:
            server = MlflowServer(tmp / "mlflow")  # starts now; its start overlaps part 1
            stack.callback(server.stop)
            mlflow = server.wait
        steps: list[tuple[str, Callable[[], None]]] = [
            ("big", lambda: part_big(args, tmp, cold, out, mlflow)),
            ("lists", lambda: part_lists(args, tmp, cold, out, mlflow)),
            ("s3", lambda: part_s3(args, tmp, out)),
            ("duckdb", lambda: part_duckdb(args, tmp, cold, out)),
        ]
        for name, step in steps:
            if name not in parts:
                continue
            t = time.perf_counter()
            try:
                step()
            except Exception as exc:  # one part failing still reports the others
                msg = " ".join(str(exc).split())[:300]
                out.note(f"part {name} failed: {type(exc).__name__}: {msg}")
                out.add(Row(f"{name}: not measured", f"{type(exc).__name__}"))
            print(f"  (part {name}: {time.perf_counter() - t:.0f} s)", flush=True)
        if server is not None and server.ready_s is not None:
            out.note(
                f"mlflow server: ready when first needed, {server.ready_s:.0f} s after its "
                f"start (waited {server.waited_s:.1f} s for it)"
            )
        total = time.perf_counter() - started  # the stores' removal aside
    if not args.keep:
        print(f"(stores removed in {time.perf_counter() - started - total:.0f} s)")
    print(
        f"\n== read side: ours beside the baselines (ratio: ours / baseline, per point or "
        f"per run; below 1 is faster); {total:.0f} s in all =="
    )
    print_table(out.rows)
    if args.json:
        data = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform(), "versions": versions()},
                "cold": cold.label, "sizes": {k: getattr(args, k) for k in defaults},
                "rows": [asdict(r) for r in out.rows], "notes": out.notes,
                "figures": out.figures, "total_s": total}  # fmt: skip
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
