"""The tool-call ledger's decision layer: record each call and apply the replay policy (ARCHITECTURE §13).

Two entry points, each one call:

- ``record_pre(conn, hook_input, decision, ctx)`` after the guard's own decision
  (PreToolUse): classifies the call, writes its row, and turns an allowed call into a
  denial when it replays an effect an earlier attempt of the same dispatch already had.
- ``record_post(conn, hook_input, ctx)`` (PostToolUse and PostToolUseFailure): stores
  the receipt.

``hook_pre``/``hook_post`` wrap them for `ov guard`/`ov guard --post`: they read the
context from the turn's environment (``LedgerContext.from_env``) and open state.db. A
long-running hook endpoint calls ``record_pre``/``record_post`` with its own
connection and context instead. Runtimes without hooks get their rows from the turn's
stream (``StreamLedger``); there a replay can be recorded but not held back.

Replay policy per class (config ``ledger.replay``): ``skip`` (default for
``side_effect``): a call that already succeeded is denied with its receipt
(``skipped_duplicate``), one that started without a receipt is denied once with "may
already have happened" and flagged for the operator, except `ov mail send`, `ov mail
reply` and `ov sling`, which are idempotent per dispatch themselves and so just run
again; ``rerun`` (default for ``read`` and ``local_write``): runs again; ``ask``: a
person decides (``request_approval``): the replay becomes an approval gate (as for
config ``approvals.rules``, written in the same transaction as its ledger row) and
runs once when approved.

A ledger that cannot be written (database locked for too long, read-only sandbox)
never blocks a call: the guard's decision stands and a warning goes to stderr.
Standard library and ov's stdlib-only guards and store only: `ov guard` imports this.
"""

from __future__ import annotations

import os
import sys
from _collections_abc import Mapping  # collections.abc's classes, without importing the collections package

from overstory import jsontext
from overstory.store import ledger as store
from overstory.store.dispatch import DISPATCH_ENV, SCOPE_ENV, dispatch_ids, scope_of

TYPE_CHECKING = False  # typing costs milliseconds on the hook path (`ov guard`, `ov mail send`)
if TYPE_CHECKING:
    import sqlite3
    import typing as t

    from overstory.guards.classify import LedgerRules
    from overstory.guards.policy import Decision
    from overstory.runtimes.base import ParsedEvent

    _T = t.TypeVar("_T")

ENV_ATTEMPT = "OVERSTORY_ATTEMPT"
ENV_DISPATCH = DISPATCH_ENV
ENV_RUN_ID = "OVERSTORY_RUN_ID"
ENV_POLICY = "OVERSTORY_LEDGER"
REPLAY_POLICIES = ("skip", "rerun", "ask")
DEFAULT_REPLAY: dict[str, str] = {"read": "rerun", "local_write": "rerun", "side_effect": "skip"}
FLAG_EVENT = "tool_call_flagged"
_EXIT_CODE = "Exit code "  # Claude's PostToolUseFailure error: "Exit code N" and the output


def _exit_code(error: str) -> int | None:
    """``re.match(r"^Exit code (-?\\d+)", error)``'s number, without importing re (tests/test_guard_chars.py)."""
    if not error.startswith(_EXIT_CODE):
        return None
    start = len(_EXIT_CODE) + (1 if error.startswith("-", len(_EXIT_CODE)) else 0)
    end = start
    while end < len(error) and error[end].isdecimal():
        end += 1
    return int(error[len(_EXIT_CODE):end]) if end > start else None


