"""One `ov watch` frame, rendered with rich from a ``status.dashboard_snapshot`` document.

Pure rendering: no database, no clock. Columns are dropped from the least to the
most important as the terminal narrows, so names, states and costs always show.

Every text from the snapshot goes on screen through ``_plain``: its control characters
escaped (``printable.line``) and as a rich ``Text``, never as a string rich would read
as markup (a subject of ``[bold red]...`` stays those characters).
"""

from __future__ import annotations

import typing as t

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from overstory.printable import line as escaped
from overstory.views.status import elsewhere, format_idle, node_text, reason_text, spend_text

STATE_STYLES = {
    "booting": "cyan",
    "in_turn": "bold green",
    "between_turns": "blue",
    "working": "bold green",
    "stalled": "bold yellow",
    "parked": "magenta",
    "completed": "dim",
    "zombie": "bold red",
}
EVENT_STYLES = {"watchdog_zombie": "red", "watchdog_stalled": "yellow", "turn_failed": "yellow",
                "turn_retry": "yellow", "contract_violation": "yellow", "watchdog_readopt": "cyan",
                "budget_crossed": "magenta", "budget_parked": "magenta", "quota_parked": "magenta",
                "auth_parked": "bold red", "auth_failed": "red", "no_report": "yellow", "idle_nudge": "yellow",
                "agent_unparked": "cyan", "agent_resumed": "cyan"}

# Busy agents first, finished ones last, so an agent in a turn is never hidden behind completed ones.
STATE_RANK = {"in_turn": 0, "working": 0, "stalled": 1, "booting": 2, "parked": 3, "between_turns": 4,
              "zombie": 5, "completed": 6}

# (column, minimum console width at which it is shown)
AGENT_COLUMNS: tuple[tuple[str, int], ...] = (
    ("name", 0), ("state", 0), ("cost", 0), ("idle", 50), ("turns", 60), ("node", 70), ("why", 80), ("capability", 95),
    ("tool", 110), ("task", 125), ("parent", 140), ("tokens", 155),
)


def _plain(value: object, style: str = "") -> Text:
    """Text shown as it is: one line, control characters escaped, no markup."""
    return Text(escaped(value), style=style)


def _state_text(agent: dict[str, t.Any]) -> Text:
    label = agent["state"]
    if label == "parked" and agent.get("park_kind"):
        label += f":{agent['park_kind']}"
    if agent.get("loop_alive") is False:
        label += " !"
    return _plain(label, style=STATE_STYLES.get(agent["state"], ""))


def _cell_text(agent: dict[str, t.Any], column: str) -> str:
    cell = _cell(agent, column)
    return cell.plain if isinstance(cell, Text) else str(cell)


def _cell(agent: dict[str, t.Any], column: str) -> RenderableType:
    if column == "state":
        return _state_text(agent)
    if column == "cost":
        return _plain(spend_text(agent["cost_usd"], agent.get("budget")))
    if column == "why":
        return _plain(reason_text(agent, limit=60))
    if column == "idle":
        return _plain(format_idle(agent["idle_seconds"]))
    if column == "turns":
        return _plain(str(agent["turns"]) + (f"+{agent['retries']}r" if agent.get("retries") else ""))
    if column == "tool":
        return _plain(agent.get("current_tool") or "-")
    if column == "task":
        return _plain(agent["task_id"])
    if column == "tokens":
        return _plain(str(agent["input_tokens"] + agent["output_tokens"]))
    if column == "node":
        return _plain(node_text(agent.get("node")))
    return _plain(agent.get(column) or "-")


def sort_agents(agents: list[dict[str, t.Any]]) -> list[dict[str, t.Any]]:
    """Active agents first (busiest first), finished ones last; otherwise in the order given."""
    return sorted(agents, key=lambda a: STATE_RANK.get(a["state"], 4))


FLEXIBLE = ("tool", "task", "why")  # share what is left; cut with an ellipsis
KEEP = ("name", "state", "cost")  # never dropped


def _fit_columns(agents: list[dict[str, t.Any]], width: int, marker: bool) -> tuple[list[str], int]:
    """The columns shown at ``width`` and the NAME column's width. Names are kept whole: optional columns
    are dropped (least important first) until the whole names fit; only a terminal too narrow for NAME,
    STATE and COST cuts names."""
    columns = [name for name, min_width in AGENT_COLUMNS if width >= min_width]
    if "node" in columns and not any(elsewhere(a.get("node")) for a in agents):
        columns.remove("node")  # every turn ran on this machine: nothing to tell apart
    name_width = max([4, *(len(escaped(a["name"])) for a in agents)])

    def needed(shown: list[str]) -> int:
        total = 4 if marker else 0
        for column in shown:
            if column == "name":
                total += name_width
            elif column in FLEXIBLE:
                total += len(column) + 2
            else:
                total += max([len(column), *(len(_cell_text(a, column)) for a in agents)])
            total += 3  # the padding and the rule between columns
        return total

    while needed(columns) > width and any(c not in KEEP for c in columns):
        columns.remove([c for c in columns if c not in KEEP][-1])
    spare = width - needed(columns)
    return columns, name_width + min(0, spare)


