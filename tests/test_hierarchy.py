"""The hierarchy: who may sling, how deep, how many; and `ov tree`."""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest

from agent_helpers import wait_terminal
from conftest import run_git, run_ov
from overstory.agents import hierarchy
from overstory.agents.spawn import SlingRequest, sling
from overstory.config.model import load_config
from overstory.errors import HierarchyError
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_state
from test_coordinator import (
    READY,
    mails,
    scenario,
    sling_cmd,
    team,  # noqa: F401 - fixture
    wait_idle,
    write_local_config,
)

# ---- real agents trying to sling ------------------------------------------------------------------


def _relay(parent: str, command: str) -> str:
    """Run ``command`` and mail its output (the refusal) to ``parent``."""
    return f'ov mail send --to {parent} --type status --subject "sling attempt" --body "$({command} 2>&1)"'


DONE = {"bash": 'ov mail send --type worker_done --subject "done" --body "done"'}


def test_depth_and_capability_limits_hold_for_real_agents(team: ProjectPaths, tmp_path: Path) -> None:  # noqa: F811
    path = team.ov_dir / "team.json"  # agents read it from inside their sandbox: .overstory/ is visible there
    scenario(path, {
        "coordinator": [*READY, {"actions": [{"bash": sling_cmd("lead", "a", path)},
                                             {"bash": sling_cmd("builder", "d", path)}], "result": "slung"}],
        "lead-a": [{"actions": [{"bash": sling_cmd("lead", "b", path)}], "result": "slung lead-b"},
                   {"actions": [DONE], "result": "done"}],
        "lead-b": [{"actions": [{"bash": _relay("lead-a", sling_cmd("builder", "c", path))}, DONE], "result": "done"}],
        "builder-d": [{"actions": [{"bash": _relay("coordinator", sling_cmd("scout", "e", path))}, DONE],
                       "result": "done"}],
    })
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    wait_idle(team, "coordinator", 1)
    assert run_ov("coordinator", "send", "go", cwd=team.root).returncode == 0
    for name in ("builder-d", "lead-b", "lead-a"):
        assert wait_terminal(team, name).state == "completed"

    by_depth = json.loads(run_ov("status", "--json", "--all", cwd=team.root).stdout)["agents"]
    depths = {a["name"]: (a["parent"], a["depth"]) for a in by_depth}
    assert depths == {"coordinator": ("operator", 0), "lead-a": ("coordinator", 1), "lead-b": ("lead-a", 2),
                      "builder-d": ("coordinator", 1)}

    too_deep = [m for m in mails(team, sender="lead-b", to="lead-a") if m.subject == "sling attempt"]
    assert len(too_deep) == 1
    assert "agents.max_depth = 2" in too_deep[0].body and "depth 3" in too_deep[0].body
    builder = [m for m in mails(team, sender="builder-d", to="coordinator") if m.subject == "sling attempt"]
    assert len(builder) == 1
    assert "builder-d is a builder: only coordinator and lead agents may sling" in builder[0].body
    for refused in ("builder-c", "scout-e"):
        assert run_git(team.root, "branch", "--list", f"ov/{refused}").strip() == ""
        assert not team.worktree(refused).exists()

    tree = run_ov("tree", cwd=team.root)
    assert tree.returncode == 0, tree.stderr
    lines = tree.stdout.splitlines()
    assert lines[0] == "operator"
    assert lines[1].startswith("└── coordinator  coordinator · ")  # between turns or in one: it is persistent
    assert lines[2].startswith("    ├── lead-a  lead · completed")
    assert lines[3].startswith("    │   └── lead-b  lead · completed")
    assert lines[4].startswith("    └── builder-d  builder · completed")
    document = json.loads(run_ov("tree", "--json", cwd=team.root).stdout)
    root = document["children"][0]
    assert root["name"] == "coordinator" and [c["name"] for c in root["children"]] == ["lead-a", "builder-d"]
    assert root["children"][0]["children"][0]["name"] == "lead-b"
    active = run_ov("tree", "--active", cwd=team.root).stdout.splitlines()
    assert active == ["operator", active[1]] and "coordinator" in active[1]


# ---- the rules, one by one (rows only, no processes) ----------------------------------------------


def _row(conn: t.Any, name: str, capability: str, parent: str = "operator", depth: int = 0,
         state: str | None = None) -> None:
    generation = sessions.create_session(conn, name=name, capability=capability, task_id=name, runtime="scripted",
                                         actor="test", parent=parent, depth=depth)
    if state is not None:
        assert sessions.transition(conn, name, generation, state, actor="test").ok


@pytest.fixture
def ladder(project: ProjectPaths, state_db: t.Any) -> ProjectPaths:
    """coordinator (0) -> lead-a (1) -> lead-b (2), plus builder-z under lead-a; none of them runs."""
    _row(state_db, "coordinator", "coordinator")
    _row(state_db, "lead-a", "lead", "coordinator", 1)
    _row(state_db, "lead-b", "lead", "lead-a", 2)
    _row(state_db, "builder-z", "builder", "lead-a", 2)
    return project


def _sling_as(project: ProjectPaths, caller: str | None, **request: t.Any) -> t.Any:
    config = load_config(project.config_file, project.local_config_file, environ={})
    env = {"OVERSTORY_AGENT_NAME": caller} if caller else {}
    conn = open_state(project.state_db)
    try:
        fields = {"capability": "builder", "task_id": "new", "runtime": "scripted", **request}
        return sling(project, config, conn, SlingRequest(**fields), environ=env, start=False)
    finally:
        conn.close()


