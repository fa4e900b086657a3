"""`ov loop`: sling an agent that works in iterations, and `ov loop status`.

Starting a loop is `ov sling` with a loop definition in the agent's row (one spawn
transaction: nothing new to undo); the agent's own loop process sees it and runs
iterations instead of waiting for mail (``agents.iterations``). The loop is named
after its agent.
"""

from __future__ import annotations

import sqlite3
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory.agents.iterations.spec import build_definition, read_spec
from overstory.clock import iso
from overstory.errors import LoopError, UsageError
from overstory.paths import ProjectPaths
from overstory.store import loops, sessions

if t.TYPE_CHECKING:
    from overstory.agents.spawn import SlingResult
    from overstory.config.model import Config
    from overstory.sandbox.checks import CheckEnv


@dataclass
class LoopRequest:
    capability: str
    task_id: str
    prompt: str | None = None
    spec_file: Path | None = None
    until: str | None = None
    check: str | None = None
    max_iterations: int | None = None
    max_usd: float | None = None
    name: str | None = None
    runtime: str | None = None
    model: str | None = None
    parent: str | None = None
    base_branch: str | None = None
    scenario: Path | None = None
    budget: dict[str, t.Any] = field(default_factory=dict)
    allow_protected: tuple[str, ...] = ()


def start_loop(project: ProjectPaths, config: Config, conn: sqlite3.Connection, request: LoopRequest,
               environ: t.Mapping[str, str] | None = None) -> tuple[SlingResult, dict[str, t.Any]]:
    """Sling the loop's agent; returns the sling result and the loop's definition."""
    from overstory.agents.spawn import SlingRequest, sling

    if request.prompt is None and request.spec_file is None:
        raise UsageError("give the loop its objective: --prompt TEXT or --spec FILE")
    if request.capability == "coordinator":
        raise UsageError("the coordinator does not loop; loop a builder (or a scout, lead, reviewer)")
    spec = None
    if request.spec_file is not None:
        spec = read_spec(_spec_text(request.spec_file), f"--spec {request.spec_file}")
    definition = build_definition(spec, prompt=request.prompt, until=request.until, check=request.check,
                                  max_iterations=request.max_iterations,
                                  default_max_iterations=config.loop.max_iterations,
                                  protected=config.loop.protected_paths, allow_protected=request.allow_protected)
    check_environment(project, config, definition, environ)  # a loop.check_env that is no venv: refused now
    budget = dict(request.budget)
    max_usd = request.max_usd if request.max_usd is not None else definition.get("max_usd")
    if max_usd is not None:
        budget["max_usd"] = max_usd
    text = definition["objective"]
    if definition["constraints"]:
        text += "\n\nConstraints:\n" + "\n".join(f"- {c}" for c in definition["constraints"])
    result = sling(project, config, conn, SlingRequest(
        capability=request.capability, task_id=request.task_id, name=request.name, prompt=text,
        parent=request.parent, runtime=request.runtime, model=request.model, base_branch=request.base_branch,
        scenario=request.scenario, budget=budget or None, loop=definition), environ)
    return result, definition


def check_environment(project: ProjectPaths, config: Config, definition: t.Mapping[str, t.Any],
                      environ: t.Mapping[str, str] | None = None) -> CheckEnv | None:
    """The Python environment the loop's command checks will run in (None: it has none); LoopError when
    ``loop.check_env`` names no virtual environment."""
    import os

    from overstory.errors import SandboxError
    from overstory.sandbox.checks import check_env

    gates = [p.get("gate") for p in definition.get("phases") or []] + [definition.get("final_check")]
    if not any(g and g.get("kind") == "command" for g in gates):
        return None
    try:
        return check_env(os.environ if environ is None else environ, config, project.root.resolve())[1]
    except SandboxError as exc:
        raise LoopError(str(exc)) from None


def _spec_text(path: Path) -> str:
    from overstory.limits import read_at_most
    from overstory.store.mail import MAX_BODY_BYTES

    data = read_at_most(str(path), MAX_BODY_BYTES, f"--spec {path}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--spec {path} is not UTF-8 text (byte {exc.start})") from None


