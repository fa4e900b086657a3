"""`ov merge`: choosing what to merge, refusing what is not ready, and reporting each result.

Agents announce finished work with ``merge_ready`` mail, builders with their ``worker_done``;
``sync_queue`` turns each such message into one queue row (the mail id is unique in the
queue, so syncing twice adds nothing; a process killed halfway leaves the mail, and the
next sync makes the row). ``merge --all`` merges the open rows (pending, or failed and not
dismissed) and every builder that finished with commits (``merge.candidates``), in the
order they became ready; each merge settles every open row of its branch. ``queue_view``
(the dashboard) and ``merge --all --dry-run`` list the same candidates: ``gather``'s.
A dry run of ``--all`` predicts them as a sequence (``predict.MergeSequence``).

``merge_one`` refuses an agent that is still working (it has not sent its terminal mail)
unless forced, reports a branch without commits of its own as "nothing to merge", and
writes a record of intent (``merge.intents``) before merging, so that a killed run is
finished or rolled back by the next one or by the watchdog. The ``merged`` mail names
the commits it brought in and is sent once per merge however many runs race.
"""

from __future__ import annotations

import json
import os
import sqlite3
import typing as t
from dataclasses import dataclass, field

from overstory.clock import iso
from overstory.errors import MergeError, UsageError
from overstory.gitutil import branch_exists, current_branch, git
from overstory.merge import intents as merge_intents
from overstory.merge import scope_check
from overstory.merge.announce import announce, merge_commit_of
from overstory.merge.branch_merge import combined_insertions, merge_branch
from overstory.merge.candidates import Skipped, agent_commits, announced, gather, target_for, unmerged_commits
from overstory.merge.gates import protected_for, sandboxed_gates
from overstory.merge.predict import MergeSequence, predict_merge
from overstory.paths import ProjectPaths
from overstory.procs import kill_point
from overstory.store import intents, merge_queue, sessions
from overstory.store.lifecycle import promised

if t.TYPE_CHECKING:
    from overstory.config.model import Config

__all__ = ["MergeReport", "dismiss_entry", "merge_all", "merge_one", "queue_view", "sync_queue", "target_for"]


@dataclass
class MergeReport:
    """What one merge (or prediction) did, ready for --json."""

    branch: str
    target: str
    agent: str | None
    merged: bool
    dry_run: bool
    tier: int | None
    conflicts: list[str] = field(default_factory=list)
    reason: str = ""
    commit: str | None = None
    resolutions: dict[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    commits: list[str] = field(default_factory=list)  # brought in (or, for a dry run, that would be)
    nothing_to_merge: bool = False
    already_merged: bool = False
    next_step: str = ""

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)

    @property
    def failed(self) -> bool:
        return not self.merged and not self.nothing_to_merge


@dataclass
class MergeRun:
    reports: list[MergeReport]
    skipped: list[Skipped] = field(default_factory=list)


def sync_queue(conn: sqlite3.Connection, config: Config) -> int:
    """Queue every report (merge_ready mail, a builder's worker_done) not queued yet; returns how many were added."""
    added = 0
    for report in announced(conn, config):
        added += merge_queue.enqueue(conn, agent=report["agent"], branch=report["branch"], target=report["target"],
                                     task_id=report["task_id"], files=report["files"], mail_id=report["mail_id"],
                                     enqueued_at=report["created_at"])
    return added


def queue_view(project: ProjectPaths, conn: sqlite3.Connection, config: Config, *,
               limit: int = 20) -> list[dict[str, t.Any]]:
    """The queue as `ov merge --all` would find it, without changing anything.

    First what `ov merge --all` would merge, in its order (``announced``: reported, no queue
    row yet; ``pending``; ``failed``, with ``result`` saying why, until it is merged or
    dismissed), then the latest closed entries (merged, empty, dismissed), up to ``limit``.
    """
    candidates, _ = gather(project.root, config, conn, None)
    entries: list[dict[str, t.Any]] = [
        {"id": c.queue_id, "mail_id": c.mail_ids[0] if c.mail_ids else None, "agent": c.agent, "branch": c.branch,
         "target": c.target, "task_id": c.task_id, "files": c.files, "status": c.status, "tier": c.tier,
         "result": c.result, "enqueued_at": iso(c.ready_at)} for c in candidates]
    for row in merge_queue.recent_closed(conn, max(0, limit - len(entries))):
        entries.append({"id": row["id"], "mail_id": row["mail_id"], "agent": row["agent"], "branch": row["branch"],
                        "target": row["target"], "task_id": row["task_id"], "files": json.loads(row["files"] or "[]"),
                        "status": row["status"], "tier": row["tier"], "result": row["result"],
                        "enqueued_at": iso(row["enqueued_at"])})
    return entries


