"""Notifications that reach a person, through apprise (ARCHITECTURE §13).

What to send lives in state.db's outbox (``store.outbox``), written in the transaction
of the state change (an approval request, a decision) or found afterwards in durable
state by ``collect`` (worker_died and merge_failed mail, parks for a budget or a
quota, finished runs), each under a dedup key. ``flush`` sends what is due to every
``notify.targets`` URL and marks it sent; a failure is retried with backoff (5 s
doubling, at most 10 min) and recorded as a ``notify_failed`` event; it is never fatal.
Two senders at once (the watchdog and `ov approve`) do not both send a row: each
leases it first (a compare-and-swap on ``next_at``). If the sender dies after a send
and before marking it, that one is sent again when the lease runs out (at least
once); a restart otherwise sends nothing twice.

apprise is imported only here, and only by the watchdog, `ov notify` and the commands
that decide approvals: never by `ov guard` or the mail commands.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import typing as t
from dataclasses import dataclass

from overstory.clock import now_ms
from overstory.store import mail_queries, outbox, runs, sessions
from overstory.store.db import write_transaction

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.paths import ProjectPaths

FAULT_ENV = "OV_TEST_NOTIFY_DIE"  # test hook: "before_send" kills the sender after the outbox commit
BACKOFF_FIRST_MS = 5_000
LEASE_MS = 120_000  # a sender that dies mid-send holds its rows this long; then another one sends them
BACKOFF_MAX_MS = 600_000


def collect(conn: sqlite3.Connection) -> int:
    """Queue notifications for what happened since the last scan; returns how many were new."""
    added = 0
    with write_transaction(conn):
        last = outbox.cursor(conn, "mail")
        rows, top = mail_queries.of_types_after(conn, last, ("worker_died", "merge_failed"))
        for row in rows:
            added += outbox.enqueue(conn, f"{row['type']}:mail:{row['id']}", row["type"], row["sender"],
                                    f"ov: {row['subject']}"[:200], (row["body"] or row["subject"])[:2000])
        outbox.set_cursor(conn, "mail", top)
        last = outbox.cursor(conn, "transitions")
        rows, top = sessions.parkings_after(conn, last)
        for completion in outbox.completions_after(conn, last):  # read with the same cursor, before it moves
            added += _completed_outside_a_run(conn, completion)
        for row in rows:
            kind = row["park_kind"] if row["state"] == "parked" and row["g"] == row["generation"] else None
            if kind in ("budget", "quota"):
                added += outbox.enqueue(conn, f"{kind}_parked:{row['id']}", f"{kind}_parked", row["name"],
                                        f"ov: {row['name']} parked ({kind})",
                                        f"{row['name']} is parked: {row['reason']}. `ov budget {row['name']}` and "
                                        f"`ov resume {row['name']}`.")
        outbox.set_cursor(conn, "transitions", top)
        for row in runs.ended(conn):
            added += outbox.enqueue(conn, f"run_finished:{row['id']}", "run_finished", None,
                                    f"ov: run {row['id']} {row['status']}",
                                    f"Run {row['id']} is {row['status']}. `ov run show {row['id']}`.")
    return added


def _completed_outside_a_run(conn: sqlite3.Connection, row: sqlite3.Row) -> int:
    """An agent no run reports on (slung by you, not under `ov coordinator`) that finished its task: announced
    as a run's end is. Not one you stopped yourself, not the coordinator or a monitor (they never finish), not
    a child of another agent (it reports to its parent, whose own end is announced)."""
    from overstory.capabilities import PERSISTENT

    reason = row["reason"] or "done"
    if row["g"] != row["generation"] or row["run_id"] is not None or row["capability"] in PERSISTENT \
            or row["parent"] != "operator" or reason.startswith("stopped by"):
        return 0
    name = row["name"]
    return int(outbox.enqueue(conn, f"agent_completed:{name}:{row['generation']}", "agent_completed", name,
                              f"ov: {name} completed", f"{name} ({row['capability']} on task {row['task_id']}) "
                              f"completed: {reason}. `ov diff {name}` shows its work; `ov merge {name}` merges it."))


def _named(conn: sqlite3.Connection, row: dict[str, t.Any], project: ProjectPaths | None) -> tuple[str, str]:
    """A notification's title and body, naming its agent (or run) and where its logs are."""
    from pathlib import Path

    if project is not None:
        logs = project.logs_dir
    else:
        from overstory.store.db import file_of

        found = file_of(conn)
        logs = Path(found).parent / "logs" if found else Path(".overstory/logs")
    title, body, agent = row["title"], row["body"] or row["title"], row["agent"]
    if agent:
        if agent not in title:
            title = f"ov: {agent}: {title.removeprefix('ov: ')}"[:200]
        return title, f"{body}\nagent: {agent}; logs: {logs / agent}"
    run = row["dedup_key"].split(":")[1] if row["kind"] == "run_finished" else None
    return title, body + (f"\nrun: {run}; logs: {logs} (one folder per agent; `ov run show {run}`)" if run
                          else f"\nlogs: {logs}")


