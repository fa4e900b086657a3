"""Write scopes with real agents (issue 31): scripted builders refused outside their `--files`, a commit
that strays flagged at merge, and a lead that may not report before its builders are done and merged.

Real agents on the scripted runtime (its Write, Edit and Bash go through the worktree's hooks, where
claude calls them), real sandbox, git, SQLite and `ov`.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal, write_scenario
from conftest import run_git, run_ov
from overstory.paths import ProjectPaths
from overstory.store import ledger
from overstory.store.db import open_state
from test_watchdog import write_local_config

DONE = {"bash": 'ov mail send --type worker_done --subject done --body "committed"'}
LEAD_DONE = "ov mail send --type worker_done --subject 'team done' --body finished"


def _base(project: ProjectPaths) -> None:
    (project.root / "src").mkdir()
    (project.root / "src" / "a.py").write_text("A = 1\n")
    (project.root / "src" / "b.py").write_text("B = 1\n")
    run_git(project.root, "add", "src")
    run_git(project.root, "commit", "-qm", "src")


def _sling(project: ProjectPaths, tmp_path: Path, task: str, actions: list, *extra: str) -> str:
    scenario = write_scenario(tmp_path / f"{task}.json", [{"actions": actions}])
    done = run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(scenario), *extra,
                  cwd=project.root)
    assert done.returncode == 0, done.stderr
    return f"builder-{task}"


def _calls(project: ProjectPaths, name: str) -> list[dict]:
    conn = open_state(project.state_db)
    try:
        return ledger.calls(conn, agent=name)  # oldest first
    finally:
        conn.close()


def test_a_scoped_builder_is_refused_edit_and_redirect_outside_its_files_and_writes_its_own(project, tmp_path):
    _base(project)
    wt = project.worktree("builder-s")
    name = _sling(project, tmp_path, "s", [
        {"edit": {"path": "src/b.py", "old": "B = 1", "new": "B = 2"}},
        {"bash": "echo 'B = 3' > src/b.py"},
        {"write": {"path": str(wt / "src" / "b.py"), "content": "B = 4\n"}},
        {"write": {"path": "src/a.py", "content": "A = 2\n"}},
        {"bash": "git add src/a.py && git commit -qm 'a: 2'"}, DONE,
    ], "--files", "src/a.py")
    assert wait_terminal(project, name).state == "completed"
    calls = [(c["tool"], c["status"]) for c in _calls(project, name)]
    assert calls[:4] == [("Edit", "denied"), ("Bash", "denied"), ("Write", "denied"), ("Write", "succeeded")]
    for call in _calls(project, name)[:3]:
        assert "outside builder-s's write scope (src/a.py)" in call["reason"]
        assert "ov mail send --to operator --type question" in call["reason"]
    assert (wt / "src" / "b.py").read_text() == "B = 1\n"
    assert run_git(project.root, "diff", "--name-only", "main", "ov/builder-s").split() == ["src/a.py"]
    merged = run_ov("merge", name, cwd=project.root)
    assert merged.returncode == 0 and "merged ov/builder-s into main" in merged.stdout, merged.stdout + merged.stderr


def test_a_commit_outside_the_scope_made_by_other_means_is_flagged_at_merge(project, tmp_path):
    _base(project)
    # A script writes src/b.py: the guard cannot see inside interpreter code (by design), the merge can.
    name = _sling(project, tmp_path, "x", [
        {"write": {"path": "src/a.py", "content": "A = 2\n"}},
        {"bash": "python3 -c \"open('src/b.py', 'w').write('B = 9\\n')\" && git add src && git commit -qm both"},
        DONE,
    ], "--files", "src/a.py")
    assert wait_terminal(project, name).state == "completed"
    before = run_git(project.root, "rev-parse", "main")

    predicted = run_ov("merge", name, "--dry-run", cwd=project.root)
    assert predicted.returncode == 1
    assert "would NOT merge: out of scope: the branch changes src/b.py, outside builder-x's write scope (src/a.py" \
        in predicted.stdout
    listed = run_ov("merge", "--all", "--dry-run", "--json", cwd=project.root)
    [entry] = json.loads(listed.stdout)["merges"]
    assert not entry["merged"] and "out of scope" in entry["reason"]

    refused = run_ov("merge", name, cwd=project.root)
    assert refused.returncode == 1
    assert "NOT merged into main: out of scope: the branch changes src/b.py" in refused.stdout
    assert "`ov merge builder-x --allow-out-of-scope`" in refused.stdout
    assert run_git(project.root, "rev-parse", "main") == before
    [failed] = [m for m in mail_rows(project, type="merge_failed") if m["recipient"] == "operator"]
    assert "src/b.py" in failed["body"] and "allow-out-of-scope" in failed["body"]
    queue = json.loads(run_ov("merge", "--all", "--dry-run", "--json", cwd=project.root).stdout)["merges"]
    assert "its last merge failed: out of scope" in queue[0]["reason"]

    usage = run_ov("merge", "--all", "--allow-out-of-scope", cwd=project.root)
    assert usage.returncode == 2 and "ov merge AGENT --allow-out-of-scope" in usage.stderr
    allowed = run_ov("merge", name, "--allow-out-of-scope", cwd=project.root)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert (project.root / "src" / "b.py").read_text() == "B = 9\n"


def test_a_leads_worker_done_is_refused_while_a_builder_works_or_is_unmerged(project, tmp_path):
    _base(project)
    shared = tmp_path / "shared"  # a sandboxed turn has its own /tmp: the scenario and the marker live here
    shared.mkdir()
    write_local_config(project, sandbox={"writable": [str(shared)]})
    go = shared / "go"  # the builder waits for it: the lead reports while it is provably still working
    builder = write_scenario(shared / "builder.json", [{"actions": [
        {"bash": f"for i in $(seq 1200); do test -e {go} && break; sleep 0.05; done"},
        {"write": {"path": "src/b.py", "content": "B = 2\n"}},  # its lead gave it src/a.py only
        {"write": {"path": "src/a.py", "content": "A = 2\n"}},
        {"bash": "git add src/a.py && git commit -qm 'a: 2'"}, DONE]}])
    lead = write_scenario(tmp_path / "lead.json", [
        {"actions": [{"bash": f"ov sling builder b --runtime scripted --scenario {builder} --files src/a.py "
                              "--prompt 'set A to 2'"},
                     {"bash": LEAD_DONE}], "result": "waiting for builder-b"},
        {"actions": [{"bash": LEAD_DONE}], "result": "waiting for the merge"},
        {"actions": [{"bash": LEAD_DONE}], "result": "done"},
    ])
    slung = run_ov("sling", "lead", "l", "--runtime", "scripted", "--scenario", str(lead), "--prompt", "lead",
                   cwd=project.root)
    assert slung.returncode == 0, slung.stderr

    def lead_reports() -> list[dict]:
        return [c for c in _calls(project, "lead-l") if "team done" in c["input"] and c["status"] != "started"]

    first = wait_for(lambda: lead_reports(), 60, message="the lead's first report")[0]
    assert first["status"] == "failed", first
    assert "worker_done refused: 1 of your builders is not done: builder-b is still working" in first["receipt"]
    builder_b = agent_state(project, "builder-b")
    assert builder_b.state in ("booting", "in_turn") and builder_b.spec["write_scope"] == ["src/a.py"]
    go.write_text("go")

    second = wait_for(lambda: (r := lead_reports()) and len(r) >= 2 and r[1], 90, message="the lead's second report")
    assert second["status"] == "failed"
    assert "builder-b has 1 commit on ov/builder-b not merged into main" in second["receipt"]
    assert [m for m in mail_rows(project, type="worker_done") if m["sender"] == "lead-l"] == []
    writes = [(c["tool"], c["status"]) for c in _calls(project, "builder-b") if c["tool"] == "Write"]
    assert writes == [("Write", "denied"), ("Write", "succeeded")]  # the lead's --files hold its builder too

    merged = run_ov("merge", "builder-b", cwd=project.root)  # its `merged` mail wakes the lead
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert wait_terminal(project, "lead-l").state == "completed"
    assert len([m for m in mail_rows(project, type="worker_done") if m["sender"] == "lead-l"]) == 1
