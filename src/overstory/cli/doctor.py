from __future__ import annotations

import click

from overstory.cli._common import echo_json, json_option


@click.command(name="doctor")
@click.option("--states", is_flag=True, help="Print the agent state transition table instead.")
@click.option("--repair", is_flag=True, help="Recreate tables and indexes missing from a database (empty).")
@click.option("--executor", type=click.Choice(("local", "ray")),
              help="Check this executor (default: config executor.kind); ray: the cluster at executor.ray.address.")
@json_option
@click.pass_context
def doctor(ctx: click.Context, states: bool, repair: bool, executor: str | None, as_json: bool) -> None:
    """Check git, tmux, Python, each runtime, the databases and the config; with executor ray, the cluster
    (reachable, nodes alive, the same ov and the configured runtimes on each node, clock skew).

    Exits 1 if any check fails (warnings do not fail).

    \b
    ov doctor
    ov doctor --json
    ov doctor --states      # which state may follow which
    ov doctor --repair      # put back tables missing from a damaged database
    ov doctor --executor ray  # the Ray cluster too, even if config executor.kind is local
    """
    from overstory.project.doctor import FAIL, run_checks
    from overstory.store.sessions import transition_table

    if states:
        table = transition_table()
        if as_json:
            echo_json({to: sources for to, sources in table})
        else:
            for to, sources in table:
                click.echo(f"{to:<14} <- {', '.join(sources) if sources else '(new generation only)'}")
        return
    checks = run_checks(ctx.find_root().obj.project_option, repair=repair, executor=executor)
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        echo_json({"ok": not failed, "checks": [c.as_dict() for c in checks]})
    else:
        marks = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}
        for check in checks:
            click.echo(f"[{marks[check.status]}] {check.name}: {check.detail}")
            if check.hint and check.status != "ok":
                click.echo(f"       fix: {check.hint}")
    if failed:
        ctx.exit(1)
