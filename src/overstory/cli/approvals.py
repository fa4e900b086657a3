"""`ov approvals`, `ov approve ID`, `ov reject ID --reason`: the human in the loop (ARCHITECTURE §13)."""

from __future__ import annotations

import os
import typing as t

import click

from overstory.cli._common import (
    agent_channel,
    completer,
    echo_json,
    events_conn,
    json_option,
    project_paths,
    state_conn,
)


@click.command(name="approvals")
@click.option("--all", "show_all", is_flag=True, help="Also the decided and expired ones.")
@json_option
def approvals(show_all: bool, as_json: bool) -> None:
    """List approval requests: tool calls of agents waiting for a person's (or a parent's) decision.

    \b
    ov approvals              # what waits now, oldest first
    ov approvals --all --json
    ov approve apr-1a2b3c4d5e --note "ok, push it"
    ov reject apr-1a2b3c4d5e --reason "not before the review"
    """
    remote = agent_channel()  # inside an agent's turn: through its endpoint (the databases are read-only there)
    if remote is not None:
        rows = remote.call("approvals.list", {"all": show_all})
    else:
        from overstory.store import approvals as store

        rows = store.list_approvals(state_conn(project_paths()), include_decided=show_all)
    if as_json:
        echo_json([_as_json(r) for r in rows])
        return
    if not rows:
        click.echo("no approval requests" + ("" if show_all else " waiting (--all shows decided ones)"))
        return
    for row in rows:
        click.echo(_line(row))


@click.command(name="approve")
@click.argument("approval_id", shell_complete=completer("complete_approvals"))
@click.option("--note", help="A note for the agent.")
@json_option
def approve(approval_id: str, note: str | None, as_json: bool) -> None:
    """Approve a request: the agent may run exactly that call, once.

    An agent may decide only for its own descendants; deciding twice, or after the
    deadline, is an error.

    \b
    ov approve apr-1a2b3c4d5e
    ov approve apr-1a2b3c4d5e --note "fine, push it"
    """
    _decide(approval_id, approve=True, note=note, as_json=as_json)


@click.command(name="reject")
@click.argument("approval_id", shell_complete=completer("complete_approvals"))
@click.option("--reason", required=True, help="Why: the agent is told, and goes on without the call.")
@json_option
def reject(approval_id: str, reason: str, as_json: bool) -> None:
    """Reject a request: the agent gets the reason and continues without the call.

    \b
    ov reject apr-1a2b3c4d5e --reason "not before the review"
    """
    _decide(approval_id, approve=False, note=reason, as_json=as_json)


def _decide(approval_id: str, *, approve: bool, note: str | None, as_json: bool) -> None:
    remote = agent_channel()
    if remote is not None:  # the endpoint decides as the agent it serves, whatever this process claims
        row = remote.call("approve" if approve else "reject", {"id": approval_id, "note": note})
    else:
        from overstory.agents.approvals import decide, decider_without_endpoint

        project = project_paths()
        by = decider_without_endpoint(os.environ, project.root)  # the operator; inside an agent: refused
        conn = state_conn(project)
        row = decide(conn, approval_id, approve=approve, by=by, note=note, events=events_conn(project))
        _send_notifications(project, conn)
    if as_json:
        echo_json(_as_json(row))
        return
    from overstory.printable import line

    click.echo(line(f"{row['status']} {approval_id}: {row['agent']} was told"))


def _send_notifications(project: t.Any, conn: t.Any) -> None:
    """Send what the decision queued, after its commit; the watchdog retries anything that fails."""
    try:
        from overstory.config.load import load as load_config
        from overstory.notify import flush

        config = load_config(project.config_file, project.local_config_file)
        if config.notify.targets:
            flush(conn, config, project=project, budget_s=5)
    except Exception:  # noqa: BLE001, S110 - never fatal: the outbox keeps it for the watchdog
        pass


def _as_json(row: dict[str, t.Any]) -> dict[str, t.Any]:
    from overstory.clock import iso
    from overstory.store.approvals import describe_call

    out = dict(row)
    out["call"] = describe_call(row["tool"], row["input"])
    for key in ("requested_at", "deadline", "decided_at", "used_at"):
        out[key] = iso(row[key]) if row.get(key) else None
    return out


def _line(row: dict[str, t.Any]) -> str:
    """One request, as two lines while it waits. What the agent wrote (its call, its reason) is escaped
    (``printable``), so a command cannot erase its own line or draw a fake request above the real one."""
    from overstory.clock import iso, now_ms
    from overstory.printable import line
    from overstory.store.approvals import describe_call

    call = line(describe_call(row["tool"], row["input"]))
    approval_id, agent = line(row["id"]), line(row["agent"])
    if row["status"] == "pending":
        left = max(0, (row["deadline"] - now_ms()) // 1000)
        return (f"{approval_id}  {agent} wants `{call}`  decider {line(row['decider'])}  {left}s left"
                f"{'  (' + line(row['reason']) + ')' if row['reason'] else ''}\n"
                f"    ov approve {approval_id}   |   ov reject {approval_id} --reason TEXT")
    return (f"{approval_id}  {agent} `{call}`  {line(row['status'])} by {line(row['decided_by'] or '-')} at "
            f"{iso(row['decided_at']) if row['decided_at'] else '-'}{'  ' + line(row['note']) if row['note'] else ''}")
