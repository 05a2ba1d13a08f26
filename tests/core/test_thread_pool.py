"""The process's worker threads (async_tracker/runtime/threads.py): one cap for the process, a
per endpoint, abandoned calls, 1000 runs at once, fork and exit."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from fsspec.implementations.local import LocalFileSystem

from async_tracker import AppRun, FlushReport
from async_tracker.backend.fsspec import AsyncFsspecTracker, FsspecTracker
from async_tracker.runtime.process import run_blocking, runtime
from async_tracker.runtime.threads import ThreadPool
from tests.core.helpers import Child, wait_until
from tests.core.test_process import run_in_fork
from tests.faulty import DictTracker

MakeRun = Callable[..., AppRun]
WAIT_S = 20.0  # an upper bound on waiting for an event that is due; never reached when all is well


def test_a_pool_never_has_more_threads_than_its_cap() -> None:
    pool = ThreadPool(max_threads=3, per_endpoint=10)
    gate = threading.Event()
    started = threading.Semaphore(0)

    def call(i: int) -> int:
        started.release()
        gate.wait()
        return i

    # Eight calls to eight endpoints: only the cap limits them.
    futures = [pool.submit(lambda i=i: call(i), f"endpoint{i}") for i in range(8)]
    try:
        for _ in range(3):
            assert started.acquire(timeout=WAIT_S)
        assert pool.threads == 3
        assert not started.acquire(blocking=False)  # the other five wait for a thread
    finally:
        gate.set()
    assert [f.result(WAIT_S) for f in futures] == list(range(8))
    assert pool.peak_threads == 3


def test_a_hung_endpoint_holds_its_share_and_the_others_go_on() -> None:
    pool = ThreadPool(max_threads=4, per_endpoint=2)
    gate = threading.Event()
    entered = threading.Semaphore(0)
    ran: list[int] = []

    def hang(i: int) -> None:
        ran.append(i)
        entered.release()
        gate.wait()

    try:
        dead = [pool.submit(lambda i=i: hang(i), "dead") for i in range(5)]
        for _ in range(2):
            assert entered.acquire(timeout=WAIT_S)
        # Two threads hang on the dead endpoint, three calls wait for a slot of it, and the
        # pool's other threads still serve another endpoint.
        assert pool.submit(lambda: "ok", "alive").result(WAIT_S) == "ok"
        assert pool.held("dead") == (2, 3)
        # Callers that give up (close() deadlines) take their waiting calls out: they never
        # run, and do not pile up behind the dead endpoint.
        assert all(f.cancel() for f in dead[2:])
        assert pool.held("dead") == (2, 0)
        assert sorted(ran) == [0, 1]
    finally:
        gate.set()
    for f in dead[:2]:
        assert f.result(WAIT_S) is None
    assert sorted(ran) == [0, 1]


def test_calls_of_one_endpoint_run_in_call_order() -> None:
    pool = ThreadPool(max_threads=4, per_endpoint=1)
    gate = threading.Event()
    order: list[int] = []

    def first() -> None:
        gate.wait()
        order.append(0)

    futures = [pool.submit(first, "e")]
    futures += [pool.submit(lambda i=i: order.append(i), "e") for i in range(1, 20)]
    gate.set()
    for f in futures:
        f.result(WAIT_S)
    assert order == list(range(20))


async def test_an_abandoned_call_returns_at_once_and_keeps_its_slot() -> None:
    gate = threading.Event()
    entered = threading.Event()
    endpoint = "test://abandoned"

    def stuck() -> str:
        entered.set()
        gate.wait()
        return "late"

    task = asyncio.ensure_future(run_blocking(stuck, endpoint=endpoint))
    try:
        await anyio.to_thread.run_sync(entered.wait)
        task.cancel()  # what a close() deadline does
        with pytest.raises(asyncio.CancelledError):
            await task
        # The caller is gone; the thread is not: its slot stays taken until it returns.
        assert runtime().pool.held(endpoint) == (1, 0)
    finally:
        gate.set()
    assert await run_blocking(lambda: "next", endpoint=endpoint) == "next"


async def test_what_a_call_raises_is_raised_in_its_caller() -> None:
    def fail(x: int) -> None:
        raise ValueError(f"bad {x}")

    with pytest.raises(ValueError, match="bad 3"):
        await run_blocking(fail, 3, endpoint="test://errors")


def test_a_backend_used_directly_under_trio_runs_its_blocking_calls(tmp_path: Path) -> None:
    import trio

    gate = threading.Event()
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        gate.wait()

    async def main() -> Mapping[str, object]:
        tracker = AsyncFsspecTracker(LocalFileSystem(), str(tmp_path))
        await tracker.add_metadata("r", a=1)
        with trio.CancelScope() as scope:
            scope.cancel()  # cancelled from the start: the call is abandoned at once
            await run_blocking(stuck, endpoint="test://trio")
        assert scope.cancelled_caught
        return await tracker.metadata("r")

    try:
        assert trio.run(main) == {"a": 1}
    finally:
        gate.set()


class StuckFileSystem(LocalFileSystem):
    """A local filesystem whose writes under ``dead`` block until ``release`` is set: a dead
    NFS mount, say, beside a healthy directory of the same filesystem."""

    cachable = False  # fsspec would otherwise keep each instance (and its event) for good

    def __init__(self, dead: str, release: threading.Event) -> None:
        super().__init__()
        self.dead = dead
        self.release = release
        self.entered = threading.Semaphore(0)
        self.stuck = 0
        self.lock = threading.Lock()

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if str(path).startswith(self.dead):
            with self.lock:
                self.stuck += 1
            self.entered.release()
            self.release.wait()
        super().pipe_file(path, value, mode=mode, **kwargs)


def test_runs_on_a_dead_root_do_not_starve_runs_on_another(
    tmp_path: Path, make_run: MakeRun
) -> None:
    pool = runtime().pool
    release = threading.Event()  # set only at the end, to let the threads go
    dead_root = str(tmp_path / "dead")
    fs = StuckFileSystem(dead_root, release)
    # More runs on the dead root than the process has threads: without a limit per endpoint,
    # they would take every thread and the healthy run below would starve.
    dead_runs = [
        make_run(f"dead{i}", [FsspecTracker(fs, dead_root)]) for i in range(pool.max_threads + 4)
    ]
    try:
        for run in dead_runs:
            run.log_metric("x", 1.0, step=0)
            run.flush(timeout=0)  # starts the delivery, does not wait for it
        for _ in range(pool.per_endpoint):
            assert fs.entered.acquire(timeout=WAIT_S)

        alive = make_run("alive", [FsspecTracker(fs, str(tmp_path / "alive"))])
        alive.log_metric("y", 2.0, step=0)
        report = alive.flush(timeout=WAIT_S)
        assert report.ok and report.delivered == 1, report
        assert [p.value for p in alive.metrics()["y"]] == [2.0]

        async def close_all() -> list[FlushReport]:
            return await asyncio.gather(*(run.aclose(timeout=0.2) for run in dead_runs))

        # Each close returns by its deadline, its write still hung or not even started.
        for report in asyncio.run(close_all()):
            assert report.delivered == 0 and report.pending + report.spooled == 1, report
        # Only the endpoint's share of threads ever entered the dead root, and the calls
        # the closed runs abandoned before they started are gone. An aclose() may answer at
        # its own deadline while its close still runs on the tracker loop (a loaded machine):
        # the abandoned calls are taken out when that close stops its lane, so wait for it.
        endpoint = fs.unstrip_protocol(dead_root)
        wait_until(
            lambda: pool.held(endpoint) == (pool.per_endpoint, 0),
            "the calls the closed runs abandoned are taken out of the dead endpoint",
            WAIT_S,
        )
        assert fs.stuck == pool.per_endpoint
    finally:
        release.set()


@pytest.mark.scale
def test_thousand_runs_on_one_root_share_a_few_threads(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    # In a fresh interpreter, so that the thread count is the workload's own. The workload is
    # the benchmark's (benchmarks/bench_many_runs.py): 1000 runs opened at once, each with its
    # own FsspecTracker on one root, 100 points each, all closed together, then read back.
    script = (
        "import json, sys\n"
        "from benchmarks.bench_many_runs import measure\n"
        "print(json.dumps(measure(1000, 100, True, root=sys.argv[1]).__dict__), flush=True)\n"
    )
    proc = child(script, str(tmp_path))
    result = json.loads(proc.readline(timeout=600))
    assert proc.wait() == 0, proc.stderr()
    print(result)  # the figures, for whoever runs with -s
    assert result["points_read_back"] == 1000 * 100
    assert result["pool_max_threads"] == 16
    assert result["pool_peak_threads"] <= result["pool_max_threads"]
    assert result["peak_threads"] <= 32
    # Python allocations only (tracemalloc), with a generous bound: measured at 47 to 59 MB on
    # a quiet machine, and up to 127 MB while other test suites took the CPUs (the flusher
    # then falls behind the 1000 runs' writes, which wait in memory meanwhile): what it
    # catches is growth without bound, an order of magnitude above.
    assert result["tracemalloc_peak_mb"] < 250


def test_a_forked_child_gets_a_fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = runtime().pool
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def hang() -> None:
        entered.release()
        gate.wait()

    # The parent's endpoint is full of hung calls when the process forks.
    hung = [parent.submit(hang, "shared") for _ in range(parent.per_endpoint)]
    try:
        for _ in range(parent.per_endpoint):
            assert entered.acquire(timeout=WAIT_S)
        monkeypatch.setenv("ASYNC_TRACKER_THREADS", "3")  # read by the child's new pool only

        def child() -> dict[str, Any]:
            pool = runtime().pool
            fresh = pool is not parent and pool.threads == 0 and pool.held("shared") == (0, 0)
            ran = pool.submit(lambda: "ran", "shared").result(WAIT_S)
            plain = DictTracker()
            run = AppRun("c", [plain], flush_interval=3600)
            run.add_metadata(b=2)
            report = run.close(timeout=WAIT_S)
            return {
                "fresh": fresh,
                "max_threads": pool.max_threads,
                "ran": ran,
                "ok": report.ok,
                "stored": dict(plain.metadata("c")),
            }

        result = run_in_fork(child)[1]
    finally:
        gate.set()
    assert result == {
        "fresh": True,
        "max_threads": 3,
        "ran": "ran",
        "ok": True,
        "stored": {"b": 2},
    }
    assert parent.max_threads != 3  # the parent's pool was sized before, and stays
    for f in hung:
        f.result(WAIT_S)


@pytest.mark.parametrize("value", ["zero", "0", "-2", "1.5"])
def test_a_bad_thread_count_is_a_clear_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # In a forked child, whose pool is created there, from its environment.
    monkeypatch.setenv("ASYNC_TRACKER_THREADS_PER_ENDPOINT", value)

    def child() -> dict[str, Any]:
        try:
            runtime().pool  # noqa: B018 - the pool is made on first use
        except ValueError as exc:
            return {"message": str(exc)}
        return {"message": None}

    message = run_in_fork(child)[1]["message"]
    assert message == f"ASYNC_TRACKER_THREADS_PER_ENDPOINT={value!r} is not a whole number >= 1"


EXIT_SCRIPT = """
import sys
import fsspec
from async_tracker.runtime.process import runtime
from async_tracker.runtime.threads import ThreadPool
from async_tracker import AppRun, FlushReport
from async_tracker.backend.fsspec import AsyncFsspecTracker, FsspecTracker

# Idle threads end at once, but for the last one: the exit path must find a thread to run on
# (Python 3.12 refuses to start one at interpreter exit).
runtime()._pool = ThreadPool(16, 4, idle_s=0.001)
run = AppRun("r", [FsspecTracker(fsspec.filesystem("file"), sys.argv[1])], flush_interval=3600)
for i in range(100):
    run.log_metric("loss", float(i), step=i)
print("done", flush=True)
# No close(), no flush(): the first blocking write happens at exit.
"""


def test_exit_writes_through_the_thread_kept_for_it(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    proc = child(EXIT_SCRIPT, str(tmp_path))
    assert proc.readline() == "done"
    assert proc.wait() == 0, proc.stderr()
    points = FsspecTracker(LocalFileSystem(), str(tmp_path)).metrics("r")["loss"]
    assert [p.step for p in points] == list(range(100))
    assert proc.stderr().strip() == "stderr:"
