"""``async-tracker export csv RUN... --out FILE``: every metric point as one CSV row
(run,name,step,value,time), read back exact with the csv module: float64 values and times,
NaN and infinities; runs in the order given, points in step order."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from async_tracker import AppRun
from async_tracker.adapters import as_sync
from async_tracker.cli.main import main
from async_tracker.cli.query import read_metrics
from async_tracker.init_run import open_store
from async_tracker.store.open import open_reader

A = "proj/a-1"
B = "proj/b-2"
# Values a shortest-decimal or %g writer would round: only repr keeps them exact.
TRICKY = [0.1 + 0.2, 1 / 3, 2.0**-1074, 1.7976931348623157e308, -0.0, 123456789.12345679]


def write(url: str) -> None:
    with AppRun(A, [open_store(url)]) as run:
        # Out of step order, as a resumed run may log them.
        for step, value in reversed(list(enumerate(TRICKY))):
            run.log_metric("loss", value, step=step)
        run.log_metric("grad", math.nan, step=0)
        run.log_metric("grad", math.inf, step=1)
        run.log_metric("grad", -math.inf, step=2)
    with AppRun(B, [open_store(url)]) as run:
        run.log_metric("loss", 0.5, step=3)


def parse(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "runs")
    write(url)
    out = tmp_path / "points.csv"
    # B first: runs come in the order given; A by a unique prefix.
    assert main(["--store", url, "export", "csv", B, "proj/a", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{B}: 1 points",
        f"{A}: 9 points",
        f"written: {out}",
    ]
    rows = parse(out.read_text(encoding="utf-8"))
    assert rows[0] == ["run", "name", "step", "value", "time"]
    body = rows[1:]
    assert [(r[0], r[1], int(r[2])) for r in body] == [
        (B, "loss", 3),
        (A, "grad", 0), (A, "grad", 1), (A, "grad", 2),
        *[(A, "loss", step) for step in range(len(TRICKY))],
    ]  # fmt: skip
    assert [r[3] for r in body[1:4]] == ["nan", "inf", "-inf"]
    values = [float(r[3]) for r in body[4:]]
    assert values == TRICKY
    assert [math.copysign(1, v) for v in values] == [math.copysign(1, v) for v in TRICKY]
    # Times: the stored client timestamps, exact.
    stored = read_metrics(open_reader(as_sync(open_store(url))), A)["loss"]
    assert [float(r[4]) for r in body[4:]] == [p.timestamp for p in stored]


def test_metrics_option_and_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "runs")
    write(url)
    args = ["--store", url, "export", "csv", A, B, "--out", "-", "--metrics", "loss,missing"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    rows = parse(out)
    assert rows[0] == ["run", "name", "step", "value", "time"]
    assert {r[1] for r in rows[1:]} == {"loss"}
    assert [r[0] for r in rows[1:]] == [A] * len(TRICKY) + [B]
    assert "no run exported has a metric 'missing'" in err

    assert main(["--store", url, "--json", "export", "csv", A, "--out", str(tmp_path / "x")]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "out": str(tmp_path / "x"),
        "runs": [{"run_id": A, "points": len(TRICKY) + 3}],
    }
    assert main(["--store", url, "export", "csv", A, "--out", "-", "--metrics", ","]) == 2
    assert "--metrics: no metric name" in capsys.readouterr().err


# Names a CSV writer must quote: each character the format gives meaning to, and the
# carriage return that the csv module leaves unquoted with a "\n" line terminator.
ODD_NAMES = ["a\rb", "c\nd", "e,f", 'g"h', "i\r\nj", " k ", "=SUM(A1)", "-x", "@y", "+z"]


def write_odd(url: str) -> None:
    with AppRun("proj/=odd,\r", [open_store(url)]) as run:
        for i, name in enumerate(ODD_NAMES):
            run.log_metric(name, float(i), step=i)


def test_every_character_round_trips_through_csv_and_pandas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "runs")
    write_odd(url)
    out = tmp_path / "odd.csv"
    assert main(["--store", url, "export", "csv", "proj/=odd", "--out", str(out)]) == 0
    assert capsys.readouterr().out.endswith(f"written: {out}\n")
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 1 + len(ODD_NAMES)  # no row split, none lost
    body = rows[1:]
    assert {r[1]: float(r[3]) for r in body} == {n: float(i) for i, n in enumerate(ODD_NAMES)}
    assert {r[0] for r in body} == {"proj/=odd,\r"}
    pandas = pytest.importorskip("pandas")
    frame = pandas.read_csv(out, keep_default_na=False)
    assert len(frame) == len(ODD_NAMES)
    assert sorted(frame["name"]) == sorted(ODD_NAMES)
    assert frame["step"].dtype.kind == "i" and frame["value"].dtype.kind == "f"


def test_spreadsheet_safe_makes_formula_cells_text(tmp_path: Path) -> None:
    url = str(tmp_path / "runs")
    write_odd(url)
    out = tmp_path / "safe.csv"
    args = ["--store", url, "export", "csv", "proj/=odd", "--out", str(out), "--spreadsheet-safe"]
    assert main(args) == 0
    with open(out, newline="", encoding="utf-8") as f:
        body = list(csv.reader(f))[1:]
    assert {r[0] for r in body} == {"proj/=odd,\r"}  # its first character is no formula's
    names = {r[1] for r in body}
    assert names == {"'" + n if n[0] in "=+-@" else n for n in ODD_NAMES}
    # Negative numbers are numbers, not formulas: left as they are.
    assert all(not r[3].startswith("'") for r in body)
