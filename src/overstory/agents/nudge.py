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

    def as_dict(self) -> dict[str, t.Any]:
        return {"ids": self.ids} if self.tmux_delivery is None else {"ids": self.ids,
                                                                     "tmux_delivery": self.tmux_delivery}


def nudge(project: ProjectPaths, conn: sqlite3.Connection, agent: str, message: str | None = None, *,
          sender: str | None = None) -> NudgeResult:
    """Send ``agent`` a nudge (subject: the message's first line) and announce it in its tmux pane."""
    text = message or ""
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    ids = mail.send(conn, sender=sender or mail.default_sender(), to=agent, subject=first_line[:120] or DEFAULT_SUBJECT,
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
