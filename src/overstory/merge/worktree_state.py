"""Reading (never changing) the state of the repository and the target's working tree:
where a branch is checked out, what is uncommitted, and a snapshot to prove an aborted
merge left everything exactly as it was.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from overstory.errors import MergeError
from overstory.merge._git import OVERSTORY_DIR, Git, is_overstory_path


def normalize_branch(name: str) -> str:
    name = name.strip()
    return name[len("refs/heads/") :] if name.startswith("refs/heads/") else name


def toplevel(repo_root: Path) -> Path:
    root = Path(repo_root)
    if not root.is_dir():
        raise MergeError(f"{root} is not a directory")
    proc = Git(root, read_only=True).run("rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        raise MergeError(f"{root} is not inside a git repository")
    return Path(os.fsdecode(proc.stdout).strip()).resolve()


def resolve_commit(git: Git, spec: str, what: str) -> str:
    sha = git.rev(f"{spec}^{{commit}}")
    if sha is None:
        raise MergeError(f"{what} {spec!r} does not name a commit in {git.cwd}")
    return sha


def branch_head(git: Git, branch: str) -> str:
    sha = git.rev(f"refs/heads/{branch}^{{commit}}")
    if sha is None:
        raise MergeError(f"target branch {branch!r} does not exist in {git.cwd}")
    return sha


def checkout_location(git: Git, branch: str) -> Path | None:
    """The worktree that has ``branch`` checked out, if any."""
    raw = git.run("worktree", "list", "--porcelain", "-z").stdout
    current: Path | None = None
    for field_ in raw.split(b"\0"):
        text = os.fsdecode(field_)
        if text.startswith("worktree "):
            current = Path(text[len("worktree ") :])
        elif text == f"branch refs/heads/{branch}" and current is not None:
            return current.resolve()
    return None


TEMP_WORKTREE_PREFIX = "merge-"


def is_temporary_merge_worktree(location: Path, root: Path) -> bool:
    """Whether ``location`` is one of merge_branch's ``.overstory/tmp/merge-*`` worktrees."""
    parent = (root / OVERSTORY_DIR / "tmp").resolve()
    return location.resolve().parent == parent and location.name.startswith(TEMP_WORKTREE_PREFIX)


def operation_in_progress(git: Git) -> str | None:
    """A merge, rebase, cherry-pick or revert someone left unfinished in this worktree."""
    for ref, what in (("MERGE_HEAD", "a merge"), ("CHERRY_PICK_HEAD", "a cherry-pick"), ("REVERT_HEAD", "a revert")):
        if git.rev(ref) is not None:
            return what
    for name in ("rebase-merge", "rebase-apply"):
        path = Path(git.out("rev-parse", "--git-path", name))
        if not path.is_absolute():
            path = git.cwd / path
        if path.exists():
            return "a rebase"
    return None


@dataclass(frozen=True)
class StatusEntry:
    code: str  # the two porcelain status letters, "??" for untracked
    path: str


def status_entries(git: Git) -> list[StatusEntry]:
    """``git status`` of the worktree (untracked files listed one by one), without .overstory/."""
    raw = git.run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames").stdout
    entries = []
    for record in raw.split(b"\0"):
        if len(record) < 4:
            continue
        path = os.fsdecode(record[3:])
        if not is_overstory_path(path):
            entries.append(StatusEntry(os.fsdecode(record[:2]), path))
    return entries


def touched_paths(git: Git, target_sha: str, source_sha: str) -> set[str]:
    """Files the merge can change in the target's working tree: whatever the source changed
    since the merge base(s), both sides of a rename included."""
    bases = git.out("merge-base", "--all", target_sha, source_sha, check=False).split()
    touched: set[str] = set()
    for base in bases:
        touched.update(git.paths("diff", "--name-only", "--no-renames", "-z", base, source_sha))
    return touched


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


