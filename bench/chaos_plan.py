"""The kill schedule of one chaos run: derived from the seed, written as JSON, replayable.

A schedule is a list of kills. Each names the kind of process it hits and when:

- ``{"kind": "loop", "at": 14.2, "pick": 0.61}``: at 14.2 s after the team starts, SIGKILL the loop
  of one agent whose loop is alive then (``pick`` chooses among them, sorted by name);
- ``{"kind": "loop", "marker": "iter2", "delay": 0.3}``: 0.3 s after the harness sees the marker
  (a side effect it counts, e.g. the loop's iteration-2 mail), SIGKILL the loop of the agent that made it;
- ``{"kind": "sling", "nth": 2, "after": 0.4}``: the operator's 2nd `ov sling`/`ov loop` is killed 0.4 s
  after it started (and then run again, as a person would);
- ``{"kind": "merge", "nth": 1, "after": 0.2}``: the same for `ov merge`;
- ``{"kind": "watchdog" | "serve" | "scheduler" | "turn", "at": ...}``: the watchdog, `ov serve`, a
  schedule's runner process (the first one seen from then on), a turn's process group.

``restart`` (seconds) is how long the operator takes to notice a dead watchdog or server.
The same seed always gives the same schedule; what a kill hits can still differ between runs
(timing), so the run's log records what each kill actually hit.
"""

from __future__ import annotations

import json
import random
import typing as t
from pathlib import Path

KINDS = ("loop", "turn", "watchdog", "merge", "sling", "serve", "scheduler")
# Markers the harness watches for (chaos_team.Markers), each a seam one of the kills aims at.
MARKERS = {
    "release": "loop",     # an approved gated call just ran: its agent's loop dies mid-turn
    "deploy": "loop",      # a side effect just ran (deploy log): the loop dies before the receipt is read
    "iter2": "loop",       # a loop iteration mailed the operator and works on: the loop process dies
    "check": "loop",       # the loop's check is running: the loop dies under it
    "deploy_turn": "turn",  # a side effect just ran: the turn's process group dies
}


def derive(seed: int, *, window: float = 45.0) -> dict[str, t.Any]:
    """The schedule for ``seed``: a few kills aimed at known seams plus random ones of every kind."""
    rng = random.Random(seed)
    kills: list[dict[str, t.Any]] = []
    for marker, kind in MARKERS.items():
        if rng.random() < 0.5:
            kills.append({"kind": kind, "marker": marker, "delay": round(rng.uniform(0.0, 0.6), 2)})
    # Every kind at least once per seed, at a random moment; a few more at random.
    extra = rng.randint(2, 5)
    kinds = list(KINDS) + [rng.choice(KINDS) for _ in range(extra)]
    slings = merges = 0
    for kind in kinds:
        if kind == "sling":
            slings += 1
            kills.append({"kind": "sling", "nth": rng.randint(1, 7), "after": round(rng.uniform(0.05, 1.5), 2)})
        elif kind == "merge":
            merges += 1
            kills.append({"kind": "merge", "nth": rng.randint(1, 4), "after": round(rng.uniform(0.05, 1.2), 2)})
        else:
            kills.append({"kind": kind, "at": round(rng.uniform(2.0, window), 2), "pick": round(rng.random(), 3)})
    # Two kills of one command would hit only the first run of it: keep one per (kind, nth).
    seen: set[tuple[str, int]] = set()
    unique = []
    for kill in kills:
        key = (kill["kind"], kill.get("nth", -1))
        if "nth" in kill and key in seen:
            continue
        seen.add(key)
        unique.append(kill)
    unique.sort(key=lambda k: (k.get("at", 0.0), k["kind"]))
    return {"seed": seed, "restart": round(rng.uniform(0.5, 3.0), 2),
            "approve_delay": round(rng.uniform(0.3, 2.5), 2), "kills": unique}


def load(path: Path, seed: int | None = None) -> dict[str, t.Any]:
    """A schedule to replay (``--schedule FILE``): a schedule's JSON, one seed's result, or a results file of
    many seeds (``seed`` picks one); the seed in the schedule wins over the seed it was derived from."""
    document = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(document, dict) and isinstance(document.get("seeds"), list):  # `--seeds` results
        found = [r for r in document["seeds"] if seed is None or r.get("seed") == seed]
        if len(found) != 1:
            raise SystemExit(f"chaos: {path} holds {len(document['seeds'])} seeds: name one with --seed")
        document = found[0]
    plan = document.get("schedule", document) if isinstance(document, dict) else None
    if not isinstance(plan, dict) or "kills" not in plan or "seed" not in plan:
        raise SystemExit(f"chaos: {path} holds no kill schedule (expected keys seed, kills)")
    for kill in plan["kills"]:
        if kill.get("kind") not in KINDS:
            raise SystemExit(f"chaos: {path}: unknown kill kind {kill.get('kind')!r} (expected one of {KINDS})")
    plan.setdefault("restart", 1.0)
    plan.setdefault("approve_delay", 1.0)
    return plan


def describe(plan: dict[str, t.Any]) -> str:
    """One line per kill, for the failure report."""
    lines = []
    for kill in plan["kills"]:
        if "marker" in kill:
            lines.append(f"  {kill['kind']:<9} {kill['delay']:>5.2f} s after marker {kill['marker']}")
        elif "nth" in kill:
            lines.append(f"  {kill['kind']:<9} command #{kill['nth']} after {kill['after']:.2f} s")
        else:
            lines.append(f"  {kill['kind']:<9} at {kill['at']:>6.2f} s (pick {kill['pick']})")
    return "\n".join(lines)


def pick(candidates: t.Sequence[t.Any], fraction: float) -> t.Any:
    """The candidate a fraction in [0, 1) chooses (candidates in a stable order)."""
    return candidates[min(len(candidates) - 1, int(fraction * len(candidates)))]
