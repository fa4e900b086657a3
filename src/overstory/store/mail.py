"""The durable mail store in state.db: send, check, claim, threads, purge.

Standard library only, and no typing or dataclasses: `ov mail send` and `ov mail check` run
many times a minute inside agents. The pydantic payload models (``store.mail_payloads``) are
imported only when a protocol type is sent.

Delivery to a headless agent: the turn loop ``claim``s all unread, unclaimed mail of
the agent with one UPDATE … RETURNING stamped with the turn id, then ``mark_read``
when the turn ends cleanly or ``release`` when it dies, so a message is delivered
at least once and never twice to turns that succeed.
"""

from __future__ import annotations

import os
from _collections_abc import Mapping  # what collections.abc re-exports, without importing collections

from overstory import jsontext as json
from overstory.capabilities import CAPABILITIES as CAPABILITIES
from overstory.clock import iso, now_ms
from overstory.errors import MailError, OrchestratorError, PayloadError, UsageError
from overstory.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
    import typing as t

OPERATOR = "operator"

TYPES = (
    "dispatch", "status", "question", "result", "worker_done", "worker_died",
    "merge_ready", "merged", "merge_failed", "escalation", "decision_gate", "nudge",
)
PROTOCOL_TYPES = frozenset({
    "dispatch", "worker_done", "worker_died", "merge_ready", "merged", "merge_failed",
    "escalation", "decision_gate",
})
PRIORITIES = {"low": 0, "normal": 1, "high": 2, "urgent": 3}
PRIORITY_NAMES = {value: name for name, value in PRIORITIES.items()}

MAX_BODY_BYTES = 1024 * 1024
BROADCAST_ALL = "@all"

# Copies of overstory.store.sessions constants: importing that module (its 36-field
# dataclass) costs milliseconds on the hot path. test_mail keeps them equal.
TERMINAL_STATES = frozenset({"completed", "zombie"})


class Message(Record):
    """One row of the mail table, priority as its name."""
    __slots__ = ("id", "thread_id", "reply_to", "sender", "recipient", "type", "priority", "subject", "body",
                 "payload", "created_at", "read_at", "claimed_by", "claimed_at", "superseded_by")
    id: int
    thread_id: int
    reply_to: int | None
    sender: str
    recipient: str
    type: str
    priority: str
    subject: str
    body: str
    payload: dict[str, t.Any] | None
    created_at: int
    read_at: int | None
    claimed_by: str | None
    claimed_at: int | None
    superseded_by: int | None  # the recipient's later generation that took its name first: never delivered

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Message:
        return cls(
            id=row["id"], thread_id=row["thread_id"] if row["thread_id"] is not None else row["id"], body=row["body"],
            reply_to=row["reply_to"], sender=row["sender"], recipient=row["recipient"], type=row["type"],
            priority=PRIORITY_NAMES.get(row["priority"], str(row["priority"])), subject=row["subject"],
            payload=json.loads(row["payload"]) if row["payload"] else None, created_at=row["created_at"],
            read_at=row["read_at"], claimed_by=row["claimed_by"], claimed_at=row["claimed_at"],
            superseded_by=row["superseded_by"])

    @property
    def is_read(self) -> bool:
        return self.read_at is not None

    def as_dict(self) -> dict[str, t.Any]:
        return {
            "id": self.id, "thread_id": self.thread_id, "reply_to": self.reply_to, "from": self.sender,
            "to": self.recipient, "type": self.type, "priority": self.priority, "subject": self.subject,
            "body": self.body, "payload": self.payload, "created_at": iso(self.created_at),
            "read_at": iso(self.read_at), "claimed_by": self.claimed_by, "claimed_at": iso(self.claimed_at),
            "superseded_by": self.superseded_by,
        }


# ---- helpers ----------------------------------------------------------------


def _atomic(conn: sqlite3.Connection) -> t.ContextManager[sqlite3.Connection]:
    from overstory.store.db import atomic  # here, not at the top: an agent's `ov mail` client needs no SQLite

    return atomic(conn)


def default_sender(env: t.Mapping[str, str] = os.environ) -> str:
    """``$OVERSTORY_AGENT_NAME`` inside an agent, else ``operator``."""
    return env.get("OVERSTORY_AGENT_NAME") or OPERATOR


def priority_value(priority: str | int) -> int:
    if isinstance(priority, int) and priority in PRIORITY_NAMES:
        return priority
    if isinstance(priority, str) and priority in PRIORITIES:
        return PRIORITIES[priority]
    raise UsageError(f"unknown priority {priority!r}; use one of {', '.join(PRIORITIES)}")


