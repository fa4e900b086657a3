"""The dashboard in a real headless Chromium (Debian's `chromium` + `chromium-driver`, driven by Selenium).

Selenium rather than Playwright: Debian ships a chromedriver built for exactly its
chromium, and Selenium talks to it over W3C WebDriver with nothing to download;
Playwright's Python package brings its own driver and expects its own browser build.

Locally the tests skip when the browser is missing; on CI (CI=true) that is a failure.
Set OV_SCREENSHOTS=DIR to also write the dashboard screenshots there (docs/ uses them).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
import typing as t
import uuid
from pathlib import Path

import pytest

from overstory.paths import ProjectPaths
from overstory.store import mail
from requires import missing as missing_program
from serve_helpers import Served, start_server
from test_watchdog import (
    REPORT_DONE,
    agent_processes,
    cleanup_agents,  # noqa: F401 - fixture
    fast_project,  # noqa: F401 - fixture
    repeat_turns,
    row,
    start_agent,
    wait_for,
)

CHROMIUM = os.environ.get("OV_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("OV_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS = os.environ.get("OV_SCREENSHOTS")  # read now: the tests' environment drops OV_* variables
CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                "--no-default-browser-check", "--disable-domain-reliability", "--metrics-recording-only",
                "--disable-client-side-phishing-detection", "--disable-features=Translate,OptimizationHints",
                # Every name but the test server's own address fails to resolve: the browser reaches nothing else.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")


def click(browser: t.Any, css: str, attempts: int = 20) -> None:
    """Find and click in one go, again if the live page redrew that part in between (a stale element)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for attempt in range(attempts):
        try:
            browser.find_element("css selector", css).click()
            return
        except StaleElementReferenceException:
            if attempt == attempts - 1:
                raise
            time.sleep(0.1)


def _missing() -> list[str]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not (shutil.which(path) or Path(path).is_file())]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    return missing


@pytest.fixture
def browser() -> t.Iterator[t.Any]:
    missing = _missing()
    if missing:
        message = (f"needs a real browser: {', '.join(missing)} missing "
                   "(apt-get install chromium chromium-driver; pip install -e '.[test]')")
        missing_program(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="ov-chromium-")
    for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_window_size(1280, 1000)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def gate_wait(gate: Path) -> dict[str, str]:
    return {"bash": f"while [ ! -e {gate} ]; do sleep 0.05; done"}


def page_wait(driver: t.Any, script: str, timeout: float = 20, what: str = "") -> t.Any:
    """Poll a JavaScript expression in the page until it is truthy."""
    return wait_for(lambda: driver.execute_script(f"return {script}"), timeout=timeout, what=what or script)


def save_screenshot(driver: t.Any, tmp_path: Path, name: str) -> None:
    driver.save_screenshot(str(tmp_path / name))
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SCREENSHOTS) / name))


def tree_names(driver: t.Any) -> set[str]:
    return set(driver.execute_script(
        "return [...document.querySelectorAll('#tree li[data-agent]')].map(n => n.dataset.agent)"))


