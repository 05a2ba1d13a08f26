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
) -> list[Request]:
    """Cuts tags, params and metrics into log_batch requests within MLflow's limits (1000
    metrics, 100 params, 100 tags, 1000 items, 1 MB). Deterministic: a retry of the same batch
    makes the same requests, so the parts already stored can be skipped by index."""
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
    for metric in metrics:
        add("metric", len(json.dumps(metric[0])) + _METRIC_OVERHEAD_BYTES).metrics.append(metric)
    if current.items:
        requests.append(current)
    return requests
