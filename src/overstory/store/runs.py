"""Runs: the batch of agents started under one coordinator session.

`ov coordinator start` opens a run; every agent slung while it is open joins it
(``sessions.run_id``, set by `ov sling`). At most one run is open at a time. A run
ends with `ov coordinator stop` (when nothing in it is still active) or
`ov run complete`.

The run summary: once every non-persistent agent of an open run is terminal, the
run's coordinator gets one ``status`` mail with each agent's outcome. It is sent in
*waves*: when the coordinator slings new agents after a summary, a new summary
follows once those are terminal too, but the same set of outcomes is never
reported twice. ``maybe_send_summary`` checks and sends inside one ``BEGIN
IMMEDIATE`` transaction. ``runs.summary_sent_at`` records when the last summary went
out: nothing is sent again unless some agent became terminal since then. A wave is
also named by the run's agent count and its newest agent's ``created_at``, which
form the mail's unique ``dedup_key``. Any number of concurrent callers therefore
send at most one summary per wave.

Stdlib only: the coordinator's agent loop calls ``maybe_send_summary`` while idle.
"""

from __future__ import annotations

import dataclasses
import time
import typing as t
from dataclasses import dataclass

from overstory import jsontext
from overstory.clock import iso, now_ms
from overstory.errors import RunNotFound, RunStillActive
from overstory.store.db import write_transaction
from overstory.store.sqlite_module import sqlite3

SUMMARY_SENDER = "ov"
TERMINAL = ("completed", "zombie")
# Mail types that carry an agent's final word, shown next to its outcome in the summary.
REPORT_TYPES = ("worker_done", "merged", "merge_failed", "worker_died", "result")


@dataclass(frozen=True)
class Run:
    """One row of ``runs``."""

    id: str
    coordinator: str | None
    status: str
    started_at: int
    completed_at: int | None
    summary_sent_at: int | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Run:
        return cls(id=row["id"], coordinator=row["coordinator"], status=row["status"], started_at=row["started_at"],
                   completed_at=row["completed_at"], summary_sent_at=row["summary_sent_at"])

    @property
    def is_open(self) -> bool:
        return self.status == "open"

    def as_dict(self) -> dict[str, t.Any]:
        return {"id": self.id, "coordinator": self.coordinator, "status": self.status,
                "started_at": iso(self.started_at), "completed_at": iso(self.completed_at),
                "summary_sent_at": iso(self.summary_sent_at)}


def new_run_id(now: int | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime((now if now is not None else now_ms()) / 1000))
    import secrets  # here: random, hmac, hashlib and base64 are not an idle agent loop's

    return f"run-{stamp}-{secrets.token_hex(2)}"


def get_run(conn: sqlite3.Connection, run_id: str) -> Run | None:
    row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    return Run.from_row(row) if row else None


def open_run(conn: sqlite3.Connection) -> Run | None:
    """The open run, if any (the newest one should there ever be several)."""
    row = conn.execute("SELECT * FROM runs WHERE status = 'open' ORDER BY started_at DESC LIMIT 1").fetchone()
    return Run.from_row(row) if row else None


def open_or_join(conn: sqlite3.Connection, coordinator: str) -> tuple[Run, bool]:
    """Open a new run for ``coordinator``, or join the run that is already open.

    Returns ``(run, created)``. One transaction, so two starts at once never open
    two runs.
    """
    with write_transaction(conn):
        existing = conn.execute(
            "SELECT * FROM runs WHERE status = 'open' ORDER BY started_at DESC LIMIT 1").fetchone()
        if existing is not None:
            conn.execute("UPDATE runs SET coordinator = ? WHERE id = ?", (coordinator, existing["id"]))
            return dataclasses.replace(Run.from_row(existing), coordinator=coordinator), False
        now = now_ms()
        run_id = new_run_id(now)
        conn.execute("INSERT INTO runs(id, coordinator, status, started_at) VALUES (?, ?, 'open', ?)",
                     (run_id, coordinator, now))
        row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return Run.from_row(row), True


