"""One headless turn: spawn the runtime, feed it one user message, watch its stream, settle.

The runtime runs in its own process group so that the whole group (including any
shell commands the model started) can be stopped on a stall or an operator stop.
Everything runtime-specific (command line, message format, stream parsing, failure
classes) comes from the agent's runtime adapter (``runtimes.base.Runtime``).
"""

from __future__ import annotations

import json
import os
import select
import selectors
import sqlite3
import subprocess
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory import procs, sandbox
from overstory.agents import checkpoint, ledger
from overstory.agents.session_lost import note_session
from overstory.agents.spending import ToolCallGate, TurnMeter
from overstory.clock import now_ms
from overstory.errors import OrchestratorError
from overstory.paths import ProjectPaths
from overstory.runtimes import get_runtime
from overstory.runtimes.base import (
    AUTH,
    PERMANENT,
    RATE_LIMIT,
    UNKNOWN,
    ParsedEvent,
    TurnFailure,
    TurnParser,
    TurnRequest,
    Usage,
)
from overstory.store import budgets, sessions
from overstory.store import events as event_store
from overstory.store import turns as turn_rows
from overstory.store.budgets import Crossing
from overstory.store.dispatch import claimed_ids, turn_scope
from overstory.store.sessions import Session

if t.TYPE_CHECKING:
    from overstory.config import Config

# Variables a parent coding-agent session exports; a nested session would react to them.
NESTED_SESSION_VARS = ("CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT")
ACTIVITY_WRITE_INTERVAL = 1.0
PERIODIC_SECONDS = 1.0
# The longest wait for a refused call's tool_end before a turn is stopped (``TurnParser.stop_after_refusal``).
REFUSED_CALL_GRACE = 3.0
# The turn statuses of failure kinds the loop parks for instead of retrying.
PARKING_STATUS = {RATE_LIMIT: "rate_limit", AUTH: "auth", UNKNOWN: "unknown"}


@dataclass
class TurnResult:
    # ok | transient | permanent | resume_failed | stalled | aborted, or what parks the agent:
    # budget (a limit crossed), rate_limit (quota), auth, unknown (an error ov cannot classify), parked
    # (parked by someone else)
    status: str
    reason: str
    session_id: str | None
    started_ms: int
    stream: TurnParser
    crossing: Crossing | None = None
    reset_at_ms: int | None = None
    cost_usd: float = 0.0


def resolve_model_and_provider(agent: Session, config: Config, environ: t.Mapping[str, str]) -> tuple[str | None, dict[str, str]]:
    """The --model for ``agent`` and the provider variables it needs (ANTHROPIC_BASE_URL/API_KEY)."""
    return model_choice(agent.model, agent.capability, config, environ, agent.runtime)


def model_choice(model: str | None, capability: str, config: Config,
                 environ: t.Mapping[str, str], runtime: str | None = None) -> tuple[str | None, dict[str, str]]:
    """``--model`` (or sling's) > config ``models[capability]`` > ``runtime.model``.

    ov's two built-in ``models`` entries (``DEFAULT_MODELS``: Claude aliases) are skipped for a
    runtime that does not speak Anthropic's API.

    ``provider/model`` routes the agent to that config ``providers`` entry: the runtime
    turns its ``base_url`` and the key held by the variable named in ``api_key_env``
    into its own environment (for claude: ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY).
    That variable must be set: falling back to whatever key the environment holds
    would send one provider's key to another's endpoint. Raises OrchestratorError on
    an unknown provider or a missing key.
    """
    from overstory.config_snapshot import DEFAULT_MODELS  # not from config: no pydantic in the loop

    adapter = get_runtime(runtime or config.runtime_for(capability))
    configured = config.models.get(capability)
    if configured and configured == DEFAULT_MODELS.get(capability) and "anthropic" not in adapter.protocols:
        configured = None  # ov's built-in default is a Claude alias: another CLI keeps its own default
    choice = model or configured or config.runtime.model
    extra: dict[str, str] = {}
    if choice and "/" in choice:
        provider_name, _, model_name = choice.partition("/")
        provider = config.providers.get(provider_name)
        if provider is None:
            known = ", ".join(sorted(config.providers)) or "none configured"
            raise OrchestratorError(f"model {choice!r} names provider {provider_name!r}, which is not in config "
                                    f"`providers` ({known})")
        if provider.protocol and adapter.protocols and provider.protocol not in adapter.protocols:
            raise OrchestratorError(f"provider {provider_name!r} speaks {provider.protocol}; the {adapter.name} runtime "
                                    f"needs {' or '.join(adapter.protocols)} (model {choice!r})")
        key = environ.get(provider.api_key_env)
        if not key:
            raise OrchestratorError(f"provider {provider_name!r} (model {choice!r}) takes its API key from "
                                    f"${provider.api_key_env}, which is not set")
        extra.update(adapter.provider_env(provider.base_url, key))
        return model_name or None, extra
    return choice, extra


