"""The filter and sort language over run summaries (async_tracker.store.expr)."""

from __future__ import annotations

import math
import sys
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_tracker.store.expr import (
    AGGREGATES,
    MAX_FILTER_DEPTH,
    FilterError,
    differing_params,
    parse_filter,
    parse_sort,
)
from async_tracker.store.summary import STATUSES, MetricSummary, RunSummary

START = datetime(2026, 11, 2, 10, 0).timestamp()  # local time, as filters read bare dates

RUN = RunSummary(
    run_id="run-a",
    status="finished",
    start=START,
    end=START + 3600,
    params={
        "lr": 0.02,
        "lr_text": "0.02",
        "model": "resnet50",
        "name": "Alpha",
        "flag": True,
        "flag_text": "false",
        "opt.lr": 0.001,
        "loss.min": 5,
        "batch size": 64,
        "layers": [64, 64],
        "nothing": None,
    },
    tags=frozenset({"baseline", "sweep 1"}),
    note="Warm restart after OOM",
    metrics={
        "loss": MetricSummary(last=0.3, min=0.1, max=2.0, count=10, last_step=9),
        "val.loss": MetricSummary(last=0.5, min=0.4, max=0.9, count=3, last_step=8),
        "train/acc": MetricSummary(last=0.91, min=0.2, max=0.95, count=10, last_step=9),
        "nan": MetricSummary(last=math.nan, min=None, max=None, count=2, last_step=1),
    },
)

RUNNING = RunSummary(
    run_id="1e5",
    status="running",
    start=START,
    heartbeat=START + 60,
    params={"lr": 0.5},
)

