"""The runs of this process that are writing: what a read waits for, so that it sees them.

One :class:`Writers` per process, owned by its :class:`~async_tracker.runtime.process.Runtime`
(``runtime().writers``): a forked child's runtime starts with none, and never waits for the
parent's runs, whose records are the parent's to deliver. A run is added when its pipeline
starts (its first write) and leaves when its close is over; a read looks up the runs writing
its run id (or any run) to its store, and :mod:`async_tracker.own_writes` waits for them.

A store is whatever a read and a write agree on (:func:`async_tracker.own_writes.store_key`):
the backend's ``store_id``, else the backend object itself. This module knows neither runs
nor backends, only this interface: the runtime never imports the layers above it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol


class Writer(Protocol):
    """What a read needs of a run that writes (``AppRun``)."""

    @property
    def id(self) -> str: ...

    def writes_to(self, store: Hashable) -> bool:
        """Whether one of the run's backends is ``store``."""
        ...

    async def settle_writes(self, store: Hashable, timeout: float | None) -> int:
        """On the tracker loop: waits at most ``timeout`` seconds (None: no bound) until what
        the run accepted so far has reached ``store``; returns how many of its records have
        not (still in memory, or spooled)."""
        ...


class Writers:
    """The writing runs of one process, looked up by run id and store.

    Added and removed from any thread (a run's first write, the tracker loop at the end of
    its close) and read from any thread: each is one dict operation, atomic under the GIL,
    and a lookup goes through a copy. No lock: a SIGTERM handler closing runs on a thread
    that was adding one must never wait for itself.
    """

    def __init__(self) -> None:
        # Keyed by id(): runs compare equal by value (id and backends), and each of two
        # equal runs writes records of its own.
        self._runs: dict[int, Writer] = {}

    def add(self, run: Writer) -> None:
        self._runs[id(run)] = run

    def discard(self, run: Writer) -> None:
        self._runs.pop(id(run), None)

    def __len__(self) -> int:
        return len(self._runs)

    def find(self, store: Hashable, run_id: str | None) -> list[Writer]:
        """The runs writing ``run_id`` (None: any run) to ``store``."""
        return [
            run
            for run in list(self._runs.values())
            if (run_id is None or run.id == run_id) and run.writes_to(store)
        ]
