"""tmux mode: an agent's interactive TUI runs in a tmux session on the project's own server.

An agent's session is named after the agent (``tmux_server``). Life of a tmux agent:

1. ``start_agent`` (called by ``ov sling --tmux``) writes the TUI's command line and
   environment to ``.overstory/run/<agent>/tmux-launch.json`` (mode 0600: it may hold
   an API key) and opens a session whose only pane runs
   ``python -m overstory.agents.tmux.driver run <that file>``: a small launcher that
   starts the TUI as its child (in the pane's process group), waits for it and writes
   its exit status to ``tmux-exit.json`` (tmux's own ``pane_dead_status`` is not
   reliable). The launcher's pid (the pane's process, a session and group leader) is
   recorded in ``turn_pgid`` / ``turn_start_ticks``; it lives as long as the TUI, and
   its death hangs up the TUI's terminal.
2. Readiness is read from the pane by the runtime's ``Tui.read_screen``. A start-up
   dialog the runtime knows how to answer (Claude's trust question for a worktree ov
   created) is answered; any other dialog, a TUI that exits, or no ready screen within
   the timeout is a ``TmuxError`` that quotes the last lines of the screen.
3. The dispatch is typed in as one short line. The mail itself reaches the model
   through the worktree's ``SessionStart``/``UserPromptSubmit`` hooks
   (``ov mail check --inject``), so nothing long or multi-line is ever typed.
   The agent goes ``booting`` -> ``working``.
4. A small detached driver (``agents.tmux_driver``, recorded as the agent's
   ``loop_pid``) polls the pane: a changed screen is activity; new mail is announced
   by typing one line, only when the pane is idle; a finished non-persistent agent
   (its terminal mail sent, its TUI idle) becomes ``completed``; a pane whose process
   is gone makes the agent ``zombie``.

Before typing, the pane must look idle on two captures ``SETTLE_SECONDS`` apart with
nothing changed in between. libtmux is imported only inside functions: the
watchdog's per-tick check (``pane_alive``) reads ``/proc`` only.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shlex
import sqlite3
import sys
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import procs, sandbox
from overstory.agents.tmux.panes import (
    end_pane,
    exit_description,
    exit_file,
    launch_file,
    launch_tag,
    pane_alive,
    record_event,
    save_screen,
    tui_of,
)
from overstory.agents.tmux.server import (
    attach_command,
    capture_pane,
    find_pane,
    server,
    session_name,
    socket_name,
)
from overstory.clock import now_ms
from overstory.endpoint.client import ENDPOINT_ENV, SOCKET_NAME, TOKEN_ENV
from overstory.errors import TmuxError
from overstory.paths import ProjectPaths
from overstory.runtimes import get_runtime
from overstory.store import sessions

if t.TYPE_CHECKING:
    from libtmux.pane import Pane

    from overstory.config.model import Config
    from overstory.runtimes.base import Screen, Tui
    from overstory.store.sessions import Session

READY_TIMEOUT = 60.0
TYPE_TIMEOUT = 10.0
SETTLE_SECONDS = 0.3  # a pane must look idle this long, unchanged, before ov types into it
DIALOG_GRACE_SECONDS = 5.0  # an answered dialog may stay on screen this long before it counts as stuck
# Keys typed while a TUI is still mounting its dialog are dropped (Claude Code 2.1.330 ignores
# them for ~0.5 s after drawing it), so an answer is typed again while the dialog stays.
DIALOG_RETYPE_SECONDS = 2.0
DIALOG_SETTLE_SECONDS = 0.8  # 2.1.330 drops keys typed in about the first half second of a dialog
REWAKE_AFTER_SECONDS = 120.0  # type the mail notice again if the mail is still unread
WINDOW_SIZE = (160, 48)


# ---- starting an agent -------------------------------------------------------------


@dataclass
class TmuxStart:
    """What ``start_agent`` started, so a failed spawn can take it back (``abort_start``)."""

    agent: str
    generation: int
    tmux_session: str
    pane_pid: int | None = None
    pane_ticks: int | None = None
    driver_pid: int | None = None
    driver_ticks: int | None = None
    attach: list[str] = field(default_factory=list)


def _write_launch_file(path: Path, argv: list[str], env: t.Mapping[str, str], cwd: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"argv": argv, "env": dict(env), "cwd": cwd}, handle)


def socket_path(project: ProjectPaths, agent_name: str) -> Path:
    """The agent's endpoint socket (served by its driver; see overstory.endpoint)."""
    return project.run_dir / agent_name / SOCKET_NAME


def package_parent() -> str:
    """The directory that holds the ``overstory`` package (PYTHONPATH for processes in panes)."""
    import overstory

    return str(Path(overstory.__file__).resolve().parent.parent)


