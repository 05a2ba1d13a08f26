"""Writers' summaries of MLflow runs, kept in run tags: what the run list reads instead of
every point.

Each writer of a run (a pipeline, named by the token in its batch keys; a process's direct
calls share one token) keeps a :class:`~async_tracker.store.summary.WriterSummary` of what
it wrote: per metric the last value, min, max, count and last step, and when its records
began and last came. It sends the summary whole with each flush, as the tag
``async_tracker.summary.<token>`` inside the flush's last ``log_batch`` request: no request
of its own, and stored after the flush's points (MLflow's SQL store commits a request's
metrics before its tags, and the last request is sent once the others are stored), so a
summary never counts a point the run does not hold. A reader gets every run's tags with
``search_runs`` (a page of up to 1,000 runs a request) and merges each run's summaries (see
``reader.py``).

**Length.** MLflow holds 8,000 characters in a tag value (``MAX_TAG_VAL_LENGTH``): about 100
metrics of a writer. A longer summary is cut into parts: the tag holds
``{"v": 1, "parts": n, "sha1": ...}`` and ``async_tracker.summary.<token>.1`` to ``.n`` hold
the text, sent together in the same request. Past :data:`MAX_SUMMARY_PARTS` parts (about 1,600
metrics) the tag says ``{"v": 1, "omitted": length}`` instead (and the reader reads that
run's points): resending over 128 KB with every flush costs more than it saves, and a
request holds 100 tags.

**What a summary does not hold.** Params: metadata is in tags already, and the reader splits
it as ``metadata()`` does. The run's status and end: MLflow's run info holds them. The
writer's heartbeat: the run's ``async_tracker.heartbeat`` tag.

**Counting once.** ``seq`` and ``keys`` (see ``WriterSummary.counted``) make a batch that is
sent again (a retry, a replay by ``async-tracker sync``) count once; a process that replays
another's batches continues that writer's summary from its tag. MLflow itself stores a point
identical to one it holds (name, value, step, millisecond) once: a flush's duplicates count
once here too (across flushes they count twice; the points' history holds one).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio

from async_tracker.backend.mlflow.mapping import (
    MAX_TAG_VALUE_LENGTH,
    TAG_SUMMARY_PREFIX,
    dumps,
    sha1,
)
from async_tracker.backend.mlflow.requests import MetricEntry
from async_tracker.store.summary import WriterSummary, summarize_columns

logger = logging.getLogger("async_tracker.backend.mlflow")

# The most tags one writer's summary is cut into (the head aside): 16 x 8,000 characters
# travel with every flush of the writer. A log_batch request holds 100 tags.
MAX_SUMMARY_PARTS = 16

# A batch key is ``<time>-<pipeline token>-<seq>`` (pipeline/cutter.py), the token
# ``<19 digits>x<hex>`` (spool/store.py new_token): the writer that cut the batch, whoever
# sends it (a replay included).
_KEY_TOKEN = re.compile(r"\d{19}-(\d{19}x[0-9a-f]+)-")
_NAN = object()  # what a NaN value is when points are compared (NaN != NaN)


def writer_token(batch_key: str) -> str | None:
    """The token of the pipeline that cut the batch keyed ``batch_key``; None for a batch
    without a key (a direct call)."""
    found = _KEY_TOKEN.match(batch_key)
    return found.group(1) if found else None


def summary_tag(token: str) -> str:
    return TAG_SUMMARY_PREFIX + token


@dataclass
class Tally:
    """One writer's summary of one MLflow run, as this process keeps it.

    ``lock`` is held from the moment a batch's summary is computed until its requests are
    stored: the summary sent is the one kept, and two direct calls writing the run at once
    (the only writes that share a tally concurrently; a pipeline's batches come one at a
    time) cannot each send a summary that lacks the other's points."""

    summary: WriterSummary = field(default_factory=WriterSummary)
    lock: anyio.Lock = field(default_factory=anyio.Lock)


