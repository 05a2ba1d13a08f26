"""The run index's checkpoint (see ``index.py``): what one holds, and its file, encoded and
decoded.

A checkpoint is written by a compaction (:func:`_encode`, from a row per run: :class:`_Row`)
and read by every listing (:func:`_decode`): its file (see :class:`Checkpoint`) is two JSON
lines, the head and the runs' rows, then the texts that the rows point into, so that a
listing parses the rows alone, a run's params and metrics when they are looked at
(:class:`_Params`, :class:`_Metrics`), and its writers' summaries only when it must be
summarised again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import gzip
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from async_tracker.backend.fsspec.layout import _utf8
from async_tracker.store.summary import MetricSummary, RunSummary

# A run's row in a checkpoint, a flat list: what it holds at each position. The run as the
# list shows it, when its status is final (else None from STATUS to NOTE, DETAIL -1): its
# status, when that was judged (crashed), its times, tags and note, and where its params and
# metrics are (JSON text: ``[params, metrics]``); then each writer's summary: token, where.
_ID, _STATUS, _AT, _START, _END, _BEAT, _TAGS, _NOTE, _DETAIL, _DETAIL_SIZE, _WRITERS = range(11)


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint as read. Its file: a JSON line (``v``, ``n``, ``time``, ``rescan`` and
    ``files``: by name, ``[version, removable]``), a JSON line of the runs' rows (see
    ``_ID``...), then texts: each run's params and metrics, and each writer's summary as its
    file held it. A listing parses the rows alone; a run's params and metrics when they are
    looked at, its writers' summaries when it must be summarised again."""

    n: int
    time: float
    rescan: float
    files: dict[str, list[Any]]
    runs: dict[str, list[Any]]
    data: bytes = b""
    base: int = 0  # where the texts begin in ``data``
    # The runs' summaries made from their rows, kept while the checkpoint is.
    decoded: dict[str, RunSummary] = dataclasses.field(default_factory=dict)

    def text(self, at: int, size: int) -> bytes:
        return self.data[self.base + at : self.base + at + size]

    def texts(self, run_id: str) -> dict[str, bytes]:
        """Each writer's summary of ``run_id``, by token, as its file held it."""
        row = self.runs.get(run_id)
        if row is None:
            return {}
        tail = row[_WRITERS:]
        return {tail[i]: self.text(tail[i + 1], tail[i + 2]) for i in range(0, len(tail), 3)}

    def summaries(self, run_ids: Iterable[str]) -> list[RunSummary]:
        """:meth:`summary` of each of ``run_ids``, made with the cyclic collector paused
        (see :func:`_gc_paused`): a list of every run makes 100,000 of them."""
        with _gc_paused():
            return [self.summary(run_id) for run_id in run_ids]

    def summary(self, run_id: str) -> RunSummary:
        """The run as its row keeps it (a final status)."""
        made = self.decoded.get(run_id)
        if made is None:
            row = self.runs[run_id]
            tags, params = row[_TAGS], _Params(self, row)
            made = self.decoded[run_id] = RunSummary(
                run_id, row[_STATUS], row[_START], row[_END], row[_BEAT], params,
                frozenset(tags) if tags else _NO_TAGS, row[_NOTE], _Metrics(params),
                _Ending(params),
            )  # fmt: skip
        return made


_NO_TAGS: frozenset[str] = frozenset()


def _decode(name: str, data: bytes) -> Checkpoint:
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    first = data.index(b"\n")
    second = data.index(b"\n", first + 1)
    view = memoryview(data)
    with _gc_paused():
        head = orjson.loads(view[:first])
        if not isinstance(head, dict) or head.get("v") != 1:
            raise ValueError("not a run index checkpoint (version 1)")
        rows = orjson.loads(view[first + 1 : second])
        runs = {row[_ID]: row for row in rows}
    return Checkpoint(
        n=int(head["n"]),
        time=float(head["time"]),
        rescan=float(head["rescan"]),
        files=dict(head["files"]),
        runs=runs,
        data=data,
        base=second + 1,
    )


@dataclasses.dataclass
class _Row:
    """A run as the next checkpoint holds it: its summary when its status is final (and
    when that was judged: crashed), or its row in the last checkpoint; its writers'
    summaries."""

    run_id: str
    texts: dict[str, bytes]
    summary: RunSummary | None = None
    at: float | None = None
    held: tuple[Checkpoint, list[Any]] | None = None


