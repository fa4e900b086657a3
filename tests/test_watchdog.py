"""The watchdog's rules, with real agent loops, real turn processes and real SQLite files.

Agents run the scripted runtime with their worktree's hooks switched off, so these
tests do not depend on `ov guard` and stay fast. Thresholds are lowered through
config.local.yaml, exactly as an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

import pytest

from conftest import ov_command, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import sessions

# ---- helpers shared by the watchdog, stop, watch and fault-injection tests ----------


def write_local_config(project: ProjectPaths, **sections: dict[str, t.Any]) -> None:
    import yaml

    project.local_config_file.write_text(yaml.safe_dump(sections), encoding="utf-8")


def load(project: ProjectPaths) -> t.Any:
    from overstory.config.model import load_config

    return load_config(project.config_file, project.local_config_file)


def repeat_turns(actions: list[dict[str, t.Any]], count: int = 8, result: str = "done") -> dict[str, t.Any]:
    """A scenario whose every turn plays ``actions``: a retried (resumed) turn does the work again."""
    return {"turns": [{"actions": actions, "result": result} for _ in range(count)]}


REPORT_DONE = {"bash": 'ov mail send --type worker_done --subject "done ${OVERSTORY_TASK_ID}" --body finished'}


def start_agent(project: ProjectPaths, conn: t.Any, task: str, scenario: dict[str, t.Any], *,
                capability: str = "builder", parent: str | None = None, start: bool = True) -> str:
    """`ov sling` in-process (guards on, as for any agent), then start its loop."""
    from overstory.agents.loop import spawn_loop
    from overstory.agents.spawn import SlingRequest, sling

    scenario_file = project.root.parent / f"scenario-{task}.json"
    scenario_file.write_text(json.dumps(scenario), encoding="utf-8")
    result = sling(project, load(project), conn,
                   SlingRequest(capability=capability, task_id=task, runtime="scripted", scenario=scenario_file,
                                parent=parent), start=False)
    if start:
        pid, ticks = spawn_loop(project, result.name, result.generation, dict(os.environ))
        sessions.update_fields(conn, result.name, result.generation, loop_pid=pid, loop_start_ticks=ticks)
    return result.name


def wait_for(predicate: t.Callable[[], t.Any], timeout: float = 20.0, what: str = "condition") -> t.Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def row(conn: t.Any, name: str) -> sessions.Session:
    found = sessions.get(conn, name)
    assert found is not None
    return found


def agent_processes(project: ProjectPaths, name: str) -> list[int]:
    """Live processes that belong to agent ``name`` of this project: its loop and its turns' processes."""
    found = []
    loop_marker = ["--project", str(project.root), "--agent", name]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if not procs.is_alive(pid):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            environ = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        is_loop = "overstory.agents.loop" in argv and _contains(argv, loop_marker)
        is_turn = f"OVERSTORY_AGENT_NAME={name}" in environ and f"OVERSTORY_PROJECT_ROOT={project.root}" in environ
        if is_loop or is_turn:
            found.append(pid)
    return found


def _sleeping_in(pgid: int, command: str) -> bool:
    """Whether a process of group ``pgid`` runs ``command`` (its argv joined by spaces)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2:].split()[2]) == pgid and b" ".join(argv).decode(errors="replace") == command:
            return True
    return False


def _contains(items: list[str], sub: list[str]) -> bool:
    return any(items[i:i + len(sub)] == sub for i in range(len(items) - len(sub) + 1))


def start_decoy(cwd: Path, mimic: list[str]) -> subprocess.Popen[bytes]:
    """A process ov did not start, with a command line and cwd like an agent's, in its own group."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *mimic], cwd=cwd,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_watchdog(project: ProjectPaths, conn: t.Any = None, **overrides: t.Any) -> t.Any:
    from overstory.watchdog.daemon import Watchdog, WatchdogSettings

    settings = WatchdogSettings.from_config(load(project))
    if overrides:
        settings = WatchdogSettings(**{**settings.__dict__, **overrides})
    return Watchdog(project, settings, conn)


def mail_rows(conn: t.Any, **where: t.Any) -> list[dict[str, t.Any]]:
    clauses = " AND ".join(f"{k} = ?" for k in where) or "1"
    return [dict(r) for r in conn.execute(f"SELECT * FROM mail WHERE {clauses} ORDER BY id", tuple(where.values()))]


@pytest.fixture
def fast_project(project: ProjectPaths) -> ProjectPaths:
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "stall_timeout": 120,
                                       "max_retries": 3, "max_concurrent": 8},
                       watchdog={"interval": 0.2, "stale_after": 300, "zombie_after": 900})
    return project


