"""The cutter: records drained from the ingress, in call order, become numbered batches.

Each record gets the next sequence number of its run; a batch holds consecutive records
(``first`` to ``seq``) and gets a key unique across processes that sorts in write order.
Inside a batch, records coalesce: metadata merged in call order (the last write of a key
wins), an artifact name kept at its last write, a source kept once. A metric logged without a
step gets the previous step of that metric plus one (0 for its first point).

The common batch holds nothing but metrics; it is cut with C-level operations (``map``,
``zip``, ``dict.update``) and no per-record Python loop, which is most of what the flusher
costs a training loop that shares the GIL with it.
"""

from __future__ import annotations

import functools
import operator
import time
from array import array
from collections.abc import Mapping, Sequence

from async_tracker.clock import HybridClock
from async_tracker.ingress import ARTIFACT, METADATA, Record
from async_tracker.records import (
    Batch,
    CloseReason,
    MetricColumns,
    PointsBatch,
    TrackerArtifact,
    TrackerMetric,
    TrackerSource,
)

_NAME = operator.itemgetter(0)
_STEP = operator.itemgetter(2)
# Builds a TrackerMetric from a 4-tuple without its Python __new__ (a C call per point).
_as_metric = functools.partial(tuple.__new__, TrackerMetric)
# Past this many names in a run, the last steps of a column batch are found by one pass in
# C over every point, rather than one search per name.
_NAMES_SEARCHED = 64
# The times of batch keys, one clock for the process: keys never go back in time, even if the
# wall clock is set back, across all the runs of the process (a run reopened after a step back
# still names its files after those it wrote before). Only the tracker loop's thread cuts
# batches, so the clock's unlocked read-then-write is never raced.
_key_clock = HybridClock()


class Cutter:
    """The numbering state of one run: the next sequence number, the last step of each
    metric, and the pipeline's token (the middle part of batch keys)."""

    def __init__(self, token: str, life: int = 0) -> None:
        self.token = token
        # The run's life this process lives (see Batch.life): on every batch, so that the
        # store knows a writer's life from its first write.
        self.life = life
        self.next_seq = 0
        self.last_step: dict[str, int] = {}
        # The stamp of the run's last metadata record (see _mixed).
        self._last_metadata_ns = 0

    def _key(self, seq: int) -> str:
        return f"{_key_clock.stamp(time.time_ns()):019d}-{self.token}-{seq:012d}"

    def cut(self, records: Sequence[Record]) -> Batch:
        """One batch of ``records`` (taken from the ingress in call order)."""
        first = self.next_seq
        seq = first + len(records) - 1
        self.next_seq = seq + 1
        try:
            # Only metric records have a third item: any other record ends the fast path.
            steps = list(map(_STEP, records))
        except IndexError:
            steps = [None]
        if None in steps:
            # Others, or step-less points: the per-record loop.
            batch = Batch(seq, records=len(records), first=first, key=self._key(seq))
            batch.life = self.life
            self._mixed(records, batch)
            return batch
        # The last step of each name is its last point's: dict.update keeps the last. The
        # records are metric rows as they are: no object per point.
        self.last_step.update(zip(map(_NAME, records), steps))
        points = PointsBatch(seq, list(records), first=first, key=self._key(seq))
        points.life = self.life
        return points

    def cut_columns(self, columns: MetricColumns) -> Batch:
        """One batch of points taken as columns from the packed ingress (each with a step):
        numbered like any batch, and the last step of each name noted, with no object per
        point (the names of a run are few; each is found from the end of its column)."""
        first = self.next_seq
        n = len(columns)
        self.next_seq = first + n
        batch = PointsBatch(first + n - 1, columns, first=first, key=self._key(first + n - 1))
        batch.life = self.life
        index, steps = array("I", columns.index), array("q", columns.steps)
        names = columns.names
        if len(names) > _NAMES_SEARCHED:
            self.last_step.update(zip(map(names.__getitem__, index), steps))
            return batch
        backwards = index[::-1]
        for i, name in enumerate(names):
            try:
                at = backwards.index(i)
            except ValueError:
                continue  # not in this batch
            self.last_step[name] = steps[n - 1 - at]
        return batch

    def cut_end(
        self,
        reason: CloseReason,
        when: float,
        life_start: float,
        metadata: Mapping[str, object] | None = None,
        stamp_ns: int = 0,
    ) -> Batch:
        """The run's end record, as the last batch: numbered after every record (a replay
        then sends it after them, and its ack covers it), but no record of the user's:
        ``records`` stays 0, so that counts add up to what was logged. ``metadata`` (what
        ended a run that did not finish: see ``async_tracker.runtime.ending``), stamped
        ``stamp_ns``, goes with it: backends store a batch's metadata before its end."""
        seq = self.next_seq
        self.next_seq = seq + 1
        batch = Batch(
            seq, first=seq, key=self._key(seq), end=reason, end_time=when,
            life_start=life_start, life=self.life,
        )  # fmt: skip
        if metadata:
            batch.metadata = dict(metadata)
            batch.metadata_ns = dict.fromkeys(metadata, stamp_ns or time.time_ns())
        return batch

    def _mixed(self, records: Sequence[Record], batch: Batch) -> None:
        metadata = batch.metadata
        artifacts = batch.artifacts
        metrics = batch.metrics
        last_step = self.last_step
        seen_sources: set[tuple[str, str | None]] = set()
        for rec in records:
            if len(rec) == 4:
                name, value, step, ts = rec
                if step is None:
                    step = last_step.get(name, -1) + 1
                    rec = (name, value, step, ts)
                last_step[name] = step
                metrics.append(_as_metric(rec))
                continue
            kind, payload = rec
            if kind is METADATA:
                values, ns = payload
                # Within a run the sequence number orders writes: a stamp not above the run's
                # previous one (threads racing on the process's clock) is raised just above
                # it. Only this loop's thread cuts a run, so this needs no lock.
                if ns <= self._last_metadata_ns:
                    ns = self._last_metadata_ns + 1
                self._last_metadata_ns = ns
                metadata.update(values)
                batch.metadata_ns.update(dict.fromkeys(values, ns))
            elif kind is ARTIFACT:
                art: TrackerArtifact = payload
                artifacts.pop(art.name, None)  # keep the order of last writes
                artifacts[art.name] = art
            else:
                src: TrackerSource = payload
                key = (src.source_run_id, src.artifact_name)
                if key not in seen_sources:
                    seen_sources.add(key)
                    batch.sources.append(src)