def provider_of(model: str | None, capability: str, config: Config, runtime: str | None = None) -> str:
    """The quota window an agent shares: its config provider's name, else its runtime's own endpoint."""
    choice = model or config.models.get(capability) or config.runtime.model
    if choice and "/" in choice:
        return choice.partition("/")[0]
    return runtime or config.runtime.default


def turn_environment(base: t.Mapping[str, str], agent: Session, project: ProjectPaths, turn_id: str,
                     extra: t.Mapping[str, str] | None = None) -> dict[str, str]:
    runtime = get_runtime(agent.runtime)
    # Every OVERSTORY_* variable of a turn is set here: one inherited from whoever launched ov (another
    # agent's turn) would key the ledger by its attempt, dispatch or run, or lend it a push permission.
    env = {k: v for k, v in runtime.inherited_env(base).items()
           if k not in NESTED_SESSION_VARS and not k.startswith("OVERSTORY_")}
    env.update(runtime.turn_env(project.run_dir / agent.name))
    env.update(extra or {})
    env.update({
        "PWD": agent.worktree or str(project.root),  # the turn's cwd; some CLIs trust $PWD over getcwd()
        "OVERSTORY_AGENT_NAME": agent.name,
        "OVERSTORY_PROJECT_ROOT": str(project.root),
        "OVERSTORY_WORKTREE": agent.worktree or str(project.root),
        "OVERSTORY_TASK_ID": agent.task_id,
        "OVERSTORY_CAPABILITY": agent.capability,
        "OVERSTORY_BRANCH": agent.branch or "",
        "OVERSTORY_PARENT": agent.parent,
        "OVERSTORY_GENERATION": str(agent.generation),
        "OVERSTORY_TURN_ID": turn_id,
    })
    ov_bin_dir = agent.spec.get("ov_bin_dir")
    if ov_bin_dir:
        env["PATH"] = ov_bin_dir + os.pathsep + env.get("PATH", "")
    return env


def durable_env(config: Config, agent: Session, attempt: int, dispatch: t.Sequence[int]) -> dict[str, str]:
    """What the turn's hooks and ``ov`` commands need for the ledger and idempotency, and the push rule."""
    policy = ledger.LedgerPolicy(tuple(config.ledger.read_only), tuple(config.ledger.side_effects),
                                 dict(config.ledger.replay))
    env = ledger.turn_env(attempt=attempt, dispatch=dispatch, run_id=agent.run_id, policy=policy)
    if config.guards.push_remotes:
        env["OVERSTORY_PUSH_REMOTES"] = ",".join(config.guards.push_remotes)
    rules = approval_rules(config, agent)
    if rules:
        from overstory.agents.gate import ENV_APPROVALS, spec_env

        decider = agent.parent if config.approvals.decider == "parent" else "operator"
        env[ENV_APPROVALS] = spec_env(rules, decider=decider or "operator", timeout=config.approvals.timeout,
                                      on_timeout=config.approvals.on_timeout)
    return env


def approval_rules(config: Config, agent: Session) -> list[dict[str, t.Any]]:
    """Config ``approvals.rules`` for the agent's capability, then its own ``ov sling --approve`` patterns."""
    rules = []
    for rule in config.approvals.rules:  # models from pydantic, or plain dicts from a config snapshot
        get = rule.get if isinstance(rule, dict) else (lambda key, rule=rule: getattr(rule, key, None))
        if get("capability") in (None, agent.capability):
            rules.append({"match": get("match"), "reason": get("reason"), "timeout": get("timeout")})
    rules += [{"match": p, "reason": "ov sling --approve", "timeout": None} for p in agent.spec.get("approve") or ()]
    return rules