@pytest.fixture
def cleanup_agents(fast_project: ProjectPaths, state_db: t.Any) -> t.Iterator[None]:
    """Whatever a test leaves running is stopped afterwards (by recorded pid and ticks only)."""
    yield
    from overstory.agents.stop import stop_agent

    for agent in sessions.list_sessions(state_db):
        try:
            stop_agent(fast_project, state_db, agent.name, force=True, kill_grace=0.5)
        except Exception:  # noqa: BLE001 - best effort teardown
            pass


# ---- single instance ----------------------------------------------------------------


def test_two_watchdogs_started_together_one_runs_the_other_refuses(fast_project: ProjectPaths) -> None:
    env = {**os.environ}
    first, second = (subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.2"], cwd=fast_project.root,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(2))
    try:
        refused = wait_for(lambda: [p for p in (first, second) if p.poll() is not None], timeout=30,
                           what="one watchdog to refuse")
        assert len(refused) == 1
        loser = refused[0]
        winner = second if loser is first else first
        _, err = loser.communicate()
        assert loser.returncode == 1
        assert f"pid {winner.pid}" in err
        time.sleep(0.5)
        assert winner.poll() is None, "the winner must keep running"
        from overstory.watchdog.daemon import lock_holder

        assert lock_holder(fast_project) == winner.pid
        again = run_ov("watchdog", "--once", cwd=fast_project.root)
        assert again.returncode == 1 and f"pid {winner.pid}" in again.stderr
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)
    assert winner.returncode == 0
    # The lock died with its holder: a new watchdog runs.
    assert run_ov("watchdog", "--once", cwd=fast_project.root).returncode == 0


# ---- re-adopting agents whose loop died ---------------------------------------------


@pytest.mark.parametrize("mode", ["off", "bwrap"])
def test_loop_killed_mid_turn_is_readopted_and_the_agent_completes(fast_project: ProjectPaths, state_db: t.Any,
                                                                    cleanup_agents: None, mode: str) -> None:
    """Without a sandbox the turn outlives its loop and the watchdog kills it; a sandboxed turn
    (--die-with-parent) is gone already. Either way the agent is re-adopted and completes."""
    import yaml

    local = yaml.safe_load(fast_project.local_config_file.read_text())
    fast_project.local_config_file.write_text(yaml.safe_dump({**local, "sandbox": {"mode": mode}}))
    scenario = repeat_turns([{"expect_in_prompt": "Type: dispatch"}, {"bash": "sleep 2"}, REPORT_DONE])
    name = start_agent(fast_project, state_db, "t1", scenario)
    busy = wait_for(lambda: (r := row(state_db, name)).turn_pgid and r.state == "in_turn" and r, what="a turn")
    if mode == "off":  # kill the loop once the turn is inside its `sleep 2`: killed earlier, the turn's next step
        # (its tool call's hook, or a line of output) finds the loop gone and the turn ends with it (fail closed)
        wait_for(lambda: _sleeping_in(busy.turn_pgid, "sleep 2"), what="the turn's sleep")
    os.kill(busy.loop_pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), what="the loop to die")
    if mode == "off":
        assert procs.group_alive(busy.turn_pgid, busy.turn_start_ticks), "the turn outlives its loop"
    else:
        wait_for(lambda: not procs.group_alive(busy.turn_pgid, busy.turn_start_ticks), what="the turn to die too")

    dog = make_watchdog(fast_project, state_db)
    actions = dog.tick()
    assert [(a.agent, a.kind) for a in actions] == [(name, "readopted")]
    assert not procs.group_alive(busy.turn_pgid, busy.turn_start_ticks), "the orphaned turn was killed"
    after = row(state_db, name)
    assert after.retries == 1 and after.failed_turns == 1
    assert after.current_turn_id is None and after.turn_pgid is None
    failed = state_db.execute("SELECT status FROM turns WHERE id = ?", (busy.current_turn_id,)).fetchone()
    assert failed["status"] == "failed"

    wait_for(lambda: row(state_db, name).state == "completed", timeout=30, what="the agent to complete")
    dispatch = mail_rows(state_db, recipient=name, type="dispatch")
    assert len(dispatch) == 1 and dispatch[0]["read_at"] is not None
    assert mail_rows(state_db, type="worker_died") == []
    assert len(mail_rows(state_db, sender=name, type="worker_done")) >= 1
    assert dog.tick() == []


