"""The runtime in its host's process: Ctrl-C, SIGTERM during close, pool workers, lock files,
a close under heavy write contention (issue 13). Each scenario runs in a real child process
and states what must hold: every completed call stored exactly once or reported, the process
exits by itself, nothing "ignored" on stderr.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from async_tracker import AppRun, TrackerClosedError
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.pipeline.overflow import Block
from tests.core.helpers import Child, thread_status
from tests.faulty import DictTracker, FaultyTracker, FileTracker, Hang

MakeRun = Callable[..., AppRun]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes and signals")


def points_of(path: Path) -> list[int]:
    return [p[2] for x in FileTracker(path).lines() if x["op"] == "metrics" for p in x["points"]]


def replay(path: Path, spool: Path, run_id: str) -> None:
    """What the next start of the job does with the same spool directory."""
    with AppRun(run_id, [FileTracker(path, name="files")], spool_dir=str(spool)) as run:
        assert run.flush(30).ok


CTRL_C_SCRIPT = """
import signal, sys, threading
# Ctrl-C as in a terminal, whatever this process inherited: a job started in the background
# by a shell without job control has SIGINT ignored, and Python then keeps it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
from async_tracker import AppRun
from tests.faulty import FaultyTracker, FileTracker, Hang

path, spool, mode = sys.argv[1], sys.argv[2], sys.argv[3]
files = FileTracker(path, name="files")
if mode == "overload":
    # A stalled backend and a small bound: the run is overloaded when Ctrl-C lands.
    release = threading.Event()
    backend = FaultyTracker(files, name="files").on("write_batch", 1, action=Hang(release))
    run = AppRun("job", [backend], spool_dir=spool, max_buffered=2000, batch_size=100,
                 close_timeout=2)
else:
    run = AppRun("job", [files], spool_dir=spool, batch_size=100)
done = 0
try:
    while True:
        if done % 3 == 0:
            run.log_metrics({"m": float(done)}, step=done)
        else:
            run.log_metric("m", float(done), step=done)
        done += 1
        if done == 5000:
            print("ready", flush=True)
except KeyboardInterrupt:
    print(done, flush=True)
"""


@pytest.mark.parametrize("mode", ["plain", "overload"])
def test_ctrl_c_at_any_moment_keeps_every_completed_call(
    tmp_path: Path, child: Callable[..., Child], mode: str
) -> None:
    # Seven trials catch a failure that happens one time in seven with p > 0.6; the race is
    # where the signal lands, and each trial waits a different, seeded number of loops.
    rng = random.Random(13)
    for trial in range(7):
        path, spool = tmp_path / f"{trial}.jsonl", tmp_path / f"spool{trial}"
        proc = child(CTRL_C_SCRIPT, str(path), str(spool), mode)
        assert proc.readline() == "ready"
        for _ in range(rng.randrange(1, 2000)):  # a seeded, varying moment to interrupt
            pass
        proc.proc.send_signal(signal.SIGINT)
        completed = int(proc.readline())
        assert proc.wait() == 0, proc.stderr()
        err = proc.proc.stderr.read().decode() if proc.proc.stderr else ""
        assert "Exception ignored" not in err and "Traceback" not in err, err
        replay(path, spool, "job")  # what exit spooled comes back at the next start
        steps = points_of(path)
        # Every completed call, once and in order; the interrupted call may be kept too.
        assert steps[:completed] == list(range(completed)), f"trial {trial} (seed 13)"
        assert len(steps) in (completed, completed + 1), (trial, len(steps), completed)


# A close that waits on a store that never answers (close_timeout=600): Ctrl-C once the close
# has begun, either in the caller's close() ("close") or in the exit hook's ("exit").
CTRL_C_DURING_CLOSE = """
import os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
from async_tracker import AppRun
from tests.faulty import FaultyTracker, Hang

spool, where = sys.argv[1], sys.argv[2]
hung = FaultyTracker(name="files").always("write_batch", Hang())
run = AppRun("job", [hung], spool_dir=spool, batch_size=100, close_timeout=600)
for i in range(1000):
    run.log_metric("m", float(i), step=i)

def interrupt_once_closing():
    # The close has begun (its future exists) when the main thread waits for it, or is
    # about to: Ctrl-C then lands in the wait, or just before it, both inside the close.
    while run._close_future is None:
        threading.Event().wait(0.001)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_closing, daemon=True).start()
print("closing", flush=True)
if where == "close":
    run.close()