class _LineReader:
    """Read whole lines from a pipe without blocking past a deadline.

    With a ``gate`` (``spending.ToolCallGate``) it also wakes when a tool call asks the gate: it then
    takes the gate's tickets (``ticket``) and reads everything the pipe holds at that moment, so the
    turn runner can answer them once those lines are priced.
    """

    DRY_READ_LIMIT = 4 << 20  # bytes read in one go for a waiting tool call (a flood must not starve the loop)

    def __init__(self, stream: t.IO[bytes], gate: ToolCallGate | None = None) -> None:
        self.fd = stream.fileno()
        self.buffer = b""
        self.eof = False
        self.gate = gate
        self.ticket = 0
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        if gate is not None:
            self.selector.register(gate.fileno(), selectors.EVENT_READ)

    def lines(self, timeout: float) -> list[bytes]:
        if self.eof:
            return []
        ready = self.selector.select(timeout)
        if not ready:
            return []
        if self.gate is not None and any(key.fd != self.fd for key, _ in ready):
            self.ticket = self.gate.take()  # before reading: what the runtime printed before it asked is in the pipe
            return self._read(dry=True)
        return self._read(dry=False)

    def _read(self, *, dry: bool) -> list[bytes]:
        read = 0
        while True:
            if dry and not select.select([self.fd], [], [], 0)[0]:
                break
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
                rest, self.buffer = self.buffer, b""
                if rest.strip():
                    self.buffer = rest + b"\n"
                break
            self.buffer += chunk
            read += len(chunk)
            if not dry or read >= self.DRY_READ_LIMIT:
                break
        *complete, self.buffer = self.buffer.split(b"\n")
        return complete

    def close(self) -> None:
        self.selector.close()


