"""The dashboard in headless Chromium: ``async-tracker ui`` started as a real process on a
store written by real runs, the page driven by selenium.

Waits poll the DOM (WebDriverWait with a generous bound): a test waits for what it asserts,
never for a fixed time. The page exposes what the tests read: rows
``tr[data-run-id][data-status]``, charts ``div.chart[data-metric][data-points]`` and
``window.__charts``. Screenshots go to ``$UI_SCREENSHOTS`` (``docs/images`` for the docs).
"""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("selenium")

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from async_tracker.backend.fsspec import encode_run_id
from tests.core.helpers import Child, wait_until
from tests.ui.conftest import STEPS, UiServer, loss, screenshots_dir, start_live

pytestmark = pytest.mark.server

# Generous: a loaded 2-core machine. Only reached when something is wrong.
WAIT_S = 60


def until(browser: Any, condition: Callable[[], Any], what: str) -> Any:
    """Polls ``condition`` (a function of the page) until it is truthy; its value."""
    return WebDriverWait(browser, WAIT_S, poll_frequency=0.05).until(
        lambda _: condition(), message=f"not true after {WAIT_S} s: {what}"
    )


def rows(browser: Any) -> dict[str, str]:
    """The table's runs and their statuses, read in one script (the table is redrawn as
    runs change: no element handle kept across polls)."""
    pairs = browser.execute_script(
        "return [...document.querySelectorAll('tr[data-run-id]')]"
        ".map(r => [r.dataset.runId, r.dataset.status])"
    )
    return dict(pairs)


def text(browser: Any, css: str) -> str:
    """The text of the element ``css`` selects ("" if none), read in one script: charts
    and tables are redrawn as data comes, so no element handle is kept across a wait."""
    return str(browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css
    ))  # fmt: skip


def charts(browser: Any) -> dict[str, Any]:
    """What the page's charts draw; {} while the page is still loading its script."""
    return dict(browser.execute_script("return window.__charts || {}"))


def select(browser: Any, run_id: str) -> None:
    browser.execute_script(
        "document.querySelector(`tr[data-run-id=${JSON.stringify(arguments[0])}] "
        "input[type=checkbox]`).click()",
        run_id,
    )


