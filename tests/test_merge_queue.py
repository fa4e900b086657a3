"""The merge queue as an operator meets it: builders' worker_done queue their branches, the dry run of
`ov merge --all` predicts the sequence, a failed merge stays listed with its reason until it is merged or
dismissed, and a gate failing on tier 2's keep-both combination commits nothing.

Real agents on the scripted runtime (they really write, commit and send mail), real git, the real `ov`.
"""

from __future__ import annotations

import json

from agent_helpers import mail_rows
from conftest import run_git, run_ov
from overstory.config.model import load_config
from overstory.merge.queue import queue_view
from overstory.store.db import open_state
from test_merge_flow import DONE, sling
from test_watchdog import write_local_config

LINES = "one\ntwo\nthree\n"


def commit_file(project, path, content, message):
    (project.root / path).write_text(content)
    run_git(project.root, "add", path)
    run_git(project.root, "commit", "-qm", message)


def writes(path, content, message):
    return [{"write": {"path": path, "content": content}}, {"bash": f"git add {path} && git commit -q -m '{message}'"},
            DONE]


def line_two(task):
    return writes("lines.txt", f"one\ntwo ({task})\nthree\n", f"{task}: line two")


def merge_all(project, *extra):
    result = run_ov("merge", "--all", "--json", *extra, cwd=project.root)
    assert "Traceback" not in result.stderr, result.stderr
    return result, json.loads(result.stdout)


def view(project):
    conn = open_state(project.state_db)
    try:
        return queue_view(project, conn, load_config(project.config_file, project.local_config_file))
    finally:
        conn.close()


def repo_snapshot(project):
    root = project.root
    return (run_git(root, "for-each-ref"), run_git(root, "rev-parse", "HEAD"), run_git(root, "ls-files", "-s"),
            run_git(root, "status", "--porcelain"))


def queue_rows(project):
    conn = open_state(project.state_db)
    try:
        return conn.execute("SELECT * FROM merge_queue ORDER BY id").fetchall()
    finally:
        conn.close()


def test_dry_run_predicts_the_sequence_and_the_real_run_agrees(project, tmp_path):
    commit_file(project, "lines.txt", LINES, "lines")
    sling(project, tmp_path, "a", line_two("a"))
    sling(project, tmp_path, "b", writes("b.txt", "b\n", "b: new file"))
    sling(project, tmp_path, "c", line_two("c"))  # conflicts with a only, which merges first
    before, rows = repo_snapshot(project), queue_rows(project)

    dry, predicted = merge_all(project, "--dry-run")
    assert dry.returncode == 1, dry.stdout  # one would not merge
    merges = predicted["merges"]
    assert [(m["agent"], m["merged"], m["tier"]) for m in merges] == [
        ("builder-a", True, 1), ("builder-b", True, 1), ("builder-c", False, 3)]
    assert merges[2]["conflicts"] == ["lines.txt"]
    assert "lines.txt is also changed by builder-a, merged before it in this order" in merges[2]["reason"]
    assert "builder-b" not in merges[2]["reason"]
    assert repo_snapshot(project) == before and queue_rows(project) == rows  # touched nothing

    real, done = merge_all(project)
    assert real.returncode == 1
    assert [(m["agent"], m["merged"]) for m in done["merges"]] == [(m["agent"], m["merged"]) for m in merges]
    assert [m["tier"] for m in done["merges"][:2]] == [1, 1]
    failed = done["merges"][2]
    assert failed["conflicts"] == ["lines.txt"] and "tier 3" in failed["reason"]
    assert run_git(project.root, "show", "main:lines.txt") == "one\ntwo (a)\nthree\n"


