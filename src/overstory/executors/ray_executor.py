"""The ray executor: each turn is a Ray task on a node of an existing cluster, with Ray's own retries off.

ov connects to a cluster someone started (``ray start --head`` on the control node, then
``ray start --address HOST:PORT`` on each worker node; or KubeRay); it never starts one. The control
node must be a node of the cluster (``address: HOST:PORT`` joins it through the local raylet): the turn
hub (``ray_hub.TurnHub``) is pinned there, next to the project's state.

- ``submit``: the hub starts the task unless the turn id is known (idempotent from any process).
  The task asks for ``turn_resources`` (Ray's names: ``CPU``, ``GPU``, ``memory``, or a custom
  resource such as ``ov_turn: 1``) and is spread over the nodes (``SPREAD``).
- ``status``: how the task ended comes from its object ref, held by the hub (Ray says within a
  second that a task's worker or node died: ``lost``); while it has not ended, Ray's state API says
  whether it is queued or running, and a task that the state API reports failed because its worker
  or node died is ``lost`` at once.
- ``lines``: from the hub, from a cursor (a line index).
- ``stop``: the hub cancels a queued task; a running one stops its group at its next push (SIGTERM,
  SIGKILL after the grace); if that does not end it in time, a task pinned to the turn's node kills
  the group and the turn's task is cancelled with ``force`` (its worker killed).

``import ray`` happens only here and in ``ray_hub``, inside functions: without the ``ray`` extra
installed, building this executor is a one-line error.
"""

from __future__ import annotations

import socket
import threading
import time
import typing as t

from overstory.errors import ClusterUnreachable, ExecutorUnavailable, TurnNotFound
from overstory.executors.base import Lines, Submitted, TurnExecutor, TurnSpec, TurnState, TurnStatus
from overstory.executors.ray_hub import HUB_NAME, LOST_ERROR_TYPES, TurnHub

INSTALL_HINT = "install the ray extra: pip install 'overstory[ray]'"
STOP_SLACK = 3.0  # seconds past the grace before a stop kills on the node
CONNECT_SECONDS = 3.0  # a plain connect to the address first: Ray's own waits minutes where nothing answers
STATE_API_SECONDS = 1.0  # how often the state API is asked about a running turn
HUB_THREADS = 256  # the hub's calls at once: a reader waiting for lines holds one, each turn's pushes another
PENDING_STATES = frozenset({"NIL", "PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "PENDING_OBJ_STORE_MEM_AVAIL",
                            "PENDING_ARGS_FETCH", "SUBMITTED_TO_WORKER"})
JOB_END_SWEEP = "Job finishes ("  # how the dashboard words a task it marks failed because its job's driver exited
_connect_lock = threading.Lock()


def import_ray() -> t.Any:
    """The ``ray`` module, or the one-line error that says how to get it."""
    try:
        import ray
    except ImportError as exc:
        raise ExecutorUnavailable("ray", f"the ray package is not installed ({exc.msg})", INSTALL_HINT) from None
    return ray


