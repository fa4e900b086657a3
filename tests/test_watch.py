"""`ov watch` frames, its in-process watchdog, and the event readers `ov logs` / `ov feed`."""

from __future__ import annotations

import json
import os
import subprocess
import time
import typing as t

from click.testing import CliRunner

from conftest import ov_command, run_ov
from overstory.paths import ProjectPaths
from overstory.store import events as event_store
from overstory.store import mail, sessions


def _cli(project: ProjectPaths, *args: str) -> t.Any:
    from overstory.cli.main import cli

    return CliRunner().invoke(cli, ["--project", str(project.root), *args], catch_exceptions=False)


def _agent(conn: t.Any, name: str, state: str, cost: float, **fields: t.Any) -> None:
    generation = sessions.create_session(conn, name=name, capability=fields.pop("capability", "builder"),
                                         task_id=f"task-{name}", runtime="scripted", actor="test")
    if state == "zombie":
        from overstory.store.lifecycle import declare_zombie

        found = sessions.get(conn, name)
        assert found is not None and declare_zombie(conn, found, "silent", actor="test").ok
    elif state != "booting":
        assert sessions.transition(conn, name, generation, state, actor="test").ok
    sessions.update_fields(conn, name, generation, cost_usd=cost, **fields)


def _line_with(output: str, name: str) -> str:
    lines = [line for line in output.splitlines() if line.split() and line.split()[0] == name]
    assert len(lines) == 1, (name, output)
    return lines[0]


def test_once_at_fixed_width_shows_names_states_and_costs(project: ProjectPaths, state_db: t.Any,
                                                          events_db: t.Any) -> None:
    _agent(state_db, "builder-alpha", "in_turn", 0.1234, current_tool="Bash", turns=2)
    _agent(state_db, "scout-beta", "between_turns", 1.5, capability="scout")
    _agent(state_db, "builder-gamma", "zombie", 0.02)
    mail.send(state_db, sender="operator", to="builder-alpha", subject="please also update docs")
    event_store.record(events_db, "tool_start", agent="builder-alpha", tool="Bash", summary="pytest -q")
    result = _cli(project, "watch", "--once", "--width", "120")
    assert result.exit_code == 0
    out = result.output
    assert max(len(line) for line in out.splitlines()) <= 120
    alpha = _line_with(out, "builder-alpha")
    assert "in_turn" in alpha and "$0.1234" in alpha and "Bash" in alpha and "builder" in alpha
    assert "between_turns" in _line_with(out, "scout-beta") and "$1.5000" in _line_with(out, "scout-beta")
    assert "zombie" in _line_with(out, "builder-gamma")
    assert "cost $1.6434" in out
    assert "please also update docs" in out
    assert "pytest -q" in out
    assert "worker_died" in out, "the zombie's worker_died shows in the mail feed"


def test_narrow_terminal_keeps_names_states_and_costs(project: ProjectPaths, state_db: t.Any) -> None:
    _agent(state_db, "builder-alpha", "in_turn", 0.25, current_tool="Bash")
    out = _cli(project, "watch", "--once", "--width", "40").output
    assert max(len(line) for line in out.splitlines()) <= 40
    line = _line_with(out, "builder-alpha")
    assert "in_turn" in line and "$0.2500" in line
    assert "Bash" not in line, "the tool column is the first to go"


def test_two_hundred_agents_and_a_hundred_thousand_events(project: ProjectPaths, state_db: t.Any,
                                                          events_db: t.Any) -> None:
    states = ["in_turn", "between_turns", "stalled", "zombie", "completed"]
    for index in range(200):
        _agent(state_db, f"agent-{index:03d}", states[index % len(states)], index / 1000)
    events_db.execute("BEGIN")
    events_db.executemany(
        "INSERT INTO events(at, agent, kind, tool, summary) VALUES (?, ?, ?, ?, ?)",
        ((1_700_000_000_000 + i, f"agent-{i % 200:03d}", "tool_start" if i % 50 else "turn_failed", "Bash",
          f"event number {i}") for i in range(100_000)))
    events_db.execute("COMMIT")
    out = _cli(project, "watch", "--once", "--width", "160").output
    for index in range(200):
        assert f"agent-{index:03d}" in out
    assert "event number 99999" in out, "the newest events are shown"
    assert "event number 99950" in out, "the newest problem is shown"


def test_watch_runs_the_watchdog_only_when_the_lock_is_free(project: ProjectPaths) -> None:
    from overstory.cli.watch import _WatchdogThread
    from overstory.watchdog.daemon import WatchdogLock, lock_holder

    holder = WatchdogLock(project)
    holder.acquire()
    try:
        displaying = _WatchdogThread(project)
        displaying.start()
        assert displaying.thread is None
        assert displaying.note == f"watchdog run by pid {os.getpid()}"
    finally:
        holder.release()
    running = _WatchdogThread(project)
    running.start()
    try:
        assert running.thread is not None and running.thread.is_alive()
        assert lock_holder(project) == os.getpid()
        second = WatchdogLock(project)
        try:
            second.acquire()
            raise AssertionError("the dashboard's watchdog must hold the lock")
        except Exception as exc:  # noqa: BLE001
            assert "already running" in str(exc)
    finally:
        running.stop()
    assert not running.thread.is_alive()
    WatchdogLock(project).acquire()  # released on stop