def dismiss_entry(project: ProjectPaths, config: Config, conn: sqlite3.Connection, *,
                  agent_name: str | None = None, branch: str | None = None) -> str:
    """Take a branch out of the merge queue (a failed merge nobody will fix, work not wanted); says what it did.

    Its open rows are closed as ``dismissed``; a finished builder that never reported gets a
    dismissed row, so `ov merge --all` leaves it alone. `ov merge NAME` still merges it.
    """
    if agent_name is not None:
        agent = sessions.get(conn, agent_name)
        if agent is None:
            raise sessions.agent_not_found(conn, agent_name)
        if not agent.branch:
            raise MergeError(f"{agent_name} works at the project root and has no branch in the merge queue")
        branch = agent.branch
    assert branch is not None
    sync_queue(conn, config)
    label = agent_name or branch
    reason = "dismissed by the operator (`ov merge --dismiss`)"
    if merge_queue.dismiss(conn, branch, reason):
        return f"{label}: dismissed from the merge queue; `ov merge {label}` still merges it"
    candidates, _ = gather(project.root, config, conn, None)
    found = next((c for c in candidates if c.branch == branch), None)
    if found is None:
        raise MergeError(f"{label} is not in the merge queue (nothing open to dismiss; see `ov merge --all --dry-run`)")
    merge_queue.enqueue(conn, agent=found.agent or branch, branch=branch, target=found.target, task_id=found.task_id,
                        files=found.files, mail_id=None, enqueued_at=found.ready_at, status="dismissed", result=reason)
    return f"{label}: dismissed from the merge queue; `ov merge {label}` still merges it"


def _resolver(config: Config, tier_max: int) -> t.Any:
    """Tier 3's model client, or one clear error when it has no key (never a library's TypeError later)."""
    if tier_max < 3:
        return None
    from overstory.merge.model import AnthropicResolver

    model, base_url, key = config.merge.model, os.environ.get("ANTHROPIC_BASE_URL"), os.environ.get("ANTHROPIC_API_KEY")
    if "/" in model:
        name, _, model = model.partition("/")
        provider = config.providers.get(name)
        if provider is None:
            raise MergeError(f"tier 3: merge.model {config.merge.model!r} names provider {name!r}, which is not in "
                             "config `providers`")
        base_url, key = provider.base_url, os.environ.get(provider.api_key_env)
    if not key:
        raise MergeError("tier 3 needs ANTHROPIC_API_KEY or a provider (merge.model: provider/model, with the key in "
                         "the provider's api_key_env); nothing was merged")
    return AnthropicResolver(model=model, base_url=base_url, api_key=key)


def effective_tier_max(config: Config, requested: int | None) -> int:
    """Tier 3 needs `merge.ai_resolve: true`; asking for it without that is an error, not a silent downgrade."""
    tier_max = requested or config.merge.tier_max
    if tier_max >= 3 and not config.merge.ai_resolve:
        if requested == 3:
            raise UsageError("tier 3 (model-assisted) is off: set merge.ai_resolve: true in .overstory/config.yaml")
        tier_max = 2
    return tier_max


