"""What ``predict_merge`` and ``merge_branch`` hand back."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MergePrediction:
    """A dry run's verdict.

    ``tier``: 1 clean (no resolution needed), 2 every conflict is mechanically resolvable
    (or git's ``merge=union`` resolved one), 3 some conflict needs the model (tier 3 may
    still fail its checks), None when a conflict no tier can resolve (modify/delete,
    binary, symlink, ...). ``conflicts``: every file git would leave in conflict plus files
    only ``merge=union`` saves. ``resolutions``: per file, how it would be resolved or why
    it cannot be. ``blocked_by``: uncommitted changes in the target's working tree that
    would make ``merge_branch`` refuse right now. ``tree``: the tree the merge would give the
    target (None when no tier can resolve it); for the files in ``guessed`` (tier 3) it holds
    the target's version, since the model's answer cannot be known in advance.
    """

    tier: int | None
    conflicts: list[str]
    clean: bool
    reason: str
    resolutions: dict[str, str] = field(default_factory=dict)
    blocked_by: list[str] = field(default_factory=list)
    tree: str | None = None
    guessed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MergeResult:
    """The outcome of ``merge_branch``.

    ``merged`` is True when the target now contains the source (``commit`` is the new merge
    commit, or the unchanged target head when it already did). On failure ``commit`` is
    None and the target is exactly as before; ``conflicts`` lists the files no allowed tier
    resolved and ``reason`` says why (or carries a failed quality gate's output tail). On
    success ``conflicts`` lists the files that needed resolving (tier 2 or 3).
    ``tier`` is the highest tier used (None when conflicts stopped the merge).
    ``files`` are the files the merge changed on the target; ``resolutions`` says how each
    resolved file was resolved.
    """

    merged: bool
    tier: int | None
    commit: str | None
    conflicts: list[str]
    reason: str
    files: list[str] = field(default_factory=list)
    resolutions: dict[str, str] = field(default_factory=dict)
    source_commit: str | None = None
    target_before: str | None = None
    commits: list[str] = field(default_factory=list)  # the commits the merge brought into the target, oldest first
    already_merged: bool = False  # the target already contained the source: nothing was done
