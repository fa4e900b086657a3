"""Schema versions: fresh databases, upgrades from every earlier version, pragmas, concurrency."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import pytest

from overstory.errors import StoreError
from overstory.store import db, events_migrations, migrations

STORES = {
    "state": (migrations.STATE_MIGRATIONS, db.open_state),
    "events": (events_migrations.EVENTS_MIGRATIONS, db.open_events),
}
Opener = t.Callable[[Path], sqlite3.Connection]


def schema_of(path: Path) -> tuple[int, list[tuple[str, str, str]]]:
    """(user_version, sorted (type, name, sql) of every table and index)."""
    conn = sqlite3.connect(str(path))
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        objects = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'index', 'trigger', 'view') "
            "ORDER BY type, name"
        ).fetchall()
    finally:
        conn.close()
    return version, [(kind, name, " ".join((sql or "").split())) for kind, name, sql in objects]


def build_old_version(path: Path, migrations: t.Sequence[migrations.Migration], k: int) -> None:
    """A database as an older ov would have left it: only the first ``k`` migrations."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        assert db.migrate(conn, migrations[:k]) == k
    finally:
        conn.close()


def test_store_db_knows_how_many_migrations_there_are() -> None:
    """open_state/open_events import a migration list only for a file behind it (the hot commands'), so store.db
    keeps their lengths: a migration appended without counting it here would never run on a current file."""
    assert (db.STATE_VERSION, db.EVENTS_VERSION) == (len(migrations.STATE_MIGRATIONS),
                                                     len(events_migrations.EVENTS_MIGRATIONS))
    assert (len(db._STATE), len(db._EVENTS)) == (db.STATE_VERSION, db.EVENTS_VERSION)
    assert [db._STATE[i] for i in range(db.STATE_VERSION)] == list(migrations.STATE_MIGRATIONS)


