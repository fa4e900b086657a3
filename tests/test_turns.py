"""The turn runner and the per-agent loop, driven through the scripted runtime.

The scripted runtime is a real subprocess speaking stream-json and really running
its tools, so these tests exercise the same process groups, pipes, guards, mail
claims and state transitions as the claude runtime (the e2e suite covers claude).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from agent_helpers import agent_state, loop_processes, mail_rows, shared_dir, wait_for, wait_terminal, write_scenario
from conftest import run_git
from overstory import procs
from overstory.agents.spawn import SlingRequest, sling
from overstory.config.model import load_config
from overstory.store.db import open_events, open_state

REPORT = {"bash": 'ov mail send --type worker_done --subject "done ${OVERSTORY_TASK_ID}" --body "all good"'}


def start(project, tmp_path, turns, *, name_task="t1", env=None, capability="builder"):
    scenario = write_scenario(tmp_path / f"{name_task}.json", turns)
    environ = {**os.environ, **shared_dir(tmp_path)[1], **(env or {})}
    config = load_config(project.config_file, project.local_config_file, environ=environ)
    conn = open_state(project.state_db)
    try:
        return sling(project, config, conn, SlingRequest(capability=capability, task_id=name_task, runtime="scripted",
                                                         scenario=scenario), environ)
    finally:
        conn.close()


def events_of(project, agent, kind=None):
    conn = open_events(project.events_db)
    try:
        query = "SELECT kind, tool, summary, data FROM events WHERE agent = ?" + (" AND kind = ?" if kind else "")
        rows = conn.execute(query + " ORDER BY id", (agent, kind) if kind else (agent,)).fetchall()
        return [{"kind": r[0], "tool": r[1], "summary": r[2], "data": json.loads(r[3]) if r[3] else None} for r in rows]
    finally:
        conn.close()


def turn_rows(project, agent):
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at", (agent,))]
    finally:
        conn.close()


def test_builder_completes_commits_and_reports(project, tmp_path):
    start(project, tmp_path, [{"actions": [
        {"write": {"path": "hello.txt", "content": "hi\n"}},
        {"bash": "git add hello.txt && git commit -q -m 'add hello'"},
        REPORT,
    ]}])
    agent = wait_terminal(project, "builder-t1")
    assert agent.state == "completed" and agent.turns == 1 and agent.cost_usd > 0
    assert "hello.txt" in run_git(project.root, "show", "--name-only", "ov/builder-t1")
    done = mail_rows(project, type="worker_done")
    assert len(done) == 1 and done[0]["recipient"] == "operator" and done[0]["sender"] == "builder-t1"
    assert json.loads(done[0]["payload"])["task_id"] == "t1"
    kinds = [e["kind"] for e in events_of(project, "builder-t1")]
    for kind in ("spawn", "turn_start", "tool_start", "tool_end", "turn_result", "turn_end"):
        assert kind in kinds
    tools = [e["tool"] for e in events_of(project, "builder-t1", "tool_start")]
    assert tools == ["Write", "Bash", "Bash"]
    dispatch = mail_rows(project, type="dispatch")[0]
    assert dispatch["read_at"] is not None  # delivered and marked read after the clean turn
    log_dirs = list((project.logs_dir / "builder-t1").iterdir())
    assert {p.name for p in log_dirs[0].iterdir()} >= {"prompt.txt", "stdout.ndjson", "stderr.txt"}
    wait_for(lambda: not loop_processes("builder-t1", project.root), 10, message="loop exit")


def test_killed_turn_is_retried_with_the_same_mail(project, tmp_path):
    marker = shared_dir(tmp_path)[0] / "killed-once"
    # The first attempt SIGKILLs its own process group mid-tool-call (like `kill -9 -PGID`).
    start(project, tmp_path, [{"actions": [
        {"bash": f"test -e {marker} || {{ touch {marker}; kill -9 -$(ps -o pgid= $$ | tr -d ' '); }}"},
        {"expect_in_prompt": "task t1"},
        REPORT,
    ]}], env={"OV_TURNS_RETRY_BACKOFF": "0.1"})
    agent = wait_terminal(project, "builder-t1")
    assert agent.state == "completed"
    rows = turn_rows(project, "builder-t1")
    assert [r["status"] for r in rows] == ["transient", "ok"]
    assert mail_rows(project, type="worker_died") == []
    dispatch = mail_rows(project, type="dispatch")
    assert len(dispatch) == 1 and dispatch[0]["read_at"] is not None
    prompts = [(project.logs_dir / "builder-t1" / r["id"] / "prompt.txt").read_text() for r in rows]
    assert all("task t1" in p for p in prompts)  # the same dispatch reached the model again


def test_stalled_turn_becomes_zombie_with_one_worker_died(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"text": "thinking..."}, {"sleep": 60}]}],
          env={"OV_TURNS_STALL_TIMEOUT": "1.5", "OV_TURNS_KILL_GRACE": "0.5"})
    agent = wait_terminal(project, "builder-t1", timeout=30)
    assert agent.state == "zombie" and "stall" in (agent.state_reason or "")
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"
    assert "stall" in json.loads(died[0]["payload"])["reason"]
    rows = turn_rows(project, "builder-t1")
    assert rows[-1]["status"] == "stalled"
    assert not procs.group_members(rows[-1]["pgid"])
    # The undelivered dispatch is released, still unread, so nothing is lost.
    assert mail_rows(project, type="dispatch")[0]["read_at"] is None


def test_permanent_api_error_gives_up_at_once(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"api_error": "invalid_request"}]}])
    agent = wait_terminal(project, "builder-t1")
    assert agent.state == "zombie"
    assert len(turn_rows(project, "builder-t1")) == 1
    assert len(mail_rows(project, type="worker_died")) == 1


def test_retries_are_bounded(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"crash": 3}]}],
          env={"OV_TURNS_MAX_RETRIES": "1", "OV_TURNS_RETRY_BACKOFF": "0.05"})
    agent = wait_terminal(project, "builder-t1")
    assert agent.state == "zombie" and "retries" in (agent.state_reason or "")
    assert [r["status"] for r in turn_rows(project, "builder-t1")] == ["transient", "transient"]
    assert len(mail_rows(project, type="worker_died")) == 1


def test_mail_starts_the_next_turn_which_resumes_the_session(project, tmp_path, ):
    start(project, tmp_path, [
        {"actions": [{"text": "waiting for instructions"}, {"bash": "ov mail send --to operator --subject ready"}]},
        {"actions": [{"expect_in_prompt": "second task"}, REPORT]},
    ])
    wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.state == "between_turns" and a.turns == 1,
             30, message="first turn")
    from conftest import run_ov

    sent = run_ov("mail", "send", "--to", "builder-t1", "--subject", "next", "--body", "second task", cwd=project.root)
    assert sent.returncode == 0, sent.stderr
    agent = wait_terminal(project, "builder-t1")
    assert agent.state == "completed" and agent.turns == 2
    first, second = turn_rows(project, "builder-t1")
    assert second["resumed"] == 1 and second["session_id"] == first["session_id"]


def test_unresumable_session_falls_back_to_a_fresh_one(project, tmp_path):
    start(project, tmp_path, [
        {"actions": [{"bash": "ov mail send --to operator --subject ready"}]},
        {"actions": [REPORT]},
    ])
    wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.state == "between_turns" and a.turns == 1,
             30, message="first turn")
    shutil.rmtree(project.run_dir / "builder-t1" / "scripted")  # the runtime forgets the session
    conn = open_state(project.state_db)
    try:
        from overstory.store import mail

        mail.send(conn, sender="operator", to="builder-t1", subject="go on", body="continue")
    finally:
        conn.close()
    agent = wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.turns == 2 and a, 30, message="turn 2")
    kinds = [e["kind"] for e in events_of(project, "builder-t1")]
    assert "resume_fallback" in kinds
    prompt_dirs = sorted((project.logs_dir / "builder-t1").iterdir(), key=lambda p: p.stat().st_mtime)
    assert "could not be resumed" in (prompt_dirs[-1] / "prompt.txt").read_text()
    assert agent.state in ("between_turns", "completed")


def test_one_loop_per_agent(project, tmp_path):
    release = shared_dir(tmp_path)[0] / "release"
    result = start(project, tmp_path, [{"actions": [
        {"bash": f"for i in $(seq 3000); do test -e {release} && break; sleep 0.1; done"}, REPORT]}])
    # in_turn means the first loop holds the agent lock (it takes the lock before any turn).
    wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.state == "in_turn", 60, message="first turn")
    second = subprocess.run([sys.executable, "-m", "overstory.agents.loop", "--project", str(project.root),
                             "--agent", "builder-t1", "--generation", str(result.generation)],
                            capture_output=True, text=True, timeout=90)
    assert second.returncode == 0  # found the lock held by a live loop and left (after a bounded wait)
    assert len(loop_processes("builder-t1", project.root)) == 1
    release.touch()
    assert wait_terminal(project, "builder-t1").state == "completed"


def test_global_turn_limit(project, tmp_path):
    env = {"OV_TURNS_MAX_CONCURRENT": "1"}
    for task in ("a", "b"):
        start(project, tmp_path, [{"actions": [{"sleep": 1}, REPORT]}], name_task=task, env=env)
    for name in ("builder-a", "builder-b"):
        assert wait_terminal(project, name).state == "completed"
    spans = sorted((r["started_at"], r["ended_at"]) for n in ("builder-a", "builder-b") for r in turn_rows(project, n))
    assert spans[0][1] <= spans[1][0], spans


def test_a_missing_runtime_makes_a_zombie_not_a_crash_loop(project, tmp_path):
    """The claude binary vanishing after sling is a permanent failure with a reason, reported once."""
    env = {**os.environ, "OV_RUNTIME_CLAUDE_BIN": sys.executable}  # exists at sling time
    config = load_config(project.config_file, project.local_config_file, environ=env)
    conn = open_state(project.state_db)
    try:
        sling(project, config, conn, SlingRequest(capability="builder", task_id="gone", runtime="claude"),
              {**env, "OV_RUNTIME_CLAUDE_BIN": str(tmp_path / "no-such-claude")})
    finally:
        conn.close()
    agent = wait_terminal(project, "builder-gone")
    assert agent.state == "zombie" and "no-such-claude" in (agent.state_reason or "")
    assert len(mail_rows(project, type="worker_died")) == 1