def run_turn(project: ProjectPaths, config: Config, state: sqlite3.Connection, events: sqlite3.Connection,
             agent: Session, prompt: str, turn_id: str, *, resume_session_id: str | None,
             base_env: t.Mapping[str, str], attempt: int = 0, should_stop: t.Callable[[], bool] = lambda: False,
             extra_env: t.Mapping[str, str] | None = None, settings_file: Path | None = None,
             env_ready: t.Callable[[t.Mapping[str, str]], None] | None = None,
             gate: ToolCallGate | None = None) -> TurnResult:
    """Run one turn of ``agent`` in its sandbox. ``extra_env``: variables for this turn only (the endpoint's
    per-turn secret; an `ov loop` names its iteration and phase there). ``settings_file``: the loop's HTTP
    hooks instead of the command hooks; ``env_ready`` is told the turn's whole environment before it starts;
    ``gate``: where the endpoint's tool-call hooks wait for this turn's stream to be priced (``spending``)."""
    started_ms = now_ms()
    log_dir = project.logs_dir / agent.name / turn_id
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "prompt.txt").write_text(prompt, encoding="utf-8")
    scenario = Path(agent.spec["scenario"]) if agent.spec.get("scenario") else None
    try:
        runtime = get_runtime(agent.runtime)
        stream = runtime.new_parser()
        model, provider_env = resolve_model_and_provider(agent, config, base_env)
        argv = runtime.headless_command(TurnRequest(model=model, resume_session_id=resume_session_id,
                                                    run_dir=project.run_dir / agent.name,
                                                    at_project_root=not agent.worktree, scenario=scenario,
                                                    provider_env=provider_env,
                                                    sandboxed=sandbox.effective_mode(config).name == "bwrap",
                                                    settings_file=settings_file), config)
        dispatch = claimed_ids(state, turn_id)
        provider_env.update(durable_env(config, agent, attempt, dispatch))
        env = turn_environment(base_env, agent, project, turn_id, {**provider_env, **(extra_env or {})})
        prepared = sandbox.prepare_turn(project, config, agent, argv, env, launch_env=base_env)
    except OrchestratorError as exc:  # config or installation problem: retrying the turn would not help
        return TurnResult("permanent", str(exc), None, started_ms, _NoOutput())
    except OSError as exc:
        return TurnResult("transient", f"could not prepare the turn's sandbox: {exc}", None, started_ms, _NoOutput())
    _record_take_back(events, agent, turn_id, prepared.took_back, before=True)
    argv, env = prepared.argv, prepared.env
    if env_ready is not None:
        env_ready(env)
    turn_rows.start(state, turn_id, agent=agent.name, generation=agent.generation, number=agent.turns + 1,
                    attempt=attempt, resumed=bool(resume_session_id), started_ms=started_ms, log_dir=str(log_dir))
    turn_rows.label(state, turn_id, capability=agent.capability, run_id=agent.run_id, model=model)
    meter = TurnMeter(state, agent, config, model=model)
    (log_dir / "command.json").write_text(json.dumps(argv), encoding="utf-8")
    cwd = agent.worktree or str(project.root)
    stale = checkpoint.clear_stale_git_locks(agent.worktree, agent.branch)
    if stale:
        event_store.record(events, "git_lock_removed", agent=agent.name, generation=agent.generation, turn_id=turn_id,
                           summary=f"removed stale git lock(s) left by a killed process: {', '.join(stale)}"[:300])
    checkpoint.save_start(state, agent, turn_id, attempt=attempt, scope=turn_scope(env), mail_ids=dispatch,
                          resume_session_id=resume_session_id, cwd=cwd, started_ms=started_ms)
    # Receipts come from the stream (a headless turn has no PostToolUse hook); without a PreToolUse hook
    # (`ov guard` never runs) the rows do too.
    stream_ledger = ledger.StreamLedger(state, ledger.LedgerContext.from_env(env) or ledger.LedgerContext(agent.name),
                                        receipts_only="pre" in runtime.tool_hooks,
                                        hook_call=None if runtime.hook_ids_match else runtime.hook_call)
    with open(log_dir / "stdout.ndjson", "wb") as raw_out, open(log_dir / "stderr.txt", "wb") as raw_err:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=raw_err, start_new_session=True)
        except OSError as exc:
            _finish_turn_row(state, turn_id, "failed", stream, f"cannot start runtime: {exc}")
            return TurnResult("permanent", f"cannot start {argv[0]}: {exc.strerror or exc}", None, started_ms, stream)
        pgid = proc.pid
        ticks = procs.start_ticks(pgid)
        turn_rows.mark_running(state, turn_id, pid=proc.pid, pgid=pgid)
        if not sessions.update_fields(state, agent.name, agent.generation, turn_pgid=pgid, turn_start_ticks=ticks,
                                      current_turn_id=turn_id, last_activity=now_ms()):
            procs.kill_turn(pgid, ticks, turn_id, force=True)
            proc.wait()
            _finish_turn_row(state, turn_id, "aborted", stream, "agent replaced before the turn started")
            return TurnResult("aborted", "agent was replaced by a newer generation", None, started_ms, stream)
        try:
            assert proc.stdin is not None
            proc.stdin.write(runtime.stdin_message(prompt))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        assert proc.stdout is not None
        if gate is not None:
            gate.open_turn(watch=meter.enabled and meter.watches_usd)
        reader = _LineReader(proc.stdout, gate)
        try:
            status, reason = _pump(reader, raw_out, proc, stream, state, events, agent, turn_id, meter,
                                   stall_timeout=config.turns.stall_timeout, should_stop=should_stop,
                                   price=lambda data: _price_result(data, stream.model or model, config),
                                   periodic=lambda: _record_take_back(events, agent, turn_id,
                                                                      sandbox.take_back(project, agent)),
                                   stream_ledger=stream_ledger, asked_session=resume_session_id)
        finally:
            if gate is not None:  # every call still waiting is answered: refused when the turn was stopped
                gate.close_turn(meter.stopped_by)
            reader.close()
        if status == "running":
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        # Anything the turn left behind in its group (background shells…) goes with it.
        stopping_at = time.monotonic()
        procs.kill_turn(pgid, ticks, turn_id, grace=config.turns.kill_grace if status == "running" else 0.5,
                        force=status != "running")
        exit_code = proc.wait()
        if status in ("budget", "parked", "auth"):
            event_store.record(events, "turn_stopped", agent=agent.name, generation=agent.generation,
                               turn_id=turn_id, summary=f"{status}: process group {pgid} stopped"[:300],
                               data={"status": status, "pgid": pgid,
                                     "stop_seconds": round(time.monotonic() - stopping_at, 3)})
    _record_take_back(events, agent, turn_id, sandbox.take_back(project, agent))
    stream.finish(exit_code, _tail(log_dir / "stderr.txt"))
    failure: TurnFailure | None = None
    if status == "running":
        if stream.succeeded:
            status, reason = "ok", "turn finished"
        else:
            failure = stream.failure(resumed=bool(resume_session_id))
            status = PARKING_STATUS.get(failure.kind, failure.kind)
            reason = failure.reason + (f" (exit {exit_code})" if not stream.finished else "")
    reported = stream.usage()
    input_tokens, output_tokens, cost = priced_usage(stream, model, config)
    # ov's figure, not the runtime's: the turn stopped before it reported one (our live estimate stands),
    # or the runtime reports tokens only (priced with the same table).
    estimated = not stream.finished or (not reported.cost_usd and cost > 0)
    live = stream.live_usage()
    if not stream.finished and (live or stream.live_cost_usd()):
        cost = meter.price(stream)
        input_tokens = sum(tk.input + tk.cache_read + tk.cache_write for tk in live.values())
        output_tokens = sum(tk.output for tk in live.values())
    sessions.update_fields(state, agent.name, agent.generation, turn_pgid=None, turn_start_ticks=None,
                           current_turn_id=None, current_tool=None, last_activity=now_ms(),
                           **({"runtime_session_id": stream.session_id} if stream.session_id else {}))
    sessions.add_usage(state, agent.name, agent.generation, input_tokens=input_tokens, output_tokens=output_tokens,
                       cost_usd=cost)
    budgets.settle_turn(state, agent.name, agent.generation, cost)
    _finish_turn_row(state, turn_id, status, stream, None if status == "ok" else reason, exit_code=exit_code,
                     usage=(input_tokens, output_tokens, cost))
    turn_rows.record_costs(state, turn_id, **_cost_detail(stream, meter, estimated, cost))
    checkpoint.save_end(state, agent, turn_id, session_id=stream.session_id, cwd=cwd, turn_status=status)
    event_store.record(events, "turn_end", agent=agent.name, generation=agent.generation, turn_id=turn_id,
                       summary=f"{status}: {reason}"[:300],
                       data={"status": status, "reason": reason, "exit_code": exit_code, "cost_usd": cost,
                             "cost_estimated": estimated, "input_tokens": input_tokens, "output_tokens": output_tokens,
                             "tool_calls": stream.tool_calls, "session_id": stream.session_id,
                             **({"price_notes": meter.notes} if meter.notes else {}),
                             **({"failure": failure.kind, "reset_at_ms": failure.reset_at_ms} if failure else {})})
    crossing = meter.stopped_by.crossing if meter.stopped_by is not None else None
    return TurnResult(status, reason, stream.session_id, started_ms, stream, crossing=crossing,
                      reset_at_ms=failure.reset_at_ms if failure else None, cost_usd=cost)