# (filter, whether RUN matches)
CASES = [
    # each operator, numbers
    ("lr==0.02", True),
    ("lr!=0.02", False),
    ("lr<0.03", True),
    ("lr<0.02", False),
    ("lr<=0.02", True),
    ("lr>0.01", True),
    ("lr>0.02", False),
    ("lr>=0.02", True),
    ("lr > 1e-3", True),
    ("lr>-1", True),
    ("batch_size_missing>-1", False),
    # text that reads as a number compares as a number with a number
    ("lr_text>0.01", True),
    ("lr_text==0.020", True),
    ("lr_text=='0.02'", True),
    ("lr_text=='0.020'", False),  # text with text: as text
    ("lr=='0.02'", True),  # quoted text that reads as a number, with a number
    # text
    ("model==resnet50", True),
    ("model=='resnet50'", True),
    ('model=="ResNet50"', False),
    ("model!=vgg", True),
    ("model<vgg", True),
    ("model>vgg", False),
    ("name>=Alpha", True),
    ("model~net", True),
    ("model~NET", True),  # ~ ignores letter case
    ("model~vgg", False),
    ("note~'warm restart'", True),
    ("note~oom", True),
    ("layers~64", True),  # ~ reads any value as text
    ("lr~0.0", True),
    # different kinds: never equal, never ordered, always !=
    ("model>1", False),
    ("model==1", False),
    ("model!=1", True),
    ("lr==abc", False),
    ("lr!=abc", True),
    ("layers==abc", False),
    ("layers!=abc", True),
    ("flag==1", False),
    ("flag>0", False),
    # yes/no
    ("flag==true", True),
    ("flag==TRUE", True),
    ("flag!=true", False),
    ("flag==false", False),
    ("flag_text==false", True),
    ("flag>false", False),
    # missing keys and null: only != holds
    ("missing==1", False),
    ("missing!=1", True),
    ("missing<1", False),
    ("missing>=1", False),
    ("missing~x", False),
    ("missing==null", True),
    ("missing!=null", False),
    ("nothing==none", True),
    ("nothing!=1", True),
    ("lr==null", False),
    ("lr!=null", True),
    ("missing.min<1", False),
    ("missing.min!=1", True),
    ("nan.min<1", False),  # every value was NaN: no min
    ("nan.min==null", True),
    ("nan.last<1", False),  # NaN compares as floats do
    ("nan.last!=1", True),
    ("nan.count==2", True),
    # params: dotted names, quoting, params. prefix
    ("opt.lr<0.01", True),
    ("params.opt.lr<0.01", True),
    ('params."opt.lr"==0.001', True),
    ("params.loss.min==5", True),
    ("`loss.min`==5", True),
    ("`batch size`>=64", True),
    ("'batch size'==64", True),
    ("params.lr==0.02", True),
    # metric aggregates
    ("loss.min<0.2", True),
    ("loss.last==0.3", True),
    ("loss.max>1", True),
    ("loss.count==10", True),
    ("loss.step==9", True),
    ("loss.MIN<0.2", True),
    ("train/acc.last>=0.9", True),
    ("val.loss.min==0.4", True),
    ('"val.loss".step==8', True),
    ("loss.min==null", False),
    # fields
    ("status==finished", True),
    ("status!=crashed", True),
    ("status~fin", True),
    ("id==run-a", True),
    ("id~RUN", True),
    ("note!=null", True),
    ("duration==3600", True),
    ("duration>=1h", True),
    ("duration>1h", False),
    ("duration<61m", True),
    ("duration<1d", True),
    ("duration>3599s", True),
    ("start>2026-11-01", True),
    ("start<2026-11-02", False),
    ("start>=2026-11-02T10:00", True),
    ("start>2026-11-02T10:00:01", False),
    ("start=='2026-11-02 10:00'", True),
    (f"start=={START}", True),
    (f"end>{START}", True),
    ("end<2026-11-03", True),
    (f"start<{datetime.fromisoformat('2026-11-02T10:00:00+00:00').timestamp() + 86400}", True),
    ("start>2026-11-01T00:00Z", True),
    # tags
    ("tag:baseline", True),
    ("TAG:baseline", True),
    ("tag:other", False),
    ('tag:"sweep 1"', True),
    # not > and > or
    ("not tag:other", True),
    ("not lr>0.01", False),
    ("! lr>0.01", False),
    ("!!lr>0.01", True),
    ("not not tag:baseline", True),
    ("lr>1 or lr<1 and model==vgg", False),  # or (lr<1 and model==vgg)
    ("lr<1 or lr>1 and model==vgg", True),
    ("(lr<1 or lr>1) and model==vgg", False),
    ("not tag:baseline or tag:baseline", True),  # (not a) or a
    ("not (tag:baseline or tag:other)", False),
    ("not tag:baseline and tag:other", False),
    ("tag:other and lr>1 or tag:baseline", True),
    ("tag:other and (lr>1 or tag:baseline)", False),
    ("lr>0.01 AND model==resnet50", True),
    ("lr>0.01 && model==resnet50 || tag:x", True),
    ("lr>1 Or tag:baseline", True),
    ("((lr>0.01))", True),
    ("(lr>0.01)and(tag:baseline)", True),
    ("  lr  >  0.01  ", True),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_filter_on_a_finished_run(text: str, expected: bool) -> None:
    f = parse_filter(text)
    assert f(RUN) is expected
    assert f.text == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("end==null", True),  # a running run has no end
        ("end>2000-01-01", False),
        ("end!=0", True),
        ("duration==60", True),  # to the last heartbeat
        ("status==running", True),
        ("id==1e5", True),  # ids are text, never numbers
        ("id==100000", False),
        ("id<2", True),  # as text: "1e5" < "2"
        ("note==null", True),  # no note
        ("note~a", False),
        ("loss.min<1", False),
        ("loss.min!=1", True),
        ("tag:baseline", False),
        ("not tag:baseline", True),
    ],
)
def test_filter_on_a_running_run_without_metrics(text: str, expected: bool) -> None:
    assert parse_filter(text)(RUNNING) is expected


def test_a_filter_selects_among_runs() -> None:
    runs = [RUN, RUNNING, RunSummary("c", status="crashed", params={"lr": "0.3"})]
    ids = [r.run_id for r in runs if parse_filter("lr>0.1 and status!=finished")(r)]
    assert ids == ["1e5", "c"]


