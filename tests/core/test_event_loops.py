"""The tracker under every kind of caller: sync code, asyncio, uvloop, trio, nest_asyncio and
a Jupyter kernel, with sniffio importable (issue 13).

Each scenario runs in its own interpreter, because what is checked is process-wide: the
tracker loop, the exit hook, which threads keep a process alive. Each child writes to a
:class:`~tests.faulty.FileTracker` (one JSON line per backend write), and the test asserts
that every logged point is stored exactly once, that the child exits by itself with code 0,
and that nothing went to stderr as "Exception ignored" or a traceback. The subprocess timeout
is only a guard against a hang (the defects this file covers made processes hang forever).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.core.helpers import REPO, python_env
from tests.faulty import FileTracker

HANG_GUARD_S = 90.0

# What every child starts with. sys.argv[1] is the store (a JSON Lines file).
PRELUDE = """
import sys
import threading

from async_tracker import AppRun
from tests.faulty import BlockLoop, FaultyTracker, FileTracker, Hang

PATH = sys.argv[1]


def make(run_id, backend=None):
    # Nothing is delivered but by flush(), close() or the exit hook.
    return AppRun(run_id, [backend or FileTracker(PATH)], flush_interval=3600)


def log(run, start, stop):
    for i in range(start, stop):
        run.log_metric("x", float(i), step=i)


def steps(metrics):
    return [p.step for p in metrics["x"]]
"""


def run_child(tmp_path: Path, body: str) -> tuple[str, FileTracker]:
    """Runs PRELUDE + body in a new interpreter, asserts a clean exit by itself, and returns
    its stdout and its store."""
    store = FileTracker(tmp_path / "store.jsonl")
    script = PRELUDE + textwrap.dedent(body)
    stdout = run_guarded(["-c", script, str(store.path)], REPO, "the child")
    return stdout, store


def run_guarded(args: list[str], cwd: Path, what: str) -> str:
    """``python *args`` in ``cwd``, killed past the hang guard; asserts a clean exit by
    itself and returns its stdout."""
    try:
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=cwd,
            env=python_env(),
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{what} did not exit in {HANG_GUARD_S} s (killed); stdout:\n{exc.stdout!r}\n"
            f"stderr:\n{exc.stderr!r}"
        ) from None
    assert_clean_exit(proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def assert_clean_exit(returncode: int, stdout: str, stderr: str) -> None:
    context = f"exit code {returncode}; stdout:\n{stdout}\nstderr:\n{stderr}"
    assert returncode == 0, context
    assert "Exception ignored" not in stderr, context
    assert "Traceback" not in stderr, context
    assert stdout.rstrip().endswith("done"), context


def stored_steps(store: FileTracker, run_id: str) -> Counter[int]:
    """How many times each step of metric ``x`` of ``run_id`` was written to the store."""
    counts: Counter[int] = Counter()
    for line in store.lines():
        if line["op"] == "metrics" and line["run_id"] == run_id:
            counts.update(step for name, _value, step, _ts in line["points"] if name == "x")
    return counts


def assert_stored_once(store: FileTracker, run_id: str, n: int) -> None:
    counts = stored_steps(store, run_id)
    assert sorted(counts) == list(range(n)), f"missing: {sorted(set(range(n)) - set(counts))}"
    assert set(counts.values()) == {1}, f"stored twice: {[s for s, c in counts.items() if c > 1]}"


def need(module: str) -> Any:
    return pytest.importorskip(module, reason=f"{module} is not installed")


# -- (a) sniffio importable ------------------------------------------------------------------
# anyio asks sniffio, when it is importable, which library runs the current task; the tracker
# loop used to call a task-group method from a bare loop callback, where sniffio finds no task:
# nothing was ever delivered, and every flush, read and close hung.


def test_sync_flush_read_close_and_exit_hook_with_sniffio(tmp_path: Path) -> None:
    need("sniffio")
    _, store = run_child(
        tmp_path,
        """
        import sniffio  # importable, so anyio asks it

        run = make("sync")
        log(run, 0, 50)
        report = run.flush()
        assert report.ok and report.delivered == 50, report
        assert steps(run.metrics()) == list(range(50))
        # From another thread too.
        worker = threading.Thread(target=lambda: (log(run, 50, 100), run.flush()))
        worker.start()
        worker.join()
        log(run, 100, 120)
        report = run.close()
        assert report.ok and report.delivered == 120, report

        left_open = make("left-open")  # closed by the exit hook
        log(left_open, 0, 30)
        print("done")
        """,
    )
    assert_stored_once(store, "sync", 120)
    assert_stored_once(store, "left-open", 30)


def test_asyncio_aflush_reads_aclose_with_sniffio(tmp_path: Path) -> None:
    need("sniffio")
    _, store = run_child(
        tmp_path,
        """
        import asyncio
        import sniffio

        async def main():
            run = make("asyncio")
            log(run, 0, 50)
            run.add_metadata(lr=0.1)
            report = await run.aflush()
            assert report.ok and report.delivered == 51, report
            assert steps(await run.ametrics()) == list(range(50))
            assert await run.ametadata() == {"lr": 0.1}
            log(run, 50, 100)
            report = await run.aclose()
            assert report.ok and report.delivered == 101, report

            async with make("async-with") as run:
                log(run, 0, 40)
                assert steps(await run.ametrics()) == list(range(40))
                log(run, 40, 80)
            assert run.closed

        asyncio.run(main())
        print("done")
        """,
    )
    assert_stored_once(store, "asyncio", 100)
    assert_stored_once(store, "async-with", 80)


def test_trio_aflush_reads_aclose(tmp_path: Path) -> None:
    need("trio")  # trio depends on sniffio
    _, store = run_child(
        tmp_path,
        """
        import trio

        async def main():
            run = make("trio")
            log(run, 0, 50)
            report = await run.aflush()
            assert report.ok and report.delivered == 50, report
            assert steps(await run.ametrics()) == list(range(50))
            log(run, 50, 100)
            report = await run.aclose()
            assert report.ok and report.delivered == 100, report
            assert await run.aclose() is report

            async with make("async-with") as run:
                log(run, 0, 40)
                assert steps(await run.ametrics()) == list(range(40))
                log(run, 40, 80)
            assert run.closed
            # Nothing was started on trio's side: no worker thread waits for the tracker.
            names = [t.name for t in threading.enumerate()]
            assert not [n for n in names if "trio" in n.lower()], names

        trio.run(main)
        print("done")
        """,
    )
    assert_stored_once(store, "trio", 100)
    assert_stored_once(store, "async-with", 80)


# -- cancelling the caller -------------------------------------------------------------------
# A cancelled aflush() gives up its wait and leaves the run working; a cancelled aclose() gives
# up its wait, not the close, which a later aclose() waits for. On both loops.

CANCELLED_WAITS = """
first, later = threading.Event(), threading.Event()
hang_first, hang_later = Hang(first), Hang(later)
backend = FaultyTracker(FileTracker(PATH)).on("write_batch", 1, action=hang_first)
run = make("cancel", backend)


