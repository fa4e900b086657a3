"""The project's persistent coordinator: start it, mail it, ask it, stop it.

The coordinator is an ordinary spawn-per-turn agent (capability ``coordinator``,
name ``coordinator``, parent ``operator``, depth 0) with two differences:

- it works at the project root, with no worktree or branch, so its instructions
  and hook settings live in ``.overstory/run/coordinator/`` and reach the runtime
  as ``--append-system-prompt`` / ``--settings`` each turn (never in the user's own
  ``.claude/``);
- it is persistent: a finished turn never completes it; only ``stop`` does.

``start`` opens a run (or rejoins the one left open by a coordinator that was
stopped while its agents were still working). ``stop`` stops the coordinator and,
when nothing in its run is active any more, completes the run; with
``stop_children`` it stops the run's other agents first (deepest first), so the run
always completes.
"""

from __future__ import annotations

import os
import sqlite3
import time
import typing as t
from dataclasses import dataclass, field

from overstory.clock import iso, now_ms
from overstory.errors import CoordinatorNotRunning, CoordinatorRunning, HierarchyError, NoReply, OrchestratorError
from overstory.paths import ProjectPaths
from overstory.store import mail, mail_queries, runs, sessions
from overstory.store.sessions import Session

if t.TYPE_CHECKING:
    from pathlib import Path

    from overstory.config.model import Config

COORDINATOR = "coordinator"
COORDINATION_TASK = "coordination"
ASK_POLL_SECONDS = 0.2
# Also the "task" section of its instructions, which it sees on every turn: keep it standing, not turn-specific.
START_PROMPT = (
    "Coordinate whatever the operator sends you. Objectives arrive as `dispatch` mail from `operator`, "
    "questions as `question` mail (answer them with `ov mail reply ID`), and every report from your agents "
    "arrives as mail too; each message starts one turn. A turn with nothing to act on (such as the first "
    "one, which only says your session started) gets a one-line reply and ends."
)


def active_coordinator(conn: sqlite3.Connection) -> Session | None:
    """The active (non-terminal) coordinator, whatever its name."""
    name = sessions.coordinator_name(conn, active=True)
    return sessions.get(conn, name) if name is not None else None


def require_coordinator(conn: sqlite3.Connection) -> Session:
    agent = active_coordinator(conn)
    if agent is None:
        raise CoordinatorNotRunning()
    return agent


# ---- start ---------------------------------------------------------------------------


@dataclass
class StartResult:
    name: str
    generation: int
    run_id: str
    run_created: bool
    runtime: str
    loop_pid: int | None
    instructions: str
    settings: str
    run_budget: dict[str, t.Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def start(project: ProjectPaths, config: Config, conn: sqlite3.Connection, *, runtime: str | None = None,
          model: str | None = None, scenario: Path | None = None,
          environ: t.Mapping[str, str] | None = None, budget: t.Mapping[str, t.Any] | None = None) -> StartResult:
    """Open (or rejoin) the run, set its budget, and sling the coordinator at the project root."""
    from overstory.agents.budgeting import open_run_budget
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.runtimes import get_runtime
    from overstory.store import budgets

    environ = dict(os.environ if environ is None else environ)
    caller = environ.get("OVERSTORY_AGENT_NAME")
    if caller:
        raise HierarchyError(f"{caller} is an agent: only the operator starts the coordinator")
    running = active_coordinator(conn)
    if running is not None:
        raise CoordinatorRunning(running.name, running.state, running.run_id)
    run, created = runs.open_or_join(conn, COORDINATOR)
    try:
        run_budget = open_run_budget(conn, config, run, budget)
    except BaseException:
        if created:
            runs.discard_if_unused(conn, run.id)
        raise
    request = SlingRequest(capability="coordinator", task_id=COORDINATION_TASK, name=COORDINATOR,
                           prompt=START_PROMPT, parent="operator", runtime=runtime, model=model, scenario=scenario,
                           at_project_root=True, tmux=False)  # always headless spawn-per-turn
    try:
        result = sling(project, config, conn, request, environ)
    except BaseException:
        if created and runs.discard_if_unused(conn, run.id):
            budgets.discard_run(conn, run.id)
        raise
    run_dir = project.run_dir / COORDINATOR
    adapter = get_runtime(result.runtime)
    instructions, settings = run_dir / adapter.run_instructions_file, run_dir / adapter.run_settings_file
    home = adapter.state_dir(run_dir)
    if home is not None and home.is_dir() and not instructions.exists():
        instructions = settings = home  # the runtime reads both from its own ov-owned home
    return StartResult(name=result.name, generation=result.generation, run_id=result.run_id or run.id,
                       run_created=created, runtime=result.runtime, loop_pid=result.loop_pid,
                       instructions=str(instructions), settings=str(settings),
                       run_budget={k: run_budget.limit(k) for k in budgets.LIMITS})


# ---- mail ----------------------------------------------------------------------------


def _subject(prefix: str, text: str, subject: str | None) -> str:
    if subject and subject.strip():
        return subject.strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        raise OrchestratorError(f"the {prefix} is empty")
    return f"{prefix}: {first[:72]}{'…' if len(first) > 72 else ''}"


def send(conn: sqlite3.Connection, objective: str, *, subject: str | None = None, priority: str = "normal",
         env: t.Mapping[str, str] | None = None) -> int:
    """Mail the coordinator an objective (a ``dispatch``); returns the message id."""
    env = os.environ if env is None else env
    agent = require_coordinator(conn)
    ids = mail.send(conn, sender=mail.default_sender(env), to=agent.name, type="dispatch", priority=priority,
                    subject=_subject("objective", objective, subject), body=objective,
                    payload={"task_id": COORDINATION_TASK, "capability": "coordinator"}, env=env)
    return ids[0]


@dataclass
class Answer:
    question_id: int
    reply: mail.Message
    waited_seconds: float

    def as_dict(self) -> dict[str, t.Any]:
        return {"question_id": self.question_id, "waited_seconds": round(self.waited_seconds, 3),
                "reply": self.reply.as_dict()}


def ask(conn: sqlite3.Connection, question: str, *, timeout: float, subject: str | None = None,
        env: t.Mapping[str, str] | None = None, poll: float = ASK_POLL_SECONDS,
        on_sent: t.Callable[[int], None] | None = None) -> Answer:
    """Mail the coordinator a ``question`` and wait for the reply in the same thread.

    Raises CoordinatorNotRunning at once when there is no coordinator, and NoReply
    when ``timeout`` seconds pass (or the coordinator stops) without an answer; the
    question then stays in the coordinator's inbox and a late answer lands in the
    asker's. The reply is marked read.
    """
    env = os.environ if env is None else env
    agent = require_coordinator(conn)
    asker = mail.default_sender(env)
    started = time.monotonic()
    question_id = mail.send(conn, sender=asker, to=agent.name, type="question", priority="high",
                            subject=_subject("question", question, subject), body=question, env=env)[0]
    if on_sent is not None:
        on_sent(question_id)
    deadline = started + max(timeout, 0)
    while True:
        reply_id = mail_queries.reply_in_thread(conn, question_id, asker)
        if reply_id is not None:
            reply = mail.read_message(conn, reply_id, reader=asker)
            return Answer(question_id, reply, time.monotonic() - started)
        current = sessions.get(conn, agent.name)
        if current is None or current.generation != agent.generation or current.is_terminal \
                or current.state == "parked":
            from overstory.views.waiting import EXIT_ERROR, code_of

            state = current.state if current is not None else "gone"
            why = f": {current.state_reason}" if current is not None and current.state_reason else ""
            code = code_of(current) if current is not None and current.state != "completed" else EXIT_ERROR
            raise NoReply(f"the coordinator is {state}{why}; question #{question_id} is not answered yet",
                          exit_code=code or EXIT_ERROR)
        if time.monotonic() >= deadline:
            from overstory.views.waiting import EXIT_TIMEOUT

            raise NoReply(f"no answer from the coordinator within {timeout:g}s; question #{question_id} stays in its "
                          f"inbox and a later answer will arrive in yours (`ov mail list --to {asker}`)",
                          exit_code=EXIT_TIMEOUT)
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.01)))


