"""The summary a run prints when it ends with records not delivered: at ``close()``, at the
end of a ``with`` block (clean or on an exception) and at interpreter exit, once per run, at
most five lines on stderr ending with the exact ``async-tracker sync`` command, which then
delivers them; the process's exit code stays the program's own.

The store is "down" for good: its directory lies below a regular file (ENOTDIR, which the
backend keeps retrying and then spools). Removing that file brings the store back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest

from async_tracker.backend.fsspec import FsspecTracker
from tests.core.helpers import Child, python_env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")

SCRIPT = """
import sys
from async_tracker import AppRun
from async_tracker.init_run import open_store

store, spool, mode = sys.argv[1], sys.argv[2], sys.argv[3]
run = AppRun("job", [open_store(store)], spool_dir=spool, flush_interval=3600, close_timeout=0.5)
for i in range(100):
    run.log_metric("loss", float(i), step=i)
if mode == "close":
    run.close()
    run.close()  # idempotent, and says nothing twice
elif mode == "with":
    with run:
        run.log_metric("loss", 100.0, step=100)
elif mode == "with-error":
    with run:
        raise ValueError("the training failed")
# "exit": nothing; the exit hook closes the run
print("end of script", flush=True)
"""


@pytest.mark.parametrize(
    ("mode", "code", "points"),
    [("close", 0, 100), ("with", 0, 101), ("with-error", 1, 100), ("exit", 0, 100)],
)
def test_a_run_left_undelivered_says_so_once_with_the_sync_command(
    tmp_path: Path, child: Callable[..., Child], mode: str, code: int, points: int
) -> None:
    blocker, spool = tmp_path / "blocker", tmp_path / "spool"
    blocker.write_text("a file where the store's parent directory should be")
    store = blocker / "runs"
    proc = child(SCRIPT, str(store), str(spool), mode)
    assert proc.wait(60) == code, proc.stderr()  # the program's own exit code
    err = proc.stderr().removeprefix("stderr:\n")
    if mode == "with-error":
        assert "ValueError: the training failed" in err  # the exception still propagates
    else:
        assert proc.readline() == "end of script"
    assert err.count("ended with records not delivered") == 1, err
    summary = err[err.index("async_tracker: run 'job' ended") :].splitlines()[:5]
    assert f"{points} spooled" in summary[0], summary
    command = f"async-tracker sync {spool} --to file://{store}"
    last = next(line for line in summary if "deliver them" in line)
    assert last.strip() == f"deliver them: {command}", summary
    assert summary.index(last) < 5

    # The command, as printed, delivers every point once the store is back.
    blocker.unlink()
    sync = subprocess.run(
        [sys.executable, "-m", "async_tracker", *command.split()[1:]],
        env=python_env(), capture_output=True, text=True, timeout=120,
    )
    assert sync.returncode == 0, sync.stderr
    stored = FsspecTracker(fsspec.filesystem("file"), str(store)).metrics("job")
    assert sorted(p.step for p in stored["loss"]) == list(range(points))
