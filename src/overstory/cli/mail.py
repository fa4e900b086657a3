"""`ov mail …` and `ov nudge`.

`mail send` and `mail check` are hot: their bodies live in ``cli.hot`` (no click), which
`ov`'s fast entry point (``cli.fast``) calls directly after parsing the same options.
"""

from __future__ import annotations

import os

import click

from overstory.cli import hot
from overstory.cli._common import (
    ROW_ID,
    agent_channel,
    completer,
    echo_json,
    json_option,
    project_option,
    project_paths,
    state_conn,
    usage_errors,
)
from overstory.cli.main import SuggestingGroup
from overstory.store import mail as store

body_option = click.option("--body", help="Message text; `-` reads it from stdin.")
body_file_option = click.option("--body-file", type=click.Path(exists=True, dir_okay=False),
                                help="Read the message text from this file (at most 1 MiB).")
# Static so that `--help` needs no pydantic; test_mail_cli checks it against the models.
PAYLOAD_FIELDS_HELP = """\b
Protocol payload fields ([optional]):
dispatch: task_id [capability] [spec_path] [base_branch] [file_scope]
worker_done: task_id branch agent [files_modified] [commit]
worker_died: agent reason [task_id] [generation] [previous_state] [branch] [last_activity]
merge_ready: task_id branch agent [target_branch] [files_modified]
merged: branch tier [agent] [task_id] [target_branch] [commit] [commits]
merge_failed: branch reason [agent] [task_id] [target_branch] [tier] [conflict_files]
escalation: severity [task_id] [agent]
decision_gate: options [recommended] [task_id] [agent] [approval_id]
"""

from_option = click.option("from_", "--from", metavar="NAME",
                           help="Sender (default: $OVERSTORY_AGENT_NAME, else operator).")


@click.group(name="mail", cls=SuggestingGroup)
def mail() -> None:
    """Send, check, list and reply to mail between agents and the operator.

    \b
    ov mail send --to builder-task-42 --subject "also fix the docs" --body "..."
    ov mail check                  # your unread mail (marks it read)
    ov mail list --unread --json
    ov mail reply 12 --body "yes, go ahead"
    """


@mail.command(name="send", epilog=PAYLOAD_FIELDS_HELP)
@click.option("--to", "to", metavar="AGENT|@all|@<capability>s", shell_complete=completer("complete_recipients"),
              help="Recipient; protocol types default to the sender's parent.")
@click.option("--subject", required=True, help="One-line subject.")
@body_option
@body_file_option
@click.option("--type", "type_", type=click.Choice(store.TYPES), default="status", show_default=True,
              help="Message type; protocol types need a --payload.")
@click.option("--priority", type=click.Choice(list(store.PRIORITIES)), default="normal", show_default=True)
@click.option("--payload", help="JSON object (required fields for protocol types, free-form otherwise).")
@click.option("--reply-to", type=ROW_ID, metavar="ID", help="Message this answers (joins its thread).")
@from_option
@click.option("--allow-unknown", is_flag=True, help="Send to a name that is not a known agent.")
@json_option
def mail_send(to: str | None, subject: str, body: str | None, body_file: str | None, type_: str, priority: str,
              payload: str | None, reply_to: int | None, from_: str | None, allow_unknown: bool,
              as_json: bool) -> None:
    """Send a message; prints `sent #ID to NAME` per recipient (--json: the ids).

    Inside an agent, protocol payload fields the environment knows (task_id,
    branch, agent) are filled in, and --to defaults to the agent's parent.

    \b
    ov mail send --to builder-task-42 --subject "rebase first" --body "main moved"
    ov mail send --to @builders --subject "freeze" --priority urgent
    ov mail send --type worker_done --subject done --body "what I did"
    git diff | ov mail send --to lead-1 --subject "my diff" --body -
    """
    with usage_errors():
        hot.mail_send(project_option(), to=to, subject=subject, body=body, body_file=body_file, type_=type_,
                      priority=priority, payload=payload, reply_to=reply_to, from_=from_,
                      allow_unknown=allow_unknown, as_json=as_json)


@mail.command(name="check")
@click.option("--agent", metavar="NAME", shell_complete=completer("complete_agents"), help="Whose mail (default: $OVERSTORY_AGENT_NAME, else operator).")
@click.option("--peek", is_flag=True, help="Show without marking read.")
@click.option("--inject", is_flag=True, help="Compact block for a hook to inject into a model's context "
                                             "(prints nothing when there is no mail).")
