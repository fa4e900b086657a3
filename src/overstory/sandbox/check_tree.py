"""What a check over agent-written code judges: a fresh checkout of a commit, protected paths pinned.

A loop's check (or a phase's gate) judges a commit of the agent's branch, never its worktree:
what `ov merge` would take, and nothing else (no ignored file, nothing left beside the
commit). The loop first commits what the agent left uncommitted (``commit_leftovers``, as a
checkpoint does), so what was checked is what the branch holds. The commit is checked out,
detached, into a scratch worktree under ``.overstory/tmp``; the
paths the check depends on (``loop.protected_paths``) are put back as they are at the base
commit there, unless the operator allowed the agent to change them. A change to one of them
is reported to the caller, who counts it as a failed check.

Protected paths are git ``glob`` pathspecs relative to the repository root: ``conftest.py``
is the top-level file only, ``**/conftest.py`` every one, ``tests/`` (or ``tests``) the whole
directory, ``*`` does not cross ``/``.

ov's own git calls here never run a hook and ignore variables that would point them at
another repository; the checkout is made outside any sandbox but only writes files inside
the scratch worktree (git replaces a symlink, it never writes through one).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory.gitutil import worktree_admin_lock
from overstory.sandbox.gitrefs import _REDIRECTING

TREE_PREFIX = "check-"
_KINDS = {"A": "added", "M": "modified", "D": "deleted", "T": "type changed"}


@dataclass(frozen=True)
class Change:
    path: str
    change: str        # added, modified, deleted, type changed
    allowed: bool      # the operator allowed the agent to change it

    def as_dict(self) -> dict[str, t.Any]:
        return {"path": self.path, "change": self.change, "allowed": self.allowed}


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _REDIRECTING and not k.startswith("GIT_CONFIG_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    return subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, check=check, stdin=subprocess.DEVNULL)


def pathspecs(patterns: t.Iterable[str]) -> list[str]:
    return [f":(glob){p.rstrip('/') or '.'}" for p in patterns if p.strip()]


def _changed(root: Path, base: str, head: str, patterns: t.Sequence[str]) -> dict[str, str]:
    if not patterns:
        return {}
    out = _git(root, "diff", "--name-status", "--no-renames", "--no-ext-diff", "--no-textconv", "-z", base, head,
               "--", *pathspecs(patterns)).stdout
    fields = out.split("\0")
    found: dict[str, str] = {}
    for status, path in zip(fields[0::2], fields[1::2]):
        if path:
            found[path] = _KINDS.get(status[:1], status)
    return found


def protected_changes(root: Path, base: str, head: str, protected: t.Sequence[str],
                      allowed: t.Sequence[str] = ()) -> list[Change]:
    """Every protected path that differs between ``base`` and ``head`` (CalledProcessError if git cannot say)."""
    changed = _changed(root, base, head, protected)
    if not changed:
        return []
    permitted = set(_changed(root, base, head, allowed)) if allowed else set()
    return [Change(path, kind, path in permitted) for path, kind in sorted(changed.items())]


def describe(changes: t.Sequence[Change]) -> str:
    return ", ".join(f"{c.path} ({c.change})" for c in changes)


def commit_of(root: Path, ref: str) -> str | None:
    done = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return done.stdout.strip() or None


def base_of(root: Path, head: str, base_commit: str | None, base_branch: str | None) -> str | None:
    """The commit protected paths are pinned to: the one the agent was slung from, else the fork point."""
    if base_commit and commit_of(root, base_commit):
        return base_commit
    if base_branch:
        done = _git(root, "merge-base", head, f"refs/heads/{base_branch}", check=False)
        return done.stdout.strip() or None
    return None


_BUSY = ("MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "rebase-merge", "rebase-apply")


def on_own_branch(worktree: Path, branch: str) -> bool:
    """Whether the worktree's HEAD is its agent's branch. The agent can point it elsewhere (its admin dir is
    writable in its sandbox): ov, committing there from outside, would then move that other branch."""
    done = _git(worktree, "symbolic-ref", "-q", "HEAD", check=False)
    return done.returncode == 0 and done.stdout.strip() == f"refs/heads/{branch}"


def commit_leftovers(worktree: Path, branch: str, message: str) -> bool:
    """Commit what the agent left uncommitted in its worktree (ignored files stay out), as a checkpoint
    does: the check then judges what the branch holds. False when there was nothing, or git would not
    (its HEAD is not ``branch``, an unfinished merge or rebase, a refused commit: what is left stays
    uncommitted)."""
    if not on_own_branch(worktree, branch):
        return False
    for name in _BUSY:
        found = _git(worktree, "rev-parse", "--git-path", name, check=False).stdout.strip()
        if found and (worktree / found).exists():
            return False
    if not _git(worktree, "--no-optional-locks", "status", "--porcelain", check=False).stdout.strip():
        return False
    if _git(worktree, "add", "-A", check=False).returncode != 0:
        return False
    identity = [] if _git(worktree, "config", "user.email", check=False).stdout.strip() else \
        ["-c", "user.name=ov", "-c", "user.email=ov@localhost"]
    done = _git(worktree, *identity, "commit", "-q", "--no-verify", "-m", message, check=False)
    if done.returncode != 0:
        _git(worktree, "reset", "-q", check=False)
    return done.returncode == 0


def uncommitted(worktree: Path, ignore: t.Sequence[str] = ()) -> list[str]:
    """Paths with changes the worktree's last commit does not have (untracked ones too, not ignored ones)."""
    done = _git(worktree, "--no-optional-locks", "status", "--porcelain", "-z", "--untracked-files=all", check=False)
    found: list[str] = []
    entries = iter(done.stdout.split("\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        if entry[0] in "RC":
            next(entries, None)  # a rename's second field is its old path
        if entry[3:] not in ignore:
            found.append(entry[3:])
    return found


def scratch_dir(ov_dir: Path, owner: str) -> Path:
    return ov_dir / "tmp" / f"{TREE_PREFIX}{owner}-{secrets.token_hex(4)}"


def checkout(root: Path, commit: str, dest: Path, *, base: str | None = None,
             pinned: t.Sequence[str] = ()) -> None:
    """A detached worktree of ``commit`` at ``dest``, with ``pinned`` paths as they are in ``base``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with worktree_admin_lock(root):
        _git(root, "worktree", "add", "--quiet", "--detach", "--force", str(dest), commit)
    if pinned and base:
        # Files the base lacks are removed; the index keeps the commit's view (the check reads files).
        _git(dest, "restore", f"--source={base}", "--worktree", "--", *(f":(literal){p}" for p in pinned))


def remove(root: Path, dest: Path) -> None:
    """Remove a scratch worktree of ours, whatever state it is in."""
    with worktree_admin_lock(root):
        _git(root, "worktree", "remove", "--force", "--force", str(dest), check=False)
        if dest.exists():
            shutil.rmtree(dest, ignore_errors=True)
        _git(root, "worktree", "prune", check=False)


def leftovers(ov_dir: Path, owner: str) -> list[Path]:
    """Scratch worktrees a check of ``owner`` left behind (its process died during the check)."""
    folder = ov_dir / "tmp"
    if not folder.is_dir():
        return []
    prefix = f"{TREE_PREFIX}{owner}-"
    return sorted(p for p in folder.iterdir() if p.name.startswith(prefix) and len(p.name) == len(prefix) + 8)
