"""Ordering and retries through backends that fail, hang or slow on a schedule.

Retries do not wait (``FAST_RETRY``: 3 attempts, no backoff, no jitter); a lane whose attempts
run out parks its batch until the next flush() or close(), so each flush() below is one
round of attempts. Time never decides an outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from async_tracker import (
    AppRun,
    RetryPolicy,
    TrackerMetric,
    TrackerSource,
    TransientBackendError,
)
from async_tracker.backend.memory import InMemoryTracker
from tests.core.helpers import wait_until
from tests.faulty import (
    DictTracker,
    FaultyTracker,
    Hang,
    HangingTracker,
    Raise,
    RefuseIf,
    Slow,
    backend_down,
    transient,
)

MakeRun = Callable[..., AppRun]


def stored(faulty: FaultyTracker) -> InMemoryTracker:
    assert isinstance(faulty.inner, InMemoryTracker)
    return faulty.inner


def ok_kwargs(faulty: FaultyTracker, method: str) -> list[dict[str, object]]:
    return [c.kwargs for c in faulty.calls_to(method, "ok")]


# -- retries ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [ConnectionError("reset"), TimeoutError("slow"), TransientBackendError("throttled")],
    ids=["ConnectionError", "TimeoutError", "TransientBackendError"],
)
def test_transient_errors_are_retried(make_run: MakeRun, error: Exception) -> None:
    flaky = FaultyTracker(name="flaky").on("add_metadata", 1, 2, action=Raise(lambda: error))
    run = make_run("r", [flaky])
    run.add_metadata(a=1)
    report = run.flush()
    assert report.ok and report.delivered == 1, report
    assert [c.outcome for c in flaky.calls_to("add_metadata")] == [
        f"raised {type(error).__name__}",
        f"raised {type(error).__name__}",
        "ok",
    ]
    status = run.status().backends["flaky"]
    assert status.retries == 2 and status.healthy
    assert stored(flaky).runs["r"].metadata == {"a": 1}


def test_a_blocking_trackerbase_is_retried_too(make_run: MakeRun) -> None:
    class Flaky(DictTracker):
        failures = 2

        def add_metadata(self, run_id: str, **kwargs: object) -> None:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("server restarting")
            super().add_metadata(run_id, **kwargs)

    flaky = Flaky(name="flaky")
    run = make_run("r", [flaky])
    run.add_metadata(a=1)
    assert run.flush().ok
    assert flaky.metadata("r") == {"a": 1} and run.status().backends["flaky"].retries == 2


def test_a_retry_never_repeats_a_part_already_stored(make_run: MakeRun) -> None:
    # The second artifact fails once: the retry must skip the metadata, the first artifact
    # and nothing else, and store the rest once.
    flaky = FaultyTracker(name="flaky").on("add_artifact", 2, action=transient())
    run = make_run("r", [flaky])
    run.add_metadata(a=1)
    run.add_artifact("first", "/1")
    run.add_artifact("second", "/2")
    run.add_source("parent", "model")
    run.log_metrics({"x": 1.0, "y": 2.0}, step=0)
    assert run.flush().ok
    assert flaky.count("write_batch") == 2
    assert flaky.count("add_metadata") == 1
    assert [c.args[1] for c in flaky.calls_to("add_artifact")] == ["first", "second", "second"]
    assert flaky.count("add_source") == 1 and flaky.count("add_metrics") == 1
    mem = stored(flaky).runs["r"]
    assert mem.metadata == {"a": 1} and sorted(mem.artifacts) == ["first", "second"]
    assert mem.sources == [TrackerSource("parent", "model")]
    assert {n: len(p) for n, p in mem.by_name().items()} == {"x": 1, "y": 1}


def test_metrics_failing_after_the_rest_are_retried_alone(make_run: MakeRun) -> None:
    flaky = FaultyTracker(name="flaky").on("add_metrics", 1, action=transient())
    run = make_run("r", [flaky])
    run.add_metadata(a=1)
    for step in range(5):
        run.log_metric("loss", float(step), step=step)
    assert run.flush().ok
    assert flaky.count("add_metadata") == 1 and flaky.count("add_metrics") == 2
    assert [p.step for p in stored(flaky).points("r", "loss")] == [0, 1, 2, 3, 4]


def test_exhausted_retries_park_the_batch_until_the_next_flush(make_run: MakeRun) -> None:
    down = FaultyTracker(name="down").always("write_batch", transient("server down"))
    run = make_run("r", [down])
    run.add_metadata(a=1)
    run.log_metric("x", 1.0)
    report = run.flush()
    # Parked, the batch goes to disk (the spiller, beside the flush's answer: either place).
    assert not report.ok and report.pending + report.spooled == 2 and report.delivered == 0
    assert "ConnectionError" in report.errors["down"] and "server down" in report.errors["down"]
    status = run.status().backends["down"]
    assert not status.healthy and status.retries == 2
    assert status.in_flight + status.spooled == 2
    assert down.count("write_batch") == 3  # FAST_RETRY: 3 attempts, then parked

    report = run.flush()  # still down: one more round of attempts, no more
    assert report.pending + report.spooled == 2 and down.count("write_batch") == 6

    down.heal()
    report = run.flush()
    assert report.ok and report.delivered == 2 and report.errors == {}
    assert run.status().backends["down"].healthy
    assert stored(down).runs["r"].metadata == {"a": 1}


def test_close_retries_a_parked_batch(make_run: MakeRun) -> None:
    down = FaultyTracker(name="down").on("write_batch", 1, 2, 3, action=transient())
    run = make_run("r", [down])
    run.add_metadata(a=1)
    assert run.flush().pending == 1
    report = run.close()  # the 4th attempt succeeds
    assert report.ok and report.delivered == 1
    assert stored(down).runs["r"].metadata == {"a": 1}


def test_a_refused_record_is_dropped_alone_counted_and_named(make_run: MakeRun) -> None:
    # One value the backend cannot store: the batch is split until it stands alone.
    picky = FaultyTracker(name="picky").always(
        "add_metrics", RefuseIf(lambda m: isinstance(m, TrackerMetric) and m.value == 13.0)
    )
    run = make_run("r", [picky])
    run.add_metadata(a=1)
    for i in range(200):
        run.log_metric("x", float(i), step=i)
    report = run.flush()
    assert report.dropped == 1 and report.pending == 0 and report.delivered == 200
    assert not report.ok and "RecordError" in report.errors["picky"]
    assert report.refused["picky"] and "value refused" in report.refused["picky"][0]
    points = stored(picky).points("r", "x")
    assert [p.step for p in points] == [i for i in range(200) if i != 13]
    assert stored(picky).runs["r"].metadata == {"a": 1}
    # The lane is not blocked: the next batch goes through.
    run.add_metadata(b=2)
    report = run.flush()
    assert report.delivered == 201 and report.dropped == 1
    assert stored(picky).runs["r"].metadata == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    "action",
    [backend_down("read-only"), Raise(lambda: ValueError("bad")), Raise(lambda: KeyError("k"))],
    ids=["PermanentBackendError", "ValueError", "KeyError"],
)
def test_a_failing_backend_keeps_the_records(make_run: MakeRun, action: Raise) -> None:
    # A failure of the backend, or one it did not map: nothing is dropped; the records wait
    # and go once the backend takes them.
    picky = FaultyTracker(name="picky").on("write_batch", 1, action=action)
    run = make_run("r", [picky])
    run.add_metadata(a=1)
    run.log_metric("x", 1.0)
    report = run.flush()
    assert report.dropped == 0 and report.pending == 2 and report.delivered == 0
    assert not report.ok and "picky" in report.errors
    assert picky.count("write_batch") == 1  # not retried at once: it ends the round
    report = run.flush()
    assert report.ok and report.delivered == 2 and report.dropped == 0
    assert stored(picky).runs["r"].metadata == {"a": 1}


# -- ordering -----------------------------------------------------------------------------------


def test_metadata_within_a_batch_is_merged_in_call_order(make_run: MakeRun) -> None:
    faulty = FaultyTracker(name="f")
    run = make_run("r", [faulty])
    run.add_metadata(k=1, a="x")
    run.add_metadata(k=2)
    run.add_metadata(k=3, b="y")
    assert run.flush().ok
    assert ok_kwargs(faulty, "add_metadata") == [{"k": 3, "a": "x", "b": "y"}]


def test_last_metadata_wins_across_flushes_and_retries(make_run: MakeRun) -> None:
    # Batch 1 (k=1) fails a whole round and is parked; batch 2 (k=2) comes later. On the next
    # round batch 1 must be delivered before batch 2, so k=2 wins.
    flaky = FaultyTracker(name="flaky").on("add_metadata", 1, 2, 3, action=transient())
    run = make_run("r", [flaky])
    run.add_metadata(k=1, only_first=True)
    assert run.flush().pending == 1
    run.add_metadata(k=2)
    report = run.flush()
    assert report.ok and report.delivered == 2
    assert ok_kwargs(flaky, "add_metadata") == [{"k": 1, "only_first": True}, {"k": 2}]
    assert stored(flaky).runs["r"].metadata == {"k": 2, "only_first": True}


def test_later_batches_wait_behind_a_retried_one(make_run: MakeRun) -> None:
    flaky = FaultyTracker(name="flaky").on("write_batch", 1, 2, 3, action=transient())
    run = make_run("r", [flaky])
    run.log_metric("x", 0.0, step=0)
    run.flush()
    for step in range(1, 4):  # three more batches queue behind the parked one
        run.log_metric("x", float(step), step=step)
        run.flush(timeout=0)
    assert run.flush().ok
    delivered = [c.args[1][0].step for c in flaky.calls_to("add_metrics", "ok")]
    assert delivered == [0, 1, 2, 3]


def test_order_is_kept_with_intermittent_failures_and_many_batches(make_run: MakeRun) -> None:
    # Every third write_batch call fails: each batch succeeds within its attempts, in order.
    flaky = FaultyTracker(name="flaky").when("write_batch", lambda n: n % 3 == 0, transient())
    run = make_run("r", [flaky], batch_size=10)
    for i in range(200):
        run.log_metric("x", float(i))
        run.add_metadata(last=i)
        if i % 25 == 0:
            run.flush(timeout=0)
    report = run.flush()
    assert report.ok and report.delivered == 400
    values = [p.value for c in flaky.calls_to("add_metrics", "ok") for p in c.args[1]]
    assert values == [float(i) for i in range(200)]
    assert [kw["last"] for kw in ok_kwargs(flaky, "add_metadata")] == sorted(
        kw["last"] for kw in ok_kwargs(flaky, "add_metadata")  # type: ignore[type-var]
    )
    assert stored(flaky).runs["r"].metadata == {"last": 199}
    failures = flaky.count("write_batch", "raised ConnectionError")
    assert failures > 0 and run.status().backends["flaky"].retries == failures


# -- isolation between backends -----------------------------------------------------------------


def test_a_hung_async_backend_never_delays_the_other(
    make_run: MakeRun, release: threading.Event
) -> None:
    hang = Hang(release)
    stuck = FaultyTracker(name="stuck").on("write_batch", 1, action=hang)
    fine = FaultyTracker(name="fine")
    run = make_run("r", [stuck, fine])
    for batch in range(3):
        run.log_metric("x", float(batch), step=batch)
        run.flush(timeout=0)  # cut a batch; do not wait
        # The healthy backend gets each batch while the other is still stuck on the first.
        assert fine.wait_for("write_batch", batch + 1, outcome="ok")
    assert hang.entered.wait(10) and stuck.count("write_batch") == 1
    # The healthy lane counts a batch on the tracker loop just after its write returned,
    # which is when wait_for() above may already have woken us: wait for the count.
    wait_until(lambda: run.status().backends["fine"].delivered == 3, "fine delivered 3")
    status = run.status().backends
    assert status["fine"].delivered == 3 and status["stuck"].in_flight == 3
    assert status["stuck"].lag_s > 0 and status["fine"].lag_s == 0
    assert [p.step for p in stored(fine).points("r", "x")] == [0, 1, 2]

    release.set()
    assert run.flush().ok
    assert [p.step for p in stored(stuck).points("r", "x")] == [0, 1, 2]


def test_a_blocking_backend_hung_in_its_thread_never_delays_the_other(
    make_run: MakeRun, release: threading.Event
) -> None:
    hung = HangingTracker(release=release, name="hung")
    fine = FaultyTracker(name="fine")
    run = make_run("r", [hung, fine])
    for batch in range(3):
        run.add_metadata(batch=batch)
        run.flush(timeout=0)
        assert fine.wait_for("write_batch", batch + 1, outcome="ok")
    # The hung thread may start after the other backend took all three batches: wait for it.
    assert hung.entered.wait(10) and hung.hung_calls == 1
    release.set()
    assert run.flush().ok
    assert hung.metadata("r") == {"batch": 2}


def test_a_failing_backend_never_delays_the_other(make_run: MakeRun) -> None:
    down = FaultyTracker(name="down").always("write_batch", transient())
    fine = FaultyTracker(name="fine")
    run = make_run("r", [down, fine])
    for batch in range(3):
        run.add_metadata(batch=batch)
        run.flush(timeout=0)
        assert fine.wait_for("write_batch", batch + 1, outcome="ok")
    report = run.flush()
    # Down's 3 batches: the one being retried in memory, the rest in memory or spooled
    # (depending on whether they arrived before its retries ran out).
    assert report.delivered == 3 and report.pending + report.spooled == 3
    assert "down" in report.errors and "fine" not in report.errors


def test_a_slow_backend_never_delays_the_other(make_run: MakeRun) -> None:
    slow = FaultyTracker(name="slow").always("write_batch", Slow(60.0))
    fine = FaultyTracker(name="fine")
    run = make_run("r", [slow, fine])
    for batch in range(5):
        run.add_metadata(batch=batch)
        run.flush(timeout=0)
    assert fine.wait_for("write_batch", 5, outcome="ok")
    assert stored(fine).runs["r"].metadata == {"batch": 4}
    report = run.close(timeout=0.1)
    assert report.delivered == 5 and report.pending + report.spooled == 5
    assert slow.count("write_batch", "ok") == 0


# -- the retry policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"max_attempts": 0}, {"initial_backoff_s": -1}, {"jitter_s": -0.1}, {"cooldown_s": -5}],
)
def test_retry_policy_refuses_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
