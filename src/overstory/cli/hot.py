"""The bodies of the hot commands, without click: `ov mail send`, `ov mail check`, `ov status`, `ov guard`.

The click commands (cli/mail.py, cli/status.py) and the fast entry point (cli/fast.py)
both call these after parsing, so there is one implementation of what each command
does and prints. Only the standard library and ov's stdlib-only core are imported
here, and ``typing`` not at all (hot commands are timed against `python -c pass`).

A usage error found after parsing (two body options, a payload that is not JSON) is
raised as ``BadUsage``: the click command turns it into click's own usage error, and
the fast path asks click to show it, so click stays the one source of usage messages.

Inside an agent's sandboxed turn (``OVERSTORY_ENDPOINT`` and its token are set) the
databases are read-only, so each body asks the agent's endpoint instead (``agent_channel``);
the endpoint client is imported only then, so the operator's commands and an unsandboxed
agent's never load it.
"""

from __future__ import annotations

import os
import sys

from overstory import jsontext

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
    """``re.sub(r"\\033\\[[0-?]*[ -/]*[@-~]", "", text)``, as click does, without importing re."""
    out, start = [], 0
    while (found := text.find("\x1b[", start)) >= 0:
        end = found + 2
        while end < len(text) and "0" <= text[end] <= "?":
            end += 1
        while end < len(text) and " " <= text[end] <= "/":
            end += 1
        if end < len(text) and "@" <= text[end] <= "~":
            out.append(text[start:found])
            start = end + 1
        else:  # not a whole CSI sequence: kept, and the search goes on after its ESC
            out.append(text[start:found + 1])
            start = found + 1
    out.append(text[start:])
    return "".join(out)


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
    from overstory import printable  # not for `ov guard`, which prints no agent's text of its own

    echo(printable.json_text(jsontext.dumps(document, indent=2, ensure_ascii=False, default=str)))


def one_line(text: str) -> str:
    """An error message on one line; what it quotes of an agent's text cannot drive the terminal."""
    from overstory import printable

    return printable.line(" ".join(text.split()) if "\n" in text else text)


def debug_requested(argv: t.Sequence[str]) -> bool:
    return os.environ.get("OV_DEBUG", "") not in ("", "0") or any(a in ("-v", "--verbose") for a in argv[:3])


# ---- errors at the CLI boundary -----------------------------------------------------------------


def json_requested(argv: t.Sequence[str]) -> bool:
    """``--json`` is one of the command line's words (before a lone ``--``): its errors are JSON too."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def error_kind(exc: BaseException) -> str:
    """An ov error's class name in snake case (``AgentNotFound`` -> ``agent_not_found``); the base class: ``error``."""
    name = type(exc).__name__
    if name == "OrchestratorError":
        return "error"
    return "".join(("_" if index and char.isupper() else "") + char.lower() for index, char in enumerate(name))


