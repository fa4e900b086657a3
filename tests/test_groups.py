"""`ov group create/add/status/list`, `ov sling --group`, and the groups in `ov status`: through the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import typing as t
from pathlib import Path

from conftest import run_ov
from overstory.cli import fast
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.lifecycle import declare_zombie


def ov(project: ProjectPaths, *args: str, code: int = 0) -> Ran:
    """`ov ARGS` in-process through the `ov` script's entry point (``cli.fast.main``: `ov status --json` takes the
    hot path, errors are reported as the script reports them)."""
    out, err = io.StringIO(), io.StringIO()
    got = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            fast.main(["--project", str(project.root), *args])
        except SystemExit as exit_:
            got = int(exit_.code or 0)
    assert got == code, (args, got, out.getvalue(), err.getvalue())
    return Ran(out.getvalue(), err.getvalue())


class Ran(t.NamedTuple):
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def agent(conn: t.Any, name: str, state: str = "between_turns", cost: float = 0.0) -> None:
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=f"t-{name}",
                                         runtime="scripted", actor="test", branch=f"ov/{name}")
    if state == "zombie":
        found = sessions.get(conn, name)
        assert found is not None and declare_zombie(conn, found, "test", actor="test").ok
    elif state != "booting":
        assert sessions.transition(conn, name, generation, state, actor="test").ok
    if cost:
        sessions.update_fields(conn, name, generation, cost_usd=cost)


def test_a_group_follows_its_members(project: ProjectPaths, state_db: t.Any) -> None:
    agent(state_db, "builder-a", "completed", cost=0.25)
    agent(state_db, "builder-b", "in_turn", cost=0.5)
    agent(state_db, "builder-c", "zombie")
    agent(state_db, "scout-x")
    assert "created group auth" in ov(project, "group", "create", "auth", "--description", "login work").output
    assert ov(project, "group", "add", "auth", "builder-a", "builder-b").output.strip() == \
        "added to auth: builder-a, builder-b"
    added = json.loads(ov(project, "group", "add", "auth", "builder-b", "builder-c", "--json").output)
    assert added == {"group": "auth", "added": ["builder-c"], "already": ["builder-b"]}
    ov(project, "group", "create", "docs")

    document = json.loads(ov(project, "group", "status", "auth", "--json").output)
    assert [(m["name"], m["state"], m["cost_usd"]) for m in document["members"]] == [
        ("builder-a", "completed", 0.25), ("builder-b", "in_turn", 0.5), ("builder-c", "zombie", 0.0)]
    assert (document["agents"], document["done"], document["zombie"], document["active"], document["cost_usd"]) == (
        3, 1, 1, 1, 0.75)
    text = ov(project, "group", "status", "auth").output
    assert text.splitlines()[0] == "group auth (login work): 1/3 done, 1 active, 1 dead, $0.7500"
    assert [line.split()[:3] for line in text.splitlines()[1:]] == [
        ["NAME", "CAPABILITY", "STATE"], ["builder-a", "builder", "completed"], ["builder-b", "builder", "in_turn"],
        ["builder-c", "builder", "zombie"]]

    listed = json.loads(ov(project, "group", "list", "--json").output)
    assert [(g["name"], g["agents"], g["done"], g["active"]) for g in listed] == [("auth", 3, 1, 1), ("docs", 0, 0, 0)]
    assert ov(project, "group", "list").output.splitlines()[1].split()[:4] == ["auth", "3", "1", "1"]

    status = json.loads(ov(project, "status", "--json").output)  # served by the hot path's body
    assert [(g["name"], g["done"], g["agents"], g["cost_usd"]) for g in status["groups"]] == [
        ("auth", 1, 3, 0.75), ("docs", 0, 0, 0.0)]
    lines = ov(project, "status").output.splitlines()
    assert "group auth: 1/3 done, 1 active, 1 dead, $0.7500" in lines and "group docs: 0/0 done, $0.0000" in lines
    selected = json.loads(ov(project, "status", "--json", "--capability", "scout").output)
    assert selected["groups"] == []  # only groups with a selected agent


def test_unknown_names_are_one_line_errors_and_change_nothing(project: ProjectPaths, state_db: t.Any) -> None:
    agent(state_db, "builder-a")
    ov(project, "group", "create", "auth")
    refused = ov(project, "group", "create", "auth", code=1)
    assert refused.output.strip() == ("ov: error: a group named 'auth' exists already; add agents to it with "
                                      "`ov group add auth AGENT`")
    unknown_agent = ov(project, "group", "add", "auth", "builder-a", "builder-zz", code=1).output.strip()
    assert unknown_agent.startswith("ov: error: no agent named 'builder-zz'") and "\n" not in unknown_agent
    assert json.loads(ov(project, "group", "status", "auth", "--json").output)["members"] == []  # all or none
    unknown_group = ov(project, "group", "status", "atuh", code=1).output.strip()
    assert unknown_group.startswith("ov: error: no group named 'atuh' (did you mean 'auth'?)")
    ov(project, "group", "add", "nope", "builder-a", code=1)
    as_json = ov(project, "group", "status", "nope", "--json", code=1).output.strip()
    assert json.loads(as_json)["error"]["kind"] == "group_not_found"
    assert "invalid group name" in ov(project, "group", "create", "Has Space", code=2).output


def test_sling_group_joins_at_sling_time(project: ProjectPaths, state_db: t.Any, tmp_path: Path) -> None:
    scenario = tmp_path / "idle.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [], "result": "nothing to do"}]}))
    args = ["sling", "scout", "look", "--runtime", "scripted", "--scenario", str(scenario), "--prompt", "look"]
    refused = run_ov(*args, "--group", "missing", cwd=project.root)
    assert refused.returncode == 1 and "no group named 'missing'" in refused.stderr
    assert sessions.get(state_db, "scout-look") is None  # refused before anything was made
    ov(project, "group", "create", "survey")
    slung = run_ov(*args, "--group", "survey", cwd=project.root)
    assert slung.returncode == 0, slung.stderr
    assert "group:    survey" in slung.stdout
    members = json.loads(ov(project, "group", "status", "survey", "--json").output)["members"]
    assert [m["name"] for m in members] == ["scout-look"]
