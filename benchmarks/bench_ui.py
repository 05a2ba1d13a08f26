"""The dashboard (``async-tracker ui``): the runs table at thousands of runs, a huge metric
drawn, and the cost of following live runs.

    python -m benchmarks.bench_ui [--points 10000000] [--runs 100] [--rounds 20] [--no-browser]
                                  [--table-runs 2000 20000] [--idle-s 10]
                                  [--only table|live|big]

* ``the runs table`` (Chromium needed): ``--table-runs`` runs written as a job's pipeline
  writes them; ``async-tracker ui`` started and the page opened at once: the seconds to the
  table shown (every run counted), then with the page opened again; the share of
  ``--idle-s`` the idle page is frozen (long tasks); a filter keystroke to its rows shown
  (the page's debounce included); the server's CPU with the idle tab open (from /proc); then
  the same runs exported (``async-tracker export tensorboard``) and ``tensorboard --logdir``
  started: to its run list holding them all, and to one run's curve.
* ``big metric``: one run of a local store holding one metric of ``--points`` points (written
  as 1M-point segments by the fsspec backend's own ``add_metrics``). Reports the cold first
  read (a server without its preload parses every segment into numpy columns; baseline:
  ``Store.metrics()``, the read API's full read of the same run), then what every later chart
  request costs once the points are cached: ``GET /api/series`` for a 1200-pixel chart
  (downsampled to at most 2402 points, JSON included), median of ``--rounds``; and, with
  Chromium and chromedriver on PATH, the page as a user meets it: ``async-tracker ui``
  started (preloading the newest runs), the page opened at once, the run selected as soon
  as its row shows: the seconds from the start to the chart drawn, and from the selection
  to the chart drawn, then with the server warm.
* ``live refresh``: ``--runs`` runs that have not ended (each with a fresh heartbeat, as a
  live writer of this package has), 10 of which log a point (a new segment and summary
  each) between refreshes; one refresh is what a polling page makes the server do: the
  runs changed since its cursor (the run list read again) and two selected runs' series.
  Reports the ``LiveStore``'s CPU time per refresh in this process (all threads, median of
  ``--rounds``), against the baseline of a reader that keeps nothing: the whole list read
  again without the summary cache, and both runs' points read whole (``Store.metrics``);
  then the CPU time of an ``async-tracker ui`` process per refresh (``GET /api/runs?cursor=N``
  and ``GET /api/series``, from /proc, HTTP and JSON included).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from async_tracker import Store
from async_tracker.adapters import as_sync
from async_tracker.backend.fsspec import AsyncFsspecTracker
from async_tracker.init_run import open_store
from async_tracker.records import TrackerMetric
from async_tracker.runtime.process import runtime
from async_tracker.store.downsample import min_max
from async_tracker.store.open import open_reader
from async_tracker.store.reader import GenericReader
from async_tracker.store.sync_reader import Reader
from async_tracker.ui.app import create_app
from async_tracker.ui.live import LiveStore

SEGMENT = 1_000_000
LIVE_WRITERS = 10


def write_points(writer: AsyncFsspecTracker, run_id: str, n: int, start: int = 0) -> None:
    tracker = as_sync(writer)
    t0 = time.time()
    for first in range(start, start + n, SEGMENT):
        last = min(start + n, first + SEGMENT)
        tracker.add_metrics(  # type: ignore[attr-defined]
            run_id,
            [TrackerMetric("loss", 1.0 / (s + 1) + (s % 97) * 1e-4, s, t0 + s * 1e-3)
             for s in range(first, last)],
        )  # fmt: skip


def median_of(rounds: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_big(root: Path, points: int, rounds: int, browser: bool) -> None:
    print(f"\n== big metric: {points:,} points ==")
    t = time.perf_counter()
    write_points(open_store(root), "big/1", points)
    print(f"written in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    frame = Store(root).metrics("big/1")
    full_read = time.perf_counter() - t
    assert len(frame) == points
    del frame
    live = LiveStore(open_reader(root), refresh_s=0.0)
    client = TestClient(create_app(live), base_url="http://127.0.0.1")
    query = {"run": "big/1", "metric": "loss", "width": "1200"}
    t = time.perf_counter()
    first = client.get("/api/series", params=query).json()["series"][0]
    first_read = time.perf_counter() - t
    assert first["count"] == points and len(first["x"]) <= 2402
    cached = median_of(rounds, lambda: client.get("/api/series", params=query).json())
    print(f"Store.metrics() (the read API, full read)   {full_read:8.2f} s   (baseline)")
    print(f"first chart request (cold: no preload)      {first_read:8.2f} s   "
          f"({first_read / full_read:.2f}x the baseline)")  # fmt: skip
    print(f"later chart request (cached, downsampled)   {cached * 1e3:8.1f} ms  "
          f"({full_read / cached:.0f}x faster than the baseline; {len(first['x'])} points sent)")
    if browser:
        browser_draw(root)


# Selects the run in the page and resolves with the milliseconds until its chart is drawn.
SELECT_AND_DRAW = """
const done = arguments[arguments.length - 1];
const t0 = performance.now();
document.querySelector('tr[data-run-id="big/1"] input').click();
(function wait() {
  const c = window.__charts.loss;
  if (c && document.querySelector('div.chart[data-metric="loss"] canvas'))
    done(performance.now() - t0);
  else requestAnimationFrame(wait);
})();
"""


def start_browser(part: str) -> Any:
    """Headless Chromium at 1400x900 on a blank page (up before any clock starts); None,
    said, without Chromium, its driver or selenium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        print(f"{part}: skipped (selenium is not installed)")
        return None
    if not chromium or not driver_path:
        print(f"{part}: skipped (no chromium or chromedriver on PATH)")
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,900"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.get("about:blank")
    return driver


