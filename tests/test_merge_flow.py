"""The merge flow as an operator meets it: what `ov merge` merges, refuses, reports and suggests.

Real agents on the scripted runtime (it really writes files, commits and sends mail),
real git, the real `ov` CLI.
"""

from __future__ import annotations

import json
import os

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal, write_scenario
from conftest import run_git, run_ov
from test_watchdog import write_local_config


def commit_action(path, content):
    return [{"write": {"path": path, "content": content}},
            {"bash": f"git add {path} && git commit -q -m 'add {path}'"}]


DONE = {"bash": 'ov mail send --type worker_done --subject done --body "committed"'}


def sling(project, tmp_path, task, actions, wait=True):
    scenario = write_scenario(tmp_path / f"{task}.json", [{"actions": actions}])
    done = run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(scenario), cwd=project.root)
    assert done.returncode == 0, done.stderr
    if wait:
        return wait_terminal(project, f"builder-{task}")
    return None


def merged_to_operator(project):
    return [m for m in mail_rows(project, type="merged") if m["recipient"] == "operator"]


def test_merge_all_takes_finished_builders_in_completion_order_and_says_what_it_skipped(project, tmp_path):
    write_local_config(project, turns={"max_retries": 0, "retry_backoff": 0.05})
    assert sling(project, tmp_path, "z", [*commit_action("z.txt", "z\n"), DONE]).state == "completed"
    assert sling(project, tmp_path, "a", [*commit_action("a.txt", "a\n"), DONE]).state == "completed"
    assert sling(project, tmp_path, "c", [DONE]).state == "completed"  # no commits
    assert sling(project, tmp_path, "dead", [*commit_action("dead.txt", "x\n"), {"crash": 3}]).state == "zombie"
    sling(project, tmp_path, "busy", [*commit_action("busy.txt", "b\n"), {"sleep": 60}], wait=False)
    wait_for(lambda: run_git(project.root, "rev-list", "main..ov/builder-busy").strip(), message="busy's commit")

    result = run_ov("merge", "--all", "--json", cwd=project.root)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert [(m["agent"], m["merged"]) for m in document["merges"]] == [("builder-z", True), ("builder-a", True)]
    skipped = {s["agent"]: s["reason"] for s in document["skipped"]}
    assert set(skipped) == {"builder-c", "builder-dead", "builder-busy"}
    assert skipped["builder-c"].startswith("nothing to merge")
    assert skipped["builder-dead"].startswith("zombie") and "ov merge builder-dead" in skipped["builder-dead"]
    assert skipped["builder-busy"].startswith("still working (")
    assert (project.root / "z.txt").exists() and (project.root / "a.txt").exists()
    assert not (project.root / "dead.txt").exists() and not (project.root / "busy.txt").exists()

    text = run_ov("merge", "--all", cwd=project.root)  # merged ones are not listed again; the skipped still are
    assert "skipped builder-busy (ov/builder-busy): still working" in text.stdout
    assert "builder-z" not in text.stdout and "builder-a:" not in text.stdout
    run_ov("stop", "builder-busy", "--force", cwd=project.root)


def test_a_branch_with_no_commits_is_nothing_to_merge(project, tmp_path):
    sling(project, tmp_path, "c", [DONE])
    before = run_git(project.root, "rev-parse", "main")
    result = run_ov("merge", "builder-c", cwd=project.root)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("builder-c: nothing to merge: ov/builder-c has no commits since it was "
                                     "slung from main")
    assert run_git(project.root, "rev-parse", "main") == before
    assert mail_rows(project, type="merged") == [] and mail_rows(project, type="merge_failed") == []