def check_type(mail_type: str) -> None:
    if mail_type not in TYPES:
        raise UsageError(f"unknown mail type {mail_type!r}; use one of {', '.join(TYPES)}")


def _utf8_size(what: str, text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates, e.g. undecodable bytes from argv
        raise MailError(f"the {what} is not valid UTF-8 text") from None


def check_body(body: str) -> None:
    size = _utf8_size("body", body)
    if size > MAX_BODY_BYTES:
        raise MailError(f"the body is {size} bytes; the limit is {MAX_BODY_BYTES} bytes (1 MiB): "
                        "send a file path instead of the file")


def _encode_payload(payload: t.Mapping[str, t.Any] | None) -> str | None:
    if payload is None:
        return None
    from overstory.store.payload_shape import encode  # refuses a payload too deep or too big
    return encode(payload, MAX_BODY_BYTES)


_COLUMNS = "id, thread_id, reply_to, sender, recipient, type, priority, subject, body, payload, " \
           "created_at, read_at, claimed_by, claimed_at, superseded_by"
_DELIVERY_ORDER = "priority DESC, id"


def _sorted_for_delivery(rows: t.Iterable[sqlite3.Row]) -> list[Message]:
    messages = [Message.from_row(r) for r in rows]
    messages.sort(key=lambda m: (-PRIORITIES.get(m.priority, 0), m.id))
    return messages


# ---- writing ----------------------------------------------------------------


def insert_message(conn: sqlite3.Connection, *, sender: str, recipient: str, subject: str, body: str = "",
                   type: str = "status", priority: str | int = "normal",
                   payload: t.Mapping[str, t.Any] | None = None, reply_to: int | None = None,
                   dedup_key: str | None = None) -> int | None:
    """Insert one message as it is: no transaction, no recipient or payload checks.

    For callers that already hold a transaction (e.g. the CAS that makes an agent a
    zombie inserts the parent's ``worker_died``). A ``dedup_key`` that already exists
    returns None instead of inserting a second copy. Replies join the thread of the
    message they answer.
    """
    row = conn.execute(
        "INSERT INTO mail (thread_id, reply_to, sender, recipient, type, priority, subject, body, payload, "
        "created_at, dedup_key) VALUES ((SELECT COALESCE(thread_id, id) FROM mail WHERE id = :reply_to), "
        ":reply_to, :sender, :recipient, :type, :priority, :subject, :body, :payload, :now, :dedup_key) "
        "ON CONFLICT (dedup_key) DO NOTHING RETURNING id, thread_id",
        {"reply_to": reply_to, "sender": sender, "recipient": recipient, "type": type,
         "priority": priority_value(priority), "subject": subject, "body": body,
         "payload": _encode_payload(payload), "now": now_ms(), "dedup_key": dedup_key},
    ).fetchone()
    if row is None:
        return None
    message_id = int(row[0])
    if row[1] is None:
        conn.execute("UPDATE mail SET thread_id = id WHERE id = ?", (message_id,))
    return message_id


def resolve_recipients(conn: sqlite3.Connection, to: str, *, sender: str, allow_unknown: bool = False,
                       answering: Message | None = None) -> list[str]:
    """Turn an address into agent names: a name, ``operator``, ``@all`` or ``@<capability>s``.

    Broadcasts go to agents that are not terminal, minus the sender. Refused: a completed or zombie
    agent, a reply (``answering``) to a later generation of the asker's name, and an unknown name
    unless ``allow_unknown`` (so that a typo does not silently swallow a message).
    """
    to = to.strip()
    if not to:
        raise UsageError("the recipient is empty")
    if to == OPERATOR:
        return [OPERATOR]
    if to.startswith("@"):
        capability = _broadcast_capability(to)
        marks = ",".join("?" * len(TERMINAL_STATES))
        rows = conn.execute(
            f"SELECT name, capability FROM sessions WHERE state NOT IN ({marks}) ORDER BY created_at, name",
            tuple(TERMINAL_STATES),
        ).fetchall()
        names = [r["name"] for r in rows if r["name"] != sender and capability in (None, r["capability"])]
        if not names:
            scope = "agents" if capability is None else f"{capability} agents"
            raise MailError(f"nobody to deliver {to} to: there are no active {scope} (other than {sender})")
        return names
    row = conn.execute("SELECT state, generation, created_at FROM sessions WHERE name = ?", (to,)).fetchone()
    if row is None:
        if allow_unknown:
            return [to]
        from overstory.store.sessions import no_agent_named  # an error path: the module is not loaded before

        raise MailError(f"{no_agent_named(conn, to)}; check `ov status`, or pass --allow-unknown to send anyway")
    if row["state"] in TERMINAL_STATES:
        raise MailError(f"agent {to} is {row['state']}: it will never read mail again; "
                        "mail its parent or sling a new agent instead")
    if answering is not None and answering.sender == to and row["created_at"] > answering.created_at:
        raise MailError(f"#{answering.id} is from an earlier {to}: generation {row['generation']} has the name now")
    return [to]


def _broadcast_capability(address: str) -> str | None:
    if address == BROADCAST_ALL:
        return None
    word = address[1:]
    if word.endswith("s") and word[:-1] in CAPABILITIES:
        return word[:-1]
    groups = ", ".join(["@all", *(f"@{c}s" for c in CAPABILITIES)])
    raise UsageError(f"unknown broadcast address {address!r}; use one of {groups}")


def sender_session(conn: sqlite3.Connection, sender: str) -> sqlite3.Row | None:
    """The sender's sessions row (parent, task_id, branch), or None for the operator and strangers."""
    if sender == OPERATOR:
        return None
    return conn.execute("SELECT name, parent, task_id, branch FROM sessions WHERE name = ?", (sender,)).fetchone()


def default_recipient(sender_row: sqlite3.Row | None, env: t.Mapping[str, str] = os.environ) -> str:
    """Where a protocol report goes when --to is left out: the sender's parent."""
    if sender_row is not None and sender_row["parent"]:
        return str(sender_row["parent"])
    return env.get("OVERSTORY_PARENT") or OPERATOR


def prepare_payload(mail_type: str, payload: t.Any, *, sender: str, sender_row: sqlite3.Row | None = None,
                    env: t.Mapping[str, str] = os.environ) -> dict[str, t.Any] | None:
    """Validate a payload; protocol types go through their pydantic model (imported here, lazily)."""
    if mail_type not in PROTOCOL_TYPES:
        if payload is not None and not isinstance(payload, Mapping):
            raise PayloadError(f"a payload must be a JSON object, not {type(payload).__name__}")
        return dict(payload) if payload is not None else None
    from overstory.store.mail_payloads import validate_payload

    known = {
        "task_id": env.get("OVERSTORY_TASK_ID") or (sender_row["task_id"] if sender_row else None),
        "branch": env.get("OVERSTORY_BRANCH") or (sender_row["branch"] if sender_row else None),
        "agent": env.get("OVERSTORY_AGENT_NAME") or (sender if sender != OPERATOR else None),
    }
    return validate_payload(mail_type, payload, known)


def send(conn: sqlite3.Connection, *, sender: str, to: str | None, subject: str, body: str = "",
         type: str = "status", priority: str | int = "normal", payload: t.Any = None,
         reply_to: int | None = None, allow_unknown: bool = False, dedup_key: str | None = None,
         env: t.Mapping[str, str] = os.environ, events: sqlite3.Connection | None = None,
         answering: Message | None = None) -> list[int]:
    """Validate and deliver one message per recipient; returns the new ids.

    Recipients are resolved and the rows inserted in one write transaction, so a
    recipient cannot turn terminal in between (inside a transaction the caller
    already holds, the inserts join it). Once the rows are committed, a ``mail_sent``
    event per message is recorded in events.db (``events``, else the events.db next
    to state.db); losing that event never loses the mail. A caller that holds its own
    transaction calls ``record_sent`` after it commits. With ``dedup_key`` a message
    that was already sent is not sent again (its id is then not returned); for a
    broadcast each recipient's copy gets the key ``<dedup_key>:<recipient>``.
    """
    check_type(type)
    prio = priority_value(priority)
    check_body(body)
    _utf8_size("subject", subject)
    if not subject.strip():
        raise UsageError("the subject is empty")
    sender_row = sender_session(conn, sender)
    # Validate before taking the write lock: pydantic is slow to import.
    clean_payload = prepare_payload(type, payload, sender=sender, sender_row=sender_row, env=env)
    if to is None:
        if type not in PROTOCOL_TYPES:
            raise UsageError(f"--to is required for {type} mail (only protocol types default to the parent)")
        to = default_recipient(sender_row, env)
    ids: list[int] = []
    with _atomic(conn):
        recipients = resolve_recipients(conn, to, sender=sender, allow_unknown=allow_unknown, answering=answering)
        if reply_to is not None and conn.execute("SELECT 1 FROM mail WHERE id = ?", (reply_to,)).fetchone() is None:
            raise MailError(f"no message #{reply_to} to reply to")
        for recipient in recipients:
            key = dedup_key if dedup_key is None or len(recipients) == 1 else f"{dedup_key}:{recipient}"
            new_id = insert_message(conn, sender=sender, recipient=recipient, subject=subject, body=body, type=type,
                                    priority=prio, payload=clean_payload, reply_to=reply_to, dedup_key=key)
            if new_id is not None:
                ids.append(new_id)
    if ids and not conn.in_transaction:
        record_sent(conn, ids, events=events)
    return ids


def record_sent(conn: sqlite3.Connection, ids: t.Sequence[int], *, events: sqlite3.Connection | None = None) -> bool:
    """Record a ``mail_sent`` event per message id; False (and nothing raised) if that failed.

    Callers that insert with ``insert_message`` inside their own transaction call
    this after they commit.
    """
    from overstory.store import events as event_store
    from overstory.store.db import sqlite3

    own = events is None
    try:
        if events is None:
            from overstory.store.db import open_events

            events = open_events(_events_db_path(conn))
        marks = ",".join("?" * len(ids))
        rows = conn.execute(f"SELECT {_COLUMNS} FROM mail WHERE id IN ({marks}) ORDER BY id", tuple(ids)).fetchall()
        with _atomic(events):
            for message in (Message.from_row(r) for r in rows):
                event_store.record(
                    events, "mail_sent", agent=message.sender,
                    summary=f"{message.sender} -> {message.recipient} [{message.type}] {message.subject}"[:300],
                    data={"id": message.id, "to": message.recipient, "type": message.type,
                          "priority": message.priority, "thread_id": message.thread_id},
                    at=message.created_at,
                )
    except (sqlite3.Error, OrchestratorError, OSError):
        # The mail is committed; a missing event must not turn that into a failure.
        return False
    finally:
        if own and events is not None:
            events.close()
    return True


def _events_db_path(conn: sqlite3.Connection) -> str:
    for row in conn.execute("PRAGMA database_list").fetchall():
        if row[1] == "main" and row[2]:
            return os.path.join(os.path.dirname(row[2]), "events.db")
    raise MailError("state.db has no file path; pass an events connection")


def reply(conn: sqlite3.Connection, message_id: int, *, sender: str, body: str, subject: str | None = None,
          priority: str | int | None = None, env: t.Mapping[str, str] = os.environ,
          events: sqlite3.Connection | None = None, dedup_key: str | None = None) -> int:
    """Answer message ``message_id``: to its sender, in its thread.

    A reply to a ``question`` is a ``result``; any other reply is a ``status``. The original sender
    may be a name with no session (e.g. a tool), so unknown names are allowed, but a completed or
    zombie agent, or a later generation of the name than the one that asked, refuses it.
    """
    original = get(conn, message_id)
    if original is None:
        raise MailError(f"no message #{message_id}")
    if subject is None:
        subject = original.subject if original.subject.lower().startswith("re:") else f"Re: {original.subject}"
    ids = send(conn, sender=sender, to=original.sender, subject=subject, body=body,
               type="result" if original.type == "question" else "status",
               priority=original.priority if priority is None else priority, reply_to=original.id,
               allow_unknown=True, env=env, events=events, dedup_key=dedup_key, answering=original)
    return ids[0] if ids else int(conn.execute("SELECT id FROM mail WHERE dedup_key = ?", (dedup_key,)).fetchone()[0])


# ---- reading and delivery ---------------------------------------------------------


def get(conn: sqlite3.Connection, message_id: int) -> Message | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM mail WHERE id = ?", (message_id,)).fetchone()
    return Message.from_row(row) if row else None


def read_message(conn: sqlite3.Connection, message_id: int, *, reader: str) -> Message:
    """Fetch one message; marks it read only when ``reader`` is its recipient.

    The operator can look at an agent's mail without stealing it from the agent.
    Mail claimed by a turn is left to that turn.
    """
    row = conn.execute(
        f"UPDATE mail SET read_at = ? WHERE id = ? AND recipient = ? AND read_at IS NULL AND claimed_by IS NULL "
        f"RETURNING {_COLUMNS}",
        (now_ms(), message_id, reader),
    ).fetchone()
    if row is not None:
        return Message.from_row(row)
    message = get(conn, message_id)
    if message is None:
        raise MailError(f"no message #{message_id}")
    return message


def unread(conn: sqlite3.Connection, agent: str, *, peek: bool = False,
           leave: t.Collection[int] = ()) -> list[Message]:
    """Unread, unclaimed mail of ``agent``, most urgent first; marked read unless ``peek``.

    Marking is one UPDATE … RETURNING, so two concurrent checks never both get a message.
    ``leave``: ids neither returned nor marked (`ov mail check --debounce`).
    """
    skip = f" AND id NOT IN ({','.join(str(int(i)) for i in leave)})" if leave else ""
    if peek:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM mail WHERE recipient = ? AND read_at IS NULL AND claimed_by IS NULL{skip} "
            f"ORDER BY {_DELIVERY_ORDER}",
            (agent,),
        ).fetchall()
    else:
        rows = conn.execute(
            f"UPDATE mail SET read_at = ? WHERE recipient = ? AND read_at IS NULL AND claimed_by IS NULL{skip} "
            f"RETURNING {_COLUMNS}",
            (now_ms(), agent),
        ).fetchall()
    return _sorted_for_delivery(rows)


