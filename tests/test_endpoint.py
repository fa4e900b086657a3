"""An agent's endpoint: the per-turn secret, who the caller is, and what each capability may ask.

The endpoint runs here in the test process (as it runs in an agent's loop), on a real unix
socket, with real SQLite; requests go through the real client, and through the real `ov`
commands an agent runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t

import pytest

from conftest import ov_command, run_git
from overstory.endpoint.client import ENDPOINT_ENV, TOKEN_ENV, Channel
from overstory.endpoint.routes import ROUTES
from overstory.endpoint.server import AgentEndpoint
from overstory.errors import EndpointError
from overstory.paths import ProjectPaths
from overstory.store import mail, sessions
from overstory.store.db import open_events, open_state


def agent_row(conn: t.Any, project: ProjectPaths, name: str, capability: str, parent: str = "operator",
              branch: bool = False) -> None:
    base = run_git(project.root, "symbolic-ref", "--short", "HEAD").strip()
    if branch:
        run_git(project.root, "branch", f"ov/{name}", base)
    sessions.create_session(conn, name=name, capability=capability, task_id=f"t-{name}", runtime="scripted",
                            actor="test", parent=parent, depth=0 if parent == "operator" else 1,
                            branch=f"ov/{name}" if branch else None, base_branch=base)


@pytest.fixture
def team(project: ProjectPaths, state_db: t.Any) -> ProjectPaths:
    agent_row(state_db, project, "lead-1", "lead")
    agent_row(state_db, project, "builder-a", "builder", parent="lead-1", branch=True)
    agent_row(state_db, project, "merger-m", "merger", parent="lead-1", branch=True)
    agent_row(state_db, project, "builder-x", "builder", branch=True)  # not under lead-1
    return project


@pytest.fixture
def serve(team: ProjectPaths) -> t.Iterator[t.Callable[[str], Channel]]:
    """Start the endpoint of an agent with a turn open; returns a client holding that turn's secret."""
    started: list[AgentEndpoint] = []

    def start(name: str) -> Channel:
        conn = open_state(team.state_db)
        try:
            generation = sessions.get(conn, name).generation  # type: ignore[union-attr]
        finally:
            conn.close()
        endpoint = AgentEndpoint(team, name, generation, ROUTES).start()
        started.append(endpoint)
        env = endpoint.open_turn()
        return Channel(env[ENDPOINT_ENV], env[TOKEN_ENV])

    yield start
    for endpoint in started:
        endpoint.close()


def refusals(project: ProjectPaths, agent: str) -> list[str]:
    conn = open_events(project.events_db)
    try:
        return [r[0] for r in conn.execute("SELECT summary FROM events WHERE kind='endpoint_refused' AND agent=?",
                                           (agent,))]
    finally:
        conn.close()


def test_only_the_current_turns_secret_is_accepted(team: ProjectPaths, serve: t.Any) -> None:
    channel = serve("builder-a")
    assert channel.call("status", {})["totals"]["agents"] == 4
    with pytest.raises(EndpointError, match="not authorized"):
        Channel(channel.socket_path, "guessed").call("status", {})
    with pytest.raises(EndpointError, match="no endpoint route"):
        channel.call("nope", {})


def test_a_revoked_secret_is_refused(team: ProjectPaths) -> None:
    conn = open_state(team.state_db)
    generation = sessions.get(conn, "builder-a").generation  # type: ignore[union-attr]
    conn.close()
    endpoint = AgentEndpoint(team, "builder-a", generation, ROUTES).start()
    try:
        env = endpoint.open_turn()
        channel = Channel(env[ENDPOINT_ENV], env[TOKEN_ENV])
        channel.call("status", {})
        endpoint.revoke()  # the turn ended
        with pytest.raises(EndpointError, match="not authorized"):
            channel.call("status", {})
        fresh = endpoint.open_turn()
        assert fresh[TOKEN_ENV] != env[TOKEN_ENV]
        with pytest.raises(EndpointError, match="not authorized"):
            channel.call("status", {})
    finally:
        endpoint.close()
    assert not (team.run_dir / "builder-a" / "ov.sock").exists()


