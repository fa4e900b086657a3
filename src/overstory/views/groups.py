"""The documents behind `ov group status`, `ov group list` and the groups of `ov status`: read-only.

A member is done when its agent is ``completed``; ``zombie`` ones are counted apart (they died), and
the rest are active. A member whose row is gone (a cleaned-up name) shows the state ``gone``.
`ov status` imports this module: standard library only.
"""

from __future__ import annotations

from overstory import printable
from overstory.clock import iso
from overstory.store import groups as store

TYPE_CHECKING = False  # typing costs milliseconds and hot commands import this module
if TYPE_CHECKING:
    import sqlite3  # noqa: F401 - the annotations' (for_status imports the C module under this name)
    import typing as t

STATUS_LIMIT = 20  # groups shown by `ov status` (the newest)


def _entry(row: sqlite3.Row) -> dict[str, t.Any]:
    agents, completed, zombie = int(row["agents"]), int(row["completed"]), int(row["zombie"])
    return {"name": row["name"], "description": row["description"], "created_at": iso(row["created_at"]),
            "agents": agents, "done": completed, "zombie": zombie, "active": agents - completed - zombie,
            "cost_usd": round(float(row["cost_usd"]), 6)}


def listing(conn: sqlite3.Connection, limit: int = 10_000) -> list[dict[str, t.Any]]:
    """Every group (up to ``limit``, the newest), oldest first, with its counts and cost."""
    return [_entry(row) for row in store.summaries(conn, limit)]


def for_status(conn: sqlite3.Connection, names: t.Iterable[str] | None = None) -> list[dict[str, t.Any]]:
    """The groups `ov status` shows: the newest ``STATUS_LIMIT``; with ``names`` (a selection's agents) only
    groups that have one of them. [] on a state database older than groups (read without migrating)."""
    from overstory.store.db import sqlite3  # the C module (store.sqlite_module), not the package

    try:
        found = listing(conn, STATUS_LIMIT)
        if names is not None:
            having = store.groups_of(conn, names)
            found = [group for group in found if group["name"] in having]
    except sqlite3.OperationalError:
        return []
    return found


def status_document(conn: sqlite3.Connection, name: str) -> dict[str, t.Any]:
    """One group: its members with their states, done/total and cost (``GroupNotFound`` for an unknown one)."""
    group = store.get(conn, name)
    members = []
    for row in store.member_rows(conn, name):
        members.append({"name": row["agent"], "capability": row["capability"], "state": row["state"] or "gone",
                        "state_reason": row["state_reason"], "task_id": row["task_id"], "branch": row["branch"],
                        "turns": row["turns"] or 0, "cost_usd": round(float(row["cost_usd"] or 0), 6)})
    done = sum(1 for m in members if m["state"] == "completed")
    zombie = sum(1 for m in members if m["state"] == "zombie")
    gone = sum(1 for m in members if m["state"] == "gone")
    return {"name": group.name, "description": group.description, "created_at": iso(group.created_at),
            "members": members, "agents": len(members), "done": done, "zombie": zombie,
            "active": len(members) - done - zombie - gone,
            "cost_usd": round(sum(m["cost_usd"] for m in members), 6)}


def progress_text(group: dict[str, t.Any]) -> str:
    """``2/3 done, 1 active, $0.1200`` (zombies named when there are some)."""
    parts = [f"{group['done']}/{group['agents']} done"]
    if group["active"]:
        parts.append(f"{group['active']} active")
    if group["zombie"]:
        parts.append(f"{group['zombie']} dead")
    return ", ".join(parts) + f", ${group['cost_usd']:.4f}"


def status_lines(groups: list[dict[str, t.Any]]) -> list[str]:
    """One compact line per group for `ov status`."""
    return [f"group {printable.line(g['name'])}: {progress_text(g)}" for g in groups]


def render_status(document: dict[str, t.Any]) -> str:
    """`ov group status NAME` as text: a header line, then a table of its members."""
    title = f"group {document['name']}" + (f" ({document['description']})" if document["description"] else "")
    lines = [printable.line(title) + f": {progress_text(document)}"]
    if not document["members"]:
        lines.append(f"no members yet: `ov group add {document['name']} AGENT`")
        return printable.lines(lines)
    rows: list[tuple[str, ...]] = [("NAME", "CAPABILITY", "STATE", "TASK", "TURNS", "COST", "BRANCH")]
    for m in document["members"]:
        rows.append(tuple(printable.line(cell) for cell in (
            m["name"], m["capability"] or "-", m["state"], m["task_id"] or "-", str(m["turns"]),
            f"${m['cost_usd']:.4f}", m["branch"] or "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return printable.lines(lines)


def render_list(groups: list[dict[str, t.Any]]) -> str:
    if not groups:
        return "no groups (make one with `ov group create NAME`)"
    rows: list[tuple[str, ...]] = [("GROUP", "AGENTS", "DONE", "ACTIVE", "COST", "DESCRIPTION")]
    for g in groups:
        rows.append(tuple(printable.line(cell) for cell in (
            g["name"], str(g["agents"]), str(g["done"]), str(g["active"]), f"${g['cost_usd']:.4f}",
            g["description"] or "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return printable.lines(["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                            for row in rows])
