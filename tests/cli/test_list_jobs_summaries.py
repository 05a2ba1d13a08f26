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
    assert lines[4] == "(3 more runs not shown: --limit N shows more, --limit 0 all)"
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
    assert "4 more runs not listed" in out.err


def test_a_negative_limit_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "jobs", "--store", url, "--limit", "-1"]) == 2
    assert "--limit" in capsys.readouterr().err


def ids(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(["--json", "list", "jobs", *argv]) == 0
    return [r["run_id"] for r in json.loads(capsys.readouterr().out)]


def test_filter_and_sort_over_params_metrics_and_tags(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # loss of run i at its last step: 1 / (i + 4); lr of run i: 10^-(i+1).
    assert ids(capsys, "--store", url, "--filter", "lr>=0.001") == IDS[2::-1]
    assert ids(capsys, "--store", url, "--filter", "loss.last<0.15 and not lr<2e-5") == [
        IDS[3]
    ]
    assert ids(capsys, "--store", url, "--sort", "loss.min") == IDS[::-1]
    assert ids(capsys, "--store", url, "--sort=-lr", "--limit", "2") == IDS[:2]
    with AppRun(IDS[1], [open_store(url)], heartbeat_s=0, _replay=True) as run:
        run.add_tags("baseline")
        run.set_note("the good one")
    assert ids(capsys, "--store", url, "--filter", "tag:baseline or status==crashed") == [
        IDS[1]
    ]
    assert ids(capsys, "--store", url, "--filter", 'note~"GOOD"') == [IDS[1]]
    assert main(["--json", "list", "jobs", "--store", url, "--filter", "tag:baseline"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["tags"] == ["baseline"] and row["note"] == "the good one"
    assert not any(k.startswith("async_tracker.") for k in row["params"])


def test_a_bad_filter_is_one_line_saying_where(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", "jobs", "--store", url, "--filter", "lr > and x"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column 6" in err[0], err
