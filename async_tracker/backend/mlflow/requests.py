"""One flush as ``log_batch`` requests, each within MLflow's per-request limits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

# MLflow's limits on one log_batch request (mlflow.utils.validation; the server enforces them).
MAX_METRICS_PER_REQUEST = 1000
MAX_TAGS_PER_REQUEST = 100
MAX_PARAMS_PER_REQUEST = 100
MAX_ITEMS_PER_REQUEST = 1000
MAX_REQUEST_BYTES = 1_000_000
# What we allow ourselves per request: the client pretty-prints its JSON, so leave room for
# indentation and field names beyond the sizes we count.
REQUEST_BYTES_BUDGET = 800_000
_METRIC_OVERHEAD_BYTES = 160
# The most entries (its tags included) of the request that carries the last tags of a plan:
# it is sent alone, once the others are stored, so the server idles while the client encodes
# it (MLflow's client takes about 20 ms of CPU per 1,000 metrics) and the next flush waits
# while the server stores it. Kept small, it costs the flush a round trip, not a request's time.
LAST_REQUEST_MAX_ITEMS = 100
_ENTRY_OVERHEAD_BYTES = 60

MetricEntry = tuple[str, float, int, int]
"""A metric point as sent: key, value, timestamp in ms, step."""


@dataclass
class Request:
    """One log_batch call: within MLflow's per-request limits."""

    tags: list[tuple[str, str]] = field(default_factory=list)
    params: list[tuple[str, str]] = field(default_factory=list)
    metrics: list[MetricEntry] = field(default_factory=list)
    size: int = 0

    @property
    def items(self) -> int:
        return len(self.tags) + len(self.params) + len(self.metrics)


def _entry_size(key: str, value: str) -> int:
    # json.dumps with ensure_ascii, as the client sends it: escapes count.
    return len(json.dumps(key)) + len(json.dumps(value)) + _ENTRY_OVERHEAD_BYTES


def plan_requests(
    tags: Sequence[tuple[str, str]] = (),
    metrics: Sequence[MetricEntry] = (),
    params: Sequence[tuple[str, str]] = (),
    last_tags: Sequence[tuple[str, str]] = (),
) -> list[Request]:
    """Cuts tags, params and metrics into log_batch requests within MLflow's limits (1000
    metrics, 100 params, 100 tags, 1000 items, 1 MB). Deterministic: a retry of the same batch
    makes the same requests, so the parts already stored can be skipped by index.

    ``last_tags`` (at most 100) all go in the last request, the one sent after the others
    (a writer's summary, which must not count points before they are stored), which holds at
    most :data:`LAST_REQUEST_MAX_ITEMS` entries: room is made there by moving entries from
    its front into a request of their own before it, which costs a request only when the
    last one held more."""
    requests: list[Request] = []
    current = Request()

    def room(kind: str, size: int) -> bool:
        if current.items >= MAX_ITEMS_PER_REQUEST or current.size + size > REQUEST_BYTES_BUDGET:
            return False
        if kind == "tag":
            return len(current.tags) < MAX_TAGS_PER_REQUEST
        if kind == "param":
            return len(current.params) < MAX_PARAMS_PER_REQUEST
        return len(current.metrics) < MAX_METRICS_PER_REQUEST

    def add(kind: str, size: int) -> Request:
        nonlocal current
        if current.items and not room(kind, size):
            requests.append(current)
            current = Request()
        current.size += size
        return current

    for key, value in tags:
        add("tag", _entry_size(key, value)).tags.append((key, value))
    for key, value in params:
        add("param", _entry_size(key, value)).params.append((key, value))
    # A flush holds a few metric names many times over: each name's size is counted once.
    names = {m[0] for m in metrics}
    sizes = {name: len(json.dumps(name)) + _METRIC_OVERHEAD_BYTES for name in names}
    i, n = 0, len(metrics)
    while i < n:
        # As many points as the request's counts allow, at once when their bytes fit too:
        # the same requests as adding them one by one (each limit only fills up), at a
        # tenth of the cost, which the server waits for at the start of each flush.
        take = min(
            MAX_ITEMS_PER_REQUEST - current.items,
            MAX_METRICS_PER_REQUEST - len(current.metrics),
            n - i,
        )
        chunk = metrics[i : i + take]
        size = sum([sizes[m[0]] for m in chunk])
        if take > 0 and current.size + size <= REQUEST_BYTES_BUDGET:
            current.metrics.extend(chunk)
            current.size += size
            i += take
            continue
        add("metric", sizes[metrics[i][0]]).metrics.append(metrics[i])
        i += 1
    if current.items:
        requests.append(current)
    if last_tags:
        requests[-1:] = with_last_tags(
            requests[-1] if requests else None, last_tags, alone=len(requests) <= 1
        )
    return requests


def with_last_tags(
    last: Request | None, tags: Sequence[tuple[str, str]], *, alone: bool = False
) -> list[Request]:
    """The requests that replace ``last``, the last request of a plan, when ``tags`` go in it
    (see :func:`plan_requests`): ``last`` with ``tags`` added, after a request of the entries
    moved out of it to make room, if any. ``last`` itself is left as it was. ``alone``: it
    is the plan's only request, which stays whole when the tags fit in it (nothing is sent
    beside it anyway: splitting it would only add a round trip).

    The requests before ``last`` are the same with or without ``tags``: a flush can send
    them before its ``tags`` are known (see ``AsyncMLflowTracker._send_counted``)."""
    sizes = [_entry_size(k, v) for k, v in tags]
    size = sum(sizes)
    if len(tags) > MAX_TAGS_PER_REQUEST or size > REQUEST_BYTES_BUDGET:
        raise ValueError(f"{len(tags)} tags of {size} bytes cannot go in one request")
    if last is None:
        last = Request()
    else:
        last = Request(list(last.tags), list(last.params), list(last.metrics), last.size)
    moved = Request()

    def fits(most_items: int) -> bool:
        return (
            last.items + len(tags) <= most_items
            and len(last.tags) + len(tags) <= MAX_TAGS_PER_REQUEST
            and last.size + size <= REQUEST_BYTES_BUDGET
        )

    # Entries leave the front of the last request for one sent just before it, until the
    # tags fit: tags when there are too many tags, else metrics first (the most items), then
    # params, then tags. Entries of each kind keep their order across the requests, and the
    # moved ones make a request that is a part of a valid one.
    most_items = max(LAST_REQUEST_MAX_ITEMS, len(tags))
    if alone and fits(MAX_ITEMS_PER_REQUEST):
        most_items = MAX_ITEMS_PER_REQUEST
    while not fits(most_items):
        too_many_tags = len(last.tags) + len(tags) > MAX_TAGS_PER_REQUEST
        if not too_many_tags and last.metrics:
            entry = last.metrics.pop(0)
            moved.metrics.append(entry)
            cost = len(json.dumps(entry[0])) + _METRIC_OVERHEAD_BYTES
        elif not too_many_tags and last.params:
            param = last.params.pop(0)
            moved.params.append(param)
            cost = _entry_size(*param)
        else:
            tag = last.tags.pop(0)
            moved.tags.append(tag)
            cost = _entry_size(*tag)
        last.size -= cost
        moved.size += cost
    last.tags.extend(tags)
    last.size += size
    return [moved, last] if moved.items else [last]