def test_an_agent_at_max_depth_is_refused_by_the_cli(ladder: ProjectPaths) -> None:
    refused = run_ov("sling", "builder", "new", "--runtime", "scripted", cwd=ladder.root,
                     env={"OVERSTORY_AGENT_NAME": "lead-b"})
    assert refused.returncode == 1
    assert refused.stderr.strip() == ("ov: error: lead-b is at depth 2; a child would be at depth 3, beyond "
                                      "agents.max_depth = 2")
    assert run_git(ladder.root, "branch", "--list", "ov/builder-new").strip() == ""


def test_a_builder_may_not_sling(ladder: ProjectPaths) -> None:
    refused = run_ov("sling", "scout", "look", "--runtime", "scripted", cwd=ladder.root,
                     env={"OVERSTORY_AGENT_NAME": "builder-z"})
    assert refused.returncode == 1
    assert "builder-z is a builder: only coordinator and lead agents may sling" in refused.stderr


def test_depth_follows_the_parent_and_the_operator_slings_at_depth_zero(ladder: ProjectPaths) -> None:
    child = _sling_as(ladder, "lead-a", task_id="one")
    assert (child.parent, child.depth) == ("lead-a", 2)
    top = _sling_as(ladder, None, capability="merger", task_id="two")
    assert (top.parent, top.depth) == ("operator", 0)


def test_an_agent_may_only_place_children_in_its_own_subtree(ladder: ProjectPaths) -> None:
    with pytest.raises(HierarchyError, match="outside its part of the hierarchy"):
        _sling_as(ladder, "lead-a", parent="operator")
    with pytest.raises(HierarchyError, match="outside its part of the hierarchy"):
        _sling_as(ladder, "lead-b", parent="coordinator")
    placed = _sling_as(ladder, "coordinator", parent="lead-a", task_id="three")
    assert (placed.parent, placed.depth) == ("lead-a", 2)


def test_children_per_lead_and_concurrent_agents_are_capped(ladder: ProjectPaths) -> None:
    write_local_config(ladder, agents={"max_children_per_lead": 2, "max_concurrent_agents": 5})
    with pytest.raises(HierarchyError, match=r"lead-a already has 2 active children \(agents.max_children_per_lead = 2\)"):
        _sling_as(ladder, "lead-a")
    conn = open_state(ladder.state_db)
    try:
        sessions.transition(conn, "builder-z", 1, "completed", actor="test")
    finally:
        conn.close()
    assert _sling_as(ladder, "lead-a", task_id="four").depth == 2, "a finished child frees its place"
    _sling_as(ladder, None, task_id="five")
    with pytest.raises(HierarchyError, match=r"5 agents are active \(agents.max_concurrent_agents = 5\)"):
        _sling_as(ladder, None, task_id="six")


# ---- the tree -----------------------------------------------------------------------------------


def _agents(state_db: t.Any) -> list[sessions.Session]:
    return sessions.list_sessions(state_db)


def test_tree_orphans_and_pruning(project: ProjectPaths, state_db: t.Any) -> None:
    _row(state_db, "coordinator", "coordinator")
    _row(state_db, "lead-a", "lead", "coordinator", 1, state="completed")
    _row(state_db, "builder-b", "builder", "lead-a", 2)
    _row(state_db, "scout-c", "scout", "lead-gone", 2, state="zombie")
    roots = hierarchy.build_tree(_agents(state_db))
    assert [r.agent.name for r in roots] == ["coordinator", "scout-c"]
    assert roots[1].orphan_of == "lead-gone"
    lines = hierarchy.render_lines(roots)
    assert lines == [
        "operator",
        "├── coordinator  coordinator · booting · 0 turns",
        "│   └── lead-a  lead · completed · 0 turns",
        "│       └── builder-b  builder · booting · 0 turns",
        "└── scout-c  scout · zombie · 0 turns  [parent lead-gone is gone]",
    ]
    # --active keeps a finished lead that still has an active child below it.
    pruned = hierarchy.prune(hierarchy.build_tree(_agents(state_db)), lambda a: not a.is_terminal)
    assert hierarchy.render_lines(pruned)[1:] == [
        "└── coordinator  coordinator · booting · 0 turns",
        "    └── lead-a  lead · completed · 0 turns",
        "        └── builder-b  builder · booting · 0 turns",
    ]
    document = hierarchy.tree_document(roots)
    assert document["name"] == "operator" and document["children"][1]["orphan_of"] == "lead-gone"


def test_tree_survives_a_parent_cycle(project: ProjectPaths, state_db: t.Any) -> None:
    _row(state_db, "lead-x", "lead", "lead-y", 1)
    _row(state_db, "lead-y", "lead", "lead-x", 1)
    roots = hierarchy.build_tree(_agents(state_db))
    names = [line.split()[1] for line in hierarchy.render_lines(roots)[1:]]
    assert sorted(names) == ["lead-x", "lead-y"]
    assert hierarchy.ancestors(state_db, "lead-x") == ["lead-y"]


def test_tree_of_an_empty_project(project: ProjectPaths) -> None:
    shown = run_ov("tree", cwd=project.root)
    assert shown.returncode == 0 and shown.stdout.splitlines() == ["operator", "(no agents)"]
    assert json.loads(run_ov("tree", "--json", cwd=project.root).stdout) == {"name": "operator", "children": []}
