"""The process around the tracker: fork, SIGTERM, and interpreter exit.

Children record through :class:`tests.faulty.FileTracker` (one JSON line per write, with the
writer's pid), so what they delivered is on disk even when they die. The tests wait on pipes
(readiness lines, a report written by a forked child), never on sleeps.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun, TrackerClosedError
from async_tracker.settings import DEFAULT_THREAD_LIMIT
from tests.core.helpers import Child
from tests.faulty import DictTracker, FileTracker, HangingTracker

MakeRun = Callable[..., AppRun]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes and signals")


# -- fork -----------------------------------------------------------------------------------------


def run_in_fork(
    body: Callable[[], dict[str, Any]], timeout: float = 20.0
) -> tuple[int, dict[str, Any]]:
    """Forks; the child runs ``body``, sends its result through a pipe and leaves with
    ``os._exit`` (never back into pytest). Returns the child's pid and result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.close(r)
            result = body()
        except BaseException as exc:
            result, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
        try:
            os.write(w, json.dumps(result).encode())
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([r], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"the forked child said nothing in {timeout} s")
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    result = json.loads(data)
    assert "error" not in result, result["error"]
    return pid, result


def test_forked_child_starts_empty_and_never_writes_the_parents_records(
    tmp_path: Path, make_run: MakeRun
) -> None:
    files = FileTracker(tmp_path / "records.jsonl", name="file")
    plain = DictTracker(name="plain")  # a blocking TrackerBase: worker threads in the child
    run = make_run("r", [files, plain])
    run.add_metadata(phase="before-fork")
    run.log_metric("parent", 0.0, step=0)
    assert run.flush().ok  # the parent's loop, flusher and lanes are running at the fork
    run.log_metric("parent", 1.0, step=1)  # buffered in the parent at the fork
    run.add_metadata(buffered_at_fork=True)

    def child() -> dict[str, Any]:
        run.log_metric("child", 10.0, step=0)
        run.add_metadata(phase="child")
        report = run.close(timeout=10)
        return {
            "ok": report.ok,
            "delivered": report.delivered,
            "plain": dict(plain.metadata("r")),
        }

    pid, result = run_in_fork(child)
    # The child delivered its own records and nothing else: 2 to the file, 1 to the plain
    # TrackerBase (which takes no metrics).
    assert result == {
        "ok": True,
        "delivered": 3,
        "plain": {"phase": "child"},  # its copy of the parent's delivered state, plus its own
    }
    assert not run.closed  # closing in the child closed nothing here
    report = run.flush()
    assert report.ok and report.delivered == (2 + 2) + (1 + 1)

    lines = files.lines()
    child_lines = [x for x in lines if x["pid"] == pid]
    parent_lines = [x for x in lines if x["pid"] == os.getpid()]
    assert len(child_lines) + len(parent_lines) == len(lines)
    assert {x["op"] for x in child_lines} == {"metadata", "metrics"}
    assert [x["metadata"] for x in child_lines if x["op"] == "metadata"] == [{"phase": "child"}]
    child_points = [p[:3] for x in child_lines if x["op"] == "metrics" for p in x["points"]]
    assert child_points == [["child", 10.0, 0]]
    # The parent's records, delivered before or after the fork, were written once, by it.
    parent_points = [p[:3] for x in parent_lines if x["op"] == "metrics" for p in x["points"]]
    assert parent_points == [["parent", 0.0, 0], ["parent", 1.0, 1]]
    assert [x["metadata"] for x in parent_lines if x["op"] == "metadata"] == [
        {"phase": "before-fork"},
        {"buffered_at_fork": True},
    ]
    assert plain.metadata("r") == {"phase": "before-fork", "buffered_at_fork": True}


def test_forked_child_of_a_run_never_written_before(tmp_path: Path, make_run: MakeRun) -> None:
    files = FileTracker(tmp_path / "records.jsonl")
    run = make_run("r", [files])

    def child() -> dict[str, Any]:
        run.log_metric("x", 1.0, step=0)
        report = run.close(timeout=10)
        return {"delivered": report.delivered}

    pid, result = run_in_fork(child)
    assert result == {"delivered": 1}
    assert [x["pid"] for x in files.lines()] == [pid]
    assert run.flush().delivered == 0


