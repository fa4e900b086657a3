"""The mail store API: send, validation, broadcast, threads, claims, purge, rendering."""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overstory.errors import MailError, PayloadError, UsageError
from overstory.store import events, mail, mail_text, sessions
from overstory.store.db import write_transaction

NO_ENV: dict[str, str] = {}


def make_agent(conn: sqlite3.Connection, name: str, *, capability: str = "builder", state: str | None = None,
               parent: str = "operator", task_id: str | None = None, branch: str | None = None) -> int:
    generation = sessions.create_session(conn, name=name, capability=capability, task_id=task_id or f"task-{name}",
                                         runtime="scripted", actor="test", parent=parent,
                                         branch=branch or f"ov/{name}")
    if state is not None:
        outcome = sessions.transition(conn, name, generation, state, actor="test")
        assert outcome.ok, outcome
    return generation


def send(conn: sqlite3.Connection, **kwargs) -> list[int]:
    kwargs.setdefault("sender", "operator")
    kwargs.setdefault("subject", "hello")
    kwargs.setdefault("env", NO_ENV)
    return mail.send(conn, **kwargs)


def only(conn: sqlite3.Connection, **kwargs) -> mail.Message:
    ids = send(conn, **kwargs)
    assert len(ids) == 1
    message = mail.get(conn, ids[0])
    assert message is not None
    return message


# ---- constants stay in step with the rest of the code ---------------------------


def test_mirrored_constants_match_sessions():
    assert mail.TERMINAL_STATES == sessions.TERMINAL_STATES
    assert mail.CAPABILITIES == sessions.CAPABILITIES


def test_every_protocol_type_has_a_payload_model():
    from overstory.store.mail_payloads import PAYLOAD_MODELS

    assert set(PAYLOAD_MODELS) == mail.PROTOCOL_TYPES
    assert mail.PROTOCOL_TYPES < set(mail.TYPES)
    assert len(mail.TYPES) == 12


# ---- sending and reading back ------------------------------------------------------


def test_send_to_operator_round_trips(state_db):
    message = only(state_db, to="operator", subject="hi", body="there", priority="high")
    assert (message.sender, message.recipient, message.subject, message.body) == ("operator", "operator", "hi", "there")
    assert message.priority == "high" and message.type == "status"
    assert message.thread_id == message.id and message.reply_to is None
    assert message.read_at is None and message.claimed_by is None
    document = message.as_dict()
    assert document["from"] == "operator" and document["to"] == "operator"
    assert document["created_at"].endswith("Z") and document["read_at"] is None


AWKWARD_BODIES = [
    "line one\nline two\n\nline four\n",
    "windows\r\nline\rold mac",
    "quotes ' \" ` and | pipes || and ; & $HOME $(rm -rf /)",
    "control \x00 nul \x01 \x07 bell \x1b[31mred\x1b[0m \x7f del \t tab",
    "unicode: é ü 中文 🙂 \u200b zero-width, e\u0301 combining, \u2028 line sep",
    "   leading and trailing whitespace   \n\n",
    "",
    "x" * 10_000,
]


@pytest.mark.parametrize("body", AWKWARD_BODIES)
def test_awkward_bodies_round_trip_exactly(state_db, body):
    message = only(state_db, to="operator", body=body, subject="s | \"q\" \n")
    assert message.body == body
    assert mail.get(state_db, message.id).subject == "s | \"q\" \n"


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(body=st.text(), payload=st.dictionaries(st.text(), st.text() | st.integers() | st.none(), max_size=4))
def test_any_text_and_plain_payload_round_trip(state_db, body, payload):
    message = only(state_db, to="operator", body=body, payload=payload)
    assert message.body == body
    assert message.payload == payload