def mark_read_from(conn: sqlite3.Connection, recipient: str, sender_prefix: str) -> int:
    """Mark read ``recipient``'s unread mail from senders whose names start with ``sender_prefix``; how many."""
    pattern = sender_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return conn.execute("UPDATE mail SET read_at = ? WHERE recipient = ? AND read_at IS NULL AND sender LIKE ? "
                        "ESCAPE '\\'", (now_ms(), recipient, pattern)).rowcount


def mark_read_ids(conn: sqlite3.Connection, ids: t.Sequence[int]) -> int:
    """Mark these messages read now (mail whose recipient already knows what it says); how many."""
    stamp = now_ms()
    return sum(conn.execute("UPDATE mail SET read_at = ? WHERE id = ? AND read_at IS NULL", (stamp, mid)).rowcount
               for mid in ids)


def pending_count(conn: sqlite3.Connection, agent: str) -> int:
    """Mail waiting for ``agent``'s next turn (unread and not claimed by a turn)."""
    row = conn.execute(
        "SELECT COUNT(*) FROM mail WHERE recipient = ? AND read_at IS NULL AND claimed_by IS NULL", (agent,)
    ).fetchone()
    return int(row[0])


def claim(conn: sqlite3.Connection, agent: str, turn_id: str) -> list[Message]:
    """Stamp all of ``agent``'s unread, unclaimed mail with ``turn_id`` and return it.

    One statement, so two concurrent claimers never share a message. Joins the
    caller's transaction if one is open (claim mail + start turn atomically).
    """
    if not turn_id:
        raise ValueError("claim needs a turn id")
    with _atomic(conn):
        rows = conn.execute(
            f"UPDATE mail SET claimed_by = ?, claimed_at = ? "
            f"WHERE recipient = ? AND read_at IS NULL AND claimed_by IS NULL RETURNING {_COLUMNS}",
            (turn_id, now_ms(), agent),
        ).fetchall()
    return _sorted_for_delivery(rows)


