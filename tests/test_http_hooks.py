"""Claude's tool-call hooks over HTTP (issue 20): the agent's endpoint answers PreToolUse/PostToolUse.

A real endpoint with its real TCP listener on 127.0.0.1, real SQLite, and real HTTP requests
shaped as Claude Code sends them (CLAUDE_PROBE_NOTES.md, "HTTP hooks"). The same guard rows
also run through `ov guard` as a process, and the two answers must agree. The end-to-end
version with the real claude CLI is tests/e2e/test_http_hooks_claude.py.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import typing as t

import pytest

from conftest import ov_command, run_git
from overstory.endpoint.client import ENDPOINT_ENV, TOKEN_ENV
from overstory.endpoint.routes import ROUTES
from overstory.endpoint.server import AgentEndpoint
from overstory.paths import ProjectPaths
from overstory.store import sessions
from requires import missing

AGENT = "builder-h"


@pytest.fixture
def served(project: ProjectPaths, state_db: t.Any) -> t.Iterator[tuple[AgentEndpoint, dict[str, str]]]:
    """A builder with a worktree, its endpoint serving HTTP hooks, and one turn open."""
    base = run_git(project.root, "symbolic-ref", "--short", "HEAD").strip()
    worktree = project.worktree(AGENT)
    run_git(project.root, "worktree", "add", "-q", "-b", f"ov/{AGENT}", str(worktree), base)
    sessions.create_session(state_db, name=AGENT, capability="builder", task_id="t-h", runtime="claude",
                            actor="test", parent="operator", depth=0, branch=f"ov/{AGENT}", base_branch=base,
                            worktree=str(worktree))
    endpoint = AgentEndpoint(project, AGENT, 1, ROUTES).start()
    endpoint.serve_hooks()
    secret = endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": "turn-1"})
    env = guard_env(project, worktree, secret)
    endpoint.set_turn_env(env)
    yield endpoint, env
    endpoint.close()


def guard_env(project: ProjectPaths, worktree: t.Any, secret: dict[str, str]) -> dict[str, str]:
    """The turn's environment, as the agent's CLI (and so a command hook) sees it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}
    env.update(secret)
    env.update({"OVERSTORY_AGENT_NAME": AGENT, "OVERSTORY_CAPABILITY": "builder", "OVERSTORY_TASK_ID": "t-h",
                "OVERSTORY_PROJECT_ROOT": str(project.root), "OVERSTORY_WORKTREE": str(worktree),
                "OVERSTORY_BRANCH": f"ov/{AGENT}", "OVERSTORY_GENERATION": "1", "OVERSTORY_PARENT": "operator",
                "OVERSTORY_TURN_ID": "turn-1"})
    return env


