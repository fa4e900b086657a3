"""Notifications through apprise (issue 17) to a JSON webhook the test serves on 127.0.0.1.

Real apprise (its json:// target posts the message as JSON), real `ov watchdog`
processes, real SQLite. Nothing is mocked: the receiver is a plain HTTP server.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import typing as t
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import ov_command, run_ov
from overstory.paths import ProjectPaths
from overstory.store import approvals, lifecycle, mail, runs, sessions
from test_watchdog import write_local_config


class Receiver:
    """Collects every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, t.Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: t.Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def titles(self) -> list[str]:
        return sorted(body.get("title", "") for body in self.bodies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> t.Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


def fake_agent(conn: t.Any, name: str, state: str = "between_turns") -> sessions.Session:
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=f"t-{name}",
                                         runtime="scripted", actor="test")
    assert sessions.transition(conn, name, generation, state, actor="test").ok
    found = sessions.get(conn, name)
    assert found is not None
    return found


def one_of_each(conn: t.Any) -> None:
    """The six notify.on events, each made the way ov makes it."""
    approvals.gate(conn, agent=fake_agent(conn, "gated").name, generation=1, parent="operator", task_id="t",
                   turn_id=None, tool="Bash", input='{"command":"git push origin x"}', key="k",
                   rule=approvals.Rule("Bash(git push*)"), decider="operator", timeout_s=600, on_timeout="reject")
    assert lifecycle.declare_zombie(conn, fake_agent(conn, "dead"), "stalled for good", actor="test").ok
    assert lifecycle.park(conn, fake_agent(conn, "spender"), "budget", "max_usd 1 reached", actor="test").ok
    assert lifecycle.park(conn, fake_agent(conn, "limited"), "quota", "quota: limited", actor="test",
                          until_ms=int(time.time() * 1000) + 600_000, escalate=False).ok
    mail.send(conn, sender="merger-x", to="operator", type="merge_failed", subject="merge failed",
              payload={"branch": "ov/x", "reason": "conflicts"})
    run, _ = runs.open_or_join(conn, "operator")
    runs.complete(conn, run.id, force=True)


