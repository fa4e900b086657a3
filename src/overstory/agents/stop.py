"""`ov stop`: settle an agent to ``completed`` and make sure none of its processes live on.

Order matters. The state goes first (one compare-and-swap), so the loop and the
turn runner see a terminal agent and stop starting work; then the loop is
signalled and waited for; then whatever turn group the row still records is
killed. Only processes ov recorded, verified by their start ticks, are signalled.
Unclaimed mail stays where it is; mail claimed by the killed turn is released so
it stays readable. The agent's parent gets one ``status`` mail ("stopped by the
operator") inside the same compare-and-swap, so a lead or coordinator waiting for
the agent's report does not wait forever.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import procs
from overstory.errors import AgentNotFound, CleanRefused, OrchestratorError
from overstory.gitutil import branch_exists, git, worktree_admin_lock
from overstory.paths import ProjectPaths
from overstory.store import sessions, turns
from overstory.store.lifecycle import tell_parent_stopped
from overstory.store.sessions import Session

ACTOR = "operator"
STOPPED_REASON = "stopped by the operator"


@dataclass
class StopResult:
    agent: str
    generation: int
    previous_state: str
    already_completed: bool
    loop: str = "not running"  # stopped | killed | not running
    killed_groups: list[int] = field(default_factory=list)
    released_mail: int = 0
    cleaned: list[str] = field(default_factory=list)
    undone_spawn: list[str] | None = None  # what an unfinished (killed) `ov sling` of this name had made

    def as_dict(self) -> dict[str, t.Any]:
        return {"agent": self.agent, "generation": self.generation, "previous_state": self.previous_state,
                "state": "completed", "already_completed": self.already_completed, "loop": self.loop,
                "killed_groups": self.killed_groups, "released_mail": self.released_mail, "cleaned": self.cleaned,
                "undone_spawn": self.undone_spawn}


def stop_agent(project: ProjectPaths, conn: sqlite3.Connection, name: str, *, force: bool = False,
               clean: bool = False, kill_grace: float = 5.0, fallback_base: str | None = None,
               actor: str = ACTOR) -> StopResult:
    """Stop ``name``; raises AgentNotFound, CleanRefused (before anything changed) or OrchestratorError.

    A spawn of ``name`` that was killed half-way is undone first (it never became an agent).
    ``actor``: who stops it (the operator, or an ancestor agent through its endpoint).
    """
    from overstory.agents.spawn_journal import settle_abandoned

    undone = settle_abandoned(project, conn, name)
    agent = sessions.get(conn, name)
    if agent is None and undone is not None:
        return StopResult(agent=name, generation=0, previous_state="unfinished spawn", already_completed=False,
                          undone_spawn=undone)
    if agent is None:
        raise sessions.agent_not_found(conn, name)
    if clean:
        from overstory.merge.intents import settle_all

        settle_all(project, conn)  # a merge of its branch killed half-way: finished or rolled back first
    if clean and not force:
        check_clean_is_safe(project, agent, fallback_base)
    result = StopResult(agent=name, generation=agent.generation, previous_state=agent.state,
                        already_completed=agent.state == "completed")
    if not result.already_completed:
        who = "the operator" if actor == ACTOR else actor
        reason = f"stopped by {who}" + (" (--force)" if force else "")
        notified: list[int] = []

        def tell_parent(tx: sqlite3.Connection, ok: sessions.Ok) -> None:
            # The parent (a lead or coordinator waiting for the agent's report) hears it once, with the
            # state change; a zombie's parent already had its worker_died, the operator stopped it themself,
            # and a parent that stopped it through its endpoint knows.
            if ok.prev != "zombie" and agent.parent and agent.parent not in ("operator", actor):
                message_id = tell_parent_stopped(tx, agent, reason, ok.prev)
                if message_id is not None:
                    notified.append(message_id)

        outcome = sessions.transition(conn, name, agent.generation, "completed", actor=actor, reason=reason,
                                      then=tell_parent)
        if notified:
            from overstory.store import mail

            mail.record_sent(conn, notified)
        if isinstance(outcome, sessions.StaleGeneration):
            raise OrchestratorError(f"{name} was just replaced by generation {outcome.current}; "
                                    "run `ov stop` again to stop the new one")
        if isinstance(outcome, sessions.NotFound):
            raise AgentNotFound(name, detail="any more (it disappeared while ov was stopping it)")
        if isinstance(outcome, sessions.IllegalTransition):
            result.already_completed = True  # it completed by itself a moment ago
    _stop_processes(conn, agent, result, force=force, kill_grace=kill_grace)
    from overstory.sandbox import check_tree
    from overstory.sandbox.checks import kill_leftover, loop_record

    kill_leftover(loop_record(project.run_dir, name))  # a loop's check its killed loop left running, and its checkout
    for leftover in check_tree.leftovers(project.ov_dir, name):
        check_tree.remove(project.root, leftover)
    if agent.mode == "tmux":
        from overstory.agents.tmux import panes as tmux_panes

        tmux_panes.kill_session(project, agent, grace=kill_grace, force=force)
    if clean:
        result.cleaned = remove_worktree_and_branch(project, agent)
    result.undone_spawn = undone
    return result


def _stop_processes(conn: sqlite3.Connection, agent: Session, result: StopResult, *, force: bool,
                    kill_grace: float) -> None:
    from overstory.store import mail

    if procs.is_alive(agent.loop_pid, agent.loop_start_ticks):
        result.loop = _stop_loop(agent.loop_pid, agent.loop_start_ticks, force=force, grace=kill_grace)  # type: ignore[arg-type]
    # The loop may have started a turn between our read and the swap: read again now that it is gone.
    final = sessions.get(conn, agent.name)
    groups = {(agent.turn_pgid, agent.turn_start_ticks)}
    if final is not None and final.generation == agent.generation:
        groups.add((final.turn_pgid, final.turn_start_ticks))
    for pgid, ticks in sorted(groups, key=lambda g: g[0] or 0):
        if pgid is not None and procs.group_alive(pgid, ticks):
            procs.kill_group(pgid, ticks, grace=kill_grace, force=force)
            result.killed_groups.append(pgid)
    # Tool processes the runtime moved into sessions of their own carry the turn's id.
    running = turns.running_ids_of(conn, agent.name, agent.generation)
    for turn_id in {agent.current_turn_id, final.current_turn_id if final else None, *running}:
        if turn_id:
            procs.kill_turn(None, None, turn_id, grace=kill_grace, force=force)
    if final is not None and final.generation == agent.generation:
        sessions.update_fields(conn, agent.name, agent.generation, turn_pgid=None, turn_start_ticks=None,
                               current_turn_id=None, current_tool=None)
        result.released_mail = mail.release_agent(conn, agent.name)
        turns.end_live_turns(conn, agent.name, agent.generation, status="aborted", error=STOPPED_REASON)


def _stop_loop(pid: int, ticks: int | None, *, force: bool, grace: float) -> str:
    """SIGTERM the loop and wait for it; SIGKILL if it lingers.

    Even with --force the loop gets a short chance first: on SIGTERM it kills its
    own turn, including one it started a moment ago and has not recorded yet.
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "stopped"
    wait = 1.5 if force else max(grace, 0) + 2.0  # the loop needs ~0.5 s to notice
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not procs.is_alive(pid, ticks):
            return "stopped"
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and procs.is_alive(pid, ticks):
        time.sleep(0.05)
    return "killed"


