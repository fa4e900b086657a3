"""`ov sling` killed (SIGKILL) between any two of its steps, then settled three ways.

Each case runs the real `ov sling` as a subprocess with ``OV_TEST_KILL_AT=spawn:<step>``,
which makes it SIGKILL itself right after that step's act (the kill -9 an operator's
terminal or an OOM killer would deliver). Then one of: the same `ov sling` again (it must
work), `ov stop NAME --clean` (it must undo the half-done spawn), or `ov watchdog --once`
(it must undo it). Afterwards nothing of the killed attempt may be left: no branch,
worktree, session row, mail, intent row, run dir or process.

Killed inside a step as well: inside `git branch` (held by a reference-transaction hook while git has
the ref's lock) and inside `git worktree add` (held by a smudge filter during its checkout, or the
moment its directory appears), then settled the same three ways; and the undo of what a killed
git leaves in .git/worktrees/ removes only the spawn's own folder.

Also: an unusable events.db makes `ov sling` refuse before creating anything, and a
booting agent whose loop cannot start (its events.db broke after the spawn) is settled
by the watchdog instead of being restarted forever.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agent_helpers import loop_processes, mail_rows, wait_terminal, write_scenario
from conftest import ov_command, run_git, run_ov
from overstory.store import sessions
from overstory.store.db import open_state

KILL_STEPS = ["intent", "branch", "worktree", "instructions", "session", "dispatch", "start"]
NAME = "builder-t1"


def leftovers(project, name=NAME):
    """Everything a spawn of ``name`` can create, as plain values."""
    conn = open_state(project.state_db)
    try:
        rows = conn.execute("SELECT count(*) FROM sessions WHERE name = ?", (name,)).fetchone()[0]
        history = conn.execute("SELECT count(*) FROM transitions WHERE name = ?", (name,)).fetchone()[0]
        mail = conn.execute("SELECT count(*) FROM mail WHERE recipient = ? OR sender = ?", (name, name)).fetchone()[0]
        intents = conn.execute("SELECT count(*) FROM spawn_intents").fetchone()[0]
    finally:
        conn.close()
    worktrees = run_git(project.root, "worktree", "list", "--porcelain")
    return {
        "session_rows": rows, "transitions": history, "mail": mail, "intents": intents,
        "branch": run_git(project.root, "for-each-ref", "--format=%(refname:short)", f"refs/heads/ov/{name}").strip(),
        "worktree_registered": str(project.worktree(name)) in worktrees,
        "worktree_dir": project.worktree(name).exists(), "run_dir": (project.run_dir / name).exists(),
        "loops": loop_processes(name, project.root),
    }


NOTHING = {"session_rows": 0, "transitions": 0, "mail": 0, "intents": 0, "branch": "", "worktree_registered": False,
           "worktree_dir": False, "run_dir": False, "loops": []}


def scenario(tmp_path, pause=2):
    # A killed sling's pause keeps a loop it started just before the kill from committing before the undo
    # stops it (the undo keeps a branch with commits it did not make: that would be the agent's work).
    return write_scenario(tmp_path / f"builder-{pause}.json", [{"actions": [
        {"sleep": pause},
        {"write": {"path": "work.txt", "content": "done\n"}},
        {"bash": "git add work.txt && git commit -q -m work"},
        {"bash": 'ov mail send --type worker_done --subject done --body "committed"'},
    ]}])


def sling(project, tmp_path, **env):
    """A killed sling (``OV_TEST_KILL_AT``) plays a scenario that pauses long enough for any undo on a loaded
    machine; the others pause briefly."""
    pause = 60 if "OV_TEST_KILL_AT" in env else 2
    return run_ov("sling", "builder", "t1", "--runtime", "scripted", "--scenario", str(scenario(tmp_path, pause)),
                  cwd=project.root, env=env)


@pytest.mark.parametrize("step", KILL_STEPS)
def test_killed_sling_then_retry_works(project, tmp_path, step):
    killed = sling(project, tmp_path, OV_TEST_KILL_AT=f"spawn:{step}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    retry = sling(project, tmp_path)
    assert retry.returncode == 0, retry.stderr
    agent = wait_terminal(project, NAME)
    assert agent.state == "completed", agent.state_reason
    state = leftovers(project)
    assert state["session_rows"] == 1 and state["intents"] == 0 and state["branch"] == "ov/builder-t1"
    assert [m["type"] for m in mail_rows(project, recipient=NAME)] == ["dispatch"]  # the killed one's is gone
    assert [m["type"] for m in mail_rows(project, sender=NAME)] == ["worker_done"]
    assert run_git(project.root, "log", "--format=%s", "main..ov/builder-t1").split("\n")[0] == "work"
    listed = [ln for ln in run_git(project.root, "worktree", "list", "--porcelain").splitlines()
              if ln.startswith("worktree ")]
    assert len(listed) == 2  # the root and this agent's: nothing left by the killed attempt


@pytest.mark.parametrize("step", KILL_STEPS)
def test_killed_sling_then_stop_clean_undoes_it(project, tmp_path, step):
    killed = sling(project, tmp_path, OV_TEST_KILL_AT=f"spawn:{step}")
    assert killed.returncode == -signal.SIGKILL
    stopped = run_ov("stop", NAME, "--clean", cwd=project.root)
    assert stopped.returncode == 0, stopped.stderr
    assert "undid the unfinished spawn" in stopped.stdout
    assert leftovers(project) == NOTHING


@pytest.mark.parametrize("step", KILL_STEPS)
def test_killed_sling_is_undone_by_the_watchdog(project, tmp_path, step):
    killed = sling(project, tmp_path, OV_TEST_KILL_AT=f"spawn:{step}")
    assert killed.returncode == -signal.SIGKILL
    dog = run_ov("watchdog", "--once", "--json", cwd=project.root)
    assert dog.returncode == 0, dog.stderr
    lines = [json.loads(line) for line in dog.stdout.splitlines()]
    actions = [a for a in lines if a["kind"] not in ("reconcile", "tick")]
    assert [(a["agent"], a["kind"]) for a in actions] == [(NAME, "spawn_undone")]
    assert leftovers(project) == NOTHING


def test_a_spawn_in_progress_is_left_alone(project, tmp_path):
    """A live spawner's intent is not undone by anyone; a second `ov sling` of the name is refused."""
    from overstory.agents.spawn_journal import begin, settle_abandoned, settle_all

    conn = open_state(project.state_db)
    holder = subprocess.Popen(["sleep", "60"])
    try:
        from overstory import procs

        begin(conn, {"name": NAME, "pid": holder.pid, "pid_ticks": procs.start_ticks(holder.pid), "branch": None,
                     "base_commit": None, "worktree": None, "run_dir": str(project.run_dir / NAME),
                     "tmux_session": None})
        assert settle_all(project, conn) == {}
        from overstory.errors import SpawnError

        with pytest.raises(SpawnError, match=f"being spawned right now by pid {holder.pid}"):
            settle_abandoned(project, conn, NAME)
        again = sling(project, tmp_path)
        assert again.returncode == 1 and "being spawned right now" in again.stderr
    finally:
        holder.kill()
        holder.wait()
        conn.close()
    assert settle_all(project, open_state(project.state_db)) == {NAME: []}  # its spawner died: undone


