"""The mail that reports a merge: once per merge, naming the commits it brought in.

Each message carries a dedup key made of the target, the merged commit and the
recipient, so however many `ov merge` runs race on one branch, or a run killed after
merging is retried, or the watchdog finishes it, the parent gets exactly one ``merged``
(and an identical failure is reported once).
"""

from __future__ import annotations

import os
import sqlite3
import typing as t

from overstory.store import sessions

if t.TYPE_CHECKING:
    from pathlib import Path

COMMITS_LISTED = 50


def describe_commits(root: Path, commits: t.Sequence[str]) -> list[str]:
    """``<short sha> <subject>`` for each commit (at most COMMITS_LISTED)."""
    from overstory.gitutil import git

    shown = list(commits)[:COMMITS_LISTED]
    if not shown:
        return []
    out = git(root, "log", "--no-walk=unsorted", "--format=%h %s", *shown, check=False).stdout.splitlines()
    more = len(commits) - len(shown)
    return out + ([f"... and {more} more"] if more > 0 else [])


def merge_commit_of(root: Path, source: str, target: str) -> str | None:
    """The merge commit on ``target``'s first-parent line that brought ``source`` in (None after a fast-forward)."""
    from overstory.gitutil import git

    out = git(root, "rev-list", "--first-parent", "--ancestry-path", "--reverse", f"{source}..refs/heads/{target}",
              check=False).stdout.split()
    if not out:
        return None
    parents = git(root, "rev-list", "--parents", "-n", "1", out[0], check=False).stdout.split()[1:]
    return out[0] if len(parents) > 1 else None


def announce(conn: sqlite3.Connection, root: Path, agent: sessions.Session | None, *, merged: bool, branch: str,
             target: str, source_commit: str, reason: str, tier: int | None = None, commit: str | None = None,
             commits: t.Sequence[str] = (), conflicts: t.Sequence[str] = (), target_before: str | None = None,
             next_step: str = "", sender: str | None = None) -> list[int]:
    """Mail the result to the agent's parent and, if it still runs, the agent. Returns the new ids.

    ``sender`` signs it (an agent merging through its endpoint); default: the environment's agent, else the operator.
    """
    from overstory.store import mail
    from overstory.store.db import write_transaction

    if agent is None:
        return []
    lines = describe_commits(root, commits)
    if merged:
        mail_type = "merged"
        count = f"{len(commits)} commit{'s' if len(commits) != 1 else ''}"
        subject = f"merged {branch} into {target} (tier {tier or 1}): {count}"
        payload: dict[str, t.Any] = {"branch": branch, "tier": tier or 1, "agent": agent.name,
                                     "task_id": agent.task_id, "target_branch": target, "commit": commit,
                                     "commits": list(commits)}
        body = reason + ("\nCommits brought in:\n" + "\n".join(f"- {line}" for line in lines) if lines else "")
        key = f"merged:{target}:{source_commit}"
    else:
        mail_type, subject = "merge_failed", f"could not merge {branch} into {target}"
        payload = {"branch": branch, "reason": reason or "merge failed", "agent": agent.name,
                   "task_id": agent.task_id, "target_branch": target, "conflict_files": list(conflicts)}
        if tier:
            payload["tier"] = tier
        body = reason + ("\nConflicting files:\n" + "\n".join(f"- {f}" for f in conflicts) if conflicts else "")
        body += f"\nNext: {next_step}" if next_step else ""
        key = f"merge_failed:{target}:{target_before}:{source_commit}"
    recipients = [agent.parent or "operator"]
    if not agent.is_terminal and agent.name not in recipients:
        recipients.append(agent.name)
    sender = sender or os.environ.get("OVERSTORY_AGENT_NAME") or "operator"
    with write_transaction(conn):
        sent = [(to, mail.insert_message(conn, sender=sender, recipient=to, type=mail_type, priority="high",
                                         subject=subject, body=body, payload=payload, dedup_key=f"{key}:{to}"))
                for to in recipients]
        # An agent that merged its own child's branch has the result as its command's output: its copy is kept,
        # read, so it does not wake the agent for a turn (a paid model turn per merge) to read it again.
        mail.mark_read_ids(conn, [mid for to, mid in sent if mid and to == sender and to != "operator"])
        ids = [mid for _, mid in sent if mid]
    if ids:
        mail.record_sent(conn, ids)
    return ids
