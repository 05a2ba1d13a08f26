"""``list jobs`` from run summaries: newest first, ``--limit`` with a footer saying how many
were left out, PARAMS showing the params that differ between the runs listed, and ``--json``
with every field of each run's summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from async_tracker import AppRun
from async_tracker.cli.main import main
from async_tracker.init_run import open_store

IDS = [f"sweep/lr-{i}" for i in range(5)]


@pytest.fixture
def url(tmp_path: Path) -> str:
    root = str(tmp_path / "runs")
    for i, run_id in enumerate(IDS):  # one after another: each starts after the one before
        with AppRun(run_id, [open_store(root)], heartbeat_s=0) as run:
            run.add_metadata(lr=10.0 ** -(i + 1), epochs=3, model="mlp")
            for step in range(4):
                run.log_metric("loss", 1.0 / (i + step + 1), step=step)
    return root


def test_newest_first_limited_with_a_footer(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "jobs", "--store", url, "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:4]] == [IDS[4], IDS[3]]
    assert lines[4] == "(3 older runs not shown: --limit N shows more, --limit 0 all)"
    assert len(lines) == 5
    # PARAMS: lr differs between the runs listed; epochs and model do not.
    assert "lr=1e-05" in lines[2] and "lr=0.0001" in lines[3]
    assert "epochs=" not in lines[2] and "model=" not in lines[2]


def test_the_default_limit_lists_these_runs_all(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "jobs", "--store", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == IDS[::-1]  # no footer


def test_json_has_every_field_newest_first(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", "list", "jobs", "--store", url, "--limit", "0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == IDS[::-1]
    row = rows[-1]
    assert row["params"] == {"lr": 0.1, "epochs": 3, "model": "mlp"}
    assert row["status"] == "finished" and row["end"] >= row["start"]
    assert row["metrics"] == {"loss": 0.25}
    assert row["metric_summaries"] == {
        "loss": {"last": 0.25, "min": 0.25, "max": 1.0, "count": 4, "last_step": 3}
    }
    assert {"heartbeat", "tags", "note", "duration_s"} <= set(row)


def test_json_with_a_limit_says_what_was_left_out_on_stderr(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--json", "list", "jobs", "--store", url, "--limit", "1"]) == 0
    out = capsys.readouterr()
    assert [r["run_id"] for r in json.loads(out.out)] == [IDS[4]]
    assert "4 older runs not listed" in out.err


def test_a_negative_limit_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "jobs", "--store", url, "--limit", "-1"]) == 2
    assert "--limit" in capsys.readouterr().err
