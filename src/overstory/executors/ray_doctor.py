"""What ``ov doctor`` learns about the Ray cluster of ``executor: ray`` (``project.doctor_cluster`` judges it).

The survey runs in a child process (``python -m overstory.project.doctor_cluster``, its request as JSON on
stdin, its answer as one marked JSON line on stdout): ``ray.init`` to an address that does not answer
waits minutes and cannot be interrupted, and Ray's own processes write log lines to the terminal; in a
child both are the parent's to bound and to silence. Before Ray is asked anything, a plain TCP connect
with a short timeout says whether anything listens at the address.

What it gathers: every node Ray knows (alive or dead, its resources, whether a turn fits on it), and from
each alive node a task pinned to it (the caller's ``facts`` function, ``doctor_cluster.node_facts``: ov's
version there, the configured runtimes as that node finds them), and its clock (a second, quick task per node, once its worker is warm: the skew's error
is half that round trip).
"""

from __future__ import annotations

import time
import typing as t

FACTS_SECONDS = 60.0
CLOCK_SECONDS = 10.0


def fits(resources: t.Mapping[str, float], wanted: t.Mapping[str, float]) -> bool:
    """A node with ``resources`` (its totals) can run a turn that asks for ``wanted`` (Ray's names)."""
    return all(float(resources.get(name, 0)) >= amount for name, amount in wanted.items() if amount > 0)


def node_clock() -> float:
    return time.time()


def survey(request: dict[str, t.Any], facts: t.Callable[..., dict[str, t.Any]]) -> dict[str, t.Any]:
    """The cluster at ``request["address"]`` as seen from here; ``{"unreachable": why}`` when it does not answer."""
    from overstory.errors import ExecutorUnavailable
    from overstory.executors.ray_executor import import_ray, unreachable

    address = str(request["address"])
    why = unreachable(address)
    if why is not None:
        return {"unreachable": why}
    try:
        ray = import_ray()
    except ExecutorUnavailable as exc:
        return {"unavailable": exc.detail}
    try:
        ray.init(address=address, namespace=str(request.get("namespace") or "overstory"), logging_level="ERROR",
                 log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError: not usable from here
        return {"unreachable": _first_line(exc)}
    try:
        return {"control_node": ray.get_runtime_context().get_node_id(), "nodes": _nodes(ray, request, facts)}
    finally:
        ray.shutdown()


def _nodes(ray: t.Any, request: dict[str, t.Any], facts_of: t.Callable[..., dict[str, t.Any]]) -> list[dict[str, t.Any]]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    wanted = {str(k): float(v) for k, v in dict(request.get("turn_resources") or {}).items()}
    nodes = []
    for node in ray.nodes():
        resources = {str(k): float(v) for k, v in dict(node.get("Resources") or {}).items()}
        nodes.append({"id": node["NodeID"], "name": node.get("NodeName") or node.get("NodeManagerAddress") or "",
                      "alive": bool(node["Alive"]), "runs_turns": bool(node["Alive"]) and fits(resources, wanted)})
    facts = ray.remote(facts_of)
    clock = ray.remote(node_clock)

    def pinned(task: t.Any, node_id: str) -> t.Any:
        return task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id, soft=False))

    alive = [node for node in nodes if node["alive"]]
    asked = {node["id"]: pinned(facts, node["id"]).remote(request.get("config") or {},
                                                          list(request.get("runtimes") or []) if node["runs_turns"]
                                                          else []) for node in alive}
    deadline = time.monotonic() + FACTS_SECONDS
    for node in alive:
        try:
            node["facts"] = ray.get(asked[node["id"]], timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - the task's import failed on the node, or it did not answer
            node["error"] = _first_line(exc)
            continue
        began = time.time()
        try:
            theirs = ray.get(pinned(clock, node["id"]).remote(), timeout=CLOCK_SECONDS)
        except Exception as exc:  # noqa: BLE001
            node["error"] = f"no clock reading: {_first_line(exc)}"
            continue
        ended = time.time()
        node["skew_ms"] = round((theirs - (began + ended) / 2) * 1000)
        node["clock_error_ms"] = round((ended - began) * 500)
    return nodes


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip() and not line.startswith("ray::"):
            return line.strip()[:300]
    return type(exc).__name__