def check_after_flushes(report):
    assert report.ok and report.delivered == 20, report
    # From now on every write hangs until `later` is set: the close's write.
    backend.always("write_batch", hang_later)
    log(run, 20, 30)


def check_after_close(report):
    assert report.ok and report.delivered == 30, report
    # The close went on while its waiter was gone: nothing of it was cancelled.
    assert backend.count("write_batch", outcome="cancelled") == 0, backend.calls
"""


def test_cancelled_waits_on_asyncio(tmp_path: Path) -> None:
    _, store = run_child(
        tmp_path,
        CANCELLED_WAITS
        + """
import asyncio

async def cancel_when(coro, entered):
    task = asyncio.ensure_future(coro)
    await asyncio.to_thread(entered.wait)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return
    raise AssertionError("the wait was not cancelled")

async def main():
    log(run, 0, 10)
    await cancel_when(run.aflush(), hang_first.entered)
    first.set()
    log(run, 10, 20)
    check_after_flushes(await run.aflush())
    await cancel_when(run.aclose(), hang_later.entered)
    assert run.closed
    later.set()
    check_after_close(await run.aclose())

asyncio.run(main())
print("done")
""",
    )
    assert_stored_once(store, "cancel", 30)


def test_cancelled_waits_on_trio(tmp_path: Path) -> None:
    need("trio")
    _, store = run_child(
        tmp_path,
        CANCELLED_WAITS
        + """
import trio

async def cancel_when(fn, entered):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fn)
        await trio.to_thread.run_sync(entered.wait)
        nursery.cancel_scope.cancel()
    assert nursery.cancel_scope.cancelled_caught

async def main():
    log(run, 0, 10)
    await cancel_when(run.aflush, hang_first.entered)
    first.set()
    log(run, 10, 20)
    check_after_flushes(await run.aflush())
    await cancel_when(run.aclose, hang_later.entered)
    assert run.closed
    later.set()
    check_after_close(await run.aclose())

trio.run(main)
print("done")
""",
    )
    assert_stored_once(store, "cancel", 30)


# -- a tracker loop blocked by a misbehaving backend -----------------------------------------
# aclose() still answers (bounded, as close() is), and writers of other runs are not blocked:
# submit() hands work to the loop without waiting for it.

BLOCKED_LOOP = """
release = threading.Event()
block = BlockLoop(release)
blocked = make("blocked", FaultyTracker(FileTracker(PATH)).on("write_batch", 1, action=block))
blocked.log_metric("y", 1.0)
blocked.flush(timeout=0)  # hands the batch to the lane, which then blocks the loop
assert block.entered.wait(30)
"""

BLOCKED_LOOP_MAIN = """
    report = await blocked.aclose(timeout=0.1)
    assert report.timed_out and not report.ok, report
    other = make("other")  # its first write submits its registration to the blocked loop
    log(other, 0, 20)
    release.set()
    report = await other.aclose()
    assert report.ok and report.delivered == 20, report
