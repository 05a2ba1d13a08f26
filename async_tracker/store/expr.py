"""The filter and sort language of run lists: small, safe, and parsed by hand (never ``eval``).

Filters
-------
A filter is a condition on a run's summary. Examples::

    lr>0.01
    status==crashed or (status==finished and loss.min<0.2)
    tag:baseline and not tag:broken
    acc.last>=0.9 && start>=2026-11-01
    note~"warm restart"
    params."lr.max"<1 and `batch size`>=64

A **condition** is ``KEY OP VALUE`` or ``tag:NAME`` (the run has that tag). Conditions combine
with ``not``, ``and``, ``or`` (any letter case; also ``!``, ``&&``, ``||``), which bind in that
order (``not`` tightest, ``or`` loosest), and parentheses. Spaces are optional.

**Operators**: ``==`` ``!=`` ``<`` ``<=`` ``>`` ``>=``, and ``~`` "contains": the value's text
appears in the key's text, ignoring letter case (no wildcards or regular expressions).

**Keys**:

- ``status``: running, finished, failed, killed or crashed (an unknown status is an error).
- ``id``: the run id; ``note``: the run's note (missing when it has none).
- ``start``, ``end``: when the run started and ended; the value is a date or time,
  ``2026-11-01`` or ``2026-11-01T14:30`` (local time unless it names its zone, as in
  ``...+00:00`` or ``...Z``), or seconds since the epoch. A running run has no ``end``.
- ``duration``: seconds from start to end (to the last heartbeat while running); the value is
  a number of seconds or one with a unit, ``90s``, ``30m``, ``2h``, ``1d``.
- ``METRIC.AGG``: a summary of a metric, AGG one of ``last``, ``min``, ``max``, ``count``,
  ``step`` (the last step): ``loss.min<0.2``, ``train/acc.last>=0.9``. Metric names may hold
  dots (``val.loss.min``: the metric ``val.loss``). A name ending in a word that looks like an
  aggregate but is not one (``loss.median``) is an error that lists the aggregates.
- Any other name is a param (``lr``, ``optimizer/lr``, ``opt.lr``), also written
  ``params.NAME`` (``params.status``, ``params.loss.min``: a param named ``loss.min``).

**Quoting**: a key or name with spaces or other characters is quoted with ``"``, ``'`` or
backticks, the quotes joined to what goes with them: ```batch size`>=64``,
``params."lr.max"<1``, ``"val loss".min<0.3``, ``tag:"my tag"``. Inside quotes a backslash
escapes the next character.

**Values**: numbers (``3``, ``-0.5``, ``1e-3``), quoted text (``"a b"``, ``'x'``), and bare
words: ``true``/``false`` (yes/no), ``null``/``none`` (no value), anything else is text
(``status==crashed``, ``model==resnet50``).

**How values compare**:

- Numbers compare as numbers, and text that reads as a number compares as that number with
  a number: a param logged as the text ``"0.02"`` satisfies ``lr>0.01``.
- Text compares as text: ``==``/``!=`` exactly, ``<``/``>`` in alphabetical (code point)
  order. ``id``, ``status`` and ``note`` are always text.
- ``true``/``false`` equal a param logged as that yes/no (or as the text true/false).
- Values of different kinds (a number and a word) are never equal and never ordered:
  ``==``, ``<``, ``>``, ... are false and ``!=`` is true.
- A **missing** key (a param or metric the run does not have, ``end`` of a running run) is
  like ``null``: every comparison with it is false except ``!=``, which is true. ``KEY==null``
  is true exactly when the key is missing or null, ``KEY!=null`` when it has a value.
- ``~`` compares text: the value as written (unquoted) is looked for in the key's value
  written as text; false when the key is missing.

A bad filter raises :class:`FilterError`, whose first line says the column (counted from 1)
and what was expected there, followed by the filter and a caret under that column. A filter
may be of any length (``a>0 or b>0 or ...`` with thousands of conditions); parentheses nest at
most :data:`MAX_FILTER_DEPTH` levels deep, and a number has at most as many digits as Python
reads (4,300 by default): past either, a :class:`FilterError` says where.

Sorting
-------
``[-]KEY``, any key above (``start``, ``-loss.min``, ``lr``, ``duration``, ``status``, ``id``);
``-`` sorts from largest to smallest. Numbers come before text, and runs without the key
come last in either direction. ``sorted(runs, key=parse_sort("-loss.min").key)``.

Params that differ
------------------
:func:`differing_params`: the param names whose values are not the same in every given run
(missing in some counts as differing), in the order first seen.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

from async_tracker.store.summary import STATUSES, RunSummary

AGGREGATES = ("last", "min", "max", "count", "step")
OPERATORS = ("==", "!=", "<", "<=", ">", ">=", "~")
# How deep parentheses may nest in a filter: far more than anyone writes, and far from
# Python's recursion limit (the parser and the evaluation take four frames a level).
MAX_FILTER_DEPTH = 100
# The most of a token an error message quotes: the message stays one short line.
_SHOWN_CHARS = 40

# Words after a dot that a user most likely meant as an aggregate: ``loss.median`` is then an
# error naming the real aggregates, rather than a param that silently matches nothing.
_AGGREGATE_LIKE = frozenset({
    "mean", "avg", "average", "median", "first", "sum", "total", "std", "stdev", "var",
    "final", "best", "latest", "minimum", "maximum", "steps", "len", "p50", "p90", "p95", "p99",
})  # fmt: skip
_TEXT_FIELDS = ("status", "id", "note")
_TIME_FIELDS = ("start", "end")
_FIELDS = (*_TEXT_FIELDS, *_TIME_FIELDS, "duration")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhd])")
_DURATION_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Characters that end a bare word: space, parentheses, quotes and operator characters.
_SPECIAL = set("()\"'`=!<>~&|")
_OP_CHARS = set("=!<>~")
_KEYWORDS = {"and": "and", "or": "or", "not": "not", "&&": "and", "||": "or", "!": "not"}


class FilterError(ValueError):
    """A filter or sort key that does not parse. ``str()`` is one line naming the column and
    what was expected, then the text and a caret under that column; ``column`` counts from 1."""

    def __init__(self, what: str, text: str, column: int, reason: str) -> None:
        self.text = text
        self.column = column
        self.reason = reason
        line = re.sub(r"\s", " ", text)  # one line, each character in its column
        super().__init__(
            f"bad {what} at column {column}: {reason}\n  {line}\n  {' ' * (column - 1)}^"
        )


# --- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "word", "string", "op", "and", "or", "not", "(", ")", "end"
    text: str  # the value (a string's contents without quotes; an op's characters)
    pos: int  # index in the source
    source: str  # as written
    glued: bool  # no space between it and the previous token


def _tokenize(text: str, fail: Callable[[int, str], FilterError]) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    glued = False
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            glued = False
            continue
        start = i
        if c in "()":
            tokens.append(_Token(c, c, i, c, glued))
            i += 1
        elif c in "\"'`":
            chars: list[str] = []
            i += 1
            while True:
                if i >= n:
                    raise fail(start, f"unterminated quote: no closing {c} to match this one")
                if text[i] == "\\" and i + 1 < n:
                    chars.append(text[i + 1])
                    i += 2
                elif text[i] == c:
                    i += 1
                    break
                else:
                    chars.append(text[i])
                    i += 1
            tokens.append(_Token("string", "".join(chars), start, text[start:i], glued))
        elif c in "&|":
            while i < n and text[i] == c:
                i += 1
            op = text[start:i]
            if op not in _KEYWORDS:
                raise fail(start, f"unknown operator {op!r}: use 'and'/'&&' or 'or'/'||'")
            tokens.append(_Token(_KEYWORDS[op], op, start, op, glued))
        elif c == "!" and text[i + 1 : i + 2] != "=":
            tokens.append(_Token("not", c, start, c, glued))
            i += 1
        elif c in _OP_CHARS:
            while i < n and text[i] in _OP_CHARS:
                i += 1
            op = text[start:i]
            if op not in OPERATORS:
                hint = " (equality is ==)" if op == "=" else ""
                raise fail(
                    start, f"unknown operator {op!r}{hint}: operators are {' '.join(OPERATORS)}"
                )
            tokens.append(_Token("op", op, start, op, glued))
        else:
            while i < n and not text[i].isspace() and text[i] not in _SPECIAL:
                i += 1
            word = text[start:i]
            kind = _KEYWORDS.get(word.lower(), "word")
            tokens.append(_Token(kind, word, start, word, glued))
        glued = True
    tokens.append(_Token("end", "", n, "", False))
    return tokens


# --- keys and values ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    """What a key reads from a run: ``kind`` is a field name, "param" or "metric"."""

    kind: str
    name: str = ""
    agg: str = ""

    def describe(self) -> str:
        if self.kind == "param":
            return f"param {self.name!r}"
        if self.kind == "metric":
            return f"{self.name}.{self.agg}"
        return self.kind

    def read(self, run: RunSummary) -> object:
        """The run's value for this key; None when it has none."""
        if self.kind == "param":
            return run.params.get(self.name)
        if self.kind == "metric":
            m = run.metrics.get(self.name)
            if m is None:
                return None
            if self.agg == "step":
                return m.last_step
            value: object = getattr(m, self.agg)
            return value
        if self.kind == "id":
            return run.run_id
        if self.kind == "duration":
            return run.duration_s
        if self.kind == "note":
            return run.note or None  # an empty note is no note
        value = getattr(run, self.kind)
        return value