def discard_if_unused(conn: sqlite3.Connection, run_id: str) -> bool:
    """Undo ``open_or_join`` for a start that failed: delete the run if no agent joined it."""
    cursor = conn.execute(
        "DELETE FROM runs WHERE id = ? AND NOT EXISTS (SELECT 1 FROM sessions WHERE run_id = ?)", (run_id, run_id))
    return cursor.rowcount == 1


def resolve(conn: sqlite3.Connection, ref: str | None) -> Run:
    """A run by id or unique id prefix; with no ``ref``, the open run, else the newest one."""
    if ref is None:
        run = open_run(conn)
        if run is not None:
            return run
        row = conn.execute("SELECT * FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
        if row is None:
            raise RunNotFound("there are no runs yet; `ov coordinator start` opens one")
        return Run.from_row(row)
    exact = get_run(conn, ref)
    if exact is not None:
        return exact
    rows = conn.execute("SELECT * FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY started_at DESC",
                        (ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",)).fetchall()
    if len(rows) == 1:
        return Run.from_row(rows[0])
    if rows:
        raise RunNotFound(f"{ref!r} matches {len(rows)} runs ({', '.join(r['id'] for r in rows[:5])}); give more of the id")
    raise RunNotFound(f"no run {ref!r}; `ov run list` shows them")


def active_agents(conn: sqlite3.Connection, run_id: str) -> list[str]:
    rows = conn.execute(
        f"SELECT name FROM sessions WHERE run_id = ? AND state NOT IN ({','.join('?' * len(TERMINAL))}) "
        "ORDER BY depth DESC, created_at", (run_id, *TERMINAL)).fetchall()
    return [r["name"] for r in rows]


def complete(conn: sqlite3.Connection, run_id: str, *, force: bool = False) -> tuple[Run, bool]:
    """Mark the run completed; returns ``(run, changed)``. Refuses while agents in it are active, unless ``force``."""
    with write_transaction(conn):
        row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id!r}")
        if row["status"] != "open":
            return Run.from_row(row), False
        busy = active_agents(conn, run_id)
        if busy and not force:
            raise RunStillActive(
                f"run {run_id} still has {len(busy)} active agent(s): {', '.join(busy)}; stop them "
                "(`ov coordinator stop --all`, `ov stop NAME`) or pass --force to close the run anyway")
        conn.execute("UPDATE runs SET status = 'completed', completed_at = ? WHERE id = ? AND status = 'open'",
                     (now_ms(), run_id))
        return Run.from_row(conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()), True


# ---- reading --------------------------------------------------------------------


def list_runs(conn: sqlite3.Connection, *, limit: int | None = 50) -> list[dict[str, t.Any]]:
    """Newest first, each with its agent count, active count, turns and cost."""
    sql = (
        "SELECT r.*, "
        "(SELECT count(*) FROM sessions s WHERE s.run_id = r.id) AS agents, "
        f"(SELECT count(*) FROM sessions s WHERE s.run_id = r.id AND s.state NOT IN ({','.join('?' * len(TERMINAL))})) AS active, "
        "(SELECT coalesce(sum(s.cost_usd), 0) FROM sessions s WHERE s.run_id = r.id) AS cost_usd, "
        "(SELECT coalesce(sum(s.turns), 0) FROM sessions s WHERE s.run_id = r.id) AS turns "
        "FROM runs r ORDER BY r.started_at DESC" + (" LIMIT ?" if limit is not None else "")
    )
    params: tuple[t.Any, ...] = (*TERMINAL, limit) if limit is not None else TERMINAL
    out = []
    for row in conn.execute(sql, params).fetchall():
        entry = Run.from_row(row).as_dict()
        entry.update(agents=row["agents"], active=row["active"], turns=row["turns"],
                     cost_usd=round(row["cost_usd"], 6))
        out.append(entry)
    return out


def _ended_at(conn: sqlite3.Connection, name: str, generation: int) -> int | None:
    row = conn.execute(
        f"SELECT max(at) FROM transitions WHERE name = ? AND generation = ? AND to_state IN ({','.join('?' * len(TERMINAL))})",
        (name, generation, *TERMINAL)).fetchone()
    return row[0] if row and row[0] is not None else None


def _seconds(start: int | None, end: int | None) -> float | None:
    if start is None or end is None:
        return None
    return round(max(0, end - start) / 1000, 3)


def report(conn: sqlite3.Connection, run: Run, *, now: int | None = None) -> dict[str, t.Any]:
    """Everything `ov run show` prints: agents, turns, tokens, cost, durations, mail counts.

    Turns and mail are counted from their own tables (every turn row, failed ones
    too) over the run's lifetime, so the totals account for every turn and its cost.
    Agents whose name was later reused by another run appear only in the newer run.
    """
    now = now_ms() if now is None else now
    window_end = run.completed_at if run.completed_at is not None else now
    agent_rows = conn.execute("SELECT * FROM sessions WHERE run_id = ? ORDER BY depth, created_at, name",
                              (run.id,)).fetchall()
    names = [r["name"] for r in agent_rows]
    marks = ",".join("?" * len(names))
    turn_rows = conn.execute(
        f"SELECT * FROM turns WHERE agent IN ({marks}) AND started_at >= ? AND started_at <= ? ORDER BY started_at, id",
        (*names, run.started_at, window_end)).fetchall() if names else []
    mail_rows = conn.execute(
        f"SELECT sender, recipient, type FROM mail WHERE (sender IN ({marks}) OR recipient IN ({marks})) "
        "AND created_at >= ? AND created_at <= ?",
        (*names, *names, run.started_at, window_end)).fetchall() if names else []

    turns_by_agent: dict[str, list[sqlite3.Row]] = {}
    for row in turn_rows:
        turns_by_agent.setdefault(row["agent"], []).append(row)
    sent: dict[str, int] = {}
    received: dict[str, int] = {}
    by_type: dict[str, int] = {}
    for row in mail_rows:
        sent[row["sender"]] = sent.get(row["sender"], 0) + 1
        received[row["recipient"]] = received.get(row["recipient"], 0) + 1
        by_type[row["type"]] = by_type.get(row["type"], 0) + 1

    agents = []
    by_state: dict[str, int] = {}
    for row in agent_rows:
        name = row["name"]
        own_turns = turns_by_agent.get(name, [])
        ended = _ended_at(conn, name, row["generation"]) if row["state"] in TERMINAL else None
        by_state[row["state"]] = by_state.get(row["state"], 0) + 1
        agents.append({
            "name": name, "capability": row["capability"], "task_id": row["task_id"], "state": row["state"],
            "state_reason": row["state_reason"], "parent": row["parent"], "depth": row["depth"],
            "generation": row["generation"], "branch": row["branch"], "runtime": row["runtime"],
            "turns": len(own_turns), "turns_ok": sum(1 for r in own_turns if r["status"] == "ok"),
            "input_tokens": sum(r["input_tokens"] for r in own_turns),
            "output_tokens": sum(r["output_tokens"] for r in own_turns),
            "cost_usd": round(sum(r["cost_usd"] for r in own_turns), 6),
            "started_at": iso(row["created_at"]), "ended_at": iso(ended),
            "duration_seconds": _seconds(row["created_at"], ended if ended is not None else now),
            "mail_sent": sent.get(name, 0), "mail_received": received.get(name, 0),
        })
    from overstory.store import checkpoints, ledger

    calls = ledger.turn_summaries(conn, [r["id"] for r in turn_rows])
    turn_marks = checkpoints.by_turn(conn, [r["id"] for r in turn_rows])
    turns = [{
        "id": r["id"], "agent": r["agent"], "generation": r["generation"], "number": r["number"],
        "attempt": r["attempt"], "status": r["status"], "started_at": iso(r["started_at"]),
        "ended_at": iso(r["ended_at"]), "duration_seconds": _seconds(r["started_at"], r["ended_at"]),
        "input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"], "cost_usd": round(r["cost_usd"], 6),
        "tool_calls": r["tool_calls"], "error": r["error"], "session_id": r["session_id"], "resumed": bool(r["resumed"]),
        "dispatch": (turn_marks.get(r["id"]) or {}).get("scope"), "head": (turn_marks.get(r["id"]) or {}).get("head"),
        "ledger": calls.get(r["id"], {"calls": 0, "by_status": {}, "by_class": {}, "flagged": 0}),
    } for r in turn_rows]
    document = run.as_dict()
    document["duration_seconds"] = _seconds(run.started_at, window_end)
    return {
        "run": document,
        "agents": agents,
        "turns": turns,
        "mail": {"total": len(mail_rows), "by_type": dict(sorted(by_type.items()))},
        "summaries": [{k: v for k, v in entry.items() if k != "payload"} for entry in summaries(conn, run.id)],
        "totals": {
            "agents": len(agents),
            "active": sum(1 for a in agents if a["state"] not in TERMINAL),
            "by_state": dict(sorted(by_state.items())),
            "turns": len(turns),
            "turns_ok": sum(1 for r in turn_rows if r["status"] == "ok"),
            "input_tokens": sum(r["input_tokens"] for r in turn_rows),
            "output_tokens": sum(r["output_tokens"] for r in turn_rows),
            "cost_usd": round(sum(r["cost_usd"] for r in turn_rows), 6),
            "mail": len(mail_rows),
        },
    }


# ---- the run summary ----------------------------------------------------------------


def _persistent_capabilities() -> frozenset[str]:
    from overstory.store.lifecycle import PERSISTENT_CAPABILITIES

    return PERSISTENT_CAPABILITIES


def _last_report(conn: sqlite3.Connection, name: str, since: int) -> sqlite3.Row | None:
    marks = ",".join("?" * len(REPORT_TYPES))
    return conn.execute(
        f"SELECT type, subject FROM mail WHERE sender = ? AND type IN ({marks}) AND created_at >= ? "
        "ORDER BY id DESC LIMIT 1", (name, *REPORT_TYPES, since)).fetchone()


def summary_lines(conn: sqlite3.Connection, agents: t.Sequence[sqlite3.Row]) -> list[dict[str, t.Any]]:
    """Per agent: its outcome, why, its last report, turns and cost."""
    outcomes = []
    for row in agents:
        last = _last_report(conn, row["name"], row["created_at"])
        outcomes.append({
            "name": row["name"], "generation": row["generation"], "capability": row["capability"],
            "task_id": row["task_id"], "state": row["state"], "reason": row["state_reason"], "branch": row["branch"],
            "turns": row["turns"], "cost_usd": round(row["cost_usd"], 6),
            "last_report": f"[{last['type']}] {last['subject']}" if last else None,
        })
    return outcomes


def _summary_body(run_id: str, outcomes: list[dict[str, t.Any]], earlier: int) -> str:
    lines = [f"Every agent of run {run_id} has finished. Outcome per agent:", ""]
    for o in outcomes:
        line = f"- {o['name']} ({o['capability']}, task {o['task_id']}): {o['state']}"
        if o["state"] == "zombie" and o["reason"]:
            line += f" ({o['reason']})"
        line += f"; {o['turns']} turn(s), ${o['cost_usd']:.4f}"
        if o["branch"]:
            line += f"; branch {o['branch']}"
        lines.append(line)
        lines.append(f"    last report: {o['last_report'] or 'none'}")
    if earlier:
        lines += ["", f"({earlier} earlier agent(s) of this run were covered by a previous summary.)"]
    lines += ["", "Merge what is ready (`ov merge NAME`), replace what died, and report to the operator."]
    return "\n".join(lines)


def _summary_key_prefix(run_id: str) -> str:
    return f"run_summary:{run_id}:"


def _reported_agents(conn: sqlite3.Connection, run_id: str) -> set[tuple[str, int | None]]:
    """(name, generation) of every agent an earlier summary of this run covered."""
    prefix = _summary_key_prefix(run_id)
    rows = conn.execute("SELECT payload FROM mail WHERE substr(dedup_key, 1, ?) = ?", (len(prefix), prefix))
    covered: set[tuple[str, int | None]] = set()
    for row in rows.fetchall():
        for agent in (jsontext.loads(row["payload"]) if row["payload"] else {}).get("agents", []):
            covered.add((agent.get("name"), agent.get("generation")))
    return covered


def maybe_send_summary(conn: sqlite3.Connection, run_id: str, *, now: int | None = None) -> int | None:
    """Send the run's coordinator its summary if every non-persistent agent is terminal.

    Returns the new mail id, or None when there is nothing (new) to report: the run
    is not open, its coordinator is not active, an agent is still working, there are
    no agents, or this wave was already reported. Safe to call from any process, any
    number of times.
    """
    persistent = sorted(_persistent_capabilities())
    with write_transaction(conn):
        run_row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if run_row is None or run_row["status"] != "open" or not run_row["coordinator"]:
            return None
        coordinator = conn.execute("SELECT state FROM sessions WHERE name = ?", (run_row["coordinator"],)).fetchone()
        if coordinator is None or coordinator["state"] in TERMINAL:
            return None
        agents = conn.execute(
            f"SELECT * FROM sessions WHERE run_id = ? AND capability NOT IN ({','.join('?' * len(persistent))}) "
            "ORDER BY depth, created_at, name", (run_id, *persistent)).fetchall()
        if not agents or any(a["state"] not in TERMINAL for a in agents):
            return None
        newest = max(a["created_at"] for a in agents)
        last_end = max(_ended_at(conn, a["name"], a["generation"]) or a["updated_at"] for a in agents)
        previous = run_row["summary_sent_at"]
        if previous is not None and previous > last_end:
            return None  # nothing ended since the last summary: it covered all of this
        # The wave is named by how many agents the run has and when the newest joined.
        key = f"{_summary_key_prefix(run_id)}{len(agents)}:{newest}"
        if conn.execute("SELECT 1 FROM mail WHERE dedup_key = ?", (key,)).fetchone() is not None:
            return None
        reported = _reported_agents(conn, run_id)
        wave = [a for a in agents if (a["name"], a["generation"]) not in reported] or list(agents)
        outcomes = summary_lines(conn, wave)
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o["state"]] = counts.get(o["state"], 0) + 1
        tally = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        from overstory.store import mail

        mail_id = mail.insert_message(
            conn, sender=SUMMARY_SENDER, recipient=run_row["coordinator"], type="status", priority="normal",
            subject=f"run {run_id}: all {len(wave)} agent(s) finished ({tally})",
            body=_summary_body(run_id, outcomes, len(agents) - len(wave)),
            payload={"run_id": run_id, "kind": "run_summary", "agents": outcomes}, dedup_key=key,
        )
        if mail_id is None:
            return None
        stamp = max(now_ms() if now is None else now, last_end)
        conn.execute("UPDATE runs SET summary_sent_at = ? WHERE id = ?", (stamp, run_id))
    mail.record_sent(conn, [mail_id])
    return mail_id


def summaries(conn: sqlite3.Connection, run_id: str) -> list[dict[str, t.Any]]:
    """The summary mails of a run, oldest first."""
    prefix = _summary_key_prefix(run_id)
    rows = conn.execute("SELECT id, recipient, subject, payload, created_at FROM mail "
                        "WHERE substr(dedup_key, 1, ?) = ? ORDER BY id", (len(prefix), prefix)).fetchall()
    return [{"id": r["id"], "to": r["recipient"], "subject": r["subject"], "created_at": iso(r["created_at"]),
             "payload": jsontext.loads(r["payload"]) if r["payload"] else None} for r in rows]


def ids_and_statuses(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(id, status) of every run, newest first (shell completion)."""
    return conn.execute("SELECT id, status FROM runs ORDER BY started_at DESC").fetchall()


def ended(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """(id, status) of the runs no longer open."""
    return conn.execute("SELECT id, status FROM runs WHERE status != 'open'").fetchall()
