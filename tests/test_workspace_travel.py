"""A remote turn's workspace travelling by git (issue 30), without Ray: the node's side (``travel_node.NodeTurn``,
the class a Ray task uses) runs here, in real mount namespaces, against a real agent endpoint listening on TCP,
on a real repository. The Ray tests (test_turns_on_ray) run the same code on a cluster's nodes.

What is checked: commits and uncommitted files come back once and only through the control node's
compare-and-swap; a repeated, stale or contradicting finish changes nothing; only the current turn's secret
opens the channel; a kill inside the settle step is completed by the next one; the relay fails closed.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from conftest import ov_command, run_git
from overstory.endpoint.client import ENDPOINT_ENV, TOKEN_ENV, Channel
from overstory.endpoint.remote import serve_remote
from overstory.endpoint.routes import ROUTES
from overstory.endpoint.server import AgentEndpoint
from overstory.errors import EndpointError, WorkspaceRefused
from overstory.executors import travel_control, travel_git
from overstory.executors.travel_node import NodeTurn, Relay
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_state


@pytest.fixture(autouse=True)
def _mount_namespaces() -> None:
    import shutil

    from requires import missing

    if shutil.which("unshare") is None or os.geteuid() != 0:
        missing("a node's mount namespace needs unshare, as root here")


def make_agent(project: ProjectPaths, conn: t.Any, name: str) -> sessions.Session:
    """A builder with its own worktree and branch, as `ov sling` makes them (no loop: the test is the loop)."""
    worktree = project.root / ".overstory" / "worktrees" / name
    base = run_git(project.root, "symbolic-ref", "--short", "HEAD").strip()
    run_git(project.root, "worktree", "add", "-q", "-b", f"ov/{name}", str(worktree), base)
    sessions.create_session(conn, name=name, capability="builder", task_id=f"t-{name}", runtime="scripted",
                            actor="test", branch=f"ov/{name}", base_branch=base, worktree=str(worktree))
    (project.run_dir / name / "scripted").mkdir(parents=True, exist_ok=True)
    found = sessions.get(conn, name)
    assert found is not None
    return found


class Control:
    """The agent's endpoint with its TCP listener, as its loop serves it for remote turns."""

    def __init__(self, project: ProjectPaths, agent: sessions.Session) -> None:
        self.project, self.agent = project, agent
        self.endpoint = AgentEndpoint(project, agent.name, agent.generation, ROUTES).start()
        self.address = serve_remote(self.endpoint, "127.0.0.1")

    def open_turn(self, turn_id: str) -> dict[str, str]:
        return self.endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": turn_id})

    def away(self, turn_id: str, env: dict[str, str]) -> NodeTurn:
        from overstory.agents.turn_exec import REMOTE_ENDPOINT_ENV, travel_for
        from test_watchdog import load

        env = {**env, REMOTE_ENDPOINT_ENV: self.address}
        travel = travel_for(self.project, load(self.project), self.agent, env, ["true"], {})
        travel["sandboxed"] = False  # the sandboxed layout is the Ray tests' (bwrap over the node's copy)
        return NodeTurn(turn_id, travel, env, str(self.agent.worktree), node="node-a")

    def close(self) -> None:
        self.endpoint.close()


@pytest.fixture
def control(project: ProjectPaths, state_db: t.Any) -> t.Iterator[Control]:
    (project.root / "notes.txt").write_text("hello\n")
    run_git(project.root, "add", "notes.txt")
    run_git(project.root, "commit", "-qm", "readme")
    served = Control(project, make_agent(project, state_db, "builder-n"))
    yield served
    served.close()


def run_away(away: NodeTurn, script: str) -> subprocess.CompletedProcess[str]:
    """The turn's command on the node: in its own mount namespace, where the project's path is the node's copy."""
    return subprocess.run(away.command(["sh", "-c", script]), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GIT_AUTHOR_NAME": "n", "GIT_AUTHOR_EMAIL": "n@x",
                               "GIT_COMMITTER_NAME": "n", "GIT_COMMITTER_EMAIL": "n@x"})


def branch_log(project: ProjectPaths, name: str) -> list[str]:
    return run_git(project.root, "log", "--format=%s", f"ov/{name}").split("\n")[:-1]


