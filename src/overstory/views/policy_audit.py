"""`ov policy audit`: what agents actually did with their tools, to tune the ledger's rules.

Read from the tool-call ledger (every call, its class and its status) and the event stream (tool
calls the runtime streamed, approvals, flagged replays), over one run or a period:

- ``tools``: each tool, how often, by class and by status (denied, skipped_duplicate ...);
- ``commands``: each shell command (program, and subcommand for git, gh, ov, npm ...), how often, by class;
- ``unknown``: what no rule placed (``guards.classify.unplaced``): it counted as ``local_write`` by default,
  with an example and the patterns that would place it (``ledger.read_only``/``ledger.side_effects``);
- ``varied``: per tool, how many distinct inputs its calls had, and which input fields varied most;
- ``events``: tool starts, approvals and flagged replays from events.db in the same window.

Reads only. The classes are computed again with the project's current rules, so an audit after a
config change shows what the new rules make of the old calls.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import typing as t
from collections import Counter, defaultdict

from overstory.clock import iso
from overstory.guards.classify import DEFAULT_LEDGER_RULES, LedgerRules, classify, unplaced
from overstory.guards.patterns import SHELL_TOOLS, shell_commands

# Programs whose first argument names what they do (`git push`, `npm publish`): counted with it.
SUBCOMMAND_PROGRAMS = frozenset("git gh ov npm pnpm yarn cargo docker podman kubectl helm pip pip3 uv poetry go "
                                "terraform gcloud aws az make".split())
EVENT_KINDS = ("tool_start", "tool_call_flagged", "approval_requested", "approval_approved", "approval_rejected",
               "approval_expired", "approval_used")


def command_key(words: t.Sequence[str]) -> str:
    """``git push`` for ``git push origin main``; ``pytest`` for ``pytest -q tests``."""
    head = words[0].rsplit("/", 1)[-1]
    if head in SUBCOMMAND_PROGRAMS and len(words) > 1 and not words[1].startswith("-"):
        return f"{head} {words[1]}"
    return head


def audit(state: sqlite3.Connection, events: sqlite3.Connection | None, *, run_id: str | None = None,
          since_ms: int | None = None, rules: LedgerRules = DEFAULT_LEDGER_RULES, top: int = 10) -> dict[str, t.Any]:
    from overstory.store import ledger, sessions

    rows = ledger.audit_rows(state, run_id=run_id, since_ms=since_ms)
    tools: dict[str, dict[str, t.Any]] = {}
    commands: dict[str, Counter[str]] = defaultdict(Counter)
    unknown: dict[tuple[str, str], dict[str, t.Any]] = {}
    inputs: dict[str, list[dict[str, t.Any]]] = defaultdict(list)
    agents: set[str] = set()
    for row in rows:
        tool = row["tool"]
        agents.add(row["agent"])
        try:
            call_input = json.loads(row["input"]) if row["input"] else {}
        except ValueError:
            call_input = {}
        if not isinstance(call_input, dict):
            call_input = {"input": call_input}
        klass = classify(tool, call_input, rules)
        entry = tools.setdefault(tool, {"tool": tool, "calls": 0, "by_class": Counter(), "by_status": Counter()})
        entry["calls"] += 1
        entry["by_class"][klass] += 1
        entry["by_status"][row["status"]] += 1
        inputs[tool].append(call_input)
        if tool in SHELL_TOOLS and isinstance(call_input.get("command"), str):
            for words, _ in shell_commands(call_input["command"]):
                if words:
                    commands[command_key(words)][classify(tool, {"command": shlex.join(words)}, rules)] += 1
        for subject in unplaced(tool, call_input, rules):
            key = command_key(subject.split()) if tool in SHELL_TOOLS else tool
            example = call_input["command"] if tool in SHELL_TOOLS else json.dumps(call_input, sort_keys=True)
            found = unknown.setdefault((tool, key), {"tool": tool, "what": key, "calls": 0, "example": example[:200],
                                                      "agents": set()})
            found["calls"] += 1
            found["agents"].add(row["agent"])
    if run_id is not None:
        agents |= set(sessions.names_in_run(state, run_id))
    return {
        "window": {"run": run_id, "since": iso(since_ms) if since_ms is not None else None},
        "calls": len(rows),
        "agents": sorted(agents),
        "tools": [{**e, "by_class": dict(e["by_class"]), "by_status": dict(e["by_status"])}
                  for e in sorted(tools.values(), key=lambda e: (-e["calls"], e["tool"]))],
        "commands": [{"command": key, "calls": sum(by.values()), "by_class": dict(by)}
                     for key, by in sorted(commands.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))],
        "unknown": [{**u, "agents": sorted(u["agents"]), "rules": _suggest(u["tool"], u["what"])}
                    for u in sorted(unknown.values(), key=lambda u: (-u["calls"], u["what"]))],
        "varied": _varied(inputs)[:top],
        "events": _events(events, since_ms=since_ms, agents=sorted(agents) if run_id is not None else None),
    }


def _suggest(tool: str, what: str) -> list[str]:
    pattern = f"{tool}({what} *)" if tool in SHELL_TOOLS else tool
    return [f"ledger.read_only: {pattern!r}", f"ledger.side_effects: {pattern!r}"]


def _varied(inputs: t.Mapping[str, list[dict[str, t.Any]]]) -> list[dict[str, t.Any]]:
    """Per tool: its calls, its distinct inputs, and each input field's number of distinct values (most first)."""
    found = []
    for tool, calls in inputs.items():
        distinct = {json.dumps(c, sort_keys=True, default=str) for c in calls}
        values: dict[str, set[str]] = defaultdict(set)
        for call in calls:
            for key, value in call.items():
                values[key].add(json.dumps(value, sort_keys=True, default=str))
        fields = sorted(((k, len(v)) for k, v in values.items()), key=lambda kv: (-kv[1], kv[0]))
        found.append({"tool": tool, "calls": len(calls), "distinct_inputs": len(distinct),
                      "fields": [{"field": k, "distinct": n} for k, n in fields]})
    return sorted(found, key=lambda f: (-f["distinct_inputs"], -f["calls"], f["tool"]))