def test_a_failed_merge_stays_in_the_queue_until_merged_or_dismissed(project, tmp_path):
    commit_file(project, "lines.txt", LINES, "lines")
    for task in ("a", "c", "e"):
        sling(project, tmp_path, task, line_two(task))
    # The builders' worker_done put them in the queue: the dashboard and the dry run list the same branches.
    listed = view(project)
    _, predicted = merge_all(project, "--dry-run")
    assert [(e["branch"], e["status"]) for e in listed] == [(f"ov/builder-{t}", "announced") for t in "ace"]
    assert [m["branch"] for m in predicted["merges"]] == [e["branch"] for e in listed]

    real, done = merge_all(project)
    assert real.returncode == 1 and [m["merged"] for m in done["merges"]] == [True, False, False]
    listed = view(project)
    assert [(e["agent"], e["status"]) for e in listed] == [("builder-c", "failed"), ("builder-e", "failed"),
                                                           ("builder-a", "merged")]
    assert all("lines.txt" in e["result"] for e in listed[:2])
    _, predicted = merge_all(project, "--dry-run")
    assert [m["agent"] for m in predicted["merges"]] == ["builder-c", "builder-e"]
    assert all("its last merge failed: 1 conflicted file left unresolved: lines.txt" in m["reason"]
               for m in predicted["merges"])

    # c: resolved by hand; the next `ov merge --all` sees it merged and closes its entry.
    run_git(project.root, "merge", "-q", "--no-ff", "--no-commit", "-X", "theirs", "ov/builder-c")
    (project.root / "lines.txt").write_text("one\ntwo (a)\ntwo (c)\nthree\n")
    run_git(project.root, "commit", "-qam", "merge c by hand")
    # e: dismissed; --all neither tries it again nor lists it.
    dismissed = run_ov("merge", "builder-e", "--dismiss", cwd=project.root)
    assert dismissed.returncode == 0, dismissed.stderr
    assert dismissed.stdout.strip() == ("builder-e: dismissed from the merge queue; `ov merge builder-e` still "
                                        "merges it")
    real, done = merge_all(project)
    assert real.returncode == 0, real.stdout
    assert [(m["agent"], m["already_merged"]) for m in done["merges"]] == [("builder-c", True)]
    assert {e["agent"]: e["status"] for e in view(project)} == {"builder-a": "merged", "builder-c": "merged",
                                                                "builder-e": "dismissed"}
    assert merge_all(project)[1]["merges"] == [] and merge_all(project, "--dry-run")[1]["merges"] == []
    again = run_ov("merge", "builder-e", "--dismiss", cwd=project.root)
    assert again.returncode == 1 and "builder-e is not in the merge queue" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    both = run_ov("merge", "--all", "--dismiss", cwd=project.root)
    assert both.returncode == 2 and "--dismiss takes an AGENT or --branch B" in both.stderr


CALC = "def add(a, b):\n    return a + b\n"
CHECK_NAMES = """import ast, sys
names = [n.name for n in ast.parse(open("calc.py").read()).body if isinstance(n, ast.FunctionDef)]
twice = sorted({n for n in names if names.count(n) > 1})
sys.exit(f"defined twice in calc.py: {', '.join(twice)}" if twice else 0)
"""
GATE = "python3 check_names.py"


def test_a_gate_failing_on_the_kept_insertions_commits_nothing_and_names_the_gate(project, tmp_path):
    commit_file(project, "calc.py", CALC, "calc")
    commit_file(project, "check_names.py", CHECK_NAMES, "a gate: no function defined twice")
    write_local_config(project, merge={"gates": [GATE]})
    for task, body in (("x", "x"), ("y", "y")):  # both append their own helper(): each alone passes the gate
        sling(project, tmp_path, task, writes("calc.py", CALC + f"\n\ndef helper():\n    return '{body}'\n", task))

    _, predicted = merge_all(project, "--dry-run")
    assert [(m["agent"], m["tier"], m["merged"]) for m in predicted["merges"]] == [("builder-x", 1, True),
                                                                                    ("builder-y", 2, True)]
    before = run_git(project.root, "rev-parse", "main")
    real = run_ov("merge", "--all", cwd=project.root)
    assert real.returncode == 1
    assert real.stdout.splitlines()[0].startswith("builder-x: merged ov/builder-x into main (tier 1, ")
    assert (f"builder-y: NOT merged into main: quality gate {GATE!r} exited 1 on the combined result (tier 2 kept "
            "both sides' insertions in calc.py); nothing was committed; output tail:") in real.stdout
    assert "defined twice in calc.py: helper" in real.stdout
    next_step = next(line for line in real.stdout.splitlines() if line.startswith("  next: "))
    assert "set merge.ai_resolve: true, then `ov merge builder-y --tier-max 3`" in next_step
    assert "`git merge --no-ff ov/builder-y`" in next_step
    assert run_git(project.root, "rev-parse", "main^1") == before  # only x's merge was committed
    assert run_git(project.root, "show", "main:calc.py").count("def helper") == 1
    failed = mail_rows(project, type="merge_failed")
    assert len(failed) == 1 and GATE in failed[0]["body"]
    entry = next(e for e in view(project) if e["agent"] == "builder-y")
    assert entry["status"] == "failed" and GATE in entry["result"]
