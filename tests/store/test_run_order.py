"""The run list's default order (``store/runs.py``): ``newest_order``, which a store's
reader uses to order runs before it makes their summaries, gives the order of a plain sort
(the latest start first, equal starts in the order given, runs with no start last by id),
cut at any limit, NaN and infinities included (hypothesis)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from async_tracker.store.runs import newest_first, newest_order, select
from async_tracker.store.summary import RunSummary


def sorted_plainly(starts: list[float | None], run_ids: list[str]) -> list[int]:
    """The order by one sort of every run, as the run list was first ordered."""
    dated = sorted(
        (i for i, start in enumerate(starts) if start is not None),
        key=lambda i: -(starts[i] or 0.0),
    )
    undated = sorted((i for i, start in enumerate(starts) if start is None),
                     key=lambda i: run_ids[i])  # fmt: skip
    return dated + undated


# Few distinct values: many runs started at the same time.
STARTS = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1.0, 2.0, 1795816700.25, math.inf, -math.inf]),
    st.floats(min_value=-1e12, max_value=1e12),
)


@given(
    st.lists(st.tuples(STARTS, st.text(max_size=3)), max_size=120),
    st.integers(min_value=-2, max_value=130),
    st.booleans(),
)
def test_newest_order_is_a_plain_sort_cut_at_the_limit(
    runs: list[tuple[float | None, str]], limit: int, nan: bool
) -> None:
    starts = [start for start, _ in runs]
    run_ids = [run_id for _, run_id in runs]
    if nan and starts:
        starts[len(starts) // 2] = math.nan  # no order holds: sorted as sorted() would
    full = sorted_plainly(starts, run_ids)
    assert newest_order(starts, run_ids, limit) == (full[:limit] if limit else full)
    assert newest_order(starts, run_ids) == full


def test_newest_first_and_select_keep_the_order_of_equal_starts() -> None:
    runs = [RunSummary("b", start=5.0), RunSummary("a", start=7.0), RunSummary("z"),
            RunSummary("c", start=5.0), RunSummary("y")]  # fmt: skip
    assert [r.run_id for r in newest_first(runs)] == ["a", "b", "c", "y", "z"]
    shown, left_out = select(runs, limit=2)
    assert [r.run_id for r in shown] == ["a", "b"] and left_out == 3
