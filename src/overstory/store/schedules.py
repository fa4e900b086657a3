"""Rows of `ov schedule`: schedules, and one row per fire.

A schedule starts work by itself: at the times of a cron expression (``kind='cron'``)
or for each mail of a type that reaches the operator (``kind='mail'``). Its ``cursor``
is the last due time (ms) or mail id it has dealt with.

A fire is claimed before anything runs: one transaction inserts the fire row, unique by
(schedule, occasion), and moves the cursor. Two watchdogs that see the same due time
race on that insert and only one wins; a watchdog that restarts finds the row and does
not fire again. A fire is ``claimed`` (by a process, recorded with its start ticks),
``running`` (its runner took it: from here on it is never started again), then ``ok``,
``failed``, or ``lost`` (its runner died while the command ran: whether the command
started work is unknown, so it is reported, not repeated).
"""

from __future__ import annotations

import json
import sqlite3
import typing as t
from dataclasses import dataclass

from overstory.clock import now_ms
from overstory.errors import ScheduleError
from overstory.store.db import write_transaction

CRON = "cron"
MAIL = "mail"
OPEN_FIRE_STATUSES = ("claimed", "running")
NOTICE_KEY = "schedule_fire:"  # dedup key prefix of the mail that tells a person a fire failed


@dataclass(frozen=True)
class Schedule:
    id: int
    name: str
    kind: str
    cron: str | None
    mail_type: str | None
    mail_from: str | None
    argv: list[str]
    paused: bool
    cursor: int
    fired: int
    created_at: int
    updated_at: int

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Schedule:
        values = dict(row)
        values["argv"] = json.loads(values["argv"])
        values["paused"] = bool(values["paused"])
        return cls(**values)

    def trigger(self) -> str:
        if self.kind == CRON:
            return f"cron {self.cron}"
        return f"mail {self.mail_type}" + (f" from {self.mail_from}" if self.mail_from else "")


