"""`ov merge`'s record of intent, and finishing a merge whose command was killed.

``merge_one`` writes a ``merge_intents`` row (source commit, target, its commit before)
before it touches git and deletes it after the result is announced. A row whose process
is dead is settled by whoever comes next (the next `ov merge`, or the watchdog): if the
target now contains the source commit, the merge happened and only its mail is missing,
so it is announced (once: the mail is deduplicated); otherwise nothing was merged and the
row is dropped (the scratch worktree and any half-done publish were rolled back by
``merge.publish.recover_all`` first).
"""

from __future__ import annotations

import os
import sqlite3
import typing as t

from overstory import procs
from overstory.errors import OrchestratorError
from overstory.paths import ProjectPaths
from overstory.store import intents, merge_queue, sessions


def begin(conn: sqlite3.Connection, *, agent: sessions.Session | None, branch: str, target: str, source_commit: str,
          target_before: str, queue_id: int | None) -> int:
    return intents.begin_merge(conn, agent=agent.name if agent else None,
                               generation=agent.generation if agent else None, branch=branch, target=target,
                               source_commit=source_commit, target_before=target_before,
                               queue_id=queue_id, sender=os.environ.get("OVERSTORY_AGENT_NAME") or "operator",
                               pid=os.getpid(), pid_ticks=procs.start_ticks(os.getpid()))


def settle_all(project: ProjectPaths, conn: sqlite3.Connection, *, scan_journals: bool = True) -> dict[str, str]:
    """Recover every interrupted merge whose process is dead. Returns {label: what was done}.

    With ``scan_journals`` False (the watchdog's every tick) git and the lock directory are
    only looked at when a dead intent says a merge was interrupted.
    """
    from overstory.merge.publish import recover_all

    dead = [row for row in intents.list_merges(conn) if not procs.is_alive(row["pid"], row["pid_ticks"])]
    done: dict[str, str] = {}
    if dead or scan_journals:
        done = {f"merge into {target}": "; ".join(what)
                for target, what in recover_all(project.root, project.locks_dir).items()}
    for row in dead:
        try:
            done[row["agent"] or row["branch"]] = finish(project, conn, row)
        except (OrchestratorError, OSError, sqlite3.Error) as exc:  # the next pass tries again
            done[row["agent"] or row["branch"]] = f"could not settle its interrupted merge: {exc}"
    return done


def finish(project: ProjectPaths, conn: sqlite3.Connection, row: t.Mapping[str, t.Any]) -> str:
    """Settle one dead merge's intent: announce it if it happened, drop it if not."""
    from overstory.gitutil import git
    from overstory.merge.announce import announce, merge_commit_of

    target, source = row["target"], row["source_commit"]
    contained = git(project.root, "merge-base", "--is-ancestor", source, f"refs/heads/{target}",
                    check=False).returncode == 0
    if not contained:
        intents.end_merge(conn, row["id"])
        return f"its `ov merge` of {row['branch']} died before merging: nothing was merged (run it again)"
    agent = sessions.get(conn, row["agent"]) if row["agent"] else None
    if agent is not None and agent.generation != row["generation"]:
        agent = None
    merge_commit = merge_commit_of(project.root, source, target)
    commits = git(project.root, "rev-list", "--reverse", f"{row['target_before']}..{source}",
                  check=False).stdout.split()
    tier = tier_of(project, merge_commit)
    announce(conn, project.root, agent, merged=True, branch=row["branch"], target=target, source_commit=source,
             reason=f"merged by an `ov merge` that was interrupted before reporting it "
                    f"(commit {merge_commit or source})",
             tier=tier, commit=merge_commit, commits=commits)
    if row["queue_id"] is not None:
        merge_queue.settle(conn, row["queue_id"], merged=True, tier=tier, result="merged (finished after a crash)")
    intents.end_merge(conn, row["id"])
    return f"its `ov merge` of {row['branch']} died after merging; the result was announced"


def tier_of(project: ProjectPaths, merge_commit: str | None) -> int:
    """The tier a merge commit records in its message (ov's default message names tiers 2 and 3)."""
    if not merge_commit:
        return 1
    from overstory.gitutil import git

    message = git(project.root, "log", "-1", "--format=%B", merge_commit, check=False).stdout
    for tier in (3, 2):
        if f"(tier {tier})" in message:
            return tier
    return 1
