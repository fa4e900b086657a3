"""``merge_branch``: merge a source branch into a target branch, tier by tier.

The flow, all under the target's ``TargetLock``:

1. Recover: a merge into this target that was killed left a journal (``merge.publish``);
   its scratch worktree is removed and a half-done publish rolled back first.
2. Where: the target may be checked out at the repository root or nowhere; checked out
   in another worktree, the merge is refused. At the root, refuse (MergeError, nothing
   touched) when the working tree has uncommitted changes the merge would overwrite,
   staged changes, or an unfinished merge/rebase. Changes under ``.overstory/`` never count.
3. The merge itself always happens in a scratch worktree, detached at the target's
   commit, under ``.overstory/tmp/merge-<random>`` (removed afterwards whatever happens):
   the operator's checkout never holds MERGE_HEAD or a half-resolved index, even if
   ``ov merge`` is killed. ``git merge --no-ff --no-commit`` (tier 1); conflicts are
   resolved per file by the lowest tier allowed that works: tier 2 (``threeway``; git's
   own ``merge=union`` counts here), tier 3 (a ``ModelResolver``). Every resolution must
   pass ``lost_lines``. Model calls are only made once every other conflict is known
   to be resolvable.
4. Quality gates run in the merged scratch tree (through ``gate_runner``: `ov merge` runs them in
   the agents' sandbox, ``merge.gates``); a source that changes a ``protected`` path is refused
   first, unless allowed. Then the merge commit is made there.
5. Publish (``merge.publish``): the target moves to the merge commit by compare-and-swap,
   and a checkout of it at the root is fast-forwarded by one git process. A failure
   before this leaves the target exactly as it was.

Tier 2 results also pass ``duplicated_lines``. Its "both sides only added" rule (both
insertions kept, the target's first) is a guess about order that only the gates can
prove: when a gate fails on it, nothing is committed and the failure names the gate and
the combined files; with tier 3 allowed and a model configured, the merge is made again
with those files given to the model instead (``_merge_in``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import typing as t
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from overstory.errors import MergeError
from overstory.gitutil import worktree_admin_lock
from overstory.merge._git import OVERSTORY_DIR, Git, describe, parse_stage_entries, unredirected_env
from overstory.merge.conflicts import MECHANICAL, NEEDS_MODEL, ConflictPlan, plan_conflict, union_saved_files
from overstory.merge.gates import GateRunner
from overstory.merge.lock import TargetLock
from overstory.merge.model import ModelResolver, accept_model_reply
from overstory.merge.publish import clear_journal, journal_path, publish, recover, remove_worktree, write_journal
from overstory.merge.results import MergeResult
from overstory.merge.threeway import BOTH_ADDED, duplicated_lines, lost_lines
from overstory.merge.worktree_state import (
    TEMP_WORKTREE_PREFIX,
    branch_head,
    checkout_location,
    find_blockers,
    normalize_branch,
    operation_in_progress,
    resolve_commit,
    toplevel,
    touched_paths,
)
from overstory.procs import kill_point
from overstory.sandbox.check_tree import describe as describe_changes
from overstory.sandbox.check_tree import protected_changes

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
    gate_runner: GateRunner | None = None
    protected: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()      # protected paths the source may change
    allow_protected: bool = False      # the operator allowed every change to them

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
    source_name: str | None = None,
    gate_runner: GateRunner | None = None,
    protected: Sequence[str] = (),
    allowed: Sequence[str] = (),
    allow_protected: bool = False,
) -> MergeResult:
    """Merge ``source`` (any commit-ish) into branch ``target`` of the repository at ``repo_root``.

    Returns a MergeResult; ``merged=False`` means conflicts or a gate stopped it and the
    target is exactly as before. Raises MergeError when the merge cannot even be tried
    (unknown branch, uncommitted work in the way, git failing) and LockHeld when another
    merge into the same target holds the lock for longer than ``lock_wait`` seconds.
    ``lock_dir`` defaults to ``<repo_root>/.overstory/locks``. ``source_name`` is how messages
    name the source when ``source`` is a commit id (the branch it was read from).
    ``gate_runner`` runs each gate (default: a plain subprocess; `ov merge` passes the sandboxed one).
    ``protected``: paths the gates depend on; a source that changes one (since the merge base) is not
    merged while there are gates, unless it is in ``allowed`` or ``allow_protected``.
    """
    if tier_max not in (1, 2, 3):
        raise MergeError(f"tier_max must be 1, 2 or 3, not {tier_max!r}")
    root_path = toplevel(repo_root)
    root = Git(root_path)
    target = normalize_branch(target)
    source_sha = resolve_commit(root, source, "source")
    source = source_name or source
    _require_identity(root)
    lock_dir = Path(lock_dir) if lock_dir is not None else root_path / OVERSTORY_DIR / "locks"
    with TargetLock(lock_dir, target, lock_wait, on_wait=on_lock_wait) as lock:
        recover(root, root_path, lock_dir, target)
        target_sha = branch_head(root, target)
        if root.ok("merge-base", "--is-ancestor", source_sha, target_sha):
            return MergeResult(
                merged=True, tier=1, commit=target_sha, conflicts=[],
                reason=f"{source} is already merged into {target}; nothing to do",
                source_commit=source_sha, target_before=target_sha, already_merged=True,
            )
        if not root.out("merge-base", target_sha, source_sha, check=False):
            raise MergeError(f"{source} and {target} share no history; ov does not merge unrelated histories")
        job = _Job(source, source_sha, target, target_sha, tier_max, model_resolver, tuple(gates), message,
                   gate_timeout, gate_runner, tuple(protected), tuple(allowed), allow_protected)
        location = checkout_location(root, target)
        at_root = location == root_path
        if location is not None and not at_root:
            raise MergeError(
                f"target branch {target!r} is checked out in another worktree ({location}); "
                "merge there, or switch that worktree to another branch first"
            )
        if at_root:
            _check_root(root, job)
        journal = journal_path(lock_dir, target)
        scratch = root_path / OVERSTORY_DIR / "tmp" / f"{TEMP_WORKTREE_PREFIX}{secrets.token_hex(6)}"
        state = {"target": target, "source": source_sha, "old": target_sha, "worktree": str(scratch),
                 "at_root": at_root, "phase": "merging", "pid": os.getpid()}
        write_journal(journal, state)
        try:
            with _temporary_worktree(root, root_path, target_sha, scratch) as worktree:
                result = _merge_in(Git(worktree), job)
                if not result.merged:
                    return result
                kill_point("merge:committed")
                write_journal(journal, {**state, "phase": "publishing", "new": result.commit})
                kill_point("merge:publishing")
                publish(root, target=target, source=source, old=target_sha, new=t.cast(str, result.commit),
                        at_root=at_root, lock=lock)
        finally:
            clear_journal(journal)
        if branch_head(root, target) != result.commit:
            raise MergeError(f"{target} does not point at the merge commit {result.commit} after publishing it")
        return result


def _check_root(root: Git, job: _Job) -> None:
    """The operator's checkout of the target: nothing unfinished, nothing staged, nothing the merge would overwrite."""
    busy = operation_in_progress(root)
    if busy:
        raise MergeError(f"{busy} is in progress in {root.cwd}; finish or abort it before merging")
    blockers = find_blockers(root, touched_paths(root, job.target_sha, job.source_sha))
    if blockers.any:
        raise MergeError(blockers.message(root.cwd))