def _cost_detail(stream: TurnParser, meter: TurnMeter, estimated: bool, cost: float) -> dict[str, t.Any]:
    """Tokens by kind and by model for the turn row: the runtime's own figures, else the live ones."""
    reported = {} if estimated else stream.model_costs()
    known = [entry.cost_usd for entry in reported.values() if entry.cost_usd is not None]
    if reported and abs(sum(known) - cost) > max(0.01 * cost, 1e-6):
        reported = {}  # the per-model figures do not add up to the turn's cost: price the live usage instead
    if reported:
        by_model = {model: {**entry.tokens._asdict(), "cost_usd": entry.cost_usd} for model, entry in reported.items()}
    else:
        live = meter.usage_of(stream)
        by_model = {model: {**tokens._asdict(), "cost_usd": None} for model, tokens in live.items() if tokens.total}
        if not estimated and len(by_model) == 1:
            next(iter(by_model.values()))["cost_usd"] = cost
    totals = {key: sum(int(entry[key]) for entry in by_model.values()) for key in ("cache_read", "cache_write")}
    model = max(by_model, key=lambda m: by_model[m]["input"] + by_model[m]["output"]) if by_model else stream_model(stream)
    return {"model": model or None, "cache_read_tokens": totals["cache_read"], "cache_write_tokens": totals["cache_write"],
            "cost_estimated": estimated, "usage_by_model": by_model or None}


def stream_model(stream: TurnParser) -> str | None:
    return getattr(stream, "model", None)


