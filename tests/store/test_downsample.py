"""Min/max downsampling: the extremes, the ends and the cap, on random and adversarial
curves (hypothesis), NaN included."""

from __future__ import annotations

import math

import pytest

np = pytest.importorskip("numpy")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from async_tracker.store.downsample import MAX_WIDTH, max_points, min_max, window  # noqa: E402

values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64), st.just(float("nan"))
)


def buckets(x: object, width: int) -> object:
    lo, hi = float(x[0]), float(x[-1])  # type: ignore[index]
    if hi == lo:
        return np.zeros(len(x), dtype=int)  # type: ignore[arg-type]
    edges = np.linspace(lo, hi, width + 1)[1:-1]
    return np.searchsorted(edges, x, "right")


@given(
    ys=st.lists(values, min_size=1, max_size=400),
    gaps=st.lists(st.integers(0, 5), min_size=400, max_size=400),
    width=st.integers(1, 60),
)
def test_every_bucket_keeps_its_min_and_max_and_the_curve_its_ends(
    ys: list[float], gaps: list[int], width: int
) -> None:
    y = np.array(ys, dtype=np.float64)
    x = np.cumsum(np.array(gaps[: len(ys)], dtype=np.float64))  # sorted, with repeats
    keep = min_max(x, y, width)
    assert len(keep) <= max_points(width) == 2 * width + 2
    assert list(keep) == sorted(set(keep.tolist()))  # ascending, no repeats
    assert keep[0] == 0 and keep[-1] == len(y) - 1
    if len(y) <= 2 * width + 2:
        assert len(keep) == len(y)
        return
    kept = set(keep.tolist())
    b = buckets(x, width)
    for bucket in set(b.tolist()):  # type: ignore[attr-defined]
        members = np.flatnonzero(b == bucket)
        finite = [i for i in members if not math.isnan(y[i])]
        if not finite:
            assert kept & set(members.tolist())  # a gap stays visible
            continue
        lo = min(finite, key=lambda i: (y[i], i))
        hi = min(finite, key=lambda i: (-y[i], i))
        assert lo in kept and hi in kept, (bucket, lo, hi)


def test_ten_million_points_come_out_capped_with_the_spikes() -> None:
    n = 10_000_000
    x = np.arange(n, dtype=np.float64)
    y = np.sin(x / 1000.0)
    y[1_234_567], y[7_654_321] = 50.0, -50.0
    keep = min_max(x, y, 1000)
    assert len(keep) <= 2002
    assert {1_234_567, 7_654_321, 0, n - 1} <= set(keep.tolist())


def test_the_width_is_capped() -> None:
    x = np.arange(100_000, dtype=np.float64)
    assert len(min_max(x, x, 10**9)) <= 2 * MAX_WIDTH + 2
    assert len(min_max(x, x, -5)) <= 4  # at least one bucket


def test_window_keeps_a_point_beyond_each_edge() -> None:
    x = np.arange(10, dtype=np.float64)
    assert window(x, 3.5, 6.0) == slice(3, 8)
    assert window(x, None, None) == slice(0, 10)
    assert window(x, 20.0, 30.0) == slice(9, 10)