def save(browser: Any, tmp_path: Path, name: str) -> None:
    """A screenshot of the whole page, 1400 pixels wide (the window is 1400x900)."""
    folder = screenshots_dir(tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True,
         "clip": {"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1}},
    )  # fmt: skip
    (folder / name).write_bytes(base64.b64decode(shot["data"]))


@pytest.fixture
def page(browser: Any, ui_server: UiServer) -> Iterator[Any]:
    # No run selected (sel=none): these tests choose (a first visit draws the newest runs).
    browser.get(ui_server.url + "#/?sel=none")
    until(browser, lambda: len(rows(browser)) == 3, "the three runs listed")
    yield browser
    browser.get("about:blank")  # stop polling before the server goes


def test_the_table_lists_the_runs_and_the_filter_narrows_them(page: Any) -> None:
    assert rows(page) == {"base/a": "finished", "base/b": "finished", "base/c": "finished"}
    headers = page.execute_script(
        "return [...document.querySelectorAll('#runs-head th')].map(th => th.textContent)"
    )
    assert "lr" in headers and "batch_size" in headers and "model" not in headers
    # A metric's column says it shows the last value: a param of the same name reads apart.
    assert "losslast" in headers and "acclast" in headers
    box = page.find_element(By.ID, "filter")
    box.send_keys("lr<0.05")
    until(page, lambda: set(rows(page)) == {"base/b", "base/c"}, "the filter applied")
    box.send_keys(Keys.BACKSPACE * 4)  # "lr<" does not parse
    error = until(page, lambda: text(page, "#filter-error"), "the parser's message")
    assert "column 4" in error and "expected a value" in error
    assert set(rows(page)) == {"base/b", "base/c"}  # the last good list stays
    box.send_keys("0.005")
    until(page, lambda: set(rows(page)) == {"base/c"}, "the corrected filter")
    assert text(page, "#filter-error") == ""
    search = page.find_element(By.ID, "search")
    box.send_keys(Keys.BACKSPACE * 20)
    search.send_keys("baseline")
    until(page, lambda: set(rows(page)) == {"base/a"}, "the search applied")


def sort_button(page: Any, label: str) -> Any:
    return page.execute_script(
        "return [...document.querySelectorAll('#runs-head th button.sort')]"
        ".find(b => b.textContent.startsWith(arguments[0]))", label
    )


def test_sorting_by_a_column_orders_the_rows_by_mouse_and_by_keyboard(page: Any) -> None:
    sort_button(page, "lr").click()
    until(page, lambda: list(rows(page)) == ["base/c", "base/b", "base/a"], "sorted by lr")
    # The header is a button: focused, Enter sorts the other way.
    sort_button(page, "lr").send_keys(Keys.ENTER)
    until(page, lambda: list(rows(page)) == ["base/a", "base/b", "base/c"], "lr descending")
    assert page.execute_script(
        "return document.querySelector('#runs-head th[aria-sort]').getAttribute('aria-sort')"
    ) == "descending"


def test_a_refresh_while_a_run_trains_keeps_focus_and_selection(
    browser: Any, store: Path, tmp_path: Path
) -> None:
    # A live run changes every second; the rows of the others must stay the very same
    # elements, so that a focused link and a selected run id survive its refreshes.
    job = start_live(store, tmp_path / "spool-live", "live/9", heartbeat_s=0.3)
    server = UiServer("--store", str(store))
    try:
        browser.get(server.url)
        until(browser, lambda: len(rows(browser)) == 4, "four runs listed")
        browser.execute_script(
            "const a = document.querySelector('tr[data-run-id=\"base/b\"] a.run-link');"
            "a.focus(); window.__focused = a;"
            "getSelection().selectAllChildren(a);"
        )

        def live_points() -> str:
            return str(browser.execute_script(
                "const td = [...document.querySelectorAll('tr[data-run-id=\"live/9\"] td')]"
                ".find(td => (td.title || '').includes('points'));"
                "return td ? td.title : ''"
            ))  # fmt: skip

        for n in (11, 12):  # two refreshes, each drawn
            job.proc.stdin.write(b"log\n")  # type: ignore[union-attr]
            job.proc.stdin.flush()  # type: ignore[union-attr]
            assert job.readline(60) == f"logged {n}"
            want = f"{n} points"
            until(browser, lambda w=want: w in live_points(), f"the live run at {want}")
        kept = browser.execute_script(
            "return [document.activeElement === window.__focused,"
            " window.__focused.isConnected, getSelection().toString()]"
        )
        assert kept == [True, True, "base/b"]
    finally:
        browser.get("about:blank")
        job.proc.stdin.close()  # type: ignore[union-attr]
        job.wait(60)
        job.close()
        server.close()


def test_two_selected_runs_draw_two_series_with_every_point(page: Any) -> None:
    select(page, "base/a")
    select(page, "base/b")
    loss = until(
        page,
        lambda: charts(page).get("loss") if len(charts(page).get("loss", {}).get("runs", [])) == 2
        else None,
        "the loss chart with two runs",
    )
    assert loss["runs"] == ["base/a", "base/b"] and loss["points"] == [STEPS, STEPS]
    chart = page.find_element(By.CSS_SELECTOR, 'div.chart[data-metric="loss"]')
    assert chart.get_attribute("data-points") == f"{STEPS},{STEPS}"
    assert chart.find_elements(By.CSS_SELECTOR, "canvas")
    legend = text(page, 'div.chart[data-metric="loss"] .u-legend')
    assert "lr=0.1" in legend and "lr=0.01" in legend  # named by the params that differ
    assert set(charts(page)) == {"acc", "loss"}


def test_a_point_logged_by_a_live_run_appears(
    browser: Any, store: Path, tmp_path: Path
) -> None:
    job = start_live(store, tmp_path / "spool-live", "live/1")
    server = UiServer("--store", str(store))
    try:
        browser.get(server.url + "#/?sel=none")
        until(browser, lambda: rows(browser).get("live/1") == "running", "the live run")
        select(browser, "live/1")
        until(browser, lambda: charts(browser).get("loss", {}).get("points") == [10], "10 points")
        job.proc.stdin.write(b"log\n")  # type: ignore[union-attr]
        job.proc.stdin.flush()  # type: ignore[union-attr]
        assert job.readline(60) == "logged 11"
        until(browser, lambda: charts(browser)["loss"]["points"] == [11], "the point logged")
        last = browser.execute_script(
            "return document.querySelector('tr[data-run-id=\"live/1\"]').textContent"
        )
        assert "0.090909" in last  # the last value column follows (1/11)
        job.proc.stdin.close()  # type: ignore[union-attr]
        assert job.wait(60) == 0
        until(browser, lambda: rows(browser)["live/1"] == "finished", "the run's end")
    finally:
        browser.get("about:blank")
        job.close()
        server.close()


# A run that dies without ending: heartbeats every 0.2 s, logs, says "ready", waits to be
# SIGKILLed.
DOOMED = """
import sys, time
import async_tracker
store, spool = sys.argv[1:3]
run = async_tracker.init("doomed", dir=store, id="doomed/1", spool_dir=spool,
                         config={"lr": 0.2, "batch_size": 32}, heartbeat_s=0.2)
for step in range(50):
    run.log_metric("loss", 2.0 / (step + 1), step=step)
assert run.flush(30).ok
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def test_a_sigkilled_run_shows_as_crashed(browser: Any, store: Path, tmp_path: Path) -> None:
    doomed = Child(DOOMED, str(store), str(tmp_path / "spool-doomed"))
    live = start_live(store, tmp_path / "spool-live", "live/2", heartbeat_s=1.0)
    server = UiServer("--store", str(store))
    try:
        assert doomed.readline(60) == "ready"
        beats = store / encode_run_id("doomed/1") / "heartbeat"
        wait_until(lambda: beats.is_dir() and any(beats.iterdir()), "a heartbeat", WAIT_S)
        browser.get(server.url + "#/?sel=none")
        until(browser, lambda: rows(browser).get("doomed/1") == "running", "running first")
        os.kill(doomed.proc.pid, signal.SIGKILL)
        assert doomed.wait(60) == -signal.SIGKILL
        until(browser, lambda: rows(browser).get("doomed/1") == "crashed", "shown as crashed")
        badge = browser.execute_script(
            "return document.querySelector('tr[data-run-id=\"doomed/1\"] .badge').textContent"
        )
        assert badge == "crashed"
        assert rows(browser)["live/2"] == "running"
        select(browser, "base/a")
        select(browser, "base/b")
        select(browser, "base/c")
        until(browser, lambda: len(charts(browser).get("loss", {}).get("runs", [])) == 3, "3 runs")
        save(browser, tmp_path, "ui-runs.png")
    finally:
        browser.get("about:blank")
        doomed.close()
        live.proc.stdin.close()  # type: ignore[union-attr]
        live.wait(60)
        live.close()
        server.close()


def test_the_run_page_shows_params_artifacts_delivery_and_charts(
    browser: Any, store: Path, tmp_path: Path
) -> None:
    job = start_live(store, tmp_path / "spool-live", "live/3", heartbeat_s=0.3)
    server = UiServer("--store", str(store))
    try:
        browser.get(server.url + "#/run/base%2Fa")
        until(browser, lambda: charts(browser).get("run:loss", {}).get("points") == [STEPS],
              "the run's loss chart")  # fmt: skip
        shown = str(browser.find_element(By.ID, "run-view").text)
        assert "base/a" in shown and "finished" in shown
        assert "/models/base/a.pt" in shown and "torch" in shown  # the artifact
        assert "lr" in shown and "0.1" in shown and "baseline" in shown
        browser.get(server.url + "#/run/live%2F3")
        def delivery() -> str:
            return text(browser, "#run-view").lower()

        until(browser, lambda: "1 live writer" in delivery(), "the live writer's delivery state")
        assert "lag" in delivery() and "spooled" in delivery()
        until(browser, lambda: charts(browser).get("run:loss", {}).get("points") == [10],
              "the live run's chart")  # fmt: skip
        save(browser, tmp_path, "ui-run.png")
        unknown = browser.execute_script(
            "return fetch('/api/runs/nope').then(r => r.json().then(b => [r.status, b]))"
        )
        assert unknown == [404, {"error": f"no run 'nope' in the store {store.name}"}]
    finally:
        browser.get("about:blank")
        job.proc.stdin.close()  # type: ignore[union-attr]
        job.wait(60)
        job.close()
        server.close()



def test_the_chart_controls_and_zoom_redraw_the_curves(page: Any) -> None:
    select(page, "base/a")
    select(page, "base/b")
    until(page, lambda: charts(page).get("loss", {}).get("points") == [STEPS, STEPS], "drawn")
    page.execute_script(
        "const s = document.getElementById('smoothing'); s.value = '0.8';"
        "s.dispatchEvent(new Event('input'));"
    )
    page.find_element(By.ID, "logscale").click()
    page.find_element(By.CSS_SELECTOR, '.seg button[data-x="time"]').click()
    chart = 'div.chart[data-metric="loss"]'
    until(page, lambda: "time" in text(page, f"{chart} .u-legend"), "time as x")
    assert charts(page)["loss"]["points"] == [STEPS, STEPS]
    # Smoothed: a raw series (faint, kept out of the legend) behind each run's smoothed one.
    shown = page.execute_script(
        f"return [...document.querySelectorAll('{chart} .u-legend .u-series')]"
        ".filter(r => r.style.display !== 'none').length"
    )
    assert shown == 3  # x, and one row per run
    page.find_element(By.CSS_SELECTOR, '.seg button[data-x="step"]').click()
    until(page, lambda: "step" in text(page, f"{chart} .u-legend"), "step as x")
    # Drag across the middle of the plot: the server sends that window again.
    over = page.find_element(By.CSS_SELECTOR, f"{chart} .u-over")
    width = over.size["width"]
    ActionChains(page).move_to_element_with_offset(over, -width // 8, 0).click_and_hold() \
        .move_by_offset(width // 4, 0).release().perform()
    until(page, lambda: "zoomed" in text(page, chart), "zoomed")
    zoomed = charts(page)["loss"]["points"]
    assert all(0 < n < STEPS for n in zoomed), zoomed
    # The chart was drawn anew with the window: its plot area is a new element.
    ActionChains(page).double_click(page.find_element(By.CSS_SELECTOR, f"{chart} .u-over")) \
        .perform()
    until(page, lambda: charts(page)["loss"]["points"] == [STEPS, STEPS], "zoom reset")
    # No script error (an answer of 400 to an earlier test's bad filter is logged too).
    errors = [e for e in page.get_log("browser")
              if e["level"] == "SEVERE" and e.get("source") != "network"]  # fmt: skip
    assert errors == []


def test_the_view_is_kept_in_the_url_across_a_reload_and_a_runs_page(page: Any) -> None:
    page.find_element(By.ID, "filter").send_keys("lr<0.05")
    until(page, lambda: set(rows(page)) == {"base/b", "base/c"}, "the filter applied")
    select(page, "base/c")
    select(page, "base/b")
    page.find_element(By.CSS_SELECTOR, '.seg button[data-x="time"]').click()
    page.find_element(By.ID, "logscale").click()
    assert page.current_url.endswith(
        "#/?run=base%2Fc&run=base%2Fb&filter=lr%3C0.05&x=time&log=1"
    ), page.current_url

    def restored() -> bool:
        loss = charts(page).get("loss", {})
        return set(rows(page)) == {"base/b", "base/c"} and loss.get("runs") == [
            "base/c", "base/b"
        ]  # fmt: skip

    page.refresh()
    until(page, restored, "the same runs, filter and charts after a reload")
    assert page.execute_script(
        "return [document.getElementById('filter').value,"
        " document.querySelector('.seg button.on').dataset.x,"
        " document.getElementById('logscale').checked,"
        " [...document.querySelectorAll('tr[data-run-id] input:checked')].length]"
    ) == ["lr<0.05", "time", True, 2]
    # A run's page, then "All runs" and the back button: the view is as it was left.
    page.find_element(By.CSS_SELECTOR, 'tr[data-run-id="base/b"] a.run-link').click()
    until(page, lambda: page.execute_script(
        "const v = document.getElementById('run-view');"
        "return !v.hidden && !!v.querySelector('a.back')"
    ), "the run page")  # fmt: skip
    page.find_element(By.CSS_SELECTOR, "#run-view a.back").click()
    until(page, restored, "the view after All runs")
    page.find_element(By.CSS_SELECTOR, 'tr[data-run-id="base/b"] a.run-link').click()
    until(page, lambda: "run/" in page.current_url, "the run page again")
    page.back()
    until(page, restored, "the view after the back button")


def test_dns_rebinding_reads_nothing_and_the_page_breaks_no_policy(
    browser: Any, ui_server: UiServer
) -> None:
    # The attack as a browser lives it: a name of the attacker's that now resolves to the
    # loopback (the resolver rule stands in for the rebinding), its page same-origin with
    # the dashboard's port. Every request it makes carries that name: refused.
    from tests.ui.conftest import start_chromium

    port = ui_server.url.rstrip("/").rsplit(":", 1)[1]
    rebound = start_chromium("--host-resolver-rules=MAP evil.example 127.0.0.1")
    try:
        rebound.get(f"http://evil.example:{port}/api/runs")
        body = rebound.find_element(By.TAG_NAME, "body").text
        assert "is not allowed" in body and '"runs"' not in body
        rebound.get(f"http://evil.example:{port}/")
        assert "is not allowed" in rebound.find_element(By.TAG_NAME, "body").text
        # The same browser through the loopback's address: served, and what the page loads
        # and draws breaks nothing of its Content-Security-Policy.
        rebound.get(ui_server.url)
        until(rebound, lambda: len(rows(rebound)) == 3, "the three runs listed")
        select(rebound, "base/a")
        until(rebound, lambda: charts(rebound), "the charts drawn")
        console = [e["message"] for e in rebound.get_log("browser")]
        assert not [m for m in console if "Content Security Policy" in m], console
    finally:
        rebound.quit()


def test_a_first_visit_draws_the_newest_runs_and_keeps_them_in_the_url(
    browser: Any, ui_server: UiServer
) -> None:
    browser.get(ui_server.url)
    # The three runs (under the default of five), newest first, drawn without a click.
    loss = until(
        browser,
        lambda: charts(browser).get("loss") if len(charts(browser).get("loss", {}).get("runs", []))
        == 3 else None,
        "the newest runs' loss curves",
    )
    assert sorted(loss["runs"]) == ["base/a", "base/b", "base/c"]
    assert browser.execute_script("return location.hash").count("run=") == 3
    # Unselected, the choice is kept: a reload draws nothing.
    for run_id in ("base/a", "base/b", "base/c"):
        select(browser, run_id)
    until(browser, lambda: "sel=none" in browser.execute_script("return location.hash"), "none")
    browser.refresh()
    until(browser, lambda: len(rows(browser)) == 3, "the runs listed")
    assert text(browser, "#charts .charts-empty") == "No runs selected."
    browser.get("about:blank")


def test_panels_group_charts_by_prefix_and_the_metric_filter_narrows_them(
    page: Any,
) -> None:
    select(page, "base/a")
    until(page, lambda: set(charts(page)) == {"acc", "loss"}, "the charts")
    panels = page.execute_script(
        "return [...document.querySelectorAll('#charts details.panel')].map(p => "
        "[p.dataset.panel, [...p.querySelectorAll('div.chart')].map(c => c.dataset.metric)])"
    )
    assert panels == [["", ["acc", "loss"]]]  # system/ metrics are on the run page
    page.find_element(By.ID, "metric-filter").send_keys("LO")
    until(page, lambda: set(charts(page)) == {"loss"}, "only loss")
    assert "metrics=LO" in page.execute_script("return location.hash")
    page.find_element(By.ID, "metric-filter").clear()
    page.find_element(By.ID, "metric-filter").send_keys("nothing-like-it")
    until(page, lambda: text(page, "#charts .charts-empty") == "No metric matches the filter.",
          "the empty filter said")  # fmt: skip
    page.find_element(By.ID, "metric-filter").clear()
    page.execute_script(
        "document.getElementById('metric-filter').dispatchEvent(new Event('input'))"
    )
    until(page, lambda: set(charts(page)) == {"acc", "loss"}, "both again")
    # A panel collapses from the keyboard (a <summary> is a button).
    summary = page.find_element(By.CSS_SELECTOR, "#charts details.panel > summary")
    summary.send_keys(Keys.ENTER)
    assert page.execute_script("return document.querySelector('#charts details.panel').open") \
        is False


def test_relative_time_starts_each_run_at_zero_and_a_new_x_drops_the_zoom(page: Any) -> None:
    select(page, "base/a")
    until(page, lambda: charts(page).get("loss", {}).get("points") == [STEPS], "the loss chart")
    chart = 'div.chart[data-metric="loss"]'
    over = page.find_element(By.CSS_SELECTOR, f"{chart} .u-over")
    width = over.size["width"]
    ActionChains(page).move_to_element_with_offset(over, -width // 8, 0).click_and_hold() \
        .move_by_offset(width // 4, 0).release().perform()
    until(page, lambda: charts(page)["loss"]["zoomed"], "zoomed on steps")
    # A range of steps means nothing on a time axis (it read 1/1/70): the zoom goes.
    page.find_element(By.CSS_SELECTOR, '.seg button[data-x="time"]').click()
    until(page, lambda: (lambda x0: x0 if x0 and x0[0] > 1e9 else None)(
        charts(page).get("loss", {}).get("x0")), "wall time")  # fmt: skip
    assert charts(page)["loss"]["zoomed"] is False
    assert charts(page)["loss"]["points"] == [STEPS]  # seconds since the epoch, every point
    page.find_element(By.CSS_SELECTOR, '.seg button[data-x="relative"]').click()
    until(page, lambda: "x=relative" in page.execute_script("return location.hash"), "in the URL")
    relative = until(page, lambda: (lambda x0: x0 if x0 and x0[0] < 1e9 else None)(
        charts(page).get("loss", {}).get("x0")), "time since the start")  # fmt: skip
    assert 0 <= relative[0] < 60
    assert charts(page)["loss"]["zoomed"] is False


def test_each_chart_downloads_its_curves_as_csv_and_png(page: Any) -> None:
    select(page, "base/a")
    select(page, "base/b")
    until(page, lambda: charts(page).get("loss", {}).get("points") == [STEPS, STEPS], "loss")
    chart = 'div.chart[data-metric="loss"]'
    page.find_element(By.CSS_SELECTOR, f"{chart} button[title^='download the curves']").click()
    until(page, lambda: page.execute_script(f"return document.querySelector('{chart}').dataset.csv")
          == str(2 * STEPS), "every point of both runs written")  # fmt: skip
    page.find_element(By.CSS_SELECTOR, f"{chart} button[title^='download the chart']").click()
    size = until(page, lambda: page.execute_script(
        f"return document.querySelector('{chart}').dataset.png"), "a PNG made")  # fmt: skip
    assert int(size) > 1000


def test_dark_mode_follows_the_system(page: Any, tmp_path: Path) -> None:
    select(page, "base/a")
    select(page, "base/b")
    until(page, lambda: charts(page).get("loss", {}).get("points") == [STEPS, STEPS], "drawn")
    background = "return getComputedStyle(document.body).backgroundColor"
    assert page.execute_script(background) == "rgb(245, 246, 248)"
    page.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})  # fmt: skip
    try:
        until(page, lambda: page.execute_script(background) == "rgb(15, 18, 24)", "dark")
        save(page, tmp_path, "ui-dark.png")
    finally:
        page.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_the_compare_view_shows_selected_runs_side_by_side_with_differences_marked(
    page: Any, tmp_path: Path
) -> None:
    assert page.find_element(By.ID, "compare-card").is_displayed() is False
    select(page, "base/a")
    select(page, "base/b")

    def table() -> dict[str, list[Any]]:
        return {row[0]: row[1:] for row in page.execute_script(
            "return [...document.querySelectorAll('#compare tbody tr')].map(tr => [tr.dataset.row,"
            " tr.classList.contains('differs'), ...[...tr.querySelectorAll('td.v')]"
            ".map(td => td.textContent)])"
        )}  # fmt: skip

    until(page, lambda: "param:lr" in table(), "the compare table")
    rows = table()
    assert rows["param:lr"] == [True, "0.1", "0.01"]
    assert rows["param:batch_size"] == [False, "32", "32"]
    assert rows["param:model"] == [False, "mlp", "mlp"]
    assert rows["metric:loss"][0] is True and "system/cpu_percent" not in str(rows)
    page.find_element(By.ID, "only-diff").click()
    until(page, lambda: "param:model" not in table(), "only the differences")
    assert all(differs for differs, *_ in table().values())
    select(page, "base/c")
    until(page, lambda: len(table().get("param:lr", [])) == 4, "a third column")
    assert table()["param:batch_size"] == [True, "32", "32", "64"]
    save(page, tmp_path, "ui-compare.png")


def test_hovering_a_chart_shows_every_runs_value_at_that_x(page: Any) -> None:
    select(page, "base/a")
    select(page, "base/b")
    until(page, lambda: charts(page).get("loss", {}).get("points") == [STEPS, STEPS], "drawn")
    over = page.find_element(By.CSS_SELECTOR, 'div.chart[data-metric="loss"] .u-over')
    ActionChains(page).move_to_element(over).perform()  # the middle: about step 60
    tip = until(page, lambda: page.execute_script(
        "const t = document.querySelector('div.chart[data-metric=\"loss\"] .tip');"
        "return t && !t.hidden ? [t.querySelector('.tip-x').textContent,"
        " [...t.querySelectorAll('.tip-row')].map(r =>"
        " [r.querySelector('.tip-name').textContent, r.querySelector('b').textContent])] : null"
    ), "the tooltip")  # fmt: skip
    step = int(tip[0].split()[-1])
    assert 40 < step < 80
    assert [name for name, _ in tip[1]] == ["lr=0.1", "lr=0.01"]
    # The values are the curves' at that step.
    shown = [float(value) for _, value in tip[1]]
    assert shown == pytest.approx([loss(0.1, step), loss(0.01, step)], rel=1e-3)


def test_an_idle_page_polls_the_run_list_by_304s(page: Any, ui_server: UiServer) -> None:
    import json

    mine = ui_server.url + "api/runs?"  # the session's browser logged other tests' servers
    urls: dict[str, str] = {}
    wire: list[int] = []  # the run list's statuses as the server sent them

    def poll_log() -> int:
        for entry in page.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            params = message["params"]
            if message["method"] == "Network.requestWillBeSent":
                urls[params["requestId"]] = params["request"]["url"]
            elif message["method"] == "Network.responseReceivedExtraInfo" and urls.get(
                params["requestId"], ""
            ).startswith(mine):
                # (The page's fetch then sees the cached 200: Chromium answers it.)
                wire.append(params["statusCode"])
        return wire.count(304)

    # The store does not change: after the first answer, the browser revalidates each poll
    # with the ETag it holds, and the server answers 304 with no body.
    until(page, lambda: poll_log() >= 2, "two polls answered 304")


def test_the_run_page_shows_each_backends_delivery_and_a_failed_runs_reason(
    browser: Any, store: Path, tmp_path: Path
) -> None:
    import async_tracker
    from async_tracker.runtime.ending import Ending
    from tests.ui.test_api import TWO_BACKENDS

    failed = async_tracker.init("bad", dir=str(store), id="bad/1", spool_dir=str(tmp_path / "b"))
    failed.log_metric("loss", 1.0)
    assert failed.close(30, reason=Ending("failed", "ValueError", "loss went to NaN")).ok
    job = Child(TWO_BACKENDS, str(store), str(tmp_path / "spool-two"))
    server = UiServer("--store", str(store))
    try:
        assert job.readline(60) == "ready"
        browser.get(server.url + "#/run/two%2F1")
        until(browser, lambda: "server down" in text(browser, "#run-view"), "mlflow's error")
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#run-view table.grid tbody tr')]"
            ".map(tr => tr.firstElementChild.textContent)"
        )
        assert "fsspec" in rows and "mlflow" in rows
        browser.get(server.url + "#/run/bad%2F1")
        until(browser, lambda: "loss went to NaN" in text(browser, "#run-view"), "the reason")
        assert "Ended by" in text(browser, "#run-view")
    finally:
        browser.get("about:blank")
        job.proc.stdin.close()  # type: ignore[union-attr]
        job.wait(60)
        job.close()
        server.close()


def test_grouping_by_a_param_draws_each_groups_mean_and_band(page: Any, tmp_path: Path) -> None:
    for run_id in ("base/a", "base/b", "base/c"):
        select(page, run_id)
    until(page, lambda: len(charts(page).get("loss", {}).get("runs", [])) == 3, "three runs")
    choices = page.execute_script(
        "return [...document.querySelectorAll('#group-by option')].map(o => o.value)"
    )
    assert "batch_size" in choices and "lr" in choices
    page.execute_script(
        "const g = document.getElementById('group-by'); g.value = 'batch_size';"
        "g.dispatchEvent(new Event('change'));"
    )
    groups = until(page, lambda: charts(page).get("loss", {}).get("groups"), "the groups drawn")
    assert [(g["label"], g["runs"]) for g in groups] == [
        ("batch_size=32", ["base/a", "base/b"]), ("batch_size=64", ["base/c"])
    ]
    two = groups[0]
    assert two["x"] == list(range(STEPS))
    for i in (0, 30, 119):
        a, b = loss(0.1, i), loss(0.01, i)
        assert two["mean"][i] == pytest.approx((a + b) / 2)
        assert (two["lo"][i], two["hi"][i]) == pytest.approx((min(a, b), max(a, b)))
    assert "group=batch_size" in page.execute_script("return location.hash")
    legend = text(page, 'div.chart[data-metric="loss"] .u-legend')
    assert "batch_size=32 (mean of 2)" in legend and "batch_size=64 (mean of 1)" in legend
    save(page, tmp_path, "ui-grouped.png")


@pytest.mark.scale
def test_two_thousand_runs_list_200_at_a_time_and_filter_at_once(
    browser: Any, tmp_path: Path
) -> None:
    from benchmarks.bench_read import child_write_runs

    root = tmp_path / "many"
    child_write_runs(str(root), 0, 2000, steps=4, segments=1)
    server = UiServer("--store", str(root))
    try:
        browser.get(server.url + "#/?sel=none")
        until(browser, lambda: text(browser, "#run-count") == "2000 of 2000 runs", "counted")
        assert len(rows(browser)) == 200  # drawn 200 at a time
        more = browser.find_element(By.ID, "runs-more")
        assert more.text == "Show 200 more (1800 not shown)"
        more.click()
        until(browser, lambda: len(rows(browser)) == 400, "200 more")
        # lr is 10^-(i % 5 + 1): a fifth of the runs have lr < 5e-5.
        browser.find_element(By.ID, "filter").send_keys("lr<5e-5")
        until(browser, lambda: text(browser, "#run-count") == "400 of 2000 runs", "filtered")
        assert len(rows(browser)) == 200 and all(
            int(run_id.rsplit("-", 1)[1]) % 5 == 4 for run_id in rows(browser)
        )
    finally:
        browser.get("about:blank")
        server.close()


def test_the_column_chooser_picks_the_tables_columns_and_keeps_the_choice(page: Any) -> None:
    def headers() -> list[str]:
        return list(page.execute_script(
            "return [...document.querySelectorAll('#runs-head th')].map(th => th.textContent)"
        ))  # fmt: skip

    assert "lr" in headers() and "losslast" in headers()
    page.find_element(By.CSS_SELECTOR, "#columns > summary").click()
    page.find_element(By.CSS_SELECTOR, '#columns-list input[data-name="lr"]').click()
    page.find_element(By.CSS_SELECTOR, '#columns-list input[data-name="acc"]').click()
    until(page, lambda: "lr" not in headers() and "acclast" not in headers(), "two hidden")
    assert "batch_size" in headers() and "losslast" in headers()
    page.refresh()  # kept in this browser
    until(page, lambda: len(rows(page)) == 3, "listed again")
    assert "lr" not in headers() and "batch_size" in headers()
    page.find_element(By.CSS_SELECTOR, "#columns > summary").send_keys(Keys.ENTER)
    page.find_element(By.CSS_SELECTOR, "#columns-list button").click()  # default columns
    until(page, lambda: "lr" in headers() and "acclast" in headers(), "the defaults back")