def status_document(conn: sqlite3.Connection, name: str, root: Path | None = None) -> dict[str, t.Any]:
    """What `ov loop status NAME --json` prints: the loop, its agent, every iteration, the checkpoints, and
    (given the project ``root``) the protected paths its branch changes now."""
    agent = sessions.get(conn, name)
    if agent is None or not agent.spec.get("loop"):
        known = loops.names(conn)
        raise LoopError(f"no loop named {name!r}" + (f"; loops: {', '.join(known)}" if known else
                                                     "; start one with `ov loop CAPABILITY TASK --prompt ...`"))
    loop = loops.get(conn, name, agent.generation)
    definition = loop.definition if loop else agent.spec["loop"]
    phases = definition.get("phases") or []
    document: dict[str, t.Any] = {
        "name": name, "generation": agent.generation, "state": agent.state, "reason": agent.state_reason,
        "park_kind": agent.park_kind, "objective": definition["objective"], "until": definition["until"],
        "status": loop.status if loop else "starting", "iterations": loop.iterations if loop else 0,
        "max_iterations": loop.max_iterations if loop else definition.get("max_iterations"),
        "cost_usd": round(agent.cost_usd, 6),
        "phase": None, "phases": [p["name"] for p in phases] if definition.get("phased") else [],
        "same_failures": loop.same_failures if loop else 0, "critic": loop.critic_agent if loop else None,
        "records": [], "checkpoints": [], "last_check_env": None,
        "protected": {"paths": definition.get("protected_paths") or [],
                      "allowed": definition.get("allow_protected") or [], "changed": []},
    }
    if root is not None:
        document["protected"]["changed"] = [c.as_dict() for c in _protected_changes(root, agent, definition)]
    if loop is None:
        return document
    if definition.get("phased"):
        document["phase"] = {"index": loop.phase_index + 1, "name": loop.phase["name"], "round": loop.phase_round + 1}
    for row in loops.iterations(conn, name, agent.generation):
        document["records"].append({
            "number": row["number"], "attempt": row["attempt"], "phase": row["phase"], "status": row["status"],
            "session_id": row["session_id"], "cost_usd": round(row["cost_usd"] or 0.0, 6),
            "promise_seen": None if row["promise_seen"] is None else bool(row["promise_seen"]),
            "check_exit": row["check_exit"], "check_seconds": row["check_seconds"], "progress": row["progress"],
            "outcome": row["outcome"], "started_at": iso(row["started_at"]), "ended_at": iso(row["ended_at"]),
            "check_tail": row["check_tail"], "fingerprint": row["fingerprint"],
            "check_log": _relative(Path(row["check_log"]), root) if row["check_log"] and root else row["check_log"],
            "check_env": _json_or_none(row["check_env"])})
    last = next((dict(r["check_env"]) for r in reversed(document["records"]) if r["check_env"]), None)
    if last and last.get("cwd") and root is not None:
        last["cwd"] = _relative(Path(last["cwd"]), root)  # a scratch checkout, removed after the check
    document["last_check_env"] = last
    for mark in loops.checkpoints(conn, name, agent.generation):
        document["checkpoints"].append({"seq": mark["seq"], "phase": mark["phase"], "round": mark["phase_round"] + 1,
                                        "commit": mark["commit_sha"], "ref": mark["ref"], "verdict": mark["verdict"],
                                        "at": iso(mark["created_at"])})
    return document


def _json_or_none(text: str | None) -> t.Any:
    import json

    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


FAILURE_LINES = 8
FAILURE_GROUPS = 5


def failure_lines(records: t.Sequence[t.Mapping[str, t.Any]], root: Path | None = None,
                  lines: int = FAILURE_LINES, groups_shown: int = FAILURE_GROUPS) -> list[str]:
    """The end of each failed check (iterations that failed the same way share one; the newest
    ``groups_shown`` kinds of failure), with its log's path."""
    groups: dict[str, list[t.Mapping[str, t.Any]]] = {}
    for row in records:
        if row.get("status") == "done" and row.get("check_exit") not in (None, 0):
            groups.setdefault(str(row.get("fingerprint") or f"{row['number']}.{row['attempt']}"), []).append(row)
    out: list[str] = []
    newest = sorted(groups.values(), key=lambda rows: (rows[-1]["number"], rows[-1]["attempt"]))
    if len(newest) > groups_shown:
        left = newest[:-groups_shown]
        numbers = ", ".join(str(r["number"]) for rows in left for r in rows)
        out.append(f"(and {sum(map(len, left))} earlier failed check(s) of other kinds: iterations {numbers}; "
                   "`ov loop status NAME --json` has them all)")
    for rows in newest[-groups_shown:]:
        last = rows[-1]
        numbers = ", ".join(str(r["number"]) + (f".{r['attempt']}" if r["attempt"] > 1 else "") for r in rows)
        tail = (last.get("check_tail") or "").splitlines()
        label = tail[0].removeprefix("$ ") if tail and tail[0].startswith("$ ") else "the check"
        body = [line for line in tail[1:] if line.strip()][-lines:]
        log = last.get("check_log")
        if log and root is not None:
            log = _relative(Path(log), root)
        out.append(f"iteration{'s' if len(rows) > 1 else ''} {numbers}: `{label}` exit {last['check_exit']}"
                   + (f"; whole output: {log}" if log else ""))
        out += [f"  | {line}" for line in body] or ["  | (no output)"]
    return out


