"""Rows of `ov loop`: the loop of one agent generation, its iterations and its checkpoints.

A loop agent works in iterations, each a fresh runtime session. ``loops`` holds where
the loop is (iteration count, phase, the last check, a critic it waits for);
``loop_iterations`` one row per attempt of an iteration (number, attempt, session,
spend, promise seen, check exit and duration, the progress file's summary line);
``loop_checkpoints`` the commit saved at each phase boundary.

An iteration row is ``running`` (its turn is under way), then ``checking`` (the turn
ended; ov runs the check), then ``done``; a turn that died leaves it ``interrupted`` and
the same number is tried again as the next attempt, so the count never resets.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t
from dataclasses import dataclass

from overstory.clock import now_ms
from overstory.store.db import write_transaction

OPEN_STATUSES = ("running", "checking")


@dataclass
class Loop:
    name: str
    generation: int
    definition: dict[str, t.Any]
    status: str
    iterations: int
    max_iterations: int | None
    phase_index: int
    phase_round: int
    phase_started: int           # the loop's iteration count when the current phase round began
    extra_phase_iterations: int  # granted by `ov resume --add-iterations` to the current phase
    extra_phase_usd: float       # granted by `ov resume --add-usd` to the current phase
    same_failures: int
    last_fingerprint: str | None
    last_check_exit: int | None
    last_check_tail: str | None
    critic_agent: str | None
    critic_since: int | None
    critic_notes: str | None
    created_at: int
    updated_at: int
    held_report: str | None = None  # JSON: the agent's own last worker_done, held while the loop ran

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Loop:
        values = dict(row)
        values["definition"] = json.loads(values["definition"])
        return cls(**values)

    @property
    def phases(self) -> list[dict[str, t.Any]]:
        return list(self.definition.get("phases") or [])

    @property
    def phase(self) -> dict[str, t.Any]:
        phases = self.phases
        return phases[min(self.phase_index, len(phases) - 1)]


def ensure(conn: sqlite3.Connection, name: str, generation: int, definition: t.Mapping[str, t.Any]) -> Loop:
    """The loop row of this agent generation, made from ``definition`` the first time."""
    now = now_ms()
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO loops(name, generation, definition, max_iterations, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (name, generation, json.dumps(dict(definition)), definition.get("max_iterations"), now, now))
    found = get(conn, name, generation)
    assert found is not None
    return found


def get(conn: sqlite3.Connection, name: str, generation: int | None = None) -> Loop | None:
    """The loop of ``name`` (of ``generation``, else of its newest generation)."""
    if generation is None:
        row = conn.execute("SELECT * FROM loops WHERE name = ? ORDER BY generation DESC LIMIT 1", (name,)).fetchone()
    else:
        row = conn.execute("SELECT * FROM loops WHERE name = ? AND generation = ?", (name, generation)).fetchone()
    return Loop.from_row(row) if row else None


def update(conn: sqlite3.Connection, name: str, generation: int, **fields: t.Any) -> None:
    """Write loop fields (inside the caller's transaction if one is open)."""
    fields["updated_at"] = now_ms()
    sets = ", ".join(f"{key} = :{key}" for key in fields)
    conn.execute(f"UPDATE loops SET {sets} WHERE name = :_n AND generation = :_g",
                 {**fields, "_n": name, "_g": generation})


def add_iterations(conn: sqlite3.Connection, name: str, generation: int, count: int) -> Loop | None:
    """Raise the loop's max_iterations (if it has one) and the current phase's by ``count``."""
    with write_transaction(conn):
        conn.execute("UPDATE loops SET max_iterations = max_iterations + ?, "
                     "extra_phase_iterations = extra_phase_iterations + ?, updated_at = ? "
                     "WHERE name = ? AND generation = ?", (count, count, now_ms(), name, generation))
    return get(conn, name, generation)


def add_phase_usd(conn: sqlite3.Connection, name: str, generation: int, usd: float) -> None:
    conn.execute("UPDATE loops SET extra_phase_usd = extra_phase_usd + ?, updated_at = ? WHERE name = ? "
                 "AND generation = ?", (usd, now_ms(), name, generation))


# ---- iterations -------------------------------------------------------------------------


def iterations(conn: sqlite3.Connection, name: str, generation: int) -> list[dict[str, t.Any]]:
    rows = conn.execute("SELECT * FROM loop_iterations WHERE name = ? AND generation = ? ORDER BY number, attempt",
                        (name, generation)).fetchall()
    return [dict(row) for row in rows]


def open_iteration(conn: sqlite3.Connection, name: str, generation: int) -> dict[str, t.Any] | None:
    """The attempt still ``running`` or ``checking`` (a loop that died left it so), if any."""
    marks = ",".join("?" * len(OPEN_STATUSES))
    row = conn.execute(f"SELECT * FROM loop_iterations WHERE name = ? AND generation = ? AND status IN ({marks}) "
                       "ORDER BY number DESC, attempt DESC LIMIT 1", (name, generation, *OPEN_STATUSES)).fetchone()
    return dict(row) if row else None


def begin_iteration(conn: sqlite3.Connection, loop: Loop, number: int, attempt: int, *, phase: str | None,
                    turn_id: str) -> None:
    """Record an attempt of iteration ``number`` as started, and count it, in one transaction."""
    now = now_ms()
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO loop_iterations(name, generation, number, attempt, phase, phase_round, status, turn_id, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?)",
            (loop.name, loop.generation, number, attempt, phase, loop.phase_round, turn_id, now))
        conn.execute("UPDATE loops SET iterations = max(iterations, ?), updated_at = ? WHERE name = ? "
                     "AND generation = ?", (number, now, loop.name, loop.generation))


