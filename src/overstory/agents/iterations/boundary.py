"""A phase boundary of an `ov loop`: the checkpoint, and the critic that judges the phase.

The checkpoint is a commit on the loop's branch: whatever the agent left uncommitted
is committed by ov (its progress file stays out, like every ov file), and a ref
``refs/ov/checkpoints/<loop>/<seq>-<phase>`` keeps it even if the branch moves on.
The critic is a read-only agent (a reviewer) slung as the loop's child, based on the
loop's branch, with the phase's diff in its task; its ``result`` mail to the loop
carries the verdict: ``pass``, ``retry`` or ``escalate``.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t
from pathlib import Path

from overstory.gitutil import git
from overstory.paths import ProjectPaths
from overstory.sandbox.check_tree import on_own_branch
from overstory.store import loops
from overstory.store.loops import Loop
from overstory.store.sessions import Session

if t.TYPE_CHECKING:
    from overstory.config.model import Config

VERDICTS = ("pass", "retry", "escalate")
DIFF_LIMIT = 60_000


def checkpoint_ref(loop: Loop, seq: int, phase: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in phase)[:40] or "phase"
    return f"refs/ov/checkpoints/{loop.name}/{seq:02d}-{safe}"


def save_checkpoint(conn: sqlite3.Connection, agent: Session, loop: Loop, progress: str | None) -> dict[str, t.Any]:
    """The checkpoint of the current phase round: made once (a loop that restarts finds it)."""
    phase = loop.phase["name"]
    for existing in loops.checkpoints(conn, loop.name, loop.generation):
        if existing["phase"] == phase and existing["phase_round"] == loop.phase_round:
            return existing
    worktree = Path(agent.worktree or ".")
    own = bool(agent.branch) and on_own_branch(worktree, agent.branch or "")  # never commit onto another branch
    if own and git(worktree, "status", "--porcelain", check=False).stdout.strip():
        git(worktree, "add", "-A")
        done = git(worktree, *_identity(worktree), "commit", "-q", "-m",
                   f"ov loop {loop.name}: checkpoint after phase {phase}", check=False)
        if done.returncode != 0:  # a hook refused it: the checkpoint is the last commit
            git(worktree, "reset", "-q", check=False)
    sha = git(worktree, "rev-parse", "HEAD").stdout.strip()
    seq = len(loops.checkpoints(conn, loop.name, loop.generation)) + 1
    ref = checkpoint_ref(loop, seq, phase)
    git(worktree, "update-ref", ref, sha)
    loops.add_checkpoint(conn, loop, phase=phase, commit_sha=sha, ref=ref, progress=progress)
    return next(c for c in loops.checkpoints(conn, loop.name, loop.generation) if c["ref"] == ref)


def _identity(worktree: Path) -> list[str]:
    """A committer for ov's checkpoint commit when git has none configured."""
    if git(worktree, "config", "user.email", check=False).stdout.strip():
        return []
    return ["-c", "user.name=ov", "-c", "user.email=ov@localhost"]


def phase_diff(agent: Session, loop: Loop, conn: sqlite3.Connection) -> tuple[str, str]:
    """(the diff of the phase's work, the range it covers): from the previous checkpoint (or the
    loop's base) to the newest one."""
    marks = loops.checkpoints(conn, loop.name, loop.generation)
    newest = marks[-1]["commit_sha"]
    base = marks[-2]["commit_sha"] if len(marks) > 1 else (agent.spec.get("base_commit") or f"{newest}~1")
    worktree = Path(agent.worktree or ".")
    text = git(worktree, "diff", base, newest, check=False).stdout
    if len(text) > DIFF_LIMIT:
        text = text[:DIFF_LIMIT] + f"\n[... diff truncated at {DIFF_LIMIT} characters; `git diff {base[:12]} " \
                                   f"{newest[:12]}` shows all of it]"
    return text, f"{base[:12]}..{newest[:12]}"


def critic_name(loop: Loop) -> str:
    return f"{loop.name[:40].rstrip('-.')}-critic-{loop.phase_index + 1}-{loop.phase_round + 1}"


def start_critic(project: ProjectPaths, config: Config, agent: Session, loop: Loop, name: str, task: str,
                 environ: t.Mapping[str, str]) -> None:
    """Sling the critic as the loop's child, on the loop's branch (it sees the checkpoint).

    Through `ov sling` itself, as the operator would run it: the same checks (depth, limits,
    names) and the same undo of a failed spawn. Its task, with the diff, goes in a spec file.
    """
    import subprocess

    from overstory.errors import OrchestratorError
    from overstory.resources import ov_executable

    critic = loop.definition.get("critic") or {}
    capability = critic.get("capability", "reviewer")
    runtime = critic.get("runtime") or config.runtimes.get(capability) or agent.runtime
    scenario = agent.spec.get("scenario") if runtime == agent.runtime else None
    task_file = project.run_dir / agent.name / f"{name}-task.md"
    task_file.parent.mkdir(parents=True, exist_ok=True)
    task_file.write_text(task, encoding="utf-8")
    command, _ = ov_executable()
    argv = [*command, "--project", str(project.root), "sling", capability, f"{loop.name[:40]}-critic", "--name", name,
            "--spec", str(task_file), "--parent", agent.name, "--base-branch", agent.branch or "", "--runtime",
            runtime, *(["--model", critic["model"]] if critic.get("model") else []),
            *(["--scenario", scenario] if scenario else [])]
    own = {k: v for k, v in environ.items() if not k.startswith("OVERSTORY_")}  # the loop is not an agent caller
    done = subprocess.run(argv, cwd=project.root, env=own, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise OrchestratorError(last.removeprefix("ov: error: "))


def read_verdict(conn: sqlite3.Connection, loop_agent: str, critic: str) -> tuple[str, str, int] | None:
    """(verdict, notes, mail id) of the critic's first ``result`` mail to the loop, if it came."""
    from overstory.store import mail_queries

    row = mail_queries.first_result(conn, loop_agent, critic)
    if row is None:
        return None
    payload: dict[str, t.Any] = {}
    try:
        loaded = json.loads(row["payload"]) if row["payload"] else {}
        payload = loaded if isinstance(loaded, dict) else {}
    except ValueError:
        pass
    verdict = str(payload.get("verdict") or "").strip().lower()
    if verdict not in VERDICTS:  # no payload: the first word of the subject ("verdict: retry", "retry")
        words = (row["subject"] or "").lower().replace(":", " ").split()
        verdict = next((w for w in words if w in VERDICTS), "")
    notes = str(payload.get("notes") or row["body"] or "").strip()
    if verdict not in VERDICTS:
        return "escalate", f"the critic's result had no verdict (pass, retry or escalate): {row['subject']}", row["id"]
    return verdict, notes, int(row["id"])


def consume_critic_mail(conn: sqlite3.Connection, loop_agent: str, prefix: str) -> int:
    """Mark read the mail the loop's critics sent it (their verdicts and reports are the loop's, not the model's)."""
    from overstory.store import mail

    return mail.mark_read_from(conn, loop_agent, prefix)


def critic_prefix(loop: Loop) -> str:
    return f"{loop.name[:40].rstrip('-.')}-critic-"
