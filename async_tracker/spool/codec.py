"""The spool's line format: one batch per line, ``<crc32 in hex> <JSON>\n``.

Metrics are stored as a name table and base64 columns of machine numbers (C loops only,
several times faster than JSON numbers: spooling must keep pace with a stalled backend's
load). A damaged line (a torn write, a flipped bit) fails its checksum and is skipped with a
warning; the rest of the segment is read.
"""

from __future__ import annotations

import binascii
import json
import logging
import operator
import zlib
from array import array
from base64 import b64decode, b64encode
from typing import Any, get_args

from async_tracker.records import (
    Batch,
    CloseReason,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
)

logger = logging.getLogger(__name__)


def _encode_metrics(batch: Batch) -> list[object]:
    """Metrics as a name table and base64 columns of machine numbers: C loops only, several
    times faster than JSON numbers (spooling must keep pace with a stalled backend's load).
    A batch that holds its points as columns already is written as it is."""
    held = batch.metric_columns()
    if held is not None:
        cols = (held.index, held.values, held.steps, held.times)
        return [list(held.names), *map(_b64bytes, cols)]
    metrics = batch.metric_rows()
    if not metrics:
        return [[], "", "", "", ""]
    names = list(map(_NAME, metrics))
    table = list(dict.fromkeys(names))
    index = {n: i for i, n in enumerate(table)}
    steps: object
    try:
        steps = array("q", map(_STEP, metrics))
    except OverflowError:  # a step beyond int64: such a column stays a JSON list
        steps = list(map(_STEP, metrics))
    return columns(
        table,
        array("I", map(index.__getitem__, names)),
        array("d", map(_VALUE, metrics)),
        steps,
        array("d", map(_TIME, metrics)),
    )


def columns(table: list[str], *cols: object) -> list[object]:
    """The spooled form of metric columns: arrays as base64 of their bytes."""
    return [table, *(_b64(c) if isinstance(c, array) else c for c in cols)]


def _b64(a: array[Any]) -> str:
    return b64encode(a.tobytes()).decode("ascii")


def _b64bytes(data: bytes) -> str:
    return b64encode(data).decode("ascii")


def _decode_metrics(cols: list[Any]) -> list[TrackerMetric]:
    table, *data = cols
    arrays: list[Any] = []
    for code, col in zip("Idqd", data):
        if isinstance(col, list):
            arrays.append(col)
            continue
        a = array(code)
        a.frombytes(b64decode(col))
        arrays.append(a)
    if not len(arrays[0]) == len(arrays[1]) == len(arrays[2]) == len(arrays[3]):
        raise ValueError("metric columns differ in length")
    return [
        _new_metric(TrackerMetric, (table[i], v, s, t))
        for i, v, s, t in zip(*arrays)
    ]


_new_metric = tuple.__new__
END_REASONS: frozenset[CloseReason] = frozenset(get_args(CloseReason))
_NAME, _VALUE, _STEP, _TIME = (operator.itemgetter(i) for i in range(4))


def encode_batch(batch: Batch) -> bytes:
    """One line: crc32 of the JSON, a space, the JSON (metrics as columns), a newline."""
    body = {
        "seq": batch.seq,
        "first": batch.first,
        "key": batch.key,
        "records": batch.records,
        "metadata": batch.metadata,
        "metadata_ns": batch.metadata_ns,
        "artifacts": [[a.name, a.path, a.metadata] for a in batch.artifacts.values()],
        "sources": [[s.source_run_id, s.artifact_name] for s in batch.sources],
        "metrics": _encode_metrics(batch),
        "names": batch.names,
        "done": sorted(batch.done),
    }
    # Written only when set: lines without them read as before (and older readers ignore
    # keys they do not know).
    if batch.end is not None:
        body["end"] = [batch.end, batch.end_time, batch.life_start]
    if batch.life:
        body["life"] = batch.life
    if batch.done_for is not None:
        body["done_for"] = batch.done_for
    data = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return b"%08x %s\n" % (zlib.crc32(data), data)


def decode_batch(line: bytes) -> Batch:
    """The batch of one line; ValueError if the line is damaged."""
    crc, sep, data = line.rstrip(b"\n").partition(b" ")
    if not sep or len(crc) != 8 or int(crc, 16) != zlib.crc32(data):
        raise ValueError("checksum mismatch")
    body = json.loads(data)
    # [reason, time] in lines written before the life's start was: 0, no later life.
    end, end_time, life_start = [*(body.get("end") or (None, 0.0)), 0.0][:3]
    if end is not None and end not in END_REASONS:
        raise ValueError(f"unknown end reason {end!r}")
    done_for = body.get("done_for")
    return Batch(
        seq=int(body["seq"]),
        first=int(body["first"]),
        key=str(body["key"]),
        metadata=dict(body["metadata"]),
        metadata_ns={k: int(v) for k, v in body.get("metadata_ns", {}).items()},
        artifacts={a[0]: TrackerArtifact(a[0], a[1], a[2]) for a in body["artifacts"]},
        sources=[TrackerSource(s[0], s[1]) for s in body["sources"]],
        metrics=_decode_metrics(body["metrics"]),
        records=int(body["records"]),
        done=set(body["done"]),
        names=dict(body["names"]),
        end=end,
        end_time=float(end_time),
        life_start=float(life_start),
        life=int(body.get("life", 0)),
        done_for=None if done_for is None else str(done_for),
    )


def read_segment_bytes(data: bytes) -> tuple[list[Batch | None], int]:
    """Every line of a segment as its batch, in order, None where a line is damaged (so that
    positions keep their meaning), and how many lines were damaged."""
    batches: list[Batch | None] = []
    damaged = 0
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            batches.append(decode_batch(line))
        except (ValueError, KeyError, TypeError, IndexError, binascii.Error):
            batches.append(None)
            damaged += 1
    return batches, damaged
