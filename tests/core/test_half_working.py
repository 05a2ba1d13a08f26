"""A backend that half-works: each call (a part of a batch) fails at random, and retries follow
progress, so that such a backend is slow, never stalled as a dead one.

The faults come from a seeded generator; every batch is cut at one ``flush()`` (a batch size
past what is written), so each seed gives the same calls in the same order: no outcome depends
on timing. Retries do not wait, and a lane that ends a round parks until the next flush or
close (``cooldown_s`` of an hour), so ``flush()`` returns with records pending exactly when a
round ended without delivering everything.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from async_tracker import AppRun, RetryPolicy, TrackerSource
from async_tracker.backend.memory import InMemoryTracker
from tests.faulty import FaultyTracker, backend_down, transient

MakeRun = Callable[..., AppRun]

PARTS = ("add_metrics", "add_metadata", "add_artifact", "add_source")
METRICS = 100_000
OTHERS = 100  # of each: metadata, artifacts, sources

# A round is 10 tries in a row that store nothing: at 30% of calls failing, a round ends by
# chance once in 0.3**-10 (about 170,000) tries, never in these schedules; before, it ended
# after 10 tries whatever they stored, which a batch of a few hundred parts always reaches.
POLICY = RetryPolicy(
    max_attempts=10, initial_backoff_s=0, max_backoff_s=0, jitter_s=0, cooldown_s=3600
)


def half_working(seed: int, rate: float = 0.3) -> FaultyTracker:
    """A backend failing ``rate`` of its calls at random (transient errors), per part."""
    rng = random.Random(seed)
    flaky = FaultyTracker(name="flaky")
    for method in PARTS:
        flaky.when(method, lambda _n: rng.random() < rate, transient())
    return flaky


def write_job(run: AppRun) -> int:
    """100,000 metric points and 300 other records, interleaved; returns how many."""
    for i in range(METRICS):
        run.log_metric("loss", float(i), step=i)
        if i % (METRICS // OTHERS) == 0:
            k = i // (METRICS // OTHERS)
            run.add_metadata(**{f"key{k}": k})
            run.add_artifact(f"art{k}", f"/out/{k}")
            run.add_source(f"parent{k}")
    return METRICS + 3 * OTHERS


def check_stored(flaky: FaultyTracker) -> None:
    """Everything once, in call order."""
    assert isinstance(flaky.inner, InMemoryTracker)
    mem = flaky.inner.runs["job"]
    # Points in the order they arrived (each add_metrics that succeeded, in turn).
    arrived = [p.step for c in flaky.calls_to("add_metrics", "ok") for p in c.args[1]]
    assert arrived == list(range(METRICS))
    assert mem.metadata == {f"key{k}": k for k in range(OTHERS)}
    assert mem.artifacts.keys() == {f"art{k}" for k in range(OTHERS)}
    assert [c.args[1] for c in flaky.calls_to("add_artifact", "ok")] == [
        f"art{k}" for k in range(OTHERS)
    ]
    assert mem.sources == [TrackerSource(f"parent{k}", None) for k in range(OTHERS)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_half_working_backend_gets_everything_in_one_flush(
    make_run: MakeRun, seed: int
) -> None:
    flaky = half_working(seed)
    run = make_run("job", [flaky], retry=POLICY, batch_size=200_000)
    accepted = write_job(run)
    report = run.flush()
    # One round per run of failures, however many tries stored parts: nothing left parked.
    assert report.ok and report.delivered == accepted, report
    assert flaky.count("add_artifact", "raised ConnectionError") > 10  # it did fail
    assert run.status().backends["flaky"].retries >= POLICY.max_attempts
    closed = run.close(timeout=60)
    assert closed.ok and not closed.timed_out, closed
    assert (closed.delivered, closed.pending, closed.spooled, closed.dropped) == (
        accepted, 0, 0, 0
    )
    check_stored(flaky)


# Waits that double with each try that stored nothing, from a microsecond, without a bound:
# after a try that stored a part the next one goes at once. Before, they doubled with every try
# of the batch, and past about forty tries the next wait ran past any close deadline.
DOUBLING = RetryPolicy(
    max_attempts=10, initial_backoff_s=1e-6, max_backoff_s=3600, jitter_s=0, cooldown_s=3600
)


@pytest.mark.parametrize("seed", [4, 5])
def test_a_half_working_backend_gets_everything_at_close(
    make_run: MakeRun, tmp_path: Path, seed: int
) -> None:
    flaky = half_working(seed)
    run = make_run(
        "job", [flaky], retry=DOUBLING, batch_size=200_000, spool_dir=str(tmp_path)
    )
    accepted = write_job(run)
    report = run.close(timeout=60)  # the one batch is cut and delivered by the close
    assert report.ok and not report.timed_out, report
    # Each accepted record counted once, as delivered.
    assert (report.delivered, report.pending, report.spooled, report.dropped) == (
        accepted, 0, 0, 0
    )
    check_stored(flaky)


def test_a_backend_failure_after_stored_parts_starts_a_new_round_at_once(
    make_run: MakeRun,
) -> None:
    # A failure of the backend ends a round at once; when the try had stored parts first,
    # the backend half-works, and the next round starts without the cooldown's pause.
    flaky = FaultyTracker(name="flaky").on("add_artifact", 2, action=backend_down())
    run = make_run("job", [flaky], retry=POLICY)
    run.add_metadata(a=1)
    run.add_artifact("first", "/1")
    run.add_artifact("second", "/2")
    report = run.flush()
    assert report.ok and report.delivered == 3, report
    assert run.status().backends["flaky"].last_error is not None
    assert [c.args[1] for c in flaky.calls_to("add_artifact")] == ["first", "second", "second"]
    assert flaky.count("add_metadata") == 1