# ---- the event store -------------------------------------------------------------------


def _break_events(project, how):
    path = project.events_db
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    if how == "corrupt":
        path.write_bytes(b"this is not a database " * 200)
    elif how == "missing table":
        import sqlite3

        conn = sqlite3.connect(path)
        conn.execute("DROP TABLE events")
        conn.commit()
        conn.close()


@pytest.mark.parametrize("how", ["corrupt", "missing table"])
def test_sling_with_an_unusable_event_store_creates_nothing(project, tmp_path, how):
    saved = project.events_db.read_bytes()
    _break_events(project, how)
    refused = sling(project, tmp_path)
    assert refused.returncode == 1
    assert "events.db" in refused.stderr and "nothing was created" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert leftovers(project) == NOTHING
    if how == "missing table":
        assert run_ov("doctor", "--repair", cwd=project.root).returncode == 0
    else:
        project.events_db.write_bytes(saved)
    assert sling(project, tmp_path).returncode == 0
    assert wait_terminal(project, NAME).state == "completed"


def test_sling_with_a_read_only_event_store_creates_nothing(project, tmp_path):
    """A read-only bind mount of events.db (root ignores permission bits, not mount flags):
    the sling used to succeed and leave a booting agent whose loop died on its first event."""
    from test_hostile_input import read_only

    saved = project.events_db.read_bytes()
    with read_only(project.events_db):
        refused = sling(project, tmp_path)
        assert project.events_db.read_bytes() == saved
    assert refused.returncode == 1, refused.stderr
    assert "events.db" in refused.stderr and "cannot be written" in refused.stderr
    assert "nothing was created" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert leftovers(project) == NOTHING
    assert sling(project, tmp_path).returncode == 0
    assert wait_terminal(project, NAME).state == "completed"


