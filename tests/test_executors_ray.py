"""The ray turn executor on its own (not yet driven by the agents), on a real Ray cluster.

One cluster for the module (``tests/ray_cluster.py``): a head and two worker nodes inside a network
namespace whose only interface is ``lo``, with this process's driver in the same namespace. The
tests run in file order and the last one kills a worker node, so the ones before have both nodes.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from executor_cases import (
    counting,
    group_and_straggler,
    numbered,
    read_all,
    read_until,
    spec,
    stubborn,
    tagged,
    wait_until,
)
from overstory.errors import TurnNotFound
from overstory.executors import get_executor
from overstory.executors.base import STOPPED, TurnSpec
from overstory.executors.ray_executor import RayExecutor
from ray_cluster import RayTestCluster, ray_cluster_fixture  # noqa: F401 - the module's cluster fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def executor(ray_cluster: RayTestCluster) -> RayExecutor:
    made = get_executor("ray", address=ray_cluster.address, turn_resources={"CPU": 1})
    assert isinstance(made, RayExecutor)
    return made


@pytest.fixture
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("turn")


def turn_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_the_cluster_and_its_driver_see_only_loopback(ray_cluster: RayTestCluster,
                                                      executor: RayExecutor) -> None:
    print(f"\ncluster (head + {len(ray_cluster.workers)} workers) started in {ray_cluster.started_seconds:.1f}s")
    assert os.readlink("/proc/self/ns/net") == os.readlink(f"/proc/{ray_cluster.keeper_pid}/ns/net")
    links = ray_cluster.run("ip", "-o", "link").stdout.splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"]
    executor.hub()  # the driver is connected: its sockets are in the namespace too
    sockets = ray_cluster.run("ss", "-Htan").stdout.splitlines()
    assert sockets, "Ray's processes listen and talk: ss must see them"
    for line in sockets:
        local, peer = line.split()[3], line.split()[4]
        for address in (local, peer):
            assert loopback_or_any(address.rsplit(":", 1)[0].strip("[]")), line


def loopback_or_any(host: str) -> bool:
    """A loopback address, or the unspecified one of a listening socket (which, in here, only lo can reach)."""
    if host == "*":
        return True
    address = ipaddress.ip_address(host.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def test_a_second_submit_of_one_turn_id_starts_one_task(executor: RayExecutor, ray_cluster: RayTestCluster,
                                                        scratch: Path) -> None:
    marker = scratch / "starts"
    name = turn_id("once")
    turn = spec(name, counting(marker, "echo done"), scratch)
    first = executor.submit(turn)
    second = executor.submit(turn)
    third = RayExecutor(ray_cluster.address).submit(turn)  # another client finds the first through the hub
    assert executor.wait(name, timeout=120).state == "finished"
    assert (first.created, second.created, third.created) == (True, False, False)
    assert marker.read_text().splitlines() == ["started"]


def test_lines_come_in_order_and_a_new_reader_resumes_from_the_cursor(executor: RayExecutor,
                                                                      ray_cluster: RayTestCluster,
                                                                      scratch: Path) -> None:
    gate = scratch / "go"
    name = turn_id("lines")
    began = time.monotonic()
    executor.submit(spec(name, numbered(1, 2000, gate), scratch))
    first, cursor = read_until(executor, name, 1000, timeout=120)
    print(f"\nsubmit -> 1000 lines read: {time.monotonic() - began:.2f}s")
    assert first == [f"line {i}" for i in range(1, 1001)]
    gate.touch()
    rest, _ = read_all(RayExecutor(ray_cluster.address), name, cursor)
    assert rest == [f"line {i}" for i in range(1001, 2001)] + ["tail"]


def test_stop_ends_the_whole_process_group_and_what_left_it(executor: RayExecutor, scratch: Path) -> None:
    name = turn_id("stop")
    executor.submit(spec(name, group_and_straggler(), scratch))
    assert read_until(executor, name, 1, timeout=120)[0] == ["ready"]
    running = executor.status(name)
    assert running.state == "running" and running.node and running.pid
    assert len(tagged(name)) >= 3  # sh, its background sleep, and the setsid one that left the group
    stopped = executor.stop(name, grace=2)
    assert (stopped.state, stopped.reason) == ("failed", STOPPED)
    wait_until(lambda: tagged(name) == [], 10, f"processes of {name} still run: {tagged(name)}")


def test_stop_kills_a_command_that_ignores_sigterm_after_the_grace(executor: RayExecutor, scratch: Path) -> None:
    name = turn_id("stubborn")
    executor.submit(spec(name, stubborn(), scratch))
    assert read_until(executor, name, 1, timeout=120)[0] == ["ready"]
    stopped = executor.stop(name, grace=1)
    assert (stopped.state, stopped.reason, stopped.exit_code) == ("failed", STOPPED, 128 + signal.SIGKILL)
    wait_until(lambda: tagged(name) == [], 10, f"processes of {name} still run: {tagged(name)}")


def test_a_stop_the_task_cannot_hear_kills_on_the_node_and_cancels_the_task(executor: RayExecutor,
                                                                           scratch: Path) -> None:
    """The Ray worker running the turn is frozen (SIGSTOP): it cannot see the stop. After the grace, a task
    pinned to the turn's node kills the turn's processes, and the turn's task is cancelled (its worker killed)."""
    name = turn_id("frozen")
    executor.submit(spec(name, group_and_straggler(), scratch))
    assert read_until(executor, name, 1, timeout=120)[0] == ["ready"]
    processes = tagged(name)
    leaders = [pid for pid in processes if parent(pid) not in processes]  # the command; its parent is the shim
    assert len(leaders) == 1, leaders
    worker = parent(parent(leaders[0]))  # the Ray worker running the turn's task
    assert "ray::" in Path(f"/proc/{worker}/cmdline").read_text(errors="replace"), "not a Ray worker"
    os.kill(worker, signal.SIGSTOP)
    try:
        stopped = executor.stop(name, grace=1)
    finally:
        try:
            os.kill(worker, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert stopped.state == "failed" and stopped.reason == STOPPED, stopped
    wait_until(lambda: tagged(name) == [], 10, f"processes of {name} still run: {tagged(name)}")
    wait_until(lambda: not Path(f"/proc/{worker}").exists() or _state(worker) == "Z", 10,
               f"the frozen worker {worker} was not killed")


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_turn_outlives_the_process_that_submitted_it(executor: RayExecutor, ray_cluster: RayTestCluster,
                                                       scratch: Path) -> None:
    """The hub owns the task, not the submitter: a loop that exits (or dies) leaves its turn running, and
    another process reads it and waits for it. (The child process is in this network namespace too.)"""
    gate = scratch / "go"
    name = turn_id("orphan")
    code = ("import sys; from overstory.executors.ray_executor import RayExecutor; "
            "from overstory.executors.base import TurnSpec; "
            f"print(RayExecutor(sys.argv[1]).submit(TurnSpec({name!r}, ('sh', '-c', "
            f"\"echo early; while [ ! -e {gate} ]; do sleep 0.05; done; echo late; exit 4\"), '/')).created)")
    done = subprocess.run([sys.executable, "-c", code, ray_cluster.address], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "True", done.stderr[-2000:]
    assert read_until(executor, name, 1, timeout=120)[0] == ["early"]
    assert executor.status(name).state == "running"
    gate.touch()
    ended = executor.wait(name, timeout=60)
    assert (ended.state, ended.exit_code) == ("finished", 4)
    assert read_all(executor, name)[0] == ["early", "late"]


def test_statuses_are_typed(executor: RayExecutor, ray_cluster: RayTestCluster, scratch: Path) -> None:
    name = turn_id("exit")
    executor.submit(spec(name, "echo out; exit 3", scratch))
    ended = executor.wait(name, timeout=120)
    assert (ended.state, ended.exit_code, ended.ended) == ("finished", 3, True)
    assert ended.node in ray_cluster_nodes(executor) and ended.pid and ended.ended_ms

    missing = turn_id("missing")
    executor.submit(TurnSpec(missing, (str(scratch / "no-such-program"),), str(scratch)))
    failed = executor.wait(missing, timeout=120)
    assert failed.state == "failed" and "no-such-program" in failed.reason

    # No node has this resource: the task waits for one, and a stop cancels it before it ever runs.
    waiting = RayExecutor(ray_cluster.address, turn_resources={"CPU": 1, "ov_nowhere": 1})
    queued = turn_id("queued")
    marker = scratch / "queued-started"
    waiting.submit(spec(queued, counting(marker, "true"), scratch))
    status = waiting.status(queued)
    assert status.state == "queued" and "ov_nowhere" in status.reason
    stopped = waiting.stop(queued, grace=1)
    assert (stopped.state, stopped.reason) == ("failed", STOPPED)
    assert not marker.exists()

    with pytest.raises(TurnNotFound) as caught:
        executor.status("never-submitted")
    assert caught.value.turn_id == "never-submitted"


def ray_cluster_nodes(executor: RayExecutor) -> set[str]:
    return {node["NodeID"] for node in executor.ray.nodes() if node["Alive"]}


def test_turns_spread_over_both_worker_nodes(executor: RayExecutor, scratch: Path) -> None:
    gate = scratch / "go"
    names = [turn_id(f"spread{i}") for i in range(4)]
    for name in names:  # each holds its CPU until the gate opens: two per worker node
        executor.submit(spec(name, f"echo up; while [ ! -e '{gate}' ]; do sleep 0.05; done", scratch))
    for name in names:
        read_until(executor, name, 1, timeout=120)
    nodes = {name: executor.status(name).node for name in names}
    gate.touch()
    for name in names:
        assert executor.wait(name, timeout=60).state == "finished"
    print("\nnode per turn: " + ", ".join(f"{name}={str(node)[:8]}" for name, node in nodes.items()))
    assert len(set(nodes.values())) == 2


def test_a_killed_worker_node_makes_its_turn_lost_and_nothing_runs_again(executor: RayExecutor,
                                                                         ray_cluster: RayTestCluster,
                                                                         scratch: Path) -> None:
    marker = scratch / "starts"
    name = turn_id("doomed")
    executor.submit(spec(name, counting(marker, group_and_straggler()), scratch))
    assert read_until(executor, name, 1, timeout=120)[0] == ["ready"]
    running = executor.status(name)
    assert running.state == "running" and len(tagged(name)) >= 3
    killed = ray_cluster.kill_node(str(running.node))  # kill -9: the raylet and its workers, nothing else
    began = time.monotonic()
    lost = wait_until(lambda: (s := executor.status(name)).ended and s, 10,
                      f"turn {name} not lost within 10 s of its node's raylet being killed")
    print(f"\nkilled {len(killed)} processes of node {str(running.node)[:8]}; lost after "
          f"{time.monotonic() - began:.2f}s: {lost.reason}")
    assert lost.state == "lost"
    # Nothing keeps running on the turn's behalf: the shim saw its worker die and killed the turn's processes.
    wait_until(lambda: tagged(name) == [], 10, f"processes of {name} outlived their node: {tagged(name)}")
    # Ray did not run it again by itself: one start, and the task's only attempt is the failed first one.
    attempts = wait_until(lambda: [a for a in executor.attempts(name) if a["state"] == "FAILED"]
                          and executor.attempts(name), 30, f"no failed attempt of {name} in Ray's state API")
    assert [(a["attempt"], a["state"], a["node"]) for a in attempts] == [(0, "FAILED", running.node)]
    assert marker.read_text().splitlines() == ["started"]
    # The cluster goes on with the node it has left.
    after = turn_id("after")
    executor.submit(spec(after, "echo still here", scratch))
    assert read_all(executor, after, timeout=120)[0] == ["still here"]
    assert executor.status(after).node not in (running.node, None)


def test_the_cluster_processes_are_all_in_its_namespace(ray_cluster: RayTestCluster) -> None:
    """What the teardown checks holds from the start: every Ray process of the test is inside."""
    inside = set(ray_cluster.processes())
    ours = subprocess.run(["pgrep", "-f", ray_cluster.temp_dir], capture_output=True, text=True).stdout.split()
    assert ours and {int(pid) for pid in ours} <= inside
