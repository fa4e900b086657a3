"""Budget decisions about agents: their limits at sling, parking at a crossing, resuming.

The numbers live in ``store.budgets``; this module decides what they mean for agents:
which limits a new agent gets (config ``budgets.agent``, overridden by `ov sling`,
never beyond what is left of its run's), who parks when a limit is crossed (the agent,
or every active agent of a run), and what `ov resume` / `ov run resume` do.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from overstory.clock import now_ms
from overstory.errors import BudgetExhausted, OrchestratorError
from overstory.paths import ProjectPaths
from overstory.store import budgets, lifecycle, runs, sessions
from overstory.store.budgets import Crossing
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.runtimes.base import Runtime


def agent_limits(conn: sqlite3.Connection, config: Config, run_id: str | None,
                 requested: t.Mapping[str, t.Any] | None, runtime: Runtime | None = None, *,
                 capability: str | None = None) -> tuple[dict[str, t.Any], list[str]]:
    """A new agent's limits: config defaults, then the request, clamped to what its run has left; and notes
    (a limit lowered to the run's; dollars that ``runtime`` lets ov check only between turns).

    A persistent agent of a run (the coordinator) lives as long as the run: config ``budgets.agent``
    (sized for one task) does not apply to it, the run's budget does (and what `ov sling` asks for).
    """
    persistent = run_id is not None and capability in lifecycle.PERSISTENT_CAPABILITIES
    limits = {} if persistent else dict(config.budgets.agent.model_dump())
    limits.update({k: v for k, v in (requested or {}).items() if v is not None})
    run = budgets.get_run(conn, run_id) if run_id is not None else None
    notes: list[str] = []
    if run is not None:
        now = now_ms()
        crossing = run.crossing(now, starting_turn=True)
        if crossing is not None:
            raise BudgetExhausted(f"run {run_id} has no budget left ({crossing.reason}); raise it with "
                                  f"`ov run resume {run_id} --add-usd ...` before slinging more agents")
        limits, notes = budgets.clamp_to_run(limits, run, now)
    if runtime is not None and not runtime.usage_during_turn and limits.get("max_usd") is not None \
            and limits.get("max_tool_calls") is None:
        bound = "only max_wallclock bounds" if limits.get("max_wallclock") is not None else "nothing bounds"
        notes.append(f"{runtime.name} reports usage only when a turn ends: max_usd is checked between turns, "
                     f"and {bound} one turn's spend; add --max-tool-calls")
    return limits, notes


def open_run_budget(conn: sqlite3.Connection, config: Config, run: runs.Run,
                    requested: t.Mapping[str, t.Any] | None) -> budgets.Budget:
    """The run's budget row: config ``budgets.run`` for a new run, then the limits asked for."""
    existing = budgets.get_run(conn, run.id)
    limits = {} if existing is not None else dict(config.budgets.run.model_dump())
    limits.update({k: v for k, v in (requested or {}).items() if v is not None})
    return budgets.ensure_run(conn, run.id, started_at=run.started_at, limits=limits)


# ---- crossing -------------------------------------------------------------------------


def park_for_crossing(conn: sqlite3.Connection, agent: Session, crossing: Crossing, *, actor: str,
                      expect: t.Collection[str] | None = None, note: str | None = None) -> list[str]:
    """Park ``agent`` for ``crossing``; a run crossing parks every active agent of the run.

    An agent's own crossing sends its parent one escalation. A run crossing sends one
    escalation, to the operator (the run's budget is theirs), inside the transaction of
    the first park that succeeds (its dedup key keeps it single); returns the names
    that were parked.
    """
    details = crossing.as_dict()
    if crossing.scope == budgets.AGENT:
        outcome = lifecycle.park(conn, agent, "budget", crossing.reason, actor=actor, details=details, expect=expect,
                                 note=note)
        return [agent.name] if outcome.ok else []
    names = [agent.name] + [name for name in runs.active_agents(conn, crossing.name) if name != agent.name]
    parked: list[str] = []
    for name in names:
        member = agent if name == agent.name else sessions.get(conn, name)
        if member is None or member.state == "parked" or member.is_terminal:
            continue
        outcome = lifecycle.park(conn, member, "budget", crossing.reason, actor=actor, escalate=False,
                                 expect=expect if name == agent.name else None,
                                 also=None if parked else _operator_escalation(crossing, names))
        if outcome.ok:
            parked.append(name)
    return parked


def _operator_escalation(crossing: Crossing, names: list[str]) -> t.Callable[[sqlite3.Connection], None]:
    def insert(tx: sqlite3.Connection) -> None:
        from overstory.store import mail

        mail.insert_message(
            tx, sender="ov", recipient="operator", type="escalation", priority="high",
            subject=f"run {crossing.name} parked: {crossing.reason}"[:200],
            body=(f"Run {crossing.name} reached its budget ({crossing.reason}). Every active agent of the run is "
                  f"parked ({', '.join(names)}); their unread mail stays in their inboxes and no new turn starts. "
                  f"To go on: `ov run resume {crossing.name} --add-usd 5` (or --add-turns, --add-tool-calls, "
                  "--add-time)."),
            payload={"severity": "error", "kind": "budget", "reason": crossing.reason,
                     "details": {**crossing.as_dict(), "agents": names}},
            dedup_key=f"run_budget:{crossing.name}:{crossing.limit}:{crossing.maximum}")

    return insert


# ---- resuming -------------------------------------------------------------------------


@dataclass
class ResumeResult:
    """What `ov resume` did to one agent's budget."""

    name: str
    previous_state: str
    park_kind: str | None
    unparked: bool
    budget: dict[str, t.Any] | None
    refreshed_credentials: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def _adds(add_usd: float, add_turns: int, add_tool_calls: int, add_seconds: float) -> dict[str, t.Any]:
    if min(add_usd, add_turns, add_tool_calls, add_seconds) < 0:
        from overstory.errors import UsageError

        raise UsageError("--add-usd, --add-turns, --add-tool-calls and --add-time must not be negative")
    return {"add_usd": add_usd, "add_turns": add_turns, "add_tool_calls": add_tool_calls, "add_seconds": add_seconds}


def resume_agent(project: ProjectPaths, config: Config, conn: sqlite3.Connection, name: str, *,
                 add_usd: float = 0, add_turns: int = 0, add_tool_calls: int = 0, add_seconds: float = 0,
                 add_iterations: int = 0, environ: t.Mapping[str, str] | None = None) -> ResumeResult:
    """Raise ``name``'s limits and un-park it; its loop continues the same runtime session.

    An `ov loop` (which starts a fresh session per iteration) also takes ``add_iterations``
    (its max_iterations and its current phase's); ``add_usd`` raises its phase's max_usd too.
    """
    adds = _adds(add_usd, add_turns, add_tool_calls, add_seconds)
    agent = sessions.get(conn, name)
    if agent is None:
        raise sessions.agent_not_found(conn, name)
    if agent.is_terminal:
        raise OrchestratorError(f"{name} is {agent.state}: there is nothing to resume; sling it again")
    if add_iterations and not agent.spec.get("loop"):
        from overstory.errors import UsageError

        raise UsageError(f"{name} is not an `ov loop`: --add-iterations is for loops")
    if agent.spec.get("loop"):
        _raise_loop_limits(conn, agent, add_iterations, add_usd)
    budget = budgets.raise_limits(conn, budgets.AGENT, name, agent.generation, **adds)
    result = ResumeResult(name, agent.state, agent.park_kind, False, budget.as_dict() if budget else None)
    if agent.state != "parked":
        return result
    crossing = budgets.check(conn, name, agent.generation, starting_turn=True)
    if crossing is not None:
        if crossing.scope == budgets.RUN:
            raise BudgetExhausted(f"{name} stays parked: {crossing.reason}; raise the run's budget with "
                                  f"`ov run resume {crossing.name} --add-usd ...`")
        hint = {"max_usd": "--add-usd", "max_turns": "--add-turns", "max_tool_calls": "--add-tool-calls",
                "max_wallclock": "--add-time"}[crossing.limit]
        raise BudgetExhausted(f"{name} stays parked: {crossing.reason}; give it more with `ov resume {name} {hint} ...`")
    if agent.park_kind == "loop":
        _check_loop_limits(conn, agent)
    if agent.park_kind == "auth":
        result.refreshed_credentials = refresh_credentials(project, config, agent, environ)
    outcome = lifecycle.unpark(conn, agent, actor="operator", reason="resumed by the operator")
    result.unparked = bool(outcome and outcome.ok)
    if result.unparked:
        _event(project, agent, "agent_resumed", f"resumed by the operator (was parked: {agent.state_reason})")
    return result


def _raise_loop_limits(conn: sqlite3.Connection, agent: Session, add_iterations: int, add_usd: float) -> None:
    from overstory.store import loops

    if add_iterations < 0:
        from overstory.errors import UsageError

        raise UsageError("--add-iterations must not be negative")
    if add_iterations:
        loops.add_iterations(conn, agent.name, agent.generation, add_iterations)
    if add_usd:
        loops.add_phase_usd(conn, agent.name, agent.generation, add_usd)


def _check_loop_limits(conn: sqlite3.Connection, agent: Session) -> None:
    """A loop parked at an iteration limit stays parked until that limit is raised."""
    from overstory.agents.iterations.spec import limit_reached
    from overstory.store import loops

    loop = loops.get(conn, agent.name, agent.generation)
    if loop is None:
        return
    last = loops.last_attempt(conn, agent.name, agent.generation)
    following = 1 if last is None else int(last["number"]) + (0 if last["status"] == "interrupted" else 1)
    used, spent = loops.phase_usage(conn, loop)
    reason = limit_reached(loop, following, used, spent)
    if reason is not None:
        hint = "--add-usd" if "max_usd" in reason else "--add-iterations"
        raise BudgetExhausted(f"{agent.name} stays parked: {reason}; give it more with "
                              f"`ov resume {agent.name} {hint} ...`")


def resume_from_request(project: ProjectPaths, config: Config, conn: sqlite3.Connection, name: str, *,
                        add_usd: float | None = None, add_turns: int | None = None,
                        add_time: str | None = None) -> dict[str, t.Any]:
    """``resume_agent`` for callers that hold text (`ov serve`): ``add_time`` as `ov resume --add-time` takes it."""
    from overstory.clock import parse_duration
    from overstory.errors import UsageError

    try:
        seconds = parse_duration(add_time) if add_time else 0.0
    except ValueError as exc:
        raise UsageError(f"add_time: {exc}") from None
    return resume_agent(project, config, conn, name, add_usd=add_usd or 0.0, add_turns=add_turns or 0,
                        add_seconds=seconds).as_dict()


def refresh_credentials(project: ProjectPaths, config: Config, agent: Session,
                        environ: t.Mapping[str, str] | None) -> list[str]:
    """Copy the runtime's credential variables from the operator's environment into the agent's.

    An agent parked for a rejected key runs its turns in the environment it was slung
    in; `ov resume` after fixing the key brings the new one along.
    """
    import os

    from overstory.agents.process import env_file, load_launch_env, save_launch_env
    from overstory.runtimes import get_runtime

    environ = os.environ if environ is None else environ
    names = list(get_runtime(agent.runtime).credential_vars)
    choice = agent.model or config.models.get(agent.capability) or config.runtime.model
    if choice and "/" in choice and choice.partition("/")[0] in config.providers:
        names.append(config.providers[choice.partition("/")[0]].api_key_env)
    if not env_file(project, agent.name).is_file():
        return []
    launch = load_launch_env(project, agent.name)
    changed = [n for n in names if environ.get(n) and launch.get(n) != environ[n]]
    if changed:
        launch.update({n: environ[n] for n in changed})
        save_launch_env(project, agent.name, launch)
    return changed


@dataclass
class RunResumeResult:
    """What `ov resume --run` did to a run's budget."""

    run_id: str
    budget: dict[str, t.Any]
    unparked: list[str]

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def resume_run(project: ProjectPaths, conn: sqlite3.Connection, run_id: str, *, add_usd: float = 0,
               add_turns: int = 0, add_tool_calls: int = 0, add_seconds: float = 0) -> RunResumeResult:
    """Raise the run's limits and un-park its agents parked for a budget (each re-checks its own)."""
    adds = _adds(add_usd, add_turns, add_tool_calls, add_seconds)
    budget = budgets.raise_limits(conn, budgets.RUN, run_id, 0, **adds)
    if budget is None:
        raise OrchestratorError(f"run {run_id} has no budget; `ov coordinator start --budget-usd ...` sets one")
    crossing = budget.crossing(now_ms(), starting_turn=True)
    if crossing is not None:
        raise BudgetExhausted(f"run {run_id} stays parked: {crossing.reason}; add more")
    unparked = []
    for name in sessions.budget_parked_in_run(conn, run_id):
        agent = sessions.get(conn, name)
        if agent is None:
            continue
        outcome = lifecycle.unpark(conn, agent, actor="operator", reason=f"run {run_id} resumed by the operator",
                                   kinds={"budget"})
        if outcome is not None and outcome.ok:
            unparked.append(agent.name)
            _event(project, agent, "agent_resumed", f"run {run_id} resumed by the operator")
    return RunResumeResult(run_id, budget.as_dict(), unparked)


def _event(project: ProjectPaths, agent: Session, kind: str, summary: str) -> None:
    from overstory.store import events as event_store
    from overstory.store.db import open_events

    try:
        conn = open_events(project.events_db)
    except OrchestratorError:
        return
    try:
        event_store.record(conn, kind, agent=agent.name, generation=agent.generation, summary=summary[:300])
    except sqlite3.Error:
        pass
    finally:
        conn.close()