# (filter, column of the error, words of the reason)
ERRORS = [
    ("", 1, "empty"),
    ("   ", 4, "empty"),
    ("(lr>1", 6, "expected ')' to close the '(' at column 1"),
    ("((lr>1)", 8, "expected ')'"),
    ("lr>1)", 5, "unmatched ')'"),
    (")", 1, "unmatched ')'"),
    ("()", 2, "inside '()'"),
    ("lr => 1", 4, "unknown operator '=>'"),
    ("lr = 1", 4, "equality is =="),
    ("lr <> 1", 4, "unknown operator '<>'"),
    ("lr===1", 3, "unknown operator '==='"),
    ("lr>1 & tag:a", 6, "unknown operator '&'"),
    ("lr>1 and", 9, "expected a condition after 'and'"),
    ("lr>1 or", 8, "expected a condition after 'or'"),
    ("lr>1 and or tag:a", 10, "expected a condition after 'and'"),
    ("and lr>1", 1, "expected a condition, got 'and'"),
    ("not", 4, "expected a condition after 'not'"),
    ("(not) and x", 5, "expected a condition after 'not'"),
    ("lr>1 tag:a", 6, "expected 'and', 'or'"),
    ("lr > and x", 6, "expected a value after '>'"),
    ("lr >", 5, "expected a value after '>'"),
    ("lr 1", 4, "expected an operator"),
    ("lr", 3, "expected an operator"),
    ("crashed", 8, "status==crashed"),
    ("> 1", 1, "expected a key"),
    ("loss.median<1", 6, "aggregates are last, min, max, count, step"),
    ("x>1 and loss.mean<1", 14, "unknown aggregate 'mean'"),
    ('"loss".median<1', 7, "expected .AGG"),
    ('note=="abc', 7, "unterminated quote"),
    ("note=='abc\\'", 7, "unterminated quote"),
    ("`batch size>1", 1, "unterminated quote"),
    ("status==crashd", 9, "unknown status 'crashd'"),
    ("loss.min<abc", 10, "expected a number"),
    ("loss.min~1", 9, "'~' compares text"),
    ("start~2026", 6, "'~' compares text"),
    ("start>yesterday", 7, "expected a date"),
    ("start>2026-13-01", 7, "expected a date"),
    ("duration>1w", 10, "expected seconds"),
    ("tag:", 5, "expected a tag name"),
]


@pytest.mark.parametrize(("text", "column", "reason"), ERRORS)
def test_a_bad_filter_says_where(text: str, column: int, reason: str) -> None:
    with pytest.raises(FilterError) as info:
        parse_filter(text)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.column == column
    first, shown, caret = str(err).split("\n")
    assert first.startswith(f"bad filter at column {column}: ")
    assert reason in first
    assert shown == "  " + text
    assert caret == "  " + " " * (column - 1) + "^"


def test_the_unknown_aggregate_error_names_every_aggregate_and_the_param_spelling() -> None:
    with pytest.raises(FilterError) as info:
        parse_filter("loss.median<1")
    message = str(info.value).splitlines()[0]
    assert all(agg in message for agg in AGGREGATES)
    assert "params.loss.median" in message
    # ...which is a param, as the message says.
    assert parse_filter("params.loss.median<1")(RunSummary("r", params={"loss.median": 0}))


def test_every_status_is_accepted() -> None:
    for status in STATUSES:
        assert parse_filter(f"status=={status}")(RunSummary("r", status=status))


# --- sort -------------------------------------------------------------------------------------


def _order(text: str, runs: list[RunSummary]) -> list[str]:
    return [r.run_id for r in sorted(runs, key=parse_sort(text).key)]


def test_sort_by_a_param_puts_numbers_then_text_then_missing_either_way() -> None:
    runs = [
        RunSummary("none"),
        RunSummary("n0.3", params={"lr": 0.3}),
        RunSummary("abc", params={"lr": "abc"}),
        RunSummary("t0.05", params={"lr": "0.05"}),  # text reading as a number
        RunSummary("null", params={"lr": None}),
        RunSummary("n0.1", params={"lr": 0.1}),
        RunSummary("b", params={"lr": "b"}),
        RunSummary("nan", params={"lr": math.nan}),
        RunSummary("true", params={"lr": True}),
    ]
    asc = _order("lr", runs)
    assert asc[:6] == ["t0.05", "n0.1", "n0.3", "true", "abc", "b"]
    assert set(asc[6:]) == {"none", "null", "nan"}
    desc = _order("-lr", runs)
    assert desc[:6] == ["true", "n0.3", "n0.1", "t0.05", "b", "abc"]
    assert set(desc[6:]) == {"none", "null", "nan"}
    assert parse_sort("-lr").reverse and not parse_sort("lr").reverse


