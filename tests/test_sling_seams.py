"""Where `ov sling` meets other features: a name slung again, and a scenario slung by an agent.

A later generation of a name never answers mail addressed to an earlier one (the mail is
kept, marked as never delivered); a scripted child slung by an agent through its
endpoint plays a YAML scenario exactly as when the operator slings it, and a malformed
scenario is refused at sling time. Real `ov` subprocesses, real loops, the scripted runtime.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest

from agent_helpers import mail_rows, wait_for, wait_terminal
from conftest import run_git, run_ov
from overstory.paths import ProjectPaths
from test_coordinator import team  # noqa: F401 - fixture

# ---- a scenario slung by an agent ---------------------------------------------------------------

CHILD_PLAN = """\
# A builder's plan, in YAML as an operator would write it.
turns:
  - actions:
      - write: {path: plan-done.txt, content: "built from a YAML plan\\n"}
      - bash: git add plan-done.txt && git commit -q -m "yaml plan"
      - bash: ov mail send --type worker_done --subject "child done" --body "played the YAML plan"
    result: done
"""


def _lead_scenario(path: Path, child_command: str) -> Path:
    """A lead that slings its child (relaying what `ov sling` printed), then reports once the child is done."""
    relay = (f'ov mail send --to operator --type status --subject "sling output" '
             f'--body "$({child_command} 2>&1; echo exit=$?)"')
    path.write_text(json.dumps({"turns": [
        {"actions": [{"bash": relay}], "result": "slung"},
        {"actions": [{"bash": 'ov mail send --type worker_done --subject "lead done" --body "child reported"'}],
         "result": "done"},
    ]}))
    return path


def test_a_lead_slings_a_scripted_child_with_a_yaml_scenario(team: ProjectPaths) -> None:  # noqa: F811
    plan = team.ov_dir / "plan.yaml"  # agents read .overstory/ from inside their sandbox
    plan.write_text(CHILD_PLAN)
    lead = _lead_scenario(team.ov_dir / "lead.json",
                          f"ov sling builder c1 --runtime scripted --scenario {plan} --prompt build")
    slung = run_ov("sling", "lead", "l1", "--runtime", "scripted", "--scenario", str(lead), "--prompt", "lead",
                   cwd=team.root)
    assert slung.returncode == 0, slung.stderr
    child = wait_for(lambda: _session(team, "builder-c1"), timeout=60, message="the lead to sling builder-c1")
    assert child["parent"] == "lead-l1"
    assert wait_terminal(team, "builder-c1").state == "completed"
    assert [m["subject"] for m in mail_rows(team, sender="builder-c1")] == ["child done"]
    assert run_git(team.root, "log", "--format=%s", "-1", "ov/builder-c1").strip() == "yaml plan"
    assert wait_terminal(team, "lead-l1").state == "completed"
    assert (team.run_dir / "builder-c1" / "scenario.yaml").read_text() == CHILD_PLAN  # kept as written


@pytest.mark.parametrize("text, problem", [
    ("turns: [ {actions: [ ]\n", "not valid YAML"),
    ("- just\n- a list\n", "must be a mapping"),
    ("turns:\n  - actions:\n      - dance: now\n", "unknown action"),
])
def test_a_malformed_scenario_is_refused_at_sling_time_on_both_paths(team: ProjectPaths, text: str,  # noqa: F811
                                                                    problem: str) -> None:
    plan = team.ov_dir / "bad.yaml"
    plan.write_text(text)
    by_operator = run_ov("sling", "builder", "c1", "--runtime", "scripted", "--scenario", str(plan), cwd=team.root)
    assert by_operator.returncode == 2, by_operator.stderr
    assert problem in by_operator.stderr and "bad.yaml" in by_operator.stderr
    assert len(by_operator.stderr.strip().splitlines()) == 1 and "Traceback" not in by_operator.stderr
    assert _session(team, "builder-c1") is None

    lead = _lead_scenario(team.ov_dir / "lead.json", f"ov sling builder c1 --runtime scripted --scenario {plan}")
    slung = run_ov("sling", "lead", "l1", "--runtime", "scripted", "--scenario", str(lead), cwd=team.root)
    assert slung.returncode == 0, slung.stderr
    relayed = wait_for(lambda: [m for m in mail_rows(team, sender="lead-l1", recipient="operator")
                                if m["subject"] == "sling output"], timeout=60, message="the lead's sling attempt")
    assert problem in relayed[0]["body"] and "exit=2" in relayed[0]["body"], relayed[0]["body"]
    assert _session(team, "builder-c1") is None
    assert run_git(team.root, "branch", "--list", "ov/builder-c1").strip() == ""


def _session(project: ProjectPaths, name: str) -> dict[str, t.Any] | None:
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        row = conn.execute("SELECT * FROM sessions WHERE name = ?", (name,)).fetchone()
        return dict(row) if row else None
    finally:
        conn.close()
