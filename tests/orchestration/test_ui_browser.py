"""The Dagster UI in a headless browser (Debian's Chromium, driven by playwright; `make test` installs
it), over a home `eventide run` made: the Automation page lists the daily summary's automation sensor,
its evaluation shows the summary's condition (DayDue and the in-progress guards), and the summary's asset
page shows its freshness policy and Dagster's judgement of it. Real processes: `eventide run`, then
`eventide ui` (webserver and daemon)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from examples.logs import SUMMARY_TABLE
from examples.logs_assets import SUMMARY_FRESHNESS
from tests.orchestration.test_serve import EVENTIDE, _env, _wait_for
from tests.orchestration.test_serve_ui import _graphql, _graphql_up
from tests.transforms.test_logs_app import LOG_FILES
from transforms.ports import free_port

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium waits on services the closed network never answers.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SENSOR = "daily_summary_automation"
TICKS = """{ sensorOrError(sensorSelector: {repositoryName: "__repository__",
    repositoryLocationName: "orchestration.definitions", sensorName: "%s"}) {
    ... on Sensor { sensorState { ticks(limit: 5) { status } } } } }"""

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}: run `make test` (installs "
                                                           "Debian's chromium) or set CHROMIUM"),
]


def _ticks(port: int, sensor: str) -> list[str]:
    try:
        state = _graphql(port, TICKS % sensor)["sensorOrError"]["sensorState"]
    except (OSError, KeyError, TypeError, ValueError):
        return []
    return [t["status"] for t in state["ticks"]]


def _open(page, url: str, shot: Path) -> str:
    """The page's text once the UI has loaded it. The community pop-up of a new instance is dismissed by the
    page's locator handler (before the next action or assertion), never clicked here as well: a click of
    our own raced the handler, which had already closed it, and waited 60 s for a button that was gone."""
    page.goto(url)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(shot))
    return page.inner_text("body")


def test_the_ui_shows_the_summarys_automation_conditions_and_freshness(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    home, port = tmp_path / "home", free_port()
    env = _env(home, EVENTIDE_APPS="examples.logs:app")

    def eventide(*args: str) -> str:
        done = subprocess.run([EVENTIDE, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    eventide("ingest", "logs", str(LOG_FILES[0]), "--end-of-day")
    assert "daily_return_code_summary: 1 run(s): 2004-03-07" in eventide("run")
    ui = subprocess.Popen([EVENTIDE, "ui", "--port", str(port)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert _wait_for(lambda: _graphql_up(port), 180), "the Dagster UI did not come up within 180 s"
        # `eventide run` recorded its tick of the automation sensor and the conditions' evaluation, as the
        # daemon records its own: the UI shows them from the start.
        assert "SUCCESS" in _ticks(port, SENSOR), _ticks(port, SENSOR)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(60_000)
                # The community pop-up of a new instance may also open after `_open` looked for it, over the
                # next thing clicked (a CI run's click waited 60 s behind its backdrop): Playwright skips it then.
                page.add_locator_handler(page.get_by_role("button", name="Skip"), lambda skip: skip.click())
                base = f"http://127.0.0.1:{port}"

                # The list renders the names first and each sensor's type a moment later: wait for both.
                _open(page, f"{base}/automation", tmp_path / "automation.png")
                expect(page.locator("body")).to_contain_text(re.compile(SENSOR + r"\s*Automation condition sensor"))
                page.screenshot(path=str(tmp_path / "automation.png"))

                # The summary's evaluations, newest first; the newest opens on the condition's tree.
                _open(page, f"{base}/assets/{SUMMARY_TABLE}?view=automation", tmp_path / "evaluations.png")
                page.locator("table tbody tr button").first.click()  # its timestamp
                tree = page.get_by_role("dialog")
                expect(tree).to_contain_text(re.compile(r"day_due\s*AND\s*NOT \(in_progress\)\s*AND\s*NOT \(any_deps_in_progress\)"))
                page.screenshot(path=str(tmp_path / "condition.png"))

                # The policy at once; Dagster's judgement once the daemon's freshness loop has looked.
                fail_hours = int(SUMMARY_FRESHNESS.fail_window.to_timedelta().total_seconds() // 3600)
                text = _open(page, f"{base}/assets/{SUMMARY_TABLE}", tmp_path / "asset.png")
                assert f"Fails if more than {fail_hours} hours since last materialization" in text, text
                judged = _wait_for(lambda: "Freshness policy\nPassing" in _open(page, f"{base}/assets/{SUMMARY_TABLE}",
                                                                                 tmp_path / "asset.png"), 180, poll=5)
                assert judged, page.inner_text("body")
            finally:
                browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()
