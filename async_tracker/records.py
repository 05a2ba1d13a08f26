"""What a run records: the torchx dataclasses, metrics, batches, and call-site validation.

Validation lives here so that every entry point (``AppRun``, the sync adapters, backends
called directly) rejects the same bad input with the same message, naming the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import operator
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import PurePath
from typing import Any, Literal, NamedTuple, TypeAlias

from async_tracker.tags import RESERVED_KEY_PREFIX, is_reserved_key
from async_tracker.tensors import DeferredValue, scalar_of


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


# A metric point as a plain tuple in TrackerMetric's field order: what the ingress holds, and
# what the package's own backends read (they index points, and need no object per point).
MetricRow = tuple[str, float, int, float]


@dataclass
class Lineage:
    """The runs a run derives from (``parents``) and the runs derived from it (``descendants``).

    torchx declares this class without fields; reading code that ignores them keeps working.
    """

    run_id: str = ""
    parents: list[TrackerSource] = field(default_factory=list)
    descendants: list[TrackerSource] = field(default_factory=list)


CloseReason: TypeAlias = Literal["finished", "failed", "killed"]
"""How a run ended: ``finished`` (a clean exit or ``close()``), ``failed`` (the job exits on
an exception, or a ``with`` block is left by one), ``killed`` (SIGTERM)."""


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

    ``end`` is the run's end record: how the run ended (sealed at close, after every record
    the run accepted, so it is always in the last batch), and ``end_time`` when (seconds
    since the epoch). It is part of the log like any record (spooled and replayed with the
    rest) but not one of ``records``, which counts what the user logged. Backends store it
    last, after the batch's other parts (see :meth:`AsyncTrackerBase.write_batch`).

    ``life`` (on every batch) says which life of the run the process that cut it lives:
    ``init()`` opens a run's first life as 1, and a resumed run's is one past the highest its
    store held (a counter, not a clock); 0 for a writer that did not look its life up.
    ``life_start`` goes with ``end``: when that process began the run. A run resumed after it
    ended (a requeued job) has a later life, whose ending readers take over the earlier ones
    (see the fsspec store's ``run_status``).

    ``done_for`` names the store the ``done`` marks were made in (the backend's
    ``store_id``): replayed into another store, the batch is written whole again.
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
    # When each metadata key was written: the hybrid-clock stamp of the call (ns since the
    # epoch, never back within the writing process; see clock.HybridClock). Backends that many
    # processes write to order a key's writes by it.
    metadata_ns: dict[str, int] = field(default_factory=dict)
    end: CloseReason | None = None
    end_time: float = 0.0
    life_start: float = 0.0
    life: int = 0
    done_for: str | None = None

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
            end=self.end,
            end_time=self.end_time,
            life_start=self.life_start,
            life=self.life,
        )

    def is_empty(self) -> bool:
        return not (
            self.metadata or self.artifacts or self.sources or self.points() or self.end
        )

    def points(self) -> int:
        """How many metric points it holds."""
        return len(self.metrics)

    def metric_rows(self) -> Sequence[MetricRow]:
        """Its metric points as tuples ``(name, value, step, timestamp)``, in order: for
        backends that index points. A batch cut from the ingress holds them so already
        (:class:`PointsBatch`), and reading them makes no object per point."""
        return self.metrics

    def metric_columns(self) -> MetricColumns | None:
        """Its metric points as columns, when it holds them that way (see PointsBatch)."""
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


class PointsBatch(Batch):
    """A batch of metric points alone, held as the flusher took them: the ingress's tuples
    (``MetricRow``), or :class:`MetricColumns` from the packed ingress. ``metrics`` makes
    the :class:`TrackerMetric` objects when something first reads it (a backend that wants
    them), once. The package's own backends read :meth:`metric_rows`, and the spool
    :meth:`metric_columns`, and never make them: a flusher that makes an object per point
    takes that time from the training loop, with which it shares the GIL."""

    def __init__(
        self, seq: int, held: list[MetricRow] | MetricColumns, *, first: int, key: str
    ) -> None:
        super().__init__(seq, records=len(held), first=first, key=key)
        self._held: list[MetricRow] | MetricColumns | None = held
        self._metrics: list[TrackerMetric] | None = None

    @property
    def metrics(self) -> list[TrackerMetric]:
        if self._metrics is None:
            held = self._held
            if isinstance(held, MetricColumns):
                self._metrics = held.points()
            else:
                self._metrics = list(map(_new_point, _METRIC, held or ()))
        return self._metrics

    @metrics.setter
    def metrics(self, value: list[TrackerMetric]) -> None:
        # Batch.__init__ sets [] first; what is held is set after it.
        self._metrics = value
        self._held = None

    def points(self) -> int:
        if self._metrics is None and self._held is not None:
            return len(self._held)
        return len(self.metrics)

    def metric_rows(self) -> Sequence[MetricRow]:
        if self._metrics is None and isinstance(self._held, list):
            return self._held
        return self.metrics

    def metric_columns(self) -> MetricColumns | None:
        held = self._held if self._metrics is None else None
        return held if isinstance(held, MetricColumns) else None

    def for_lane(self) -> Batch:
        if self._metrics is not None or self._held is None or self.end is not None:
            return super().for_lane()
        return PointsBatch(self.seq, self._held, first=self.first, key=self.key)


# ---------------------------------------------------------------------------------------------
# Call-site validation. Each function raises TypeError/ValueError naming the offending key, and
# returns a value the caller can no longer mutate under us.


def shown(value: object) -> str:
    """``repr(value)`` for an error message. A value whose ``__repr__`` raises is named by its
    type: the message about the bad input must not turn into another error."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"