def _agent_files(project: ProjectPaths, agent: Session) -> tuple[dict[str, t.Any] | None, Path]:
    """The hook settings (with the tmux mail hooks) and the instructions file in the agent's run dir,
    handed to the TUI on its command line: nothing in the worktree is read."""
    from overstory.resources import ov_executable

    runtime = get_runtime(agent.runtime)
    return (runtime.hook_settings(ov_executable()[0], tmux_mode=True),
            project.run_dir / agent.name / runtime.run_instructions_file)


def start_agent(project: ProjectPaths, config: Config, conn: sqlite3.Connection, name: str, generation: int,
                environ: t.Mapping[str, str], *, ready_timeout: float = READY_TIMEOUT) -> TmuxStart:
    """Open the agent's session, wait until its TUI is ready, type the dispatch, start the driver.

    The row (``booting``, ``mode='tmux'``) and its dispatch mail exist already. On
    success the agent is ``working``. On failure everything started here is taken
    back and a ``TmuxError`` (or ``RuntimeNotAvailable``) says why.
    """
    from overstory.agents.turns import resolve_model_and_provider, turn_environment

    agent = sessions.get(conn, name)
    if agent is None or agent.generation != generation:
        raise TmuxError(f"agent {name} (generation {generation}) is not in the database")
    tui = tui_of(agent)
    tmux_session = agent.tmux_session or session_name(name)
    model, provider_env = resolve_model_and_provider(agent, config, environ)
    settings, instructions_file = _agent_files(project, agent)
    argv = tui.command(config, model, hook_settings=settings, instructions_file=instructions_file)
    # The TUI lives for the whole agent: one endpoint secret for its life, served by the driver.
    secret = {ENDPOINT_ENV: str(socket_path(project, name)), TOKEN_ENV: secrets.token_hex(24)}
    env = turn_environment(environ, agent, project, launch_tag(generation), {**provider_env, **secret})
    for key, value in tui.extra_env.items():
        env.setdefault(key, value)
    prepared = sandbox.prepare_turn(project, config, agent, argv, env, launch_env=environ, tty=True)
    cwd = agent.worktree or str(project.root)
    path = launch_file(project, name)
    _write_launch_file(path, prepared.argv, prepared.env, cwd)
    exit_file(project, name).unlink(missing_ok=True)

    tmux = server(project)
    started = TmuxStart(agent=name, generation=generation, tmux_session=tmux_session,
                        attach=attach_command(project, tmux_session))
    try:
        # The driver first: it serves the endpoint the TUI's start-up hooks already call (ov mail check).
        started.driver_pid, started.driver_ticks = spawn_driver(project, name, generation, environ)
        sessions.update_fields(conn, name, generation, loop_pid=started.driver_pid,
                               loop_start_ticks=started.driver_ticks)
        if tmux.sessions.get(session_name=tmux_session, default=None) is not None:
            # A session left by an earlier, finished generation of this agent (ours: our socket, its name).
            tmux.cmd("kill-session", "-t", f"={tmux_session}")
        pythonpath = os.pathsep.join(p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
        session = tmux.new_session(
            session_name=tmux_session, start_directory=cwd, x=WINDOW_SIZE[0], y=WINDOW_SIZE[1],
            window_command=shlex.join([sys.executable, "-m", "overstory.agents.tmux.driver", "run", str(path)]),
            environment={"PYTHONPATH": pythonpath})
        pane = session.active_pane
        if pane is None or pane.pane_pid is None:
            raise TmuxError(f"tmux opened session {tmux_session} without a pane")
        started.pane_pid = int(pane.pane_pid)
        started.pane_ticks = procs.start_ticks(started.pane_pid)
        sessions.update_fields(conn, name, generation, mode="tmux", tmux_session=tmux_session,
                               turn_pgid=started.pane_pid, turn_start_ticks=started.pane_ticks,
                               last_activity=now_ms())
        record_event(project, name, generation, "tmux_start",
                      f"session {tmux_session} on socket {socket_name(project)}, pane pid {started.pane_pid}")
        wait_until_ready(project, name, pane, started.pane_pid, started.pane_ticks, tui=tui, timeout=ready_timeout)
        type_line(pane, dispatch_line(agent), tui=tui)
        record_event(project, name, generation, "tmux_dispatch", "dispatch typed into the pane")
        outcome = sessions.transition(conn, name, generation, "working", actor="sling",
                                      reason="TUI ready, dispatch typed", expect={"booting"})
        if not outcome.ok:
            raise TmuxError(f"{name} could not start working ({type(outcome).__name__})")
    except BaseException as exc:
        abort_start(project, started)
        from libtmux import exc as tmux_exc

        if isinstance(exc, tmux_exc.LibTmuxException):
            raise TmuxError(f"tmux failed while starting {name}: {type(exc).__name__}: {exc}") from exc
        raise
    return started


def abort_start(project: ProjectPaths, started: TmuxStart) -> None:
    """Take back what ``start_agent`` started: the driver, the TUI (and its tool shells), the session."""
    if started.driver_pid is not None and procs.is_alive(started.driver_pid, started.driver_ticks):
        procs.kill_group(started.driver_pid, started.driver_ticks, force=True)
    end_pane(project, started.agent, started.generation, started.tmux_session, started.pane_pid, started.pane_ticks,
          grace=1.0, force=False)


def wait_until_ready(project: ProjectPaths, name: str, pane: Pane, pane_pid: int, pane_ticks: int | None, *,
                     tui: Tui, timeout: float = READY_TIMEOUT) -> Screen:
    """Poll the pane until the TUI shows its idle prompt; answer known start-up dialogs on the way."""
    from libtmux import exc as tmux_exc

    deadline = time.monotonic() + timeout
    answered: dict[str, tuple[float, float]] = {}  # blocker name -> when ov first and last answered it
    seen: dict[str, float] = {}  # blocker name -> when ov first saw it
    typed_into: dict[str, str] = {}  # blocker name -> the screen ov last typed its answer into
    text = ""
    while True:
        try:
            pane.refresh()
            dead = pane.pane_dead == "1"
        except tmux_exc.LibTmuxException:
            dead = True
        if dead or not procs.is_alive(pane_pid, pane_ticks):
            full = capture_pane(pane, history=True) or text
            saved = save_screen(project, name, "start-failed", full)
            raise TmuxError(f"the TUI of {name} {exit_description(project, name, pane)} during start-up; "
                            f"last lines: {tui.last_lines(full)}" + (f" (screen saved to {saved})" if saved else ""))
        text = capture_pane(pane) or ""
        screen = tui.read_screen(text)
        if screen.blocker is not None:
            blocker = screen.blocker
            now = time.monotonic()
            first, last = answered.get(blocker.name, (None, None))
            if blocker.answer is None or (first is not None and now - first > DIALOG_GRACE_SECONDS):
                saved = save_screen(project, name, "start-failed", text)
                raise TmuxError(f"{name} cannot start: {blocker.message}; last lines: {tui.last_lines(text)}"
                                + (f" (screen saved to {saved})" if saved else ""))
            shown = seen.setdefault(blocker.name, now)
            changed = text != typed_into.get(blocker.name)
            # Type only once the dialog has been up long enough to take keys, and again only if the
            # screen has not moved since: a retyped Down that lands after a slow first one would move
            # the selection back past "Yes" just as the Enter for it goes out.
            if now - shown >= DIALOG_SETTLE_SECONDS and (
                    last is None or (not changed and now - last >= DIALOG_RETYPE_SECONDS)):
                for key in blocker.answer:
                    pane.cmd("send-keys", key)
                answered[blocker.name] = (now if first is None else first, now)
                typed_into[blocker.name] = text
                if first is None:
                    record_event(project, name, None, "tmux_dialog", f"answered the start-up dialog {blocker.name!r}")
        elif screen.idle:
            return screen
        if time.monotonic() > deadline:
            saved = save_screen(project, name, "start-failed", text)
            raise TmuxError(f"the TUI of {name} did not show its ready prompt within {timeout:g}s; last lines: "
                            f"{tui.last_lines(text)}" + (f" (screen saved to {saved})" if saved else ""))
        time.sleep(0.1)


# ---- typing ------------------------------------------------------------------------


def dispatch_line(agent: Session) -> str:
    return (f"[ov] You are {agent.name}, a {agent.capability} on task {agent.task_id}. Your instructions are in "
            f"your system prompt and your dispatch is in your mail (shown to you as [ov mail]; otherwise run "
            "`ov mail check`). Start now, and report with `ov mail send` as your instructions say.")


def wake_line(count: int) -> str:
    what, them = ("1 new message", "it") if count == 1 else (f"{count} new messages", "them")
    return (f"[ov] You have {what}, shown to you as [ov mail] (otherwise run `ov mail check`). "
            f"Read {them} and act on {them}.")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text.replace("\u00a0", " "))