"""


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_aclose_answers_while_the_tracker_loop_is_blocked(tmp_path: Path, library: str) -> None:
    if library == "trio":
        need("trio")
    _, store = run_child(
        tmp_path,
        BLOCKED_LOOP
        + f"import {library}\n\nasync def main():\n{BLOCKED_LOOP_MAIN}\n"
        + f"{library}.run(main{'()' if library == 'asyncio' else ''})\nprint('done')\n",
    )
    assert_stored_once(store, "other", 20)


# -- (b) nest_asyncio ---------------------------------------------------------------------------
# aclose() used to wait in an anyio worker thread of the caller's loop: a non-daemon thread
# that nest_asyncio's patched loop never stops, so the process never exited.


@pytest.mark.parametrize("leave", ["aclose", "async_with"])
def test_nest_asyncio_process_exits(tmp_path: Path, leave: str) -> None:
    need("nest_asyncio")
    body = """
        import asyncio
        import nest_asyncio

        nest_asyncio.apply()

        async def inner(run):
            log(run, 50, 100)
            report = await run.aflush()
            assert report.ok and report.delivered == 100, report
            return steps(await run.ametrics())

        async def main():
            run = make("nested")
            log(run, 0, 50)
            assert (await run.aflush()).ok
            # What nest_asyncio is for: a nested run of the same loop.
            assert asyncio.get_event_loop().run_until_complete(inner(run)) == list(range(100))
            log(run, 100, 150)
            {leave}

        asyncio.run(main())
        print("done")
        """
    leave_code = {
        "aclose": "assert (await run.aclose()).ok",
        "async_with": "async with run:\n                assert not run.closed",
    }[leave]
    _, store = run_child(tmp_path, body.replace("{leave}", leave_code))
    assert_stored_once(store, "nested", 150)


# -- (c) uvloop ----------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop does not run on Windows")
def test_uvloop_policy(tmp_path: Path) -> None:
    need("uvloop")
    _, store = run_child(
        tmp_path,
        """
        import asyncio
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

        async def main():
            assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
            run = make("uvloop")
            log(run, 0, 50)
            report = await run.aflush()
            assert report.ok and report.delivered == 50, report
            assert steps(await run.ametrics()) == list(range(50))
            async with run:
                log(run, 50, 100)
            assert run.closed

        asyncio.run(main())
        print("done")
        """,
    )
    assert_stored_once(store, "uvloop", 100)


# -- (d) a Jupyter kernel -------------------------------------------------------------------
# nbclient drives a real ipykernel (headless) from a child interpreter: a sync flush() in a
# cell, a top-level `await run.aflush()`, then points logged and left to the kernel's shutdown
# (no close): its exit hook must deliver them, and the kernel must exit by itself.

NOTEBOOK_DRIVER = """
import sys

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

repo, path, nest = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
cells = [
    f'''import sys
sys.path.insert(0, {repo!r})
if {nest!r}:
    import nest_asyncio
    nest_asyncio.apply()
import sniffio
from async_tracker import AppRun
from tests.faulty import FileTracker
run = AppRun("nb", [FileTracker({path!r})], flush_interval=3600)
for i in range(0, 50):
    run.log_metric("x", float(i), step=i)
report = run.flush()
assert report.ok and report.delivered == 50, report''',
    '''for i in range(50, 100):
    run.log_metric("x", float(i), step=i)
report = await run.aflush()
assert report.ok and report.delivered == 100, report
assert [p.step for p in (await run.ametrics())["x"]] == list(range(100))''',
    '''for i in range(100, 150):
    run.log_metric("x", float(i), step=i)''',
]
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
# IPC, not TCP: a TCP kernel picks free ports and binds them later, which other processes of
# a busy machine can take first (zmq: "Address already in use"). IPC sockets are files here.
km = KernelManager(kernel_name="python3", transport="ipc")
km.start_kernel()  # the kernel's stderr is ours: the test reads it
kernel = km.provisioner.process
try:
    # A cell error raises here (CellExecutionError), with the cell's traceback.
    NotebookClient(nb, km=km, timeout=60).execute()
    # Shut down as Jupyter does, and wait for the kernel to exit by itself.
    km.request_shutdown()
    code = kernel.wait(60)
finally:
    if kernel.poll() is None:
        kernel.kill()
    km.cleanup_resources()
print("kernel exit code", code)
assert code == 0
print("done")
"""


@pytest.mark.parametrize("nest", [False, True], ids=["plain", "nest_asyncio"])
def test_jupyter_kernel(tmp_path: Path, nest: bool) -> None:
    need("sniffio")
    need("nbclient")
    need("ipykernel")
    if nest:
        need("nest_asyncio")
    store = FileTracker(tmp_path / "store.jsonl")
    run_guarded(
        ["-c", NOTEBOOK_DRIVER, str(REPO), str(store.path), str(int(nest))],
        tmp_path,
        "the notebook",
    )
    assert_stored_once(store, "nb", 150)