def test_turn_group_killed_mid_tool_call_recovers_without_worker_died(fast_project: ProjectPaths, state_db: t.Any,
                                                                      cleanup_agents: None) -> None:
    scenario = repeat_turns([{"expect_in_prompt": "Type: dispatch"}, {"bash": "sleep 2"}, REPORT_DONE])
    name = start_agent(fast_project, state_db, "t2", scenario)
    busy = wait_for(lambda: (r := row(state_db, name)).state == "in_turn" and r.current_tool == "Bash" and r,
                    what="a tool call")
    assert procs.group_is_ours(busy.turn_pgid, busy.turn_start_ticks)
    os.killpg(busy.turn_pgid, signal.SIGKILL)
    dog = make_watchdog(fast_project, state_db)
    wait_for(lambda: dog.tick() is not None and row(state_db, name).state == "completed", timeout=30,
             what="the agent to recover and complete")
    final = row(state_db, name)
    assert final.turns == 1 and final.failed_turns == 1
    assert mail_rows(state_db, type="worker_died") == []
    assert mail_rows(state_db, recipient=name, type="dispatch")[0]["read_at"] is not None


def test_loop_gone_between_turns_is_restarted_without_counting_a_failure(fast_project: ProjectPaths,
                                                                         state_db: t.Any, cleanup_agents: None) -> None:
    scenario = {"turns": [{"actions": [{"text": "waiting"}], "result": "idle"},
                          {"actions": [{"expect_in_prompt": "second job"}, REPORT_DONE], "result": "done"}]}
    name = start_agent(fast_project, state_db, "t3", scenario)
    idle = wait_for(lambda: (r := row(state_db, name)).state == "between_turns" and r, what="the first turn")
    os.kill(idle.loop_pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(idle.loop_pid, idle.loop_start_ticks), what="the loop to die")
    dog = make_watchdog(fast_project, state_db)
    assert [a.kind for a in dog.tick()] == ["readopted"]
    assert row(state_db, name).retries == 0
    fresh = wait_for(lambda: (r := row(state_db, name)).loop_pid != idle.loop_pid and r, what="the new loop")
    assert procs.is_alive(fresh.loop_pid, fresh.loop_start_ticks)
    assert dog.tick() == [], "a loop the watchdog started is not started twice"
    from overstory.store import mail

    mail.send(state_db, sender="operator", to=name, subject="second job", body="do the second job")
    wait_for(lambda: row(state_db, name).state == "completed", timeout=30, what="the new loop to run the turn")


def test_idle_agent_between_turns_is_never_stale(fast_project: ProjectPaths, state_db: t.Any,
                                                 cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "t4", {"turns": [{"actions": [{"text": "hello"}], "result": "hi"}]})
    wait_for(lambda: row(state_db, name).state == "between_turns", what="the turn to end")
    state_db.execute("UPDATE sessions SET last_activity = last_activity - 3600000 WHERE name = ?", (name,))
    dog = make_watchdog(fast_project, state_db, stale_after=1, zombie_after=2)
    assert dog.tick() == []
    assert row(state_db, name).state == "between_turns"


def test_silent_turn_is_stalled_nudged_then_zombie_with_one_worker_died(fast_project: ProjectPaths,
                                                                        state_db: t.Any, cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "t5", repeat_turns([{"text": "thinking"}, {"bash": "sleep 120"}]))
    busy = wait_for(lambda: (r := row(state_db, name)).current_tool == "Bash" and r, what="the silent tool call")
    dog = make_watchdog(fast_project, state_db, stale_after=0.8, zombie_after=1.6)
    seen: list[str] = []
    wait_for(lambda: seen.extend(a.kind for a in dog.tick()) or row(state_db, name).state == "zombie", timeout=20,
             what="the watchdog to declare the agent zombie")
    assert seen == ["stalled", "zombie"]
    assert not procs.group_alive(busy.turn_pgid, busy.turn_start_ticks)
    wait_for(lambda: agent_processes(fast_project, name) == [], what="every process of the agent to go")
    history = [(h["from_state"], h["to_state"], h["actor"]) for h in sessions.history(state_db, name)]
    assert ("in_turn", "stalled", "watchdog") in history and ("stalled", "zombie", "watchdog") in history
    nudges = mail_rows(state_db, recipient=name, type="nudge")
    assert len(nudges) == 1 and nudges[0]["sender"] == "watchdog"
    died = mail_rows(state_db, recipient="operator", type="worker_died")
    assert len(died) == 1
    payload = json.loads(died[0]["payload"])
    assert payload["agent"] == name and "no activity" in payload["reason"] and payload["last_activity"].endswith("Z")
    for _ in range(3):
        assert dog.tick() == []
    assert len(mail_rows(state_db, type="worker_died")) == 1


