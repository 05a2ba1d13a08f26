"""The dashboard's JSON API through Starlette's test client (httpx over ASGI), on stores
written by real runs: each endpoint, live changes after a cursor, and bad input."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("numpy")
pytest.importorskip("httpx2")  # what starlette.testclient needs

from starlette.testclient import TestClient

import async_tracker
from async_tracker.adapters import as_sync
from async_tracker.init_run import open_store
from async_tracker.runtime.process import runtime
from async_tracker.store.downsample import max_points
from async_tracker.store.open import open_reader
from async_tracker.ui.app import create_app
from async_tracker.ui.live import LiveStore
from tests.core.helpers import Child
from tests.faulty import FaultyTracker, backend_down
from tests.ui.conftest import CONFIGS, STEPS, local_client, loss, start_live

pytestmark = pytest.mark.server


def client_for(root: Path, refresh_s: float = 0.0) -> tuple[TestClient, LiveStore]:
    live = LiveStore(open_reader(root), refresh_s=refresh_s)
    return local_client(create_app(live)), live


def ok(response: Any) -> Any:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def test_runs_lists_every_run_with_status_params_tags_and_last_values(store: Path) -> None:
    client, _ = client_for(store)
    data = ok(client.get("/api/runs"))
    assert data["total"] == 3 and data["version"] >= 1
    assert sorted(data["ids"]) == [c[0] for c in CONFIGS]
    runs = {r["id"]: r for r in data["runs"]}
    a = runs["base/a"]
    assert a["status"] == "finished" and a["end"] >= a["start"] > 0
    assert a["params"] == {"project": "base", "lr": 0.1, "batch_size": 32, "model": "mlp"}
    assert a["tags"] == ["baseline"]
    assert a["metrics"]["loss"]["count"] == STEPS
    assert a["metrics"]["loss"]["step"] == STEPS - 1
    assert a["metrics"]["loss"]["last"] == pytest.approx(loss(0.1, STEPS - 1))
    # The params that tell the listed runs apart; model and project are the same in all.
    assert sorted(data["differ"]) == ["batch_size", "lr"]


def test_filter_sort_and_search_narrow_and_order_the_runs(store: Path) -> None:
    client, _ = client_for(store)
    # Newest first by default.
    assert ok(client.get("/api/runs", params={"filter": "lr<0.05"}))["ids"] == ["base/c", "base/b"]
    assert ok(client.get("/api/runs", params={"filter": "tag:baseline"}))["ids"] == ["base/a"]
    by_lr = ok(client.get("/api/runs", params={"sort": "params.`lr`"}))["ids"]
    assert by_lr == ["base/c", "base/b", "base/a"]
    by_loss = ok(client.get("/api/runs", params={"sort": "-`loss`.last"}))["ids"]
    assert by_loss == ["base/c", "base/b", "base/a"]
    assert ok(client.get("/api/runs", params={"search": "BATCH_SIZE=64"}))["ids"] == ["base/c"]


def test_a_filter_that_does_not_parse_is_400_with_the_parsers_message(store: Path) -> None:
    client, _ = client_for(store)
    response = client.get("/api/runs", params={"filter": "lr>"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "\n" not in error
    assert "column 4" in error and "expected a value" in error
    response = client.get("/api/runs", params={"filter": "loss.median<1"})
    assert response.status_code == 400 and "last" in response.json()["error"]


def test_the_cursor_returns_only_the_runs_changed_after_it(tmp_path: Path, store: Path) -> None:
    client, live = client_for(store)
    first = ok(client.get("/api/runs"))
    again = ok(client.get("/api/runs", params={"cursor": first["version"]}))
    assert again["runs"] == [] and again["version"] == first["version"]
    assert sorted(again["ids"]) == sorted(first["ids"])  # still all listed, none sent again
    job = start_live(store, tmp_path / "spool-live", "live/1")
    try:
        after = ok(client.get("/api/runs", params={"cursor": first["version"]}))
        assert [r["id"] for r in after["runs"]] == ["live/1"]
        assert after["runs"][0]["status"] == "running"
        job.proc.stdin.write(b"log\n")  # type: ignore[union-attr]
        job.proc.stdin.flush()  # type: ignore[union-attr]
        assert job.readline(60) == "logged 11"
        last = ok(client.get("/api/runs", params={"cursor": after["version"]}))
        assert [r["id"] for r in last["runs"]] == ["live/1"]
        assert last["runs"][0]["metrics"]["loss"]["count"] == 11
    finally:
        job.proc.stdin.close()  # type: ignore[union-attr]
        assert job.wait(60) == 0
    assert live.reads >= 3


def test_unchanged_summary_files_are_not_read_again(store: Path) -> None:
    _, live = client_for(store)
    live.refresh(force=True)
    cache: Any = live.reader.reader._cache  # type: ignore[attr-defined]  # the fsspec reader's
    first = cache.reads
    assert first >= 3
    live.refresh(force=True)
    assert cache.reads == first  # nothing changed: no summary file read again


def test_run_detail_has_params_artifacts_lineage_and_the_summary(store: Path) -> None:
    client, _ = client_for(store)
    data = ok(client.get("/api/runs/base/b"))
    assert data["run"]["id"] == "base/b" and data["run"]["status"] == "finished"
    assert data["params"]["lr"] == 0.01
    assert data["artifacts"] == [
        {"name": "model", "path": "/models/base/b.pt", "metadata": {"format": "torch"}}
    ]
    assert data["parents"] == [] and data["children"] == []
    assert data["writers"] == []  # ended: no live writer


def test_a_live_writer_reports_its_delivery_state(tmp_path: Path, store: Path) -> None:
    client, _ = client_for(store)
    job = start_live(store, tmp_path / "spool-live", "live/2", heartbeat_s=0.2)
    try:
        def writers() -> list[Any]:
            data = ok(client.get("/api/runs/live/2"))
            return [w for w in data["writers"] if "delivery" in w]

        from tests.core.helpers import wait_until

        wait_until(lambda: bool(writers()), "a heartbeat with the delivery state", 60)
        (writer,) = writers()
        delivery = writer["delivery"]
        assert writer["interval_s"] == 0.2
        assert delivery["spooled"] == 0 and delivery["last_error"] is None
        assert delivery["healthy"] is True and delivery["lag_s"] >= 0
    finally:
        job.proc.stdin.close()  # type: ignore[union-attr]
        assert job.wait(60) == 0


def test_series_returns_every_point_of_a_small_curve(store: Path) -> None:
    client, _ = client_for(store)
    data = ok(client.get("/api/series", params={"run": ["base/a", "base/c"], "metric": "loss"}))
    assert [(s["run"], s["metric"]) for s in data["series"]] == [
        ("base/a", "loss"), ("base/c", "loss")
    ]
    a = data["series"][0]
    assert a["count"] == STEPS and a["x"] == list(range(STEPS))
    assert a["y"] == pytest.approx([loss(0.1, s) for s in range(STEPS)])
    both = ok(client.get("/api/series", params={"run": "base/a"}))["series"]
    assert sorted(s["metric"] for s in both) == ["acc", "loss", "system/cpu_percent"]
    timed = ok(client.get("/api/series", params={"run": "base/a", "metric": "loss", "x": "time"}))
    xs = timed["series"][0]["x"]
    assert xs == sorted(xs) and xs[0] > 1e9  # seconds since the epoch


def test_series_are_downsampled_to_the_width_keeping_the_extremes(store: Path) -> None:
    client, _ = client_for(store)
    data = ok(client.get("/api/series", params={"run": "base/a", "metric": "loss", "width": 10}))
    (s,) = data["series"]
    assert data["max_points"] == max_points(10) == 22
    assert s["count"] == STEPS and len(s["x"]) <= 22 and len(s["x"]) == s["shown"]
    full = [loss(0.1, step) for step in range(STEPS)]
    assert s["x"][0] == 0 and s["x"][-1] == STEPS - 1
    assert max(s["y"]) == pytest.approx(max(full)) and min(s["y"]) == pytest.approx(min(full))
    window = {"run": "base/a", "metric": "loss", "xmin": 50, "xmax": 60}
    zoomed = ok(client.get("/api/series", params=window))["series"][0]
    assert zoomed["x"] == list(range(49, 62))  # the window and a point on each side


def test_unknown_runs_are_404_with_a_clear_message(store: Path) -> None:
    client, _ = client_for(store)
    for path in ("/api/runs/nope", "/api/series?run=nope"):
        response = client.get(path)
        assert response.status_code == 404
        # The store named by its last part: no answer shows where it lies on disk.
        assert response.json() == {"error": f"no run 'nope' in the store {store.name}"}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "give at least one run"),
        ("run=base/a&x=epoch", "x must be step or time, got 'epoch'"),
        ("run=base/a&width=wide", "width must be an integer, got 'wide'"),
        ("run=base/a&xmin=nan", "xmin must be a finite number"),
    ],
)
def test_bad_series_parameters_are_400(store: Path, query: str, message: str) -> None:
    client, _ = client_for(store)
    response = client.get(f"/api/series?{query}")
    assert response.status_code == 400 and message in response.json()["error"]


def test_a_store_that_cannot_be_read_is_503_naming_it() -> None:
    tracker = as_sync(FaultyTracker().always("run_ids", action=backend_down("disk on fire")))
    client = local_client(create_app(LiveStore(open_reader(tracker, label="store s3://gone"))))
    response = client.get("/api/runs")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error.startswith("cannot read the store s3://gone: ") and "disk on fire" in error
    assert "Traceback" not in response.text


def test_the_page_and_its_static_files_are_served(store: Path) -> None:
    client, _ = client_for(store)
    page = client.get("/")
    assert page.status_code == 200 and "<title>async-tracker</title>" in page.text
    for path in ("/static/app.js", "/static/app.css", "/static/vendor/uPlot.iife.min.js",
                 "/static/vendor/uPlot.min.css"):  # fmt: skip
        assert client.get(path).status_code == 200, path
    assert "http://" not in page.text.replace("http://www.w3.org", "")  # nothing remote


def test_points_of_a_live_run_are_read_incrementally(tmp_path: Path, store: Path) -> None:
    client, live = client_for(store)
    job: Child = start_live(store, tmp_path / "spool-live", "live/3")
    try:
        query = {"run": "live/3", "metric": "loss"}
        first = ok(client.get("/api/series", params=query))["series"][0]
        assert first["count"] == 10
        points = live._points["live/3"]
        read_before = points.cursor.consumed  # the fsspec reader's: the files read so far
        job.proc.stdin.write(b"log\n")  # type: ignore[union-attr]
        job.proc.stdin.flush()  # type: ignore[union-attr]
        assert job.readline(60) == "logged 11"
        second = ok(client.get("/api/series", params=query))["series"][0]
        assert second["count"] == 11 and second["x"][-1] == 10
        assert len(points.cursor.consumed - read_before) == 1  # the one new segment alone
    finally:
        job.proc.stdin.close()  # type: ignore[union-attr]
        assert job.wait(60) == 0


def test_a_tensorboard_folder_is_read_through_the_tracker_api(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from async_tracker import AppRun
    from async_tracker.backend.tensorboard import TensorBoardTracker

    run = AppRun("tb/1", [TensorBoardTracker(str(tmp_path / "tb"))],
                 spool_dir=str(tmp_path / "spool"))  # fmt: skip
    run.add_metadata(lr=0.1)
    for step in range(50):
        run.log_metric("loss", 1.0 / (step + 1), step=step)
    assert run.close(30).ok
    live = LiveStore(open_reader(TensorBoardTracker(str(tmp_path / "tb"))))
    assert live.refresh_s == 5.0  # read run by run: less often
    client = local_client(create_app(live))
    (listed,) = ok(client.get("/api/runs"))["runs"]
    assert listed["id"] == "tb/1" and listed["status"] == "finished"
    assert listed["params"] == {"lr": 0.1} and listed["metrics"]["loss"]["count"] == 50
    (series,) = ok(client.get("/api/series", params={"run": "tb/1"}))["series"]
    assert series["count"] == 50 and series["y"][-1] == pytest.approx(0.02)


def test_points_kept_are_bounded_and_dropped_with_their_run(store: Path) -> None:
    live = LiveStore(open_reader(store), refresh_s=0.0, max_points=400)
    client = local_client(create_app(live))
    ok(client.get("/api/series", params={"run": "base/a"}))  # 360 points
    ok(client.get("/api/series", params={"run": "base/b"}))  # 720 in all: base/a dropped
    assert list(live._points) == ["base/b"]
    again = ok(client.get("/api/series", params={"run": "base/a", "metric": "loss"}))
    assert again["series"][0]["count"] == STEPS  # read again when asked again
    assert list(live._points) == ["base/a"]
    assert runtime().loop.call(open_store(store).delete_run, "base/a")
    assert client.get("/api/runs/base/a").status_code == 404
    assert list(live._points) == []


def test_preload_reads_the_newest_runs_within_its_budget_and_stops_when_told(
    store: Path,
) -> None:
    live = LiveStore(open_reader(store), refresh_s=0.0)
    reads: list[str] = []
    inner: Any = live.reader.reader
    real = inner.scalars

    async def counted(run_id: str, names: Any, since: Any) -> Any:
        reads.append(run_id)
        return await real(run_id, names, since)

    inner.scalars = counted
    live.preload(threading.Event(), budget=720)  # two runs of 360 points
    assert reads == ["base/c", "base/b"] and live.held_points() == 720
    # Their charts come from memory; the run left out is read when asked for.
    client = local_client(create_app(live))
    (series,) = ok(client.get("/api/series", params={"run": "base/c", "metric": "loss"}))[
        "series"
    ]
    assert series["count"] == STEPS and reads == ["base/c", "base/b"]
    ok(client.get("/api/series", params={"run": "base/a"}))
    assert reads == ["base/c", "base/b", "base/a"]
    # Told to stop (the server is ending): it reads nothing more.
    stopped = threading.Event()
    stopped.set()
    other = LiveStore(open_reader(store), refresh_s=0.0)
    other.preload(stopped)
    assert other.held_points() == 0


def test_series_take_each_run_once_and_answer_400_past_their_limits(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from async_tracker.ui import app as app_module

    client, _ = client_for(store)
    # The same run named 1,000 times (a 20 KB URL): read and sent once.
    data = ok(client.get("/api/series?" + "&".join(["run=base/a"] * 1000)))
    assert sorted(s["metric"] for s in data["series"]) == ["acc", "loss", "system/cpu_percent"]
    names = "&".join(f"run=r{i}" for i in range(app_module.MAX_SERIES_RUNS + 1))
    response = client.get("/api/series?" + names)
    assert response.status_code == 400
    assert response.json() == {"error": "201 runs asked for: the limit is 200 runs a request"}
    response = client.get("/api/series?run=" + "x" * app_module.MAX_QUERY_BYTES)
    assert response.status_code == 400
    assert "longer than the limit of 16384 bytes" in response.json()["error"]
    # Points: counted from the summaries before any is read (3 runs x 3 metrics here).
    monkeypatch.setattr(app_module, "MAX_SERIES_POINTS", 9 * max_points(100))
    ok(client.get("/api/series?run=base/a&run=base/b&run=base/c&width=100"))
    response = client.get("/api/series?run=base/a&run=base/b&run=base/c&width=101")
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"9 series of up to {max_points(101)} points asked for: the limit is "
        f"{9 * max_points(100):,} points a request (fewer runs or metrics, or a smaller width)"
    )


def test_no_answer_shows_where_the_store_lies(store: Path, tmp_path: Path) -> None:
    client, _ = client_for(store)
    data = ok(client.get("/api/runs"))
    assert data["store"] == f"store {store.name}"
    assert str(tmp_path) not in json.dumps(data)
    # A read that fails naming the path, as the filesystem's errors do: the answer names
    # the store by its last part.
    failing = backend_down(f"cannot open {store}/index.parquet")
    tracker = as_sync(FaultyTracker().always("run_ids", action=failing))
    for label in (f"store {store}", f"store file://{store}"):
        client = local_client(create_app(LiveStore(open_reader(tracker, label=label))))
        response = client.get("/api/runs")
        assert response.status_code == 503, response.text
        assert str(tmp_path) not in response.text
        assert response.json()["error"].startswith("cannot read the store runs: ")
        assert "cannot open runs/index.parquet" in response.text


def test_a_token_is_required_on_every_path_when_set(store: Path) -> None:
    from async_tracker.ui.guard import Access

    client = local_client(create_app(LiveStore(open_reader(store)), Access(token="t0ken-0123")))
    for path in ("/", "/static/app.js", "/api/runs", "/api/runs/base/a", "/api/series?run=x"):
        response = client.get(path)
        assert response.status_code == 403, path
        assert "needs its token" in response.json()["error"]
    assert client.get("/api/runs", headers={"Authorization": "Bearer t0ken-0123"}).status_code \
        == 200
    assert client.get("/api/runs", headers={"Authorization": "token wrong"}).status_code == 403
    page = client.get("/?token=t0ken-0123")
    assert page.status_code == 200 and "t0ken-0123" in page.headers["set-cookie"]
    # The test client keeps the cookie, as the browser does for the page's own requests.
    assert client.get("/api/runs").status_code == 200


def test_every_answer_carries_the_security_headers(store: Path) -> None:
    client, _ = client_for(store)
    for path in ("/", "/static/app.js", "/api/runs", "/api/runs/nope"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer"
    assert client.get("/api/runs", headers={"Host": "evil.example"}).status_code == 403


def test_answers_are_compressed_for_clients_that_take_it(store: Path) -> None:
    client, _ = client_for(store)
    plain = client.get("/api/series?run=base/a", headers={"Accept-Encoding": "identity"})
    packed = client.get("/api/series?run=base/a", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "gzip"
    assert packed.json() == plain.json()  # the client unpacks it
    assert int(packed.headers["content-length"]) < len(plain.content) / 2


def test_the_run_list_is_304_while_nothing_changed(store: Path, tmp_path: Path) -> None:
    client, _ = client_for(store)
    first = client.get("/api/runs?cursor=0")
    version = ok(first)["version"]
    etag = first.headers["etag"]
    assert first.headers["cache-control"] == "no-cache"
    # The page's next poll, nothing written meanwhile: 304, no body, no list built.
    again = client.get(f"/api/runs?cursor={version}", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    # A run written: the version moves, the answer is whole again, with the new run.
    run = async_tracker.init("more", dir=str(store), id="more/1", spool_dir=str(tmp_path / "s"))
    run.log_metric("loss", 1.0)
    assert run.close(30).ok
    changed = client.get(f"/api/runs?cursor={version}", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert [r["id"] for r in changed.json()["runs"]] == ["more/1"]
    # Another server over the same store counts its versions anew: its ETags differ.
    other, _ = client_for(store)
    assert other.get("/api/runs").headers["etag"] != changed.headers["etag"]


def test_a_quiet_store_is_read_less_often_and_a_change_brings_it_back(
    store: Path, tmp_path: Path
) -> None:
    now = [0.0]
    live = LiveStore(open_reader(store), refresh_s=0.5, clock=lambda: now[0])

    def reads_at(t: float) -> int:
        now[0] = t
        live.refresh()
        return live.reads

    # Nothing changes: the waits double, 0.5, 1, 2, and stay at 2 s.
    assert [reads_at(t) for t in (0.0, 0.6, 1.2, 1.7, 3.0, 3.8, 5.0, 5.9)] == \
        [1, 2, 2, 3, 3, 4, 4, 5]
    run = async_tracker.init("more", dir=str(store), id="more/2", spool_dir=str(tmp_path / "s"))
    run.log_metric("loss", 1.0)
    assert run.close(30).ok
    assert reads_at(8.0) == 6 and "more/2" in {r.run_id for r in live.changes().runs}
    assert reads_at(8.6) == 7  # a change: every refresh_s again


# A live run with two backends: the store, and one that fails every write (a server down).
TWO_BACKENDS = """
import sys
import async_tracker
from async_tracker import AppRun
from async_tracker.init_run import open_store
from async_tracker.retry import RetryPolicy
from tests.faulty import FaultyTracker, transient
store, spool = sys.argv[1:3]
down = FaultyTracker(name="mlflow").always("write_batch", transient("server down"))
retry = RetryPolicy(max_attempts=2, initial_backoff_s=0, max_backoff_s=0, jitter_s=0,
                    cooldown_s=0.1)
