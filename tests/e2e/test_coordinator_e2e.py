"""A coordinator and a builder, both the REAL Claude Code CLI, each talking to its own mock model.

The operator starts the coordinator and sends it an objective. The scripted coordinator
model tries to write a file (the guard, passed with --settings, refuses), slings a
builder, merges the builder's branch when it reports, answers a question, and reports
to the operator. The scripted builder model writes greet() and its test, runs the test,
commits, and sends merge_ready and worker_done. Config `providers`/`models` route each
agent to its own mock, which also proves that every request reached the right one.

The models are small state machines over the conversation, not fixed lists: mail can
arrive one message per turn or several at once, and the script must not care.
"""

from __future__ import annotations

import json
import re
import typing as t
from pathlib import Path

import yaml

from agent_helpers import wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, Reply, text_reply, tool_reply
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import mail, sessions
from overstory.store.db import open_events, open_state

OBJECTIVE = "add a greet() function and its test"
MODEL = "claude-sonnet-4-5"

# ---- reading a Messages API request ------------------------------------------------------------------


def _blocks(message: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text(message: dict[str, t.Any]) -> str:
    parts = []
    for block in _blocks(message):
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            inner = block.get("content")
            parts.append(inner if isinstance(inner, str) else _text({"content": inner}))
    return "\n".join(parts)


def _tool_calls(body: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    """Every tool_use the model made so far in this conversation (history included)."""
    return [b for m in body.get("messages", []) if m.get("role") == "assistant" for b in _blocks(m)
            if b.get("type") == "tool_use"]


def _ran(body: dict[str, t.Any], needle: str) -> bool:
    return any(needle in json.dumps(call.get("input", {})) for call in _tool_calls(body))


def _is_tool_result(message: dict[str, t.Any]) -> bool:
    return any(b.get("type") == "tool_result" for b in _blocks(message))


def _bash(command: str, what: str) -> Reply:
    return tool_reply("Bash", {"command": command, "description": what})


# ---- the two scripted models ------------------------------------------------------------------------


def coordinator_model(project_root: Path) -> t.Callable[[dict[str, t.Any]], Reply]:
    probe = str(project_root / "coordinator-probe.txt")
    sling = (f'ov sling builder greet --prompt "{OBJECTIVE}: greet(name) returns \'Hello, <name>!\'; '
             'test it in test_greet.py" --files greet.py --files test_greet.py')

    def reply(body: dict[str, t.Any]) -> Reply:
        last = body["messages"][-1]
        if _is_tool_result(last):
            previous = json.dumps(_tool_calls(body)[-1].get("input", {}))
            if probe in previous:
                return _bash(sling, "sling a builder")
            if "ov sling" in previous:
                return text_reply("Slung builder-greet; waiting for its report.")
            if "ov merge" in previous:
                return _bash('ov mail send --to operator --type result --subject "greet() is merged" '
                             '--body "builder-greet added greet() and test_greet.py; merged into main."', "report")
            return text_reply("Done for now.")
        prompt = _text(last)
        if "Type: question" in prompt:
            asked = re.findall(r"=== BEGIN MESSAGE #(\d+) ===\nFrom: [^\n]*\nTo: [^\n]*\nType: question", prompt)
            return _bash(f'ov mail reply {asked[-1]} --body "one builder, merged into main"', "answer")
        if OBJECTIVE in prompt and not _ran(body, "ov sling"):
            return tool_reply("Write", {"file_path": probe, "content": "coordinators do not write\n"})
        if re.search(r"Type: (merge_ready|worker_done)", prompt) and not _ran(body, "ov merge"):
            return _bash("ov merge builder-greet", "merge the builder's branch")
        return text_reply("Nothing to act on.")

    return reply


BUILDER_STEPS = [
    "cat > greet.py <<'EOF'\ndef greet(name):\n    return f\"Hello, {name}!\"\nEOF",
    "cat > test_greet.py <<'EOF'\nfrom greet import greet\n\n\ndef test_greet():\n"
    "    assert greet(\"Ada\") == \"Hello, Ada!\"\nEOF",
    "python -m pytest -q -p no:cacheprovider test_greet.py",
    "git add greet.py test_greet.py && git commit -q -m 'greet: add greet() and its test'",
    "ov mail send --type merge_ready --to coordinator --subject 'merge_ready: builder-greet' "
    "--body 'greet() and its test' --payload '{\"files_modified\": [\"greet.py\", \"test_greet.py\"]}'",
    "ov mail send --type worker_done --subject 'greet: done' --body 'greet() added, test passes' "
    "--payload '{\"files_modified\": [\"greet.py\", \"test_greet.py\"]}'",
]


def builder_model(body: dict[str, t.Any]) -> Reply:
    for step in BUILDER_STEPS:
        if not _ran(body, json.dumps(step)[1:-1]):
            return _bash(step, "next step")
    return text_reply("Nothing more to do.")


# ---- the test ---------------------------------------------------------------------------------------


def _configure(project: ProjectPaths, coordinator_url: str, builder_url: str) -> None:
    project.local_config_file.write_text(yaml.safe_dump({
        "runtime": {"default": "claude", "claude_bin": CLAUDE_BIN or "claude"},
        "turns": {"stall_timeout": 120, "retry_backoff": 0.2},
        "providers": {"mockc": {"base_url": coordinator_url, "api_key_env": "MOCKC_KEY"},
                      "mockb": {"base_url": builder_url, "api_key_env": "MOCKB_KEY"}},
        "models": {"coordinator": f"mockc/{MODEL}", "builder": f"mockb/{MODEL}"},
    }))


def _idle(project: ProjectPaths, name: str) -> bool:
    conn = open_state(project.state_db)
    try:
        agent = sessions.get(conn, name)
        return agent is not None and agent.state == "between_turns" and mail.pending_count(conn, name) == 0
    finally:
        conn.close()


def _operator_results(project: ProjectPaths) -> list[mail.Message]:
    conn = open_state(project.state_db)
    try:
        return mail.list_messages(conn, to="operator", sender="coordinator", type="result", limit=None)
    finally:
        conn.close()


def _summaries(project: ProjectPaths) -> list[mail.Message]:
    conn = open_state(project.state_db)
    try:
        return mail.list_messages(conn, to="coordinator", sender="ov", limit=None)
    finally:
        conn.close()


@requires_claude
def test_coordinator_slings_a_builder_merges_and_reports(project: ProjectPaths, tmp_path: Path) -> None:
    with MockMessagesAPI(coordinator_model(project.root)) as coordinator_api, \
            MockMessagesAPI(builder_model) as builder_api:
        _configure(project, coordinator_api.base_url, builder_api.base_url)
        env = claude_env("http://127.0.0.1:9", tmp_path, extra={"MOCKC_KEY": "sk-mock-coordinator",
                                                                "MOCKB_KEY": "sk-mock-builder"})
        try:
            started = run_ov("coordinator", "start", "--json", cwd=project.root, env=env)
            assert started.returncode == 0, started.stderr
            run_id = json.loads(started.stdout)["run_id"]
            wait_for(lambda: _idle(project, "coordinator"), 90, message="the coordinator's first turn")
            sent = run_ov("coordinator", "send", OBJECTIVE, cwd=project.root, env=env)
            assert sent.returncode == 0, sent.stderr

            builder = wait_terminal(project, "builder-greet", timeout=240)
            assert builder.state == "completed", builder.state_reason
            report = wait_for(lambda: _operator_results(project), 180, message="the report to the operator")
            assert report[0].subject == "greet() is merged"

            answer = run_ov("coordinator", "ask", "what is the state?", "--timeout", "120", cwd=project.root,
                            env=env, timeout=180)
            assert answer.returncode == 0, answer.stderr
            assert answer.stdout.strip() == "one builder, merged into main"
            # The run summary is the last mail of this run: once it was read, the run is quiet.
            wait_for(lambda: any(m.read_at for m in _summaries(project)), 120, message="the run summary's turn")
            wait_for(lambda: _idle(project, "coordinator"), 120, message="the coordinator to settle")

            # The function is on the target branch, tested, and the probe write was refused.
            assert 'return f"Hello, {name}!"' in run_git(project.root, "show", "main:greet.py")
            assert "def test_greet" in run_git(project.root, "show", "main:test_greet.py")
            assert not (project.root / "coordinator-probe.txt").exists()
            probe_results = [m for r in coordinator_api.main_requests for m in r["messages"]
                             if _is_tool_result(m) and "read-only" in _text(m)]
            assert probe_results, "the guard's refusal (hooks from --settings) must reach the coordinator model"

            # Each agent talked only to its own mock, with its own instructions and key.
            for request in coordinator_api.main_requests:
                assert "# Role: coordinator" in json.dumps(request.get("system"))
                assert request["_headers"].get("x-api-key") == "sk-mock-coordinator"
            for request in builder_api.main_requests:
                assert "builder-greet" in json.dumps(request)
                assert "# Role: coordinator" not in json.dumps(request.get("system"))
                assert request["_headers"].get("x-api-key") == "sk-mock-builder"

            # The coordinator is still alive: persistent, between turns, its loop running.
            conn = open_state(project.state_db)
            try:
                coordinator = sessions.get(conn, "coordinator")
                turn_rows = conn.execute("SELECT agent, status, cost_usd FROM turns").fetchall()
                session_cost = conn.execute("SELECT sum(cost_usd) FROM sessions").fetchone()[0]
            finally:
                conn.close()
            assert coordinator.state == "between_turns"
            assert procs.is_alive(coordinator.loop_pid, coordinator.loop_start_ticks)
            summaries = _summaries(project)
            assert len(summaries) == 1 and "all 1 agent(s) finished (1 completed)" in summaries[0].subject

            # `ov run show` accounts for every turn and its cost.
            shown = run_ov("run", "show", run_id, "--json", cwd=project.root, env=env)
            assert shown.returncode == 0, shown.stderr
            document = json.loads(shown.stdout)
            events = open_events(project.events_db)
            try:
                ended = events.execute("SELECT count(*) FROM events WHERE kind = 'turn_end'").fetchone()[0]
            finally:
                events.close()
            totals = document["totals"]
            assert totals["turns"] == len(turn_rows) == ended == len(document["turns"])
            assert all(r["status"] == "ok" for r in turn_rows)
            assert totals["cost_usd"] > 0
            assert abs(totals["cost_usd"] - sum(r["cost_usd"] for r in turn_rows)) < 1e-9
            assert abs(totals["cost_usd"] - session_cost) < 1e-6
            assert all(turn["cost_usd"] > 0 for turn in document["turns"])
            by_agent = {a["name"]: a for a in document["agents"]}
            assert set(by_agent) == {"coordinator", "builder-greet"}
            assert by_agent["builder-greet"]["state"] == "completed" and by_agent["builder-greet"]["turns"] >= 1
            assert by_agent["coordinator"]["turns"] >= 4
            assert len(coordinator_api.main_requests) >= by_agent["coordinator"]["turns"]
            assert len(builder_api.main_requests) >= len(BUILDER_STEPS)
        finally:
            run_ov("coordinator", "stop", "--all", "--force", cwd=project.root, env=env)
