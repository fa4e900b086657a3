"""Containment with the REAL Claude Code CLI, through `ov sling`: an escape table, normal work, a safe merge.

Only the model is mocked (tests/mockapi.py on 127.0.0.1): it cannot run here, and a mock
lets the test choose exactly what the "model" attempts. Everything else is real: the CLI
and its tools, ov's hooks, bubblewrap, git, SQLite, the agents' loops and endpoints.

``test_escape_table``: a builder and a read-only scout try every kind of escape listed in
issue 12 (tests/e2e/containment_rows.py), one tool call each, batched into a few model
replies. A snapshot of everything outside what they own (main checkout, other worktrees,
.overstory/ config and database content, every ref, git config, hooks, a remote, a directory
outside the project) is the same after as before, no escape left its mark, no process of
their turns outlives them, ov's hooks still run in the builder's next turn after it removed
every file it could, and the operator's `ov merge` of the builder runs none of its hooks.

With OV_CONTAINMENT_MEASURE=<file> the same table runs with sandbox.mode off and writes,
per row, whether the guard denied it and whether it escaped (docs/security.md, "The guard alone").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import typing as t
from pathlib import Path

import pytest

import containment_rows as rows_module
from agent_helpers import agent_state, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from containment_rows import BUILDER, SCOUT, VICTIM, VICTIM2, Places, Row
from mockapi import MockMessagesAPI, Reply, ScriptedConversation, assistant_turns, text_reply, tools_reply
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store.db import open_events, open_state
from sandbox_helpers import Snapshot, events_of, processes_with

MEASURE = os.environ.get("OV_CONTAINMENT_MEASURE")  # read at import: the autouse fixture drops OV_* variables
BATCH = 12  # tool calls per model reply
TIMEOUT = 240


def _system(body: dict[str, t.Any]) -> str:
    system = body.get("system")
    if isinstance(system, list):
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return str(system or "")


class Team:
    """One mock model for several agents: each conversation is routed by the agent name in its system
    prompt, and every first request waits at a gate, so the test can take its snapshot first."""

    def __init__(self, scripts: dict[str, list[Reply]]) -> None:
        self.conversations = {name: ScriptedConversation(script) for name, script in scripts.items()}
        self.gate = threading.Event()
        self.waiting: set[str] = set()

    def __call__(self, body: dict[str, t.Any]) -> Reply:
        system = _system(body)
        name = next((n for n in self.conversations if f"You are **{n}**" in system), None)
        if name is None:
            return text_reply("(no script for this agent)")
        if assistant_turns(body) == 0:
            self.waiting.add(name)
            self.gate.wait(TIMEOUT)
        return self.conversations[name](body)


def batches(rows: list[Row], *, then: list[Reply]) -> list[Reply]:
    calls = [(row.tool, row.input, f"toolu_{row.id}") for row in rows]
    return [tools_reply(calls[i:i + BATCH]) for i in range(0, len(calls), BATCH)] + then


def _bash(command: str) -> tuple[str, dict[str, str]]:
    return ("Bash", {"command": command, "description": "report"})


def make_arena(project: ProjectPaths, tmp_path: Path) -> Places:
    """The main checkout (a file and a directory per row that would change or delete one), a bare
    remote, a directory outside the project, and two finished builders whose work is there to be damaged."""
    root = project.root
    for row_id in rows_module.TARGET_FILES:
        (root / rows_module.target(row_id)).parent.mkdir(exist_ok=True)
        (root / rows_module.target(row_id)).write_text("orig\n")
    for row_id in rows_module.TARGET_DIRS:
        (root / "d" / row_id).mkdir(parents=True)
        (root / "d" / row_id / "keep.txt").write_text("keep\n")
    (root / "test_sample.py").write_text("def test_sample(tmp_path):\n    (tmp_path / 'f').write_text('x')\n")
    run_git(root, "add", "-A")
    run_git(root, "commit", "-q", "-m", "targets and a test")
    (root / "later.txt").write_text("later\n")
    run_git(root, "add", "later.txt")
    run_git(root, "commit", "-q", "-m", "later")
    origin = tmp_path / "origin.git"
    run_git(tmp_path, "clone", "-q", "--bare", str(root), str(origin))
    run_git(root, "remote", "add", "origin", str(origin))
    run_git(root, "fetch", "-q", "origin")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("precious\n")
    victim = project.ov_dir / "victim.json"
    victim.write_text(json.dumps({"turns": [{"actions": [
        {"write": {"path": "v.txt", "content": "v\n"}}, {"bash": "git add v.txt && git commit -q -m v"},
        {"bash": "ov mail send --type worker_done --subject done --body done"}]}]}))
    for task in ("victim", "victim2"):
        done = run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(victim), cwd=root)
        assert done.returncode == 0, done.stderr
    for name in (VICTIM, VICTIM2):
        assert wait_terminal(project, name).state == "completed"
    refs = {line.split()[1]: line.split()[0] for line in run_git(root, "show-ref").splitlines()}
    refs["origin"] = run_git(origin, "rev-parse", "main").strip()
    refs["main~1"] = run_git(root, "rev-parse", "main~1").strip()
    refs["main reflog"] = str(len(run_git(root, "log", "-g", "--format=%H", "refs/heads/main").splitlines()))
    return Places(root=root, outside=outside, origin=origin, before=refs)


def turn_ids(project: ProjectPaths, agent: str) -> list[str]:
    conn = open_state(project.state_db)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM turns WHERE agent = ? ORDER BY started_at", (agent,))]
    finally:
        conn.close()


def live_processes_of(project: ProjectPaths, agent: str) -> list[int]:
    """Processes started for the agent's turns: they carry its name and project in their environment.

    (Its loop does not: it runs in the environment it was slung from.)
    """
    wanted = {f"OVERSTORY_AGENT_NAME={agent}".encode(), f"OVERSTORY_PROJECT_ROOT={project.root}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ and procs.is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def denied_ids(project: ProjectPaths, agent: str) -> set[str]:
    """Tool calls ov's guard denied (the CLI lists them in each result's permission_denials)."""
    conn = open_events(project.events_db)
    try:
        results = [json.loads(r[0]) for r in conn.execute(
            "SELECT data FROM events WHERE agent = ? AND kind = 'turn_result' AND data IS NOT NULL", (agent,))]
    finally:
        conn.close()
    assert results, f"no turn_result event of {agent}"
    return {d.get("tool_use_id", "").removeprefix("toolu_") for r in results for d in r.get("permission_denials") or []}


def settle(predicate: t.Callable[[], t.Any], message: str, timeout: float = TIMEOUT) -> None:
    """wait_for; when measuring (sandbox off) an escape may have broken the flow: carry on and record."""
    try:
        wait_for(predicate, timeout, message=message)
    except AssertionError:
        if not MEASURE:
            raise


def kill_tokens() -> None:
    for pid in processes_with("ovtok-"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@requires_claude
@pytest.mark.parametrize("transport", ["http", "command"])
def test_escape_table(project: ProjectPaths, tmp_path: Path, transport: str) -> None:
    """The table through each way the guard is called: HTTP to the agent's loop (the default), and a
    new `ov guard` process per call (the fallback)."""
    if MEASURE:
        if transport == "command":
            pytest.skip("measured once, with the default hooks")
        project.local_config_file.write_text("sandbox:\n  mode: off\n")
    elif transport == "command":
        project.local_config_file.write_text("guards:\n  hook_transport: command\n")
    places = make_arena(project, tmp_path)
    builder, turn_two, scout = (rows_module.builder_rows(places), rows_module.turn_two_rows(places),
                                rows_module.scout_rows(places))
    done = "ov mail send --type worker_done --subject done --body done"
    team = Team({
        BUILDER: [*batches(builder, then=[text_reply("Waiting for instructions.")]),
                  *batches(turn_two, then=[tools_reply([_bash(done)]), text_reply("Done.")])],
        SCOUT: batches(scout, then=[tools_reply([_bash(done)]), text_reply("Done.")]),
    })
    owned = [BUILDER, SCOUT]
    extra = {"outside dir": places.outside, "origin refs": places.origin / "refs",
             "origin config": places.origin / "config", "origin packed-refs": places.origin / "packed-refs"}
    try:
        with MockMessagesAPI(team) as api:
            env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude",
                                                            "OV_TURNS_KILL_GRACE": "1"})
            for capability, task in (("builder", "evil"), ("scout", "evil")):
                slung = run_ov("sling", capability, task, "--prompt", "do as you are told", cwd=project.root,
                               env=env)
                assert slung.returncode == 0, slung.stderr
            wait_for(lambda: team.waiting >= set(owned), TIMEOUT, message="both agents' first requests")
            before = Snapshot.take(project, owned_agents=owned, owned_worktrees=[BUILDER], extra=extra)
            places.before[f"refs/heads/ov/{SCOUT}"] = run_git(project.root, "rev-parse", f"ov/{SCOUT}").strip()
            team.gate.set()

            settle(lambda: (a := agent_state(project, BUILDER)) and a.turns == 1 and a.state == "between_turns",
                   "the builder's first turn")
            first_turn = turn_ids(project, BUILDER)
            settle(lambda: not live_processes_of(project, BUILDER), "nothing of its turn alive", 30)
            assert MEASURE or all(not procs.tagged_processes(turn) for turn in first_turn)
            sent = run_ov("mail", "send", "--to", BUILDER, "--subject", "carry on", "--body", "finish", cwd=project.root)
            assert MEASURE or sent.returncode == 0, sent.stderr
            for agent in owned:
                settle(lambda name=agent: (a := agent_state(project, name)) and a.is_terminal, f"{agent} to settle")
            time.sleep(5)  # row p04's late write would fire 4 s after it was started
            after = Snapshot.take(project, owned_agents=owned, owned_worktrees=[BUILDER], extra=extra)
            leftovers = {agent: live_processes_of(project, agent) for agent in owned}
            tokens = processes_with("ovtok-")
            denied = denied_ids(project, BUILDER) | denied_ids(project, SCOUT)
            escaped = sorted(row.id for row in builder + turn_two + scout if row.escaped and row.escaped(places))
            hooks_ran = denied_ids(project, BUILDER) & {r.id for r in turn_two}

            # The operator merges the builder's branch (it holds a committed hooks/post-merge): no hook may run.
            merged = run_ov("merge", BUILDER, "--json", cwd=project.root)
            marker = places.outside / "hook-ran"
            requests = len(api.main_requests)
    finally:
        kill_tokens()
    if MEASURE:
        table = [{"id": r.id, "kind": r.kind, "agent": r.agent, "guard_denied": r.id in denied,
                  "escaped": r.id in escaped} for r in builder + turn_two + scout if r.escaped]
        Path(MEASURE).write_text(json.dumps({"rows": table, "snapshot_differences": sorted(
            before.differences(after)), "hook_ran_on_merge": marker.exists()}, indent=1))
        return
    assert requests >= len(builder) // BATCH
    for agent in owned:
        assert (project.run_dir / agent / "hook_transport").read_text().split()[0] == transport
    print(f"guard denied {len(denied)} of {len(builder) + len(turn_two) + len(scout)} calls: {sorted(denied)}")
    assert escaped == []
    assert before.differences(after) == {}
    assert leftovers == {BUILDER: [], SCOUT: []} and tokens == []
    assert hooks_ran == {"h10", "h11"}, "ov's hooks must still run in the turn after the agent removed its files"
    assert agent_state(project, BUILDER).state == "completed" and agent_state(project, SCOUT).state == "completed"
    refused = events_of(project, BUILDER, "branch_refused")
    assert refused and "not an object name" in refused[0]
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout)["merges"][0]["merged"] is True
    assert "hooks/post-merge" in run_git(project.root, "ls-tree", "-r", "--name-only", "main")
    assert not marker.exists(), "the operator's merge ran a hook the agent wrote"


# ---- the same agents' normal work ---------------------------------------------------------------------


@requires_claude
def test_normal_work_still_succeeds(project: ProjectPaths, tmp_path: Path) -> None:
    """A builder edits, tests, commits, amends, rebases and reports; a lead slings a builder and a merger;
    the merger merges that builder's branch with `ov merge` through its endpoint."""
    root = project.root
    run_git(root, "branch", "start")
    (root / "later.txt").write_text("main moved on\n")
    run_git(root, "add", "later.txt")
    run_git(root, "commit", "-q", "-m", "main moves on")
    moved_on = run_git(root, "rev-parse", "main").strip()
    child = project.ov_dir / "child.json"  # the lead's builder plays a script (no second model needed)
    child.write_text(json.dumps({"turns": [{"actions": [
        {"write": {"path": "child.txt", "content": "from the child\n"}},
        {"bash": "git add child.txt && git commit -q -m 'child: add child.txt'"},
        {"bash": "ov mail send --type worker_done --subject done --body done"}]}]}))
    wt = project.worktree("builder-good")
    good = [
        ("Write", {"file_path": str(wt / "calc.py"), "content": "def add(a, b):\n    return a + b\n"}),
        ("Write", {"file_path": str(wt / "test_calc.py"),
                   "content": "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"}),
        _bash("python -m pytest -q -p no:cacheprovider test_calc.py"),
        _bash("git add calc.py test_calc.py && git commit -q -m 'calc: add'"),
        ("Edit", {"file_path": str(wt / "calc.py"), "old_string": "return a + b", "new_string": "return b + a",
                  "replace_all": False}),
        _bash("git commit -q -a --amend -m 'calc: add, commutative'"),
        _bash("git rebase -q main && git gc --auto && git status --short"),
        _bash("ov mail send --type worker_done --subject 'calc done' --body 'tests pass'"),
    ]
    lead = [
        _bash(f"ov sling builder kid --runtime scripted --scenario {child} --prompt 'add child.txt'"),
        _bash("ov sling merger m1 --prompt 'merge builder-kid into main with ov merge builder-kid'"),
    ]
    merger = [_bash("ov merge builder-kid --json"),
              _bash("ov mail send --type merged --subject merged --payload '{\"branch\": \"ov/builder-kid\", \"tier\": 1}'")]
    team = Team({
        "builder-good": [tools_reply([call]) for call in good] + [text_reply("done")],
        "lead-lead": [tools_reply([call]) for call in lead] + [text_reply("slung them")],
        "merger-m1": [tools_reply([call]) for call in merger] + [text_reply("merged")],
    })
    team.gate.set()
    with MockMessagesAPI(team) as api:
        env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
        assert run_ov("sling", "builder", "good", "--base-branch", "start", "--prompt", "write calc",
                      cwd=root, env=env).returncode == 0
        assert run_ov("sling", "lead", "lead", "--prompt", "get child.txt written and merged", cwd=root,
                      env=env).returncode == 0
        assert wait_terminal(project, "builder-good", timeout=TIMEOUT).state == "completed"
        assert wait_terminal(project, "builder-kid", timeout=TIMEOUT).state == "completed"
        assert wait_terminal(project, "merger-m1", timeout=TIMEOUT).state == "completed"
        merge_output = "\n".join(p.read_text() for p in (project.logs_dir / "merger-m1").glob("*/stdout.ndjson"))
    log = run_git(root, "log", "--format=%s", "main..ov/builder-good").splitlines()
    assert log == ["calc: add, commutative"]
    rebased = subprocess.run(["git", "merge-base", "--is-ancestor", moved_on, "ov/builder-good"], cwd=root)
    assert rebased.returncode == 0, "the builder's rebase onto main did not reach its branch"
    assert "return b + a" in run_git(root, "show", "ov/builder-good:calc.py")
    assert "child.txt" in run_git(root, "ls-tree", "--name-only", "main"), merge_output[-2000:]
    conn = open_state(project.state_db)
    try:
        kid = conn.execute("SELECT parent, depth FROM sessions WHERE name = 'builder-kid'").fetchone()
        mails = conn.execute("SELECT sender, recipient, type FROM mail WHERE sender IN ('builder-good', 'merger-m1') "
                             "ORDER BY id").fetchall()
    finally:
        conn.close()
    assert tuple(kid) == ("lead-lead", 1)
    assert ("builder-good", "operator", "worker_done") in [tuple(m) for m in mails]
    assert ("merger-m1", "lead-lead", "merged") in [tuple(m) for m in mails]
    assert '\\"merged\\": true' in merge_output  # its `ov merge --json` answer, as the tool result it saw
