"""The per-agent loop: a small detached process that turns pending mail into turns.

Started by `ov sling` (or re-adopted by the watchdog) as
``python -m overstory.agents.loop --project ROOT --agent NAME --generation G``.
It runs in its own session, so closing the operator's terminal does not stop it,
and it holds an OS lock for its agent so two loops can never run turns of one
agent at once (a crashed holder's lock is released by the kernel).
"""

from __future__ import annotations

from overstory.deferred import defer, defer_in_an_agent_loop

# Before anything imports pathlib, which imports urllib.parse (and with it ipaddress: 0.3 MiB of every idle loop)
# for Path.as_uri alone. Where this module is imported rather than run (`ov loop`, tests) pathlib is loaded already.
defer("urllib.parse", "quote_from_bytes")
if __name__ == "__main__":
    defer_in_an_agent_loop()  # typing and locale (0.6 MiB of every idle loop)

import os
import sys
import time
import typing as t
from pathlib import Path

from overstory import procs
from overstory.agents.approvals import park_for_approval
from overstory.agents.process import (
    POLL_SECONDS,
    AgentProcess,
    acquire_turn_slot,
    give_back_memory,
    load_launch_env,
    reopen_databases,
    spawn_loop,  # noqa: F401 - re-exported: callers and tests start loops from here
)
from overstory.clock import now_ms
from overstory.paths import ProjectPaths
from overstory.store import checkpoints, mail_queries, sessions, turns
from overstory.store.db import open_events
from overstory.store.lifecycle import (
    PERSISTENT_CAPABILITIES,
    complete_promised,
    declare_zombie,
    mail_sent_since,
    promised,
    terminal_mail_sent,
)
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3  # the C module: the package brings datetime (0.2 MiB)

if t.TYPE_CHECKING:
    from overstory.agents.spending import ToolCallGate
    from overstory.config.model import Config
    from overstory.endpoint.server import AgentEndpoint

SUMMARY_CHECK_SECONDS = 1.0
FAULT_ENV = "OV_TEST_DIE_AT"  # test hook: a point at which the loop kills itself (crash-safety tests)
# Turn statuses after which the agent parks instead of retrying (agents.turns.TurnResult). An error the runtime's
# parser cannot classify (unknown) is not retried: the same turn could fail again at full price.
PARKING_STATUSES = frozenset({"budget", "rate_limit", "auth", "unknown", "parked"})


class _Interrupted:
    status = "transient"
    reason = "the agent loop died during the turn"
    started_ms = 0