def watchdog_once(project: ProjectPaths, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([*ov_command(), "watchdog", "--once"], cwd=project.root, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, check=False)


def kinds(receiver: Receiver) -> list[str]:
    return sorted(body["title"].split(":", 1)[0] for body in receiver.bodies)


def test_one_json_notification_per_event_also_across_a_killed_watchdog(project: ProjectPaths, state_db: t.Any,
                                                                        receiver: Receiver) -> None:
    write_local_config(project, notify={"targets": [f"json://127.0.0.1:{receiver.port}/hook"]})
    one_of_each(state_db)
    died = watchdog_once(project, OV_TEST_NOTIFY_DIE="before_send")
    assert died.returncode == -9 or died.returncode == 9, (died.returncode, died.stderr)
    assert receiver.bodies == [], "killed after the outbox commit, before any send"
    queued = {r["kind"] for r in state_db.execute("SELECT kind FROM notify_outbox WHERE sent_at IS NULL")}
    assert queued == {"approval_requested", "worker_died", "budget_parked", "quota_parked", "run_finished",
                      "merge_failed"}
    assert watchdog_once(project).returncode == 0
    assert watchdog_once(project).returncode == 0  # a second restart sends nothing again
    by_kind: dict[str, int] = {}
    for row in state_db.execute("SELECT kind FROM notify_outbox WHERE sent_at IS NOT NULL"):
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + 1
    rows = [dict(r) for r in state_db.execute("SELECT kind, sent_at, last_error, attempts FROM notify_outbox")]
    assert len(receiver.bodies) == 6 and set(by_kind.values()) == {1}, (receiver.titles(), rows)
    gate_note = next(b for b in receiver.bodies if "asks to run" in b["title"])
    gate_id = state_db.execute("SELECT id FROM approvals").fetchone()[0]
    assert f"ov approve {gate_id}" in gate_note["message"] and f"ov reject {gate_id}" in gate_note["message"]
    assert all(set(b) >= {"title", "message", "type"} for b in receiver.bodies)
    logs = project.logs_dir
    for body in receiver.bodies:  # issue 32: each names its agent (or run) and where the logs are
        named = next((line for line in body["message"].splitlines() if "; logs: " in line), "")
        who, _, where = named.partition("; logs: ")
        kind, _, name = who.partition(": ")
        assert (kind, name in body["title"]) == ("run" if body["title"].startswith("ov: run ") else "agent", True), body
        assert where.startswith(str(logs / name) if kind == "agent" else f"{logs} (one folder per agent"), body


def test_an_approval_notification_links_the_running_dashboard(project: ProjectPaths, state_db: t.Any,
                                                               receiver: Receiver) -> None:
    """While `ov serve` runs, the request's notification carries its address (never the token); after it
    stops, the record of that address is gone and a later notification has no link."""
    from serve_helpers import start_server

    write_local_config(project, notify={"targets": [f"json://127.0.0.1:{receiver.port}/hook"]})
    record = project.run_dir / "serve.json"
    served = start_server(project)
    try:
        assert json.loads(record.read_text())["base"] == served.base
        approvals.gate(state_db, agent=fake_agent(state_db, "gated").name, generation=1, parent="operator",
                       task_id="t", turn_id=None, tool="Bash", input='{"command":"git push origin x"}', key="k1",
                       rule=approvals.Rule("Bash(git push*)"), decider="operator", timeout_s=600,
                       on_timeout="reject")
        assert watchdog_once(project).returncode == 0
    finally:
        served.stop()
    assert not record.exists()
    [note] = receiver.bodies
    assert f"{served.base}/" in note["message"] and served.token not in note["message"]
    approvals.gate(state_db, agent=fake_agent(state_db, "later").name, generation=1, parent="operator",
                   task_id="t2", turn_id=None, tool="Bash", input='{"command":"git push origin y"}', key="k2",
                   rule=approvals.Rule("Bash(git push*)"), decider="operator", timeout_s=600, on_timeout="reject")
    assert watchdog_once(project).returncode == 0
    assert len(receiver.bodies) == 2 and "dashboard" not in receiver.bodies[1]["message"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_refusing_target_is_retried_with_backoff_and_recorded(project: ProjectPaths, state_db: t.Any,
                                                                 receiver: Receiver) -> None:
    port = closed_port()
    write_local_config(project, notify={"targets": [f"json://127.0.0.1:{port}/x",
                                                    f"json://127.0.0.1:{receiver.port}/ok"]})
    agent = fake_agent(state_db, "dead")
    assert lifecycle.declare_zombie(state_db, agent, "gone", actor="test").ok
    assert watchdog_once(project).returncode == 0
    row = dict(state_db.execute("SELECT * FROM notify_outbox").fetchone())
    assert row["sent_at"] is None and row["attempts"] == 1 and "did not accept" in row["last_error"]
    assert row["next_at"] > int(time.time() * 1000), "retried later, with backoff"
    assert len(receiver.bodies) == 1, "the working target got it"
    assert watchdog_once(project).returncode == 0  # not due yet: no second attempt
    assert state_db.execute("SELECT attempts FROM notify_outbox").fetchone()[0] == 1
    state_db.execute("UPDATE notify_outbox SET next_at = 0")
    assert watchdog_once(project).returncode == 0
    row = dict(state_db.execute("SELECT * FROM notify_outbox").fetchone())
    assert row["attempts"] == 2 and len(receiver.bodies) == 1, "the target that got it is not sent it again"
    from overstory.store.db import open_events

    events = open_events(project.events_db)
    try:
        failed = events.execute("SELECT summary FROM events WHERE kind = 'notify_failed'").fetchall()
    finally:
        events.close()
    assert len(failed) == 2 and "worker_died" in failed[0][0]
    pending = run_ov("notify", "pending", cwd=project.root)
    assert "worker_died" in pending.stdout and "did not accept" in pending.stdout


def test_notify_test_reports_each_target(project: ProjectPaths, receiver: Receiver) -> None:
    none = run_ov("notify", "test", cwd=project.root)
    assert none.returncode == 1 and "no notify.targets" in none.stderr
    write_local_config(project, notify={"targets": [f"json://127.0.0.1:{receiver.port}/t",
                                                    f"json://127.0.0.1:{closed_port()}/x"]})
    done = run_ov("notify", "test", "--json", cwd=project.root)
    assert done.returncode == 1
    assert [r["ok"] for r in json.loads(done.stdout)] == [True, False]
    assert [b["title"] for b in receiver.bodies] == ["ov: test notification"]


def test_two_senders_at_once_send_each_notification_once(project: ProjectPaths, state_db: t.Any) -> None:
    """The watchdog and `ov approve` may flush together: each leases a row before sending it."""
    from overstory.config.model import Config
    from overstory.notify import flush
    from overstory.store.db import open_state

    for index in range(5):
        lifecycle.declare_zombie(state_db, fake_agent(state_db, f"dead-{index}"), "gone", actor="test")
    from overstory.notify import collect

    collect(state_db)
    config = Config.model_validate({"notify": {"targets": ["json://127.0.0.1:9/unused"]}})
    sent: list[str] = []
    lock = threading.Lock()

    def slow_sender(target: str, title: str, body: str) -> None:
        time.sleep(0.2)
        with lock:
            sent.append(title)

    def sender_thread() -> None:
        conn = open_state(project.state_db)
        try:
            flush(conn, config, sender=slow_sender)
        finally:
            conn.close()

    threads = [threading.Thread(target=sender_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(sent) == sorted(set(sent)) and len(sent) == 5, sent
    assert state_db.execute("SELECT count(*) FROM notify_outbox WHERE sent_at IS NULL").fetchone()[0] == 0


def test_an_agent_finished_outside_a_run_is_announced_and_every_notification_says_where_the_logs_are(
        project: ProjectPaths, state_db: t.Any, receiver: Receiver) -> None:
    """Issue 32: a run's end is announced, so is an agent's that no run reports on (not one you stopped, not
    one in a run); each notification names its agent or run and the path of its logs."""
    write_local_config(project, notify={"targets": [f"json://127.0.0.1:{receiver.port}/hook"]})
    solo = fake_agent(state_db, "builder-solo")
    assert sessions.transition(state_db, solo.name, solo.generation, "completed", actor="test",
                               reason="terminal mail sent").ok
    stopped = fake_agent(state_db, "builder-stopped")
    assert sessions.transition(state_db, stopped.name, stopped.generation, "completed", actor="operator",
                               reason="stopped by the operator").ok
    run, _ = runs.open_or_join(state_db, "operator")
    generation = sessions.create_session(state_db, name="builder-in-run", capability="builder", task_id="t-r",
                                         runtime="scripted", actor="test", run_id=run.id)
    assert sessions.transition(state_db, "builder-in-run", generation, "completed", actor="test",
                               reason="terminal mail sent").ok
    runs.complete(state_db, run.id, force=True)
    assert lifecycle.declare_zombie(state_db, fake_agent(state_db, "builder-dead"), "gone", actor="test").ok
    lead = fake_agent(state_db, "lead-solo")
    generation = sessions.create_session(state_db, name="builder-child", capability="builder", task_id="t-c",
                                         runtime="scripted", actor="test", parent=lead.name, depth=1)
    assert sessions.transition(state_db, "builder-child", generation, "completed", actor="test",
                               reason="terminal mail sent").ok  # it reports to its lead, not to you
    assert watchdog_once(project).returncode == 0
    by_title = {b["title"]: b["message"] for b in receiver.bodies}
    assert sorted(by_title) == sorted(["ov: builder-solo completed", f"ov: run {run.id} completed",
                                       "ov: builder-dead died: gone"]), by_title
    logs = project.logs_dir
    assert "terminal mail sent" in by_title["ov: builder-solo completed"]
    assert f"agent: builder-solo; logs: {logs / 'builder-solo'}" in by_title["ov: builder-solo completed"]
    assert f"run: {run.id}; logs: {logs}" in by_title[f"ov: run {run.id} completed"]
    died = next(m for t, m in by_title.items() if "builder-dead" in t)
    assert f"logs: {logs / 'builder-dead'}" in died
    assert watchdog_once(project).returncode == 0 and len(receiver.bodies) == 3, "each once"
