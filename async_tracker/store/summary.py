"""A run's summary: what a list of runs shows and filters on, without reading the run.

Each process that writes a run keeps its own summary of what it wrote (a
:class:`WriterSummary`) and stores it at flush boundaries, never per point; readers merge the
writers' summaries into one :class:`RunSummary` (:func:`merge`). The types hold plain data
(JSON round trips through :meth:`WriterSummary.to_json` and :meth:`WriterSummary.from_json`),
so that every backend and reader shares them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from async_tracker.tags import ENDING_KEY, ending_cause, split_metadata

if TYPE_CHECKING:
    import numpy.typing as npt

# The statuses a run can have, as readers show them (see the fsspec store's run_status).
STATUSES = ("running", "finished", "failed", "killed", "crashed")


@dataclass(frozen=True)
class MetricSummary:
    """One metric of a run: its last value (at the highest step, the latest logged among
    equals), the smallest and largest values (NaN ignored; None when every value was NaN),
    how many points, and the last step."""

    last: float
    min: float | None
    max: float | None
    count: int
    last_step: int

    def to_json(self) -> list[object]:
        return [_number(self.last), _number(self.min), _number(self.max), self.count,
                self.last_step]  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> MetricSummary:
        last, lo, hi, count, step = data
        return cls(
            float(last), None if lo is None else float(lo), None if hi is None else float(hi),
            int(count), int(step),
        )  # fmt: skip

    def add(self, value: float, step: int) -> MetricSummary:
        """This summary with one more point."""
        last = value if step >= self.last_step else self.last
        lo, hi = self.min, self.max
        if not math.isnan(value):
            lo = value if lo is None else min(lo, value)
            hi = value if hi is None else max(hi, value)
        return MetricSummary(last, lo, hi, self.count + 1, max(step, self.last_step))

    @classmethod
    def first(cls, value: float, step: int) -> MetricSummary:
        finite = None if math.isnan(value) else value
        return cls(value, finite, finite, 1, step)

    def merge(self, other: MetricSummary) -> MetricSummary:
        """Two writers' summaries of one metric: the last value is the one at the highest
        step (``other``'s among equals: the caller passes the later writer second)."""
        last = other.last if other.last_step >= self.last_step else self.last
        return MetricSummary(
            last,
            _opt(min, self.min, other.min),
            _opt(max, self.max, other.max),
            self.count + other.count,
            max(self.last_step, other.last_step),
        )


@dataclass(frozen=True)
class WriterSummary:
    """What one process wrote to a run: stored by that process, merged by readers.

    ``params`` holds the metadata keys it wrote with the hybrid-clock stamp of each
    (``{key: [stamp_ns, value]}``), so that merging keeps each key's latest write across
    processes. Times are seconds since the epoch; ``end``/``status`` are None while the
    writer has not ended the run, and ``life_start`` is when the life that ended began (the
    store's "last life" rule, see its ``run_status``).

    ``seq`` and ``keys`` say which batches it counts, so that a batch written twice (a retry,
    a replay from the spool by another process) is counted once: batches of one writer come
    in sequence order, so a batch below ``seq`` was counted, and ``keys`` holds the keys
    counted at ``seq`` itself (the parts of a batch split by the lane share its number).

    JSON (version 1): unknown keys are ignored and keys added later are optional, so a
    reader reads summaries written by older and newer writers of version 1."""

    start: float | None = None
    updated: float | None = None
    end: float | None = None
    status: str | None = None
    params: Mapping[str, tuple[int, object]] = field(default_factory=dict)
    metrics: Mapping[str, MetricSummary] = field(default_factory=dict)
    life_start: float = 0.0
    seq: int = -1
    keys: frozenset[str] = frozenset()
    # The run held records before this writer's first write and no summary of it: written
    # by an older version (or torchx), which a reader summarises from the run's files.
    prior: bool = False
    # The writer's last heartbeat while it is live: ``(time, interval_s)``. Kept here so
    # that a reader of the run list tells a live run from a crashed one without another read.
    beat: tuple[float, float] | None = None
    # Which life of the run the writer lives (see Batch.life; 0: it did not say), so that a
    # requeued run's new life, live, overtakes the ending of an earlier one.
    life: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "v": 1,
            "start": self.start,
            "updated": self.updated,
            "end": self.end,
            "status": self.status,
            "started": self.life_start,
            "seq": self.seq,
            "keys": sorted(self.keys),
            "prior": self.prior,
            "beat": list(self.beat) if self.beat is not None else None,
            "life": self.life,
            "params": {k: [ns, v] for k, (ns, v) in self.params.items()},
            "metrics": {name: m.to_json() for name, m in self.metrics.items()},
        }

    @classmethod
    def from_json(cls, data: Any) -> WriterSummary:
        """The summary in ``data``; ``ValueError``/``TypeError``/``KeyError`` when it is not
        one (a reader skips such a file with a warning)."""
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError("not a run summary (version 1)")
        get = data.get
        start, updated, end, status = get("start"), get("updated"), get("end"), get("status")
        # JSON object keys are text already; numbers come as numbers (or 'nan'/'inf' text).
        return cls(
            start=None if start is None else float(start),
            updated=None if updated is None else float(updated),
            end=None if end is None else float(end),
            status=None if status is None else str(status),
            params={k: (int(ns), v) for k, (ns, v) in data["params"].items()},
            metrics={name: MetricSummary.from_json(m) for name, m in data["metrics"].items()},
            life_start=float(get("started") or 0.0),
            seq=int(get("seq", -1)),
            keys=_texts(get("keys")),
            prior=bool(get("prior", False)),
            beat=_beat(get("beat")),
            life=int(get("life", 0)),
        )

    def counted(self, key: str, seq: int) -> bool:
        """Whether the batch ``key`` (number ``seq``) is counted here already. A batch
        without a key (a direct call) is never taken for a repeat."""
        return bool(key) and (seq < self.seq or (seq == self.seq and key in self.keys))

    def with_batch(
        self,
        now: float,
        *,
        key: str = "",
        seq: int = -1,
        params: Mapping[str, tuple[int, object]] | None = None,
        metrics: Mapping[str, MetricSummary] | None = None,
        first_time: float | None = None,
        end: tuple[str, float, float] | None = None,
    ) -> WriterSummary:
        """This summary with one more batch counted: its params (``{key: (stamp_ns,
        value)}``), its metrics' summaries (:func:`summarize_columns`), the time of its
        earliest point, and its end record ``(status, time, life_start)``. ``start`` is the
        earliest point's time, or the first write's (``now``) for a writer with no points."""
        merged_params = dict(self.params)
        for name, (ns, value) in (params or {}).items():
            if name not in merged_params or ns >= merged_params[name][0]:
                merged_params[name] = (ns, value)
        merged_metrics = dict(self.metrics)
        for name, m in (metrics or {}).items():
            merged_metrics[name] = merged_metrics[name].merge(m) if name in merged_metrics else m
        start = self.start if self.start is not None else now
        if first_time is not None:
            start = min(start, first_time)
        changes: dict[str, Any] = {
            "start": start, "updated": now, "params": merged_params, "metrics": merged_metrics,
        }  # fmt: skip
        if end is not None:
            changes.update(status=end[0], end=end[1], life_start=end[2])
        if key:
            if seq > self.seq:
                changes.update(seq=seq, keys=frozenset([key]))
            else:
                changes.update(keys=self.keys | {key})
        return dataclasses.replace(self, **changes)


