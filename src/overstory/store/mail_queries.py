"""Read-only questions other layers ask about the ``mail`` table (the writers live in ``mail``).

`ov status --json` imports this module: standard library only, and nothing at import time.
Every query is bounded by a limit or served by an index.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs milliseconds and hot commands import this module
if TYPE_CHECKING:
    import sqlite3
    import typing as t

# The columns the web views show of a message.
VIEW_COLUMNS = ("id, thread_id, reply_to, sender, recipient, type, priority, subject, body, payload, created_at, "
                "read_at, claimed_by")


def has_pending(conn: sqlite3.Connection, recipient: str) -> bool:
    """Unread mail not yet claimed by a turn is waiting for ``recipient``."""
    return conn.execute("SELECT 1 FROM mail WHERE recipient = ? AND read_at IS NULL AND claimed_by IS NULL LIMIT 1",
                        (recipient,)).fetchone() is not None


def pending_nudge(conn: sqlite3.Connection, recipient: str, sender: str) -> int | None:
    """The id of a nudge from ``sender`` that still waits, unread and unclaimed, for ``recipient``."""
    row = conn.execute("SELECT id FROM mail WHERE recipient = ? AND sender = ? AND type = 'nudge' AND read_at IS NULL "
                       "AND claimed_by IS NULL ORDER BY id DESC LIMIT 1", (recipient, sender)).fetchone()
    return int(row[0]) if row is not None else None


def pending_ids(conn: sqlite3.Connection, recipient: str) -> list[int]:
    return [int(r[0]) for r in conn.execute("SELECT id FROM mail WHERE recipient = ? AND read_at IS NULL "
                                            "AND claimed_by IS NULL", (recipient,)).fetchall()]


def pending_indexed(conn: sqlite3.Connection, recipient: str) -> int:
    """How much mail waits for ``recipient`` (through the partial index: fast at 100k messages)."""
    return int(conn.execute("SELECT count(*) FROM mail INDEXED BY mail_pending WHERE recipient = ? "
                            "AND read_at IS NULL AND claimed_by IS NULL", (recipient,)).fetchone()[0])


def pending_by_recipient(conn: sqlite3.Connection) -> dict[str, int]:
    """Recipient -> how much mail waits for it, not counting mail to oneself.

    Names the partial index: left alone, SQLite picks ``mail_claims`` for
    ``claimed_by IS NULL`` and walks nearly every row (35 ms at 100k messages).
    """
    rows = conn.execute(
        "SELECT recipient, count(*) FROM mail INDEXED BY mail_pending "
        "WHERE read_at IS NULL AND claimed_by IS NULL AND sender != recipient GROUP BY recipient"
    ).fetchall()
    return {row[0]: int(row[1]) for row in rows}


def claimed_unread(conn: sqlite3.Connection, recipient: str) -> int:
    """Mail a turn of ``recipient`` claimed and did not finish reading."""
    return int(conn.execute("SELECT count(*) FROM mail WHERE recipient = ? AND claimed_by IS NOT NULL "
                            "AND read_at IS NULL", (recipient,)).fetchone()[0])


def recipients_of(conn: sqlite3.Connection, ids: t.Sequence[int]) -> dict[int, str]:
    """Message id -> recipient."""
    if not ids:
        return {}
    rows = conn.execute(f"SELECT id, recipient FROM mail WHERE id IN ({','.join('?' * len(ids))})",
                        list(ids)).fetchall()
    return {int(r["id"]): r["recipient"] for r in rows}


def first_result(conn: sqlite3.Connection, recipient: str, sender: str) -> sqlite3.Row | None:
    """(id, subject, body, payload) of the first ``result`` mail from ``sender`` to ``recipient``."""
    return conn.execute("SELECT id, subject, body, payload FROM mail WHERE recipient = ? AND sender = ? "
                        "AND type = 'result' ORDER BY id LIMIT 1", (recipient, sender)).fetchone()


def first_dispatch_since(conn: sqlite3.Connection, recipient: str, since_ms: int) -> int | None:
    row = conn.execute("SELECT id FROM mail WHERE recipient = ? AND type = 'dispatch' AND created_at >= ? "
                       "ORDER BY id LIMIT 1", (recipient, since_ms)).fetchone()
    return int(row[0]) if row is not None else None


def first_done_since(conn: sqlite3.Connection, sender: str, since_ms: int) -> int | None:
    """When ``sender`` first sent ``worker_done`` since ``since_ms``."""
    row = conn.execute("SELECT min(created_at) FROM mail WHERE sender = ? AND type = 'worker_done' "
                       "AND created_at >= ?", (sender, since_ms)).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def last_asked(conn: sqlite3.Connection, sender: str, types: t.Sequence[str], since_ms: int) -> int | None:
    """The id of the newest mail of ``types`` that ``sender`` sent since ``since_ms``."""
    marks = ",".join("?" * len(types))
    row = conn.execute(f"SELECT max(id) FROM mail WHERE sender = ? AND type IN ({marks}) AND created_at >= ?",
                       (sender, *types, since_ms)).fetchone()
    return row[0]


def answered_after(conn: sqlite3.Connection, recipient: str, after_id: int, not_from: str) -> bool:
    """Mail came to ``recipient`` after message ``after_id`` from someone other than ``not_from``."""
    return conn.execute("SELECT max(id) FROM mail WHERE recipient = ? AND id > ? AND sender != ?",
                        (recipient, after_id, not_from)).fetchone()[0] is not None


def reply_in_thread(conn: sqlite3.Connection, thread_id: int, recipient: str) -> int | None:
    """The first message in thread ``thread_id`` after its opening one, to ``recipient``."""
    row = conn.execute("SELECT id FROM mail WHERE thread_id = ? AND id > ? AND recipient = ? ORDER BY id LIMIT 1",
                       (thread_id, thread_id, recipient)).fetchone()
    return int(row[0]) if row is not None else None


def last_to_operator(conn: sqlite3.Connection, sender: str) -> int | None:
    row = conn.execute("SELECT id FROM mail WHERE sender = ? AND recipient = 'operator' ORDER BY id DESC LIMIT 1",
                       (sender,)).fetchone()
    return int(row[0]) if row is not None else None


def recent_to(conn: sqlite3.Connection, recipient: str, since_ms: int, limit: int = 10) -> list[sqlite3.Row]:
    """(sender, type, subject) of the newest ``limit`` messages to ``recipient`` since ``since_ms``, newest first."""
    return conn.execute("SELECT sender, type, subject FROM mail WHERE recipient = ? AND created_at >= ? "
                        "ORDER BY id DESC LIMIT ?", (recipient, since_ms, limit)).fetchall()


def newest(conn: sqlite3.Connection, limit: int) -> list[sqlite3.Row]:
    """The newest ``limit`` messages' headers, newest first (by primary key, so bounded)."""
    return conn.execute("SELECT id, sender, recipient, type, priority, subject, created_at, read_at, claimed_by "
                        "FROM mail ORDER BY id DESC LIMIT ?", (limit,)).fetchall()


