"""The git steps both ends of a remote turn use (``travel_control`` on the control node, ``travel_node`` on a node).

A worktree's whole state travels as two commits: its branch's tip, and a *snapshot*: a commit whose tree is
the working files (tracked and untracked, not ignored) with the tip as parent, or the tip itself when nothing
is uncommitted. ``snapshot`` never touches the worktree's index or refs: it adds into a copy of the index.
``apply_tree`` makes the working files of ``old``'s tree into ``new``'s, path by path, and can run again after
a crash halfway to the same result (it writes whole files from the object store, not a patch).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import typing as t

from overstory.sandbox.gitrefs import _REDIRECTING

ZERO = "0" * 40
# The control node runs these in an agent's worktree, outside its sandbox: no hook and no fsmonitor command runs.
_SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
SNAPSHOT_MESSAGE = "ov: the worktree's uncommitted files at a remote turn's edge"  # never on a branch


class GitFailed(Exception):
    def __init__(self, argv: t.Sequence[str], result: subprocess.CompletedProcess[bytes]) -> None:
        detail = " ".join(result.stderr.decode("utf-8", "replace").split())[:300]
        super().__init__(f"git {' '.join(argv[:3])} failed ({result.returncode}): {detail}")


def git_env(extra: t.Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _REDIRECTING and not k.startswith("GIT_CONFIG_")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": env.get("GIT_AUTHOR_NAME", "ov"),
                "GIT_AUTHOR_EMAIL": env.get("GIT_AUTHOR_EMAIL", "ov@localhost"),
                "GIT_COMMITTER_NAME": env.get("GIT_COMMITTER_NAME", "ov"),
                "GIT_COMMITTER_EMAIL": env.get("GIT_COMMITTER_EMAIL", "ov@localhost")})
    env.update(extra or {})
    return env


def git(repo: str | os.PathLike[str], *argv: str, input: bytes | None = None, check: bool = True,
        env: t.Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run(["git", *_SAFE, "-C", str(repo), *argv], input=input, capture_output=True,
                            env=git_env(env), check=False)
    if check and result.returncode != 0:
        raise GitFailed(argv, result)
    return result


def out(repo: str | os.PathLike[str], *argv: str, **kwargs: t.Any) -> str:
    return git(repo, *argv, **kwargs).stdout.decode("utf-8", "replace").strip()


def read_ref(repo: str | os.PathLike[str], ref: str) -> str | None:
    found = git(repo, "rev-parse", "--verify", "-q", ref + "^{commit}", check=False)
    if found.returncode != 0:
        return None
    return found.stdout.decode().strip() or None


def create_refs(repo: str | os.PathLike[str], refs: t.Mapping[str, str]) -> bool:
    """Create every ref in one transaction, only if none exists; False when one existed (nothing changed)."""
    lines = "".join(f"create {name} {value}\n" for name, value in refs.items())
    return git(repo, "update-ref", "--stdin", input=lines.encode(), check=False).returncode == 0


def snapshot(worktree: str | os.PathLike[str], tip: str) -> str:
    """A commit of the worktree's working files on top of ``tip``, or ``tip`` when they are its tree."""
    index = out(worktree, "rev-parse", "--path-format=absolute", "--git-path", "index")
    with tempfile.TemporaryDirectory(prefix="ov-snap-") as scratch:
        copy = os.path.join(scratch, "index")
        env = {"GIT_INDEX_FILE": copy}
        if os.path.exists(index):
            shutil.copyfile(index, copy)  # the stat cache: only changed files are hashed again
        else:
            git(worktree, "read-tree", tip, env=env)
        git(worktree, "add", "-A", "--", ".", env=env)
        tree = out(worktree, "write-tree", env=env)
    if tree == out(worktree, "rev-parse", tip + "^{tree}"):
        return tip
    # The same files on the same tip make the same commit (a node that sends its finish again sends the same
    # object names): a fixed author and the tip's own date, never the clock.
    when = out(worktree, "log", "-1", "--format=%cd", "--date=raw", tip)
    return out(worktree, "commit-tree", tree, "-p", tip, "-m", SNAPSHOT_MESSAGE, env={
        "GIT_AUTHOR_NAME": "ov", "GIT_AUTHOR_EMAIL": "ov@localhost", "GIT_COMMITTER_NAME": "ov",
        "GIT_COMMITTER_EMAIL": "ov@localhost", "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when})


def unusable_tree(repo: str | os.PathLike[str], commit: str) -> str:
    """Why ``commit``'s files could not be checked out (a path such as ``../x`` or ``.git/config`` in a tree an
    agent made), or ""."""
    with tempfile.TemporaryDirectory(prefix="ov-check-") as scratch:
        found = git(repo, "read-tree", commit, env={"GIT_INDEX_FILE": os.path.join(scratch, "index")}, check=False)
    return "" if found.returncode == 0 else " ".join(found.stderr.decode("utf-8", "replace").split())[:200]


def _remove(worktree: str | os.PathLike[str], path: str) -> None:
    """Delete a file ``new`` no longer has, only inside the worktree: the trees come from an agent, and a crafted
    one could name ``../x`` or a path through a symlink it made (read-tree refuses such paths; unlink would not)."""
    full = os.path.join(os.path.realpath(worktree), path)
    if any(part in ("", ".", "..") or part.lower() == ".git" for part in path.split("/")) \
            or os.path.realpath(os.path.dirname(full)) != os.path.dirname(full):
        raise UnsafePath(f"refused to delete {path!r}: not a plain path inside the worktree")
    try:
        os.unlink(full)
    except FileNotFoundError:
        pass


class UnsafePath(ValueError):
    """A path in an agent's tree that would leave its worktree."""


def apply_tree(worktree: str | os.PathLike[str], old: str, new: str) -> list[str]:
    """Make the working files that differ between ``old`` and ``new`` as they are in ``new`` (deleted where ``new``
    has none); the index is then reset to HEAD (what is not committed shows as changes, as after a local turn)."""
    changed = [p for p in out(worktree, "diff", "--name-only", "--no-renames", "-z", old, new).split("\0") if p]
    if changed:
        present = set(p for p in out(worktree, "ls-tree", "-r", "-z", "--name-only", new, "--", *changed)
                      .split("\0") if p)
        with tempfile.TemporaryDirectory(prefix="ov-apply-") as scratch:
            env = {"GIT_INDEX_FILE": os.path.join(scratch, "index")}
            git(worktree, "read-tree", new, env=env)
            if present:
                git(worktree, "checkout-index", "-f", "-z", "--stdin", env=env,
                    input="\0".join(sorted(present)).encode() + b"\0")
        for path in changed:
            if path not in present:
                _remove(worktree, path)
    git(worktree, "reset", "-q")
    return changed