def agents_table(agents: list[dict[str, t.Any]], width: int, max_rows: int | None = None, *,
                 selected: str | None = None, first: int = 0, marker: bool = False) -> Table:
    """The agents, ``max_rows`` of them from ``first``; ``marker`` adds a column showing the selected one."""
    columns, name_width = _fit_columns(agents, width, marker)
    table = Table(box=box.SIMPLE_HEAD, expand=True, pad_edge=False, show_edge=False)
    if marker:
        table.add_column("", no_wrap=True, width=1)
    for name in columns:
        table.add_column(name.upper(), no_wrap=True, overflow="ellipsis",
                         justify="right" if name in ("cost", "idle", "turns", "tokens") else "left",
                         min_width=max(4, name_width) if name == "name" else None,
                         ratio=2 if name in FLEXIBLE else None)
    shown = agents[first:] if max_rows is None else agents[first:first + max_rows]
    for agent in shown:
        chosen = agent["name"] == selected
        cells = [_cell(agent, c) for c in columns]
        if marker:
            cells.insert(0, ">" if chosen else " ")
        table.add_row(*cells, style="reverse" if chosen else None)
    hidden = len(agents) - len(shown)
    if hidden > 0:
        table.caption = f"... {hidden} more agent(s) not shown (a taller terminal, or `ov status --all`)"
    if not agents:
        table.caption = "no agents yet: `ov sling CAPABILITY TASK_ID`"
    return table


def header_lines(snapshot: dict[str, t.Any], watchdog_note: str, width: int) -> list[Text]:
    """Two lines, each cut to ``width``: the totals that matter most, then the states and the watchdog."""
    totals = snapshot["totals"]
    moment = (snapshot["generated_at"] or "")[11:19]
    first = Text()
    first.append("ov watch", style="bold")
    first.append(f"  {moment}  {totals['active']}/{totals['agents']} active  mail {snapshot['mail']['pending']} "
                 f"pending  turns {totals['turns']}  ")
    first.append(f"cost ${totals['cost_usd']:.4f}", style="bold")
    for run in snapshot.get("runs", [])[:1]:
        if run["status"] == "open" and run.get("budget"):
            first.append(f"  run {spend_text(0.0, run['budget'])}", style="bold")
    second = Text()
    for state, count in totals["by_state"].items():
        second.append(f"{count} {state}  ", style=STATE_STYLES.get(state, ""))
    if watchdog_note:
        second.append(f"| {escaped(watchdog_note)}", style="dim")
    for line in (first, second):
        line.no_wrap = True
        line.truncate(width, overflow="ellipsis")
    return [first, second]


def waiting_lines(snapshot: dict[str, t.Any], width: int, limit: int = 4) -> list[Text]:
    """"waiting for you": approval gates first, one line each (y / x decide the selected agent's)."""
    gates = snapshot.get("waiting") or []
    if not gates:
        return []
    lines = [Text("waiting for you", style="bold reverse")]
    for gate in gates[:limit]:
        line = Text()
        line.append(f"{escaped(gate['id'])} ", style="bold")
        line.append(f"{escaped(gate['agent'])} wants `{escaped(gate['call'])}`  {gate['seconds_left']}s left  "
                    f"(select it: y approve, x reject)")
        lines.append(line)
    if len(gates) > limit:
        lines.append(Text(f"... {len(gates) - limit} more: `ov approvals`", style="dim"))
    for line in lines:
        line.no_wrap = True
        line.truncate(width, overflow="ellipsis")
    return lines


