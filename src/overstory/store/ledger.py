"""The tool-call ledger in state.db: one row per tool call of every agent (ARCHITECTURE §13).

Stdlib only: `ov guard` writes a row on every tool call. A row is ``started`` when the
PreToolUse hook lets the call through, then ``succeeded`` or ``failed`` when its receipt
comes (from the turn's stream, or a PostToolUse hook in tmux mode). ``denied`` is a call the
guard refused (or a replay it held back), ``skipped_duplicate`` a replay of a call that
already succeeded in an earlier attempt of the same dispatch. A ``started`` row whose
turn is over has no receipt: the crash hit mid-call, so the call may or may not have
happened.

Replay matching (``begin``): a call whose idempotency key (it includes the dispatch
scope) matches rows of *other* turns that succeeded or started is a replay. Matches are
consumed in order: the n-th identical call of a retried attempt answers to the n-th
earlier effect, so an agent that legitimately repeats a call in one attempt is not
blocked by its own first call. A ``started`` effect is dealt with once in all: held back
once (a warning the model can act on), or run again when that is safe; after that, the
same call runs.
"""

from __future__ import annotations

from overstory import jsontext
from overstory.clock import now_ms
from overstory.store.db import write_transaction

TYPE_CHECKING = False  # typing costs milliseconds on the hook path (`ov guard`, `ov mail send`)
if TYPE_CHECKING:
    import sqlite3
    import typing as t
    from collections.abc import Callable

STATUSES = ("started", "succeeded", "failed", "denied", "skipped_duplicate")
RECEIPT_LIMIT = 4096
_COLUMNS = ("id, run_id, agent, generation, turn_id, attempt, scope, dispatch, tool_use_id, tool, input, class, "
            "idem_key, status, reason, replay_of, flagged, exit_code, receipt, duration_ms, source, started_at, "
            "ended_at")


class Call:
    """What is known about a tool call when it is about to run.

    Plain classes here, not dataclasses: defining a dataclass costs milliseconds, and
    `ov guard` imports this module on every tool call.
    """

    __slots__ = (
        "agent",
        "attempt",
        "dispatch",
        "generation",
        "idem_key",
        "input",
        "klass",
        "run_id",
        "scope",
        "source",
        "tool",
        "tool_use_id",
        "turn_id",
    )

    def __init__(self, *, agent: str, generation: int, tool: str, input: str, klass: str, idem_key: str,
                 turn_id: str | None = None, attempt: int = 0, scope: str | None = None,
                 dispatch: tuple[int, ...] = (), run_id: str | None = None, tool_use_id: str | None = None,
                 source: str = "hook") -> None:
        self.agent, self.generation, self.tool, self.input = agent, generation, tool, input  # input: stable JSON
        self.klass, self.idem_key, self.turn_id, self.attempt = klass, idem_key, turn_id, attempt
        self.scope, self.dispatch, self.run_id, self.tool_use_id, self.source = (scope, dispatch, run_id,
                                                                                 tool_use_id, source)


class Prior:
    """An earlier attempt's row that a replayed call matched."""

    __slots__ = ("attempt", "exit_code", "id", "receipt", "started_at", "status", "turn_id")

    def __init__(self, row: sqlite3.Row) -> None:
        self.id, self.status, self.receipt, self.exit_code = row["id"], row["status"], row["receipt"], row["exit_code"]
        self.turn_id, self.attempt, self.started_at = row["turn_id"], row["attempt"], row["started_at"]


class Begun:
    """The row ``begin`` wrote: its id and status, why (for a denial), and the earlier row it replays."""

    __slots__ = ("flagged", "id", "prior", "reason", "status")

    def __init__(self, id: int, status: str, reason: str | None, flagged: bool, prior: Prior | None) -> None:
        self.id, self.status, self.reason, self.flagged, self.prior = id, status, reason, flagged, prior


def begin(conn: sqlite3.Connection, call: Call, *, denied_reason: str | None, check_replay: bool,
          explain: Callable[[Prior], tuple[str, str, bool]] | None = None,
          admit: Callable[[], str | None] | None = None) -> Begun:
    """Insert the row for a call about to run (or refused with ``denied_reason``).

    With ``check_replay``, an allowed call that replays an earlier attempt's effect is
    handed to ``explain(prior) -> (status, reason, flagged)``, whose
    answer is stored instead of ``started``. Only a call that is still ``started`` after
    that is handed to ``admit()`` (the approval gate), which returns the reason to deny it,
    or None. One ``BEGIN IMMEDIATE`` transaction, so two hooks racing on the same key see
    each other, and what ``explain``/``admit`` write commits with the row or not at all.
    """
    status, reason, flagged = ("denied", denied_reason, False) if denied_reason is not None \
        else ("started", None, False)
    prior: Prior | None = None
    now = now_ms()
    with write_transaction(conn):
        if denied_reason is None and check_replay and call.turn_id and call.scope:
            prior = _unconsumed_prior(conn, call)
            if prior is not None and explain is not None:
                status, reason, flagged = explain(prior)
        if status == "started" and admit is not None:
            refusal = admit()
            if refusal is not None:
                status, reason = "denied", refusal
        row_id = _insert(conn, call, status=status, reason=reason, flagged=flagged,
                         replay_of=prior.id if prior is not None else None, started_at=now,
                         ended_at=None if status == "started" else now)
    return Begun(row_id, status, reason, flagged, prior)


