"""The dashboard draws a chart of the whole of a huge ended run from the store's overview
(tests/fsspec/test_overview.py) without reading its points, reads them when zoomed in, and
reads a live run's points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("starlette")

from async_tracker.store.open import open_reader  # noqa: E402
from async_tracker.store.sync_reader import Reader  # noqa: E402
from async_tracker.ui import live as live_module  # noqa: E402
from async_tracker.ui.live import LiveStore  # noqa: E402
from tests.fsspec.test_overview import POINTS, write_big_run  # noqa: E402
from tests.fsspec.test_parquet_store import RUN, tracker  # noqa: E402

pytestmark = pytest.mark.server


class Counting(Reader):
    """A Reader that counts the point reads and overview reads it serves."""

    def __init__(self, inner: Reader) -> None:
        super().__init__(inner.reader, inner.timeout)
        self.calls: dict[str, int] = {"scalars": 0, "overview": 0}

    def scalars(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["scalars"] += 1
        return super().scalars(*args, **kwargs)

    def overview(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["overview"] += 1
        return super().overview(*args, **kwargs)


def test_the_dashboard_draws_a_whole_ended_run_from_its_overview_and_zooms_into_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_module, "OVERVIEW_POINTS", 1_000)
    root = tmp_path / "runs"
    store = tracker(root)
    write_big_run(store)
    reader = Counting(open_reader(str(root)))
    live = LiveStore(reader, refresh_s=0.0)

    whole = live.series(RUN, ["loss"], "step", whole=True)
    x, y, count = whole["loss"]
    assert count == POINTS and len(x) < POINTS / 2 and 1e6 in y.tolist()
    assert reader.calls == {"scalars": 0, "overview": 1}
    by_time = live.series(RUN, ["loss"], "time", whole=True)["loss"]
    assert np.all(by_time[0][1:] >= by_time[0][:-1])  # sorted by time
    assert reader.calls == {"scalars": 0, "overview": 1}  # read once, kept

    zoomed = live.series(RUN, ["loss"], "step")  # a zoom: every point
    assert len(zoomed["loss"][0]) == POINTS and reader.calls["scalars"] == 1
    again = live.series(RUN, ["loss"], "step", whole=True)  # points in memory: those
    assert len(again["loss"][0]) == POINTS and reader.calls["overview"] == 1


def test_the_dashboard_reads_a_live_runs_points_not_an_overview(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_module, "OVERVIEW_POINTS", 1_000)
    root = tmp_path / "runs"
    store = tracker(root)
    write_big_run(store, end=False)
    reader = Counting(open_reader(str(root)))
    live = LiveStore(reader, refresh_s=0.0)
    x, _, count = live.series(RUN, ["loss"], "step", whole=True)["loss"]
    assert len(x) == count == POINTS
    assert reader.calls == {"scalars": 1, "overview": 0}
