"""Approval gates in state.db (ARCHITECTURE §13): one row per tool call that needs a person.

Stdlib only: `ov guard` calls ``gate`` on every call that matches an approval rule.

A row is ``pending`` until someone decides (``approved``/``rejected``) or the watchdog
settles it at its deadline (``expired``; with ``on_timeout: escalate`` it first moves to
the next decider up the hierarchy and stays pending). An approved row allows the one
call whose key it carries, once: ``used_at`` is set when that call runs.

Every decision is one transaction: the row's status changes by compare-and-swap
(``WHERE status = 'pending'``), the agent's mail and the notification's outbox row are
inserted, and an agent parked for the gate is un-parked through ``sessions.transition``.
If the process dies halfway nothing of it happened, and deciding again works.
"""

from __future__ import annotations

import os

from overstory import jsontext as json
from overstory.clock import iso, now_ms
from overstory.errors import ApprovalError
from overstory.store import outbox
from overstory.store.db import write_transaction

TYPE_CHECKING = False  # typing costs milliseconds on the hook path (`ov guard`) and `ov status --json`
if TYPE_CHECKING:
    import sqlite3
    import typing as t

STATUSES = ("pending", "approved", "rejected", "expired")
DECIDED = ("approved", "rejected", "expired")
AGENT_ENDED = "the agent ended"  # the note of a gate dropped because its agent ended


class _Retry(Exception):
    """Rolls back a decision whose picture of the agent changed inside the transaction."""


class Rule:
    """One approval rule as the guard gets it (from the turn's environment)."""

    __slots__ = ("match", "reason", "timeout")

    def __init__(self, match: str, reason: str | None = None, timeout: float | None = None) -> None:
        self.match, self.reason, self.timeout = match, reason, timeout


def new_id() -> str:
    return "apr-" + os.urandom(5).hex()


def get(conn: sqlite3.Connection, approval_id: str) -> dict[str, t.Any] | None:
    row = conn.execute("SELECT * FROM approvals WHERE id = ?", (approval_id,)).fetchone()
    return dict(row) if row else None


def list_approvals(conn: sqlite3.Connection, *, include_decided: bool = False,
                   decider: str | None = None) -> list[dict[str, t.Any]]:
    where, params = [], []
    if not include_decided:
        where.append("status = 'pending'")
    if decider is not None:
        where.append("decider = ?")
        params.append(decider)
    sql = "SELECT * FROM approvals" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY requested_at"
    return [dict(r) for r in conn.execute(sql, params).fetchall()]


def pending_for(conn: sqlite3.Connection, agent: str, generation: int) -> list[str]:
    rows = conn.execute("SELECT id FROM approvals WHERE agent = ? AND generation = ? AND status = 'pending' "
                        "ORDER BY requested_at", (agent, generation)).fetchall()
    return [r[0] for r in rows]


def requested_in(conn: sqlite3.Connection, agent: str, generation: int, turn_id: str) -> list[str]:
    """The gates a turn of the agent asked for (whatever became of them since)."""
    rows = conn.execute("SELECT id FROM approvals WHERE agent = ? AND generation = ? AND turn_id = ? "
                        "ORDER BY requested_at", (agent, generation, turn_id)).fetchall()
    return [r[0] for r in rows]


def describe_call(tool: str, normalized_input: str) -> str:
    """``git push origin main`` for a shell call, ``Write(src/x.py)`` otherwise: what a person reads."""
    try:
        data = json.loads(normalized_input)
    except ValueError:
        data = None
    if isinstance(data, dict):
        if isinstance(data.get("command"), str):
            return data["command"] if tool == "Bash" else f"{tool}({data['command']})"
        for key in ("file_path", "path", "url"):
            if isinstance(data.get(key), str):
                return f"{tool}({data[key]})"
    return f"{tool}({normalized_input[:200]})"


# --------------------------------------------------------------------------- the guard's side


