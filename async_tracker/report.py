"""What ``flush()``, ``close()`` and ``status()`` tell the caller.

Counts are records accepted by ``AppRun`` (one ``add_metadata`` call, one metric point ...),
counted once per backend that takes them: a point sent to two backends counts twice.
They cover the whole life of the run, not just the last call.

The run's end record (how it ended, sealed at close) is not one of them: the counts add up to
what was logged. Where it waits is told apart (``end_pending``, ``end_spooled``), and a
report is ``ok`` only once every backend has it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BackendStatus:
    """The state of one backend's lane."""

    name: str
    buffered: int
    in_flight: int
    spooled: int
    delivered: int
    dropped: int
    retries: int
    last_error: str | None
    lag_s: float
    healthy: bool
    spool_path: str | None = None
    shed: int = 0  # metrics dropped by the drop_oldest overflow policy (counted in dropped)
    # What was dropped for good and why: records a backend refused, damaged spool lines.
    refused: tuple[str, ...] = ()
    # End records not delivered: in memory (lost at exit), and on disk.
    end_pending: int = 0
    end_spooled: int = 0
    # Records an earlier process of this run left in the spool, taken over by this lane
    # (counted in delivered, spooled ... as well): this process did not accept them.
    replayed: int = 0
    # Once a close stopped the lane: records of a backend call it cut off, which the backend
    # may store after all (counted in spooled or in_flight as well: where they wait).
    in_doubt: int = 0


@dataclass(frozen=True)
class TrackerStatus:
    """A snapshot of a run; reading it never waits for the tracker loop."""

    run_id: str
    closed: bool
    backends: dict[str, BackendStatus] = field(default_factory=dict)
    # Over max_buffered now; and what the block overflow policy has cost the writers.
    overloaded: bool = False
    blocked_writes: int = 0
    blocked_s: float = 0.0