def _require_identity(git: Git) -> None:
    for var in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"):
        proc = git.run("var", var, check=False)
        if proc.returncode != 0:
            raise MergeError(f"git cannot make the merge commit, no identity configured: {describe(proc)}")


@contextlib.contextmanager
def _temporary_worktree(root: Git, root_path: Path, commit: str, path: Path) -> t.Iterator[Path]:
    """A scratch worktree detached at ``commit`` (so the target may stay checked out at the root)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with worktree_admin_lock(root_path):
            root.run("worktree", "add", "--quiet", "--detach", str(path), commit)
        yield path
    finally:
        remove_worktree(root, root_path, path)


def _merge_in(git: Git, job: _Job) -> MergeResult:
    """The merge in the scratch worktree: nobody's work is here, so any failure just leaves it to be removed."""
    if git.rev("HEAD") != job.target_sha:
        raise MergeError(f"the scratch worktree is not at {job.target}'s commit {job.target_sha}")
    base = git.out("merge-base", job.target_sha, job.source_sha)
    union_files = union_saved_files(git, git, base, job.target_sha, job.source_sha)
    _start_merge(git, job)
    kill_point("merge:merging")
    result = _resolve_and_commit(git, job, base, union_files)
    if _combined_files(result) and job.tier_max >= 3 and job.resolver is not None:
        # A gate failed on tier 2's keep-both combination: let the model combine those files instead.
        git.run("merge", "--abort", check=False)
        _start_merge(git, job)
        result = _resolve_and_commit(git, job, base, union_files, keep_both=False)
    if not result.merged:
        git.run("merge", "--abort", check=False)
    return result


