"""SQLite connections and append-only migrations for state.db and events.db.

Every connection runs in autocommit mode (``isolation_level=None``) so transactions
are always explicit: ``with write_transaction(conn):`` issues ``BEGIN IMMEDIATE``,
which takes the write lock up front and makes read-modify-write sequences atomic.
"""

from __future__ import annotations

import os
import sys
import time

from overstory.store.sqlite_module import sqlite3  # the C module, without the package's datetime adapters

TYPE_CHECKING = False  # typing costs milliseconds and hot commands open databases
if TYPE_CHECKING:
    import typing as t

    from overstory.store.migrations import Migration
# overstory.errors is imported where an error is raised: the hot commands open sound, current databases.

BUSY_TIMEOUT_MS = 10_000
# The schema versions the migration lists bring a database to: their lengths (tests/test_migrations.py checks them).
# Append a migration, add one here. open_state and open_events import a list only for a file behind it: the hot
# commands open databases that are current, and the lists' modules (their SQL) are a fifth of a millisecond of each.
STATE_VERSION = 14
EVENTS_VERSION = 1


class _Migrations:
    """``STATE_MIGRATIONS`` or ``EVENTS_MIGRATIONS`` as ``migrate`` reads them: its length without importing it."""

    def __init__(self, module: str, name: str, length: int) -> None:
        self.module, self.name, self.length = module, name, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Migration:
        __import__(self.module)
        listed: t.Sequence[Migration] = getattr(sys.modules[self.module], self.name)
        if len(listed) != self.length:  # tests/test_migrations.py catches this first
            raise RuntimeError(f"{self.module}.{self.name} has {len(listed)} migrations; store.db says {self.length}")
        return listed[index]


_STATE = _Migrations("overstory.store.migrations", "STATE_MIGRATIONS", STATE_VERSION)
_EVENTS = _Migrations("overstory.store.events_migrations", "EVENTS_MIGRATIONS", EVENTS_VERSION)


def connect(path: str | os.PathLike[str], migrations: t.Sequence[Migration] | _Migrations, *,
            shared: bool = False) -> sqlite3.Connection:
    """Open ``path`` with the project's pragmas and bring its schema up to date.

    ``shared``: the connection may be handed from thread to thread (one at a time), e.g. by a pool.
    """
    try:
        conn = sqlite3.connect(os.fspath(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=not shared)
    except sqlite3.Error as exc:
        from overstory.errors import StoreError

        raise StoreError(f"cannot open {path}: {exc}") from exc
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _switch_to_wal(conn, path)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn, migrations, label=os.path.basename(os.fspath(path)))
    except sqlite3.DatabaseError as exc:
        conn.close()
        from overstory.errors import DiskFull, StoreError

        if _no_space_left(path):
            raise DiskFull(f"no space left on device for {path}: it cannot even be opened; nothing was written") from exc
        raise StoreError(f"{path} is not a usable ov database: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _switch_to_wal(conn: sqlite3.Connection, path: str | os.PathLike[str]) -> None:
    """Put the file in WAL mode, waiting out other processes doing the same.

    Changing the journal mode needs an exclusive lock and SQLite reports SQLITE_BUSY
    for it without calling the busy handler, so several processes opening a fresh
    database at once would see "database is locked". Retry until the busy timeout.
    """
    if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
        return
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        if time.monotonic() > deadline:
            from overstory.errors import StoreError

            raise StoreError(f"{path}: could not switch to WAL mode: the database stayed locked by another process")
        import random  # only when another process holds the lock

        time.sleep(0.005 + random.random() * 0.02)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def integrity(conn: sqlite3.Connection) -> tuple[str, int]:
    """(SQLite's quick_check verdict, "ok" when sound; the schema version)."""
    verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
    return verdict, schema_version(conn)


def events_write_refused(conn: sqlite3.Connection) -> str | None:
    """Why a write to this events database fails (tried and rolled back; root ignores permission bits), or None."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM events WHERE 0")
        finally:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        return str(exc)
    return None


def migrate(conn: sqlite3.Connection, migrations: t.Sequence[Migration] | _Migrations, *,
            label: str = "database") -> int:
    """Apply the migrations past ``PRAGMA user_version``, each in its own transaction.

    Safe when many processes open the database at once: the version is re-read after
    the write lock is taken, so each migration runs exactly once.
    """
    target = len(migrations)
    current = schema_version(conn)
    if current > target:
        from overstory.errors import StoreError

        raise StoreError(f"{label} has schema version {current}, newer than this ov understands ({target}); upgrade ov")
    while current < target:
        with write_transaction(conn):
            current = schema_version(conn)
            if current >= target:
                break
            migrations[current](conn)
            current += 1
            conn.execute(f"PRAGMA user_version = {current}")
    return current


class write_transaction:  # used as a function: ``with write_transaction(conn):``
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception.

    A class rather than a ``contextlib`` generator: the hot commands then need not import contextlib.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> t.Literal[False]:
        conn = self.conn
        if exc is None:
            try:
                conn.execute("COMMIT")
                return False
            except BaseException as failed:  # noqa: BLE001 - rolled back and raised below, as any failure inside
                exc = failed
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite already rolled back (it does so itself on some errors)
        if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
            from overstory.errors import DiskFull

            raise DiskFull(f"no space left on device for {_file_of(conn)}: the change was rolled back, "
                           "nothing was written") from exc
        if exc is not None and kind is None:
            raise exc  # COMMIT itself failed
        return False


class atomic:  # used as a function: ``with atomic(conn):``
    """Join the caller's transaction if there is one, else run in our own ``write_transaction``."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.own = None if conn.in_transaction else write_transaction(conn)

    def __enter__(self) -> sqlite3.Connection:
        return self.own.__enter__() if self.own is not None else self.conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        return self.own.__exit__(kind, exc, tb) if self.own is not None else False


def _no_space_left(path: str | os.PathLike[str]) -> bool:
    """Whether the file system holding ``path`` is full (SQLite then reports only "disk I/O error")."""
    try:
        stats = os.statvfs(os.path.dirname(os.path.abspath(os.fspath(path))))
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 64 * 1024


def file_of(conn: sqlite3.Connection) -> str | None:
    """The path of the connection's main database file (None: in memory, or not readable)."""
    try:
        for row in conn.execute("PRAGMA database_list"):
            if row[1] == "main" and row[2]:
                return str(row[2])
    except sqlite3.Error:
        pass
    return None


def _file_of(conn: sqlite3.Connection) -> str:
    return file_of(conn) or "ov's database"


def open_state(path: str | os.PathLike[str], *, shared: bool = False) -> sqlite3.Connection:
    return connect(path, _STATE, shared=shared)


def open_events(path: str | os.PathLike[str], *, shared: bool = False) -> sqlite3.Connection:
    return connect(path, _EVENTS, shared=shared)