def test_forked_child_is_not_starved_by_the_parents_hung_threads(make_run: MakeRun) -> None:
    # Every worker-thread slot of the parent is taken by a backend hung in its thread when
    # the process forks: the child's blocking backends must still get threads.
    release = threading.Event()
    hung = [HangingTracker(release=release, name=f"h{i}") for i in range(DEFAULT_THREAD_LIMIT)]
    try:
        run = make_run("r", hung)
        run.add_metadata(a=1)
        run.flush(timeout=0)
        for h in hung:
            assert h.entered.wait(10)

        def child() -> dict[str, Any]:
            plain = DictTracker()
            other = AppRun("c", [plain], flush_interval=3600)
            other.add_metadata(b=2)
            report = other.close(timeout=10)
            return {"ok": report.ok, "stored": dict(plain.metadata("c"))}

        assert run_in_fork(child)[1] == {"ok": True, "stored": {"b": 2}}
    finally:
        release.set()


def test_forked_child_works_when_the_parent_forked_with_our_locks_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another thread holds run_from_env()'s lock and the runtime's lock (which guards starting
    # its threads) at the fork: the child's copies would stay locked forever, and its first
    # use wait forever.
    import async_tracker.run as run_module
    from async_tracker.runtime.process import runtime

    monkeypatch.setenv("TORCHX_JOB_ID", "forked")
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with run_module._env_lock(), runtime()._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)

        def child() -> dict[str, Any]:
            run = AppRun.run_from_env()
            io = runtime().spool_io
            return {"run": run.id, "spool thread": io.submit(os.getpid).result(10)}

        pid, result = run_in_fork(child)
        assert result == {"run": "forked", "spool thread": pid}
    finally:
        release.set()
        holder.join()


def test_forked_child_of_a_closed_run_cannot_write(make_run: MakeRun) -> None:
    run = make_run("r", [DictTracker()])
    run.add_metadata(a=1)
    run.close()

    def child() -> dict[str, Any]:
        try:
            run.add_metadata(b=2)
        except TrackerClosedError:
            return {"raised": True}
        return {"raised": False}

    assert run_in_fork(child)[1] == {"raised": True}