class AgentLoop(AgentProcess):
    def __init__(self, project: ProjectPaths, name: str, generation: int) -> None:
        super().__init__(project, name, generation)
        self.base_env = load_launch_env(project, name)
        self.config = load_loop_config(project, name, self.base_env)
        self.events = open_events(project.events_db)
        self._next_summary_check = 0.0
        self.endpoint: AgentEndpoint | None = None
        self.gate: ToolCallGate | None = None
        self.hook_settings: Path | None = None
        self.remote_endpoint = ""  # HOST:PORT of the endpoint's TCP listener, when the turns run on other machines
        self._next_idle_check = 0

    def _serve_endpoint(self) -> None:
        """The agent's channel to ov (see overstory.endpoint): served for the loop's whole life."""
        from overstory.agents.spending import ToolCallGate
        from overstory.endpoint.routes import ROUTES
        from overstory.endpoint.server import AgentEndpoint

        self.gate = ToolCallGate()  # tool calls wait there until their turn's stream is priced (budgets)
        self.endpoint = AgentEndpoint(self.project, self.name, self.generation, ROUTES, self.base_env,
                                      config=self.config, before_tool_call=self.gate.ask).start()
        self.hook_settings = self._serve_hooks(self.endpoint)
        from overstory.agents import turn_exec

        agent = self.current()
        if agent is not None and turn_exec.executor_kind(self.config, agent) != "local":
            from overstory.endpoint.remote import serve_remote

            self.remote_endpoint = serve_remote(self.endpoint, self.config.executor.ray.control_host)

    def _serve_hooks(self, endpoint: AgentEndpoint) -> Path | None:
        """Claude's tool-call hooks as HTTP calls to this loop (issue 20) where they can reach it; None: the
        command hooks (`ov guard`). The choice is written to the run dir for `ov doctor`."""
        from overstory.agents import turn_exec
        from overstory.endpoint import hooks
        from overstory.runtimes import get_runtime

        agent = self.current()
        run_dir = self.project.run_dir / self.name
        transport = "command" if agent is None or turn_exec.executor_kind(self.config, agent) != "local" \
            else hooks.transport_for(self.config, agent.runtime, agent.capability)  # a node's 127.0.0.1 is not ours
        settings = None
        if transport == "http" and agent is not None:
            try:
                port = endpoint.serve_hooks()
                settings = hooks.write_settings(run_dir, get_runtime(agent.runtime).run_settings_file, port)
                transport = f"http {port}"
            except OSError as exc:
                transport = f"command (the HTTP listener failed: {exc})"
        try:
            (run_dir / hooks.TRANSPORT_FILE).write_text(transport + "\n", encoding="utf-8")
        except OSError:
            pass
        return settings

    def _turn(self, agent: Session, prompt: str, turn_id: str, resume: str | None, *, attempt: int | None = None,
              extra_env: t.Mapping[str, str] | None = None, fork_session: bool = False) -> t.Any:
        """One turn with a fresh endpoint secret in its environment, revoked as soon as the turn is over.

        The endpoint is told the turn's own variables (its dispatch, attempt, ledger policy: what
        `ov mail send` and `ov guard` read from the environment outside a sandbox), so requests
        through it are idempotent per dispatch and reach the ledger as the turn's.
        """
        from overstory.agents import turn_exec
        from overstory.agents.turns import durable_env, run_turn
        from overstory.store.dispatch import claimed_ids

        attempt = agent.retries if attempt is None else attempt
        extra = dict(extra_env or {})
        if self.endpoint is not None and self.hook_settings is not None and not self.endpoint.hooks_alive:
            self.hook_settings = self._serve_hooks(self.endpoint)  # its listener stopped: a new one, a new port
        if self.endpoint is not None:
            turn_vars = {**durable_env(self.config, agent, attempt, claimed_ids(self.state, turn_id)), **extra,
                         "OVERSTORY_TURN_ID": turn_id}
            extra.update(self.endpoint.open_turn(turn_env=turn_vars))
            if self.remote_endpoint:
                extra[turn_exec.REMOTE_ENDPOINT_ENV] = self.remote_endpoint
        try:
            result = run_turn(self.project, self.config, self.state, self.events, agent, prompt, turn_id,
                              resume_session_id=resume, base_env=self.base_env, attempt=attempt,
                              should_stop=self.should_stop, extra_env=extra, settings_file=self.hook_settings,
                              env_ready=self.endpoint.set_turn_env if self.endpoint is not None else None,
                              gate=self.gate, fork_session=fork_session)
        finally:
            if self.endpoint is not None:
                self.endpoint.revoke()
        if result.status == "aborted" and self.signalled is not None and self.current() is not None:
            self._interrupted(turn_id, result)
        return result

    def _interrupted(self, turn_id: str, result: t.Any) -> None:
        """The loop got SIGTERM/SIGINT mid-turn: the turn stopped and settled (its end checkpoint written: session,
        HEAD, spend); it is marked ``interrupted``, not stopped, so the next loop retries it. Killed before
        this commits, the checkpoint says ``aborted`` and the agent is still in its turn: recovery retries it
        all the same."""
        import signal

        from overstory.store import events as event_store

        reason = f"the agent loop got {signal.Signals(self.signalled or 0).name} during the turn; it is retried"
        checkpoints.mark_interrupted(self.state, turn_id, reason)
        event_store.record(self.events, "turn_interrupted", agent=self.name, generation=self.generation,
                           turn_id=turn_id, summary=reason)
        result.status, result.reason = "interrupted", reason

    def run(self) -> int:
        if not self.take_agent():
            return 0  # another loop already serves this agent
        from overstory.agents import turn_exec
        from overstory.store import events as event_store

        event_store.record(self.events, "loop_start", agent=self.name, generation=self.generation,
                           summary=f"pid {os.getpid()}")
        self._serve_endpoint()
        self._recover_interrupted_turn()
        first = self.current()
        if first is not None and first.spec.get("loop"):  # an `ov loop`: iterations, not mail, drive its turns
            from overstory.agents.iterations.run import IterationRunner

            return IterationRunner(self).run()
        while not self.stopping:
            agent = self.current()
            if agent is None:
                break
            if agent.capability == "coordinator" and agent.run_id:
                self._check_run_summary(agent.run_id)
            if agent.state == "parked":
                turn_exec.discard_early_shim()  # no turn soon: an idle loop holds no shim
                self._wake_if_due(agent)
                time.sleep(POLL_SECONDS)
                continue
            if agent.state == "between_turns" and park_for_approval(self.state, self.events, agent, "",
                                                                     actor="agent-loop"):
                continue  # a gate of an earlier turn is still pending (its loop died before parking)
            if not self._has_pending_mail():
                turn_exec.discard_early_shim()
                self._check_idle(agent)
                time.sleep(POLL_SECONDS)
                continue
            if self._wait_for_quota(agent):
                continue
            slot = acquire_turn_slot(self.project, self.config.turns.max_concurrent, self.should_stop)
            if slot is None:
                break
            try:
                self._one_turn(agent)
            finally:
                slot.release()
                os.close(slot.fd)
            self._give_back_memory()
        return 0

    def _give_back_memory(self) -> None:
        """Until its next turn the loop waits: what the turn left goes back to the system (issue 34: 0.4 MiB of
        every idle loop). The endpoint's pooled connections close; the loop's own are opened anew."""
        if self.endpoint is not None:
            self.endpoint.close_idle_connections()
        self.state, self.events = reopen_databases(self.project, self.state, self.events)
        give_back_memory()

    def _recover_interrupted_turn(self) -> None:
        """A turn left in_turn by a loop that died: its process group goes, its mail is re-delivered.

        We hold the agent lock, so no other loop can be running a turn of this agent.
        """
        from overstory.agents.idle import NO_REPORT
        from overstory.store import budgets, mail
        from overstory.store import events as event_store

        agent = self.current()
        if agent is None or agent.state not in ("in_turn", "stalled") or agent.mode != "headless":
            return
        if agent.state_reason == NO_REPORT and not agent.current_turn_id:
            return  # stalled between turns for want of a report: no turn was running
        procs.kill_turn(agent.turn_pgid, agent.turn_start_ticks, agent.current_turn_id,
                        grace=self.config.turns.kill_grace)
        from overstory.store.db import write_transaction

        with write_transaction(self.state):  # its spend so far counts, in the budget and on its row, or neither
            estimate = budgets.settle_interrupted(self.state, self.name, self.generation)
            if agent.current_turn_id:
                turns.add_cost(self.state, agent.current_turn_id, estimate)
        if promised(self.state, agent):
            complete_promised(self.state, agent, "its loop died during the turn", actor="turn-runner",
                              expect=frozenset({"in_turn", "stalled"}))
            return
        if agent.current_turn_id:
            mail.release(self.state, agent.current_turn_id)
            turns.mark_interrupted(self.state, agent.current_turn_id)
        event_store.record(self.events, "turn_interrupted", agent=self.name, generation=self.generation,
                           turn_id=agent.current_turn_id, summary="the previous loop died mid-turn; retrying")
        self._settle(agent, agent.current_turn_id or "", _Interrupted())

    def _check_run_summary(self, run_id: str) -> None:
        """A coordinator's loop mails it the run summary once every agent of its run has finished."""
        now = time.monotonic()
        if now < self._next_summary_check:
            return
        self._next_summary_check = now + SUMMARY_CHECK_SECONDS
        from overstory.store import runs

        try:
            runs.maybe_send_summary(self.state, run_id)
        except sqlite3.Error:
            pass  # a busy database: the next check tries again

    def _wake_if_due(self, agent: Session) -> None:
        """A timed park (a quota window) whose time has come goes back to work; the watchdog does the same."""
        from overstory.store import events as event_store
        from overstory.store.lifecycle import unpark

        if agent.park_until is None or agent.park_until > now_ms():
            return
        outcome = unpark(self.state, agent, actor="agent-loop", reason=f"{agent.park_kind} park ended",
                         due_at=now_ms())
        if outcome is not None and outcome.ok:
            event_store.record(self.events, "agent_unparked", agent=self.name, generation=self.generation,
                               summary=f"{agent.park_kind} park ended; back to work")

    def _check_idle(self, agent: Session) -> None:
        from overstory.agents import idle
        from overstory.store import events as event_store

        now = now_ms()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + int(SUMMARY_CHECK_SECONDS * 1000)
        try:
            done = idle.check(self.state, agent, idle_nudge=self.config.turns.idle_nudge,
                              max_nudges=self.config.turns.max_nudges, now=now)
        except sqlite3.OperationalError:
            return  # a busy database: the next check tries again
        if done == "nudged":
            event_store.record(self.events, "idle_nudge", agent=self.name, generation=self.generation,
                               summary=f"turn ended without a report: nudge {agent.nudges + 1}/"
                                       f"{self.config.turns.max_nudges}")
        elif done == "escalated":
            event_store.record(self.events, "no_report", agent=self.name, generation=self.generation,
                               summary=f"no report after {agent.nudges} nudge(s): stalled, parent told")

    def _wait_for_quota(self, agent: Session) -> bool:
        """Its provider's quota window is closed: park until it opens instead of starting a turn."""
        from overstory.store import events as event_store
        from overstory.store import quota

        window = quota.current(self.state, agent.provider)
        if window is None:
            return False
        outcome = quota.park_agent(self.state, agent, window, actor="agent-loop", stagger=self.config.quota.stagger,
                                   detail="its provider's quota window is closed",
                                   expect={"booting", "between_turns", "stalled"})
        if outcome.ok:
            event_store.record(self.events, "quota_parked", agent=self.name, generation=self.generation,
                               summary=window.describe()[:300])
        return True

    def _has_pending_mail(self) -> bool:
        return mail_queries.has_pending(self.state, self.name)

    def _one_turn(self, agent: Session) -> None:
        from overstory.agents import idle
        from overstory.store import budgets, mail, mail_text
        from overstory.store import events as event_store

        if not self._spend_approved(agent):
            return
        crossing = budgets.begin_turn(self.state, self.name, self.generation)
        if crossing is not None:  # no turn past a limit: park before spending anything
            from overstory.agents.budgeting import park_for_crossing

            parked = park_for_crossing(self.state, agent, crossing, actor="agent-loop",
                                       expect={"booting", "between_turns", "stalled"})
            event_store.record(self.events, "budget_parked", agent=self.name, generation=self.generation,
                               summary=f"{crossing.reason} (before a turn); parked: {', '.join(parked) or 'none'}"[:300],
                               data={"crossing": crossing.as_dict(), "parked": parked})
            return
        self.base_env = load_launch_env(self.project, self.name)  # `ov resume` may have brought a fixed key
        turn_id = f"{now_ms():x}-{os.urandom(3).hex()}"
        claimed = mail.claim(self.state, self.name, turn_id)
        if not claimed:
            budgets.refund_turn(self.state, self.name, self.generation)
            return
        idle.reset_if_spoken_to(self.state, agent, (m.sender for m in claimed))
        prompt = mail_text.render_for_prompt(claimed)
        resume = agent.runtime_session_id
        forked = (agent.spec.get("fork_of") or {}).get("session") if resume is None and not agent.turns else None
        if forked:  # `ov resume --fork`: its first turn continues the source's conversation in a session of its own
            resume = str(forked)
        result = self._turn(agent, prompt, turn_id, resume, fork_session=bool(forked))
        if result.status == "resume_failed":
            event_store.record(self.events, "resume_fallback", agent=self.name, generation=self.generation,
                               turn_id=turn_id, summary=f"could not resume {resume}: {result.reason}"[:300])
            fresh = self.current()
            if fresh is None:
                mail.release(self.state, turn_id)
                return
            sessions.update_fields(self.state, self.name, self.generation, runtime_session_id=None)
            sessions.transition(self.state, self.name, self.generation, "between_turns", actor="turn-runner",
                                reason="resume failed; starting a fresh session", expect={"in_turn", "stalled"})
            fresh.runtime_session_id = None
            fallback_turn = f"{turn_id}-fresh"
            mail.move_claims(self.state, turn_id, fallback_turn)
            turn_id = fallback_turn
            prompt = self._fresh_session_summary(fresh) + "\n\n" + prompt
            result = self._turn(fresh, prompt, turn_id, None)
            if result.status == "resume_failed":
                result.status = "permanent"
        self._settle(agent, turn_id, result)

    def _spend_approved(self, agent: Session) -> bool:
        """Config ``approvals.spend_over_usd``: past it, each turn waits for an approval."""
        over = self.config.approvals.spend_over_usd
        if over is None or agent.cost_usd <= over:
            return True
        from overstory.agents.approvals import spend_gate

        decider = agent.parent if self.config.approvals.decider == "parent" else "operator"
        return spend_gate(self.state, agent, over, timeout_s=self.config.approvals.timeout,
                          on_timeout=self.config.approvals.on_timeout, decider=decider or "operator")

    def _settle(self, agent: Session, turn_id: str, result: t.Any) -> None:
        from overstory.store import events as event_store
        from overstory.store import mail

        actor = "turn-runner"
        if result.status in PARKING_STATUSES:
            fresh = self.current()
            if fresh is not None and promised(self.state, fresh):  # its report is in: done, not parked
                complete_promised(self.state, fresh, f"the turn was stopped ({result.reason})", actor=actor,
                                  expect=frozenset({"booting", "in_turn", "stalled", "between_turns", "parked"}))
                return
            self._park_after_turn(agent, turn_id, result)
            return
        if result.status == "ok":
            from overstory.store import quota

            quota.forget(self.state, agent.provider)
            mail.mark_read(self.state, turn_id)
            # Mail an earlier, crashed attempt at this dispatch sent counts: its replay was not sent twice.
            since = min(result.started_ms, checkpoints.dispatch_started(self.state, turn_id) or result.started_ms)
            done = agent.capability not in PERSISTENT_CAPABILITIES and terminal_mail_sent(self.state, agent, since)
            if not done and mail_sent_since(self.state, agent, since) == 0 \
                    and agent.capability not in PERSISTENT_CAPABILITIES:
                event_store.record(self.events, "contract_violation", agent=self.name, generation=self.generation,
                                   turn_id=turn_id, summary="turn ended cleanly without any mail: nobody knows what it did")
            sessions.count_finished_turn(self.state, self.name, self.generation)
            if not done and park_for_approval(self.state, self.events, agent, turn_id, actor=actor):
                return  # a tool call of this turn waits for a person: parked until it is decided
            sessions.transition(self.state, self.name, self.generation, "completed" if done else "between_turns",
                                actor=actor, reason="terminal mail sent" if done else "turn finished",
                                expect={"booting", "in_turn", "stalled"})
            return
        fresh = self.current()
        if fresh is not None and promised(self.state, fresh):
            # The terminal mail is committed: the task is done, whatever became of the process.
            complete_promised(self.state, fresh, f"the turn ended {result.status}: {result.reason}", actor=actor,
                              expect=frozenset({"booting", "in_turn", "stalled", "between_turns"}))
            return
        mail.release(self.state, turn_id)
        if fresh is None or (result.status in ("aborted", "interrupted") and self.stopping):
            return
        if fresh.state == "parked":  # parked (a run's budget, a quota window) as this turn started
            from overstory.store import budgets

            budgets.refund_turn(self.state, self.name, self.generation)  # it did nothing: no turn, no retry
            return
        if result.status in ("permanent", "stalled"):
            declare_zombie(self.state, fresh, result.reason, actor=actor)
            return
        retries = fresh.retries + 1
        sessions.count_failed_turn(self.state, self.name, self.generation, retries)
        if retries > self.config.turns.max_retries:
            declare_zombie(self.state, fresh, f"{result.reason} (gave up after {retries - 1} retries)", actor=actor)
            return
        event_store.record(self.events, "turn_retry", agent=self.name, generation=self.generation, turn_id=turn_id,
                           summary=f"retry {retries}/{self.config.turns.max_retries}: {result.reason}"[:300])
        sessions.transition(self.state, self.name, self.generation, "between_turns", actor=actor,
                            reason=f"turn failed, retry {retries}", expect={"booting", "in_turn", "stalled"})
        delay = self.config.turns.retry_backoff * (2 ** (retries - 1))
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(min(POLL_SECONDS, delay))

    def _park_after_turn(self, agent: Session, turn_id: str, result: t.Any) -> None:
        """A turn stopped by a budget, a quota, an auth failure or an error ov cannot classify: park (retries are
        not consumed)."""
        from overstory.agents.budgeting import park_for_crossing
        from overstory.store import budgets, lifecycle, mail, quota
        from overstory.store import events as event_store

        if os.environ.get(FAULT_ENV) == "park":
            os._exit(9)  # dies after the turn, before the park: the watchdog and the budget check recover
        mail.release(self.state, turn_id)
        fresh = self.current()
        if fresh is None or result.status == "parked":
            return  # parked (or stopped) by someone else, who released the mail and told whom it concerns
        expect = {"booting", "in_turn", "between_turns", "stalled"}
        if result.status == "budget":
            crossing = result.crossing or budgets.check(self.state, self.name, self.generation, starting_turn=True)
            if crossing is None:  # the limit was raised meanwhile: its next turn gets the mail again
                sessions.transition(self.state, self.name, self.generation, "between_turns", actor="turn-runner",
                                    reason="budget raised during the turn", expect={"booting", "in_turn", "stalled"})
                return
            note = None
            if fresh.spec.get("loop"):  # an `ov loop` iteration: its escalation quotes the failed checks
                from overstory.agents.iterations.start import failures_note

                note = failures_note(self.state, self.name, self.generation, self.project.root)
            parked = park_for_crossing(self.state, fresh, crossing, actor="turn-runner", expect=expect, note=note)
            event_store.record(self.events, "budget_parked", agent=self.name, generation=self.generation,
                               turn_id=turn_id, summary=f"{crossing.reason}; parked: {', '.join(parked) or 'none'}"[:300],
                               data={"crossing": crossing.as_dict(), "parked": parked,
                                     "turn_cost_usd": round(result.cost_usd, 6)})
            return
        if result.status == "unknown":  # the turn may have worked and spent: its turn stays counted
            park_for_error(self.state, self.events, fresh, turn_id, result.reason, expect=expect)
            return
        budgets.refund_turn(self.state, self.name, self.generation)  # the turn did no work
        if result.status == "rate_limit":
            window = quota.close_window(self.state, fresh.provider or fresh.runtime, reset_at_ms=result.reset_at_ms,
                                        reason=result.reason, backoff_initial=self.config.quota.backoff_initial,
                                        backoff_max=self.config.quota.backoff_max)
            quota.park_agent(self.state, fresh, window, actor="turn-runner", stagger=self.config.quota.stagger,
                             detail=result.reason, expect=expect)
            others = quota.park_provider(self.state, window, actor="turn-runner", stagger=self.config.quota.stagger,
                                         except_agent=self.name)
            event_store.record(self.events, "quota_parked", agent=self.name, generation=self.generation,
                               turn_id=turn_id, summary=f"{window.describe()}: {result.reason}"[:300],
                               data={"provider": window.provider, "until": window.until_ms, "level": window.level,
                                     "reset_known": window.reset_known, "also_parked": others})
            return
        reason = f"auth: {result.reason}"
        lifecycle.park(self.state, fresh, "auth", reason[:300], actor="turn-runner", expect=expect,
                       details={"runtime": fresh.runtime, "message": result.reason})
        event_store.record(self.events, "auth_parked", agent=self.name, generation=self.generation, turn_id=turn_id,
                           summary=f"{reason} -- fix the key or login (`ov doctor`), then `ov resume {self.name}`"[:300])

    def _fresh_session_summary(self, agent: Session) -> str:
        # this generation's: an earlier one's mail is not its business
        rows = mail_queries.recent_to(self.state, self.name, agent.created_at, limit=10)
        recent = "\n".join(f"- from {r['sender']} ({r['type']}): {r['subject']}" for r in reversed(rows))
        prompt = agent.spec.get("prompt") or "(no prompt text; see your instructions)"
        return (
            f"[ov] Your previous session could not be resumed, so this is a fresh session. You are {agent.name}, "
            f"a {agent.capability} working on task {agent.task_id} on branch {agent.branch}. Check `git log` and "
            f"`git status` to see what you already did.\nTask: {prompt}\nRecent mail:\n{recent or '- none'}"
        )

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
        if self.gate is not None:
            self.gate.close()
        for conn in (self.state, self.events):
            try:
                conn.close()
            except sqlite3.Error:
                pass