def test_a_current_database_opens_without_its_migrations_or_errors(tmp_path: Path) -> None:
    """What `ov status` and `ov guard` pay for: a sound, current file opens without importing the migration lists
    (or overstory.errors, which only a failure needs)."""
    path = tmp_path / "state.db"
    db.open_state(path).close()
    code = ("import sys\nfrom overstory.store.db import open_state\nopen_state(sys.argv[1]).close()\n"
            "print(sorted(m for m in ('overstory.store.migrations', 'overstory.store.events_migrations', "
            "'overstory.errors') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("store", sorted(STORES))
def test_fresh_database_has_every_migration(tmp_path: Path, store: str) -> None:
    migrations, opener = STORES[store]
    opener(tmp_path / "fresh.db").close()
    version, objects = schema_of(tmp_path / "fresh.db")
    assert version == len(migrations) >= 1
    assert any(kind == "table" for kind, _, _ in objects)


@pytest.mark.parametrize("store", sorted(STORES))
def test_upgrade_from_every_earlier_version_matches_fresh(tmp_path: Path, store: str) -> None:
    migrations, opener = STORES[store]
    opener(tmp_path / "fresh.db").close()
    fresh = schema_of(tmp_path / "fresh.db")
    for k in range(len(migrations)):
        old = tmp_path / f"v{k}.db"
        build_old_version(old, migrations, k)
        assert schema_of(old)[0] == k
        opener(old).close()
        assert schema_of(old) == fresh, f"upgrading {store} from version {k} gives a different schema"


@pytest.mark.parametrize("store", sorted(STORES))
def test_reopening_is_a_no_op(tmp_path: Path, store: str) -> None:
    _, opener = STORES[store]
    path = tmp_path / "again.db"
    opener(path).close()
    before = schema_of(path)
    for _ in range(3):
        opener(path).close()
    assert schema_of(path) == before


def test_an_empty_existing_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.touch()
    db.open_state(path).close()
    assert schema_of(path)[0] == len(migrations.STATE_MIGRATIONS)


def test_upgrade_keeps_data(tmp_path: Path) -> None:
    """Rows written at the oldest version survive the upgrade to the newest."""
    path = tmp_path / "state.db"
    build_old_version(path, migrations.STATE_MIGRATIONS, 1)
    conn = sqlite3.connect(str(path))
    conn.execute("INSERT INTO generations(name, generation) VALUES ('kept', 3)")
    conn.commit()
    conn.close()
    upgraded = db.open_state(path)
    try:
        assert upgraded.execute("SELECT generation FROM generations WHERE name='kept'").fetchone()[0] == 3
    finally:
        upgraded.close()


@pytest.mark.parametrize("store", sorted(STORES))
def test_a_newer_schema_is_refused_clearly(tmp_path: Path, store: str) -> None:
    migrations, opener = STORES[store]
    path = tmp_path / "future.db"
    opener(path).close()
    conn = sqlite3.connect(str(path))
    conn.execute(f"PRAGMA user_version = {len(migrations) + 5}")
    conn.close()
    with pytest.raises(StoreError) as caught:
        opener(path)
    message = str(caught.value)
    assert "future.db" in message
    assert str(len(migrations) + 5) in message and "newer" in message and "upgrade" in message
    assert schema_of(path)[0] == len(migrations) + 5, "a newer database must be left untouched"


def test_a_corrupt_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite at all\n" * 200)
    with pytest.raises(StoreError, match="state.db"):
        db.open_state(path)


@pytest.mark.parametrize("store", sorted(STORES))
def test_connection_pragmas(tmp_path: Path, store: str) -> None:
    _, opener = STORES[store]
    conn = opener(tmp_path / "p.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.isolation_level is None, "transactions must be explicit (autocommit mode)"
    finally:
        conn.close()


def test_write_transaction_rolls_back_on_error(tmp_path: Path) -> None:
    conn = db.open_state(tmp_path / "state.db")
    try:
        with pytest.raises(RuntimeError):
            with db.write_transaction(conn):
                conn.execute("INSERT INTO generations(name, generation) VALUES ('gone', 1)")
                raise RuntimeError("boom")
        assert not conn.in_transaction
        assert conn.execute("SELECT count(*) FROM generations").fetchone()[0] == 0
    finally:
        conn.close()


def test_run_script_rejects_an_unfinished_statement() -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(ValueError, match="incomplete"):
        migrations.run_script(conn, "CREATE TABLE a (x INTEGER);\nCREATE TABLE b (y")


_OPEN_AT_ONCE = """
import json, sys, time
from pathlib import Path
from overstory.store import db
for opener_name, path, start_at in json.loads(sys.argv[1]):
    while time.time() < start_at:
        time.sleep(0.001)
    try:
        conn = getattr(db, opener_name)(Path(path))
        print("ok", opener_name, db.schema_version(conn), flush=True)
        conn.close()
    except Exception as exc:
        print("error", opener_name, type(exc).__name__, exc, flush=True)
"""


def test_many_processes_opening_a_fresh_database(tmp_path: Path) -> None:
    """The llm #789 failure: parallel first opens must neither lock out nor migrate twice.

    Twelve processes open the same brand-new file at the same instant, several rounds
    (state and events alternately, a new file each round) to give a race many chances.
    """
    first_round = time.time() + 1.5
    rounds = [
        ("open_state" if index % 2 == 0 else "open_events", str(tmp_path / f"round{index}.db"), first_round + 0.15 * index)
        for index in range(12)
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        subprocess.Popen([sys.executable, "-c", _OPEN_AT_ONCE, json.dumps(rounds)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(12)
    ]
    results = [process.communicate(timeout=90) for process in processes]
    expected = [f"ok {name} {len(STORES[name.removeprefix('open_')][0])}" for name, _, _ in rounds]
    for stdout, stderr in results:
        assert stdout.splitlines() == expected, stdout + stderr
    for opener_name, path, _ in rounds:
        fresh = tmp_path / f"fresh-{opener_name}.db"
        if not fresh.exists():
            getattr(db, opener_name)(fresh).close()
        assert schema_of(Path(path)) == schema_of(fresh)
