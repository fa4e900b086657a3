"""Rows of `ov schedule`: schedules, and one row per fire.

A schedule starts work by itself: at the times of a cron expression (``kind='cron'``),
for each mail of a type that reaches the operator (``kind='mail'``) or for each POST to
its address on `ov serve` (``kind='webhook'``; ``secret_hash`` is the SHA-256 of its
secret, which is never stored). Its ``cursor`` is the last due time (ms) or mail id it
has dealt with (a webhook's deliveries are not ordered: the occasion, one per delivery
id, is what makes them fire once).

A fire is claimed before anything runs: one transaction inserts the fire row, unique by
(schedule, occasion), and moves the cursor. Two watchdogs that see the same due time
race on that insert and only one wins; a watchdog that restarts finds the row and does
not fire again. A fire is ``claimed`` (by a process, recorded with its start ticks),
``running`` (its runner took it: from here on it is never started again), then ``ok``,
``failed``, or ``lost`` (its runner died while the command ran: whether the command
started work is unknown, so it is reported, not repeated).

An occasion can also be *held back* (``claim`` decides it in the same transaction, so
a crash never splits the decision from the claim): while the schedule backs off after
failed fires, or, with the overlap policy ``skip``, while its previous fire is still
running or an agent a fire started (``agent``, rendered from the schedule's template
when the fire is claimed) is still active or waits for an approval. A held-back occasion
moves the cursor and is counted in ``skipped`` with its reason; it is not a fire.
Failed (or lost) fires in a row are counted in ``failures``: each pushes
``backoff_until`` further out (doubling, capped), and only the first of a row mails a
person; a fire that succeeds ends the row.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t
from dataclasses import dataclass

from overstory.clock import iso, now_ms
from overstory.errors import ScheduleError
from overstory.store.db import write_transaction

CRON = "cron"
MAIL = "mail"
WEBHOOK = "webhook"
OVERLAP_POLICIES = ("skip", "allow")  # skip: no fire while the previous one's agent works (Kubernetes' Forbid)
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
    overlap: str = "skip"
    agent: str | None = None        # the agent its command starts, placeholders unfilled (None: not known)
    skipped: int = 0
    last_skip: str | None = None
    last_skip_at: int | None = None
    failures: int = 0               # failed or lost fires in a row
    backoff_until: int | None = None
    secret_hash: str | None = None  # a webhook's: the SHA-256 (hex) of its secret

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Schedule:
        values = dict(row)
        values["argv"] = json.loads(values["argv"])
        values["paused"] = bool(values["paused"])
        return cls(**values)

    def trigger(self) -> str:
        if self.kind == CRON:
            fields = (self.cron or "").split()
            if len(fields) == 6:  # croniter order: seconds last
                return f"cron {' '.join(fields[:5])} seconds {fields[5]}"
            return f"cron {self.cron}"
        if self.kind == WEBHOOK:
            return f"webhook POST /hooks/{self.name}"
        return f"mail {self.mail_type}" + (f" from {self.mail_from}" if self.mail_from else "")


def add(conn: sqlite3.Connection, name: str, *, kind: str, argv: t.Sequence[str], cursor: int,
        cron: str | None = None, mail_type: str | None = None, mail_from: str | None = None,
        overlap: str = "skip", agent: str | None = None, secret_hash: str | None = None) -> Schedule:
    if overlap not in OVERLAP_POLICIES:
        raise ScheduleError(f"unknown overlap policy {overlap!r}; choose {' or '.join(OVERLAP_POLICIES)}")
    now = now_ms()
    with write_transaction(conn):
        if conn.execute("SELECT 1 FROM schedules WHERE name = ?", (name,)).fetchone():
            raise ScheduleError(f"a schedule named {name!r} exists; `ov schedule remove {name}` first, or pick "
                                "another name")
        conn.execute("INSERT INTO schedules(name, kind, cron, mail_type, mail_from, argv, cursor, created_at, "
                     "updated_at, overlap, agent, secret_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (name, kind, cron, mail_type, mail_from, json.dumps(list(argv)), cursor, now, now, overlap,
                      agent, secret_hash))
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


@dataclass(frozen=True)
class Skip:
    """An occasion held back instead of fired (``claim`` with ``hold_at``): why."""

    reason: str


def claim(conn: sqlite3.Connection, schedule: Schedule, occasion: str, *, cursor: int,
          render: t.Callable[[int], list[str]], claimer_pid: int, claimer_ticks: int | None,
          due_at: int | None = None, mail_id: int | None = None, agent: t.Callable[[int], str | None] | None = None,
          hold_at: int | None = None, ordered: bool = True) -> dict[str, t.Any] | Skip | None:
    """Claim the fire of ``occasion`` for this process; None when it was already dealt with (by anyone).

    One transaction: the fire row (its number ``n`` is the schedule's next, ``render(n)``
    its command line and ``agent(n)`` the agent it starts) and the cursor. The unique
    (schedule, occasion) key decides races. With ``hold_at`` (the scheduler's "now") the
    schedule's back-off and overlap policy are asked first, in the same transaction: an
    occasion they hold back moves the cursor, is counted as skipped and comes back as a
    ``Skip``; an occasion at or before the cursor was already fired or skipped (None).
    ``ordered=False`` (a webhook's deliveries, which come in any order): the cursor is not
    asked, and an occasion fired before is None before anything else is asked.
    """
    now = now_ms()
    with write_transaction(conn):
        current = conn.execute("SELECT fired, paused, cursor FROM schedules WHERE id = ?", (schedule.id,)).fetchone()
        if current is None or current["paused"]:
            return None  # removed or paused since it was read
        if not ordered and conn.execute("SELECT 1 FROM schedule_fires WHERE schedule_id = ? AND occasion = ?",
                                        (schedule.id, occasion)).fetchone():
            return None  # this delivery fired before
        if hold_at is not None:
            if ordered and current["cursor"] >= cursor:
                return None  # another scheduler fired or skipped it first
            reason = holding_back(conn, schedule.id, hold_at)
            if reason is not None:
                conn.execute("UPDATE schedules SET cursor = max(cursor, ?), skipped = skipped + 1, last_skip = ?, "
                             "last_skip_at = ?, updated_at = ? WHERE id = ?", (cursor, reason, hold_at, now,
                                                                                schedule.id))
                return Skip(reason)
        n = int(current["fired"]) + 1
        row = conn.execute(
            "INSERT INTO schedule_fires(schedule_id, occasion, n, due_at, mail_id, argv, status, claimer_pid, "
            "claimer_ticks, claimed_at, agent) VALUES (?, ?, ?, ?, ?, ?, 'claimed', ?, ?, ?, ?) "
            "ON CONFLICT (schedule_id, occasion) DO NOTHING RETURNING id",
            (schedule.id, occasion, n, due_at, mail_id, json.dumps(render(n)), claimer_pid, claimer_ticks, now,
             agent(n) if agent is not None else None),
        ).fetchone()
        conn.execute("UPDATE schedules SET cursor = max(cursor, ?), fired = fired + ?, updated_at = ? WHERE id = ?",
                     (cursor, 1 if row else 0, now, schedule.id))
    return fire(conn, int(row[0])) if row else None


def holding_back(conn: sqlite3.Connection, schedule_id: int, now: int) -> str | None:
    """Why the schedule must not fire at ``now`` (its back-off, then its overlap policy), or None."""
    row = conn.execute("SELECT overlap, failures, backoff_until FROM schedules WHERE id = ?", (schedule_id,)).fetchone()
    if row is None:
        return None
    if row["backoff_until"] is not None and now < row["backoff_until"]:
        return (f"backing off after {row['failures']} failed fire(s) in a row; no fire before "
                f"{iso(row['backoff_until'])}")
    if row["overlap"] == "allow":
        return None
    marks = ",".join("?" * len(OPEN_FIRE_STATUSES))
    running = conn.execute(f"SELECT n FROM schedule_fires WHERE schedule_id = ? AND status IN ({marks}) "
                           "ORDER BY id LIMIT 1", (schedule_id, *OPEN_FIRE_STATUSES)).fetchone()
    if running is not None:
        return f"fire {running['n']} is still running its command"
    busy = conn.execute(
        "SELECT s.name, s.state, s.park_kind, (SELECT max(n) FROM schedule_fires f WHERE f.schedule_id = ? "
        "AND f.agent = s.name) AS n FROM sessions s WHERE s.state NOT IN ('completed', 'zombie') AND EXISTS "
        "(SELECT 1 FROM schedule_fires f WHERE f.schedule_id = ? AND f.agent = s.name) ORDER BY s.name LIMIT 1",
        (schedule_id, schedule_id)).fetchone()
    if busy is not None:
        state = busy["state"] + (f" ({busy['park_kind']})" if busy["park_kind"] else "")
        return f"{busy['name']} (fire {busy['n']}) is still {state}"
    waiting = conn.execute(
        "SELECT a.agent, a.id FROM approvals a WHERE a.status = 'pending' AND EXISTS (SELECT 1 FROM schedule_fires f "
        "WHERE f.schedule_id = ? AND f.agent = a.agent) ORDER BY a.requested_at LIMIT 1", (schedule_id,)).fetchone()
    if waiting is not None:
        return f"{waiting['agent']} still waits for a decision on approval {waiting['id']}"
    return None


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
           notice: t.Mapping[str, t.Any] | None = None, backoff: tuple[int, int] = (60_000, 3_600_000)) -> bool:
    """Settle an open fire, and its schedule's row of failures, in one transaction.

    ``ok`` ends a row of failures (and its back-off). ``failed`` or ``lost`` adds one:
    the schedule then fires no sooner than ``backoff`` = (first, cap) ms after this fire's
    due time, doubled for each further failure in the row, and ``notice`` (the fields of
    one mail) goes only with the first failure of a row: a person is told once, not per
    failure. A process killed before the commit leaves the fire open (the watchdog
    settles it later, with its own notice)."""
    from overstory.store import mail

    sent = None
    with write_transaction(conn):
        settled = conn.execute("UPDATE schedule_fires SET status = ?, exit_code = ?, output = ?, ended_at = ? "
                               "WHERE id = ? AND status IN ('claimed', 'running')",
                               (status, exit_code, output[-4000:], now_ms(), fire_id)).rowcount == 1
        if not settled:
            return False
        row = conn.execute("SELECT f.schedule_id, COALESCE(f.due_at, f.claimed_at) AS at, s.failures FROM "
                           "schedule_fires f JOIN schedules s ON s.id = f.schedule_id WHERE f.id = ?",
                           (fire_id,)).fetchone()
        if row is not None and status == "ok":
            conn.execute("UPDATE schedules SET failures = 0, backoff_until = NULL WHERE id = ?", (row["schedule_id"],))
        elif row is not None:
            failures = int(row["failures"]) + 1
            delay = min(backoff[1], backoff[0] * 2 ** min(failures - 1, 30))
            conn.execute("UPDATE schedules SET failures = ?, backoff_until = max(COALESCE(backoff_until, 0), ?) "
                         "WHERE id = ?", (failures, int(row["at"]) + delay, row["schedule_id"]))
        if notice is not None and (row is None or int(row["failures"]) == 0):
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