def browser_draw(root: Path) -> None:
    """The page in Chromium, as a user meets it: ``async-tracker ui`` started (its preload
    on), the page opened as soon as the URL is printed, the run selected as soon as its row
    shows. Then the same selection with the server warm (median of 3)."""
    driver = start_browser("page")
    if driver is None:
        return
    from selenium.webdriver.support.ui import WebDriverWait

    def open_page(url: str) -> None:
        driver.get(url)
        WebDriverWait(driver, 120).until(
            lambda d: d.execute_script("return !!document.querySelector('tr[data-run-id]')")
        )

    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "async_tracker", "ui", "--store", str(root), "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        printed = time.perf_counter() - started
        open_page(url)
        shown = time.perf_counter() - started
        first = float(driver.execute_async_script(SELECT_AND_DRAW)) / 1e3
        drawn = time.perf_counter() - started
        warm = []
        for _ in range(3):
            open_page(url)
            warm.append(float(driver.execute_async_script(SELECT_AND_DRAW)) / 1e3)
    finally:
        driver.quit()
        server.terminate()
        server.wait()
    print(f"page, as a user starts it: URL printed {printed:.2f} s, table shown {shown:.2f} s, "
          f"chart drawn {drawn:.2f} s after `async-tracker ui` started")  # fmt: skip
    print(f"  select the run -> chart drawn (server preloading)  {first * 1e3:8.1f} ms")
    print(f"  select the run -> chart drawn (server warm)        "
          f"{statistics.median(warm) * 1e3:8.1f} ms")  # fmt: skip