def test_the_dashboard_shows_the_team_live_and_stops_an_agent(browser: t.Any, fast_project: ProjectPaths,
                                                               state_db: sqlite3.Connection, tmp_path: Path,
                                                               cleanup_agents: None) -> None:
    gate = fast_project.ov_dir / "gate"  # agents read it from inside their sandbox: .overstory/ is visible there
    marker = f"marker-{uuid.uuid4().hex[:12]}"
    lead = start_agent(fast_project, state_db, "api", repeat_turns(
        [{"text": "Splitting the API work between two builders."}, gate_wait(gate), {"text": marker}, REPORT_DONE],
        count=1), capability="lead")
    wait_for(lambda: row(state_db, lead).state == "in_turn", what="the lead's turn")
    child = start_agent(fast_project, state_db, "api-routes", repeat_turns(
        [{"text": "Adding the routes."}, {"write": {"path": "routes.py", "content": "ROUTES = []\n"}},
         {"bash": "git add routes.py && git commit -q -m 'add routes'"},
         {"bash": "ov mail send --type merge_ready --to operator --subject ready "
                  "--payload '{\"files_modified\": [\"routes.py\"]}'"},
         gate_wait(gate), REPORT_DONE], count=1), parent=lead)
    sleeper = start_agent(fast_project, state_db, "docs", repeat_turns(
        [{"text": "Reading the docs folder."}, {"bash": "sleep 120"}], count=1), capability="scout")
    wait_for(lambda: row(state_db, sleeper).current_tool == "Bash", what="the scout's long tool call")
    mail.send(state_db, sender=sleeper, to="operator", type="question", subject="Which API style?",
              body="REST with JSON bodies, or RPC? The issue does not say.")
    names = {lead, child, sleeper}
    served = start_server(fast_project)
    try:
        browser.get(served.sign_in)
        assert "token" not in browser.current_url, "the token leaves the address bar"
        page_wait(browser, "window.ovPage && window.ovPage.ready", what="the page to load")
        wait_for(lambda: tree_names(browser) >= names, what=f"every agent in the tree: {names}")
        nested = browser.execute_script(
            f"return document.querySelector('#tree li[data-agent=\"{child}\"]').parentElement"
            f".closest('li[data-agent]').dataset.agent")
        assert nested == lead, "a child is drawn under its parent"
        page_wait(browser, "document.getElementById('live').classList.contains('on')", what="the live stream")
        page_wait(browser, "document.getElementById('waiting-list').textContent.includes('Which API style?')",
                  what="the question in 'waiting for you'")
        page_wait(browser, "document.getElementById('merge-table').textContent.includes('clean merge')",
                  what="the announced branch with its predicted merge")
        click(browser, f'#tree li[data-agent="{lead}"] > .row')
        page_wait(browser, f"document.getElementById('agent-name').textContent === '{lead}'")
        browser.execute_script("window.__noReload = true")

        gate.touch()  # the lead now says the marker; the page must show it without a reload
        page_wait(browser, f"document.getElementById('feed').textContent.includes('{marker}')", what="the marker")
        seen = time.time()
        page_wait(browser, f"document.getElementById('stream').textContent.includes('{marker}')",
                  what="the marker in the lead's own stream")
        assert browser.execute_script("return window.__noReload") is True, "the page was not reloaded"
        events = sqlite3.connect(fast_project.events_db)
        at_ms = events.execute("SELECT at FROM events WHERE summary = ?", (marker,)).fetchone()[0]
        events.close()
        print(f"\nthe marker event reached the page {seen - at_ms / 1000:.2f}s after it was committed")
        save_screenshot(browser, tmp_path, "dashboard.png")

        click(browser, f'#tree li[data-agent="{sleeper}"] > .row')
        page_wait(browser, f"document.getElementById('agent-name').textContent === '{sleeper}'")
        stop = browser.find_element("id", "stop-btn")
        stop.click()
        assert "Confirm" in stop.text, "the first click only arms the button"
        assert row(state_db, sleeper).state == "in_turn"
        stop.click()
        wait_for(lambda: row(state_db, sleeper).state == "completed", timeout=30, what="the scout to be stopped")
        wait_for(lambda: agent_processes(fast_project, sleeper) == [], timeout=30, what="its processes to end")
        page_wait(browser, "document.getElementById('agent-state').textContent.startsWith('completed')",
                  what="the page to show the stopped agent as completed")

        browser.set_window_size(390, 844)  # a phone
        page_wait(browser, "document.documentElement.scrollWidth <= window.innerWidth + 1",
                  what="no sideways scrolling at phone width")
        order = browser.execute_script("return [document.getElementById('waiting').getBoundingClientRect().top,"
                                       " document.getElementById('team').getBoundingClientRect().top]")
        assert order[0] < order[1], "'waiting for you' comes first"
        save_screenshot(browser, tmp_path, "dashboard-phone.png")
    finally:
        assert served.stop() == 0


