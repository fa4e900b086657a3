"""`ov policy audit`: the tools and commands agents used, what the ledger's rules did not know, what varied."""

from __future__ import annotations

import click

from overstory.cli._common import completer, echo_json, json_option, project_paths, state_conn
from overstory.cli.main import SuggestingGroup

TYPE_CHECKING = False
if TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.guards.classify import LedgerRules


@click.group(name="policy", cls=SuggestingGroup)
def policy() -> None:
    """Look at what agents did with their tools, to tune the ledger's rules.

    \b
    ov policy audit
    ov policy audit --run run-20260101-120000-ab12 --json
    """


@policy.command(name="audit")
@click.option("--run", "run_ref", metavar="RUN", shell_complete=completer("complete_runs"),
              help="Only this run's calls (an id or a unique prefix).")
@click.option("--since", help="Only calls since then: 2h, 7d or an ISO time (default: 24h).")
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="How many tools to show under 'inputs that varied most'.")
@json_option
def audit(run_ref: str | None, since: str | None, top: int, as_json: bool) -> None:
    """The tools and commands agents used, which no ledger rule knew, and which inputs varied most.

    A call no rule placed counts as a local_write; the audit names it with the
    `ledger.read_only` / `ledger.side_effects` patterns that would place it.

    \b
    ov policy audit
    ov policy audit --since 7d
    ov policy audit --run run-20260101-120000-ab12 --json
    """
    from overstory.clock import parse_since
    from overstory.config.load import load as load_config
    from overstory.errors import OrchestratorError, UsageError
    from overstory.store import runs
    from overstory.views.policy_audit import audit as audit_of
    from overstory.views.policy_audit import render_text

    if run_ref and since:
        raise UsageError("--run and --since: give one (a run's calls, or a period's)")
    project = project_paths()
    conn = state_conn(project)
    run_id, since_ms = None, None
    if run_ref:
        run_id = runs.resolve(conn, run_ref).id
    else:
        try:
            since_ms = parse_since(since or "24h")
        except ValueError as exc:
            raise UsageError(f"--since: {exc}") from None
    config = load_config(project.config_file, project.local_config_file)
    rules = _rules(config)
    events = None
    if project.events_db.exists():
        from overstory.store.db import open_events

        try:
            events = open_events(project.events_db)
        except OrchestratorError:
            events = None
        else:
            click.get_current_context().call_on_close(events.close)
    document = audit_of(conn, events, run_id=run_id, since_ms=since_ms, rules=rules, top=top)
    if as_json:
        echo_json(document)
    else:
        click.echo(render_text(document))


def _rules(config: Config) -> LedgerRules:
    """The project's ledger rules: its patterns ahead of the defaults."""
    from overstory.guards.classify import DEFAULT_LEDGER_RULES, LedgerRules

    section = config.ledger
    if not (section.read_only or section.side_effects):
        return DEFAULT_LEDGER_RULES
    return LedgerRules.from_texts(section.read_only, section.side_effects)
