"""The metadata clock: stamps follow the wall clock and never go back in a process; within a
run, the sequence number orders a key's writes whatever the stamps say."""

from __future__ import annotations

import pytest

from async_tracker import AppRun
from async_tracker.backend.memory import InMemoryTracker
from async_tracker.clock import HybridClock
from async_tracker.ingress import METADATA
from async_tracker.pipeline.cutter import Cutter

SECOND = 1_000_000_000


@pytest.fixture(autouse=True)
def fresh_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new process clock for each test: stamps of earlier tests (real times) would be
    above the injected wall times, which would then only count on from them."""
    monkeypatch.setattr("async_tracker.run._metadata_clock", HybridClock())


def test_stamps_follow_the_wall_clock_and_count_on_after_a_step_back() -> None:
    clock = HybridClock()
    assert clock.stamp(100 * SECOND) == 100 * SECOND
    assert clock.stamp(101 * SECOND) == 101 * SECOND
    # Stepped back 10 s: the last stamp plus a count, until the wall clock passes it.
    assert clock.stamp(91 * SECOND) == 101 * SECOND + 1
    assert clock.stamp(91 * SECOND) == 101 * SECOND + 2
    assert clock.stamp(101 * SECOND) == 101 * SECOND + 3
    assert clock.stamp(102 * SECOND) == 102 * SECOND


def test_a_runs_metadata_stamps_rise_with_its_sequence_numbers() -> None:
    # Stamps that do not rise (two threads racing on the process's clock, or records made by
    # hand) are raised just above the run's previous one, batch after batch.
    cutter = Cutter("t")
    first = cutter.cut([(METADATA, ({"lr": 1}, 5 * SECOND))])
    second = cutter.cut([(METADATA, ({"lr": 2}, 3 * SECOND)), (METADATA, ({"wd": 0}, 3))])
    assert first.metadata_ns == {"lr": 5 * SECOND}
    assert second.metadata_ns == {"lr": 5 * SECOND + 1, "wd": 5 * SECOND + 2}


@pytest.mark.parametrize("reopen", [False, True], ids=["same-run", "reopened-run"])
def test_memory_keeps_the_later_write_when_the_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch, reopen: bool
) -> None:
    now = [1_700_000_100.0]
    monkeypatch.setattr("async_tracker.run._wall_clock", lambda: now[0])
    mem = InMemoryTracker()
    run = AppRun("r", [mem], flush_interval=3600)
    run.add_metadata(lr=1)
    assert run.flush().ok
    if reopen:
        assert run.close().ok
        run = AppRun("r", [mem], flush_interval=3600)
    now[0] -= 10.0  # NTP steps the wall clock back
    run.add_metadata(lr=2)
    assert run.flush().ok
    assert run.metadata() == {"lr": 2}
    assert run.close().ok
    assert mem.runs["r"].metadata == {"lr": 2}