def test_a_fork_waits_for_a_lazy_import_under_way_on_another_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fsspec store imports numpy and pyarrow on the tracker's thread at its first metric
    # write. Forked in the middle, the child would get the module half made, with its import
    # lock held by a thread it does not have: its own import of it would never return.
    from async_tracker.runtime import process

    asked = threading.Event()

    class Watched:
        """The runtime's lock, telling when the fork asks for it."""

        def __init__(self) -> None:
            self.lock = threading.RLock()

        def __enter__(self) -> None:
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

        def acquire(self, timeout: float = -1) -> bool:
            asked.set()
            return self.lock.acquire(timeout=timeout)

        def release(self) -> None:
            self.lock.release()

    watched = Watched()
    monkeypatch.setattr(process, "lazy_imports", watched)
    gate = types.SimpleNamespace(entered=threading.Event(), go=threading.Event())
    monkeypatch.setitem(sys.modules, "lazy_import_gate", gate)
    (tmp_path / "half_made.py").write_text(
        "import lazy_import_gate as gate\n"
        "gate.entered.set()\n"
        "assert gate.go.wait(30)\n"
        "WHOLE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def load() -> None:
        with watched:
            importlib.import_module("half_made")

    loader = threading.Thread(target=load)
    loader.start()
    # Let the import finish once the fork waits for it (without the wait, this times out).
    opener = threading.Thread(target=lambda: (asked.wait(30), gate.go.set()))
    opener.start()
    try:
        assert gate.entered.wait(10)

        def child() -> dict[str, Any]:
            return {"whole": importlib.import_module("half_made").WHOLE}

        assert run_in_fork(child)[1] == {"whole": True}
    finally:
        gate.go.set()
        loader.join()
        opener.join()
        sys.modules.pop("half_made", None)

MULTIPROCESSING_SCRIPT = """
import multiprocessing, os, sys
from async_tracker import AppRun
from tests.faulty import FileTracker

run = AppRun("r", [FileTracker(sys.argv[1])], flush_interval=3600)
run.add_metadata(buffered_in_parent=True)  # still buffered when the workers fork

def worker(n):
    # A DataLoader worker: logs, returns, and multiprocessing ends it with os._exit.
    for i in range(n):
        run.log_metric(f"worker{os.getpid()}", float(i), step=i)

if __name__ == "__main__":
    ctx = multiprocessing.get_context(sys.argv[2])
    workers = [ctx.Process(target=worker, args=(100,)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(*[w.pid for w in workers], *[w.exitcode for w in workers], flush=True)
    run.close()
"""


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_multiprocessing_workers_deliver_before_they_exit(
    tmp_path: Path, child: Callable[..., Child], method: str
) -> None:
    # fork: the workers inherit the run (reset, empty) and leave through os._exit, so no
    # atexit hook runs. forkserver and spawn: the workers import the script and build a run
    # of their own.
    path = tmp_path / "records.jsonl"
    script = tmp_path / "train.py"
    script.write_text(MULTIPROCESSING_SCRIPT)
    proc = child(script, str(path), method)
    pid1, pid2, code1, code2 = map(int, proc.readline(timeout=60).split())
    assert (code1, code2) == (0, 0)
    assert proc.wait(timeout=30) == 0, proc.stderr()
    lines = FileTracker(path).lines()
    for pid in (pid1, pid2):
        steps = [p[2] for x in lines if x["pid"] == pid for p in x.get("points", [])]
        assert steps == list(range(100)), f"worker {pid} delivered {len(steps)} of 100 points"
    metadata = [(x["pid"], x["metadata"]) for x in lines if x["op"] == "metadata"]
    writers = sorted(pid for pid, m in metadata if m == {"buffered_in_parent": True})
    assert len(metadata) == len(writers)
    if method == "fork":
        assert writers == [proc.proc.pid]  # written by the parent, once
    else:  # the workers ran the module's top level: each built and closed a run of its own
        assert writers == sorted([proc.proc.pid, pid1, pid2])


# -- SIGTERM --------------------------------------------------------------------------------------

SIGTERM_SCRIPT = """
import json, signal, sys
from async_tracker import AppRun
from tests.faulty import FileTracker

path, mode = sys.argv[1], sys.argv[2]
logged = 0

if mode == "chained":
    def previous(signum, frame):
        # What had been delivered when this handler ran, and how much had been logged.
        seen = [p for x in FileTracker(path).lines() if x["op"] == "metrics" for p in x["points"]]
        with open(path + ".previous", "w") as f:
            json.dump({"signum": signum, "seen": len(seen), "logged": logged}, f)
        sys.exit(3)
    signal.signal(signal.SIGTERM, previous)

run = AppRun("r", [FileTracker(path)], flush_interval=3600)
run.add_metadata(state="training")
while True:
    run.log_metric("loss", float(logged), step=logged)
    logged += 1
    if logged == 1000:
        print("ready", flush=True)
"""


def delivered_steps(path: Path) -> list[int]:
    return [
        p[2] for x in FileTracker(path).lines() if x["op"] == "metrics" for p in x["points"]
    ]


def test_sigterm_flushes_then_runs_the_previous_handler(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    path = tmp_path / "records.jsonl"
    proc = child(SIGTERM_SCRIPT, str(path), "chained")
    assert proc.readline() == "ready"
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait() == 3, proc.stderr()  # the previous handler's sys.exit(3)
    previous = json.loads(Path(f"{path}.previous").read_text())
    assert previous["signum"] == signal.SIGTERM
    # Everything logged before the signal was delivered before the previous handler ran
    # (the signal may land between a log_metric and the counter's increment: one more).
    assert previous["logged"] >= 1000
    assert previous["logged"] <= previous["seen"] <= previous["logged"] + 1
    steps = delivered_steps(path)
    assert steps == list(range(previous["seen"]))  # each once, in order
    assert FileTracker(path).lines()[0]["metadata"] == {"state": "training"}


def test_sigterm_with_the_default_handler_closes_then_dies_by_the_signal(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    path = tmp_path / "records.jsonl"
    proc = child(SIGTERM_SCRIPT, str(path), "default")
    assert proc.readline() == "ready"
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait() == -signal.SIGTERM, proc.stderr()
    steps = delivered_steps(path)
    assert len(steps) >= 1000
    assert steps == list(range(len(steps)))  # no point lost in the middle, none twice


SIGTERM_IN_LOCK_SCRIPT = """
import os, signal, sys
from async_tracker import AppRun
from tests.faulty import FileTracker

run = AppRun("r", [FileTracker(sys.argv[1])], flush_interval=3600)
for i in range(10):
    run.log_metric("loss", float(i), step=i)
print("ready", flush=True)
# The signal lands while this thread holds the run's lock, as it does for a moment in its
# first write and in close(): the handler, run by this same thread, must not wait for it.
with run._start_lock:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100_000):
        pass
print("survived the signal", flush=True)
"""


def test_sigterm_while_the_run_holds_its_lock(tmp_path: Path, child: Callable[..., Child]) -> None:
    path = tmp_path / "records.jsonl"
    proc = child(SIGTERM_IN_LOCK_SCRIPT, str(path))
    assert proc.readline() == "ready"
    assert proc.wait(timeout=20) == -signal.SIGTERM, proc.stderr()
    assert delivered_steps(path) == list(range(10))


def test_sigterm_opt_out_leaves_the_signal_alone(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    # The control: without our handler, the buffered records die with the process, so the
    # tests above pass because of the handler, not by luck.
    path = tmp_path / "records.jsonl"
    proc = child(SIGTERM_SCRIPT, str(path), "default", ASYNC_TRACKER_HANDLE_SIGTERM="0")
    assert proc.readline() == "ready"
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait() == -signal.SIGTERM
    assert delivered_steps(path) == []


# -- interpreter exit -----------------------------------------------------------------------------

EXIT_SCRIPT = """
import sys, threading
from async_tracker import AppRun
from tests.faulty import FileTracker

run = AppRun("r", [FileTracker(sys.argv[1])], flush_interval=3600)
run.add_metadata(state="done")

def late_writer():
    # A non-daemon thread still logging when the main thread ends: the exit hook runs after
    # Python has joined it, so its points are delivered too.
    for i in range(500):
        run.log_metric("late", float(i), step=i)

for i in range(500):
    run.log_metric("loss", float(i), step=i)
threading.Thread(target=late_writer).start()
print("done", flush=True)
# No close(), no flush(): the interpreter's exit must deliver.
"""


def test_exit_at_interpreter_end_flushes(tmp_path: Path, child: Callable[..., Child]) -> None:
    path = tmp_path / "records.jsonl"
    proc = child(EXIT_SCRIPT, str(path))
    assert proc.readline() == "done"
    assert proc.wait() == 0, proc.stderr()
    lines = FileTracker(path).lines()
    points = [p for x in lines if x["op"] == "metrics" for p in x["points"]]
    assert [p[2] for p in points if p[0] == "loss"] == list(range(500))
    assert [p[2] for p in points if p[0] == "late"] == list(range(500))
    assert [x["metadata"] for x in lines if x["op"] == "metadata"] == [{"state": "done"}]
    assert proc.stderr().strip() == "stderr:"  # nothing went wrong on the way out


DROPPED_RUN_SCRIPT = """
import gc, sys
from async_tracker import AppRun
from tests.faulty import FileTracker

def train(path):
    run = AppRun("r", [FileTracker(path)], flush_interval=3600)
    for i in range(100):
        run.log_metric("loss", float(i), step=i)
    # returns without close(): the run object goes away, its records must not

train(sys.argv[1])
gc.collect()
print("done", flush=True)
"""


def test_exit_delivers_a_run_dropped_without_close(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    path = tmp_path / "records.jsonl"
    proc = child(DROPPED_RUN_SCRIPT, str(path))
    assert proc.readline() == "done"
    assert proc.wait() == 0, proc.stderr()
    assert delivered_steps(path) == list(range(100))