def _encode(
    n: int, rescan: float, files: Mapping[str, list[Any]], rows: Sequence[_Row]
) -> Checkpoint:
    """The checkpoint of ``rows``, with its file's content (``data``)."""
    chunks: list[bytes] = []
    at = 0

    def put(text: bytes) -> list[int]:
        nonlocal at
        chunks.extend((text, b"\n"))
        at += len(text) + 1
        return [at - len(text) - 1, len(text)]

    out: list[list[Any]] = []
    for row in rows:
        if row.held is not None:  # as it was
            checkpoint, old = row.held
            line = old[:_DETAIL]
            detail = old[_DETAIL] >= 0
            line += put(checkpoint.text(old[_DETAIL], old[_DETAIL_SIZE])) if detail else [-1, 0]
        elif row.summary is not None:
            s = row.summary
            line = [row.run_id, s.status, row.at, s.start, s.end, s.heartbeat,
                    sorted(s.tags) or None, s.note]  # fmt: skip
            line += put(_detail(s))
        else:
            line = [row.run_id, None, None, None, None, None, None, None, -1, 0]
        for token, text in row.texts.items():
            line += [token, *put(text)]
        out.append(line)
    made = time.time()
    head = {"v": 1, "n": n, "time": made, "rescan": rescan, "files": files}
    with _gc_paused():
        try:
            lines = orjson.dumps(head) + b"\n" + orjson.dumps(out) + b"\n"
        except (orjson.JSONEncodeError, TypeError):  # not expected: plain values alone
            lines = (json.dumps(head) + "\n" + json.dumps(out) + "\n").encode("utf-8")
    data = lines + b"".join(chunks)
    return Checkpoint(n, made, rescan, dict(files), {r[_ID]: r for r in out}, data, len(lines))


def _detail(summary: RunSummary) -> bytes:
    """A run's params and metrics, and the ending of a run that failed or was killed, as its
    row keeps them: ``[params, metrics]`` or ``[params, metrics, ending]`` (a reader of an
    older version reads the first two), JSON text, by orjson where it writes them exactly,
    else by ``json`` (NaN, huge ints: what params may hold)."""
    detail: list[object] = [
        dict(summary.params), {name: m.to_json() for name, m in summary.metrics.items()},
    ]  # fmt: skip
    if summary.ending:
        detail.append(dict(summary.ending))
    return orjson.dumps(detail) if _plain(detail) else json.dumps(detail).encode("utf-8")


class _Params(Mapping[str, object]):
    """A run's params as a checkpoint's row holds them, parsed when first looked at: a
    list of 100,000 runs shows 50 (parsing them all would take most of its time)."""

    __slots__ = ("_checkpoint", "_parsed", "_row")

    def __init__(self, checkpoint: Checkpoint, row: list[Any]) -> None:
        self._checkpoint = checkpoint
        self._row = row
        self._parsed: list[Any] | None = None

    def detail(self) -> list[Any]:
        """The row's ``[params, metrics]``."""
        if self._parsed is None:
            row = self._row
            self._parsed = _loads(self._checkpoint.text(row[_DETAIL], row[_DETAIL_SIZE]))
        return self._parsed

    def __getitem__(self, key: str) -> object:
        return self.detail()[0][key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.detail()[0])

    def __len__(self) -> int:
        return len(self.detail()[0])

    def __repr__(self) -> str:
        return repr(self.detail()[0])


class _Metrics(Mapping[str, MetricSummary]):
    """A run's metrics as a checkpoint's row holds them, each made a :class:`MetricSummary`
    when looked up (see :class:`_Params`)."""

    __slots__ = ("_params",)

    def __init__(self, params: _Params) -> None:
        self._params = params  # what parses the row's text, once for both

    def __getitem__(self, name: str) -> MetricSummary:
        return MetricSummary.from_json(self._params.detail()[1][name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._params.detail()[1])

    def __len__(self) -> int:
        return len(self._params.detail()[1])

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class _Ending(Mapping[str, object]):
    """The ending a checkpoint's row holds (its detail's third part; none in rows written
    before endings were kept), read when looked at (see :class:`_Params`)."""

    __slots__ = ("_params",)

    def __init__(self, params: _Params) -> None:
        self._params = params

    def _record(self) -> Mapping[str, object]:
        detail = self._params.detail()
        record = detail[2] if len(detail) > 2 else None
        return record if isinstance(record, dict) else {}

    def __getitem__(self, key: str) -> object:
        return self._record()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._record())

    def __len__(self) -> int:
        return len(self._record())

    def __repr__(self) -> str:
        return repr(self._record())


def _plain(value: object, depth: int = 0) -> bool:
    """Whether orjson writes ``value`` as JSON that reads back the same: it writes NaN and
    infinities as null, and refuses ints beyond 64 bits, lone surrogates and deep nesting."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, str):
        return value.isascii() or _utf8(value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if depth > 200:
        return False
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(k) and _plain(v, depth + 1)
                   for k, v in value.items())  # fmt: skip
    return False


def _loads(text: str | bytes) -> Any:
    """JSON text as written by ``json``: orjson where it can (it refuses NaN, huge ints)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a checkpoint's many small objects are made
    (none holds a cycle): it would otherwise walk them all again at each of its passes,
    which doubles the time of a checkpoint of 100,000 runs."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


__all__ = ["Checkpoint"]
