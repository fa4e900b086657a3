"""The two small processes of a tmux agent: the launcher in its pane and its driver.

``python -m overstory.agents.tmux.driver run FILE`` runs inside the pane: it starts
the TUI described by the launch file and leaves its exit status next to it.
``python -m overstory.agents.tmux.driver drive ...`` is the detached driver that
watches the pane until the agent is terminal (see ``agents.tmux``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import typing as t
from pathlib import Path

from overstory import procs, sandbox
from overstory.agents.process import AgentProcess
from overstory.agents.tmux.panes import (
    EXIT_FILE_NAME,
    kill_session,
    launch_file,
    pane_exit_reason,
    pane_status,
    record_event,
    tui_of,
)
from overstory.agents.tmux.server import capture_pane, find_pane, list_sessions, server, tmux_available
from overstory.agents.tmux.session import deliver_mail
from overstory.clock import now_ms
from overstory.errors import TmuxError
from overstory.paths import ProjectPaths
from overstory.store import sessions

if t.TYPE_CHECKING:
    from overstory.endpoint.server import AgentEndpoint
    from overstory.store.sessions import Session

ACTOR = "tmux-driver"
CAPTURE_FAILURES_FOR_GONE = 3  # consecutive failed captures of a live pane before the session counts as gone
POLL_SECONDS = 0.5
TOUCH_EVERY_SECONDS = 5.0  # how often an idle pane refreshes last_activity


class PaneDriver(AgentProcess):
    """Watches one tmux agent's pane until the agent is terminal (see the module docstring)."""

    def __init__(self, project: ProjectPaths, name: str, generation: int) -> None:
        super().__init__(project, name, generation)
        self.last_seen: Session | None = None  # the last row that recorded the pane

    def run(self) -> int:
        if not self.take_agent():  # the same lock a headless loop takes
            return 0  # another driver (or loop) serves this agent
        endpoint = self._serve_endpoint()
        try:
            self._watch()
        finally:
            final = sessions.get(self.state, self.name)
            if final is not None and final.generation == self.generation:
                self._take_back_branch(final)  # the last commits before it completed
            self._close_if_terminal()
            if endpoint is not None:
                endpoint.close()
        return 0

    def _serve_endpoint(self) -> AgentEndpoint | None:
        """The TUI's channel to ov, with the secret ``start_agent`` put into its environment."""
        from overstory.agents.process import load_launch_env
        from overstory.endpoint.client import TOKEN_ENV
        from overstory.endpoint.routes import ROUTES
        from overstory.endpoint.server import AgentEndpoint

        try:
            tui_env = json.loads(launch_file(self.project, self.name).read_text(encoding="utf-8"))["env"]
            token = tui_env[TOKEN_ENV]
        except (OSError, ValueError, KeyError, TypeError):
            return None  # no secret was handed to the TUI: nothing could authenticate anyway
        endpoint = AgentEndpoint(self.project, self.name, self.generation, ROUTES,
                                 load_launch_env(self.project, self.name)).start()
        endpoint.open_turn(token)
        endpoint.set_turn_env(tui_env)  # `ov guard` asks the endpoint: it decides with what the TUI's hooks see
        return endpoint

    def _take_back_branch(self, agent: Session) -> None:
        """A tmux agent's sandbox lives as long as its TUI: bring its commits out as they happen."""
        took = sandbox.take_back(self.project, agent)
        if took.status not in ("none", "unchanged"):
            record_event(self.project, self.name, self.generation,
                         "branch_take_back" if took.status == "moved" else "branch_refused",
                         f"branch {agent.branch}: {took.status}" + (f": {took.detail}" if took.detail else ""))

    def _watch(self) -> None:
        tmux = server(self.project)
        last_print = ""
        last_touch = 0.0
        failed_captures = 0
        while not self.stopping:
            agent = self.current()
            if agent is None:
                break
            if agent.state == "booting":  # `ov sling` is still starting the TUI (and handles its failure)
                time.sleep(POLL_SECONDS)
                continue
            self._take_back_branch(agent)
            if agent.turn_pgid is not None:
                self.last_seen = agent
            status = pane_status(agent)
            pane = find_pane(tmux, agent.tmux_session) if agent.tmux_session else None
            text = capture_pane(pane) if pane is not None else None
            failed_captures = failed_captures + 1 if status == "alive" and text is None else 0
            if status == "gone" or failed_captures >= CAPTURE_FAILURES_FOR_GONE:
                self._pane_gone(agent)
                break
            if status == "not_started" or text is None:
                time.sleep(POLL_SECONDS)
                continue
            tui = tui_of(agent)
            screen = tui.read_screen(text)
            fingerprint = tui.activity_fingerprint(text)
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
                    record_event(self.project, self.name, self.generation, "tmux_type_failed", str(exc)[:300])
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
        from overstory.store.lifecycle import PERSISTENT_CAPABILITIES, terminal_mail_sent

        return agent.capability not in PERSISTENT_CAPABILITIES and terminal_mail_sent(
            self.state, agent, agent.created_at)

    def _complete(self, agent: Session) -> None:
        outcome = sessions.transition(self.state, self.name, self.generation, "completed", actor=ACTOR,
                                      reason="terminal mail sent and its TUI is idle",
                                      expect={"working", "stalled"})
        if outcome.ok:
            record_event(self.project, self.name, self.generation, "tmux_completed",
                          "completed: terminal mail sent and the TUI idle; closing its session")
            kill_session(self.project, agent)
            sessions.update_fields(self.state, self.name, self.generation, turn_pgid=None, turn_start_ticks=None)

    def _pane_gone(self, agent: Session) -> None:
        from overstory.store.lifecycle import declare_zombie

        reason = pane_exit_reason(self.project, agent)
        outcome = declare_zombie(self.state, agent, reason, actor=ACTOR)
        if outcome.ok:
            record_event(self.project, self.name, self.generation, "tmux_exit", reason[:300])
            kill_session(self.project, agent, grace=1.0)


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
    if code > 128 and os.path.basename(data["argv"][0]) == "bwrap":  # bwrap reports its command's signal as 128+N
        return finish(code, f"was killed by signal {code - 128}")
    return finish(code, f"exited with status {code}")


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m overstory.agents.tmux.driver")
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