def count_batch(
    summary: WriterSummary,
    *,
    key: str,
    seq: int,
    entries: Sequence[MetricEntry],
    stamps_s: Sequence[float],
    now: float,
) -> WriterSummary:
    """``summary`` with one more batch counted: its metric points as sent (``entries``:
    name, value, timestamp in ms, step) and the times of its metadata writes. Its start is
    the earliest of those, its last write the latest (``now`` for a batch with neither), as
    the fsspec store's writers count: a replay days later does not stretch a run."""
    columns: dict[str, tuple[list[int], list[float], list[float]]] = {}
    seen: set[tuple[object, ...]] = set()
    # A loop per point: the MLflow client makes an object and JSON per point anyway.
    for name, value, ms, step in entries:
        point = (name, _NAN if math.isnan(value) else value, ms, step)
        if point in seen:
            continue  # MLflow stores it once
        seen.add(point)
        col = columns.get(name)
        if col is None:
            col = columns[name] = ([], [], [])
        col[0].append(step)
        col[1].append(value)
        col[2].append(ms / 1000.0)  # the time as stored: what a read of the points gives
    metrics, first = summarize_columns(columns)
    first = min([first, *stamps_s])
    last = max([*(max(t) for _, _, t in columns.values()), *stamps_s], default=math.nan)
    return summary.with_batch(
        last if math.isfinite(last) else now,
        key=key,
        seq=seq,
        metrics=metrics,
        first_time=first if math.isfinite(first) else None,
    )


def summary_tags(token: str, summary: WriterSummary) -> list[tuple[str, str]]:
    """The tags that hold ``summary`` of the writer ``token`` (see the module's doc)."""
    text = dumps(summary.to_json())
    head = summary_tag(token)
    if len(text) <= MAX_TAG_VALUE_LENGTH:
        return [(head, text)]
    parts = [text[i : i + MAX_TAG_VALUE_LENGTH] for i in range(0, len(text), MAX_TAG_VALUE_LENGTH)]
    if len(parts) > MAX_SUMMARY_PARTS:
        return [(head, dumps({"v": 1, "omitted": len(text)}))]
    header = dumps({"v": 1, "parts": len(parts), "sha1": sha1(text)})
    return [(head, header), *((f"{head}.{i}", part) for i, part in enumerate(parts, 1))]


@dataclass(frozen=True)
class StoredSummaries:
    """The writers' summaries a run's tags hold: ``writers`` by token, and ``unreadable``,
    the tokens whose summary could not be read (omitted as too long, torn between two
    versions of its parts, or not ours)."""

    writers: dict[str, WriterSummary]
    unreadable: frozenset[str]


def stored_summaries(tags: Mapping[str, str]) -> StoredSummaries:
    """The writers' summaries in a run's ``tags`` (see the module's doc)."""
    writers: dict[str, WriterSummary] = {}
    unreadable: set[str] = set()
    for key, value in tags.items():
        if not key.startswith(TAG_SUMMARY_PREFIX):
            continue
        token = key[len(TAG_SUMMARY_PREFIX) :]
        if "." in token:
            continue  # a part, read with its head
        summary = _summary_of(token, value, tags)
        if summary is None:
            unreadable.add(token)
        else:
            writers[token] = summary
    return StoredSummaries(writers, frozenset(unreadable))


def _summary_of(token: str, value: str, tags: Mapping[str, str]) -> WriterSummary | None:
    try:
        data = json.loads(value)
        if isinstance(data, dict) and "parts" in data:
            head = summary_tag(token)
            text = "".join(tags[f"{head}.{i}"] for i in range(1, int(data["parts"]) + 1))
            if sha1(text) != data.get("sha1"):
                return None  # parts of two versions (read while being written)
            data = json.loads(text)
        if isinstance(data, dict) and "omitted" in data:
            return None
        return WriterSummary.from_json(data)
    except (ValueError, TypeError, KeyError) as exc:
        logger.debug("async_tracker: MLflow summary tag of writer %s unreadable: %s", token, exc)
        return None


__all__ = [
    "MAX_SUMMARY_PARTS", "StoredSummaries", "Tally", "count_batch", "stored_summaries",
    "summary_tag", "summary_tags", "writer_token",
]