def _mail_table(messages: list[dict[str, t.Any]], width: int) -> Table:
    table = Table(title="mail", title_justify="left", box=box.SIMPLE_HEAD, expand=True, show_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("FROM > TO", no_wrap=True, overflow="ellipsis", ratio=2)
    table.add_column("TYPE", no_wrap=True)
    if width >= 70:
        table.add_column("SUBJECT", no_wrap=True, overflow="ellipsis", ratio=3)
    for message in messages:
        cells = [_plain(message["id"]), _plain(f"{message['from']} > {message['to']}"), _plain(message["type"])]
        if width >= 70:
            cells.append(_plain(message["subject"]))
        table.add_row(*cells, style="dim" if message["state"] == "read" else None)
    return table


def _events_table(title: str, events: list[dict[str, t.Any]], width: int) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, expand=True, show_edge=False)
    table.add_column("TIME", no_wrap=True)
    table.add_column("AGENT", no_wrap=True, overflow="ellipsis")
    table.add_column("KIND", no_wrap=True)
    if width >= 70:
        table.add_column("SUMMARY", no_wrap=True, overflow="ellipsis", ratio=3)
    for event in events:
        clock = (event["at"] or "")[11:19]
        cells = [_plain(clock), _plain(event["agent"] or "-"),
                 _plain(event["kind"], style=EVENT_STYLES.get(event["kind"], ""))]
        if width >= 70:
            cells.append(_plain(" ".join((event["summary"] or "").split())))
        table.add_row(*cells)
    return table


def _merge_table(entries: list[dict[str, t.Any]]) -> Table:
    table = Table(title="merge queue", title_justify="left", box=box.SIMPLE_HEAD, expand=True, show_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("BRANCH", no_wrap=True, overflow="ellipsis")
    table.add_column("STATUS", no_wrap=True)
    for entry in entries:
        table.add_row(_plain(entry["id"]), _plain(entry["branch"]), _plain(entry["status"]))
    return table


def render_frame(snapshot: dict[str, t.Any], *, width: int, height: int | None = None,
                 watchdog_note: str = "") -> RenderableType:
    """The whole dashboard. ``height`` (live mode) caps the agent rows; None shows all."""
    max_rows = None if height is None else max(3, height - 24)
    parts: list[RenderableType] = [*header_lines(snapshot, watchdog_note, width), *waiting_lines(snapshot, width),
                                   agents_table(sort_agents(snapshot["agents"]), width, max_rows)]
    if snapshot.get("problems"):
        parts.append(_events_table("problems", snapshot["problems"][:6], width))
    if snapshot.get("recent_mail"):
        parts.append(_mail_table(snapshot["recent_mail"][:6], width))
    if snapshot.get("events"):
        parts.append(_events_table("events", snapshot["events"][:8], width))
    if snapshot.get("merge_queue"):
        parts.append(_merge_table(snapshot["merge_queue"][:5]))
    return Group(*parts)


def extra_sections(snapshot: dict[str, t.Any], width: int) -> list[RenderableType]:
    """What the interactive screen shows under the agents when there is room, most useful first."""
    parts: list[RenderableType] = []
    if snapshot.get("problems"):
        parts.append(_events_table("problems", snapshot["problems"][:6], width))
    if snapshot.get("events"):
        parts.append(_events_table("events", snapshot["events"][:8], width))
    if snapshot.get("recent_mail"):
        parts.append(_mail_table(snapshot["recent_mail"][:6], width))
    if snapshot.get("merge_queue"):
        parts.append(_merge_table(snapshot["merge_queue"][:5]))
    return parts


def console_for(width: int | None, *, terminal: bool | None = None) -> t.Any:
    """A rich Console; NO_COLOR (set and not empty) removes every style, bold and dim included."""
    import os

    from rich.console import Console

    plain = bool(os.environ.get("NO_COLOR"))
    return Console(width=width, highlight=False, force_terminal=terminal, no_color=plain,
                   color_system=None if plain else "auto")


def to_lines(console: t.Any, renderable: RenderableType) -> list[str]:
    """``renderable`` as screen lines (with escape codes unless the console is plain)."""
    with console.capture() as captured:
        console.print(renderable)
    return captured.get().rstrip("\n").split("\n")


def title(text: str, width: int, *, bold: bool = True) -> Text:
    line = Text(escaped(text), style="bold" if bold else "", no_wrap=True)
    line.truncate(width, overflow="ellipsis")
    return line


def dim(text: str, width: int) -> Text:
    line = Text(escaped(text), style="dim", no_wrap=True)
    line.truncate(width, overflow="ellipsis")
    return line


DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("+", "green"), ("-", "red"), ("@@", "cyan"), ("diff ", "bold"))


def view_line(text: str, width: int, *, diff: bool = False) -> Text:
    """One line of a stream or diff view, cut to ``width``; diff lines are coloured like git's."""
    style = ""
    if diff:
        style = next((s for prefix, s in DIFF_STYLES if text.startswith(prefix)), "")
    line = Text(escaped(text.expandtabs(4)), style=style, no_wrap=True)
    line.truncate(width, overflow="ellipsis")
    return line