def add(conn: sqlite3.Connection, name: str, *, kind: str, argv: t.Sequence[str], cursor: int,
        cron: str | None = None, mail_type: str | None = None, mail_from: str | None = None) -> Schedule:
    now = now_ms()
    with write_transaction(conn):
        if conn.execute("SELECT 1 FROM schedules WHERE name = ?", (name,)).fetchone():
            raise ScheduleError(f"a schedule named {name!r} exists; `ov schedule remove {name}` first, or pick "
                                "another name")
        conn.execute("INSERT INTO schedules(name, kind, cron, mail_type, mail_from, argv, cursor, created_at, "
                     "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (name, kind, cron, mail_type, mail_from, json.dumps(list(argv)), cursor, now, now))
    found = get(conn, name)
    assert found is not None
    return found


def get(conn: sqlite3.Connection, name: str) -> Schedule | None:
    row = conn.execute("SELECT * FROM schedules WHERE name = ?", (name,)).fetchone()
    return Schedule.from_row(row) if row else None


def require(conn: sqlite3.Connection, name: str) -> Schedule:
    found = get(conn, name)
    if found is None:
        raise ScheduleError(f"no schedule named {name!r}; `ov schedule list` shows them")
    return found


def list_all(conn: sqlite3.Connection) -> list[Schedule]:
    return [Schedule.from_row(row) for row in conn.execute("SELECT * FROM schedules ORDER BY name")]


def active(conn: sqlite3.Connection) -> list[Schedule]:
    return [Schedule.from_row(row) for row in conn.execute("SELECT * FROM schedules WHERE paused = 0 ORDER BY id")]


def remove(conn: sqlite3.Connection, name: str) -> bool:
    with write_transaction(conn):
        return conn.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount == 1


def set_paused(conn: sqlite3.Connection, name: str, paused: bool, *, cursor: int | None = None) -> Schedule:
    """Pause or resume; resuming moves the cursor to ``cursor`` (now), so what was paused is not caught up."""
    with write_transaction(conn):
        done = conn.execute("UPDATE schedules SET paused = ?, cursor = COALESCE(?, cursor), updated_at = ? "
                            "WHERE name = ?", (int(paused), cursor, now_ms(), name)).rowcount
    if not done:
        raise ScheduleError(f"no schedule named {name!r}; `ov schedule list` shows them")
    return require(conn, name)


def advance(conn: sqlite3.Connection, schedule_id: int, cursor: int) -> None:
    """Move the cursor past occasions that are not fired (missed, with ``catch_up: none``)."""
    with write_transaction(conn):
        conn.execute("UPDATE schedules SET cursor = max(cursor, ?), updated_at = ? WHERE id = ?",
                     (cursor, now_ms(), schedule_id))


# ---- fires ----------------------------------------------------------------------------


def claim(conn: sqlite3.Connection, schedule: Schedule, occasion: str, *, cursor: int,
          render: t.Callable[[int], list[str]], claimer_pid: int, claimer_ticks: int | None,
          due_at: int | None = None, mail_id: int | None = None) -> dict[str, t.Any] | None:
    """Claim the fire of ``occasion`` for this process; None when it was already claimed (by anyone).

    One transaction: the fire row (its number ``n`` is the schedule's next, and ``render(n)``
    its command line) and the cursor. The unique (schedule, occasion) key decides races.
    """
    now = now_ms()
    with write_transaction(conn):
        current = conn.execute("SELECT fired, paused FROM schedules WHERE id = ?", (schedule.id,)).fetchone()
        if current is None or current["paused"]:
            return None  # removed or paused since it was read
        n = int(current["fired"]) + 1
        row = conn.execute(
            "INSERT INTO schedule_fires(schedule_id, occasion, n, due_at, mail_id, argv, status, claimer_pid, "
            "claimer_ticks, claimed_at) VALUES (?, ?, ?, ?, ?, ?, 'claimed', ?, ?, ?) "
            "ON CONFLICT (schedule_id, occasion) DO NOTHING RETURNING id",
            (schedule.id, occasion, n, due_at, mail_id, json.dumps(render(n)), claimer_pid, claimer_ticks, now),
        ).fetchone()
        conn.execute("UPDATE schedules SET cursor = max(cursor, ?), fired = fired + ?, updated_at = ? WHERE id = ?",
                     (cursor, 1 if row else 0, now, schedule.id))
    return fire(conn, int(row[0])) if row else None


def fire(conn: sqlite3.Connection, fire_id: int) -> dict[str, t.Any] | None:
    row = conn.execute("SELECT f.*, s.name AS schedule FROM schedule_fires f LEFT JOIN schedules s "
                       "ON s.id = f.schedule_id WHERE f.id = ?", (fire_id,)).fetchone()
    if row is None:
        return None
    found = dict(row)
    found["argv"] = json.loads(found["argv"])
    return found


def open_fires(conn: sqlite3.Connection) -> list[dict[str, t.Any]]:
    marks = ",".join("?" * len(OPEN_FIRE_STATUSES))
    rows = conn.execute(f"SELECT id FROM schedule_fires WHERE status IN ({marks}) ORDER BY id",
                        OPEN_FIRE_STATUSES).fetchall()
    return [found for row in rows if (found := fire(conn, int(row[0]))) is not None]


def reclaim(conn: sqlite3.Connection, fire_id: int, *, was_pid: int | None, pid: int, ticks: int | None) -> bool:
    """Take over a claim whose claimer died before a runner took it (compare-and-swap on the claimer)."""
    with write_transaction(conn):
        return conn.execute("UPDATE schedule_fires SET claimer_pid = ?, claimer_ticks = ? WHERE id = ? "
                            "AND status = 'claimed' AND claimer_pid IS ?", (pid, ticks, fire_id, was_pid)).rowcount == 1


def start(conn: sqlite3.Connection, fire_id: int, *, runner_pid: int, runner_ticks: int | None) -> bool:
    """The runner takes the fire: True for exactly one runner, ever."""
    with write_transaction(conn):
        return conn.execute("UPDATE schedule_fires SET status = 'running', runner_pid = ?, runner_ticks = ?, "
                            "started_at = ? WHERE id = ? AND status = 'claimed'",
                            (runner_pid, runner_ticks, now_ms(), fire_id)).rowcount == 1


def finish(conn: sqlite3.Connection, fire_id: int, *, status: str, exit_code: int | None, output: str,
           notice: t.Mapping[str, t.Any] | None = None) -> bool:
    """Settle an open fire; with ``notice`` (the fields of one mail) that mail goes in the same
    transaction, so a settled failure always has its notice and a process killed before the
    commit leaves the fire open (the watchdog settles it later, with its own notice)."""
    from overstory.store import mail

    sent = None
    with write_transaction(conn):
        settled = conn.execute("UPDATE schedule_fires SET status = ?, exit_code = ?, output = ?, ended_at = ? "
                               "WHERE id = ? AND status IN ('claimed', 'running')",
                               (status, exit_code, output[-4000:], now_ms(), fire_id)).rowcount == 1
        if settled and notice is not None:
            sent = mail.insert_message(conn, **notice)
    if sent is not None:
        mail.record_sent(conn, [sent])
    return settled


def recent_fires(conn: sqlite3.Connection, schedule_id: int, limit: int = 5) -> list[dict[str, t.Any]]:
    rows = conn.execute("SELECT id FROM schedule_fires WHERE schedule_id = ? ORDER BY id DESC LIMIT ?",
                        (schedule_id, limit)).fetchall()
    return [found for row in rows if (found := fire(conn, int(row[0]))) is not None]


def max_mail_id(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT COALESCE(max(id), 0) FROM mail").fetchone()
    return int(row[0])


def mail_after(conn: sqlite3.Connection, cursor: int, mail_type: str, sender: str | None,
               limit: int = 50) -> list[sqlite3.Row]:
    """Mail of ``mail_type`` (from ``sender``) to the operator with an id past ``cursor``, oldest first.

    ov's own notices of failed fires never trigger a schedule: a trigger on ``escalation``
    whose command fails would otherwise fire itself forever."""
    own = f"AND (dedup_key IS NULL OR dedup_key NOT LIKE '{NOTICE_KEY}%')"
    if sender:
        return conn.execute(f"SELECT id, sender, subject FROM mail WHERE recipient = 'operator' AND id > ? AND type = ? "
                            f"AND sender = ? {own} ORDER BY id LIMIT ?", (cursor, mail_type, sender, limit)).fetchall()
    return conn.execute(f"SELECT id, sender, subject FROM mail WHERE recipient = 'operator' AND id > ? AND type = ? "
                        f"{own} ORDER BY id LIMIT ?", (cursor, mail_type, limit)).fetchall()