def newest_of(conn: sqlite3.Connection, name: str, limit: int) -> tuple[list[sqlite3.Row], list[sqlite3.Row]]:
    """The newest ``limit`` messages ``name`` received, and the newest ``limit`` it sent (``VIEW_COLUMNS``)."""
    received = conn.execute(f"SELECT {VIEW_COLUMNS} FROM mail WHERE recipient = ? ORDER BY id DESC LIMIT ?",
                            (name, limit)).fetchall()
    sent = conn.execute(f"SELECT {VIEW_COLUMNS} FROM mail WHERE sender = ? ORDER BY id DESC LIMIT ?",
                        (name, limit)).fetchall()
    return received, sent


def unread_to_operator(conn: sqlite3.Connection, types: t.Sequence[str], limit: int) -> list[sqlite3.Row]:
    """The newest ``limit`` unread messages of ``types`` to the operator, newest first (``VIEW_COLUMNS``)."""
    marks = ",".join("?" * len(types))
    return conn.execute(f"SELECT {VIEW_COLUMNS} FROM mail WHERE recipient = 'operator' AND read_at IS NULL "
                        f"AND type IN ({marks}) ORDER BY id DESC LIMIT ?", (*types, limit)).fetchall()


def of_types_after(conn: sqlite3.Connection, after_id: int, types: t.Sequence[str]) -> tuple[list[sqlite3.Row], int]:
    """(id, type, sender, recipient, subject, body) of mail of ``types`` after ``after_id``; and the newest id."""
    marks = ",".join("?" * len(types))
    rows = conn.execute(f"SELECT id, type, sender, recipient, subject, body FROM mail WHERE id > ? "
                        f"AND type IN ({marks}) ORDER BY id", (after_id, *types)).fetchall()
    top = conn.execute("SELECT COALESCE(MAX(id), 0) FROM mail").fetchone()[0]
    return rows, int(top)
