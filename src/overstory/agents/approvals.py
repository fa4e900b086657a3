"""Deciding approval gates: `ov approve`, `ov reject`, and the watchdog's timeout (ARCHITECTURE §13).

Who may decide: the operator any gate; an agent only the gates of its own descendants
(its children, their children …). The same function serves `ov approve/reject` run by a
person (``by`` is the operator, ``decider_without_endpoint``) and by an agent inside its
turn, through its endpoint, which passes the caller it authenticated as ``by``.

Approve: the agent gets "approved: you may now run <call>" and the guard lets exactly
that call through once. Reject: the agent gets the reason and goes on without it. An
undecided gate past its deadline is settled once by the watchdog (``expire_due``):
``reject`` (the agent is told nobody answered) or ``escalate`` to the next ancestor of
the decider, up to the operator, with a fresh deadline.
"""

from __future__ import annotations

import os
import typing as t

from overstory.clock import iso, now_ms
from overstory.store import approvals as store
from overstory.store import sessions
from overstory.store.approvals import ApprovalError, describe_call
from overstory.store.sqlite_module import sqlite3

OPERATOR = "operator"
LOOP_FAULT_ENV = "OV_TEST_DIE_AT"  # agents.loop.FAULT_ENV: a point at which the agent's loop kills itself (tests)


def authorize(conn: sqlite3.Connection, row: dict[str, t.Any], by: str) -> None:
    """Refuse ``by`` unless it is the operator or an ancestor of the gate's agent."""
    if by == OPERATOR:
        return
    seen: set[str] = set()
    name: str | None = row["agent"]
    while name and name != OPERATOR and name not in seen:
        seen.add(name)
        agent = sessions.get(conn, name)
        name = agent.parent if agent else None
        if name == by:
            return
    raise ApprovalError(f"{by} may not decide {row['id']}: only the operator or an ancestor of {row['agent']} "
                        "decides its approvals")


def decide(conn: sqlite3.Connection, approval_id: str, *, approve: bool, by: str, note: str | None = None,
           events: sqlite3.Connection | None = None) -> dict[str, t.Any]:
    """Approve or reject a pending gate for ``by`` (an agent or the operator); returns the row."""
    row = store.get(conn, approval_id)
    if row is None:
        raise ApprovalError(f"no approval {approval_id}; `ov approvals --all` lists them")
    authorize(conn, row, by)
    if row["status"] == "pending":
        _refuse_if_ended(conn, row, approve=approve, by=by, events=events)
    if not approve and not (note or "").strip():
        raise ApprovalError("a rejection needs --reason: the agent is told why")
    call = describe_call(row["tool"], row["input"])
    if approve:
        subject = f"approved: you may now run {call}"
        body = (f"Your request {approval_id} was approved by {by}{': ' + note if note else ''}.\n"
                f"Run exactly the same call again now: `{call}`. It is allowed once; any other call that "
                "needs approval must be asked for on its own.")
    else:
        subject = f"rejected: {call}"
        body = (f"Your request {approval_id} to run `{call}` was rejected by {by}: {note}\n"
                "Do not run it, nor anything to the same effect. Continue your task without it and report "
                "as usual.")
    status = "approved" if approve else "rejected"
    decided = store.settle(conn, approval_id, status, by=by, note=note, agent_subject=subject, agent_body=body)
    _event(conn, events, "approval_approved" if approve else "approval_rejected", decided, f"{approval_id} {status} by {by}"
           f"{': ' + note if note else ''}")
    return decided


def expire_due(conn: sqlite3.Connection, *, now: int | None = None,
               events: sqlite3.Connection | None = None) -> list[tuple[str, str]]:
    """Settle every gate past its deadline once: [(id, "expired" | "escalated to X")]."""
    done: list[tuple[str, str]] = []
    for row in store.orphaned(conn):  # the agent ended (stopped, died, replaced): nobody waits for the answer
        if _drop(conn, row, by="watchdog", events=events):
            done.append((row["id"], "dropped"))
    for row in store.due(conn, now_ms() if now is None else now):
        if row["on_timeout"] == "escalate" and row["decider"] != OPERATOR:
            upper = _next_decider(conn, row["decider"])
            if store.escalate(conn, row["id"], upper):
                _event(conn, events, "approval_escalated", row,
                       f"{row['id']}: {row['decider']} did not decide in time; asked {upper}")
                done.append((row["id"], f"escalated to {upper}"))
            continue
        call = describe_call(row["tool"], row["input"])
        minutes = row["timeout_s"] / 60
        try:
            decided = store.settle(
                conn, row["id"], "expired", by="watchdog", note="nobody decided in time",
                agent_subject=f"rejected (no answer in time): {call}",
                agent_body=(f"Nobody decided your request {row['id']} to run `{call}` within "
                            f"{minutes:g} minutes (asked {row['decider']}), so it counts as rejected. Do not run "
                            "it; continue your task without it and report as usual."),
                expired_is_error=False)
        except ApprovalError:
            continue  # decided, or expired by another watchdog, in the meantime
        _event(conn, events, "approval_expired", decided, f"{row['id']} expired: nobody decided by "
               f"{iso(row['deadline'])}")
        done.append((row["id"], "expired"))
    return done


