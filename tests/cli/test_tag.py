"""``async-tracker tag RUN [+TAG] [-TAG] [--note TEXT]``: changes a run's tags and note in its
store, prints them, and leaves the run's status alone (a finished run stays finished, a live
one is neither ended nor kept alive by it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import async_tracker
from async_tracker import AppRun
from async_tracker.backend.fsspec import HEARTBEAT_DIR, encode_run_id
from async_tracker.cli.main import main
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime
from tests.cli.conftest import cli


def status(root: Path, run_id: str) -> tuple[str, float | None]:
    return runtime().loop.call(open_store(root).run_status, run_id, None)


def tag(root: Path, *args: str) -> int:
    return main(["--store", str(root), "tag", *args])


def reader(root: Path, run_id: str) -> AppRun:
    return AppRun(run_id, [open_store(root)])


def test_tag_adds_removes_prints_and_a_finished_run_stays_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    with async_tracker.init("p", name="job", dir=root, tags=["seed"]) as run:
        run.log_metric("loss", 1.0, step=0)
    before = status(root, run.id)
    assert before[0] == "finished"
    capsys.readouterr()

    # By a unique prefix; "-h" removes the tag "h" (only --help is help).
    assert tag(root, "p/jo", "+baseline", "+h", "-seed", "--note", "the first good one") == 0
    assert capsys.readouterr().out.splitlines() == [
        f"run:  {run.id}",
        "tags: baseline h",
        "note: the first good one",
    ]
    assert tag(root, "p/", "-h", "--add", "v2", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {
        "run_id": run.id,
        "tags": ["baseline", "v2"],
        "note": "the first good one",
    }
    # Without changes: prints them.
    assert tag(root, run.id) == 0
    assert "tags: baseline v2" in capsys.readouterr().out
    assert tag(root, run.id, "--note", "") == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["tags: baseline v2"]

    assert reader(root, run.id).tags() == {"baseline", "v2"}
    assert reader(root, run.id).metadata() == {"project": "p"}
    # The run is as it was: finished, at the time it finished.
    assert status(root, run.id) == before


def test_tagging_a_live_run_neither_ends_it_nor_beats_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    job = AppRun("live/job", [open_store(root)], heartbeat_s=0)
    job.add_tags("from-the-job")
    job.log_metric("loss", 1.0, step=0)
    assert job.flush(30).ok
    assert status(root, job.id) == ("running", None)

    result = cli("--store", str(root), "tag", "live/", "+from-the-cli", "--note", "watch it")
    assert result.returncode == 0, result.stderr
    assert "tags: from-the-cli from-the-job" in result.stdout
    # Still running: no end record sealed, no heartbeat of its own left behind.
    assert status(root, job.id) == ("running", None)
    assert not (root / encode_run_id(job.id) / HEARTBEAT_DIR).exists()

    # The job goes on, sees the command's change and keeps its own.
    assert job.tags() == {"from-the-job", "from-the-cli"} and job.note() == "watch it"
    job.remove_tags("from-the-cli")
    job.close(30)
    assert status(root, job.id)[0] == "finished"
    assert reader(root, job.id).tags() == {"from-the-job"}


def test_bad_arguments_change_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    with async_tracker.init("p", name="job", dir=root, tags=["seed"]) as run:
        run.log_metric("loss", 1.0, step=0)
    capsys.readouterr()
    assert tag(root, run.id, "+fine", "+not/this") == 2
    assert "'not/this'" in capsys.readouterr().err
    assert tag(root, run.id, "+both", "-both") == 2
    assert "'both' is both added and removed" in capsys.readouterr().err
    assert tag(root, run.id, "plain") == 2
    assert "expected +TAG or -TAG, got 'plain'" in capsys.readouterr().err
    assert tag(root, "nope/", "+x") == 2
    assert "unknown run id 'nope/'" in capsys.readouterr().err
    # Other commands still refuse words they do not know.
    assert main(["--store", str(root), "list", "jobs", "-x"]) == 2
    assert reader(root, run.id).tags() == {"seed"}
