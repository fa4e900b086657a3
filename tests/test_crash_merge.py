"""`ov merge` killed (SIGKILL) at each of its steps, and three `ov merge` of one agent at once.

The real `ov merge` runs as a subprocess with ``OV_TEST_KILL_AT=merge:<step>``: after its
record of intent (``intent``), with a merge in progress (``merging``: MERGE_HEAD exists in
its scratch worktree), with the merge commit made (``committed``), with the publish
journal written (``publishing``), and after the target moved but before the result was
mailed (``published``). Right after the kill the operator's checkout must be exactly as
before (no MERGE_HEAD, nothing staged): the merge never happens there. Then a retry, `ov
stop --clean` or the watchdog settles it, and nothing is left: no scratch worktree,
journal, intent row or git merge state, and exactly one ``merged`` mail if (and only if)
the branch was merged.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from agent_helpers import mail_rows, wait_terminal, write_scenario
from conftest import ov_command, run_git, run_ov
from overstory.store.db import open_state
from test_watchdog import write_local_config

STEPS = ["intent", "merging", "committed", "publishing", "published"]
MERGED_STEPS = {"published"}
AGENT = "builder-a"


def slung_builder(project, tmp_path, task="a", path="a.txt", content="from a\n"):
    scenario = write_scenario(tmp_path / f"{task}.json", [{"actions": [
        {"write": {"path": path, "content": content}},
        {"bash": f"git add {path} && git commit -q -m 'add {path}'"},
        {"bash": 'ov mail send --type worker_done --subject done --body "committed"'},
    ]}])
    done = run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(scenario), cwd=project.root)
    assert done.returncode == 0, done.stderr
    assert wait_terminal(project, f"builder-{task}").state == "completed"


def checkout(root):
    """The operator's checkout: HEAD, index, status, and any merge in progress."""
    return {"index": run_git(root, "ls-files", "-s"),
            "status": run_git(root, "status", "--porcelain", "--", ".", ":!.overstory"),
            "merge_head": subprocess.run(["git", "rev-parse", "-q", "--verify", "MERGE_HEAD"], cwd=root,
                                         capture_output=True, text=True).stdout}


def merges_on_main(root):
    return run_git(root, "rev-list", "--merges", "--first-parent", "main").split()


def merged_mail(project):
    return [m for m in mail_rows(project, type="merged") if m["recipient"] == "operator"]


def nothing_left(project):
    conn = open_state(project.state_db)
    try:
        intents = conn.execute("SELECT count(*) FROM merge_intents").fetchone()[0]
    finally:
        conn.close()
    tmp = project.ov_dir / "tmp"
    listed = [ln for ln in run_git(project.root, "worktree", "list", "--porcelain").splitlines()
              if ln.startswith("worktree ") and "/.overstory/tmp/" in ln]
    return {"intents": intents, "scratch_worktrees": listed,
            "scratch_dirs": sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else [],
            "journals": sorted(p.name for p in project.locks_dir.glob("merge-*.journal*")),
            "merge_head": checkout(project.root)["merge_head"], "status": checkout(project.root)["status"]}


CLEAN = {"intents": 0, "scratch_worktrees": [], "scratch_dirs": [], "journals": [], "merge_head": "", "status": ""}