@dataclass(frozen=True)
class FlushReport:
    """What a ``flush()`` or ``close()`` achieved.

    ``delivered``: stored by backends. ``pending``: still in memory, in flight or waiting for
    a backend to come back. ``spooled``: written to the local spool (``spool_paths`` says
    where), to be replayed later. ``dropped``: discarded by a policy the user chose, or refused
    by a backend as permanently invalid; ``shed`` is the part the ``drop_oldest`` overflow
    policy dropped. ``blocked_writes`` and ``blocked_s``: the writes the ``block`` overflow
    policy held back, and how long they waited in all. ``errors``: the last error of each
    backend that has one. ``refused``: per backend, what was dropped for good and why.
    ``end_pending`` and ``end_spooled``: backends that do not have the run's end status yet
    (it waits in memory, or in the spool), counted apart from the records. ``replayed``: the
    records an earlier process of this run left in the spool, which this one took over; they
    are counted in the others too, so that ``delivered + pending + spooled + dropped`` is what
    this process accepted plus ``replayed``. ``ok`` is true when everything accepted so far is
    delivered, the end status included.

    A report of ``close()`` is the outcome, not a snapshot: when it returns, ``delivered``
    records are stored, ``spooled`` ones are in the spool (where the next start with the same
    ``spool_dir``, a run reopened in this process included, or ``async-tracker sync`` delivers
    them), ``pending`` ones are in memory only and go with the process, and nothing of the run
    moves any more. One exception, counted: ``in_doubt`` records were in a backend call the
    close cut off at its deadline (a call left running in a worker thread, a request already
    sent, or a tracker loop blocked by a backend); the backend may store them after all. They
    are counted where their copy waits (spooled or pending) as well; a replay of a spooled
    copy that the backend stored already is stored once by idempotent backends.
    """

    delivered: int = 0
    pending: int = 0
    spooled: int = 0
    dropped: int = 0
    shed: int = 0
    blocked_writes: int = 0
    blocked_s: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)
    spool_paths: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False
    refused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    end_pending: int = 0
    end_spooled: int = 0
    replayed: int = 0
    in_doubt: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.pending == 0
            and self.spooled == 0
            and self.dropped == 0
            and not self.errors
            and self.end_pending == 0
            and self.end_spooled == 0
        )

    @classmethod
    def from_status(cls, status: TrackerStatus, timed_out: bool = False) -> FlushReport:
        b = status.backends.values()
        return cls(
            delivered=sum(s.delivered for s in b),
            pending=sum(s.buffered + s.in_flight for s in b),
            spooled=sum(s.spooled for s in b),
            dropped=sum(s.dropped for s in b),
            shed=sum(s.shed for s in b),
            blocked_writes=status.blocked_writes,
            blocked_s=status.blocked_s,
            # A lane still retrying when a close timed out is healthy on paper (its retries
            # never ran out): its last error is why its records were not delivered.
            errors={
                s.name: s.last_error
                for s in b
                if s.last_error
                and (
                    s.dropped
                    or not s.healthy
                    or (
                        timed_out
                        and (
                            s.buffered or s.in_flight or s.spooled or s.end_pending
                            or s.end_spooled
                        )
                    )
                )
            },
            spool_paths={
                s.name: s.spool_path
                for s in b
                if s.spool_path and (s.spooled or s.end_spooled)
            },
            timed_out=timed_out,
            refused={s.name: s.refused for s in b if s.refused},
            end_pending=sum(s.end_pending for s in b),
            end_spooled=sum(s.end_spooled for s in b),
            replayed=sum(s.replayed for s in b),
            in_doubt=sum(s.in_doubt for s in b),
        )

    def summary(self, run_id: str, stores: Mapping[str, str] | None = None) -> str:
        """At most five short lines for a person: what was not delivered, where it waits,
        and the command that delivers it. Empty when the report is ok.

        ``stores`` maps backend names to the store URL of those that are fsspec stores:
        when every spooled backend is one store, the command names it (``--to URL``), and
        works without the job's tracker configuration."""
        if self.ok:
            return ""
        counts = [f"{self.delivered} delivered", f"{self.spooled} spooled"]
        if self.pending:
            counts.append(f"{self.pending} left in memory (lost at exit)")
        if self.dropped:
            counts.append(f"{self.dropped} dropped")
        if self.replayed:
            counts.append(f"{self.replayed} of them from an earlier process's spool")
        if self.in_doubt:
            counts.append(f"{self.in_doubt} of them in a write cut off (the backend may have them)")
        if self.end_spooled:
            counts.append("its end status spooled")
        if self.end_pending:
            counts.append("its end status left in memory")
        records = self.pending or self.spooled or self.dropped
        what = "records" if records else "its end status"
        lines = [
            f"async_tracker: run {run_id!r} ended with {what} not delivered: "
            + ", ".join(counts)
            + (" (close timed out)" if self.timed_out else "")
        ]
        for name, error in list(self.errors.items())[:2]:
            lines.append(f"  {name}: {_short(error)}")
        if self.spool_paths:
            # <spool root>/<run>/<backend>: sync takes the root and replays every run in it.
            roots = sorted({os.path.dirname(os.path.dirname(p)) for p in self.spool_paths.values()})
            lines.append(f"  spooled in {', '.join(self.spool_paths.values())}"[:200])
            targets = {(stores or {}).get(name) for name in self.spool_paths}
            target = targets.pop() if len(targets) == 1 else None
            if target:
                lines.append(
                    f"  deliver them: async-tracker sync {_quote(roots[0])} --to {_quote(target)}"
                )
            else:
                lines.append(
                    f"  deliver them: async-tracker sync {_quote(roots[0])}"
                    " (with the same TORCHX_TRACKERS and tracker configs as this job)"
                )
        return "\n".join(lines[:5])


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _quote(path: str) -> str:
    return path if path and all(c.isalnum() or c in "/._-~:" for c in path) else repr(path)
