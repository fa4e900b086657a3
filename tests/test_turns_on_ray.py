"""Agents' turns on a real Ray cluster (``executor: ray``, or ``ov sling --executor ray``), driven by their loops.

One cluster for the module (``tests/ray_cluster.py``): a head (no CPUs: it runs no turns) and two worker
nodes in a network namespace whose only interface is ``lo``; this process and the agents' loops it starts
are in that namespace too. The nodes are on this machine, but a turn's workspace travels by git all the same
(``executors.travel_node``): the node runs it in a mount namespace where the project's path is its own copy.
The only folder a test shares with its turns is ``marks/``, made writable in their sandbox
(``sandbox.writable``), where a turn leaves a mark that its retry looks for.
"""

from __future__ import annotations

import json
import os
import typing as t
import uuid
from pathlib import Path

import pytest

from claude_cli import claude_bin  # noqa: F401 - the fixture
from conftest import run_ov
from overstory.agents.loop import spawn_loop
from overstory.agents.spawn import SlingRequest, sling
from overstory.executors import get_executor
from overstory.executors.base import TurnSpec
from overstory.paths import ProjectPaths
from overstory.store import sessions
from ray_cluster import RayTestCluster, ray_cluster_fixture  # noqa: F401 - the module's cluster fixture
from test_watchdog import REPORT_DONE, load, mail_rows, wait_for, write_local_config

pytestmark = pytest.mark.slow


def start_on(project: ProjectPaths, conn: t.Any, task: str, actions: list[dict[str, t.Any]],
             executor: str | None) -> str:
    scenario = project.root.parent / f"scenario-{task}.json"
    scenario.write_text(json.dumps({"turns": [{"actions": actions, "result": "done"}]}), encoding="utf-8")
    result = sling(project, load(project), conn, SlingRequest(capability="builder", task_id=task, runtime="scripted",
                                                              scenario=scenario, executor=executor), start=False)
    pid, ticks = spawn_loop(project, result.name, result.generation, dict(os.environ))
    sessions.update_fields(conn, result.name, result.generation, loop_pid=pid, loop_start_ticks=ticks)
    return result.name


def commit(task: str) -> list[dict[str, t.Any]]:
    return [{"write": {"path": f"{task}.txt", "content": f"{task}\n"}},
            {"bash": f"git add {task}.txt && git commit -q -m 'work on {task}'"}, REPORT_DONE]


def current(conn: t.Any, name: str) -> sessions.Session:
    found = sessions.get(conn, name)
    assert found is not None
    return found


def worker_node_ids() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0}


CLAUDE_TASK = "cl"


def claude_team_member(project: ProjectPaths, tmp_path: Path, api: t.Any, claude_bin: str) -> str:
    """A real-claude builder on the cluster (`ov sling --executor ray`), answered by the mock Messages API (the
    model is the one part that cannot run here)."""
    from claude_cli import claude_env

    env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": claude_bin})
    slung = run_ov("sling", "builder", CLAUDE_TASK, "--runtime", "claude", "--executor", "ray",
                   "--prompt", "add cl.txt and report", cwd=project.root, env=env)
    assert slung.returncode == 0, slung.stderr
    return f"builder-{CLAUDE_TASK}"