def post(port: int, path: str, body: t.Any, token: str | None) -> tuple[int, t.Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        conn.request("POST", path, json.dumps(body), headers)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    finally:
        conn.close()


def pre_input(tool: str, tool_input: dict[str, t.Any], cwd: str, use_id: str = "toolu_1") -> dict[str, t.Any]:
    return {"session_id": "s", "cwd": cwd, "hook_event_name": "PreToolUse", "tool_name": tool,
            "tool_input": tool_input, "tool_use_id": use_id, "permission_mode": "bypassPermissions"}


def test_the_listener_answers_only_the_current_turns_secret(served: t.Any) -> None:
    endpoint, env = served
    port = endpoint.hooks.port
    call = pre_input("Read", {"file_path": "README.md"}, env["OVERSTORY_WORKTREE"])
    assert post(port, "/v1/hook.pre", call, env[TOKEN_ENV]) == (200, {})
    assert post(port, "/v1/hook.pre", call, "wrong")[0] == 401
    assert post(port, "/v1/hook.pre", call, None)[0] == 401
    assert post(port, "/v1/mail.send", {"to": "operator", "subject": "x"}, env[TOKEN_ENV])[0] == 404
    endpoint.revoke()  # the turn ended: a late request is refused
    assert post(port, "/v1/hook.pre", call, env[TOKEN_ENV])[0] == 401
    fresh = endpoint.open_turn()
    assert post(port, "/v1/hook.pre", call, env[TOKEN_ENV])[0] == 401  # the previous turn's secret
    assert post(port, "/v1/hook.pre", call, fresh[TOKEN_ENV])[0] == 200


def test_a_closed_listener_refuses_the_connection(served: t.Any) -> None:
    endpoint, env = served
    port = endpoint.hooks.port
    endpoint.hooks.close()
    with pytest.raises(ConnectionRefusedError):
        post(port, "/v1/hook.pre", pre_input("Read", {"file_path": "x"}, "/"), env[TOKEN_ENV])


def test_the_ledger_gets_both_halves_of_a_call(served: t.Any, state_db: t.Any) -> None:
    endpoint, env = served
    port, token = endpoint.hooks.port, env[TOKEN_ENV]
    call = pre_input("Bash", {"command": "git status"}, env["OVERSTORY_WORKTREE"], use_id="toolu_ledger")
    assert post(port, "/v1/hook.pre", call, token) == (200, {})
    done = {**call, "hook_event_name": "PostToolUse", "tool_response": {"stdout": "clean", "stderr": ""},
            "duration_ms": 4}
    assert post(port, "/v1/hook.post", done, token) == (200, {})
    [row] = [dict(r) for r in state_db.execute("SELECT * FROM tool_calls WHERE agent = ?", (AGENT,))]
    assert (row["status"], row["turn_id"], row["tool_use_id"]) == ("succeeded", "turn-1", "toolu_ledger")
    assert "clean" in row["receipt"]


def rows(worktree: str, project_root: str) -> list[tuple[str, dict[str, t.Any]]]:
    """Calls of several kinds, each with a decision the guard is sure of (allowed and refused)."""
    return [
        ("Read", {"file_path": f"{project_root}/README.md"}),
        ("Write", {"file_path": f"{worktree}/new.txt", "content": "x"}),
        ("Write", {"file_path": f"{project_root}/README.md", "content": "x"}),
        ("Write", {"file_path": f"{project_root}/.overstory/config.yaml", "content": "x"}),
        ("Bash", {"command": "echo hi > out.txt"}),
        ("Bash", {"command": f"touch {project_root}/x"}),
        ("Bash", {"command": "touch {" + project_root + "/x,y}"}),
        ("Bash", {"command": f"git --exec-path={worktree} reset --hard HEAD~1"}),
        ("Bash", {"command": "git config core.hooksPath /tmp/h"}),
        ("Bash", {"command": "git push --force origin main"}),
        ("Bash", {"command": "ov mail send --from operator --to lead --subject s"}),
        ("Bash", {"command": "ov stop someone --clean"}),
        ("Bash", {"command": "rm -rf .claude"}),
        ("Bash", {"command": "pytest -q"}),
        ("Task", {"prompt": "do it", "description": "d"}),
        ("Edit", {"file_path": f"{worktree}/a.py", "old_string": "a", "new_string": "b"}),
    ]


def test_the_http_hook_and_the_command_hook_decide_alike(served: t.Any) -> None:
    """The guard table through both paths: the same decisions, and the same reasons."""
    endpoint, env = served
    worktree, root = env["OVERSTORY_WORKTREE"], env["OVERSTORY_PROJECT_ROOT"]
    command_env = {k: v for k, v in env.items() if k not in (ENDPOINT_ENV, TOKEN_ENV)}  # the command path alone
    verdicts = []
    for number, (tool, tool_input) in enumerate(rows(worktree, root)):
        call = pre_input(tool, tool_input, worktree, use_id=f"toolu_{number}")
        status, answer = post(endpoint.hooks.port, "/v1/hook.pre", call, env[TOKEN_ENV])
        assert status == 200, answer
        over_http = answer.get("hookSpecificOutput", {}).get("permissionDecisionReason") if answer else None
        ran = subprocess.run([*ov_command(), "guard"], input=json.dumps({**call, "tool_use_id": f"toolu_c{number}"}),
                             cwd=worktree, env=command_env, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        as_process = json.loads(ran.stdout)["hookSpecificOutput"]["permissionDecisionReason"] if ran.stdout else None
        verdicts.append((tool, json.dumps(tool_input)[:60], over_http, as_process))
    assert all(http == process for _, _, http, process in verdicts), [v for v in verdicts if v[2] != v[3]]
    allowed = [v for v in verdicts if v[2] is None]
    refused = [v for v in verdicts if v[2] is not None]
    assert len(allowed) >= 5 and len(refused) >= 9, verdicts


def _raw(port: int, data: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_one_kept_alive_connection_serves_call_after_call_and_bad_requests_get_400(served: t.Any) -> None:
    """The listener's own HTTP/1.1 (endpoint.http1): requests one after another on one connection, as
    the CLI sends them; a malformed one is answered 400 and the connection closed, never a crash."""
    endpoint, env = served
    call = json.dumps(pre_input("Read", {"file_path": "README.md"}, env["OVERSTORY_WORKTREE"])).encode()
    one = (f"POST /v1/hook.pre HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env[TOKEN_ENV]}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(call)}\r\n\r\n").encode() + call
    answers = _raw(endpoint.hooks.port, one * 3)
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 3 and answers.endswith(b"{}")
    for garbage in (b"NONSENSE\r\n\r\n", b"POST /v1/hook.pre HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                    b"POST /v1/hook.pre HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                    b"POST /v1/hook.pre HTTP/1.1\r\nBroken header\r\n\r\n"):
        answer = _raw(endpoint.hooks.port, garbage + one)
        assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1") == 1, answer
    assert post(endpoint.hooks.port, "/v1/hook.pre", json.loads(call), env[TOKEN_ENV]) == (200, {})


@pytest.mark.parametrize(("runtime", "config", "expected"), [
    ("claude", {}, "http"),
    ("claude", {"sandbox": {"network": {"default": True, "builder": False}}}, "command"),  # its own loopback
    ("claude", {"sandbox": {"mode": "off", "network": False}}, "http"),  # no sandbox: the host's loopback
    ("claude", {"guards": {"hook_transport": "command"}}, "command"),
    ("scripted", {}, "http"),  # its player runs HTTP hooks as claude does
    ("codex", {}, "command"),
])
def test_which_agents_get_http_hooks(tmp_path: t.Any, runtime: str, config: dict[str, t.Any], expected: str) -> None:
    import yaml

    from overstory.config.model import load_config
    from overstory.endpoint.hooks import transport_for
    from sandbox_helpers import probe

    if not probe().ok and config.get("sandbox", {}).get("mode") != "off" and "network" in config.get("sandbox", {}):
        missing("needs a working bubblewrap")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert transport_for(load_config(path), runtime, "builder") == expected


def test_a_scripted_agent_is_guarded_over_http_and_a_gone_listener_blocks_its_next_call(
        project: ProjectPaths, tmp_path: t.Any) -> None:
    """The scripted runtime plays Claude's HTTP hooks: its calls are decided by the loop's listener, and
    once that listener is gone (closed after one answer by a test hook) the next call is refused, not run.
    The next turn gets a new listener. (Real claude: tests/e2e/test_http_hooks_claude.py.)"""
    from agent_helpers import agent_state, wait_for, wait_terminal

    scenario = project.ov_dir / "scenario-http.json"
    scenario.write_text(json.dumps({"turns": [
        {"actions": [{"bash": "touch first.txt"}, {"bash": "touch second.txt"}], "result": "stopping"},
        {"actions": [{"bash": "touch third.txt"},
                     {"bash": "ov mail send --type worker_done --subject done --body ok"}], "result": "done"},
    ]}))
    env = {**os.environ, "OV_TEST_HOOKS_CLOSE_AFTER": "1"}
    slung = subprocess.run([*ov_command(), "sling", "builder", "http", "--runtime", "scripted", "--scenario",
                            str(scenario)], cwd=project.root, env=env, capture_output=True, text=True, timeout=120)
    assert slung.returncode == 0, slung.stderr
    name, worktree = "builder-http", project.worktree("builder-http")
    wait_for(lambda: (a := agent_state(project, name)) and a.turns >= 1 and a.state == "between_turns", 60,
             message="the first turn to end")
    assert (project.run_dir / name / "hook_transport").read_text().startswith("http ")
    assert (worktree / "first.txt").exists() and not (worktree / "second.txt").exists()
    sent = subprocess.run([*ov_command(), "mail", "send", "--to", name, "--subject", "go on"], cwd=project.root,
                          env=env, capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    assert wait_terminal(project, name, timeout=60).state == "completed"
    assert (worktree / "third.txt").exists()
    # One hook per call: the loop took each receipt from the turn's stream.
    assert set(json.loads((project.run_dir / name / "settings.http.json").read_text())["hooks"]) == {"PreToolUse"}
    from overstory.store import ledger
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        rows = {r["input"]: r for r in ledger.calls(conn, agent=name)}
    finally:
        conn.close()
    ran = [(r["status"], r["exit_code"], r["source"]) for key, r in rows.items() if "first.txt" in key or "third" in key]
    assert ran == [("succeeded", 0, "hook"), ("succeeded", 0, "hook")]


def test_headless_settings_have_one_tool_hook_and_tmux_keeps_the_receipt_hook(tmp_path: t.Any) -> None:
    """Headless turns take receipts from the stream, so neither transport asks for a PostToolUse hook; a
    command-hook settings file an older ov wrote with one loses it in the HTTP settings. Tmux mode, which
    has no stream for ov to read, keeps `ov guard --post`."""
    from overstory.endpoint.hooks import write_settings
    from overstory.runtimes.claude import hook_settings

    headless, tmux = hook_settings(["ov"], tmux_mode=False), hook_settings(["ov"], tmux_mode=True)
    assert set(headless["hooks"]) == {"PreToolUse"}
    assert tmux["hooks"]["PostToolUse"][0]["hooks"][0]["command"] == "ov guard --post"
    assert {"PreToolUse", "PostToolUse", "PostToolUseFailure", "UserPromptSubmit"} <= set(tmux["hooks"])
    older = {**headless, "hooks": {**headless["hooks"], "PostToolUse": tmux["hooks"]["PostToolUse"],
                                   "PostToolUseFailure": tmux["hooks"]["PostToolUse"]}, "model": "kept"}
    (tmp_path / "settings.json").write_text(json.dumps(older))
    written = json.loads(write_settings(tmp_path, "settings.json", 4321).read_text())
    assert set(written["hooks"]) == {"PreToolUse"} and written["model"] == "kept"
    assert written["hooks"]["PreToolUse"][0]["hooks"][0]["url"] == "http://127.0.0.1:4321/v1/hook.pre"


def test_another_agents_secret_does_not_open_this_listener(served: t.Any, project: ProjectPaths,
                                                           state_db: t.Any) -> None:
    """An agent that finds a neighbour's hook port (127.0.0.1 is shared when the network is) and posts
    receipts or calls with its own turn's secret is refused, and nothing is written to the neighbour's ledger."""
    endpoint, env = served
    sessions.create_session(state_db, name="builder-other", capability="builder", task_id="t-o", runtime="claude",
                            actor="test", parent="operator", depth=0)
    other = AgentEndpoint(project, "builder-other", 1, ROUTES).start()
    try:
        other.serve_hooks()
        its_secret = other.open_turn()[TOKEN_ENV]
        call = pre_input("Bash", {"command": "git status"}, env["OVERSTORY_WORKTREE"], use_id="toolu_forged")
        forged = {**call, "hook_event_name": "PostToolUse", "tool_response": {"stdout": "pushed"}}
        assert post(endpoint.hooks.port, "/v1/hook.pre", call, its_secret)[0] == 401
        assert post(endpoint.hooks.port, "/v1/hook.post", forged, its_secret)[0] == 401
        assert state_db.execute("SELECT COUNT(*) FROM tool_calls").fetchone()[0] == 0
    finally:
        other.close()


def test_an_endpoint_lets_its_request_threads_in_quickly(tmp_path) -> None:
    """A hook's thread must not wait a whole default GIL switch interval (5 ms) behind the loop's other threads."""
    import sys

    from overstory.endpoint.server import SWITCH_INTERVAL_S, AgentEndpoint
    from overstory.paths import ProjectPaths

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    endpoint = AgentEndpoint(ProjectPaths(tmp_path), "builder-x", 1, {})
    try:
        endpoint.start()
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S + 1e-9
    finally:
        endpoint.close()
        sys.setswitchinterval(before)


def test_a_call_refused_by_a_budget_limit_also_ends_claudes_turn(served: t.Any, state_db: t.Any) -> None:
    """A limit's refusal carries ``"continue": false``: claude then stops without sending the refusal to the
    model in one more (billed) request (CLAUDE_PROBE_NOTES.md, "A hook that ends the turn"). A refusal by
    the policy does not end the turn: the model reads why and does something else."""
    from overstory.store import budgets

    endpoint, env = served
    budgets.create_agent(state_db, AGENT, 1, run_id=None, limits={"max_tool_calls": 1})
    port, token, cwd = endpoint.hooks.port, env[TOKEN_ENV], env["OVERSTORY_WORKTREE"]
    forced = post(port, "/v1/hook.pre", pre_input("Bash", {"command": "git push --force origin main"}, cwd), token)
    assert forced[0] == 200 and forced[1]["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "continue" not in forced[1], forced
    assert post(port, "/v1/hook.pre", pre_input("Bash", {"command": "git status"}, cwd, "toolu_2"), token) == (200, {})
    status, answer = post(port, "/v1/hook.pre", pre_input("Bash", {"command": "git log"}, cwd, "toolu_3"), token)
    assert status == 200 and answer["hookSpecificOutput"]["permissionDecision"] == "deny", answer
    assert answer["continue"] is False and answer["stopReason"].startswith("budget: max_tool_calls reached"), answer