def report(exc: BaseException, argv: t.Sequence[str]) -> int:
    """The one place an exception that reached the CLI boundary is shown, and the exit code it means.

    Both entry points call it (``cli.fast.run`` and ``cli.main.main``), so a command prints the same
    whichever of them parsed it. As text: ``ov: error: ...`` (one line), click's own usage message for
    a command line click refused, ``ov: internal error: ...`` for a bug. With ``--json`` on the command
    line: ``{"error": {"kind": ..., "message": ...}}`` as one line on stderr, with the same exit code.
    """
    from overstory.errors import OrchestratorError

    if isinstance(exc, BrokenPipeError):
        return 0
    click = sys.modules.get("click")  # a click exception means click is loaded; this module never imports it
    show_click = None
    if click is not None and isinstance(exc, click.exceptions.Abort):
        kind, message, code, text = "aborted", "aborted", 1, "ov: aborted"
    elif click is not None and isinstance(exc, click.ClickException):
        kind = "usage_error" if isinstance(exc, click.UsageError) else "error"
        message, code, text, show_click = exc.format_message(), exc.exit_code, "", exc.show
    elif isinstance(exc, OrchestratorError):
        if debug_requested(argv):
            import traceback

            traceback.print_exception(exc)
        kind, message, code = error_kind(exc), one_line(str(exc)), exc.exit_code
        text = f"ov: error: {message}"
    elif isinstance(exc, KeyboardInterrupt):
        kind, message, code, text = "interrupted", "interrupted", 130, "ov: interrupted"
    else:  # a bug in ov, or a failure of the system underneath it: still one line unless asked for more
        if debug_requested(argv):
            raise exc
        from overstory.cli.failures import describe

        known = describe(exc, argv)
        if known is not None:
            kind, message, code = "system_error", one_line(known), 1
            text = f"ov: error: {message}"
        else:
            kind, message, code = "internal_error", f"{type(exc).__name__}: {one_line(str(exc))}", 1
            text = f"ov: internal error: {message} (run with -v or OV_DEBUG=1 for the traceback)"
    if json_requested(argv):
        echo(jsontext.dumps({"error": {"kind": kind, "message": message}}, ensure_ascii=False), err=True)
    elif show_click is not None:
        show_click()
    else:
        echo(text, err=True)
    return code


# ---- shared pieces ------------------------------------------------------------------------------


def open_state_db(project_option: str | None) -> sqlite3.Connection:
    from overstory.paths import locate_project, state_db_path
    from overstory.store.db import open_state

    return open_state(state_db_path(locate_project(project_option)))


