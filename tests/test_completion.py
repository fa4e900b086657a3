"""Shell completion through the real `ov` (`_OV_COMPLETE=bash_complete`), from the real state database."""

from __future__ import annotations

import sqlite3
import typing as t
from pathlib import Path

import click

from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.store import runs, sessions


def complete(cwd: Path, *words: str) -> list[str]:
    """What bash would offer for the last word of ``ov WORDS...``."""
    line = " ".join(["ov", *words])
    result = run_ov(cwd=cwd, env={"_OV_COMPLETE": "bash_complete", "COMP_WORDS": line,
                                  "COMP_CWORD": str(len(words))})
    assert result.returncode == 0, result.stderr
    return [entry.split(",", 1)[1] for entry in result.stdout.splitlines() if entry.strip()]


def add_agent(conn: sqlite3.Connection, name: str, state: str = "between_turns", **extra: t.Any) -> None:
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=name, runtime="scripted",
                                         actor="test", **extra)
    assert sessions.transition(conn, name, generation, state, actor="test").ok


def test_agent_names_for_agent_arguments_and_options(project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    add_agent(state_db, "builder-api")
    add_agent(state_db, "builder-docs", "completed")
    add_agent(state_db, "scout-survey")
    assert complete(project.root, "stop", "b") == ["builder-api", "builder-docs"], "active first"
    for words in (("attach", ""), ("logs", ""), ("nudge", ""), ("diff", ""), ("merge", ""), ("feed", "--agent", "")):
        assert set(complete(project.root, *words)) >= {"builder-api", "builder-docs", "scout-survey"}, words
    assert complete(project.root, "diff", "sc") == ["scout-survey"]
    recipients = complete(project.root, "mail", "send", "--to", "")
    assert {"operator", "@all", "@builders", "builder-api"} <= set(recipients)
    # --project given before the command is the project completion reads.
    assert complete(project.root.parent, "--project", str(project.root), "stop", "scout") == ["scout-survey"]


def test_capabilities_and_run_ids(project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    assert complete(project.root, "sling", "b") == ["builder"]
    assert set(complete(project.root, "sling", "")) >= {"builder", "scout", "lead", "reviewer"}
    run_id = runs.open_or_join(state_db, "coordinator")[0].id
    assert complete(project.root, "run", "show", "run-") == [run_id]
    assert complete(project.root, "tree", "--run", "") == [run_id]


def test_outside_a_project_or_before_the_database_exists_nothing_is_offered(tmp_path: Path,
                                                                             project: ProjectPaths) -> None:
    assert complete(tmp_path, "stop", "") == []
    project.state_db.unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(project.state_db) + suffix).unlink(missing_ok=True)
    assert complete(project.root, "stop", "") == []


def test_approval_ids_complete_from_the_table_when_it_exists(project: ProjectPaths,
                                                             state_db: sqlite3.Connection) -> None:
    from overstory.cli.completion import complete_approvals
    from overstory.cli.main import cli

    ctx = click.Context(cli, info_name="ov")
    ctx.params["project"] = str(project.root)
    assert complete_approvals(ctx, click.Argument(["id"]), "") == [], "no approvals table in this version yet"
    state_db.execute("CREATE TABLE approvals(id TEXT PRIMARY KEY, agent TEXT)")
    state_db.execute("INSERT INTO approvals VALUES ('apr-0001', 'builder-api'), ('apr-0002', 'scout-survey')")
    assert [item.value for item in complete_approvals(ctx, click.Argument(["id"]), "apr-")] == ["apr-0001", "apr-0002"]
    state_db.execute("DROP TABLE approvals")


def test_the_readme_documents_the_completion_variable() -> None:
    from conftest import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text()
    assert '_OV_COMPLETE=bash_source ov' in readme and "_OV_COMPLETE=zsh_source ov" in readme
