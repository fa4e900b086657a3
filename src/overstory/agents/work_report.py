"""What an agent's ``worker_done`` says it did, checked against git.

Models often leave ``commit`` and ``files_modified`` out of their ``worker_done`` payload (or
leave them empty). ov fills them from the agent's branch: its head commit, and the files
changed since the commit it was slung from. What the agent did give is kept.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory.gitutil import git
from overstory.paths import ProjectPaths


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
