"""An `ov loop` agent's own ``worker_done``, held while its loop runs.

A loop agent's iterations end with the promise, not with a report: the loop itself
reports to the parent once, when it completes (``agents.iterations``). A model that
sends ``worker_done`` anyway (every iteration, say) must not tell the parent "done"
from a loop that may still fail its check and park. So while the sender's loop (of
its current generation) is not completed, its ``worker_done`` is not mail: the newest
one is kept in ``loops.held_report`` (one UPDATE), and the loop's own report quotes it.

Exactly once: a held report never becomes mail, so whatever process dies when, the
parent gets one ``worker_done`` per loop, the loop's, written in the transaction that
completes the agent (deduplicated per generation). A send that dies before its UPDATE
commits held nothing (the report is just not quoted); one retried after it commits
overwrites the same row.

HOT (`ov mail send`): the standard library and ov's stdlib-only store only.
"""

from __future__ import annotations

from overstory import jsontext as json
from overstory.clock import now_ms

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
    import typing as t

HELD_TYPES = frozenset({"worker_done"})
_BODY_LIMIT = 4000


def hold(conn: sqlite3.Connection, sender: str, type_: str, *, subject: str, body: str,
         payload: t.Any = None) -> str | None:
    """Hold ``sender``'s report if its loop is running: the recipient it would have gone to; else None (send it)."""
    if type_ not in HELD_TYPES or not sender:
        return None
    row = conn.execute(
        "SELECT s.parent, s.generation FROM sessions s JOIN loops l ON l.name = s.name AND l.generation = s.generation "
        "WHERE s.name = ? AND l.status != 'completed' AND s.state NOT IN ('completed', 'zombie')",
        (sender,)).fetchone()
    if row is None:
        return None
    held = json.dumps({"type": type_, "subject": subject[:300], "body": body[:_BODY_LIMIT], "payload": payload,
                       "at": now_ms()})
    # One statement (autocommit, or the caller's transaction): a report is held whole or not at all.
    conn.execute("UPDATE loops SET held_report = ? WHERE name = ? AND generation = ? AND status != 'completed'",
                 (held, sender, row[1]))
    return str(row[0] or "operator")


def held(text: str | None) -> dict[str, t.Any] | None:
    """The held report (``loops.held_report``) as a mapping, or None."""
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
