"""Jobs that torchx's own runner launches (the real ``torchx`` package, its local scheduler,
two replicas of one role): the replicas share each run a script names with ``init(name=...)``,
a child of the job's run that torchx's reader finds; and a job launched with no tracker
configured says, once in each replica, that ``AppRun.run_from_env()`` records nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from async_tracker.backend.fsspec import FsspecTracker
from tests.torchx.conftest import TorchxChild

pytestmark = pytest.mark.timeout(600)  # the first run builds torchx's venv

# Launches the script argv[1] as two replicas of one role with torchx's runner (the local
# scheduler, in the working directory: .torchxconfig there configures the trackers, as for
# `torchx run`), waits for them, then reads the store argv[3] (if any) with torchx's reader.
LAUNCH = """
import json, sys
import fsspec
from torchx import specs
from torchx.runner import get_runner
from torchx.tracker.backend.fsspec import FsspecTracker as TorchxFsspecTracker

script, log_dir = sys.argv[1], sys.argv[2]
role = specs.Role(
    "worker", image=".", entrypoint=sys.executable, args=[script, specs.macros.replica_id],
    num_replicas=2,
)
with get_runner() as runner:
    handle = runner.run(specs.AppDef("train", roles=[role]), "local_cwd", cfg={"log_dir": log_dir})
    state = str(runner.wait(handle, wait_interval=0.1).state)
seen = {"handle": handle, "state": state}
if len(sys.argv) > 3:
    reader = TorchxFsspecTracker(fsspec.filesystem("file"), sys.argv[3])
    seen["children"] = sorted(reader.run_ids(parent_run_id=handle))
print(json.dumps(seen))
"""

# A replica: the job's run, and a run of the sweep that both replicas open.
REPLICA = """
import sys
import async_tracker
from async_tracker import AppRun

rank = sys.argv[1]
AppRun.run_from_env().add_metadata(**{f"rank{rank}": True})
with async_tracker.init("p", name="sweep", config={"lr": 0.1}) as run:
    run.log_metric(f"loss/rank{rank}", 0.5, step=0)
"""

# A replica of a job with no tracker configured.
UNTRACKED_REPLICA = """
from async_tracker import AppRun

run = AppRun.run_from_env()
for step in range(3):
    run.log_metric("loss", 1.0, step=step)
run.add_metadata(lr=0.1)
"""


def stderr_logs(log_dir: Path) -> list[str]:
    """What each replica wrote on stderr (torchx's local scheduler keeps it in the log dir)."""
    logs = sorted(log_dir.rglob("stderr.log"))
    assert len(logs) == 2, logs
    return [path.read_text() for path in logs]


def test_the_replicas_of_a_torchx_job_share_each_named_run(
    torchx_child: TorchxChild, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    config = tmp_path / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store}\n")
    (tmp_path / ".torchxconfig").write_text(
        f"[torchx:tracker]\nfsspec =\n\n[tracker:fsspec]\nconfig = {config}\n"
    )
    (tmp_path / "replica.py").write_text(REPLICA)
    log_dir = tmp_path / "logs"
    seen = torchx_child(
        LAUNCH,
        "replica.py",
        str(log_dir),
        str(store),
        env={
            "HOME": str(tmp_path),
            # torchx's venv has no entry points of ours: "fsspec" would be torchx's own
            # tracker (which stores no metrics). This names ours, under torchx's name.
            "ASYNC_TRACKER_FACTORY_FSSPEC": "async_tracker.backend.fsspec:create",
        },
    )
    assert seen["state"] == "SUCCEEDED", stderr_logs(log_dir)
    job = seen["handle"]
    assert job.startswith("local_cwd://")
    (child,) = seen["children"]  # torchx's reader finds it as the job's child
    assert child.startswith("p/sweep-")
    tracker = FsspecTracker(LocalFileSystem(), str(store))
    assert set(tracker.run_ids()) == {job, child}
    assert tracker.metadata(job) == {"rank0": True, "rank1": True}
    assert set(tracker.metrics(child)) == {"loss/rank0", "loss/rank1"}
    assert tracker.metadata(child) == {"project": "p", "lr": 0.1}
    assert [s.source_run_id for s in tracker.sources(child)] == [job]
    for err in stderr_logs(log_dir):
        assert f"run {child} (a child of the job's run {job})" in err


def test_a_torchx_job_without_trackers_says_once_that_nothing_is_recorded(
    torchx_child: TorchxChild, tmp_path: Path
) -> None:
    (tmp_path / "replica.py").write_text(UNTRACKED_REPLICA)
    log_dir = tmp_path / "logs"
    seen = torchx_child(LAUNCH, "replica.py", str(log_dir), env={"HOME": str(tmp_path)})
    assert seen["state"] == "SUCCEEDED", stderr_logs(log_dir)
    for err in stderr_logs(log_dir):
        said = [line for line in err.splitlines() if "not recorded" in line]
        assert len(said) == 1, err
        assert seen["handle"] in said[0] and "TORCHX_TRACKERS" in said[0]
    assert not (tmp_path / "tracker_runs").exists()