def test_activity_after_stall_revives_instead_of_zombie(fast_project: ProjectPaths, state_db: t.Any,
                                                        cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "t6",
                       repeat_turns([{"text": "start"}, {"sleep": 2.5}, {"text": "still here"}, REPORT_DONE]))
    wait_for(lambda: row(state_db, name).state == "in_turn", what="the turn")
    dog = make_watchdog(fast_project, state_db, stale_after=0.5, zombie_after=60)
    wait_for(lambda: dog.tick() and row(state_db, name).state == "stalled", what="the stall")
    wait_for(lambda: row(state_db, name).state == "completed", timeout=30, what="the revived agent to complete")
    assert mail_rows(state_db, type="worker_died") == []


# ---- retries, settling, and what the watchdog must not touch ------------------------------


def _fake_agent(conn: t.Any, name: str, **fields: t.Any) -> sessions.Session:
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=name, runtime="scripted",
                                         actor="test")
    state = fields.pop("state", None)
    if state and state != "booting":
        assert sessions.transition(conn, name, generation, state, actor="test").ok
    sessions.update_fields(conn, name, generation, **fields)
    return row(conn, name)


def _dead_pid() -> tuple[int, int | None]:
    proc = subprocess.Popen(["true"])
    ticks = procs.start_ticks(proc.pid)
    proc.wait()
    return proc.pid, ticks


def test_retries_exhausted_by_dead_loops_make_one_zombie(project: ProjectPaths, state_db: t.Any) -> None:
    from overstory.store import mail

    pid, ticks = _dead_pid()
    agent = _fake_agent(state_db, "gone", state="in_turn", loop_pid=pid, loop_start_ticks=ticks, retries=2,
                        current_turn_id="turn-x")
    mail.insert_message(state_db, sender="operator", recipient="gone", type="dispatch", subject="work")
    mail.claim(state_db, "gone", "turn-x")
    spawned: list[str] = []
    dog = make_watchdog(project, state_db, max_retries=2)
    dog._spawn = lambda *args: spawned.append(args[1]) or (0, None)  # noqa: SLF001 - must not be reached
    actions = dog.tick()
    assert [a.kind for a in actions] == ["zombie"]
    assert spawned == []
    final = row(state_db, "gone")
    assert final.state == "zombie" and final.retries == 3
    inbox = mail_rows(state_db, recipient="gone")
    assert inbox[0]["claimed_by"] is None and inbox[0]["read_at"] is None, "claimed mail is given back"
    assert len(mail_rows(state_db, recipient="operator", type="worker_died")) == 1
    assert dog.tick() == []
    assert agent.generation == final.generation


def test_clean_final_turn_of_a_dead_loop_is_settled_completed(project: ProjectPaths, state_db: t.Any) -> None:
    from overstory.clock import now_ms
    from overstory.store import mail

    pid, ticks = _dead_pid()
    _fake_agent(state_db, "finisher", state="in_turn", loop_pid=pid, loop_start_ticks=ticks)
    mail.insert_message(state_db, sender="operator", recipient="finisher", type="dispatch", subject="work")
    mail.claim(state_db, "finisher", "turn-ok")
    started = now_ms() - 1000
    state_db.execute("INSERT INTO turns(id, agent, generation, number, status, started_at) VALUES "
                     "('turn-ok', 'finisher', 1, 1, 'ok', ?)", (started,))
    mail.insert_message(state_db, sender="finisher", recipient="operator", type="worker_done", subject="done")
    dog = make_watchdog(project, state_db)
    dog._spawn = lambda *args: pytest.fail("a completed agent needs no loop")  # noqa: SLF001
    assert [a.kind for a in dog.tick()] == ["completed"]
    final = row(state_db, "finisher")
    assert final.state == "completed" and final.turns == 1
    assert mail_rows(state_db, recipient="finisher")[0]["read_at"] is not None


def test_recorded_pids_with_other_start_ticks_are_never_touched(project: ProjectPaths, state_db: t.Any) -> None:
    decoy = start_decoy(project.root, ["-m", "overstory.agents.loop", "--project", str(project.root), "--agent",
                                       "imposter", "--generation", "1"])
    try:
        real_ticks = wait_for(lambda: procs.start_ticks(decoy.pid), what="the decoy")
        _fake_agent(state_db, "imposter", state="in_turn", loop_pid=decoy.pid, loop_start_ticks=real_ticks + 7,
                    turn_pgid=decoy.pid, turn_start_ticks=real_ticks + 7, current_turn_id="t")
        spawned: list[tuple[t.Any, ...]] = []
        dog = make_watchdog(project, state_db, kill_grace=0.2)
        dog._spawn = lambda *args: spawned.append(args) or (0, None)  # noqa: SLF001
        assert [a.kind for a in dog.tick()] == ["readopted"], "a pid with other start ticks is not our loop"
        assert spawned and spawned[0][1] == "imposter"
        dog.reconcile()
        from overstory.agents.stop import stop_agent

        stop_agent(project, state_db, "imposter", force=True)
        time.sleep(0.2)
        assert decoy.poll() is None, "the decoy must survive the watchdog, reconcile and stop"
    finally:
        decoy.kill()
        decoy.wait()


