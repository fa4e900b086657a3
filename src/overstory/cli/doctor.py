from __future__ import annotations

import click

from overstory.cli._common import echo_json, json_option
from overstory.project.health import CATEGORIES


def _categories_epilog() -> str:
    width = max(map(len, CATEGORIES))
    lines = [f"  {name:<{width}}  {what}" for name, what in CATEGORIES.items()]
    return "\b\nCategories (--category):\n" + "\n".join(lines)


def _split_categories(ctx: click.Context, param: click.Parameter, given: tuple[str, ...]) -> tuple[str, ...]:
    """``--category a,b --category c`` -> (a, b, c); an unknown name is a one-line error naming the known ones."""
    from overstory.errors import UsageError

    names = tuple(part.strip() for value in given for part in value.split(",") if part.strip())
    unknown = [name for name in names if name not in CATEGORIES]
    if unknown:
        raise UsageError(f"--category: unknown categor{'y' if len(unknown) == 1 else 'ies'} "
                         f"{', '.join(map(repr, unknown))}; known: {', '.join(CATEGORIES)}")
    return names


@click.command(name="doctor", epilog=_categories_epilog())
@click.option("--states", is_flag=True, help="Print the agent state transition table instead.")
@click.option("--repair", is_flag=True, help="Recreate tables and indexes missing from a database (empty).")
@click.option("--category", "categories", multiple=True, metavar="NAME[,NAME]", callback=_split_categories,
              help=f"Run only this category of checks (repeatable, or comma-separated): {', '.join(CATEGORIES)}.")
@click.option("--executor", type=click.Choice(("local", "ray")),
              help="Check this executor (default: config executor.kind); ray: the cluster at executor.ray.address.")
@json_option
@click.pass_context
def doctor(ctx: click.Context, states: bool, repair: bool, categories: tuple[str, ...], executor: str | None,
           as_json: bool) -> None:
    """Check git, tmux, Python, each runtime, the databases, the config and what runs; with executor ray, the
    cluster (reachable, nodes alive, the same ov and the configured runtimes on each node, clock skew).

    Exits 1 if any check fails (warnings do not fail). What runs: orphan agent
    processes (recorded for an agent that ended or was re-slung), a second
    watchdog, and whether this project's `ov serve` answers.

    \b
    ov doctor
    ov doctor --json
    ov doctor --category processes,serve   # only those checks
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
    checks = run_checks(ctx.find_root().obj.project_option, repair=repair, categories=categories or None,
                        executor=executor)
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        echo_json({"ok": not failed, "checks": [c.as_dict() for c in checks]})
    else:
        marks = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}
        shown = None
        for check in checks:
            if check.category != shown:
                shown = check.category
                click.echo(f"{shown}:")
            click.echo(f"[{marks[check.status]}] {check.name}: {check.detail}")
            if check.extra and check.extra.get("start_cost"):
                from overstory.runtimes.start_costs import describe

                click.echo(f"       {describe(check.extra['start_cost'])}")
            if check.hint and check.status != "ok":
                click.echo(f"       fix: {check.hint}")
    if failed:
        ctx.exit(1)
