"""What an agent's ``worker_done`` says it did, checked against git.

Models often leave ``commit`` and ``files_modified`` out of their ``worker_done`` payload (or
leave them empty). ov fills them from the agent's branch: its head commit, and the files
changed since the commit it was slung from. What the agent did give is kept.

A lead's ``worker_done`` says its part of the work is done, so it is refused while one of
its builders is still working (has not sent its own ``worker_done``) or has commits its
target branch lacks (not merged yet, and not dismissed with `ov merge --dismiss`); the
refusal is the lead's command's error, naming each builder and what it waits for.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory.errors import MailError
from overstory.gitutil import git
from overstory.paths import ProjectPaths


def refuse_early_lead_report(project: t.Callable[[], ProjectPaths], conn: sqlite3.Connection, sender: str) -> None:
    """Raise MailError when ``sender`` is a lead whose builders are not all done and merged."""
    from overstory.store import merge_queue, sessions
    from overstory.store.lifecycle import promised

    lead = sessions.get(conn, sender)
    if lead is None or lead.capability != "lead":
        return
    waiting = []
    for child in sessions.list_sessions(conn):
        if child.parent != sender or child.capability != "builder" or child.created_at < lead.created_at:
            continue
        if not child.is_terminal and not promised(conn, child):
            waiting.append(f"{child.name} is still working (state {child.state}): wait for its worker_done")
            continue
        if not child.branch or not child.base_branch or merge_queue.dismissed(conn, child.branch):
            continue
        unmerged = git(project().root, "rev-list", "--count", f"refs/heads/{child.base_branch}..refs/heads/"
                       f"{child.branch}", check=False).stdout.strip()
        if unmerged.isdigit() and int(unmerged) > 0:
            count = f"{unmerged} commit{'s' if unmerged != '1' else ''}"
            waiting.append(f"{child.name} has {count} on {child.branch} not merged into {child.base_branch}: "
                           "have it merged (`ov merge` by a merger, the coordinator or the operator)")
    if waiting:
        raise MailError(f"worker_done refused: {len(waiting)} of your builders {'is' if len(waiting) == 1 else 'are'} "
                        f"not done: {'; '.join(waiting)}. Report worker_done again once they are; until then end "
                        "your turn (their reports arrive as mail).")


def fill_worker_done(project: ProjectPaths, conn: sqlite3.Connection, sender: str, payload: t.Any) -> t.Any:
    if payload is not None and not isinstance(payload, dict):
        return payload  # the payload check names the problem
    if payload and payload.get("commit") and payload.get("files_modified"):
        return payload
    from overstory.store.sessions import branch_row

    row = branch_row(conn, sender)
    if row is None or not row["branch"]:
        return payload
    head = git(project.root, "rev-parse", "-q", "--verify", f"refs/heads/{row['branch']}^{{commit}}",
               check=False).stdout.strip()
    if not head:
        return payload
    filled = dict(payload or {})
    if not filled.get("commit"):
        filled["commit"] = head
    if not filled.get("files_modified"):
        base = json.loads(row["spec"] or "{}").get("base_commit")
        if not base and row["base_branch"]:
            base = git(project.root, "merge-base", row["base_branch"], head, check=False).stdout.strip()
        if base:
            filled["files_modified"] = git(project.root, "diff", "--name-only", "--no-renames", base, head,
                                           check=False).stdout.splitlines()
    return filled
