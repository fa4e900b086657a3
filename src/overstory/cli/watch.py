from __future__ import annotations

import threading
import time
import typing as t

import click

from overstory.cli._common import project_paths

if t.TYPE_CHECKING:
    from overstory.paths import ProjectPaths


class _WatchdogThread:
    """Runs the watchdog beside the dashboard when this process wins the project's lock."""

    def __init__(self, project: ProjectPaths) -> None:
        self.project = project
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.note = "watchdog off (--no-watchdog)"
        self.failure: str | None = None

    def start(self) -> None:
        from overstory.config.load import load as load_config
        from overstory.errors import LockHeld
        from overstory.watchdog.daemon import WatchdogLock, WatchdogSettings, lock_holder

        config = load_config(self.project.config_file, self.project.local_config_file)
        settings = WatchdogSettings.from_config(config)
        lock = WatchdogLock(self.project)
        try:
            lock.acquire()
        except LockHeld:
            holder = lock_holder(self.project)
            self.note = f"watchdog run by pid {holder}" if holder else "watchdog run by another process"
            return
        self.note = f"watchdog here, every {settings.interval:g}s"
        self.thread = threading.Thread(target=self._run, args=(lock, settings), name="ov-watchdog", daemon=True)
        self.thread.start()

    def _run(self, lock: t.Any, settings: t.Any) -> None:
        from overstory.watchdog.daemon import Watchdog

        try:
            dog = Watchdog(self.project, settings)  # its own connections: sqlite objects stay in one thread
            try:
                dog.run(should_stop=self.stop_event.is_set)
            finally:
                dog.close()
        except Exception as exc:  # shown in the header instead of killing the dashboard
            self.failure = f"watchdog stopped: {type(exc).__name__}: {exc}"
            self.note = self.failure
        finally:
            lock.release()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=30)


@click.command(name="watch")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between screen refreshes.")
@click.option("--once", is_flag=True, help="Print one frame and exit (no watchdog).")
@click.option("--no-watchdog", is_flag=True, help="Only display; do not run the watchdog here.")
@click.option("--width", type=click.IntRange(min=20), help="Render at this width instead of the terminal's.")
@click.option("--active", "active_only", is_flag=True, help="Hide completed agents.")
@click.option("--background", is_flag=True,
              help="Start the dashboard as a daemon (one per project): it runs the watchdog and writes its latest "
                   "frame to .overstory/run/watch/frame.txt; when one runs already, say so and start nothing.")
@click.option("--kill-others", is_flag=True,
              help="First stop this project's other `ov watch` processes (only ones ov started: checked by their "
                   "record, start time and command line).")
@click.option("--daemon", is_flag=True, hidden=True)  # the background dashboard itself (started by --background)
def watch(interval: float, once: bool, no_watchdog: bool, width: int | None, active_only: bool, background: bool,
          kill_others: bool, daemon: bool) -> None:
    """Live dashboard: agents, mail, problems, events, merge queue and totals.

    On a terminal it is interactive: active agents first, up/down selects one,
    enter shows its live stream, d its diff, a attaches (tmux mode), n nudges,
    m mails, s stops, r resumes, y/x approve or reject its pending gate, ? lists
    the keys and q quits. Not on a terminal it prints a plain frame every
    interval (--once: one frame); --width renders at that width. NO_COLOR=1
    removes every style.

    Runs the watchdog too, unless --no-watchdog or another process already holds
    the project's watchdog lock (then it only displays). A state marked `!` has
    no running agent loop.

    --background starts a detached dashboard that outlives the terminal: it runs
    the watchdog and rewrites .overstory/run/watch/frame.txt every interval (plain
    text, --width, default 120). The next `ov watch --background` finds it and
    reports it instead of starting a second; a plain `ov watch` says it runs and
    only displays. --kill-others stops this project's other `ov watch` processes
    first (SIGTERM, SIGKILL after 5 s), then does what the other options say.

    \b
    ov watch
    ov watch --no-watchdog --interval 5
    ov watch --once --width 120      # one frame, for scripts and tests
    ov watch --background            # a daemon: cat .overstory/run/watch/frame.txt
    ov watch --kill-others --once    # stop every other dashboard of this project
    """
    from overstory.watchdog import dashboards

    project = project_paths()
    if kill_others:
        stopped = dashboards.kill_others(project)
        click.echo(f"stopped {len(stopped)} other `ov watch`: pid {', '.join(map(str, stopped))}" if stopped
                   else "no other `ov watch` runs for this project", err=True)
    if daemon:
        _run_daemon(project, interval=interval, no_watchdog=no_watchdog, width=width or 120,
                    active_only=active_only)
        return
    if background:
        options = ["--interval", f"{interval:g}", "--width", str(width or 120),
                   *(["--no-watchdog"] if no_watchdog else []), *(["--active"] if active_only else [])]
        record, started = dashboards.start_background(project, options)
        frames = record.get("frames") or dashboards.frames_file(project)
        if started:
            click.echo(f"started the background dashboard: pid {record['pid']}; frames in {frames}")
        else:
            click.echo(f"a background dashboard runs already: pid {record['pid']}; frames in {frames} "
                       "(`ov watch --kill-others --background` replaces it)")
        return
    _run_foreground(project, interval=interval, once=once, no_watchdog=no_watchdog, width=width,
                    active_only=active_only)