def test_merging_a_working_agent_is_refused_unless_forced_and_the_mail_names_the_commits(project, tmp_path):
    sling(project, tmp_path, "w", [*commit_action("w1.txt", "1\n"), *commit_action("w2.txt", "2\n"), {"sleep": 60}],
          wait=False)
    wait_for(lambda: len(run_git(project.root, "rev-list", "main..ov/builder-w").split()) == 2, message="2 commits")
    refused = run_ov("merge", "builder-w", cwd=project.root)
    assert refused.returncode == 1
    assert "builder-w is still working (state " in refused.stderr and "--force" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    forced = run_ov("merge", "builder-w", "--force", cwd=project.root)
    assert forced.returncode == 0, forced.stderr
    assert "merged ov/builder-w into main (tier 1, " in forced.stdout and "): 2 commits" in forced.stdout
    commits = run_git(project.root, "rev-list", "--reverse", "main^1..main^2").split()
    mails = mail_rows(project, type="merged")
    assert sorted(m["recipient"] for m in mails) == ["builder-w", "operator"]  # it still runs: it is told too
    for mail in mails:
        assert json.loads(mail["payload"])["commits"] == commits
        assert "add w1.txt" in mail["body"] and "add w2.txt" in mail["body"]
        assert mail["subject"].endswith(": 2 commits")
    run_ov("stop", "builder-w", "--force", cwd=project.root)


def _conflicting(project, tmp_path, task="a"):
    sling(project, tmp_path, task, [*commit_action("README.md", "from the agent\n"), DONE])
    (project.root / "README.md").write_text("from the operator\n")
    run_git(project.root, "commit", "-qam", "operator edit")


def test_dry_run_names_the_tier_and_each_conflicting_file(project, tmp_path):
    sling(project, tmp_path, "a", [*commit_action("a.txt", "a\n"), DONE])
    clean = run_ov("merge", "builder-a", "--dry-run", cwd=project.root)
    assert clean.returncode == 0 and "would merge with tier 1; clean merge" in clean.stdout

    (project.root / "lines.txt").write_text("one\ntwo\nthree\n")
    run_git(project.root, "add", "lines.txt")
    run_git(project.root, "commit", "-qm", "lines")
    sling(project, tmp_path, "b", [{"bash": "git merge -q main && printf 'one\\ntwo\\nTHREE\\n' > lines.txt && "
                                            "git commit -qam 'edit three'"}, DONE])
    (project.root / "lines.txt").write_text("one\nTWO\nthree\n")
    run_git(project.root, "commit", "-qam", "edit two")
    tier2 = run_ov("merge", "builder-b", "--dry-run", cwd=project.root)
    assert tier2.returncode == 0, tier2.stdout + tier2.stderr
    assert "would merge with tier 2" in tier2.stdout and "  conflict: lines.txt: tier 2:" in tier2.stdout

    _conflicting(project, tmp_path, task="d")
    needs3 = run_ov("merge", "builder-d", "--dry-run", cwd=project.root)
    assert needs3.returncode == 1
    assert "would NOT merge: it needs tier 3 but tier_max is 2" in needs3.stdout
    assert "  conflict: README.md: tier 3:" in needs3.stdout


def test_a_failed_merge_prints_the_next_step_and_following_it_works(project, tmp_path):
    _conflicting(project, tmp_path)
    failed = run_ov("merge", "builder-a", cwd=project.root)
    assert failed.returncode == 1
    next_line = next(line for line in failed.stdout.splitlines() if line.startswith("  next: "))
    assert "`git merge --no-ff ov/builder-a`" in next_line and "README.md" in next_line
    assert "--tier-max 3" not in next_line and "merge.ai_resolve: true" in next_line
    assert json.loads(mail_rows(project, type="merge_failed")[0]["payload"])["conflict_files"] == ["README.md"]

    write_local_config(project, merge={"ai_resolve": True})
    configured = run_ov("merge", "builder-a", cwd=project.root)
    assert "`ov merge builder-a --tier-max 3`" in configured.stdout
    assert len(mail_rows(project, type="merge_failed")) == 1, "the same failure is reported once"

    # Do what the next step says, by hand.
    assert run_git(project.root, "status", "--porcelain", "--", ".", ":!.overstory") == ""
    import subprocess

    subprocess.run(["git", "merge", "--no-ff", "ov/builder-a"], cwd=project.root, capture_output=True)
    (project.root / "README.md").write_text("from the operator\nfrom the agent\n")
    run_git(project.root, "add", "README.md")
    run_git(project.root, "commit", "-q", "--no-edit")
    reported = run_ov("merge", "builder-a", cwd=project.root)
    assert reported.returncode == 0 and "already merged into main by" in reported.stdout
    mails = [m for m in mail_rows(project, type="merged") if m["recipient"] == "operator"]
    assert len(mails) == 1
    assert json.loads(mails[0]["payload"])["commit"] == run_git(project.root, "rev-parse", "HEAD").strip()