def _start_merge(git: Git, job: _Job) -> None:
    # rerere could replay a recorded resolution that nobody verified: off for our merges.
    proc = git.run("-c", "rerere.enabled=false", "merge", "--no-ff", "--no-commit", "--no-edit", job.source_sha,
                   check=False)
    if git.rev("MERGE_HEAD") is None:
        raise MergeError(f"git merge did not start: {describe(proc)}")


def _combined_files(result: MergeResult) -> list[str]:
    """The files tier 2 combined by keeping both sides' insertions, when a gate then failed the merge."""
    if result.merged or not result.reason.startswith("quality gate"):
        return []
    return combined_insertions(result.resolutions)


def combined_insertions(resolutions: t.Mapping[str, str]) -> list[str]:
    """The files resolved by keeping both sides' insertions (``threeway.BOTH_ADDED``)."""
    return sorted(path for path, how in resolutions.items() if BOTH_ADDED in how)


def _on_combination(resolutions: t.Mapping[str, str]) -> str:
    files = combined_insertions(resolutions)
    if not files:
        return ""
    return (f" on the combined result (tier 2 kept both sides' insertions in {', '.join(files)}); "
            "nothing was committed")


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


def _resolve_and_commit(git: Git, job: _Job, base: str, union_files: list[str], keep_both: bool = True
                        ) -> MergeResult:
    conflicted = parse_stage_entries(git.run("ls-files", "-u", "-z").stdout)
    resolutions: dict[str, str] = {}
    unresolved: dict[str, str] = {}
    tier = 1

    for path in union_files:
        if path in conflicted:
            continue
        base_text, ours_text, theirs_text = (git.blob(f"{c}:{path}") for c in (base, job.target_sha, job.source_sha))
        merged_text = git.blob(f":0:{path}")
        lost = lost_lines(base_text, ours_text, theirs_text, merged_text)
        doubled = duplicated_lines(base_text, ours_text, theirs_text, merged_text)
        if lost or doubled:
            unresolved[path] = (f"the union merge dropped {lost[0]!r}" if lost
                                else f"the union merge repeated {doubled[0]!r}")
        elif job.tier_max < 2:
            unresolved[path] = "resolved by merge=union, which counts as tier 2, but tier_max is 1"
        else:
            resolutions[path] = "union"
            tier = 2

    plans = [plan_conflict(path, stages, git.blob, keep_both=keep_both) for path, stages in sorted(conflicted.items())]
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

    refused = _protected_refusal(git, job, base)
    if refused:
        return job.failed([], refused, tier=tier, resolutions=resolutions)
    unstaged_before = git.paths("diff", "--name-only", "-z")
    for command in job.gates:
        code, output = (job.gate_runner or _run_gate)(command, git.cwd, job.gate_timeout)
        if code != 0:
            status = "timed out" if code is None else f"exited {code}"
            return job.failed(
                [], f"quality gate {command!r} {status}{_on_combination(resolutions)}; output tail:\n{_tail(output)}",
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
    if parents != [job.target_sha, job.source_sha]:
        raise MergeError(f"the merge commit {commit} is not what was expected (parents {parents})")
    files = git.paths("diff", "--name-only", "-z", job.target_sha, commit)
    brought_in = git.out("rev-list", "--reverse", f"{job.target_sha}..{job.source_sha}").split()
    return MergeResult(
        commits=brought_in,
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


def _protected_refusal(git: Git, job: _Job, base: str) -> str | None:
    """Why the gates may not judge this merge: the source changed what they depend on."""
    if not job.gates or not job.protected or job.allow_protected:
        return None
    changes = [c for c in protected_changes(git.cwd, base, job.source_sha, job.protected, job.allowed) if not c.allowed]
    if not changes:
        return None
    return (f"protected path(s) changed: {describe_changes(changes)}; the merge gates depend on them "
            "(loop.protected_paths), so a person must look at the change first")


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
