"""A turn's checkpoint: the agent's session, claimed mail, worktree state and spend (ARCHITECTURE §13).

The turn runner writes one when a turn starts and rewrites it when the turn ends
(``store.checkpoints``). Recovery resumes an agent from its newest one and
``ov resume AGENT --fork`` starts a new agent from it.
"""

from __future__ import annotations

import os
import subprocess
import typing as t

from overstory.store import checkpoints, sessions
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

STATUS_SAMPLE = 10


def worktree_state(cwd: str | None) -> tuple[str | None, dict[str, t.Any] | None]:
    """(HEAD commit, ``git status`` summary) of ``cwd``; (None, None) when git cannot tell."""
    if not cwd:
        return None, None
    try:
        head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=30, check=False)
        status = subprocess.run(["git", "status", "--porcelain=v1", "--untracked-files=normal"], cwd=cwd,
                                capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    sha = head.stdout.strip() or None if head.returncode == 0 else None
    if status.returncode != 0:
        return sha, None
    counts = {"modified": 0, "added": 0, "deleted": 0, "renamed": 0, "untracked": 0, "conflicted": 0}
    paths: list[str] = []
    for line in status.stdout.splitlines():
        code, path = line[:2], line[3:]
        if code == "??":
            counts["untracked"] += 1
        elif "U" in code or code in ("AA", "DD"):
            counts["conflicted"] += 1
        elif "R" in code:
            counts["renamed"] += 1
        elif "D" in code:
            counts["deleted"] += 1
        elif "A" in code:
            counts["added"] += 1
        else:
            counts["modified"] += 1
        if len(paths) < STATUS_SAMPLE:
            paths.append(f"{code.strip() or '?'} {path}")
    return sha, {"clean": not status.stdout.strip(), **counts, "paths": paths}


def save_start(state: sqlite3.Connection, agent: Session, turn_id: str, *, attempt: int, scope: str,
               mail_ids: t.Sequence[int], resume_session_id: str | None, cwd: str | None, started_ms: int) -> None:
    head, status = worktree_state(cwd)
    checkpoints.save_start(state, turn_id, agent=agent.name, generation=agent.generation, attempt=attempt,
                           scope=scope or None, mail_ids=mail_ids, session_id=resume_session_id, head=head,
                           git_status=status, cost_usd=agent.cost_usd, input_tokens=agent.input_tokens,
                           output_tokens=agent.output_tokens, started_ms=started_ms)


def save_end(state: sqlite3.Connection, agent: Session, turn_id: str, *, session_id: str | None, cwd: str | None,
             turn_status: str) -> None:
    head, status = worktree_state(cwd)
    row = sessions.usage_row(state, agent.name, agent.generation)
    cost, tokens_in, tokens_out = (row[0], row[1], row[2]) if row else (agent.cost_usd, agent.input_tokens,
                                                                         agent.output_tokens)
    checkpoints.save_end(state, turn_id, session_id=session_id, head=head, git_status=status, cost_usd=cost,
                         input_tokens=tokens_in, output_tokens=tokens_out, turn_status=turn_status)


def clear_stale_git_locks(worktree: str | None, branch: str | None) -> list[str]:
    """Remove the lock files a killed git process left in an agent's own worktree; returns what went.

    Called before a turn starts, when none of the agent's processes runs, so a lock there
    is stale: a git command SIGKILLed mid-way (a crash, a reboot) never removes its
    ``index.lock``, and every later ``git add``/``git commit`` of the agent would fail. The
    agent cannot remove it itself (the guard keeps agents out of git's metadata). Only the
    agent's worktree (``index.lock``, ``HEAD.lock``) and its own branch's ref lock; never
    the project checkout.
    """
    if not worktree:
        return []
    try:
        with open(os.path.join(worktree, ".git"), encoding="utf-8") as handle:
            pointer = handle.read().strip()
    except OSError:
        return []
    if not pointer.startswith("gitdir:"):
        return []
    gitdir = os.path.join(worktree, pointer.split(":", 1)[1].strip())
    candidates = [os.path.join(gitdir, "index.lock"), os.path.join(gitdir, "HEAD.lock")]
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as handle:
            common = handle.read().strip()
        if branch:
            candidates.append(os.path.join(gitdir, common, "refs", "heads", *branch.split("/")) + ".lock")
    except OSError:
        pass
    removed = []
    for path in candidates:
        try:
            os.unlink(path)
            removed.append(os.path.normpath(path))
        except OSError:
            continue
    return removed
