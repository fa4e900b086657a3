"""`ov schedule`: start work by itself, on a cron schedule or when mail reaches the operator."""

from __future__ import annotations

import typing as t

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn
from overstory.cli.main import SuggestingGroup


@click.group(name="schedule", cls=SuggestingGroup)
def schedule() -> None:
    """Schedules and mail triggers that start work: fired by the watchdog (`ov watch` or `ov watchdog`).

    \b
    ov schedule add deps --cron "0 2 * * *" -- sling builder deps-{date} --prompt "update dependencies"
    ov schedule add review --on-mail merge_ready -- sling reviewer review-{from}-{n} --prompt "review {from}"
    ov schedule add ci --on-webhook -- sling builder fix-{delivery} --prompt "CI failed"
    ov schedule list
    ov schedule run-now deps
    """


@schedule.command(name="add", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.option("--cron", "cron", help="Cron expression in the local time zone: five fields, minute hour day month "
                                     "weekday (six are refused: whose order?).")
@click.option("--seconds", "seconds", help="With --cron: the seconds field (e.g. \"*/20\"); default: at second 0.")
@click.option("--every", "every", help="A simple interval instead of --cron: 20s, 5m, 2h (dividing a minute, hour or "
                                       "day evenly).")
@click.option("--on-mail", "mail_type", help="Fire once for each mail of this type that reaches the operator.")
@click.option("--from", "mail_from", help="With --on-mail: only mail from this agent.")
@click.option("--on-webhook", "webhook", is_flag=True,
              help="Fire once for each POST to /hooks/NAME on `ov serve`, with the secret printed now (once).")
@click.option("--overlap", type=click.Choice(["skip", "allow"]), default="skip", show_default=True,
              help="skip: no fire while the previous fire's agent is still working, parked or waiting for a "
                   "decision; allow: fire anyway.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@json_option
def add(name: str, cron: str | None, seconds: str | None, every: str | None, mail_type: str | None,
        mail_from: str | None, webhook: bool, overlap: str,
        command: tuple[str, ...], as_json: bool) -> None:
    """Add a schedule NAME that runs `ov COMMAND...` (sling, loop or coordinator send).

    In the command, {date} (YYYYMMDD) and {time} (HHMM) are the due time's, {n} the
    fire's number; a mail trigger also fills {from} and {mail_id}, a webhook {delivery}
    (the delivery id). A six-field cron is refused (croniter reads seconds last, Quartz
    and node-cron first): name the seconds with --seconds, or use --every 20s. Prints the
    next three fire times. A webhook's secret is printed once and stored only hashed; the
    sender POSTs to /hooks/NAME on `ov serve` with `Authorization: Bearer SECRET` (or
    ?secret=SECRET) and a delivery id header (X-Delivery-Id or X-GitHub-Delivery): a
    delivery fires once however often it is sent. Missed fires while no
    watchdog ran: config schedules.catch_up (latest: once; none: skipped). With
    --overlap skip (the default) an occasion that comes while the agent of an earlier
    fire is still active, or its fire still runs, is skipped (an event, counted in `ov
    schedule list`). After a failed fire the schedule backs off (config
    schedules.backoff, doubling up to schedules.backoff_max) and mails you only once
    until a fire succeeds again.

    \b
    ov schedule add nightly --cron "0 2 * * *" -- loop builder green-{date} --prompt "..." --check "pytest -q"
    ov schedule add tick --every 20s -- coordinator send "anything new?"
    ov schedule add review --on-mail merge_ready --from builder-api -- sling reviewer rev-{n} --prompt "..."
    ov schedule add ci --on-webhook -- sling builder ci-{n} --prompt "look at the failed CI run"
    """
    from overstory.clock import iso, now_ms
    from overstory.errors import UsageError
    from overstory.names import validate_name
    from overstory.scheduling.scheduler import check_command, check_cron, every_cron, next_fires, zone_label
    from overstory.store import mail, schedules

    validate_name(name, "schedule name")
    if [bool(cron), bool(every), bool(mail_type), webhook].count(True) != 1:
        raise UsageError("give exactly one of --cron EXPRESSION, --every INTERVAL, --on-mail TYPE or --on-webhook")
    if seconds is not None and not cron:
        raise UsageError("--seconds goes with --cron")
    if mail_from and not mail_type:
        raise UsageError("--from goes with --on-mail")
    argv = check_command(command)
    agent = _agent_template(_parse_check(argv))
    conn = state_conn(project_paths())
    now = now_ms()
    secret = None
    if cron or every:
        expression = check_cron(cron, seconds) if cron else every_cron(every or "")
        created = schedules.add(conn, name, kind=schedules.CRON, argv=argv, cron=expression, cursor=now,
                                overlap=overlap, agent=agent)
    elif webhook:
        from overstory.scheduling.scheduler import new_secret

        secret, hashed = new_secret()
        created = schedules.add(conn, name, kind=schedules.WEBHOOK, argv=argv, cursor=0, overlap=overlap,
                                agent=agent, secret_hash=hashed)
    else:
        assert mail_type is not None
        mail.check_type(mail_type)
        if mail_from:
            validate_name(mail_from, "--from agent")
        created = schedules.add(conn, name, kind=schedules.MAIL, argv=argv, mail_type=mail_type, mail_from=mail_from,
                                cursor=schedules.max_mail_id(conn), overlap=overlap, agent=agent)
    upcoming = next_fires(created.cron, now) if created.cron else []
    following = upcoming[0] if upcoming else None
    if as_json:
        echo_json({**_document(created, following), "next_at": iso(following),
                   "next_fires": [iso(at) for at in upcoming], **({"secret": secret} if secret else {})})
        return
    click.echo(f"added schedule {name}: {created.trigger()} -> ov {' '.join(argv)} (overlap: {overlap})")
    if secret is not None:
        from overstory.serve_token import running_address

        base = running_address(project_paths()) or "http://<ov serve's address>"
        click.echo(f"  secret (shown this once; only its hash is kept): {secret}")
        click.echo(f"  sender: POST {base}/hooks/{name} with `Authorization: Bearer <secret>` (or ?secret=<secret>) "
                   "and an X-Delivery-Id header; keep `ov serve` running")
        return
    if upcoming:
        from overstory.scheduling.scheduler import local_text

        click.echo(f"  next fires ({zone_label(upcoming[0])}): " + ", ".join(local_text(at) for at in upcoming))
    click.echo("  fired by the watchdog: keep `ov watch` or `ov watchdog` running")


def _parse_check(argv: list[str]) -> dict[str, t.Any]:
    """Parse the command line as `ov` would (without running it), so a typo fails now, not at 2 am; its
    parameters."""
    from overstory.cli.main import cli

    ctx = click.Context(cli, info_name="ov")
    command: t.Any = cli
    args = list(argv)
    while isinstance(command, click.Group) and args:
        command = command.get_command(ctx, args[0])
        if command is None:
            raise click.UsageError(f"ov {argv[0]}: no such command")
        ctx = click.Context(command, info_name=args[0], parent=ctx)
        args = args[1:]
    try:
        return dict(command.make_context(ctx.info_name, args, parent=ctx.parent).params)
    except click.exceptions.Exit:
        return {}
    except click.ClickException as exc:
        raise click.UsageError(f"the scheduled command `ov {' '.join(argv)}` would fail: {exc.format_message()}") from None


def _agent_template(params: t.Mapping[str, t.Any]) -> str | None:
    """The agent a `sling` or `loop` command starts, placeholders unfilled (as `ov sling` names it)."""
    if not params.get("capability") or not params.get("task_id"):
        return None  # coordinator send: it mails the coordinator, which lives on
    return str(params.get("name") or f"{params['capability']}-{params['task_id']}")


def _document(item: t.Any, following: int | None) -> dict[str, t.Any]:
    from overstory.clock import iso

    return {"name": item.name, "trigger": item.trigger(), "kind": item.kind, "cron": item.cron,
            "on_mail": item.mail_type, "from": item.mail_from, "command": ["ov", *item.argv],
            "paused": item.paused, "fires": item.fired, "next_at": iso(following), "overlap": item.overlap,
            "agent": item.agent, "skipped": item.skipped, "last_skip": item.last_skip,
            "last_skip_at": iso(item.last_skip_at), "failures_in_a_row": item.failures,
            "backoff_until": iso(item.backoff_until)}


@schedule.command(name="list")
@json_option
def list_schedules(as_json: bool) -> None:
    """Schedules, their next fire (local time, zone stated) and their last fire.

    \b
    ov schedule list
    ov schedule list --json
    """
    from overstory.clock import iso, now_ms
    from overstory.scheduling.scheduler import local_text, next_due, zone_label
    from overstory.store import schedules

    conn = state_conn(project_paths())
    now = now_ms()
    rows = []
    for item in schedules.list_all(conn):
        following = next_due(item.cron, max(now, item.cursor)) if item.cron and not item.paused else None
        recent = schedules.recent_fires(conn, item.id, 1)
        last = recent[0] if recent else None
        rows.append((item, following, last))
    if as_json:
        echo_json({"time_zone": zone_label(now), "schedules": [
            {**_document(item, following), "next_local": local_text(following) if following else None,
             "last_fire": None if last is None else {
                 "n": last["n"], "status": last["status"], "exit_code": last["exit_code"],
                 "at": iso(last["claimed_at"]), "command": ["ov", *last["argv"]]}}
            for item, following, last in rows]})
        return
    if not rows:
        click.echo("no schedules; add one with `ov schedule add NAME --cron \"0 2 * * *\" -- sling ...`")
        return
    from overstory.printable import line

    click.echo(f"times are local: {zone_label(now)}")
    for item, following, last in rows:
        state = "paused" if item.paused else "active"
        when = local_text(following) if following else {"mail": "on each mail", "webhook": "on each POST"}.get(item.kind, "-")
        click.echo(line(f"{item.name}  [{state}]  {item.trigger()}  overlap: {item.overlap}"))
        click.echo(line(f"  next: {when}   fires: {item.fired}   skipped: {item.skipped}   "
                        f"command: ov {' '.join(item.argv)}"))
        if last is not None:
            click.echo(f"  last: #{last['n']} {local_text(last['claimed_at'])} {last['status']}"
                       + (f" (exit {last['exit_code']})" if last["exit_code"] not in (None, 0) else ""))
        if item.failures:
            click.echo(f"  failing: {item.failures} fire(s) in a row; backing off until {local_text(item.backoff_until)}")
        if item.last_skip:
            click.echo(line(f"  last skipped: {local_text(item.last_skip_at)}: {item.last_skip}"))


@schedule.command(name="remove")
@click.argument("name")
def remove(name: str) -> None:
    """Remove a schedule (and its fire history).

    \b
    ov schedule remove nightly
    """
    from overstory.errors import ScheduleError
    from overstory.store import schedules

    if not schedules.remove(state_conn(project_paths()), name):
        raise ScheduleError(f"no schedule named {name!r}; `ov schedule list` shows them")
    click.echo(f"removed schedule {name}")


@schedule.command(name="pause")
@click.argument("name")
def pause(name: str) -> None:
    """Stop firing a schedule until `ov schedule resume`.

    \b
    ov schedule pause nightly
    """
    from overstory.store import schedules

    schedules.set_paused(state_conn(project_paths()), name, True)
    click.echo(f"paused schedule {name}")


@schedule.command(name="resume")
@click.argument("name")
def resume(name: str) -> None:
    """Fire a paused schedule again, from now on (what fell due while paused is not caught up).

    \b
    ov schedule resume nightly
    """
    from overstory.clock import now_ms
    from overstory.store import schedules

    conn = state_conn(project_paths())
    found = schedules.require(conn, name)
    cursor = now_ms() if found.kind == schedules.CRON else schedules.max_mail_id(conn)
    schedules.set_paused(conn, name, False, cursor=cursor)
    click.echo(f"resumed schedule {name}")


@schedule.command(name="run-now")
@click.argument("name")
@json_option
def run_now(name: str, as_json: bool) -> None:
    """Fire a schedule now, in the foreground (paused ones too, and past its overlap policy and back-off);
    exits 1 when its command failed.

    \b
    ov schedule run-now nightly
    """
    import os

    from overstory import procs
    from overstory.clock import now_ms
    from overstory.errors import ScheduleError
    from overstory.scheduling.runner import run_fire
    from overstory.scheduling.scheduler import agent_name, render
    from overstory.store import schedules

    project = project_paths()
    conn = state_conn(project)
    found = schedules.require(conn, name)
    now = now_ms()
    if found.paused:
        schedules.set_paused(conn, name, False)
    try:
        fire = schedules.claim(conn, found, f"manual:{now}", cursor=found.cursor, due_at=now,
                               claimer_pid=os.getpid(), claimer_ticks=procs.start_ticks(os.getpid()),
                               render=lambda n: render(found.argv, at_ms=now, n=n),
                               agent=lambda n: agent_name(found, at_ms=now, n=n))
    finally:
        if found.paused:
            schedules.set_paused(conn, name, True)
    if fire is None or isinstance(fire, schedules.Skip):  # a manual fire is never held back
        raise ScheduleError(f"schedule {name} was just fired by someone else")
    done = run_fire(project, int(fire["id"]))
    if done is None:
        raise ScheduleError(f"fire {fire['id']} of {name} was taken by another runner")
    if as_json:
        echo_json({"schedule": name, "n": done["n"], "status": done["status"], "exit_code": done["exit_code"],
                   "command": ["ov", *done["argv"]], "output": done["output"]})
    else:
        from overstory.printable import block, line

        click.echo(line(f"fired {name} #{done['n']}: ov {' '.join(done['argv'])} -> {done['status']}"
                        + (f" (exit {done['exit_code']})" if done["exit_code"] not in (None, 0) else "")))
        if done["output"]:
            click.echo(block(done["output"]))
    if done["status"] != "ok":
        raise click.exceptions.Exit(1)
