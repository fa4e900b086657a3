"""`ov nudge`: a high-priority mail, announced at once in a tmux agent's idle pane."""

from __future__ import annotations

import sqlite3
import typing as t

from overstory.paths import ProjectPaths
from overstory.store import mail


def nudge(project: ProjectPaths, conn: sqlite3.Connection, *, sender: str, agent: str,
          message: str | None) -> dict[str, t.Any]:
    """Send ``agent`` a nudge; returns ``{"ids": [...], "tmux_delivery": None | what happened in its pane}``."""
    text = message or ""
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    subject = first_line[:120] or "nudge: check your mail and carry on"
    ids = mail.send(conn, sender=sender, to=agent, subject=subject, body=text, type="nudge", priority="high")
    delivery = None
    mode = conn.execute("SELECT mode FROM sessions WHERE name = ?", (agent,)).fetchone()
    if ids and mode is not None and mode[0] == "tmux":
        from overstory.agents.tmux import deliver_mail  # only for tmux agents: libtmux is not cheap to import
        from overstory.errors import TmuxError

        try:
            delivery = deliver_mail(project, conn, agent)
        except TmuxError:
            delivery = "type_failed"  # the mail is sent; the agent's driver announces it later
    return {"ids": ids, "tmux_delivery": delivery}