def test_idle_connections_close_between_turns_and_reopen(team: ProjectPaths) -> None:
    """The loop closes the endpoint's pooled connections when a turn is over (issue 34: memory of an idle loop);
    the next request opens a pair again, and one a request holds is not closed under it."""
    conn = open_state(team.state_db)
    generation = sessions.get(conn, "builder-a").generation  # type: ignore[union-attr]
    conn.close()
    endpoint = AgentEndpoint(team, "builder-a", generation, ROUTES).start()
    try:
        env = endpoint.open_turn()
        channel = Channel(env[ENDPOINT_ENV], env[TOKEN_ENV])
        assert channel.call("status", {})["totals"]["agents"] == 4
        held = endpoint._connections()  # the pooled pair, as a request holds it when the turn ends
        endpoint.close_idle_connections()
        assert held[0].execute("SELECT 1").fetchone()[0] == 1 and held[1].execute("SELECT 1").fetchone()[0] == 1
        endpoint._release(*held)
        endpoint.close_idle_connections()
        endpoint.close_idle_connections()
        assert endpoint._pool.empty()
        for closed in held:
            with pytest.raises(Exception, match="closed"):
                closed.execute("SELECT 1")
        assert channel.call("status", {})["totals"]["agents"] == 4
        channel.call("mail.send", {"to": "builder-x", "subject": "after the pool closed", "from": "builder-a"})
    finally:
        endpoint.close()


def test_mail_always_comes_from_the_caller(team: ProjectPaths, serve: t.Any, state_db: t.Any) -> None:
    channel = serve("builder-a")
    with pytest.raises(EndpointError, match="cannot send mail as 'operator'") as refused:
        channel.call("mail.send", {"to": "builder-x", "subject": "do this", "from": "operator"})
    assert refused.value.exit_code == 1
    assert any("cannot send mail as" in r for r in refusals(team, "builder-a"))
    sent = channel.call("mail.send", {"to": "builder-x", "subject": "hi", "body": "b", "from": "builder-a"})
    assert sent["to"] == ["builder-x"]
    row = state_db.execute("SELECT sender FROM mail WHERE id = ?", (sent["ids"][0],)).fetchone()
    assert row["sender"] == "builder-a"
    # Protocol payload fields come from the caller's row, never from its environment.
    done = channel.call("mail.send", {"type": "worker_done", "subject": "done"})
    payload = json.loads(state_db.execute("SELECT payload, recipient FROM mail WHERE id = ?",
                                          (done["ids"][0],)).fetchone()["payload"])
    assert payload["agent"] == "builder-a" and payload["branch"] == "ov/builder-a" and payload["task_id"] == "t-builder-a"
    with pytest.raises(EndpointError, match="may check only its own mail"):
        channel.call("mail.check", {"agent": "builder-x"})
    with pytest.raises(EndpointError, match="cannot send mail as 'lead-1'"):
        channel.call("mail.reply", {"id": sent["ids"][0], "body": "x", "from": "lead-1"})


def test_checking_mail_reads_only_the_callers_inbox(team: ProjectPaths, serve: t.Any, state_db: t.Any) -> None:
    mail.send(state_db, sender="operator", to="builder-a", subject="for a")
    mail.send(state_db, sender="operator", to="builder-x", subject="for x")
    channel = serve("builder-a")
    got = channel.call("mail.check", {})
    assert [m["subject"] for m in got] == ["for a"]
    assert mail.pending_count(state_db, "builder-x") == 1


def test_stop_only_descendants(team: ProjectPaths, serve: t.Any, state_db: t.Any) -> None:
    lead = serve("lead-1")
    with pytest.raises(EndpointError, match="only stop its own descendants"):
        lead.call("stop", {"agent": "builder-x", "clean": True, "force": True})
    with pytest.raises(EndpointError, match="only stop its own descendants"):
        serve("builder-a").call("stop", {"agent": "lead-1"})
    assert sessions.get(state_db, "builder-x").state == "booting"  # type: ignore[union-attr]
    stopped = lead.call("stop", {"agent": "builder-a", "force": True})
    assert stopped["state"] == "completed"
    row = state_db.execute("SELECT actor FROM transitions WHERE name='builder-a' ORDER BY id DESC").fetchone()
    assert row["actor"] == "lead-1"


