"""tmux mode: an agent's interactive TUI runs in a tmux session, driven through libtmux.

Each project has its own tmux server (``tmux -L ov-<hash of the project root>``,
started with ov's own config file, so the operator's ``~/.tmux.conf`` and other
servers are never involved). An agent's session is named after the agent.

Life of a tmux agent:

1. ``start_agent`` (called by ``ov sling --tmux``) writes the TUI's command line and
   environment to ``.overstory/run/<agent>/tmux-launch.json`` (mode 0600: it may hold
   an API key) and opens a session whose only pane runs
   ``python -m overstory.tmux_mode run <that file>``: a small launcher that starts
   the TUI as its child (in the pane's process group), waits for it and writes its
   exit status to ``tmux-exit.json`` (tmux's own ``pane_dead_status`` is not
   reliable). The launcher's pid — the pane's process, a session and group leader —
   is recorded in ``turn_pgid`` / ``turn_start_ticks``; it lives as long as the TUI,
   and its death hangs up the TUI's terminal.
2. Readiness is read from the pane (``read_screen``). Claude's start-up trust
   question for the new worktree is answered "yes" (ov created that worktree from
   the operator's own repository, and headless ``claude -p`` skips the question
   anyway); any other start-up dialog (onboarding, login, API-key approval, the
   Bypass Permissions warning), a TUI that exits, or no ready screen within the
   timeout is a ``TmuxError`` that quotes the last lines of the screen.
3. The dispatch is typed in as one short line. The mail itself reaches the model
   through the worktree's ``SessionStart``/``UserPromptSubmit`` hooks
   (``ov mail check --inject``), so nothing long or multi-line is ever typed.
   The agent goes ``booting`` → ``working``.
4. A small detached driver (``python -m overstory.tmux_mode drive …``, recorded as
   the agent's ``loop_pid``) polls the pane: a changed screen is activity; new mail
   is announced by typing one line, only when the pane is idle; a finished
   non-persistent agent (its terminal mail sent, its TUI idle) becomes
   ``completed``; a pane whose process is gone makes the agent ``zombie``. When the
   agent turns terminal by another hand (``ov stop``, the watchdog), the driver
   closes the session on its way out.

Idle means, on the captured screen: the footer (the lines below the prompt box's
lower rule) shows ``bypass permissions on`` and not ``esc to interrupt``, and the
prompt box holds nothing typed (so an operator who is attached and typing is never
interrupted). Anything else — a dialog, a menu, a busy spinner, text in the box —
is not idle, and ov waits. Before typing, the pane must look idle on two captures
``SETTLE_SECONDS`` apart with nothing changed in between.

libtmux is imported only inside functions: the watchdog's per-tick check
(``pane_alive``) reads ``/proc`` only.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import sys
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import procs, sessions
from overstory.agent_loop import AgentProcess
from overstory.clock import now_ms
from overstory.errors import RuntimeNotAvailable, TmuxError
from overstory.names import validate_name
from overstory.paths import ProjectPaths

if t.TYPE_CHECKING:
    from libtmux.pane import Pane
    from libtmux.server import Server

    from overstory.config import Config
    from overstory.sessions import Session

ACTOR = "tmux-driver"
READY_TIMEOUT = 60.0
TYPE_TIMEOUT = 10.0
SETTLE_SECONDS = 0.3  # a pane must look idle this long, unchanged, before ov types into it
DIALOG_GRACE_SECONDS = 5.0  # an answered dialog may stay on screen this long before it counts as stuck
CAPTURE_FAILURES_FOR_GONE = 3  # consecutive failed captures of a live pane before the session counts as gone
POLL_SECONDS = 0.5
TOUCH_EVERY_SECONDS = 5.0  # how often an idle pane refreshes last_activity
REWAKE_AFTER_SECONDS = 120.0  # type the mail notice again if the mail is still unread
WINDOW_SIZE = (160, 48)
MARKETPLACE_VAR = "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL"
# Passed with --settings: without it `--permission-mode bypassPermissions` stops at a warning dialog.
TUI_FLAG_SETTINGS = {"skipDangerousModePermissionPrompt": True}

TMUX_CONF = """\
# Written by ov: the tmux server on this project's own socket (not your ~/.tmux.conf).
# A pane whose program exits stays on screen, so ov can read why it died.
set -g remain-on-exit on
set -g history-limit 50000
set -g status-left "[ov #S] "
set -g status-left-length 40
"""

# ---- names ---------------------------------------------------------------------


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


def launch_tag(generation: int) -> str:
    """``OVERSTORY_TURN_ID`` of a tmux agent's TUI: with the agent name and project root
    in the same environment, it marks every process the TUI started (even tool shells
    that left its process group), so ``kill_session`` can find them."""
    return f"tmux-g{generation}"


def logs_dir(project: ProjectPaths, agent_name: str) -> Path:
    return project.logs_dir / agent_name / "tmux"


def launch_file(project: ProjectPaths, agent_name: str) -> Path:
    return project.run_dir / agent_name / "tmux-launch.json"


EXIT_FILE_NAME = "tmux-exit.json"  # written by the launcher, next to the launch file


def exit_file(project: ProjectPaths, agent_name: str) -> Path:
    return project.run_dir / agent_name / EXIT_FILE_NAME


# ---- reading the screen (pure) -------------------------------------------------

READY_MARK = "bypass permissions on"
BUSY_MARK = "esc to interrupt"
PROMPT_CHAR = "❯"
_RULE = re.compile(r"^\s*─{8,}\s*$")
# "✻ Pondering… (2s · ↓ 6 tokens)": the busy spinner, which animates without news.
_SPINNER = re.compile(r"^\s*\S\s+[\w' -]+…")


@dataclass(frozen=True)
class Blocker:
    """A start-up screen that stops the TUI. ``answer`` (tmux key names) gets past it; None means give up."""

    name: str
    marks: tuple[str, ...]
    answer: tuple[str, ...] | None
    message: str


BLOCKERS = (
    Blocker("trust", ("❯ 1. Yes, I trust this folder",), ("Enter",),
            "the TUI asked whether to trust the worktree"),
    Blocker("bypass_warning", ("Bypass Permissions mode", "Yes, I accept"), None,
            "the TUI stopped at its Bypass Permissions warning although ov passed "
            "skipDangerousModePermissionPrompt; a managed policy may be forcing it"),
    Blocker("api_key", ("Do you want to use this API key?",), None,
            "the TUI asks whether to use the ANTHROPIC_API_KEY of the environment: run `claude` once in a "
            "terminal and answer Yes, then sling again"),
    Blocker("onboarding", ("Choose the text style",), None,
            "the TUI's first-run set-up has not been done on this machine: run `claude` once in a terminal, "
            "then sling again"),
    Blocker("login", ("Select login method",), None,
            "the TUI is not logged in: run `claude` once in a terminal (or set ANTHROPIC_API_KEY), then sling again"),
)


@dataclass(frozen=True)
class Screen:
    """What ov understands of one capture of the pane."""

    text: str
    ready: bool
    busy: bool
    input_text: str | None  # what is typed in the prompt box; None when there is no prompt box
    blocker: Blocker | None

    @property
    def idle(self) -> bool:
        """Ready, not working, nothing typed: the only state in which ov types."""
        return self.ready and not self.busy and self.input_text == "" and self.blocker is None


def read_screen(text: str) -> Screen:
    """Parse a ``capture-pane`` of the TUI (see the module docstring for the rules)."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if _RULE.match(line)]
    input_text: str | None = None
    footer: list[str] = []
    if len(rules) >= 2:
        top, bottom = rules[-2], rules[-1]
        box = lines[top + 1:bottom]
        first = box[0].lstrip() if box else ""
        if first.startswith(PROMPT_CHAR):
            parts = [first[len(PROMPT_CHAR):], *box[1:]]
            input_text = " ".join(part.replace("\u00a0", " ").strip() for part in parts).strip()
        footer = lines[bottom + 1:]
    footer_text = "\n".join(footer)
    ready = READY_MARK in footer_text
    blocker = None
    if not ready:
        blocker = next((b for b in BLOCKERS if all(mark in text for mark in b.marks)), None)
    return Screen(text=text, ready=ready, busy=BUSY_MARK in footer_text, input_text=input_text, blocker=blocker)


