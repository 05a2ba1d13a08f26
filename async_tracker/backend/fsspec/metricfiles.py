"""A run's metric files: how they are named, which of them a reader reads, and what a
reader that follows the run keeps between reads (:class:`MetricsCursor`).

Files in ``metrics/`` (see ``layout.py``; the schema is in ``parquet.py``)::

    <batch key>-<digest>.parquet          one segment per flush of a batch
    <time>-<token>-<n>.parquet            one segment per direct add_metrics call
    <first key>-compact-<digest>.parquet  a writer's segments, compacted when its run ended,
                                          or by a reader once the writer was no longer live
    *.jsonl                               JSON Lines segments: older versions, and a batch
                                          whose steps do not fit int64

A batch segment's digest describes what it holds (:func:`segment_digest`): a replay of the
batch writes the same name (and overwrites), the parts of a batch split by the lane have
names of their own (their keys differ, and so do their points).

Compaction (see ``FsspecWriter``, and ``readcompact.py`` for readers): a compacted file
records its inputs, every file its rows came from, transitively, in its Parquet key-value
metadata (:data:`INPUTS_KEY`: a JSON list of names). It is written whole before any input is
removed, so a reader may meet both:

* a file named as an input by a compacted file that is present and readable is *covered*:
  a reader skips it, its rows being in the compacted file (a crash between the write of the
  compacted file and the removal of its inputs doubles nothing);
* two compacted files that share an input (two processes compacted one writer's files,
  seeing different listings) both hold that input's rows: a reader keeps the first of
  each ``(writer, seq)`` among such files (:class:`Seen`), losing nothing, doubling nothing.

A compacted file that cannot be read covers nothing: its inputs, if still there, are read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from async_tracker.backend.fsspec.parquet import SUFFIX, Columns, SegmentError

# What compacted files record their inputs under, in their key-value metadata.
INPUTS_KEY = "async_tracker.inputs"
JSON_SUFFIX = ".jsonl"
# A batch key: "<19-digit time>-<pipeline token>-<seq>", then ".<i>" per split by the lane.
_KEY = r"\d{19}-[^-.]+-\d+"
# A segment of a batch (group 2: the part's suffix, for a part of a split batch), and a
# compacted file.
_BATCH_SEGMENT = re.compile(rf"({_KEY})((?:\.\d+)*)-[0-9a-f]{{12}}\.parquet")
_COMPACTED = re.compile(rf"({_KEY})-compact-[0-9a-f]{{12}}\.parquet")
_SPLIT = re.compile(rf"{_KEY}((?:\.\d+)+)")
DIGEST_CHARS = 12


def is_parquet(name: str) -> bool:
    """Whether the file is read as Parquet (by its suffix; anything else is JSON Lines)."""
    return name.endswith(SUFFIX)


def is_compacted(name: str) -> bool:
    """Whether ``name`` is a compacted file's (whose inputs a reader must know)."""
    return _COMPACTED.fullmatch(name) is not None


def compactable(name: str, writer: str) -> bool:
    """Whether ``name`` is one of ``writer``'s files that its compaction may take: a
    segment of one of its batches, or a compacted file of its (not a direct call's, whose
    name carries the process's token, nor another writer's)."""
    return compacting_writer(name) == writer


def compacting_writer(name: str) -> str | None:
    """The writer whose compaction takes the file ``name`` (see :func:`compactable`), or
    None for a file no compaction takes (a direct call's, a JSON segment, a foreign file)."""
    found = _BATCH_SEGMENT.fullmatch(name) or _COMPACTED.fullmatch(name)
    return None if found is None else _token(found.group(1))


def row_writer(writer: str, key: str) -> str:
    """What a batch's rows hold as their ``writer``: the writer's token, and for a part of a
    batch the lane split (its key ends ``.<i>`` per split), that part's suffix. The parts
    keep the batch's numbers, so their points start at the same ``seq``: the suffix keeps
    ``(writer, seq)`` one point's."""
    found = _SPLIT.fullmatch(key)
    return writer + found.group(1) if found is not None else writer


def _token(key: str) -> str:
    return key.split("-")[1]


def segment_digest(
    first_seq: int, columns: Mapping[str, tuple[Sequence[Any] | npt.NDArray[Any], ...]]
) -> str:
    """A digest of what a segment holds, cheap to make (no pass over its points): its first
    sequence number, and each metric's name, point count, first and last step. The same
    points give the same digest whatever library version encodes them, so a replay of a
    batch overwrites its segment."""
    parts: list[object] = [first_seq]
    for name, (steps, *_) in columns.items():
        n = len(steps)
        parts.append([name, n, int(steps[0]) if n else None, int(steps[-1]) if n else None])
    text = json.dumps(parts, ensure_ascii=True)
    return hashlib.sha1(text.encode("ascii")).hexdigest()[:DIGEST_CHARS]


def compacted_name(inputs: Sequence[str]) -> str:
    """The name of the file compacting ``inputs`` (a writer's files, sorted by name): it
    sorts where the first of them did, and the same inputs give the same name."""
    first = _BATCH_SEGMENT.fullmatch(inputs[0]) or _COMPACTED.fullmatch(inputs[0])
    if first is None:
        raise ValueError(f"not a file compaction takes: {inputs[0]!r}")
    digest = hashlib.sha1("\n".join(sorted(inputs)).encode("utf-8")).hexdigest()
    return f"{first.group(1)}-compact-{digest[:DIGEST_CHARS]}{SUFFIX}"


