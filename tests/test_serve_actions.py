"""What the API does: each route reaches the same core function as its command (real agents, git, SQLite)."""

from __future__ import annotations

import sqlite3
import typing as t

import pytest
from starlette.testclient import TestClient

from conftest import run_git
from overstory.paths import ProjectPaths
from overstory.serve_token import ensure_token
from overstory.store import events as event_store
from overstory.store import mail, sessions, turns
from overstory.ui.serve.app import create_app
from test_serve_api import BASE, add_agent, bearer
from test_watchdog import (
    agent_processes,
    cleanup_agents,  # noqa: F401 - fixture
    fast_project,  # noqa: F401 - fixture
    repeat_turns,
    row,
    start_agent,
    wait_for,
)


@pytest.fixture
def api(fast_project: ProjectPaths) -> t.Iterator[TestClient]:
    token = ensure_token(fast_project).value
    with TestClient(create_app(fast_project, token=token, cookie_name="c"), base_url=BASE,
                    headers=bearer(token)) as client:
        yield client


def test_one_agent_with_its_turns_history_and_spend(api: TestClient, state_db: sqlite3.Connection) -> None:
    generation = add_agent(state_db, "builder-a", state="in_turn")
    turns.start(state_db, "turn-1", agent="builder-a", generation=generation, number=1, attempt=0, resumed=False,
                started_ms=1_000, log_dir="x")
    turns.finish(state_db, "turn-1", "ok", input_tokens=10, output_tokens=5, cost_usd=0.25, tool_calls=3,
                 session_id="s", error=None)
    sessions.add_usage(state_db, "builder-a", generation, input_tokens=10, output_tokens=5, cost_usd=0.25)
    detail = api.get("/api/agents/builder-a").json()
    assert detail["state"] == "in_turn" and detail["generation"] == generation
    assert [(t["id"], t["status"], t["cost_usd"], t["tool_calls"]) for t in detail["turn_list"]] == [
        ("turn-1", "ok", 0.25, 3)]
    assert [h["to"] for h in detail["history"]] == ["booting", "in_turn"]
    assert detail["spend"] == {"cost_usd": 0.25, "input_tokens": 10, "output_tokens": 5, "turns": 0}
    assert detail["budget"] is None
    assert api.get("/api/agents/nobody").status_code == 404
    assert api.get("/api/agents/Bad..Name").status_code == 400
    listed = api.get("/api/agents").json()
    assert [a["name"] for a in listed] == ["builder-a"] and listed[0]["cost_usd"] == 0.25


def test_waiting_mail_reply_and_read(api: TestClient, state_db: sqlite3.Connection) -> None:
    add_agent(state_db, "builder-p", state="parked")
    add_agent(state_db, "builder-q")
    question = mail.send(state_db, sender="builder-q", to="operator", subject="which db?", type="question",
                         body="postgres or sqlite?")[0]
    mail.send(state_db, sender="builder-q", to="operator", subject="fyi", body="status only")
    waiting = api.get("/api/waiting").json()
    assert [p["name"] for p in waiting["parked"]] == ["builder-p"]
    assert [m["id"] for m in waiting["mail"]] == [question], "plain status mail does not wait for a person"
    reply = api.post(f"/api/mail/{question}/reply", json={"body": "sqlite"})
    assert reply.status_code == 201
    answer = mail.get(state_db, reply.json()["id"])
    assert answer is not None and (answer.recipient, answer.type, answer.reply_to, answer.sender) == (
        "builder-q", "result", question, "operator")
    assert api.post(f"/api/mail/{question}/read").json()["read_at"] is not None
    assert api.get("/api/waiting").json()["mail"] == []
    thread = api.get("/api/agents/builder-q/mail").json()
    assert [m["subject"] for m in thread] == ["which db?", "fyi", "Re: which db?"]
    assert api.get(f"/api/mail/{question}").json()["subject"] == "which db?"
    assert api.get("/api/mail/99999").status_code == 404
    listed = api.get("/api/mail", params={"to": "builder-q"}).json()
    assert [m["id"] for m in listed] == [reply.json()["id"]]


def test_send_and_nudge_use_the_mail_store_rules(api: TestClient, state_db: sqlite3.Connection) -> None:
    add_agent(state_db, "builder-n")
    add_agent(state_db, "builder-done", state="completed")
    sent = api.post("/api/mail", json={"to": "builder-n", "subject": "rebase", "body": "main moved",
                                       "priority": "high"})
    assert sent.status_code == 201
    message = mail.get(state_db, sent.json()["ids"][0])
    assert message is not None and (message.sender, message.priority) == ("operator", "high")
    once = {"to": "builder-n", "subject": "deploy window", "body": "after 6pm", "dedup_key": "window-1"}
    first, retried = api.post("/api/mail", json=once), api.post("/api/mail", json=once)
    assert len(first.json()["ids"]) == 1 and retried.json()["ids"] == [], "a retried request sends nothing new"
    assert [m.subject for m in mail.list_messages(state_db, to="builder-n")].count("deploy window") == 1
    refused = api.post("/api/mail", json={"to": "builder-done", "subject": "too late"})
    assert refused.status_code == 409 and "completed" in refused.json()["error"]
    assert api.post("/api/mail", json={"to": "nobody-at-all", "subject": "x"}).status_code == 409
    assert api.post("/api/mail", json={"to": "builder-n", "subject": "x", "type": "gossip"}).status_code == 400
    nudged = api.post("/api/agents/builder-n/nudge", json={"message": "you have been quiet\nreport status"})
    assert nudged.status_code == 201
    nudge = mail.get(state_db, nudged.json()["ids"][0])
    assert nudge is not None and (nudge.type, nudge.priority, nudge.subject) == ("nudge", "high", "you have been quiet")
    default = mail.get(state_db, api.post("/api/agents/builder-n/nudge", json={}).json()["ids"][0])
    assert default is not None and default.subject.startswith("nudge:")