def test_watchdog_settles_a_booting_agent_whose_loop_cannot_start(project, tmp_path):
    from overstory.agents.spawn import SlingRequest
    from overstory.agents.spawn import sling as do_sling
    from overstory.config.model import load_config

    conn = open_state(project.state_db)
    try:
        do_sling(project, load_config(project.config_file), conn,
                 SlingRequest(capability="builder", task_id="t1", runtime="scripted", scenario=scenario(tmp_path)),
                 environ=dict(os.environ), start=False)
        # The spawn happened a while ago (past the watchdog's grace for a loop to appear).
        conn.execute("UPDATE sessions SET created_at = created_at - 60000 WHERE name = ?", (NAME,))
    finally:
        conn.close()
    saved = project.events_db.read_bytes()
    _break_events(project, "corrupt")
    watchdog = subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.3"], cwd=project.root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        agent = wait_terminal(project, NAME, timeout=60)
        assert watchdog.poll() is None, watchdog.stderr.read() if watchdog.stderr else ""
    finally:
        watchdog.send_signal(signal.SIGTERM)
        _, err = watchdog.communicate(timeout=20)
        project.events_db.write_bytes(saved)
    assert watchdog.returncode == 0, err
    assert agent.state == "zombie"
    assert "could not start" in (agent.state_reason or "") and "events.db" in (agent.state_reason or "")
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"
    assert loop_processes(NAME, project.root) == []
    time.sleep(0.5)
    conn = open_state(project.state_db)
    try:
        transitions = [h["to_state"] for h in sessions.history(conn, NAME)]
    finally:
        conn.close()
    assert transitions == ["booting", "zombie"]


# ---- killed inside a step: `git branch` and `git worktree add` -----------------------------------------


def _hold_git(project, tmp_path, where):
    """Make the next `git worktree add` (``where="worktree"``: a smudge filter during its checkout) or the next
    creation of ov/builder-t1 (``"branch"``: the reference-transaction hook, while git holds the ref's lock)
    stop inside git until it is killed. Returns the marker file that appears once git is held there."""
    marker = tmp_path / f"inside-{where}"
    hold = f'if [ ! -e "{marker}" ]; then touch "{marker}"; sleep 120; fi'
    if where == "worktree":
        (project.root / ".gitattributes").write_text("held.txt filter=hold\n")
        (project.root / "held.txt").write_text("held\n")
        run_git(project.root, "add", ".gitattributes", "held.txt")
        run_git(project.root, "commit", "-q", "-m", "a file whose checkout can be held")
        run_git(project.root, "config", "filter.hold.smudge", f"sh -c '{hold}; cat'")
    else:
        hook = project.root / ".git" / "hooks" / "reference-transaction"
        hook.write_text(f'#!/bin/sh\n[ "$1" = prepared ] && grep -q "refs/heads/ov/{NAME}$" && {hold}\nexit 0\n')
        hook.chmod(0o755)
    return marker