def check_name(value: object, what: str) -> str:
    """``value`` as a plain ``str``. A subclass of str is copied into one: what it overrides
    (a ``__repr__`` that raises, an ``__eq__`` or ``__hash__`` of its own) must reach neither
    the error messages that name the key nor the records and backends that key by it."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {shown(value)}")
    if type(value) is not str:
        value = str.__str__(value)
    if not value:
        raise ValueError(f"{what} must not be empty")
    return value


def check_optional_str(value: object, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, got {type(value).__name__}")
    return value


def metric_value(name: str, value: object) -> float | DeferredValue:
    """``float(value)``, done on the caller's thread; strings are refused although float()
    parses them, because a string metric is nearly always a mistake. Tensors and arrays
    must hold one value; a CUDA tensor is not read here but gives a :class:`DeferredValue`
    that the tracker loop reads once the device has computed it (see tensors.py)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"metric {name!r}: value must be a number, got {type(value).__name__}")
    scalar = scalar_of(name, value)
    if type(scalar) is DeferredValue:
        return scalar
    try:
        return float(scalar)  # type: ignore[arg-type]
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
            f"metric {name!r}: step must be an int, got {type(step).__name__}: {shown(step)}"
        ) from exc


def check_metric(
    name: object, value: object, step: object
) -> tuple[str, float | DeferredValue, int | None]:
    """The slow path of ``log_metric``: validate and convert, or raise naming the metric."""
    key = check_name(name, "metric name")
    return key, metric_value(key, value), metric_step(key, step)


# Integers JSON tools and backends store exactly: 64 bits (Python's own JSON encoder would
# write any, but refuses past 4300 digits, and backends parse them as int64 or doubles).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# Arrays and tensors up to this many values are metadata (a list); larger ones are data, for
# an artifact: a backend's tag or parameter holds a few kilobytes at most.
MAX_METADATA_ARRAY = 1000
# How deep metadata may nest: far more than any config, and far from Python's recursion limit
# (json_copy takes a frame or two per level, and the caller's stack may already be deep).
MAX_METADATA_DEPTH = 100


def _check_text(value: str, key: str) -> str:
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"metadata {key!r}: the text holds a lone surrogate ({value[:40]!r}), which no "
            "backend can store"
        ) from None
    # A subclass of str (numpy.str_) becomes a plain str.
    return value if type(value) is str else data.decode("utf-8")


def _check_int(value: int, key: str) -> int:
    if not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"metadata {key!r}: the integer does not fit in 64 bits")
    return value


