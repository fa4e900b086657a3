"""`ov policy audit`: tools and commands agents used, what the ledger's rules did not know, what varied."""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

from agent_helpers import wait_terminal
from conftest import run_ov
from overstory.paths import ProjectPaths
from test_coordinator import scenario, team, write_local_config  # noqa: F401 - fixture

TURNS = [{"actions": [
    {"bash": "git status --short"},
    {"bash": "python3 -c 'print(1)'"},
    {"bash": "python3 -c 'print(2)' && ls"},
    {"write": {"path": "work/notes.md", "content": "notes\n"}},
    {"bash": "git add work/notes.md && git commit -q -m notes"},
    {"bash": "ov mail send --type worker_done --subject done --body done"},
], "result": "done"}]


def _audit(project: ProjectPaths, *args: str) -> dict[str, t.Any]:
    done = run_ov("policy", "audit", *args, "--json", cwd=project.root)
    assert done.returncode == 0, done.stderr
    return t.cast(dict[str, t.Any], json.loads(done.stdout))


def test_audit_names_tools_commands_unknown_calls_and_what_varied(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"builder-*": TURNS})
    slung = run_ov("sling", "builder", "notes", "--name", "builder-notes", "--runtime", "scripted",
                   "--scenario", str(path), cwd=team.root)
    assert slung.returncode == 0, slung.stderr
    assert wait_terminal(team, "builder-notes").state == "completed"

    found = _audit(team)
    assert found["agents"] == ["builder-notes"] and found["calls"] == 6
    tools = {tool["tool"]: tool for tool in found["tools"]}
    assert tools["Bash"]["calls"] == 5 and tools["Write"]["calls"] == 1
    assert tools["Bash"]["by_class"] == {"read": 1, "local_write": 3, "side_effect": 1}
    commands = {c["command"]: c for c in found["commands"]}
    assert commands["git status"]["by_class"] == {"read": 1}
    assert commands["python3"] == {"command": "python3", "calls": 2, "by_class": {"local_write": 2}}
    assert commands["ov mail"]["by_class"] == {"side_effect": 1} and commands["ls"]["by_class"] == {"read": 1}
    # Only python3 is unknown: git add/commit and Write are local writes by design, ls reads.
    assert [(u["tool"], u["what"], u["calls"]) for u in found["unknown"]] == [("Bash", "python3", 2)]
    assert found["unknown"][0]["rules"] == ["ledger.read_only: 'Bash(python3 *)'",
                                            "ledger.side_effects: 'Bash(python3 *)'"]
    varied = {v["tool"]: v for v in found["varied"]}
    assert varied["Bash"]["distinct_inputs"] == 5 and varied["Bash"]["fields"][0] == {"field": "command", "distinct": 5}
    assert found["events"]["tool_starts"]["Bash"] == 5

    text = run_ov("policy", "audit", cwd=team.root).stdout
    assert "6 tool call(s) by 1 agent(s), since " in text
    assert "Bash 'python3': 2 call(s), e.g. \"python3 -c 'print(1)'\"" in text

    # The rule the audit suggested places the calls: audited again with it, nothing is unknown.
    write_local_config(team, runtime={"default": "scripted"}, ledger={"read_only": ["Bash(python3 *)"]})
    tuned = _audit(team)
    assert tuned["unknown"] == []
    assert {c["command"]: c["by_class"] for c in tuned["commands"]}["python3"] == {"read": 2}


def test_audit_of_a_run_and_bad_windows(project: ProjectPaths) -> None:
    both = run_ov("policy", "audit", "--run", "run-1", "--since", "1h", cwd=project.root)
    assert both.returncode == 2 and "give one" in both.stderr and "Traceback" not in both.stderr
    bad = run_ov("policy", "audit", "--since", "yesterday-ish", cwd=project.root)
    assert bad.returncode == 2 and "--since:" in bad.stderr
    missing = run_ov("policy", "audit", "--run", "run-nope", cwd=project.root)
    assert missing.returncode != 0 and "run-nope" in missing.stderr and "Traceback" not in missing.stderr
    assert _audit(project)["calls"] == 0