def activity_fingerprint(text: str) -> str:
    """A hash of the screen that changes with news, not with the spinner or the footer's timers."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if _RULE.match(line)]
    if rules:
        lines = lines[:rules[-1]]
    kept = [re.sub(r"\d+", "#", line.rstrip()) for line in lines if not _SPINNER.match(line)]
    return hashlib.sha1("\n".join(kept).encode("utf-8")).hexdigest()


def last_lines(text: str, count: int = 6) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _RULE.match(line)]
    return " | ".join(lines[-count:]) if lines else "(the screen is empty)"


# ---- the tmux server -------------------------------------------------------------


def tmux_available() -> bool:
    return shutil.which("tmux") is not None


def _server(project: ProjectPaths) -> Server:
    import libtmux

    if not tmux_available():
        raise RuntimeNotAvailable("tmux mode needs tmux on PATH (apt install tmux / brew install tmux)")
    conf = project.run_dir / "tmux.conf"
    if not conf.exists() or conf.read_text(encoding="utf-8") != TMUX_CONF:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(TMUX_CONF, encoding="utf-8")
    return libtmux.Server(socket_name=socket_name(project), config_file=str(conf))


def _pane(server: Server, tmux_session: str) -> Pane | None:
    """The single pane of ``tmux_session``, or None if the session (or the server) is gone."""
    found = server.sessions.get(session_name=tmux_session, default=None)
    if found is None:
        return None
    pane = found.active_pane
    return pane


def _capture(pane: Pane, *, history: bool = False) -> str | None:
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
    server = _server(project)
    return sorted(s.session_name for s in server.sessions if s.session_name)


def capture(project: ProjectPaths, tmux_session: str, *, history: bool = False) -> str | None:
    """The text on an agent's pane (with scroll-back if ``history``); None if it has no session."""
    if not tmux_available():
        return None
    pane = _pane(_server(project), tmux_session)
    return _capture(pane, history=history) if pane is not None else None