def test_a_turn_on_a_node_brings_back_its_commits_and_its_uncommitted_files_once(control: Control) -> None:
    project, worktree = control.project, Path(str(control.agent.worktree))
    (worktree / "draft.txt").write_text("a draft nobody committed\n")  # travels out with the turn
    env = control.open_turn("turn-1")
    away = control.away("turn-1", env)
    try:
        assert away.prepare(), away.error
        done = run_away(away, "cat draft.txt > seen.txt && echo new > a.txt && git add a.txt "
                              "&& git commit -qm 'from the node' && echo loose > loose.txt && rm draft.txt")
        assert done.returncode == 0, done.stderr
        # The node worked on its own copy: nothing of it is here before the finish.
        assert not (worktree / "a.txt").exists() and (worktree / "draft.txt").exists()
        assert branch_log(project, "builder-n") == ["readme", "initial"]
        finished = away.finish()
        assert finished is not None and finished["outcome"] == "applied", away.error
        assert branch_log(project, "builder-n") == ["from the node", "readme", "initial"]
        assert (worktree / "a.txt").read_text() == "new\n"
        assert (worktree / "seen.txt").read_text() == "a draft nobody committed\n"
        assert (worktree / "loose.txt").read_text() == "loose\n" and not (worktree / "draft.txt").exists()
        status = run_git(worktree, "status", "--porcelain").splitlines()
        assert sorted(status) == ["?? loose.txt", "?? seen.txt"], status  # uncommitted, as a local turn leaves it
        head = run_git(project.root, "rev-parse", "ov/builder-n").strip()
        # The same finish again (a node retrying after a lost answer): nothing moves twice.
        again = away.finish()
        assert again is not None and again["outcome"] == "applied"
        assert run_git(project.root, "rev-parse", "ov/builder-n").strip() == head
        assert branch_log(project, "builder-n").count("from the node") == 1
    finally:
        away.close()
    refs = run_git(project.root, "for-each-ref", "--format=%(refname:lstrip=5)", "refs/ov/turns/builder-n/turn-1/")
    assert sorted(refs.split()) == ["applied", "base", "end", "head", "start"]
    # They go with the agent's branch when it is cleaned up (and nobody else's do).
    from overstory.agents.stop import remove_worktree_and_branch

    removed = remove_worktree_and_branch(project, control.agent)
    assert "5 remote turn ref(s) refs/ov/turns/builder-n/" in removed, removed
    assert run_git(project.root, "for-each-ref", "refs/ov/turns/") == ""


def test_a_stale_finish_and_a_contradicting_one_change_nothing(control: Control, state_db: t.Any) -> None:
    project, agent, worktree = control.project, control.agent, Path(str(control.agent.worktree))
    late = travel_control.send(project, agent, "turn-lost", None)  # a turn whose node went quiet ...
    retry_env = control.open_turn("turn-retry")               # ... and its retry, from the same base
    away = control.away("turn-retry", retry_env)
    try:
        assert away.prepare(), away.error
        assert run_away(away, "echo retry > r.txt && git add r.txt && git commit -qm retry").returncode == 0
        assert (away.finish() or {}).get("outcome") == "applied", away.error
    finally:
        away.close()
    head = run_git(project.root, "rev-parse", "ov/builder-n").strip()
    # The lost turn's finish arrives now, with a commit on the old base: stale, nothing changes.
    tree = run_git(project.root, "rev-parse", f"{late['base']}^{{tree}}").strip()
    old = run_git(project.root, "commit-tree", tree, "-p", late["base"], "-m", "late").strip()
    assert travel_control.finish(project, agent, "turn-lost", old, old, b"") == "stale"
    assert run_git(project.root, "rev-parse", "ov/builder-n").strip() == head
    assert not (worktree / "late.txt").exists() and (worktree / "r.txt").exists()
    assert travel_control.finish(project, agent, "turn-lost", old, old, b"") == "stale"  # and again
    # A second, different finish of a turn that already finished is refused.
    with pytest.raises(WorkspaceRefused, match="a second, different finish is refused"):
        travel_control.finish(project, agent, "turn-retry", old, old, b"")
    assert run_git(project.root, "rev-parse", "ov/builder-n").strip() == head
    # A finish for a turn that was never sent out is refused.
    with pytest.raises(WorkspaceRefused, match="no workspace was sent out"):
        travel_control.finish(project, agent, "turn-never", head, head, b"")