def test_live_dashboard_holds_the_watchdog_lock_until_interrupted(project: ProjectPaths) -> None:
    import signal

    from overstory.watchdog.daemon import WatchdogLock, lock_holder

    def launch(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*ov_command(), "watch", "--interval", "0.2", "--width", "100", *extra],
                                cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    watcher = launch()
    try:
        deadline = time.monotonic() + 20
        while lock_holder(project) != watcher.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock_holder(project) == watcher.pid
        viewer = launch("--no-watchdog")
        assert viewer.stdout is not None
        # Piped, it prints a plain frame at once: once it has, it is running, not starting up.
        first, second = viewer.stdout.readline(), viewer.stdout.readline()
        assert first.startswith("ov watch"), first
        assert "watchdog off" in second
        # And plain frames go on coming, one per interval, with no terminal control in them.
        frame = [first, second]
        while not (line := viewer.stdout.readline()).startswith("ov watch"):
            assert line, "the piped dashboard stopped printing"
            frame.append(line)
        assert "\x1b" not in "".join(frame) + line and "NAME" in "".join(frame), frame
        viewer.send_signal(signal.SIGINT)
        assert viewer.wait(timeout=10) == 0
        assert lock_holder(project) == watcher.pid, "--no-watchdog never takes the lock"
    finally:
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert "watchdog here" in out
    WatchdogLock(project).acquire()  # the lock went with the dashboard


# ---- ov logs / ov feed -------------------------------------------------------------


def test_logs_and_feed(project: ProjectPaths, state_db: t.Any, events_db: t.Any) -> None:
    _agent(state_db, "builder-a", "in_turn", 0)
    for index in range(5):
        event_store.record(events_db, "tool_start", agent="builder-a", tool="Bash", summary=f"step {index}")
    event_store.record(events_db, "turn_end", agent="scout-b", summary="ok: done")
    logs = _cli(project, "logs", "builder-a", "-n", "3")
    assert logs.exit_code == 0
    assert [line.split()[-1] for line in logs.output.splitlines()] == ["2", "3", "4"]
    as_json = [json.loads(line) for line in _cli(project, "logs", "builder-a", "--json").output.splitlines()]
    assert [e["summary"] for e in as_json] == [f"step {i}" for i in range(5)]
    assert all(e["at"].endswith("Z") for e in as_json)
    feed = _cli(project, "feed").output.splitlines()
    assert len(feed) == 6 and "scout-b turn_end ok: done" in feed[-1]
    assert len(_cli(project, "feed", "--agent", "scout-b").output.splitlines()) == 1
    assert len(_cli(project, "feed", "--kind", "turn_end").output.splitlines()) == 1
    unknown = run_ov("logs", "nobody", cwd=project.root)
    assert unknown.returncode == 1 and "no agent named 'nobody'" in unknown.stderr


def test_feed_follow_prints_new_events(project: ProjectPaths, events_db: t.Any) -> None:
    event_store.record(events_db, "spawn", agent="old", summary="before")
    follower = subprocess.Popen([*ov_command(), "feed", "--follow", "--json"], cwd=project.root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())
        assert first["summary"] == "before"
        time.sleep(0.3)
        event_store.record(events_db, "spawn", agent="new", summary="after")
        second = json.loads(follower.stdout.readline())
        assert (second["agent"], second["summary"]) == ("new", "after")
    finally:
        follower.terminate()
        follower.wait(timeout=10)


def test_at_80_columns_names_are_kept_whole(project: ProjectPaths, state_db: t.Any) -> None:
    """builder-green and builder-greet must not both read `builder-gr…`: other columns give way first."""
    for name in ("builder-green", "builder-greet", "reviewer-builder-greet-2"):
        _agent(state_db, name, "parked", 0.5, state_reason="budget: max_usd 0.5 reached by a long tool call")
    for width in ("80", "60", "50"):
        out = _cli(project, "watch", "--once", "--width", width).output
        assert max(len(line) for line in out.splitlines()) <= int(width)
        for name in ("builder-green", "builder-greet", "reviewer-builder-greet-2"):
            assert "parked" in _line_with(out, name), (width, out)
    status = _cli(project, "status").output
    for name in ("builder-green", "builder-greet", "reviewer-builder-greet-2"):
        assert _line_with(status, name)
    from rich.console import Console

    from overstory.ui.dashboard import agents_table
    from overstory.views.status import dashboard_snapshot

    snapshot = dashboard_snapshot(state_db, None)
    console = Console(width=80, record=True, force_terminal=False)
    console.print(agents_table(snapshot["agents"], 80, marker=True, selected="builder-green"))  # the TUI's table
    screen = console.export_text()
    assert [line.split()[:3] for line in screen.splitlines() if line.startswith(">")] == [
        [">", "builder-green", "parked"]], screen
    for name in ("builder-greet", "reviewer-builder-greet-2"):
        assert _line_with(screen, name)
