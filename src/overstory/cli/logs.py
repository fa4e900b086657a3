"""`ov logs AGENT` and `ov feed`: read the event stream (events.db). Never writes state."""

from __future__ import annotations

import json
import time
import typing as t

import click

from overstory.cli._common import completer, project_paths

FOLLOW_POLL_SECONDS = 0.5


def _line(event: t.Any, *, show_agent: bool) -> str:
    """One event on one line; its summary (an agent's text, a tool's output) escaped by ``printable``."""
    from overstory.clock import iso
    from overstory.printable import line

    parts = [iso(event.at) or "-"]
    if show_agent:
        parts.append(event.agent or "-")
    parts.append(event.kind)
    if event.tool:
        parts.append(f"[{event.tool}]")
    if event.summary:
        parts.append(" ".join(event.summary.split()))
    return line(" ".join(parts))


def _print_events(events_conn: t.Any, *, agent: str | None, kinds: tuple[str, ...], limit: int, follow: bool,
                  as_json: bool) -> None:
    from overstory.printable import json_text
    from overstory.store import events as event_store

    batch = event_store.query(events_conn, agent=agent, kinds=kinds or None, limit=limit, newest=True)
    last_id = 0
    while True:
        for event in batch:
            click.echo(json_text(json.dumps(event.as_dict(), ensure_ascii=False, default=str)) if as_json
                       else _line(event, show_agent=agent is None))
            last_id = max(last_id, event.id)
        if not follow:
            return
        if not batch:
            last_id = last_id or _newest_id(events_conn)
        time.sleep(FOLLOW_POLL_SECONDS)
        batch = event_store.query(events_conn, agent=agent, kinds=kinds or None, after_id=last_id, limit=500)


def _newest_id(events_conn: t.Any) -> int:
    from overstory.store.events import newest_id

    return newest_id(events_conn)


def _open_events(project: t.Any) -> t.Any:
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    click.get_current_context().call_on_close(conn.close)
    return conn


limit_option = click.option("-n", "--limit", type=click.IntRange(1, 100_000), default=50, show_default=True,
                            help="How many of the newest events to show first.")


def _known_kinds(ctx: click.Context, param: click.Parameter, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """A --kind outside the vocabulary is a typo: say so, instead of printing no events."""
    from overstory.errors import UsageError
    from overstory.names import did_you_mean
    from overstory.store.event_kinds import KINDS

    for kind in kinds:
        if kind not in KINDS:
            raise UsageError(f"--kind: unknown event kind {kind!r}{did_you_mean(kind, sorted(KINDS))}")
    return kinds


kind_option = click.option("--kind", "kinds", multiple=True, callback=_known_kinds,
                           help="Only events of this kind (repeatable).")
follow_option = click.option("-f", "--follow", is_flag=True, help="Keep printing new events until Ctrl-C.")
ndjson_option = click.option("--json", "as_json", is_flag=True, help="One JSON object per event (NDJSON).")


@click.command(name="logs")
@click.argument("agent", shell_complete=completer("complete_agents"))
@limit_option
@kind_option
@follow_option
@ndjson_option
def logs(agent: str, limit: int, kinds: tuple[str, ...], follow: bool, as_json: bool) -> None:
    """Show one agent's events: turns, tool calls, mail, errors (oldest first).

    \b
    ov logs builder-task-42
    ov logs builder-task-42 --follow
    ov logs builder-task-42 --kind tool_start --json | jq .summary
    """
    from overstory.errors import AgentNotFound
    from overstory.store.db import open_state

    project = project_paths()
    events_conn = _open_events(project)
    from overstory.store.events import any_from

    known = any_from(events_conn, agent)
    similar: list[str] = []
    if not known and project.state_db.exists():
        from overstory.store.sessions import exists, similar_names

        state = open_state(project.state_db)
        try:
            known = exists(state, agent)
            similar = [] if known else similar_names(state, agent)
        finally:
            state.close()
    if not known:
        raise AgentNotFound(agent, similar, detail="and no events from it", hint="`ov status --all` lists agents")
    try:
        _print_events(events_conn, agent=agent, kinds=kinds, limit=limit, follow=follow, as_json=as_json)
    except KeyboardInterrupt:
        pass


def follow_agent(project: t.Any, agent: str, *, limit: int = 50) -> None:
    """Print ``agent``'s newest events, then new ones as they come, until Ctrl-C (`ov coordinator start --attach`)."""
    try:
        _print_events(_open_events(project), agent=agent, kinds=(), limit=limit, follow=True, as_json=False)
    except KeyboardInterrupt:
        pass


@click.command(name="feed")
@click.option("--agent", help="Only this agent's events.", shell_complete=completer("complete_agents"))
@limit_option
@kind_option
@follow_option
@ndjson_option
def feed(agent: str | None, limit: int, kinds: tuple[str, ...], follow: bool, as_json: bool) -> None:
    """Show the project's event feed, every agent interleaved (oldest first).

    \b
    ov feed
    ov feed --follow
    ov feed --kind watchdog_zombie --kind turn_failed
    ov feed --agent lead-auth --json
    """
    project = project_paths()
    try:
        _print_events(_open_events(project), agent=agent, kinds=kinds, limit=limit, follow=follow, as_json=as_json)
    except KeyboardInterrupt:
        pass