# ---- status --------------------------------------------------------------------------


def status(conn: sqlite3.Connection, *, now: int | None = None) -> dict[str, t.Any]:
    """The coordinator (the active one, else the last one), its run, its children and its mail."""
    from overstory.views.status import agent_entry

    now = now_ms() if now is None else now
    agent = active_coordinator(conn)
    if agent is None:
        name = sessions.coordinator_name(conn, active=False)
        agent = sessions.get(conn, name) if name is not None else None
    if agent is None:
        return {"running": False, "coordinator": None, "run": None, "children": [], "last_report": None}
    pending = mail.pending_count(conn, agent.name)
    run = runs.get_run(conn, agent.run_id) if agent.run_id else None
    children = [{"name": c.name, "capability": c.capability, "task_id": c.task_id, "state": c.state}
                for c in sessions.list_sessions(conn) if c.parent == agent.name]
    last = mail_queries.last_to_operator(conn, agent.name)
    last_report = mail.get(conn, last) if last is not None else None
    return {
        "running": not agent.is_terminal,
        "coordinator": agent_entry(agent, now, pending),
        "run": run.as_dict() if run else None,
        "children": children,
        "last_report": None if last_report is None else {
            "id": last_report.id, "type": last_report.type, "subject": last_report.subject,
            "created_at": iso(last_report.created_at), "read": last_report.is_read},
    }


# ---- stop ----------------------------------------------------------------------------


@dataclass
class CoordinatorStop:
    coordinator: dict[str, t.Any]
    stopped_agents: list[dict[str, t.Any]] = field(default_factory=list)
    run_id: str | None = None
    run_status: str | None = None
    still_active: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def stop(project: ProjectPaths, config: Config, conn: sqlite3.Connection, *, stop_children: bool = False,
         force: bool = False) -> CoordinatorStop:
    """Stop the coordinator (first, with ``stop_children``, every other active agent of its run).

    The run is completed when nothing in it is active any more; otherwise it stays
    open, and the next `ov coordinator start` rejoins it so the remaining agents have
    someone to report to.
    """
    from overstory.agents.stop import stop_agent

    agent = require_coordinator(conn)
    stopped: list[dict[str, t.Any]] = []
    if stop_children and agent.run_id:
        for name in runs.active_agents(conn, agent.run_id):  # deepest first
            if name == agent.name:
                continue
            stopped.append(stop_agent(project, conn, name, force=force, kill_grace=config.turns.kill_grace).as_dict())
    own = stop_agent(project, conn, agent.name, force=force, kill_grace=config.turns.kill_grace)
    result = CoordinatorStop(coordinator=own.as_dict(), stopped_agents=stopped, run_id=agent.run_id)
    if agent.run_id:
        result.still_active = runs.active_agents(conn, agent.run_id)
        if not result.still_active:
            run, changed = runs.complete(conn, agent.run_id)
            result.run_status = run.status
            if changed:
                from overstory.agents.run_files import run_ended

                run_ended(project, conn, run.id, config)  # a crash before it: the watchdog does it
        else:
            run_now = runs.get_run(conn, agent.run_id)
            result.run_status = run_now.status if run_now else None
    return result
