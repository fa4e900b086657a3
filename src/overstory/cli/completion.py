"""Shell completion values from the state database (`_OV_COMPLETE=bash_source ov`, see the README).

Runs on every <Tab>: stdlib and click only, the database opened read-only, and any
problem (no project, no database, a table not created yet) completes nothing.
"""

from __future__ import annotations

import sqlite3
import typing as t
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from overstory.store.sessions import CAPABILITIES


def _project_root(ctx: click.Context) -> Path | None:
    from overstory.errors import OrchestratorError
    from overstory.paths import find_project

    explicit = ctx.find_root().params.get("project")
    try:
        return find_project(explicit).root
    except OrchestratorError:
        return None


def _query(ctx: click.Context, reader: t.Callable[[sqlite3.Connection], list[t.Any]]) -> list[tuple[t.Any, ...]]:
    root = _project_root(ctx)
    if root is None:
        return []
    path = root / ".overstory" / "state.db"
    if not path.is_file():
        return []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2)
        try:
            return [tuple(row) for row in reader(conn)]
        finally:
            conn.close()
    except sqlite3.Error:  # e.g. a table that a newer ov creates and this database does not have yet
        return []


def _items(rows: list[tuple[t.Any, ...]], incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(str(row[0]), help=str(row[1]) if len(row) > 1 and row[1] else None)
            for row in rows if str(row[0]).startswith(incomplete)]


def complete_agents(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Agent names, active ones first, each with its state."""
    from overstory.store.sessions import names_and_states

    rows = _query(ctx, names_and_states)
    return _items(rows, incomplete)


def complete_recipients(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`--to`: agents, the operator and the broadcast groups."""
    groups = [("operator", "you"), ("@all", "every active agent")] + [(f"@{c}s", f"every active {c}")
                                                                       for c in CAPABILITIES]
    return _items(groups, incomplete) + complete_agents(ctx, param, incomplete)


def complete_capabilities(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(name) for name in CAPABILITIES if name.startswith(incomplete)]


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from overstory.store.runs import ids_and_statuses

    return _items(_query(ctx, ids_and_statuses), incomplete)


def complete_approvals(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Ids (`apr-...`) of the approval requests still waiting, with whose they are."""
    from overstory.store.approvals import pending_ids

    return _items(_query(ctx, pending_ids), incomplete)