def unreachable(address: str, timeout: float = CONNECT_SECONDS) -> str | None:
    """Why nothing answers at ``address`` (HOST:PORT), or None when something accepts a connection there."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"{address!r} is not HOST:PORT"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()


def task_options(turn_resources: t.Mapping[str, float]) -> dict[str, t.Any]:
    """Ray task options for ``turn_resources`` (CPU, GPU, memory by Ray's names; anything else is custom)."""
    options: dict[str, t.Any] = {"scheduling_strategy": "SPREAD", "num_cpus": 0}
    custom: dict[str, float] = {}
    for name, amount in turn_resources.items():
        if name == "CPU":
            options["num_cpus"] = amount
        elif name == "GPU":
            options["num_gpus"] = amount
        elif name == "memory":
            options["memory"] = amount
        else:
            custom[name] = amount
    if custom:
        options["resources"] = custom
    return options


class RayExecutor(TurnExecutor):
    kind = "ray"

    def __init__(self, address: str | None = None, turn_resources: t.Mapping[str, float] | None = None,
                 namespace: str = "overstory") -> None:
        self.ray = import_ray()
        if not address:
            raise ExecutorUnavailable("ray", "no cluster address",
                                      "set executor.ray.address to HOST:PORT of a running cluster (ray start --head)")
        self.address = address
        self.namespace = namespace
        self.options = task_options(turn_resources if turn_resources is not None else {"CPU": 1})
        self._hub: t.Any = None
        self._asked: dict[str, tuple[float, t.Any]] = {}  # turn id -> (when, the state API's answer)

    # ---- connection -----------------------------------------------------------------------------------

    def hub(self) -> t.Any:
        if self._hub is not None:
            return self._hub
        ray = self.ray
        with _connect_lock:
            if not ray.is_initialized():
                why = unreachable(self.address)
                if why is not None:
                    raise ClusterUnreachable(self.address, why)
                try:
                    ray.init(address=self.address, namespace=self.namespace, logging_level="ERROR",
                             log_to_driver=False)
                except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError: "not there"
                    raise ClusterUnreachable(self.address, _first_line(exc)) from None
            try:
                self._hub = ray.get_actor(HUB_NAME, namespace=self.namespace)
            except ValueError:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                here = ray.get_runtime_context().get_node_id()
                self._hub = ray.remote(TurnHub).options(
                    name=HUB_NAME, namespace=self.namespace, lifetime="detached", get_if_exists=True,
                    max_concurrency=HUB_THREADS, num_cpus=0, max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
        return self._hub

    def _call(self, method: str, *args: t.Any, timeout: float = 60) -> t.Any:
        from ray.exceptions import RayError

        try:
            return self.ray.get(getattr(self.hub(), method).remote(*args), timeout=timeout)
        except RayError as exc:  # the hub died (the control node's raylet restarted) or did not answer
            self._hub = None
            detail = f"the turn hub did not answer {method}: {_first_line(exc)}"
            raise ClusterUnreachable(self.address, detail) from None

    # ---- the verbs ------------------------------------------------------------------------------------

    def submit(self, spec: TurnSpec) -> Submitted:
        return Submitted(spec.turn_id, created=bool(self._call("submit", spec.to_wire(), self.options)))

    def status(self, turn_id: str) -> TurnStatus:
        view = self._call("view", turn_id)
        if view is None:
            raise TurnNotFound(turn_id, self.kind)
        started = view.get("started") or {}
        where = {"node": started.get("node"), "pid": started.get("pid"), "started_ms": started.get("started_ms")}
        outcome = view.get("outcome")
        if outcome is not None:
            return TurnStatus(turn_id, t.cast(TurnState, outcome["state"]), str(outcome.get("reason") or ""),
                              exit_code=outcome.get("exit_code"), ended_ms=outcome.get("ended_ms"), **where)
        task = self._task_state(turn_id, view.get("task_id"), fresh=where["pid"] is None)
        if task is not None and reports_lost(task):
            return TurnStatus(turn_id, "lost", f"{task.error_type}: {_first_line(task.error_message or '')}",
                              node=where["node"] or task.node_id, pid=where["pid"], started_ms=where["started_ms"])
        if where["pid"] is not None or (task is not None and task.state not in PENDING_STATES):
            return TurnStatus(turn_id, "running", node=where["node"] or (task.node_id if task else None),
                              pid=where["pid"], started_ms=where["started_ms"])
        return TurnStatus(turn_id, "queued", "waiting for a node with " + _describe(self.options))

    def _task_state(self, turn_id: str, task_id: str | None, *, fresh: bool) -> t.Any:
        """The task's latest attempt in Ray's state API (None until its first event has arrived). A running
        turn's is asked at most once a second (the hub's object ref says first when its node dies)."""
        if not task_id:
            return None
        now = time.monotonic()
        asked = self._asked.get(turn_id)
        if asked is not None and not fresh and now - asked[0] < STATE_API_SECONDS:
            return asked[1]
        found = self._attempts(task_id)
        latest = max(found, key=lambda item: item.attempt_number) if found else None
        self._asked[turn_id] = (now, latest)
        return latest

    def _attempts(self, task_id: str | None) -> list[t.Any]:
        if not task_id:
            return []
        from ray.util.state import get_task

        try:
            found = get_task(task_id, timeout=10)
        except Exception:  # noqa: BLE001 - the dashboard is optional for the verbs; the hub still answers
            return []
        return list(found) if isinstance(found, list) else [found] if found is not None else []

    def attempts(self, turn_id: str) -> list[dict[str, t.Any]]:
        """Every attempt Ray's state API knows of the turn's task (one, as Ray's retries are off)."""
        view = self._call("view", turn_id)
        if view is None:
            raise TurnNotFound(turn_id, self.kind)
        return [{"attempt": task.attempt_number, "state": task.state, "node": task.node_id,
                 "error_type": task.error_type} for task in self._attempts(view.get("task_id"))]

    def lines(self, turn_id: str, cursor: int = 0, *, timeout: float = 0.0) -> Lines:
        found = self._call("read", turn_id, cursor, timeout, timeout=timeout + 60)
        if found is None:
            raise TurnNotFound(turn_id, self.kind)
        return Lines(tuple(found["lines"]), int(found["cursor"]), bool(found["done"]))

    def stop(self, turn_id: str, *, grace: float = 5.0) -> TurnStatus:
        if self._call("request_stop", turn_id, grace) is None:
            raise TurnNotFound(turn_id, self.kind)
        status = self.wait(turn_id, timeout=grace + STOP_SLACK)
        if status.ended:
            return status
        self._call("force_stop", turn_id)
        return self.wait(turn_id, timeout=30)

    def stderr_tail(self, turn_id: str, size: int = 4096) -> str:
        view = self._call("view", turn_id)
        outcome = (view or {}).get("outcome") or {}
        return str(outcome.get("stderr_tail") or "")[-size:]

    def forget(self, turn_id: str) -> None:
        try:
            if not self.status(turn_id).ended:
                self.stop(turn_id)
        except TurnNotFound:
            return
        self._call("forget", turn_id)
        self._asked.pop(turn_id, None)

    def close(self) -> None:
        self._hub = None


def reports_lost(task: t.Any) -> bool:
    """Whether the state API's record of a task (its latest attempt) says that its worker or node died.

    Not when the record is the dashboard's sweep at a job's end: when a driver exits, every unfinished task of
    its job is recorded failed with WORKER_DIED ("Job finishes (...) as driver exits"), though the tasks run
    on; the hub's tasks belong to the job of the driver that made the hub (an agent's loop, which exits when
    its agent is done). A real death also reaches the hub's object ref, within a second."""
    if task.state != "FAILED" or task.error_type not in LOST_ERROR_TYPES:
        return False
    return not str(task.error_message or "").startswith(JOB_END_SWEEP)


def _describe(options: t.Mapping[str, t.Any]) -> str:
    parts = [f"CPU={options['num_cpus']}"] if options.get("num_cpus") else []
    parts += [f"{key}={options[key]}" for key in ("num_gpus", "memory") if key in options]
    parts += [f"{name}={amount}" for name, amount in dict(options.get("resources") or {}).items()]
    return ", ".join(parts) or "no resources"


def _first_line(exc: object) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__