def test_sort_text_descending_puts_longer_texts_with_the_same_start_first() -> None:
    runs = [RunSummary(i, params={"m": i}) for i in ["a", "b", "abc", "ab", "", "B"]]
    assert _order("m", runs) == sorted(["a", "b", "abc", "ab", "", "B"])
    assert _order("-m", runs) == sorted(["a", "b", "abc", "ab", "", "B"], reverse=True)


def test_sort_by_metric_fields_and_quoted_keys() -> None:
    def run(run_id: str, loss: float | None, start: float | None) -> RunSummary:
        metrics = {} if loss is None else {"loss": MetricSummary(loss, loss, loss, 1, 0)}
        return RunSummary(run_id, start=start, end=None if start is None else start + 10,
                          metrics=metrics, params={"a.b": loss})  # fmt: skip

    runs = [run("x", 0.5, 3.0), run("y", None, 1.0), run("z", 0.1, None), run("w", 0.9, 2.0)]
    assert _order("loss.min", runs) == ["z", "x", "w", "y"]
    assert _order("-loss.min", runs) == ["w", "x", "z", "y"]
    assert _order('-"loss".last', runs) == ["w", "x", "z", "y"]
    assert _order('params."a.b"', runs) == ["z", "x", "w", "y"]
    assert _order("start", runs) == ["y", "w", "x", "z"]
    assert _order("-start", runs) == ["x", "w", "y", "z"]
    assert _order("duration", runs) == ["x", "y", "w", "z"]  # equal durations keep their order
    assert _order(" -id ", runs) == ["z", "y", "x", "w"]
    assert _order("+id", runs) == ["w", "x", "y", "z"]


def test_sort_by_status_and_ids_is_by_text() -> None:
    runs = [RunSummary("9", status="running"), RunSummary("10", status="crashed")]
    assert _order("id", runs) == ["10", "9"]  # ids are text
    assert _order("status", runs) == ["10", "9"]
    assert _order("-status", runs) == ["9", "10"]


@pytest.mark.parametrize(
    ("text", "column", "reason"),
    [
        ("", 1, "expected a key"),
        ("-", 2, "expected a key"),
        ("- lr", 2, "right after the sign"),
        ("lr desc", 4, "expected the end"),
        ("tag:x", 1, "cannot sort by a tag"),
        ("loss.avg", 6, "unknown aggregate"),
        ("-loss.avg", 7, "unknown aggregate"),
        ("lr>1", 3, "expected the end"),
    ],
)
def test_a_bad_sort_key_says_where(text: str, column: int, reason: str) -> None:
    with pytest.raises(FilterError) as info:
        parse_sort(text)
    assert info.value.column == column
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"bad sort key at column {column}: ")
    assert reason in first


# --- differing params -----------------------------------------------------------------------


def test_differing_params_in_first_seen_order() -> None:
    runs = [
        RunSummary("a", params={"lr": 0.1, "seed": 1, "model": "x", "dtype": "", "n": math.nan}),
        RunSummary("b", params={"lr": 0.2, "model": "x", "dtype": "", "n": math.nan, "extra": 1}),
        RunSummary("c", params={"seed": 1, "lr": 0.1, "model": "x", "dtype": "", "n": math.nan}),
    ]
    assert differing_params(runs) == ["lr", "seed", "extra"]
    assert differing_params(runs[:1]) == []
    assert differing_params([]) == []
    one_and_float = [RunSummary("a", params={"k": 1}), RunSummary("b", params={"k": 1.0})]
    assert differing_params(one_and_float) == ["k"]
    lists = [RunSummary("a", params={"k": [1, 2]}), RunSummary("b", params={"k": [1, 2]})]
    assert differing_params(lists) == []


