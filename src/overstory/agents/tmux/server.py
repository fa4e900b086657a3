"""The project's own tmux server, through libtmux: sockets, sessions, panes, captures.

Each project has its own tmux server (``tmux -L ov-<hash of the project root>``,
started with ov's own config file, so the operator's ``~/.tmux.conf`` and other
servers are never involved). libtmux is imported only inside functions.
"""

from __future__ import annotations

import hashlib
import shutil
import typing as t
from pathlib import Path

from overstory.errors import RuntimeNotAvailable
from overstory.names import validate_name
from overstory.paths import ProjectPaths

if t.TYPE_CHECKING:
    from libtmux.pane import Pane
    from libtmux.server import Server

TMUX_CONF = """\
# Written by ov: the tmux server on this project's own socket (not your ~/.tmux.conf).
# A pane whose program exits stays on screen, so ov can read why it died.
set -g remain-on-exit on
set -g history-limit 50000
set -g status-left "[ov #S] "
set -g status-left-length 40
"""


def socket_name(project: ProjectPaths) -> str:
    """The project's own tmux socket: ``ov-`` + a short hash of its resolved root."""
    digest = hashlib.sha1(str(Path(project.root).resolve()).encode("utf-8")).hexdigest()[:10]
    return f"ov-{digest}"


def session_name(agent_name: str) -> str:
    """The tmux session of an agent: its name, with ``.`` (a tmux target separator) mapped.

    Agent names are ``[a-z0-9._-]``; a name with a dot gets ``_`` for each dot plus
    ``+`` and a short hash of the real name, and ``+`` never occurs in an agent name,
    so two agents can never share a session.
    """
    name = validate_name(agent_name, "agent name")
    if "." not in name and ":" not in name:
        return name
    mapped = name.replace(".", "_").replace(":", "_")
    return f"{mapped}+{hashlib.sha1(name.encode('utf-8')).hexdigest()[:6]}"


def attach_command(project: ProjectPaths, tmux_session: str, *, read_only: bool = False) -> list[str]:
    """The exact command that attaches a terminal to an agent's session."""
    command = [shutil.which("tmux") or "tmux", "-L", socket_name(project), "attach-session"]
    if read_only:
        command.append("-r")
    return [*command, "-t", f"={tmux_session}"]


def tmux_available() -> bool:
    return shutil.which("tmux") is not None


def server(project: ProjectPaths) -> Server:
    """The project's tmux server (not started until a session is created on it)."""
    import libtmux

    if not tmux_available():
        raise RuntimeNotAvailable("tmux mode needs tmux on PATH (apt install tmux / brew install tmux)")
    conf = project.run_dir / "tmux.conf"
    if not conf.exists() or conf.read_text(encoding="utf-8") != TMUX_CONF:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(TMUX_CONF, encoding="utf-8")
    return libtmux.Server(socket_name=socket_name(project), config_file=str(conf))


def find_pane(tmux: Server, tmux_session: str) -> Pane | None:
    """The single pane of ``tmux_session``, or None if the session (or the server) is gone."""
    found = tmux.sessions.get(session_name=tmux_session, default=None)
    return None if found is None else found.active_pane


def capture_pane(pane: Pane, *, history: bool = False) -> str | None:
    from libtmux import exc as tmux_exc

    try:
        lines = pane.capture_pane(start="-" if history else None)
    except tmux_exc.LibTmuxException:
        return None
    return "\n".join(lines or [])


def list_sessions(project: ProjectPaths) -> list[str]:
    """Names of the sessions on the project's socket ([] when no server runs)."""
    if not tmux_available():
        return []
    return sorted(s.session_name for s in server(project).sessions if s.session_name)


def capture(project: ProjectPaths, tmux_session: str, *, history: bool = False) -> str | None:
    """The text on an agent's pane (with scroll-back if ``history``); None if it has no session."""
    if not tmux_available():
        return None
    pane = find_pane(server(project), tmux_session)
    return capture_pane(pane, history=history) if pane is not None else None


def kill_session_by_name(project: ProjectPaths, tmux_session: str) -> bool:
    """Kill a session of the project's socket by name (for sessions no agent owns)."""
    if not tmux_available():
        return False
    return server(project).cmd("kill-session", "-t", f"={tmux_session}").returncode == 0