def test_approving_a_pending_gate_from_its_button_unparks_the_agent(browser: t.Any, fast_project: ProjectPaths,
                                                                      state_db: sqlite3.Connection,
                                                                      cleanup_agents: None) -> None:
    """Written against issue 17's design: a rule that gates `git push`, the agent parks, the page approves."""
    from test_watchdog import write_local_config

    write_local_config(fast_project, approvals={"rules": [{"match": "Bash(git push*)"}]},
                       guards={"push_remotes": ["origin"]}, turns={"retry_backoff": 0.05, "kill_grace": 1})
    # The first turn only asks (an agent that reports while a gate is pending completes instead of parking).
    name = start_agent(fast_project, state_db, "push", {"turns": [
        {"actions": [{"bash": "git push origin HEAD"}], "result": "waiting"},
        {"actions": [{"bash": "git push origin HEAD || true"}, REPORT_DONE], "result": "done"}]})
    wait_for(lambda: row(state_db, name).state == "parked", timeout=60, what="the agent to park on its gate")
    served: Served = start_server(fast_project)
    try:
        browser.get(served.sign_in)
        page_wait(browser, "document.querySelector('#waiting-list button[data-approve]')", what="the approve button")
        click(browser, "#waiting-list button[data-approve]")
        wait_for(lambda: row(state_db, name).state != "parked", timeout=60, what="the agent to leave parked")
        assert state_db.execute("SELECT status, decided_by FROM approvals").fetchall()[0][:] == ("approved",
                                                                                                  "operator")
    finally:
        served.stop()


# ---- another program on another local port -----------------------------------------------------

PREVIEW_PAGE = b"""<!doctype html><html><head><meta charset="utf-8"><title>preview</title></head><body>
<p>an agent's "preview"</p>
<script>
  const seen = {cookie: document.cookie, local: JSON.stringify({...localStorage}),
                session: JSON.stringify({...sessionStorage}), href: location.href, referrer: document.referrer};
  fetch("/report", {method: "POST", body: JSON.stringify(seen)}).then(() => { document.title = "reported"; });
</script></body></html>
"""


