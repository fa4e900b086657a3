"""The bodies of the hot commands, without click: `ov mail send`, `ov mail check`, `ov status`.

The click commands (cli/mail.py, cli/status.py) and the fast entry point (cli/fast.py)
both call these after parsing, so there is one implementation of what each command
does and prints. Only the standard library and ov's stdlib-only core are imported
here, and ``typing`` not at all (hot commands are timed against `python -c pass`).

A usage error found after parsing (two body options, a payload that is not JSON) is
raised as ``BadUsage``: the click command turns it into click's own usage error, and
the fast path asks click to show it, so click stays the one source of usage messages.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # typing costs milliseconds on a hot path
if TYPE_CHECKING:
    import sqlite3
    import typing as t

    from overstory.store.mail import Message


class BadUsage(Exception):
    """A command line that parsed but makes no sense; click shows it with the command's usage (exit 2)."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param_hint = param_hint


# ---- output, as click.echo does it for text -----------------------------------------------------

# What click strips from text written to something that is not a terminal (CSI sequences).
_ANSI = "\x1b"


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\033\[[0-?]*[ -/]*[@-~]", "", text)


def echo(text: str, *, err: bool = False) -> None:
    """Write one line and flush; ANSI styles are dropped unless the stream is a terminal (like click.echo)."""
    stream = sys.stderr if err else sys.stdout
    if _ANSI in text:
        try:
            terminal = stream.isatty()
        except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
            terminal = False
        if not terminal:
            text = _strip_ansi(text)
    stream.write(text + "\n")
    stream.flush()


def echo_json(document: t.Any) -> None:
    echo(json.dumps(document, indent=2, ensure_ascii=False, default=str))


def one_line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text else text


def debug_requested(argv: t.Sequence[str]) -> bool:
    return os.environ.get("OV_DEBUG", "") not in ("", "0") or any(a in ("-v", "--verbose") for a in argv[:3])


# ---- shared pieces ------------------------------------------------------------------------------


def open_state_db(project_option: str | None) -> sqlite3.Connection:
    from overstory.paths import locate_project, state_db_path
    from overstory.store.db import open_state

    return open_state(state_db_path(locate_project(project_option)))


def read_body(body: str | None, body_file: str | None) -> str:
    """--body TEXT, --body - (stdin) or --body-file F, decoded as UTF-8 without newline translation."""
    if body is not None and body_file is not None:
        raise BadUsage("give either --body or --body-file, not both")
    from overstory.limits import read_at_most
    from overstory.store.mail import MAX_BODY_BYTES

    if body_file is not None:
        raw = read_at_most(body_file, MAX_BODY_BYTES, f"the body file {body_file}")
    elif body == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        if stdin is None:  # a text stream without a byte buffer (rare): its text, as UTF-8
            stdin = _Encoded(sys.stdin)
        raw = read_at_most(stdin, MAX_BODY_BYTES, "the body on stdin")
    else:
        return body or ""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadUsage(f"the body is not valid UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_payload(text: str | None) -> t.Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadUsage(f"not valid JSON: {exc}", param_hint="--payload") from None
    except RecursionError:
        from overstory.store.payload_shape import MAX_DEPTH

        raise BadUsage(f"nested too deeply (at most {MAX_DEPTH} levels of lists/objects)",
                       param_hint="--payload") from None


class _Encoded:
    """A text stream read as UTF-8 bytes."""

    def __init__(self, stream: t.Any) -> None:
        self.stream = stream

    def read(self, size: int = -1) -> bytes:
        return str(self.stream.read(size)).encode("utf-8", errors="surrogateescape")


def recipients_of(conn: sqlite3.Connection, ids: list[int]) -> dict[int, str]:
    """Message id -> recipient, for saying what was sent."""
    if not ids:
        return {}
    rows = conn.execute(f"SELECT id, recipient FROM mail WHERE id IN ({','.join('?' * len(ids))})", ids).fetchall()
    return {int(r["id"]): r["recipient"] for r in rows}


# ---- the commands -------------------------------------------------------------------------------


def count_tool_call(env: t.Mapping[str, str]) -> str | None:
    """Count the call against the agent's budget (one SQLite statement); the reason to deny it, or None."""
    agent, root, generation = (env.get("OVERSTORY_AGENT_NAME"), env.get("OVERSTORY_PROJECT_ROOT"),
                               env.get("OVERSTORY_GENERATION", ""))
    if not agent or not root or not generation.isdigit():
        return None
    from overstory.store.tool_count import count_tool_call as count

    return count(os.path.join(root, ".overstory", "state.db"), agent, int(generation))


def guard(project_option: str | None, *, post: bool = False) -> None:
    """`ov guard` (PreToolUse) and `ov guard --post` (PostToolUse): the one body both parsers call."""
    try:
        stdin = getattr(sys.stdin, "buffer", None)
        raw = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8", errors="replace")
        text: str | None = raw.decode("utf-8", errors="replace")
    except OSError:
        text = None
    from overstory.agents import ledger

    if post:
        ledger.hook_post(text, os.environ)
        return
    from overstory import guards

    stdout, stderr, status = guards.guard_reply(
        text, os.environ, count_call=lambda: count_tool_call(os.environ),
        record=lambda hook_input, decision: ledger.hook_pre(hook_input, decision, os.environ))
    if stdout:
        echo(stdout)
    if stderr:
        echo(stderr, err=True)
    if status:
        sys.exit(status)


def mail_send(project_option: str | None, *, to: str | None = None, subject: str, body: str | None = None,
              body_file: str | None = None, type_: str = "status", priority: str = "normal",
              payload: str | None = None, reply_to: int | None = None, from_: str | None = None,
              allow_unknown: bool = False, as_json: bool = False) -> None:
    from overstory.store import mail as store
    from overstory.store.dispatch import agent_key, sent_before

    text = read_body(body, body_file)
    conn = open_state_db(project_option)
    try:
        sender = from_ or store.default_sender()
        parsed = parse_payload(payload)
        # From an agent's turn, idempotent per dispatch: a retried turn's identical send gets the first one's ids.
        key = agent_key(os.environ, "mail", sender, to, type_, subject, text, parsed, reply_to, priority)
        ids = sent_before(conn, key)
        if not ids:
            if type_ == "worker_done":  # the real commit and files, from git, where the agent left them out
                from overstory.agents.work_report import fill_worker_done
                from overstory.paths import find_project

                parsed = fill_worker_done(find_project(project_option), conn, sender, parsed)
            ids = store.send(conn, sender=sender, to=to, subject=subject, body=text, type=type_, priority=priority,
                             payload=parsed, reply_to=reply_to, allow_unknown=allow_unknown,
                             dedup_key=key) or sent_before(conn, key)
        recipients = recipients_of(conn, ids)
    finally:
        conn.close()
    if as_json:
        echo_json({"ids": ids, "to": [recipients[i] for i in ids]})
    else:
        for message_id in ids:
            echo(f"sent #{message_id} to {recipients[message_id]}")


def mail_check(project_option: str | None, *, agent: str | None = None, peek: bool = False, inject: bool = False,
               as_json: bool = False) -> None:
    from overstory.store import mail as store

    if inject and as_json:
        raise BadUsage("--inject and --json do not go together")
    conn = open_state_db(project_option)
    try:
        who = agent or store.default_sender()
        messages: list[Message] = store.unread(conn, who, peek=peek)
    finally:
        conn.close()
    if as_json:
        echo_json([m.as_dict() for m in messages])
    elif inject:
        if messages:
            echo(store.render_inject(messages))
    elif not messages:
        echo(f"No new mail for {who}.")
    else:
        echo("\n\n".join(store.render_message(m) for m in messages))


def status(project_option: str | None, *, include_completed: bool = False, as_json: bool = False) -> None:
    from overstory import status as core
    from overstory.paths import locate_project, state_db_path

    path = state_db_path(locate_project(project_option))
    if not os.path.exists(path):
        document = core.collect_empty()
    else:
        from overstory.store.db import open_state

        conn = open_state(path)
        try:
            document = core.collect(conn, include_completed=include_completed)
        finally:
            conn.close()
    if as_json:
        echo_json(document)
    else:
        echo(core.render_text(document))