def _refuse_if_ended(conn: sqlite3.Connection, row: dict[str, t.Any], *, approve: bool, by: str,
                     events: sqlite3.Connection | None) -> None:
    """A gate whose agent ended (completed, zombie, replaced by a new generation) has nobody left to run
    the call: deciding it would report a success that changes nothing. It is dropped, as the watchdog
    would, and the decider is told why."""
    agent = sessions.get(conn, row["agent"])
    if agent is None:  # ov keeps an agent's row until a new generation replaces it: a gate of no agent of ov's
        return
    if agent.generation != row["generation"]:
        why = f"{row['agent']} has ended (generation {row['generation']} was replaced by {agent.generation})"
    elif agent.is_terminal:
        why = f"{row['agent']} has ended ({agent.state})"
    else:
        return
    _drop(conn, row, by=by, events=events)
    raise ApprovalError(f"{row['id']} cannot be {'approved' if approve else 'rejected'}: {why}, so nothing would "
                        "run the call; the request is dropped")


def _drop(conn: sqlite3.Connection, row: dict[str, t.Any], *, by: str, events: sqlite3.Connection | None) -> bool:
    """Settle a pending gate of an agent that ended as ``expired``, once; False if it was settled meanwhile."""
    try:
        decided = store.settle(conn, row["id"], "expired", by=by, note=store.AGENT_ENDED,
                               agent_subject=f"request {row['id']} dropped: you ended",
                               agent_body="This request was dropped because the agent ended.",
                               expired_is_error=False)
    except ApprovalError:
        return False
    _event(conn, events, "approval_expired", decided, f"{row['id']} dropped: {row['agent']} ended")
    return True


def _next_decider(conn: sqlite3.Connection, decider: str) -> str:
    agent = sessions.get(conn, decider)
    if agent is None or not agent.parent:
        return OPERATOR
    return agent.parent


def decider_without_endpoint(env: t.Mapping[str, str], project_root: str | os.PathLike[str]) -> str:
    """Who decides when `ov approve`/`ov reject` has no agent endpoint to go through: the operator, and only
    outside every agent of the project; inside one it is refused (fail closed).

    An agent decides through its endpoint, which knows who is calling. A name in the environment
    proves nothing: with ``sandbox.mode: off`` an agent can drop its endpoint's variables and name
    anyone (or no one, and look like the operator). So a command that names an agent, or runs
    below a process started as an agent of this project (``/proc``: the runtime's environment,
    which the agent's tools cannot change), is refused here. Detached from its turn (a double
    fork) an agent without the sandbox still escapes this check; `ov doctor` says so.
    """
    named = env.get("OVERSTORY_AGENT_NAME") or _agent_above(project_root)
    if named:
        raise ApprovalError(f"refused: this runs inside agent {named}'s turn, where a decision goes only through "
                            "the agent's endpoint (OVERSTORY_ENDPOINT), and none is in this environment; ov does not "
                            "take a name from the environment as proof of who decides")
    return OPERATOR


def _agent_above(project_root: str | os.PathLike[str]) -> str | None:
    """The agent of this project whose process this one runs below, from the parents' environments."""
    from overstory import procs

    root = os.path.realpath(project_root)
    for pid in procs.ancestors(os.getpid()):
        environ = procs.environ_of(pid)
        name, where = environ.get("OVERSTORY_AGENT_NAME"), environ.get("OVERSTORY_PROJECT_ROOT")
        if name and where and os.path.realpath(where) == root:
            return name
    return None


def _event(conn: sqlite3.Connection, events: sqlite3.Connection | None, kind: str, row: dict[str, t.Any],
           summary: str) -> None:
    from overstory.store import events as event_store

    own = events is None
    try:
        if events is None:
            from overstory.store.db import open_events
            from overstory.store.mail import _events_db_path

            events = open_events(_events_db_path(conn))
        event_store.record(events, kind, agent=row["agent"], generation=row["generation"], tool=row["tool"],
                           summary=summary[:300], data={"approval_id": row["id"], "decider": row["decider"],
                                                        "status": row["status"]})
    except Exception:  # noqa: BLE001, S110 - the decision is committed; the event is the trace
        pass
    finally:
        if own and events is not None:
            events.close()


# ---- the seams `ov serve` calls (ui/serve/actions.py SEAMS); the endpoint of issue 12 will call ``decide``


def as_json(row: dict[str, t.Any]) -> dict[str, t.Any]:
    """A row for people and pages: the call as text, times as ISO 8601."""
    out = dict(row)
    out["call"] = out["summary"] = describe_call(row["tool"], row["input"])
    for key in ("requested_at", "deadline", "decided_at", "used_at"):
        out[key] = iso(row[key]) if row.get(key) else None
    return out


