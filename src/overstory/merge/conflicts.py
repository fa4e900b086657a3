"""Deciding, per conflicted file, which tier can resolve it. Shared by the dry run and the merge.

Only a content conflict between two regular text files can be resolved (tier 2 or 3).
Anything structural (deleted on one side, binary, symlink, submodule, file modes changed
differently) is reported and left alone: choosing a side there is a decision, not a
mechanical step.
"""

from __future__ import annotations

import os
import tempfile
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory.merge._git import Git
from overstory.merge.threeway import duplicated_lines, lost_lines, resolve_mechanically

REGULAR_MODES = ("100644", "100755")

MECHANICAL = "mechanical"
NEEDS_MODEL = "needs model"
STRUCTURAL = "structural"

Stages = t.Mapping[int, tuple[str, str]]


@dataclass(frozen=True)
class ConflictPlan:
    """How one conflicted path can be resolved.

    ``kind`` is MECHANICAL (``content`` holds the verified tier-2 result), NEEDS_MODEL (a
    text content conflict tier 2 cannot settle) or STRUCTURAL (nothing here resolves it).
    """

    path: str
    kind: str
    detail: str
    mode: str | None = None
    base: bytes = b""
    ours: bytes = b""
    theirs: bytes = b""
    content: bytes | None = None


def _looks_binary(data: bytes) -> bool:
    return b"\0" in data[:8000]


def _merged_mode(base: str | None, ours: str, theirs: str) -> str | None:
    if ours == theirs:
        return ours
    if base == ours:
        return theirs
    if base == theirs:
        return ours
    return None


def plan_conflict(path: str, stages: Stages, read_blob: t.Callable[[str], bytes], *,
                  keep_both: bool = True) -> ConflictPlan:
    """``keep_both=False``: two insertions at one place are not combined by tier 2 (they go to the model)."""
    base_entry, ours_entry, theirs_entry = stages.get(1), stages.get(2), stages.get(3)
    if ours_entry is None or theirs_entry is None:
        gone = "target" if ours_entry is None else "source"
        return ConflictPlan(path, STRUCTURAL, f"deleted or renamed away on the {gone} side, changed on the other")
    modes = [e[0] for e in (base_entry, ours_entry, theirs_entry) if e is not None]
    if any(m not in REGULAR_MODES for m in modes):
        return ConflictPlan(path, STRUCTURAL, "not a regular file on every side (symlink or submodule)")
    mode = _merged_mode(base_entry[0] if base_entry else None, ours_entry[0], theirs_entry[0])
    if mode is None:
        return ConflictPlan(path, STRUCTURAL, "file mode changed differently on both sides")
    base = read_blob(base_entry[1]) if base_entry else b""
    ours, theirs = read_blob(ours_entry[1]), read_blob(theirs_entry[1])
    if any(_looks_binary(data) for data in (base, ours, theirs)):
        return ConflictPlan(path, STRUCTURAL, "binary file changed on both sides")
    resolution = resolve_mechanically(base, ours, theirs, keep_both=keep_both)
    if resolution.content is None:
        regions = resolution.unresolved_regions
        detail = f"{regions} region{'s' if regions != 1 else ''} changed differently on both sides"
        return ConflictPlan(path, NEEDS_MODEL, detail, mode, base, ours, theirs)
    lost = lost_lines(base, ours, theirs, resolution.content)
    if lost:  # by construction this should not happen; the check is the guarantee
        return ConflictPlan(path, NEEDS_MODEL, f"mechanical result would drop {lost[0]!r}", mode, base, ours, theirs)
    doubled = duplicated_lines(base, ours, theirs, resolution.content)
    if doubled:  # the same: the check, not the construction, is the guarantee
        return ConflictPlan(path, NEEDS_MODEL, f"mechanical result would repeat {doubled[0]!r}", mode, base, ours,
                            theirs)
    rules = ", ".join(sorted(resolution.rules))
    return ConflictPlan(path, MECHANICAL, rules, mode, base, ours, theirs, resolution.content)


def union_attributed(attr_git: Git, paths: t.Iterable[str]) -> list[str]:
    """The paths whose ``merge`` attribute is ``union`` (as seen from ``attr_git``'s worktree)."""
    paths = list(paths)
    if not paths:
        return []
    raw = attr_git.run("check-attr", "-z", "--stdin", "merge", input=b"".join(os.fsencode(p) + b"\0" for p in paths))
    fields = raw.stdout.split(b"\0")
    found = []
    for n in range(0, len(fields) - 2, 3):
        if fields[n + 2] == b"union":
            found.append(os.fsdecode(fields[n]))
    return found


def union_saved_files(repo_git: Git, attr_git: Git, base: str, ours: str, theirs: str) -> list[str]:
    """Files with ``merge=union`` that a plain text merge would have left in conflict.

    git resolves these itself (keeping both sides' lines), so the merge looks clean; they
    are counted as tier-2 resolutions and get the same verification.
    """
    ours_changed = set(repo_git.paths("diff", "--name-only", "--no-renames", "-z", base, ours))
    theirs_changed = set(repo_git.paths("diff", "--name-only", "--no-renames", "-z", base, theirs))
    saved = []
    for path in sorted(union_attributed(attr_git, ours_changed & theirs_changed)):
        versions = [repo_git.rev(f"{commit}:{path}") for commit in (base, ours, theirs)]
        if any(v is None for v in versions):
            continue
        with tempfile.TemporaryDirectory(prefix="ov-union-") as tmp:
            files = []
            for name, oid in zip(("base", "ours", "theirs"), versions, strict=True):
                file = Path(tmp) / name
                file.write_bytes(repo_git.blob(t.cast(str, oid)))
                files.append(str(file))
            plain = repo_git.run("merge-file", "-p", "-q", files[1], files[0], files[2], check=False)
        if plain.returncode != 0:
            saved.append(path)
    return saved
