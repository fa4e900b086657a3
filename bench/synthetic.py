"""Synthetic project contents for the figures that need many agents, messages or events.

Rows go in through ov's own API where one exists (sessions, transitions), and in
bulk SQL only for volume (100,000 messages or events), so the schema, indexes and
pragmas are exactly what `ov` itself uses.
"""

from __future__ import annotations

import json
import random
import sqlite3
import typing as t

from overstory.clock import now_ms
from overstory.store import sessions
from overstory.store.db import write_transaction

EVENT_KINDS = ("tool_start", "tool_end", "text", "turn_start", "turn_result", "turn_end", "mail_sent",
               "runtime_event", "turn_retry", "watchdog_stalled")
TOOLS = ("Bash", "Read", "Edit", "Write", "Grep")


def add_agents(conn: sqlite3.Connection, count: int, *, prefix: str = "agent-", loop: tuple[int, int | None] | None,
               states: t.Sequence[str] = ("between_turns",), worktree_root: str | None = None,
               start: int = 0) -> list[str]:
    """Insert ``count`` agents cycling through ``states``; live ones point at ``loop`` (pid, ticks).

    ``loop`` should be a real, live process so that liveness checks (`ov status`,
    the watchdog) see a running agent loop, as they would in a real project.
    """
    names = []
    now = now_ms()
    for index in range(start, start + count):
        name = f"{prefix}{index:03d}"
        capability = "builder" if index % 2 == 0 else "scout"
        generation = sessions.create_session(
            conn, name=name, capability=capability, task_id=f"task-{index:03d}", runtime="scripted", actor="bench",
            worktree=f"{worktree_root}/{name}" if worktree_root else None, branch=f"ov/{name}", base_branch="main")
        state = states[index % len(states)]
        if state != "booting":
            outcome = sessions.transition(conn, name, generation, state, actor="bench", reason="synthetic")
            if not outcome.ok:
                raise RuntimeError(f"synthetic agent {name}: cannot enter {state}: {outcome}")
        fields: dict[str, t.Any] = {"last_activity": now, "turns": 1 + index % 7, "input_tokens": 1000 * (index % 13),
                                    "output_tokens": 100 * (index % 11), "cost_usd": 0.01 * (index % 5)}
        if loop is not None and state not in sessions.TERMINAL_STATES:
            fields.update(loop_pid=loop[0], loop_start_ticks=loop[1])
        sessions.update_fields(conn, name, generation, **fields)
        names.append(name)
    return names


def add_mail(conn: sqlite3.Connection, count: int, recipients: t.Sequence[str], *, unread_every: int = 100) -> None:
    """``count`` messages spread over ``recipients``; about one in ``unread_every`` is left unread."""
    now = now_ms()
    chance = random.Random(8)  # the same database every run
    senders = [*recipients[1:], "operator"]
    rows = []
    for index in range(count):
        recipient = recipients[index % len(recipients)]
        sender = senders[(index * 7) % len(senders)]
        created = now - (count - index) * 50
        read_at = None if chance.random() < 1 / unread_every else created + 1000
        rows.append((sender, recipient, "status", 1, f"progress note {index}",
                     f"Step {index} done; tests pass. Next: the following step of the task.", created, read_at))
    with write_transaction(conn):
        conn.executemany(
            "INSERT INTO mail (sender, recipient, type, priority, subject, body, created_at, read_at) "
            "VALUES (?,?,?,?,?,?,?,?)", rows)
        conn.execute("UPDATE mail SET thread_id = id WHERE thread_id IS NULL")


def add_events(conn: sqlite3.Connection, count: int, agents: t.Sequence[str]) -> None:
    """``count`` events of the usual kinds (tool calls mostly), oldest first."""
    now = now_ms()
    rows = []
    for index in range(count):
        agent = agents[index % len(agents)]
        kind = EVENT_KINDS[index % len(EVENT_KINDS)]
        tool = TOOLS[index % len(TOOLS)] if kind.startswith("tool") else None
        data = json.dumps({"input": {"command": f"pytest -q tests/test_{index % 50}.py"}}) if tool else None
        rows.append((now - (count - index) * 10, agent, 1, f"turn-{index // 40}", kind, tool,
                     f"{kind} {tool or ''} step {index}", data))
    with write_transaction(conn):
        conn.executemany(
            "INSERT INTO events (at, agent, generation, turn_id, kind, tool, summary, data) VALUES (?,?,?,?,?,?,?,?)",
            rows)