# ---- --clean --------------------------------------------------------------------


def _base_branch(project: ProjectPaths, agent: Session, fallback: str | None) -> str | None:
    for candidate in (agent.base_branch, fallback):
        if candidate and branch_exists(project.root, candidate):
            return candidate
    return None


def check_clean_is_safe(project: ProjectPaths, agent: Session, fallback_base: str | None = None) -> None:
    """Refuse --clean when it would lose work: an unmerged branch or uncommitted changes."""
    if agent.branch and branch_exists(project.root, agent.branch):
        base = _base_branch(project, agent, fallback_base)
        if base is None:
            raise CleanRefused(f"cannot tell whether {agent.branch} is merged: its base branch "
                               f"{agent.base_branch!r} does not exist; pass --force to delete it anyway")
        merged = git(project.root, "branch", "--merged", base, "--list", agent.branch).stdout.strip()
        if not merged:
            raise CleanRefused(f"{agent.branch} has commits that are not merged into {base}; merge it first "
                               f"(`ov merge {agent.name}`), or pass --force to delete them, or stop without --clean")
    if agent.worktree and Path(agent.worktree).is_dir():
        changes = git(Path(agent.worktree), "status", "--porcelain", check=False).stdout.strip()
        if changes:
            count = len(changes.splitlines())
            raise CleanRefused(f"the worktree {agent.worktree} has {count} uncommitted change(s); commit them, "
                               "or pass --force to discard them, or stop without --clean")


def remove_worktree_and_branch(project: ProjectPaths, agent: Session) -> list[str]:
    """Remove the agent's worktree and branch (the caller decided it is safe); returns what went."""
    removed: list[str] = []
    if agent.worktree:
        worktree = Path(agent.worktree)
        with worktree_admin_lock(project.root):
            if worktree.exists():
                git(project.root, "worktree", "remove", "--force", str(worktree), check=False)
                if worktree.exists():
                    shutil.rmtree(worktree, ignore_errors=True)
                removed.append(str(worktree))
            git(project.root, "worktree", "prune", check=False)
    if agent.branch and branch_exists(project.root, agent.branch):
        done = git(project.root, "branch", "-D", agent.branch, check=False)
        if done.returncode != 0:
            raise OrchestratorError(f"could not delete branch {agent.branch}: {done.stderr.strip()}")
        removed.append(agent.branch)
    # An `ov loop`'s checkpoints, and the per-turn refs of turns that ran on other machines, go with its branch.
    for refs, what in ((f"refs/ov/checkpoints/{agent.name}/", "checkpoint"), (f"refs/ov/turns/{agent.name}/",
                                                                              "remote turn")):
        marks = git(project.root, "for-each-ref", "--format=%(refname)", refs, check=False).stdout.split()
        for ref in marks:
            git(project.root, "update-ref", "-d", ref, check=False)
        if marks:
            removed.append(f"{len(marks)} {what} ref(s) {refs}")
    return removed
