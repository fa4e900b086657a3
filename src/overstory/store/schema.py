"""What a database's schema should hold, what it lacks, and putting the missing parts back.

The expected schema is whatever the migrations build in a fresh in-memory database, so
it never drifts from them. Used by `ov doctor` and by the message for a damaged database;
never on a hot path (building the reference schema takes a few milliseconds).
"""

from __future__ import annotations

import functools
import sqlite3
import typing as t

from overstory.store.db import migrate, schema_version, write_transaction

if t.TYPE_CHECKING:
    from overstory.store.migrations import Migration


@functools.lru_cache(maxsize=8)
def _reference(migrations: tuple[Migration, ...]) -> tuple[tuple[str, str, str | None], ...]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, list(migrations))
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%' "
            "ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, rowid"
        ).fetchall()
    finally:
        conn.close()
    return tuple((r[0], r[1], r[2]) for r in rows)


def expected_objects(migrations: t.Sequence[Migration], kind: str | None = None) -> list[str]:
    """Names of the tables (``kind="table"``), indexes, or both that the migrations create."""
    return [name for typ, name, _ in _reference(tuple(migrations)) if kind is None or typ == kind]


def missing_objects(conn: sqlite3.Connection, migrations: t.Sequence[Migration]) -> list[tuple[str, str]]:
    """(type, name) of every table and index the migrations create that ``conn`` lacks.

    Only meaningful for a database at the migrations' version: an older one is simply
    upgraded by the next ov command that opens it.
    """
    present = {(r[0], r[1]) for r in conn.execute("SELECT type, name FROM sqlite_master")}
    return [(typ, name) for typ, name, _ in _reference(tuple(migrations)) if (typ, name) not in present]


def repair(conn: sqlite3.Connection, migrations: t.Sequence[Migration]) -> list[str]:
    """Recreate missing tables (empty: their rows are gone) and indexes; returns what was made."""
    if schema_version(conn) != len(migrations):
        return []
    made = []
    with write_transaction(conn):
        present = {(r[0], r[1]) for r in conn.execute("SELECT type, name FROM sqlite_master")}
        for typ, name, sql in _reference(tuple(migrations)):
            if (typ, name) not in present and sql:
                conn.execute(sql)
                made.append(f"{typ} {name}")
    return made