def merge_one(project: ProjectPaths, config: Config, conn: sqlite3.Connection, *, agent_name: str | None = None,
              branch: str | None = None, into: str | None = None, dry_run: bool = False,
              sequence: MergeSequence | None = None,
              tier_max: int | None = None, queue_id: int | None = None, force: bool = False,
              on_lock_wait: t.Callable[[int | None], None] | None = None, sender: str | None = None,
              allow_protected: bool = False, allow_out_of_scope: bool = False) -> MergeReport:
    """Merge one agent's branch (or ``branch``). ``allow_protected``: the operator has looked at the
    branch's changes to protected paths and lets the merge gates judge them. ``allow_out_of_scope``: it
    may change files outside the agent's write scope (``merge.scope_check``)."""
    agent = None
    if agent_name is not None:
        agent = sessions.get(conn, agent_name)
        if agent is None:
            raise sessions.agent_not_found(conn, agent_name)
        if not agent.branch:
            raise MergeError(f"{agent_name} works at the project root and has no branch to merge")
        branch = agent.branch
    elif branch is not None:
        owners = sessions.names_on_branch(conn, branch)
        agent = sessions.get(conn, owners[0]) if owners else None
    assert branch is not None
    if not branch_exists(project.root, branch):
        raise MergeError(f"branch {branch} does not exist")
    target = target_for(agent, config, into)
    if not branch_exists(project.root, target):
        raise MergeError(f"target branch {target} does not exist (use --into)")
    if agent is not None and not (force or dry_run) and not agent.is_terminal and not promised(conn, agent):
        raise MergeError(f"{agent.name} is still working (state {agent.state}; it has not sent its terminal mail): "
                         "merging now could miss the commits it is about to make; wait for its worker_done, "
                         f"or pass --force")
    levels = effective_tier_max(config, tier_max)
    label = agent.name if agent else branch
    report = MergeReport(branch=branch, target=target, agent=agent.name if agent else None, merged=False,
                         dry_run=dry_run, tier=None, queue_id=queue_id)
    if not dry_run:
        merge_intents.settle_all(project, conn)  # an earlier run of ours that was killed: finish or undo it first
        sync_queue(conn, config)  # so that this merge settles the branch's queue rows, reported or not yet queued
    unmerged = unmerged_commits(project.root, branch, target)
    if not unmerged:
        return _nothing_new(project, conn, agent, report, queue_id, sender)
    source_sha = git(project.root, "rev-parse", f"refs/heads/{branch}").stdout.strip()  # checked and merged: one commit
    strays = [] if allow_out_of_scope else scope_check.outside_scope(project.root, agent, source_sha, target)
    if strays:
        assert agent is not None
        return _out_of_scope(project, conn, agent, report, label, strays, unmerged, source_sha, sender)
    if dry_run:
        return _predict(project, config, report, levels, unmerged, label, sequence)
    resolver = _resolver(config, levels)
    target_sha = git(project.root, "rev-parse", f"refs/heads/{target}").stdout.strip()
    intent_id = merge_intents.begin(conn, agent=agent, branch=branch, target=target, source_commit=source_sha,
                                    target_before=target_sha, queue_id=queue_id)
    kill_point("merge:intent")
    protected, allowed = protected_for(config, agent.spec.get("loop") if agent is not None else None)
    runner = sandboxed_gates(project, config, capability=agent.capability if agent is not None else "merger",
                             environ=os.environ)
    try:
        result = merge_branch(project.root, source_sha, target, tier_max=levels, model_resolver=resolver,
                              gates=config.merge.gates, lock_dir=project.locks_dir, lock_wait=config.merge.lock_wait,
                              on_lock_wait=on_lock_wait, source_name=branch, gate_runner=runner,
                              protected=protected, allowed=allowed, allow_protected=allow_protected)
    except BaseException:
        # Usually nothing was merged; if it was (interrupted while publishing), this announces it.
        row = next((r for r in intents.list_merges(conn) if r["id"] == intent_id), None)
        if row is not None:
            merge_intents.finish(project, conn, row)
        raise
    kill_point("merge:published")
    report.merged, report.tier, report.conflicts = result.merged, result.tier, list(result.conflicts)
    report.reason, report.resolutions = result.reason, dict(result.resolutions)
    report.already_merged = result.already_merged
    report.commit = result.commit if not result.already_merged else merge_commit_of(project.root, source_sha, target)
    report.commits = result.commits if not result.already_merged else unmerged
    if not result.merged:
        needs = predict_merge(project.root, source_sha, target).tier if report.conflicts else None
        report.next_step = _next_step(project, config, report, levels, label, needs)
    announce(conn, project.root, agent, merged=report.merged, branch=branch, target=target, source_commit=source_sha,
             reason=report.reason, tier=report.tier, commit=report.commit, commits=report.commits,
             conflicts=report.conflicts, target_before=target_sha, next_step=report.next_step, sender=sender)
    merge_queue.settle_branch(conn, branch, target, status="merged" if report.merged else "failed", tier=report.tier,
                              result=report.reason)
    intents.end_merge(conn, intent_id)
    return report


