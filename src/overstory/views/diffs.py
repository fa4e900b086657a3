"""`ov diff AGENT`: an agent's changes against its base, committed and not yet committed.

The base is where the agent's branch left its base branch (their merge base), so
work that landed on the base branch since does not show up as the agent's. While
the worktree exists, the working tree is compared, untracked files included
(through a throw-away copy of the worktree's index, so the agent's own index is
never touched); once it is gone, the branch is.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

from overstory.errors import DiffError
from overstory.gitutil import branch_exists, git
from overstory.paths import ProjectPaths
from overstory.store import sessions


def own_worktree(project: ProjectPaths, agent: sessions.Session) -> Path | None:
    """The agent's worktree if it exists and is the one ov made for it (``.overstory/worktrees/<name>``).

    A row pointing anywhere else (tampered with, or a stale path) is never read.
    """
    if not agent.worktree:
        return None
    worktree = Path(agent.worktree).resolve()
    return worktree if worktree == project.worktree(agent.name).resolve() and worktree.is_dir() else None


def agent_base(project: ProjectPaths, agent: sessions.Session, fallback: str | None = None) -> tuple[str, str]:
    """``(base branch, merge-base commit)`` of the agent's branch."""
    if not agent.branch:
        raise DiffError(f"{agent.name} works at the project root and has no branch of its own to diff")
    tip = agent.branch if branch_exists(project.root, agent.branch) else None
    if tip is None and own_worktree(project, agent) is not None:
        tip = "HEAD"
    if tip is None:
        raise DiffError(f"{agent.name}'s branch {agent.branch} and its worktree are gone (removed by "
                        "`ov stop --clean` or `ov clean`); nothing left to diff")
    for base in (agent.base_branch, fallback):
        if base and branch_exists(project.root, base):
            where = own_worktree(project, agent) or project.root if tip == "HEAD" else project.root
            found = git(where, "merge-base", base, tip, check=False)
            if found.returncode == 0 and found.stdout.strip():
                return base, found.stdout.strip()
    raise DiffError(f"cannot find the base of {agent.branch}: its base branch {agent.base_branch!r} does not exist")


def agent_diff(project: ProjectPaths, conn: sqlite3.Connection, name: str, *, stat: bool = False,
               color: bool = False, fallback_base: str | None = None) -> str:
    """The agent's changes against its base as ``git diff`` text (``--stat`` with ``stat``); "" when none."""
    agent = sessions.get(conn, name)
    if agent is None:
        raise sessions.agent_not_found(conn, name)
    _, base_commit = agent_base(project, agent, fallback_base)
    options = ["--stat"] if stat else ["--patch"]
    options.append("--color=always" if color else "--no-color")
    worktree = own_worktree(project, agent)
    if worktree is not None:
        return _worktree_diff(worktree, base_commit, options)
    return _checked(git(project.root, "diff", *options, base_commit, agent.branch or "", check=False))


def _worktree_diff(worktree: Path, base_commit: str, options: list[str]) -> str:
    """Working tree (untracked files too) against ``base_commit``, through a copy of the worktree's index."""
    index = Path(git(worktree, "rev-parse", "--path-format=absolute", "--git-path", "index").stdout.strip())
    with tempfile.TemporaryDirectory(prefix="ov-diff-") as scratch:
        scratch_index = Path(scratch) / "index"
        if index.is_file():
            shutil.copyfile(index, scratch_index)
        env = {**os.environ, "GIT_INDEX_FILE": str(scratch_index)}
        added = subprocess.run(["git", "add", "--all", "--", "."], cwd=worktree, env=env, capture_output=True,
                               text=True)
        if added.returncode != 0:
            raise DiffError(f"cannot read {worktree}: {added.stderr.strip()}")
        done = subprocess.run(["git", "diff", "--cached", *options, base_commit], cwd=worktree, env=env,
                              capture_output=True, text=True)
        return _checked(done)


def _checked(done: subprocess.CompletedProcess[str]) -> str:
    if done.returncode != 0:
        raise DiffError(f"git diff failed: {done.stderr.strip()}")
    return done.stdout
