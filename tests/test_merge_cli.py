"""`ov merge` end to end: agents announce work with merge_ready, the queue merges it back."""

from __future__ import annotations

import json

from agent_helpers import mail_rows, wait_terminal, write_scenario
from conftest import run_git, run_ov


def builder_scenario(tmp_path, name, path, content):
    return write_scenario(tmp_path / f"{name}.json", [{"actions": [
        {"write": {"path": path, "content": content}},
        {"bash": f"git add {path} && git commit -q -m 'change {path}'"},
        {"bash": "ov mail send --type merge_ready --to operator --subject ready "
                 f"--payload '{{\"files_modified\": [\"{path}\"]}}'"},
        {"bash": 'ov mail send --type worker_done --subject done --body "committed"'},
    ]}])


def sling(project, tmp_path, task, path, content):
    scenario = builder_scenario(tmp_path, task, path, content)
    result = run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(scenario), cwd=project.root)
    assert result.returncode == 0, result.stderr
    assert wait_terminal(project, f"builder-{task}").state == "completed"


def snapshot(root):
    return (run_git(root, "rev-parse", "HEAD"), run_git(root, "status", "--porcelain"), run_git(root, "ls-files", "-s"),
            run_git(root, "for-each-ref"))


def test_merge_all_merges_two_builders(project, tmp_path):
    sling(project, tmp_path, "a", "a.txt", "from a\n")
    sling(project, tmp_path, "b", "b.txt", "from b\n")
    result = run_ov("merge", "--all", "--json", cwd=project.root)
    assert result.returncode == 0, result.stdout + result.stderr
    merges = json.loads(result.stdout)["merges"]
    assert [m["agent"] for m in merges] == ["builder-a", "builder-b"] and all(m["merged"] for m in merges)
    assert (project.root / "a.txt").read_text() == "from a\n"
    assert (project.root / "b.txt").read_text() == "from b\n"
    merged = [m for m in mail_rows(project, type="merged") if m["recipient"] == "operator"]
    assert len(merged) == 2
    again = run_ov("merge", "--all", "--json", cwd=project.root)
    assert again.returncode == 0 and json.loads(again.stdout)["merges"] == []  # the queue is drained


def test_same_line_conflict_fails_and_leaves_the_target_untouched(project, tmp_path):
    sling(project, tmp_path, "a", "README.md", "from the agent\n")
    (project.root / "README.md").write_text("from the operator\n")
    run_git(project.root, "commit", "-qam", "operator edit")
    (project.root / "untracked-note.txt").write_text("mine\n")
    before = snapshot(project.root)
    result = run_ov("merge", "builder-a", cwd=project.root)
    assert result.returncode != 0
    assert "README.md" in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert snapshot(project.root) == before
    assert (project.root / "README.md").read_text() == "from the operator\n"
    failed = mail_rows(project, type="merge_failed")
    assert failed and "README.md" in json.loads(failed[0]["payload"])["conflict_files"]


def test_dry_run_changes_nothing(project, tmp_path):
    sling(project, tmp_path, "a", "README.md", "from the agent\n")
    (project.root / "README.md").write_text("from the operator\n")
    run_git(project.root, "commit", "-qam", "operator edit")
    before = snapshot(project.root)
    result = run_ov("merge", "builder-a", "--dry-run", "--json", cwd=project.root)
    report = json.loads(result.stdout)["merges"][0]
    assert report["dry_run"] and report["conflicts"] == ["README.md"] and not report["merged"]
    assert snapshot(project.root) == before
    clean = run_ov("merge", "--branch", "ov/builder-a", "--into", "main", "--dry-run", cwd=project.root)
    assert "README.md" in clean.stdout
    assert snapshot(project.root) == before


def test_tier_three_needs_opt_in_and_arguments_are_checked(project, tmp_path):
    sling(project, tmp_path, "a", "a.txt", "x\n")
    refused = run_ov("merge", "builder-a", "--tier-max", "3", cwd=project.root)
    assert refused.returncode == 2 and "ai_resolve" in refused.stderr
    both = run_ov("merge", "builder-a", "--all", cwd=project.root)
    assert both.returncode == 2 and "exactly one" in both.stderr
    unknown = run_ov("merge", "nobody", cwd=project.root)
    assert unknown.returncode == 1 and "no agent named" in unknown.stderr
