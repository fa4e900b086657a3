"""Helpers shared by the commands. Kept light: hot commands import this."""

from __future__ import annotations

import json
import sqlite3
import typing as t
from contextlib import contextmanager

import click

from overstory.cli.hot import BadUsage
from overstory.paths import ProjectPaths, find_project


def project_option(ctx: click.Context | None = None) -> str | None:
    """``ov --project`` (or $OVERSTORY_PROJECT_ROOT) as given, for the click-free hot command bodies."""
    ctx = ctx or click.get_current_context()
    return getattr(ctx.find_root().obj, "project_option", None)


def project_paths(ctx: click.Context | None = None) -> ProjectPaths:
    return find_project(project_option(ctx))


@contextmanager
def usage_errors() -> t.Iterator[None]:
    """Show a hot command body's ``BadUsage`` as click's own usage error."""
    try:
        yield
    except BadUsage as exc:
        if exc.param_hint is not None:
            raise click.BadParameter(exc.message, param_hint=exc.param_hint) from None
        raise click.UsageError(exc.message) from None


def agent_channel() -> t.Any:
    """Inside an agent's turn, its authenticated channel to ov (``overstory.endpoint.client``); else None.

    Commands that read or change ov's state go through it when it is there: the databases are
    read-only in the agent's sandbox, and the endpoint decides who the caller is.
    """
    from overstory.cli.hot import agent_channel as channel  # one rule for every command (imports the client lazily)

    return channel()


def state_conn(project: ProjectPaths) -> sqlite3.Connection:
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    click.get_current_context().call_on_close(conn.close)
    return conn


def events_conn(project: ProjectPaths) -> sqlite3.Connection:
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    click.get_current_context().call_on_close(conn.close)
    return conn


def echo_json(document: t.Any) -> None:
    click.echo(json.dumps(document, indent=2, ensure_ascii=False, default=str))


# Ids are SQLite integers: anything past 2**63 - 1 cannot name a row (and would overflow the driver).
ROW_ID = click.IntRange(1, 2**63 - 1)

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


def completer(name: str) -> t.Callable[[click.Context, click.Parameter, str], list[t.Any]]:
    """A `shell_complete=` callback that imports ``overstory.cli.completion`` only on <Tab>."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[t.Any]:
        from overstory.cli import completion

        found: list[t.Any] = getattr(completion, name)(ctx, param, incomplete)
        return found

    return complete