def list_approvals(project: t.Any, conn: sqlite3.Connection, *, include_decided: bool = False) -> list[dict[str, t.Any]]:
    return [as_json(r) for r in store.list_approvals(conn, include_decided=include_decided)]


def approve(project: t.Any, conn: sqlite3.Connection, approval_id: str, *, decider: str,
            note: str | None = None) -> dict[str, t.Any]:
    return as_json(decide(conn, approval_id, approve=True, by=decider, note=note))


def reject(project: t.Any, conn: sqlite3.Connection, approval_id: str, *, decider: str,
           reason: str) -> dict[str, t.Any]:
    return as_json(decide(conn, approval_id, approve=False, by=decider, note=reason))


# ---- approvals.spend_over_usd: a turn that would start past that spend needs approval


def spend_gate(conn: sqlite3.Connection, agent: sessions.Session, over_usd: float | None, *,
               timeout_s: float, on_timeout: str, decider: str) -> bool:
    """Before a turn: True when it may start. Past ``over_usd`` each turn needs an approval:
    approved, that one turn starts; pending, the agent parks (``approval``); rejected or
    expired, the agent parks for ``budget`` (``ov resume`` asks again)."""
    if over_usd is None or agent.cost_usd <= over_usd:
        return True
    from overstory.store import lifecycle

    key = f"spend:{agent.name}:{agent.generation}"
    latest = store.latest_by_key(conn, key)
    if latest is not None and latest["status"] in ("rejected", "expired") and latest["used_at"] is None:
        def used(tx: sqlite3.Connection) -> None:
            store.mark_used(tx, latest["id"])

        lifecycle.park(conn, agent, "budget", f"spend past ${over_usd:g} was {latest['status']}"
                       f"{': ' + latest['note'] if latest['note'] else ''}; `ov resume {agent.name}` asks again"[:300],
                       actor="agent-loop", escalate=False, expect={"booting", "between_turns", "stalled"}, also=used)
        return False
    verdict, approval_id = store.gate(
        conn, agent=agent.name, generation=agent.generation, parent=decider, task_id=agent.task_id, turn_id=None,
        tool="Turn", input=f'{{"spend_usd":{round(agent.cost_usd, 4)},"over_usd":{over_usd:g}}}', key=key,
        rule=store.Rule("approvals.spend_over_usd", f"its spend ${agent.cost_usd:.2f} is past ${over_usd:g}"),
        decider=decider, timeout_s=timeout_s, on_timeout=on_timeout)
    if verdict == "allow":
        return True
    if verdict == "new":
        _event(conn, None, "approval_requested", store.get(conn, approval_id) or {},
               f"{approval_id}: a turn past ${over_usd:g} of spend waits for {decider}")

    def still_pending(tx: sqlite3.Connection) -> None:
        if store.status_of(tx, approval_id) != "pending":
            raise _Decided()

    try:
        lifecycle.park(conn, agent, "approval", f"approval {approval_id}", actor="agent-loop", escalate=False,
                       expect={"booting", "between_turns", "stalled"}, also=still_pending)
    except _Decided:
        pass  # decided meanwhile: the next look starts the turn (or parks for the rejection)
    return False


# ---- parking an agent while a gate of its own is pending (its mail loop, or its `ov loop`)


def park_for_approval(state: sqlite3.Connection, events: sqlite3.Connection, agent: sessions.Session, turn_id: str,
                      *, actor: str) -> bool:
    """After a clean turn that left approval gates pending: park the agent (reason ``approval apr-…``).

    The park's transaction checks the gates are still pending, so a decision that
    commits first (nothing to wait for) and one that commits after (it un-parks) are
    both right; its other mail waits in the inbox while it is parked.
    """
    import os

    from overstory.store import lifecycle

    ids = store.pending_for(state, agent.name, agent.generation)
    if not ids:
        return False
    if os.environ.get(LOOP_FAULT_ENV) == "approval_park" and actor == "turn-runner":
        os._exit(9)  # dies after the turn, before the park: the next loop parks it (crash-safety tests)

    def still_pending(tx: sqlite3.Connection) -> None:
        if not store.pending_for(tx, agent.name, agent.generation):
            raise _Decided()

    try:
        outcome = lifecycle.park(state, agent, "approval", f"approval {' '.join(ids)}"[:300], actor=actor,
                                 escalate=False, expect={"booting", "in_turn", "stalled", "between_turns"},
                                 also=still_pending)
    except _Decided:
        return False
    if outcome.ok:
        from overstory.store import events as event_store

        event_store.record(events, "approval_parked", agent=agent.name, generation=agent.generation,
                           turn_id=turn_id, summary=f"parked until {', '.join(ids)} is decided"[:300],
                           data={"approvals": ids})
    return outcome.ok


class _Decided(Exception):
    """Rolls back an approval park: the gate was decided meanwhile."""
