"""`ov trace AGENT`: one agent's timeline of turns, attempts, tool calls and mail."""

from __future__ import annotations

import typing as t

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn
from overstory.printable import line


def _clock(entry: dict[str, t.Any]) -> str:
    return (entry.get("time") or "")[11:23]


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value}ms" if value < 10_000 else f"{value / 1000:.0f}s"


def render(document: dict[str, t.Any]) -> list[str]:
    session = document["session"]
    lines = [line(f"{document['agent']}: " + (
        f"{session['capability']} on {session['task_id']}, {session['state']}"
        + (f" ({session['reason']})" if session["reason"] else "")
        + f", generation {session['generation']}, {session['turns']} turn(s), ${session['cost_usd']:.4f}, "
          f"session {session['runtime_session_id'] or '-'}" if session else "no session row (only history)"))]
    for entry in document["timeline"]:
        kind = entry["kind"]
        if kind == "state":
            text = f"state      {entry['from'] or '-'} -> {entry['to']} by {entry['actor']}" + (
                f": {entry['reason']}" if entry["reason"] else "")
        elif kind == "turn_start":
            mail = ",".join(f"#{i}" for i in entry["mail_ids"]) or "none"
            text = (f"turn       #{entry['number']} attempt {entry['attempt']} started ({entry['turn_id']}); "
                    f"answers {entry['dispatch'] or '-'} (mail {mail}); "
                    f"{'resumes' if entry['resumed'] else 'session'} {entry['session_id'] or 'new'}"
                    + (f"; on node {entry['node']}" if entry.get("node") else ""))
        elif kind == "turn_end":
            git = entry.get("git_status") or {}
            tree = "clean" if git.get("clean") else (f"{sum(v for k, v in git.items() if isinstance(v, int))} "
                                                       "change(s)" if git else "?")
            text = (f"turn       ended {entry['status']} ${entry['cost_usd']:.4f}; HEAD "
                    f"{(entry['head'] or '-')[:10]} ({tree})" + (f"; {entry['error']}" if entry["error"] else ""))
        elif kind == "tool_call":
            mark = " FLAGGED" if entry["flagged"] else ""
            replay = f" (replay of #{entry['replay_of']})" if entry["replay_of"] else ""
            result = entry["receipt"] if entry["status"] in ("succeeded", "failed") else entry["reason"]
            lines.append(line(f"{_clock(entry)}    tool #{entry['id']:<4} {entry['tool']} [{entry['class']}] "
                              f"{entry['status']}{mark}{replay} {_ms(entry['duration_ms'])}: {entry['input']}"))
            if result:
                lines.append(line(f"{'':14}-> {result}"))
            continue
        else:
            arrow = f"-> {entry['to']}" if entry["direction"] == "out" else f"<- {entry['from']}"
            text = f"mail {entry['direction']:<5} #{entry['id']} {arrow} [{entry['type']}] {entry['subject']}"
        lines.append(line(f"{_clock(entry)}  {text}"))
    for gate in document.get("approvals") or []:
        decided = f" by {gate['decided_by']} at {gate['decided_at']}" if gate["decided_at"] else ""
        used = f", ran at {gate['used_at']}" if gate["used_at"] else ""
        lines.append(line(f"approval {gate['id']} `{gate['call']}`: {gate['status']}{decided}{used}"
                          + (f" ({gate['note']})" if gate["note"] else "")))
    if document["flagged"]:
        lines.append(line(f"{len(document['flagged'])} tool call(s) flagged for the operator: "
                          + ", ".join(f"#{c['id']} {c['tool']}" for c in document["flagged"])))
    return lines


@click.command(name="trace")
@click.argument("agent")
@json_option
def trace(agent: str, as_json: bool) -> None:
    """Show AGENT's timeline: state changes, turns and attempts, tool calls and mail.

    Tool calls come from the tool-call ledger: class (read, local_write,
    side_effect), status (started, succeeded, failed, denied, skipped_duplicate),
    duration and a summary of the result. Calls held back on a retried turn that may
    already have happened are FLAGGED.

    \b
    ov trace builder-task-42
    ov trace builder-task-42 --json
    """
    from overstory.store.trace import trace as build

    document = build(state_conn(project_paths()), agent)
    if as_json:
        echo_json(document)
        return
    for text in render(document):
        click.echo(text)
