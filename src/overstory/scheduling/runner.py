"""The runner of one schedule fire: ``python -m overstory.scheduling.runner --project ROOT --fire ID``.

Started detached by the watchdog (``scheduler``) right after it claimed the fire, or run
in the foreground by `ov schedule run-now`. It takes the fire (``claimed`` -> ``running``,
a compare-and-swap only one runner ever wins), runs the fire's `ov` command line as the
operator would in the project, and settles the row ``ok`` or ``failed`` with the exit
code and the end of the output. A failure is a ``schedule_failed`` event and, when it is
the first of a row, one ``escalation`` mail to the operator, written with the settled row
(``scheduler.failure_notice``); never a crash. If this process dies while the command runs, the next watchdog tick marks
the fire ``lost`` (with its own mail).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import typing as t
from pathlib import Path

from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import schedules
from overstory.store.db import open_state


def run_fire(project: ProjectPaths, fire_id: int, *, timeout: float | None = None) -> dict[str, t.Any] | None:
    """Take fire ``fire_id`` and run it; its settled row, or None when another runner has it."""
    from overstory.resources import ov_executable
    from overstory.scheduling.scheduler import backoff_of, failure_notice, record_event

    state = open_state(project.state_db)
    try:
        if not schedules.start(state, fire_id, runner_pid=os.getpid(), runner_ticks=procs.start_ticks(os.getpid())):
            return None
        fire = schedules.fire(state, fire_id)
        assert fire is not None
        settings, broken = _settings(project)
        timeout = settings.timeout if timeout is None else timeout
        command, _ = ov_executable()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}  # it acts as the operator
        procs.kill_point("schedule_running")
        code: int | None = None
        if broken is not None:  # `ov` would refuse it too: a failed fire that says why, not a lost one
            output = f"the project's configuration cannot be read: {broken}"
        else:
            try:
                done = subprocess.run([*command, "--project", str(project.root), *fire["argv"]], cwd=project.root,
                                      env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                      timeout=timeout)
                code = done.returncode
                output = (done.stdout + done.stderr).strip()
            except subprocess.TimeoutExpired as exc:
                output = f"{_text(exc.stdout)}{_text(exc.stderr)}\n[ov] stopped after {timeout:g}s (schedules.timeout)"
            except OSError as exc:
                output = f"could not run ov: {exc}"
        status = "ok" if code == 0 else "failed"
        last = output.splitlines()[-1] if output else ""
        schedules.finish(state, fire_id, status=status, exit_code=code, output=output, backoff=backoff_of(settings),
                         notice=failure_notice(fire, last or "no output") if status != "ok" else None)
        name = fire["schedule"] or "-"
        line = f"fire {fire['n']}: ov {' '.join(fire['argv'])} -> " + (f"exit {code}" if code is not None else "error")
        record_event(project, "schedule_fired" if status == "ok" else "schedule_failed", name,
                     f"{line}: {last}"[:300], {"fire": fire_id, "n": fire["n"], "exit_code": code, "status": status})
        return schedules.fire(state, fire_id)
    finally:
        state.close()


def _settings(project: ProjectPaths) -> tuple[t.Any, str | None]:
    """Config ``schedules`` (its defaults, and why, when the configuration cannot be read)."""
    from overstory.config.load import load as load_config
    from overstory.errors import OrchestratorError

    try:
        return load_config(project.config_file, project.local_config_file).schedules, None
    except OrchestratorError as exc:
        from overstory.config.model import SchedulesSection

        return SchedulesSection(), str(exc)


def _text(value: t.Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value or ""


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ov-schedule-runner")
    parser.add_argument("--project", required=True)
    parser.add_argument("--fire", required=True, type=int)
    args = parser.parse_args(argv)
    run_fire(ProjectPaths(Path(args.project)), args.fire)
    return 0


if __name__ == "__main__":
    sys.exit(main())
