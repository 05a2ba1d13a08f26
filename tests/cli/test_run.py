"""``run``: the job's environment (as torchx's runner sets it), end to end with a child that
calls ``AppRun.run_from_env()``, exit codes, and SIGINT/SIGTERM forwarded to the job.

Children say when they are ready on their stdout (the launcher keeps it for them); the tests
wait for that line, never for a fixed time."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from async_tracker.cli.main import main
from async_tracker.cli.run import default_name
from async_tracker.tags import ENDING_KEY
from tests.cli.conftest import PARENT, Store, child_env, write_torchxconfig

RUN_ID = re.compile(r"local://async_tracker/(?P<name>.+)-[a-z0-9]{10}")

# Records a run the way a torchx job does; exits with the code given as its argument.
RECORDING_JOB = """
import sys
from async_tracker import AppRun
run = AppRun.run_from_env()
run.add_metadata(argv=sys.argv[1:])
for step in range(3):
    run.log_metric("loss", 1.0 / (step + 1), step=step)
report = run.close()
print(run.id, report.ok)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""

# Says "ready" once its handlers are in place, then reports the signal it gets and exits 7.
SIGNAL_JOB = """
import signal, sys, time
def on_signal(signum, frame):
    print("got", signum, flush=True)
    sys.exit(7)
signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)
print("ready", flush=True)
while True:  # sleeps, not signal.pause(): see tests/core/helpers.py
    time.sleep(0.01)
"""

# Logs without its own handler: async_tracker's SIGTERM handler flushes, then the default
# action ends the job.
TRACKED_SIGNAL_JOB = """
import time
from async_tracker import AppRun
run = AppRun.run_from_env()
run.log_metric("loss", 0.5, step=0)
run.add_metadata(state="running")
print("ready", flush=True)
while True:  # sleeps, not signal.pause(): see tests/core/helpers.py
    time.sleep(0.01)
"""


def dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["--json", "run", "--dry-run", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return data


# -- the job's environment -------------------------------------------------------------------


def test_environment_from_torchxconfig(
    configured: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    data = dry_run(capsys, "--name", "train", "--parent-run-id", PARENT, "--", "python", "t.py")
    env = data["env"]
    assert isinstance(env, dict)
    match = RUN_ID.fullmatch(env.pop("TORCHX_JOB_ID"))
    assert match and match["name"] == "train"
    assert env == {
        "TORCHX_TRACKERS": "fsspec",
        "TORCHX_TRACKER_FSSPEC_CONFIG": str(configured.config),
        "TORCHX_PARENT_RUN_ID": PARENT,
    }
    assert data["command"] == ["python", "t.py"]


def test_run_ids_are_unique(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    ids = {dry_run(capsys, "--", "true")["run_id"] for _ in range(20)}
    assert len(ids) == 20


def test_environment_from_flags(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    data = dry_run(capsys, "--tracker", "fsspec", "--config", str(store.config), "--", "true")
    env = data["env"]
    assert isinstance(env, dict)
    assert env["TORCHX_TRACKERS"] == "fsspec"
    assert env["TORCHX_TRACKER_FSSPEC_CONFIG"] == str(store.config)
    assert "TORCHX_PARENT_RUN_ID" not in env


def test_factory_value_goes_in_its_own_variable(
    store: Store, isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_torchxconfig(isolated, store, name="mine", factory="tests.cli.factories:create")
    env = dry_run(capsys, "--", "true")["env"]
    assert isinstance(env, dict)
    assert env["TORCHX_TRACKERS"] == "mine"
    assert env["TORCHX_TRACKER_MINE_CONFIG"] == str(store.config)
    assert env["ASYNC_TRACKER_FACTORY_MINE"] == "tests.cli.factories:create"


def test_parent_from_the_environment(
    configured: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHX_PARENT_RUN_ID", "from-env")
    env = dry_run(capsys, "--", "true")["env"]
    assert isinstance(env, dict) and env["TORCHX_PARENT_RUN_ID"] == "from-env"
    env = dry_run(capsys, "--parent-run-id", "from-flag", "--", "true")["env"]
    assert isinstance(env, dict) and env["TORCHX_PARENT_RUN_ID"] == "from-flag"


def test_dry_run_text(configured: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", "--", "python", "train.py", "--lr", "0.1 x"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "python train.py --lr '0.1 x'"
    assert f"TORCHX_TRACKER_FSSPEC_CONFIG={configured.config}" in lines
    assert RUN_ID.fullmatch(lines[0].removeprefix("TORCHX_JOB_ID="))


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "examples/train_loop.py", "--dir", "x"], "train_loop"),
        (["/usr/bin/python3.11", "-m", "pkg.trainer"], "trainer"),
        (["python", "-c", "print()"], "python"),
        (["./run job.sh"], "run-job"),
        (["torchrun", "--nproc-per-node=2", "t.py"], "torchrun"),
    ],
)
def test_default_name(command: list[str], name: str) -> None:
    assert default_name(command) == name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--name", "a/b", "--", "true"], "--name 'a/b'"),
        (["run"], "run needs a command"),
        (["run", "--"], "run needs a command"),
        (["--tracker", "no_such_tracker", "run", "--", "true"], "no tracker factory named"),
    ],
)
def test_refused_before_launching(
    configured: Store, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# -- end to end ------------------------------------------------------------------------------


def test_job_records_its_run(
    writable_store: Store, isolated: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    write_torchxconfig(isolated, writable_store)
    argv = ["run", "--name", "e2e", "--parent-run-id", PARENT, "--"]
    assert main([*argv, sys.executable, "-c", RECORDING_JOB]) == 0
    out, err = capfd.readouterr()
    run_id = err.strip().removeprefix("async-tracker: run ")
    assert RUN_ID.fullmatch(run_id), err
    assert out == f"{run_id} True\n"  # the job's stdout is its own

    tracker = writable_store.tracker()
    # The parent's directory holds only its descendants (it ran elsewhere): not a run here.
    assert set(tracker.run_ids()) == {run_id}
    assert [s.source_run_id for s in tracker.sources(run_id)] == [PARENT]
    assert list(tracker.run_ids(parent_run_id=PARENT)) == [run_id]
    assert [p.value for p in tracker.metrics(run_id)["loss"]] == [1.0, 0.5, 1.0 / 3]
    # ... and the CLI reads it back.
    assert main(["--json", "list", "metrics", run_id]) == 0
    assert json.loads(capfd.readouterr().out)["loss"]["count"] == 3


def test_exit_code_is_the_jobs(
    writable_store: Store, isolated: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    write_torchxconfig(isolated, writable_store)
    assert main(["run", "--", sys.executable, "-c", RECORDING_JOB, "3"]) == 3
    assert "exited with code 3" in capfd.readouterr().err
    assert main(["run", "--", "no-such-command-anywhere"]) == 127
    assert "cannot run 'no-such-command-anywhere'" in capfd.readouterr().err


def test_json_events_on_stderr(
    writable_store: Store, isolated: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    write_torchxconfig(isolated, writable_store)
    assert main(["--json", "run", "--", sys.executable, "-c", "raise SystemExit(4)"]) == 4
    out, err = capfd.readouterr()
    assert out == ""
    start, end = (json.loads(line) for line in err.splitlines())
    assert start["command"][1:] == ["-c", "raise SystemExit(4)"]
    assert end == {"run_id": start["run_id"], "exit_code": 4}


def test_job_builds_a_factory_named_by_value(
    writable_store: Store,
    isolated: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_torchxconfig(isolated, writable_store, name="mine", factory="tests.cli.factories:create")
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    assert main(["run", "--", sys.executable, "-c", RECORDING_JOB]) == 0
    run_id = capfd.readouterr().err.strip().removeprefix("async-tracker: run ")
    assert [p.value for p in writable_store.tracker().metrics(run_id)["loss"]] == [1.0, 0.5, 1 / 3]


# -- signals: a launcher in a child process ---------------------------------------------------


class Launcher:
    """``python -m async_tracker run -- JOB`` with pipes; no terminal, so a SIGINT sent to
    the launcher is forwarded (a terminal's Ctrl-C would reach the job by itself)."""

    def __init__(self, cwd: Path, *command: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "async_tracker", "run", "--", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=child_env(),
        )

    def readline(self, timeout_s: float = 30.0) -> str:
        """The job's next stdout line, waiting on the pipe with a deadline."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        line = b""
        deadline = time.monotonic() + timeout_s
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.proc.kill()
                raise AssertionError(f"no line from the job in {timeout_s} s")
            byte = os.read(fd, 1)  # one byte at a time: nothing read past the line stays
            if not byte:
                _, err = self.proc.communicate(timeout=30)
                raise AssertionError(f"the job ended before a line: {err.decode()}")
            line += byte
        return line.decode()

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded(configured: Store, isolated: Path, signum: int) -> None:
    launcher = Launcher(isolated, sys.executable, "-c", SIGNAL_JOB)
    assert launcher.readline() == "ready\n"
    launcher.proc.send_signal(signum)
    code, out, err = launcher.finish()
    assert out == f"got {int(signum)}\n", err
    assert code == 7, err
    assert "Traceback" not in err


def test_sigterm_flushes_the_jobs_run(writable_store: Store, isolated: Path) -> None:
    write_torchxconfig(isolated, writable_store)
    launcher = Launcher(isolated, sys.executable, "-c", TRACKED_SIGNAL_JOB)
    assert launcher.readline() == "ready\n"
    launcher.proc.send_signal(signal.SIGTERM)
    code, _, err = launcher.finish()
    assert code == 128 + signal.SIGTERM, err  # the job died of SIGTERM, as shells report it
    run_id = err.splitlines()[0].removeprefix("async-tracker: run ")
    tracker = writable_store.tracker()
    assert [p.value for p in tracker.metrics(run_id)["loss"]] == [0.5]
    # What ended the run goes with its end record (see runtime/ending.py).
    ending = {"reason": "killed", "message": "SIGTERM"}
    assert tracker.metadata(run_id) == {"state": "running", ENDING_KEY: ending}


# Records a run with init(), as a script written for W&B-like use would.
INIT_JOB = """
import async_tracker
with async_tracker.init("proj", config={"lr": 0.1}) as run:
    run.log({"loss": 0.5}, step=0)
print(run.id)
"""


@pytest.mark.parametrize("job", [RECORDING_JOB, INIT_JOB], ids=["run_from_env", "init"])
def test_with_nothing_configured_the_job_records_to_the_default_store(
    isolated: Path, capfd: pytest.CaptureFixture[str], job: str
) -> None:
    # No .torchxconfig, no TORCHX_*: the job's run goes where every command reads by default,
    # and init() in the job takes the launcher's run id and parent.
    argv = ["run", "--name", "plain", "--parent-run-id", PARENT, "--", sys.executable, "-c"]
    assert main([*argv, job]) == 0
    out, err = capfd.readouterr()
    run_id = err.splitlines()[0].removeprefix("async-tracker: run ")
    assert RUN_ID.fullmatch(run_id), err
    assert out.split()[0] == run_id
    assert main(["--json", "list", "jobs"]) == 0
    (row,) = json.loads(capfd.readouterr().out)
    assert row["run_id"] == run_id and row["status"] == "finished"
    assert main(["--json", "lineage", run_id]) == 0
    assert [p["run_id"] for p in json.loads(capfd.readouterr().out)["parents"]] == [PARENT]


def test_run_takes_store_like_every_command(
    isolated: Path, writable_store: Store, capfd: pytest.CaptureFixture[str]
) -> None:
    # --store wins over what .torchxconfig configures, as for the read commands.
    write_torchxconfig(isolated, writable_store)
    other = isolated / "other-store"
    argv = ["--store", str(other), "run", "--", sys.executable, "-c", RECORDING_JOB]
    assert main(argv) == 0
    run_id = capfd.readouterr().out.split()[0]
    assert main(["--json", "--store", str(other), "list", "jobs"]) == 0
    assert [r["run_id"] for r in json.loads(capfd.readouterr().out)] == [run_id]
    assert not writable_store.root.exists()
