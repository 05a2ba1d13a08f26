"""What a run records: the torchx dataclasses, metrics, batches, and call-site validation.

Validation lives here so that every entry point (``AppRun``, the sync adapters, backends
called directly) rejects the same bad input with the same message, naming the key.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass
class TrackerSource:
    """A link from a run to a source it derives from (torchx's dataclass).

    ``artifact_name`` names the kind of relationship, and filters ``sources()``.
    """

    source_run_id: str
    artifact_name: str | None


@dataclass
class TrackerArtifact:
    """A named artifact of a run: where it lives and what describes it (torchx's dataclass)."""

    name: str
    path: str
    metadata: Mapping[str, object] | None


class TrackerMetric(NamedTuple):
    """One point of a metric curve.

    ``timestamp`` is the client's wall-clock time in seconds when the point was logged:
    backends store it as given, so a retried write never makes a second point.
    """

    name: str
    value: float
    step: int
    timestamp: float


@dataclass
class Lineage:
    """The runs a run derives from (``parents``) and the runs derived from it (``descendants``).

    torchx declares this class without fields; reading code that ignores them keeps working.
    """

    run_id: str = ""
    parents: list[TrackerSource] = field(default_factory=list)
    descendants: list[TrackerSource] = field(default_factory=list)


@dataclass
class Batch:
    """What one flush delivers to one backend, already coalesced.

    ``metadata`` is merged in call order, ``artifacts`` keeps the last write of each name,
    ``sources`` holds each (source, artifact) pair once, ``metrics`` keeps call order.

    Every record accepted by a run has a sequence number in that run (given at ingress, in
    call order); a batch holds the records ``first`` to ``seq``, and ``seq`` is what a lane
    acknowledges once the batch is delivered. ``key`` is a name unique across processes and
    sorting in write order, fixed when the batch is cut (before any write-ahead line), so that
    backends derive deterministic object names from it: a replay overwrites, never duplicates.
    ``done`` holds the parts already stored: a retry skips them (see
    :meth:`AsyncTrackerBase.write_batch`). ``names`` holds object names a backend chose at
    its first attempt, for a batch made without a key. Each lane gets its own copy.
    """

    seq: int
    metadata: dict[str, object] = field(default_factory=dict)
    artifacts: dict[str, TrackerArtifact] = field(default_factory=dict)
    sources: list[TrackerSource] = field(default_factory=list)
    metrics: list[TrackerMetric] = field(default_factory=list)
    records: int = 0
    done: set[str] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)
    first: int = 0
    key: str = ""
    # When each metadata key was written (ns since the epoch, the call's time): backends that
    # many processes write to order a key's writes by it.
    metadata_ns: dict[str, int] = field(default_factory=dict)

    def for_lane(self) -> Batch:
        """A copy sharing the (read-only) data, with its own progress."""
        return Batch(
            self.seq,
            self.metadata,
            self.artifacts,
            self.sources,
            self.metrics,
            self.records,
            first=self.first,
            key=self.key,
            metadata_ns=self.metadata_ns,
        )

    def is_empty(self) -> bool:
        return not (self.metadata or self.artifacts or self.sources or self.points())

    def points(self) -> int:
        """How many metric points it holds."""
        return len(self.metrics)

    def metric_columns(self) -> MetricColumns | None:
        """Its metric points as columns, when it holds them that way (see ColumnBatch)."""
        return None


@dataclass(frozen=True)
class MetricColumns:
    """Metric points as columns of machine numbers: a name index (uint32), a value
    (float64), a step (int64) and a time (float64) per point, and the name table. Made on
    little-endian machines only (the packed ingress is little-endian), in their order.

    The packed ingress becomes this with strided byte copies and no object per point, and the
    spool stores it as it is: an overloaded run moves its points to disk at the speed of
    memory copies, where objects per point would fall behind a loop that only logs.
    """

    names: Sequence[str]
    index: bytes
    values: bytes
    steps: bytes
    times: bytes

    def __len__(self) -> int:
        return len(self.index) // 4

    def points(self) -> list[TrackerMetric]:
        idx, values, steps, times = (
            array(code, data)
            for code, data in zip("Idqd", (self.index, self.values, self.steps, self.times))
        )
        return list(
            map(_new_point, _METRIC, zip(map(self.names.__getitem__, idx), values, steps, times))
        )


_METRIC = itertools.repeat(TrackerMetric)
_new_point = tuple.__new__


class ColumnBatch(Batch):
    """A batch of metric points alone, held as :class:`MetricColumns` until something
    reads ``metrics`` (a backend's write): spooled, it never makes an object per point."""

    def __init__(self, seq: int, columns: MetricColumns, *, first: int, key: str) -> None:
        super().__init__(seq, records=len(columns), first=first, key=key)
        self._columns: MetricColumns | None = columns
        self._metrics: list[TrackerMetric] | None = None

    @property
    def metrics(self) -> list[TrackerMetric]:
        if self._metrics is None:
            self._metrics = self._columns.points() if self._columns is not None else []
        return self._metrics

    @metrics.setter
    def metrics(self, value: list[TrackerMetric]) -> None:
        # Batch.__init__ sets [] first; the columns are set after it.
        self._metrics = value
        self._columns = None

    def points(self) -> int:
        if self._metrics is None and self._columns is not None:
            return len(self._columns)
        return len(self.metrics)

    def metric_columns(self) -> MetricColumns | None:
        return self._columns if self._metrics is None else None

    def for_lane(self) -> Batch:
        if self._columns is None or self._metrics is not None:
            return super().for_lane()
        return ColumnBatch(self.seq, self._columns, first=self.first, key=self.key)


# ---------------------------------------------------------------------------------------------
# Call-site validation. Each function raises TypeError/ValueError naming the offending key, and
# returns a value the caller can no longer mutate under us.


def check_name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    return value


def check_optional_str(value: object, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, got {type(value).__name__}")
    return value


def metric_value(name: str, value: object) -> float:
    """``float(value)``, done on the caller's thread; strings are refused although float()
    parses them, because a string metric is nearly always a mistake."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"metric {name!r}: value must be a number, got {type(value).__name__}")
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError as exc:  # an int beyond float's range: no key in float()'s message
        raise ValueError(f"metric {name!r}: value is out of the float range") from exc
    except Exception as exc:  # TypeError, ValueError, or whatever a __float__ raises
        raise TypeError(
            f"metric {name!r}: value of type {type(value).__name__} is not a number ({exc})"
        ) from exc


def metric_step(name: str, step: object) -> int | None:
    if step is None:
        return None
    if isinstance(step, bool):
        raise TypeError(f"metric {name!r}: step must be an int, got bool")
    try:
        return operator.index(step)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(
            f"metric {name!r}: step must be an int, got {type(step).__name__}: {step!r}"
        ) from exc


def check_metric(name: object, value: object, step: object) -> tuple[str, float, int | None]:
    """The slow path of ``log_metric``: validate and convert, or raise naming the metric."""
    key = check_name(name, "metric name")
    return key, metric_value(key, value), metric_step(key, step)


_JSON_SCALARS = (float, bool, type(None))
# Integers JSON tools and backends store exactly: 64 bits (Python's own JSON encoder would
# write any, but refuses past 4300 digits, and backends parse them as int64 or doubles).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def _check_text(value: str, key: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"metadata {key!r}: the text holds a lone surrogate ({value[:40]!r}), which no "
            "backend can store"
        ) from None
    return value


def json_copy(value: object, key: str, _path: tuple[int, ...] = ()) -> object:
    """A deep copy of ``value`` made of dict/list/str/int/float/bool/None, or TypeError or
    ValueError naming ``key``. Tuples become lists (as JSON would make them). NaN and
    infinities are kept; integers beyond 64 bits, text with lone surrogates and cycles are
    refused (the spool and the backends could not store them)."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, str):
        return _check_text(value, key)
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(f"metadata {key!r}: the integer does not fit in 64 bits")
        return value
    if id(value) in _path:
        raise ValueError(f"metadata {key!r}: the value contains itself (a cycle)")
    path = (*_path, id(value))
    if isinstance(value, Mapping):
        out: dict[str, object] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"metadata {key!r}: keys must be str, got {type(k).__name__}")
            out[_check_text(k, key)] = json_copy(v, f"{key}.{k}", path)
        return out
    if isinstance(value, (list, tuple)):
        return [json_copy(v, f"{key}[{i}]", path) for i, v in enumerate(value)]
    raise TypeError(
        f"metadata {key!r}: {type(value).__name__} is not JSON data "
        "(use dict, list, str, int, float, bool or None)"
    )


def check_metadata(kwargs: Mapping[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in kwargs.items():
        check_name(k, "metadata key")
        out[k] = json_copy(v, k)
    return out


def check_artifact(name: object, path: object, metadata: object) -> TrackerArtifact:
    key = check_name(name, "artifact name")
    if not isinstance(path, str):
        raise TypeError(f"artifact {key!r}: path must be a str, got {type(path).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(
            f"artifact {key!r}: metadata must be a mapping or None, got {type(metadata).__name__}"
        )
    meta = None if metadata is None else json_copy(metadata, f"{key}.metadata")
    return TrackerArtifact(key, path, meta)  # type: ignore[arg-type]


def check_source(source_id: object, artifact_name: object) -> TrackerSource:
    sid = check_name(source_id, "source_id")
    return TrackerSource(sid, check_optional_str(artifact_name, "artifact_name"))


def sort_points(points: Sequence[TrackerMetric]) -> list[TrackerMetric]:
    """Points ordered by step, then time (the order ``metrics()`` promises)."""
    return sorted(points, key=lambda p: (p.step, p.timestamp))
