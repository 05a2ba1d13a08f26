"""Reading the fsspec store's record files back: a parser per kind of file, and what a read
skipped, told in one warning.

Reads sort by name and skip what they cannot parse (a foreign file, a truncated line, JSON
nested too deep, a step that is not an integer, a file where a directory should be) with one
warning per read naming the files.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TypeVar

from async_tracker.backend.fsspec.layout import (
    _DIGEST,
    _STATUS_RANK,
    _UNPARSEABLE,
    decode_run_id,
)
from async_tracker.records import TrackerArtifact, TrackerSource

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Skipped:
    """What one read skipped, told in one warning naming the files."""

    SHOWN = 5

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.paths: set[str] = set()

    def add(self, path: str, why: object) -> None:
        if path in self.paths:
            return  # one read that meets a path twice (a run directory that is a file)
        self.paths.add(path)
        if isinstance(why, BaseException):
            why = f"{type(why).__name__}: {why}"
        text = str(why)
        self.entries.append(f"{path} ({text[:120]}{'...' if len(text) > 120 else ''})")

    def warn(self) -> None:
        if not self.entries:
            return
        shown = self.entries[: self.SHOWN]
        more = len(self.entries) - len(shown)
        logger.warning(
            "async_tracker: skipped what is not a tracker record: %s%s",
            "; ".join(shown),
            f"; and {more} more" if more else "",
        )


def _parse_each(
    directory: str,
    files: Iterable[tuple[str, bytes]],
    parse: Callable[[str, bytes], T],
    skipped: _Skipped,
) -> list[tuple[str, T]]:
    out: list[tuple[str, T]] = []
    for name, data in files:
        try:
            out.append((name, parse(name, data)))
        except _UNPARSEABLE as exc:
            skipped.add(posixpath.join(directory, name), exc)
    return out


def _parse_metadata(_: str, data: bytes) -> dict[str, object]:
    entry = json.loads(data)
    values = entry["metadata"] if isinstance(entry, dict) else None
    if not isinstance(values, dict):
        raise TypeError('not {"metadata": {...}}')
    return values


# A writer's ending: (status, time, when its life began, which life: see _last_life_ending).
Ending = tuple[str, float, float, int]


def _parse_status(name: str, data: bytes) -> Ending:
    content = json.loads(data)
    status, when = content["status"], float(content["time"])
    if status not in _STATUS_RANK:
        raise ValueError(f"unknown status {status!r}")
    return status, when, float(content.get("started", 0.0)), _parse_life(name, data)


def _parse_heartbeat(name: str, data: bytes) -> tuple[float, float, int]:
    """A heartbeat file's time, interval and the life its writer lives."""
    content = json.loads(data)
    when, every = float(content["time"]), float(content["interval_s"])
    if not every > 0:
        raise ValueError(f"heartbeat interval {every!r} is not > 0")
    return when, every, _parse_life(name, data)


def _parse_life(_: str, data: bytes) -> int:
    """The life of the run a status or heartbeat file's writer lived (0: a file of a writer
    that did not say, a first life)."""
    content = json.loads(data)
    delivery = content.get("delivery")
    life = content.get("life", delivery.get("life", 0) if isinstance(delivery, dict) else 0)
    if isinstance(life, bool) or not isinstance(life, int):
        raise ValueError(f"life {life!r} is not a whole number")
    return life


def _parse_heartbeat_file(data: bytes) -> dict[str, object]:
    when, every, _ = _parse_heartbeat("", data)
    content = json.loads(data)
    delivery = content.get("delivery")
    out: dict[str, object] = {"time": when, "interval_s": every}
    if isinstance(delivery, dict):
        out["delivery"] = delivery
    return out


def _parse_artifact(data: bytes) -> TrackerArtifact:
    entry = json.loads(data)
    if not isinstance(entry, dict):
        raise TypeError("not an artifact object")
    name, path, meta = entry["name"], entry["path"], entry.get("metadata")
    if not isinstance(name, str) or not isinstance(path, str):
        raise TypeError("artifact name or path is not a string")
    if meta is not None and not isinstance(meta, dict):
        raise TypeError("artifact metadata is not a mapping")
    return TrackerArtifact(name, path, meta)


def _parse_edges(name: str, data: bytes) -> list[TrackerSource]:
    """A lineage file: ``<base32(run id)>`` (torchx's, several artifact names, one a line) or
    ``<base32(run id)>.<digest of its artifact name>`` (ours, one edge)."""
    encoded, dot, digest = name.partition(".")
    if dot and not _DIGEST.fullmatch(digest):
        raise ValueError("not a lineage file name")
    other = decode_run_id(encoded)
    if other is None:
        raise ValueError("not a lineage file name: no base32 run id")
    lines = data.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()  # the last line's newline
    names = list(dict.fromkeys(line.strip() for line in lines)) or [""]
    return [TrackerSource(other, n or None) for n in names]


def _last_life_ending(
    endings: Sequence[Ending], unended: Collection[int] = ()
) -> tuple[str, float] | None:
    """The run's ending from its writers' endings ``(status, time, started, life)`` (at
    least one) and the lives of its writers that have not ended (``unended``): the worst
    ending of its last life, at the latest time of that ending; None when the last life has
    not ended (a requeued run training again).

    Lives are ordered by their number, a counter the store holds (``init()`` opens a run's
    first life as 1, and a resumed run lives one past the highest it found), never by
    clocks. A writer that did not look its life up (a rank opened with ``AppRun``, or a
    version before lives were numbered: life 0) belongs to the latest numbered life that
    began before it ended. Within one life, an ending
    before another writer of it began (an older version's resumed life, told apart by its
    start time alone) is overtaken."""
    numbered = [(started, life) for _, _, started, life in endings if life > 0]

    def life_of(ending: Ending) -> int:
        _, when, _, life = ending
        if life > 0:
            return life
        return max((n for started, n in numbered if started <= when), default=0)

    lives = [life_of(e) for e in endings]
    last = max([*lives, *unended])
    mine = [e for e, life in zip(endings, lives) if life == last]
    if not mine:
        return None
    latest_start = max(started for _, _, started, _ in mine)
    # Ranks of one life end after every rank began; an ending before the latest start is
    # an earlier life's. At least the latest ending is always kept.
    last_life = [(s, t) for s, t, _, _ in mine if t >= latest_start] or [
        max(((s, t) for s, t, _, _ in mine), key=lambda e: e[1])
    ]
    worst = max(_STATUS_RANK[s] for s, _ in last_life)
    times = [t for s, t in last_life if _STATUS_RANK[s] == worst]
    return next(s for s, r in _STATUS_RANK.items() if r == worst), max(times)