def _save_screen(project: ProjectPaths, agent_name: str, label: str, text: str | None) -> Path | None:
    if text is None:
        return None
    folder = logs_dir(project, agent_name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{label}.txt"
    path.write_text(text + "\n", encoding="utf-8")
    return path


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


def tui_command(claude_bin: str, model: str | None, *, settings: t.Mapping[str, t.Any] | None = None,
                extra_flags: t.Sequence[str] = ()) -> list[str]:
    """The interactive command line: the headless flags minus ``-p`` and the stream formats.

    ``settings`` (inline JSON for ``--settings``) always includes ``TUI_FLAG_SETTINGS``.
    """
    program = shutil.which(claude_bin) or (claude_bin if Path(claude_bin).is_file() else None)
    if program is None:
        raise RuntimeNotAvailable(f"tmux mode runs `{claude_bin}` (runtime.claude_bin), which is not on PATH: "
                                  "npm install -g @anthropic-ai/claude-code")
    merged = {**(settings or {}), **TUI_FLAG_SETTINGS}
    argv = [program, "--permission-mode", "bypassPermissions", "--settings", json.dumps(merged)]
    if model:
        argv += ["--model", model]
    return [*argv, *extra_flags]


def _root_agent_tui_options(project: ProjectPaths, name: str) -> tuple[dict[str, t.Any], list[str]]:
    """An agent at the project root (the coordinator) has no worktree ``.claude/``: its hooks go in
    ``--settings`` (with the tmux mail hooks) and its instructions in ``--append-system-prompt``."""
    from overstory.runtimes.commands import ROOT_INSTRUCTIONS_FILE
    from overstory.spawn import hook_settings, ov_executable

    flags: list[str] = []
    instructions = project.run_dir / name / ROOT_INSTRUCTIONS_FILE
    if instructions.is_file():
        flags += ["--append-system-prompt", instructions.read_text(encoding="utf-8")]
    return hook_settings(ov_executable()[0], tmux_mode=True), flags


def _write_launch_file(path: Path, argv: list[str], env: t.Mapping[str, str], cwd: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"argv": argv, "env": dict(env), "cwd": cwd}, handle)


def _package_parent() -> str:
    import overstory

    return str(Path(overstory.__file__).resolve().parent.parent)


