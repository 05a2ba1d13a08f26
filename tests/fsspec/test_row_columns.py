"""A batch's points as numpy columns (parquet.row_columns) and their summaries by numpy
(store.summary.summarize_columns): the same segment, the same digest and the same summary as
the Python path (segments._columns_by_name), on random batches with NaN, infinities, steps
out of order and batches that end mid-step; anything else is left to the Python path."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_tracker.backend.fsspec.metricfiles import segment_digest
from async_tracker.backend.fsspec.parquet import decode_segment, encode_segment, row_columns
from async_tracker.backend.fsspec.segments import _columns_by_name
from async_tracker.store.summary import MetricSummary, summarize_columns

Row = tuple[str, Any, Any, Any]
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -1.5, 1e308, -1e-308]


def strided(
    rng: random.Random, names: Sequence[str], steps: int, cut: int = 0, special: float = 0.2
) -> list[Row]:
    """A training loop's batch: ``names`` at every step, in the same order, the last step
    cut short by ``cut`` names; values random, some NaN or infinite; steps mostly counting
    up, sometimes back."""
    rows: list[Row] = []
    step = rng.randrange(1000)
    for _ in range(steps):
        step = step + 1 if rng.random() < 0.9 else rng.randrange(step + 1)
        for name in names:
            value = rng.choice(SPECIAL) if rng.random() < special else rng.uniform(-1e3, 1e3)
            rows.append((name, value, step, 1.7e9 + rng.random()))
    return rows[: len(rows) - cut] if cut else rows


def as_lists(columns: Mapping[str, tuple[Any, Any, Any]]) -> dict[str, list[list[Any]]]:
    return {name: [list(np.asarray(c).tolist()) for c in col] for name, col in columns.items()}


def same_summary(a: MetricSummary, b: MetricSummary) -> bool:
    def eq(x: float | None, y: float | None) -> bool:
        if x is None or y is None:
            return x is y
        return (math.isnan(x) and math.isnan(y)) or x == y

    return (
        eq(a.last, b.last) and eq(a.min, b.min) and eq(a.max, b.max)
        and a.count == b.count and a.last_step == b.last_step
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    width=st.integers(1, 6),
    steps=st.integers(1, 40),
    cut=st.integers(0, 5),
    special=st.sampled_from([0.0, 0.2, 1.0]),
)
def test_numpy_columns_give_the_python_paths_segment_digest_and_summary(
    seed: int, width: int, steps: int, cut: int, special: float
) -> None:
    rng = random.Random(seed)
    names = [f"m{i}" for i in range(width)]
    rows = strided(rng, names, steps, cut=min(cut, width - 1), special=special)
    arrays = row_columns(rows)
    python = _columns_by_name(rows)
    assert arrays is not None
    assert list(arrays) == list(python)
    assert as_lists(arrays) == as_lists(python) or all(
        # NaN != NaN: compare the bits where lists differ
        np.array_equal(np.asarray(a), np.asarray(p), equal_nan=True)
        for name in python
        for a, p in zip(arrays[name], python[name])
    )
    for col in arrays.values():
        assert col[0].dtype == np.int64 and col[1].dtype == col[2].dtype == np.float64
    # The same file, and the same name: a replay by either version overwrites the other's.
    assert encode_segment("r", "w", 7, arrays) == encode_segment("r", "w", 7, python)
    assert segment_digest(7, arrays) == segment_digest(7, python)
    got, got_first = summarize_columns(arrays)
    want, want_first = summarize_columns(python)
    assert list(got) == list(want)
    assert all(same_summary(got[name], want[name]) for name in want)
    assert got_first == want_first
    decoded, _ = decode_segment(encode_segment("r", "w", 0, arrays))
    assert list(decoded) == list(python)


def test_summaries_of_every_value_nan_and_of_ints() -> None:
    steps = np.array([3, 5, 5, 1], dtype=np.int64)
    times = np.array([4.0, 3.0, 2.0, 1.0])
    nan = summarize_columns({"x": (steps, np.full(4, math.nan), times)})[0]["x"]
    assert nan.min is None and nan.max is None and math.isnan(nan.last)
    assert (nan.count, nan.last_step) == (4, 5)
    # The last of the points at the highest step, whatever comes after it.
    values = [1.0, 2.0, 3.0, 4.0]
    got, first = summarize_columns({"x": (steps, np.array(values), times)})
    want, want_first = summarize_columns({"x": (steps.tolist(), values, times.tolist())})
    assert same_summary(got["x"], want["x"]) and got["x"].last == 3.0
    assert first == want_first == 1.0
    # Integer values (a direct call's): numbers equal to the Python path's.
    ints = summarize_columns({"x": ([1, 2], [5, -2], [1.0, 2.0])})[0]["x"]
    as_floats = summarize_columns({"x": (np.array([1, 2]), np.array([5.0, -2.0]),
                                         np.array([1.0, 2.0]))})[0]["x"]  # fmt: skip
    assert same_summary(ints, as_floats)


@pytest.mark.parametrize(
    "rows",
    [
        [("a", 1.0, None, 1.0), ("a", 2.0, 1, 1.0)],  # a step not given
        [("a", 1.0, 2**63, 1.0)],  # a step beyond int64
        [("a", None, 1, 1.0)],  # a value that is no number
        [("a", "x", 1, 1.0)],
        [("a", 1.0, 1, 1.0), ("b", 1.0, 1, 1.0), ("b", 1.0, 2, 1.0)],  # not strided
        [("a", 1.0, 1, 1.0), ("b", 1.0, 1, 1.0), ("a", 1.0, 2, 1.0), ("a", 1.0, 3, 1.0)],
        [],
    ],
)
def test_other_batches_are_left_to_the_python_path(rows: list[Row]) -> None:
    assert row_columns(rows) is None


def test_one_name_and_all_distinct_names_are_strided() -> None:
    one = [("a", float(i), i, 1.0 + i) for i in range(10)]
    distinct = [(f"n{i}", float(i), 0, 1.0) for i in range(300)]
    for rows in (one, distinct):
        arrays = row_columns(rows)
        assert arrays is not None
        assert as_lists(arrays) == as_lists(_columns_by_name(rows))
