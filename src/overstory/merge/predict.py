"""``ov merge --dry-run``: predict the tier a merge needs without touching any working tree,
index or ref.

``git merge-tree --write-tree`` runs the same merge machinery as ``git merge`` but only
writes objects. It reads ``.gitattributes`` (``merge=union`` ...) from the working tree it
runs in, like ``git merge`` does: so it runs in a scratch directory holding only the target
commit's ``.gitattributes`` files, which is what the merge (always made in a fresh scratch
worktree of the target's commit) sees.
"""

from __future__ import annotations

import contextlib
import tempfile
import typing as t
from pathlib import Path

from overstory.errors import MergeError
from overstory.merge._git import Git, describe, parse_stage_entries
from overstory.merge.conflicts import MECHANICAL, NEEDS_MODEL, plan_conflict, union_saved_files
from overstory.merge.results import MergePrediction
from overstory.merge.threeway import lost_lines
from overstory.merge.worktree_state import (
    branch_head,
    checkout_location,
    find_blockers,
    is_temporary_merge_worktree,
    normalize_branch,
    resolve_commit,
    toplevel,
    touched_paths,
)


@contextlib.contextmanager
def _attributes_view(root: Git, commit: str) -> t.Iterator[Git]:
    """A read-only Git whose working tree holds just ``commit``'s .gitattributes files."""
    git_dir = root.out("rev-parse", "--absolute-git-dir")
    names = [p for p in root.paths("ls-tree", "-r", "-z", "--name-only", commit)
             if p == ".gitattributes" or p.endswith("/.gitattributes")]
    with tempfile.TemporaryDirectory(prefix="ov-merge-attrs-") as scratch:
        for name in names:
            file = Path(scratch) / name
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(root.blob(f"{commit}:{name}"))
        yield Git(
            Path(scratch),
            read_only=True,
            env={"GIT_DIR": git_dir, "GIT_WORK_TREE": scratch, "GIT_INDEX_FILE": str(Path(scratch, ".ov-empty-index"))},
        )


def predict_merge(repo_root: Path, source: str, target: str) -> MergePrediction:
    root_path = toplevel(repo_root)
    root = Git(root_path, read_only=True)
    target = normalize_branch(target)
    source_sha = resolve_commit(root, source, "source")
    target_sha = branch_head(root, target)
    if root.ok("merge-base", "--is-ancestor", source_sha, target_sha):
        return MergePrediction(1, [], True, f"{source} is already merged into {target}; nothing to do")
    base = root.out("merge-base", target_sha, source_sha, check=False)
    if not base:
        return MergePrediction(None, [], False, f"{source} and {target} share no history")

    checked_out = checkout_location(root, target)
    if checked_out is not None and is_temporary_merge_worktree(checked_out, root_path):
        checked_out = None  # a live merge's scratch worktree, or a dead one's that the next merge reaps
    notes: list[str] = []
    blocked_by: list[str] = []
    if checked_out == root_path:
        blockers = find_blockers(root, touched_paths(root, target_sha, source_sha))
        if blockers.any:
            blocked_by = sorted(set(blockers.staged) | set(blockers.touched))
            notes.append(blockers.message(root_path))
    elif checked_out is not None:
        notes.append(f"{target} is checked out in another worktree ({checked_out}); the merge would refuse")

    # The merge runs in a scratch checkout of the target's commit: its committed .gitattributes count.
    with _attributes_view(root, target_sha) as attr_git:
        proc = attr_git.run("merge-tree", "--write-tree", "--no-messages", "-z", target_sha, source_sha, check=False)
        if proc.returncode not in (0, 1):
            raise MergeError(f"git merge-tree failed: {describe(proc)}")
        merged_tree = proc.stdout.split(b"\0", 1)[0].decode()
        rest = proc.stdout.split(b"\0", 1)[1] if b"\0" in proc.stdout else b""
        conflicted = parse_stage_entries(rest) if proc.returncode == 1 else {}
        union_files = union_saved_files(root, attr_git, base, target_sha, source_sha)

    resolutions: dict[str, str] = {}
    tiers: list[int | None] = []
    for path in union_files:
        if path in conflicted:
            continue
        result = root.rev(f"{merged_tree}:{path}")
        versions = [root.rev(f"{c}:{path}") for c in (base, target_sha, source_sha)]
        if result is None or None in versions:
            continue
        base_text, ours_text, theirs_text = (root.blob(t.cast(str, v)) for v in versions)
        lost = lost_lines(base_text, ours_text, theirs_text, root.blob(result))
        resolutions[path] = "union" if not lost else f"union merge would drop {lost[0]!r}"
        tiers.append(2 if not lost else None)
    for path, stages in sorted(conflicted.items()):
        plan = plan_conflict(path, stages, root.blob)
        if plan.kind == MECHANICAL:
            resolutions[path] = f"tier 2: {plan.detail}"
            tiers.append(2)
        elif plan.kind == NEEDS_MODEL:
            resolutions[path] = f"tier 3: {plan.detail}"
            tiers.append(3)
        else:
            resolutions[path] = f"unresolvable: {plan.detail}"
            tiers.append(None)

    conflicts = sorted(set(conflicted) | set(resolutions))
    if not tiers:
        tier: int | None = 1
        reason = "clean merge"
    elif None in tiers:
        tier = None
        stuck = [p for p, how in resolutions.items() if how.startswith(("unresolvable", "union merge would"))]
        reason = f"conflicts no tier can resolve: {', '.join(sorted(stuck))}"
    else:
        tier = max(t.cast(list[int], tiers))
        reason = {2: "every conflict is mechanically resolvable", 3: "some conflicts need model-assisted resolution"}[
            tier
        ]
    if notes:
        reason += "; " + "; ".join(notes)
    return MergePrediction(tier, conflicts, tier == 1, reason, resolutions, blocked_by)