def _post(address: str, route: str, token: str | None, body: dict[str, t.Any]) -> int:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", f"/v1/{route}", body=json.dumps(body).encode(), headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_only_the_current_turns_secret_opens_the_channel(control: Control, state_db: t.Any) -> None:
    project = control.project
    other = Control(project, make_agent(project, state_db, "builder-o"))
    try:
        others = other.open_turn("turn-o")[TOKEN_ENV]  # another agent's current turn
        expired = control.open_turn("turn-1")[TOKEN_ENV]
        current = control.open_turn("turn-2")[TOKEN_ENV]  # turn-1's secret is revoked by the next turn
        before = run_git(project.root, "for-each-ref")
        finish = {"head": "0" * 40, "end": "0" * 40, "bundle": ""}
        wrong = current[:-1] + ("1" if current.endswith("0") else "0")
        for token in (None, "", others, expired, wrong):
            for route, body in (("workspace.fetch", {}), ("workspace.finish", finish), ("mail.send", {})):
                assert _post(control.address, route, token, body) == 401, (route, token)
        assert run_git(project.root, "for-each-ref") == before  # nothing was sent out or written
        assert _post(control.address, "workspace.fetch", current, {}) == 200
        control.endpoint.revoke()  # the turn ended
        assert _post(control.address, "workspace.fetch", current, {}) == 401
    finally:
        other.close()


def test_a_kill_between_the_branch_and_the_files_is_completed_by_the_next_settle(control: Control) -> None:
    project, agent, worktree = control.project, control.agent, Path(str(control.agent.worktree))
    sent = travel_control.send(project, agent, "turn-k", None)
    node = project.root.parent / "node-copy"  # a node's clone, made from the bundle the control node sent
    node.mkdir()
    bundle = node / "b.bundle"
    import base64

    bundle.write_bytes(base64.b64decode(sent["bundle"]))
    run_git(node, "init", "-q")
    run_git(node, "fetch", "-q", str(bundle), "refs/heads/*:refs/heads/*")
    run_git(node, "checkout", "-q", "ov/builder-n")
    (node / "k.txt").write_text("k\n")
    run_git(node, "add", "k.txt")
    run_git(node, "-c", "user.name=n", "-c", "user.email=n@x", "commit", "-qm", "killed halfway")
    head = run_git(node, "rev-parse", "HEAD").strip()
    run_git(node, "bundle", "create", "-q", str(node / "back.bundle"), "ov/builder-n", f"^{sent['base']}")
    script = ("import sys; from overstory.executors import travel_control as c; from overstory.paths import "
              "ProjectPaths; from overstory.store.db import open_state; from overstory.store import sessions; "
              f"from pathlib import Path; p = ProjectPaths(Path({str(project.root)!r})); a = sessions.get(open_state(p.state_db), 'builder-n'); "
              f"c.finish(p, a, 'turn-k', {head!r}, {head!r}, open({str(node / 'back.bundle')!r}, 'rb').read())")
    died = subprocess.run([sys.executable, "-c", script], env={**os.environ, travel_control.FAULT_ENV: "after_cas"},
                          capture_output=True, text=True, timeout=60)
    assert died.returncode == -9, died.stderr  # killed inside the settle step: the branch moved, the files not
    assert run_git(project.root, "rev-parse", "ov/builder-n").strip() == head
    assert not (worktree / "k.txt").exists()
    assert travel_control.settle_pending(project, agent) == [("turn-k", "applied")]
    assert (worktree / "k.txt").read_text() == "k\n"
    assert run_git(worktree, "status", "--porcelain") == ""
    assert travel_control.settle(project, agent, "turn-k") == "applied"
    assert branch_log(project, "builder-n").count("killed halfway") == 1