def start_agent(project: ProjectPaths, config: Config, conn: sqlite3.Connection, name: str, generation: int,
                environ: t.Mapping[str, str], *, ready_timeout: float = READY_TIMEOUT) -> TmuxStart:
    """Open the agent's session, wait until its TUI is ready, type the dispatch, start the driver.

    The row (``booting``, ``mode='tmux'``) and its dispatch mail exist already. On
    success the agent is ``working``. On failure everything started here is taken
    back and a ``TmuxError`` (or ``RuntimeNotAvailable``) says why.
    """
    from overstory.turns import resolve_model_and_provider, turn_environment

    agent = sessions.get(conn, name)
    if agent is None or agent.generation != generation:
        raise TmuxError(f"agent {name} (generation {generation}) is not in the database")
    tmux_session = agent.tmux_session or session_name(name)
    model, provider_env = resolve_model_and_provider(agent, config, environ)
    settings: dict[str, t.Any] = {}
    extra_flags: list[str] = []
    if not agent.worktree:
        settings, extra_flags = _root_agent_tui_options(project, name)
    argv = tui_command(config.runtime.claude_bin, model, settings=settings, extra_flags=extra_flags)
    env = turn_environment(environ, agent, project, launch_tag(generation), provider_env)
    env.setdefault(MARKETPLACE_VAR, "1")
    cwd = agent.worktree or str(project.root)
    path = launch_file(project, name)
    _write_launch_file(path, argv, env, cwd)
    exit_file(project, name).unlink(missing_ok=True)

    server = _server(project)
    started = TmuxStart(agent=name, generation=generation, tmux_session=tmux_session,
                        attach=attach_command(project, tmux_session))
    try:
        if server.sessions.get(session_name=tmux_session, default=None) is not None:
            # A session left by an earlier, finished generation of this agent (ours: our socket, its name).
            server.cmd("kill-session", "-t", f"={tmux_session}")
        pythonpath = os.pathsep.join(p for p in (_package_parent(), os.environ.get("PYTHONPATH", "")) if p)
        session = server.new_session(
            session_name=tmux_session, start_directory=cwd, x=WINDOW_SIZE[0], y=WINDOW_SIZE[1],
            window_command=shlex.join([sys.executable, "-m", "overstory.tmux_mode", "run", str(path)]),
            environment={"PYTHONPATH": pythonpath})
        pane = session.active_pane
        if pane is None or pane.pane_pid is None:
            raise TmuxError(f"tmux opened session {tmux_session} without a pane")
        started.pane_pid = int(pane.pane_pid)
        started.pane_ticks = procs.start_ticks(started.pane_pid)
        sessions.update_fields(conn, name, generation, mode="tmux", tmux_session=tmux_session,
                               turn_pgid=started.pane_pid, turn_start_ticks=started.pane_ticks,
                               last_activity=now_ms())
        _record_event(project, name, generation, "tmux_start",
                      f"session {tmux_session} on socket {socket_name(project)}, pane pid {started.pane_pid}")
        wait_until_ready(project, name, pane, started.pane_pid, started.pane_ticks, timeout=ready_timeout)
        type_line(pane, dispatch_line(agent))
        _record_event(project, name, generation, "tmux_dispatch", "dispatch typed into the pane")
        outcome = sessions.transition(conn, name, generation, "working", actor="sling",
                                      reason="TUI ready, dispatch typed", expect={"booting"})
        if not outcome.ok:
            raise TmuxError(f"{name} could not start working ({type(outcome).__name__})")
        started.driver_pid, started.driver_ticks = spawn_driver(project, name, generation, environ)
        sessions.update_fields(conn, name, generation, loop_pid=started.driver_pid,
                               loop_start_ticks=started.driver_ticks)
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
    _kill(project, started.agent, started.generation, started.tmux_session, started.pane_pid, started.pane_ticks,
          grace=1.0, force=False)


def wait_until_ready(project: ProjectPaths, name: str, pane: Pane, pane_pid: int, pane_ticks: int | None, *,
                     timeout: float = READY_TIMEOUT) -> Screen:
    """Poll the pane until the TUI shows its idle prompt; answer the trust question on the way."""
    from libtmux import exc as tmux_exc

    deadline = time.monotonic() + timeout
    answered: dict[str, float] = {}  # blocker name -> when ov answered it
    text = ""
    while True:
        try:
            pane.refresh()
            dead = pane.pane_dead == "1"
        except tmux_exc.LibTmuxException:
            dead = True
        if dead or not procs.is_alive(pane_pid, pane_ticks):
            full = _capture(pane, history=True) or text
            saved = _save_screen(project, name, "start-failed", full)
            raise TmuxError(f"the TUI of {name} {_exit_description(project, name, pane)} during start-up; "
                            f"last lines: {last_lines(full)}" + (f" (screen saved to {saved})" if saved else ""))
        text = _capture(pane) or ""
        screen = read_screen(text)
        if screen.blocker is not None:
            blocker = screen.blocker
            when = answered.get(blocker.name)
            if blocker.answer is None or (when is not None and time.monotonic() - when > DIALOG_GRACE_SECONDS):
                saved = _save_screen(project, name, "start-failed", text)
                raise TmuxError(f"{name} cannot start: {blocker.message}; last lines: {last_lines(text)}"
                                + (f" (screen saved to {saved})" if saved else ""))
            if when is None:
                for key in blocker.answer:
                    pane.cmd("send-keys", key)
                answered[blocker.name] = time.monotonic()
                _record_event(project, name, None, "tmux_dialog", f"answered the start-up dialog {blocker.name!r}")
        elif screen.idle:
            return screen
        if time.monotonic() > deadline:
            saved = _save_screen(project, name, "start-failed", text)
            raise TmuxError(f"the TUI of {name} did not show its ready prompt within {timeout:g}s; last lines: "
                            f"{last_lines(text)}" + (f" (screen saved to {saved})" if saved else ""))
        time.sleep(0.1)