def failures_note(conn: sqlite3.Connection, name: str, generation: int, root: Path) -> str | None:
    """What the escalation of a parked loop quotes: the end of each failed check, and where its log is."""
    found = failure_lines(loops.iterations(conn, name, generation), root)
    return "Failed checks (the end of each):\n" + "\n".join(found) if found else None


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _protected_changes(root: Path, agent: sessions.Session, definition: t.Mapping[str, t.Any]) -> list[t.Any]:
    """The protected paths the loop's branch changes against its base (what its next check will say)."""
    import subprocess

    from overstory.sandbox import check_tree

    if not definition.get("protected_paths") or not agent.branch:
        return []
    try:
        head = check_tree.commit_of(root, f"refs/heads/{agent.branch}")
        base = head and check_tree.base_of(root, head, agent.spec.get("base_commit"), agent.base_branch)
        if not head or not base:
            return []
        return check_tree.protected_changes(root, base, head, definition["protected_paths"],
                                            definition.get("allow_protected") or [])
    except (subprocess.CalledProcessError, OSError):
        return []


def status_lines(document: dict[str, t.Any]) -> list[str]:
    limit = document["max_iterations"]
    state = document["state"] + (f":{document['park_kind']}" if document["park_kind"] else "")
    lines = [f"loop {document['name']}: {state}"
             + (f" ({document['reason']})" if document["reason"] and document["state"] != "in_turn" else ""),
             f"  objective: {document['objective'][:150]}",
             f"  iterations: {document['iterations']}" + (f" of {limit}" if limit else "")
             + f"   spent: ${document['cost_usd']:.4f}   promise: {document['until']}"]
    if document["phase"]:
        phase = document["phase"]
        lines.append(f"  phase {phase['index']}/{len(document['phases'])}: {phase['name']}"
                     + (f" (run {phase['round']})" if phase["round"] > 1 else "")
                     + (f"; waiting for critic {document['critic']}" if document["critic"] else ""))
    if document["records"]:
        lines.append(f"  {'#':>4} {'phase':<12} {'session':<10} {'usd':>8} {'promise':<7} {'check':>5} "
                     f"{'secs':>6}  outcome / progress")
    for row in document["records"]:
        number = f"{row['number']}" + (f".{row['attempt']}" if row["attempt"] > 1 else "")
        promise = "-" if row["promise_seen"] is None else ("yes" if row["promise_seen"] else "no")
        check = "-" if row["check_exit"] is None else str(row["check_exit"])
        seconds = "-" if row["check_seconds"] is None else f"{row['check_seconds']:.1f}"
        lines.append(f"  {number:>4} {(row['phase'] or '-')[:12]:<12} {(row['session_id'] or '-')[:8]:<10} "
                     f"{row['cost_usd']:>8.4f} {promise:<7} {check:>5} {seconds:>6}  "
                     f"{row['outcome'] or row['status']}" + (f" | {row['progress']}" if row["progress"] else ""))
    protected = document.get("protected") or {}
    if protected.get("paths"):
        lines.append(f"  protected: {', '.join(protected['paths'])}"
                     + (f" (allowed to change: {', '.join(protected['allowed'])})" if protected.get("allowed") else ""))
    for change in protected.get("changed") or []:
        lines.append(f"  protected path changed on its branch: {change['path']} ({change['change']})"
                     + (" - allowed" if change["allowed"] else " - its checks fail until it is back"))
    where = document.get("last_check_env")
    if where:
        lines.append(f"  last check: in {where.get('cwd')}, a checkout of {(where.get('commit') or '?')[:12]}; "
                     + (f"`python` is {where['python']}" if where.get("python") else "no `python` on its PATH")
                     + (f" (virtual environment {where['venv']})" if where.get("venv") else
                        " (no project virtual environment: .venv, or loop.check_env)"))
    failed = failure_lines(document["records"])
    if failed:
        lines.append("  failed checks (the end of each):")
        lines += [f"    {line}" for line in failed]
    for mark in document["checkpoints"]:
        lines.append(f"  checkpoint {mark['seq']}: phase {mark['phase']} run {mark['round']} {mark['commit'][:12]} "
                     f"{mark['ref']}" + (f" (critic: {mark['verdict']})" if mark["verdict"] else ""))
    return lines
