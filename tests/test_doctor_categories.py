"""`ov doctor --category`, and the checks of what runs: orphan agent processes, a second watchdog, `ov serve`.

Processes here are real (sleeps, real `ov watchdog`s and a real `ov serve`); the database rows that
name them are written through the store, as the loop and `ov sling` write them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import pytest

from conftest import ov_command, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.project.health import CATEGORIES


def doctor(project: ProjectPaths, *categories: str) -> dict[str, t.Any]:
    args = [arg for name in categories for arg in ("--category", name)]
    result = run_ov("doctor", *args, "--json", cwd=project.root)
    assert result.returncode in (0, 1), result.stderr
    document: dict[str, t.Any] = json.loads(result.stdout)
    return document


def named(document: dict[str, t.Any], name: str) -> dict[str, t.Any]:
    return next(check for check in document["checks"] if check["name"] == name)


@pytest.fixture
def sleepers() -> t.Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def sleeper(started: list[subprocess.Popen[bytes]], *argv: str, env: dict[str, str] | None = None
            ) -> subprocess.Popen[bytes]:
    """A live process in a session of its own: ``argv`` after a sleeping Python (they show in its command line)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv], start_new_session=True,
                            env={**os.environ, **(env or {})})
    started.append(proc)
    return proc


# ---- --category --------------------------------------------------------------------------------


def test_category_runs_only_those_checks_and_json_names_each_category(project: ProjectPaths) -> None:
    only = doctor(project, "install")
    assert [c["name"] for c in only["checks"]] == ["python", "git", "tmux"]
    assert {c["category"] for c in only["checks"]} == {"install"}

    several = run_ov("doctor", "--category", "serve,executor", "--category", "install", "--json", cwd=project.root)
    assert {c["category"] for c in json.loads(several.stdout)["checks"]} == {"serve", "executor", "install"}

    everything = doctor(project)
    assert {c["category"] for c in everything["checks"]} == set(CATEGORIES)

    text = run_ov("doctor", "--category", "processes", cwd=project.root)
    assert text.returncode == 0 and text.stdout.splitlines()[0] == "processes:"
    assert "[ok  ] orphan processes:" in text.stdout and "claude" not in text.stdout


def test_an_unknown_category_is_a_one_line_error_naming_the_known_ones(project: ProjectPaths) -> None:
    result = run_ov("doctor", "--category", "serve,sevre", cwd=project.root)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "'sevre'" in line and all(name in line for name in CATEGORIES)


def test_help_lists_every_category(project: ProjectPaths) -> None:
    result = run_ov("doctor", "--help", cwd=project.root)
    assert result.returncode == 0
    for name, what in CATEGORIES.items():
        assert f"{name}  " in result.stdout and what.split()[0] in result.stdout


# ---- orphan agent processes ----------------------------------------------------------------------