def _out_of_scope(project: ProjectPaths, conn: sqlite3.Connection, agent: sessions.Session, report: MergeReport,
                  label: str, strays: list[str], unmerged: list[str], source: str, sender: str | None) -> MergeReport:
    """Refused (or, in a dry run, predicted refused): the branch changes files outside the agent's write scope."""
    report.reason = scope_check.refusal(agent, strays)
    report.next_step = scope_check.next_step(label)
    report.commits = unmerged
    if report.dry_run:
        report.reason = f"would NOT merge: {report.reason}"
        return report
    target_before = git(project.root, "rev-parse", f"refs/heads/{report.target}").stdout.strip()
    announce(conn, project.root, agent, merged=False, branch=report.branch, target=report.target,
             source_commit=source, reason=report.reason, target_before=target_before, next_step=report.next_step,
             sender=sender)
    merge_queue.settle_branch(conn, report.branch, report.target, status="failed", tier=None, result=report.reason)
    return report


def _nothing_new(project: ProjectPaths, conn: sqlite3.Connection, agent: sessions.Session | None,
                 report: MergeReport, queue_id: int | None, sender: str | None = None) -> MergeReport:
    """The target already has every commit of the branch: nothing to merge, or merged already."""
    own = agent_commits(project.root, agent) if agent is not None else []
    if not own:
        report.nothing_to_merge = True
        since = (f"since it was slung from {agent.base_branch}" if agent and agent.base_branch
                 else f"that {report.target} lacks")
        report.reason = f"nothing to merge: {report.branch} has no commits {since}"
        if not report.dry_run:
            merge_queue.settle_branch(conn, report.branch, report.target, status="empty", tier=None,
                                      result=report.reason)
        return report
    source = git(project.root, "rev-parse", f"refs/heads/{report.branch}").stdout.strip()
    report.merged = report.already_merged = True
    report.commit = merge_commit_of(project.root, source, report.target)
    report.tier = merge_intents.tier_of(project, report.commit)
    report.commits = own
    report.reason = f"already merged into {report.target}" + (f" by {report.commit[:12]}" if report.commit else "")
    if not report.dry_run:
        # Merged by another run, by hand, or by a run killed before it reported: report it once.
        announce(conn, project.root, agent, merged=True, branch=report.branch, target=report.target,
                 source_commit=source, reason=report.reason, tier=report.tier, commit=report.commit, commits=own,
                 sender=sender)
        merge_queue.settle_branch(conn, report.branch, report.target, status="merged", tier=report.tier,
                                  result=report.reason)
    return report


def _predict(project: ProjectPaths, config: Config, report: MergeReport, levels: int, unmerged: list[str],
             label: str, sequence: MergeSequence | None = None) -> MergeReport:
    """A dry run; in a ``sequence``, against the target as the merges predicted before it leave it."""
    if sequence is not None:
        prediction = sequence.predict(report.branch, report.target)
    else:
        prediction = predict_merge(project.root, report.branch, report.target)
    needs = prediction.tier
    report.tier, report.conflicts, report.commits = needs, list(prediction.conflicts), unmerged
    report.resolutions = dict(prediction.resolutions)
    report.merged = needs is not None and needs <= levels and not prediction.blocked_by
    if needs is None:
        verdict = "would NOT merge: no tier can resolve its conflicts"
    elif needs > levels:
        verdict = f"would NOT merge: it needs tier {needs} but tier_max is {levels}"
    else:
        verdict = f"would merge with tier {needs}"
    report.reason = f"{verdict}; {prediction.reason}"
    if sequence is not None:
        earlier = sequence.earlier(report.target, report.conflicts)
        report.reason += "".join(f"; {path} is also changed by {', '.join(names)}, merged before it in this order"
                                 for path, names in sorted(earlier.items()))
        if report.merged:
            sequence.record(label, report.branch, report.target, prediction)
            if prediction.guessed:
                report.reason += (f"; the branches after it are predicted as if the model kept {report.target}'s "
                                  f"{', '.join(prediction.guessed)}")
    if not report.merged:
        report.next_step = _next_step(project, config, report, levels, label, needs)
    return report


