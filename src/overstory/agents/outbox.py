"""Sending and replying as an agent, once per dispatch: the one body `ov mail send`/`ov mail reply` and
the agent's endpoint share (so an agent in its sandbox gets exactly what it would get outside one).

``env`` is the turn's environment: ``OVERSTORY_AGENT_NAME`` and ``OVERSTORY_DISPATCH`` scope the
idempotency key (``store.dispatch.agent_key``). Outside a turn there is no key and every call sends.
If the process dies between the key's lookup and the send, the retried command finds no key and
sends; if it dies after the send, the retry finds the key and answers with the first send's ids.

HOT (`ov mail send`): the standard library and ov's stdlib-only store only; no typing at run time.
"""

from __future__ import annotations

from overstory.store import mail as store
from overstory.store.dispatch import agent_key, sent_before

TYPE_CHECKING = False  # typing costs milliseconds on a hot path
if TYPE_CHECKING:
    import sqlite3
    import typing as t

    from overstory.paths import ProjectPaths


def recipients_of(conn: sqlite3.Connection, ids: list[int]) -> dict[int, str]:
    """Message id -> recipient, for saying what was sent."""
    from overstory.store.mail_queries import recipients_of as recipients

    return recipients(conn, ids)


def send_once(conn: sqlite3.Connection, env: t.Mapping[str, str], project: t.Callable[[], ProjectPaths], *,
              sender: str, to: str | None, subject: str, body: str, type_: str = "status", priority: str = "normal",
              payload: t.Any = None, reply_to: int | None = None, allow_unknown: bool = False,
              events: sqlite3.Connection | None = None) -> tuple[list[int], dict[int, str], str | None]:
    """The ids sent (a retried turn's identical send: the first one's), their recipients, and a note: why
    nothing was sent (no ids: an `ov loop` holds the report, ``store.loop_reports``, or a builder's
    ``worker_done`` is held once to tell it of siblings' work it would conflict with, ``agents.siblings``),
    or, with ids, what the builder should know of that work.

    ``project`` is asked only for a worker_done that lacks its commit and files (filled in from git).
    """
    from overstory.store import loop_reports

    parent = loop_reports.hold(conn, sender, type_, subject=subject, body=body, payload=payload)
    if parent is not None:
        return [], {}, (f"held, not sent: {sender} works in an `ov loop`, and the loop reports to {parent} once, "
                        "when ov's check agrees (it quotes this report); end your last message with the promise")
    key = agent_key(env, "mail", sender, to, type_, subject, body, payload, reply_to, priority)
    ids = sent_before(conn, key)
    note = None
    if not ids:
        if type_ == "worker_done":  # the real commit and files, from git, where the agent left them out
            from overstory.agents.siblings import before_worker_done
            from overstory.agents.work_report import fill_worker_done, refuse_early_lead_report

            refuse_early_lead_report(project, conn, sender)  # a lead's builders first: done and merged
            hold, note = before_worker_done(project(), conn, sender)  # siblings' work merged since it started
            if hold:
                return [], {}, note
            payload = fill_worker_done(project(), conn, sender, payload)
        ids = store.send(conn, sender=sender, to=to, subject=subject, body=body, type=type_, priority=priority,
                         payload=payload, reply_to=reply_to, allow_unknown=allow_unknown, dedup_key=key,
                         env=env, events=events) or sent_before(conn, key)
    return ids, recipients_of(conn, ids), note


def reply_once(conn: sqlite3.Connection, env: t.Mapping[str, str], message_id: int, *, sender: str, body: str,
               events: sqlite3.Connection | None = None) -> tuple[int, str]:
    """The reply's id (a retried turn's identical reply: the first one's) and its recipient."""
    key = agent_key(env, "reply", sender, message_id, body)
    before = sent_before(conn, key)
    new_id = before[0] if before else store.reply(conn, message_id, sender=sender, body=body, env=env,
                                                  events=events, dedup_key=key)
    return new_id, recipients_of(conn, [new_id]).get(new_id, "?")


def _ms(text: str | None) -> int | None:
    """The inverse of ``clock.iso``."""
    if text is None:
        return None
    from overstory.clock import ms_from_iso

    return ms_from_iso(text)


def message_from_dict(document: t.Mapping[str, t.Any]) -> store.Message:
    """A message as the endpoint sent it (``Message.as_dict``), back as a ``Message`` to render."""
    return store.Message(
        id=document["id"], thread_id=document["thread_id"], reply_to=document["reply_to"], sender=document["from"],
        recipient=document["to"], type=document["type"], priority=document["priority"], subject=document["subject"],
        body=document["body"], payload=document["payload"], created_at=_ms(document["created_at"]),
        read_at=_ms(document["read_at"]), claimed_by=document["claimed_by"], claimed_at=_ms(document["claimed_at"]),
        superseded_by=document.get("superseded_by"))
