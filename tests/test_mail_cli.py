"""`ov mail …` and `ov nudge` through click's CliRunner and as real `ov` processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from conftest import ov_command, run_ov
from overstory.cli.main import cli
from overstory.errors import MailError, PayloadError
from overstory.store import mail, sessions


@pytest.fixture
def ov(project):
    """Run `ov --project ROOT …` in-process; returns the click Result."""
    runner = CliRunner()

    def invoke(*args: str, input: str | bytes | None = None, env: dict[str, str] | None = None):
        return runner.invoke(cli, ["--project", str(project.root), *args], input=input, env=env)

    return invoke


def add_agent(state_db, name: str, *, capability: str = "builder", state: str | None = None,
              parent: str = "operator") -> None:
    generation = sessions.create_session(state_db, name=name, capability=capability, task_id=f"task-{name}",
                                         runtime="scripted", actor="test", parent=parent, branch=f"ov/{name}")
    if state is not None:
        assert sessions.transition(state_db, name, generation, state, actor="test").ok


SENT_LINE = re.compile(r"^sent #(\d+) (?:\(nudge\) )?to (\S+)$")


def sent_ids(result) -> list[int]:
    """The ids in `sent #ID to NAME` lines (every line of the output must be one)."""
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.output.splitlines()
    matches = [SENT_LINE.match(line) for line in lines]
    assert lines and all(matches), result.output
    return [int(m.group(1)) for m in matches if m]


# ---- the checks named in the issue, as real processes ---------------------------------


def test_send_then_check_shows_it_once(project):
    sent = run_ov("mail", "send", "--to", "operator", "--subject", "hi", "--body", "there", cwd=project.root)
    assert sent.returncode == 0, sent.stderr
    first = run_ov("mail", "check", "--json", cwd=project.root)
    assert first.returncode == 0, first.stderr
    messages = json.loads(first.stdout)
    assert sent.stdout.startswith("sent #") and sent.stdout.rstrip().endswith(" to operator")
    sent_id = int(sent.stdout.split("#")[1].split()[0])
    assert [(m["id"], m["subject"], m["body"], m["from"]) for m in messages] == [(sent_id, "hi", "there", "operator")]
    second = run_ov("mail", "check", "--json", cwd=project.root)
    assert json.loads(second.stdout) == []


def test_protocol_type_without_payload_exits_nonzero_naming_it(project):
    result = run_ov("mail", "send", "--type", "worker_done", "--to", "x", "--subject", "s", cwd=project.root)
    assert result.returncode == 1
    assert "payload" in result.stderr and "task_id" in result.stderr
    assert result.stderr.startswith("ov: error:") and result.stderr.count("\n") == 1


def test_errors_are_one_line_with_the_right_exit_code(project, state_db):
    add_agent(state_db, "done-1", state="completed")
    refused = run_ov("mail", "send", "--to", "done-1", "--subject", "s", cwd=project.root)
    assert refused.returncode == 1 and "done-1 is completed" in refused.stderr
    no_to = run_ov("mail", "send", "--subject", "s", cwd=project.root)
    assert no_to.returncode == 2 and "--to is required" in no_to.stderr
    bad_type = run_ov("mail", "send", "--to", "operator", "--subject", "s", "--type", "gossip", cwd=project.root)
    assert bad_type.returncode == 2
    assert mail.list_messages(state_db) == []


def test_agent_reports_worker_done_with_nothing_but_subject_and_body(project, state_db):
    add_agent(state_db, "lead-1", capability="lead")
    add_agent(state_db, "builder-a", parent="lead-1")
    env = {"OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_TASK_ID": "task-a", "OVERSTORY_BRANCH": "ov/builder-a"}
    result = run_ov("mail", "send", "--type", "worker_done", "--subject", "done", "--body", "what I did",
                    "--json", cwd=project.root, env=env)
    assert result.returncode == 0, result.stderr
    [message_id] = json.loads(result.stdout)["ids"]
    message = mail.get(state_db, message_id)
    assert (message.sender, message.recipient, message.type) == ("builder-a", "lead-1", "worker_done")
    assert message.payload["task_id"] == "task-a" and message.payload["agent"] == "builder-a"


def test_stdin_body_round_trips_bytes_exactly(project):
    body = "tabs\tquotes'\"|pipes\r\nCRLF\x00nul\x1b[0m\n\nend 🙂\n"
    sent = subprocess.run([*ov_command(), "mail", "send", "--to", "operator", "--json",
                           "--subject", "stdin", "--body", "-"], cwd=project.root, input=body.encode(),
                          capture_output=True)
    assert sent.returncode == 0, sent.stderr
    read = run_ov("mail", "read", str(json.loads(sent.stdout)["ids"][0]), "--json", cwd=project.root)
    assert json.loads(read.stdout)["body"] == body


# ---- CliRunner: options and output ------------------------------------------------------


def test_body_file_round_trip_and_conflicting_body_options(ov, tmp_path, state_db):
    body = "from a file\r\nwith CRLF and \x00 and \u2028\n"
    path = tmp_path / "body.txt"
    path.write_bytes(body.encode())
    [message_id] = sent_ids(ov("mail", "send", "--to", "operator", "--subject", "f", "--body-file", str(path)))
    assert mail.get(state_db, message_id).body == body
    both = ov("mail", "send", "--to", "operator", "--subject", "f", "--body", "x", "--body-file", str(path))
    assert both.exit_code == 2 and "not both" in both.output
    path.write_bytes(b"\xff\xfe not utf-8")
    bad = ov("mail", "send", "--to", "operator", "--subject", "f", "--body-file", str(path))
    assert bad.exit_code == 2 and "not valid UTF-8" in bad.output


def test_payload_option(ov, state_db):
    bad_json = ov("mail", "send", "--to", "operator", "--subject", "s", "--payload", "{nope")
    assert bad_json.exit_code == 2 and "--payload" in bad_json.output
    wrong = ov("mail", "send", "--to", "operator", "--subject", "s", "--type", "merged", "--payload", '{"branch": "b"}')
    assert isinstance(wrong.exception, PayloadError) and "tier" in str(wrong.exception)
    [message_id] = sent_ids(ov("mail", "send", "--to", "operator", "--subject", "s", "--type", "merged",
                               "--payload", '{"branch": "ov/x", "tier": 1}', "--priority", "urgent"))
    message = mail.get(state_db, message_id)
    assert message.payload["tier"] == 1 and message.priority == "urgent"


def test_send_json_lists_every_broadcast_id(ov, state_db):
    add_agent(state_db, "b1")
    add_agent(state_db, "b2")
    add_agent(state_db, "s1", capability="scout")
    result = ov("mail", "send", "--to", "@builders", "--subject", "all hands", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["to"] == ["b1", "b2"] and len(document["ids"]) == 2
    everyone = sent_ids(ov("mail", "send", "--to", "@all", "--subject", "x", "--from", "b1"))
    assert sorted(mail.get(state_db, i).recipient for i in everyone) == ["b2", "s1"]


def test_unknown_recipient_needs_allow_unknown(ov, state_db):
    refused = ov("mail", "send", "--to", "nobody", "--subject", "s")
    assert isinstance(refused.exception, MailError) and "--allow-unknown" in str(refused.exception)
    assert sent_ids(ov("mail", "send", "--to", "nobody", "--subject", "s", "--allow-unknown"))


def test_from_defaults_to_the_agent_name(ov, state_db):
    [first] = sent_ids(ov("mail", "send", "--to", "operator", "--subject", "s", env={"OVERSTORY_AGENT_NAME": "b9"}))
    [second] = sent_ids(ov("mail", "send", "--to", "operator", "--subject", "s", "--from", "someone"))
    assert mail.get(state_db, first).sender == "b9" and mail.get(state_db, second).sender == "someone"


def test_check_defaults_to_the_agent_and_peek_keeps_mail_unread(ov, state_db):
    add_agent(state_db, "b1")
    [message_id] = sent_ids(ov("mail", "send", "--to", "b1", "--subject", "todo", "--body", "the body"))
    peeked = ov("mail", "check", "--agent", "b1", "--peek", "--json")
    assert [m["id"] for m in json.loads(peeked.output)] == [message_id]
    as_agent = ov("mail", "check", env={"OVERSTORY_AGENT_NAME": "b1"})
    assert as_agent.exit_code == 0 and "Subject: todo" in as_agent.output and "the body" in as_agent.output
    assert "No new mail for b1." in ov("mail", "check", "--agent", "b1").output
    assert ov("mail", "check").output == "No new mail for operator.\n"


def test_check_inject_with_and_without_mail(ov, state_db):
    add_agent(state_db, "b1")
    empty = ov("mail", "check", "--agent", "b1", "--inject")
    assert empty.exit_code == 0 and empty.output == ""
    sent_ids(ov("mail", "send", "--to", "b1", "--subject", "rebase", "--body", "main moved", "--priority", "high"))
    block = ov("mail", "check", "--agent", "b1", "--inject")
    assert block.exit_code == 0
    assert block.output.startswith("[ov mail] 1 new message:")
    assert "from operator [status/high] rebase" in block.output and "  main moved" in block.output
    assert ov("mail", "check", "--agent", "b1", "--inject").output == ""  # it was marked read
    assert ov("mail", "check", "--inject", "--json").exit_code == 2


def test_claimed_mail_is_not_shown_by_check(ov, state_db):
    add_agent(state_db, "b1")
    sent_ids(ov("mail", "send", "--to", "b1", "--subject", "for the turn"))
    mail.claim(state_db, "b1", "turn-1")
    assert json.loads(ov("mail", "check", "--agent", "b1", "--json").output) == []


def test_list_filters_and_never_marks_read(ov, state_db):
    add_agent(state_db, "b1")
    ids = [sent_ids(ov("mail", "send", "--to", "b1", "--subject", f"m{i}", "--type", t))[0]
           for i, t in enumerate(["status", "question", "status"])]
    listed = json.loads(ov("mail", "list", "--to", "b1", "--json").output)
    assert [m["id"] for m in listed] == ids and all(m["read_at"] is None for m in listed)
    assert [m["id"] for m in json.loads(ov("mail", "list", "--type", "question", "--json").output)] == [ids[1]]
    assert [m["id"] for m in json.loads(ov("mail", "list", "--limit", "1", "--json").output)] == [ids[2]]
    assert len(json.loads(ov("mail", "list", "--since", "10m", "--unread", "--json").output)) == 3
    assert json.loads(ov("mail", "list", "--since", "2099-01-01T00:00:00Z", "--json").output) == []
    assert ov("mail", "list", "--since", "yesterday").exit_code == 2
    text = ov("mail", "list", "--from", "operator")
    assert text.exit_code == 0 and text.output.count("operator -> b1") == 3 and "(unread)" in text.output
    assert mail.pending_count(state_db, "b1") == 3


def test_read_reply_and_thread(ov, state_db):
    add_agent(state_db, "b1")
    [question] = sent_ids(ov("mail", "send", "--to", "operator", "--from", "b1", "--type", "question",
                             "--subject", "which port?"))
    shown = ov("mail", "read", str(question))
    assert shown.exit_code == 0 and "Subject: which port?" in shown.output and "Type: question" in shown.output
    assert mail.get(state_db, question).read_at is not None  # addressed to the operator, who read it
    replied = ov("mail", "reply", str(question), "--body", "8080", "--json")
    answer = json.loads(replied.output)
    assert answer["reply_to"] == question
    message = mail.get(state_db, answer["id"])
    assert (message.recipient, message.thread_id, message.type, message.subject) == ("b1", question, "result", "Re: which port?")
    thread = json.loads(ov("mail", "list", "--thread", str(question), "--json").output)
    assert [m["id"] for m in thread] == [question, answer["id"]]
    assert ov("mail", "reply", str(question)).exit_code == 2  # no body given
    missing = ov("mail", "read", "4242")
    assert isinstance(missing.exception, MailError)


def test_purge(ov, state_db):
    sent_ids(ov("mail", "send", "--to", "operator", "--subject", "s"))
    state_db.execute("UPDATE mail SET created_at = created_at - 8 * 86400000")
    sent_ids(ov("mail", "send", "--to", "operator", "--subject", "fresh"))
    result = ov("mail", "purge", "--older-than", "7d", "--json")
    assert json.loads(result.output) == {"deleted": 0, "unread_kept": 1}, "unread mail is never purged by default"
    plain = ov("mail", "purge", "--older-than", "7d")
    assert plain.output.strip() == ("Deleted 0 messages older than 7d. Kept 1 unread "
                                    "(--include-unread deletes those too).")
    mail.unread(state_db, "operator")  # read both
    sent_ids(ov("mail", "send", "--to", "operator", "--subject", "old but unread"))
    state_db.execute("UPDATE mail SET created_at = created_at - 8 * 86400000 WHERE subject != 'fresh'")
    assert ov("mail", "purge", "--older-than", "7d").output.strip() == (
        "Deleted 1 message older than 7d. Kept 1 unread (--include-unread deletes those too).")
    assert {m.subject for m in mail.list_messages(state_db)} == {"fresh", "old but unread"}
    forced = ov("mail", "purge", "--older-than", "7d", "--include-unread", "--json")
    assert json.loads(forced.output) == {"deleted": 1, "unread_kept": 0}
    assert [m.subject for m in mail.list_messages(state_db)] == ["fresh"]
    assert ov("mail", "purge", "--older-than", "soon").exit_code == 2
    assert ov("mail", "purge").exit_code == 2


def test_nudge(ov, state_db):
    add_agent(state_db, "b1")
    [plain] = sent_ids(ov("nudge", "b1"))
    [worded] = sent_ids(ov("nudge", "b1", "report status\nplease", env={"OVERSTORY_AGENT_NAME": "lead-1"}))
    first, second = mail.get(state_db, plain), mail.get(state_db, worded)
    assert (first.type, first.priority, first.sender, first.recipient) == ("nudge", "high", "operator", "b1")
    assert (second.sender, second.subject, second.body) == ("lead-1", "report status", "report status\nplease")
    refused = ov("nudge", "nobody")
    assert isinstance(refused.exception, MailError)


@pytest.mark.parametrize("command", ["send", "check", "list", "read", "reply", "purge", "delete"])
def test_every_subcommand_has_help(ov, command):
    result = ov("mail", command, "--help")
    assert result.exit_code == 0 and "Usage:" in result.output and "ov mail" in result.output


def test_send_help_lists_the_payload_fields_of_every_protocol_type(ov):
    from overstory.cli.mail import PAYLOAD_FIELDS_HELP
    from overstory.store.mail_payloads import describe_types

    assert PAYLOAD_FIELDS_HELP.strip().splitlines()[2:] == describe_types().splitlines()
    assert "worker_done: task_id branch agent" in ov("mail", "send", "--help").output


# ---- the hot path stays light ---------------------------------------------------------------

HEAVY = ("pydantic", "yaml", "rich", "git", "libtmux", "anthropic")

IMPORT_PROBE = textwrap.dedent("""
    import json, sys
    from overstory.cli.main import cli
    for args in json.loads(sys.argv[1]):
        cli.main(args=args, prog_name="ov", standalone_mode=False)
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(json.loads(sys.argv[2])))
    print(json.dumps(heavy))