def test_stop_from_the_api_leaves_no_process(api: TestClient, fast_project: ProjectPaths,
                                             state_db: sqlite3.Connection, cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "busy", repeat_turns([{"text": "working"}, {"bash": "sleep 60"}]))
    busy = wait_for(lambda: (r := row(state_db, name)).current_tool == "Bash" and r, what="the tool call")
    stopped = api.post(f"/api/agents/{name}/stop", json={})
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["previous_state"] == "in_turn" and stopped.json()["state"] == "completed"
    assert agent_processes(fast_project, name) == []
    assert row(state_db, name).state == "completed" and busy.loop_pid is not None
    again = api.post(f"/api/agents/{name}/stop", json={})
    assert again.status_code == 200 and again.json()["already_completed"] is True
    assert api.post("/api/agents/nobody/stop", json={}).status_code == 404


def test_sling_from_the_api_runs_a_real_agent(api: TestClient, fast_project: ProjectPaths,
                                              state_db: sqlite3.Connection, cleanup_agents: None) -> None:
    made = api.post("/api/sling", json={"capability": "scout", "task_id": "look", "runtime": "scripted",
                                        "prompt": "look around"})
    assert made.status_code == 201, made.text
    assert made.json()["name"] == "scout-look" and made.json()["parent"] == "operator"
    wait_for(lambda: row(state_db, "scout-look").state == "completed", timeout=60, what="the scout to finish")
    reports = [m for m in mail.list_messages(state_db, to="operator") if m.type == "worker_done"]
    assert [m.sender for m in reports] == ["scout-look"]
    again = api.post("/api/sling", json={"capability": "scout", "task_id": "look", "runtime": "scripted"})
    assert again.status_code == 409 and "already exists" in again.json()["error"]
    bad = api.post("/api/sling", json={"capability": "wizard", "task_id": "x"})
    assert bad.status_code == 400 and "unknown capability" in bad.json()["error"]


def test_events_by_cursor_and_filters(api: TestClient, events_db: sqlite3.Connection) -> None:
    ids = [event_store.record(events_db, kind, agent=agent, summary=f"{agent} {kind}")
           for agent, kind in [("a", "tool_start"), ("b", "assistant_text"), ("a", "tool_end"), ("b", "tool_start")]]
    page = api.get("/api/events", params={"since": ids[0]}).json()
    assert [e["id"] for e in page["events"]] == ids[1:] and page["last_id"] == ids[-1]
    assert [e["id"] for e in api.get("/api/events", params={"agent": "a"}).json()["events"]] == [ids[0], ids[2]]
    kinds = api.get("/api/events?kind=tool_start&kind=tool_end&agent=b").json()["events"]
    assert [e["id"] for e in kinds] == [ids[3]]
    newest = api.get("/api/events", params={"newest": 1, "limit": 2}).json()["events"]
    assert [e["id"] for e in newest] == ids[2:]
    assert api.get("/api/events", params={"since": ids[-1]}).json() == {"events": [], "last_id": ids[-1]}


def test_runs_merge_queue_and_prediction(api: TestClient, fast_project: ProjectPaths,
                                         state_db: sqlite3.Connection) -> None:
    assert api.get("/api/runs").json() == []
    assert api.get("/api/runs/run-nope").status_code == 404
    root = fast_project.root
    for branch, text in (("ov/builder-ok", "a new file\n"), ("ov/builder-clash", "clash\n")):
        run_git(root, "checkout", "-q", "-b", branch, "main")
        target = root / ("new.txt" if branch.endswith("ok") else "README.md")
        target.write_text(text)
        run_git(root, "add", target.name)
        run_git(root, "commit", "-qm", branch)
        run_git(root, "checkout", "-q", "main")
    (root / "README.md").write_text("main moved\n")
    run_git(root, "commit", "-qam", "main moves")
    for name in ("builder-ok", "builder-clash"):
        add_agent(state_db, name, branch=f"ov/{name}", base_branch="main")
        mail.send(state_db, sender=name, to="operator", subject="ready", type="merge_ready",
                  payload={"task_id": name, "branch": f"ov/{name}", "agent": name})
    queue = api.get("/api/merge/queue").json()
    assert [(q["agent"], q["status"], q["target"]) for q in queue] == [
        ("builder-ok", "announced", "main"), ("builder-clash", "announced", "main")]
    ok = api.get("/api/merge/predict", params={"agent": "builder-ok"}).json()
    assert ok["dry_run"] and ok["tier"] == 1 and ok["conflicts"] == []
    clash = api.get("/api/merge/predict", params={"branch": "ov/builder-clash"}).json()
    assert clash["conflicts"] == ["README.md"] and clash["tier"] != 1
    assert run_git(root, "log", "--oneline", "-1", "main").split()[1:] == ["main", "moves"], "prediction merged nothing"
    assert api.get("/api/merge/predict", params={"agent": "nobody"}).status_code == 404
    whole = api.get("/api/merge/predict", params={"all": 1}).json()  # the queue as one sequence, same branches
    assert [(m["branch"], m["tier"]) for m in whole["merges"]] == [("ov/builder-ok", 1), ("ov/builder-clash", 3)]
    assert [q["branch"] for q in api.get("/api/merge/queue").json()] == [m["branch"] for m in whole["merges"]]
    assert api.get("/api/merge/predict").status_code == 400
