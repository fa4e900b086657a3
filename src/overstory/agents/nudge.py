"""`ov nudge`: a high-priority ``nudge`` mail, announced at once in a tmux agent's idle pane.

The mail is committed first; typing the announcement into a tmux pane comes after
and may fail (the agent's driver then announces it when the pane is idle), so a
nudge is never lost and at worst announced late.
"""

from __future__ import annotations

import sqlite3
import typing as t
from dataclasses import dataclass

from overstory.paths import ProjectPaths
from overstory.store import mail, sessions

DEFAULT_SUBJECT = "nudge: check your mail and carry on"

TMUX_DELIVERY_NOTES = {
    "typed": "announced in the agent's tmux pane",
    "busy": "the agent's pane is busy: it is announced there as soon as the pane is idle",
    "announced": "the pane was told about this mail already",
    "gone": "the agent's tmux pane is gone",
    "type_failed": "could not type into the agent's pane just now: its driver announces the mail later",
}


@dataclass
class NudgeResult:
    ids: list[int]
    tmux_delivery: str | None = None  # None for headless agents (they read it at their next turn)
    pending: int | None = None  # not sent: this earlier nudge from the same sender still waits unread

    def as_dict(self) -> dict[str, t.Any]:
        found: dict[str, t.Any] = {"ids": self.ids}
        if self.tmux_delivery is not None:
            found["tmux_delivery"] = self.tmux_delivery
        if self.pending is not None:
            found["pending"] = self.pending
        return found


def nudge(project: ProjectPaths, conn: sqlite3.Connection, agent: str, message: str | None = None, *,
          sender: str | None = None, force: bool = False) -> NudgeResult:
    """Send ``agent`` a nudge (subject: the message's first line) and announce it in its tmux pane.

    While an earlier nudge from the same sender still waits for ``agent`` (unread, not
    claimed by a turn), another is not sent (``pending`` names it) unless ``force``: a
    nudge says "look at your mail", and saying it twice before it was heard adds nothing.
    The check and the send are not one transaction: two nudges at the same moment may
    both be sent, which costs one extra line of mail.
    """
    from overstory.store import mail_queries

    sender = sender or mail.default_sender()
    if not force:
        sessions_row = sessions.get(conn, agent)  # an unknown agent: mail.send says so, as before
        waiting = mail_queries.pending_nudge(conn, agent, sender) if sessions_row is not None else None
        if waiting is not None:
            return NudgeResult([], pending=waiting)
    text = message or ""
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    ids = mail.send(conn, sender=sender, to=agent, subject=first_line[:120] or DEFAULT_SUBJECT,
                    body=text, type="nudge", priority="high")
    if not ids or sessions.mode_of(conn, agent) != "tmux":
        return NudgeResult(ids)
    from overstory.agents.tmux.session import deliver_mail  # only for tmux agents: libtmux is not cheap to import
    from overstory.errors import TmuxError

    try:
        delivery = deliver_mail(project, conn, agent)
    except TmuxError:
        delivery = "type_failed"  # the mail is sent; the agent's driver announces it later
    return NudgeResult(ids, delivery)
