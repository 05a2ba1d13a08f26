"""The dashboard's ASGI app: a page, its static files, and a small read-only JSON API.

Endpoints (every answer is JSON; an error is ``{"error": "one line"}`` with its status)::

    GET /                      the page (static/index.html)
    GET /static/...            its scripts, styles and the vendored chart library
    GET /api/runs              the run list: ?cursor=N&filter=EXPR&sort=[-]KEY&search=TEXT
                               -> {version, runs: [every run changed after cursor, shown or
                                  not], ids: [those shown, in order], differ: [params that
                                  differ], total, store}
    GET /api/runs/{id}         one run: its summary, params, tags, note, artifacts, lineage
                               and live writers (heartbeats, delivery state)
    GET /api/series            curves: ?run=ID (repeated) &metric=NAME (repeated; all
                               without) &x=step|time &width=PIXELS &xmin=X &xmax=X
                               -> {series: [{run, metric, count, x, y}], max_points}

Errors: an unknown run is 404, a filter that does not parse 400 with the parser's one-line
message (where it went wrong, what was expected), a bad parameter 400, a store that cannot
be read 503 naming the store and why. Never a traceback page, and never the store's absolute
path (the store is named by its last part).

Limits (one request must not cost the server much, whoever sends it: a page of another site
can): a query string of at most ``MAX_QUERY_BYTES``; ``/api/series`` takes each run and
metric once (repeats are dropped), at most ``MAX_SERIES_RUNS`` runs, and answers at most
``MAX_SERIES_POINTS`` points (series times the points of the width: checked before reading);
past a limit, 400 naming it. The guard in front of it all (Host, token, headers) is
:mod:`async_tracker.ui.guard`.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from async_tracker.errors import BackendError, ReadTimeoutError
from async_tracker.store.downsample import (
    DEFAULT_WIDTH,
    clamp_width,
    max_points,
    min_max,
    window,
)
from async_tracker.store.expr import FilterError
from async_tracker.store.summary import MetricSummary, RunSummary
from async_tracker.ui.guard import Access, Guard
from async_tracker.ui.live import LiveStore, UnknownRunError

STATIC_DIR = Path(__file__).resolve().parent / "static"

# The limits of one request (see the module's text).
MAX_QUERY_BYTES = 16_384
MAX_SERIES_RUNS = 200
MAX_SERIES_POINTS = 2_000_000


class BadRequestError(ValueError):
    """A request parameter the API cannot take (400)."""


def json_response(data: object, status: int = 200) -> Response:
    """JSON by orjson (numpy arrays directly; NaN and infinities become null)."""
    try:
        body = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        # A value orjson does not take (an int over 64 bits in a param, say): as text.
        text = json.dumps(data, default=str)
        body = orjson.dumps(json.loads(text, parse_constant=lambda _: None))
    return Response(body, status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


Endpoint = Callable[[LiveStore, Request], object]


def store_name(label: str) -> str:
    """How answers name the store: ``label`` (``store /home/me/runs``, ``store
    s3://bucket/runs``) with a local path cut to its last part (``store runs``), so that no
    answer shows where the store lies on disk."""
    kind, _, where = label.partition(" ")
    if not where.startswith("/") and not where.startswith("file://"):
        return label
    last = PurePosixPath(where.removeprefix("file://").rstrip("/")).name or "/"
    return f"{kind} {last}"


def _scrub(message: str, live: LiveStore) -> str:
    """``message`` with the store's absolute path replaced by its name (errors of the
    filesystem name the files they failed on)."""
    where = live.label.partition(" ")[2].removeprefix("file://").rstrip("/")
    if not where or "://" in where:
        return message  # not a local path (an object store, a tracker)
    name = PurePosixPath(where).name or "/"
    # The longest first: the absolute path holds the relative one the user gave.
    for root in sorted({os.path.abspath(where), where}, key=len, reverse=True):
        if root.startswith("/"):
            message = message.replace(f"file://{root}", name).replace(root, name)
    return message


def _api(live: LiveStore, endpoint: Endpoint) -> Callable[[Request], Response]:
    """A plain (blocking) endpoint: Starlette runs it in a worker thread. Its errors become
    one-line JSON answers here, at one boundary, without the store's absolute path."""

    @functools.wraps(endpoint)
    def handle(request: Request) -> Response:
        try:
            if len(request.scope.get("query_string", b"")) > MAX_QUERY_BYTES:
                raise BadRequestError(
                    f"the query is longer than the limit of {MAX_QUERY_BYTES} bytes"
                )
            answer = endpoint(live, request)
            return answer if isinstance(answer, Response) else json_response(answer)
        except UnknownRunError as exc:
            return _error(404, _scrub(str(exc), live))
        except FilterError as exc:
            # Its first line says where and what was expected; the rest repeats the text.
            return _error(400, str(exc).splitlines()[0])
        except BadRequestError as exc:
            return _error(400, str(exc))
        except ReadTimeoutError as exc:
            return _error(503, _scrub(str(exc), live))
        except (BackendError, OSError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            return _error(503, _scrub(f"cannot read the {live.label}: {reason[:300]}", live))
        except Exception as exc:  # a bug of ours: still one line, never a traceback page
            return _error(500, _scrub(f"internal error: {type(exc).__name__}: {exc}", live))

    return handle


def run_json(run: RunSummary) -> dict[str, Any]:
    """A run summary as the page reads it. ``cause``: what ended a run that failed or was
    killed, when known (``ValueError: bad lr``, ``SIGTERM``), else ""."""
    return {
        "id": run.run_id,
        "status": run.status,
        # Looked up for those runs alone: a listed run's ending is read when looked at.
        "cause": run.cause if run.status in ("failed", "killed") else "",
        "start": run.start,
        "end": run.end,
        "heartbeat": run.heartbeat,
        "duration": run.duration_s,
        "params": dict(run.params),
        "tags": sorted(run.tags),
        "note": run.note,
        "metrics": {name: _metric_json(m) for name, m in run.metrics.items()},
    }


def _metric_json(m: MetricSummary) -> dict[str, Any]:
    return {"last": _num(m.last), "min": _num(m.min), "max": _num(m.max), "count": m.count,
            "step": m.last_step}  # fmt: skip


def _num(value: float | None) -> float | str | None:
    """JSON has no NaN or infinities: text, so that the page shows them as they are."""
    if value is None or math.isfinite(value):
        return value
    return repr(value)


def _runs(live: LiveStore, request: Request) -> object:
    """The run list. Its answer for one URL is a function of the store's version alone: it
    carries that version as its ETag, and a client that has it (the page polls with
    ``Cache-Control: no-cache``, so the browser revalidates) gets 304 and no body while
    nothing changed, before any filtering or encoding: an idle tab costs the server one look
    at the store per ``refresh_s``."""
    q = request.query_params
    etag = _etag(live, live.refresh())
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": "no-cache"})
    changes = live.changes(
        cursor=_int(q.get("cursor", "0"), "cursor"),
        filter=q.get("filter", ""),
        sort=q.get("sort", ""),
        search=q.get("search", "").strip(),
    )
    response = json_response({
        "version": changes.version,
        "runs": [run_json(r) for r in changes.runs],
        "ids": changes.ids,
        "differ": changes.differ,
        "total": changes.total,
        "store": store_name(live.label),
        "server": live.instance,  # another server (a restart): the page's cursor is void
    })  # fmt: skip
    response.headers["ETag"] = _etag(live, changes.version)
    response.headers["Cache-Control"] = "no-cache"
    return response


def _etag(live: LiveStore, version: int) -> str:
    # The server's own mark beside the version: another server (a restart) counts anew.
    return f'"{live.instance}-{version}"'


def _run(live: LiveStore, request: Request) -> object:
    run_id = request.path_params["run_id"]
    summary = live.summary(run_id)
    return {"run": run_json(summary), **live.detail(run_id)}


def _series(live: LiveStore, request: Request) -> object:
    q = request.query_params
    runs = list(dict.fromkeys(q.getlist("run")))  # each once, in order
    if not runs:
        raise BadRequestError("give at least one run: ?run=ID")
    if len(runs) > MAX_SERIES_RUNS:
        raise BadRequestError(
            f"{len(runs)} runs asked for: the limit is {MAX_SERIES_RUNS} runs a request"
        )
    metrics = list(dict.fromkeys(q.getlist("metric"))) or None
    axis = q.get("x", "step")
    if axis not in ("step", "time"):
        raise BadRequestError(f"x must be step or time, got {axis!r}")
    width = clamp_width(_int(q.get("width", str(DEFAULT_WIDTH)), "width"))
    xmin, xmax = _float(q.get("xmin"), "xmin"), _float(q.get("xmax"), "xmax")
    # The most the answer can hold, from the summaries, before any point is read.
    count = sum(
        len(metrics) if metrics is not None else len(live.summary(r).metrics) for r in runs
    )
    if count * max_points(width) > MAX_SERIES_POINTS:
        raise BadRequestError(
            f"{count} series of up to {max_points(width)} points asked for: the limit is "
            f"{MAX_SERIES_POINTS:,} points a request (fewer runs or metrics, or a smaller width)"
        )
    series = []
    for run_id in runs:
        whole = xmin is None and xmax is None
        for name, (x, y, count) in live.series(run_id, metrics, axis, whole=whole).items():
            part = window(x, xmin, xmax)
            x, y = x[part], y[part]
            keep = min_max(x, y, width)
            series.append(
                {"run": run_id, "metric": name, "count": count, "shown": len(keep),
                 "x": x[keep], "y": y[keep]}
            )  # fmt: skip
    return {"series": series, "max_points": max_points(width)}


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadRequestError(f"{name} must be an integer, got {text!r}") from None


def _float(text: str | None, name: str) -> float | None:
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise BadRequestError(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise BadRequestError(f"{name} must be a finite number, got {text!r}")
    return value


def _index(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def create_app(live: LiveStore, access: Access | None = None) -> Starlette:
    """The dashboard over ``live`` (one :class:`~async_tracker.ui.live.LiveStore`), behind
    the guard of ``access`` (default: loopback names and IP literals, no token)."""
    routes = [
        Route("/", _index),
        Route("/api/runs", _api(live, _runs)),
        Route("/api/runs/{run_id:path}", _api(live, _run)),
        Route("/api/series", _api(live, _series)),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    guard = Middleware(Guard, access=access if access is not None else Access())
    # Compressed answers: the run list and the curves are JSON of numbers, a fifth of the
    # bytes gzipped. Inside the guard: a refused request costs no compression.
    gzip = Middleware(GZipMiddleware, minimum_size=1024, compresslevel=5)
    return Starlette(routes=routes, middleware=[guard, gzip])


__all__ = [
    "MAX_QUERY_BYTES",
    "MAX_SERIES_POINTS",
    "MAX_SERIES_RUNS",
    "STATIC_DIR",
    "BadRequestError",
    "create_app",
    "json_response",
    "run_json",
    "store_name",
]
