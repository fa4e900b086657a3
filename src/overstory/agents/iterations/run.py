"""An `ov loop` agent at work: iterations in fresh sessions until ov itself says it is done.

The per-agent loop process (``agents.loop``) hands an agent whose row carries a loop
definition to ``IterationRunner``. Each iteration is one turn in a fresh runtime
session (never ``--resume``) of the same agent in the same worktree; its message is
built by ``loop_prompt``. After the turn ov runs the phase's gate (the check command,
or a file count) over the agent's branch. A phase ends only when the model's last message holds
the promise AND the gate passes; then ov saves a checkpoint, asks the critic if the spec
has one, and moves to the next phase or completes the agent (its parent gets the
``worker_done`` in the same transaction, quoting the agent's own, which ``store.loop_reports``
held). The loop parks, with one escalation (quoting the failed checks), at its iteration
limits, at its budget (the agent's budget is the loop's), when the same check failure
repeats ``loop.same_failure_limit`` times, or when its critic escalates.

Crash safety: an iteration is recorded ``running`` before its turn starts. A loop
process that dies mid-turn leaves it so; the next loop process (the watchdog starts one)
finds it: a turn that had finished cleanly is judged as it would have been, any other
is marked ``interrupted`` and the same iteration number runs again as a new attempt, so
the count never resets. The judgement of an iteration and the loop's next step (a
boundary, a critic to wait for) are written in one transaction; a boundary redone after a
crash finds its checkpoint and its critic instead of making new ones.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
import typing as t
import uuid
from pathlib import Path

from overstory import procs
from overstory.agents.approvals import park_for_approval
from overstory.agents.iterations.boundary import (
    consume_critic_mail,
    critic_name,
    critic_prefix,
    phase_diff,
    read_verdict,
    save_checkpoint,
    start_critic,
)
from overstory.agents.iterations.checks import (
    CheckInterrupted,
    CheckResult,
    LoopChecker,
    progress_summary,
    progress_text,
)
from overstory.agents.iterations.prompt import critic_message, iteration_message
from overstory.agents.iterations.spec import MAX_CRITIC_RETRIES, PROGRESS_FILE, limit_reached
from overstory.agents.process import POLL_SECONDS, acquire_turn_slot, load_launch_env
from overstory.clock import now_ms
from overstory.errors import OrchestratorError
from overstory.guards.policy import PHASE_TOOLS_ENV
from overstory.store import approvals, lifecycle, loop_reports, loops, mail, mail_text, sessions, turns
from overstory.store import events as event_store
from overstory.store.db import write_transaction
from overstory.store.dispatch import SCOPE_ENV, loop_scope
from overstory.store.loops import Loop
from overstory.store.sessions import Session

if t.TYPE_CHECKING:
    from overstory.agents.loop import AgentLoop

ACTOR = "loop"
WAITING = frozenset({"booting", "between_turns", "stalled"})


class IterationRunner:
    """Runs one loop agent's iterations inside its per-agent loop process (``host``)."""

    def __init__(self, host: AgentLoop) -> None:
        self.host = host
        self.project, self.config, self.state, self.events = host.project, host.config, host.state, host.events
        self.name, self.generation = host.name, host.generation

    # -- the loop

    def run(self) -> int:
        agent = self.host.current()
        if agent is None:
            return 0
        loop = loops.ensure(self.state, self.name, self.generation, agent.spec["loop"])
        if agent.worktree:
            from overstory.gitutil import keep_out_of_commits

            try:
                keep_out_of_commits(Path(agent.worktree), [PROGRESS_FILE])
            except (OSError, subprocess.CalledProcessError):  # a git hiccup must not stop the loop
                pass
        self._recover(loop)
        while not self.host.stopping:
            agent = self.host.current()
            if agent is None:
                break
            if agent.state == "parked":
                self.host._wake_if_due(agent)
                time.sleep(POLL_SECONDS)
                continue
            current = loops.get(self.state, self.name, self.generation)
            if current is None:
                break
            try:
                self._step(agent, current)
            except sqlite3.OperationalError:  # a busy database: the next pass tries again
                time.sleep(POLL_SECONDS)
        return 0

    def _step(self, agent: Session, loop: Loop) -> None:
        pending = loops.open_iteration(self.state, self.name, self.generation)
        if pending is not None and pending["status"] == "checking":
            self._evaluate(agent, loop, pending)
            return
        # A gate still pending (its loop died before parking for it): no boundary, critic, next iteration or
        # completion until a person has decided.
        if agent.state in WAITING and self._park_for_approval(agent, ""):
            return
        if loop.status == "boundary":
            self._boundary(agent, loop)
            return
        if loop.status == "critic":
            self._await_critic(agent, loop)
            return
        if loop.status == "escalated":  # a person resumed the loop after its critic escalated: go on
            self._advance(agent, loop, "resumed by the operator after the critic's escalation")
            return
        if loop.same_failures >= self.config.loop.same_failure_limit:  # judged stuck by a loop that then died
            self._park_stuck(agent, loop)
            return
        if self.host._wait_for_quota(agent):
            return
        last = loops.last_attempt(self.state, self.name, self.generation)
        if last is not None and last["status"] == "interrupted":
            number, attempt = int(last["number"]), int(last["attempt"]) + 1
        else:
            number, attempt = (int(last["number"]) + 1 if last else 1), 1
        if attempt == 1:
            used, spent = loops.phase_usage(self.state, loop)
            reason = limit_reached(loop, number, used, spent)
            if reason is not None:
                self._park(agent, reason, {"iterations": loop.iterations, "phase": loop.phase["name"],
                                           "phase_iterations": used, "phase_usd": round(spent, 6)})
                return
        slot = acquire_turn_slot(self.project, self.config.turns.max_concurrent, self.host.should_stop)
        if slot is None:
            return
        try:
            self._iterate(agent, loop, number, attempt)
        finally:
            slot.release()
            os.close(slot.fd)

    # -- one iteration

    def _iterate(self, agent: Session, loop: Loop, number: int, attempt: int) -> None:
        from overstory.agents.budgeting import park_for_crossing
        from overstory.store import budgets, quota

        crossing = budgets.begin_turn(self.state, self.name, self.generation)
        if crossing is not None:  # the loop's budget is the agent's: no iteration past it
            parked = park_for_crossing(self.state, agent, crossing, actor=ACTOR, expect=WAITING,
                                       note=self._failures_note())
            self._event("budget_parked", f"{crossing.reason} (before iteration {number}); parked: "
                                         f"{', '.join(parked) or 'none'}", {"crossing": crossing.as_dict()})
            return
        turn_id = f"{now_ms():x}-{uuid.uuid4().hex[:6]}"
        phase = loop.phase
        loops.begin_iteration(self.state, loop, number, attempt, phase=phase["name"], turn_id=turn_id)
        row = {"name": self.name, "generation": self.generation, "number": number, "attempt": attempt}
        consume_critic_mail(self.state, self.name, critic_prefix(loop))
        claimed = mail.claim(self.state, self.name, turn_id)
        worktree = Path(agent.worktree) if agent.worktree else None
        prompt = iteration_message(loop, number=number, attempt=attempt, progress=progress_text(worktree),
                                   finished=self._finished_phases(loop),
                                   mail_text=mail_text.render_for_prompt([m for m in claimed if m.type != "dispatch"]))
        # Every attempt at this iteration shares one idempotency scope: a re-run (its loop was killed) gets
        # what the dead attempt already did from the ledger instead of doing it again.
        extra = {"OVERSTORY_LOOP": self.name, "OVERSTORY_LOOP_ITERATION": str(number),
                 "OVERSTORY_LOOP_PHASE": phase["name"], "OVERSTORY_LOOP_PROMISE": loop.definition["until"],
                 SCOPE_ENV: loop_scope(self.generation, number)}
        if phase.get("tools") is not None:
            extra[PHASE_TOOLS_ENV] = ",".join(phase["tools"])
        self.host.base_env = load_launch_env(self.project, self.name)
        self._event("loop_iteration", f"iteration {number} (attempt {attempt}) of phase {phase['name']}",
                    {"number": number, "attempt": attempt, "phase": phase["name"], "turn_id": turn_id})
        result = self.host._turn(agent, prompt, turn_id, None, attempt=attempt - 1, extra_env=extra)  # with its endpoint
        if result.status == "ok":
            promise = loop.definition["until"] in result.stream.final_text()

            def judged_next(tx: sqlite3.Connection, _ok: sessions.Ok) -> None:
                loops.mark_checking(tx, row, session_id=result.session_id, cost_usd=result.cost_usd,
                                    promise_seen=promise)

            mail.mark_read(self.state, turn_id)
            quota.forget(self.state, agent.provider)
            sessions.count_finished_turn(self.state, self.name, self.generation)
            outcome = sessions.transition(self.state, self.name, self.generation, "between_turns", actor=ACTOR,
                                          reason=f"iteration {number} finished; ov checks it",
                                          expect={"booting", "in_turn", "stalled"}, then=judged_next)
            if not outcome.ok:  # parked (a run's budget) or stopped meanwhile: the turn still counts
                loops.mark_checking(self.state, row, session_id=result.session_id, cost_usd=result.cost_usd,
                                    promise_seen=promise)
            return
        loops.interrupt(self.state, row, f"{result.status}: {result.reason}", session_id=result.session_id,
                        cost_usd=result.cost_usd)
        self._event("loop_iteration_interrupted", f"iteration {number} attempt {attempt}: {result.status}: "
                                                  f"{result.reason}", {"number": number, "attempt": attempt})
        self.host._settle(agent, turn_id, result)

    def _evaluate(self, agent: Session, loop: Loop, row: dict[str, t.Any]) -> None:
        """ov's own check of a finished iteration, and what follows from it (one transaction)."""
        worktree = Path(agent.worktree or self.project.root)
        asked = approvals.requested_in(self.state, self.name, self.generation, row["turn_id"] or "")
        if asked or approvals.pending_for(self.state, self.name, self.generation):
            self._held_for_a_person(agent, row, asked, worktree)
            return
        is_last = loop.phase_index >= len(loop.phases) - 1
        gates = [g for g in (loop.phase.get("gate"), loop.definition.get("final_check") if is_last else None) if g]
        check: CheckResult | None = None
        settings = self.config.loop
        try:  # in the sandbox, over the agent's branch (loop_checks)
            with LoopChecker(self.project, self.config, agent, loop.definition, env=self.host.base_env,
                             should_stop=self.host.should_stop,
                             commit_message=f"ov loop {self.name}: iteration {row['number']}") as checker:
                for index, gate in enumerate(gates):
                    check = checker.run(gate, self.project.logs_dir / self.name / "loop" /
                                        f"check-{row['number']}-{row['attempt']}-{index}.txt")
                    if not check.passed:
                        break
        except CheckInterrupted:
            return  # the loop is stopping: the next loop process checks this iteration again
        progress = progress_summary(progress_text(worktree))
        promise = bool(row["promise_seen"])
        passed = check is None or check.passed
        failing = check is not None and not check.passed
        streak = (loop.same_failures + 1 if check.fingerprint == loop.last_fingerprint else 1) if failing else 0
        stuck = failing and streak >= settings.same_failure_limit  # type: ignore[union-attr]
        if promise and passed:
            outcome = "gate passed with the promise"
        elif stuck:
            outcome = f"the same check failure {streak} times in a row: parked"
        elif promise:
            outcome = "promise, but the check failed: another iteration"
        elif passed:
            outcome = "the check passed without the promise: another iteration"
        else:
            outcome = "the check failed: another iteration"
        if check is not None and check.problem:  # a protected path changed: said first
            outcome = f"{check.problem}; {outcome}"
        tail = f"$ {check.label}\n{check.tail}" if check is not None else None
        with write_transaction(self.state):
            loops.finish_iteration(self.state, row, check_exit=check.exit_code if check else None,
                                   check_seconds=round(check.seconds, 3) if check else None, check_tail=tail,
                                   fingerprint=check.fingerprint if check else None, progress=progress,
                                   outcome=outcome, check_log=check.log if check else None,
                                   check_env=check.environment if check else None)
            loops.update(self.state, self.name, self.generation, same_failures=streak,
                         last_fingerprint=check.fingerprint if check else None,
                         last_check_exit=check.exit_code if check else None, last_check_tail=tail,
                         status="boundary" if promise and passed else loop.status)
        self._event("loop_checked", f"iteration {row['number']}: promise {'seen' if promise else 'not seen'}, "
                                    f"check {'none' if check is None else check.exit_code}: {outcome}",
                    {"number": row["number"], "attempt": row["attempt"], "promise": promise,
                     "check_exit": check.exit_code if check else None, "streak": streak})
        self._kill_point("loop_judged")
        if stuck:
            fresh = loops.get(self.state, self.name, self.generation)
            assert fresh is not None
            self._park_stuck(agent, fresh)

    def _held_for_a_person(self, agent: Session, row: dict[str, t.Any], asked: list[str], worktree: Path) -> None:
        """An iteration that asked for an approval (or ended while one is pending) is not judged: the call it
        wanted has not run, so neither its promise nor a check counts. Parked until a person decides; the
        decision reaches the next iteration as mail, which runs the approved call or goes on without it."""
        pending = approvals.pending_for(self.state, self.name, self.generation)
        ids = ", ".join(pending or asked)
        outcome = (f"a call waits for approval {ids}: parked, not judged" if pending else
                   f"a call needed approval ({ids}, decided since): not judged; another iteration runs it")
        with write_transaction(self.state):
            loops.finish_iteration(self.state, row, check_exit=None, check_seconds=None, check_tail=None,
                                   fingerprint=None, progress=progress_summary(progress_text(worktree)),
                                   outcome=outcome)
        self._event("loop_checked", f"iteration {row['number']}: {outcome}",
                    {"number": row["number"], "attempt": row["attempt"], "approvals": pending or asked})
        self._kill_point("loop_held")  # a loop that dies here parks on its next step (``_step``)
        if pending:
            self._park_for_approval(agent, row["turn_id"] or "")

    def _park_for_approval(self, agent: Session, turn_id: str) -> bool:
        """Parked (``approval``) while a gate of the agent is pending, like any agent: `ov wait` exits 7."""
        return park_for_approval(self.state, self.events, agent, turn_id, actor=ACTOR)

    def _park_stuck(self, agent: Session, loop: Loop) -> None:
        """The same failure ``same_failure_limit`` times: park; the streak starts over when a person resumes it."""
        label = (loop.last_check_tail or "").partition("\n")[0].removeprefix("$ ")

        def restart_streak(tx: sqlite3.Connection) -> None:
            loops.update(tx, self.name, self.generation, same_failures=0)

        self._park(agent, f"loop: the same check failure {loop.same_failures} times in a row (`{label}` exit "
                          f"{loop.last_check_exit})", {"iterations": loop.iterations, "check": label,
                                                       "exit_code": loop.last_check_exit,
                                                       "tail": (loop.last_check_tail or "")[-800:]},
                   also=restart_streak)

    def _recover(self, loop: Loop) -> None:
        """An iteration left ``running`` by a loop process that died: judge it, or run it again."""
        pending = loops.open_iteration(self.state, self.name, self.generation)
        if pending is None or pending["status"] != "running":
            return
        turn = turns.outcome(self.state, pending["turn_id"])
        if turn is not None and turn["status"] == "ok":
            promise = loop.definition["until"] in self._turn_text(pending["turn_id"])
            loops.mark_checking(self.state, pending, session_id=turn["session_id"], cost_usd=turn["cost_usd"],
                                promise_seen=promise)
            self._event("loop_recovered", f"iteration {pending['number']} had finished; judging it now", None)
            return
        loops.interrupt(self.state, pending, "the loop process died during the iteration",
                        cost_usd=turn["cost_usd"] if turn is not None else None)
        self._event("loop_recovered", f"iteration {pending['number']} attempt {pending['attempt']} was interrupted; "
                                      "it runs again (the count does not reset)", None)

    def _turn_text(self, turn_id: str) -> str:
        """The model's last words in a turn, from the events (the loop that read them live is gone)."""
        rows = event_store.last_words(self.events, turn_id)
        for row in rows:
            data = json.loads(row["data"] or "{}")
            text = data.get("result") if row["kind"] == "turn_result" else data.get("text")
            if text:
                return str(text)
        return ""

    # -- boundaries and the critic

    def _boundary(self, agent: Session, loop: Loop) -> None:
        progress = progress_summary(progress_text(Path(agent.worktree)) if agent.worktree else None)
        mark = save_checkpoint(self.state, agent, loop, progress)
        self._event("loop_checkpoint", f"phase {loop.phase['name']}: checkpoint {mark['commit_sha'][:12]} "
                                       f"({mark['ref']})", {"seq": mark["seq"], "ref": mark["ref"]})
        if loop.definition.get("critic"):
            loops.update(self.state, self.name, self.generation, status="critic", critic_agent=critic_name(loop),
                         critic_since=now_ms())
            fresh = loops.get(self.state, self.name, self.generation)
            assert fresh is not None
            self._kill_point("loop_critic")
            self._start_critic(agent, fresh)
            return
        self._advance(agent, loop, "its gate passed")

    def _start_critic(self, agent: Session, loop: Loop) -> None:
        assert loop.critic_agent is not None
        existing = sessions.get(self.state, loop.critic_agent)
        if existing is not None and existing.parent == self.name and existing.created_at >= (loop.critic_since or 0):
            return  # started before a crash
        diff, span = phase_diff(agent, loop, self.state)
        worktree = Path(agent.worktree) if agent.worktree else None
        task = critic_message(loop, loop_agent=self.name, phase=loop.phase, diff=diff, diff_range=span,
                              progress=progress_text(worktree))
        try:
            start_critic(self.project, self.config, agent, loop, loop.critic_agent, task, dict(os.environ))
        except (OrchestratorError, OSError, subprocess.TimeoutExpired) as exc:
            self._escalate(agent, loop, f"loop: the critic of phase {loop.phase['name']!r} could not start: {exc}")
            return
        self._event("loop_critic", f"phase {loop.phase['name']}: critic {loop.critic_agent} slung",
                    {"critic": loop.critic_agent, "diff": span})

    def _await_critic(self, agent: Session, loop: Loop) -> None:
        critic_agent = loop.critic_agent or critic_name(loop)
        critic = sessions.get(self.state, critic_agent)
        if critic is None or critic.created_at < (loop.critic_since or 0):
            self._start_critic(agent, loop)
            time.sleep(POLL_SECONDS)
            return
        found = read_verdict(self.state, self.name, critic_agent)
        phase = loop.phase["name"]
        if found is None:
            waited = (now_ms() - (loop.critic_since or now_ms())) / 1000
            if critic.is_terminal:
                self._escalate(agent, loop, f"loop: the critic {critic_agent} of phase {phase!r} ended "
                                            f"({critic.state}) without a verdict")
            elif waited > self.config.loop.critic_timeout:
                self._escalate(agent, loop, f"loop: no verdict from the critic {critic_agent} of phase {phase!r} "
                                            f"after {waited:.0f}s")
            else:
                time.sleep(POLL_SECONDS)
            return
        verdict, notes, _mail_id = found
        consume_critic_mail(self.state, self.name, critic_prefix(loop))
        loops.set_verdict(self.state, loop, verdict)
        self._event("loop_verdict", f"phase {phase}: the critic says {verdict}" + (f": {notes[:200]}" if notes else ""),
                    {"critic": critic_agent, "verdict": verdict, "round": loop.phase_round})
        if verdict == "pass":
            self._advance(agent, loop, f"the critic {critic_agent} passed it")
        elif verdict == "retry" and loop.phase_round < MAX_CRITIC_RETRIES:
            loops.update(self.state, self.name, self.generation, status="running", phase_round=loop.phase_round + 1,
                         phase_started=loop.iterations, extra_phase_iterations=0, extra_phase_usd=0,
                         critic_agent=None, critic_since=None, critic_notes=notes or "(no notes)",
                         same_failures=0, last_fingerprint=None)
            self._event("loop_phase", f"phase {phase} runs again (run {loop.phase_round + 2}) as the critic asked", None)
        elif verdict == "retry":
            self._escalate(agent, loop, f"loop: the critic asked for phase {phase!r} again after "
                                        f"{loop.phase_round + 1} runs: {notes}"[:300])
        else:
            self._escalate(agent, loop, f"loop: the critic escalated phase {phase!r}: {notes}"[:300])

    def _advance(self, agent: Session, loop: Loop, why: str) -> None:
        if loop.phase_index + 1 >= len(loop.phases):
            self._complete(agent, loop)
            return
        loops.update(self.state, self.name, self.generation, status="running", phase_index=loop.phase_index + 1,
                     phase_round=0, phase_started=loop.iterations, extra_phase_iterations=0, extra_phase_usd=0,
                     critic_agent=None, critic_since=None, critic_notes=None, same_failures=0, last_fingerprint=None,
                     last_check_exit=None, last_check_tail=None)
        following = loop.phases[loop.phase_index + 1]["name"]
        self._event("loop_phase", f"phase {loop.phase['name']} done ({why}); next: {following}", None)

    def _complete(self, agent: Session, loop: Loop) -> None:
        """Completed, and the parent's ``worker_done``, in one transaction (ov reports for the loop)."""
        from overstory.agents.work_report import fill_worker_done

        payload = fill_worker_done(self.project, self.state, self.name,
                                   {"task_id": agent.task_id, "branch": agent.branch or "-", "agent": agent.name})
        fresh = loops.get(self.state, self.name, self.generation)  # the agent's own worker_done, held meanwhile
        own = loop_reports.held(fresh.held_report if fresh else None)
        quoted = (f"\n\nIts own last report (held while the loop ran): {own.get('subject')}"
                  + (f"\n{own['body']}" if own.get("body") else "")) if own else ""
        sent: list[int] = []

        def report(tx: sqlite3.Connection, _ok: sessions.Ok) -> None:
            loops.update(tx, self.name, self.generation, status="completed", critic_agent=None)
            message_id = mail.insert_message(
                tx, sender=self.name, recipient=agent.parent or "operator", type="worker_done",
                subject=f"{self.name}: loop complete after {loop.iterations} iteration(s)",
                body=(f"The loop {self.name} (task {agent.task_id}) is complete: the promise and ov's checks agree "
                      f"after {loop.iterations} iteration(s). `ov loop status {self.name}` lists them; its branch is "
                      f"{agent.branch}.{quoted}"), payload=payload,
                dedup_key=f"loop_done:{self.name}:{self.generation}")
            if message_id is not None:
                sent.append(message_id)

        outcome = sessions.transition(self.state, self.name, self.generation, "completed", actor=ACTOR,
                                      reason=f"loop complete: promise and check after {loop.iterations} iteration(s)",
                                      expect=WAITING, then=report)
        if outcome.ok:
            mail.record_sent(self.state, sent)
            self._event("loop_completed", f"complete after {loop.iterations} iteration(s)", None)

    # -- parking

    def _park(self, agent: Session, reason: str, details: dict[str, t.Any] | None,
              also: t.Callable[[sqlite3.Connection], None] | None = None) -> None:
        outcome = lifecycle.park(self.state, agent, "loop", reason[:300], actor=ACTOR, details=details,
                                 expect=WAITING, also=also, note=self._failures_note())
        if outcome.ok:
            self._event("loop_parked", reason, details)

    def _failures_note(self) -> str | None:
        from overstory.agents.iterations.start import failures_note

        return failures_note(self.state, self.name, self.generation, self.project.root)

    def _escalate(self, agent: Session, loop: Loop, reason: str) -> None:
        """Park for a person after the critic; resuming goes on to the next phase."""
        def note(tx: sqlite3.Connection) -> None:
            loops.update(tx, self.name, self.generation, status="escalated", critic_agent=None)

        self._park(agent, reason, {"phase": loop.phase["name"], "critic": loop.critic_agent}, also=note)

    # -- helpers

    def _finished_phases(self, loop: Loop) -> list[dict[str, t.Any]]:
        """The newest checkpoint of each phase before the current one."""
        done = {p["name"] for p in loop.phases[: loop.phase_index]}
        latest: dict[str, dict[str, t.Any]] = {}
        for mark in loops.checkpoints(self.state, self.name, self.generation):
            if mark["phase"] in done:
                latest[mark["phase"]] = mark
        return [latest[p["name"]] for p in loop.phases[: loop.phase_index] if p["name"] in latest]

    def _kill_point(self, step: str) -> None:
        """Crash-safety tests: die here once (``OV_TEST_KILL_AT=<step>``); the restarted loop must not die again."""
        if os.environ.get(procs.KILL_AT_ENV) == step:
            marker = self.project.run_dir / self.name / f"killed-at-{step}"
            if not marker.exists():
                marker.touch()
                procs.kill_point(step)

    def _event(self, kind: str, summary: str, data: dict[str, t.Any] | None) -> None:
        try:
            event_store.record(self.events, kind, agent=self.name, generation=self.generation, summary=summary[:300],
                               data=data)
        except sqlite3.Error:
            pass  # the state is what matters; the event is a courtesy