def test_a_team_on_the_cluster_completes_on_both_nodes_and_merges(project: ProjectPaths, state_db: t.Any,
                                                                  ray_cluster: RayTestCluster,
                                                                  tmp_path: Path, claude_bin: str) -> None:
    from mockapi import MockMessagesAPI, TurnScript, text_reply, tool_reply

    # Turns run on the cluster by configuration; one scripted agent asks for local turns.
    write_local_config(project, executor={"kind": "ray", "ray": {"address": ray_cluster.address,
                                                                "turn_resources": {"CPU": 1}}},
                       turns={"retry_backoff": 0.05, "max_concurrent": 10})
    (project.ov_dir / "only-here").write_text("the control node's own file\n")
    seen = {"bash": f"ls -a {project.ov_dir} > seen.txt && git add seen.txt && git commit -qm 'what r0 saw'"}
    script = TurnScript([
        tool_reply("Bash", {"command": "echo cl > cl.txt && git add cl.txt && git commit -qm 'work on cl'",
                            "description": "commit"}),
        tool_reply("Bash", {"command": "ov mail send --type worker_done --subject 'done cl' --body finished",
                            "description": "report"}),
        text_reply("Done.")])
    with MockMessagesAPI(script) as api:
        remote = [start_on(project, state_db, "r0", [seen, *commit("r0")], None),
                  *[start_on(project, state_db, f"r{i}", commit(f"r{i}"), None) for i in range(1, 6)],
                  claude_team_member(project, tmp_path, api, claude_bin)]
        here = start_on(project, state_db, "l0", commit("l0"), "local")
        for name in [*remote, here]:
            wait_for(lambda name=name: current(state_db, name).is_terminal, 300, f"{name} to end")
            assert current(state_db, name).state == "completed", current(state_db, name).state_reason
    listed = run_ov("status", "--json", "--all", cwd=project.root)
    assert listed.returncode == 0, listed.stderr
    nodes = {agent["name"]: agent["node"] for agent in json.loads(listed.stdout)["agents"]}
    workers = worker_node_ids()
    assert all(nodes[name] in workers for name in remote), (nodes, workers)
    assert len({nodes[name] for name in remote}) >= 2  # SPREAD over both worker nodes
    assert nodes[here] == os.uname().nodename  # a local turn's node is this machine
    rows = state_db.execute("SELECT agent, node, status FROM turns ORDER BY started_at").fetchall()
    assert sorted((r["agent"], r["status"]) for r in rows) == sorted((n, "ok") for n in [*remote, here])
    for name in [*remote, here]:
        task = name.rsplit("-", 1)[1]
        log = subprocess_git(project, "log", "--format=%s", f"ov/{name}")
        assert log.count(f"work on {task}") == 1  # its commit, once, on its branch
    # Every remote turn came back through the control node's compare-and-swap, once.
    returned = [r for r in events_of(project, "workspace_returned")]
    assert sorted(r["agent"] for r in returned) == sorted(remote), returned
    assert all(json.loads(r["data"])["outcome"] == "applied" for r in returned)
    # The node never saw the control node's files: its view of .overstory/ was its own copy.
    saw = subprocess_git(project, "show", f"ov/{remote[0]}:seen.txt").split()
    assert "run" in saw and "only-here" not in saw, saw
    done = mail_rows(state_db, type="worker_done")
    assert sorted(row["sender"] for row in done) == sorted([*remote, here])  # each worker_done arrived once
    merged = run_ov("merge", "--all", cwd=project.root)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    on_main = subprocess_git(project, "ls-tree", "--name-only", "HEAD").split()
    assert {f"{name.rsplit('-', 1)[1]}.txt" for name in [*remote, here]} <= set(on_main), on_main
    # The node is shown where the operator looks: `ov trace` (each turn), `ov watch` (a NODE column).
    traced = json.loads(run_ov("trace", remote[1], "--json", cwd=project.root).stdout)
    assert [turn["node"] for turn in traced["turns"]] == [nodes[remote[1]]]
    frame = run_ov("watch", "--once", "--width", "140", cwd=project.root).stdout
    lines = {line.split()[0]: line for line in frame.splitlines() if line.strip().startswith("builder-")}
    assert "NODE" in frame and all(nodes[name][:8] in lines[name] for name in remote), frame


