"""Read-only queries behind `ov status` and `ov watch`: never writes, stdlib only.

`ov status --json` is called by agents many times a minute, so this module imports
nothing beyond the standard library and ov's stdlib-only core (sessions, procs,
clock). Every query is bounded and served by an index, so a dashboard over 200
agents and 100k events stays fast.
"""

from __future__ import annotations

from overstory import printable, procs
from overstory.clock import iso, now_ms
from overstory.store import budgets, mail_queries, overview
from overstory.store.db import sqlite3
from overstory.store.sessions import TERMINAL_STATES, Session, list_sessions
from overstory.views import groups as group_views

TYPE_CHECKING = False  # typing costs milliseconds and hot commands import this module
if TYPE_CHECKING:
    import typing as t

    from overstory.views.selection import Selection

RUNS_LIMIT = 20


def budget_entry(budget: budgets.Budget | None, now: int) -> dict[str, t.Any] | None:
    """Limit and used of each of the four (null limit: none); None when nothing is recorded."""
    if budget is None:
        return None
    entry = {}
    for limit in budgets.LIMITS:
        used = budget.used(limit, now)
        entry[limit.removeprefix("max_")] = {"limit": budget.limit(limit),
                                             "used": round(used, 6 if limit == "max_usd" else 1)}
    entry["usd"]["live_estimate"] = round(budget.live_usd, 6)
    return entry


def agent_entry(agent: Session, now: int, pending: int = 0, budget: budgets.Budget | None = None,
                node: str | None = None) -> dict[str, t.Any]:
    """One agent as the stable JSON shape documented on `ov status`."""
    loop_alive: bool | None = None
    if agent.mode == "headless" and not agent.is_terminal:
        loop_alive = procs.is_alive(agent.loop_pid, agent.loop_start_ticks)
    return {
        "name": agent.name,
        "capability": agent.capability,
        "state": agent.state,
        "state_reason": agent.state_reason,
        "task_id": agent.task_id,
        "parent": agent.parent,
        "depth": agent.depth,
        "turns": agent.turns,
        "last_activity": iso(agent.last_activity),
        "idle_seconds": round(max(0, now - agent.last_activity) / 1000, 1),
        "input_tokens": agent.input_tokens,
        "output_tokens": agent.output_tokens,
        "cost_usd": round(agent.cost_usd, 6),
        "current_tool": agent.current_tool,
        "runtime": agent.runtime,
        "mode": agent.mode,
        "branch": agent.branch,
        "generation": agent.generation,
        "retries": agent.retries,
        "pending_mail": pending,
        "loop_alive": loop_alive,
        "run_id": agent.run_id,
        "park_kind": agent.park_kind,
        "park_until": iso(agent.park_until),
        "budget": budget_entry(budget, now),
        "node": node,  # where its latest turn ran (a Ray node id, or this host's name)
    }


def pending_by_agent(conn: sqlite3.Connection, agents: t.Iterable[Session] = ()) -> dict[str, int]:
    """Mail waiting for someone who will read it, per recipient (the operator included).

    That is unread, unclaimed mail, except mail its recipient sent itself (the operator's own
    `ov merge` reports: it saw the result when the command printed it) and mail to an agent of
    ``agents`` that has ended (completed or zombie: nobody will read it; it counts again if the
    name is slung anew). Such mail is still listed by `ov mail list`.

    Names the partial index: left alone, SQLite picks ``mail_claims`` for
    ``claimed_by IS NULL`` and walks nearly every row (35 ms at 100k messages).
    """
    ended = {agent.name for agent in agents if agent.is_terminal}
    return {name: count for name, count in mail_queries.pending_by_recipient(conn).items() if name not in ended}


def recent_runs(conn: sqlite3.Connection, limit: int = RUNS_LIMIT, now: int | None = None,
                run_id: str | None = None) -> list[dict[str, t.Any]]:
    """The newest ``limit`` runs, newest first (only ``run_id`` when given)."""
    now = now_ms() if now is None else now
    rows = overview.recent_runs(conn, limit, run_id)
    found = budgets.runs(conn, [r["id"] for r in rows])
    return [{"id": r["id"], "coordinator": r["coordinator"], "status": r["status"],
             "started_at": iso(r["started_at"]), "completed_at": iso(r["completed_at"]), "agents": r["agents"],
             "budget": budget_entry(found.get(r["id"]), now)}
            for r in rows]