@dataclass(frozen=True)
class Blockers:
    staged: list[str]
    touched: list[str]

    @property
    def any(self) -> bool:
        return bool(self.staged or self.touched)

    def message(self, worktree: Path) -> str:
        parts = []
        if self.touched:
            parts.append(
                f"uncommitted changes to files the merge would change: {', '.join(self.touched)}"
            )
        if self.staged:
            parts.append(f"staged changes (git merges only onto a clean index): {', '.join(self.staged)}")
        return (
            f"refusing to merge into the working tree at {worktree}: " + "; ".join(parts)
            + ". Commit them or undo them first; ov never stashes or deletes your work."
        )


def find_blockers(git: Git, touched: set[str]) -> Blockers:
    """Uncommitted work the merge could overwrite, plus staged changes (git refuses those).

    Changes under .overstory/ are ignored. Untracked and ignored files sitting where the
    merge would create a file (or a directory) block too.
    """
    touched = {p for p in touched if not is_overstory_path(p)}
    touched_dirs = {a for p in touched for a in _ancestors(p)}
    staged, blocking = [], set()
    for entry in status_entries(git):
        if entry.code[0] not in " ?!":
            staged.append(entry.path)
        if entry.path in touched or entry.path in touched_dirs or any(a in touched for a in _ancestors(entry.path)):
            blocking.add(entry.path)
    present = [p for p in sorted(touched) if os.path.lexists(git.cwd / p)]
    if present:
        ignored = git.run("check-ignore", "-z", "--stdin", input=b"".join(os.fsencode(p) + b"\0" for p in present),
                          check=False)
        if ignored.returncode not in (0, 1):
            raise MergeError(f"git check-ignore failed in {git.cwd}: {ignored.stderr.decode(errors='replace')}")
        blocking.update(os.fsdecode(p) for p in ignored.stdout.split(b"\0") if p)
    return Blockers(sorted(staged), sorted(blocking))


def _content_digest(path: Path) -> str | None:
    try:
        if path.is_symlink():
            return "link:" + str(path.readlink())
        if path.is_dir():
            return "dir"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class WorktreeSnapshot:
    """HEAD, the branch it is on, the index, and every uncommitted file's status and content."""

    head: str | None
    head_ref: str | None
    index_digest: str
    changes: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def take_snapshot(git: Git) -> WorktreeSnapshot:
    head_ref = git.run("symbolic-ref", "-q", "HEAD", check=False)
    index = git.run("ls-files", "-s", "-z").stdout
    changes = {e.path: (e.code, _content_digest(git.cwd / e.path)) for e in status_entries(git)}
    return WorktreeSnapshot(
        head=git.rev("HEAD"),
        head_ref=os.fsdecode(head_ref.stdout).strip() if head_ref.returncode == 0 else None,
        index_digest=hashlib.sha256(index).hexdigest(),
        changes=changes,
    )


def snapshot_differences(before: WorktreeSnapshot, after: WorktreeSnapshot) -> tuple[list[str], list[str]]:
    """(differences, new untracked files). New untracked files (left by a quality gate, say)
    are reported separately: they are not the user's work and are never deleted.
    """
    problems = []
    if before.head != after.head:
        problems.append(f"HEAD moved from {before.head} to {after.head}")
    if before.head_ref != after.head_ref:
        problems.append(f"HEAD now points at {after.head_ref}, was {before.head_ref}")
    if before.index_digest != after.index_digest:
        problems.append("the index differs")
    new_untracked = []
    for path in sorted(set(before.changes) | set(after.changes)):
        was, now = before.changes.get(path), after.changes.get(path)
        if was == now:
            continue
        if was is None and now is not None and now[0] == "??":
            new_untracked.append(path)
        else:
            problems.append(f"{path}: was {was[0] if was else 'clean'}, now {now[0] if now else 'clean'}"
                            + (" (content changed)" if was and now and was[0] == now[0] else ""))
    return problems, new_untracked
