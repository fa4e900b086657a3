"""A builder about to report `worker_done` is told of its siblings' work merged into its base branch since it
started: held once when its branch would conflict with it, a note when it merges cleanly (through `ov mail send`)."""

from __future__ import annotations

import contextlib
import io
import json
import typing as t

import pytest

from conftest import run_git
from overstory.cli import fast
from overstory.config.load import load
from overstory.paths import ProjectPaths
from overstory.store import mail


def builder(project: ProjectPaths, conn: t.Any, task: str) -> str:
    """A builder slung in-process with its branch and worktree (no loop: this test plays its turns)."""
    from overstory.agents.spawn import sling
    from overstory.wire import SlingRequest

    config = load(project.config_file, project.local_config_file, environ={})
    return sling(project, config, conn, SlingRequest(capability="builder", task_id=task, runtime="scripted",
                                                     prompt=task), start=False).name


def commit(project: ProjectPaths, agent: str, name: str, text: str) -> None:
    worktree = project.worktree(agent)
    (worktree / name).write_text(text)
    run_git(worktree, "add", name)
    run_git(worktree, "commit", "-q", "-m", f"{agent}: {name}")


def ov(project: ProjectPaths, *args: str, code: int = 0) -> str:
    out, err = io.StringIO(), io.StringIO()
    got = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            fast.main(["--project", str(project.root), *args])
        except SystemExit as exit_:
            got = int(exit_.code or 0)
    assert got == code, (args, got, out.getvalue(), err.getvalue())
    return out.getvalue()


def report(project: ProjectPaths, monkeypatch: pytest.MonkeyPatch, agent: str, *extra: str) -> str:
    """`ov mail send --type worker_done` as the builder (its name in the environment, from its worktree)."""
    monkeypatch.setenv("OVERSTORY_AGENT_NAME", agent)
    monkeypatch.chdir(project.worktree(agent))
    try:
        return ov(project, "mail", "send", "--type", "worker_done", "--subject", f"done: {agent}", "--body", "done",
                  *extra)
    finally:
        monkeypatch.delenv("OVERSTORY_AGENT_NAME")


def reports_from(conn: t.Any, agent: str) -> int:
    return sum(1 for m in mail.list_messages(conn, sender=agent, type="worker_done"))


def test_a_builder_is_told_of_siblings_work_merged_since_it_started(project: ProjectPaths, state_db: t.Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    first, clashing, apart = (builder(project, state_db, task) for task in ("first", "clash", "apart"))
    commit(project, first, "shared.txt", "the first builder's line\n")
    commit(project, clashing, "shared.txt", "the clashing builder's line\n")
    commit(project, apart, "other.txt", "a file of its own\n")

    assert report(project, monkeypatch, first).startswith("sent #")  # nothing merged yet: nothing to say
    ov(project, "merge", first)
    assert (project.root / "shared.txt").read_text() == "the first builder's line\n"

    held = report(project, monkeypatch, clashing)
    assert held.startswith("ov: held, not sent: since you started, builder-first's work was merged into main: 1 "
                           "commit your branch lacks (")
    assert "builder-first: shared.txt" in held  # the commit's subject
    assert "would conflict with it in shared.txt" in held and "`git rebase main` in your worktree" in held
    assert reports_from(state_db, clashing) == 0
    again = json.loads(report(project, monkeypatch, clashing, "--json"))  # told once: now it goes through
    assert len(again["ids"]) == 1 and "still conflicts in shared.txt" in again["note"]
    assert reports_from(state_db, clashing) == 1

    clean = report(project, monkeypatch, apart)
    assert clean.startswith("sent #") and reports_from(state_db, apart) == 1
    assert "ov: note: since you started, builder-first's work was merged into main" in clean
    assert "your branch merges with it cleanly" in clean

    run_git(project.worktree(apart), "rebase", "-q", "main")  # rebased: nothing left to tell
    assert "note" not in report(project, monkeypatch, apart, "--subject", "done again")


def test_a_rebased_builder_reports_at_once_after_a_hold(project: ProjectPaths, state_db: t.Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = builder(project, state_db, "one"), builder(project, state_db, "two")
    commit(project, first, "shared.txt", "one\n")
    commit(project, second, "shared.txt", "two\n")
    ov(project, "merge", first, "--force")
    assert "held, not sent" in report(project, monkeypatch, second)
    worktree = project.worktree(second)
    run_git(worktree, "reset", "-q", "--hard", "main")  # its resolution: take the sibling's file, add its own line
    commit(project, second, "shared.txt", "one\ntwo\n")
    assert report(project, monkeypatch, second).startswith("sent #")
    assert reports_from(state_db, second) == 1