def mark_read(conn: sqlite3.Connection, turn_id: str) -> int:
    """The turn ended cleanly: its claimed mail is delivered. Returns how many."""
    with _atomic(conn):
        cursor = conn.execute(
            "UPDATE mail SET read_at = ? WHERE claimed_by = ? AND read_at IS NULL", (now_ms(), turn_id)
        )
    return cursor.rowcount


def release(conn: sqlite3.Connection, turn_id: str) -> int:
    """The turn died: give its claimed, unread mail back for the next turn. Returns how many."""
    with _atomic(conn):
        cursor = conn.execute(
            "UPDATE mail SET claimed_by = NULL, claimed_at = NULL WHERE claimed_by = ? AND read_at IS NULL",
            (turn_id,),
        )
    return cursor.rowcount


def move_claims(conn: sqlite3.Connection, from_turn: str, to_turn: str) -> int:
    """Hand a turn's claimed mail to the turn that replaces it (a fresh-session retry)."""
    return conn.execute("UPDATE mail SET claimed_by = ? WHERE claimed_by = ?", (to_turn, from_turn)).rowcount


def discard(conn: sqlite3.Connection, message_id: int) -> None:
    """Delete a message that was never delivered (a spawn taking back its dispatch)."""
    conn.execute("DELETE FROM mail WHERE id = ?", (message_id,))