# One metric's steps, values and times: Python numbers, or numpy arrays (int64, float64,
# float64: what the fsspec backend makes of a batch, see parquet.row_columns). numpy is not
# imported here: the read side loads this module without it.
_Columns: TypeAlias = (
    "tuple[Sequence[int] | npt.NDArray[Any], Sequence[float] | npt.NDArray[Any], "
    "Sequence[float] | npt.NDArray[Any]]"
)


def summarize_columns(columns: Mapping[str, _Columns]) -> tuple[dict[str, MetricSummary], float]:
    """The summary of each metric's points (``{name: (steps, values, times)}``, each name's
    points in call order) and the earliest point's time (``inf`` for none). C loops (min,
    max, index), no Python loop per point: the flusher shares the GIL with training. Numpy
    columns are summarised by numpy, per batch, to the same figures."""
    out: dict[str, MetricSummary] = {}
    first = math.inf
    for name, (steps, values, times) in columns.items():
        if not len(steps):
            continue
        if hasattr(steps, "dtype"):
            summary, earliest = _summarize_arrays(steps, values, times)  # type: ignore[arg-type]
            out[name] = summary
            first = min(first, earliest)
            continue
        top = max(steps)
        # The last point logged at the highest step: most often the last point.
        at = len(steps) - 1 if steps[-1] == top else len(steps) - 1 - steps[::-1].index(top)
        if math.isnan(sum(values)):  # a NaN (or inf and -inf): min/max ignore NaN
            finite = [v for v in values if not math.isnan(v)]
            lo, hi = (min(finite), max(finite)) if finite else (None, None)
        else:
            lo, hi = min(values), max(values)
        out[name] = MetricSummary(float(values[at]), lo, hi, len(steps), int(top))
        first = min(first, min(times))
    return out, first


