"""``merge_branch``: merge a source branch into a target branch, tier by tier.

The flow, all under the target's ``TargetLock``:

1. Where: if the target is checked out at the repository root, merge there; if it is
   checked out in another worktree, refuse; otherwise check it out in a temporary
   worktree under ``.overstory/tmp/merge-<random>``, removed afterwards whatever happens.
2. Refuse (MergeError, nothing touched) when the root's working tree has uncommitted
   changes the merge would overwrite, staged changes, or an unfinished merge/rebase.
   Changes under ``.overstory/`` never count.
3. ``git merge --no-ff --no-commit`` (tier 1). Conflicts are resolved per file by the
   lowest tier allowed that works: tier 2 (``threeway``; git's own ``merge=union`` counts
   here), tier 3 (a ``ModelResolver``). Every resolution must pass ``lost_lines``.
   Model calls are only made once every other conflict is known to be resolvable.
4. Quality gates run in the merged working tree; then the merge commit is made.
5. Any failure (or exception) before the commit: ``git merge --abort`` in the worktree we
   merged in (a ``git reset --merge`` to the recorded HEAD only if that did not restore it),
   then a snapshot comparison proves HEAD, index and working tree are as before.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import typing as t
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from overstory.errors import MergeError
from overstory.gitutil import worktree_admin_lock
from overstory.merge._git import OVERSTORY_DIR, Git, describe, parse_stage_entries, unredirected_env
from overstory.merge.conflicts import MECHANICAL, NEEDS_MODEL, ConflictPlan, plan_conflict, union_saved_files
from overstory.merge.lock import TargetLock
from overstory.merge.model import ModelResolver, accept_model_reply
from overstory.merge.results import MergeResult
from overstory.merge.threeway import lost_lines
from overstory.merge.worktree_state import (
    TEMP_WORKTREE_PREFIX,
    WorktreeSnapshot,
    branch_head,
    checkout_location,
    find_blockers,
    is_temporary_merge_worktree,
    normalize_branch,
    operation_in_progress,
    resolve_commit,
    snapshot_differences,
    take_snapshot,
    toplevel,
    touched_paths,
)

DEFAULT_LOCK_WAIT = 60.0
DEFAULT_GATE_TIMEOUT = 1800.0
GATE_TAIL_LINES = 40
GATE_TAIL_CHARS = 4000


@dataclass(frozen=True)
class _Job:
    source: str
    source_sha: str
    target: str
    target_sha: str
    tier_max: int
    resolver: ModelResolver | None
    gates: tuple[str, ...]
    message: str | None
    gate_timeout: float | None

    def failed(self, conflicts: t.Iterable[str], reason: str, **extra: t.Any) -> MergeResult:
        return MergeResult(
            merged=False,
            tier=extra.pop("tier", None),
            commit=None,
            conflicts=sorted(conflicts),
            reason=reason,
            source_commit=self.source_sha,
            target_before=self.target_sha,
            **extra,
        )


def merge_branch(
    repo_root: Path,
    source: str,
    target: str,
    *,
    tier_max: int = 2,
    model_resolver: ModelResolver | None = None,
    gates: Sequence[str] = (),
    message: str | None = None,
    lock_dir: Path | None = None,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    on_lock_wait: t.Callable[[int | None], None] | None = None,
    gate_timeout: float | None = DEFAULT_GATE_TIMEOUT,
) -> MergeResult:
    """Merge ``source`` (any commit-ish) into branch ``target`` of the repository at ``repo_root``.

    Returns a MergeResult; ``merged=False`` means conflicts or a gate stopped it and the
    target is exactly as before. Raises MergeError when the merge cannot even be tried
    (unknown branch, uncommitted work in the way, git failing) and LockHeld when another
    merge into the same target holds the lock for longer than ``lock_wait`` seconds.
    ``lock_dir`` defaults to ``<repo_root>/.overstory/locks``.
    """
    if tier_max not in (1, 2, 3):
        raise MergeError(f"tier_max must be 1, 2 or 3, not {tier_max!r}")
    root_path = toplevel(repo_root)
    root = Git(root_path)
    target = normalize_branch(target)
    source_sha = resolve_commit(root, source, "source")
    _require_identity(root)
    lock_dir = Path(lock_dir) if lock_dir is not None else root_path / OVERSTORY_DIR / "locks"
    with TargetLock(lock_dir, target, lock_wait, on_wait=on_lock_wait):
        target_sha = branch_head(root, target)
        if root.ok("merge-base", "--is-ancestor", source_sha, target_sha):
            return MergeResult(
                merged=True, tier=1, commit=target_sha, conflicts=[],
                reason=f"{source} is already merged into {target}; nothing to do",
                source_commit=source_sha, target_before=target_sha,
            )
        if not root.out("merge-base", target_sha, source_sha, check=False):
            raise MergeError(f"{source} and {target} share no history; ov does not merge unrelated histories")
        job = _Job(source, source_sha, target, target_sha, tier_max, model_resolver, tuple(gates), message,
                   gate_timeout)
        location = checkout_location(root, target)
        if location is not None and is_temporary_merge_worktree(location, root_path):
            # Only a merge into this target creates such a worktree, under the lock we now hold:
            # this one was left by a merge that died. It holds nobody's work.
            with worktree_admin_lock(root_path):
                _remove_worktree(root, location)
            location = None
        if location == root_path:
            return _merge_in(root, job, at_root=True)
        if location is not None:
            raise MergeError(
                f"target branch {target!r} is checked out in another worktree ({location}); "
                "merge there, or switch that worktree to another branch first"
            )
        with _temporary_worktree(root, root_path, target) as worktree:
            return _merge_in(Git(worktree), job, at_root=False)


def _require_identity(git: Git) -> None:
    for var in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"):
        proc = git.run("var", var, check=False)
        if proc.returncode != 0:
            raise MergeError(f"git cannot make the merge commit, no identity configured: {describe(proc)}")


@contextlib.contextmanager
def _temporary_worktree(root: Git, root_path: Path, target: str) -> t.Iterator[Path]:
    parent = root_path / OVERSTORY_DIR / "tmp"
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / f"{TEMP_WORKTREE_PREFIX}{secrets.token_hex(6)}"
    try:
        with worktree_admin_lock(root_path):
            root.run("worktree", "add", "--quiet", str(path), target)
        yield path
    finally:
        with worktree_admin_lock(root_path):
            _remove_worktree(root, path)


def _remove_worktree(root: Git, path: Path) -> None:
    root.run("worktree", "remove", "--force", "--force", str(path), check=False)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    root.run("worktree", "prune", check=False)
    if path.exists():
        raise MergeError(f"could not remove the temporary merge worktree {path}")


def _merge_in(git: Git, job: _Job, *, at_root: bool) -> MergeResult:
    if at_root:
        busy = operation_in_progress(git)
        if busy:
            raise MergeError(f"{busy} is in progress in {git.cwd}; finish or abort it before merging")
    if git.rev("HEAD") != job.target_sha:
        raise MergeError(f"{job.target} moved while the merge was being prepared; try again")
    if at_root:
        blockers = find_blockers(git, touched_paths(git, job.target_sha, job.source_sha))
        if blockers.any:
            raise MergeError(blockers.message(git.cwd))
    base = git.out("merge-base", job.target_sha, job.source_sha)
    union_files = union_saved_files(git, git, base, job.target_sha, job.source_sha)

    before = take_snapshot(git)
    # rerere could replay a recorded resolution that nobody verified: off for our merges.
    proc = git.run("-c", "rerere.enabled=false", "merge", "--no-ff", "--no-commit", "--no-edit", job.source_sha,
                   check=False)
    if git.rev("MERGE_HEAD") is None:
        problems, _ = snapshot_differences(before, take_snapshot(git))
        changed = f"; and the working tree changed: {'; '.join(problems)}" if problems else ""
        raise MergeError(f"git merge did not start in {git.cwd}: {describe(proc)}{changed}")
    try:
        result = _resolve_and_commit(git, job, base, union_files)
    except BaseException as exc:
        _abort(git, job, before, at_root=at_root, why=f"{type(exc).__name__}: {exc}")
        raise
    if not result.merged:
        leftovers = _abort(git, job, before, at_root=at_root, why=result.reason)
        if leftovers and at_root:
            result = replace(result, reason=f"{result.reason} (left behind, untracked: {', '.join(leftovers)})")
    return result


def _abort(git: Git, job: _Job, before: WorktreeSnapshot, *, at_root: bool, why: str) -> list[str]:
    """Undo our uncommitted merge in this worktree; return new untracked files (not deleted).

    At the root only git's careful undo is used (``merge --abort``, then ``reset --merge``),
    which refuses rather than overwrite changes it did not make. Our temporary worktree
    holds nobody's work, so there it is reset hard to the recorded HEAD.
    """
    if git.rev("MERGE_HEAD") is not None:
        git.run("merge", "--abort", check=False)
    problems, leftovers = snapshot_differences(before, take_snapshot(git))
    if problems and before.head is not None:
        git.run("reset", "--merge" if at_root else "--hard", before.head, check=False)
        problems, leftovers = snapshot_differences(before, take_snapshot(git))
    if branch_head(git, job.target) != job.target_sha:
        problems.append(f"branch {job.target} no longer points at {job.target_sha}")
    if problems:
        raise MergeError(
            f"the merge of {job.source} into {job.target} stopped ({why.splitlines()[0] if why else 'error'}) "
            f"and was aborted, but {git.cwd} is not as it was: " + "; ".join(problems)
            + ". Nothing was deleted; inspect it by hand."
        )
    return leftovers


def _why_not(plan: ConflictPlan, job: _Job) -> str:
    if plan.kind == MECHANICAL:
        return f"needs tier 2 ({plan.detail}) but tier_max is {job.tier_max}"
    if plan.kind == NEEDS_MODEL:
        if job.tier_max < 3:
            return f"{plan.detail}; needs tier 3 (model-assisted) but tier_max is {job.tier_max}"
        return f"{plan.detail}; tier 3 has no model resolver configured"
    return plan.detail


def _describe_unresolved(unresolved: dict[str, str]) -> str:
    files = "; ".join(f"{path} ({why})" for path, why in sorted(unresolved.items()))
    return f"{len(unresolved)} conflicted file{'s' if len(unresolved) != 1 else ''} left unresolved: {files}"


def _resolve_and_commit(git: Git, job: _Job, base: str, union_files: list[str]) -> MergeResult:
    conflicted = parse_stage_entries(git.run("ls-files", "-u", "-z").stdout)
    resolutions: dict[str, str] = {}
    unresolved: dict[str, str] = {}
    tier = 1

    for path in union_files:
        if path in conflicted:
            continue
        base_text, ours_text, theirs_text = (git.blob(f"{c}:{path}") for c in (base, job.target_sha, job.source_sha))
        lost = lost_lines(base_text, ours_text, theirs_text, git.blob(f":0:{path}"))
        if lost:
            unresolved[path] = f"the union merge dropped {lost[0]!r}"
        elif job.tier_max < 2:
            unresolved[path] = "resolved by merge=union, which counts as tier 2, but tier_max is 1"
        else:
            resolutions[path] = "union"
            tier = 2

    plans = [plan_conflict(path, stages, git.blob) for path, stages in sorted(conflicted.items())]
    mechanical: list[ConflictPlan] = []
    for_model: list[ConflictPlan] = []
    for plan in plans:
        if plan.kind == MECHANICAL and job.tier_max >= 2:
            mechanical.append(plan)
        elif plan.kind in (MECHANICAL, NEEDS_MODEL) and job.tier_max >= 3 and job.resolver is not None:
            for_model.append(plan)
        else:
            unresolved[plan.path] = _why_not(plan, job)
    if unresolved:
        return job.failed(unresolved, _describe_unresolved(unresolved), resolutions=resolutions)

    for plan in mechanical:
        _stage(git, plan.path, t.cast(str, plan.mode), t.cast(bytes, plan.content))
        resolutions[plan.path] = plan.detail
        tier = max(tier, 2)
    for plan in for_model:
        content, problem = _ask_model(t.cast(ModelResolver, job.resolver), plan)
        if content is None:
            unresolved[plan.path] = t.cast(str, problem)
            continue
        _stage(git, plan.path, t.cast(str, plan.mode), content)
        resolutions[plan.path] = "model"
        tier = 3
    if unresolved:
        return job.failed(unresolved, _describe_unresolved(unresolved), resolutions=resolutions)
    left = parse_stage_entries(git.run("ls-files", "-u", "-z").stdout)
    if left:
        raise MergeError(f"files still unmerged after resolution: {', '.join(sorted(left))}")

    unstaged_before = git.paths("diff", "--name-only", "-z")
    for command in job.gates:
        code, output = _run_gate(command, git.cwd, job.gate_timeout)
        if code != 0:
            status = "timed out" if code is None else f"exited {code}"
            return job.failed(
                [], f"quality gate {command!r} {status}; output tail:\n{_tail(output)}",
                tier=tier, resolutions=resolutions,
            )
        changed = sorted(set(git.paths("diff", "--name-only", "-z")) - set(unstaged_before))
        if changed:
            return job.failed(
                [], f"quality gate {command!r} modified tracked files ({', '.join(changed)}); "
                "a gate must check the merged tree, not change it", tier=tier, resolutions=resolutions,
            )

    commit_message = job.message or _default_message(job, tier, resolutions)
    proc = git.run("commit", "--quiet", "--cleanup=whitespace", "-F", "-", input=commit_message.encode(), check=False)
    if proc.returncode != 0:
        return job.failed([], f"git commit failed: {describe(proc)}", tier=tier, resolutions=resolutions)
    commit = t.cast(str, git.rev("HEAD"))
    parents = git.out("rev-list", "--parents", "-n", "1", commit).split()[1:]
    if parents != [job.target_sha, job.source_sha] or branch_head(git, job.target) != commit:
        raise MergeError(f"the merge commit {commit} is not what was expected (parents {parents})")
    files = git.paths("diff", "--name-only", "-z", job.target_sha, commit)
    return MergeResult(
        merged=True,
        tier=tier,
        commit=commit,
        conflicts=sorted(set(conflicted) | set(resolutions)),
        reason="clean merge" if tier == 1 else f"merged with tier {tier} resolution",
        files=files,
        resolutions=resolutions,
        source_commit=job.source_sha,
        target_before=job.target_sha,
    )


def _stage(git: Git, path: str, mode: str, content: bytes) -> None:
    """Record ``content`` as the resolved (stage 0) entry of ``path`` and write it to the worktree."""
    oid = os.fsdecode(git.run("hash-object", "-w", "--stdin", "--no-filters", input=content).stdout).strip()
    git.run("update-index", "-z", "--index-info", input=f"{mode} {oid} 0\t".encode() + os.fsencode(path) + b"\0")
    git.run("checkout-index", "-f", "-u", "--", path)


def _ask_model(resolver: ModelResolver, plan: ConflictPlan) -> tuple[bytes | None, str | None]:
    try:
        base, ours, theirs = (data.decode("utf-8") for data in (plan.base, plan.ours, plan.theirs))
    except UnicodeDecodeError:
        return None, "not UTF-8 text, so the model was not asked"
    try:
        reply = resolver.resolve(plan.path, base, ours, theirs)
    except Exception as exc:  # a resolver is a network client: any failure just leaves the file unresolved
        return None, f"model resolution failed: {type(exc).__name__}: {exc}"
    try:
        content = accept_model_reply(reply, base, ours, theirs).encode("utf-8")
    except MergeError as exc:
        return None, f"model reply refused: {exc}"
    lost = lost_lines(plan.base, plan.ours, plan.theirs, content)
    if lost:
        more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
        return None, f"model reply refused: it drops the line {lost[0]!r}{more}"
    return content, None


def _run_gate(command: str, cwd: Path, timeout: float | None) -> tuple[int | None, str]:
    """Run one gate in its own process group; on timeout that group (ours) is killed."""
    proc = subprocess.Popen(
        command, shell=True, cwd=cwd, env=unredirected_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return None, out.decode("utf-8", "replace")
    except BaseException:  # interrupted: do not leave the gate running on its own
        _kill_group(proc)
        proc.wait()
        raise
    return proc.returncode, out.decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(output: str) -> str:
    tail = "\n".join(output.rstrip("\n").split("\n")[-GATE_TAIL_LINES:])
    return tail[-GATE_TAIL_CHARS:] if len(tail) > GATE_TAIL_CHARS else tail


def _default_message(job: _Job, tier: int, resolutions: dict[str, str]) -> str:
    subject = f"Merge {job.source} into {job.target}"
    if tier == 1:
        return subject + "\n"
    lines = [subject, "", f"Conflicts resolved by ov merge (tier {tier}):"]
    lines += [f"  {path}: {how}" for path, how in sorted(resolutions.items())]
    return "\n".join(lines) + "\n"