def test_reconcile_reports_orphans_and_kills_only_what_it_recorded(project: ProjectPaths, state_db: t.Any) -> None:
    orphan = project.worktrees_dir / "forgotten"
    orphan.mkdir(parents=True)
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    decoy = start_decoy(project.root, ["sleep", "300"])
    try:
        ticks = wait_for(lambda: procs.start_ticks(leftover.pid), what="the leftover")
        _fake_agent(state_db, "finished", state="in_turn", turn_pgid=leftover.pid, turn_start_ticks=ticks,
                    current_turn_id="t-left")
        state_db.execute("UPDATE sessions SET state = 'completed' WHERE name = 'finished'")  # a crashed stop
        state_db.execute("INSERT INTO turns(id, agent, generation, number, status, started_at) VALUES "
                         "('t-left', 'finished', 1, 1, 'running', 0)")
        pid, dead_ticks = _dead_pid()
        _fake_agent(state_db, "active", state="between_turns", loop_pid=pid, loop_start_ticks=dead_ticks,
                    worktree=str(project.worktrees_dir / "active"))
        report = make_watchdog(project, state_db, kill_grace=0.2).reconcile()
        assert report.orphan_worktrees == [str(orphan)]
        assert orphan.is_dir(), "orphans are reported, never deleted"
        assert [k["agent"] for k in report.killed] == ["finished"]
        assert leftover.wait(timeout=5) != 0
        assert decoy.poll() is None
        assert report.closed_turns == 1
        assert [(a["agent"], a["loop"]) for a in report.agents] == [("active", "dead")]
        assert [m["agent"] for m in report.missing_worktrees] == ["active"]
        assert any("orphan worktree" in line for line in report.summary_lines())
    finally:
        for proc in (leftover, decoy):
            proc.kill()
            proc.wait()


def test_a_tick_with_nothing_to_do_reads_only_the_database_and_proc(project: ProjectPaths, state_db: t.Any) -> None:
    alive = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = wait_for(lambda: procs.start_ticks(alive.pid), what="the process")
        for index in range(5):
            _fake_agent(state_db, f"idle{index}", state="between_turns", loop_pid=alive.pid, loop_start_ticks=ticks)
        dog = make_watchdog(project, state_db)
        dog.tick()  # warm up lazy imports
        touched: list[tuple[str, str]] = []
        watching = threading.Event()

        def audit(event: str, args: tuple[t.Any, ...]) -> None:
            if watching.is_set() and threading.current_thread() is threading.main_thread() and event in (
                    "open", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "socket.connect",
                    "sqlite3.connect", "os.listdir", "os.scandir"):
                touched.append((event, str(args[0]) if args else ""))

        sys.addaudithook(audit)
        watching.set()
        try:
            actions = dog.tick()
        finally:
            watching.clear()
        assert actions == []
        assert touched, "the audit hook saw nothing: the test itself is broken"
        assert all(event == "open" and path.startswith("/proc/") for event, path in touched), touched
    finally:
        alive.kill()
        alive.wait()


def test_a_loop_waits_for_the_agent_lock_held_by_a_departing_loop(fast_project: ProjectPaths, state_db: t.Any,
                                                                  cleanup_agents: None) -> None:
    import fcntl

    from overstory.agents.loop import spawn_loop
    from overstory.agents.process import agent_lock_path

    name = start_agent(fast_project, state_db, "t7", repeat_turns([REPORT_DONE]), start=False)
    path = agent_lock_path(fast_project, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        pid, ticks = spawn_loop(fast_project, name, row(state_db, name).generation, dict(os.environ))
        time.sleep(1.5)
        assert procs.is_alive(pid, ticks), "the loop gave up although the holder was about to leave"
        assert row(state_db, name).state == "booting"
        fcntl.flock(held, fcntl.LOCK_UN)
    wait_for(lambda: row(state_db, name).state == "completed", timeout=30, what="the loop to take over")
    assert row(state_db, name).loop_pid == pid
