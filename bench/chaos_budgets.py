"""The budget invariant: no agent spent more than its limit plus one model message, and no run more than
its limit plus one model message per agent of the run that was in a turn when it crossed.

"One model message" is the dearest single assistant message the agent sent: priced from its turns'
raw streams with ov's own price table (real claude reports tokens per message), plus what the scripted
scenario charges for a `usage` message (the scripted runtime reports that only in its final figure), plus
a cent for the scripted runtime's price per message ($0.001 each, also reported only at the turn's end).
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import chaos_procs as procs
import chaos_team as team

if t.TYPE_CHECKING:
    from chaos_checks import Verdict
    from chaos_run import Run


def scripted_extra(agent: str) -> float:
    """The dearest `usage` message the harness scripted for this agent."""
    if agent == team.SPENDER:
        return team.SPEND_STEP_USD
    if agent == team.BURNER:
        return team.BURN_USD
    if agent in ("builder-a2", "builder-b2"):
        return team.THINK_USD
    return 0.0


def message_costs(log_dirs: t.Iterable[str]) -> list[float]:
    """Every assistant message of these turns, priced once (the CLI repeats a message per content block)."""
    from overstory.runtimes import prices

    seen: dict[str, float] = {}
    for folder in log_dirs:
        try:
            lines = (Path(folder) / "stdout.ndjson").read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("type") != "assistant":
                continue
            message = event.get("message") or {}
            usage = message.get("usage") or {}
            tokens_in = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_creation_input_tokens",
                                                              "cache_read_input_tokens"))
            cost = prices.cost_usd(message.get("model"), tokens_in, int(usage.get("output_tokens") or 0))
            key = str(message.get("id") or len(seen))
            seen[key] = max(seen.get(key, 0.0), cost)
    return list(seen.values())


def check_budgets(run: Run) -> list[Verdict]:
    from chaos_checks import Verdict

    agents = Verdict("agent_budget", "no agent's spend exceeded its max_usd by more than one model message, and no "
                                     "tool call ran after its limit was crossed")
    runs = Verdict("run_budget", "no run's spend exceeded its max_usd by more than one model message per agent of the "
                                 "run that was in a turn when it crossed")
    conn = procs.read_only(run.layout.root / ".overstory" / "state.db")
    try:
        limits = [dict(r) for r in conn.execute("SELECT * FROM budgets WHERE max_usd IS NOT NULL")]
        turns = [dict(r) for r in conn.execute("SELECT agent, generation, run_id, started_at, ended_at, cost_usd, "
                                               "log_dir FROM turns ORDER BY ended_at")]
        sessions = {r["name"]: dict(r) for r in conn.execute("SELECT name, generation, run_id FROM sessions")}
    finally:
        conn.close()
    events = procs.read_only(run.layout.root / ".overstory" / "events.db")
    try:
        crossings = [dict(r) for r in events.execute(
            "SELECT at, agent, data FROM events WHERE kind IN ('budget_parked', 'budget_crossed') ORDER BY id")]
    finally:
        events.close()
    dearest: dict[str, float] = {}
    for name in {t_["agent"] for t_ in turns}:
        costs = message_costs(t_["log_dir"] for t_ in turns if t_["agent"] == name and t_["log_dir"])
        dearest[name] = max(costs, default=0.0) + scripted_extra(name) + team.STEP_SLACK
    for limit in limits:
        used = float(limit["spent_usd"] or 0) + float(limit["live_usd"] or 0)
        if limit["scope"] == "agent":
            agents.checked += 1
            allowed = float(limit["max_usd"]) + dearest.get(limit["name"], team.COST_PER_STEP)
            if used > allowed + 1e-9:
                agents.fail(f"{limit['name']} (generation {limit['generation']}) spent ${used:.4f} against max_usd "
                            f"{limit['max_usd']} (one message is at most ${dearest.get(limit['name'], 0):.4f})")
            continue
        runs.checked += 1
        members = [name for name, row in sessions.items() if row["run_id"] == limit["name"]]
        crossed_at = _crossing_time(limit, crossings, turns)
        in_turn = {t_["agent"] for t_ in turns if t_["run_id"] == limit["name"] and crossed_at is not None
                   and t_["started_at"] <= crossed_at and (t_["ended_at"] is None or t_["ended_at"] >= crossed_at)}
        allowed = float(limit["max_usd"]) + sum(dearest.get(name, team.COST_PER_STEP) for name in in_turn or members[:1])
        if used > allowed + 1e-9:
            agents_text = ", ".join(sorted(in_turn)) or ("none" if crossed_at is not None else
                                                         "unknown: its turns' costs add up to less than its spend")
            runs.fail(f"run {limit['name']} spent ${used:.4f} against max_usd {limit['max_usd']} (allowed "
                      f"${allowed:.4f}: agents in a turn when it crossed: {agents_text})")
    for line in _log(run.layout.log("deploys")):
        if line.endswith("past-the-limit"):
            agents.fail(f"`./deploy.sh {line}` ran after {line.split()[0]} had crossed its max_usd "
                        f"{team.CLAUDE_MAX_USD} (its model's previous message cost about $0.80)")
    return [agents, runs]


def _crossing_time(limit: dict[str, t.Any], crossings: list[dict[str, t.Any]], turns: list[dict[str, t.Any]]) -> int | None:
    """When the run went over: when its finished turns' costs added up past it, or ov's own crossing event for it
    if that came first (a live estimate)."""
    found: list[int] = []
    for event in crossings:
        try:
            data = json.loads(event["data"] or "{}")
        except ValueError:
            continue
        crossing = data.get("crossing") or {}
        if crossing.get("scope") == "run" and crossing.get("name") == limit["name"]:
            found.append(int(event["at"]))
            break
    total = 0.0
    for turn in turns:
        if turn["run_id"] != limit["name"] or turn["ended_at"] is None:
            continue
        total += float(turn["cost_usd"] or 0)
        if total > float(limit["max_usd"]):
            found.append(int(turn["ended_at"]))
            break
    return min(found, default=None)


def _log(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return []