def _gits_of(sling_pid):
    """Live git processes started by the `ov sling` whose pid (= process group) is given."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if fields[0] not in "ZX" and int(fields[2]) == sling_pid and argv[0].endswith(b"git"):
            found.append(int(entry))
    return found


def _kill_sling_inside(project, tmp_path, where, *, only_the_sling=False):
    """Run the real `ov sling` in a process group of its own; SIGKILL the group once git is held inside the step
    (for the worktree: once its directory has appeared, as an impatient operator's Ctrl-\\ or an OOM kill would).
    ``only_the_sling``: kill the `ov sling` process alone (as `kill -9 PID` does); the git it runs must die too."""
    marker = _hold_git(project, tmp_path, where)
    sling_args = ["sling", "builder", "t1", "--runtime", "scripted", "--scenario", str(scenario(tmp_path))]
    proc = subprocess.Popen([*ov_command(), *sling_args], cwd=project.root, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        from agent_helpers import wait_for

        wait_for(lambda: marker.exists() and (where != "worktree" or project.worktree(NAME).is_dir())
                 or proc.poll() is not None, timeout=60, interval=0.01, message=f"git to be held inside {where}")
        assert proc.poll() is None, proc.communicate()
        if only_the_sling:
            assert _gits_of(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            from agent_helpers import wait_for

            wait_for(lambda: not _gits_of(proc.pid), timeout=10, message="git to die with its `ov sling`")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # also the hook or filter that held git (not ov's: the test's)
        proc.communicate()
        # No more holding: agents' commits run the hook too (in their sandbox, where the marker is not seen).
        (project.root / ".git" / "hooks" / "reference-transaction").unlink(missing_ok=True)
        run_git(project.root, "config", "--unset-all", "filter.hold.smudge") if where == "worktree" else None
    assert proc.returncode == -signal.SIGKILL
    git_dir = project.root / ".git"
    if where == "worktree":  # git's half-made worktree: its admin folder, still locked while it initialises
        assert (git_dir / "worktrees" / NAME / "locked").is_file()
    else:  # the branch's lock file, left behind
        assert (git_dir / "refs" / "heads" / "ov" / f"{NAME}.lock").is_file()


@pytest.mark.parametrize("where", ["branch", "worktree"])
def test_sling_killed_inside_git_then_retry_works(project, tmp_path, where):
    _kill_sling_inside(project, tmp_path, where)
    retry = sling(project, tmp_path)
    assert retry.returncode == 0, retry.stderr
    assert wait_terminal(project, NAME).state == "completed"
    state = leftovers(project)
    assert state["session_rows"] == 1 and state["intents"] == 0 and state["branch"] == "ov/builder-t1"
    assert sorted(p.name for p in (project.root / ".git" / "worktrees").iterdir()) == [NAME]  # no second admin dir
    assert not (project.root / ".git" / "refs" / "heads" / "ov" / f"{NAME}.lock").exists()
    assert run_git(project.root, "log", "--format=%s", "main..ov/builder-t1").split("\n")[0] == "work"


@pytest.mark.parametrize("settle", ["stop --clean", "watchdog"])
def test_sling_killed_inside_git_branch_is_undone(project, tmp_path, settle):
    _kill_sling_inside(project, tmp_path, "branch", only_the_sling=settle == "watchdog")
    if settle == "watchdog":
        dog = run_ov("watchdog", "--once", "--json", cwd=project.root)
        assert dog.returncode == 0, dog.stderr
        actions = [a for a in map(json.loads, dog.stdout.splitlines()) if a["kind"] not in ("reconcile", "tick")]
        assert [(a["agent"], a["kind"]) for a in actions] == [(NAME, "spawn_undone")]
    else:
        stopped = run_ov("stop", NAME, "--clean", cwd=project.root)
        assert stopped.returncode == 0, stopped.stderr
        assert "undid the unfinished spawn" in stopped.stdout
    assert leftovers(project) == NOTHING
    assert not (project.root / ".git" / "worktrees").exists() or not any((project.root / ".git" / "worktrees").iterdir())
    assert not (project.root / ".git" / "refs" / "heads" / "ov" / f"{NAME}.lock").exists()
    assert sling(project, tmp_path).returncode == 0  # and the name is free again
    assert wait_terminal(project, NAME).state == "completed"


def test_sling_killed_the_moment_its_worktree_appears(project, tmp_path):
    """The kill of the report: the test watches for the worktree directory (a tight poll, no sleep) and SIGKILLs
    the sling's process group the moment it appears, inside `git worktree add` (where git has made its locked
    folder under .git/worktrees/ and may not have finished writing it). Three kills, as the exact moment
    varies, each settled another way: the same `ov sling` again, `ov stop --clean`, the watchdog."""
    for settle in ("retry", "stop --clean", "watchdog"):
        proc = subprocess.Popen([*ov_command(), "sling", "builder", "t1", "--runtime", "scripted", "--scenario",
                                 str(scenario(tmp_path))], cwd=project.root, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not project.worktree(NAME).exists() and proc.poll() is None and time.monotonic() < deadline:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        if settle == "retry":
            retry = sling(project, tmp_path)
            assert retry.returncode == 0, retry.stderr
            assert sorted(p.name for p in (project.root / ".git" / "worktrees").iterdir()) == [NAME]
            assert run_ov("stop", NAME, "--clean", "--force", cwd=project.root).returncode == 0  # for the next kill
        elif settle == "watchdog":
            assert run_ov("watchdog", "--once", cwd=project.root).returncode == 0
        else:
            stopped = run_ov("stop", NAME, "--clean", cwd=project.root)
            assert stopped.returncode == 0, stopped.stderr
        state = leftovers(project)
        assert (state["intents"], state["branch"], state["worktree_registered"], state["worktree_dir"],
                state["loops"]) == (0, "", False, False, []), settle
        admin = project.root / ".git" / "worktrees"
        assert not admin.exists() or not any(admin.iterdir()), settle


@pytest.mark.parametrize("left", ["locked only", "part of gitdir", "gitdir, no HEAD"])
def test_the_undo_removes_the_folder_a_killed_git_left_and_never_anothers(project, tmp_path, left):
    """What `git worktree add` has written when a kill lands in its first microseconds (the order of its writes:
    the locked folder, the worktree directory, gitdir, the worktree's .git file, commondir, HEAD), laid out for
    a spawn whose intent names the folder; beside it the operator's own worktree of the same base name, whose
    folder git named first and which points elsewhere: it must survive, and still work."""
    from overstory import procs
    from overstory.agents.spawn_journal import begin, settle_all, step

    theirs = tmp_path / "operator" / NAME
    run_git(project.root, "worktree", "add", "-q", "-b", "operator-work", str(theirs))
    base = run_git(project.root, "rev-parse", "main").strip()
    run_git(project.root, "branch", f"ov/{NAME}", base)
    folder = project.root / ".git" / "worktrees" / f"{NAME}1"  # the operator's took the plain name
    worktree = project.worktree(NAME)
    dead = subprocess.Popen(["true"])
    dead.wait()
    conn = open_state(project.state_db)
    try:
        intent = {"name": NAME, "pid": dead.pid, "pid_ticks": None, "branch": f"ov/{NAME}", "base_commit": base,
                  "worktree": str(worktree), "run_dir": str(project.run_dir / NAME), "tmux_session": None}
        begin(conn, intent)
        step(conn, intent, "worktree", worktree_admin=folder.name)
        folder.mkdir()
        (folder / "locked").write_text("initializing\n")
        worktree.mkdir(parents=True)
        if left != "locked only":
            gitdir = f"{worktree}/.git\n"
            (folder / "gitdir").write_text(gitdir[:12] if left == "part of gitdir" else gitdir)
        if left == "gitdir, no HEAD":
            (worktree / ".git").write_text(f"gitdir: {folder}\n")
            (folder / "commondir").write_text("../..\n")
        assert procs.is_alive(dead.pid) is False
        undone = settle_all(project, conn)
    finally:
        conn.close()
    assert undone == {NAME: [str(worktree), f"ov/{NAME}"]}
    assert not folder.exists() and not worktree.exists()
    assert sorted(p.name for p in (project.root / ".git" / "worktrees").iterdir()) == [NAME]  # the operator's
    assert run_git(theirs, "status", "--porcelain") == "" and (theirs / "README.md").is_file()
    run_git(project.root, "worktree", "add", "-q", "-b", "again", str(worktree))  # the path is free again
    assert sorted(p.name for p in (project.root / ".git" / "worktrees").iterdir()) == [NAME, folder.name]


def test_a_spawners_git_dies_with_it_even_in_a_process_with_threads(project, tmp_path):
    """An agent's sling runs in its loop, which serves its endpoint from threads (no Python may run between fork
    and exec there): the git it runs must still die when that process is killed alone."""
    marker = _hold_git(project, tmp_path, "branch")
    script = tmp_path / "spawner.py"
    script.write_text(
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from overstory.agents.spawn_journal import run_git\n"
        "threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\n"
        f"run_git(Path(sys.argv[1]), 'branch', 'ov/{NAME}', 'main')\n")
    proc = subprocess.Popen([sys.executable, str(script), str(project.root)], start_new_session=True)
    try:
        from agent_helpers import wait_for

        wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=60, message="git to be held")
        assert proc.poll() is None and _gits_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        wait_for(lambda: not _gits_of(proc.pid), timeout=10, message="git to die with the spawner")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
