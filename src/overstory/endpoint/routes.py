"""What an agent may ask of ov through its endpoint, each checked against who it is.

Every route calls the same core function its CLI command calls (``store.mail``,
``agents.spawn``, ``agents.stop``, ``merge.queue``, ``status``), with the caller's identity
taken from its row, never from the request:

- mail: the sender is always the caller (``--from`` another name is refused); reading and
  checking mail is for the caller's own mailbox;
- ``status``: read-only, for everyone;
- ``tool_call``: `ov guard` counting the caller's own tool call against its budget;
- ``ledger.pre``/``ledger.post``: `ov guard` (and ``--post``) writing the caller's own tool-call
  ledger rows, with its current turn's dispatch and policy;
- ``hook.pre``/``hook.post``: Claude's HTTP tool-call hooks (``endpoint.hooks``), the caller's own calls;
- ``guard``: `ov guard` as a client (any runtime's command hook): the same decision as ``hook.pre``,
  answered in the asking CLI's dialect;
- ``approvals.list`` reads; ``approve``/``reject`` decide as the caller, so only gates of the
  caller's own descendants (``agents.approvals.authorize``);
- ``sling``: coordinator and leads only, and only below themselves (``spawn.resolve_parent``);
- ``stop``: only the caller's own descendants;
- ``merge``: the coordinator (its role merges what its builders finish) and mergers; only
  branches of agents below the coordinator, or below a merger's parent (and the merger's own),
  and only into the caller's own base branch; ``--all`` (the whole project's queue) is the
  operator's.

Heavy modules (spawn, merge) are imported inside the routes, so the loop that serves
them starts light.
"""

from __future__ import annotations

import typing as t

from overstory import jsontext
from overstory.capabilities import MERGERS
from overstory.endpoint.server import Caller
from overstory.errors import NotPermitted, UsageError
from overstory.store import mail

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.endpoint.server import Route
    from overstory.store.sessions import Session


def _config(caller: Caller) -> Config:
    """The configuration the agent's loop runs with (its snapshot, no pydantic); read the same way without one."""
    if caller.config is not None:
        return caller.config
    from overstory.config import snapshot as config_snapshot

    try:  # as agents.loop.load_loop_config does (importing it from here would close an import circle)
        return config_snapshot.read(config_snapshot.snapshot_path(caller.project.run_dir / caller.name))
    except (OSError, ValueError, KeyError, TypeError):
        from overstory.config import load as config_load

        return config_load.load(caller.project.config_file, caller.project.local_config_file, environ=caller.launch_env)


def _sender(caller: Caller, args: dict[str, t.Any]) -> str:
    claimed = args.get("from")
    if claimed not in (None, "", caller.name):
        raise NotPermitted(f"{caller.name} cannot send mail as {claimed!r}: an agent's mail always comes from itself")
    return caller.name


def _message(message: mail.Message) -> dict[str, t.Any]:
    return message.as_dict()


