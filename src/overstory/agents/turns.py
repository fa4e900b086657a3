"""One headless turn: hand the runtime's command to the agent's executor, feed it one user message, watch its
stream, settle.

The executor (``agents.turn_exec``: ``local`` by default, or ``ray``) runs it in its own process group so that
the whole group (including any shell commands the model started) can be stopped on a stall or an operator stop.
Everything runtime-specific (command line, message format, stream parsing, failure
classes) comes from the agent's runtime adapter (``runtimes.base.Runtime``).
"""

from __future__ import annotations

import contextlib
import os
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import jsontext, procs, sandbox
from overstory.agents import checkpoint, ledger, run_files, turn_exec
from overstory.agents.models import model_choice, provider_of  # re-exported: callers and tests ask turns for them
from overstory.agents.spending import ToolCallGate, TurnMeter
from overstory.agents.turn_stream import PARKING_STATUS, _pump
from overstory.clock import now_ms
from overstory.errors import OrchestratorError
from overstory.executors.base import TurnSpec
from overstory.paths import ProjectPaths
from overstory.runtimes import get_runtime, ollama
from overstory.runtimes.base import (
    PERMANENT,
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
from overstory.store.sqlite_module import sqlite3

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.executors.base import TurnExecutor
    from overstory.runtimes.base import Runtime

# Variables a parent coding-agent session exports; a nested session would react to them.
NESTED_SESSION_VARS = ("CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT")


@dataclass
class TurnResult:
    """How one turn ended, and what the loop does next."""
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
        "OVERSTORY_WRITE_SCOPE": "\n".join(agent.spec.get("write_scope") or ()),  # guards.scope.ENV (--files)
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
    if config.guards.mail_polling == "refuse":
        from overstory.guards.policy import MAIL_POLLING_ENV

        env[MAIL_POLLING_ENV] = "refuse"
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


@dataclass
class TurnPlan:
    """What a turn will run, decided before it touches anything."""

    runtime: Runtime
    stream: TurnParser
    model: str | None
    argv: list[str]  # before the sandbox wraps it
    env: dict[str, str]
    dispatch: list[int]  # the mail the turn claimed


@dataclass
class _Turn:
    """One turn under way: what it was asked, its plan, and what its steps made so far."""

    project: ProjectPaths
    config: Config
    state: sqlite3.Connection
    events: sqlite3.Connection
    agent: Session
    prompt: str
    turn_id: str
    resume_session_id: str | None
    base_env: t.Mapping[str, str]
    attempt: int
    should_stop: t.Callable[[], bool]
    extra_env: t.Mapping[str, str] | None
    settings_file: Path | None
    env_ready: t.Callable[[t.Mapping[str, str]], None] | None
    gate: ToolCallGate | None
    started_ms: int = 0
    fork_session: bool = False  # resume_session_id is another agent's: continue it in a new session (ov resume --fork)
    plan: TurnPlan | None = None
    failed: TurnResult | None = None  # why no plan could be made
    argv: list[str] = field(default_factory=list)  # as the sandbox runs it
    env: dict[str, str] = field(default_factory=dict)
    meter: TurnMeter | None = None
    stream_ledger: ledger.StreamLedger | None = None
    files: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the turn's stdout and stderr logs
    raw_out: t.IO[bytes] | None = None
    executor: TurnExecutor | None = None
    run: turn_exec.ExecutorProcess | None = None  # the turn's process, as its executor reports it
    pgid: int = 0
    ticks: int | None = None
    status: str = ""
    reason: str = ""
    exit_code: int = 0

    @property
    def log_dir(self) -> Path:
        return self.project.logs_dir / self.agent.name / self.turn_id

    @property
    def cwd(self) -> str:
        return self.agent.worktree or str(self.project.root)


def run_turn(project: ProjectPaths, config: Config, state: sqlite3.Connection, events: sqlite3.Connection,
             agent: Session, prompt: str, turn_id: str, *, resume_session_id: str | None,
             base_env: t.Mapping[str, str], attempt: int = 0, should_stop: t.Callable[[], bool] = lambda: False,
             extra_env: t.Mapping[str, str] | None = None, settings_file: Path | None = None,
             env_ready: t.Callable[[t.Mapping[str, str]], None] | None = None,
             gate: ToolCallGate | None = None, fork_session: bool = False) -> TurnResult:
    """Run one turn of ``agent`` in its sandbox. ``extra_env``: variables for this turn only (the endpoint's
    per-turn secret; an `ov loop` names its iteration and phase there). ``settings_file``: the loop's HTTP
    hooks instead of the command hooks; ``env_ready`` is told the turn's whole environment before it starts;
    ``gate``: where the endpoint's tool-call hooks wait for this turn's stream to be priced (``spending``).

    Plan (``plan_turn``: touches nothing), then the named steps (``TURN_STEPS``; a test can kill the
    loop after any of them with ``OV_TEST_KILL_AT=turn:<step>``), then settle (``_settle``). A local turn's shim
    is started first and waits for the launch (``turn_exec.prepare_local``); on every way out that does not
    reach the launch it is ended here (a loop that dies leaves it the end of its pipe: it exits too)."""
    started_ms = now_ms()
    prepared = turn_exec.prepare_local(project, config, agent)
    turn = _Turn(project, config, state, events, agent, prompt, turn_id, resume_session_id, base_env, attempt,
                 should_stop, extra_env, settings_file, env_ready, gate, started_ms=started_ms,
                 fork_session=fork_session)
    try:
        return _run_steps(turn)
    finally:
        if prepared is not None:
            prepared.discard_prepared()  # nothing left to discard once the launch submitted the turn


def _run_steps(turn: _Turn) -> TurnResult:
    try:
        turn.plan = plan_turn(turn)
    except OrchestratorError as exc:  # config or installation problem: retrying the turn would not help
        turn.failed = TurnResult("permanent", str(exc), None, turn.started_ms, _NoOutput())
    except OSError as exc:
        turn.failed = TurnResult("transient", f"could not prepare the turn's sandbox: {exc}", None, turn.started_ms,
                                 _NoOutput())
    with turn.files:
        for name, act in TURN_STEPS:
            ended = act(turn)
            if ended is not None:
                return ended
            procs.kill_point(f"turn:{name}")
    return _settle(turn)


def plan_turn(turn: _Turn) -> TurnPlan:
    """The runtime, its command line and the turn's environment, from the agent, the configuration and the
    mail the turn claimed. Reads only."""
    agent, config = turn.agent, turn.config
    runtime = get_runtime(agent.runtime)
    stream = runtime.new_parser()
    model, provider_env = resolve_model_and_provider(agent, config, turn.base_env)
    config = turn.config = ollama.priced_at_zero(config, provider_of(agent.model, agent.capability, config), model)
    scenario = Path(agent.spec["scenario"]) if agent.spec.get("scenario") else None
    argv = runtime.headless_command(TurnRequest(model=model, resume_session_id=turn.resume_session_id,
                                                run_dir=turn.project.run_dir / agent.name,
                                                at_project_root=not agent.worktree, scenario=scenario,
                                                provider_env=provider_env,
                                                sandboxed=sandbox.effective_mode(config).name == "bwrap",
                                                settings_file=turn.settings_file,
                                                fork_session=turn.fork_session), config)
    dispatch = claimed_ids(turn.state, turn.turn_id)
    provider_env.update(durable_env(config, agent, turn.attempt, dispatch))
    env = turn_environment(turn.base_env, agent, turn.project, turn.turn_id,
                           {**provider_env, **(turn.extra_env or {})})
    return TurnPlan(runtime, stream, model, list(argv), env, list(dispatch))


# ---- the steps ----------------------------------------------------------------------------


def _logs(turn: _Turn) -> None:
    turn.log_dir.mkdir(parents=True, exist_ok=True)
    (turn.log_dir / "prompt.txt").write_text(turn.prompt, encoding="utf-8")


def _sandbox(turn: _Turn) -> TurnResult | None:
    """The sandbox's housekeeping and the command line that runs the turn inside it."""
    if turn.failed is not None:
        return turn.failed
    assert turn.plan is not None
    agent = turn.agent
    try:
        prepared = sandbox.prepare_turn(turn.project, turn.config, agent, turn.plan.argv, turn.plan.env,
                                        launch_env=turn.base_env)
    except OrchestratorError as exc:  # config or installation problem: retrying the turn would not help
        return TurnResult("permanent", str(exc), None, turn.started_ms, _NoOutput())
    except OSError as exc:
        return TurnResult("transient", f"could not prepare the turn's sandbox: {exc}", None, turn.started_ms,
                          _NoOutput())
    _record_take_back(turn.events, agent, turn.turn_id, prepared.took_back, before=True)
    turn.argv, turn.env = prepared.argv, prepared.env
    if turn.env_ready is not None:
        turn.env_ready(turn.env)
    return None


def _record(turn: _Turn) -> None:
    """The turn's row, its command line, its checkpoint: from here on a crash leaves a turn to settle."""
    assert turn.plan is not None
    state, agent, turn_id, plan = turn.state, turn.agent, turn.turn_id, turn.plan
    turn_rows.start(state, turn_id, agent=agent.name, generation=agent.generation, number=agent.turns + 1,
                    attempt=turn.attempt, resumed=bool(turn.resume_session_id), started_ms=turn.started_ms,
                    log_dir=str(turn.log_dir))
    turn_rows.label(state, turn_id, capability=agent.capability, run_id=agent.run_id, model=plan.model)
    turn.meter = TurnMeter(state, agent, turn.config, model=plan.model)
    (turn.log_dir / "command.json").write_text(jsontext.dumps(turn.argv), encoding="utf-8")
    stale = checkpoint.clear_stale_git_locks(agent.worktree, agent.branch)
    if stale:
        event_store.record(turn.events, "git_lock_removed", agent=agent.name, generation=agent.generation,
                           turn_id=turn_id,
                           summary=f"removed stale git lock(s) left by a killed process: {', '.join(stale)}"[:300])
    checkpoint.save_start(state, agent, turn_id, attempt=turn.attempt, scope=turn_scope(turn.env),
                          mail_ids=plan.dispatch, resume_session_id=turn.resume_session_id, cwd=turn.cwd,
                          started_ms=turn.started_ms)
    # Receipts come from the stream (a headless turn has no PostToolUse hook); without a PreToolUse hook
    # (`ov guard` never runs) the rows do too.
    runtime = plan.runtime
    turn.stream_ledger = ledger.StreamLedger(state, ledger.LedgerContext.from_env(turn.env)
                                             or ledger.LedgerContext(agent.name),
                                             receipts_only="pre" in runtime.tool_hooks,
                                             hook_call=None if runtime.hook_ids_match else runtime.hook_call,
                                             hook_receipts=runtime.hook_receipts)


def _launch(turn: _Turn) -> TurnResult | None:
    """The turn handed to its executor (``agents.turn_exec``) with the prompt on its stdin; its process group
    (on this machine) and its node noted on the turn's row and the agent's."""
    assert turn.plan is not None and turn.meter is not None
    state, agent, turn_id, stream = turn.state, turn.agent, turn.turn_id, turn.plan.stream
    turn.raw_out = turn.files.enter_context(open(turn.log_dir / "stdout.ndjson", "wb"))
    try:
        executor = turn.executor = turn_exec.executor_for(turn.project, turn.config, agent)
        travel = {} if executor.kind == "local" else turn_exec.travel_for(
            turn.project, turn.config, agent, turn.env, turn.plan.argv, turn.plan.env)
        executor.submit(TurnSpec(turn_id, tuple(turn.argv), turn.cwd, turn.env, travel=travel,
                                 stdin=turn.plan.runtime.stdin_message(turn.prompt), labels={"agent": agent.name}))
        status = executor.status(turn_id)
    except OrchestratorError as exc:  # no executor here (the ray extra, the cluster): retrying would not help
        _finish_turn_row(state, turn_id, "failed", stream, f"cannot start runtime: {exc}")
        return TurnResult("permanent", str(exc), None, turn.started_ms, stream)
    if status.state == "failed" or (status.state == "lost" and status.pid is None):
        _finish_turn_row(state, turn_id, "failed", stream, f"cannot start runtime: {status.reason}")
        return TurnResult("permanent", status.reason, None, turn.started_ms, stream)
    pid, turn.ticks = turn_exec.local_group(executor, turn_id)  # the runtime's group, not its shim's
    turn.pgid = pid or 0
    turn.run = turn_exec.ExecutorProcess(executor, turn_id, state, status.node)
    turn_rows.mark_running(state, turn_id, pid=status.pid, pgid=pid, node=status.node)
    if not sessions.update_fields(state, agent.name, agent.generation, turn_pgid=pid, turn_start_ticks=turn.ticks,
                                  current_turn_id=turn_id, last_activity=now_ms()):
        executor.stop(turn_id, grace=0)
        _finish_turn_row(state, turn_id, "aborted", stream, "agent replaced before the turn started")
        return TurnResult("aborted", "agent was replaced by a newer generation", None, turn.started_ms, stream)
    if turn.gate is not None:
        turn.gate.open_turn(watch=turn.meter.enabled and turn.meter.watches_usd)
    return None


def _watch(turn: _Turn) -> None:
    """Read the stream until the runtime ends or the turn is stopped; then nothing of the turn is left running."""
    assert turn.plan is not None and turn.meter is not None and turn.run is not None and turn.raw_out is not None
    plan, run, meter, agent, config = turn.plan, turn.run, turn.meter, turn.agent, turn.config
    executor = run.executor
    reader = turn_exec.ExecutorLines(executor, turn.turn_id, turn.gate)
    try:
        turn.status, turn.reason = _pump(
            reader, turn.raw_out, run, plan.stream, turn.state, turn.events, agent, turn.turn_id, meter,
            stall_timeout=config.turns.stall_timeout, should_stop=turn.should_stop,
            price=lambda data: _price_result(data, plan.stream, plan.stream.model or plan.model, config),
            periodic=lambda: _record_take_back(turn.events, agent, turn.turn_id,
                                               sandbox.take_back(turn.project, agent)),
            stream_ledger=turn.stream_ledger,
            asked_session=None if turn.fork_session else turn.resume_session_id)
    finally:
        if turn.gate is not None:  # every call still waiting is answered: refused when the turn was stopped
            turn.gate.close_turn(meter.stopped_by)
        reader.close()
    status = turn.status
    stopping_at = time.monotonic()
    ended = turn_exec.end_of(executor, turn.turn_id, stopping=status != "running",
                             grace=config.turns.kill_grace if status == "running" else 0)  # stopped: at once
    turn.exit_code = ended.exit_code if ended.exit_code is not None else -1
    if status == "running" and ended.state in ("lost", "failed"):  # its node or worker died, or it could not run
        turn.status = "transient" if ended.state == "lost" else "permanent"
        turn.reason = f"the turn was {ended.state} on its executor ({executor.kind}): {ended.reason}"
    (turn.log_dir / "stderr.txt").write_text(executor.stderr_tail(turn.turn_id, 1 << 20), encoding="utf-8")
    executor.forget(turn.turn_id)
    if status in ("budget", "parked", "auth"):
        event_store.record(turn.events, "turn_stopped", agent=agent.name, generation=agent.generation,
                           turn_id=turn.turn_id, summary=f"{status}: process group {turn.pgid} stopped"[:300],
                           data={"status": status, "pgid": turn.pgid, "node": run.node,
                                 "stop_seconds": round(time.monotonic() - stopping_at, 3)})
    turn.files.close()  # the logs are complete (settling reads the end of stderr)


TURN_STEPS: tuple[tuple[str, t.Callable[[_Turn], TurnResult | None]], ...] = (
    ("logs", _logs), ("sandbox", _sandbox), ("record", _record), ("launch", _launch), ("watch", _watch))


def _settle(turn: _Turn) -> TurnResult:
    """The turn's verdict, its usage and cost on the rows, its checkpoint and its end event."""
    assert turn.plan is not None and turn.meter is not None
    state, events, agent, turn_id, config = turn.state, turn.events, turn.agent, turn.turn_id, turn.config
    stream, meter, exit_code, status, reason = turn.plan.stream, turn.meter, turn.exit_code, turn.status, turn.reason
    _record_take_back(events, agent, turn_id, sandbox.take_back(turn.project, agent))
    stream.finish(exit_code, _tail(turn.log_dir / "stderr.txt"))
    failure: TurnFailure | None = None
    if status == "running":
        if stream.succeeded:
            status, reason = "ok", "turn finished"
        else:
            failure = stream.failure(resumed=bool(turn.resume_session_id))
            status = PARKING_STATUS.get(failure.kind, failure.kind)
            reason = failure.reason + (f" (exit {exit_code})" if not stream.finished else "")
    reported = stream.usage()
    input_tokens, output_tokens, cost = priced_usage(stream, turn.plan.model, config)
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
                     usage=Usage(input_tokens, output_tokens, cost))
    detail = _cost_detail(stream, meter, estimated, cost)
    turn_rows.record_costs(state, turn_id, **detail)
    checkpoint.save_end(state, agent, turn_id, session_id=stream.session_id, cwd=turn.cwd, turn_status=status)
    event_store.record(events, "turn_end", agent=agent.name, generation=agent.generation, turn_id=turn_id,
                       summary=f"{status}: {reason}"[:300],
                       data={"status": status, "reason": reason, "exit_code": exit_code, "cost_usd": cost,
                             "cost_estimated": estimated, "input_tokens": input_tokens, "output_tokens": output_tokens,
                             "tool_calls": stream.tool_calls, "session_id": stream.session_id,
                             **({"price_notes": meter.notes} if meter.notes else {}),
                             **({"failure": failure.kind, "reset_at_ms": failure.reset_at_ms} if failure else {})})
    run_files.write_turn_metadata(turn.log_dir, run_files.turn_metadata(
        agent, turn_id, started_ms=turn.started_ms, ended_ms=now_ms(), attempt=turn.attempt,
        model=detail["model"] or turn.plan.model, session=stream.session_id, status=status, reason=reason,
        exit=exit_code, cost_usd=cost, cost_estimated=estimated, input_tokens=input_tokens,
        output_tokens=output_tokens, tool_calls=stream.tool_calls))
    crossing = meter.stopped_by.crossing if meter.stopped_by is not None else None
    return TurnResult(status, reason, stream.session_id, turn.started_ms, stream, crossing=crossing,
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


def priced_usage(stream: TurnParser, model: str | None, config: Config) -> Usage:
    """The turn's usage; dollars from the price table (``overstory.runtimes.prices``) when the runtime reported none.

    A model the table does not know is priced as the most expensive known one (as budgets
    price it live), not as free: an unknown model must not make a budget blind.
    """
    usage = stream.usage()
    if getattr(config, "priced_at_zero", False):  # a local model (overstory.runtimes.ollama): whatever the CLI says it costs
        return usage._replace(cost_usd=0.0)
    if usage.cost_usd or not (usage.input_tokens or usage.output_tokens):
        return usage
    return usage._replace(cost_usd=_table_cost(stream, model, usage.input_tokens, usage.output_tokens, config))


def _table_cost(stream: TurnParser, model: str | None, input_tokens: int, output_tokens: int, config: Config) -> float:
    """The price table's figure: by kind of token where the runtime said them (cached input is cheaper),
    else all input as fresh input."""
    from overstory.runtimes.prices import PriceTable, Tokens

    table = PriceTable(config.prices)
    by_kind = stream.live_usage()
    if by_kind and not stream.live_cost_usd():
        return table.cost({name or stream.model or model or "": tokens for name, tokens in by_kind.items()})[0]
    return table.lookup(stream.model or model).price.cost(Tokens(input_tokens, output_tokens))


def _price_result(data: dict[str, t.Any], stream: TurnParser, model: str | None, config: Config) -> None:
    """Fill in a turn_result event's cost from the price table when the runtime did not report one."""
    if data.get("total_cost_usd"):
        return
    data["total_cost_usd"] = _table_cost(stream, model, int(data.get("input_tokens") or 0),
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
