"""What a turn executor adds to a turn: local (a process group here) against ray (a task on a cluster node).

    python bench/executors.py [--rounds 20]

Starts the tests' Ray cluster (``tests/ray_cluster.py``: a head and two worker nodes in a network
namespace of their own, loopback only; root, ``unshare``, ``nsenter`` and the ``ray`` extra needed),
then times, for each executor, a turn whose command prints one line and exits:

- submit -> first line: from ``submit`` to the line arriving through ``lines``;
- submit -> ended: from ``submit`` until ``status`` says ``finished``.

Each figure is the median of ``--rounds`` turns after 3 warm-up turns, with min and max; the ratio is
ray over local, measured in the same run. The runtime is not involved: this is the executor's cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from overstory.executors.base import TurnExecutor, TurnSpec  # noqa: E402
from overstory.executors.local import LocalExecutor  # noqa: E402
from overstory.executors.ray_executor import RayExecutor  # noqa: E402
from ray_cluster import available, running_cluster  # noqa: E402


def one_turn(executor: TurnExecutor, cwd: str) -> tuple[float, float]:
    turn_id = f"bench-{uuid.uuid4().hex[:10]}"
    began = time.perf_counter()
    executor.submit(TurnSpec(turn_id, ("sh", "-c", "echo hello"), cwd, env={"PATH": os.environ["PATH"]}))
    cursor = 0
    while True:
        batch = executor.lines(turn_id, cursor, timeout=5)
        cursor = batch.cursor
        if batch.lines:
            first = time.perf_counter() - began
            break
    while not executor.status(turn_id).ended:
        time.sleep(0.005)
    ended = time.perf_counter() - began
    executor.forget(turn_id)
    return first, ended


def measure(executor: TurnExecutor, rounds: int, cwd: str) -> tuple[list[float], list[float]]:
    for _ in range(3):
        one_turn(executor, cwd)
    firsts, ends = [], []
    for _ in range(rounds):
        first, ended = one_turn(executor, cwd)
        firsts.append(first)
        ends.append(ended)
    return firsts, ends


def row(label: str, values: list[float], baseline: list[float] | None = None) -> str:
    median = statistics.median(values)
    ratio = f" | {median / statistics.median(baseline):.1f}x" if baseline else " | 1.0x"
    return f"| {label} | {median * 1000:.0f} ms | {min(values) * 1000:.0f} | {max(values) * 1000:.0f}{ratio} |"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    reason = available()
    if reason:
        print(f"cannot start the cluster: {reason}", file=sys.stderr)
        return 1
    scratch = tempfile.mkdtemp(prefix="ov-bench-exec-")
    local = LocalExecutor(Path(scratch) / "turns")
    local_first, local_end = measure(local, args.rounds, scratch)
    with running_cluster() as cluster:
        ray = RayExecutor(cluster.address, {"CPU": 1})
        ray_first, ray_end = measure(ray, args.rounds, scratch)
    print(f"cluster (head + 2 workers, in a network namespace) up in {cluster.started_seconds:.1f} s; "
          f"left after stop: {cluster.left or 'none'}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores); {args.rounds} rounds")
    print("| figure | median | min | max | ratio to local |")
    print("| --- | --- | --- | --- | --- |")
    print(row("local: submit -> first line", local_first))
    print(row("ray: submit -> first line", ray_first, local_first))
    print(row("local: submit -> ended", local_end))
    print(row("ray: submit -> ended", ray_end, local_end))
    return 0


if __name__ == "__main__":
    sys.exit(main())
