"""The approval gate inside `ov guard` (ARCHITECTURE §13): "ask a person first" for matching calls.

The turn runner exports the agent's rules (config ``approvals.rules`` plus ``ov sling
--approve``), its decider and timeouts as ``OVERSTORY_APPROVALS`` (JSON). The gate comes
after the guard's policy and after the tool-call ledger (``agents.ledger.record_pre``): a
call that repeats an effect an earlier attempt already had is answered from the ledger and
never reaches a gate, so an approved call that ran is not asked for again when its turn is
retried. A call the ledger lets run and a rule matches is held: ``gate_in_tx`` writes the
pending row and the decider's ``decision_gate`` mail in the ledger row's transaction, and
only then is the call denied with "waiting for approval `apr-…`". After the turn the agent
loop parks the agent until the gate is decided. The same call (same idempotency key without
the dispatch scope) runs once after an approval.

Standard library only (`ov guard` imports it); it fails closed: a gate that cannot be
written denies the call.
"""

from __future__ import annotations

from collections.abc import Mapping

from overstory import jsontext
from overstory.store.sqlite_module import sqlite3

TYPE_CHECKING = False  # typing costs milliseconds on the hook path (`ov guard`)
if TYPE_CHECKING:
    import typing as t

    from overstory.agents.ledger import LedgerContext
    from overstory.guards.policy import Decision

ENV_APPROVALS = "OVERSTORY_APPROVALS"
APPROVAL_SCOPE = "approval"


def spec_env(rules: t.Sequence[Mapping[str, t.Any]], *, decider: str, timeout: float, on_timeout: str) -> str:
    """The JSON the turn runner exports (empty rules: nothing to export)."""
    return jsontext.dumps({"rules": [dict(r) for r in rules], "decider": decider, "timeout": timeout,
                       "on_timeout": on_timeout}, separators=(",", ":"))


def settings(spec_text: str | None, parent: str) -> tuple[str, float, str]:
    """(decider, timeout seconds, on_timeout) from the turn's spec; the defaults without one."""
    try:
        spec = jsontext.loads(spec_text) if spec_text else {}
    except ValueError:
        spec = {}
    return (str(spec.get("decider") or parent or "operator"), float(spec.get("timeout") or 1800),
            str(spec.get("on_timeout") or "reject"))


def waiting_text(approval_id: str, call: str, *, again: bool = False) -> str:
    head = f"ov: waiting for approval `{approval_id}`" + (" (asked already)" if again else "")
    return (f"{head}: end your turn; you will be told the answer. `{call}` needs a person's approval before it "
            "runs; do not try it another way. If it is approved, run exactly the same call again.")


def matching_rule(hook_input: Mapping[str, t.Any], spec: Mapping[str, t.Any]) -> Mapping[str, t.Any] | None:
    """The first of the turn's rules the call matches, or None (the call needs no approval)."""
    from overstory.guards.patterns import parse_pattern

    tool = hook_input.get("tool_name")
    tool_input = hook_input.get("tool_input")
    if not isinstance(tool, str) or not tool:
        return None
    for raw in spec.get("rules") or ():
        if parse_pattern(str(raw["match"])).matches(tool, tool_input if isinstance(tool_input, dict) else {}):
            return raw
    return None


def needs_approval(hook_input: Mapping[str, t.Any], spec_text: str | None) -> bool:
    """Whether a rule of the turn matches the call; an unreadable spec counts as a match (fail closed)."""
    if not spec_text:
        return False
    try:
        return matching_rule(hook_input, jsontext.loads(spec_text)) is not None
    except Exception:  # noqa: BLE001
        return True


