"""`ov coordinator check-complete` and `ov coordinator output`, as real `ov` processes on a real git repository."""

from __future__ import annotations

import json
import typing as t

from conftest import run_git, run_ov
from overstory.paths import ProjectPaths
from overstory.store import mail, merge_queue, runs, sessions
from overstory.store.db import write_transaction


def _agent(conn: t.Any, name: str, capability: str, run_id: str, *, branch: str | None = None) -> None:
    sessions.create_session(conn, name=name, capability=capability, task_id=name, runtime="scripted", actor="test",
                            parent="operator" if capability == "coordinator" else "coordinator",
                            depth=0 if capability == "coordinator" else 1, run_id=run_id, branch=branch,
                            base_branch="main" if branch else None)


def _end(conn: t.Any, name: str) -> None:
    agent = sessions.get(conn, name)
    assert sessions.transition(conn, name, agent.generation, "completed", actor="test").ok


def _commit_on(root: t.Any, branch: str, file: str) -> None:
    run_git(root, "checkout", "-q", "-b", branch)
    (root / file).write_text(file)
    run_git(root, "add", file)
    run_git(root, "commit", "-q", "-m", f"add {file}")
    run_git(root, "checkout", "-q", "main")


def test_check_complete_lists_what_is_open_until_all_is_ended_and_merged(project: ProjectPaths,
                                                                          state_db: t.Any) -> None:
    root = project.root
    assert run_git(root, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"

    def check(*args: str) -> t.Any:
        return run_ov("coordinator", "check-complete", *args, cwd=root)

    assert check().returncode == 1, "no run yet"
    run, _ = runs.open_or_join(state_db, "coordinator")
    _agent(state_db, "coordinator", "coordinator", run.id)
    empty = check()
    assert empty.returncode == 1 and "no agent has been slung" in empty.stdout
    _agent(state_db, "builder-a", "builder", run.id, branch="ov/builder-a")
    _agent(state_db, "builder-b", "builder", run.id, branch="ov/builder-b")
    _agent(state_db, "scout-c", "scout", run.id, branch="ov/scout-c")
    _commit_on(root, "ov/builder-a", "a.txt")
    _commit_on(root, "ov/builder-b", "b.txt")
    run_git(root, "branch", "ov/scout-c")  # a scout commits nothing
    _end(state_db, "builder-a")
    _end(state_db, "scout-c")

    pending = check("--json")
    assert pending.returncode == 1
    document = json.loads(pending.stdout)
    assert document["run"] == run.id and document["complete"] is False and document["agents"] == 3
    assert {i["name"]: i["open"] for i in document["open"]} == {
        "builder-a": "not merged into main", "builder-b": "still booting"}
    text = check()
    assert "2 of 3 agent(s) still open" in text.stdout and "builder-b (builder, booting): still booting" in text.stdout

    run_git(root, "merge", "-q", "--no-edit", "ov/builder-a")
    _end(state_db, "builder-b")
    with write_transaction(state_db):  # builder-b's work was given up by the operator, and its branch deleted
        merge_queue.enqueue(state_db, agent="builder-b", branch="ov/builder-b", target="main", task_id="builder-b",
                            files=[], mail_id=None, enqueued_at=1)
    merge_queue.dismiss(state_db, "ov/builder-b", "not wanted")
    run_git(root, "branch", "-q", "-D", "ov/builder-b")
    done = check("--run", run.id[:12])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "complete (3 agent(s) ended, their work merged)" in done.stdout
    notes = {c["name"]: c["note"] for c in json.loads(check("--json").stdout)["children"]}
    assert notes == {"builder-a": "in main", "builder-b": "dismissed by the operator", "scout-c": "in main"}


def test_output_is_the_runs_report(project: ProjectPaths, state_db: t.Any) -> None:
    run, _ = runs.open_or_join(state_db, "coordinator")
    _agent(state_db, "coordinator", "coordinator", run.id)
    _agent(state_db, "builder-a", "builder", run.id)
    mail.send(state_db, sender="coordinator", to="operator", subject="greet() is in", type="status",
              body="builder-a added greet() and its test; merged into main.")
    mail.send(state_db, sender="builder-a", to="operator", subject="not the coordinator's", type="status")
    shown = run_ov("coordinator", "output", cwd=project.root)
    assert shown.returncode == 0, shown.stderr
    assert f"run {run.id} (open), coordinator coordinator: 2 agent(s)" in shown.stdout
    assert "[status] greet() is in" in shown.stdout and "merged into main." in shown.stdout
    assert "not the coordinator's" not in shown.stdout
    document = json.loads(run_ov("coordinator", "output", "--json", cwd=project.root).stdout)
    assert [r["subject"] for r in document["reports"]] == ["greet() is in"]
    assert run_ov("coordinator", "output", "--run", "nope", cwd=project.root).returncode == 1
