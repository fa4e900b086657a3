"""A real Ray cluster for one test module: a head and two worker nodes, inside namespaces the test makes.

Ray's processes talk over the machine's own non-loopback address unless they cannot see one, so the
cluster lives in a NEW NETWORK NAMESPACE whose only interface is ``lo`` (up, 127.0.0.1): no packet of
it can leave the machine. It also gets a new PID namespace with its own /proc (and a mount namespace
for that /proc): ``ray stop --force`` inside it sees only this cluster's processes (never another
cluster on the machine), and when the namespace's first process (the keeper) exits, the kernel kills
everything left in it.

- the keeper: ``unshare --net --pid --fork --mount-proc --kill-child python -c KEEPER``; it brings ``lo``
  up, reaps orphans (it is the namespace's init) and exits when its stdin closes, so a test run that
  dies takes the cluster with it;
- the nodes: ``nsenter`` into the keeper's namespaces, ``ray start --head --node-ip-address 127.0.0.1
  --num-cpus 0`` (the control node runs no turns), then two ``ray start --address 127.0.0.1:6379``
  workers (``--num-cpus 2`` each), the second as soon as the first has made its sockets, all with a
  short ``--temp-dir`` of their own and fixed ports;
- the driver: the test process's main thread joins the keeper's network namespace (``setns``) for the
  module and goes back to its own afterwards; Ray's driver threads start after the join, inside;
  ``connect`` waits until all three nodes are alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from requires import missing

CLONE_NEWNET = 0x40000000
PORT = 6379
KEEPER = """
import os, subprocess, sys, threading, time
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
def reap():
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.2)
threading.Thread(target=reap, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET) failed")


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