"""


@pytest.mark.parametrize("where", ["close", "exit"])
def test_ctrl_c_during_a_close_spools_at_once_and_says_where(
    tmp_path: Path, child: Callable[..., Child], where: str
) -> None:
    # Ctrl-C while a close waits for a store that never answers: the close ends now, not at
    # its timeout (600 s, which the child's wait below would not outlast), what is not
    # delivered is spooled and the exit says where; the next start delivers all of it once.
    spool = tmp_path / "spool"
    proc = child(CTRL_C_DURING_CLOSE, str(spool), where)
    assert proc.readline() == "closing"
    code = proc.wait(120)
    err = proc.stderr()
    # In close(): the interrupt goes on to the caller (exit by SIGINT, as Python's own);
    # at exit: Python keeps the program's status, and no traceback is printed.
    assert code == (-signal.SIGINT if where == "close" else 0), err
    if where == "exit":
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert "interrupted at exit" in err, err
    assert "1000 spooled" in err and f"async-tracker sync {spool}" in err, err
    path = tmp_path / "out.jsonl"
    replay(path, spool, "job")
    assert points_of(path) == list(range(1000))


SIGTERM_DURING_CLOSE = """
import sys
from async_tracker import AppRun
from tests.faulty import FaultyTracker, FileTracker, Slow

path, spool = sys.argv[1], sys.argv[2]
slow = FaultyTracker(FileTracker(path), name="files").always("write_batch", Slow(0.02))
run = AppRun("job", [slow], spool_dir=spool, batch_size=100, flush_interval=3600)
for i in range(5000):
    run.log_metric("m", float(i), step=i)
print("closing", flush=True)
report = run.close(60)
print("closed", report.ok, flush=True)
"""


def test_sigterm_while_close_is_under_way_waits_for_that_close(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    path, spool = tmp_path / "out.jsonl", tmp_path / "spool"
    proc = child(SIGTERM_DURING_CLOSE, str(path), str(spool))
    assert proc.readline() == "closing"
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM, proc.stderr()
    replay(path, spool, "job")
    steps = points_of(path)
    assert sorted(set(steps)) == list(range(5000))  # none lost, across the replay
    assert len(steps) - len(set(steps)) <= 100  # at most the batch in flight, twice


# The workers log, then each is kept busy (in a sleep loop) while the pool is terminated:
# a worker idle in multiprocessing's task lock can miss the SIGTERM altogether, a CPython race
# the README states as a limit, and a test must not hang on it.
POOL_SCRIPT = """
import sys, time
from multiprocessing import get_context
from async_tracker import AppRun
from tests.faulty import FileTracker

run = AppRun("job", [FileTracker(sys.argv[1])], flush_interval=3600)
run.add_metadata(parent=True)

def work(task):
    for i in range(100):
        run.log_metric(f"task{task}", float(i), step=i)
    return task

def busy():
    started.put(None)  # the queue the fork inherited
    while True:
        time.sleep(0.01)

if __name__ == "__main__":
    context = get_context("fork")
    started = context.Queue()
    with context.Pool(2) as pool:  # leaving the block terminates the workers
        print(sorted(pool.map(work, range(6))), flush=True)
        for _ in range(2):  # one per worker: a worker in busy() takes no other task
            pool.apply_async(busy)
        for _ in range(2):
            started.get()
    run.close()
"""


def test_pool_workers_records_survive_the_pools_exit(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    path = tmp_path / "out.jsonl"
    script = tmp_path / "pool.py"
    script.write_text(POOL_SCRIPT)
    proc = child(script, str(path))
    assert proc.readline(timeout=60) == "[0, 1, 2, 3, 4, 5]"
    assert proc.wait(60) == 0, proc.stderr()
    lines = FileTracker(path).lines()
    for task in range(6):
        points = [p for x in lines if x["op"] == "metrics" for p in x["points"]]
        steps = [p[2] for p in points if p[0] == f"task{task}"]
        assert steps == list(range(100)), f"task {task}: {len(steps)} of 100 points"
    parents = [x for x in lines if x["op"] == "metadata"]
    assert len(parents) == 1  # the parent's record, written once: not by the workers


def test_a_clean_close_leaves_no_lock_file(make_run: MakeRun, tmp_path: Path) -> None:
    release = threading.Event()
    stuck = FaultyTracker(InMemoryTracker(), name="s").on("write_batch", 1, action=Hang(release))
    run = make_run("r", [stuck], spool_dir=str(tmp_path), durable=True)
    run.log_metric("m", 1.0, step=0)
    run.flush(0)
    assert stuck.wait_for("write_batch", 1)
    assert list(tmp_path.rglob("*.lock"))  # held while the run lives
    release.set()
    assert run.close(30).ok
    assert list(tmp_path.rglob("*.lock")) == [] and list(tmp_path.rglob("*.seg")) == []


def test_close_under_heavy_write_contention_counts_every_write(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    counts = [0] * 16
    go = threading.Barrier(17)

    def write(t: int) -> None:
        go.wait()
        try:
            while True:
                run.log_metrics({f"t{t}": float(counts[t])}, step=counts[t])
                counts[t] += 1
        except TrackerClosedError:
            pass

    threads = [threading.Thread(target=write, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    go.wait()
    report = run.close(5)
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert report.delivered + report.pending + report.spooled == sum(counts), report
    assert json.dumps(report.errors) == "{}"
    for t in range(16):
        assert [p.step for p in mem.points("r", f"t{t}")] == list(range(counts[t]))
    assert os.getpid() > 0


def test_close_from_the_tracker_loop_itself_does_not_wait_for_itself(
    make_run: MakeRun,
) -> None:
    # A backend's code (on the tracker loop) closes the run: it gets an answer at once, the
    # close goes on, and a later close() elsewhere has the final report.
    mem = InMemoryTracker()
    answers: list[object] = []

    class Closing(FaultyTracker):
        async def write_batch(self, run_id: str, batch: Any) -> None:
            await super().write_batch(run_id, batch)
            if not answers:
                answers.append(run.close(5))

    run = make_run("r", [Closing(mem, name="closing")])
    run.log_metric("m", 1.0, step=0)
    run.flush(0)
    final = run.close(30)
    assert len(answers) == 1 and final.ok and final.delivered == 1
    assert run.close() is final


# A parent with our SIGTERM handler forks children and SIGTERMs each at once, before it has
# run at all (as Pool.terminate() does to a worker that a loaded machine has not scheduled
# yet). Without SIGTERM blocked across the fork, CPython's reset of the child's signal state
# dropped the signal: the child lived on (nearly always the first child here), and a pool
# waited for it forever.
FORK_SIGTERM_SCRIPT = """
import os, signal, sys, time
from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker

run = AppRun("job", [InMemoryTracker()])  # installs the SIGTERM handler
run.log_metric("m", 1.0)
run.flush()
survived = 0
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        # Not reached before the signal is handled, if it was not lost (it is delivered when
        # the fork hooks unblock it): the length of this wait does not matter.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    survived += os.waitstatus_to_exitcode(status) == 0
    if survived:
        break
print(f"survived {survived}", flush=True)
run.close()
"""


def test_a_sigterm_sent_to_a_forked_child_before_it_ran_is_never_lost(
    child: Callable[..., Child]
) -> None:
    proc = child(FORK_SIGTERM_SCRIPT, "40")
    assert proc.readline(timeout=120) == "survived 0", proc.stderr()
    assert proc.wait(60) == 0, proc.stderr()


def _blocked_signals(native_id: int) -> set[int]:
    """The signals a thread of this process blocks, from Linux's /proc."""
    mask = int(thread_status("self", native_id)["SigBlk"], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_our_threads_leave_sigterm_and_ctrl_c_to_the_main_thread(make_run: MakeRun) -> None:
    # A process-wide signal goes to any thread that does not block it: taken by one of ours,
    # the main thread (maybe asleep in a blocking call) would never run its handler.
    run = make_run("r", [InMemoryTracker(name="m"), DictTracker(name="d")])  # d: a worker's
    run.add_metadata(a=1)
    assert run.flush().ok
    ours = [t for t in threading.enumerate() if t.name.startswith("async-tracker")]
    kinds = {t.name.split("-")[2] for t in ours}
    assert kinds >= {"loop", "spool", "worker"}, [t.name for t in ours]
    for thread in ours:
        assert thread.native_id is not None
        assert {signal.SIGTERM, signal.SIGINT} <= _blocked_signals(thread.native_id), thread.name
    # The caller's mask is as it was.
    assert threading.main_thread().native_id is not None
    assert signal.SIGTERM not in _blocked_signals(threading.main_thread().native_id)


def test_a_close_in_a_signal_handler_on_top_of_a_seal_in_the_same_thread_ends(
    make_run: MakeRun,
) -> None:
    # SIGTERM's handler runs in the main thread on top of what that thread was doing: maybe
    # an exit hook's close, inside the seal of the run (holding the lock of the event that
    # blocked writers wait on). The handler closes the run again, which seals it again: with a
    # plain threading.Event, the thread waited for itself forever (a pool worker that never
    # died on Pool.terminate()).
    run = make_run("r", [InMemoryTracker()], overflow="block")
    run.log_metric("m", 1.0)
    assert run.flush().ok
    pipeline = run._pipeline
    assert pipeline is not None and isinstance(pipeline.overflow, Block)
    room = pipeline.overflow.room
    reports: list[Any] = []

    def interrupted_seal() -> None:
        with room._cond:  # inside set(), as the signal lands
            reports.append(run.close(timeout=5))  # the handler's close

    thread = threading.Thread(target=interrupted_seal, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "close() waited for a lock its own thread held"
    # Nor did the tracker loop wait for that lock when its close sealed the run again.
    assert reports[0].ok and reports[0].delivered == 1 and not reports[0].timed_out
