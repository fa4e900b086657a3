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
    try:  # one git process: porcelain v2 says the HEAD commit too
        status = subprocess.run(["git", "status", "--porcelain=v2", "--branch", "--untracked-files=normal"], cwd=cwd,
                                capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if status.returncode != 0:
        return None, None
    sha = None
    counts = {"modified": 0, "added": 0, "deleted": 0, "renamed": 0, "untracked": 0, "conflicted": 0}
    paths: list[str] = []
    changed = 0
    for line in status.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "#":
            header, _, value = rest.partition(" ")
            if header == "branch.oid" and value != "(initial)":
                sha = value
            continue
        changed += 1
        if kind == "?":
            code, path = "??", _quoted(rest)
            counts["untracked"] += 1
        elif kind == "u":  # u XY sub m1 m2 m3 mW h1 h2 h3 path
            fields = rest.split(" ", 9)
            code, path = fields[0].replace(".", " "), _quoted(fields[-1])
            counts["conflicted"] += 1
        elif kind in ("1", "2"):  # 1 XY sub mH mI mW hH hI path; 2 ... Xscore path<TAB>orig
            fields = rest.split(" ", 7 if kind == "1" else 8)
            code, path = fields[0].replace(".", " "), _quoted(fields[-1])
            if kind == "2":
                new, _, old = fields[-1].partition("\t")
                path = f"{_quoted(old)} -> {_quoted(new)}"
            counts[_class_of(code)] += 1
        else:
            continue
        if len(paths) < STATUS_SAMPLE:
            paths.append(f"{code.strip() or '?'} {path}")
    return sha, {"clean": changed == 0, **counts, "paths": paths}


def first_turn_of_new_worktree(agent: Session, *, attempt: int, resume_session_id: str | None,
                               cwd: str | None) -> bool:
    """The first attempt of the first turn in a worktree checked out by the agent's own spawn (no retry of a
    turn that may have changed it, no `ov resume` of a reused worktree, no session to continue)."""
    return (bool(cwd) and cwd == agent.worktree and agent.turns == 0 and attempt == 0 and not resume_session_id
            and bool(agent.spec.get("new_worktree")))


def head_of(cwd: str | None) -> str | None:
    """The commit checked out in ``cwd`` (None when git cannot tell): no index is read."""
    if not cwd:
        return None
    try:
        done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _quoted(path: str) -> str:
    """A path as the short format shows it: v2 quotes what it must, v1 also a name with a space in it."""
    return f'"{path}"' if " " in path and not path.startswith('"') else path


def _class_of(code: str) -> str:
    """What an ``XY`` status code counts as (git status --porcelain's letters)."""
    if code in ("AA", "DD") or "U" in code:
        return "conflicted"
    if "R" in code:
        return "renamed"
    if "D" in code:
        return "deleted"
    if "A" in code:
        return "added"
    return "modified"


def save_start(state: sqlite3.Connection, agent: Session, turn_id: str, *, attempt: int, scope: str,
               mail_ids: t.Sequence[int], resume_session_id: str | None, cwd: str | None, started_ms: int) -> None:
    """The start checkpoint: HEAD and a `git status` summary of ``cwd``, except on the first attempt of an agent's
    first turn in the worktree its spawn just checked out (``first_turn_of_new_worktree``): there the worktree
    is that checkout and only HEAD is read. Its status would cost the most of any: right after a checkout,
    every file is as new as the index, so git re-reads each one to tell whether it changed (30-45 ms for
    5,000 files here, against 11 ms a second later; figure 12)."""
    if first_turn_of_new_worktree(agent, attempt=attempt, resume_session_id=resume_session_id, cwd=cwd):
        head, status = head_of(cwd), None
    else:
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
