"""`ov costs`: what the agents spent, grouped."""

from __future__ import annotations

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn


@click.command(name="costs")
@click.option("--by", "by", type=click.Choice(["agent", "run", "capability", "model"]), default="agent",
              show_default=True, help="How to group the turns.")
@click.option("--since", help="Only turns started since then: 2h, 7d or an ISO time.")
@click.option("--prices", "show_prices", is_flag=True, help="Print the price table used for estimates instead.")
@json_option
def costs(by: str, since: str | None, show_prices: bool, as_json: bool) -> None:
    """Tokens (input, output, cache), dollars, turns and tool calls, with totals.

    Dollars are the runtime's own figure where it reported one, and ov's estimate
    (marked est.) for turns stopped before it did; turns in progress are shown as
    their live estimate.

    \b
    ov costs
    ov costs --by model --since 24h
    ov costs --by run --json
    ov costs --prices
    """
    from overstory.clock import parse_since
    from overstory.config.load import load as load_config
    from overstory.errors import UsageError
    from overstory.runtimes.prices import PriceTable
    from overstory.views.costs import render_text, report

    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    table = PriceTable(config.prices)
    if show_prices:
        rows = table.as_rows()
        if as_json:
            echo_json({"prices": rows, "unknown_models_priced_as": table.most_expensive})
            return
        for row in rows:
            click.echo(f"{row['model']:<22} in ${row['input_per_mtok']:g}  out ${row['output_per_mtok']:g}  "
                       f"cache read ${row['cache_read_per_mtok']:g}  write ${row['cache_write_per_mtok']:g}  "
                       "per million tokens")
        click.echo(f"(an unknown model is priced as {table.most_expensive})")
        return
    try:
        since_ms = parse_since(since) if since else None
    except ValueError as exc:
        raise UsageError(f"--since: {exc}") from None
    document = report(state_conn(project), by=by, since_ms=since_ms, prices=table)
    if as_json:
        echo_json(document)
    else:
        click.echo(render_text(document))
