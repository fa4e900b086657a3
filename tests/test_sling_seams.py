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
        # A child with commits: refused until they are merged (a lead reports last); the `merged` mail wakes it.
        {"actions": [{"bash": 'ov mail send --type worker_done --subject "lead done" --body "child merged"'}],
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
    assert run_ov("merge", "builder-c1", cwd=team.root).returncode == 0
    assert wait_terminal(team, "lead-l1").state == "completed"
    assert (team.run_dir / "builder-c1" / "scenario.yaml").read_text() == CHILD_PLAN  # kept as written


MALFORMED = {"bad-syntax.yaml": ("turns: [ {actions: [ ]\n", "not valid YAML"),
             "bad-shape.yaml": ("- just\n- a list\n", "must be a mapping"),
             "bad-action.json": ('{"turns": [{"actions": [{"dance": "now"}]}]}', "unknown action")}


def test_a_malformed_scenario_is_refused_at_sling_time_on_both_paths(team: ProjectPaths) -> None:  # noqa: F811
    plans = {}
    for name, (text, problem) in MALFORMED.items():
        plans[name] = team.ov_dir / name
        plans[name].write_text(text)
        by_operator = run_ov("sling", "builder", "c1", "--runtime", "scripted", "--scenario", str(plans[name]),
                             cwd=team.root)
        assert by_operator.returncode == 2, by_operator.stderr
        assert problem in by_operator.stderr and name in by_operator.stderr, by_operator.stderr
        assert len(by_operator.stderr.strip().splitlines()) == 1 and "Traceback" not in by_operator.stderr
    assert _session(team, "builder-c1") is None

    tries = " 2>&1; ".join(f"ov sling builder c1 --runtime scripted --scenario {plan}" for plan in plans.values())
    lead = _lead_scenario(team.ov_dir / "lead.json", tries)
    slung = run_ov("sling", "lead", "l1", "--runtime", "scripted", "--scenario", str(lead), cwd=team.root)
    assert slung.returncode == 0, slung.stderr
    relayed = wait_for(lambda: [m for m in mail_rows(team, sender="lead-l1", recipient="operator")
                                if m["subject"] == "sling output"], timeout=60, message="the lead's sling attempts")
    body = relayed[0]["body"]
    for name, (_, problem) in MALFORMED.items():
        assert f"--scenario {plans[name]}: " in body and problem in body, body
    assert "exit=2" in body and _session(team, "builder-c1") is None
    assert run_git(team.root, "branch", "--list", "ov/builder-c1").strip() == ""


def _session(project: ProjectPaths, name: str) -> dict[str, t.Any] | None:
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        row = conn.execute("SELECT * FROM sessions WHERE name = ?", (name,)).fetchone()
        return dict(row) if row else None
    finally:
        conn.close()


# ---- a name slung again -------------------------------------------------------------------------


def _transcript(project: ProjectPaths, name: str) -> str:
    """Every prompt the scripted agent's sessions were given (its run dir is new for each generation)."""
    return "".join(p.read_text() for p in sorted((project.run_dir / name / "scripted").rglob("*.jsonl")))


def test_a_later_generation_never_answers_mail_sent_to_an_earlier_one(team: ProjectPaths,  # noqa: F811
                                                                      tmp_path: Path) -> None:
    from test_coordinator import wait_idle, wait_state

    first = tmp_path / "first.json"
    first.write_text(json.dumps({"turns": [{"actions": [
        {"bash": 'ov mail send --to operator --type question --subject "which colour?" --body "old question"'},
        {"write": {"path": "old.txt", "content": "old\n"}},
        {"bash": "git add old.txt && git commit -q -m old"},
        {"sleep": 60},  # stopped here, mid-turn: its dispatch goes back unread
    ]}]}))
    slung = run_ov("sling", "builder", "s1", "--runtime", "scripted", "--scenario", str(first),
                   "--prompt", "OLD TASK: write old.txt", cwd=team.root)
    assert slung.returncode == 0, slung.stderr
    wait_for(lambda: run_git(team.root, "log", "--format=%s", "-1", "ov/builder-s1").strip() == "old", timeout=60,
             message="generation 1 to commit")
    wait_state(team, "builder-s1", {"in_turn"})
    stopped = run_ov("stop", "builder-s1", "--json", cwd=team.root)
    assert stopped.returncode == 0, stopped.stderr
    dispatch = mail_rows(team, recipient="builder-s1", type="dispatch")
    assert [(m["read_at"], m["claimed_by"]) for m in dispatch] == [(None, None)]  # given back unread
    assert run_ov("merge", "builder-s1", cwd=team.root).returncode == 0
    cleaned = run_ov("clean", cwd=team.root)
    assert cleaned.returncode == 0, cleaned.stderr
    assert run_git(team.root, "branch", "--list", "ov/builder-s1").strip() == ""

    second = tmp_path / "second.json"
    second.write_text(json.dumps({"turns": [
        {"actions": [{"expect_in_prompt": "NEW TASK"}], "result": "reading the task"},
        {"actions": [{"bash": 'ov mail send --type worker_done --subject "new done" --body "done"'}], "result": "done"},
    ]}))
    again = run_ov("sling", "builder", "s1", "--runtime", "scripted", "--scenario", str(second),
                   "--prompt", "NEW TASK: write new.txt", "--json", cwd=team.root)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["generation"] == 2
    wait_idle(team, "builder-s1", 1)
    # A late answer to generation 1's question would reach generation 2: refused, nothing stored.
    (question,) = mail_rows(team, sender="builder-s1", type="question")
    late = run_ov("mail", "reply", str(question["id"]), "--body", "blue", cwd=team.root)
    assert late.returncode == 1 and "generation 2 has the name now" in late.stderr, late.stderr
    assert mail_rows(team, recipient="builder-s1", type="result") == []
    assert run_ov("mail", "send", "--to", "builder-s1", "--subject", "go on", "--body", "finish",
                  cwd=team.root).returncode == 0
    assert wait_terminal(team, "builder-s1").state == "completed"

    prompts = _transcript(team, "builder-s1")
    assert "NEW TASK" in prompts and "OLD TASK" not in prompts and "blue" not in prompts
    assert [m["subject"] for m in mail_rows(team, sender="builder-s1", type="worker_done")] == ["new done"]
    old, new = mail_rows(team, recipient="builder-s1", type="dispatch")
    assert "OLD TASK" in old["body"] and "NEW TASK" in new["body"]
    assert old["superseded_by"] == 2 and old["claimed_by"] is None  # kept, closed, never delivered
    assert new["superseded_by"] is None and new["read_at"] is not None
    listed = run_ov("mail", "list", "--to", "builder-s1", cwd=team.root).stdout.splitlines()
    assert "never delivered: generation 2 took the name" in listed[0] and "(read)" in listed[1]
    shown = json.loads(run_ov("mail", "list", "--to", "builder-s1", "--json", cwd=team.root).stdout)
    assert [m["superseded_by"] for m in shown] == [2, None, None]