# --- properties -----------------------------------------------------------------------------

LEAVES = [
    "lr>0.01",
    "lr<=0.5",
    "lr==abc",
    "lr!=null",
    "model~net",
    "status==crashed",
    "status!=finished",
    "tag:a",
    "tag:b",
    "loss.min<0.2",
    "loss.count>=3",
    "note~x",
    "duration>10",
    "start>=1970-01-02",
]

Tree = st.recursive(
    st.sampled_from(LEAVES),
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(["and", "or"]), inner, inner),
    ),
    max_leaves=8,
)

runs = st.builds(
    RunSummary,
    run_id=st.text("abc1e5-", min_size=1, max_size=5),
    status=st.sampled_from(STATUSES),
    start=st.none() | st.floats(0, 1e6),
    end=st.none() | st.floats(0, 2e6),
    heartbeat=st.none() | st.floats(0, 2e6),
    params=st.dictionaries(
        st.sampled_from(["lr", "model", "x"]),
        st.none()
        | st.booleans()
        | st.integers(-5, 5)
        | st.floats(allow_nan=True)
        | st.sampled_from(["0.02", "abc", "resnet", "", "true", "1e-3"])
        | st.lists(st.integers(), max_size=2),
    ),
    tags=st.frozensets(st.sampled_from(["a", "b", "c"])),
    note=st.sampled_from(["", "x", "X marks"]),
    metrics=st.dictionaries(
        st.just("loss"),
        st.builds(
            MetricSummary,
            last=st.floats(allow_nan=True),
            min=st.none() | st.floats(allow_nan=False),
            max=st.none() | st.floats(allow_nan=False),
            count=st.integers(0, 10),
            last_step=st.integers(0, 10),
        ),
    ),
)


def _truth(tree: object, run: RunSummary) -> bool:
    """The tree's value, from each leaf's parsed value and Python's own and/or/not."""
    if isinstance(tree, str):
        return parse_filter(tree)(run)
    assert isinstance(tree, tuple)
    if tree[0] == "not":
        return not _truth(tree[1], run)
    left, right = _truth(tree[1], run), _truth(tree[2], run)
    return (left and right) if tree[0] == "and" else (left or right)


_PRECEDENCE = {"or": 1, "and": 2, "not": 3}
_SPELLINGS = {"and": ["and", "AND", "&&"], "or": ["or", "Or", "||"], "not": ["not ", "!", "NOT "]}


def _render(tree: object, data: st.DataObject, parent: int = 0, full: bool = False) -> str:
    """The tree as text: with every parenthesis (``full``) or only those precedence needs."""
    if isinstance(tree, str):
        return tree
    assert isinstance(tree, tuple)
    op = tree[0]
    word = data.draw(st.sampled_from(_SPELLINGS[op]))
    if op == "not":
        text = word + _render(tree[1], data, _PRECEDENCE[op], full)
    else:
        # Left-associative: the right operand of a chain of one operator needs parentheses.
        left = _render(tree[1], data, _PRECEDENCE[op], full)
        right = _render(tree[2], data, _PRECEDENCE[op] + 1, full)
        text = f"{left} {word} {right}"
    if full or _PRECEDENCE[op] < parent:
        return f"({text})"
    return text


@given(tree=Tree, run=runs, data=st.data())
def test_a_filter_means_what_its_tree_means_with_or_without_parentheses(
    tree: object, run: RunSummary, data: st.DataObject
) -> None:
    minimal = _render(tree, data)
    full = _render(tree, data, full=True)
    expected = _truth(tree, run)
    assert parse_filter(minimal)(run) is expected, minimal
    assert parse_filter(full)(run) is expected, full
    assert parse_filter(f"not ({minimal})")(run) is (not expected)


KEYS = ["lr", "model", "x", "status", "id", "note", "start", "end", "duration", "loss.min",
        "loss.last", "loss.count", "loss.step", 'params."a.b"', "`x y`"]  # fmt: skip
