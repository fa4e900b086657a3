"""A writer's branch inside its sandbox, and taking it back out.

git moves a branch by creating ``<ref>.lock`` next to it and renaming that over the ref,
so the directory holding the ref must be writable (a bind of the ref file alone cannot
work: rename onto a mount point fails). Every agent's branch sits in the same directory,
``refs/heads/ov/``. Instead of making that shared directory writable, ov mounts a private
copy of it (``.overstory/run/<agent>/sandbox/refs``) over it inside the sandbox:

- before a turn (``prepare``): the copy gets every ``ov/*`` branch as it is now (so a merger
  can still merge ``ov/builder-x``) and ``base`` records the agent's own tip;
- after a turn, and while a tmux agent works (``take_back``): ov reads the agent's own ref
  from the copy, accepts only a plain object name of a commit, and moves the real branch
  with a compare-and-swap from ``base``. Whatever else the agent did to its copies (moved
  another agent's branch, planted a symbolic ref, created branches) never leaves it.

``take_back`` is idempotent and runs again before the next ``prepare``, so a loop that
died between the end of a turn and the take-back loses nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from overstory.records import Record
from overstory.sandbox.layout import OWN_LOGS, OWN_REFS, Layout

_OBJECT_NAME = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
_MAX_REF_BYTES = 200
# Variables that would point ov's own git calls at another repository.
_REDIRECTING = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY",
                "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS",
                "GIT_CONFIG_COUNT")


class TakeBack(Record):
    """What taking an agent's branch back after its turn did (a docstring: dataclasses then needs no inspect)."""

    __slots__ = ("status", "detail", "old", "new")
    _defaults = {"detail": "", "old": None, "new": None}

    status: str   # "moved", "unchanged", "none" (nothing to take), "refused", "conflict"
    detail: str
    old: str | None
    new: str | None


def _git(layout: Layout, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _REDIRECTING and not k.startswith("GIT_CONFIG_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    return subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=layout.root, capture_output=True,
                          text=True, env=env)


def _read_small(path: Path) -> str | None:
    """A ref file's text, without following a symlink the agent may have planted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return None
        return os.read(fd, _MAX_REF_BYTES + 1).decode("ascii", errors="replace")
    finally:
        os.close(fd)


def _object_name(text: str | None) -> str | None:
    if text is None or len(text) > _MAX_REF_BYTES:
        return None
    value = text.strip()
    return value if _OBJECT_NAME.fullmatch(value) else None


def current_tip(layout: Layout) -> str | None:
    """The agent's branch in the real repository (loose or packed), or None if it has none."""
    if layout.git_dir is None or layout.own_ref_name is None:
        return None
    loose = _object_name(_read_small(layout.git_dir / OWN_REFS / layout.own_ref_name))
    if loose is not None:
        return loose
    done = _git(layout, "rev-parse", "--verify", "--quiet", f"refs/heads/{layout.branch}^{{commit}}")
    return _object_name(done.stdout) if done.returncode == 0 else None


def _clear(directory: Path) -> None:
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.is_dir():
        with os.scandir(directory) as entries:
            flat = all(not entry.is_dir(follow_symlinks=False) for entry in entries)
        if flat:  # as a turn leaves it mostly: files only (shutil brings bz2 and lzma into the loop)
            with os.scandir(directory) as entries:
                for entry in entries:
                    os.unlink(entry.path)
            return
        import shutil

        shutil.rmtree(directory)
    directory.mkdir(parents=True)


def prepare(layout: Layout) -> TakeBack:
    """Before a turn (no sandbox of this agent runs): take back anything pending, then hand in fresh copies.

    Returns what the take-back found (a conflict there means the agent's last tip was not applied).
    """
    git = layout.git_dir
    if git is None or layout.own_ref_name is None or not layout.writer:
        return TakeBack("none")
    pending = take_back(layout)
    (git / OWN_REFS).mkdir(parents=True, exist_ok=True)  # a mount point must exist (and ref packing removes it)
    (git / OWN_LOGS).mkdir(parents=True, exist_ok=True)
    _clear(layout.private_refs)
    _clear(layout.private_logs)
    for entry in os.scandir(git / OWN_REFS):
        value = _object_name(_read_small(Path(entry.path))) if entry.is_file(follow_symlinks=False) else None
        if value is not None and "." not in entry.name:
            (layout.private_refs / entry.name).write_text(value + "\n", encoding="ascii")
    tip = current_tip(layout)
    own = layout.private_refs / layout.own_ref_name
    if tip is not None:
        own.write_text(tip + "\n", encoding="ascii")
        reflog = git / OWN_LOGS / layout.own_ref_name
        if reflog.is_file() and not reflog.is_symlink():  # a few lines per commit: read whole (no shutil, bz2, lzma)
            (layout.private_logs / layout.own_ref_name).write_bytes(reflog.read_bytes())
    elif own.exists():
        own.unlink()
    layout.base_file.write_text((tip or "") + "\n", encoding="ascii")
    _remove_stale_locks(layout)
    return pending


def _remove_stale_locks(layout: Layout) -> None:
    """Lock files a killed turn left in its own admin dir would make every later git command fail."""
    if layout.admin_dir is None:
        return
    for entry in os.scandir(layout.admin_dir):
        if entry.name.endswith(".lock") and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)


def take_back(layout: Layout, *, message: str = "ov: commits from the agent's sandbox") -> TakeBack:
    """Move the real branch to the agent's own tip from its private copy, if it is a commit."""
    if layout.git_dir is None or layout.own_ref_name is None or not layout.writer:
        return TakeBack("none")
    base_text = _read_small(layout.base_file)
    if base_text is None:
        return TakeBack("none", "no turn handed a branch in yet")
    base = _object_name(base_text)
    raw = _read_small(layout.private_refs / layout.own_ref_name)
    if raw is None:
        return TakeBack("none", "the agent's copy of its branch is gone (deleted or packed inside): nothing taken")
    new = _object_name(raw)
    if new is None:
        return TakeBack("refused", f"its branch file holds {raw.strip()[:80]!r}, not an object name", base, None)
    if new == base:
        return TakeBack("unchanged", old=base, new=new)
    kind = _git(layout, "cat-file", "-t", new)
    if kind.returncode != 0 or kind.stdout.strip() != "commit":
        return TakeBack("refused", f"{new} is not a commit in the repository", base, new)
    ref = f"refs/heads/{layout.branch}"
    done = _git(layout, "update-ref", "-m", message, ref, new, base or "0" * 40)
    if done.returncode != 0:
        return TakeBack("conflict", f"{layout.branch} moved outside the sandbox during the turn; the agent's tip "
                                    f"{new} was not applied ({' '.join(done.stderr.split())[:200]})", base, new)
    layout.base_file.write_text(new + "\n", encoding="ascii")
    return TakeBack("moved", old=base, new=new)