def _events(events: sqlite3.Connection | None, *, since_ms: int | None,
            agents: t.Sequence[str] | None) -> dict[str, t.Any]:
    if events is None:
        return {"available": False}
    from overstory.store.events import kind_tool_counts

    try:
        rows = kind_tool_counts(events, EVENT_KINDS, since_ms=since_ms, agents=agents)
    except sqlite3.Error:
        return {"available": False}
    by_kind: Counter[str] = Counter()
    started: Counter[str] = Counter()
    for row in rows:
        by_kind[row["kind"]] += row["n"]
        if row["kind"] == "tool_start" and row["tool"]:
            started[row["tool"]] += row["n"]
    return {"available": True, "by_kind": dict(by_kind), "tool_starts": dict(started.most_common())}


def render_text(document: t.Mapping[str, t.Any]) -> str:
    """The audit as text; agents' commands are escaped (``printable.line``) line by line."""
    from overstory.printable import line

    return "\n".join(line(text) if text else "" for text in _text_lines(document))


def _text_lines(document: t.Mapping[str, t.Any]) -> list[str]:
    window = document["window"]
    where = f"run {window['run']}" if window["run"] else (f"since {window['since']}" if window["since"] else "all time")
    lines = [f"{document['calls']} tool call(s) by {len(document['agents'])} agent(s), {where}"]
    if document["tools"]:
        lines.append("\ntools:")
        for tool in document["tools"]:
            classes = ", ".join(f"{n} {k}" for k, n in sorted(tool["by_class"].items()))
            statuses = ", ".join(f"{n} {k}" for k, n in sorted(tool["by_status"].items()))
            lines.append(f"  {tool['tool']:<20} {tool['calls']:>5}  {classes}; {statuses}")
    if document["commands"]:
        lines.append("\ncommands:")
        for command in document["commands"]:
            classes = ", ".join(f"{n} {k}" for k, n in sorted(command["by_class"].items()))
            lines.append(f"  {command['command']:<20} {command['calls']:>5}  {classes}")
    lines.append("\nunknown to the ledger's rules (counted as local_write):" if document["unknown"]
                 else "\nunknown to the ledger's rules: none")
    for item in document["unknown"]:
        lines.append(f"  {item['tool']} {item['what']!r}: {item['calls']} call(s), e.g. {item['example']!r}; "
                     f"place it with {item['rules'][0]} or {item['rules'][1]}")
    if document["varied"]:
        lines.append("\ninputs that varied most:")
        for item in document["varied"]:
            fields = ", ".join(f"{f['field']} {f['distinct']}" for f in item["fields"][:4])
            lines.append(f"  {item['tool']:<20} {item['distinct_inputs']} distinct of {item['calls']}"
                         + (f" ({fields})" if fields else ""))
    found = document["events"]
    if found.get("available") and found["by_kind"]:
        lines.append("\nevents: " + ", ".join(f"{n} {k}" for k, n in sorted(found["by_kind"].items())))
    return [piece for text in lines for piece in text.split("\n")]