VALUES = ["0.01", "-1e-3", "3", "'x'", '"0.02"', "true", "null", "resnet", "2026-11-01",
          "1h", "crashed", "abc"]  # fmt: skip


@given(
    key=st.sampled_from(KEYS),
    op=st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "~"]),
    value=st.sampled_from(VALUES),
    run=runs,
)
def test_a_comparison_either_fails_to_parse_or_evaluates_to_a_bool(
    key: str, op: str, value: str, run: RunSummary
) -> None:
    try:
        f = parse_filter(f"{key}{op}{value}")
    except FilterError as err:
        assert err.column >= 1
        return
    assert isinstance(f(run), bool)
    try:  # status accepts any text for < and >, but only a known status for == and !=
        differs, equals = parse_filter(f"{key} != {value}"), parse_filter(f"{key} == {value}")
    except FilterError as err:
        assert err.column >= 1
        return
    assert differs(run) is not equals(run)


@given(run=runs, key=st.sampled_from(KEYS), descending=st.booleans())
def test_sort_keys_always_compare(run: RunSummary, key: str, descending: bool) -> None:
    sort = parse_sort(("-" if descending else "") + key)
    other = RunSummary("other", params={"lr": "zzz", "x": 1})
    sorted([run, other, RunSummary("empty")], key=sort.key)  # never a TypeError
    empty = sort.key(RunSummary("empty"))
    if sort.key(run) != (1,) and empty == (1,):  # with the key: before a run without it
        assert sort.key(run) < empty


# --- filters of any length and depth -----------------------------------------------------------


def test_a_filter_of_thousands_of_conditions_evaluates() -> None:
    # Each run of or/and/not is one node: a longer filter is no deeper.
    assert parse_filter("lr<0 or " * 5000 + "lr>0.01")(RUN) is True
    assert parse_filter("lr>0 and " * 5000 + "lr<0.01")(RUN) is False
    assert parse_filter("not " * 5001 + "lr>0.01")(RUN) is False
    assert parse_filter("not " * 5000 + "lr>0.01")(RUN) is True
    assert parse_filter("(" * MAX_FILTER_DEPTH + "lr>0.01" + ")" * MAX_FILTER_DEPTH)(RUN)
    mixed = "(lr<0 or (lr>0 and " * (MAX_FILTER_DEPTH // 2) + "lr>0.01" + "))" * 50
    assert parse_filter(mixed)(RUN) is True


@pytest.mark.parametrize(
    ("text", "column", "reason"),
    [
        ("lr>0 or " * 500, 4001, "expected a condition after 'or', got the end"),
        ("(" * 300, MAX_FILTER_DEPTH + 1, f"nest deeper than {MAX_FILTER_DEPTH} levels"),
        ("(" * 300 + "lr>0" + ")" * 300, MAX_FILTER_DEPTH + 1, "nest deeper than"),
        ("lr>" + "1" * 5000, 4, "'1111111111111111111111111111111111111...' has 5000 digits"),
        ("lr>0 and lr==" + "9" * 5000, 14, "has 5000 digits, too many to read"),
    ],
)
def test_a_filter_too_deep_or_a_number_too_long_is_a_filter_error(
    text: str, column: int, reason: str
) -> None:
    with pytest.raises(FilterError) as caught:
        parse_filter(text)
    assert isinstance(caught.value, ValueError) and caught.value.column == column
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"bad filter at column {column}: ") and reason in first
    assert len(first) < 150


def test_a_long_number_is_text_where_the_key_is() -> None:
    assert parse_filter("id==" + "1" * 5000)(RUN) is False
    assert parse_filter("note~" + "1" * 5000)(RUN) is False


def test_a_filter_within_the_depth_from_a_deep_stack_fails_as_a_filter_error() -> None:
    text = "(" * MAX_FILTER_DEPTH + "lr>0.01" + ")" * MAX_FILTER_DEPTH

    def nested(levels: int) -> None:
        if levels:
            nested(levels - 1)
        else:
            parse_filter(text)(RUN)

    with pytest.raises(FilterError, match="nested too deep"):
        nested(sys.getrecursionlimit() - 150)
