"""Tracker factories that the environment tests name in ``TORCHX_TRACKERS`` (as entry points
of a fake distribution, or as ``module:attr`` paths). Each records the config it was given."""

from __future__ import annotations

from async_tracker import AsyncTrackerBase, TrackerBase
from async_tracker.backend.memory import InMemoryTracker
from tests.faulty import DictTracker, FaultyTracker, Hang

# (factory, config) of every call, and what was built, in order. Reset by the tests' fixture.
CALLS: list[tuple[str, str | None]] = []
BUILT: list[object] = []


def reset() -> None:
    CALLS.clear()
    BUILT.clear()


def make_memory(config: str | None) -> AsyncTrackerBase:
    CALLS.append(("make_memory", config))
    tracker = InMemoryTracker()
    BUILT.append(tracker)
    return tracker


def make_dict(config: str | None) -> TrackerBase:
    CALLS.append(("make_dict", config))
    tracker = DictTracker()
    BUILT.append(tracker)
    return tracker


def make_faulty(config: str | None) -> AsyncTrackerBase:
    CALLS.append(("make_faulty", config))
    tracker = FaultyTracker()
    if config == "hang-on-close":
        tracker.always("aclose", Hang())
    BUILT.append(tracker)
    return tracker


def make_broken(config: str | None) -> TrackerBase:
    CALLS.append(("make_broken", config))
    raise RuntimeError(f"cannot build from {config!r}")


def make_not_a_tracker(config: str | None) -> object:
    CALLS.append(("make_not_a_tracker", config))
    return {"not": "a tracker"}


class Nested:
    """For a dotted ``module:Class.attr`` path."""

    @staticmethod
    def make(config: str | None) -> AsyncTrackerBase:
        CALLS.append(("Nested.make", config))
        tracker = InMemoryTracker()
        BUILT.append(tracker)
        return tracker


NOT_CALLABLE = 42
