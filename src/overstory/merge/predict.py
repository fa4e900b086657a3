"""``ov merge --dry-run``: predict the tier a merge needs without touching any working tree,
index or ref.

``git merge-tree --write-tree`` runs the same merge machinery as ``git merge`` but only
writes objects. It reads ``.gitattributes`` (``merge=union`` ...) from the working tree it
runs in, like ``git merge`` does: so it runs in a scratch directory holding only the target
commit's ``.gitattributes`` files, which is what the merge (always made in a fresh scratch
worktree of the target's commit) sees.

``ov merge --all --dry-run`` predicts a sequence: each branch against the target as it
would be after the branches before it merged. ``predict_merge(..., onto=COMMIT)`` predicts
against such a commit instead of the target's head, and the prediction carries the tree the
merge would make (``MergePrediction.tree``: git's merge with tier 2's resolutions put in);
``virtual_merge`` records it as a commit object whose parents are ``onto`` and the source,
for the next branch to be predicted against. Only objects are written (what ``merge-tree``
does anyway); no ref, index or working tree is touched, and git's gc drops them later.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory.errors import MergeError
from overstory.merge._git import Git, describe, parse_stage_entries
from overstory.merge.conflicts import MECHANICAL, NEEDS_MODEL, plan_conflict, union_saved_files
from overstory.merge.results import MergePrediction
from overstory.merge.threeway import duplicated_lines, lost_lines
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


# A fixed identity and date: the same virtual merge is the same object, and no git identity is needed.
_VIRTUAL_IDENTITY = {"GIT_AUTHOR_NAME": "ov merge --dry-run", "GIT_AUTHOR_EMAIL": "dry-run@ov.invalid",
                     "GIT_COMMITTER_NAME": "ov merge --dry-run", "GIT_COMMITTER_EMAIL": "dry-run@ov.invalid",
                     "GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000"}


def virtual_merge(repo_root: Path, tree: str, onto: str, source: str) -> str:
    """A commit object for a predicted merge (``tree``, parents ``onto`` and ``source``); no ref points at it."""
    git = Git(toplevel(repo_root), read_only=True, env=_VIRTUAL_IDENTITY)
    return git.out("commit-tree", tree, "-p", onto, "-p", resolve_commit(git, source, "source"),
                   "-m", "ov merge --dry-run: a predicted merge")


def _with_resolutions(root: Git, tree: str, contents: dict[str, tuple[str, bytes]]) -> str:
    """``tree`` with the given files (path -> (mode, content)) replaced, through a throw-away index."""
    if not contents:
        return tree
    with tempfile.TemporaryDirectory(prefix="ov-merge-tree-") as scratch:
        git = Git(root.cwd, read_only=True, env={"GIT_INDEX_FILE": str(Path(scratch, "index"))})
        git.run("read-tree", tree)
        records = b""
        for path, (mode, content) in sorted(contents.items()):
            oid = _write_blob(git, content)
            records += f"{mode} {oid}\t".encode() + os.fsencode(path) + b"\0"
        git.run("update-index", "-z", "--index-info", input=records)
        return git.out("write-tree")


def _write_blob(git: Git, content: bytes) -> str:
    return os.fsdecode(git.run("hash-object", "-w", "--stdin", "--no-filters", input=content).stdout).strip()


def predict_merge(repo_root: Path, source: str, target: str, *, onto: str | None = None) -> MergePrediction:
    """Predict merging ``source`` into ``target`` (or into the commit ``onto``: the target as it would be
    after earlier merges of a sequence); nothing but git objects is written."""
    root_path = toplevel(repo_root)
    root = Git(root_path, read_only=True)
    target = normalize_branch(target)
    source_sha = resolve_commit(root, source, "source")
    target_sha = branch_head(root, target) if onto is None else resolve_commit(root, onto, "onto")
    if root.ok("merge-base", "--is-ancestor", source_sha, target_sha):
        return MergePrediction(1, [], True, f"{source} is already merged into {target}; nothing to do",
                               tree=root.out("rev-parse", f"{target_sha}^{{tree}}"))
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
        merged_text = root.blob(result)
        lost = lost_lines(base_text, ours_text, theirs_text, merged_text)
        doubled = duplicated_lines(base_text, ours_text, theirs_text, merged_text)
        resolutions[path] = ("union" if not (lost or doubled) else f"union merge would drop {lost[0]!r}" if lost
                             else f"union merge would repeat {doubled[0]!r}")
        tiers.append(2 if not (lost or doubled) else None)
    resolved: dict[str, tuple[str, bytes]] = {}  # what the merge would write for each conflicted file
    guessed: list[str] = []
    for path, stages in sorted(conflicted.items()):
        plan = plan_conflict(path, stages, root.blob)
        if plan.kind == MECHANICAL:
            resolutions[path] = f"tier 2: {plan.detail}"
            tiers.append(2)
            resolved[path] = (t.cast(str, plan.mode), t.cast(bytes, plan.content))
        elif plan.kind == NEEDS_MODEL:
            resolutions[path] = f"tier 3: {plan.detail}"
            tiers.append(3)
            resolved[path] = (t.cast(str, plan.mode), plan.ours)  # the model's answer is unknown: assume ours
            guessed.append(path)
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
    tree = _with_resolutions(root, merged_tree, resolved) if tier is not None else None
    return MergePrediction(tier, conflicts, tier == 1, reason, resolutions, blocked_by, tree, guessed)



@dataclass
class MergeSequence:
    """The targets as the merges predicted so far would leave them (``ov merge --all --dry-run``).

    ``predict`` predicts a branch against its target's state after the earlier merges of the
    sequence; ``record`` adds a merge the real run would make (the caller decides: it knows
    ``tier_max``). A branch that would not merge is not recorded: the real run leaves it out too.
    """

    repo_root: Path
    tips: dict[str, str] = field(default_factory=dict)  # target -> the virtual merge commit after the last merge
    changed: dict[str, list[tuple[str, set[str]]]] = field(default_factory=dict)  # target -> [(label, files)]

    def predict(self, source: str, target: str) -> MergePrediction:
        return predict_merge(self.repo_root, source, target, onto=self.tips.get(normalize_branch(target)))

    def record(self, label: str, source: str, target: str, prediction: MergePrediction) -> None:
        if prediction.tree is None:
            return
        target = normalize_branch(target)
        root = Git(toplevel(self.repo_root), read_only=True)
        onto = self.tips.get(target) or branch_head(root, target)
        tip = virtual_merge(self.repo_root, prediction.tree, onto, source)
        self.changed.setdefault(target, []).append((label, set(root.paths("diff", "--name-only", "-z", onto, tip))))
        self.tips[target] = tip

    def earlier(self, target: str, paths: t.Iterable[str]) -> dict[str, list[str]]:
        """For each of ``paths``, the branches earlier in the sequence whose merge changes it."""
        merged = self.changed.get(normalize_branch(target), [])
        found = {path: [label for label, files in merged if path in files] for path in paths}
        return {path: labels for path, labels in found.items() if labels}
