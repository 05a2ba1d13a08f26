"""A run's tags and note, carried as reserved metadata keys.

A tag ``t`` that the run has is the metadata key ``async_tracker.tag.<t>`` set to ``True``;
removing it sets the same key to ``False``. The note is ``async_tracker.note`` (its text).
How a run that did not finish ended (its reason, and the exception's type and message) is
``async_tracker.ending``, written by the run's close with its end record.
Keeping them as metadata gives them everything metadata has: they are spooled and replayed,
and each key's latest write wins across processes by its hybrid-clock stamp. One key per tag
(not one list of tags) is what lets two processes tag one run at the same time without either
losing the other's tags.

The ``async_tracker.`` prefix is reserved: ``add_metadata`` refuses such keys
(:func:`async_tracker.records.check_metadata`), and readers hide them from params
(:func:`split_metadata`).

Example::

    >>> tag_metadata(["baseline"], ["draft"])
    {'async_tracker.tag.baseline': True, 'async_tracker.tag.draft': False}
    >>> split_metadata({"lr": 0.1, "async_tracker.tag.baseline": True})
    ({'lr': 0.1}, frozenset({'baseline'}), '')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = [
    "ENDING_KEY",
    "MAX_TAG_LENGTH",
    "NOTE_KEY",
    "RESERVED_KEY_PREFIX",
    "TAG_KEY_PREFIX",
    "check_note",
    "check_tag",
    "ending_cause",
    "is_reserved_key",
    "split_metadata",
    "tag_metadata",
]

# Metadata keys starting with this are the package's own; users' keys may not.
RESERVED_KEY_PREFIX = "async_tracker."
TAG_KEY_PREFIX = RESERVED_KEY_PREFIX + "tag."
NOTE_KEY = RESERVED_KEY_PREFIX + "note"
# How a run that did not finish ended, sealed with its end record (see
# async_tracker.runtime.ending): ``{"reason": ..., "type": ..., "message": ...}``.
ENDING_KEY = RESERVED_KEY_PREFIX + "ending"
MAX_TAG_LENGTH = 100

# Letters, digits and '_' (any script), then also '.' and '-'. Every backend stores such a
# name as it is: an MLflow tag key (which allows only letters, digits, '_', '-', '.', ' ',
# ':' and '/', and no path that normalises to another), a JSON key on fsspec and TensorBoard.
# Starting with a letter, digit or '_' keeps a tag apart from the CLI's "+tag"/"-tag" and
# options ("-h"), and from "." and "..". No ':' (MLflow refuses it on Windows, and the
# filter language writes "tag:name"), no '/', no whitespace, no control characters.
_TAG_RE = re.compile(r"[^\W][\w.\-]*")


def check_tag(tag: object) -> str:
    """``tag`` if it is a valid tag name, else TypeError or ValueError naming it.

    A tag is 1 to 100 characters: letters, digits and ``_`` of any script, ``.`` and ``-``,
    starting with a letter, digit or ``_`` (``baseline``, ``v1.2``, ``lr-sweep``)."""
    if not isinstance(tag, str):
        raise TypeError(f"a tag must be a str, got {type(tag).__name__}: {tag!r}")
    if not tag:
        raise ValueError("a tag must not be empty")
    if len(tag) > MAX_TAG_LENGTH:
        raise ValueError(f"tag {tag[:40]!r}... is {len(tag)} characters; at most {MAX_TAG_LENGTH}")
    if not _TAG_RE.fullmatch(tag):
        raise ValueError(
            f"tag {tag!r}: a tag holds letters, digits, '_', '.' and '-', and starts with a "
            "letter, digit or '_' (no spaces, '/' or ':')"
        )
    return str(tag)  # a str subclass (numpy.str_) becomes a plain str


def check_note(text: object) -> str:
    """``text`` if it can be a run's note (any str that UTF-8 can encode; "" clears the
    note), else TypeError or ValueError."""
    if not isinstance(text, str):
        raise TypeError(f"the note must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"the note holds a lone surrogate ({text[:40]!r}), which no backend can store"
        ) from None
    return str(text)


def tag_metadata(add: Iterable[object] = (), remove: Iterable[object] = ()) -> dict[str, object]:
    """The metadata that adds the tags ``add`` and removes the tags ``remove``; every tag is
    checked first (ValueError or TypeError naming the first bad one). A tag both added and
    removed is a ValueError: which one was meant cannot be told."""
    added = [check_tag(t) for t in add]
    removed = [check_tag(t) for t in remove]
    both = sorted(set(added) & set(removed))
    if both:
        raise ValueError(f"tag {both[0]!r} is both added and removed")
    out: dict[str, object] = {TAG_KEY_PREFIX + t: True for t in added}
    out.update((TAG_KEY_PREFIX + t, False) for t in removed)
    return out


def is_reserved_key(key: str) -> bool:
    """Whether ``key`` is one of the package's own metadata keys (``async_tracker.*``)."""
    return key.startswith(RESERVED_KEY_PREFIX)


def ending_cause(record: Mapping[str, object]) -> str:
    """What ended a run, as one line, from its ending's record (the value of
    :data:`ENDING_KEY`): ``ValueError: bad lr``, ``KeyboardInterrupt``, ``SIGTERM``; "" when
    the record says nothing of it."""
    parts = [str(record[k]) for k in ("type", "message") if record.get(k)]
    return ": ".join(parts)


def split_metadata(md: Mapping[str, object]) -> tuple[dict[str, object], frozenset[str], str]:
    """A run's metadata as ``(params, tags, note)``: ``params`` without the reserved keys
    (in their order), the tags the run has, and its note ("" when none)."""
    params: dict[str, object] = {}
    tags: set[str] = set()
    note = ""
    for key, value in md.items():
        if not key.startswith(RESERVED_KEY_PREFIX):
            params[key] = value
        elif key.startswith(TAG_KEY_PREFIX):
            if value is True:
                tags.add(key[len(TAG_KEY_PREFIX) :])
        elif key == NOTE_KEY and isinstance(value, str):
            note = value
    return params, frozenset(tags), note