def _stop_on_sigterm() -> None:
    """SIGTERM (`ov watch --kill-others`) ends the dashboard as Ctrl-C does: its finally blocks run (the watchdog
    lock, its record, the terminal's mode)."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def _run_daemon(project: ProjectPaths, *, interval: float, no_watchdog: bool, width: int, active_only: bool) -> None:
    """The background dashboard: the watchdog, and the latest plain frame written whole to frame.txt each interval."""
    import io
    import os
    import sys

    from rich.console import Console

    from overstory.store.db import open_events, open_state
    from overstory.ui.dashboard import render_frame
    from overstory.views import status as core
    from overstory.watchdog import dashboards

    lock = dashboards.BackgroundLock(project)
    if not lock.acquire():
        sys.exit(dashboards.ANOTHER_DAEMON)
    target = dashboards.frames_file(project)
    _stop_on_sigterm()
    dashboards.register(project, background=True, frames=target)
    dog = _WatchdogThread(project)
    state = open_state(project.state_db)
    events = open_events(project.events_db)
    try:
        if not no_watchdog:
            dog.start()
        while True:
            snapshot = core.dashboard_snapshot(state, events, include_completed=not active_only)
            buffer = io.StringIO()
            Console(file=buffer, width=width, color_system=None, force_terminal=False, highlight=False).print(
                render_frame(snapshot, width=width, height=None, watchdog_note=f"background, pid {os.getpid()}; "
                             + dog.note))
            temporary = target.with_name(f".{target.name}.tmp")
            temporary.write_text(buffer.getvalue(), encoding="utf-8")
            os.replace(temporary, target)
            time.sleep(interval)
    finally:
        dog.stop()
        state.close()
        events.close()
        dashboards.unregister(project)
        lock.release()


def _run_foreground(project: ProjectPaths, *, interval: float, once: bool, no_watchdog: bool, width: int | None,
                    active_only: bool) -> None:
    import sys

    from overstory.store.db import open_events, open_state
    from overstory.ui.dashboard import console_for, render_frame
    from overstory.views import status as core
    from overstory.watchdog import dashboards

    state = open_state(project.state_db)
    events = open_events(project.events_db)
    ctx = click.get_current_context()
    ctx.call_on_close(state.close)
    ctx.call_on_close(events.close)
    console = console_for(width)

    def frame(note: str, live: bool) -> t.Any:
        snapshot = core.dashboard_snapshot(state, events, include_completed=not active_only)
        return render_frame(snapshot, width=console.width, height=console.height if live else None,
                            watchdog_note=note)

    if once:
        console.print(frame("", live=False))
        return

    from rich.live import Live

    daemon = dashboards.background(project)
    if daemon is not None:
        click.echo(f"ov: the background dashboard runs (pid {daemon['pid']}; frames in {daemon.get('frames')}); "
                   "`ov watch --kill-others` stops it", err=True)
    _stop_on_sigterm()
    dashboards.register(project, background=False)
    ctx.call_on_close(lambda: dashboards.unregister(project))
    dog = _WatchdogThread(project)
    if not no_watchdog:
        dog.start()
    if sys.stdin.isatty() and sys.stdout.isatty() and width is None:
        from overstory.cli.watch_tui import run_interactive

        try:
            run_interactive(project, state, events, interval=interval, note=lambda: dog.note,
                            include_completed=not active_only)
        finally:
            dog.stop()
        return
    try:
        if not console.is_terminal:  # piped or redirected: one plain frame per interval, as it happens
            while True:
                console.print(frame(dog.note, False))
                console.print()
                sys.stdout.flush()
                time.sleep(interval)
        with Live(frame(dog.note, True), console=console, auto_refresh=False, screen=False,
                  vertical_overflow="crop") as live:
            while True:
                time.sleep(interval)
                live.update(frame(dog.note, True), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        dog.stop()