def _record_take_back(events: sqlite3.Connection, agent: Session, turn_id: str, took: sandbox.TakeBack, *,
                      before: bool = False) -> None:
    """An event when a writer's branch came out of its sandbox, or was refused (see sandbox.gitrefs)."""
    if took.status in ("none", "unchanged"):
        return
    when = "left by the previous turn" if before else "after the turn"
    summary = f"branch {agent.branch}: {took.status} ({when})" + (f": {took.detail}" if took.detail else "")
    event_store.record(events, "branch_take_back" if took.status == "moved" else "branch_refused", agent=agent.name,
                       generation=agent.generation, turn_id=turn_id, summary=summary[:300],
                       data={"status": took.status, "old": took.old, "new": took.new, "detail": took.detail})


def _pump(reader: _LineReader, raw_out: t.IO[bytes], proc: subprocess.Popen[bytes], stream: TurnParser,
          state: sqlite3.Connection, events: sqlite3.Connection, agent: Session, turn_id: str, meter: TurnMeter, *,
          stall_timeout: float, should_stop: t.Callable[[], bool],
          price: t.Callable[[dict[str, t.Any]], None] = lambda data: None,
          periodic: t.Callable[[], None] = lambda: None,
          stream_ledger: ledger.StreamLedger | None = None, asked_session: str | None = None) -> tuple[str, str]:
    """Read the stream until EOF; returns ('running', '') normally, or a stop status.

    ``periodic`` runs about every ``PERIODIC_SECONDS`` (bringing a writer's commits out of its
    sandbox as they happen, so its branch is current while the turn runs).
    """
    last_event = time.monotonic()
    last_periodic = last_event
    last_write = 0.0
    entered_turn = False
    exited_at: float | None = None
    saved_session: str | None = None
    refused_at: float | None = None
    while not reader.eof:
        lines = reader.lines(timeout=0.5)
        now = time.monotonic()
        batch: list[ParsedEvent] = []
        for raw in lines:
            raw_out.write(raw + b"\n")
            raw_out.flush()
            parsed = stream.feed(raw.decode("utf-8", errors="replace"), now=now)
            batch.extend(parsed)
            last_event = now
            for item in parsed:
                if item.kind == "turn_result" and item.data is not None:
                    price(item.data)
                event_store.record(events, item.kind, agent=agent.name, generation=agent.generation, turn_id=turn_id,
                                   tool=item.tool, summary=item.summary, data=item.data)
            if stream_ledger is not None:
                stream_ledger.feed(parsed)
            if not entered_turn and stream.events_seen:
                entered_turn = True
                outcome = sessions.transition(state, agent.name, agent.generation, "in_turn", actor="turn-runner",
                                              reason=f"turn {turn_id}", expect={"booting", "between_turns", "stalled"})
                if not outcome.ok:
                    return "aborted", f"agent can no longer take a turn ({_describe(outcome)})"
            if stream.session_id and stream.session_id != saved_session:  # saved the moment it is known (and
                saved_session = note_session(state, events, agent, turn_id,  # a context lost is said)
                                             stream.session_id, asked=asked_session)
            if parsed and now - last_write >= ACTIVITY_WRITE_INTERVAL or any(p.kind in ("tool_start", "tool_end") for p in parsed):
                last_write = now
                written = sessions.update_fields(state, agent.name, agent.generation, last_activity=now_ms(),
                                                 current_tool=stream.current_tool)
                if not written:
                    return "aborted", "agent was replaced by a newer generation"
                _revive_if_stalled(state, agent)
        early = stream.early_failure()
        if early is not None:
            event_store.record(events, "auth_failed", agent=agent.name, generation=agent.generation, turn_id=turn_id,
                               summary=f"auth: {early.reason}"[:300], data={"reason": early.reason})
            return PARKING_STATUS.get(early.kind, early.kind), early.reason
        ticket, reader.ticket = reader.ticket, 0
        stop = meter.poll(stream, batch, now, force=bool(ticket))
        if ticket and reader.gate is not None:
            reader.gate.answer(ticket, stop)  # the tool calls that asked: refused if this batch crossed a limit
        if refused_at is not None:  # the runtime took the refusal (its tool_end), or took too long: stop now
            taken = any(p.kind == "tool_end" for p in batch) or now - refused_at > REFUSED_CALL_GRACE
            stop = meter.stopped_by if taken else None
        elif stop is not None and stream.stop_after_refusal and (ticket or stream.current_tool) and reader.gate:
            reader.gate.answer(0, stop)  # a call in flight is refused at the gate: stop once the refusal is taken
            meter.stopped_by, refused_at, stop = stop, now, None
        if stop is not None:
            return _stopped(events, agent, turn_id, meter, stop)
        if now - last_periodic >= PERIODIC_SECONDS:
            last_periodic = now
            periodic()
        if should_stop():
            return "aborted", "the agent was stopped"
        if now - last_event > stall_timeout:
            return "stalled", f"no output for {stall_timeout:g}s (stall timeout)"
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and not lines and now - exited_at > 5:
            break  # the runtime exited; a straggler child still holds its stdout open
    if refused_at is not None and meter.stopped_by is not None:
        return _stopped(events, agent, turn_id, meter, meter.stopped_by)
    return "running", ""