def _next_step(project: ProjectPaths, config: Config, report: MergeReport, levels: int, label: str,
               needs: int | None) -> str:
    """What the operator can do about a merge that failed (or would fail) needing tier ``needs``."""
    steps = []
    combined = combined_insertions(report.resolutions) if "quality gate" in report.reason else []
    if combined:  # the gate failed on tier 2's keep-both combination: tier 3 or a person can combine them
        tier3 = (f"`ov merge {label} --tier-max 3` has the model combine {', '.join(combined)} instead"
                 if config.merge.ai_resolve else
                 f"tier 3 (model-assisted) can combine {', '.join(combined)} instead: set merge.ai_resolve: true, "
                 f"then `ov merge {label} --tier-max 3`")
        switch = "" if current_branch(project.root) == report.target else f"git switch {report.target} && "
        return (f"{tier3}; or resolve by hand in {project.root}: `{switch}git merge --no-ff {report.branch}`, fix "
                f"{', '.join(combined)}, `git add` them, `git commit`; then `ov merge {label}` reports it merged")
    if needs is not None and needs > levels:
        if needs < 3 or config.merge.ai_resolve:
            steps.append(f"`ov merge {label} --tier-max {needs}`")
        else:
            steps.append("tier 3 (model-assisted) could resolve it: set merge.ai_resolve: true")
    if report.conflicts:
        switch = "" if current_branch(project.root) == report.target else f"git switch {report.target} && "
        steps.append(f"resolve by hand in {project.root}: `{switch}git merge --no-ff {report.branch}`, fix "
                     f"{', '.join(report.conflicts)}, `git add` them, `git commit`; then `ov merge {label}` "
                     "reports it merged")
    elif report.reason.startswith("protected path(s) changed"):
        steps.append(f"look at the change (`ov diff {label}`); to let the gates judge it: "
                     f"`ov merge {label} --allow-protected`")
    elif "quality gate" in report.reason:
        steps.append(f"fix what the gate reports on {report.branch}, then `ov merge {label}` again")
    return "; or ".join(steps)


def merge_all(project: ProjectPaths, config: Config, conn: sqlite3.Connection, *, into: str | None = None,
              dry_run: bool = False, tier_max: int | None = None,
              on_lock_wait: t.Callable[[int | None], None] | None = None) -> MergeRun:
    """Merge the queue in the order it became ready; a dry run predicts it as that sequence and writes nothing."""
    if not dry_run:
        sync_queue(conn, config)
    candidates, skipped = gather(project.root, config, conn, into)
    if not dry_run:
        for item in skipped:
            for skipped_id in item.queue_ids:
                merge_queue.settle(conn, skipped_id, merged=False, tier=None, result=item.reason, status="empty")
    sequence = MergeSequence(project.root) if dry_run else None
    reports = []
    for candidate in candidates:
        agent_name = candidate.agent if candidate.agent and sessions.get(conn, candidate.agent) else None
        queue_id = None if dry_run else candidate.queue_id
        try:
            report = merge_one(project, config, conn, agent_name=agent_name,
                               branch=None if agent_name else candidate.branch, into=into or candidate.target,
                               dry_run=dry_run, sequence=sequence, tier_max=tier_max, queue_id=queue_id, force=True,
                               on_lock_wait=on_lock_wait)
        except MergeError as exc:
            for row_id in [] if dry_run else candidate.queue_ids:
                merge_queue.settle(conn, row_id, merged=False, tier=None, result=str(exc))
            report = MergeReport(branch=candidate.branch, target=into or candidate.target or "",
                                 agent=candidate.agent, merged=False, dry_run=dry_run, tier=None,
                                 reason=str(exc), queue_id=candidate.queue_id)
        if dry_run and candidate.status == "failed" and candidate.result:
            report.reason += f"; its last merge failed: {candidate.result.splitlines()[0]}"
        reports.append(report)
    return MergeRun(reports, skipped)
