"""`ov serve` as a real process: the SSE stream, many clients, restarts around it, and Ctrl-C.

The server is started as `ov serve --port 0` (any free loopback port) exactly as a
person would; agents are real scripted agents with real loops and turn processes.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import typing as t

import pytest

from conftest import ov_command, run_ov
from overstory.paths import ProjectPaths
from overstory.store import events as event_store
from overstory.store.db import open_events
from serve_helpers import Served, SSEReader, child_pids, cpu_seconds, start_server
from test_watchdog import (
    REPORT_DONE,
    cleanup_agents,  # noqa: F401 - fixture
    fast_project,  # noqa: F401 - fixture
    repeat_turns,
    row,
    start_agent,
    wait_for,
)


@pytest.fixture
def served(fast_project: ProjectPaths) -> t.Iterator[Served]:
    server = start_server(fast_project, "--heartbeat", "0.3")
    yield server
    server.stop()


def db_ids(project: ProjectPaths, after: int = 0) -> list[int]:
    conn = sqlite3.connect(project.events_db)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM events WHERE id > ? ORDER BY id", (after,))]
    finally:
        conn.close()


def write_events(project: ProjectPaths, count: int, *, agent: str = "writer", pause: float = 0.0) -> list[int]:
    """Events written the way agents write them (the event store's own function, its own connection)."""
    conn = open_events(project.events_db)
    try:
        ids = []
        for index in range(count):
            ids.append(event_store.record(conn, "assistant_text", agent=agent, summary=f"{agent} line {index}",
                                          data={"text": f"{agent} line {index}"}))
            if pause:
                time.sleep(pause)
        return ids
    finally:
        conn.close()


def test_a_client_that_reconnects_with_last_event_id_gets_the_rest_exactly_once(served: Served,
                                                                                 fast_project: ProjectPaths) -> None:
    first = write_events(fast_project, 10)
    reader = SSEReader(served, params={"since": first[0] - 1}, stop_after=first[4])
    reader.wait_for(lambda r: r.ended.is_set(), what="the first client to stop after event 5")
    assert reader.ids == first[:5]
    last_seen = reader.ids[-1]
    # While it is away, more happens; and more still while it reconnects (a writer running throughout).
    write_events(fast_project, 15)
    writer = threading.Thread(target=write_events, args=(fast_project, 40), kwargs={"agent": "late", "pause": 0.01})
    writer.start()
    again = SSEReader(served, last_event_id=last_seen, params={"since": 1})  # the header wins over ?since
    writer.join()
    expected = db_ids(fast_project, after=last_seen)
    again.wait_for(lambda r: len(r.ids) >= len(expected), what="every event after the reconnect")
    time.sleep(0.5)  # would anything arrive twice?
    again.close()
    assert again.ids == expected, "N+1.. exactly once, in order"
    assert again.events[0].data["id"] == last_seen + 1 and again.events[0].data["kind"] == "assistant_text"


def test_a_new_client_gets_only_new_events_and_heartbeats(served: Served, fast_project: ProjectPaths) -> None:
    write_events(fast_project, 5)
    reader = SSEReader(served)
    reader.connected.wait(10)
    reader.wait_for(lambda r: r.comments.count(": keep-alive") >= 2, timeout=20, what="two heartbeats")
    assert reader.events == [] and reader.status == 200
    fresh = write_events(fast_project, 3)
    reader.wait_for(lambda r: r.ids == fresh, what="the new events")
    reader.close()


def test_filters_and_bad_cursors(served: Served, fast_project: ProjectPaths) -> None:
    start = db_ids(fast_project)[-1] if db_ids(fast_project) else 0
    mine = SSEReader(served, params={"since": start, "agent": "alpha", "kind": ["assistant_text", "tool_end"]})
    write_events(fast_project, 3, agent="beta")
    wanted = write_events(fast_project, 3, agent="alpha")
    mine.wait_for(lambda r: r.ids == wanted, what="only alpha's events")
    mine.close()
    assert served.get("/events/stream", headers={"Last-Event-ID": "ten"}).status_code == 400
    assert served.get("/events/stream", params={"since": "-3"}).status_code == 400


def test_twenty_clients_keep_up_while_ten_agents_run(served: Served, fast_project: ProjectPaths,
                                                    state_db: sqlite3.Connection, cleanup_agents: None) -> None:
    """Every client receives every event the ten agents emit, exactly once and in order."""
    start = (db_ids(fast_project) or [0])[-1]
    readers = [SSEReader(served, params={"since": start}) for _ in range(20)]
    for reader in readers:
        reader.connected.wait(10)
    cpu_before = cpu_seconds(served.proc.pid)
    chatter = [{"text": f"step {i}: thinking out loud about the task"} for i in range(15)]
    scenario = repeat_turns([*chatter, {"bash": "echo working"}, REPORT_DONE], count=1)
    names = [start_agent(fast_project, state_db, f"c{i}", scenario) for i in range(10)]
    for name in names:
        wait_for(lambda name=name: row(state_db, name).is_terminal, timeout=180, what=f"{name} to finish")
    expected = db_ids(fast_project, after=start)
    assert len(expected) >= 10 * 20, "the agents produced the events this test is about"
    for reader in readers:
        reader.wait_for(lambda r: len(r.ids) >= len(expected), timeout=60, what="a client to catch up")
    time.sleep(0.5)
    cpu = cpu_seconds(served.proc.pid) - cpu_before
    for reader in readers:
        reader.close()
        assert reader.ids == expected
    print(f"\n20 clients x {len(expected)} events: server CPU {cpu:.2f}s")


def test_the_server_survives_the_watchdog_and_agents_restarting(served: Served, fast_project: ProjectPaths,
                                                                 state_db: sqlite3.Connection,
                                                                 cleanup_agents: None) -> None:
    reader = SSEReader(served, params={"since": (db_ids(fast_project) or [0])[-1]})
    scenario = repeat_turns([{"expect_in_prompt": "Type: dispatch"}, {"bash": "sleep 1"}, REPORT_DONE])
    name = start_agent(fast_project, state_db, "r1", scenario)
    busy = wait_for(lambda: (r := row(state_db, name)).turn_pgid and r.state == "in_turn" and r, what="a turn")
    watchdog = subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.2"], cwd=fast_project.root)
    try:
        os.kill(busy.loop_pid, signal.SIGKILL)  # the loop dies mid-turn; the watchdog re-adopts the agent
        wait_for(lambda: row(state_db, name).state == "completed", timeout=90, what="the re-adopted agent to finish")
        # The same name again: a new generation, while the server and its clients keep going.
        assert run_ov("stop", name, "--clean", "--force", cwd=fast_project.root).returncode == 0
        second = start_agent(fast_project, state_db, "r1", repeat_turns([{"text": "second life"}, REPORT_DONE]))
        assert second == name
        wait_for(lambda: row(state_db, name).generation == 2 and row(state_db, name).state == "completed",
                 timeout=90, what="the second generation to finish")
    finally:
        watchdog.send_signal(signal.SIGTERM)
        watchdog.wait(timeout=30)
    reader.wait_for(lambda r: any(e.data.get("generation") == 2 and e.data["kind"] == "assistant_text"
                                  for e in r.events), what="the second generation's events")
    reader.close()
    kinds = {e.data["kind"] for e in reader.events}
    assert {"watchdog_readopt", "turn_end", "assistant_text"} <= kinds, kinds
    assert served.proc.poll() is None
    detail = served.get(f"/api/agents/{name}").json()
    assert detail["generation"] == 2 and detail["state"] == "completed"
    assert served.get("/api/health").json()["ok"] is True


def test_ctrl_c_stops_the_server_and_leaves_nothing_behind(fast_project: ProjectPaths) -> None:
    server = start_server(fast_project)  # default heartbeat (15 s): Ctrl-C must not wait for one
    port = int(server.base.rsplit(":", 1)[1])
    readers = [SSEReader(server) for _ in range(3)]
    for reader in readers:
        reader.connected.wait(10)
    assert server.get("/api/health").json()["stream_clients"] == 3
    before = child_pids(server.proc.pid)
    started = time.monotonic()
    code = server.stop(signal.SIGINT, timeout=30)
    took = time.monotonic() - started
    assert code == 0, server.proc.stderr.read() if server.proc.stderr else ""
    assert before == [], f"ov serve started processes of its own: {before}"
    assert child_pids(server.proc.pid) == []
    for reader in readers:
        reader.wait_for(lambda r: r.ended.is_set(), timeout=10, what="the stream to end")
        assert reader.error is None
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("127.0.0.1", port))  # the port is free again
    probe.close()
    print(f"\nov serve stopped {took:.2f}s after Ctrl-C with 3 streams open")


def test_listening_beyond_loopback_warns_and_a_busy_port_is_one_line(fast_project: ProjectPaths) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        taken = run_ov("serve", "--port", str(port), cwd=fast_project.root)
        assert taken.returncode == 1 and taken.stdout == ""
        assert taken.stderr.strip().splitlines() == [
            f"ov: error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another with --port "
            "(0 picks a free one)"]
        # The warning comes before anything listens (here the port is taken, so nothing ever does).
        wide = run_ov("serve", "--host", "0.0.0.0", "--port", str(port), cwd=fast_project.root)
        assert wide.returncode == 1
        first, second = wide.stderr.strip().splitlines()
        assert first.startswith("warning: listening on 0.0.0.0: anyone who can reach this address")
        assert "Address already in use" in second and "Traceback" not in wide.stderr
    finally:
        busy.close()