class Gated:
    """What the gate answered one call: ``verdict`` is ``allow`` (an approval was used up now), ``new`` (the
    request and its mail were written) or ``pending`` (asked already). Plain class: `ov guard` imports this."""

    __slots__ = ("approval_id", "call", "decider", "reason", "tool", "verdict")

    def __init__(self, verdict: str, approval_id: str, tool: str, call: str, decider: str,
                 reason: str | None) -> None:
        self.verdict, self.approval_id, self.tool, self.call = verdict, approval_id, tool, call
        self.decider, self.reason = decider, reason

    @property
    def refusal(self) -> str | None:
        """Why the call may not run now (the model's instructions), or None when it may."""
        if self.verdict == "allow":
            return None
        return waiting_text(self.approval_id, self.call, again=self.verdict == "pending")


def gate_in_tx(conn: sqlite3.Connection, hook_input: Mapping[str, t.Any], ctx: LedgerContext,
               spec_text: str) -> Gated | None:
    """The gate of one call the guard and the ledger let run, inside the ledger's write transaction (so the
    ledger row, the pending request and the decider's mail commit together); None when no rule matches.
    Raises when the gate cannot be written: the caller refuses the call (fail closed)."""
    spec = jsontext.loads(spec_text)
    rule = matching_rule(hook_input, spec)
    if rule is None:
        return None
    tool = str(hook_input["tool_name"])
    tool_input = hook_input.get("tool_input")
    if not isinstance(tool_input, dict):
        tool_input = {}
    from overstory.guards.classify import DEFAULT_LEDGER_RULES, classify, idempotency_key, normalize_input
    from overstory.store import approvals

    klass = classify(tool, tool_input, ctx.rules or DEFAULT_LEDGER_RULES)
    normalized = normalize_input(tool, tool_input, ctx.worktree)
    key = idempotency_key(agent=ctx.agent, task=ctx.task, klass=klass, tool=tool, normalized=normalized,
                          scope=APPROVAL_SCOPE)
    timeout = float(rule.get("timeout") or spec.get("timeout") or 1800)
    decider = str(spec.get("decider") or "operator")
    verdict, approval_id = approvals.gate_in_tx(
        conn, agent=ctx.agent, generation=ctx.generation, parent=decider, task_id=ctx.task, turn_id=ctx.turn_id,
        tool=tool, input=normalized, key=key,
        rule=approvals.Rule(str(rule["match"]), rule.get("reason"), rule.get("timeout")),
        decider=decider, timeout_s=timeout, on_timeout=str(spec.get("on_timeout") or "reject"))
    reason = rule.get("reason")
    return Gated(verdict, approval_id, tool, approvals.describe_call(tool, normalized), decider,
                 str(reason) if reason else None)


def refused(decision: Decision, exc: BaseException) -> Decision:
    """The call a gate could not be written for: refused, never let through."""
    return type(decision).deny(f"ov: this call needs approval, but the request could not be recorded "
                               f"({type(exc).__name__}: {exc}); it was refused. Try again in a moment.")


def announce(conn: sqlite3.Connection, ctx: LedgerContext, gated: Gated) -> None:
    """The trace of the gate's answer, after the commit: the row and the mail are what count."""
    if gated.verdict == "allow":
        _event(conn, ctx, "approval_used", gated.tool, f"{gated.approval_id}: the approved call runs",
               gated.approval_id)
    elif gated.verdict == "new":
        _event(conn, ctx, "approval_requested", gated.tool,
               f"{gated.approval_id}: {gated.call} waits for {gated.decider}"
               f"{' (' + gated.reason + ')' if gated.reason else ''}", gated.approval_id)


def _event(conn: sqlite3.Connection, ctx: LedgerContext, kind: str, tool: str, summary: str,
           approval_id: str) -> None:
    """After the commit; the row and the mail are what count, the event is the trace."""
    try:
        from overstory.store import events as event_store
        from overstory.store.db import open_events
        from overstory.store.mail import _events_db_path

        events = open_events(_events_db_path(conn))
        try:
            event_store.record(events, kind, agent=ctx.agent, generation=ctx.generation, turn_id=ctx.turn_id,
                               tool=tool, summary=summary[:300], data={"approval_id": approval_id})
        finally:
            events.close()
    except Exception:  # noqa: BLE001, S110
        pass