def inputs_metadata(inputs: Iterable[str]) -> dict[str, str]:
    """The key-value metadata of a compacted file of ``inputs``."""
    return {INPUTS_KEY: json.dumps(sorted(set(inputs)))}


def inputs_of(data: bytes) -> frozenset[str]:
    """The inputs a compacted file records (empty if none), read from its footer alone.
    Raises :class:`SegmentError` if the bytes are not Parquet or the record is not a list
    of names."""
    try:
        metadata = pq.read_metadata(pa.BufferReader(data)).metadata or {}
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise SegmentError(f"not a Parquet file: {exc}") from exc
    raw = metadata.get(INPUTS_KEY.encode())
    if raw is None:
        return frozenset()
    try:
        names = json.loads(raw)
    except ValueError as exc:
        raise SegmentError(f"{INPUTS_KEY} is not JSON: {exc}") from exc
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SegmentError(f"{INPUTS_KEY} is not a list of names")
    return frozenset(names)


@dataclasses.dataclass(frozen=True)
class Coverage:
    """One listing of a metrics folder (``names``, sorted), what each compacted file in it
    records as its inputs (``inputs``), and which compacted files could not be read
    (``unreadable``): which files a reader reads (``live``) and which it skips."""

    names: tuple[str, ...]
    inputs: Mapping[str, frozenset[str]]
    unreadable: frozenset[str] = frozenset()

    @functools.cached_property
    def covered(self) -> frozenset[str]:
        """The files named as an input by a readable compacted file present (itself aside:
        a file never covers itself)."""
        present = set(self.names)
        out: set[str] = set()
        for name, inputs in self.inputs.items():
            if name in present and name not in self.unreadable:
                out.update(n for n in inputs if n in present and n != name)
        return frozenset(out)

    @functools.cached_property
    def live(self) -> tuple[str, ...]:
        """The files a reader reads, sorted by name: those neither covered nor unreadable."""
        skip = self.covered | self.unreadable
        return tuple(n for n in self.names if n not in skip)

    @functools.cached_property
    def overlapping(self) -> frozenset[str]:
        """The live compacted files that share an input with another live one: their rows
        are deduplicated by ``(writer, seq)``."""
        owner: dict[str, str] = {}
        out: set[str] = set()
        for name in self.live:
            for source in self.inputs.get(name, ()):
                other = owner.setdefault(source, name)
                if other != name:
                    out.update((other, name))
        return frozenset(out)


@dataclasses.dataclass(frozen=True)
class MetricsCursor:
    """What a reader that follows a run keeps between reads of its metric files: the files
    it has read (``consumed``), and what it learnt of the compacted files it met (their
    inputs, and those it could not read), so that a later read reads only new files."""

    consumed: frozenset[str] = frozenset()
    inputs: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    unreadable: frozenset[str] = frozenset()


class Seen:
    """The ``(writer, seq)`` of the rows kept so far of overlapping compacted files, and the
    rows of the next one that are not among them (:meth:`keep`)."""

    def __init__(self) -> None:
        self._seqs: dict[str, list[np.ndarray[Any, Any]]] = {}

    def keep(self, columns: Mapping[str, Columns]) -> dict[str, Columns]:
        """``columns`` (one file's, read with writers and seqs) less the rows already kept;
        then what is left is kept too."""
        before = {w: np.concatenate(s) for w, s in self._seqs.items()}
        out: dict[str, Columns] = {}
        for name, col in columns.items():
            if col.writers is None or col.seqs is None:
                raise ValueError("deduplication needs the writer and seq columns")
            mask = np.ones(len(col.steps), dtype=bool)
            for writer in set(col.writers.tolist()):
                earlier = before.get(writer)
                if earlier is None:
                    continue
                rows = col.writers == writer
                mask[rows] = ~np.isin(col.seqs[rows], earlier)
            kept = col if mask.all() else _rows(col, mask)
            if len(kept.steps):
                out[name] = kept
        for col in out.values():
            assert col.writers is not None and col.seqs is not None
            for writer in set(col.writers.tolist()):
                self._seqs.setdefault(writer, []).append(col.seqs[col.writers == writer])
        return out


def _rows(col: Columns, mask: np.ndarray[Any, Any]) -> Columns:
    def pick(array: Any) -> Any:
        return None if array is None else array[mask]

    return Columns(
        col.steps[mask], col.values[mask], pick(col.times), pick(col.writers), pick(col.seqs)
    )


def filtered(columns: Mapping[str, Any], names: Collection[str] | None) -> dict[str, Any]:
    """``columns`` of the metrics in ``names`` (all without it)."""
    if names is None:
        return dict(columns)
    return {k: v for k, v in columns.items() if k in names}


__all__ = [
    "INPUTS_KEY",
    "JSON_SUFFIX",
    "Coverage",
    "MetricsCursor",
    "Seen",
    "compactable",
    "compacted_name",
    "compacting_writer",
    "filtered",
    "inputs_metadata",
    "inputs_of",
    "is_compacted",
    "is_parquet",
    "row_writer",
    "segment_digest",
]
