"""Overviews of big compacted metric files (``overview/<name>``): what a chart of the whole
of a huge finished run reads instead of every point. Written at compaction, exact (the
file's own rows: every bucket's extremes by step and by time, and the ends), read back by
``RunReader.overview`` only when every metric file is compacted; a corrupt one falls back
to its file's points. The dashboard's use of it: tests/ui/test_overview_chart.py."""

from __future__ import annotations

import functools
import itertools
import logging
from pathlib import Path

import numpy as np
import pytest

from async_tracker.backend.fsspec import AsyncFsspecTracker, encode_run_id
from async_tracker.backend.fsspec import parquet as parquet_module
from async_tracker.records import TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.downsample import MAX_WIDTH, min_max
from async_tracker.store.reader import Scalars
from tests.fsspec.test_parquet_store import RUN, Writer, listed, metrics_dir, tracker

# Big enough for an overview (two metrics: over OVERVIEW_MIN_ROWS rows), of which min_max
# keeps a fraction at MAX_WIDTH (it keeps every point of a curve of 2 * MAX_WIDTH + 2 or less).
POINTS = 40_000


def curve(name: str, steps: range, seed: int) -> list[TrackerMetric]:
    """Noisy points with one spike, and times that step back once (a resumed run)."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=len(steps))
    values[len(steps) // 3] = 1e6  # a spike a chart must show
    times = 1.7e9 + np.arange(len(steps), dtype=float)
    times[len(steps) // 2 :] -= 100.0
    return [
        TrackerMetric(name, float(v), s, float(t))
        for s, v, t in zip(steps, values.tolist(), times.tolist())
    ]


def write_big_run(store: AsyncFsspecTracker, end: bool = True) -> Writer:
    """Two metrics of POINTS points in three flushes, and the run's end (its compaction)."""
    w = Writer(store)
    loss, acc = curve("loss", range(POINTS), 1), curve("acc", range(POINTS), 2)
    cuts = [0, POINTS // 3, 2 * POINTS // 3, POINTS]
    for a, b in itertools.pairwise(cuts):
        w.write([*loss[a:b], *acc[a:b]])
    if end:
        w.end()
    return w


def overview_dir(root: Path) -> Path:
    return root / encode_run_id(RUN) / "overview"


def read_overview(store: AsyncFsspecTracker) -> dict[str, Scalars] | None:
    return runtime().loop.call(functools.partial(store.reader().overview, RUN))


def read_all(store: AsyncFsspecTracker) -> dict[str, Scalars]:
    return runtime().loop.call(functools.partial(store.reader().scalars, RUN)).curves


def expected_overview(full: Scalars) -> set[tuple[int, float, float]]:
    """What min_max keeps of a curve by step and by time: the overview's rows."""
    steps, values, times = full.steps, full.values, full.times
    keep = set(min_max(steps, values, MAX_WIDTH).tolist())
    by_time = np.argsort(times, kind="stable")
    keep |= set(by_time[min_max(times[by_time], values[by_time], MAX_WIDTH)].tolist())
    return {(int(steps[i]), float(values[i]), float(times[i])) for i in keep}


def rows(c: Scalars) -> set[tuple[int, float, float]]:
    return set(zip(c.steps.tolist(), c.values.tolist(), c.times.tolist()))


def test_a_big_compacted_run_gets_an_exact_overview_of_what_a_chart_draws(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    store = tracker(root)
    write_big_run(store)
    (compacted,) = listed(root)
    assert [p.name for p in overview_dir(root).iterdir()] == [compacted]

    full, view = read_all(store), read_overview(store)
    assert view is not None and set(view) == {"loss", "acc"}
    for name, c in view.items():
        # The curve's own points, exactly those a chart of any width up to MAX_WIDTH draws
        # (by step and by time), sorted by step like scalars(); a small part of them.
        assert rows(c) == expected_overview(full[name])
        assert len(c) < POINTS / 2
        assert np.all(c.steps[1:] >= c.steps[:-1])
        assert c.steps[0] == 0 and c.steps[-1] == POINTS - 1
        assert 1e6 in c.values.tolist()
    # Asked for one metric: that one alone.
    one = runtime().loop.call(functools.partial(store.reader().overview, RUN, ["acc"]))
    assert one is not None and list(one) == ["acc"]


def test_a_small_run_has_no_overview_file_and_its_overview_is_every_point(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    store = tracker(root)
    w = Writer(store)
    for k in range(3):
        w.write(curve("loss", range(100 * k, 100 * k + 100), k))
    w.end()
    assert not overview_dir(root).exists()
    view = read_overview(store)
    assert view is not None
    assert rows(view["loss"]) == rows(read_all(store)["loss"]) and len(view["loss"]) == 300


def test_a_run_whose_files_are_not_all_compacted_has_no_overview(tmp_path: Path) -> None:
    """A live run (segments as flushed): only every point gives its chart."""
    root = tmp_path / "runs"
    store = tracker(root)
    write_big_run(store, end=False)
    assert len(listed(root)) == 3
    assert read_overview(store) is None


def test_two_writers_overviews_are_joined_and_sorted_by_step(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = tracker(root)
    write_big_run(store)
    late = Writer(store)  # another rank, logging later steps of loss
    late.write(curve("loss", range(POINTS, 2 * POINTS), 3))
    late.write(curve("loss", range(2 * POINTS, 3 * POINTS), 4))
    late.end()
    assert len(listed(root)) == 2 and len(list(overview_dir(root).iterdir())) == 2
    view = read_overview(store)
    assert view is not None
    loss = view["loss"]
    assert np.all(loss.steps[1:] >= loss.steps[:-1])
    assert loss.steps[0] == 0 and loss.steps[-1] == 3 * POINTS - 1
    assert rows(loss) <= rows(read_all(store)["loss"])


def test_a_corrupt_overview_is_named_once_and_its_file_read_instead(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "runs"
    store = tracker(root)
    write_big_run(store)
    (view_file,) = overview_dir(root).iterdir()
    view_file.write_bytes(b"PAR1 not an overview")
    with caplog.at_level(logging.WARNING):
        view = read_overview(store)
    assert view is not None
    assert rows(view["loss"]) == rows(read_all(store)["loss"])  # every point: nothing lost
    warned = [r for r in caplog.records if view_file.name in r.getMessage()]
    assert len(warned) == 1


def test_an_overview_that_cannot_be_made_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fails(data: bytes, width: int = MAX_WIDTH) -> bytes | None:
        raise parquet_module.SegmentError("made to fail")

    monkeypatch.setattr(parquet_module, "overview", fails)
    root = tmp_path / "runs"
    store = tracker(root)
    with caplog.at_level(logging.WARNING):
        w = write_big_run(store)
    assert len(listed(root)) == 1 and not overview_dir(root).exists()
    assert any("no overview" in r.getMessage() for r in caplog.records)
    view = read_overview(store)  # the compacted file itself, read whole
    assert view is not None and len(view["loss"]) == POINTS
    assert sum(len(c) for c in read_all(store).values()) == len(w.points)


def test_overviews_stay_out_of_the_metric_files_data_tools_read(tmp_path: Path) -> None:
    """``*/metrics/*.parquet`` (the documented DuckDB/Polars glob) counts every row once."""
    import glob

    import pyarrow.parquet as pq

    root = tmp_path / "runs"
    store = tracker(root)
    write_big_run(store)
    files = glob.glob(str(root / "*" / "metrics" / "*.parquet"))
    assert sum(pq.read_metadata(f).num_rows for f in files) == 2 * POINTS
    assert metrics_dir(root).parent / "overview" == overview_dir(root)


@pytest.mark.parametrize("seed", range(40))
def test_a_curve_found_in_order_is_the_order_a_sort_gives(seed: int) -> None:
    """The overview skips the sort of a curve already in (step, seq) or time order: only
    where the stable sort would have left every row in place."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 50))
    steps = np.sort(rng.integers(0, 8, n)) if seed % 2 else rng.integers(0, 8, n)
    seqs = rng.permutation(n) if seed % 3 else np.arange(n)
    order = np.lexsort((seqs, steps))
    if parquet_module._in_order(steps, seqs):
        assert (order == np.arange(n)).all()
    times = np.sort(rng.random(n)) if seed % 2 else rng.random(n)
    times[rng.integers(0, n)] = rng.choice([np.inf, -np.inf, times[0]])
    if parquet_module._in_order(times):
        assert (np.argsort(times, kind="stable") == np.arange(n)).all()
    assert parquet_module._in_order(np.arange(n), np.zeros(n))