class Preview:
    """What an agent could run on another loopback port (`python3 -m http.server`), recording every request."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[dict[str, t.Any]] = []
        recorded = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                recorded.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                                 "body": self.rfile.read(length).decode("utf-8", "replace") if length else ""})

            def do_GET(self) -> None:
                self._record()
                body = PREVIEW_PAGE if not self.path.startswith("/favicon") else b""
                self.send_response(200 if body else 404)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self._record()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: t.Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reports(self) -> list[dict[str, t.Any]]:
        import json

        return [json.loads(r["body"]) for r in self.requests if r["path"] == "/report"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_another_local_port_never_receives_anything_that_signs_in(browser: t.Any, project: ProjectPaths,
                                                                  tmp_path: Path) -> None:
    """Issue 28, item 3: cookies are not separated by port, so no credential may live in one."""
    from overstory.store import events as event_store
    from overstory.store.db import open_events

    preview = Preview()
    served = start_server(project)
    events = open_events(project.events_db)
    try:
        browser.get(served.sign_in)
        page_wait(browser, "window.ovPage && window.ovPage.ready", what="the page to load")
        page_wait(browser, "document.getElementById('live').classList.contains('on')", what="the live stream")
        assert served.token not in browser.current_url, "the token leaves the address bar"
        assert browser.execute_script("return document.cookie") == ""
        assert browser.get_cookies() == [], "the dashboard sets no cookie at all"

        def shows_live(marker: str) -> None:
            event_store.record(events, "assistant_text", agent="nobody", summary=marker)
            page_wait(browser, f"document.getElementById('feed').textContent.includes('{marker}')",
                      what=f"{marker} in the live feed")

        shows_live("marker-first")
        # An error on the stream (a dropped connection): the page reconnects with a fresh single-use ticket.
        browser.execute_script("window.ovPage.source.dispatchEvent(new Event('error'))")
        page_wait(browser, "window.ovPage.source && window.ovPage.source.readyState === 1",
                  what="the stream to reconnect")
        shows_live("marker-after-reconnect")

        # The operator follows a link the agent printed, opens it in a new tab, and types it in the address bar.
        browser.execute_script(f"window.open('{preview.base}/new-tab', '_blank')")
        browser.execute_script(f"location.href = '{preview.base}/followed-link'")
        wait_for(lambda: len(preview.reports()) >= 2, what="both preview pages to report")
        browser.switch_to.window(browser.window_handles[0])
        browser.get(f"{preview.base}/typed")
        wait_for(lambda: len(preview.reports()) >= 3, what="the typed address to report")

        # Back on the dashboard in the same tab: still signed in (the tab's sessionStorage), still live.
        browser.get(served.base + "/")
        page_wait(browser, "window.ovPage && window.ovPage.ready", what="the page to load again")
        page_wait(browser, "document.getElementById('live').classList.contains('on')", what="the live stream again")
        shows_live("marker-after-return")

        seen_paths = [r["path"] for r in preview.requests]
        assert {"/new-tab", "/followed-link", "/typed"} <= set(seen_paths), seen_paths
        for request in preview.requests:
            assert "cookie" not in {k.lower() for k in request["headers"]}, request
            flat = " ".join([request["path"], request["body"], *request["headers"].values()])
            assert served.token not in flat, request
            assert served.base not in request["headers"].get("Referer", ""), request
        for report in preview.reports():
            assert report["cookie"] == "" and served.token not in str(report), report
        # The preview's own page cannot use the API either (no credential comes with its requests).
        assert browser.get_cookies() == []
    finally:
        events.close()
        served.stop()
        preview.close()


# ---- one card per thing waiting ---------------------------------------------------------------


def test_waiting_for_you_shows_one_card_per_thing_and_drops_what_is_decided_resumed_or_stale(
        browser: t.Any, project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    """Issue 32: an approval, its decision_gate mail and the agent's park are one card; a budget park and its
    escalation are one card; an escalation about an agent that has since completed is none. Deciding and
    resuming take the cards away."""
    from overstory.store import approvals, lifecycle, sessions

    def agent(name: str) -> sessions.Session:
        generation = sessions.create_session(state_db, name=name, capability="builder", task_id=f"t-{name}",
                                             runtime="scripted", actor="test")
        assert sessions.transition(state_db, name, generation, "between_turns", actor="test").ok
        found = sessions.get(state_db, name)
        assert found is not None
        return found

    gated = agent("builder-gated")
    _, approval_id = approvals.gate(state_db, agent=gated.name, generation=gated.generation, parent="operator",
                                    task_id="t", turn_id=None, tool="Bash", input='{"command":"git push origin x"}',
                                    key="k", rule=approvals.Rule("Bash(git push*)"), decider="operator",
                                    timeout_s=600, on_timeout="reject")
    assert lifecycle.park(state_db, gated, "approval", f"approval {approval_id}", actor="test", escalate=False).ok
    broke = agent("builder-broke")
    assert lifecycle.park(state_db, broke, "budget", "budget: max_usd 1 reached", actor="test").ok
    done = agent("builder-done")
    mail.send(state_db, sender="monitor-1", to="operator", type="escalation", subject="builder-done looks stuck",
              payload={"severity": "warning", "agent": "builder-done"})
    assert sessions.transition(state_db, done.name, done.generation, "completed", actor="test",
                               reason="terminal mail sent").ok
    unread = [(r["type"], r["sender"]) for r in state_db.execute(
        "SELECT type, sender FROM mail WHERE recipient = 'operator' AND read_at IS NULL ORDER BY id")]
    assert unread == [("decision_gate", "builder-gated"), ("escalation", "builder-broke"),
                      ("escalation", "monitor-1")], "six things waiting underneath: two cards"
    served: Served = start_server(project)

    def cards() -> list[str]:
        return browser.execute_script(
            "return [...document.querySelectorAll('#waiting-list .item')].map(n => n.textContent)")

    try:
        browser.get(served.sign_in)
        page_wait(browser, "document.querySelectorAll('#waiting-list .item').length === 2", what="two cards")
        shown = cards()
        assert browser.execute_script("return document.getElementById('waiting-count').textContent") == "2"
        assert sum("builder-gated" in c for c in shown) == 1 and "git push" in " ".join(shown)
        assert sum("builder-broke" in c for c in shown) == 1, shown
        assert not any("builder-done" in c for c in shown), "about an agent that has completed: stale"
        click(browser, "#waiting-list button[data-approve]")
        page_wait(browser, "document.querySelectorAll('#waiting-list .item').length === 1", what="one card left")
        assert "builder-broke" in cards()[0]
        broke = sessions.get(state_db, "builder-broke")
        assert broke is not None
        assert sessions.transition(state_db, broke.name, broke.generation, "between_turns", actor="operator",
                                   reason="resumed", expect={"parked"}).ok  # as `ov resume` does
        browser.refresh()
        page_wait(browser, "document.getElementById('waiting-list').textContent.includes('Nothing is waiting')",
                  what="nothing left")
    finally:
        served.stop()


# ---- names kept whole ----------------------------------------------------------------------------


NEAR_NAMES = ("builder-green", "builder-greet", "reviewer-builder-greet-2")


def test_agent_names_are_kept_whole_at_desktop_and_phone_width(browser: t.Any, project: ProjectPaths,
                                                               state_db: sqlite3.Connection) -> None:
    """Issue 32: builder-green and builder-greet must never read the same. In the tree, in a waiting card and
    in the selected agent's heading each name is its whole text, not clipped, inside the window."""
    from overstory.store import lifecycle, sessions

    lead = "lead-with-a-rather-long-name-for-a-phone"
    for name, parent, capability in ((lead, "operator", "lead"), *((n, lead, "builder") for n in NEAR_NAMES)):
        generation = sessions.create_session(state_db, name=name, capability=capability, task_id=f"t-{name}",
                                             runtime="scripted", actor="test", parent=parent,
                                             depth=0 if parent == "operator" else 1)
        assert sessions.transition(state_db, name, generation, "between_turns", actor="test").ok
    greet = sessions.get(state_db, "builder-greet")
    assert greet is not None
    assert lifecycle.park(state_db, greet, "budget", "budget: max_usd 5 reached by a very long tool call that "
                          "goes on and on", actor="test").ok
    served: Served = start_server(project)
    measure = """
        const whole = (node, name) => node !== null && node.textContent.trim() === name
          && node.scrollWidth <= node.clientWidth + 1 && node.getBoundingClientRect().right <= window.innerWidth + 1;
        const names = arguments[0];
        const tree = names.filter(n => !whole(document.querySelector(`#tree li[data-agent="${n}"] .agent-link`), n));
        return {tree, heading: whole(document.getElementById('agent-name'), arguments[1]),
                card: [...document.querySelectorAll('#waiting-list .item')].some(c => c.textContent.includes(arguments[1])),
                wide: document.documentElement.scrollWidth <= window.innerWidth + 1};"""
    try:
        browser.get(served.sign_in)
        wait_for(lambda: tree_names(browser) >= {lead, *NEAR_NAMES}, what="every agent in the tree")
        page_wait(browser, "document.querySelectorAll('#waiting-list .item').length === 1", what="the parked card")
        click(browser, '#tree li[data-agent="builder-greet"] > .row')
        page_wait(browser, "document.getElementById('agent-name').textContent === 'builder-greet'")
        seen: dict[str, t.Any] = {}

        def whole_everywhere() -> bool:
            seen.update(browser.execute_script(measure, [lead, *NEAR_NAMES], "builder-greet"))
            return bool(seen["tree"] == [] and seen["heading"] and seen["card"] and seen["wide"])

        for width, height in ((1280, 1000), (390, 844), (320, 640)):
            browser.set_window_size(width, height)
            try:
                wait_for(whole_everywhere, what=f"every name whole at {width}px")
            except AssertionError as exc:
                over = browser.execute_script(
                    "return [...document.querySelectorAll('body *')].filter(n => n.getBoundingClientRect().right > "
                    "window.innerWidth + 1).map(n => n.tagName + '#' + n.id + '.' + n.className + ' ' + "
                    "Math.round(n.getBoundingClientRect().right) + ' ' + n.textContent.slice(0, 40))")
                raise AssertionError(f"{exc}: {seen} {over[:15]}") from None
    finally:
        served.stop()
