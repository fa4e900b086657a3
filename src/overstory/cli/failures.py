"""One clear line for failures that reach the CLI boundary as library exceptions.

Most errors are ``OrchestratorError``s raised where the problem is understood. These are
the ones the operating system or SQLite raises wherever they happen (a full disk, a
read-only directory, a damaged database, a number SQLite cannot hold): each is named
here instead of being shown as an "internal error".
"""

from __future__ import annotations

import errno
import sqlite3
import typing as t

NO_SPACE = "no space left on device"


def describe(exc: BaseException, argv: t.Sequence[str]) -> str | None:
    """The message for ``exc``, or None when it is not one of the known failures."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        if text.startswith("no such table:"):
            return _missing_table(text.split(":", 1)[1].strip(), argv)
        if "database or disk is full" in text:
            return f"{NO_SPACE} for ov's database: the change was rolled back, nothing was written"
        if "readonly database" in text:
            return f"cannot write ov's database ({text}): is .overstory/ on a read-only file system?"
        if "unable to open database file" in text:
            return f"cannot open ov's database ({text}): is .overstory/ missing, or read-only?"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{NO_SPACE}{_where(exc)}"
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        return f"read-only file system{_where(exc)}: ov needs to write under .overstory/"
    if isinstance(exc, OverflowError) and "SQLite" in str(exc):
        return "a number is too large: ids and counts are at most 2^63-1 (9223372036854775807)"
    if isinstance(exc, RecursionError):
        return "the input is nested too deeply to be processed"
    return None


def _where(exc: OSError) -> str:
    return f" ({exc.filename})" if exc.filename else ""


def _missing_table(table: str, argv: t.Sequence[str]) -> str:
    """Which of the project's databases lacks ``table``, and where to go from here."""
    where = "a database"
    try:
        from overstory.paths import find_project
        from overstory.store.events_migrations import EVENTS_MIGRATIONS
        from overstory.store.migrations import STATE_MIGRATIONS
        from overstory.store.schema import expected_objects

        project = find_project(_project_option(argv))
        for path, migrations in ((project.state_db, STATE_MIGRATIONS), (project.events_db, EVENTS_MIGRATIONS)):
            if table in expected_objects(migrations, "table"):
                where = str(path)
                break
    except Exception:  # noqa: BLE001 - naming the file is a courtesy; the message stands without it
        pass
    return (f"{where} has no table {table!r}: the database is damaged; run `ov doctor` "
            "(`ov doctor --repair` recreates missing tables)")


def _project_option(argv: t.Sequence[str]) -> str | None:
    for index, arg in enumerate(argv):
        if arg == "--project" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--project="):
            return arg.split("=", 1)[1]
    return None