def collect(conn: sqlite3.Connection, *, include_completed: bool = False, now: int | None = None,
            selection: Selection | None = None) -> dict[str, t.Any]:
    """The `ov status --json` document (see the command's help for its shape).

    With a ``selection``, everything about agents (the list, totals, pending mail, approvals) is about
    the selected ones; --state completed shows completed agents without --all; --run keeps only that run.
    """
    now = now_ms() if now is None else now
    every = list_sessions(conn)
    pending = pending_by_agent(conn, every)
    waiting = pending_approvals(conn, now)
    if selection is not None and not selection.empty:
        selection.resolve(conn)
        every = [a for a in every if selection.matches(a)]
        include_completed = include_completed or "completed" in (selection.states or ())
        names = {a.name for a in every}
        pending = {name: count for name, count in pending.items() if name in names}
        waiting = [gate for gate in waiting if gate["agent"] in names]
    runs_shown = recent_runs(conn, now=now, run_id=selection.run_id if selection is not None else None)
    selected = None if selection is None or selection.empty else [a.name for a in every]
    shown = [a for a in every if include_completed or a.state != "completed"]
    spending = budgets.current_agents(conn)
    by_state: dict[str, int] = {}
    for agent in every:
        by_state[agent.state] = by_state.get(agent.state, 0) + 1
    return {
        "generated_at": iso(now),
        "agents": [agent_entry(a, now, pending.get(a.name, 0), spending.get(a.name),
                               overview.latest_node(conn, a.name, a.generation)) for a in shown],
        "mail": {"pending": sum(pending.values()), "by_agent": dict(sorted(pending.items()))},
        "runs": runs_shown,
        "waiting": waiting,
        "scope_overlaps": scope_overlaps(every),
        "groups": group_views.for_status(conn, selected),
        "totals": {
            "agents": len(every),
            "active": sum(1 for a in every if a.state not in TERMINAL_STATES),
            "by_state": dict(sorted(by_state.items())),
            "turns": sum(a.turns for a in every),
            "input_tokens": sum(a.input_tokens for a in every),
            "output_tokens": sum(a.output_tokens for a in every),
            "cost_usd": round(sum(a.cost_usd for a in every), 6),
        },
    }