def last_attempt(conn: sqlite3.Connection, name: str, generation: int) -> dict[str, t.Any] | None:
    row = conn.execute("SELECT * FROM loop_iterations WHERE name = ? AND generation = ? "
                       "ORDER BY number DESC, attempt DESC LIMIT 1", (name, generation)).fetchone()
    return dict(row) if row else None


def _where(row: t.Mapping[str, t.Any]) -> tuple[t.Any, ...]:
    return (row["name"], row["generation"], row["number"], row["attempt"])


_KEY = "name = ? AND generation = ? AND number = ? AND attempt = ?"


def mark_checking(conn: sqlite3.Connection, row: t.Mapping[str, t.Any], *, session_id: str | None,
                  cost_usd: float, promise_seen: bool) -> None:
    """The iteration's turn ended cleanly: what it cost and said; ov runs the check next."""
    conn.execute(f"UPDATE loop_iterations SET status = 'checking', session_id = COALESCE(?, session_id), "
                 f"cost_usd = ?, promise_seen = ? WHERE {_KEY}",
                 (session_id, cost_usd, int(promise_seen), *_where(row)))


def interrupt(conn: sqlite3.Connection, row: t.Mapping[str, t.Any], outcome: str, *, session_id: str | None = None,
              cost_usd: float | None = None) -> None:
    """The attempt's turn did not finish: the same number is tried again."""
    conn.execute(f"UPDATE loop_iterations SET status = 'interrupted', outcome = ?, ended_at = ?, "
                 f"session_id = COALESCE(?, session_id), cost_usd = COALESCE(?, cost_usd) WHERE {_KEY} "
                 "AND status IN ('running', 'checking')",
                 (outcome[:300], now_ms(), session_id, cost_usd, *_where(row)))


def finish_iteration(conn: sqlite3.Connection, row: t.Mapping[str, t.Any], *, check_exit: int | None,
                     check_seconds: float | None, check_tail: str | None, fingerprint: str | None,
                     progress: str | None, outcome: str, check_log: str | None = None,
                     check_env: t.Mapping[str, t.Any] | None = None) -> None:
    """The attempt is judged (inside the caller's transaction, with the loop's own update)."""
    conn.execute(f"UPDATE loop_iterations SET status = 'done', check_exit = ?, check_seconds = ?, check_tail = ?, "
                 f"fingerprint = ?, progress = ?, outcome = ?, ended_at = ?, check_log = ?, check_env = ? "
                 f"WHERE {_KEY} AND status = 'checking'",
                 (check_exit, check_seconds, check_tail, fingerprint, progress, outcome[:300], now_ms(), check_log,
                  json.dumps(dict(check_env)) if check_env is not None else None, *_where(row)))


def phase_usage(conn: sqlite3.Connection, loop: Loop) -> tuple[int, float]:
    """(iterations, dollars) spent in the current phase round."""
    row = conn.execute("SELECT count(DISTINCT number), COALESCE(sum(cost_usd), 0) FROM loop_iterations "
                       "WHERE name = ? AND generation = ? AND number > ?",
                       (loop.name, loop.generation, loop.phase_started)).fetchone()
    return int(row[0]), float(row[1])


# ---- checkpoints ------------------------------------------------------------------------


def add_checkpoint(conn: sqlite3.Connection, loop: Loop, *, phase: str, commit_sha: str, ref: str,
                   progress: str | None) -> int:
    now = now_ms()
    with write_transaction(conn):
        row = conn.execute("SELECT COALESCE(max(seq), 0) + 1 FROM loop_checkpoints WHERE name = ? AND generation = ?",
                           (loop.name, loop.generation)).fetchone()
        seq = int(row[0])
        conn.execute("INSERT INTO loop_checkpoints(name, generation, seq, phase, phase_round, commit_sha, ref, "
                     "progress, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (loop.name, loop.generation, seq, phase, loop.phase_round, commit_sha, ref, progress, now))
    return seq


def set_verdict(conn: sqlite3.Connection, loop: Loop, verdict: str) -> None:
    """The critic's verdict on the newest checkpoint."""
    conn.execute("UPDATE loop_checkpoints SET verdict = ? WHERE name = ? AND generation = ? AND seq = "
                 "(SELECT max(seq) FROM loop_checkpoints WHERE name = ? AND generation = ?)",
                 (verdict, loop.name, loop.generation, loop.name, loop.generation))


def checkpoints(conn: sqlite3.Connection, name: str, generation: int) -> list[dict[str, t.Any]]:
    rows = conn.execute("SELECT * FROM loop_checkpoints WHERE name = ? AND generation = ? ORDER BY seq",
                        (name, generation)).fetchall()
    return [dict(row) for row in rows]


def names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT name FROM loops ORDER BY name")]