@dataclass
class RayTestCluster:
    keeper: subprocess.Popen[str]
    temp_dir: str
    address: str = f"127.0.0.1:{PORT}"
    keeper_pid: int = 0  # the keeper as this (outer) pid namespace sees it: unshare's child
    started_seconds: float = 0.0
    workers: list[str] = field(default_factory=list)  # node names
    left: list[str] = field(default_factory=list)  # what stop() found still alive in the namespace
    _own_netns: int | None = None

    # ---- inside the namespaces ------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """A command in the cluster's network, pid and mount namespaces."""
        return subprocess.run(["nsenter", "-t", str(self.keeper_pid), "--net", "--pid", "--mount", "--", *argv],
                              capture_output=True, text=True, check=check, timeout=timeout)

    def pid_namespace(self) -> str:
        return os.readlink(f"/proc/{self.keeper_pid}/ns/pid")

    def processes(self) -> list[int]:
        """Outer pids of every process in the cluster's pid namespace."""
        return _members(self.pid_namespace())

    def raylet(self, node_id: str) -> int | None:
        """The outer pid of the raylet of ``node_id``."""
        for pid in self.processes():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"/raylet") and f"--node_id={node_id}".encode() in argv:
                return pid
        return None

    def kill_node(self, node_id: str) -> list[int]:
        """``kill -9`` of a node's raylet and of its workers (the raylet's children); returns the pids killed."""
        import signal

        raylet = self.raylet(node_id)
        assert raylet is not None, f"no raylet for node {node_id}"
        victims = [raylet, *_children(raylet)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return victims

    # ---- the driver (this process) ----------------------------------------------------------------

    def enter(self) -> None:
        self._own_netns = os.open("/proc/self/ns/net", os.O_RDONLY)
        theirs = os.open(f"/proc/{self.keeper_pid}/ns/net", os.O_RDONLY)
        try:
            _setns(theirs)
        finally:
            os.close(theirs)

    def connect(self, timeout: float = 120) -> None:
        """``ray.init`` from this process (inside the namespace), then wait until every node is alive."""
        import ray

        ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        deadline = time.monotonic() + timeout
        while True:
            alive = [node for node in ray.nodes() if node["Alive"]]
            if len(alive) == 1 + len(self.workers):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(alive)} of {1 + len(self.workers)} Ray nodes alive after {timeout:.0f}s")
            time.sleep(0.2)

    def leave(self) -> None:
        if self._own_netns is not None:
            _setns(self._own_netns)
            os.close(self._own_netns)
            self._own_netns = None

    def stop(self) -> list[str]:
        """``ray stop --force`` inside, then the keeper exits (the kernel kills what is left). Returns what
        was still alive in the namespace afterwards (nothing, or the test fails)."""
        namespace = self.pid_namespace() if self.keeper.poll() is None else None
        if namespace is not None:
            self.run(_ray_bin(), "stop", "--force", check=False, timeout=120)
        assert self.keeper.stdin is not None
        self.keeper.stdin.close()
        try:
            self.keeper.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.keeper.kill()
            self.keeper.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if namespace is None:
            return []
        # The keeper was the namespace's init: the kernel has sent SIGKILL to all the rest; wait for them to go.
        deadline = time.monotonic() + 15
        while (left := _members(namespace)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [f"{pid}: {_cmdline(pid)}" for pid in left]


def _members(namespace: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return sorted(found)


def _ports(base: int) -> list[str]:
    """Fixed ports for one worker node: nodes that start at once on one address would otherwise pick the same."""
    return ["--node-manager-port", str(base), "--object-manager-port", str(base + 1),
            "--runtime-env-agent-port", str(base + 2), "--dashboard-agent-grpc-port", str(base + 3),
            "--dashboard-agent-listen-port", str(base + 4), "--metrics-export-port", str(base + 5),
            "--min-worker-port", str(base + 100), "--max-worker-port", str(base + 999)]


def _wait_for_sockets(temp_dir: str, count: int, starting: subprocess.Popen[str], timeout: float = 120) -> None:
    sockets = Path(temp_dir) / "session_latest" / "sockets"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and starting.poll() is None:
        try:
            names = os.listdir(sockets)
        except OSError:
            names = []
        if all(sum(1 for n in names if n.split(".")[0] == prefix) >= count for prefix in ("raylet", "plasma_store")):
            return
        time.sleep(0.05)


def available() -> str | None:
    """Why a cluster cannot be started here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install -e '.[ray]')"
    if os.geteuid() != 0:
        return "the test cluster's namespaces need root (unshare --net --pid)"
    for program in ("unshare", "nsenter", "ip"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install util-linux iproute2)"
    return None


def start_cluster(workers: int = 2, cpus_per_worker: int = 2) -> RayTestCluster:
    temp_dir = tempfile.mkdtemp(prefix="ovr", dir="/tmp")  # short: Ray's socket paths live under it
    keeper = subprocess.Popen(["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child",
                               sys.executable, "-c", KEEPER],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert keeper.stdout is not None
    if keeper.stdout.readline().strip() != "ready":
        keeper.kill()
        raise RuntimeError(f"the namespace keeper did not start: {keeper.communicate()[1][-500:]}")
    cluster = RayTestCluster(keeper, temp_dir, keeper_pid=_children(keeper.pid)[0])
    common = ["--node-ip-address", "127.0.0.1", "--temp-dir", temp_dir, "--disable-usage-stats",
              "--object-store-memory", str(100 * 1024 * 1024), "--include-log-monitor", "false"]
    try:
        cluster.run(_ray_bin(), "start", "--head", "--port", str(PORT), "--num-cpus", "0",
                    "--dashboard-host", "127.0.0.1", *common)
        names = [f"worker{i + 1}" for i in range(workers)]
        starting = []
        for number, name in enumerate(names):
            starting.append(subprocess.Popen(
                ["nsenter", "-t", str(cluster.keeper_pid), "--net", "--pid", "--mount", "--", _ray_bin(), "start",
                 "--address", cluster.address, "--node-name", name, "--num-cpus", str(cpus_per_worker), *common,
                 *_ports(20000 + 1000 * number)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            # Each node names its raylet's and object store's sockets sockets/raylet.N with the first free N:
            # the next node may start once this one's sockets exist (not when it has registered, much later).
            _wait_for_sockets(temp_dir, 2 + number, starting[-1])
        for name, process in zip(names, starting):
            output, _ = process.communicate(timeout=180)
            # `ray start` gives a raylet 30 s to register and then gives up waiting, but leaves it running:
            # on a loaded machine it registers later (``connect`` waits for every node).
            if process.returncode != 0 and "timed out during startup" not in output:
                raise RuntimeError(f"ray start of {name} failed: {output[-800:]}")
        cluster.workers = names
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running_cluster(workers: int = 2) -> t.Iterator[RayTestCluster]:
    """A started cluster with this thread's driver connected inside its network namespace; stopped afterwards
    (``left``: what was still alive in the namespace then, which should be nothing)."""
    began = time.monotonic()
    cluster = start_cluster(workers=workers)
    cluster.enter()
    try:
        cluster.connect()
        cluster.started_seconds = time.monotonic() - began
        yield cluster
    finally:
        try:
            import ray

            ray.shutdown()
        finally:
            cluster.leave()
            cluster.left = cluster.stop()


@pytest.fixture(scope="module", name="ray_cluster")
def ray_cluster_fixture() -> t.Iterator[RayTestCluster]:
    """A started cluster, with this process's main thread inside its network namespace for the module."""
    reason = available()
    if reason:
        missing(reason)
    with running_cluster() as cluster:
        yield cluster
    assert cluster.left == [], f"processes left in the cluster's namespace after it stopped: {cluster.left}"
