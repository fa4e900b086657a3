"""`ov group`: task groups, the agents that work on one piece of work."""

from __future__ import annotations

import click

from overstory.cli._common import completer, echo_json, json_option, project_paths, state_conn
from overstory.cli.main import SuggestingGroup


@click.group(name="group", cls=SuggestingGroup)
def group() -> None:
    """Task groups: name the agents that work on one piece of work and follow them together.

    \b
    ov group create auth --description "login and sessions"
    ov group add auth builder-login builder-session
    ov sling builder tokens --group auth --prompt "..."
    ov group status auth
    ov group list
    """


@group.command(name="create")
@click.argument("name")
@click.option("--description", default="", help="What the group's work is (shown by `ov group list`).")
@json_option
def group_create(name: str, description: str, as_json: bool) -> None:
    """Create an empty group NAME (named like agents: lower case, digits, '-', '_', '.').

    \b
    ov group create auth --description "login and sessions"
    """
    from overstory.names import validate_name
    from overstory.store import groups

    validate_name(name, "group name")
    created = groups.create(state_conn(project_paths()), name, description)
    if as_json:
        from overstory.clock import iso

        echo_json({"name": created.name, "description": created.description, "created_at": iso(created.created_at)})
        return
    click.echo(f"created group {name}; add agents with `ov group add {name} AGENT...` or `ov sling ... --group {name}`")


@group.command(name="add")
@click.argument("name")
@click.argument("agents", nargs=-1, required=True, shell_complete=completer("complete_agents"))
@json_option
def group_add(name: str, agents: tuple[str, ...], as_json: bool) -> None:
    """Add agents to group NAME (all or none: an unknown agent adds nothing). Adding a member again does nothing.

    \b
    ov group add auth builder-login builder-session
    """
    from overstory.names import validate_name
    from overstory.store import groups

    validate_name(name, "group name")
    for agent in agents:
        validate_name(agent, "agent name")
    added = groups.add(state_conn(project_paths()), name, list(dict.fromkeys(agents)))
    if as_json:
        echo_json({"group": name, "added": added, "already": [a for a in dict.fromkeys(agents) if a not in added]})
        return
    click.echo(f"added to {name}: {', '.join(added)}" if added else f"nothing added: already in {name}")


@group.command(name="status")
@click.argument("name")
@json_option
def group_status(name: str, as_json: bool) -> None:
    """One group: each member's capability, state, task, turns, cost and branch; done/total and the total cost.

    A member is done when its agent is completed; dead ones (zombie) are counted apart.

    \b
    ov group status auth
    ov group status auth --json | jq '.members[] | select(.state != "completed") | .name'
    """
    from overstory.names import validate_name
    from overstory.views import groups as views

    validate_name(name, "group name")
    document = views.status_document(state_conn(project_paths()), name)
    if as_json:
        echo_json(document)
    else:
        click.echo(views.render_status(document))


@group.command(name="list")
@json_option
def group_list(as_json: bool) -> None:
    """Every group, oldest first: members, done, active and cost.

    \b
    ov group list
    ov group list --json
    """
    from overstory.views import groups as views

    found = views.listing(state_conn(project_paths()))
    if as_json:
        echo_json(found)
    else:
        click.echo(views.render_list(found))