def _stopped(events: sqlite3.Connection, agent: Session, turn_id: str, meter: TurnMeter, stop: t.Any) -> tuple[str, str]:
    meter.stopped_by = stop  # a limit stops the turn: its event, and the status the caller settles with
    event_store.record(events, "budget_crossed" if stop.status == "budget" else "turn_parked",
                       agent=agent.name, generation=agent.generation, turn_id=turn_id, summary=stop.reason[:300],
                       data={"estimate_usd": round(meter.estimate, 6),
                             **({"crossing": stop.crossing.as_dict()} if stop.crossing else {})})
    return stop.status, stop.reason


def priced_usage(stream: TurnParser, model: str | None, config: Config) -> Usage:
    """The turn's usage; dollars from the price table (``overstory.prices``) when the runtime reported none.

    A model the table does not know is priced as the most expensive known one (as budgets
    price it live), not as free: an unknown model must not make a budget blind.
    """
    usage = stream.usage()
    if usage.cost_usd or not (usage.input_tokens or usage.output_tokens):
        return usage
    return usage._replace(cost_usd=_table_cost(stream.model or model, usage.input_tokens, usage.output_tokens,
                                               config))


def _table_cost(model: str | None, input_tokens: int, output_tokens: int, config: Config) -> float:
    from overstory.prices import PriceTable, Tokens

    return PriceTable(config.prices).lookup(model).price.cost(Tokens(input_tokens, output_tokens))


def _price_result(data: dict[str, t.Any], model: str | None, config: Config) -> None:
    """Fill in a turn_result event's cost from the price table when the runtime did not report one."""
    if data.get("total_cost_usd"):
        return
    data["total_cost_usd"] = _table_cost(model, int(data.get("input_tokens") or 0),
                                         int(data.get("output_tokens") or 0), config)
    data["cost_source"] = "price_table"
    data.setdefault("model", model)


def _tail(path: Path, size: int = 4096) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _revive_if_stalled(state: sqlite3.Connection, agent: Session) -> None:
    """A turn the watchdog marked stalled that speaks again is back in its turn."""
    row = state.execute("SELECT state FROM sessions WHERE name=? AND generation=?", (agent.name, agent.generation)).fetchone()
    if row and row["state"] == "stalled":
        sessions.transition(state, agent.name, agent.generation, "in_turn", actor="turn-runner",
                            reason="activity resumed", expect={"stalled"})


def _describe(outcome: sessions.Outcome) -> str:
    if isinstance(outcome, sessions.IllegalTransition):
        return f"it is {outcome.prev}"
    if isinstance(outcome, sessions.StaleGeneration):
        return f"a newer generation {outcome.current} exists"
    return "it no longer exists"


def _finish_turn_row(state: sqlite3.Connection, turn_id: str, status: str, stream: TurnParser, error: str | None,
                     exit_code: int | None = None, usage: Usage | None = None) -> None:
    input_tokens, output_tokens, cost = usage or stream.usage()
    turn_rows.finish(state, turn_id, status, input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost,
                     tool_calls=stream.tool_calls, session_id=stream.session_id,
                     error=error if exit_code is None else (f"{error} [exit {exit_code}]" if error else None))


class _NoOutput(TurnParser):
    """The parser of a turn that never started (its runtime could not even be named)."""

    def feed(self, line: str, *, now: float | None = None) -> list[ParsedEvent]:
        return []

    @property
    def finished(self) -> bool:
        return False

    @property
    def succeeded(self) -> bool:
        return False

    def failure(self, *, resumed: bool) -> TurnFailure:
        return TurnFailure(PERMANENT, "the turn did not start")

    def usage(self) -> Usage:
        return Usage()