def test_orphans_are_the_recorded_processes_of_ended_or_replaced_agents(
        project: ProjectPaths, state_db: t.Any, sleepers: list[subprocess.Popen[bytes]]) -> None:
    from overstory.agents.process import agent_lock_path
    from overstory.store import sessions, turns

    assert named(doctor(project, "processes"), "orphan processes")["status"] == "ok"

    # 1. A completed agent whose recorded loop still runs.
    gen = sessions.create_session(state_db, name="done-a", capability="builder", task_id="t", runtime="scripted",
                                  actor="test")
    loop = sleeper(sleepers)
    time.sleep(0.1)  # let it exec, so its start time is the one it keeps
    sessions.update_fields(state_db, "done-a", gen, loop_pid=loop.pid, loop_start_ticks=procs.start_ticks(loop.pid))
    assert sessions.transition(state_db, "done-a", gen, "completed", actor="test").ok

    # 2. A re-slung agent: generation 1's turn still has a process (found by the turn id ov put in its environment),
    #    and generation 1's loop still holds the agent's lock.
    first = sessions.create_session(state_db, name="again-b", capability="builder", task_id="t", runtime="scripted",
                                    actor="test")
    turns.start(state_db, "turn-old-b", agent="again-b", generation=first, number=1, attempt=0, resumed=False,
                started_ms=0, log_dir="")
    state_db.commit()
    assert sessions.transition(state_db, "again-b", first, "completed", actor="test").ok
    second = sessions.create_session(state_db, name="again-b", capability="builder", task_id="t",
                                     runtime="scripted", actor="test")
    straggler = sleeper(sleepers, env={procs.TURN_TAG: "turn-old-b"})
    old_loop = sleeper(sleepers, "--project", str(project.root), "--agent", "again-b", "--generation", str(first))
    agent_lock_path(project, "again-b").parent.mkdir(parents=True, exist_ok=True)
    agent_lock_path(project, "again-b").write_text(str(old_loop.pid))

    # 3. Not ov's: a live pid in a lock file whose command line names nothing of this agent is never reported.
    sessions.create_session(state_db, name="live-c", capability="builder", task_id="t", runtime="scripted",
                            actor="test")
    stranger = sleeper(sleepers, "--agent", "someone-else")
    agent_lock_path(project, "live-c").write_text(str(stranger.pid))

    # 4. A loop `ov sling` started early (agents.warm_loop.WarmLoop): its command line has no generation; it wrote
    #    the one it serves after its pid in the lock file.
    warm_first = sessions.create_session(state_db, name="warm-d", capability="builder", task_id="t",
                                         runtime="scripted", actor="test")
    assert sessions.transition(state_db, "warm-d", warm_first, "completed", actor="test").ok
    sessions.create_session(state_db, name="warm-d", capability="builder", task_id="t", runtime="scripted",
                            actor="test")
    warm_loop = sleeper(sleepers, "--project", str(project.root), "--agent", "warm-d", "--go-fd", "7")
    agent_lock_path(project, "warm-d").write_text(f"{warm_loop.pid} {warm_first}")

    time.sleep(0.1)
    check = named(doctor(project, "processes"), "orphan processes")
    assert check["status"] == "warn" and check["category"] == "processes" and check["hint"]
    detail = check["detail"]
    assert f"done-a is completed, but its loop (pid {loop.pid}) still runs" in detail
    assert f"turn turn-old-b of generation {first} still has process(es) {straggler.pid}" in detail
    assert f"at generation {second} now" in detail
    assert f"a process of generation {first} (pid {old_loop.pid}) still runs" in detail
    assert str(stranger.pid) not in detail and "live-c" not in detail
    assert f"warm-d: a process of generation {warm_first} (pid {warm_loop.pid}) still runs" in detail
    assert detail.startswith("4 leftover(s)")

    for proc in (loop, straggler, old_loop, warm_loop):
        proc.kill()
        proc.wait()
    assert named(doctor(project, "processes"), "orphan processes")["status"] == "ok"


# ---- a second watchdog ---------------------------------------------------------------------------


def _start_watchdog(project: ProjectPaths, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*ov_command(), "watchdog", "--interval", "30"], cwd=project.root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    started.append(proc)
    record = project.locks_dir / f"watchdog.{proc.pid}.json"
    deadline = time.monotonic() + 30
    while not record.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the watchdog did not start"
        time.sleep(0.05)
    return proc


def test_a_second_watchdog_behind_a_deleted_lock_file_fails_the_check(
        project: ProjectPaths, sleepers: list[subprocess.Popen[bytes]]) -> None:
    first = _start_watchdog(project, sleepers)
    check = named(doctor(project, "processes"), "watchdog")
    assert check["status"] == "ok" and f"one watchdog: pid {first.pid} (holds the lock)" in check["detail"]

    (project.locks_dir / "watchdog.lock").unlink()  # the one way past the flock: a new file to lock
    second = _start_watchdog(project, sleepers)
    result = run_ov("doctor", "--category", "processes", "--json", cwd=project.root)
    assert result.returncode == 1
    check = named(json.loads(result.stdout), "watchdog")
    assert check["status"] == "fail" and check["detail"].startswith("2 watchdogs are running")
    assert f"pid {second.pid} (holds the lock)" in check["detail"]
    assert f"pid {first.pid} (holds a lock file that has since been deleted or replaced)" in check["detail"]

    first.send_signal(signal.SIGTERM)
    first.wait(timeout=20)
    assert not (project.locks_dir / f"watchdog.{first.pid}.json").exists(), "a watchdog removes its record"
    assert named(doctor(project, "processes"), "watchdog")["status"] == "ok"


# ---- ov serve ------------------------------------------------------------------------------------


