"""`ov coordinator start --watchdog --attach` and `ov watchdog --background`, through the real CLI.

Real `ov` processes, a real detached watchdog daemon, the scripted runtime, and a real pseudo-terminal
for --attach (which follows the coordinator's events only on a terminal).
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state, wait_for
from conftest import ov_command, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.watchdog.lock import running_watchdogs
from test_coordinator import scenario, team  # noqa: F401 - the fixture

WATCHDOG_ARGS = ("--interval", "0.5")


@pytest.fixture
def daemons(project: ProjectPaths) -> t.Iterator[None]:
    """At teardown, stop every watchdog this test's project still has (believed only through ov's record of it
    and the project's lock: ``running_watchdogs``), whether or not the test got as far as reading its pid."""
    yield
    for pid in running_watchdogs(project):
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not procs.is_alive(pid), 10, message=f"watchdog {pid} to stop")  # noqa: B023


def _pid(text: str) -> int:
    return int(text.split("pid ")[1].split(";")[0].split(" ")[0])


def test_attach_without_a_terminal_is_refused_before_anything_starts(team: ProjectPaths) -> None:  # noqa: F811
    refused = run_ov("coordinator", "start", "--watchdog", "--attach", cwd=team.root)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "ov: error: --attach needs a terminal (stdout is not one); follow it with `ov logs coordinator --follow`"]
    assert agent_state(team, "coordinator") is None and running_watchdogs(team) == {}
    with_json = run_ov("coordinator", "start", "--attach", "--json", cwd=team.root)
    assert with_json.returncode == 2 and with_json.stdout == ""
    assert json.loads(with_json.stderr)["error"]["message"] == \
        "--attach follows the coordinator on a terminal; it does not go with --json"
    assert agent_state(team, "coordinator") is None


def test_watchdog_starts_one_daemon_and_never_a_second(team: ProjectPaths, tmp_path: Path,  # noqa: F811
                                                       daemons: None) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": [{"actions": [{"text": "ready"}], "result": "ready"}]})
    first = run_ov("coordinator", "start", "--scenario", str(path), "--watchdog", cwd=team.root)
    assert first.returncode == 0, first.stderr
    line = next(line for line in first.stdout.splitlines() if "the watchdog" in line)
    assert line.startswith("  started the watchdog: pid "), first.stdout
    pid = _pid(line)
    assert running_watchdogs(team) == {pid: "holds the lock"}
    assert os.getsid(pid) == pid  # detached: its own session, it outlives the terminal
    assert run_ov("coordinator", "stop", cwd=team.root).returncode == 0

    again = run_ov("coordinator", "start", "--scenario", str(path), "--watchdog", "--json", cwd=team.root)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["watchdog"] == {"pid": pid, "started": False,
                                                    "log": str(team.run_dir / "watchdog.log")}
    alone = run_ov("watchdog", "--background", cwd=team.root)
    assert alone.stdout.strip() == f"a watchdog runs already for this project: pid {pid}; started none"
    doctor = run_ov("doctor", "--category", "processes", "--json", cwd=team.root)
    check = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "watchdog")
    assert check["status"] == "ok" and check["detail"] == f"one watchdog: pid {pid} (holds the lock)"


def test_a_starter_killed_after_starting_the_daemon_leaves_it_running_and_found(project: ProjectPaths,
                                                                                daemons: None) -> None:
    killed = run_ov("watchdog", "--background", *WATCHDOG_ARGS, cwd=project.root,
                    env={"OV_TEST_DIE_AT": "watchdog_started"})
    assert killed.returncode == 137 and killed.stdout == ""
    found = wait_for(lambda: running_watchdogs(project), 20, message="the orphaned daemon to take the lock")
    assert len(found) == 1
    again = run_ov("watchdog", "--background", "--json", cwd=project.root)
    assert json.loads(again.stdout) == {"pid": next(iter(found)), "started": False,
                                        "log": str(project.run_dir / "watchdog.log")}
    assert running_watchdogs(project).keys() == found.keys()


def test_attach_on_a_terminal_follows_the_coordinator_until_ctrl_c(team: ProjectPaths,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    turns = [{"actions": [{"text": "ready"}], "result": "ready"},
             {"actions": [{"text": "objective seen 7f3"}], "result": "ok"}]
    path = scenario(tmp_path / "s.json", {"coordinator": turns})
    main, terminal = pty.openpty()
    proc = subprocess.Popen([*ov_command(), "coordinator", "start", "--scenario", str(path), "--attach"],
                            cwd=team.root, stdin=terminal, stdout=terminal, stderr=terminal, env=dict(os.environ))
    os.close(terminal)
    seen = bytearray()

    def screen_has(text: str) -> bool:
        while select.select([main], [], [], 0.1)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen.extend(chunk)
        return text in seen.decode(errors="replace")

    try:
        wait_for(lambda: screen_has("assistant_text ready"), 60, message=f"the first turn on screen: {bytes(seen)!r}")
        assert "started coordinator" in seen.decode() and "Ctrl-C stops following" in seen.decode()
        assert run_ov("coordinator", "send", "do the thing", cwd=team.root).returncode == 0
        wait_for(lambda: screen_has("assistant_text objective seen 7f3"), 60,
                 message=f"the second turn, followed: {bytes(seen)!r}")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    coordinator = agent_state(team, "coordinator")
    assert coordinator is not None and coordinator.state == "between_turns"
    assert procs.is_alive(coordinator.loop_pid)  # Ctrl-C stopped the following only