def read_body(body: str | None, body_file: str | None) -> str:
    """--body TEXT, --body - (stdin) or --body-file F, decoded as UTF-8 without newline translation."""
    if body is not None and body_file is not None:
        raise BadUsage("give either --body or --body-file, not both")
    if body_file is None and body != "-":
        return body or ""
    from overstory.limits import read_at_most
    from overstory.store.mail import MAX_BODY_BYTES

    if body_file is not None:
        raw = read_at_most(body_file, MAX_BODY_BYTES, f"the body file {body_file}")
    elif body == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        if stdin is None:  # a text stream without a byte buffer (rare): its text, as UTF-8
            stdin = _Encoded(sys.stdin)
        raw = read_at_most(stdin, MAX_BODY_BYTES, "the body on stdin")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadUsage(f"the body is not valid UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_payload(text: str | None) -> t.Any:
    if text is None:
        return None
    try:
        return jsontext.loads(text)
    except ValueError as exc:  # json.JSONDecodeError
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


ENDPOINT_ENV, TOKEN_ENV = "OVERSTORY_ENDPOINT", "OVERSTORY_ENDPOINT_TOKEN"  # as in overstory.endpoint.client
GUARD_TIMEOUT_SECONDS = 30.0  # the endpoint's count and ledger row are a few statements; a hung loop must not hold a call


def agent_channel(env: t.Mapping[str, str] = os.environ) -> t.Any:
    """Inside an agent's sandboxed turn, its authenticated channel to ov (``overstory.endpoint.client``); else None.

    The client (and the socket module) are imported only when the turn's variables are there.
    """
    if not env.get(ENDPOINT_ENV) or not env.get(TOKEN_ENV):
        return None
    from overstory.endpoint.client import channel

    return channel(env)


# ---- the commands -------------------------------------------------------------------------------


class _StateDb:
    """state.db for one `ov guard` call (a turn without an endpoint), opened on first use and shared by the budget
    count and the ledger row: each opening costs a schema parse. ``get`` raises what opening raised, to each."""

    def __init__(self, env: t.Mapping[str, str]) -> None:
        root = env.get("OVERSTORY_PROJECT_ROOT")
        self.path = os.path.join(root, ".overstory", "state.db") if root else None
        self.conn: sqlite3.Connection | None = None
        self.failure: Exception | None = None

    def get(self) -> sqlite3.Connection:
        if self.conn is None and self.failure is None:
            if self.path is None or not os.path.isfile(self.path):  # never created here: an agent's guard writes
                self.failure = FileNotFoundError(f"no state.db at {self.path}")  # into a project that exists
            else:
                try:
                    from overstory.store.db import open_state

                    self.conn = open_state(self.path)
                except Exception as exc:  # noqa: BLE001 - each user says what it does without it
                    self.failure = exc
        if self.failure is not None:
            raise self.failure
        assert self.conn is not None
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def count_tool_call(env: t.Mapping[str, str], state: _StateDb) -> str | None:
    """Count the call against the agent's budget on state.db (a turn without an endpoint); the reason to deny
    it, or None. A count that cannot be made allows the call (``store.tool_count``)."""
    agent, generation = env.get("OVERSTORY_AGENT_NAME"), env.get("OVERSTORY_GENERATION", "")
    if not agent or not generation.isdigit():
        return None
    try:
        conn = state.get()
    except Exception:  # noqa: BLE001 - as store.tool_count: no database, no count
        return None
    from overstory.store.tool_count import count_on

    return count_on(conn, agent, int(generation))


def _ledger_through(remote: t.Any, route: str, args: dict[str, t.Any]) -> t.Any:
    """A receipt through the endpoint; None (and a warning) when it cannot be written: the call already ran."""
    from overstory.errors import EndpointError

    try:
        return remote.call(route, args, timeout=GUARD_TIMEOUT_SECONDS)
    except EndpointError as exc:
        echo(f"ov guard: the tool-call ledger was not written ({exc})", err=True)
        return None


def guard(project_option: str | None, *, post: bool = False) -> None:
    """`ov guard` (PreToolUse) and `ov guard --post` (PostToolUse): the one body both parsers call.

    In a turn whose environment names an endpoint, the agent's loop judges, counts and records
    the call (route ``guard``). If it cannot be asked (the loop is gone or hung, the secret is
    refused), the call is refused: uncounted and unrecorded it could outrun the budget, repeat a
    side effect or skip an approval gate (fail closed, issue 28).
    """
    try:
        stdin = getattr(sys.stdin, "buffer", None)
        raw = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8", errors="replace")
        text: str | None = raw.decode("utf-8", errors="replace")
    except OSError:
        text = None
    remote = agent_channel() if os.environ.get("OVERSTORY_AGENT_NAME") else None
    if post:
        if remote is not None:  # inside the sandbox state.db is read-only: the endpoint writes the receipt
            if text:
                _ledger_through(remote, "ledger.post", {"hook_input": text})
            return
        from overstory.agents import ledger

        ledger.hook_post(text, os.environ)
        return
    if remote is not None:
        answer, why = _judged_by_endpoint(remote, text) if text is not None else (None, "")
        if answer is None:  # refused in the asking CLI's dialect (the guard's own reason first, if it has one)
            from overstory import guards

            refusal = (f"ov: refused: ov could not be reached to count and record this call ({why}); end your "
                       "turn (the agent's loop may be gone).")
            answer = guards.guard_reply(text, os.environ, count_call=lambda: refusal)
        _reply(*answer)
        return
    from overstory import guards
    from overstory.agents import ledger

    state = _StateDb(os.environ)

    def record(hook_input: t.Any, decision: t.Any) -> t.Any:
        return ledger.hook_pre(hook_input, decision, os.environ, connection=state.get)

    try:
        stdout, stderr, status = guards.guard_reply(text, os.environ, count_call=lambda: count_tool_call(os.environ,
                                                                                                         state),
                                                    record=record)
    finally:
        state.close()
    _reply(stdout, stderr, status)


def _judged_by_endpoint(remote: t.Any, text: str) -> tuple[tuple[str, str, int] | None, str]:
    """The agent's loop judges the call (route ``guard``): it has the guard's modules loaded, so this process
    imports none of them. (None, why) when the endpoint cannot answer."""
    from overstory.errors import EndpointError

    try:
        answer = remote.call("guard", {"text": text}, timeout=GUARD_TIMEOUT_SECONDS)
    except EndpointError as exc:
        return None, one_line(str(exc))
    if not isinstance(answer, dict) or not isinstance(answer.get("status"), int):
        return None, "its answer was not a guard decision"
    return (str(answer.get("stdout") or ""), str(answer.get("stderr") or ""), answer["status"]), ""


def _reply(stdout: str, stderr: str, status: int) -> None:
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
    text = read_body(body, body_file)
    parsed = parse_payload(payload)
    remote = agent_channel()
    if remote is not None:  # inside an agent's sandbox: its endpoint sends, always as the agent itself
        sent = remote.call("mail.send", {"to": to, "subject": subject, "body": text, "type": type_,
                                         "priority": priority, "payload": parsed, "reply_to": reply_to,
                                         "from": from_, "allow_unknown": allow_unknown})
        ids = [int(i) for i in sent["ids"]]
        recipients = dict(zip(ids, sent["to"]))
        held = sent.get("held") or sent.get("note")
    else:
        from overstory.agents.outbox import send_once
        from overstory.store import mail as store

        conn = open_state_db(project_option)
        try:
            def project() -> t.Any:
                from overstory.paths import find_project

                return find_project(project_option)

            # From an agent's turn, idempotent per dispatch: a retried turn's identical send gets the first one's ids.
            ids, recipients, held = send_once(conn, os.environ, project, sender=from_ or store.default_sender(),
                                              to=to, subject=subject, body=text, type_=type_, priority=priority,
                                              payload=parsed, reply_to=reply_to, allow_unknown=allow_unknown)
        finally:
            conn.close()
    if as_json:
        echo_json({"ids": ids, "to": [recipients[i] for i in ids], **({"note" if ids else "held": held} if held else {})})
    else:
        for message_id in ids:
            echo(f"sent #{message_id} to {recipients[message_id]}")
        if held:
            echo(f"ov: {held}")


def mail_check(project_option: str | None, *, agent: str | None = None, peek: bool = False, inject: bool = False,
               debounce: float | None = None, as_json: bool = False) -> None:
    from overstory.store import mail as store

    if inject and as_json:
        raise BadUsage("--inject and --json do not go together")
    who = agent or store.default_sender()
    remote = agent_channel()
    if remote is not None:  # the agent's own mailbox, through its endpoint (which keeps the debounce file)
        from overstory.agents.outbox import message_from_dict

        messages: list[Message] = [message_from_dict(m) for m in remote.call("mail.check", {
            "agent": agent, "peek": peek, **({"debounce": debounce} if debounce is not None else {})})]
    else:
        conn = open_state_db(project_option)
        try:
            from overstory.agents.mail_debounce import checked_mail

            messages = checked_mail(conn, who, peek=peek, debounce=debounce, project_option=project_option)
        finally:
            conn.close()
    if as_json:
        echo_json([m.as_dict() for m in messages])
    elif not messages:
        if not inject:
            echo(f"No new mail for {who}.")
    else:
        from overstory.store import mail_text

        echo(mail_text.render_inject(messages) if inject else "\n\n".join(map(mail_text.render_message, messages)))


def status(project_option: str | None, *, include_completed: bool = False, as_json: bool = False,
           capability: str | None = None, state: str | None = None, parent: str | None = None,
           run_ref: str | None = None) -> None:
    from overstory.views.selection import Selection

    selection = Selection(capability, state, parent, run_ref)  # a usage error before anything is opened
    remote = agent_channel()
    if remote is not None:
        document = remote.call("status", {"all": include_completed, **selection.as_dict()})
    else:
        from overstory.paths import locate_project, state_db_path
        from overstory.views import status as core

        path = state_db_path(locate_project(project_option))
        if not os.path.exists(path):
            document = core.collect_empty()
        else:
            from overstory.store.db import open_state

            conn = open_state(path)
            try:
                document = core.collect(conn, include_completed=include_completed, selection=selection)
            finally:
                conn.close()
    if as_json:
        echo_json(document)
    else:
        from overstory.views import status as core

        echo(core.render_text(document, filtered=not selection.empty))
