from __future__ import annotations

import click

from overstory.cli._common import completer, echo_json, json_option, project_paths, state_conn


@click.command(name="tree")
@click.option("--active", is_flag=True, help="Hide finished agents (unless an active one hangs below them).")
@click.option("--run", "run_ref", shell_complete=completer("complete_runs"), help="Only agents of this run (id or prefix).")
@json_option
def tree(active: bool, run_ref: str | None, as_json: bool) -> None:
    """Show the agent hierarchy under the operator, with each agent's state.

    \b
    ov tree
    ov tree --active
    ov tree --run run-2026 --json
    """
    from overstory.agents import hierarchy
    from overstory.store import runs
    from overstory.store.sessions import list_sessions

    project = project_paths()
    conn = state_conn(project)
    agents = list_sessions(conn)
    if run_ref is not None:
        run = runs.resolve(conn, run_ref)
        agents = [a for a in agents if a.run_id == run.id]
    roots = hierarchy.build_tree(agents)
    if active:
        roots = hierarchy.prune(roots, lambda agent: not agent.is_terminal)
    if as_json:
        echo_json(hierarchy.tree_document(roots))
        return
    if not roots:
        click.echo("operator\n(no agents" + (" active" if active else "") + ")")
        return
    from overstory.printable import line as escaped

    for line in hierarchy.render_lines(roots):  # states' reasons are agents' text
        click.echo(escaped(line))