class _Parser:
    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.what = what
        self.tokens = _tokenize(text, self.fail)
        self.i = 0
        self.depth = 0  # parentheses open at the current token
        self.keys: list[_Key] = []  # every key read, in order

    def fail(self, pos: int, reason: str) -> FilterError:
        return FilterError(self.what, self.text, pos + 1, reason)

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def next(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def glued_next(self, kind: str) -> _Token | None:
        """The next token when it is of ``kind`` and written right after the current one."""
        nxt = self.tokens[self.i + 1]
        return nxt if nxt.kind == kind and nxt.glued else None

    def show(self, tok: _Token) -> str:
        return "the end" if tok.kind == "end" else repr(_cut(tok.source))

    # key := WORD | STRING | WORD"STRING" (params."x", tag:"x") | STRING.AGG ("x".min)
    def key(self) -> tuple[_Key, _Token]:
        found = self._key()
        self.keys.append(found[0])
        return found

    def _key(self) -> tuple[_Key, _Token]:
        tok = self.tok
        if tok.kind == "string":
            self.next()
            suffix = self.tok if self.tok.kind == "word" and self.tok.glued else None
            if suffix is None:
                return _Key("param", tok.text), tok
            self.next()
            if suffix.text.startswith(".") and suffix.text[1:].lower() in AGGREGATES:
                return _Key("metric", tok.text, suffix.text[1:].lower()), tok
            raise self.fail(suffix.pos, f"expected .AGG after a quoted metric name ({_aggs()})")
        if tok.kind != "word":
            raise self.fail(tok.pos, f"expected a key (a param, METRIC.AGG, status, ...), "
                                     f"got {self.show(tok)}")  # fmt: skip
        self.next()
        word = tok.text
        if word.lower() == "params." and self.tok.kind == "string" and self.tok.glued:
            return _Key("param", self.next().text), tok
        if word.lower().startswith("params.") and len(word) > len("params."):
            return _Key("param", word[len("params.") :]), tok
        if word in _FIELDS:
            return _Key(word), tok
        name, dot, agg = word.rpartition(".")
        if dot and name:
            if agg.lower() in AGGREGATES:
                return _Key("metric", name, agg.lower()), tok
            if agg.lower() in _AGGREGATE_LIKE:
                raise self.fail(
                    tok.pos + len(name) + 1,
                    f"unknown aggregate {agg!r}: aggregates are {_aggs()} "
                    f"(a param named {word!r} is params.{word})",
                )
        return _Key("param", word), tok

    def value(self, key: _Key, op: _Token) -> tuple[object, str]:
        """The literal after ``op`` (checked against what ``key`` holds) and its text."""
        tok = self.tok
        if tok.kind not in ("word", "string"):
            raise self.fail(tok.pos, f"expected a value after {op.text!r}, got {self.show(tok)}")
        self.next()
        try:
            value = tok.text if tok.kind == "string" else _word_value(tok.text)
        except ValueError:  # an integer of more digits than Python reads (4,300)
            if key.kind not in _TEXT_FIELDS and op.text != "~":
                raise self.fail(
                    tok.pos,
                    f"the number {self.show(tok)} has {len(tok.text)} digits, too many to read",
                ) from None
            value = tok.text  # read as text below
        if op.text == "~":
            if key.kind in _TIME_FIELDS or key.kind in ("duration", "metric"):
                raise self.fail(op.pos, f"'~' compares text; {key.describe()} is a number")
            return tok.text, tok.text
        if value is None:
            return None, tok.text
        if key.kind in _TIME_FIELDS:
            return self.time_value(tok), tok.text
        if key.kind == "duration":
            return self.duration_value(tok), tok.text
        if key.kind == "metric" and not _is_number(value):
            raise self.fail(tok.pos, f"expected a number: {key.describe()} is a number")
        if key.kind in _TEXT_FIELDS:
            value = tok.text  # always text: ids like 1e5 stay text
            if key.kind == "status" and op.text in ("==", "!=") and value not in STATUSES:
                raise self.fail(
                    tok.pos, f"unknown status {value!r}: statuses are {', '.join(STATUSES)}"
                )
        return value, tok.text

    def time_value(self, tok: _Token) -> float:
        if tok.kind == "word" and _NUMBER.fullmatch(tok.text):
            return float(tok.text)
        text = tok.text[:-1] + "+00:00" if tok.text[-1:] in ("Z", "z") else tok.text
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise self.fail(
                tok.pos,
                f"expected a date or time (2026-11-01, 2026-11-01T14:30) or seconds since "
                f"the epoch, got {tok.source!r}",
            ) from None

    def duration_value(self, tok: _Token) -> float:
        if tok.kind == "word":
            if _NUMBER.fullmatch(tok.text):
                return float(tok.text)
            m = _DURATION.fullmatch(tok.text)
            if m:
                return float(m.group(1)) * _DURATION_UNITS_S[m.group(2)]
        raise self.fail(tok.pos, f"expected seconds (90, 90s, 30m, 2h, 1d), got {tok.source!r}")

    # or := and (OR and)* ; and := not (AND not)* ; not := NOT* primary
    # A run of ORs (ANDs) is one node holding its operands, and a run of NOTs one NOT or
    # none: the tree is no deeper for a longer filter, only for nested parentheses, which
    # primary() bounds. Its depth bounds the parser's recursion and the evaluation's.
    def parse_or(self) -> _Node:
        items = [self.parse_and()]
        while self.tok.kind == "or":
            self.operand_after(self.next())
            items.append(self.parse_and())
        return items[0] if len(items) == 1 else _Or(tuple(items))

    def parse_and(self) -> _Node:
        items = [self.parse_not()]
        while self.tok.kind == "and":
            self.operand_after(self.next())
            items.append(self.parse_not())
        return items[0] if len(items) == 1 else _And(tuple(items))

    def parse_not(self) -> _Node:
        negated = False
        while self.tok.kind == "not":
            self.operand_after(self.next())
            negated = not negated
        node = self.primary()
        return _Not(node) if negated else node

    def operand_after(self, keyword: _Token) -> None:
        """Fails unless a condition can start at the next token (after ``keyword``)."""
        if self.tok.kind in ("end", ")", "and", "or"):
            raise self.fail(self.tok.pos, f"expected a condition after {keyword.source!r}, "
                                          f"got {self.show(self.tok)}")  # fmt: skip

    def primary(self) -> _Node:
        tok = self.tok
        if tok.kind == "(":
            if self.depth >= MAX_FILTER_DEPTH:
                raise self.fail(
                    tok.pos, f"parentheses nest deeper than {MAX_FILTER_DEPTH} levels here"
                )
            self.next()
            if self.tok.kind == ")":
                raise self.fail(self.tok.pos, "expected a condition inside '()'")
            self.depth += 1
            node = self.parse_or()
            self.depth -= 1
            if self.tok.kind != ")":
                raise self.fail(
                    self.tok.pos,
                    f"expected ')' to close the '(' at column {tok.pos + 1}, "
                    f"got {self.show(self.tok)}",
                )
            self.next()
            return node
        if tok.kind in ("end", ")", "and", "or"):
            if tok.kind == "end" and not self.text.strip():
                raise self.fail(tok.pos, "the filter is empty")
            if tok.kind == ")":
                raise self.fail(tok.pos, "unmatched ')'")
            raise self.fail(tok.pos, f"expected a condition, got {self.show(tok)}")
        if tok.kind == "word" and tok.text.lower().startswith("tag:"):
            return self.tag()
        key, key_tok = self.key()
        if self.tok.kind != "op":
            hint = ""
            if key_tok.text in STATUSES:
                hint = f" (a run's status is status=={key_tok.text})"
            raise self.fail(
                self.tok.pos,
                f"expected an operator ({' '.join(OPERATORS)}) after {key_tok.source!r}"
                f"{hint}, got {self.show(self.tok)}",
            )
        op = self.next()
        value, source = self.value(key, op)
        return _Compare(key, op.text, value, source)

    def tag(self) -> _Node:
        tok = self.next()
        name = tok.text[len("tag:") :]
        if not name:
            if self.tok.kind == "string" and self.tok.glued:
                name = self.next().text
            else:
                raise self.fail(tok.pos + len("tag:"), "expected a tag name after 'tag:'")
        return _HasTag(name)

    def parse_filter(self) -> _Node:
        node = self.parse_or()
        tok = self.tok
        if tok.kind == ")":
            raise self.fail(tok.pos, "unmatched ')'")
        if tok.kind != "end":
            raise self.fail(tok.pos, f"expected 'and', 'or' or the end, got {self.show(tok)}")
        return node

    def parse_sort(self) -> tuple[_Key, bool]:
        descending = False
        tok = self.tok
        if tok.kind == "word" and tok.text[:1] in "+-":
            descending = tok.text[0] == "-"
            rest = tok.text[1:]
            if rest:
                # Split the sign off the word, so that the key reads as in a filter.
                self.tokens[self.i] = _Token("word", rest, tok.pos + 1, rest, tok.glued)
            else:
                self.next()
                if not self.tok.glued:
                    raise self.fail(tok.pos + 1, "expected a key right after the sign")
        if self.tok.kind == "end":
            raise self.fail(self.tok.pos, "expected a key to sort by ([-]KEY)")
        if self.tok.kind == "word" and self.tok.text.lower().startswith("tag:"):
            raise self.fail(self.tok.pos, "cannot sort by a tag: sort by a key")
        key, _ = self.key()
        if self.tok.kind != "end":
            raise self.fail(self.tok.pos, f"expected the end after the key, "
                                          f"got {self.show(self.tok)}")  # fmt: skip
        return key, descending


def _aggs() -> str:
    return ", ".join(AGGREGATES)


def _cut(text: str) -> str:
    """``text`` as an error message quotes it: its start, when long."""
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _word_value(word: str) -> object:
    if _NUMBER.fullmatch(word):
        return int(word) if re.fullmatch(r"[+-]?\d+", word) else float(word)
    lower = word.lower()
    if lower in ("true", "false"):
        return lower == "true"
    if lower in ("null", "none"):
        return None
    return word


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_number(value: object) -> float | int | None:
    """``value`` as a number: numbers, and text that reads as one; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value)
    return None


# --- evaluation -----------------------------------------------------------------------------------


class _Compare:
    def __init__(self, key: _Key, op: str, value: object, source: str) -> None:
        self.key = key
        self.op = op
        self.value = value
        self.source = source

    def __call__(self, run: RunSummary) -> bool:
        actual = self.key.read(run)
        if self.op == "~":
            return actual is not None and self.source.casefold() in _text(actual).casefold()
        if actual is None or self.value is None:
            same = actual is None and self.value is None
            return same if self.op == "==" else (not same if self.op == "!=" else False)
        return _compare(actual, self.op, self.value)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _compare(actual: object, op: str, literal: object) -> bool:
    """``actual OP literal``, both not None; values of different kinds are only ``!=``."""
    a: object
    b: object
    if isinstance(literal, bool) or isinstance(actual, bool):
        a, b = _as_bool(actual), _as_bool(literal)
        if a is None or b is None:
            return op == "!="
        if op not in ("==", "!="):
            return False  # yes/no values have no order
    elif _is_number(literal) or _is_number(actual):
        # One side is a number: the other must be one too, or text reading as one.
        a, b = _as_number(actual), _as_number(literal)
        if a is None or b is None:
            return op == "!="
    elif isinstance(actual, str) and isinstance(literal, str):
        a, b = actual, literal
    else:  # a list or mapping param against text: different kinds
        return op == "!="
    return _OPS[op](a, b)


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return {"true": True, "false": False}.get(value.lower())
    return None


_OPS: dict[str, Callable[[object, object], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,  # type: ignore[operator]  # same-kind values, checked above
    "<=": lambda a, b: a <= b,  # type: ignore[operator]
    ">": lambda a, b: a > b,  # type: ignore[operator]
    ">=": lambda a, b: a >= b,  # type: ignore[operator]
}


@dataclass(frozen=True)
class _HasTag:
    name: str

    def __call__(self, run: RunSummary) -> bool:
        return self.name in run.tags


@dataclass(frozen=True)
class _Not:
    inner: _Node

    def __call__(self, run: RunSummary) -> bool:
        return not self.inner(run)


@dataclass(frozen=True)
class _And:
    items: tuple[_Node, ...]

    def __call__(self, run: RunSummary) -> bool:
        return all(item(run) for item in self.items)


@dataclass(frozen=True)
class _Or:
    items: tuple[_Node, ...]

    def __call__(self, run: RunSummary) -> bool:
        return any(item(run) for item in self.items)


_Node: TypeAlias = "_Compare | _HasTag | _Not | _And | _Or"


# --- public API -----------------------------------------------------------------------------------


class Filter:
    """A parsed filter: call it on a :class:`RunSummary` to know whether the run matches.

    >>> f = parse_filter("lr>0.01 and tag:baseline")
    >>> matching = [run for run in runs if f(run)]  # doctest: +SKIP
    """

    def __init__(self, text: str, node: _Node, keys: Sequence[_Key] = ()) -> None:
        self.text = text
        self._node = node
        self.keys = tuple(keys)

    def __call__(self, summary: RunSummary) -> bool:
        try:
            return self._node(summary)
        except RecursionError:
            # Nesting within MAX_FILTER_DEPTH, from a caller whose own stack is already deep.
            raise FilterError("filter", self.text, 1, "nested too deep to evaluate here") from None

    def __repr__(self) -> str:
        return f"parse_filter({self.text!r})"


def parse_filter(text: str) -> Filter:
    """The filter ``text`` (the language is in this module's docstring); raises
    :class:`FilterError` saying where when it does not parse."""
    parser = _Parser(text, "filter")
    try:
        node = parser.parse_filter()
        return Filter(text, node, parser.keys)
    except RecursionError:
        # Nesting within MAX_FILTER_DEPTH, from a caller whose own stack is already deep.
        raise parser.fail(parser.tok.pos, "nested too deep to read here") from None


class SortKey:
    """A parsed sort key: ``sorted(runs, key=sort_key.key)`` orders runs by it, in the
    direction it asks for (``reverse`` tells which; do not pass it to ``sorted``), with runs
    missing the key last."""

    def __init__(self, text: str, key: _Key, reverse: bool) -> None:
        self.text = text
        self.reverse = reverse
        self._key = key
        self.keys = (key,)

    def key(self, summary: RunSummary) -> tuple[object, ...]:
        value = self._key.read(summary)
        # Params logged as text that reads as a number sort as that number, as they filter.
        number = _as_number(value) if self._key.kind not in _TEXT_FIELDS else None
        if isinstance(value, bool):
            number = int(value)
        if isinstance(number, float) and math.isnan(number):
            value = number = None  # NaN has no place in an order: sort it with the missing
        if value is None:
            return (1,)
        if number is not None:
            return (0, 0, -number if self.reverse else number)
        text = _text(value)
        if not self.reverse:
            return (0, 1, text)
        # Text from largest to smallest: each code point negated, then a terminator larger
        # than any of them, so that "ab" (a longer text with the same start) comes before "a".
        return (0, 1, (*(-ord(c) for c in text), 1))

    def __repr__(self) -> str:
        return f"parse_sort({self.text!r})"


def parse_sort(text: str) -> SortKey:
    """The sort key ``[-]KEY`` (``-`` for largest first); raises :class:`FilterError`."""
    key, reverse = _Parser(text, "sort key").parse_sort()
    return SortKey(text, key, reverse)


def unknown_keys(keys: Iterable[_Key], runs: Sequence[RunSummary]) -> list[str]:
    """One line per param or metric of ``keys`` that no run of ``runs`` has, naming the
    nearest names runs do have: a typo in a filter or a sort key gives an empty or unsorted
    list that would otherwise say nothing. Empty when ``runs`` is (nothing to compare)."""
    if not runs:
        return []
    params = {k for r in runs for k in r.params}
    metrics = {k for r in runs for k in r.metrics}
    lines: list[str] = []
    for key in dict.fromkeys(keys):
        if key.kind == "param" and key.name not in params:
            known, what = params | {f"{m}.last" for m in metrics}, f"param {key.name!r}"
        elif key.kind == "metric" and key.name not in metrics:
            known, what = {f"{m}.{key.agg}" for m in metrics} | params, f"metric {key.name!r}"
        else:
            continue
        near = difflib.get_close_matches(key.describe() if key.kind == "metric" else key.name,
                                         sorted(known), n=3, cutoff=0.5)  # fmt: skip
        hint = f" (nearest: {', '.join(near)})" if near else ""
        lines.append(f"no run has {what}{hint}")
    return lines


def differing_params(summaries: Sequence[RunSummary]) -> list[str]:
    """The param names whose values are not the same in every run of ``summaries`` (a name
    missing from some counts as differing), in the order first seen; none with fewer than two
    runs. ``1`` and ``1.0`` differ (a list shows them differently); NaN equals NaN."""
    order: dict[str, None] = {}
    for run in summaries:
        order.update(dict.fromkeys(run.params))
    missing = object()
    differing = []
    for name in order:
        values = [run.params.get(name, missing) for run in summaries]
        first = values[0]
        if any(not _same(first, v) for v in values[1:]):
            differing.append(name)
    return differing


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


__all__ = [
    "AGGREGATES",
    "MAX_FILTER_DEPTH",
    "OPERATORS",
    "Filter",
    "FilterError",
    "SortKey",
    "differing_params",
    "parse_filter",
    "parse_sort",
    "unknown_keys",
]