def pending_approvals(conn: sqlite3.Connection, now: int, limit: int = 20) -> list[dict[str, t.Any]]:
    """Approval gates waiting for a decision, oldest first: the "waiting for you" section."""
    try:
        rows = overview.pending_approvals(conn, limit)
    except sqlite3.OperationalError:  # a state.db older than approval gates (read-only, not migrated)
        return []
    if not rows:
        return []
    from overstory.store.approvals import describe_call
    return [{"id": r["id"], "agent": r["agent"], "call": describe_call(r["tool"], r["input"]), "reason": r["reason"],
             "decider": r["decider"], "seconds_left": max(0, (r["deadline"] - now) // 1000)} for r in rows]


def waiting_text(waiting: list[dict[str, t.Any]]) -> list[str]:
    if not waiting:
        return []
    lines = ["waiting for you:"]
    for gate in waiting:  # the call is the agent's own text: escaped, so it cannot redraw these lines
        gate_id, agent, decider = (printable.line(gate[key]) for key in ("id", "agent", "decider"))
        lines.append(f"  {gate_id}  {agent} wants `{printable.line(gate['call'])[:80]}` (decider {decider}, "
                     f"{gate['seconds_left']}s left): ov approve {gate_id} | ov reject {gate_id} --reason ...")
    return lines


def scope_overlaps(agents: list[Session]) -> list[dict[str, t.Any]]:
    """Active builders of one run whose write scopes (`ov sling --files`) may name one file."""
    scoped = [(a.run_id, a.name, a.spec["write_scope"]) for a in agents
              if a.state not in TERMINAL_STATES and a.spec.get("write_scope")]
    if len(scoped) < 2:
        return []  # nothing to compare, and `re` stays unloaded (a hot command)
    from overstory.guards.scope import overlapping_pairs

    return overlapping_pairs(scoped)


def collect_empty(now: int | None = None) -> dict[str, t.Any]:
    """The status document of a project whose state database does not exist yet."""
    return {"generated_at": iso(now_ms() if now is None else now), "agents": [],
            "mail": {"pending": 0, "by_agent": {}}, "runs": [], "waiting": [], "scope_overlaps": [],
            "groups": [], "totals": {"agents": 0, "active": 0, "by_state": {}, "turns": 0, "input_tokens": 0,
                       "output_tokens": 0, "cost_usd": 0.0}}


def recent_mail(conn: sqlite3.Connection, limit: int = 10) -> list[dict[str, t.Any]]:
    """The newest ``limit`` messages, newest first (by primary key, so bounded)."""
    rows = mail_queries.newest(conn, limit)
    return [{"id": r["id"], "from": r["sender"], "to": r["recipient"], "type": r["type"], "priority": r["priority"],
             "subject": r["subject"], "created_at": iso(r["created_at"]),
             "state": "read" if r["read_at"] else ("claimed" if r["claimed_by"] else "unread")} for r in rows]


def merge_queue(conn: sqlite3.Connection, limit: int = 10) -> list[dict[str, t.Any]]:
    """Pending merge requests first, then the latest processed ones."""
    rows = overview.merge_queue(conn, limit)
    return [{"id": r["id"], "agent": r["agent"], "branch": r["branch"], "target": r["target"], "status": r["status"],
             "tier": r["tier"], "enqueued_at": iso(r["enqueued_at"])} for r in rows][:limit]


ERROR_KINDS = ("turn_end", "turn_failed", "turn_retry", "watchdog_stalled", "watchdog_zombie", "watchdog_readopt",
               "contract_violation", "resume_fallback", "malformed_line", "api_retry", "budget_crossed",
               "budget_parked", "quota_parked", "auth_parked", "auth_failed", "idle_nudge", "no_report",
               "loop_parked", "schedule_failed", "tool_call_flagged", "approval_expired",
               "notify_failed", "mail_polling")


def recent_events(events: sqlite3.Connection, *, limit: int = 12, kinds: t.Sequence[str] | None = None
                  ) -> list[dict[str, t.Any]]:
    """The newest ``limit`` events (optionally of some kinds), newest first; index-bounded."""
    from overstory.store import events as event_store  # `ov watch`'s: `ov status` reads no events (0.3 ms)

    rows = event_store.newest(events, limit, kinds)
    return [{"id": r["id"], "at": iso(r["at"]), "agent": r["agent"], "kind": r["kind"], "tool": r["tool"],
             "summary": r["summary"]} for r in rows]


def recent_problems(events: sqlite3.Connection, limit: int = 8) -> list[dict[str, t.Any]]:
    """Newest events that signal trouble: failed turns, retries, stalls, zombies."""
    found = recent_events(events, limit=limit * 3, kinds=ERROR_KINDS)
    problems = [e for e in found if e["kind"] != "turn_end" or not (e["summary"] or "").startswith("ok")]
    return problems[:limit]


def dashboard_snapshot(state: sqlite3.Connection, events: sqlite3.Connection | None, *,
                       include_completed: bool = True, now: int | None = None) -> dict[str, t.Any]:
    """Everything one `ov watch` frame shows, in bounded queries."""
    document = collect(state, include_completed=include_completed, now=now)
    document["recent_mail"] = recent_mail(state)
    document["merge_queue"] = merge_queue(state)
    document["events"] = recent_events(events) if events is not None else []
    document["problems"] = recent_problems(events) if events is not None else []
    return document


def elsewhere(node: str | None) -> bool:
    """A turn's node is another machine (a cluster's node), not this one."""
    import os

    return node is not None and node != os.uname().nodename


def node_text(node: str | None) -> str:
    """A node as a column shows it: a Ray node id (56 hex digits) by its first 8, a host by its name."""
    if node is None:
        return "-"
    return node[:8] if len(node) > 16 and all(c in "0123456789abcdef" for c in node) else node


def format_idle(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def spend_text(cost_usd: float, budget: dict[str, t.Any] | None) -> str:
    """Dollars spent, and against the limit when there is one: ``$0.5300/2.00``."""
    if budget is None:
        return f"${cost_usd:.4f}"
    usd = budget["usd"]
    text = f"${usd['used']:.4f}"
    return text + (f"/{usd['limit']:.2f}" if usd["limit"] is not None else "")


def state_text(agent: dict[str, t.Any]) -> str:
    """The state, with why for the states that need a reason (parked, stalled, zombie, completed)."""
    state = agent["state"]
    if state == "parked" and agent.get("park_kind"):
        state = f"parked:{agent['park_kind']}"
    return state + ("!" if agent["loop_alive"] is False else "")


def reason_text(agent: dict[str, t.Any], limit: int = 70) -> str:
    reason = printable.line(agent.get("state_reason"))
    if agent["state"] not in ("parked", "stalled", "zombie", "completed") or not reason:
        return "-"
    if agent["state"] == "parked" and agent.get("park_until"):
        reason += f" (until {agent['park_until'][11:19]}Z)"
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"


def render_text(document: dict[str, t.Any], *, filtered: bool = False) -> str:
    """A plain-text table of the status document (no rich: this is a hot command); ``filtered``: by a Selection."""
    agents = document["agents"]
    lines: list[str] = waiting_text(document.get("waiting") or [])
    hidden = document["totals"]["agents"] - len(agents)
    if not agents and hidden:
        lines.append(f"no active agents{' match' if filtered else ''}; {hidden} finished "
                     "(`ov status --all` shows them)")
    elif not agents:
        lines.append("no agents match" if filtered else "no agents (start one with `ov sling CAPABILITY TASK_ID`)")
    else:
        header = ("NAME", "CAPABILITY", "STATE", "TASK", "PARENT", "TURNS", "IDLE", "TOKENS", "COST", "TOOL", "WHY")
        rows: list[tuple[str, ...]] = [header]
        for a in agents:
            rows.append(tuple(printable.line(cell) for cell in (
                a["name"], a["capability"], state_text(a), a["task_id"], a["parent"], str(a["turns"]),
                format_idle(a["idle_seconds"]), f"{a['input_tokens'] + a['output_tokens']}",
                spend_text(a["cost_usd"], a.get("budget")), a["current_tool"] or "-", reason_text(a))))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        for row in rows:
            lines.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
        if any(a["loop_alive"] is False for a in agents):
            lines.append("(! = its agent loop is not running; the watchdog re-adopts it: `ov watchdog`)")
        if hidden:
            lines.append(f"({hidden} completed agent{'s' if hidden != 1 else ''} not shown: `ov status --all`)")
    for overlap in document.get("scope_overlaps") or ():
        lines.append(f"overlap: {overlap['message']}; their merges may conflict")
    lines += group_views.status_lines(document.get("groups") or [])
    mail = document["mail"]
    waiting = ", ".join(f"{name} {count}" for name, count in mail["by_agent"].items())
    lines.append(f"mail: {mail['pending']} pending" + (f" ({waiting})" if waiting else ""))
    totals = document["totals"]
    states = ", ".join(f"{count} {state}" for state, count in totals["by_state"].items())
    lines.append(f"totals: {totals['agents']} agents ({states or 'none'}), {totals['turns']} turns, "
                 f"{totals['input_tokens'] + totals['output_tokens']} tokens, ${totals['cost_usd']:.4f}")
    for run in document["runs"][:5]:
        spent = ""
        if run.get("budget"):
            spent = f", spent {spend_text(0.0, run['budget'])}"
        lines.append(f"run {run['id']}: {run['status']}, {run['agents']} agents{spent}, started {run['started_at']}")
    return printable.lines(lines)