def test_sling_and_merge_are_for_their_capabilities(team: ProjectPaths, serve: t.Any) -> None:
    builder = serve("builder-a")
    with pytest.raises(EndpointError, match="only coordinator and lead agents may sling"):
        builder.call("sling", {"capability": "builder", "task_id": "more"})
    with pytest.raises(EndpointError, match="only the coordinator and merger agents may run `ov merge`"):
        builder.call("merge", {"agent": "builder-x"})
    merger = serve("merger-m")
    with pytest.raises(EndpointError, match="only the operator runs it"):
        merger.call("merge", {"all": True})
    with pytest.raises(EndpointError, match="builder-x is not one of them"):
        merger.call("merge", {"agent": "builder-x", "dry_run": True})
    with pytest.raises(EndpointError, match="only into its own base branch"):
        merger.call("merge", {"agent": "builder-a", "into": "elsewhere", "dry_run": True})
    report = merger.call("merge", {"agent": "builder-a", "dry_run": True})
    assert report["dry_run"] and report["branch"] == "ov/builder-a"
    assert len(refusals(team, "merger-m")) == 3


def test_a_long_socket_path_still_works(tmp_path: t.Any, state_db: t.Any, project: ProjectPaths) -> None:
    name = "builder-" + "n" * 60
    agent_row(state_db, project, name, "builder")
    endpoint = AgentEndpoint(project, name, 1, ROUTES).start()
    try:
        assert len(str(endpoint.path)) > 108
        env = endpoint.open_turn()
        assert Channel(env[ENDPOINT_ENV], env[TOKEN_ENV]).call("status", {})["totals"]["agents"] == 1
    finally:
        endpoint.close()


def _agent_env(channel: Channel, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}
    env.update({ENDPOINT_ENV: channel.socket_path, TOKEN_ENV: channel.token, "OVERSTORY_AGENT_NAME": "builder-a"})
    env.update(extra)
    return env


def test_ov_commands_inside_an_agent_go_through_its_endpoint(team: ProjectPaths, serve: t.Any,
                                                              state_db: t.Any) -> None:
    channel = serve("builder-a")
    cwd = team.worktrees_dir
    cwd.mkdir(parents=True, exist_ok=True)

    def ov(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ov_command(), *args], cwd=team.root, env=_agent_env(channel, **extra),
                              capture_output=True, text=True, timeout=60)

    sent = ov("mail", "send", "--to", "lead-1", "--subject", "s", "--body", "b", "--json",
              OVERSTORY_AGENT_NAME="operator")  # a lying environment changes nothing
    assert sent.returncode == 0, sent.stderr
    new_id = json.loads(sent.stdout)["ids"][0]
    assert state_db.execute("SELECT sender FROM mail WHERE id=?", (new_id,)).fetchone()["sender"] == "builder-a"
    forged = ov("mail", "send", "--from", "operator", "--to", "lead-1", "--subject", "s")
    assert forged.returncode == 1 and forged.stderr.startswith("ov: error: builder-a cannot send mail as 'operator'")
    assert "Traceback" not in forged.stderr
    stop = ov("stop", "builder-x", "--clean", "--force")
    assert stop.returncode == 1 and "only stop its own descendants" in stop.stderr
    status = ov("status", "--json")
    assert status.returncode == 0 and {a["name"] for a in json.loads(status.stdout)["agents"]} >= {"builder-a"}
    mail.send(state_db, sender="lead-1", to="builder-a", subject="hello there")
    checked = ov("mail", "check")
    assert checked.returncode == 0 and "hello there" in checked.stdout
    gone = ov("mail", "send", "--to", "lead-1", "--subject", "s", **{TOKEN_ENV: "wrong"})
    assert gone.returncode == 1 and "not authorized" in gone.stderr


HEAVY = ("pydantic", "yaml", "rich", "git", "libtmux", "anthropic", "http")


