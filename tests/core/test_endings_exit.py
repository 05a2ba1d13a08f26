"""How a run ends when its process does: Ctrl-C (a real SIGINT), SIGTERM, an uncaught
exception, with or without a ``with`` block, on asyncio, and when a pool terminates its
forked workers. Each scenario runs a real child process, signalled with ``os.kill``; what the
store then says is read back as a user would (``Store(dir).runs()``)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker import Store
from async_tracker.store.summary import RunSummary
from tests.core.helpers import Child

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes and signals")

# argv: the store, the mode. Says "ready" once it has logged, then waits for the test's signal
# in short sleeps: Python runs a signal's handler between bytecodes, so a signal that lands
# just before a blocking call that never returns (a read of stdin) would never be handled.
SCRIPT = """
import asyncio, signal, sys, time
# Ctrl-C as in a terminal, whatever this process inherited: a child started in the background
# by a shell without job control has SIGINT ignored, and Python then keeps it ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
import async_tracker

store, mode = sys.argv[1], sys.argv[2]

def ready():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)

if mode == "handler-exits":
    # A SIGTERM handler of the user's that exits cleanly: the SIGTERM still ended the run.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))

if mode == "asyncio":
    async def main():
        async with async_tracker.init("job", dir=store, quiet=True) as run:
            run.log({"loss": 1.0}, step=0)
            print("ready", flush=True)
            await asyncio.Event().wait()  # asyncio.run cancels this task on Ctrl-C
    asyncio.run(main())
elif mode in ("with", "handler-exits"):
    with async_tracker.init("job", dir=store, quiet=True) as run:
        run.log({"loss": 1.0}, step=0)
        ready()
else:  # no with block, no close(): the exit hook ends the run
    run = async_tracker.init("job", dir=store, quiet=True)
    run.log({"loss": 1.0}, step=0)
    if mode == "raise":
        raise ValueError("loss went to NaN")
    ready()
"""

Start = Callable[..., Child]


def the_run(root: Path) -> RunSummary:
    (run,) = Store(str(root)).runs()
    return run


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        ("with", "KeyboardInterrupt"),
        ("bare", "KeyboardInterrupt"),  # the exit hook's close
        # asyncio.run turns Ctrl-C into its main task's cancellation: what the block sees.
        ("asyncio", "asyncio.exceptions.CancelledError"),
    ],
)
def test_ctrl_c_ends_the_run_killed(tmp_path: Path, child: Start, mode: str, cause: str) -> None:
    root = tmp_path / "runs"
    job = child(SCRIPT, str(root), mode)
    assert job.readline(60) == "ready"
    os.kill(job.proc.pid, signal.SIGINT)
    # Python ends a process on an uncaught KeyboardInterrupt by SIGINT, after its exit hooks.
    assert job.wait(60) == -signal.SIGINT, job.stderr()
    run = the_run(root)
    assert run.status == "killed"
    if mode == "asyncio" and sys.version_info < (3, 11):
        # Before 3.11 asyncio.run has no SIGINT handler: the KeyboardInterrupt is raised in
        # whatever the loop runs when the signal lands. In the task's own step the block sees
        # it; in the loop's select, asyncio.run's clean-up cancels the task instead.
        assert run.cause in ("KeyboardInterrupt", cause)
    else:
        assert run.cause == cause
    assert run.metrics["loss"].count == 1


def test_an_uncaught_exception_ends_the_run_failed_with_its_type_and_message(
    tmp_path: Path, child: Start
) -> None:
    root = tmp_path / "runs"
    job = child(SCRIPT, str(root), "raise")
    assert job.wait(60) == 1
    run = the_run(root)
    assert (run.status, run.cause) == ("failed", "ValueError: loss went to NaN")


@pytest.mark.parametrize(("mode", "code"), [("with", -signal.SIGTERM), ("handler-exits", 0)])
def test_sigterm_ends_the_run_killed_whatever_handles_it(
    tmp_path: Path, child: Start, mode: str, code: int
) -> None:
    root = tmp_path / "runs"
    job = child(SCRIPT, str(root), mode)
    assert job.readline(60) == "ready"
    os.kill(job.proc.pid, signal.SIGTERM)
    assert job.wait(60) == code, job.stderr()
    run = the_run(root)
    assert (run.status, run.cause) == ("killed", "SIGTERM")


# A job whose forked pool workers log to its run; leaving the pool's block terminates them
# (SIGTERM). argv: the store.
POOL = """
import sys, time
from multiprocessing import get_context
import async_tracker

run = async_tracker.init("job", dir=sys.argv[1], quiet=True)

def work(task):
    run.log({f"task{task}": 1.0}, step=0)
    started.put(None)
    while True:  # idle until the pool terminates it
        time.sleep(0.01)

if __name__ == "__main__":
    context = get_context("fork")
    started = context.Queue()
    with context.Pool(2) as pool:
        for task in range(2):
            pool.apply_async(work, (task,))
        for _ in range(2):
            started.get()
    run.log({"loss": 1.0}, step=0)
    run.close()
"""


def test_workers_a_pool_terminates_leave_the_jobs_ending_to_the_job(
    tmp_path: Path, child: Start
) -> None:
    root = tmp_path / "runs"
    job = child(POOL, str(root))
    assert job.wait(120) == 0, job.stderr()
    run = the_run(root)
    # The workers ended their share of the run (their points are there); the job finished.
    assert set(run.metrics) == {"task0", "task1", "loss"}
    assert (run.status, run.cause) == ("finished", "")