def test_body_limit_is_one_mebibyte_of_utf8(state_db):
    assert only(state_db, to="operator", body="a" * mail.MAX_BODY_BYTES).body == "a" * mail.MAX_BODY_BYTES
    with pytest.raises(MailError, match="limit is 1048576 bytes"):
        send(state_db, to="operator", body="a" * (mail.MAX_BODY_BYTES + 1))
    # Counted in UTF-8 bytes, not characters: 3 bytes each.
    with pytest.raises(MailError, match="limit"):
        send(state_db, to="operator", body="中" * (mail.MAX_BODY_BYTES // 3 + 1))
    assert state_db.execute("SELECT COUNT(*) FROM mail").fetchone()[0] == 1


def test_unknown_type_priority_and_empty_subject_are_refused(state_db):
    with pytest.raises(UsageError, match="unknown mail type"):
        send(state_db, to="operator", type="gossip")
    with pytest.raises(UsageError, match="unknown priority"):
        send(state_db, to="operator", priority="whenever")
    with pytest.raises(UsageError, match="subject is empty"):
        send(state_db, to="operator", subject="  ")
    with pytest.raises(UsageError, match="--to is required"):
        send(state_db, to=None)
    assert state_db.execute("SELECT COUNT(*) FROM mail").fetchone()[0] == 0


# ---- payloads ------------------------------------------------------------------------


def test_protocol_type_without_payload_names_the_payload_and_fields(state_db):
    with pytest.raises(PayloadError) as caught:
        send(state_db, to="operator", type="worker_done")
    text = str(caught.value)
    assert "payload" in text and "task_id" in text and "branch" in text and "agent" in text


def test_payload_errors_name_each_bad_field(state_db):
    with pytest.raises(PayloadError) as caught:
        send(state_db, to="operator", type="merged", payload={"branch": "ov/a", "tier": 7, "colour": "red"})
    text = str(caught.value)
    assert "tier" in text and "colour: unknown field" in text
    with pytest.raises(PayloadError, match="branch: missing"):
        send(state_db, to="operator", type="merge_failed", payload={"reason": "conflict"})
    with pytest.raises(PayloadError, match="severity"):
        send(state_db, to="operator", type="escalation", payload={"severity": "meh"})
    with pytest.raises(PayloadError, match="options"):
        send(state_db, to="operator", type="decision_gate", payload={"options": ["only one"]})
    with pytest.raises(PayloadError, match="JSON object"):
        send(state_db, to="operator", type="dispatch", payload=["task-1"])
    with pytest.raises(PayloadError, match="JSON object"):
        send(state_db, to="operator", type="status", payload="just a string")
    assert state_db.execute("SELECT COUNT(*) FROM mail").fetchone()[0] == 0


def test_valid_protocol_payload_is_stored_normalised(state_db):
    message = only(state_db, to="operator", type="merged", payload={"branch": "ov/a", "tier": 2})
    assert message.payload["branch"] == "ov/a" and message.payload["tier"] == 2
    assert message.payload["agent"] is None  # defaults are written out


def test_environment_fills_sender_fields_and_parent(state_db):
    make_agent(state_db, "lead-1", capability="lead")
    env = {"OVERSTORY_AGENT_NAME": "builder-x", "OVERSTORY_TASK_ID": "task-9", "OVERSTORY_BRANCH": "ov/builder-x",
           "OVERSTORY_PARENT": "lead-1"}
    message = only(state_db, sender="builder-x", to=None, type="worker_done", body="what I did", env=env)
    assert message.recipient == "lead-1"
    assert message.payload["task_id"] == "task-9"
    assert message.payload["branch"] == "ov/builder-x"
    assert message.payload["agent"] == "builder-x"
    # An explicit field wins over the environment.
    explicit = only(state_db, sender="builder-x", to=None, type="worker_done", env=env,
                    payload={"task_id": "other", "files_modified": ["a.py"]})
    assert explicit.payload["task_id"] == "other" and explicit.payload["files_modified"] == ["a.py"]


def test_sender_session_row_supplies_parent_task_and_branch(state_db):
    make_agent(state_db, "lead-1", capability="lead")
    make_agent(state_db, "builder-y", parent="lead-1", task_id="task-y", branch="ov/builder-y")
    message = only(state_db, sender="builder-y", to=None, type="merge_ready")
    assert message.recipient == "lead-1"
    assert message.payload == {"task_id": "task-y", "branch": "ov/builder-y", "agent": "builder-y",
                               "target_branch": None, "files_modified": []}


def test_protocol_mail_without_parent_goes_to_operator(state_db):
    env = {"OVERSTORY_AGENT_NAME": "solo", "OVERSTORY_TASK_ID": "t", "OVERSTORY_BRANCH": "ov/solo"}
    assert only(state_db, sender="solo", to=None, type="worker_done", env=env).recipient == "operator"


def test_dispatch_is_not_filled_from_the_senders_environment(state_db):
    env = {"OVERSTORY_AGENT_NAME": "lead-1", "OVERSTORY_TASK_ID": "lead-task"}
    with pytest.raises(PayloadError, match="task_id"):
        send(state_db, sender="lead-1", to="operator", type="dispatch", env=env)


# ---- recipients ----------------------------------------------------------------------


def test_broadcast_resolves_active_agents_minus_sender(state_db):
    make_agent(state_db, "lead-1", capability="lead")
    make_agent(state_db, "b1", parent="lead-1")
    make_agent(state_db, "b2", parent="lead-1", state="in_turn")
    make_agent(state_db, "b3", state="completed")
    make_agent(state_db, "b4", state="zombie")
    make_agent(state_db, "s1", capability="scout")

    ids = send(state_db, sender="lead-1", to="@all", subject="standup")
    assert sorted(mail.get(state_db, i).recipient for i in ids) == ["b1", "b2", "s1"]
    ids = send(state_db, sender="b1", to="@builders", subject="rebase")
    assert [mail.get(state_db, i).recipient for i in ids] == ["b2"]
    ids = send(state_db, to="@scouts", subject="look")
    assert [mail.get(state_db, i).recipient for i in ids] == ["s1"]
    with pytest.raises(MailError, match="no active reviewer agents"):
        send(state_db, to="@reviewers")
    with pytest.raises(UsageError, match="unknown broadcast address"):
        send(state_db, to="@wizards")


def test_terminal_agents_refuse_mail(state_db):
    make_agent(state_db, "done-1", state="completed")
    make_agent(state_db, "dead-1", state="zombie")
    with pytest.raises(MailError, match="done-1 is completed"):
        send(state_db, to="done-1")
    with pytest.raises(MailError, match="dead-1 is zombie"):
        send(state_db, to="dead-1", allow_unknown=True)
    assert state_db.execute("SELECT COUNT(*) FROM mail").fetchone()[0] == 0


def test_unknown_names_need_allow_unknown(state_db):
    with pytest.raises(MailError, match="no agent named 'buidler-1'.*--allow-unknown"):
        send(state_db, to="buidler-1")
    assert only(state_db, to="buidler-1", allow_unknown=True).recipient == "buidler-1"
    assert only(state_db, to="operator").recipient == "operator"


# ---- threads ------------------------------------------------------------------------


def test_replies_keep_the_thread_and_go_to_the_sender(state_db):
    make_agent(state_db, "b1")
    question = only(state_db, sender="b1", to="operator", type="question", subject="which db?", priority="high")
    answer_id = mail.reply(state_db, question.id, sender="operator", body="sqlite", env=NO_ENV)
    answer = mail.get(state_db, answer_id)
    assert answer.recipient == "b1" and answer.reply_to == question.id and answer.thread_id == question.id
    assert answer.subject == "Re: which db?" and answer.type == "result" and answer.priority == "high"
    again_id = mail.reply(state_db, answer_id, sender="b1", body="thanks", env=NO_ENV)
    again = mail.get(state_db, again_id)
    assert again.recipient == "operator" and again.thread_id == question.id and again.subject == "Re: which db?"
    assert again.type == "status"
    unrelated = only(state_db, to="operator", subject="other")
    thread = mail.list_messages(state_db, thread=question.id)
    assert [m.id for m in thread] == [question.id, answer_id, again_id]
    assert unrelated.id not in [m.id for m in thread]


def test_reply_to_a_missing_message_or_a_finished_agent_fails(state_db):
    with pytest.raises(MailError, match="no message #999"):
        mail.reply(state_db, 999, sender="operator", body="x", env=NO_ENV)
    with pytest.raises(MailError, match="no message #999"):
        send(state_db, to="operator", reply_to=999)
    generation = make_agent(state_db, "b1")
    first = only(state_db, sender="b1", to="operator")
    sessions.transition(state_db, "b1", generation, "completed", actor="test")
    with pytest.raises(MailError, match="completed"):
        mail.reply(state_db, first.id, sender="operator", body="too late", env=NO_ENV)


def test_reply_to_a_tool_sender_without_a_session_is_allowed(state_db):
    note = only(state_db, sender="watchdog", to="operator")
    assert mail.get(state_db, mail.reply(state_db, note.id, sender="operator", body="ok", env=NO_ENV)).recipient == "watchdog"


# ---- check, claims and delivery --------------------------------------------------------


def test_check_marks_read_unless_peek(state_db):
    make_agent(state_db, "b1")
    low = only(state_db, to="b1", priority="low", subject="low")
    urgent = only(state_db, to="b1", priority="urgent", subject="urgent")
    normal = only(state_db, to="b1", subject="normal")
    assert mail.pending_count(state_db, "b1") == 3
    assert [m.id for m in mail.unread(state_db, "b1", peek=True)] == [urgent.id, normal.id, low.id]
    assert mail.pending_count(state_db, "b1") == 3
    checked = mail.unread(state_db, "b1")
    assert [m.id for m in checked] == [urgent.id, normal.id, low.id]
    assert all(m.read_at is not None for m in checked)
    assert mail.unread(state_db, "b1") == [] and mail.pending_count(state_db, "b1") == 0


def test_claim_mark_read_and_release(state_db):
    make_agent(state_db, "b1")
    first = only(state_db, to="b1", subject="one")
    second = only(state_db, to="b1", subject="two", priority="high")
    claimed = mail.claim(state_db, "b1", "turn-1")
    assert [m.id for m in claimed] == [second.id, first.id]
    assert all(m.claimed_by == "turn-1" and m.claimed_at is not None for m in claimed)
    # Claimed mail is invisible to other claimers and to `check`.
    assert mail.claim(state_db, "b1", "turn-2") == []
    assert mail.unread(state_db, "b1", peek=True) == [] and mail.pending_count(state_db, "b1") == 0
    # The turn died: its mail goes back; a newer message arrives meanwhile.
    assert mail.release(state_db, "turn-1") == 2
    third = only(state_db, to="b1", subject="three")
    retried = mail.claim(state_db, "b1", "turn-3")
    assert [m.id for m in retried] == [second.id, first.id, third.id]
    assert mail.mark_read(state_db, "turn-3") == 3
    assert mail.release(state_db, "turn-3") == 0  # read mail is never handed out again
    assert mail.claim(state_db, "b1", "turn-4") == []
    assert all(mail.get(state_db, i).read_at is not None for i in (first.id, second.id, third.id))


def test_claim_joins_an_open_transaction(state_db):
    make_agent(state_db, "b1")
    message = only(state_db, to="b1")
    with pytest.raises(RuntimeError):
        with write_transaction(state_db):
            assert [m.id for m in mail.claim(state_db, "b1", "turn-1")] == [message.id]
            raise RuntimeError("turn failed to start")
    # Rolled back together with the caller's transaction.
    assert mail.get(state_db, message.id).claimed_by is None
    assert mail.pending_count(state_db, "b1") == 1


def test_release_agent_frees_claims_of_lost_turns(state_db):
    make_agent(state_db, "b1")
    only(state_db, to="b1")
    mail.claim(state_db, "b1", "turn-lost")
    assert mail.pending_count(state_db, "b1") == 0
    assert mail.release_agent(state_db, "b1") == 1
    assert mail.pending_count(state_db, "b1") == 1


def test_read_message_marks_read_only_for_its_recipient(state_db):
    make_agent(state_db, "b1")
    message = only(state_db, to="b1")
    assert mail.read_message(state_db, message.id, reader="operator").read_at is None
    assert mail.read_message(state_db, message.id, reader="b1").read_at is not None
    with pytest.raises(MailError, match="no message #77"):
        mail.read_message(state_db, 77, reader="b1")


# ---- insert_message and dedup -----------------------------------------------------------


def test_insert_message_inside_a_state_transition_is_deduplicated(state_db):
    make_agent(state_db, "lead-1", capability="lead")
    generation = make_agent(state_db, "b1", parent="lead-1", state="in_turn")

    def notify_parent(conn, ok):
        mail.insert_message(conn, sender="watchdog", recipient="lead-1", subject="b1 died", type="worker_died",
                            priority="high", payload={"agent": "b1", "reason": "process gone"},
                            dedup_key=f"worker_died:b1:{generation}")

    assert sessions.transition(state_db, "b1", generation, "zombie", actor="watchdog", then=notify_parent).ok
    # A second writer racing to the same conclusion finds the key taken.
    assert mail.insert_message(state_db, sender="watchdog", recipient="lead-1", subject="b1 died",
                               type="worker_died", dedup_key=f"worker_died:b1:{generation}") is None
    died = mail.list_messages(state_db, type="worker_died")
    assert len(died) == 1 and died[0].recipient == "lead-1" and died[0].priority == "high"
    assert died[0].thread_id == died[0].id


def test_send_with_dedup_key_sends_once(state_db):
    make_agent(state_db, "b1")
    make_agent(state_db, "b2")
    assert len(send(state_db, to="b1", dedup_key="k1")) == 1
    assert send(state_db, to="b1", dedup_key="k1") == []
    assert len(send(state_db, to="@builders", dedup_key="k2")) == 2
    assert send(state_db, to="@builders", dedup_key="k2") == []
    assert state_db.execute("SELECT COUNT(*) FROM mail").fetchone()[0] == 3


# ---- events -------------------------------------------------------------------------------


def test_every_send_records_a_mail_sent_event(state_db, events_db):
    make_agent(state_db, "b1")
    make_agent(state_db, "b2")
    ids = send(state_db, sender="lead-x", to="@builders", subject="sync", priority="urgent")
    recorded = events.query(events_db, kinds=["mail_sent"])
    assert sorted(e.data["id"] for e in recorded) == sorted(ids)
    assert {e.data["to"] for e in recorded} == {"b1", "b2"}
    assert all(e.agent == "lead-x" and e.data["priority"] == "urgent" and "sync" in e.summary for e in recorded)


def test_a_failing_event_store_does_not_lose_the_mail(state_db, project):
    broken = sqlite3.connect(":memory:")  # no events table
    try:
        ids = send(state_db, to="operator", events=broken)
        assert len(ids) == 1 and mail.get(state_db, ids[0]) is not None
        assert mail.record_sent(state_db, ids, events=broken) is False
    finally:
        broken.close()


# ---- list and purge ---------------------------------------------------------------------


def test_list_filters_and_never_marks_read(state_db):
    make_agent(state_db, "b1")
    ids = [only(state_db, to="b1", subject=f"m{i}", type="question" if i % 2 else "status").id for i in range(6)]
    only(state_db, sender="b1", to="operator", subject="back")
    assert [m.id for m in mail.list_messages(state_db, to="b1")] == ids
    assert [m.id for m in mail.list_messages(state_db, to="b1", limit=2)] == ids[-2:]
    assert [m.id for m in mail.list_messages(state_db, type="question")] == ids[1::2]
    assert [m.subject for m in mail.list_messages(state_db, sender="b1")] == ["back"]
    assert mail.pending_count(state_db, "b1") == 6
    mail.unread(state_db, "b1")
    assert mail.list_messages(state_db, to="b1", unread=True) == []
    future = mail.list_messages(state_db, since_ms=mail.get(state_db, ids[-1]).created_at + 60_000)
    assert future == []


def test_purge_keeps_undelivered_mail_of_active_agents(state_db):
    make_agent(state_db, "active")
    make_agent(state_db, "gone", state="completed")
    read_old = only(state_db, to="active", subject="read")
    mail.unread(state_db, "active")
    waiting = only(state_db, to="active", subject="waiting")
    in_flight = only(state_db, to="operator", subject="claimed")
    mail.claim(state_db, "operator", "turn-1")
    # Unread mail to an agent that completed since (send itself would refuse it now).
    mail.insert_message(state_db, sender="a", recipient="gone", subject="never read")
    day = 86_400_000
    # Nothing is older than a day yet.
    assert mail.purge(state_db, day) == 0
    later = read_old.created_at + 2 * day
    # Without include_unread only read mail goes: unread mail is never deleted by default.
    assert mail.purge(state_db, day, now=later) == 1
    assert {m.subject for m in mail.list_messages(state_db, limit=None)} == {"waiting", "claimed", "never read"}
    assert mail.count_unread_older(state_db, day, now=later) == 3
    deleted = mail.purge(state_db, day, include_unread=True, now=later)
    assert deleted == 1  # the unread one to a completed agent
    left = {m.subject for m in mail.list_messages(state_db, limit=None)}
    assert left == {"waiting", "claimed"}
    assert mail.get(state_db, waiting.id) is not None and mail.get(state_db, in_flight.id) is not None
    with pytest.raises(UsageError):
        mail.purge(state_db, -1)


# ---- rendering -----------------------------------------------------------------------------


def test_render_for_prompt_shows_every_header_payload_and_body(state_db):
    make_agent(state_db, "b1")
    plain = only(state_db, sender="lead-1", to="b1", subject="first", body="line 1\nline 2", priority="urgent")
    typed = only(state_db, to="b1", type="merged", subject="merged!", payload={"branch": "ov/b1", "tier": 1})
    text = mail_text.render_for_prompt(mail.claim(state_db, "b1", "turn-1"))
    assert text.startswith("You have 2 new messages")
    for message in (plain, typed):
        assert f"=== BEGIN MESSAGE #{message.id} ===" in text and f"=== END MESSAGE #{message.id} ===" in text
    assert "From: lead-1" in text and "Priority: urgent" in text and "Subject: first" in text
    assert "line 1\nline 2" in text and "Type: merged" in text
    assert 'Payload: {"agent": null, "branch": "ov/b1"' in text
    assert text.index(f"#{plain.id} ===") < text.index(f"#{typed.id} ===")  # urgent first
    assert mail_text.render_for_prompt([]) == ""


def test_render_inject_is_compact_and_empty_without_mail(state_db):
    assert mail_text.render_inject([]) == ""
    make_agent(state_db, "b1")
    only(state_db, to="b1", subject="short", body="a\nb")
    long = only(state_db, to="b1", subject="long", body="z" * 5000)
    block = mail_text.render_inject(mail.unread(state_db, "b1"))
    assert block.startswith("[ov mail] 2 new messages:")
    assert "  a\n  b" in block and f"ov mail read {long.id}" in block
    assert len(block) < 3000


def test_payload_json_text_is_stored_as_an_object(state_db):
    message = only(state_db, to="operator", payload={"k": [1, "two"], "ü": None})
    raw = state_db.execute("SELECT payload FROM mail WHERE id = ?", (message.id,)).fetchone()[0]
    assert json.loads(raw) == {"k": [1, "two"], "ü": None}
