"""Task groups (`ov group`): a name for the agents that work on one piece of work.

A group holds agent names, not generations: a member re-slung under its name is the same member,
and what `ov group status` shows is its current row. Membership is not agent state (the state
machine in ``store.sessions`` is untouched); a group's progress is read from its members' rows.

`ov status --json` reads ``summaries`` (a hot command): standard library only, no typing at run time.
"""

from __future__ import annotations

from overstory.clock import now_ms
from overstory.records import Record
from overstory.store.db import write_transaction

TYPE_CHECKING = False  # typing costs milliseconds and hot commands import this module
if TYPE_CHECKING:
    import sqlite3
    import typing as t

    from overstory.errors import GroupNotFound
# overstory.errors is imported where an error is made: `ov status` lists groups and raises none of them.


class Group(Record):
    __slots__ = ("name", "description", "created_at", "members")
    name: str
    description: str
    created_at: int
    members: tuple[str, ...]  # agent names, in the order they were added


def _names(conn: sqlite3.Connection) -> list[str]:
    return [str(row[0]) for row in conn.execute("SELECT name FROM task_groups")]


def not_found(conn: sqlite3.Connection, name: str) -> GroupNotFound:
    """``GroupNotFound(name)`` with the existing group names close to it."""
    from overstory.errors import GroupNotFound
    from overstory.names import closest

    return GroupNotFound(name, closest(name, _names(conn)))


def create(conn: sqlite3.Connection, name: str, description: str = "", *, now: int | None = None) -> Group:
    """A new, empty group; ``GroupExists`` if the name is taken (one INSERT: two racing creates, one wins)."""
    at = now_ms() if now is None else now
    with write_transaction(conn):
        inserted = conn.execute("INSERT INTO task_groups(name, description, created_at) VALUES (?, ?, ?) "
                                "ON CONFLICT(name) DO NOTHING", (name, description, at)).rowcount
    if not inserted:
        from overstory.errors import GroupExists

        raise GroupExists(name)
    return Group(name, description, at, ())


def add(conn: sqlite3.Connection, name: str, agents: t.Sequence[str], *, now: int | None = None) -> list[str]:
    """Put ``agents`` in the group, all or none; returns those that were not members already.

    Every agent must have a row (any state, a completed one too): an unknown one is ``AgentNotFound``
    and nothing is added. One transaction, so a process killed halfway added nothing.
    """
    from overstory.store.sessions import agent_not_found

    at = now_ms() if now is None else now
    added = []
    with write_transaction(conn):
        if conn.execute("SELECT 1 FROM task_groups WHERE name = ?", (name,)).fetchone() is None:
            raise not_found(conn, name)
        for agent in agents:
            if conn.execute("SELECT 1 FROM sessions WHERE name = ?", (agent,)).fetchone() is None:
                raise agent_not_found(conn, agent, hint=f"`ov status --all` lists them; nothing was added to {name}")
            if conn.execute("INSERT INTO task_group_members(group_name, agent, added_at) VALUES (?, ?, ?) "
                            "ON CONFLICT DO NOTHING", (name, agent, at)).rowcount:
                added.append(agent)
    return added


def get(conn: sqlite3.Connection, name: str) -> Group:
    row = conn.execute("SELECT name, description, created_at FROM task_groups WHERE name = ?", (name,)).fetchone()
    if row is None:
        raise not_found(conn, name)
    return Group(row[0], row[1], row[2], _members(conn, name))


def _members(conn: sqlite3.Connection, name: str) -> tuple[str, ...]:
    return tuple(str(r[0]) for r in conn.execute(
        "SELECT agent FROM task_group_members WHERE group_name = ? ORDER BY added_at, agent", (name,)))


def list_groups(conn: sqlite3.Connection) -> list[Group]:
    """Every group, oldest first."""
    rows = conn.execute("SELECT name, description, created_at FROM task_groups ORDER BY created_at, name").fetchall()
    return [Group(r[0], r[1], r[2], _members(conn, r[0])) for r in rows]


def member_rows(conn: sqlite3.Connection, name: str) -> list[sqlite3.Row]:
    """(agent, capability, state, state_reason, task_id, branch, cost_usd, turns) of each member, in the
    order they were added; the session columns are NULL for a member whose row is gone."""
    return conn.execute(
        "SELECT m.agent, s.capability, s.state, s.state_reason, s.task_id, s.branch, s.cost_usd, s.turns "
        "FROM task_group_members m LEFT JOIN sessions s ON s.name = m.agent "
        "WHERE m.group_name = ? ORDER BY m.added_at, m.agent", (name,)).fetchall()


def summaries(conn: sqlite3.Connection, limit: int = 50) -> list[sqlite3.Row]:
    """(name, description, created_at, agents, completed, zombie, cost_usd) of the newest ``limit`` groups, oldest
    of them first: one query. Raises ``sqlite3.OperationalError`` on a state database older than groups."""
    return conn.execute(
        "SELECT g.name, g.description, g.created_at, count(m.agent) AS agents, "
        "coalesce(sum(s.state = 'completed'), 0) AS completed, coalesce(sum(s.state = 'zombie'), 0) AS zombie, "
        "coalesce(sum(s.cost_usd), 0) AS cost_usd "
        "FROM (SELECT * FROM task_groups ORDER BY created_at DESC, name DESC LIMIT ?) g "
        "LEFT JOIN task_group_members m ON m.group_name = g.name LEFT JOIN sessions s ON s.name = m.agent "
        "GROUP BY g.name ORDER BY g.created_at, g.name", (limit,)).fetchall()


def groups_of(conn: sqlite3.Connection, agents: t.Iterable[str]) -> dict[str, list[str]]:
    """Group name -> its members among ``agents`` (for `ov status` with a selection)."""
    wanted = set(agents)
    found: dict[str, list[str]] = {}
    for group, agent in conn.execute("SELECT group_name, agent FROM task_group_members ORDER BY added_at, agent"):
        if agent in wanted:
            found.setdefault(group, []).append(agent)
    return found
