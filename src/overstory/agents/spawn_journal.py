"""The record of intent behind `ov sling`, and undoing a spawn that was killed half-way.

The spawn's first durable act is a ``spawn_intents`` row naming everything it may create
(branch, worktree, run dir, session generation, dispatch mail, tmux session) and the
spawner's pid; each step notes itself there before acting, and the row is deleted when
the spawn is complete. A row whose spawner is dead is an unfinished spawn: a retry of
`ov sling`, `ov stop NAME` and the watchdog all undo it here, the same way, so the name
can be used again and nothing is left behind. Undoing is idempotent: if it is itself
interrupted, the row stays and the next one finishes it.

What is removed is only what the row says this spawn made: the branch only if the spawn
got past creating it (and it still points at the commit it started from), the worktree
and run dir only if their step was reached, the session row only if it was created after
the intent (no other spawn of the name can run while the intent exists).

A kill can also land inside one of git's own steps. The git a spawn runs dies with it
(``run_git``), so no undo races a git that is still working; what a killed git leaves is
removed as well: the branch's ``.lock`` file (made after the intent), and the folder git
keeps for a half-made worktree under ``.git/worktrees/``, whose name the spawn notes in the
intent before `git worktree add` runs (git's folder for a worktree that is still
initialising stays locked, so `git worktree prune` never removes it and a retry's `git
worktree add` fails on it). A folder there that points at another path is never touched.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
import typing as t
from pathlib import Path

from overstory import procs
from overstory.errors import OrchestratorError, SpawnError
from overstory.gitutil import common_dir, git, worktree_admin_lock
from overstory.paths import ProjectPaths
from overstory.store import intents, sessions

STEPS = ("intent", "branch", "worktree", "instructions", "rundir", "session", "dispatch", "start")


def reached(intent: t.Mapping[str, t.Any], step: str) -> bool:
    """Whether the spawn got as far as starting ``step``."""
    return STEPS.index(str(intent.get("step", "intent"))) >= STEPS.index(step)


def spawner_alive(intent: t.Mapping[str, t.Any]) -> bool:
    return procs.is_alive(intent.get("pid"), intent.get("pid_ticks"))


def kill_point(step: str, environ: t.Mapping[str, str]) -> None:
    """Fault injection for the tests (``OV_TEST_KILL_AT=spawn:<step>``): die here as `kill -9` would."""
    if environ.get(procs.KILL_AT_ENV) == f"spawn:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def begin(conn: sqlite3.Connection, intent: dict[str, t.Any]) -> None:
    """Write the intent (the spawn's first durable act); SpawnError if another spawn of the name runs."""
    ok = intents.begin_spawn(conn, name=intent["name"], pid=intent["pid"], pid_ticks=intent["pid_ticks"],
                             branch=intent["branch"], base_commit=intent["base_commit"], worktree=intent["worktree"],
                             run_dir=intent["run_dir"], tmux_session=intent["tmux_session"])
    if not ok:
        raise _busy(intents.get_spawn(conn, intent["name"]) or intent)


def step(conn: sqlite3.Connection, intent: dict[str, t.Any], name: str, **learned: t.Any) -> None:
    """Note (durably, before acting) that the spawn starts step ``name``."""
    intent.update(step=name, **learned)
    intents.spawn_step(conn, intent["name"], name, **learned)


def run_git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One git step of a spawn; git is killed when its spawner dies (so nothing keeps working behind an undo)."""
    preexec = _die_with_parent()
    setpriv = procs.which("setpriv") if preexec is None else None  # util-linux: the same, without Python
    prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    done = subprocess.run([*prefix, "git", *args], cwd=root, capture_output=True, text=True, preexec_fn=preexec)
    if done.returncode != 0:
        raise SpawnError(f"`git {' '.join(args[:2])}` failed (exit {done.returncode}): "
                         + (done.stderr.strip() or done.stdout.strip()).replace("\n", " "))
    return done


def add_worktree(project: ProjectPaths, conn: sqlite3.Connection, intent: dict[str, t.Any], worktree: Path,
                 branch: str) -> None:
    """`git worktree add`, with the name of git's folder for it noted in the intent first (see the module doc)."""
    worktree.parent.mkdir(parents=True, exist_ok=True)
    with worktree_admin_lock(project.root):  # no other ov adds a worktree meanwhile: git picks the name below
        admin = _free_admin_name(common_dir(project.root), worktree.name)
        step(conn, intent, "worktree", worktree_admin=admin)
        run_git(project.root, "worktree", "add", str(worktree), branch)


def continuation(project: ProjectPaths, branch: str, worktree: Path) -> bool:
    """Check that a restart can go on with ``branch``; True when its worktree is still there (reused as it is,
    uncommitted changes included), False when a new one is to be added on the branch."""
    if git(project.root, "show-ref", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode:
        raise SpawnError(f"branch {branch} is gone (removed by `ov stop --clean` or a merge): nothing to continue; "
                         "sling the task afresh")
    git(project.root, "worktree", "prune", check=False)
    listed = git(project.root, "worktree", "list", "--porcelain", check=False).stdout.split("\n\n")
    found = [block for block in listed if block.split("\n", 1)[0] in (f"worktree {worktree}",
                                                                      f"worktree {worktree.resolve()}")]
    if found:
        if f"branch refs/heads/{branch}" not in found[0]:
            raise SpawnError(f"{worktree} is not on {branch} any more; check out {branch} there, or remove it")
        return True
    if worktree.exists():
        raise SpawnError(f"{worktree} exists but is not a git worktree of this project; remove it first")
    return False


def _die_with_parent() -> t.Callable[[], None] | None:
    """A preexec function that makes the child die with this process (Linux PR_SET_PDEATHSIG), if that is safe."""
    import threading

    if threading.active_count() > 1:  # running Python between fork and exec is unsafe with threads (an
        return None                   # agent's loop serving its endpoint)
    try:  # _ctypes alone: the ctypes package costs a sling 1.5 ms more to import
        import _ctypes

        prctl = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")  # type: ignore[arg-type]  # the program itself
    except (ImportError, OSError, AttributeError):
        return None
    parent = os.getpid()
    death_signal = int(signal.SIGKILL)

    def preexec() -> None:
        _ctypes.call_function(prctl, (1, death_signal))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the spawner died before the line above
            os._exit(1)

    return preexec




def _free_admin_name(common: Path, base: str) -> str:
    """The folder name `git worktree add` will take under .git/worktrees/: the base name, else base1, base2..."""
    name, number = base, 0
    while (common / "worktrees" / name).exists():
        number += 1
        name = f"{base}{number}"
    return name


def _busy(intent: t.Mapping[str, t.Any]) -> SpawnError:
    return SpawnError(f"{intent['name']} is being spawned right now by pid {intent.get('pid')} (another `ov sling`); "
                      "wait for it to finish")


def settle_abandoned(project: ProjectPaths, conn: sqlite3.Connection, name: str) -> list[str] | None:
    """Before reusing ``name``: undo its unfinished spawn if its spawner died.

    Returns what was removed (None when there was no unfinished spawn); raises SpawnError
    while another live process is still spawning it.
    """
    intent = intents.get_spawn(conn, name)
    if intent is None:
        return None
    if spawner_alive(intent):
        raise _busy(intent)
    return undo(project, conn, intent)


def settle_all(project: ProjectPaths, conn: sqlite3.Connection) -> dict[str, list[str]]:
    """The watchdog's pass: undo every spawn whose spawner died. Returns {name: what was removed}."""
    undone = {}
    for intent in intents.list_spawns(conn):
        if not spawner_alive(intent):
            try:
                undone[intent["name"]] = undo(project, conn, intent)
            except (OrchestratorError, OSError, sqlite3.Error) as exc:  # the next pass tries again
                undone[intent["name"]] = [f"could not finish undoing it: {exc}"]
    return undone


def undo(project: ProjectPaths, conn: sqlite3.Connection, intent: t.Mapping[str, t.Any], *,
         extra_pids: t.Sequence[tuple[int, int | None]] = ()) -> list[str]:
    """Remove what this spawn made, then its rows and the intent (one transaction, last).

    Files go before rows: the worktree frees space when the disk is full, and if this is
    interrupted the intent is still there for the next attempt.
    """
    name = str(intent["name"])
    removed: list[str] = []
    row = _own_session(conn, intent)
    removed += _stop_processes(project, conn, row, extra_pids)
    worktree = Path(intent["worktree"]) if intent.get("worktree") else None
    ours = worktree is not None and reached(intent, "worktree") and _inside(worktree, project.worktrees_dir)
    if ours and _remove_worktree(project, worktree, intent.get("worktree_admin")):  # type: ignore[arg-type]
        removed.append(str(worktree))
    branch = intent.get("branch")
    if branch and reached(intent, "branch"):
        removed += _remove_ref_lock(project, branch, int(intent.get("started_at") or 0))
        removed += _remove_branch(project, branch, intent.get("base_commit"))
    run_dir = Path(intent["run_dir"])
    if reached(intent, "rundir") and _inside(run_dir, project.run_dir) and run_dir.exists():
        _remove_run_dir(run_dir)
        removed.append(str(run_dir))
    rows = dict(intent)
    if row is not None:
        rows["generation"] = row.generation
        removed.append(f"session row {name} (generation {row.generation})")
    if rows.get("dispatch_id") is not None:
        removed.append(f"dispatch mail #{rows['dispatch_id']}")
    intents.discard_spawn(conn, rows)
    return removed


def _remove_run_dir(run_dir: Path, patience: float = 5.0) -> None:
    """Remove the run dir, again while something still writes into it: a turn's shim outlives its command by
    design (it records the command's end in the turn's folder there), so it may write while the tree goes."""
    import shutil  # (only an undo removes trees: not on every spawn's path)

    deadline = time.monotonic() + patience
    while True:
        shutil.rmtree(run_dir, ignore_errors=True)
        if not run_dir.exists() or time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def _own_session(conn: sqlite3.Connection, intent: t.Mapping[str, t.Any]) -> sessions.Session | None:
    """The session row this spawn created, if any (by its recorded generation, or created after the intent)."""
    row = sessions.get(conn, str(intent["name"]))
    if row is None:
        return None
    if intent.get("generation") is not None:
        return row if row.generation == intent["generation"] else None
    return row if reached(intent, "session") and row.created_at >= int(intent["started_at"]) else None


def _stop_processes(project: ProjectPaths, conn: sqlite3.Connection, row: sessions.Session | None,
                    extra: t.Sequence[tuple[int, int | None]]) -> list[str]:
    stopped = []
    targets = list(extra)
    if row is not None and row.loop_pid:
        targets.append((row.loop_pid, row.loop_start_ticks))
    for pid, ticks in dict.fromkeys(targets):
        if procs.is_alive(pid, ticks):
            procs.kill_group(pid, ticks, grace=1.0, force=True)
            stopped.append(f"process {pid}")
    fresh = sessions.get(conn, row.name) if row is not None else None
    if row is not None and fresh is not None and fresh.generation == row.generation:
        row = fresh  # read again: the loop may have started a turn before it died
    if row is not None and row.mode == "headless" and (row.turn_pgid or row.current_turn_id):
        procs.kill_turn(row.turn_pgid, row.turn_start_ticks, row.current_turn_id, force=True)
    if row is not None and row.mode == "tmux" and row.tmux_session:
        from overstory.agents.tmux import panes as tmux_panes

        try:
            if tmux_panes.kill_session(project, row, grace=1.0, force=True).session_killed:
                stopped.append(f"tmux session {row.tmux_session}")
        except OrchestratorError:
            pass
    return stopped


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def _remove_worktree(project: ProjectPaths, worktree: Path, admin: str | None) -> bool:
    with worktree_admin_lock(project.root):
        listed = str(worktree) in git(project.root, "worktree", "list", "--porcelain", check=False).stdout
        present = listed or worktree.exists()
        if listed:
            git(project.root, "worktree", "remove", "--force", "--force", str(worktree), check=False)
        if worktree.exists():
            import shutil

            shutil.rmtree(worktree, ignore_errors=True)
        present = _remove_admin_folders(project, worktree, admin) or present
        git(project.root, "worktree", "prune", check=False)
    return present


def _remove_admin_folders(project: ProjectPaths, worktree: Path, admin: str | None) -> bool:
    """git's folders for this worktree that a killed `git worktree add` left (locked, so prune keeps them).

    Ours: the one named in the intent, unless it points at another path (a killed git may have written
    none, or part, of its ``gitdir``); and any that points at this worktree (ov's own, under
    .overstory/worktrees/NAME, which this spawn holds)."""
    folders = common_dir(project.root) / "worktrees"
    if not folders.is_dir():
        return False
    mine = str(worktree.resolve() / ".git")
    removed = False
    for folder in folders.iterdir():
        try:
            points_at = (folder / "gitdir").read_text(encoding="utf-8").strip()
        except OSError:
            points_at = None
        if points_at == mine or (folder.name == admin and (points_at is None or mine.startswith(points_at))):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            removed = True
    return removed


def _remove_ref_lock(project: ProjectPaths, branch: str, since_ms: int) -> list[str]:
    """The branch's lock file, if a `git branch` killed by the spawn's death left it (made after the intent)."""
    lock = common_dir(project.root) / "refs" / "heads" / f"{branch}.lock"
    try:
        made_ms = lock.stat().st_mtime_ns // 1_000_000
    except OSError:
        return []
    if made_ms < since_ms:
        return []
    lock.unlink(missing_ok=True)
    return [str(lock)]


def _remove_branch(project: ProjectPaths, branch: str, base_commit: str | None) -> list[str]:
    """Delete the spawn's branch if it still points where the spawn created it; keep it (and say so) otherwise."""
    head = git(project.root, "rev-parse", "-q", "--verify", f"refs/heads/{branch}^{{commit}}",
               check=False).stdout.strip()
    if not head:
        return []
    if base_commit and head != base_commit:
        return [f"kept {branch}: it has commits the spawn did not make"]
    done = git(project.root, "update-ref", "-d", f"refs/heads/{branch}", head, check=False)
    if done.returncode != 0:
        raise SpawnError(f"could not delete branch {branch}: {done.stderr.strip()}")
    return [branch]
