"""``async_tracker.Store``: the runs of a store as summaries, filtered and sorted with the
language of ``list jobs``, one run by id or prefix, and metric points as a long DataFrame
(or plain rows without pandas); on local disk and on moto's S3."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from async_tracker import AppRun, FilterError, Store
from async_tracker.init_run import open_store

IDS = [f"sweep/lr-{i}" for i in range(4)]


def write_sweep(url: str) -> None:
    for i, run_id in enumerate(IDS):
        with AppRun(run_id, [open_store(url)], heartbeat_s=0) as run:
            run.add_metadata(lr=[0.1, 0.01, 0.001, 0.0001][i], model="mlp")
            run.add_tags(*(["baseline"] if i == 0 else []))
            for step in range(3):
                run.log_metric("loss", 1.0 / (i + step + 1), step=step)
            run.log_metric("acc", math.nan if i == 3 else 0.5 + i / 10, step=0)


def check_store(store: Store) -> None:
    assert [r.run_id for r in store.runs()] == IDS[::-1]  # newest first
    best = store.runs(filter="status==finished and loss.min<0.25", sort="loss.min")
    assert [r.run_id for r in best] == [IDS[3], IDS[2]]
    assert [r.run_id for r in store.runs(sort="-lr", limit=2)] == IDS[:2]
    assert [r.run_id for r in store.runs(filter="tag:baseline")] == [IDS[0]]
    run = store.run("sweep/lr-2")
    assert run.params == {"lr": 0.001, "model": "mlp"} and run.status == "finished"
    assert run.metrics["loss"].count == 3 and run.metrics["loss"].min == 1.0 / 5
    assert store.run("sweep/lr-1").tags == frozenset()
    with pytest.raises(KeyError, match="4 runs"):
        store.run("sweep/")
    with pytest.raises(KeyError, match="no run"):
        store.run("nope")
    with pytest.raises(FilterError, match="column"):
        store.runs(filter="loss.min<")


def test_runs_and_run_on_local_disk(tmp_path: Path) -> None:
    url = str(tmp_path / "runs")
    write_sweep(url)
    check_store(Store(url))


def test_runs_and_run_on_s3(s3_url: str) -> None:
    write_sweep(s3_url)
    check_store(Store(s3_url))


def test_metrics_as_a_long_dataframe(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    url = str(tmp_path / "runs")
    write_sweep(url)
    frame = Store(url).metrics([IDS[1], IDS[3]], names=["loss", "acc"])
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == ["run", "name", "step", "value", "time"]
    loss = frame[frame["name"] == "loss"]
    assert list(loss["run"]) == [IDS[1]] * 3 + [IDS[3]] * 3
    assert list(loss["step"]) == [0, 1, 2] * 2
    assert list(loss["value"]) == [1.0 / (i + s + 1) for i in (1, 3) for s in range(3)]
    acc = frame[frame["name"] == "acc"]
    assert acc["value"].iloc[0] == 0.6 and math.isnan(acc["value"].iloc[1])
    assert (frame["time"] > 1.6e9).all()
    assert list(Store(url).metrics(IDS[0], names=["acc"])["value"]) == [0.5]
    with pytest.raises(KeyError, match="no run"):
        Store(url).metrics(["sweep/none"])


def test_metrics_without_pandas_are_plain_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "runs")
    write_sweep(url)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    rows = Store(url).metrics(IDS[0], names=["loss"])
    assert [(r["run"], r["name"], r["step"], r["value"]) for r in rows] == [
        (IDS[0], "loss", s, 1.0 / (s + 1)) for s in range(3)
    ]


def test_a_negative_limit_and_two_stores_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="limit"):
        Store(str(tmp_path)).runs(limit=-1)
    with pytest.raises(ValueError, match="not both"):
        Store(str(tmp_path), tracker=open_store(tmp_path))  # type: ignore[arg-type]