class LedgerPolicy:
    """Config ``ledger``: extra read-only and side-effect patterns, replay policy per class.

    Plain classes here, not dataclasses: defining one costs milliseconds on every `ov guard`.
    """

    __slots__ = ("read_only", "replay", "side_effects")

    def __init__(self, read_only: tuple[str, ...] = (), side_effects: tuple[str, ...] = (),
                 replay: Mapping[str, str] | None = None) -> None:
        self.read_only = tuple(read_only)
        self.side_effects = tuple(side_effects)
        self.replay = dict(DEFAULT_REPLAY if replay is None else replay)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LedgerPolicy) and (self.read_only, self.side_effects, self.replay) == (
            other.read_only, other.side_effects, other.replay)

    __hash__ = None  # type: ignore[assignment]

    def to_json(self) -> str:
        return jsontext.dumps({"read_only": list(self.read_only), "side_effects": list(self.side_effects),
                           "replay": dict(self.replay)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> LedgerPolicy:
        """The policy a turn was given; the defaults when there is none or it cannot be read."""
        if not text:
            return cls()
        try:
            data = jsontext.loads(text)
            replay = {**DEFAULT_REPLAY, **{k: v for k, v in (data.get("replay") or {}).items()
                                           if k in DEFAULT_REPLAY and v in REPLAY_POLICIES}}
            return cls(tuple(str(p) for p in data.get("read_only") or ()),
                       tuple(str(p) for p in data.get("side_effects") or ()), replay)
        except (ValueError, AttributeError, TypeError):
            return cls()

    def rules(self) -> LedgerRules | None:
        """The compiled patterns; None for the defaults (or patterns a hand-edited env broke)."""
        if not self.read_only and not self.side_effects:
            return None
        from overstory.guards.classify import LedgerRules

        try:
            return LedgerRules.from_texts(self.read_only, self.side_effects)
        except ValueError:  # config validation rejects these; a broken env must not break the guard
            return None


class LedgerContext:
    """Who is calling and which attempt of which dispatch the call belongs to."""

    __slots__ = (
        "agent",
        "approvals",
        "attempt",
        "dispatch",
        "generation",
        "loop_scope",
        "parent",
        "replay",
        "rules",
        "run_id",
        "task",
        "turn_id",
        "worktree",
    )

    def __init__(self, agent: str, generation: int = 0, task: str = "", turn_id: str | None = None,
                 attempt: int = 0, dispatch: tuple[int, ...] = (), run_id: str | None = None,
                 worktree: str | None = None, rules: LedgerRules | None = None,
                 replay: Mapping[str, str] | None = None, parent: str = "operator",
                 approvals: str | None = None, loop_scope: str = "") -> None:
        self.agent, self.generation, self.task, self.turn_id = agent, generation, task, turn_id
        self.parent, self.approvals = parent, approvals  # approvals: the turn's OVERSTORY_APPROVALS (agents.gate)
        self.attempt, self.dispatch, self.run_id, self.worktree = attempt, tuple(dispatch), run_id, worktree
        self.rules = rules  # None: the default rules
        self.loop_scope = loop_scope  # an `ov loop` iteration's (store.dispatch.loop_scope): it names the work
        self.replay = dict(DEFAULT_REPLAY if replay is None else replay)

    @property
    def scope(self) -> str:
        return self.loop_scope or scope_of(self.dispatch)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LedgerContext | None:
        """The context the turn runner exported (``turn_env``); None outside an agent."""
        agent = env.get("OVERSTORY_AGENT_NAME")
        if not agent:
            return None
        policy = LedgerPolicy.from_json(env.get(ENV_POLICY))
        return cls(agent=agent, generation=_int(env.get("OVERSTORY_GENERATION")), task=env.get("OVERSTORY_TASK_ID", ""),
                   turn_id=env.get("OVERSTORY_TURN_ID") or None, attempt=_int(env.get(ENV_ATTEMPT)),
                   dispatch=dispatch_ids(env), run_id=env.get(ENV_RUN_ID) or None,
                   worktree=env.get("OVERSTORY_WORKTREE") or None, rules=policy.rules(), replay=policy.replay,
                   parent=env.get("OVERSTORY_PARENT") or "operator", approvals=env.get("OVERSTORY_APPROVALS"),
                   loop_scope=env.get(SCOPE_ENV, ""))


def turn_env(*, attempt: int, dispatch: t.Sequence[int], run_id: str | None, policy: LedgerPolicy) -> dict[str, str]:
    """What the turn runner exports so that hooks and ``ov`` commands of the turn know their dispatch."""
    env = {ENV_ATTEMPT: str(attempt), ENV_DISPATCH: ",".join(str(i) for i in sorted(dispatch))}
    if run_id:
        env[ENV_RUN_ID] = run_id
    if policy != LedgerPolicy():
        env[ENV_POLICY] = policy.to_json()
    return env


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


# --------------------------------------------------------------------------- PreToolUse


def request_approval(conn: sqlite3.Connection, call: store.Call, prior: store.Prior,
                     ctx: LedgerContext) -> tuple[str, str, bool]:
    """``ask``: the replay waits for a person, through an approval gate (``store.approvals``).

    Runs inside ``store.begin``'s transaction, so the ledger row, the pending approval and
    the decider's ``decision_gate`` mail commit together. Approved, the same call runs once.
    """
    from overstory.agents.gate import APPROVAL_SCOPE, settings, waiting_text
    from overstory.guards.classify import idempotency_key
    from overstory.store import approvals

    decider, timeout, on_timeout = settings(ctx.approvals, ctx.parent)
    key = idempotency_key(agent=ctx.agent, task=ctx.task, klass=call.klass, tool=call.tool, normalized=call.input,
                          scope=APPROVAL_SCOPE)
    where = f"ledger #{prior.id}, attempt {prior.attempt}"
    verdict, approval_id = approvals.gate_in_tx(
        conn, agent=ctx.agent, generation=ctx.generation, parent=ctx.parent, task_id=ctx.task, turn_id=ctx.turn_id,
        tool=call.tool, input=call.input, key=key,
        rule=approvals.Rule("ledger.replay: ask", f"it repeats a call of an earlier, crashed attempt ({where})"),
        decider=decider, timeout_s=timeout, on_timeout=on_timeout)
    if verdict == "allow":
        return "started", "", False
    return "denied", waiting_text(approval_id, approvals.describe_call(call.tool, call.input),
                                  again=verdict == "pending") + (
        f" It repeats a call of an earlier attempt at this task that crashed ({where}); config ledger.replay "
        "says a person decides whether it runs again."), False


def record_pre(conn: sqlite3.Connection, hook_input: Mapping[str, t.Any], decision: Decision, ctx: LedgerContext,
               *, events: sqlite3.Connection | None = None, approvals_spec: str | None = None) -> Decision:
    """Write the call's row after the guard decided; returns the final decision (a replay may be denied).

    With ``approvals_spec`` (the turn's approval rules) a call the ledger lets run then meets its
    approval gate (``agents.gate``), in the same transaction. The ledger comes first: a call that
    repeats an effect an earlier attempt of the dispatch already had is answered from the ledger
    (its replay policy) and never asks a person again, so an approved `./deploy.sh` that ran
    before its loop was killed is not approved, and run, a second time.
    """
    tool = hook_input.get("tool_name")
    if not isinstance(tool, str) or not tool:
        return decision
    tool_input = hook_input.get("tool_input")
    if not isinstance(tool_input, dict):
        tool_input = {}
    call = _call(ctx, tool, tool_input, hook_input.get("tool_use_id"))
    policy = ctx.replay.get(call.klass, "rerun")
    asked: list[t.Any] = []  # a person's answer this call already has (ledger.replay: ask), or the gate's

    def explain(prior: store.Prior) -> tuple[str, str, bool]:
        if prior.status == "started" and policy == "skip" and _reruns_safely(tool, tool_input, ctx):
            return "started", "", False  # `ov mail send`/`ov sling`: the command itself happens once
        if policy == "ask":
            asked.append(None)  # the replay's own gate asks a person; approved, it is not asked twice
            return request_approval(conn, call, prior, ctx)
        return _replay_verdict(call, prior, policy, ctx)

    def admit() -> str | None:
        if asked:
            return None
        from overstory.agents.gate import gate_in_tx

        gated = gate_in_tx(conn, hook_input, ctx, approvals_spec or "")
        if gated is None:
            return None
        asked.append(gated)
        return gated.refusal

    begun = store.begin(conn, call, denied_reason=None if decision.allow else decision.reason,
                        check_replay=policy != "rerun", explain=explain,
                        admit=admit if approvals_spec and decision.allow else None)
    if begun.flagged:
        _flag(conn, events, ctx, call, begun)
    if asked and asked[-1] is not None:
        from overstory.agents.gate import announce

        announce(conn, ctx, asked[-1])
    if not decision.allow or begun.status == "started":
        return decision
    return type(decision).deny(begun.reason or "ov: this call repeats an earlier attempt's and was held back.")


def _call(ctx: LedgerContext, tool: str, tool_input: Mapping[str, t.Any], tool_use_id: t.Any,
          source: str = "hook") -> store.Call:
    from overstory.guards.classify import DEFAULT_LEDGER_RULES, classify, idempotency_key, normalize_input

    klass = classify(tool, tool_input, ctx.rules or DEFAULT_LEDGER_RULES)
    normalized = normalize_input(tool, tool_input, ctx.worktree)
    key = idempotency_key(agent=ctx.agent, task=ctx.task, klass=klass, tool=tool, normalized=normalized,
                          scope=ctx.scope)
    return store.Call(agent=ctx.agent, generation=ctx.generation, tool=tool, input=normalized, klass=klass,
                      idem_key=key, turn_id=ctx.turn_id, attempt=ctx.attempt, scope=ctx.scope or None,
                      dispatch=ctx.dispatch, run_id=ctx.run_id,
                      tool_use_id=tool_use_id if isinstance(tool_use_id, str) else None, source=source)


def _reruns_safely(tool: str, tool_input: Mapping[str, t.Any], ctx: LedgerContext) -> bool:
    from overstory.guards.classify import DEFAULT_LEDGER_RULES, reruns_safely

    return reruns_safely(tool, tool_input, ctx.rules or DEFAULT_LEDGER_RULES)


def _replay_verdict(call: store.Call, prior: store.Prior, policy: str, ctx: LedgerContext) -> tuple[str, str, bool]:
    """(status, reason for the model, flag for the operator) of a call that replays ``prior``."""
    where = f"ledger #{prior.id}, attempt {prior.attempt}"
    if prior.status == "succeeded":
        exit_note = f" (exit code {prior.exit_code})" if prior.exit_code not in (None, 0) else ""
        receipt = (prior.receipt or "").strip() or "(no output)"
        return ("skipped_duplicate", (f"ov: not run again. This exact call already succeeded in an earlier attempt "
                                      f"at this task that crashed before the turn ended ({where}); its result "
                                      f"was{exit_note}: {store.trim(receipt, 1500)}\nCarry on from there; do not "
                                      "repeat it another way."), False)
    return ("denied", (f"ov: held back once. This exact call was started in an earlier attempt at this task that "
                       f"crashed before its result came back ({where}), so it may already have happened: check "
                       f"before repeating it (for a push, `git ls-remote`; for mail, `ov mail list --from "
                       f"{ctx.agent}`). If it did not happen, issue the same call again and it will run."), True)


def _flag(conn: sqlite3.Connection, events: sqlite3.Connection | None, ctx: LedgerContext, call: store.Call,
          begun: store.Begun) -> None:
    """Tell the operator (events.db: `ov feed`, `ov watch`'s problems); the row itself stays flagged."""
    from overstory.store import events as event_store

    own = events is None
    try:
        if events is None:
            from overstory.store.db import open_events
            from overstory.store.mail import _events_db_path

            events = open_events(_events_db_path(conn))
        what = "may already have happened" if begun.prior and begun.prior.status == "started" else "needs a person"
        event_store.record(events, FLAG_EVENT, agent=ctx.agent, generation=ctx.generation, turn_id=ctx.turn_id,
                           tool=call.tool, summary=f"{call.tool} held back on a retried turn: {what} "
                           f"(ledger #{begun.id}, replay of #{begun.prior.id if begun.prior else '?'})"[:300],
                           data={"ledger_id": begun.id, "replay_of": begun.prior.id if begun.prior else None,
                                 "class": call.klass, "input": call.input[:500]})
    except Exception:  # noqa: BLE001, S110 - the flagged row is what counts; the event is a courtesy
        pass
    finally:
        if own and events is not None:
            events.close()


# --------------------------------------------------------------------------- PostToolUse


def record_post(conn: sqlite3.Connection, hook_input: Mapping[str, t.Any], ctx: LedgerContext) -> int | None:
    """Store the receipt of a finished call (PostToolUse or PostToolUseFailure, or Gemini's AfterTool); returns
    its row id. A hook that gives no call id (Gemini's) finishes the oldest ``started`` row of this turn's
    attempt with the same call, as ``StreamLedger`` does for such runtimes."""
    if hook_input.get("hook_event_name") == "AfterTool":
        from overstory.guards.runtimes import gemini_after_tool

        hook_input = gemini_after_tool(hook_input)
    tool = hook_input.get("tool_name")
    if not isinstance(tool, str) or not tool:
        return None
    ok = hook_input.get("hook_event_name") != "PostToolUseFailure"
    receipt, exit_code = _receipt(tool, hook_input, ok)
    duration = hook_input.get("duration_ms")
    duration_ms = int(duration) if isinstance(duration, (int, float)) else None
    tool_use_id = hook_input.get("tool_use_id")
    if isinstance(tool_use_id, str) and tool_use_id:
        found = store.finish(conn, agent=ctx.agent, tool_use_id=tool_use_id, ok=ok, exit_code=exit_code,
                             receipt=receipt, duration_ms=duration_ms)
        if found is not None:
            return found
        settled = store.row_of(conn, agent=ctx.agent, tool_use_id=tool_use_id)
        if settled is not None:  # denied, skipped, or its receipt already came (from the stream)
            return settled
    tool_input = hook_input.get("tool_input")
    call = _call(ctx, tool, tool_input if isinstance(tool_input, dict) else {}, tool_use_id)
    if call.tool_use_id is None:
        found = store.finish_by_key(conn, agent=ctx.agent, turn_id=ctx.turn_id, attempt=ctx.attempt,
                                    idem_key=call.idem_key, ok=ok, exit_code=exit_code, receipt=receipt,
                                    duration_ms=duration_ms)
        if found is not None:
            return found
    return store.record_finished(conn, call, ok=ok, exit_code=exit_code, receipt=receipt, duration_ms=duration_ms)


def _receipt(tool: str, hook_input: Mapping[str, t.Any], ok: bool) -> tuple[str, int | None]:
    if not ok:
        error = str(hook_input.get("error") or "failed")
        code = _exit_code(error)
        if hook_input.get("is_interrupt"):
            error = "(interrupted) " + error
        return error, code
    response = hook_input.get("tool_response")
    if tool == "Bash" and isinstance(response, dict):
        text = str(response.get("stdout") or "") + (f"\n{response['stderr']}" if response.get("stderr") else "")
        return text, None if response.get("interrupted") else 0
    return _summary(response), None


def _summary(value: t.Any) -> str:
    """A small JSON rendering of a tool response: long strings cut, file contents left out."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        small = {}
        for key, item in value.items():
            if key in ("content", "originalFile", "structuredPatch", "file", "oldString", "newString"):
                continue
            if isinstance(item, str) and len(item) > 300:
                item = item[:300] + "…"
            elif isinstance(item, (list, dict)):
                item = f"<{type(item).__name__} of {len(item)}>"
            small[key] = item
        return jsontext.dumps(small, ensure_ascii=False, default=str)
    return jsontext.dumps(value, ensure_ascii=False, default=str)[: store.RECEIPT_LIMIT]


# --------------------------------------------------------------------------- for `ov guard`


def gate_and_record(conn: sqlite3.Connection, data: Mapping[str, t.Any], decision: Decision, ctx: LedgerContext,
                    approvals_spec: str | None, events: sqlite3.Connection | None = None) -> Decision:
    """The guard's decision after the ledger's replay policy and then the approval gates (``agents.gate``),
    recorded in the ledger (``record_pre``).

    One function for `ov guard` on the database and for the agent's endpoint (``ledger.pre``, ``guard``,
    ``hook.pre``). Fails closed: a gate that cannot be written refuses the call (and the refusal is recorded).
    """
    if not approvals_spec or not decision.allow:
        return record_pre(conn, data, decision, ctx, events=events)
    try:
        return record_pre(conn, data, decision, ctx, events=events, approvals_spec=approvals_spec)
    except Exception as exc:  # noqa: BLE001 - rolled back whole; a call that may need a person is refused
        from overstory.agents import gate

        if not gate.needs_approval(data, approvals_spec):
            raise
        return record_pre(conn, data, gate.refused(decision, exc), ctx, events=events)


def hook_pre(hook_input: str | Mapping[str, t.Any] | None, decision: Decision, env: Mapping[str, str], *,
             connection: t.Callable[[], sqlite3.Connection] | None = None) -> Decision:
    """`ov guard`'s one call after deciding (the hook's JSON text, or the call already in Claude's
    shape): record the call and apply the replay policy. ``connection``: state.db as the caller holds it
    open (the budget count's), else it is opened here."""
    spec = env.get("OVERSTORY_APPROVALS")

    def action(conn: sqlite3.Connection, data: dict[str, t.Any], ctx: LedgerContext) -> Decision:
        return gate_and_record(conn, data, decision, ctx, spec)

    if spec and decision.allow:  # fail closed: a gate whose state cannot be opened refuses the call
        denied = type(decision).deny("ov: this call may need approval, but ov's state could not be opened; "
                                     "it was refused. Try again in a moment.")
        return _with_state(env, hook_input, action, denied, on_error=denied, connection=connection)
    return _with_state(env, hook_input, action, decision, connection=connection)


def hook_post(text: str | None, env: Mapping[str, str]) -> None:
    """`ov guard --post`'s one call: store the receipt."""
    _with_state(env, text, record_post, None)




def _with_state(env: Mapping[str, str], text: str | Mapping[str, t.Any] | None,
                action: t.Callable[[sqlite3.Connection, dict[str, t.Any], LedgerContext], t.Any], fallback: _T,
                on_error: _T | None = None, connection: t.Callable[[], sqlite3.Connection] | None = None) -> _T:
    ctx = LedgerContext.from_env(env)
    root = env.get("OVERSTORY_PROJECT_ROOT")
    if on_error is not None:
        fallback = on_error if ctx is not None and root else fallback
    if ctx is None or not root or not text:
        return fallback
    try:
        data = dict(text) if isinstance(text, Mapping) else jsontext.loads(text)
    except ValueError:
        return fallback
    if not isinstance(data, dict):
        return fallback
    state_db = os.path.join(root, ".overstory", "state.db")
    if not os.path.isfile(state_db):
        return fallback
    try:
        if connection is not None:  # the caller's, open for this whole call: it closes it
            result = action(connection(), data, ctx)
        else:
            from overstory.store.db import open_state

            conn = open_state(state_db)  # type: ignore[arg-type]  # a str does: connect() only calls str() on it
            try:
                result = action(conn, data, ctx)
            finally:
                conn.close()
    except Exception as exc:  # noqa: BLE001 - the ledger must never turn into the reason a call fails
        print(f"ov guard: the tool-call ledger was not written ({type(exc).__name__}: {exc})", file=sys.stderr)
        return fallback
    return result if fallback is None or type(result) is type(fallback) else fallback


# --------------------------------------------------------------------------- runtimes without hooks


class StreamLedger:
    """Ledger rows from a headless turn's stream.

    ``tool_end`` events bring the receipts, matched by ``data["tool_use_id"]`` to the
    ``started`` row. With ``receipts_only`` (a runtime whose PreToolUse hook writes the rows)
    that is all it does: a headless turn sends no PostToolUse hook, so a tool call costs one
    hook, not two. The receipt is written when the loop reads the result from the stream,
    before the turn ends; if the loop or the CLI dies first, the row stays ``started`` and a
    retried attempt treats the call as one that may have happened (held back once, flagged).

    ``hook_receipts`` names the tools whose receipts the runtime's post-tool hook writes, headless
    too, because its stream does not say how they ended (Gemini's shell: "success" for any command
    that ran); their ``tool_end`` events are not receipts.

    ``hook_call`` is for a runtime whose hook is given another id than its stream (codex) or
    none (gemini): it turns a ``tool_start`` into the call as the hook saw it, and the receipt
    goes to the oldest ``started`` row of this attempt with that call's idempotency key.

    Without ``receipts_only`` (runtimes without tool hooks, where nothing can be held back),
    ``tool_start`` events make the ``started`` rows too (the call's input is the event's
    ``call_input`` when the runtime's parser gives it, else the short ``data["input"]`` text).
    """

    def __init__(self, conn: sqlite3.Connection, ctx: LedgerContext, *, receipts_only: bool = False,
                 hook_call: t.Callable[[str, dict[str, t.Any]], tuple[str, dict[str, t.Any]] | None] | None = None,
                 hook_receipts: frozenset[str] = frozenset()) -> None:
        self.conn = conn
        self.ctx = ctx
        self.receipts_only = receipts_only
        self.hook_call = hook_call
        self.hook_receipts = hook_receipts  # tools whose receipts the runtime's post-tool hook writes
        self._keys: dict[str, str] = {}  # stream id -> idempotency key of the call as its hook recorded it
        self._patches: dict[str, list[str]] = {}  # stream id -> files of a patch its hook saw as a shell command

    def feed(self, parsed: t.Iterable[ParsedEvent]) -> None:
        for event in parsed:
            data = event.data or {}
            if event.kind == "tool_start" and self.hook_call is not None:
                self._remember(event)
            if event.kind == "tool_start" and event.tool and not self.receipts_only:
                tool_input = event.call_input
                if not isinstance(tool_input, dict):
                    from overstory.guards.patterns import SHELL_TOOLS

                    text = data.get("input") or event.summary or ""  # the parser's short rendering
                    tool_input = {"command" if event.tool in SHELL_TOOLS else "input": text}
                call = _call(self.ctx, event.tool, tool_input, data.get("tool_use_id"), source="stream")
                store.begin(self.conn, call, denied_reason=None, check_replay=False)
            elif event.kind == "tool_end":
                tool_use_id = data.get("tool_use_id")
                if not isinstance(tool_use_id, str) or not tool_use_id:
                    continue
                if event.tool in self.hook_receipts:  # its hook wrote the receipt (or, if it died, none:
                    self._keys.pop(tool_use_id, None)  # the row stays started, never "succeeded" by the stream)
                    continue
                self._finish(tool_use_id, data)

    def _remember(self, event: ParsedEvent) -> None:
        stream_id = (event.data or {}).get("tool_use_id")
        if not event.tool or not isinstance(stream_id, str) or not isinstance(event.call_input, dict):
            return
        assert self.hook_call is not None
        seen = self.hook_call(event.tool, event.call_input)
        if seen is not None:
            self._keys[stream_id] = _call(self.ctx, seen[0], seen[1], None).idem_key
        elif isinstance(event.call_input.get("paths"), list):  # codex's apply_patch: a file_change in the stream
            self._patches[stream_id] = [str(p) for p in event.call_input["paths"]]

    def _patch_key(self, paths: list[str]) -> str | None:
        """The key of this attempt's oldest ``started`` shell call that is a patch of the same files (its
        hook saw ``apply_patch <<EOF ...`` as a command; the stream reports the files it changed)."""
        from overstory.guards.classify import normalize_input
        from overstory.guards.runtimes import patch_paths

        changed = sorted(os.path.normpath(p) for p in jsontext.loads(normalize_input("Bash", {"p": paths}, self.ctx.worktree))["p"])
        for row in store.calls(self.conn, agent=self.ctx.agent, turn_ids=[self.ctx.turn_id] if self.ctx.turn_id else None):
            if row["status"] != "started" or row["attempt"] != self.ctx.attempt or row["tool"] != "Bash":
                continue
            patched = patch_paths(str(jsontext.loads(row["input"]).get("command") or ""))
            if patched and sorted(os.path.normpath(p) for p in patched) == changed:
                return str(row["idem_key"])
        return None

    def _finish(self, tool_use_id: str, data: dict[str, t.Any]) -> None:
        output, exit_code = data.get("output"), data.get("exit_code")
        receipt = {"ok": not data.get("is_error"), "exit_code": exit_code if isinstance(exit_code, int) else None,
                   "receipt": output if isinstance(output, str) else None, "duration_ms": data.get("duration_ms")}
        if self.hook_call is None:
            store.finish(self.conn, agent=self.ctx.agent, tool_use_id=tool_use_id, **receipt)
            return
        key = self._keys.pop(tool_use_id, None)
        if key is None and tool_use_id in self._patches:
            key = self._patch_key(self._patches.pop(tool_use_id))
        if key is not None:  # else a call its hook never saw: it has no row to finish
            store.finish_by_key(self.conn, agent=self.ctx.agent, turn_id=self.ctx.turn_id, attempt=self.ctx.attempt,
                                idem_key=key, **receipt)
