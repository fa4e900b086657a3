"""state.db migrations for teams of agents: task groups and the notes a builder gets about its siblings.

Listed at the end of ``store.migrations.STATE_MIGRATIONS`` (that module is near the size limit); the
same rules hold: a released migration is never edited.
"""

from __future__ import annotations

TYPE_CHECKING = False  # opened by hot commands: typing is not imported
if TYPE_CHECKING:
    import sqlite3


def _state_m014_task_groups(conn: sqlite3.Connection) -> None:
    """`ov group`: named groups of agents working on one piece of work (members by agent name)."""
    for statement in (  # one statement each (store.migrations.run_script would import that module from here)
        """CREATE TABLE task_groups (
            name        TEXT PRIMARY KEY,
            description TEXT NOT NULL DEFAULT '',
            created_at  INTEGER NOT NULL
        )""",
        """CREATE TABLE task_group_members (
            group_name TEXT NOT NULL REFERENCES task_groups(name) ON DELETE CASCADE,
            agent      TEXT NOT NULL,
            added_at   INTEGER NOT NULL,
            PRIMARY KEY (group_name, agent)
        )""",
        "CREATE INDEX task_group_members_agent ON task_group_members(agent)",
    ):
        conn.execute(statement)


def _state_m015_sibling_notices(conn: sqlite3.Connection) -> None:
    """The base-branch heads a builder was told about when its ``worker_done`` was held (``agents.siblings``):
    told once per head, so the same report sent again goes through."""
    conn.execute("""CREATE TABLE sibling_notices (
            agent      TEXT NOT NULL,
            generation INTEGER NOT NULL,
            base_head  TEXT NOT NULL,
            told_at    INTEGER NOT NULL,
            PRIMARY KEY (agent, generation, base_head)
        )""")
