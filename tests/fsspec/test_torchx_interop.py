"""Interop with the real torchx package (from PyPI, in its own virtual environment):
torchx's ``FsspecTracker`` and ``torchx tracker list`` read what we write, and we read what
torchx wrote."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import fsspec
import pytest

import async_tracker
from async_tracker import AppRun
from async_tracker.backend.fsspec import CLAIM_FILE, FsspecTracker, encode_run_id

pytestmark = pytest.mark.timeout(600)  # the first run builds torchx's environment

READ_WITH_TORCHX = """
import json, sys, fsspec
from torchx.tracker.backend.fsspec import FsspecTracker
t = FsspecTracker(fsspec.filesystem("file"), sys.argv[1])
run_id, parent = sys.argv[2], sys.argv[3]
print(json.dumps({
    "run_ids": sorted(t.run_ids()),
    "children": sorted(t.run_ids(parent_run_id=parent)),
    "metadata": t.metadata(run_id),
    "artifacts": {k: [a.path, a.metadata] for k, a in t.artifacts(run_id).items()},
    "sources": sorted([s.source_run_id, s.artifact_name] for s in t.sources(run_id)),
}))
"""

WRITE_WITH_TORCHX = """
import sys, fsspec
from torchx.tracker.api import AppRun
from torchx.tracker.backend.fsspec import FsspecTracker
fs = fsspec.filesystem("file")
fs.mkdirs(sys.argv[1], exist_ok=True)
t = FsspecTracker(fs, sys.argv[1])
parent = AppRun("local://torchx/parent", [t])
parent.add_metadata(kind="parent")
run = AppRun("local://torchx/child", [t])
run.add_metadata(lr=0.1, layers=[1, 2])
run.add_metadata(lr=0.2)
run.add_artifact("model", "s3://b/model.pt", {"epoch": 7})
run.add_artifact("logs", "/var/log/x")
run.add_source("local://torchx/parent", "checkpoint")
"""

RUN = "local://ours/child"
PARENT = "local://ours/parent"


def write_ours(root: Path) -> None:
    tracker = FsspecTracker(fsspec.filesystem("file"), str(root))
    with AppRun(PARENT, [tracker]) as parent:
        parent.add_metadata(kind="parent")
    with AppRun(RUN, [tracker]) as run:
        for epoch in range(12):  # many flushes: torchx must still see the last write
            run.add_metadata(epoch=epoch, lr=0.1 * epoch)
            run.flush()
        run.add_metadata(config={"layers": [64, 64]})
        run.add_artifact("model", "/ckpt/m1.pt", {"epoch": 1})
        run.add_artifact("model", "/ckpt/m2.pt", {"epoch": 2})
        run.add_artifact("logs", "/logs")
        run.add_source(PARENT, "checkpoint")
        run.log_metric("loss", 0.5, step=1)  # metrics/ is ours; torchx must ignore it


def test_torchx_reads_what_we_write(tmp_path: Path, torchx_python: Path) -> None:
    root = tmp_path / "store"
    write_ours(root)
    out = subprocess.run(
        [str(torchx_python), "-c", READ_WITH_TORCHX, str(root), RUN, PARENT],
        check=True, capture_output=True, text=True,
    )
    seen = json.loads(out.stdout)
    assert seen["run_ids"] == sorted([RUN, PARENT])
    assert seen["children"] == [RUN]
    assert seen["metadata"] == {"epoch": 11, "lr": 0.1 * 11, "config": {"layers": [64, 64]}}
    assert seen["artifacts"] == {
        "model": ["/ckpt/m2.pt", {"epoch": 2}],
        "logs": ["/logs", None],
    }
    assert seen["sources"] == [[PARENT, "checkpoint"]]


def test_we_read_what_torchx_wrote(tmp_path: Path, torchx_python: Path) -> None:
    root = tmp_path / "store"
    subprocess.run([str(torchx_python), "-c", WRITE_WITH_TORCHX, str(root)], check=True)
    tracker = FsspecTracker(fsspec.filesystem("file"), str(root))
    child = "local://torchx/child"
    assert sorted(tracker.run_ids()) == ["local://torchx/child", "local://torchx/parent"]
    assert list(tracker.run_ids(parent_run_id="local://torchx/parent")) == [child]
    assert tracker.metadata(child) == {"lr": 0.2, "layers": [1, 2]}
    arts = tracker.artifacts(child)
    assert arts["model"].path == "s3://b/model.pt" and arts["model"].metadata == {"epoch": 7}
    assert arts["logs"].metadata is None
    assert [(s.source_run_id, s.artifact_name) for s in tracker.sources(child)] == [
        ("local://torchx/parent", "checkpoint")
    ]
    # Through AppRun too, and we can keep writing to a run torchx started.
    with AppRun(child, [tracker]) as run:
        run.add_metadata(lr=0.3)
        assert run.metadata() == {"lr": 0.3, "layers": [1, 2]}
        assert [s.parent.id for s in run.sources()] == ["local://torchx/parent"]


def test_torchx_cli_lists_what_we_write(tmp_path: Path, torchx_python: Path) -> None:
    root = tmp_path / "store"
    write_ours(root)
    cfg = tmp_path / "fsspec.cfg"
    cfg.write_text(f"protocol=file\nroot_path={root}\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".torchxconfig").write_text(
        f"[torchx:tracker]\nfsspec=fsspec\n\n[tracker:fsspec]\nconfig={cfg}\n"
    )
    torchx = str(torchx_python.parent / "torchx")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHX")}
    env["HOME"] = str(tmp_path)  # no ~/.torchxconfig of the machine's

    def cli(*args: str) -> str:
        return subprocess.run(
            [torchx, "tracker", "list", *args], cwd=work, env=env,
            check=True, capture_output=True, text=True,
        ).stdout

    jobs = cli("jobs")
    assert RUN in jobs and PARENT in jobs
    assert RUN in cli("jobs", "--parent-run-id", PARENT)
    assert PARENT not in cli("jobs", "--parent-run-id", PARENT)
    metadata = cli("metadata", RUN)
    assert "epoch" in metadata and "11" in metadata
    artifacts = cli("artifacts", "--artifact", "model", RUN)
    assert "/ckpt/m2.pt" in artifacts and "/logs" not in artifacts


def test_torchx_reads_a_run_that_init_claimed(tmp_path: Path, torchx_python: Path) -> None:
    """init() leaves claim.json in the run's folder: torchx's reader lists the run and reads
    its records as before, and the claim is not a run of its own."""
    root = tmp_path / "store"
    with async_tracker.init("p", dir=str(root), id=RUN, config={"lr": 0.1}, timeout=60) as run:
        run.add_source(PARENT, "checkpoint")
    with async_tracker.init("p", dir=str(root), id=PARENT, timeout=60):
        pass  # nothing but its claim and the project
    assert (root / encode_run_id(RUN) / CLAIM_FILE).is_file()
    out = subprocess.run(
        [str(torchx_python), "-c", READ_WITH_TORCHX, str(root), RUN, PARENT],
        check=True, capture_output=True, text=True,
    )
    seen = json.loads(out.stdout)
    assert seen["run_ids"] == sorted([RUN, PARENT])
    assert seen["children"] == [RUN]
    assert seen["metadata"] == {"project": "p", "lr": 0.1}
    assert seen["sources"] == [[PARENT, "checkpoint"]]
