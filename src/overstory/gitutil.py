"""Small, fast git queries through the git CLI (no gitpython import on hot paths)."""

from __future__ import annotations

import subprocess
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from overstory.errors import NotAGitRepository


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def repo_toplevel(path: Path) -> Path:
    try:
        result = git(path, "rev-parse", "--show-toplevel", check=False)
    except FileNotFoundError:
        raise NotAGitRepository("git is not installed (or not on PATH)") from None
    if result.returncode != 0:
        raise NotAGitRepository(f"{path} is not inside a git repository; run `git init` and make a first commit")
    return Path(result.stdout.strip()).resolve()


def has_commit(root: Path) -> bool:
    return git(root, "rev-parse", "--verify", "--quiet", "HEAD", check=False).returncode == 0


def current_branch(root: Path) -> str | None:
    """The checked-out branch, or None on a detached HEAD."""
    result = git(root, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return result.stdout.strip() or None if result.returncode == 0 else None


def branch_exists(root: Path, branch: str) -> bool:
    return git(root, "show-ref", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode == 0


@contextmanager
def worktree_admin_lock(repo_root: Path) -> Iterator[None]:
    """Serialise `git worktree add/remove/prune` in one repository.

    git does not lock its worktree administration files: concurrent `worktree add`
    calls can fail with "failed to read .git/worktrees/<other>/commondir".
    """
    import fcntl

    lock_dir = repo_root / ".overstory" / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "git-worktrees.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def keep_out_of_commits(worktree: Path, relative_paths: t.Sequence[str]) -> None:
    """Untracked files go into the repository's exclude list; tracked ones get skip-worktree."""
    common = git(worktree, "rev-parse", "--git-common-dir").stdout.strip()
    exclude = (worktree / common / "info" / "exclude").resolve() if not Path(common).is_absolute() else Path(common) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    existing = exclude.read_text() if exclude.exists() else ""
    missing = [p for p in relative_paths if f"/{p}" not in existing.splitlines()]
    if missing:
        with open(exclude, "a", encoding="utf-8") as handle:
            if existing and not existing.endswith("\n"):
                handle.write("\n")
            handle.write("# added by ov: per-agent files (instructions, hook settings, progress)\n")
            handle.writelines(f"/{p}\n" for p in missing)
    for path in relative_paths:
        if git(worktree, "ls-files", "--error-unmatch", path, check=False).returncode == 0:
            git(worktree, "update-index", "--skip-worktree", path)