def _unconsumed_prior(conn: sqlite3.Connection, call: Call) -> Prior | None:
    rows = conn.execute(
        "SELECT id, status, receipt, exit_code, turn_id, attempt, started_at FROM tool_calls "
        "WHERE idem_key = ? AND status IN ('succeeded', 'started') AND (turn_id IS NULL OR turn_id != ?) "
        "ORDER BY id", (call.idem_key, call.turn_id)).fetchall()
    if not rows:
        return None
    used_here = {r[0] for r in conn.execute(
        "SELECT replay_of FROM tool_calls WHERE idem_key = ? AND turn_id = ? AND replay_of IS NOT NULL",
        (call.idem_key, call.turn_id))}
    # An uncertain (started) effect is dealt with once in all: warned about, or run again where that is safe.
    handled = {r[0] for r in conn.execute(
        "SELECT replay_of FROM tool_calls WHERE idem_key = ? AND replay_of IS NOT NULL "
        "AND (flagged = 1 OR status IN ('started', 'succeeded', 'failed'))", (call.idem_key,))}
    for row in rows:
        if row["id"] in used_here or (row["status"] == "started" and row["id"] in handled):
            continue
        return Prior(row)
    return None


def _insert(conn: sqlite3.Connection, call: Call, *, status: str, reason: str | None, flagged: bool,
            replay_of: int | None, started_at: int, ended_at: int | None, exit_code: int | None = None,
            receipt: str | None = None, duration_ms: int | None = None) -> int:
    cursor = conn.execute(
        "INSERT INTO tool_calls(run_id, agent, generation, turn_id, attempt, scope, dispatch, tool_use_id, tool, "
        "input, class, idem_key, status, reason, replay_of, flagged, exit_code, receipt, duration_ms, source, "
        "started_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (call.run_id, call.agent, call.generation, call.turn_id, call.attempt, call.scope,
         jsontext.dumps(list(call.dispatch)) if call.dispatch else None, call.tool_use_id, call.tool, call.input,
         call.klass, call.idem_key, status, reason, replay_of, int(flagged), exit_code, receipt, duration_ms,
         call.source, started_at, ended_at))
    return int(cursor.lastrowid or 0)


def finish(conn: sqlite3.Connection, *, agent: str, tool_use_id: str, ok: bool, exit_code: int | None,
           receipt: str | None, duration_ms: int | None) -> int | None:
    """Store the receipt of the newest ``started`` row of this call; its id, or None if there is none."""
    row = conn.execute(
        "UPDATE tool_calls SET status = ?, exit_code = ?, receipt = ?, duration_ms = ?, ended_at = ? "
        "WHERE id = (SELECT id FROM tool_calls WHERE agent = ? AND tool_use_id = ? AND status = 'started' "
        "ORDER BY id DESC LIMIT 1) RETURNING id",
        ("succeeded" if ok else "failed", exit_code, trim(receipt), duration_ms, now_ms(), agent,
         tool_use_id)).fetchone()
    return int(row[0]) if row else None


def finish_by_key(conn: sqlite3.Connection, *, agent: str, turn_id: str | None, attempt: int, idem_key: str,
                  ok: bool, exit_code: int | None, receipt: str | None, duration_ms: int | None) -> int | None:
    """Store the receipt of the oldest ``started`` row of this turn's attempt with this call's key: for a
    runtime whose hook and stream give the same call different ids. Identical calls in one turn get their
    receipts in the order they started. Its id, or None if there is none."""
    row = conn.execute(
        "UPDATE tool_calls SET status = ?, exit_code = ?, receipt = ?, duration_ms = ?, ended_at = ? "
        "WHERE id = (SELECT id FROM tool_calls WHERE agent = ? AND turn_id IS ? AND attempt = ? AND idem_key = ? "
        "AND status = 'started' ORDER BY id LIMIT 1) RETURNING id",
        ("succeeded" if ok else "failed", exit_code, trim(receipt), duration_ms, now_ms(), agent, turn_id, attempt,
         idem_key)).fetchone()
    return int(row[0]) if row else None


