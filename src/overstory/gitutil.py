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
    """The checked-out branch, or None on a detached HEAD.

    In a main worktree whose HEAD names a branch, read from ``.git/HEAD`` itself (`ov sling` asks on every
    spawn, and a git process costs it 2-3 ms); anything else is git's to answer."""
    import os

    if (root / ".git").is_dir() and not os.environ.keys() & {"GIT_DIR", "GIT_COMMON_DIR", "GIT_WORK_TREE"}:
        try:
            head = (root / ".git" / "HEAD").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            head = ""
        prefix = "ref: refs/heads/"
        if head.startswith(prefix) and head.endswith("\n") and head.count("\n") == 1 and len(head) > len(prefix) + 1:
            return head[len(prefix):-1]
    result = git(root, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return result.stdout.strip() or None if result.returncode == 0 else None


def branch_exists(root: Path, branch: str) -> bool:
    return git(root, "show-ref", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode == 0


def branch_refs(root: Path, *branches: str) -> dict[str, tuple[str, str]]:
    """Each of ``branches`` that exists (loose or packed), as (the type of object it names, that object's id),
    in one git call: a branch left out does not exist."""
    wanted = {f"refs/heads/{branch}": branch for branch in branches}
    listed = git(root, "for-each-ref", "--format=%(refname) %(objecttype) %(objectname)", *wanted, check=False)
    found = {}
    for line in listed.stdout.splitlines():  # a pattern also matches refs below it (main/x): exact names only
        ref, kind, name = line.split(" ")
        if ref in wanted:
            found[wanted[ref]] = (kind, name)
    return found


def branch_tips(root: Path, *branches: str) -> dict[str, str]:
    """The commit each of ``branches`` that exists points at, in one git call (absent ones are left out)."""
    return {branch: name for branch, (kind, name) in branch_refs(root, *branches).items() if kind == "commit"}


def common_dir(root: Path) -> Path:
    """The repository's shared .git folder for the worktree at ``root`` (its own .git folder in the main one)."""
    import os

    if (root / ".git").is_dir() and not os.environ.keys() & {"GIT_DIR", "GIT_COMMON_DIR"}:
        return (root / ".git").resolve()  # the main worktree: no git process needed
    found = git(root, "rev-parse", "--git-common-dir").stdout.strip()
    return (root / found).resolve()


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


def keep_out_of_commits(worktree: Path, relative_paths: t.Sequence[str], *, common: Path | None = None) -> None:
    """Untracked files go into the repository's exclude list; tracked ones get skip-worktree.

    ``common``: the repository's common git folder, when the caller knows it (one git call fewer)."""
    exclude = (common or common_dir(worktree)) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    existing = exclude.read_text() if exclude.exists() else ""
    missing = [p for p in relative_paths if f"/{p}" not in existing.splitlines()]
    if missing:
        with open(exclude, "a", encoding="utf-8") as handle:
            if existing and not existing.endswith("\n"):
                handle.write("\n")
            handle.write("# added by ov: per-agent files (instructions, hook settings, progress)\n")
            handle.writelines(f"/{p}\n" for p in missing)
    listed = git(worktree, "--literal-pathspecs", "ls-files", "-z", "--", *relative_paths) if relative_paths else None
    tracked = listed.stdout.split("\0")[:-1] if listed is not None else []
    if tracked:
        git(worktree, "update-index", "--skip-worktree", "--", *tracked)