def park_for_error(state: sqlite3.Connection, events: sqlite3.Connection, agent: Session, turn_id: str,
                   message: str, *, expect: t.Collection[str]) -> bool:
    """A turn that failed with an error ov cannot classify: park with the runtime's own message, and tell the
    parent (one escalation, in the park's transaction) instead of retrying a turn that may fail again at full
    price. `ov resume NAME` retries it (the same session, the same mail)."""
    from overstory.store import events as event_store
    from overstory.store import lifecycle

    reason = f"error: {message}"[:300]
    outcome = lifecycle.park(state, agent, "error", reason, actor="turn-runner", expect=expect,
                             details={"runtime": agent.runtime, "message": message, "turn_id": turn_id})
    if outcome.ok:
        event_store.record(events, "error_parked", agent=agent.name, generation=agent.generation, turn_id=turn_id,
                           summary=f"{reason} -- not retried (ov cannot tell whether it would fail again); "
                                   f"look at `ov logs {agent.name}`, then `ov resume {agent.name}`"[:300],
                           data={"runtime": agent.runtime, "message": message})
    return outcome.ok


def load_loop_config(project: ProjectPaths, name: str, environ: t.Mapping[str, str]) -> Config:
    """The configuration `ov sling` validated for this agent (``config_snapshot``), without pydantic.

    An agent slung before snapshots existed has none: then it is loaded here, as a command loads it.
    """
    from overstory.config import snapshot as config_snapshot

    try:
        return config_snapshot.read(config_snapshot.snapshot_path(project.run_dir / name))
    except (OSError, ValueError, KeyError, TypeError):
        from overstory.config import load as config_load

        return config_load.load(project.config_file, project.local_config_file, environ=environ)