def test_the_agent_side_of_mail_stays_light(team: ProjectPaths, serve: t.Any) -> None:
    channel = serve("builder-a")
    probe = ("import json, sys\nfrom overstory.cli.main import cli\n"
             "for args in json.loads(sys.argv[1]):\n    cli.main(args=args, prog_name='ov', standalone_mode=False)\n"
             "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules} & set(json.loads(sys.argv[2])))))")
    calls = [["mail", "send", "--to", "lead-1", "--subject", "s"], ["mail", "check", "--inject"]]
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(calls), json.dumps(HEAVY)], cwd=team.root,
                          env=_agent_env(channel), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_guard_counts_tool_calls_through_the_endpoint_for_the_caller(team: ProjectPaths, serve: t.Any,
                                                                        state_db: t.Any) -> None:
    """`ov guard` inside a turn counts through the endpoint (state.db is read-only in the sandbox), always
    against the caller's own budget, whatever its environment says; the call past the limit is denied."""
    from overstory.store import budgets

    budgets.create_agent(state_db, "builder-a", 1, run_id=None, limits={"max_tool_calls": 2})
    budgets.create_agent(state_db, "builder-x", 1, run_id=None, limits={"max_tool_calls": 2})
    channel = serve("builder-a")
    hook = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Read", "tool_input": {"file_path": "README.md"},
                       "session_id": "s", "cwd": str(team.root)})
    lying = {"OVERSTORY_AGENT_NAME": "builder-x", "OVERSTORY_PROJECT_ROOT": str(team.root),
             "OVERSTORY_GENERATION": "1", "OVERSTORY_CAPABILITY": "builder"}
    replies = [subprocess.run([*ov_command(), "guard"], input=hook, cwd=team.root, env=_agent_env(channel, **lying),
                              capture_output=True, text=True, timeout=60) for _ in range(3)]
    assert [r.returncode for r in replies] == [0, 0, 0], [r.stderr for r in replies]
    assert replies[0].stdout == replies[1].stdout == ""
    assert "max_tool_calls reached" in replies[2].stdout and '"deny"' in replies[2].stdout
    counted = {r["name"]: (r["tool_calls"], r["refused_tool_calls"])
               for r in state_db.execute("SELECT name, tool_calls, refused_tool_calls FROM budgets")}
    assert counted == {"builder-a": (2, 1), "builder-x": (0, 0)}


def test_approval_gates_and_decisions_go_through_the_endpoint(team: ProjectPaths, state_db: t.Any) -> None:
    """Inside a sandbox `ov guard` cannot write a pending approval, nor `ov approve` decide one: both go
    through the endpoint. The rules are the turn's (as ov exported them), and the decider is the caller,
    whatever the environment of the command claims."""
    from overstory.agents.gate import spec_env

    spec = spec_env([{"match": "Bash(curl *)", "reason": "leaves the machine", "timeout": None}],
                    decider="lead-1", timeout=600, on_timeout="reject")
    endpoints = []

    def channel_of(name: str, **turn_env: str) -> Channel:
        endpoint = AgentEndpoint(team, name, 1, ROUTES).start()
        endpoints.append(endpoint)
        env = endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": f"turn-{name}", **turn_env})
        return Channel(env[ENDPOINT_ENV], env[TOKEN_ENV])

    try:
        builder = channel_of("builder-a", OVERSTORY_APPROVALS=spec)
        hook = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash", "session_id": "s",
                           "tool_input": {"command": "curl -s https://example.com"}, "cwd": str(team.root)})
        lying = {"OVERSTORY_PROJECT_ROOT": str(team.root), "OVERSTORY_CAPABILITY": "builder",
                 "OVERSTORY_APPROVALS": ""}
        held = subprocess.run([*ov_command(), "guard"], input=hook, cwd=team.root,
                              env=_agent_env(builder, **lying), capture_output=True, text=True, timeout=60)
        assert held.returncode == 0, held.stderr
        [gate] = [dict(r) for r in state_db.execute("SELECT * FROM approvals WHERE agent = 'builder-a'")]
        assert gate["status"] == "pending" and gate["decider"] == "lead-1"
        assert f"waiting for approval `{gate['id']}`" in held.stdout and '"deny"' in held.stdout

        def ov(channel: Channel, name: str, *args: str) -> subprocess.CompletedProcess[str]:
            env = {**_agent_env(channel), "OVERSTORY_AGENT_NAME": name}
            return subprocess.run([*ov_command(), *args], cwd=team.root, env=env, capture_output=True, text=True,
                                  timeout=60)

        listed = ov(builder, "builder-a", "approvals", "--json")
        assert listed.returncode == 0 and [a["id"] for a in json.loads(listed.stdout)] == [gate["id"]]
        own = ov(builder, "operator", "approve", gate["id"])  # claims to be the operator: decides as builder-a
        assert own.returncode != 0 and "builder-a may not decide" in own.stderr and "Traceback" not in own.stderr
        stranger = ov(channel_of("builder-x"), "lead-1", "reject", gate["id"], "--reason", "no")
        assert stranger.returncode != 0 and "builder-x may not decide" in stranger.stderr
        assert state_db.execute("SELECT status FROM approvals").fetchone()["status"] == "pending"
        decided = ov(channel_of("lead-1"), "operator", "approve", gate["id"], "--note", "go", "--json")
        assert decided.returncode == 0, decided.stderr
        row = dict(state_db.execute("SELECT * FROM approvals").fetchone())
        assert (row["status"], row["decided_by"], json.loads(decided.stdout)["status"]) == ("approved", "lead-1",
                                                                                            "approved")
        told = state_db.execute("SELECT subject FROM mail WHERE recipient = 'builder-a' ORDER BY id DESC").fetchone()
        assert told["subject"].startswith("approved: you may now run")
    finally:
        for endpoint in endpoints:
            endpoint.close()


