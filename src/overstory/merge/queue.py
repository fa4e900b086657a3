"""`ov merge`: the merge queue, target choice, and the mail that reports each result.

Agents announce finished work with ``merge_ready`` mail; ``sync_queue`` turns each such
message into one queue row (the mail id is unique in the queue, so syncing twice adds
nothing), and ``merge --all`` works through pending rows in arrival order.
"""

from __future__ import annotations

import json
import os
import sqlite3
import typing as t
from dataclasses import dataclass, field

from overstory.clock import iso
from overstory.errors import AgentNotFound, MergeError, UsageError
from overstory.gitutil import branch_exists
from overstory.merge.branch_merge import merge_branch
from overstory.merge.predict import predict_merge
from overstory.paths import ProjectPaths
from overstory.store import merge_queue, sessions

if t.TYPE_CHECKING:
    from overstory.config import Config


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

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def sync_queue(conn: sqlite3.Connection, config: Config) -> int:
    """Queue every merge_ready message not queued yet; returns how many were added."""
    added = 0
    for row in merge_queue.announced_not_queued(conn):
        payload = json.loads(row["payload"] or "{}")
        agent_name = payload.get("agent") or row["sender"]
        branch = payload.get("branch")
        if not branch:
            continue
        agent = sessions.get(conn, agent_name)
        target = payload.get("target_branch") or (agent.base_branch if agent else None) or config.project.canonical_branch
        added += merge_queue.enqueue(conn, agent=agent_name, branch=branch, target=target,
                                     task_id=payload.get("task_id"), files=payload.get("files_modified") or [],
                                     mail_id=row["id"], enqueued_at=row["created_at"])
    return added


def queue_view(conn: sqlite3.Connection, config: Config, *, limit: int = 20) -> list[dict[str, t.Any]]:
    """The queue as `ov merge --all` would find it, without changing anything.

    ``merge_ready`` mail that no `ov merge --all` has queued yet comes first (status
    ``announced``), then pending rows, then the latest merged or failed ones.
    """
    entries: list[dict[str, t.Any]] = []
    for row in merge_queue.announced_not_queued(conn)[:limit]:
        payload = json.loads(row["payload"] or "{}")
        name = payload.get("agent") or row["sender"]
        if not payload.get("branch"):
            continue
        agent = sessions.get(conn, name)
        entries.append({"id": None, "mail_id": row["id"], "agent": name, "branch": payload["branch"],
                        "target": payload.get("target_branch") or target_for(agent, config, None),
                        "task_id": payload.get("task_id"), "files": payload.get("files_modified") or [],
                        "status": "announced", "tier": None, "result": None, "enqueued_at": iso(row["created_at"])})
    for row in merge_queue.recent(conn, max(0, limit - len(entries))):
        entries.append({"id": row["id"], "mail_id": row["mail_id"], "agent": row["agent"], "branch": row["branch"],
                        "target": row["target"], "task_id": row["task_id"], "files": json.loads(row["files"] or "[]"),
                        "status": row["status"], "tier": row["tier"], "result": row["result"],
                        "enqueued_at": iso(row["enqueued_at"])})
    return entries


def target_for(agent: sessions.Session | None, config: Config, into: str | None) -> str:
    return into or (agent.base_branch if agent and agent.base_branch else None) or config.project.canonical_branch


