"""Many OS processes race compare-and-swap transitions on the same few agents.

Each worker is this file run as a script (a real, separate Python process with its
own SQLite connection). Workers report every outcome and every exception as JSON;
the test then audits the transitions table.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
import typing as t
from collections import Counter, defaultdict
from pathlib import Path

WORKERS = 10
NAMES = ("alpha", "beta", "gamma")
RACE_SECONDS = 3.0


def worker(db_path: str, seed: int, start_at: float, seconds: float) -> dict[str, t.Any]:
    """Hammer the agents until the deadline; return outcome counts and any escaped errors."""
    from overstory.errors import AgentExists
    from overstory.store import sessions
    from overstory.store.db import open_state

    rng = random.Random(seed)
    errors: list[str] = []
    counts: Counter[str] = Counter()
    try:
        conn = open_state(Path(db_path))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return {"counts": {}, "errors": [f"open: {type(exc).__name__}: {exc}"]}
    while time.time() < start_at:
        time.sleep(0.002)
    deadline = start_at + seconds
    while time.time() < deadline:
        name = rng.choice(NAMES)
        try:
            row = sessions.get(conn, name)
            if row is None:
                counts["missing"] += 1
                continue
            if row.is_terminal and rng.random() < 0.5:
                try:
                    sessions.create_session(conn, name=name, capability="builder", task_id="race",
                                            runtime="scripted", actor=f"w{seed}")
                    counts["respawned"] += 1
                except AgentExists:
                    counts["respawn_refused"] += 1
                continue
            # Mostly the generation just read; sometimes an older one (a stale writer).
            generation = row.generation if rng.random() < 0.85 else row.generation - rng.randint(1, 2)
            # Terminal states are rare targets so agents live long enough to race.
            to = rng.choices(sessions.STATES, weights=[1, 6, 6, 3, 3, 3, 1, 1])[0]
            outcome = sessions.transition(conn, name, generation, to, actor=f"w{seed}", reason="race")
            counts[type(outcome).__name__] += 1
            if isinstance(outcome, sessions.Ok):
                counts[f"edge:{outcome.prev}>{to}"] += 1
        except Exception as exc:  # noqa: BLE001 - every escaped error is what the test is about
            errors.append(f"{type(exc).__name__}: {exc}")
            if len(errors) > 20:
                break
    conn.close()
    return {"counts": dict(counts), "errors": errors}


def _run_race(db_path: Path) -> list[dict[str, t.Any]]:
    start_at = time.time() + 1.5  # lets every interpreter start before the race begins
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        subprocess.Popen([sys.executable, __file__, str(db_path), str(seed), repr(start_at), repr(RACE_SECONDS)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for seed in range(WORKERS)
    ]
    reports = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        reports.append(json.loads(stdout))
    return reports


def test_concurrent_cas_transitions_stay_legal(tmp_path: Path) -> None:
    from overstory.store import sessions
    from overstory.store.db import open_state

    db_path = tmp_path / "state.db"
    conn = open_state(db_path)
    for name in NAMES:
        sessions.create_session(conn, name=name, capability="builder", task_id="race", runtime="scripted",
                                actor="setup")

    reports = _run_race(db_path)

    escaped = [error for report in reports for error in report["errors"]]
    assert escaped == [], f"errors escaped to callers: {escaped[:5]}"
    totals: Counter[str] = Counter()
    for report in reports:
        totals.update(report["counts"])
    assert totals["Ok"] > 50, f"the race barely happened: {dict(totals)}"
    assert totals["StaleGeneration"] > 0 and totals["IllegalTransition"] > 0, dict(totals)

    rows = [dict(r) for r in conn.execute("SELECT * FROM transitions ORDER BY id")]
    by_name: dict[str, list[dict[str, t.Any]]] = defaultdict(list)
    for row in rows:
        by_name[row["name"]].append(row)

    # Every successful CAS and every respawn left exactly one row, and nothing else did.
    assert sum(1 for r in rows if r["from_state"] is not None) == totals["Ok"]
    assert sum(1 for r in rows if r["from_state"] is None) == len(NAMES) + totals["respawned"]

    for name, history in by_name.items():
        last_generation = 0
        last_to: dict[int, str] = {}
        for row in history:
            generation, prev, to = row["generation"], row["from_state"], row["to_state"]
            assert generation >= last_generation, f"{name}: generation went backwards at row {row['id']}"
            if generation > last_generation:
                assert prev is None and to == "booting", f"{name}: generation {generation} did not start by a spawn"
                assert generation == last_generation + 1, f"{name}: generation skipped to {generation}"
                if last_generation:
                    assert last_to[last_generation] in sessions.TERMINAL_STATES, (
                        f"{name}: respawned over an active generation {last_generation}")
            else:
                assert prev is not None, f"{name}: generation {generation} spawned twice"
                assert prev in sessions.ALLOWED_FROM[to], f"{name}: illegal {prev} -> {to} at row {row['id']}"
                assert prev == last_to[generation], f"{name}: chain broken at row {row['id']}"
            last_generation = generation
            last_to[generation] = to
        current = sessions.get(conn, name)
        assert current is not None
        assert (current.generation, current.state) == (last_generation, last_to[last_generation])
        assert current.version == sum(1 for r in history if r["generation"] == last_generation and r["from_state"])
        stored = conn.execute("SELECT generation FROM generations WHERE name = ?", (name,)).fetchone()[0]
        assert stored == last_generation
    conn.close()


if __name__ == "__main__":
    path, seed_text, start_text, seconds_text = sys.argv[1:5]
    try:
        result = worker(path, int(seed_text), float(start_text), float(seconds_text))
    except sqlite3.Error as exc:  # pragma: no cover - reported, never swallowed
        result = {"counts": {}, "errors": [f"{type(exc).__name__}: {exc}"]}
    print(json.dumps(result))