""")


def loaded_heavy_modules(project, *commands: list[str]) -> list[str]:
    calls = [["--project", str(project.root), *c] for c in commands]
    result = subprocess.run([sys.executable, "-c", IMPORT_PROBE, json.dumps(calls), json.dumps(HEAVY)],
                            capture_output=True, text=True, cwd=project.root, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_send_and_check_import_nothing_heavy(project):
    heavy = loaded_heavy_modules(
        project,
        ["mail", "send", "--to", "operator", "--subject", "s", "--body", "b", "--priority", "high"],
        ["mail", "check", "--json"],
        ["mail", "check", "--inject"],
    )
    assert heavy == []


def test_the_probe_does_see_a_heavy_import(project):
    """Control for the test above: a protocol type does load pydantic (and only that)."""
    heavy = loaded_heavy_modules(
        project,
        ["mail", "send", "--to", "operator", "--subject", "s", "--type", "merged", "--payload",
         '{"branch": "ov/a", "tier": 1}'],
    )
    assert heavy == ["pydantic"]


# ---- ov mail delete, ov mail check --debounce, ov nudge --from/--force ----------------------


def test_mail_delete_keeps_unread_and_claimed_mail_unless_forced(project, state_db):
    add_agent(state_db, "b1")
    [read_one, claimed] = [mail.send(state_db, sender="operator", to="b1", subject=s)[0]
                           for s in ("old news", "in a turn")]
    mail.read_message(state_db, read_one, reader="b1")
    assert [m.id for m in mail.claim(state_db, "b1", "turn-y")] == [claimed]  # a turn is reading it
    [unread] = mail.send(state_db, sender="operator", to="b1", subject="still waiting")

    def ov(*args, **env):
        return run_ov("mail", "delete", *args, cwd=project.root, env=env or None)

    done = ov(str(read_one), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"deleted": read_one, "to": "b1", "from": "operator", "was_unread": False}
    kept = ov(str(unread))
    assert kept.returncode == 1 and "is unread" in kept.stderr and "--force" in kept.stderr
    in_turn = ov(str(claimed), "--force")
    assert in_turn.returncode == 1 and "claimed by turn turn-y" in in_turn.stderr
    assert ov(str(read_one)).returncode == 1, "no such message any more"
    agent = ov(str(unread), "--force", OVERSTORY_AGENT_NAME="b1")
    assert agent.returncode == 1 and "only the operator" in agent.stderr
    assert sorted(m.id for m in mail.list_messages(state_db)) == [claimed, unread]
    forced = ov(str(unread), "--force")
    assert forced.returncode == 0 and forced.stdout.startswith(f"deleted #{unread} (operator -> b1: still waiting)")
    assert [m.id for m in mail.list_messages(state_db)] == [claimed]
    assert ov("abc").returncode == 2


def test_mail_check_debounce_shows_a_message_once_per_window(project, state_db):
    first = mail.send(state_db, sender="operator", to="operator", subject="one")[0]

    def check(*args: str) -> list[int]:
        done = run_ov("mail", "check", "--json", *args, cwd=project.root)
        assert done.returncode == 0, done.stderr
        return [m["id"] for m in json.loads(done.stdout)]

    assert check("--peek", "--debounce", "3600") == [first]
    assert check("--peek", "--debounce", "3600") == [], "shown a moment ago: not again within the hour"
    second = mail.send(state_db, sender="operator", to="operator", subject="two")[0]
    assert check("--peek", "--debounce", "3600") == [second], "new mail is shown at once"
    assert check("--peek") == [first, second], "without --debounce everything waiting is shown"
    assert check("--debounce", "0.000001") == [first, second], "the window has passed"
    assert check() == [], "and it was marked read then"
    third = mail.send(state_db, sender="operator", to="operator", subject="three")[0]
    assert check("--peek", "--debounce", "3600") == [third]
    assert check("--debounce", "3600") == [], "left out for the debounce..."
    assert not mail.get(state_db, third).is_read, "...and so left unread, not lost"
    assert run_ov("mail", "check", "--debounce", "-1", cwd=project.root).returncode == 2


def test_nudge_waits_for_the_last_one_unless_forced_and_from_names_the_sender(project, state_db):
    add_agent(state_db, "b1")

    def nudge(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_ov("nudge", "b1", *args, cwd=project.root, env=env or None)

    first = nudge("--json")
    [first_id] = json.loads(first.stdout)["ids"]
    again = nudge()
    assert again.returncode == 0 and f"not sent: nudge #{first_id} to b1 still waits unread" in again.stdout
    forced = nudge("--force", "--json")
    assert forced.returncode == 0 and len(json.loads(forced.stdout)["ids"]) == 1
    as_lead = nudge("--from", "lead-1", "report status", "--json")
    [lead_id] = json.loads(as_lead.stdout)["ids"]
    assert mail.get(state_db, lead_id).sender == "lead-1", "a nudge from another sender is not held back"
    assert "still waits" in nudge("--from", "lead-1").stdout
    mail.unread(state_db, "b1")  # b1 read its mail: the next nudge goes out
    assert json.loads(nudge("--json").stdout)["ids"]
    impostor = nudge("--from", "lead-1", OVERSTORY_AGENT_NAME="b2")
    assert impostor.returncode == 1 and "cannot nudge as 'lead-1'" in impostor.stderr
    assert nudge("--from", "not a name").returncode != 0
    nudges = [m for m in mail.list_messages(state_db) if m.type == "nudge"]
    assert [m.sender for m in nudges] == ["operator", "operator", "lead-1", "operator"]