def json_copy(value: object, key: str, _path: tuple[int, ...] = ()) -> object:
    """A deep copy of ``value`` made of dict/list/str/int/float/bool/None, or TypeError or
    ValueError naming ``key``. Tuples become lists (as JSON would make them). NaN and
    infinities are kept; integers beyond 64 bits, text with lone surrogates and cycles are
    refused (the spool and the backends could not store them).

    Values with an obvious JSON form are converted: numpy scalars to numbers, numpy arrays
    and tensors of at most ``MAX_METADATA_ARRAY`` values to lists, dataclasses and
    ``argparse.Namespace`` to dicts of their fields, paths to str, an ``Enum`` to its value,
    ``datetime``, ``date`` and ``time`` to ISO 8601 text.
    """
    kind = type(value)
    if kind is float or kind is bool or value is None:
        return value
    if kind is str:
        return _check_text(value, key)  # type: ignore[arg-type]
    if kind is int:
        return _check_int(value, key)  # type: ignore[arg-type]
    if isinstance(value, Enum):  # before str and int: an IntEnum or a StrEnum is both
        return json_copy(value.value, key, _path)
    if isinstance(value, float):  # numpy.float64 and other subclasses: a plain float
        return float(value)
    if isinstance(value, str):
        return _check_text(value, key)
    if isinstance(value, int):
        return _check_int(int(value), key)
    if id(value) in _path:
        raise ValueError(f"metadata {key!r}: the value contains itself (a cycle)")
    if len(_path) >= MAX_METADATA_DEPTH:
        raise ValueError(
            f"metadata {_outer(key)!r}: the value nests deeper than {MAX_METADATA_DEPTH} levels"
        )
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
    converted = _json_form(value, key)
    if converted is not _NO_FORM:
        return json_copy(converted, key, path)
    raise TypeError(
        f"metadata {key!r}: {type(value).__name__} is not JSON data (use dict, list, str, "
        "int, float, bool, None, or numpy values, dataclasses, Namespace, Path, Enum, datetime)"
    )


_NO_FORM = object()


def _outer(key: str) -> str:
    """The start of a nested key's path, for a message about a value nested very deep."""
    return key if len(key) <= 80 else key[:77] + "..."


def _json_form(value: object, key: str) -> object:
    """The obvious JSON form of a value that has one (converted further by json_copy), else
    ``_NO_FORM``. numpy and torch are looked up, not imported: a value can only be theirs
    if the caller imported them."""
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, argparse.Namespace):
        return vars(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Field by field, not dataclasses.asdict(): that deep-copies every field value,
        # which may be large or uncopyable; json_copy makes the copy it needs.
        fields: dict[str, object] = {}
        for f in dataclasses.fields(value):
            try:
                fields[f.name] = getattr(value, f.name)
            except AttributeError:  # a field(init=False) that __post_init__ did not set
                raise ValueError(
                    f"metadata {key!r}: field {f.name!r} of {type(value).__name__} is not set"
                ) from None
        return fields
    numpy: Any = sys.modules.get("numpy")
    try:
        kinds: tuple[Any, ...] = () if numpy is None else (numpy.generic, numpy.ndarray)
    except AttributeError:
        # numpy half imported by another thread (the fsspec store imports it at its first
        # metric write, on the tracker's thread): no value is one of its types yet.
        kinds = ()
    if isinstance(value, kinds):
        if isinstance(value, numpy.generic):
            item = value.item()
            if isinstance(item, numpy.generic):
                # longdouble and clongdouble: no Python number holds them, item() returns
                # them as they are (converting again would never end). A float is their
                # obvious form; a complex number has none.
                if isinstance(value, numpy.floating):
                    return float(value)
                raise TypeError(f"metadata {key!r}: {type(value).__name__} is not JSON data")
            return item
        if isinstance(value, numpy.ndarray):
            _check_size(value.size, key, "an array")
            return value.tolist()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise TypeError(f"metadata {key!r}: a tensor on the meta device has no value")
        _check_size(value.numel(), key, "a tensor")
        return value.tolist()
    return _NO_FORM


def _check_size(size: int, key: str, what: str) -> None:
    if size > MAX_METADATA_ARRAY:
        raise ValueError(
            f"metadata {key!r}: {what} of {size} values is too large for metadata (at most "
            f"{MAX_METADATA_ARRAY}); save it to a file and record that with add_artifact"
        )


def check_metadata(kwargs: Mapping[str, object]) -> dict[str, object]:
    """A checked copy of user metadata (see :func:`json_copy`). Keys starting with
    ``async_tracker.`` are refused: they are the package's own (a run's tags and note, see
    :mod:`async_tracker.tags`), and a user's write would change them behind its back."""
    out: dict[str, object] = {}
    for key, v in kwargs.items():
        k = check_name(key, "metadata key")
        if is_reserved_key(k):
            raise ValueError(
                f"metadata key {k!r}: keys starting with {RESERVED_KEY_PREFIX!r} are reserved "
                "(tags and the note have their own methods: add_tags, remove_tags, set_note)"
            )
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
