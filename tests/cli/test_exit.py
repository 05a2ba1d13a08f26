"""How ``async-tracker`` ends as a process (``cli.main.entry``): its output whole through a
pipe, the exit hooks run, then ``os._exit`` without the interpreter's teardown; the usual
exit where the teardown has more to do. And ``list jobs`` never loads numpy or pyarrow
(the metric codec loads at the first read of points)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import fsspec

from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.cli.main import main
from tests.cli.conftest import child_env


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    """A child interpreter with stdout and stderr to pipes, block-buffered as a program's
    output to a pipe is (not ``PYTHONUNBUFFERED``): what an exit that skips the teardown
    must still flush."""
    env = child_env()
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_listing_through_a_pipe_is_whole(tmp_path: Path) -> None:
    root = str(tmp_path / "runs")
    store = FsspecTracker(fsspec.filesystem("file"), root)
    ids = [f"many/run-{i:03d}" for i in range(300)]
    for i, run_id in enumerate(ids):
        # A long param: the output is many pipe buffers (64 KiB) long.
        store.add_metadata(run_id, lr=i, note_text="x" * 500)
    done = run_python("-m", "async_tracker", "--json", "list", "jobs", "--limit", "0",
                      "--store", root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert sorted(r["run_id"] for r in rows) == ids
    assert all(r["params"]["note_text"] == "x" * 500 for r in rows)
    done = run_python("-m", "async_tracker", "list", "jobs", "--limit", "0", "--store", root)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2 + len(ids)
    # An error: its line on stderr, its exit code.
    done = run_python("-m", "async_tracker", "list", "metadata", "nope", "--store", root)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("async-tracker: unknown run id 'nope'")


EXIT_HOOKS = """
import atexit, sys
from async_tracker.cli.main import exit_now

atexit.register(lambda: print("the hook ran"))  # buffered, flushed after the hooks
sys.stdout.write("x" * 200_000 + "\\n")
sys.stderr.write("to stderr\\n")
exit_now(3)
"""


def test_exit_now_runs_the_exit_hooks_and_flushes_what_they_wrote() -> None:
    done = run_python("-c", EXIT_HOOKS)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "x" * 200_000 + "\nthe hook ran\n"
    assert done.stderr == "to stderr\n"


NOT_A_DAEMON = """
import threading
from async_tracker.cli.main import exit_now

go = threading.Event()

def late() -> None:
    go.wait()
    print("the thread ended")

threading.Thread(target=late).start()
go.set()
exit_now(0)
"""


def test_exit_now_waits_for_a_thread_that_is_not_a_daemon() -> None:
    # As the interpreter does: such a thread ends before the process does.
    done = run_python("-c", NOT_A_DAEMON)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the thread ended\n"


LOADED = """
import sys
from async_tracker.cli.main import main

def loaded() -> list[str]:
    return [name for name in ("numpy", "pyarrow") if name in sys.modules]

root, run_id = sys.argv[1], sys.argv[2]
assert main(["list", "jobs", "--store", root]) == 0
print(loaded(), flush=True)
assert main(["list", "metrics", run_id, "--store", root]) == 0
print(loaded(), flush=True)
"""


def test_list_jobs_loads_neither_numpy_nor_pyarrow(tmp_path: Path) -> None:
    """They load at the first read of points (a tenth of a second and more of a listing's
    time otherwise)."""
    root = str(tmp_path / "runs")
    with AppRun("r/1", [FsspecTracker(fsspec.filesystem("file"), root)], heartbeat_s=0) as run:
        for step in range(5):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
    done = run_python("-c", LOADED, root, "r/1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].split()[0] == "r/1"  # list jobs
    assert lines[3] == "[]"
    metrics = lines[4:-1]  # list metrics: loaded for it, in a worker thread
    assert metrics[2].split() == ["loss", "0.2", "0.2", "1", "5", "4"], metrics
    assert lines[-1] == "['numpy', 'pyarrow']"


def test_the_console_script_is_the_entry_that_python_dash_m_runs() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'async-tracker = "async_tracker.cli.main:entry"' in pyproject
    main_module = Path(__file__).resolve().parents[2] / "async_tracker" / "__main__.py"
    assert "entry()" in main_module.read_text()


def test_a_read_command_in_this_process_leaves_the_collector_on(tmp_path: Path) -> None:
    """The collector is off while a read command reads (see cli.common.collector_paused),
    and on again after when the command ran in a process that goes on (``main()``)."""
    root = str(tmp_path / "runs")
    FsspecTracker(fsspec.filesystem("file"), root).add_metadata("r/1", lr=0.1)
    assert gc.isenabled()
    assert main(["list", "jobs", "--store", root]) == 0
    assert gc.isenabled()