def mail_send(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """`ov mail send`, idempotent per dispatch of the caller's current turn (``agents.outbox``)."""
    from overstory.agents.outbox import send_once

    ids, recipients, held = send_once(
        caller.conn, caller.environ(), lambda: caller.project, sender=_sender(caller, args), to=args.get("to"),
        subject=str(args.get("subject") or ""), body=str(args.get("body") or ""),
        type_=str(args.get("type") or "status"), priority=str(args.get("priority") or "normal"),
        payload=args.get("payload"), reply_to=args.get("reply_to"), allow_unknown=bool(args.get("allow_unknown")),
        events=caller.events)
    return {"ids": ids, "to": [recipients[i] for i in ids], **({"note" if ids else "held": held} if held else {})}


def mail_check(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    who = args.get("agent") or caller.name
    if who != caller.name:
        raise NotPermitted(f"{caller.name} may check only its own mail, not {who}'s")
    from overstory.agents.mail_debounce import checked_mail

    debounce = args.get("debounce")
    if debounce is not None and (not isinstance(debounce, (int, float)) or not 0 <= debounce < float("inf")):
        raise UsageError("mail.check: debounce must be a number of seconds, 0 or more")
    return [_message(m) for m in checked_mail(caller.conn, caller.name, peek=bool(args.get("peek")),
                                              debounce=debounce, run_dir=caller.project.run_dir)]


def mail_list(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    limit = int(args.get("limit") or 50)
    messages = mail.list_messages(caller.conn, to=args.get("to"), sender=args.get("from"), type=args.get("type"),
                                  unread=bool(args.get("unread")), thread=args.get("thread"),
                                  since_ms=args.get("since_ms"), limit=max(1, limit))
    return [_message(m) for m in messages]


def mail_read(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    return _message(mail.read_message(caller.conn, int(args["id"]), reader=caller.name))


def mail_reply(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.agents.outbox import reply_once

    new_id, recipient = reply_once(caller.conn, caller.environ(), int(args["id"]), sender=_sender(caller, args),
                                   body=str(args.get("body") or ""), events=caller.events)
    return {"id": new_id, "reply_to": int(args["id"]), "to": recipient}


def nudge(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.agents.nudge import nudge as send_nudge

    claimed = args.get("from")
    if claimed not in (None, "", caller.name):
        raise NotPermitted(f"{caller.name} cannot nudge as {claimed!r}: an agent's nudge always comes from itself")
    result = send_nudge(caller.project, caller.conn, str(args["agent"]), args.get("message"), sender=caller.name,
                        force=bool(args.get("force")))
    return {"ids": result.ids, "tmux_delivery": result.tmux_delivery, "pending": result.pending}


def status(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.views import status as core
    from overstory.views.selection import Selection

    selection = Selection(*(args.get(key) for key in ("capability", "state", "parent", "run")))
    return core.collect(caller.conn, include_completed=bool(args.get("all")), selection=selection)


def sling(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.agents.spawn import SLINGING_CAPABILITIES
    from overstory.agents.spawn import sling as do_sling
    from overstory.wire import SlingRequest

    if caller.agent.capability not in SLINGING_CAPABILITIES:
        raise NotPermitted(f"{caller.name} is a {caller.agent.capability}: only coordinator and lead agents may "
                           "sling; ask your parent with `ov mail send --type question` instead")
    request = SlingRequest.from_wire(args)
    return do_sling(caller.project, _config(caller), caller.conn, request, caller.environ()).as_dict()


def _descendant(caller: Caller, name: str) -> Session:
    from overstory.agents.hierarchy import is_descendant
    from overstory.store import sessions

    target = sessions.get(caller.conn, name)
    if target is None:
        raise sessions.agent_not_found(caller.conn, name, hint="")
    if name == caller.name or not is_descendant(caller.conn, name, caller.name):
        raise NotPermitted(f"{caller.name} may only stop its own descendants; {name} is not one of them")
    return target


def stop(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.agents.stop import stop_agent
    from overstory.wire import StopRequest

    request = StopRequest.from_wire(args)
    target = _descendant(caller, request.agent)
    config = _config(caller)
    result = stop_agent(caller.project, caller.conn, target.name, force=request.force, clean=request.clean,
                        kill_grace=config.turns.kill_grace, fallback_base=config.project.canonical_branch,
                        actor=caller.name)
    return result.as_dict()


def _mergeable(caller: Caller, agent_name: str | None, branch: str | None) -> str:
    """The agent whose branch the caller may merge: for a coordinator one below it; for a merger its
    own, or one below its parent (the agent that asked for the merge)."""
    from overstory.agents.hierarchy import is_descendant
    from overstory.store import sessions

    me = caller.agent
    if agent_name is None and branch is not None:
        agent_name = sessions.newest_on_branch(caller.conn, branch)
        if agent_name is None:
            raise NotPermitted(f"{me.name} may merge only agents' branches; {branch} belongs to no agent")
    assert agent_name is not None
    target = sessions.get(caller.conn, agent_name)
    if target is None:
        raise NotPermitted(f"{me.name} may merge only agents' branches; there is no agent {agent_name!r}")
    owner = me.name if me.capability == "coordinator" else me.parent
    own = target.name == me.name and me.capability == "merger"
    if not own and not (owner == "operator" or is_descendant(caller.conn, target.name, owner)):
        raise NotPermitted(f"{me.name} may merge only branches of agents under {owner}"
                           f"{' (and its own)' if me.capability == 'merger' else ''}; {target.name} is not one of them")
    return target.name


def merge(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    from overstory.merge.queue import merge_one, target_for
    from overstory.store import sessions
    from overstory.wire import MergeRequest

    me = caller.agent
    if me.capability not in MERGERS:
        raise NotPermitted(f"{me.name} is a {me.capability}: only the coordinator and merger agents may run "
                           "`ov merge`; report merge_ready to your parent instead")
    request = MergeRequest.from_wire(args)
    if request.all:
        raise NotPermitted("`ov merge --all` works through the whole project's queue: only the operator runs it")
    if bool(request.agent) == bool(request.branch):
        raise UsageError("name exactly one of: an AGENT or --branch B")
    name = _mergeable(caller, request.agent, request.branch)
    config = _config(caller)
    target = target_for(sessions.get(caller.conn, name), config, request.into)
    if target != me.base_branch:
        raise NotPermitted(f"{me.name} may merge only into its own base branch {me.base_branch!r}, not {target!r}")
    report = merge_one(caller.project, config, caller.conn, agent_name=name, into=target, dry_run=request.dry_run,
                       tier_max=request.tier_max, force=request.force, sender=me.name)
    return report.as_dict()


def tool_call(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """`ov guard` counts an allowed tool call against the caller's (and its run's) max_tool_calls.

    The guard runs inside the sandbox, where state.db is read-only; the count is the same
    statement the guard runs on the database outside one (``store.tool_count``).
    """
    from overstory.store.tool_count import count_tool_call

    refused = caller.tool_call_refused()  # its turn's stream priced first: a crossed budget refuses the call
    if refused:
        return {"deny": refused}
    return {"deny": count_tool_call(str(caller.project.state_db), caller.name, caller.agent.generation)}


tool_call.takes_back = False  # type: ignore[attr-defined]  # every tool call: no git work here


def _ledger_context(caller: Caller, env: t.Mapping[str, str] | None = None) -> t.Any:
    from overstory.agents.ledger import LedgerContext

    ctx = LedgerContext.from_env(env if env is not None else caller.environ())  # the turn's dispatch, policy, rules
    assert ctx is not None  # environ() always names the caller
    return ctx


def ledger_pre(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """`ov guard` in a sandbox: the tool call's ledger row, its replay policy first, then the approval gates
    (``agents.ledger.gate_and_record``).

    Returns the final decision (a call waiting for a person, or a replay of an earlier
    attempt's side effect, is denied). The row is the caller's own; a forged request can
    only write its own ledger.
    """
    from overstory.agents.ledger import gate_and_record
    from overstory.guards.policy import Decision

    hook_input = args.get("hook_input")
    if not isinstance(hook_input, dict):
        raise UsageError("ledger.pre: hook_input must be the tool call's JSON object")
    decision = Decision(bool(args.get("allow")), str(args.get("reason") or ""))
    ctx = _ledger_context(caller)  # its approval rules are the turn's, as ov exported them; never the request's
    final = gate_and_record(caller.conn, hook_input, decision, ctx, ctx.approvals, events=caller.events)
    return {"allow": final.allow, "reason": final.reason}


def ledger_post(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """`ov guard --post` in a sandbox: the call's receipt (``agents.ledger.record_post``)."""
    from overstory.agents.ledger import record_post

    hook_input = args.get("hook_input")
    data = jsontext.loads(hook_input) if isinstance(hook_input, str) else hook_input
    if not isinstance(data, dict):
        raise UsageError("ledger.post: hook_input must be the hook's JSON object")
    return {"row": record_post(caller.conn, data, _ledger_context(caller))}


ledger_pre.takes_back = False  # type: ignore[attr-defined]
ledger_post.takes_back = False  # type: ignore[attr-defined]


def _guard_reply(caller: Caller, text: str, limit_refusal: list[str] | None = None) -> tuple[str, str, int]:
    """`ov guard`'s answer to one PreToolUse hook input, decided in the loop's process: the guard's policy
    with the turn's environment as ov set it, the tool-call count, the approval gates and the ledger row.
    ``limit_refusal`` gets the reason when a budget limit (dollars, tool calls) refused the call."""
    from overstory.agents.gate import needs_approval
    from overstory.agents.ledger import gate_and_record
    from overstory.guards.policy import Decision, guard_reply
    from overstory.store.tool_count import count_on

    env = caller.environ()
    ctx = _ledger_context(caller, env)
    spec = ctx.approvals

    def count() -> str | None:
        refusal = (caller.tool_call_refused(_bills_seen(text))
                   or count_on(caller.conn, caller.name, caller.agent.generation))
        if refusal and limit_refusal is not None:
            limit_refusal.append(refusal)
        return refusal

    def record(hook_input: t.Mapping[str, t.Any], decision: Decision) -> Decision:
        try:
            return gate_and_record(caller.conn, hook_input, decision, ctx, spec, events=caller.events)
        except Exception as exc:  # noqa: BLE001 - as the command hook: the ledger alone never blocks a call
            if decision.allow and needs_approval(hook_input, spec):
                return Decision.deny(f"ov: this call needs approval, but the request could not be recorded "
                                     f"({type(exc).__name__}); it was refused. Try again in a moment.")
            return decision

    return guard_reply(text, env, count_call=count, record=record)


def _bills_seen(text: str) -> int:
    """How many bills (model steps) the runtime had made when it asked, where its hook says so: ov's OpenCode
    and Kilo plugin counts them, because those CLIs can print a step's bill after the next step's call."""
    if '"ov_bills_seen"' not in text:
        return 0
    try:
        seen = jsontext.loads(text).get("ov_bills_seen")
    except (ValueError, AttributeError):
        return 0
    return seen if isinstance(seen, int) and not isinstance(seen, bool) and 0 <= seen < 1_000_000 else 0


def hook_pre(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """Claude's HTTP PreToolUse hook (``endpoint.hooks``): what `ov guard` would print, decided here.
    The answer is the hook's JSON: ``{}`` allows, Claude's deny object refuses.

    A call refused because a budget limit was reached also ends the turn (``"continue": false``): with a
    deny alone, claude sends the refusal to the model in one more request, a model message past the limit
    that ov could stop only by killing the turn in a race with that request (tests/fixtures/
    CLAUDE_PROBE_NOTES.md, "A hook that ends the turn"). The call still gets its refusal as its result,
    so the session resumes cleanly once the limit is raised."""
    from overstory.guards.policy import Decision, hook_response

    limit_refusal: list[str] = []
    stdout, stderr, status = _guard_reply(caller, jsontext.dumps(args), limit_refusal)
    if stdout:
        answer = jsontext.loads(stdout)
    elif status:
        answer = jsontext.loads(hook_response(Decision.deny(stderr.strip() or "ov guard refused this call")))
    else:
        return {}
    if limit_refusal and isinstance(answer, dict):
        answer.update({"continue": False, "stopReason": limit_refusal[0]})
    return answer


def guard(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """`ov guard` run by any runtime's command hook in a turn: its stdin (``text``, in that CLI's dialect) is
    judged here, where the guard's modules are already loaded, and the process prints the answer as is."""
    text = args.get("text")
    if not isinstance(text, str):
        raise UsageError("guard: text must be the hook's input as a string")
    stdout, stderr, status = _guard_reply(caller, text)
    return {"stdout": stdout, "stderr": stderr, "status": status}


def hook_post(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """Claude's HTTP PostToolUse/PostToolUseFailure hook: the call's receipt, as `ov guard --post` stores it."""
    from overstory.agents.ledger import record_post

    record_post(caller.conn, args, _ledger_context(caller))
    return {}


hook_pre.takes_back = False  # type: ignore[attr-defined]
hook_post.takes_back = False  # type: ignore[attr-defined]
guard.takes_back = False  # type: ignore[attr-defined]


def approvals_list(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    """`ov approvals`: read-only, as `ov status` (the rows as stored; the CLI formats them)."""
    from overstory.store import approvals as store

    return store.list_approvals(caller.conn, include_decided=bool(args.get("all")))


def _decide(caller: Caller, args: dict[str, t.Any], *, approve: bool) -> t.Any:
    """`ov approve`/`ov reject` from inside a turn: the decider is the caller, so an agent decides only
    its own descendants' gates (``agents.approvals.authorize``); what it queued is sent at once."""
    from overstory.agents.approvals import decide

    row = decide(caller.conn, str(args["id"]), approve=approve, by=caller.name, note=args.get("note"),
                 events=caller.events)
    try:
        from overstory.notify import flush

        config = _config(caller)
        if config.notify.targets:
            flush(caller.conn, config, project=caller.project, budget_s=5)
    except Exception:  # noqa: BLE001, S110 - never fatal: the outbox keeps it for the watchdog
        pass
    return row


def approve(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    return _decide(caller, args, approve=True)


def reject(caller: Caller, args: dict[str, t.Any]) -> t.Any:
    return _decide(caller, args, approve=False)


ROUTES: dict[str, Route] = {
    "mail.send": mail_send,
    "mail.check": mail_check,
    "mail.list": mail_list,
    "mail.read": mail_read,
    "mail.reply": mail_reply,
    "nudge": nudge,
    "status": status,
    "sling": sling,
    "stop": stop,
    "merge": merge,
    "tool_call": tool_call,
    "ledger.pre": ledger_pre,
    "ledger.post": ledger_post,
    "hook.pre": hook_pre,
    "hook.post": hook_post,
    "guard": guard,
    "approvals.list": approvals_list,
    "approve": approve,
    "reject": reject,
}
