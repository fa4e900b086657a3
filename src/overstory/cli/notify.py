"""`ov notify test` (and `ov notify pending`): the notification targets of config ``notify``."""

from __future__ import annotations

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn
from overstory.cli.main import SuggestingGroup


@click.group(name="notify", cls=SuggestingGroup)
def notify() -> None:
    """Notifications through apprise: config notify.targets (URLs) and notify.on (events).

    \b
    ov notify test
    ov notify pending
    """


@notify.command(name="test")
@json_option
def test(as_json: bool) -> None:
    """Send a test message to every target and report each result (exit 1 if any failed).

    \b
    ov notify test
    ov notify test --json
    """
    from overstory.config.load import load as load_config
    from overstory.errors import ConfigError
    from overstory.notify import test_targets

    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    if not config.notify.targets:
        raise ConfigError("no notify.targets in the config: add apprise URLs, e.g. notify: {targets: "
                          "[\"ntfy://my-topic\"]}")
    results = test_targets(config)
    if as_json:
        echo_json([{"target": target, "ok": error is None, "error": error} for target, error in results])
    else:
        for target, error in results:
            click.echo(f"{target}: {'ok' if error is None else 'FAILED: ' + error}")
    if any(error is not None for _, error in results):
        raise click.exceptions.Exit(1)


@notify.command(name="pending")
@json_option
def pending(as_json: bool) -> None:
    """Notifications not sent yet (the watchdog retries them with backoff).

    \b
    ov notify pending
    ov notify pending --json
    """
    from overstory.clock import iso
    from overstory.printable import line
    from overstory.store.outbox import pending as unsent

    rows = unsent(state_conn(project_paths()))
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("nothing waiting to be sent")
    for row in rows:
        click.echo(line(f"#{row['id']} {row['kind']} {row['title']} (attempts {row['attempts']}, next "
                        f"{iso(row['next_at'])}{', last error: ' + row['last_error'] if row['last_error'] else ''})"))