def bench_live(root: Path, runs: int, rounds: int) -> None:
    print(f"\n== live refresh: {runs} runs not ended, {LIVE_WRITERS} logging ==")
    ids = [f"live/{i}" for i in range(runs)]
    writer = open_store(root)  # one writer: its heartbeats go into its summaries
    for run_id in ids:
        # A live writer's heartbeat (its interval long enough to stay fresh throughout): the
        # list trusts it, as it does a run of this package that is still writing.
        runtime().loop.call(writer.heartbeat, run_id, 3600.0)
        write_points(writer, run_id, 100)
    steps = dict.fromkeys(ids, 100)

    def log_some(r: int) -> None:
        for run_id in ids[r % 2 :: max(1, runs // LIVE_WRITERS)][:LIVE_WRITERS]:
            write_points(writer, run_id, 1, steps[run_id])
            steps[run_id] += 1

    # In this process: the LiveStore's work per refresh, without HTTP. It reads the list at
    # most once per refresh_s: a clock of our own, moved on once per refresh, makes each
    # refresh read it exactly once (as a page polling does).
    now = [0.0]
    live = LiveStore(open_reader(root), clock=lambda: now[0])
    cursor = live.changes().version
    for run_id in ids[:2]:
        live.series(run_id)
    cached: list[float] = []
    uncached: list[float] = []
    listed: list[float] = []
    # Every run read through the tracker API: no summary, no index.
    plain = Reader(GenericReader(open_store(root)), None)
    store = Store(root)
    for r in range(rounds):
        log_some(r)
        now[0] += live.refresh_s
        reads = live.reads
        t = time.process_time()
        changes = live.changes(cursor)
        for run_id in ids[:2]:
            for x, y, _ in live.series(run_id).values():
                min_max(x, y, 1200)
        cached.append(time.process_time() - t)
        assert changes.runs and live.reads == reads + 1, "one read of the list per refresh"
        cursor = changes.version
        t = time.process_time()
        plain.list_runs(None)
        listed.append(time.process_time() - t)
        store.metrics(ids[:2])
        uncached.append(time.process_time() - t)
    c, u, lst = statistics.median(cached), statistics.median(uncached), statistics.median(listed)
    print(f"re-read: list without cache + 2 runs' points {u * 1e3:7.1f} ms CPU  (baseline)")
    print(f"  of which the list alone                    {lst * 1e3:7.1f} ms CPU")
    print(f"one refresh, the LiveStore's work            {c * 1e3:7.1f} ms CPU  "
          f"({c / u:.2f}x the baseline)")  # fmt: skip
    served = server_cpu_per_refresh(root, ids[:2], rounds, log_some)
    print(f"one refresh, the server process (HTTP, JSON) {served * 1e3:7.1f} ms CPU")


def start_ui(root: Path) -> tuple[subprocess.Popen[str], str]:
    """``async-tracker ui`` on ``root`` (a free port, no preload), and its URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "async_tracker", "ui", "--store", str(root), "--port", "0",
         "--preload", "0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    return server, server.stdout.readline().strip()


def process_cpu(pid: int) -> float:
    """A process's CPU seconds so far (user + system, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_per_refresh(
    root: Path, selected: list[str], rounds: int, log_some: Callable[[int], None]
) -> float:
    """``async-tracker ui`` as a process, polled as a page polls (runs since the cursor, and
    the selected runs' series) after each round of points logged, a refresh period apart:
    its CPU time (from /proc) per refresh."""
    import urllib.parse
    import urllib.request

    server, url = start_ui(root)
    try:
        series = url + "api/series?" + urllib.parse.urlencode(
            [("run", r) for r in selected] + [("width", "1200")]
        )  # fmt: skip

        def get(address: str) -> Any:
            with urllib.request.urlopen(address, timeout=60) as response:
                return json.loads(response.read())

        cursor = get(url + "api/runs")["version"]
        get(series)
        def cpu() -> float:
            return process_cpu(server.pid)

        spent = 0.0
        for r in range(rounds):
            log_some(r)
            time.sleep(0.6)  # past the server's refresh period: each poll reads the list
            before = cpu()
            cursor = get(f"{url}api/runs?cursor={cursor}")["version"]
            get(series)
            spent += cpu() - before
        return spent / rounds
    finally:
        server.terminate()
        server.wait()


# In the page: the ms from a filter's keystroke to the table showing its rows (the page's
# own debounce included), and the long tasks (over 50 ms) seen meanwhile.
FILTER_AND_WAIT = """
const [text, want, done] = arguments;
const box = document.getElementById("filter");
const t0 = performance.now();
box.value = text;
box.dispatchEvent(new Event("input"));
(function check() {
  const label = document.getElementById("run-count").textContent;
  if (label.startsWith(want + " of")) done(performance.now() - t0);
  else requestAnimationFrame(check);
})();
"""
# Long tasks (the page frozen) over ``arguments[0]`` ms of an idle page: their share.
FROZEN = """
const [ms, done] = arguments;
let busy = 0;
const seen = new PerformanceObserver((list) => {
  for (const e of list.getEntries()) busy += e.duration;
});
seen.observe({ type: "longtask" });
setTimeout(() => { seen.disconnect(); done(busy / ms); }, ms);
"""


def bench_table(root: Path, runs: int, idle_s: float) -> None:
    """The runs table of ``runs`` runs in Chromium: from the page opened to the table shown
    (the first rows and the count of every run), the share of an idle stretch the page is
    frozen (long tasks), a filter keystroke's answer, and the server's CPU while the tab sits
    idle (its polls, from /proc)."""
    from benchmarks.bench_read import write_runs

    print(f"\n== the runs table: {runs} runs ==")
    took = write_runs(root, runs, steps=20, segments=1, procs=2)
    # The bench's writers call the backend directly and leave the index unfolded (a job's
    # pipeline folds it as its runs end): the first listing compacts it, timed on its own.
    t = time.perf_counter()
    open_reader(root).list_runs(None)
    print(f"written in {took:.1f} s; the index compacted by a first listing in "
          f"{time.perf_counter() - t:.1f} s")  # fmt: skip
    driver = start_browser("table")
    if driver is None:
        return
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_script_timeout(120)
    started = time.perf_counter()
    server, url = start_ui(root)
    try:
        shown = []
        for i in range(3):  # the first (from the server's start), then with the list read
            driver.get("about:blank")
            t = started if i == 0 else time.perf_counter()
            driver.get(url + "#/?sel=none")
            WebDriverWait(driver, 120).until(lambda d: d.execute_script(
                "return document.getElementById('run-count').textContent"
                ".endsWith(arguments[0] + ' runs')", str(runs)
            ))  # fmt: skip
            shown.append(time.perf_counter() - t)
        rows = driver.execute_script("return document.querySelectorAll('tr[data-run-id]').length")
        frozen = float(driver.execute_async_script(FROZEN, idle_s * 1000))
        # lr is 1e-1 .. 1e-5 by run (i % 5): a fifth of the runs have lr < 5e-5.
        keystroke = [float(driver.execute_async_script(FILTER_AND_WAIT, text, str(want)))
                     for text, want in (("lr<5e-5", runs // 5), ("", runs)) * 2]  # fmt: skip
        def cpu() -> float:
            return process_cpu(server.pid)

        time.sleep(2)
        before, t = cpu(), time.perf_counter()
        time.sleep(idle_s)
        idle = (cpu() - before) / (time.perf_counter() - t)
    finally:
        driver.quit()
        server.terminate()
        server.wait()
    print(f"table shown (every run counted, {rows} rows drawn): {shown[0]:.2f} s from "
          f"`async-tracker ui` started; a page opened again {min(shown[1:]):.2f} s")  # fmt: skip
    print(f"idle page frozen (long tasks) {frozen:.1%} of {idle_s:.0f} s")
    print(f"filter keystroke -> rows shown: median {statistics.median(keystroke):.0f} ms "
          f"({', '.join(f'{k:.0f}' for k in keystroke)})")  # fmt: skip
    print(f"server CPU with an idle tab open: {idle:.2%} of a core")
    tensorboard_list(root, runs)


def tensorboard_list(root: Path, runs: int) -> None:
    """The same runs exported as event files (``async-tracker export tensorboard``), then
    ``tensorboard --logdir``: from its start to its run list holding every run
    (``/data/runs``), and to one run's loss curve (``/data/plugin/scalars/scalars``)."""
    import urllib.parse
    import urllib.request

    from async_tracker.cli.main import main as cli
    from benchmarks.bench_read import free_port

    beside = Path(sys.executable).parent / "tensorboard"
    binary = shutil.which("tensorboard") or (str(beside) if beside.exists() else None)
    if binary is None:
        print("tensorboard: skipped (not installed)")
        return
    ids = sorted(r.run_id for r in open_reader(root).list_runs(None).runs)
    logdir = root.parent / f"{root.name}-tb"
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # a line per run exported
        assert cli(["--store", str(root), "export", "tensorboard", "--out", str(logdir), *ids]) == 0
    exported = time.perf_counter() - t
    port = free_port()
    started = time.perf_counter()
    tb = subprocess.Popen([binary, "--logdir", str(logdir), "--port", str(port),
                           "--host", "127.0.0.1", "--load_fast", "false"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=60) as response:
            return json.loads(response.read())

    listed = curve = None
    try:
        while time.perf_counter() - started < 600:
            try:
                if listed is None and len(get("/data/runs")) >= runs:
                    listed = time.perf_counter() - started
                if listed is not None:
                    query = urllib.parse.urlencode({"run": ids[0], "tag": "loss"})
                    if get(f"/data/plugin/scalars/scalars?{query}"):
                        curve = time.perf_counter() - started
                        break
            except (OSError, ValueError):
                pass  # not up yet, or the run not loaded yet
            time.sleep(0.05)
    finally:
        tb.terminate()
        tb.wait()
    shown = "not within 600 s" if listed is None else f"{listed:.2f} s"
    drawn = "not within 600 s" if curve is None else f"{curve:.2f} s"
    print(f"tensorboard --logdir (exported in {exported:.1f} s): every run listed {shown}, "
          f"a run's loss curve {drawn} from its start")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--table-runs", type=int, nargs="*", default=[2_000, 20_000],
                        help="the runs table's sizes (none: skip it)")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--only", choices=["table", "live", "big"])
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"{platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load {load:.2f}, {platform.platform()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "table") and not args.no_browser:
            for n in args.table_runs:
                bench_table(Path(tmp) / f"table-{n}", n, args.idle_s)
        if args.only in (None, "live"):
            bench_live(Path(tmp) / "live", args.runs, args.rounds)
        if args.only in (None, "big"):
            bench_big(Path(tmp) / "big", args.points, max(3, args.rounds // 4),
                      not args.no_browser)  # fmt: skip


if __name__ == "__main__":
    main()