def test_the_runtimes_session_travels_with_each_turn(project: ProjectPaths, state_db: t.Any,
                                                     ray_cluster: RayTestCluster) -> None:
    # Each turn's folder on its node is made from what the control node sends and removed at the turn's end, so
    # a second turn resumes its session only if the first turn's runtime state came back and went out again
    # (whichever node each ran on: the scripted runtime refuses to resume a session it does not have).
    write_local_config(project, executor={"kind": "ray", "ray": {"address": ray_cluster.address,
                                                                "turn_resources": {"CPU": 1}}},
                       turns={"retry_backoff": 0.05})
    scenario = project.root.parent / "scenario-s2.json"
    scenario.write_text(json.dumps({"turns": [
        {"actions": [{"text": "waiting"}, {"bash": "ov mail send --to operator --subject ready"}], "result": "one"},
        {"actions": [{"expect_in_prompt": "second task"}, *commit("s2")], "result": "two"}]}))
    result = sling(project, load(project), state_db, SlingRequest(capability="builder", task_id="s2",
                                                                  runtime="scripted", scenario=scenario), start=False)
    name = result.name
    pid, ticks = spawn_loop(project, name, result.generation, dict(os.environ))
    sessions.update_fields(state_db, name, result.generation, loop_pid=pid, loop_start_ticks=ticks)
    wait_for(lambda: current(state_db, name).state == "between_turns" and current(state_db, name).turns == 1, 120,
             "the first turn")
    sent = run_ov("mail", "send", "--to", name, "--subject", "next", "--body", "second task", cwd=project.root)
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: current(state_db, name).is_terminal, 120, "the agent to end")
    assert current(state_db, name).state == "completed", current(state_db, name).state_reason
    first, second = state_db.execute("SELECT status, resumed, session_id, node FROM turns WHERE agent = ? "
                                     "ORDER BY started_at", (name,)).fetchall()
    assert (first["status"], second["status"]) == ("ok", "ok"), (dict(first), dict(second))
    assert second["resumed"] == 1 and second["session_id"] == first["session_id"]
    assert {first["node"], second["node"]} <= worker_node_ids()


def events_of(project: ProjectPaths, kind: str) -> list[t.Any]:
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    try:
        return conn.execute("SELECT agent, summary, data FROM events WHERE kind = ?", (kind,)).fetchall()
    finally:
        conn.close()


