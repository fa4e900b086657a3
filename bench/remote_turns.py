"""What a turn on a Ray node costs over a local one, through the real `ov sling` and agent loops (issue 30).

    python bench/remote_turns.py [--rounds 5] [--agents 30] [--files 200]

Needs what the Ray tests need (root, ``unshare``, ``nsenter``, ``ip``, the ``ray`` extra): the clusters are
``tests/ray_cluster.py``'s, in a network namespace of their own (loopback only). Scripted builders, one turn
each (write a file, commit it, ``ov mail send --type worker_done``), in a project of ``--files`` files.

1. One agent at a time, alternating local and ray (``--executor``), ``--rounds`` each, on a cluster of three
   worker nodes; each time is from the start of `ov sling`:
   - first runtime event: the turn's first stream line in its ``stdout.ndjson`` here (for ray: fetched,
     run on the node, relayed by the hub);
   - runtime's result: the scripted runtime's ``result`` line;
   - commit on the branch: ``ov/NAME`` moved (locally ov takes the branch out of the sandbox when the agent
     reports, so usually before the result; a remote turn's commits come back after its runtime exits);
   - completed: the agent's row ``completed``.
2. ``--agents`` agents slung at once (four `ov sling` at a time), all on the cluster, with three worker nodes
   and then with one (two CPUs each: 6 and 2 turns at once): first sling -> all completed, and the turns per node.

The nodes are processes on this one machine and share its cores: part 2 shows the scheduling and what ov adds
per turn, not the speed-up separate machines would give.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import typing as t
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from harness import clean_env, find_ov, init_project, make_repo  # noqa: E402

from ray_cluster import available, running_cluster  # noqa: E402

POLL = 0.005


def scenario_for(root: Path, task: str) -> Path:
    path = root.parent / f"scenario-{task}.json"
    actions = [{"write": {"path": f"{task}.txt", "content": f"{task}\n"}},
               {"bash": f"git add {task}.txt && git commit -q -m 'work on {task}'"},
               {"bash": f'ov mail send --type worker_done --subject "done {task}" --body finished'}]
    path.write_text(json.dumps({"turns": [{"actions": actions, "result": "done"}]}), encoding="utf-8")
    return path


def sling(ov: str, root: Path, task: str, executor: str, env: dict[str, str]) -> str:
    done = subprocess.run([ov, "sling", "builder", task, "--runtime", "scripted", "--executor", executor,
                           "--scenario", str(scenario_for(root, task)), "--json"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"ov sling {task} failed: {done.stderr.strip()[-400:]}")
    return str(json.loads(done.stdout)["name"])


def state_of(root: Path, name: str) -> str | None:
    conn = sqlite3.connect(f"file:{root / '.overstory' / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        found = conn.execute("SELECT state FROM sessions WHERE name = ?", (name,)).fetchone()
        return found[0] if found else None
    finally:
        conn.close()


def branch_tip(root: Path, name: str) -> str:
    return subprocess.run(["git", "rev-parse", "-q", "--verify", f"refs/heads/ov/{name}"], cwd=root,
                          capture_output=True, text=True).stdout.strip()


def follow(root: Path, name: str, began: float, base: str, timeout: float = 300) -> dict[str, float]:
    """The moments (seconds after ``began``) of one agent's first event, result, commit and completion."""
    seen: dict[str, float] = {}
    logs = root / ".overstory" / "logs" / name
    deadline = time.monotonic() + timeout
    while "completed" not in seen and time.monotonic() < deadline:
        now = time.perf_counter() - began
        outputs = list(logs.glob("*/stdout.ndjson")) if logs.is_dir() else []
        text = outputs[0].read_text(errors="replace") if outputs else ""
        if text and "first event" not in seen:
            seen["first event"] = now
        if '"type": "result"' in text or '"type":"result"' in text:
            seen.setdefault("result", now)
        if "commit" not in seen and branch_tip(root, name) not in ("", base):
            seen["commit"] = now
        if state_of(root, name) in ("completed", "zombie", "stopped"):
            seen["completed"] = now
            if state_of(root, name) != "completed":
                raise SystemExit(f"{name} ended {state_of(root, name)}")
        time.sleep(POLL)
    return seen