def kill_merge(project, step):
    before = checkout(project.root)
    main_before = run_git(project.root, "rev-parse", "main").strip()
    killed = run_ov("merge", AGENT, cwd=project.root, env={"OV_TEST_KILL_AT": f"merge:{step}"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    # Whatever the step, the operator's checkout holds no merge state and nothing staged.
    after = checkout(project.root)
    assert after["merge_head"] == "" and after["status"] == ""
    if step in MERGED_STEPS:
        assert run_git(project.root, "rev-parse", "main").strip() != main_before
    else:
        assert after == before and run_git(project.root, "rev-parse", "main").strip() == main_before
    assert merged_mail(project) == []  # killed before announcing
    return main_before


def assert_merged_once(project, main_before):
    assert (project.root / "a.txt").read_text() == "from a\n"
    assert len(merges_on_main(project.root)) == 1
    assert run_git(project.root, "rev-parse", "main^1").strip() == main_before
    mails = merged_mail(project)
    assert len(mails) == 1, mails
    payload = json.loads(mails[0]["payload"])
    branch_head = run_git(project.root, "rev-parse", "main^2").strip()
    assert run_git(project.root, "log", "--format=%s", "-1", branch_head).strip() == "add a.txt"
    assert payload["commits"] == [branch_head]
    assert payload["commit"] == run_git(project.root, "rev-parse", "main").strip()


@pytest.mark.parametrize("step", STEPS)
def test_killed_merge_then_retry(project, tmp_path, step):
    slung_builder(project, tmp_path)
    main_before = kill_merge(project, step)
    retry = run_ov("merge", AGENT, cwd=project.root)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    expected = "already merged" if step in MERGED_STEPS else "merged ov/builder-a into main"
    assert expected in retry.stdout
    assert_merged_once(project, main_before)
    assert nothing_left(project) == CLEAN


@pytest.mark.parametrize("step", STEPS)
def test_killed_merge_then_stop_clean(project, tmp_path, step):
    slung_builder(project, tmp_path)
    main_before = kill_merge(project, step)
    stopped = run_ov("stop", AGENT, "--clean", cwd=project.root)
    if step in MERGED_STEPS:
        assert stopped.returncode == 0, stopped.stderr
        assert_merged_once(project, main_before)  # the interrupted run's result was announced first
    else:
        assert stopped.returncode == 1 and "not merged" in stopped.stderr, stopped.stderr
        forced = run_ov("stop", AGENT, "--clean", "--force", cwd=project.root)
        assert forced.returncode == 0, forced.stderr
        assert run_git(project.root, "rev-parse", "main").strip() == main_before and merged_mail(project) == []
    assert run_git(project.root, "branch", "--list", "ov/builder-a").strip() == ""
    assert nothing_left(project) == CLEAN


@pytest.mark.parametrize("step", STEPS)
def test_killed_merge_is_settled_by_the_watchdog(project, tmp_path, step):
    slung_builder(project, tmp_path)
    main_before = kill_merge(project, step)
    dog = run_ov("watchdog", "--once", "--json", cwd=project.root)
    assert dog.returncode == 0, dog.stderr
    kinds = [json.loads(line)["kind"] for line in dog.stdout.splitlines()]
    assert "merge_settled" in kinds
    assert nothing_left(project) == CLEAN
    if step in MERGED_STEPS:
        assert_merged_once(project, main_before)
    else:
        assert run_git(project.root, "rev-parse", "main").strip() == main_before and merged_mail(project) == []
        again = run_ov("merge", AGENT, cwd=project.root)  # and the merge can simply be run again
        assert again.returncode == 0, again.stderr
        assert_merged_once(project, main_before)


def test_three_concurrent_merges_of_one_agent_merge_once_and_mail_once(project, tmp_path):
    slung_builder(project, tmp_path)
    write_local_config(project, merge={"gates": ["sleep 1"], "lock_wait": 120})  # the others wait on the lock
    main_before = run_git(project.root, "rev-parse", "main").strip()
    runs = [subprocess.Popen([*ov_command(), "merge", AGENT, "--json"], cwd=project.root, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = []
    for proc in runs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out + err
        results.append(json.loads(out)["merges"][0])
    assert sum(1 for r in results if r["merged"] and not r["already_merged"]) == 1
    assert sum(1 for r in results if r["already_merged"]) == 2
    assert_merged_once(project, main_before)
    assert len([m for m in mail_rows(project, type="merged")]) == 1  # the builder is completed: only its parent
    assert nothing_left(project) == CLEAN


def test_a_publish_that_git_left_half_done_is_rolled_back(project, tmp_path):
    """What a killed fast-forward can leave (files of the new commit, HEAD at the old one) is put back."""
    from overstory.merge._git import Git
    from overstory.merge.publish import journal_path, recover, write_journal

    slung_builder(project, tmp_path)
    old = run_git(project.root, "rev-parse", "main").strip()
    new = run_git(project.root, "rev-parse", "ov/builder-a").strip()
    (project.root / "notes.txt").write_text("the operator's own, untracked\n")
    write_journal(journal_path(project.locks_dir, "main"), {"target": "main", "old": old, "new": new,
                                                            "phase": "publishing", "at_root": True, "worktree": ""})
    (project.root / "a.txt").write_text("from a\n")  # git wrote this file, then died before moving main
    done = recover(Git(project.root), project.root, project.locks_dir, "main")
    assert any("rolled back" in line and "a.txt" in line for line in done), done
    assert not (project.root / "a.txt").exists()
    assert run_git(project.root, "status", "--porcelain", "--", ".", ":!.overstory") == "?? notes.txt\n"
    assert not journal_path(project.locks_dir, "main").exists()