def _resolver(config: Config, tier_max: int) -> t.Any:
    if tier_max < 3:
        return None
    from overstory.merge.model import AnthropicResolver

    return AnthropicResolver(model=config.merge.model, base_url=os.environ.get("ANTHROPIC_BASE_URL"),
                             api_key=os.environ.get("ANTHROPIC_API_KEY"))


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
              tier_max: int | None = None, queue_id: int | None = None,
              on_lock_wait: t.Callable[[int | None], None] | None = None, sender: str | None = None) -> MergeReport:
    """Merge one agent's (or one) branch; ``sender`` signs the result mail (default: the environment's agent)."""
    agent = None
    if agent_name is not None:
        agent = sessions.get(conn, agent_name)
        if agent is None:
            raise AgentNotFound(f"no agent named {agent_name!r} (see `ov status --all`)")
        if not agent.branch:
            raise MergeError(f"{agent_name} works at the project root and has no branch to merge")
        branch = agent.branch
    elif branch is not None:
        rows = conn.execute("SELECT name FROM sessions WHERE branch = ?", (branch,)).fetchall()
        agent = sessions.get(conn, rows[0]["name"]) if rows else None
    assert branch is not None
    if not branch_exists(project.root, branch):
        raise MergeError(f"branch {branch} does not exist")
    target = target_for(agent, config, into)
    if not branch_exists(project.root, target):
        raise MergeError(f"target branch {target} does not exist (use --into)")
    levels = effective_tier_max(config, tier_max)
    if dry_run:
        prediction = predict_merge(project.root, branch, target)
        needs = prediction.tier
        verdict = ("clean merge" if prediction.clean else
                   f"needs tier {needs}" if needs is not None else "cannot be resolved by any tier")
        fits = needs is not None and needs <= levels
        return MergeReport(branch=branch, target=target, agent=agent.name if agent else None, merged=fits,
                           dry_run=True, tier=needs, conflicts=list(prediction.conflicts),
                           reason=f"{verdict} ({prediction.reason})" if prediction.reason else verdict,
                           resolutions=dict(prediction.resolutions))
    result = merge_branch(project.root, branch, target, tier_max=levels, model_resolver=_resolver(config, levels),
                          gates=config.merge.gates, lock_dir=project.locks_dir, lock_wait=config.merge.lock_wait,
                          on_lock_wait=on_lock_wait)
    report = MergeReport(branch=branch, target=target, agent=agent.name if agent else None, merged=result.merged,
                         dry_run=False, tier=result.tier, conflicts=list(result.conflicts), reason=result.reason,
                         commit=result.commit, resolutions=dict(result.resolutions), queue_id=queue_id)
    _announce(project, conn, agent, report, sender)
    if queue_id is not None:
        merge_queue.settle(conn, queue_id, merged=report.merged, tier=report.tier, result=report.reason)
    return report


def merge_all(project: ProjectPaths, config: Config, conn: sqlite3.Connection, *, into: str | None = None,
              dry_run: bool = False, tier_max: int | None = None,
              on_lock_wait: t.Callable[[int | None], None] | None = None) -> list[MergeReport]:
    sync_queue(conn, config)
    pending = merge_queue.pending(conn)
    reports = []
    for row in pending:
        agent_name = row["agent"] if row["agent"] and sessions.get(conn, row["agent"]) else None
        try:
            reports.append(merge_one(project, config, conn, agent_name=agent_name,
                                     branch=None if agent_name else row["branch"], into=into or row["target"],
                                     dry_run=dry_run, tier_max=tier_max, queue_id=None if dry_run else row["id"],
                                     on_lock_wait=on_lock_wait))
        except MergeError as exc:
            if not dry_run:
                merge_queue.settle(conn, row["id"], merged=False, tier=None, result=str(exc))
            reports.append(MergeReport(branch=row["branch"], target=into or row["target"] or "", agent=row["agent"],
                                       merged=False, dry_run=dry_run, tier=None, reason=str(exc), queue_id=row["id"]))
    return reports


def _announce(project: ProjectPaths, conn: sqlite3.Connection, agent: sessions.Session | None, report: MergeReport,
              sender: str | None = None) -> None:
    """Mail the result to the agent's parent and, if it still runs, the agent."""
    from overstory.store import mail

    if agent is None:
        return
    if report.merged:
        mail_type, subject = "merged", f"merged {report.branch} into {report.target} (tier {report.tier})"
        payload: dict[str, t.Any] = {"branch": report.branch, "tier": report.tier or 1, "agent": agent.name,
                                     "task_id": agent.task_id, "target_branch": report.target, "commit": report.commit}
    else:
        mail_type, subject = "merge_failed", f"could not merge {report.branch} into {report.target}"
        payload = {"branch": report.branch, "reason": report.reason or "merge failed", "agent": agent.name,
                   "task_id": agent.task_id, "target_branch": report.target,
                   "conflict_files": report.conflicts}
        if report.tier:
            payload["tier"] = report.tier
    body = report.reason + (("\nConflicting files:\n" + "\n".join(f"- {f}" for f in report.conflicts))
                            if report.conflicts and not report.merged else "")
    recipients = [agent.parent or "operator"]
    if not agent.is_terminal and agent.name not in recipients:
        recipients.append(agent.name)
    sender = sender or os.environ.get("OVERSTORY_AGENT_NAME") or "operator"
    ids = [mid for mid in (mail.insert_message(conn, sender=sender, recipient=to, type=mail_type, priority="high",
                                               subject=subject, body=body, payload=payload) for to in recipients) if mid]
    mail.record_sent(conn, ids)
