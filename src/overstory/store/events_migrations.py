"""events.db's migrations, in order (the state database's are in ``store.migrations``)."""

from __future__ import annotations

from overstory.store.migrations import run_script

TYPE_CHECKING = False  # opened by hot commands: typing is not imported
if TYPE_CHECKING:
    import sqlite3

    from overstory.store.migrations import Migration


def _events_m001_initial(conn: sqlite3.Connection) -> None:
    run_script(conn,
        """
        CREATE TABLE events (
            id         INTEGER PRIMARY KEY,
            at         INTEGER NOT NULL,
            agent      TEXT,
            generation INTEGER,
            turn_id    TEXT,
            kind       TEXT NOT NULL,
            tool       TEXT,
            summary    TEXT,
            data       TEXT
        );
        CREATE INDEX events_agent ON events(agent, id);
        CREATE INDEX events_kind ON events(kind, id);
        CREATE INDEX events_turn ON events(turn_id, id);
        """
    )


EVENTS_MIGRATIONS: list[Migration] = [_events_m001_initial]