run = AppRun("two/1", [open_store(store), down], spool_dir=spool, heartbeat_s=0.2,
             retry=retry)
run.log_metric("loss", 1.0, step=0)
print("ready", flush=True)
sys.stdin.read()
run.close(5)
"""


def test_the_delivery_state_names_every_backend_of_the_writer(
    tmp_path: Path, store: Path
) -> None:
    client, _ = client_for(store)
    job = Child(TWO_BACKENDS, str(store), str(tmp_path / "spool-two"))
    try:
        assert job.readline(60) == "ready"

        def backends() -> dict[str, Any]:
            try:
                data = ok(client.get("/api/runs/two/1"))
            except AssertionError:  # not listed yet
                return {}
            for writer in data["writers"]:
                found = writer.get("delivery", {}).get("backends", {})
                if found.get("mlflow", {}).get("retries"):
                    return dict(found)
            return {}

        from tests.core.helpers import wait_until

        wait_until(lambda: bool(backends()), "a heartbeat naming the failing backend", 60)
        both = backends()
        assert set(both) == {"fsspec", "mlflow"}
        assert both["mlflow"]["healthy"] is False and "server down" in both["mlflow"]["last_error"]
        assert both["fsspec"]["healthy"] is True and both["fsspec"]["last_error"] is None
    finally:
        job.proc.stdin.close()  # type: ignore[union-attr]
        job.wait(60)
        job.close()