def test_serve_is_reported_running_and_answering(project: ProjectPaths,
                                                  sleepers: list[subprocess.Popen[bytes]]) -> None:
    pytest.importorskip("uvicorn")
    assert "no `ov serve` is running" in named(doctor(project, "serve"), "ov serve")["detail"]

    server = subprocess.Popen([*ov_command(), "serve", "--port", "0"], cwd=project.root, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    sleepers.append(server)
    record = project.run_dir / "serve.json"
    deadline = time.monotonic() + 30
    while not record.exists():
        assert server.poll() is None and time.monotonic() < deadline, "ov serve did not start"
        time.sleep(0.05)
    base = json.loads(record.read_text())["base"]
    check = named(doctor(project, "serve"), "ov serve")
    assert check["status"] == "ok" and check["category"] == "serve"
    assert f"(pid {server.pid}) answers at {base}" in check["detail"]

    server.send_signal(signal.SIGSTOP)  # running, but not answering
    try:
        result = run_ov("doctor", "--category", "serve", "--json", cwd=project.root)
    finally:
        server.send_signal(signal.SIGCONT)
    check = named(json.loads(result.stdout), "ov serve")
    assert result.returncode == 1 and check["status"] == "fail" and "does not answer" in check["detail"]

    server.send_signal(signal.SIGTERM)
    server.wait(timeout=20)
    assert "no `ov serve` is running" in named(doctor(project, "serve"), "ov serve")["detail"]


def test_a_serve_record_of_a_dead_server_is_a_warning(project: ProjectPaths) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = project.run_dir / "serve.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"base": "http://127.0.0.1:9", "pid": gone.pid, "ticks": 1}))
    check = named(doctor(project, "serve"), "ov serve")
    assert check["status"] == "warn" and "no longer running" in check["detail"]


def test_doctor_outside_a_project_with_categories(tmp_path: Path) -> None:
    result = run_ov("doctor", "--category", "processes", "--json", cwd=tmp_path)
    document = json.loads(result.stdout)
    assert [(c["category"], c["name"], c["status"]) for c in document["checks"]] == [("project", "project", "warn")]


def test_executor_category_checks_the_ray_address_accepts_connections(project: ProjectPaths) -> None:
    assert named(doctor(project, "executor"), "executor")["status"] == "ok"
    import socket

    with socket.socket() as free:  # a loopback port nobody listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with project.config_file.open("a", encoding="utf-8") as config:
        config.write(f"\nexecutor:\n  kind: ray\n  ray:\n    address: 127.0.0.1:{port}\n")
    result = run_ov("doctor", "--category", "executor", "--json", cwd=project.root)
    checks = json.loads(result.stdout)["checks"]
    assert result.returncode == 1 and [(c["category"], c["status"]) for c in checks] == [("executor", "fail")], checks
    assert checks[0]["name"] in ("cluster", "ray"), checks  # unreachable, or no ray package: project/doctor_cluster.py
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in checks[0]["detail"] or "not installed" in checks[0]["detail"]


def test_doctor_reports_each_runtimes_measured_start_up_cost(project: ProjectPaths) -> None:
    """Measured figures from the package's table (bench figure 13), labelled as such, in --json and one line each."""
    import yaml

    from overstory.runtimes import RUNTIME_NAMES
    from overstory.runtimes.start_costs import MEASURED_ON, start_cost

    # Every CLI missing: the probes answer at once, and the figures do not depend on an install.
    project.local_config_file.write_text(yaml.safe_dump(
        {"runtime": {f"{name}_bin": f"/nonexistent/{name}" for name in RUNTIME_NAMES if name != "scripted"}}))
    document = doctor(project, "runtimes")
    for name in RUNTIME_NAMES:
        cost = named(document, name)["start_cost"]
        assert cost == start_cost(name) and cost["measured"] is True and cost["live"] is False, name
        assert cost["idle_turn_cpu_s"] > 0 and cost["idle_turn_wall_s"] > 0 and cost["measured_on"] == MEASURED_ON
    text = run_ov("doctor", "--category", "runtimes", cwd=project.root).stdout.splitlines()
    for name in RUNTIME_NAMES:
        at = next(i for i, line in enumerate(text) if line.startswith("[") and f"] {name}: " in line)
        after = [line for line in text[at + 1:at + 3] if "start-up:" in line]
        assert after == [f"       start-up: {start_cost(name)['idle_turn_cpu_s']:g} s CPU, "  # type: ignore[index]
                         f"{start_cost(name)['idle_turn_wall_s']:g} s wall per idle turn (measured {MEASURED_ON} "  # type: ignore[index]
                         "on 2 shared cores, not live)"], (name, text)