def _wait_for(pane: Pane, tui: Tui, predicate: t.Callable[[Screen], bool], timeout: float) -> Screen | None:
    deadline = time.monotonic() + timeout
    while True:
        screen = tui.read_screen(capture_pane(pane) or "")
        if predicate(screen):
            return screen
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def type_line(pane: Pane, text: str, *, tui: Tui, timeout: float = TYPE_TIMEOUT) -> None:
    """Type one line into the prompt box, check it arrived, press Enter, check it was taken.

    Text and Enter are separate ``send-keys`` (literal text first), as the TUI needs.
    Control characters and newlines are flattened to spaces: a newline would submit early.
    """
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if not line:
        raise ValueError("nothing to type")
    pane.cmd("send-keys", "-l", line)
    tail = _squash(line)[-24:]
    arrived = _wait_for(pane, tui, lambda s: s.input_text is not None and (
        tail in _squash(s.input_text) or "[Pasted text" in s.input_text), timeout)
    if arrived is None:
        raise TmuxError(f"typed text did not appear in the prompt box within {timeout:g}s; last lines: "
                        f"{tui.last_lines(capture_pane(pane) or '')}")
    pane.cmd("send-keys", "Enter")
    taken = _wait_for(pane, tui, lambda s: s.busy or s.input_text == "", timeout)
    if taken is None:
        raise TmuxError(f"the TUI did not take the typed line within {timeout:g}s; last lines: "
                        f"{tui.last_lines(capture_pane(pane) or '')}")