def subprocess_git(project: ProjectPaths, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", *args], cwd=project.root, capture_output=True, text=True, check=True).stdout


def test_a_node_that_does_not_see_the_turns_folder_refuses_it_in_one_line(ray_cluster: RayTestCluster,
                                                                          tmp_path: t.Any) -> None:
    executor = get_executor("ray", address=ray_cluster.address, turn_resources={"CPU": 1})
    turn = f"nowhere-{uuid.uuid4().hex[:8]}"
    executor.submit(TurnSpec(turn, ("true",), str(tmp_path / "not-there")))
    status = executor.wait(turn, timeout=60)
    assert status.state == "failed"
    assert "does not see the turn's folder" in status.reason and "\n" not in status.reason
    executor.forget(turn)


def test_ov_stop_of_an_agent_on_the_cluster_stops_its_turn_through_the_executor(
        project: ProjectPaths, state_db: t.Any, ray_cluster: RayTestCluster) -> None:
    from overstory import procs

    write_local_config(project, executor={"kind": "ray", "ray": {"address": ray_cluster.address,
                                                                 "turn_resources": {"CPU": 1}}},
                       turns={"retry_backoff": 0.05, "kill_grace": 1})
    name = start_on(project, state_db, "s1", [{"bash": "sleep 300"}], None)  # config executor.kind: ray
    turn = wait_for(lambda: state_db.execute("SELECT id, node, pgid FROM turns WHERE agent = ? AND node IS NOT NULL",
                                             (name,)).fetchone(), 120, "the turn to run on a node")
    assert turn["node"] in worker_node_ids() and turn["pgid"] is None  # no process group on the control node
    assert current(state_db, name).turn_pgid is None
    wait_for(lambda: procs.tagged_processes(turn["id"]), 60, "the turn's sleep on its node")
    stopped = run_ov("stop", name, cwd=project.root)
    assert stopped.returncode == 0, stopped.stderr
    # The loop stopped the turn through the executor (the node's group), then settled it: before `ov stop`
    # reached for anything of its own.
    ended = state_db.execute("SELECT status, error FROM turns WHERE id = ?", (turn["id"],)).fetchone()
    assert ended["status"] == "aborted", dict(ended)
    wait_for(lambda: not procs.tagged_processes(turn["id"]), 30, "nothing of the turn left running")


def test_doctor_checks_the_cluster_and_each_node_and_says_what_is_missing(project: ProjectPaths,
                                                                         ray_cluster: RayTestCluster) -> None:
    import overstory
    from test_doctor_cluster import cluster_lines

    executor = {"kind": "ray", "ray": {"address": ray_cluster.address, "turn_resources": {"CPU": 1}}}
    write_local_config(project, executor=executor, runtime={"default": "scripted", "codex_bin": "/nowhere/codex"})
    sound = run_ov("doctor", cwd=project.root, timeout=200)
    assert sound.returncode == 0, sound.stdout + sound.stderr
    assert "Traceback" not in sound.stderr, sound.stderr[-2000:]
    assert cluster_lines(sound.stdout) == [
        f"[ok  ] cluster: {ray_cluster.address}: 3 node(s) alive, 2 with room for a turn (CPU=1)",
        f"[ok  ] nodes: every node has ov {overstory.__version__} and scripted; clocks within 1 s of this machine's"]
    # Reviewers run codex, which no worker node has (its configured path does not exist): one line per node, exit 1.
    write_local_config(project, executor=executor, runtime={"default": "scripted", "codex_bin": "/nowhere/codex"},
                       runtimes={"reviewer": "codex"})
    missing = run_ov("doctor", "--json", cwd=project.root, timeout=200)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    failed = [c for c in json.loads(missing.stdout)["checks"] if c["status"] == "fail"]
    workers = worker_node_ids()
    assert sorted(c["name"] for c in failed) == sorted(f"node {node_name(node)} ({node[:8]})" for node in workers)
    assert {node_name(node) for node in workers} == set(ray_cluster.workers)
    assert all(c["detail"].startswith("runtime codex is missing") for c in failed), failed


def node_name(node_id: str) -> str:
    import ray

    return next(node["NodeName"] for node in ray.nodes() if node["NodeID"] == node_id)


def marks(project: ProjectPaths) -> Path:
    """A folder outside the project that the turns may write (``sandbox.writable``): a turn's workspace is a copy
    on its node, so a mark a lost turn leaves for its retry must be somewhere else."""
    folder = project.root.parent / "marks"
    folder.mkdir(exist_ok=True)
    return folder


def sleep_once(project: ProjectPaths, task: str) -> dict[str, str]:
    mark = marks(project) / task
    return {"bash": f"test -e {mark} || {{ touch {mark}; sleep 300; }}"}


def start_retrying(project: ProjectPaths, conn: t.Any, task: str) -> str:
    """An agent on the cluster whose first turn sleeps (it leaves a mark) and whose retry commits and reports."""
    once = [sleep_once(project, task), *commit(task)]
    scenario = project.root.parent / f"scenario-{task}.json"
    scenario.write_text(json.dumps({"turns": [{"actions": once, "result": "done"} for _ in range(3)]}))
    result = sling(project, load(project), conn, SlingRequest(capability="builder", task_id=task, runtime="scripted",
                                                              scenario=scenario), start=False)
    pid, ticks = spawn_loop(project, result.name, result.generation, dict(os.environ))
    sessions.update_fields(conn, result.name, result.generation, loop_pid=pid, loop_start_ticks=ticks)
    return result.name


def sleeping_turn(project: ProjectPaths, conn: t.Any, name: str) -> t.Any:
    """The agent's first turn once it sleeps on its node (its row: id, node)."""
    try:
        first = wait_for(lambda: conn.execute("SELECT id, node FROM turns WHERE agent = ? AND node IS NOT NULL",
                                              (name,)).fetchone(), 120, "the first turn on a node")
    except AssertionError:  # say where it stands: the agent, its turns, the cluster's free resources and nodes
        import ray

        rows = [dict(r) for r in conn.execute("SELECT id, node, status, error FROM turns WHERE agent = ?", (name,))]
        raise AssertionError(f"no turn of {name} on a node after 120 s: {current(conn, name)}; turns {rows}; free "
                             f"{ray.available_resources()}; nodes {[(n['NodeName'], n['Alive']) for n in ray.nodes()]}"
                             ) from None
    wait_for((marks(project) / current(conn, name).task_id).exists, 60, "the first turn to sleep on its node")
    return first


def kill_loop(conn: t.Any, name: str) -> None:
    import signal

    from overstory import procs

    agent = current(conn, name)
    os.kill(int(agent.loop_pid or 0), signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(agent.loop_pid, agent.loop_start_ticks), 30, "the loop to die")


def ray_worker_of(turn_id: str) -> int:
    """The Ray worker that runs the turn's task: the ancestor of the turn's processes whose parent is a raylet."""
    from overstory import procs

    for pid in procs.tagged_processes(turn_id):
        while pid > 1:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/raylet"):
                return pid
            pid = parent
    raise AssertionError(f"no Ray worker runs turn {turn_id}")


def test_the_watchdog_settles_a_dead_loops_turn_lost_with_its_worker_within_seconds(
        project: ProjectPaths, state_db: t.Any, ray_cluster: RayTestCluster) -> None:
    import signal
    import time

    from overstory import procs
    from test_watchdog import make_watchdog

    write_local_config(project, executor={"kind": "ray", "ray": {"address": ray_cluster.address,
                                                                 "turn_resources": {"CPU": 1}}},
                       turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       sandbox={"writable": [str(marks(project))]},
                       watchdog={"stale_after": 600, "zombie_after": 1200})
    name = start_retrying(project, state_db, "w1")
    first = sleeping_turn(project, state_db, name)
    kill_loop(state_db, name)  # nobody watches the turn now; it goes on on its node (the hub owns it)
    assert procs.tagged_processes(first["id"])
    os.kill(ray_worker_of(first["id"]), signal.SIGKILL)  # its worker dies: Ray's word is "lost"
    killed_at = time.monotonic()
    # The tick below must find Ray's word: until Ray has noticed, the turn still looks running, and the
    # watchdog stops it through the executor instead (the next test's case), which is right but not this path.
    executor = get_executor("ray", address=ray_cluster.address, turn_resources={"CPU": 1})
    wait_for(lambda: executor.status(first["id"]).state == "lost", 10, "Ray to report the turn lost")
    dog = make_watchdog(project, state_db)
    readopted = wait_for(lambda: [a for a in dog.tick() if a.agent == name and a.kind == "readopted"], 30,
                         "the watchdog to settle the lost turn")
    assert time.monotonic() - killed_at < 10  # the executor's word, not a stall timeout
    assert "its turn was lost with its node or worker (retry 1/3)" in readopted[0].detail, readopted
    assert f"its turn was lost on node {first['node']}" in readopted[0].detail, readopted
    settled = state_db.execute("SELECT status, error FROM turns WHERE id = ?", (first["id"],)).fetchone()
    assert settled["status"] == "transient" and "lost on its executor (ray)" in settled["error"], dict(settled)
    assert current(state_db, name).retries == 1  # the same retry rules as a local crash
    wait_for(lambda: current(state_db, name).is_terminal, 180, "the agent to end")
    assert current(state_db, name).state == "completed", current(state_db, name)
    assert subprocess_git(project, "log", "--format=%s", f"ov/{name}").count("work on w1") == 1
    assert len(mail_rows(state_db, type="worker_done", sender=name)) == 1
    wait_for(lambda: not procs.tagged_processes(first["id"]), 30, "nothing left of the lost turn")


def test_the_watchdog_stops_a_dead_loops_running_turn_through_the_executor_before_the_retry(
        project: ProjectPaths, state_db: t.Any, ray_cluster: RayTestCluster) -> None:
    from overstory import procs
    from test_watchdog import make_watchdog

    write_local_config(project, executor={"kind": "ray", "ray": {"address": ray_cluster.address,
                                                                 "turn_resources": {"CPU": 1}}},
                       turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       sandbox={"writable": [str(marks(project))]},
                       watchdog={"stale_after": 600, "zombie_after": 1200})
    name = start_retrying(project, state_db, "w2")
    first = sleeping_turn(project, state_db, name)
    kill_loop(state_db, name)
    raylets = {pid for pid in ray_cluster.processes() if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
               .endswith(b"/raylet")}
    dog = make_watchdog(project, state_db)
    readopted = wait_for(lambda: [a for a in dog.tick() if a.agent == name and a.kind == "readopted"], 60,
                         "the watchdog to re-adopt the agent")
    assert f"stopped its turn on node {first['node']} through the ray executor" in readopted[0].detail, readopted
    assert not procs.tagged_processes(first["id"])  # stopped before the retry could start beside it
    settled = state_db.execute("SELECT status, error FROM turns WHERE id = ?", (first["id"],)).fetchone()
    assert settled["status"] == "failed" and "loop died" in settled["error"], dict(settled)
    wait_for(lambda: current(state_db, name).is_terminal, 180, "the agent to end")
    assert current(state_db, name).state == "completed", current(state_db, name)
    assert subprocess_git(project, "log", "--format=%s", f"ov/{name}").count("work on w2") == 1
    # Nothing of Ray's was touched: every raylet is still there.
    assert raylets <= set(ray_cluster.processes())


def test_a_turn_whose_node_dies_is_lost_and_retried_on_the_other_node(  # last: it kills a worker node
        project: ProjectPaths, state_db: t.Any, ray_cluster: RayTestCluster) -> None:
    from overstory import procs

    write_local_config(project, executor={"kind": "ray", "ray": {"address": ray_cluster.address,
                                                                 "turn_resources": {"CPU": 1}}},
                       turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       sandbox={"writable": [str(marks(project))]},
                       ledger={"side_effects": ["Bash(echo effect*)"]})  # classed a side effect, as a user would
    effect = marks(project) / "effect-k1"
    once = [{"bash": f"echo effect >> {effect}"}, sleep_once(project, "k1"), *commit("k1")]
    scenario = project.root.parent / "scenario-k1.json"
    scenario.write_text(json.dumps({"turns": [{"actions": once, "result": "done"} for _ in range(3)]}))
    result = sling(project, load(project), state_db, SlingRequest(capability="builder", task_id="k1",
                                                                  runtime="scripted", scenario=scenario), start=False)
    name = result.name
    pid, ticks = spawn_loop(project, name, result.generation, dict(os.environ))
    sessions.update_fields(state_db, name, result.generation, loop_pid=pid, loop_start_ticks=ticks)
    first = wait_for(lambda: state_db.execute("SELECT id, node FROM turns WHERE agent = ? AND node IS NOT NULL",
                                              (name,)).fetchone(), 120, "the first turn on a node")
    wait_for((marks(project) / "k1").exists, 60, "the first turn to be in its sleep on its node")
    # The side effect is in the ledger with its receipt (from the turn's stream, relayed by the hub) before the kill.
    wait_for(lambda: state_db.execute("SELECT count(*) FROM tool_calls WHERE turn_id = ? AND status = 'succeeded' "
                                      "AND input LIKE '%echo effect%'", (first["id"],)).fetchone()[0], 30,
             "the side effect's receipt")
    ray_cluster.kill_node(first["node"])
    # Marked lost from Ray's word (within seconds), not after a stall timeout (turns.stall_timeout is minutes).
    wait_for(lambda: state_db.execute("SELECT status FROM turns WHERE id = ?", (first["id"],)).fetchone()["status"]
             == "transient", 10, "the turn on the dead node to be settled lost")
    wait_for(lambda: current(state_db, name).is_terminal, 120, "the agent to end")
    assert current(state_db, name).state == "completed", current(state_db, name)
    rows = state_db.execute("SELECT id, node, status, error FROM turns WHERE agent = ? ORDER BY started_at",
                            (name,)).fetchall()
    # The first attempt was lost with its node; a retry placed before Ray had noticed the node's death is
    # lost too (Ray marks a node dead when its heartbeats stop); the one that completes ran elsewhere. The
    # lost turn's runtime state died with it (it comes back only with a finished turn), so resuming its
    # session fails once and the loop starts a fresh one (``resume_failed``), as for a local session lost.
    statuses = [r["status"] for r in rows]
    assert statuses[-1] == "ok" and statuses[0] == "transient" and set(statuses[:-1]) <= {"transient", "resume_failed"}
    assert all("lost" in r["error"] for r in rows[:-1] if r["status"] == "transient"), [dict(r) for r in rows]
    assert rows[-1]["node"] != first["node"]
    assert subprocess_git(project, "log", "--format=%s", f"ov/{name}").count("work on k1") == 1
    assert len(mail_rows(state_db, type="worker_done", sender=name)) == 1
    # The side effect the ledger recorded on the dead node was held back from every retry: it happened once.
    assert effect.read_text() == "effect\n"
    calls = state_db.execute("SELECT turn_id, status FROM tool_calls WHERE agent = ? AND input LIKE '%echo effect%' "
                             "ORDER BY id", (name,)).fetchall()
    assert calls[0]["turn_id"] == first["id"] and calls[0]["status"] == "succeeded", [dict(c) for c in calls]
    assert {c["status"] for c in calls[1:]} == {"skipped_duplicate"}, [dict(c) for c in calls]
    wait_for(lambda: not procs.tagged_processes(first["id"]), 30, "nothing left of the lost turn")