def main(argv: t.Sequence[str] | None = None) -> int:
    # Started only by spawn_loop, always with the same three options: no argparse (memory, x 50 loops).
    from overstory.deferred import DEFERRED, defer

    for name in DEFERRED:  # inspect (with ast, dis, tokenize) only if something really uses it
        defer(name)
    words = list(sys.argv[1:] if argv is None else argv)
    options = dict(zip(words[::2], words[1::2]))
    told = options.get("--generation") or options.get("--go-fd") or ""
    warm = {"--project", "--agent", "--go-fd"} <= set(options) <= {"--project", "--agent", "--go-fd", "--runtime"}
    if len(words) % 2 or not (warm or set(options) == {"--project", "--agent", "--generation"}) or not told.isdigit():
        print("usage: python -m overstory.agents.loop --project ROOT --agent NAME (--generation N | --go-fd FD "
              "[--runtime NAME])", file=sys.stderr)
        return 2
    project = ProjectPaths(Path(options["--project"]))
    if warm:  # started early by `ov sling` (agents.warm_loop): the first turn's modules while it waits
        from overstory.agents.warm_loop import wait_for_go
        from overstory.agents.warm_up import warm_up

        warm_up(options.get("--runtime"))
        generation = wait_for_go(int(told), project, options["--agent"])
        if generation is None:
            return 0  # its spawn did not happen: nothing was touched
    else:
        generation = int(told)
    loop = AgentLoop(project, options["--agent"], generation)
    try:
        return loop.run()
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
