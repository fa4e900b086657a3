"""Which base-branch heads a builder was told about when its ``worker_done`` was held (``agents.siblings``)."""

from __future__ import annotations

from overstory.clock import now_ms
from overstory.store.db import atomic

TYPE_CHECKING = False  # imported by `ov mail send` (hot): typing is not imported
if TYPE_CHECKING:
    import sqlite3


def tell_once(conn: sqlite3.Connection, agent: str, generation: int, base_head: str) -> bool:
    """Record that ``agent`` (this generation) was told about ``base_head``; False if it had been already."""
    with atomic(conn):
        inserted = conn.execute("INSERT INTO sibling_notices(agent, generation, base_head, told_at) "
                                "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                (agent, generation, base_head, now_ms())).rowcount
    return bool(inserted)
