"""`ov mail check --debounce SECONDS`: a message reported less than SECONDS ago is not reported again.

A hook that runs `ov mail check --peek --inject` on every prompt or tool call would put the
same waiting mail in front of the model each time; with ``--debounce 300`` each message is
shown at most once every five minutes. Without ``--peek`` a shown message is marked read
anyway; one left out for the debounce is left unread too (``store.mail.unread``'s
``leave``), so nothing is lost: it is shown once the time has passed.

What was reported when is a small JSON file per recipient (``.overstory/run/mail-check/
NAME.json``: message id -> ms), written after the report is printed: a check killed in
between reports the same mail again next time (at least once, never lost). Two checks
at once may both report a message; the file keeps the later writer's view. Entries
older than a day are dropped. Inside a sandboxed turn the endpoint keeps the file.
Standard library only: `ov mail check` is a hot command.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
    import typing as t

    from overstory.store.mail import Message

KEEP_MS = 86_400_000


def state_path(run_dir: t.Any, recipient: str) -> str:
    if not recipient or recipient.startswith(".") or "/" in recipient or "\0" in recipient:
        raise ValueError(f"not a mailbox name: {recipient!r}")
    return os.path.join(str(run_dir), "mail-check", recipient + ".json")


def _load(path: str) -> dict[str, int]:
    import json  # here: a check without --debounce never loads it

    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in found.items() if isinstance(v, int)} if isinstance(found, dict) else {}


def recently_reported(path: str, seconds: float, now: int) -> set[int]:
    """Ids of messages reported less than ``seconds`` before ``now`` (ms)."""
    window = int(seconds * 1000)
    return {int(k) for k, at in _load(path).items() if k.isdigit() and now - at < window}


def remember(path: str, ids: t.Iterable[int], now: int) -> None:
    """Record that ``ids`` were reported at ``now``; atomic (a reader sees the old file or the new one)."""
    import json

    ids = list(ids)
    if not ids:
        return
    entries = {k: at for k, at in _load(path).items() if now - at < KEEP_MS}
    entries.update({str(i): now for i in ids})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    scratch = f"{path}.{os.getpid()}.tmp"
    with open(scratch, "w", encoding="utf-8") as handle:
        json.dump(entries, handle)
    os.replace(scratch, path)


def checked_mail(conn: sqlite3.Connection, who: str, *, peek: bool, debounce: float | None,
                 project_option: str | None = None, run_dir: t.Any = None) -> list[Message]:
    """``store.mail.unread``, leaving out (and unread) what was reported less than ``debounce`` seconds ago."""
    from overstory.store import mail as store

    if not debounce:
        return store.unread(conn, who, peek=peek)
    from overstory.clock import now_ms
    from overstory.errors import UsageError

    if run_dir is None:
        from overstory.paths import OV_DIR_NAME, locate_project

        run_dir = os.path.join(locate_project(project_option), OV_DIR_NAME, "run")  # ProjectPaths.run_dir
    try:
        path = state_path(run_dir, who)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    now = now_ms()
    messages = store.unread(conn, who, peek=peek, leave=recently_reported(path, debounce, now))
    try:
        remember(path, (m.id for m in messages), now)
    except OSError:  # a read-only place: the mail is shown, only the debounce is lost
        pass
    return messages