def test_the_relay_fails_closed_when_the_control_node_cannot_be_reached(control: Control, tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    relay = Relay(str(tmp_path / "ov.sock"), f"127.0.0.1:{port}")
    try:
        with pytest.raises(EndpointError, match="cannot reach ov's control node at 127.0.0.1"):
            Channel(str(tmp_path / "ov.sock"), "secret").call("status", {})
        hook = json.dumps({"hook_event_name": "PreToolUse", "session_id": "s", "cwd": str(tmp_path),
                           "tool_name": "Bash", "tool_input": {"command": "echo hi > note.txt"}})
        env = {**os.environ, ENDPOINT_ENV: str(tmp_path / "ov.sock"), TOKEN_ENV: "secret",
               "OVERSTORY_AGENT_NAME": control.agent.name, "OVERSTORY_CAPABILITY": "builder",
               "OVERSTORY_PROJECT_ROOT": str(control.project.root)}
        refused = subprocess.run([*ov_command(), "guard"], input=hook, env=env, capture_output=True, text=True,
                                 timeout=60)
        decision = json.loads(refused.stdout)["hookSpecificOutput"]
        assert decision["permissionDecision"] == "deny", refused
        assert "cannot reach ov's control node" in decision["permissionDecisionReason"]
    finally:
        relay.close()
    conn = open_state(control.project.state_db)
    try:
        assert conn.execute("SELECT count(*) FROM tool_calls").fetchone()[0] == 0  # nothing recorded
    finally:
        conn.close()


def test_a_snapshot_of_the_same_files_on_the_same_tip_is_the_same_commit(control: Control,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    worktree = Path(str(control.agent.worktree))
    tip = run_git(worktree, "rev-parse", "HEAD").strip()
    assert travel_git.snapshot(worktree, tip) == tip  # nothing uncommitted: the tip itself
    (worktree / "draft.txt").write_text("draft\n")
    first = travel_git.snapshot(worktree, tip)
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2001-01-01T00:00:00")  # another clock, another committer
    monkeypatch.setenv("GIT_COMMITTER_NAME", "someone else")
    assert travel_git.snapshot(worktree, tip) == first != tip  # a repeated finish names the same objects
    assert run_git(worktree, "status", "--porcelain") == "?? draft.txt\n"  # the index was not touched


def test_what_an_agent_sends_back_cannot_reach_past_what_it_may_change(control: Control, tmp_path: Path) -> None:
    """An agent holds its turn's secret, so it can call the workspace routes itself: think like one that tries."""
    import base64

    project, agent = control.project, control.agent
    env = control.open_turn("turn-e")
    # The workspace routes exist only on the listener for nodes, not on a local turn's socket.
    with pytest.raises(EndpointError, match="no endpoint route 'workspace.fetch'"):
        Channel(env[ENDPOINT_ENV], env[TOKEN_ENV]).call("workspace.fetch", {})
    host, _, port = control.address.rpartition(":")

    def call(route: str, body: dict[str, t.Any]) -> tuple[int, dict[str, t.Any]]:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", f"/v1/{route}", body=json.dumps(body).encode(),
                     headers={"Authorization": f"Bearer {env[TOKEN_ENV]}"})
        answer = conn.getresponse()
        document = json.loads(answer.read())
        conn.close()
        return answer.status, document

    status, fetched = call("workspace.fetch", {})
    assert status == 200, fetched
    base = fetched["result"]["base"]
    # A tree naming "../victim": git itself would write it outside the worktree if asked. Refused, nothing moves.
    victim = project.root.parent / "victim"
    victim.write_text("untouched\n")
    blob = run_git(project.root, "hash-object", "-w", str(victim)).strip()
    inner = subprocess.run(["git", "mktree"], cwd=project.root, input=f"100644 blob {blob}\tvictim\n", text=True,
                           capture_output=True, check=True).stdout.strip()
    tree = subprocess.run(["git", "mktree"], cwd=project.root, input=f"040000 tree {inner}\t..\n", text=True,
                          capture_output=True, check=True).stdout.strip()
    crafted = run_git(project.root, "-c", "user.name=a", "-c", "user.email=a@b", "commit-tree", tree, "-p", base,
                      "-m", "escape").strip()
    status, refused = call("workspace.finish", {"head": crafted, "end": crafted, "bundle": ""})
    assert status == 409 and "cannot be checked out" in refused["error"], refused
    assert run_git(project.root, "rev-parse", "ov/builder-n").strip() == base
    assert victim.read_text() == "untouched\n"
    # The runtime's state comes back whole, but the files ov pinned there (the hooks' config) stay ov's.
    state = project.run_dir / agent.name / "scripted"
    pinned = state / "settings.json"
    pinned.write_text('{"hooks": "ov guard"}\n')
    (project.run_dir / agent.name / "pinned-files.json").write_text(json.dumps([str(pinned)]))
    forged = tmp_path / "forged"
    (forged / "sessions").mkdir(parents=True)
    (forged / "settings.json").write_text('{"hooks": {}}\n')
    (forged / "sessions" / "s1.json").write_text("{}\n")
    status, swapped = call("workspace.state", {"state": base64.b64encode(
        travel_control.pack_dir(forged)).decode()})
    assert status == 200, swapped
    assert pinned.read_text() == '{"hooks": "ov guard"}\n' and (state / "sessions" / "s1.json").exists()
    # ... and only for a turn that was sent out.
    env = control.open_turn("turn-f")  # (``call`` now presents this turn's secret)
    status, refused = call("workspace.state", {"state": base64.b64encode(travel_control.pack_dir(forged)).decode()})
    assert status == 409 and "no workspace was sent out" in refused["error"], refused


def test_a_state_swap_killed_between_its_two_renames_is_put_back_at_the_next_fetch(control: Control) -> None:
    project, agent = control.project, control.agent
    state = project.run_dir / agent.name / "scripted"
    (state / "session.json").write_text("kept\n")
    state.rename(state.with_name(".scripted.old"))  # where a kill between the renames leaves it
    travel_control.send(project, agent, "turn-r", state)
    assert (state / "session.json").read_text() == "kept\n"