def write_config(root: Path, address: str, kind: str = "local") -> None:
    (root / ".overstory" / "config.local.yaml").write_text(json.dumps({
        "executor": {"kind": kind, "ray": {"address": address, "turn_resources": {"CPU": 1}}},
        "turns": {"max_concurrent": 40}, "agents": {"max_concurrent_agents": 100}}), encoding="utf-8")


def part_one(ov: str, root: Path, env: dict[str, str], rounds: int) -> dict[str, dict[str, list[float]]]:
    found: dict[str, dict[str, list[float]]] = {"local": {}, "ray": {}}
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    for index in range(rounds + 1):  # the first of each is a warm-up (bytecode, Ray's worker processes)
        for executor in ("local", "ray"):
            task = f"{executor[0]}{index:02d}"
            began = time.perf_counter()
            name = sling(ov, root, task, executor, env)
            moments = follow(root, name, began, base)
            if index:
                for key, value in moments.items():
                    found[executor].setdefault(key, []).append(value)
    return found


def part_two(ov: str, root: Path, env: dict[str, str], agents: int, label: str) -> dict[str, object]:
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        names = list(pool.map(lambda i: sling(ov, root, f"{label}{i:02d}", "ray", env), range(agents)))
    slung = time.perf_counter() - began
    deadline = time.monotonic() + 900
    while any(state_of(root, name) != "completed" for name in names):
        if time.monotonic() > deadline:
            raise SystemExit(f"not all of {label} completed in 900 s")
        time.sleep(0.1)
    total = time.perf_counter() - began
    conn = sqlite3.connect(f"file:{root / '.overstory' / 'state.db'}?mode=ro", uri=True)
    try:
        per_node = conn.execute("SELECT node, count(*) FROM turns WHERE agent LIKE ? GROUP BY node",
                                (f"builder-{label}%",)).fetchall()
    finally:
        conn.close()
    return {"slung": slung, "all completed": total, "turns per node": sorted(n for _, n in per_node)}


def cluster_run(workers: int, body: t.Callable[[str], t.Any]) -> t.Any:
    with running_cluster(workers=workers) as cluster:
        return body(cluster.address)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms" if values else "-"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--agents", type=int, default=30)
    parser.add_argument("--files", type=int, default=200)
    args = parser.parse_args()
    reason = available()
    if reason:
        print(f"cannot start a cluster: {reason}", file=sys.stderr)
        return 1
    scratch = Path(tempfile.mkdtemp(prefix="ov-bench-remote-"))
    ov, env = find_ov(), clean_env()

    def project(name: str, address: str) -> Path:
        root = init_project(make_repo(scratch / name / "repo", files=args.files))
        write_config(root, address)
        subprocess.run(["git", "add", "-A"], cwd=root, check=True)
        subprocess.run(["git", "commit", "-qm", "ov init"], cwd=root, env={**os.environ, **{
            "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
            "GIT_COMMITTER_EMAIL": "b@x"}}, check=False)
        return root

    def one_by_one(address: str) -> tuple[t.Any, t.Any]:
        first = part_one(ov, project("one", address), env, args.rounds)
        three = part_two(ov, project("three", address), env, args.agents, "t")
        return first, three

    first, three = cluster_run(3, one_by_one)
    one = cluster_run(1, lambda address: part_two(ov, project("single", address), env, args.agents, "s"))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores); {args.files} files; "
          f"{args.rounds} rounds after a warm-up")
    print("| from the start of `ov sling` to | local | ray | ray - local |")
    print("| --- | --- | --- | --- |")
    for key in ("first event", "result", "commit", "completed"):
        local, ray = first["local"].get(key, []), first["ray"].get(key, [])
        added = (statistics.median(ray) - statistics.median(local)) * 1000 if local and ray else float("nan")
        print(f"| {key} | {ms(local)} | {ms(ray)} | {added:+.0f} ms |")
    for executor in ("local", "ray"):
        pairs = zip(first[executor].get("result", []), first[executor].get("commit", []))
        gaps = [commit - result for result, commit in pairs]
        print(f"{executor}: runtime's result -> commit on the branch, median of rounds: {ms(gaps)} "
              "(negative: the branch moved before the turn ended)")
    for label, row in (("three worker nodes", three), ("one worker node", one)):
        print(f"{args.agents} agents on {label}: {json.dumps(row, default=lambda v: round(v, 2))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