# ---- delivering mail -----------------------------------------------------------------


def _wake_state_path(project: ProjectPaths, agent_name: str) -> Path:
    return project.run_dir / agent_name / "tmux-wake.json"


class _TypingLock:
    """One typist per pane at a time (the driver and `ov nudge` may both try)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def __enter__(self) -> _TypingLock:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _settled_idle(pane: Pane, tui: Tui) -> bool:
    """Idle on two captures ``SETTLE_SECONDS`` apart with nothing changed: not a passing moment
    between Enter and the spinner."""
    first = capture_pane(pane)
    if first is None or not tui.read_screen(first).idle:
        return False
    time.sleep(SETTLE_SECONDS)
    second = capture_pane(pane)
    return second is not None and tui.read_screen(second).idle and \
        tui.activity_fingerprint(second) == tui.activity_fingerprint(first)


def deliver_mail(project: ProjectPaths, conn: sqlite3.Connection, agent_name: str) -> str:
    """Announce unread mail in the agent's pane if it is idle.

    Returns what happened: ``typed``, ``busy`` (not idle: the driver tries again
    later), ``no_mail``, ``announced`` (this mail was announced already and is
    probably being read), ``not_tmux`` or ``gone`` (no pane).
    """
    agent = sessions.get(conn, agent_name)
    if agent is None or agent.mode != "tmux" or agent.is_terminal:
        return "not_tmux" if agent is None or agent.mode != "tmux" else "gone"
    if not agent.tmux_session or not pane_alive(agent):
        return "gone"
    with _TypingLock(project.run_dir / agent_name / "tmux-type.lock"):
        from overstory.store.mail_queries import pending_ids

        waiting = pending_ids(conn, agent_name)
        if not waiting:
            return "no_mail"
        newest = max(waiting)
        state_path = _wake_state_path(project, agent_name)
        try:
            wake = json.loads(state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            wake = {}
        if wake.get("generation") == agent.generation and newest <= int(wake.get("mail_id", 0)) \
                and time.time() - float(wake.get("at", 0)) < REWAKE_AFTER_SECONDS:
            return "announced"
        pane = find_pane(server(project), agent.tmux_session)
        if pane is None:
            return "gone"
        tui = tui_of(agent)
        if not _settled_idle(pane, tui):
            return "busy"
        type_line(pane, wake_line(len(waiting)), tui=tui)
        state_path.write_text(json.dumps({"generation": agent.generation, "mail_id": newest, "at": time.time()}),
                              encoding="utf-8")
    record_event(project, agent_name, agent.generation, "tmux_wake", f"announced {len(waiting)} unread message(s)")
    return "typed"


# ---- the driver process -------------------------------------------------------------


def spawn_driver(project: ProjectPaths, agent: str, generation: int,
                 environ: t.Mapping[str, str]) -> tuple[int, int | None]:
    """Start the detached driver of a tmux agent; returns (pid, start ticks)."""
    import subprocess

    log_path = project.run_dir / agent / "tmux-driver.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Not the caller's OVERSTORY_* identity: a lead that slings must not lend its tag to this process.
    env = {k: v for k, v in environ.items() if not k.startswith("OVERSTORY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), env.get("PYTHONPATH", "")) if p)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "overstory.agents.tmux.driver", "drive", "--project", str(project.root), "--agent", agent,
             "--generation", str(generation)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True, env=env,
            cwd=str(project.root))
    return proc.pid, procs.start_ticks(proc.pid)