def gate(conn: sqlite3.Connection, *, agent: str, generation: int, parent: str, task_id: str, turn_id: str | None,
         tool: str, input: str, key: str, rule: Rule, decider: str, timeout_s: float,
         on_timeout: str) -> tuple[str, str]:
    """One matching call: ``("allow", id)`` when an unused approval of this call exists (it is used
    up now), ``("pending", id)`` when one is already waiting, else ``("new", id)``: the pending
    row, the decider's ``decision_gate`` mail and the notification are written in one transaction.
    """
    with write_transaction(conn):
        return gate_in_tx(conn, agent=agent, generation=generation, parent=parent, task_id=task_id, turn_id=turn_id,
                          tool=tool, input=input, key=key, rule=rule, decider=decider, timeout_s=timeout_s,
                          on_timeout=on_timeout)


def gate_in_tx(conn: sqlite3.Connection, *, agent: str, generation: int, parent: str, task_id: str,
               turn_id: str | None, tool: str, input: str, key: str, rule: Rule, decider: str, timeout_s: float,
               on_timeout: str) -> tuple[str, str]:
    """``gate`` inside a write transaction the caller holds (the ledger's replay check)."""
    now = now_ms()
    row = conn.execute("SELECT id FROM approvals WHERE key = ? AND agent = ? AND status = 'approved' "
                       "AND used_at IS NULL ORDER BY decided_at LIMIT 1", (key, agent)).fetchone()
    if row is not None:
        conn.execute("UPDATE approvals SET used_at = ? WHERE id = ?", (now, row[0]))
        return "allow", row[0]
    row = conn.execute("SELECT id FROM approvals WHERE key = ? AND agent = ? AND generation = ? "
                       "AND status = 'pending' LIMIT 1", (key, agent, generation)).fetchone()
    if row is not None:
        return "pending", row[0]
    approval_id = new_id()
    deadline = now + int(timeout_s * 1000)
    call = describe_call(tool, input)
    conn.execute(
        "INSERT INTO approvals (id, agent, generation, turn_id, task_id, tool, input, key, rule, reason, decider, "
        "on_timeout, timeout_s, requested_at, deadline) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (approval_id, agent, generation, turn_id, task_id, tool, input, key, rule.match, rule.reason, decider,
         on_timeout, timeout_s, now, deadline))
    mail_id = _gate_mail(conn, approval_id, agent=agent, task_id=task_id, call=call, reason=rule.reason,
                         decider=decider, deadline=deadline)
    conn.execute("UPDATE approvals SET mail_id = ? WHERE id = ?", (mail_id, approval_id))
    outbox.enqueue(conn, f"approval_requested:{approval_id}:0", "approval_requested", agent,
                   f"ov: {agent} asks to run: {call}"[:200],
                   _notify_body(approval_id, agent, call, rule.reason, deadline))
    return "new", approval_id


def _gate_mail(conn: sqlite3.Connection, approval_id: str, *, agent: str, task_id: str, call: str,
               reason: str | None, decider: str, deadline: int, escalation: int = 0) -> int | None:
    from overstory.store import mail

    return mail.insert_message(
        conn, sender=agent, recipient=decider, type="decision_gate", priority="high",
        subject=f"approve? {agent} wants to run: {call}"[:200],
        body=(f"Agent {agent} (task {task_id}) wants to run `{call}`, which needs approval"
              f"{': ' + reason if reason else ''}.\n"
              f"Approve: ov approve {approval_id} [--note TEXT]\n"
              f"Reject:  ov reject {approval_id} --reason TEXT\n"
              f"Undecided by {iso(deadline)} it is settled by config approvals.on_timeout."),
        payload={"options": ["approve", "reject"], "task_id": task_id, "agent": agent, "approval_id": approval_id},
        dedup_key=f"decision_gate:{approval_id}:{escalation}")


def _notify_body(approval_id: str, agent: str, call: str, reason: str | None, deadline: int) -> str:
    return (f"{agent} wants to run `{call}`{' (' + reason + ')' if reason else ''}.\n"
            f"Approve: ov approve {approval_id}\nReject: ov reject {approval_id} --reason TEXT\n"
            f"Decide by {iso(deadline)}.")


# --------------------------------------------------------------------------- deciding