def test_tier_three_without_a_key_is_one_clear_line(project, tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    _conflicting(project, tmp_path)
    write_local_config(project, merge={"ai_resolve": True})
    result = run_ov("merge", "builder-a", "--tier-max", "3", cwd=project.root, env={"ANTHROPIC_API_KEY": ""})
    assert result.returncode == 1
    assert result.stderr.strip() == ("ov: error: tier 3 needs ANTHROPIC_API_KEY or a provider (merge.model: "
                                     "provider/model, with the key in the provider's api_key_env); nothing was merged")
    assert "TypeError" not in result.stdout + result.stderr
    assert (project.root / "README.md").read_text() == "from the operator\n"


def test_worker_done_gets_the_real_commit_and_files_from_git(project, tmp_path):
    sling(project, tmp_path, "a", [*commit_action("a.txt", "a\n"), *commit_action("src/b.py", "b = 1\n"), DONE])
    payload = json.loads(mail_rows(project, type="worker_done")[0]["payload"])
    assert payload["commit"] == run_git(project.root, "rev-parse", "ov/builder-a").strip()
    assert sorted(payload["files_modified"]) == ["a.txt", "src/b.py"]

    given = {"bash": "ov mail send --type worker_done --subject done --payload "
                     "'{\"files_modified\": [\"c.txt\"]}'"}
    sling(project, tmp_path, "c", [*commit_action("c.txt", "c\n"), given])
    payload = json.loads(mail_rows(project, sender="builder-c", type="worker_done")[0]["payload"])
    assert payload["files_modified"] == ["c.txt"]  # what the agent said is kept
    assert payload["commit"] == run_git(project.root, "rev-parse", "ov/builder-c").strip()
    assert agent_state(project, "builder-c").state == "completed"
    assert os.path.exists(project.root)


def test_an_agents_own_merge_report_is_kept_read_and_does_not_wake_it(project, state_db):
    """A lead (or the coordinator) that merges its child's branch has the result as its command's output: its copy
    of the report is kept for the record, already read, so it does not start a (paid) turn to read it again. The
    child, still running, gets its copy unread; the operator's own reports stay as they were."""
    from overstory.merge.announce import announce
    from overstory.store import mail, sessions

    for name, parent in (("lead-m", "operator"), ("builder-m", "lead-m")):
        sessions.create_session(state_db, name=name, capability=name.split("-")[0], task_id="m", runtime="scripted",
                                actor="test", parent=parent)
    child = sessions.get(state_db, "builder-m")
    ids = announce(state_db, project.root, child, merged=True, branch="ov/builder-m", target="main",
                   source_commit="c0ffee", reason="merged cleanly", sender="lead-m")
    marks = ",".join("?" * len(ids))
    rows = {r["recipient"]: r for r in state_db.execute(f"SELECT * FROM mail WHERE id IN ({marks})", ids)}
    assert set(rows) == {"lead-m", "builder-m"}
    assert rows["lead-m"]["read_at"] is not None and mail.pending_count(state_db, "lead-m") == 0
    assert rows["builder-m"]["read_at"] is None and mail.pending_count(state_db, "builder-m") == 1