@dataclass
class Sent:
    sent: int = 0
    skipped: int = 0
    failed: int = 0


def flush(conn: sqlite3.Connection, config: Config, *, project: ProjectPaths | None = None,
          budget_s: float = 20, sender: t.Callable[[str, str, str], str | None] | None = None,
          events: sqlite3.Connection | None = None) -> Sent:
    """Send every due outbox row to each target (within about ``budget_s``); never raises for a target."""
    result = Sent()
    send = sender or send_one
    if os.environ.get(FAULT_ENV) == "before_send" and outbox.due(conn):
        os._exit(9)  # crash-safety tests: the rows are committed, nothing was sent
    started = time.monotonic()
    links: list[str | None] = []  # the dashboard's address, looked up when a request is first sent
    for row in outbox.due(conn):
        if time.monotonic() - started > budget_s:
            break
        if row["kind"] not in config.notify.on or not config.notify.targets:
            with write_transaction(conn):
                outbox.mark_sent(conn, row["id"], "not sent: " + ("no notify.targets" if not config.notify.targets
                                                                  else "not in notify.on"))
            result.skipped += 1
            continue
        if not outbox.lease(conn, row["id"], row["next_at"], now_ms() + LEASE_MS):
            continue  # another sender (the watchdog, `ov approve`) has it
        delivered = list(json.loads(row["delivered"] or "[]"))
        title, body = _named(conn, row, project)  # apprise sends no empty body
        if row["kind"] == "approval_requested" and project is not None:
            if not links:
                from overstory.serve_token import running_address

                links.append(running_address(project))
            if links[0]:
                body += f"\nOr decide on the dashboard: {links[0]}/ (sign in with the address `ov serve` printed)"
        errors = []
        for target in config.notify.targets:
            if target in delivered:
                continue
            error = send(target, title, body)
            if error is None:
                delivered.append(target)
            else:
                errors.append(f"{redact(target)}: {error}")
        with write_transaction(conn):
            if not errors:
                outbox.mark_sent(conn, row["id"])
            else:
                delay = min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** min(row["attempts"], 10))
                outbox.mark_failed(conn, row["id"], "; ".join(errors), now_ms() + delay, delivered)
        if errors:
            result.failed += 1
            _failed_event(conn, events, row, "; ".join(errors), row["attempts"] + 1)
        else:
            result.sent += 1
    return result


def send_one(target: str, title: str, body: str) -> str | None:
    """Send one message to one apprise URL: None when it went out, else why not."""
    try:
        import apprise
    except ImportError:
        return "apprise is not installed (pip install apprise)"
    client = apprise.Apprise()
    if not client.add(target):
        return "not a URL apprise understands"
    try:
        ok = client.notify(title=title, body=body)
    except Exception as exc:  # noqa: BLE001 - a plugin's bug must not take the watchdog down
        return f"{type(exc).__name__}: {exc}"
    return None if ok else "the target did not accept it (refused, unreachable or an error status)"


def redact(target: str) -> str:
    """A target URL without what looks like a secret (user:password@, tokens in the path are kept short)."""
    scheme, sep, rest = target.partition("://")
    if not sep:
        return target[:40]
    host = rest.split("@", 1)[-1]
    return f"{scheme}://{host[:60]}"


def test_targets(config: Config) -> list[tuple[str, str | None]]:
    """`ov notify test`: one test message to every target; (target, error or None) each."""
    return [(redact(target), send_one(target, "ov: test notification",
                                      "This is a test from `ov notify test`: notifications reach you here."))
            for target in config.notify.targets]


def _failed_event(conn: sqlite3.Connection, events: sqlite3.Connection | None, row: dict[str, t.Any], error: str,
                  attempts: int) -> None:
    from overstory.store import events as event_store

    own = events is None
    try:
        if events is None:
            from overstory.store.db import open_events
            from overstory.store.mail import _events_db_path

            events = open_events(_events_db_path(conn))
        event_store.record(events, "notify_failed", agent=row["agent"],
                           summary=f"notification {row['kind']} not delivered (attempt {attempts}): {error}"[:300],
                           data={"outbox_id": row["id"], "kind": row["kind"], "attempts": attempts})
    except Exception:  # noqa: BLE001, S110
        pass
    finally:
        if own and events is not None:
            events.close()
