"""An agent's work as a diff against the branch it was slung from.

Committed and uncommitted changes in the agent's worktree (plus its untracked,
not-ignored files) against the merge base with its base branch; once the worktree
is gone, the branch alone. Only the worktree ov recorded for the agent, inside
``.overstory/worktrees/``, is ever read. External diff drivers and textconv filters
are switched off, so a repository's attributes cannot make this run a program.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from overstory.errors import AgentNotFound, OrchestratorError
from overstory.gitutil import branch_exists
from overstory.names import validate_name
from overstory.paths import ProjectPaths
from overstory.store import sessions

_DIFF_OPTIONS = ("--no-color", "--no-ext-diff", "--no-textconv")


class DiffError(OrchestratorError):
    """The agent has no work that can be shown as a diff."""


def _git(cwd: Path, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run(["git", "-c", "core.quotepath=off", *args], cwd=cwd, capture_output=True, check=False)
    if done.returncode not in ok:
        message = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
        raise DiffError(f"git {args[0]} failed: {message[-1] if message else f'exit {done.returncode}'}")
    return done.stdout.decode("utf-8", errors="replace")


def agent_diff(project: ProjectPaths, conn: sqlite3.Connection, name: str, *, stat: bool = False) -> str:
    """The agent's changes against its base branch, as `git diff` prints them (``stat``: the summary)."""
    validate_name(name, "agent name")
    agent = sessions.get(conn, name)
    if agent is None:
        raise AgentNotFound(f"no agent named {name!r}; `ov status --all` lists them")
    if not agent.branch:
        raise DiffError(f"{name} works at the project root: it has no branch of its own to diff")
    base = agent.base_branch
    if not base or not branch_exists(project.root, base):
        raise DiffError(f"{name}'s base branch {base!r} does not exist any more")
    shape = ("--stat",) if stat else ("--patch",)
    own = project.worktree(name).resolve()
    worktree = Path(agent.worktree).resolve() if agent.worktree else None
    if worktree is not None and worktree == own and worktree.is_dir():
        merge_base = _git(worktree, "merge-base", base, "HEAD").strip()
        text = _git(worktree, "diff", *_DIFF_OPTIONS, *shape, merge_base, "--")
        untracked = [p for p in _git(worktree, "ls-files", "--others", "--exclude-standard", "-z").split("\0") if p]
        for path in untracked:
            text += _git(worktree, "diff", *_DIFF_OPTIONS, *shape, "--no-index", "--", "/dev/null", path, ok=(0, 1))
        return text
    if branch_exists(project.root, agent.branch):
        return _git(project.root, "diff", *_DIFF_OPTIONS, *shape, f"{base}...{agent.branch}", "--")
    raise DiffError(f"{name} has neither a worktree nor a branch any more (cleaned up after its merge?)")
