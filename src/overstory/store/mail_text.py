"""Mail as text: for a person (``ov mail read/check``), for a hook's context (``--inject``) and for the
user message of a turn. Standard library only, like ``store.mail``: `ov mail check` is a hot command."""

from __future__ import annotations

from overstory import jsontext as json
from overstory import printable
from overstory.clock import iso

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t

    from overstory.store.mail import Message


def _headers(message: Message) -> list[str]:
    lines = [
        f"From: {message.sender}",
        f"To: {message.recipient}",
        f"Type: {message.type}",
        f"Priority: {message.priority}",
        f"Subject: {message.subject}",
        f"Sent: {iso(message.created_at)}",
    ]
    if message.reply_to is not None or message.thread_id != message.id:
        reply = f" (reply to #{message.reply_to})" if message.reply_to is not None else ""
        lines.append(f"Thread: #{message.thread_id}{reply}")
    if message.payload is not None:
        lines.append(f"Payload: {json.dumps(message.payload, ensure_ascii=False, sort_keys=True)}")
    return lines


def render_message(message: Message) -> str:
    """One message for a person: headers, a blank line, the body; the sender's control characters escaped
    (``printable``: each header stays on its line, the body keeps only its newlines and tabs)."""
    text = printable.lines([f"Message #{message.id}", *_headers(message)])
    return f"{text}\n\n{printable.block(message.body)}" if message.body else text


def render_for_prompt(messages: t.Sequence[Message]) -> str:
    """How claimed mail is written into the user message of a turn.

    Each message is fenced by begin/end lines that carry its id, so a body that
    looks like headers cannot be mistaken for another message.
    """
    if not messages:
        return ""
    count = len(messages)
    parts = [f"You have {count} new message{'s' if count != 1 else ''} (most urgent first)."]
    for message in messages:
        block = [f"=== BEGIN MESSAGE #{message.id} ===", *_headers(message), ""]
        block.append(message.body if message.body else "(no body)")
        block.append(f"=== END MESSAGE #{message.id} ===")
        parts.append("\n".join(block))
    parts.append("Reply with `ov mail reply ID --body ...` or send with `ov mail send`.")
    return "\n\n".join(parts)


INJECT_BODY_LIMIT = 2000


def render_inject(messages: t.Sequence[Message], *, body_limit: int = INJECT_BODY_LIMIT) -> str:
    """A compact block for a hook to add to a model's context (escaped as ``render_message`` is); empty when
    there is no mail."""
    if not messages:
        return ""
    count = len(messages)
    lines = [f"[ov mail] {count} new message{'s' if count != 1 else ''}:"]
    for message in messages:
        payload = f" payload={json.dumps(message.payload, ensure_ascii=False, sort_keys=True)}" if message.payload else ""
        lines.append(printable.line(f"#{message.id} from {message.sender} [{message.type}/{message.priority}] "
                                    f"{message.subject}{payload}"))
        body = message.body
        if len(body) > body_limit:
            body = body[:body_limit] + f" … (truncated; `ov mail read {message.id}` for all of it)"
        if body:
            lines.extend(f"  {printable.line(line)}" for line in body.splitlines())
    lines.append("[ov mail] reply with `ov mail reply ID --body ...`")
    return "\n".join(lines)
