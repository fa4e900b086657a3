"""What a builder is told, when it reports ``worker_done``, about work merged into its base branch since it started.

Builders of one team work side by side from the same base branch, and their branches are merged
back one by one. A builder that reports after a sibling's work was merged reports a branch that
lacks it; ov then merges the two histories itself (its tiers), and what it gets is less predictable
than what the builder could have done with a rebase, with its tests run on the result.

So when a builder sends ``worker_done`` (`ov mail send --type worker_done`, from its turn or through
its endpoint) and its base branch has commits its branch lacks, ov looks at what moved (git only: the
commits, which sibling branches are now in the base and not in the builder's) and asks git whether
the two would merge cleanly (``git merge-tree``, which writes objects only):

- they would conflict: the report is held, not sent, once per base-branch head (``store.sibling_notices``):
  the command answers with the siblings, the commits, the files in conflict and how to rebase. The
  same report sent again (rebased or not) goes through; so does one after a rebase, since nothing is
  then missing;
- they would merge cleanly: the report is sent, and the answer carries the same news as a note (a
  rebase is still worth it to test against the siblings' work).

Only builders (the capability whose branches are merged from ``worker_done``). A process killed after
the notice is recorded and before it is printed leaves a recorded notice: the report sent again goes
through without the news (the branch is merged by ov's tiers as before).
"""

from __future__ import annotations

from overstory.gitutil import git

TYPE_CHECKING = False  # `ov mail send` imports this for a builder's worker_done: typing is not imported
if TYPE_CHECKING:
    import sqlite3

    from overstory.paths import ProjectPaths

SHOWN_COMMITS = 8


class News:
    """What moved on the builder's base branch since its branch forked from it."""

    def __init__(self, base_branch: str, base_head: str, count: int, commits: list[str], siblings: list[str],
                 conflicts: list[str]) -> None:
        self.base_branch, self.base_head, self.count = base_branch, base_head, count
        self.commits, self.siblings, self.conflicts = commits, siblings, conflicts

    def describe(self) -> str:
        who = ", ".join(self.siblings)
        merged = (f"{who}'s work was merged into {self.base_branch}" if len(self.siblings) == 1 else
                  f"the work of {who} was merged into {self.base_branch}" if self.siblings else
                  f"{self.base_branch} moved")
        shown = "; ".join(self.commits) + ("; ..." if self.count > len(self.commits) else "")
        plural = "s" if self.count != 1 else ""
        return (f"since you started, {merged}: {self.count} commit{plural} your branch lacks ({shown})")

    def rebase(self) -> str:
        return (f"`git rebase {self.base_branch}` in your worktree (or `git rebase {self.base_head[:12]}`), "
                "resolve, run the tests, commit")


def news(project: ProjectPaths, conn: sqlite3.Connection, sender: str) -> tuple[News, int] | None:
    """What moved on ``sender``'s base branch that its branch lacks, and its generation; None when nothing did
    (or it is not a builder with a branch)."""
    from overstory.store import sessions

    agent = sessions.get(conn, sender)
    if agent is None or agent.capability != "builder" or not agent.branch or not agent.base_branch:
        return None
    root, base, own = project.root, f"refs/heads/{agent.base_branch}", f"refs/heads/{agent.branch}"
    base_head, own_head = (git(root, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", check=False).stdout.strip()
                           for ref in (base, own))
    if not base_head or not own_head:
        return None
    count = git(root, "rev-list", "--count", "--no-merges", f"{own_head}..{base_head}", check=False).stdout.strip()
    if not count.isdigit() or int(count) == 0:
        return None
    commits = git(root, "log", "--no-merges", f"--max-count={SHOWN_COMMITS}", "--format=%h %s",
                  f"{own_head}..{base_head}", check=False).stdout.splitlines()
    merged = set(git(root, "for-each-ref", "--format=%(refname:short)", f"--merged={base_head}",
                     f"--no-merged={own_head}", "refs/heads/", check=False).stdout.split())
    siblings = [a.name for a in sessions.list_sessions(conn) if a.name != sender and a.branch in merged]
    tried = git(root, "merge-tree", "--write-tree", "--name-only", "--no-messages", base_head, own_head, check=False)
    conflicts = tried.stdout.splitlines()[1:] if tried.returncode == 1 else []  # 0: clean; > 1: no prediction
    return News(agent.base_branch, base_head, int(count), commits, siblings, conflicts), agent.generation


def before_worker_done(project: ProjectPaths, conn: sqlite3.Connection, sender: str) -> tuple[bool, str | None]:
    """(hold the report, what to tell the builder): (False, None) when its base branch has nothing it lacks."""
    from overstory.store.sibling_notices import tell_once

    found = news(project, conn, sender)
    if found is None:
        return False, None
    moved, generation = found
    if moved.conflicts and tell_once(conn, sender, generation, moved.base_head):
        files = ", ".join(moved.conflicts[:10]) + (", ..." if len(moved.conflicts) > 10 else "")
        return True, (f"held, not sent: {moved.describe()}, and your branch would conflict with it in {files}. "
                      f"Rebase onto it now, so that your merge is predictable: {moved.rebase()}; then send "
                      "worker_done again. Sent again as it is, it goes through and ov's merge resolves the "
                      "conflict itself.")
    how = ("it still conflicts in " + ", ".join(moved.conflicts[:10]) + "; ov's merge will resolve it"
           if moved.conflicts else "your branch merges with it cleanly")
    return False, (f"note: {moved.describe()}; {how}. To test your work on top of theirs: {moved.rebase()} "
                   "(ov merges your branch as it is when it merges).")