def test_a_gated_turn_whose_endpoint_is_gone_refuses_the_call(team: ProjectPaths, tmp_path: t.Any) -> None:
    """Fail closed: with no endpoint to ask, `ov guard` denies an allowed call, gated or not."""
    from overstory.agents.gate import spec_env

    hook = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Read", "session_id": "s",
                       "tool_input": {"file_path": str(team.root / "README.md")}, "cwd": str(team.root)})
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}
    base.update({ENDPOINT_ENV: str(tmp_path / "gone.sock"), TOKEN_ENV: "t", "OVERSTORY_AGENT_NAME": "builder-a",
                 "OVERSTORY_PROJECT_ROOT": str(team.root), "OVERSTORY_CAPABILITY": "builder"})

    def guard(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ov_command(), "guard"], input=hook, cwd=team.root, env={**base, **extra},
                              capture_output=True, text=True, timeout=60)

    rules = spec_env([{"match": "Read(*README*)"}], decider="lead-1", timeout=60, on_timeout="reject")
    gated = guard(OVERSTORY_APPROVALS=rules)
    assert gated.returncode == 0 and '"deny"' in gated.stdout and "could not be reached" in gated.stdout
    # Without a gate too (issue 28): a call that can be neither counted nor recorded is refused.
    ungated = guard()
    assert ungated.returncode == 0 and '"deny"' in ungated.stdout and "could not be reached" in ungated.stdout


def test_debounced_mail_check_and_nudges_inside_an_agent_go_through_its_endpoint(team: ProjectPaths, serve: t.Any,
                                                                                  state_db: t.Any) -> None:
    from overstory.store import mail

    channel = serve("builder-a")

    def ov(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ov_command(), *args], cwd=team.root, env=_agent_env(channel),
                              capture_output=True, text=True, timeout=60)

    [waiting] = mail.send(state_db, sender="lead-1", to="builder-a", subject="look at this")
    shown = [json.loads(ov("mail", "check", "--peek", "--debounce", "3600", "--json").stdout) for _ in range(2)]
    assert [[m["id"] for m in batch] for batch in shown] == [[waiting], []], "the endpoint keeps the debounce"
    assert (team.run_dir / "mail-check" / "builder-a.json").exists()
    first = json.loads(ov("nudge", "lead-1", "--json").stdout)
    again = json.loads(ov("nudge", "lead-1", "--json").stdout)
    assert len(first["ids"]) == 1 and again == {"ids": [], "pending": first["ids"][0]}
    assert len(json.loads(ov("nudge", "lead-1", "--force", "--json").stdout)["ids"]) == 1
    impostor = ov("nudge", "lead-1", "--from", "operator")
    assert impostor.returncode == 1 and "cannot nudge as 'operator'" in impostor.stderr
