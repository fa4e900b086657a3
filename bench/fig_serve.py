"""Figure 8: `ov serve` with 20 SSE clients while 10 agents run: server CPU, delivery latency, correctness.

A real `ov serve --port 0` process, real scripted agents slung with `ov sling` (held
at a gate until all ten exist, then released together), and 20 stream clients that
are plain HTTP connections read on threads of this process. Measured:

- the server's own CPU time (utime + stime from /proc) while the agents run, and as a
  share of one core over the run;
- the delay from an event's commit time (its ``at``) to its arrival at a client;
- that every client received every event exactly once and in order;
- a baseline in the same run: the same number of events written straight into
  events.db at the same rate, read by 1 client and by 20, so the ratio shows what the
  19 extra clients cost; and the CPU of an idle server holding 20 clients.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
import typing as t
from pathlib import Path

from context import Context
from harness import Stats, add_note, init_project, make_repo, row, start_ticks

URL_LINE = re.compile(r"^ov serve: http://([^:/]+):(\d+)/#token=(\S+)$")


def _cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _max_id(events_db: Path) -> int:
    conn = sqlite3.connect(f"file:{events_db}?mode=ro", uri=True, timeout=10)
    try:
        return int(conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0])
    finally:
        conn.close()


def _ids_after(events_db: Path, after: int) -> list[int]:
    conn = sqlite3.connect(f"file:{events_db}?mode=ro", uri=True, timeout=10)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM events WHERE id > ? ORDER BY id", (after,))]
    finally:
        conn.close()


class Client(threading.Thread):
    """One SSE client: records (id, arrival time, commit time) for every event."""

    def __init__(self, host: str, port: int, token: str, since: int) -> None:
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection(host, port, timeout=120)
        self.conn.request("GET", f"/events/stream?since={since}", headers={"Authorization": f"Bearer {token}"})
        self.response = self.conn.getresponse()
        self.received: list[tuple[int, float, int]] = []
        self.stopping = False

    def run(self) -> None:
        buffer = b""
        try:
            while not self.stopping:
                chunk = self.response.read1(65536)
                if not chunk:
                    return
                arrived = time.time()
                buffer += chunk
                *frames, buffer = buffer.split(b"\n\n")
                for frame in frames:
                    data = next((line[6:] for line in frame.split(b"\n") if line.startswith(b"data: ")), None)
                    if data is not None:
                        event = json.loads(data)
                        self.received.append((event["id"], arrived, _ms(event["at"])))
        except (OSError, http.client.HTTPException, ValueError):
            return

    def close(self) -> None:
        self.stopping = True
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(2)
        except OSError:
            pass
        self.join(timeout=5)
        self.conn.close()


def _ms(iso: str) -> int:
    import datetime

    return int(datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


class Server:
    def __init__(self, ctx: Context, root: Path) -> None:
        self.proc = subprocess.Popen([ctx.ov, "serve", "--port", "0"], cwd=root, env=ctx.env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        ctx.registry.adopt(self.proc.pid, start_ticks(self.proc.pid))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        match = URL_LINE.match(line)
        if not match:
            raise RuntimeError(f"ov serve printed {line!r}")
        self.host, self.port, self.token = match.group(1), int(match.group(2)), match.group(3)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
                conn.request("GET", "/api/health", headers={"Authorization": f"Bearer {self.token}"})
                if conn.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("ov serve did not answer")

    def cpu(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def clients(self, count: int, since: int) -> list[Client]:
        made = [Client(self.host, self.port, self.token, since) for _ in range(count)]
        for client in made:
            client.start()
        return made

    def stop(self) -> tuple[int | None, float]:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
        return code, time.monotonic() - started


def _wait(predicate: t.Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _check(clients: list[Client], expected: list[int]) -> int:
    """How many clients did NOT receive exactly ``expected``, in order."""
    return sum(1 for c in clients if [r[0] for r in c.received] != expected)


def _scenario(path: Path, gate: Path, lines: int) -> Path:
    actions: list[dict[str, t.Any]] = [{"bash": f"while [ ! -e {gate} ]; do sleep 0.05; done"}]
    actions += [{"text": f"step {i}: reading and thinking about the task at hand"} for i in range(lines)]
    actions += [{"bash": "ls"}, {"bash": 'ov mail send --type worker_done --subject "done ${OVERSTORY_TASK_ID}" '
                                          '--body "findings reported"'}]
    path.write_text(json.dumps({"turns": [{"actions": actions, "result": "done"}]}))
    return path


def _agents_run(ctx: Context, server: Server, root: Path, index: int) -> dict[str, t.Any]:
    agents, lines = ctx.p("fig8_agents"), ctx.p("fig8_lines")
    gate = root / ".overstory" / f"fig8-gate-{index}"  # inside the project: sandboxed agents see it
    scenario = _scenario(ctx.scratch / f"fig8-{index}.json", gate, lines)
    names = []
    for number in range(agents):
        done = ctx.ov_run("sling", "scout", f"r{index}a{number}", "--runtime", "scripted", "--scenario",
                          str(scenario), "--json", cwd=root)
        slung = json.loads(done.stdout)
        names.append(slung["name"])
        if slung.get("loop_pid"):
            ctx.registry.adopt(slung["loop_pid"], start_ticks(slung["loop_pid"]))
    events_db = root / ".overstory" / "events.db"
    since = _max_id(events_db)
    clients = server.clients(ctx.p("fig8_clients"), since)
    time.sleep(0.5)
    cpu_before, started = server.cpu(), time.monotonic()
    gate.write_text("go\n")

    def all_done() -> bool:
        conn = sqlite3.connect(f"file:{root / '.overstory' / 'state.db'}?mode=ro", uri=True, timeout=10)
        try:
            marks = ",".join("?" * len(names))
            return conn.execute(f"SELECT count(*) FROM sessions WHERE name IN ({marks}) AND state IN "
                                "('completed', 'zombie')", names).fetchone()[0] == len(names)
        finally:
            conn.close()

    finished = _wait(all_done, 180)
    time.sleep(1.5)  # the loops' last events (loop exit) land after the state settles
    expected = _ids_after(events_db, since)
    caught_up = _wait(lambda: all(len(c.received) >= len(expected) for c in clients), 60)
    seconds, cpu = time.monotonic() - started, server.cpu() - cpu_before
    for client in clients:
        client.close()
    latencies = [arrived * 1000 - at for c in clients for _, arrived, at in c.received]
    return {"finished": finished, "caught_up": caught_up, "events": len(expected), "seconds": seconds, "cpu": cpu,
            "wrong_clients": _check(clients, expected), "latencies_ms": latencies}


def _synthetic_run(server: Server, root: Path, clients_count: int, events: int, seconds: float) -> dict[str, t.Any]:
    """``events`` events written straight into events.db over ``seconds``, read by ``clients_count`` clients."""
    from overstory.store import events as event_store
    from overstory.store.db import open_events

    events_db = root / ".overstory" / "events.db"
    since = _max_id(events_db)
    clients = server.clients(clients_count, since)
    time.sleep(0.5)
    cpu_before = server.cpu()
    conn = open_events(events_db)
    try:
        pause = seconds / max(1, events)
        for number in range(events):
            event_store.record(conn, "assistant_text", agent=f"synthetic-{number % 10}",
                               summary=f"step {number}: reading and thinking about the task at hand",
                               data={"text": f"step {number}: reading and thinking about the task at hand"})
            time.sleep(pause)
    finally:
        conn.close()
    expected = _ids_after(events_db, since)
    caught_up = _wait(lambda: all(len(c.received) >= len(expected) for c in clients), 60)
    cpu = server.cpu() - cpu_before
    for client in clients:
        client.close()
    return {"clients": clients_count, "cpu": cpu, "caught_up": caught_up, "wrong_clients": _check(clients, expected)}


def run_serve(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    root = make_repo(ctx.scratch / "fig8")
    init_project(root)
    server = Server(ctx, root)
    rows: list[dict[str, t.Any]] = []
    count, agents = ctx.p("fig8_clients"), ctx.p("fig8_agents")
    try:
        runs = [_agents_run(ctx, server, root, index) for index in range(ctx.p("fig8_runs"))]
        events = max(r["events"] for r in runs)
        seconds = max(r["seconds"] for r in runs)
        baselines = {n: [_synthetic_run(server, root, n, events, seconds) for _ in range(ctx.p("fig8_synthetic_runs"))]
                     for n in (1, count)}
        idle_clients = server.clients(count, _max_id(root / ".overstory" / "events.db"))
        time.sleep(0.5)
        idle_before, idle_seconds = server.cpu(), ctx.p("fig8_idle_seconds")
        time.sleep(idle_seconds)
        idle_cpu = server.cpu() - idle_before
        for client in idle_clients:
            client.close()
    finally:
        code, stop_seconds = server.stop()
    cpu = Stats([r["cpu"] for r in runs])
    one, many = Stats([b["cpu"] for b in baselines[1]]), Stats([b["cpu"] for b in baselines[count]])
    latency = Stats([value for r in runs for value in r["latencies_ms"]])
    rows.append(row(8, f"server CPU while {agents} agents run, {count} clients", "s", cpu, digits=2,
                    note=f"{events} events over {seconds:.1f} s per run; {len(runs)} run(s)"))
    rows.append(row(8, f"server CPU while {agents} agents run, share of one core", "%",
                    Stats([100 * r["cpu"] / r["seconds"] for r in runs]), digits=1))
    rows.append(row(8, f"same events written directly, {count} clients: server CPU", "s", many, digits=2,
                    ratio=many.median / one.median if one.median else None, baseline="1 client",
                    note=f"{len(baselines[count])} run(s) of {events} events over {seconds:.1f} s"))
    rows.append(row(8, "same events written directly, 1 client: server CPU", "s", one, digits=2))
    rows.append(row(8, f"commit -> client delay ({count} clients), p50", "ms", latency, digits=0,
                    p99=round(latency.percentile(99), 0)))
    rows.append(row(8, f"commit -> client delay ({count} clients), p99", "ms", value=latency.percentile(99), digits=0))
    rows.append(row(8, f"idle server holding {count} clients: CPU", "% of a core",
                    value=100 * idle_cpu / idle_seconds, digits=2, note=f"over {idle_seconds} s"))
    wrong = sum(r["wrong_clients"] for r in runs) + sum(b["wrong_clients"] for bs in baselines.values() for b in bs)
    all_ok = all(r["finished"] and r["caught_up"] for r in runs) and all(
        b["caught_up"] for bs in baselines.values() for b in bs) and wrong == 0
    rows.append(row(8, "every client got every event once, in order", "clients wrong", value=wrong,
                    target="0 wrong, every client caught up", met=all_ok))
    rows.append(row(8, "Ctrl-C with clients gone: exit", "s", value=stop_seconds, digits=2,
                    note=f"exit code {code}"))
    if code != 0:
        add_note(rows, f"ov serve exited with {code} on SIGINT", figure=8)
    details = {"runs": [{k: v for k, v in r.items() if k != "latencies_ms"} for r in runs],
               "baselines": baselines, "idle_cpu_seconds": idle_cpu, "stop": {"code": code, "seconds": stop_seconds}}
    return rows, details