def release_agent(conn: sqlite3.Connection, agent: str) -> int:
    """Release every claim on ``agent``'s unread mail (recovery when the turn ids are lost)."""
    with _atomic(conn):
        cursor = conn.execute(
            "UPDATE mail SET claimed_by = NULL, claimed_at = NULL "
            "WHERE recipient = ? AND read_at IS NULL AND claimed_by IS NOT NULL",
            (agent,),
        )
    return cursor.rowcount


def list_messages(conn: sqlite3.Connection, *, to: str | None = None, sender: str | None = None,
                  type: str | None = None, unread: bool = False, thread: int | None = None,
                  since_ms: int | None = None, limit: int | None = 50) -> list[Message]:
    """The newest ``limit`` matching messages, oldest first. Never marks anything read."""
    clauses: list[str] = []
    params: list[t.Any] = []
    for column, value in (("recipient", to), ("sender", sender), ("type", type)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if unread:
        clauses.append("read_at IS NULL")
    if thread is not None:
        clauses.append("(thread_id = ? OR id = ?)")
        params.extend([thread, thread])
    if since_ms is not None:
        clauses.append("created_at >= ?")
        params.append(since_ms)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    limit_sql = " LIMIT ?" if limit is not None else ""
    params += [limit] if limit is not None else []
    rows = conn.execute(f"SELECT {_COLUMNS} FROM mail {where} ORDER BY id DESC{limit_sql}", params).fetchall()
    return [Message.from_row(r) for r in reversed(rows)]


def purge(conn: sqlite3.Connection, older_than_ms: int, *, include_unread: bool = False,
          now: int | None = None) -> int:
    """Delete mail older than ``older_than_ms`` milliseconds; returns how many.

    Unread mail is kept unless ``include_unread``. Kept regardless: mail claimed by a
    turn in flight and unread mail still waiting for an agent that is not terminal
    (purging must not lose work). One statement, so a crash deletes all or nothing.
    """
    if older_than_ms < 0:
        raise UsageError("--older-than must not be negative")
    cutoff = (now if now is not None else now_ms()) - older_than_ms
    marks = ",".join("?" * len(TERMINAL_STATES))
    waiting = ("read_at IS NULL AND (claimed_by IS NOT NULL OR recipient IN "
               f"(SELECT name FROM sessions WHERE state NOT IN ({marks})))")
    protected = waiting if include_unread else "read_at IS NULL"
    with _atomic(conn):
        cursor = conn.execute(f"DELETE FROM mail WHERE created_at < ? AND NOT ({protected})",
                              (cutoff, *(TERMINAL_STATES if include_unread else ())))
    return cursor.rowcount


def delete(conn: sqlite3.Connection, message_id: int, *, force: bool = False) -> Message:
    """Delete one message (`ov mail delete`); the deleted message.

    Unread mail is kept unless ``force``; mail claimed by a turn in flight is always kept
    (the turn is reading it: it is settled when the turn ends). One statement decides
    and deletes, so a message claimed meanwhile is never deleted under its turn.
    """
    with _atomic(conn):
        row = conn.execute(
            f"DELETE FROM mail WHERE id = ? AND NOT (read_at IS NULL AND claimed_by IS NOT NULL) "
            f"AND (? OR read_at IS NOT NULL) RETURNING {_COLUMNS}", (message_id, int(force))).fetchone()
    if row is not None:
        return Message.from_row(row)
    found = get(conn, message_id)
    if found is None:
        raise MailError(f"no message #{message_id}")
    if found.claimed_by:
        raise MailError(f"#{message_id} is being delivered to {found.recipient} (claimed by turn {found.claimed_by}); "
                        "it is not deleted under a running turn")
    raise MailError(f"#{message_id} to {found.recipient} is unread; `ov mail delete {message_id} --force` deletes it "
                    "anyway (it is then never delivered)")


def count_unread_older(conn: sqlite3.Connection, older_than_ms: int, *, now: int | None = None) -> int:
    """Unread messages older than ``older_than_ms`` (what a purge kept)."""
    cutoff = (now if now is not None else now_ms()) - older_than_ms
    return int(conn.execute("SELECT count(*) FROM mail WHERE created_at < ? AND read_at IS NULL",
                            (cutoff,)).fetchone()[0])
