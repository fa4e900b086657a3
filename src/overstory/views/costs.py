"""`ov costs`: tokens, dollars, turns and tool calls, grouped by agent, run, capability or model.

Read-only, from the ``turns`` table (one row per turn, kept with the capability and
run it was for, so an agent name's later generations do not rewrite history). A
turn's dollars are *real* when the runtime reported them (Claude's
``total_cost_usd``), and *estimated* when ov priced the streamed usage itself (a turn
stopped by a budget, or killed, before the runtime said); the two are kept apart.
Turns still running show up as the live estimate of their agents' budgets.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory import printable
from overstory.clock import iso
from overstory.store import budgets, turns

GROUPINGS = ("agent", "run", "capability", "model")
COLUMN = {"agent": "agent", "run": "run_id", "capability": "capability"}
COUNTERS = ("turns", "tool_calls", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _empty() -> dict[str, t.Any]:
    return {**{key: 0 for key in COUNTERS}, "usd_real": 0.0, "usd_estimated": 0.0}


def _finish(entry: dict[str, t.Any]) -> dict[str, t.Any]:
    entry["usd_real"] = round(entry["usd_real"], 6)
    entry["usd_estimated"] = round(entry["usd_estimated"], 6)
    entry["usd"] = round(entry["usd_real"] + entry["usd_estimated"], 6)
    return entry


def _add_turn(entry: dict[str, t.Any], row: sqlite3.Row) -> None:
    cache_read, cache_write = row["cache_read_tokens"] or 0, row["cache_write_tokens"] or 0
    entry["turns"] += 1
    entry["tool_calls"] += row["tool_calls"] or 0
    entry["input_tokens"] += max(0, (row["input_tokens"] or 0) - cache_read - cache_write)
    entry["output_tokens"] += row["output_tokens"] or 0
    entry["cache_read_tokens"] += cache_read
    entry["cache_write_tokens"] += cache_write
    entry["usd_estimated" if row["cost_estimated"] else "usd_real"] += row["cost_usd"] or 0.0


def _model_shares(row: sqlite3.Row, prices: t.Any) -> list[tuple[str, dict[str, t.Any], float, bool]]:
    """(model, tokens, dollars, estimated) for each model a turn used."""
    by_model = json.loads(row["usage_by_model"]) if row["usage_by_model"] else None
    if not by_model:
        total = {"input": max(0, (row["input_tokens"] or 0) - (row["cache_read_tokens"] or 0)
                              - (row["cache_write_tokens"] or 0)),
                 "output": row["output_tokens"] or 0, "cache_read": row["cache_read_tokens"] or 0,
                 "cache_write": row["cache_write_tokens"] or 0}
        return [(row["model"] or "(unknown)", total, row["cost_usd"] or 0.0, bool(row["cost_estimated"]))]
    shares = []
    for model, entry in by_model.items():
        cost = entry.get("cost_usd")
        estimated = bool(row["cost_estimated"]) or cost is None
        if cost is None:
            from overstory.runtimes.prices import Tokens

            cost = prices.lookup(model).price.cost(Tokens(entry.get("input", 0), entry.get("output", 0),
                                                          entry.get("cache_read", 0), entry.get("cache_write", 0)))
        shares.append((model, entry, float(cost), estimated))
    return shares


def report(conn: sqlite3.Connection, *, by: str = "agent", since_ms: int | None = None,
           prices: t.Any = None) -> dict[str, t.Any]:
    """The `ov costs --json` document: one entry per group, totals, and what is still running."""
    if by not in GROUPINGS:
        from overstory.errors import UsageError

        raise UsageError(f"--by takes one of {', '.join(GROUPINGS)}, not {by!r}")
    if prices is None:
        from overstory.runtimes.prices import PriceTable

        prices = PriceTable()
    groups: dict[str, dict[str, t.Any]] = {}
    totals = _empty()
    unknown: dict[str, str] = {}
    for row in turns.finished_with_owner(conn, since_ms):
        _add_turn(totals, row)
        for model in (json.loads(row["usage_by_model"]) if row["usage_by_model"] else {row["model"]: None}):
            found = prices.lookup(model) if model else None
            if found is not None and found.guessed and row["cost_estimated"]:
                unknown[model] = found.note or ""
        if by != "model":
            key = row[COLUMN[by]]
            _add_turn(groups.setdefault(key or "(none)", _empty()), row)
            continue
        shares = _model_shares(row, prices)
        main = max(shares, key=lambda share: share[1].get("input", 0) + share[1].get("output", 0))[0]
        for model, tokens, cost, estimated in shares:
            entry = groups.setdefault(model, _empty())
            entry["turns"] += 1
            entry["tool_calls"] += (row["tool_calls"] or 0) if model == main else 0
            entry["input_tokens"] += int(tokens.get("input", 0))
            entry["output_tokens"] += int(tokens.get("output", 0))
            entry["cache_read_tokens"] += int(tokens.get("cache_read", 0))
            entry["cache_write_tokens"] += int(tokens.get("cache_write", 0))
            entry["usd_estimated" if estimated else "usd_real"] += cost
    live = budgets.live_usd_total(conn)
    rows = [{by: key, **_finish(entry)} for key, entry in groups.items()]
    rows.sort(key=lambda entry: (-entry["usd"], str(entry[by])))
    return {"by": by, "since": iso(since_ms) if since_ms else None, "groups": rows, "totals": _finish(totals),
            "in_progress_usd_estimated": round(float(live), 6),
            "estimates_of_unknown_models": [unknown[model] for model in sorted(unknown)]}


def render_text(document: dict[str, t.Any]) -> str:
    by = document["by"]
    header = (by.upper(), "TURNS", "TOOLS", "INPUT", "OUTPUT", "CACHE R/W", "USD")
    lines = [header]

    def cells(label: str, entry: dict[str, t.Any]) -> tuple[str, ...]:
        usd = f"${entry['usd']:.4f}"
        if entry["usd_estimated"]:
            usd += f" (${entry['usd_estimated']:.4f} est.)"
        return (label, str(entry["turns"]), str(entry["tool_calls"]), str(entry["input_tokens"]),
                str(entry["output_tokens"]), f"{entry['cache_read_tokens']}/{entry['cache_write_tokens']}", usd)

    for entry in document["groups"]:
        lines.append(cells(printable.line(entry[by]), entry))  # a model name is whatever the runtime reported
    lines.append(cells("total", document["totals"]))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in lines]
    if document["in_progress_usd_estimated"]:
        text.append(f"turns in progress: ${document['in_progress_usd_estimated']:.4f} estimated so far")
    if any(entry["usd_estimated"] for entry in document["groups"]):
        text.append("est. = priced by ov from streamed usage (the turn stopped before the runtime reported its cost)")
    text.extend(document.get("estimates_of_unknown_models", []))
    return printable.lines(text)


def costs_report(project: t.Any, conn: sqlite3.Connection, *, by: str | None = None,
                 since: str | None = None) -> dict[str, t.Any]:
    """`ov costs` for callers that hold text (`ov serve`): ``since`` as `ov costs --since` takes it."""
    from overstory.clock import parse_since
    from overstory.config.load import load as load_config
    from overstory.errors import UsageError
    from overstory.runtimes.prices import PriceTable

    try:
        since_ms = parse_since(since) if since else None
    except ValueError as exc:
        raise UsageError(f"since: {exc}") from None
    config = load_config(project.config_file, project.local_config_file)
    return report(conn, by=by or "agent", since_ms=since_ms, prices=PriceTable(config.prices))