def settle(conn: sqlite3.Connection, approval_id: str, status: str, *, by: str, note: str | None,
           agent_subject: str, agent_body: str, expired_is_error: bool = True) -> dict[str, t.Any]:
    """Move a pending gate to ``status``, mail its agent, and un-park the agent when nothing else holds it.

    Raises ApprovalError when the gate is unknown, decided already, or past its deadline
    (``expired_is_error``: a person deciding late; the watchdog passes False).
    """
    from overstory.store import sessions

    for _ in range(20):
        row = get(conn, approval_id)
        _check_pending(row, approval_id, expired_is_error)
        assert row is not None
        agent = sessions.get(conn, row["agent"])
        now = now_ms()

        def write(tx: sqlite3.Connection, row: dict[str, t.Any] = row, now: int = now) -> None:
            updated = tx.execute("UPDATE approvals SET status = ?, decided_at = ?, decided_by = ?, note = ? "
                                 "WHERE id = ? AND status = 'pending'",
                                 (status, now, by, note, approval_id)).rowcount
            if updated != 1:
                fresh = get(tx, approval_id)
                raise ApprovalError(_decided_text(fresh, approval_id))
            from overstory.store import mail

            mail.insert_message(tx, sender=by if by != "watchdog" else "operator", recipient=row["agent"],
                                type="status", priority="high", subject=agent_subject[:200], body=agent_body,
                                payload={"kind": f"approval_{status}", "approval_id": approval_id},
                                dedup_key=f"approval:{approval_id}:{status}")
            outbox.enqueue(tx, f"approval_{status}:{approval_id}", f"approval_{status}", row["agent"],
                           f"ov: {approval_id} {status} ({describe_call(row['tool'], row['input'])})"[:200],
                           f"{row['agent']}'s request {approval_id} was {status} by {by}" +
                           (f": {note}" if note else "."))

        holds = agent is not None and agent.generation == row["generation"] and agent.state == "parked" \
            and agent.park_kind == "approval"
        others = [i for i in pending_for(conn, row["agent"], row["generation"]) if i != approval_id]
        try:
            if holds and not others:
                assert agent is not None

                def then(tx: sqlite3.Connection, ok: sessions.Ok, agent: t.Any = agent) -> None:
                    if ok.version != agent.version + 1:
                        raise _Retry()
                    write(tx)

                outcome = sessions.transition(
                    conn, agent.name, agent.generation, "working" if agent.mode == "tmux" else "between_turns",
                    actor=by, reason=f"approval {approval_id} {status}", expect={"parked"},
                    fields={"park_kind": None, "park_until": None}, then=then)
                if not outcome.ok:
                    continue
            else:
                with write_transaction(conn):
                    fresh = conn.execute("SELECT state, park_kind, generation FROM sessions WHERE name = ?",
                                         (row["agent"],)).fetchone()
                    now_holds = fresh is not None and fresh["generation"] == row["generation"] and \
                        fresh["state"] == "parked" and fresh["park_kind"] == "approval"
                    if now_holds != holds:
                        raise _Retry()  # parked (or un-parked) since we looked: decide the other way
                    write(conn)
        except _Retry:
            continue
        return get(conn, approval_id) or row
    raise ApprovalError(f"{approval_id}: the agent kept changing state; try again")


def _check_pending(row: dict[str, t.Any] | None, approval_id: str, expired_is_error: bool) -> None:
    if row is None:
        raise ApprovalError(f"no approval {approval_id}; `ov approvals --all` lists them")
    if row["status"] != "pending":
        raise ApprovalError(_decided_text(row, approval_id))
    if expired_is_error and row["deadline"] <= now_ms():
        raise ApprovalError(f"{approval_id} expired at {iso(row['deadline'])}; the watchdog settles it "
                            f"({row['on_timeout']}). The agent can ask again.")