@click.option("--debounce", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Leave out (and unread) mail this mailbox was shown less than SECONDS ago.")
@json_option
def mail_check(agent: str | None, peek: bool, inject: bool, debounce: float | None, as_json: bool) -> None:
    """Show unread mail (not yet claimed by a turn) and mark it read unless --peek.

    --debounce SECONDS, for a hook that checks often: a message shown less than
    SECONDS ago is not shown again (nor marked read) until they have passed.

    \b
    ov mail check
    ov mail check --agent lead-1 --peek --json
    ov mail check --inject        # in a hook
    ov mail check --peek --inject --debounce 300   # a hook on every prompt: each message once per 5 minutes
    """
    with usage_errors():
        hot.mail_check(project_option(), agent=agent, peek=peek, inject=inject, debounce=debounce, as_json=as_json)


@mail.command(name="list")
@click.option("--to", "to", metavar="NAME", help="Only mail to this recipient.")
@click.option("from_", "--from", metavar="NAME", help="Only mail from this sender.")
@click.option("--type", "type_", type=click.Choice(store.TYPES), help="Only this type.")
@click.option("--unread", is_flag=True, help="Only unread mail.")
@click.option("--thread", type=ROW_ID, metavar="ID", help="Only this thread.")
@click.option("--since", metavar="10m|2h|ISO", help="Only mail sent since then.")
@click.option("--limit", type=click.IntRange(1, ROW_ID.max), default=50, show_default=True,
              help="Show the newest N matches.")
@json_option
def mail_list(to: str | None, from_: str | None, type_: str | None, unread: bool, thread: int | None,
              since: str | None, limit: int, as_json: bool) -> None:
    """List mail, oldest first. Never marks anything read.

    \b
    ov mail list --to operator --unread
    ov mail list --thread 12 --json
    ov mail list --since 2h --type worker_done
    """
    since_ms = None
    if since is not None:
        from overstory.clock import parse_since

        try:
            since_ms = parse_since(since)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    remote = agent_channel()
    if remote is not None:
        from overstory.agents.outbox import message_from_dict

        messages = [message_from_dict(m) for m in remote.call("mail.list", {
            "to": to, "from": from_, "type": type_, "unread": unread, "thread": thread, "since_ms": since_ms,
            "limit": limit})]
    else:
        conn = state_conn(project_paths())
        messages = store.list_messages(conn, to=to, sender=from_, type=type_, unread=unread, thread=thread,
                                       since_ms=since_ms, limit=limit)
    if as_json:
        echo_json([m.as_dict() for m in messages])
        return
    if not messages:
        click.echo("No mail.")
        return
    from overstory.clock import iso
    from overstory.printable import line

    for m in messages:  # one line each: the subject is the sender's text, escaped (``printable``)
        state = "read" if m.is_read else ("claimed" if m.claimed_by else "unread")
        if m.superseded_by is not None:
            state = f"never delivered: generation {m.superseded_by} took the name"
        thread_mark = f" thread #{m.thread_id}" if m.thread_id != m.id else ""
        click.echo(line(f"#{m.id:<5} {iso(m.created_at)}  {m.sender} -> {m.recipient}  "
                        f"[{m.type}/{m.priority}] {m.subject}  ({state}{thread_mark})"))


@mail.command(name="read")
@click.argument("message_id", type=ROW_ID, metavar="ID")
@json_option
def mail_read(message_id: int, as_json: bool) -> None:
    """Show one message in full. Marks it read if it is addressed to you.

    \b
    ov mail read 12
    """
    remote = agent_channel()
    if remote is not None:
        from overstory.agents.outbox import message_from_dict

        message = message_from_dict(remote.call("mail.read", {"id": message_id}))
    else:
        message = store.read_message(state_conn(project_paths()), message_id, reader=store.default_sender())
    if as_json:
        echo_json(message.as_dict())
    else:
        from overstory.store.mail_text import render_message

        click.echo(render_message(message))


@mail.command(name="reply")
@click.argument("message_id", type=ROW_ID, metavar="ID")
@body_option
@body_file_option
@from_option
@json_option
def mail_reply(message_id: int, body: str | None, body_file: str | None, from_: str | None, as_json: bool) -> None:
    """Reply to a message: goes to its sender, in the same thread. Says what it sent (--json: the id).

    \b
    ov mail reply 12 --body "yes, go ahead"
    """
    if body is None and body_file is None:
        raise click.UsageError("give the reply text with --body TEXT, --body - or --body-file F")
    with usage_errors():
        text = hot.read_body(body, body_file)
    remote = agent_channel()
    if remote is not None:  # inside an agent's sandbox: its endpoint replies, as the agent itself
        sent = remote.call("mail.reply", {"id": message_id, "body": text, "from": from_})
        new_id, recipient = sent["id"], sent["to"]
    else:
        from overstory.agents.outbox import reply_once

        # From an agent's turn, idempotent per dispatch (agents.outbox).
        new_id, recipient = reply_once(state_conn(project_paths()), os.environ, message_id,
                                       sender=from_ or store.default_sender(), body=text)
    if as_json:
        echo_json({"id": new_id, "reply_to": message_id})
    else:
        click.echo(f"sent #{new_id} to {recipient} (reply to #{message_id})")


@mail.command(name="delete")
@click.argument("message_id", type=ROW_ID, metavar="ID")
@click.option("--force", is_flag=True, help="Delete it even if it is unread (it is then never delivered).")
@json_option
def mail_delete(message_id: int, force: bool, as_json: bool) -> None:
    """Delete one message (the operator only). Unread mail is kept unless --force;
    mail a running turn is reading is always kept.

    \b
    ov mail delete 42
    ov mail delete 43 --force     # unread: its recipient never gets it
    """
    from overstory import printable
    from overstory.errors import NotPermitted

    if agent_channel() is not None or os.environ.get("OVERSTORY_AGENT_NAME"):
        raise NotPermitted("only the operator deletes mail; an agent marks its mail read by checking it")
    deleted = store.delete(state_conn(project_paths()), message_id, force=force)
    if as_json:
        echo_json({"deleted": deleted.id, "to": deleted.recipient, "from": deleted.sender,
                   "was_unread": deleted.read_at is None})
    else:
        click.echo(f"deleted #{deleted.id} ({deleted.sender} -> {deleted.recipient}: "
                   f"{printable.line(deleted.subject)})")


@mail.command(name="purge")
@click.option("--older-than", required=True, metavar="DURATION", help="e.g. 7d, 12h.")
@click.option("--include-unread", is_flag=True,
              help="Also delete unread mail (mail still waiting for an active agent is always kept).")
@json_option
def mail_purge(older_than: str, include_unread: bool, as_json: bool) -> None:
    """Delete old mail that has been read. Says how many messages went.

    Unread mail is kept unless --include-unread; even then, mail still waiting
    for an agent that is not finished (or claimed by a running turn) is kept.

    \b
    ov mail purge --older-than 7d
    ov mail purge --older-than 30d --include-unread
    """
    from overstory.clock import parse_duration

    try:
        age_ms = int(parse_duration(older_than) * 1000)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    conn = state_conn(project_paths())
    deleted = store.purge(conn, age_ms, include_unread=include_unread)
    unread_kept = store.count_unread_older(conn, age_ms)
    if as_json:
        echo_json({"deleted": deleted, "unread_kept": unread_kept})
        return
    line = f"Deleted {deleted} message{'s' if deleted != 1 else ''} older than {older_than}."
    if unread_kept:
        line += (f" Kept {unread_kept} unread" + ("" if include_unread else " (--include-unread deletes those too)")
                 + ".")
    click.echo(line)


@click.command(name="nudge")
@click.argument("agent", shell_complete=completer("complete_agents"))
@click.argument("message", required=False)
@click.option("from_", "--from", metavar="NAME", help="Send it as NAME (the operator only; default: "
                                                        "$OVERSTORY_AGENT_NAME, else operator).")
@click.option("--force", is_flag=True, help="Send it even while an earlier nudge from the same sender waits unread.")
@json_option
def nudge(agent: str, message: str | None, from_: str | None, force: bool, as_json: bool) -> None:
    """Send AGENT a high-priority nudge (delivered at its next turn).

    A tmux-mode agent whose pane is idle gets it announced in its pane at once;
    if the pane is busy, its driver types the announcement when it becomes idle.
    While an earlier nudge from the same sender still waits unread, another is not
    sent (it says which one waits) unless --force. --from NAME sends it as NAME
    (e.g. for a script acting for a lead); an agent's nudge always comes from itself.

    \b
    ov nudge builder-task-42
    ov nudge builder-task-42 "you have been quiet for 10 minutes; report status"
    ov nudge builder-task-42 --from lead-1 --force
    """
    import os

    from overstory.agents.nudge import TMUX_DELIVERY_NOTES, NudgeResult
    from overstory.agents.nudge import nudge as send_nudge
    from overstory.errors import NotPermitted
    from overstory.names import validate_name

    remote = agent_channel()
    me = os.environ.get("OVERSTORY_AGENT_NAME")
    if from_ is not None:
        validate_name(from_, "--from")
        if (remote is not None or me) and from_ != me:
            raise NotPermitted(f"{me or 'an agent'} cannot nudge as {from_!r}: an agent's nudge always comes from "
                               "itself; only the operator sends as another name")
    if remote is not None:  # inside an agent: through its endpoint
        result = NudgeResult(**remote.call("nudge", {"agent": agent, "message": message, "force": force}))
    else:
        project = project_paths()
        result = send_nudge(project, state_conn(project), agent, message, sender=from_, force=force)
    if as_json:
        echo_json(result.as_dict())
    elif result.pending is not None:
        click.echo(f"not sent: nudge #{result.pending} to {agent} still waits unread (--force sends another)")
    else:
        for message_id in result.ids:
            click.echo(f"sent #{message_id} (nudge) to {agent}")
        if result.tmux_delivery is not None:
            click.echo(TMUX_DELIVERY_NOTES.get(result.tmux_delivery, result.tmux_delivery), err=True)
