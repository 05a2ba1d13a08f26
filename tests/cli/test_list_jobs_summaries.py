"""``list jobs`` from run summaries: newest first, ``--limit`` with a footer saying how many
were left out, PARAMS showing the params that differ between the runs listed, and ``--json``
with every field of each run's summary."""

from __future__ import annotations

import io
import json
import sys
import tracemalloc
from pathlib import Path

import fsspec
import pytest

from async_tracker import AppRun
from async_tracker.backend.fsspec import FsspecTracker
from async_tracker.cli.common import MAX_CELL_CHARS, MAX_ID_CHARS, table, to_json
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


class Writes(io.StringIO):
    """stdout, keeping each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_a_huge_param_is_cut_in_the_table_and_streamed_whole_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "runs")
    store = FsspecTracker(fsspec.filesystem("file"), root)
    huge = {"blob": "x" * 2_000_000, "layers": [64, 64]}
    many = [f"many/run-{i:03d}" for i in range(200)]
    for i, run_id in enumerate(many):
        store.add_metadata(run_id, lr=i, **({"config": huge} if i == 100 else {}))

    # The table: each cell cut, so its lines (and the memory it takes) are bounded by what
    # it shows, not 200 rows padded to the 2 MB cell.
    tracemalloc.start()
    try:
        assert main(["list", "jobs", "--store", root, "--limit", "0"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(many)
    assert max(map(len, lines)) <= MAX_ID_CHARS + 5 * (MAX_CELL_CHARS + 2)
    assert peak < 40_000_000, peak  # a few copies of the one 2 MB value at most
    (row,) = [line for line in lines if line.startswith("many/run-100 ")]
    params = row.split("  ")[-1].strip()
    assert params.startswith('lr=100 config={"blob": "xxx') and "x...x" in params
    assert params.endswith('xxx", "layers": [64, 64]}') and len(params) == MAX_CELL_CHARS

    # --json: every run whole, printed a run's row at a time, the same text as one document.
    out = Writes()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["--json", "list", "jobs", "--store", root, "--limit", "0"]) == 0
    text = out.getvalue()
    rows = json.loads(text)
    assert sorted(r["run_id"] for r in rows) == many
    (big,) = [r for r in rows if r["run_id"] == "many/run-100"]
    assert big["params"] == {"lr": 100, "config": huge}
    assert text == to_json(rows) + "\n"
    assert len([w for w in out.writes if '"run_id"' in w]) == len(many)


def test_a_cell_is_cut_in_the_middle_to_one_bounded_line() -> None:
    long_id = "proj/" + "k" * 500 + "-a1b2c3"
    value = "line\nbreak\tand " + "v" * 500 + "/last.ckpt"
    text = table(["ID", "VALUE"], [[long_id, value], ["a", 1.5]])
    _, _, first, second = text.splitlines()
    shown_id, shown_value = first[:MAX_ID_CHARS], first[MAX_ID_CHARS + 2 :]
    assert shown_id.startswith("proj/kkk") and "k...k" in shown_id
    assert shown_id.endswith("k-a1b2c3") and len(shown_id) == MAX_ID_CHARS
    assert shown_value.startswith("line break and vvv") and "v...v" in shown_value
    assert shown_value.endswith("v/last.ckpt") and len(shown_value) == MAX_CELL_CHARS
    assert second.rstrip() == "a" + " " * (MAX_ID_CHARS + 1) + "1.5"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("lr>0 or " * 500, "column 4001: expected a condition after 'or'"),
        ("(" * 300, "column 101: parentheses nest deeper than 100 levels"),
        ("lr>" + "1" * 5000, "column 4: the number '111"),
    ],
)
def test_a_filter_too_long_deep_or_large_is_one_line(
    url: str, capsys: pytest.CaptureFixture[str], text: str, where: str
) -> None:
    assert main(["list", "jobs", "--store", url, "--filter", text]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert where in line and len(line) < 200 and not out.out


def test_a_filter_of_thousands_of_conditions_lists(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    many = " or ".join(f"lr=={10.0 ** -(i + 1)!r}" for i in (1, 3)) + " or lr<0" * 3000
    assert ids(capsys, "--store", url, "--filter", many) == [IDS[3], IDS[1]]
