"""What each record becomes in MLflow, and whether MLflow takes it.

::

    add_metadata(k=v)  ->  tag k = json(v), every write (last write wins; metadata() reads it)
                           + params: the first write of k in a run, flattened as
                             log_params_flat does (k.sub = str(value))
    add_tags(t)        ->  tag async_tracker.tag.<t> = "true" (remove_tags: "false"), never
                           params: searchable (tags."async_tracker.tag.t" = 'true')
    set_note(text)     ->  tag mlflow.note.content = text: the run's description in the
                           MLflow UI (an edit there is what note() reads back)
    add_artifact(n, p) ->  tag async_tracker.artifact.<sha1(n)> = json({name, path, metadata}),
                           after uploading p to <n>/ in the run's artifacts if it is a local
                           file or directory (a URI such as s3://... is recorded, not fetched)
    add_source(s, a)   ->  tag async_tracker.source.<sha1([s, a])> = json({source_run_id, ...})
                           tag async_tracker.parent.<sha1(s)> = "1"  (descendant searches)
    log_metric         ->  metric points, client timestamps (ms) and steps
    each flush         ->  tag async_tracker.summary.<writer token> = json(the writer's
                           summary of the run: per metric last, min, max, count, last step),
                           in the flush's last log_batch request (see summaries.py)

Tag names of objects are hashes: deterministic (a retry overwrites), valid MLflow keys
whatever the artifact or source is called, and within the 250-character key limit.

The ``*_problems`` functions say why MLflow would refuse an entry (empty: it takes it), in
messages that name the key: :meth:`AsyncMLflowTracker.validate` raises them at the call site,
and ``write_batch`` leaves such entries out of what it sends and counts them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import re
import sys
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from async_tracker.records import TrackerArtifact, TrackerMetric, TrackerSource
from async_tracker.tags import ENDING_KEY, NOTE_KEY, TAG_KEY_PREFIX, check_tag, is_reserved_key

logger = logging.getLogger("async_tracker.backend.mlflow")

# -- MLflow's limits on one entry (mlflow.utils.validation; the server enforces them) ----------
MAX_KEY_LENGTH = 250
MAX_TAG_VALUE_LENGTH = 8000
MAX_PARAM_VALUE_LENGTH = 6000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The SQL stores clip infinities to the largest double; reads map those back.
FLOAT_MAX = sys.float_info.max

# -- tags ----------------------------------------------------------------------------------------
TAG_PREFIX = "async_tracker."
TAG_RUN_ID = "async_tracker.run_id"
TAG_RUN_KEY = "async_tracker.run_key"
TAG_ARTIFACT_PREFIX = "async_tracker.artifact."
TAG_SOURCE_PREFIX = "async_tracker.source."
TAG_PARENT_PREFIX = "async_tracker.parent."
# One per process writing to the run, removed when it ends the run (see runs.py).
TAG_WRITER_PREFIX = "async_tracker.writer."
# A live run's heartbeat: {"time": seconds since the epoch, "interval_s": ..}.
TAG_HEARTBEAT = "async_tracker.heartbeat"
# Each writer's summary of what it wrote to the run (see summaries.py): one tag per writer
# token, ``async_tracker.summary.<token>``, and ``.<n>`` parts for one that is too long.
TAG_SUMMARY_PREFIX = "async_tracker.summary."
# Set when the run is created (with its other tags: no request of its own): every writer of
# this version keeps a summary of the run, so that a run without it (made by an older
# version, torchx or plain MLflow) is known to hold points no summary counts.
TAG_SUMMARIES = "async_tracker.summaries"
MLFLOW_TAG_PREFIX = "mlflow."
# MLflow's own tag of a run's description (mlflow.utils.mlflow_tags.MLFLOW_RUN_NOTE): where
# the run's note goes, so that the UI shows it, and an edit there is the note read back.
MLFLOW_NOTE_TAG = "mlflow.note.content"
RESERVED_TAG_PREFIXES = (TAG_PREFIX, MLFLOW_TAG_PREFIX)

_KEY_RE = re.compile(r"^[/\w.\- :]*$" if os.name != "nt" else r"^[/\w.\- ]*$")
# Characters an uploaded artifact's name cannot hold: MLflow refuses '#' in artifact paths,
# and '?' and '%' do not survive the artifact URIs it builds from them (downloads fail).
_ARTIFACT_PATH_BAD_CHARS = frozenset("#?%\\\x00")


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def run_key(run_id: str) -> str:
    """The value of the ``async_tracker.run_key`` tag: safe in a search filter whatever the
    run id holds (quotes, backticks ...)."""
    return sha1(run_id)


def artifact_tag(name: str) -> str:
    return TAG_ARTIFACT_PREFIX + sha1(name)


def source_tag(source_id: str, artifact_name: str | None) -> str:
    return TAG_SOURCE_PREFIX + sha1(json.dumps([source_id, artifact_name]))


def parent_tag(source_id: str) -> str:
    return TAG_PARENT_PREFIX + sha1(source_id)


def dumps(value: object) -> str:
    # Compact, and NaN/Infinity kept (Python's json reads them back).
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def loads_tag(value: str) -> object:
    """A metadata tag value: JSON when we wrote it; a tag set by someone else (the MLflow UI,
    torchx's own tracker) that is not JSON comes back as the string it is."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def artifact_value(art: TrackerArtifact) -> str:
    return dumps({"name": art.name, "path": art.path, "metadata": art.metadata})


def source_value(src: TrackerSource, written_at: float) -> str:
    return dumps(
        {"source_run_id": src.source_run_id, "artifact_name": src.artifact_name, "t": written_at}
    )


def decode_object(key: str, value: str) -> dict[str, Any] | None:
    """One of our JSON object tags, or None (with a warning) for anything else."""
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        logger.warning("async_tracker: skipping MLflow tag %r: not what we wrote", key)
        return None
    return data


def from_stored(value: float) -> float:
    if value == FLOAT_MAX:
        return float("inf")
    if value == -FLOAT_MAX:
        return float("-inf")
    return float(value)


def local_path(path: str) -> str | None:
    """The local filesystem path an artifact's ``path`` names (``/x``, ``x``, ``file:///x``),
    or None for a URI of another scheme (``s3://``, ``https://``, ``runs:/`` ...): those are
    recorded, never fetched. A one-letter scheme is a Windows drive."""
    parts = urllib.parse.urlsplit(path)
    if parts.scheme == "file":
        return urllib.request.url2pathname(parts.path)
    if len(parts.scheme) > 1:
        return None
    return path


# -- params --------------------------------------------------------------------------------------
def _is_primitive(value: object) -> bool:
    return isinstance(value, (str, int, float, bool))


def flatten_params(cfg: object, key: str = "") -> dict[str, str]:
    """torchx's ``log_params_flat`` flattening, as ``{param key: value}``.

    Dataclasses and mappings recurse with ``parent.child`` keys; a sequence (or set) of
    primitives is one param (``"['a', 'b']"``), a sequence of anything else recurses per
    element with ``parent._<index>``; empty containers and ``None`` are logged as they print;
    other objects as ``str()``. Keys and values are checked against MLflow's limits here, so a
    bad one raises ``ValueError`` naming it before anything is sent.

    >>> flatten_params({"lr": 0.1, "layers": [{"n": 2}], "tags": ["a", "b"]})
    {'lr': '0.1', 'layers._0.n': '2', 'tags': "['a', 'b']"}
    """
    out: dict[str, str] = {}
    _flatten(cfg, key, out)
    return out


def _flatten(cfg: object, key: str, out: dict[str, str]) -> None:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    prefix = f"{key}." if key else ""
    if isinstance(cfg, Mapping) and cfg:
        for k, v in cfg.items():
            _flatten(v, f"{prefix}{k}", out)
    elif isinstance(cfg, (Sequence, set, frozenset)) and not isinstance(cfg, (str, bytes)) and cfg:
        if _is_primitive(next(iter(cfg))):
            _put_param(out, key, cfg)
        else:
            for i, elem in enumerate(cfg):
                _flatten(elem, f"{prefix}_{i}", out)
    else:
        _put_param(out, key, cfg)


def _put_param(out: dict[str, str], key: str, value: object) -> None:
    if not key:
        raise ValueError(f"log_params_flat: a bare value ({value!r}) needs a key")
    text = str(value)
    problem = param_problem(key, text)
    if problem:
        raise ValueError(problem)
    if key in out and out[key] != text:
        raise ValueError(f"param {key!r}: two values flatten to this key ({out[key]!r}, {text!r})")
    out[key] = text


# -- what MLflow refuses -------------------------------------------------------------------------
def key_problem(key: str, what: str) -> str | None:
    """Why MLflow would refuse ``key`` as a tag, metric or param name, or None."""
    if len(key) > MAX_KEY_LENGTH:
        return f"{what} {key[:40]!r}... is {len(key)} characters; MLflow allows {MAX_KEY_LENGTH}"
    if not _KEY_RE.match(key):
        return (
            f"{what} {key!r}: MLflow names may only hold letters, digits, '_', '-', '.', ' ', "
            "':' and '/'"
        )
    norm = posixpath.normpath(key)
    if norm != key or norm == "." or norm.startswith("..") or norm.startswith("/"):
        return f"{what} {key!r}: MLflow refuses names that resolve to another path ({norm!r})"
    return None


def value_problem(key: str, value: str, limit: int, what: str) -> str | None:
    if len(value) > limit:
        return (
            f"{what} {key!r}: its value is {len(value)} characters once encoded; "
            f"MLflow allows {limit}"
        )
    return None


def param_problem(key: str, value: str) -> str | None:
    return key_problem(key, "param") or value_problem(key, value, MAX_PARAM_VALUE_LENGTH, "param")


def mlflow_tag(key: str, value: object) -> tuple[str, str]:
    """The MLflow tag of metadata ``key = value``: ``key = json(value)``, but the note's
    text as MLflow's description tag."""
    if key == NOTE_KEY:
        return MLFLOW_NOTE_TAG, str(value)
    return key, dumps(value)


def tag_problem(key: str, value: object) -> str | None:
    """Why MLflow would refuse metadata ``key = value`` as a tag, or None. Of the reserved
    keys, those of tags (a bool), of the note (a str) and of a run's ending (how a run that
    did not finish ended, a tag like any metadata) are taken (see :mod:`async_tracker.tags`)."""
    if key.startswith(TAG_KEY_PREFIX) and isinstance(value, bool):
        try:
            check_tag(key[len(TAG_KEY_PREFIX) :])
        except ValueError as exc:
            return str(exc)
        return key_problem(key, "tag")
    if key == NOTE_KEY and isinstance(value, str):
        if len(value) > MAX_TAG_VALUE_LENGTH:
            return (
                f"the note is {len(value)} characters; MLflow allows {MAX_TAG_VALUE_LENGTH} "
                "(save longer text as an artifact)"
            )
        return None
    if key == ENDING_KEY:
        return value_problem(key, dumps(value), MAX_TAG_VALUE_LENGTH, "metadata")
    if key.startswith(RESERVED_TAG_PREFIXES):
        return (
            f"metadata key {key!r}: keys starting with {TAG_PREFIX!r} or "
            f"{MLFLOW_TAG_PREFIX!r} are reserved"
        )
    return key_problem(key, "metadata key") or value_problem(
        key, dumps(value), MAX_TAG_VALUE_LENGTH, "metadata"
    )


def params_problem(key: str, value: object) -> str | None:
    """Why the params of metadata ``key = value`` (its first write) would be refused."""
    try:
        flatten_params(value, key)
    except ValueError as exc:
        return f"metadata {key!r} as MLflow params: {exc}"
    return None


def metadata_problems(metadata: Mapping[str, object], params: bool = True) -> list[str]:
    """Why MLflow would refuse any of these metadata entries (empty list: none): as a tag,
    and, with ``params``, as the params its first write becomes."""
    problems = []
    for key, value in metadata.items():
        problem = tag_problem(key, value)
        if problem is None and params and not is_reserved_key(key):
            problem = params_problem(key, value)
        if problem:
            problems.append(problem)
    return problems


def artifact_path_problem(name: str) -> str | None:
    """Why an artifact named ``name`` could not be uploaded to ``<name>/`` of the run's
    artifacts, or None."""
    norm = posixpath.normpath(name)
    if (
        norm != name
        or name in (".", "..")
        or name.startswith(("/", "../"))
        or _ARTIFACT_PATH_BAD_CHARS.intersection(name)
    ):
        return (
            f"artifact {name!r}: a local file is uploaded to the artifact path named after "
            "the artifact, which must be a normalised relative path without '..', '#', '?', "
            "'%' or '\\' (or give a URI such as s3://... to record it without upload)"
        )
    return None


def artifact_problems(art: TrackerArtifact) -> list[str]:
    problems = []
    problem = value_problem(art.name, artifact_value(art), MAX_TAG_VALUE_LENGTH, "artifact")
    if problem:
        problems.append(problem)
    if local_path(art.path) is not None and (problem := artifact_path_problem(art.name)):
        problems.append(problem)
    return problems


def source_problems(src: TrackerSource) -> list[str]:
    problem = value_problem(
        src.source_run_id, source_value(src, 0.0), MAX_TAG_VALUE_LENGTH, "source"
    )
    return [problem] if problem else []


def metric_problem(metric: TrackerMetric) -> str | None:
    problem = key_problem(metric.name, "metric name")
    if problem is None and not INT64_MIN <= metric.step <= INT64_MAX:
        problem = f"metric {metric.name!r}: step {metric.step} does not fit in 64 bits"
    return problem


def raise_problems(problems: Sequence[str]) -> None:
    if problems:
        raise ValueError("; ".join(problems))
