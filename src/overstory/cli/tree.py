from __future__ import annotations

import click

from overstory.cli._common import completer, echo_json, json_option, project_paths, state_conn


@click.command(name="tree")
@click.option("--active", is_flag=True, help="Hide finished agents (unless an active one hangs below them).")
@click.option("--capability", shell_complete=completer("complete_capabilities"),
              help="Only agents of this capability (several: builder,scout), with the agents above them.")
@click.option("--state", help="Only agents in this state (several: parked,zombie), with the agents above them.")
@click.option("--parent", shell_complete=completer("complete_agents"),
              help="Only what hangs below this agent (its children and theirs).")
@click.option("--run", "run_ref", shell_complete=completer("complete_runs"), help="Only agents of this run (id or prefix).")
@json_option
def tree(active: bool, capability: str | None, state: str | None, parent: str | None, run_ref: str | None,
         as_json: bool) -> None:
    """Show the agent hierarchy under the operator, with each agent's state.

    --capability and --state keep the matching agents and the agents above them (so
    each still hangs where it belongs); --parent shows only the tree below an agent.
    An unknown state or capability is a usage error (exit 2).

    \b
    ov tree
    ov tree --active
    ov tree --state parked,zombie
    ov tree --parent lead-1 --capability builder
    ov tree --run run-2026 --json
    """
    from overstory.agents import hierarchy
    from overstory.store.sessions import list_sessions
    from overstory.views.selection import Selection

    selection = Selection(capability, state, parent, run_ref)  # a usage error before anything is opened
    project = project_paths()
    conn = state_conn(project)
    selection.resolve(conn)  # an unknown --parent: "no agent named ... (did you mean ...)"; --run's id
    agents = list_sessions(conn)
    if selection.run_id is not None:
        agents = [a for a in agents if a.run_id == selection.run_id]
    roots = hierarchy.build_tree(agents)
    if parent is not None and parent != hierarchy.OPERATOR:
        roots = hierarchy.below(roots, parent)
    if selection.capabilities is not None or selection.states is not None:
        roots = hierarchy.prune(roots, lambda agent: selection.matches(agent, parent=False))
    if active:
        roots = hierarchy.prune(roots, lambda agent: not agent.is_terminal)
    top = parent or hierarchy.OPERATOR
    if as_json:
        echo_json(hierarchy.tree_document(roots, top))
        return
    if not roots:
        click.echo(f"{top}\n(no agents" + (" active" if active else "") + (" match" if not selection.empty else "")
                   + ")")
        return
    from overstory.printable import line as escaped

    for line in hierarchy.render_lines(roots, top):  # states' reasons are agents' text
        click.echo(escaped(line))