def _decided_text(row: dict[str, t.Any] | None, approval_id: str) -> str:
    if row is None:
        return f"no approval {approval_id}"
    if row["status"] == "expired" and row["note"] == AGENT_ENDED:
        return f"{approval_id} was dropped at {iso(row['decided_at'])}: {row['agent']} had ended; it can no longer " \
               "be decided"
    if row["status"] == "expired":
        return f"{approval_id} expired at {iso(row['decided_at'] or row['deadline'])}; it can no longer be decided"
    return f"{approval_id} was already {row['status']} by {row['decided_by']} at {iso(row['decided_at'])}"


def escalate(conn: sqlite3.Connection, approval_id: str, new_decider: str) -> bool:
    """Hand an undecided gate past its deadline to ``new_decider``, with a fresh deadline; once per deadline.

    The compare-and-swap on (status, deadline) lets exactly one of two racing watchdogs do it.
    """
    row = get(conn, approval_id)
    if row is None or row["status"] != "pending":
        return False
    now = now_ms()
    deadline = now + int(row["timeout_s"] * 1000)
    with write_transaction(conn):
        updated = conn.execute("UPDATE approvals SET decider = ?, deadline = ?, escalations = escalations + 1 "
                               "WHERE id = ? AND status = 'pending' AND deadline = ?",
                               (new_decider, deadline, approval_id, row["deadline"])).rowcount
        if updated != 1:
            return False
        call = describe_call(row["tool"], row["input"])
        _gate_mail(conn, approval_id, agent=row["agent"], task_id=row["task_id"] or "", call=call,
                   reason=(row["reason"] or "") + f" (escalated: {row['decider']} did not decide in time)",
                   decider=new_decider, deadline=deadline, escalation=row["escalations"] + 1)
        outbox.enqueue(conn, f"approval_requested:{approval_id}:{row['escalations'] + 1}", "approval_requested",
                       row["agent"], f"ov: {row['agent']} asks to run: {call} (escalated)"[:200],
                       _notify_body(approval_id, row["agent"], call, row["reason"], deadline))
    return True


def due(conn: sqlite3.Connection, now: int) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM approvals WHERE status = 'pending' AND deadline <= ? "
                                          "ORDER BY deadline", (now,)).fetchall()]


def orphaned(conn: sqlite3.Connection) -> list[dict[str, t.Any]]:
    """Pending gates whose agent (that generation) is gone or terminal."""
    return [dict(r) for r in conn.execute(
        "SELECT a.* FROM approvals a LEFT JOIN sessions s ON s.name = a.agent WHERE a.status = 'pending' "
        "AND (s.name IS NULL OR s.generation != a.generation OR s.state IN ('completed', 'zombie'))").fetchall()]


def latest_by_key(conn: sqlite3.Connection, key: str) -> dict[str, t.Any] | None:
    """The newest request with that key (e.g. ``spend:NAME:GEN``)."""
    row = conn.execute("SELECT * FROM approvals WHERE key = ? ORDER BY requested_at DESC, rowid DESC LIMIT 1",
                       (key,)).fetchone()
    return dict(row) if row else None


def mark_used(conn: sqlite3.Connection, approval_id: str) -> None:
    """A decided request has been acted on (a rejection parks the agent once, not at every turn)."""
    conn.execute("UPDATE approvals SET used_at = ? WHERE id = ?", (now_ms(), approval_id))


def status_of(conn: sqlite3.Connection, approval_id: str) -> str:
    return str(conn.execute("SELECT status FROM approvals WHERE id = ?", (approval_id,)).fetchone()[0])


def first_pending_of(conn: sqlite3.Connection, agent: str) -> str | None:
    row = conn.execute("SELECT id FROM approvals WHERE agent = ? AND status = 'pending' ORDER BY id LIMIT 1",
                       (agent,)).fetchone()
    return row[0] if row is not None else None


def pending_ids(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(id, agent) of every request still waiting (shell completion)."""
    return conn.execute("SELECT id, agent FROM approvals WHERE status = 'pending' ORDER BY id").fetchall()


def agents_waiting(conn: sqlite3.Connection) -> set[str]:
    """The agents with an approval request still pending (the dashboard's approval card stands for their park)."""
    return {r[0] for r in conn.execute("SELECT DISTINCT agent FROM approvals WHERE status = 'pending'")}
