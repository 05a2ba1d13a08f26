"""AppRun's sync face: torchx's writes and reads, call-site validation, lifecycle, reports."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from async_tracker import (
    AppRun,
    AppRunTrackableSource,
    BackendStatus,
    DeliveryError,
    FlushReport,
    RunState,
    TrackerArtifact,
    TrackerClosedError,
    TrackerSource,
    TrackerStatus,
)
from async_tracker.backend.memory import InMemoryTracker
from tests.core.helpers import wait_until
from tests.faulty import DictTracker, FaultyTracker, Hang, permanent

MakeRun = Callable[..., AppRun]


# -- torchx's writes and reads ------------------------------------------------------------------


def test_metadata_updates_last_write_wins(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(lr=0.1, model="resnet", layers=[1, 2])
    run.add_metadata(lr=0.2)
    assert run.flush().ok
    run.add_metadata(model="vit", layers=(3,))  # a later flush overrides an earlier one
    run.add_metadata(lr=0.3)
    assert run.metadata() == {"lr": 0.3, "model": "vit", "layers": [3]}
    assert mem.runs["r"].metadata == {"lr": 0.3, "model": "vit", "layers": [3]}


def test_metadata_is_copied_at_the_call(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    cfg: dict[str, Any] = {"opt": {"lr": 0.1}, "layers": [1]}
    run.add_metadata(cfg=cfg)
    cfg["opt"]["lr"] = 99.0  # the caller mutates after the call: not what was recorded
    cfg["layers"].append(2)
    assert run.metadata() == {"cfg": {"opt": {"lr": 0.1}, "layers": [1]}}


def test_artifacts_with_metadata(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_artifact("model", "/ckpt/1.pt", {"epoch": 1})
    run.add_artifact("tb", "s3://bucket/tb")
    run.add_artifact("model", "/ckpt/2.pt", {"epoch": 2})
    assert run.artifacts() == {
        "model": TrackerArtifact("model", "/ckpt/2.pt", {"epoch": 2}),
        "tb": TrackerArtifact("tb", "s3://bucket/tb", None),
    }


def test_sources_and_their_artifact_filter(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_source("parent")
    run.add_source("imagenet", "dataset")
    run.add_source("imagenet", "dataset")  # stored once
    run.add_source("pretrained", "model")
    sources = run.sources()
    assert all(isinstance(s, AppRunTrackableSource) for s in sources)
    assert [(s.parent.id, s.artifact_name) for s in sources] == [
        ("parent", None),
        ("imagenet", "dataset"),
        ("pretrained", "model"),
    ]
    # torchx's AppRun.sources() takes no filter; the backends' sources() does.
    assert run.flush().ok
    assert mem.runs["r"].sources == [
        TrackerSource("parent", None),
        TrackerSource("imagenet", "dataset"),
        TrackerSource("pretrained", "model"),
    ]
    filtered = asyncio.run(mem.sources("r", "dataset"))
    assert list(filtered) == [TrackerSource("imagenet", "dataset")]


def test_children_and_lineage(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    parent = make_run("parent", [mem])
    parent.add_metadata(role="parent")
    for i in range(3):
        child = make_run(f"child-{i}", [mem])
        child.add_source("parent", "model" if i else None)
        assert child.flush().ok
    assert sorted(c.id for c in parent.children()) == ["child-0", "child-1", "child-2"]
    lineage = parent.lineage()
    assert {d.source_run_id for d in lineage.descendants} == {"child-0", "child-1", "child-2"}
    assert lineage.parents == []
    (source,) = make_run("child-1", [mem]).sources()
    assert (source.parent.id, source.artifact_name) == ("parent", "model")
    assert source.parent.metadata() == {"role": "parent"}  # the source is a readable run


def test_reads_come_from_the_first_backend(make_run: MakeRun) -> None:
    first, second = InMemoryTracker(), InMemoryTracker()
    run = make_run("r", [first, second])
    run.add_metadata(a=1)
    assert run.flush().ok
    first.runs["r"].metadata["only_in_first"] = True
    assert run.metadata() == {"a": 1, "only_in_first": True}
    assert second.runs["r"].metadata == {"a": 1}


def test_plain_trackerbase_gets_all_but_metrics(
    make_run: MakeRun, caplog: pytest.LogCaptureFixture
) -> None:
    plain, mem = DictTracker(name="plain"), InMemoryTracker()
    run = make_run("r", [plain, mem])
    assert "plain" in caplog.text and "metrics" in caplog.text  # said once, at construction
    run.add_metadata(a=1)
    run.add_artifact("m", "/m")
    run.add_source("p")
    run.log_metric("loss", 0.5)
    report = run.flush()
    assert report.ok, report
    assert plain.metadata("r") == {"a": 1}
    assert list(plain.artifacts("r")) == ["m"]
    assert list(plain.sources("r")) == [TrackerSource("p", None)]
    assert mem.points("r", "loss")[0].value == 0.5
    assert run.metrics() == {}  # the reader (first backend) has no metrics
    status = run.status().backends
    assert status["plain"].delivered == 3 and status["InMemoryTracker"].delivered == 4


def test_skipped_metrics_are_said_once(
    make_run: MakeRun, caplog: pytest.LogCaptureFixture
) -> None:
    plain = DictTracker(name="plain")
    run = make_run("r", [plain])
    for parent in ("p1", "p2", "p3"):
        run.add_source(parent)
    sources = run.sources()  # each source is an AppRun over the same backends
    assert [s.parent.id for s in sources] == ["p1", "p2", "p3"]
    assert [s.parent.metadata() for s in sources] == [{}, {}, {}]
    warnings = [r for r in caplog.records if "without a metric method" in r.getMessage()]
    assert len(warnings) == 1


def test_run_without_backends_records_nothing(make_run: MakeRun) -> None:
    run = make_run("nothing")
    run.add_metadata(a=1)
    run.log_metric("x", 1.0)
    assert run.flush() == FlushReport()
    assert run.metadata() == {} and run.metrics() == {} and run.sources() == []


# -- metric steps and values --------------------------------------------------------------------


def test_default_step_is_previous_plus_one(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metric("a", 1.0)
    run.log_metric("a", 2.0)
    run.log_metric("b", 3.0)
    assert run.flush().ok
    run.log_metric("a", 4.0)  # carried across flushes
    run.log_metric("a", 5.0, step=10)
    run.log_metric("a", 6.0)
    run.log_metrics({"a": 7.0, "b": 8.0})
    run.log_metrics({"a": 9.0, "b": 9.5}, step=20)
    metrics = run.metrics()
    assert [(p.step, p.value) for p in metrics["a"]] == [
        (0, 1.0), (1, 2.0), (2, 4.0), (10, 5.0), (11, 6.0), (12, 7.0), (20, 9.0)
    ]
    assert [(p.step, p.value) for p in metrics["b"]] == [(0, 3.0), (1, 8.0), (20, 9.5)]


def test_log_metrics_share_one_timestamp(
    make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = iter([100.0, 200.0, 300.0])
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: next(ticks))
    run.log_metrics({"a": 1.0, "b": 2.0, "c": 3.0}, step=0)
    run.log_metric("a", 1.5, step=0)
    metrics = run.metrics()
    assert [p.timestamp for n in "abc" for p in metrics[n][:1]] == [100.0, 100.0, 100.0]
    # Same step: ordered by time.
    assert [(p.value, p.timestamp) for p in metrics["a"]] == [(1.0, 100.0), (1.5, 200.0)]


def test_nan_and_infinities_are_kept(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metric("x", math.nan, step=0)
    run.log_metric("x", math.inf, step=1)
    run.log_metrics({"x": -math.inf}, step=2)
    run.add_metadata(best=math.inf)
    values = [p.value for p in run.metrics()["x"]]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]
    assert run.metadata() == {"best": math.inf}


def test_numpy_scalars_and_zero_d_arrays_are_accepted(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metric("f32", np.float32(0.5), step=np.int64(3))
    run.log_metric("i64", np.int64(7), step=np.int32(1))
    run.log_metric("arr", np.array(2.5))
    run.log_metric("nan", np.float64("nan"), step=0)
    run.log_metrics({"a": np.float16(1.5), "b": np.array(-1)}, step=np.uint8(4))
    run.log_metric("int", 3)
    metrics = run.metrics()
    got = {n: [(p.step, p.value) for p in pts] for n, pts in metrics.items() if n != "nan"}
    assert got == {
        "f32": [(3, 0.5)],
        "i64": [(1, 7.0)],
        "arr": [(0, 2.5)],
        "a": [(4, 1.5)],
        "b": [(4, -1.0)],
        "int": [(0, 3.0)],
    }
    for pts in metrics.values():  # converted on the caller's thread: plain Python types
        assert type(pts[0].value) is float and type(pts[0].step) is int
    assert math.isnan(metrics["nan"][0].value)


# -- bad input at the call site -----------------------------------------------------------------

BAD_CALLS: list[tuple[str, Callable[[AppRun], None], type[Exception], str]] = [
    ("metric name not str", lambda r: r.log_metric(3, 1.0), TypeError, "metric name"),  # type: ignore[arg-type]
    ("metric name empty", lambda r: r.log_metric("", 1.0), ValueError, "metric name"),
    ("metric value str", lambda r: r.log_metric("loss", "0.5"), TypeError, "loss"),  # type: ignore[arg-type]
    ("metric value None", lambda r: r.log_metric("loss", None), TypeError, "loss"),  # type: ignore[arg-type]
    ("metric value array", lambda r: r.log_metric("loss", np.zeros(2)), TypeError, "loss"),
    ("metric value object", lambda r: r.log_metric("loss", object()), TypeError, "loss"),  # type: ignore[arg-type]
    ("metric value too big", lambda r: r.log_metric("loss", 10**400), ValueError, "loss"),
    ("metrics too big", lambda r: r.log_metrics({"ok": 1, "big": 10**400}), ValueError, "big"),
    ("step float", lambda r: r.log_metric("loss", 1.0, step=1.5), TypeError, "loss"),  # type: ignore[arg-type]
    ("step str", lambda r: r.log_metric("loss", 1.0, step="1"), TypeError, "loss"),  # type: ignore[arg-type]
    ("step bool", lambda r: r.log_metric("loss", 1.0, step=True), TypeError, "loss"),
    ("metrics one bad value", lambda r: r.log_metrics({"ok": 1.0, "bad": "x"}), TypeError, "bad"),  # type: ignore[dict-item]
    ("metrics bad key", lambda r: r.log_metrics({"ok": 1.0, 7: 2.0}), TypeError, "7"),  # type: ignore[dict-item]
    ("metrics bad step", lambda r: r.log_metrics({"ok": 1.0}, step=0.5), TypeError, "ok"),  # type: ignore[arg-type]
    ("metrics not a mapping", lambda r: r.log_metrics([("a", 1.0)]), TypeError, "mapping"),  # type: ignore[arg-type]
    ("metadata set", lambda r: r.add_metadata(ok=1, tags={"a"}), TypeError, "tags"),
    ("metadata nested", lambda r: r.add_metadata(cfg={"a": [1, object()]}), TypeError, "cfg.a[1]"),
    ("metadata key not str", lambda r: r.add_metadata(cfg={1: 2}), TypeError, "cfg"),
    ("metadata numpy too big", lambda r: r.add_metadata(arr=np.zeros(1001)), ValueError, "arr"),
    ("metadata empty key", lambda r: r.add_metadata(**{"": 1}), ValueError, "metadata key"),
    ("artifact name", lambda r: r.add_artifact(None, "/p"), TypeError, "artifact name"),  # type: ignore[arg-type]
    ("artifact path", lambda r: r.add_artifact("model", 3), TypeError, "model"),  # type: ignore[arg-type]
    ("artifact metadata list", lambda r: r.add_artifact("model", "/p", [1]), TypeError, "model"),  # type: ignore[arg-type]
    ("artifact meta value", lambda r: r.add_artifact("model", "/p", {"k": {1}}), TypeError, "k"),
    ("source id", lambda r: r.add_source(""), ValueError, "source_id"),
    ("source artifact", lambda r: r.add_source("p", 5), TypeError, "artifact_name"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    ("call", "error", "key"),
    [pytest.param(c, e, k, id=i) for i, c, e, k in BAD_CALLS],
)
def test_bad_input_raises_naming_the_key_and_enqueues_nothing(
    make_run: MakeRun, call: Callable[[AppRun], None], error: type[Exception], key: str
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(before=True)  # the run is started: the flusher exists
    with pytest.raises(error) as info:
        call(run)
    assert key in str(info.value)
    assert run.status().backends["InMemoryTracker"].buffered == 1
    report = run.flush()
    assert report.ok and report.delivered == 1
    assert mem.runs["r"].metadata == {"before": True}
    assert mem.runs["r"].batches == {} and mem.runs["r"].artifacts == {}
    assert mem.runs["r"].sources == []


@pytest.mark.parametrize(
    ("call", "error", "key"),
    [
        (lambda r: r.log_metric(["loss"], 1.0, 1), TypeError, "metric name"),
        (lambda r: r.log_metric("loss", "1.0", 1), TypeError, "loss"),
        (lambda r: r.log_metric("loss", 1.0, 1.5), TypeError, "loss"),
        (lambda r: r.log_metrics({("loss",): 1.0}, step=1), TypeError, "metric name"),
        (lambda r: r.log_metrics({"loss": 1.0, "acc": None}, step=1), TypeError, "acc"),
        (lambda r: r.log_metrics({"loss": 1.0, "acc": 2.0}, step="1"), TypeError, "loss"),
    ],
    ids=["unhashable name", "str value", "float step", "tuple name", "None value", "str step"],
)
def test_bad_input_after_the_names_are_known_raises_and_keeps_nothing(
    make_run: MakeRun, call: Callable[[AppRun], None], error: type[Exception], key: str
) -> None:
    # Known names take the hot path's fast checks: each bad part still raises, naming it.
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metrics({"loss": 0.5, "acc": 0.25}, step=0)
    with pytest.raises(error) as info:
        call(run)
    assert key in str(info.value)
    assert run.flush().delivered == 2
    assert [p.step for p in mem.points("r", "loss")] == [0]
    assert [p.step for p in mem.points("r", "acc")] == [0]


def test_known_names_take_converted_values_and_str_subclasses(make_run: MakeRun) -> None:
    class Name(str):
        pass

    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.log_metrics({"loss": 0.5, "acc": 0.25}, step=0)
    run.log_metric("loss", np.float32(1.5), np.int64(1))
    run.log_metrics({"loss": 2, "acc": np.float64(0.75)}, step=2)
    run.log_metric(Name("loss"), 3.0, 3)
    run.log_metrics({Name("acc"): 1.0}, step=3)
    assert run.flush().ok
    assert [(p.step, p.value) for p in mem.points("r", "loss")] == [
        (0, 0.5), (1, 1.5), (2, 2.0), (3, 3.0)
    ]
    assert [(p.step, p.value) for p in mem.points("r", "acc")] == [(0, 0.25), (2, 0.75), (3, 1.0)]


def test_bad_input_on_the_first_write_starts_nothing(make_run: MakeRun) -> None:
    run = make_run("r", [InMemoryTracker()])
    with pytest.raises(TypeError):
        run.log_metrics({"a": 1.0, "b": None})  # type: ignore[dict-item]
    idle = run.status().backends["InMemoryTracker"]  # listed before the first write
    assert idle.buffered == 0 and idle.delivered == 0 and idle.healthy
    assert run.flush().delivered == 0


def test_run_id_must_be_a_non_empty_string() -> None:
    with pytest.raises(TypeError, match="run id"):
        AppRun(5, [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run id"):
        AppRun("", [])


def test_backend_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="dict"):
        AppRun("r", [{}])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"flush_interval": 0}, "flush_interval"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 10, "max_buffered": 5}, "max_buffered"),
        ({"close_timeout": -1}, "close_timeout"),
    ],
)
def test_bad_options_raise(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        AppRun("r", [], **kwargs)


# -- lifecycle ----------------------------------------------------------------------------------


def test_close_delivers_and_is_idempotent(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    run.add_metadata(a=1)
    run.log_metric("x", 1.0)
    report = run.close()
    assert report.ok and report.delivered == 2
    assert mem.runs["r"].metadata == {"a": 1}
    assert run.closed and run.status().closed
    assert run.close() is report
    assert run.close(timeout=0) is report


@pytest.mark.parametrize(
    "write",
    [
        lambda r: r.add_metadata(a=1),
        lambda r: r.add_artifact("m", "/m"),
        lambda r: r.add_source("p"),
        lambda r: r.log_metric("x", 1.0),
        lambda r: r.log_metrics({"x": 1.0}),
    ],
    ids=["add_metadata", "add_artifact", "add_source", "log_metric", "log_metrics"],
)
@pytest.mark.parametrize("started", [True, False], ids=["started", "never-written"])
def test_write_after_close_raises(
    make_run: MakeRun, write: Callable[[AppRun], None], started: bool
) -> None:
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    if started:
        run.add_metadata(before=True)
    run.close()
    with pytest.raises(TrackerClosedError, match="'r'"):
        write(run)
    assert mem.runs.get("r") is None or mem.runs["r"].metadata == {"before": True}


def test_a_write_holding_the_sink_from_before_the_start_raises_after_close(
    make_run: MakeRun,
) -> None:
    # A writer thread fetches the run's sink, then is held up (past close's wait for
    # writers) while another thread writes first and closes: its write must raise, not land
    # in an ingress that close() has drained for the last time.
    mem = InMemoryTracker()
    run = make_run("r", [mem])
    held = run._sink  # what the held-up writer fetched: the first write's sink
    run.add_metadata(first=True)  # the other thread's first write starts the pipeline
    report = run.close()
    assert report.ok and report.delivered == 1
    with pytest.raises(TrackerClosedError):
        held.append(("loss", 1.0, 0, 0.0))
    assert run.status().backends["InMemoryTracker"].buffered == 0
    assert mem.points("r", "loss") == []


def test_a_run_names_its_state_from_new_to_closed(make_run: MakeRun) -> None:
    # CLOSING is seen while a close waits for a backend hung in its first write: another
    # thread's write or flush then raises, naming the state; the close's report ends it.
    release = threading.Event()
    hang = Hang(release)
    slow = FaultyTracker(name="slow").on("write_batch", 1, action=hang)
    run = make_run("r", [slow])
    states = [(run.state, run.closed)]
    run.add_metadata(a=1)
    states.append((run.state, run.closed))
    reports: list[FlushReport] = []
    closer = threading.Thread(target=lambda: reports.append(run.close(timeout=60)))
    closer.start()
    try:
        assert hang.entered.wait(60)
        wait_until(lambda: run.closed)
        states.append((run.state, run.close_finished()))
        with pytest.raises(TrackerClosedError, match="'r' is closing"):
            run.flush()
        with pytest.raises(TrackerClosedError, match="'r'"):
            run.add_metadata(b=2)
    finally:
        release.set()
        closer.join(60)
    assert reports[0].ok and reports[0].delivered == 1
    states.append((run.state, run.close_finished()))
    assert states == [
        (RunState.NEW, False),
        (RunState.OPEN, False),
        (RunState.CLOSING, False),  # closed, not finished
        (RunState.CLOSED, True),
    ]
    with pytest.raises(TrackerClosedError, match="'r' is closed"):
        run.flush()


def test_a_run_closed_before_any_write_goes_from_new_to_closed(make_run: MakeRun) -> None:
    run = make_run("r", [InMemoryTracker()])
    states = [run.state]
    assert run.close().ok
    states.append(run.state)
    assert states == [RunState.NEW, RunState.CLOSED]
    with pytest.raises(TrackerClosedError, match="'r' is closed"):
        run.log_metric("m", 1.0)


def test_write_after_close_raises_without_backends(make_run: MakeRun) -> None:
    run = make_run("<UNDEFINED>")
    run.add_metadata(a=1)
    run.close()
    with pytest.raises(TrackerClosedError):
        run.log_metric("x", 1.0)


def test_flush_after_close_raises(make_run: MakeRun) -> None:
    run = make_run("r", [InMemoryTracker()])
    run.add_metadata(a=1)
    run.close()
    with pytest.raises(TrackerClosedError):
        run.flush()


def test_reads_after_close_still_work(make_run: MakeRun) -> None:
    run = make_run("r", [InMemoryTracker()])
    run.add_metadata(a=1)
    run.close()
    assert run.metadata() == {"a": 1}


def test_with_block_closes(make_run: MakeRun) -> None:
    mem = InMemoryTracker()
    with make_run("r", [mem]) as run:
        run.log_metric("x", 1.0)
    assert run.closed
    assert mem.points("r", "x")[0].value == 1.0


def test_strict_close_raises_when_not_everything_was_delivered(make_run: MakeRun) -> None:
    bad = FaultyTracker(name="bad").always("add_metadata", permanent("refused"))
    run = make_run("r", [bad], strict=True)
    run.add_metadata(a=1)
    with pytest.raises(DeliveryError, match="refused"):
        run.close()


# -- reports and status -------------------------------------------------------------------------


def test_status_and_report_counters(
    make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = iter(float(i) for i in range(1000))
    good = InMemoryTracker(name="good")
    bad = FaultyTracker(name="bad").always("add_artifact", permanent("no artifacts here"))
    run = make_run("r", [good, bad])
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: next(ticks))
    before = run.status()
    assert isinstance(before, TrackerStatus) and before.run_id == "r" and not before.closed

    run.add_metadata(a=1)
    run.log_metrics({"x": 1.0, "y": 2.0}, step=0)
    status = run.status()
    assert set(status.backends) == {"good", "bad"}
    assert all(isinstance(s, BackendStatus) for s in status.backends.values())
    assert status.backends["good"].buffered == 3 and status.backends["good"].delivered == 0

    report = run.flush()
    assert report.delivered == 6 and report.pending == 0 and report.dropped == 0
    assert report.ok and report.errors == {} and not report.timed_out

    run.add_artifact("model", "/m")  # refused for good by "bad": dropped alone
    run.log_metric("x", 3.0)
    report = run.flush()
    assert report.delivered == 6 + 3 and report.dropped == 1
    assert not report.ok
    assert "RecordError" in report.errors["bad"]
    assert "no artifacts" in report.errors["bad"]
    assert "no artifacts" in report.refused["bad"][0]
    assert "good" not in report.errors
    status = run.status()
    good_s, bad_s = status.backends["good"], status.backends["bad"]
    assert (good_s.delivered, good_s.dropped, good_s.in_flight, good_s.buffered) == (5, 0, 0, 0)
    assert (bad_s.delivered, bad_s.dropped, bad_s.in_flight) == (4, 1, 0)
    assert bad_s.last_error is not None and "no artifacts" in bad_s.last_error
    assert good_s.healthy and good_s.last_error is None and good_s.lag_s == 0.0
    assert good_s.retries == 0 and good_s.spooled == 0


def test_report_ok_needs_everything_delivered() -> None:
    assert FlushReport().ok
    assert not FlushReport(pending=1).ok
    assert not FlushReport(spooled=1).ok
    assert not FlushReport(dropped=1).ok
    assert not FlushReport(errors={"b": "boom"}).ok


# -- the names W&B and Trackio users type -------------------------------------------------------


def test_log_config_and_finish_as_in_wandb(make_run: MakeRun) -> None:
    backend = InMemoryTracker()
    run = make_run("wandb-habits", [backend])
    run.add_metadata(lr=0.1)
    run.log({"loss": 0.5, "acc": 0.9}, step=3)
    run.log({"loss": 0.25})  # the step after the last one
    with pytest.raises(TypeError, match="'phase'"):
        run.log({"loss": 0.125, "phase": "train"}, step=9)
    # The config: what was recorded, and W&B's ways of adding to it.
    assert run.config["lr"] == 0.1 and dict(run.config) == {"lr": 0.1}
    run.config.update({"batch_size": 64, "layers": [64, 64]})
    run.config["optimizer"] = "adam"
    assert dict(run.config) == {
        "lr": 0.1, "batch_size": 64, "layers": [64, 64], "optimizer": "adam"
    }  # fmt: skip
    assert "optimizer" in run.config and len(run.config) == 4
    with pytest.raises(TypeError, match="'bad'"):
        run.config.update(bad=object())
    report = run.finish()
    assert isinstance(report, FlushReport) and report.ok and run.finish() is report
    assert run.state is RunState.CLOSED
    reader = make_run("wandb-habits", [backend])
    metrics = reader.metrics()
    # Each metric of a log() call, at its step; the refused call kept nothing.
    assert [(p.step, p.value) for p in metrics["loss"]] == [(3, 0.5), (4, 0.25)]
    assert [(p.step, p.value) for p in metrics["acc"]] == [(3, 0.9)]
    assert reader.metadata() == {
        "lr": 0.1, "batch_size": 64, "layers": [64, 64], "optimizer": "adam"
    }  # fmt: skip


async def test_afinish_is_aclose(make_run: MakeRun) -> None:
    run = make_run("wandb-async", [InMemoryTracker()])
    run.log({"loss": 1.0})
    report = await run.afinish()
    assert report.delivered >= 1 and run.state is RunState.CLOSED