def items(batch: Batch) -> int:
    """How many separately storable items a batch holds (what a split can separate); the
    end record is one, so that a refused record never takes it along."""
    data = len(batch.metadata) + len(batch.artifacts) + len(batch.sources) + batch.points()
    return data + (batch.end is not None)


def split(batch: Batch) -> list[Batch]:
    """Two halves of a batch (by items: metadata keys, artifacts, sources, metric points, and
    last the end record), to find the item a backend refuses; [] for a batch of one item.
    Each half keeps the batch's numbers. Records are shared out in proportion to items, so
    that the halves add up to the batch: exact for metrics (a point is a record), a share for
    metadata, where one call may have set several keys. The end record, which is no record,
    goes to the second half."""
    n = items(batch)
    if n <= 1:
        return []
    cut = n // 2
    data = n - (batch.end is not None)  # the items that hold records
    parts: list[Batch] = []
    for i, (lo, hi) in enumerate(((0, cut), (cut, n))):
        part = Batch(batch.seq, first=batch.first, key=f"{batch.key}.{i}", life=batch.life)
        k = 0
        for name, value in batch.metadata.items():
            if lo <= k < hi:
                part.metadata[name] = value
                if name in batch.metadata_ns:
                    part.metadata_ns[name] = batch.metadata_ns[name]
            k += 1
        for name, art in batch.artifacts.items():
            if lo <= k < hi:
                part.artifacts[name] = art
            k += 1
        for src in batch.sources:
            if lo <= k < hi:
                part.sources.append(src)
            k += 1
        m0 = len(batch.metadata) + len(batch.artifacts) + len(batch.sources)
        part.metrics = batch.metrics[max(0, lo - m0) : max(0, hi - m0)]
        parts.append(part)
    parts[1].end, parts[1].end_time = batch.end, batch.end_time
    parts[1].life_start = batch.life_start
    parts[0].records = batch.records * min(cut, data) // data if data else 0
    parts[1].records = batch.records - parts[0].records
    return parts