def _exit_description(project: ProjectPaths, name: str, pane: Pane | None) -> str:
    """How the TUI ended: from the launcher's exit file, else from tmux."""
    from libtmux import exc as tmux_exc

    deadline = time.monotonic() + 1.0
    while True:  # the launcher writes the file just before it exits
        try:
            ended = json.loads(exit_file(project, name).read_text(encoding="utf-8"))
            break
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                ended = None
                break
            time.sleep(0.05)
    if ended is not None:
        return str(ended.get("description") or "exited")
    if pane is None:
        return "exited, and its tmux pane is gone"
    try:
        pane.refresh()
        while pane.pane_dead != "1" and time.monotonic() < deadline:  # tmux notices the exit a moment later
            time.sleep(0.05)
            pane.refresh()
    except tmux_exc.LibTmuxException:
        return "exited, and its tmux pane is gone"
    if pane.pane_dead_signal:
        return f"was killed by signal {pane.pane_dead_signal}"
    if pane.pane_dead_status:
        return f"exited with status {pane.pane_dead_status}"
    return "exited"


# ---- typing ------------------------------------------------------------------------


def dispatch_line(agent: Session) -> str:
    where = ".claude/CLAUDE.md" if agent.worktree else "your system prompt"
    return (f"[ov] You are {agent.name}, a {agent.capability} on task {agent.task_id}. Your instructions are in "
            f"{where} and your dispatch is in your mail (shown to you as [ov mail]; otherwise run "
            "`ov mail check`). Start now, and report with `ov mail send` as your instructions say.")


def wake_line(count: int) -> str:
    what, them = ("1 new message", "it") if count == 1 else (f"{count} new messages", "them")
    return (f"[ov] You have {what}, shown to you as [ov mail] (otherwise run `ov mail check`). "
            f"Read {them} and act on {them}.")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text.replace("\u00a0", " "))


def _wait_for(pane: Pane, predicate: t.Callable[[Screen], bool], timeout: float) -> Screen | None:
    deadline = time.monotonic() + timeout
    while True:
        screen = read_screen(_capture(pane) or "")
        if predicate(screen):
            return screen
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def type_line(pane: Pane, text: str, *, timeout: float = TYPE_TIMEOUT) -> None:
    """Type one line into the prompt box, check it arrived, press Enter, check it was taken.

    Text and Enter are separate ``send-keys`` (literal text first), as the TUI needs.
    Control characters and newlines are flattened to spaces: a newline would submit early.
    """
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if not line:
        raise ValueError("nothing to type")
    pane.cmd("send-keys", "-l", line)
    tail = _squash(line)[-24:]
    arrived = _wait_for(pane, lambda s: s.input_text is not None and (
        tail in _squash(s.input_text) or "[Pasted text" in s.input_text), timeout)
    if arrived is None:
        raise TmuxError(f"typed text did not appear in the prompt box within {timeout:g}s; last lines: "
                        f"{last_lines(_capture(pane) or '')}")
    pane.cmd("send-keys", "Enter")
    taken = _wait_for(pane, lambda s: s.busy or s.input_text == "", timeout)
    if taken is None:
        raise TmuxError(f"the TUI did not take the typed line within {timeout:g}s; last lines: "
                        f"{last_lines(_capture(pane) or '')}")


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


