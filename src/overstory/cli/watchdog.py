from __future__ import annotations

import json
import signal
import typing as t

import click

from overstory import printable
from overstory.cli._common import project_paths


@click.command(name="watchdog")
@click.option("--once", is_flag=True, help="Reconcile, run one tick and exit.")
@click.option("--interval", type=float, help="Seconds between ticks (default: config watchdog.interval).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per report line (NDJSON).")
@click.option("--background", is_flag=True,
              help="Start it as a detached daemon (output in .overstory/run/watchdog.log) unless a watchdog runs "
                   "already for this project; print its pid and return.")
def watchdog(once: bool, interval: float | None, as_json: bool, background: bool) -> None:
    """Run the mechanical watchdog: re-adopt dead loops, stall and retire silent agents.

    Only one watchdog runs per project; a second one exits 1 naming the holder's
    pid. On start it reconciles the database with reality and reports orphans
    (it never deletes worktrees and only kills processes ov recorded). Thresholds
    come from the config section `watchdog` (interval, stale_after, zombie_after).

    \b
    ov watchdog                # until Ctrl-C or SIGTERM
    ov watchdog --once --json  # one reconcile + one tick, for scripts
    ov watchdog --background   # a daemon; stop it with `kill PID`
    OV_WATCHDOG_STALE_AFTER=60 ov watchdog --interval 2
    """
    from overstory.clock import iso, now_ms
    from overstory.config.load import load as load_config
    from overstory.watchdog.daemon import Action, ReconcileReport, Watchdog, WatchdogLock, WatchdogSettings

    if interval is not None and not 0 < interval < float("inf"):  # nan and inf too: they would spin or hang
        raise click.BadParameter("must be a number of seconds greater than 0", param_hint="--interval")
    project = project_paths()
    if background:
        if once:
            raise click.UsageError("--background runs until stopped; it does not go with --once")
        _start_background(project, interval, as_json)
        return
    config = load_config(project.config_file, project.local_config_file)
    settings = WatchdogSettings.from_config(config, interval=interval)
    stopping = {"flag": False}

    def on_signal(signum: int, frame: object) -> None:
        stopping["flag"] = True

    def emit(document: dict[str, t.Any], text: str) -> None:  # details quote agents' text: escaped
        click.echo(json.dumps(document, default=str) if as_json else printable.line(text))

    def on_reconcile(report: ReconcileReport) -> None:
        if as_json:
            emit({"kind": "reconcile", **report.as_dict()}, "")
            return
        for line in report.summary_lines():
            click.echo(printable.line(f"{iso(now_ms())} {line}"))

    def on_tick(actions: list[Action]) -> None:
        for action in actions:
            emit({"kind": "action", **action.as_dict()}, f"{iso(action.at)} {action.agent}: {action.kind}: {action.detail}")
        if once and as_json:
            emit({"kind": "tick", "actions": len(actions)}, "")

    with WatchdogLock(project):
        previous = signal.signal(signal.SIGTERM, on_signal)
        dog = Watchdog(project, settings)
        try:
            if not as_json:
                click.echo(f"{iso(now_ms())} watchdog running (interval {settings.interval:g}s, stale after "
                           f"{settings.stale_after:g}s, zombie after {settings.zombie_after:g}s)")
            dog.run(once=once, should_stop=lambda: stopping["flag"], on_reconcile=on_reconcile, on_tick=on_tick)
        except KeyboardInterrupt:
            pass
        finally:
            dog.close()
            signal.signal(signal.SIGTERM, previous)


def _start_background(project: t.Any, interval: float | None, as_json: bool) -> None:
    from overstory.watchdog.background import ensure_watchdog

    found = ensure_watchdog(project, interval=interval)
    if as_json:
        click.echo(json.dumps(found.as_dict()))
    else:
        click.echo(describe_start(found))


def describe_start(found: t.Any) -> str:
    """One line on a WatchdogStart (shared with `ov coordinator start --watchdog`)."""
    if found.started:
        return f"started the watchdog: pid {found.pid} (log {found.log}; stop it with `kill {found.pid}`)"
    return f"a watchdog runs already for this project: pid {found.pid}; started none"