def row_of(conn: sqlite3.Connection, *, agent: str, tool_use_id: str) -> int | None:
    """The newest row of this call, whatever its status; None if it has none."""
    row = conn.execute("SELECT id FROM tool_calls WHERE agent = ? AND tool_use_id = ? ORDER BY id DESC LIMIT 1",
                       (agent, tool_use_id)).fetchone()
    return int(row[0]) if row else None


def record_finished(conn: sqlite3.Connection, call: Call, *, ok: bool, exit_code: int | None, receipt: str | None,
                    duration_ms: int | None) -> int:
    """A whole call at once: its receipt came without a row to attach it to (the pre hook's write was lost)."""
    now = now_ms()
    return _insert(conn, call, status="succeeded" if ok else "failed", reason=None, flagged=False, replay_of=None,
                   started_at=now - (duration_ms or 0), ended_at=now, exit_code=exit_code, receipt=trim(receipt),
                   duration_ms=duration_ms)


def trim(text: str | None, limit: int = RECEIPT_LIMIT) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 40] + f"\n… ({len(text) - limit + 40} more characters)"


# --------------------------------------------------------------------------- reading


def calls(conn: sqlite3.Connection, *, agent: str | None = None, turn_ids: t.Sequence[str] | None = None,
          flagged: bool = False, limit: int = 2000) -> list[dict[str, t.Any]]:
    """Ledger rows (oldest first), by agent and/or turns; ``flagged`` keeps the ones the operator must see."""
    clauses, params = [], []  # type: ignore[var-annotated]
    if agent is not None:
        clauses.append("agent = ?")
        params.append(agent)
    if turn_ids is not None:
        if not turn_ids:
            return []
        clauses.append(f"turn_id IN ({','.join('?' * len(turn_ids))})")
        params.extend(turn_ids)
    if flagged:
        clauses.append("flagged = 1")
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM tool_calls {where} ORDER BY id DESC LIMIT ?",
                        (*params, limit)).fetchall()
    return [_as_dict(r) for r in reversed(rows)]


def _as_dict(row: sqlite3.Row) -> dict[str, t.Any]:
    values = dict(row)
    values["dispatch"] = jsontext.loads(values["dispatch"]) if values["dispatch"] else []
    values["flagged"] = bool(values["flagged"])
    return values


def turn_summaries(conn: sqlite3.Connection, turn_ids: t.Sequence[str]) -> dict[str, dict[str, t.Any]]:
    """Per turn: how many calls, by status and by class, and how many are flagged."""
    summary: dict[str, dict[str, t.Any]] = {}
    for chunk in (turn_ids[i:i + 500] for i in range(0, len(turn_ids), 500)):
        rows = conn.execute(
            f"SELECT turn_id, status, class, flagged, count(*) AS n FROM tool_calls "
            f"WHERE turn_id IN ({','.join('?' * len(chunk))}) GROUP BY turn_id, status, class, flagged",
            tuple(chunk)).fetchall()
        for r in rows:
            entry = summary.setdefault(r["turn_id"], {"calls": 0, "by_status": {}, "by_class": {}, "flagged": 0})
            entry["calls"] += r["n"]
            entry["by_status"][r["status"]] = entry["by_status"].get(r["status"], 0) + r["n"]
            entry["by_class"][r["class"]] = entry["by_class"].get(r["class"], 0) + r["n"]
            entry["flagged"] += r["n"] if r["flagged"] else 0
    return summary


def uncertain_side_effects(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """Side effects that started in ended turns of active agents, with no result and no replay recorded."""
    return conn.execute(
        "SELECT c.id, c.agent, c.tool, c.class, c.turn_id FROM tool_calls c JOIN turns tr ON tr.id = c.turn_id "
        "WHERE c.status = 'started' AND c.class = 'side_effect' AND tr.ended_at IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM tool_calls r WHERE r.replay_of = c.id) "
        "AND EXISTS (SELECT 1 FROM sessions s WHERE s.name = c.agent AND s.state NOT IN ('completed', 'zombie')) "
        "ORDER BY c.id").fetchall()


def audit_rows(conn: sqlite3.Connection, *, run_id: str | None = None, since_ms: int | None = None,
               limit: int = 100_000) -> list[sqlite3.Row]:
    """(agent, tool, input, class, status, flagged, started_at) of the calls of a run, or since a time, oldest first."""
    clauses: list[str] = []
    params: list[t.Any] = []
    if run_id is not None:
        clauses.append("run_id = ?")
        params.append(run_id)
    if since_ms is not None:
        clauses.append("started_at >= ?")
        params.append(since_ms)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return conn.execute(f"SELECT agent, tool, input, class, status, flagged, started_at FROM tool_calls {where} "
                        "ORDER BY id LIMIT ?", (*params, limit)).fetchall()
