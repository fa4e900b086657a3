"""The event stream (events.db): tool calls, turns, mail, errors, costs.

Kept in its own database so its high write volume never contends with state writes.
"""

from __future__ import annotations

from overstory import jsontext as json
from overstory.clock import now_ms
from overstory.records import Record
from overstory.store.event_kinds import KINDS

TYPE_CHECKING = False  # typing costs milliseconds and hot commands import this module
if TYPE_CHECKING:
    import sqlite3
    import typing as t


class Event(Record):
    """One row of the event stream."""

    __slots__ = ("id", "at", "agent", "generation", "turn_id", "kind", "tool", "summary", "data")
    id: int
    at: int
    agent: str | None
    generation: int | None
    turn_id: str | None
    kind: str
    tool: str | None
    summary: str | None
    data: dict[str, t.Any] | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Event:
        values = dict(row)
        values["data"] = json.loads(values["data"]) if values["data"] else None
        return cls(**values)

    def as_dict(self) -> dict[str, t.Any]:
        from overstory.clock import iso

        return {"id": self.id, "at": iso(self.at), "agent": self.agent, "generation": self.generation,
                "turn_id": self.turn_id, "kind": self.kind, "tool": self.tool, "summary": self.summary,
                "data": self.data}


def record(conn: sqlite3.Connection, kind: str, *, agent: str | None = None, generation: int | None = None,
           turn_id: str | None = None, tool: str | None = None, summary: str | None = None,
           data: t.Mapping[str, t.Any] | None = None, at: int | None = None) -> int:
    """Append one event; ``kind`` must be one of ``event_kinds.KINDS`` (anything else is a bug: ValueError)."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}: add it to overstory.store.event_kinds.KINDS")
    cursor = conn.execute(
        "INSERT INTO events(at, agent, generation, turn_id, kind, tool, summary, data) VALUES (?,?,?,?,?,?,?,?)",
        (at or now_ms(), agent, generation, turn_id, kind, tool, summary,
         json.dumps(data, ensure_ascii=False, default=str) if data is not None else None),
    )
    return int(cursor.lastrowid or 0)


def query(conn: sqlite3.Connection, *, agent: str | None = None, kinds: t.Collection[str] | None = None,
          turn_id: str | None = None, after_id: int = 0, limit: int = 200, newest: bool = False) -> list[Event]:
    """Events by indexed filters. ``newest`` returns the last ``limit`` (still in id order)."""
    clauses: list[str] = ["id > ?"]
    params: list[t.Any] = [after_id]
    if agent is not None:
        clauses.append("agent = ?")
        params.append(agent)
    if turn_id is not None:
        clauses.append("turn_id = ?")
        params.append(turn_id)
    if kinds:
        clauses.append(f"kind IN ({','.join('?' * len(kinds))})")
        params.extend(kinds)
    order = "DESC" if newest else "ASC"
    rows = conn.execute(
        f"SELECT * FROM events WHERE {' AND '.join(clauses)} ORDER BY id {order} LIMIT ?", (*params, limit)
    ).fetchall()
    found = [Event.from_row(r) for r in rows]
    return found[::-1] if newest else found


def newest_id(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT max(id) FROM events").fetchone()
    return int(row[0] or 0)


def any_from(conn: sqlite3.Connection, agent: str) -> bool:
    return conn.execute("SELECT 1 FROM events WHERE agent = ? LIMIT 1", (agent,)).fetchone() is not None


def last_words(conn: sqlite3.Connection, turn_id: str) -> list[sqlite3.Row]:
    """(kind, data) of a turn's newest five text and result events, newest first."""
    return conn.execute("SELECT kind, data FROM events WHERE turn_id = ? AND kind IN "
                        "('assistant_text', 'turn_result') ORDER BY id DESC LIMIT 5", (turn_id,)).fetchall()


def newest(conn: sqlite3.Connection, limit: int, kinds: t.Sequence[str] | None = None) -> list[sqlite3.Row]:
    """(id, at, agent, kind, tool, summary) of the newest ``limit`` events (of ``kinds``), newest first."""
    if kinds:
        return conn.execute(
            f"SELECT id, at, agent, kind, tool, summary FROM events WHERE kind IN ({','.join('?' * len(kinds))}) "
            "ORDER BY id DESC LIMIT ?", (*kinds, limit)).fetchall()
    return conn.execute("SELECT id, at, agent, kind, tool, summary FROM events ORDER BY id DESC LIMIT ?",
                        (limit,)).fetchall()


def kind_tool_counts(conn: sqlite3.Connection, kinds: t.Sequence[str], *, since_ms: int | None = None,
                     agents: t.Collection[str] | None = None) -> list[sqlite3.Row]:
    """(kind, tool, n) of the events of ``kinds`` (since a time, of some agents)."""
    clauses = [f"kind IN ({','.join('?' * len(kinds))})"]
    params: list[t.Any] = list(kinds)
    if since_ms is not None:
        clauses.append("at >= ?")
        params.append(since_ms)
    if agents is not None:
        if not agents:
            return []
        clauses.append(f"agent IN ({','.join('?' * len(agents))})")
        params.extend(agents)
    return conn.execute(f"SELECT kind, tool, count(*) AS n FROM events WHERE {' AND '.join(clauses)} "
                        "GROUP BY kind, tool ORDER BY n DESC", params).fetchall()