def _settled_idle(pane: Pane) -> bool:
    """Idle on two captures ``SETTLE_SECONDS`` apart with nothing changed: not a passing moment
    between Enter and the spinner."""
    first = _capture(pane)
    if first is None or not read_screen(first).idle:
        return False
    time.sleep(SETTLE_SECONDS)
    second = _capture(pane)
    return second is not None and read_screen(second).idle and \
        activity_fingerprint(second) == activity_fingerprint(first)


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
        rows = conn.execute("SELECT id FROM mail WHERE recipient = ? AND read_at IS NULL AND claimed_by IS NULL",
                            (agent_name,)).fetchall()
        if not rows:
            return "no_mail"
        newest = max(int(r[0]) for r in rows)
        state_path = _wake_state_path(project, agent_name)
        try:
            wake = json.loads(state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            wake = {}
        if wake.get("generation") == agent.generation and newest <= int(wake.get("mail_id", 0)) \
                and time.time() - float(wake.get("at", 0)) < REWAKE_AFTER_SECONDS:
            return "announced"
        pane = _pane(_server(project), agent.tmux_session)
        if pane is None:
            return "gone"
        if not _settled_idle(pane):
            return "busy"
        type_line(pane, wake_line(len(rows)))
        state_path.write_text(json.dumps({"generation": agent.generation, "mail_id": newest, "at": time.time()}),
                              encoding="utf-8")
    _record_event(project, agent_name, agent.generation, "tmux_wake", f"announced {len(rows)} unread message(s)")
    return "typed"


# ---- liveness and stopping (for the watchdog and `ov stop`) ----------------------------


def pane_status(agent: Session) -> str:
    """``alive``, ``gone`` (the recorded pane process no longer runs) or ``not_started``.

    Reads ``/proc`` only (no tmux call), cheap enough for every watchdog tick.
    """
    if agent.turn_pgid is None:
        return "not_started"
    return "alive" if procs.is_alive(agent.turn_pgid, agent.turn_start_ticks) else "gone"


def pane_alive(agent: Session) -> bool:
    """False only when a pane was recorded and its process is gone (the agent is then a zombie)."""
    return pane_status(agent) != "gone"


def pane_exit_reason(project: ProjectPaths, agent: Session) -> str:
    """Why a tmux agent's pane is gone, for the ``worker_died`` mail (calls tmux)."""
    from libtmux.exc import LibTmuxException as LibTmuxError

    if not agent.tmux_session:
        return "its tmux pane was never recorded"
    pane = _pane(_server(project), agent.tmux_session) if tmux_available() else None
    ended = exit_file(project, agent.name).exists()
    if pane is None:
        if ended:
            return f"its TUI {_exit_description(project, agent.name, None)}; its tmux session is gone"
        return f"its tmux session {agent.tmux_session} is gone (the tmux server was killed?)"
    text = _capture(pane, history=True) or ""
    try:
        pane.refresh()
        dead = pane.pane_dead == "1"
    except LibTmuxError:
        dead = True
    if ended or dead:
        return f"its TUI {_exit_description(project, agent.name, pane)}; last lines: {last_lines(text, 3)}"
    return (f"its pane process {agent.turn_pgid} (ov's launcher) is gone, though the pane is still open; "
            f"last lines: {last_lines(text, 3)}")


@dataclass
class KillReport:
    session_killed: bool = False
    pane_group_killed: bool = False
    leftovers: list[int] = field(default_factory=list)
    screen_saved: str | None = None

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def kill_session(project: ProjectPaths, agent: Session, *, grace: float = 5.0, force: bool = False) -> KillReport:
    """End a tmux agent's TUI: save its last screen, kill its session, its process group
    and the tool shells it left behind. Does not touch the state or the driver.

    For ``ov stop`` and for the watchdog after it declared a tmux agent zombie.
    """
    if not agent.tmux_session:
        return KillReport()
    return _kill(project, agent.name, agent.generation, agent.tmux_session, agent.turn_pgid, agent.turn_start_ticks,
                 grace=grace, force=force)


def _kill(project: ProjectPaths, name: str, generation: int, tmux_session: str, pane_pid: int | None,
          pane_ticks: int | None, *, grace: float, force: bool) -> KillReport:
    report = KillReport()
    if tmux_available():
        server = _server(project)
        pane = _pane(server, tmux_session)
        if pane is not None:
            saved = _save_screen(project, name, "final", _capture(pane, history=True))
            report.screen_saved = str(saved) if saved else None
            done = server.cmd("kill-session", "-t", f"={tmux_session}")
            report.session_killed = done.returncode == 0
    if pane_pid is not None and procs.group_alive(pane_pid, pane_ticks):
        # kill-session hung up the pane; a TUI that ignores SIGHUP gets the usual TERM, then KILL.
        deadline = time.monotonic() + min(grace, 2.0)
        while time.monotonic() < deadline and procs.group_alive(pane_pid, pane_ticks):
            time.sleep(0.05)
        if procs.group_alive(pane_pid, pane_ticks):
            procs.kill_group(pane_pid, pane_ticks, grace=grace, force=force)
            report.pane_group_killed = True
    report.leftovers = _kill_tagged(project, name, generation)
    return report


def _ancestors() -> set[int]:
    chain = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def _kill_tagged(project: ProjectPaths, name: str, generation: int) -> list[int]:
    """Kill processes whose environment carries this agent's TUI tag (tool shells in their own sessions)."""
    wanted = {
        f"OVERSTORY_AGENT_NAME={name}".encode(), f"OVERSTORY_PROJECT_ROOT={project.root}".encode(),
        f"OVERSTORY_TURN_ID={launch_tag(generation)}".encode(),
    }
    spared = _ancestors()
    found: list[tuple[int, int | None]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
            if wanted <= environ and (entry / "comm").read_text().startswith("tmux"):
                continue  # never a tmux server or client: other agents' panes live there
        except OSError:
            continue
        if wanted <= environ:
            found.append((int(entry.name), procs.start_ticks(int(entry.name))))
    for pid, ticks in found:
        if procs.is_alive(pid, ticks):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(procs.is_alive(p, k) for p, k in found):
        time.sleep(0.05)
    for pid, ticks in found:
        if procs.is_alive(pid, ticks):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [pid for pid, _ in found]


def orphan_sessions(project: ProjectPaths, conn: sqlite3.Connection) -> list[str]:
    """Sessions on the project's socket that no active tmux agent owns (for the watchdog's reconcile)."""
    owned = {row[0] for row in conn.execute(
        "SELECT tmux_session FROM sessions WHERE mode = 'tmux' AND tmux_session IS NOT NULL "
        "AND state NOT IN ('completed', 'zombie')").fetchall()}
    return [name for name in list_sessions(project) if name not in owned]


def kill_orphan_session(project: ProjectPaths, tmux_session: str) -> bool:
    """Kill a session of the project's socket by name (see ``orphan_sessions``)."""
    if not tmux_available():
        return False
    return _server(project).cmd("kill-session", "-t", f"={tmux_session}").returncode == 0


# ---- the driver ----------------------------------------------------------------------


def spawn_driver(project: ProjectPaths, agent: str, generation: int,
                 environ: t.Mapping[str, str]) -> tuple[int, int | None]:
    """Start the detached driver of a tmux agent; returns (pid, start ticks)."""
    import subprocess

    log_path = project.run_dir / agent / "tmux-driver.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Not the caller's OVERSTORY_* identity: a lead that slings must not lend its tag to this process.
    env = {k: v for k, v in environ.items() if not k.startswith("OVERSTORY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_parent(), env.get("PYTHONPATH", "")) if p)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "overstory.tmux_mode", "drive", "--project", str(project.root), "--agent", agent,
             "--generation", str(generation)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True, env=env,
            cwd=str(project.root))
    return proc.pid, procs.start_ticks(proc.pid)


class PaneDriver(AgentProcess):
    """Watches one tmux agent's pane until the agent is terminal (see the module docstring)."""

    def __init__(self, project: ProjectPaths, name: str, generation: int) -> None:
        super().__init__(project, name, generation)
        self.last_seen: Session | None = None  # the last row that recorded the pane

    def run(self) -> int:
        if not self.take_agent():  # the same lock a headless loop takes
            return 0  # another driver (or loop) serves this agent
        try:
            self._watch()
        finally:
            self._close_if_terminal()
        return 0

    def _watch(self) -> None:
        server = _server(self.project)
        last_print = ""
        last_touch = 0.0
        failed_captures = 0
        while not self.stopping:
            agent = self.current()
            if agent is None:
                break
            if agent.turn_pgid is not None:
                self.last_seen = agent
            status = pane_status(agent)
            pane = _pane(server, agent.tmux_session) if agent.tmux_session else None
            text = _capture(pane) if pane is not None else None
            failed_captures = failed_captures + 1 if status == "alive" and text is None else 0
            if status == "gone" or failed_captures >= CAPTURE_FAILURES_FOR_GONE:
                self._pane_gone(agent)
                break
            if status == "not_started" or text is None:
                time.sleep(POLL_SECONDS)
                continue
            screen = read_screen(text)
            fingerprint = activity_fingerprint(text)
            now = time.monotonic()
            # A changed screen is news; an idle pane is legitimately waiting (so never stale).
            if fingerprint != last_print or (screen.idle and (now - last_touch >= TOUCH_EVERY_SECONDS
                                                              or agent.state == "stalled")):
                last_print, last_touch = fingerprint, now
                self._touch(agent)
            if screen.idle and agent.state in ("working", "stalled"):
                if self._finished(agent):
                    self._complete(agent)
                    break
                try:
                    deliver_mail(self.project, self.state, self.name)
                except TmuxError as exc:
                    _record_event(self.project, self.name, self.generation, "tmux_type_failed", str(exc)[:300])
            time.sleep(POLL_SECONDS)

    def _close_if_terminal(self) -> None:
        """Stopped (``ov stop``) or declared zombie by someone else: no TUI may outlive the agent.

        Uses the last row that recorded the pane, since settling clears ``turn_pgid``.
        A newer generation owns the session name now, so it is left alone.
        """
        final = sessions.get(self.state, self.name)
        if final is None or final.generation != self.generation or not final.is_terminal:
            return
        seen = self.last_seen or final
        if seen.tmux_session and (tmux_available() and seen.tmux_session in list_sessions(self.project)
                                  or procs.group_alive(seen.turn_pgid, seen.turn_start_ticks)):
            kill_session(self.project, seen, grace=2.0)

    def _touch(self, agent: Session) -> None:
        sessions.update_fields(self.state, self.name, self.generation, last_activity=now_ms())
        if agent.state == "stalled":
            sessions.transition(self.state, self.name, self.generation, "working", actor=ACTOR,
                                reason="the pane shows activity again", expect={"stalled"})

    def _finished(self, agent: Session) -> bool:
        from overstory.lifecycle import PERSISTENT_CAPABILITIES, terminal_mail_sent

        return agent.capability not in PERSISTENT_CAPABILITIES and terminal_mail_sent(
            self.state, agent, agent.created_at)

    def _complete(self, agent: Session) -> None:
        outcome = sessions.transition(self.state, self.name, self.generation, "completed", actor=ACTOR,
                                      reason="terminal mail sent and its TUI is idle",
                                      expect={"working", "stalled"})
        if outcome.ok:
            _record_event(self.project, self.name, self.generation, "tmux_completed",
                          "completed: terminal mail sent and the TUI idle; closing its session")
            kill_session(self.project, agent)
            sessions.update_fields(self.state, self.name, self.generation, turn_pgid=None, turn_start_ticks=None)

    def _pane_gone(self, agent: Session) -> None:
        from overstory.lifecycle import declare_zombie

        reason = pane_exit_reason(self.project, agent)
        outcome = declare_zombie(self.state, agent, reason, actor=ACTOR)
        if outcome.ok:
            _record_event(self.project, self.name, self.generation, "tmux_exit", reason[:300])
            kill_session(self.project, agent, grace=1.0)


def _record_event(project: ProjectPaths, name: str, generation: int | None, kind: str, summary: str) -> None:
    from overstory import events as event_store
    from overstory.db import open_events

    try:
        conn = open_events(project.events_db)
    except Exception:  # an event is a courtesy; never fail the real work for it
        return
    try:
        event_store.record(conn, kind, agent=name, generation=generation, summary=summary[:300])
    except sqlite3.Error:
        pass
    finally:
        conn.close()


# ---- entry points ----------------------------------------------------------------------


def run_launch_file(path: str) -> int:
    """Inside the pane: run the TUI with the environment ov saved (keeping the pane's TERM/TMUX),
    wait for it, and leave its exit status next to the launch file."""
    import subprocess

    def finish(code: int, description: str) -> int:
        Path(path).with_name(EXIT_FILE_NAME).write_text(json.dumps({"code": code, "description": description, "at": now_ms()}), encoding="utf-8")
        print(f"\n[ov] the TUI {description}", flush=True)
        return code

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        env = dict(data["env"])
        for key in ("TERM", "TMUX", "TMUX_PANE", "COLORTERM"):
            if key in os.environ:
                env[key] = os.environ[key]
        child = subprocess.Popen(data["argv"], cwd=data["cwd"], env=env)
    except (OSError, ValueError, KeyError) as exc:
        print(f"ov: cannot start the TUI from {path}: {exc}", file=sys.stderr, flush=True)
        return finish(127, f"could not start: {exc}")

    def forward(signum: int, frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGHUP, forward)
    signal.signal(signal.SIGTERM, forward)
    # An attached operator's Ctrl-C reaches the TUI directly (same foreground group); the launcher stays.
    # (A handler, not SIG_IGN: handlers are reset in the child, an ignored signal would not be.)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    code = child.wait()
    if code < 0:
        return finish(128 - code, f"was killed by signal {-code}")
    return finish(code, f"exited with status {code}")


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m overstory.tmux_mode")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="(in a pane) run the TUI described by a launch file")
    run.add_argument("launch_file")
    drive = commands.add_parser("drive", help="watch a tmux agent's pane until the agent is terminal")
    drive.add_argument("--project", required=True)
    drive.add_argument("--agent", required=True)
    drive.add_argument("--generation", required=True, type=int)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_launch_file(args.launch_file)
    driver = PaneDriver(ProjectPaths(Path(args.project)), args.agent, args.generation)
    try:
        return driver.run()
    finally:
        driver.state.close()


if __name__ == "__main__":
    sys.exit(main())