def _summarize_arrays(
    steps: npt.NDArray[Any], values: npt.NDArray[Any], times: npt.NDArray[Any]
) -> tuple[MetricSummary, float]:
    """:func:`summarize_columns` of one metric's numpy columns (not empty): the same figures
    as the Python path's. NaN is ignored by min and max (None when every value is NaN); the
    last value is the last point's at the highest step; times hold no NaN on the pipeline's
    path, and for one that does the Python path's answer is kept."""
    top = int(steps.max())
    at = len(steps) - 1
    if steps[at] != top:
        at -= int((steps[::-1] == top).argmax())
    lo: float | None
    hi: float | None
    nan = values != values  # NaN is the one value not equal to itself
    if nan.any():
        finite = values[~nan]
        lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (None, None)
    else:
        lo, hi = float(values.min()), float(values.max())
    earliest = float(times.min())
    if math.isnan(earliest):
        earliest = min(times.tolist())
    return MetricSummary(float(values[at]), lo, hi, len(steps), top), earliest


@dataclass(frozen=True)
class RunSummary:
    """A run as lists show it and filters see it (the writers' summaries merged).

    ``ending`` is how a run that failed or was killed ended, as its end record stored it
    (``{"reason": ..., "type": ..., "message": ...}``, see ``async_tracker.runtime.ending``);
    empty for a run that is running, finished or crashed, or whose writer did not say (an
    older version's). :attr:`cause` says it in one line."""

    run_id: str
    status: str = "running"
    start: float | None = None
    end: float | None = None
    heartbeat: float | None = None
    params: Mapping[str, object] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    note: str = ""
    metrics: Mapping[str, MetricSummary] = field(default_factory=dict)
    ending: Mapping[str, object] = field(default_factory=dict)

    @property
    def cause(self) -> str:
        """What ended a run that failed or was killed, as one line (``ValueError: bad
        lr``, ``KeyboardInterrupt``, ``SIGTERM``); "" when not known."""
        return ending_cause(self.ending)

    @property
    def duration_s(self) -> float | None:
        if self.start is None:
            return None
        end = self.end if self.end is not None else self.heartbeat
        return None if end is None else max(0.0, end - self.start)


def merge(
    run_id: str,
    writers: Iterable[WriterSummary],
    status: str = "running",
    heartbeat: float | None = None,
    ended_at: float | None = None,
) -> RunSummary:
    """One run's summary from its writers' (in any order). ``status`` and ``ended_at`` are
    the run's status and when it ended as the store tells them (the rules of several
    writers' endings are the store's); without ``ended_at`` the latest writer's end."""
    ordered = sorted(writers, key=lambda w: (w.updated or 0.0))
    params: dict[str, tuple[int, object]] = {}
    metrics: dict[str, MetricSummary] = {}
    for w in ordered:
        for key, (ns, value) in w.params.items():
            if key not in params or ns >= params[key][0]:
                params[key] = (ns, value)
        for name, m in w.metrics.items():
            metrics[name] = metrics[name].merge(m) if name in metrics else m
    starts = [w.start for w in ordered if w.start is not None]
    ends = [w.end for w in ordered if w.end is not None]
    updates = [w.updated for w in ordered if w.updated is not None]
    ended = status not in ("running", "crashed")
    # Tags and the note are metadata keys (see async_tracker.tags): each key's latest write
    # won above, across writers, so a tag one process removed after another added it is gone.
    values = {k: v for k, (_, v) in params.items()}
    plain, tags, note = split_metadata(values)
    return RunSummary(
        run_id=run_id,
        status=status,
        start=min(starts) if starts else None,
        end=(ended_at if ended_at is not None else max(ends, default=None)) if ended else None,
        heartbeat=heartbeat if heartbeat is not None else (max(updates) if updates else None),
        params=plain,
        tags=tags,
        note=note,
        metrics=metrics,
        ending=stored_ending(values, status),
    )


def stored_ending(metadata: Mapping[str, object], status: str) -> dict[str, object]:
    """The ending a run's metadata holds (:data:`~async_tracker.tags.ENDING_KEY`), when it
    is the ending of the run's status: an earlier life's (a run requeued after it failed,
    then finished or killed by a signal) is not. Empty otherwise."""
    record = metadata.get(ENDING_KEY)
    if isinstance(record, Mapping) and record.get("reason") == status:
        return dict(record)
    return {}


_NONE: frozenset[str] = frozenset()


def _beat(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    when, every = value
    if not float(every) > 0:
        raise ValueError(f"heartbeat interval {every!r} is not > 0")
    return float(when), float(every)


def _texts(values: Any) -> frozenset[str]:
    return frozenset(map(str, values)) if values else _NONE


def _opt(pick: Any, a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return float(pick(a, b))


def _number(value: float | None) -> object:
    """JSON has no NaN or infinities: those go as text."""
    if value is None or math.isfinite(value):
        return value
    return repr(value)  # 'nan', 'inf', '-inf'


def _float(value: object) -> float:
    return float(value)  # type: ignore[arg-type]  # a number, or 'nan'/'inf' text


def _opt_float(value: object) -> float | None:
    return None if value is None else _float(value)


__all__ = [
    "STATUSES", "MetricSummary", "RunSummary", "WriterSummary", "merge", "stored_ending",
    "summarize_columns",
]
